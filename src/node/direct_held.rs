//! Messages for a daemon whose direct link closes: held while it closes, then handed to the
//! tree as the queue towards its next hop may take them (flow control), in order, with the
//! messages sent to it meanwhile behind them.
//!
//! Why the release waits for the queue: a link evicted while the application sends to its
//! peer holds what it sends until the `CloseAck`, a round trip that under load lasts as long
//! as the queues on the way. Handed to the tree all at once, they overfilled the queue towards
//! the next hop past its hard bound, which drops frames (found by the simulator's `overload`
//! checker with the `direct` kind's bursts: regression seed 308,097, 35 frames dropped). So the
//! origin gate refuses new sends to a daemon whose held bytes reach the flow-control high-water
//! mark, and what is held enters the tree's queue only while that queue is not congested.

use super::Node;
use super::direct::Held;
use crate::Rank;
use crate::routed::Route;
use std::collections::VecDeque;

/// What waits for one daemon (at most `limits::DIRECT_HELD_MAX` messages and
/// `DIRECT_HELD_BYTES_MAX` bytes; the origin gate stops new sends at the high-water mark).
#[derive(Debug, Default)]
pub(super) struct HeldFor {
    queue: VecDeque<Held>,
    bytes: usize,
    /// The link ended: the messages go to the tree as its next hop's queue allows.
    released: bool,
}

impl Node {
    /// Keeps a message for `dst` until its closing link's `Release` and room towards the
    /// tree's next hop, within the bounds.
    pub(super) fn hold(&mut self, dst: Rank, m: Held) {
        let was_over = self.held_over(dst);
        let h = self.direct_held.entry(dst).or_default();
        let len = m.1.len();
        if h.queue.len() >= crate::limits::DIRECT_HELD_MAX
            || h.bytes + len > crate::limits::DIRECT_HELD_BYTES_MAX
        {
            // The designed behaviour at the bound (see `limits::DIRECT_HELD_MAX`).
            let waiting = h.queue.len();
            self.counters.dropped_queue_full += 1;
            log::warn!(
                "rank {}: {waiting} messages wait for the direct link to rank {dst} to close; \
                 one more refused",
                self.me
            );
            if let Some(token) = m.2 {
                self.done(
                    token,
                    Err(crate::SendError::Busy(
                        crate::error::Limit::ClosingDirectLink,
                    )),
                );
            }
            return;
        }
        h.bytes += len;
        h.queue.push_back(m);
        self.held_gate_changed(dst, was_over);
    }

    /// Whether messages for `dst` wait here (then a new one waits behind them).
    pub(super) fn holds_for(&self, dst: Rank) -> bool {
        self.direct_held.contains_key(&dst)
    }

    /// The direct link to `peer` ended: what waited for it goes to the tree as room allows.
    pub(super) fn release_held(&mut self, peer: Rank) {
        if let Some(h) = self.direct_held.get_mut(&peer) {
            h.released = true;
        }
        self.drain_held(peer);
    }

    /// Hands released messages for `peer` to the tree while the queue towards its next hop is
    /// not congested; the rest waits for the next pump.
    fn drain_held(&mut self, peer: Rank) {
        // Bounded: each round takes one message out.
        loop {
            let Some(h) = self.direct_held.get(&peer) else {
                return;
            };
            if !h.released {
                return;
            }
            if h.queue.is_empty() {
                let was_over = self.held_over(peer);
                self.direct_held.remove(&peer);
                self.held_gate_changed(peer, was_over);
                return;
            }
            let hop = match self.routing.route(peer) {
                Route::Parent(hop) | Route::Child(hop) => Some(hop),
                // Unreachable: `forward` fails them with the reason.
                _ => None,
            };
            if hop.is_some_and(|hop| self.flow.any_congested() && !self.flow.may_originate(hop)) {
                return;
            }
            let was_over = self.held_over(peer);
            let Some(h) = self.direct_held.get_mut(&peer) else {
                return;
            };
            let Some((header, payload, token)) = h.queue.pop_front() else {
                return;
            };
            h.bytes -= payload.len();
            self.held_gate_changed(peer, was_over);
            self.forward(header, payload, token);
        }
    }

    /// Each turn: released messages that waited for room move on (none in the common case).
    pub(super) fn pump_held(&mut self) {
        if self.direct_held.is_empty() {
            return;
        }
        let mut released: Vec<Rank> = self
            .direct_held
            .iter()
            .filter(|(_, h)| h.released)
            .map(|(r, _)| *r)
            .collect();
        released.sort_unstable();
        for peer in released {
            self.drain_held(peer);
        }
    }

    /// Whether the messages held for `dst` reach the flow-control high-water mark: the origin
    /// gate then refuses new sends to it.
    pub(super) fn held_over(&self, dst: Rank) -> bool {
        self.direct_held
            .get(&dst)
            .is_some_and(|h| h.bytes >= self.flow.limits().high_bytes)
    }

    /// Keeps the count of daemons held over the mark, and the gate's version, true after a
    /// change to `dst`'s held messages.
    fn held_gate_changed(&mut self, dst: Rank, was_over: bool) {
        let over = self.held_over(dst);
        if over != was_over {
            if over {
                self.direct_held_over += 1;
            } else {
                self.direct_held_over -= 1;
            }
            self.direct_held_generation += 1;
        }
    }

    /// Messages waiting for direct links to close or for room towards the tree, in all.
    pub fn direct_held(&self) -> usize {
        self.direct_held.values().map(|h| h.queue.len()).sum()
    }
}
