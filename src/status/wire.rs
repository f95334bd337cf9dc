//! The status messages: plain runtime messages with tag [`super::TAG_STATUS`], between a
//! daemon and its children, and between a tool and the daemon it connected to. Layout
//! (big-endian): one kind byte, then the kind's fields. An optional rank or round trip is
//! `u32::MAX` when absent.
//!
//! | kind | message | fields |
//! |---|---|---|
//! | 1 | `Query` | id (u64), budget in ms (u32), all (u8 0/1), the asker's DVM epoch (u64), its failed count (u32), the asker's wall clock when it sent the query (i64 ns since the Unix epoch; `i64::MIN`: none) |
//! | 2 | `Answer` | id (u64), held in µs (u32), the answerer's wall clock when the query arrived and when it answered (i64 ns each; `i64::MIN`: none), truncated (u8), parts (u32 count, then each part) |
//! | 3 | `Report` (to a tool) | from (u32), size (u32), radix (u32), epoch (u64), elapsed µs (u64), truncated (u8), failed ranks (u32 count, u32 each), of them the departed and the absent (two lists alike, each ascending and among the failed), parts |
//! | 4 | `Refused` (to a tool) | reason (u16 length, UTF-8) |
//!
//! A part starts with its own kind byte: 1 daemon (rank, incarnation u64, epoch u64, parent,
//! depth, uptime ms u64, failed known, problems, children (u32 count, u32 each), links (u32
//! count; peer, rtt µs, queued bytes u64 each), counters, clock offset from the gathering
//! daemon (i64 ns, `i64::MIN`: none) and its bound (u64 ns, `u64::MAX`: none)), 2 healthy (root, daemons, height,
//! uptime ms min u64, rtt µs max, counters), 3 no answer (rank, parent), 4 elided (root,
//! daemons). Counters are thirteen u64 in the order of [`super::StatusCounters`]'s fields.

use super::{DaemonStatus, Healthy, LinkStatus, Part, Report, StatusCounters};
use crate::Rank;
use crate::limits::{
    STATUS_LINKS_MAX, STATUS_PARTS_MAX, STATUS_REASON_MAX, STATUS_REPORT_SIZE_MAX,
};
use bytes::{BufMut, Bytes, BytesMut};
use std::fmt;
use std::net::SocketAddr;

const NONE: u32 = u32::MAX;

/// A status message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    Query(Query),
    Answer(Answer),
    Report(Report),
    Refused(String),
}

/// A request for the status of the receiver's subtree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Query {
    /// The asker's number for this query (answers name it).
    pub id: u64,
    /// How long the receiver may take to answer.
    pub budget_ms: u32,
    /// Every daemon in detail.
    pub all: bool,
    /// The asker's DVM epoch and failed count (a tool sends zeros): a child whose view
    /// differs says so.
    pub epoch: u64,
    pub failed: u32,
    /// The asker's wall clock (ns since the Unix epoch) when it sent the query, if it has
    /// one (a tool sends none): the first of the four timestamps of a clock sample.
    pub sent_ns: Option<i64>,
}

/// A subtree's status, for the daemon that asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub id: u64,
    /// How long the answering daemon held the query (its asker subtracts it from the round
    /// trip it measured).
    pub held_us: u32,
    /// The answerer's wall clock when the query arrived and when it answered (the second
    /// and third timestamps of the clock sample; the asker reads the fourth).
    pub received_ns: Option<i64>,
    pub answered_ns: Option<i64>,
    pub truncated: bool,
    pub parts: Vec<Part>,
}

/// A status message that does not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusWireError(pub &'static str);

impl fmt::Display for StatusWireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed status message: {}", self.0)
    }
}

impl std::error::Error for StatusWireError {}

/// Encoded bytes of one link of a daemon part: peer, round trip, queue, address, failovers.
fn link_len(l: &LinkStatus) -> usize {
    let address = match l.address {
        None => 1,
        Some(SocketAddr::V4(_)) => 1 + 4 + 2,
        Some(SocketAddr::V6(_)) => 1 + 16 + 2,
    };
    4 + 4 + 8 + address + 8
}

/// Encoded bytes of one part (for the answer's size bound).
pub fn part_len(p: &Part) -> usize {
    const COUNTERS: usize = 13 * 8;
    match p {
        Part::Daemon(d) => {
            1 + 4
                + 8
                + 8
                + 4
                + 4
                + 8
                + 4
                + 4
                + 4
                + 4 * d.children.len()
                + 4
                + d.links.iter().map(link_len).sum::<usize>()
                + COUNTERS
                + 16
        }
        Part::Healthy(_) => 1 + 4 + 4 + 4 + 8 + 4 + COUNTERS,
        Part::NoAnswer { .. } | Part::Elided { .. } => 1 + 8,
    }
}

impl Msg {
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::new();
        match self {
            Msg::Query(q) => {
                b.put_u8(1);
                b.put_u64(q.id);
                b.put_u32(q.budget_ms);
                b.put_u8(u8::from(q.all));
                b.put_u64(q.epoch);
                b.put_u32(q.failed);
                put_ns(&mut b, q.sent_ns);
            }
            Msg::Answer(a) => {
                b.put_u8(2);
                b.put_u64(a.id);
                b.put_u32(a.held_us);
                put_ns(&mut b, a.received_ns);
                put_ns(&mut b, a.answered_ns);
                b.put_u8(u8::from(a.truncated));
                put_parts(&mut b, &a.parts);
            }
            Msg::Report(r) => {
                b.put_u8(3);
                b.put_u32(r.from);
                b.put_u32(r.size);
                b.put_u32(r.radix);
                b.put_u64(r.epoch);
                b.put_u64(r.elapsed_us);
                b.put_u8(u8::from(r.truncated));
                for list in [&r.failed, &r.departed, &r.absent] {
                    put_len(&mut b, list.len());
                    for f in list {
                        b.put_u32(*f);
                    }
                }
                put_parts(&mut b, &r.parts);
            }
            Msg::Refused(why) => {
                b.put_u8(4);
                let mut cut = why.len().min(STATUS_REASON_MAX);
                while !why.is_char_boundary(cut) {
                    cut -= 1;
                }
                let why = why.get(..cut).unwrap_or("");
                // At most STATUS_REASON_MAX (< 65,536) bytes.
                b.put_u16(why.len() as u16);
                b.put_slice(why.as_bytes());
            }
        }
        b.freeze()
    }

    /// Decodes a message between daemons of a DVM of `size` (every rank is checked against
    /// it; a `Report`'s own size is used for its parts).
    pub fn decode(payload: &[u8], size: u32) -> Result<Msg, StatusWireError> {
        let mut r = Reader { buf: payload };
        let msg = match r.u8()? {
            1 => Msg::Query(Query {
                id: r.u64()?,
                budget_ms: r.u32()?,
                all: r.bool()?,
                epoch: r.u64()?,
                failed: r.u32()?,
                sent_ns: r.ns()?,
            }),
            2 => {
                let id = r.u64()?;
                let held_us = r.u32()?;
                let received_ns = r.ns()?;
                let answered_ns = r.ns()?;
                let truncated = r.bool()?;
                let parts = r.parts(size)?;
                Msg::Answer(Answer {
                    id,
                    held_us,
                    received_ns,
                    answered_ns,
                    truncated,
                    parts,
                })
            }
            3 => {
                let from = r.u32()?;
                let size = r.u32()?;
                if size == 0 || from >= size {
                    return Err(StatusWireError("report from a rank beyond its size"));
                }
                if size > STATUS_REPORT_SIZE_MAX {
                    return Err(StatusWireError("report of a DVM larger than a tool takes"));
                }
                let radix = r.u32()?;
                let epoch = r.u64()?;
                let elapsed_us = r.u64()?;
                let truncated = r.bool()?;
                let n = r.count(size as usize)?;
                let mut failed = Vec::with_capacity(n);
                for _ in 0..n {
                    failed.push(r.rank(size)?);
                }
                let mut sorted = failed.clone();
                sorted.sort_unstable();
                let mut subsets = [Vec::new(), Vec::new()];
                for list in &mut subsets {
                    let n = r.count(size as usize)?;
                    let mut last = None;
                    for _ in 0..n {
                        let rank = r.rank(size)?;
                        if last.is_some_and(|l| rank <= l) || sorted.binary_search(&rank).is_err() {
                            return Err(StatusWireError(
                                "departed or absent ranks not ascending among the failed",
                            ));
                        }
                        last = Some(rank);
                        list.push(rank);
                    }
                }
                let [departed, absent] = subsets;
                let parts = r.parts(size)?;
                Msg::Report(Report {
                    from,
                    size,
                    radix,
                    epoch,
                    failed,
                    departed,
                    absent,
                    elapsed_us,
                    truncated,
                    parts,
                })
            }
            4 => {
                let len = usize::from(r.u16()?);
                if len > STATUS_REASON_MAX {
                    return Err(StatusWireError("reason too long"));
                }
                let bytes = r.take(len)?;
                let why =
                    std::str::from_utf8(bytes).map_err(|_| StatusWireError("reason not UTF-8"))?;
                Msg::Refused(why.to_owned())
            }
            _ => return Err(StatusWireError("unknown kind")),
        };
        if !r.buf.is_empty() {
            return Err(StatusWireError("trailing bytes"));
        }
        Ok(msg)
    }
}

fn put_len(b: &mut BytesMut, n: usize) {
    // Every list is bounded far below u32::MAX (STATUS_PARTS_MAX, STATUS_LINKS_MAX, a size).
    b.put_u32(u32::try_from(n).unwrap_or(u32::MAX));
}

fn put_opt(b: &mut BytesMut, v: Option<u32>) {
    b.put_u32(v.unwrap_or(NONE));
}

/// An address: a family byte (0 none, 4, 6), its octets, its port.
fn put_addr(b: &mut BytesMut, v: Option<SocketAddr>) {
    match v {
        None => b.put_u8(0),
        Some(SocketAddr::V4(a)) => {
            b.put_u8(4);
            b.put_slice(&a.ip().octets());
            b.put_u16(a.port());
        }
        Some(SocketAddr::V6(a)) => {
            b.put_u8(6);
            b.put_slice(&a.ip().octets());
            b.put_u16(a.port());
        }
    }
}

fn put_ns(b: &mut BytesMut, v: Option<i64>) {
    b.put_i64(v.unwrap_or(i64::MIN));
}

fn put_counters(b: &mut BytesMut, c: &StatusCounters) {
    for v in [
        c.sent,
        c.delivered,
        c.relayed,
        c.stream_bytes_sent,
        c.stream_bytes_received,
        c.relm_unacked,
        c.relm_cached,
        c.relm_pending,
        c.streams_producing,
        c.streams_consuming,
        c.direct_links,
        c.protocol_errors,
        c.repairs,
    ] {
        b.put_u64(v);
    }
}

fn put_parts(b: &mut BytesMut, parts: &[Part]) {
    put_len(b, parts.len());
    for p in parts {
        match p {
            Part::Daemon(d) => {
                b.put_u8(1);
                b.put_u32(d.rank);
                b.put_u64(d.incarnation);
                b.put_u64(d.epoch);
                put_opt(b, d.parent);
                b.put_u32(d.depth);
                b.put_u64(d.uptime_ms);
                b.put_u32(d.failed_known);
                b.put_u32(d.problems);
                put_len(b, d.children.len());
                for c in &d.children {
                    b.put_u32(*c);
                }
                put_len(b, d.links.len());
                for l in &d.links {
                    b.put_u32(l.peer);
                    put_opt(b, l.rtt_us);
                    b.put_u64(l.queued_bytes);
                    put_addr(b, l.address);
                    b.put_u64(l.failovers);
                }
                put_counters(b, &d.counters);
                put_ns(b, d.clock_offset_ns);
                b.put_u64(d.clock_bound_ns.unwrap_or(u64::MAX));
            }
            Part::Healthy(h) => {
                b.put_u8(2);
                b.put_u32(h.root);
                b.put_u32(h.daemons);
                b.put_u32(h.height);
                b.put_u64(h.uptime_ms_min);
                put_opt(b, h.rtt_us_max);
                put_counters(b, &h.counters);
            }
            Part::NoAnswer { rank, parent } => {
                b.put_u8(3);
                b.put_u32(*rank);
                b.put_u32(*parent);
            }
            Part::Elided { root, daemons } => {
                b.put_u8(4);
                b.put_u32(*root);
                b.put_u32(*daemons);
            }
        }
    }
}

/// A cursor that checks every read against what is left.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], StatusWireError> {
        if n > self.buf.len() {
            return Err(StatusWireError("truncated"));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], StatusWireError> {
        self.take(N)?
            .try_into()
            .map_err(|_| StatusWireError("truncated"))
    }

    fn u8(&mut self) -> Result<u8, StatusWireError> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, StatusWireError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, StatusWireError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, StatusWireError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    fn bool(&mut self) -> Result<bool, StatusWireError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(StatusWireError("a flag neither 0 nor 1")),
        }
    }

    fn rank(&mut self, size: u32) -> Result<Rank, StatusWireError> {
        match self.u32()? {
            r if r < size => Ok(r),
            _ => Err(StatusWireError("a rank beyond the DVM's size")),
        }
    }

    fn opt_rank(&mut self, size: u32) -> Result<Option<Rank>, StatusWireError> {
        match self.u32()? {
            NONE => Ok(None),
            r if r < size => Ok(Some(r)),
            _ => Err(StatusWireError("a rank beyond the DVM's size")),
        }
    }

    fn ns(&mut self) -> Result<Option<i64>, StatusWireError> {
        Ok(Some(i64::from_be_bytes(self.array()?)).filter(|v| *v != i64::MIN))
    }

    fn addr(&mut self) -> Result<Option<SocketAddr>, StatusWireError> {
        Ok(match self.u8()? {
            0 => None,
            4 => {
                let ip: [u8; 4] = self.array()?;
                Some(SocketAddr::from((ip, self.u16()?)))
            }
            6 => {
                let ip: [u8; 16] = self.array()?;
                Some(SocketAddr::from((ip, self.u16()?)))
            }
            _ => return Err(StatusWireError("an address of no known family")),
        })
    }

    fn opt(&mut self) -> Result<Option<u32>, StatusWireError> {
        Ok(Some(self.u32()?).filter(|v| *v != NONE))
    }

    /// A list length: at most `max`, and no more entries than bytes left (each is at least
    /// one byte), so a forged count allocates nothing.
    fn count(&mut self, max: usize) -> Result<usize, StatusWireError> {
        let n = self.u32()? as usize;
        if n > max || n > self.buf.len() {
            return Err(StatusWireError("a list longer than its bound"));
        }
        Ok(n)
    }

    fn counters(&mut self) -> Result<StatusCounters, StatusWireError> {
        Ok(StatusCounters {
            sent: self.u64()?,
            delivered: self.u64()?,
            relayed: self.u64()?,
            stream_bytes_sent: self.u64()?,
            stream_bytes_received: self.u64()?,
            relm_unacked: self.u64()?,
            relm_cached: self.u64()?,
            relm_pending: self.u64()?,
            streams_producing: self.u64()?,
            streams_consuming: self.u64()?,
            direct_links: self.u64()?,
            protocol_errors: self.u64()?,
            repairs: self.u64()?,
        })
    }

    fn parts(&mut self, size: u32) -> Result<Vec<Part>, StatusWireError> {
        let n = self.count(STATUS_PARTS_MAX)?;
        let links_max = STATUS_LINKS_MAX.min(size as usize);
        let mut parts = Vec::with_capacity(n);
        for _ in 0..n {
            let part = match self.u8()? {
                1 => {
                    let rank = self.rank(size)?;
                    let incarnation = self.u64()?;
                    let epoch = self.u64()?;
                    let parent = self.opt_rank(size)?;
                    let depth = self.u32()?;
                    let uptime_ms = self.u64()?;
                    let failed_known = self.u32()?;
                    let problems = self.u32()?;
                    let nc = self.count(links_max)?;
                    let mut children = Vec::with_capacity(nc);
                    for _ in 0..nc {
                        children.push(self.rank(size)?);
                    }
                    let nl = self.count(links_max)?;
                    let mut links = Vec::with_capacity(nl);
                    for _ in 0..nl {
                        links.push(LinkStatus {
                            peer: self.rank(size)?,
                            rtt_us: self.opt()?,
                            queued_bytes: self.u64()?,
                            address: self.addr()?,
                            failovers: self.u64()?,
                        });
                    }
                    Part::Daemon(Box::new(DaemonStatus {
                        rank,
                        incarnation,
                        epoch,
                        parent,
                        children,
                        depth,
                        uptime_ms,
                        failed_known,
                        problems,
                        links,
                        counters: self.counters()?,
                        clock_offset_ns: self.ns()?,
                        clock_bound_ns: Some(self.u64()?).filter(|v| *v != u64::MAX),
                    }))
                }
                2 => Part::Healthy(Healthy {
                    root: self.rank(size)?,
                    daemons: self.u32()?,
                    height: self.u32()?,
                    uptime_ms_min: self.u64()?,
                    rtt_us_max: self.opt()?,
                    counters: self.counters()?,
                }),
                3 => Part::NoAnswer {
                    rank: self.rank(size)?,
                    parent: self.rank(size)?,
                },
                4 => Part::Elided {
                    root: self.rank(size)?,
                    daemons: self.u32()?,
                },
                _ => return Err(StatusWireError("unknown part")),
            };
            parts.push(part);
        }
        Ok(parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn daemon(rank: Rank) -> Part {
        Part::Daemon(Box::new(DaemonStatus {
            rank,
            incarnation: 7,
            epoch: 2,
            parent: Some(0),
            children: vec![3, 4],
            depth: 1,
            uptime_ms: 1234,
            failed_known: 1,
            problems: super::super::problem::CHILD_SILENT,
            links: vec![
                LinkStatus {
                    peer: 3,
                    rtt_us: Some(80),
                    queued_bytes: 0,
                    address: Some("10.78.0.3:7000".parse().unwrap()),
                    failovers: 2,
                },
                LinkStatus {
                    peer: 0,
                    rtt_us: None,
                    queued_bytes: 1 << 20,
                    address: Some("[fd00::1]:7001".parse().unwrap()),
                    failovers: 0,
                },
            ],
            counters: StatusCounters {
                sent: 1,
                repairs: 13,
                ..Default::default()
            },
            clock_offset_ns: None,
            clock_bound_ns: None,
        }))
    }

    #[test]
    fn every_message_round_trips() {
        let parts = vec![
            daemon(1),
            Part::Healthy(Healthy {
                root: 3,
                daemons: 4,
                height: 1,
                uptime_ms_min: 9,
                rtt_us_max: None,
                counters: StatusCounters::default(),
            }),
            Part::NoAnswer { rank: 4, parent: 1 },
            Part::Elided {
                root: 5,
                daemons: 2,
            },
        ];
        let msgs = [
            Msg::Query(Query {
                id: 9,
                budget_ms: 2000,
                all: true,
                epoch: 3,
                failed: 1,
                sent_ns: Some(-5),
            }),
            Msg::Answer(Answer {
                id: 9,
                held_us: 77,
                received_ns: Some(i64::MAX),
                answered_ns: None,
                truncated: true,
                parts: parts.clone(),
            }),
            Msg::Report(Report {
                from: 0,
                size: 8,
                radix: 2,
                epoch: 3,
                failed: vec![5, 6, 7],
                departed: vec![5],
                absent: vec![6, 7],
                elapsed_us: 500,
                truncated: false,
                parts: parts.clone(),
            }),
            Msg::Refused("busy".into()),
        ];
        for m in msgs {
            let b = m.encode();
            assert_eq!(Msg::decode(&b, 8).unwrap(), m);
            // Every strict prefix is refused, never a panic.
            for cut in 0..b.len() {
                assert!(Msg::decode(&b[..cut], 8).is_err(), "prefix {cut} of {m:?}");
            }
        }
        let encoded: usize = parts.iter().map(part_len).sum();
        let answer = Msg::Answer(Answer {
            id: 1,
            held_us: 0,
            received_ns: None,
            answered_ns: None,
            truncated: false,
            parts,
        });
        assert_eq!(answer.encode().len(), 1 + 8 + 4 + 16 + 1 + 4 + encoded);
    }

    #[test]
    fn ranks_beyond_the_size_and_forged_counts_are_refused() {
        let b = Msg::Answer(Answer {
            id: 1,
            held_us: 0,
            received_ns: None,
            answered_ns: None,
            truncated: false,
            parts: vec![daemon(1)],
        })
        .encode();
        assert!(Msg::decode(&b, 4).is_err(), "child 4 of a DVM of 4");
        let mut forged = BytesMut::new();
        forged.put_u8(2);
        forged.put_u64(1);
        forged.put_u32(0);
        forged.put_i64(i64::MIN);
        forged.put_i64(i64::MIN);
        forged.put_u8(0);
        forged.put_u32(u32::MAX);
        assert_eq!(
            Msg::decode(&forged, 8),
            Err(StatusWireError("a list longer than its bound"))
        );
        // A report claiming an enormous DVM (its view would allocate an entry per rank).
        let mut huge = BytesMut::new();
        huge.put_u8(3);
        huge.put_u32(0);
        huge.put_u32(u32::MAX);
        assert_eq!(
            Msg::decode(&huge, 8),
            Err(StatusWireError("report of a DVM larger than a tool takes"))
        );
    }
}
