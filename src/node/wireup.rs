//! Wire-up: how a DVM's daemons learn each other's addresses. Sans-IO.
//!
//! Every non-zero rank dials rank 0 (whose contact URI it was given) and reports its own URI
//! with the runtime tag [`TAG_WIREUP_REPORT`]. Rank 0 collects the reports in a
//! [`WireupCollector`]; once every rank has reported, or the wire-up timeout passed, it sends
//! each child a [`Slice`] of the contact table ([`TAG_WIREUP_TABLE`], a `Kind::Xcast` frame,
//! not a fault-tolerant broadcast: see `docs/architecture.md`, "Wire-up"), and every daemon
//! does the same for its own children. A child's slice holds the ranks that never reported
//! (listed as failed everywhere: the DVM starts without them), the contacts of its ancestors,
//! and the contacts of its subtree: what it needs to forward the slices and to repair its own
//! subtree. A daemon with `contacts = "full"` forwards every contact to every child instead.
//! Any other contact is looked up from rank 0 when it is first needed (`lookup.rs`).
//! `docs/wireup.md` has the costs.
//!
//! Slice encoding (network byte order): `u32 size`, `u32 n` and `n` × `u32` ranks that never
//! reported, then the contact entries: `u32 n` and `n` × (`u32 rank`, `u16 len`, `len` bytes of
//! contact URI).

use crate::Rank;
use crate::oob::uri::ContactUri;
use bytes::{BufMut, Bytes, BytesMut};

/// Runtime tag: a daemon's contact URI, sent to rank 0.
pub const TAG_WIREUP_REPORT: u32 = 1;
/// Runtime tag: the contact table, flooded down the tree by rank 0 (a `Kind::Xcast` frame).
pub const TAG_WIREUP_TABLE: u32 = 2;
/// Runtime tag: stop the DVM, an xcast operation of rank 0 (empty payload). (Tag 4, the old
/// unacknowledged broadcast request, is retired: requests travel as `grpcomm` messages.)
pub const TAG_SHUTDOWN: u32 = 3;

/// Why a wire-up message was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireupError {
    /// The payload ended early or a length field points past it.
    Truncated,
    /// The table is for a DVM of another size.
    WrongSize { got: u32, expected: u32 },
    /// A URI in the table or a report does not parse, or names another rank.
    BadUri(String),
    /// A list longer than the DVM.
    TooMany { n: u32, size: u32 },
    /// A rank not below the DVM's size.
    RankOutOfRange { rank: u32, size: u32 },
    /// A rank twice in one list.
    Repeated(u32),
    /// Bytes after the last field.
    Trailing,
}

impl std::fmt::Display for WireupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireupError::Truncated => write!(f, "truncated wire-up message"),
            WireupError::WrongSize { got, expected } => {
                write!(f, "contact table for {got} daemons, expected {expected}")
            }
            WireupError::BadUri(e) => write!(f, "bad contact URI: {e}"),
            WireupError::TooMany { n, size } => {
                write!(f, "a list of {n} ranks in a DVM of {size} daemons")
            }
            WireupError::RankOutOfRange { rank, size } => {
                write!(f, "rank {rank} in a DVM of {size} daemons")
            }
            WireupError::Repeated(r) => write!(f, "rank {r} listed twice"),
            WireupError::Trailing => write!(f, "bytes after the end of the message"),
        }
    }
}

impl std::error::Error for WireupError {}

/// Parses a report's payload and checks that it names the rank that sent it.
pub fn decode_report(origin: Rank, payload: &[u8]) -> Result<ContactUri, WireupError> {
    let s = std::str::from_utf8(payload).map_err(|_| WireupError::BadUri("not UTF-8".into()))?;
    let uri: ContactUri = s.parse().map_err(|e| WireupError::BadUri(format!("{e}")))?;
    if uri.rank != origin {
        return Err(WireupError::BadUri(format!(
            "report from rank {origin} names rank {}",
            uri.rank
        )));
    }
    Ok(uri)
}

/// Rank 0's collection of contact URIs.
pub struct WireupCollector {
    contacts: Vec<Option<ContactUri>>,
    /// Ranks below the initial size that have not reported.
    missing: usize,
    initial: usize,
}

impl WireupCollector {
    /// Starts collecting for a DVM of `size` daemons of which the first `initial` are started
    /// with it (the others are room to grow: absent unless they report in time), knowing rank
    /// 0's own URI.
    pub fn new(size: u32, initial: u32, own: ContactUri) -> Self {
        let mut contacts = vec![None; size as usize];
        let initial = (initial.clamp(1, size.max(1))) as usize;
        let mut missing = initial.min(contacts.len());
        if let Some(slot) = contacts.get_mut(0) {
            *slot = Some(own);
            missing -= 1;
        }
        WireupCollector {
            contacts,
            missing,
            initial,
        }
    }

    /// Records one report; returns whether every rank of the initial size has now reported.
    /// A repeated report replaces the earlier one.
    pub fn record(&mut self, uri: ContactUri) -> bool {
        let counted = (uri.rank as usize) < self.initial;
        if let Some(slot) = self.contacts.get_mut(uri.rank as usize) {
            if slot.is_none() && counted {
                self.missing -= 1;
            }
            *slot = Some(uri);
        }
        self.missing == 0
    }

    /// Ranks that have not reported yet.
    pub fn missing(&self) -> Vec<Rank> {
        self.contacts
            .iter()
            .enumerate()
            .filter(|(_, c)| c.is_none())
            .map(|(r, _)| r as Rank)
            .collect()
    }

    /// The table as it stands.
    pub fn contacts(&self) -> &[Option<ContactUri>] {
        &self.contacts
    }
}

/// A part of the contact table sent down the tree at wire-up (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Slice {
    /// Ranks that never reported: failed, everywhere.
    pub missing: Vec<Rank>,
    /// Contacts, each naming its own rank.
    pub entries: Vec<ContactUri>,
}

impl Slice {
    /// Encodes the slice for a DVM of `size` daemons.
    pub fn encode(&self, size: u32) -> Bytes {
        let mut b = BytesMut::with_capacity(12 + self.missing.len() * 4 + self.entries.len() * 48);
        b.put_u32(size);
        b.put_u32(self.missing.len() as u32);
        for r in &self.missing {
            b.put_u32(*r);
        }
        put_entries(&mut b, &self.entries);
        b.freeze()
    }

    /// Decodes a slice for a DVM of `size` daemons: every rank below `size`, no rank twice in
    /// a list, every entry's URI naming its rank.
    pub fn decode(size: u32, mut payload: &[u8]) -> Result<Slice, WireupError> {
        let got = take_u32(&mut payload)?;
        if got != size {
            return Err(WireupError::WrongSize {
                got,
                expected: size,
            });
        }
        let missing = take_ranks(&mut payload, size)?;
        let entries = take_entries(&mut payload, size)?;
        if !payload.is_empty() {
            return Err(WireupError::Trailing);
        }
        Ok(Slice { missing, entries })
    }
}

/// Appends `u32 n` and the `n` entries. A URI longer than `u16::MAX` bytes cannot come from a
/// real interface list; it is left out rather than corrupt the message (the rank's contact is
/// then looked up or missing).
pub fn put_entries(b: &mut BytesMut, entries: &[ContactUri]) {
    let texts: Vec<(Rank, String)> = entries
        .iter()
        .map(|u| (u.rank, u.to_string()))
        .filter(|(_, s)| s.len() <= u16::MAX as usize)
        .collect();
    b.put_u32(texts.len() as u32);
    for (rank, s) in texts {
        b.put_u32(rank);
        b.put_u16(s.len() as u16);
        b.put_slice(s.as_bytes());
    }
}

/// Reads `u32 n` and `n` entries (see [`put_entries`]) for a DVM of `size` daemons.
pub fn take_entries(p: &mut &[u8], size: u32) -> Result<Vec<ContactUri>, WireupError> {
    let n = take_u32(p)?;
    if n > size {
        return Err(WireupError::TooMany { n, size });
    }
    // Each entry takes at least 6 bytes: no allocation beyond what the payload can hold.
    let mut out = Vec::with_capacity((n as usize).min(p.len() / 6));
    let mut seen = std::collections::HashSet::with_capacity(out.capacity());
    for _ in 0..n {
        let rank = take_u32(p)?;
        if rank >= size {
            return Err(WireupError::RankOutOfRange { rank, size });
        }
        let len = take_u16(p)? as usize;
        let (s, rest) = p.split_at_checked(len).ok_or(WireupError::Truncated)?;
        *p = rest;
        let s = std::str::from_utf8(s).map_err(|_| WireupError::BadUri("not UTF-8".into()))?;
        let uri: ContactUri = s.parse().map_err(|e| WireupError::BadUri(format!("{e}")))?;
        if uri.rank != rank {
            return Err(WireupError::BadUri(format!(
                "entry {rank} names rank {}",
                uri.rank
            )));
        }
        if !seen.insert(rank) {
            return Err(WireupError::Repeated(rank));
        }
        out.push(uri);
    }
    Ok(out)
}

/// Reads `u32 n` and `n` distinct ranks below `size`.
pub fn take_ranks(p: &mut &[u8], size: u32) -> Result<Vec<Rank>, WireupError> {
    let n = take_u32(p)?;
    if n > size {
        return Err(WireupError::TooMany { n, size });
    }
    let mut out = Vec::with_capacity((n as usize).min(p.len() / 4));
    for _ in 0..n {
        let rank = take_u32(p)?;
        if rank >= size {
            return Err(WireupError::RankOutOfRange { rank, size });
        }
        out.push(rank);
    }
    let mut sorted = out.clone();
    sorted.sort_unstable();
    if let Some(&[r, _]) = sorted.windows(2).find(|w| matches!(w, [a, b] if a == b)) {
        return Err(WireupError::Repeated(r));
    }
    Ok(out)
}

fn take_u32(p: &mut &[u8]) -> Result<u32, WireupError> {
    let (h, rest) = p.split_first_chunk::<4>().ok_or(WireupError::Truncated)?;
    *p = rest;
    Ok(u32::from_be_bytes(*h))
}

fn take_u16(p: &mut &[u8]) -> Result<u16, WireupError> {
    let (h, rest) = p.split_first_chunk::<2>().ok_or(WireupError::Truncated)?;
    *p = rest;
    Ok(u16::from_be_bytes(*h))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(rank: Rank, port: u16) -> ContactUri {
        ContactUri {
            dvm_id: "t".into(),
            rank,
            addrs: vec![format!("127.0.0.1:{port}").parse().unwrap()],
        }
    }

    #[test]
    fn collector_lists_who_is_missing() {
        let mut c = WireupCollector::new(3, 3, uri(0, 1000));
        assert!(!c.record(uri(2, 1002)));
        assert_eq!(c.missing(), vec![1]);
        assert!(c.record(uri(1, 1001)));
        assert!(c.missing().is_empty());
    }

    #[test]
    fn slice_round_trip() {
        let s = Slice {
            missing: vec![3, 1],
            entries: vec![uri(0, 1000), uri(2, 1002)],
        };
        assert_eq!(Slice::decode(4, &s.encode(4)), Ok(s.clone()));
        assert_eq!(
            Slice::decode(4, &Slice::default().encode(4)),
            Ok(Slice::default())
        );
    }

    #[test]
    fn bad_slices_are_errors_not_panics() {
        let good = Slice {
            missing: vec![1],
            entries: vec![uri(0, 1), uri(2, 2)],
        }
        .encode(3);
        assert_eq!(
            Slice::decode(4, &good),
            Err(WireupError::WrongSize {
                got: 3,
                expected: 4
            })
        );
        for cut in 0..good.len() {
            assert!(Slice::decode(3, &good[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = good.to_vec();
        long.push(0);
        assert_eq!(Slice::decode(3, &long), Err(WireupError::Trailing));
        let twice = Slice {
            missing: vec![1, 1],
            entries: vec![],
        };
        assert_eq!(
            Slice::decode(3, &twice.encode(3)),
            Err(WireupError::Repeated(1))
        );
        let twice = Slice {
            missing: vec![],
            entries: vec![uri(2, 1), uri(2, 2)],
        };
        assert_eq!(
            Slice::decode(3, &twice.encode(3)),
            Err(WireupError::Repeated(2))
        );
        let outside = Slice {
            missing: vec![7],
            entries: vec![],
        };
        assert!(matches!(
            Slice::decode(3, &outside.encode(3)),
            Err(WireupError::RankOutOfRange { rank: 7, .. })
        ));
        // An entry whose URI names another rank.
        let mut b = BytesMut::new();
        b.put_u32(3);
        b.put_u32(0);
        b.put_u32(1);
        b.put_u32(2);
        let u = uri(1, 5).to_string();
        b.put_u16(u.len() as u16);
        b.put_slice(u.as_bytes());
        assert!(matches!(Slice::decode(3, &b), Err(WireupError::BadUri(_))));
        // A count larger than the DVM: refused before anything is allocated for it.
        let mut b = BytesMut::new();
        b.put_u32(3);
        b.put_u32(u32::MAX);
        assert!(matches!(
            Slice::decode(3, &b),
            Err(WireupError::TooMany { .. })
        ));
    }

    proptest::proptest! {
        /// Random, truncated and bit-flipped slices: an error or a slice, never a panic.
        #[test]
        fn hostile_slices_never_panic(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
            flip in 0usize..4096,
            size in 1u32..64,
        ) {
            let _ = Slice::decode(size, &bytes);
            let mut good = Slice { missing: vec![2], entries: vec![uri(0, 1), uri(1, 2)] }
                .encode(3)
                .to_vec();
            if let Some(b) = good.get_mut(flip / 8) {
                *b ^= 1 << (flip % 8);
            }
            let _ = Slice::decode(3, &good);
            let _ = decode_report(size - 1, &bytes);
        }
    }

    #[test]
    fn a_report_must_name_its_sender() {
        let u = uri(5, 9).to_string();
        assert!(decode_report(5, u.as_bytes()).is_ok());
        assert!(decode_report(4, u.as_bytes()).is_err());
        assert!(decode_report(4, &[0xff, 0xfe]).is_err());
    }
}
