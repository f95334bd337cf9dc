//! One simulated daemon: the real protocol cores (the routing state, the receive matcher,
//! RELM, the fault-notice codecs) driven the way the event loop drives them, with frames,
//! clock and connections supplied by the world instead of sockets.
//!
//! The fault flow follows `driver/event_loop/faults.rs`: a detected death is repaired at once
//! (local scope) and reported to rank 0 (reliably, over RELM); a new child gets an adoption
//! notice (every failure its parent knows) ahead of every collective `Sync`, and reports the
//! deaths it learns from it; rank 0 confirms with a new epoch as a broadcast operation, and
//! every daemon repairs again (global scope) when it delivers it. Handlers run in the driver's order: messaging, grpcomm, RELM.
//!
//! Broadcasts and allgathers run the real `grpcomm` cores: tree messages go over the links,
//! requests and completions between an originator and rank 0 over RELM, and rank 0's fault
//! confirmations and allgather results ride the broadcast, as in the driver.

use crate::Rank;
use crate::error::SendError;
use crate::faults::notice::{
    self, Adoption, Confirmation, TAG_ADOPTED, TAG_FAULT_CONFIRM, TAG_FAULT_REPORT,
};
use crate::grpcomm::{
    Allgather, AllgatherEvent, AllgatherMsg, AllgatherResult, TAG_ALLGATHER_RESULT, TAG_XCAST_DONE,
    TAG_XCAST_REQUEST, Xcast, XcastEvent, XcastMsg,
};
use crate::relm::{self, Event as RelmEvent, Relm, RelmConfig, Transmit};
use crate::rml::{Dispatch, Matcher, Message, Peer, TAG_USER_MIN, Tag};
use crate::routed::{RecoveryStatus, Route, RoutingState, Scope};
use bytes::Bytes;
use std::time::Instant;

/// The user tag of the workload's reliable messages.
pub const TAG_RELIABLE: Tag = TAG_USER_MIN;
/// The user tag of the workload's plain messages.
pub const TAG_PLAIN: Tag = TAG_USER_MIN + 1;
/// Completion tokens at or above this belong to the runtime (fault reports), not the workload.
const RUNTIME_TOKEN: u64 = 1 << 63;
/// The user tag of the workload's broadcasts.
pub const TAG_BCAST: Tag = TAG_USER_MIN + 2;

/// A broadcast delivered here: (op, originator, tag, payload).
pub type BcastDelivery = (u64, Rank, Tag, Bytes);

/// A frame on a simulated link.
#[derive(Debug, Clone)]
pub enum SimFrame {
    /// A routed point-to-point message (workload plain messages, runtime notices).
    Msg {
        origin: Rank,
        dst: Rank,
        tag: Tag,
        payload: Bytes,
    },
    /// A reliable message.
    RelmData(relm::DataFrame),
    /// A RELM control frame (encoded, so the decoder is exercised too).
    RelmCtl(Bytes),
    /// A collective tree message (xcast kinds 1..=7, allgather kinds 16..), encoded.
    Coll(Bytes),
}

/// One simulated daemon.
#[derive(Debug)]
pub struct Node {
    /// Its rank.
    pub rank: Rank,
    /// Its view of the tree.
    pub routing: RoutingState,
    /// Its receive matching.
    pub matcher: Matcher,
    /// Its reliable messaging.
    pub relm: Relm,
    /// The last epoch confirmed by rank 0 that it applied.
    pub epoch: u64,
    /// Rank 0's confirmed dead ranks, as last heard.
    pub confirmed: Vec<Rank>,
    /// Frames to put on links: (neighbour, frame).
    pub out: Vec<(Rank, SimFrame)>,
    /// User messages posted to the application, in order.
    pub delivered: Vec<Message>,
    /// Completions of the workload's reliable sends.
    pub completions: Vec<(u64, Result<(), SendError>)>,
    /// Neighbours gained in a repair (the world fails a dial to a dead one).
    pub new_neighbours: Vec<Rank>,
    /// The broadcast core.
    pub xcast: Xcast,
    /// The allgather core.
    pub allgather: Allgather,
    /// Every broadcast delivered here (user and runtime), in delivery order.
    pub bcasts: Vec<BcastDelivery>,
    /// This daemon's broadcast requests that finished: (request, Some(op)) or (request, None)
    /// if refused.
    pub bcast_done: Vec<(u64, Option<u64>)>,
    /// Allgather results delivered here.
    pub gathered: Vec<AllgatherResult>,
    /// Frames dropped: no route, or from a rank known failed.
    pub dropped: u64,
    /// Protocol errors (a malformed frame): always a bug in the simulation.
    pub errors: Vec<String>,
    runtime_tokens: u64,
}

impl Node {
    /// Daemon `rank` of `size` with radix `radix`.
    pub fn new(rank: Rank, size: u32, radix: u32, cfg: RelmConfig) -> Result<Node, String> {
        let routing = RoutingState::new(radix, size, rank).map_err(|e| e.to_string())?;
        let mut matcher = Matcher::new(crate::limits::UNMATCHED_MAX_DEFAULT);
        for tag in [TAG_RELIABLE, TAG_PLAIN] {
            matcher
                .post(Peer::Any, tag, true)
                .map_err(|e| e.to_string())?;
        }
        let xcast = Xcast::new(&routing);
        let allgather = Allgather::new(&routing);
        Ok(Node {
            rank,
            xcast,
            allgather,
            bcasts: Vec::new(),
            bcast_done: Vec::new(),
            gathered: Vec::new(),
            routing,
            matcher,
            relm: Relm::new(rank, size, cfg),
            epoch: 0,
            confirmed: Vec::new(),
            out: Vec::new(),
            delivered: Vec::new(),
            completions: Vec::new(),
            new_neighbours: Vec::new(),
            dropped: 0,
            errors: Vec::new(),
            runtime_tokens: RUNTIME_TOKEN,
        })
    }

    /// A plain send from the application.
    pub fn send_plain(&mut self, now: Instant, dst: Rank, tag: Tag, payload: Bytes) {
        let origin = self.rank;
        self.route_msg(now, origin, dst, tag, payload);
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
        let r = self.relm.send(now, &self.routing, dst, tag, payload, token);
        self.pump(now);
        r
    }

    /// A broadcast from the application; the request id, or why the core refused at once.
    pub fn broadcast(
        &mut self,
        now: Instant,
        payload: Bytes,
    ) -> Result<u64, crate::grpcomm::XcastError> {
        let r = self.xcast.originate(TAG_BCAST, payload);
        self.pump(now);
        r
    }

    /// This daemon's contribution to allgather `id`.
    pub fn contribute(
        &mut self,
        now: Instant,
        id: u64,
        data: Bytes,
    ) -> Result<(), crate::grpcomm::AllgatherError> {
        let r = self.allgather.contribute(id, data);
        self.pump(now);
        r
    }

    fn route_msg(&mut self, now: Instant, origin: Rank, dst: Rank, tag: Tag, payload: Bytes) {
        match self.routing.route(dst) {
            Route::Parent(h) | Route::Child(h) => self.out.push((
                h,
                SimFrame::Msg {
                    origin,
                    dst,
                    tag,
                    payload,
                },
            )),
            Route::Local => self.deliver_at(
                now,
                Message {
                    origin,
                    tag,
                    payload,
                },
            ),
            Route::Unreachable => self.dropped += 1,
        }
    }

    /// A frame arrived from neighbour `from`.
    pub fn handle_frame(&mut self, now: Instant, from: Rank, frame: SimFrame) {
        if self.routing.is_failed(from) {
            self.dropped += 1;
            return;
        }
        match frame {
            SimFrame::Msg {
                origin,
                dst,
                tag,
                payload,
            } => {
                if self.routing.is_failed(origin) {
                    self.dropped += 1;
                } else if dst == self.rank {
                    self.deliver_at(
                        now,
                        Message {
                            origin,
                            tag,
                            payload,
                        },
                    );
                } else {
                    self.route_msg(now, origin, dst, tag, payload);
                }
            }
            SimFrame::Coll(bytes) => {
                let size = self.routing.size();
                if bytes.first().is_some_and(|k| *k >= 16) {
                    match AllgatherMsg::decode(size, bytes) {
                        Ok(m) => self.allgather.handle_msg(from, m),
                        Err(e) => self.errors.push(format!("allgather frame: {e}")),
                    }
                } else {
                    match XcastMsg::decode(size, bytes) {
                        Ok(m) => self.xcast.handle_msg(from, m),
                        Err(e) => self.errors.push(format!("xcast frame: {e}")),
                    }
                }
            }
            SimFrame::RelmData(d) => self.relm_input(now, from, |relm, routing, post| {
                relm.handle_data(now, routing, from, d, post)
            }),
            SimFrame::RelmCtl(bytes) => self.relm_input(now, from, |relm, routing, post| {
                relm.handle_control(now, routing, from, &bytes, post)
            }),
        }
        self.pump(now);
    }

    /// Feeds RELM one input; what it posts (the matcher never refuses here: the workload's
    /// receives are persistent wildcards) is delivered after the call returns.
    fn relm_input(
        &mut self,
        now: Instant,
        from: Rank,
        input: impl FnOnce(
            &mut Relm,
            &RoutingState,
            &mut relm::Post<'_>,
        ) -> Result<(), relm::ControlError>,
    ) {
        let mut posted = Vec::new();
        let mut post = |origin: Rank, tag: Tag, payload: Bytes| {
            posted.push(Message {
                origin,
                tag,
                payload,
            });
            true
        };
        if let Err(e) = input(&mut self.relm, &self.routing, &mut post) {
            self.errors.push(format!("relm input from {from}: {e}"));
        }
        for m in posted {
            self.deliver_at(now, m);
        }
    }

    /// Time passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.relm.handle_timeout(now, &self.routing);
        self.pump(now);
    }

    /// The world's connection to `dead` broke and could not be re-established.
    pub fn detect(&mut self, now: Instant, dead: Rank) {
        self.declare_failed(now, &[dead], true);
        self.pump(now);
    }

    /// Drains every core's output (the driver's poll order: transmits before events, repeated
    /// while anything came out, so a daemon forwards before it delivers).
    pub fn pump(&mut self, now: Instant) {
        // Bounded: each round either moves something or stops; a core cannot produce output
        // for ever without input.
        for _ in 0..1_000_000 {
            let mut any = false;
            while let Some(t) = self.xcast.poll_transmit() {
                any = true;
                match t.msg {
                    XcastMsg::Request(_) | XcastMsg::Done { .. } | XcastMsg::Refused { .. } => {
                        let tag = if matches!(t.msg, XcastMsg::Request(_)) {
                            TAG_XCAST_REQUEST
                        } else {
                            TAG_XCAST_DONE
                        };
                        self.runtime_reliable(now, t.to, tag, t.msg.encode());
                    }
                    msg => {
                        if matches!(msg, XcastMsg::Sync { .. }) {
                            self.tell_child(t.to);
                        }
                        self.out.push((t.to, SimFrame::Coll(msg.encode())))
                    }
                }
            }
            while let Some(t) = self.allgather.poll_transmit() {
                any = true;
                if matches!(t.msg, AllgatherMsg::Sync { .. }) {
                    self.tell_child(t.to);
                }
                self.out.push((t.to, SimFrame::Coll(t.msg.encode())));
            }
            while let Some(t) = self.relm.poll_transmit() {
                any = true;
                match t {
                    Transmit::Data { to, frame } => self.out.push((to, SimFrame::RelmData(frame))),
                    Transmit::Control { to, control } => {
                        self.out.push((to, SimFrame::RelmCtl(control.encode())))
                    }
                }
            }
            while let Some(e) = self.xcast.poll_event() {
                any = true;
                match e {
                    XcastEvent::Deliver {
                        op,
                        originator,
                        tag,
                        payload,
                    } => {
                        self.bcasts.push((op, originator, tag, payload.clone()));
                        match tag {
                            TAG_FAULT_CONFIRM if self.rank != 0 => self.on_confirm(now, &payload),
                            TAG_ALLGATHER_RESULT => {
                                if let Err(e) = self.allgather.handle_result_bytes(payload) {
                                    self.errors.push(format!("allgather result: {e}"));
                                }
                            }
                            _ => {}
                        }
                    }
                    XcastEvent::Completed { request, op } => {
                        self.bcast_done.push((request, Some(op)))
                    }
                    XcastEvent::Refused { request } => self.bcast_done.push((request, None)),
                }
            }
            while let Some(e) = self.allgather.poll_event() {
                any = true;
                match e {
                    AllgatherEvent::ResultReady { result } => {
                        if let Err(e) = self.xcast.originate(TAG_ALLGATHER_RESULT, result.encode())
                        {
                            self.errors
                                .push(format!("allgather result not broadcast: {e}"));
                        }
                    }
                    AllgatherEvent::AllgatherDone { result } => self.gathered.push(result),
                }
            }
            while let Some(RelmEvent::Completed { token, result }) = self.relm.poll_event() {
                any = true;
                if token < RUNTIME_TOKEN {
                    self.completions.push((token, result));
                }
            }
            if !any {
                return;
            }
        }
        self.errors.push("pump did not settle".into());
    }

    /// A runtime message over RELM (fault reports, broadcast requests and answers).
    fn runtime_reliable(&mut self, now: Instant, to: Rank, tag: Tag, payload: Bytes) {
        if to == self.rank {
            self.runtime(
                now,
                Message {
                    origin: to,
                    tag,
                    payload,
                },
            );
            return;
        }
        let token = self.runtime_tokens;
        self.runtime_tokens += 1;
        if let Err(e) = self.relm.send(now, &self.routing, to, tag, payload, token) {
            // To a dead rank: nothing to do (its requests die with it).
            if !matches!(e, SendError::NodeDown(_)) {
                self.errors
                    .push(format!("runtime message to {to} not sent: {e}"));
            }
        }
    }

    fn deliver_at(&mut self, now: Instant, msg: Message) {
        if msg.tag < TAG_USER_MIN {
            self.runtime(now, msg);
            return;
        }
        match self.matcher.handle_message(msg) {
            Dispatch::Deliver { msg, .. } => self.delivered.push(msg),
            Dispatch::Held | Dispatch::HeldEvicted(_) => {
                self.errors.push("workload message not matched".into())
            }
        }
    }

    fn runtime(&mut self, now: Instant, msg: Message) {
        let size = self.routing.size();
        match msg.tag {
            TAG_FAULT_REPORT if self.rank == 0 => match notice::decode_ranks(size, &msg.payload) {
                Ok(ranks) => self.confirm(now, &ranks),
                Err(e) => self.errors.push(format!("report: {e}")),
            },
            TAG_XCAST_REQUEST | TAG_XCAST_DONE => match XcastMsg::decode(size, msg.payload) {
                Ok(m) => self.xcast.handle_msg(msg.origin, m),
                Err(e) => self.errors.push(format!("xcast request: {e}")),
            },
            TAG_ADOPTED => match Adoption::decode(size, &msg.payload) {
                // Reported on: the adopter's own report may have died with a relay (or with
                // the adopter), and rank 0 must hear of every death for the trees to agree.
                Ok(a) => self.declare_failed(now, &a.failed, true),
                Err(e) => self.errors.push(format!("adoption: {e}")),
            },
            t => self.errors.push(format!("unexpected runtime tag {t}")),
        }
    }

    fn declare_failed(&mut self, now: Instant, ranks: &[Rank], report: bool) {
        let size = self.routing.size();
        let mut new: Vec<Rank> = ranks
            .iter()
            .copied()
            .filter(|r| *r != self.rank && *r < size && !self.routing.is_failed(*r))
            .collect();
        new.sort_unstable();
        new.dedup();
        if new.is_empty() {
            return;
        }
        if new.contains(&0) {
            self.errors.push("rank 0 declared failed".into());
            return;
        }
        match self.routing.fail(&new, Scope::Local, None) {
            Ok(status) => self.after_repair(now, &status),
            Err(e) => self.errors.push(format!("repair: {e}")),
        }
        if report {
            if self.rank == 0 {
                self.confirm(now, &new);
            } else {
                // Reported over RELM: a report must not be lost with a dying relay.
                self.runtime_reliable(now, 0, TAG_FAULT_REPORT, notice::encode_ranks(&new));
            }
        }
    }

    fn after_repair(&mut self, now: Instant, status: &RecoveryStatus) {
        log::debug!(
            "rank {}: repair {:?} failed {:?}: parent {:?} -> {:?}, children {:?} -> {:?}",
            self.rank,
            status.scope,
            status.newly_failed,
            status.previous_parent,
            status.new_parent,
            status.previous_children,
            status.new_children
        );
        let adopted: Vec<Rank> = status
            .new_children
            .iter()
            .copied()
            .filter(|c| !status.previous_children.contains(c))
            .collect();
        self.xcast.handle_repair(status);
        self.allgather.handle_repair(status);
        self.relm.handle_repair(now, &self.routing, status);
        self.new_neighbours.extend(adopted);
        if status.new_parent != status.previous_parent {
            self.new_neighbours.extend(status.new_parent);
        }
    }

    /// Child `c` gets an adoption notice (every failure known here, and the ancestors) ahead of
    /// every `Sync` the collectives offer it, as in the driver: the child can answer only under
    /// the same view, and the failures it lacks would otherwise reach it only as confirmations,
    /// which are broadcast operations its new parent sends only once they are synchronised.
    fn tell_child(&mut self, c: Rank) {
        let a = Adoption {
            failed: self.routing.failed().collect(),
            ancestors: self.routing.ancestors().to_vec(),
        }
        .encode();
        self.out.push((
            c,
            SimFrame::Msg {
                origin: self.rank,
                dst: c,
                tag: TAG_ADOPTED,
                payload: a,
            },
        ));
    }

    fn confirm(&mut self, now: Instant, ranks: &[Rank]) {
        let new: Vec<Rank> = ranks
            .iter()
            .copied()
            .filter(|r| *r != 0 && !self.confirmed.contains(r))
            .collect();
        if new.is_empty() {
            return;
        }
        self.epoch += 1;
        self.confirmed.extend(&new);
        self.confirmed.sort_unstable();
        self.confirmed.dedup();
        let unknown: Vec<Rank> = new
            .iter()
            .copied()
            .filter(|r| !self.routing.is_failed(*r))
            .collect();
        match self.routing.fail(&unknown, Scope::Global, Some(self.epoch)) {
            Ok(status) => self.after_repair(now, &status),
            Err(e) => self.errors.push(format!("repair: {e}")),
        }
        // A broadcast operation: every living daemon delivers every confirmation, in order,
        // including one whose parent died while forwarding it (its new parent replays it).
        let c = Confirmation {
            epoch: self.epoch,
            failed: self.confirmed.clone(),
        }
        .encode();
        // Past rank 0's full window, as in the driver: completions wait for every daemon to
        // reach rank 0's view, which the confirmation brings.
        if let Err(e) = self.xcast.originate_urgent(TAG_FAULT_CONFIRM, c) {
            self.errors.push(format!("confirmation not broadcast: {e}"));
        }
    }

    fn on_confirm(&mut self, now: Instant, payload: &[u8]) {
        let c = match Confirmation::decode(self.routing.size(), payload) {
            Ok(c) => c,
            Err(e) => {
                self.errors.push(format!("confirmation: {e}"));
                return;
            }
        };
        if c.epoch <= self.epoch {
            return;
        }
        if c.failed.contains(&self.rank) {
            self.errors.push("confirmed dead while alive".into());
            return;
        }
        let unknown: Vec<Rank> = c
            .failed
            .iter()
            .copied()
            .filter(|r| !self.routing.is_failed(*r))
            .collect();
        self.epoch = c.epoch;
        self.confirmed = c.failed;
        match self.routing.fail(&unknown, Scope::Global, Some(self.epoch)) {
            Ok(status) => self.after_repair(now, &status),
            Err(e) => self.errors.push(format!("repair: {e}")),
        }
    }
}
