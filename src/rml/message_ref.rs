//! [`MessageRef`]: an arrived message lent to a receive's callback for the length of the call
//! (`Handle::recv_ref`), so that delivering it touches no reference count.

use super::{Message, Tag};
use crate::Rank;
use bytes::Bytes;

/// A message lent to a [`Handle::recv_ref`](crate::Handle::recv_ref) callback: its payload is
/// borrowed from the frame it arrived in, valid until the callback returns. Keep what you need
/// by copying [`payload`](Self::payload) or, without a copy, with
/// [`to_message`](Self::to_message) (which keeps the whole frame alive: see there).
/// `Debug` shows the origin, the tag and this message's payload only.
#[derive(Clone, Copy)]
pub struct MessageRef<'a> {
    /// The rank that sent it (not the neighbour that relayed it).
    pub origin: Rank,
    /// The tag it was sent with.
    pub tag: Tag,
    /// The frame's bytes; the payload is `start..end` of them.
    bytes: &'a Bytes,
    start: usize,
    end: usize,
}

impl<'a> MessageRef<'a> {
    /// `bytes[start..end]` as the payload; the caller made sure the range is within `bytes`
    /// (an empty payload otherwise).
    pub(crate) fn new(origin: Rank, tag: Tag, bytes: &'a Bytes, start: usize, end: usize) -> Self {
        MessageRef {
            origin,
            tag,
            bytes,
            start,
            end,
        }
    }

    /// A whole message, lent.
    pub(crate) fn of(msg: &'a Message) -> Self {
        MessageRef::new(msg.origin, msg.tag, &msg.payload, 0, msg.payload.len())
    }

    /// The payload.
    pub fn payload(&self) -> &'a [u8] {
        self.bytes.get(self.start..self.end).unwrap_or_default()
    }

    /// The message to keep: its payload shares the frame's allocation (no copy). The whole
    /// frame's memory stays alive as long as the payload does: for a message that came in a
    /// batch frame, up to 32 KiB (`limits::BATCH_FRAME_BYTES_MAX`) of other messages' bytes.
    /// To keep many small messages for long, copy their payloads instead
    /// (`Bytes::copy_from_slice(m.payload())`). The same holds for the `Message`s that
    /// [`Handle::recv`](crate::Handle::recv) hands over.
    pub fn to_message(&self) -> Message {
        let payload = if self.start <= self.end && self.end <= self.bytes.len() {
            self.bytes.slice(self.start..self.end)
        } else {
            Bytes::new()
        };
        Message {
            origin: self.origin,
            tag: self.tag,
            payload,
        }
    }
}

impl std::fmt::Debug for MessageRef<'_> {
    // Not derived: that would print the whole frame, other messages' bytes included.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessageRef")
            .field("origin", &self.origin)
            .field("tag", &self.tag)
            .field("payload", &Bytes::copy_from_slice(self.payload()))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lent_message_shows_its_range_and_keeps_it_without_a_copy() {
        let frame = Bytes::from_static(b"headpayloadtail");
        let m = MessageRef::new(3, 200, &frame, 4, 11);
        assert_eq!(m.payload(), b"payload");
        let kept = m.to_message();
        assert_eq!((kept.origin, kept.tag), (3, 200));
        assert_eq!(kept.payload, Bytes::from_static(b"payload"));
        assert_eq!(kept.payload.as_ptr(), frame[4..].as_ptr());
        // A range outside the frame lends nothing rather than panicking.
        let bad = MessageRef::new(3, 200, &frame, 9, 40);
        assert_eq!(bad.payload(), b"");
        assert!(bad.to_message().payload.is_empty());
        // Debug shows this message only, not the rest of its frame.
        assert_eq!(
            format!("{m:?}"),
            r#"MessageRef { origin: 3, tag: 200, payload: b"payload" }"#
        );
        let whole = Message {
            origin: 1,
            tag: 300,
            payload: Bytes::from_static(b"abc"),
        };
        assert_eq!(MessageRef::of(&whole).payload(), b"abc");
    }
}
