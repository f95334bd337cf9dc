//! The fault coordinator: declaring ranks failed and repairing, telling adopted children,
//! reporting to rank 0, rank 0's confirmations with a new epoch, heartbeats, and the two fatal
//! cases (rank 0 lost; this daemon declared dead).
//!
//! After every repair, once per scope, in this order: the messaging layer (the driver gives
//! back what was queued for the dead, [`Output::PeersFailed`]; new neighbours are watched),
//! then the collectives (`Xcast` and `Allgather` `handle_repair`: new children are offered
//! `Sync`, a new parent is waited for), then RELM (`Relm::handle_repair`: purge, fail reliable
//! sends to the dead with node-down, start the link-update exchange), then the user's fault
//! handlers ([`Output::Repaired`]).
//!
//! Rank 0's confirmations are broadcast operations: every living daemon delivers every one, in
//! order, exactly once, including a daemon whose parent died while forwarding one (its new
//! parent replays it after their `Sync`/`Resume`).

use super::{LinkProgress, Node, Output, StopReason};
use crate::Rank;
use crate::faults::notice::{
    self, Adoption, Confirmation, TAG_ADOPTED, TAG_FAULT_CONFIRM, TAG_ROOT_LOST,
};
use crate::routed::{RecoveryStatus, Scope};
use bytes::Bytes;
use std::time::Instant;

impl Node {
    /// Local detection (a lost connection that could not be re-established, a silent
    /// neighbour) or news from an adoption notice: repair at once, local scope, and (with
    /// `report`) tell rank 0.
    pub(super) fn declare_failed(
        &mut self,
        now: Instant,
        ranks: &[Rank],
        cause: &str,
        report: bool,
    ) {
        if self.stopping.is_some() || !self.is_wired() {
            return;
        }
        if self.departure_known() {
            // Its neighbours stop talking to it as they repair around it: no failure of theirs.
            // (Before its departure is confirmed it follows repairs as any daemon does: its
            // request and its last messages need a path to rank 0.)
            log::debug!(
                "rank {}: leaving; {ranks:?} not declared failed ({cause})",
                self.me
            );
            return;
        }
        let mut new: Vec<Rank> = ranks
            .iter()
            .copied()
            .filter(|r| *r != self.me && *r < self.size && !self.routing.is_failed(*r))
            .collect();
        new.sort_unstable();
        new.dedup();
        if new.is_empty() {
            return;
        }
        if new.contains(&0) {
            self.root_lost(now, cause);
            return;
        }
        if new.iter().all(|r| self.departed.contains(r)) {
            log::info!("rank {}: rank(s) {new:?} left in order ({cause})", self.me);
        } else {
            log::warn!("rank {}: rank(s) {new:?} failed: {cause}", self.me);
        }
        let status = match self.routing.fail(&new, Scope::Local, None) {
            Ok(s) => s,
            Err(e) => {
                crate::bug!("rank {}: repair failed: {e}", self.me);
                return;
            }
        };
        self.after_repair(now, status);
        if report {
            if self.me == 0 {
                self.confirm(now, &new);
            } else {
                // Reliably (a report lost with a dying relay could leave the death
                // unconfirmed), and never dropped: a full window only delays it.
                self.unreported.extend(&new);
                self.flush_reports(now);
            }
        }
    }

    /// What every repair is followed by: the driver re-routes, new neighbours are watched,
    /// then the collectives, RELM and the user's handlers.
    pub(super) fn after_repair(&mut self, now: Instant, status: RecoveryStatus) {
        self.counters.repairs += 1;
        log::info!(
            "rank {}: repaired ({:?} scope, epoch {:?}): failed {:?}, restored {:?}, parent {} -> {}, children {:?} -> {:?}{}",
            self.me,
            status.scope,
            status.epoch,
            status.newly_failed,
            status.restored,
            crate::routed::ParentName(status.previous_parent),
            crate::routed::ParentName(status.new_parent),
            status.previous_children,
            status.new_children,
            if status.promoted { ", promoted" } else { "" }
        );
        // Children it did not have before; they learn of their new parent (and of every
        // failure it knows) from the notice sent with the collectives' `Sync` (`tell_child`).
        let adopted: Vec<Rank> = status
            .new_children
            .iter()
            .copied()
            .filter(|c| !status.previous_children.contains(c))
            .collect();
        let dead: Vec<Rank> = status
            .newly_failed
            .iter()
            .copied()
            .filter(|r| *r != self.me)
            .collect();
        if let Some(m) = &mut self.monitor {
            for r in &dead {
                m.forget(*r);
            }
        }
        for r in &dead {
            self.note_death(*r, self.life_of(*r));
            self.flow.forget(*r);
            self.streams_reported(*r);
            self.paused_by.remove(r);
            self.admitting.remove(r);
        }
        self.direct_after_repair(now, &dead);
        self.streams_after_repair(now, &dead);
        self.status_after_repair(now, &dead, &adopted);
        self.out.push_back(Output::PeersFailed { dead, adopted });
        self.watch_neighbours(now);
        self.grpcomm_repair(&status);
        let paths =
            super::reliable::Paths::new(&self.routing, &self.direct, (&self.lives, self.my_life));
        self.relm.handle_repair(now, &paths, &status);
        // Ranks that left in order are repaired around like the dead, but reported apart.
        let mut status = status;
        if !self.departed.is_empty() {
            let (gone, dead): (Vec<Rank>, Vec<Rank>) = status
                .newly_failed
                .iter()
                .partition(|r| self.departed.contains(r));
            if status.scope == Scope::Global {
                // Counted once, at the confirmation (a local repair may come first).
                self.counters.departures += gone.len() as u64;
            }
            status.newly_failed = dead;
            status.departed = gone;
        }
        self.out.push_back(Output::Repaired(Box::new(status)));
    }

    /// Sends child `c` an adoption notice: every failure this daemon knows, and its ancestors.
    /// Sent with every `Sync` the collectives offer a child (a new or adopted child, every
    /// child of a promoted daemon, a child still unsynchronised after a repair): the child can
    /// only answer under the same view of the tree, and the failures it lacks would otherwise
    /// reach it only as confirmations, which are broadcast operations, which its new parent
    /// sends it only once they are synchronised. Queued before the `Sync`, on the same link.
    pub(super) fn tell_child(&mut self, c: Rank) {
        let failed: Vec<Rank> = self.routing.failed().collect();
        let notice = Adoption {
            epoch: self.epoch,
            lives: failed.iter().map(|r| self.dead_life(*r)).collect(),
            failed,
            ancestors: self.routing.ancestors().to_vec(),
            restored: self.restores_known(),
            departed: self
                .departed
                .iter()
                .copied()
                .filter(|r| self.routing.is_failed(*r))
                .collect(),
        }
        .encode();
        self.send(c, TAG_ADOPTED, notice, None);
        self.status_ask_after_notice(c);
    }

    pub(super) fn watch_neighbours(&mut self, now: Instant) {
        let mut n: Vec<Rank> = self.routing.children().to_vec();
        n.extend(self.routing.parent());
        if let Some(m) = &mut self.monitor {
            m.set_neighbours(&n, now);
        }
    }

    /// Hands the deaths detected here to RELM in one report to rank 0, if its window has room
    /// (otherwise they wait, merged, and are retried every pump).
    pub(super) fn flush_reports(&mut self, now: Instant) {
        if self.unreported.is_empty() || self.stopping.is_some() {
            return;
        }
        let ranks: Vec<Rank> = self.unreported.iter().copied().collect();
        let payload = notice::Report {
            epoch: self.epoch,
            lives: ranks.iter().map(|r| self.dead_life(*r)).collect(),
            failed: ranks.clone(),
        }
        .encode();
        let token = self.next_runtime_token();
        let paths =
            super::reliable::Paths::new(&self.routing, &self.direct, (&self.lives, self.my_life));
        match self.relm.send_runtime(
            now,
            &paths,
            0,
            crate::faults::notice::TAG_FAULT_REPORT,
            payload,
            token,
        ) {
            Ok(()) => self.unreported.clear(),
            Err(crate::SendError::Busy(_)) => {
                self.counters.reports_delayed += 1;
                log::debug!(
                    "rank {}: RELM window full; the report of {ranks:?} waits",
                    self.me
                );
            }
            Err(e) => {
                // Rank 0 unreachable or failed: the DVM is ending anyway.
                log::warn!("rank {}: fault report not sent: {e}", self.me);
                self.unreported.clear();
            }
        }
    }

    /// Rank 0: confirm deaths to every daemon with a new epoch (global scope).
    pub(super) fn confirm(&mut self, now: Instant, ranks: &[Rank]) {
        self.confirm_with(now, ranks, &[]);
    }

    /// Rank 0: confirm `ranks` gone with a new epoch, of which `departed` left in order.
    pub(super) fn confirm_with(&mut self, now: Instant, ranks: &[Rank], departed: &[Rank]) {
        let new: Vec<Rank> = ranks
            .iter()
            .copied()
            .filter(|r| *r != 0 && *r < self.size && !self.confirmed.contains(r))
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
            Ok(mut status) => {
                status.newly_failed = new;
                self.after_repair(now, status);
            }
            Err(e) => crate::bug!("rank 0: repair failed: {e}"),
        }
        let c = Confirmation {
            epoch: self.epoch,
            failed: self.confirmed.clone(),
            restored: Vec::new(),
            departed: departed.to_vec(),
        };
        self.originate_runtime(TAG_FAULT_CONFIRM, c.encode());
    }

    /// Every daemon but 0: rank 0's confirmation was delivered (a broadcast operation: in
    /// order, once). Each epoch is applied once.
    pub(super) fn on_confirm(&mut self, now: Instant, payload: &[u8]) {
        let c = match Confirmation::decode(self.size, payload) {
            Ok(c) => c,
            Err(e) => {
                log::warn!("rank {}: bad fault confirmation: {e}", self.me);
                return;
            }
        };
        if c.epoch <= self.epoch {
            return;
        }
        if c.departed.contains(&self.me) && self.leaving.is_some() {
            self.departure_confirmed(c.epoch);
            return;
        }
        self.departed.extend(c.departed.iter().copied());
        if c.failed.contains(&self.me) || c.restored.iter().any(|r| r.rank == self.me) {
            self.declared_dead(
                now,
                &format!("rank 0 confirmed this daemon dead (epoch {})", c.epoch),
            );
            return;
        }
        // A rank an adoption notice told this daemon was admitted back in a later epoch than
        // this confirmation's is alive, whatever this older news says.
        let failed: Vec<Rank> = c
            .failed
            .iter()
            .copied()
            .filter(|r| !self.restored_after(*r, c.epoch))
            .collect();
        let unknown: Vec<Rank> = failed
            .iter()
            .copied()
            .filter(|r| !self.routing.is_failed(*r))
            .collect();
        let newly: Vec<Rank> = failed
            .iter()
            .copied()
            .filter(|r| !self.confirmed.contains(r))
            .collect();
        self.epoch = c.epoch;
        self.confirmed = failed;
        if !c.restored.is_empty() {
            // Daemons admitted back: the un-repair first, then any failure it also brings.
            self.restore_ranks(now, &c.restored, c.epoch);
            if unknown.is_empty() && newly.is_empty() {
                return;
            }
        }
        match self.routing.fail(&unknown, Scope::Global, Some(self.epoch)) {
            Ok(mut status) => {
                status.newly_failed = newly;
                self.after_repair(now, status);
            }
            Err(e) => crate::bug!("rank {}: repair failed: {e}", self.me),
        }
    }

    pub(super) fn on_report(&mut self, now: Instant, origin: Rank, payload: &[u8]) {
        match notice::Report::decode(self.size, payload) {
            Ok(report) => {
                let ranks: Vec<Rank> = report
                    .failed
                    .iter()
                    .zip(&report.lives)
                    .filter(|(r, life)| !self.is_stale_death(**r, **life))
                    .map(|(r, _)| *r)
                    .collect();
                log::info!("rank 0: rank {origin} reports {ranks:?} failed");
                self.confirm(now, &ranks);
            }
            Err(e) => log::warn!("rank 0: bad fault report from rank {origin}: {e}"),
        }
    }

    pub(super) fn on_adopted(&mut self, now: Instant, origin: Rank, payload: &[u8]) {
        let a = match Adoption::decode(self.size, payload) {
            Ok(a) => a,
            Err(e) => {
                log::warn!("rank {}: bad adoption notice from {origin}: {e}", self.me);
                return;
            }
        };
        if a.failed.contains(&self.me) {
            self.declared_dead(now, &format!("rank {origin} lists this daemon as failed"));
            return;
        }
        // Restores first: the new parent may be a daemon admitted back that this daemon still
        // believes dead (the confirmation can only reach it through that parent).
        self.restore_from_notice(now, &a.restored);
        // Who left in order is repaired around without a failure reported.
        self.departed.extend(a.departed.iter().copied());
        // Every death named, even of a rank failed here already: a restore of that life
        // arriving later is older news (grow seed 1114).
        for (r, life) in a.failed.iter().zip(&a.lives) {
            self.note_death(*r, *life);
        }
        let failed: Vec<Rank> = a
            .failed
            .iter()
            .zip(&a.lives)
            .filter(|(r, life)| !self.is_stale_death(**r, **life))
            .map(|(r, _)| *r)
            .collect();
        // Reported on to rank 0: the adopter's own report may have died with a relay or with
        // the adopter, and rank 0 must hear of every death for the trees to agree (the
        // simulator found a death never confirmed that way; regression seed 28942).
        self.declare_failed(
            now,
            &failed,
            &format!("adoption notice from rank {origin}"),
            true,
        );
        if self.routing.parent() != Some(origin) {
            // It knows a failure this daemon does not know yet (or the reverse): confirmations
            // bring both views together.
            log::debug!(
                "rank {}: rank {origin} says it adopted me, but my parent is {:?}",
                self.me,
                self.routing.parent()
            );
        }
    }

    /// Rank 0 is gone: the DVM cannot continue. Tell the subtree, then stop.
    pub(super) fn root_lost(&mut self, now: Instant, cause: &str) {
        if self.stopping.is_some() {
            return;
        }
        // Said from this daemon's side: it may be the one cut off while rank 0 and the rest
        // are fine (from an outside-in review: the log read as the whole DVM's end).
        log::error!(
            "rank {}: lost rank 0 ({cause}); this daemon cannot continue without it and stops \
             (rank 0 may be alive and this daemon the one cut off)",
            self.me
        );
        // A flood: without rank 0 there is no sequencer for a broadcast.
        self.flood(self.me, TAG_ROOT_LOST, &Bytes::new());
        self.begin_stop(now, StopReason::RootLost(cause.to_string()));
    }

    /// The DVM declared this daemon dead: it must not rejoin.
    pub(super) fn declared_dead(&mut self, now: Instant, why: &str) {
        if self.stopping.is_some() {
            return;
        }
        if self.leaving.is_some() {
            // The others repair around a leaving daemon as around a dead one, and say so when
            // it reconnects: expected; it stops when rank 0 says every daemon knows.
            log::info!("rank {}: leaving; {why}", self.me);
            return;
        }
        log::error!(
            "rank {}: declared dead by the DVM ({why}); exiting (a daemon started with rejoin, \
             `tbon daemon --rejoin`, may take the rank back)",
            self.me
        );
        self.begin_stop(now, StopReason::DeclaredDead(why.to_string()));
    }

    /// The heartbeat tick: heartbeats to the neighbours; the silent, and those whose queue
    /// stopped moving (they talk but do not read), are declared failed.
    pub(super) fn heartbeat_tick(&mut self, now: Instant, links: &dyn LinkProgress) {
        let Some(m) = &mut self.monitor else {
            self.heartbeat_at = None;
            return;
        };
        let timeout = m.timeout();
        self.heartbeat_at = Some(now + m.tick_every());
        // A neighbour whose frames flow control leaves unread is silent because of this
        // daemon, not of itself (`flow`: pauses end while it lives).
        if self.flow.is_pausing(now) {
            let mut n: Vec<Rank> = self.routing.children().to_vec();
            n.extend(self.routing.parent());
            for r in n {
                if !self.flow.may_read(now, r) {
                    m.heard(r, now);
                }
            }
        }
        let tick = m.tick(now);
        if tick.stalled {
            log::warn!(
                "rank {}: this daemon was stalled longer than half the heartbeat timeout; restarting neighbour clocks",
                self.me
            );
        }
        for r in tick.send_to {
            let mut header = self.header(crate::oob::header::Kind::Heartbeat, self.me, r, 0, 0);
            if !self.flow.may_read(now, r) {
                header.tag = super::flow::HEARTBEAT_PAUSING;
            }
            self.out.push_back(Output::Heartbeat { to: r, header });
        }
        let mut n: Vec<Rank> = self.routing.children().to_vec();
        n.extend(self.routing.parent());
        let deaf: Vec<Rank> = n
            .into_iter()
            .filter(|r| {
                let since = |t: Instant| now.saturating_duration_since(t);
                links.stuck_since(*r).is_some_and(|t| since(t) > timeout)
                    && self.paused_by.get(r).is_none_or(|t| since(*t) > timeout)
            })
            .collect();
        if !deaf.is_empty() && !tick.stalled {
            let cause = format!(
                "not reading: its queue accepted no bytes for {} ms",
                timeout.as_millis()
            );
            self.declare_failed(now, &deaf, &cause, true);
        }
        if !tick.silent.is_empty() {
            let cause = format!("no heartbeat for {} ms", timeout.as_millis());
            self.declare_failed(now, &tick.silent, &cause, true);
        }
    }
}
