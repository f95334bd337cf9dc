//! Whether a connection has stalled: it stays open, but the peer has confirmed nothing and
//! sent nothing for `link_stall_ms` while frames written to it wait for confirmation.
//!
//! A network that fails under a connection (a NIC taken down, a switch gone, a cable pulled)
//! breaks nothing TCP can see for minutes: writes fill the socket buffer and the kernel
//! retransmits into the void. Heartbeats would then declare a living daemon dead. A link
//! session (`oob::session`) makes the receiver confirm every batch it reads, so a sender that
//! holds frames written long enough ago and has heard nothing since knows the path is gone
//! well before the heartbeat timeout: the driver closes the connection and dials the peer's
//! next address (failover), and the session writes again what was not confirmed.
//!
//! The rule needs both facts. Frames waiting alone mean nothing on a link that was quiet
//! until now (the wait starts when they are first seen waiting); silence alone means nothing
//! on a link that has nothing to say. A peer that stops reading (SIGSTOPped, overloaded past
//! flow control's patience) looks the same as a dead path: the failover then dials a daemon
//! that does not answer, and the heartbeat timeout decides, as before.
//!
//! Silence counts only while this daemon reads the connection. Flow control leaves a
//! neighbour's connection unread while another queue is congested; the peer's confirmations
//! then wait unread in the socket, and the silence is this daemon's own doing. Before this
//! rule, 256 daemons at four times what the machine carries failed over 275 healthy links
//! in one run. That wrote 400,000 frames again and made the overload worse, and the redials
//! lost the heartbeats of a living daemon, which was declared dead. The node's heartbeat
//! check has the same exception (`node::faults`).
//!
//! Sans-IO: the driver calls [`StallWatch::handle_heard`] when bytes arrive and
//! [`StallWatch::poll_stalled`] at its watch ticks, passing the time in.

use std::time::{Duration, Instant};

/// One connection's stall watch.
#[derive(Debug, Clone)]
pub struct StallWatch {
    heard: Instant,
    waiting_since: Option<Instant>,
}

impl StallWatch {
    /// A watch for a connection established at `now` (its handshake was just heard).
    pub fn new(now: Instant) -> Self {
        StallWatch {
            heard: now,
            waiting_since: None,
        }
    }

    /// Bytes arrived from the peer at `now`.
    pub fn handle_heard(&mut self, now: Instant) {
        self.heard = now;
    }

    /// This daemon leaves the connection unread at `now` (flow control): what the peer sent
    /// waits in the socket, so the silence proves nothing. Counts as heard.
    pub fn handle_unread(&mut self, now: Instant) {
        self.heard = now;
    }

    /// This daemon's own loop did not run for a while up to `now` (`tick_is_late`): the peer's
    /// bytes may be waiting unread in the socket, so the silence proves nothing. Counts as
    /// heard.
    pub fn handle_own_stall(&mut self, now: Instant) {
        self.heard = now;
    }

    /// Whether the connection has stalled at `now`: `waiting` says whether frames written to
    /// it wait for the peer's confirmation. True once frames have waited, and nothing was
    /// heard, for at least `stall`. Called at ticks of at most `stall / 4`, the answer is late
    /// by at most a tick.
    pub fn poll_stalled(&mut self, now: Instant, waiting: bool, stall: Duration) -> bool {
        if !waiting {
            self.waiting_since = None;
            return false;
        }
        let since = *self.waiting_since.get_or_insert(now);
        now.saturating_duration_since(since.max(self.heard)) >= stall
    }

    /// Whether nothing was heard for at least `quiet` (a link the peer dials again while it
    /// stands has been replaced on the peer's side if it is this quiet: `oob::arbiter`).
    pub fn is_quiet(&self, now: Instant, quiet: Duration) -> bool {
        now.saturating_duration_since(self.heard) >= quiet
    }
}

/// Whether a watch tick at `now`, after the previous one at `last`, came more than half the
/// stall time late (ticks are armed a quarter of it apart): this daemon's own loop did not run
/// meanwhile (256 daemons at four times capacity on two processors left loops unscheduled for
/// seconds). Every connection then looked stalled at once, and each was closed and redialled
/// while its peer was well: the silence was this daemon's own.
pub fn tick_is_late(last: Option<Instant>, now: Instant, stall: Duration) -> bool {
    last.is_some_and(|t| now.saturating_duration_since(t) > stall / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STALL: Duration = Duration::from_millis(3000);

    fn ms(t0: Instant, n: u64) -> Instant {
        t0 + Duration::from_millis(n)
    }

    #[test]
    fn after_its_own_loop_stalled_a_daemon_takes_no_connection_for_stalled() {
        let t0 = Instant::now();
        // Ticks a quarter of the stall time apart are on time; one over half of it late is
        // this daemon's own stall.
        assert!(!tick_is_late(None, t0, STALL));
        assert!(!tick_is_late(Some(t0), ms(t0, 750), STALL));
        assert!(!tick_is_late(Some(t0), ms(t0, 1500), STALL));
        assert!(tick_is_late(Some(t0), ms(t0, 1501), STALL));
        // Frames waiting since 0, nothing heard; the loop ran again only at 4,000 ms.
        let mut w = StallWatch::new(t0);
        assert!(!w.poll_stalled(ms(t0, 500), true, STALL));
        w.handle_own_stall(ms(t0, 4000));
        assert!(!w.poll_stalled(ms(t0, 4000), true, STALL));
        // A real stall is still found, a stall time after the loop ran again.
        assert!(!w.poll_stalled(ms(t0, 6750), true, STALL));
        assert!(w.poll_stalled(ms(t0, 7000), true, STALL));
    }

    #[test]
    fn frames_waiting_in_silence_for_the_stall_time_are_a_stall() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(t0);
        assert!(!w.poll_stalled(ms(t0, 750), true, STALL));
        assert!(!w.poll_stalled(ms(t0, 3000), true, STALL));
        assert!(w.poll_stalled(ms(t0, 3750), true, STALL));
    }

    #[test]
    fn a_quiet_link_that_starts_writing_is_not_stalled_at_once() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(t0);
        // An hour of silence with nothing to confirm: no stall.
        assert!(!w.poll_stalled(ms(t0, 3_600_000), false, STALL));
        // Frames first seen waiting now: the wait starts now.
        assert!(!w.poll_stalled(ms(t0, 3_600_750), true, STALL));
        assert!(!w.poll_stalled(ms(t0, 3_603_000), true, STALL));
        assert!(w.poll_stalled(ms(t0, 3_603_750), true, STALL));
    }

    #[test]
    fn anything_heard_restarts_the_wait() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(t0);
        assert!(!w.poll_stalled(ms(t0, 750), true, STALL));
        w.handle_heard(ms(t0, 2900));
        assert!(!w.poll_stalled(ms(t0, 5000), true, STALL));
        assert!(w.poll_stalled(ms(t0, 5900), true, STALL));
    }

    #[test]
    fn a_connection_left_unread_is_not_stalled_until_a_stall_time_after_reading_resumes() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(t0);
        // Unread from 1,000 to 10,000 (the driver says so at every watch tick).
        let mut t = 1_000;
        while t <= 10_000 {
            w.handle_unread(ms(t0, t));
            assert!(!w.poll_stalled(ms(t0, t), true, STALL));
            t += 750;
        }
        assert!(!w.poll_stalled(ms(t0, 12_500), true, STALL));
        assert!(w.poll_stalled(ms(t0, 13_250), true, STALL));
    }

    #[test]
    fn confirmation_of_everything_ends_the_wait() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(t0);
        assert!(!w.poll_stalled(ms(t0, 2000), true, STALL));
        assert!(!w.poll_stalled(ms(t0, 2750), false, STALL));
        // Waiting again from 3500: 3 s later, not before.
        assert!(!w.poll_stalled(ms(t0, 3500), true, STALL));
        assert!(!w.poll_stalled(ms(t0, 6000), true, STALL));
        assert!(w.poll_stalled(ms(t0, 6500), true, STALL));
    }

    #[test]
    fn quiet_is_measured_from_the_last_bytes_heard() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(t0);
        assert!(!w.is_quiet(ms(t0, 1000), Duration::from_millis(1500)));
        assert!(w.is_quiet(ms(t0, 1500), Duration::from_millis(1500)));
        w.handle_heard(ms(t0, 1500));
        assert!(!w.is_quiet(ms(t0, 2000), Duration::from_millis(1500)));
    }
}
