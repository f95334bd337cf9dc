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
//! # Rejoins
//! A daemon that returns (rejoin, or a new rank joining a DVM started with room to grow) has a
//! new life that knows nothing of the collectives in flight, and its application may never
//! contribute to them. So a collective does not wait for a rank's own contribution in a later
//! life once the rank died or returned while the collective was in flight:
//! - every daemon that holds a collective when a repair restores a rank marks the rank
//!   *excused* in it, and sends its contribution again if it had sent it; contributions carry
//!   their excused ranks up (a rank merely listed as excluded from below is not excused: it
//!   may only be suspected there, and alive);
//! - a daemon that holds a collective with a living excused rank passes an `Excuse` down to
//!   every child it still waits for, each of which does the same, so the news reaches the
//!   returned daemon wherever it was learnt;
//! - an excused daemon without its own contribution sends its subtree's once complete, listing
//!   itself as excluded; if its application contributes later, it sends again (entries are
//!   idempotent), and the result includes it if that reaches rank 0 first.
//!
//! The rule as a caller sees it: *a collective waits for a rank that returned only if it started
//! after the return was known everywhere it was held.* Collectives started later include the
//! returned rank like any other.
//!
//! A new life also misses the broadcasts made before its admission, results included. So a
//! daemon answers a contribution for a collective it has finished with an `Outcome`: the result
//! from its bounded cache ([`ALLGATHER_RESULTS_CACHED_MAX`]), or "unknown". The receiver passes
//! the result on to the children it heard from. A daemon in its first life ignores "unknown"
//! (the broadcast reaches it); a returned one ends its collective with
//! [`AllgatherEvent::AllgatherLost`]. A late contribution from a returned daemon (its flag says
//! so) is answered whoever sent it (a daemon whose repair made this one its parent before this
//! one's did); one from a first life is not (the broadcast brings it the result). An `Excuse`
//! with no ranks is how a returned daemon asks the children it waits for, and a child that gets
//! the result only later (from below, or by the broadcast) then passes it up to the parent that
//! asked.
//!
//! # Bounds
//! [`ALLGATHER_INFLIGHT_MAX`] own contributions without a result (`TooMany`),
//! [`ALLGATHER_TRACKED_MAX`] collectives with state (contributions for more are dropped),
//! [`ALLGATHER_MAX_BYTES`] gathered per collective (the collective overflows: every daemon gets
//! a result with `overflowed` set), [`ALLGATHER_FINISHED_MEMORY`] finished ids remembered,
//! [`ALLGATHER_RESULTS_CACHED_MAX`] results kept ([`ALLGATHER_RESULTS_CACHED_BYTES`]),
//! [`ALLGATHER_QUEUED_MAX`] excuses and answers queued.
use super::Transmit;
use super::gathering::{ENTRY_OVERHEAD, Gathering};
use super::view::TreeView;
use super::wire::{AllgatherMsg, AllgatherResult, Contribution, WireError};
use crate::Rank;
use crate::limits::{
    ALLGATHER_FINISHED_MEMORY, ALLGATHER_INFLIGHT_MAX, ALLGATHER_MAX_BYTES, ALLGATHER_QUEUED_MAX,
    ALLGATHER_RESULTS_CACHED_BYTES, ALLGATHER_RESULTS_CACHED_MAX, ALLGATHER_TRACKED_MAX,
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
    /// A returned daemon only: collective `id`, which it contributed to, finished before its
    /// return, and no daemon it asked still has the result (see the module documentation).
    AllgatherLost { id: u64 },
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
    /// `Excuse` messages sent down.
    pub excuses_sent: u64,
    /// Late contributions answered with the result from the cache.
    pub answered_late: u64,
    /// Late contributions answered "unknown" (the result no longer cached).
    pub answered_lost: u64,
    /// Excuses or answers dropped at [`ALLGATHER_QUEUED_MAX`].
    pub answers_dropped: u64,
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
    /// Per child: (view digest, excused ranks) at the last `Excuse` sent to it.
    excuses_sent: BTreeMap<Rank, (u64, usize)>,
    /// The parent sent an `Excuse`: it waits for this daemon, and may have returned after
    /// the result's broadcast, so the result goes to it too once it arrives here.
    asked: bool,
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
    /// A returned daemon: finished ids its application had not contributed to (the result
    /// came first); a contribution to one gets the result from the cache.
    unclaimed: BTreeSet<u64>,
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
    /// Excuses and outcomes to send, oldest first ([`ALLGATHER_QUEUED_MAX`]).
    queued: VecDeque<Transmit<AllgatherMsg>>,
    /// Recent results, oldest first: (id, the result's encoding in the pieces it came in, its
    /// accounted bytes) ([`ALLGATHER_RESULTS_CACHED_MAX`], [`ALLGATHER_RESULTS_CACHED_BYTES`]).
    /// Kept as the broadcast's parts, slices of the frames that brought them, and decoded again
    /// only to answer a returned daemon: a decoded copy costs 40 bytes a rank, a reassembled
    /// one 13, on every daemon (quadratic in a simulated DVM, which holds every daemon and
    /// shares one copy of each frame among them).
    results: VecDeque<(u64, Vec<Bytes>, usize)>,
    results_bytes: usize,
    /// This daemon returned (rejoined or joined): broadcasts before its admission never reach
    /// it, so an "unknown" outcome ends its collective.
    returned: bool,
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
            unclaimed: BTreeSet::new(),
            local: 0,
            syncs: VecDeque::new(),
            synced: BTreeMap::new(),
            pending_syncs: VecDeque::new(),
            dirty: BTreeSet::new(),
            queued: VecDeque::new(),
            results: VecDeque::new(),
            results_bytes: 0,
            returned: false,
            events: VecDeque::new(),
            stats: AllgatherStats::default(),
        }
    }

    /// The core of a daemon that returned (rejoined, or joined a DVM started with room to
    /// grow) into the tree `routing` describes: see the module documentation, "Rejoins".
    pub fn rejoined(routing: &RoutingState) -> Self {
        Allgather {
            returned: true,
            ..Allgather::new(routing)
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
    /// collective; the result arrives as [`AllgatherEvent::AllgatherDone`]. On a daemon that
    /// returned, a contribution to a collective whose result already arrived here gets that
    /// result (or [`AllgatherEvent::AllgatherLost`] if no longer cached).
    ///
    /// Fails, recording nothing, with [`AllgatherError::AlreadyContributed`],
    /// [`AllgatherError::Finished`], [`AllgatherError::TooLarge`], [`AllgatherError::TooMany`]
    /// or [`AllgatherError::Dead`].
    pub fn contribute(&mut self, id: u64, data: Bytes) -> Result<(), AllgatherError> {
        if self.view.dead {
            return Err(AllgatherError::Dead);
        }
        if self.finished_set.contains(&id) {
            if !self.unclaimed.remove(&id) {
                return Err(AllgatherError::Finished);
            }
            // A returned daemon whose application learns of a collective after its result.
            self.events.push_back(match self.cached(id) {
                Some(result) => AllgatherEvent::AllgatherDone { result },
                None => AllgatherEvent::AllgatherLost { id },
            });
            return Ok(());
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
        // Sent already if this daemon was excused: send again, now with its entry.
        c.sent = None;
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
            AllgatherMsg::Excuse { id, ranks } => self.on_excuse(from, id, ranks),
            AllgatherMsg::Outcome { id, result } => self.on_outcome(from, id, result),
        }
    }

    /// The result of a collective, as delivered by xcast (the payload of
    /// [`AllgatherEvent::ResultReady`] at rank 0). Decodes it for this DVM's size and emits
    /// [`AllgatherEvent::AllgatherDone`]; fails with the decoding error, changing nothing.
    pub fn handle_result_bytes(&mut self, payload: Bytes) -> Result<(), WireError> {
        self.handle_result_parts(payload.clone(), vec![payload])
    }

    /// [`Allgather::handle_result_bytes`] for a result broadcast in parts: `payload` is the
    /// parts together, and `parts` the parts as they came (the cache keeps those, not a copy).
    pub fn handle_result_parts(
        &mut self,
        payload: Bytes,
        parts: Vec<Bytes>,
    ) -> Result<(), WireError> {
        let result = AllgatherResult::decode(self.view.size, payload)?;
        self.finish(result, Some(parts));
        Ok(())
    }

    /// The result of a collective (already decoded). Ends the collective here and emits
    /// [`AllgatherEvent::AllgatherDone`]; a second result for the same id is counted and
    /// ignored.
    pub fn handle_result(&mut self, result: AllgatherResult) {
        self.finish(result, None);
    }

    /// [`Allgather::handle_result`], given the result's encoding (in pieces) if it came as one.
    fn finish(&mut self, result: AllgatherResult, encoded: Option<Vec<Bytes>>) {
        if self.view.dead {
            return;
        }
        let id = result.id;
        if self.finished_set.contains(&id) {
            self.stats.duplicate_results += 1;
            return;
        }
        let c = self.collectives.remove(&id);
        if self.returned && !c.as_ref().is_some_and(|c| c.own) {
            self.unclaimed.insert(id);
        }
        if let Some(c) = c {
            if c.own {
                self.local = self.local.saturating_sub(1);
            }
            if c.asked {
                self.tell_parent(id, Some(result.clone()));
            }
        }
        self.dirty.remove(&id);
        self.remember_finished(id);
        self.cache(&result, encoded);
        self.events
            .push_back(AllgatherEvent::AllgatherDone { result });
    }

    /// Passes the outcome of `id` to the parent, which asked for it (`Excuse`).
    fn tell_parent(&mut self, id: u64, result: Option<AllgatherResult>) {
        if let Some(parent) = self.view.parent {
            push_bounded(
                &mut self.queued,
                &mut self.stats,
                Transmit {
                    to: parent,
                    msg: AllgatherMsg::Outcome { id, result },
                },
            );
        }
    }

    fn remember_finished(&mut self, id: u64) {
        if self.finished.len() >= ALLGATHER_FINISHED_MEMORY
            && let Some(old) = self.finished.pop_front()
        {
            self.finished_set.remove(&old);
            self.unclaimed.remove(&old);
        }
        self.finished.push_back(id);
        self.finished_set.insert(id);
    }

    /// Keeps `result` to answer late contributions (bounded, oldest dropped first).
    fn cache(&mut self, result: &AllgatherResult, encoded: Option<Vec<Bytes>>) {
        let bytes = result
            .contributions
            .iter()
            .map(|(_, b)| b.len().saturating_add(ENTRY_OVERHEAD))
            .sum::<usize>()
            .saturating_add(4 * result.excluded.len());
        if bytes > ALLGATHER_RESULTS_CACHED_BYTES {
            return;
        }
        while self.results.len() >= ALLGATHER_RESULTS_CACHED_MAX
            || self.results_bytes.saturating_add(bytes) > ALLGATHER_RESULTS_CACHED_BYTES
        {
            let Some((_, _, old)) = self.results.pop_front() else {
                break;
            };
            self.results_bytes = self.results_bytes.saturating_sub(old);
        }
        self.results_bytes = self.results_bytes.saturating_add(bytes);
        let encoded = encoded.unwrap_or_else(|| vec![result.encode()]);
        self.results.push_back((result.id, encoded, bytes));
    }

    /// The cached result of `id`, if still cached.
    fn cached(&self, id: u64) -> Option<AllgatherResult> {
        let (_, pieces, _) = self.results.iter().find(|(r, _, _)| *r == id)?;
        let encoded = match &pieces[..] {
            [one] => one.clone(),
            more => Bytes::from(more.concat()),
        };
        // It decoded once (or was encoded here): a failure now is a defect, not bad input.
        AllgatherResult::decode(self.view.size, encoded)
            .inspect_err(|e| log::error!("allgather {id}: the cached result does not decode: {e}"))
            .ok()
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
        if change.view_changed {
            // A digest recurs when a rank returns (the failed set is back to an earlier one):
            // a `Sync` sent under an earlier view of the same digest must not stop this view's
            // (seed 12098).
            self.synced.clear();
        }
        let view = &self.view;
        let digest = view.digest;
        let mut wanted: BTreeSet<Rank> = BTreeSet::new();
        for (&id, c) in self.collectives.iter_mut() {
            let back = status.restored.iter().copied();
            if c.data
                .follow_restores(back, &mut c.excuses_sent, view, &change)
            {
                c.sent = None;
            }
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
        if self.view.is_child(peer) {
            for (&id, c) in self.collectives.iter_mut() {
                if c.excuses_sent.remove(&peer).is_some() {
                    self.dirty.insert(id);
                }
            }
            if let Some(d) = self.synced.remove(&peer)
                && d == self.view.digest
            {
                self.queue_sync(peer);
            }
        }
    }

    /// The next message to send, or `None`. Drain it after every input (see [`super`]).
    pub fn poll_transmit(&mut self) -> Option<Transmit<AllgatherMsg>> {
        if self.view.dead {
            return None;
        }
        loop {
            if let Some(t) = self.queued.pop_front() {
                return Some(t);
            }
            while let Some((to, digest)) = self.syncs.pop_front() {
                if self.view.is_child(to) {
                    return Some(Transmit {
                        to,
                        msg: AllgatherMsg::Sync { digest },
                    });
                }
            }
            let id = self.dirty.pop_first()?;
            self.queue_excuses(id);
            if let Some(t) = self.contribution_due(id) {
                return Some(t);
            }
        }
    }

    /// Passes collective `id`'s living excused ranks down to every child it still waits for
    /// and has not told them under this view (a returned daemon: to every such child).
    fn queue_excuses(&mut self, id: u64) {
        let Some(c) = self.collectives.get_mut(&id) else {
            return;
        };
        let view = &self.view;
        let living = c.data.living_excused(view);
        // A returned daemon asks even with nobody to excuse: a child that finished the
        // collective before the return answers with the result this daemon never got.
        if living.is_empty() && !self.returned {
            return;
        }
        let mark = (view.digest, c.data.excused.len());
        for &child in &view.children {
            if c.complete.contains(&child) || c.excuses_sent.get(&child) == Some(&mark) {
                continue;
            }
            c.excuses_sent.insert(child, mark);
            log::trace!(
                "rank {}: allgather {id}: excuse {living:?} to {child}",
                view.me
            );
            self.stats.excuses_sent += 1;
            push_bounded(
                &mut self.queued,
                &mut self.stats,
                Transmit {
                    to: child,
                    msg: AllgatherMsg::Excuse {
                        id,
                        ranks: living.clone(),
                    },
                },
            );
        }
    }

    /// Collective `id`'s contribution to the parent, if it is due.
    fn contribution_due(&mut self, id: u64) -> Option<Transmit<AllgatherMsg>> {
        let parent = self.view.parent?;
        let me = self.view.me;
        let c = self.collectives.get_mut(&id)?;
        let ready = (c.own || c.data.excused.contains(&me))
            && c.sent.map(|(p, _)| p) != Some(parent)
            && self.view.children.iter().all(|r| c.complete.contains(r));
        if !ready {
            return None;
        }
        c.sent = Some((parent, self.view.digest));
        let mut excluded = c
            .data
            .excluded_list(self.view.failed.iter().copied(), |_| true);
        if !c.own && !excluded.contains(&me) {
            excluded.push(me);
            excluded.sort_unstable();
        }
        let msg = Contribution {
            id,
            digest: self.view.digest,
            overflowed: c.data.overflowed,
            entries: c.data.entry_list(),
            excluded,
            excused: c.data.excused.iter().copied().collect(),
            returned: self.returned,
        };
        self.stats.sent += 1;
        log::trace!(
            "rank {me}: allgather {id}: contribution to {parent} ({} entries, own {}, excused {:?})",
            msg.entries.len(),
            c.own,
            msg.excused
        );
        Some(Transmit {
            to: parent,
            msg: AllgatherMsg::Contribution(msg),
        })
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
            // A sender that returned may never get the broadcast; whoever it is (a child, or a
            // daemon whose repair made this one its parent first), it takes the answer from
            // its parent or a child only. A first life gets the broadcast: no answer.
            if msg.returned {
                self.answer_late(from, id);
            }
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
        // Not from `excluded`: a rank listed there may be only suspected below (a local repair
        // rank 0 never confirms) and alive (seed 20748). A sender that learns of a return
        // sends its contribution again with the rank excused.
        for r in msg.excused {
            c.data.add_excused(r);
        }
        c.data.merge(me, msg.overflowed, msg.entries, msg.excluded);
        c.data.hear(from, msg.digest);
        if c.data.check_overflow(&format_args!("allgather {id}")) {
            self.stats.overflowed += 1;
        }
        log::trace!(
            "rank {me}: allgather {id}: from {from} (child {is_child}, same view {same_view})"
        );
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

    /// The parent's word that collective `id` does not wait for `ranks` in their new lives.
    fn on_excuse(&mut self, from: Rank, id: u64, ranks: Vec<Rank>) {
        if Some(from) != self.view.parent {
            return;
        }
        if self.finished_set.contains(&id) {
            // The parent waits for a collective this daemon finished: it returned after the
            // result's broadcast.
            self.answer_late(from, id);
            return;
        }
        if !self.collectives.contains_key(&id) && self.collectives.len() >= ALLGATHER_TRACKED_MAX {
            self.stats.dropped_untracked += 1;
            log::warn!("allgather: too many collectives; dropped an excuse for {id}");
            return;
        }
        let c = self.collectives.entry(id).or_default();
        c.asked = true;
        let mut news = false;
        for r in ranks {
            news |= c.data.add_excused(r);
        }
        if news {
            self.dirty.insert(id);
        }
    }

    /// The answer of the parent to a contribution, or of a child to an excuse, for a
    /// collective it had finished.
    fn on_outcome(&mut self, from: Rank, id: u64, result: Option<AllgatherResult>) {
        log::trace!(
            "rank {}: allgather {id}: outcome from {from} (known {}, returned {}, tracked {})",
            self.view.me,
            result.is_some(),
            self.returned,
            self.collectives.contains_key(&id)
        );
        if (Some(from) != self.view.parent && !self.view.is_child(from))
            || self.finished_set.contains(&id)
        {
            return;
        }
        let Some(c) = self.collectives.get(&id) else {
            return;
        };
        if result.is_none() && !self.returned {
            // The broadcast brings it.
            return;
        }
        let own = c.own;
        let heard: Vec<Rank> = c
            .data
            .heard
            .keys()
            .copied()
            .filter(|r| self.view.is_child(*r))
            .collect();
        for child in heard {
            push_bounded(
                &mut self.queued,
                &mut self.stats,
                Transmit {
                    to: child,
                    msg: AllgatherMsg::Outcome {
                        id,
                        result: result.clone(),
                    },
                },
            );
        }
        match result {
            Some(result) => self.handle_result(result),
            None => {
                if self.collectives.remove(&id).is_some_and(|c| c.asked) {
                    self.tell_parent(id, None);
                }
                self.dirty.remove(&id);
                if own {
                    self.local = self.local.saturating_sub(1);
                    self.events.push_back(AllgatherEvent::AllgatherLost { id });
                } else {
                    self.unclaimed.insert(id);
                }
                self.remember_finished(id);
            }
        }
    }

    /// Answers `to`'s contribution or excuse for finished collective `id` from the cache.
    fn answer_late(&mut self, to: Rank, id: u64) {
        log::trace!("rank {}: allgather {id}: late from {to}", self.view.me);
        let result = self.cached(id);
        if result.is_some() {
            self.stats.answered_late += 1;
        } else {
            self.stats.answered_lost += 1;
        }
        push_bounded(
            &mut self.queued,
            &mut self.stats,
            Transmit {
                to,
                msg: AllgatherMsg::Outcome { id, result },
            },
        );
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
            log::trace!(
                "rank 0: allgather {id}: waiting (own {}, missing {:?})",
                c.own,
                self.view
                    .children
                    .iter()
                    .filter(|r| !c.complete.contains(r))
                    .collect::<Vec<_>>()
            );
            return;
        }
        c.result_emitted = true;
        // An overflowed result carries no data, but names the ranks that did not enter as
        // any result does: its entries kept their ranks (`Gathering`).
        let excluded: Vec<Rank> = (0..self.view.size)
            .filter(|r| !c.data.entries.contains_key(r))
            .collect();
        for r in &excluded {
            if !self.view.failed.contains(r) && !c.data.excused.contains(r) {
                log::error!("allgather {id}: rank {r} is living but did not contribute");
            }
        }
        let result = AllgatherResult {
            id,
            overflowed: c.data.overflowed,
            contributions: c.data.result_entries(),
            excluded,
        };
        self.events
            .push_back(AllgatherEvent::ResultReady { result });
    }
}

/// Queues `t`, dropping (and logging) the oldest at [`ALLGATHER_QUEUED_MAX`].
fn push_bounded(
    queued: &mut VecDeque<Transmit<AllgatherMsg>>,
    stats: &mut AllgatherStats,
    t: Transmit<AllgatherMsg>,
) {
    if queued.len() >= ALLGATHER_QUEUED_MAX
        && let Some(old) = queued.pop_front()
    {
        stats.answers_dropped += 1;
        log::warn!(
            "allgather: too many messages queued; dropped one to rank {}",
            old.to
        );
    }
    queued.push_back(t);
}
