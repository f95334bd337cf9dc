//! The thread-safe face of a daemon: [`Handle`] (cheap to clone, usable from any thread and from
//! callbacks) and [`Daemon`] (the owner: dropping it stops the daemon and joins its thread).
//!
//! Every call becomes a [`Caddy`] pushed onto the bounded command queue (`command_queue.rs`). The loop is woken with
//! a `mio::Waker` only when it is asleep in `poll` (the `asleep` flag), so a burst of commands, or
//! commands issued by callbacks on the loop thread, cost no wake-up system call.

use super::caddy::{AllgatherCompletion, Caddy, Completion, FaultHandler, OnMessage, RecvCallback};
use crate::Rank;
use crate::counters::Counters;
use crate::error::{RecvError, RegisterError, SendError};
use crate::grpcomm::AllgatherResult;
use crate::rml::{Message, Peer, RecvMode, TAG_USER_MIN, Tag};
use crate::routed::RecoveryStatus;
use bytes::Bytes;
use crossbeam_channel::Receiver;
use std::collections::HashMap;

/// What `Busy` names when a blocking call is made from a callback, on the loop thread.
use std::collections::hash_map::Entry;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use crate::node::StopReason;

/// A stop a callback asked for when the command queue had no room for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopRequest {
    Shutdown,
    ShutdownDvm,
    Abort,
}

#[derive(Default)]
pub(crate) struct Lifecycle {
    pub wired: bool,
    pub stopped: Option<StopReason>,
}

thread_local! {
    /// The daemon whose loop runs on this thread (`Shared::address`), or 0.
    static LOOP_OF: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// State shared between the loop thread and every handle.
pub(crate) struct Shared {
    pub commands: Arc<super::command_queue::CommandQueue>,
    pub waker: mio::Waker,
    /// True while the loop is (about to be) blocked in `poll` with an empty command channel.
    pub asleep: AtomicBool,
    pub wakeups: AtomicU64,
    pub rank: Rank,
    pub size: u32,
    pub msg_max_bytes: usize,
    pub uri: String,
    /// (peer, tag) pairs with a posted receive, each with the id of its post, so a duplicate
    /// post fails synchronously. The loop removes an entry when it retires a one-shot receive
    /// only if the id still matches ([`Shared::unpost`]): the user may have cancelled and
    /// posted the same pair again in the meantime.
    pub posted: Mutex<HashMap<(Peer, Tag), u64>>,
    /// The next post id (ids are never reused by a daemon).
    pub next_post: AtomicU64,
    /// The next id of a stream this daemon fetches (never reused).
    pub next_stream: AtomicU64,
    pub lifecycle: Mutex<Lifecycle>,
    pub lifecycle_cv: Condvar,
    /// Set with `lifecycle.stopped` (read on every submit: no lock).
    pub stopped: AtomicBool,
    /// A stop or abort a callback asked for when even the control reserve of the command queue
    /// was full ([`StopRequest`] as a number; 0 for none): read by the loop every turn.
    pub stop_request: std::sync::atomic::AtomicU8,
    pub join: Mutex<Option<JoinHandle<()>>>,
    /// The threads of service handlers (`Handle::serve`) that may still run: joined after the
    /// loop thread, so that no handler runs once a stop has returned (finished ones are
    /// dropped as new ones start: at most one per stream a handler still serves).
    pub handlers: Mutex<Vec<JoinHandle<()>>>,
    /// Destinations whose next hop is congested: sends to them are refused `Busy` here.
    pub gate: super::gate::OriginGate,
    /// The users' reliable sends against `relm_unacked_max`: refused `Busy` here when full.
    pub relm_window: super::relm_window::ReliableWindow,
    /// Buffers for the batch frames `send_batch` packs on the callers' threads.
    pub batch_pool: Arc<crate::buffer_pool::BufferPool>,
    /// Set once wire-up completed (read on every send before it: no lock).
    pub wired: AtomicBool,
    /// Commands that must wait for wire-up (sends to other daemons, broadcasts, allgathers)
    /// accepted before it, and their bound (`prewire_queue_max`): beyond it a call is refused
    /// `Busy` here, so that the loop never drops one the caller was told was sent.
    pub prewire_taken: AtomicUsize,
    pub prewire_max: usize,
    /// Group collectives called on this daemon and not yet ended (`GROUP_INFLIGHT_MAX`):
    /// checked when a call is made, before the call takes its number in its group.
    pub group_inflight: AtomicUsize,
    /// The data exchange's puts, by group, since the group was first used here (committed or
    /// not: a commit sends all of them); at most `MODEX_GROUPS_MAX` groups.
    pub modex_staged: Mutex<HashMap<crate::grpcomm::GroupId, crate::modex::blob::Staged>>,
    /// The client socket's path (`client_socket`), for the credentials `client_job` makes.
    pub client_socket: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish()
    }
}

/// Locks a mutex, ignoring poisoning: every critical section here leaves the data consistent,
/// and a panicking user callback must not take the daemon's bookkeeping down with it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// Whether the caller runs on this daemon's loop thread (a callback). Asked on every
    /// submit: a thread-local compare, where asking for the current thread's id cost an
    /// atomic increment and decrement of its handle.
    pub(crate) fn on_loop_thread(&self) -> bool {
        LOOP_OF.with(|l| l.get() == self.address())
    }

    /// Called once, by the loop thread when it starts.
    pub(crate) fn mark_loop_thread(&self) {
        LOOP_OF.with(|l| l.set(self.address()));
    }

    /// This daemon's identity within the process while it lives (it stays in one `Arc`).
    fn address(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    /// Hands a command to the loop. From the loop thread itself (callbacks) a full channel is
    /// `Busy` rather than a deadlock; other threads block until there is room (back-pressure).
    pub(crate) fn submit(&self, caddy: Caddy) -> Result<(), SendError> {
        self.submit_or_return(caddy).map_err(|(e, _)| e)
    }

    /// [`submit`](Self::submit), giving the command back when it was not taken (a batch's
    /// messages then stay the caller's).
    pub(crate) fn submit_or_return(&self, caddy: Caddy) -> Result<(), (SendError, Caddy)> {
        use super::command_queue::PushError;
        if self.is_stopped() {
            return Err((SendError::ShutDown, caddy));
        }
        let pushed = if self.on_loop_thread() {
            self.commands.try_push(caddy)
        } else {
            self.commands.push_waiting(caddy, || self.is_stopped())
        };
        match pushed {
            Ok(()) => {}
            Err(PushError::Full(c)) => {
                return Err((SendError::Busy(crate::error::Limit::CommandChannel), c));
            }
            Err(PushError::Closed(c)) => return Err((SendError::ShutDown, c)),
        }
        // A load first: the swap's write would pull the flag's line from the loop's processor
        // at every call, and the loop is awake through a burst. The queue's lock orders this
        // load after the loop's `asleep` store or the loop's emptiness check after the push.
        if self.asleep.load(Ordering::SeqCst) && self.asleep.swap(false, Ordering::SeqCst) {
            self.wakeups.fetch_add(1, Ordering::Relaxed);
            // A failed wake means the poller is gone, i.e. the loop is stopping; the command is
            // then failed by the loop's final drain.
            let _ = self.waker.wake();
        }
        Ok(())
    }

    /// Hands the loop a command whose caller cannot be told of a refusal (`cancel`, `purge`,
    /// `cancel_stream`, a stop): from a callback it may use `COMMAND_CONTROL_RESERVE` beyond the
    /// queue's bound; other threads wait for room as for any command. `Busy` only from a
    /// callback once the reserve is full too (the caller logs it, or sets a stop request).
    pub(crate) fn submit_control(&self, caddy: Caddy) -> Result<(), SendError> {
        use super::command_queue::PushError;
        if !self.on_loop_thread() {
            return self.submit(caddy);
        }
        if self.is_stopped() {
            return Err(SendError::ShutDown);
        }
        let reserve = crate::limits::COMMAND_CONTROL_RESERVE;
        match self.commands.try_push_control(caddy, reserve) {
            Ok(()) => Ok(()),
            Err(PushError::Full(_)) => Err(SendError::Busy(crate::error::Limit::CommandChannel)),
            Err(PushError::Closed(_)) => Err(SendError::ShutDown),
        }
    }

    /// Asks the loop to stop or abort, from a callback that found even the command queue's
    /// control reserve full: the loop reads the request every turn, after that turn's commands.
    pub(crate) fn request_stop(&self, request: StopRequest) {
        let code = match request {
            StopRequest::Shutdown => 1,
            StopRequest::ShutdownDvm => 2,
            StopRequest::Abort => 3,
        };
        // An abort is never weakened into a stop by a later request.
        self.stop_request.fetch_max(code, Ordering::AcqRel);
    }

    /// The stop or abort requested through [`Shared::request_stop`], once.
    pub(crate) fn take_stop_request(&self) -> Option<StopRequest> {
        match self.stop_request.swap(0, Ordering::AcqRel) {
            1 => Some(StopRequest::Shutdown),
            2 => Some(StopRequest::ShutdownDvm),
            3 => Some(StopRequest::Abort),
            _ => None,
        }
    }

    /// [`Shared::submit_control`] for a cancel, purge or stream cancel, which cannot report a
    /// refusal: one refused beyond the control reserve is logged as an error (a `ShutDown`
    /// needs nothing: the receive or stream goes with the daemon).
    pub(crate) fn submit_or_log(&self, caddy: Caddy) {
        if let Err(SendError::Busy(_)) = self.submit_control(caddy) {
            log::error!(
                "rank {}: a cancel or purge from a callback was dropped: the command queue and \
                 its control reserve ({} commands) are full",
                self.rank,
                crate::limits::COMMAND_CONTROL_RESERVE
            );
        }
    }

    /// Forgets the registration of (peer, tag) if it still belongs to post `post`; a newer post
    /// of the same pair keeps its own. Called when the receive is gone (retired, refused).
    pub(crate) fn unpost(&self, peer: Peer, tag: Tag, post: u64) {
        let mut posted = lock(&self.posted);
        if posted.get(&(peer, tag)) == Some(&post) {
            posted.remove(&(peer, tag));
        }
    }

    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Counts `n` commands that wait for wire-up, if the daemon is not wired yet; `Busy` (and
    /// nothing counted) if they would take the pre-wire-up queue past its bound.
    pub(crate) fn take_prewire(&self, n: usize) -> Result<(), SendError> {
        if n == 0 || self.wired.load(Ordering::Acquire) {
            return Ok(());
        }
        let before = self.prewire_taken.fetch_add(n, Ordering::AcqRel);
        if before.saturating_add(n) > self.prewire_max {
            self.prewire_taken.fetch_sub(n, Ordering::AcqRel);
            return Err(SendError::Busy(crate::error::Limit::PrewireQueue));
        }
        Ok(())
    }

    /// Gives back what [`Shared::take_prewire`] counted for commands that were not submitted.
    pub(crate) fn untake_prewire(&self, n: usize) {
        if n > 0 && !self.wired.load(Ordering::Acquire) {
            self.prewire_taken.fetch_sub(n, Ordering::AcqRel);
        }
    }

    pub(crate) fn set_wired(&self) {
        self.wired.store(true, Ordering::Release);
        lock(&self.lifecycle).wired = true;
        self.lifecycle_cv.notify_all();
    }

    pub(crate) fn set_stopped(&self, reason: StopReason) {
        let mut l = lock(&self.lifecycle);
        if l.stopped.is_none() {
            l.stopped = Some(reason);
        }
        self.stopped.store(true, Ordering::Release);
        drop(l);
        self.lifecycle_cv.notify_all();
    }

    /// Asks the loop to stop and, unless called on the loop thread, waits for its thread to end.
    fn stop_and_join(&self, dvm: bool) {
        // `ShutDown` is what we want; `Busy` (a callback, the queue full beyond its control
        // reserve) becomes a request the loop reads every turn.
        if let Err(SendError::Busy(_)) = self.submit_control(Caddy::Shutdown { dvm }) {
            self.request_stop(if dvm {
                StopRequest::ShutdownDvm
            } else {
                StopRequest::Shutdown
            });
            let _ = self.waker.wake();
        }
        self.join_loop();
    }

    /// Waits for the loop thread to end, then for the service handlers still running, unless
    /// called on the loop thread. A handler that stops its own daemon is not waited for.
    fn join_loop(&self) {
        if self.on_loop_thread() {
            return;
        }
        let handle = lock(&self.join).take();
        if let Some(h) = handle
            && h.join().is_err()
        {
            log::error!("rank {}: the loop thread panicked", self.rank);
        }
        // The loop has stopped every writer (`ShutDown`), so a handler returns soon unless its
        // own work holds it; the wait then is the application's, and the log says why.
        let handlers = std::mem::take(&mut *lock(&self.handlers));
        let me = std::thread::current().id();
        let grace = std::time::Instant::now()
            + std::time::Duration::from_millis(crate::limits::HANDLER_WAIT_LOG_MS);
        for h in handlers {
            if h.thread().id() == me {
                continue;
            }
            while !h.is_finished() && std::time::Instant::now() < grace {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            if !h.is_finished() {
                log::warn!(
                    "rank {}: stopping: waiting for a service handler to return (its writer \
                     fails ShutDown)",
                    self.rank
                );
            }
            if h.join().is_err() {
                log::warn!("rank {}: a service handler panicked", self.rank);
            }
        }
    }
}

/// A cheap, cloneable reference to a running daemon, usable from any thread, including from
/// receive and completion callbacks (which run on the daemon's loop thread).
///
/// A `Handle` does not keep the daemon alive: once the [`Daemon`] is dropped or
/// [`Handle::shutdown`] is called, every call returns a shut-down error.
#[derive(Clone)]
pub struct Handle {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("rank", &self.shared.rank)
            .field("size", &self.shared.size)
            .finish()
    }
}

impl Handle {
    /// This daemon's rank.
    pub fn rank(&self) -> Rank {
        self.shared.rank
    }

    /// The number of daemons in the DVM.
    pub fn size(&self) -> u32 {
        self.shared.size
    }

    /// The largest payload this daemon sends or accepts (`msg_max_bytes`): a larger send is
    /// refused with [`SendError::TooLarge`](crate::SendError::TooLarge).
    pub fn msg_max_bytes(&self) -> usize {
        self.shared.msg_max_bytes
    }

    /// This daemon's contact URI (`<dvm_id>.<rank>;tcp://addr,...:port`). Rank 0's is the one
    /// other daemons need to join.
    pub fn contact_uri(&self) -> &str {
        &self.shared.uri
    }

    /// The addresses this daemon listens on and publishes, one per interface address its
    /// `if_include`/`if_exclude`/`ipv4`/`ipv6` settings allow, all on one port, in its contact
    /// URI's order (a peer dials them in turn, one per attempt). On a node with several
    /// networks, that is one per network.
    pub fn addresses(&self) -> Vec<std::net::SocketAddr> {
        self.shared
            .uri
            .parse::<crate::oob::uri::ContactUri>()
            .map(|u| u.addrs)
            .unwrap_or_default()
    }

    /// Flow control at the origin: a send whose next hop is congested is refused at once, and
    /// so is one that would put more than its share of bytes in the command channel. On `Ok`
    /// the bytes are reserved: the caller submits the send or gives them back.
    fn check_gate(&self, dst: Rank, len: usize) -> Result<(), SendError> {
        if self.shared.gate.refuses(dst) {
            return Err(SendError::Busy(crate::error::Limit::NextHopQueue));
        }
        if !self.shared.gate.admit_bytes(len) {
            return Err(SendError::Busy(crate::error::Limit::CommandChannel));
        }
        Ok(())
    }

    fn check_send(&self, dst: Rank, tag: Tag, payload: &Bytes) -> Result<(), SendError> {
        if tag < TAG_USER_MIN {
            return Err(SendError::ReservedTag(tag));
        }
        if dst >= self.shared.size {
            return Err(SendError::RankOutOfRange {
                rank: dst,
                size: self.shared.size,
            });
        }
        if payload.len() > self.shared.msg_max_bytes {
            return Err(SendError::TooLarge {
                len: payload.len(),
                max: self.shared.msg_max_bytes,
            });
        }
        Ok(())
    }

    /// Sends `payload` to `dst` with `tag`, without waiting. Argument errors are returned at
    /// once, and so is `Busy` while the send queue towards `dst`'s next hop is congested (flow
    /// control: offer the message again later, with back-off; nothing was queued). Errors the
    /// DVM meets later (destination failed, unreachable, shut down) are only logged and
    /// counted — use [`Handle::send_with`] to see them. The payload is shared, never copied,
    /// on its way through this daemon.
    pub fn send(&self, dst: Rank, tag: Tag, payload: impl Into<Bytes>) -> Result<(), SendError> {
        self.submit_send(dst, tag, payload.into(), None, Kind::Plain(None))
    }

    /// Like [`Handle::send`], and calls `done` once on the loop thread: `Ok` when the message
    /// was handed to the kernel on the first hop (or delivered, for a self-send), otherwise the
    /// error. If this returns an error, `done` is not called.
    pub fn send_with(
        &self,
        dst: Rank,
        tag: Tag,
        payload: impl Into<Bytes>,
        done: impl FnOnce(Result<(), SendError>) + Send + 'static,
    ) -> Result<(), SendError> {
        self.submit_send(
            dst,
            tag,
            payload.into(),
            Some(Box::new(done)),
            Kind::Plain(None),
        )
    }

    /// Like [`Handle::send`], with `route` overriding this daemon's `route` setting for the
    /// decision whether to ask `dst` for a direct link ([`crate::Route`]): `Route::Direct`
    /// asks for one (unless a recent denial is cached), `Route::Tree` does not. The message
    /// itself takes an open direct link if there is one and the tree otherwise, so it never
    /// overtakes an earlier message to `dst`. Errors as for [`Handle::send`].
    pub fn send_routed(
        &self,
        dst: Rank,
        tag: Tag,
        payload: impl Into<Bytes>,
        route: crate::Route,
    ) -> Result<(), SendError> {
        self.submit_send(dst, tag, payload.into(), None, Kind::Plain(Some(route)))
    }

    /// [`Handle::send_routed`] with a completion, as [`Handle::send_with`] has.
    pub fn send_routed_with(
        &self,
        dst: Rank,
        tag: Tag,
        payload: impl Into<Bytes>,
        route: crate::Route,
        done: impl FnOnce(Result<(), SendError>) + Send + 'static,
    ) -> Result<(), SendError> {
        self.submit_send(
            dst,
            tag,
            payload.into(),
            Some(Box::new(done)),
            Kind::Plain(Some(route)),
        )
    }

    /// Sends and blocks until the send completed (see [`Handle::send_with`]). From a callback
    /// it returns `Busy` at once and sends nothing: it would wait for the loop thread it runs
    /// on (use [`Handle::send_with`] there).
    pub fn send_wait(
        &self,
        dst: Rank,
        tag: Tag,
        payload: impl Into<Bytes>,
    ) -> Result<(), SendError> {
        self.not_on_loop_thread()?;
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.send_with(dst, tag, payload, move |r| {
            let _ = tx.send(r);
        })?;
        rx.recv().unwrap_or(Err(SendError::ShutDown))
    }

    /// Checks the arguments and the origin gate, then hands the send to the loop.
    fn submit_send(
        &self,
        dst: Rank,
        tag: Tag,
        payload: Bytes,
        done: Option<Completion>,
        kind: Kind,
    ) -> Result<(), SendError> {
        self.check_send(dst, tag, &payload)?;
        // RELM's window: a reliable send to another daemon is refused here rather than by
        // RELM after the caller was told it was sent (`relm_window.rs`).
        let windowed = matches!(kind, Kind::Reliable) && dst != self.shared.rank;
        if windowed && !self.shared.relm_window.admit() {
            return Err(SendError::Busy(crate::error::Limit::ReliableWindow));
        }
        let unadmit = || {
            if windowed {
                self.shared.relm_window.unadmit();
            }
        };
        self.check_gate(dst, payload.len())
            .inspect_err(|_| unadmit())?;
        let len = payload.len();
        let waits = usize::from(dst != self.shared.rank);
        if let Err(e) = self.shared.take_prewire(waits) {
            self.shared.gate.taken(len);
            unadmit();
            return Err(e);
        }
        let caddy = match kind {
            Kind::Reliable => Caddy::SendReliable {
                dst,
                tag,
                payload,
                done,
            },
            Kind::Plain(route) => Caddy::Send {
                dst,
                tag,
                payload,
                done,
                route,
            },
        };
        self.shared.submit(caddy).inspect_err(|_| {
            self.shared.gate.taken(len);
            self.shared.untake_prewire(waits);
            unadmit();
        })
    }

    /// Sends the messages of `batch` as plain sends, without waiting, handed to the loop as one
    /// command (for many small messages: one channel operation and at most one wake-up for the
    /// whole batch). Messages leave the batch as they are sent.
    ///
    /// `Ok`: every message was sent and the batch is empty. `Busy`: flow control refused the
    /// first message still in the batch (its next hop is congested), or the command channel
    /// holds too many bytes (one call takes at most its byte share, about 16 MiB, unless one
    /// message is larger), or, from a callback, the channel is full; the messages before it
    /// were sent, it and those after it were not
    /// (offer the batch again later, with back-off: messages to one destination stay in
    /// order). An argument error (`ReservedTag`, `RankOutOfRange`, `TooLarge` for any message)
    /// sends nothing and leaves the batch as it was (the error does not say which message:
    /// `pending` lists them; fix or `clear` it).
    /// As for [`Handle::send`], errors the DVM meets later are only logged and counted.
    pub fn send_batch(&self, batch: &mut super::Batch) -> Result<(), SendError> {
        if batch.msgs.is_empty() {
            return Ok(());
        }
        // One pass: every message's arguments are checked (an error sends nothing), and the
        // prefix that may go is measured: up to the first destination the gate refuses, and
        // no more payload bytes than the command channel's share (at least one message), so
        // that a batch of large messages cannot carry a send queue past its bound.
        let share = self.shared.gate.bytes_share();
        let me = self.shared.rank;
        let (mut open, mut len, mut waits) = (0usize, 0usize, 0usize);
        let (mut closed, mut refused) = (false, false);
        for m in &batch.msgs {
            self.check_send(m.dst, m.tag, &m.payload)?;
            if closed {
                continue;
            }
            if self.shared.gate.refuses(m.dst) {
                (closed, refused) = (true, true);
                continue;
            }
            if open > 0 && len.saturating_add(m.payload.len()) > share {
                closed = true;
                continue;
            }
            open += 1;
            len = len.saturating_add(m.payload.len());
            waits += usize::from(m.dst != me);
        }
        if open > 0 {
            self.shared.take_prewire(waits)?;
            if !self.shared.gate.admit_bytes(len) {
                self.shared.untake_prewire(waits);
                return Err(SendError::Busy(crate::error::Limit::CommandChannel));
            }
            // Packed here, on the caller's thread, into the frames the loop sends: the loop
            // then handles a frame per run instead of a message each, and a small payload is
            // copied into its frame and let go on the thread that made it.
            let mut units = Vec::new();
            crate::rml::batch_frame::pack_all(
                Some(&self.shared.batch_pool),
                self.shared.msg_max_bytes as u64,
                batch.msgs.get(..open).unwrap_or_default(),
                |m| (m.dst, m.tag, &m.payload, m.dst != me),
                |u| units.push(u),
            );
            let caddy = Caddy::SendBatch {
                units,
                messages: open,
                bytes: len,
            };
            if let Err((e, _)) = self.shared.submit_or_return(caddy) {
                self.shared.gate.taken(len);
                self.shared.untake_prewire(waits);
                // Not taken: the messages stay the caller's, in order, ahead of the rest.
                return Err(e);
            }
            batch.msgs.drain(..open);
        }
        match (batch.msgs.is_empty(), refused) {
            (true, _) => Ok(()),
            (false, true) => Err(SendError::Busy(crate::error::Limit::NextHopQueue)),
            (false, false) => Err(SendError::Busy(crate::error::Limit::CommandChannel)),
        }
    }

    /// Sends `payload` to `dst` with `tag` reliably (RELM), without waiting: the message
    /// reaches `dst`'s receive matching exactly once, and in order with the other reliable
    /// messages from this daemon to `dst`, even while daemons on its path die and the tree is
    /// repaired. The errors of [`Handle::send`] are returned at once (arguments, and `Busy`
    /// for a congested next hop, or, from a callback, a full command channel; another thread
    /// blocks until the channel has room), and so is
    /// `Busy(Limit::ReliableWindow)` when `relm_unacked_max` reliable messages of this
    /// daemon's callers are still unacknowledged: nothing was sent; the window frees as
    /// acknowledgements come back (about a round trip), so offer it again after a short
    /// back-off rather than in a tight loop. Once this returned `Ok` the message is never
    /// refused for the window or for flow control (unlike [`Handle::send_reliable_with`]'s,
    /// which the loop checks against flow control once more); what can still end it undelivered (the
    /// destination died first, this daemon stopped) is only logged and counted — use
    /// [`Handle::send_reliable_with`] to see it. Reliable and plain messages are not
    /// ordered with respect to each other.
    pub fn send_reliable(
        &self,
        dst: Rank,
        tag: Tag,
        payload: impl Into<Bytes>,
    ) -> Result<(), SendError> {
        self.submit_send(dst, tag, payload.into(), None, Kind::Reliable)
    }

    /// Like [`Handle::send_reliable`], and calls `done` once on the loop thread: `Ok` when
    /// `dst` has posted the message (delivered to a receive, or held for one); `NodeDown(dst)`
    /// if `dst` died first; `Busy` if the next hop became congested between the call and the
    /// moment the loop took it (flow control checks once more there, so that a caller who
    /// waits for completions offers it again rather than letting it queue; the full reliable
    /// window is refused at the call instead); `ShutDown` if this
    /// daemon stops first; `Unreachable` after
    /// `limits::RELM_RETRANSMITS_MAX` unanswered retransmissions. A reliable send to this
    /// daemon itself is posted locally and completes `Ok`. If this returns an error, `done` is
    /// not called.
    pub fn send_reliable_with(
        &self,
        dst: Rank,
        tag: Tag,
        payload: impl Into<Bytes>,
        done: impl FnOnce(Result<(), SendError>) + Send + 'static,
    ) -> Result<(), SendError> {
        self.submit_send(
            dst,
            tag,
            payload.into(),
            Some(Box::new(done)),
            Kind::Reliable,
        )
    }

    /// Sends reliably and blocks until the send completed (see
    /// [`Handle::send_reliable_with`]) or `timeout` passed (`TimedOut`: the message is not
    /// withdrawn and may still arrive). From a callback it returns `Busy` at once and sends
    /// nothing: it would wait for the loop thread it runs on.
    pub fn send_reliable_wait(
        &self,
        dst: Rank,
        tag: Tag,
        payload: impl Into<Bytes>,
        timeout: Duration,
    ) -> Result<(), SendError> {
        self.not_on_loop_thread()?;
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.send_reliable_with(dst, tag, payload, move |r| {
            let _ = tx.send(r);
        })?;
        match rx.recv_timeout(timeout) {
            Ok(r) => r,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => Err(SendError::TimedOut),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(SendError::ShutDown),
        }
    }

    /// Broadcasts `payload` with `tag` to every living daemon, this one included: the
    /// fault-tolerant broadcast (PRRTE's xcast). Any daemon may broadcast; rank 0
    /// numbers the operations, and every living daemon delivers every operation exactly once,
    /// in the same operation order, even while daemons die and the tree is repaired. Broadcasts
    /// of one originator keep their order. The payload is shared down the tree, never copied
    /// per child (from a non-zero rank it is copied once, into the request to rank 0). A
    /// payload above rank 0's `bcast_part_bytes` setting (256 KiB) goes down the tree in parts
    /// that every daemon forwards as they arrive (pipelined, instead of stored and forwarded
    /// whole at each level); every daemon still delivers it whole, once (copying the parts
    /// into one buffer).
    ///
    /// Argument errors are returned at once: a reserved tag, or a payload above
    /// [`Handle::broadcast_max`] (`TooLarge`); before wire-up, `Busy` beyond
    /// `prewire_queue_max`. A broadcast can also be refused later, in the loop (rank 0's window
    /// full, or this daemon's outstanding broadcasts at their bound): only
    /// [`Handle::broadcast_with`] tells you, so use it when every broadcast must go out.
    /// Delivered broadcasts go to receive matching like messages from the originator
    /// (`Message::origin`).
    pub fn broadcast(&self, tag: Tag, payload: impl Into<Bytes>) -> Result<(), SendError> {
        self.submit_broadcast(tag, payload.into(), None)
    }

    /// [`Handle::broadcast`] with a completion: `done` runs once on the loop thread, `Ok` once
    /// every daemon living in rank 0's view has delivered it; `Busy` if rank 0's window was
    /// full (`limits::XCAST_INFLIGHT_MAX` operations or `XCAST_INFLIGHT_MAX_BYTES` in flight)
    /// or this daemon has `XCAST_ORIGINATE_MAX` broadcasts outstanding: nothing was
    /// broadcast, offer it again later; `ShutDown` if this daemon stops first. Errors returned
    /// at once are those of `broadcast`; then `done` is not called.
    pub fn broadcast_with(
        &self,
        tag: Tag,
        payload: impl Into<Bytes>,
        done: impl FnOnce(Result<(), SendError>) + Send + 'static,
    ) -> Result<(), SendError> {
        self.submit_broadcast(tag, payload.into(), Some(Box::new(done)))
    }

    fn submit_broadcast(
        &self,
        tag: Tag,
        payload: Bytes,
        done: Option<Completion>,
    ) -> Result<(), SendError> {
        self.check_send(0, tag, &payload)?;
        let max = self.broadcast_max();
        if payload.len() > max {
            return Err(SendError::TooLarge {
                len: payload.len(),
                max,
            });
        }
        self.shared.take_prewire(1)?;
        self.shared
            .submit(Caddy::Broadcast { tag, payload, done })
            .inspect_err(|_| self.shared.untake_prewire(1))
    }

    /// The largest broadcast payload: `msg_max_bytes` less the 29 bytes a broadcast operation
    /// adds, and at most `limits::XCAST_INFLIGHT_MAX_BYTES`.
    pub fn broadcast_max(&self) -> usize {
        crate::node::broadcast_max(self.shared.msg_max_bytes)
    }

    /// Contributes `contribution` to the allgather `id`, without waiting. Every living daemon
    /// must contribute once to each collective; several may be in flight, each with its own
    /// caller-chosen id, which must never be reused (nor shared with a barrier). Faults are
    /// tolerated: a daemon that dies before its contribution reached the tree is excluded.
    /// A daemon that returns (rejoins, or joins a DVM started with room to grow) is not waited
    /// for by the collectives in flight at its return (the result lists it as excluded unless
    /// its new contribution got in first); those started after include it. If its application
    /// calls a collective that finished before, `done` gets that result, or `ResultLost` when
    /// no daemon it can ask still has it.
    ///
    /// `done` runs once on the loop thread with the result: every contribution ordered by rank
    /// ([`AllgatherResult::contributions`], [`AllgatherResult::get`]) and the excluded (dead)
    /// ranks ([`AllgatherResult::excluded`]); every daemon gets the same result. If the
    /// gathered bytes exceed `limits::ALLGATHER_MAX_BYTES` somewhere, the result has
    /// `overflowed` set and no contributions. Errors passed to `done`: `DuplicateId` (this
    /// daemon already used `id`), `Busy` (`limits::ALLGATHER_INFLIGHT_MAX` collectives in
    /// flight here), `ResultLost` (above), `ShutDown`. Returned at once: `TooLarge` (a contribution above
    /// `ALLGATHER_MAX_BYTES` less 8), `ShutDown`; then `done` is not called.
    pub fn allgather(
        &self,
        id: u64,
        contribution: impl Into<Bytes>,
        done: impl FnOnce(Result<AllgatherResult, SendError>) + Send + 'static,
    ) -> Result<(), SendError> {
        let data = contribution.into();
        let max = crate::limits::ALLGATHER_MAX_BYTES - 8;
        if data.len() > max {
            return Err(SendError::TooLarge {
                len: data.len(),
                max,
            });
        }
        let done: AllgatherCompletion = Box::new(done);
        self.shared.take_prewire(1)?;
        self.shared
            .submit(Caddy::Allgather { id, data, done })
            .inspect_err(|_| self.shared.untake_prewire(1))
    }

    /// [`Handle::allgather`], blocking until the result arrived or `timeout` passed
    /// (`TimedOut`: the contribution stands and the collective goes on). From a callback it
    /// returns `Busy` at once and contributes nothing.
    pub fn allgather_wait(
        &self,
        id: u64,
        contribution: impl Into<Bytes>,
        timeout: Duration,
    ) -> Result<AllgatherResult, SendError> {
        self.not_on_loop_thread()?;
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.allgather(id, contribution, move |r| {
            let _ = tx.send(r);
        })?;
        wait_result(&rx, timeout)
    }

    /// A barrier: an allgather of empty contributions (same ids, same rules). `done` runs once
    /// every living daemon has entered barrier `id`; the result names the excluded (dead)
    /// ranks.
    pub fn barrier(
        &self,
        id: u64,
        done: impl FnOnce(Result<AllgatherResult, SendError>) + Send + 'static,
    ) -> Result<(), SendError> {
        self.allgather(id, Bytes::new(), done)
    }

    /// [`Handle::barrier`], blocking until every living daemon entered it or `timeout` passed
    /// (`TimedOut`). From a callback it returns `Busy` at once and enters nothing.
    pub fn barrier_wait(&self, id: u64, timeout: Duration) -> Result<AllgatherResult, SendError> {
        self.allgather_wait(id, Bytes::new(), timeout)
    }

    fn check_recv(&self, peer: Peer, tag: Tag) -> Result<(), RecvError> {
        if tag < TAG_USER_MIN {
            return Err(RecvError::ReservedTag(tag));
        }
        if let Peer::Rank(r) = peer
            && r >= self.shared.size
        {
            return Err(RecvError::RankOutOfRange {
                rank: r,
                size: self.shared.size,
            });
        }
        Ok(())
    }

    /// Posts a receive for messages from `peer` (or [`Peer::Any`]) with `tag`. `callback` runs on
    /// the loop thread for each match (once for [`RecvMode::Once`], until cancelled for
    /// [`RecvMode::Persistent`]); keep it short and never block in it. For messages on a
    /// thread of your own, use [`Handle::subscribe`] or [`Handle::recv_blocking`]. Messages that arrived before the post are held and matched now, in
    /// arrival order. A receive for (Rank(r), tag) wins over one for (Any, tag).
    ///
    /// Errors: a reserved tag, an out-of-range peer, or a receive already posted for exactly the
    /// same (peer, tag) (PRRTE aborts there; we refuse the second post).
    pub fn recv(
        &self,
        peer: Peer,
        tag: Tag,
        mode: RecvMode,
        callback: impl FnMut(Message) + Send + 'static,
    ) -> Result<(), RecvError> {
        let callback: RecvCallback = Box::new(callback);
        self.post(peer, tag, mode.is_persistent(), callback)
            .map(|_| ())
    }

    /// [`Handle::recv`] with each message lent to `callback` for the call
    /// ([`MessageRef`](crate::MessageRef): the payload borrowed from the frame it arrived in),
    /// instead of handed over. For receivers of many small messages that read each where it
    /// lies: delivering a lent message touches no reference count, which is a large part of
    /// what a 64-byte message costs the receiving daemon. Keep a message past the call by
    /// copying its payload, or with [`MessageRef::to_message`](crate::MessageRef::to_message)
    /// (no copy, but it keeps the whole frame it came in alive, up to 32 KiB for a batch). Same matching, order, modes, errors and pausing rules as [`Handle::recv`]; C's
    /// `tbon_recv` delivers this way.
    pub fn recv_ref(
        &self,
        peer: Peer,
        tag: Tag,
        mode: RecvMode,
        callback: impl FnMut(&crate::MessageRef<'_>) + Send + 'static,
    ) -> Result<(), RecvError> {
        let callback = OnMessage::Lent(Box::new(callback));
        self.post(peer, tag, mode.is_persistent(), callback)
            .map(|_| ())
    }

    /// [`Handle::recv`], returning the id of the post.
    pub(super) fn post(
        &self,
        peer: Peer,
        tag: Tag,
        persistent: bool,
        callback: impl Into<OnMessage>,
    ) -> Result<u64, RecvError> {
        self.check_recv(peer, tag)?;
        let post = self.shared.next_post.fetch_add(1, Ordering::Relaxed);
        match lock(&self.shared.posted).entry((peer, tag)) {
            Entry::Occupied(_) => return Err(RecvError::Duplicate),
            Entry::Vacant(v) => {
                v.insert(post);
            }
        }
        let res = self.shared.submit(Caddy::Recv {
            peer,
            tag,
            persistent,
            callback: callback.into(),
            post,
        });
        if res.is_err() {
            self.shared.unpost(peer, tag, post);
            return Err(RecvError::ShutDown);
        }
        Ok(post)
    }

    /// Waits up to `timeout` for one message from `peer` with `tag` (a one-shot receive), for
    /// callers that would rather block than use callbacks. From a callback it returns
    /// [`RecvError::InCallback`] at once and posts nothing.
    ///
    /// No message is lost at the timeout: the receive is cancelled synchronously, and a message
    /// it matched before the cancel is returned (so the call may return shortly after
    /// `timeout`); otherwise `TimedOut`, and a later message stays for the next receive.
    /// `ShutDown` if the daemon stopped first. Errors of [`Handle::recv`] are returned at once.
    pub fn recv_blocking(
        &self,
        peer: Peer,
        tag: Tag,
        timeout: Duration,
    ) -> Result<Message, RecvError> {
        if self.shared.on_loop_thread() {
            return Err(RecvError::InCallback);
        }
        let (tx, rx) = crossbeam_channel::bounded(1);
        let callback: RecvCallback = Box::new(move |m| {
            let _ = tx.send(m);
        });
        let post = self.post(peer, tag, false, callback)?;
        match rx.recv_timeout(timeout) {
            Ok(m) => Ok(m),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                self.withdraw(peer, tag, post, &rx)
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(RecvError::ShutDown),
        }
    }

    /// After [`Handle::recv_blocking`] timed out: takes its one-shot receive `post` back, or
    /// returns the message it matched. The receive's callback owns the only sender of `rx`, and
    /// the loop drops the callback once the receive is gone (matched, cancelled, refused or the
    /// loop ended), so a blocking `rx.recv()` here ends promptly.
    fn withdraw(
        &self,
        peer: Peer,
        tag: Tag,
        post: u64,
        rx: &Receiver<Message>,
    ) -> Result<Message, RecvError> {
        let ours = {
            let mut posted = lock(&self.shared.posted);
            let ours = posted.get(&(peer, tag)) == Some(&post);
            if ours {
                posted.remove(&(peer, tag));
            }
            ours
        };
        if self.shared.on_loop_thread() {
            // Misuse (called from a callback): the loop cannot run while we hold its thread, so
            // waiting for it would deadlock. Cancel asynchronously, as best we can.
            if ours {
                self.shared.submit_or_log(Caddy::Cancel {
                    peer,
                    tag,
                    post,
                    done: None,
                });
            }
            return rx.try_recv().map_err(|_| RecvError::TimedOut);
        }
        if !ours {
            // The loop retired the receive (it matched: the callback runs right after) or it
            // was cancelled or purged by another call: wait for the message or the drop.
            return rx.recv().map_err(|_| RecvError::TimedOut);
        }
        let (done, answered) = crossbeam_channel::bounded(1);
        let cancel = Caddy::Cancel {
            peer,
            tag,
            post,
            done: Some(done),
        };
        if self.shared.submit(cancel).is_err() {
            // Stopping: the loop may still match until it ends, then drops the callback.
            return rx.recv().map_err(|_| RecvError::ShutDown);
        }
        // Answered once the loop has cancelled the receive, or found that it matched already;
        // a loop that ends first drops the command, which ends the wait as well.
        let _ = answered.recv();
        rx.try_recv().map_err(|_| RecvError::TimedOut)
    }

    /// Cancels the receive posted for exactly (peer, tag); does nothing if there is none (a
    /// one-shot receive that already matched is gone). Asynchronous: a message the loop matches
    /// before it handles the cancel still goes to the callback. Once this returns, the same
    /// (peer, tag) may be posted again, and that new receive is never affected by this cancel.
    pub fn cancel(&self, peer: Peer, tag: Tag) {
        let post = lock(&self.shared.posted).remove(&(peer, tag));
        if let Some(post) = post {
            self.shared.submit_or_log(Caddy::Cancel {
                peer,
                tag,
                post,
                done: None,
            });
        }
    }

    /// Cancels the receive `post` for (peer, tag) if it is still this one's; `false` when the
    /// command could not be handed to the loop (a full channel, from a callback).
    pub(super) fn cancel_post(&self, peer: Peer, tag: Tag, post: u64) -> bool {
        {
            let mut posted = lock(&self.shared.posted);
            if posted.get(&(peer, tag)) == Some(&post) {
                posted.remove(&(peer, tag));
            }
        }
        self.shared
            .submit(Caddy::Cancel {
                peer,
                tag,
                post,
                done: None,
            })
            .is_ok()
    }

    /// Drops every receive posted for `peer` and every held message from it.
    pub fn purge(&self, peer: Rank) {
        lock(&self.shared.posted).retain(|(p, _), _| *p != Peer::Rank(peer));
        self.shared.submit_or_log(Caddy::Purge { peer });
    }

    /// A snapshot of this daemon's counters. Blocks for a round trip to the loop thread; from a
    /// callback it returns `Busy` rather than deadlocking.
    pub fn counters(&self) -> Result<Counters, SendError> {
        if self.shared.on_loop_thread() {
            return Err(SendError::Busy(crate::error::Limit::LoopThread));
        }
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.shared.submit(Caddy::Counters(tx))?;
        rx.recv().map_err(|_| SendError::ShutDown)
    }

    /// Gathers the status of this daemon's subtree (rank 0: the whole DVM) within `budget_ms`
    /// (see [`crate::status`]); `all` lists every daemon in detail. Blocks for about the
    /// budget at most (a longer budget than `limits::STATUS_BUDGET_MS_MAX` is cut to it).
    /// Errors: `Invalid` (a zero budget), `Refused` (not wired up, stopping, or
    /// `limits::STATUS_LOCAL_MAX` queries in progress), `ShutDown`, `InCallback` (called
    /// from a callback).
    pub fn status(
        &self,
        budget_ms: u32,
        all: bool,
    ) -> Result<crate::status::Report, crate::status::StatusError> {
        use crate::status::StatusError;
        if self.shared.on_loop_thread() {
            return Err(StatusError::InCallback);
        }
        if budget_ms == 0 {
            return Err(StatusError::Invalid("a zero budget".into()));
        }
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.shared
            .submit(Caddy::Status { budget_ms, all, tx })
            .map_err(|e| match e {
                SendError::ShutDown => StatusError::ShutDown,
                other => StatusError::Refused(other.to_string()),
            })?;
        rx.recv().unwrap_or(Err(StatusError::ShutDown))
    }

    /// Waits until `done` holds for the lifecycle, or `timeout` passed; returns the state.
    fn wait_lifecycle(
        &self,
        timeout: Duration,
        done: impl Fn(&Lifecycle) -> bool,
    ) -> MutexGuard<'_, Lifecycle> {
        let deadline = Instant::now() + timeout;
        let mut l = lock(&self.shared.lifecycle);
        while !done(&l) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            l = self
                .shared
                .lifecycle_cv
                .wait_timeout(l, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        l
    }

    /// Blocks until wire-up has completed (the contact table arrived) or `timeout` passed.
    /// Returns whether the daemon is wired. Sends made before then are queued, not lost. From
    /// a callback it does not wait (nothing can change while the loop thread is held): it
    /// answers at once.
    pub fn wait_wired(&self, timeout: Duration) -> bool {
        let timeout = self.no_wait_on_loop_thread(timeout);
        self.wait_lifecycle(timeout, |l| l.wired || l.stopped.is_some())
            .wired
    }

    /// Zero on the loop thread (a wait there would hold the thread it waits for), else
    /// `timeout`.
    fn no_wait_on_loop_thread(&self, timeout: Duration) -> Duration {
        if self.shared.on_loop_thread() {
            Duration::ZERO
        } else {
            timeout
        }
    }

    /// `Busy` on the loop thread: a blocking call there would wait for its own thread.
    pub(crate) fn not_on_loop_thread(&self) -> Result<(), SendError> {
        if self.shared.on_loop_thread() {
            return Err(SendError::Busy(crate::error::Limit::LoopThread));
        }
        Ok(())
    }

    /// Why the daemon stopped, or `None` while it runs. Never blocks (callable from a
    /// callback); once `Some`, it does not change.
    pub fn stop_reason(&self) -> Option<StopReason> {
        lock(&self.shared.lifecycle).stopped.clone()
    }

    /// Blocks until the daemon has stopped or `timeout` passed; returns why it stopped
    /// ([`StopReason::is_orderly`] tells an orderly end from this daemon's failure). From a
    /// callback it does not wait: it answers at once.
    pub fn wait_stopped(&self, timeout: Duration) -> Option<StopReason> {
        let timeout = self.no_wait_on_loop_thread(timeout);
        self.wait_lifecycle(timeout, |l| l.stopped.is_some())
            .stopped
            .clone()
    }

    /// Registers a fault handler. It runs on the loop thread after every repair of this
    /// daemon's routing tree, after the built-in messaging layer has re-routed or failed what
    /// was queued; handlers run in registration order. Every survivor runs it with scope
    /// `Global` on rank 0's confirmation (with the new epoch). Scope `Local` comes first, and
    /// only on a daemon that learned of the death itself: the dead daemon's tree neighbours
    /// (its connection broke, or its heartbeats stopped) and its children adopted by a new
    /// parent (told by the adoption notice). A daemon far from the dead one sees only `Global`.
    ///
    /// # Errors
    /// [`RegisterError::ShutDown`] once the daemon stopped; [`RegisterError::Busy`] from a
    /// callback while the command channel is full.
    pub fn on_fault(
        &self,
        handler: impl FnMut(&RecoveryStatus) + Send + 'static,
    ) -> Result<(), RegisterError> {
        let h: FaultHandler = Box::new(handler);
        self.shared.submit(Caddy::OnFault(h)).map_err(|e| match e {
            SendError::ShutDown => RegisterError::ShutDown,
            _ => RegisterError::Busy,
        })
    }

    /// Stops this daemon at once, as a crash would look to the others: sockets are closed
    /// without flushing, no notice is sent. For fault injection in tests and harnesses; use
    /// [`Handle::shutdown`] otherwise. Joins the loop thread and the service handlers still
    /// running, unless called from a callback.
    pub fn abort(&self) {
        if let Err(SendError::Busy(_)) = self.shared.submit_control(Caddy::Abort) {
            self.shared.request_stop(StopRequest::Abort);
            let _ = self.shared.waker.wake();
        }
        self.shared.join_loop();
    }

    /// Whether the daemon has stopped.
    pub fn is_stopped(&self) -> bool {
        self.shared.is_stopped()
    }

    /// Stops this daemon: pending sends fail with [`SendError::ShutDown`], queued frames get a
    /// short, bounded linger to reach the kernel, every socket is closed, and (unless called
    /// from a callback on the loop thread) the loop thread is joined before this returns, and
    /// so are the service handlers still running ([`Handle::serve`]: their writers fail
    /// `ShutDown`, and a handler must then return).
    pub fn shutdown(&self) {
        self.shared.stop_and_join(false);
    }

    /// Leaves the DVM in order (issue "Rejoin and grow": shrink): this daemon's callers'
    /// commands are refused `ShutDown` from now on, its own reliable messages and broadcast
    /// requests are given up to `limits::LEAVE_DRAIN_MS` to be acknowledged, then rank 0
    /// confirms its departure to every daemon (their trees are repaired around it; their fault
    /// handlers see it in `RecoveryStatus::departed`, not as a failure) and, once every living
    /// daemon knows, tells it to stop: the daemon then stops with
    /// [`crate::node::StopReason::Left`] (wait with [`Handle::wait_stopped`]). Without that
    /// word within `limits::LEAVE_WAIT_MS` it stops anyway, with a fatal reason. The rank may
    /// come back later with `rejoin`. Returns at once.
    ///
    /// # Errors
    /// [`crate::LeaveError::Rank0`] on rank 0 (shut the DVM down instead),
    /// [`crate::LeaveError::NotWired`] before wire-up, [`crate::LeaveError::ShutDown`] when
    /// stopping, stopped or already leaving (also when called from a callback while the command
    /// channel is full).
    pub fn leave(&self) -> Result<(), crate::error::LeaveError> {
        use crate::error::LeaveError;
        if self.shared.rank == 0 {
            return Err(LeaveError::Rank0);
        }
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.shared
            .submit(Caddy::Leave(tx))
            .map_err(|_| LeaveError::ShutDown)?;
        if self.shared.on_loop_thread() {
            // From a callback: the loop takes the request after this returns (a daemon not
            // wired yet then only logs the refusal).
            return Ok(());
        }
        rx.recv().unwrap_or(Err(LeaveError::ShutDown))
    }

    /// Rank 0 only (on other ranks this is [`Handle::shutdown`]): tells every daemon to stop,
    /// with a broadcast (every daemon forwards it to its children before it stops), then stops
    /// this one once it has forwarded it too.
    pub fn shutdown_dvm(&self) {
        self.shared.stop_and_join(self.shared.rank == 0);
    }
}

/// The owner of a running daemon. Dropping it stops the daemon and joins its loop thread.
#[derive(Debug)]
pub struct Daemon {
    handle: Handle,
    /// Rank 0's URI file ([`crate::launch::Rendezvous::File`]), removed after the daemon
    /// stops (fields drop after `Drop::drop`), unless another rank 0 replaced it.
    pub(crate) published: Option<super::uri_file::UriFile>,
}

impl Daemon {
    pub(crate) fn new(handle: Handle) -> Self {
        Daemon {
            handle,
            published: None,
        }
    }

    /// A handle for use from other threads and callbacks.
    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }
}

impl std::ops::Deref for Daemon {
    type Target = Handle;
    fn deref(&self) -> &Handle {
        &self.handle
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.handle.shutdown();
    }
}

pub(crate) fn wait_result(
    rx: &crossbeam_channel::Receiver<Result<AllgatherResult, SendError>>,
    timeout: Duration,
) -> Result<AllgatherResult, SendError> {
    match rx.recv_timeout(timeout) {
        Ok(r) => r,
        Err(crossbeam_channel::RecvTimeoutError::Timeout) => Err(SendError::TimedOut),
        Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(SendError::ShutDown),
    }
}

/// What [`Handle::submit_send`] submits.
enum Kind {
    /// A plain send, with its per-send route if any.
    Plain(Option<crate::Route>),
    Reliable,
}
