//! The protocol rules after a repair: purge what died or no longer crosses this daemon, then
//! exchange link updates with each neighbour that changed, gated as in PRRTE.
//!
//! A link update carries the sender's depth and every message the sender holds that is routed
//! over the link (towards the receiver). The receiver ignores it unless the sender is its
//! current parent one level up or its current child one level down (an update from before a
//! promotion carries a stale depth). For each offered message the receiver lacks, it asks the
//! sender for a replay; for each it already posted (as destination), it acknowledges.
//!
//! Gating: with two or more changed neighbours not yet heard from, a daemon sends no update;
//! with one, it sends its update only to that one; with none, it sends its updates to all it
//! still owes and then everything pending (messages held without a route, and after a global
//! repair a re-acknowledgement of every inbound chain and, one gate period later, a resend of
//! every message of this origin still unacknowledged). On a tree the changed links form a forest, so the wave starts at its leaves and
//! always finishes; views that disagree for a moment could still leave two daemons waiting on
//! each other, so the wait is bounded by `relm_gate_ms`, after which everything goes out.

use super::engine::{MsgState, Role};
use super::uid::{self, MsgKey};
use super::wire::{Control, Offer};
use super::{Relm, Topology, Transmit};
use crate::Rank;
use crate::error::SendError;
use crate::limits::RELM_UPDATE_ENTRIES_MAX;
use crate::routed::{RecoveryStatus, Scope};
use std::time::{Duration, Instant};

use super::steady::Post;

impl Relm {
    /// The tree was repaired (`status` as returned by the routing state, which `topo` now
    /// reflects). Purges, fails the completions of messages to dead ranks with `NodeDown`, and
    /// starts the link-update exchange with the changed neighbours.
    pub fn handle_repair(&mut self, now: Instant, topo: &dyn Topology, status: &RecoveryStatus) {
        self.purge(topo);
        let mut changed: Vec<Rank> = status
            .new_children
            .iter()
            .copied()
            .filter(|c| !status.previous_children.contains(c))
            .collect();
        if status.new_parent != status.previous_parent
            && let Some(p) = status.new_parent
        {
            changed.push(p);
        }
        changed.retain(|r| !topo.is_failed(*r));
        self.gate.awaiting.retain(|r| !topo.is_failed(*r));
        self.gate.owed.retain(|r| !topo.is_failed(*r));
        for r in &changed {
            self.gate.awaiting.insert(*r);
            self.gate.owed.insert(*r);
        }
        if status.scope == Scope::Global {
            self.gate.resend_all = true;
        }
        if !self.gate.awaiting.is_empty() {
            self.gate.deadline = Some(now + Duration::from_millis(self.cfg.gate_ms));
        }
        self.try_release(now, topo);
        self.arm_tick(now);
    }

    /// The connection to neighbour `peer` came back after a loss without a repair: frames in
    /// flight on the old connection may be gone, so offer it this daemon's state for the link.
    pub fn handle_link_up(&mut self, now: Instant, topo: &dyn Topology, peer: Rank) {
        if topo.is_failed(peer) {
            return;
        }
        self.gate.owed.insert(peer);
        self.try_release(now, topo);
        self.arm_tick(now);
    }

    /// The direct link with `peer` was lost (`topo` no longer says [`Topology::direct`] for
    /// it). What went on it unacknowledged may be gone with the connection, so every message
    /// of this origin to `peer` still unacknowledged goes again at once over the tree rather
    /// than at its retransmission time, and `peer`'s chain to this daemon is acknowledged
    /// again over the tree (an ack on the link may be gone too). What had arrived becomes a
    /// duplicate, which the destination's watermark discards.
    pub fn handle_direct_lost(&mut self, now: Instant, topo: &dyn Topology, peer: Rank) {
        if topo.is_failed(peer) {
            return;
        }
        let mut mine: Vec<MsgKey> = self
            .table
            .iter()
            .filter(|(_, r)| r.role == Role::Origin && r.dst == peer && r.data.is_some())
            .map(|(k, _)| k)
            .collect();
        mine.sort_unstable();
        for key in mine {
            self.stats.replays += 1;
            self.transmit(topo, key, peer, None);
        }
        let posted = self.inbound.get(&peer).map(|i| (i.posted, i.life));
        if let Some((upto, life)) = posted.filter(|(p, _)| *p != uid::NONE)
            && let Some(up) = topo.route(peer)
        {
            self.ack_due((peer, self.me, life), upto, up);
        }
        self.arm_tick(now);
    }

    /// Drops records to or from dead ranks (failing the origin's completions with
    /// `NodeDown`) and hop records whose path no longer crosses this daemon.
    fn purge(&mut self, topo: &dyn Topology) {
        let mut gone: Vec<(MsgKey, Rank, bool)> = Vec::new();
        for (k, r) in self.table.iter() {
            let dead = topo.is_failed(k.origin) || topo.is_failed(r.dst);
            let off_path = r.role == Role::Hop && {
                let up = topo.next_hop(k.origin);
                let down = topo.next_hop(r.dst);
                up.is_none() || down.is_none() || up == down
            };
            if dead || off_path {
                gone.push((k, r.dst, dead));
            }
        }
        gone.sort_unstable();
        for (k, dst, dead) in gone {
            if let Some(r) = self.table.remove(&k, dst)
                && r.role == Role::Origin
            {
                let err = if dead {
                    SendError::NodeDown(r.dst)
                } else {
                    SendError::Unreachable(r.dst)
                };
                self.complete(r.token, Err(err));
            }
        }
        self.inbound.retain(|origin, _| !topo.is_failed(*origin));
        self.outbound.retain(|dst, _| !topo.is_failed(*dst));
        self.acks_due.retain(|(o, d), (_, to, _)| {
            !(topo.is_failed(*o) || topo.is_failed(*d) || topo.is_failed(*to))
        });
        self.transmits.retain(|t| {
            let to = match t {
                Transmit::Data { to, .. } | Transmit::Control { to, .. } => *to,
            };
            !topo.is_failed(to)
        });
    }

    /// A link update arrived from `from`.
    pub(super) fn on_link_update(
        &mut self,
        now: Instant,
        topo: &dyn Topology,
        from: Rank,
        depth: u32,
        offers: &[Offer],
        _post: &mut Post<'_>,
    ) {
        let mine = topo.depth();
        let fresh = (topo.parent() == Some(from) && depth.checked_add(1) == Some(mine))
            || (topo.children().contains(&from) && mine.checked_add(1) == Some(depth));
        if !fresh {
            self.stats.ignored += 1;
            log::debug!(
                "rank {}: relm link update from {from} (depth {depth}, mine {mine}) ignored",
                self.me
            );
            return;
        }
        self.gate.awaiting.remove(&from);
        for o in offers {
            if topo.is_failed(o.key.origin) || topo.is_failed(o.dst) {
                continue;
            }
            // Only messages that flow from `from` through this daemon concern it.
            if topo.next_hop(o.key.origin) != Some(from) {
                continue;
            }
            if o.dst == self.me {
                let posted = self.inbound.get(&o.key.origin).map(|i| (i.posted, i.life));
                match posted {
                    Some((p, life)) if p != uid::NONE && uid::at_or_before(o.key.uid, p) => {
                        self.ack_due((o.key.origin, self.me, life), p, from);
                    }
                    _ if self.table.get(&o.key, o.dst).is_some() => {}
                    _ => self.transmits.push_back(Transmit::Control {
                        to: from,
                        control: Control::Request {
                            key: o.key,
                            dst: o.dst,
                        },
                    }),
                }
            } else if self.table.get(&o.key, o.dst).is_none() {
                self.transmits.push_back(Transmit::Control {
                    to: from,
                    control: Control::Request {
                        key: o.key,
                        dst: o.dst,
                    },
                });
            }
        }
        self.try_release(now, topo);
    }

    /// Sends what the gate allows (see the module comment).
    pub(super) fn try_release(&mut self, now: Instant, topo: &dyn Topology) {
        match self.gate.awaiting.len() {
            0 => self.release_gate(now, topo),
            1 => {
                let only = self.gate.awaiting.iter().next().copied();
                if let Some(n) = only
                    && self.gate.owed.remove(&n)
                {
                    self.send_update(topo, n);
                }
            }
            _ => {}
        }
    }

    /// The gate is open: every owed update, then everything pending.
    pub(super) fn release_gate(&mut self, now: Instant, topo: &dyn Topology) {
        self.gate.deadline = None;
        let mut owed: Vec<Rank> = self.gate.owed.drain().collect();
        owed.sort_unstable();
        for n in owed {
            self.send_update(topo, n);
        }
        let resend_all = std::mem::take(&mut self.gate.resend_all);
        let mut held: Vec<(MsgKey, Rank)> = self
            .table
            .iter()
            .filter(|(_, r)| r.data.is_some() && r.state == MsgState::Sending)
            .map(|(k, r)| (k, r.dst))
            .collect();
        held.sort_unstable();
        for (key, dst) in held {
            self.transmit(topo, key, dst, None);
        }
        if resend_all {
            // Every unacknowledged message of this origin is resent after one more gate period,
            // not at once: the destinations re-acknowledge every chain now (below, on their
            // side), and what those acks cover need not travel again. What they do not cover
            // goes out through the retransmission timer.
            let soon = now + Duration::from_millis(self.cfg.gate_ms);
            let mine: Vec<(MsgKey, Rank)> = self
                .table
                .iter()
                .filter(|(_, r)| r.role == Role::Origin && r.retransmit_at > soon)
                .map(|(k, r)| (k, r.dst))
                .collect();
            for (key, dst) in mine {
                if let Some(r) = self.table.get_mut(&key, dst) {
                    r.retransmit_at = soon;
                }
            }
        }
        if resend_all {
            let mut chains: Vec<(Rank, u32, u16)> = self
                .inbound
                .iter()
                .filter(|(_, i)| i.posted != uid::NONE)
                .map(|(o, i)| (*o, i.posted, i.life))
                .collect();
            chains.sort_unstable();
            for (origin, upto, life) in chains {
                if let Some(up) = topo.next_hop(origin) {
                    self.ack_due((origin, self.me, life), upto, up);
                }
            }
        }
        self.arm_tick(now);
    }

    /// This daemon's link update for neighbour `n`: every message it holds with data that is
    /// routed towards `n`, in frames of at most `RELM_UPDATE_ENTRIES_MAX` entries.
    fn send_update(&mut self, topo: &dyn Topology, n: Rank) {
        let mut offers: Vec<Offer> = self
            .table
            .iter()
            .filter(|(_, r)| r.data.is_some() && r.role != Role::Destination)
            .filter(|(_, r)| topo.next_hop(r.dst) == Some(n))
            .map(|(k, r)| Offer {
                key: k,
                dst: r.dst,
                state: r.state,
            })
            .collect();
        offers.sort_unstable_by_key(|o| (o.key, o.dst));
        let depth = topo.depth();
        if offers.is_empty() {
            self.stats.link_updates += 1;
            self.transmits.push_back(Transmit::Control {
                to: n,
                control: Control::LinkUpdate {
                    depth,
                    offers: Vec::new(),
                },
            });
            return;
        }
        for chunk in offers.chunks(RELM_UPDATE_ENTRIES_MAX) {
            self.stats.link_updates += 1;
            self.transmits.push_back(Transmit::Control {
                to: n,
                control: Control::LinkUpdate {
                    depth,
                    offers: chunk.to_vec(),
                },
            });
        }
    }
}
