//! The `rejoin` kind (issue "Rejoin"): a dead daemon is started again under a new
//! incarnation, as `tbon daemon --rejoin` starts it, and the checkers follow it into its new
//! life.
//!
//! What the world does at a restart: a fresh node for the rank ([`SimNode::restarted`]); the
//! old life's connections, held and parked frames gone; the rank alive again and no longer
//! counted crashed or fenced. What the checkers forget: the reliable messages of every pair
//! with the rank (its old life's sends never complete, sends to it ended `NodeDown`), and its
//! place in the broadcast stream until it is welcomed, when it starts after its admission's
//! operation. A rejoin that rank 0 refuses (the death not yet confirmed, the rank alive) stops
//! the new daemon; the world tries again a little later, a bounded number of times.

use super::{Ev, World};
use crate::Rank;
use crate::node::StopReason;
use crate::sim::check::Violation;
use crate::sim::node::SimNode;

/// Tries per planned restart: a restart planned while the rank lives, or refused, is tried
/// again [`RETRY_US`] later, at most this many times.
const ATTEMPTS_MAX: u32 = 8;
/// The wait between tries.
const RETRY_US: u64 = 300_000;

/// The world's state for the `rejoin` kind.
#[derive(Debug, Default)]
pub(super) struct Restarts {
    /// Incarnations given so far per rank beyond the first (its next is 2 + this).
    pub lives: std::collections::HashMap<Rank, u64>,
    /// Ranks restarted and not yet welcomed, with the try they are.
    pub rejoining: std::collections::HashMap<Rank, u32>,
    /// Restarts that ran.
    pub restarted: u64,
    /// Rejoins rank 0 refused.
    pub refused: u64,
}

impl Restarts {
    /// How many times `rank` was started again.
    pub fn life(&self, rank: Rank) -> u64 {
        self.lives.get(&rank).copied().unwrap_or(0)
    }
}

impl World {
    /// Restart event: `rank` starts again if it is dead; otherwise tried again later.
    pub(super) fn on_restart(&mut self, rank: Rank, attempt: u32) -> Result<(), Violation> {
        if rank == 0 || rank as usize >= self.nodes.len() {
            return Ok(());
        }
        if self.living(rank) {
            if attempt < ATTEMPTS_MAX {
                self.push(
                    self.now_us + RETRY_US,
                    Ev::Restart {
                        rank,
                        attempt: attempt + 1,
                    },
                );
            }
            return Ok(());
        }
        let life = {
            let l = self.restarts.lives.entry(rank).or_insert(0);
            *l += 1;
            *l
        };
        let heartbeat = self.scen.heartbeats.then_some((
            std::time::Duration::from_micros(super::HEARTBEAT_INTERVAL_US),
            std::time::Duration::from_micros(super::HEARTBEAT_TIMEOUT_US),
        ));
        let direct = self
            .scen
            .direct
            .get(rank as usize)
            .copied()
            .unwrap_or_else(|| {
                crate::direct::DirectConfig::from_config(&crate::config::Config::default())
            });
        let size = self.nodes.len() as u32;
        let node = SimNode::restarted(
            rank,
            size,
            self.radix,
            self.relm_cfg,
            heartbeat,
            (self.scen.flow, direct),
            self.now(),
            1 + life,
        )
        .map_err(|e| Violation {
            checker: "setup",
            detail: format!("restart of rank {rank}: {e}"),
        })?;
        log::debug!(
            "{} us: rank {rank} restarts (incarnation {})",
            self.now_us,
            1 + life
        );
        if let Some(slot) = self.nodes.get_mut(rank as usize) {
            // The same host: the new life reads the clock the old one did (the `status` kind).
            let clock = slot.clock;
            *slot = node;
            slot.clock = clock;
        }
        if let Some(a) = self.alive.get_mut(rank as usize) {
            *a = true;
        }
        self.crashed.retain(|r| *r != rank);
        self.fenced.retain(|r| *r != rank);
        self.declared.remove(&rank);
        if let Some(s) = self.stalled_until.get_mut(rank as usize) {
            *s = 0;
        }
        if let Some(t) = self.timer_at.get_mut(rank as usize) {
            *t = None;
        }
        // The old life's connections are gone with whatever they carried.
        for p in 0..size {
            if p != rank {
                self.bump_generation(rank, p);
                self.parked.remove(&(rank, p));
                self.parked.remove(&(p, rank));
            }
        }
        self.hs_restarted(rank);
        self.held.retain(|(f, t), _| *f != rank && *t != rank);
        self.redialing.retain(|(a, b)| *a != rank && *b != rank);
        self.conn_lost.retain(|(a, b)| *a != rank && *b != rank);
        self.check.forget_rank(rank);
        self.clients_lost_with(rank);
        self.status_restarted(rank);
        // Its application knows nothing of the allgathers: it contributes to each again (those
        // finished before its return end with their result or `ResultLost`).
        self.contributed.retain(|(r, _)| *r != rank);
        for id in 1..=self.scen.gathers {
            let at = self.now_us + self.rng.range(0, self.scen.safety_us / 4 + 1);
            self.push(at, Ev::Contribute { rank, id });
        }
        self.groups_restarted(rank);
        self.streams_restarted(rank);
        self.restarts.rejoining.insert(rank, attempt);
        self.restarts.restarted += 1;
        self.after(rank)
    }

    /// After an input to `r`: a rejoining daemon that rank 0 welcomed starts its broadcast
    /// stream after its admission's operation.
    pub(super) fn note_welcome(&mut self, r: Rank) {
        if !self.restarts.rejoining.contains_key(&r) {
            return;
        }
        let Some(n) = self.nodes.get(r as usize) else {
            return;
        };
        if n.node.is_wired() {
            let admitted = n.xcast().next_expected().saturating_sub(1);
            self.check.last_op.insert(r, admitted);
            self.restarts.rejoining.remove(&r);
        }
    }

    /// Whether `node`'s detection of `dead`, planned while `dead` was in its `life`-th life,
    /// is moot: `dead` runs again under a later life and `node` knows that life (the
    /// connection the detection is about is gone, and the new life made its own). Not while
    /// `dead` is dead (a refused restart died again: the death is still to be found), nor
    /// while `node` still believes in an earlier life (its link to that one is what broke).
    pub(super) fn moot_detection(&self, node: Rank, dead: Rank, life: u64) -> bool {
        if life == self.restarts.life(dead) || !self.living(dead) {
            return false;
        }
        let running = self.nodes.get(dead as usize).map(|n| n.node.incarnation());
        let known = self
            .nodes
            .get(node as usize)
            .and_then(|n| n.node.known_incarnation(dead));
        known.is_some() && known == running
    }

    /// Whether `r` is leaving in order (its application sends nothing more).
    pub(super) fn leaving(&self, r: Rank) -> bool {
        self.nodes
            .get(r as usize)
            .is_some_and(|n| n.node.is_leaving())
    }

    /// Whether `r`'s commands run (wired and, if restarted, settled).
    pub(super) fn settled(&self, r: Rank) -> bool {
        self.nodes
            .get(r as usize)
            .is_some_and(|n| n.node.is_settled())
    }

    /// Whether `r` is restarted and not yet welcomed (it takes no part in broadcasts yet).
    pub(super) fn is_rejoining(&self, r: Rank) -> bool {
        self.restarts.rejoining.contains_key(&r)
    }

    /// Daemon `r` stopped while rejoining: a refusal (the restart came too early) or no answer
    /// within the rejoin's deadline is allowed; the world tries again. Returns whether the stop was such a refusal.
    pub(super) fn rejoin_stopped(&mut self, r: Rank, reason: &StopReason) -> bool {
        let Some(attempt) = self.restarts.rejoining.get(&r).copied() else {
            return false;
        };
        // Refused (the death not yet confirmed), declared dead before it settled (admitted,
        // then lost), or no answer in time (rank 0 out of reach, or its answer lost with the
        // connection it took): the operator starts it again.
        let why = match reason {
            StopReason::Fatal(why)
                if why.contains("refused to admit") || why.contains("no answer from rank 0") =>
            {
                why
            }
            StopReason::DeclaredDead(why) => why,
            _ => return false,
        };
        log::debug!("{} us: rank {r}'s rejoin refused: {why}", self.now_us);
        self.restarts.refused += 1;
        self.restarts.rejoining.remove(&r);
        self.crashed.push(r);
        self.crashed.sort_unstable();
        self.dies(r);
        if attempt < ATTEMPTS_MAX {
            self.push(
                self.now_us + RETRY_US,
                Ev::Restart {
                    rank: r,
                    attempt: attempt + 1,
                },
            );
        }
        true
    }
}
