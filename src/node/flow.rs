//! Hop-by-hop flow control: which neighbours' frames a daemon reads now, and when its callers'
//! sends are turned away, decided from how full its send queues are.
//!
//! # The rule
//! A send queue towards a neighbour is *congested* from the moment it holds more than
//! [`FLOW_HIGH_BYTES`] until it is down to [`FLOW_LOW_BYTES`] (hysteresis: a queue that
//! hovers at one threshold does not flap). While a queue towards `c` is congested and moving
//! (it took bytes within [`FLOW_STUCK_MS`]):
//! - the daemon reads no frames from any neighbour other than `c` (they could be for `c`):
//!   TCP's own flow control then fills those neighbours' queues towards this daemon, and so on
//!   back to the originators;
//! - a send originated here whose next hop is a congested neighbour is refused `Busy` at once
//!   (the caller retries later): back-pressure reaches the caller instead of a relay dropping.
//!   Unless the queue is congested with bulk data (stream chunks waiting in the connection's
//!   bulk line, `node::lane`) and holds no more than [`FLOW_LOW_BYTES`] of anything else: a
//!   message goes ahead of the bulk data, so it is not held up by it (streams themselves
//!   release data only towards queues that are not congested at all).
//! - Likewise a queue congested with bulk data only does not stop the daemon reading its
//!   neighbours' links, only their bulk connections ([`Flow::may_read_link`]): the messages
//!   read there go ahead of the bulk data.
//!
//! # Why it cannot deadlock
//! A daemon stops reading from `x` only because of a queue towards another neighbour `y != x`.
//! Following "x waits for y" from daemon to daemon is a walk on the tree that never turns
//! straight back, and such a walk ends: at a leaf, which has one neighbour and so never stops
//! reading it, or at a queue that drains. Frames never turn back either (routing is along the
//! tree), so a stopped reader is always waiting for a queue that moves.
//!
//! # Why a stuck queue does not count, until it is nearly full
//! A neighbour that stopped reading altogether (hung, not scheduled, or dying before the
//! heartbeats say so) should not stop this daemon from reading everyone else: a queue that
//! took nothing for [`FLOW_STUCK_MS`] stops pausing reads. Frames for it then pile up in its
//! queue; once that holds more than [`FlowLimits::full_bytes`] (the hard bound,
//! `send_queue_max_bytes`, less room for what one more read can add), the queue pauses reads
//! again, so that nothing is dropped for a neighbour that may only be slow. If it is dead, the
//! heartbeats' not-reading rule declares it failed and its queue no longer counts.
//!
//! A queue towards a neighbour that says it is pausing (its heartbeats carry
//! [`HEARTBEAT_PAUSING`]) counts as moving: it waits on the neighbour's own congested queue,
//! which moves or is itself declared stuck, and then the neighbour stops saying so.
//!
//! A neighbour whose frames this daemon is not reading is counted as heard by the heartbeat
//! monitor: its silence is this daemon's own doing. And the heartbeats this daemon sends it
//! carry [`HEARTBEAT_PAUSING`], so that it does not take this daemon for deaf (its queue
//! towards this daemon takes no bytes): the not-reading rule applies only a whole heartbeat
//! timeout after the last such heartbeat.

use crate::Rank;

/// The heartbeat's tag bit that says "I am leaving your frames unread (flow control)": the
/// receiver does not take the sender's stalled reading for deafness (`docs/wire.md`).
pub const HEARTBEAT_PAUSING: u32 = 1;
use crate::fxhash::FxHashMap;
use crate::limits::{
    FLOW_HIGH_BYTES, FLOW_LOW_BYTES, FLOW_STUCK_MS, MSG_MAX_BYTES_DEFAULT, READ_LARGE_STEP_BYTES,
    SEND_QUEUE_MAX_BYTES_DEFAULT,
};
use std::time::{Duration, Instant};

#[cfg(test)]
mod tests;

/// The thresholds of one daemon's flow control (the `limits` values unless a test lowers them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowLimits {
    /// [`FLOW_HIGH_BYTES`].
    pub high_bytes: usize,
    /// [`FLOW_LOW_BYTES`]; at most `high_bytes`.
    pub low_bytes: usize,
    /// [`FLOW_STUCK_MS`].
    pub stuck_ms: u64,
    /// A stuck queue above this pauses reads again: room is left below the hard bound for
    /// what one read can still add, so that nothing is dropped for a neighbour that is alive
    /// but not reading (see [`FlowLimits::for_queue`]).
    pub full_bytes: usize,
}

impl FlowLimits {
    /// The thresholds for send queues bounded at `queue_max_bytes` carrying messages of at
    /// most `msg_max_bytes`: the high-water mark is [`FLOW_HIGH_BYTES`], or a quarter of a
    /// smaller bound (the low one a quarter of that at most); `full_bytes` leaves room for one maximal frame and one read
    /// region (`READ_LARGE_STEP_BYTES`), what a single read of another connection can add
    /// before the levels are reported again. Where there is no such room, a stuck queue never
    /// stops pausing.
    pub fn for_queue(queue_max_bytes: usize, msg_max_bytes: usize) -> Self {
        let margin = msg_max_bytes
            .saturating_add(crate::oob::header::HEADER_LEN)
            .saturating_add(READ_LARGE_STEP_BYTES);
        // A small queue congests early enough for the rule to act before its bound.
        let high_bytes = FLOW_HIGH_BYTES.min(queue_max_bytes / 4).max(1);
        FlowLimits {
            high_bytes,
            low_bytes: FLOW_LOW_BYTES.min(high_bytes / 4),
            stuck_ms: FLOW_STUCK_MS,
            full_bytes: queue_max_bytes.saturating_sub(margin).max(high_bytes),
        }
    }
}

impl Default for FlowLimits {
    /// [`FlowLimits::for_queue`] with the default queue bound and message size.
    fn default() -> Self {
        FlowLimits::for_queue(SEND_QUEUE_MAX_BYTES_DEFAULT, MSG_MAX_BYTES_DEFAULT as usize)
    }
}

/// One congested queue: its size when last told, and when it last took bytes; whether what
/// it holds apart from its bulk line is at most the low-water mark (sends originated here
/// may go ahead of the bulk data).
#[derive(Debug, Clone, Copy)]
struct Congested {
    queued: usize,
    moved_at: Instant,
    control_low: bool,
}

/// The flow-control state of one daemon (see the module documentation).
#[derive(Debug, Clone)]
pub struct Flow {
    limits: FlowLimits,
    /// Neighbours whose queue is congested. Few: at most this daemon's neighbours.
    congested: FxHashMap<Rank, Congested>,
    /// Times a queue became congested (for the counters).
    episodes: u64,
    /// Bumped whenever the congested set changes (see [`Flow::generation`]).
    generation: u64,
    /// The last level reported of each queue that was not empty (a status shows them).
    levels: FxHashMap<Rank, usize>,
}

impl Flow {
    /// Flow control with these thresholds (`low_bytes` is lowered to `high_bytes`).
    pub fn new(limits: FlowLimits) -> Self {
        Flow {
            limits: FlowLimits {
                low_bytes: limits.low_bytes.min(limits.high_bytes),
                ..limits
            },
            congested: FxHashMap::default(),
            episodes: 0,
            generation: 0,
            levels: FxHashMap::default(),
        }
    }

    /// The queue towards `peer` now holds `queued` bytes, none of them in a bulk line (see
    /// [`Flow::handle_levels`]).
    pub fn handle_queued(&mut self, now: Instant, peer: Rank, queued: usize) {
        self.handle_levels(now, peer, queued, 0);
    }

    /// The queue towards `peer` now holds `queued` bytes, `bulk` of them in its bulk line
    /// (`bulk <= queued`). Call it whenever it may have changed (after queueing frames, after
    /// writing); cheap when nothing crosses a threshold.
    pub fn handle_levels(&mut self, now: Instant, peer: Rank, queued: usize, bulk: usize) {
        // Every flush reports: an empty queue while nothing is congested (the common case)
        // changes at most its level, without hashing into empty maps.
        if queued == 0 && self.congested.is_empty() {
            if !self.levels.is_empty() {
                self.levels.remove(&peer);
            }
            return;
        }
        let control_low = queued.saturating_sub(bulk) <= self.limits.low_bytes;
        if queued == 0 {
            self.levels.remove(&peer);
        } else {
            self.levels.insert(peer, queued);
        }
        match self.congested.get_mut(&peer) {
            Some(c) => {
                if queued <= self.limits.low_bytes {
                    self.congested.remove(&peer);
                    self.generation += 1;
                } else {
                    if queued < c.queued {
                        c.moved_at = now;
                    }
                    c.queued = queued;
                    if c.control_low != control_low {
                        c.control_low = control_low;
                        self.generation += 1;
                    }
                }
            }
            None if queued > self.limits.high_bytes => {
                self.episodes += 1;
                self.generation += 1;
                self.congested.insert(
                    peer,
                    Congested {
                        queued,
                        moved_at: now,
                        control_low,
                    },
                );
            }
            None => {}
        }
    }

    /// Neighbour `peer` said (in a heartbeat) that it leaves this daemon's frames unread
    /// because of its own congested queue: a congested queue towards it is waiting on a
    /// moving queue further on, not stuck, so it counts as moving. Without this, a pause
    /// longer than `stuck_ms` down a chain of relays (slow consumers, or daemons not
    /// scheduled for seconds on an overloaded host) would make each relay in turn stop
    /// pausing and fill its queue to the hard bound, where relayed frames are dropped.
    pub fn handle_pausing(&mut self, now: Instant, peer: Rank) {
        if let Some(c) = self.congested.get_mut(&peer) {
            c.moved_at = now;
        }
    }

    /// The connection with `peer` is gone (or `peer` failed): its queue no longer counts.
    pub fn forget(&mut self, peer: Rank) {
        self.levels.remove(&peer);
        if self.congested.remove(&peer).is_some() {
            self.generation += 1;
        }
    }

    /// Whether frames from neighbour `from` may be read now: no queue towards another
    /// neighbour is congested and moving.
    pub fn may_read(&self, now: Instant, from: Rank) -> bool {
        !self
            .congested
            .iter()
            .any(|(&peer, c)| peer != from && self.holds_back(now, c))
    }

    /// Whether frames from neighbour `from`'s link (its tree or direct connection, not its bulk
    /// connection) may be read now: as [`Flow::may_read`], except that a queue congested with
    /// bulk data only (at most the low-water mark of anything else) does not hold a link back.
    /// What a link brings is mostly messages, and a message goes ahead of the bulk data in that
    /// queue, so reading it adds nothing the queue must drain first: a message does not wait
    /// for a stream's data to drain a relay (measured: a 64 B round trip through a relay that
    /// carried a stream was 16x the idle one while every connection paused). A stream's data
    /// that comes over a link (no bulk connection) adds to the congested queue, by at most its
    /// window (a stream has no more in flight on its whole path), and never beyond
    /// [`FlowLimits::full_bytes`], where every connection pauses again.
    pub fn may_read_link(&self, now: Instant, from: Rank) -> bool {
        !self.congested.iter().any(|(&peer, c)| {
            peer != from && self.holds_back(now, c) && !self.lets_links_through(c)
        })
    }

    /// Whether a congested queue lets links be read (see [`Flow::may_read_link`]).
    fn lets_links_through(&self, c: &Congested) -> bool {
        c.control_low && c.queued <= self.limits.full_bytes
    }

    /// The thresholds in force.
    pub fn limits(&self) -> FlowLimits {
        self.limits
    }

    /// Whether any queue is congested (the common answer, no: callers skip routing a send
    /// only to ask [`Flow::may_originate`]).
    pub fn any_congested(&self) -> bool {
        !self.congested.is_empty()
    }

    /// Whether a send originated here may be queued towards neighbour `hop` now: its queue
    /// is not congested, or congested with bulk data it goes ahead of.
    pub fn may_originate(&self, hop: Rank) -> bool {
        self.congested.get(&hop).is_none_or(|c| c.control_low)
    }

    /// Whether bulk data (a stream's) may be queued towards neighbour `hop` now: its queue
    /// is not congested.
    pub fn may_release(&self, hop: Rank) -> bool {
        !self.congested.contains_key(&hop)
    }

    /// Whether any queue is congested and moving (a driver that paused reads re-checks them
    /// while this holds, and when it stops holding).
    pub fn is_pausing(&self, now: Instant) -> bool {
        self.congested.values().any(|c| self.holds_back(now, c))
    }

    /// When a pause may end by itself (a congested queue counting as stuck), if any does.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.congested
            .values()
            .map(|c| c.moved_at + Duration::from_millis(self.limits.stuck_ms))
            .min()
    }

    /// The bytes last reported waiting in the queue towards `peer`.
    pub fn level(&self, peer: Rank) -> usize {
        self.levels.get(&peer).copied().unwrap_or(0)
    }

    /// Times a queue became congested.
    pub fn episodes(&self) -> u64 {
        self.episodes
    }

    /// Changes whenever the set of congested queues changes: a driver that publishes
    /// [`Flow::may_originate`] answers to other threads recomputes them only then.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether a congested queue pauses reads: it moves, or it is too full to take more.
    fn holds_back(&self, now: Instant, c: &Congested) -> bool {
        c.queued > self.limits.full_bytes || self.moving(now, c)
    }

    fn moving(&self, now: Instant, c: &Congested) -> bool {
        now.saturating_duration_since(c.moved_at) < Duration::from_millis(self.limits.stuck_ms)
    }
}
