//! Wire-up: how a DVM's daemons learn each other's addresses. Sans-IO.
//!
//! Every non-zero rank dials rank 0 (whose contact URI it was given) and reports its own URI
//! with the runtime tag [`TAG_WIREUP_REPORT`]. Rank 0 collects the reports in a
//! [`WireupCollector`]; once every rank has reported, or the wire-up timeout passed, it
//! floods the contact table ([`TAG_WIREUP_TABLE`]) down the tree (a `Kind::Xcast` frame, not a
//! fault-tolerant broadcast: see `docs/architecture.md`, "Wire-up"). Ranks that never
//! reported are listed as failed in the table, and the DVM starts without them.
//!
//! Table encoding (network byte order): `u32 size`, then for each rank in order
//! `u16 len` and `len` bytes of contact URI; `len == 0` marks a rank that never reported.

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
}

impl std::fmt::Display for WireupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireupError::Truncated => write!(f, "truncated wire-up message"),
            WireupError::WrongSize { got, expected } => {
                write!(f, "contact table for {got} daemons, expected {expected}")
            }
            WireupError::BadUri(e) => write!(f, "bad contact URI: {e}"),
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
    missing: usize,
}

impl WireupCollector {
    /// Starts collecting for a DVM of `size` daemons, knowing rank 0's own URI.
    pub fn new(size: u32, own: ContactUri) -> Self {
        let mut contacts = vec![None; size as usize];
        let mut missing = contacts.len();
        if let Some(slot) = contacts.get_mut(0) {
            *slot = Some(own);
            missing -= 1;
        }
        WireupCollector { contacts, missing }
    }

    /// Records one report; returns whether every rank has now reported. A repeated report
    /// replaces the earlier one.
    pub fn record(&mut self, uri: ContactUri) -> bool {
        if let Some(slot) = self.contacts.get_mut(uri.rank as usize) {
            if slot.is_none() {
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

    /// Encodes the table as it stands.
    pub fn encode(&self) -> Bytes {
        encode_table(&self.contacts)
    }

    /// The table as it stands.
    pub fn contacts(&self) -> &[Option<ContactUri>] {
        &self.contacts
    }
}

/// Encodes a contact table (see the module docs).
pub fn encode_table(contacts: &[Option<ContactUri>]) -> Bytes {
    let mut b = BytesMut::with_capacity(4 + contacts.len() * 48);
    b.put_u32(contacts.len() as u32);
    for c in contacts {
        match c {
            Some(uri) => {
                let s = uri.to_string();
                // A URI longer than u16::MAX cannot come from a real interface list; encode it
                // as missing rather than corrupt the table.
                if s.len() > u16::MAX as usize {
                    b.put_u16(0);
                } else {
                    b.put_u16(s.len() as u16);
                    b.put_slice(s.as_bytes());
                }
            }
            None => b.put_u16(0),
        }
    }
    b.freeze()
}

/// Decodes a contact table for a DVM of `size` daemons.
pub fn decode_table(size: u32, mut payload: &[u8]) -> Result<Vec<Option<ContactUri>>, WireupError> {
    let got = take_u32(&mut payload)?;
    if got != size {
        return Err(WireupError::WrongSize {
            got,
            expected: size,
        });
    }
    let mut out = Vec::with_capacity((size as usize).min(payload.len() / 2 + 1));
    for rank in 0..size {
        let len = take_u16(&mut payload)? as usize;
        if len == 0 {
            out.push(None);
            continue;
        }
        let (s, rest) = payload
            .split_at_checked(len)
            .ok_or(WireupError::Truncated)?;
        payload = rest;
        let s = std::str::from_utf8(s).map_err(|_| WireupError::BadUri("not UTF-8".into()))?;
        let uri: ContactUri = s.parse().map_err(|e| WireupError::BadUri(format!("{e}")))?;
        if uri.rank != rank {
            return Err(WireupError::BadUri(format!(
                "entry {rank} names rank {}",
                uri.rank
            )));
        }
        out.push(Some(uri));
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
    fn table_round_trip_with_a_missing_rank() {
        let mut c = WireupCollector::new(3, uri(0, 1000));
        assert!(!c.record(uri(2, 1002)));
        assert_eq!(c.missing(), vec![1]);
        let t = decode_table(3, &c.encode()).unwrap();
        assert_eq!(t, vec![Some(uri(0, 1000)), None, Some(uri(2, 1002))]);
        assert!(c.record(uri(1, 1001)));
    }

    #[test]
    fn bad_tables_are_errors_not_panics() {
        let good = encode_table(&[Some(uri(0, 1)), Some(uri(1, 2))]);
        assert_eq!(
            decode_table(3, &good),
            Err(WireupError::WrongSize {
                got: 2,
                expected: 3
            })
        );
        for cut in 0..good.len() {
            assert!(decode_table(2, &good[..cut]).is_err(), "cut at {cut}");
        }
        // Entries in the wrong order.
        let swapped = encode_table(&[Some(uri(1, 1)), Some(uri(0, 2))]);
        assert!(matches!(
            decode_table(2, &swapped),
            Err(WireupError::BadUri(_))
        ));
    }

    proptest::proptest! {
        /// Random, truncated and bit-flipped tables: an error or a table, never a panic.
        #[test]
        fn hostile_tables_never_panic(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
            flip in 0usize..4096,
            size in 1u32..64,
        ) {
            let _ = decode_table(size, &bytes);
            let mut good = encode_table(&[Some(uri(0, 1)), Some(uri(1, 2)), None]).to_vec();
            if let Some(b) = good.get_mut(flip / 8) {
                *b ^= 1 << (flip % 8);
            }
            let _ = decode_table(3, &good);
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
