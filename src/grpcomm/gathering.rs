//! What one daemon has gathered for one collective (the allgather's and the group
//! collectives'): entries by rank, failed ranks without one, the senders heard and under which
//! view, and the byte count that decides an overflow (`limits::ALLGATHER_MAX_BYTES`).
use crate::Rank;
use crate::limits::ALLGATHER_MAX_BYTES;
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet};

/// Accounted bytes of one entry beyond its data (rank and length on the wire).
pub(crate) const ENTRY_OVERHEAD: usize = 8;
/// Accounted bytes of one excluded rank.
const EXCLUDED_OVERHEAD: usize = 4;
/// Accounted bytes of one remembered sender.
const HEARD_OVERHEAD: usize = 16;

/// One collective's data at one daemon. Entries are idempotent: the first bytes seen for a
/// rank are kept, later copies ignored. Once the collective overflowed, an entry keeps its rank
/// and drops its bytes: who entered is still known, so the result names the members that did
/// not (`excluded`) as it does without an overflow.
#[derive(Debug, Clone, Default)]
pub(crate) struct Gathering {
    pub entries: BTreeMap<Rank, Bytes>,
    /// Failed ranks without an entry, as reported from below.
    pub excluded: BTreeSet<Rank>,
    /// Ranks not waited for in a later life: they died or returned while the collective was
    /// in flight (here or where it was reported from). Only grows; kept through an overflow.
    pub excused: BTreeSet<Rank>,
    /// Accounted bytes (see [`ALLGATHER_MAX_BYTES`]).
    bytes: usize,
    pub overflowed: bool,
    /// The view digest of each sender's latest contribution.
    pub heard: BTreeMap<Rank, u64>,
}

impl Gathering {
    pub fn add_entry(&mut self, rank: Rank, bytes: Bytes) {
        if self.entries.contains_key(&rank) {
            return;
        }
        let bytes = if self.overflowed { Bytes::new() } else { bytes };
        self.bytes = self
            .bytes
            .saturating_add(bytes.len())
            .saturating_add(ENTRY_OVERHEAD);
        if self.excluded.remove(&rank) {
            self.bytes = self.bytes.saturating_sub(EXCLUDED_OVERHEAD);
        }
        self.entries.insert(rank, bytes);
    }

    pub fn add_excluded(&mut self, rank: Rank) {
        if self.entries.contains_key(&rank) {
            return;
        }
        if self.excluded.insert(rank) {
            self.bytes = self.bytes.saturating_add(EXCLUDED_OVERHEAD);
        }
    }

    /// Merges what a sender reported (its entries but `me`'s, its excluded ranks, and its
    /// overflow: then its entries carry no bytes).
    pub fn merge(
        &mut self,
        me: Rank,
        overflowed: bool,
        entries: Vec<(Rank, Bytes)>,
        excluded: Vec<Rank>,
    ) {
        if overflowed && !self.overflowed {
            self.set_overflowed();
        }
        for (rank, bytes) in entries {
            if rank != me {
                self.add_entry(rank, bytes);
            }
        }
        for rank in excluded {
            self.add_excluded(rank);
        }
    }

    /// `rank` is not waited for in a later life; `true` if that is news.
    pub fn add_excused(&mut self, rank: Rank) -> bool {
        if !self.excused.insert(rank) {
            return false;
        }
        self.bytes = self.bytes.saturating_add(EXCLUDED_OVERHEAD);
        true
    }

    /// Follows a repair's restores (`restored`: those that concern this collective) and view
    /// change: a rank back in the tree is excused (this collective does not wait for its new
    /// life), and the `Excuse` marks per child (`excuses_sent`) are forgotten for children that
    /// are new or gone and, at a view change, for all (a digest recurs when a rank returns:
    /// what was told under it before is not news of this view). Returns whether an excused
    /// rank is news, so the contribution must go to the parent again for the daemons above to
    /// learn it.
    pub fn follow_restores(
        &mut self,
        restored: impl Iterator<Item = Rank>,
        excuses_sent: &mut BTreeMap<Rank, (u64, usize)>,
        view: &super::view::TreeView,
        change: &super::view::Change,
    ) -> bool {
        let mut news = false;
        for r in restored {
            news |= self.add_excused(r);
        }
        if change.view_changed {
            excuses_sent.clear();
        }
        excuses_sent.retain(|r, _| view.is_child(*r) && !change.new_children.contains(r));
        news
    }

    /// The excused ranks an `Excuse` names: living in `view`, and not its daemon.
    pub fn living_excused(&self, view: &super::view::TreeView) -> Vec<Rank> {
        self.excused
            .iter()
            .copied()
            .filter(|r| *r != view.me && !view.failed.contains(r))
            .collect()
    }

    pub fn hear(&mut self, from: Rank, digest: u64) {
        if self.heard.insert(from, digest).is_none() {
            self.bytes = self.bytes.saturating_add(HEARD_OVERHEAD);
        }
    }

    /// Drops the data once the collective overflowed; `true` if it just did. `what` names the
    /// collective in the log.
    pub fn check_overflow(&mut self, what: &dyn std::fmt::Display) -> bool {
        if self.overflowed || self.bytes <= ALLGATHER_MAX_BYTES {
            return false;
        }
        // Info, not a warning: every member's caller gets the result marked overflowed (a
        // full fence still ends, and its gets fetch), and every relay on the way logs this.
        log::info!(
            "{what}: more than {ALLGATHER_MAX_BYTES} bytes gathered; its result is marked \
             overflowed and carries no data"
        );
        self.set_overflowed();
        true
    }

    fn set_overflowed(&mut self) {
        self.overflowed = true;
        for bytes in self.entries.values_mut() {
            *bytes = Bytes::new();
        }
        self.bytes = self
            .heard
            .len()
            .saturating_mul(HEARD_OVERHEAD)
            .saturating_add(self.excused.len().saturating_mul(EXCLUDED_OVERHEAD))
            .saturating_add(self.excluded.len().saturating_mul(EXCLUDED_OVERHEAD))
            .saturating_add(self.entries.len().saturating_mul(ENTRY_OVERHEAD));
    }

    /// Follows a repair (the view already moved): `complete` keeps the children that are
    /// still children and not new ones, gains those heard under the new view, and the children
    /// heard under another view and not complete go to `wanted` (to be asked to re-send); the
    /// failed senders are forgotten.
    pub fn follow_repair(
        &mut self,
        complete: &mut BTreeSet<Rank>,
        view: &super::view::TreeView,
        new_children: &[Rank],
        wanted: &mut BTreeSet<Rank>,
    ) {
        complete.retain(|r| view.is_child(*r) && !new_children.contains(r));
        for &child in &view.children {
            match self.heard.get(&child) {
                Some(&d) if d == view.digest => {
                    complete.insert(child);
                }
                Some(_) if !complete.contains(&child) => {
                    wanted.insert(child);
                }
                _ => {}
            }
        }
        self.heard.retain(|r, _| !view.failed.contains(r));
    }

    /// The entries, in rank order, for a message (shared bytes, no copy; once overflowed,
    /// without bytes: the ranks that entered).
    pub fn entry_list(&self) -> Vec<(Rank, Bytes)> {
        self.entries.iter().map(|(r, b)| (*r, b.clone())).collect()
    }

    /// The entries a result carries: [`entry_list`](Self::entry_list), none once overflowed
    /// (an overflowed result carries no data; its excluded ranks still count).
    pub fn result_entries(&self) -> Vec<(Rank, Bytes)> {
        if self.overflowed {
            Vec::new()
        } else {
            self.entry_list()
        }
    }

    /// The ranks to report as excluded: those reported from below and the failed ranks
    /// `failed` yields that are `relevant`, less those with an entry.
    pub fn excluded_list(
        &self,
        failed: impl Iterator<Item = Rank>,
        relevant: impl Fn(Rank) -> bool,
    ) -> Vec<Rank> {
        self.excluded
            .iter()
            .copied()
            .chain(failed.filter(|r| relevant(*r)))
            .filter(|r| !self.entries.contains_key(r))
            .collect::<BTreeSet<Rank>>()
            .into_iter()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_overflow_keeps_who_entered_and_who_did_not() {
        let mut g = Gathering::default();
        g.add_entry(1, Bytes::from(vec![0; 10]));
        g.add_excluded(3);
        g.add_entry(2, Bytes::from(vec![0; ALLGATHER_MAX_BYTES]));
        assert!(g.check_overflow(&"a collective"));
        assert_eq!(g.entries.keys().copied().collect::<Vec<_>>(), vec![1, 2]);
        assert!(
            g.entries.values().all(Bytes::is_empty),
            "the bytes are dropped"
        );
        // A sender's overflowed report: rank 4 entered (its bytes dropped), rank 5 failed
        // without an entry; rank 6 is known failed here.
        g.merge(0, true, vec![(4, Bytes::from_static(b"data"))], vec![5]);
        assert_eq!(g.entries.get(&4), Some(&Bytes::new()));
        assert_eq!(g.excluded_list(std::iter::once(6), |_| true), vec![3, 5, 6]);
        assert!(!g.check_overflow(&"a collective"), "once only");
    }
}
