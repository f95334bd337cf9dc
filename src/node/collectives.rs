//! The node's side of the fault-tolerant collectives. The protocols are the sans-IO cores in
//! `src/grpcomm/` (`Xcast`, `Allgather`; its `mod.rs` says how to drive them); this file feeds
//! them (API calls, frames, RELM messages, repairs, links that came back) and turns what they
//! ask for into outputs.
//!
//! * **Tree messages** (xcast `Op`/`Ack`/`Sync`/`Resume`, allgather `Contribution`/`Sync`) go
//!   to the neighbour as `Kind::Grpcomm` frames (origin = this daemon, dst = the neighbour,
//!   tag 0). An `Op` is two payload parts, its 29-byte header and the broadcast's shared
//!   payload: one `Bytes` for every child, never copied. A driver whose queue drops one calls
//!   [`Node::handle_link_restate`] once the queue has room again.
//! * **Requests, dones and refusals** (originator <-> rank 0, possibly several hops) ride RELM
//!   with the runtime tags `TAG_XCAST_REQUEST` and `TAG_XCAST_DONE`: reliable, in order per
//!   origin. They leave the core (`poll_notice`) only while RELM has room for the runtime's
//!   messages; a full window leaves them waiting in the core.
//! * **Pump**, once per turn before RELM's: `poll_transmit` of both cores until `None`, then
//!   each `poll_event` of the xcast followed by the allgather's events it caused, repeated
//!   while anything came out. Transmits before events is what makes a daemon forward an
//!   operation to its children before it delivers it; allgather events right after the xcast
//!   event that caused them is what delivers a result decided before a shutdown.
//! * **Deliveries**: user tags go to receive matching (origin = the originator); rank 0's own
//!   operations carry fault confirmations, allgather results and the DVM shutdown.
//! * **Rank 0's own notices**: fault confirmations and the shutdown pass a full window (the
//!   window drains only once every daemon has rank 0's failed set, which the confirmation
//!   brings); allgather results that find it full wait (bounded, in order) and are retried
//!   every pump, and meanwhile rank 0's user broadcasts get `Busy`.

use super::{Node, Output, StopReason, Trace};
use crate::Rank;
use crate::error::SendError;
use crate::faults::notice::TAG_FAULT_CONFIRM;
use crate::grpcomm::wire::GROUP_KIND_MIN;
use crate::grpcomm::{
    AllgatherError, AllgatherEvent, AllgatherMsg, AllgatherResult, Contribution, OP_HEADER_LEN,
    TAG_ALLGATHER_RESULT, TAG_XCAST_DONE, TAG_XCAST_REQUEST, Transmit, XcastError, XcastEvent,
    XcastLimits, XcastMsg,
};
use crate::grpcomm::{
    GroupContributeError, GroupData, GroupEvent, GroupFailure, GroupMsg, GroupOp,
};
use crate::limits;
use crate::oob::header::{Header, Kind};
use crate::oob::send_queue::Payload;
use crate::rml::{Message, TAG_USER_MIN, Tag};
use crate::routed::RecoveryStatus;
use bytes::Bytes;
use std::time::Instant;

use super::wireup::TAG_SHUTDOWN;

/// What a member called under a group collective's number. It travels in front of the
/// member's contribution, so members that called different collectives (kind, root or fence
/// mode) under one number all end it with `SendError::Mismatch` instead of misreading each
/// other's data: every member checks the same result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupCall {
    Allgather,
    Barrier,
    Broadcast(Rank),
    Fence(super::FenceMode),
}

/// Bytes [`GroupCall`] adds in front of a contribution.
pub const GROUP_CALL_LEN: usize = 5;

impl GroupCall {
    fn tag(self) -> [u8; GROUP_CALL_LEN] {
        let (kind, root) = match self {
            GroupCall::Allgather => (1u8, 0),
            GroupCall::Barrier => (2, 0),
            GroupCall::Broadcast(root) => (3, root),
            GroupCall::Fence(super::FenceMode::Full) => (4, 0),
            GroupCall::Fence(super::FenceMode::Direct) => (5, 0),
        };
        let r = root.to_be_bytes();
        [kind, r[0], r[1], r[2], r[3]]
    }
}

/// A group result with every member's call tag checked and taken off: `Mismatch` if the
/// members called different collectives (or an entry is too short to carry a tag).
fn untag(mut r: AllgatherResult) -> Result<AllgatherResult, SendError> {
    let mut first: Option<Bytes> = None;
    for (_, data) in r.contributions.iter_mut() {
        if data.len() < GROUP_CALL_LEN {
            return Err(SendError::Mismatch);
        }
        let tag = data.slice(..GROUP_CALL_LEN);
        match &first {
            None => first = Some(tag),
            Some(f) if *f != tag => return Err(SendError::Mismatch),
            Some(_) => {}
        }
        *data = data.slice(GROUP_CALL_LEN..);
    }
    Ok(r)
}

/// The largest broadcast payload with frames of at most `msg_max_bytes`: an `Op` adds its
/// header, and rank 0 keeps at most `XCAST_INFLIGHT_MAX_BYTES` in flight.
pub fn broadcast_max(msg_max_bytes: usize) -> usize {
    msg_max_bytes
        .saturating_sub(OP_HEADER_LEN)
        .min(limits::XCAST_INFLIGHT_MAX_BYTES)
}

/// The xcast bounds of a DVM whose frames are at most `msg_max_bytes` (every daemon of a DVM
/// has the same configuration, hence the same bounds): the largest payload is what fits in a
/// frame behind an `Op`'s header. Rank 0 splits payloads above `part_bytes` (0: never).
pub fn xcast_limits(msg_max_bytes: usize, part_bytes: usize) -> XcastLimits {
    XcastLimits {
        payload: broadcast_max(msg_max_bytes),
        part_bytes,
        ..XcastLimits::default()
    }
}

fn xcast_error(e: XcastError) -> SendError {
    match e {
        XcastError::Busy => SendError::Busy(crate::error::Limit::BroadcastWindow),
        XcastError::TooManyOutstanding => {
            SendError::Busy(crate::error::Limit::OutstandingBroadcasts)
        }
        XcastError::TooLarge { len, max } => SendError::TooLarge { len, max },
        XcastError::Dead => SendError::ShutDown,
    }
}

impl Node {
    /// A user broadcast, once wired.
    pub(super) fn broadcast(
        &mut self,
        tag: Tag,
        payload: Bytes,
        token: Option<u64>,
    ) -> Result<(), SendError> {
        self.counters.sent += 1;
        if self.me == 0 && !self.xcast_deferred.is_empty() {
            // Rank 0's own notices go first.
            return Err(xcast_error(XcastError::Busy));
        }
        let request = self.xcast.originate(tag, payload).map_err(xcast_error)?;
        self.bcast_tokens.insert(request, token);
        Ok(())
    }

    /// This daemon's contribution to collective `id` (a barrier contributes nothing), once
    /// wired.
    pub(super) fn contribute(&mut self, id: u64, data: Bytes) -> Result<(), SendError> {
        match self.allgather.contribute(id, data) {
            Ok(()) => {
                self.gathering.insert(id);
                Ok(())
            }
            Err(e) => Err(match e {
                AllgatherError::AlreadyContributed | AllgatherError::Finished => {
                    SendError::DuplicateId(id)
                }
                AllgatherError::TooLarge { len, max } => SendError::TooLarge { len, max },
                AllgatherError::TooMany => {
                    SendError::Busy(crate::error::Limit::CollectivesInFlight)
                }
                AllgatherError::Dead => SendError::ShutDown,
            }),
        }
    }

    /// This daemon's contribution to group collective `op`, once wired; `token` names it in
    /// the [`Output::GroupDone`] that ends it; `call`: what this member called (carried in
    /// front of the data, see [`GroupCall`]).
    pub(super) fn group_contribute(
        &mut self,
        op: GroupOp,
        data: Bytes,
        token: u64,
        call: GroupCall,
    ) -> Result<(), SendError> {
        let seq = op.seq;
        let mut tagged = bytes::BytesMut::with_capacity(GROUP_CALL_LEN + data.len());
        tagged.extend_from_slice(&call.tag());
        tagged.extend_from_slice(&data);
        match self.group.contribute(op.clone(), tagged.freeze()) {
            Ok(()) => {
                self.group_tokens.insert(op, (token, call));
                Ok(())
            }
            Err(e) => Err(match e {
                GroupContributeError::NotMember => SendError::NotMember(self.me),
                GroupContributeError::RankOutOfRange(rank) => SendError::RankOutOfRange {
                    rank,
                    size: self.size,
                },
                GroupContributeError::AlreadyContributed | GroupContributeError::Finished => {
                    SendError::DuplicateId(seq)
                }
                GroupContributeError::TooLarge { len, max } => SendError::TooLarge { len, max },
                GroupContributeError::TooMany => {
                    SendError::Busy(crate::error::Limit::GroupCollectivesInFlight)
                }
                GroupContributeError::Dead => SendError::ShutDown,
            }),
        }
    }

    /// A `Grpcomm` frame from neighbour `from` (not from a failed rank).
    pub(super) fn on_grpcomm_frame(
        &mut self,
        from: Rank,
        h: Header,
        payload: Bytes,
    ) -> Result<(), String> {
        if self.stopping.is_some() {
            return Ok(());
        }
        if h.origin != from || h.dst != self.me || h.tag != 0 {
            return Err(format!(
                "collective frame from {} to {} with tag {} on the link with rank {from}",
                h.origin, h.dst, h.tag
            ));
        }
        // Kinds 1..=7 are xcast's, 16..=18 the allgather's, 32 and up the groups'
        // (`grpcomm::wire`).
        let bad = if payload.first().is_some_and(|k| *k >= GROUP_KIND_MIN) {
            match GroupMsg::decode(self.size, payload) {
                Ok(m) => {
                    self.group.handle_msg(&self.routing, from, m);
                    None
                }
                Err(e) => Some(e.to_string()),
            }
        } else if payload.first().is_some_and(|k| *k >= 16) {
            match AllgatherMsg::decode(self.size, payload) {
                Ok(m) => {
                    self.allgather.handle_msg(from, m);
                    None
                }
                Err(e) => Some(e.to_string()),
            }
        } else {
            match XcastMsg::decode(self.size, payload) {
                Ok(
                    m @ (XcastMsg::Op(_)
                    | XcastMsg::Ack { .. }
                    | XcastMsg::Sync { .. }
                    | XcastMsg::Resume { .. }),
                ) => {
                    self.xcast.handle_msg(from, m);
                    None
                }
                Ok(_) => Some("a request, done or refusal travels over RELM".to_string()),
                Err(e) => Some(e.to_string()),
            }
        };
        match bad {
            None => Ok(()),
            Some(why) => {
                self.counters.grpcomm_malformed += 1;
                Err(format!("collective frame: {why}"))
            }
        }
    }

    /// A request (at rank 0), done or refusal (at an originator) that RELM posted here.
    pub(super) fn on_grpcomm_reliable(&mut self, msg: Message) {
        let decoded = XcastMsg::decode(self.size, msg.payload);
        let ok = match (&decoded, msg.tag) {
            (Ok(XcastMsg::Request(q)), TAG_XCAST_REQUEST) if self.me == 0 => {
                // Only the runtime broadcasts with runtime tags, and only from rank 0.
                q.tag >= TAG_USER_MIN
            }
            (Ok(XcastMsg::Done { .. } | XcastMsg::Refused { .. }), TAG_XCAST_DONE) => true,
            _ => false,
        };
        match decoded {
            Ok(m) if ok => self.xcast.handle_msg(msg.origin, m),
            other => {
                self.counters.grpcomm_malformed += 1;
                log::warn!(
                    "rank {}: dropped a collective message (tag {}) from rank {}: {}",
                    self.me,
                    msg.tag,
                    msg.origin,
                    match other {
                        Err(e) => e.to_string(),
                        Ok(m) => format!("unexpected {m:?}"),
                    }
                );
            }
        }
    }

    /// Every repair, in order: after the messaging layer, before RELM.
    pub(super) fn grpcomm_repair(&mut self, status: &RecoveryStatus) {
        self.xcast.handle_repair(status);
        self.allgather.handle_repair(status);
        self.group.handle_repair(status);
        self.modex_failed(&status.newly_failed);
        self.clients_failed(&status.newly_failed);
    }

    /// The link with tree neighbour `peer` may have lost collective messages (its connection
    /// came back, or the driver dropped frames for it at a full queue and now has room): both
    /// cores re-state what the neighbour may have missed.
    pub fn handle_link_restate(&mut self, _now: Instant, peer: Rank) {
        if !self.is_wired() || self.routing.is_failed(peer) || !self.is_neighbour(peer) {
            return;
        }
        self.counters.grpcomm_resyncs += 1;
        log::debug!("rank {}: re-stating collectives with rank {peer}", self.me);
        self.xcast.handle_link_up(peer);
        self.allgather.handle_link_up(peer);
        self.group.handle_link_up(peer);
    }

    /// Rank 0: broadcasts one of the runtime's own notices. A fault confirmation or the DVM
    /// shutdown goes out at once, past a full window (`originate_urgent`: completions wait for
    /// the confirmation, so it must never wait for them; one per confirmation of new deaths).
    /// Anything else (an allgather result) waits, in order, until the window has room.
    pub(super) fn originate_runtime(&mut self, tag: Tag, payload: Bytes) {
        if tag == TAG_FAULT_CONFIRM || tag == TAG_SHUTDOWN {
            if let Err(e) = self.xcast.originate_urgent(tag, payload) {
                crate::bug!("rank 0: cannot broadcast runtime notice {tag}: {e}");
            }
            return;
        }
        if self.xcast_deferred.is_empty() {
            match self.xcast.originate(tag, payload.clone()) {
                Ok(_) => return,
                Err(XcastError::Busy) => {}
                Err(e) => {
                    log::error!("rank 0: cannot broadcast runtime notice {tag}: {e}");
                    return;
                }
            }
        }
        if self.xcast_deferred.len() >= limits::GRPCOMM_DEFERRED_MAX {
            // Results are at most one per tracked collective (see `limits`).
            crate::bug!("rank 0: too many runtime notices waiting; dropped one (tag {tag})");
            self.counters.dropped_queue_full += 1;
            return;
        }
        log::debug!("rank 0: broadcast window full; runtime notice {tag} waits");
        self.xcast_deferred.push_back((tag, payload));
    }

    /// Rank 0: the notices that waited for room, in order. Returns whether any went out.
    fn retry_deferred(&mut self) -> bool {
        let mut any = false;
        while let Some((tag, payload)) = self.xcast_deferred.pop_front() {
            match self.xcast.originate(tag, payload.clone()) {
                Ok(_) => any = true,
                Err(XcastError::Busy) => {
                    self.xcast_deferred.push_front((tag, payload));
                    break;
                }
                Err(e) => log::error!("rank 0: cannot broadcast runtime notice {tag}: {e}"),
            }
        }
        any
    }

    /// A tree message for neighbour `to`.
    fn send_tree(&mut self, to: Rank, payload: Payload) {
        if to == self.me || to >= self.size || self.routing.is_failed(to) {
            log::debug!("rank {}: collective frame for rank {to} dropped", self.me);
            return;
        }
        let h = self.header(Kind::Grpcomm, self.me, to, 0, payload.len());
        self.transmit(to, h, payload, None);
    }

    fn send_xcast(&mut self, now: Instant, t: Transmit<XcastMsg>) {
        match &t.msg {
            XcastMsg::Request(_) => {
                self.runtime_reliable(now, t.to, TAG_XCAST_REQUEST, t.msg.encode())
            }
            XcastMsg::Done { .. } | XcastMsg::Refused { .. } => {
                self.runtime_reliable(now, t.to, TAG_XCAST_DONE, t.msg.encode())
            }
            msg => {
                if matches!(msg, XcastMsg::Sync { .. }) {
                    self.tell_child(t.to);
                }
                let payload = match msg.encode_parts() {
                    (head, Some(body)) => Payload::two(head, body),
                    (head, None) => head.into(),
                };
                self.send_tree(t.to, payload);
            }
        }
    }

    fn send_allgather(&mut self, t: Transmit<AllgatherMsg>) {
        if matches!(t.msg, AllgatherMsg::Sync { .. }) {
            self.tell_child(t.to);
        }
        let mut bytes = t.msg.encode();
        if bytes.len() > self.msg_max_bytes
            && let AllgatherMsg::Contribution(c) = &t.msg
        {
            // Larger than a frame may be: the collective overflows instead.
            log::warn!(
                "rank {}: allgather {}: the subtree's contribution ({} bytes) exceeds \
                 msg_max_bytes; the collective overflows",
                self.me,
                c.id,
                bytes.len()
            );
            bytes = AllgatherMsg::Contribution(Contribution {
                id: c.id,
                digest: c.digest,
                overflowed: true,
                entries: Vec::new(),
                excluded: Vec::new(),
                excused: c.excused.clone(),
                returned: c.returned,
            })
            .encode();
        }
        self.send_tree(t.to, bytes.into());
    }

    /// Drains both cores (and what waited for room) until nothing comes out. Once per pump,
    /// before RELM's (the cores' requests and dones are RELM messages).
    pub(super) fn pump_grpcomm(&mut self, now: Instant) {
        if self.stopping.is_some() {
            return;
        }
        // Bounded: each round moves something; the cores produce nothing without input.
        for _ in 0..limits::PUMP_ROUNDS_MAX {
            let mut any = self.me == 0 && self.retry_deferred();
            while let Some(t) = self.xcast.poll_transmit() {
                any = true;
                self.send_xcast(now, t);
            }
            // Requests, dones and refusals ride RELM: while its window is full they wait in
            // the core (where rank 0's count against its own window).
            while self.relm.has_runtime_room()
                && let Some(t) = self.xcast.poll_notice()
            {
                any = true;
                self.send_xcast(now, t);
            }
            while let Some(t) = self.allgather.poll_transmit() {
                any = true;
                self.send_allgather(t);
            }
            while let Some(t) = self.group.poll_transmit(&self.routing) {
                any = true;
                self.send_group(t);
            }
            while let Some(e) = self.xcast.poll_event() {
                any = true;
                self.xcast_event(now, e);
                // A result this operation carried is delivered before whatever the next one
                // does (a shutdown right after a barrier must not fail the barrier).
                self.drain_allgather_events();
                if self.stopping.is_some() {
                    return;
                }
            }
            any |= self.drain_allgather_events();
            while let Some(GroupEvent::Done { op, result }) = self.group.poll_event() {
                any = true;
                self.group_done(op, result);
            }
            if !any || self.stopping.is_some() {
                return;
            }
        }
        crate::bug!("rank {}: the collectives' pump did not settle", self.me);
    }

    fn send_group(&mut self, t: Transmit<GroupMsg>) {
        // No adoption notice before a group `Sync` (unlike the allgather's): the child answers
        // it under any view, so it need not learn the parent's failures first.
        // A result goes to every interested child, one after the other: it is encoded once
        // and the children's frames share the bytes (a full fence's result holds every
        // member's data).
        if let GroupMsg::Result { op, lost, .. } = &t.msg
            && let Some((cached_op, cached_lost, bytes)) = &self.group_encoded
            && cached_op == op
            && cached_lost == lost
        {
            let bytes = bytes.clone();
            self.send_tree(t.to, bytes.into());
            return;
        }
        let result_of = match &t.msg {
            GroupMsg::Result { op, lost, .. } => Some((op.clone(), *lost)),
            _ => None,
        };
        let mut bytes = t.msg.encode();
        if bytes.len() > self.msg_max_bytes {
            // Larger than a frame may be: the collective overflows instead.
            let overflowed = GroupData {
                overflowed: true,
                ..GroupData::default()
            };
            let smaller = match t.msg {
                // The excused members go up even so: the daemons above must not wait for them.
                GroupMsg::Contribution { op, digest, data } => GroupMsg::Contribution {
                    op,
                    digest,
                    data: GroupData {
                        excused: data.excused,
                        ..overflowed
                    },
                },
                GroupMsg::Result { op, lost, .. } => GroupMsg::Result {
                    op,
                    lost,
                    data: overflowed,
                },
                other => other,
            };
            log::warn!(
                "rank {}: a group collective's message ({} bytes) exceeds msg_max_bytes; the \
                 collective overflows",
                self.me,
                bytes.len()
            );
            bytes = smaller.encode();
        }
        if let Some((op, lost)) = result_of {
            self.group_encoded = Some((op, lost, bytes.clone()));
        }
        self.send_tree(t.to, bytes.into());
    }

    /// A group collective this daemon contributed to is over here.
    fn group_done(&mut self, op: GroupOp, result: Result<AllgatherResult, GroupFailure>) {
        let Some((token, call)) = self.group_tokens.remove(&op) else {
            crate::bug!(
                "rank {}: a group collective ended that nobody waits for",
                self.me
            );
            return;
        };
        self.counters.group_results += 1;
        let result = result
            .map_err(|e| match e {
                GroupFailure::Lost => SendError::ResultLost,
            })
            .and_then(untag);
        if let (GroupCall::Fence(mode), Ok(result)) = (call, &result) {
            self.fenced(&op.group, mode, result);
        }
        self.out.push_back(Output::GroupDone { token, result });
    }

    fn drain_allgather_events(&mut self) -> bool {
        let mut any = false;
        while let Some(e) = self.allgather.poll_event() {
            any = true;
            self.allgather_event(e);
        }
        any
    }

    fn xcast_event(&mut self, now: Instant, e: XcastEvent) {
        match e {
            XcastEvent::Deliver {
                first,
                op,
                originator,
                tag,
                payload,
                parts,
            } => {
                if self.trace {
                    self.out.push_back(Output::Trace(Trace::Broadcast {
                        first,
                        op,
                        originator,
                        tag,
                        payload: payload.clone(),
                    }));
                }
                self.xcast_deliver(now, (op, originator, tag), payload, parts)
            }
            // Rank 0's own notices have no entry: only user broadcasts are counted.
            XcastEvent::Completed { request, op } => {
                self.rejoin_completed(op);
                self.leave_completed(op);
                if let Some(token) = self.bcast_tokens.remove(&request) {
                    self.counters.xcast_completed += 1;
                    self.broadcast_finished(token, Some(op), Ok(()));
                }
            }
            XcastEvent::Refused { request } => {
                if let Some(token) = self.bcast_tokens.remove(&request) {
                    self.counters.xcast_refused += 1;
                    self.broadcast_finished(token, None, Err(xcast_error(XcastError::Busy)));
                }
            }
        }
    }

    fn broadcast_finished(
        &mut self,
        token: Option<u64>,
        op: Option<u64>,
        result: Result<(), SendError>,
    ) {
        let Some(token) = token else {
            return;
        };
        if self.trace {
            self.out
                .push_back(Output::Trace(Trace::BroadcastFinished { token, op }));
        }
        self.done(token, result);
    }

    /// A broadcast delivered here: operation `op` (its last part) of `originator` under `tag`,
    /// and its parts when it came in more than one (see `XcastEvent::Deliver`).
    fn xcast_deliver(
        &mut self,
        now: Instant,
        (op, originator, tag): (u64, Rank, Tag),
        payload: Bytes,
        parts: Vec<Bytes>,
    ) {
        if tag >= TAG_USER_MIN {
            self.deliver(
                now,
                Message {
                    origin: originator,
                    tag,
                    payload,
                },
            );
            return;
        }
        if originator != 0 {
            log::warn!(
                "rank {}: broadcast {op} from rank {originator} with runtime tag {tag} ignored",
                self.me
            );
            return;
        }
        match tag {
            TAG_FAULT_CONFIRM => {
                if self.me != 0 {
                    self.on_confirm(now, &payload);
                }
            }
            TAG_ALLGATHER_RESULT => {
                // Its parts, when split, are what the result cache keeps (not a copy).
                let decoded = if parts.is_empty() {
                    self.allgather.handle_result_bytes(payload)
                } else {
                    self.allgather.handle_result_parts(payload, parts)
                };
                if let Err(e) = decoded {
                    self.counters.grpcomm_malformed += 1;
                    log::warn!(
                        "rank {}: bad allgather result in broadcast {op}: {e}",
                        self.me
                    );
                }
            }
            TAG_SHUTDOWN => {
                log::info!("rank {}: the DVM is shutting down", self.me);
                let reason = if self.me == 0 {
                    StopReason::Requested
                } else {
                    StopReason::DvmShutdown
                };
                self.begin_stop(now, reason);
            }
            t => log::warn!(
                "rank {}: broadcast {op} with unknown runtime tag {t} ignored",
                self.me
            ),
        }
    }

    fn allgather_event(&mut self, e: AllgatherEvent) {
        match e {
            AllgatherEvent::ResultReady { result } => {
                let mut bytes = result.encode();
                if bytes.len() > broadcast_max(self.msg_max_bytes) {
                    log::warn!(
                        "rank 0: allgather {}: the result ({} bytes) exceeds the largest \
                         broadcast; the collective overflows",
                        result.id,
                        bytes.len()
                    );
                    bytes = AllgatherResult {
                        id: result.id,
                        overflowed: true,
                        ..AllgatherResult::default()
                    }
                    .encode();
                }
                self.originate_runtime(TAG_ALLGATHER_RESULT, bytes);
            }
            AllgatherEvent::AllgatherDone { result } => {
                self.counters.allgather_results += 1;
                self.gathering.remove(&result.id);
                self.out.push_back(Output::AllgatherDone {
                    id: result.id,
                    result: Ok(result),
                });
            }
            AllgatherEvent::AllgatherLost { id } => {
                self.gathering.remove(&id);
                self.out.push_back(Output::AllgatherDone {
                    id,
                    result: Err(SendError::ResultLost),
                });
            }
        }
    }

    /// The collective counters of a `Counters` snapshot.
    pub(super) fn collective_counters(&self, c: &mut crate::counters::Counters) {
        let x = self.xcast.stats();
        c.xcast_forwarded = x.forwarded;
        c.xcast_delivered = x.delivered;
        c.xcast_requests_refused = x.refused;
        c.xcast_requests_held = x.held;
        c.xcast_duplicates = x.duplicates;
        c.xcast_not_from_parent = x.not_from_parent;
        c.xcast_resumes = x.resumes_sent;
        c.xcast_dropped_full = x.dropped_full;
        c.xcast_stale = x.stale.saturating_add(x.acks_other_view);
        c.xcast_retained = self.xcast.retained() as u64;
        c.xcast_outstanding = self.xcast.outstanding() as u64;
        let a = self.allgather.stats();
        c.allgather_sent = a.sent;
        c.allgather_received = a.received;
        c.allgather_other_view = a.other_view;
        c.allgather_late = a.late;
        c.allgather_overflowed = a.overflowed;
        c.allgather_dropped_untracked = a.dropped_untracked;
        c.allgather_tracked = self.allgather.tracked() as u64;
        let g = self.group.stats();
        c.group_sent = g.sent;
        c.group_received = g.received;
        c.group_results_sent = g.results_sent;
        c.group_answered_late = g.answered_late.saturating_add(g.answered_lost);
        c.group_dropped_untracked = g.dropped_untracked;
        c.group_tracked = self.group.tracked() as u64;
        let m = self.modex.stats();
        c.modex_hits = m.hits;
        c.modex_fetches = m.fetches;
        c.modex_served = m.served;
        c.modex_evicted = m.evicted;
    }
}
