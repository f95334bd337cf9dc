//! Fault-tolerant broadcast (PRRTE's xcast), sans-IO: one [`Xcast`] per daemon.
//!
//! # The protocol
//! - **Request.** A daemon other than rank 0 that calls [`Xcast::originate`] gets a request id
//!   (from 1) and emits `Request{originator, request, tag, payload}` to rank 0; the driver
//!   carries it reliably and in order. Rank 0 numbers requests as they arrive: operation ids
//!   are strictly increasing from 1, with no gaps. Its own `originate` is numbered at once.
//! - **Down the tree.** An operation travels as `Op` from parent to child. A daemon accepts an
//!   `Op` only from its current parent (others are counted and ignored), forwards it to every
//!   current child, then delivers it ([`XcastEvent::Deliver`]). Delivery is in operation-id
//!   order, exactly once: ids below the next expected one are duplicates, ids above it are held
//!   until the gap is filled.
//! - **Acknowledgements.** `Ack{upto, digest}` to the parent means "I and my whole subtree, in
//!   the tree of view `digest`, delivered every operation up to `upto`". A daemon's level is the
//!   smaller of what it delivered itself and the lowest level its current children acked under
//!   its own view; it sends it when it rises, and again under each new view.
//! - **Completion.** When rank 0's level reaches `k`, the whole living tree has operation `k`.
//!   For an operation rank 0 originated it emits [`XcastEvent::Completed`]; otherwise it sends
//!   `Done{request, op}` to the originator (dropped if the originator has failed), which emits
//!   `Completed` (a `Done` for an unknown request is counted and ignored).
//! - **Retention.** A daemon keeps every operation it holds until it has delivered it and every
//!   current child has acked it (subtree-wide); rank 0 keeps an operation until it completes.
//! - **Parts (pipelining).** Rank 0 numbers a payload larger than `XcastLimits::part_bytes` as
//!   consecutive operations, one per part (at most `XcastLimits::parts`). Everything above
//!   treats a part as an operation: each daemon forwards each part as it arrives, so a relay
//!   sends part `i` to its children while part `i + 1` is still on its way to it, and a large
//!   broadcast takes about the time of one level plus a part per further level, instead of a
//!   whole payload per level (PRRTE stores and forwards). A daemon delivers the payload whole
//!   ([`XcastEvent::Deliver`] names the first and last part) once every part is here, so its
//!   level, acks and completion move a whole broadcast at a time; the originator's `Done`
//!   names the last part. A link that breaks mid-broadcast loses nothing the repair rules do
//!   not already cover: the parts are operations, re-sent by link sessions or asked for again
//!   with `Resume` from the first one missing.
//!
//! # Repairs
//! [`Xcast::handle_repair`] takes each [`RecoveryStatus`]. A child that is gone no longer holds
//! anything up (its level stops counting). A *new* child (see [`super`], "Faults") starts
//! unsynchronised: its parent sends it `Sync{digest}` and nothing else until the child answers
//! `Resume{from, digest}` (the lowest operation its subtree still needs that it does not hold)
//! plus a fresh `Ack`; then the parent replays every operation from `from` on, in order. Both
//! sides must be in the same view: the child answers an offer only once the sender is its
//! parent and its digest is the offer's (offers are remembered until then,
//! [`GRPCOMM_PENDING_SYNCS_MAX`]); the parent opens the session only with an answer under its
//! own digest, and offers `Sync` again, under its new view, to every child still unsynchronised
//! after each repair. (An answer given under an older view could predate a change of parent at
//! the child, during which it ignored this parent's operations.) Within a session any
//! `Resume` restarts the child's stream from `from`.
//!
//! A parent that lacks part of what a child asks for (a promoted daemon whose new children are
//! behind it, or a daemon that dropped operations at its bound) asks its own parent with
//! `Resume` from the lowest operation it lacks, receives them again (not delivering them
//! twice), and forwards them.
//!
//! # Why retention "until every current child acked" is enough
//! An op a daemon discarded was acked by each of its children at that time, under its view:
//! each child's whole subtree had it. Ranks adopted later come from those subtrees (a dead
//! child's heir and its heir's children were below the dead child when it acked), so they have
//! it too; a kept child's subtree only shrinks. The one case where a new parent lacks what a
//! new child needs is the promoted daemon (it may be ahead of its new children and have
//! discarded operations they miss): it fetches from its own parent, whose retention covers the
//! dead daemon it replaced (that daemon never acked what its children missed). At the top,
//! rank 0 keeps everything not yet completed, and completion is exact: an `Ack` is counted only
//! under the receiver's own view, new children count as zero until they ack, and a kept child's
//! subtree only shrinks, so rank 0's level `k` means every rank living in its view delivered
//! `k`. Hence whatever a living daemon lacks is still held by rank 0 and reaches it through the
//! fetch chain, and no daemon skips an operation.
//!
//! # Bounds
//! [`XCAST_INFLIGHT_MAX`] and [`XCAST_INFLIGHT_MAX_BYTES`] at rank 0: requests beyond the
//! window are held, in arrival order, and numbered as completions make room (back-pressure:
//! the originator's own bound, [`XCAST_ORIGINATE_MAX`], then refuses its caller locally, with
//! no round trip). [`XCAST_HELD_MAX`] and [`XCAST_HELD_MAX_BYTES`] bound what rank 0 holds:
//! the driver stops accepting requests (RELM replays them later) when [`Xcast::hold_room`] is
//! exhausted, and rank 0's own broadcasts are refused `Busy`. [`XCAST_RETAINED_MAX`] and [`XCAST_RETAINED_MAX_BYTES`] at every daemon (drop the
//! highest operation and re-request it later), [`XCAST_ORIGINATE_MAX`] outstanding requests per
//! originator, [`XCAST_REFUSALS_MAX`] queued refusals at rank 0. Delivery is pulled by
//! `poll_event`: an application that does not poll holds operations in the retained store and
//! so pushes back on its parent and, through acknowledgements, on rank 0.
use super::Transmit;
use super::view::TreeView;
use super::wire::{Op, Request, XcastMsg};
use crate::Rank;
use crate::limits::{
    GRPCOMM_PENDING_SYNCS_MAX, XCAST_HELD_MAX, XCAST_HELD_MAX_BYTES, XCAST_INFLIGHT_MAX,
    XCAST_INFLIGHT_MAX_BYTES, XCAST_ORIGINATE_MAX, XCAST_PART_BYTES_DEFAULT, XCAST_PARTS_MAX,
    XCAST_REFUSALS_MAX, XCAST_RETAINED_MAX, XCAST_RETAINED_MAX_BYTES,
};
use crate::rml::Tag;
use crate::routed::{RecoveryStatus, RoutingState};
use bytes::{BufMut, Bytes, BytesMut};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

#[cfg(test)]
pub(crate) mod tests;

/// What a daemon's broadcast core tells its application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XcastEvent {
    /// Operations `first` to `op` (one broadcast: its parts, or `first == op` for an unsplit
    /// payload) are delivered here (once per daemon, in `op` order). Its children have
    /// already been handed them (if the driver sends transmits before polling events).
    Deliver {
        first: u64,
        op: u64,
        originator: Rank,
        tag: Tag,
        payload: Bytes,
        /// A broadcast split in parts: those parts, slices of the frames that brought them
        /// (shared with every other daemon's copy in a simulation), for a caller that keeps
        /// the broadcast long; `payload` is a copy of them together. Empty for an unsplit
        /// broadcast (`payload` is its one part).
        parts: Vec<Bytes>,
    },
    /// This daemon's request `request` became operation `op` (its last part, if split), and
    /// every daemon living in rank 0's view has delivered it.
    Completed { request: u64, op: u64 },
    /// Rank 0 refused this daemon's request `request` (too many operations in flight, or the
    /// payload is too large). Nothing was broadcast; the caller may try again.
    Refused { request: u64 },
}

/// Why [`Xcast::originate`] refused a broadcast. Nothing was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XcastError {
    /// Rank 0 only: it holds [`XCAST_HELD_MAX`] requests (or their bytes) beyond its window.
    /// Retry after a completion.
    Busy,
    /// The payload is larger than the largest one (`XcastLimits::payload`, by default
    /// [`XCAST_INFLIGHT_MAX_BYTES`]).
    TooLarge { len: usize, max: usize },
    /// [`XCAST_ORIGINATE_MAX`] requests of this daemon are outstanding. Retry after a
    /// completion or refusal.
    TooManyOutstanding,
    /// This daemon was declared failed; it takes part in no more broadcasts.
    Dead,
}

impl std::fmt::Display for XcastError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            XcastError::Busy => write!(f, "broadcast refused: rank 0 holds too many"),
            XcastError::TooLarge { len, max } => {
                write!(f, "broadcast payload of {len} bytes is above {max}")
            }
            XcastError::TooManyOutstanding => {
                write!(f, "broadcast refused: too many requests outstanding")
            }
            XcastError::Dead => write!(f, "this daemon was declared failed"),
        }
    }
}

impl std::error::Error for XcastError {}

/// Counters of one broadcast core (for logs and tests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct XcastStats {
    /// Operations delivered here.
    pub delivered: u64,
    /// `Op` messages sent to children, replays included.
    pub forwarded: u64,
    /// `Op` messages ignored because the sender is not this daemon's parent.
    pub not_from_parent: u64,
    /// `Op` messages already held, delivered or not needed.
    pub duplicates: u64,
    /// Operations dropped at [`XCAST_RETAINED_MAX`] (to be fetched again).
    pub dropped_full: u64,
    /// `Resume` messages sent to the parent.
    pub resumes_sent: u64,
    /// Messages ignored as stale: acks, resumes or syncs from a rank that is not a neighbour
    /// in this view, `Done`/`Refused` for an unknown request or not from rank 0, requests not
    /// addressed to rank 0 or naming another originator.
    pub stale: u64,
    /// Acks received under another view (kept, counted if this daemon reaches that view).
    pub acks_other_view: u64,
    /// Rank 0: requests refused (too large).
    pub refused: u64,
    /// Rank 0: requests that waited for room in the window.
    pub held: u64,
    /// Rank 0: refusals dropped at [`XCAST_REFUSALS_MAX`].
    pub refusals_dropped: u64,
    /// Rank 0: requests dropped as duplicates (request id not above the last one seen from that
    /// originator).
    pub duplicate_requests: u64,
    /// Rank 0: broadcasts split into parts (pipelined).
    pub split: u64,
    /// Parts that did not form a broadcast (a part out of its place, or parts that disagree):
    /// skipped undelivered and logged. A correct rank 0 never sends them.
    pub broken_parts: u64,
}

/// The bounds one core enforces. [`Default`] takes them from [`crate::limits`], where each is
/// documented with what happens when it is reached; smaller values are for tests that want to
/// reach them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XcastLimits {
    /// [`XCAST_INFLIGHT_MAX`].
    pub inflight: usize,
    /// [`XCAST_INFLIGHT_MAX_BYTES`].
    pub inflight_bytes: usize,
    /// The largest payload: [`XCAST_INFLIGHT_MAX_BYTES`] by default; the driver lowers it to
    /// what fits in a frame. At most `inflight_bytes` (lowered to it).
    pub payload: usize,
    /// [`XCAST_RETAINED_MAX`].
    pub retained: usize,
    /// [`XCAST_RETAINED_MAX_BYTES`]; must be at least `inflight_bytes`.
    pub retained_bytes: usize,
    /// [`XCAST_ORIGINATE_MAX`].
    pub originate: usize,
    /// [`XCAST_REFUSALS_MAX`].
    pub refusals: usize,
    /// [`XCAST_HELD_MAX`].
    pub held: usize,
    /// [`XCAST_HELD_MAX_BYTES`]; raised to `payload` so that the largest payload can wait.
    pub held_bytes: usize,
    /// Rank 0 splits a payload larger than this into parts ([`XCAST_PART_BYTES_DEFAULT`],
    /// setting `bcast_part_bytes`); 0 never splits. Only rank 0's value matters.
    pub part_bytes: usize,
    /// [`XCAST_PARTS_MAX`]; lowered to `retained`, so that every part of one broadcast can be
    /// held at once.
    pub parts: usize,
}

impl Default for XcastLimits {
    fn default() -> Self {
        XcastLimits {
            inflight: XCAST_INFLIGHT_MAX,
            inflight_bytes: XCAST_INFLIGHT_MAX_BYTES,
            payload: XCAST_INFLIGHT_MAX_BYTES,
            retained: XCAST_RETAINED_MAX,
            retained_bytes: XCAST_RETAINED_MAX_BYTES,
            originate: XCAST_ORIGINATE_MAX,
            refusals: XCAST_REFUSALS_MAX,
            held: XCAST_HELD_MAX,
            held_bytes: XCAST_HELD_MAX_BYTES,
            part_bytes: XCAST_PART_BYTES_DEFAULT,
            parts: XCAST_PARTS_MAX,
        }
    }
}

/// A child as its parent sees it.
#[derive(Debug, Clone)]
struct Child {
    rank: Rank,
    /// The next operation to send it; `None` until it answered `Sync` with `Resume`.
    cursor: Option<u64>,
    /// Its level, counted under this daemon's view: its whole subtree delivered up to here.
    acked: u64,
    /// The latest `Ack` received from it, whatever its view (counted if this daemon reaches it).
    last_ack: Option<(u64, u64)>,
    /// Where its latest `Resume` asked the stream to start (1 for a child synchronised from the
    /// start): it holds every operation below this.
    resumed_from: u64,
}

impl Child {
    fn synced(rank: Rank) -> Self {
        Child {
            rank,
            cursor: Some(1),
            acked: 0,
            last_ack: None,
            resumed_from: 1,
        }
    }

    fn new_unsynced(rank: Rank) -> Self {
        Child {
            rank,
            cursor: None,
            acked: 0,
            last_ack: None,
            resumed_from: 1,
        }
    }
}

/// This daemon as its parent's child.
#[derive(Debug, Clone)]
struct Upstream {
    /// The parent knows where this daemon stands (it answered the parent's `Sync`, or the tree
    /// is the initial one).
    synced: bool,
    /// Answer a `Sync` with `Resume` at the next poll.
    resume_now: bool,
    /// The parent will send every operation from here on (that this daemon has not acked);
    /// `None` after a loss: ask again when there is room.
    requested: Option<u64>,
    /// A `Resume{from}` was sent and the replay (starting with `from`) has not arrived yet.
    awaiting: Option<u64>,
    /// The last `Ack` sent: (level, view digest).
    ack_sent: Option<(u64, u64)>,
}

impl Upstream {
    fn initial() -> Self {
        Upstream {
            synced: true,
            resume_now: false,
            requested: Some(1),
            awaiting: None,
            ack_sent: None,
        }
    }
}

/// One daemon's broadcast core. See the module documentation for the protocol and
/// [`super`] for the poll order the driver must follow.
#[derive(Debug, Clone)]
pub struct Xcast {
    limits: XcastLimits,
    view: TreeView,
    /// Operations held: ahead of delivery, or delivered and kept for children.
    store: BTreeMap<u64, Op>,
    store_bytes: usize,
    /// The next operation to deliver here.
    next_expected: u64,
    /// Current children, ascending by rank.
    children: Vec<Child>,
    /// Where the next `poll_transmit` starts looking for an operation to forward.
    pump_at: usize,
    /// Children still to be sent `Sync`.
    sync_due: VecDeque<Rank>,
    /// `Sync` offers (sender, digest) not answered yet: the sender was not this daemon's
    /// parent, or its view was not this daemon's, when they arrived.
    pending_syncs: VecDeque<(Rank, u64)>,
    up: Upstream,
    /// Something changed that may call for a `Resume` (saves recomputing it on every poll).
    check_resume: bool,
    next_request: u64,
    /// This daemon's requests awaiting `Done` or `Refused` (not rank 0).
    outstanding: BTreeSet<u64>,
    requests: VecDeque<Request>,
    events: VecDeque<XcastEvent>,
    /// Rank 0: the next operation id.
    next_op: u64,
    /// Rank 0: every operation up to here is complete.
    completed: u64,
    /// Rank 0: the last request id seen per originator.
    last_request: BTreeMap<Rank, u64>,
    /// Rank 0: (originator, request, op) completion notices to send.
    dones: VecDeque<(Rank, u64, u64)>,
    /// Rank 0: (originator, request) refusals to send.
    refusals: VecDeque<(Rank, u64)>,
    /// Rank 0: requests (its own included) waiting for room in the window, in arrival order.
    held: VecDeque<Request>,
    /// Rank 0: payload bytes of `held`.
    held_bytes: usize,
    /// Rank 0: how many of `held` are its own (kept to its share, as every originator's are).
    held_own: usize,
    stats: XcastStats,
}

/// What [`Xcast::gather`] found at the next operation to deliver.
enum Gathered {
    /// A whole broadcast, as the event to deliver, and how many operations (parts) it took.
    Whole(XcastEvent, u64),
    /// A part that cannot be delivered (why): skip it.
    Broken(&'static str),
}

/// An originator's bound on outstanding requests: `originate`, but no more than its share of
/// what rank 0 can hold (`held` over the DVM's `size`, at least 1). Rank 0 keeps its own held
/// broadcasts to the same share (refused `Busy` beyond it). With every daemon within its share
/// rank 0's held queue cannot overflow by count, so it never has to leave a request
/// unacknowledged in RELM. That refusal is correct but slow: the originator replays only after
/// its retransmission timeout (seconds, doubling), and its later requests wait behind the
/// refused one. Under overload, with 64 daemons at 256 requests each, rank 0 refused over
/// 65,000 and sat mostly idle between replays. The bytes bound can still refuse (large
/// payloads); that path stays correct.
pub fn originate_share(originate: usize, held: usize, size: u32) -> usize {
    let size = usize::try_from(size).unwrap_or(usize::MAX).max(1);
    originate.min(held / size).max(1)
}

impl Xcast {
    /// The core of daemon `routing.me()`, in the tree `routing` describes.
    ///
    /// Every daemon must create its core before any daemon originates a broadcast, from
    /// routing states that agree (normally the failure-free tree at start-up): the initial
    /// parent/child links are taken as synchronised at operation 1. The core copies what it
    /// needs; afterwards feed it every repair with [`Xcast::handle_repair`].
    pub fn new(routing: &RoutingState) -> Self {
        Xcast::with_limits(routing, XcastLimits::default())
    }

    /// [`Xcast::new`] with other bounds (every daemon should use the same). A
    /// `retained_bytes` below `inflight_bytes` is raised to it, and every bound to at least 1,
    /// so that the largest payload always fits.
    pub fn with_limits(routing: &RoutingState, limits: XcastLimits) -> Self {
        let payload = limits.payload.min(limits.inflight_bytes);
        let limits = XcastLimits {
            inflight: limits.inflight.max(1),
            inflight_bytes: limits.inflight_bytes,
            payload,
            retained: limits.retained.max(1),
            retained_bytes: limits.retained_bytes.max(limits.inflight_bytes),
            originate: originate_share(limits.originate, limits.held, routing.size()),
            refusals: limits.refusals,
            held: limits.held.max(1),
            held_bytes: limits.held_bytes.max(payload),
            part_bytes: limits.part_bytes,
            parts: limits
                .parts
                .clamp(1, XCAST_PARTS_MAX)
                .min(limits.retained.max(1)),
        };
        let view = TreeView::new(routing);
        let children = view.children.iter().map(|&r| Child::synced(r)).collect();
        Xcast {
            limits,
            view,
            store: BTreeMap::new(),
            store_bytes: 0,
            next_expected: 1,
            children,
            pump_at: 0,
            sync_due: VecDeque::new(),
            pending_syncs: VecDeque::new(),
            up: Upstream::initial(),
            check_resume: false,
            next_request: 1,
            outstanding: BTreeSet::new(),
            requests: VecDeque::new(),
            events: VecDeque::new(),
            next_op: 1,
            completed: 0,
            last_request: BTreeMap::new(),
            dones: VecDeque::new(),
            refusals: VecDeque::new(),
            held: VecDeque::new(),
            held_bytes: 0,
            held_own: 0,
            stats: XcastStats::default(),
        }
    }

    /// The core of a daemon restarted under its rank and admitted back by rank 0 (issue
    /// "Rejoin"), in the tree `routing` describes (the failures rank 0's welcome listed).
    /// Broadcast operation `admitted` announced its return: it delivers the operations after
    /// it and none before (they belong to its previous life). Its parent and children do not
    /// know where it stands: it waits for its parent's `Sync` and offers `Sync` to every child,
    /// as a daemon does after a repair that gave it a new parent and new children.
    ///
    /// Why retention still covers every child: its children come from the subtree of the rank
    /// that held its slot, which acknowledged what it discarded; it asks its parent again for
    /// what its children lack below `admitted` and forwards it without delivering it.
    pub fn rejoined(routing: &RoutingState, limits: XcastLimits, admitted: u64) -> Self {
        let mut x = Xcast::with_limits(routing, limits);
        x.next_expected = admitted.saturating_add(1);
        x.children = x
            .view
            .children
            .iter()
            .map(|&r| Child::new_unsynced(r))
            .collect();
        x.sync_due = x.view.children.iter().copied().collect();
        x.up = Upstream {
            synced: x.view.parent.is_none(),
            resume_now: false,
            requested: None,
            awaiting: None,
            ack_sent: None,
        };
        x.check_resume = true;
        x
    }

    /// Rank 0: the id the next operation it numbers will get.
    pub fn next_op(&self) -> u64 {
        self.next_op
    }

    /// This daemon's rank.
    pub fn me(&self) -> Rank {
        self.view.me
    }

    /// The counters.
    pub fn stats(&self) -> &XcastStats {
        &self.stats
    }

    /// The next operation id this daemon will deliver (1 + how many it delivered).
    pub fn next_expected(&self) -> u64 {
        self.next_expected
    }

    /// Operations held (ahead of delivery or kept for children).
    pub fn retained(&self) -> usize {
        self.store.len()
    }

    /// This daemon's requests awaiting completion or refusal (always 0 on rank 0).
    /// Where this core stands, for a log line (the simulator's liveness failures): the next
    /// operation, completions, what it holds (op, part, parts), its children and its upstream.
    pub fn describe(&self) -> String {
        let store: Vec<(u64, u32, u32)> = self
            .store
            .iter()
            .map(|(k, o)| (*k, o.part, o.parts))
            .collect();
        format!(
            "next_expected {} completed {} next_op {} store {store:?} children {:?} up {:?} \
             pending_syncs {:?} sync_due {:?}",
            self.next_expected,
            self.completed,
            self.next_op,
            self.children,
            self.up,
            self.pending_syncs,
            self.sync_due
        )
    }
    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    /// Rank 0: requests held until the window has room.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Rank 0: how many more requests, and payload bytes, it can hold beyond the window. A
    /// driver that carries requests reliably takes a request only if it fits (else the sender
    /// replays it later): that is what bounds rank 0's memory when originators outrun the
    /// tree. (0, 0) on other ranks.
    pub fn hold_room(&self) -> (usize, usize) {
        if self.view.me != 0 || self.view.dead {
            return (0, 0);
        }
        (
            self.limits.held.saturating_sub(self.held.len()),
            self.limits.held_bytes.saturating_sub(self.held_bytes),
        )
    }

    /// Rank 0: every operation up to this id has completed.
    pub fn completed(&self) -> u64 {
        self.completed
    }

    /// Broadcast `payload` with `tag` to every living daemon (this one included). Returns the
    /// request id that [`XcastEvent::Completed`] or [`XcastEvent::Refused`] will name.
    ///
    /// On rank 0 the operation is numbered at once if the window has room, else held behind
    /// the requests already waiting; elsewhere a `Request` to rank 0 is queued (poll notices).
    /// Fails, sending nothing, with [`XcastError::TooLarge`], [`XcastError::TooManyOutstanding`]
    /// (not rank 0), [`XcastError::Busy`] (rank 0, holding all it may) or [`XcastError::Dead`].
    pub fn originate(&mut self, tag: Tag, payload: Bytes) -> Result<u64, XcastError> {
        if self.view.dead {
            return Err(XcastError::Dead);
        }
        let request = self.next_request;
        if self.view.me == 0 {
            self.check_len(&payload)?;
            let (count, bytes) = self.hold_room();
            // Rank 0 keeps to its share too, or its own broadcasts could take the room the
            // others' requests count on.
            if count == 0 || bytes < payload.len() || self.held_own >= self.limits.originate {
                return Err(XcastError::Busy);
            }
            self.hold(Request {
                originator: 0,
                request,
                tag,
                payload,
            });
        } else {
            self.check_len(&payload)?;
            if self.outstanding.len() >= self.limits.originate {
                return Err(XcastError::TooManyOutstanding);
            }
            self.outstanding.insert(request);
            self.requests.push_back(Request {
                originator: self.view.me,
                request,
                tag,
                payload,
            });
        }
        self.next_request = request.saturating_add(1);
        Ok(request)
    }

    /// Rank 0 only: [`Xcast::originate`] past the window ([`XCAST_INFLIGHT_MAX`] and its
    /// bytes). For the runtime's own notices whose delay would stall the window itself: a
    /// fault confirmation (a daemon's acknowledgement counts only under its parent's view, so
    /// completions wait until every daemon has rank 0's failed set, which the confirmation
    /// brings: deferring it behind a full window would never let the window drain). The caller
    /// bounds how many it makes (the driver: one per confirmation of new deaths, so at most one
    /// per rank in a DVM's life, and one shutdown). Fails with [`XcastError::TooLarge`] or
    /// [`XcastError::Dead`]; on another rank this is [`Xcast::originate`].
    pub fn originate_urgent(&mut self, tag: Tag, payload: Bytes) -> Result<u64, XcastError> {
        if self.view.me != 0 {
            return self.originate(tag, payload);
        }
        if self.view.dead {
            return Err(XcastError::Dead);
        }
        let request = self.next_request;
        self.assign(0, request, tag, payload, true)?;
        self.next_request = request.saturating_add(1);
        Ok(request)
    }

    /// A message from daemon `from` (the frame's origin rank, as authenticated by the
    /// transport). Messages that do not fit this daemon's view are counted and ignored.
    pub fn handle_msg(&mut self, from: Rank, msg: XcastMsg) {
        if self.view.dead {
            return;
        }
        match msg {
            XcastMsg::Request(request) => self.on_request(from, request),
            XcastMsg::Op(op) => {
                if Some(from) == self.view.parent {
                    self.on_op(op);
                } else {
                    self.stats.not_from_parent += 1;
                }
            }
            XcastMsg::Ack { upto, digest } => {
                let view = self.view.digest;
                match self.child_mut(from) {
                    Some(child) => {
                        child.last_ack = Some((upto, digest));
                        if digest == view {
                            child.acked = child.acked.max(upto);
                        } else {
                            self.stats.acks_other_view += 1;
                        }
                    }
                    None => self.stats.stale += 1,
                }
            }
            XcastMsg::Sync { digest } => {
                if Some(from) == self.view.parent && digest == self.view.digest {
                    self.answer_sync();
                } else {
                    self.remember_sync(from, digest);
                }
            }
            XcastMsg::Resume { from: next, digest } => {
                let view = self.view.digest;
                match self.child_mut(from) {
                    // In a running session any Resume restarts the stream (safe: the child
                    // drops duplicates). A session opens only with an answer under this
                    // daemon's view: an answer to an older offer could predate a change of
                    // parent at the child.
                    Some(child) if child.cursor.is_some() || digest == view => {
                        child.cursor = Some(next);
                        child.resumed_from = next;
                    }
                    _ => self.stats.stale += 1,
                }
            }
            XcastMsg::Done { request, op } => {
                if from == 0 && self.outstanding.remove(&request) {
                    self.events.push_back(XcastEvent::Completed { request, op });
                } else {
                    self.stats.stale += 1;
                }
            }
            XcastMsg::Refused { request } => {
                if from == 0 && self.outstanding.remove(&request) {
                    self.events.push_back(XcastEvent::Refused { request });
                } else {
                    self.stats.stale += 1;
                }
            }
        }
        self.check_resume = true;
        self.settle();
    }

    /// Follow a repair of this daemon's routing state. Call it with every status
    /// `RoutingState::fail` returns, in order (a missed one leaves this daemon's view digest
    /// behind everyone else's, and its acks are never counted).
    ///
    /// Children that are gone stop counting; new children are offered `Sync`; a new parent is
    /// told at once where this daemon stands (an unasked `Resume`, which a parent already
    /// streaming to it restarts from and a parent behind ignores), and its `Sync` is answered
    /// when it comes. If this daemon itself is among the failed, the core drops its
    /// state and ignores everything from then on. Rank 0 drops completion notices for failed
    /// originators.
    pub fn handle_repair(&mut self, status: &RecoveryStatus) {
        let change = self.view.apply(status);
        if change.died {
            log::warn!("xcast: this daemon ({}) was declared failed", self.view.me);
            self.drop_all();
            return;
        }
        if self.view.dead {
            return;
        }
        let old = std::mem::take(&mut self.children);
        let digest = self.view.digest;
        for &rank in &self.view.children {
            let kept = old.iter().find(|c| c.rank == rank);
            let child = match kept {
                Some(c) if !change.new_children.contains(&rank) => {
                    let mut c = c.clone();
                    // An ack sent under the view this daemon has just reached counts now.
                    if let Some((upto, d)) = c.last_ack
                        && d == digest
                    {
                        c.acked = c.acked.max(upto);
                    }
                    c
                }
                _ => Child::new_unsynced(rank),
            };
            // New children, and children that have not answered an earlier offer, are
            // offered `Sync` under the new view.
            if child.cursor.is_none() && !self.sync_due.contains(&rank) {
                self.sync_due.push_back(rank);
            }
            self.children.push(child);
        }
        let view = &self.view;
        self.sync_due.retain(|r| view.is_child(*r));
        self.pending_syncs.retain(|(r, _)| !view.failed.contains(r));
        self.pump_at = 0;
        if change.new_upstream {
            // The new parent sends nothing until this daemon answers its `Sync`; but this
            // daemon says where it stands at once (an unasked `Resume` under its new view). A
            // parent that already streams to it (it was this daemon's parent before a
            // passing view, in which it took the operations this daemon dropped as not its
            // parent's: seed 35 of `all` with link sessions) restarts the stream there; one
            // whose view matches opens the session; one behind ignores it and offers `Sync`
            // once it catches up, as before.
            self.up.synced = true;
            self.up.resume_now = true;
            self.up.requested = None;
            self.up.awaiting = None;
        }
        if change.view_changed {
            // Re-state this daemon's level under the new view.
            self.up.ack_sent = None;
        }
        if let Some(parent) = self.view.parent
            && let Some(at) = self
                .pending_syncs
                .iter()
                .position(|&(r, d)| r == parent && d == digest)
        {
            self.pending_syncs.remove(at);
            self.answer_sync();
        }
        if self.view.me == 0 {
            let failed = &self.view.failed;
            self.dones.retain(|(r, _, _)| !failed.contains(r));
            self.refusals.retain(|(r, _)| !failed.contains(r));
            self.last_request.retain(|r, _| !failed.contains(r));
            self.held.retain(|q| !failed.contains(&q.originator));
            self.held_bytes = self.held.iter().map(|q| q.payload.len()).sum();
            self.held_own = self.held.iter().filter(|q| q.originator == 0).count();
        }
        self.check_resume = true;
        self.settle();
    }

    /// The link with neighbour `peer` may have lost messages although `peer` lives: the
    /// connection was re-established, or the driver dropped messages for `peer` at a full
    /// queue. Re-states what `peer` may have missed; the duplicates this causes are dropped.
    ///
    /// Towards the parent: the level (`Ack`) and, once synchronised, `Resume` from the lowest
    /// operation still needed (lost operations come again). Towards a child: `Sync` again if it
    /// has not answered, else its stream restarts after its level. The driver calls it on both
    /// ends of a re-established connection; after a drop, on the dropping end.
    pub fn handle_link_up(&mut self, peer: Rank) {
        if self.view.dead {
            return;
        }
        if Some(peer) == self.view.parent {
            self.up.ack_sent = None;
            if self.up.synced {
                self.up.resume_now = true;
            }
        }
        if let Some(child) = self.child_mut(peer) {
            match child.cursor {
                // Resend what may have been lost on the old connection: everything after what
                // it acknowledged, but nothing below where its session started (it holds that;
                // its acks may not have counted yet, under another view, and asking upstream
                // for operations long released would stall this daemon's stream).
                Some(_) => {
                    child.cursor = Some(child.acked.saturating_add(1).max(child.resumed_from))
                }
                None => {
                    if !self.sync_due.contains(&peer) {
                        self.sync_due.push_back(peer);
                    }
                }
            }
        }
        self.check_resume = true;
    }

    /// The next request, completion notice or refusal to carry reliably and in order (the
    /// driver's RELM), or `None`. A driver whose reliable window is full leaves them here:
    /// rank 0's notices count against its window ([`XCAST_INFLIGHT_MAX`]), so waiting ones
    /// push back on what it accepts.
    pub fn poll_notice(&mut self) -> Option<Transmit<XcastMsg>> {
        if self.view.dead {
            return None;
        }
        if let Some(request) = self.requests.pop_front() {
            return Some(Transmit {
                to: 0,
                msg: XcastMsg::Request(request),
            });
        }
        if let Some((to, request, op)) = self.dones.pop_front() {
            // A notice out of the window is room for a held request.
            self.admit_held();
            return Some(Transmit {
                to,
                msg: XcastMsg::Done { request, op },
            });
        }
        if let Some((to, request)) = self.refusals.pop_front() {
            return Some(Transmit {
                to,
                msg: XcastMsg::Refused { request },
            });
        }
        None
    }

    /// The next tree message (`Op`, `Ack`, `Sync`, `Resume`) to send, or `None`. Drain it
    /// after every input (see [`super`]).
    pub fn poll_transmit(&mut self) -> Option<Transmit<XcastMsg>> {
        if self.view.dead {
            return None;
        }
        if let Some(t) = self.poll_upstream() {
            return Some(t);
        }
        while let Some(to) = self.sync_due.pop_front() {
            if self.view.is_child(to) {
                return Some(Transmit {
                    to,
                    msg: XcastMsg::Sync {
                        digest: self.view.digest,
                    },
                });
            }
        }
        self.pump()
    }

    /// The next event, or `None`. Drain it after draining transmits, then drain transmits
    /// again (a delivery can make an `Ack` ready).
    pub fn poll_event(&mut self) -> Option<XcastEvent> {
        if self.view.dead {
            return None;
        }
        if let Some(event) = self.events.pop_front() {
            return Some(event);
        }
        // Each turn delivers a broadcast or skips one broken part: at most one turn per
        // operation held.
        for _ in 0..=self.store.len() {
            let first = self.next_expected;
            let (event, count) = match self.gather(first)? {
                Gathered::Whole(event, count) => (Some(event), count),
                Gathered::Broken(why) => {
                    self.stats.broken_parts += 1;
                    log::error!("xcast: operation {first} skipped undelivered: {why}");
                    (None, 1)
                }
            };
            self.next_expected = first.saturating_add(count);
            self.check_resume = true;
            self.settle();
            if let Some(event) = event {
                self.stats.delivered += 1;
                return Some(event);
            }
        }
        None
    }

    /// The broadcast starting at operation `first`, if every part of it is held.
    fn gather(&self, first: u64) -> Option<Gathered> {
        let head = self.store.get(&first)?;
        let deliver = |op: u64, payload: Bytes, parts: Vec<Bytes>| XcastEvent::Deliver {
            first,
            op,
            originator: head.originator,
            tag: head.tag,
            payload,
            parts,
        };
        if head.parts <= 1 {
            let whole = deliver(first, head.payload.clone(), Vec::new());
            return Some(Gathered::Whole(whole, 1));
        }
        if head.part != 0 {
            return Some(Gathered::Broken(
                "a part without the start of its broadcast",
            ));
        }
        let count = u64::from(head.parts);
        let last = first.saturating_add(count.saturating_sub(1));
        let parts: Vec<&Op> = self.store.range(first..=last).map(|(_, op)| op).collect();
        // A part still missing leaves a gap: wait for it, but judge those here already.
        for op in &parts {
            let same = u64::from(op.part) == op.id.saturating_sub(first)
                && op.parts == head.parts
                && (op.originator, op.request, op.tag) == (head.originator, head.request, head.tag);
            if !same {
                return Some(Gathered::Broken("parts that do not form one broadcast"));
            }
        }
        if parts.len() as u64 != count {
            return None;
        }
        let len = parts.iter().map(|op| op.payload.len()).sum();
        let mut payload = BytesMut::with_capacity(len);
        for op in &parts {
            payload.put_slice(&op.payload);
        }
        let kept = parts.iter().map(|op| op.payload.clone()).collect();
        Some(Gathered::Whole(
            deliver(last, payload.freeze(), kept),
            count,
        ))
    }

    // ----- inputs --------------------------------------------------------------------------

    fn on_request(&mut self, from: Rank, request: Request) {
        if self.view.me != 0 || request.originator != from || self.view.failed.contains(&from) {
            self.stats.stale += 1;
            return;
        }
        let last = self.last_request.get(&from).copied().unwrap_or(0);
        if request.request <= last {
            self.stats.duplicate_requests += 1;
            return;
        }
        self.last_request.insert(from, request.request);
        let id = request.request;
        if let Err(e) = self.check_len(&request.payload) {
            self.stats.refused += 1;
            log::debug!("xcast: refused request {id} of rank {from}: {e}");
            if self.refusals.len() >= self.limits.refusals {
                self.stats.refusals_dropped += 1;
                log::warn!("xcast: refusal queue full; dropped the refusal of {from}/{id}");
            } else {
                self.refusals.push_back((from, id));
            }
            return;
        }
        // The driver took it only if it fits (`hold_room`); a driver that did not check is
        // still served (the bound is the driver's contract, not a reason to lose a request).
        self.hold(request);
    }

    /// Rank 0: queues a request behind those waiting and numbers what the window has room for.
    fn hold(&mut self, request: Request) {
        self.held_bytes = self.held_bytes.saturating_add(request.payload.len());
        if request.originator == 0 {
            self.held_own += 1;
        }
        self.held.push_back(request);
        self.admit_held();
        if !self.held.is_empty() {
            self.stats.held += 1;
        }
    }

    /// Rank 0: numbers held requests, in order, while the window has room.
    fn admit_held(&mut self) {
        while let Some(front) = self.held.front() {
            if !self.window_fits(front.payload.len()) {
                return;
            }
            let Some(r) = self.held.pop_front() else {
                return;
            };
            self.held_bytes = self.held_bytes.saturating_sub(r.payload.len());
            if r.originator == 0 {
                self.held_own = self.held_own.saturating_sub(1);
            }
            if let Err(e) = self.assign(r.originator, r.request, r.tag, r.payload, false) {
                // Only an exhausted operation id space: nothing more can be numbered.
                log::error!(
                    "xcast: cannot number request {}/{}: {e}",
                    r.originator,
                    r.request
                );
            }
        }
    }

    /// Rank 0: whether a broadcast of `len` payload bytes (all its parts) fits in the window
    /// now. One split into more parts than the window takes fits an empty window.
    fn window_fits(&self, len: usize) -> bool {
        let (parts, _) = self.split(len);
        let in_flight = self.store.len().saturating_add(self.dones.len());
        (in_flight == 0 || in_flight.saturating_add(parts) <= self.limits.inflight)
            && self.store_bytes.saturating_add(len) <= self.limits.inflight_bytes
    }

    /// Rank 0: how it numbers a payload of `len` bytes: (parts, bytes in each part but the
    /// last). Parts of `part_bytes`, or larger so that there are at most `parts` of them.
    fn split(&self, len: usize) -> (usize, usize) {
        let part = self.limits.part_bytes;
        if part == 0 || len <= part {
            return (1, len);
        }
        let size = part.max(len.div_ceil(self.limits.parts.max(1)));
        (len.div_ceil(size), size)
    }

    /// Rank 0: number a broadcast and hold it until it completes (`urgent`: past the window,
    /// and never split). Returns its last operation id.
    fn assign(
        &mut self,
        originator: Rank,
        request: u64,
        tag: Tag,
        payload: Bytes,
        urgent: bool,
    ) -> Result<u64, XcastError> {
        self.check_len(&payload)?;
        if !urgent && !self.window_fits(payload.len()) {
            return Err(XcastError::Busy);
        }
        let len = payload.len();
        // The runtime's notices stay whole: callers (rejoin, leave) name them by the id
        // `next_op` gave before numbering, and one is small.
        let (parts, size) = if urgent { (1, len) } else { self.split(len) };
        let first = self.next_op;
        let count = u64::try_from(parts).map_err(|_| XcastError::Busy)?;
        self.next_op = first.checked_add(count).ok_or(XcastError::Busy)?;
        self.store_bytes = self.store_bytes.saturating_add(len);
        if parts == 1 {
            self.store
                .insert(first, Op::whole(first, originator, request, tag, payload));
            return Ok(first);
        }
        self.stats.split += 1;
        let parts_u32 = u32::try_from(parts).map_err(|_| XcastError::Busy)?;
        for part in 0..parts_u32 {
            // `part * size < len`: there are `len / size` parts, rounded up.
            let start = (part as usize).saturating_mul(size);
            let end = start.saturating_add(size).min(len);
            let id = first.saturating_add(u64::from(part));
            self.store.insert(
                id,
                Op {
                    id,
                    originator,
                    request,
                    tag,
                    part,
                    parts: parts_u32,
                    payload: payload.slice(start..end),
                },
            );
        }
        Ok(first.saturating_add(count.saturating_sub(1)))
    }

    fn on_op(&mut self, op: Op) {
        let id = op.id;
        // Track the parent's stream (see `Upstream::requested`).
        match self.up.awaiting {
            Some(w) if id == w => {
                self.up.awaiting = None;
                if self.up.requested.is_some() {
                    self.up.requested = Some(id.saturating_add(1));
                }
            }
            Some(_) => {}
            None => {
                if let Some(r) = self.up.requested
                    && id >= r
                {
                    self.up.requested = Some(id.saturating_add(1));
                }
            }
        }
        let needed = id >= self.next_expected || self.children.iter().any(|c| c.acked < id);
        if !needed || self.store.contains_key(&id) {
            self.stats.duplicates += 1;
            return;
        }
        self.insert_bounded(op);
    }

    /// Hold `op`, within [`XCAST_RETAINED_MAX`] and [`XCAST_RETAINED_MAX_BYTES`]: at the bound
    /// drop the highest operation (this one if it is the highest) and note the loss.
    fn insert_bounded(&mut self, op: Op) {
        let len = op.payload.len();
        while self.store.len() >= self.limits.retained
            || self.store_bytes.saturating_add(len) > self.limits.retained_bytes
        {
            self.stats.dropped_full += 1;
            self.up.requested = None;
            match self.store.last_key_value() {
                Some((&top, _)) if top > op.id => {
                    if let Some(old) = self.store.remove(&top) {
                        self.store_bytes = self.store_bytes.saturating_sub(old.payload.len());
                    }
                }
                _ => {
                    log::debug!("xcast: retained store full; dropped operation {}", op.id);
                    return;
                }
            }
        }
        self.store_bytes = self.store_bytes.saturating_add(len);
        self.store.insert(op.id, op);
    }

    fn answer_sync(&mut self) {
        self.up.synced = true;
        self.up.resume_now = true;
        self.up.ack_sent = None;
        self.check_resume = true;
    }

    fn remember_sync(&mut self, from: Rank, digest: u64) {
        self.pending_syncs.retain(|(r, _)| *r != from);
        if self.pending_syncs.len() >= GRPCOMM_PENDING_SYNCS_MAX
            && let Some((old, _)) = self.pending_syncs.pop_front()
        {
            log::warn!("xcast: forgot the Sync offer of rank {old} (too many pending)");
        }
        self.pending_syncs.push_back((from, digest));
    }

    fn child_mut(&mut self, rank: Rank) -> Option<&mut Child> {
        self.children.iter_mut().find(|c| c.rank == rank)
    }

    fn drop_all(&mut self) {
        self.store.clear();
        self.store_bytes = 0;
        self.children.clear();
        self.sync_due.clear();
        self.pending_syncs.clear();
        self.requests.clear();
        self.outstanding.clear();
        self.events.clear();
        self.dones.clear();
        self.refusals.clear();
        self.held.clear();
        self.held_bytes = 0;
        self.held_own = 0;
    }

    // ----- state -----------------------------------------------------------------------------

    /// This daemon's level: it delivered everything up to here, and so did every current
    /// child's whole subtree (counted under this daemon's view).
    fn level(&self) -> u64 {
        let delivered = self.next_expected.saturating_sub(1);
        self.children
            .iter()
            .map(|c| c.acked)
            .fold(delivered, u64::min)
    }

    /// Complete (rank 0) and discard what every current child has acked.
    fn settle(&mut self) {
        let level = self.level();
        if self.view.me == 0 {
            while self.completed < level {
                let id = self.completed.saturating_add(1);
                self.completed = id;
                let Some(op) = self.store.get(&id) else {
                    log::error!("xcast: completed operation {id} is not held");
                    continue;
                };
                // A split broadcast completes with its last part.
                if !op.is_last() {
                    continue;
                }
                if op.originator == 0 {
                    self.events.push_back(XcastEvent::Completed {
                        request: op.request,
                        op: id,
                    });
                } else if !self.view.failed.contains(&op.originator) {
                    self.dones.push_back((op.originator, op.request, id));
                }
            }
        }

        if self
            .store
            .first_key_value()
            .is_some_and(|(&first, _)| first <= level)
        {
            let keep = self.store.split_off(&level.saturating_add(1));
            let gone = std::mem::replace(&mut self.store, keep);
            let freed: usize = gone.values().map(|op| op.payload.len()).sum();
            self.store_bytes = self.store_bytes.saturating_sub(freed);
            // Room may have appeared for a re-request.
            self.check_resume = true;
        }
        // Completions and the trim made room: number what waits, in arrival order.
        if self.view.me == 0 {
            self.admit_held();
        }
    }

    /// The lowest operation that this daemon or a synchronised child needs and this daemon
    /// does not hold.
    fn want_from(&self) -> u64 {
        let low = self
            .children
            .iter()
            .filter_map(|c| c.cursor.map(|cur| cur.max(c.acked.saturating_add(1))))
            .fold(self.next_expected, u64::min);
        let mut want = low;
        for &id in self.store.range(low..).map(|(id, _)| id) {
            if id != want {
                break;
            }
            want = want.saturating_add(1);
        }
        want
    }

    /// Whether operation `id` would be kept if it arrived now: there is room, or a higher
    /// operation would make way for it.
    fn has_room_for(&self, id: u64) -> bool {
        (self.store.len() < self.limits.retained && self.store_bytes < self.limits.retained_bytes)
            || self
                .store
                .last_key_value()
                .is_some_and(|(&top, _)| top > id)
    }

    /// `Resume` or `Ack` to the parent, if one is due.
    fn poll_upstream(&mut self) -> Option<Transmit<XcastMsg>> {
        let parent = self.view.parent?;
        if self.up.synced && (self.up.resume_now || self.check_resume) {
            let from = self.want_from();
            let due = self.up.resume_now
                || (self.has_room_for(from) && self.up.requested.is_none_or(|r| from < r));
            if due {
                self.up.resume_now = false;
                self.up.requested = Some(from);
                self.up.awaiting = Some(from);
                self.stats.resumes_sent += 1;
                return Some(Transmit {
                    to: parent,
                    msg: XcastMsg::Resume {
                        from,
                        digest: self.view.digest,
                    },
                });
            }
            self.check_resume = false;
        }
        let level = self.level();
        let digest = self.view.digest;
        let due = match self.up.ack_sent {
            None => level > 0,
            Some((sent, d)) => d != digest || level > sent,
        };
        if due {
            self.up.ack_sent = Some((level, digest));
            return Some(Transmit {
                to: parent,
                msg: XcastMsg::Ack {
                    upto: level,
                    digest,
                },
            });
        }
        None
    }

    fn check_len(&self, payload: &Bytes) -> Result<(), XcastError> {
        if payload.len() > self.limits.payload {
            return Err(XcastError::TooLarge {
                len: payload.len(),
                max: self.limits.payload,
            });
        }
        Ok(())
    }

    /// The next operation for a synchronised child, in order from its cursor, taking the
    /// children in turn.
    fn pump(&mut self) -> Option<Transmit<XcastMsg>> {
        let n = self.children.len();
        for step in 0..n {
            let at = (self.pump_at + step) % n;
            let Some(child) = self.children.get_mut(at) else {
                continue;
            };
            let Some(cursor) = child.cursor else {
                continue;
            };
            let next = cursor.max(child.acked.saturating_add(1));
            if let Some(op) = self.store.get(&next) {
                child.cursor = Some(next.saturating_add(1));
                // The next child goes next: each part reaches every child before the next
                // part goes to any, so that all of them start forwarding early (a child
                // served last would otherwise wait for every other child's whole payload).
                self.pump_at = (at + 1) % n;
                self.stats.forwarded += 1;
                return Some(Transmit {
                    to: child.rank,
                    msg: XcastMsg::Op(op.clone()),
                });
            }
        }
        None
    }
}
