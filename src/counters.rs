//! Per-daemon counters, readable through [`crate::Handle::counters`].

use serde::Serialize;

/// A snapshot of one daemon's counters. Counts are since the daemon started.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Messages this daemon originated (including self-sends).
    pub sent: u64,
    /// Messages delivered to a receive on this daemon.
    pub delivered: u64,
    /// Messages for other daemons forwarded by this one.
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
}
