//! The daemon's one loop: a `mio::Poll` that owns the daemon's sockets, its [`Node`] (every
//! protocol decision, sans-IO) and its timers. Nothing else touches that state; other threads
//! reach it through [`Caddy`] commands.
//!
//! One turn of the loop: drain commands (bounded batch), pump the node (self-sends delivered,
//! the collectives' and RELM's frames), carry out the node's outputs, flush the connections
//! that got frames (so a burst coalesces into one `writev` per peer), poll with the nearest
//! timer as timeout, handle socket events, fire expired timers. The node's outputs are carried
//! out after every input, in order (`carry_out`).
//!
//! `event_loop/links.rs` holds the connections (dial, accept, handshake, read, write, loss).

mod bulk;
pub(crate) mod clients;
mod failover;
mod links;
mod streams;
mod tools;

use super::caddy::{AllgatherCompletion, Caddy, Completion, FaultHandler, OnMessage};
use super::conn::Conn;
use super::handle::{Shared, lock};
use super::log_limit::{LogLimiter, Refusal};
use super::pending::PendingHandshakes;
use super::timers::{TimerKind, Timers};
use crate::Rank;
use crate::config::Config;
use crate::counters::Counters;
use crate::error::SendError;
use crate::fxhash::{FxHashMap, FxHashSet};
use crate::limits;
use crate::node::{Command, LinkProgress, Node, Output, Reroute, StopReason, StreamCommand};
use crate::oob::frame::Frame;
use crate::oob::handshake::HandshakeConfig;
use crate::oob::header::Kind;
use crate::rml::batch_frame::{ItemRun, Packer, Unit};
use crate::rml::{Peer, ReceiveId, Tag};
use links::Link;
use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};
use slab::Slab;
use std::collections::BTreeSet;
use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

pub(crate) const WAKER_TOKEN: Token = Token(usize::MAX);

/// The wall clock (CLOCK_REALTIME), in ns since the Unix epoch (0 before it).
pub(crate) fn wall_clock_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}
/// Listener i uses token `LISTENER_TOKEN_BASE - i`.
pub(crate) const LISTENER_TOKEN_BASE: usize = usize::MAX - 1;

pub(crate) struct EventLoop {
    poll: Poll,
    shared: Arc<Shared>,
    commands: super::command_queue::CommandTaker,
    cfg: Config,
    me: Rank,
    hs_cfg: HandshakeConfig,
    /// Every protocol decision of this daemon.
    node: Node,
    listeners: Vec<TcpListener>,
    /// The networks of the addresses this daemon listens on: a peer's addresses on one of
    /// them are tried first (`oob::interfaces::order_by_reach`).
    networks: Vec<crate::oob::interfaces::Cidr>,
    /// The `bulk_networks` setting: direct links dial a peer's addresses in them first, tree
    /// links last.
    bulk_networks: Vec<crate::oob::interfaces::Cidr>,
    conns: Slab<Conn>,
    next_generation: u64,
    links: FxHashMap<Rank, Link>,
    /// Receive callbacks by the node's receive id, with the handle's post id.
    receives: FxHashMap<ReceiveId, (Peer, Tag, u64, OnMessage)>,
    /// Receives whose callback asked to pause during this drain of outputs: cancelled in the
    /// node at once, dropped from `receives` once the drain is over.
    paused_receives: Vec<ReceiveId>,
    /// Whether to wait a little for the application's answer before sleeping.
    linger: super::linger::Linger,
    /// Completions by token (sends, reliable sends, broadcasts). A token is reused only once
    /// the node has named it in its last output (a `Transmit` or a `SendDone`).
    completions: Slab<Completion>,
    /// The clock as read at the start of this batch of commands, reads or timers: one read
    /// per batch, not per message.
    now: Instant,
    /// When a message (`node::lane::keeps_bulk_writes_small`) was last read or queued: what
    /// the loop does for streams while none flows (`driver/quiet.rs`).
    messages: super::quiet::MessageClock,
    /// Completions of this daemon's collectives by id (the node bounds how many are in flight).
    ag_done: FxHashMap<u64, AllgatherCompletion>,
    /// Group collectives by the token the node reports them with.
    group_done: FxHashMap<u64, AllgatherCompletion>,
    /// Data-exchange gets by token (the same counter).
    get_done: FxHashMap<u64, super::caddy::GetCompletion>,
    group_next_token: u64,
    fault_handlers: Vec<FaultHandler>,
    timers: Timers,
    /// Deadlines of the `TimerKind::Node` timers armed and not yet fired. A new one is armed
    /// only when earlier than all of these, so they stay few.
    node_timers: BTreeSet<Instant>,
    dirty: Vec<usize>,
    /// Completions of frames written before the turn's flush (`enqueue` writes a queue at
    /// once when it holds a full coalescing buffer); run by `flush_dirty`.
    written_early: Vec<Option<Completion>>,
    /// How much of `dirty` `report_queues` has told the node about since the last flush.
    dirty_reported: usize,
    readable_again: FxHashSet<usize>,
    /// Connections left unread by flow control (`node::flow`): read again once the node
    /// allows it (checked every turn, and at least every `limits::FLOW_RECHECK_MS`).
    paused: FxHashSet<usize>,
    /// When the last link watch tick ran (`failover.rs`): a late one means this daemon's own
    /// loop did not run.
    last_link_watch: Option<Instant>,
    /// Listeners (by index) that stopped at `ACCEPTS_PER_EVENT_MAX` with connections still
    /// waiting: accepted again next turn (edge-triggered, no new event would come for them).
    accept_again: Vec<usize>,
    /// Listeners (by index) with an `AcceptRetry` timer armed after `accept` failed.
    accept_retry: Vec<usize>,
    /// Frames decoded from one read, kept between reads so decoding allocates nothing.
    frame_buf: Vec<Frame>,
    /// The units the packer completed (`rml::batch_frame`), handed to the node after each
    /// message (so at most two at a time: the run a message ends, and itself); kept between
    /// drains so packing allocates no list.
    batch_units: Vec<Unit>,
    /// Reliable sends to other daemons taken from the command channel since the reliable
    /// window was last published (`relm_window.rs`).
    relm_taken: usize,
    /// Payload bytes of commands taken from the channel in this drain and not yet subtracted
    /// from the gate's count of bytes waiting there (`release_taken`). One subtraction per
    /// report instead of one per command: it is an atomic loop on a cache line the submitting
    /// threads add to, about half of what the drain itself cost a stream of sends. Until then
    /// the gate counts those bytes as still waiting, which errs towards `Busy`, within one turn.
    taken_bytes: usize,
    stopping: Option<StopReason>,
    /// Rank 0 shutting the DVM down: it keeps its established connections until each peer
    /// closes its end (or the linger runs out), because a peer that sees rank 0's close before
    /// the shutdown broadcast reaches it through the tree takes it for rank 0's failure (issue
    /// "Real launchers", defect 2). Every other daemon closes first, once it has the shutdown.
    close_after_peers: bool,
    /// Neighbours whose collective frames were dropped at a full queue: re-stated once it
    /// drains (at most one entry per neighbour).
    grpcomm_resync: FxHashSet<Rank>,
    /// Link sessions made so far: the next one's numbers start at this plus one, shifted 32.
    link_sessions: u64,
    /// Connections with a link-session acknowledgement due (`Conn::ack_due`; at most one
    /// entry per connection), and whether the `LinkAck` timer is armed for them.
    acks_due: Vec<usize>,
    ack_timer_armed: bool,
    /// What this daemon holds of the sessions of peers whose links were removed (taken for
    /// dead), with the peer's incarnation: at most one entry per rank of the DVM.
    link_inbound: FxHashMap<Rank, (u64, crate::oob::session::Inbound)>,
    /// Accepted connections still in their handshake, bounded per source and in total.
    pending: PendingHandshakes,
    /// Refusal log lines, at a bounded rate per reason.
    log_limit: LogLimiter,
    /// When housekeeping (`housekeeping`: shrinking tables, idle buffers, log summaries, the
    /// wall clock; once a second) is due next.
    housekeeping_at: Instant,
    /// Where the daemon's connections read large payloads (`oob::frame`; bounded by
    /// `limits::READ_PAYLOAD_POOL_*`; emptied when unused for a second, in `housekeeping`).
    payload_pool: std::sync::Arc<crate::buffer_pool::BufferPool>,
    /// The node's `origin_gate_version` when the gate was last published.
    gate_version: (u64, usize, u64),
    /// The applications' services, writers and readers of streams.
    streams: streams::AppStreams,
    /// Status queries the node gathers, by token, with who waits for each (at most
    /// `limits::STATUS_LOCAL_MAX`: the node refuses more).
    status_waiters: FxHashMap<u64, tools::StatusWaiter>,
    status_next_token: u64,
    /// Client processes connected over the Unix-domain socket (issue "Jobs").
    clients: clients::ClientConns,
}

/// The driver's answer to the node's question "is a neighbour's queue stuck?".
struct QueueProgress<'a> {
    links: &'a FxHashMap<Rank, Link>,
    conns: &'a Slab<Conn>,
}

impl LinkProgress for QueueProgress<'_> {
    fn stuck_since(&self, peer: Rank) -> Option<Instant> {
        let link = self.links.get(&peer)?;
        // The link's queue, or our bulk connection's beside it.
        [link.conn, link.bulk_out]
            .into_iter()
            .flatten()
            .filter_map(|t| self.conns.get(t))
            .filter(|c| !c.is_drained())
            .map(|c| c.last_progress)
            .min()
    }
}

impl EventLoop {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        poll: Poll,
        shared: Arc<Shared>,
        commands: super::command_queue::CommandTaker,
        cfg: Config,
        node: Node,
        listeners: Vec<TcpListener>,
        networks: Vec<crate::oob::interfaces::Cidr>,
        hs_cfg: HandshakeConfig,
        client_listener: Option<(mio::net::UnixListener, std::path::PathBuf)>,
    ) -> Self {
        // Validated by `Config::validate`: every entry is a CIDR.
        let bulk_networks = cfg
            .bulk_networks
            .iter()
            .filter_map(|e| e.trim().parse().ok())
            .collect();
        EventLoop {
            poll,
            shared,
            commands,
            cfg,
            me: node.rank(),
            hs_cfg,
            node,
            listeners,
            networks,
            bulk_networks,
            conns: Slab::new(),
            next_generation: 0,
            links: FxHashMap::default(),
            receives: FxHashMap::default(),
            paused_receives: Vec::new(),
            linger: super::linger::Linger::default(),
            completions: Slab::new(),
            now: Instant::now(),
            messages: super::quiet::MessageClock::new(Instant::now()),
            ag_done: FxHashMap::default(),
            group_done: FxHashMap::default(),
            get_done: FxHashMap::default(),
            group_next_token: 0,
            fault_handlers: Vec::new(),
            timers: Timers::default(),
            node_timers: BTreeSet::new(),
            dirty: Vec::new(),
            written_early: Vec::new(),
            dirty_reported: 0,
            readable_again: FxHashSet::default(),
            paused: FxHashSet::default(),
            last_link_watch: None,
            accept_again: Vec::new(),
            accept_retry: Vec::new(),
            frame_buf: Vec::new(),
            batch_units: Vec::new(),
            relm_taken: 0,
            taken_bytes: 0,
            stopping: None,
            close_after_peers: false,
            grpcomm_resync: FxHashSet::default(),
            link_sessions: 0,
            link_inbound: FxHashMap::default(),
            acks_due: Vec::new(),
            ack_timer_armed: false,
            pending: PendingHandshakes::new(
                limits::PENDING_HANDSHAKES_PER_SOURCE_MAX,
                limits::PENDING_HANDSHAKES_MAX,
            ),
            log_limit: LogLimiter::new(
                limits::REFUSAL_LOG_LINES_PER_INTERVAL,
                Duration::from_millis(limits::REFUSAL_LOG_INTERVAL_MS),
            ),
            housekeeping_at: Instant::now() + Duration::from_secs(1),
            payload_pool: std::sync::Arc::new(crate::buffer_pool::BufferPool::new(
                limits::READ_PAYLOAD_POOL_BUFFERS_MAX,
                limits::READ_PAYLOAD_POOL_BYTES_MAX,
            )),
            gate_version: (0, 0, 0),
            streams: streams::AppStreams::default(),
            status_waiters: FxHashMap::default(),
            status_next_token: 0,
            clients: clients::ClientConns::new(client_listener),
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
        self.register_client_listener()?;
        self.node.handle_wall_clock(self.now, wall_clock_ns());
        self.node.start(self.now);
        self.carry_out();
        self.note_link_stall_cap();
        self.arm_link_watch();
        let mut events = Events::with_capacity(limits::POLL_EVENTS_MAX);
        // When the loop last woke from `poll`: a turn far longer than usual is logged, so that
        // a daemon silent to its peers can tell a long turn from not being scheduled.
        let mut busy_since = Instant::now();
        // Whether the last turn ended in `poll`: a turn may skip it (a linger that caught a
        // command) only then, so sockets and timers are looked at at least every other turn.
        let mut polled = true;
        loop {
            let mut drained_all = self.drain_commands();
            // A stop a callback asked for with no room for it in the queue: after what the
            // queue held, as its command would have come.
            if let Some(request) = self.shared.take_stop_request() {
                self.command(match request {
                    super::handle::StopRequest::Abort => Caddy::Abort,
                    super::handle::StopRequest::Shutdown => Caddy::Shutdown { dvm: false },
                    super::handle::StopRequest::ShutdownDvm => Caddy::Shutdown { dvm: true },
                });
            }
            // What the commands, events and timers since the last turn made the node want.
            self.node.pump(self.now);
            self.carry_out();
            // What the callbacks just asked for (a reply to what they got) leaves with this
            // turn's flush instead of after another poll: a turn costs about 2 us here. Only
            // after a drain that emptied the queue, so that what arrived since is mostly the
            // callbacks' and a turn stays within its command bound when callers flood it.
            for _ in 0..limits::CALLBACK_ROUNDS_PER_TURN_MAX {
                if !drained_all || !self.linger.handed_in_turn() || self.commands.is_empty() {
                    break;
                }
                drained_all = self.drain_commands();
                self.node.pump(self.now);
                self.carry_out();
            }
            self.flush_dirty();
            self.turn_clients();
            self.resume_paused();
            self.publish_gate();
            self.half_close_drained();
            if self.ready_to_exit() {
                return Ok(());
            }
            self.arm_node_timer();
            let now = Instant::now();
            // Compared as instants: a duration per turn costs more than the rest of this check.
            if now > busy_since + Duration::from_millis(limits::TURN_LOG_MS) {
                log::info!(
                    target: "tbon::driver::event_loop::turns",
                    "rank {}: one turn of the loop took {} ms",
                    self.me,
                    now.saturating_duration_since(busy_since).as_millis()
                );
            }
            let mut timeout = self.timers.poll_timeout(now);
            if !self.paused.is_empty() {
                // A pause also ends by time (a congested queue that counts as stuck).
                let recheck = Duration::from_millis(limits::FLOW_RECHECK_MS);
                timeout = Some(timeout.map_or(recheck, |t| t.min(recheck)));
            }
            if !drained_all
                || !self.readable_again.is_empty()
                || !self.accept_again.is_empty()
                || !self.dirty.is_empty()
                || self.clients.has_work()
                || self.node.has_output()
            {
                timeout = Some(Duration::ZERO);
            }
            if timeout != Some(Duration::ZERO)
                && let Some(wait) = self.linger.before_sleep(self.node.has_streams())
            {
                let caught = self.wait_for_command(wait);
                self.linger.lingered(caught);
                if caught && polled {
                    // Straight to the next turn, which takes the command: a `poll` that could
                    // not sleep would cost a system call on the exchange's path (the mio loop
                    // the bench compares with makes one a round trip; this loop made two).
                    polled = false;
                    self.now = Instant::now();
                    busy_since = self.now;
                    continue;
                }
                if caught {
                    timeout = Some(Duration::ZERO);
                }
            }
            polled = true;
            if timeout != Some(Duration::ZERO) {
                // Announce sleep, then re-check: a command pushed after this store sees
                // `asleep` and wakes us; one pushed before it is seen by `is_empty`.
                self.shared.asleep.store(true, Ordering::SeqCst);
                if !self.commands.is_empty() {
                    timeout = Some(Duration::ZERO);
                }
            }
            if timeout != Some(Duration::ZERO) {
                self.linger.sleeping(now);
            }
            let res = self.poll.poll(&mut events, timeout);
            self.shared.asleep.store(false, Ordering::SeqCst);
            self.now = Instant::now();
            busy_since = self.now;
            let by_caller = events.iter().any(|e| e.token() == WAKER_TOKEN);
            self.linger.woke(self.now, by_caller);
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
                    Token(t) if t >= clients::CLIENT_TOKEN_BASE => {
                        self.on_client_token(t, ev.is_writable());
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
            let again = std::mem::take(&mut self.accept_again);
            for index in again {
                self.accept(index);
            }
            self.fire_timers();
        }
    }

    /// Waits up to `wait` for a command to arrive, spinning (`driver::linger`); whether one did.
    fn wait_for_command(&self, wait: Duration) -> bool {
        let until = Instant::now() + wait;
        // Bounded by the clock: at most `wait`, looked at every few dozen spins.
        loop {
            if !self.commands.is_empty() {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            for _ in 0..32 {
                std::hint::spin_loop();
            }
        }
    }

    // ----- the node's outputs ---------------------------------------------------------------

    /// Carries out what the node asked for, in order, then re-arms its timer.
    fn carry_out(&mut self) {
        self.carry_out_outputs();
        for id in std::mem::take(&mut self.paused_receives) {
            self.receives.remove(&id);
        }
    }

    /// Calls persistent receive `receive`'s callback for every message of `run`, in order. A
    /// callback that pauses its receive still gets the rest of the run: the node matched it
    /// already, as it had the `Deliver`s queued behind a pausing one.
    fn deliver_run(&mut self, receive: ReceiveId, run: &ItemRun) {
        let Some((peer, tag, post, cb)) = self.receives.get_mut(&receive) else {
            return;
        };
        if cb.call_run(run) {
            let (peer, tag, post) = (*peer, *tag, *post);
            self.node.cancel(peer, tag);
            self.shared.unpost(peer, tag, post);
            self.paused_receives.push(receive);
        }
    }

    fn carry_out_outputs(&mut self) {
        while let Some(o) = self.node.poll_output() {
            match o {
                Output::Transmit {
                    to,
                    header,
                    payload,
                    token,
                } => {
                    let done = token.and_then(|t| self.completions.try_remove(t as usize));
                    if !self.enqueue(to, header, payload, done) && header.kind == Kind::Grpcomm {
                        self.grpcomm_resync.insert(to);
                    }
                }
                Output::Heartbeat { to, header } => {
                    if let Some(tok) = self.links.get(&to).and_then(|l| l.conn)
                        && let Some(conn) = self.conns.get_mut(tok)
                        && conn.takes_frames()
                        && conn.push(header, bytes::Bytes::new(), None).is_ok()
                    {
                        self.mark_dirty(tok);
                    }
                }
                Output::PeersFailed { dead, adopted } => self.peers_failed(&dead, &adopted),
                Output::Fallback { peer } => self.fall_back(peer),
                Output::Deliver {
                    receive,
                    retired,
                    msg,
                } => {
                    self.linger.handed_over();
                    if retired {
                        if let Some((peer, tag, post, mut cb)) = self.receives.remove(&receive) {
                            self.shared.unpost(peer, tag, post);
                            cb.call(msg);
                            // A one-shot receive is gone anyway.
                            let _ = super::caddy::take_pause();
                        }
                    } else if let Some((peer, tag, post, cb)) = self.receives.get_mut(&receive) {
                        cb.call(msg);
                        if super::caddy::take_pause() {
                            // No more matches from here on: later messages are held. Matches
                            // the node made already still reach the callback in this drain.
                            let (peer, tag, post) = (*peer, *tag, *post);
                            self.node.cancel(peer, tag);
                            self.shared.unpost(peer, tag, post);
                            self.paused_receives.push(receive);
                        }
                    }
                }
                Output::DeliverRun { receive, run } => {
                    self.linger.handed_over();
                    self.deliver_run(receive, &run);
                }
                o @ (Output::SendDone { .. }
                | Output::AllgatherDone { .. }
                | Output::GroupDone { .. }
                | Output::GetDone { .. }) => {
                    self.linger.handed_over();
                    self.complete(o);
                }
                Output::Repaired(status) => {
                    let mut handlers = std::mem::take(&mut self.fault_handlers);
                    for h in handlers.iter_mut() {
                        h(&status);
                    }
                    // Handlers registered from inside a handler arrived as commands; keep both.
                    handlers.append(&mut self.fault_handlers);
                    self.fault_handlers = handlers;
                }
                Output::Wired => self.shared.set_wired(),
                Output::ContactKnown(peer) => self.contact_answered(peer, true),
                Output::ContactUnknown(peer) => self.contact_answered(peer, false),
                Output::Stream(e) => self.on_stream_event(*e),
                Output::Client(e) => self.on_client_event(e),
                Output::Stop(reason) => self.on_stop(reason),
                Output::Trace(_) => {}
                Output::Status { token, report } => self.on_status(token, *report),
            }
        }
    }

    /// Arms a timer for the node's next deadline, unless one at or before it is armed. Once
    /// per turn, before polling: every input of the turn has been handled by then.
    fn arm_node_timer(&mut self) {
        if self.stopping.is_none()
            && let Some(at) = self.node.poll_timeout()
            && self.node_timers.first().is_none_or(|t| *t > at)
        {
            self.node_timers.insert(at);
            self.timers.arm(at, TimerKind::Node);
        }
    }

    /// Runs the completion a `SendDone` or `AllgatherDone` names (other outputs: nothing).
    fn complete(&mut self, o: Output) {
        match o {
            Output::SendDone { token, result } => {
                if let Some(done) = self.completions.try_remove(token as usize) {
                    done(result);
                }
            }
            Output::AllgatherDone { id, result } => {
                if let Some(done) = self.ag_done.remove(&id) {
                    done(result);
                }
            }
            Output::GroupDone { token, result } => {
                if let Some(done) = self.group_done.remove(&token) {
                    done(result);
                }
            }
            Output::GetDone { token, result } => {
                if let Some(done) = self.get_done.remove(&token) {
                    done(result);
                }
            }
            _ => {}
        }
    }

    /// The node declared `dead` failed: their connections close, and what was queued for them
    /// goes where the repaired tree says.
    fn peers_failed(&mut self, dead: &[Rank], adopted: &[Rank]) {
        self.grpcomm_resync.retain(|r| !dead.contains(r));
        let frames = self.take_frames(dead);
        for p in frames {
            match self.node.reroute(p.header, adopted) {
                Reroute::Hop(hop, header) => {
                    self.enqueue(hop, header, p.payload, p.done);
                }
                Reroute::Copies(copies) => {
                    for (c, header) in copies {
                        self.enqueue(c, header, p.payload.clone(), None);
                    }
                    complete(p.done, Ok(()));
                }
                Reroute::Fail(e) => complete(p.done, Err(e)),
                Reroute::Drop => complete(p.done, Ok(())),
            }
        }
    }

    /// The direct link to `peer` is no longer used: what was queued for it takes the tree,
    /// in order, and its connection closes (unless `peer` became a tree neighbour meanwhile).
    fn fall_back(&mut self, peer: Rank) {
        if self.node.is_neighbour(peer) {
            return;
        }
        if let Some(tok) = self.links.get(&peer).and_then(|l| l.conn) {
            self.requeue_and_close(tok);
        }
        let Some(link) = self.links.get_mut(&peer) else {
            return;
        };
        // What the link wrote and did not see confirmed is given up with it, as before link
        // sessions: written again on a later link it would arrive behind the frames that take
        // the tree from now on.
        if let Some(session) = link.session.as_mut() {
            session.out.reset();
        }
        link.pending_bytes = 0;
        let frames: Vec<links::Pending> = link.pending.drain(..).collect();
        for p in frames {
            match self.node.reroute(p.header, &[]) {
                Reroute::Hop(hop, header) => {
                    self.enqueue(hop, header, p.payload, p.done);
                }
                Reroute::Copies(_) | Reroute::Drop => complete(p.done, Ok(())),
                Reroute::Fail(e) => complete(p.done, Err(e)),
            }
        }
        self.report_waiting(peer);
    }

    // ----- commands -------------------------------------------------------------------------

    /// Runs the commands waiting in the channel, a bounded number; whether none is left.
    /// `self.now` must be current: both callers run right after it was read.
    ///
    /// Plain sends without a completion or a route of their own (`Handle::send`, and every
    /// message of a `send_batch`) go through a [`Packer`]: consecutive small ones to one
    /// destination leave as one batch frame (`rml::batch_frame`). Only commands already waiting
    /// are packed, so nothing waits for company: a lone message goes at once, as itself. Any
    /// other command first sends what is packed, so the order of commands is kept.
    fn drain_commands(&mut self) -> bool {
        // A batch counts one per message, so a turn's work stays bounded in messages.
        let me = self.node.rank();
        // A batch never exceeds `msg_max_bytes`: the receiver refuses a larger frame.
        let mut packer = Packer::with_frame_max(self.cfg.msg_max_bytes);
        let mut done = 0;
        let mut empty = false;
        self.commands.take_queued();
        while done < limits::COMMANDS_PER_TURN_MAX {
            match self.commands.next_taken() {
                Some(Caddy::SendBatch {
                    units,
                    messages,
                    bytes,
                }) => {
                    self.taken_bytes += bytes;
                    self.node.counters_mut().commands += messages as u64;
                    // Packed by the caller: what earlier sends packed leaves first.
                    let pending = &mut self.batch_units;
                    packer.finish(|u| pending.push(u));
                    self.send_units();
                    for u in units {
                        let before = done;
                        done += u.messages as usize;
                        self.send_unit(u);
                        if before / limits::COMMANDS_PER_QUEUE_REPORT
                            != done / limits::COMMANDS_PER_QUEUE_REPORT
                        {
                            self.carry_out();
                            self.report_queues();
                            self.release_taken();
                            self.publish_gate();
                        }
                    }
                    self.carry_out();
                }
                Some(Caddy::Send {
                    dst,
                    tag,
                    payload,
                    done: None,
                    route: None,
                }) if tag >= crate::rml::TAG_USER_MIN => {
                    self.node.counters_mut().commands += 1;
                    self.taken_bytes += payload.len();
                    done += 1;
                    let units = &mut self.batch_units;
                    packer.push(dst, tag, payload, dst != me, |u| units.push(u));
                    self.after_packing(done);
                }
                Some(c) => {
                    let units = &mut self.batch_units;
                    packer.finish(|u| units.push(u));
                    self.send_units();
                    self.node.counters_mut().commands += 1;
                    if let Caddy::Send { payload, .. } | Caddy::SendReliable { payload, .. } = &c {
                        self.taken_bytes += payload.len();
                    }
                    if let Caddy::SendReliable { dst, .. } = &c
                        && *dst != me
                    {
                        self.relm_taken += 1;
                    }
                    self.command(c);
                    self.carry_out();
                    done += 1;
                    self.after_command(done);
                }
                None => {
                    empty = true;
                    break;
                }
            }
        }
        let units = &mut self.batch_units;
        packer.finish(|u| units.push(u));
        self.send_units();
        self.release_taken();
        empty
    }

    /// Subtracts the bytes of the commands taken since the last call from the gate's count of
    /// bytes waiting in the channel (`taken_bytes`).
    fn release_taken(&mut self) {
        if self.taken_bytes > 0 {
            self.shared
                .gate
                .taken(std::mem::take(&mut self.taken_bytes));
        }
    }

    /// After a message went into the packer: sends what it completed, and keeps flow control
    /// up to date (`after_command`).
    fn after_packing(&mut self, done: usize) {
        if !self.batch_units.is_empty() {
            self.send_units();
        }
        self.after_command(done);
    }

    /// Hands the packer's completed units to the node as plain sends, then carries out its
    /// frames.
    fn send_units(&mut self) {
        if self.batch_units.is_empty() {
            return;
        }
        let mut units = std::mem::take(&mut self.batch_units);
        for u in units.drain(..) {
            self.send_unit(u);
        }
        self.batch_units = units;
        self.carry_out();
    }

    /// A long drain of sends must not fill a queue far past its high-water mark before flow
    /// control sees it: queue levels and the origin gate are brought up to date every
    /// `COMMANDS_PER_QUEUE_REPORT` commands.
    fn after_command(&mut self, done: usize) {
        if done.is_multiple_of(limits::COMMANDS_PER_QUEUE_REPORT) {
            self.report_queues();
            self.release_taken();
            self.publish_gate();
        }
    }

    /// A packer's unit: a batch frame as one (its message count known), else a plain send;
    /// the node's output is not carried out.
    fn send_unit(&mut self, u: Unit) {
        if u.tag != crate::rml::batch_frame::TAG_BATCH || self.stopping.is_some() {
            self.send_plain_held(u.dst, u.tag, u.payload);
            return;
        }
        self.command_to_node(
            None,
            Command::SendPacked {
                dst: u.dst,
                payload: u.payload,
                messages: u.messages,
            },
        );
    }

    /// [`send_plain`](Self::send_plain) without carrying out the node's output: the caller
    /// does, soon.
    fn send_plain_held(&mut self, dst: Rank, tag: Tag, payload: bytes::Bytes) {
        if self.stopping.is_some() {
            return;
        }
        self.command_to_node(
            None,
            Command::Send {
                dst,
                tag,
                payload,
                token: None,
                route: None,
            },
        );
    }

    /// Publishes the node's origin answers to the submitting threads when they may have
    /// changed (`gate`).
    pub(super) fn publish_gate(&mut self) {
        // The reliable window first: it changes with every reliable send and acknowledgement.
        self.shared.relm_window.publish(
            self.node.reliable_held(),
            std::mem::take(&mut self.relm_taken),
        );
        let version = self.node.origin_gate_version();
        if version == self.gate_version {
            return;
        }
        self.gate_version = version;
        let node = &self.node;
        self.shared
            .gate
            .publish(node.origin_gate_open(), |dst| !node.may_originate_to(dst));
    }

    /// Keeps a completion under a fresh token.
    fn token(&mut self, done: Option<Completion>) -> Option<u64> {
        Some(self.completions.insert(done?) as u64)
    }

    /// Hands a sending command to the node; a refusal goes straight to its completion.
    fn command_to_node(&mut self, token: Option<u64>, c: Command) {
        if let Err(e) = self.node.handle_command(self.now, c)
            && let Some(done) = token.and_then(|t| self.completions.try_remove(t as usize))
        {
            done(Err(e));
        }
    }

    fn command(&mut self, c: Caddy) {
        if self.stopping.is_some() {
            self.refuse(c);
            return;
        }
        match c {
            // `drain_commands` takes batches apart itself (it counts their messages).
            Caddy::SendBatch { units, .. } => {
                for u in units {
                    self.send_unit(u);
                    self.carry_out();
                }
            }
            Caddy::Send {
                dst,
                tag,
                payload,
                done,
                route,
            } => {
                let token = self.token(done);
                self.command_to_node(
                    token,
                    Command::Send {
                        dst,
                        tag,
                        payload,
                        token,
                        route,
                    },
                );
            }
            Caddy::SendReliable {
                dst,
                tag,
                payload,
                done,
            } => {
                let token = self.token(done);
                self.command_to_node(
                    token,
                    Command::SendReliable {
                        dst,
                        tag,
                        payload,
                        token,
                    },
                );
            }
            Caddy::Broadcast { tag, payload, done } => {
                let token = self.token(done);
                self.command_to_node(
                    token,
                    Command::Broadcast {
                        tag,
                        payload,
                        token,
                    },
                );
            }
            Caddy::Allgather { id, data, done } => {
                if self.ag_done.contains_key(&id) {
                    done(Err(SendError::DuplicateId(id)));
                    return;
                }
                match self
                    .node
                    .handle_command(self.now, Command::Allgather { id, data })
                {
                    Ok(()) => {
                        self.ag_done.insert(id, done);
                    }
                    Err(e) => done(Err(e)),
                }
            }
            Caddy::Fence { op, mode, done } => {
                let token = self.group_next_token;
                self.group_next_token += 1;
                match self
                    .node
                    .handle_command(self.now, Command::Fence { op, mode, token })
                {
                    Ok(()) => {
                        self.group_done.insert(token, done);
                    }
                    Err(e) => done(Err(e)),
                }
            }
            Caddy::ModexCommit { group, blob } => {
                if let Err(e) = self.node.modex_commit(group, blob) {
                    // The handle admits commits within the same bound: not reached.
                    log::error!("rank {}: a commit was refused: {e}", self.me);
                }
            }
            Caddy::ModexForget { group } => self.node.modex_forget(&group),
            Caddy::ClientJob {
                job,
                key,
                accept_from,
                reply,
            } => {
                let res = if self.node.client_open_job(job, key, accept_from) {
                    Ok(())
                } else {
                    Err(SendError::Busy(crate::error::Limit::ClientJobs))
                };
                if let Some(tx) = reply {
                    let _ = tx.send(res);
                }
            }
            Caddy::ClientJobClose { job } => self.node.client_close_job(job),
            Caddy::Leave(tx) => {
                let now = Instant::now();
                let _ = tx.send(self.node.leave(now));
            }
            Caddy::ClientJobEnd { job } => {
                let locals = self.node.client_end_job(job);
                self.disconnect_clients(&locals, &format!("job {job} ended"));
            }
            Caddy::Get {
                group,
                rank,
                key,
                done,
            } => {
                let token = self.group_next_token;
                self.group_next_token += 1;
                self.get_done.insert(token, done);
                self.node.modex_get(token, &group, rank, &key);
            }
            Caddy::Group {
                op,
                data,
                call,
                done,
            } => {
                let token = self.group_next_token;
                self.group_next_token += 1;
                match self.node.handle_command(
                    self.now,
                    Command::GroupGather {
                        op,
                        data,
                        call,
                        token,
                    },
                ) {
                    Ok(()) => {
                        self.group_done.insert(token, done);
                    }
                    Err(e) => done(Err(e)),
                }
            }
            Caddy::Recv {
                peer,
                tag,
                persistent,
                callback,
                post,
            } => match self.node.post(peer, tag, persistent) {
                Ok(id) => {
                    self.receives.insert(id, (peer, tag, post, callback));
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
                let (ids, dropped) = self.node.purge(peer);
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
            Caddy::Status { budget_ms, all, tx } => self.status_for_caller(budget_ms, all, tx),
            Caddy::Abort => {
                log::info!("rank {}: aborting", self.me);
                self.node.handle_abort(self.now);
                self.carry_out();
                self.close_all();
            }
            Caddy::Shutdown { dvm } => {
                // A wired rank 0 broadcasts the shutdown (the node's rule); its peers hear of
                // it through the tree, and only then close their connections to it.
                self.close_after_peers = dvm && self.me == 0 && self.node.is_wired();
                self.node.handle_shutdown(self.now, dvm);
            }
            Caddy::Serve {
                service,
                handler,
                reply,
            } => self.serve(service, handler, reply),
            Caddy::Fetch(f) => self.fetch(*f),
            Caddy::StreamWrite {
                consumer,
                id,
                bytes,
                digest,
            } => self.stream_command(StreamCommand::Write {
                consumer,
                id,
                bytes,
                digest,
            }),
            Caddy::StreamEnd {
                consumer,
                id,
                failure,
            } => self.stream_command(StreamCommand::End {
                consumer,
                id,
                failure,
            }),
            Caddy::StreamConsumed { id, n } => {
                self.stream_command(StreamCommand::Consumed { id, n })
            }
            Caddy::StreamCancel { id } => self.stream_command(StreamCommand::Cancel { id }),
            Caddy::StreamCorrupt { id, offset } => {
                self.stream_command(StreamCommand::Corrupt { id, offset })
            }
        }
    }

    /// Answers a command that arrives while stopping.
    fn refuse(&mut self, c: Caddy) {
        match c {
            Caddy::Send { done, .. }
            | Caddy::SendReliable { done, .. }
            | Caddy::Broadcast { done, .. } => complete(done, Err(SendError::ShutDown)),
            Caddy::SendBatch { .. } => {}
            Caddy::Allgather { done, .. }
            | Caddy::Group { done, .. }
            | Caddy::Fence { done, .. } => done(Err(SendError::ShutDown)),
            Caddy::Get { done, .. } => done(Err(crate::modex::GetError::ShutDown)),
            Caddy::ModexCommit { .. }
            | Caddy::ModexForget { .. }
            | Caddy::ClientJobClose { .. }
            | Caddy::ClientJobEnd { .. } => {}
            Caddy::ClientJob { reply, .. } => {
                if let Some(tx) = reply {
                    let _ = tx.send(Err(SendError::ShutDown));
                }
            }
            Caddy::Recv {
                peer, tag, post, ..
            } => self.shared.unpost(peer, tag, post),
            Caddy::Counters(tx) => {
                let _ = tx.send(self.snapshot());
            }
            Caddy::Leave(tx) => {
                let _ = tx.send(Err(crate::error::LeaveError::ShutDown));
            }
            Caddy::Abort => self.close_all(),
            Caddy::Status { tx, .. } => {
                let _ = tx.send(Err(crate::status::StatusError::ShutDown));
            }
            // Messages are still delivered while stopping: cancel, and answer the waiter.
            Caddy::Cancel {
                peer,
                tag,
                post,
                done,
            } => self.cancel_receive(peer, tag, post, done),
            Caddy::Purge { .. } | Caddy::Shutdown { .. } | Caddy::OnFault(_) => {}
            Caddy::Serve { reply, .. } => {
                if let Some(tx) = reply {
                    let _ = tx.send(Err(SendError::ShutDown));
                }
            }
            Caddy::Fetch(mut f) => match f.reply {
                Some(tx) => {
                    let _ = tx.send(Err(SendError::ShutDown));
                }
                None => (f.sink.deliver)(
                    crate::driver::StreamItem::End(Err(crate::stream::StreamError::ShutDown)),
                    None,
                ),
            },
            Caddy::StreamWrite { .. }
            | Caddy::StreamEnd { .. }
            | Caddy::StreamConsumed { .. }
            | Caddy::StreamCorrupt { .. }
            | Caddy::StreamCancel { .. } => {}
        }
    }

    /// Cancels the receive for (peer, tag) if it is still post `post` (not one posted again
    /// since), then answers `done`: from then on nothing can match that post.
    fn cancel_receive(
        &mut self,
        peer: Peer,
        tag: Tag,
        post: u64,
        done: Option<crossbeam_channel::Sender<()>>,
    ) {
        if let Some(id) = self.node.receive_id(peer, tag)
            && self.receives.get(&id).is_some_and(|r| r.2 == post)
        {
            self.node.cancel(peer, tag);
            self.receives.remove(&id);
        }
        if let Some(done) = done {
            let _ = done.send(());
        }
    }

    fn snapshot(&self) -> Counters {
        let mut c = self.node.counters();
        c.wakeups = self.shared.wakeups.load(Ordering::Relaxed);
        c.sends_busy_flow += self.shared.gate.refused();
        c.relm_busy = self.shared.relm_window.refused();
        c.connections = self.conns.len() as u64;
        c.log_lines_suppressed = self.log_limit.suppressed_total();
        c
    }

    // ----- timers and shutdown --------------------------------------------------------------

    fn fire_timers(&mut self) {
        let now = Instant::now();
        self.now = now;
        self.housekeeping();
        while let Some(t) = self.timers.pop_expired(now) {
            match t {
                TimerKind::Handshake { token, generation } => {
                    let stuck = self
                        .conns
                        .get(token)
                        .is_some_and(|c| c.generation == generation && c.in_handshake());
                    if stuck {
                        if let Some(c) = self.conns.get_mut(token) {
                            c.unanswered = true;
                        }
                        self.refuse_handshake(token, Refusal::Timeout, "handshake timed out");
                    }
                }
                TimerKind::Connect { token, generation } => {
                    self.connect_timed_out(token, generation);
                }
                TimerKind::Redial { rank, attempt } => {
                    let link = self.links.entry(rank).or_default();
                    if link.redial_armed && link.attempt == attempt {
                        link.redial_armed = false;
                        if link.wanted() && link.conn.is_none() && link.dialing.is_none() {
                            self.dial(rank);
                        }
                    }
                }
                TimerKind::Node => {
                    self.node_timers.retain(|t| *t > now);
                    let progress = QueueProgress {
                        links: &self.links,
                        conns: &self.conns,
                    };
                    self.node.handle_timeout(now, &progress);
                }
                TimerKind::AcceptRetry { index } => {
                    self.accept_retry.retain(|i| *i != index);
                    self.accept(index);
                }
                TimerKind::LinkWatch => {
                    self.watch_links();
                    self.arm_link_watch();
                }
                TimerKind::LinkAck => self.acks_due_now(),
                TimerKind::Linger => {
                    log::debug!("rank {}: linger over; dropping unsent frames", self.me);
                    self.close_all();
                }
            }
            self.carry_out();
        }
    }

    fn close_all(&mut self) {
        let toks: Vec<usize> = self.conns.iter().map(|(t, _)| t).collect();
        for t in toks {
            self.close(t, None);
        }
    }

    /// The node stops: what is still queued for peers that are not connected fails, idle
    /// connections close, the rest get a bounded linger to flush.
    fn on_stop(&mut self, reason: StopReason) {
        if self.stopping.is_some() {
            return;
        }
        self.shared.set_stopped(reason.clone());
        self.stop_clients(&reason.to_string());
        self.stopping = Some(reason);
        self.stop_streams();
        let peers: Vec<Rank> = self.links.keys().copied().collect();
        for p in peers {
            self.give_up(p, SendError::ShutDown);
        }
        // Connections still connecting or handshaking carry no data: close them now. The
        // established ones are shut down for writing once they have written what they hold
        // (`half_close_drained`), and close when their peers do.
        let idle: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| !c.is_established())
            .map(|(t, _)| t)
            .collect();
        for t in idle {
            self.close(t, None);
        }
        let at = Instant::now() + Duration::from_millis(limits::SHUTDOWN_LINGER_MS);
        self.timers.arm(at, TimerKind::Linger);
    }

    /// Stopping: every established connection that wrote all it had is shut down for writing
    /// (`Conn::half_closed`), so that it closes after the peer has read it, not with a reset.
    /// Not when the peers are to close first (rank 0 ending the DVM waits for them as it did).
    fn half_close_drained(&mut self) {
        if self.stopping.is_none() || self.close_after_peers {
            return;
        }
        // A link waits for its bulk connection: the link's close closes it (the stop's own
        // stream messages may have just moved there).
        let bulk_busy = |c: &Conn| {
            c.bulk_end.is_none()
                && c.peer
                    .and_then(|p| self.links.get(&p))
                    .and_then(|l| l.bulk_out)
                    .and_then(|b| self.conns.get(b))
                    .is_some_and(|b| !b.is_drained())
        };
        let ready: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                c.is_established() && c.is_drained() && !c.half_closed && !bulk_busy(c)
            })
            .map(|(t, _)| t)
            .collect();
        for t in ready {
            if let Some(c) = self.conns.get_mut(t) {
                c.half_closed = true;
                let _ = c.stream.shutdown(std::net::Shutdown::Write);
            }
        }
    }

    /// Stopping, and every queued frame has reached the kernel and every peer has closed its
    /// side after reading it (or the linger ran out: `close_all`); with `close_after_peers`,
    /// every peer has closed its established connection too.
    fn ready_to_exit(&self) -> bool {
        self.stopping.is_some()
            && self.conns.iter().all(|(_, c)| {
                c.is_drained() && !c.half_closed && !(self.close_after_peers && c.is_established())
            })
    }

    /// Closes everything and fails whatever is still waiting.
    fn finish(mut self) {
        if self.stopping.is_none() {
            // The poller failed: the node stops too, failing what waits in it.
            let reason = StopReason::Fatal("the event loop failed".into());
            self.node.handle_abort(Instant::now());
            self.stopping = Some(reason);
        }
        // The node's last outputs (failed completions); frames are no longer sent.
        while let Some(o) = self.node.poll_output() {
            self.complete(o);
        }
        self.close_all();
        self.finish_clients();
        self.fail_status_waiters();
        let peers: Vec<Rank> = self.links.keys().copied().collect();
        for p in peers {
            self.give_up(p, SendError::ShutDown);
        }
        let reason = self.stopping.clone().unwrap_or(StopReason::Requested);
        self.shared.set_stopped(reason);
        for c in self.commands.close() {
            self.refuse(c);
        }
        let tokens: Vec<usize> = self.completions.iter().map(|(t, _)| t).collect();
        for t in tokens {
            if let Some(done) = self.completions.try_remove(t) {
                done(Err(SendError::ShutDown));
            }
        }
        let mut ids: Vec<u64> = self.ag_done.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            if let Some(done) = self.ag_done.remove(&id) {
                done(Err(SendError::ShutDown));
            }
        }
        let mut tokens: Vec<u64> = self.group_done.keys().copied().collect();
        tokens.sort_unstable();
        for t in tokens {
            if let Some(done) = self.group_done.remove(&t) {
                done(Err(SendError::ShutDown));
            }
        }
        let mut tokens: Vec<u64> = self.get_done.keys().copied().collect();
        tokens.sort_unstable();
        for t in tokens {
            if let Some(done) = self.get_done.remove(&t) {
                done(Err(crate::modex::GetError::ShutDown));
            }
        }
        lock(&self.shared.posted).clear();
        self.stop_streams();
        for s in self.log_limit.flush(Instant::now()) {
            self.log_summary(s);
        }
        log::debug!("rank {}: loop stopped", self.me);
    }
}

fn complete(done: Option<Completion>, res: Result<(), SendError>) {
    if let Some(d) = done {
        d(res);
    }
}
