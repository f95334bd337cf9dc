//! The bounded queue that carries commands from handles to the loop: callers append under one
//! lock, and the loop takes everything queued at once, by swapping the queue for its empty one.
//!
//! Why not a channel with a slot per command: at one call per small message the caller and the
//! loop then work on neighbouring slots, and each command's cache line passes from one
//! processor to the other (a third of the caller's time and a fifth of the loop's on 64 B
//! sends, measured with a crossbeam array channel). Here the caller's appends stay in its own
//! cache until the loop takes the whole run of them, and the lock's line moves once per take.
//!
//! Bounds: at most `cap` commands wait to be taken, and the loop holds at most `cap` it took and
//! has not handled yet (it takes again only when it has handled them), so at most `2 * cap`
//! commands exist between callers and the loop. A caller that finds the queue full either gets
//! `Full` ([`CommandQueue::try_push`], for callbacks on the loop thread) or waits until the
//! loop takes ([`CommandQueue::push_waiting`]). A callback's command that cannot report a
//! refusal may use `COMMAND_CONTROL_RESERVE` more ([`CommandQueue::try_push_control`]). Once the loop closes the queue every push is
//! refused with its command given back.

use super::caddy::Caddy;
use super::handle::lock;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Why a command was not queued; the command is given back.
pub(crate) enum PushError {
    /// `cap` commands wait already.
    Full(Caddy),
    /// The loop has stopped taking commands.
    Closed(Caddy),
}

struct Queued {
    caddies: VecDeque<Caddy>,
    closed: bool,
    /// Callers blocked in `push_waiting`: the loop signals `room` only when one waits.
    waiters: usize,
}

/// The callers' end, shared by every handle (in `Shared`).
pub(crate) struct CommandQueue {
    queued: Mutex<Queued>,
    room: Condvar,
    cap: usize,
}

impl CommandQueue {
    /// A queue of at most `cap` waiting commands (at least one), and the loop's end of it.
    pub(crate) fn new(cap: usize) -> (Arc<Self>, CommandTaker) {
        let queue = Arc::new(Self {
            queued: Mutex::new(Queued {
                caddies: VecDeque::new(),
                closed: false,
                waiters: 0,
            }),
            room: Condvar::new(),
            cap: cap.max(1),
        });
        let taker = CommandTaker {
            queue: queue.clone(),
            taken: VecDeque::new(),
        };
        (queue, taker)
    }

    /// Queues `caddy` if there is room and the loop still takes commands.
    pub(crate) fn try_push(&self, caddy: Caddy) -> Result<(), PushError> {
        let mut q = lock(&self.queued);
        if q.closed {
            return Err(PushError::Closed(caddy));
        }
        if q.caddies.len() >= self.cap {
            return Err(PushError::Full(caddy));
        }
        q.caddies.push_back(caddy);
        Ok(())
    }

    /// [`try_push`](Self::try_push) with room for `reserve` commands beyond the bound: for a
    /// command from the loop thread whose caller cannot be told of a refusal.
    pub(crate) fn try_push_control(&self, caddy: Caddy, reserve: usize) -> Result<(), PushError> {
        let mut q = lock(&self.queued);
        if q.closed {
            return Err(PushError::Closed(caddy));
        }
        if q.caddies.len() >= self.cap.saturating_add(reserve) {
            return Err(PushError::Full(caddy));
        }
        q.caddies.push_back(caddy);
        Ok(())
    }

    /// Queues `caddy`, waiting while the queue is full until the loop takes what waits or
    /// closes the queue (then `Closed`). `stopped` is asked at every wake-up as well: a daemon
    /// that stops refuses what its callers still offer. Must not be called on the loop thread:
    /// it would wait for itself.
    pub(crate) fn push_waiting(
        &self,
        caddy: Caddy,
        stopped: impl Fn() -> bool,
    ) -> Result<(), PushError> {
        let mut q = lock(&self.queued);
        // Bounded by the daemon's life: the loop takes at least every turn, and closes the
        // queue when it stops; the timeout only guards against a missed signal.
        while q.caddies.len() >= self.cap && !q.closed && !stopped() {
            q.waiters += 1;
            let wait = Duration::from_millis(crate::limits::COMMAND_ROOM_WAIT_MS);
            q = match self.room.wait_timeout(q, wait) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
            q.waiters -= 1;
        }
        if q.closed || stopped() {
            return Err(PushError::Closed(caddy));
        }
        q.caddies.push_back(caddy);
        Ok(())
    }
}

/// The loop's end: what it took and has not handled yet, in the order it was queued.
pub(crate) struct CommandTaker {
    queue: Arc<CommandQueue>,
    taken: VecDeque<Caddy>,
}

impl CommandTaker {
    /// Takes everything queued since the last take, in one swap, if what was taken before is
    /// used up, and wakes the callers waiting for room. The loop calls this once per drain,
    /// not each time it runs out: a loop faster than its callers would otherwise take a few
    /// commands at a time, and the lock's line would pass between the processors at nearly
    /// every command (measured: a third of a 64 B sender's time, in the lock).
    pub(crate) fn take_queued(&mut self) {
        if !self.taken.is_empty() {
            return;
        }
        let waiters = {
            let mut q = lock(&self.queue.queued);
            if q.caddies.is_empty() {
                return;
            }
            // `taken` is empty and keeps its capacity, so the callers' next appends reuse it.
            std::mem::swap(&mut q.caddies, &mut self.taken);
            q.waiters
        };
        if waiters > 0 {
            self.queue.room.notify_all();
        }
    }

    /// The next command taken, or `None` when every taken command was handed out.
    pub(crate) fn next_taken(&mut self) -> Option<Caddy> {
        self.taken.pop_front()
    }

    /// Whether nothing is left to take, here or in the queue.
    pub(crate) fn is_empty(&self) -> bool {
        self.taken.is_empty() && lock(&self.queue.queued).caddies.is_empty()
    }

    /// Stops the queue (every later push is `Closed`, waiting callers are woken) and gives
    /// back every command not handled, in order.
    pub(crate) fn close(&mut self) -> Vec<Caddy> {
        let mut rest: Vec<Caddy> = self.taken.drain(..).collect();
        {
            let mut q = lock(&self.queue.queued);
            q.closed = true;
            rest.extend(q.caddies.drain(..));
        }
        self.queue.room.notify_all();
        rest
    }
}

impl Drop for CommandTaker {
    /// A loop that ends without closing (a panic) must not leave callers waiting for room.
    fn drop(&mut self) {
        lock(&self.queue.queued).closed = true;
        self.queue.room.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn send(tag: u32) -> Caddy {
        Caddy::Send {
            dst: 0,
            tag,
            payload: Bytes::new(),
            done: None,
            route: None,
        }
    }

    fn tag_of(c: &Caddy) -> u32 {
        match c {
            Caddy::Send { tag, .. } => *tag,
            _ => u32::MAX,
        }
    }

    #[test]
    fn commands_are_taken_in_order_across_swaps_and_a_full_queue_refuses() {
        let (queue, mut taker) = CommandQueue::new(3);
        for t in 0..3 {
            assert!(queue.try_push(send(t)).is_ok());
        }
        assert!(matches!(queue.try_push(send(9)), Err(PushError::Full(_))));
        // A control command has its reserve beyond the bound, and no more.
        assert!(queue.try_push_control(send(7), 1).is_ok());
        assert!(matches!(
            queue.try_push_control(send(8), 1),
            Err(PushError::Full(_))
        ));
        taker.take_queued();
        assert_eq!(taker.next_taken().map(|c| tag_of(&c)), Some(0));
        // Taken commands no longer count against the bound; what was taken is handed out
        // before anything queued since is taken.
        assert!(queue.try_push(send(3)).is_ok());
        taker.take_queued();
        let mut tags = Vec::new();
        while let Some(c) = taker.next_taken() {
            tags.push(tag_of(&c));
        }
        assert_eq!(tags, vec![1, 2, 7]);
        assert!(!taker.is_empty());
        taker.take_queued();
        assert_eq!(taker.next_taken().map(|c| tag_of(&c)), Some(3));
        assert!(taker.is_empty());
    }

    #[test]
    fn a_waiting_caller_resumes_when_the_loop_takes_and_is_refused_once_closed() {
        let (queue, mut taker) = CommandQueue::new(2);
        assert!(queue.try_push(send(0)).is_ok());
        assert!(queue.try_push(send(1)).is_ok());
        let q = queue.clone();
        let caller = std::thread::spawn(move || q.push_waiting(send(2), || false).is_ok());
        std::thread::sleep(Duration::from_millis(50));
        taker.take_queued();
        assert_eq!(taker.next_taken().map(|c| tag_of(&c)), Some(0));
        assert!(caller.join().unwrap_or(false));
        let rest: Vec<u32> = taker.close().iter().map(tag_of).collect();
        assert_eq!(rest, vec![1, 2]);
        assert!(matches!(
            queue.push_waiting(send(3), || false),
            Err(PushError::Closed(_))
        ));
        assert!(matches!(queue.try_push(send(4)), Err(PushError::Closed(_))));
    }
}
