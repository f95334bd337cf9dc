//! The world's connections: one per pair of daemons at a time (a generation), frames on it in
//! order with their link's latency, what is lost when it drops, redials and what waits for
//! them, and stale frames of an earlier incarnation.

use super::{Ev, REDIAL_ATTEMPTS_MAX, REDIAL_BASE_US, World};
use crate::Rank;
use crate::sim::check::Violation;
use crate::sim::frame::Frame;
use crate::sim::rng::Rng;
use bytes::Bytes;

impl World {
    pub(super) fn pair(a: Rank, b: Rank) -> (Rank, Rank) {
        (a.min(b), a.max(b))
    }

    pub(super) fn generation(&self, a: Rank, b: Rank) -> u64 {
        self.conn_gen.get(&Self::pair(a, b)).copied().unwrap_or(0)
    }

    /// The connection between `a` and `b` drops: what was in flight on it is lost.
    pub(super) fn bump_generation(&mut self, a: Rank, b: Rank) {
        *self.conn_gen.entry(Self::pair(a, b)).or_insert(0) += 1;
        self.conn_lost.insert(Self::pair(a, b));
        if let Some(w) = self.wires.as_mut() {
            w.forget(a, b);
        }
        self.held.remove(&(a, b));
        self.held.remove(&(b, a));
        self.hs_pair_dropped(a, b);
    }

    pub(super) fn down_until(&self, a: Rank, b: Rank) -> u64 {
        self.conn_down_until
            .get(&Self::pair(a, b))
            .copied()
            .unwrap_or(0)
    }

    /// A link fault: the connection between two living daemons drops until `until_us`; both
    /// notice at once.
    pub(super) fn drop_link(&mut self, a: Rank, b: Rank, until_us: u64) {
        if a == b || !(self.living(a) && self.living(b)) {
            return;
        }
        self.stats.link_drops += 1;
        self.bump_generation(a, b);
        let p = Self::pair(a, b);
        let until = self.down_until(a, b).max(until_us);
        self.conn_down_until.insert(p, until);
        let now = self.now_us;
        self.push(now, Ev::LinkLost { node: a, peer: b });
        self.push(now, Ev::LinkLost { node: b, peer: a });
    }

    /// `node` dials `peer` (again), unless a dial is under way.
    pub(super) fn redial(&mut self, node: Rank, peer: Rank, attempt: u32) {
        if attempt == 1 && !self.redialing.insert((node, peer)) {
            return;
        }
        let shift = attempt.saturating_sub(1).min(20);
        let at = self.now_us + REDIAL_BASE_US.saturating_mul(1 << shift);
        self.push(
            at,
            Ev::Redial {
                node,
                peer,
                attempt,
            },
        );
    }

    pub(super) fn on_redial(
        &mut self,
        node: Rank,
        peer: Rank,
        attempt: u32,
    ) -> Result<(), Violation> {
        let now = self.now();
        if !self.living(node) {
            self.redialing.remove(&(node, peer));
            return Ok(());
        }
        let reachable = self.living(peer) && self.down_until(node, peer) <= self.now_us;
        if !reachable {
            if attempt < REDIAL_ATTEMPTS_MAX {
                self.redial(node, peer, attempt + 1);
                return Ok(());
            }
            self.redialing.remove(&(node, peer));
            if let Some(n) = self.nodes.get_mut(node as usize) {
                log::debug!("{} us: rank {node} cannot reach {peer}", self.now_us);
                n.detect(now, peer);
            }
            // As the driver does: the node decides first (a direct link that cannot be made
            // falls back, and what waited for it takes the tree: `fall_back`); what is left
            // was for a rank now taken for dead.
            let after = self.after(node);
            self.parked.remove(&(node, peer));
            return after;
        }
        self.redialing.remove(&(node, peer));
        if !self.conn_lost.contains(&Self::pair(node, peer)) {
            // The peer's own redial got there first: this dial is the one resolved away.
            return Ok(());
        }
        // The peer's handshake: if it knows this daemon is dead it says so and hangs up (not
        // to a newer incarnation, which may be admitted back: `Node::may_link`).
        let incarnation = self
            .nodes
            .get(node as usize)
            .map_or(0, |n| n.node.incarnation());
        let told = self
            .nodes
            .get_mut(peer as usize)
            .filter(|p| !p.node.may_link(node, incarnation))
            .map(|p| p.node.declared_dead_frame(node));
        if let Some(h) = told {
            self.parked.remove(&(node, peer));
            if let Some(n) = self.nodes.get_mut(node as usize) {
                n.handle_frame(now, peer, Frame::new(&h, Bytes::new()));
            }
            return self.after(node);
        }
        if self.hs.is_some() {
            // Through the real handshake and the link rule; `connection_up` once both ends
            // hold the same connection as their link.
            return self.hs_dial(node, peer, attempt);
        }
        self.connection_up(node, peer)
    }

    /// A new connection between `node` and `peer`: both sides' link-up, then what waited for
    /// it, in order.
    pub(super) fn connection_up(&mut self, node: Rank, peer: Rank) -> Result<(), Violation> {
        let now = self.now();
        self.conn_lost.remove(&Self::pair(node, peer));
        for (a, b) in [(node, peer), (peer, node)] {
            if let Some(n) = self.nodes.get_mut(a as usize)
                && !n.node.is_failed(b)
            {
                n.link_up(now, b);
            }
        }
        // The link sessions first: what the last connection did not deliver goes again, in
        // order, ahead of what waited for this one.
        for (a, b, frames) in self.sessions_resume(node, peer)? {
            for f in frames {
                self.transmit(a, b, f, false);
            }
        }
        for (a, b) in [(node, peer), (peer, node)] {
            let frames = self.parked.remove(&(a, b)).unwrap_or_default();
            for f in frames {
                self.transmit(a, b, f, false);
            }
        }
        self.after(node)?;
        self.after(peer)
    }

    /// `node`'s messages to `peer` took a direct link and now take the tree: what waited for
    /// that connection goes over the tree, before anything the node sends next.
    /// As the driver does, the connection (if `peer` is no tree neighbour of `node`'s) closes:
    /// what either end had not read on it is lost, and `peer` sees it lost.
    pub(super) fn fall_back(&mut self, node: Rank, peer: Rank) {
        // Its frames take the tree from now on: written again later on a new link, they would
        // arrive behind those (the driver resets the session likewise).
        self.session_reset(node, peer);
        let neighbour = self
            .nodes
            .get(node as usize)
            .is_none_or(|n| n.node.is_neighbour(peer));
        if !neighbour && !self.conn_lost.contains(&Self::pair(node, peer)) {
            self.bump_generation(node, peer);
            if self.living(peer) {
                let now = self.now_us;
                self.push(
                    now,
                    Ev::LinkLost {
                        node: peer,
                        peer: node,
                    },
                );
            }
        }
        let frames = self.parked.remove(&(node, peer)).unwrap_or_default();
        if frames.is_empty() {
            return;
        }
        if self.wires.is_some() {
            self.report_queue(node, peer);
        }
        let moved = match self.nodes.get_mut(node as usize) {
            Some(n) => n.reroute(frames),
            None => return,
        };
        for (hop, frame) in moved {
            self.transmit(node, hop, frame, false);
        }
    }

    pub(super) fn transmit(&mut self, from: Rank, to: Rank, frame: Frame, heartbeat: bool) {
        if self.conn_lost.contains(&Self::pair(from, to)) {
            // No connection: the frame waits for one, and one is dialled.
            self.parked.entry((from, to)).or_default().push(frame);
            self.redial(from, to, 1);
            if self.wires.is_some() {
                self.report_queue(from, to);
            }
            return;
        }
        if self.wires.is_some() {
            self.wire_transmit(from, to, frame, heartbeat);
            return;
        }
        self.travel(from, to, frame, heartbeat);
    }

    /// The frame crosses the link: its latency (and the seed's slow windows, stale copies and
    /// duplicates), in order with the link's earlier frames.
    pub(super) fn travel(&mut self, from: Rank, to: Rank, frame: Frame, heartbeat: bool) {
        // It leaves the sender: its link session keeps it until acknowledged.
        self.session_written(from, to, &frame);
        let lat =
            self.scen.latency_us + self.rng.range(0, self.scen.jitter_us) + self.spread(from, to);
        // Overlapping slow windows do not compound: the slowest one applies.
        let factor = self
            .slow
            .iter()
            .filter(|&&(a, b, start, end, _)| {
                ((a, b) == (from, to) || (b, a) == (from, to))
                    && (start..end).contains(&self.now_us)
            })
            .map(|&(.., factor)| factor)
            .max()
            .unwrap_or(1);
        let lat = lat.saturating_mul(factor);
        let generation = self.generation(from, to);
        if self.scen.stale_rate > 0.0 && self.rng.chance(self.scen.stale_rate) {
            // A copy from the sender's earlier incarnation turns up some time later (an old
            // connection's leftovers: no order with this one).
            if let Some(stale) = stale_copy(&frame) {
                let at = self.now_us + self.rng.range(0, 20 * lat.max(1));
                self.push(
                    at,
                    Ev::Frame {
                        from,
                        to,
                        frame: stale,
                        generation,
                        heartbeat: false,
                        counted: false,
                    },
                );
            }
        }
        let twice = self.scen.dup_rate > 0.0
            && tolerates_duplicates(&frame)
            && self.rng.chance(self.scen.dup_rate);
        // Under the sweep's cost model a frame leaves when the sender's interface is done
        // with the frames before it.
        let depart = self
            .sweep
            .as_mut()
            .and_then(|s| s.cpus.send(from, frame.wire_len()))
            .unwrap_or(self.now_us);
        // TCP: a link delivers in order.
        let last = self.link_last.entry((from, to)).or_insert(0);
        let at = (depart + lat).max(*last);
        *last = at;
        if twice {
            self.stats.duplicated += 1;
            self.push(
                at,
                Ev::Frame {
                    from,
                    to,
                    frame: frame.clone(),
                    generation,
                    heartbeat,
                    counted: false,
                },
            );
        }
        self.push(
            at,
            Ev::Frame {
                from,
                to,
                frame,
                generation,
                heartbeat,
                counted: true,
            },
        );
    }

    /// The link's own extra latency (the same for every frame on it).
    pub(super) fn spread(&self, from: Rank, to: Rank) -> u64 {
        if self.scen.link_spread_us == 0 {
            return 0;
        }
        let (a, b) = Self::pair(from, to);
        let mut r = Rng::new((u64::from(a) << 32 | u64::from(b)) ^ self.scen.link_spread_us);
        r.range(0, self.scen.link_spread_us)
    }
}

/// RELM's and the collectives' frames: the cores must take a second copy in their stride.
fn tolerates_duplicates(frame: &Frame) -> bool {
    use crate::oob::header::Kind;
    frame
        .decode()
        .ok()
        .is_some_and(|h| matches!(h.kind, Kind::RelmData | Kind::Relm | Kind::Grpcomm))
}

/// The frame as its sender's previous incarnation would have sent it.
fn stale_copy(frame: &Frame) -> Option<Frame> {
    let mut h = frame.decode().ok()?;
    h.epoch = h.epoch.checked_sub(1)?;
    Some(frame.with_header(&h))
}
