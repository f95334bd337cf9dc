//! Fault notices on the wire. Sans-IO encode/decode; every decoder checks lengths and ranks
//! and returns an error rather than panicking on hostile bytes.
//!
//! Layouts (network byte order):
//! - rank list: `u32 count`, then `count` x `u32 rank` (count at most the DVM size);
//! - report (to rank 0): a rank list of the ranks the sender found dead;
//! - confirmation (a broadcast operation of rank 0): `u64 epoch`, then the rank list of every
//!   rank confirmed dead so far;
//! - adoption (to a new child, and to every child a parent offers the collectives' `Sync`): the
//!   rank list of every failure the sender knows, then the rank list of the sender's ancestors
//!   (parent first).

use crate::Rank;
use bytes::{BufMut, Bytes, BytesMut};

/// Runtime tag: ranks a daemon found dead, sent to rank 0.
pub const TAG_FAULT_REPORT: u32 = 5;
/// Runtime tag: rank 0's confirmation of deaths, with a new epoch: a fault-tolerant broadcast
/// (xcast) operation, delivered by every living daemon once, in order.
pub const TAG_FAULT_CONFIRM: u32 = 6;
/// Runtime tag: a daemon tells a child that it is its parent, and every failure it knows (sent
/// before each `Sync` the collectives offer the child).
pub const TAG_ADOPTED: u32 = 7;
/// Runtime tag: sent to a daemon the DVM has declared dead that still talks; it must exit.
pub const TAG_DECLARED_DEAD: u32 = 8;
/// Runtime tag: rank 0 is gone; flooded down from whoever noticed (no broadcast: rank 0 numbers
/// those). Every daemon exits.
pub const TAG_ROOT_LOST: u32 = 9;

/// Why a notice was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoticeError {
    /// The payload ended early.
    Truncated,
    /// Bytes were left over after the notice.
    Trailing(usize),
    /// A list longer than the DVM, or a rank outside it.
    BadRank { rank: Rank, size: u32 },
}

impl std::fmt::Display for NoticeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoticeError::Truncated => write!(f, "truncated fault notice"),
            NoticeError::Trailing(n) => write!(f, "{n} stray bytes after a fault notice"),
            NoticeError::BadRank { rank, size } => {
                write!(f, "fault notice names rank {rank} in a DVM of {size}")
            }
        }
    }
}

impl std::error::Error for NoticeError {}

/// Rank 0's confirmation of every death so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confirmation {
    pub epoch: u64,
    pub failed: Vec<Rank>,
}

/// A parent's notice to a child it adopted in a repair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adoption {
    pub failed: Vec<Rank>,
    pub ancestors: Vec<Rank>,
}

fn put_ranks(b: &mut BytesMut, ranks: &[Rank]) {
    b.put_u32(ranks.len() as u32);
    for r in ranks {
        b.put_u32(*r);
    }
}

fn take_u32(p: &mut &[u8]) -> Result<u32, NoticeError> {
    let (h, rest) = p.split_first_chunk::<4>().ok_or(NoticeError::Truncated)?;
    *p = rest;
    Ok(u32::from_be_bytes(*h))
}

fn take_ranks(p: &mut &[u8], size: u32) -> Result<Vec<Rank>, NoticeError> {
    let count = take_u32(p)?;
    if count > size {
        return Err(NoticeError::BadRank { rank: count, size });
    }
    // Each rank takes 4 bytes: a count the payload cannot hold is truncation, found before
    // allocating for it.
    if (count as usize).saturating_mul(4) > p.len() {
        return Err(NoticeError::Truncated);
    }
    let mut out = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let r = take_u32(p)?;
        if r >= size {
            return Err(NoticeError::BadRank { rank: r, size });
        }
        out.push(r);
    }
    Ok(out)
}

fn done(p: &[u8]) -> Result<(), NoticeError> {
    if p.is_empty() {
        Ok(())
    } else {
        Err(NoticeError::Trailing(p.len()))
    }
}

/// Encodes a report (or any bare rank list).
pub fn encode_ranks(ranks: &[Rank]) -> Bytes {
    let mut b = BytesMut::with_capacity(4 + 4 * ranks.len());
    put_ranks(&mut b, ranks);
    b.freeze()
}

/// Decodes a report for a DVM of `size`.
pub fn decode_ranks(size: u32, mut p: &[u8]) -> Result<Vec<Rank>, NoticeError> {
    let r = take_ranks(&mut p, size)?;
    done(p)?;
    Ok(r)
}

impl Confirmation {
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(12 + 4 * self.failed.len());
        b.put_u64(self.epoch);
        put_ranks(&mut b, &self.failed);
        b.freeze()
    }

    pub fn decode(size: u32, mut p: &[u8]) -> Result<Self, NoticeError> {
        let (e, rest) = p.split_first_chunk::<8>().ok_or(NoticeError::Truncated)?;
        p = rest;
        let failed = take_ranks(&mut p, size)?;
        done(p)?;
        Ok(Confirmation {
            epoch: u64::from_be_bytes(*e),
            failed,
        })
    }
}

impl Adoption {
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(8 + 4 * (self.failed.len() + self.ancestors.len()));
        put_ranks(&mut b, &self.failed);
        put_ranks(&mut b, &self.ancestors);
        b.freeze()
    }

    pub fn decode(size: u32, mut p: &[u8]) -> Result<Self, NoticeError> {
        let failed = take_ranks(&mut p, size)?;
        let ancestors = take_ranks(&mut p, size)?;
        done(p)?;
        Ok(Adoption { failed, ancestors })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trips() {
        let c = Confirmation {
            epoch: 7,
            failed: vec![1, 5],
        };
        assert_eq!(Confirmation::decode(8, &c.encode()), Ok(c));
        let a = Adoption {
            failed: vec![3],
            ancestors: vec![1, 0],
        };
        assert_eq!(Adoption::decode(8, &a.encode()), Ok(a));
        assert_eq!(decode_ranks(8, &encode_ranks(&[2, 4])), Ok(vec![2, 4]));
    }

    #[test]
    fn bad_notices_are_errors() {
        let c = Confirmation {
            epoch: 1,
            failed: vec![1, 5],
        }
        .encode();
        for cut in 0..c.len() {
            assert!(Confirmation::decode(8, &c[..cut]).is_err());
        }
        assert_eq!(
            Confirmation::decode(4, &c),
            Err(NoticeError::BadRank { rank: 5, size: 4 })
        );
        let mut long = c.to_vec();
        long.push(0);
        assert_eq!(
            Confirmation::decode(8, &long),
            Err(NoticeError::Trailing(1))
        );
        // A count far beyond the payload is refused before allocating.
        assert_eq!(
            decode_ranks(u32::MAX, &[0xff, 0xff, 0xff, 0x00]),
            Err(NoticeError::Truncated)
        );
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64), size in 1u32..100) {
            let _ = decode_ranks(size, &bytes);
            let _ = Confirmation::decode(size, &bytes);
            let _ = Adoption::decode(size, &bytes);
        }
    }
}
