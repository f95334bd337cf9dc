//! The one sans-IO core of a daemon: everything a daemon decides, with no sockets, threads,
//! clocks or randomness inside. The daemon's event loop (`driver/`) and the deterministic
//! simulator (`sim/`) are its two drivers, and neither holds a protocol rule of its own.
//!
//! A [`Node`] owns the routing state and its repair, receive matching, reliable messaging
//! (RELM), the collectives (xcast, allgather, barrier), the fault coordinator (detections,
//! reports, rank 0's confirmations and epochs, adoption notices), the heartbeat monitor and the
//! wire-up table.
//!
//! # Driving a node (quinn-proto style)
//! * **Inputs**, each with `now`: [`Node::handle_frame`] (a frame from a neighbour, already
//!   authenticated by the handshake), [`Node::handle_heard`] (bytes arrived),
//!   [`Node::handle_link_up`], [`Node::handle_link_lost`], [`Node::handle_unreachable`],
//!   [`Node::handle_key_refused`],
//!   [`Node::handle_link_restate`], [`Node::handle_timeout`], and the API:
//!   [`Node::handle_command`], [`Node::post`], [`Node::cancel`], [`Node::purge`],
//!   [`Node::handle_shutdown`], [`Node::handle_abort`].
//! * **Once per turn** of the driver's loop, after its inputs: [`Node::pump`] (self-sends are
//!   delivered, then the collectives and RELM say what they want sent).
//! * **Outputs**: [`Node::poll_output`] until `None`, carried out in order (see [`Output`]);
//!   then [`Node::poll_timeout`], the instant at which [`Node::handle_timeout`] is due.
//!
//! Completions are tokens the driver chose ([`Command`]); the node reports them in
//! [`Output::Transmit`] (complete once written) or [`Output::SendDone`].

mod clients;
mod collectives;
mod commands;
pub mod contacts;
mod direct;
mod direct_held;
mod faults;
pub mod flow;
mod frames;
pub mod lane;
mod leave;
pub mod lookup;
mod marker_wait;
mod modex;
mod output;
mod rejoin;
mod reliable;
mod status;
mod streams;
pub mod wireup;
mod wiring;

pub use output::{
    FATAL_RANK_0_UNREACHABLE, FATAL_RANK_0_WRONG_KEY, Output, Reroute, StopReason, Trace,
};

use crate::Rank;
use crate::counters::Counters;
use crate::faults::HeartbeatMonitor;
use crate::fxhash::FxHashMap;
use crate::grpcomm::{Allgather, GroupGather, GroupOp, Xcast};
use crate::oob::header::{Header, Kind};
use crate::oob::uri::ContactUri;
use crate::relm::{Relm, RelmConfig};
use crate::rml::{Matcher, Message, Tag};
use crate::routed::{Route, RoutingState, TreeError};
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};
use wireup::WireupCollector;

pub use collectives::{GROUP_CALL_LEN, GroupCall, broadcast_max, xcast_limits};
pub use commands::Command;
pub use modex::FenceMode;
pub use status::StatusRefused;
pub use streams::{FAIL_NO_ROOM, FAIL_NO_SERVICE, StreamCommand, StreamEvent, TAG_STREAM};

/// What a node needs to know at its start.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// This daemon's rank, the DVM's size and the tree's radix.
    pub rank: Rank,
    pub size: u32,
    pub radix: u32,
    /// This daemon's incarnation (boot epoch): stamped on every frame it sends; a frame stamped
    /// with an older incarnation of its sender than the one known is dropped. The driver
    /// passes a value that grows across restarts of the same rank.
    pub incarnation: u64,
    /// This daemon's contact URI (reported to rank 0 at wire-up) and rank 0's (others).
    pub uri: Option<ContactUri>,
    pub hnp: Option<ContactUri>,
    /// Start wired, with no contact table (the simulator, which has no addresses).
    pub wired_at_start: bool,
    pub msg_max_bytes: usize,
    /// Rank 0 splits a broadcast payload larger than this into parts, pipelined down the tree
    /// (`bcast_part_bytes`; 0: never).
    pub bcast_part_bytes: usize,
    pub unmatched_max: usize,
    pub prewire_queue_max: usize,
    pub relm: RelmConfig,
    /// Heartbeat interval and timeout; `None`: no heartbeats (silence is never detected).
    pub heartbeat: Option<(Duration, Duration)>,
    /// Rank 0: how long it waits for wire-up reports.
    pub wireup_timeout: Duration,
    /// Emit [`Output::Trace`] observations (the simulator's checkers).
    pub trace: bool,
    /// Every peer's incarnation is known to be at least this (0: learnt from each peer's
    /// handshake, as the driver does). A frame stamped below it is dropped as left over from
    /// before a restart. The simulator, whose daemons all start at incarnation 1, sets 1
    /// instead of telling each daemon of every other (which cost N entries per daemon).
    pub incarnation_floor: u64,
    /// The thresholds of hop-by-hop flow control ([`flow`]).
    pub flow: flow::FlowLimits,
    /// Direct links beside the tree ([`crate::direct`]).
    pub direct: crate::direct::DirectConfig,
    /// Which contacts wire-up leaves this daemon ([`contacts::ContactsSetting`]).
    pub contacts: contacts::ContactsSetting,
    /// The uids whose processes may connect as clients (`client_uids`; the driver puts the
    /// daemon's own uid when the setting is empty).
    pub client_uids: Vec<u32>,
    /// This daemon restarts under the rank of a dead one and asks rank 0 to admit it back
    /// instead of taking part in wire-up (issue "Rejoin"; see `rejoin.rs`). Needs `uri`.
    pub rejoin: bool,
    /// Ranks started with the DVM (`initial_size`): rank 0's wire-up waits only for ranks below
    /// it; the others are room to grow, absent (failed) until they join as a rejoin does.
    /// 0 (or anything above the size) means the whole size.
    pub initial_size: u32,
}

impl NodeConfig {
    /// The defaults of a daemon (`Config::default()`), for daemon `rank` of `size`.
    pub fn new(rank: Rank, size: u32, radix: u32) -> NodeConfig {
        NodeConfig {
            radix,
            ..NodeConfig::from_config(&crate::config::Config::default(), rank, size)
        }
    }

    /// The settings of `c` for daemon `rank` of `size` (incarnation 1, no contacts: set those).
    pub fn from_config(c: &crate::config::Config, rank: Rank, size: u32) -> NodeConfig {
        NodeConfig {
            rank,
            size,
            radix: c.effective_radix(),
            incarnation: 1,
            uri: None,
            hnp: None,
            wired_at_start: false,
            msg_max_bytes: c.msg_max_bytes as usize,
            bcast_part_bytes: c.bcast_part_bytes,
            unmatched_max: c.unmatched_max,
            prewire_queue_max: c.prewire_queue_max,
            relm: c.relm(),
            heartbeat: Some((
                Duration::from_millis(c.heartbeat_interval_ms),
                Duration::from_millis(c.heartbeat_timeout_ms),
            )),
            wireup_timeout: Duration::from_millis(c.wireup_timeout_ms),
            trace: false,
            incarnation_floor: 0,
            flow: flow::FlowLimits::for_queue(c.send_queue_max_bytes, c.msg_max_bytes as usize),
            direct: crate::direct::DirectConfig::from_config(c),
            contacts: c.contacts,
            client_uids: c.client_uid_list(),
            rejoin: c.rejoin,
            initial_size: c.initial_size,
        }
    }
}

/// What the driver knows of its connections that the node's detection needs.
pub trait LinkProgress {
    /// Since when the send queue towards `peer` has had bytes waiting and taken none, if it
    /// has (a neighbour that talks but does not read).
    fn stuck_since(&self, peer: Rank) -> Option<Instant>;
}

/// A driver without send queues (the simulator).
pub struct NoQueues;

impl LinkProgress for NoQueues {
    fn stuck_since(&self, _: Rank) -> Option<Instant> {
        None
    }
}

enum Wire {
    /// Rank 0 collecting reports until `deadline`.
    Collecting(WireupCollector, Instant),
    /// Waiting for the contact table; commands are held (bounded). Past the deadline (set by
    /// `start`: twice the wire-up timeout, since rank 0 itself may collect reports for one
    /// timeout before it sends the table) the daemon stops with a fatal error.
    Waiting(Option<Instant>),
    /// A restarted daemon waiting for rank 0's answer to its rejoin request until the deadline
    /// (twice the wire-up timeout), asking again at the second instant; commands are held as
    /// while `Waiting`.
    Rejoining(Instant, Instant),
    Wired,
}

/// One daemon's protocol state. See the module documentation for how to drive it.
pub struct Node {
    me: Rank,
    size: u32,
    incarnation: u64,
    msg_max_bytes: usize,
    bcast_part_bytes: usize,
    prewire_queue_max: usize,
    trace: bool,
    uri: Option<ContactUri>,
    routing: RoutingState,
    matcher: Matcher,
    relm: Relm,
    xcast: Xcast,
    allgather: Allgather,
    /// Group collectives (issue "Jobs").
    group: GroupGather,
    /// The data exchange (issue "Jobs").
    modex: crate::modex::Modex,
    /// Clients routed through this daemon (issue "Jobs").
    clients: crate::clients::Clients,
    monitor: Option<HeartbeatMonitor>,
    heartbeat_at: Option<Instant>,
    wire: Wire,
    wired_at_start: bool,
    /// Start by asking rank 0 to rejoin (`NodeConfig::rejoin`).
    rejoin: bool,
    /// Ranks started with the DVM; the rest are room to grow (`NodeConfig::initial_size`).
    initial_size: u32,
    /// Callers' commands may run: false for a rejoined daemon until rank 0 says every living
    /// daemon knows it is back (`rejoin.rs`).
    settled: bool,
    /// The epoch in which each rank was last restored (rejoin): older news of its death is
    /// about its previous incarnation. At most one entry per rank.
    restored_at: FxHashMap<Rank, u64>,
    /// The latest life of each rank known to have died (at most one entry per rank): a
    /// restore of that life or an earlier one is older news than the death.
    deaths: FxHashMap<Rank, u16>,
    /// This daemon leaves in order (`leave.rs`).
    leaving: Option<leave::Leaving>,
    /// Ranks that left in order and have not come back: repaired around, reported as departed.
    departed: std::collections::BTreeSet<Rank>,
    /// Rank 0: departures whose confirmation (the broadcast operation) has not completed.
    departing: BTreeMap<Rank, u64>,
    /// Each rank's life as this daemon knows it: how many times rank 0 admitted it back (no
    /// entry: 0). Carried in every header (`Header::lives`); a routed message of another life
    /// of its origin or destination is dropped.
    lives: FxHashMap<Rank, u16>,
    /// This daemon's own life (from rank 0's welcome; 0 for a daemon of the first wire-up).
    my_life: u16,
    /// A rejoining daemon: how many times rank 0 answered `Busy` (it asks again until its
    /// deadline, which then says so).
    rejoin_busy: u32,
    /// A rejoining daemon: frames from others than rank 0 that arrived before its welcome, in
    /// order (`REJOIN_HELD_FRAMES_MAX`), read at the first pump after it.
    rejoin_held: VecDeque<(Rank, Header, Bytes)>,
    /// Rank 0: daemons admitted back and not yet told `Settled` (`REJOIN_IN_PROGRESS_MAX`).
    admitting: BTreeMap<Rank, rejoin::Admitting>,
    wireup_timeout: Duration,
    /// Contact URIs: rank 0's before wire-up; after it, the ancestors' and the subtree's (or
    /// every rank's: rank 0, `contacts = "full"`), and those looked up since.
    contacts: contacts::Contacts,
    contacts_setting: contacts::ContactsSetting,
    /// Commands held until wire-up completes (at most `prewire_queue_max`).
    prewire: VecDeque<Command>,
    /// Self-sends, delivered at the next `pump` (not from inside the call that sent them).
    local: VecDeque<Message>,
    /// The DVM's fault-confirmation epoch, as last applied here.
    epoch: u64,
    /// Ranks rank 0 has confirmed dead (ascending).
    confirmed: Vec<Rank>,
    counters: Counters,
    stopping: Option<StopReason>,
    /// Rank 0 answered a dial during wire-up but did not prove this daemon's job key: if it
    /// stays unreachable, that is the cause named (`FATAL_RANK_0_WRONG_KEY`).
    root_refused_key: bool,
    relm_next_token: u64,
    /// This daemon's user broadcasts by request id, with their tokens.
    bcast_tokens: FxHashMap<u64, Option<u64>>,
    /// What one RELM input posted, kept between inputs so that posting a message allocates
    /// nothing (`reliable.rs`, `relm_input`; let go beyond `RELM_POSTED_KEPT_MAX`).
    relm_posted: (Vec<crate::rml::Dispatch>, Vec<crate::rml::Message>),
    /// Collectives this daemon contributed to and has no result of yet.
    gathering: BTreeSet<u64>,
    /// Group collectives this daemon contributed to, with the driver's tokens (and, for a
    /// fence, its mode).
    group_tokens: BTreeMap<GroupOp, (u64, collectives::GroupCall)>,
    /// The last group result encoded, shared by the frames to every child (see
    /// `send_group`).
    group_encoded: Option<(GroupOp, bool, Bytes)>,
    /// Rank 0: its own notices waiting for room in its window (`GRPCOMM_DEFERRED_MAX`).
    xcast_deferred: VecDeque<(Tag, Bytes)>,
    /// Deaths detected here and not yet handed to RELM in a report to rank 0 (at most `size`):
    /// a full window delays a report, never loses it.
    unreported: BTreeSet<Rank>,
    /// Hop-by-hop flow control: send queue levels the driver reported ([`flow`]).
    flow: flow::Flow,
    /// Neighbours that said, in their latest heartbeats, that they leave this daemon's frames
    /// unread (flow control), with when they last said so.
    paused_by: FxHashMap<Rank, Instant>,
    /// Direct links beside the tree.
    direct: crate::direct::DirectLinks,
    /// Messages to daemons whose direct link is closing or closed, in order
    /// (`direct::Via::Hold`; `direct_held.rs`).
    direct_held: FxHashMap<Rank, direct_held::HeldFor>,
    /// Daemons whose held messages reach the flow-control high-water mark (the origin gate
    /// refuses sends to them), and a count of changes of that set (in the gate's version).
    direct_held_over: usize,
    direct_held_generation: u64,
    /// Frames from peers whose direct link waits for their drain marker (`marker_wait.rs`).
    marker_waits: FxHashMap<Rank, marker_wait::MarkerWait>,
    /// Frames that waited there since the start (the simulator reports it).
    marker_waited: u64,
    /// Streams produced and consumed here.
    streams: streams::Streams,
    /// The newest incarnation seen of each neighbour.
    incarnations: FxHashMap<Rank, u64>,
    /// The incarnation every peer is known to have reached (`NodeConfig::incarnation_floor`).
    incarnation_floor: u64,
    /// Status queries in progress here (`crate::status`).
    status: crate::status::gather::Gathers,
    /// Status queries for children this daemon has just adopted, sent right after their
    /// adoption notice (`status.rs`, `status_ask_after_notice`).
    status_asks_held: Vec<(Rank, bytes::Bytes)>,
    /// What the transport says of each link it holds (`handle_link_path`): the peer's address
    /// in use (none while it has no connection) and its failovers, for status reports. At most
    /// one entry per rank of the DVM; removed once the link has neither.
    link_paths: FxHashMap<Rank, (Option<std::net::SocketAddr>, u64)>,
    /// When [`Node::start`] ran (the uptime a status reports).
    started: Option<Instant>,
    /// The driver's last wall-clock reading: (when, ns since the Unix epoch).
    wall: Option<(Instant, i64)>,
    out: VecDeque<Output>,
}

impl Node {
    /// A node for `cfg`, not started: call [`Node::start`] next.
    pub fn new(cfg: NodeConfig) -> Result<Node, TreeError> {
        let routing = RoutingState::new(cfg.radix, cfg.size, cfg.rank)?;
        let me = cfg.rank;
        // The slice comes at wire-up; until then only rank 0's contact is known.
        let mut contacts = contacts::Contacts::default();
        if let (1.., Some(h)) = (me, cfg.hnp.clone()) {
            contacts.own(h);
        }
        let xcast = Xcast::with_limits(
            &routing,
            xcast_limits(cfg.msg_max_bytes, cfg.bcast_part_bytes),
        );
        let allgather = Allgather::new(&routing);
        let group = GroupGather::new(&routing);
        Ok(Node {
            me,
            size: cfg.size,
            incarnation: cfg.incarnation,
            msg_max_bytes: cfg.msg_max_bytes,
            bcast_part_bytes: cfg.bcast_part_bytes,
            prewire_queue_max: cfg.prewire_queue_max,
            trace: cfg.trace,
            uri: cfg.uri,
            relm: Relm::new(me, cfg.size, cfg.relm),
            matcher: Matcher::new(cfg.unmatched_max),
            routing,
            xcast,
            allgather,
            group,
            modex: crate::modex::Modex::new(me, cfg.size),
            clients: crate::clients::Clients::new(me, cfg.size, cfg.msg_max_bytes, cfg.client_uids),
            monitor: cfg
                .heartbeat
                .map(|(interval, timeout)| HeartbeatMonitor::new(interval, timeout)),
            heartbeat_at: None,
            wire: Wire::Waiting(None),
            wired_at_start: cfg.wired_at_start,
            rejoin: cfg.rejoin,
            initial_size: match cfg.initial_size {
                0 => cfg.size,
                n => n.min(cfg.size),
            },
            settled: true,
            restored_at: FxHashMap::default(),
            deaths: FxHashMap::default(),
            leaving: None,
            departed: std::collections::BTreeSet::new(),
            departing: BTreeMap::new(),
            lives: FxHashMap::default(),
            my_life: 0,
            rejoin_busy: 0,
            admitting: BTreeMap::new(),
            rejoin_held: VecDeque::new(),
            wireup_timeout: cfg.wireup_timeout,
            contacts,
            contacts_setting: cfg.contacts,
            prewire: VecDeque::new(),
            local: VecDeque::new(),
            epoch: 0,
            confirmed: Vec::new(),
            counters: Counters::default(),
            stopping: None,
            root_refused_key: false,
            relm_next_token: 0,
            bcast_tokens: FxHashMap::default(),
            relm_posted: Default::default(),
            gathering: BTreeSet::new(),
            group_tokens: BTreeMap::new(),
            group_encoded: None,
            xcast_deferred: VecDeque::new(),
            unreported: BTreeSet::new(),
            incarnations: FxHashMap::default(),
            incarnation_floor: cfg.incarnation_floor,
            flow: flow::Flow::new(cfg.flow),
            direct: crate::direct::DirectLinks::new(me, cfg.direct),
            direct_held: FxHashMap::default(),
            direct_held_over: 0,
            direct_held_generation: 0,
            marker_waits: FxHashMap::default(),
            marker_waited: 0,
            streams: streams::Streams::default(),
            paused_by: FxHashMap::default(),
            status: Default::default(),
            status_asks_held: Vec::new(),
            link_paths: Default::default(),
            started: None,
            wall: None,
            out: VecDeque::new(),
        })
    }

    // ----- queries --------------------------------------------------------------------------

    /// This daemon's rank.
    pub fn rank(&self) -> Rank {
        self.me
    }

    /// This daemon's incarnation (`NodeConfig::incarnation`).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The incarnation this daemon knows for `peer` (learnt at first contact or from a
    /// restore), if any.
    pub fn known_incarnation(&self, peer: Rank) -> Option<u64> {
        self.incarnations.get(&peer).copied()
    }

    /// The DVM's size.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// This daemon's view of the tree.
    pub fn routing(&self) -> &RoutingState {
        &self.routing
    }

    /// Reliable messaging's state (read-only: counters, idleness).
    pub fn relm(&self) -> &Relm {
        &self.relm
    }

    /// Group collectives this daemon keeps state for (its own and those it relays).
    pub fn group_tracked(&self) -> usize {
        self.group.tracked()
    }

    /// Data-exchange fetches in flight here.
    pub fn modex_fetching(&self) -> usize {
        self.modex.sizes().1
    }

    /// The broadcast core's state (read-only).
    pub fn xcast(&self) -> &Xcast {
        &self.xcast
    }

    /// The DVM's fault-confirmation epoch as applied here.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether wire-up is complete here (for a rejoining daemon: rank 0 welcomed it).
    pub fn is_wired(&self) -> bool {
        matches!(self.wire, Wire::Wired)
    }

    /// Whether callers' commands run (wired, and for a rejoined daemon, settled).
    pub fn is_settled(&self) -> bool {
        self.is_wired() && self.settled
    }

    /// Why the node stops, once it does.
    pub fn stopping(&self) -> Option<&StopReason> {
        self.stopping.as_ref()
    }

    /// Whether `r` is a tree neighbour (parent or child) now.
    /// Whether a link to `r` is a bulk link for the `bulk_networks` setting: a direct link, or
    /// any other link beside the tree (a tree neighbour's link, and rank 0's for lookups and
    /// wire-up, carry control traffic).
    pub fn carries_bulk(&self, r: Rank) -> bool {
        self.direct.is_direct(r) || (!self.is_neighbour(r) && r != 0)
    }

    pub fn is_neighbour(&self, r: Rank) -> bool {
        self.routing.parent() == Some(r) || self.routing.children().contains(&r)
    }

    /// Whether this daemon believes `r` failed.
    pub fn is_failed(&self, r: Rank) -> bool {
        self.routing.is_failed(r)
    }

    /// The contact URI of rank `r`, if known (rank 0's from the start; after wire-up the
    /// ancestors' and the subtree's, and those looked up). A driver that must dial a rank
    /// whose contact is not known calls [`Node::want_contact`].
    pub fn contact(&self, r: Rank) -> Option<&ContactUri> {
        self.contacts.get(r)
    }

    /// The counters the node keeps (the driver adds its own: connections, wake-ups, ...).
    pub fn counters(&self) -> Counters {
        let mut c = self.counters.clone();
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
        c.relm_relayed = r.relayed;
        let (unacked, cached, pending) = self.relm.records();
        c.relm_unacked = unacked as u64;
        c.relm_cached = cached as u64;
        c.relm_pending = pending as u64;
        c.flow_congested = self.flow.episodes();
        c.direct = self.direct.counters();
        c.streams = self.streams.counters();
        c.clients = self.clients.counters();
        self.collective_counters(&mut c);
        c
    }

    /// The counters the driver increments itself (transport events).
    pub fn counters_mut(&mut self) -> &mut Counters {
        &mut self.counters
    }

    // ----- outputs --------------------------------------------------------------------------

    /// The next thing to do, in order.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    /// When [`Node::handle_timeout`] is next due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let wireup = match &self.wire {
            Wire::Collecting(_, at) => Some(*at),
            Wire::Waiting(at) if self.stopping.is_none() => *at,
            Wire::Rejoining(at, again) if self.stopping.is_none() => Some((*at).min(*again)),
            _ => None,
        };
        if self.stopping.is_some() {
            return wireup;
        }
        // Asked once per loop turn: written out as pairwise minimums (an array chained into an
        // iterator compiled to a copy and a loop).
        let mut at = earliest(wireup, self.heartbeat_at);
        at = earliest(at, self.relm.poll_timeout());
        at = earliest(at, self.direct.poll_timeout());
        at = earliest(at, self.streams.poll_timeout());
        at = earliest(at, self.status.poll_timeout());
        at = earliest(at, self.contacts.in_flight().map(|f| f.deadline));
        earliest(at, self.leave_timeout())
    }

    /// Time passed: the wire-up deadline (rank 0), the heartbeat tick, RELM's timers.
    pub fn handle_timeout(&mut self, now: Instant, links: &dyn LinkProgress) {
        if let Wire::Collecting(_, at) = &self.wire
            && *at <= now
        {
            self.finish_wireup(now);
        }
        if self.stopping.is_some() {
            return;
        }
        if let Wire::Waiting(Some(at)) = self.wire
            && at <= now
        {
            self.no_table_in_time(now);
            return;
        }
        if let Wire::Rejoining(at, again) = self.wire {
            if at <= now {
                self.no_welcome_in_time(now);
                return;
            }
            if again <= now {
                self.ask_rejoin(now, at);
            }
        }
        if self.heartbeat_at.is_some_and(|at| at <= now) {
            self.heartbeat_tick(now, links);
        }
        if self.relm.poll_timeout().is_some_and(|at| at <= now) {
            let paths =
                reliable::Paths::new(&self.routing, &self.direct, (&self.lives, self.my_life));
            self.relm.handle_timeout(now, &paths);
        }
        if self.direct.poll_timeout().is_some_and(|at| at <= now) {
            for peer in self.direct.handle_timeout(now) {
                self.fall_back(now, peer);
            }
            self.send_direct_control(now);
        }
        if self.streams.poll_timeout().is_some_and(|at| at <= now) {
            self.streams_timeout(now);
        }
        if self.contacts.in_flight().is_some_and(|f| f.deadline <= now) {
            self.lookup_timeout(now);
        }
        if self.status.poll_timeout().is_some_and(|at| at <= now) {
            self.answer_due(now);
        }
        self.pump_leave(now);
        self.streams_release(now);
    }

    /// Once per driver turn, after its inputs: self-sends are delivered, then the collectives'
    /// and RELM's frames, events and completions come out.
    pub fn pump(&mut self, now: Instant) {
        self.read_held_since_rejoin(now);
        self.read_released_markers(now);
        self.deliver_local(now);
        self.pump_grpcomm(now);
        self.status_send_held_asks();
        self.pump_modex(now);
        self.pump_clients(now);
        self.pump_relm(now);
        self.pump_streams(now);
        self.pump_leave(now);
        self.pump_held();
        // A link may have stopped waiting for its marker in this turn's work.
        self.read_released_markers(now);
    }

    /// A header for a frame this daemon sends now.
    fn header(&self, kind: Kind, origin: Rank, dst: Rank, tag: Tag, len: usize) -> Header {
        Header {
            kind,
            origin,
            dst,
            tag,
            epoch: self.incarnation,
            seq: 0,
            len: len as u32,
            lives: Header::lives_of(self.life_of(origin), self.life_of(dst)),
        }
    }

    /// Rank `r`'s life as this daemon knows it (see `lives`).
    pub(super) fn life_of(&self, r: Rank) -> u16 {
        life_in((self.me, self.my_life), &self.lives, r)
    }

    /// Queues a frame for neighbour `to`. Never to itself, never to a rank it believes failed
    /// (the wire-up report to rank 0 and a flood copy are direct too).
    fn transmit(
        &mut self,
        to: Rank,
        header: Header,
        payload: impl Into<crate::oob::send_queue::Payload>,
        token: Option<u64>,
    ) {
        if to == self.me || to >= self.size || self.routing.is_failed(to) {
            crate::bug!(
                "rank {}: a {:?} frame for rank {to}, which is itself, out of range or failed",
                self.me,
                header.kind
            );
            if let Some(token) = token {
                self.done(token, Err(crate::SendError::NodeDown(to)));
            }
            return;
        }
        let payload = payload.into();
        // A message written straight to a daemon that is no tree neighbour goes on the
        // connection of their direct link, if any. Once the link ends that connection carries
        // nothing more: the message takes the tree instead (see `DirectLinks::ends`).
        if header.kind == Kind::Msg && header.tag != crate::direct::TAG_DIRECT {
            match self.direct.ends(to) {
                Some(crate::direct::Ending::Closing) if !self.is_neighbour(to) => {
                    self.hold(to, (header, payload, token));
                    return;
                }
                Some(crate::direct::Ending::Fenced) if !self.is_neighbour(to) => {
                    self.forward(header, payload, token);
                    return;
                }
                _ => {}
            }
        }
        self.push_transmit(to, header, payload, token);
    }

    /// Hands a frame for neighbour `to` to the driver as it is.
    fn push_transmit(
        &mut self,
        to: Rank,
        header: Header,
        payload: crate::oob::send_queue::Payload,
        token: Option<u64>,
    ) {
        self.out.push_back(Output::Transmit {
            to,
            header,
            payload,
            token,
        });
    }

    fn done(&mut self, token: u64, result: Result<(), crate::SendError>) {
        self.out.push_back(Output::SendDone { token, result });
    }

    /// The send queue towards neighbour `peer` now holds `queued` bytes (frames handed over in
    /// [`Output::Transmit`] and not yet written). Call it whenever that may have changed:
    /// after carrying out transmits, after writing. It decides [`Node::may_read`] and whether
    /// this daemon's callers' sends towards `peer` are turned away (`Busy`).
    pub fn handle_send_queue(&mut self, now: Instant, peer: Rank, queued: usize, bulk: usize) {
        self.flow.handle_levels(now, peer, queued, bulk);
        self.streams_reported(peer);
        self.streams_release(now);
    }

    /// Whether outputs wait to be taken with [`Node::poll_output`] (an input such as
    /// [`Node::handle_send_queue`] may produce some: take them before sleeping), or work waits
    /// for the next [`Node::pump`] (a stream to this daemon itself): pump again at once.
    pub fn has_output(&self) -> bool {
        !self.out.is_empty() || self.has_local_streams()
    }

    /// Whether this daemon produces or consumes a stream (its driver then does not linger:
    /// `driver::linger`).
    pub fn has_streams(&self) -> bool {
        self.streams.any_open()
    }

    /// Whether the driver may read frames from neighbour `peer` now. A driver that stops
    /// reading a connection because of this must ask again after each
    /// [`Node::handle_send_queue`] and at least every 100 ms while [`flow::Flow::is_pausing`]
    /// (a pause also ends when a congested queue counts as stuck).
    ///
    /// Nor while the frames from `peer` that wait for its drain marker (a direct link) are at
    /// their bound (re-check every turn: the marker may come at any input).
    pub fn may_read(&self, now: Instant, peer: Rank) -> bool {
        self.marker_wait_has_room(peer) && self.flow.may_read(now, peer)
    }

    /// [`Node::may_read`] for `peer`'s link (its tree or direct connection), as opposed to its
    /// bulk connection: a queue congested with stream data only does not hold a link back
    /// ([`flow::Flow::may_read_link`]). The same re-checks apply.
    pub fn may_read_link(&self, now: Instant, peer: Rank) -> bool {
        self.marker_wait_has_room(peer) && self.flow.may_read_link(now, peer)
    }

    /// Whether a send originated here towards `dst` may be accepted now: its next hop's queue
    /// is not congested (flow control). A caller that submits sends from other threads
    /// publishes these answers to them (the driver's origin gate) and refuses `Busy` before
    /// submitting; this node itself refuses only sends that carry a completion token, so a
    /// send without one, admitted by such a gate a moment before a queue became congested, is
    /// never dropped for flow control. The answers change only when
    /// [`Node::origin_gate_version`] does.
    pub fn may_originate_to(&self, dst: Rank) -> bool {
        if self.direct_held_over > 0 && self.held_over(dst) {
            // Messages held for a closed direct link reach the high-water mark.
            return false;
        }
        !self.flow.any_congested()
            || self
                .hop_towards(dst)
                .is_none_or(|h| self.flow.may_originate(h))
    }

    /// Whether [`Node::may_originate_to`] says yes for every destination (the common case:
    /// no queue congested, no held messages over the mark).
    pub fn origin_gate_open(&self) -> bool {
        !self.flow.any_congested() && self.direct_held_over == 0
    }

    /// Whether stream data for `dst` may be released now: its next hop's queue is not
    /// congested (flow control; bulk data does not go ahead of anything).
    pub(crate) fn may_release_to(&self, dst: Rank) -> bool {
        !self.flow.any_congested()
            || self
                .hop_towards(dst)
                .is_none_or(|h| self.flow.may_release(h))
    }

    /// The neighbour a message to `dst` is queued towards now (none for this daemon itself or
    /// an unreachable rank).
    fn hop_towards(&self, dst: Rank) -> Option<Rank> {
        if self.direct.is_direct(dst) {
            return Some(dst);
        }
        match self.routing.route(dst) {
            Route::Parent(hop) | Route::Child(hop) => Some(hop),
            _ => None,
        }
    }

    /// Changes whenever an answer of [`Node::may_originate_to`] may have changed: when the
    /// congested queues change, the tree is repaired, direct links change, or the messages
    /// held for a closed link cross the high-water mark.
    pub fn origin_gate_version(&self) -> (u64, usize, u64) {
        (
            self.flow.generation(),
            self.routing.failed_count(),
            // Both only grow: their sum changes when either does.
            self.direct
                .generation()
                .wrapping_add(self.direct_held_generation),
        )
    }

    /// The direct-link table (see [`crate::direct`]).
    pub fn direct(&self) -> &crate::direct::DirectLinks {
        &self.direct
    }

    /// The flow-control state (see [`flow`]).
    pub fn flow(&self) -> &flow::Flow {
        &self.flow
    }

    /// Checks the rules every node keeps at every step (the simulator calls this after each
    /// input); the first one broken.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.direct.check_invariants()?;
        self.check_marker_waits()?;
        self.clients
            .check_invariants()
            .map_err(|e| format!("rank {}: clients: {e}", self.me))?;
        self.streams
            .check_invariants()
            .map_err(|e| format!("rank {}: {e}", self.me))?;
        let (_, _, pending) = self.relm.records();
        let (users, runtime) = (self.relm.user_unacked(), self.relm.runtime_unacked());
        let cfg = self.relm.config();
        let window = cfg
            .unacked_max
            .saturating_add(crate::limits::RELM_RUNTIME_RESERVE);
        if users > cfg.unacked_max || runtime > window || pending > cfg.pending_max {
            return Err(format!(
                "rank {}: RELM table beyond its bounds ({users} users' and {runtime} runtime \
                 messages unacknowledged, {pending} pending)",
                self.me
            ));
        }
        if self.prewire.len() > self.prewire_queue_max {
            return Err(format!(
                "rank {}: pre-wire-up queue beyond its bound",
                self.me
            ));
        }
        if self.routing.is_failed(self.me) {
            return Err(format!("rank {}: believes itself failed", self.me));
        }
        let failed: Vec<Rank> = self.routing.failed().collect();
        if let Some(r) = self.confirmed.iter().find(|r| !failed.contains(r)) {
            return Err(format!(
                "rank {}: rank {r} confirmed dead but routed through",
                self.me
            ));
        }
        Ok(())
    }
}

/// Rank `r`'s life in a daemon's view: its own (`me`, `my_life`), else what `lives` says (0
/// for a rank never admitted back). `Node::life_of` and RELM's `Paths` both read it so.
pub(super) fn life_in((me, my_life): (Rank, u16), lives: &FxHashMap<Rank, u16>, r: Rank) -> u16 {
    if r == me {
        my_life
    } else if lives.is_empty() {
        // Asked twice per frame; no rank has come back in most DVMs.
        0
    } else {
        lives.get(&r).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests;

/// The earlier of two optional deadlines.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
