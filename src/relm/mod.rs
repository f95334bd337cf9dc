//! RELM: reliable messaging. A reliable message is delivered to its destination's receive
//! matching exactly once and in order per (origin, destination), even while daemons on its
//! path die and the tree is rebuilt; its completion fires once the destination has posted it,
//! or fails with node-down if the destination died first.
//!
//! Sans-IO, like the rest of the protocol cores: the driver (or the simulator) feeds frames,
//! repairs and time in through `handle_*` and drains what to send with [`Relm::poll_transmit`],
//! completions with [`Relm::poll_event`], and its next deadline with [`Relm::poll_timeout`].
//! Poll order after any input: transmits, then events, then the timeout.
//!
//! * `uid.rs` — message identity and wrap-aware order.
//! * `engine.rs` — the generic engine: states, transitions, the bounded message table.
//! * `steady.rs` — the protocol rules in steady state: send, data, ack, request, timers.
//! * `link.rs` — the rules after a repair: purge, link updates, depth stamps, gating.
//! * `wire.rs` — the frame layouts.
//! * `batch.rs` — batch frames: one chain's small messages for one neighbour in one frame.
//!
//! # The protocol (PRRTE's, see `docs/relm.md`)
//! Each origin numbers its messages with one wrapping 32-bit uid counter and chains the
//! messages for one destination (each carries its predecessor's uid). The destination posts a
//! message only after its predecessor; an early one waits `Pending`. Every daemon on the path
//! keeps a record; intermediate hops cache the data (500 ms, 30 messages by default) and replay
//! it on request; the origin keeps it until acknowledged. Updates are accepted only from the
//! message's current upstream (data) or downstream (acks, requests) neighbour. After a repair
//! each daemon purges what is to or from a dead rank or no longer crosses it, and exchanges
//! link updates (its depth and every message it holds routed over that link) with each
//! neighbour that changed, gated as PRRTE does.
//!
//! # What changed from PRRTE
//! PRRTE sends an ACK per message per hop back to the origin, then an ACK-of-ACK per message
//! per hop forward again, so that the destination may forget the message: two control frames
//! per message per hop. Here the destination keeps, per origin, the uid of the last message it
//! posted (a watermark, 4 bytes per origin), which recognises any later copy as a duplicate
//! forever. So:
//! * acknowledgements are cumulative per chain ("everything up to uid u is posted") and
//!   coalesced (one per chain per poll of the transmit queue, however many messages it covers);
//! * there is no ACK-of-ACK: the origin keeps the data until the cumulative ack (the guarantee
//!   PRRTE's ACK-of-ACK gives, that a replay is always possible until the destination has the
//!   message, holds unchanged), and hops drop their copy when the ack passes;
//! * a lost ack or a replay nobody asked for costs a duplicate that the watermark discards and
//!   re-acknowledges;
//! * after each global repair, destinations re-acknowledge every chain and origins resend, one
//!   gate period later, what is still unacknowledged: this recovers what no link update sees
//!   (a hop cache that evicted, an ack lost with a dying hop);
//! * the origin retransmits what stays unacknowledged (2 s, doubling to 16 s): the backstop for
//!   losses no repair announces (a frame dropped at a full relay queue).
//!
//! # Bounds
//! Unacknowledged messages per origin (`relm_unacked_max` of the users': at the bound
//! `Relm::send` fails with `Busy`, and the driver refuses the call before it gets here; the
//! runtime's own messages have a window of their own, `relm_unacked_max` plus
//! `RELM_RUNTIME_RESERVE`), pending messages at a destination (`relm_pending_max`: an early message beyond
//! it is dropped unacknowledged, and replayed later), the hop cache (count and age), link update
//! size (`RELM_UPDATE_ENTRIES_MAX` per frame, several frames if needed), retransmissions per
//! message (`RELM_RETRANSMITS_MAX`: then the completion fails with `Unreachable`).

pub mod batch;
mod engine;
mod link;
mod steady;
pub mod uid;
pub mod wire;

pub use engine::{MsgState, Role, Trigger};
pub use steady::{DataFrame, Post, Poster};
pub use wire::{Control, ControlError};

use crate::Rank;
use crate::error::SendError;
use crate::fxhash::{FxHashMap, FxHashSet};
use crate::routed::{Route, RoutingState};
use engine::MessageTable;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// What RELM needs to know of the tree: the daemon's current routing view.
pub trait Topology {
    /// This daemon's rank.
    fn me(&self) -> Rank;
    /// The neighbour a frame for `target` goes to next; `None` for myself or no route.
    fn next_hop(&self, target: Rank) -> Option<Rank>;
    /// Whether `r` is known to have failed.
    fn is_failed(&self, r: Rank) -> bool;
    /// My depth in the repaired tree (0 at rank 0).
    fn depth(&self) -> u32;
    /// My parent, if any.
    fn parent(&self) -> Option<Rank>;
    /// My children.
    fn children(&self) -> &[Rank];
    /// Whether this daemon's messages to `target` take a direct link (`src/direct/`) rather
    /// than the tree. Only an origin's own messages and its requests to an origin follow it:
    /// hops relay over the tree, and link updates concern tree links only.
    fn direct(&self, _target: Rank) -> bool {
        false
    }
    /// Rank `r`'s life as this daemon knows it: how many times rank 0 admitted it back
    /// (rejoin; 0 for a daemon never restarted). Acknowledgements name the origin's life, and
    /// one of another life than this daemon knows is ignored.
    fn life(&self, _r: Rank) -> u16 {
        0
    }
    /// The neighbour this daemon's own frames for `target` go to: `target` itself over a
    /// direct link, else the tree's next hop.
    fn route(&self, target: Rank) -> Option<Rank> {
        if self.direct(target) {
            Some(target)
        } else {
            self.next_hop(target)
        }
    }
}

impl Topology for RoutingState {
    fn me(&self) -> Rank {
        RoutingState::me(self)
    }
    fn next_hop(&self, target: Rank) -> Option<Rank> {
        match self.route(target) {
            Route::Parent(r) | Route::Child(r) => Some(r),
            Route::Local | Route::Unreachable => None,
        }
    }
    fn is_failed(&self, r: Rank) -> bool {
        RoutingState::is_failed(self, r)
    }
    fn depth(&self) -> u32 {
        RoutingState::depth(self)
    }
    fn parent(&self) -> Option<Rank> {
        RoutingState::parent(self)
    }
    fn children(&self) -> &[Rank] {
        RoutingState::children(self)
    }
}

/// RELM's settings (from `Config`: `relm_cache_ms`, `relm_cache_max`, ...).
#[derive(Debug, Clone, Copy)]
pub struct RelmConfig {
    /// How long a hop caches a message's data.
    pub cache_ms: u64,
    /// How many messages a hop caches.
    pub cache_max: usize,
    /// The origin's first retransmission timeout (doubled per retry, up to 8 times it).
    pub retransmit_ms: u64,
    /// How long a daemon waits for its changed neighbours' link updates before sending its own
    /// anyway.
    pub gate_ms: u64,
    /// Unacknowledged messages an origin may hold.
    pub unacked_max: usize,
    /// Early messages a destination may hold while their predecessor is missing.
    pub pending_max: usize,
}

impl Default for RelmConfig {
    fn default() -> Self {
        use crate::limits::*;
        RelmConfig {
            cache_ms: RELM_CACHE_MS_DEFAULT,
            cache_max: RELM_CACHE_MAX_DEFAULT,
            retransmit_ms: RELM_RETRANSMIT_MS_DEFAULT,
            gate_ms: RELM_GATE_MS_DEFAULT,
            unacked_max: RELM_UNACKED_MAX_DEFAULT,
            pending_max: RELM_PENDING_MAX_DEFAULT,
        }
    }
}

/// A frame RELM wants sent to a neighbour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transmit {
    /// A reliable message (kind `RelmData`; see `wire.rs` for the header). The payload is
    /// shared, not copied.
    Data {
        /// The neighbour.
        to: Rank,
        /// The message, as the neighbour's [`Relm::handle_data`] takes it.
        frame: DataFrame,
    },
    /// A control message (kind `Relm`).
    Control {
        /// The neighbour.
        to: Rank,
        /// The message.
        control: Control,
    },
}

/// Something the caller must hear about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A reliable send finished: `Ok` once posted at the destination, else why not.
    Completed {
        /// The token given to [`Relm::send`].
        token: u64,
        /// The outcome.
        result: Result<(), SendError>,
    },
}

/// RELM's counters (also summed into the daemon's `Counters`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RelmStats {
    /// Reliable messages originated here.
    pub sent: u64,
    /// Reliable messages posted here.
    pub posted: u64,
    /// Copies discarded as already posted.
    pub duplicates: u64,
    /// Retransmissions by origins (timer or repair).
    pub retransmits: u64,
    /// Replays from a record on request.
    pub replays: u64,
    /// Updates ignored: not from the message's current upstream or downstream neighbour, or a
    /// link update with a stale depth.
    pub ignored: u64,
    /// Hop cache evictions.
    pub evicted: u64,
    /// Early messages dropped at the pending bound, or messages the matcher could not hold.
    pub refused: u64,
    /// Link updates sent.
    pub link_updates: u64,
    /// Messages this daemon forwarded as an intermediate hop (copies included).
    pub relayed: u64,
}

/// Where a destination stands with one origin.
#[derive(Debug, Default)]
struct Inbound {
    /// The origin's life these uids belong to (a restarted origin numbers from 0 again).
    life: u16,
    /// The last uid posted from this origin (`uid::NONE` before the first).
    posted: u32,
    /// Early messages: predecessor uid -> uid.
    pending: FxHashMap<u32, u32>,
    /// The predecessor last requested, and when to ask again.
    requested: Option<(u32, Instant)>,
}

/// The link-update gate after a repair (PRRTE's gating).
#[derive(Debug, Default)]
struct Gate {
    /// Changed neighbours not heard from yet.
    awaiting: FxHashSet<Rank>,
    /// Changed neighbours still owed this daemon's link update.
    owed: FxHashSet<Rank>,
    /// When to stop waiting.
    deadline: Option<Instant>,
    /// After a global repair: once the gate opens, re-acknowledge every inbound chain, and
    /// resend every message still unacknowledged one gate period later.
    resend_all: bool,
}

/// One daemon's reliable-messaging state.
#[derive(Debug)]
pub struct Relm {
    me: Rank,
    size: u32,
    cfg: RelmConfig,
    table: MessageTable,
    next_uid: u32,
    /// dst -> the last uid originated for it.
    outbound: FxHashMap<Rank, u32>,
    inbound: FxHashMap<Rank, Inbound>,
    /// (origin, dst) -> (upto, neighbour, the origin's life): acknowledgements to send,
    /// coalesced.
    acks_due: FxHashMap<(Rank, Rank), (u32, Rank, u16)>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
    gate: Gate,
    next_tick: Option<Instant>,
    stats: RelmStats,
}

impl Relm {
    /// A fresh state for daemon `me` of a DVM of `size`.
    pub fn new(me: Rank, size: u32, cfg: RelmConfig) -> Relm {
        Relm {
            me,
            size,
            cfg,
            table: MessageTable::default(),
            next_uid: 0,
            outbound: FxHashMap::default(),
            inbound: FxHashMap::default(),
            acks_due: FxHashMap::default(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            gate: Gate::default(),
            next_tick: None,
            stats: RelmStats::default(),
        }
    }

    /// The next frame to send. Call until `None` after every input.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        if self.transmits.is_empty() && !self.acks_due.is_empty() {
            let mut acks: Vec<_> = self.acks_due.drain().collect();
            // Deterministic order (the simulator replays from a seed).
            acks.sort_unstable();
            for ((origin, dst), (upto, to, life)) in acks {
                self.transmits.push_back(Transmit::Control {
                    to,
                    control: Control::Ack {
                        origin,
                        dst,
                        upto,
                        life,
                    },
                });
            }
        }
        self.transmits.pop_front()
    }

    /// The next completion.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`Relm::handle_timeout`] must next be called, if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match (self.next_tick, self.gate.deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether this daemon holds no message state at all (records, acks to send, frames or
    /// events not yet polled). The per-origin watermarks are not message state.
    pub fn is_idle(&self) -> bool {
        self.table.is_empty()
            && self.acks_due.is_empty()
            && self.transmits.is_empty()
            && self.events.is_empty()
            && self.inbound.values().all(|i| i.pending.is_empty())
    }

    /// Records held, by role: (origin, hop, destination pending).
    pub fn records(&self) -> (usize, usize, usize) {
        self.table.counts()
    }

    /// The configuration it was made with.
    pub fn config(&self) -> &RelmConfig {
        &self.cfg
    }

    /// The counters.
    pub fn stats(&self) -> RelmStats {
        self.stats
    }

    fn tick_period(&self) -> Duration {
        Duration::from_millis((self.cfg.cache_ms.min(self.cfg.retransmit_ms) / 2).max(10))
    }

    /// Keeps a tick armed while there is anything a timer must look at (an emptied chain's
    /// memory too: the tick frees it).
    fn arm_tick(&mut self, now: Instant) {
        if self.next_tick.is_none() && !(self.table.is_clear() && self.inbound_idle()) {
            self.next_tick = Some(now + self.tick_period());
        }
    }

    fn inbound_idle(&self) -> bool {
        self.inbound.values().all(|i| i.pending.is_empty())
    }

    fn complete(&mut self, token: Option<u64>, result: Result<(), SendError>) {
        if let Some(token) = token {
            self.events.push_back(Event::Completed { token, result });
        }
    }

    /// Queues the acknowledgement "the chain (origin, dst) of the origin's `life` is posted up
    /// to `upto`" for neighbour `to`, coalesced with one already queued for that chain (one of
    /// another life is replaced: only the latest life's chain matters).
    fn ack_due(&mut self, (origin, dst, life): (Rank, Rank, u16), upto: u32, to: Rank) {
        let e = self
            .acks_due
            .entry((origin, dst))
            .or_insert((upto, to, life));
        if e.2 != life || uid::before(e.0, upto) {
            e.0 = upto;
        }
        e.1 = to;
        e.2 = life;
    }
}

#[cfg(test)]
mod tests;
