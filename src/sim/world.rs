//! The simulated world: a virtual clock, an event queue, FIFO links with seeded latency, and
//! the faults of the scenario. One thread; everything follows from the seed.
//!
//! Connections: each pair of daemons has one connection at a time (a generation). When it
//! drops (a link fault, a partition, or a daemon closing it because it declared the other dead)
//! the frames in flight on it are lost; each side learns of the loss and, if its node says so,
//! redials with bounded backed-off attempts. Frames sent meanwhile wait (as in the driver's
//! pending queue) and go out once a redial succeeds, after both sides' link-up. A redial that
//! finds the peer has declared this daemon dead brings it the peer's "declared dead" frame;
//! one that cannot get through within the attempts reports the peer unreachable. A daemon that
//! stops must have been declared dead (or, with heartbeats, have lost rank 0); from then on it
//! counts as crashed.

use super::check::{self, Checker, Violation};
use super::frame::Frame;
use super::node::{Out, SimNode, TAG_PLAIN, TAG_RELIABLE};
use super::rng::Rng;
use super::swarm::{Fault, FaultKinds, HEARTBEAT_INTERVAL_US, HEARTBEAT_TIMEOUT_US, Scenario};
use crate::Rank;
use crate::node::StopReason;
use crate::relm::RelmConfig;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

mod bulk_wire;
mod capacity;
mod clients;
mod cost;
mod groups;
mod handshakes;
mod held;
mod links;
mod rejoin;
mod sessions;
mod status;
mod streams;
mod sweep;

pub use capacity::LinkCapacity;
pub use cost::CostModel;

/// Events processed per seed at most, or `EVENTS_PER_DAEMON_MAX` per daemon if that is more:
/// a run that needs more has livelocked. (A 100,000-daemon run's broadcasts alone are
/// millions of deliveries, each a frame and its acknowledgement.)
pub const EVENTS_MAX: u64 = 20_000_000;
/// See `EVENTS_MAX`.
pub const EVENTS_PER_DAEMON_MAX: u64 = 1_000;
/// Virtual time allowed after the faults stop for everything to settle (the liveness bound).
pub const LIVENESS_US: u64 = 600_000_000;

/// Redial attempts before a peer is reported unreachable (delays 20, 40, ... 640 ms).
const REDIAL_ATTEMPTS_MAX: u32 = 6;
/// The first redial delay; it doubles per attempt.
const REDIAL_BASE_US: u64 = 20_000;

#[derive(Debug)]
enum Ev {
    Frame {
        from: Rank,
        to: Rank,
        frame: Frame,
        /// The connection generation it was sent on (a frame of an older one was lost).
        generation: u64,
        /// A heartbeat (kept out of the count of work still to do).
        heartbeat: bool,
        /// Written into its link's session (`sessions.rs`); false for the seed's stale and
        /// duplicate copies, which stand for leftovers of other connections.
        counted: bool,
    },
    /// `to`'s acknowledgement of `from`'s link session reaches `from`.
    LinkAck {
        from: Rank,
        to: Rank,
        generation: u64,
    },
    /// The connection between `a` and `b` drops and stays unusable until `until_us`.
    LinkDown {
        a: Rank,
        b: Rank,
        until_us: u64,
    },
    /// Every connection between `group` and the rest drops until `until_us`.
    Partition {
        group: Vec<Rank>,
        until_us: u64,
    },
    /// `node` notices its connection with `peer` is gone.
    LinkLost {
        node: Rank,
        peer: Rank,
    },
    /// `node` dials `peer` again.
    Redial {
        node: Rank,
        peer: Rank,
        attempt: u32,
    },
    Timer {
        node: Rank,
    },
    Detect {
        node: Rank,
        dead: Rank,
        /// `dead`'s restarts when the detection was planned (`rejoin.rs`): one of an earlier
        /// life is moot while a later life runs (the connection it is about is gone; the new
        /// life made its own).
        life: u64,
        /// `node`'s incarnation when the detection was planned: a detection planned for an
        /// earlier incarnation of the detector is moot (the connection it is about died with
        /// that incarnation; seed 27070: a restarted daemon, still rejoining, took its dead
        /// predecessor's detection of its parent and stopped).
        by: u64,
    },
    Crash {
        rank: Rank,
    },
    /// A dead daemon starts again and asks to rejoin (`world/rejoin.rs`); `attempt` counts
    /// the tries of one planned restart.
    Restart {
        rank: Rank,
        attempt: u32,
    },
    /// A daemon leaves in order (`Node::leave`).
    Leave {
        rank: Rank,
    },
    Stall {
        rank: Rank,
        until_us: u64,
    },
    Send {
        origin: Rank,
        dst: Rank,
        reliable: bool,
    },
    Broadcast {
        origin: Rank,
    },
    Contribute {
        rank: Rank,
        id: u64,
    },
    /// Member `rank` calls collective `seq` of the scenario's group `group`
    /// (`world/groups.rs`).
    GroupCall {
        group: usize,
        seq: u64,
        rank: Rank,
    },
    /// The scenario's clients are admitted (`world/clients.rs`).
    ClientStart,
    /// The scenario's client send number `id` is made (by a client of `rank`).
    ClientSend {
        id: usize,
        rank: Rank,
    },
    /// The scenario's client `client` (of `rank`) exits.
    ClientExit {
        client: usize,
        rank: Rank,
    },
    /// The scenario's stream number `id` is fetched (`world/streams.rs`).
    Fetch {
        id: u64,
    },
    /// A handshake frame (or the end of the connection, `None`) reaches one end of a
    /// connection (`handshakes.rs`); `node` is the daemon at that end (none: the stranger).
    Hs {
        conn: u64,
        to_acceptor: bool,
        node: Option<Rank>,
        frame: Option<crate::oob::frame::Frame>,
    },
    /// A connection's handshake timeout.
    HsTimeout {
        conn: u64,
        node: Option<Rank>,
    },
    /// The head frame of the wire `from -> to` has been sent (capacity model).
    WireDone {
        from: Rank,
        to: Rank,
    },
    /// The head frame of the bulk connection's wire `from -> to` has been sent.
    BulkWireDone {
        from: Rank,
        to: Rank,
    },
    /// A frame reaches `to` over the bulk connection from `from` (no link session).
    BulkFrame {
        from: Rank,
        to: Rank,
        frame: Frame,
        generation: u64,
    },
    /// `node` looks again at the frames it left unread (capacity model).
    Recheck {
        node: Rank,
    },
    /// A stranger connects to `target` claiming `claims`.
    Stranger {
        target: Rank,
        claims: Rank,
        forge: bool,
    },
    /// An operator asks `asker` for its subtree's status.
    Status {
        asker: Rank,
        budget_ms: u32,
        all: bool,
    },
}

/// Counts from one run.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunStats {
    /// Events processed.
    pub events: u64,
    /// Virtual time at the end, microseconds.
    pub end_us: u64,
    /// Reliable messages accepted and posted.
    pub reliable_sent: u64,
    /// Reliable messages posted at their destinations.
    pub reliable_posted: u64,
    /// Plain messages sent and posted.
    pub plain_sent: u64,
    /// Plain messages posted at their destinations.
    pub plain_posted: u64,
    /// Ranks crashed.
    pub crashed: u32,
    /// RELM retransmissions and replays, summed over daemons.
    pub retransmits: u64,
    /// RELM replays, summed over daemons.
    pub replays: u64,
    /// Broadcast operations rank 0 numbered, and deliveries of them.
    pub bcast_ops: u64,
    /// Of those, broadcasts split into parts (pipelined).
    pub bcast_split: u64,
    /// Deliveries of broadcast operations, summed over daemons.
    pub bcast_delivered: u64,
    /// Allgathers completed (per daemon).
    pub gathers: u64,
    /// Daemons declared dead while alive that then exited (fenced themselves).
    pub fenced: u32,
    /// Connections dropped between living daemons (link faults, partitions).
    pub link_drops: u64,
    /// Link sessions: frames written again on a new connection.
    pub link_resent: u64,
    /// Link sessions: copies receivers dropped (they had them before the drop).
    pub link_duplicates: u64,
    /// Stale frames (an earlier incarnation of their sender) the daemons dropped.
    pub stale_dropped: u64,
    /// RELM and collective frames delivered twice.
    pub duplicated: u64,
    /// Runs with strangers: their connections, those refused at a forged proof, and dials
    /// that met the peer's own dial (resolved by the link rule).
    pub strangers: u64,
    /// Stranger connections refused at a forged proof.
    pub strangers_refused: u64,
    /// Dials that met the peer's own dial (resolved by the link rule).
    pub dials_crossed: u64,
    /// Runs with the capacity model: sends refused `Busy` by flow control and offered again,
    /// frames a receiver left unread (flow control), frames dropped at a full queue.
    pub sends_busy: u64,
    /// Frames a receiver left unread (flow control).
    pub unread_frames: u64,
    /// Runs of the `batch` kind: batch frames the workload sent (each several plain messages).
    pub batch_frames: u64,
    /// Reliable batch frames the daemons sent (`relm::batch`), by origins and hops, summed
    /// over the daemons living at the end.
    pub relm_batch_frames: u64,
    /// Frames dropped at a full queue (must stay 0 with flow control on).
    pub dropped_queue_full: u64,
    /// Runs with bulk connections (`world/bulk_wire.rs`): frames moved from a link's held
    /// line to its bulk connection.
    pub bulk_moved: u64,
    /// Runs with bulk connections: syncs answered (a marker held behind the bulk connection's
    /// frames let go).
    pub bulk_syncs: u64,
    /// Runs with direct links: frames that waited for a drain marker, in the node
    /// (`node/marker_wait.rs`) or unread in the world at the node's bound; links opened, and
    /// fallbacks to the tree.
    pub held_frames: u64,
    /// 1 if the run checked plain messages' order (`Scenario::keeps_plain_order`).
    pub plain_order_runs: u64,
    /// Direct links opened.
    pub direct_opened: u64,
    /// Direct-link requests that fell back to the tree.
    pub direct_fallbacks: u64,
    /// Direct links evicted to make room.
    pub direct_evicted: u64,
    /// Runs with streams: streams finished (every byte checked), and ended by a death.
    pub streams_finished: u64,
    /// Streams ended by a death.
    pub streams_failed: u64,
    /// Runs with groups: group collective results delivered (and checked).
    pub group_results: u64,
    /// Runs with clients: client messages delivered (and checked).
    pub client_messages: u64,
    /// Runs with groups: data-exchange gets answered with the right value after a fence.
    pub modex_gets: u64,
    /// Status queries answered.
    pub statuses: u64,
    /// Rank 0's status after the run: the virtual time it took, the depth of the tree, the
    /// latency of one hop (µs).
    pub last_status: Option<(u64, u32, u64)>,
}

/// What [`World::step_one`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// No event left.
    Empty,
    /// An empty slot, or an event put back for a stalled daemon.
    Deferred,
    /// An event was handled.
    Handled,
}

/// A simulated DVM: every daemon's `Node` on a virtual clock and a seeded network, the faults
/// a [`Scenario`] plans, and the checkers run after every event.
pub struct World {
    radix: u32,
    base: Instant,
    now_us: u64,
    seq: u64,
    rng: Rng,
    scen: Scenario,
    nodes: Vec<SimNode>,
    alive: Vec<bool>,
    crashed: Vec<Rank>,
    stalled_until: Vec<u64>,
    timer_at: Vec<Option<u64>>,
    link_last: HashMap<(Rank, Rank), u64>,
    slow: Vec<(Rank, Rank, u64, u64, u64)>,
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    slab: Vec<Option<Ev>>,
    free: Vec<usize>,
    pair_seq: HashMap<(Rank, Rank), u64>,
    next_token: u64,
    /// Per connection (lower rank first): its generation and until when it cannot be used.
    conn_gen: HashMap<(Rank, Rank), u64>,
    conn_down_until: HashMap<(Rank, Rank), u64>,
    /// Frames waiting for a connection to come back, per direction.
    parked: HashMap<(Rank, Rank), Vec<Frame>>,
    /// (node, peer) redials under way.
    redialing: HashSet<(Rank, Rank)>,
    /// Connections (lower rank first) that dropped and were not re-established yet.
    conn_lost: HashSet<(Rank, Rank)>,
    /// Ranks some daemon declared failed.
    declared: HashSet<Rank>,
    /// Daemons that stopped because they were declared dead (or lost rank 0).
    fenced: Vec<Rank>,
    /// Events queued that are work (not timers, not heartbeats).
    busy: u64,
    check: Checker,
    stats: RunStats,
    /// Connections with their handshake (runs with strangers only).
    hs: Option<handshakes::Handshakes>,
    /// Link capacity (runs with the `overload` kind only).
    wires: Option<capacity::Wires>,
    /// Frames a daemon may not read yet, per direction (runs without the capacity model).
    held: HashMap<(Rank, Rank), held::Held>,
    /// The link sessions of every direction (`sessions.rs`).
    sessions: sessions::Sessions,
    /// (daemon, peer) whose direct link was seen closing (its sends were chased).
    closing_seen: HashSet<(Rank, Rank)>,
    /// The `stream` kind's applications.
    streams: streams::StreamApps,
    groups: groups::GroupApps,
    clients: clients::ClientApps,
    status: status::StatusQueries,
    /// `tbon sim --sweep-radix`: the cost model and the times it reads (`sweep.rs`).
    sweep: Option<sweep::SweepState>,
    /// RELM's settings of this run (a restarted daemon gets the same).
    relm_cfg: RelmConfig,
    /// The `rejoin` kind's restarts (`rejoin.rs`).
    restarts: rejoin::Restarts,
    /// (rank, allgather id) contributed to by the rank's current life.
    contributed: HashSet<(Rank, u64)>,
}

impl World {
    /// A world for `seed`: `size` daemons of radix `radix`, `messages` reliable messages.
    pub fn new(
        seed: u64,
        size: u32,
        radix: u32,
        messages: u64,
        (kinds, bcast_part_bytes): (FaultKinds, Option<usize>),
    ) -> Result<World, String> {
        let mut scen = Scenario::choose(seed, size, radix, messages, kinds);
        if let Some(p) = bcast_part_bytes {
            scen.bcast_part_bytes = p;
        }
        Self::with_scenario(seed, size, radix, scen)
    }

    /// A world of `size` daemons of radix `radix` that runs `scen` (its events are planned
    /// here); `seed` drives what the scenario leaves to chance during the run.
    pub fn with_scenario(
        seed: u64,
        size: u32,
        radix: u32,
        scen: Scenario,
    ) -> Result<World, String> {
        Self::build(seed, size, radix, scen, None)
    }

    /// [`World::with_scenario`], with the daemons wired from the start (`wireup` `None`) or
    /// running the real wire-up first with contacts of about `wireup` bytes.
    fn build(
        seed: u64,
        size: u32,
        radix: u32,
        scen: Scenario,
        wireup: Option<usize>,
    ) -> Result<World, String> {
        let heartbeat = scen.heartbeats.then_some((
            Duration::from_micros(HEARTBEAT_INTERVAL_US),
            Duration::from_micros(HEARTBEAT_TIMEOUT_US),
        ));
        let cfg = RelmConfig {
            cache_max: scen.cache_max,
            cache_ms: scen.cache_ms,
            ..RelmConfig::default()
        };
        crate::invariant::set_strict(true);
        let base = Instant::now();
        let flow = scen.flow;
        let nodes = (0..size)
            .map(|r| {
                let direct = scen.direct.get(r as usize).copied().unwrap_or_else(|| {
                    crate::direct::DirectConfig::from_config(&crate::config::Config::default())
                });
                let initial = scen.initial.min(size);
                SimNode::new(
                    r,
                    size,
                    radix,
                    cfg,
                    heartbeat,
                    (flow, direct),
                    base,
                    wireup,
                    (initial, scen.bcast_part_bytes),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let n = size as usize;
        let scen_initial = scen.initial.min(size);
        log::debug!("seed {seed}: {scen:?}");
        let mut w = World {
            radix,
            base,
            now_us: 0,
            seq: 0,
            rng: Rng::new(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 1),
            scen,
            nodes,
            // Ranks beyond the initial size (`grow`) are absent until they join.
            alive: (0..size).map(|r| r < scen_initial).collect(),
            crashed: (scen_initial..size).collect(),
            stalled_until: vec![0; n],
            timer_at: vec![None; n],
            link_last: HashMap::new(),
            slow: Vec::new(),
            queue: BinaryHeap::new(),
            slab: Vec::new(),
            free: Vec::new(),
            pair_seq: HashMap::new(),
            next_token: 0,
            conn_gen: HashMap::new(),
            conn_down_until: HashMap::new(),
            parked: HashMap::new(),
            redialing: HashSet::new(),
            conn_lost: HashSet::new(),
            declared: HashSet::new(),
            fenced: Vec::new(),
            busy: 0,
            check: Checker::default(),
            stats: RunStats::default(),
            hs: None,
            wires: None,
            held: HashMap::new(),
            sessions: sessions::Sessions::default(),
            closing_seen: HashSet::new(),
            streams: streams::StreamApps::default(),
            groups: groups::GroupApps::default(),
            clients: clients::ClientApps::default(),
            status: Default::default(),
            sweep: None,
            relm_cfg: cfg,
            restarts: rejoin::Restarts::default(),
            contributed: HashSet::new(),
        };
        w.check.plain_order = w.scen.keeps_plain_order();
        if let Some(cap) = w.scen.capacity {
            w.wires = Some(capacity::Wires::new(cap));
        }
        if w.scen
            .faults
            .iter()
            .any(|f| matches!(f, Fault::Stranger { .. }))
        {
            w.hs = Some(handshakes::Handshakes::default());
        }
        w.set_clocks();
        w.plan();
        Ok(w)
    }

    fn plan(&mut self) {
        let size = self.nodes.len() as u64;
        for f in self.scen.faults.clone() {
            match f {
                Fault::Crash { rank, at_us } => self.push(at_us, Ev::Crash { rank }),
                Fault::Restart { rank, at_us } => {
                    self.push(at_us, Ev::Restart { rank, attempt: 0 })
                }
                Fault::Leave { rank, at_us } => self.push(at_us, Ev::Leave { rank }),
                Fault::Stall {
                    rank,
                    at_us,
                    for_us,
                } => self.push(
                    at_us,
                    Ev::Stall {
                        rank,
                        until_us: at_us + for_us,
                    },
                ),
                Fault::SlowLink {
                    a,
                    b,
                    at_us,
                    for_us,
                    factor,
                } => self.slow.push((a, b, at_us, at_us + for_us, factor)),
                Fault::Stranger {
                    target,
                    claims,
                    at_us,
                    forge,
                } => self.push(
                    at_us,
                    Ev::Stranger {
                        target,
                        claims,
                        forge,
                    },
                ),
                Fault::LinkDown {
                    a,
                    b,
                    at_us,
                    for_us,
                } => self.push(
                    at_us,
                    Ev::LinkDown {
                        a,
                        b,
                        until_us: at_us + for_us,
                    },
                ),
                Fault::Partition {
                    group,
                    at_us,
                    for_us,
                } => self.push(
                    at_us,
                    Ev::Partition {
                        group,
                        until_us: at_us + for_us,
                    },
                ),
            }
        }
        for (id, &(.., at)) in self.scen.streams.clone().iter().enumerate() {
            self.push(at, Ev::Fetch { id: id as u64 });
        }
        self.plan_status();
        // Broadcasts from random daemons, and allgathers every daemon contributes to.
        for _ in 0..self.scen.broadcasts {
            let origin = self.rng.range(0, size - 1) as Rank;
            let at = self.rng.range(0, self.scen.traffic_us);
            self.push(at, Ev::Broadcast { origin });
        }
        for id in 1..=self.scen.gathers {
            for rank in 0..size {
                let at = self.rng.range(0, self.scen.safety_us);
                self.push(
                    at,
                    Ev::Contribute {
                        rank: rank as Rank,
                        id,
                    },
                );
            }
        }
        for &(group, seq, rank, at) in &self.scen.group_calls.clone() {
            self.push(at, Ev::GroupCall { group, seq, rank });
        }
        if !self.scen.clients.is_empty() {
            self.push(0, Ev::ClientStart);
            let home = self.scen.clients.clone();
            for (id, &(from, _, at)) in self.scen.client_sends.clone().iter().enumerate() {
                let rank = home.get(from).copied().unwrap_or(0);
                self.push(at.max(1), Ev::ClientSend { id, rank });
            }
            for &(client, at) in &self.scen.client_exits.clone() {
                let rank = home.get(client).copied().unwrap_or(0);
                self.push(at.max(1), Ev::ClientExit { client, rank });
            }
        }
        if size < 2 {
            return;
        }
        // The `batch` kind sends the same messages in runs: fewer sends, as many messages.
        let run = u64::from(self.scen.batch_plain.max(1));
        let plain_sends = self.scen.plain.div_ceil(run);
        let reliable_sends = self.scen.messages.div_ceil(run);
        let traffic = [(reliable_sends, true), (plain_sends, false)];
        for (count, reliable) in traffic {
            for _ in 0..count {
                let origin = self.rng.range(0, size - 1) as Rank;
                let mut dst = self.rng.range(0, size - 2) as Rank;
                if dst >= origin {
                    dst += 1;
                }
                let at = self.rng.range(0, self.scen.traffic_us);
                self.push_send(at, origin, dst, reliable);
            }
        }
        for (at, origin, dst) in self.scen.burst_sends.clone() {
            self.push_send(at, origin, dst, false);
        }
    }

    /// Schedules a user send from `origin` to `dst` at `at_us`.
    fn push_send(&mut self, at_us: u64, origin: Rank, dst: Rank, reliable: bool) {
        self.push(
            at_us,
            Ev::Send {
                origin,
                dst,
                reliable,
            },
        );
    }

    fn push(&mut self, at_us: u64, ev: Ev) {
        if is_work(&ev) {
            self.busy += 1;
        }
        let idx = match self.free.pop() {
            Some(i) => {
                if let Some(slot) = self.slab.get_mut(i) {
                    *slot = Some(ev);
                }
                i
            }
            None => {
                self.slab.push(Some(ev));
                self.slab.len() - 1
            }
        };
        self.seq += 1;
        self.queue.push(Reverse((at_us, self.seq, idx)));
    }

    /// Puts an event in a free slab slot; its index.
    fn store(&mut self, ev: Ev) -> usize {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slab.push(None);
                self.slab.len() - 1
            }
        };
        if let Some(slot) = self.slab.get_mut(idx) {
            *slot = Some(ev);
        }
        idx
    }

    fn now(&self) -> Instant {
        self.base + Duration::from_micros(self.now_us)
    }

    fn living(&self, r: Rank) -> bool {
        self.alive.get(r as usize).copied().unwrap_or(false)
    }

    /// Runs the safety phase then the liveness phase; the first broken rule, if any.
    pub fn run(&mut self) -> Result<RunStats, Violation> {
        let deadline = self.scen.safety_us + LIVENESS_US;
        while let Some(Reverse((at, ..))) = self.queue.peek() {
            if *at > deadline {
                let unquiet: Vec<String> = self
                    .nodes
                    .iter()
                    .filter(|n| {
                        self.living(n.rank)
                            && !(n.relm().is_idle()
                                && n.xcast().retained() == 0
                                && n.xcast().outstanding() == 0
                                && n.node.direct_held() == 0
                                && n.node.group_tracked() == 0
                                && n.node.modex_fetching() == 0)
                    })
                    .map(|n| {
                        format!(
                            "{}: relm idle {} retained {} outstanding {} direct {} groups {} \
                             fetches {}",
                            n.rank,
                            n.relm().is_idle(),
                            n.xcast().retained(),
                            n.xcast().outstanding(),
                            n.node.direct_held(),
                            n.node.group_tracked(),
                            n.node.modex_fetching()
                        )
                    })
                    .collect();
                log::debug!(
                    "still busy: rejoining {:?}, status pending {}, streams open {}, wires empty \
                     {}, daemons not quiet {unquiet:?}",
                    self.restarts.rejoining,
                    self.status_pending(),
                    self.streams
                        .open_at(|r| self.living(r) && !self.declared.contains(&r)),
                    self.wires.as_ref().is_none_or(capacity::Wires::is_empty)
                );
                for n in self.nodes.iter().filter(|n| self.living(n.rank)) {
                    log::debug!(
                        "still busy: rank {}, parent {:?}, broadcasts: {}",
                        n.rank,
                        n.node.routing().parent(),
                        n.xcast().describe()
                    );
                }
                let mut work: Vec<String> = self
                    .queue
                    .iter()
                    .filter_map(|Reverse((at, _, idx))| {
                        let ev = self.slab.get(*idx)?.as_ref()?;
                        is_work(ev).then(|| format!("{at} us: {ev:?}"))
                    })
                    .collect();
                work.sort();
                work.truncate(8);
                for w in &work {
                    let w: String = w.chars().take(300).collect();
                    log::debug!("still busy: work event {w}");
                }
                log::debug!(
                    "still busy: {} work events, held {:?}, redials {:?}, parked {:?}",
                    self.busy,
                    self.held
                        .iter()
                        .map(|(k, q)| (*k, q.len()))
                        .collect::<Vec<_>>(),
                    self.redialing,
                    self.parked
                        .iter()
                        .filter(|(_, v)| !v.is_empty())
                        .map(|(k, v)| (*k, v.len()))
                        .collect::<Vec<_>>()
                );
                return Err(Violation {
                    checker: "liveness",
                    detail: format!(
                        "still busy {} s after the faults stopped",
                        LIVENESS_US / 1_000_000
                    ),
                });
            }
            let at = *at;
            if self.step_one()? != Step::Handled {
                continue;
            }
            // With heartbeats the queue never empties: the run ends once no work is left and
            // every daemon is quiet.
            if self.scen.heartbeats && self.busy == 0 && at > self.scen.safety_us && self.quiet() {
                break;
            }
        }
        self.stats.end_us = self.now_us;
        if let Some(w) = &self.wires {
            self.stats.unread_frames = w.unread_frames;
            self.stats.dropped_queue_full = w.dropped;
            self.stats.bulk_moved = w.bulk.moved;
            self.stats.bulk_syncs = w.bulk.syncs;
            self.check_overload(w.dropped)?;
            if let Some(detail) = w.bulk.misordered.clone() {
                return Err(Violation {
                    checker: "bulk-order",
                    detail,
                });
            }
        }
        self.check_sessions()?;
        self.stats.link_resent = self.sessions.resent;
        self.stats.link_duplicates = self.sessions.duplicates;
        let mut gone = self.crashed.clone();
        gone.extend(&self.fenced);
        gone.sort_unstable();
        gone.dedup();
        self.check
            .final_state(&self.nodes, &self.alive, &gone, self.radix)?;
        self.check
            .final_collectives(&self.nodes, &self.alive, self.scen.gathers)?;
        self.final_groups()?;
        self.final_clients()?;
        if self.scen.final_status {
            self.final_status()?;
        }
        self.status_unanswered()?;
        self.stats.statuses = self.status.answered;
        self.stats.bcast_ops = self.check.ops.len() as u64;
        self.stats.bcast_split = self.check.split_ops;
        self.stats.bcast_delivered = self.check.bcast_delivered;
        self.stats.gathers = self.check.gathers;
        self.stats.reliable_sent = self.check.sent.values().map(|v| v.len() as u64).sum();
        self.stats.reliable_posted = self.check.reliable_posted;
        self.stats.plain_sent = self.check.plain_sent;
        self.stats.plain_posted = self.check.plain_posted;
        self.stats.crashed = self.crashed.len() as u32;
        self.stats.fenced = self.fenced.len() as u32;
        if let Some(hs) = &self.hs {
            self.stats.strangers = hs.strangers;
            self.stats.strangers_refused = hs.refused;
            self.stats.dials_crossed = hs.crossed;
        }
        for n in &self.nodes {
            self.stats.retransmits += n.relm().stats().retransmits;
            self.stats.relm_batch_frames += n.relm_batches;
            self.stats.replays += n.relm().stats().replays;
            self.stats.stale_dropped += n.node.counters().dropped_old_incarnation;
            self.stats.direct_opened += n.node.counters().direct.links_opened;
            self.stats.plain_order_runs = u64::from(self.check.plain_order);
            self.stats.direct_fallbacks += n.node.counters().direct.fallbacks;
            self.stats.direct_evicted += n.node.counters().direct.links_evicted;
            self.stats.held_frames += n.node.marker_waited();
            self.stats.streams_finished = self.streams.finished;
            self.stats.streams_failed = self.streams.failed;
        }
        self.stats.group_results = self.groups.delivered;
        self.stats.modex_gets = self.groups.endpoints_got;
        self.stats.client_messages = self.clients.received;
        Ok(self.stats)
    }

    /// Handles the next event, or puts a stalled daemon's back for when it wakes.
    fn step_one(&mut self) -> Result<Step, Violation> {
        let Some(Reverse((at, seq, idx))) = self.queue.pop() else {
            return Ok(Step::Empty);
        };
        self.stats.events += 1;
        let max = EVENTS_MAX.max(EVENTS_PER_DAEMON_MAX.saturating_mul(self.nodes.len() as u64));
        if self.stats.events > max {
            return Err(Violation {
                checker: "liveness",
                detail: format!("more than {max} events: livelock"),
            });
        }
        let Some(ev) = self.slab.get_mut(idx).and_then(Option::take) else {
            return Ok(Step::Deferred);
        };
        self.free.push(idx);
        if is_work(&ev) {
            self.busy = self.busy.saturating_sub(1);
        }
        self.now_us = self.now_us.max(at);
        // The sweep's cost model: one input per daemon waits in the heap for its processor
        // (its head), the others in the daemon's own queue behind it, so that a fan-in of N
        // frames to one daemon costs N events, not N squared re-queued ones.
        if let (Some(r), Some(s)) = (target(&ev), self.sweep.as_mut())
            && s.head.get(&r).is_some_and(|h| *h != seq)
        {
            if is_work(&ev) {
                self.busy += 1;
            }
            let idx2 = self.store(ev);
            if let Some(s) = self.sweep.as_mut() {
                s.waiting.entry(r).or_default().push_back((seq, idx2));
            }
            return Ok(Step::Deferred);
        }
        // A stalled daemon handles nothing until it wakes; what waits for it keeps its
        // order (same sequence numbers, later time).
        // So does an input that waits for its daemon's processor (the sweep's cost model).
        let until = target(&ev).map_or(0, |r| {
            let stalled = self.stalled_until.get(r as usize).copied().unwrap_or(0);
            stalled.max(self.sweep.as_ref().map_or(0, |s| s.cpus.free_at_us(r)))
        });
        if until > at {
            if let (Some(r), Some(s)) = (target(&ev), self.sweep.as_mut()) {
                s.head.insert(r, seq);
            }
            if is_work(&ev) {
                self.busy += 1;
            }
            let idx2 = self.store(ev);
            self.queue.push(Reverse((until, seq, idx2)));
            return Ok(Step::Deferred);
        }
        let at_node = target(&ev);
        if let (Some(s), Some(r)) = (self.sweep.as_mut(), at_node) {
            s.cpus.begin(r, self.now_us);
        }
        self.handle(ev)?;
        if let Some(s) = self.sweep.as_mut() {
            s.cpus.end();
            if let Some(r) = at_node {
                if s.head.get(&r) == Some(&seq) {
                    s.head.remove(&r);
                }
                // The next input waiting for this daemon's processor takes the head's place.
                if !s.head.contains_key(&r)
                    && let Some((next_seq, next_idx)) =
                        s.waiting.get_mut(&r).and_then(VecDeque::pop_front)
                {
                    s.head.insert(r, next_seq);
                    let when = s.cpus.free_at_us(r).max(self.now_us);
                    self.queue.push(Reverse((when, next_seq, next_idx)));
                }
            }
        }
        // The driver resumes a connection it left unread as soon as the node allows it,
        // on the next turn: here, after the node's next event.
        if let Some(r) = at_node
            && self.wires.is_some()
        {
            self.read_unread(r)?;
        }
        Ok(Step::Handled)
    }

    /// Nothing left to settle: no frames parked, no redials, and every living daemon's RELM
    /// and broadcast state empty.
    fn quiet(&self) -> bool {
        // A restarted daemon still waiting for its welcome (or for its retry) is work left
        // (seed 5094: the run ended while rank 0 had not yet answered).
        self.restarts.rejoining.is_empty()
            && !self.status_pending()
            && self.parked.values().all(Vec::is_empty)
            && self.held.is_empty()
            && self
                .streams
                .open_at(|r| self.living(r) && !self.declared.contains(&r))
                == 0
            && self.wires.as_ref().is_none_or(capacity::Wires::is_empty)
            && self.bulk_quiet()
            && self.redialing.is_empty()
            && self.nodes.iter().filter(|n| self.living(n.rank)).all(|n| {
                n.relm().is_idle()
                    && n.xcast().retained() == 0
                    && n.xcast().outstanding() == 0
                    && n.node.direct_held() == 0
                    && n.node.group_tracked() == 0
                    && n.node.modex_fetching() == 0
            })
    }

    /// Ranks that are dead, or that some daemon declared dead (a stalled daemon may be both
    /// declared and still running until it fences itself).
    fn gone(&self) -> Vec<Rank> {
        let mut g = self.crashed.clone();
        g.extend(self.declared.iter().copied());
        g.sort_unstable();
        g.dedup();
        g
    }

    fn handle(&mut self, ev: Ev) -> Result<(), Violation> {
        let now = self.now();
        match ev {
            Ev::Frame {
                from,
                to,
                frame,
                generation,
                heartbeat,
                counted,
            } => {
                // A connection to or from a dead daemon is gone, with whatever it carried; so
                // is a connection that dropped since the frame was sent.
                if !(self.living(from) && self.living(to))
                    || generation != self.generation(from, to)
                {
                    return Ok(());
                }
                if log::log_enabled!(log::Level::Trace) {
                    log::trace!("{} us: {from} -> {to}: {}", self.now_us, describe(&frame));
                }
                if self.wires.is_some()
                    && !self.wire_arrived(from, to, &frame, generation, heartbeat)
                {
                    return Ok(());
                }
                if self.wires.is_none() && !self.read_or_hold(from, to, &frame, generation, counted)
                {
                    return Ok(());
                }
                if counted && !self.session_read(from, to)? {
                    return Ok(());
                }
                if let Some(n) = self.nodes.get_mut(to as usize) {
                    n.handle_frame(now, from, frame);
                }
                self.after(to)?;
            }
            Ev::LinkAck {
                from,
                to,
                generation,
            } => self.on_link_ack(from, to, generation)?,
            Ev::WireDone { from, to } => self.on_wire_done(from, to)?,
            Ev::BulkWireDone { from, to } => self.on_bulk_wire_done(from, to)?,
            Ev::BulkFrame {
                from,
                to,
                frame,
                generation,
            } => self.on_bulk_frame(from, to, frame, generation)?,
            Ev::Recheck { node } => self.on_recheck(node)?,
            Ev::Timer { node } => {
                // Only the latest timer counts; a stall may have delayed it past its instant.
                let armed = self.timer_at.get(node as usize).copied().flatten();
                if armed.is_none_or(|a| a > self.now_us) {
                    return Ok(());
                }
                if let Some(t) = self.timer_at.get_mut(node as usize) {
                    *t = None;
                }
                if self.living(node)
                    && let Some(n) = self.nodes.get_mut(node as usize)
                {
                    n.handle_timeout(now);
                    self.after(node)?;
                }
            }
            Ev::Detect {
                node,
                dead,
                life,
                by,
            } => {
                let same_detector = self
                    .nodes
                    .get(node as usize)
                    .is_some_and(|n| n.node.incarnation() == by);
                if self.living(node)
                    && same_detector
                    && !self.moot_detection(node, dead, life)
                    && let Some(n) = self.nodes.get_mut(node as usize)
                {
                    log::debug!("{} us: rank {node} detects {dead}", self.now_us);
                    if let Some(s) = self.sweep.as_mut() {
                        s.marks.detected(self.now_us);
                    }
                    n.detect(now, dead);
                    self.after(node)?;
                }
            }
            Ev::Crash { rank } => {
                if !self.living(rank) {
                    return Ok(());
                }
                self.crashed.push(rank);
                self.crashed.sort_unstable();
                self.dies(rank);
            }
            Ev::Restart { rank, attempt } => self.on_restart(rank, attempt)?,
            Ev::Leave { rank } => {
                if self.living(rank)
                    && self.settled(rank)
                    && let Some(n) = self.nodes.get_mut(rank as usize)
                {
                    n.leave(now);
                    self.after(rank)?;
                }
            }
            Ev::LinkDown { a, b, until_us } => {
                self.drop_link(a, b, until_us);
            }
            Ev::Partition { group, until_us } => {
                let size = self.nodes.len() as Rank;
                for g in &group {
                    for o in (0..size).filter(|o| !group.contains(o)) {
                        self.drop_link(*g, o, until_us);
                    }
                }
            }
            Ev::LinkLost { node, peer } => {
                if !self.living(node) {
                    return Ok(());
                }
                let probe = match self.nodes.get_mut(node as usize) {
                    Some(n) => n.link_lost(now, peer),
                    None => false,
                };
                if probe {
                    self.redial(node, peer, 1);
                }
                self.after(node)?;
            }
            Ev::Redial {
                node,
                peer,
                attempt,
            } => return self.on_redial(node, peer, attempt),
            Ev::Hs {
                conn,
                to_acceptor,
                frame,
                ..
            } => return self.hs_frame(conn, to_acceptor, frame),
            Ev::HsTimeout { conn, .. } => return self.hs_timeout(conn),
            Ev::Stranger {
                target,
                claims,
                forge,
            } => self.hs_stranger(target, claims, forge),
            Ev::Stall { rank, until_us } => {
                if let Some(s) = self.stalled_until.get_mut(rank as usize) {
                    *s = (*s).max(until_us);
                }
                self.status_stalled(rank);
            }
            Ev::Status {
                asker,
                budget_ms,
                all,
            } => {
                self.on_status(asker, budget_ms, all)?;
            }
            Ev::Broadcast { origin } => {
                if !self.living(origin) || self.leaving(origin) {
                    return Ok(());
                }
                if self.is_rejoining(origin) || !self.settled(origin) {
                    // Its application waits until it is wired (as `tbon daemon` does).
                    self.push(self.now_us + 200_000, Ev::Broadcast { origin });
                    return Ok(());
                }
                let seq = {
                    let s = self.pair_seq.entry((origin, u32::MAX)).or_insert(0);
                    *s += 1;
                    *s
                };
                let pad = match &self.sweep {
                    Some(s) => s.bcast_pad,
                    None => self.rng.range(0, 64) as usize,
                };
                let payload = check::payload(origin, u32::MAX, seq, pad);
                let token = self.next_token;
                self.next_token += 1;
                if let Some(n) = self.nodes.get_mut(origin as usize)
                    && n.broadcast(now, payload, token).is_ok()
                {
                    self.check.originated(origin, token);
                }
                self.after(origin)?;
            }
            Ev::Fetch { id } => self.on_fetch(id)?,
            Ev::GroupCall { group, seq, rank } => self.on_group_call(group, seq, rank)?,
            Ev::ClientStart => self.on_client_start()?,
            Ev::ClientSend { id, .. } => self.on_client_send(id)?,
            Ev::ClientExit { client, .. } => self.on_client_exit(client)?,
            Ev::Contribute { rank, id } => {
                // An application contributes once per life, and not to a collective whose result
                // it already has.
                if !self.living(rank)
                    || self.leaving(rank)
                    || self.contributed.contains(&(rank, id))
                    || self.check.got_result.contains(&(rank, id))
                    || self.check.lost_result.contains(&(rank, id))
                {
                    return Ok(());
                }
                if !self.settled(rank) {
                    // A restarted daemon's application waits until it is wired.
                    self.push(self.now_us + 200_000, Ev::Contribute { rank, id });
                    return Ok(());
                }
                self.contributed.insert((rank, id));
                if let Some(n) = self.nodes.get_mut(rank as usize)
                    && let Err(e) = n.contribute(now, id, check::contribution(rank, id))
                {
                    return Err(Violation {
                        checker: "allgather",
                        detail: format!("rank {rank} could not contribute to {id}: {e}"),
                    });
                }
                self.after(rank)?;
            }
            Ev::Send {
                origin,
                dst,
                reliable,
            } => {
                // A leaving daemon's application sends nothing more (its daemon refuses).
                if !self.living(origin) || self.leaving(origin) {
                    return Ok(());
                }
                if !self.settled(origin) {
                    // A restarted daemon's application waits until it is wired (as
                    // `tbon daemon` does): what it accepted earlier would be sent to whichever
                    // life its destination has by then, which the checkers cannot tell.
                    self.push_send(self.now_us + 200_000, origin, dst, reliable);
                    return Ok(());
                }
                // Flow control at the origin, as the driver's gate applies it: a send whose
                // next hop is congested is offered again later.
                if self.wires.is_some()
                    && self
                        .nodes
                        .get(origin as usize)
                        .is_some_and(|n| !n.node.may_originate_to(dst))
                {
                    self.stats.sends_busy += 1;
                    let at = self.now_us + self.rng.range(5_000, 50_000);
                    self.push_send(at, origin, dst, reliable);
                    return Ok(());
                }
                if self.scen.batch_plain > 1 {
                    if reliable {
                        self.send_reliable_run(now, origin, dst);
                    } else {
                        self.send_plain_run(now, origin, dst);
                    }
                    self.after(origin)?;
                    return Ok(());
                }
                let seq = {
                    let s = self.pair_seq.entry((origin, dst)).or_insert(0);
                    *s += 1;
                    *s
                };
                let pad = self.rng.range(0, self.scen.pad_max) as usize;
                let payload = check::payload(origin, dst, seq, pad);
                let Some(n) = self.nodes.get_mut(origin as usize) else {
                    return Ok(());
                };
                if reliable {
                    let token = self.next_token;
                    self.next_token += 1;
                    match n.send_reliable(now, dst, TAG_RELIABLE, payload, token) {
                        Ok(()) => self.check.sent_reliable(token, origin, dst, seq),
                        Err(e) => log::debug!(
                            "{} us: reliable {origin}->{dst} #{seq} refused: {e}",
                            self.now_us
                        ),
                    }
                } else {
                    self.check.plain_sent += 1;
                    n.send_plain(now, dst, TAG_PLAIN, payload);
                }
                self.after(origin)?;
            }
        }
        Ok(())
    }

    /// The `batch` kind: `batch_plain` consecutive plain messages from `origin` to `dst`,
    /// packed as `Handle::send_batch` packs them (`batch_frame::pack_all`), handed to the node
    /// as the driver hands them: batch frames as `Command::SendPacked`, single messages (those
    /// too large to pack) as plain sends.
    fn send_plain_run(&mut self, now: Instant, origin: Rank, dst: Rank) {
        let mut payloads = Vec::new();
        for _ in 0..self.scen.batch_plain {
            let seq = {
                let s = self.pair_seq.entry((origin, dst)).or_insert(0);
                *s += 1;
                *s
            };
            let pad = self.rng.range(0, self.scen.pad_max) as usize;
            payloads.push(check::payload(origin, dst, seq, pad));
        }
        let mut units = Vec::new();
        crate::rml::batch_frame::pack_all(
            None,
            crate::limits::BATCH_FRAME_BYTES_MAX as u64,
            &payloads,
            |p| (dst, TAG_PLAIN, p, dst != origin),
            |u| units.push(u),
        );
        let Some(n) = self.nodes.get_mut(origin as usize) else {
            return;
        };
        for u in units {
            self.stats.batch_frames += u64::from(u.messages > 1);
            self.check.plain_sent += u64::from(u.messages);
            if u.tag == crate::rml::batch_frame::TAG_BATCH {
                n.send_packed(now, u.dst, u.payload, u.messages);
            } else {
                n.send_plain(now, u.dst, u.tag, u.payload);
            }
        }
    }

    /// The `batch` kind's reliable sends: `batch_plain` consecutive reliable messages from
    /// `origin` to `dst` handed to the node in one turn, which RELM packs into batch frames
    /// (`relm::batch`); every one is checked as the message it is.
    fn send_reliable_run(&mut self, now: Instant, origin: Rank, dst: Rank) {
        let mut sends = Vec::new();
        let mut seqs = Vec::new();
        for _ in 0..self.scen.batch_plain {
            let seq = {
                let s = self.pair_seq.entry((origin, dst)).or_insert(0);
                *s += 1;
                *s
            };
            let pad = self.rng.range(0, self.scen.pad_max) as usize;
            let token = self.next_token;
            self.next_token += 1;
            sends.push((check::payload(origin, dst, seq, pad), token));
            seqs.push((token, seq));
        }
        let Some(n) = self.nodes.get_mut(origin as usize) else {
            return;
        };
        let outcomes = n.send_reliable_run(now, dst, TAG_RELIABLE, sends);
        for ((token, seq), r) in seqs.into_iter().zip(outcomes) {
            match r {
                Ok(()) => self.check.sent_reliable(token, origin, dst, seq),
                Err(e) => log::debug!(
                    "{} us: reliable {origin}->{dst} #{seq} refused: {e}",
                    self.now_us
                ),
            }
        }
    }

    /// The checks of a run with the capacity model (no faults): nothing was
    /// dropped at a full queue, nobody was declared dead, every accepted plain message
    /// arrived (delivery never stopped).
    fn check_overload(&self, dropped: u64) -> Result<(), Violation> {
        let fail = |detail: String| {
            Err(Violation {
                checker: "overload",
                detail,
            })
        };
        if dropped > 0 {
            return fail(format!("{dropped} frames dropped at a full send queue"));
        }
        if !self.declared.is_empty() {
            return fail(format!(
                "living daemons declared dead under load: {:?}",
                self.declared
            ));
        }
        if self.check.plain_posted != self.check.plain_sent {
            return fail(format!(
                "{} of {} plain messages delivered",
                self.check.plain_posted, self.check.plain_sent
            ));
        }
        Ok(())
    }

    fn detect_later(&mut self, node: Rank, dead: Rank) {
        let lat = self.scen.latency_us;
        let at = self.now_us + self.rng.range(lat, self.scen.detect_us_max.max(lat));
        let life = self.restarts.life(dead);
        let by = self
            .nodes
            .get(node as usize)
            .map_or(0, |n| n.node.incarnation());
        self.push(
            at,
            Ev::Detect {
                node,
                dead,
                life,
                by,
            },
        );
    }

    /// After a daemon handled an input: check what it posted and completed, put its frames on
    /// the links, fail its dials to dead neighbours, close its connections to the ranks it
    /// declared dead, handle its stop, re-arm its timer.
    fn after(&mut self, r: Rank) -> Result<(), Violation> {
        // What it held back may be readable now (its input may have been the drain marker).
        if self.held.keys().any(|(_, to)| *to == r) && self.living(r) {
            self.read_held(r)?;
        }
        self.note_welcome(r);
        let Some(n) = self.nodes.get_mut(r as usize) else {
            return Ok(());
        };
        let delivered = std::mem::take(&mut n.delivered);
        let completions = std::mem::take(&mut n.completions);
        let out = std::mem::take(&mut n.out);
        let heartbeats = std::mem::take(&mut n.heartbeats);
        let gained = std::mem::take(&mut n.new_neighbours);
        let bcasts = std::mem::take(&mut n.bcasts);
        let bcast_done = std::mem::take(&mut n.bcast_done);
        let gathered = std::mem::take(&mut n.gathered);
        let gather_lost = std::mem::take(&mut n.gather_lost);
        let group_done = std::mem::take(&mut n.group_done);
        let got = std::mem::take(&mut n.got);
        let client_events = std::mem::take(&mut n.client_events);
        let group_stopping = n.node.stopping().is_some();
        let declared = std::mem::take(&mut n.declared);
        let stopped = n.stopped.take();
        let stream_events = std::mem::take(&mut n.stream_events);
        let statuses = std::mem::take(&mut n.statuses);
        let moved = std::mem::take(&mut n.epoch_moved);
        let wired_now = std::mem::take(&mut n.wired_now);
        let timeout = n.node.poll_timeout();
        if let Some(e) = n.errors.first() {
            return Err(Violation {
                checker: "protocol",
                detail: format!("rank {r}: {e}"),
            });
        }
        for d in declared {
            self.declared.insert(d);
            if self.living(d) {
                // The connection to a rank declared dead is closed; it notices (once it runs).
                self.bump_generation(r, d);
                let at = self.now_us + self.scen.latency_us;
                self.push(at, Ev::LinkLost { node: d, peer: r });
            }
        }
        let mut gone = self.gone();
        // A send to a restarted rank's old life ended `NodeDown` whenever it completes.
        gone.extend(self.restarts.lives.keys().copied());
        if stopped.is_some() {
            // What it sent and was still unacknowledged fails with `ShutDown`.
            gone.push(r);
        }
        for m in &delivered {
            self.check.delivered(r, m)?;
        }
        for (token, result) in &completions {
            self.check.completed(*token, result, &gone)?;
        }
        for b in &bcasts {
            self.check.bcast_delivered(r, b)?;
        }
        if let Some(s) = self.sweep.as_mut() {
            s.marks
                .saw(self.now_us, !bcasts.is_empty(), !gathered.is_empty(), moved);
            if wired_now {
                s.marks.wired(self.now_us);
            }
        }
        // A daemon declared dead but still running is not waited for.
        // Built only when needed: an O(N) pass on every event dominated runs at 10k daemons.
        let counted: Vec<bool> = if bcast_done.is_empty() {
            Vec::new()
        } else {
            (0..self.alive.len())
                .map(|x| {
                    let x = x as Rank;
                    self.living(x) && !self.declared.contains(&x) && !self.is_rejoining(x)
                })
                .collect()
        };
        for (request, op) in bcast_done {
            self.check.bcast_finished(r, request, op, &counted)?;
        }
        for g in &gathered {
            self.check.gathered(r, g, self.nodes.len() as u32)?;
        }
        for id in gather_lost {
            self.check.gather_lost(r, id)?;
        }
        // Fences that ended make gets, whose outputs are taken once this input's are out.
        let groups_acted =
            !group_done.is_empty() && self.group_outcomes(r, group_done, group_stopping)?;
        if !got.is_empty() {
            self.get_answers(r, got)?;
        }
        if !client_events.is_empty() {
            self.client_events(r, client_events)?;
        }
        if !statuses.is_empty() {
            self.status_reports(r, statuses)?;
        }
        let mut sent_to: Vec<Rank> = Vec::new();
        for o in out {
            match o {
                Out::Frame(to, frame) => {
                    if !sent_to.contains(&to) {
                        sent_to.push(to);
                    }
                    self.transmit(r, to, frame, false)
                }
                Out::Fallback(peer) => self.fall_back(r, peer),
            }
        }
        self.chase_closing(r);
        if self.wires.is_none() && self.living(r) && !sent_to.is_empty() {
            // Without a capacity model the queues empty at once: say so, as the driver does
            // after each flush (stream data waits for that report, `node::streams`), and take
            // what it released.
            let now = self.now();
            if let Some(n) = self.nodes.get_mut(r as usize) {
                for to in sent_to {
                    n.handle_queue_empty(now, to);
                }
                if !n.out.is_empty() {
                    self.after(r)?;
                }
            }
        }
        if !stream_events.is_empty() && self.living(r) && self.stream_events(r, stream_events)? {
            // The applications' commands made outputs.
            self.after(r)?;
        }
        if groups_acted && self.living(r) {
            self.after(r)?;
        }
        for (to, frame) in heartbeats {
            // Only over a connection that is up.
            if !self.conn_lost.contains(&Self::pair(r, to)) {
                self.transmit(r, to, frame, true);
            }
        }
        for g in gained {
            if !self.living(g) {
                self.detect_later(r, g);
            }
        }
        if let Some(reason) = stopped {
            return self.stopped(r, reason);
        }
        if let Some(t) = timeout {
            let us = t.saturating_duration_since(self.base).as_micros() as u64;
            let us = us.max(self.now_us);
            let armed = self.timer_at.get(r as usize).copied().flatten();
            if armed.is_none_or(|a| a > us) {
                if let Some(slot) = self.timer_at.get_mut(r as usize) {
                    *slot = Some(us);
                }
                self.push(us, Ev::Timer { node: r });
            }
        }
        Ok(())
    }

    /// A direct link that starts closing gets messages both ways while it closes (they wait
    /// and must still arrive in order): a few sends each way, within about a link's latency.
    /// Without this, traffic is too sparse to land in the short close window.
    fn chase_closing(&mut self, r: Rank) {
        let Some(n) = self.nodes.get(r as usize) else {
            return;
        };
        let closing = n.node.direct().closing_peers();
        if closing.is_empty() && !self.closing_seen.iter().any(|(a, _)| *a == r) {
            return;
        }
        self.closing_seen
            .retain(|(a, p)| *a != r || closing.contains(p));
        let step = (self.scen.latency_us / 4).max(1);
        for p in closing {
            if !self.closing_seen.insert((r, p)) || !self.living(p) {
                continue;
            }
            for i in 0..3u64 {
                let at = self.now_us + i * step;
                self.push_send(at, r, p, i == 1);
                self.push_send(at, p, r, false);
            }
        }
    }

    /// Daemon `r` stopped. It must have been declared dead (it fences itself), or have lost
    /// rank 0 in a run where a living rank 0 can look lost (heartbeats: a stall, a partition).
    fn stopped(&mut self, r: Rank, reason: StopReason) -> Result<(), Violation> {
        if self.rejoin_stopped(r, &reason) {
            return Ok(());
        }
        let ok = match &reason {
            StopReason::DeclaredDead(_) => self.declared.contains(&r),
            // Without heartbeats a daemon loses rank 0 only when its redials run out (link
            // drops that outlast them): rank 0 then declared it dead in the same way.
            StopReason::RootLost(_) => self.scen.heartbeats || self.declared.contains(&r),
            // Told by rank 0 once every living daemon had its departure.
            StopReason::Left => self.nodes.first().is_some_and(|z| z.routing().is_failed(r)),
            _ => false,
        };
        if !ok {
            return Err(Violation {
                checker: "fencing",
                detail: format!("rank {r} stopped ({reason:?}) though nobody declared it dead"),
            });
        }
        log::debug!("{} us: rank {r} stops: {reason:?}", self.now_us);
        self.fenced.push(r);
        self.dies(r);
        Ok(())
    }

    /// `rank` is gone (crashed, or stopped): its connections drop and its tree neighbours see
    /// that and fail to redial.
    fn dies(&mut self, rank: Rank) {
        if let Some(a) = self.alive.get_mut(rank as usize) {
            *a = false;
        }
        // A rejoin dies with its daemon: only a restart planned later is work left (seed 90 of
        // `all,rejoin,grow`: crashed while being admitted, never started again).
        self.restarts.rejoining.remove(&rank);
        // What it held unread, or what others held from it, is gone with its connections.
        self.held.retain(|(f, t), _| *f != rank && *t != rank);
        let watchers: Vec<Rank> = self
            .nodes
            .iter()
            .filter(|n| self.living(n.rank))
            .filter(|n| {
                n.routing().parent() == Some(rank) || n.routing().children().contains(&rank)
            })
            .map(|n| n.rank)
            .collect();
        log::debug!(
            "{} us: rank {rank} is gone; watchers {watchers:?}",
            self.now_us
        );
        for w in watchers {
            self.detect_later(w, rank);
        }
        let size = self.nodes.len() as Rank;
        for p in 0..size {
            self.parked.remove(&(rank, p));
            self.parked.remove(&(p, rank));
        }
        // Its own redials end with it: the events that would have closed them are a dead
        // daemon's and are never handled (a dial made before a stall, the daemon stopped at
        // its wake-up: seed 1211495). Others' redials towards it go on and fail as they should.
        self.redialing.retain(|(dialler, _)| *dialler != rank);
    }
}

/// A frame for the trace log: its header and what its payload starts with.
pub(super) fn describe(frame: &Frame) -> String {
    use crate::oob::header::Kind;
    let Ok(h) = frame.decode() else {
        return format!("undecodable {frame:?}");
    };
    let body = frame.payload();
    let detail = match h.kind {
        Kind::Grpcomm => crate::grpcomm::XcastMsg::decode(u32::MAX, body.clone())
            .map(|m| format!("{m:?}"))
            .unwrap_or_else(|_| format!("allgather kind {:?}", body.first())),
        Kind::Relm => crate::relm::Control::decode(u32::MAX, body)
            .map(|c| format!("{c:?}"))
            .unwrap_or_else(|_| format!("{} bytes", body.len())),
        _ => format!("{} bytes", body.len()),
    };
    let detail: String = detail.chars().take(160).collect();
    format!(
        "{:?} origin {} dst {} tag {} inc {}: {detail}",
        h.kind, h.origin, h.dst, h.tag, h.epoch
    )
}

/// Events that are work still to do (timers and heartbeats go on for ever).
fn is_work(ev: &Ev) -> bool {
    match ev {
        Ev::Timer { .. } | Ev::Recheck { .. } => false,
        Ev::Frame { heartbeat, .. } => !heartbeat,
        Ev::LinkAck { .. } => false,
        Ev::Hs { node, .. } | Ev::HsTimeout { node, .. } => node.is_some(),
        _ => true,
    }
}

fn target(ev: &Ev) -> Option<Rank> {
    match ev {
        Ev::Frame { to, .. } => Some(*to),
        Ev::LinkAck { from, .. } => Some(*from),
        Ev::Timer { node } | Ev::Detect { node, .. } => Some(*node),
        Ev::LinkLost { node, .. } | Ev::Redial { node, .. } => Some(*node),
        Ev::Send { origin, .. } | Ev::Broadcast { origin } => Some(*origin),
        Ev::Contribute { rank, .. } | Ev::GroupCall { rank, .. } => Some(*rank),
        Ev::Fetch { .. } | Ev::ClientStart => None,
        Ev::ClientSend { rank, .. } | Ev::ClientExit { rank, .. } => Some(*rank),
        Ev::Hs { node, .. } | Ev::HsTimeout { node, .. } => *node,
        Ev::Stranger { .. } => None,
        Ev::WireDone { from, .. } | Ev::BulkWireDone { from, .. } => Some(*from),
        Ev::BulkFrame { to, .. } => Some(*to),
        Ev::Recheck { node } => Some(*node),
        Ev::Status { asker, .. } => Some(*asker),
        Ev::Leave { rank } => Some(*rank),
        Ev::Crash { .. }
        | Ev::Restart { .. }
        | Ev::Stall { .. }
        | Ev::LinkDown { .. }
        | Ev::Partition { .. } => None,
    }
}
