//! The loop's connections: dialling (with bounded, backed-off redials), accepting, the
//! handshake, reading frames into the node, writing queued frames, and what happens when a
//! connection is lost. Which peer to dial, and what a loss means, the node decides.

use super::super::caddy::Completion;
use super::super::conn::{Conn, ConnState, LinkSession};
use super::super::log_limit::{Refusal, Summary};
use super::super::timers::TimerKind;
use super::{EventLoop, complete};
use crate::Rank;
use crate::error::SendError;
use crate::limits;
use crate::oob::arbiter::{Admission, DialPhase, LinkDialler, admit};
use crate::oob::frame::Frame;
use crate::oob::handshake::{Handshake, HandshakeError, HandshakeEvent, TOOL_RANK};
use crate::oob::header::{Header, Kind};
use crate::oob::send_queue::Payload;
use crate::oob::session::{Control, SessionError, Started};
use bytes::Bytes;
use mio::net::TcpStream;
use mio::{Interest, Token};
use std::collections::VecDeque;
use std::io::{self, Read};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// A frame waiting for a connection to its next hop.
pub(super) struct Pending {
    pub header: Header,
    pub payload: Payload,
    pub done: Option<Completion>,
}

/// What this daemon knows of one neighbour it talks to directly.
#[derive(Default)]
pub(super) struct Link {
    /// The established connection.
    pub conn: Option<usize>,
    /// Our outgoing attempt, connecting or handshaking.
    pub dialing: Option<usize>,
    /// Frames waiting for `conn` (bounded by `send_queue_max_bytes`).
    pub pending: VecDeque<Pending>,
    pub pending_bytes: usize,
    /// Consecutive failed dial attempts.
    pub attempt: u32,
    /// The connection to this tree neighbour was lost: keep redialling (bounded) even with
    /// nothing to send, and declare it failed if it cannot be reached.
    pub probe: bool,
    pub redial_armed: bool,
    /// Its contact was asked of the node ([`Node::want_contact`]); the dial waits for the
    /// answer.
    pub awaiting_contact: bool,
    /// The link session between connections (`oob::session`); the established connection
    /// holds it while there is one.
    pub session: Option<Box<LinkSession>>,
    /// Which of the peer's addresses (in `order_by_reach`'s order) the link uses: the one
    /// its last connection came over; a dial tries it first, then the others in turn.
    pub addr_index: usize,
    /// Connections to this peer given up as stalled, and dialled again elsewhere.
    pub failovers: u64,
    /// Our bulk connection to this peer (`event_loop/bulk.rs`): connecting, handshaking or
    /// established.
    pub bulk_out: Option<usize>,
    /// The peer's bulk connection to us.
    pub bulk_in: Option<usize>,
    /// Which connection our bulk frames to this peer take.
    pub bulk_route: crate::oob::bulk_route::BulkRoute,
    /// No bulk connection is dialled to this peer before then (one failed lately).
    pub bulk_retry_at: Option<Instant>,
}

/// How a dial failed: whether the peer's host answered (refused or reset the connection, or
/// accepted it and then lost it: nothing of this DVM listens there) or nothing answered (no
/// route, a network down or silent). Only an answer shows the daemon gone before its
/// heartbeats' silence does (`Node::keeps_dialling`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DialFailure {
    Answered,
    NoAnswer,
}

impl DialFailure {
    fn of(e: &io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted => DialFailure::Answered,
            _ => DialFailure::NoAnswer,
        }
    }
}

impl Link {
    /// Whether a connection to this peer is wanted: frames wait for one, the link is probed,
    /// or its session holds frames written and not confirmed.
    pub fn wanted(&self) -> bool {
        !self.pending.is_empty() || self.probe || self.holds_unconfirmed()
    }

    /// Whether its session, between connections, holds frames written and not confirmed.
    pub fn holds_unconfirmed(&self) -> bool {
        self.session
            .as_ref()
            .is_some_and(|s| s.out.unacked_frames() > 0)
    }
}

impl EventLoop {
    pub(super) fn enqueue(
        &mut self,
        peer: Rank,
        header: Header,
        payload: impl Into<Payload>,
        done: Option<Completion>,
    ) -> bool {
        let payload = payload.into();
        if crate::node::lane::keeps_bulk_writes_small(&header) {
            self.messages.heard(self.now);
        }
        let link = self.links.entry(peer).or_default();
        if let Some(tok) = link.conn
            && let Some(conn) = self.conns.get(tok)
            && conn.takes_frames()
        {
            let (header, payload, done) = match self.route_bulk(peer, tok, header, payload, done) {
                Ok(queued) => return queued,
                Err(frame) => frame,
            };
            let Some(conn) = self.conns.get_mut(tok) else {
                return false;
            };
            return match conn.push(header, payload, done) {
                Ok(()) => {
                    // A queue holding a full coalescing buffer is written at once: the peer
                    // starts on it while this turn goes on, and the written buffer is packed
                    // into again instead of a fresh one being allocated.
                    if conn.queued_bytes() >= limits::SEND_COALESCE_BUFFER_BYTES
                        && conn.is_established()
                    {
                        // An error is met again, and handled, by the turn's flush.
                        let _ = conn.flush(&mut self.written_early, limits::BULK_FLUSH_BYTES);
                    }
                    self.mark_dirty(tok);
                    true
                }
                Err((_, done)) => {
                    self.queue_full(peer, done);
                    false
                }
            };
        }
        let len = payload.len() + crate::oob::header::HEADER_LEN;
        if !link.pending.is_empty() && link.pending_bytes + len > self.cfg.send_queue_max_bytes {
            self.queue_full(peer, done);
            return false;
        }
        link.pending_bytes += len;
        link.pending.push_back(Pending {
            header,
            payload,
            done,
        });
        self.ensure_dial(peer);
        self.report_waiting(peer);
        true
    }

    /// Tells the node how full the queue towards `peer` is when frames start or stop waiting
    /// for its connection. They count as queued (`peer_levels`): otherwise flow control would
    /// not see a link that is down or being dialled, the origin gate would stay open, and what
    /// waits would grow to the hard bound and be dropped there (found by the simulator:
    /// regression seeds 802624 and 805020).
    pub(super) fn report_waiting(&mut self, peer: Rank) {
        let Some(link) = self.links.get(&peer) else {
            return;
        };
        let waiting = link.pending_bytes;
        let levels = [link.conn, link.bulk_out]
            .into_iter()
            .flatten()
            .find_map(|t| self.peer_levels(t));
        let (queued, bulk) = levels.map_or((waiting, 0), |(_, q, b)| (q, b));
        self.node.handle_send_queue(self.now, peer, queued, bulk);
    }

    /// A frame did not fit the bounded queue towards `peer`. A frame originated here fails its
    /// sender's completion with `Busy` (back-pressure); a frame without one (relayed, broadcast
    /// copy, notice) is dropped, counted, and logged at the first drop of each run of drops.
    pub(super) fn queue_full(&mut self, peer: Rank, done: Option<Completion>) {
        if done.is_some() {
            complete(
                done,
                Err(SendError::Busy(crate::error::Limit::NextHopQueue)),
            );
            return;
        }
        let counters = self.node.counters_mut();
        counters.dropped_queue_full += 1;
        let n = counters.dropped_queue_full;
        if n.is_power_of_two() {
            log::warn!(
                "rank {}: send queue to rank {peer} is full; dropped a relayed frame ({n} so far)",
                self.me
            );
        }
    }

    /// Dials `peer` unless a connection, a dial, a redial or a contact lookup for it is
    /// already under way.
    pub(super) fn ensure_dial(&mut self, peer: Rank) {
        let link = self.links.entry(peer).or_default();
        // A connection claiming `peer` still in its handshake does not count: it has proved
        // nothing (`oob::arbiter`).
        if link.conn.is_none()
            && link.dialing.is_none()
            && !link.redial_armed
            && !link.awaiting_contact
        {
            self.dial(peer);
        }
    }

    /// The peer's addresses in the order a dial tries them: for a tree link (control
    /// traffic) the `bulk_networks` last, for any other (a direct link: bulk) first; within
    /// each part those on a network of ours first.
    pub(super) fn peer_addrs(&self, peer: Rank) -> Vec<SocketAddr> {
        use crate::oob::interfaces::{order_by_reach, prefer};
        self.node.contact(peer).map_or_else(Vec::new, |c| {
            let reach = order_by_reach(&c.addrs, &self.networks);
            if self.bulk_networks.is_empty() {
                return reach;
            }
            let bulk = self.node.carries_bulk(peer);
            prefer(&reach, &self.bulk_networks, bulk)
        })
    }

    pub(super) fn dial(&mut self, peer: Rank) {
        let addrs = self.peer_addrs(peer);
        let (attempt, first) = self
            .links
            .get(&peer)
            .map_or((0, 0), |l| (l.attempt as usize, l.addr_index));
        let at = first.wrapping_add(attempt) % addrs.len().max(1);
        let Some(addr) = addrs.get(at).copied() else {
            // Not from wire-up: the node looks it up (the answer comes as an output; what
            // waits for `peer` stays queued meanwhile).
            log::debug!(
                "rank {}: no address known for rank {peer}; looking it up",
                self.me
            );
            self.links.entry(peer).or_default().awaiting_contact = true;
            self.node.want_contact(Instant::now(), peer);
            return;
        };
        let tok = match self.connect(peer, addr, "connect") {
            Ok(tok) => tok,
            Err(failure) => {
                self.dial_failed(peer, failure);
                return;
            }
        };
        self.links.entry(peer).or_default().dialing = Some(tok);
        log::debug!("rank {}: dialling rank {peer} at {addr}", self.me);
    }

    /// Starts a non-blocking connect to `peer` at `addr` and stores the connection (its
    /// handshake starts once connected). `None` (logged at debug level as `what`) if the
    /// socket or the poller refused.
    pub(super) fn connect(
        &mut self,
        peer: Rank,
        addr: SocketAddr,
        what: &str,
    ) -> Result<usize, DialFailure> {
        match TcpStream::connect(addr) {
            Ok(stream) => self
                .add_conn(stream, addr, ConnState::Connecting, Some(peer))
                .ok_or(DialFailure::NoAnswer),
            Err(e) => {
                log::debug!("rank {}: {what} to {peer} at {addr}: {e}", self.me);
                Err(DialFailure::of(&e))
            }
        }
    }

    /// The acknowledgement delay ran out: every acknowledgement still due goes alone.
    pub(super) fn acks_due_now(&mut self) {
        self.ack_timer_armed = false;
        let me = self.me;
        for tok in std::mem::take(&mut self.acks_due) {
            if let Some(conn) = self.conns.get_mut(tok)
                && conn.ack_due
                && let Some(peer) = conn.peer
                && conn.ack_now(me, peer)
            {
                self.mark_dirty(tok);
            }
        }
    }

    /// Dials `peer` if its link session holds frames written and not confirmed (a connection
    /// broke or stalled under them): they are written again on the new connection.
    pub(super) fn ensure_dial_for_session(&mut self, peer: Rank) {
        let waiting = self.links.get(&peer).is_some_and(Link::holds_unconfirmed);
        if waiting && self.stopping.is_none() && self.node.stopping().is_none() {
            self.ensure_dial(peer);
        }
    }

    /// The node answered a contact lookup for `peer`: dialled now if something waits for it,
    /// or (no contact to be had) unreachable.
    pub(super) fn contact_answered(&mut self, peer: Rank, known: bool) {
        let Some(link) = self.links.get_mut(&peer) else {
            return;
        };
        if !std::mem::take(&mut link.awaiting_contact) {
            return;
        }
        if known && link.wanted() {
            self.ensure_dial(peer);
        } else if !known {
            log::warn!("rank {}: no contact to be had for rank {peer}", self.me);
            self.unreachable(peer, 0);
        }
    }

    pub(super) fn dial_failed(&mut self, peer: Rank, failure: DialFailure) {
        let retries = self.cfg.reconnect_retries;
        let watched = self.node.keeps_dialling(peer);
        let keep_dialling = failure == DialFailure::NoAnswer && watched;
        let me = self.me;
        let link = self.links.entry(peer).or_default();
        link.dialing = None;
        link.attempt += 1;
        if !link.wanted() {
            link.attempt = 0;
            return;
        }
        if failure == DialFailure::Answered && watched && link.attempt > retries + 1 {
            // Answered after a silence the heartbeats were judging: a hung daemon woke, and
            // its own dial may have crossed this one (which it then closes). A daemon that
            // died refuses the next attempt too.
            link.attempt = retries;
        }
        if link.attempt > retries && keep_dialling {
            // The heartbeats' timeout decides (`Node::keeps_dialling`): dial on (the peer's
            // addresses in turn) at the longest delay, the attempts bounded by that timeout.
            if link.attempt == retries + 1 {
                log::warn!(
                    "rank {me}: no answer from rank {peer} after {retries} connection \
                     attempts; dialling on until its heartbeat timeout decides"
                );
            }
        } else if link.attempt > retries {
            let attempts = link.attempt;
            link.attempt = 0;
            link.probe = false;
            self.unreachable(peer, attempts);
            return;
        }
        self.node.counters_mut().reconnects += 1;
        let shift = (link.attempt - 1).min(20);
        let delay = self
            .cfg
            .reconnect_base_ms
            .saturating_mul(1 << shift)
            .min(self.cfg.reconnect_max_ms);
        link.redial_armed = true;
        let attempt = link.attempt;
        self.timers.arm(
            Instant::now() + Duration::from_millis(delay),
            TimerKind::Redial {
                rank: peer,
                attempt,
            },
        );
    }

    /// A peer could not be reached within the bounded reconnect policy: the node decides what
    /// that means (a failure, or this daemon cannot join); what still waits for it fails.
    pub(super) fn unreachable(&mut self, peer: Rank, attempts: u32) {
        self.node.handle_unreachable(Instant::now(), peer, attempts);
        self.carry_out();
        self.give_up(peer, SendError::Unreachable(peer));
    }

    /// Fails every frame waiting for `peer`.
    pub(super) fn give_up(&mut self, peer: Rank, err: SendError) {
        if let Some(link) = self.links.get_mut(&peer) {
            let had = link.pending_bytes;
            link.pending_bytes = 0;
            let pending: Vec<Pending> = link.pending.drain(..).collect();
            for p in pending {
                complete(p.done, Err(err.clone()));
            }
            if had > 0 {
                self.report_waiting(peer);
            }
        }
    }

    pub(super) fn tune(&self, stream: &TcpStream) {
        let sock = socket2::SockRef::from(stream);
        if let Err(e) = stream.set_nodelay(true) {
            log::debug!("rank {}: TCP_NODELAY: {e}", self.me);
        }
        let ka = socket2::TcpKeepalive::new()
            .with_time(Duration::from_secs(self.cfg.keepalive_idle_s.into()))
            .with_interval(Duration::from_secs(self.cfg.keepalive_interval_s.into()))
            .with_retries(self.cfg.keepalive_count);
        if let Err(e) = sock.set_tcp_keepalive(&ka) {
            log::debug!("rank {}: keepalive: {e}", self.me);
        }
        if self.cfg.socket_buffer_bytes > 0 {
            let _ = sock.set_send_buffer_size(self.cfg.socket_buffer_bytes);
            let _ = sock.set_recv_buffer_size(self.cfg.socket_buffer_bytes);
        }
    }

    pub(super) fn bump_generation(&mut self) -> u64 {
        self.next_generation += 1;
        self.next_generation
    }

    /// Tunes, registers and stores a new connection, and arms its handshake timeout (which
    /// covers the TCP connect too). Returns its token, or `None` (logged) if the poller refused.
    pub(super) fn add_conn(
        &mut self,
        mut stream: TcpStream,
        addr: SocketAddr,
        state: ConnState,
        dialled: Option<Rank>,
    ) -> Option<usize> {
        self.tune(&stream);
        let connecting = matches!(state, ConnState::Connecting);
        let generation = self.bump_generation();
        let entry = self.conns.vacant_entry();
        let tok = entry.key();
        if let Err(e) = self.poll.registry().register(
            &mut stream,
            Token(tok),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            log::warn!("rank {}: cannot register a socket: {e}", self.me);
            return None;
        }
        let queue_max = self.cfg.send_queue_max_bytes;
        entry.insert(Conn::new(
            stream, addr, state, dialled, generation, queue_max,
        ));
        let at = Instant::now() + Duration::from_millis(self.cfg.handshake_timeout_ms);
        self.timers.arm(
            at,
            TimerKind::Handshake {
                token: tok,
                generation,
            },
        );
        if let (true, Some(peer)) = (connecting, dialled)
            && let Some(ms) = self.connect_timeout_ms(peer)
        {
            self.timers.arm(
                Instant::now() + Duration::from_millis(ms),
                TimerKind::Connect {
                    token: tok,
                    generation,
                },
            );
        }
        Some(tok)
    }

    /// Accepts on listener `index` again in `ms` (the listener is edge-triggered: what is
    /// left in its backlog raises no new event).
    fn accept_later(&mut self, index: usize, ms: u64) {
        if !self.accept_retry.contains(&index) {
            self.accept_retry.push(index);
            self.timers.arm(
                Instant::now() + Duration::from_millis(ms),
                TimerKind::AcceptRetry { index },
            );
        }
    }

    pub(super) fn accept(&mut self, index: usize) {
        for taken in 0..limits::ACCEPTS_PER_EVENT_MAX {
            if taken > 0 && self.pending.len() >= limits::ACCEPT_PACE_PENDING {
                // Paced (see `limits::ACCEPT_PACE_PENDING`): the rest wait in the backlog.
                self.accept_later(index, limits::ACCEPT_PACE_MS);
                return;
            }
            let Some(listener) = self.listeners.get(index) else {
                return;
            };
            let (stream, addr) = match listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of descriptors or memory: the connections stay in the backlog. The
                    // listener is edge-triggered, so try again later rather than wait for a
                    // next connection that may never come.
                    self.log_refusal(Refusal::AcceptFailed, || {
                        format!(
                            "accept: {e}; trying again in {} ms",
                            limits::ACCEPT_RETRY_MS
                        )
                    });
                    self.accept_later(index, limits::ACCEPT_RETRY_MS);
                    return;
                }
            };
            if self.conns.len() >= limits::CONNECTIONS_MAX {
                self.node.counters_mut().handshakes_refused += 1;
                self.log_refusal(Refusal::TooManyConnections, || {
                    format!("too many connections; refusing {addr}")
                });
                continue;
            }
            // Room for one more pending handshake from this source and in all: the oldest
            // pending ones go (established connections are never touched).
            for (old, generation) in self.pending.make_room(addr.ip()) {
                if self.alive(old, generation) {
                    self.node.counters_mut().handshakes_evicted += 1;
                    self.refusal_closes(
                        old,
                        Refusal::Evicted,
                        "evicted: too many pending handshakes",
                    );
                }
            }
            let hs = ConnState::Handshaking(Box::new(Handshake::accept(
                &self.hs_cfg,
                super::super::nonce::fresh(),
            )));
            let Some(tok) = self.add_conn(stream, addr, hs, None) else {
                continue;
            };
            if let Some(c) = self.conns.get(tok) {
                self.pending.insert(c.generation, tok, addr.ip());
            }
            // A peer may have written its Hello already.
            self.readable_again.insert(tok);
        }
        // More may be waiting: come back next turn rather than starve the other sockets. The
        // listener is edge-triggered, so without this the rest of a burst would wait for the
        // next connection to arrive.
        if !self.accept_again.contains(&index) {
            self.accept_again.push(index);
        }
    }

    pub(super) fn on_writable(&mut self, tok: usize) {
        let Some(conn) = self.conns.get_mut(tok) else {
            return;
        };
        if let ConnState::Connecting = conn.state {
            let Some(peer) = conn.dialled else {
                crate::bug!("rank {}: a connecting socket that dialled nobody", self.me);
                self.close(tok, None);
                return;
            };
            let failed = match conn.stream.take_error() {
                Ok(Some(e)) | Err(e) => Some(e),
                Ok(None) => match conn.stream.peer_addr() {
                    Ok(_) => None,
                    Err(e) if e.kind() == io::ErrorKind::NotConnected => return,
                    Err(e) => Some(e),
                },
            };
            if let Some(e) = failed {
                log::debug!("rank {}: connect to {peer} at {}: {e}", self.me, conn.addr);
                if conn.bulk_end.is_some() {
                    self.bulk_lost(tok, &e.to_string());
                    return;
                }
                self.close(tok, None);
                self.dial_failed(peer, DialFailure::of(&e));
                return;
            }
            let nonce = super::super::nonce::fresh();
            conn.state = ConnState::Handshaking(Box::new(if conn.bulk_end.is_some() {
                Handshake::dial_bulk(&self.hs_cfg, peer, nonce)
            } else {
                Handshake::dial(&self.hs_cfg, peer, nonce)
            }));
            self.pump_handshake(tok);
        }
        self.mark_dirty(tok);
    }

    pub(super) fn pump_handshake(&mut self, tok: usize) {
        let Some(conn) = self.conns.get_mut(tok) else {
            return;
        };
        let mut out = Vec::new();
        if let ConnState::Handshaking(hs) = &mut conn.state {
            while let Some(f) = hs.poll_transmit() {
                out.push(f);
            }
        }
        for (h, p) in out {
            // An empty queue always takes one frame, and handshake frames are tiny.
            let _ = conn.push(h, p, None);
        }
        self.mark_dirty(tok);
    }

    pub(super) fn on_readable(&mut self, tok: usize) {
        let mut reads = 0;
        let mut batches = 0;
        // The last read was short: it took everything the socket held. Another read would
        // only say "would block" (a system call on the round trip's path, before this turn's
        // writes); data arriving later raises a new (edge-triggered) readiness event.
        let mut drained = false;
        loop {
            let Some(conn) = self.conns.get_mut(tok) else {
                return;
            };
            if matches!(conn.state, ConnState::Connecting) {
                return;
            }
            if conn.half_closed {
                return self.drop_until_closed(tok);
            }
            let generation = conn.generation;
            // Flow control: frames from this neighbour could be for a congested queue; leave
            // them in the socket (TCP pushes back on the sender) until the node says so.
            if let Some(p) = conn.peer.filter(|_| conn.is_established())
                && !may_read(&self.node, self.now, p, conn)
                && !conn.awaits_acks()
            {
                self.readable_again.remove(&tok);
                self.paused.insert(tok);
                return;
            }
            // While handshaking, one frame at a time: the frame that completes the handshake
            // raises the decoder's size limit for the data frames pipelined behind it.
            let max = if conn.is_established() {
                limits::FRAMES_PER_READ_MAX
            } else {
                1
            };
            // The buffer is reused across reads (a frame for a closed connection drops it).
            let mut frames = std::mem::take(&mut self.frame_buf);
            frames.clear();
            let mut error = None;
            while frames.len() < max {
                match conn.decoder.next_frame() {
                    Ok(Some(f)) => frames.push(f),
                    Ok(None) => break,
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
            }
            if frames.is_empty() && error.is_none() {
                // Nothing buffered: read more. The buffer goes back first: every way out of
                // here returns or reads, and its allocation is kept for the next event.
                self.frame_buf = frames;
                if drained {
                    return;
                }
                if reads == limits::READS_PER_EVENT_MAX {
                    // Still readable: continue next turn so other sockets get their share.
                    self.readable_again.insert(tok);
                    return;
                }
                reads += 1;
                if conn.is_established() && conn.decoder.read_chunk() < limits::READ_CHUNK_BYTES {
                    // The small handshake region grows once the peer has proved itself, and
                    // large payloads go to the daemon's pool from then on.
                    conn.decoder.set_read_chunk(limits::READ_CHUNK_BYTES);
                    conn.decoder
                        .set_payload_pool(std::sync::Arc::clone(&self.payload_pool));
                }
                let space = conn.decoder.read_space();
                let space_len = space.len();
                match conn.stream.read(space) {
                    Ok(0) => {
                        self.lost(tok, "connection closed by peer");
                        return;
                    }
                    Ok(n) => {
                        drained = n < space_len;
                        conn.decoder.commit(n);
                        conn.watch.handle_heard(self.now);
                        conn.read_since_ack = conn.read_since_ack.saturating_add(n);
                        if let Some(p) = conn.peer.filter(|_| conn.is_established()) {
                            self.node.handle_heard(self.now, p);
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        self.lost(tok, &e.to_string());
                        return;
                    }
                }
                continue;
            }
            let mut gone = false;
            let large = frames
                .iter()
                .any(|f| f.payload.len() >= limits::LINK_ACK_PROMPT_FRAME_BYTES);
            for f in frames.drain(..) {
                if !self.alive(tok, generation) {
                    gone = true;
                    break;
                }
                self.on_frame(tok, f);
            }
            // The link session acknowledges a large batch, or one with a large frame, at once
            // (the control frame goes out with this turn's writes, and the peer lets go of
            // what it kept within a round trip: a kept large frame pins the allocation it was
            // read into at a relay); a small one rides on the next frame to the peer, or goes
            // after `LINK_ACK_DELAY_MS`.
            if let Some(conn) = self.conns.get_mut(tok)
                && conn.generation == generation
                && let Some(peer) = conn.peer
                && conn.session.as_ref().is_some_and(|s| s.inb.unacked())
            {
                if large || conn.read_since_ack >= limits::LINK_ACK_PROMPT_BYTES {
                    if conn.ack_now(self.me, peer) {
                        self.mark_dirty(tok);
                    }
                } else if !conn.ack_due {
                    conn.ack_due = true;
                    self.acks_due.push(tok);
                    if !self.ack_timer_armed {
                        self.ack_timer_armed = true;
                        self.timers.arm(
                            self.now + Duration::from_millis(limits::LINK_ACK_DELAY_MS),
                            TimerKind::LinkAck,
                        );
                    }
                }
            }
            // What the batch made the node want, in order (once per batch, not per frame:
            // measured cheaper), and the queue levels that leaves (flow control).
            self.carry_out();
            self.report_queues();
            self.publish_gate();
            frames.clear();
            self.frame_buf = frames;
            if gone {
                return;
            }
            if let Some(e) = error {
                if self.alive(tok, generation) {
                    self.protocol_error(tok, &e.to_string());
                }
                return;
            }
            if !self.alive(tok, generation) {
                return;
            }
            batches += 1;
            if batches == limits::FRAME_BATCHES_PER_EVENT_MAX {
                self.readable_again.insert(tok);
                return;
            }
        }
    }

    /// A half-closed connection of a stopping daemon (`Conn::half_closed`): reads what the
    /// peer still sends and drops it, and closes the connection at the peer's end (or an
    /// error). At most `READS_PER_EVENT_MAX` reads a turn; the linger bounds the whole wait.
    fn drop_until_closed(&mut self, tok: usize) {
        let mut scratch = [0u8; 16 * 1024];
        for _ in 0..limits::READS_PER_EVENT_MAX {
            let Some(conn) = self.conns.get_mut(tok) else {
                return;
            };
            match conn.stream.read(&mut scratch) {
                Ok(0) => return self.close(tok, None),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.close(tok, None),
            }
        }
        self.readable_again.insert(tok);
    }

    pub(super) fn alive(&self, tok: usize, generation: u64) -> bool {
        self.conns
            .get(tok)
            .is_some_and(|c| c.generation == generation)
    }

    fn on_frame(&mut self, tok: usize, frame: Frame) {
        let Some(conn) = self.conns.get_mut(tok) else {
            return;
        };
        if let ConnState::Handshaking(hs) = &mut conn.state {
            match hs.handle_frame(frame) {
                Ok(None) => self.pump_handshake(tok),
                Ok(Some(HandshakeEvent::HelloReceived(ident))) => {
                    if ident.rank != TOOL_RANK || self.on_tool_hello(tok) {
                        self.on_hello(tok, ident.rank);
                    }
                }
                Ok(Some(HandshakeEvent::Authenticated(ident))) if ident.rank == TOOL_RANK => {
                    self.tool_admitted(tok);
                }
                Ok(Some(HandshakeEvent::Authenticated(ident))) if ident.bulk => {
                    self.bulk_admitted(tok, ident.rank, ident.epoch);
                }
                Ok(Some(HandshakeEvent::Established(ident))) if ident.bulk => {
                    self.pump_handshake(tok);
                    self.bulk_established(tok, ident.rank, ident.epoch);
                }
                Ok(Some(HandshakeEvent::Authenticated(ident))) => {
                    self.on_authenticated(tok, ident.rank, ident.epoch);
                }
                Ok(Some(HandshakeEvent::Established(ident))) => {
                    self.pump_handshake(tok);
                    self.established(tok, ident.rank, ident.epoch);
                }
                Err(e) => {
                    let reason = match e {
                        HandshakeError::WrongDvm { .. } => Refusal::WrongDvm,
                        HandshakeError::BadKey => Refusal::BadMac,
                        _ => Refusal::Malformed,
                    };
                    if let (HandshakeError::BadKey, Some(peer)) = (&e, conn.dialled) {
                        self.node.handle_key_refused(peer);
                    }
                    self.refuse_handshake(tok, reason, &format!("handshake: {e}"));
                }
            }
            return;
        }
        if matches!(conn.state, ConnState::Tool { .. }) {
            self.on_tool_frame(tok, frame);
            return;
        }
        let Some(from) = conn.peer else {
            // Established connections always know their peer; any other state reads one
            // frame at a time and never gets here.
            self.protocol_error(tok, "a frame on a connection with no known rank");
            return;
        };
        if let Some(end) = conn.bulk_end {
            self.on_bulk_frame(tok, end, from, frame);
            return;
        }
        if frame.header.kind == Kind::Link {
            self.on_link_control(tok, from, &frame);
            return;
        }
        if crate::node::lane::keeps_bulk_writes_small(&frame.header) {
            self.messages.heard(self.now);
        }
        if let Some(session) = conn.session.as_mut() {
            match session.inb.accept() {
                // Acknowledged once the batch it came in is read (`on_readable`).
                Ok(true) => {}
                Ok(false) => {
                    // Written again after a break, and already here before it.
                    self.node.counters_mut().link_duplicates_dropped += 1;
                    return;
                }
                Err(e) => {
                    self.protocol_error(tok, &e.to_string());
                    return;
                }
            }
        }
        if frame.header.tag == crate::status::TAG_STATUS && frame.header.kind == Kind::Msg {
            // A clock sample's receipt: read the wall clock now, after the frame arrived.
            self.node
                .handle_wall_clock(Instant::now(), super::wall_clock_ns());
        }
        if let Err(why) = self
            .node
            .handle_frame(self.now, from, frame.header, frame.payload)
        {
            self.protocol_error(tok, &why);
        }
    }

    /// A link session's control frame from `from` on connection `tok`.
    fn on_link_control(&mut self, tok: usize, from: Rank, frame: &Frame) {
        let me = self.me;
        let control = match Control::decode(&frame.header, frame.payload.len()) {
            Ok(c) => c,
            Err(e) => return self.protocol_error(tok, &e.to_string()),
        };
        let Some(conn) = self.conns.get_mut(tok) else {
            return;
        };
        match control {
            Control::Start { session, count } => {
                match conn.resume_session(session, count, me, from) {
                    Ok((resent, dropped)) => {
                        let counters = self.node.counters_mut();
                        if resent > 0 {
                            counters.link_resumes += 1;
                            counters.link_frames_resent += resent as u64;
                            log::debug!(
                                "rank {me}: rank {from}: {resent} frames written again on the new connection"
                            );
                        }
                        if dropped > 0 {
                            counters.link_frames_given_up += dropped as u64;
                            log::warn!(
                                "rank {me}: rank {from} holds none of our link session; {dropped} frames it did not confirm are lost"
                            );
                        }
                        self.release_pending(tok, from);
                    }
                    Err(e) => self.protocol_error(tok, &e.to_string()),
                }
            }
            Control::Resume { session, first } => {
                let result = match conn.session.as_mut() {
                    Some(s) => s.inb.handle_resume(session, first),
                    None => Err(SessionError::OutOfOrder(
                        "a link Resume on a connection without a session",
                    )),
                };
                match result {
                    Ok(Started::Gap { lost }) => {
                        self.node.counters_mut().link_gaps += 1;
                        log::warn!(
                            "rank {me}: rank {from} resumed our link {lost} frames past what arrived; they are lost"
                        );
                    }
                    Ok(_) => {}
                    Err(e) => self.protocol_error(tok, &e.to_string()),
                }
            }
            Control::Ack { session, count } => {
                let result = match conn.session.as_mut() {
                    Some(s) => s.out.handle_ack(session, count),
                    None => Err(SessionError::OutOfOrder(
                        "a link Ack on a connection without a session",
                    )),
                };
                match result {
                    // Room again under the session's bound, or in the bulk pipe: what is held
                    // back may go.
                    Ok(released) if released > 0 && (conn.on_acked() || !conn.is_drained()) => {
                        self.mark_dirty(tok);
                        self.bulk_settle(from);
                    }
                    Ok(_) => self.bulk_settle(from),
                    Err(e) => self.protocol_error(tok, &e.to_string()),
                }
            }
        }
    }

    /// A valid Hello: answer it with our proof of the key, and nothing else. The rank it claims
    /// is unproven, so it takes part in no link decision (`oob::arbiter`); a stranger's Hello
    /// costs one HMAC and a pending connection within the bounds of `pending`.
    pub(super) fn on_hello(&mut self, tok: usize, peer: Rank) {
        let Some(conn) = self.conns.get_mut(tok) else {
            return;
        };
        conn.claimed = Some(peer);
        if let ConnState::Handshaking(hs) = &mut conn.state {
            hs.try_accept_peer();
        }
        self.pump_handshake(tok);
    }

    /// The dialler of an incoming connection proved it is rank `peer`: decide whether the
    /// connection becomes the link to `peer` (`oob::arbiter::admit`, the only place a
    /// simultaneous connect or a reconnection is resolved).
    fn on_authenticated(&mut self, tok: usize, peer: Rank, incarnation: u64) {
        if !self.node.may_link(peer, incarnation) {
            // It proved it is rank `peer`, which the DVM declared dead: admit it only to tell
            // it so (a dialler reads nothing before `Ready`), then hang up.
            self.admit_conn(tok);
            self.tell_dead_and_close(tok, peer);
            return;
        }
        if self.node.is_second_daemon(peer, incarnation) {
            // Rank 0: a second daemon for a living rank. Answered on its own connection, so
            // that the living daemon's link (and what is in flight on it) stays.
            self.admit_conn(tok);
            let (h, payload) = self.node.second_daemon_refusal(peer);
            self.answer_and_close(tok, peer, h, payload);
            return;
        }
        let quiet = Duration::from_millis(self.link_stall_ms() / 2);
        let now = self.now;
        let link = self.links.entry(peer).or_default();
        let link_dialler = link.conn.and_then(|t| self.conns.get(t)).map(|c| {
            if c.dialled.is_none() {
                LinkDialler::There
            } else if !quiet.is_zero() && c.watch.is_quiet(now, quiet) {
                LinkDialler::HereQuiet
            } else {
                LinkDialler::Here
            }
        });
        let dial_tok = link.dialing;
        let dial = dial_tok
            .and_then(|t| self.conns.get(t))
            .map(|c| match &c.state {
                ConnState::Handshaking(hs) if hs.has_sent_proof() => DialPhase::ProofSent,
                _ => DialPhase::Unproven,
            });
        match admit(self.me, peer, link_dialler, dial) {
            Admission::Refuse { probe_link } => {
                log::debug!(
                    "rank {}: rank {peer} dialled while the connection I dialled stands; \
                     keeping mine",
                    self.me
                );
                self.close(tok, None);
                if probe_link && let Some(t) = self.links.get(&peer).and_then(|l| l.conn) {
                    let h = self.node.probe_frame(peer);
                    if let Some(conn) = self.conns.get_mut(t)
                        && conn.takes_frames()
                        && conn.push(h, Bytes::new(), None).is_ok()
                    {
                        self.mark_dirty(t);
                    }
                }
            }
            Admission::Admit { close_dial, .. } => {
                if close_dial && let Some(d) = dial_tok {
                    log::debug!(
                        "rank {}: rank {peer} dialled me while I dialled it; keeping its dial",
                        self.me
                    );
                    self.links.entry(peer).or_default().dialing = None;
                    self.close(d, None);
                }
                // A link it replaces is closed (its unsent frames kept) by `established`.
                self.admit_conn(tok);
                self.established(tok, peer, incarnation);
            }
        }
    }

    /// Acceptor: queues the `Ready` that lets the dialler send.
    pub(super) fn admit_conn(&mut self, tok: usize) {
        if let Some(conn) = self.conns.get_mut(tok)
            && let ConnState::Handshaking(hs) = &mut conn.state
        {
            hs.admit();
        }
        self.pump_handshake(tok);
    }

    fn established(&mut self, tok: usize, peer: Rank, incarnation: u64) {
        if !self.node.may_link(peer, incarnation) {
            // It proved it is rank `peer`, which the DVM declared dead: it must not rejoin.
            self.tell_dead_and_close(tok, peer);
            return;
        }
        // A link that comes back after a loss (a probe answered, or the peer replaced its
        // connection) may have lost frames in flight: RELM offers the peer its state.
        let mut relink = self.links.get(&peer).is_some_and(|l| l.probe);
        if let Some(old) = self.links.get(&peer).and_then(|l| l.conn)
            && old != tok
        {
            log::info!(
                "rank {}: rank {peer} reconnected; replacing the old connection",
                self.me
            );
            self.requeue_and_close(old);
            relink = true;
        }
        let msg_max = self.cfg.msg_max_bytes as u32;
        let Some(conn) = self.conns.get_mut(tok) else {
            return;
        };
        // No longer pending: out of the handshake bounds, never evicted.
        self.pending.remove(conn.generation);
        conn.state = ConnState::Established;
        conn.peer = Some(peer);
        conn.decoder.set_max_payload(msg_max);
        log::debug!("rank {}: connected to rank {peer} ({})", self.me, conn.addr);
        conn.watch.handle_heard(self.now);
        let remote = conn.addr;
        let addrs = self.peer_addrs(peer);
        let Some(conn) = self.conns.get_mut(tok) else {
            return;
        };
        let link = self.links.entry(peer).or_default();
        if link.dialing == Some(tok) {
            link.dialing = None;
        }
        // The address it came over is the one to try first next time (an accepted
        // connection's source address is the peer's address on that network).
        if let Some(i) = addrs.iter().position(|a| a.ip() == remote.ip()) {
            link.addr_index = i;
        }
        link.conn = Some(tok);
        link.attempt = 0;
        link.probe = false;
        link.redial_armed = false;
        // The link session: its `Start` goes first; once the peer's arrives, the `Resume`, what
        // the last connection to this life of the peer wrote and the peer does not hold, then
        // what waited (`release_pending`).
        let resend_max = self.cfg.link_resend_max_bytes;
        let mut session = match link.session.take() {
            Some(s) => s,
            None => {
                // A link removed (its peer declared dead, departed) and made again must not
                // reuse a session number the peer may still hold.
                self.link_sessions = self.link_sessions.wrapping_add(1);
                let mut s = Box::new(LinkSession::new(
                    incarnation,
                    resend_max,
                    self.link_sessions << 32,
                    self.cfg.link_resend,
                ));
                if let Some((life, inb)) = self.link_inbound.remove(&peer)
                    && life == incarnation
                {
                    s.inb = inb;
                }
                s
            }
        };
        if session.incarnation != incarnation {
            // Another life of the peer: what the last one did not confirm died with it.
            let dropped = session.out.reset();
            session.inb.reset();
            session.incarnation = incarnation;
            if dropped > 0 {
                log::debug!(
                    "rank {}: rank {peer} came back as another life; {dropped} unconfirmed frames to the old one given up",
                    self.me
                );
            }
        }
        conn.open_session(session, self.me, peer);
        let failovers = self.links.get(&peer).map_or(0, |l| l.failovers);
        self.node.handle_link_path(peer, Some(remote), failovers);
        self.mark_dirty(tok);
        self.node
            .handle_link_up(Instant::now(), peer, incarnation, relink);
        self.carry_out();
    }

    /// The link's waiting frames go into its connection, now that its session resumed.
    fn release_pending(&mut self, tok: usize, peer: Rank) {
        let Some(conn) = self.conns.get_mut(tok) else {
            return;
        };
        let link = self.links.entry(peer).or_default();
        link.pending_bytes = 0;
        let pending: Vec<Pending> = link.pending.drain(..).collect();
        let mut refused = Vec::new();
        for p in pending {
            let kind = p.header.kind;
            if let Err((_, done)) = conn.push(p.header, p.payload, p.done) {
                refused.push((kind, done));
            }
        }
        for (kind, done) in refused {
            if kind == Kind::Grpcomm {
                self.grpcomm_resync.insert(peer);
            }
            self.queue_full(peer, done);
        }
        self.mark_dirty(tok);
    }

    pub(super) fn protocol_error(&mut self, tok: usize, why: &str) {
        if self.conns.get(tok).is_some_and(|c| !c.is_established()) {
            self.refuse_handshake(tok, Refusal::Malformed, why);
            return;
        }
        self.node.counters_mut().protocol_errors += 1;
        if let Some(session) = self.conns.get_mut(tok).and_then(|c| c.session.as_mut()) {
            // Refuse the peer's session: our next `Start` says so, and the peer gives up what it did not see confirmed rather than write the offending
            // frame again (`oob::session`).
            session.inb.refuse();
        }
        if let Some(c) = self.conns.get(tok) {
            let who = c
                .peer
                .or(c.claimed)
                .or(c.dialled)
                .map_or_else(|| "unknown rank".to_string(), |r| format!("rank {r}"));
            log::warn!(
                "rank {}: closing the connection with {} ({who}): {why}",
                self.me,
                c.addr
            );
        }
        self.lost(tok, why);
    }

    /// A connection ended (EOF, error, protocol violation, handshake timeout).
    pub(super) fn lost(&mut self, tok: usize, why: &str) {
        let Some(conn) = self.conns.get(tok) else {
            return;
        };
        if conn.bulk_end.is_some() {
            self.bulk_lost(tok, why);
            return;
        }
        log::debug!("rank {}: connection {} lost: {why}", self.me, conn.addr);
        if matches!(conn.state, ConnState::Tool { .. }) {
            self.close(tok, None);
            return;
        }
        let dialled = conn.dialled;
        let established = conn.is_established();
        let peer = conn.peer;
        if established {
            let Some(p) = peer else {
                crate::bug!("rank {}: an established connection with no rank", self.me);
                self.close(tok, None);
                return;
            };
            let is_current = self.links.get(&p).and_then(|l| l.conn) == Some(tok);
            if is_current {
                self.requeue_and_close(tok);
                if self.stopping.is_some() {
                    return;
                }
                // A lost tree neighbour (or rank 0) is probed by redialling: a peer that is
                // gone refuses or times out, and is declared failed after the bounded retries;
                // a live one answers (and, if the DVM already declared this daemon dead, says
                // so). Frames still waiting go out on the new connection.
                let watch = self.node.handle_link_lost(Instant::now(), p);
                if self.node.stopping().is_some() {
                    // What the peer sent before its close stopped this daemon (a DVM
                    // shutdown): an orderly end, not a loss. The node's stop is carried out
                    // with its other outputs.
                    log::debug!("rank {}: rank {p} closed the connection; stopping", self.me);
                    return;
                }
                // A lost direct link gives its frames to the tree (`Output::Fallback`) before
                // anything is redialled for them.
                self.carry_out();
                let link = self.links.entry(p).or_default();
                if watch {
                    link.probe = true;
                    log::info!(
                        "rank {}: lost connection to rank {p} ({why}); probing",
                        self.me
                    );
                }
                if watch || !link.pending.is_empty() {
                    self.ensure_dial(p);
                }
                self.ensure_dial_for_session(p);
                return;
            }
            self.close(tok, None);
            return;
        }
        let claimed = conn.claimed;
        // A connect still in progress got no answer (its timer, or the handshake timeout, ran
        // out), nor did a handshake that timed out (the host took the connection, no daemon
        // answered: a hung one, which the heartbeat timeout is to judge, not the dials: from
        // an outside-in review, a SIGSTOPped daemon declared dead after 34 s with a heartbeat
        // timeout of 400 s); otherwise the peer answered (it closed, reset or refused).
        let failure = if matches!(conn.state, ConnState::Connecting) || conn.unanswered {
            DialFailure::NoAnswer
        } else {
            DialFailure::Answered
        };
        // The claimed rank is one we dial, or are linked to, right now: most likely its dial
        // crossed ours and it kept ours (the link rule), an everyday event of joins and
        // repairs, not a stranger's (from an outside-in review: warnings at every join).
        let crossing = claimed.filter(|&p| p != TOOL_RANK).is_some_and(|p| {
            self.links.get(&p).is_some_and(|l| {
                l.dialing.is_some_and(|t| t != tok)
                    || l.conn
                        .filter(|&t| t != tok)
                        .and_then(|t| self.conns.get(t))
                        .is_some_and(Conn::is_established)
            })
        });
        if conn.refused {
            // Already logged and counted by whoever refused it.
        } else if let (true, Some(p)) = (crossing, claimed) {
            self.node.counters_mut().handshakes_abandoned += 1;
            log::debug!(
                "rank {}: {} (claiming rank {p}) gave up its dial before its proof: ours to it \
                 crossed it ({why})",
                self.me,
                conn.addr
            );
        } else if let Some(p) = claimed {
            // The dialler hung up between our HelloAck and its proof: most often it found our
            // MAC wrong, i.e. it does not hold this DVM's key (it logs that on its side).
            let addr = conn.addr;
            let counters = self.node.counters_mut();
            counters.protocol_errors += 1;
            counters.handshakes_abandoned += 1;
            self.log_refusal(Refusal::Abandoned, || {
                if p == TOOL_RANK {
                    format!(
                        "{addr} (an operator tool) closed the connection before proving it \
                         holds the operator credential ({why})"
                    )
                } else {
                    // Said as it is: a daemon of the DVM that gave up this dial (it found our
                    // proof wrong, or its own dial of us won, or it stopped) hangs up here
                    // too, not only a stranger (from an outside-in review: a repair's redial
                    // read like an intrusion).
                    format!(
                        "{addr} (claiming rank {p}) closed the connection before its proof of \
                         the job key: a stranger, or a daemon that gave up this dial ({why})"
                    )
                }
            });
        } else if dialled.is_none() {
            // An accepted connection that hung up before its Hello: counted, logged at
            // debug level only (above).
            self.node.counters_mut().handshakes_abandoned += 1;
        }
        // Read before `close`, which clears the link's record of this dial.
        let was_dialing =
            dialled.filter(|p| self.links.get(p).and_then(|l| l.dialing) == Some(tok));
        self.close(tok, None);
        if let Some(p) = was_dialing {
            self.dial_failed(p, failure);
        }
    }

    /// Closes an established connection and puts its unsent frames back at the head of the
    /// peer's pending queue; a frame cut off mid-write is lost and its sender told so.
    pub(super) fn requeue_and_close(&mut self, tok: usize) {
        let Some(conn) = self.conns.get_mut(tok) else {
            return;
        };
        let Some(peer) = conn.peer else {
            // Not established: nothing was queued on it for anyone.
            self.close(tok, None);
            return;
        };
        // Our bulk connection goes with the link: what it did not write joins the link's
        // bulk line first, to be taken back with it in order.
        if let Some(link) = self.links.get(&peer)
            && link.conn == Some(tok)
            && let Some(bulk) = link.bulk_out
        {
            self.give_back_bulk(peer, bulk);
            self.close(bulk, None);
        }
        let Some(conn) = self.conns.get_mut(tok) else {
            return;
        };
        let (unsent, cut, kept) = conn.take_unsent();
        for done in cut {
            // A frame cut off mid-write goes again whole if the link session kept it.
            complete(
                done,
                if kept {
                    Ok(())
                } else {
                    Err(SendError::Unreachable(peer))
                },
            );
        }
        self.close(tok, None);
        let link = self.links.entry(peer).or_default();
        if link.conn == Some(tok) {
            link.conn = None;
        }
        for (header, payload, done) in unsent.into_iter().rev() {
            // Heartbeats are not worth keeping; RELM frames are (they save a retransmission).
            // Collective frames too: the cores tolerate the duplicates, and the link is
            // re-stated when it comes back.
            if matches!(
                header.kind,
                Kind::Msg | Kind::Xcast | Kind::RelmData | Kind::Relm | Kind::Grpcomm
            ) {
                link.pending_bytes += payload.len() + crate::oob::header::HEADER_LEN;
                link.pending.push_front(Pending {
                    header,
                    payload,
                    done,
                });
            }
        }
        self.report_waiting(peer);
    }

    /// Deregisters and drops a connection; its remaining completions fail with `err` (or
    /// `ShutDown`).
    pub(super) fn close(&mut self, tok: usize, err: Option<SendError>) {
        if !self.conns.contains(tok) {
            return;
        }
        let mut conn = self.conns.remove(tok);
        self.pending.remove(conn.generation);
        let _ = self.poll.registry().deregister(&mut conn.stream);
        let err_again = err.clone();
        let err = err.unwrap_or(SendError::ShutDown);
        for done in conn.completions.drain(..) {
            complete(done, Err(err.clone()));
        }
        if let Some(session) = conn.session.take()
            && let Some(p) = conn.peer
        {
            // Kept for the next connection to this life of the peer (dropped with the link
            // when the peer is declared dead).
            self.links.entry(p).or_default().session = Some(session);
        }
        let mut bulk_too = None;
        if let Some(p) = conn.peer.or(conn.dialled).or(conn.claimed)
            && let Some(link) = self.links.get_mut(&p)
        {
            if link.conn == Some(tok) {
                link.conn = None;
                self.node.handle_link_path(p, None, link.failovers);
                // Our bulk connection does not outlive the link (`requeue_and_close` took
                // back its frames when there was a reason to keep them).
                bulk_too = link.bulk_out;
            }
            if link.dialing == Some(tok) {
                link.dialing = None;
            }
            if link.bulk_out == Some(tok) {
                link.bulk_out = None;
                link.bulk_route.handle_bulk_down();
                if let Some(c) = link.conn.and_then(|t| self.conns.get_mut(t)) {
                    c.set_bulk_held(false);
                }
            }
            if link.bulk_in == Some(tok) {
                link.bulk_in = None;
            }
        }
        self.readable_again.remove(&tok);
        if let Some(b) = bulk_too {
            self.close(b, err_again);
        }
    }

    /// Notes that connection `tok` has frames to write (flushed at the end of the turn). A run
    /// of frames to one connection takes one entry.
    pub(super) fn mark_dirty(&mut self, tok: usize) {
        if self.dirty.last() != Some(&tok) {
            self.dirty.push(tok);
        }
    }

    /// Tells the node how full the queues written to since the last flush are (flow control
    /// decides from them which neighbours are read).
    pub(super) fn report_queues(&mut self) {
        // Only the connections queued to since the last report (the list grows by one entry
        // per run of frames until the flush): reporting the whole list per batch would be
        // quadratic. The last entry reported is reported again: frames queued to it since
        // were not appended (`mark_dirty`).
        let from = self.dirty_reported.min(self.dirty.len()).saturating_sub(1);
        self.dirty_reported = self.dirty.len();
        let mut last = None;
        for &tok in self.dirty.get(from..).unwrap_or(&[]) {
            if last == Some(tok) {
                continue;
            }
            last = Some(tok);
            if let Some((p, queued, bulk)) = self.peer_levels(tok) {
                self.node.handle_send_queue(self.now, p, queued, bulk);
            }
        }
    }

    /// Connections left unread by flow control that may be read now: read next turn.
    pub(super) fn resume_paused(&mut self) {
        if self.paused.is_empty() {
            return;
        }
        let now = Instant::now();
        let node = &self.node;
        let conns = &self.conns;
        let mut resume = Vec::new();
        self.paused.retain(|&tok| {
            let Some(conn) = conns.get(tok) else {
                return false;
            };
            match conn.peer.filter(|_| conn.is_established()) {
                Some(p) if !may_read(node, now, p, conn) && !conn.awaits_acks() => true,
                _ => {
                    resume.push(tok);
                    false
                }
            }
        });
        self.readable_again.extend(resume);
    }

    pub(super) fn flush_dirty(&mut self) {
        self.dirty_reported = 0;
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        let mut completed = std::mem::take(&mut self.written_early);
        let mut again = Vec::new();
        let bulk_bytes = self.messages.bulk_flush_bytes(self.now);
        for tok in dirty.drain(..) {
            let Some(conn) = self.conns.get_mut(tok) else {
                continue;
            };
            if matches!(conn.state, ConnState::Connecting) {
                continue;
            }
            // A due acknowledgement rides on what this flush writes.
            if conn.ack_due
                && !conn.is_drained()
                && let Some(peer) = conn.peer
            {
                conn.ack_now(self.me, peer);
            }
            let flushed = conn.flush(&mut completed, bulk_bytes);
            if let Some((p, queued, bulk)) = self.peer_levels(tok) {
                self.node.handle_send_queue(self.now, p, queued, bulk);
            }
            match flushed {
                Ok(true) => again.push(tok),
                Ok(false) => {}
                Err(e) => self.lost(tok, &format!("write: {e}")),
            }
        }
        // Stopped at the write bound with the socket still writable: no event will come.
        // (The list's allocation is kept: it is needed again next turn; closing a connection
        // above may have queued to others.)
        let queued_meanwhile = std::mem::replace(&mut self.dirty, dirty);
        self.dirty.extend(queued_meanwhile);
        self.dirty.extend(again);
        for done in completed.drain(..) {
            complete(done, Ok(()));
        }
        // The list's allocation is kept for the next turn, unless more came meanwhile.
        if self.written_early.is_empty() {
            self.written_early = completed;
        }
        self.check_grpcomm_resync();
    }

    /// Links that dropped collective frames, re-stated once their queue is down to half.
    fn check_grpcomm_resync(&mut self) {
        if self.grpcomm_resync.is_empty() {
            return;
        }
        let ready: Vec<Rank> = self
            .grpcomm_resync
            .iter()
            .copied()
            .filter(|r| {
                let link = self.links.get(r);
                let conn = link.and_then(|l| l.conn).and_then(|t| self.conns.get(t));
                match conn {
                    Some(c) => c.queued_bytes() <= c.queue.max_bytes() / 2,
                    None => false,
                }
            })
            .collect();
        for r in ready {
            self.grpcomm_resync.remove(&r);
            self.node.handle_link_restate(Instant::now(), r);
        }
        self.carry_out();
    }

    /// Closes every connection to the dead ranks and takes back what was queued for them.
    pub(super) fn take_frames(&mut self, dead: &[Rank]) -> Vec<Pending> {
        let mut frames = Vec::new();
        for r in dead {
            let toks: Vec<usize> = self
                .conns
                .iter()
                .filter(|(_, c)| c.peer == Some(*r) || c.dialled == Some(*r))
                .map(|(t, _)| t)
                .collect();
            for t in toks {
                if let Some(conn) = self.conns.get_mut(t) {
                    let (unsent, lost, _) = conn.take_unsent();
                    for done in lost {
                        complete(done, Err(SendError::NodeDown(*r)));
                    }
                    frames.extend(unsent.into_iter().map(|(header, payload, done)| Pending {
                        header,
                        payload,
                        done,
                    }));
                }
                self.close(t, Some(SendError::NodeDown(*r)));
            }
            if let Some(mut link) = self.links.remove(r) {
                frames.extend(link.pending.drain(..));
                // What this daemon holds of the peer's session outlives the link: a rank
                // taken for dead may still be talking (a join in progress, a stall), and
                // its next connection must not be able to write frames here twice.
                if let Some(session) = link.session.take() {
                    self.link_inbound
                        .insert(*r, (session.incarnation, session.inb));
                }
            }
        }
        frames
    }

    /// A rank the node knows failed connected to us (and proved who it is): tell it, then hang
    /// up.
    fn tell_dead_and_close(&mut self, tok: usize, peer: Rank) {
        let h = self.node.declared_dead_frame(peer);
        self.answer_and_close(tok, peer, h, Bytes::new());
    }

    /// Writes one frame on an admitted connection that will not become `peer`'s link (a
    /// dialler reads nothing before `Ready`), then closes it.
    fn answer_and_close(&mut self, tok: usize, peer: Rank, h: Header, payload: Bytes) {
        if let Some(conn) = self.conns.get_mut(tok) {
            // The dialler's end is established: its session wants a `Resume` before any
            // frame (session 0 is no real session's number).
            let start = Control::Resume {
                session: 0,
                first: 0,
            };
            let _ = conn.push(start.header(self.me, peer), Bytes::new(), None);
            let _ = conn.push(h, payload, None);
            let mut done = Vec::new();
            // One tiny frame on a fresh socket; if the kernel does not take it now, the peer
            // learns it from the closed connection and its failed reconnects instead.
            let _ = conn.flush(&mut done, limits::BULK_FLUSH_BYTES);
        }
        self.close(tok, None);
    }

    /// Closes a connection in its handshake for `reason`: counted once (`protocol_errors`,
    /// and `handshakes_refused` or `handshakes_timed_out`), logged at a bounded rate.
    pub(super) fn refuse_handshake(&mut self, tok: usize, reason: Refusal, why: &str) {
        let counters = self.node.counters_mut();
        counters.protocol_errors += 1;
        if reason == Refusal::Timeout {
            counters.handshakes_timed_out += 1;
        } else {
            counters.handshakes_refused += 1;
        }
        self.refusal_closes(tok, reason, why);
    }

    /// Logs (rate-limited) and closes a refused connection, marked so that `lost` does not
    /// count or log it again.
    fn refusal_closes(&mut self, tok: usize, reason: Refusal, why: &str) {
        let Some(c) = self.conns.get_mut(tok) else {
            return;
        };
        c.refused = true;
        let addr = c.addr;
        let who = c
            .peer
            .or(c.claimed)
            .or(c.dialled)
            .map_or_else(|| "unknown rank".to_string(), |r| format!("rank {r}"));
        self.log_refusal(reason, || {
            format!("closing the connection with {addr} ({who}): {why}")
        });
        self.lost(tok, why);
    }

    /// Writes one refusal line unless its reason is over its budget (then counted), after the
    /// summary of the reason's last interval if one is due.
    pub(super) fn log_refusal(&mut self, reason: Refusal, line: impl FnOnce() -> String) {
        let (write, summary) = self.log_limit.admit(reason, self.now);
        if let Some(s) = summary {
            self.log_summary(s);
        }
        if write {
            log::warn!("rank {}: {}", self.me, line());
        }
    }

    pub(super) fn log_summary(&self, s: Summary) {
        log::warn!(
            "rank {}: {} more refused for {} in the last {:.0} s",
            self.me,
            s.suppressed,
            s.reason.as_str(),
            s.over.as_secs_f64()
        );
    }

    /// Once per turn: the refusal summaries that are due; about once a second, memory a flood
    /// left behind (the connection table's unused tail, the timer heap's spare room).
    pub(super) fn housekeeping(&mut self) {
        if self.now < self.housekeeping_at {
            return;
        }
        self.housekeeping_at = self.now + Duration::from_secs(1);
        // Once a second, not per turn (a turn of a ping-pong is a few thousand instructions):
        // a summary of suppressed lines comes at most a second after its interval ends, and
        // the node's wall clock is extrapolated from this reading by the monotonic clock (a
        // clock sample's receipt reads it afresh, above).
        for s in self.log_limit.due(self.now) {
            self.log_summary(s);
        }
        self.node
            .handle_wall_clock(self.now, super::wall_clock_ns());
        let cap = self.conns.capacity();
        if cap > limits::CONN_TABLE_SHRINK_MIN && self.conns.len() < cap / 4 {
            self.conns.shrink_to_fit();
        }
        self.timers.shrink();
        self.payload_pool.release_unused();
        self.shared.batch_pool.release_unused();
        self.close_idle_tools(self.now);
        // An idle daemon keeps no read region or spare packing buffer per connection (64 KiB
        // each): buffers holding nothing are given back once a second (a busy connection
        // allocates one again per second, nothing measurable).
        for (_, conn) in self.conns.iter_mut() {
            if conn.is_established() {
                conn.decoder.release_idle();
                conn.release_idle();
                if let Some(session) = conn.session.as_mut() {
                    session.out.store_mut().release_idle();
                }
            }
        }
        if self.readable_again.is_empty() && self.readable_again.capacity() > 1024 {
            self.readable_again = Default::default();
        }
    }
}

/// Whether flow control lets `conn`, a connection with neighbour `peer`, be read now: a bulk
/// connection as the node reads its neighbour, any other as it reads a link.
fn may_read(node: &crate::node::Node, now: Instant, peer: Rank, conn: &Conn) -> bool {
    if conn.is_bulk_in() {
        node.may_read(now, peer)
    } else {
        node.may_read_link(now, peer)
    }
}
