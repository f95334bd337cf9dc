//! [`Batch`]: many plain sends handed to a daemon's loop as one command, for callers with many
//! small messages (one channel operation, one gate check of the bytes and at most one wake-up
//! for the whole batch instead of one each).

use crate::Rank;
use crate::error::SendError;
use crate::limits;
use crate::rml::{TAG_USER_MIN, Tag};
use bytes::Bytes;

/// One message of a [`Batch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The destination rank.
    pub dst: Rank,
    /// The tag (at least [`TAG_USER_MIN`]).
    pub tag: Tag,
    /// The payload: one of at most 256 bytes (`limits::BATCH_ITEM_MAX_BYTES`) to another
    /// daemon is copied into its batch frame on the thread that calls `send_batch`, and this
    /// `Bytes` is released there; a larger one is shared, never copied, on its way through the
    /// daemon.
    pub payload: Bytes,
}

/// Plain messages to send together with [`Handle::send_batch`](crate::Handle::send_batch).
///
/// A batch holds at most [`limits::SEND_BATCH_MAX`] messages: [`push`](Self::push) returns
/// `Busy` at the bound (send the batch, then push again). Messages to the same destination keep
/// the order in which they were pushed, and stay in order with the daemon's other plain sends
/// from the same thread. A batch may be reused: `send_batch` empties it as it sends.
#[derive(Debug, Default)]
pub struct Batch {
    pub(crate) msgs: Vec<Outgoing>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Batch::default()
    }

    /// Adds a message. Errors: `ReservedTag` for a tag below [`TAG_USER_MIN`]; `Busy` when the
    /// batch already holds [`limits::SEND_BATCH_MAX`] messages. The rank and the payload size
    /// are checked by `send_batch`, against the daemon's DVM size and `msg_max_bytes`.
    pub fn push(
        &mut self,
        dst: Rank,
        tag: Tag,
        payload: impl Into<Bytes>,
    ) -> Result<(), SendError> {
        if tag < TAG_USER_MIN {
            return Err(SendError::ReservedTag(tag));
        }
        if self.msgs.len() >= limits::SEND_BATCH_MAX {
            return Err(SendError::Busy(crate::error::Limit::Batch));
        }
        self.msgs.push(Outgoing {
            dst,
            tag,
            payload: payload.into(),
        });
        Ok(())
    }

    /// Messages not sent yet.
    pub fn len(&self) -> usize {
        self.msgs.len()
    }

    /// Whether every message was sent (or none pushed).
    pub fn is_empty(&self) -> bool {
        self.msgs.is_empty()
    }

    /// The messages not sent yet, in order.
    pub fn pending(&self) -> &[Outgoing] {
        &self.msgs
    }

    /// Forgets every message not sent yet.
    pub fn clear(&mut self) {
        self.msgs.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_refuses_reserved_tags_and_stops_at_its_bound() {
        let mut b = Batch::new();
        assert_eq!(b.push(1, 3, Bytes::new()), Err(SendError::ReservedTag(3)));
        for i in 0..limits::SEND_BATCH_MAX {
            b.push(1, TAG_USER_MIN, vec![i as u8]).expect("room");
        }
        assert!(matches!(
            b.push(1, TAG_USER_MIN, Bytes::new()),
            Err(SendError::Busy(_))
        ));
        assert_eq!(b.len(), limits::SEND_BATCH_MAX);
        assert_eq!(b.pending()[2].payload, Bytes::from(vec![2u8]));
        b.clear();
        assert!(b.is_empty());
    }
}
