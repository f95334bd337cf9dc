//! One simulated daemon: the real [`node::Node`](crate::node::Node), the very code a daemon's
//! event loop runs, fed by the world with encoded frames (a 40-byte header and the payload, as
//! on a socket, kept apart: `frame.rs`) and with the clock of the simulation; what it outputs
//! is collected here for the world (frames to put on links) and the checkers (deliveries,
//! completions, broadcasts, allgather results).

use super::frame::{Frame, Sharing};
use crate::Rank;
use crate::error::SendError;
use crate::grpcomm::{AllgatherResult, Xcast};
use crate::node::{Command, NoQueues, Node, NodeConfig, Output, Trace};
use crate::relm::{Relm, RelmConfig};
use crate::rml::{Message, Peer, TAG_USER_MIN, Tag};
use crate::routed::RoutingState;
use bytes::Bytes;
use std::collections::HashSet;
use std::time::Instant;

/// The user tag of the workload's reliable messages.
pub const TAG_RELIABLE: Tag = TAG_USER_MIN;
/// The user tag of the workload's plain messages.
pub const TAG_PLAIN: Tag = TAG_USER_MIN + 1;
/// The user tag of the workload's broadcasts.
pub const TAG_BCAST: Tag = TAG_USER_MIN + 2;
/// The uid of the simulated clients (`world/clients.rs`), and the tag of their messages.
pub const SIM_CLIENT_UID: u32 = 4242;
pub const SIM_CLIENT_TAG: Tag = TAG_USER_MIN + 3;

/// The service every simulated daemon offers (the `stream` kind's data).
pub const SERVICE: &str = "data";

/// A broadcast delivered here: (first op, last op, originator, tag, payload); the two ops
/// differ for a payload split into parts.
pub type BcastDelivery = (u64, u64, Rank, Tag, Bytes);

/// What a daemon asks of its connections, in order.
#[derive(Debug)]
pub enum Out {
    /// A frame (header and payload) for a neighbour or a direct link's peer.
    Frame(Rank, Frame),
    /// Its messages to this peer took a direct link and now take the tree: frames still
    /// waiting for that connection go over the tree ([`crate::node::Output::Fallback`]).
    Fallback(Rank),
}

/// One simulated daemon.
pub struct SimNode {
    /// Its rank.
    pub rank: Rank,
    /// The daemon's protocol state.
    pub node: Node,
    /// Encoded frames to put on links, and fallbacks, in the order the node made them.
    pub out: Vec<Out>,
    /// Encoded heartbeats, sent only over a connection that is up.
    pub heartbeats: Vec<(Rank, Frame)>,
    /// User messages posted to the application, in order.
    pub delivered: Vec<Message>,
    /// Completions of the workload's reliable sends.
    pub completions: Vec<(u64, Result<(), SendError>)>,
    /// Neighbours gained in a repair (the world fails a dial to a dead one).
    pub new_neighbours: Vec<Rank>,
    /// Every broadcast delivered here (user and runtime), in delivery order.
    pub bcasts: Vec<BcastDelivery>,
    /// This daemon's broadcasts that finished: (token, Some(op)) or (token, None) if refused.
    pub bcast_done: Vec<(u64, Option<u64>)>,
    /// Allgather results delivered here.
    pub gathered: Vec<AllgatherResult>,
    /// Allgathers that ended `ResultLost` here (a returned daemon's, finished before it).
    pub gather_lost: Vec<u64>,
    /// Group collectives ended here: (token, outcome).
    pub group_done: Vec<(u64, Result<AllgatherResult, SendError>)>,
    /// Data-exchange gets answered here: (token, answer).
    pub got: Vec<(u64, Result<Bytes, crate::modex::GetError>)>,
    /// Events for this daemon's simulated clients (`world/clients.rs`), in order.
    pub client_events: Vec<crate::clients::ClientEvent>,
    /// Broken rules (a malformed frame, an invariant): always a bug.
    pub errors: Vec<String>,
    /// Reliable batch frames this daemon sent (`relm::batch`), as origin or hop.
    pub relm_batches: u64,
    /// Ranks this daemon declared failed (the world closes its connections to them).
    pub declared: Vec<Rank>,
    /// Why it stopped, once it did (the world checks that it had to).
    pub stopped: Option<crate::node::StopReason>,
    /// Stream events for the world's stream applications, in order.
    pub stream_events: Vec<crate::node::StreamEvent>,
    /// Its wall clock: (the run's start, the wall clock then (ns), drift in ppb); read
    /// before every input, as the driver reads the real one.
    pub clock: Option<(Instant, i64, i64)>,
    /// Status reports gathered here, by token (the world takes them after each input).
    pub statuses: Vec<(u64, crate::status::Report)>,
    /// The DVM epoch it had applied after its last input (epochs never go back).
    epoch: u64,
    /// Its epoch moved on since the world last looked (a repair reached it).
    pub epoch_moved: bool,
    /// It became wired since the world last looked (a world that models wire-up).
    pub wired_now: bool,
    /// Tokens of this daemon's broadcasts (their completions are checked as broadcasts).
    bcast_tokens: HashSet<u64>,
    /// Recent large payloads, which what it relays may share.
    sharing: Sharing,
}

impl SimNode {
    /// Daemon `rank` of `size` with radix `radix`, started at `now`, with its flow-control
    /// thresholds and direct-link settings: wired from the start (`wireup` `None`), or with an
    /// address of about `wireup` bytes and rank 0's, to run the real wire-up (reports and
    /// contact slices; nothing is dialled: the world carries frames by rank).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        rank: Rank,
        size: u32,
        radix: u32,
        relm: RelmConfig,
        heartbeat: Option<(std::time::Duration, std::time::Duration)>,
        (flow, direct): (crate::node::flow::FlowLimits, crate::direct::DirectConfig),
        now: Instant,
        wireup: Option<usize>,
        (initial, bcast_part_bytes): (u32, usize),
    ) -> Result<SimNode, String> {
        Self::build(
            rank,
            size,
            radix,
            relm,
            heartbeat,
            (flow, direct),
            now,
            wireup,
            (None, initial, bcast_part_bytes),
        )
    }

    /// Daemon `rank` started again under incarnation `incarnation` (above 1) after its death:
    /// it asks rank 0 to rejoin (issue "Rejoin"), as `tbon daemon --rejoin` does.
    #[allow(clippy::too_many_arguments)]
    pub fn restarted(
        rank: Rank,
        size: u32,
        radix: u32,
        relm: RelmConfig,
        heartbeat: Option<(std::time::Duration, std::time::Duration)>,
        (flow, direct): (crate::node::flow::FlowLimits, crate::direct::DirectConfig),
        now: Instant,
        incarnation: u64,
    ) -> Result<SimNode, String> {
        Self::build(
            rank,
            size,
            radix,
            relm,
            heartbeat,
            (flow, direct),
            now,
            None,
            // Only rank 0 splits broadcasts, and it never restarts.
            (
                Some(incarnation),
                size,
                crate::limits::XCAST_PART_BYTES_DEFAULT,
            ),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        rank: Rank,
        size: u32,
        radix: u32,
        relm: RelmConfig,
        heartbeat: Option<(std::time::Duration, std::time::Duration)>,
        (flow, direct): (crate::node::flow::FlowLimits, crate::direct::DirectConfig),
        now: Instant,
        wireup: Option<usize>,
        (rejoin, initial, bcast_part_bytes): (Option<u64>, u32, usize),
    ) -> Result<SimNode, String> {
        let (uri, hnp) = match (wireup, rejoin) {
            (None, None) => (None, None),
            // A rejoining daemon's contact goes into the restore (nothing dials it here).
            (None, Some(_)) => (Some(sim_uri(rank, 32)), Some(sim_uri(0, 32))),
            (Some(bytes), _) => (Some(sim_uri(rank, bytes)), Some(sim_uri(0, bytes))),
        };
        let cfg = NodeConfig {
            relm,
            direct,
            // Without heartbeats the world's `Detect` events (a lost connection that cannot be
            // re-established) are the only detection.
            heartbeat,
            wired_at_start: wireup.is_none() && rejoin.is_none(),
            rejoin: rejoin.is_some(),
            incarnation: rejoin.unwrap_or(1),
            uri,
            hnp,
            // Longer than any simulated wire-up (every daemon reports), and its deadlines
            // (twice this for ranks but 0) within the world's liveness limit, which would
            // otherwise count the stale timer events as work left.
            wireup_timeout: std::time::Duration::from_secs(120),
            trace: true,
            // Every daemon's first incarnation is 1, as its handshakes would have proved.
            incarnation_floor: 1,
            client_uids: vec![SIM_CLIENT_UID],
            flow,
            initial_size: initial,
            bcast_part_bytes,
            ..NodeConfig::new(rank, size, radix)
        };
        let mut node = Node::new(cfg).map_err(|e| e.to_string())?;
        for tag in [TAG_RELIABLE, TAG_PLAIN, TAG_BCAST] {
            node.post(Peer::Any, tag, true).map_err(|e| e.to_string())?;
        }
        node.start(now);
        node.handle_stream(
            now,
            crate::node::StreamCommand::Serve {
                service: SERVICE.into(),
            },
        )
        .map_err(|e| e.to_string())?;
        let mut n = SimNode {
            rank,
            node,
            out: Vec::new(),
            heartbeats: Vec::new(),
            delivered: Vec::new(),
            completions: Vec::new(),
            new_neighbours: Vec::new(),
            bcasts: Vec::new(),
            bcast_done: Vec::new(),
            gathered: Vec::new(),
            gather_lost: Vec::new(),
            group_done: Vec::new(),
            got: Vec::new(),
            client_events: Vec::new(),
            errors: Vec::new(),
            relm_batches: 0,
            declared: Vec::new(),
            stopped: None,
            stream_events: Vec::new(),
            clock: None,
            statuses: Vec::new(),
            bcast_tokens: HashSet::new(),
            sharing: Sharing::default(),
            epoch: 0,
            epoch_moved: false,
            wired_now: false,
        };
        n.collect();
        Ok(n)
    }

    /// Its view of the tree.
    pub fn routing(&self) -> &RoutingState {
        self.node.routing()
    }

    /// Its reliable messaging.
    pub fn relm(&self) -> &Relm {
        self.node.relm()
    }

    /// Its broadcast core.
    pub fn xcast(&self) -> &Xcast {
        self.node.xcast()
    }

    /// The application asks its daemon to leave the DVM in order (refusals are ignored: a
    /// daemon not settled, or already leaving, simply goes on).
    pub fn leave(&mut self, now: Instant) {
        self.tick(now);
        if let Err(e) = self.node.leave(now) {
            log::debug!("rank {}: leave refused: {e}", self.rank);
        }
        self.step(now);
    }

    /// A plain send from the application.
    pub fn send_plain(&mut self, now: Instant, dst: Rank, tag: Tag, payload: Bytes) {
        let c = Command::Send {
            dst,
            tag,
            payload,
            token: None,
            route: None,
        };
        self.tick(now);
        if let Err(e) = self.node.handle_command(now, c) {
            self.errors.push(format!("plain send refused: {e}"));
        }
        self.step(now);
    }

    /// A batch frame of `messages` plain messages, packed by the application's thread as
    /// `Handle::send_batch` packs them (`Command::SendPacked`).
    pub fn send_packed(&mut self, now: Instant, dst: Rank, payload: Bytes, messages: u32) {
        let c = Command::SendPacked {
            dst,
            payload,
            messages,
        };
        self.tick(now);
        if let Err(e) = self.node.handle_command(now, c) {
            self.errors.push(format!("packed send refused: {e}"));
        }
        self.step(now);
    }

    /// A reliable send from the application.
    pub fn send_reliable(
        &mut self,
        now: Instant,
        dst: Rank,
        tag: Tag,
        payload: Bytes,
        token: u64,
    ) -> Result<(), SendError> {
        let c = Command::SendReliable {
            dst,
            tag,
            payload,
            token: Some(token),
        };
        self.tick(now);
        let r = self.node.handle_command(now, c);
        self.step(now);
        r
    }

    /// Reliable sends from the application handed to the node in one turn, as the driver
    /// drains several commands before the node's pump: RELM then packs them (`relm::batch`).
    /// Each send's outcome, in order.
    pub fn send_reliable_run(
        &mut self,
        now: Instant,
        dst: Rank,
        tag: Tag,
        sends: Vec<(Bytes, u64)>,
    ) -> Vec<Result<(), SendError>> {
        self.tick(now);
        let outcomes = sends
            .into_iter()
            .map(|(payload, token)| {
                let c = Command::SendReliable {
                    dst,
                    tag,
                    payload,
                    token: Some(token),
                };
                self.node.handle_command(now, c)
            })
            .collect();
        self.step(now);
        outcomes
    }

    /// A stream command from the world's stream applications.
    pub fn stream(&mut self, now: Instant, c: crate::node::StreamCommand) -> Result<(), SendError> {
        self.tick(now);
        let r = self.node.handle_stream(now, c);
        self.step(now);
        r
    }

    /// A broadcast from the application, finished under `token`, or why the node refused it.
    pub fn broadcast(&mut self, now: Instant, payload: Bytes, token: u64) -> Result<(), SendError> {
        let c = Command::Broadcast {
            tag: TAG_BCAST,
            payload,
            token: Some(token),
        };
        self.tick(now);
        let r = self.node.handle_command(now, c);
        if r.is_ok() {
            self.bcast_tokens.insert(token);
        }
        self.step(now);
        r
    }

    /// This daemon's contribution to allgather `id`.
    pub fn contribute(&mut self, now: Instant, id: u64, data: Bytes) -> Result<(), SendError> {
        self.tick(now);
        let r = self
            .node
            .handle_command(now, Command::Allgather { id, data });
        self.step(now);
        r
    }

    /// This daemon's contribution to group collective `op`; its outcome is reported with
    /// `token` in `group_done`.
    pub fn group_contribute(
        &mut self,
        now: Instant,
        op: crate::grpcomm::GroupOp,
        data: Bytes,
        token: u64,
    ) -> Result<(), SendError> {
        self.tick(now);
        let r = self.node.handle_command(
            now,
            Command::GroupGather {
                op,
                data,
                call: crate::node::GroupCall::Allgather,
                token,
            },
        );
        self.step(now);
        r
    }

    /// A fence of the data exchange as group collective `op`; its outcome is reported with
    /// `token` in `group_done`.
    pub fn group_fence(
        &mut self,
        now: Instant,
        op: crate::grpcomm::GroupOp,
        mode: crate::node::FenceMode,
        token: u64,
    ) -> Result<(), SendError> {
        self.tick(now);
        let r = self
            .node
            .handle_command(now, Command::Fence { op, mode, token });
        self.step(now);
        r
    }

    /// Client admission (`world/clients.rs`): opens `job` and admits one client of it.
    pub fn client_admit(
        &mut self,
        job: u64,
        key: [u8; 32],
    ) -> Result<crate::clients::ClientName, String> {
        self.node.client_open_job(job, key, Vec::new());
        self.node.handle_client_hello(
            crate::clients::local::CLIENT_PROTOCOL_VERSION,
            job,
            &key,
            SIM_CLIENT_UID,
        )
    }

    /// Local client `local` sends; its events come in `client_events`.
    pub fn client_send(
        &mut self,
        now: Instant,
        local: u32,
        token: u64,
        to: crate::clients::ClientName,
        payload: Bytes,
    ) -> Result<(), String> {
        self.tick(now);
        let r = self
            .node
            .handle_client_send(local, token, to, SIM_CLIENT_TAG, payload);
        self.step(now);
        r
    }

    /// Local client `local`'s connection closed.
    pub fn client_gone(&mut self, now: Instant, local: u32) {
        self.tick(now);
        self.node.handle_client_gone(local);
        self.step(now);
    }

    /// A data-exchange get; its answer is reported with `token` in `got`.
    pub fn modex_get(
        &mut self,
        now: Instant,
        token: u64,
        group: &crate::grpcomm::GroupId,
        rank: Rank,
        key: &str,
    ) {
        self.tick(now);
        self.node.modex_get(token, group, rank, key);
        self.step(now);
    }

    /// An encoded frame arrived from neighbour `from`.
    pub fn handle_frame(&mut self, now: Instant, from: Rank, frame: Frame) {
        self.tick(now);
        self.node.handle_heard(now, from);
        match frame.decode() {
            Ok(header) => {
                self.sharing.received(frame.payload());
                let payload = frame.payload().clone();
                if let Err(e) = self.node.handle_frame(now, from, header, payload) {
                    self.errors.push(format!("frame from {from}: {e}"));
                }
            }
            Err(e) => self.errors.push(format!("frame from {from}: {e}")),
        }
        self.step(now);
    }

    /// Its queue towards `to` is empty again (the world without a capacity model keeps no
    /// queues: frames are on the link once sent), as the driver reports after a flush.
    pub fn handle_queue_empty(&mut self, now: Instant, to: Rank) {
        self.tick(now);
        self.node.handle_send_queue(now, to, 0, 0);
        self.step(now);
    }

    /// Time passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.tick(now);
        self.node.handle_timeout(now, &NoQueues);
        self.step(now);
    }

    /// The world's connection to `dead` broke and could not be re-established.
    pub fn detect(&mut self, now: Instant, dead: Rank) {
        self.tick(now);
        self.node.handle_unreachable(now, dead, 1);
        self.step(now);
    }

    /// The connection with `peer` was lost; whether this daemon redials it.
    pub fn link_lost(&mut self, now: Instant, peer: Rank) -> bool {
        self.tick(now);
        let probe = self.node.handle_link_lost(now, peer);
        self.step(now);
        probe
    }

    /// Its wall clock at `now` (ns since the Unix epoch), if it has one.
    pub fn wall(&self, now: Instant) -> Option<i64> {
        let (base, wall0, drift) = self.clock?;
        let t = i128::try_from(now.saturating_duration_since(base).as_nanos()).unwrap_or(0);
        i64::try_from(i128::from(wall0) + t + t * i128::from(drift) / 1_000_000_000).ok()
    }

    /// Tells the node its wall clock before an input.
    fn tick(&mut self, now: Instant) {
        if let Some(w) = self.wall(now) {
            self.node.handle_wall_clock(now, w);
        }
    }

    /// The world asks this daemon for the status of its subtree.
    pub fn status(
        &mut self,
        now: Instant,
        token: u64,
        budget_ms: u32,
        all: bool,
    ) -> Result<(), crate::node::StatusRefused> {
        self.tick(now);
        let r = self.node.handle_status(now, token, budget_ms, all);
        self.step(now);
        r
    }

    /// A connection with `peer` was (re-)established.
    pub fn link_up(&mut self, now: Instant, peer: Rank) {
        self.tick(now);
        self.node.handle_link_up(now, peer, 1, true);
        self.step(now);
    }

    /// The end of one input: the node's pump, its outputs collected, its invariants checked.
    fn step(&mut self, now: Instant) {
        self.node.pump(now);
        self.collect();
        if let Err(e) = self.node.check_invariants() {
            self.errors.push(format!("invariant: {e}"));
        }
        let epoch = self.node.epoch();
        if epoch < self.epoch {
            self.errors.push(format!(
                "invariant: epoch went back from {} to {epoch}",
                self.epoch
            ));
        }
        self.epoch_moved |= epoch > self.epoch;
        self.epoch = epoch;
    }

    fn collect(&mut self) {
        while let Some(o) = self.node.poll_output() {
            match o {
                Output::Client(e) => self.client_events.push(e),
                Output::Transmit {
                    to,
                    header,
                    payload,
                    token,
                } => {
                    self.relm_batches += u64::from(
                        header.kind == crate::oob::header::Kind::RelmData
                            && header.tag == crate::relm::batch::TAG_BATCH,
                    );
                    let payload = self.sharing.payload(&payload);
                    self.out.push(Out::Frame(to, Frame::new(&header, payload)));
                    if token.is_some() {
                        self.errors
                            .push("a workload frame with a completion".into());
                    }
                }
                Output::Heartbeat { to, header } => {
                    self.heartbeats
                        .push((to, Frame::new(&header, Bytes::new())));
                }
                // The world keeps no send queues (frames in flight are on the links); it
                // closes the connections to the dead.
                Output::PeersFailed { dead, .. } => self.declared.extend(dead),
                Output::Fallback { peer } => self.out.push(Out::Fallback(peer)),
                // The simulated daemons start wired, with no addresses: nothing is dialled.
                Output::Wired => self.wired_now = true,
                // Nothing is dialled in the simulator: frames go by rank.
                Output::ContactKnown(_) | Output::ContactUnknown(_) => {}
                Output::Stream(e) => self.stream_events.push(*e),
                Output::Deliver { msg, .. } => {
                    // Broadcasts are checked from their trace, which carries the op.
                    if msg.tag != TAG_BCAST {
                        self.delivered.push(msg);
                    }
                }
                Output::DeliverRun { run, .. } => {
                    if run.tag() != TAG_BCAST {
                        self.delivered.extend(run.messages());
                    }
                }
                Output::SendDone { token, result } => {
                    if !self.bcast_tokens.remove(&token) {
                        self.completions.push((token, result));
                    }
                }
                Output::AllgatherDone { id, result } => match result {
                    Ok(r) => self.gathered.push(r),
                    Err(SendError::ShutDown) if self.node.stopping().is_some() => {}
                    Err(SendError::ResultLost) => self.gather_lost.push(id),
                    Err(e) => self.errors.push(format!("allgather {id} failed: {e}")),
                },
                Output::GroupDone { token, result } => self.group_done.push((token, result)),
                Output::GetDone { token, result } => self.got.push((token, result)),
                Output::Repaired(status) => {
                    self.new_neighbours.extend(
                        status
                            .new_children
                            .iter()
                            .filter(|c| !status.previous_children.contains(c)),
                    );
                    if status.new_parent != status.previous_parent {
                        self.new_neighbours.extend(status.new_parent);
                    }
                }
                Output::Stop(reason) => self.stopped = Some(reason),
                Output::Status { token, report } => self.statuses.push((token, *report)),
                Output::Trace(Trace::Broadcast {
                    first,
                    op,
                    originator,
                    tag,
                    payload,
                }) => self.bcasts.push((first, op, originator, tag, payload)),
                Output::Trace(Trace::BroadcastFinished { token, op }) => {
                    self.bcast_done.push((token, op))
                }
            }
        }
    }
}

impl SimNode {
    /// Frames that waited for the connection with `peer` after this daemon's messages to it
    /// fell back to the tree: where each goes now (as the driver's `fall_back` does), or
    /// nowhere (RELM's frames, which RELM resent itself).
    pub fn reroute(&mut self, frames: Vec<Frame>) -> Vec<(Rank, Frame)> {
        let mut out = Vec::new();
        for f in frames {
            let Ok(h) = f.decode() else {
                continue;
            };
            if let crate::node::Reroute::Hop(hop, h) = self.node.reroute(h, &[]) {
                out.push((hop, f.with_header(&h)));
            }
        }
        out
    }
}

/// A simulated daemon's contact (never dialled): loopback, one port per rank, as on one
/// machine, its DVM id padded so that its text takes about `bytes` bytes.
fn sim_uri(rank: Rank, bytes: usize) -> crate::oob::uri::ContactUri {
    // `<id>.<rank>;tcp://127.0.0.1:<port>`: about 25 bytes beside the id.
    let port = 1024 + (rank % 60_000) as u16;
    crate::oob::uri::ContactUri {
        dvm_id: "s".repeat(bytes.saturating_sub(25).max(1)),
        rank,
        addrs: vec![std::net::SocketAddr::from(([127, 0, 0, 1], port))],
    }
}
