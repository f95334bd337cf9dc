//! The API's side of a node: sends, receives, broadcasts, collectives, shutdown; routing a
//! point-to-point frame one hop; delivery to receive matching; stopping.

use super::{Node, Output, Reroute, StopReason};
use crate::Rank;
use crate::error::SendError;
use crate::oob::header::{Header, Kind};
use crate::oob::send_queue::Payload;
use crate::rml::batch_frame::{ItemRun, TAG_BATCH};
use crate::rml::{Dispatch, Message, Peer, PostError, ReceiveId, TAG_USER_MIN, Tag};
use crate::routed::Route;
use bytes::Bytes;
use std::time::Instant;

/// An API call that sends. `token` (chosen by the driver) names its completion in
/// [`Output::Transmit`] or [`Output::SendDone`]; `None` when nobody waits for it.
#[derive(Debug)]
pub enum Command {
    /// A plain message: complete once it reached the kernel on the first hop. `route`
    /// overrides the daemon's route setting for it ([`crate::direct::Route`]).
    Send {
        dst: Rank,
        tag: Tag,
        payload: Bytes,
        token: Option<u64>,
        route: Option<crate::direct::Route>,
    },
    /// A batch frame (`rml::batch_frame`) the driver packed: `messages` small plain messages
    /// to `dst` (another daemon), without a completion, counted as the messages they are.
    SendPacked {
        dst: Rank,
        payload: Bytes,
        messages: u32,
    },
    /// A reliable (RELM) message: complete once the destination posted it.
    SendReliable {
        dst: Rank,
        tag: Tag,
        payload: Bytes,
        token: Option<u64>,
    },
    /// A broadcast (xcast): complete once every living daemon delivered it.
    Broadcast {
        tag: Tag,
        payload: Bytes,
        token: Option<u64>,
    },
    /// This daemon's contribution to collective `id`; the result is [`Output::AllgatherDone`].
    Allgather { id: u64, data: Bytes },
    /// This daemon's contribution to group collective `op` (it must be a member); the outcome
    /// is [`Output::GroupDone`] with `token`.
    GroupGather {
        op: crate::grpcomm::GroupOp,
        data: Bytes,
        call: super::GroupCall,
        token: u64,
    },
    /// A fence of the data exchange as group collective `op`: in full mode this daemon's
    /// committed data is its contribution and the result fills the cache. Ends with
    /// [`Output::GroupDone`] with `token`.
    Fence {
        op: crate::grpcomm::GroupOp,
        mode: super::FenceMode,
        token: u64,
    },
}

impl Command {
    /// Whether the command must wait for wire-up (a self-send need not).
    fn needs_wireup(&self, me: Rank) -> bool {
        match self {
            Command::Send { dst, .. }
            | Command::SendPacked { dst, .. }
            | Command::SendReliable { dst, .. } => *dst != me,
            Command::Broadcast { .. }
            | Command::Allgather { .. }
            | Command::GroupGather { .. }
            | Command::Fence { .. } => true,
        }
    }
}

impl Node {
    /// An API call. `Err` is the caller's answer now (nothing was queued, no output will name
    /// its token); `Ok` means an output will finish it.
    pub fn handle_command(&mut self, now: Instant, c: Command) -> Result<(), SendError> {
        if self.stopping.is_some() || self.leaving.is_some() {
            return Err(SendError::ShutDown);
        }
        if !self.is_settled() && c.needs_wireup(self.me) {
            if self.prewire.len() >= self.prewire_queue_max {
                return Err(SendError::Busy(crate::error::Limit::PrewireQueue));
            }
            self.prewire.push_back(c);
            return Ok(());
        }
        self.execute(now, c)
    }

    fn execute(&mut self, now: Instant, c: Command) -> Result<(), SendError> {
        match c {
            Command::Send {
                dst,
                tag,
                payload,
                token,
                route,
            } => {
                self.check_flow(dst, token)?;
                // A batch frame carries several of the user's messages and goes their way
                // (over a direct link when one is used), unlike the runtime's own tags.
                if dst == self.me || (tag < TAG_USER_MIN && tag != TAG_BATCH) {
                    self.counters.sent += 1;
                    self.send(dst, tag, payload, token);
                } else {
                    // A batch frame counts as the messages it carries.
                    let messages = self.send_routed(now, dst, tag, payload, token, route);
                    self.counters.sent += messages;
                }
                Ok(())
            }
            Command::SendPacked {
                dst,
                payload,
                messages,
            } => {
                let messages = u64::from(messages);
                self.send_routed_counted(now, dst, TAG_BATCH, payload.into(), None, None, messages);
                self.counters.sent += messages;
                Ok(())
            }
            Command::SendReliable {
                dst,
                tag,
                payload,
                token,
            } => {
                self.check_flow(dst, token)?;
                self.counters.sent += 1;
                self.send_reliable(now, dst, tag, payload, token)
            }
            Command::Broadcast {
                tag,
                payload,
                token,
            } => self.broadcast(tag, payload, token),
            Command::Allgather { id, data } => self.contribute(id, data),
            Command::GroupGather {
                op,
                data,
                call,
                token,
            } => self.group_contribute(op, data, token, call),
            Command::Fence { op, mode, token } => {
                let data = self.fence_data(&op.group, mode);
                self.group_contribute(op, data, token, super::GroupCall::Fence(mode))
            }
        }
    }

    /// A send to `dst` originated here with a completion `token` is turned away while the
    /// queue towards its next hop is congested (`flow`): the caller slows down instead of a
    /// relay dropping. One without a token was gated when submitted (see
    /// [`Node::may_originate_to`]) and is accepted: its caller could not learn of a refusal.
    fn check_flow(&mut self, dst: Rank, token: Option<u64>) -> Result<(), SendError> {
        if token.is_none() || self.may_originate_to(dst) {
            return Ok(());
        }
        self.counters.sends_busy_flow += 1;
        Err(SendError::Busy(crate::error::Limit::NextHopQueue))
    }

    /// Wire-up completed: the held commands run, in order; what they are refused now is
    /// reported through their outputs.
    pub(super) fn replay_prewire(&mut self, now: Instant) {
        let held: Vec<Command> = self.prewire.drain(..).collect();
        for c in held {
            let who = finish_of(&c);
            if let Err(e) = self.execute(now, c) {
                self.refused(who, e);
            }
        }
    }

    fn refused(&mut self, who: Finish, e: SendError) {
        match who {
            Finish::Token(Some(token)) => self.done(token, Err(e)),
            Finish::Token(None) => {}
            Finish::Allgather(id) => self
                .out
                .push_back(Output::AllgatherDone { id, result: Err(e) }),
            Finish::Group(token) => self.out.push_back(Output::GroupDone {
                token,
                result: Err(e),
            }),
        }
    }

    /// Posts a receive for (peer, tag). Held messages it matches come out as
    /// [`Output::Deliver`] (register the receive's callback before carrying them out).
    pub fn post(&mut self, peer: Peer, tag: Tag, persistent: bool) -> Result<ReceiveId, PostError> {
        let (id, deliveries) = self.matcher.post(peer, tag, persistent)?;
        for d in deliveries {
            self.dispatch(d);
        }
        Ok(id)
    }

    /// Cancels the receive posted for exactly (peer, tag); its id, if there was one.
    pub fn cancel(&mut self, peer: Peer, tag: Tag) -> Option<ReceiveId> {
        self.matcher.cancel(peer, tag)
    }

    /// The id of the receive posted for exactly (peer, tag), if any.
    pub fn receive_id(&self, peer: Peer, tag: Tag) -> Option<ReceiveId> {
        self.matcher.receive_id(peer, tag)
    }

    /// Drops every receive for `peer` and every message held from it: the receives' ids and
    /// how many held messages were dropped.
    pub fn purge(&mut self, peer: Rank) -> (Vec<ReceiveId>, usize) {
        self.matcher.purge(peer)
    }

    /// Stop this daemon; with `dvm` at rank 0, the whole DVM (rank 0 stops once it delivers
    /// its own shutdown broadcast, after forwarding it).
    pub fn handle_shutdown(&mut self, now: Instant, dvm: bool) {
        if self.stopping.is_some() {
            return;
        }
        if dvm && self.me == 0 && self.is_wired() {
            self.originate_runtime(super::wireup::TAG_SHUTDOWN, Bytes::new());
            self.pump_grpcomm(now);
        } else {
            self.begin_stop(now, StopReason::Requested);
        }
    }

    /// Stop at once, as a crash would (the driver closes every connection without a linger).
    pub fn handle_abort(&mut self, now: Instant) {
        self.begin_stop(now, StopReason::Aborted);
    }

    /// Stops: what RELM still had to acknowledge goes out with the linger; everything waiting
    /// here fails with `ShutDown`; then [`Output::Stop`].
    pub(super) fn begin_stop(&mut self, now: Instant, reason: StopReason) {
        if self.stopping.is_some() {
            return;
        }
        log::debug!("rank {}: stopping ({reason:?})", self.me);
        self.pump_relm(now);
        if !matches!(reason, StopReason::Aborted) {
            self.streams_stop(now);
        }
        self.stopping = Some(reason.clone());
        let held: Vec<Command> = self.prewire.drain(..).collect();
        for c in held {
            self.refused(finish_of(&c), SendError::ShutDown);
        }
        let mut tokens: Vec<u64> = self.relm_waiting_users();
        let mut requests: Vec<(u64, Option<u64>)> = self.bcast_tokens.drain().collect();
        requests.sort_unstable();
        tokens.extend(requests.into_iter().filter_map(|(_, t)| t));
        for t in tokens {
            self.done(t, Err(SendError::ShutDown));
        }
        let ids: Vec<u64> = std::mem::take(&mut self.gathering).into_iter().collect();
        for id in ids {
            self.out.push_back(Output::AllgatherDone {
                id,
                result: Err(SendError::ShutDown),
            });
        }
        self.modex_stop();
        self.clients_stop();
        for (_, (token, _)) in std::mem::take(&mut self.group_tokens) {
            self.out.push_back(Output::GroupDone {
                token,
                result: Err(SendError::ShutDown),
            });
        }
        self.status_stop(now);
        self.out.push_back(Output::Stop(reason));
    }

    // ----- sending and routing --------------------------------------------------------------

    /// Sends a message originated here (user or runtime tag) along the tree.
    pub(super) fn send(&mut self, dst: Rank, tag: Tag, payload: Bytes, token: Option<u64>) {
        if dst == self.me {
            self.local.push_back(Message {
                origin: self.me,
                tag,
                payload,
            });
            if let Some(t) = token {
                self.done(t, Ok(()));
            }
            return;
        }
        let header = self.header(Kind::Msg, self.me, dst, tag, payload.len());
        self.forward(header, payload.into(), token);
    }

    /// Routes a point-to-point frame one hop towards its destination.
    pub(super) fn forward(&mut self, mut header: Header, payload: Payload, token: Option<u64>) {
        match self.next_hop(header.dst) {
            Ok(hop) => {
                header.epoch = self.incarnation;
                self.transmit(hop, header, payload, token);
            }
            Err(e) => {
                log::debug!("rank {}: dropping frame for {}: {e}", self.me, header.dst);
                if let Some(t) = token {
                    self.done(t, Err(e));
                }
            }
        }
    }

    fn next_hop(&mut self, dst: Rank) -> Result<Rank, SendError> {
        match self.routing.route(dst) {
            Route::Parent(hop) | Route::Child(hop) => Ok(hop),
            // Only reachable for frames addressed to this daemon, delivered before routing.
            Route::Local => Err(SendError::Unreachable(dst)),
            Route::Unreachable => {
                self.counters.dropped_unreachable += 1;
                Err(if self.routing.is_failed(dst) {
                    SendError::NodeDown(dst)
                } else {
                    SendError::Unreachable(dst)
                })
            }
        }
    }

    /// A frame that was queued for a rank that failed ([`Output::PeersFailed`]): where it goes
    /// over the repaired tree. `adopted` is the list that output carried.
    pub fn reroute(&mut self, header: Header, adopted: &[Rank]) -> Reroute {
        match header.kind {
            Kind::Msg => match self.next_hop(header.dst) {
                Ok(hop) => {
                    let mut h = header;
                    h.epoch = self.incarnation;
                    Reroute::Hop(hop, h)
                }
                Err(e) => Reroute::Fail(e),
            },
            // A flood (the contact table) the dead child never passed on goes to the children
            // it leaves behind.
            Kind::Xcast => Reroute::Copies(
                adopted
                    .iter()
                    .filter(|c| !self.routing.is_failed(**c))
                    .map(|c| {
                        let mut h = header;
                        h.dst = *c;
                        h.epoch = self.incarnation;
                        (*c, h)
                    })
                    .collect(),
            ),
            // RELM replays what the dead neighbour may have lost, and the collectives
            // resynchronise with the new neighbours; heartbeats are not worth keeping.
            _ => Reroute::Drop,
        }
    }

    // ----- delivery -------------------------------------------------------------------------

    pub(super) fn deliver_local(&mut self, now: Instant) {
        // Bounded by the messages queued before this call; delivering may queue more.
        for _ in 0..self.local.len() {
            match self.local.pop_front() {
                Some(m) => self.deliver(now, m),
                None => break,
            }
        }
    }

    pub(super) fn deliver(&mut self, now: Instant, msg: Message) {
        if msg.tag < TAG_USER_MIN {
            self.runtime_message(now, msg);
            return;
        }
        let d = self.matcher.handle_message(msg);
        self.dispatch(d);
    }

    /// Hands a run of batch items that persistent receive `receive` matched to the driver.
    pub(super) fn deliver_run(&mut self, receive: ReceiveId, run: ItemRun) {
        self.counters.delivered += u64::from(run.len());
        self.out.push_back(Output::DeliverRun { receive, run });
    }

    pub(super) fn dispatch(&mut self, d: Dispatch) {
        match d {
            Dispatch::Deliver { id, retired, msg } => {
                self.counters.delivered += 1;
                self.out.push_back(Output::Deliver {
                    receive: id,
                    retired,
                    msg,
                });
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
}

/// Who hears of a command's refusal.
enum Finish {
    Token(Option<u64>),
    Allgather(u64),
    Group(u64),
}

fn finish_of(c: &Command) -> Finish {
    match c {
        Command::SendPacked { .. } => Finish::Token(None),
        Command::Send { token, .. }
        | Command::SendReliable { token, .. }
        | Command::Broadcast { token, .. } => Finish::Token(*token),
        Command::Allgather { id, .. } => Finish::Allgather(*id),
        Command::GroupGather { token, .. } | Command::Fence { token, .. } => Finish::Group(*token),
    }
}
