//! Which plain messages sent before the fault window may have been in flight at a fault.
//!
//! The fault window opens `--loss-grace-ms` before the first fault: the grace is a guess at how
//! long a plain message stays in flight. Under overload it stays much longer. In the
//! 256-daemon overload run with kills (README "Overload"), messages waited seconds in relays'
//! queues, and 1,379 sent in the first half second were lost with rank 7, killed at 6.1 s.
//! All five examples in the report were sent through rank 7.
//!
//! So a plain message sent before the window is excused too, but only with evidence that it
//! may have been in flight at a fault. All three of these must hold:
//! - It was sent before that fault.
//! - The dying daemon was on its path: in the tree as it was when the daemon died (the
//!   harness's earlier kills, stops and cuts applied; a restarted daemon counts as living).
//!   With `--route direct` or `auto` a message may take a direct link instead, so the path is
//!   not checked.
//! - It was not overtaken: no plain message between the same two daemons, accepted after it,
//!   arrived before that fault. Plain messages between two daemons arrive in order while no
//!   fault intervenes, so one that was overtaken was not in flight any more; it was lost.
//!
//! Such a loss is allowed and reported, like one inside the window. Any other loss fails the
//! run.

use std::collections::HashMap;

use super::{Fault, FaultKind};

/// One fault, as this check needs it.
struct Death {
    rank: u32,
    at_ns: u64,
    /// Parent of every living rank in the tree the daemon died in (rank 0: `None`).
    parents: HashMap<u32, Option<u32>>,
}

/// The evidence, gathered as the run's deliveries are read.
pub struct InFlight {
    deaths: Vec<Death>,
    /// Whether messages follow the tree (`--route tree`).
    tree_only: bool,
    /// (origin, destination) -> (place in the origin's accepted order, arrival ns) of each
    /// plain message that arrived before the last fault.
    arrivals: HashMap<(u32, u32), Vec<(u64, u64)>>,
    last_ns: u64,
}

impl InFlight {
    /// The faults the run injected, in time order (those not injected are skipped).
    pub fn new(radix: u32, size: u32, faults: &[Fault], tree_only: bool) -> InFlight {
        let mut deaths = Vec::new();
        let mut before: Vec<u32> = Vec::new();
        for f in faults {
            let Some(at_ns) = f.injected_ns else {
                continue;
            };
            let parents = tbon::routed::tree_view(radix, size, &before)
                .map(|v| v.into_iter().map(|n| (n.rank, n.parent)).collect())
                .unwrap_or_default();
            deaths.push(Death {
                rank: f.rank,
                at_ns,
                parents,
            });
            if f.kind != FaultKind::Restart {
                before.push(f.rank);
            }
        }
        let last_ns = deaths.iter().map(|d| d.at_ns).max().unwrap_or(0);
        InFlight {
            deaths,
            tree_only,
            arrivals: HashMap::new(),
            last_ns,
        }
    }

    /// A plain message from `origin`, `place` in its accepted order, arrived at `dst`.
    pub fn arrived(&mut self, origin: u32, dst: u32, place: u64, recv_ns: u64) {
        if recv_ns < self.last_ns {
            self.arrivals
                .entry((origin, dst))
                .or_default()
                .push((place, recv_ns));
        }
    }

    /// Whether a lost plain message (from `origin` to `dst`, `place` in the origin's accepted
    /// order, sent at `sent_ns`) may have been in flight at one of the faults.
    pub fn excuses(&self, origin: u32, dst: u32, place: u64, sent_ns: u64) -> bool {
        let later = self.arrivals.get(&(origin, dst));
        self.deaths.iter().any(|d| {
            sent_ns < d.at_ns
                && (!self.tree_only || on_path(&d.parents, origin, dst, d.rank))
                && !later.is_some_and(|a| a.iter().any(|&(p, t)| p > place && t < d.at_ns))
        })
    }
}

/// Whether `via` is on the tree path from `a` to `b` (either end included). A rank missing
/// from the tree (the harness could not tell where it was) counts as on the path.
fn on_path(parents: &HashMap<u32, Option<u32>>, a: u32, b: u32, via: u32) -> bool {
    let up = |mut r: u32| {
        let mut chain = vec![r];
        // A tree's depth bounds the walk; the bound guards against a malformed map.
        for _ in 0..parents.len() {
            match parents.get(&r) {
                Some(Some(p)) => {
                    r = *p;
                    chain.push(r);
                }
                Some(None) => return Some(chain),
                None => return None,
            }
        }
        None
    };
    let (Some(ua), Some(ub)) = (up(a), up(b)) else {
        return true;
    };
    // Both chains end at rank 0; the path is each chain up to their lowest common rank.
    let Some(meet) = ua.iter().find(|r| ub.contains(r)) else {
        return true;
    };
    let half = |chain: &[u32]| chain.iter().take_while(|r| *r != meet).any(|r| *r == via);
    *meet == via || half(&ua) || half(&ub)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(rank: u32, at_ns: u64) -> Fault {
        Fault {
            rank,
            at_s: 0.0,
            kind: FaultKind::Kill,
            injected_ns: Some(at_ns),
            resumed: false,
            exit_after_resume: None,
            restarted_ns: None,
        }
    }

    #[test]
    fn only_a_message_through_the_dead_daemon_not_overtaken_is_excused() {
        // Radix 4, 256 ranks: rank 7's subtree is every rank = 7 (mod 16) from 7 on.
        let mut f = InFlight::new(4, 256, &[fault(7, 1_000)], true);
        // 66 -> 87 crosses 7 (87's grandparent); 66 -> 86 does not.
        assert!(f.excuses(66, 87, 5, 100));
        assert!(!f.excuses(66, 86, 5, 100));
        // Sent after the death: not this check's business (the window's).
        assert!(!f.excuses(66, 87, 5, 2_000));
        // A later message of the pair arrived before the death: it was overtaken.
        f.arrived(66, 87, 6, 900);
        assert!(!f.excuses(66, 87, 5, 100));
        // An earlier one arriving says nothing.
        assert!(f.excuses(66, 87, 7, 100));
        // Without the tree rule (direct links), any path.
        let g = InFlight::new(4, 256, &[fault(7, 1_000)], false);
        assert!(g.excuses(66, 86, 5, 100));
    }

    #[test]
    fn paths_meet_at_the_lowest_common_rank() {
        let parents: HashMap<u32, Option<u32>> = tbon::routed::tree_view(2, 7, &[])
            .unwrap()
            .into_iter()
            .map(|n| (n.rank, n.parent))
            .collect();
        // 0 -> {1, 2}; 1 -> {3, 5}; 2 -> {4, 6}.
        assert!(on_path(&parents, 3, 5, 1));
        assert!(!on_path(&parents, 3, 5, 0));
        assert!(on_path(&parents, 3, 4, 0));
        assert!(on_path(&parents, 3, 4, 2));
        assert!(!on_path(&parents, 3, 4, 6));
    }
}
