//! Errors returned to callers, sorted by cause: API misuse (the caller's arguments), the DVM's
//! state (a peer is down, a queue is full, the daemon is stopping), and configuration or start-up.

use crate::Rank;
use std::fmt;

/// Why a send failed. Returned at once by [`crate::Handle::send`] when the arguments are wrong,
/// or passed later to a send's completion when the DVM could not carry the message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SendError {
    /// API misuse: the tag lies in the range reserved for the runtime (below
    /// [`crate::rml::TAG_USER_MIN`]).
    ReservedTag(u32),
    /// API misuse: no such rank in this DVM.
    RankOutOfRange {
        /// The rank asked for.
        rank: Rank,
        /// The DVM's size: ranks run `0..size`.
        size: u32,
    },
    /// API misuse: the payload is larger than the configured `msg_max_bytes`.
    TooLarge {
        /// The payload's length.
        len: usize,
        /// The largest allowed.
        max: usize,
    },
    /// The destination is known to have failed.
    NodeDown(Rank),
    /// No route leads to the destination (a peer could not be reached after the bounded
    /// reconnect policy).
    Unreachable(Rank),
    /// A bound was reached ([`Limit`] says which); the caller should offer the same operation
    /// again later (back-pressure), or, for [`Limit::LoopThread`], not make the call from a
    /// callback.
    Busy(Limit),
    /// The daemon is shutting down or has stopped.
    ShutDown,
    /// A waiting call ([`crate::Handle::send_reliable_wait`], [`crate::Handle::allgather_wait`],
    /// [`crate::Handle::barrier_wait`]) gave up before the operation completed. Nothing was
    /// withdrawn: the message may still be delivered, the collective may still complete.
    TimedOut,
    /// API misuse: this daemon already used this collective id (it contributed to it, or its
    /// result arrived). Collective ids must never be reused.
    DuplicateId(u64),
    /// API misuse: this daemon (the rank given) is not a member of the group it called a group
    /// collective on.
    NotMember(Rank),
    /// A collective ended without its result: the result was forgotten by every daemon this
    /// member's late contribution reached (after a repair, beyond the bounded caches of recent
    /// results, `limits::GROUP_RESULTS_CACHED_MAX`). The other members may have it. For the
    /// DVM-wide allgather and barrier, only on a daemon that rejoined or joined, for a
    /// collective finished before its admission (`limits::ALLGATHER_RESULTS_CACHED_MAX`).
    ResultLost,
    /// The members of a group called different collectives under one number (another kind,
    /// another broadcast root or another fence mode): every member ends it with this. The
    /// members are out of step; see `Group` for the calling rules.
    Mismatch,
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
            SendError::Busy(Limit::LoopThread) => write!(
                f,
                "a blocking call cannot run in a callback (it would wait for its own thread)"
            ),
            SendError::Busy(Limit::Batch) => write!(
                f,
                "the batch is full: hand it over with send_batch before pushing more"
            ),
            SendError::Busy(limit) => write!(f, "{limit} is full; retry later"),
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
            SendError::NotMember(r) => {
                write!(f, "rank {r} is not a member of the group")
            }
            SendError::Mismatch => write!(
                f,
                "the group's members called different collectives under one number"
            ),
            SendError::ResultLost => write!(
                f,
                "the collective's result was lost after a repair or a rejoin (no daemon on the \
                 way still held it)"
            ),
        }
    }
}

impl std::error::Error for SendError {}

/// The bound behind a [`SendError::Busy`]: what was full. Each is documented with its setting
/// or its constant in [`crate::limits`]; README "Bounds and back-pressure" says how each
/// behaves at the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Limit {
    /// Operations queued before wire-up completed (`prewire_queue_max`).
    PrewireQueue,
    /// The channel of commands from handles to the daemon's loop, by count
    /// ([`crate::limits::COMMAND_QUEUE_MAX`]) or by payload bytes not yet taken
    /// ([`crate::limits::COMMAND_QUEUE_MAX_BYTES`]).
    CommandChannel,
    /// The send queue towards the next hop is congested (flow control, `send_queue_max_bytes`).
    NextHopQueue,
    /// The queue of a direct link that is closing.
    ClosingDirectLink,
    /// Reliable sends not yet acknowledged (`relm_unacked_max`).
    ReliableWindow,
    /// Rank 0's window of broadcasts in flight.
    BroadcastWindow,
    /// This daemon's own broadcasts not yet complete.
    OutstandingBroadcasts,
    /// Collectives in flight on this daemon.
    CollectivesInFlight,
    /// Group collectives in flight on this daemon ([`crate::limits::GROUP_INFLIGHT_MAX`]).
    GroupCollectivesInFlight,
    /// Groups with committed data-exchange data on this daemon
    /// ([`crate::limits::MODEX_GROUPS_MAX`]; `Handle::forget_group` frees one).
    ModexGroups,
    /// A [`crate::Batch`] holds [`crate::limits::SEND_BATCH_MAX`] messages.
    Batch,
    /// Services one daemon serves ([`crate::limits::STREAM_SERVICES_MAX`]).
    ServiceTable,
    /// Streams one daemon reads at once ([`crate::limits::STREAMS_MAX`]).
    StreamTable,
    /// The credit windows of this daemon's streams in sum
    /// ([`crate::limits::STREAM_WINDOWS_TOTAL_MAX`]).
    StreamWindows,
    /// A stream has no credit left for this write (or has ended).
    StreamCredit,
    /// Jobs open for clients on this daemon ([`crate::limits::CLIENT_JOBS_MAX`]).
    ClientJobs,
    /// Not a queue: a blocking call (or one that waits for the loop) made from a callback, on
    /// the daemon's loop thread, would wait for its own thread.
    LoopThread,
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Limit::PrewireQueue => "the pre-wire-up queue",
            Limit::CommandChannel => "the command channel",
            Limit::NextHopQueue => "the send queue towards the next hop",
            Limit::ClosingDirectLink => "a closing direct link's queue",
            Limit::ReliableWindow => "the reliable-send window",
            Limit::BroadcastWindow => "rank 0's broadcast window",
            Limit::OutstandingBroadcasts => "this daemon's outstanding broadcasts",
            Limit::CollectivesInFlight => "the collectives in flight",
            Limit::GroupCollectivesInFlight => "the group collectives in flight",
            Limit::ClientJobs => "the jobs open for clients",
            Limit::ModexGroups => "the table of groups with data (put or committed)",
            Limit::Batch => "the batch",
            Limit::ServiceTable => "the service table",
            Limit::StreamTable => "the stream table",
            Limit::StreamWindows => "the stream credit budget",
            Limit::StreamCredit => "the stream's credit",
            Limit::LoopThread => "the loop thread (called from a callback)",
        })
    }
}

/// Why posting a receive failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecvError {
    /// API misuse: the tag is reserved for the runtime.
    ReservedTag(u32),
    /// API misuse: a receive for the same (peer, tag) is already posted.
    Duplicate,
    /// API misuse: no such rank in this DVM.
    RankOutOfRange {
        /// The rank asked for.
        rank: Rank,
        /// The DVM's size: ranks run `0..size`.
        size: u32,
    },
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

/// Why a handler could not be registered ([`crate::Handle::on_fault`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RegisterError {
    /// The daemon is shutting down or has stopped: the handler will never run.
    ShutDown,
    /// Called from a callback while the command channel to the loop was full
    /// ([`crate::limits::COMMAND_QUEUE_MAX`]): nothing was registered; register it again
    /// later, or from a thread of your own (which waits for room instead).
    Busy,
}

impl fmt::Display for RegisterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegisterError::ShutDown => write!(f, "the daemon is shut down"),
            RegisterError::Busy => write!(f, "the command channel is full; register again later"),
        }
    }
}

impl std::error::Error for RegisterError {}

/// Why [`crate::Handle::leave`] refused: nothing was done, the daemon runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaveError {
    /// Rank 0 cannot leave: a DVM ends with its rank 0 (`Handle::shutdown_dvm` ends it).
    Rank0,
    /// The daemon is not wired (or, rejoining, not yet settled): it has no place to leave.
    NotWired,
    /// The daemon is stopping, has stopped, or is already leaving.
    ShutDown,
}

impl fmt::Display for LeaveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaveError::Rank0 => write!(
                f,
                "rank 0 cannot leave: a DVM ends with its rank 0 (shut the DVM down instead)"
            ),
            LeaveError::NotWired => write!(f, "the daemon is not wired yet"),
            LeaveError::ShutDown => write!(f, "the daemon is stopping or already leaving"),
        }
    }
}

impl std::error::Error for LeaveError {}

/// Why a daemon could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration is invalid: a setting alone or with another, or interface settings
    /// that leave no address ([`ConfigError`](crate::config::ConfigError) names the setting).
    Config(crate::config::ConfigError),
    /// The job key could not be used: `key_file` unreadable, or a key of the wrong length.
    Key(crate::KeyError),
    /// No job key was given (neither `Config::key` nor `key_file`) and `insecure` is off.
    NoKey,
    /// Rank, size or radix do not describe a tree.
    Tree(crate::routed::TreeError),
    /// Rank 0's contact URI is missing (a non-zero rank needs it) or malformed.
    Hnp(String),
    /// A socket or the poller could not be set up.
    Io(std::io::Error),
    /// No rank or size where [`crate::launch::Placement`] looked (the launcher's
    /// environment), a rank not below the size, or a local DVM of 0 daemons.
    Placement(String),
    /// [`crate::launch::local_dvm`]: daemon `rank` was not wired within the wire-up timeout
    /// (`wireup_timeout_ms`, given in `waited_ms`). The daemons started are stopped.
    NotWired {
        /// The first rank found not wired.
        rank: crate::Rank,
        /// How long the DVM was waited for, in milliseconds.
        waited_ms: u64,
    },
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Config(e) => write!(f, "invalid configuration: {e}"),
            StartError::Key(e) => write!(f, "job key: {e}"),
            StartError::NoKey => write!(
                f,
                "no job key: set Config::key or key_file (Config::from_env reads TBON_KEY_FILE \
                 and TBON_KEY), or set insecure=true to run unauthenticated (`tbon keygen FILE` \
                 makes a key)"
            ),
            StartError::Tree(e) => write!(f, "invalid tree: {e}"),
            StartError::Hnp(e) => write!(f, "rank 0 contact: {e}"),
            StartError::Io(e) => write!(f, "I/O error: {e}"),
            StartError::Placement(e) => write!(f, "placement: {e}"),
            StartError::NotWired { rank, waited_ms } => write!(
                f,
                "rank {rank} was not wired within the wire-up timeout ({waited_ms} ms)"
            ),
        }
    }
}

impl std::error::Error for StartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StartError::Config(e) => Some(e),
            StartError::Key(e) => Some(e),
            StartError::Tree(e) => Some(e),
            StartError::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<crate::config::ConfigError> for StartError {
    fn from(e: crate::config::ConfigError) -> Self {
        StartError::Config(e)
    }
}

impl From<std::io::Error> for StartError {
    fn from(e: std::io::Error) -> Self {
        StartError::Io(e)
    }
}
