//! A daemon's address book: the contacts it owns (rank 0's from the start; its ancestors' and
//! its subtree's from its wire-up slice, or every rank's on rank 0 and with
//! `contacts = "full"`), a bounded cache of contacts looked up from rank 0, and the ranks
//! whose contact is wanted and not known yet. Sans-IO: the lookups themselves are in
//! `lookup.rs`.

use crate::Rank;
use crate::fxhash::FxHashMap;
use crate::limits;
use crate::oob::uri::ContactUri;
use std::collections::{BTreeSet, VecDeque};
use std::time::Instant;

/// Which contacts a daemon keeps from wire-up (`contacts`, `TBON_CONTACTS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
#[non_exhaustive]
pub enum ContactsSetting {
    /// Its ancestors' and its subtree's; any other is looked up from rank 0 when first
    /// dialled. Wire-up bytes grow as N log N in all, not N squared.
    #[default]
    Subtree,
    /// Every rank's, as every daemon forwards the whole table to its children: no lookups
    /// later, at N squared bytes in all at wire-up (`docs/wireup.md` has the crossover).
    Full,
}

impl std::fmt::Display for ContactsSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ContactsSetting::Subtree => "subtree",
            ContactsSetting::Full => "full",
        })
    }
}

impl std::str::FromStr for ContactsSetting {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "subtree" => Ok(ContactsSetting::Subtree),
            "full" => Ok(ContactsSetting::Full),
            other => Err(format!(
                "{other:?} is not a contacts mode (subtree or full)"
            )),
        }
    }
}

/// The contacts one daemon knows, and the lookups it waits for.
#[derive(Default)]
pub struct Contacts {
    owned: FxHashMap<Rank, ContactUri>,
    cached: FxHashMap<Rank, ContactUri>,
    /// Cached ranks, oldest first (for eviction at `CONTACT_CACHE_MAX`).
    cache_order: VecDeque<Rank>,
    /// Wanted, not yet asked for.
    wanted: BTreeSet<Rank>,
    /// Asked for in the lookup in flight: its ranks, when it is given up on, and its try.
    in_flight: Option<InFlight>,
}

/// The lookup waiting for rank 0's reply.
pub struct InFlight {
    pub ranks: Vec<Rank>,
    pub deadline: Instant,
    pub tries: u32,
}

impl Contacts {
    /// The contact of `r`, owned or cached.
    pub fn get(&self, r: Rank) -> Option<&ContactUri> {
        self.owned.get(&r).or_else(|| self.cached.get(&r))
    }

    /// Contacts owned (never evicted).
    pub fn owned_len(&self) -> usize {
        self.owned.len()
    }

    /// Contacts cached from lookups.
    pub fn cached_len(&self) -> usize {
        self.cached.len()
    }

    /// Every owned contact (for forwarding wire-up slices), in no particular order.
    pub fn owned(&self) -> impl Iterator<Item = &ContactUri> {
        self.owned.values()
    }

    /// Records a contact this daemon owns (wire-up), replacing any earlier one.
    pub fn own(&mut self, uri: ContactUri) {
        self.wanted.remove(&uri.rank);
        if self.cached.remove(&uri.rank).is_some() {
            self.cache_order.retain(|r| *r != uri.rank);
        }
        self.owned.insert(uri.rank, uri);
    }

    /// A restarted daemon's new contact (rejoin): it replaces the old one wherever that was
    /// kept (owned or cached), and is cached if neither.
    pub fn replace(&mut self, uri: ContactUri) {
        if self.owned.contains_key(&uri.rank) {
            self.own(uri);
        } else {
            self.cache(uri);
        }
    }

    /// Records a looked-up (or otherwise learnt) contact in the bounded cache. An owned
    /// contact is not replaced: what wire-up gave is what the tree was built from.
    pub fn cache(&mut self, uri: ContactUri) {
        self.wanted.remove(&uri.rank);
        if self.owned.contains_key(&uri.rank) {
            return;
        }
        if self.cached.insert(uri.rank, uri.clone()).is_none() {
            self.cache_order.push_back(uri.rank);
        }
        while self.cached.len() > limits::CONTACT_CACHE_MAX {
            match self.cache_order.pop_front() {
                Some(old) => {
                    self.cached.remove(&old);
                }
                None => break,
            }
        }
        debug_assert_eq!(self.cached.len(), self.cache_order.len());
    }

    /// `r`'s contact is wanted. Returns false if it is known already or being looked up.
    pub fn want(&mut self, r: Rank) -> bool {
        if self.get(r).is_some()
            || self
                .in_flight
                .as_ref()
                .is_some_and(|f| f.ranks.contains(&r))
        {
            return false;
        }
        self.wanted.insert(r)
    }

    /// Forgets that `r` is wanted (it failed, or it is given up on).
    pub fn unwant(&mut self, r: Rank) {
        self.wanted.remove(&r);
    }

    /// Whether a lookup is in flight.
    pub fn in_flight(&self) -> Option<&InFlight> {
        self.in_flight.as_ref()
    }

    /// Starts the next lookup if none is in flight and some rank is wanted: its ranks (at
    /// most `CONTACT_LOOKUP_BATCH_MAX`).
    pub fn next_lookup(&mut self, deadline: Instant) -> Option<Vec<Rank>> {
        if self.in_flight.is_some() || self.wanted.is_empty() {
            return None;
        }
        let ranks: Vec<Rank> = self
            .wanted
            .iter()
            .copied()
            .take(limits::CONTACT_LOOKUP_BATCH_MAX)
            .collect();
        for r in &ranks {
            self.wanted.remove(r);
        }
        self.in_flight = Some(InFlight {
            ranks: ranks.clone(),
            deadline,
            tries: 1,
        });
        Some(ranks)
    }

    /// The lookup in flight timed out: its ranks again with the new deadline, or `Err` with
    /// them once `CONTACT_LOOKUP_TRIES_MAX` tries were made (nothing is in flight then).
    pub fn retry(&mut self, deadline: Instant) -> Result<Vec<Rank>, Vec<Rank>> {
        let Some(f) = self.in_flight.as_mut() else {
            return Ok(Vec::new());
        };
        if f.tries >= limits::CONTACT_LOOKUP_TRIES_MAX {
            let f = self.in_flight.take().map(|f| f.ranks).unwrap_or_default();
            return Err(f);
        }
        f.tries += 1;
        f.deadline = deadline;
        Ok(f.ranks.clone())
    }

    /// The reply arrived: the lookup is over. Returns the ranks it asked for.
    pub fn answered(&mut self) -> Vec<Rank> {
        self.in_flight.take().map(|f| f.ranks).unwrap_or_default()
    }
}

/// A loopback contact for `rank`, port 10,000 + rank (the tests' contacts).
#[cfg(test)]
pub(crate) fn test_uri(rank: Rank) -> ContactUri {
    ContactUri {
        dvm_id: "tbon".into(),
        rank,
        addrs: vec![format!("127.0.0.1:{}", 10_000 + rank).parse().unwrap()],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use test_uri as uri;

    #[test]
    fn the_cache_is_bounded_and_owned_contacts_stay() {
        let mut c = Contacts::default();
        c.own(uri(1));
        for r in 2..(limits::CONTACT_CACHE_MAX as u32 + 12) {
            c.cache(uri(r));
        }
        assert_eq!(c.cached_len(), limits::CONTACT_CACHE_MAX);
        assert!(c.get(1).is_some(), "owned contacts are never evicted");
        assert!(c.get(2).is_none(), "the oldest cached contact went first");
        assert!(c.get(limits::CONTACT_CACHE_MAX as u32 + 11).is_some());
        // Caching an owned rank changes nothing.
        c.cache(ContactUri {
            addrs: vec!["127.0.0.1:9".parse().unwrap()],
            ..uri(1)
        });
        assert_eq!(c.get(1), Some(&uri(1)));
    }

    #[test]
    fn lookups_batch_retry_and_give_up() {
        let now = Instant::now();
        let mut c = Contacts::default();
        c.own(uri(3));
        assert!(!c.want(3), "known already");
        for r in 0..(limits::CONTACT_LOOKUP_BATCH_MAX as u32 + 5) {
            if r != 3 {
                assert!(c.want(r));
            }
        }
        let first = c.next_lookup(now).unwrap();
        assert_eq!(first.len(), limits::CONTACT_LOOKUP_BATCH_MAX);
        assert!(!c.want(first[0]), "in flight already");
        assert!(c.next_lookup(now).is_none(), "one lookup at a time");
        for _ in 1..limits::CONTACT_LOOKUP_TRIES_MAX {
            assert_eq!(c.retry(now + Duration::from_secs(1)), Ok(first.clone()));
        }
        assert_eq!(c.retry(now), Err(first));
        let second = c.next_lookup(now).unwrap();
        assert_eq!(second.len(), 4);
        assert_eq!(c.answered(), second);
        assert!(c.in_flight().is_none());
    }
}
