//! The loop's side of the fault-tolerant collectives. The protocols are the sans-IO cores in
//! `src/grpcomm/` (`Xcast`, `Allgather`; its `mod.rs` says how to drive them); this file feeds
//! them (API calls, frames, RELM messages, repairs, links that came back) and carries out what
//! they ask for.
//!
//! * **Tree messages** (xcast `Op`/`Ack`/`Sync`/`Resume`, allgather `Contribution`/`Sync`) go
//!   to the neighbour as `Kind::Grpcomm` frames (origin = this daemon, dst = the neighbour,
//!   tag 0). An `Op` is two payload parts, its 29-byte header and the broadcast's shared
//!   payload: one `Bytes` for every child, never copied. A full queue drops the frame (counted
//!   in `dropped_queue_full`) and marks the link: once its queue has drained to half, the cores
//!   re-state what the neighbour may have missed (`handle_link_up`), as after a reconnection.
//! * **Requests, dones and refusals** (originator <-> rank 0, possibly several hops) ride RELM
//!   with the runtime tags `TAG_XCAST_REQUEST` and `TAG_XCAST_DONE`: reliable, in order per
//!   origin. When RELM's window is full they wait in a bounded backlog, retried every turn.
//! * **Pump**, once per loop turn before RELM's: `poll_transmit` of both cores until `None`,
//!   then `poll_event` until `None`, repeated while anything came out. Transmits before events
//!   is what makes a daemon forward an operation to its children before it delivers it.
//! * **Deliveries**: user tags go to receive matching (origin = the originator); rank 0's own
//!   operations carry fault confirmations, allgather results and the DVM shutdown.
//! * **Rank 0's own notices**: fault confirmations and the shutdown pass a full window (the
//!   window drains only once every daemon has rank 0's failed set, which the confirmation
//!   brings); allgather results that find it full wait (bounded, in order) and are retried
//!   every turn, and meanwhile rank 0's user broadcasts get `Busy`.
//! * **Repairs**: every `RecoveryStatus`, in order, after the messaging layer and before RELM
//!   (`after_repair`), and the wire-up table's missing ranks.

use super::super::caddy::{AllgatherCompletion, Completion};
use super::{EventLoop, Wire, complete};
use crate::Rank;
use crate::error::SendError;
use crate::faults::notice::TAG_FAULT_CONFIRM;
use crate::grpcomm::{
    AllgatherError, AllgatherEvent, AllgatherMsg, AllgatherResult, Contribution, OP_HEADER_LEN,
    TAG_ALLGATHER_RESULT, TAG_XCAST_DONE, TAG_XCAST_REQUEST, Transmit, XcastError, XcastEvent,
    XcastLimits, XcastMsg,
};
use crate::limits;
use crate::oob::header::{Header, Kind};
use crate::oob::send_queue::Payload;
use crate::rml::{Message, TAG_USER_MIN, Tag};
use crate::routed::RecoveryStatus;
use bytes::Bytes;
use std::time::Instant;

use super::super::handle::StopReason;
use super::super::wireup::TAG_SHUTDOWN;

/// The largest broadcast payload with frames of at most `msg_max_bytes`: an `Op` adds its
/// header, and rank 0 keeps at most `XCAST_INFLIGHT_MAX_BYTES` in flight.
pub(crate) fn broadcast_max(msg_max_bytes: usize) -> usize {
    msg_max_bytes
        .saturating_sub(OP_HEADER_LEN)
        .min(limits::XCAST_INFLIGHT_MAX_BYTES)
}

/// The xcast bounds of a DVM whose frames are at most `msg_max_bytes` (every daemon of a DVM
/// has the same configuration, hence the same bounds): the largest payload is what fits in a
/// frame behind an `Op`'s header.
pub(crate) fn xcast_limits(msg_max_bytes: usize) -> XcastLimits {
    XcastLimits {
        payload: broadcast_max(msg_max_bytes),
        ..XcastLimits::default()
    }
}

fn xcast_error(e: XcastError) -> SendError {
    match e {
        XcastError::Busy => SendError::Busy("rank 0's broadcast window"),
        XcastError::TooManyOutstanding => SendError::Busy("this daemon's outstanding broadcasts"),
        XcastError::TooLarge { len, max } => SendError::TooLarge { len, max },
        XcastError::Dead => SendError::ShutDown,
    }
}

impl EventLoop {
    /// `Handle::broadcast`, once wired.
    pub(super) fn broadcast(&mut self, tag: Tag, payload: Bytes, done: Option<Completion>) {
        self.counters.sent += 1;
        if self.me == 0 && !self.xcast_deferred.is_empty() {
            // Rank 0's own notices go first.
            complete(done, Err(xcast_error(XcastError::Busy)));
            return;
        }
        match self.xcast.originate(tag, payload) {
            Ok(request) => {
                self.bcast_done.insert(request, done);
            }
            Err(e) => complete(done, Err(xcast_error(e))),
        }
    }

    /// `Handle::allgather` (and `barrier`), once wired.
    pub(super) fn allgather(&mut self, id: u64, data: Bytes, done: AllgatherCompletion) {
        match self.allgather.contribute(id, data) {
            Ok(()) => {
                self.ag_done.insert(id, done);
            }
            Err(e) => done(Err(match e {
                AllgatherError::AlreadyContributed | AllgatherError::Finished => {
                    SendError::DuplicateId(id)
                }
                AllgatherError::TooLarge { len, max } => SendError::TooLarge { len, max },
                AllgatherError::TooMany => SendError::Busy("the collectives in flight"),
                AllgatherError::Dead => SendError::ShutDown,
            })),
        }
    }

    /// A `Grpcomm` frame from neighbour `from` (not from a failed rank).
    pub(super) fn on_grpcomm_frame(&mut self, tok: usize, from: Rank, h: Header, payload: Bytes) {
        if self.stopping.is_some() {
            return;
        }
        if h.origin != from || h.dst != self.me || h.tag != 0 {
            self.protocol_error(
                tok,
                &format!(
                    "collective frame from {} to {} with tag {} on the link with rank {from}",
                    h.origin, h.dst, h.tag
                ),
            );
            return;
        }
        // Kinds 1..=7 are xcast's, 16 and up allgather's (`grpcomm::wire`).
        let bad = if payload.first().is_some_and(|k| *k >= 16) {
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
        if let Some(why) = bad {
            self.counters.grpcomm_malformed += 1;
            self.protocol_error(tok, &format!("collective frame: {why}"));
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
        let routing = &self.routing;
        self.grpcomm_resync.retain(|r| !routing.is_failed(*r));
    }

    /// The link with tree neighbour `peer` may have lost collective messages (its connection
    /// came back, or frames for it were dropped at a full queue): both cores re-state.
    pub(super) fn grpcomm_link_up(&mut self, peer: Rank) {
        if !matches!(self.wire, Wire::Wired) || self.routing.is_failed(peer) {
            return;
        }
        self.counters.grpcomm_resyncs += 1;
        log::debug!("rank {}: re-stating collectives with rank {peer}", self.me);
        self.xcast.handle_link_up(peer);
        self.allgather.handle_link_up(peer);
    }

    /// Links that dropped collective frames, re-stated once their queue is down to half.
    pub(super) fn check_grpcomm_resync(&mut self) {
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
                    Some(c) => c.queue.queued_bytes() <= c.queue.max_bytes() / 2,
                    None => false,
                }
            })
            .collect();
        for r in ready {
            self.grpcomm_resync.remove(&r);
            self.grpcomm_link_up(r);
        }
    }

    /// Rank 0: broadcasts one of the runtime's own notices. A fault confirmation or the DVM
    /// shutdown goes out at once, past a full window (`originate_urgent`: completions wait for
    /// the confirmation, so it must never wait for them; one per confirmation of new deaths).
    /// Anything else (an allgather result) waits, in order, until the window has room.
    pub(super) fn originate_runtime(&mut self, tag: Tag, payload: Bytes) {
        if tag == TAG_FAULT_CONFIRM || tag == TAG_SHUTDOWN {
            if let Err(e) = self.xcast.originate_urgent(tag, payload) {
                log::error!("rank 0: cannot broadcast runtime notice {tag}: {e}");
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
            self.counters.dropped_queue_full += 1;
            log::error!("rank 0: too many runtime notices waiting; dropped one (tag {tag})");
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

    /// A collective message for rank `to` over RELM (or the backlog if RELM's window is full).
    fn grpcomm_reliable(&mut self, to: Rank, tag: Tag, payload: Bytes) {
        if !self.relm_backlog.is_empty() {
            self.backlog(to, tag, payload);
            return;
        }
        if let Err((tag, payload)) = self.try_reliable(to, tag, payload) {
            self.backlog(to, tag, payload);
        }
    }

    /// Hands one message to RELM; gives it back if RELM's window is full.
    fn try_reliable(&mut self, to: Rank, tag: Tag, payload: Bytes) -> Result<(), (Tag, Bytes)> {
        if to == self.me {
            self.on_grpcomm_reliable(Message {
                origin: to,
                tag,
                payload,
            });
            return Ok(());
        }
        let token = self.relm_next_token;
        self.relm_next_token = self.relm_next_token.wrapping_add(1);
        let res = self.relm.send(
            Instant::now(),
            &self.routing,
            to,
            tag,
            payload.clone(),
            token,
        );
        match res {
            Ok(()) => Ok(()),
            Err(SendError::Busy(_)) => Err((tag, payload)),
            Err(e) => {
                // To a dead rank: its requests and broadcasts died with it.
                log::debug!("rank {}: collective message to {to} not sent: {e}", self.me);
                Ok(())
            }
        }
    }

    fn backlog(&mut self, to: Rank, tag: Tag, payload: Bytes) {
        if self.relm_backlog.len() >= limits::GRPCOMM_RELIABLE_BACKLOG_MAX {
            self.counters.dropped_queue_full += 1;
            log::error!(
                "rank {}: too many collective messages wait for RELM; dropped one for {to}",
                self.me
            );
            return;
        }
        self.relm_backlog.push_back((to, tag, payload));
    }

    /// Retries what waited for RELM's window, in order.
    fn retry_backlog(&mut self) {
        while let Some((to, tag, payload)) = self.relm_backlog.pop_front() {
            if let Err((tag, payload)) = self.try_reliable(to, tag, payload) {
                self.relm_backlog.push_front((to, tag, payload));
                break;
            }
        }
    }

    /// A tree message for neighbour `to`.
    fn send_tree(&mut self, to: Rank, payload: Payload) {
        if to == self.me || to >= self.size || self.routing.is_failed(to) {
            log::debug!("rank {}: collective frame for rank {to} dropped", self.me);
            return;
        }
        let h = self.header(Kind::Grpcomm, self.me, to, 0, payload.len());
        if !self.enqueue(to, h, payload, None) {
            self.grpcomm_resync.insert(to);
        }
    }

    fn send_xcast(&mut self, t: Transmit<XcastMsg>) {
        match &t.msg {
            XcastMsg::Request(_) => self.grpcomm_reliable(t.to, TAG_XCAST_REQUEST, t.msg.encode()),
            XcastMsg::Done { .. } | XcastMsg::Refused { .. } => {
                self.grpcomm_reliable(t.to, TAG_XCAST_DONE, t.msg.encode())
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
        if bytes.len() > self.cfg.msg_max_bytes as usize
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
            })
            .encode();
        }
        self.send_tree(t.to, bytes.into());
    }

    /// Drains both cores (and what waited for room) until nothing comes out. Once per loop turn,
    /// before RELM's pump (the cores' requests and dones are RELM messages).
    pub(super) fn pump_grpcomm(&mut self) {
        if self.stopping.is_some() {
            return;
        }
        self.retry_backlog();
        loop {
            let mut any = self.me == 0 && self.retry_deferred();
            while let Some(t) = self.xcast.poll_transmit() {
                any = true;
                self.send_xcast(t);
            }
            while let Some(t) = self.allgather.poll_transmit() {
                any = true;
                self.send_allgather(t);
            }
            while let Some(e) = self.xcast.poll_event() {
                any = true;
                self.xcast_event(e);
                if self.stopping.is_some() {
                    return;
                }
            }
            while let Some(e) = self.allgather.poll_event() {
                any = true;
                self.allgather_event(e);
            }
            if !any || self.stopping.is_some() {
                return;
            }
        }
    }

    fn xcast_event(&mut self, e: XcastEvent) {
        match e {
            XcastEvent::Deliver {
                op,
                originator,
                tag,
                payload,
            } => self.xcast_deliver(op, originator, tag, payload),
            // Rank 0's own notices have no entry: only user broadcasts are counted.
            XcastEvent::Completed { request, .. } => {
                if let Some(done) = self.bcast_done.remove(&request) {
                    self.counters.xcast_completed += 1;
                    complete(done, Ok(()));
                }
            }
            XcastEvent::Refused { request } => {
                if let Some(done) = self.bcast_done.remove(&request) {
                    self.counters.xcast_refused += 1;
                    complete(done, Err(xcast_error(XcastError::Busy)));
                }
            }
        }
    }

    fn xcast_deliver(&mut self, op: u64, originator: Rank, tag: Tag, payload: Bytes) {
        if tag >= TAG_USER_MIN {
            self.deliver(Message {
                origin: originator,
                tag,
                payload,
            });
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
                    self.on_confirm(&payload);
                }
            }
            TAG_ALLGATHER_RESULT => {
                if let Err(e) = self.allgather.handle_result_bytes(payload) {
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
                self.begin_stop(reason);
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
                if bytes.len() > broadcast_max(self.cfg.msg_max_bytes as usize) {
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
                if let Some(done) = self.ag_done.remove(&result.id) {
                    done(Ok(result));
                }
            }
        }
    }

    /// Fails every broadcast and collective still waiting here (the daemon is stopping).
    pub(super) fn fail_collective_completions(&mut self, err: SendError) {
        let mut requests: Vec<u64> = self.bcast_done.keys().copied().collect();
        requests.sort_unstable();
        for r in requests {
            if let Some(done) = self.bcast_done.remove(&r) {
                complete(done, Err(err.clone()));
            }
        }
        let mut ids: Vec<u64> = self.ag_done.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            if let Some(done) = self.ag_done.remove(&id) {
                done(Err(err.clone()));
            }
        }
    }

    /// The collective counters of a `Counters` snapshot.
    pub(super) fn collective_counters(&self, c: &mut crate::counters::Counters) {
        let x = self.xcast.stats();
        c.xcast_forwarded = x.forwarded;
        c.xcast_delivered = x.delivered;
        c.xcast_requests_refused = x.refused;
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
    }
}
