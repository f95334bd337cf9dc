//! RELM batch frames: consecutive small reliable messages of one chain (one origin, one
//! destination) that go to the same neighbour in one turn travel as one `RelmData` frame with
//! the reserved tag [`TAG_BATCH`], so that the sender and every hop handle one header, one
//! route check and one queue entry for up to [`BATCH_FRAME_ITEMS_MAX`] of them. RELM itself is
//! unchanged: every hop still keeps a record per message, acknowledgements stay cumulative per
//! chain, and a replay, a link update or a retransmission concerns single messages, which a
//! later turn may pack again.
//!
//! Payload layout: items back to back, each `uid u32 | prev u32 | tag u32 | len u32`
//! (network byte order) and then `len` bytes: the fields a lone message carries in its header
//! (`seq` and `tag`). The header's `seq` is 0, its origin and destination are every item's.
//!
//! A receiver checks the whole payload before it hands RELM any item: a malformed batch closes
//! the connection, as a malformed lone `RelmData` frame does.
//!
//! Only payloads of at most [`BATCH_ITEM_MAX_BYTES`] are packed, the ones the send queue copies
//! anyway; a larger message keeps its frame of its own, and a run of one is sent as itself.

use super::steady::DataFrame;
use super::uid;
use crate::Rank;
use crate::limits::{BATCH_FRAME_BYTES_MAX, BATCH_FRAME_ITEMS_MAX, BATCH_ITEM_MAX_BYTES};
use crate::rml::Tag;
use crate::rml::batch_frame::ItemRun;
use crate::rml::runs::{Run, RunItem, Runs};
use bytes::{Bytes, BytesMut};
use std::fmt;

pub use crate::rml::batch_frame::TAG_BATCH;

/// Bytes before each item's payload: its uid, its predecessor's uid, its tag and its length.
pub const ITEM_HEADER_LEN: usize = 16;

/// What [`Packer`] hands on: a lone message, or a batch of one chain's messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packed {
    /// A message sent as itself (a lone `RelmData` frame).
    One {
        /// The neighbour.
        to: Rank,
        /// The message.
        frame: DataFrame,
    },
    /// Two or more messages of the chain (`origin`, `dst`) in one frame.
    Batch {
        /// The neighbour.
        to: Rank,
        /// The chain's origin.
        origin: Rank,
        /// The chain's destination.
        dst: Rank,
        /// The encoded items.
        payload: Bytes,
        /// How many.
        items: u32,
    },
}

/// Packs the data frames RELM asks for, in the order it asks: a run of consecutive small
/// messages for one neighbour and one chain becomes one batch (the rule is `rml::runs`'s). The
/// caller hands on what [`Packer::push`] and [`Packer::finish`] return, in the order they
/// return it; so a neighbour sees every chain's messages in the order RELM sent them.
#[derive(Debug)]
pub struct Packer {
    runs: Runs<Hop>,
}

/// A reliable message for a neighbour as a run item: (neighbour, origin, destination) is the
/// run's key.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Hop {
    to: Rank,
    frame: DataFrame,
}

impl RunItem for Hop {
    type Key = (Rank, Rank, Rank);
    const HEADER_LEN: usize = ITEM_HEADER_LEN;

    fn key(&self) -> (Rank, Rank, Rank) {
        (self.to, self.frame.origin, self.frame.dst)
    }

    fn payload_len(&self) -> usize {
        self.frame.payload.len()
    }

    fn put(&self, buf: &mut BytesMut) {
        put_item(buf, &self.frame);
    }
}

impl Packer {
    /// A packer whose batches stay within `msg_max_bytes` (the daemon's setting) and within
    /// [`BATCH_FRAME_BYTES_MAX`].
    pub fn with_frame_max(msg_max_bytes: usize) -> Self {
        Packer {
            runs: Runs::new(msg_max_bytes.min(BATCH_FRAME_BYTES_MAX)),
        }
    }

    /// Whether a message may join a batch at all (its payload is small).
    pub fn packable(frame: &DataFrame) -> bool {
        frame.payload.len() <= BATCH_ITEM_MAX_BYTES
    }

    /// Offers the next message for neighbour `to`; returns the open run if this message
    /// cannot join it (the caller sends that first). A message that is not
    /// [`packable`](Self::packable) must not be offered: the caller calls
    /// [`finish`](Self::finish) and sends it as itself.
    #[must_use]
    pub fn push(&mut self, to: Rank, frame: DataFrame) -> Option<Packed> {
        debug_assert!(Self::packable(&frame));
        self.runs.push(Hop { to, frame }).map(packed)
    }

    /// Hands on the open run, if any.
    #[must_use]
    pub fn finish(&mut self) -> Option<Packed> {
        self.runs.finish().map(packed)
    }
}

fn packed(run: Run<Hop>) -> Packed {
    match run {
        Run::One(Hop { to, frame }) => Packed::One { to, frame },
        Run::Batch {
            key: (to, origin, dst),
            payload,
            items,
        } => Packed::Batch {
            to,
            origin,
            dst,
            payload,
            items,
        },
    }
}

fn put_item(buf: &mut BytesMut, f: &DataFrame) {
    // Items are at most `BATCH_ITEM_MAX_BYTES` long: the length always fits.
    let len = u32::try_from(f.payload.len()).unwrap_or(u32::MAX);
    let mut head = [0u8; ITEM_HEADER_LEN];
    for (at, v) in [f.uid, f.prev, f.tag, len].into_iter().enumerate() {
        if let Some(field) = head.get_mut(at * 4..at * 4 + 4) {
            field.copy_from_slice(&v.to_be_bytes());
        }
    }
    buf.extend_from_slice(&head);
    buf.extend_from_slice(&f.payload);
}

/// Why a RELM batch payload is not valid: the frame is refused whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchError {
    /// No item, or only one (a run of one is sent as a lone frame).
    TooFew,
    /// More items than [`BATCH_FRAME_ITEMS_MAX`].
    TooMany,
    /// An item's header or payload runs past the end, at this offset.
    Truncated(usize),
    /// An item's uid or predecessor is a sentinel, at this offset.
    Uid(usize, u32),
    /// An item's tag may not travel reliably, at this offset.
    Tag(usize, Tag),
}

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BatchError::TooFew => write!(f, "a reliable batch with fewer than two items"),
            BatchError::TooMany => {
                write!(
                    f,
                    "more than {BATCH_FRAME_ITEMS_MAX} items in a reliable batch"
                )
            }
            BatchError::Truncated(at) => {
                write!(f, "a reliable batch item at byte {at} runs past the end")
            }
            BatchError::Uid(at, u) => {
                write!(
                    f,
                    "the reliable batch item at byte {at} has the invalid uid {u}"
                )
            }
            BatchError::Tag(at, t) => {
                write!(f, "the reliable batch item at byte {at} has the tag {t}")
            }
        }
    }
}

impl std::error::Error for BatchError {}

/// The items of a batch payload, checked whole on creation.
#[derive(Debug, Clone)]
pub struct Items {
    payload: Bytes,
    at: usize,
    origin: Rank,
    dst: Rank,
    shape: Shape,
}

/// What the check learnt of a batch's items as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// How many items (2 to `BATCH_FRAME_ITEMS_MAX`).
    pub count: u32,
    /// The tag of every item, if all carry the same one.
    pub one_tag: Option<Tag>,
    /// The first item's predecessor uid.
    pub first_prev: u32,
    /// The first item's uid.
    pub first_uid: u32,
    /// The last item's uid.
    pub last_uid: u32,
    /// Whether each item after the first names the one before it as its predecessor, and comes
    /// after it: the items continue one another in their chain, as an origin sends them.
    pub linked: bool,
}

impl Items {
    /// Checks every item of `payload` (the chain `origin` -> `dst`): its layout, at least two
    /// and at most [`BATCH_FRAME_ITEMS_MAX`] items, valid uids, and tags that `tag_ok` allows.
    pub fn new(
        payload: Bytes,
        origin: Rank,
        dst: Rank,
        tag_ok: impl Fn(Tag) -> bool,
    ) -> Result<Items, BatchError> {
        let mut at = 0usize;
        let mut count = 0usize;
        let mut shape = Shape {
            count: 0,
            one_tag: None,
            first_prev: uid::NONE,
            first_uid: uid::NONE,
            last_uid: uid::NONE,
            linked: true,
        };
        let mut mixed = false;
        while at < payload.len() {
            let (item, next) = item_at(&payload, at).ok_or(BatchError::Truncated(at))?;
            if !uid::is_valid(item.uid) {
                return Err(BatchError::Uid(at, item.uid));
            }
            if !(uid::is_valid(item.prev) || item.prev == uid::NONE) {
                return Err(BatchError::Uid(at, item.prev));
            }
            if !tag_ok(item.tag) {
                return Err(BatchError::Tag(at, item.tag));
            }
            if count == 0 {
                shape.first_prev = item.prev;
                shape.first_uid = item.uid;
            } else {
                shape.linked &= item.prev == shape.last_uid && uid::before(item.prev, item.uid);
            }
            mixed |= *shape.one_tag.get_or_insert(item.tag) != item.tag;
            shape.last_uid = item.uid;
            count += 1;
            if count > BATCH_FRAME_ITEMS_MAX {
                return Err(BatchError::TooMany);
            }
            at = next;
        }
        if count < 2 {
            return Err(BatchError::TooFew);
        }
        if mixed {
            shape.one_tag = None;
        }
        // At most `BATCH_FRAME_ITEMS_MAX`, checked above.
        shape.count = u32::try_from(count).unwrap_or(u32::MAX);
        Ok(Items {
            payload,
            at: 0,
            origin,
            dst,
            shape,
        })
    }

    /// The chain's origin.
    pub fn origin(&self) -> Rank {
        self.origin
    }

    /// The chain's destination.
    pub fn dst(&self) -> Rank {
        self.dst
    }

    /// What the check learnt of the items as a whole.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// All the items as one run of messages with tag `tag` (for a batch whose items all
    /// carry it: [`Shape::one_tag`]), for delivery without slicing the batch per item.
    pub fn whole_run(&self, tag: Tag) -> ItemRun {
        ItemRun::whole(
            self.origin,
            tag,
            self.payload.clone(),
            ITEM_HEADER_LEN - crate::rml::batch_frame::ITEM_HEADER_LEN,
            self.shape.count,
        )
    }
}

impl Iterator for Items {
    type Item = DataFrame;

    fn next(&mut self) -> Option<DataFrame> {
        let (item, next) = item_at(&self.payload, self.at)?;
        let body = self.payload.slice(self.at + ITEM_HEADER_LEN..next);
        self.at = next;
        Some(DataFrame {
            origin: self.origin,
            dst: self.dst,
            tag: item.tag,
            uid: item.uid,
            prev: item.prev,
            payload: body,
        })
    }
}

/// One item's header fields.
struct ItemHead {
    uid: u32,
    prev: u32,
    tag: u32,
}

/// The item at byte `at` and the offset after it, if it lies whole within `payload`.
fn item_at(payload: &[u8], at: usize) -> Option<(ItemHead, usize)> {
    let head = payload.get(at..at.checked_add(ITEM_HEADER_LEN)?)?;
    let word = |i: usize| {
        head.get(i * 4..i * 4 + 4)
            .and_then(|w| <[u8; 4]>::try_from(w).ok())
            .map(u32::from_be_bytes)
    };
    let (uid, prev, tag, len) = (word(0)?, word(1)?, word(2)?, word(3)?);
    let end = at
        .checked_add(ITEM_HEADER_LEN)?
        .checked_add(usize::try_from(len).ok()?)?;
    if end > payload.len() {
        return None;
    }
    Some((ItemHead { uid, prev, tag }, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(origin: Rank, dst: Rank, uid: u32, len: usize) -> DataFrame {
        DataFrame {
            origin,
            dst,
            tag: 100 + uid,
            uid,
            prev: if uid == 0 { uid::NONE } else { uid - 1 },
            payload: Bytes::from(vec![uid as u8; len]),
        }
    }

    fn pack(p: &mut Packer, frames: Vec<(Rank, DataFrame)>) -> Vec<Packed> {
        let mut out = Vec::new();
        for (to, f) in frames {
            if Packer::packable(&f) {
                out.extend(p.push(to, f));
            } else {
                out.extend(p.finish());
                out.push(Packed::One { to, frame: f });
            }
        }
        out.extend(p.finish());
        out
    }

    #[test]
    fn a_run_of_one_chain_becomes_one_batch_and_decodes_to_the_same_messages() {
        let mut p = Packer::with_frame_max(1 << 20);
        let sent: Vec<DataFrame> = (0..5).map(|u| frame(1, 2, u, 64)).collect();
        let out = pack(&mut p, sent.iter().map(|f| (7, f.clone())).collect());
        let [
            Packed::Batch {
                to: 7,
                origin: 1,
                dst: 2,
                payload,
                items: 5,
            },
        ] = out.as_slice()
        else {
            panic!("one batch of 5 expected: {out:?}");
        };
        let got: Vec<DataFrame> = Items::new(payload.clone(), 1, 2, |_| true)
            .expect("valid")
            .collect();
        assert_eq!(got, sent);
    }

    #[test]
    fn another_neighbour_chain_or_a_large_message_ends_the_run_in_order() {
        let mut p = Packer::with_frame_max(1 << 20);
        let out = pack(
            &mut p,
            vec![
                (7, frame(1, 2, 0, 8)),
                (7, frame(1, 2, 1, 8)),
                (8, frame(1, 2, 2, 8)),
                (8, frame(1, 3, 3, 8)),
                (8, frame(1, 3, 4, 8)),
                (8, frame(1, 3, 5, BATCH_ITEM_MAX_BYTES + 1)),
                (8, frame(1, 3, 6, 8)),
            ],
        );
        let shape: Vec<(Rank, u32)> = out
            .iter()
            .map(|p| match p {
                Packed::One { to, .. } => (*to, 1),
                Packed::Batch { to, items, .. } => (*to, *items),
            })
            .collect();
        assert_eq!(shape, vec![(7, 2), (8, 1), (8, 2), (8, 1), (8, 1)]);
    }

    #[test]
    fn a_batch_stays_within_its_bounds_in_bytes_and_items() {
        let mut p = Packer::with_frame_max(10 * (ITEM_HEADER_LEN + 64));
        let out = pack(&mut p, (0..25).map(|u| (7, frame(1, 2, u, 64))).collect());
        let items: Vec<u32> = out
            .iter()
            .map(|p| match p {
                Packed::Batch { items, .. } => *items,
                Packed::One { .. } => 1,
            })
            .collect();
        assert_eq!(items, vec![10, 10, 5]);
        let mut p = Packer::with_frame_max(1 << 30);
        let n = BATCH_FRAME_ITEMS_MAX as u32 + 3;
        let out = pack(&mut p, (0..n).map(|u| (7, frame(1, 2, u, 0))).collect());
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn malformed_batches_are_refused_whole() {
        let mut p = Packer::with_frame_max(1 << 20);
        let out = pack(&mut p, (0..3).map(|u| (7, frame(1, 2, u, 4))).collect());
        let [Packed::Batch { payload, .. }] = out.as_slice() else {
            panic!("one batch expected");
        };
        let ok = |t: Tag| t >= 100;
        assert!(Items::new(payload.clone(), 1, 2, ok).is_ok());
        // Cut short, at every length.
        let item = ITEM_HEADER_LEN + 4;
        for cut in 1..payload.len() {
            let short = payload.slice(..cut);
            if cut % item == 0 && cut / item >= 2 {
                assert_eq!(
                    Items::new(short, 1, 2, ok).map(Iterator::count).ok(),
                    Some(2)
                );
                continue;
            }
            let Err(e) = Items::new(short, 1, 2, ok) else {
                panic!("a batch cut at {cut} taken");
            };
            assert!(
                matches!(e, BatchError::Truncated(_) | BatchError::TooFew),
                "{e}"
            );
        }
        // A tag refused, a sentinel uid, a single item.
        assert_eq!(
            Items::new(payload.clone(), 1, 2, |t| t != 101).err(),
            Some(BatchError::Tag(ITEM_HEADER_LEN + 4, 101))
        );
        let mut bad = payload.to_vec();
        bad[..4].copy_from_slice(&uid::INVALID.to_be_bytes());
        assert_eq!(
            Items::new(Bytes::from(bad), 1, 2, ok).err(),
            Some(BatchError::Uid(0, uid::INVALID))
        );
        let one = payload.slice(..ITEM_HEADER_LEN + 4);
        assert_eq!(Items::new(one, 1, 2, ok).err(), Some(BatchError::TooFew));
        // One item too many.
        let mut many = BytesMut::new();
        for u in 0..=BATCH_FRAME_ITEMS_MAX as u32 {
            put_item(&mut many, &frame(1, 2, u, 0));
        }
        assert_eq!(
            Items::new(many.freeze(), 1, 2, ok).err(),
            Some(BatchError::TooMany)
        );
        // A length that would overflow.
        let mut huge = payload.to_vec();
        huge[12..16].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            Items::new(Bytes::from(huge), 1, 2, ok),
            Err(BatchError::Truncated(0))
        ));
    }
}
