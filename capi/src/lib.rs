//! The C API of tbon (`libtbon.so`, `libtbon.a`): `include/tbon.h` is generated from this
//! crate by cbindgen (`capi/cbindgen.toml`, checked by `capi/tests/c_header.rs`). This crate is
//! the only place where `unsafe` is allowed: the `tbon` library itself forbids it, and this
//! crate reaches it only through its public API.
//!
//! Rules kept here:
//! - every entry point runs inside `guard`, which catches panics and turns every failure into
//!   a [`tbon_rc`]; nothing unwinds into C;
//! - handles are ids (`u64`, never reused, 0 never valid) looked up in a global registry, so a
//!   freed or made-up handle gives `TBON_ERR_BAD_HANDLE`, never a use-after-free;
//! - caller memory is only read during the call (payloads are copied) and only written through
//!   pointers checked for null;
//! - callbacks run on the daemon's loop thread with a thread-local flag set, and the blocking
//!   calls refuse to run under that flag (`TBON_ERR_BUSY`) instead of deadlocking.

#![allow(non_camel_case_types)]
#![allow(clippy::missing_safety_doc)] // the pointer contract is documented once, in the header

#[cfg(test)]
mod after_shutdown;
mod clients;
mod groups;
mod modex;
mod status;
mod streams;
pub use clients::*;
pub use groups::*;
pub use modex::*;
pub use status::*;
pub use streams::*;

use bytes::Bytes;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;
use tbon::config::Config;
use tbon::counters::Counters;
use tbon::driver::{Daemon, Handle, StopReason};
use tbon::error::{RecvError, SendError, StartError};
use tbon::rml::Peer;
use tbon::routed::{RecoveryStatus, Scope};

/// Result code of every tbon call (and the argument of send completions).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum tbon_rc {
    /// Success.
    TBON_OK = 0,
    /// A null pointer where one is not allowed, a string that is not UTF-8, a bad value.
    TBON_ERR_BAD_PARAM = 1,
    /// The handle is not (or no longer) known: never created, or already freed.
    TBON_ERR_BAD_HANDLE = 2,
    /// The tag is reserved for the runtime (user tags are >= TBON_TAG_USER_MIN).
    TBON_ERR_RESERVED_TAG = 3,
    /// No such rank in this DVM.
    TBON_ERR_RANK_OUT_OF_RANGE = 4,
    /// The payload exceeds `msg_max_bytes`, a group has more than `TBON_GROUP_MEMBERS_MAX`
    /// members, a group's data for the exchange exceeds its bound (`tbon_put`), or a caller
    /// buffer is too small (see the call).
    TBON_ERR_TOO_LARGE = 5,
    /// The destination is known to have failed (for `tbon_get`: the owner of the value; for a
    /// client's send: the receiver's daemon died before answering, and the message may or may
    /// not have arrived).
    TBON_ERR_NODE_DOWN = 6,
    /// No route leads to the destination (`tbon_client_connect`: no daemon at the socket, or
    /// it broke the protocol).
    TBON_ERR_UNREACHABLE = 7,
    /// A bounded queue is full (retry later), or a blocking call was made from a callback.
    TBON_ERR_BUSY = 8,
    /// The daemon is shutting down or has stopped.
    TBON_ERR_SHUT_DOWN = 9,
    /// The timeout passed first.
    TBON_ERR_TIMED_OUT = 10,
    /// A receive for exactly this (peer, tag) is already posted, or this daemon already used
    /// this collective id (for a group: another `tbon_group` of the same context and members
    /// ran this collective's number on this daemon).
    TBON_ERR_DUPLICATE = 11,
    /// An unknown setting name, a bad setting value, or an invalid configuration.
    TBON_ERR_CONFIG = 12,
    /// The daemon could not start (bad rank/size, bad or missing rank 0 URI, no address, I/O).
    TBON_ERR_START = 13,
    /// A bug inside tbon (a caught Rust panic); the call had no effect or an unknown one.
    TBON_ERR_INTERNAL = 14,
    /// Streams: the producer has no such service.
    TBON_ERR_NO_SERVICE = 15,
    /// Streams: the producer failed the stream (its code: `tbon_stream_fail_code`; a message
    /// with its reason: `tbon_last_error`).
    TBON_ERR_STREAM_FAILED = 16,
    /// Streams: the other end of the stream (producer or consumer) died, or its daemon stopped.
    TBON_ERR_PEER_DIED = 17,
    /// Streams: the consumer cancelled the stream.
    TBON_ERR_CANCELLED = 18,
    /// Streams: corrupt data, or the other end broke the protocol. `tbon_get`: the owner's
    /// data came back malformed.
    TBON_ERR_CORRUPT = 19,
    /// Streams: nothing arrived from the producer for the stream's idle time.
    TBON_ERR_IDLE = 20,
    /// Status: the daemon refused the operator credential (a wrong one, another DVM, or too
    /// many tools connected).
    TBON_ERR_CREDENTIAL = 21,
    /// Groups: this daemon, the broadcast's root, or the rank a `tbon_get` asks, is not a
    /// member of the group.
    TBON_ERR_NOT_MEMBER = 22,
    /// Collectives: the collective ended without its result at this member (after a repair,
    /// or on a daemon that rejoined for a collective finished before it was admitted, every
    /// daemon its late contribution reached had already forgotten the result; the other
    /// members may have it).
    TBON_ERR_RESULT_LOST = 23,
    /// Data exchange (`tbon_get`): the owner committed no value under this key for the group
    /// (never put, or not committed before the fence the get followed).
    TBON_ERR_NOT_FOUND = 24,
    /// Groups: the members called different collectives under one number (another kind,
    /// another broadcast root, another fence mode); every member ends it with this. The
    /// members are out of step; the group stays usable for the next number.
    TBON_ERR_MISMATCH = 25,
    /// Clients: no client of that name was ever admitted by its daemon (or the rank is not in
    /// the DVM).
    TBON_ERR_UNKNOWN_CLIENT = 26,
    /// Clients: the receiver belongs to a job that does not accept messages from the
    /// sender's (`accept_from` of `tbon_client_job`).
    TBON_ERR_NOT_PERMITTED = 27,
    /// Clients: the receiver has exited; the message was not delivered.
    TBON_ERR_CLIENT_GONE = 28,
    /// Clients: this client's connection to its daemon is gone (the daemon died or stopped,
    /// or the client was closed): nothing more can be sent or received.
    TBON_ERR_DAEMON_LOST = 29,
    /// Clients: the daemon refused the connection (wrong key, job not open, uid not allowed,
    /// too many clients; the daemon's reason in `tbon_last_error`).
    TBON_ERR_REFUSED = 30,
    /// Clients: the daemon has no client socket (its `client_socket` setting is unset).
    TBON_ERR_NO_SOCKET = 31,
}

/// Which repair a fault handler reports.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum tbon_scope {
    /// This daemon learned of the death itself (lost connection, missed heartbeats).
    TBON_SCOPE_LOCAL = 0,
    /// Rank 0 confirmed the death to every daemon, with a new epoch.
    TBON_SCOPE_GLOBAL = 1,
}

/// A log record's level (`tbon_log_callback`), most severe first; `TBON_LOG_OFF` records
/// nothing.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum tbon_log_level {
    TBON_LOG_OFF = 0,
    TBON_LOG_ERROR = 1,
    TBON_LOG_WARN = 2,
    TBON_LOG_INFO = 3,
    TBON_LOG_DEBUG = 4,
    TBON_LOG_TRACE = 5,
}

/// Receives one log record: its level, its target (the module, e.g. "tbon::node::faults"),
/// the message (both NUL-terminated, valid during the call only) and the `user` pointer given
/// to `tbon_log_callback`.
pub type tbon_log_cb = Option<
    unsafe extern "C" fn(
        level: tbon_log_level,
        target: *const c_char,
        message: *const c_char,
        user: *mut c_void,
    ),
>;

/// The process's logger when a C program installed one: every record at or below its level
/// goes to the callback.
struct CLogger {
    cb: unsafe extern "C" fn(tbon_log_level, *const c_char, *const c_char, *mut c_void),
    user: UserPtr,
}

impl log::Log for CLogger {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let level = match record.level() {
            log::Level::Error => tbon_log_level::TBON_LOG_ERROR,
            log::Level::Warn => tbon_log_level::TBON_LOG_WARN,
            log::Level::Info => tbon_log_level::TBON_LOG_INFO,
            log::Level::Debug => tbon_log_level::TBON_LOG_DEBUG,
            log::Level::Trace => tbon_log_level::TBON_LOG_TRACE,
        };
        // An interior NUL would cut the text short; it never comes from tbon's own messages.
        let text = |s: String| CString::new(s.replace('\0', " ")).unwrap_or_default();
        let target = text(record.target().to_string());
        let message = text(record.args().to_string());
        let user = self.user;
        // A panic in the caller's callback must not unwind into the logging thread.
        let _ = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: the caller's callback, given valid NUL-terminated strings for the call.
            unsafe { (self.cb)(level, target.as_ptr(), message.as_ptr(), user.get()) }
        }));
    }

    fn flush(&self) {}
}

/// Sends tbon's log records at or below `max_level` to `cb`, for the whole process, from now
/// on. Call it once, before `tbon_start`: a process has one logger, so a second call (or one
/// in a process whose Rust side already installed a logger) answers `TBON_ERR_BUSY` and
/// changes nothing. `cb` runs on whichever thread logs (a daemon's loop thread, mostly),
/// possibly on several at once; it must be quick, thread-safe, and must not call tbon.
/// `max_level` is a `tbon_log_level` value. `TBON_ERR_BAD_PARAM` for a NULL `cb` or a level
/// outside `TBON_LOG_OFF..TBON_LOG_TRACE`.
#[unsafe(no_mangle)]
pub extern "C" fn tbon_log_callback(
    cb: tbon_log_cb,
    user: *mut c_void,
    max_level: c_int,
) -> tbon_rc {
    guard(|| {
        let Some(cb) = cb else {
            return fail(tbon_rc::TBON_ERR_BAD_PARAM, "cb is NULL");
        };
        let filter = match max_level {
            0 => log::LevelFilter::Off,
            1 => log::LevelFilter::Error,
            2 => log::LevelFilter::Warn,
            3 => log::LevelFilter::Info,
            4 => log::LevelFilter::Debug,
            5 => log::LevelFilter::Trace,
            other => {
                return fail(
                    tbon_rc::TBON_ERR_BAD_PARAM,
                    format!("max_level {other} is not a tbon_log_level"),
                );
            }
        };
        let logger = CLogger {
            cb,
            user: UserPtr(user),
        };
        if log::set_boxed_logger(Box::new(logger)).is_err() {
            return fail(
                tbon_rc::TBON_ERR_BUSY,
                "this process already has a logger (a second tbon_log_callback, or one the \
                 program's Rust side installed)",
            );
        }
        log::set_max_level(filter);
        Ok(())
    })
}

/// Why a daemon stopped (`tbon_stop_reason`). Only `TBON_STOP_REQUESTED`,
/// `TBON_STOP_DVM_SHUTDOWN` and `TBON_STOP_LEFT` are orderly ends; a supervisor should treat
/// the others as this daemon's failure.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum tbon_stop {
    /// Still running.
    TBON_STOP_RUNNING = 0,
    /// A local `tbon_shutdown` (or `tbon_shutdown_dvm` on rank 0, or on another rank).
    TBON_STOP_REQUESTED = 1,
    /// Rank 0 shut the DVM down (an orderly end of the whole DVM).
    TBON_STOP_DVM_SHUTDOWN = 2,
    /// A local `tbon_abort`.
    TBON_STOP_ABORTED = 3,
    /// This daemon lost rank 0, or could not reach it (or its parent) during wire-up; the
    /// text names the cause ("cannot reach rank 0" when it was never reached).
    TBON_STOP_ROOT_LOST = 4,
    /// The DVM declared this daemon dead and fenced it: this daemon may not come back, but a
    /// new one started with the setting `rejoin` (`tbon_config_set(cfg, "rejoin", "true")`,
    /// `tbon daemon --rejoin`) may take its rank back.
    TBON_STOP_DECLARED_DEAD = 5,
    /// Anything else (a contact table for another size, left out of wire-up, no table in time,
    /// the event loop failed, ...); the text says why.
    TBON_STOP_FATAL = 6,
    /// This daemon left the DVM in order (`tbon_leave`): an orderly end.
    TBON_STOP_LEFT = 7,
}

/// A configuration: an id from `tbon_config_new`/`tbon_config_from_env`; 0 is never valid.
pub type tbon_config = u64;

/// A daemon: an id from `tbon_start`; 0 is never valid. Ids are never reused, so a freed one
/// gives `TBON_ERR_BAD_HANDLE`.
pub type tbon_daemon = u64;

/// The wildcard peer of `tbon_recv`/`tbon_recv_blocking`/`tbon_cancel`: any origin.
pub const TBON_RANK_ANY: u32 = 0xFFFF_FFFF;

/// "No rank", e.g. `tbon_counters.parent` on rank 0.
pub const TBON_RANK_NONE: u32 = 0xFFFF_FFFF;

/// The lowest user tag; tags below it are reserved for the runtime.
pub const TBON_TAG_USER_MIN: u32 = 100;

/// Messages `tbon_send_batch` hands to the loop at once (a longer array is sent in groups).
pub const TBON_SEND_BATCH_MAX: usize = 1024;
const _: () = assert!(TBON_SEND_BATCH_MAX == tbon::limits::SEND_BATCH_MAX);

/// Send completion: called once, on the loop thread, with `TBON_OK` when the message was handed
/// to the kernel on the first hop (or delivered, for a self-send; for `tbon_send_reliable`, once
/// the destination posted it), otherwise the error (`TBON_ERR_NODE_DOWN`,
/// `TBON_ERR_UNREACHABLE`, `TBON_ERR_BUSY`, `TBON_ERR_SHUT_DOWN`).
pub type tbon_send_cb = Option<unsafe extern "C" fn(rc: tbon_rc, user: *mut c_void)>;

/// Receive callback: called on the loop thread for each matched message. `data` (may be NULL
/// when `len` is 0) is valid only until the callback returns: copy what you keep.
pub type tbon_recv_cb = Option<
    unsafe extern "C" fn(origin: u32, tag: u32, data: *const u8, len: usize, user: *mut c_void),
>;

/// Fault handler: called on the loop thread after every repair of this daemon's tree. Every
/// survivor gets `TBON_SCOPE_GLOBAL` once rank 0 confirmed the death. `TBON_SCOPE_LOCAL` comes
/// first, and only on a daemon that learned of the death itself before that: the dead
/// daemon's tree neighbours (its connection broke, or its heartbeats stopped), and its children
/// adopted by a new parent (told by the adoption notice); a daemon far from it sees only
/// `TBON_SCOPE_GLOBAL`. `failed` lists the newly failed ranks, ascending (valid during the call
/// only). `epoch` is the DVM epoch the repair carries, 0 when it carries none (local repairs).
pub type tbon_fault_cb = Option<
    unsafe extern "C" fn(
        failed: *const u32,
        nfailed: usize,
        scope: tbon_scope,
        epoch: u64,
        user: *mut c_void,
    ),
>;

/// One repair of a daemon's tree, as `tbon_on_repair` hands it over: the pointers are valid
/// during the call only (copy what you keep); each list is ascending, NULL when empty.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tbon_repair {
    /// Ranks newly known to have failed (as `tbon_fault_cb` gets them).
    pub failed: *const u32,
    pub nfailed: usize,
    /// Ranks back in the tree: daemons restarted under their rank (rejoin), or new ranks of a
    /// DVM started with room to grow (join).
    pub restored: *const u32,
    pub nrestored: usize,
    /// Ranks that left in order (`tbon_leave`): repaired around, not failures.
    pub departed: *const u32,
    pub ndeparted: usize,
    /// `TBON_SCOPE_LOCAL` or `TBON_SCOPE_GLOBAL`, as for `tbon_fault_cb`.
    pub scope: tbon_scope,
    /// The DVM epoch the repair carries, 0 when it carries none (local repairs).
    pub epoch: u64,
}

/// Repair handler (`tbon_on_repair`): called on the loop thread after every repair of this
/// daemon's tree, with what changed (`repair` valid during the call only).
pub type tbon_repair_cb =
    Option<unsafe extern "C" fn(repair: *const tbon_repair, user: *mut c_void)>;

/// A snapshot of one daemon's counters (`tbon_counters`), counts since it started.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct tbon_counters {
    /// Messages this daemon originated (including self-sends).
    pub sent: u64,
    /// Messages delivered to a receive on this daemon.
    pub delivered: u64,
    /// Plain messages for other daemons forwarded by this one (a batch frame of
    /// `tbon_send_batch`, several small messages to one destination, counts once).
    pub relayed: u64,
    /// Broadcast operations sent to children (one per part of a split payload), replays
    /// included.
    pub xcast_forwarded: u64,
    /// Messages dropped because no route led to their destination.
    pub dropped_unreachable: u64,
    /// Held (unmatched) messages dropped to keep the unmatched list within its bound.
    pub dropped_unmatched: u64,
    /// Connections closed because the peer broke the protocol.
    pub protocol_errors: u64,
    /// Outgoing connection attempts that were retried.
    pub reconnects: u64,
    /// Commands received from other threads; a `tbon_send_batch` counts one per message.
    pub commands: u64,
    /// Wake-up system calls paid to rouse the loop.
    pub wakeups: u64,
    /// Frames dropped because they came from a rank known to have failed.
    pub dropped_stale: u64,
    /// Repairs of the routing tree (local and global scope each count).
    pub repairs: u64,
    /// How many ranks this daemon knows have failed.
    pub failed_count: u64,
    /// Connections currently open.
    pub connections: u64,
    /// The DVM epoch this daemon knows.
    pub epoch: u64,
    /// The current parent in the tree, `TBON_RANK_NONE` if none (rank 0).
    pub parent: u32,
    /// How many children this daemon currently has in the tree.
    pub children_count: u32,
    /// Reliable messages originated here (self-sends excluded).
    pub relm_sent: u64,
    /// Reliable messages posted here (handed to receive matching), each once.
    pub relm_posted: u64,
    /// Copies of reliable messages discarded here as already posted.
    pub relm_duplicates: u64,
    /// Reliable messages retransmitted by this daemon as their origin.
    pub relm_retransmits: u64,
    /// Reliable messages replayed from this daemon's record on a neighbour's request.
    pub relm_replays: u64,
    /// RELM updates ignored (not from the right neighbour, or a stale link update).
    pub relm_ignored: u64,
    /// Reliable messages evicted from this daemon's hop cache.
    pub relm_evicted: u64,
    /// Reliable messages refused here (pending bound or full unmatched list); replayed later.
    pub relm_refused: u64,
    /// RELM link updates sent.
    pub relm_link_updates: u64,
    /// Reliable messages for other daemons forwarded by this one as a hop.
    pub relm_relayed: u64,
    /// Reliable messages originated here and not yet acknowledged.
    pub relm_unacked: u64,
    /// Reliable messages held in this daemon's hop cache.
    pub relm_cached: u64,
    /// Early reliable messages held here while their predecessor is missing.
    pub relm_pending: u64,
    /// Broadcasts delivered here (user broadcasts and the DVM's notices), each once; a payload
    /// split into parts counts once.
    pub xcast_delivered: u64,
    /// Broadcasts originated here that every living daemon delivered.
    pub xcast_completed: u64,
    /// Broadcasts originated here that rank 0 refused (its window was full).
    pub xcast_refused: u64,
    /// Rank 0: broadcast requests it refused.
    pub xcast_requests_refused: u64,
    /// Rank 0: broadcast requests that waited for room in its window.
    pub xcast_requests_held: u64,
    /// Broadcast operations received again and ignored.
    pub xcast_duplicates: u64,
    /// Broadcast operations ignored because they did not come from this daemon's parent.
    pub xcast_not_from_parent: u64,
    /// Resume requests sent to the parent (after a repair, a gap or a lost link).
    pub xcast_resumes: u64,
    /// Broadcast operations dropped at the retained bound (fetched again later).
    pub xcast_dropped_full: u64,
    /// Collective tree messages ignored as stale.
    pub xcast_stale: u64,
    /// Broadcast operations held here.
    pub xcast_retained: u64,
    /// Broadcasts originated here awaiting rank 0's answer.
    pub xcast_outstanding: u64,
    /// Allgather contributions sent to the parent (re-sends included).
    pub allgather_sent: u64,
    /// Allgather contributions received from children.
    pub allgather_received: u64,
    /// Allgather contributions received under another view of the tree.
    pub allgather_other_view: u64,
    /// Allgather contributions that arrived after the result.
    pub allgather_late: u64,
    /// Allgathers that exceeded the gathered-bytes bound here.
    pub allgather_overflowed: u64,
    /// Allgather contributions dropped because too many collectives had state here.
    pub allgather_dropped_untracked: u64,
    /// Allgather and barrier results delivered here.
    pub allgather_results: u64,
    /// Collectives this daemon keeps state for.
    pub allgather_tracked: u64,
    /// Times a link's collective messages were re-stated (reconnection, or drops at a full
    /// queue).
    pub grpcomm_resyncs: u64,
    /// Collective messages that did not decode.
    pub grpcomm_malformed: u64,
    /// Frames dropped because they carried an older incarnation of their sender than one
    /// already seen (left over from before the sender restarted).
    pub dropped_old_incarnation: u64,
    /// Fault reports that waited for room in the reliable-send window (delayed, never dropped).
    pub reports_delayed: u64,
    /// Pending handshakes closed to make room under the pending-handshake bounds.
    pub handshakes_evicted: u64,
    /// Connections closed because their handshake timed out.
    pub handshakes_timed_out: u64,
    /// Accepted connections whose peer hung up before proving it holds the job key.
    pub handshakes_abandoned: u64,
    /// Connections refused in their handshake (wrong DVM, wrong MAC, malformed), or at accept
    /// beyond the connection bound; each counted once.
    pub handshakes_refused: u64,
    /// Refusal log lines not written because of the rate limit.
    pub log_lines_suppressed: u64,
    /// Times a send queue towards a neighbour became congested (reads from the others paused
    /// until it drained).
    pub flow_congested: u64,
    /// Sends refused `TBON_ERR_BUSY` by flow control: the queue towards their next hop was
    /// congested, or the command queue already held its share of payload bytes.
    pub sends_busy_flow: u64,
    /// Reliable sends refused `TBON_ERR_BUSY` at the call because `relm_unacked_max` reliable
    /// messages of this daemon were unacknowledged.
    pub relm_busy: u64,
    /// Direct links (setting `route`): requests for a link this daemon sent.
    pub direct_requests_sent: u64,
    /// Requests other daemons sent this one.
    pub direct_requests_received: u64,
    /// Requests this daemon granted.
    pub direct_grants: u64,
    /// Denials this daemon's requests met (every reason; the Rust counters split them).
    pub direct_denied: u64,
    /// Sends that would have asked for a link but found a recent denial cached.
    pub direct_denial_cache_hits: u64,
    /// Links in use now (granted or open).
    pub direct_links_open: u64,
    /// Links that fell back to the tree (connection lost, grant withdrawn).
    pub direct_fallbacks: u64,
    /// Idle direct links this daemon closed to make room for a new one.
    pub direct_links_evicted: u64,
    /// User messages originated here that took a direct link, and their payload bytes.
    pub direct_messages: u64,
    pub direct_bytes: u64,
    /// User messages originated here for other daemons that took the tree, and their bytes.
    pub direct_tree_messages: u64,
    pub direct_tree_bytes: u64,
    /// Denials this daemon sent to other daemons' requests.
    pub direct_denials_sent: u64,
    /// Denials this daemon's requests met, by reason: the other daemon's `route` is `tree`;
    /// it had no room (`direct_links_max`); no answer in time or the connection could not be
    /// made; the other daemon died. (`direct_denied` is their sum with the rarer reasons.)
    pub direct_denied_policy: u64,
    pub direct_denied_full: u64,
    pub direct_denied_timeout: u64,
    pub direct_denied_dead: u64,
    /// Links that opened (both ends count one).
    pub direct_links_opened: u64,
    /// Sends that would have asked for a link but this daemon had no room and none idle.
    pub direct_no_room: u64,
    /// Frames dropped at a hard queue bound: a relay's full send queue, or a message without
    /// a completion beyond what may wait while a direct link closes.
    pub dropped_queue_full: u64,
    /// Streams, producer side: streams opened here by consumers (a resumed stream opens
    /// again), opens refused (no such service, no room), data bytes sent.
    pub stream_served: u64,
    pub stream_refused: u64,
    pub stream_bytes_sent: u64,
    /// Streams, consumer side: fetched, finished, ended with an error (cancels included),
    /// resumed at the byte they stood at, probes sent (a quarter of the idle time without
    /// news), data bytes received and checked.
    pub stream_fetched: u64,
    pub stream_finished: u64,
    pub stream_failed: u64,
    pub stream_resumes: u64,
    pub stream_probes: u64,
    pub stream_bytes_received: u64,
    /// Streams open now: produced here, and fetched here.
    pub stream_producing: u64,
    pub stream_consuming: u64,
    /// Group collectives: contributions sent up and received, results sent down (passed on
    /// or answered), late contributions answered, contributions dropped at the tracked bound,
    /// results delivered here, collectives with state here (`tbon_group_*`).
    pub group_sent: u64,
    pub group_received: u64,
    pub group_results_sent: u64,
    pub group_answered_late: u64,
    pub group_dropped_untracked: u64,
    pub group_results: u64,
    pub group_tracked: u64,
    /// Data exchange (`tbon_get`): gets answered here without a message (from the cache, a
    /// full fence's or an earlier fetch's, or this daemon's own data), fetches of an owner's
    /// data (one per owner and group, shared by the gets waiting for it), fetches answered
    /// for other daemons, and owners' data evicted from the cache.
    pub modex_hits: u64,
    pub modex_fetches: u64,
    pub modex_served: u64,
    pub modex_evicted: u64,
    /// Rejoin and grow: ranks this daemon put back into its tree (restarted daemons admitted
    /// again, new ranks joined), ranks it repaired around that left in order (`tbon_leave`),
    /// and frames it dropped as sent by or for another life of a rank than the one it knows.
    pub rejoins: u64,
    pub departures: u64,
    pub dropped_other_life: u64,
    /// Link sessions (a broken connection between two living daemons loses nothing):
    /// connections on which frames written before a break were written again, those frames,
    /// frames that came again and were dropped as already here, frames given up because the
    /// neighbour refused the session (a frame of it broke the protocol there), and
    /// resumptions past frames never received (cannot happen between correct peers).
    pub link_resumes: u64,
    pub link_frames_resent: u64,
    pub link_duplicates_dropped: u64,
    pub link_frames_given_up: u64,
    pub link_gaps: u64,
    /// Connections closed as stalled and dialled again at the peer's next address (failover).
    pub link_failovers: u64,
    /// Streams: bulk connections this daemon dialled and had admitted (a second connection
    /// to a neighbour carrying only its stream data; setting `bulk_connection`).
    pub bulk_connections: u64,
}

impl From<&Counters> for tbon_counters {
    fn from(c: &Counters) -> Self {
        tbon_counters {
            sent: c.sent,
            delivered: c.delivered,
            relayed: c.relayed,
            xcast_forwarded: c.xcast_forwarded,
            dropped_unreachable: c.dropped_unreachable,
            dropped_unmatched: c.dropped_unmatched,
            protocol_errors: c.protocol_errors,
            reconnects: c.reconnects,
            commands: c.commands,
            wakeups: c.wakeups,
            dropped_stale: c.dropped_stale,
            repairs: c.repairs,
            failed_count: c.failed.len() as u64,
            connections: c.connections,
            epoch: c.epoch,
            parent: c.parent.unwrap_or(TBON_RANK_NONE),
            children_count: u32::try_from(c.children.len()).unwrap_or(u32::MAX),
            direct_requests_sent: c.direct.requests_sent,
            direct_requests_received: c.direct.requests_received,
            direct_grants: c.direct.grants,
            direct_denied: c.direct.denied_policy
                + c.direct.denied_version
                + c.direct.denied_full
                + c.direct.denied_other
                + c.direct.denied_dead
                + c.direct.denied_timeout,
            direct_denial_cache_hits: c.direct.denial_cache_hits,
            direct_links_open: c.direct.links_open,
            direct_fallbacks: c.direct.fallbacks,
            direct_links_evicted: c.direct.links_evicted,
            direct_messages: c.direct.direct_messages,
            direct_bytes: c.direct.direct_bytes,
            relm_sent: c.relm_sent,
            relm_posted: c.relm_posted,
            relm_duplicates: c.relm_duplicates,
            relm_retransmits: c.relm_retransmits,
            relm_replays: c.relm_replays,
            relm_ignored: c.relm_ignored,
            relm_evicted: c.relm_evicted,
            relm_refused: c.relm_refused,
            relm_link_updates: c.relm_link_updates,
            relm_relayed: c.relm_relayed,
            direct_tree_messages: c.direct.tree_messages,
            direct_tree_bytes: c.direct.tree_bytes,
            direct_denials_sent: c.direct.denials_sent,
            direct_denied_policy: c.direct.denied_policy,
            direct_denied_full: c.direct.denied_full,
            direct_denied_timeout: c.direct.denied_timeout,
            direct_denied_dead: c.direct.denied_dead,
            direct_links_opened: c.direct.links_opened,
            direct_no_room: c.direct.no_room,
            dropped_queue_full: c.dropped_queue_full,
            relm_unacked: c.relm_unacked,
            relm_cached: c.relm_cached,
            relm_pending: c.relm_pending,
            xcast_delivered: c.xcast_delivered,
            xcast_completed: c.xcast_completed,
            xcast_refused: c.xcast_refused,
            xcast_requests_refused: c.xcast_requests_refused,
            xcast_requests_held: c.xcast_requests_held,
            xcast_duplicates: c.xcast_duplicates,
            xcast_not_from_parent: c.xcast_not_from_parent,
            xcast_resumes: c.xcast_resumes,
            xcast_dropped_full: c.xcast_dropped_full,
            xcast_stale: c.xcast_stale,
            xcast_retained: c.xcast_retained,
            xcast_outstanding: c.xcast_outstanding,
            allgather_sent: c.allgather_sent,
            allgather_received: c.allgather_received,
            allgather_other_view: c.allgather_other_view,
            allgather_late: c.allgather_late,
            allgather_overflowed: c.allgather_overflowed,
            allgather_dropped_untracked: c.allgather_dropped_untracked,
            allgather_results: c.allgather_results,
            allgather_tracked: c.allgather_tracked,
            grpcomm_resyncs: c.grpcomm_resyncs,
            grpcomm_malformed: c.grpcomm_malformed,
            dropped_old_incarnation: c.dropped_old_incarnation,
            reports_delayed: c.reports_delayed,
            handshakes_evicted: c.handshakes_evicted,
            handshakes_timed_out: c.handshakes_timed_out,
            handshakes_abandoned: c.handshakes_abandoned,
            handshakes_refused: c.handshakes_refused,
            log_lines_suppressed: c.log_lines_suppressed,
            flow_congested: c.flow_congested,
            sends_busy_flow: c.sends_busy_flow,
            relm_busy: c.relm_busy,
            stream_served: c.streams.served,
            stream_refused: c.streams.refused,
            stream_bytes_sent: c.streams.bytes_sent,
            stream_fetched: c.streams.fetched,
            stream_finished: c.streams.finished,
            stream_failed: c.streams.failed,
            stream_resumes: c.streams.resumes,
            stream_probes: c.streams.probes,
            stream_bytes_received: c.streams.bytes_received,
            stream_producing: c.streams.producing,
            stream_consuming: c.streams.consuming,
            group_sent: c.group_sent,
            group_received: c.group_received,
            group_results_sent: c.group_results_sent,
            group_answered_late: c.group_answered_late,
            group_dropped_untracked: c.group_dropped_untracked,
            group_results: c.group_results,
            group_tracked: c.group_tracked,
            modex_hits: c.modex_hits,
            modex_fetches: c.modex_fetches,
            modex_served: c.modex_served,
            modex_evicted: c.modex_evicted,
            rejoins: c.rejoins,
            departures: c.departures,
            dropped_other_life: c.dropped_other_life,
            link_resumes: c.link_resumes,
            link_frames_resent: c.link_frames_resent,
            link_duplicates_dropped: c.link_duplicates_dropped,
            link_frames_given_up: c.link_frames_given_up,
            link_gaps: c.link_gaps,
            link_failovers: c.link_failovers,
            bulk_connections: c.bulk_connections,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Plumbing: errors, the panic guard, the registry, the callback flag.

/// A failed call: its code and the message `tbon_last_error` will return.
struct Fail(tbon_rc, String);

type Res = Result<(), Fail>;

fn fail<T>(rc: tbon_rc, msg: impl Into<String>) -> Result<T, Fail> {
    Err(Fail(rc, msg.into()))
}

fn send_rc(e: &SendError) -> tbon_rc {
    match e {
        SendError::ReservedTag(_) => tbon_rc::TBON_ERR_RESERVED_TAG,
        SendError::RankOutOfRange { .. } => tbon_rc::TBON_ERR_RANK_OUT_OF_RANGE,
        SendError::TooLarge { .. } => tbon_rc::TBON_ERR_TOO_LARGE,
        SendError::NodeDown(_) => tbon_rc::TBON_ERR_NODE_DOWN,
        SendError::Unreachable(_) => tbon_rc::TBON_ERR_UNREACHABLE,
        SendError::Busy(_) => tbon_rc::TBON_ERR_BUSY,
        SendError::ShutDown => tbon_rc::TBON_ERR_SHUT_DOWN,
        SendError::TimedOut => tbon_rc::TBON_ERR_TIMED_OUT,
        SendError::DuplicateId(_) => tbon_rc::TBON_ERR_DUPLICATE,
        SendError::NotMember(_) => tbon_rc::TBON_ERR_NOT_MEMBER,
        SendError::ResultLost => tbon_rc::TBON_ERR_RESULT_LOST,
        SendError::Mismatch => tbon_rc::TBON_ERR_MISMATCH,
        // A cause added to the library after this table: a bug here, not the caller's.
        _ => tbon_rc::TBON_ERR_INTERNAL,
    }
}

impl From<SendError> for Fail {
    fn from(e: SendError) -> Self {
        Fail(send_rc(&e), e.to_string())
    }
}

impl From<tbon::RegisterError> for Fail {
    fn from(e: tbon::RegisterError) -> Self {
        let rc = match e {
            tbon::RegisterError::Busy => tbon_rc::TBON_ERR_BUSY,
            _ => tbon_rc::TBON_ERR_SHUT_DOWN,
        };
        Fail(rc, e.to_string())
    }
}

impl From<RecvError> for Fail {
    fn from(e: RecvError) -> Self {
        let rc = match e {
            RecvError::ReservedTag(_) => tbon_rc::TBON_ERR_RESERVED_TAG,
            RecvError::Duplicate => tbon_rc::TBON_ERR_DUPLICATE,
            RecvError::RankOutOfRange { .. } => tbon_rc::TBON_ERR_RANK_OUT_OF_RANGE,
            RecvError::TimedOut => tbon_rc::TBON_ERR_TIMED_OUT,
            RecvError::ShutDown => tbon_rc::TBON_ERR_SHUT_DOWN,
            RecvError::InCallback => tbon_rc::TBON_ERR_BUSY,
            _ => tbon_rc::TBON_ERR_INTERNAL,
        };
        Fail(rc, e.to_string())
    }
}

thread_local! {
    /// Set while a tbon callback runs on this thread.
    static IN_CALLBACK: Cell<bool> = const { Cell::new(false) };
    /// The message of the last failed call on this thread.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Runs one entry point: no panic escapes, every failure becomes a code (and a message).
fn guard(f: impl FnOnce() -> Res) -> tbon_rc {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => tbon_rc::TBON_OK,
        Ok(Err(Fail(rc, msg))) => {
            set_last_error(&msg);
            rc
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            set_last_error(&format!("internal error (panic): {what}"));
            tbon_rc::TBON_ERR_INTERNAL
        }
    }
}

/// Marks this thread as running a callback until dropped (restoring the previous state).
struct CallbackScope(bool);

impl CallbackScope {
    fn enter() -> Self {
        CallbackScope(IN_CALLBACK.with(|f| f.replace(true)))
    }
}

impl Drop for CallbackScope {
    fn drop(&mut self) {
        IN_CALLBACK.with(|f| f.set(self.0));
    }
}

fn not_in_callback(call: &str) -> Res {
    if IN_CALLBACK.with(|f| f.get()) {
        return fail(
            tbon_rc::TBON_ERR_BUSY,
            format!("{call} blocks and must not be called from a tbon callback"),
        );
    }
    Ok(())
}

/// A caller's `void *user`, carried to the loop thread. tbon never dereferences it; the caller
/// promised (in the header) that using it from the loop thread is fine.
#[derive(Clone, Copy)]
struct UserPtr(*mut c_void);

// SAFETY: the pointer is only handed back to the caller's own callback; thread-safety of what it
// points to is the caller's contract, stated in the header.
unsafe impl Send for UserPtr {}
// SAFETY: as for `Send`: tbon only copies the pointer (a stream service's callback runs on a
// thread per stream, as the header says).
unsafe impl Sync for UserPtr {}

impl UserPtr {
    /// A method, not `.0`, so that closures capture the whole `Send` wrapper.
    fn get(self) -> *mut c_void {
        self.0
    }
}

struct DaemonEntry {
    handle: Handle,
    /// The owner; taken by `tbon_free`.
    owner: Mutex<Option<Daemon>>,
    /// The `client_socket` setting it started with (`tbon_client_socket_path`).
    client_socket: Option<String>,
}

#[derive(Default)]
struct Registry {
    /// The process generation ([`FORKS`]) its handles belong to.
    forks: u64,
    next_id: u64,
    configs: HashMap<u64, Config>,
    daemons: HashMap<u64, Arc<DaemonEntry>>,
    writers: HashMap<u64, streams::WriterEntry>,
    streams: HashMap<u64, Arc<streams::StreamEntry>>,
    statuses: HashMap<u64, status::StatusEntry>,
    groups: HashMap<u64, groups::GroupEntry>,
    clients: HashMap<u64, Arc<clients::ClientEntry>>,
}

impl Registry {
    fn new_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// In a forked child: forgets the parent's daemons and what hangs on their threads,
    /// without dropping them (a drop would stop and join threads this process does not have).
    /// Configurations and groups are plain data and stay usable.
    fn forget_the_parents(&mut self) {
        std::mem::forget(std::mem::take(&mut self.daemons));
        std::mem::forget(std::mem::take(&mut self.writers));
        std::mem::forget(std::mem::take(&mut self.streams));
        std::mem::forget(std::mem::take(&mut self.statuses));
        std::mem::forget(std::mem::take(&mut self.clients));
    }

    /// Gives the tables' memory back once they are empty, so that a program that freed all its
    /// handles leaves nothing allocated behind (clean memory-checker runs).
    fn release_if_empty(&mut self) {
        if self.configs.is_empty() {
            self.configs = HashMap::new();
        }
        if self.daemons.is_empty() {
            self.daemons = HashMap::new();
        }
        if self.writers.is_empty() {
            self.writers = HashMap::new();
        }
        if self.streams.is_empty() {
            self.streams = HashMap::new();
        }
        if self.statuses.is_empty() {
            self.statuses = HashMap::new();
        }
        if self.groups.is_empty() {
            self.groups = HashMap::new();
        }
        if self.clients.is_empty() {
            self.clients = HashMap::new();
        }
    }
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);

/// How many times this process is a child made by `fork()` of a process that used tbon:
/// bumped in the child (`pthread_atfork`). The daemons, clients, streams, writers and status
/// queries of the registry then belong to the parent: their threads do not exist here, and
/// using them sent into the void, blocked for ever or panicked (found by an outside-in C
/// program). The child forgets them, so their handles are `TBON_ERR_BAD_HANDLE` there.
static FORKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static WATCH_FORKS: std::sync::Once = std::sync::Once::new();

thread_local! {
    /// The registry's lock, held by the forking thread across `fork()`: a child must not
    /// inherit it locked by a thread it does not have.
    static HELD_ACROSS_FORK: RefCell<Option<std::sync::MutexGuard<'static, Registry>>> =
        const { RefCell::new(None) };
}

unsafe extern "C" {
    fn pthread_atfork(
        prepare: Option<unsafe extern "C" fn()>,
        parent: Option<unsafe extern "C" fn()>,
        child: Option<unsafe extern "C" fn()>,
    ) -> c_int;
}

/// Tries for a bounded while (`FORK_LOCK_TRIES`): the forking thread may hold the lock itself
/// (a fork from inside a callback), and must not wait for itself.
unsafe extern "C" fn before_fork() {
    for _ in 0..FORK_LOCK_TRIES {
        match REGISTRY.try_lock() {
            Ok(held) => {
                HELD_ACROSS_FORK.with(|h| *h.borrow_mut() = Some(held));
                return;
            }
            Err(std::sync::TryLockError::Poisoned(e)) => {
                HELD_ACROSS_FORK.with(|h| *h.borrow_mut() = Some(e.into_inner()));
                return;
            }
            Err(std::sync::TryLockError::WouldBlock) => std::thread::yield_now(),
        }
    }
}

/// How many times `before_fork` tries the registry's lock (each try yields the processor).
const FORK_LOCK_TRIES: u32 = 10_000;

unsafe extern "C" fn after_fork_in_parent() {
    HELD_ACROSS_FORK.with(|h| drop(h.borrow_mut().take()));
}

unsafe extern "C" fn after_fork_in_child() {
    FORKS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    HELD_ACROSS_FORK.with(|h| drop(h.borrow_mut().take()));
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    WATCH_FORKS.call_once(|| {
        // SAFETY: three handlers with the C signature pthread_atfork expects; registered once.
        unsafe {
            pthread_atfork(
                Some(before_fork),
                Some(after_fork_in_parent),
                Some(after_fork_in_child),
            )
        };
    });
    let mut r = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    let forks = FORKS.load(std::sync::atomic::Ordering::SeqCst);
    if r.forks != forks {
        r.forget_the_parents();
        r.forks = forks;
    }
    r
}

fn entry(d: tbon_daemon) -> Result<Arc<DaemonEntry>, Fail> {
    match registry().daemons.get(&d) {
        Some(e) => Ok(Arc::clone(e)),
        None => fail(
            tbon_rc::TBON_ERR_BAD_HANDLE,
            format!(
                "no daemon with handle {d} (never started, already freed, or started by the \
                 parent of this forked process)"
            ),
        ),
    }
}

fn handle(d: tbon_daemon) -> Result<Handle, Fail> {
    Ok(entry(d)?.handle.clone())
}

fn non_null<T>(p: *const T, what: &str) -> Res {
    if p.is_null() {
        return fail(tbon_rc::TBON_ERR_BAD_PARAM, format!("{what} is NULL"));
    }
    Ok(())
}

/// Copies `text` and a NUL into the caller's `buf`, whose size `*len` gives, and stores the
/// size needed in `*len`: `TBON_ERR_TOO_LARGE` (nothing copied) if it does not fit or `buf` is
/// NULL. The caller must pass a non-null `len`, and `buf` with at least `*len` writable bytes.
unsafe fn put_text(buf: *mut c_char, len: *mut usize, text: &str, what: &str) -> Res {
    let need = text.len() + 1;
    // SAFETY: the caller's in/out length (non-null, the caller checked).
    let cap = unsafe { len.read() };
    unsafe { put(len, need) };
    if cap < need || buf.is_null() {
        return fail(
            tbon_rc::TBON_ERR_TOO_LARGE,
            format!("{what} needs {need} bytes, the buffer has {cap}"),
        );
    }
    // SAFETY: `buf` is non-null with `cap >= need` writable bytes (the caller's promise).
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
        buf.add(text.len()).write(0);
    }
    Ok(())
}

/// Borrows a C string for the duration of a call.
unsafe fn str_arg<'a>(p: *const c_char, what: &str) -> Result<&'a str, Fail> {
    non_null(p, what)?;
    // SAFETY: non-null, and the caller promised a NUL-terminated string valid for the call.
    let s = unsafe { CStr::from_ptr(p) };
    match s.to_str() {
        Ok(s) => Ok(s),
        Err(_) => fail(tbon_rc::TBON_ERR_BAD_PARAM, format!("{what} is not UTF-8")),
    }
}

/// Copies a caller's payload (`data` may be NULL only when `len` is 0). A payload above the
/// daemon's `msg_max_bytes` is refused before anything is copied.
unsafe fn payload_arg(h: &Handle, data: *const c_void, len: usize) -> Result<Bytes, Fail> {
    if len == 0 {
        return Ok(Bytes::new());
    }
    non_null(data, "data")?;
    let max = h.msg_max_bytes();
    if len > max {
        return Err(SendError::TooLarge { len, max }.into());
    }
    // SAFETY: non-null, and the caller promised `len` readable bytes for the call.
    let s = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
    Ok(Bytes::copy_from_slice(s))
}

fn peer_arg(peer: u32) -> Peer {
    if peer == TBON_RANK_ANY {
        Peer::Any
    } else {
        Peer::Rank(peer)
    }
}

/// Writes `v` through an out-pointer already checked for null.
unsafe fn put<T>(p: *mut T, v: T) {
    // SAFETY: checked for null by the caller of `put`; the C caller promised it is writable.
    unsafe { p.write(v) }
}

fn completion(cb: tbon_send_cb, user: *mut c_void) -> Option<tbon::driver::Completion> {
    let cb = cb?;
    let user = UserPtr(user);
    Some(Box::new(move |r: Result<(), SendError>| {
        let rc = match &r {
            Ok(()) => tbon_rc::TBON_OK,
            Err(e) => send_rc(e),
        };
        let _scope = CallbackScope::enter();
        // SAFETY: the caller's function, called with the arguments its type promises.
        unsafe { cb(rc, user.get()) }
    }))
}

// ---------------------------------------------------------------------------------------------
// Errors.

/// A static, NUL-terminated description of a result code (never NULL; unknown codes get
/// "unknown tbon_rc"). Takes an `int` so that any value is safe to pass.
#[unsafe(no_mangle)]
pub extern "C" fn tbon_strerror(rc: c_int) -> *const c_char {
    let s: &'static CStr = match rc {
        0 => c"success",
        1 => c"bad parameter",
        2 => c"unknown or freed handle",
        3 => c"reserved tag",
        4 => c"rank out of range",
        5 => c"too large",
        6 => c"destination has failed",
        7 => c"destination unreachable",
        8 => c"busy",
        9 => c"shut down",
        10 => c"timed out",
        11 => c"duplicate receive or collective id",
        12 => c"configuration error",
        13 => c"start failed",
        14 => c"internal error",
        15 => c"no such service",
        16 => c"the producer failed the stream",
        17 => c"the other end of the stream died",
        18 => c"the stream was cancelled",
        19 => c"corrupt stream",
        20 => c"the stream was idle too long",
        21 => c"the credential was refused",
        22 => c"not a member of the group",
        23 => c"the collective's result was lost",
        24 => c"no such key",
        25 => c"the group's members called different collectives",
        26 => c"no such client",
        27 => c"the receiver's job does not accept this client's",
        28 => c"the client has exited",
        29 => c"the client's daemon is gone",
        30 => c"the daemon refused the client",
        31 => c"the daemon has no client socket",
        _ => c"unknown tbon_rc",
    };
    s.as_ptr()
}

/// A description of the last call on this thread that returned an error (more detail than
/// `tbon_strerror`, e.g. which setting was bad). "" if none. Owned by tbon: valid until the next
/// tbon call on this thread.
#[unsafe(no_mangle)]
pub extern "C" fn tbon_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

// ---------------------------------------------------------------------------------------------
// Configuration.

/// Creates a configuration with the defaults and stores its id in `*out`. Reads no environment
/// variable (nor does `tbon_start`): set the key with `tbon_config_set(cfg, "key_file", path)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_config_new(out: *mut tbon_config) -> tbon_rc {
    guard(|| {
        non_null(out, "out")?;
        let mut r = registry();
        let id = r.new_id();
        r.configs.insert(id, Config::default());
        drop(r);
        // SAFETY: checked above.
        unsafe { put(out, id) };
        Ok(())
    })
}

/// Like `tbon_config_new`, then applies every `TBON_<NAME>` environment variable that is set,
/// takes the job key itself from `TBON_KEY` when no `TBON_KEY_FILE` is set, and validates. `TBON_ERR_CONFIG` names the bad variable in `tbon_last_error()`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_config_from_env(out: *mut tbon_config) -> tbon_rc {
    guard(|| {
        non_null(out, "out")?;
        let cfg = match Config::from_env() {
            Ok(c) => c,
            Err(e) => return fail(tbon_rc::TBON_ERR_CONFIG, e.to_string()),
        };
        let mut r = registry();
        let id = r.new_id();
        r.configs.insert(id, cfg);
        drop(r);
        // SAFETY: checked above.
        unsafe { put(out, id) };
        Ok(())
    })
}

/// Sets one setting by name, from text: the names of the `TBON_<NAME>` environment variables
/// (`"if_include"`, `"IF_INCLUDE"`, `"TBON_IF_INCLUDE"` and `"if-include"` all work), the same
/// syntax (lists comma-separated, booleans true/false/yes/no/on/off/1/0). Only the syntax is
/// checked here; `tbon_start` validates the whole. Unknown name or bad value: `TBON_ERR_CONFIG`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_config_set(
    cfg: tbon_config,
    name: *const c_char,
    value: *const c_char,
) -> tbon_rc {
    guard(|| {
        // SAFETY: the caller's strings, valid for this call.
        let (name, value) = unsafe { (str_arg(name, "name")?, str_arg(value, "value")?) };
        let mut r = registry();
        let Some(c) = r.configs.get_mut(&cfg) else {
            return fail(
                tbon_rc::TBON_ERR_BAD_HANDLE,
                format!("no configuration {cfg}"),
            );
        };
        c.set(name, value)
            .or_else(|e| fail(tbon_rc::TBON_ERR_CONFIG, e.to_string()))
    })
}

/// Frees a configuration. Daemons started with it keep their own copy.
#[unsafe(no_mangle)]
pub extern "C" fn tbon_config_free(cfg: tbon_config) -> tbon_rc {
    guard(|| match registry().configs.remove(&cfg) {
        Some(_) => Ok(()),
        None => fail(
            tbon_rc::TBON_ERR_BAD_HANDLE,
            format!("no configuration {cfg}"),
        ),
    })
}

// ---------------------------------------------------------------------------------------------
// Daemon lifecycle.

/// Starts daemon `rank` of a DVM of `size` daemons and stores its handle in `*out`. Returns once
/// the listener is bound; wire-up goes on in the background (`tbon_wait_wired`). `cfg` is copied
/// (0 means the defaults). `hnp_uri` is rank 0's contact URI (`tbon_contact_uri` on rank 0):
/// required for every other rank, ignored (may be NULL) on rank 0.
/// Errors: `TBON_ERR_CONFIG` (invalid configuration, no job key, or interface settings that
/// leave no address: `if_include` naming none of this host's), `TBON_ERR_START` (bad
/// rank/size, missing or bad URI, I/O such as no free port in `port_range`),
/// `TBON_ERR_BAD_HANDLE`, `TBON_ERR_BAD_PARAM`. Not from a callback.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_start(
    cfg: tbon_config,
    rank: u32,
    size: u32,
    hnp_uri: *const c_char,
    out: *mut tbon_daemon,
) -> tbon_rc {
    guard(|| {
        not_in_callback("tbon_start")?;
        non_null(out, "out")?;
        let hnp = if hnp_uri.is_null() {
            None
        } else {
            // SAFETY: the caller's string, valid for this call.
            Some(unsafe { str_arg(hnp_uri, "hnp_uri")? })
        };
        let config = config_of(cfg)?;
        let socket = config.client_socket.clone();
        let daemon = started(tbon::start(config, rank, size, hnp))?;
        // SAFETY: checked above.
        unsafe { register(daemon, socket, out) };
        Ok(())
    })
}

/// The configuration `cfg` names (0: the defaults), copied.
fn config_of(cfg: tbon_config) -> Result<Config, Fail> {
    if cfg == 0 {
        return Ok(Config::default());
    }
    match registry().configs.get(&cfg) {
        Some(c) => Ok(c.clone()),
        None => fail(
            tbon_rc::TBON_ERR_BAD_HANDLE,
            format!("no configuration {cfg}"),
        ),
    }
}

/// A start's outcome as the C API reports it.
fn started(r: Result<tbon::Daemon, StartError>) -> Result<tbon::Daemon, Fail> {
    match r {
        Ok(d) => Ok(d),
        Err(StartError::NoKey) => fail(
            tbon_rc::TBON_ERR_CONFIG,
            "no job key: set key_file with tbon_config_set (tbon_key_generate makes one), or use \
             tbon_config_from_env with TBON_KEY_FILE or TBON_KEY, or set insecure=true to run \
             unauthenticated",
        ),
        Err(e @ (StartError::Config(_) | StartError::Key(_))) => {
            fail(tbon_rc::TBON_ERR_CONFIG, e.to_string())
        }
        Err(e) => fail(tbon_rc::TBON_ERR_START, e.to_string()),
    }
}

/// Puts `daemon` (started with `client_socket`) in the registry and its id in `*out`.
///
/// # Safety
/// `out` is non-null and writable.
unsafe fn register(daemon: tbon::Daemon, client_socket: Option<String>, out: *mut tbon_daemon) {
    let entry = Arc::new(DaemonEntry {
        handle: daemon.handle(),
        owner: Mutex::new(Some(daemon)),
        client_socket,
    });
    let mut r = registry();
    let id = r.new_id();
    r.daemons.insert(id, entry);
    drop(r);
    // SAFETY: the caller's promise.
    unsafe { put(out, id) };
}

/// Starts a daemon the way launchers start them (`tbon::launch`): its rank and size are
/// `rank` and `size`, or, where negative, read from the launcher's environment (`TBON_RANK`,
/// `SLURM_PROCID`, `OMPI_COMM_WORLD_RANK`, `PMIX_RANK`; `TBON_SIZE`, `SLURM_NTASKS`,
/// `OMPI_COMM_WORLD_SIZE`); rank 0 is found through `rendezvous`: `"uri:URI"`, `"file:PATH"`
/// (rank 0 writes its URI there and removes it when its daemon is freed; the others wait for
/// it up to the wire-up timeout; remove a file left by a run that did not end cleanly before
/// the launch: a rank that reads it dials a rank 0 that is gone and fails, it does not wait
/// for a new one) or `"host:NAME:PORT"` (no shared filesystem: rank 0 listens
/// on PORT; the others wait up to the wire-up timeout for it to listen, then dial NAME:PORT),
/// or, if NULL, from `TBON_HNP`, `TBON_HNP_FILE` or
/// `TBON_HNP_HOST` (`NAME:PORT`). Rank 0 needs no rendezvous unless others look for it in a
/// file or at a port. Stores the handle in `*out`; returns once the listener is bound (a rank
/// other than 0 with a file: once the file was read). Errors: `TBON_ERR_CONFIG`,
/// `TBON_ERR_START` (no rank or size in the environment, a rank not below the size, a
/// malformed rendezvous, a file that did not appear in time or that another user owns, a host
/// that does not resolve or whose port did not listen in time, and `tbon_start`'s),
/// `TBON_ERR_BAD_HANDLE`, `TBON_ERR_BAD_PARAM`. Not from a callback.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_launch(
    cfg: tbon_config,
    rank: i64,
    size: i64,
    rendezvous: *const c_char,
    out: *mut tbon_daemon,
) -> tbon_rc {
    guard(|| {
        not_in_callback("tbon_launch")?;
        non_null(out, "out")?;
        let config = config_of(cfg)?;
        let how = if rendezvous.is_null() {
            started_how(tbon::launch::Rendezvous::from_env())?
        } else {
            // SAFETY: the caller's string, valid for this call.
            let text = unsafe { str_arg(rendezvous, "rendezvous")? };
            match text.parse::<tbon::launch::Rendezvous>() {
                Ok(r) => Some(r),
                Err(e) => return fail(tbon_rc::TBON_ERR_START, e.to_string()),
            }
        };
        let placement = match (u32::try_from(rank), u32::try_from(size)) {
            (Ok(rank), Ok(size)) => tbon::launch::Placement { rank, size },
            (r, sz) => {
                let lookup = |n: &str| match (n, r, sz) {
                    ("TBON_RANK", Ok(r), _) => Some(r.to_string()),
                    ("TBON_SIZE", _, Ok(s)) => Some(s.to_string()),
                    _ => std::env::var(n).ok(),
                };
                match tbon::launch::Placement::from_lookup(lookup) {
                    Ok(p) => p,
                    Err(e) => return fail(tbon_rc::TBON_ERR_START, e.to_string()),
                }
            }
        };
        let how = match how {
            Some(h) => h,
            None if placement.rank == 0 => tbon::launch::Rendezvous::Uri(String::new()),
            None => {
                return fail(
                    tbon_rc::TBON_ERR_START,
                    "no rendezvous: give one, or set TBON_HNP, TBON_HNP_FILE or TBON_HNP_HOST"
                        .to_string(),
                );
            }
        };
        let socket = config.client_socket.clone();
        let daemon = started(tbon::launch::launch(config, placement, &how))?;
        // SAFETY: checked above.
        unsafe { register(daemon, socket, out) };
        Ok(())
    })
}

fn started_how(
    r: Result<Option<tbon::launch::Rendezvous>, StartError>,
) -> Result<Option<tbon::launch::Rendezvous>, Fail> {
    r.or_else(|e| fail(tbon_rc::TBON_ERR_START, e.to_string()))
}

/// Copies this daemon's contact URI, NUL-terminated, into `buf`. `*len` is the size of `buf` on
/// entry and the size needed (URI length + 1) on return. If `buf` is too small (or NULL with
/// `*len` 0, to ask the size) nothing is copied and `TBON_ERR_TOO_LARGE` is returned.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_contact_uri(
    d: tbon_daemon,
    buf: *mut c_char,
    len: *mut usize,
) -> tbon_rc {
    guard(|| {
        non_null(len, "len")?;
        let h = handle(d)?;
        // SAFETY: `len` checked above; `buf` and `*len` are the caller's promise.
        unsafe { put_text(buf, len, h.contact_uri(), "the contact URI") }
    })
}

/// Stores in `*count` how many addresses this daemon listens on and publishes (one per interface
/// address its `if_include`/`if_exclude`/`ipv4`/`ipv6` settings allow; on a node with several
/// networks, one per network), for `tbon_address`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_address_count(d: tbon_daemon, count: *mut usize) -> tbon_rc {
    guard(|| {
        non_null(count, "count")?;
        let n = handle(d)?.addresses().len();
        // SAFETY: checked above.
        unsafe { put(count, n) };
        Ok(())
    })
}

/// Copies address `index` (0 to `tbon_address_count` - 1, in the contact URI's order) as text,
/// `IP:PORT` or `[IPv6]:PORT`, NUL-terminated, into `buf`. `*len` is the size of `buf` on entry
/// and the size needed on return (too small, or NULL with `*len` 0: `TBON_ERR_TOO_LARGE`,
/// nothing copied). An index beyond the last is `TBON_ERR_BAD_PARAM`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_address(
    d: tbon_daemon,
    index: usize,
    buf: *mut c_char,
    len: *mut usize,
) -> tbon_rc {
    guard(|| {
        non_null(len, "len")?;
        let addrs = handle(d)?.addresses();
        let Some(a) = addrs.get(index) else {
            return fail(
                tbon_rc::TBON_ERR_BAD_PARAM,
                format!(
                    "address index {index}: this daemon has {} addresses",
                    addrs.len()
                ),
            );
        };
        // SAFETY: `len` checked above; `buf` and `*len` are the caller's promise.
        unsafe { put_text(buf, len, &a.to_string(), "the address") }
    })
}

/// Stores this daemon's rank in `*out`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_rank(d: tbon_daemon, out: *mut u32) -> tbon_rc {
    guard(|| {
        non_null(out, "out")?;
        let r = handle(d)?.rank();
        // SAFETY: checked above.
        unsafe { put(out, r) };
        Ok(())
    })
}

/// Stores the number of daemons in the DVM in `*out`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_size(d: tbon_daemon, out: *mut u32) -> tbon_rc {
    guard(|| {
        non_null(out, "out")?;
        let s = handle(d)?.size();
        // SAFETY: checked above.
        unsafe { put(out, s) };
        Ok(())
    })
}

/// Blocks until wire-up has completed (`TBON_OK`, also once the daemon stopped after it), the
/// daemon stopped before it (`TBON_ERR_SHUT_DOWN`) or `timeout_ms` passed
/// (`TBON_ERR_TIMED_OUT`). Sends made before are queued, not lost. Not from
/// a callback.
#[unsafe(no_mangle)]
pub extern "C" fn tbon_wait_wired(d: tbon_daemon, timeout_ms: u32) -> tbon_rc {
    guard(|| {
        not_in_callback("tbon_wait_wired")?;
        let h = handle(d)?;
        if h.wait_wired(Duration::from_millis(timeout_ms.into())) {
            Ok(())
        } else if h.is_stopped() {
            fail(
                tbon_rc::TBON_ERR_SHUT_DOWN,
                "the daemon stopped before wire-up completed",
            )
        } else {
            fail(
                tbon_rc::TBON_ERR_TIMED_OUT,
                "wire-up did not complete in time",
            )
        }
    })
}

/// Blocks until the daemon has stopped (`TBON_OK`, whatever the reason: `tbon_stop_reason`
/// tells an orderly end from a failure) or `timeout_ms` passed (`TBON_ERR_TIMED_OUT`). With 0,
/// just tells whether it has stopped. The handle stays valid until `tbon_free`. Not from a
/// callback.
#[unsafe(no_mangle)]
pub extern "C" fn tbon_wait_stopped(d: tbon_daemon, timeout_ms: u32) -> tbon_rc {
    guard(|| {
        not_in_callback("tbon_wait_stopped")?;
        let h = handle(d)?;
        match h.wait_stopped(Duration::from_millis(timeout_ms.into())) {
            Some(_) => Ok(()),
            None => fail(tbon_rc::TBON_ERR_TIMED_OUT, "the daemon is still running"),
        }
    })
}

/// Writes a fresh random job key (64 hex characters and a newline) to a new file at `path`,
/// readable by its owner only (mode 0600): what `key_file` (`TBON_KEY_FILE`) then names for
/// every daemon of the DVM, as `tbon keygen FILE` does. The file must not exist, so a running
/// DVM's key is never overwritten: `TBON_ERR_CONFIG` then, or if it cannot be created (the
/// cause in `tbon_last_error`); `TBON_ERR_BAD_PARAM` for a NULL or non-UTF-8 path.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_key_generate(path: *const c_char) -> tbon_rc {
    guard(|| {
        // SAFETY: the caller's NUL-terminated string, valid for the call.
        let path = unsafe { str_arg(path, "path") }?;
        tbon::driver::key::generate(std::path::Path::new(path)).or_else(|e| {
            fail(
                tbon_rc::TBON_ERR_CONFIG,
                format!("cannot write a new key file {path}: {e}"),
            )
        })
    })
}

/// Why the daemon stopped: stores the reason in `*reason` (`TBON_STOP_RUNNING` while it runs)
/// and, if `len` is not NULL, its text: `*len` is the buffer's size in bytes on entry and the
/// size the text needs (with its NUL) on return; with `buf` NULL that is all (a size query),
/// else the text is copied, or `TBON_ERR_TOO_LARGE` if it does not fit (the reason is stored
/// all the same). Never blocks: after `tbon_wait_stopped` answered `TBON_OK`, the reason is
/// final. Callable from any thread, callbacks included, until `tbon_free`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_stop_reason(
    d: tbon_daemon,
    reason: *mut tbon_stop,
    buf: *mut c_char,
    len: *mut usize,
) -> tbon_rc {
    guard(|| {
        non_null(reason, "reason")?;
        let h = handle(d)?;
        let stopped = h.stop_reason();
        let code = match &stopped {
            None => tbon_stop::TBON_STOP_RUNNING,
            Some(StopReason::Requested) => tbon_stop::TBON_STOP_REQUESTED,
            Some(StopReason::DvmShutdown) => tbon_stop::TBON_STOP_DVM_SHUTDOWN,
            Some(StopReason::Aborted) => tbon_stop::TBON_STOP_ABORTED,
            Some(StopReason::RootLost(_)) => tbon_stop::TBON_STOP_ROOT_LOST,
            Some(StopReason::DeclaredDead(_)) => tbon_stop::TBON_STOP_DECLARED_DEAD,
            Some(StopReason::Left) => tbon_stop::TBON_STOP_LEFT,
            Some(_) => tbon_stop::TBON_STOP_FATAL,
        };
        // SAFETY: checked above.
        unsafe { put(reason, code) };
        if len.is_null() {
            return Ok(());
        }
        let text = stopped.map_or_else(|| "running".to_string(), |r| r.to_string());
        if buf.is_null() {
            // The size query.
            // SAFETY: non-null, checked above.
            unsafe { put(len, text.len() + 1) };
            return Ok(());
        }
        // SAFETY: `len` non-null; `buf` and `*len` are the caller's promise.
        unsafe { put_text(buf, len, &text, "the stop reason") }
    })
}

fn stop_call(d: tbon_daemon, call: &str, f: impl FnOnce(&Handle)) -> Res {
    not_in_callback(call)?;
    let h = handle(d)?;
    f(&h);
    Ok(())
}

/// Stops this daemon: pending sends complete with `TBON_ERR_SHUT_DOWN`, queued frames get a
/// short bounded linger, sockets close, and the loop thread is joined before this returns, so
/// no callback of this daemon runs afterwards. The handle stays valid until `tbon_free`:
/// whatever needs a running daemon (sends, broadcasts, collectives, the data exchange,
/// receives, fault handlers, counters, status, streams, opening a job for clients) then gives
/// `TBON_ERR_SHUT_DOWN`; the queries still answer (`tbon_contact_uri`, `tbon_rank`,
/// `tbon_size`, `tbon_stop_reason`, `tbon_wait_stopped`, `tbon_client_socket_path`, and
/// `tbon_wait_wired`: `TBON_OK` if wire-up had completed); cleanup has nothing left to do and
/// is `TBON_OK` (`tbon_cancel`, `tbon_purge`, `tbon_fetch_cancel`, `tbon_forget_group`,
/// `tbon_client_job_close`), as is stopping again (`tbon_shutdown`, `tbon_shutdown_dvm`,
/// `tbon_abort`). After `tbon_free` every call with the handle gives `TBON_ERR_BAD_HANDLE`.
/// Not from a callback.
#[unsafe(no_mangle)]
pub extern "C" fn tbon_shutdown(d: tbon_daemon) -> tbon_rc {
    guard(|| stop_call(d, "tbon_shutdown", Handle::shutdown))
}

/// Leaves the DVM in order (shrink): this daemon's own reliable messages are given a few
/// seconds to be acknowledged, then rank 0 confirms its departure to every daemon (their trees
/// are repaired around it, and it is not reported as a failure), and once every living daemon
/// knows, the daemon stops by itself with `TBON_STOP_LEFT` (`tbon_wait_stopped`, then
/// `tbon_stop_reason`). Returns at once. Sends and other commands give `TBON_ERR_SHUT_DOWN`
/// from now on. Errors: `TBON_ERR_NOT_PERMITTED` on rank 0 (shut the DVM down instead),
/// `TBON_ERR_BUSY` before wire-up, `TBON_ERR_SHUT_DOWN` when stopping or already leaving.
#[unsafe(no_mangle)]
pub extern "C" fn tbon_leave(d: tbon_daemon) -> tbon_rc {
    guard(|| {
        let h = handle(d)?;
        match h.leave() {
            Ok(()) => Ok(()),
            Err(e @ tbon::LeaveError::Rank0) => {
                fail(tbon_rc::TBON_ERR_NOT_PERMITTED, e.to_string())
            }
            Err(e @ tbon::LeaveError::NotWired) => fail(tbon_rc::TBON_ERR_BUSY, e.to_string()),
            Err(e) => fail(tbon_rc::TBON_ERR_SHUT_DOWN, e.to_string()),
        }
    })
}

/// On rank 0: tells every daemon of the DVM to stop (a broadcast down the tree), then stops this
/// one as `tbon_shutdown` does. On other ranks: `tbon_shutdown`. Not from a callback.
#[unsafe(no_mangle)]
pub extern "C" fn tbon_shutdown_dvm(d: tbon_daemon) -> tbon_rc {
    guard(|| stop_call(d, "tbon_shutdown_dvm", Handle::shutdown_dvm))
}

/// Stops this daemon the way a crash looks to the others (sockets closed without flushing, no
/// notice), for fault injection and tests. Joins the loop thread. Not from a callback.
#[unsafe(no_mangle)]
pub extern "C" fn tbon_abort(d: tbon_daemon) -> tbon_rc {
    guard(|| stop_call(d, "tbon_abort", Handle::abort))
}

/// Stops the daemon if it is running (as `tbon_shutdown`) and frees the handle: afterwards every
/// call with it returns `TBON_ERR_BAD_HANDLE`, and no callback of it runs any more, so the
/// caller may free its `user` data. Not from a callback.
#[unsafe(no_mangle)]
pub extern "C" fn tbon_free(d: tbon_daemon) -> tbon_rc {
    guard(|| {
        not_in_callback("tbon_free")?;
        let removed = {
            let mut r = registry();
            let e = r.daemons.remove(&d);
            r.release_if_empty();
            e
        };
        let Some(e) = removed else {
            return fail(
                tbon_rc::TBON_ERR_BAD_HANDLE,
                format!("no daemon with handle {d} (never started or already freed)"),
            );
        };
        let owner = e.owner.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(owner); // Daemon::drop: shutdown + join
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Messaging.

/// Sends `len` bytes at `data` to rank `dst` with `tag`, without waiting. tbon COPIES the bytes
/// before returning: the buffer stays the caller's and may be reused at once. `data` may be NULL
/// when `len` is 0. Plain (unacknowledged) delivery; see the header's overview.
///
/// `cb` (may be NULL) is called exactly once, on the loop thread, if and only if this returns
/// `TBON_OK`. Argument errors are returned at once (`TBON_ERR_RESERVED_TAG`,
/// `TBON_ERR_RANK_OUT_OF_RANGE`, `TBON_ERR_TOO_LARGE`), as is `TBON_ERR_SHUT_DOWN` or
/// `TBON_ERR_BUSY`: the send queue towards `dst`'s next hop is congested (flow control: nothing
/// was queued; offer the message again later, with back-off), or, from a callback, the command
/// queue is full.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_send(
    d: tbon_daemon,
    dst: u32,
    tag: u32,
    data: *const c_void,
    len: usize,
    cb: tbon_send_cb,
    user: *mut c_void,
) -> tbon_rc {
    guard(|| {
        let h = handle(d)?;
        // SAFETY: the caller's buffer, valid for this call.
        let payload = unsafe { payload_arg(&h, data, len)? };
        match completion(cb, user) {
            Some(done) => h.send_with(dst, tag, payload, done)?,
            None => h.send(dst, tag, payload)?,
        }
        Ok(())
    })
}

/// `tbon_send_routed`: do not ask for a direct link because of this send.
pub const TBON_ROUTE_TREE: c_int = 0;
/// `tbon_send_routed`: ask the destination for a direct link if none is open or asked for
/// (unless a recent denial is cached).
pub const TBON_ROUTE_DIRECT: c_int = 1;

/// `tbon_send` with `route` (`TBON_ROUTE_TREE` or `TBON_ROUTE_DIRECT`) overriding the daemon's
/// `route` setting for the decision whether to ask `dst` for a direct link. The message itself
/// takes an open direct link to `dst` if there is one and the tree otherwise, so it never
/// overtakes an earlier message to `dst`. Errors as `tbon_send`, and `TBON_ERR_BAD_PARAM` for
/// another `route`.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn tbon_send_routed(
    d: tbon_daemon,
    dst: u32,
    tag: u32,
    data: *const c_void,
    len: usize,
    route: c_int,
    cb: tbon_send_cb,
    user: *mut c_void,
) -> tbon_rc {
    guard(|| {
        let route = match route {
            TBON_ROUTE_TREE => tbon::Route::Tree,
            TBON_ROUTE_DIRECT => tbon::Route::Direct,
            r => {
                return fail(
                    tbon_rc::TBON_ERR_BAD_PARAM,
                    format!("route {r} is not a route"),
                );
            }
        };
        let h = handle(d)?;
        // SAFETY: the caller's buffer, valid for this call.
        let payload = unsafe { payload_arg(&h, data, len)? };
        match completion(cb, user) {
            Some(done) => h.send_routed_with(dst, tag, payload, route, done)?,
            None => h.send_routed(dst, tag, payload, route)?,
        }
        Ok(())
    })
}

/// One message of `tbon_send_batch`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tbon_outgoing {
    /// The destination rank.
    pub dst: u32,
    /// The tag (at least `TBON_TAG_USER_MIN`).
    pub tag: u32,
    /// The payload (may be NULL when `len` is 0); copied before `tbon_send_batch` returns.
    pub data: *const c_void,
    /// How many bytes `data` points to.
    pub len: usize,
}

/// Sends the `n` messages at `msgs` as plain sends, without waiting, handed to the daemon's loop
/// in groups of up to `TBON_SEND_BATCH_MAX` messages and 16 MiB of payload (one hand-over each instead of one per message: the
/// call for many small messages). Every payload is COPIED (into one buffer per group) before
/// this returns. Messages to one destination stay in order. No completions: use `tbon_send`
/// with a callback to learn a message's fate. Consecutive messages of at most 256 bytes to one
/// destination travel as one batch frame (one header and one relay hop for the run; the
/// receiver still gets each message on its own).
///
/// `*sent` (`sent` may be NULL) is set to how many leading messages were sent. `TBON_OK`: all
/// `n`. `TBON_ERR_BUSY`: message `*sent` was refused by flow control (its next hop is
/// congested), or the group it starts would take the payload bytes waiting for the loop past
/// their share (about 16 MiB), or, from a callback, the command queue is full (elsewhere a
/// full queue is waited for); it and those after it were not sent: offer them again later,
/// with back-off (`tbon_last_error()` says which bound). An argument error in any message (`TBON_ERR_RESERVED_TAG`,
/// `TBON_ERR_RANK_OUT_OF_RANGE`, `TBON_ERR_TOO_LARGE`, `TBON_ERR_BAD_PARAM` for a NULL `data`
/// with a non-zero `len`, or a NULL `msgs` with a non-zero `n`) sends nothing; the message
/// names the index. `TBON_ERR_SHUT_DOWN` once the daemon stopped.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_send_batch(
    d: tbon_daemon,
    msgs: *const tbon_outgoing,
    n: usize,
    sent: *mut usize,
) -> tbon_rc {
    if !sent.is_null() {
        // SAFETY: non-null; the caller promised it is writable.
        unsafe { put(sent, 0) };
    }
    guard(|| {
        let h = handle(d)?;
        if n == 0 {
            return Ok(());
        }
        non_null(msgs, "msgs")?;
        if n > isize::MAX as usize / std::mem::size_of::<tbon_outgoing>() {
            return fail(
                tbon_rc::TBON_ERR_TOO_LARGE,
                format!("{n} messages is more than any array holds"),
            );
        }
        // SAFETY: non-null, within isize::MAX bytes, and the caller promised `n` readable
        // elements for the call.
        let all = unsafe { std::slice::from_raw_parts(msgs, n) };
        let (size, max) = (h.size(), h.msg_max_bytes());
        for (i, m) in all.iter().enumerate() {
            let e = if m.tag < tbon::rml::TAG_USER_MIN {
                Some(SendError::ReservedTag(m.tag))
            } else if m.dst >= size {
                Some(SendError::RankOutOfRange { rank: m.dst, size })
            } else if m.len > max {
                Some(SendError::TooLarge { len: m.len, max })
            } else {
                None
            };
            if let Some(e) = e {
                return fail(send_rc(&e), format!("message {i}: {e}"));
            }
            if m.len > 0 && m.data.is_null() {
                return fail(
                    tbon_rc::TBON_ERR_BAD_PARAM,
                    format!("message {i}: data is NULL"),
                );
            }
        }
        let mut done = 0usize;
        let mut batch = tbon::Batch::new();
        let mut rest = all;
        while !rest.is_empty() {
            // A group: at most SEND_BATCH_MAX messages and COMMAND_QUEUE_MAX_BYTES of payload
            // (at least one message), which bounds the copy made here.
            let (mut n_group, mut total) = (0usize, 0usize);
            for m in rest.iter().take(tbon::limits::SEND_BATCH_MAX) {
                if n_group > 0 && total + m.len > tbon::limits::COMMAND_QUEUE_MAX_BYTES {
                    break;
                }
                n_group += 1;
                total += m.len;
            }
            let (group, after) = rest.split_at(n_group);
            rest = after;
            let mut buf = bytes::BytesMut::with_capacity(total);
            for m in group.iter().filter(|m| m.len > 0) {
                // SAFETY: checked non-null above; the caller promised `len` readable bytes.
                buf.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(m.data.cast::<u8>(), m.len)
                });
            }
            let mut buf = buf.freeze();
            for m in group {
                batch.push(m.dst, m.tag, buf.split_to(m.len))?;
            }
            let r = h.send_batch(&mut batch);
            done += group.len() - batch.len();
            if !sent.is_null() {
                // SAFETY: as above.
                unsafe { put(sent, done) };
            }
            r?;
        }
        Ok(())
    })
}

/// Sends `len` bytes at `data` to rank `dst` with `tag` RELIABLY, without waiting: the message
/// reaches `dst`'s receive matching exactly once, in order with this daemon's other reliable
/// messages to `dst`, even while daemons on its path die and the tree is repaired. Copies the
/// bytes like `tbon_send`; `data` may be NULL when `len` is 0. Reliable and plain messages are
/// not ordered with respect to each other.
///
/// `cb` (may be NULL) is called exactly once, on the loop thread, if and only if this returns
/// `TBON_OK`: with `TBON_OK` once `dst` has posted the message (delivered to a receive, or
/// held for one), `TBON_ERR_NODE_DOWN` if `dst` died first, `TBON_ERR_BUSY` if the next hop
/// became congested between the call and the moment the daemon took it, `TBON_ERR_SHUT_DOWN`
/// if this daemon stops first,
/// `TBON_ERR_UNREACHABLE` if the retransmissions ran out. A reliable send to this daemon
/// itself is delivered locally and completes `TBON_OK`. Returned at once: the same errors as
/// `tbon_send`, and `TBON_ERR_BUSY` when `relm_unacked_max` reliable messages of this daemon
/// are unacknowledged (nothing was sent: offer it again later).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_send_reliable(
    d: tbon_daemon,
    dst: u32,
    tag: u32,
    data: *const c_void,
    len: usize,
    cb: tbon_send_cb,
    user: *mut c_void,
) -> tbon_rc {
    guard(|| {
        let h = handle(d)?;
        // SAFETY: the caller's buffer, valid for this call.
        let payload = unsafe { payload_arg(&h, data, len)? };
        match completion(cb, user) {
            Some(done) => h.send_reliable_with(dst, tag, payload, done)?,
            None => h.send_reliable(dst, tag, payload)?,
        }
        Ok(())
    })
}

/// Frees a zero-copy payload (`tbon_send_nocopy`): called with the `data` and `free_user` given.
pub type tbon_free_cb = Option<unsafe extern "C" fn(data: *mut c_void, free_user: *mut c_void)>;

/// A caller's buffer lent to tbon: handed back to `free` when the last reference is dropped.
/// The caller's lent buffer as `Bytes`: `free_cb(data, free_user)` runs exactly once, when
/// the last `Bytes` sharing it is dropped, also when this returns an error (a NULL `data` with
/// a length). `TBON_ERR_BAD_PARAM` for a NULL `free_cb`, which is then not called.
fn lend(
    data: *mut c_void,
    len: usize,
    free_cb: tbon_free_cb,
    free_user: *mut c_void,
) -> Result<Bytes, Fail> {
    let Some(free) = free_cb else {
        return fail(tbon_rc::TBON_ERR_BAD_PARAM, "free_cb is NULL");
    };
    // From here on, every way out (errors, panics) drops `lent` exactly once via `Bytes`.
    let lent = Bytes::from_owner(Lent {
        data,
        len,
        free,
        user: free_user,
    });
    if len > 0 {
        non_null(data, "data")?;
    }
    // No slice may span more (its bytes are sliced later); `lent` is freed on the way out.
    if len > isize::MAX as usize {
        return fail(
            tbon_rc::TBON_ERR_TOO_LARGE,
            format!("{len} bytes is larger than any buffer"),
        );
    }
    Ok(lent)
}

struct Lent {
    data: *mut c_void,
    len: usize,
    free: unsafe extern "C" fn(*mut c_void, *mut c_void),
    user: *mut c_void,
}

// SAFETY: the caller promised (header) that the buffer stays valid and unmodified until `free`
// runs, and that `free` may run on any thread; tbon only reads the bytes.
unsafe impl Send for Lent {}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 || self.data.is_null() {
            return &[];
        }
        // SAFETY: non-null; `len` readable bytes until `free` runs (the caller's promise).
        unsafe { std::slice::from_raw_parts(self.data.cast::<u8>(), self.len) }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let _scope = CallbackScope::enter();
        // SAFETY: the caller's function, called once, with the arguments it gave.
        unsafe { (self.free)(self.data, self.user) }
    }
}

/// `tbon_send` without the copy: tbon reads `len` bytes at `data` in place, and calls
/// `free_cb(data, free_user)` exactly once when it no longer needs them, WHATEVER this call
/// returns (on an error, before it returns), on any thread (usually the loop thread; it counts
/// as a callback). Until then the buffer must stay valid and unmodified. `free_cb` must not be
/// NULL (`TBON_ERR_BAD_PARAM`, and then it is not called). `cb` and `user` as `tbon_send`.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn tbon_send_nocopy(
    d: tbon_daemon,
    dst: u32,
    tag: u32,
    data: *mut c_void,
    len: usize,
    free_cb: tbon_free_cb,
    free_user: *mut c_void,
    cb: tbon_send_cb,
    user: *mut c_void,
) -> tbon_rc {
    guard(|| {
        let payload = lend(data, len, free_cb, free_user)?;
        let h = handle(d)?;
        let max = h.msg_max_bytes();
        if len > max {
            return Err(SendError::TooLarge { len, max }.into());
        }
        match completion(cb, user) {
            Some(done) => h.send_with(dst, tag, payload, done)?,
            None => h.send(dst, tag, payload)?,
        }
        Ok(())
    })
}

/// Broadcasts `len` bytes at `data` with `tag` to every living daemon, this one included: the
/// fault-tolerant broadcast. Any daemon may broadcast; every living daemon delivers every
/// broadcast exactly once, all in the same order (a sender's broadcasts in its order), across
/// the deaths of daemons. Copies like `tbon_send`; the largest payload is `msg_max_bytes` less
/// 29 bytes (`TBON_ERR_TOO_LARGE` beyond). A payload above rank 0's `bcast_part_bytes` (256
/// KiB) travels down the tree in parts, each forwarded as it arrives; it is still delivered
/// whole, once.
///
/// `cb` (may be NULL) is called exactly once, on the loop thread, if and only if this returns
/// `TBON_OK`: `TBON_OK` once every living daemon has delivered it, `TBON_ERR_BUSY` if rank 0's
/// window of broadcasts in flight was full or this daemon already has its bound of
/// broadcasts outstanding (256; nothing was broadcast; retry later): without `cb` such a
/// refusal goes unseen, so pass one when every broadcast must go out,
/// `TBON_ERR_SHUT_DOWN` if this daemon stops first.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_broadcast(
    d: tbon_daemon,
    tag: u32,
    data: *const c_void,
    len: usize,
    cb: tbon_send_cb,
    user: *mut c_void,
) -> tbon_rc {
    guard(|| {
        let h = handle(d)?;
        // SAFETY: the caller's buffer, valid for this call.
        let payload = unsafe { payload_arg(&h, data, len)? };
        match completion(cb, user) {
            Some(done) => h.broadcast_with(tag, payload, done)?,
            None => h.broadcast(tag, payload)?,
        }
        Ok(())
    })
}

/// One daemon's contribution in an allgather result (see `tbon_allgather_cb`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tbon_contribution {
    /// The contributing rank.
    pub rank: u32,
    /// Its bytes (NULL when `len` is 0), valid only during the callback.
    pub data: *const u8,
    /// How many bytes `data` points to.
    pub len: usize,
}

/// Allgather result callback: called once, on the loop thread. With `TBON_OK`: `count`
/// contributions ordered by rank (every living daemon's) and the `nexcluded` excluded ranks,
/// ascending (those that died before their contribution reached the tree); both arrays, and the
/// bytes they point to, are valid only during the call. Otherwise the arrays are NULL and the
/// counts 0: `TBON_ERR_TOO_LARGE` (the gathered bytes exceeded the bound: the collective
/// overflowed everywhere), `TBON_ERR_DUPLICATE` (this daemon already used `id`),
/// `TBON_ERR_BUSY` (too many collectives in flight here), `TBON_ERR_RESULT_LOST` (only on a
/// daemon that rejoined or joined, for a collective that finished before it was admitted and
/// whose result no daemon it asked still had), `TBON_ERR_SHUT_DOWN`.
pub type tbon_allgather_cb = Option<
    unsafe extern "C" fn(
        rc: tbon_rc,
        id: u64,
        contributions: *const tbon_contribution,
        count: usize,
        excluded: *const u32,
        nexcluded: usize,
        user: *mut c_void,
    ),
>;

/// Contributes `len` bytes at `data` to the allgather `id`, without waiting (copies like
/// `tbon_send`; `data` may be NULL when `len` is 0). Every living daemon contributes once to
/// each collective; several may be in flight, each with its own id, which must never be reused
/// (barriers share the ids). `cb` (not NULL) gets the result, the same at every daemon; it is
/// called exactly once if and only if this returns `TBON_OK`. Returned at once:
/// `TBON_ERR_TOO_LARGE` (above 16 MiB less 8 bytes), `TBON_ERR_SHUT_DOWN`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_allgather(
    d: tbon_daemon,
    id: u64,
    data: *const c_void,
    len: usize,
    cb: tbon_allgather_cb,
    user: *mut c_void,
) -> tbon_rc {
    guard(|| {
        let Some(cb) = cb else {
            return fail(tbon_rc::TBON_ERR_BAD_PARAM, "cb is NULL");
        };
        let h = handle(d)?;
        // SAFETY: the caller's buffer, valid for this call.
        let payload = unsafe { contribution_arg(data, len)? };
        let user = UserPtr(user);
        h.allgather(id, payload, move |r| gathered(cb, id, r, user))?;
        Ok(())
    })
}

/// Copies a caller's contribution to a collective (`data` may be NULL only when `len` is 0);
/// one above `ALLGATHER_MAX_BYTES` less 8 is refused before anything is copied.
unsafe fn contribution_arg(data: *const c_void, len: usize) -> Result<Bytes, Fail> {
    if len == 0 {
        return Ok(Bytes::new());
    }
    non_null(data, "data")?;
    let max = tbon::limits::ALLGATHER_MAX_BYTES - 8;
    if len > max {
        return Err(SendError::TooLarge { len, max }.into());
    }
    // SAFETY: non-null, and the caller promised `len` readable bytes for the call.
    let s = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
    Ok(Bytes::copy_from_slice(s))
}

/// Hands an allgather's outcome to the caller's `tbon_allgather_cb` (on the loop thread): the
/// contributions and the excluded ranks, or an error code with empty arrays (an overflowed
/// result is `TBON_ERR_TOO_LARGE`). `id` is the collective's id (its number, for a group).
fn gathered(
    cb: unsafe extern "C" fn(
        tbon_rc,
        u64,
        *const tbon_contribution,
        usize,
        *const u32,
        usize,
        *mut c_void,
    ),
    id: u64,
    r: Result<tbon::AllgatherResult, SendError>,
    user: UserPtr,
) {
    let _scope = CallbackScope::enter();
    let res = match r {
        Ok(res) if res.overflowed => Err(tbon_rc::TBON_ERR_TOO_LARGE),
        Ok(res) => Ok(res),
        Err(e) => Err(send_rc(&e)),
    };
    match res {
        Ok(res) => {
            let parts: Vec<tbon_contribution> = res
                .contributions
                .iter()
                .map(|(rank, b)| tbon_contribution {
                    rank: *rank,
                    data: if b.is_empty() {
                        std::ptr::null()
                    } else {
                        b.as_ptr()
                    },
                    len: b.len(),
                })
                .collect();
            // SAFETY: the caller's function; the arrays and bytes live for the call.
            unsafe {
                cb(
                    tbon_rc::TBON_OK,
                    id,
                    parts.as_ptr(),
                    parts.len(),
                    res.excluded.as_ptr(),
                    res.excluded.len(),
                    user.get(),
                )
            }
        }
        // SAFETY: the caller's function, with empty arrays.
        Err(rc) => unsafe { cb(rc, id, std::ptr::null(), 0, std::ptr::null(), 0, user.get()) },
    }
}

/// Enters barrier `id` and waits until every living daemon has entered it, or `timeout_ms`
/// passed (`TBON_ERR_TIMED_OUT`: this daemon stays entered). A barrier is an allgather of empty
/// contributions: same ids (never reused: `TBON_ERR_DUPLICATE`), and a daemon that died is
/// not waited for. Not from a callback (`TBON_ERR_BUSY`); other errors as `tbon_allgather`.
#[unsafe(no_mangle)]
pub extern "C" fn tbon_barrier(d: tbon_daemon, id: u64, timeout_ms: u32) -> tbon_rc {
    guard(|| {
        not_in_callback("tbon_barrier")?;
        let h = handle(d)?;
        h.barrier_wait(id, Duration::from_millis(timeout_ms.into()))?;
        Ok(())
    })
}

/// Posts a receive for messages from `peer` (a rank, or `TBON_RANK_ANY`) with `tag`. `cb` (not
/// NULL) runs on the loop thread for each match: once if `persistent` is 0, else until
/// `tbon_cancel`. Messages that arrived before the post are held (bounded) and matched now. A
/// receive for a rank wins over one for `TBON_RANK_ANY` with the same tag. Errors:
/// `TBON_ERR_DUPLICATE` (same peer and tag already posted), `TBON_ERR_RESERVED_TAG`,
/// `TBON_ERR_RANK_OUT_OF_RANGE`, `TBON_ERR_SHUT_DOWN`.
#[unsafe(no_mangle)]
pub extern "C" fn tbon_recv(
    d: tbon_daemon,
    peer: u32,
    tag: u32,
    persistent: c_int,
    cb: tbon_recv_cb,
    user: *mut c_void,
) -> tbon_rc {
    guard(|| {
        let Some(cb) = cb else {
            return fail(tbon_rc::TBON_ERR_BAD_PARAM, "cb is NULL");
        };
        let h = handle(d)?;
        let user = UserPtr(user);
        h.recv_ref(
            peer_arg(peer),
            tag,
            if persistent != 0 {
                tbon::RecvMode::Persistent
            } else {
                tbon::RecvMode::Once
            },
            // Lent, not handed over: the payload only has to live for the call.
            move |m: &tbon::MessageRef<'_>| {
                let _scope = CallbackScope::enter();
                let payload = m.payload();
                let data = if payload.is_empty() {
                    std::ptr::null()
                } else {
                    payload.as_ptr()
                };
                // SAFETY: the caller's function; `data` points to `len` bytes alive for the call.
                unsafe { cb(m.origin, m.tag, data, payload.len(), user.get()) }
            },
        )?;
        Ok(())
    })
}

/// Cancels the receive posted for exactly (`peer`, `tag`); `TBON_OK` also if there was none. A
/// callback already running may finish; no new match starts after the loop handles the cancel.
/// `TBON_ERR_RANK_OUT_OF_RANGE` for a `peer` that is neither a rank of the DVM nor
/// `TBON_RANK_ANY` (as `tbon_recv` answers).
#[unsafe(no_mangle)]
pub extern "C" fn tbon_cancel(d: tbon_daemon, peer: u32, tag: u32) -> tbon_rc {
    guard(|| {
        let h = handle(d)?;
        if peer != TBON_RANK_ANY {
            rank_in_range(&h, peer)?;
        }
        h.cancel(peer_arg(peer), tag);
        Ok(())
    })
}

/// Drops every receive posted for rank `peer` and every message held from it.
/// `TBON_ERR_RANK_OUT_OF_RANGE` for a `peer` that is not a rank of the DVM (`TBON_RANK_ANY`
/// included: purge names one rank).
#[unsafe(no_mangle)]
pub extern "C" fn tbon_purge(d: tbon_daemon, peer: u32) -> tbon_rc {
    guard(|| {
        let h = handle(d)?;
        rank_in_range(&h, peer)?;
        h.purge(peer);
        Ok(())
    })
}

/// `TBON_ERR_RANK_OUT_OF_RANGE` unless `rank` is a rank of `h`'s DVM.
fn rank_in_range(h: &Handle, rank: u32) -> Res {
    if rank >= h.size() {
        return fail(
            tbon_rc::TBON_ERR_RANK_OUT_OF_RANGE,
            format!(
                "rank {rank} is out of range for a DVM of {} daemons",
                h.size()
            ),
        );
    }
    Ok(())
}

/// Waits up to `timeout_ms` for one message from `peer` (or `TBON_RANK_ANY`) with `tag`, for
/// callers without callbacks, and copies its payload into `buf`. `*len` is the size of `buf` on
/// entry and the message's full length on return. `*origin` (if `origin` is not NULL) gets the
/// sender. If the message is longer than the buffer, the first `*len`-on-entry bytes are copied,
/// the rest is discarded (the message is consumed, as MPI truncates) and `TBON_ERR_TOO_LARGE`
/// is returned with the required length in `*len`: size `buf` for `msg_max_bytes` if in doubt.
/// `buf` may be NULL only if `*len` is 0. Errors: `TBON_ERR_TIMED_OUT`, `TBON_ERR_DUPLICATE`
/// (a receive for this peer and tag is posted), `TBON_ERR_SHUT_DOWN`, argument errors as
/// `tbon_recv`. Not from a callback (`TBON_ERR_BUSY`). The receive is posted and withdrawn by
/// the daemon's loop thread (so that a message matched as the time runs out is not lost): while
/// a callback holds that thread, the call returns only once the callback has (keep callbacks
/// short).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_recv_blocking(
    d: tbon_daemon,
    peer: u32,
    tag: u32,
    timeout_ms: u32,
    buf: *mut c_void,
    len: *mut usize,
    origin: *mut u32,
) -> tbon_rc {
    guard(|| {
        not_in_callback("tbon_recv_blocking")?;
        non_null(len, "len")?;
        // SAFETY: checked above; the caller's in/out length.
        let cap = unsafe { len.read() };
        if cap > 0 {
            non_null(buf, "buf")?;
        }
        let h = handle(d)?;
        let m = h.recv_blocking(
            peer_arg(peer),
            tag,
            Duration::from_millis(timeout_ms.into()),
        )?;
        let n = m.payload.len();
        // SAFETY: `buf` has `cap` writable bytes (checked non-null when `cap > 0`), `len` and
        // `origin` are checked for null.
        unsafe {
            if n.min(cap) > 0 {
                std::ptr::copy_nonoverlapping(m.payload.as_ptr(), buf.cast::<u8>(), n.min(cap));
            }
            put(len, n);
            if !origin.is_null() {
                put(origin, m.origin);
            }
        }
        if n > cap {
            return fail(
                tbon_rc::TBON_ERR_TOO_LARGE,
                format!("message of {n} bytes truncated to the buffer's {cap}"),
            );
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Faults and counters.

/// Registers a fault handler (see `tbon_fault_cb`); handlers run in registration order, after
/// tbon has re-routed or failed what was queued for the dead ranks. `cb` must not be NULL.
#[unsafe(no_mangle)]
pub extern "C" fn tbon_on_fault(d: tbon_daemon, cb: tbon_fault_cb, user: *mut c_void) -> tbon_rc {
    guard(|| {
        let Some(cb) = cb else {
            return fail(tbon_rc::TBON_ERR_BAD_PARAM, "cb is NULL");
        };
        let user = UserPtr(user);
        on_repairs(d, move |s| {
            // SAFETY: the caller's function; the slice is alive for the call.
            unsafe {
                cb(
                    s.newly_failed.as_ptr(),
                    s.newly_failed.len(),
                    c_scope(s.scope),
                    s.epoch.unwrap_or(0),
                    user.get(),
                )
            }
        })
    })
}

/// Registers `f` to run (as a callback, on the loop thread) after every repair of `d`'s tree.
fn on_repairs(d: tbon_daemon, mut f: impl FnMut(&RecoveryStatus) + Send + 'static) -> Res {
    handle(d)?.on_fault(move |s: &RecoveryStatus| {
        let _scope = CallbackScope::enter();
        f(s)
    })?;
    Ok(())
}

fn c_scope(scope: Scope) -> tbon_scope {
    match scope {
        Scope::Local => tbon_scope::TBON_SCOPE_LOCAL,
        Scope::Global => tbon_scope::TBON_SCOPE_GLOBAL,
    }
}

/// Registers a repair handler (see `tbon_repair_cb`): like `tbon_on_fault`, and it also tells
/// the ranks back in the tree (rejoined or joined) and those that left in order. Handlers of
/// both kinds run in registration order. `TBON_ERR_BAD_PARAM` if `cb` is NULL.
#[unsafe(no_mangle)]
pub extern "C" fn tbon_on_repair(d: tbon_daemon, cb: tbon_repair_cb, user: *mut c_void) -> tbon_rc {
    guard(|| {
        let Some(cb) = cb else {
            return fail(tbon_rc::TBON_ERR_BAD_PARAM, "cb is NULL");
        };
        let user = UserPtr(user);
        on_repairs(d, move |s| {
            let list = |v: &[u32]| {
                if v.is_empty() {
                    (std::ptr::null(), 0)
                } else {
                    (v.as_ptr(), v.len())
                }
            };
            let (failed, nfailed) = list(&s.newly_failed);
            let (restored, nrestored) = list(&s.restored);
            let (departed, ndeparted) = list(&s.departed);
            let repair = tbon_repair {
                failed,
                nfailed,
                restored,
                nrestored,
                departed,
                ndeparted,
                scope: c_scope(s.scope),
                epoch: s.epoch.unwrap_or(0),
            };
            // SAFETY: the caller's function; `repair` and the lists are alive for the call.
            unsafe { cb(&repair, user.get()) }
        })
    })
}

/// Fills `*out` with a snapshot of this daemon's counters (a round trip to the loop thread).
/// Not from a callback (`TBON_ERR_BUSY`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_counters_get(d: tbon_daemon, out: *mut tbon_counters) -> tbon_rc {
    guard(|| {
        not_in_callback("tbon_counters_get")?;
        non_null(out, "out")?;
        let c = handle(d)?.counters()?;
        // SAFETY: checked above.
        unsafe { put(out, tbon_counters::from(&c)) };
        Ok(())
    })
}
