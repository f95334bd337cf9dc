//! The daemon's one loop: a `mio::Poll` that owns every piece of the daemon's state — sockets,
//! peers, routing, receive matching, wire-up and timers. Nothing else touches that state; other
//! threads reach it through [`Caddy`] commands.
//!
//! One turn of the loop: drain commands (bounded batch), deliver local messages, queue what the
//! collectives (`grpcomm`) and reliable messaging (RELM) asked for, flush the connections that got frames (so a burst
//! coalesces into one `writev` per peer), poll with the nearest timer as timeout, handle socket
//! events, fire expired timers.

mod collectives;

pub(crate) use collectives::broadcast_max;
mod faults;
mod reliable;

use super::caddy::{AllgatherCompletion, Caddy, Completion, FaultHandler, RecvCallback};
use super::conn::{Conn, ConnState};
use super::handle::{Shared, StopReason, lock};
use super::timers::{TimerKind, Timers};
use super::wireup::{self, WireupCollector};
use crate::Rank;
use crate::config::Config;
use crate::counters::Counters;
use crate::error::SendError;
use crate::faults::HeartbeatMonitor;
use crate::faults::notice::{TAG_ADOPTED, TAG_DECLARED_DEAD, TAG_FAULT_REPORT, TAG_ROOT_LOST};
use crate::fxhash::{FxHashMap, FxHashSet};
use crate::grpcomm::{Allgather, TAG_XCAST_DONE, TAG_XCAST_REQUEST, Xcast};
use crate::limits;
use crate::oob::frame::Frame;
use crate::oob::handshake::{Handshake, HandshakeConfig, HandshakeEvent, JobKey, keep_dialled_by};
use crate::oob::header::{Header, Kind};
use crate::oob::send_queue::Payload;
use crate::oob::uri::ContactUri;
use crate::relm::Relm;
use crate::rml::{Dispatch, Matcher, Message, Peer, ReceiveId, TAG_USER_MIN, Tag};
use crate::routed::{Route, RoutingState, Scope};
use bytes::Bytes;
use crossbeam_channel::Receiver;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use slab::Slab;
use std::collections::{BTreeSet, VecDeque};
use std::io::{self, Read};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

pub(crate) const WAKER_TOKEN: Token = Token(usize::MAX);
/// Listener i uses token `LISTENER_TOKEN_BASE - i`.
pub(crate) const LISTENER_TOKEN_BASE: usize = usize::MAX - 1;

/// A frame waiting for a connection to its next hop.
struct Pending {
    header: Header,
    payload: Payload,
    done: Option<Completion>,
}

/// What this daemon knows of one neighbour it talks to directly.
#[derive(Default)]
struct Link {
    /// The established connection.
    conn: Option<usize>,
    /// Our outgoing attempt, connecting or handshaking.
    dialing: Option<usize>,
    /// An incoming connection from this peer whose handshake is under way (Hello accepted,
    /// proof pending). No dial is started meanwhile: two connections established at once
    /// could each be kept by one side and closed by the other, losing what was sent on them.
    incoming: Option<usize>,
    /// Frames waiting for `conn` (bounded by `send_queue_max_bytes`).
    pending: VecDeque<Pending>,
    pending_bytes: usize,
    /// Consecutive failed dial attempts.
    attempt: u32,
    /// The connection to this tree neighbour was lost: keep redialling (bounded) even with
    /// nothing to send, and declare it failed if it cannot be reached.
    probe: bool,
    redial_armed: bool,
}

enum Wire {
    /// Rank 0 collecting reports.
    Collecting(WireupCollector),
    /// Waiting for the contact table; sends are held (bounded).
    Waiting,
    Wired,
}

pub(crate) struct EventLoop {
    poll: Poll,
    shared: Arc<Shared>,
    rx: Receiver<Caddy>,
    cfg: Config,
    me: Rank,
    size: u32,
    epoch: u64,
    hs_cfg: HandshakeConfig,
    uri: ContactUri,
    routing: RoutingState,
    listeners: Vec<TcpListener>,
    conns: Slab<Conn>,
    next_generation: u64,
    links: FxHashMap<Rank, Link>,
    contacts: Vec<Option<ContactUri>>,
    matcher: Matcher,
    receives: FxHashMap<ReceiveId, (Peer, Tag, u64, RecvCallback)>,
    timers: Timers,
    wire: Wire,
    prewire: VecDeque<Caddy>,
    local: VecDeque<Message>,
    dirty: Vec<usize>,
    readable_again: FxHashSet<usize>,
    /// Frames decoded from one read, kept between reads so decoding allocates nothing.
    frame_buf: Vec<Frame>,
    counters: Counters,
    stopping: Option<StopReason>,
    monitor: HeartbeatMonitor,
    /// Ranks rank 0 has confirmed dead (all of them, ascending).
    confirmed: Vec<Rank>,
    fault_handlers: Vec<FaultHandler>,
    /// Reliable messaging (sans-IO; driven from `event_loop/reliable.rs`).
    relm: Relm,
    /// Completions of reliable sends by RELM token; at most `relm_unacked_max` (RELM refuses
    /// a send beyond it).
    relm_done: FxHashMap<u64, Completion>,
    relm_next_token: u64,
    /// Deadlines of the `TimerKind::Relm` timers armed and not yet fired. A new one is armed
    /// only when earlier than all of these, so they stay few.
    relm_timers: BTreeSet<Instant>,
    /// The fault-tolerant broadcast (sans-IO; driven from `event_loop/collectives.rs`).
    xcast: Xcast,
    /// Allgather and barrier (sans-IO; same file).
    allgather: Allgather,
    /// This daemon's user broadcasts by request id, with their completions (at most
    /// `XCAST_ORIGINATE_MAX`, or `XCAST_INFLIGHT_MAX` on rank 0: the core refuses beyond).
    bcast_done: FxHashMap<u64, Option<Completion>>,
    /// Completions of this daemon's collectives by id (at most `ALLGATHER_INFLIGHT_MAX`).
    ag_done: FxHashMap<u64, AllgatherCompletion>,
    /// Rank 0: its own notices waiting for room in its window (`GRPCOMM_DEFERRED_MAX`).
    xcast_deferred: VecDeque<(Tag, Bytes)>,
    /// Requests and dones waiting for room in RELM's window (`GRPCOMM_RELIABLE_BACKLOG_MAX`).
    relm_backlog: VecDeque<(Rank, Tag, Bytes)>,
    /// Neighbours whose collective frames were dropped at a full queue: re-stated once it
    /// drains (at most one entry per neighbour).
    grpcomm_resync: FxHashSet<Rank>,
}

impl EventLoop {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        poll: Poll,
        shared: Arc<Shared>,
        rx: Receiver<Caddy>,
        cfg: Config,
        routing: RoutingState,
        listeners: Vec<TcpListener>,
        uri: ContactUri,
        hnp: Option<ContactUri>,
        key: JobKey,
    ) -> Self {
        let me = routing.me();
        let size = routing.size();
        let epoch = 0;
        let hs_cfg = HandshakeConfig {
            me,
            size,
            epoch,
            dvm_id: cfg.dvm_id.clone(),
            key,
        };
        let cfg_hb = (cfg.heartbeat_interval_ms, cfg.heartbeat_timeout_ms);
        let mut contacts = vec![None; size as usize];
        let wire = if me == 0 {
            Wire::Collecting(WireupCollector::new(size, uri.clone()))
        } else {
            if let (Some(slot), Some(h)) = (contacts.get_mut(0), hnp) {
                *slot = Some(h);
            }
            Wire::Waiting
        };
        let relm = Relm::new(me, size, cfg.relm());
        let xcast_limits = collectives::xcast_limits(cfg.msg_max_bytes as usize);
        let xcast = Xcast::with_limits(&routing, xcast_limits);
        let allgather = Allgather::new(&routing);
        EventLoop {
            poll,
            shared,
            rx,
            matcher: Matcher::new(cfg.unmatched_max),
            cfg,
            me,
            size,
            epoch,
            hs_cfg,
            uri,
            routing,
            listeners,
            conns: Slab::new(),
            next_generation: 0,
            links: FxHashMap::default(),
            contacts,
            receives: FxHashMap::default(),
            timers: Timers::default(),
            wire,
            prewire: VecDeque::new(),
            local: VecDeque::new(),
            dirty: Vec::new(),
            readable_again: FxHashSet::default(),
            frame_buf: Vec::new(),
            counters: Counters::default(),
            stopping: None,
            monitor: HeartbeatMonitor::new(
                Duration::from_millis(cfg_hb.0),
                Duration::from_millis(cfg_hb.1),
            ),
            confirmed: Vec::new(),
            fault_handlers: Vec::new(),
            relm,
            relm_done: FxHashMap::default(),
            relm_next_token: 0,
            relm_timers: BTreeSet::new(),
            xcast,
            allgather,
            bcast_done: FxHashMap::default(),
            ag_done: FxHashMap::default(),
            xcast_deferred: VecDeque::new(),
            relm_backlog: VecDeque::new(),
            grpcomm_resync: FxHashSet::default(),
        }
    }

    /// Runs until the daemon stops. Never panics on network input; returns after closing every
    /// socket and failing every pending send.
    pub(crate) fn run(mut self) {
        if let Err(e) = self.run_inner() {
            log::error!("rank {}: event loop failed: {e}", self.me);
            self.stopping = Some(StopReason::Fatal(e.to_string()));
        }
        self.finish();
    }

    fn run_inner(&mut self) -> io::Result<()> {
        for (i, l) in self.listeners.iter_mut().enumerate() {
            self.poll
                .registry()
                .register(l, Token(LISTENER_TOKEN_BASE - i), Interest::READABLE)?;
        }
        self.start_wireup();
        let mut events = Events::with_capacity(limits::POLL_EVENTS_MAX);
        loop {
            let drained_all = self.drain_commands();
            self.deliver_local();
            // What the commands, events and timers since the last turn made the collectives and
            // RELM want (the collectives' requests and dones are RELM messages).
            self.pump_grpcomm();
            self.pump_relm();
            self.flush_dirty();
            if self.ready_to_exit() {
                return Ok(());
            }
            let now = Instant::now();
            let mut timeout = self.timers.poll_timeout(now);
            if !drained_all
                || !self.local.is_empty()
                || !self.readable_again.is_empty()
                || !self.dirty.is_empty()
            {
                timeout = Some(Duration::ZERO);
            }
            if timeout != Some(Duration::ZERO) {
                // Announce sleep, then re-check: a command pushed after this store sees
                // `asleep` and wakes us; one pushed before it is seen by `is_empty`.
                self.shared.asleep.store(true, Ordering::SeqCst);
                if !self.rx.is_empty() {
                    timeout = Some(Duration::ZERO);
                }
            }
            let res = self.poll.poll(&mut events, timeout);
            self.shared.asleep.store(false, Ordering::SeqCst);
            match res {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            // Commands before socket events: a command issued before a frame it caused (a
            // cancel before the peer's send, say) was pushed before `poll` saw that frame, so
            // handling commands first keeps cause before effect.
            self.drain_commands();
            for ev in events.iter() {
                match ev.token() {
                    WAKER_TOKEN => {}
                    Token(t) if t > LISTENER_TOKEN_BASE - self.listeners.len() => {
                        self.accept(LISTENER_TOKEN_BASE - t);
                    }
                    Token(t) => {
                        if ev.is_writable() {
                            self.on_writable(t);
                        }
                        if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                            self.on_readable(t);
                        }
                    }
                }
            }
            let again: Vec<usize> = self.readable_again.drain().collect();
            for t in again {
                self.on_readable(t);
            }
            self.fire_timers();
        }
    }

    // ----- commands -------------------------------------------------------------------------

    /// Drains at most a batch of commands; returns whether the channel is now empty.
    fn drain_commands(&mut self) -> bool {
        for _ in 0..limits::COMMANDS_PER_TURN_MAX {
            match self.rx.try_recv() {
                Ok(c) => {
                    self.counters.commands += 1;
                    self.command(c);
                }
                Err(_) => return true,
            }
        }
        false
    }

    fn command(&mut self, c: Caddy) {
        if self.stopping.is_some() {
            self.refuse(c);
            return;
        }
        match c {
            Caddy::Send {
                dst,
                tag,
                payload,
                done,
            } => {
                if !matches!(self.wire, Wire::Wired) && dst != self.me {
                    if self.prewire.len() >= self.cfg.prewire_queue_max {
                        complete(done, Err(SendError::Busy("the pre-wire-up queue")));
                    } else {
                        self.prewire.push_back(Caddy::Send {
                            dst,
                            tag,
                            payload,
                            done,
                        });
                    }
                    return;
                }
                self.counters.sent += 1;
                self.send(dst, tag, payload, done);
            }
            Caddy::SendReliable {
                dst,
                tag,
                payload,
                done,
            } => {
                if !matches!(self.wire, Wire::Wired) && dst != self.me {
                    if self.prewire.len() >= self.cfg.prewire_queue_max {
                        complete(done, Err(SendError::Busy("the pre-wire-up queue")));
                    } else {
                        self.prewire.push_back(Caddy::SendReliable {
                            dst,
                            tag,
                            payload,
                            done,
                        });
                    }
                    return;
                }
                self.counters.sent += 1;
                self.send_reliable(dst, tag, payload, done);
            }
            Caddy::Broadcast { tag, payload, done } => {
                if !matches!(self.wire, Wire::Wired) {
                    if self.prewire.len() >= self.cfg.prewire_queue_max {
                        complete(done, Err(SendError::Busy("the pre-wire-up queue")));
                    } else {
                        self.prewire
                            .push_back(Caddy::Broadcast { tag, payload, done });
                    }
                    return;
                }
                self.broadcast(tag, payload, done);
            }
            Caddy::Allgather { id, data, done } => {
                if !matches!(self.wire, Wire::Wired) {
                    if self.prewire.len() >= self.cfg.prewire_queue_max {
                        done(Err(SendError::Busy("the pre-wire-up queue")));
                    } else {
                        self.prewire.push_back(Caddy::Allgather { id, data, done });
                    }
                    return;
                }
                self.allgather(id, data, done);
            }
            Caddy::Recv {
                peer,
                tag,
                persistent,
                callback,
                post,
            } => match self.matcher.post(peer, tag, persistent) {
                Ok((id, deliveries)) => {
                    self.receives.insert(id, (peer, tag, post, callback));
                    for d in deliveries {
                        self.dispatch(d);
                    }
                }
                Err(e) => log::warn!("rank {}: {e}", self.me),
            },
            Caddy::Cancel {
                peer,
                tag,
                post,
                done,
            } => self.cancel_receive(peer, tag, post, done),
            Caddy::Purge { peer } => {
                let (ids, dropped) = self.matcher.purge(peer);
                for id in ids {
                    self.receives.remove(&id);
                }
                log::debug!(
                    "rank {}: purged rank {peer} ({dropped} held messages)",
                    self.me
                );
            }
            Caddy::Counters(tx) => {
                let _ = tx.send(self.snapshot());
            }
            Caddy::OnFault(h) => self.fault_handlers.push(h),
            Caddy::Abort => {
                log::info!("rank {}: aborting", self.me);
                self.begin_stop(StopReason::Requested);
                let toks: Vec<usize> = self.conns.iter().map(|(t, _)| t).collect();
                for t in toks {
                    self.close(t, None);
                }
            }
            Caddy::Shutdown { dvm } => {
                if dvm && self.me == 0 {
                    // Rank 0 stops when it delivers its own shutdown, after forwarding it to
                    // its children (or, if its window is full, once the notice got in).
                    self.originate_runtime(wireup::TAG_SHUTDOWN, Bytes::new());
                    self.pump_grpcomm();
                } else {
                    self.begin_stop(StopReason::Requested);
                }
            }
        }
    }

    /// Answers a command that arrives while stopping.
    fn refuse(&mut self, c: Caddy) {
        match c {
            Caddy::Send { done, .. }
            | Caddy::SendReliable { done, .. }
            | Caddy::Broadcast { done, .. } => complete(done, Err(SendError::ShutDown)),
            Caddy::Allgather { done, .. } => done(Err(SendError::ShutDown)),
            Caddy::Recv {
                peer, tag, post, ..
            } => self.shared.unpost(peer, tag, post),
            Caddy::Counters(tx) => {
                let _ = tx.send(self.snapshot());
            }
            Caddy::Abort => {
                let toks: Vec<usize> = self.conns.iter().map(|(t, _)| t).collect();
                for t in toks {
                    self.close(t, None);
                }
            }
            // Messages are still delivered while stopping: cancel, and answer the waiter.
            Caddy::Cancel {
                peer,
                tag,
                post,
                done,
            } => self.cancel_receive(peer, tag, post, done),
            Caddy::Purge { .. } | Caddy::Shutdown { .. } | Caddy::OnFault(_) => {}
        }
    }

    /// Removes the receive for (peer, tag) if it is still post `post` (a one-shot that matched
    /// is gone already, and the pair may have been posted again since), then answers `done`.
    fn cancel_receive(
        &mut self,
        peer: Peer,
        tag: Tag,
        post: u64,
        done: Option<crossbeam_channel::Sender<()>>,
    ) {
        if let Some(id) = self.matcher.receive_id(peer, tag)
            && self.receives.get(&id).is_some_and(|r| r.2 == post)
        {
            self.matcher.cancel(peer, tag);
            self.receives.remove(&id);
        }
        if let Some(done) = done {
            let _ = done.send(());
        }
    }

    fn snapshot(&self) -> Counters {
        let mut c = self.counters.clone();
        c.wakeups = self.shared.wakeups.load(Ordering::Relaxed);
        c.connections = self.conns.len() as u64;
        c.parent = self.routing.parent();
        c.children = self.routing.children().to_vec();
        c.epoch = self.epoch;
        c.failed = self.routing.failed().collect();
        let r = self.relm.stats();
        c.relm_sent = r.sent;
        c.relm_posted = r.posted;
        c.relm_duplicates = r.duplicates;
        c.relm_retransmits = r.retransmits;
        c.relm_replays = r.replays;
        c.relm_ignored = r.ignored;
        c.relm_evicted = r.evicted;
        c.relm_refused = r.refused;
        c.relm_link_updates = r.link_updates;
        let (unacked, cached, pending) = self.relm.records();
        c.relm_unacked = unacked as u64;
        c.relm_cached = cached as u64;
        c.relm_pending = pending as u64;
        self.collective_counters(&mut c);
        c
    }

    // ----- sending and routing --------------------------------------------------------------

    fn header(&self, kind: Kind, origin: Rank, dst: Rank, tag: Tag, len: usize) -> Header {
        Header {
            kind,
            origin,
            dst,
            tag,
            epoch: self.epoch,
            seq: 0,
            len: len as u32,
        }
    }

    /// Sends a message originated here (user or runtime tag) along the tree.
    fn send(&mut self, dst: Rank, tag: Tag, payload: Bytes, done: Option<Completion>) {
        if dst == self.me {
            self.local.push_back(Message {
                origin: self.me,
                tag,
                payload,
            });
            complete(done, Ok(()));
            return;
        }
        let header = self.header(Kind::Msg, self.me, dst, tag, payload.len());
        self.forward(header, payload.into(), done);
    }

    /// Routes a point-to-point frame one hop towards its destination.
    fn forward(&mut self, header: Header, payload: Payload, done: Option<Completion>) {
        let dst = header.dst;
        match self.routing.route(dst) {
            Route::Local => {
                // Only reachable for frames addressed to us, which are delivered before.
                complete(done, Ok(()));
            }
            Route::Parent(hop) | Route::Child(hop) => {
                self.enqueue(hop, header, payload, done);
            }
            Route::Unreachable => {
                self.counters.dropped_unreachable += 1;
                let err = if self.routing.is_failed(dst) {
                    SendError::NodeDown(dst)
                } else {
                    SendError::Unreachable(dst)
                };
                log::debug!("rank {}: dropping frame for {dst}: {err}", self.me);
                complete(done, Err(err));
            }
        }
    }

    /// Queues a frame for a directly connected neighbour, dialling it if needed. Returns
    /// `false` if the bounded queue refused it (see `queue_full`).
    fn enqueue(
        &mut self,
        peer: Rank,
        header: Header,
        payload: impl Into<Payload>,
        done: Option<Completion>,
    ) -> bool {
        let payload = payload.into();
        let link = self.links.entry(peer).or_default();
        if let Some(tok) = link.conn
            && let Some(conn) = self.conns.get_mut(tok)
        {
            return match conn.push(header, payload, done) {
                Ok(()) => {
                    self.dirty.push(tok);
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
        true
    }

    /// A frame did not fit the bounded queue towards `peer`. A frame originated here fails its
    /// sender's completion with `Busy` (back-pressure); a frame without one (relayed, broadcast
    /// copy, notice) is dropped, counted, and logged at the first drop of each run of drops.
    fn queue_full(&mut self, peer: Rank, done: Option<Completion>) {
        if done.is_some() {
            complete(done, Err(SendError::Busy("the peer's send queue")));
            return;
        }
        self.counters.dropped_queue_full += 1;
        let n = self.counters.dropped_queue_full;
        if n.is_power_of_two() {
            log::warn!(
                "rank {}: send queue to rank {peer} is full; dropped a relayed frame ({n} so far)",
                self.me
            );
        }
    }

    /// Floods a frame down the tree, to every current child (the payload is shared, never
    /// copied). Only for what cannot be a broadcast: the contact table and "rank 0 lost".
    pub(super) fn flood(&mut self, origin: Rank, tag: Tag, payload: &Bytes) {
        let children: Vec<Rank> = self.routing.children().to_vec();
        for c in children {
            let h = self.header(Kind::Xcast, origin, c, tag, payload.len());
            self.enqueue(c, h, payload.clone(), None);
        }
    }

    // ----- delivery -------------------------------------------------------------------------

    fn deliver_local(&mut self) {
        // Bounded by the messages queued before this turn; callbacks may queue more.
        for _ in 0..self.local.len() {
            match self.local.pop_front() {
                Some(m) => self.deliver(m),
                None => break,
            }
        }
    }

    fn deliver(&mut self, msg: Message) {
        if msg.tag < TAG_USER_MIN {
            self.runtime_message(msg);
            return;
        }
        let d = self.matcher.handle_message(msg);
        self.dispatch(d);
    }

    fn dispatch(&mut self, d: Dispatch) {
        match d {
            Dispatch::Deliver { id, retired, msg } => {
                self.counters.delivered += 1;
                if retired {
                    if let Some((peer, tag, post, mut cb)) = self.receives.remove(&id) {
                        self.shared.unpost(peer, tag, post);
                        cb(msg);
                    }
                } else if let Some((_, _, _, cb)) = self.receives.get_mut(&id) {
                    cb(msg);
                }
            }
            Dispatch::Held => {}
            Dispatch::HeldEvicted(old) => {
                self.counters.dropped_unmatched += 1;
                log::warn!(
                    "rank {}: unmatched list full; dropped the oldest held message (from {}, tag {})",
                    self.me,
                    old.origin,
                    old.tag
                );
            }
        }
    }

    fn runtime_message(&mut self, msg: Message) {
        match msg.tag {
            wireup::TAG_WIREUP_REPORT if self.me == 0 => {
                match wireup::decode_report(msg.origin, &msg.payload) {
                    Ok(uri) => {
                        log::debug!("rank 0: rank {} reported {uri}", msg.origin);
                        let done = match &mut self.wire {
                            Wire::Collecting(c) => c.record(uri),
                            _ => {
                                log::warn!(
                                    "rank 0: late wire-up report from rank {} ignored",
                                    msg.origin
                                );
                                false
                            }
                        };
                        if done {
                            self.finish_wireup();
                        }
                    }
                    Err(e) => log::warn!("rank 0: bad report from rank {}: {e}", msg.origin),
                }
            }
            TAG_FAULT_REPORT if self.me == 0 => self.on_report(msg.origin, &msg.payload),
            TAG_ADOPTED => self.on_adopted(msg.origin, &msg.payload),
            TAG_DECLARED_DEAD => {
                self.declared_dead(&format!("rank {} refused this daemon", msg.origin))
            }
            TAG_XCAST_REQUEST | TAG_XCAST_DONE => self.on_grpcomm_reliable(msg),
            t => log::warn!(
                "rank {}: message with unexpected runtime tag {t} from {} dropped",
                self.me,
                msg.origin
            ),
        }
    }

    // ----- wire-up --------------------------------------------------------------------------

    fn start_wireup(&mut self) {
        if self.me == 0 {
            if self.size == 1 {
                self.finish_wireup();
            } else {
                let at = Instant::now() + Duration::from_millis(self.cfg.wireup_timeout_ms);
                self.timers.arm(at, TimerKind::Wireup);
            }
            return;
        }
        let report = Bytes::from(self.uri.to_string());
        let header = self.header(
            Kind::Msg,
            self.me,
            0,
            wireup::TAG_WIREUP_REPORT,
            report.len(),
        );
        // Straight to rank 0, not along the tree: nobody knows the tree's addresses yet.
        self.enqueue(0, header, report, None);
    }

    /// Rank 0: every rank reported, or time ran out. Ranks that never reported are failed.
    fn finish_wireup(&mut self) {
        let Wire::Collecting(c) = &self.wire else {
            return;
        };
        let missing = c.missing();
        let table = c.encode();
        self.contacts = c.contacts().to_vec();
        if !missing.is_empty() {
            log::warn!(
                "rank 0: wire-up without {} daemon(s) that never reported: {:?}",
                missing.len(),
                missing
            );
            match self.routing.fail(&missing, Scope::Global, Some(self.epoch)) {
                Ok(status) => self.grpcomm_repair(&status),
                Err(e) => log::error!("rank 0: cannot mark missing ranks failed: {e}"),
            }
            self.confirmed = missing.clone();
        }
        self.wire = Wire::Wired;
        log::info!(
            "rank 0: wire-up complete, {} daemons",
            self.size as usize - missing.len()
        );
        // Down the repaired tree, before anything the held commands send.
        self.flood(0, wireup::TAG_WIREUP_TABLE, &table);
        self.wired();
    }

    /// The contact table arrived: applied before it is forwarded (it holds the children's
    /// addresses), then flooded on to the children of the repaired tree.
    fn apply_table(&mut self, payload: &Bytes) {
        if matches!(self.wire, Wire::Wired) {
            return;
        }
        let table = match wireup::decode_table(self.size, payload) {
            Ok(t) => t,
            Err(e) => {
                log::error!("rank {}: bad contact table: {e}", self.me);
                return;
            }
        };
        let missing: Vec<Rank> = table
            .iter()
            .enumerate()
            .filter(|(_, c)| c.is_none())
            .map(|(r, _)| r as Rank)
            .collect();
        if missing.contains(&self.me) {
            log::error!(
                "rank {}: the DVM started without this daemon (its report came too late)",
                self.me
            );
            self.begin_stop(StopReason::Fatal("left out of wire-up".into()));
            return;
        }
        if !missing.is_empty() {
            match self.routing.fail(&missing, Scope::Global, Some(self.epoch)) {
                Ok(status) => self.grpcomm_repair(&status),
                Err(e) => log::error!("rank {}: bad failed list in contact table: {e}", self.me),
            }
        }
        self.contacts = table;
        self.confirmed = missing;
        self.wire = Wire::Wired;
        self.flood(0, wireup::TAG_WIREUP_TABLE, payload);
        log::info!(
            "rank {}: wired up (parent {:?}, {} children)",
            self.me,
            self.routing.parent(),
            self.routing.children().len()
        );
        self.wired();
    }

    fn wired(&mut self) {
        self.shared.set_wired();
        self.watch_neighbours();
        self.timers.arm(
            Instant::now() + self.monitor.tick_every(),
            TimerKind::Heartbeat,
        );
        let held: Vec<Caddy> = self.prewire.drain(..).collect();
        for c in held {
            self.command(c);
        }
    }

    // ----- connections ----------------------------------------------------------------------

    fn ensure_dial(&mut self, peer: Rank) {
        let link = self.links.entry(peer).or_default();
        if link.conn.is_none()
            && link.dialing.is_none()
            && link.incoming.is_none()
            && !link.redial_armed
        {
            self.dial(peer);
        }
    }

    fn dial(&mut self, peer: Rank) {
        let addrs: Vec<SocketAddr> = self
            .contacts
            .get(peer as usize)
            .and_then(|c| c.as_ref())
            .map(|c| c.addrs.clone())
            .unwrap_or_default();
        let attempt = self.links.get(&peer).map_or(0, |l| l.attempt);
        let Some(addr) = addrs.get(attempt as usize % addrs.len().max(1)).copied() else {
            log::warn!("rank {}: no address known for rank {peer}", self.me);
            self.unreachable(peer, 0);
            return;
        };
        let stream = match TcpStream::connect(addr) {
            Ok(s) => s,
            Err(e) => {
                log::debug!("rank {}: connect to {peer} at {addr}: {e}", self.me);
                self.dial_failed(peer);
                return;
            }
        };
        let Some(tok) = self.add_conn(stream, addr, ConnState::Connecting, Some(peer)) else {
            self.dial_failed(peer);
            return;
        };
        self.links.entry(peer).or_default().dialing = Some(tok);
        log::debug!("rank {}: dialling rank {peer} at {addr}", self.me);
    }

    fn dial_failed(&mut self, peer: Rank) {
        let retries = self.cfg.reconnect_retries;
        let link = self.links.entry(peer).or_default();
        link.dialing = None;
        link.attempt += 1;
        if link.pending.is_empty() && !link.probe {
            link.attempt = 0;
            return;
        }
        if link.attempt > retries {
            let attempts = link.attempt;
            link.attempt = 0;
            link.probe = false;
            self.unreachable(peer, attempts);
            return;
        }
        self.counters.reconnects += 1;
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

    /// A peer could not be reached within the bounded reconnect policy. Once wired, that is a
    /// failure of the peer; before, only rank 0 is ever dialled and the daemon cannot join.
    fn unreachable(&mut self, peer: Rank, attempts: u32) {
        if matches!(self.wire, Wire::Wired) {
            let cause = format!("unreachable after {attempts} connection attempts");
            self.declare_failed(&[peer], &cause, true);
            self.give_up(peer, SendError::Unreachable(peer));
        } else {
            log::error!(
                "rank {}: cannot reach rank {peer} after {attempts} attempts",
                self.me
            );
            self.give_up(peer, SendError::Unreachable(peer));
            if self.me != 0 {
                self.begin_stop(StopReason::Fatal("cannot reach rank 0".into()));
            }
        }
    }

    /// Fails every frame waiting for `peer`.
    fn give_up(&mut self, peer: Rank, err: SendError) {
        if let Some(link) = self.links.get_mut(&peer) {
            link.pending_bytes = 0;
            let pending: Vec<Pending> = link.pending.drain(..).collect();
            for p in pending {
                complete(p.done, Err(err.clone()));
            }
        }
    }

    fn tune(&self, stream: &TcpStream) {
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

    fn bump_generation(&mut self) -> u64 {
        self.next_generation += 1;
        self.next_generation
    }

    /// Tunes, registers and stores a new connection, and arms its handshake timeout (which
    /// covers the TCP connect too). Returns its token, or `None` (logged) if the poller refused.
    fn add_conn(
        &mut self,
        mut stream: TcpStream,
        addr: SocketAddr,
        state: ConnState,
        dialled: Option<Rank>,
    ) -> Option<usize> {
        self.tune(&stream);
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
        Some(tok)
    }

    fn accept(&mut self, index: usize) {
        for _ in 0..limits::ACCEPTS_PER_EVENT_MAX {
            let Some(listener) = self.listeners.get(index) else {
                return;
            };
            let (stream, addr) = match listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    log::warn!("rank {}: accept: {e}", self.me);
                    return;
                }
            };
            if self.conns.len() >= limits::CONNECTIONS_MAX {
                log::warn!("rank {}: too many connections; refusing {addr}", self.me);
                continue;
            }
            let hs = ConnState::Handshaking(Box::new(Handshake::accept(
                &self.hs_cfg,
                super::nonce::fresh(),
            )));
            let Some(tok) = self.add_conn(stream, addr, hs, None) else {
                continue;
            };
            // A peer may have written its Hello already.
            self.readable_again.insert(tok);
        }
        // More may be waiting: come back next turn rather than starve the other sockets.
    }

    fn on_writable(&mut self, tok: usize) {
        let Some(conn) = self.conns.get_mut(tok) else {
            return;
        };
        if let ConnState::Connecting = conn.state {
            let peer = conn.dialled.unwrap_or(0);
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
                self.close(tok, None);
                self.dial_failed(peer);
                return;
            }
            conn.state = ConnState::Handshaking(Box::new(Handshake::dial(
                &self.hs_cfg,
                peer,
                super::nonce::fresh(),
            )));
            self.pump_handshake(tok);
        }
        self.dirty.push(tok);
    }

    fn pump_handshake(&mut self, tok: usize) {
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
        self.dirty.push(tok);
    }

    fn on_readable(&mut self, tok: usize) {
        let mut reads = 0;
        let mut batches = 0;
        loop {
            let Some(conn) = self.conns.get_mut(tok) else {
                return;
            };
            if matches!(conn.state, ConnState::Connecting) {
                return;
            }
            let generation = conn.generation;
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
                // Nothing buffered: read more.
                if reads == limits::READS_PER_EVENT_MAX {
                    // Still readable: continue next turn so other sockets get their share.
                    self.readable_again.insert(tok);
                    return;
                }
                reads += 1;
                let space = conn.decoder.read_space();
                match conn.stream.read(space) {
                    Ok(0) => {
                        self.lost(tok, "connection closed by peer");
                        return;
                    }
                    Ok(n) => {
                        conn.decoder.commit(n);
                        if let Some(p) = conn.peer.filter(|_| conn.is_established()) {
                            self.monitor.heard(p, Instant::now());
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        self.lost(tok, &e.to_string());
                        return;
                    }
                }
                self.frame_buf = frames;
                continue;
            }
            let mut gone = false;
            for f in frames.drain(..) {
                if !self.alive(tok, generation) {
                    gone = true;
                    break;
                }
                self.on_frame(tok, f);
            }
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

    fn alive(&self, tok: usize, generation: u64) -> bool {
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
                Ok(Some(HandshakeEvent::HelloReceived(ident))) => self.on_hello(tok, ident.rank),
                Ok(Some(HandshakeEvent::Established(ident))) => {
                    self.pump_handshake(tok);
                    self.established(tok, ident.rank);
                }
                Err(e) => self.protocol_error(tok, &format!("handshake: {e}")),
            }
            return;
        }
        let Some(from) = conn.peer else {
            return;
        };
        let h = frame.header;
        if self.routing.is_failed(from) || self.routing.is_failed(h.origin) {
            self.counters.dropped_stale += 1;
            log::debug!(
                "rank {}: dropped a frame from failed rank {} (link {from})",
                self.me,
                h.origin
            );
            return;
        }
        let routed = matches!(h.kind, Kind::Msg | Kind::RelmData | Kind::Relm);
        if h.origin >= self.size || (routed && h.dst >= self.size) {
            self.protocol_error(tok, &format!("frame names a rank beyond {}", self.size));
            return;
        }
        match h.kind {
            Kind::Msg if h.dst == self.me => self.deliver(Message {
                origin: h.origin,
                tag: h.tag,
                payload: frame.payload,
            }),
            Kind::Msg => {
                self.counters.relayed += 1;
                self.forward(h, frame.payload.into(), None);
            }
            Kind::Xcast => self.on_flood(tok, from, h, frame.payload),
            Kind::Grpcomm => self.on_grpcomm_frame(tok, from, h, frame.payload),
            Kind::RelmData => self.on_relm_data(tok, from, h, frame.payload),
            Kind::Relm => self.on_relm_control(tok, from, h, frame.payload),
            Kind::Heartbeat => {}
            Kind::Hello | Kind::HelloAck | Kind::Auth => {
                self.protocol_error(tok, "handshake frame on an established connection")
            }
        }
    }

    /// A flood frame: the contact table during wire-up (taken from whoever sends it first while
    /// not wired; authenticating peers is the handshake's job), or "rank 0 lost".
    fn on_flood(&mut self, tok: usize, from: Rank, header: Header, payload: Bytes) {
        match header.tag {
            TAG_ROOT_LOST => self.root_lost(&format!("told by rank {from}")),
            // A second copy (e.g. from a new parent after a repair) was already applied.
            wireup::TAG_WIREUP_TABLE => self.apply_table(&payload),
            t => self.protocol_error(tok, &format!("flood frame with tag {t}")),
        }
    }

    /// A valid Hello: resolve a simultaneous connect, then answer with our proof of the key.
    /// The connection is established when the dialler's proof arrives.
    fn on_hello(&mut self, tok: usize, peer: Rank) {
        let link = self.links.entry(peer).or_default();
        if let Some(d) = link.dialing.filter(|d| *d != tok) {
            if keep_dialled_by(self.me, peer) == self.me {
                log::debug!(
                    "rank {}: simultaneous connect with {peer}: keeping the one I dialled",
                    self.me
                );
                self.close(tok, None);
                return;
            }
            log::debug!(
                "rank {}: simultaneous connect with {peer}: keeping the one it dialled",
                self.me
            );
            link.dialing = None;
            self.close(d, None);
        }
        let Some(conn) = self.conns.get_mut(tok) else {
            return;
        };
        conn.claimed = Some(peer);
        if let ConnState::Handshaking(hs) = &mut conn.state {
            hs.try_accept_peer();
        }
        let link = self.links.entry(peer).or_default();
        if let Some(other) = link.incoming.replace(tok)
            && other != tok
        {
            // A newer attempt from the same peer supersedes one still in its handshake.
            self.close(other, None);
            self.links.entry(peer).or_default().incoming = Some(tok);
        }
        self.pump_handshake(tok);
    }

    fn established(&mut self, tok: usize, peer: Rank) {
        if self.routing.is_failed(peer) {
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
        conn.state = ConnState::Established;
        conn.peer = Some(peer);
        conn.decoder.set_max_payload(msg_max);
        log::debug!("rank {}: connected to rank {peer} ({})", self.me, conn.addr);
        let link = self.links.entry(peer).or_default();
        if link.dialing == Some(tok) {
            link.dialing = None;
        }
        link.conn = Some(tok);
        if link.incoming == Some(tok) {
            link.incoming = None;
        }
        link.attempt = 0;
        link.probe = false;
        link.redial_armed = false;
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
        self.dirty.push(tok);
        if relink && matches!(self.wire, Wire::Wired) {
            self.relm_link_up(peer);
            if self.is_neighbour(peer) {
                self.grpcomm_link_up(peer);
            }
        }
    }

    fn protocol_error(&mut self, tok: usize, why: &str) {
        self.counters.protocol_errors += 1;
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
    fn lost(&mut self, tok: usize, why: &str) {
        let Some(conn) = self.conns.get(tok) else {
            return;
        };
        log::debug!("rank {}: connection {} lost: {why}", self.me, conn.addr);
        let dialled = conn.dialled;
        let established = conn.is_established();
        let peer = conn.peer;
        if established {
            let p = peer.unwrap_or(0);
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
                let watch = matches!(self.wire, Wire::Wired)
                    && (p == 0 || self.is_neighbour(p))
                    && !self.routing.is_failed(p);
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
                return;
            }
            self.close(tok, None);
            return;
        }
        let claimed = conn.claimed;
        if let Some(p) = claimed {
            // The dialler hung up between our HelloAck and its proof: most often it found our
            // MAC wrong, i.e. it does not hold this DVM's key (it logs that on its side).
            self.counters.protocol_errors += 1;
            log::warn!(
                "rank {}: {} (claiming rank {p}) closed the connection before proving it holds \
                 the job key ({why})",
                self.me,
                conn.addr
            );
        }
        // Read before `close`, which clears the link's record of this dial.
        let was_dialing =
            dialled.filter(|p| self.links.get(p).and_then(|l| l.dialing) == Some(tok));
        self.close(tok, None);
        // An incoming connection that won a simultaneous connect failed before it was
        // established: our own dial was closed for it, so dial again if anything waits.
        if let Some(p) = claimed
            && self.stopping.is_none()
            && self
                .links
                .get(&p)
                .is_some_and(|l| l.conn.is_none() && (l.probe || !l.pending.is_empty()))
        {
            self.ensure_dial(p);
        }
        if let Some(p) = was_dialing {
            self.dial_failed(p);
        }
    }

    /// Closes an established connection and puts its unsent frames back at the head of the
    /// peer's pending queue; a frame cut off mid-write is lost and its sender told so.
    fn requeue_and_close(&mut self, tok: usize) {
        let Some(conn) = self.conns.get_mut(tok) else {
            return;
        };
        let peer = conn.peer.unwrap_or(0);
        let (unsent, lost) = conn.take_unsent();
        for done in lost {
            complete(done, Err(SendError::Unreachable(peer)));
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
    }

    /// Deregisters and drops a connection; its remaining completions fail with `err` (or
    /// `ShutDown`).
    fn close(&mut self, tok: usize, err: Option<SendError>) {
        if !self.conns.contains(tok) {
            return;
        }
        let mut conn = self.conns.remove(tok);
        let _ = self.poll.registry().deregister(&mut conn.stream);
        let err = err.unwrap_or(SendError::ShutDown);
        for done in conn.completions.drain(..) {
            complete(done, Err(err.clone()));
        }
        if let Some(p) = conn.peer.or(conn.dialled).or(conn.claimed)
            && let Some(link) = self.links.get_mut(&p)
        {
            if link.conn == Some(tok) {
                link.conn = None;
            }
            if link.dialing == Some(tok) {
                link.dialing = None;
            }
            if link.incoming == Some(tok) {
                link.incoming = None;
            }
        }
        self.readable_again.remove(&tok);
    }

    fn flush_dirty(&mut self) {
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        let mut completed = Vec::new();
        let mut again = Vec::new();
        for tok in dirty.drain(..) {
            let Some(conn) = self.conns.get_mut(tok) else {
                continue;
            };
            if matches!(conn.state, ConnState::Connecting) {
                continue;
            }
            match conn.flush(&mut completed) {
                Ok(true) => again.push(tok),
                Ok(false) => {}
                Err(e) => self.lost(tok, &format!("write: {e}")),
            }
        }
        // Stopped at the write bound with the socket still writable: no event will come.
        self.dirty.extend(again);
        for done in completed {
            complete(done, Ok(()));
        }
        self.check_grpcomm_resync();
    }

    // ----- timers and shutdown --------------------------------------------------------------

    fn fire_timers(&mut self) {
        let now = Instant::now();
        while let Some(t) = self.timers.pop_expired(now) {
            match t {
                TimerKind::Handshake { token, generation } => {
                    let stuck = self
                        .conns
                        .get(token)
                        .is_some_and(|c| c.generation == generation && !c.is_established());
                    if stuck {
                        self.counters.protocol_errors += 1;
                        if let Some(c) = self.conns.get(token) {
                            log::warn!(
                                "rank {}: closing connection {}: handshake timed out",
                                self.me,
                                c.addr
                            );
                        }
                        self.lost(token, "handshake timed out");
                    }
                }
                TimerKind::Redial { rank, attempt } => {
                    let link = self.links.entry(rank).or_default();
                    if link.redial_armed && link.attempt == attempt {
                        link.redial_armed = false;
                        if (!link.pending.is_empty() || link.probe) && link.conn.is_none() {
                            self.dial(rank);
                        }
                    }
                }
                TimerKind::Wireup => {
                    if matches!(self.wire, Wire::Collecting(_)) {
                        self.finish_wireup();
                    }
                }
                TimerKind::Heartbeat => self.heartbeat_tick(),
                TimerKind::Relm => self.relm_timer(now),
                TimerKind::Linger => {
                    log::debug!("rank {}: linger over; dropping unsent frames", self.me);
                    let toks: Vec<usize> = self.conns.iter().map(|(t, _)| t).collect();
                    for t in toks {
                        self.close(t, None);
                    }
                }
            }
        }
    }

    fn begin_stop(&mut self, reason: StopReason) {
        if self.stopping.is_some() {
            return;
        }
        log::debug!("rank {}: stopping ({reason:?})", self.me);
        // Acknowledgements of what RELM posted here go out with the linger.
        self.pump_relm();
        self.shared.set_stopped(reason.clone());
        self.stopping = Some(reason);
        let held: Vec<Caddy> = self.prewire.drain(..).collect();
        for c in held {
            self.refuse(c);
        }
        self.fail_relm_completions(SendError::ShutDown);
        self.fail_collective_completions(SendError::ShutDown);
        let peers: Vec<Rank> = self.links.keys().copied().collect();
        for p in peers {
            self.give_up(p, SendError::ShutDown);
        }
        // Connections still connecting or handshaking carry no data: close them now.
        let idle: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| !c.is_established() || c.queue.is_empty())
            .map(|(t, _)| t)
            .collect();
        for t in idle {
            self.close(t, None);
        }
        let at = Instant::now() + Duration::from_millis(limits::SHUTDOWN_LINGER_MS);
        self.timers.arm(at, TimerKind::Linger);
    }

    /// Stopping, and every queued frame has reached the kernel (or the linger ran out).
    fn ready_to_exit(&self) -> bool {
        self.stopping.is_some() && self.conns.iter().all(|(_, c)| c.queue.is_empty())
    }

    /// Closes everything and fails whatever is still waiting.
    fn finish(mut self) {
        let toks: Vec<usize> = self.conns.iter().map(|(t, _)| t).collect();
        for t in toks {
            self.close(t, None);
        }
        let peers: Vec<Rank> = self.links.keys().copied().collect();
        for p in peers {
            self.give_up(p, SendError::ShutDown);
        }
        let reason = self.stopping.clone().unwrap_or(StopReason::Requested);
        self.shared.set_stopped(reason);
        while let Ok(c) = self.rx.try_recv() {
            self.refuse(c);
        }
        let held: Vec<Caddy> = self.prewire.drain(..).collect();
        for c in held {
            self.refuse(c);
        }
        self.fail_relm_completions(SendError::ShutDown);
        self.fail_collective_completions(SendError::ShutDown);
        lock(&self.shared.posted).clear();
        log::debug!("rank {}: loop stopped", self.me);
    }
}

fn complete(done: Option<Completion>, res: Result<(), SendError>) {
    if let Some(d) = done {
        d(res);
    }
}
