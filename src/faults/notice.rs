//! Fault notices on the wire. Sans-IO encode/decode; every decoder checks lengths and ranks
//! and returns an error rather than panicking on hostile bytes.
//!
//! Layouts (network byte order):
//! - rank list: `u32 count`, then `count` x `u32 rank` (count at most the DVM size);
//! - report (to rank 0): `u64 epoch` (the sender's, when it found them dead), a rank list of
//!   the ranks the sender found dead, then `u16` per rank: its life as the sender knows it;
//! - confirmation (a broadcast operation of rank 0): `u64 epoch`, then the rank list of every
//!   rank confirmed dead so far, then `u32 count` daemons restored in this epoch (issue
//!   "Rejoin"), each `u32 rank`, `u64 incarnation`, `u16 length` and its contact URI;
//! - adoption (to a new child, and to every child a parent offers the collectives' `Sync`):
//!   `u64 epoch` (the sender's), the rank list of every failure the sender knows, `u16` per
//!   failure (its life as the sender knows it), the rank list of the sender's ancestors (parent
//!   first), then the restored daemons the sender knows of
//!   (at most `REJOIN_RESTORES_TOLD_MAX`, the latest), each as in a confirmation followed by
//!   `u64 epoch`, the epoch of its restore. A child learns a restore from its new parent
//!   this way before the confirmation reaches it (which can only come through that parent).
//!
//! The lives let a receiver tell a stale death from a current one: a death of an earlier life
//! of a rank than the receiver knows is about a previous incarnation, not the running one.

use crate::Rank;
use crate::limits::CONTACT_URI_MAX_BYTES;
use crate::oob::uri::ContactUri;
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
    /// A restored daemon's contact URI that does not parse, is too long, or names another rank.
    BadUri(String),
}

impl std::fmt::Display for NoticeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoticeError::Truncated => write!(f, "truncated fault notice"),
            NoticeError::Trailing(n) => write!(f, "{n} stray bytes after a fault notice"),
            NoticeError::BadRank { rank, size } => {
                write!(f, "fault notice names rank {rank} in a DVM of {size}")
            }
            NoticeError::BadUri(why) => write!(f, "fault notice with a bad contact: {why}"),
        }
    }
}

impl std::error::Error for NoticeError {}

/// Rank 0's confirmation of every death so far, and of the daemons it admitted back in this
/// epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confirmation {
    pub epoch: u64,
    pub failed: Vec<Rank>,
    /// Daemons restarted under their rank and admitted again in this epoch (not in `failed`).
    pub restored: Vec<Restored>,
    /// Ranks of `failed` that left in order in this epoch (`leave.rs`): repaired around as the
    /// dead are, reported as departed.
    pub departed: Vec<Rank>,
}

/// A daemon admitted back (issue "Rejoin"): its rank, its new incarnation and its new contact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    pub rank: Rank,
    pub incarnation: u64,
    /// How many times rank 0 has admitted this rank back, this time included (`Header::lives`).
    pub life: u16,
    pub uri: ContactUri,
}

/// A parent's notice to a child it adopted in a repair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adoption {
    /// The sender's epoch when it sent the notice.
    pub epoch: u64,
    pub failed: Vec<Rank>,
    /// The life of each rank in `failed` as the sender knows it.
    pub lives: Vec<u16>,
    pub ancestors: Vec<Rank>,
    /// Daemons the sender knows were admitted back, with the epoch of each restore.
    pub restored: Vec<(Restored, u64)>,
    /// Ranks of `failed` that left in order (`leave.rs`): the child repairs around them
    /// without reporting a failure.
    pub departed: Vec<Rank>,
}

/// A daemon's report of deaths it found, to rank 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The sender's epoch when it found them.
    pub epoch: u64,
    pub failed: Vec<Rank>,
    /// The life of each rank in `failed` as the sender knows it (`Header::lives`): a death of
    /// an earlier life than rank 0 knows is old news.
    pub lives: Vec<u16>,
}

/// `n` lives (`u16` each; 0 where `lives` is short).
pub(crate) fn put_lives(b: &mut BytesMut, lives: &[u16], n: usize) {
    for i in 0..n {
        b.put_u16(lives.get(i).copied().unwrap_or(0));
    }
}

pub(crate) fn take_lives(p: &mut &[u8], n: usize) -> Result<Vec<u16>, NoticeError> {
    let mut out = Vec::with_capacity(n.min(p.len() / 2));
    for _ in 0..n {
        let (l, rest) = p.split_first_chunk::<2>().ok_or(NoticeError::Truncated)?;
        *p = rest;
        out.push(u16::from_be_bytes(*l));
    }
    Ok(out)
}

pub(crate) fn put_ranks(b: &mut BytesMut, ranks: &[Rank]) {
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

pub(crate) fn take_ranks(p: &mut &[u8], size: u32) -> Result<Vec<Rank>, NoticeError> {
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

fn take_u64(p: &mut &[u8]) -> Result<u64, NoticeError> {
    let (h, rest) = p.split_first_chunk::<8>().ok_or(NoticeError::Truncated)?;
    *p = rest;
    Ok(u64::from_be_bytes(*h))
}

fn done(p: &[u8]) -> Result<(), NoticeError> {
    if p.is_empty() {
        Ok(())
    } else {
        Err(NoticeError::Trailing(p.len()))
    }
}

/// Encodes a bare rank list.
pub fn encode_ranks(ranks: &[Rank]) -> Bytes {
    let mut b = BytesMut::with_capacity(4 + 4 * ranks.len());
    put_ranks(&mut b, ranks);
    b.freeze()
}

/// Decodes a bare rank list for a DVM of `size`.
pub fn decode_ranks(size: u32, mut p: &[u8]) -> Result<Vec<Rank>, NoticeError> {
    let r = take_ranks(&mut p, size)?;
    done(p)?;
    Ok(r)
}

impl Report {
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(12 + 6 * self.failed.len());
        b.put_u64(self.epoch);
        put_ranks(&mut b, &self.failed);
        put_lives(&mut b, &self.lives, self.failed.len());
        b.freeze()
    }

    pub fn decode(size: u32, mut p: &[u8]) -> Result<Self, NoticeError> {
        let epoch = take_u64(&mut p)?;
        let failed = take_ranks(&mut p, size)?;
        let lives = take_lives(&mut p, failed.len())?;
        done(p)?;
        Ok(Report {
            epoch,
            failed,
            lives,
        })
    }
}

impl Restored {
    fn put(&self, b: &mut BytesMut) {
        let uri = self.uri.to_string();
        b.put_u32(self.rank);
        b.put_u64(self.incarnation);
        b.put_u16(self.life);
        // A contact longer than `CONTACT_URI_MAX_BYTES` (4 KiB) never parses, so never exists.
        b.put_u16(uri.len().min(usize::from(u16::MAX)) as u16);
        b.put_slice(uri.as_bytes());
    }

    fn take(p: &mut &[u8], size: u32) -> Result<Restored, NoticeError> {
        let rank = take_u32(p)?;
        if rank >= size {
            return Err(NoticeError::BadRank { rank, size });
        }
        let incarnation = take_u64(p)?;
        let (life, rest) = p.split_first_chunk::<2>().ok_or(NoticeError::Truncated)?;
        let life = u16::from_be_bytes(*life);
        *p = rest;
        let (l, rest) = p.split_first_chunk::<2>().ok_or(NoticeError::Truncated)?;
        let len = usize::from(u16::from_be_bytes(*l));
        if len > CONTACT_URI_MAX_BYTES {
            return Err(NoticeError::BadUri(format!("{len} bytes")));
        }
        let (text, rest) = rest.split_at_checked(len).ok_or(NoticeError::Truncated)?;
        *p = rest;
        let uri: ContactUri = std::str::from_utf8(text)
            .map_err(|_| NoticeError::BadUri("not UTF-8".into()))?
            .parse()
            .map_err(|e| NoticeError::BadUri(format!("{e}")))?;
        if uri.rank != rank {
            return Err(NoticeError::BadUri(format!(
                "rank {rank}'s contact names rank {}",
                uri.rank
            )));
        }
        Ok(Restored {
            rank,
            incarnation,
            life,
            uri,
        })
    }
}

/// Restores with the epoch of each: `u32 count` (at most `REJOIN_RESTORES_TOLD_MAX`), then
/// each restore followed by its `u64 epoch`.
pub(crate) fn put_restores(b: &mut BytesMut, restores: &[(Restored, u64)]) {
    b.put_u32(restores.len() as u32);
    for (r, epoch) in restores {
        r.put(b);
        b.put_u64(*epoch);
    }
}

/// Decodes what [`put_restores`] wrote.
pub(crate) fn take_restores(p: &mut &[u8], size: u32) -> Result<Vec<(Restored, u64)>, NoticeError> {
    let count = take_u32(p)?;
    if count as usize > crate::limits::REJOIN_RESTORES_TOLD_MAX || count > size {
        return Err(NoticeError::BadRank { rank: count, size });
    }
    let mut restored = Vec::new();
    for _ in 0..count {
        let r = Restored::take(p, size)?;
        let at = take_u64(p)?;
        restored.push((r, at));
    }
    Ok(restored)
}

impl Confirmation {
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(16 + 4 * self.failed.len());
        b.put_u64(self.epoch);
        put_ranks(&mut b, &self.failed);
        b.put_u32(self.restored.len() as u32);
        for r in &self.restored {
            r.put(&mut b);
        }
        put_ranks(&mut b, &self.departed);
        b.freeze()
    }

    pub fn decode(size: u32, mut p: &[u8]) -> Result<Self, NoticeError> {
        let epoch = take_u64(&mut p)?;
        let failed = take_ranks(&mut p, size)?;
        let count = take_u32(&mut p)?;
        if count > size {
            return Err(NoticeError::BadRank { rank: count, size });
        }
        let mut restored = Vec::new();
        for _ in 0..count {
            let r = Restored::take(&mut p, size)?;
            if failed.contains(&r.rank) {
                return Err(NoticeError::BadRank { rank: r.rank, size });
            }
            restored.push(r);
        }
        let departed = take_ranks(&mut p, size)?;
        if let Some(r) = departed.iter().find(|r| !failed.contains(r)) {
            return Err(NoticeError::BadRank { rank: *r, size });
        }
        done(p)?;
        Ok(Confirmation {
            epoch,
            failed,
            restored,
            departed,
        })
    }
}

impl Adoption {
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(16 + 4 * (self.failed.len() + self.ancestors.len()));
        b.put_u64(self.epoch);
        put_ranks(&mut b, &self.failed);
        put_lives(&mut b, &self.lives, self.failed.len());
        put_ranks(&mut b, &self.ancestors);
        put_restores(&mut b, &self.restored);
        put_ranks(&mut b, &self.departed);
        b.freeze()
    }

    pub fn decode(size: u32, mut p: &[u8]) -> Result<Self, NoticeError> {
        let epoch = take_u64(&mut p)?;
        let failed = take_ranks(&mut p, size)?;
        let lives = take_lives(&mut p, failed.len())?;
        let ancestors = take_ranks(&mut p, size)?;
        let restored = take_restores(&mut p, size)?;
        let departed = take_ranks(&mut p, size)?;
        if let Some(r) = departed.iter().find(|r| !failed.contains(r)) {
            return Err(NoticeError::BadRank { rank: *r, size });
        }
        done(p)?;
        Ok(Adoption {
            epoch,
            failed,
            lives,
            ancestors,
            restored,
            departed,
        })
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
            restored: vec![Restored {
                rank: 3,
                incarnation: 99,
                life: 1,
                uri: "tbon.3;tcp://127.0.0.1:4000".parse().unwrap(),
            }],
            departed: vec![5],
        };
        assert_eq!(Confirmation::decode(8, &c.encode()), Ok(c));
        // A departed rank must be among the failed.
        let odd = Confirmation {
            epoch: 7,
            failed: vec![1],
            restored: Vec::new(),
            departed: vec![2],
        };
        assert!(Confirmation::decode(8, &odd.encode()).is_err());
        let a = Adoption {
            epoch: 2,
            failed: vec![3],
            lives: vec![1],
            ancestors: vec![1, 0],
            restored: vec![(
                Restored {
                    rank: 4,
                    incarnation: 8,
                    life: 1,
                    uri: "tbon.4;tcp://127.0.0.1:4004".parse().unwrap(),
                },
                2,
            )],
            departed: vec![3],
        };
        assert_eq!(Adoption::decode(8, &a.encode()), Ok(a));
        let r = Report {
            epoch: 4,
            failed: vec![2, 4],
            lives: vec![0, 3],
        };
        assert_eq!(Report::decode(8, &r.encode()), Ok(r));
        assert_eq!(decode_ranks(8, &encode_ranks(&[2, 4])), Ok(vec![2, 4]));
    }

    #[test]
    fn bad_notices_are_errors() {
        let c = Confirmation {
            epoch: 1,
            failed: vec![1, 5],
            restored: Vec::new(),
            departed: Vec::new(),
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
            let _ = Report::decode(size, &bytes);
        }
    }
}
