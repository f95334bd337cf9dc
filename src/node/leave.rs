//! An orderly leave (issue "Rejoin and grow": shrink). A daemon that leaves (`Node::leave`,
//! `Handle::leave`):
//!
//! 1. takes no new commands from its callers, and waits (at most `LEAVE_DRAIN_MS`) until its
//!    own reliable messages and broadcast requests are acknowledged;
//! 2. asks rank 0 (`TAG_LEAVE`, over RELM);
//! 3. rank 0 confirms the departure in a new epoch: a fault confirmation that lists the rank
//!    among the failed and among the `departed`. Every daemon repairs the tree around it as
//!    around a death (its heir takes its slot, its children move) but reports it as departed
//!    ([`crate::routed::RecoveryStatus::departed`]), never as failed. The leaving daemon keeps
//!    relaying what still reaches it meanwhile and follows repairs as any daemon does until the
//!    confirmation reaches it too; from then on it stops detecting its neighbours and redials
//!    nobody (they stop talking to it once they have repaired);
//! 4. once every living daemon has delivered the confirmation (its broadcast operation
//!    completed), nobody routes through the leaving daemon any more: rank 0 tells it
//!    (`TAG_LEFT`) and it stops ([`super::StopReason::Left`], an orderly end).
//!
//! Without that answer within `LEAVE_WAIT_MS` it stops anyway: with `Left` if its departure's
//! confirmation reached it (the broadcast is still on its way to some daemons, which will have
//! it as a departure all the same), with a fatal reason if not. A rank that
//! left is failed in everyone's tree, so it may come back later as a restarted daemon does
//! (`rejoin`).

use super::{Node, StopReason};
use crate::Rank;
use crate::error::LeaveError;
use crate::faults::leave::{TAG_LEAVE, TAG_LEFT};
use crate::oob::header::Kind;
use bytes::Bytes;
use std::time::{Duration, Instant};

/// A daemon leaving in order.
#[derive(Debug, Clone, Copy)]
pub(super) struct Leaving {
    /// Asks rank 0 at this time at the latest, drained or not.
    drain_until: Instant,
    /// Stops at this time at the latest, told or not.
    deadline: Instant,
    /// The request went to rank 0.
    asked: bool,
    /// Its departure's confirmation reached it.
    confirmed: bool,
}

impl Node {
    /// Starts an orderly leave of this daemon (see the module doc). Callers' commands are
    /// refused [`crate::SendError::ShutDown`] from now on; the daemon stops by itself, with
    /// [`StopReason::Left`], once every living daemon knows it is gone.
    ///
    /// # Errors
    /// [`LeaveError::Rank0`] on rank 0, [`LeaveError::NotWired`] before wire-up (or before a
    /// rejoined daemon is settled), [`LeaveError::ShutDown`] when stopping or already leaving.
    pub fn leave(&mut self, now: Instant) -> Result<(), LeaveError> {
        if self.me == 0 {
            return Err(LeaveError::Rank0);
        }
        if self.stopping.is_some() || self.leaving.is_some() {
            return Err(LeaveError::ShutDown);
        }
        if !self.is_settled() {
            return Err(LeaveError::NotWired);
        }
        log::info!("rank {}: leaving the DVM in order", self.me);
        self.leaving = Some(Leaving {
            drain_until: now + Duration::from_millis(crate::limits::LEAVE_DRAIN_MS),
            deadline: now + Duration::from_millis(crate::limits::LEAVE_WAIT_MS),
            asked: false,
            confirmed: false,
        });
        self.pump_leave(now);
        Ok(())
    }

    /// Whether this daemon is leaving (its callers' commands are refused).
    pub fn is_leaving(&self) -> bool {
        self.leaving.is_some()
    }

    /// Whether this daemon is leaving and its departure's confirmation reached it: its
    /// neighbours are repairing around it, so it stops detecting them and redials nobody.
    pub(super) fn departure_known(&self) -> bool {
        self.leaving.is_some_and(|l| l.confirmed)
    }

    /// When the leave next needs attention (the drain's end, the deadline).
    pub(super) fn leave_timeout(&self) -> Option<Instant> {
        let l = self.leaving.as_ref()?;
        Some(if l.asked {
            l.deadline
        } else {
            l.drain_until.min(l.deadline)
        })
    }

    /// Asks rank 0 once drained (or once the drain time is over); stops at the deadline.
    pub(super) fn pump_leave(&mut self, now: Instant) {
        let Some(l) = self.leaving else {
            return;
        };
        if self.stopping.is_some() {
            return;
        }
        if now >= l.deadline && l.confirmed {
            // Rank 0 confirmed the departure; its broadcast is still on its way to some
            // daemons (a partition, a stalled daemon): they will have it as a departure all
            // the same. Stopping now is still an orderly leave.
            log::warn!(
                "rank {}: not every daemon delivered the departure within {} ms; stopping \
                 anyway (rank 0 confirmed it)",
                self.me,
                crate::limits::LEAVE_WAIT_MS
            );
            self.begin_stop(now, StopReason::Left);
            return;
        }
        if now >= l.deadline {
            let why = format!(
                "rank 0 did not confirm this daemon's departure within {} ms; stopped anyway \
                 (the others will find it gone as a failure)",
                crate::limits::LEAVE_WAIT_MS
            );
            log::error!("rank {}: {why}", self.me);
            self.begin_stop(now, StopReason::Fatal(why));
            return;
        }
        if l.asked {
            return;
        }
        let drained = self.relm.records().0 == 0 && self.xcast.outstanding() == 0;
        if !drained && now < l.drain_until {
            return;
        }
        let token = self.next_runtime_token();
        let paths =
            super::reliable::Paths::new(&self.routing, &self.direct, (&self.lives, self.my_life));
        match self
            .relm
            .send_runtime(now, &paths, 0, TAG_LEAVE, Bytes::new(), token)
        {
            Ok(()) => {
                log::debug!("rank {}: asked rank 0 to leave", self.me);
                if let Some(l) = &mut self.leaving {
                    l.asked = true;
                }
            }
            // RELM's runtime window is full: asked again at the next pump.
            Err(e) => log::debug!("rank {}: leave request waits: {e}", self.me),
        }
    }

    /// The confirmation of this daemon's own departure reached it: it relays what still
    /// reaches it and waits for rank 0's word.
    pub(super) fn departure_confirmed(&mut self, epoch: u64) {
        log::info!(
            "rank {}: rank 0 confirmed the departure (epoch {epoch}); waiting until every \
             daemon knows",
            self.me
        );
        if let Some(l) = &mut self.leaving {
            l.confirmed = true;
        }
    }

    /// Rank 0: `from` asks to leave.
    pub(super) fn on_leave_request(&mut self, now: Instant, from: Rank) {
        if self.me != 0 || from == 0 {
            return;
        }
        if self.routing.is_failed(from) {
            // Asked again after its departure completed (the answer was lost), or dead.
            if self.departed.contains(&from) && !self.departing.contains_key(&from) {
                self.send_left(from);
            }
            return;
        }
        if !self.is_wired() || self.stopping.is_some() {
            log::warn!("rank 0: rank {from} asked to leave while wiring up or stopping; ignored");
            return;
        }
        log::info!("rank 0: rank {from} leaves the DVM in order");
        self.departed.insert(from);
        let op = self.xcast.next_op();
        self.departing.insert(from, op);
        self.confirm_with(now, &[from], &[from]);
    }

    /// Rank 0: broadcast operation `op` completed; the departures it announced are known to
    /// every living daemon.
    pub(super) fn leave_completed(&mut self, op: u64) {
        let done: Vec<Rank> = self
            .departing
            .iter()
            .filter(|(_, o)| **o <= op)
            .map(|(r, _)| *r)
            .collect();
        for r in done {
            self.departing.remove(&r);
            self.send_left(r);
        }
    }

    /// Rank 0 tells `to`, directly (it is out of the tree), that it may stop.
    fn send_left(&mut self, to: Rank) {
        let header = self.header(Kind::Msg, 0, to, TAG_LEFT, 0);
        self.out.push_back(super::Output::Transmit {
            to,
            header,
            payload: Bytes::new().into(),
            token: None,
        });
    }

    /// The leaving daemon: rank 0 says every living daemon knows it is gone.
    pub(super) fn on_left(&mut self, now: Instant, from: Rank) {
        if from != 0 || self.leaving.is_none() {
            log::warn!(
                "rank {}: unexpected word of departure from rank {from} ignored",
                self.me
            );
            return;
        }
        log::info!("rank {}: left the DVM", self.me);
        self.begin_stop(now, StopReason::Left);
    }
}
