//! The node's side of streams (issue "Streams", step 2): the stream cores of `src/stream/`
//! carried between daemons as runtime messages (tag [`TAG_STREAM`]) by the route a user
//! message takes (a direct link when one is open or negotiated under the route setting, else
//! the tree), services registered here, and what faults mean for streams: the death of the
//! other end fails a stream, and a consumer whose path may have lost chunks (a repair that
//! failed a rank, its direct link to the producer lost) resumes at the byte it stands at.
//!
//! The application side is the driver's: `driver/serve.rs` (`Handle::serve`, `fetch`) issues
//! [`StreamCommand`]s through the loop, and `driver/event_loop/streams.rs` hands the
//! [`StreamEvent`]s to service handlers, writers and readers; the simulator plays both
//! applications itself (`sim/world/streams.rs`).

use super::{Node, Output};
use crate::Rank;
use crate::direct::Route;
use crate::error::SendError;
use crate::fxhash::{FxHashMap, FxHashSet};
use crate::limits::STREAM_WINDOW_MAX;
use crate::rml::{Message, Tag};
use crate::stream::{Incoming, Outgoing, Status, StreamError, StreamMsg};
use bytes::Bytes;
use std::time::{Duration, Instant};

/// The runtime tag of stream messages.
pub const TAG_STREAM: Tag = 14;

/// A producer's `Fail` code meaning "no such service" (reported as
/// [`StreamError::NoService`]).
pub const FAIL_NO_SERVICE: u32 = u32::MAX;
/// A producer's `Fail` code meaning "no room for another stream here".
pub const FAIL_NO_ROOM: u32 = u32::MAX - 1;
/// A producer's `Fail` code meaning "the producer's daemon stops" (reported as
/// [`StreamError::ProducerDied`], at once rather than once the stop is found as a death).
/// (`u32::MAX - 2` is the driver's `FAIL_ABANDONED`.)
pub const FAIL_STOPPED: u32 = u32::MAX - 3;

/// What the application asks of streams.
#[derive(Debug)]
pub enum StreamCommand {
    /// Offer `service` to consumers.
    Serve { service: String },
    /// Fetch `request` from `service` at `producer` as stream `id` (the caller's, unique among
    /// its streams), granting `window` bytes at a time, failing after `idle` without news;
    /// with `route`, the stream's messages both ways take that route instead of the daemons'
    /// `route` settings. With `reader_checks`, each chunk's digest is left to the
    /// application, which gets it with the chunk ([`StreamEvent::Data`]'s `check`) and reports
    /// a mismatch with [`StreamCommand::Corrupt`].
    Fetch {
        id: u64,
        producer: Rank,
        service: String,
        request: Bytes,
        window: u32,
        idle: Duration,
        route: Option<Route>,
        reader_checks: bool,
    },
    /// The producer writes `bytes` on stream (`consumer`, `id`): all of them, within its room
    /// ([`StreamEvent::Room`]), or none (`Busy`). `digest`: the chunk's digest made by the
    /// caller (see [`crate::stream::ChunkDigest`]), or `None` to have it made here.
    Write {
        consumer: Rank,
        id: u64,
        bytes: Bytes,
        digest: Option<crate::stream::ChunkDigest>,
    },
    /// The producer ends the stream: finished (`None`) or failed with a code and a reason.
    End {
        consumer: Rank,
        id: u64,
        failure: Option<(u32, String)>,
    },
    /// The consumer's application took `n` more bytes of stream `id`.
    Consumed { id: u64, n: u64 },
    /// The consumer's application found the chunk of stream `id` at `offset` corrupt (its
    /// digest did not match; streams fetched with `reader_checks`): the stream fails.
    Corrupt { id: u64, offset: u64 },
    /// The consumer gives stream `id` up.
    Cancel { id: u64 },
}

/// What streams tell the application.
#[derive(Debug, PartialEq, Eq)]
pub enum StreamEvent {
    /// Producer: `consumer` asks `service` for `request` from byte `offset` as stream `id`.
    Opened {
        consumer: Rank,
        id: u64,
        service: String,
        request: Bytes,
        offset: u64,
    },
    /// Producer: stream (`consumer`, `id`) may take bytes below offset `upto` (the consumer's
    /// credit; it only grows).
    Room { consumer: Rank, id: u64, upto: u64 },
    /// Producer: stream (`consumer`, `id`) is over (`why`: cancelled, also when its consumer
    /// moved it to a new id; its consumer died; it broke the protocol): writes to it fail
    /// from now on.
    Stopped {
        consumer: Rank,
        id: u64,
        why: StreamError,
    },
    /// Consumer: the next bytes of stream `id`, in order. `check`: for a stream fetched with
    /// `reader_checks`, the digest the application must find for them (else they are
    /// checked already).
    Data {
        id: u64,
        bytes: Bytes,
        check: Option<crate::stream::ChunkDigest>,
    },
    /// Consumer: stream `id` ended.
    Ended {
        id: u64,
        result: Result<(), StreamError>,
    },
}

/// Streams at one daemon, each table bounded by `limits::STREAMS_MAX`.
#[derive(Debug, Default)]
pub(super) struct Streams {
    services: FxHashSet<String>,
    outgoing: FxHashMap<(Rank, u64), Outgoing>,
    /// Wire id -> (the application's id, the stream).
    incoming: FxHashMap<u64, (u64, Incoming)>,
    /// The application's id -> wire id.
    wire_of: FxHashMap<u64, u64>,
    next_wire: u64,
    /// Ranks whose failure streams already answered (a local repair and rank 0's
    /// confirmation name the same death: one resume). At most the DVM's size.
    answered: FxHashSet<Rank>,
    stats: crate::StreamCounters,
    /// The buffers chunks are encoded into (bounded; shared with the frames in flight).
    pool: std::sync::Arc<crate::stream::BufferPool>,
    /// Produced streams with data waiting to be released (at most `STREAMS_MAX`: keys of
    /// `outgoing`), in order for a fair round robin.
    held: std::collections::BTreeSet<(Rank, u64)>,
    /// The stream [`Node::streams_release`] served last (the next call starts after it).
    release_cursor: (Rank, u64),
    /// Data bytes released towards each next hop since the driver last reported that hop's
    /// queue: at most about `STREAM_RELEASE_BYTES` each (one chunk more), so that releases
    /// between two reports (one per command of a busy turn) cannot fill a queue past flow
    /// control's view of it. Entries go at the report, and when the link ends.
    unreported: FxHashMap<Rank, usize>,
    /// Messages of streams this daemon both produces and consumes, for the next pump. Bounded
    /// as on a link: data by the streams' credit, the rest a few messages per stream.
    local: std::collections::VecDeque<Bytes>,
}

impl Streams {
    /// The bounds of every stream here and of the tables.
    pub(super) fn check_invariants(&self) -> Result<(), String> {
        if self.outgoing.len() > crate::limits::STREAMS_MAX
            || self.incoming.len() > crate::limits::STREAMS_MAX
            || self.wire_of.len() != self.incoming.len()
        {
            return Err("stream tables beyond their bounds or out of step".into());
        }
        for s in self.outgoing.values() {
            s.check_invariants()?;
        }
        for (_, s) in self.incoming.values() {
            s.check_invariants()?;
        }
        let windows: u64 = self.incoming.values().map(|(_, s)| s.window()).sum();
        if windows > crate::limits::STREAM_WINDOWS_TOTAL_MAX {
            return Err(format!("stream windows of {windows} bytes fetched at once"));
        }
        Ok(())
    }

    /// Whether a stream is open at this end, produced or consumed.
    pub(super) fn any_open(&self) -> bool {
        !self.outgoing.is_empty() || !self.incoming.is_empty()
    }

    pub(super) fn counters(&self) -> crate::StreamCounters {
        let mut c = self.stats.clone();
        c.producing = self.outgoing.len() as u64;
        c.consuming = self.incoming.len() as u64;
        c
    }

    /// When the next consumer idle timeout is due.
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        // Asked once per loop turn: an empty table (the common case) is not scanned.
        if self.incoming.is_empty() {
            return None;
        }
        self.incoming
            .values()
            .filter_map(|(_, s)| s.poll_timeout())
            .min()
    }
}

/// A service name must fit its wire field (`limits::STREAM_SERVICE_MAX` bytes): a longer one
/// would be cut there and name another service.
fn check_service(service: &str) -> Result<(), SendError> {
    if service.len() > crate::limits::STREAM_SERVICE_MAX {
        return Err(SendError::TooLarge {
            len: service.len(),
            max: crate::limits::STREAM_SERVICE_MAX,
        });
    }
    Ok(())
}

impl Node {
    /// A stream command from the application. `Err` when it is refused: a service name or
    /// request beyond its bound (`TooLarge`), a full table or no room on the stream (`Busy`),
    /// a producer out of range or dead, an id already in use.
    pub fn handle_stream(&mut self, now: Instant, c: StreamCommand) -> Result<(), SendError> {
        if self.stopping.is_some() {
            return Err(SendError::ShutDown);
        }
        match c {
            StreamCommand::Serve { service } => {
                check_service(&service)?;
                if self.streams.services.len() >= crate::limits::STREAM_SERVICES_MAX {
                    return Err(SendError::Busy(crate::error::Limit::ServiceTable));
                }
                self.streams.services.insert(service);
            }
            StreamCommand::Fetch {
                id,
                producer,
                service,
                request,
                window,
                idle,
                route,
                reader_checks,
            } => {
                self.check_rank(producer)?;
                if self.streams.wire_of.contains_key(&id) {
                    return Err(SendError::DuplicateId(id));
                }
                if self.streams.incoming.len() >= crate::limits::STREAMS_MAX {
                    return Err(SendError::Busy(crate::error::Limit::StreamTable));
                }
                let windows: u64 = self
                    .streams
                    .incoming
                    .values()
                    .map(|(_, s)| s.window())
                    .sum();
                let window_clamped = u64::from(window).clamp(1, STREAM_WINDOW_MAX as u64);
                if windows + window_clamped > crate::limits::STREAM_WINDOWS_TOTAL_MAX {
                    return Err(SendError::Busy(crate::error::Limit::StreamWindows));
                }
                check_service(&service)?;
                if request.len() > crate::limits::STREAM_REQUEST_MAX {
                    return Err(SendError::TooLarge {
                        len: request.len(),
                        max: crate::limits::STREAM_REQUEST_MAX,
                    });
                }
                let wire = self.next_wire_id();
                self.streams.stats.fetched += 1;
                let s = Incoming::open(now, wire, producer, &service, request, window, idle)
                    .with_route(route)
                    .with_reader_checks(reader_checks);
                self.streams.wire_of.insert(id, wire);
                self.streams.incoming.insert(wire, (id, s));
                self.flush_incoming(now, wire);
            }
            StreamCommand::Write {
                consumer,
                id,
                bytes,
                digest,
            } => {
                let s = self.produced(consumer, id)?;
                if (bytes.len() as u64) > s.room() {
                    return Err(SendError::Busy(crate::error::Limit::StreamCredit));
                }
                let mut b = bytes;
                s.write_chunk(&mut b, digest)
                    .map_err(|_| SendError::Busy(crate::error::Limit::StreamCredit))?;
                self.flush_outgoing(now, consumer, id);
            }
            StreamCommand::End {
                consumer,
                id,
                failure,
            } => {
                let s = self.produced(consumer, id)?;
                let r = match failure {
                    None => s.finish(),
                    Some((code, reason)) => s.fail(code, &reason),
                };
                r.map_err(|_| SendError::Busy(crate::error::Limit::StreamCredit))?;
                self.flush_outgoing(now, consumer, id);
            }
            StreamCommand::Consumed { id, n } => {
                if let Some(wire) = self.streams.wire_of.get(&id).copied() {
                    if let Some((_, s)) = self.streams.incoming.get_mut(&wire) {
                        s.consumed(now, n);
                    }
                    self.flush_incoming(now, wire);
                }
            }
            StreamCommand::Corrupt { id, offset } => match self.streams.wire_of.get(&id) {
                Some(&wire) => {
                    if let Some((_, s)) = self.streams.incoming.get_mut(&wire) {
                        s.handle_corrupt(offset);
                    }
                    self.flush_incoming(now, wire);
                }
                None => {
                    // Its end was checked and counted finished before the reader came to
                    // the chunk: counted failed too, as the reader reports it.
                    self.streams.stats.failed += 1;
                    log::warn!(
                        "rank {}: the reader of stream {id} found its chunk at {offset} corrupt \
                         after the stream ended",
                        self.me
                    );
                }
            },
            StreamCommand::Cancel { id } => {
                if let Some(wire) = self.streams.wire_of.get(&id).copied() {
                    if let Some((_, s)) = self.streams.incoming.get_mut(&wire) {
                        s.cancel();
                    }
                    self.flush_incoming(now, wire);
                }
            }
        }
        Ok(())
    }

    /// The stream (`consumer`, `id`) this daemon produces; `Busy` once it is over (its
    /// consumer cancelled, died or moved it to a new id).
    fn produced(&mut self, consumer: Rank, id: u64) -> Result<&mut Outgoing, SendError> {
        self.streams
            .outgoing
            .get_mut(&(consumer, id))
            .ok_or(SendError::Busy(crate::error::Limit::StreamCredit))
    }

    fn check_rank(&self, r: Rank) -> Result<(), SendError> {
        if r >= self.size {
            return Err(SendError::RankOutOfRange {
                rank: r,
                size: self.size,
            });
        }
        if self.routing.is_failed(r) {
            return Err(SendError::NodeDown(r));
        }
        Ok(())
    }

    fn next_wire_id(&mut self) -> u64 {
        self.streams.next_wire = self.streams.next_wire.wrapping_add(1);
        self.streams.next_wire
    }

    fn send_stream(
        &mut self,
        now: Instant,
        to: Rank,
        id: u64,
        m: &StreamMsg,
        route: Option<Route>,
    ) {
        if self.routing.is_failed(to) {
            return;
        }
        if to == self.me {
            // A stream between two applications of this daemon: handled at the next pump
            // (never from inside the handling of another of its messages).
            self.streams
                .local
                .push_back(m.encode_pooled(id, &self.streams.pool));
            return;
        }
        let payload = m.encode_parts(id);
        self.send_routed(now, to, TAG_STREAM, payload, None, route);
    }

    /// Sends what a consumer's stream has for its producer; reports its end, if it ended.
    fn flush_incoming(&mut self, now: Instant, wire: u64) {
        let Some((_, s)) = self.streams.incoming.get_mut(&wire) else {
            return;
        };
        let (producer, route) = (s.producer(), s.route());
        let mut msgs = Vec::new();
        while let Some(m) = s.poll_msg() {
            msgs.push(m);
        }
        for m in &msgs {
            self.send_stream(now, producer, wire, m, route);
        }
        self.end_if_over(wire);
    }

    fn end_if_over(&mut self, wire: u64) {
        let over = match self.streams.incoming.get(&wire) {
            Some((_, s)) => s.status() != &Status::Streaming,
            None => false,
        };
        if !over {
            return;
        }
        if let Some((id, s)) = self.streams.incoming.remove(&wire) {
            self.streams.wire_of.remove(&id);
            match s.status() {
                Status::Finished => self.streams.stats.finished += 1,
                _ => self.streams.stats.failed += 1,
            }
            let result = match s.status() {
                Status::Finished => Ok(()),
                Status::Failed(StreamError::Producer { code, reason })
                    if *code == FAIL_NO_SERVICE =>
                {
                    Err(StreamError::NoService(reason.clone()))
                }
                Status::Failed(StreamError::Producer { code, .. }) if *code == FAIL_STOPPED => {
                    Err(StreamError::ProducerDied(s.producer()))
                }
                Status::Failed(e) => Err(e.clone()),
                Status::Streaming => return,
            };
            self.out
                .push_back(Output::Stream(Box::new(StreamEvent::Ended { id, result })));
        }
    }

    /// Sends what a producer's stream has for its consumer up to its first data message (a
    /// credit answer, an end or a failure goes at once), and hands its data to
    /// [`Node::streams_release`]; forgets the stream once it is done.
    fn flush_outgoing(&mut self, now: Instant, consumer: Rank, id: u64) {
        let Some(s) = self.streams.outgoing.get_mut(&(consumer, id)) else {
            self.streams.held.remove(&(consumer, id));
            return;
        };
        let mut msgs = Vec::new();
        while let Some(m) = s.poll_control() {
            msgs.push(m);
        }
        let (done, route) = (s.is_done(), s.route());
        if s.has_pending() {
            self.streams.held.insert((consumer, id));
        } else {
            self.streams.held.remove(&(consumer, id));
        }
        for m in &msgs {
            self.send_stream(now, consumer, id, m, route);
        }
        if done {
            self.streams.outgoing.remove(&(consumer, id));
        }
        self.streams_release(now);
    }

    /// Once per pump: releases waiting data, and handles the messages of streams between two
    /// applications of this daemon (at most `limits::STREAM_LOCAL_ROUNDS_MAX` rounds; what
    /// is left waits for the next pump, which the driver takes at once: `has_output`).
    pub(super) fn pump_streams(&mut self, now: Instant) {
        self.streams_release(now);
        for _ in 0..crate::limits::STREAM_LOCAL_ROUNDS_MAX {
            if self.streams.local.is_empty() {
                break;
            }
            let batch: Vec<Bytes> = self.streams.local.drain(..).collect();
            for p in &batch {
                self.on_stream_payload(now, self.me, p);
            }
            self.streams_release(now);
        }
    }

    /// The driver reported the queue towards `peer` (or its link ended): data may be released
    /// towards it again.
    pub(super) fn streams_reported(&mut self, peer: Rank) {
        // Called on every queue report: no hashing while no stream sent anything.
        if !self.streams.unreported.is_empty() {
            self.streams.unreported.remove(&peer);
        }
    }

    /// Whether stream messages to this daemon itself wait for the next pump.
    pub(super) fn has_local_streams(&self) -> bool {
        !self.streams.local.is_empty()
    }

    /// Sends the streams' waiting data, a chunk per stream in turn (fair among streams),
    /// at most `limits::STREAM_RELEASE_BYTES` per call, none towards a congested next hop,
    /// and at most that much (one chunk more) towards any hop between two reports of its
    /// queue: bulk data never overruns flow control's bounds (no drop, no resume). Called
    /// after every stream command, queue report, turn and timeout.
    pub(super) fn streams_release(&mut self, now: Instant) {
        let mut budget = crate::limits::STREAM_RELEASE_BYTES;
        while budget > 0 && !self.streams.held.is_empty() {
            let cursor = self.streams.release_cursor;
            let ready: Vec<(Rank, u64)> = self
                .streams
                .held
                .range((
                    std::ops::Bound::Excluded(cursor),
                    std::ops::Bound::Unbounded,
                ))
                .chain(self.streams.held.range(..=cursor))
                .filter(|(c, _)| {
                    self.may_release_to(*c)
                        && self.hop_towards(*c).is_none_or(|h| {
                            self.streams.unreported.get(&h).copied().unwrap_or(0)
                                < crate::limits::STREAM_RELEASE_BYTES
                        })
                })
                .copied()
                .collect();
            if ready.is_empty() {
                return;
            }
            for (consumer, id) in ready {
                if budget == 0 {
                    return;
                }
                self.streams.release_cursor = (consumer, id);
                let hop = self.hop_towards(consumer);
                let Some(s) = self.streams.outgoing.get_mut(&(consumer, id)) else {
                    self.streams.held.remove(&(consumer, id));
                    continue;
                };
                let route = s.route();
                let mut msgs = Vec::new();
                let mut sent = 0;
                if let Some(m) = s.poll_msg() {
                    if let StreamMsg::Data { bytes, .. } = &m {
                        self.streams.stats.bytes_sent += bytes.len() as u64;
                        budget = budget.saturating_sub(bytes.len().max(1));
                        sent = bytes.len().max(1);
                    }
                    msgs.push(m);
                }
                if sent > 0
                    && let Some(h) = hop
                {
                    *self.streams.unreported.entry(h).or_default() += sent;
                }
                // What follows the chunk up to the next one (an end) goes with it.
                while let Some(m) = s.poll_control() {
                    msgs.push(m);
                }
                let done = s.is_done();
                if !s.has_pending() {
                    self.streams.held.remove(&(consumer, id));
                }
                for m in &msgs {
                    self.send_stream(now, consumer, id, m, route);
                }
                if done {
                    self.streams.outgoing.remove(&(consumer, id));
                }
            }
        }
    }

    /// A stream message arrived (over the tree or a direct link).
    pub(super) fn on_stream_message(&mut self, now: Instant, msg: Message) {
        self.on_stream_payload(now, msg.origin, &msg.payload);
    }

    /// A stream message from `from` (this daemon itself for a stream it both produces and
    /// consumes).
    fn on_stream_payload(&mut self, now: Instant, from: Rank, payload: &Bytes) {
        let (id, m) = match StreamMsg::decode(payload) {
            Ok(x) => x,
            Err(e) => {
                log::warn!(
                    "rank {}: malformed stream message from rank {from} dropped: {e}",
                    self.me
                );
                return;
            }
        };
        match m {
            StreamMsg::Open {
                offset,
                window,
                route,
                service,
                request,
            } => self.on_open(now, from, id, (offset, window, route), service, request),
            StreamMsg::Credit { upto } => {
                let Some(s) = self.streams.outgoing.get_mut(&(from, id)) else {
                    return;
                };
                if let Err(e) = s.handle_credit(upto) {
                    log::warn!("rank {}: stream from rank {from}: {e}", self.me);
                    s.handle_cancel();
                    self.streams.outgoing.remove(&(from, id));
                    self.streams.held.remove(&(from, id));
                    self.out
                        .push_back(Output::Stream(Box::new(StreamEvent::Stopped {
                            consumer: from,
                            id,
                            why: e,
                        })));
                    return;
                }
                if s.room() > 0 {
                    let upto = s.upto();
                    self.out
                        .push_back(Output::Stream(Box::new(StreamEvent::Room {
                            consumer: from,
                            id,
                            upto,
                        })));
                }
            }
            StreamMsg::Cancel | StreamMsg::Stopping => {
                // A stopping consumer ends every stream it fetches here, whatever id its
                // message names (one may have moved to a new id on another route).
                let ids: Vec<u64> = match m {
                    StreamMsg::Cancel => vec![id],
                    _ => {
                        let mut ids: Vec<u64> = self
                            .streams
                            .outgoing
                            .keys()
                            .filter(|k| k.0 == from)
                            .map(|k| k.1)
                            .collect();
                        ids.sort_unstable();
                        ids
                    }
                };
                for id in ids {
                    self.streams.held.remove(&(from, id));
                    if self.streams.outgoing.remove(&(from, id)).is_some() {
                        let why = match m {
                            StreamMsg::Cancel => StreamError::Cancelled,
                            _ => StreamError::ConsumerDied(from),
                        };
                        self.out
                            .push_back(Output::Stream(Box::new(StreamEvent::Stopped {
                                consumer: from,
                                id,
                                why,
                            })));
                    }
                }
            }
            StreamMsg::Data {
                offset,
                digest,
                bytes,
            } => {
                // Frames of a stream that moved to a new id, or ended, are stale.
                let Some((user, s)) = self.streams.incoming.get_mut(&id) else {
                    return;
                };
                if s.producer() != from {
                    return;
                }
                let user = *user;
                let check = s
                    .reader_checks()
                    .then_some(crate::stream::ChunkDigest { offset, digest });
                if let Ok(Some(b)) = s.handle_data(now, offset, digest, bytes) {
                    self.streams.stats.bytes_received += b.len() as u64;
                    self.out
                        .push_back(Output::Stream(Box::new(StreamEvent::Data {
                            id: user,
                            bytes: b,
                            check,
                        })));
                }
                if s.wants_resume() {
                    self.resume_stream(now, id);
                } else {
                    self.flush_incoming(now, id);
                }
            }
            StreamMsg::End { total, digests } => {
                if let Some((_, s)) = self.streams.incoming.get_mut(&id)
                    && s.producer() == from
                {
                    s.handle_end(now, total, digests);
                    if s.wants_resume() {
                        self.resume_stream(now, id);
                    } else {
                        self.flush_incoming(now, id);
                    }
                }
            }
            StreamMsg::Fail { code, .. } if code == FAIL_STOPPED => {
                // The producer's daemon stops: every stream from it is over, also one that
                // moved to a new id meanwhile (a lost direct link resumes it: the stop's
                // message, by the tree, then names the old id).
                for wire in self.incoming_from(from) {
                    if let Some((_, s)) = self.streams.incoming.get_mut(&wire) {
                        s.handle_producer_failed();
                    }
                    self.flush_incoming(now, wire);
                }
            }
            StreamMsg::Fail { code, reason } => {
                if let Some((_, s)) = self.streams.incoming.get_mut(&id)
                    && s.producer() == from
                {
                    s.handle_fail(code, reason);
                    self.flush_incoming(now, id);
                }
            }
            StreamMsg::Probe => {
                // Answered by the route the data takes, behind the data already sent.
                let (answer, route) = match self.streams.outgoing.get(&(from, id)) {
                    Some(s) => (
                        StreamMsg::Position {
                            sent: s.sent(),
                            upto: s.upto(),
                        },
                        s.route(),
                    ),
                    None => (StreamMsg::Unknown, None),
                };
                self.send_stream(now, from, id, &answer, route);
            }
            StreamMsg::Position { .. } | StreamMsg::Unknown => {
                if let Some((_, s)) = self.streams.incoming.get_mut(&id)
                    && s.producer() == from
                {
                    match m {
                        StreamMsg::Position { sent, upto } => s.handle_position(sent, upto),
                        _ => s.handle_unknown(),
                    }
                    if s.wants_resume() {
                        self.resume_stream(now, id);
                    } else {
                        self.flush_incoming(now, id);
                    }
                }
            }
        }
    }

    fn on_open(
        &mut self,
        now: Instant,
        consumer: Rank,
        id: u64,
        (offset, window, route): (u64, u32, Option<Route>),
        service: String,
        request: Bytes,
    ) {
        let refuse = if !self.streams.services.contains(&service) {
            Some((FAIL_NO_SERVICE, service.clone()))
        } else if self.streams.outgoing.len() >= crate::limits::STREAMS_MAX
            || self.streams.outgoing.contains_key(&(consumer, id))
            || self
                .streams
                .outgoing
                .values()
                .map(Outgoing::window)
                .sum::<u64>()
                + u64::from(window).min(STREAM_WINDOW_MAX as u64)
                > crate::limits::STREAM_WINDOWS_TOTAL_MAX
        {
            Some((FAIL_NO_ROOM, "no room for another stream".to_string()))
        } else {
            None
        };
        if let Some((code, reason)) = refuse {
            self.streams.stats.refused += 1;
            self.send_stream(now, consumer, id, &StreamMsg::Fail { code, reason }, route);
            return;
        }
        self.streams.stats.served += 1;
        let s = Outgoing::new(id, consumer, offset, window)
            .with_msg_max(self.msg_max_bytes)
            .with_route(route);
        let upto = s.upto();
        self.streams.outgoing.insert((consumer, id), s);
        self.out
            .push_back(Output::Stream(Box::new(StreamEvent::Opened {
                consumer,
                id,
                service,
                request,
                offset,
            })));
        self.out
            .push_back(Output::Stream(Box::new(StreamEvent::Room {
                consumer,
                id,
                upto,
            })));
    }

    /// After a repair: streams with a dead end are over; a consumer whose producer lives and
    /// is not reached by a direct link resumes (chunks may have died with a relay).
    pub(super) fn streams_after_repair(&mut self, now: Instant, dead: &[Rank]) {
        let dead: Vec<Rank> = dead
            .iter()
            .copied()
            .filter(|r| self.streams.answered.insert(*r))
            .collect();
        let dead = &dead[..];
        let gone: Vec<(Rank, u64)> = self
            .streams
            .outgoing
            .keys()
            .filter(|(c, _)| dead.contains(c))
            .copied()
            .collect();
        for (consumer, id) in gone {
            self.streams.outgoing.remove(&(consumer, id));
            self.streams.held.remove(&(consumer, id));
            self.out
                .push_back(Output::Stream(Box::new(StreamEvent::Stopped {
                    consumer,
                    id,
                    why: StreamError::ConsumerDied(consumer),
                })));
        }
        let mut wires: Vec<u64> = self.streams.incoming.keys().copied().collect();
        wires.sort_unstable();
        for wire in wires {
            let producer = match self.streams.incoming.get(&wire) {
                Some((_, s)) => s.producer(),
                None => continue,
            };
            if dead.contains(&producer) {
                if let Some((_, s)) = self.streams.incoming.get_mut(&wire) {
                    s.handle_producer_failed();
                }
                self.end_if_over(wire);
            } else if !dead.is_empty() && !self.direct.is_direct(producer) {
                self.resume_stream(now, wire);
            }
        }
    }

    /// The wire ids of the streams this daemon fetches from `producer`, in order.
    fn incoming_from(&self, producer: Rank) -> Vec<u64> {
        let mut wires: Vec<u64> = self
            .streams
            .incoming
            .iter()
            .filter(|(_, (_, s))| s.producer() == producer)
            .map(|(w, _)| *w)
            .collect();
        wires.sort_unstable();
        wires
    }

    /// The direct link to `peer` was lost: its streams' chunks on it may be gone.
    pub(super) fn streams_link_lost(&mut self, now: Instant, peer: Rank) {
        for wire in self.incoming_from(peer) {
            self.resume_stream(now, wire);
        }
    }

    /// Moves stream `wire` to a new id at the byte it stands at: `Cancel` for the old id,
    /// `Open` for the new one.
    fn resume_stream(&mut self, now: Instant, wire: u64) {
        let Some((user, mut s)) = self.streams.incoming.remove(&wire) else {
            return;
        };
        if s.status() != &Status::Streaming {
            self.streams.incoming.insert(wire, (user, s));
            self.end_if_over(wire);
            return;
        }
        let (producer, route) = (s.producer(), s.route());
        self.send_stream(now, producer, wire, &StreamMsg::Cancel, route);
        self.streams.stats.resumes += 1;
        let new = self.next_wire_id();
        s.resume(now, new);
        self.streams.wire_of.insert(user, new);
        self.streams.incoming.insert(new, (user, s));
        self.flush_incoming(now, new);
    }

    /// The daemon stops (not a crash): the other end of each of its streams is told now,
    /// with the linger's frames, rather than once the stop is found as a death. A consumer's
    /// stream fails `ProducerDied` (a `Fail` with `FAIL_STOPPED`, behind the data already
    /// sent; data still waiting here is dropped), a producer's writer `ConsumerDied`.
    pub(super) fn streams_stop(&mut self, now: Instant) {
        let mut produced: Vec<(Rank, u64)> = self.streams.outgoing.keys().copied().collect();
        produced.sort_unstable();
        let stopped = StreamMsg::Fail {
            code: FAIL_STOPPED,
            reason: format!("rank {} stopped", self.me),
        };
        for (consumer, id) in produced {
            self.streams.held.remove(&(consumer, id));
            if let Some(s) = self.streams.outgoing.remove(&(consumer, id)) {
                self.send_stream_at_stop(now, consumer, id, &stopped, s.route());
            }
        }
        let mut consumed: Vec<u64> = self.streams.incoming.keys().copied().collect();
        consumed.sort_unstable();
        for wire in consumed {
            let to = match self.streams.incoming.get(&wire) {
                Some((_, s)) if s.status() == &Status::Streaming => (s.producer(), s.route()),
                _ => continue,
            };
            self.send_stream_at_stop(now, to.0, wire, &StreamMsg::Stopping, to.1);
        }
    }

    /// A stop's stream message, by the tree whatever the stream's route: a direct link may
    /// be granted and not yet connected (the message would wait for a dial, perhaps an address
    /// lookup, that the stop cuts short), or be connecting from the other side (a frame on it
    /// waits there for the link's drain marker, and goes with the connection the stop
    /// resets). Outside-in review: half of such stops over direct links were found only as
    /// deaths. Over the tree it follows whatever the stream sent by the tree; data still on a
    /// direct link may arrive after it and is then stale (the stream ended a little earlier).
    fn send_stream_at_stop(
        &mut self,
        now: Instant,
        to: Rank,
        id: u64,
        m: &StreamMsg,
        route: Option<Route>,
    ) {
        if to == self.me || self.routing.is_failed(to) {
            return self.send_stream(now, to, id, m, route);
        }
        let payload: crate::oob::Payload = m.encode(id).into();
        let header = self.header(
            crate::oob::header::Kind::Msg,
            self.me,
            to,
            TAG_STREAM,
            payload.len(),
        );
        self.forward(header, payload, None);
    }

    /// Consumer idle timeouts.
    pub(super) fn streams_timeout(&mut self, now: Instant) {
        let mut due: Vec<u64> = self
            .streams
            .incoming
            .iter()
            .filter(|(_, (_, s))| s.poll_timeout().is_some_and(|t| t <= now))
            .map(|(w, _)| *w)
            .collect();
        due.sort_unstable();
        for wire in due {
            let resume = match self.streams.incoming.get_mut(&wire) {
                Some((_, s)) => {
                    if s.handle_timeout(now) {
                        self.streams.stats.probes += 1;
                    }
                    s.wants_resume()
                }
                None => false,
            };
            if resume {
                self.resume_stream(now, wire);
            } else {
                self.flush_incoming(now, wire);
            }
        }
    }
}
