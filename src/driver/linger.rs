//! Whether the loop, about to sleep right after it handed the application a message or a
//! completion, first waits a few microseconds for the command that often answers it.
//!
//! Why: in a request-reply exchange the application answers a delivered message at once (a
//! reply, the next ping). A loop that sleeps as soon as its turn ends must then be woken: a
//! `Waker` write by the caller and a wake-up of the loop's thread, several microseconds each on
//! a virtual machine, paid at every exchange. Lingering for `LINGER_US` catches the answer
//! without either (measured: the 64 B round trip went from 1.2x plain mio's to about 1.1x).
//!
//! It is adaptive so that a daemon whose application does not answer wastes no processor: a
//! linger that catches nothing spends one of `LINGER_CREDIT_MAX` credits; none is spent once
//! they are gone. A linger that catches a command, or a wake-up by a caller soon after the loop
//! fell asleep following a hand-over (a linger would have caught it), restores them. The clock
//! is passed in; the caller does the waiting.
//!
//! Nor does a loop linger while its daemon produces or consumes a stream. Its stream's threads
//! (the handler writing, the reader checking each chunk) and the loop all have work then, and
//! on a machine with few processors a spinning loop takes one from them. Measured (`tbon bench`
//! stream roles, one 4 GiB stream over a direct link with 64 B round trips beside it, 2
//! processors, four runs each, alternating): lingering, the round trip during the stream was
//! 179-364 µs; without, 72-126 µs, at the same bandwidth within noise.

use crate::limits;
use std::time::{Duration, Instant};

/// The lingering policy of one loop.
#[derive(Debug)]
pub(crate) struct Linger {
    credit: u32,
    /// Something reached the application in this turn.
    handed: bool,
    /// When the loop fell asleep after a turn that handed something over.
    asleep_after_hand_over: Option<Instant>,
}

impl Default for Linger {
    fn default() -> Self {
        Linger {
            credit: limits::LINGER_CREDIT_MAX,
            handed: false,
            asleep_after_hand_over: None,
        }
    }
}

impl Linger {
    /// The application got a message, a run or a completion in this turn.
    pub(crate) fn handed_over(&mut self) {
        self.handed = true;
    }

    /// Whether the application got something in this turn so far.
    pub(crate) fn handed_in_turn(&self) -> bool {
        self.handed
    }

    /// How long to wait for a command before sleeping, if at all. Called once per sleep;
    /// `streams` if the daemon produces or consumes a stream: it does not linger then (see the
    /// module's doc).
    pub(crate) fn before_sleep(&self, streams: bool) -> Option<Duration> {
        (self.handed && self.credit > 0 && !streams)
            .then(|| Duration::from_micros(limits::LINGER_US))
    }

    /// What the wait [`before_sleep`](Self::before_sleep) asked for gave: a command or nothing.
    pub(crate) fn lingered(&mut self, caught: bool) {
        self.handed = false;
        self.credit = if caught {
            limits::LINGER_CREDIT_MAX
        } else {
            self.credit.saturating_sub(1)
        };
    }

    /// The loop goes to sleep in `poll` at `now` (after lingering or not).
    pub(crate) fn sleeping(&mut self, now: Instant) {
        self.asleep_after_hand_over = self.handed.then_some(now);
        self.handed = false;
    }

    /// The loop woke at `now`; `by_caller` if a caller's `Waker` woke it.
    pub(crate) fn woke(&mut self, now: Instant, by_caller: bool) {
        if let Some(at) = self.asleep_after_hand_over.take()
            && by_caller
            && now.saturating_duration_since(at) <= Duration::from_micros(limits::LINGER_US)
        {
            self.credit = limits::LINGER_CREDIT_MAX;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lingers_only_after_a_hand_over_and_stops_when_it_catches_nothing() {
        let mut l = Linger::default();
        assert_eq!(l.before_sleep(false), None, "nothing handed over");
        for _ in 0..limits::LINGER_CREDIT_MAX {
            l.handed_over();
            assert!(l.before_sleep(false).is_some());
            l.lingered(false);
        }
        l.handed_over();
        assert_eq!(l.before_sleep(false), None, "credits spent");
        // A caller's wake-up soon after sleeping restores them; a late one does not.
        let t = Instant::now();
        l.sleeping(t);
        l.woke(t + Duration::from_micros(limits::LINGER_US * 4), true);
        l.handed_over();
        assert_eq!(l.before_sleep(false), None);
        l.sleeping(t);
        l.woke(t + Duration::from_micros(1), true);
        l.handed_over();
        assert!(l.before_sleep(false).is_some());
        l.lingered(true);
        assert_eq!(
            l.before_sleep(false),
            None,
            "the hand-over is used by one sleep"
        );
    }

    #[test]
    fn does_not_linger_while_streams_are_open() {
        let mut l = Linger::default();
        l.handed_over();
        assert_eq!(l.before_sleep(true), None);
        assert!(
            l.before_sleep(false).is_some(),
            "the hand-over still counts"
        );
    }
}
