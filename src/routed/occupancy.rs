//! Which living rank occupies which slot, stored only where that differs from the failure-free
//! tree, and recomputed one region at a time.
//!
//! Two facts make a cheap repair possible:
//! - The ranks of subtree(s) that occupy ancestor slots of `s` are a prefix of the living ranks
//!   in the pre-order walk of subtree(s) (at most depth(s) of them), so the occupant of `s` is
//!   the next living rank of that walk after the prefix (its *heir*).
//! - When a living rank `f` dies, only the slots inside the subtree of the slot `f` occupied can
//!   change: no prefix above that slot contains `f`.
use std::collections::HashMap;

use super::Shape;
use crate::Rank;

/// The first living rank of the walk rooted at `slot`, after `after` (from `slot` itself when
/// `after` is `None`); `failed` must be sorted.
pub(crate) fn heir(
    shape: &Shape,
    failed: &[Rank],
    slot: Rank,
    after: Option<Rank>,
) -> Option<Rank> {
    let dead = |r: Rank| failed.binary_search(&r).is_ok();
    match after {
        None if !dead(slot) => Some(slot),
        None => shape.next_living_in(slot, slot, dead),
        Some(a) => shape.next_living_in(slot, a, dead),
    }
}

/// The prefix of `slot` (its used ranks then its occupant) split among its child slots, in the
/// walk's order.
pub(crate) fn split_prefix(shape: &Shape, slot: Rank, prefix: &[Rank]) -> Vec<(Rank, Vec<Rank>)> {
    let mut groups: Vec<(Rank, Vec<Rank>)> = Vec::new();
    for &x in prefix {
        if let Some((child, _)) = shape.child_toward(slot, x) {
            match groups.iter_mut().find(|(c, _)| *c == child) {
                Some((_, group)) => group.push(x),
                None => groups.push((child, vec![x])),
            }
        }
    }
    groups
}

/// The slots whose occupant is not their own rank. Canonical: it depends only on the shape and
/// the failed set, never on the order failures were applied in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Occupancy {
    /// Slot -> occupant for every slot taken by an heir; `None` marks the top slot of a hole
    /// (the slots below it are holes too and are not listed).
    displaced: HashMap<Rank, Option<Rank>>,
    /// Rank -> slot for every promoted living rank.
    promoted: HashMap<Rank, Rank>,
}

impl Occupancy {
    /// The slot `rank` occupies (its own unless promoted). Meaningless for failed ranks.
    pub(crate) fn slot_of(&self, rank: Rank) -> Rank {
        self.promoted.get(&rank).copied().unwrap_or(rank)
    }

    /// The occupant of `slot`, valid when the parent slot of `slot` is occupied.
    pub(crate) fn occupant(&self, slot: Rank) -> Option<Rank> {
        match self.displaced.get(&slot) {
            Some(occupant) => *occupant,
            None => Some(slot),
        }
    }

    /// Recompute everything for `failed` (sorted).
    pub(crate) fn rebuild(&mut self, shape: &Shape, failed: &[Rank]) {
        self.recompute(shape, failed, 0);
    }

    /// Recompute the slots inside subtree(`top`), where `top` is occupied and everything
    /// outside subtree(`top`) is already right for `failed` (sorted).
    pub(crate) fn recompute(&mut self, shape: &Shape, failed: &[Rank], top: Rank) {
        // Occupants of ancestor slots lying inside subtree(top), root first = walk order.
        let mut ancestors = shape.ancestors(top);
        ancestors.reverse();
        let used: Vec<Rank> = ancestors
            .into_iter()
            .filter_map(|a| self.occupant(a))
            .filter(|&o| shape.in_subtree(top, o))
            .collect();
        if top == 0 {
            self.displaced.clear();
            self.promoted.clear();
        } else {
            self.displaced
                .retain(|&slot, _| !shape.in_subtree(top, slot));
            self.promoted
                .retain(|_, &mut slot| !shape.in_subtree(top, slot));
        }
        self.visit(shape, failed, top, used);
        // A failed slot not reached from above has no used ranks: any used rank would have
        // dragged the visit down to it. Ascending rank order is depth order, so every region
        // above a failed slot is settled before it is looked at.
        for &dead in failed.iter().filter(|&&r| shape.in_subtree(top, r)) {
            if self.displaced.contains_key(&dead) {
                continue;
            }
            let in_hole = shape
                .ancestors(dead)
                .iter()
                .any(|a| self.displaced.get(a) == Some(&None));
            if !in_hole {
                self.visit(shape, failed, dead, Vec::new());
            }
        }
    }

    /// Settle `slot`, whose used ranks (occupants of ancestor slots inside its subtree, in
    /// walk order) are `used`, then every child slot that holds part of its prefix.
    fn visit(&mut self, shape: &Shape, failed: &[Rank], slot: Rank, mut used: Vec<Rank>) {
        let Some(occupant) = heir(shape, failed, slot, used.last().copied()) else {
            self.displaced.insert(slot, None);
            return;
        };
        if occupant == slot && used.is_empty() {
            return; // undisturbed: the prefix is the slot alone, no child slot is affected
        }
        if occupant != slot {
            self.displaced.insert(slot, Some(occupant));
            self.promoted.insert(occupant, slot);
        }
        used.push(occupant);
        for (child, group) in split_prefix(shape, slot, &used) {
            self.visit(shape, failed, child, group);
        }
    }
}
