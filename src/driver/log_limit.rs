//! Refusal logging at a bounded rate: a stranger who opens connections costs the daemon at most
//! `limits::REFUSAL_LOG_LINES_PER_INTERVAL` WARN lines per reason per
//! `limits::REFUSAL_LOG_INTERVAL_MS`, then one summary line per reason and interval
//! ("N more refused for REASON in the last T s"). No clock is read here: `now` is passed in.

use std::time::{Duration, Instant};

/// Why a connection in its handshake was closed (or refused at accept).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The peer belongs to another DVM.
    WrongDvm,
    /// The peer's MAC is wrong: it does not hold the job key.
    BadMac,
    /// Bad bytes, a malformed payload, a frame of the wrong kind, rank or destination.
    Malformed,
    /// The handshake did not finish within `handshake_timeout_ms`.
    Timeout,
    /// The peer hung up after its Hello, before proving it holds the key.
    Abandoned,
    /// Closed to make room under the pending-handshake bounds.
    Evicted,
    /// Accepted beyond `limits::CONNECTIONS_MAX`.
    TooManyConnections,
    /// `accept` itself failed (out of file descriptors or memory); retried after
    /// `limits::ACCEPT_RETRY_MS`.
    AcceptFailed,
    /// A client connection refused or closed for breaking the protocol (`event_loop/clients.rs`).
    Client,
}

impl Refusal {
    const ALL: [Refusal; 9] = [
        Refusal::WrongDvm,
        Refusal::BadMac,
        Refusal::Malformed,
        Refusal::Timeout,
        Refusal::Abandoned,
        Refusal::Evicted,
        Refusal::TooManyConnections,
        Refusal::AcceptFailed,
        Refusal::Client,
    ];

    fn index(self) -> usize {
        self as usize
    }

    /// The reason as the summary line names it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Refusal::WrongDvm => "wrong DVM",
            Refusal::BadMac => "bad MAC (no job key)",
            Refusal::Malformed => "malformed handshake",
            Refusal::Timeout => "handshake timeout",
            Refusal::Abandoned => "abandoned handshake",
            Refusal::Evicted => "evicted pending handshake",
            Refusal::TooManyConnections => "too many connections",
            Refusal::AcceptFailed => "accept failed",
            Refusal::Client => "client refused",
        }
    }
}

/// Lines not written for one reason during one interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Summary {
    pub reason: Refusal,
    pub suppressed: u64,
    /// How long the interval lasted (at least the configured interval).
    pub over: Duration,
}

#[derive(Debug, Default, Clone, Copy)]
struct Slot {
    /// Start of the current interval; `None` before the first refusal of this reason.
    since: Option<Instant>,
    written: u32,
    suppressed: u64,
}

/// Per-reason line budget.
#[derive(Debug)]
pub(crate) struct LogLimiter {
    per_interval: u32,
    interval: Duration,
    slots: [Slot; Refusal::ALL.len()],
    /// Lines not written since the limiter was made.
    suppressed_total: u64,
}

impl LogLimiter {
    pub(crate) fn new(per_interval: u32, interval: Duration) -> Self {
        LogLimiter {
            per_interval,
            interval,
            slots: [Slot::default(); Refusal::ALL.len()],
            suppressed_total: 0,
        }
    }

    /// One refusal for `reason` at `now`: whether to write its line. A summary of the
    /// previous interval of this reason, if it ended with lines suppressed, comes back too,
    /// to be written first.
    pub(crate) fn admit(&mut self, reason: Refusal, now: Instant) -> (bool, Option<Summary>) {
        let interval = self.interval;
        let Some(slot) = self.slots.get_mut(reason.index()) else {
            return (true, None);
        };
        let summary = roll(slot, reason, now, interval);
        slot.since.get_or_insert(now);
        if slot.written < self.per_interval {
            slot.written += 1;
            (true, summary)
        } else {
            slot.suppressed += 1;
            self.suppressed_total += 1;
            (false, summary)
        }
    }

    /// The summaries of intervals that have ended by `now` with lines suppressed (call this
    /// regularly, so a summary is written even when the refusals stop).
    pub(crate) fn due(&mut self, now: Instant) -> Vec<Summary> {
        let interval = self.interval;
        let mut out = Vec::new();
        for (slot, reason) in self.slots.iter_mut().zip(Refusal::ALL) {
            if slot.suppressed > 0
                && let Some(s) = roll(slot, reason, now, interval)
            {
                out.push(s);
            }
        }
        out
    }

    /// Every summary still owed, interval over or not (when the daemon stops).
    pub(crate) fn flush(&mut self, now: Instant) -> Vec<Summary> {
        let mut out = Vec::new();
        for (slot, reason) in self.slots.iter_mut().zip(Refusal::ALL) {
            if slot.suppressed > 0
                && let Some(since) = slot.since
            {
                out.push(Summary {
                    reason,
                    suppressed: slot.suppressed,
                    over: now.saturating_duration_since(since),
                });
            }
            *slot = Slot::default();
        }
        out
    }

    /// Lines not written since the limiter was made.
    pub(crate) fn suppressed_total(&self) -> u64 {
        self.suppressed_total
    }
}

/// Ends the slot's interval if it is over by `now`: returns its summary if lines were
/// suppressed, and starts a fresh interval at the next refusal.
fn roll(slot: &mut Slot, reason: Refusal, now: Instant, interval: Duration) -> Option<Summary> {
    let since = slot.since?;
    let over = now.saturating_duration_since(since);
    if over < interval {
        return None;
    }
    let summary = (slot.suppressed > 0).then_some(Summary {
        reason,
        suppressed: slot.suppressed,
        over,
    });
    *slot = Slot::default();
    summary
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_few_lines_per_reason_then_a_summary() {
        let t0 = Instant::now();
        let mut l = LogLimiter::new(3, Duration::from_secs(10));
        let mut written = 0;
        for i in 0..1000u64 {
            let (w, s) = l.admit(Refusal::BadMac, t0 + Duration::from_millis(i));
            assert!(s.is_none());
            written += u32::from(w);
        }
        assert_eq!(written, 3);
        assert_eq!(l.suppressed_total(), 997);
        // Another reason has its own budget.
        assert!(l.admit(Refusal::Timeout, t0).0);
        // Nothing due before the interval ends.
        assert!(l.due(t0 + Duration::from_secs(9)).is_empty());
        let due = l.due(t0 + Duration::from_secs(10));
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].reason, Refusal::BadMac);
        assert_eq!(due[0].suppressed, 997);
        assert_eq!(due[0].over, Duration::from_secs(10));
        // Once summarised, not again; the budget is back.
        assert!(l.due(t0 + Duration::from_secs(30)).is_empty());
        assert!(l.admit(Refusal::BadMac, t0 + Duration::from_secs(31)).0);
    }

    #[test]
    fn the_next_refusal_after_the_interval_carries_the_summary() {
        let t0 = Instant::now();
        let mut l = LogLimiter::new(1, Duration::from_secs(1));
        assert_eq!(l.admit(Refusal::Evicted, t0), (true, None));
        assert_eq!(l.admit(Refusal::Evicted, t0), (false, None));
        assert_eq!(l.admit(Refusal::Evicted, t0), (false, None));
        let (w, s) = l.admit(Refusal::Evicted, t0 + Duration::from_secs(2));
        assert!(w);
        let s = s.expect("a summary");
        assert_eq!((s.reason, s.suppressed), (Refusal::Evicted, 2));
        assert_eq!(l.suppressed_total(), 2);
        assert_eq!(
            l.admit(Refusal::Evicted, t0 + Duration::from_secs(2)),
            (false, None)
        );
        let owed = l.flush(t0 + Duration::from_secs(2));
        assert_eq!(owed.len(), 1);
        assert_eq!(owed[0].suppressed, 1);
        assert!(l.flush(t0 + Duration::from_secs(3)).is_empty());
    }

    #[test]
    fn no_summary_without_suppressed_lines() {
        let t0 = Instant::now();
        let mut l = LogLimiter::new(5, Duration::from_secs(1));
        for r in Refusal::ALL {
            assert!(l.admit(r, t0).0);
            assert!(!r.as_str().is_empty());
        }
        assert!(l.due(t0 + Duration::from_secs(5)).is_empty());
        assert!(l.flush(t0).is_empty());
        for r in Refusal::ALL {
            assert_eq!(l.admit(r, t0 + Duration::from_secs(5)), (true, None));
        }
    }
}
