//! Rejoin (issue "Rejoin and grow"): a daemon restarted under the rank of a dead one is
//! admitted back by rank 0 under its new incarnation, and every survivor puts it back into the
//! tree in a new epoch (the un-repair, [`crate::routed::RoutingState::restore`]).
//!
//! # The flow
//! 1. The restarted daemon (`NodeConfig::rejoin`) dials rank 0 and sends `Rejoin` with its new
//!    contact; its handshake proved its rank and incarnation. Until it is welcomed it has no
//!    place in the tree and holds its callers' commands (as before wire-up).
//! 2. Rank 0 admits it if its rank is confirmed dead and the incarnation is newer than the
//!    dead one's: a new epoch, the rank out of the failed set, and a fault confirmation (a
//!    broadcast operation, so every daemon applies it once and in order) that names the
//!    restored rank with its incarnation and contact. It answers `Welcome` (the epoch, the
//!    operation's id, the incarnation admitted, the failed set), or `Refused` with the reason.
//!    A daemon takes only a welcome for its own incarnation: rank 0 answers a request asked
//!    again with the same welcome, and by then the rank's connection may belong to a later
//!    restart (regression seed 25715).
//! 3. Every survivor, delivering that operation, restores the rank: the tree it computes is
//!    the one that would exist had the rank never failed ([`crate::routed`]); its children
//!    move back from their adopters, the heir that held its slot moves back down, and the
//!    collectives and RELM treat the changed neighbours as after a repair (`Sync`, link
//!    updates). Frames of the dead incarnation are dropped (the header's incarnation); RELM's
//!    state for the rank was purged when it died, so its chains start afresh.
//! 4. The welcomed daemon takes the failed set, delivers broadcast operations after its
//!    admission's (none before), and waits for its parent's `Sync`. Frames from others that
//!    came before the welcome wait for it and are read after it, in order; an adoption
//!    notice from a parent admitted back too waits with them, since the welcome would
//!    overwrite the restores it told (regression seed 24616). Once rank 0's operation
//!    completes (every living daemon delivered it, the new daemon included), rank 0 sends
//!    `Settled`: the daemon reports [`super::Output::Wired`] and runs its callers' commands.
//!    Holding them until then means no daemon on their way still believes it dead.
//!
//! # Stale news
//! A report or an adoption notice gives, for each rank it names dead, the rank's life as its
//! sender knows it. A death of an earlier life than this daemon knows is about a previous
//! incarnation, and is ignored. A confirmation whose failed set names a rank this daemon
//! learnt was restored in a later epoch does not fail it again.
//!
//! # Bounds
//! Rank 0 admits at most [`crate::limits::REJOIN_IN_PROGRESS_MAX`] daemons at once (not yet
//! settled); more are refused `Busy` and may retry. A daemon that gets no answer within twice
//! the wire-up timeout stops with a fatal error, as one that gets no contact table does.

use super::{Node, Output, StopReason, Wire};
use crate::Rank;
use crate::faults::notice::{Confirmation, Restored, TAG_FAULT_CONFIRM};
use crate::faults::rejoin::{
    self, Refusal, TAG_REJOIN, TAG_REJOIN_REFUSED, TAG_SETTLED, TAG_WELCOME, Welcome,
};
use crate::grpcomm::{Allgather, GroupGather, Xcast};
use crate::oob::header::Kind;
use crate::rml::Message;
use crate::routed::Scope;
use bytes::Bytes;
use std::time::Instant;

/// Rank 0: a daemon it admitted back and has not told `Settled` yet.
#[derive(Debug, Clone, Copy)]
pub(super) struct Admitting {
    pub incarnation: u64,
    /// The broadcast operation that announced it.
    pub op: u64,
}

impl Node {
    /// Whether `r` is room to grow that no admission has brought in yet (absent since epoch
    /// 0): `tbon status` shows it absent, not dead.
    pub(super) fn never_joined(&self, r: Rank) -> bool {
        r >= self.initial_size && self.life_of(r) == 0 && self.routing.is_failed(r)
    }

    /// A restarted daemon asks to rejoin: its request to rank 0, sent directly (it has no
    /// place in the tree yet).
    pub(super) fn start_rejoin(&mut self, now: Instant) {
        if self.me == 0 {
            let why = "rank 0 cannot rejoin: a DVM ends with its rank 0 (start a new DVM)";
            log::error!("{why}");
            self.begin_stop(now, StopReason::Fatal(why.into()));
            return;
        }
        if self.uri.is_none() {
            self.begin_stop(
                now,
                StopReason::Fatal("a daemon that rejoins needs its own contact".into()),
            );
            return;
        }
        log::info!(
            "rank {}: asking rank 0 to admit this daemon (a rejoin or a join; incarnation {})",
            self.me,
            self.incarnation
        );
        self.ask_rejoin(now, now + 2 * self.wireup_timeout);
    }

    /// Sends (again) the rejoin request, and asks again after `REJOIN_RETRY_MS` until
    /// `deadline`.
    pub(super) fn ask_rejoin(&mut self, now: Instant, deadline: Instant) {
        let again = now + std::time::Duration::from_millis(crate::limits::REJOIN_RETRY_MS);
        self.wire = Wire::Rejoining(deadline, again);
        let Some(uri) = self.uri.clone() else {
            return;
        };
        let request = rejoin::encode_request(self.size, self.routing.radix(), &uri.to_string());
        let header = self.header(Kind::Msg, self.me, 0, TAG_REJOIN, request.len());
        self.transmit(0, header, request, None);
    }

    /// Whether `frame` is a rejoin request for this daemon (rank 0), which passes the checks
    /// that drop frames from failed ranks.
    pub(super) fn is_rejoin_request(&self, from: Rank, kind: Kind, origin: Rank, tag: u32) -> bool {
        self.me == 0 && kind == Kind::Msg && tag == TAG_REJOIN && origin == from
    }

    /// Rank 0, wired: whether `h`, from `from`, is the wire-up report of a second daemon started
    /// for `from`, a rank alive in the DVM (a launcher that started a rank twice, or a restart
    /// without `rejoin`): a later incarnation than the one rank 0 met at wire-up. It is refused
    /// as a rejoin of a living rank is ([`Refusal::Alive`]), so that it stops at once, not at
    /// its contact table's deadline.
    pub(super) fn is_second_daemon_report(
        &self,
        from: Rank,
        h: &crate::oob::header::Header,
    ) -> bool {
        self.me == 0
            && h.kind == Kind::Msg
            && h.tag == super::wireup::TAG_WIREUP_REPORT
            && h.origin == from
            && self.is_wired()
            && !self.routing.is_failed(from)
            && self.known_incarnation(from).is_some_and(|k| h.epoch > k)
    }

    /// Rank 0, wired: whether a connection that proved it is rank `peer`, `incarnation`, comes
    /// from a second daemon for a living rank: `peer` is alive here and `incarnation` is later
    /// than the one rank 0 knows for it, which no admission recorded (a second daemon started
    /// without `rejoin`, or a restart with `rejoin` before the DVM confirmed the death). The
    /// driver answers it with [`second_daemon_refusal`](Self::second_daemon_refusal) on that
    /// connection and closes it: the living daemon's link is not replaced, so nothing in
    /// flight on it is given up.
    pub fn is_second_daemon(&self, peer: Rank, incarnation: u64) -> bool {
        self.me == 0
            && self.is_wired()
            && self.stopping.is_none()
            && !self.routing.is_failed(peer)
            && self
                .known_incarnation(peer)
                .is_some_and(|k| incarnation > k)
    }

    /// Rank 0: the refusal [`Refusal::Alive`] for a second daemon for living rank `peer`, to
    /// write on its own connection ([`is_second_daemon`](Self::is_second_daemon)); counted in
    /// `rejoins_refused`.
    pub fn second_daemon_refusal(&mut self, peer: Rank) -> (crate::oob::header::Header, Bytes) {
        log::warn!(
            "rank 0: a second daemon for rank {peer}, which is alive, connected; refusing it \
             (the living daemon's link stays)"
        );
        self.counters.rejoins_refused += 1;
        let p = Refusal::Alive.encode();
        let header = self.header(Kind::Msg, 0, peer, TAG_REJOIN_REFUSED, p.len());
        (header, p)
    }

    /// Rank 0: refuses a second daemon for living rank `from` (see
    /// [`is_second_daemon_report`](Self::is_second_daemon_report)).
    pub(super) fn refuse_second_daemon(&mut self, from: Rank) {
        log::warn!(
            "rank 0: a second daemon for rank {from}, which is alive, reported for wire-up; \
             refusing it"
        );
        self.send_refusal(from, Refusal::Alive);
    }

    /// Whether this daemon waits for rank 0's welcome (it was started with `rejoin`).
    pub(super) fn is_rejoining(&self) -> bool {
        matches!(self.wire, Wire::Rejoining(..))
    }

    /// A rejoining daemon keeps what others than rank 0 send it before its welcome (bounded):
    /// its new parent's `Sync` may overtake rank 0's answer, and would otherwise be lost.
    /// Returns whether the frame was kept (or dropped at the bound).
    pub(super) fn hold_until_welcome(
        &mut self,
        from: Rank,
        h: crate::oob::header::Header,
        payload: &Bytes,
    ) -> bool {
        if !matches!(self.wire, Wire::Rejoining(..)) || from == 0 {
            return false;
        }
        if self.rejoin_held.len() >= crate::limits::REJOIN_HELD_FRAMES_MAX {
            self.counters.dropped_stale += 1;
        } else {
            self.rejoin_held.push_back((from, h, payload.clone()));
        }
        true
    }

    /// Once welcomed: the frames kept while waiting are read, in order (those for the previous
    /// incarnation are then dropped by the lives check).
    pub(super) fn read_held_since_rejoin(&mut self, now: Instant) {
        if self.rejoin_held.is_empty() || matches!(self.wire, Wire::Rejoining(..)) {
            return;
        }
        let held = std::mem::take(&mut self.rejoin_held);
        if !self.is_wired() {
            return;
        }
        for (from, h, payload) in held {
            if let Err(why) = self.handle_frame(now, from, h, payload) {
                log::warn!(
                    "rank {}: a frame rank {from} sent before the welcome is refused: {why}",
                    self.me
                );
            }
        }
    }

    /// Whether a frame's lives are those this daemon knows: its origin's always, and its
    /// destination's for a routed message or one addressed to this daemon. A frame of another
    /// life was sent by, or for, another incarnation of that rank (rejoin). A daemon still
    /// waiting for its welcome does not know its own life yet: it takes only rank 0's answer
    /// (anything else reaching it was meant for its previous incarnation, by a daemon that
    /// does not know of its death yet, e.g. over a port the restarted daemon listens on again).
    pub(super) fn same_lives(&self, h: &crate::oob::header::Header) -> bool {
        if matches!(self.wire, Wire::Rejoining(..)) {
            // Rank 0 also says "declared dead" on this daemon's own connection when it admitted
            // this incarnation, lost it before it settled and declared it dead again (its
            // welcome lost with a connection): it stops at once instead of at its deadline.
            return h.kind == Kind::Msg
                && h.origin == 0
                && h.dst == self.me
                && matches!(
                    h.tag,
                    TAG_WELCOME | TAG_REJOIN_REFUSED | crate::faults::notice::TAG_DECLARED_DEAD
                );
        }
        if matches!(self.wire, Wire::Waiting(..))
            && h.kind == Kind::Msg
            && h.origin == 0
            && h.dst == self.me
            && h.tag == TAG_REJOIN_REFUSED
        {
            // A second daemon for a living rank, refused: rank 0 wrote the living daemon's
            // life, which this one, not wired, does not know (a rank admitted back has life 1).
            return true;
        }
        let routed = matches!(h.kind, Kind::Msg | Kind::RelmData);
        h.origin_life() == self.life_of(h.origin)
            && (!(routed || h.dst == self.me) || h.dst_life() == self.life_of(h.dst))
    }

    /// Whether `h`, from neighbour `from`, is an adoption notice of a newer incarnation of a
    /// rank this daemon believes failed: a daemon admitted back whose restore has not reached
    /// this daemon yet, adopting it.
    ///
    /// Or of a later life of a rank this daemon believes alive: then the life it knows died
    /// and was replaced, which the confirmations will say too, but only through the new tree.
    pub(super) fn is_restored_adopter(&self, from: Rank, h: &crate::oob::header::Header) -> bool {
        h.kind == Kind::Msg
            && h.tag == crate::faults::notice::TAG_ADOPTED
            && h.origin == from
            && h.dst == self.me
            && if self.routing.is_failed(from) {
                self.may_link(from, h.epoch)
            } else {
                h.origin_life() > self.life_of(from)
            }
    }

    /// The restores this daemon knows of, latest first (at most `REJOIN_RESTORES_TOLD_MAX`), for
    /// an adoption notice: its own, if it was admitted back, and those it applied.
    pub(super) fn restores_known(&self) -> Vec<(Restored, u64)> {
        let mut known: Vec<(Restored, u64)> = self
            .restored_at
            .iter()
            .filter(|(r, _)| !self.routing.is_failed(**r))
            .filter_map(|(&rank, &epoch)| {
                let (incarnation, uri) = if rank == self.me {
                    (self.incarnation, self.uri.clone()?)
                } else {
                    (
                        *self.incarnations.get(&rank)?,
                        self.contacts.get(rank)?.clone(),
                    )
                };
                Some((
                    Restored {
                        rank,
                        incarnation,
                        life: self.life_of(rank),
                        uri,
                    },
                    epoch,
                ))
            })
            .collect();
        known.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.rank.cmp(&b.0.rank)));
        known.truncate(crate::limits::REJOIN_RESTORES_TOLD_MAX);
        known
    }

    /// An adoption notice named restores: those this daemon has not applied (the rank failed
    /// here, the incarnation newer than the dead one's) are applied now, in local scope; the
    /// confirmation that follows finds them done.
    pub(super) fn restore_from_notice(&mut self, now: Instant, restored: &[(Restored, u64)]) {
        // A later life of a rank believed alive: the life known here died (rank 0 admitted
        // the next one only after confirming that death). Failed first, then restored.
        let replaced: Vec<Rank> = restored
            .iter()
            .filter(|(r, _)| {
                r.rank != self.me
                    && r.rank != 0
                    && !self.routing.is_failed(r.rank)
                    && r.life > self.life_of(r.rank)
            })
            .map(|(r, _)| r.rank)
            .collect();
        if !replaced.is_empty() {
            self.declare_failed(
                now,
                &replaced,
                "an adoption notice names a later life of it",
                false,
            );
        }
        let fresh: Vec<(Restored, u64)> = restored
            .iter()
            .filter(|(r, _)| {
                r.rank != self.me
                    && self.routing.is_failed(r.rank)
                    && !self.restore_is_stale(r.rank, r.life)
                    && (self.may_link(r.rank, r.incarnation) || r.life > self.life_of(r.rank))
            })
            .cloned()
            .collect();
        if fresh.is_empty() {
            return;
        }
        let ranks: Vec<Rank> = fresh.iter().map(|(r, _)| r.rank).collect();
        // Rank 0 admitted them back in a later epoch than the one that confirmed them dead.
        self.confirmed.retain(|r| !ranks.contains(r));
        for (r, epoch) in &fresh {
            self.departed.remove(&r.rank);
            self.incarnations.insert(r.rank, r.incarnation);
            self.lives.insert(r.rank, r.life);
            self.restored_at.insert(r.rank, *epoch);
            self.unreported.remove(&r.rank);
            self.contacts.replace(r.uri.clone());
        }
        match self.routing.restore(&ranks, Scope::Local, None) {
            Ok(status) => {
                log::info!(
                    "rank {}: rank(s) {ranks:?} back (told by an adoption notice)",
                    self.me
                );
                self.counters.rejoins += status.restored.len() as u64;
                self.after_repair(now, status);
            }
            Err(e) => crate::bug!("rank {}: restore failed: {e}", self.me),
        }
    }

    /// Whether a connection from `peer`, which proved `incarnation`, may stand. A rank this
    /// daemon believes failed may connect only under a newer incarnation than the dead one's:
    /// to ask rank 0 to rejoin, or to reach a neighbour that has not yet learnt of its return
    /// (its frames are dropped until then). An older or the same incarnation is told it was
    /// declared dead. So is an incarnation older than the one rank 0 admitted back for a
    /// living rank (known from the restore, not from a first contact): the daemon that held
    /// the rank before (a hung daemon that woke after its replacement was admitted took the
    /// rank's links from it, and the two replaced each other's connections without end: from
    /// an outside-in review).
    pub fn may_link(&self, peer: Rank, incarnation: u64) -> bool {
        if !self.routing.is_failed(peer) {
            return !self.restored_at.contains_key(&peer)
                || self
                    .incarnations
                    .get(&peer)
                    .is_none_or(|known| incarnation >= *known);
        }
        // A rank that left in order is not fenced: rank 0 dials it to say it may stop, and
        // its frames are dropped like any failed rank's.
        if self.departed.contains(&peer) {
            return true;
        }
        let known = self
            .incarnations
            .get(&peer)
            .copied()
            .unwrap_or(self.incarnation_floor);
        incarnation > known
    }

    /// Rank 0: rank `from`, incarnation `incarnation`, asks to be admitted back.
    pub(super) fn on_rejoin_request(
        &mut self,
        now: Instant,
        from: Rank,
        incarnation: u64,
        payload: &Bytes,
    ) {
        let decoded = rejoin::decode_request(payload)
            .map_err(|e| e.to_string())
            .and_then(|(size, radix, uri)| {
                let uri = super::wireup::decode_report(from, &uri).map_err(|e| e.to_string())?;
                Ok((size, radix, uri))
            });
        let (size, radix, uri) = match decoded {
            Ok(d) => d,
            Err(e) => {
                log::warn!("rank 0: bad rejoin request from rank {from}: {e}");
                return self.refuse_rejoin(from, Refusal::BadRequest);
            }
        };
        if (size, radix) != (self.size, self.routing.radix()) {
            log::warn!(
                "rank 0: rank {from} asks to rejoin a DVM of {size} daemons at radix {radix}; \
                 this one has {} at radix {}",
                self.size,
                self.routing.radix()
            );
            return self.refuse_rejoin(from, Refusal::Shape);
        }
        if self.stopping.is_some() {
            return self.refuse_rejoin(from, Refusal::NotReady);
        }
        if !self.is_wired() {
            return self.refuse_rejoin(from, Refusal::WiringUp);
        }
        if let Some(a) = self.admitting.get(&from).copied()
            && a.incarnation == incarnation
        {
            // Asked again (its connection was replaced): the same answer.
            self.send_welcome(from, a.op, incarnation);
            return;
        }
        if !self.routing.is_failed(from) {
            log::warn!("rank 0: rank {from} asked to rejoin but is alive; refused");
            return self.refuse_rejoin(from, Refusal::Alive);
        }
        if !self.may_link(from, incarnation) {
            return self.refuse_rejoin(from, Refusal::OldIncarnation);
        }
        if self.admitting.len() >= crate::limits::REJOIN_IN_PROGRESS_MAX {
            return self.refuse_rejoin(from, Refusal::Busy);
        }
        self.epoch += 1;
        let epoch = self.epoch;
        log::info!(
            "rank 0: admitting rank {from} {} (incarnation {incarnation}) in epoch {epoch}",
            if self.life_of(from) == 0 && from >= self.initial_size {
                "(joining: room to grow)"
            } else {
                "back"
            }
        );
        self.confirmed.retain(|r| *r != from);
        let op = self.xcast.next_op();
        let restored = Restored {
            rank: from,
            incarnation,
            life: self.life_of(from).wrapping_add(1),
            uri,
        };
        self.restore_ranks(now, std::slice::from_ref(&restored), epoch);
        debug_assert!(!self.routing.is_failed(from));
        let c = Confirmation {
            epoch,
            failed: self.confirmed.clone(),
            restored: vec![restored],
            departed: Vec::new(),
        };
        self.originate_runtime(TAG_FAULT_CONFIRM, c.encode());
        self.admitting.insert(from, Admitting { incarnation, op });
        self.send_welcome(from, op, incarnation);
    }

    fn send_welcome(&mut self, to: Rank, op: u64, incarnation: u64) {
        let w = Welcome {
            epoch: self.epoch,
            op,
            incarnation,
            failed: self.confirmed.clone(),
            lives: self.confirmed.iter().map(|r| self.dead_life(*r)).collect(),
            life: self.life_of(to),
            restored: self
                .restores_known()
                .into_iter()
                .filter(|(r, _)| r.rank != to)
                .collect(),
            living: self.living_lives(to),
        }
        .encode();
        let h = self.header(Kind::Msg, 0, to, TAG_WELCOME, w.len());
        self.transmit(to, h, w, None);
    }

    /// Rank 0: every living rank but `to` whose life is above 0, ascending, with its life
    /// (`Welcome::living`).
    fn living_lives(&self, to: Rank) -> Vec<(Rank, u16)> {
        let mut living: Vec<(Rank, u16)> = self
            .lives
            .iter()
            .filter(|(r, life)| **r != to && **life > 0 && !self.routing.is_failed(**r))
            .map(|(r, life)| (*r, *life))
            .collect();
        living.sort_unstable();
        living
    }

    /// Told directly on the connection the daemon made: it may be failed in this view.
    fn refuse_rejoin(&mut self, to: Rank, why: Refusal) {
        if matches!(why, Refusal::Busy | Refusal::WiringUp) {
            // The daemon asks again: back-pressure, as a send's `Busy` is.
            log::info!("rank 0: rank {to} may not rejoin yet: {why}");
        } else {
            log::warn!("rank 0: rank {to} may not rejoin: {why}");
        }
        self.send_refusal(to, why);
    }

    /// Rank 0: tells rank `to` it is not admitted, and counts it (`rejoins_refused`).
    fn send_refusal(&mut self, to: Rank, why: Refusal) {
        self.counters.rejoins_refused += 1;
        let p = why.encode();
        let header = self.header(Kind::Msg, 0, to, TAG_REJOIN_REFUSED, p.len());
        self.out.push_back(Output::Transmit {
            to,
            header,
            payload: p.into(),
            token: None,
        });
    }

    /// Every daemon: puts `restored` back into the tree in `epoch` (rank 0 when it admits;
    /// the others when they deliver its confirmation).
    pub(super) fn restore_ranks(&mut self, now: Instant, restored: &[Restored], epoch: u64) {
        // A rank this daemon has seen die again since (the same incarnation failed here after
        // an adoption notice restored it) stays failed: the confirmation is older news than
        // that death, which rank 0 will confirm next. A restore of an earlier life than the
        // one known here is older news too: a confirmation delayed behind the adoption notice
        // of the rank's next return would take its life back (seed 20202).
        //
        // A restore skipped because this daemon knows that life died must not leave its
        // children behind: they deliver the same confirmation (forwarded before this daemon
        // delivers it) and, not knowing of the death, apply it. Told the deaths this daemon
        // knows, they fail the rank again and report it, and the views meet (grow seed 2336).
        let (stale, current): (Vec<&Restored>, Vec<&Restored>) = restored
            .iter()
            .filter(|r| r.life >= self.life_of(r.rank))
            .partition(|r| self.restore_is_stale(r.rank, r.life));
        if !stale.is_empty() {
            for c in self.routing.children().to_vec() {
                self.tell_child(c);
            }
        }
        let restored: Vec<&Restored> = current
            .into_iter()
            .filter(|r| !self.routing.is_failed(r.rank) || self.may_link(r.rank, r.incarnation))
            .collect();
        if restored.is_empty() {
            return;
        }
        let ranks: Vec<Rank> = restored.iter().map(|r| r.rank).collect();
        for r in restored {
            self.departed.remove(&r.rank);
            self.incarnations.insert(r.rank, r.incarnation);
            self.lives.insert(r.rank, r.life);
            self.restored_at.insert(r.rank, epoch);
            self.unreported.remove(&r.rank);
            self.contacts.replace(r.uri.clone());
        }
        match self.routing.restore(&ranks, Scope::Global, Some(epoch)) {
            Ok(mut status) => {
                self.counters.rejoins += status.restored.len() as u64;
                // Like a confirmation of deaths already repaired here: the global repair names
                // every rank it restores, even those an adoption notice restored first.
                status.restored = ranks;
                self.after_repair(now, status);
            }
            Err(e) => crate::bug!("rank {}: restore failed: {e}", self.me),
        }
    }

    /// Records that `rank` died in its life `life` (the latest such life is kept).
    pub(super) fn note_death(&mut self, rank: Rank, life: u16) {
        let d = self.deaths.entry(rank).or_insert(life);
        *d = (*d).max(life);
    }

    /// The life of `rank` to name when passing on its death: the latest known to have died,
    /// which may be later than the last life restored here (grow seed 2336: a daemon that
    /// skipped a stale restore named the death as of life 0, and a child that had applied the
    /// restore took it for older news).
    pub(super) fn dead_life(&self, rank: Rank) -> u16 {
        self.life_of(rank)
            .max(self.deaths.get(&rank).copied().unwrap_or(0))
    }

    /// Whether a restore of `rank` in its life `life` is older news than a death known here:
    /// the rank is failed here and that life (or a later one) is known to have died.
    fn restore_is_stale(&self, rank: Rank, life: u16) -> bool {
        self.routing.is_failed(rank) && self.deaths.get(&rank).is_some_and(|d| *d >= life)
    }

    /// Whether a report or notice that names `rank` dead in its life `life` is stale: this
    /// daemon knows a later life of `rank`, so the death is of a previous incarnation.
    pub(super) fn is_stale_death(&self, rank: Rank, life: u16) -> bool {
        life < self.life_of(rank)
    }

    /// Whether `rank` was restored here in a later epoch than `epoch` (a confirmation of that
    /// epoch that lists it dead is older news).
    pub(super) fn restored_after(&self, rank: Rank, epoch: u64) -> bool {
        self.restored_at.get(&rank).is_some_and(|at| *at > epoch)
    }

    /// The rejoining daemon: rank 0 admitted it.
    pub(super) fn on_welcome(&mut self, now: Instant, msg: &Message) {
        if msg.origin != 0 || !matches!(self.wire, Wire::Rejoining(..)) {
            // Rank 0 answers every request again, and a rejoin over a slow or failing network
            // asks more than once: the later welcomes reach a daemon already admitted.
            log::debug!(
                "rank {}: unexpected welcome from rank {} ignored",
                self.me,
                msg.origin
            );
            return;
        }
        let w = match Welcome::decode(self.size, &msg.payload) {
            Ok(w) if w.incarnation != self.incarnation => {
                log::warn!(
                    "rank {}: a welcome for incarnation {} of this rank ignored (this is {})",
                    self.me,
                    w.incarnation,
                    self.incarnation
                );
                return;
            }
            Ok(w) if !w.failed.contains(&self.me) && !w.failed.contains(&0) => w,
            Ok(_) => {
                return self.begin_stop(
                    now,
                    StopReason::Fatal("rank 0's welcome lists this daemon or itself dead".into()),
                );
            }
            Err(e) => {
                return self.begin_stop(
                    now,
                    StopReason::Fatal(format!("unusable welcome from rank 0: {e}")),
                );
            }
        };
        log::info!(
            "rank {}: admitted in epoch {} (operation {}), {} rank(s) dead or not yet joined",
            self.me,
            w.epoch,
            w.op,
            w.failed.len()
        );
        self.epoch = w.epoch;
        self.confirmed = w.failed.clone();
        for (r, life) in w.failed.iter().zip(&w.lives) {
            if *life > 0 {
                self.lives.insert(*r, *life);
            }
        }
        for (r, life) in &w.living {
            if *r != self.me {
                self.lives.insert(*r, *life);
            }
        }
        // What it passes on to children that may still believe those ranks dead.
        self.my_life = w.life;
        for (r, epoch) in &w.restored {
            if r.rank != self.me && !w.failed.contains(&r.rank) {
                self.incarnations.insert(r.rank, r.incarnation);
                self.lives.insert(r.rank, r.life);
                self.restored_at.insert(r.rank, *epoch);
                self.contacts.replace(r.uri.clone());
            }
        }
        if let Err(e) = self.routing.fail(&w.failed, Scope::Global, Some(w.epoch)) {
            return self.begin_stop(now, StopReason::Fatal(format!("bad welcome: {e}")));
        }
        // The cores start from this tree, as everyone's did at wire-up, except that the
        // broadcast stream starts after the admission's operation and every neighbour is new.
        let limits = super::xcast_limits(self.msg_max_bytes, self.bcast_part_bytes);
        self.xcast = Xcast::rejoined(&self.routing, limits, w.op);
        self.allgather = Allgather::rejoined(&self.routing);
        self.group = GroupGather::rejoined(&self.routing);
        self.wire = Wire::Wired;
        self.settled = false;
        self.restored_at.insert(self.me, w.epoch);
        self.watch_neighbours(now);
        if let Some(m) = &self.monitor {
            self.heartbeat_at = Some(now + m.tick_every());
        }
        // Its neighbours' RELM state for it was purged when it died: link updates start its
        // chains afresh on both sides.
        let status = crate::routed::RecoveryStatus {
            scope: Scope::Global,
            newly_failed: Vec::new(),
            restored: vec![self.me],
            departed: Vec::new(),
            epoch: Some(w.epoch),
            promoted: false,
            demoted: false,
            previous_parent: None,
            new_parent: self.routing.parent(),
            previous_children: Vec::new(),
            new_children: self.routing.children().to_vec(),
            previous_ancestors: Vec::new(),
            new_ancestors: self.routing.ancestors().to_vec(),
        };
        let paths =
            super::reliable::Paths::new(&self.routing, &self.direct, (&self.lives, self.my_life));
        self.relm.handle_repair(now, &paths, &status);
        // Its fault handlers learn its place, and the driver its neighbours (a dead one is
        // found when it cannot be reached).
        self.out.push_back(Output::Repaired(Box::new(status)));
    }

    /// The rejoining daemon: rank 0 refused it.
    pub(super) fn on_rejoin_refused(&mut self, now: Instant, msg: &Message) {
        let what = match self.wire {
            Wire::Rejoining(..) => "to admit this daemon back",
            // Its wire-up report came after the DVM was wired, from a second daemon for a
            // living rank (`is_second_daemon_report`).
            Wire::Waiting(..) => "this daemon's wire-up report (a second daemon for its rank?)",
            _ => return,
        };
        if msg.origin != 0 {
            return;
        }
        let refusal = Refusal::decode(&msg.payload);
        if let (Wire::Rejoining(..), Ok(r @ (Refusal::Busy | Refusal::WiringUp))) =
            (&self.wire, &refusal)
        {
            // Not a verdict: a rack restarted at once would otherwise leave all but
            // `REJOIN_IN_PROGRESS_MAX` of its daemons to be started again by hand, and an
            // allocation started at once every joiner that asked before wire-up ended.
            self.rejoin_busy = self.rejoin_busy.saturating_add(1);
            log::info!(
                "rank {}: {r}; asking again in {} ms",
                self.me,
                crate::limits::REJOIN_RETRY_MS
            );
            return;
        }
        let why = match refusal {
            Ok(r) => r.to_string(),
            Err(e) => format!("(unreadable reason: {e})"),
        };
        let text = format!("rank 0 refused {what}: {why}");
        log::error!("rank {}: {text}", self.me);
        self.begin_stop(now, StopReason::Fatal(text));
    }

    /// The rejoined daemon: every living daemon knows it is back.
    pub(super) fn on_settled(&mut self, now: Instant, msg: &Message) {
        if msg.origin != 0 || self.settled || !self.is_wired() {
            return;
        }
        if let Err(e) = rejoin::decode_settled(&msg.payload) {
            log::warn!("rank {}: bad settled notice: {e}", self.me);
            return;
        }
        log::info!("rank {}: rejoined; every living daemon knows", self.me);
        self.settled = true;
        self.out.push_back(Output::Wired);
        self.replay_prewire(now);
    }

    /// Rank 0: broadcast operation `op` completed; the daemons it announced are settled.
    pub(super) fn rejoin_completed(&mut self, op: u64) {
        log::debug!(
            "rank {}: broadcast {op} completed; admitting {:?}",
            self.me,
            self.admitting
        );
        let done: Vec<Rank> = self
            .admitting
            .iter()
            .filter(|(_, a)| a.op <= op)
            .map(|(r, _)| *r)
            .collect();
        for r in done {
            self.admitting.remove(&r);
            if self.routing.is_failed(r) {
                continue;
            }
            let p = rejoin::encode_settled(op);
            let h = self.header(Kind::Msg, 0, r, TAG_SETTLED, p.len());
            self.transmit(r, h, p, None);
        }
    }

    /// A rejoining daemon that got no answer within its deadline.
    pub(super) fn no_welcome_in_time(&mut self, now: Instant) {
        let why = if self.rejoin_busy > 0 {
            format!(
                "no answer from rank 0 to the rejoin request within {} ms (twice the wire-up \
                 timeout) but \"busy\" or \"still wiring up\" ({} times: it admits {} daemons \
                 at once, once its initial daemons are wired); start it again",
                2 * self.wireup_timeout.as_millis(),
                self.rejoin_busy,
                crate::limits::REJOIN_IN_PROGRESS_MAX
            )
        } else {
            format!(
                "no answer from rank 0 to the rejoin request within {} ms (twice the wire-up \
                 timeout): check that rank 0 runs and that its contact is current",
                2 * self.wireup_timeout.as_millis()
            )
        };
        log::error!("rank {}: {why}", self.me);
        self.begin_stop(now, StopReason::Fatal(why));
    }
}
