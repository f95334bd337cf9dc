//! The data exchange of a job's daemons (the PMI "modex", issue "Jobs"), sans-IO: one [`Modex`]
//! per daemon.
//!
//! # The protocol
//! - A daemon `put`s keys and values for a group (its job) and `commit`s them: the committed
//!   blob ([`blob`]) replaces the previous one. The application side stages the puts; the core
//!   keeps the committed blob of every group ([`crate::limits::MODEX_GROUPS_MAX`]) until the
//!   group is forgotten.
//! - A *fence* is one of the group's collectives (`grpcomm::group`): in `full` mode every
//!   member contributes its committed blob, and the result — every member's blob — is cached
//!   here ([`Modex::fenced_full`]); in `direct` mode the members contribute nothing and the fence
//!   only synchronises.
//! - [`Modex::get`] answers from the cache, from this daemon's own committed blob, or else
//!   fetches the owner's whole blob for the group at once (a request over RELM, [`wire`]),
//!   caches it, and answers every `get` waiting for that (group, rank). Concurrent gets for one
//!   owner share one fetch. The owner answers from what it has committed when the request
//!   arrives: after the fence that is everything it put before entering it.
//! - A key the owner never put is `NotFound`; an owner that is dead, or dies before its
//!   answer arrives (the node reports every repair, [`Modex::handle_failed`]), is
//!   `NodeDown`: a `get` never hangs on a dead owner.
//!
//! # Bounds and eviction
//! The cache holds at most [`crate::limits::MODEX_CACHE_MAX`] blobs and
//! [`crate::limits::MODEX_CACHE_BYTES`], least recently used out first (a later `get` fetches
//! an evicted blob again). At most [`crate::limits::MODEX_FETCHES_MAX`] fetches are in flight
//! and [`crate::limits::MODEX_GETS_WAITING_MAX`] gets wait for them (`Busy`), and an owner keeps at most that many unanswered requests per requester (a
//! requester that sends more is ignored beyond the bound and logged).
pub mod blob;
pub mod wire;

#[cfg(test)]
mod tests;

use crate::Rank;
use crate::grpcomm::{AllgatherResult, GroupId};
use crate::limits::{
    MODEX_CACHE_BYTES, MODEX_CACHE_MAX, MODEX_FETCHES_MAX, MODEX_GETS_WAITING_MAX,
    MODEX_GROUPS_MAX, MODEX_KEY_MAX,
};
use crate::rml::Tag;
use blob::Indexed;
use bytes::Bytes;
use std::collections::{BTreeMap, VecDeque};
use wire::{Reply, Request, TAG_MODEX_REPLY, TAG_MODEX_REQUEST};

/// Why a `get` gave no value.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum GetError {
    /// The owner committed no value under this key for this group (before the request
    /// reached it; after a fence, before the fence).
    NotFound,
    /// The owner is dead, or died before its data reached this daemon.
    NodeDown(Rank),
    /// API misuse: the rank is not a member of the group.
    NotMember(Rank),
    /// API misuse: the rank (asked for, or a member of the group) is not in the DVM of `size`
    /// daemons.
    RankOutOfRange {
        /// The rank.
        rank: Rank,
        /// The DVM's size.
        size: u32,
    },
    /// API misuse: the key is longer than [`MODEX_KEY_MAX`] bytes.
    KeyTooLong(usize),
    /// [`MODEX_FETCHES_MAX`] fetches are in flight here; ask again later.
    Busy,
    /// The owner's data came back malformed (logged).
    Corrupt(Rank),
    /// The daemon is shutting down or has stopped.
    ShutDown,
    /// A waiting call gave up before the answer came (the fetch goes on).
    TimedOut,
}

impl std::fmt::Display for GetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GetError::NotFound => write!(f, "the owner committed no such key for this group"),
            GetError::NodeDown(r) => write!(f, "rank {r} has failed"),
            GetError::NotMember(r) => write!(f, "rank {r} is not a member of the group"),
            GetError::RankOutOfRange { rank, size } => {
                write!(f, "rank {rank} is not in the DVM of {size} daemons")
            }
            GetError::KeyTooLong(n) => write!(f, "a key of {n} bytes is above {MODEX_KEY_MAX}"),
            GetError::Busy => write!(f, "too many fetches in flight; retry later"),
            GetError::Corrupt(r) => write!(f, "rank {r}'s data came back malformed"),
            GetError::ShutDown => write!(f, "the daemon is shut down"),
            GetError::TimedOut => write!(f, "timed out waiting for the value"),
        }
    }
}

impl std::error::Error for GetError {}

/// Counters of one data-exchange core.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModexStats {
    /// Gets answered from the cache (or this daemon's own data), and those that fetched.
    pub hits: u64,
    pub fetches: u64,
    /// Requests answered for other daemons.
    pub served: u64,
    /// Blobs evicted from the cache.
    pub evicted: u64,
}

/// A fetch in flight: who it asks, for which group, and the gets waiting for it.
#[derive(Debug)]
struct Fetch {
    group: GroupId,
    rank: Rank,
    waiting: Vec<(u64, String)>,
}

/// One daemon's data-exchange core. Inputs: [`Modex::commit`], [`Modex::forget`],
/// [`Modex::fenced_full`], [`Modex::get`], [`Modex::handle_message`], [`Modex::handle_failed`];
/// outputs: [`Modex::poll_send`] (RELM messages to send, taken only while RELM has room) and
/// [`Modex::poll_answer`] (gets answered).
#[derive(Debug)]
pub struct Modex {
    me: Rank,
    size: u32,
    committed: BTreeMap<GroupId, Indexed>,
    /// (context, rank) -> (group, blob, last use); `lru` orders the same by last use. Keyed by
    /// the context, not the whole group: comparing member lists on every lookup cost a full
    /// fence of 256 members over a second of processor time. A hit must also match the group
    /// (a context used again with other members replaces the entry).
    cache: BTreeMap<(u64, Rank), (GroupId, Indexed, u64)>,
    lru: BTreeMap<u64, (u64, Rank)>,
    cache_bytes: usize,
    clock: u64,
    fetches: BTreeMap<u64, Fetch>,
    /// Gets waiting in `fetches`, all together (bounded: `MODEX_GETS_WAITING_MAX`).
    waiting: usize,
    by_target: BTreeMap<(GroupId, Rank), u64>,
    next_id: u64,
    /// Requests answered per requester and not yet sent (bounded per requester).
    owed: BTreeMap<Rank, usize>,
    sends: VecDeque<(Rank, Tag, Bytes)>,
    answers: VecDeque<(u64, Result<Bytes, GetError>)>,
    stats: ModexStats,
}

impl Modex {
    /// The core of daemon `me` in a DVM of `size`.
    pub fn new(me: Rank, size: u32) -> Self {
        Modex {
            me,
            size,
            committed: BTreeMap::new(),
            cache: BTreeMap::new(),
            lru: BTreeMap::new(),
            cache_bytes: 0,
            clock: 0,
            fetches: BTreeMap::new(),
            waiting: 0,
            by_target: BTreeMap::new(),
            next_id: 1,
            owed: BTreeMap::new(),
            sends: VecDeque::new(),
            answers: VecDeque::new(),
            stats: ModexStats::default(),
        }
    }

    /// The counters.
    pub fn stats(&self) -> &ModexStats {
        &self.stats
    }

    /// Blobs cached, fetches in flight, groups with committed data.
    pub fn sizes(&self) -> (usize, usize, usize) {
        (self.cache.len(), self.fetches.len(), self.committed.len())
    }

    /// This daemon's committed blob for `group` (replacing the previous one). `false`, changing
    /// nothing, at [`MODEX_GROUPS_MAX`] groups with committed data.
    pub fn commit(&mut self, group: GroupId, blob: Bytes) -> bool {
        if !self.committed.contains_key(&group) && self.committed.len() >= MODEX_GROUPS_MAX {
            return false;
        }
        self.committed.insert(group, Indexed::new(blob));
        true
    }

    /// This daemon's committed blob for `group`, if any.
    pub fn committed(&self, group: &GroupId) -> Option<&Bytes> {
        self.committed.get(group).map(Indexed::blob)
    }

    /// The job is over here: its committed data and cached blobs go; gets still fetching for
    /// it end `NotFound` when their answer comes (it is not cached).
    pub fn forget(&mut self, group: &GroupId) {
        self.committed.remove(group);
        let c = group.context();
        let gone: Vec<(u64, Rank)> = self
            .cache
            .range((c, 0)..=(c, Rank::MAX))
            .filter(|(_, (g, ..))| g == group)
            .map(|(k, _)| *k)
            .collect();
        for k in gone {
            self.uncache(&k);
        }
    }

    /// A fence of `group` ended here: what was cached of the group is stale (the members may
    /// have committed again before it) and goes.
    pub fn fenced(&mut self, group: &GroupId) {
        let c = group.context();
        let gone: Vec<(u64, Rank)> = self
            .cache
            .range((c, 0)..=(c, Rank::MAX))
            .filter(|(_, (g, ..))| g == group)
            .map(|(k, _)| *k)
            .collect();
        for k in gone {
            self.uncache(&k);
        }
    }

    /// A full fence of `group` ended with `result`: every member's blob is cached (replacing
    /// what was cached of the group).
    pub fn fenced_full(&mut self, group: &GroupId, result: &AllgatherResult) {
        self.fenced(group);
        for (rank, blob) in &result.contributions {
            if *rank != self.me {
                self.cache_put(group, *rank, Indexed::new(blob.clone()));
            }
        }
    }

    /// The value of `key` that `rank` committed for `group`, answered through
    /// [`Modex::poll_answer`] with `token` (at once if it is known here). `dead` says whether
    /// `rank` is known to have failed.
    pub fn get(&mut self, token: u64, group: &GroupId, rank: Rank, key: &str, dead: bool) {
        if key.len() > MODEX_KEY_MAX {
            return self.answer(token, Err(GetError::KeyTooLong(key.len())));
        }
        // Only members read a job's data.
        if !group.contains(self.me) {
            return self.answer(token, Err(GetError::NotMember(self.me)));
        }
        if rank >= self.size {
            let size = self.size;
            return self.answer(token, Err(GetError::RankOutOfRange { rank, size }));
        }
        if !group.contains(rank) {
            return self.answer(token, Err(GetError::NotMember(rank)));
        }
        if rank == self.me {
            self.stats.hits += 1;
            let found = self.committed.get(group).cloned();
            return self.answer_from(token, rank, found.as_ref(), key);
        }
        if let Some(blob) = self.cache_get(group, rank) {
            self.stats.hits += 1;
            return self.answer_from(token, rank, Some(&blob), key);
        }
        if dead {
            return self.answer(token, Err(GetError::NodeDown(rank)));
        }
        if self.waiting >= MODEX_GETS_WAITING_MAX {
            return self.answer(token, Err(GetError::Busy));
        }
        let k = (group.clone(), rank);
        if let Some(id) = self.by_target.get(&k)
            && let Some(f) = self.fetches.get_mut(id)
        {
            f.waiting.push((token, key.to_string()));
            self.waiting += 1;
            return;
        }
        if self.fetches.len() >= MODEX_FETCHES_MAX {
            return self.answer(token, Err(GetError::Busy));
        }
        let id = self.next_id;
        self.next_id += 1;
        self.stats.fetches += 1;
        let request = Request {
            id,
            group: group.clone(),
        };
        self.sends
            .push_back((rank, TAG_MODEX_REQUEST, request.encode()));
        self.by_target.insert(k, id);
        self.waiting += 1;
        self.fetches.insert(
            id,
            Fetch {
                group: group.clone(),
                rank,
                waiting: vec![(token, key.to_string())],
            },
        );
    }

    /// A data-exchange message RELM delivered from `from` (tag [`TAG_MODEX_REQUEST`] or
    /// [`TAG_MODEX_REPLY`]). A malformed one is dropped with the reason returned.
    pub fn handle_message(&mut self, from: Rank, tag: Tag, payload: &Bytes) -> Result<(), String> {
        match tag {
            TAG_MODEX_REQUEST => {
                let q = Request::decode(self.size, payload)?;
                if !q.group.contains(from) {
                    return Err(format!("rank {from} asked for a group it is not in"));
                }
                let owed = self.owed.entry(from).or_insert(0);
                if *owed >= MODEX_FETCHES_MAX {
                    return Err(format!(
                        "rank {from} has more than {MODEX_FETCHES_MAX} fetches unanswered here"
                    ));
                }
                *owed += 1;
                self.stats.served += 1;
                let reply = Reply {
                    id: q.id,
                    blob: self.committed.get(&q.group).map(|x| x.blob().clone()),
                };
                self.sends
                    .push_back((from, TAG_MODEX_REPLY, reply.encode()));
                Ok(())
            }
            TAG_MODEX_REPLY => {
                let r = Reply::decode(payload)?;
                let Some(f) = self.fetches.get(&r.id) else {
                    return Err(format!("a reply from rank {from} to no fetch ({})", r.id));
                };
                if f.rank != from {
                    return Err(format!(
                        "rank {from} answered a fetch sent to rank {}",
                        f.rank
                    ));
                }
                let Some(f) = self.fetches.remove(&r.id) else {
                    return Ok(());
                };
                self.waiting = self.waiting.saturating_sub(f.waiting.len());
                let k = (f.group, f.rank);
                self.by_target.remove(&k);
                let blob = r.blob.map(Indexed::new);
                if let Some(b) = &blob {
                    self.cache_put(&k.0, k.1, b.clone());
                }
                for (token, key) in f.waiting {
                    self.answer_from(token, f.rank, blob.as_ref(), &key);
                }
                Ok(())
            }
            other => Err(format!("tag {other} is not the data exchange's")),
        }
    }

    /// Ranks declared dead: fetches from them end `NodeDown`; what they were owed is dropped.
    pub fn handle_failed(&mut self, dead: &[Rank]) {
        let ids: Vec<u64> = self
            .fetches
            .iter()
            .filter(|(_, f)| dead.contains(&f.rank))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            if let Some(f) = self.fetches.remove(&id) {
                self.waiting = self.waiting.saturating_sub(f.waiting.len());
                self.by_target.remove(&(f.group, f.rank));
                for (token, _) in f.waiting {
                    self.answer(token, Err(GetError::NodeDown(f.rank)));
                }
            }
        }
        for r in dead {
            self.owed.remove(r);
        }
        self.sends.retain(|(to, ..)| !dead.contains(to));
    }

    /// The next RELM message to send: (to, tag, payload). Take it only while RELM has room
    /// for the runtime's messages; it waits here otherwise.
    pub fn poll_send(&mut self) -> Option<(Rank, Tag, Bytes)> {
        let s = self.sends.pop_front()?;
        if s.1 == TAG_MODEX_REPLY
            && let Some(n) = self.owed.get_mut(&s.0)
        {
            *n = n.saturating_sub(1);
        }
        Some(s)
    }

    /// The next answered get: (token, value or why not).
    pub fn poll_answer(&mut self) -> Option<(u64, Result<Bytes, GetError>)> {
        self.answers.pop_front()
    }

    /// Every get still waiting (the daemon stops): their tokens, to fail with `ShutDown`.
    pub fn take_waiting(&mut self) -> Vec<u64> {
        self.by_target.clear();
        self.waiting = 0;
        std::mem::take(&mut self.fetches)
            .into_values()
            .flat_map(|f| f.waiting.into_iter().map(|(t, _)| t))
            .collect()
    }

    // ----- internals -------------------------------------------------------------------------

    fn answer(&mut self, token: u64, r: Result<Bytes, GetError>) {
        self.answers.push_back((token, r));
    }

    fn answer_from(&mut self, token: u64, rank: Rank, blob: Option<&Indexed>, key: &str) {
        let r = match blob.map(|b| b.lookup(key)) {
            None | Some(Ok(None)) => Err(GetError::NotFound),
            Some(Ok(Some(v))) => Ok(v),
            Some(Err(why)) => {
                log::warn!("rank {}: rank {rank}'s data is malformed: {why}", self.me);
                Err(GetError::Corrupt(rank))
            }
        };
        self.answer(token, r);
    }

    fn cache_get(&mut self, group: &GroupId, rank: Rank) -> Option<Indexed> {
        self.clock += 1;
        let now = self.clock;
        let k = (group.context(), rank);
        let (g, blob, used) = self.cache.get_mut(&k)?;
        if g != group {
            return None;
        }
        self.lru.remove(used);
        *used = now;
        self.lru.insert(now, k);
        Some(blob.clone())
    }

    fn cache_put(&mut self, group: &GroupId, rank: Rank, blob: Indexed) {
        let k = (group.context(), rank);
        self.uncache(&k);
        if blob.bytes() > MODEX_CACHE_BYTES {
            return;
        }
        while self.cache.len() >= MODEX_CACHE_MAX
            || self.cache_bytes + blob.bytes() > MODEX_CACHE_BYTES
        {
            let Some((_, oldest)) = self.lru.pop_first() else {
                break;
            };
            if let Some((_, b, _)) = self.cache.remove(&oldest) {
                self.cache_bytes -= b.bytes();
                self.stats.evicted += 1;
            }
        }
        self.clock += 1;
        self.cache_bytes += blob.bytes();
        self.lru.insert(self.clock, k);
        self.cache.insert(k, (group.clone(), blob, self.clock));
    }

    fn uncache(&mut self, k: &(u64, Rank)) {
        if let Some((_, b, used)) = self.cache.remove(k) {
            self.cache_bytes -= b.bytes();
            self.lru.remove(&used);
        }
    }
}
