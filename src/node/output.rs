//! What a [`Node`](super::Node) asks its driver to do, in the order it must be done.

use crate::Rank;
use crate::error::SendError;
use crate::grpcomm::AllgatherResult;
use crate::oob::header::Header;
use crate::oob::send_queue::Payload;
use crate::rml::batch_frame::ItemRun;
use crate::rml::{Message, ReceiveId, Tag};
use crate::routed::RecoveryStatus;
use bytes::Bytes;

/// The cause in the [`StopReason::RootLost`] a daemon stops with when it cannot reach rank 0
/// (or its parent) before wire-up completed. Compare with `==`: a launcher front end
/// (`tbon daemon`) acts on it (a URI file that may be stale).
pub const FATAL_RANK_0_UNREACHABLE: &str = "cannot reach rank 0";

/// The cause in the [`StopReason::RootLost`] a daemon stops with when rank 0 answered before
/// wire-up completed but never proved this daemon's job key (each side checks the other's): a
/// daemon started with another key than rank 0's. Compare with `==`.
pub const FATAL_RANK_0_WRONG_KEY: &str =
    "rank 0 answered but does not hold this daemon's job key (MAC mismatch)";

/// Why a daemon stopped, readable after it has ([`crate::Handle::wait_stopped`]; C:
/// `tbon_stop_reason`). Only `Requested`, `DvmShutdown` and `Left` are orderly ends
/// ([`StopReason::is_orderly`]); a supervisor should treat the others as this daemon's failure. More reasons may come (non-exhaustive).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopReason {
    /// A local shutdown request: `Handle::shutdown` on any rank, or `shutdown_dvm` (rank 0,
    /// which stops the DVM, reports this for itself; on another rank it only stops that one).
    Requested,
    /// Rank 0 told the DVM to stop (an orderly end of the whole DVM): every rank but 0.
    DvmShutdown,
    /// A local abort (`Handle::abort`): stopped at once, without the linger.
    Aborted,
    /// This daemon lost rank 0, or could not reach it (or its parent) during wire-up: without
    /// rank 0 the DVM cannot continue. The text is the cause (`"cannot reach rank 0"` when it
    /// was never reached, [`FATAL_RANK_0_WRONG_KEY`] when it answered with another job key).
    RootLost(String),
    /// The DVM declared this daemon dead (it was silent, unreachable or not reading for too
    /// long) and fenced it: it must not rejoin. The text says who told it.
    DeclaredDead(String),
    /// Anything else that stops a daemon (a contact table for another size, left out of
    /// wire-up, no table in time, the event loop failed, a callback panicked and unwound the
    /// loop thread, ...); the text says why.
    Fatal(String),
    /// This daemon left the DVM in order (`Handle::leave`): every living daemon knows it is
    /// gone, and none reported it as a failure.
    Left,
}

impl StopReason {
    /// Whether this is an orderly end (`Requested`, `DvmShutdown` or `Left`).
    pub fn is_orderly(&self) -> bool {
        matches!(
            self,
            StopReason::Requested | StopReason::DvmShutdown | StopReason::Left
        )
    }
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopReason::Requested => f.write_str("stopped on request"),
            StopReason::DvmShutdown => f.write_str("rank 0 shut the DVM down"),
            StopReason::Aborted => f.write_str("aborted"),
            StopReason::RootLost(why) => write!(f, "lost rank 0: {why}"),
            StopReason::DeclaredDead(why) => write!(f, "declared dead by the DVM: {why}"),
            StopReason::Fatal(why) => write!(f, "fatal: {why}"),
            StopReason::Left => f.write_str("left the DVM in order"),
        }
    }
}

/// One thing the driver must do. Outputs come out of [`Node::poll_output`](super::Node) in the
/// order the protocol needs them carried out; a driver that reorders them breaks per-link FIFO.
#[derive(Debug)]
pub enum Output {
    /// Queue this frame on the connection to neighbour `to` (dialling it if there is none).
    /// `token` is the sender's completion: complete it `Ok` once the frame reached the kernel,
    /// or with the error if it cannot be carried.
    Transmit {
        to: Rank,
        header: Header,
        payload: Payload,
        token: Option<u64>,
    },
    /// The contact of this rank, asked for with [`Node::want_contact`](super::Node), is known
    /// now: dial it if frames wait for it.
    ContactKnown(Rank),
    /// No contact of this rank can be had (rank 0 has none: the rank never reported, or it
    /// failed; or rank 0 left the lookups unanswered): treat the rank as unreachable.
    ContactUnknown(Rank),
    /// A heartbeat for neighbour `to`: send it only over a connection that is up (a missing
    /// one is being redialled, and silence is what the peer's monitor measures).
    Heartbeat { to: Rank, header: Header },
    /// These ranks failed: close their connections and give every frame still queued for them
    /// back through [`Node::reroute`](super::Node::reroute), with `adopted` (the children this
    /// repair gave this daemon), before carrying out the outputs that follow.
    PeersFailed { dead: Vec<Rank>, adopted: Vec<Rank> },
    /// The direct link to `peer` is no longer used: take every frame still queued for `peer`
    /// (on its connection, unless `peer` is a tree neighbour, and waiting for one), close that
    /// connection, and give the frames back through [`Node::reroute`](super::Node::reroute)
    /// (they take the tree now) before carrying out the outputs that follow. Do not redial
    /// `peer` for them.
    Fallback { peer: Rank },
    /// A posted receive matched `msg`; `retired` if that was a one-shot receive's only match.
    Deliver {
        receive: ReceiveId,
        retired: bool,
        msg: Message,
    },
    /// A posted persistent receive matched every message of `run`, consecutive items of one
    /// batch frame: call its callback once per message, in order (as for as many `Deliver`s).
    DeliverRun { receive: ReceiveId, run: ItemRun },
    /// The send, reliable send or broadcast with this token is over.
    SendDone {
        token: u64,
        result: Result<(), SendError>,
    },
    /// Collective `id` is over here (every result is reported, whoever waits for it).
    AllgatherDone {
        id: u64,
        result: Result<AllgatherResult, SendError>,
    },
    /// The group collective the driver gave `token` is over here: its result (`id` is the
    /// collective's number in its group), or why not.
    GroupDone {
        token: u64,
        result: Result<AllgatherResult, SendError>,
    },
    /// The data-exchange get the driver gave `token` is answered.
    GetDone {
        token: u64,
        result: Result<Bytes, crate::modex::GetError>,
    },
    /// The tree was repaired: run the user's fault handlers with this status (boxed: inline,
    /// its 160 bytes made every `Output`, a transmit included, that large).
    Repaired(Box<RecoveryStatus>),
    /// Wire-up is complete: this daemon knows the contact table.
    Wired,
    /// The daemon stops: flush what is queued (bounded linger), then close everything.
    Stop(StopReason),
    /// Observations for the simulator's checkers (only with `NodeConfig::trace`).
    Trace(Trace),
    /// A stream event for the application (`node/streams.rs`; boxed: a chunk's `Bytes` and a
    /// service name would make every `Output` larger).
    Stream(Box<super::StreamEvent>),
    /// Something for one of this daemon's client connections (`node/clients.rs`).
    Client(crate::clients::ClientEvent),
    /// The status query the driver started with this token ([`Node::handle_status`](super::Node::handle_status))
    /// is answered.
    Status {
        token: u64,
        report: Box<crate::status::Report>,
    },
}

/// What the simulator's checkers observe beyond the API's outputs.
#[derive(Debug, Clone)]
pub enum Trace {
    /// Broadcast operations `first` to `op` (one user or runtime broadcast: its parts) were
    /// delivered here, in order.
    Broadcast {
        first: u64,
        op: u64,
        originator: Rank,
        tag: Tag,
        payload: Bytes,
    },
    /// This daemon's broadcast with `token` finished: numbered `op` and delivered everywhere,
    /// or refused (`None`).
    BroadcastFinished { token: u64, op: Option<u64> },
}

/// Where a frame that was queued for a rank that failed goes now ([`Node::reroute`](super::Node::reroute)).
#[derive(Debug, PartialEq, Eq)]
pub enum Reroute {
    /// On to this neighbour (the header is unchanged but for the sender's stamp).
    Hop(Rank, Header),
    /// A copy to each of these neighbours (a flood the dead child never passed on).
    Copies(Vec<(Rank, Header)>),
    /// Nowhere: complete the sender with this error.
    Fail(SendError),
    /// Nowhere, and nobody waits for it (RELM and the collectives resend what matters).
    Drop,
}
