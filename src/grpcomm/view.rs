//! A collective core's copy of where its daemon sits in the tree, and the view digest.
//!
//! The cores do not own a [`RoutingState`]; they copy its parent, children and failed set at
//! creation and follow it through the [`RecoveryStatus`] of every repair.
//!
//! # The view digest
//! The repaired tree is a pure function of the failed set, so two daemons that know the same
//! failures agree on every parent and subtree. Messages whose meaning depends on the tree (an
//! acknowledgement covers "my subtree", a contribution covers "my subtree") carry a 64-bit
//! digest of the sender's failed set, and the receiver counts them only under the same digest.
//! The digest is the wrapping sum of a 64-bit mix of each failed rank: independent of the order
//! in which failures were learnt, and cheap to update. Two different failed sets collide with
//! probability about 2^-64; peers are authenticated, so nobody chooses ranks to force one.
use crate::Rank;
use crate::routed::{RecoveryStatus, RoutingState};
use std::collections::BTreeSet;

/// The digest term of one failed rank (splitmix64's finaliser).
fn mix(rank: Rank) -> u64 {
    let mut z = u64::from(rank).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What one repair changed for a core.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Change {
    /// The failed set grew (the digest changed).
    pub view_changed: bool,
    /// The parent is a different rank, or this daemon was promoted: the parent treats it as a
    /// new child.
    pub new_upstream: bool,
    /// Children the daemon must treat as new (not children before, or every child after a
    /// promotion).
    pub new_children: Vec<Rank>,
    /// This daemon itself was declared failed.
    pub died: bool,
}

/// Parent, children and failed set of one daemon, as a core sees them.
#[derive(Debug, Clone)]
pub(crate) struct TreeView {
    pub me: Rank,
    pub size: u32,
    pub parent: Option<Rank>,
    /// Living children, ascending.
    pub children: Vec<Rank>,
    pub failed: BTreeSet<Rank>,
    pub digest: u64,
    /// This daemon was declared failed: the core ignores every further input.
    pub dead: bool,
}

impl TreeView {
    pub fn new(routing: &RoutingState) -> Self {
        let failed: BTreeSet<Rank> = routing.failed().collect();
        let digest = failed.iter().fold(0u64, |d, &r| d.wrapping_add(mix(r)));
        let me = routing.me();
        TreeView {
            me,
            size: routing.size(),
            parent: routing.parent(),
            children: routing.children().to_vec(),
            dead: failed.contains(&me),
            failed,
            digest,
        }
    }

    pub fn is_child(&self, r: Rank) -> bool {
        self.children.binary_search(&r).is_ok()
    }

    /// Follow one repair. The caller must hand every `RecoveryStatus` its `RoutingState`
    /// returned, in order: a missed one leaves the digest behind the other daemons' and this
    /// daemon's acknowledgements and contributions are never counted.
    pub fn apply(&mut self, status: &RecoveryStatus) -> Change {
        let mut change = Change::default();
        if self.dead {
            return change;
        }
        for &r in &status.newly_failed {
            if r < self.size && self.failed.insert(r) {
                self.digest = self.digest.wrapping_add(mix(r));
                change.view_changed = true;
            }
        }
        // A daemon restarted under a failed rank and admitted again (issue "Rejoin"): its rank
        // leaves the failed set, so the digest comes back to what it would be had it never
        // failed.
        for &r in &status.restored {
            if self.failed.remove(&r) {
                self.digest = self.digest.wrapping_sub(mix(r));
                change.view_changed = true;
            }
        }
        if self.failed.contains(&self.me) {
            self.dead = true;
            change.died = true;
            self.parent = None;
            self.children.clear();
            return change;
        }
        // A daemon that moved to another slot (up after a failure, down when the rank it
        // replaced returns) is a new child to its parent, and its children are new to it.
        let moved = status.promoted || status.demoted;
        change.new_upstream = moved || status.new_parent != self.parent;
        let mut children = status.new_children.clone();
        children.sort_unstable();
        children.dedup();
        change.new_children = children
            .iter()
            .copied()
            .filter(|c| moved || !self.is_child(*c))
            .collect();
        self.parent = status.new_parent;
        self.children = children;
        change
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routed::Scope;

    #[test]
    fn digest_ignores_order_and_tracks_promotion() {
        let base = RoutingState::new(2, 15, 0).unwrap();
        let mut a = base.clone();
        let mut b = base.clone();
        a.fail(&[3], Scope::Local, None).unwrap();
        a.fail(&[5], Scope::Local, None).unwrap();
        b.fail(&[5, 3], Scope::Local, None).unwrap();
        assert_eq!(TreeView::new(&a).digest, TreeView::new(&b).digest);
        assert_ne!(TreeView::new(&a).digest, TreeView::new(&base).digest);

        // Radix 2: 1 -> {3, 5}. One of them is the heir of rank 1 and is promoted.
        let mut promoted = 0;
        for r in [3, 5] {
            let mut state = base.as_seen_by(r).unwrap();
            let mut view = TreeView::new(&state);
            let status = state.fail(&[1], Scope::Global, Some(1)).unwrap();
            let change = view.apply(&status);
            assert!(change.view_changed && change.new_upstream && !change.died);
            assert_eq!(view.parent, state.parent());
            assert_eq!(view.children, state.children());
            if status.promoted {
                promoted += 1;
                assert_eq!(change.new_children, view.children);
            }
        }
        assert_eq!(promoted, 1);

        let mut one = base.as_seen_by(1).unwrap();
        let mut view = TreeView::new(&one);
        let change = view.apply(&one.fail(&[1], Scope::Global, None).unwrap());
        assert!(change.died && view.dead);
    }
}
