//! The commands ("caddies") that other threads hand to a daemon's loop thread, as PRRTE
//! thread-shifts every API call onto its progress thread.

use crate::error::SendError;
use crate::grpcomm::AllgatherResult;
use crate::rml::batch_frame::ItemRun;
use crate::rml::{Message, MessageRef, Peer, Tag};
use crate::routed::RecoveryStatus;
use crate::{Counters, Rank};
use bytes::Bytes;
use crossbeam_channel::Sender;

/// Called once on the loop thread when a send is finished: `Ok` once the frame was handed to the
/// kernel (or delivered locally), or for a reliable send once the destination posted it; an
/// error when it could not be carried.
pub type Completion = Box<dyn FnOnce(Result<(), SendError>) + Send + 'static>;

/// Called once on the loop thread when an allgather or barrier is over: the result (every
/// contribution ordered by rank, and the excluded, dead ranks), or why it could not take part.
pub type AllgatherCompletion = Box<dyn FnOnce(Result<AllgatherResult, SendError>) + Send + 'static>;

/// Called once on the loop thread with a data-exchange `get`'s answer.
pub type GetCompletion =
    Box<dyn FnOnce(Result<bytes::Bytes, crate::modex::GetError>) + Send + 'static>;

/// Called on the loop thread after every repair of the routing tree, once per scope.
pub type FaultHandler = Box<dyn FnMut(&RecoveryStatus) + Send + 'static>;

/// Called on the loop thread for every message a receive matches.
pub type RecvCallback = Box<dyn FnMut(Message) + Send + 'static>;

/// Called on the loop thread for every message a receive posted with `recv_ref` matches: the
/// message is lent for the call.
pub type RecvRefCallback = Box<dyn FnMut(&MessageRef<'_>) + Send + 'static>;

/// What a posted receive calls: with each message to keep, or with each message lent.
pub enum OnMessage {
    /// `Handle::recv` and everything built on it.
    Owned(RecvCallback),
    /// `Handle::recv_ref`.
    Lent(RecvRefCallback),
}

impl From<RecvCallback> for OnMessage {
    fn from(cb: RecvCallback) -> Self {
        OnMessage::Owned(cb)
    }
}

impl OnMessage {
    /// Calls the callback with `msg`.
    pub fn call(&mut self, msg: Message) {
        match self {
            OnMessage::Owned(cb) => cb(msg),
            OnMessage::Lent(cb) => cb(&MessageRef::of(&msg)),
        }
    }

    /// Calls the callback with every message of `run`, in order; whether any call asked for a
    /// pause (`ask_pause`).
    pub fn call_run(&mut self, run: &ItemRun) -> bool {
        match self {
            OnMessage::Owned(cb) => run.messages().for_each(cb),
            OnMessage::Lent(cb) => run.for_each_ref(cb),
        }
        // The request stays set until taken: asked during any call of the run, it is seen here.
        take_pause()
    }
}

thread_local! {
    /// Set by a receive's callback (on the loop thread) that wants no more matches: the loop
    /// cancels that receive right after the callback returns, before matching anything else.
    static PAUSE_ASKED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// From inside a receive's callback: cancel this receive as soon as the callback returns, so
/// that later messages wait in the unmatched list (a [`super::Subscription`] at its bound).
pub(crate) fn ask_pause() {
    PAUSE_ASKED.with(|p| p.set(true));
}

/// Whether the callback that just ran asked for [`ask_pause`]; clears the request.
pub(crate) fn take_pause() -> bool {
    PAUSE_ASKED.with(|p| p.replace(false))
}

/// Where a fetched stream's items go, on the loop thread: each with the digest its reader
/// must check (a chunk of a stream whose reader checks them, see `reader_reports`).
pub(crate) struct StreamSink {
    pub deliver:
        Box<dyn FnMut(super::StreamItem, Option<crate::stream::ChunkDigest>) + Send + 'static>,
    /// Whether the application reports the bytes it took itself (a [`super::Stream`]
    /// reader, which also checks each chunk's digest on its thread); otherwise a chunk
    /// counts as consumed once `deliver` returns (and was checked by the node).
    pub reader_reports: bool,
}

/// Fetch a stream: `command` is the node's `StreamCommand::Fetch` (its id the handle's,
/// unique per daemon), `sink` where its items go.
pub(crate) struct Fetch {
    pub command: crate::node::StreamCommand,
    pub id: u64,
    pub sink: StreamSink,
    pub reply: Reply,
}

/// A command's synchronous answer, when the caller waits for one.
pub(crate) type Reply = Option<Sender<Result<(), SendError>>>;

pub(crate) enum Caddy {
    Send {
        dst: Rank,
        tag: Tag,
        payload: Bytes,
        done: Option<Completion>,
        route: Option<crate::Route>,
    },
    /// Plain sends without completions, in order ([`super::Batch`]), packed by the caller into
    /// the units the loop sends (`rml::batch_frame`): `messages` messages of `bytes` payload
    /// bytes in all (what the gate admitted).
    SendBatch {
        units: Vec<crate::rml::batch_frame::Unit>,
        messages: usize,
        bytes: usize,
    },
    /// A reliable send (RELM): `done` runs once the destination has posted it.
    SendReliable {
        dst: Rank,
        tag: Tag,
        payload: Bytes,
        done: Option<Completion>,
    },
    Broadcast {
        tag: Tag,
        payload: Bytes,
        done: Option<Completion>,
    },
    /// This daemon's contribution to collective `id` (a barrier contributes nothing).
    Allgather {
        id: u64,
        data: Bytes,
        done: AllgatherCompletion,
    },
    /// This daemon's contribution to group collective `op` (its number already taken).
    Group {
        op: crate::grpcomm::GroupOp,
        data: Bytes,
        call: crate::node::GroupCall,
        done: AllgatherCompletion,
    },
    /// A fence of the data exchange (its number already taken).
    Fence {
        op: crate::grpcomm::GroupOp,
        mode: crate::node::FenceMode,
        done: AllgatherCompletion,
    },
    /// This daemon's committed data for a group (a blob, `modex::blob`).
    ModexCommit {
        group: crate::grpcomm::GroupId,
        blob: Bytes,
    },
    /// The job is over here: drop its data.
    ModexForget {
        group: crate::grpcomm::GroupId,
    },
    /// A data-exchange get.
    Get {
        group: crate::grpcomm::GroupId,
        rank: crate::Rank,
        key: String,
        done: GetCompletion,
    },
    /// `post` is the id `Handle` gave this post (unique per daemon, see `Shared::posted`).
    Recv {
        peer: Peer,
        tag: Tag,
        persistent: bool,
        callback: OnMessage,
        post: u64,
    },
    /// Cancel the receive for (peer, tag) if it is still post `post` (not one posted again
    /// since). `done`, if any, is answered afterwards, also by a stopping loop: from then on no
    /// match for that post can start.
    Cancel {
        peer: Peer,
        tag: Tag,
        post: u64,
        done: Option<Sender<()>>,
    },
    Purge {
        peer: Rank,
    },
    Counters(Sender<Counters>),
    /// Gather the status of this daemon's subtree ([`crate::status`]).
    Status {
        budget_ms: u32,
        all: bool,
        tx: Sender<Result<crate::status::Report, crate::status::StatusError>>,
    },
    OnFault(FaultHandler),
    /// Stop at once, as a crash would: no linger, no notices (tests and fault injection).
    Abort,
    /// Stop this daemon; with `dvm` (rank 0 only) first tell every daemon to stop.
    Shutdown {
        dvm: bool,
    },
    /// Offer a stream service.
    Serve {
        service: String,
        handler: std::sync::Arc<super::ServiceHandler>,
        reply: Reply,
    },
    /// Fetch a stream (boxed: the largest command, and a rare one).
    Fetch(Box<Fetch>),
    /// A producer's bytes, within the credit its writer saw, with their digest when they
    /// are one chunk the writer hashed.
    StreamWrite {
        consumer: Rank,
        id: u64,
        bytes: Bytes,
        digest: Option<crate::stream::ChunkDigest>,
    },
    /// A producer ends its stream: finished (`None`) or failed.
    StreamEnd {
        consumer: Rank,
        id: u64,
        failure: Option<(u32, String)>,
    },
    /// A reader took `n` more bytes of stream `id`.
    StreamConsumed {
        id: u64,
        n: u64,
    },
    /// A reader found the chunk of stream `id` at `offset` corrupt.
    StreamCorrupt {
        id: u64,
        offset: u64,
    },
    StreamCancel {
        id: u64,
    },
    /// Open a job for clients (`Handle::client_job`).
    ClientJob {
        job: crate::clients::JobId,
        key: [u8; 32],
        accept_from: Vec<crate::clients::JobId>,
        reply: Reply,
    },
    ClientJobClose {
        job: crate::clients::JobId,
    },
    /// Close a job and disconnect its clients (`Handle::client_job_end`).
    ClientJobEnd {
        job: crate::clients::JobId,
    },
    /// Leave the DVM in order (`Handle::leave`); the node's answer goes back on `reply`.
    Leave(Sender<Result<(), crate::error::LeaveError>>),
}
