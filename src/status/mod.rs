//! The status of a live DVM, gathered in the tree (issue "Operating a live DVM"), sans-IO.
//!
//! # How a status is gathered
//! A daemon asked for a status (an operator's tool connected to it, or
//! [`crate::Handle::status`]) sends a `Query` to each of its children with a smaller time
//! budget than its own, and each child does the same for its subtree. A daemon answers its
//! asker once every child answered or its own budget ran out: with its own entry, its
//! children's answers, and a `NoAnswer` part for each child that did not answer in time (a
//! stuck or SIGSTOPped subtree costs the view one budget, never a stall). Nobody asks a daemon
//! twice, and rank 0 sends one message per child, not one per daemon: the view over `N`
//! daemons takes about the tree's depth times a hop's latency.
//!
//! # Bounded answers
//! A subtree in which every daemon is healthy (every child answered, no queue congested, the
//! DVM epoch and failed set agree with its parent's) is summarised in one [`Healthy`] part:
//! its root, its number of daemons, sums of its counters. Problem subtrees keep the detail of
//! the daemons on the way to the problem ([`DaemonStatus`]). With `all`, every daemon answers
//! in detail. Whatever is asked, an answer holds at most `limits::STATUS_PARTS_MAX` parts and
//! stays within the message size: a child's parts that would pass the bound are replaced by
//! one [`Part::Elided`] (its root and count), and the report says it was truncated.
//!
//! # Round trips
//! A daemon measures the round trip to each child by the query itself: the time from sending
//! the query to the answer, less the time the child held it (which the answer carries).
//!
//! # Clock offsets
//! The query and its answer are also a clock sample (NTP's four timestamps): the asker's wall
//! clock when it sent the query (`t1`), the child's when it arrived (`t2`) and when it answered
//! (`t3`), the asker's when the answer arrived (`t4`). The child's offset from its parent is
//! `((t2 - t1) + (t3 - t4)) / 2`, true within half the network round trip (the child's holding
//! time is left out), whatever the split of the delay between the two ways, provided each
//! receipt is timestamped no earlier and each send no later than it happens (the driver reads
//! the clock after a status frame arrived: `Node::handle_wall_clock`). A parent adds its
//! child's offset and bound to every offset the child's subtree reported, so each daemon in
//! detail carries its offset from the gathering daemon ([`DaemonStatus::clock_offset_ns`]).
//!
//! The messages are in [`wire`]; the per-daemon gathering state is [`gather`]; the node's side
//! is `node/status.rs`; the operator's tool (`tbon status`) connects with the operator
//! credential (`oob::handshake`, [`crate::Key::operator`]).

#[doc(hidden)]
pub mod gather;
pub mod view;
#[doc(hidden)]
pub mod wire;

pub use crate::driver::tool::{StatusOptions, query};
pub use crate::oob::uri::ContactUri;

use crate::Rank;
use crate::rml::Tag;

/// The runtime tag of status queries and answers between daemons, and between a tool and the
/// daemon it connected to.
pub const TAG_STATUS: Tag = 15;

/// Problems a daemon reports about itself ([`DaemonStatus::problems`]); a daemon with none is
/// healthy.
pub mod problem {
    /// At least one child did not answer within the budget (see the `NoAnswer` parts).
    pub const CHILD_SILENT: u32 = 1;
    /// A send queue towards a neighbour is congested (flow control holds reads back).
    pub const CONGESTED: u32 = 2;
    /// The daemon is stopping.
    pub const STOPPING: u32 = 4;
    /// Its DVM epoch or failed set differs from its parent's (a repair still spreading).
    pub const VIEW_DIFFERS: u32 = 8;
    /// Reliable messages wait here for a missing predecessor, or for acknowledgement beyond
    /// half the window.
    pub const RELM_BACKLOG: u32 = 16;
    /// Every problem's name, for text and JSON output.
    pub const NAMES: [(u32, &str); 5] = [
        (CHILD_SILENT, "child-silent"),
        (CONGESTED, "congested"),
        (STOPPING, "stopping"),
        (VIEW_DIFFERS, "view-differs"),
        (RELM_BACKLOG, "relm-backlog"),
    ];

    /// The names of the problems set in `bits`.
    pub fn names(bits: u32) -> Vec<&'static str> {
        NAMES
            .iter()
            .filter(|(b, _)| bits & b != 0)
            .map(|(_, n)| *n)
            .collect()
    }
}

/// One link of a daemon to a tree neighbour, as the daemon sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct LinkStatus {
    /// The neighbour this link leads to.
    pub peer: Rank,
    /// The round trip measured by this status query (children only; `None` for the parent and
    /// for a child that did not answer).
    pub rtt_us: Option<u32>,
    /// Bytes waiting in the send queue towards `peer` when last reported by the transport.
    pub queued_bytes: u64,
    /// The peer's address the link's connection uses (which of its networks), or `None`
    /// while it has none established.
    pub address: Option<std::net::SocketAddr>,
    /// Connections to `peer` closed as stalled and dialled again at another of its
    /// addresses (failovers) since this daemon started.
    pub failovers: u64,
}

/// A daemon's counters, as a status carries them (a subset of [`crate::Counters`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct StatusCounters {
    /// User messages originated here.
    pub sent: u64,
    /// User messages delivered here.
    pub delivered: u64,
    /// Frames relayed through here.
    pub relayed: u64,
    /// Bytes of stream data sent and received here.
    pub stream_bytes_sent: u64,
    /// Stream data bytes received here.
    pub stream_bytes_received: u64,
    /// RELM: originated and unacknowledged, cached for replay, early and held.
    pub relm_unacked: u64,
    /// RELM messages cached here for replay.
    pub relm_cached: u64,
    /// RELM messages held early here, waiting for a predecessor.
    pub relm_pending: u64,
    /// Streams produced and consumed here now.
    pub streams_producing: u64,
    /// Streams fetched here, open now.
    pub streams_consuming: u64,
    /// Direct links in use now.
    pub direct_links: u64,
    /// Connections closed for malformed or forged input.
    pub protocol_errors: u64,
    /// Repairs of the tree this daemon applied.
    pub repairs: u64,
}

impl StatusCounters {
    /// Adds `other` to these (sums for a summary; saturating).
    pub fn add(&mut self, o: &StatusCounters) {
        let pairs = [
            (&mut self.sent, o.sent),
            (&mut self.delivered, o.delivered),
            (&mut self.relayed, o.relayed),
            (&mut self.stream_bytes_sent, o.stream_bytes_sent),
            (&mut self.stream_bytes_received, o.stream_bytes_received),
            (&mut self.relm_unacked, o.relm_unacked),
            (&mut self.relm_cached, o.relm_cached),
            (&mut self.relm_pending, o.relm_pending),
            (&mut self.streams_producing, o.streams_producing),
            (&mut self.streams_consuming, o.streams_consuming),
            (&mut self.direct_links, o.direct_links),
            (&mut self.protocol_errors, o.protocol_errors),
            (&mut self.repairs, o.repairs),
        ];
        for (a, b) in pairs {
            *a = a.saturating_add(b);
        }
    }
}

/// One daemon in detail.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DaemonStatus {
    /// Its rank.
    pub rank: Rank,
    /// Its incarnation (boot epoch).
    pub incarnation: u64,
    /// The DVM epoch it has applied.
    pub epoch: u64,
    /// Its parent in the repaired tree (`None` for rank 0).
    pub parent: Option<Rank>,
    /// Its children in the repaired tree.
    pub children: Vec<Rank>,
    /// Its depth in the tree (rank 0: 0).
    pub depth: u32,
    /// Milliseconds since it started.
    pub uptime_ms: u64,
    /// How many ranks it knows have failed.
    pub failed_known: u32,
    /// [`problem`] bits; 0 when healthy.
    pub problems: u32,
    /// Its tree neighbours (children first, then the parent).
    pub links: Vec<LinkStatus>,
    /// Its counters.
    pub counters: StatusCounters,
    /// Its wall clock minus the gathering daemon's, in ns, measured hop by hop along the tree
    /// with the query's own timestamps (NTP's four-timestamp rule per hop, the offsets added
    /// up the path); `None` when a hop on the way had no clock sample.
    pub clock_offset_ns: Option<i64>,
    /// The true offset lies within `clock_offset_ns` ± this (half of each hop's network round
    /// trip, added up the path).
    pub clock_bound_ns: Option<u64>,
}

/// A healthy subtree in one part.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Healthy {
    /// The subtree's root.
    pub root: Rank,
    /// Daemons in it, the root included.
    pub daemons: u32,
    /// Levels below the root (0: the root alone).
    pub height: u32,
    /// The shortest uptime in it.
    pub uptime_ms_min: u64,
    /// The slowest round trip measured inside it, if any was.
    pub rtt_us_max: Option<u32>,
    /// Its counters, summed.
    pub counters: StatusCounters,
}

/// One part of an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(tag = "part", rename_all = "kebab-case"))]
#[non_exhaustive]
pub enum Part {
    /// A daemon in detail (its children come as parts of their own).
    Daemon(Box<DaemonStatus>),
    /// A whole healthy subtree.
    Healthy(Healthy),
    /// `rank`, a child of `parent`, did not answer within the budget: it and its subtree are
    /// not known (stuck, stopped, or the answer is on its way).
    NoAnswer {
        /// The silent daemon.
        rank: Rank,
        /// Its parent, which asked it.
        parent: Rank,
    },
    /// The subtree under `root` answered (`daemons` daemons), but its detail was dropped to
    /// keep the answer within its bound.
    Elided {
        /// The subtree's root.
        root: Rank,
        /// Daemons in it that answered.
        daemons: u32,
    },
}

impl Part {
    /// Daemons this part accounts for as having answered.
    pub fn daemons(&self) -> u32 {
        match self {
            Part::Daemon(_) => 1,
            Part::Healthy(h) => h.daemons,
            Part::NoAnswer { .. } => 0,
            Part::Elided { daemons, .. } => *daemons,
        }
    }
}

/// What a status query returns: the gathering daemon's view of the DVM (rank 0's is the
/// whole DVM; another daemon's covers its subtree).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Report {
    /// The daemon that gathered it.
    pub from: Rank,
    /// The DVM's size.
    pub size: u32,
    /// The DVM's radix.
    pub radix: u32,
    /// The DVM epoch at the gathering daemon.
    pub epoch: u64,
    /// The ranks the gathering daemon knows have failed, ascending (every rank not in the tree:
    /// the dead, and those below in `departed` and `absent`).
    pub failed: Vec<Rank>,
    /// Of `failed`, the ranks that left in order (`Handle::leave`) and have not come back,
    /// ascending: not a fault.
    pub departed: Vec<Rank>,
    /// Of `failed`, the ranks of a DVM started with room to grow that have never joined
    /// (`initial_size` and above, never admitted), ascending: not a fault.
    pub absent: Vec<Rank>,
    /// From the query's arrival to the answer, at the gathering daemon.
    pub elapsed_us: u64,
    /// Some detail was dropped to keep within the bound ([`Part::Elided`]).
    pub truncated: bool,
    /// The answer, part by part (daemons in detail, healthy subtrees, silent or elided ones), in tree order.
    pub parts: Vec<Part>,
}

/// Why a status query gave no report.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StatusError {
    /// The daemon refused the query: not wired up yet, stopping, or too many queries in
    /// progress (`limits::STATUS_LOCAL_MAX`); the text says which. Try again later.
    Refused(String),
    /// The daemon stopped (or the connection to it closed) before answering.
    ShutDown,
    /// Called from a receive or fault callback, which runs on the loop thread: the call would
    /// wait for that thread. Ask from another thread.
    InCallback,
    /// A tool: the daemon could not be reached (the text: the address and the error).
    Unreachable(String),
    /// A tool: the daemon refused the credential (wrong operator credential or job key, or
    /// another DVM).
    Credential(String),
    /// A tool: the daemon's answer broke the protocol.
    Protocol(String),
    /// A tool: no answer within the query's budget plus a margin.
    TimedOut,
    /// A bad argument (the text says which).
    Invalid(String),
}

impl std::fmt::Display for StatusError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StatusError::Refused(why) => write!(f, "the daemon refused the status query: {why}"),
            StatusError::ShutDown => f.write_str("the daemon stopped before answering"),
            StatusError::InCallback => {
                f.write_str("a status cannot be asked for from a callback (loop thread)")
            }
            StatusError::Unreachable(why) => write!(f, "cannot reach the daemon: {why}"),
            StatusError::Credential(why) => write!(f, "credential refused: {why}"),
            StatusError::Protocol(why) => write!(f, "protocol error: {why}"),
            StatusError::TimedOut => f.write_str("no answer in time"),
            StatusError::Invalid(why) => write!(f, "invalid argument: {why}"),
        }
    }
}

impl std::error::Error for StatusError {}

impl Report {
    /// Daemons the parts account for. While a repair moves a living daemon to another parent,
    /// both may have asked it, and it is counted twice; [`view::view`] counts each rank once.
    pub fn answered(&self) -> u32 {
        self.parts.iter().map(Part::daemons).sum()
    }
}
