//! The generic engine: per-message states and the transitions between them, and the bounded
//! message table (records, per-chain order, the hop cache and its expiry). No protocol rules
//! live here: which frame causes which trigger is decided in `steady.rs` and `link.rs`.
//!
//! Each daemon on a message's path holds its own record of the message, in one of the lasting
//! states (PRRTE's): `Sending` (to be handed one hop further), `Sent` (handed on; an origin
//! keeps the data, an intermediate hop caches it), `Requested` (a neighbour asked for a replay
//! and this hop has no data: the request went upstream), `Pending` (at the destination, waiting
//! for its predecessor in the chain) and `Acked` (posted or acknowledged: the record is
//! released). Trigger-only events (`New`, `Cached`, `Evicted`) change or drop a record
//! without being a state of their own. PRRTE's `ACKACKED` has no counterpart: see
//! `mod.rs` ("What changed from PRRTE").

use super::uid::{self, MsgKey};
use crate::Rank;
use crate::fxhash::FxHashMap;
use crate::rml::Tag;
use bytes::Bytes;
use std::cmp::Ordering;
use std::collections::VecDeque;
use std::collections::hash_map::Entry as HashEntry;
use std::time::{Duration, Instant};

/// A daemon's lasting state for one message.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MsgState {
    /// To be handed to the next hop (no route yet, or a replay is due).
    Sending = 1,
    /// Handed to the next hop.
    Sent = 2,
    /// A replay was asked for and this daemon has no data; the request went upstream.
    Requested = 3,
    /// At the destination: waiting for the predecessor in its chain.
    Pending = 4,
    /// Posted at the destination, or acknowledged: the record is released.
    Acked = 5,
}

impl MsgState {
    /// The state for a wire value, if any.
    pub fn from_wire(v: u8) -> Option<MsgState> {
        match v {
            1 => Some(MsgState::Sending),
            2 => Some(MsgState::Sent),
            3 => Some(MsgState::Requested),
            4 => Some(MsgState::Pending),
            5 => Some(MsgState::Acked),
            _ => None,
        }
    }
}

/// What happened to a message at this daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// First sight: originated here or arrived from upstream (trigger-only).
    New,
    /// Handed to the next hop.
    Transmitted,
    /// A neighbour asked for a replay.
    Request,
    /// The data arrived (again) from upstream.
    Data,
    /// Its predecessor is missing (destination only).
    Wait,
    /// The data was kept in the hop cache (trigger-only).
    Cached,
    /// The hop cache dropped it, by age or count (trigger-only; the record goes).
    Evicted,
    /// Posted at the destination, or an acknowledgement covering it passed by.
    Ack,
}

/// What a daemon is for a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// It originated the message and keeps the data until the acknowledgement.
    Origin,
    /// An intermediate hop: data cached best-effort.
    Hop,
    /// The destination, holding it while its predecessor is missing.
    Destination,
}

/// A transition the engine does not allow: a bug in the protocol rules, logged and ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidTransition {
    /// The role.
    pub role: Role,
    /// The state before, if the record existed.
    pub from: Option<MsgState>,
    /// The trigger.
    pub trigger: Trigger,
}

/// The next lasting state of a record, or `None` when the record is released (acked or
/// evicted). `from` is `None` when there is no record yet.
pub fn transition(
    role: Role,
    from: Option<MsgState>,
    trigger: Trigger,
) -> Result<Option<MsgState>, InvalidTransition> {
    use MsgState::*;
    use Trigger as T;
    let next = match (role, from, trigger) {
        (Role::Origin | Role::Hop, None, T::New | T::Cached) => Some(Sending),
        (Role::Hop, None, T::Request) => Some(Requested),
        (Role::Destination, None, T::Wait) => Some(Pending),
        (Role::Origin | Role::Hop, Some(Sending | Sent), T::Transmitted) => Some(Sent),
        (Role::Origin | Role::Hop, Some(Sent | Sending), T::Request) => Some(Sending),
        (Role::Hop, Some(Requested), T::Request) => Some(Requested),
        (Role::Hop, Some(Requested | Sent | Sending), T::Data) => Some(Sending),
        (Role::Destination, Some(Pending), T::Data | T::Wait) => Some(Pending),
        (Role::Hop, Some(_), T::Evicted) => None,
        (_, Some(_), T::Ack) => None,
        (role, from, trigger) => {
            return Err(InvalidTransition {
                role,
                from,
                trigger,
            });
        }
    };
    Ok(next)
}

/// Applies to `r` a trigger that keeps the record (`Transmitted`, `Request`, `Data`, `Wait`),
/// in place: for a caller that already holds the record (one lookup instead of two). A trigger
/// that would release it is refused here (the table must count the release: use
/// [`MessageTable::apply`]).
pub fn apply_kept(r: &mut Record, trigger: Trigger) -> Result<(), InvalidTransition> {
    let refused = InvalidTransition {
        role: r.role,
        from: Some(r.state),
        trigger,
    };
    match transition(r.role, Some(r.state), trigger)? {
        Some(s) => {
            r.state = s;
            Ok(())
        }
        None => Err(refused),
    }
}

/// One daemon's record of one message.
#[derive(Debug, Clone)]
pub struct Record {
    /// What this daemon is for the message.
    pub role: Role,
    /// The origin's uid for it: the key's uid, set by [`MessageTable::insert`].
    pub uid: u32,
    /// Its lasting state.
    pub state: MsgState,
    /// The destination.
    pub dst: Rank,
    /// The user's tag.
    pub tag: Tag,
    /// The predecessor's uid in the (origin, dst) chain, or `uid::NONE`.
    pub prev: u32,
    /// The payload; `None` for a `Requested` record.
    pub data: Option<Bytes>,
    /// When the record was made (the hop cache's age).
    pub since: Instant,
    /// The origin's completion token.
    pub token: Option<u64>,
    /// The origin's next retransmission.
    pub retransmit_at: Instant,
    /// The origin's retransmissions so far.
    pub retransmits: u32,
    /// At the origin: the runtime's own message ([`Relm::send_runtime`](super::Relm)), which
    /// does not count against the users' window.
    pub runtime: bool,
}

/// One chain's origin and hop records, by ascending uid (serial-number order). The uid is the
/// record's own field, not a pair's: a pair was built on the stack and copied again, its
/// misaligned halves read back before their stores had left (measured: a sixth of an origin's
/// send).
type Chain = VecDeque<Record>;

/// Where a record lives: at an index of its chain, or among the destination's early messages.
#[derive(Debug, Clone, Copy)]
enum Slot {
    Chain(usize),
    Pending,
}

/// The index of `uid` in `chain`, or where it would go. A chain's uids are in serial-number
/// order and span less than half the uid space (the origin's window), so that order is total
/// over them. Records are almost always made at the back and released at the front, which
/// are looked at first.
fn position(chain: &Chain, uid: u32) -> Result<usize, usize> {
    match chain.back() {
        None => return Err(0),
        Some(last) if last.uid == uid => return Ok(chain.len() - 1),
        Some(last) if uid::before(last.uid, uid) => return Err(chain.len()),
        Some(_) => {}
    }
    if chain.front().is_some_and(|first| first.uid == uid) {
        return Ok(0);
    }
    chain.binary_search_by(|r| {
        if r.uid == uid {
            Ordering::Equal
        } else if uid::before(r.uid, uid) {
            Ordering::Less
        } else {
            Ordering::Greater
        }
    })
}

/// The message table: every record this daemon holds, and the hop cache's arrival order.
/// Bounded by the caller (`Relm` refuses or drops at its bounds; the hop cache evicts its
/// oldest).
///
/// Origin and hop records live in their chain, in uid order: an origin makes its records at
/// the back of a chain and a cumulative acknowledgement releases them from the front, so the
/// hot path of reliable messaging touches memory in order and hashes once per chain, not once
/// per message (a table keyed by message cost the sending loop a random access per message,
/// on records of about 100 bytes). A record is therefore found by its key and its destination.
/// The destination's early messages (few, and taken out of order) are kept by key.
#[derive(Debug, Default)]
pub struct MessageTable {
    /// (origin, dst) -> that chain's origin and hop records. A chain emptied by an
    /// acknowledgement is kept for the next records until [`shed`](Self::shed).
    chains: FxHashMap<(Rank, Rank), Chain>,
    /// The destination's early messages (`Role::Destination`).
    pending: FxHashMap<MsgKey, Record>,
    /// Hop records (key, destination, made at), oldest first (stale entries are skipped).
    cache: VecDeque<(MsgKey, Rank, Instant)>,
    counts: Counts,
}

/// The records held, by role (apart from the records, so that both can be borrowed at once).
#[derive(Debug, Default)]
struct Counts {
    hop: usize,
    origin: usize,
    /// Origin records of the users' messages (not `runtime`).
    user: usize,
    pending: usize,
}

impl Counts {
    fn add(&mut self, r: &Record) {
        match r.role {
            Role::Origin => {
                self.origin += 1;
                self.user += usize::from(!r.runtime);
            }
            Role::Hop => self.hop += 1,
            Role::Destination => self.pending += 1,
        }
    }

    fn sub(&mut self, r: &Record) {
        match r.role {
            Role::Origin => {
                self.origin = self.origin.saturating_sub(1);
                if !r.runtime {
                    self.user = self.user.saturating_sub(1);
                }
            }
            Role::Hop => self.hop = self.hop.saturating_sub(1),
            Role::Destination => self.pending = self.pending.saturating_sub(1),
        }
    }
}

impl MessageTable {
    fn find(&self, key: &MsgKey, dst: Rank) -> Option<Slot> {
        if let Some(chain) = self.chains.get(&(key.origin, dst))
            && let Ok(i) = position(chain, key.uid)
        {
            return Some(Slot::Chain(i));
        }
        self.pending
            .get(key)
            .filter(|r| r.dst == dst)
            .map(|_| Slot::Pending)
    }

    /// The record of `key` to `dst`.
    pub fn get(&self, key: &MsgKey, dst: Rank) -> Option<&Record> {
        match self.find(key, dst)? {
            Slot::Chain(i) => self.chains.get(&(key.origin, dst)).and_then(|c| c.get(i)),
            Slot::Pending => self.pending.get(key),
        }
    }

    /// The record of `key` to `dst`, to change its data or timers (not its state: use
    /// `apply`).
    pub fn get_mut(&mut self, key: &MsgKey, dst: Rank) -> Option<&mut Record> {
        match self.find(key, dst)? {
            Slot::Chain(i) => self
                .chains
                .get_mut(&(key.origin, dst))
                .and_then(|c| c.get_mut(i)),
            Slot::Pending => self.pending.get_mut(key),
        }
    }

    /// Every record (in no particular order: callers that act on several sort them).
    pub fn iter(&self) -> impl Iterator<Item = (MsgKey, &Record)> {
        self.chains
            .iter()
            .flat_map(|(&(origin, _), chain)| {
                chain
                    .iter()
                    .map(move |r| (MsgKey { origin, uid: r.uid }, r))
            })
            .chain(self.pending.iter().map(|(k, r)| (*k, r)))
    }

    /// Whether the table holds no record.
    pub fn is_empty(&self) -> bool {
        let c = &self.counts;
        c.origin == 0 && c.hop == 0 && c.pending == 0
    }

    /// Whether the table holds nothing at all, not even an emptied chain's memory.
    pub fn is_clear(&self) -> bool {
        self.chains.is_empty() && self.pending.is_empty()
    }

    /// Frees the chains that hold no record (called from the timer, so that a chain emptied
    /// and refilled at once keeps its memory, and an idle daemon holds none).
    pub fn shed(&mut self) {
        self.chains.retain(|_, c| !c.is_empty());
    }

    /// Records held, by role: (origin, hop, destination).
    pub fn counts(&self) -> (usize, usize, usize) {
        (self.counts.origin, self.counts.hop, self.counts.pending)
    }

    /// Origin records of the users' messages (the runtime's own left out).
    pub fn user_records(&self) -> usize {
        self.counts.user
    }

    /// Makes a record (trigger `New`, `Cached`, `Request` or `Wait`) and returns it. The caller
    /// checks first that there is none for `key` and the record's destination; one that is
    /// there anyway is replaced. `Err` for a trigger that makes no record. The record's
    /// `state` and `uid` are set here (the trigger's state, the key's uid).
    pub fn insert(
        &mut self,
        key: MsgKey,
        record: Record,
        trigger: Trigger,
    ) -> Result<&mut Record, InvalidTransition> {
        let refused = InvalidTransition {
            role: record.role,
            from: None,
            trigger,
        };
        // The state is set once the record is in place: written into `record` first, the move
        // read that byte back before its store had left (a store-forwarding stall, measured at
        // a sixth of an origin's send).
        let state = transition(record.role, None, trigger)?.ok_or(refused)?;
        self.counts.add(&record);
        let (slot, old) = match record.role {
            Role::Destination => match self.pending.entry(key) {
                HashEntry::Occupied(mut e) => {
                    let old = std::mem::replace(e.get_mut(), record);
                    (e.into_mut(), Some(old))
                }
                HashEntry::Vacant(e) => (e.insert(record), None),
            },
            Role::Origin | Role::Hop => {
                if record.role == Role::Hop {
                    self.cache.push_back((key, record.dst, record.since));
                }
                let chain = self.chains.entry((key.origin, record.dst)).or_default();
                match position(chain, key.uid) {
                    Ok(i) => match chain.get_mut(i) {
                        Some(slot) => {
                            let old = std::mem::replace(slot, record);
                            (slot, Some(old))
                        }
                        None => return Err(refused),
                    },
                    // Almost always appended; a replay of an older message is put in place.
                    Err(i) => {
                        if i == chain.len() {
                            chain.push_back(record);
                        } else {
                            chain.insert(i, record);
                        }
                        match chain.get_mut(i) {
                            Some(slot) => (slot, None),
                            None => return Err(refused),
                        }
                    }
                }
            }
        };
        slot.state = state;
        slot.uid = key.uid;
        if let Some(old) = &old {
            self.counts.sub(old);
        }
        Ok(slot)
    }

    /// Applies a trigger to the record of `key` to `dst`, if there is one; returns the record
    /// if it was released.
    pub fn apply(
        &mut self,
        key: &MsgKey,
        dst: Rank,
        trigger: Trigger,
    ) -> Result<Option<Record>, InvalidTransition> {
        let Some(r) = self.get_mut(key, dst) else {
            return Ok(None);
        };
        match transition(r.role, Some(r.state), trigger)? {
            Some(s) => {
                r.state = s;
                Ok(None)
            }
            None => Ok(self.remove(key, dst)),
        }
    }

    /// Drops the record of `key` to `dst` outright (purges after a repair).
    pub fn remove(&mut self, key: &MsgKey, dst: Rank) -> Option<Record> {
        let r = match self.find(key, dst)? {
            Slot::Chain(i) => self
                .chains
                .get_mut(&(key.origin, dst))
                .and_then(|c| c.remove(i))?,
            Slot::Pending => self.pending.remove(key)?,
        };
        self.counts.sub(&r);
        Some(r)
    }

    /// An acknowledgement of the chain (origin, dst) up to `upto`: releases every origin or hop
    /// record it covers, handing each to `released` in uid order.
    ///
    /// The hot path of reliable messaging (one call per acknowledgement, often covering many
    /// messages): the records it covers are the chain's first ones. An `Ack` ends a record in
    /// every state (the transition table's `Ack` row), so the result is that of
    /// [`apply`](Self::apply) per message. The records go to a callback, not a list: a list of
    /// whole records grown per acknowledgement cost about 90 instructions per message in
    /// reallocations (callgrind, reliable 64 B sender).
    pub fn ack_chain(
        &mut self,
        origin: Rank,
        dst: Rank,
        upto: u32,
        mut released: impl FnMut(MsgKey, Record),
    ) {
        let Some(chain) = self.chains.get_mut(&(origin, dst)) else {
            return;
        };
        let counts = &mut self.counts;
        while chain
            .front()
            .is_some_and(|r| uid::at_or_before(r.uid, upto))
        {
            let Some(r) = chain.pop_front() else {
                break;
            };
            debug_assert_eq!(transition(r.role, Some(r.state), Trigger::Ack), Ok(None));
            counts.sub(&r);
            released(MsgKey { origin, uid: r.uid }, r);
        }
    }

    /// Hop records older than `age` or beyond `max` (oldest first) are evicted; returns how
    /// many.
    pub fn evict_hops(&mut self, now: Instant, age: Duration, max: usize) -> usize {
        let mut evicted = 0;
        while let Some(&(key, dst, since)) = self.cache.front() {
            let live = self
                .get(&key, dst)
                .is_some_and(|r| r.role == Role::Hop && r.since == since);
            if !live {
                self.cache.pop_front();
                continue;
            }
            let old = now.saturating_duration_since(since) >= age;
            if !old && self.counts.hop <= max {
                break;
            }
            self.cache.pop_front();
            if let Ok(Some(_)) = self.apply(&key, dst, Trigger::Evicted) {
                evicted += 1;
            }
        }
        // Entries released by acks linger in the FIFO until they reach its front; keep that
        // garbage from outgrowing the live records.
        if self.cache.len() > 4 * max.max(self.counts.hop).max(16) {
            let mut cache = std::mem::take(&mut self.cache);
            cache.retain(|(k, d, s)| self.get(k, *d).is_some_and(|r| r.since == *s));
            self.cache = cache;
        }
        evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(role: Role, dst: Rank, now: Instant) -> Record {
        Record {
            role,
            uid: 0,
            state: MsgState::Sending,
            dst,
            tag: 100,
            prev: uid::NONE,
            data: Some(Bytes::from_static(b"x")),
            since: now,
            token: None,
            retransmit_at: now,
            retransmits: 0,
            runtime: false,
        }
    }

    #[test]
    fn a_kept_trigger_changes_the_state_in_place_and_a_releasing_one_is_refused() {
        let now = Instant::now();
        let mut r = rec(Role::Origin, 3, now);
        assert_eq!(apply_kept(&mut r, Trigger::Transmitted), Ok(()));
        assert_eq!(r.state, MsgState::Sent);
        // An acknowledgement releases the record: the table must count it, so not here.
        assert!(apply_kept(&mut r, Trigger::Ack).is_err());
        assert_eq!(r.state, MsgState::Sent, "unchanged");
        // A transition the table does not allow is refused as in `apply`.
        let mut d = rec(Role::Destination, 3, now);
        d.state = MsgState::Pending;
        assert!(apply_kept(&mut d, Trigger::Transmitted).is_err());
    }

    #[test]
    fn transitions_follow_the_table() {
        use MsgState::*;
        assert_eq!(
            transition(Role::Origin, None, Trigger::New),
            Ok(Some(Sending))
        );
        assert_eq!(
            transition(Role::Origin, Some(Sending), Trigger::Transmitted),
            Ok(Some(Sent))
        );
        assert_eq!(transition(Role::Origin, Some(Sent), Trigger::Ack), Ok(None));
        assert_eq!(
            transition(Role::Hop, None, Trigger::Request),
            Ok(Some(Requested))
        );
        assert_eq!(
            transition(Role::Hop, Some(Requested), Trigger::Data),
            Ok(Some(Sending))
        );
        assert_eq!(
            transition(Role::Hop, Some(Sent), Trigger::Evicted),
            Ok(None)
        );
        assert!(transition(Role::Origin, Some(Sent), Trigger::Evicted).is_err());
        assert!(transition(Role::Destination, None, Trigger::New).is_err());
    }

    #[test]
    fn acks_release_the_chain_prefix_and_the_cache_is_bounded() {
        let now = Instant::now();
        let mut t = MessageTable::default();
        for u in [3, 1, 2, 5] {
            t.insert(
                MsgKey { origin: 1, uid: u },
                rec(Role::Hop, 4, now),
                Trigger::New,
            )
            .unwrap();
        }
        let mut uids = Vec::new();
        t.ack_chain(1, 4, 3, |k, _| uids.push(k.uid));
        assert_eq!(uids, vec![1, 2, 3]);
        assert_eq!(t.counts(), (0, 1, 0));
        for u in 10..20 {
            t.insert(
                MsgKey { origin: 2, uid: u },
                rec(Role::Hop, 4, now),
                Trigger::New,
            )
            .unwrap();
        }
        assert_eq!(t.evict_hops(now, Duration::from_secs(1), 4), 7);
        assert_eq!(t.counts().1, 4);
        let later = now + Duration::from_secs(2);
        assert_eq!(t.evict_hops(later, Duration::from_secs(1), 4), 4);
        assert!(t.is_empty());
    }
}
