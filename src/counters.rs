//! Per-daemon counters, readable through [`crate::Handle::counters`].

use serde::Serialize;

/// A snapshot of one daemon's counters. Counts are since the daemon started.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Messages this daemon originated (including self-sends).
    pub sent: u64,
    /// Messages delivered to a receive on this daemon.
    pub delivered: u64,
    /// Plain messages for other daemons forwarded by this one (reliable ones are RELM's: see
    /// the `relm_*` counters).
    pub relayed: u64,
    /// Broadcast frames forwarded to children.
    pub xcast_forwarded: u64,
    /// Messages dropped because no route led to their destination.
    pub dropped_unreachable: u64,
    /// Frames without a sender here (relayed, broadcast copies, notices) dropped because the
    /// bounded queue towards their next hop was full (a peer that does not read).
    pub dropped_queue_full: u64,
    /// Held (unmatched) messages dropped to keep the unmatched list within its bound.
    pub dropped_unmatched: u64,
    /// Connections closed because the peer broke the protocol (bad frame, bad handshake).
    pub protocol_errors: u64,
    /// Outgoing connection attempts that were retried.
    pub reconnects: u64,
    /// Commands received from other threads.
    pub commands: u64,
    /// Wake-up system calls paid to rouse the loop (at most one per command; far fewer in bursts).
    pub wakeups: u64,
    /// Frames dropped because they came from (or over a link from) a rank known to have
    /// failed: stale traffic of a daemon the DVM declared dead.
    pub dropped_stale: u64,
    /// Repairs of the routing tree (local and global scope each count).
    pub repairs: u64,
    /// Ranks this daemon knows have failed, ascending.
    pub failed: Vec<u32>,
    /// Connections currently open (established or handshaking).
    pub connections: u64,
    /// The loop's current parent (lifeline) in the tree.
    pub parent: Option<u32>,
    /// The loop's current children in the tree.
    pub children: Vec<u32>,
    /// The DVM epoch this daemon knows: rank 0 increments it with every confirmation of
    /// deaths.
    pub epoch: u64,
    /// Reliable messages originated here (self-sends excluded: they are posted locally).
    pub relm_sent: u64,
    /// Reliable messages posted here (handed to receive matching), each once.
    pub relm_posted: u64,
    /// Copies of reliable messages discarded here as already posted.
    pub relm_duplicates: u64,
    /// Reliable messages this daemon retransmitted as their origin (timer or repair).
    pub relm_retransmits: u64,
    /// Reliable messages replayed from this daemon's record on a neighbour's request.
    pub relm_replays: u64,
    /// RELM updates ignored: not from the message's current upstream or downstream
    /// neighbour, or a link update with a stale depth.
    pub relm_ignored: u64,
    /// Reliable messages evicted from this daemon's hop cache (by age or count).
    pub relm_evicted: u64,
    /// Reliable messages refused here: early ones beyond `relm_pending_max`, or ones the full
    /// unmatched list could not hold. Not acknowledged; their origin replays them.
    pub relm_refused: u64,
    /// RELM link updates this daemon sent after repairs and reconnections.
    pub relm_link_updates: u64,
    /// Reliable messages originated here and not yet acknowledged (at most
    /// `relm_unacked_max`).
    pub relm_unacked: u64,
    /// Reliable messages held in this daemon's hop cache for replay.
    pub relm_cached: u64,
    /// Early reliable messages held here while their predecessor is missing.
    pub relm_pending: u64,
}
