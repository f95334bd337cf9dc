//! The group collectives' messages (kinds 32-34) and their byte layouts.
//!
//! | kind | message | layout after the kind byte |
//! |---|---|---|
//! | 32 | group `Contribution` | op, `u64 digest`, `u8 flags`, entries, excluded, excused |
//! | 33 | group `Result` | op, `u8 flags`, entries, excluded |
//! | 34 | group `Sync` | `u64 digest` |
//! | 35 | group `Have` | op |
//! | 36 | group `Excuse` | op, excused |
//!
//! - op: `u64 context`, `u32 runs`, `runs` x (`u32 first`, `u32 count`), `u64 seq`. The runs
//!   are the member set in canonical form: ascending, `count >= 1`, below the DVM size, and no
//!   two runs touch (`first` is above the previous run's end), so one member set has exactly
//!   one encoding;
//! - entries, excluded and excused as for the allgather (see [`super`]); every rank among them
//!   must be a member;
//! - flags: bit 0 = overflowed (no entries), bit 1 (results only) = lost: the result was
//!   forgotten before this late contribution reached a daemon that had it (no entries, no
//!   excluded); the other bits must be zero.
use super::{Reader, WireError, entries_len, put_entries, put_ranks};
use crate::Rank;
use crate::grpcomm::members::{GroupId, GroupOp};
use bytes::{BufMut, Bytes, BytesMut};

const KIND_CONTRIBUTION: u8 = 32;
const KIND_RESULT: u8 = 33;
const KIND_SYNC: u8 = 34;
const KIND_HAVE: u8 = 35;
const KIND_EXCUSE: u8 = 36;

/// The first kind byte of a group message (the node dispatches on it).
pub const GROUP_KIND_MIN: u8 = KIND_CONTRIBUTION;

const FLAG_OVERFLOWED: u8 = 1;
const FLAG_LOST: u8 = 2;

/// The gathered data of a group collective, as contributions and results carry it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GroupData {
    /// The data exceeded `ALLGATHER_MAX_BYTES` somewhere: no entries.
    pub overflowed: bool,
    /// (rank, bytes), ranks strictly ascending, all members.
    pub entries: Vec<(Rank, Bytes)>,
    /// Failed members without an entry, strictly ascending.
    pub excluded: Vec<Rank>,
    /// Contributions only (empty in results): members this collective does not wait for in a
    /// later life (they returned while it was in flight), strictly ascending.
    pub excused: Vec<Rank>,
}

/// A group collective's messages, all between tree neighbours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupMsg {
    /// Child to parent: the members of the sender's subtree, under view `digest`.
    Contribution {
        op: GroupOp,
        digest: u64,
        data: GroupData,
    },
    /// Parent to child: the outcome (`lost`: forgotten, see the module documentation).
    Result {
        op: GroupOp,
        lost: bool,
        data: GroupData,
    },
    /// Parent to child: "re-send every group contribution you have not finished" (sent under
    /// the parent's view `digest`; answered under any).
    Sync { digest: u64 },
    /// Child to a new parent: "I hold the outcome of `op`; my subtree needs nothing more"
    /// (its members got it from the parent it had before).
    Have { op: GroupOp },
    /// Parent to child: "`op` does not wait for these members' own contributions in their new
    /// lives" (they returned while it was in flight; see the module documentation of
    /// [`crate::grpcomm::GroupGather`]).
    Excuse { op: GroupOp, ranks: Vec<Rank> },
}

fn put_op(b: &mut BytesMut, op: &GroupOp) {
    op.group.encode_into(b);
    b.put_u64(op.seq);
}

fn op_len(op: &GroupOp) -> usize {
    op.group.encoded_len() + 8
}

impl GroupMsg {
    /// The message in one buffer.
    pub fn encode(&self) -> Bytes {
        match self {
            GroupMsg::Contribution { op, digest, data } => {
                let mut b = BytesMut::with_capacity(
                    14 + op_len(op)
                        + entries_len(&data.entries, &data.excluded)
                        + 4 * data.excused.len(),
                );
                b.put_u8(KIND_CONTRIBUTION);
                put_op(&mut b, op);
                b.put_u64(*digest);
                b.put_u8(if data.overflowed { FLAG_OVERFLOWED } else { 0 });
                put_entries(&mut b, &data.entries, &data.excluded);
                put_ranks(&mut b, &data.excused);
                b.freeze()
            }
            GroupMsg::Result { op, lost, data } => {
                let mut b = BytesMut::with_capacity(
                    2 + op_len(op) + entries_len(&data.entries, &data.excluded),
                );
                b.put_u8(KIND_RESULT);
                put_op(&mut b, op);
                let mut flags = 0;
                if data.overflowed {
                    flags |= FLAG_OVERFLOWED;
                }
                if *lost {
                    flags |= FLAG_LOST;
                }
                b.put_u8(flags);
                put_entries(&mut b, &data.entries, &data.excluded);
                b.freeze()
            }
            GroupMsg::Sync { digest } => {
                let mut b = BytesMut::with_capacity(9);
                b.put_u8(KIND_SYNC);
                b.put_u64(*digest);
                b.freeze()
            }
            GroupMsg::Have { op } => {
                let mut b = BytesMut::with_capacity(1 + op_len(op));
                b.put_u8(KIND_HAVE);
                put_op(&mut b, op);
                b.freeze()
            }
            GroupMsg::Excuse { op, ranks } => {
                let mut b = BytesMut::with_capacity(5 + op_len(op) + 4 * ranks.len());
                b.put_u8(KIND_EXCUSE);
                put_op(&mut b, op);
                put_ranks(&mut b, ranks);
                b.freeze()
            }
        }
    }

    /// Decodes one frame for a DVM of `size` ranks; entry bytes are slices of `frame`.
    pub fn decode(size: u32, frame: Bytes) -> Result<Self, WireError> {
        let mut r = Reader::new(frame);
        let msg = match r.u8()? {
            KIND_CONTRIBUTION => {
                let op = read_op(&mut r, size)?;
                let digest = r.u64()?;
                let overflowed = match r.u8()? {
                    0 => false,
                    FLAG_OVERFLOWED => true,
                    _ => return Err(WireError::Invalid("unknown flags")),
                };
                let mut data = read_gathered(&mut r, size, &op, overflowed)?;
                data.excused = read_members(&mut r, size, &op)?;
                GroupMsg::Contribution { op, digest, data }
            }
            KIND_RESULT => {
                let op = read_op(&mut r, size)?;
                let flags = r.u8()?;
                if flags & !(FLAG_OVERFLOWED | FLAG_LOST) != 0 {
                    return Err(WireError::Invalid("unknown flags"));
                }
                let lost = flags & FLAG_LOST != 0;
                let data = read_gathered(&mut r, size, &op, flags & FLAG_OVERFLOWED != 0)?;
                if lost && !(data.entries.is_empty() && data.excluded.is_empty()) {
                    return Err(WireError::Invalid("data in a lost result"));
                }
                GroupMsg::Result { op, lost, data }
            }
            KIND_SYNC => GroupMsg::Sync { digest: r.u64()? },
            KIND_HAVE => GroupMsg::Have {
                op: read_op(&mut r, size)?,
            },
            KIND_EXCUSE => {
                let op = read_op(&mut r, size)?;
                let ranks = read_members(&mut r, size, &op)?;
                GroupMsg::Excuse { op, ranks }
            }
            other => return Err(WireError::UnknownKind(other)),
        };
        r.finish()?;
        Ok(msg)
    }
}

fn read_op(r: &mut Reader, size: u32) -> Result<GroupOp, WireError> {
    let (group, took) = GroupId::decode_prefix(r.rest(), size).map_err(WireError::Invalid)?;
    r.skip(took)?;
    let seq = r.u64()?;
    Ok(GroupOp { group, seq })
}

/// A list of ranks (`u32 count`, ascending ranks), each a member of `op`'s group.
fn read_members(r: &mut Reader, size: u32, op: &GroupOp) -> Result<Vec<Rank>, WireError> {
    let ranks = r.ranks(size)?;
    if ranks.iter().any(|rank| !op.group.contains(*rank)) {
        return Err(WireError::Invalid("an excused rank outside the group"));
    }
    Ok(ranks)
}

fn read_gathered(
    r: &mut Reader,
    size: u32,
    op: &GroupOp,
    overflowed: bool,
) -> Result<GroupData, WireError> {
    let (entries, excluded) = r.entries(size, overflowed)?;
    let outsider = entries
        .iter()
        .map(|(rank, _)| rank)
        .chain(excluded.iter())
        .any(|rank| !op.group.contains(*rank));
    if outsider {
        return Err(WireError::Invalid("an entry for a rank outside the group"));
    }
    Ok(GroupData {
        overflowed,
        entries,
        excluded,
        excused: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op() -> GroupOp {
        GroupOp {
            group: GroupId::new(9, [1, 2, 3, 7, 10]).unwrap(),
            seq: 4,
        }
    }

    #[test]
    fn every_message_round_trips() {
        let data = GroupData {
            overflowed: false,
            entries: vec![(1, Bytes::from_static(b"a")), (7, Bytes::new())],
            excluded: vec![3],
            excused: vec![],
        };
        let excusing = GroupData {
            excused: vec![2, 10],
            ..data.clone()
        };
        for msg in [
            GroupMsg::Contribution {
                op: op(),
                digest: 6,
                data: excusing,
            },
            GroupMsg::Excuse {
                op: op(),
                ranks: vec![1, 7],
            },
            GroupMsg::Excuse {
                op: op(),
                ranks: vec![],
            },
            GroupMsg::Contribution {
                op: op(),
                digest: 5,
                data: data.clone(),
            },
            GroupMsg::Result {
                op: op(),
                lost: false,
                data,
            },
            GroupMsg::Result {
                op: op(),
                lost: true,
                data: GroupData::default(),
            },
            GroupMsg::Sync { digest: 3 },
            GroupMsg::Have { op: op() },
        ] {
            assert_eq!(GroupMsg::decode(11, msg.encode()), Ok(msg));
        }
    }

    #[test]
    fn bad_groups_and_outsiders_are_refused() {
        let good = GroupMsg::Contribution {
            op: op(),
            digest: 1,
            data: GroupData {
                entries: vec![(2, Bytes::new())],
                ..GroupData::default()
            },
        }
        .encode();
        // Rank 10 is a member: a DVM of 10 has no such rank.
        assert!(GroupMsg::decode(10, good.clone()).is_err());
        // Every truncation fails cleanly.
        for cut in 0..good.len() {
            assert!(GroupMsg::decode(11, good.slice(..cut)).is_err());
        }
        let outsider = GroupMsg::Contribution {
            op: op(),
            digest: 1,
            data: GroupData {
                entries: vec![(4, Bytes::new())],
                ..GroupData::default()
            },
        };
        assert!(GroupMsg::decode(11, outsider.encode()).is_err());
        // Runs that touch are not canonical: [1..=1] then [2..=2].
        let mut b = BytesMut::new();
        b.put_u8(KIND_RESULT);
        b.put_u64(0);
        b.put_u32(2);
        for first in [1u32, 2] {
            b.put_u32(first);
            b.put_u32(1);
        }
        b.put_u64(0);
        b.put_u8(0);
        b.put_u32(0);
        b.put_u32(0);
        assert_eq!(
            GroupMsg::decode(11, b.freeze()),
            Err(WireError::Invalid("member runs not canonical"))
        );
    }

    #[test]
    fn whatever_decodes_encodes_back_to_the_same_bytes() {
        // One encoding per message (the fuzz target asserts the same on arbitrary input).
        let base = GroupMsg::Contribution {
            op: op(),
            digest: 9,
            data: GroupData {
                overflowed: false,
                entries: vec![(2, Bytes::from_static(b"xy"))],
                excluded: vec![7],
                excused: vec![1],
            },
        }
        .encode();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut decoded = 0;
        for _ in 0..20_000 {
            let mut b = base.to_vec();
            for _ in 0..1 + (x % 3) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let at = (x as usize) % b.len();
                b[at] = (x >> 32) as u8;
            }
            if let Ok(m) = GroupMsg::decode(11, Bytes::from(b.clone())) {
                decoded += 1;
                assert_eq!(&m.encode()[..], &b[..]);
            }
        }
        assert!(decoded > 100, "{decoded}");
    }
}
