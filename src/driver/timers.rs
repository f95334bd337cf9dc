//! The loop's deadline queue: mio has no timers, so the loop keeps its own and passes the
//! nearest deadline to `poll`. Timers are never cancelled; a stale one is recognised by its
//! owner (a connection generation, a peer's dial attempt) and ignored when it fires.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

/// What a timer is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum TimerKind {
    /// Close the connection at this slab index if it is still handshaking with this generation.
    Handshake { token: usize, generation: u64 },
    /// Give up the dial at this slab index if its TCP connect is still in progress with this
    /// generation (`EventLoop::connect_timeout_ms`): the peer's next address is tried.
    Connect { token: usize, generation: u64 },
    /// Try dialling this peer again, if this attempt is still the current one.
    Redial { rank: u32, attempt: u32 },
    /// Stop lingering to flush frames and exit.
    Linger,
    /// Accept on this listener again after `accept` failed (at most one armed per listener).
    AcceptRetry { index: usize },
    /// Look for stalled connections (`event_loop/failover.rs`): one armed at a time.
    LinkWatch,
    /// Write the link-session acknowledgements still due (`LINK_ACK_DELAY_MS`): one armed at
    /// a time.
    LinkAck,
    /// The node's next deadline (`Node::poll_timeout`: wire-up, heartbeats, RELM): a new one
    /// is armed only when none at or before it is.
    Node,
}

#[derive(Default)]
pub(crate) struct Timers {
    heap: BinaryHeap<Reverse<(Instant, u64, TimerKind)>>,
    seq: u64,
}

impl Timers {
    /// Arms a timer. The heap's size is bounded by the callers: at most one handshake timer and
    /// one connect timer per connection, one redial timer per peer, one linger timer, one link watch, one acknowledgement delay, node timers only
    /// earlier than every armed one (stale ones are popped as their deadlines pass).
    pub(crate) fn arm(&mut self, at: Instant, kind: TimerKind) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, kind)));
    }

    /// Gives back the heap's spare room when it is mostly empty (after a flood of handshake
    /// timers has fired).
    pub(crate) fn shrink(&mut self) {
        if self.heap.capacity() > 1024 && self.heap.len() < self.heap.capacity() / 4 {
            self.heap.shrink_to_fit();
        }
    }

    /// Time until the nearest deadline (zero if one has passed), or `None` without timers.
    pub(crate) fn poll_timeout(&self, now: Instant) -> Option<Duration> {
        self.heap
            .peek()
            .map(|Reverse((at, _, _))| at.saturating_duration_since(now))
    }

    /// The next expired timer, if any.
    pub(crate) fn pop_expired(&mut self, now: Instant) -> Option<TimerKind> {
        match self.heap.peek() {
            Some(Reverse((at, _, _))) if *at <= now => self.heap.pop().map(|Reverse((_, _, k))| k),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_in_deadline_order() {
        let mut t = Timers::default();
        let now = Instant::now();
        t.arm(now + Duration::from_millis(20), TimerKind::Linger);
        t.arm(now + Duration::from_millis(10), TimerKind::Node);
        assert_eq!(t.poll_timeout(now), Some(Duration::from_millis(10)));
        assert_eq!(t.pop_expired(now), None);
        let later = now + Duration::from_millis(25);
        assert_eq!(t.pop_expired(later), Some(TimerKind::Node));
        assert_eq!(t.pop_expired(later), Some(TimerKind::Linger));
        assert_eq!(t.pop_expired(later), None);
        assert_eq!(t.poll_timeout(later), None);
    }
}
