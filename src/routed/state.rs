//! One daemon's routing state: what it knows has failed, where it sits in the repaired tree,
//! and the next hop towards any rank.
use super::occupancy::Occupancy;
use super::{Shape, TreeError, check_failed};
use crate::Rank;

/// The next hop for a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The target is this daemon: deliver locally.
    Local,
    /// Send to this rank, the parent (lifeline).
    Parent(Rank),
    /// Send to this rank, the living child whose slot's subtree holds the target.
    Child(Rank),
    /// The target has failed or is out of range: fail the send.
    Unreachable,
}

/// Whether a repair comes from this daemon's own detection or from rank 0's confirmation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// This daemon saw the failure itself (a lost connection, a missed heartbeat).
    Local,
    /// Rank 0 confirmed the failure to every daemon, with a new epoch.
    Global,
}

/// What a repair changed for this daemon, handed to the fault handlers.
///
/// After a promotion handlers should treat every child as new.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryStatus {
    /// `Local` for a repair this daemon made on its own knowledge (a neighbour's death), before
    /// rank 0 confirmed it; `Global` for rank 0's confirmation, which every survivor applies.
    pub scope: Scope,
    /// Ranks newly known to have failed, ascending (ranks already known are left out).
    pub newly_failed: Vec<Rank>,
    /// Ranks put back into the tree, ascending ([`RoutingState::restore`]: a daemon restarted
    /// under its rank and admitted again); empty for a repair after failures.
    pub restored: Vec<Rank>,
    /// Ranks that left the DVM in order (`Handle::leave`), ascending: the tree is repaired
    /// around them as around the dead, but they are no failures and never in `newly_failed`.
    pub departed: Vec<Rank>,
    /// The DVM epoch this repair brings (with `Global`: rank 0 numbers each confirmed set of
    /// deaths); `None` for a local repair.
    pub epoch: Option<u64>,
    /// This daemon moved up into a shallower slot.
    pub promoted: bool,
    /// This daemon moved down into a deeper slot (never on failures; on a restore, an heir
    /// gives the slot back to the rank that returned).
    pub demoted: bool,
    /// Parent before the repair.
    pub previous_parent: Option<Rank>,
    /// Parent after the repair.
    pub new_parent: Option<Rank>,
    /// Living children before the repair, ascending.
    pub previous_children: Vec<Rank>,
    /// Living children after the repair, ascending.
    pub new_children: Vec<Rank>,
    /// Ancestors before the repair, parent first.
    pub previous_ancestors: Vec<Rank>,
    /// Ancestors after the repair, parent first.
    pub new_ancestors: Vec<Rank>,
}

/// Above this many new failures in one call, recompute the whole tree once instead of one
/// region per failure.
const REBUILD_BATCH: usize = 16;

/// One daemon's view of the repaired radix tree.
///
/// Everything here is a pure function of `(radix, size, failed set, me)`: two daemons that know
/// the same failures agree on the whole tree. The list of children is materialised, so a rank
/// with `c` children costs O(c) memory and O(c) per repair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingState {
    shape: Shape,
    me: Rank,
    /// Failed ranks, ascending.
    failed: Vec<Rank>,
    occupancy: Occupancy,
    /// The slot I occupy.
    slot: Rank,
    depth: u32,
    parent: Option<Rank>,
    ancestors: Vec<Rank>,
    children: Vec<Rank>,
    /// Occupant of each of my child slots, by index `i - 1` (slot = my slot + i·W); `None` for
    /// a hole.
    child_slots: Vec<Option<Rank>>,
    /// Routing down from my slot without searching the layers (`route` runs per frame).
    descent: Option<super::radix::Descent>,
}

impl RoutingState {
    /// The state of daemon `me` in a failure-free tree of `size` ranks and radix `radix`.
    ///
    /// Fails with [`TreeError::RadixTooSmall`], [`TreeError::EmptyTree`] or
    /// [`TreeError::RankOutOfRange`].
    pub fn new(radix: u32, size: u32, me: Rank) -> Result<Self, TreeError> {
        let shape = Shape::new(radix, size)?;
        if me >= size {
            return Err(TreeError::RankOutOfRange { rank: me, size });
        }
        let mut state = RoutingState {
            shape,
            me,
            failed: Vec::new(),
            occupancy: Occupancy::default(),
            slot: me,
            depth: 0,
            parent: None,
            ancestors: Vec::new(),
            children: Vec::new(),
            child_slots: Vec::new(),
            descent: None,
        };
        state.refresh_view();
        Ok(state)
    }

    /// The state daemon `rank` holds when it knows exactly the failures this one knows.
    ///
    /// Cheaper than replaying the failures; used by simulators and tests. Fails with
    /// [`TreeError::RankOutOfRange`].
    pub fn as_seen_by(&self, rank: Rank) -> Result<Self, TreeError> {
        if rank >= self.size() {
            return Err(TreeError::RankOutOfRange {
                rank,
                size: self.size(),
            });
        }
        let mut other = self.clone();
        other.me = rank;
        other.refresh_view();
        Ok(other)
    }

    /// My rank.
    pub fn me(&self) -> Rank {
        self.me
    }

    /// Number of ranks, failed ones included.
    pub fn size(&self) -> u32 {
        self.shape.size()
    }

    /// The radix.
    pub fn radix(&self) -> u32 {
        self.shape.radix()
    }

    /// The tree's failure-free numbering.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// My lifeline; `None` for rank 0 (and for a daemon told of its own death).
    pub fn parent(&self) -> Option<Rank> {
        self.parent
    }

    /// My living children, ascending.
    pub fn children(&self) -> &[Rank] {
        &self.children
    }

    /// My ancestors: parent first, rank 0 last.
    pub fn ancestors(&self) -> &[Rank] {
        &self.ancestors
    }

    /// Depth of the slot I occupy.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// The slot I occupy (my own rank unless promoted).
    pub fn slot(&self) -> Rank {
        self.slot
    }

    /// Whether I occupy a slot other than my own.
    pub fn promoted(&self) -> bool {
        self.slot != self.me
    }

    /// Whether `r` is known to have failed.
    pub fn is_failed(&self, r: Rank) -> bool {
        self.failed.binary_search(&r).is_ok()
    }

    /// Known failed ranks, ascending.
    pub fn failed(&self) -> impl Iterator<Item = Rank> + '_ {
        self.failed.iter().copied()
    }

    /// How many ranks are known failed (it only grows: a cheap "has the tree changed?").
    pub fn failed_count(&self) -> usize {
        self.failed.len()
    }

    /// The slot living rank `r` occupies; `None` if `r` failed or is out of range.
    pub fn slot_of(&self, r: Rank) -> Option<Rank> {
        (r < self.size() && !self.is_failed(r)).then(|| self.occupancy.slot_of(r))
    }

    /// The next hop towards `target`.
    ///
    /// `Unreachable` if `target` failed or is out of range (or if I am myself marked failed);
    /// `Local` for myself; the child whose slot's subtree holds the target's slot; otherwise
    /// the parent.
    pub fn route(&self, target: Rank) -> Route {
        if target >= self.size() || self.is_failed(target) || self.is_failed(self.me) {
            return Route::Unreachable;
        }
        if target == self.me {
            return Route::Local;
        }
        let target_slot = self.occupancy.slot_of(target);
        match self.descent.and_then(|d| d.child_index(target_slot)) {
            Some(i) => match i.checked_sub(1).and_then(|i| self.child_slots.get(i)) {
                Some(Some(child)) => Route::Child(*child),
                // A living rank's slot never lies under a hole.
                _ => Route::Unreachable,
            },
            None => self.parent.map_or(Route::Unreachable, Route::Parent),
        }
    }

    /// Record that `ranks` failed and repair the tree.
    ///
    /// Ranks already known to have failed are ignored. Fails, changing nothing, with
    /// [`TreeError::RankOutOfRange`] for a rank not below the size, or
    /// [`TreeError::RootFailed`] if rank 0 is among them (the caller must then shut the DVM
    /// down). Failing `me` itself is accepted: I then keep no routes.
    pub fn fail(
        &mut self,
        ranks: &[Rank],
        scope: Scope,
        epoch: Option<u64>,
    ) -> Result<RecoveryStatus, TreeError> {
        check_failed(self.size(), ranks)?;
        let mut newly_failed: Vec<Rank> = ranks
            .iter()
            .copied()
            .filter(|&r| !self.is_failed(r))
            .collect();
        newly_failed.sort_unstable();
        newly_failed.dedup();

        let previous_depth = self.depth;
        let previous_parent = self.parent;
        let previous_children = self.children.clone();
        let previous_ancestors = self.ancestors.clone();

        if newly_failed.len() > REBUILD_BATCH {
            self.failed.extend_from_slice(&newly_failed);
            self.failed.sort_unstable();
            self.occupancy.rebuild(&self.shape, &self.failed);
        } else {
            for &rank in &newly_failed {
                // Only the slots under the one the dead rank occupied can change.
                let top = self.occupancy.slot_of(rank);
                if let Err(at) = self.failed.binary_search(&rank) {
                    self.failed.insert(at, rank);
                }
                self.occupancy.recompute(&self.shape, &self.failed, top);
            }
        }
        self.refresh_view();
        Ok(self.status(
            scope,
            epoch,
            newly_failed,
            Vec::new(),
            (
                previous_depth,
                previous_parent,
                previous_children,
                previous_ancestors,
            ),
        ))
    }

    /// Puts `ranks`, known failed, back into the tree: daemons restarted under their ranks and
    /// admitted again (issue "Rejoin"). The tree is a pure function of (radix, size, failed
    /// set), so the result is exactly the tree that would exist had they never failed, given
    /// the failures that remain: each returns to the slot it would hold, and the heirs that
    /// stood in for it move back down. Ranks not known failed are ignored.
    ///
    /// Fails, changing nothing, with [`TreeError::RankOutOfRange`] for a rank not below the
    /// size.
    pub fn restore(
        &mut self,
        ranks: &[Rank],
        scope: Scope,
        epoch: Option<u64>,
    ) -> Result<RecoveryStatus, TreeError> {
        if let Some(&rank) = ranks.iter().find(|&&r| r >= self.size()) {
            return Err(TreeError::RankOutOfRange {
                rank,
                size: self.size(),
            });
        }
        let mut restored: Vec<Rank> = ranks
            .iter()
            .copied()
            .filter(|&r| self.is_failed(r))
            .collect();
        restored.sort_unstable();
        restored.dedup();
        let previous = (
            self.depth,
            self.parent,
            self.children.clone(),
            self.ancestors.clone(),
        );
        if !restored.is_empty() {
            self.failed.retain(|r| restored.binary_search(r).is_err());
            // A returning rank may take back a slot high above its own (the top of a chain of
            // dead ancestors), so the whole occupancy is recomputed: restores are rare, and
            // the recomputation only descends into disturbed regions.
            self.occupancy.rebuild(&self.shape, &self.failed);
            self.refresh_view();
        }
        Ok(self.status(scope, epoch, Vec::new(), restored, previous))
    }

    /// The status of a change from `previous` (depth, parent, children, ancestors) to now.
    fn status(
        &self,
        scope: Scope,
        epoch: Option<u64>,
        newly_failed: Vec<Rank>,
        restored: Vec<Rank>,
        previous: (u32, Option<Rank>, Vec<Rank>, Vec<Rank>),
    ) -> RecoveryStatus {
        let (previous_depth, previous_parent, previous_children, previous_ancestors) = previous;
        let alive = !self.is_failed(self.me);
        RecoveryStatus {
            scope,
            newly_failed,
            restored,
            departed: Vec::new(),
            epoch,
            promoted: alive && self.depth < previous_depth,
            demoted: alive && self.depth > previous_depth,
            previous_parent,
            new_parent: self.parent,
            previous_children,
            new_children: self.children.clone(),
            previous_ancestors,
            new_ancestors: self.ancestors.clone(),
        }
    }

    /// Append ranks so the tree has `new_size` ranks; failed ranks stay failed.
    ///
    /// Fails with [`TreeError::ShrinkNotAllowed`] if `new_size` is below the current size.
    /// The whole tree is recomputed (new ranks can become heirs of old holes).
    pub fn grow(&mut self, new_size: u32) -> Result<(), TreeError> {
        if new_size < self.size() {
            return Err(TreeError::ShrinkNotAllowed);
        }
        if new_size == self.size() {
            return Ok(());
        }
        self.shape = Shape::new(self.radix(), new_size)?;
        self.occupancy.rebuild(&self.shape, &self.failed);
        self.refresh_view();
        Ok(())
    }

    /// Recompute my slot, lifeline, ancestors and children from the occupancy.
    fn refresh_view(&mut self) {
        self.slot = self.occupancy.slot_of(self.me);
        self.depth = self.shape.depth(self.slot);
        self.descent = self.shape.descent(self.slot);
        self.ancestors.clear();
        self.children.clear();
        self.child_slots.clear();
        self.parent = None;
        if self.is_failed(self.me) {
            self.slot = self.me;
            return;
        }
        // Ancestor slots of an occupied slot are all occupied.
        let ancestor_slots = self.shape.ancestors(self.slot);
        self.ancestors.extend(
            ancestor_slots
                .into_iter()
                .filter_map(|a| self.occupancy.occupant(a)),
        );
        self.parent = self.ancestors.first().copied();
        let occupancy = &self.occupancy;
        self.child_slots.extend(
            self.shape
                .children(self.slot)
                .map(|c| occupancy.occupant(c)),
        );
        self.children
            .extend(self.child_slots.iter().flatten().copied());
        self.children.sort_unstable();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repairs_the_prrte_orphan_case() {
        let mut s = RoutingState::new(2, 7, 0).unwrap();
        let status = s.fail(&[1, 5], Scope::Local, None).unwrap();
        assert_eq!(s.children(), [2, 3]);
        assert_eq!(status.newly_failed, [1, 5]);
        assert_eq!(status.previous_children, [1, 2]);
        let three = s.as_seen_by(3).unwrap();
        assert!(three.promoted());
        assert_eq!(three.parent(), Some(0));
        assert_eq!(three.slot(), 1);
        assert_eq!(three.depth(), 1);
        assert!(three.children().is_empty());
        assert_eq!(s.route(3), Route::Child(3));
        assert_eq!(s.route(6), Route::Child(2));
        assert_eq!(s.route(5), Route::Unreachable);
        assert_eq!(three.route(6), Route::Parent(0));
    }

    #[test]
    fn a_restored_rank_takes_its_slot_back() {
        // PRRTE's orphan case undone: 3 stood in for 1; 1 returns, 3 moves back down.
        let mut s = RoutingState::new(2, 7, 3).unwrap();
        s.fail(&[1, 5], Scope::Global, Some(1)).unwrap();
        assert_eq!((s.slot(), s.parent()), (1, Some(0)));
        let status = s.restore(&[1, 4], Scope::Global, Some(2)).unwrap();
        assert_eq!(status.restored, [1]); // 4 never failed
        assert!(status.newly_failed.is_empty());
        assert!(status.demoted && !status.promoted);
        assert_eq!(
            (status.previous_parent, status.new_parent),
            (Some(0), Some(1))
        );
        assert_eq!((s.slot(), s.depth(), s.ancestors()), (3, 2, &[1, 0][..]));
        assert!(s.is_failed(5) && !s.is_failed(1));
        // The rest of the failures stay: the tree is the one with 5 alone failed.
        let mut fresh = RoutingState::new(2, 7, 3).unwrap();
        fresh.fail(&[5], Scope::Global, None).unwrap();
        assert_eq!(s, fresh);
        assert_eq!(
            s.restore(&[7], Scope::Local, None),
            Err(TreeError::RankOutOfRange { rank: 7, size: 7 })
        );
        // Restoring every failure gives the never-failed tree.
        s.restore(&[5], Scope::Global, None).unwrap();
        assert_eq!(s, RoutingState::new(2, 7, 3).unwrap());
    }

    #[test]
    fn promotion_is_reported() {
        let mut s = RoutingState::new(2, 7, 5).unwrap();
        let status = s.fail(&[1], Scope::Global, Some(3)).unwrap();
        assert!(status.promoted && !status.demoted);
        assert_eq!(status.epoch, Some(3));
        assert_eq!(
            (status.previous_parent, status.new_parent),
            (Some(1), Some(0))
        );
        assert_eq!(status.new_children, [3]);
        assert_eq!(s.ancestors(), [0]);
    }

    #[test]
    fn bad_failures_change_nothing() {
        let mut s = RoutingState::new(3, 20, 4).unwrap();
        let before = s.clone();
        assert_eq!(
            s.fail(&[2, 0], Scope::Local, None),
            Err(TreeError::RootFailed)
        );
        assert_eq!(
            s.fail(&[2, 20], Scope::Local, None),
            Err(TreeError::RankOutOfRange { rank: 20, size: 20 })
        );
        assert_eq!(s, before);
        assert_eq!(s.grow(19), Err(TreeError::ShrinkNotAllowed));
        let again = s.fail(&[2, 2], Scope::Local, None).unwrap();
        assert_eq!(again.newly_failed, [2]);
        assert!(
            s.fail(&[2], Scope::Local, None)
                .unwrap()
                .newly_failed
                .is_empty()
        );
    }

    #[test]
    fn rejects_bad_construction() {
        assert_eq!(
            RoutingState::new(1, 4, 0).unwrap_err(),
            TreeError::RadixTooSmall
        );
        assert_eq!(
            RoutingState::new(2, 0, 0).unwrap_err(),
            TreeError::EmptyTree
        );
        assert_eq!(
            RoutingState::new(2, 4, 4).unwrap_err(),
            TreeError::RankOutOfRange { rank: 4, size: 4 }
        );
    }
}
