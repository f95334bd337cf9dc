//! A group's identity: a context number and its member ranks, sorted (issue "Jobs").
//!
//! A group collective is named by its [`GroupOp`]: the [`GroupId`] plus the group's own
//! sequence number (the n-th collective the members run on that group). Every member computes
//! the same name from what it already knows (the job's number and its daemons), so members
//! never agree on collective ids out of band.
//!
//! # Collisions
//! While a collective is in flight every table is keyed by the whole identity, member set
//! included, and every message carries the member set (as ranges: a job's daemons are usually a
//! few runs of consecutive ranks). Two different groups therefore never share state: there is
//! no signature that could collide. Only the memory of *finished* collectives keeps a 128-bit
//! digest of the identity instead of the member list (two XXH64 hashes with independent seeds),
//! to bound its size; a collision there (probability about 2^-128 per pair, and the peers are
//! authenticated, so nobody chooses member sets to force one) would make a late re-sent
//! contribution be answered "result lost" instead of opening new state.
use crate::Rank;
use crate::limits;
use std::sync::Arc;

/// Why a member set was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum GroupError {
    /// The member set is empty.
    Empty,
    /// More members than [`limits::GROUP_MEMBERS_MAX`].
    TooManyMembers {
        /// Members given (after removing duplicates).
        len: usize,
        /// The bound.
        max: usize,
    },
}

impl std::fmt::Display for GroupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GroupError::Empty => write!(f, "a group needs at least one member"),
            GroupError::TooManyMembers { len, max } => {
                write!(f, "a group of {len} members is above the bound of {max}")
            }
        }
    }
}

impl std::error::Error for GroupError {}

/// A group: a context number chosen by the embedder (a job's number: a context is never reused
/// for the same member set) and the member ranks, sorted, without duplicates, never empty.
/// Cheap to clone (the members are shared).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupId {
    context: u64,
    members: Arc<[Rank]>,
}

impl GroupId {
    /// The group of `members` (any order, duplicates ignored) under `context`. Fails with
    /// [`GroupError::Empty`] or [`GroupError::TooManyMembers`]; whether the ranks exist in a
    /// DVM is checked where the group is used.
    pub fn new(context: u64, members: impl IntoIterator<Item = Rank>) -> Result<Self, GroupError> {
        let mut m: Vec<Rank> = members.into_iter().collect();
        m.sort_unstable();
        m.dedup();
        if m.is_empty() {
            return Err(GroupError::Empty);
        }
        if m.len() > limits::GROUP_MEMBERS_MAX {
            return Err(GroupError::TooManyMembers {
                len: m.len(),
                max: limits::GROUP_MEMBERS_MAX,
            });
        }
        Ok(GroupId {
            context,
            members: m.into(),
        })
    }

    /// The context number.
    pub fn context(&self) -> u64 {
        self.context
    }

    /// The members, ascending.
    pub fn members(&self) -> &[Rank] {
        &self.members
    }

    /// Whether `rank` is a member.
    pub fn contains(&self, rank: Rank) -> bool {
        self.members.binary_search(&rank).is_ok()
    }

    /// The highest member (the members are never empty).
    pub fn max_rank(&self) -> Rank {
        self.members.last().copied().unwrap_or(0)
    }

    /// The members as maximal runs of consecutive ranks: (first, count), ascending, count >= 1,
    /// and never two runs that touch (the canonical form the wire requires).
    pub fn ranges(&self) -> Vec<(Rank, u32)> {
        let mut out: Vec<(Rank, u32)> = Vec::new();
        for &r in self.members.iter() {
            match out.last_mut() {
                Some((first, count)) if first.checked_add(*count) == Some(r) => *count += 1,
                _ => out.push((r, 1)),
            }
        }
        out
    }

    /// Bytes of [`GroupId::encode_into`]'s output.
    pub fn encoded_len(&self) -> usize {
        12 + 8 * self.ranges().len()
    }

    /// Appends the group as the wire carries it: `u64 context`, `u32 runs`, then each run as
    /// `u32 first`, `u32 count` (canonical: see [`GroupId::ranges`]).
    pub fn encode_into(&self, b: &mut bytes::BytesMut) {
        use bytes::BufMut;
        let runs = self.ranges();
        b.put_u64(self.context);
        // At most GROUP_MEMBERS_MAX runs, far below u32::MAX.
        b.put_u32(u32::try_from(runs.len()).unwrap_or(u32::MAX));
        for (first, count) in runs {
            b.put_u32(first);
            b.put_u32(count);
        }
    }

    /// Reads a group written by [`GroupId::encode_into`] at the start of `buf`, for a DVM of
    /// `size` ranks; returns it and the bytes it took. Refuses (with the reason) a truncated
    /// group, no members, a run outside the DVM, runs not in canonical form, or more than
    /// [`limits::GROUP_MEMBERS_MAX`] members; never allocates more than the input justifies.
    pub fn decode_prefix(buf: &[u8], size: u32) -> Result<(Self, usize), &'static str> {
        let u32_at = |at: usize| -> Result<u32, &'static str> {
            buf.get(at..at + 4)
                .and_then(|s| <[u8; 4]>::try_from(s).ok())
                .map(u32::from_be_bytes)
                .ok_or("a truncated group")
        };
        let context = buf
            .get(..8)
            .and_then(|s| <[u8; 8]>::try_from(s).ok())
            .map(u64::from_be_bytes)
            .ok_or("a truncated group")?;
        let runs = u32_at(8)? as usize;
        if runs == 0 {
            return Err("a group without members");
        }
        if runs > size as usize || runs.saturating_mul(8) > buf.len().saturating_sub(12) {
            return Err("a truncated group");
        }
        let mut members: Vec<Rank> = Vec::new();
        let mut next_free: u64 = 0;
        for i in 0..runs {
            let first = u32_at(12 + 8 * i)?;
            let count = u32_at(16 + 8 * i)?;
            let end = u64::from(first) + u64::from(count);
            if count == 0 || end > u64::from(size) {
                return Err("a member run outside the DVM");
            }
            if i > 0 && u64::from(first) <= next_free {
                return Err("member runs not canonical");
            }
            if members.len().saturating_add(count as usize) > limits::GROUP_MEMBERS_MAX {
                return Err("a group above GROUP_MEMBERS_MAX");
            }
            members.extend(first..first + count);
            next_free = end;
        }
        Ok((
            GroupId {
                context,
                members: members.into(),
            },
            12 + 8 * runs,
        ))
    }

    /// A 128-bit digest of the identity (context and members), for the memory of finished
    /// collectives (see the module documentation).
    pub(crate) fn digest(&self) -> u128 {
        let mut bytes = Vec::with_capacity(8 + 4 * self.members.len());
        bytes.extend_from_slice(&self.context.to_be_bytes());
        for r in self.members.iter() {
            bytes.extend_from_slice(&r.to_be_bytes());
        }
        let lo = crate::stream::digest::xxh64(&bytes, 0x6772_6f75_7031);
        let hi = crate::stream::digest::xxh64(&bytes, 0x9e37_79b9_7f4a_7c15);
        (u128::from(hi) << 64) | u128::from(lo)
    }
}

/// One group collective: the group and its sequence number (0 for the group's first).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupOp {
    /// The group.
    pub group: GroupId,
    /// The collective's place in the group's sequence.
    pub seq: u64,
}

impl GroupOp {
    /// What the memory of finished collectives keeps.
    pub(crate) fn finished_key(&self) -> (u128, u64) {
        (self.group.digest(), self.seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_sorted_deduplicated_and_bounded() {
        let g = GroupId::new(7, [5, 1, 3, 1, 2]).unwrap();
        assert_eq!(g.members(), &[1, 2, 3, 5]);
        assert_eq!(g.ranges(), vec![(1, 3), (5, 1)]);
        assert!(g.contains(5) && !g.contains(4));
        assert_eq!(g.max_rank(), 5);
        assert_eq!(GroupId::new(7, []), Err(GroupError::Empty));
        let too_many = limits::GROUP_MEMBERS_MAX as u32 + 1;
        assert!(matches!(
            GroupId::new(0, 0..too_many),
            Err(GroupError::TooManyMembers { .. })
        ));
    }

    #[test]
    fn the_digest_tells_context_and_members_apart() {
        let a = GroupId::new(1, [1, 2]).unwrap();
        assert_eq!(a.digest(), GroupId::new(1, [2, 1]).unwrap().digest());
        assert_ne!(a.digest(), GroupId::new(2, [1, 2]).unwrap().digest());
        assert_ne!(a.digest(), GroupId::new(1, [1, 3]).unwrap().digest());
    }
}
