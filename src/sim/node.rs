//! One simulated daemon: the real protocol cores (the routing state, the receive matcher,
//! RELM, the fault-notice codecs) driven the way the event loop drives them, with frames,
//! clock and connections supplied by the world instead of sockets.
//!
//! The fault flow follows `driver/event_loop/faults.rs`: a detected death is repaired at once
//! (local scope), adopted children are told (adoption notice, and rank 0's latest confirmation
//! so a child that missed one catches up), the death is reported to rank 0 (reliably, over
//! RELM), rank 0 confirms with a new epoch down the tree, and every daemon repairs again
//! (global scope). Handlers run in the driver's order: messaging, RELM.

use crate::Rank;
use crate::error::SendError;
use crate::faults::notice::{
    self, Adoption, Confirmation, TAG_ADOPTED, TAG_FAULT_CONFIRM, TAG_FAULT_REPORT,
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
    /// A broadcast frame from a parent (here: rank 0's fault confirmations).
    Xcast { tag: Tag, payload: Bytes },
    /// A reliable message.
    RelmData(relm::DataFrame),
    /// A RELM control frame (encoded, so the decoder is exercised too).
    RelmCtl(Bytes),
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
        Ok(Node {
            rank,
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
        self.pump();
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
            SimFrame::Xcast { tag, payload } => {
                if tag == TAG_FAULT_CONFIRM {
                    self.on_confirm(now, &payload);
                }
            }
            SimFrame::RelmData(d) => {
                let mut posted = Vec::new();
                let mut post = |origin: Rank, tag: Tag, payload: Bytes| {
                    posted.push(Message {
                        origin,
                        tag,
                        payload,
                    });
                    true
                };
                let r = self
                    .relm
                    .handle_data(now, &self.routing, from, d, &mut post);
                if let Err(e) = r {
                    self.errors.push(format!("relm data from {from}: {e}"));
                }
                for m in posted {
                    self.deliver_at(now, m);
                }
            }
            SimFrame::RelmCtl(bytes) => {
                let mut posted = Vec::new();
                let mut post = |origin: Rank, tag: Tag, payload: Bytes| {
                    posted.push(Message {
                        origin,
                        tag,
                        payload,
                    });
                    true
                };
                let r = self
                    .relm
                    .handle_control(now, &self.routing, from, &bytes, &mut post);
                if let Err(e) = r {
                    self.errors.push(format!("relm control from {from}: {e}"));
                }
                for m in posted {
                    self.deliver_at(now, m);
                }
            }
        }
        self.pump();
    }

    /// Time passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.relm.handle_timeout(now, &self.routing);
        self.pump();
    }

    /// The world's connection to `dead` broke and could not be re-established.
    pub fn detect(&mut self, now: Instant, dead: Rank) {
        self.declare_failed(now, &[dead], true);
        self.pump();
    }

    /// Moves RELM's output into `out` and `completions`.
    pub fn pump(&mut self) {
        while let Some(t) = self.relm.poll_transmit() {
            match t {
                Transmit::Data {
                    to,
                    origin,
                    dst,
                    tag,
                    uid,
                    prev,
                    payload,
                } => self.out.push((
                    to,
                    SimFrame::RelmData(relm::DataFrame {
                        origin,
                        dst,
                        tag,
                        uid,
                        prev,
                        payload,
                    }),
                )),
                Transmit::Control { to, control } => {
                    self.out.push((to, SimFrame::RelmCtl(control.encode())))
                }
            }
        }
        while let Some(RelmEvent::Completed { token, result }) = self.relm.poll_event() {
            if token < RUNTIME_TOKEN {
                self.completions.push((token, result));
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
            TAG_ADOPTED => match Adoption::decode(size, &msg.payload) {
                Ok(a) => self.declare_failed(now, &a.failed, false),
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
                let token = self.runtime_tokens;
                self.runtime_tokens += 1;
                let r = self.relm.send(
                    now,
                    &self.routing,
                    0,
                    TAG_FAULT_REPORT,
                    notice::encode_ranks(&new),
                    token,
                );
                if let Err(e) = r {
                    self.errors.push(format!("report not sent: {e}"));
                }
            }
        }
    }

    fn after_repair(&mut self, now: Instant, status: &RecoveryStatus) {
        let adopted: Vec<Rank> = status
            .new_children
            .iter()
            .copied()
            .filter(|c| !status.previous_children.contains(c))
            .collect();
        self.relm.handle_repair(now, &self.routing, status);
        if !adopted.is_empty() {
            let a = Adoption {
                failed: self.routing.failed().collect(),
                ancestors: self.routing.ancestors().to_vec(),
            }
            .encode();
            let c = Confirmation {
                epoch: self.epoch,
                failed: self.confirmed.clone(),
            }
            .encode();
            for child in &adopted {
                self.out.push((
                    *child,
                    SimFrame::Msg {
                        origin: self.rank,
                        dst: *child,
                        tag: TAG_ADOPTED,
                        payload: a.clone(),
                    },
                ));
                if self.epoch > 0 {
                    self.out.push((
                        *child,
                        SimFrame::Xcast {
                            tag: TAG_FAULT_CONFIRM,
                            payload: c.clone(),
                        },
                    ));
                }
            }
        }
        self.new_neighbours.extend(adopted);
        if status.new_parent != status.previous_parent {
            self.new_neighbours.extend(status.new_parent);
        }
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
        self.xcast_confirmation();
    }

    fn xcast_confirmation(&mut self) {
        let c = Confirmation {
            epoch: self.epoch,
            failed: self.confirmed.clone(),
        }
        .encode();
        for child in self.routing.children().to_vec() {
            self.out.push((
                child,
                SimFrame::Xcast {
                    tag: TAG_FAULT_CONFIRM,
                    payload: c.clone(),
                },
            ));
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
        self.xcast_confirmation();
    }
}
