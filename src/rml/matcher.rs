//! Matching arriving messages against posted receives, and holding the ones nothing wanted yet.
//!
//! Semantics follow PRRTE's `prte_rml_recv`/`prte_rml_base_process_msg`, with two deliberate
//! differences: posting a duplicate (peer, tag) is an error instead of an abort, and the unmatched
//! list is bounded (the oldest held message is dropped and handed back).

use std::collections::{HashMap, VecDeque};
use std::fmt;

use bytes::Bytes;

use super::tag::Tag;
use crate::Rank;
use crate::fxhash::FxHashMap;

/// Who a receive is posted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Peer {
    /// Any origin (PRRTE's wildcard name).
    Any,
    /// Only messages whose origin is this rank.
    Rank(Rank),
}

/// How long a posted receive stays posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecvMode {
    /// Matches one message, then is retired (PRRTE's non-persistent receive).
    Once,
    /// Matches every message for its (peer, tag) until cancelled.
    Persistent,
}

impl RecvMode {
    /// Whether the receive stays posted after a match.
    pub fn is_persistent(self) -> bool {
        self == RecvMode::Persistent
    }
}

impl Peer {
    /// Whether a message from `origin` is for a receive posted for `self`.
    pub fn matches(self, origin: Rank) -> bool {
        match self {
            Peer::Any => true,
            Peer::Rank(r) => r == origin,
        }
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::Any => f.write_str("any"),
            Peer::Rank(r) => write!(f, "rank {r}"),
        }
    }
}

/// A message as the messaging layer sees it once it has arrived (or been sent to ourselves).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The rank that sent it (not the neighbour that relayed it).
    pub origin: Rank,
    /// The tag it was sent with.
    pub tag: Tag,
    /// The payload; shared, never copied by the matcher.
    pub payload: Bytes,
}

/// Identifies one posted receive for its whole life; never reused by a [`Matcher`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReceiveId(pub u64);

/// Why [`Matcher::post`] refused a receive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PostError {
    /// A receive for exactly this (peer, tag) is already posted. Cancel it first.
    Duplicate {
        /// The peer of the posted receive.
        peer: Peer,
        /// Its tag.
        tag: Tag,
    },
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PostError::Duplicate { peer, tag } => {
                write!(f, "a receive for ({peer}, tag {tag}) is already posted")
            }
        }
    }
}

impl std::error::Error for PostError {}

/// What to do with one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dispatch {
    /// Hand `msg` to the callback of receive `id`. If `retired`, the receive was one-shot and is
    /// gone now: the driver drops its callback after calling it.
    Deliver {
        /// The receive that matched.
        id: ReceiveId,
        /// Whether that receive is gone now (one-shot).
        retired: bool,
        /// The message.
        msg: Message,
    },
    /// No receive matched; the message is held in the unmatched list until one is posted.
    Held,
    /// Held, and the oldest held message was dropped to stay within the bound; here it is (the
    /// driver counts and warns).
    HeldEvicted(Message),
}

#[derive(Debug, Clone, Copy)]
struct Posted {
    id: ReceiveId,
    persistent: bool,
}

/// Posted receives and the unmatched list of one daemon. Sans-IO: no clock, no callbacks.
///
/// Invariant: no held message matches any posted receive (posting drains the held matches, and
/// an arriving message is only held when nothing matched it).
#[derive(Debug)]
pub struct Matcher {
    /// Only local posts insert here, so the fast hasher is safe (see `crate::fxhash`).
    posted: FxHashMap<(Peer, Tag), Posted>,
    /// Held messages, oldest first.
    unmatched: VecDeque<Message>,
    /// How many held messages carry each tag, so that posting for a tag with nothing held skips
    /// the linear scan.
    held_per_tag: HashMap<Tag, usize>,
    unmatched_max: usize,
    next_id: u64,
    /// The last persistent receive a message matched: (origin, tag) and the key it matched
    /// under. A stream of messages from one origin on one tag then costs no hash lookup.
    /// Cleared whenever `posted` changes, so it never answers differently from the map.
    last_match: Option<(Rank, Tag, (Peer, Tag), Posted)>,
}

impl Matcher {
    /// A matcher holding at most `unmatched_max` unmatched messages (see
    /// [`crate::limits::UNMATCHED_MAX_DEFAULT`]). A bound of 0 is treated as 1: an arriving
    /// message is always held at least until the next one arrives.
    pub fn new(unmatched_max: usize) -> Self {
        Matcher {
            posted: FxHashMap::default(),
            unmatched: VecDeque::new(),
            held_per_tag: HashMap::new(),
            unmatched_max: unmatched_max.max(1),
            next_id: 0,
            last_match: None,
        }
    }

    /// Post a receive for (`peer`, `tag`).
    ///
    /// Errors if the same (peer, tag) is already posted (PRRTE aborts; we return an error and
    /// change nothing). Otherwise scans the unmatched list first: a persistent receive takes
    /// every held match (in arrival order) and stays posted; a one-shot takes the first and is
    /// then retired (not posted; its single delivery has `retired: true`), or stays posted if
    /// nothing was held for it.
    ///
    /// Returns the id and the deliveries to make now, in order (each [`Dispatch::Deliver`]).
    /// Any tag is accepted: checking user tags against [`super::TAG_USER_MIN`] is the caller's job.
    pub fn post(
        &mut self,
        peer: Peer,
        tag: Tag,
        persistent: bool,
    ) -> Result<(ReceiveId, Vec<Dispatch>), PostError> {
        if self.posted.contains_key(&(peer, tag)) {
            return Err(PostError::Duplicate { peer, tag });
        }
        let id = ReceiveId(self.next_id);
        self.next_id += 1;

        let mut taken = Vec::new();
        if self.held_per_tag.contains_key(&tag) {
            let wanted = |m: &Message| m.tag == tag && peer.matches(m.origin);
            if persistent {
                // One pass that keeps the rest in order: linear however many are taken.
                let held = std::mem::take(&mut self.unmatched);
                for m in held {
                    if wanted(&m) {
                        taken.push(m);
                    } else {
                        self.unmatched.push_back(m);
                    }
                }
            } else if let Some(pos) = self.unmatched.iter().position(wanted)
                && let Some(m) = self.unmatched.remove(pos)
            {
                taken.push(m);
            }
            for _ in &taken {
                self.note_unheld(tag);
            }
        }

        let retired = !persistent && !taken.is_empty();
        if !retired {
            self.last_match = None;
            self.posted.insert((peer, tag), Posted { id, persistent });
        }
        let deliveries = taken
            .into_iter()
            .map(|msg| Dispatch::Deliver { id, retired, msg })
            .collect();
        Ok((id, deliveries))
    }

    /// Match an arriving message: a receive posted for (origin, tag) wins over one for
    /// (Any, tag). One-shot receives are retired on match. If nothing matches the message is
    /// held; at the bound the oldest held message is dropped and returned.
    pub fn handle_message(&mut self, msg: Message) -> Dispatch {
        let hit = match self.last_match {
            Some((origin, tag, key, p)) if origin == msg.origin && tag == msg.tag => Some((key, p)),
            _ => {
                // One hash lookup per candidate key (the specific receive first), not two.
                let specific = (Peer::Rank(msg.origin), msg.tag);
                let any = (Peer::Any, msg.tag);
                match self.posted.get(&specific) {
                    Some(&p) => Some((specific, p)),
                    None => self.posted.get(&any).map(|&p| (any, p)),
                }
            }
        };
        if let Some((key, p @ Posted { id, persistent })) = hit {
            if persistent {
                self.last_match = Some((msg.origin, msg.tag, key, p));
            } else {
                self.last_match = None;
                self.posted.remove(&key);
            }
            return Dispatch::Deliver {
                id,
                retired: !persistent,
                msg,
            };
        }

        let evicted = if self.unmatched.len() >= self.unmatched_max {
            let old = self.unmatched.pop_front();
            if let Some(old) = &old {
                self.note_unheld(old.tag);
            }
            old
        } else {
            None
        };
        *self.held_per_tag.entry(msg.tag).or_insert(0) += 1;
        self.unmatched.push_back(msg);
        match evicted {
            Some(old) => Dispatch::HeldEvicted(old),
            None => Dispatch::Held,
        }
    }

    /// The persistent receive a message from `origin` with `tag` would match now, if the
    /// receive that would match it is a persistent one (a one-shot, or none: `None`, and nothing
    /// changes). Every message from `origin` with `tag` then matches it until the posted
    /// receives change, so a run of such messages may be delivered to it together
    /// (`rml::batch_frame::ItemRun`); [`Matcher::handle_message`] would give each the same id.
    pub fn match_persistent(&mut self, origin: Rank, tag: Tag) -> Option<ReceiveId> {
        if let Some((o, t, _, p)) = self.last_match
            && o == origin
            && t == tag
        {
            return Some(p.id);
        }
        let specific = (Peer::Rank(origin), tag);
        let any = (Peer::Any, tag);
        let (key, p) = match self.posted.get(&specific) {
            Some(&p) => (specific, p),
            None => self.posted.get(&any).map(|&p| (any, p))?,
        };
        if !p.persistent {
            return None;
        }
        self.last_match = Some((origin, tag, key, p));
        Some(p.id)
    }

    /// Like [`Matcher::handle_message`], but never evicts: when no receive matches and the
    /// unmatched list is full, the message is handed back (`Err`) and nothing changes. For
    /// messages whose sender keeps a copy and replays it later (reliable messages), where
    /// dropping an older held message would lose it for good.
    pub fn try_handle_message(&mut self, msg: Message) -> Result<Dispatch, Message> {
        // The last persistent match is still posted (a withdrawal clears it): no look-up.
        let matched = self
            .last_match
            .is_some_and(|(o, t, _, _)| o == msg.origin && t == msg.tag)
            || self.posted.contains_key(&(Peer::Rank(msg.origin), msg.tag))
            || self.posted.contains_key(&(Peer::Any, msg.tag));
        if !matched && self.unmatched.len() >= self.unmatched_max {
            return Err(msg);
        }
        Ok(self.handle_message(msg))
    }

    /// Cancel the receive posted for exactly (`peer`, `tag`): `Peer::Any` cancels only the
    /// wildcard receive, not receives posted for specific ranks. Returns its id, or `None` if
    /// nothing was posted (for example a one-shot that already fired).
    pub fn cancel(&mut self, peer: Peer, tag: Tag) -> Option<ReceiveId> {
        self.last_match = None;
        self.posted.remove(&(peer, tag)).map(|p| p.id)
    }

    /// The id of the receive posted for exactly (`peer`, `tag`), if any; changes nothing. Lets
    /// the driver check which receive a cancel would remove before it removes it.
    pub fn receive_id(&self, peer: Peer, tag: Tag) -> Option<ReceiveId> {
        self.posted.get(&(peer, tag)).map(|p| p.id)
    }

    /// A departed peer: drop receives posted for `Peer::Rank(peer)` and held messages from it.
    /// Wildcard receives stay. Returns (retired ids in ascending order, number of held messages
    /// dropped). Linear in the number of posted receives and held messages.
    pub fn purge(&mut self, peer: Rank) -> (Vec<ReceiveId>, usize) {
        let mut retired = Vec::new();
        self.last_match = None;
        self.posted.retain(|(p, _), posted| {
            let keep = *p != Peer::Rank(peer);
            if !keep {
                retired.push(posted.id);
            }
            keep
        });
        retired.sort_unstable();

        let before = self.unmatched.len();
        let mut dropped_tags = Vec::new();
        self.unmatched.retain(|m| {
            let keep = m.origin != peer;
            if !keep {
                dropped_tags.push(m.tag);
            }
            keep
        });
        for tag in dropped_tags {
            self.note_unheld(tag);
        }
        (retired, before - self.unmatched.len())
    }

    /// Number of messages held in the unmatched list.
    pub fn unmatched_len(&self) -> usize {
        self.unmatched.len()
    }

    /// Number of receives currently posted.
    pub fn posted_len(&self) -> usize {
        self.posted.len()
    }

    /// The bound on the unmatched list this matcher was built with (after clamping).
    pub fn unmatched_max(&self) -> usize {
        self.unmatched_max
    }

    /// Bookkeeping for one held message with `tag` leaving the unmatched list.
    fn note_unheld(&mut self, tag: Tag) {
        if let Some(n) = self.held_per_tag.get_mut(&tag) {
            *n -= 1;
            if *n == 0 {
                self.held_per_tag.remove(&tag);
            }
        }
    }
}

#[cfg(test)]
mod tests;
