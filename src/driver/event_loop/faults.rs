//! Fault handling in the loop: declaring ranks failed, repairing, re-routing what was queued
//! for them, telling adopted children, reporting to rank 0, rank 0's confirmations with a new
//! epoch, heartbeats, and the two fatal cases (rank 0 lost; this daemon declared dead).
//!
//! After every repair, once per scope, on the loop thread, in this order: the messaging layer
//! (re-route or fail what was queued, send a flood frame a dead child missed to its heirs, tell
//! adopted children, watch the new neighbours), then the collectives (`Xcast` and `Allgather`
//! `handle_repair`: new children are offered `Sync`, a new parent is waited for), then reliable
//! messaging (`Relm::handle_repair`: purge, fail reliable sends to the dead with node-down,
//! start the link-update exchange), then the user's fault handlers in registration order. The
//! collectives' and RELM's frames are queued at the end of the loop turn, behind the adoption
//! notices on the same connections.
//!
//! Rank 0's confirmations are broadcast operations (`originate_runtime`): every living daemon
//! delivers every one, in order, exactly once, including a daemon whose parent died while
//! forwarding one (its new parent replays it after their `Sync`/`Resume`).

use super::{EventLoop, Pending, Wire, complete};
use crate::Rank;
use crate::error::SendError;
use crate::faults::notice::{
    self, Adoption, Confirmation, TAG_ADOPTED, TAG_DECLARED_DEAD, TAG_FAULT_CONFIRM,
    TAG_FAULT_REPORT, TAG_ROOT_LOST,
};
use crate::oob::header::Kind;
use crate::routed::{RecoveryStatus, Scope};
use bytes::Bytes;
use std::time::Instant;

use super::super::handle::StopReason;
use super::super::timers::TimerKind;

impl EventLoop {
    pub(super) fn is_neighbour(&self, r: Rank) -> bool {
        self.routing.parent() == Some(r) || self.routing.children().contains(&r)
    }

    /// Local detection (lost connection that could not be re-established, silent neighbour) or
    /// news from an adoption notice: repair at once, local scope.
    pub(super) fn declare_failed(&mut self, ranks: &[Rank], cause: &str, report: bool) {
        if self.stopping.is_some() || !matches!(self.wire, Wire::Wired) {
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
            self.root_lost(cause);
            return;
        }
        log::warn!("rank {}: rank(s) {new:?} failed: {cause}", self.me);
        let frames = self.take_frames(&new);
        let status = match self.routing.fail(&new, Scope::Local, None) {
            Ok(s) => s,
            Err(e) => {
                log::error!("rank {}: repair failed: {e}", self.me);
                return;
            }
        };
        self.after_repair(status, frames);
        if report {
            if self.me == 0 {
                self.confirm(&new);
            } else {
                // Reliably: a report lost with a dying relay could leave the death unconfirmed.
                let payload = notice::encode_ranks(&new);
                self.send_reliable(0, TAG_FAULT_REPORT, payload, None);
            }
        }
    }

    /// Closes every connection to the dead ranks and takes back what was queued for them.
    fn take_frames(&mut self, dead: &[Rank]) -> Vec<Pending> {
        let mut frames = Vec::new();
        for r in dead {
            self.monitor.forget(*r);
            let toks: Vec<usize> = self
                .conns
                .iter()
                .filter(|(_, c)| c.peer == Some(*r) || c.dialled == Some(*r))
                .map(|(t, _)| t)
                .collect();
            for t in toks {
                if let Some(conn) = self.conns.get_mut(t) {
                    let (unsent, lost) = conn.take_unsent();
                    for done in lost {
                        complete(done, Err(SendError::NodeDown(*r)));
                    }
                    frames.extend(unsent.into_iter().map(|(header, payload, done)| Pending {
                        header,
                        payload,
                        done,
                    }));
                }
                self.close(t, Some(SendError::NodeDown(*r)));
            }
            if let Some(mut link) = self.links.remove(r) {
                frames.extend(link.pending.drain(..));
            }
        }
        frames
    }

    /// What every repair is followed by: re-route, adopt, watch the new neighbours, then the
    /// collectives, RELM and the user's handlers.
    fn after_repair(&mut self, status: RecoveryStatus, frames: Vec<Pending>) {
        self.counters.repairs += 1;
        log::info!(
            "rank {}: repaired ({:?} scope, epoch {:?}): failed {:?}, parent {:?} -> {:?}, children {:?} -> {:?}{}",
            self.me,
            status.scope,
            status.epoch,
            status.newly_failed,
            status.previous_parent,
            status.new_parent,
            status.previous_children,
            status.new_children,
            if status.promoted { ", promoted" } else { "" }
        );
        // Children it did not have before; they learn of their new parent (and of every failure
        // it knows) from the notice sent with the collectives' `Sync` (`tell_child`).
        let adopted: Vec<Rank> = status
            .new_children
            .iter()
            .copied()
            .filter(|c| !status.previous_children.contains(c))
            .collect();
        // Messaging layer: what was queued towards a dead rank goes over the repaired tree, or
        // fails with node-down if it was for the dead rank itself.
        for p in frames {
            match p.header.kind {
                Kind::Msg => self.forward(p.header, p.payload, p.done),
                Kind::Xcast => {
                    // A flood (the contact table) the dead child never got goes to the children
                    // it leaves behind.
                    for c in &adopted {
                        let mut h = p.header;
                        h.dst = *c;
                        self.enqueue(*c, h, p.payload.clone(), None);
                    }
                    complete(p.done, Ok(()));
                }
                // RELM replays what the dead neighbour may have lost (link updates, requests,
                // the origin's retransmissions), and the collectives resynchronise with the new
                // neighbours (`Sync`/`Resume`); these frames carry no completion.
                Kind::RelmData | Kind::Relm | Kind::Grpcomm => {}
                _ => complete(p.done, Ok(())),
            }
        }
        self.watch_neighbours();
        // The collectives, then reliable messaging, after the messaging layer and before the
        // user's handlers.
        self.grpcomm_repair(&status);
        self.relm_repair(&status);
        let mut handlers = std::mem::take(&mut self.fault_handlers);
        for h in handlers.iter_mut() {
            h(&status);
        }
        // Handlers registered from inside a handler arrived as commands; keep both.
        handlers.append(&mut self.fault_handlers);
        self.fault_handlers = handlers;
    }

    /// Sends child `c` an adoption notice: every failure this daemon knows, and its ancestors.
    /// Sent with every `Sync` the collectives offer a child (a new or adopted child, every
    /// child of a promoted daemon, a child still unsynchronised after a repair): the child can
    /// only answer under the same view of the tree, and the failures it lacks would otherwise
    /// reach it only as confirmations, which are broadcast operations, which its new parent
    /// sends it only once they are synchronised. Queued before the `Sync`, on the same link.
    pub(super) fn tell_child(&mut self, c: Rank) {
        let notice = Adoption {
            failed: self.routing.failed().collect(),
            ancestors: self.routing.ancestors().to_vec(),
        }
        .encode();
        self.send(c, TAG_ADOPTED, notice, None);
    }

    pub(super) fn watch_neighbours(&mut self) {
        let mut n: Vec<Rank> = self.routing.children().to_vec();
        n.extend(self.routing.parent());
        self.monitor.set_neighbours(&n, Instant::now());
    }

    /// Rank 0: confirm deaths to every daemon with a new epoch (global scope).
    pub(super) fn confirm(&mut self, ranks: &[Rank]) {
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
        let frames = self.take_frames(&unknown);
        match self.routing.fail(&unknown, Scope::Global, Some(self.epoch)) {
            Ok(mut status) => {
                status.newly_failed = new;
                self.after_repair(status, frames);
            }
            Err(e) => log::error!("rank 0: repair failed: {e}"),
        }
        let c = Confirmation {
            epoch: self.epoch,
            failed: self.confirmed.clone(),
        };
        self.originate_runtime(TAG_FAULT_CONFIRM, c.encode());
    }

    /// Every daemon but 0: rank 0's confirmation was delivered (a broadcast operation: in
    /// order, once). Each epoch is applied once.
    pub(super) fn on_confirm(&mut self, payload: &[u8]) {
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
        if c.failed.contains(&self.me) {
            self.declared_dead(&format!(
                "rank 0 confirmed this daemon dead (epoch {})",
                c.epoch
            ));
            return;
        }
        let unknown: Vec<Rank> = c
            .failed
            .iter()
            .copied()
            .filter(|r| !self.routing.is_failed(*r))
            .collect();
        let newly: Vec<Rank> = c
            .failed
            .iter()
            .copied()
            .filter(|r| !self.confirmed.contains(r))
            .collect();
        self.epoch = c.epoch;
        self.confirmed = c.failed;
        let frames = self.take_frames(&unknown);
        match self.routing.fail(&unknown, Scope::Global, Some(self.epoch)) {
            Ok(mut status) => {
                status.newly_failed = newly;
                self.after_repair(status, frames);
            }
            Err(e) => log::error!("rank {}: repair failed: {e}", self.me),
        }
    }

    pub(super) fn on_report(&mut self, origin: Rank, payload: &[u8]) {
        match notice::decode_ranks(self.size, payload) {
            Ok(ranks) => {
                log::info!("rank 0: rank {origin} reports {ranks:?} failed");
                self.confirm(&ranks);
            }
            Err(e) => log::warn!("rank 0: bad fault report from rank {origin}: {e}"),
        }
    }

    pub(super) fn on_adopted(&mut self, origin: Rank, payload: &[u8]) {
        let a = match Adoption::decode(self.size, payload) {
            Ok(a) => a,
            Err(e) => {
                log::warn!("rank {}: bad adoption notice from {origin}: {e}", self.me);
                return;
            }
        };
        if a.failed.contains(&self.me) {
            self.declared_dead(&format!("rank {origin} lists this daemon as failed"));
            return;
        }
        // Reported on to rank 0: the adopter's own report may have died with a relay or with
        // the adopter, and rank 0 must hear of every death for the trees to agree (the
        // simulator found a death never confirmed that way; regression seed 28942).
        self.declare_failed(
            &a.failed,
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
    pub(super) fn root_lost(&mut self, cause: &str) {
        if self.stopping.is_some() {
            return;
        }
        log::error!(
            "rank {}: lost rank 0 ({cause}); the DVM cannot continue without it, exiting",
            self.me
        );
        // A flood: without rank 0 there is no sequencer for a broadcast.
        self.flood(self.me, TAG_ROOT_LOST, &Bytes::new());
        self.begin_stop(StopReason::Fatal("lost rank 0".into()));
    }

    /// The DVM declared this daemon dead: it must not rejoin.
    pub(super) fn declared_dead(&mut self, why: &str) {
        if self.stopping.is_some() {
            return;
        }
        log::error!(
            "rank {}: declared dead by the DVM ({why}); exiting without rejoining",
            self.me
        );
        self.begin_stop(StopReason::Fatal("declared dead by the DVM".into()));
    }

    /// A rank we know failed connected to us (and proved who it is): tell it, then hang up.
    pub(super) fn tell_dead_and_close(&mut self, tok: usize, peer: Rank) {
        self.counters.dropped_stale += 1;
        log::warn!(
            "rank {}: rank {peer}, declared dead, tried to reconnect; telling it to exit",
            self.me
        );
        let h = self.header(Kind::Msg, self.me, peer, TAG_DECLARED_DEAD, 0);
        if let Some(conn) = self.conns.get_mut(tok) {
            let _ = conn.push(h, Bytes::new(), None);
            let mut done = Vec::new();
            // One tiny frame on a fresh socket; if the kernel does not take it now, the peer
            // learns it from the closed connection and its failed reconnects instead.
            let _ = conn.flush(&mut done);
        }
        self.close(tok, None);
    }

    /// Heartbeat timer: send heartbeats, declare the silent.
    pub(super) fn heartbeat_tick(&mut self) {
        if self.stopping.is_some() {
            return;
        }
        let now = Instant::now();
        self.timers
            .arm(now + self.monitor.tick_every(), TimerKind::Heartbeat);
        let tick = self.monitor.tick(now);
        if tick.stalled {
            log::warn!(
                "rank {}: this daemon was stalled longer than half the heartbeat timeout; restarting neighbour clocks",
                self.me
            );
        }
        for r in tick.send_to {
            let h = self.header(Kind::Heartbeat, self.me, r, 0, 0);
            // Only over a connection that is up: a missing one is being redialled already,
            // and silence is what the timeout measures.
            if let Some(tok) = self.links.get(&r).and_then(|l| l.conn)
                && let Some(conn) = self.conns.get_mut(tok)
                && conn.push(h, Bytes::new(), None).is_ok()
            {
                self.dirty.push(tok);
            }
        }
        // A neighbour that talks but does not read: its queue has not moved for the timeout.
        let timeout = std::time::Duration::from_millis(self.cfg.heartbeat_timeout_ms);
        let mut deaf = Vec::new();
        let mut n: Vec<Rank> = self.routing.children().to_vec();
        n.extend(self.routing.parent());
        for r in n {
            if let Some(conn) = self
                .links
                .get(&r)
                .and_then(|l| l.conn)
                .and_then(|t| self.conns.get(t))
                && !conn.queue.is_empty()
                && now.saturating_duration_since(conn.last_progress) > timeout
            {
                deaf.push(r);
            }
        }
        if !deaf.is_empty() && !tick.stalled {
            let cause = format!(
                "not reading: its queue accepted no bytes for {} ms",
                self.cfg.heartbeat_timeout_ms
            );
            self.declare_failed(&deaf, &cause, true);
        }
        if !tick.silent.is_empty() {
            let cause = format!("no heartbeat for {} ms", self.cfg.heartbeat_timeout_ms);
            self.declare_failed(&tick.silent, &cause, true);
        }
        // A link that dropped collective frames and saw no flush since it drained.
        self.check_grpcomm_resync();
    }
}
