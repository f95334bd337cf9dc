//! Batch frames: consecutive small plain messages from one `send_batch` to one destination
//! carried as the items of one message with the reserved tag [`TAG_BATCH`], so that the
//! sender, every relay and the receiver handle one frame (one header, one route decision, one
//! queue entry, one link-session record) for up to [`BATCH_FRAME_ITEMS_MAX`] messages.
//!
//! Payload layout: items back to back, each `tag: u32, len: u32` (network byte order) and then
//! `len` bytes. Every item's tag is a user tag. The destination checks the whole payload before
//! it delivers any item: a malformed batch is dropped whole and logged (it was sent by a tbon
//! daemon holding the job key, so it is a bug there, not a stranger's input).
//!
//! Only payloads of at most [`BATCH_ITEM_MAX_BYTES`] are packed: they are the ones the send
//! queue copies anyway (`limits::SEND_COALESCE_MAX_PAYLOAD`), so packing adds no copy; larger
//! ones keep their own frame and are never copied. A run of one message is sent as itself.

use super::runs::{Run, RunItem, Runs};
use super::{Message, MessageRef, TAG_USER_MIN, Tag};
use crate::Rank;
use crate::limits::{BATCH_FRAME_BYTES_MAX, BATCH_FRAME_ITEMS_MAX, BATCH_ITEM_MAX_BYTES};
use bytes::{Bytes, BytesMut};
use std::fmt;

/// The reserved tag of a batch frame's message.
pub const TAG_BATCH: Tag = 28;

/// Bytes before each item's payload: its tag and its length.
pub const ITEM_HEADER_LEN: usize = 8;

/// One message to send, as the packer hands it on: a batch (`tag == TAG_BATCH`, `messages`
/// items) or a single message (`messages == 1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    /// The destination.
    pub dst: Rank,
    /// The message's tag: the user's, or [`TAG_BATCH`].
    pub tag: Tag,
    /// The payload.
    pub payload: Bytes,
    /// How many user messages it carries.
    pub messages: u32,
}

/// Groups a sequence of plain messages into [`Unit`]s, in order: runs of consecutive small
/// messages to the same destination become one batch each (bounded by
/// [`BATCH_FRAME_BYTES_MAX`] and [`BATCH_FRAME_ITEMS_MAX`]; the rule is `rml::runs`'s); every
/// other message is its own unit. Messages to one destination leave in the order they were
/// offered.
#[derive(Debug)]
pub struct Packer {
    runs: Runs<Plain>,
}

/// A plain message as a run item: its destination is the run's key.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Plain {
    dst: Rank,
    tag: Tag,
    payload: Bytes,
}

impl RunItem for Plain {
    type Key = Rank;
    const HEADER_LEN: usize = ITEM_HEADER_LEN;

    fn key(&self) -> Rank {
        self.dst
    }

    fn payload_len(&self) -> usize {
        self.payload.len()
    }

    fn put(&self, buf: &mut BytesMut) {
        put_item(buf, self.tag, &self.payload);
    }
}

impl Default for Packer {
    fn default() -> Self {
        Packer::with_frame_max(BATCH_FRAME_BYTES_MAX as u64)
    }
}

impl Packer {
    /// A packer with no open run, for daemons that accept messages of at least
    /// [`BATCH_FRAME_BYTES_MAX`] bytes (the simulator's and the tests'; a daemon's loop packs
    /// within its own `msg_max_bytes`).
    #[cfg(any(test, feature = "sim"))]
    pub fn new() -> Self {
        Packer::default()
    }

    /// A packer whose batches stay within `msg_max_bytes` (the daemon's setting), and within
    /// [`BATCH_FRAME_BYTES_MAX`].
    pub fn with_frame_max(msg_max_bytes: u64) -> Self {
        let frame_max = usize::try_from(msg_max_bytes)
            .unwrap_or(usize::MAX)
            .min(BATCH_FRAME_BYTES_MAX);
        Packer {
            runs: Runs::new(frame_max),
        }
    }

    /// Offers the next message; `emit` gets the units completed by it (the open run, when this
    /// message cannot join it; this message itself, when it cannot open a run). `packable`
    /// false (a message to this daemon itself) keeps it out of any batch.
    pub fn push(
        &mut self,
        dst: Rank,
        tag: Tag,
        payload: Bytes,
        packable: bool,
        mut emit: impl FnMut(Unit),
    ) {
        let small = packable && payload.len() <= BATCH_ITEM_MAX_BYTES;
        if !small {
            self.finish(&mut emit);
            emit(Unit {
                dst,
                tag,
                payload,
                messages: 1,
            });
            return;
        }
        if let Some(run) = self.runs.push(Plain { dst, tag, payload }) {
            emit(unit(run));
        }
    }

    /// Hands on the open run, if any.
    pub fn finish(&mut self, mut emit: impl FnMut(Unit)) {
        if let Some(run) = self.runs.finish() {
            emit(unit(run));
        }
    }
}

/// Packs a whole sequence of plain messages into [`Unit`]s, in order, by the same rule as
/// [`Packer::push`] and [`Packer::finish`] (a test holds the two to the same units). `parts`
/// gives a message's destination, tag, payload and whether it may be packed. Knowing the whole
/// sequence, it sizes each batch exactly and copies each small payload once, without taking a
/// reference to it: what `Handle::send_batch` packs with on the caller's thread. At most
/// `msg_max_bytes` (and [`BATCH_FRAME_BYTES_MAX`]) per batch.
///
/// A batch's buffer comes from `pool` when one is given (and goes back to it when the frame's
/// last `Bytes` is dropped), else from the allocator.
pub fn pack_all<M>(
    pool: Option<&std::sync::Arc<crate::buffer_pool::BufferPool>>,
    msg_max_bytes: u64,
    msgs: &[M],
    parts: impl Fn(&M) -> (Rank, Tag, &Bytes, bool),
    mut emit: impl FnMut(Unit),
) {
    let frame_max = usize::try_from(msg_max_bytes)
        .unwrap_or(usize::MAX)
        .min(BATCH_FRAME_BYTES_MAX);
    let small = |p: &Bytes, packable: bool| packable && p.len() <= BATCH_ITEM_MAX_BYTES;
    let mut rest = msgs;
    while let Some((first, after)) = rest.split_first() {
        let (dst, tag, payload, packable) = parts(first);
        // How many of the next messages join the run `first` opens.
        let (mut n, mut bytes) = (1usize, ITEM_HEADER_LEN + payload.len());
        if small(payload, packable) {
            for m in after {
                let (d, _, p, pk) = parts(m);
                let grown = bytes + ITEM_HEADER_LEN + p.len();
                if d != dst || !small(p, pk) || n >= BATCH_FRAME_ITEMS_MAX || grown > frame_max {
                    break;
                }
                (n, bytes) = (n + 1, grown);
            }
        }
        let (run, next) = rest.split_at(n.min(rest.len()));
        rest = next;
        if n == 1 {
            emit(Unit {
                dst,
                tag,
                payload: payload.clone(),
                messages: 1,
            });
            continue;
        }
        let mut buf = match pool {
            Some(pool) => pool.take(bytes),
            None => Vec::with_capacity(bytes),
        };
        for m in run {
            let (_, t, p, _) = parts(m);
            put_item(&mut buf, t, p);
        }
        let payload = match pool {
            Some(pool) => pool.freeze(buf),
            None => Bytes::from(buf),
        };
        emit(Unit {
            dst,
            tag: TAG_BATCH,
            payload,
            messages: u32::try_from(n).unwrap_or(u32::MAX),
        });
    }
}

fn unit(run: Run<Plain>) -> Unit {
    match run {
        Run::One(Plain { dst, tag, payload }) => Unit {
            dst,
            tag,
            payload,
            messages: 1,
        },
        Run::Batch {
            key,
            payload,
            items,
        } => Unit {
            dst: key,
            tag: TAG_BATCH,
            payload,
            messages: items,
        },
    }
}

fn put_item(buf: &mut impl bytes::BufMut, tag: Tag, payload: &[u8]) {
    // Items are at most `BATCH_ITEM_MAX_BYTES` long: the length always fits. One copy for the
    // item's header (`put_u32` twice was two calls of a general copy, 4 bytes each).
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    let mut head = [0u8; ITEM_HEADER_LEN];
    let (t, l) = head.split_at_mut(4);
    t.copy_from_slice(&tag.to_be_bytes());
    l.copy_from_slice(&len.to_be_bytes());
    buf.put_slice(&head);
    buf.put_slice(payload);
}

/// Why a batch payload is not valid: the batch is dropped whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchError {
    /// No item at all.
    Empty,
    /// An item's header or payload runs past the end, at this offset.
    Truncated(usize),
    /// An item carries a reserved tag, at this offset.
    ReservedTag(usize, Tag),
    /// More items than [`BATCH_FRAME_ITEMS_MAX`].
    TooManyItems,
}

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BatchError::Empty => write!(f, "a batch frame without items"),
            BatchError::Truncated(at) => write!(f, "a batch item at byte {at} runs past the end"),
            BatchError::ReservedTag(at, t) => {
                write!(f, "the batch item at byte {at} has the reserved tag {t}")
            }
            BatchError::TooManyItems => {
                write!(
                    f,
                    "more than {BATCH_FRAME_ITEMS_MAX} items in a batch frame"
                )
            }
        }
    }
}

/// The items of a checked batch payload, in order: `(tag, payload)`, each payload a view of
/// the batch's own allocation (not copied).
#[derive(Debug)]
pub struct Items {
    payload: Bytes,
    at: usize,
    /// The tag every item carries, if they all carry one (found by the check).
    one_tag: Option<Tag>,
    count: u32,
}

impl Items {
    /// Checks the whole of `payload` first: an error means no item may be delivered.
    pub fn new(payload: Bytes) -> Result<Items, BatchError> {
        let (mut at, mut n) = (0usize, 0usize);
        let (mut first, mut mixed) = (None, false);
        while at < payload.len() {
            let (tag, len) = item_header(&payload, at).ok_or(BatchError::Truncated(at))?;
            if tag < TAG_USER_MIN {
                return Err(BatchError::ReservedTag(at, tag));
            }
            mixed |= *first.get_or_insert(tag) != tag;
            let end = (at + ITEM_HEADER_LEN)
                .checked_add(len)
                .filter(|&e| e <= payload.len())
                .ok_or(BatchError::Truncated(at))?;
            n += 1;
            if n > BATCH_FRAME_ITEMS_MAX {
                return Err(BatchError::TooManyItems);
            }
            at = end;
        }
        if n == 0 {
            return Err(BatchError::Empty);
        }
        Ok(Items {
            payload,
            at: 0,
            one_tag: first.filter(|_| !mixed),
            // At most `BATCH_FRAME_ITEMS_MAX`, checked above.
            count: u32::try_from(n).unwrap_or(u32::MAX),
        })
    }

    /// The tag of every item, if all items carry the same one.
    pub fn one_tag(&self) -> Option<Tag> {
        self.one_tag
    }

    /// All the items as one run from `origin` (for a batch whose items all carry
    /// [`Items::one_tag`]).
    pub fn whole_run(&self, origin: Rank, tag: Tag) -> ItemRun {
        self.run(origin, tag, 0, self.payload.len(), self.count)
    }
}

impl Items {
    /// The next item as offsets into the batch: its tag, where its header starts, where its
    /// payload starts and where it ends. Nothing is sliced (no reference count is touched).
    pub fn next_span(&mut self) -> Option<(Tag, usize, usize, usize)> {
        let at = self.at;
        let (tag, start, end) = item_span(&self.payload, at)?;
        self.at = end;
        Some((tag, at, start, end))
    }

    /// The batch's bytes from `start` to `end` (offsets from [`Items::next_span`]).
    pub fn slice(&self, start: usize, end: usize) -> Bytes {
        self.payload.slice(start..end)
    }

    /// A run of the items from the one whose header starts at `at` to the one that ends at
    /// `end`, all with tag `tag`, from `origin` (offsets from [`Items::next_span`]).
    pub fn run(&self, origin: Rank, tag: Tag, at: usize, end: usize, count: u32) -> ItemRun {
        ItemRun {
            origin,
            tag,
            payload: self.payload.clone(),
            at,
            end,
            count,
            lead: 0,
        }
    }
}

impl Iterator for Items {
    type Item = (Tag, Bytes);

    fn next(&mut self) -> Option<(Tag, Bytes)> {
        let (tag, _, start, end) = self.next_span()?;
        Some((tag, self.payload.slice(start..end)))
    }
}

/// Consecutive items of one checked batch frame with one tag, from one origin, that match one
/// persistent receive: the node hands them to its driver as one delivery
/// (`Output::DeliverRun`), which calls the receive's callback once per item. Cheaper than a
/// delivery per item (one output, one callback lookup), and the same messages in the same order.
///
/// The items are a plain batch's (this module's layout), or a reliable batch's
/// (`relm::batch`), whose items carry `lead` bytes (their uids) before the same tag and length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemRun {
    origin: Rank,
    tag: Tag,
    /// The whole batch payload (shared): the items are `at..end` of it.
    payload: Bytes,
    at: usize,
    end: usize,
    count: u32,
    /// Bytes before each item's tag and length.
    lead: usize,
}

impl ItemRun {
    /// All the items of a checked batch whose items have `lead` bytes before their tag and
    /// length (`relm::batch`: the uids), `count` of them, every one with tag `tag`, from
    /// `origin`.
    pub(crate) fn whole(origin: Rank, tag: Tag, payload: Bytes, lead: usize, count: u32) -> Self {
        ItemRun {
            origin,
            tag,
            at: 0,
            end: payload.len(),
            payload,
            count,
            lead,
        }
    }

    /// Extends the run by the next item of its batch, which ends at `end`.
    pub fn extend_to(&mut self, end: usize) {
        self.end = end;
        self.count = self.count.saturating_add(1);
    }

    /// The origin of every message of the run.
    pub fn origin(&self) -> Rank {
        self.origin
    }

    /// The tag of every message of the run.
    pub fn tag(&self) -> Tag {
        self.tag
    }

    /// How many messages the run holds.
    pub fn len(&self) -> u32 {
        self.count
    }

    /// Whether the run holds no message (never, as the node builds runs).
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Lends the run's messages to `f`, in order, without slicing the batch (no reference
    /// count is touched per message).
    pub fn for_each_ref(&self, mut f: impl FnMut(&MessageRef<'_>)) {
        for (start, end) in self.spans() {
            f(&MessageRef::new(
                self.origin,
                self.tag,
                &self.payload,
                start,
                end,
            ));
        }
    }

    /// The run's messages, in order; each payload a view of the batch's allocation.
    pub fn messages(&self) -> impl Iterator<Item = Message> + '_ {
        self.spans().map(|(start, end)| Message {
            origin: self.origin,
            tag: self.tag,
            payload: self.payload.slice(start..end),
        })
    }

    /// Where each of the run's payloads starts and ends in the batch, in order.
    fn spans(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        // The batch was checked whole (`Items::new`): every item in the run is complete; an
        // item that were not would end the run, not panic.
        let run = self.payload.get(..self.end).unwrap_or_default();
        let mut at = self.at;
        let lead = self.lead;
        std::iter::from_fn(move || {
            let (_, start, end) = item_span(run, at.checked_add(lead)?)?;
            at = end;
            Some((start, end))
        })
    }
}

/// How many items `payload` holds, for the sender's count (it built the batch: no check).
pub fn count_items(payload: &[u8]) -> u64 {
    let (mut at, mut n) = (0usize, 0u64);
    while let Some((_, len)) = item_header(payload, at) {
        n += 1;
        at = at.saturating_add(ITEM_HEADER_LEN).saturating_add(len);
    }
    n
}

/// The item whose header starts at `at`: its tag and where its payload starts and ends, if the
/// whole item lies within `payload`.
fn item_span(payload: &[u8], at: usize) -> Option<(Tag, usize, usize)> {
    let (tag, len) = item_header(payload, at)?;
    let start = at.checked_add(ITEM_HEADER_LEN)?;
    let end = start.checked_add(len).filter(|&e| e <= payload.len())?;
    Some((tag, start, end))
}

fn item_header(payload: &[u8], at: usize) -> Option<(Tag, usize)> {
    let raw = payload.get(at..at.checked_add(ITEM_HEADER_LEN)?)?;
    let (t, l) = raw.split_at(4);
    let tag = u32::from_be_bytes(t.try_into().ok()?);
    let len = u32::from_be_bytes(l.try_into().ok()?);
    Some((tag, len as usize))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;

    fn pack(msgs: &[(Rank, Tag, &'static [u8], bool)]) -> Vec<Unit> {
        let mut p = Packer::new();
        let mut out = Vec::new();
        for &(dst, tag, bytes, packable) in msgs {
            p.push(dst, tag, Bytes::from_static(bytes), packable, |u| {
                out.push(u)
            });
        }
        p.finish(|u| out.push(u));
        out
    }

    proptest::proptest! {
        /// `pack_all` and the streaming `Packer` make the same units of any sequence.
        #[test]
        fn packing_a_whole_sequence_makes_the_packers_units(
            // Stretches of one destination, some longer than a batch's item bound.
            stretches in proptest::collection::vec(
                (
                    0u32..3,
                    1usize..1300,
                    0usize..(BATCH_ITEM_MAX_BYTES + 40),
                    proptest::bool::weighted(0.9),
                ),
                0..8,
            ),
            frame_max in proptest::sample::select(vec![64u64, 300, 4096, 1 << 20]),
        ) {
            let msgs: Vec<(Rank, Tag, Bytes, bool)> = stretches
                .into_iter()
                .flat_map(|(dst, n, len, packable)| {
                    (0..n).map(move |i| {
                        // Every seventh message of a stretch is large or unpackable.
                        let odd = i % 7 == 6;
                        let len = if odd { len + BATCH_ITEM_MAX_BYTES / 2 } else { len % 20 };
                        let tag = TAG_USER_MIN + (i % 3) as Tag;
                        (dst, tag, Bytes::from(vec![i as u8; len]), packable || !odd)
                    })
                })
                .collect();
            let mut streamed = Vec::new();
            let mut p = Packer::with_frame_max(frame_max);
            for (dst, tag, payload, packable) in &msgs {
                p.push(*dst, *tag, payload.clone(), *packable, |u| streamed.push(u));
            }
            p.finish(|u| streamed.push(u));
            let mut whole = Vec::new();
            pack_all(None, frame_max, &msgs, |m| (m.0, m.1, &m.2, m.3), |u| whole.push(u));
            proptest::prop_assert_eq!(whole, streamed);
        }
    }

    #[test]
    fn a_batch_packed_from_a_pool_gives_its_buffer_back_when_its_frame_is_dropped() {
        use crate::buffer_pool::BufferPool;
        let pool = std::sync::Arc::new(BufferPool::new(4, 1 << 20));
        let msgs: Vec<(Rank, Tag, Bytes)> = (0..10)
            .map(|i| (1 + i / 5, TAG_USER_MIN, Bytes::from(vec![i as u8; 64])))
            .collect();
        let pack = |out: &mut Vec<Unit>| {
            pack_all(
                Some(&pool),
                1 << 20,
                &msgs,
                |m| (m.0, m.1, &m.2, true),
                |u| out.push(u),
            )
        };
        let mut units = Vec::new();
        pack(&mut units);
        assert_eq!(units.len(), 2);
        assert_eq!(units[0].messages, 5);
        assert_eq!(Items::new(units[1].payload.clone()).unwrap().count(), 5);
        let first = units[0].payload.as_ptr();
        assert_eq!(pool.idle(), 0);
        drop(units);
        assert_eq!(pool.idle(), 2);
        let mut again = Vec::new();
        pack(&mut again);
        assert_eq!(pool.idle(), 0);
        assert!(
            again.iter().any(|u| u.payload.as_ptr() == first),
            "a pooled buffer is used again"
        );
    }

    fn unpack(u: &Unit) -> Vec<(Tag, Bytes)> {
        Items::new(u.payload.clone()).unwrap().collect()
    }

    #[test]
    fn runs_to_one_destination_become_one_batch_and_order_is_kept() {
        let units = pack(&[
            (2, 100, b"a", true),
            (2, 101, b"bb", true),
            (2, 102, b"", true),
            (3, 100, b"c", true),
            (2, 103, b"d", true),
        ]);
        assert_eq!(units.len(), 3);
        assert_eq!(
            (units[0].dst, units[0].tag, units[0].messages),
            (2, TAG_BATCH, 3)
        );
        assert_eq!(
            unpack(&units[0]),
            vec![
                (100, Bytes::from_static(b"a")),
                (101, Bytes::from_static(b"bb")),
                (102, Bytes::new())
            ]
        );
        // A run of one goes as itself, without the batch's framing.
        assert_eq!(
            units[1],
            Unit {
                dst: 3,
                tag: 100,
                payload: Bytes::from_static(b"c"),
                messages: 1
            }
        );
        assert_eq!((units[2].tag, units[2].messages), (103, 1));
    }

    #[test]
    fn large_and_unpackable_messages_keep_their_own_frame_between_runs() {
        static BIG: [u8; BATCH_ITEM_MAX_BYTES + 1] = [7; BATCH_ITEM_MAX_BYTES + 1];
        let units = pack(&[
            (2, 100, b"a", true),
            (2, 101, b"b", true),
            (2, 102, &BIG, true),
            (2, 103, b"c", false),
            (2, 104, b"d", true),
            (2, 105, b"e", true),
        ]);
        let shape: Vec<(Tag, u32)> = units.iter().map(|u| (u.tag, u.messages)).collect();
        assert_eq!(
            shape,
            vec![(TAG_BATCH, 2), (102, 1), (103, 1), (TAG_BATCH, 2)]
        );
        assert_eq!(units[1].payload.len(), BATCH_ITEM_MAX_BYTES + 1);
    }

    #[test]
    fn a_batch_is_bounded_in_items_and_bytes() {
        let mut p = Packer::new();
        let mut out = Vec::new();
        let n = 3 * BATCH_FRAME_ITEMS_MAX + 5;
        for i in 0..n {
            let payload = Bytes::from(vec![(i % 251) as u8; 16]);
            p.push(9, 100 + (i % 7) as Tag, payload, true, |u| out.push(u));
        }
        p.finish(|u| out.push(u));
        let total: u32 = out.iter().map(|u| u.messages).sum();
        assert_eq!(total as usize, n);
        let mut i = 0usize;
        for u in &out {
            assert!(u.payload.len() <= BATCH_FRAME_BYTES_MAX);
            assert!(u.messages as usize <= BATCH_FRAME_ITEMS_MAX);
            let items: Vec<(Tag, Bytes)> = if u.tag == TAG_BATCH {
                unpack(u)
            } else {
                vec![(u.tag, u.payload.clone())]
            };
            assert_eq!(items.len(), u.messages as usize);
            for (tag, payload) in items {
                assert_eq!(tag, 100 + (i % 7) as Tag);
                assert_eq!(payload, Bytes::from(vec![(i % 251) as u8; 16]));
                i += 1;
            }
        }
        // Big messages fill a frame by bytes before the item count.
        let mut p = Packer::new();
        let mut out = Vec::new();
        let big = Bytes::from(vec![1u8; BATCH_ITEM_MAX_BYTES]);
        for _ in 0..1000 {
            p.push(4, 100, big.clone(), true, |u| out.push(u));
        }
        p.finish(|u| out.push(u));
        assert!(out.iter().all(|u| u.payload.len() <= BATCH_FRAME_BYTES_MAX));
        assert_eq!(out.iter().map(|u| u.messages).sum::<u32>(), 1000);
    }

    #[test]
    fn a_batch_stays_within_the_daemons_message_maximum() {
        let mut p = Packer::with_frame_max(200);
        let mut out = Vec::new();
        for _ in 0..10 {
            p.push(4, 100, Bytes::from(vec![3u8; 64]), true, |u| out.push(u));
        }
        p.finish(|u| out.push(u));
        assert!(out.iter().all(|u| u.payload.len() <= 200), "{out:?}");
        assert_eq!(out.iter().map(|u| u.messages).sum::<u32>(), 10);
        assert!(out.iter().any(|u| u.tag == TAG_BATCH));
        // Too small for two items: every message goes as itself.
        let mut p = Packer::with_frame_max(100);
        let mut out = Vec::new();
        for _ in 0..3 {
            p.push(4, 100, Bytes::from(vec![3u8; 64]), true, |u| out.push(u));
        }
        p.finish(|u| out.push(u));
        assert!(out.iter().all(|u| u.tag == 100 && u.messages == 1));
    }

    #[test]
    fn malformed_batches_are_refused_whole() {
        let mut b = BytesMut::new();
        put_item(&mut b, 100, b"ok");
        let good = b.clone().freeze();
        assert_eq!(Items::new(good).unwrap().count(), 1);
        assert_eq!(Items::new(Bytes::new()).unwrap_err(), BatchError::Empty);
        // A length past the end, a short item header, a reserved tag: refused, whatever came
        // before.
        let mut t = b.clone();
        t.put_u32(100);
        t.put_u32(5);
        t.put_slice(b"abc");
        assert_eq!(
            Items::new(t.freeze()).unwrap_err(),
            BatchError::Truncated(10)
        );
        let mut s = b.clone();
        s.put_u16(1);
        assert_eq!(
            Items::new(s.freeze()).unwrap_err(),
            BatchError::Truncated(10)
        );
        let mut r = b.clone();
        put_item(&mut r, TAG_BATCH, b"x");
        assert_eq!(
            Items::new(r.freeze()).unwrap_err(),
            BatchError::ReservedTag(10, TAG_BATCH)
        );
        let mut huge = BytesMut::new();
        huge.put_u32(100);
        huge.put_u32(u32::MAX);
        assert_eq!(
            Items::new(huge.freeze()).unwrap_err(),
            BatchError::Truncated(0)
        );
        let mut many = BytesMut::new();
        for _ in 0..=BATCH_FRAME_ITEMS_MAX {
            put_item(&mut many, 100, b"");
        }
        assert_eq!(
            Items::new(many.freeze()).unwrap_err(),
            BatchError::TooManyItems
        );
    }
}
