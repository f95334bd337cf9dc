//! The collectives' control messages and their byte layouts. Sans-IO: encoders return bytes,
//! decoders take one received frame and return a message or a [`WireError`], never a panic.
//!
//! Every message starts with a one-byte kind; integers are big-endian; a rank is a `u32` below
//! the DVM size; a frame must end exactly where its message does.
//!
//! | kind | message | layout after the kind byte |
//! |---|---|---|
//! | 1 | xcast `Request` | `u32 originator`, `u64 request`, `u32 tag`, `u32 len`, `len` payload bytes |
//! | 2 | xcast `Op` | `u64 op`, `u32 originator`, `u64 request`, `u32 tag`, `u32 len`, `len` payload bytes |
//! | 3 | xcast `Ack` | `u64 upto`, `u64 digest` |
//! | 4 | xcast `Sync` | `u64 digest` |
//! | 5 | xcast `Resume` | `u64 from`, `u64 digest` |
//! | 6 | xcast `Done` | `u64 request`, `u64 op` |
//! | 7 | xcast `Refused` | `u64 request` |
//! | 8 | xcast `Op`, one part of a split payload | `u64 op`, `u32 originator`, `u64 request`, `u32 tag`, `u32 part`, `u32 parts`, `u32 len`, `len` payload bytes |
//! | 16 | allgather `Contribution` | `u64 id`, `u64 digest`, `u8 flags`, entries, excluded, excused |
//! | 17 | allgather `Sync` | `u64 digest` |
//! | 18 | allgather result | `u64 id`, `u8 flags`, entries, excluded |
//! | 19 | allgather `Excuse` | `u64 id`, excused |
//! | 20 | allgather `Outcome` | `u64 id`, `u8 known`, then (if `known` is 1) a kind-18 result of the same id |
//! | 32-34 | group collectives | see `wire/group.rs` |
//!
//! - entries: `u32 count`, then `count` x (`u32 rank`, `u32 len`, `len` bytes), ranks strictly
//!   ascending;
//! - excluded: `u32 count`, then `count` x `u32 rank`, strictly ascending, none of them among
//!   the entries;
//! - excused: `u32 count`, then `count` x `u32 rank`, strictly ascending (ranks a collective
//!   does not wait for in a later life: see `super::allgather`, "Rejoins");
//! - flags: bit 0 = overflowed (then every entry's length is 0: the entries name who entered,
//!   without their bytes; a result has none); in a `Contribution`, bit 1 = the
//!   sender returned (rejoined or joined); the other bits must be zero.
//!
//! A broadcast payload split into parts (`limits::XCAST_PART_BYTES_DEFAULT`) travels as
//! `parts` consecutive operations of kind 8, `part` counting from 0; `parts` is 2 to
//! `limits::XCAST_PARTS_MAX` and `part` below it. An unsplit payload is kind 2 (part 0 of 1).
//!
//! Operation ids and request ids start at 1; 0 is refused. `Request` and `Op` are written as a
//! header plus the caller's payload ([`XcastMsg::encode_parts`]), so the driver can send the
//! shared payload without copying it; the decoder hands the payload back as a slice of the
//! received frame. Digests: see [`super`] ("The view digest").
use crate::rml::Tag;
use crate::{Rank, limits};
use bytes::{BufMut, Bytes, BytesMut};

const KIND_REQUEST: u8 = 1;
const KIND_OP: u8 = 2;
const KIND_ACK: u8 = 3;
const KIND_SYNC: u8 = 4;
const KIND_RESUME: u8 = 5;
const KIND_DONE: u8 = 6;
const KIND_REFUSED: u8 = 7;
const KIND_OP_PART: u8 = 8;
const KIND_CONTRIBUTION: u8 = 16;
const KIND_AG_SYNC: u8 = 17;
const KIND_RESULT: u8 = 18;
const KIND_EXCUSE: u8 = 19;
const KIND_OUTCOME: u8 = 20;

const FLAG_OVERFLOWED: u8 = 1;
/// A contribution's sender returned (rejoined or joined).
const FLAG_RETURNED: u8 = 2;

/// Bytes an `Op` adds in front of its payload (kind, op, originator, request, tag, length): a
/// broadcast payload can be at most this much below the frame maximum. (A part, kind 8, adds
/// 8 bytes more, but a part is at most half its payload.)
pub const OP_HEADER_LEN: usize = 29;

/// Why received bytes were refused. The driver logs it and drops the frame (or closes the
/// connection, as for any malformed frame).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// The frame ended early.
    Truncated,
    /// Bytes were left over after the message.
    Trailing(usize),
    /// The kind byte names no message this decoder knows.
    UnknownKind(u8),
    /// A rank, or a count of ranks, not below the DVM size.
    BadRank { rank: u32, size: u32 },
    /// A field outside its range (an id of 0, ranks out of order, unknown flags, ...).
    Invalid(&'static str),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Truncated => write!(f, "truncated collective message"),
            WireError::Trailing(n) => write!(f, "{n} stray bytes after a collective message"),
            WireError::UnknownKind(k) => write!(f, "unknown collective message kind {k}"),
            WireError::BadRank { rank, size } => {
                write!(f, "collective message names rank {rank} in a DVM of {size}")
            }
            WireError::Invalid(what) => write!(f, "invalid collective message: {what}"),
        }
    }
}

impl std::error::Error for WireError {}

/// A broadcast request: a daemon asks rank 0 to broadcast `payload`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The daemon that called `originate` (must be the frame's sender).
    pub originator: Rank,
    /// The originator's own id for the request (from 1, increasing).
    pub request: u64,
    pub tag: Tag,
    pub payload: Bytes,
}

/// One broadcast operation as it travels down the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// Rank 0's operation id: from 1, one more per operation. Every daemon delivers in this
    /// order.
    pub id: u64,
    pub originator: Rank,
    /// The originator's request id.
    pub request: u64,
    pub tag: Tag,
    /// Which part of the broadcast's payload this is, from 0 (0 of 1: the whole payload). The
    /// parts of one broadcast are consecutive operations: `id - part` is its first.
    pub part: u32,
    /// How many parts the payload was split into (1: not split).
    pub parts: u32,
    /// This part's bytes.
    pub payload: Bytes,
}

impl Op {
    /// A whole (unsplit) broadcast payload as operation `id`.
    pub fn whole(id: u64, originator: Rank, request: u64, tag: Tag, payload: Bytes) -> Op {
        Op {
            id,
            originator,
            request,
            tag,
            part: 0,
            parts: 1,
            payload,
        }
    }

    /// Whether this is the last (or only) part of its broadcast.
    pub fn is_last(&self) -> bool {
        self.part.saturating_add(1) >= self.parts
    }
}

/// The broadcast's messages. Which daemon sends which to whom: see [`super::xcast`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XcastMsg {
    /// Originator to rank 0 (carried reliably by the driver).
    Request(Request),
    /// Parent to child.
    Op(Op),
    /// Child to parent: this daemon and its whole subtree (under the view `digest`) delivered
    /// every operation up to `upto`.
    Ack { upto: u64, digest: u64 },
    /// Parent to a new (or not yet synchronised) child: "tell me where you are", sent under
    /// the parent's view `digest` and answered only under the same view.
    Sync { digest: u64 },
    /// Child to parent: "send me every operation from `from` on" (the answer to `Sync`, and
    /// how a daemon fetches what it or a child lacks), under the child's view `digest`.
    Resume { from: u64, digest: u64 },
    /// Rank 0 to the originator: `request` became operation `op`, which the whole living tree
    /// has delivered.
    Done { request: u64, op: u64 },
    /// Rank 0 to the originator: `request` was refused (rank 0 busy, or payload too large).
    Refused { request: u64 },
}

/// One daemon's combined contribution for its subtree, sent to its parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contribution {
    /// The caller's collective id.
    pub id: u64,
    /// The sender's view digest: the contribution covers its subtree under that view.
    pub digest: u64,
    /// The collective overflowed `ALLGATHER_MAX_BYTES` below the sender (the entries then
    /// carry no bytes: they name who entered).
    pub overflowed: bool,
    /// (rank, bytes), ranks strictly ascending.
    pub entries: Vec<(Rank, Bytes)>,
    /// Failed ranks the sender knows that have no entry, strictly ascending.
    pub excluded: Vec<Rank>,
    /// Ranks the collective does not wait for in a later life (they died or returned while it
    /// was in flight), strictly ascending.
    pub excused: Vec<Rank>,
    /// The sender returned (rejoined or joined): it may have missed the result's broadcast, so
    /// a receiver that finished the collective answers it with the result.
    pub returned: bool,
}

/// The allgather's messages (the result travels by xcast, see [`AllgatherResult`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllgatherMsg {
    /// Child to parent.
    Contribution(Contribution),
    /// Parent to child: "re-send your finished contributions under view `digest`".
    Sync { digest: u64 },
    /// Parent to child: collective `id` does not wait for these ranks' own contributions (they
    /// returned while it was in flight); passed down towards them.
    Excuse { id: u64, ranks: Vec<Rank> },
    /// Parent to child: the answer to a contribution for a collective the parent has finished:
    /// its result, or `None` when the parent no longer has it.
    Outcome {
        id: u64,
        result: Option<AllgatherResult>,
    },
}

/// The outcome of one allgather, built by rank 0 and broadcast with xcast.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AllgatherResult {
    pub id: u64,
    /// The gathered bytes exceeded `ALLGATHER_MAX_BYTES` somewhere: no contributions.
    pub overflowed: bool,
    /// (rank, bytes) of every contributing rank, ascending.
    pub contributions: Vec<(Rank, Bytes)>,
    /// Ranks that failed before their contribution reached the tree, ascending (an overflowed
    /// result names them too). Unless the collective overflowed, contributing and excluded
    /// ranks together are `0..size`.
    pub excluded: Vec<Rank>,
}

impl AllgatherResult {
    /// The contributing ranks, ascending.
    pub fn ranks(&self) -> impl Iterator<Item = Rank> + '_ {
        self.contributions.iter().map(|(r, _)| *r)
    }

    /// The bytes of `rank`, if it contributed.
    pub fn get(&self, rank: Rank) -> Option<&Bytes> {
        self.contributions
            .binary_search_by_key(&rank, |(r, _)| *r)
            .ok()
            .and_then(|i| self.contributions.get(i))
            .map(|(_, b)| b)
    }

    /// The xcast payload carrying this result (kind 18). The protocol's, not API.
    #[doc(hidden)]
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(18 + entries_len(&self.contributions, &self.excluded));
        b.put_u8(KIND_RESULT);
        b.put_u64(self.id);
        b.put_u8(if self.overflowed { FLAG_OVERFLOWED } else { 0 });
        put_entries(&mut b, &self.contributions, &self.excluded);
        b.freeze()
    }

    /// Decodes a result for a DVM of `size` ranks; contribution bytes are slices of `frame`.
    /// The protocol's, not API.
    #[doc(hidden)]
    pub fn decode(size: u32, frame: Bytes) -> Result<Self, WireError> {
        let mut r = Reader::new(frame);
        if r.u8()? != KIND_RESULT {
            return Err(WireError::Invalid("not an allgather result"));
        }
        let id = r.u64()?;
        let overflowed = r.flags()?;
        let (contributions, excluded) = r.entries(size, overflowed)?;
        r.finish()?;
        Ok(AllgatherResult {
            id,
            overflowed,
            contributions,
            excluded,
        })
    }
}

/// Wire bytes of an entries list and an excluded list.
pub(crate) fn entries_len(entries: &[(Rank, Bytes)], excluded: &[Rank]) -> usize {
    let data: usize = entries.iter().map(|(_, b)| b.len()).sum();
    8 + data + 8 * entries.len() + 4 * excluded.len()
}

pub(crate) fn put_entries(b: &mut BytesMut, entries: &[(Rank, Bytes)], excluded: &[Rank]) {
    // Counts above u32 cannot occur: the lists hold distinct ranks.
    b.put_u32(u32::try_from(entries.len()).unwrap_or(u32::MAX));
    for (rank, bytes) in entries {
        b.put_u32(*rank);
        b.put_u32(u32::try_from(bytes.len()).unwrap_or(u32::MAX));
        b.put_slice(bytes);
    }
    b.put_u32(u32::try_from(excluded.len()).unwrap_or(u32::MAX));
    for rank in excluded {
        b.put_u32(*rank);
    }
}

/// A list of distinct ranks: `u32 count`, then the ranks.
fn put_ranks(b: &mut BytesMut, ranks: &[Rank]) {
    b.put_u32(u32::try_from(ranks.len()).unwrap_or(u32::MAX));
    for rank in ranks {
        b.put_u32(*rank);
    }
}

fn payload_len(payload: &Bytes) -> u32 {
    // Payloads are bounded by XCAST_INFLIGHT_MAX_BYTES, far below u32::MAX.
    u32::try_from(payload.len()).unwrap_or(u32::MAX)
}

impl XcastMsg {
    /// The message as a header plus, for `Request` and `Op`, the payload to send after it
    /// unchanged (a clone of the shared `Bytes`, no copy).
    pub fn encode_parts(&self) -> (Bytes, Option<Bytes>) {
        let mut b = BytesMut::with_capacity(OP_HEADER_LEN + 8);
        let payload = match self {
            XcastMsg::Request(q) => {
                b.put_u8(KIND_REQUEST);
                b.put_u32(q.originator);
                b.put_u64(q.request);
                b.put_u32(q.tag);
                b.put_u32(payload_len(&q.payload));
                Some(q.payload.clone())
            }
            XcastMsg::Op(op) => {
                b.put_u8(if op.parts > 1 { KIND_OP_PART } else { KIND_OP });
                b.put_u64(op.id);
                b.put_u32(op.originator);
                b.put_u64(op.request);
                b.put_u32(op.tag);
                if op.parts > 1 {
                    b.put_u32(op.part);
                    b.put_u32(op.parts);
                }
                b.put_u32(payload_len(&op.payload));
                Some(op.payload.clone())
            }
            XcastMsg::Ack { upto, digest } => {
                b.put_u8(KIND_ACK);
                b.put_u64(*upto);
                b.put_u64(*digest);
                None
            }
            XcastMsg::Sync { digest } => {
                b.put_u8(KIND_SYNC);
                b.put_u64(*digest);
                None
            }
            XcastMsg::Resume { from, digest } => {
                b.put_u8(KIND_RESUME);
                b.put_u64(*from);
                b.put_u64(*digest);
                None
            }
            XcastMsg::Done { request, op } => {
                b.put_u8(KIND_DONE);
                b.put_u64(*request);
                b.put_u64(*op);
                None
            }
            XcastMsg::Refused { request } => {
                b.put_u8(KIND_REFUSED);
                b.put_u64(*request);
                None
            }
        };
        (b.freeze(), payload)
    }

    /// The whole message in one buffer (copies the payload; for tests and small messages).
    pub fn encode(&self) -> Bytes {
        match self.encode_parts() {
            (head, None) => head,
            (head, Some(payload)) => {
                let mut b = BytesMut::with_capacity(head.len() + payload.len());
                b.put_slice(&head);
                b.put_slice(&payload);
                b.freeze()
            }
        }
    }

    /// Decodes one frame for a DVM of `size` ranks. A payload is a slice of `frame`.
    pub fn decode(size: u32, frame: Bytes) -> Result<Self, WireError> {
        let mut r = Reader::new(frame);
        let msg = match r.u8()? {
            KIND_REQUEST => {
                let originator = r.rank(size)?;
                let request = r.id()?;
                let tag = r.u32()?;
                let payload = r.payload()?;
                XcastMsg::Request(Request {
                    originator,
                    request,
                    tag,
                    payload,
                })
            }
            KIND_OP => {
                let id = r.id()?;
                let originator = r.rank(size)?;
                let request = r.id()?;
                let tag = r.u32()?;
                let payload = r.payload()?;
                XcastMsg::Op(Op::whole(id, originator, request, tag, payload))
            }
            KIND_OP_PART => {
                let id = r.id()?;
                let originator = r.rank(size)?;
                let request = r.id()?;
                let tag = r.u32()?;
                let part = r.u32()?;
                let parts = r.u32()?;
                if !(2..=limits::XCAST_PARTS_MAX as u64).contains(&u64::from(parts)) {
                    return Err(WireError::Invalid("parts not 2 to XCAST_PARTS_MAX"));
                }
                if part >= parts {
                    return Err(WireError::Invalid("part not below parts"));
                }
                if u64::from(part) >= id {
                    return Err(WireError::Invalid("part before operation 1"));
                }
                let payload = r.payload()?;
                XcastMsg::Op(Op {
                    id,
                    originator,
                    request,
                    tag,
                    part,
                    parts,
                    payload,
                })
            }
            KIND_ACK => XcastMsg::Ack {
                upto: r.u64()?,
                digest: r.u64()?,
            },
            KIND_SYNC => XcastMsg::Sync { digest: r.u64()? },
            KIND_RESUME => XcastMsg::Resume {
                from: r.id()?,
                digest: r.u64()?,
            },
            KIND_DONE => XcastMsg::Done {
                request: r.id()?,
                op: r.id()?,
            },
            KIND_REFUSED => XcastMsg::Refused { request: r.id()? },
            other => return Err(WireError::UnknownKind(other)),
        };
        r.finish()?;
        Ok(msg)
    }
}

impl AllgatherMsg {
    /// The message in one buffer.
    pub fn encode(&self) -> Bytes {
        match self {
            AllgatherMsg::Contribution(c) => {
                let mut b = BytesMut::with_capacity(
                    22 + entries_len(&c.entries, &c.excluded) + 4 * c.excused.len(),
                );
                b.put_u8(KIND_CONTRIBUTION);
                b.put_u64(c.id);
                b.put_u64(c.digest);
                b.put_u8(
                    if c.overflowed { FLAG_OVERFLOWED } else { 0 }
                        | if c.returned { FLAG_RETURNED } else { 0 },
                );
                put_entries(&mut b, &c.entries, &c.excluded);
                put_ranks(&mut b, &c.excused);
                b.freeze()
            }
            AllgatherMsg::Excuse { id, ranks } => {
                let mut b = BytesMut::with_capacity(13 + 4 * ranks.len());
                b.put_u8(KIND_EXCUSE);
                b.put_u64(*id);
                put_ranks(&mut b, ranks);
                b.freeze()
            }
            AllgatherMsg::Outcome { id, result } => {
                let body = result.as_ref().map(AllgatherResult::encode);
                let mut b = BytesMut::with_capacity(10 + body.as_ref().map_or(0, Bytes::len));
                b.put_u8(KIND_OUTCOME);
                b.put_u64(*id);
                b.put_u8(u8::from(body.is_some()));
                if let Some(body) = body {
                    b.put_slice(&body);
                }
                b.freeze()
            }
            AllgatherMsg::Sync { digest } => {
                let mut b = BytesMut::with_capacity(9);
                b.put_u8(KIND_AG_SYNC);
                b.put_u64(*digest);
                b.freeze()
            }
        }
    }

    /// Decodes one frame for a DVM of `size` ranks; contribution bytes are slices of `frame`.
    pub fn decode(size: u32, frame: Bytes) -> Result<Self, WireError> {
        let mut r = Reader::new(frame);
        let msg = match r.u8()? {
            KIND_CONTRIBUTION => {
                let id = r.u64()?;
                let digest = r.u64()?;
                let flags = r.u8()?;
                if flags & !(FLAG_OVERFLOWED | FLAG_RETURNED) != 0 {
                    return Err(WireError::Invalid("unknown flags"));
                }
                let overflowed = flags & FLAG_OVERFLOWED != 0;
                let returned = flags & FLAG_RETURNED != 0;
                let (entries, excluded) = r.entries(size, overflowed)?;
                let excused = r.ranks(size)?;
                AllgatherMsg::Contribution(Contribution {
                    id,
                    digest,
                    overflowed,
                    entries,
                    excluded,
                    excused,
                    returned,
                })
            }
            KIND_AG_SYNC => AllgatherMsg::Sync { digest: r.u64()? },
            KIND_EXCUSE => AllgatherMsg::Excuse {
                id: r.u64()?,
                ranks: r.ranks(size)?,
            },
            KIND_OUTCOME => {
                let id = r.u64()?;
                let result = match r.u8()? {
                    0 => None,
                    1 => {
                        let rest = r.bytes(r.remaining())?;
                        let result = AllgatherResult::decode(size, rest)?;
                        if result.id != id {
                            return Err(WireError::Invalid("outcome of another collective"));
                        }
                        Some(result)
                    }
                    _ => return Err(WireError::Invalid("unknown outcome flag")),
                };
                AllgatherMsg::Outcome { id, result }
            }
            other => return Err(WireError::UnknownKind(other)),
        };
        r.finish()?;
        Ok(msg)
    }
}

/// Decoded entries and excluded ranks.
type EntriesAndExcluded = (Vec<(Rank, Bytes)>, Vec<Rank>);

/// A cursor over one received frame. Every read checks the remaining length first.
struct Reader {
    buf: Bytes,
    pos: usize,
}

impl Reader {
    fn new(buf: Bytes) -> Self {
        Reader { buf, pos: 0 }
    }

    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn take<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let end = self.pos.checked_add(N).ok_or(WireError::Truncated)?;
        let chunk = self
            .buf
            .get(self.pos..end)
            .and_then(|s| <[u8; N]>::try_from(s).ok())
            .ok_or(WireError::Truncated)?;
        self.pos = end;
        Ok(chunk)
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(u8::from_be_bytes(self.take::<1>()?))
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(self.take::<4>()?))
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_be_bytes(self.take::<8>()?))
    }

    /// An operation or request id: never 0.
    fn id(&mut self) -> Result<u64, WireError> {
        match self.u64()? {
            0 => Err(WireError::Invalid("id 0")),
            id => Ok(id),
        }
    }

    fn rank(&mut self, size: u32) -> Result<Rank, WireError> {
        let rank = self.u32()?;
        if rank >= size {
            return Err(WireError::BadRank { rank, size });
        }
        Ok(rank)
    }

    fn flags(&mut self) -> Result<bool, WireError> {
        match self.u8()? {
            0 => Ok(false),
            FLAG_OVERFLOWED => Ok(true),
            _ => Err(WireError::Invalid("unknown flags")),
        }
    }

    /// `len` bytes as a slice of the frame (no copy).
    fn bytes(&mut self, len: usize) -> Result<Bytes, WireError> {
        if len > self.remaining() {
            return Err(WireError::Truncated);
        }
        let end = self.pos.checked_add(len).ok_or(WireError::Truncated)?;
        let out = self.buf.slice(self.pos..end);
        self.pos = end;
        Ok(out)
    }

    /// `u32 len` then `len` bytes, which must be the rest of the frame.
    fn payload(&mut self) -> Result<Bytes, WireError> {
        let len = self.u32()? as usize;
        if len > limits::XCAST_INFLIGHT_MAX_BYTES {
            return Err(WireError::Invalid("payload above XCAST_INFLIGHT_MAX_BYTES"));
        }
        self.bytes(len)
    }

    /// A count of ranks: at most `size`, and at most what `min_bytes` per item leaves room for
    /// (checked before allocating).
    fn count(&mut self, size: u32, min_bytes: usize) -> Result<usize, WireError> {
        let count = self.u32()?;
        if count > size {
            return Err(WireError::BadRank { rank: count, size });
        }
        let count = count as usize;
        if count.saturating_mul(min_bytes) > self.remaining() {
            return Err(WireError::Truncated);
        }
        Ok(count)
    }

    /// Strictly ascending ranks, each below `size`.
    fn ascending(&mut self, size: u32, last: &mut Option<Rank>) -> Result<Rank, WireError> {
        let rank = self.rank(size)?;
        if last.is_some_and(|l| rank <= l) {
            return Err(WireError::Invalid("ranks not strictly ascending"));
        }
        *last = Some(rank);
        Ok(rank)
    }

    /// A list of ranks, strictly ascending, each below `size`.
    fn ranks(&mut self, size: u32) -> Result<Vec<Rank>, WireError> {
        let n = self.count(size, 4)?;
        let mut ranks = Vec::with_capacity(n);
        let mut last = None;
        for _ in 0..n {
            ranks.push(self.ascending(size, &mut last)?);
        }
        Ok(ranks)
    }

    /// An entries list then an excluded list (see the module header). An overflowed message's
    /// entries carry no bytes; no rank is in both lists.
    fn entries(&mut self, size: u32, overflowed: bool) -> Result<EntriesAndExcluded, WireError> {
        let n = self.count(size, 8)?;
        let mut entries = Vec::with_capacity(n);
        let mut last = None;
        for _ in 0..n {
            let rank = self.ascending(size, &mut last)?;
            let len = self.u32()? as usize;
            if overflowed && len > 0 {
                return Err(WireError::Invalid(
                    "bytes in an overflowed message's entries",
                ));
            }
            entries.push((rank, self.bytes(len)?));
        }
        let m = self.count(size, 4)?;
        let mut excluded = Vec::with_capacity(m);
        let mut last = None;
        for _ in 0..m {
            let rank = self.ascending(size, &mut last)?;
            if entries.binary_search_by_key(&rank, |(r, _)| *r).is_ok() {
                return Err(WireError::Invalid("rank both contributing and excluded"));
            }
            excluded.push(rank);
        }
        Ok((entries, excluded))
    }

    /// What is left of the frame.
    fn rest(&self) -> &[u8] {
        self.buf.get(self.pos..).unwrap_or(&[])
    }

    /// Steps over `n` bytes.
    fn skip(&mut self, n: usize) -> Result<(), WireError> {
        if n > self.remaining() {
            return Err(WireError::Truncated);
        }
        self.pos += n;
        Ok(())
    }

    fn finish(&self) -> Result<(), WireError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(WireError::Trailing(n)),
        }
    }
}

mod group;
pub use group::{GROUP_KIND_MIN, GroupData, GroupMsg};

#[cfg(test)]
mod tests;
