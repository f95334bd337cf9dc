//! The protocol rules in steady state: originating a message, data arriving, acknowledgements,
//! replay requests, and the timers (hop cache expiry, the origin's retransmissions, re-asking
//! for a missing predecessor).

use super::batch::Items;
use super::engine::{InvalidTransition, Record, Role, Trigger, apply_kept};
use super::uid::{self, MsgKey};
use super::wire::{Control, ControlError};
use super::{Event, Inbound, Relm, Topology, Transmit};
use crate::Rank;
use crate::error::SendError;
use crate::limits::{RELM_RETRANSMIT_BACKOFF_MAX, RELM_RETRANSMITS_MAX};
use crate::rml::Tag;
use crate::rml::batch_frame::ItemRun;
use bytes::Bytes;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// A reliable message as it arrived in a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataFrame {
    /// Its origin.
    pub origin: Rank,
    /// Its destination.
    pub dst: Rank,
    /// Its tag.
    pub tag: Tag,
    /// Its uid.
    pub uid: u32,
    /// Its predecessor's uid.
    pub prev: u32,
    /// The payload.
    pub payload: Bytes,
}

/// The destination's receive matching, as RELM posts to it.
pub trait Poster {
    /// Hands a message to the receive matching: `true` if it was posted (matched or held),
    /// `false` if it could not be held (then RELM does not acknowledge it).
    fn post(&mut self, origin: Rank, tag: Tag, payload: Bytes) -> bool;

    /// Hands a whole batch's messages, in order, to the receive matching as one run: `true`
    /// if one receive took them all (a persistent receive), `false` if nothing was posted
    /// (then RELM posts them one by one). By default runs are refused.
    fn post_run(&mut self, _run: ItemRun) -> bool {
        false
    }
}

/// Any `FnMut(origin, tag, payload) -> bool` posts messages one by one.
impl<F: FnMut(Rank, Tag, Bytes) -> bool> Poster for F {
    fn post(&mut self, origin: Rank, tag: Tag, payload: Bytes) -> bool {
        self(origin, tag, payload)
    }
}

/// What RELM's inputs post to.
pub type Post<'a> = dyn Poster + 'a;

/// What becomes of data that arrived: see [`Relm::handle_run`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Take,
    /// An end failed, or it is this daemon's own: nothing to do.
    Drop,
    /// Not from its upstream neighbour.
    Ignore,
}

fn bug(e: InvalidTransition) {
    log::error!("relm: invalid transition (a bug): {e:?}");
}

impl Relm {
    /// Sends `payload` reliably to `dst`. `token`, if any, comes back in `Event::Completed`
    /// (without one, nothing tells the outcome).
    ///
    /// Errors at once: `NodeDown` if `dst` is known failed, `Busy` at `relm_unacked_max`
    /// unacknowledged messages of the users (the runtime's own are not counted:
    /// [`Relm::user_unacked`]), `RankOutOfRange` for `dst` = myself (the caller posts a message
    /// to itself locally, as for any send). The caller has checked the rank range, the tag and
    /// the size.
    #[inline]
    pub fn send(
        &mut self,
        now: Instant,
        topo: &dyn Topology,
        dst: Rank,
        tag: Tag,
        payload: Bytes,
        token: Option<u64>,
    ) -> Result<(), SendError> {
        self.send_within(now, topo, (dst, tag, payload), token, false)
    }

    /// [`Relm::send`] for the runtime's own messages (fault reports, broadcast requests and
    /// notices, client messages): a window of its own, refused `Busy` only when this daemon
    /// holds `relm_unacked_max` plus
    /// [`RELM_RUNTIME_RESERVE`](crate::limits::RELM_RUNTIME_RESERVE) unacknowledged runtime
    /// messages, so that a user keeping the users' window full never holds them up, and they
    /// never take room a caller was admitted to (the driver admits users' sends against
    /// [`Relm::user_unacked`]). An origin thus holds at most twice `relm_unacked_max` plus the
    /// reserve. The caller bounds what it makes and keeps what is refused until
    /// [`Relm::has_runtime_room`].
    pub fn send_runtime(
        &mut self,
        now: Instant,
        topo: &dyn Topology,
        dst: Rank,
        tag: Tag,
        payload: Bytes,
        token: u64,
    ) -> Result<(), SendError> {
        self.send_within(now, topo, (dst, tag, payload), Some(token), true)
    }

    /// The users' reliable messages sent here and not yet acknowledged, given up or failed:
    /// what [`Relm::send`]'s window counts.
    pub fn user_unacked(&self) -> usize {
        self.table.user_records()
    }

    /// The runtime's own reliable messages sent here and not yet acknowledged, given up or
    /// failed: what [`Relm::send_runtime`]'s window counts.
    pub fn runtime_unacked(&self) -> usize {
        self.table
            .counts()
            .0
            .saturating_sub(self.table.user_records())
    }

    /// Whether [`Relm::send_runtime`] would take a message now (as far as the window goes).
    pub fn has_runtime_room(&self) -> bool {
        self.runtime_unacked() < self.runtime_window()
    }

    /// The tokens of the messages sent here and not yet completed (acknowledged, given up or
    /// failed), ascending: what a stopping daemon fails `ShutDown`.
    pub fn waiting_tokens(&self) -> Vec<u64> {
        let mut tokens: Vec<u64> = self
            .table
            .iter()
            .filter(|(_, r)| r.role == Role::Origin)
            .filter_map(|(_, r)| r.token)
            .collect();
        tokens.sort_unstable();
        tokens
    }

    fn runtime_window(&self) -> usize {
        self.cfg
            .unacked_max
            .saturating_add(crate::limits::RELM_RUNTIME_RESERVE)
    }

    fn send_within(
        &mut self,
        now: Instant,
        topo: &dyn Topology,
        (dst, tag, payload): (Rank, Tag, Bytes),
        token: Option<u64>,
        runtime: bool,
    ) -> Result<(), SendError> {
        if dst == self.me || dst >= self.size {
            return Err(SendError::RankOutOfRange {
                rank: dst,
                size: self.size,
            });
        }
        if topo.is_failed(dst) {
            return Err(SendError::NodeDown(dst));
        }
        let full = if runtime {
            self.runtime_unacked() >= self.runtime_window()
        } else {
            self.table.user_records() >= self.cfg.unacked_max
        };
        if full {
            return Err(SendError::Busy(crate::error::Limit::ReliableWindow));
        }
        let id = self.next_uid;
        self.next_uid = uid::next(id);
        let prev = std::mem::replace(self.outbound.entry(dst).or_insert(uid::NONE), id);
        let key = MsgKey {
            origin: self.me,
            uid: id,
        };
        let record = Record {
            role: Role::Origin,
            uid: id,
            state: super::MsgState::Sending,
            dst,
            tag,
            prev,
            data: Some(payload),
            since: now,
            token,
            retransmit_at: now + Duration::from_millis(self.cfg.retransmit_ms),
            retransmits: 0,
            runtime,
        };
        match self.table.insert(key, record, Trigger::New) {
            // The record in hand is handed on at once: no second look-up.
            Ok(r) => hand_on(topo, key, r, None, &mut self.transmits),
            Err(e) => bug(e),
        }
        self.stats.sent += 1;
        self.arm_tick(now);
        Ok(())
    }

    /// Hands the data of the record of `key` to `dst` to the next hop towards `dst` (or to
    /// `to`), if there is a route and data; otherwise it stays `Sending`.
    pub(super) fn transmit(
        &mut self,
        topo: &dyn Topology,
        key: MsgKey,
        dst: Rank,
        to: Option<Rank>,
    ) {
        if let Some(r) = self.table.get_mut(&key, dst) {
            hand_on(topo, key, r, to, &mut self.transmits);
        }
    }

    /// A reliable message arrived from neighbour `from`. Errors (sentinel uids) are the peer's
    /// fault: the caller closes that connection.
    pub fn handle_data(
        &mut self,
        now: Instant,
        topo: &dyn Topology,
        from: Rank,
        d: DataFrame,
        post: &mut Post<'_>,
    ) -> Result<(), ControlError> {
        self.handle_run(now, topo, from, std::iter::once(d), post)
    }

    /// A checked batch frame from neighbour `from`. The common case at the destination, a
    /// batch of one tag whose items continue the chain exactly where it was posted up to, with
    /// nothing early held, is posted as one run ([`Poster::post_run`]) and acknowledged once:
    /// the same outcome as [`Relm::handle_run`]'s message by message, at one step per batch.
    /// Anything else, or a run the matching refuses, goes through [`Relm::handle_run`].
    pub fn handle_batch(
        &mut self,
        now: Instant,
        topo: &dyn Topology,
        from: Rank,
        items: Items,
        post: &mut Post<'_>,
    ) -> Result<(), ControlError> {
        let shape = items.shape();
        let origin = items.origin();
        if items.dst() == self.me
            && shape.linked
            && let Some(tag) = shape.one_tag
        {
            let probe = DataFrame {
                origin,
                dst: self.me,
                tag,
                uid: shape.last_uid,
                prev: shape.first_prev,
                payload: Bytes::new(),
            };
            if self.verdict(topo, from, &probe)? == Verdict::Take
                && self.post_whole(topo, from, &items, tag, post)
            {
                self.arm_tick(now);
                return Ok(());
            }
        }
        self.handle_run(now, topo, from, items, post)
    }

    /// [`Relm::handle_batch`]'s run: posts `items` (linked, one tag, taken from `from`) whole if
    /// they continue `origin`'s chain at its watermark with nothing early held, as `arrive`
    /// would post them one by one; `false` if they do not, or the matching refused the run,
    /// and then nothing changed but a previous life's state forgotten, as `arrive` does.
    fn post_whole(
        &mut self,
        topo: &dyn Topology,
        from: Rank,
        items: &Items,
        tag: Tag,
        post: &mut Post<'_>,
    ) -> bool {
        let (origin, shape) = (items.origin(), items.shape());
        let life = topo.life(origin);
        let inbound = self.inbound_of(origin, life);
        let posted = inbound.posted;
        let next = shape.first_prev == posted
            && (posted == uid::NONE || uid::before(posted, shape.first_uid))
            && inbound.pending.is_empty()
            && self.table.counts().2 == 0;
        if !next || !post.post_run(items.whole_run(tag)) {
            return false;
        }
        let last = shape.last_uid;
        self.posted_up_to(origin, last);
        self.stats.posted += u64::from(shape.count);
        let back = reply_to(topo, from, origin);
        self.ack_due((origin, self.me, life), last, back);
        true
    }

    /// Reliable messages that arrived from neighbour `from` in one frame, in order (a batch's
    /// items: `relm::batch`), each as [`Relm::handle_data`] takes it. What concerns the chain
    /// (the ranks, their failures, the upstream rule) is decided once per run of messages of
    /// one (origin, destination). An error stops at that message; the ones before it were
    /// taken.
    pub fn handle_run(
        &mut self,
        now: Instant,
        topo: &dyn Topology,
        from: Rank,
        items: impl IntoIterator<Item = DataFrame>,
        post: &mut Post<'_>,
    ) -> Result<(), ControlError> {
        let mut chain: Option<((Rank, Rank), Verdict)> = None;
        let mut took = false;
        for d in items {
            if !uid::is_valid(d.uid) {
                return Err(ControlError::Uid(d.uid));
            }
            if !(uid::is_valid(d.prev) || d.prev == uid::NONE) {
                return Err(ControlError::Uid(d.prev));
            }
            let verdict = match chain {
                Some((c, v)) if c == (d.origin, d.dst) => v,
                _ => {
                    let v = self.verdict(topo, from, &d)?;
                    chain = Some(((d.origin, d.dst), v));
                    v
                }
            };
            match verdict {
                Verdict::Take => {}
                Verdict::Drop => continue,
                Verdict::Ignore => {
                    self.stats.ignored += 1;
                    continue;
                }
            }
            took = true;
            if d.dst == self.me {
                self.arrive(now, topo, from, d, post);
            } else {
                self.relay(now, topo, d);
            }
        }
        if took {
            self.arm_tick(now);
        }
        Ok(())
    }

    /// Whether data of the chain of `d` is taken from neighbour `from`: ranks in range (else
    /// the peer's fault), neither end failed and not this daemon's own (else dropped), and
    /// `from` its current upstream neighbour, or the origin itself at the destination, over a
    /// direct link (`Topology::direct`; else ignored, and counted per message).
    fn verdict(
        &self,
        topo: &dyn Topology,
        from: Rank,
        d: &DataFrame,
    ) -> Result<Verdict, ControlError> {
        if d.origin >= self.size || d.dst >= self.size {
            return Err(ControlError::Rank(d.origin.max(d.dst)));
        }
        if topo.is_failed(d.origin) || topo.is_failed(d.dst) || d.origin == self.me {
            return Ok(Verdict::Drop);
        }
        let direct = d.dst == self.me && from == d.origin;
        if topo.next_hop(d.origin) != Some(from) && !direct {
            log::debug!(
                "rank {}: relm data {}:{} from {from}, not its upstream, ignored",
                self.me,
                d.origin,
                d.uid
            );
            return Ok(Verdict::Ignore);
        }
        Ok(Verdict::Take)
    }

    fn relay(&mut self, now: Instant, topo: &dyn Topology, d: DataFrame) {
        let key = MsgKey {
            origin: d.origin,
            uid: d.uid,
        };
        // Without a route the record stays `Sending` and goes out after the repair.
        let to = topo.next_hop(d.dst);
        // Each trigger is applied to the record in hand (one look-up per message, not three).
        let transmitted = |r: &mut Record| {
            if to.is_some()
                && let Err(e) = apply_kept(r, Trigger::Transmitted)
            {
                bug(e);
            }
        };
        if let Some(r) = self.table.get_mut(&key, d.dst) {
            if r.data.is_none() {
                // A `Requested` record knew only the key and the destination: its tag and
                // predecessor come with the data, and later replays from it need them.
                r.data = Some(d.payload.clone());
                r.tag = d.tag;
                r.prev = d.prev;
            }
            // Data keeps a hop's record (the transition table has no release for it).
            if let Err(e) = apply_kept(r, Trigger::Data) {
                bug(e);
            }
            transmitted(r);
        } else {
            let record = Record {
                role: Role::Hop,
                uid: key.uid,
                state: super::MsgState::Sending,
                dst: d.dst,
                tag: d.tag,
                prev: d.prev,
                data: Some(d.payload.clone()),
                since: now,
                token: None,
                retransmit_at: now,
                retransmits: 0,
                runtime: false,
            };
            match self.table.insert(key, record, Trigger::Cached) {
                Ok(r) => transmitted(r),
                Err(e) => bug(e),
            }
            self.stats.evicted += self.table.evict_hops(
                now,
                Duration::from_millis(self.cfg.cache_ms),
                self.cfg.cache_max,
            ) as u64;
        }
        // Forwarded even when it is a copy: the copy may be the replay a downstream daemon
        // lost; the destination discards what it already has.
        if let Some(to) = to {
            self.stats.relayed += 1;
            self.transmits.push_back(Transmit::Data { to, frame: d });
        }
    }

    /// At the destination: post in chain order, hold early ones, discard copies.
    fn arrive(
        &mut self,
        now: Instant,
        topo: &dyn Topology,
        from: Rank,
        d: DataFrame,
        post: &mut Post<'_>,
    ) {
        let origin = d.origin;
        // The frame's lives were checked against this daemon's (the header's): this is the
        // origin's current life.
        let life = topo.life(origin);
        let inbound = self.inbound_of(origin, life);
        let posted = inbound.posted;
        // Acks and requests go back the way the data came, if this daemon still reaches
        // that neighbour (a direct link given up here may still carry the origin's frames).
        let back = reply_to(topo, from, origin);
        if posted != uid::NONE && uid::at_or_before(d.uid, posted) {
            self.stats.duplicates += 1;
            self.ack_due((origin, self.me, life), posted, back);
            return;
        }
        let key = MsgKey { origin, uid: d.uid };
        if d.prev == posted {
            if !post.post(origin, d.tag, d.payload) {
                self.stats.refused += 1;
                return;
            }
            self.stats.posted += 1;
            let mut last = d.uid;
            // Drop a stale early copy of this very message, then post its waiting successors;
            // both are early messages, and most of the time there are none at all.
            let early = self.table.counts().2 > 0;
            if early && self.table.get(&key, self.me).is_some() {
                if let Some(i) = self.inbound.get_mut(&origin)
                    && i.pending.get(&d.prev) == Some(&d.uid)
                {
                    i.pending.remove(&d.prev);
                }
                if let Err(e) = self.table.apply(&key, self.me, Trigger::Ack) {
                    bug(e);
                }
            }
            while early
                && let Some(next) = self
                    .inbound
                    .get_mut(&origin)
                    .and_then(|i| i.pending.remove(&last))
            {
                let nkey = MsgKey { origin, uid: next };
                let Some(r) = self.table.get(&nkey, self.me) else {
                    continue;
                };
                let (tag, data) = (r.tag, r.data.clone().unwrap_or_default());
                if !post.post(origin, tag, data) {
                    // Put it back: it will be posted when the matcher has room again.
                    if let Some(i) = self.inbound.get_mut(&origin) {
                        i.pending.insert(last, next);
                    }
                    self.stats.refused += 1;
                    break;
                }
                self.stats.posted += 1;
                if let Err(e) = self.table.apply(&nkey, self.me, Trigger::Ack) {
                    bug(e);
                }
                last = next;
            }
            self.posted_up_to(origin, last);
            self.ack_due((origin, self.me, life), last, back);
            return;
        }
        // Early: its predecessor is missing.
        if self.table.get(&key, self.me).is_some() {
            return;
        }
        if self.table.counts().2 >= self.cfg.pending_max {
            self.stats.refused += 1;
            return;
        }
        let record = Record {
            role: Role::Destination,
            uid: key.uid,
            state: super::MsgState::Pending,
            dst: self.me,
            tag: d.tag,
            prev: d.prev,
            data: Some(d.payload),
            since: now,
            token: None,
            retransmit_at: now,
            retransmits: 0,
            runtime: false,
        };
        if let Err(e) = self.table.insert(key, record, Trigger::Wait) {
            bug(e);
            return;
        }
        let ask = match self.inbound.get_mut(&origin) {
            Some(i) => {
                i.pending.insert(d.prev, d.uid);
                // Ask for the missing predecessor once per retransmission period.
                let fresh = i
                    .requested
                    .is_some_and(|(u, at)| u == d.prev || (now < at && uid::before(d.prev, u)));
                if fresh || d.prev == uid::NONE {
                    false
                } else {
                    i.requested =
                        Some((d.prev, now + Duration::from_millis(self.cfg.retransmit_ms)));
                    true
                }
            }
            None => false,
        };
        if ask {
            self.transmits.push_back(Transmit::Control {
                to: back,
                control: Control::Request {
                    key: MsgKey {
                        origin,
                        uid: d.prev,
                    },
                    dst: self.me,
                },
            });
        }
    }

    /// A control message arrived from neighbour `from`. Errors are the peer's fault: the
    /// caller closes that connection.
    pub fn handle_control(
        &mut self,
        now: Instant,
        topo: &dyn Topology,
        from: Rank,
        payload: &[u8],
        post: &mut Post<'_>,
    ) -> Result<(), ControlError> {
        match Control::decode(self.size, payload)? {
            Control::Ack {
                origin,
                dst,
                upto,
                life,
            } => self.on_ack(topo, from, (origin, dst, life), upto),
            Control::Request { key, dst } => self.on_request(now, topo, from, key, dst),
            Control::LinkUpdate { depth, offers } => {
                self.on_link_update(now, topo, from, depth, &offers, post)
            }
        }
        self.arm_tick(now);
        Ok(())
    }

    fn on_ack(
        &mut self,
        topo: &dyn Topology,
        from: Rank,
        (origin, dst, life): (Rank, Rank, u16),
        upto: u32,
    ) {
        // Acks are accepted only from the chain's current downstream neighbour, or at the
        // origin from the destination itself (over a direct link), and only for the origin's
        // life this daemon knows: an ack of a previous life's chain, in flight when the origin
        // was admitted back, would complete the new life's messages, numbered from 0 again
        // (regression seed 31828).
        let direct = origin == self.me && from == dst;
        if (topo.next_hop(dst) != Some(from) && !direct)
            || topo.is_failed(origin)
            || topo.life(origin) != life
        {
            self.stats.ignored += 1;
            return;
        }
        // An origin record's completion, as `complete` queues it (the table and the events
        // are borrowed apart).
        let events = &mut self.events;
        self.table.ack_chain(origin, dst, upto, |_, r| {
            if r.role == Role::Origin
                && let Some(token) = r.token
            {
                events.push_back(Event::Completed {
                    token,
                    result: Ok(()),
                });
            }
        });
        if origin != self.me
            && let Some(up) = topo.next_hop(origin)
        {
            self.ack_due((origin, dst, life), upto, up);
        }
    }

    /// The destination's state for `origin` in its life `life`: a previous life's is forgotten
    /// first ([`Relm::forget_origin`]); a new one has posted nothing yet.
    fn inbound_of(&mut self, origin: Rank, life: u16) -> &mut Inbound {
        if self.inbound.get(&origin).is_some_and(|i| i.life != life) {
            self.forget_origin(origin);
        }
        self.inbound.entry(origin).or_insert_with(|| Inbound {
            life,
            posted: uid::NONE,
            ..Inbound::default()
        })
    }

    /// `origin`'s chain to this daemon is posted up to `last`: its watermark, and a request
    /// for a predecessor it covers is no longer outstanding.
    fn posted_up_to(&mut self, origin: Rank, last: u32) {
        if let Some(i) = self.inbound.get_mut(&origin) {
            i.posted = last;
            if i.requested.is_some_and(|(u, _)| uid::at_or_before(u, last)) {
                i.requested = None;
            }
        }
    }

    /// Forgets a destination's state for a previous life of `origin`: its watermark and the
    /// early messages it held. The purge when the origin died has normally done it; this
    /// keeps a restarted origin's chain from meeting its previous life's watermark even if a
    /// daemon learnt the restore without the death.
    fn forget_origin(&mut self, origin: Rank) {
        log::warn!(
            "rank {}: reliable chain state of a previous life of rank {origin} dropped",
            self.me
        );
        self.inbound.remove(&origin);
        let mut early: Vec<MsgKey> = self
            .table
            .iter()
            .filter(|(k, r)| k.origin == origin && r.role == Role::Destination)
            .map(|(k, _)| k)
            .collect();
        early.sort_unstable();
        for k in early {
            self.table.remove(&k, self.me);
        }
    }

    fn on_request(
        &mut self,
        now: Instant,
        topo: &dyn Topology,
        from: Rank,
        key: MsgKey,
        dst: Rank,
    ) {
        // Requests come back from the message's current downstream neighbour, or to the
        // origin from the destination itself (over a direct link).
        let direct = key.origin == self.me && from == dst;
        if (topo.next_hop(dst) != Some(from) && !direct) || topo.is_failed(key.origin) {
            self.stats.ignored += 1;
            return;
        }
        match self.table.get(&key, dst) {
            Some(r) if r.data.is_some() => {
                if let Err(e) = self.table.apply(&key, dst, Trigger::Request) {
                    bug(e);
                }
                self.stats.replays += 1;
                self.transmit(topo, key, dst, Some(reply_to(topo, from, dst)));
            }
            // Already asked upstream.
            Some(_) => {}
            // The origin keeps every unacknowledged message: unknown here means acknowledged
            // (the requester will hear so from the destination's watermark) or never sent.
            None if key.origin == self.me => {}
            None => {
                let Some(up) = topo.next_hop(key.origin) else {
                    return;
                };
                let record = Record {
                    role: Role::Hop,
                    uid: key.uid,
                    state: super::MsgState::Requested,
                    dst,
                    tag: 0,
                    prev: uid::NONE,
                    data: None,
                    since: now,
                    token: None,
                    retransmit_at: now,
                    retransmits: 0,
                    runtime: false,
                };
                if let Err(e) = self.table.insert(key, record, Trigger::Request) {
                    bug(e);
                }
                self.transmits.push_back(Transmit::Control {
                    to: up,
                    control: Control::Request { key, dst },
                });
            }
        }
    }

    /// Time passed: expire the hop cache, retransmit what the origin still holds
    /// unacknowledged, ask again for missing predecessors, open a gate whose wait ran out.
    pub fn handle_timeout(&mut self, now: Instant, topo: &dyn Topology) {
        if self.gate.deadline.is_some_and(|d| d <= now) {
            self.gate.deadline = None;
            self.gate.awaiting.clear();
            self.release_gate(now, topo);
        }
        if self.next_tick.is_some_and(|t| t > now) {
            return;
        }
        self.next_tick = None;
        self.stats.evicted += self.table.evict_hops(
            now,
            Duration::from_millis(self.cfg.cache_ms),
            self.cfg.cache_max,
        ) as u64;
        self.table.shed();
        let mut due: Vec<(MsgKey, Rank)> = self
            .table
            .iter()
            .filter(|(_, r)| r.role == Role::Origin && r.retransmit_at <= now)
            .map(|(k, r)| (k, r.dst))
            .collect();
        due.sort_unstable();
        for (key, dst) in due {
            let Some(r) = self.table.get_mut(&key, dst) else {
                continue;
            };
            if r.retransmits >= RELM_RETRANSMITS_MAX {
                if let Some(r) = self.table.remove(&key, dst) {
                    log::warn!(
                        "rank {}: reliable message {} to {dst} unacknowledged after {} retransmissions; giving up",
                        self.me,
                        key.uid,
                        RELM_RETRANSMITS_MAX
                    );
                    self.complete(r.token, Err(SendError::Unreachable(dst)));
                }
                continue;
            }
            r.retransmits += 1;
            let backoff = 1u64 << r.retransmits.min(RELM_RETRANSMIT_BACKOFF_MAX);
            r.retransmit_at = now + Duration::from_millis(self.cfg.retransmit_ms * backoff);
            self.stats.retransmits += 1;
            self.transmit(topo, key, dst, None);
        }
        // Ask again for predecessors still missing.
        let mut asks = Vec::new();
        for (origin, i) in self.inbound.iter_mut() {
            if let Some((u, at)) = i.requested
                && at <= now
                && !i.pending.is_empty()
            {
                i.requested = Some((u, now + Duration::from_millis(self.cfg.retransmit_ms)));
                asks.push((*origin, u));
            }
        }
        asks.sort_unstable();
        for (origin, u) in asks {
            if let Some(up) = topo.route(origin) {
                self.transmits.push_back(Transmit::Control {
                    to: up,
                    control: Control::Request {
                        key: MsgKey { origin, uid: u },
                        dst: self.me,
                    },
                });
            }
        }
        self.arm_tick(now);
    }
}

/// Hands the data of record `r` (of `key`) to the next hop towards its destination (or to
/// `to`), if there is a route and data; otherwise it stays `Sending`.
fn hand_on(
    topo: &dyn Topology,
    key: MsgKey,
    r: &mut Record,
    to: Option<Rank>,
    transmits: &mut VecDeque<Transmit>,
) {
    let Some(payload) = r.data.clone() else {
        return;
    };
    // The origin's own messages take a direct link when one is open; hops use the tree.
    let hop = match r.role {
        Role::Origin => topo.route(r.dst),
        Role::Hop | Role::Destination => topo.next_hop(r.dst),
    };
    let Some(to) = to.or(hop) else {
        return;
    };
    transmits.push_back(Transmit::Data {
        to,
        frame: DataFrame {
            origin: key.origin,
            dst: r.dst,
            tag: r.tag,
            uid: key.uid,
            prev: r.prev,
            payload,
        },
    });
    // Sending|Sent -> Sent keeps the record: its state changes in place.
    if let Err(e) = apply_kept(r, Trigger::Transmitted) {
        bug(e);
    }
}

/// Where a reply to a frame from `from` about the chain towards or from `target` goes: back
/// to `from` while this daemon reaches it (the tree's neighbour on that path, or a direct
/// link), else by this daemon's own route to `target` (a frame its origin sent on a link this
/// end has given up).
fn reply_to(topo: &dyn Topology, from: Rank, target: Rank) -> Rank {
    if topo.next_hop(target) == Some(from) || topo.direct(from) {
        return from;
    }
    topo.route(target).unwrap_or(from)
}
