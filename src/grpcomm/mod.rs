//! Tree collectives, sans-IO: fault-tolerant broadcast ([`Xcast`]) and allgather
//! ([`Allgather`], with `barrier` on top).
//!
//! - [`xcast`]: any daemon broadcasts through rank 0, which numbers the operations; every
//!   living daemon delivers each operation once, in order; the originator learns when the whole
//!   living tree has it.
//! - [`allgather`]: every living daemon contributes bytes; rank 0 assembles them by rank, names
//!   the ranks that failed before contributing, and the result is broadcast with xcast.
//! - [`group`]: the same among the members of a group (a job's daemons), run only by the part
//!   of the tree that holds members, with the result sent down that part; named by
//!   [`members::GroupOp`].
//! - [`wire`]: the byte layouts of every message, with decoders that return errors on any input.
//!
//! # Driving a core
//! The cores never touch sockets, clocks or threads (quinn-proto style). Inputs are
//! `handle_msg(from, msg)` for a decoded frame from peer `from`, `handle_repair(&status)` for
//! every [`RecoveryStatus`](crate::RecoveryStatus) the daemon's
//! [`RoutingState`](crate::routed::RoutingState) returns (all of them, in order), and the API
//! calls (`originate`, `contribute`, ...). Outputs are drained with `poll_transmit()` and
//! `poll_event()`, plus the xcast core's `poll_notice()` (requests and completion notices,
//! carried reliably, taken only while the reliable channel has room). After every input the driver must call `poll_transmit` until it returns
//! `None`, then `poll_event` until `None`, and repeat while either returned something
//! (delivering an event can make an acknowledgement ready). Transmits are sent in the order
//! they are polled; the cores need FIFO order per directed link (the tree's TCP connections
//! give it) and tolerate loss of everything addressed to or coming from a failed daemon.
//! Polling transmits before events is what makes a daemon forward an operation to its children
//! before delivering it locally.
//!
//! # The view digest
//! Daemons learn failures at different times (a local detection first, rank 0's confirmation
//! later), so two neighbours can briefly disagree about the tree. Messages whose meaning is
//! "my whole subtree" (xcast `Ack`, allgather `Contribution`) carry a digest of the sender's
//! failed set and are counted only by a receiver with the same digest; the tree is a pure
//! function of the failed set, so they then mean the same subtree to both. See `view.rs`.
//!
//! # Faults, in one paragraph
//! After a repair a daemon treats as *new* every child that was not its child before, and all
//! its children if it was promoted (PRRTE's rule). A daemon is new to its parent exactly when
//! its parent changed or it was promoted itself. New relationships start with a handshake
//! (`Sync` from the parent) and nothing from before them is trusted; kept relationships keep
//! their state, because a kept child's subtree can only lose ranks in a repair (ranks move only
//! into ancestor slots, never across to a sibling's subtree).
pub mod allgather;
mod gathering;
pub mod group;
pub mod members;
mod view;
pub mod wire;
pub mod xcast;

#[cfg(test)]
mod testnet;

pub use allgather::{Allgather, AllgatherError, AllgatherEvent, AllgatherStats};
pub use group::{GroupContributeError, GroupEvent, GroupFailure, GroupGather, GroupStats};
pub use members::{GroupError, GroupId, GroupOp};
pub use wire::{
    AllgatherMsg, AllgatherResult, Contribution, GroupData, GroupMsg, OP_HEADER_LEN, Op, Request,
    WireError, XcastMsg,
};
pub use xcast::{Xcast, XcastError, XcastEvent, XcastLimits, XcastStats};

use crate::Rank;
use crate::rml::Tag;

/// Runtime tag (carried by RELM): an xcast `Request`, from its originator to rank 0.
pub const TAG_XCAST_REQUEST: Tag = 10;
/// Runtime tag (carried by RELM): rank 0's `Done` or `Refused`, to the originator.
pub const TAG_XCAST_DONE: Tag = 11;
/// Runtime tag of the xcast operation that carries an allgather result.
pub const TAG_ALLGATHER_RESULT: Tag = 12;

/// A message a core wants sent to daemon `to`. The driver encodes it (see [`wire`]) and sends
/// it: tree messages over the connection to that neighbour; `Request`, `Done` and `Refused`
/// between an originator and rank 0, reliably (they may cross several hops).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit<M> {
    pub to: Rank,
    pub msg: M,
}
