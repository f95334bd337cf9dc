//! Heartbeats between tree neighbours, sans-IO: the driver tells the monitor who its neighbours
//! are and when it heard from each; on every tick the monitor says whom to send a heartbeat and
//! who has been silent past the timeout.
//!
//! Every daemon sends each neighbour a heartbeat once per interval, whatever other traffic there
//! is (one 40-byte frame a second per link costs nothing, and saves tracking the send side). Any
//! bytes received count as hearing from the peer.
//!
//! Self-stall guard: if the monitor itself was not ticked for longer than half the timeout (the
//! daemon was stopped, or starved of CPU), silence it measured is its own fault, not its
//! neighbours'. It then restarts every neighbour's clock instead of accusing anyone. This is
//! what keeps a daemon resumed after SIGSTOP from declaring its healthy neighbours dead.

use crate::Rank;
use crate::fxhash::FxHashMap;
use std::time::{Duration, Instant};

/// What the driver must do after a tick.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Tick {
    /// Send a heartbeat to each of these neighbours.
    pub send_to: Vec<Rank>,
    /// These neighbours were silent for longer than the timeout: treat them as failed.
    pub silent: Vec<Rank>,
    /// The monitor detected that it was stalled itself and restarted every clock.
    pub stalled: bool,
}

/// Heartbeat bookkeeping for one daemon's tree neighbours.
#[derive(Debug)]
pub struct HeartbeatMonitor {
    interval: Duration,
    timeout: Duration,
    heard: FxHashMap<Rank, Instant>,
    last_tick: Option<Instant>,
}

impl HeartbeatMonitor {
    /// `interval` between heartbeats; `timeout` of silence before a neighbour is reported. The
    /// caller must ensure `timeout > interval` (the configuration validates it).
    pub fn new(interval: Duration, timeout: Duration) -> Self {
        HeartbeatMonitor {
            interval,
            timeout,
            heard: FxHashMap::default(),
            last_tick: None,
        }
    }

    /// How often the driver should call [`HeartbeatMonitor::tick`].
    pub fn tick_every(&self) -> Duration {
        self.interval
    }

    /// How long a neighbour may stay silent.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Replaces the set of watched neighbours. A newly watched neighbour's clock starts now.
    pub fn set_neighbours(&mut self, neighbours: &[Rank], now: Instant) {
        // The clocks start now, and so does the check of this daemon's own stalls: one before
        // the first tick (a callback that blocked right after wire-up) must not be taken for
        // the neighbours' silence.
        self.last_tick.get_or_insert(now);
        self.heard.retain(|r, _| neighbours.contains(r));
        for r in neighbours {
            self.heard.entry(*r).or_insert(now);
        }
    }

    /// Whether `peer` is watched: a neighbour whose silence the timeout will report.
    pub fn watches(&self, peer: Rank) -> bool {
        self.heard.contains_key(&peer)
    }

    /// Bytes arrived from `peer`.
    pub fn heard(&mut self, peer: Rank, now: Instant) {
        if let Some(t) = self.heard.get_mut(&peer) {
            *t = now;
        }
    }

    /// Stops watching `peer` (it failed, or is no longer a neighbour).
    pub fn forget(&mut self, peer: Rank) {
        self.heard.remove(&peer);
    }

    /// One tick: whom to send a heartbeat, and who has been silent too long. Neighbours are
    /// returned in ascending rank order.
    pub fn tick(&mut self, now: Instant) -> Tick {
        let stalled = self
            .last_tick
            .is_some_and(|t| now.saturating_duration_since(t) > self.timeout / 2);
        self.last_tick = Some(now);
        let mut tick = Tick {
            stalled,
            ..Tick::default()
        };
        for (r, heard) in self.heard.iter_mut() {
            if stalled {
                *heard = now;
            } else if now.saturating_duration_since(*heard) > self.timeout {
                tick.silent.push(*r);
            }
            tick.send_to.push(*r);
        }
        tick.send_to.sort_unstable();
        tick.silent.sort_unstable();
        tick
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn silent_neighbour_is_reported_after_the_timeout() {
        let t0 = Instant::now();
        let mut m = HeartbeatMonitor::new(ms(100), ms(1000));
        m.set_neighbours(&[3, 1], t0);
        let mut now = t0;
        for _ in 0..10 {
            now += ms(100);
            m.heard(1, now);
            let t = m.tick(now);
            assert_eq!(t.send_to, vec![1, 3]);
            assert!(t.silent.is_empty());
        }
        now += ms(100);
        m.heard(1, now);
        let t = m.tick(now);
        assert_eq!(t.silent, vec![3]);
        assert!(!t.stalled);
    }

    #[test]
    fn a_stalled_monitor_accuses_nobody() {
        let t0 = Instant::now();
        let mut m = HeartbeatMonitor::new(ms(100), ms(1000));
        m.set_neighbours(&[1, 2], t0);
        m.tick(t0);
        // The daemon was stopped for a minute: everyone looks silent, but it was us.
        let later = t0 + Duration::from_secs(60);
        let t = m.tick(later);
        assert!(t.stalled);
        assert!(t.silent.is_empty());
        // Clocks restarted: still nobody silent shortly after.
        let t = m.tick(later + ms(100));
        assert!(t.silent.is_empty() && !t.stalled);
        // Stalled before its first tick (a callback that blocked right after wire-up): the
        // same (it accused its parent, and its daemon stopped blaming rank 0).
        let mut m = HeartbeatMonitor::new(ms(100), ms(1000));
        m.set_neighbours(&[0], t0);
        let t = m.tick(t0 + Duration::from_millis(2_500));
        assert!(t.stalled);
        assert!(t.silent.is_empty());
    }

    #[test]
    fn neighbours_come_and_go() {
        let t0 = Instant::now();
        let mut m = HeartbeatMonitor::new(ms(100), ms(1000));
        m.set_neighbours(&[1, 2], t0);
        m.forget(2);
        m.set_neighbours(&[1, 5], t0 + ms(50));
        assert_eq!(m.tick(t0 + ms(100)).send_to, vec![1, 5]);
        // Hearing from a stranger changes nothing.
        m.heard(9, t0 + ms(100));
        assert_eq!(m.tick(t0 + ms(200)).send_to, vec![1, 5]);
    }
}
