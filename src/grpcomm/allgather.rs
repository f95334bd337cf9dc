//! Fault-tolerant allgather and barrier, sans-IO: one [`Allgather`] per daemon.
//!
//! # The protocol
//! - Several collectives may be in flight at once, each keyed by a caller-chosen `u64` id that
//!   every daemon uses for the same collective and that is never reused.
//! - Every living daemon calls [`Allgather::contribute`] (or [`Allgather::barrier`], an empty
//!   contribution). A daemon sends its parent a `Contribution` (its subtree's entries, rank ->
//!   bytes, plus the failed ranks it knows that have no entry) once it has its own contribution
//!   and a complete one from every current child. A contribution is *complete* for its receiver
//!   when the sender is a current child and it was made under the receiver's view digest (see
//!   [`super`]): it then covers the sender's whole subtree as the receiver sees it.
//! - Rank 0, complete, builds the [`AllgatherResult`]: every entry ordered by rank, and as
//!   excluded every rank without an entry (each of them failed before its contribution reached
//!   the tree). It emits [`AllgatherEvent::ResultReady`]; the driver broadcasts
//!   `result.encode()` with xcast, and every daemon (rank 0 too) hands the delivered payload to
//!   [`Allgather::handle_result_bytes`], which emits [`AllgatherEvent::AllgatherDone`].
//! - Entries are idempotent: the first bytes seen for a rank are kept, later copies ignored.
//!
//! # Repairs
//! A dead child no longer holds anything up: its living ranks are adopted by its heir, which
//! (its parent having changed) re-sends its retained subtree contribution to the new parent
//! once it has its own new children's. A daemon keeps its contribution state until the result
//! arrives, and re-sends it whenever its parent changes or it is promoted. A kept child's
//! complete contribution stays complete (its subtree only shrinks). A contribution from a
//! current child made under another view is merged but not counted; the parent answers it with
//! `Sync{digest}`, and the child re-sends its finished contributions once it reaches that view
//! (remembering the offer until then, [`GRPCOMM_PENDING_SYNCS_MAX`]).
//!
//! # Bounds
//! [`ALLGATHER_INFLIGHT_MAX`] own contributions without a result (`TooMany`),
//! [`ALLGATHER_TRACKED_MAX`] collectives with state (contributions for more are dropped),
//! [`ALLGATHER_MAX_BYTES`] gathered per collective (the collective overflows: every daemon gets
//! a result with `overflowed` set), [`ALLGATHER_FINISHED_MEMORY`] finished ids remembered.
use super::Transmit;
use super::gathering::{ENTRY_OVERHEAD, Gathering};
use super::view::TreeView;
use super::wire::{AllgatherMsg, AllgatherResult, Contribution, WireError};
use crate::Rank;
use crate::limits::{
    ALLGATHER_FINISHED_MEMORY, ALLGATHER_INFLIGHT_MAX, ALLGATHER_MAX_BYTES, ALLGATHER_TRACKED_MAX,
    GRPCOMM_PENDING_SYNCS_MAX,
};
use crate::routed::{RecoveryStatus, RoutingState};
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

#[cfg(test)]
mod tests;

/// What a daemon's allgather core tells its application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllgatherEvent {
    /// Rank 0 only: the collective is complete. The driver must broadcast `result.encode()`
    /// with xcast; every daemon then passes the delivered payload to
    /// [`Allgather::handle_result_bytes`].
    ResultReady { result: AllgatherResult },
    /// The result of collective `result.id` arrived here: the collective is over for this
    /// daemon (for a barrier: every living daemon has entered it).
    AllgatherDone { result: AllgatherResult },
}

/// Why [`Allgather::contribute`] refused. Nothing was recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllgatherError {
    /// This daemon already contributed to this collective.
    AlreadyContributed,
    /// The collective's result has already arrived here (ids must not be reused).
    Finished,
    /// The contribution alone exceeds [`ALLGATHER_MAX_BYTES`] (with its 8 bytes of overhead).
    TooLarge { len: usize, max: usize },
    /// [`ALLGATHER_INFLIGHT_MAX`] (or [`ALLGATHER_TRACKED_MAX`]) collectives are in flight
    /// here; retry after a result.
    TooMany,
    /// This daemon was declared failed.
    Dead,
}

impl std::fmt::Display for AllgatherError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AllgatherError::AlreadyContributed => write!(f, "already contributed"),
            AllgatherError::Finished => write!(f, "this collective has already finished"),
            AllgatherError::TooLarge { len, max } => {
                write!(f, "contribution of {len} bytes is above {max}")
            }
            AllgatherError::TooMany => write!(f, "too many collectives in flight"),
            AllgatherError::Dead => write!(f, "this daemon was declared failed"),
        }
    }
}

impl std::error::Error for AllgatherError {}

/// Counters of one allgather core.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllgatherStats {
    /// Contributions sent to the parent (re-sends included).
    pub sent: u64,
    /// Contributions received.
    pub received: u64,
    /// Contributions received under another view (merged, not counted).
    pub other_view: u64,
    /// Contributions for a collective already finished here.
    pub late: u64,
    /// Contributions for a new collective dropped at [`ALLGATHER_TRACKED_MAX`].
    pub dropped_untracked: u64,
    /// Collectives that overflowed [`ALLGATHER_MAX_BYTES`] here.
    pub overflowed: u64,
    /// Results for a collective already finished here.
    pub duplicate_results: u64,
}

/// One collective at one daemon.
#[derive(Debug, Clone, Default)]
struct Collective {
    /// This daemon contributed.
    own: bool,
    data: Gathering,
    /// Current children whose contribution covers their subtree in this daemon's view.
    complete: BTreeSet<Rank>,
    /// (parent, digest) of the last send.
    sent: Option<(Rank, u64)>,
    /// Rank 0: the result has been emitted.
    result_emitted: bool,
}

/// One daemon's allgather core. See the module documentation for the protocol and
/// [`super`] for the poll order the driver must follow.
#[derive(Debug, Clone)]
pub struct Allgather {
    view: TreeView,
    collectives: BTreeMap<u64, Collective>,
    /// Finished ids, oldest first, and the same as a set.
    finished: VecDeque<u64>,
    finished_set: BTreeSet<u64>,
    /// Collectives this daemon contributed to and has no result for.
    local: usize,
    /// `Sync` to send: (child, digest).
    syncs: VecDeque<(Rank, u64)>,
    /// The digest of the last `Sync` sent to each child.
    synced: BTreeMap<Rank, u64>,
    /// `Sync` offers not answered yet: (sender, digest).
    pending_syncs: VecDeque<(Rank, u64)>,
    /// Collectives whose contribution may be due to the parent.
    dirty: BTreeSet<u64>,
    events: VecDeque<AllgatherEvent>,
    stats: AllgatherStats,
}

impl Allgather {
    /// The core of daemon `routing.me()`, in the tree `routing` describes. Afterwards feed it
    /// every repair with [`Allgather::handle_repair`].
    pub fn new(routing: &RoutingState) -> Self {
        Allgather {
            view: TreeView::new(routing),
            collectives: BTreeMap::new(),
            finished: VecDeque::new(),
            finished_set: BTreeSet::new(),
            local: 0,
            syncs: VecDeque::new(),
            synced: BTreeMap::new(),
            pending_syncs: VecDeque::new(),
            dirty: BTreeSet::new(),
            events: VecDeque::new(),
            stats: AllgatherStats::default(),
        }
    }

    /// The counters.
    pub fn stats(&self) -> &AllgatherStats {
        &self.stats
    }

    /// Collectives this daemon keeps state for.
    pub fn tracked(&self) -> usize {
        self.collectives.len()
    }

    /// Contribute `data` to collective `id`. Every living daemon must contribute once to every
    /// collective; the result arrives as [`AllgatherEvent::AllgatherDone`].
    ///
    /// Fails, recording nothing, with [`AllgatherError::AlreadyContributed`],
    /// [`AllgatherError::Finished`], [`AllgatherError::TooLarge`], [`AllgatherError::TooMany`]
    /// or [`AllgatherError::Dead`].
    pub fn contribute(&mut self, id: u64, data: Bytes) -> Result<(), AllgatherError> {
        if self.view.dead {
            return Err(AllgatherError::Dead);
        }
        if self.finished_set.contains(&id) {
            return Err(AllgatherError::Finished);
        }
        if data.len().saturating_add(ENTRY_OVERHEAD) > ALLGATHER_MAX_BYTES {
            return Err(AllgatherError::TooLarge {
                len: data.len(),
                max: ALLGATHER_MAX_BYTES - ENTRY_OVERHEAD,
            });
        }
        match self.collectives.get(&id) {
            Some(c) if c.own => return Err(AllgatherError::AlreadyContributed),
            Some(_) => {}
            None if self.collectives.len() >= ALLGATHER_TRACKED_MAX => {
                return Err(AllgatherError::TooMany);
            }
            None => {}
        }
        if self.local >= ALLGATHER_INFLIGHT_MAX {
            return Err(AllgatherError::TooMany);
        }
        let me = self.view.me;
        let c = self.collectives.entry(id).or_default();
        c.own = true;
        c.data.add_entry(me, data);
        if c.data.check_overflow(&format_args!("allgather {id}")) {
            self.stats.overflowed += 1;
        }
        self.local += 1;
        self.dirty.insert(id);
        self.check_root(id);
        Ok(())
    }

    /// A barrier: an allgather of empty contributions. Its completion is the
    /// [`AllgatherEvent::AllgatherDone`] for `id`.
    pub fn barrier(&mut self, id: u64) -> Result<(), AllgatherError> {
        self.contribute(id, Bytes::new())
    }

    /// A message from daemon `from`.
    pub fn handle_msg(&mut self, from: Rank, msg: AllgatherMsg) {
        if self.view.dead {
            return;
        }
        match msg {
            AllgatherMsg::Contribution(c) => self.on_contribution(from, c),
            AllgatherMsg::Sync { digest } => {
                if Some(from) == self.view.parent && digest == self.view.digest {
                    self.answer_sync(digest);
                } else {
                    self.remember_sync(from, digest);
                }
            }
        }
    }

    /// The result of a collective, as delivered by xcast (the payload of
    /// [`AllgatherEvent::ResultReady`] at rank 0). Decodes it for this DVM's size and emits
    /// [`AllgatherEvent::AllgatherDone`]; fails with the decoding error, changing nothing.
    pub fn handle_result_bytes(&mut self, payload: Bytes) -> Result<(), WireError> {
        let result = AllgatherResult::decode(self.view.size, payload)?;
        self.handle_result(result);
        Ok(())
    }

    /// The result of a collective (already decoded). Ends the collective here and emits
    /// [`AllgatherEvent::AllgatherDone`]; a second result for the same id is counted and
    /// ignored.
    pub fn handle_result(&mut self, result: AllgatherResult) {
        if self.view.dead {
            return;
        }
        let id = result.id;
        if self.finished_set.contains(&id) {
            self.stats.duplicate_results += 1;
            return;
        }
        if let Some(c) = self.collectives.remove(&id)
            && c.own
        {
            self.local = self.local.saturating_sub(1);
        }
        self.dirty.remove(&id);
        if self.finished.len() >= ALLGATHER_FINISHED_MEMORY
            && let Some(old) = self.finished.pop_front()
        {
            self.finished_set.remove(&old);
        }
        self.finished.push_back(id);
        self.finished_set.insert(id);
        self.events
            .push_back(AllgatherEvent::AllgatherDone { result });
    }

    /// Follow a repair of this daemon's routing state (every status, in order).
    ///
    /// Gone children stop counting, new children must contribute again under the new view, and
    /// a daemon whose parent changed (or that was promoted) re-sends its finished
    /// contributions. If this daemon itself failed, the core drops its state.
    pub fn handle_repair(&mut self, status: &RecoveryStatus) {
        let change = self.view.apply(status);
        if change.died {
            log::warn!(
                "allgather: this daemon ({}) was declared failed",
                self.view.me
            );
            self.collectives.clear();
            self.syncs.clear();
            self.pending_syncs.clear();
            self.dirty.clear();
            self.events.clear();
            self.local = 0;
            return;
        }
        if self.view.dead {
            return;
        }
        let view = &self.view;
        let digest = view.digest;
        let mut wanted: BTreeSet<Rank> = BTreeSet::new();
        for (&id, c) in self.collectives.iter_mut() {
            c.data
                .follow_repair(&mut c.complete, view, &change.new_children, &mut wanted);
            if change.new_upstream {
                c.sent = None;
            }
            self.dirty.insert(id);
        }
        for child in wanted {
            self.queue_sync(child);
        }
        let view = &self.view;
        self.synced.retain(|r, _| view.is_child(*r));
        self.syncs.retain(|(r, _)| view.is_child(*r));
        self.pending_syncs.retain(|(r, _)| !view.failed.contains(r));
        if let Some(parent) = self.view.parent
            && let Some(at) = self
                .pending_syncs
                .iter()
                .position(|&(r, d)| r == parent && d == digest)
        {
            self.pending_syncs.remove(at);
            self.answer_sync(digest);
        }
        let ids: Vec<u64> = self.collectives.keys().copied().collect();
        for id in ids {
            self.check_root(id);
        }
    }

    /// The link with neighbour `peer` may have lost messages although `peer` lives (a
    /// re-established connection, or messages the driver dropped at a full queue): towards the
    /// parent, every contribution is sent again (entries are idempotent); towards a child, a
    /// `Sync` sent under the current view is offered again.
    pub fn handle_link_up(&mut self, peer: Rank) {
        if self.view.dead {
            return;
        }
        if Some(peer) == self.view.parent {
            for (&id, c) in self.collectives.iter_mut() {
                if c.sent.is_some_and(|(p, _)| p == peer) {
                    c.sent = None;
                    self.dirty.insert(id);
                }
            }
        }
        if self.view.is_child(peer)
            && let Some(d) = self.synced.remove(&peer)
            && d == self.view.digest
        {
            self.queue_sync(peer);
        }
    }

    /// The next message to send, or `None`. Drain it after every input (see [`super`]).
    pub fn poll_transmit(&mut self) -> Option<Transmit<AllgatherMsg>> {
        if self.view.dead {
            return None;
        }
        while let Some((to, digest)) = self.syncs.pop_front() {
            if self.view.is_child(to) {
                return Some(Transmit {
                    to,
                    msg: AllgatherMsg::Sync { digest },
                });
            }
        }
        let parent = self.view.parent?;
        while let Some(id) = self.dirty.pop_first() {
            let Some(c) = self.collectives.get_mut(&id) else {
                continue;
            };
            let ready = c.own
                && c.sent.map(|(p, _)| p) != Some(parent)
                && self.view.children.iter().all(|r| c.complete.contains(r));
            if !ready {
                continue;
            }
            c.sent = Some((parent, self.view.digest));
            let msg = Contribution {
                id,
                digest: self.view.digest,
                overflowed: c.data.overflowed,
                entries: c.data.entry_list(),
                excluded: c
                    .data
                    .excluded_list(self.view.failed.iter().copied(), |_| true),
            };
            self.stats.sent += 1;
            return Some(Transmit {
                to: parent,
                msg: AllgatherMsg::Contribution(msg),
            });
        }
        None
    }

    /// The next event, or `None`.
    pub fn poll_event(&mut self) -> Option<AllgatherEvent> {
        if self.view.dead {
            return None;
        }
        self.events.pop_front()
    }

    // ----- internals -------------------------------------------------------------------------

    fn on_contribution(&mut self, from: Rank, msg: Contribution) {
        let id = msg.id;
        self.stats.received += 1;
        if self.finished_set.contains(&id) {
            self.stats.late += 1;
            return;
        }
        if !self.collectives.contains_key(&id) && self.collectives.len() >= ALLGATHER_TRACKED_MAX {
            self.stats.dropped_untracked += 1;
            log::warn!("allgather: too many collectives; dropped a contribution to {id}");
            return;
        }
        let me = self.view.me;
        let is_child = self.view.is_child(from);
        let same_view = msg.digest == self.view.digest;
        let c = self.collectives.entry(id).or_default();
        c.data.merge(me, msg.overflowed, msg.entries, msg.excluded);
        c.data.hear(from, msg.digest);
        if c.data.check_overflow(&format_args!("allgather {id}")) {
            self.stats.overflowed += 1;
        }
        let mut want_sync = false;
        if is_child {
            if same_view {
                c.complete.insert(from);
            } else if !c.complete.contains(&from) {
                want_sync = true;
            }
        }
        if !same_view {
            self.stats.other_view += 1;
        }
        if want_sync {
            self.queue_sync(from);
        }
        self.dirty.insert(id);
        self.check_root(id);
    }

    /// Ask `child` to re-send under this daemon's view (once per view).
    fn queue_sync(&mut self, child: Rank) {
        let digest = self.view.digest;
        if self.synced.get(&child) != Some(&digest) {
            self.synced.insert(child, digest);
            self.syncs.push_back((child, digest));
        }
    }

    /// Re-send every contribution not yet sent to the parent under `digest`.
    fn answer_sync(&mut self, digest: u64) {
        let parent = self.view.parent;
        for (&id, c) in self.collectives.iter_mut() {
            if parent.is_some_and(|p| c.sent != Some((p, digest))) {
                c.sent = None;
                self.dirty.insert(id);
            }
        }
    }

    fn remember_sync(&mut self, from: Rank, digest: u64) {
        self.pending_syncs.retain(|(r, _)| *r != from);
        if self.pending_syncs.len() >= GRPCOMM_PENDING_SYNCS_MAX
            && let Some((old, _)) = self.pending_syncs.pop_front()
        {
            log::warn!("allgather: forgot the Sync offer of rank {old} (too many pending)");
        }
        self.pending_syncs.push_back((from, digest));
    }

    /// Rank 0: emit the result once the collective is complete.
    fn check_root(&mut self, id: u64) {
        if self.view.me != 0 {
            return;
        }
        let Some(c) = self.collectives.get_mut(&id) else {
            return;
        };
        if !c.own || c.result_emitted || !self.view.children.iter().all(|r| c.complete.contains(r))
        {
            return;
        }
        c.result_emitted = true;
        let result = if c.data.overflowed {
            AllgatherResult {
                id,
                overflowed: true,
                ..AllgatherResult::default()
            }
        } else {
            let excluded: Vec<Rank> = (0..self.view.size)
                .filter(|r| !c.data.entries.contains_key(r))
                .collect();
            for r in &excluded {
                if !self.view.failed.contains(r) {
                    log::error!("allgather {id}: rank {r} is living but did not contribute");
                }
            }
            AllgatherResult {
                id,
                overflowed: false,
                contributions: c.data.entry_list(),
                excluded,
            }
        };
        self.events
            .push_back(AllgatherEvent::ResultReady { result });
    }
}
