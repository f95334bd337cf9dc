//! The origin gate: which destinations this daemon's callers may send to now, published by
//! the loop thread for the threads that submit sends, so that flow control refuses a send
//! `Busy` when it is submitted rather than after it crossed the command channel.
//!
//! The loop recomputes the gate from [`crate::node::Node::may_originate_to`] whenever
//! [`crate::node::Node::origin_gate_version`] changes. A submitting thread that reads a stale
//! answer either is refused a little late (the congestion just ended) or has its send accepted
//! a little late (it just began): the queue then overshoots its high-water mark by at most
//! what the bounded command channel holds, and nothing is dropped.

use crate::Rank;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// A bit per destination rank: set while the next hop towards it is congested.
#[derive(Debug)]
pub(crate) struct OriginGate {
    /// Whether any bit may be set: the common answer, no, costs one load per send.
    any: AtomicBool,
    blocked: Box<[AtomicU64]>,
    size: u32,
    /// Sends refused by the gate (added to the `sends_busy_flow` counter).
    refused: AtomicU64,
    /// Payload bytes of sends submitted and not yet taken by the loop: what can still reach a
    /// queue after the gate closed. Bounded by `in_channel_max`, so that a burst submitted
    /// before the loop saw any congestion cannot carry a queue past its hard bound.
    in_channel: AtomicUsize,
    in_channel_max: usize,
}

impl OriginGate {
    /// An open gate for a DVM of `size` ranks, letting at most `in_channel_max` payload bytes
    /// wait in the command channel (a single larger send still passes alone).
    pub(crate) fn new(size: u32, in_channel_max: usize) -> Self {
        let words = (size as usize).div_ceil(64);
        OriginGate {
            any: AtomicBool::new(false),
            blocked: (0..words).map(|_| AtomicU64::new(0)).collect(),
            size,
            refused: AtomicU64::new(0),
            in_channel: AtomicUsize::new(0),
            in_channel_max,
        }
    }

    /// Reserves room for a send of `len` payload bytes in the command channel; false (counted
    /// as a refusal) if the channel already holds its share. Undo with [`OriginGate::taken`]
    /// if the send is not submitted after all.
    pub(crate) fn admit_bytes(&self, len: usize) -> bool {
        let before = self.in_channel.fetch_add(len, Ordering::AcqRel);
        if before > 0 && before.saturating_add(len) > self.in_channel_max {
            self.in_channel.fetch_sub(len, Ordering::AcqRel);
            self.refused.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// The payload bytes the command channel may hold (`admit_bytes` lets one larger send
    /// through alone).
    pub(crate) fn bytes_share(&self) -> usize {
        self.in_channel_max
    }

    /// The loop took a send of `len` payload bytes from the channel (or it was never sent).
    pub(crate) fn taken(&self, len: usize) {
        let _ = self
            .in_channel
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                Some(v.saturating_sub(len))
            });
    }

    /// Whether a send to `dst` is refused now; counts the refusal.
    pub(crate) fn refuses(&self, dst: Rank) -> bool {
        if !self.any.load(Ordering::Acquire) {
            return false;
        }
        let word = self
            .blocked
            .get(dst as usize / 64)
            .map_or(0, |w| w.load(Ordering::Relaxed));
        let refused = word & (1u64 << (dst % 64)) != 0;
        if refused {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        refused
    }

    /// Sends the gate refused so far.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Publishes new answers: `blocked(dst)` for every rank, or none at all when `open`.
    /// Loop thread only.
    pub(crate) fn publish(&self, open: bool, mut blocked: impl FnMut(Rank) -> bool) {
        if open {
            self.any.store(false, Ordering::Release);
            return;
        }
        let mut any = false;
        for (i, w) in self.blocked.iter().enumerate() {
            let mut bits = 0u64;
            for b in 0..64u64 {
                let r = i as u64 * 64 + b;
                if let Ok(r) = Rank::try_from(r)
                    && r < self.size
                    && blocked(r)
                {
                    bits |= 1 << b;
                }
            }
            any |= bits != 0;
            w.store(bits, Ordering::Relaxed);
        }
        self.any.store(any, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_channel_holds_a_bounded_number_of_bytes_but_always_one_send() {
        let g = OriginGate::new(4, 100);
        assert!(
            g.admit_bytes(500),
            "one send larger than the share passes alone"
        );
        assert!(!g.admit_bytes(1));
        g.taken(500);
        assert!(g.admit_bytes(60) && g.admit_bytes(40));
        assert!(!g.admit_bytes(1));
        g.taken(60);
        assert!(g.admit_bytes(60));
        assert_eq!(g.refused(), 2);
    }

    #[test]
    fn an_open_gate_refuses_nothing_and_a_closed_one_only_what_it_names() {
        let g = OriginGate::new(130, usize::MAX);
        assert!(!g.refuses(5));
        g.publish(false, |r| r == 5 || r == 129);
        assert!(g.refuses(5) && g.refuses(129));
        assert!(!g.refuses(4) && !g.refuses(128));
        // Out of range: the handle rejects it before asking; the gate does not panic.
        assert!(!g.refuses(10_000));
        assert_eq!(g.refused(), 2);
        g.publish(true, |_| true);
        assert!(!g.refuses(5));
        g.publish(false, |_| false);
        assert!(!g.refuses(5));
    }
}
