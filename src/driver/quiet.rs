//! Whether messages flow through a daemon's loop, and so how much stream data a turn writes:
//! while none does, a message's latency is not at stake, and a stream's bandwidth is.
//!
//! A message here is what `node::lane::keeps_bulk_writes_small` says (heartbeats, link
//! acknowledgements, direct-link negotiation and the streams' own frames are not: they come
//! with every stream). While one was read or queued within `limits::BULK_QUIET_AFTER_MS`, a
//! bulk connection is written `BULK_FLUSH_BYTES` a turn, so that the loop's turns stay short;
//! otherwise up to `BULK_FLUSH_QUIET_BYTES`.
//!
//! Tried and not kept: the loop also checking a `Stream` reader's chunks while quiet (where its
//! read left them in cache): 3.1-3.2 GiB/s against 3.3-3.4 with the reader checking (2 GiB
//! alone, three runs each, alternating): the reader's thread still wakes for every chunk, and
//! the loop, now longer, was the limit.

use crate::limits;
use std::time::{Duration, Instant};

/// When the loop last read or queued a message.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MessageClock {
    last: Instant,
}

impl MessageClock {
    /// A clock that last heard a message at `now` (a daemon starts as if one just passed).
    pub(crate) fn new(now: Instant) -> Self {
        MessageClock { last: now }
    }

    /// A message was read or queued at `now`.
    #[inline]
    pub(crate) fn heard(&mut self, now: Instant) {
        self.last = now;
    }

    /// Whether messages flow at `now`: one was heard within `limits::BULK_QUIET_AFTER_MS`.
    pub(crate) fn flowing(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last)
            < Duration::from_millis(limits::BULK_QUIET_AFTER_MS)
    }

    /// What a bulk connection may write in a turn at `now`.
    pub(crate) fn bulk_flush_bytes(&self, now: Instant) -> usize {
        if self.flowing(now) {
            limits::BULK_FLUSH_BYTES
        } else {
            limits::BULK_FLUSH_QUIET_BYTES
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn while_messages_flow_bulk_writes_are_short() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut clock = MessageClock::new(t0);
        assert_eq!(clock.bulk_flush_bytes(t0), limits::BULK_FLUSH_BYTES);
        let still = t0 + ms(limits::BULK_QUIET_AFTER_MS) - ms(1);
        assert_eq!(clock.bulk_flush_bytes(still), limits::BULK_FLUSH_BYTES);
        let quiet = t0 + ms(limits::BULK_QUIET_AFTER_MS);
        assert_eq!(
            clock.bulk_flush_bytes(quiet),
            limits::BULK_FLUSH_QUIET_BYTES
        );
        clock.heard(quiet);
        assert_eq!(clock.bulk_flush_bytes(quiet), limits::BULK_FLUSH_BYTES);
        assert_eq!(
            clock.bulk_flush_bytes(quiet + ms(1)),
            limits::BULK_FLUSH_BYTES
        );
    }
}
