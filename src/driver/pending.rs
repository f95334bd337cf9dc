//! The accepted connections still in their handshake, by age and by source address, so that a
//! flood of strangers' connections is bounded (`limits::PENDING_HANDSHAKES_PER_SOURCE_MAX`,
//! `limits::PENDING_HANDSHAKES_MAX`) by evicting the oldest pending handshake. No I/O: the
//! loop asks which connection to evict and closes it itself.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

/// Pending (accepted, not yet established) connections. A connection is named by its
/// generation (unique per daemon and increasing, so it orders by age) and carries its token.
#[derive(Debug)]
pub(crate) struct PendingHandshakes {
    per_source_max: usize,
    total_max: usize,
    /// generation -> (token, source), oldest first.
    by_age: BTreeMap<u64, (usize, IpAddr)>,
    /// source -> its pending generations, oldest first. Keys are peers' addresses: SipHash.
    by_source: HashMap<IpAddr, BTreeSet<u64>>,
}

impl PendingHandshakes {
    pub(crate) fn new(per_source_max: usize, total_max: usize) -> Self {
        PendingHandshakes {
            per_source_max: per_source_max.max(1),
            total_max: total_max.max(1),
            by_age: BTreeMap::new(),
            by_source: HashMap::new(),
        }
    }

    /// How many are pending.
    pub(crate) fn len(&self) -> usize {
        self.by_age.len()
    }

    /// Which pending connections (token, generation) must go to make room for one more from
    /// `source`: the oldest from that source if it is at its bound, and the oldest of all if
    /// the total is at its bound (after the first eviction). They are removed from the table;
    /// the caller closes them.
    pub(crate) fn make_room(&mut self, source: IpAddr) -> Vec<(usize, u64)> {
        let mut out = Vec::new();
        if self
            .by_source
            .get(&source)
            .is_some_and(|s| s.len() >= self.per_source_max)
            && let Some(g) = self.by_source.get(&source).and_then(|s| s.first().copied())
            && let Some((tok, _)) = self.remove(g)
        {
            out.push((tok, g));
        }
        while self.by_age.len() >= self.total_max {
            let Some((&g, _)) = self.by_age.first_key_value() else {
                break;
            };
            match self.remove(g) {
                Some((tok, _)) => out.push((tok, g)),
                None => break,
            }
        }
        out
    }

    /// Records a new pending connection (call `make_room` first).
    pub(crate) fn insert(&mut self, generation: u64, token: usize, source: IpAddr) {
        self.by_age.insert(generation, (token, source));
        self.by_source.entry(source).or_default().insert(generation);
    }

    /// Forgets a connection (established, closed, or evicted); returns its token and source if
    /// it was pending.
    pub(crate) fn remove(&mut self, generation: u64) -> Option<(usize, IpAddr)> {
        let (tok, source) = self.by_age.remove(&generation)?;
        if let Some(set) = self.by_source.get_mut(&source) {
            set.remove(&generation);
            if set.is_empty() {
                self.by_source.remove(&source);
            }
        }
        if self.by_age.is_empty() && self.by_source.capacity() > 64 {
            // A flood that ended gives its memory back.
            self.by_source = HashMap::new();
        }
        Some((tok, source))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
    }

    #[test]
    fn per_source_bound_evicts_that_sources_oldest() {
        let mut p = PendingHandshakes::new(3, 100);
        p.insert(1, 10, ip(1));
        for g in 2..=4 {
            assert!(p.make_room(ip(2)).is_empty());
            p.insert(g, g as usize + 10, ip(2));
        }
        // ip(2) is at its bound: its oldest (generation 2) goes, not ip(1)'s older one.
        assert_eq!(p.make_room(ip(2)), vec![(12, 2)]);
        p.insert(5, 15, ip(2));
        assert_eq!(p.len(), 4);
        // Another source is not affected.
        assert!(p.make_room(ip(3)).is_empty());
    }

    #[test]
    fn total_bound_evicts_the_oldest_of_all() {
        let mut p = PendingHandshakes::new(10, 3);
        p.insert(1, 1, ip(1));
        p.insert(2, 2, ip(2));
        p.insert(3, 3, ip(3));
        assert_eq!(p.make_room(ip(4)), vec![(1, 1)]);
        p.insert(4, 4, ip(4));
        assert_eq!(p.len(), 3);
        // Established or closed ones leave; then there is room again.
        assert_eq!(p.remove(2), Some((2, ip(2))));
        assert_eq!(p.remove(2), None);
        assert!(p.make_room(ip(1)).is_empty());
    }

    #[test]
    fn both_bounds_at_once_evict_once_each_at_most() {
        let mut p = PendingHandshakes::new(2, 2);
        p.insert(1, 1, ip(1));
        p.insert(2, 2, ip(2));
        // ip(2) under its bound; total at its bound: the oldest of all goes.
        assert_eq!(p.make_room(ip(2)), vec![(1, 1)]);
        p.insert(3, 3, ip(2));
        // ip(2) at its bound (2, 3) and the total too: its oldest goes, which makes room.
        assert_eq!(p.make_room(ip(2)), vec![(2, 2)]);
        assert_eq!(p.len(), 1);
    }

    #[test]
    fn empty_after_a_flood() {
        let mut p = PendingHandshakes::new(1000, 100_000);
        for g in 0..5000u64 {
            p.insert(g, g as usize, ip((g % 200) as u8));
        }
        for g in 0..5000u64 {
            assert!(p.remove(g).is_some());
        }
        assert_eq!(p.len(), 0);
        assert!(p.by_source.capacity() <= 64);
    }
}
