//! Rejoin on the wire (issue "Rejoin and grow"): a daemon restarted under the rank of a dead
//! one asks rank 0 to admit it; rank 0 welcomes it (or refuses, saying why), and tells it once
//! every living daemon has learnt of its return. Sans-IO encode/decode; every decoder checks
//! lengths and ranks and returns an error rather than panicking on hostile bytes.
//!
//! These four travel directly between the rejoining daemon and rank 0, on the connection the
//! rejoining daemon dialled (it has no place in the tree until it is welcomed). The request's
//! incarnation is the one its handshake proved (the header's `epoch`), so it is not repeated.
//!
//! Layouts (network byte order):
//! - request (to rank 0): `u32 size`, `u32 radix` (the DVM's shape as the daemon was started
//!   with it: rank 0 refuses another, [`Refusal::Shape`]), then the daemon's contact URI
//!   (UTF-8, as in a wire-up report);
//! - welcome: `u64 epoch` (the one its admission opens), `u64 op` (the broadcast operation that
//!   announces it: it delivers the operations after it, none before), the rank list of every
//!   rank confirmed dead, then the latest restores rank 0 knows with their epochs, as in an
//!   adoption notice (see `notice.rs`): the welcomed daemon passes them on to its children,
//!   who may still believe those ranks dead;
//! - refusal: `u8 reason` ([`Refusal`]);
//! - settled: `u64 op` (the admission's operation, now delivered by every living daemon).

use super::notice::NoticeError;
use crate::Rank;
use bytes::{BufMut, Bytes, BytesMut};

/// Runtime tag: a restarted daemon asks rank 0 to admit it under its rank.
pub const TAG_REJOIN: u32 = 22;
/// Runtime tag: rank 0 admitted the daemon ([`Welcome`]).
pub const TAG_WELCOME: u32 = 23;
/// Runtime tag: rank 0 refused the daemon ([`Refusal`]); it must stop.
pub const TAG_REJOIN_REFUSED: u32 = 24;
/// Runtime tag: every living daemon delivered the admission's operation: the rejoined daemon's
/// own messages may go out (no daemon on their way still believes it dead).
pub const TAG_SETTLED: u32 = 25;

/// Rank 0's answer to a daemon it admitted back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Welcome {
    /// The epoch the admission opens.
    pub epoch: u64,
    /// The broadcast operation that announces the admission to every daemon.
    pub op: u64,
    /// The incarnation admitted: a daemon of another incarnation of the rank (a restart that
    /// took over the rank's connection while an earlier one's welcome was on its way) must
    /// not take it for its own (regression seed 25715).
    pub incarnation: u64,
    /// Every rank confirmed dead, ascending.
    pub failed: Vec<Rank>,
    /// The life of each rank in `failed` as rank 0 knows it: a daemon that passes on a death
    /// it learnt here must name the life that died, or those who knew that life take the death
    /// for older news (seed 205 of `grow`: a rank that joined, then died before another
    /// joined).
    pub lives: Vec<u16>,
    /// The welcomed daemon's life (`Header::lives`): how many times it was admitted back.
    pub life: u16,
    /// The latest restores rank 0 knows, with the epoch of each (at most
    /// `REJOIN_RESTORES_TOLD_MAX`: they carry contacts).
    pub restored: Vec<(super::notice::Restored, u64)>,
    /// Every living rank admitted back or joined (life above 0), ascending, with its life: all
    /// of them, where `restored` carries only the latest. A newcomer never delivers the older
    /// confirmations, and a message names both its ends' lives: one naming a life the receiver
    /// does not know is dropped, both ways (seed 1 of `all` at 600 daemons: a daemon admitted
    /// after 296 others took its parent, which had joined early, for life 0, and their subtree
    /// lost every message).
    pub living: Vec<(Rank, u16)>,
}

/// Why rank 0 refused a daemon that asked to rejoin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The rank is alive in the DVM: a second daemon with its rank cannot join.
    Alive = 1,
    /// The daemon's incarnation is not newer than the one the DVM knows for its rank.
    OldIncarnation = 2,
    /// Rank 0 is stopping (before wire-up 19: or still wiring up, now [`Refusal::WiringUp`]).
    NotReady = 3,
    /// The request named another rank, or no usable contact.
    BadRequest = 4,
    /// Rank 0 admits at most `REJOIN_IN_PROGRESS_MAX` daemons at once.
    Busy = 5,
    /// The daemon was started with another size or radix than the DVM's.
    Shape = 6,
    /// Rank 0 is still wiring up the DVM: the daemon asks again, as for [`Refusal::Busy`] (a
    /// whole allocation started at once, joiners among the initial ranks).
    WiringUp = 7,
}

impl Refusal {
    /// The reason with wire value `v`.
    pub fn from_wire(v: u8) -> Option<Refusal> {
        Some(match v {
            1 => Refusal::Alive,
            2 => Refusal::OldIncarnation,
            3 => Refusal::NotReady,
            4 => Refusal::BadRequest,
            5 => Refusal::Busy,
            6 => Refusal::Shape,
            7 => Refusal::WiringUp,
            _ => return None,
        })
    }

    /// Encoded as a refusal payload.
    pub fn encode(self) -> Bytes {
        Bytes::copy_from_slice(&[self as u8])
    }

    /// Decodes a refusal payload.
    pub fn decode(p: &[u8]) -> Result<Refusal, NoticeError> {
        match p {
            [v] => Refusal::from_wire(*v).ok_or(NoticeError::Truncated),
            [] => Err(NoticeError::Truncated),
            [_, rest @ ..] => Err(NoticeError::Trailing(rest.len())),
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::Alive => "the rank is alive in the DVM (only a dead rank can rejoin)",
            Refusal::OldIncarnation => {
                "this daemon's incarnation is not newer than the one the DVM knows for its rank"
            }
            Refusal::NotReady => "rank 0 is shutting down",
            Refusal::BadRequest => "the request was malformed",
            Refusal::Busy => "rank 0 is admitting as many daemons as it may at once; retry",
            Refusal::Shape => {
                "this daemon was started with another size or radix than the DVM's (start it \
                 with the DVM's --size and --radix)"
            }
            Refusal::WiringUp => "rank 0 is still wiring up the DVM's initial daemons",
        })
    }
}

impl Welcome {
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(24 + 4 * self.failed.len());
        b.put_u64(self.epoch);
        b.put_u64(self.op);
        b.put_u64(self.incarnation);
        b.put_u16(self.life);
        super::notice::put_ranks(&mut b, &self.failed);
        super::notice::put_lives(&mut b, &self.lives, self.failed.len());
        super::notice::put_restores(&mut b, &self.restored);
        let (ranks, lives): (Vec<Rank>, Vec<u16>) = self.living.iter().copied().unzip();
        super::notice::put_ranks(&mut b, &ranks);
        super::notice::put_lives(&mut b, &lives, ranks.len());
        b.freeze()
    }

    pub fn decode(size: u32, mut p: &[u8]) -> Result<Welcome, NoticeError> {
        let (e, rest) = p.split_first_chunk::<8>().ok_or(NoticeError::Truncated)?;
        let (o, rest) = rest
            .split_first_chunk::<8>()
            .ok_or(NoticeError::Truncated)?;
        let (epoch, op) = (u64::from_be_bytes(*e), u64::from_be_bytes(*o));
        let (i, rest) = rest
            .split_first_chunk::<8>()
            .ok_or(NoticeError::Truncated)?;
        let incarnation = u64::from_be_bytes(*i);
        let (l, rest) = rest
            .split_first_chunk::<2>()
            .ok_or(NoticeError::Truncated)?;
        let life = u16::from_be_bytes(*l);
        p = rest;
        let failed = super::notice::take_ranks(&mut p, size)?;
        let lives = super::notice::take_lives(&mut p, failed.len())?;
        let restored = super::notice::take_restores(&mut p, size)?;
        let ranks = super::notice::take_ranks(&mut p, size)?;
        let living_lives = super::notice::take_lives(&mut p, ranks.len())?;
        let living = ranks.into_iter().zip(living_lives).collect();
        if !p.is_empty() {
            return Err(NoticeError::Trailing(p.len()));
        }
        Ok(Welcome {
            epoch,
            op,
            incarnation,
            failed,
            lives,
            life,
            restored,
            living,
        })
    }
}

/// Encodes a rejoin request: the shape the daemon was started with, then its contact URI.
pub fn encode_request(size: u32, radix: u32, uri: &str) -> Bytes {
    let mut b = BytesMut::with_capacity(8 + uri.len());
    b.put_u32(size);
    b.put_u32(radix);
    b.put_slice(uri.as_bytes());
    b.freeze()
}

/// Decodes a rejoin request: (size, radix, the contact URI's bytes, still to be checked as a
/// wire-up report's).
pub fn decode_request(p: &Bytes) -> Result<(u32, u32, Bytes), NoticeError> {
    let (s, rest) = p.split_first_chunk::<4>().ok_or(NoticeError::Truncated)?;
    let (r, _) = rest
        .split_first_chunk::<4>()
        .ok_or(NoticeError::Truncated)?;
    Ok((u32::from_be_bytes(*s), u32::from_be_bytes(*r), p.slice(8..)))
}

/// Encodes a settled notice.
pub fn encode_settled(op: u64) -> Bytes {
    Bytes::copy_from_slice(&op.to_be_bytes())
}

/// Decodes a settled notice.
pub fn decode_settled(p: &[u8]) -> Result<u64, NoticeError> {
    let b: [u8; 8] = p.try_into().map_err(|_| NoticeError::Truncated)?;
    Ok(u64::from_be_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trips() {
        let w = Welcome {
            epoch: 3,
            op: 17,
            incarnation: 12,
            failed: vec![2, 6],
            lives: vec![0, 2],
            life: 3,
            restored: vec![(
                crate::faults::notice::Restored {
                    rank: 4,
                    incarnation: 8,
                    life: 1,
                    uri: "tbon.4;tcp://127.0.0.1:4004".parse().unwrap(),
                },
                2,
            )],
            living: vec![(1, 2), (4, 1)],
        };
        assert_eq!(Welcome::decode(8, &w.encode()), Ok(w.clone()));
        // A living rank beyond the DVM is refused, as a dead one is.
        let beyond = Welcome {
            living: vec![(8, 1)],
            ..w
        };
        assert_eq!(
            Welcome::decode(8, &beyond.encode()),
            Err(NoticeError::BadRank { rank: 8, size: 8 })
        );
        for r in [
            Refusal::Alive,
            Refusal::OldIncarnation,
            Refusal::NotReady,
            Refusal::BadRequest,
            Refusal::Busy,
            Refusal::Shape,
            Refusal::WiringUp,
        ] {
            assert_eq!(Refusal::decode(&r.encode()), Ok(r));
        }
        let uri = "tbon.3;tcp://127.0.0.1:4000";
        assert_eq!(
            decode_request(&encode_request(10, 4, uri)),
            Ok((10, 4, Bytes::from_static(uri.as_bytes())))
        );
        assert!(decode_request(&Bytes::from_static(&[0, 0, 0, 1, 0])).is_err());
        assert_eq!(decode_settled(&encode_settled(9)), Ok(9));
        assert!(Refusal::decode(&[0]).is_err());
        assert!(Refusal::decode(&[1, 1]).is_err());
        assert_eq!(
            Welcome::decode(
                4,
                &Welcome {
                    epoch: 1,
                    op: 1,
                    incarnation: 1,
                    failed: vec![5],
                    lives: vec![0],
                    life: 0,
                    restored: Vec::new(),
                    living: Vec::new(),
                }
                .encode()
            ),
            Err(NoticeError::BadRank { rank: 5, size: 4 })
        );
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64), size in 1u32..100) {
            let _ = Welcome::decode(size, &bytes);
            let _ = Refusal::decode(&bytes);
            let _ = decode_settled(&bytes);
            let _ = decode_request(&Bytes::from(bytes));
        }
    }
}
