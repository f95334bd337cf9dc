//! Errors returned to callers, sorted by cause: API misuse (the caller's arguments), the DVM's
//! state (a peer is down, a queue is full, the daemon is stopping), and configuration or start-up.

use crate::Rank;
use std::fmt;

/// Why a send failed. Returned at once by [`crate::Handle::send`] when the arguments are wrong,
/// or passed later to a send's completion when the DVM could not carry the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    /// API misuse: the tag lies in the range reserved for the runtime (below
    /// [`crate::rml::TAG_USER_MIN`]).
    ReservedTag(u32),
    /// API misuse: no such rank in this DVM.
    RankOutOfRange { rank: Rank, size: u32 },
    /// API misuse: the payload is larger than the configured `msg_max_bytes`.
    TooLarge { len: usize, max: usize },
    /// The destination is known to have failed.
    NodeDown(Rank),
    /// No route leads to the destination (a peer could not be reached after the bounded
    /// reconnect policy).
    Unreachable(Rank),
    /// A bounded queue is full (pre-wire-up queue, per-peer send queue, command channel from a
    /// callback); the caller should retry later.
    Busy(&'static str),
    /// The daemon is shutting down or has stopped.
    ShutDown,
    /// A waiting call ([`crate::Handle::send_reliable_wait`], [`crate::Handle::allgather_wait`],
    /// [`crate::Handle::barrier_wait`]) gave up before the operation completed. Nothing was
    /// withdrawn: the message may still be delivered, the collective may still complete.
    TimedOut,
    /// API misuse: this daemon already used this collective id (it contributed to it, or its
    /// result arrived). Collective ids must never be reused.
    DuplicateId(u64),
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::ReservedTag(t) => {
                write!(
                    f,
                    "tag {t} is reserved for the runtime (user tags start at 100)"
                )
            }
            SendError::RankOutOfRange { rank, size } => {
                write!(f, "rank {rank} is out of range for a DVM of {size} daemons")
            }
            SendError::TooLarge { len, max } => {
                write!(
                    f,
                    "message of {len} bytes exceeds the maximum of {max} bytes"
                )
            }
            SendError::NodeDown(r) => write!(f, "rank {r} has failed"),
            SendError::Unreachable(r) => write!(f, "rank {r} is unreachable"),
            SendError::Busy(what) => write!(f, "{what} is full; retry later"),
            SendError::ShutDown => write!(f, "the daemon is shut down"),
            SendError::TimedOut => {
                write!(
                    f,
                    "timed out waiting for the operation to complete (not withdrawn)"
                )
            }
            SendError::DuplicateId(id) => {
                write!(
                    f,
                    "collective id {id} was already used on this daemon (ids must not be reused)"
                )
            }
        }
    }
}

impl std::error::Error for SendError {}

/// Why posting a receive failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecvError {
    /// API misuse: the tag is reserved for the runtime.
    ReservedTag(u32),
    /// API misuse: a receive for the same (peer, tag) is already posted.
    Duplicate,
    /// API misuse: no such rank in this DVM.
    RankOutOfRange { rank: Rank, size: u32 },
    /// A blocking receive saw no matching message within its timeout.
    TimedOut,
    /// The daemon is shutting down or has stopped.
    ShutDown,
    /// API misuse: a blocking receive called from a callback, on the daemon's loop thread,
    /// would wait for the thread it runs on. Post a receive with a callback instead.
    InCallback,
}

impl fmt::Display for RecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecvError::ReservedTag(t) => {
                write!(
                    f,
                    "tag {t} is reserved for the runtime (user tags start at 100)"
                )
            }
            RecvError::Duplicate => write!(f, "a receive for this (peer, tag) is already posted"),
            RecvError::RankOutOfRange { rank, size } => {
                write!(f, "rank {rank} is out of range for a DVM of {size} daemons")
            }
            RecvError::TimedOut => write!(f, "no matching message arrived in time"),
            RecvError::ShutDown => write!(f, "the daemon is shut down"),
            RecvError::InCallback => write!(
                f,
                "a blocking receive cannot run in a callback (it would wait for its own thread)"
            ),
        }
    }
}

impl std::error::Error for RecvError {}

/// Why a daemon could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration is invalid.
    Config(String),
    /// Rank, size or radix do not describe a tree.
    Tree(crate::routed::TreeError),
    /// Rank 0's contact URI is missing (a non-zero rank needs it) or malformed.
    Hnp(String),
    /// A socket or the poller could not be set up.
    Io(std::io::Error),
    /// No rank or size where [`crate::launch::Placement`] looked (the launcher's
    /// environment), or a local DVM that did not wire up in time.
    Placement(String),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Config(e) => write!(f, "invalid configuration: {e}"),
            StartError::Tree(e) => write!(f, "invalid tree: {e}"),
            StartError::Hnp(e) => write!(f, "rank 0 contact: {e}"),
            StartError::Io(e) => write!(f, "I/O error: {e}"),
            StartError::Placement(e) => write!(f, "placement: {e}"),
        }
    }
}

impl std::error::Error for StartError {}

impl From<std::io::Error> for StartError {
    fn from(e: std::io::Error) -> Self {
        StartError::Io(e)
    }
}
