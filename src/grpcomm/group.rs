//! Group collectives, sans-IO: an allgather among the members of a group (a job's daemons),
//! with barrier and broadcast on top; one [`GroupGather`] per daemon (issue "Jobs").
//!
//! # The protocol
//! - A collective is named by its [`GroupOp`] (see [`super::members`]): every member calls the
//!   group's collectives in the same order and numbers them alike, so no id is agreed out of
//!   band. Every living member calls [`GroupGather::contribute`] once per collective.
//! - The collective runs in the part of the tree that holds members, rooted at rank 0: a daemon
//!   takes part only when its subtree (in its current view) holds a living member. Such a
//!   daemon is *interested* in the children whose subtrees hold living members, and sends its
//!   parent a `Contribution` (its subtree's entries) once it has its own (members only) and a
//!   complete one from every interested child. Complete means, as for the DVM-wide allgather,
//!   made by a current child under the receiver's view digest. A relay that is no member
//!   forwards and merges; a daemon with no member below it never hears of the collective.
//! - Rank 0, complete, builds the result (entries by rank; members without one are excluded:
//!   they failed before their contribution reached the tree) and sends it down as `Result`
//!   messages to its interested children; each daemon that gets it delivers it (members) and
//!   forwards it to its own interested children. Only members and their ancestors see it.
//!
//! # Repairs and lost messages
//! - Upwards it is the allgather's scheme: a daemon whose parent changed, or that was promoted,
//!   re-sends its unfinished contributions; kept children stay complete (their subtrees only
//!   shrink); a contribution under another view is merged but not counted and answered with a
//!   `Sync`. Dead members stop being waited for once the repair is known.
//! - Downwards results are pulled: a contribution for a collective the receiver has already
//!   finished is answered with the result from its cache of recent results
//!   ([`crate::limits::GROUP_RESULTS_CACHED_MAX`],
//!   [`crate::limits::GROUP_RESULTS_CACHED_BYTES`]). A member cut off from the result by a
//!   relay's death re-sends its contribution to its new parent (its parent changed), which
//!   either has the result or passes the contribution on towards one that has. A result
//!   evicted from every cache on the way is answered `lost`, and the member's collective ends
//!   with [`GroupFailure::Lost`] instead of hanging.
//! - A link that lost messages between two living daemons ([`GroupGather::handle_link_up`]):
//!   towards the parent every unfinished contribution is sent again; towards a child a `Sync`
//!   makes the child re-send its own, which pulls any result it missed.
//!
//! # Returns
//! A member that returns (rejoin, or a rank joining a DVM started with room to grow) is a
//! member again, of every group that names its rank, with the allgather's rule (see
//! [`super::allgather`], "Rejoins"): *a group collective waits for a returned member only if
//! it started after the return was known everywhere it was held.*
//! - Every daemon holding a collective when a repair restores one of its members marks the
//!   member *excused* in it, and sends its contribution again if it had sent it; contributions
//!   carry their excused members up.
//! - A daemon holding a collective with a living excused member passes an `Excuse` down to
//!   every interested child it still waits for, which does the same, so the news reaches the
//!   returned daemon wherever it was learnt. An excused member without its own contribution
//!   sends its subtree's, and is excluded unless its own reaches rank 0 first (its application
//!   may contribute later: it is sent again, entries being idempotent).
//! - A child that has already finished the collective answers an `Excuse` with `Have`.
//! - A returned daemon may finish, as a relay, a collective its application has not called
//!   yet; when the application calls it, it gets the cached result (or
//!   [`GroupFailure::Lost`]). A returned member's calls of collectives finished before its
//!   return get their result the same way, pulled from the first daemon on the way up that
//!   still has it.
//!
//! An embedder whose returned daemon does not take part in a job's group again (it lost the
//! job) must not leave the group's members waiting for it: they form the job's group anew
//! without that rank (another [`super::members::GroupId`]), as they would after a failure they
//! do not want to carry on through. See `docs/architecture.md`, "Groups across a return".
//!
//! # Bounds
//! [`crate::limits::GROUP_INFLIGHT_MAX`] own contributions without a result (`TooMany`, the
//! only refusal of an own contribution); [`crate::limits::GROUP_TRACKED_MAX`] more collectives
//! with state that this daemon relays (a contribution for one more is dropped and counted); `ALLGATHER_MAX_BYTES` gathered per collective (it overflows as the
//! allgather does); [`crate::limits::GROUP_FINISHED_MEMORY`] finished collectives remembered.
use super::Transmit;
use super::gathering::{ENTRY_OVERHEAD, Gathering};
use super::members::GroupOp;
use super::view::TreeView;
use super::wire::{AllgatherResult, GroupData, GroupMsg};
use crate::Rank;
use crate::limits::{
    ALLGATHER_MAX_BYTES, GROUP_FINISHED_MEMORY, GROUP_INFLIGHT_MAX, GROUP_RESULTS_CACHED_BYTES,
    GROUP_RESULTS_CACHED_MAX, GROUP_TRACKED_MAX, GRPCOMM_PENDING_SYNCS_MAX,
};
use crate::routed::{RecoveryStatus, Route, RoutingState};
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

#[cfg(test)]
mod tests;

/// Why a group collective ended without a result at a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupFailure {
    /// The result was forgotten by every daemon this member's late contribution reached (see
    /// the module documentation: only after results were evicted from the bounded caches).
    Lost,
}

/// What a daemon's group core tells its application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupEvent {
    /// Collective `op` ended at this member. The result's `id` is `op.seq`.
    Done {
        op: GroupOp,
        result: Result<AllgatherResult, GroupFailure>,
    },
}

/// Why [`GroupGather::contribute`] refused. Nothing was recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupContributeError {
    /// This daemon is not a member of the group.
    NotMember,
    /// A member is not a rank of this DVM.
    RankOutOfRange(Rank),
    /// This daemon already contributed to this collective.
    AlreadyContributed,
    /// The collective has already finished here.
    Finished,
    /// The contribution alone exceeds `ALLGATHER_MAX_BYTES` (with its 8 bytes of overhead).
    TooLarge { len: usize, max: usize },
    /// [`GROUP_INFLIGHT_MAX`] own collectives are in flight here.
    TooMany,
    /// This daemon was declared failed.
    Dead,
}

impl std::fmt::Display for GroupContributeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GroupContributeError::NotMember => write!(f, "this daemon is not a member"),
            GroupContributeError::RankOutOfRange(r) => write!(f, "member {r} is not in the DVM"),
            GroupContributeError::AlreadyContributed => write!(f, "already contributed"),
            GroupContributeError::Finished => write!(f, "this collective has already finished"),
            GroupContributeError::TooLarge { len, max } => {
                write!(f, "contribution of {len} bytes is above {max}")
            }
            GroupContributeError::TooMany => write!(f, "too many group collectives in flight"),
            GroupContributeError::Dead => write!(f, "this daemon was declared failed"),
        }
    }
}

impl std::error::Error for GroupContributeError {}

/// Counters of one group core.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupStats {
    /// Contributions sent to the parent (re-sends included).
    pub sent: u64,
    /// Contributions received.
    pub received: u64,
    /// Contributions received under another view (merged, not counted).
    pub other_view: u64,
    /// Contributions for a collective already finished here, answered from the cache.
    pub answered_late: u64,
    /// Contributions for a finished collective no longer cached, answered `lost`.
    pub answered_lost: u64,
    /// Contributions for a new collective dropped at [`GROUP_TRACKED_MAX`].
    pub dropped_untracked: u64,
    /// Collectives that overflowed `ALLGATHER_MAX_BYTES` here.
    pub overflowed: u64,
    /// Results received for a collective already finished here.
    pub duplicate_results: u64,
    /// Results sent to children (forwarded or answered).
    pub results_sent: u64,
    /// `Excuse` messages sent down.
    pub excuses_sent: u64,
}

/// One collective at one daemon.
#[derive(Debug, Clone, Default)]
struct Pending {
    /// This daemon is a member.
    member: bool,
    /// This daemon contributed (members only).
    own: bool,
    data: Gathering,
    /// Current children whose contribution covers their subtree in this daemon's view.
    complete: BTreeSet<Rank>,
    /// (parent, digest) of the last send.
    sent: Option<(Rank, u64)>,
    /// The interested children, computed under the digest it is paired with.
    interested: Option<(u64, Vec<Rank>)>,
    /// Neighbours that told this daemon they hold the outcome (`Have`): as children they
    /// count as complete.
    have: BTreeSet<Rank>,
    /// Per child: (view digest, excused members) at the last `Excuse` sent to it.
    excuses_sent: BTreeMap<Rank, (u64, usize)>,
}

/// A result kept to answer late contributions.
#[derive(Debug, Clone)]
struct Cached {
    op: GroupOp,
    data: GroupData,
    bytes: usize,
}

/// One daemon's group core. See the module documentation for the protocol and [`super`] for
/// the poll order the driver must follow; every call that can decide something takes the
/// daemon's [`RoutingState`], which must be the one whose repairs the core was given.
#[derive(Debug, Clone)]
pub struct GroupGather {
    view: TreeView,
    pending: BTreeMap<GroupOp, Pending>,
    finished: VecDeque<(u128, u64)>,
    finished_set: BTreeSet<(u128, u64)>,
    cache: VecDeque<Cached>,
    cache_bytes: usize,
    /// Own contributions without a result.
    local: usize,
    /// `Sync` to send: (child, digest).
    syncs: VecDeque<(Rank, u64)>,
    /// The digest of the last `Sync` sent to each child.
    synced: BTreeMap<Rank, u64>,
    /// `Sync` offers not answered yet: (sender, digest).
    pending_syncs: VecDeque<(Rank, u64)>,
    /// Collectives that may have become ready (to send up, or at rank 0 to finish).
    dirty: BTreeSet<GroupOp>,
    out: VecDeque<Transmit<GroupMsg>>,
    events: VecDeque<GroupEvent>,
    stats: GroupStats,
    /// This daemon returned (rejoined or joined): it may finish a collective as a relay before
    /// its application calls it.
    returned: bool,
    /// A returned daemon: finished collectives of which it is a member and to which its
    /// application had not contributed; a call of one gets the cached result.
    unclaimed: BTreeSet<(u128, u64)>,
}

impl GroupGather {
    /// The core of daemon `routing.me()`, in the tree `routing` describes.
    pub fn new(routing: &RoutingState) -> Self {
        GroupGather {
            view: TreeView::new(routing),
            pending: BTreeMap::new(),
            finished: VecDeque::new(),
            finished_set: BTreeSet::new(),
            cache: VecDeque::new(),
            cache_bytes: 0,
            local: 0,
            syncs: VecDeque::new(),
            synced: BTreeMap::new(),
            pending_syncs: VecDeque::new(),
            dirty: BTreeSet::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            stats: GroupStats::default(),
            returned: false,
            unclaimed: BTreeSet::new(),
        }
    }

    /// The core of a daemon that returned (rejoined, or joined a DVM started with room to
    /// grow) into the tree `routing` describes: see the module documentation, "Returns".
    pub fn rejoined(routing: &RoutingState) -> Self {
        GroupGather {
            returned: true,
            ..GroupGather::new(routing)
        }
    }

    /// The counters.
    pub fn stats(&self) -> &GroupStats {
        &self.stats
    }

    /// Collectives this daemon keeps state for (members' and relays').
    pub fn tracked(&self) -> usize {
        self.pending.len()
    }

    /// Own contributions without a result.
    pub fn in_flight(&self) -> usize {
        self.local
    }

    /// Collectives with state here that this daemon has not contributed to (relayed, or
    /// opened by a child before this member's own call).
    fn relayed(&self) -> usize {
        self.pending.len().saturating_sub(self.local)
    }

    /// Contribute `data` to `op` (this daemon must be a member). The outcome arrives as
    /// [`GroupEvent::Done`]. Fails, recording nothing, with a [`GroupContributeError`].
    pub fn contribute(&mut self, op: GroupOp, data: Bytes) -> Result<(), GroupContributeError> {
        if self.view.dead {
            return Err(GroupContributeError::Dead);
        }
        if op.group.max_rank() >= self.view.size {
            return Err(GroupContributeError::RankOutOfRange(op.group.max_rank()));
        }
        if !op.group.contains(self.view.me) {
            return Err(GroupContributeError::NotMember);
        }
        let key = op.finished_key();
        if self.finished_set.contains(&key) {
            if !self.unclaimed.remove(&key) {
                return Err(GroupContributeError::Finished);
            }
            // A returned daemon's application calls a collective this daemon finished as a
            // relay: the cached result, or lost.
            let result = match self.cache.iter().find(|c| c.op == op) {
                Some(c) => Ok(result_of(&op, &c.data)),
                None => Err(GroupFailure::Lost),
            };
            self.events.push_back(GroupEvent::Done { op, result });
            return Ok(());
        }
        if data.len().saturating_add(ENTRY_OVERHEAD) > ALLGATHER_MAX_BYTES {
            return Err(GroupContributeError::TooLarge {
                len: data.len(),
                max: ALLGATHER_MAX_BYTES - ENTRY_OVERHEAD,
            });
        }
        if self.pending.get(&op).is_some_and(|p| p.own) {
            return Err(GroupContributeError::AlreadyContributed);
        }
        // Only this bound refuses an own contribution: relayed state has a bound of its own,
        // so a caller whose call was admitted is never refused for a neighbour's traffic.
        if self.local >= GROUP_INFLIGHT_MAX {
            return Err(GroupContributeError::TooMany);
        }
        let me = self.view.me;
        let p = self.pending.entry(op.clone()).or_default();
        p.member = true;
        p.own = true;
        // Sent already if this member was excused: send again, now with its entry.
        p.sent = None;
        p.data.add_entry(me, data);
        if p.data.check_overflow(&Named(&op)) {
            self.stats.overflowed += 1;
        }
        self.local += 1;
        self.dirty.insert(op);
        Ok(())
    }

    /// A message from tree neighbour `from`.
    pub fn handle_msg(&mut self, routing: &RoutingState, from: Rank, msg: GroupMsg) {
        if self.view.dead {
            return;
        }
        match msg {
            GroupMsg::Contribution { op, digest, data } => {
                self.on_contribution(from, op, digest, data)
            }
            GroupMsg::Result { op, lost, data } => {
                if self.finished_set.contains(&op.finished_key()) {
                    self.stats.duplicate_results += 1;
                    return;
                }
                // From a former parent, after this daemon's parent changed: the new one may
                // wait for this subtree, and this daemon's contribution (if its application
                // calls later) is answered here; tell it (seed 1256 of `all,rejoin,grow`).
                if let Some(parent) = self.view.parent
                    && parent != from
                    && !lost
                {
                    self.out.push_back(Transmit {
                        to: parent,
                        msg: GroupMsg::Have { op: op.clone() },
                    });
                }
                self.finish(routing, op, lost, data);
            }
            // Unlike the allgather's, answered at once under any view (it pulls outcomes,
            // which a finished parent answers whatever the view), and answered again when this
            // daemon reaches the sender's view (for an unfinished parent, which counts only a
            // contribution made under its own view).
            GroupMsg::Sync { digest } => {
                let parent = Some(from) == self.view.parent;
                if parent {
                    self.answer_sync();
                }
                if !parent || digest != self.view.digest {
                    self.remember_sync(from, digest);
                }
            }
            GroupMsg::Have { op } => self.on_have(from, op),
            GroupMsg::Excuse { op, ranks } => self.on_excuse(from, op, ranks),
        }
    }

    /// Follow a repair of this daemon's routing state (every status, in order). Gone children
    /// stop counting, new ones must contribute again under the new view, a daemon whose parent
    /// changed (or that was promoted) re-sends; a dead daemon drops its state.
    pub fn handle_repair(&mut self, status: &RecoveryStatus) {
        let change = self.view.apply(status);
        if change.died {
            log::warn!(
                "group collectives: this daemon ({}) was declared failed",
                self.view.me
            );
            self.pending.clear();
            self.syncs.clear();
            self.pending_syncs.clear();
            self.dirty.clear();
            self.out.clear();
            self.events.clear();
            self.local = 0;
            return;
        }
        if self.view.dead {
            return;
        }
        if change.view_changed {
            // A digest recurs when a rank returns: a `Sync` sent under an earlier view of the
            // same digest must not stop this view's.
            self.synced.clear();
        }
        let view = &self.view;
        let digest = view.digest;
        let mut wanted: BTreeSet<Rank> = BTreeSet::new();
        for (op, p) in self.pending.iter_mut() {
            let members_back = status
                .restored
                .iter()
                .copied()
                .filter(|r| op.group.contains(*r));
            if p.data
                .follow_restores(members_back, &mut p.excuses_sent, view, &change)
            {
                p.sent = None;
            }
            p.data
                .follow_repair(&mut p.complete, view, &change.new_children, &mut wanted);
            if change.new_upstream {
                p.sent = None;
            }
            self.dirty.insert(op.clone());
        }
        if change.new_upstream {
            self.announce_results();
        }
        // A new child may have sent its contribution while this daemon still saw another
        // tree, and this daemon may have finished since without sending it the outcome: the
        // `Sync` makes it send again, and a finished collective is answered from the cache.
        wanted.extend(change.new_children.iter().copied());
        for child in wanted {
            self.queue_sync(child);
        }
        let view = &self.view;
        self.synced.retain(|r, _| view.is_child(*r));
        self.syncs.retain(|(r, _)| view.is_child(*r));
        self.pending_syncs.retain(|(r, _)| !view.failed.contains(r));
        if let Some(parent) = self.view.parent
            && self.pending_syncs.iter().any(|&(r, _)| r == parent)
        {
            self.pending_syncs
                .retain(|&(r, d)| r != parent || d != digest);
            self.answer_sync();
        }
    }

    /// The link with neighbour `peer` may have lost messages although `peer` lives: towards the
    /// parent every unfinished contribution goes again; towards a child a `Sync` makes it
    /// re-send its own, which pulls any result it missed.
    pub fn handle_link_up(&mut self, peer: Rank) {
        if self.view.dead {
            return;
        }
        if Some(peer) == self.view.parent {
            for (op, p) in self.pending.iter_mut() {
                if p.sent.is_some_and(|(to, _)| to == peer) {
                    p.sent = None;
                    self.dirty.insert(op.clone());
                }
            }
            self.announce_results();
        }
        if self.view.is_child(peer) {
            for (op, p) in self.pending.iter_mut() {
                if p.excuses_sent.remove(&peer).is_some() {
                    self.dirty.insert(op.clone());
                }
            }
            self.synced.remove(&peer);
            self.queue_sync(peer);
        }
    }

    /// The next message to send, or `None`. Drain it after every input (see [`super`]).
    pub fn poll_transmit(&mut self, routing: &RoutingState) -> Option<Transmit<GroupMsg>> {
        if self.view.dead {
            return None;
        }
        loop {
            if let Some(t) = self.out.pop_front() {
                return Some(t);
            }
            while let Some((to, digest)) = self.syncs.pop_front() {
                if self.view.is_child(to) {
                    return Some(Transmit {
                        to,
                        msg: GroupMsg::Sync { digest },
                    });
                }
            }
            let op = self.dirty.pop_first()?;
            self.queue_excuses(routing, &op);
            self.evaluate(routing, op);
        }
    }

    /// The next event, or `None`.
    pub fn poll_event(&mut self) -> Option<GroupEvent> {
        if self.view.dead {
            return None;
        }
        self.events.pop_front()
    }

    /// What this daemon holds of `op`, for a failing test's message.
    #[cfg(test)]
    pub(crate) fn describe(&self, op: &GroupOp) -> String {
        let finished = self.finished_set.contains(&op.finished_key());
        match self.pending.get(op) {
            Some(p) => format!(
                "pending member={} own={} excused={:?} complete={:?} have={:?} sent={:?} \
                 interested={:?} parent={:?} children={:?} digest={}",
                p.member,
                p.own,
                p.data.excused,
                p.complete,
                p.have,
                p.sent,
                p.interested,
                self.view.parent,
                self.view.children,
                self.view.digest
            ),
            None => format!("finished={finished} parent={:?}", self.view.parent),
        }
    }

    // ----- internals -------------------------------------------------------------------------

    fn on_contribution(&mut self, from: Rank, op: GroupOp, digest: u64, data: GroupData) {
        self.stats.received += 1;
        if self.finished_set.contains(&op.finished_key()) {
            self.answer_late(from, &op);
            return;
        }
        let me = self.view.me;
        let is_child = self.view.is_child(from);
        let same_view = digest == self.view.digest;
        let Some(p) = self.open(&op, "a contribution") else {
            return;
        };
        // Not from `excluded`: a member listed there may be only suspected below, and alive.
        for r in data.excused {
            p.data.add_excused(r);
        }
        p.data
            .merge(me, data.overflowed, data.entries, data.excluded);
        p.data.hear(from, digest);
        let overflowed = p.data.check_overflow(&Named(&op));
        let mut want_sync = false;
        if is_child {
            if same_view {
                p.complete.insert(from);
            } else if !p.complete.contains(&from) {
                want_sync = true;
            }
        }
        if overflowed {
            self.stats.overflowed += 1;
        }
        if !same_view {
            self.stats.other_view += 1;
        }
        if want_sync {
            self.queue_sync(from);
        }
        self.dirty.insert(op);
    }

    /// The state of `op` for a neighbour's message (`what`, for the log), opened if need be;
    /// `None` (the message dropped, logged and counted) when that would pass
    /// [`GROUP_TRACKED_MAX`] collectives relayed here.
    fn open(&mut self, op: &GroupOp, what: &str) -> Option<&mut Pending> {
        if !self.pending.contains_key(op) && self.relayed() >= GROUP_TRACKED_MAX {
            self.stats.dropped_untracked += 1;
            log::warn!(
                "group collectives: too many in flight; dropped {what} for {}",
                Named(op)
            );
            return None;
        }
        let member = op.group.contains(self.view.me);
        let p = self.pending.entry(op.clone()).or_default();
        p.member = member;
        Some(p)
    }

    /// A neighbour holds the outcome of `op`. A daemon that has not finished `op` stops
    /// waiting for it (the state is opened if need be: what this daemon then sends up is
    /// answered with the result by the first daemon on the way that has it).
    fn on_have(&mut self, from: Rank, op: GroupOp) {
        if self.finished_set.contains(&op.finished_key()) {
            return;
        }
        let Some(p) = self.open(&op, "a word that a neighbour has the result") else {
            return;
        };
        p.have.insert(from);
        self.dirty.insert(op);
    }

    /// The parent's word that `op` does not wait for `ranks` in their new lives. A child that
    /// has finished `op` says so (`Have`): the parent returned after its result went down.
    fn on_excuse(&mut self, from: Rank, op: GroupOp, ranks: Vec<Rank>) {
        if Some(from) != self.view.parent {
            return;
        }
        if self.finished_set.contains(&op.finished_key()) {
            self.out.push_back(Transmit {
                to: from,
                msg: GroupMsg::Have { op },
            });
            return;
        }
        let Some(p) = self.open(&op, "an excuse") else {
            return;
        };
        let mut news = false;
        for r in ranks {
            news |= p.data.add_excused(r);
        }
        if news {
            self.dirty.insert(op);
        }
    }

    /// Passes `op`'s living excused members down to every interested child it still waits for
    /// and has not told them under this view.
    fn queue_excuses(&mut self, routing: &RoutingState, op: &GroupOp) {
        let Some(p) = self.pending.get_mut(op) else {
            return;
        };
        let view = &self.view;
        let living = p.data.living_excused(view);
        if living.is_empty() {
            return;
        }
        let mark = (view.digest, p.data.excused.len());
        for child in interested(routing, op) {
            if p.complete.contains(&child)
                || p.have.contains(&child)
                || p.excuses_sent.get(&child) == Some(&mark)
            {
                continue;
            }
            p.excuses_sent.insert(child, mark);
            log::trace!(
                "rank {}: {}: excuse {living:?} to {child}",
                view.me,
                Named(op)
            );
            self.stats.excuses_sent += 1;
            self.out.push_back(Transmit {
                to: child,
                msg: GroupMsg::Excuse {
                    op: op.clone(),
                    ranks: living.clone(),
                },
            });
        }
    }

    /// Tell the parent which outcomes this daemon holds (after its parent changed, or the
    /// link with it lost messages): a new parent that has not finished one of them must not
    /// wait for this subtree. Only the cached ones: older collectives are long over.
    fn announce_results(&mut self) {
        let Some(parent) = self.view.parent else {
            return;
        };
        for c in &self.cache {
            self.out.push_back(Transmit {
                to: parent,
                msg: GroupMsg::Have { op: c.op.clone() },
            });
        }
    }

    /// A contribution for a collective finished here: the cached result, or `lost`.
    fn answer_late(&mut self, to: Rank, op: &GroupOp) {
        let msg = match self.cache.iter().find(|c| &c.op == op) {
            Some(c) => {
                self.stats.answered_late += 1;
                GroupMsg::Result {
                    op: op.clone(),
                    lost: false,
                    data: c.data.clone(),
                }
            }
            None => {
                self.stats.answered_lost += 1;
                // Info, not a warning: a member below `to` ends the collective with
                // `ResultLost` and its caller is told; a relay (a rank adopted by a repair,
                // say) only passes the answer on.
                log::info!(
                    "group collectives: {} finished and its result is no longer cached; \
                     answered rank {to} that it is lost",
                    Named(op)
                );
                GroupMsg::Result {
                    op: op.clone(),
                    lost: true,
                    data: GroupData::default(),
                }
            }
        };
        self.stats.results_sent += 1;
        self.out.push_back(Transmit { to, msg });
    }

    /// Decide what `op` can do now: send its contribution up, or at rank 0 finish.
    fn evaluate(&mut self, routing: &RoutingState, op: GroupOp) {
        let digest = self.view.digest;
        let me = self.view.me;
        let parent = self.view.parent;
        let failed = &self.view.failed;
        let Some(p) = self.pending.get_mut(&op) else {
            return;
        };
        if p.member && !p.own && !p.data.excused.contains(&me) {
            log::trace!("rank {me}: {}: waiting for its own call", Named(&op));
            return;
        }
        if p.interested.as_ref().is_none_or(|(d, _)| *d != digest) {
            p.interested = Some((digest, interested(routing, &op)));
        }
        let ready = p.interested.as_ref().is_some_and(|(_, kids)| {
            kids.iter()
                .all(|c| p.complete.contains(c) || p.have.contains(c))
        });
        if !ready {
            log::trace!(
                "rank {me}: {}: waiting (own {}, interested {:?}, complete {:?}, have {:?}, \
                 excused {:?})",
                Named(&op),
                p.own,
                p.interested,
                p.complete,
                p.have,
                p.data.excused
            );
            return;
        }
        if me == 0 {
            // An overflowed result carries no data, but names the members that did not enter
            // as any result does: its entries kept their ranks (`Gathering`).
            let excluded: Vec<Rank> = op
                .group
                .members()
                .iter()
                .copied()
                .filter(|r| !p.data.entries.contains_key(r))
                .collect();
            for r in &excluded {
                if !failed.contains(r) && !p.data.excused.contains(r) {
                    log::error!(
                        "{}: member {r} is living but did not contribute",
                        Named(&op)
                    );
                }
            }
            let data = GroupData {
                overflowed: p.data.overflowed,
                entries: p.data.result_entries(),
                excluded,
                excused: Vec::new(),
            };
            self.finish(routing, op, false, data);
            return;
        }
        let Some(parent) = parent else {
            return;
        };
        if p.sent.map(|(to, _)| to) == Some(parent) {
            return;
        }
        p.sent = Some((parent, digest));
        let group = op.group.clone();
        let data = GroupData {
            overflowed: p.data.overflowed,
            entries: p.data.entry_list(),
            excluded: p
                .data
                .excluded_list(failed.iter().copied(), |r| group.contains(r)),
            excused: p.data.excused.iter().copied().collect(),
        };
        self.stats.sent += 1;
        self.out.push_back(Transmit {
            to: parent,
            msg: GroupMsg::Contribution { op, digest, data },
        });
    }

    /// The outcome of `op` is known here: deliver it (an own contribution), send it to the
    /// interested children, keep it for late contributions.
    fn finish(&mut self, routing: &RoutingState, op: GroupOp, lost: bool, data: GroupData) {
        // The interested children, and every current child that sent a contribution (a relay
        // whose members below died since keeps state until the outcome reaches it).
        let mut recipients = interested(routing, &op);
        let removed = self.pending.remove(&op);
        if let Some(p) = &removed {
            recipients.extend(p.data.heard.keys().filter(|r| self.view.is_child(**r)));
            recipients.sort_unstable();
            recipients.dedup();
        }
        log::trace!(
            "rank {}: {}: finished (lost {lost}, own {}), result to {recipients:?}",
            self.view.me,
            Named(&op),
            removed.as_ref().is_some_and(|p| p.own)
        );
        let key = op.finished_key();
        match removed {
            Some(p) if p.own => {
                self.local = self.local.saturating_sub(1);
                let result = if lost {
                    Err(GroupFailure::Lost)
                } else {
                    Ok(result_of(&op, &data))
                };
                self.events.push_back(GroupEvent::Done {
                    op: op.clone(),
                    result,
                });
            }
            _ if self.returned && op.group.contains(self.view.me) => {
                self.unclaimed.insert(key);
            }
            _ => {}
        }
        self.dirty.remove(&op);
        if self.finished.len() >= GROUP_FINISHED_MEMORY
            && let Some(old) = self.finished.pop_front()
        {
            self.finished_set.remove(&old);
            self.unclaimed.remove(&old);
        }
        self.finished.push_back(key);
        self.finished_set.insert(key);
        for child in recipients {
            self.stats.results_sent += 1;
            self.out.push_back(Transmit {
                to: child,
                msg: GroupMsg::Result {
                    op: op.clone(),
                    lost,
                    data: data.clone(),
                },
            });
        }
        if !lost {
            self.remember_result(op, data);
        }
    }

    fn remember_result(&mut self, op: GroupOp, data: GroupData) {
        let bytes = data
            .entries
            .iter()
            .map(|(_, b)| b.len() + ENTRY_OVERHEAD)
            .sum::<usize>()
            + 4 * data.excluded.len()
            + 4 * op.group.members().len();
        if bytes > GROUP_RESULTS_CACHED_BYTES {
            return;
        }
        while self.cache.len() >= GROUP_RESULTS_CACHED_MAX
            || self.cache_bytes + bytes > GROUP_RESULTS_CACHED_BYTES
        {
            let Some(old) = self.cache.pop_front() else {
                break;
            };
            self.cache_bytes -= old.bytes;
        }
        self.cache_bytes += bytes;
        self.cache.push_back(Cached { op, data, bytes });
    }

    /// Ask `child` to re-send under this daemon's view (once per view).
    fn queue_sync(&mut self, child: Rank) {
        let digest = self.view.digest;
        if self.synced.get(&child) != Some(&digest) {
            self.synced.insert(child, digest);
            self.syncs.push_back((child, digest));
        }
    }

    /// Re-send every unfinished contribution (entries are idempotent), and say which outcomes
    /// this daemon holds (one may have reached it from its former parent after its parent
    /// changed).
    fn answer_sync(&mut self) {
        for (op, p) in self.pending.iter_mut() {
            p.sent = None;
            self.dirty.insert(op.clone());
        }
        self.announce_results();
    }

    fn remember_sync(&mut self, from: Rank, digest: u64) {
        self.pending_syncs
            .retain(|&(r, d)| (r, d) != (from, digest));
        if self.pending_syncs.len() >= GRPCOMM_PENDING_SYNCS_MAX
            && let Some((old, _)) = self.pending_syncs.pop_front()
        {
            log::warn!("group collectives: forgot the Sync offer of rank {old} (too many pending)");
        }
        self.pending_syncs.push_back((from, digest));
    }
}

/// The result a member gets from `data` (a result's data: no excused list).
fn result_of(op: &GroupOp, data: &GroupData) -> AllgatherResult {
    AllgatherResult {
        id: op.seq,
        overflowed: data.overflowed,
        contributions: data.entries.clone(),
        excluded: data.excluded.clone(),
    }
}

/// The children of `routing.me()` whose subtrees hold a living member of `op`'s group,
/// ascending.
fn interested(routing: &RoutingState, op: &GroupOp) -> Vec<Rank> {
    let mut kids: Vec<Rank> = op
        .group
        .members()
        .iter()
        .filter_map(|&m| match routing.route(m) {
            Route::Child(c) => Some(c),
            _ => None,
        })
        .collect();
    kids.sort_unstable();
    kids.dedup();
    kids
}

/// A collective's name for the log.
struct Named<'a>(&'a GroupOp);

impl std::fmt::Display for Named<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = self.0.group.members();
        write!(
            f,
            "group collective {} of context {} ({} members, {}..={})",
            self.0.seq,
            self.0.group.context(),
            m.len(),
            m.first().copied().unwrap_or(0),
            m.last().copied().unwrap_or(0)
        )
    }
}
