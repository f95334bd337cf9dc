//! The loop's side of reliable messaging. The protocol is the sans-IO core in `src/relm/`; this
//! file feeds it (reliable sends, `RelmData` and `Relm` frames, repairs, re-established links,
//! time) and carries out what it asks for (frames to neighbours, completions, its timer).
//!
//! * A reliable send to another rank goes to `Relm::send` with a token; its completion waits
//!   in `relm_done` (at most `relm_unacked_max` entries: `Relm::send` refuses beyond that)
//!   until RELM reports the outcome. A reliable send to this daemon is a local self-send.
//! * A message RELM posts at this daemon goes to `Matcher::try_handle_message`, which refuses
//!   rather than evict a held message when the unmatched list is full: RELM then does not
//!   acknowledge it and the origin replays it later. Posting only collects the matcher's
//!   decisions; receive callbacks run after RELM's call has returned.
//! * `pump_relm` runs once per loop turn, after commands, socket events and timers: RELM's
//!   frames are queued to their neighbours without a completion (a full queue drops and
//!   counts, as for relayed frames; RELM retransmits), its completions run, and one timer
//!   (`TimerKind::Relm`) is armed for its next deadline unless one at or before it is armed.

use super::super::caddy::Completion;
use super::super::timers::TimerKind;
use super::{EventLoop, complete};
use crate::Rank;
use crate::error::SendError;
use crate::oob::header::{Header, Kind};
use crate::relm::wire::{pack_seq, unpack_seq};
use crate::relm::{DataFrame, Event, Transmit};
use crate::rml::{Dispatch, Message, TAG_USER_MIN, Tag};
use crate::routed::RecoveryStatus;
use bytes::Bytes;
use std::time::Instant;

impl EventLoop {
    /// A reliable send originated here (once wired).
    pub(super) fn send_reliable(
        &mut self,
        dst: Rank,
        tag: Tag,
        payload: Bytes,
        done: Option<Completion>,
    ) {
        if dst == self.me {
            self.local.push_back(Message {
                origin: self.me,
                tag,
                payload,
            });
            complete(done, Ok(()));
            return;
        }
        let token = self.relm_next_token;
        self.relm_next_token = self.relm_next_token.wrapping_add(1);
        match self
            .relm
            .send(Instant::now(), &self.routing, dst, tag, payload, token)
        {
            Ok(()) => {
                if let Some(done) = done {
                    self.relm_done.insert(token, done);
                }
            }
            Err(e) => {
                log::debug!("rank {}: reliable send to {dst} refused: {e}", self.me);
                complete(done, Err(e));
            }
        }
    }

    /// A `RelmData` frame from neighbour `from` (already checked: not from a failed rank, ranks
    /// in range). A stopping daemon ignores RELM input: it sends nothing more, so it must not
    /// post what it could not acknowledge (the origin then hears node-down, truthfully).
    pub(super) fn on_relm_data(&mut self, tok: usize, from: Rank, h: Header, payload: Bytes) {
        if self.stopping.is_some() {
            return;
        }
        if h.tag < TAG_USER_MIN && !RELIABLE_RUNTIME_TAGS.contains(&h.tag) {
            self.protocol_error(
                tok,
                &format!("reliable message with reserved tag {}", h.tag),
            );
            return;
        }
        let (uid, prev) = unpack_seq(h.seq);
        let d = DataFrame {
            origin: h.origin,
            dst: h.dst,
            tag: h.tag,
            uid,
            prev,
            payload,
        };
        let refused = self.relm.stats().refused;
        let mut ready = Vec::new();
        let mut runtime = Vec::new();
        let matcher = &mut self.matcher;
        let mut post = |origin: Rank, tag: Tag, payload: Bytes| {
            post_to(matcher, &mut ready, &mut runtime, origin, tag, payload)
        };
        let res = self
            .relm
            .handle_data(Instant::now(), &self.routing, from, d, &mut post);
        self.posted_by_relm(ready, runtime, refused);
        if let Err(e) = res {
            self.protocol_error(tok, &format!("reliable message: {e}"));
        }
    }

    /// A `Relm` control frame from neighbour `from`.
    pub(super) fn on_relm_control(&mut self, tok: usize, from: Rank, h: Header, payload: Bytes) {
        if self.stopping.is_some() {
            return;
        }
        if h.origin != from || h.dst != self.me {
            self.protocol_error(
                tok,
                &format!(
                    "RELM control frame from {} to {} on the link with rank {from}",
                    h.origin, h.dst
                ),
            );
            return;
        }
        let refused = self.relm.stats().refused;
        let mut ready = Vec::new();
        let mut runtime = Vec::new();
        let matcher = &mut self.matcher;
        let mut post = |origin: Rank, tag: Tag, payload: Bytes| {
            post_to(matcher, &mut ready, &mut runtime, origin, tag, payload)
        };
        let res =
            self.relm
                .handle_control(Instant::now(), &self.routing, from, &payload, &mut post);
        self.posted_by_relm(ready, runtime, refused);
        if let Err(e) = res {
            self.protocol_error(tok, &format!("RELM control: {e}"));
        }
    }

    /// Runs the receive callbacks of what RELM posted, now that its call has returned, and
    /// warns (at the first of each power of two) when the full unmatched list refused some.
    fn posted_by_relm(&mut self, ready: Vec<Dispatch>, runtime: Vec<Message>, refused_before: u64) {
        for d in ready {
            self.dispatch(d);
        }
        for m in runtime {
            self.runtime_message(m);
        }
        let refused = self.relm.stats().refused;
        if refused > refused_before && (refused_before + 1..=refused).any(|n| n.is_power_of_two()) {
            log::warn!(
                "rank {}: refused a reliable message (unmatched list or pending bound full; \
                 its origin replays it later); {refused} so far",
                self.me
            );
        }
    }

    /// After the messaging layer has handled a repair, before the user's fault handlers.
    pub(super) fn relm_repair(&mut self, status: &RecoveryStatus) {
        self.relm
            .handle_repair(Instant::now(), &self.routing, status);
    }

    /// The connection to tree neighbour `peer` came back after a loss (a probe answered, or
    /// the peer replaced a connection): frames in flight on the old one may be gone.
    pub(super) fn relm_link_up(&mut self, peer: Rank) {
        if self.is_neighbour(peer) && !self.routing.is_failed(peer) {
            self.relm
                .handle_link_up(Instant::now(), &self.routing, peer);
        }
    }

    /// `TimerKind::Relm` fired.
    pub(super) fn relm_timer(&mut self, now: Instant) {
        self.relm_timers.retain(|t| *t > now);
        if self.stopping.is_none() {
            self.relm.handle_timeout(Instant::now(), &self.routing);
        }
    }

    /// Carries out what RELM asked for: its frames, its completions, its next deadline.
    pub(super) fn pump_relm(&mut self) {
        while let Some(t) = self.relm.poll_transmit() {
            if self.stopping.is_some() {
                continue;
            }
            let (to, header, payload) = match t {
                Transmit::Data { to, frame: f } => {
                    let mut h =
                        self.header(Kind::RelmData, f.origin, f.dst, f.tag, f.payload.len());
                    h.seq = pack_seq(f.uid, f.prev);
                    (to, h, f.payload)
                }
                Transmit::Control { to, control } => {
                    let p = control.encode();
                    (to, self.header(Kind::Relm, self.me, to, 0, p.len()), p)
                }
            };
            if to == self.me || to >= self.size || self.routing.is_failed(to) {
                log::debug!("rank {}: RELM frame for rank {to} dropped", self.me);
                continue;
            }
            self.enqueue(to, header, payload, None);
        }
        while let Some(Event::Completed { token, result }) = self.relm.poll_event() {
            if let Some(done) = self.relm_done.remove(&token) {
                done(result);
            }
        }
        if self.stopping.is_none()
            && let Some(at) = self.relm.poll_timeout()
            && self.relm_timers.first().is_none_or(|t| *t > at)
        {
            self.relm_timers.insert(at);
            self.timers.arm(at, TimerKind::Relm);
        }
    }

    /// Fails every outstanding reliable-send completion (the daemon is stopping).
    pub(super) fn fail_relm_completions(&mut self, err: SendError) {
        let mut tokens: Vec<u64> = self.relm_done.keys().copied().collect();
        tokens.sort_unstable();
        for t in tokens {
            if let Some(done) = self.relm_done.remove(&t) {
                done(Err(err.clone()));
            }
        }
    }
}

/// Runtime tags that travel over RELM: fault reports to rank 0 must not be lost with a dying
/// relay (a lost report could leave a death unconfirmed, and survivors with different trees);
/// broadcast requests, and rank 0's dones and refusals, need reliability and per-origin order
/// (the xcast core requires both).
pub(super) const RELIABLE_RUNTIME_TAGS: [Tag; 3] = [
    crate::faults::notice::TAG_FAULT_REPORT,
    crate::grpcomm::TAG_XCAST_REQUEST,
    crate::grpcomm::TAG_XCAST_DONE,
];

/// RELM's `post`: hands a message to receive matching unless the matcher would have to evict a
/// held message to keep it. The dispatch waits in `ready` (callbacks run after RELM returns).
fn post_to(
    matcher: &mut crate::rml::Matcher,
    ready: &mut Vec<Dispatch>,
    runtime: &mut Vec<Message>,
    origin: Rank,
    tag: Tag,
    payload: Bytes,
) -> bool {
    // Runtime notices are handled by the loop itself, never held: always posted.
    if tag < TAG_USER_MIN {
        runtime.push(Message {
            origin,
            tag,
            payload,
        });
        return true;
    }
    match matcher.try_handle_message(Message {
        origin,
        tag,
        payload,
    }) {
        Ok(d) => {
            ready.push(d);
            true
        }
        Err(_) => false,
    }
}
