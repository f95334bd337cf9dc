//! The C API of clients routed through their daemon (issue "Jobs", part 3; `tbon::clients`).
//! The daemon's side opens a job for client processes (`tbon_client_job`,
//! `tbon_client_job_with_key`, `tbon_client_socket_path`, `tbon_client_job_close`); an
//! application process connects as a `tbon_client` (`tbon_client_connect`,
//! `tbon_client_from_env`), sends to other clients by name, receives (blocking into its
//! buffer, or by callback), watches other clients' exits, and closes (`tbon_client_close`).
//! Part of the FFI module: the same rules (guard, registry ids, pointers read only during the
//! call, blocking calls refused in callbacks).
//!
//! What this layer adds to `tbon::Client`: a message too long for the caller's buffer is set
//! aside (bounded) instead of lost, and the next matching receive gets it; the waits are cut
//! into slices, so that `tbon_client_close` on another thread ends them, and a close waits
//! for the calls in progress before it closes the connection (after it, no callback runs).

use super::{
    Fail, Res, UserPtr, fail, guard, handle, non_null, not_in_callback, put, put_text, registry,
    str_arg, tbon_daemon, tbon_rc, tbon_send_cb,
};
use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::ffi::{CString, c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{RecvTimeoutError, channel};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tbon::clients::{ClientMessage, ClientReceiveId, ENV_JOB, ENV_KEY, ENV_SOCKET, parse_key};
use tbon::error::SendError;
use tbon::{Client, ClientError, ClientName, ExitReason};

/// A client process's connection to its daemon: an id from `tbon_client_connect` or
/// `tbon_client_from_env`, valid until `tbon_client_close`; 0 is never valid.
pub type tbon_client = u64;

/// `tbon_client_recv`/`tbon_client_recv_cb`: as both `from_rank` and `from_local`, a message
/// from any client (one of them alone is `TBON_ERR_BAD_PARAM`).
pub const TBON_CLIENT_ANY: u32 = 0xFFFF_FFFF;

/// `tbon_client_recv`/`tbon_client_recv_cb`: as `tag`, a message with any tag (a message
/// sent with tag 0xFFFFFFFF is then received only this way).
pub const TBON_TAG_ANY: u32 = 0xFFFF_FFFF;

/// The size of the buffer `tbon_client_job` writes the job's client key into: 64 hexadecimal
/// digits and a NUL.
pub const TBON_CLIENT_KEY_HEX_SIZE: usize = 65;

/// Sends of one client unanswered at once: `tbon_client_send` then waits for a result,
/// `tbon_client_try_send` returns `TBON_ERR_BUSY`.
pub const TBON_CLIENT_SENDS_INFLIGHT_MAX: usize = 256;
const _: () = assert!(TBON_CLIENT_SENDS_INFLIGHT_MAX == tbon::limits::CLIENT_SENDS_INFLIGHT_MAX);

/// Receives one client may have posted (`tbon_client_recv_cb`), and names it may watch
/// (`tbon_client_watch`): one more is `TBON_ERR_BUSY`.
pub const TBON_CLIENT_RECEIVES_MAX: usize = 4096;
const _: () = assert!(TBON_CLIENT_RECEIVES_MAX == tbon::limits::CLIENT_RECEIVES_MAX);
const _: () = assert!(TBON_CLIENT_RECEIVES_MAX == tbon::limits::CLIENT_WATCHES_MAX);

/// Messages one client holds for receives not yet made (beyond it the library stops reading
/// its socket, and the senders wait), and messages set aside by `tbon_client_recv` for being
/// longer than the buffer (beyond it a receive that matches none of them is `TBON_ERR_BUSY`).
pub const TBON_CLIENT_UNMATCHED_MAX: usize = 4096;
const _: () = assert!(TBON_CLIENT_UNMATCHED_MAX == tbon::limits::CLIENT_UNMATCHED_MAX);

/// Why a watched client is reported gone (`tbon_client_watch_cb`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum tbon_client_exit {
    /// Its connection to its daemon closed: it exited, crashed or called `tbon_client_close`
    /// (also before the watch reached its daemon).
    TBON_CLIENT_EXITED = 1,
    /// Its daemon died (or stopped), or was known dead when the watch was made.
    TBON_CLIENT_DAEMON_DIED = 2,
    /// No client of that name was ever admitted (or the rank is not in the DVM).
    TBON_CLIENT_UNKNOWN = 3,
}

/// Client receive callback (`tbon_client_recv_cb`): the sender's name (`from_rank`,
/// `from_local`), the tag, and the payload (`data` NULL when `len` is 0), valid only during
/// the call: copy what you keep.
pub type tbon_client_msg_cb = Option<
    unsafe extern "C" fn(
        from_rank: u32,
        from_local: u32,
        tag: u32,
        data: *const u8,
        len: usize,
        user: *mut c_void,
    ),
>;

/// Watch callback (`tbon_client_watch`): called once with the watched client's name and why
/// it is gone.
pub type tbon_client_watch_cb = Option<
    unsafe extern "C" fn(rank: u32, local: u32, reason: tbon_client_exit, user: *mut c_void),
>;

/// Daemon-lost callback (`tbon_client_on_daemon_lost`): called once with why the connection
/// ended (NUL-terminated, valid during the call only).
pub type tbon_client_lost_cb =
    Option<unsafe extern "C" fn(reason: *const c_char, user: *mut c_void)>;

/// How long a wait lasts before it looks again at the client's close and at the messages set
/// aside by other threads.
const SLICE: Duration = Duration::from_millis(50);

/// A connected client in the registry.
pub(super) struct ClientEntry {
    client: Client,
    /// Set by `tbon_client_close`: the calls waiting on other threads give up.
    closed: AtomicBool,
    /// Messages `tbon_client_recv` took that were longer than the caller's buffer, oldest
    /// first (at most `TBON_CLIENT_UNMATCHED_MAX`).
    aside: Mutex<VecDeque<ClientMessage>>,
    /// Posted receives: the C id, and the library's once the post is made (a one-shot
    /// receive's entry goes when it matches).
    posts: Arc<Mutex<HashMap<u64, Option<ClientReceiveId>>>>,
    next_post: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn client_rc(e: &ClientError) -> tbon_rc {
    match e {
        ClientError::UnknownClient(_) => tbon_rc::TBON_ERR_UNKNOWN_CLIENT,
        ClientError::NotPermitted(_) => tbon_rc::TBON_ERR_NOT_PERMITTED,
        ClientError::ClientGone(_) => tbon_rc::TBON_ERR_CLIENT_GONE,
        ClientError::NodeDown(_) => tbon_rc::TBON_ERR_NODE_DOWN,
        ClientError::TooLarge { .. } => tbon_rc::TBON_ERR_TOO_LARGE,
        ClientError::ReservedTag(_) => tbon_rc::TBON_ERR_RESERVED_TAG,
        ClientError::Busy => tbon_rc::TBON_ERR_BUSY,
        ClientError::TimedOut => tbon_rc::TBON_ERR_TIMED_OUT,
        ClientError::Cancelled => tbon_rc::TBON_ERR_CANCELLED,
        ClientError::DaemonLost => tbon_rc::TBON_ERR_DAEMON_LOST,
        ClientError::Refused(_) => tbon_rc::TBON_ERR_REFUSED,
        ClientError::Io(_) => tbon_rc::TBON_ERR_UNREACHABLE,
        ClientError::NoSocket => tbon_rc::TBON_ERR_NO_SOCKET,
        // A cause added to the library after this table: a bug here, not the caller's.
        _ => tbon_rc::TBON_ERR_INTERNAL,
    }
}

impl From<ClientError> for Fail {
    fn from(e: ClientError) -> Self {
        Fail(client_rc(&e), e.to_string())
    }
}

/// A daemon's answer to opening a job, as the daemon's calls report it (a stopped daemon is
/// `TBON_ERR_SHUT_DOWN`, as for every call on a daemon handle).
fn job_fail(e: ClientError) -> Fail {
    let rc = match e {
        ClientError::DaemonLost => tbon_rc::TBON_ERR_SHUT_DOWN,
        ClientError::Io(_) => tbon_rc::TBON_ERR_INTERNAL,
        ref other => client_rc(other),
    };
    Fail(rc, e.to_string())
}

fn exit_code(r: ExitReason) -> tbon_client_exit {
    match r {
        ExitReason::Exited => tbon_client_exit::TBON_CLIENT_EXITED,
        ExitReason::DaemonDied => tbon_client_exit::TBON_CLIENT_DAEMON_DIED,
        ExitReason::Unknown => tbon_client_exit::TBON_CLIENT_UNKNOWN,
        // A reason added to the library after this table: the client is gone all the same.
        _ => tbon_client_exit::TBON_CLIENT_EXITED,
    }
}

fn client_entry(c: tbon_client) -> Result<Arc<ClientEntry>, Fail> {
    match registry().clients.get(&c) {
        Some(e) => Ok(Arc::clone(e)),
        None => fail(
            tbon_rc::TBON_ERR_BAD_HANDLE,
            format!("no client with handle {c} (never connected or already closed)"),
        ),
    }
}

/// `TBON_ERR_DAEMON_LOST` once `tbon_client_close` began on another thread.
fn open(e: &ClientEntry) -> Res {
    if e.closed.load(Ordering::Acquire) {
        return fail(
            tbon_rc::TBON_ERR_DAEMON_LOST,
            "the client was closed by another thread",
        );
    }
    Ok(())
}

/// A job's client key from a caller's string of 64 hexadecimal digits.
unsafe fn key_arg(key_hex: *const c_char) -> Result<[u8; 32], Fail> {
    // SAFETY: the caller's string, valid for the call.
    let text = unsafe { str_arg(key_hex, "key_hex")? };
    parse_key(text).or_else(|e| fail(tbon_rc::TBON_ERR_BAD_PARAM, format!("key_hex: {e}")))
}

/// The jobs a job accepts messages from (`accept` may be NULL only when `n` is 0).
unsafe fn jobs_arg<'a>(accept: *const u64, n: usize) -> Result<&'a [u64], Fail> {
    if n == 0 {
        return Ok(&[]);
    }
    // Before the slice is made: a length beyond the bound must not be read (or be undefined).
    let max = tbon::limits::CLIENT_ACCEPT_FROM_MAX;
    if n > max {
        return fail(
            tbon_rc::TBON_ERR_TOO_LARGE,
            format!("accept_from lists {n} jobs; at most {max}"),
        );
    }
    non_null(accept, "accept_from")?;
    // SAFETY: non-null, and the caller promised `n` readable job numbers for the call.
    Ok(unsafe { std::slice::from_raw_parts(accept, n) })
}

/// A receive's sender filter: both wildcards (any client) or a name.
fn from_arg(rank: u32, local: u32) -> Result<Option<ClientName>, Fail> {
    match (rank == TBON_CLIENT_ANY, local == TBON_CLIENT_ANY) {
        (true, true) => Ok(None),
        (false, false) => Ok(Some(ClientName { rank, local })),
        _ => fail(
            tbon_rc::TBON_ERR_BAD_PARAM,
            "from_rank and from_local are both TBON_CLIENT_ANY (any client) or neither",
        ),
    }
}

fn tag_arg(tag: u32) -> Option<u32> {
    (tag != TBON_TAG_ANY).then_some(tag)
}

fn matches(m: &ClientMessage, from: Option<ClientName>, tag: Option<u32>) -> bool {
    from.is_none_or(|f| f == m.from) && tag.is_none_or(|t| t == m.tag)
}

fn deadline(timeout_ms: u32) -> Option<Instant> {
    (timeout_ms != super::TBON_WAIT_FOREVER)
        .then(|| Instant::now() + Duration::from_millis(timeout_ms.into()))
}

/// How long the next wait may last: a slice, less when the deadline is nearer; `None` once
/// the deadline has passed.
fn slice(until: Option<Instant>) -> Option<Duration> {
    match until {
        None => Some(SLICE),
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            (!left.is_zero()).then(|| left.min(SLICE))
        }
    }
}

/// Copies a caller's payload (`data` may be NULL only when `len` is 0); one above the
/// client's `msg_max_bytes` is refused before anything is copied.
unsafe fn payload_arg(client: &Client, data: *const c_void, len: usize) -> Result<Bytes, Fail> {
    if len == 0 {
        return Ok(Bytes::new());
    }
    non_null(data, "data")?;
    let max = client.msg_max_bytes();
    if len > max {
        return Err(ClientError::TooLarge { len, max }.into());
    }
    // SAFETY: non-null, and the caller promised `len` readable bytes for the call.
    let s = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
    Ok(Bytes::copy_from_slice(s))
}

type Done = Box<dyn FnOnce(Result<(), ClientError>) + Send>;

/// Hands a send to the client: at once, or, when `may_wait` (and not in a callback), trying
/// again while `TBON_CLIENT_SENDS_INFLIGHT_MAX` sends are unanswered, until there is room or
/// the client is closed. `done` makes the completion for each try (a refused try drops it
/// uncalled).
fn submit(
    e: &ClientEntry,
    to: ClientName,
    tag: u32,
    payload: Bytes,
    may_wait: bool,
    done: impl Fn() -> Done,
) -> Res {
    let may_wait = may_wait && !super::IN_CALLBACK.with(|f| f.get());
    let mut pause = Duration::from_millis(1);
    loop {
        open(e)?;
        match e.client.try_send(to, tag, payload.clone(), done()) {
            Ok(()) => return Ok(()),
            Err(ClientError::Busy) if may_wait => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(10));
            }
            Err(err) => return Err(err.into()),
        }
    }
}

fn completion(cb: tbon_send_cb, user: *mut c_void) -> impl Fn() -> Done {
    let user = UserPtr(user);
    move || -> Done {
        match cb {
            None => Box::new(|_| {}),
            Some(cb) => Box::new(move |r: Result<(), ClientError>| {
                let rc = match &r {
                    Ok(()) => tbon_rc::TBON_OK,
                    Err(e) => client_rc(e),
                };
                let _scope = super::CallbackScope::enter();
                // SAFETY: the caller's function, called with the arguments its type promises.
                unsafe { cb(rc, user.get()) }
            }),
        }
    }
}

/// Hands a message to the caller's receive callback.
fn deliver(
    cb: unsafe extern "C" fn(u32, u32, u32, *const u8, usize, *mut c_void),
    user: UserPtr,
    m: &ClientMessage,
) {
    let _scope = super::CallbackScope::enter();
    let data = if m.payload.is_empty() {
        std::ptr::null()
    } else {
        m.payload.as_ptr()
    };
    // SAFETY: the caller's function; `data` points to `len` bytes alive for the call.
    unsafe {
        cb(
            m.from.rank,
            m.from.local,
            m.tag,
            data,
            m.payload.len(),
            user.get(),
        )
    }
}

/// Puts a connected client in the registry and its id in `*out` (non-null, checked).
unsafe fn register(client: Client, out: *mut tbon_client) {
    let entry = Arc::new(ClientEntry {
        client,
        closed: AtomicBool::new(false),
        aside: Mutex::new(VecDeque::new()),
        posts: Arc::new(Mutex::new(HashMap::new())),
        next_post: AtomicU64::new(1),
    });
    let mut r = registry();
    let id = r.new_id();
    r.clients.insert(id, entry);
    drop(r);
    // SAFETY: the caller checked it.
    unsafe { put(out, id) };
}

// ---------------------------------------------------------------------------------------------
// The daemon's side.

/// Opens `job` for client processes on daemon `d`, with a fresh random key, and writes the key
/// as 64 hexadecimal digits and a NUL into `key_hex` (`TBON_CLIENT_KEY_HEX_SIZE` bytes). Give
/// the processes of the job the key, the job's number and the daemon's socket
/// (`tbon_client_socket_path`), for example as the variables `tbon_client_from_env` reads
/// (`TBON_CLIENT_SOCKET`, `TBON_CLIENT_JOB`, `TBON_CLIENT_KEY`); keep the key private. The
/// job's clients may message only clients of `job`, and clients of the `n_accept` jobs at
/// `accept_from` (NULL when `n_accept` is 0; copied) may message them (each receiver's own
/// daemon decides). Opening a job again makes a new key (clients admitted stay) and replaces
/// the list. The job is open once this returns: its processes may connect at once.
///
/// Errors: `TBON_ERR_NO_SOCKET` (the daemon's `client_socket` setting is unset),
/// `TBON_ERR_BUSY` (1,024 jobs open on this daemon; or from a callback: this call waits for
/// the daemon's loop), `TBON_ERR_SHUT_DOWN`, `TBON_ERR_BAD_PARAM` (`key_hex` NULL,
/// `accept_from` NULL with `n_accept` > 0), `TBON_ERR_TOO_LARGE` (`n_accept` above 1,024,
/// `CLIENT_ACCEPT_FROM_MAX`: nothing is read), `TBON_ERR_BAD_HANDLE`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_client_job(
    d: tbon_daemon,
    job: u64,
    accept_from: *const u64,
    n_accept: usize,
    key_hex: *mut c_char,
) -> tbon_rc {
    guard(|| {
        not_in_callback("tbon_client_job")?;
        non_null(key_hex, "key_hex")?;
        // SAFETY: the caller's array, valid for this call.
        let accept = unsafe { jobs_arg(accept_from, n_accept)? };
        let h = handle(d)?;
        if h.is_stopped() {
            return Err(SendError::ShutDown.into());
        }
        let cred = h.client_job(job, accept).map_err(job_fail)?;
        let hex = cred.key_hex();
        // SAFETY: the caller promised TBON_CLIENT_KEY_HEX_SIZE writable bytes (64 digits and
        // the NUL; checked non-null above).
        unsafe {
            std::ptr::copy_nonoverlapping(hex.as_ptr(), key_hex.cast::<u8>(), hex.len());
            key_hex.add(hex.len()).write(0);
        }
        Ok(())
    })
}

/// `tbon_client_job` with the key the caller chose (`key_hex`: 64 hexadecimal digits,
/// NUL-terminated): a resource manager that starts one job's processes on many nodes gives
/// every daemon of the job the same key, so that one environment serves every process. Make
/// the key from 32 bytes of a cryptographic random source (`tbon keygen FILE` writes one).
/// Errors as `tbon_client_job`, and `TBON_ERR_BAD_PARAM` for a key that is not 64
/// hexadecimal digits.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_client_job_with_key(
    d: tbon_daemon,
    job: u64,
    key_hex: *const c_char,
    accept_from: *const u64,
    n_accept: usize,
) -> tbon_rc {
    guard(|| {
        not_in_callback("tbon_client_job_with_key")?;
        // SAFETY: the caller's string and array, valid for this call.
        let (key, accept) = unsafe { (key_arg(key_hex)?, jobs_arg(accept_from, n_accept)?) };
        let h = handle(d)?;
        if h.is_stopped() {
            return Err(SendError::ShutDown.into());
        }
        h.client_job_with_key(job, key, accept).map_err(job_fail)?;
        Ok(())
    })
}

/// Copies the path of daemon `d`'s client socket (its `client_socket` setting), NUL-terminated,
/// into `buf`, as `tbon_contact_uri` does: `*len` is the size of `buf` on entry and the size
/// needed on return; `TBON_ERR_TOO_LARGE` (nothing copied) if `buf` is too small or NULL.
/// `TBON_ERR_NO_SOCKET` if the setting is unset. Answers also once the daemon stopped.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_client_socket_path(
    d: tbon_daemon,
    buf: *mut c_char,
    len: *mut usize,
) -> tbon_rc {
    guard(|| {
        non_null(len, "len")?;
        let e = super::entry(d)?;
        let Some(path) = e.client_socket.as_deref() else {
            return Err(ClientError::NoSocket.into());
        };
        // SAFETY: `len` checked above; `buf` and `*len` are the caller's promise.
        unsafe { put_text(buf, len, path, "the client socket's path") }
    })
}

/// No new client of `job` is admitted on daemon `d` (its clients connected stay until they
/// exit). `TBON_OK` also for a job never opened, and once the daemon stopped (nothing is left
/// to close). `TBON_ERR_BUSY` from a callback when the command queue is full.
#[unsafe(no_mangle)]
pub extern "C" fn tbon_client_job_close(d: tbon_daemon, job: u64) -> tbon_rc {
    guard(|| match handle(d)?.client_job_close(job) {
        Err(ClientError::DaemonLost) => Ok(()),
        r => Ok(r?),
    })
}

/// `job` is over on daemon `d` (its processes were killed, say): no new client is admitted,
/// and every client of the job connected to `d` is disconnected (its `tbon_client_daemon_lost`
/// reason says "job J ended" when the notice reached it); whoever watches them is told
/// `TBON_CLIENT_EXITED`. `TBON_OK` also for a job never opened, and once the daemon stopped.
/// `TBON_ERR_BUSY` from a callback when the command queue is full.
#[unsafe(no_mangle)]
pub extern "C" fn tbon_client_job_end(d: tbon_daemon, job: u64) -> tbon_rc {
    guard(|| match handle(d)?.client_job_end(job) {
        Err(ClientError::DaemonLost) => Ok(()),
        r => Ok(r?),
    })
}

// ---------------------------------------------------------------------------------------------
// The client's side.

/// Connects to the daemon's client socket at `socket` as a process of `job` holding its key
/// (`key_hex`, 64 hexadecimal digits, as `tbon_client_job` wrote it) and stores the client's
/// handle in `*out`. Waits for the daemon's answer (at most 10 s). Errors:
/// `TBON_ERR_REFUSED` (the daemon did not admit it: wrong key, job not open, uid not in
/// `client_uids`, too many clients; its reason in `tbon_last_error`), `TBON_ERR_UNREACHABLE`
/// (no daemon at `socket`, or it broke the protocol; the cause in `tbon_last_error`),
/// `TBON_ERR_BAD_PARAM` (NULL or non-UTF-8 `socket`, a bad key, NULL `out`), `TBON_ERR_BUSY`
/// (from a callback).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_client_connect(
    socket: *const c_char,
    job: u64,
    key_hex: *const c_char,
    out: *mut tbon_client,
) -> tbon_rc {
    guard(|| {
        not_in_callback("tbon_client_connect")?;
        non_null(out, "out")?;
        // SAFETY: the caller's strings, valid for this call.
        let (socket, key) = unsafe { (str_arg(socket, "socket")?, key_arg(key_hex)?) };
        let client = Client::connect(socket, job, &key)?;
        // SAFETY: checked above.
        unsafe { register(client, out) };
        Ok(())
    })
}

/// `tbon_client_connect` with what the environment holds: `TBON_CLIENT_SOCKET`,
/// `TBON_CLIENT_JOB` (the job's number) and `TBON_CLIENT_KEY` (its key, 64 hexadecimal
/// digits), what a resource manager sets for the processes it starts. `TBON_ERR_CONFIG` when
/// one is unset or malformed (its name in `tbon_last_error`); otherwise as
/// `tbon_client_connect`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_client_from_env(out: *mut tbon_client) -> tbon_rc {
    guard(|| {
        not_in_callback("tbon_client_from_env")?;
        non_null(out, "out")?;
        let var = |n: &str| {
            std::env::var(n).or_else(|e| fail(tbon_rc::TBON_ERR_CONFIG, format!("{n}: {e}")))
        };
        let socket = var(ENV_SOCKET)?;
        let job: u64 = match var(ENV_JOB)?.trim().parse() {
            Ok(j) => j,
            Err(e) => return fail(tbon_rc::TBON_ERR_CONFIG, format!("{ENV_JOB}: {e}")),
        };
        let key = match parse_key(&var(ENV_KEY)?) {
            Ok(k) => k,
            Err(e) => return fail(tbon_rc::TBON_ERR_CONFIG, format!("{ENV_KEY}: {e}")),
        };
        let client = Client::connect(socket, job, &key)?;
        // SAFETY: checked above.
        unsafe { register(client, out) };
        Ok(())
    })
}

/// Closes client `c` and frees its handle; 0 does nothing (`TBON_OK`). Its daemon removes it,
/// and the clients watching it are told `TBON_CLIENT_EXITED`. Calls on `c` in progress on
/// other threads end first (a wait ends `TBON_ERR_DAEMON_LOST` within 50 ms); then the
/// connection closes. Close does not flush: sends it accepted and the daemon has not yet
/// answered may never be delivered; to be sure they were, wait for their callbacks (or use
/// `tbon_client_send_wait`) before closing. The callbacks of sends still unanswered get
/// `TBON_ERR_DAEMON_LOST` and
/// the daemon-lost callbacks run, on the client's thread, before this returns. Afterwards no
/// callback of `c` runs any more: the safe point to free their `user` data. From a callback,
/// this does not wait: the connection closes once the calls on `c` in progress returned, and
/// those last callbacks may run after this returns (after the calling callback, when it is
/// one of `c`'s). `TBON_ERR_BAD_HANDLE` if `c` is not a client (or was closed already).
#[unsafe(no_mangle)]
pub extern "C" fn tbon_client_close(c: tbon_client) -> tbon_rc {
    guard(|| {
        if c == 0 {
            return Ok(());
        }
        let removed = {
            let mut r = registry();
            let e = r.clients.remove(&c);
            r.release_if_empty();
            e
        };
        let Some(mut entry) = removed else {
            return fail(
                tbon_rc::TBON_ERR_BAD_HANDLE,
                format!("no client with handle {c} (never connected or already closed)"),
            );
        };
        entry.closed.store(true, Ordering::Release);
        if super::IN_CALLBACK.with(|f| f.get()) {
            // The last call holding it drops it (the client's own thread is not joined
            // from itself).
            return Ok(());
        }
        // The other calls on it see `closed` within a slice and return.
        loop {
            match Arc::try_unwrap(entry) {
                Ok(last) => {
                    last.client.close();
                    return Ok(());
                }
                Err(shared) => {
                    entry = shared;
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    })
}

/// Stores client `c`'s name in `*rank` (its daemon's rank) and `*local` (its id at that
/// daemon, from 1, never reused while the daemon runs); either may be NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_client_name(
    c: tbon_client,
    rank: *mut u32,
    local: *mut u32,
) -> tbon_rc {
    guard(|| {
        let name = client_entry(c)?.client.name();
        // SAFETY: each checked for null; the caller's out-pointers.
        unsafe {
            if !rank.is_null() {
                put(rank, name.rank);
            }
            if !local.is_null() {
                put(local, name.local);
            }
        }
        Ok(())
    })
}

/// Stores the DVM's size in `*size` (client names have ranks below it).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_client_size(c: tbon_client, size: *mut u32) -> tbon_rc {
    guard(|| {
        non_null(size, "size")?;
        let n = client_entry(c)?.client.size();
        // SAFETY: checked above.
        unsafe { put(size, n) };
        Ok(())
    })
}

/// Stores in `*max` the largest payload client `c` may send (the DVM's `msg_max_bytes` less
/// the 28-byte header a client message carries between daemons): a buffer that large receives
/// any message.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_client_msg_max(c: tbon_client, max: *mut usize) -> tbon_rc {
    guard(|| {
        non_null(max, "max")?;
        let n = client_entry(c)?.client.msg_max_bytes();
        // SAFETY: checked above.
        unsafe { put(max, n) };
        Ok(())
    })
}

/// Sends `len` bytes at `data` (COPIED before this returns; NULL when `len` is 0) with `tag`
/// (at least `TBON_TAG_USER_MIN`) to client (`rank`, `local`). Messages from one client to
/// another arrive in the order sent, each once. `cb` (may be NULL) is called exactly once,
/// on the client's thread, if and only if this returns `TBON_OK`: `TBON_OK` once the
/// receiver's daemon has queued the message for the receiver, or why it never will be:
/// `TBON_ERR_UNKNOWN_CLIENT` (no such client was ever admitted, or the rank is not in the
/// DVM), `TBON_ERR_NOT_PERMITTED` (the receiver's job does not accept this client's),
/// `TBON_ERR_CLIENT_GONE` (the receiver exited), `TBON_ERR_NODE_DOWN` (the receiver's daemon
/// died before answering: the message may or may not have arrived), `TBON_ERR_DAEMON_LOST`
/// (this client's daemon is gone, or this client was closed).
///
/// Waits while `TBON_CLIENT_SENDS_INFLIGHT_MAX` sends are unanswered (from a callback:
/// `TBON_ERR_BUSY` instead). Returned at once: `TBON_ERR_RESERVED_TAG`, `TBON_ERR_TOO_LARGE`
/// (above `tbon_client_msg_max`), `TBON_ERR_DAEMON_LOST`, `TBON_ERR_BAD_PARAM`,
/// `TBON_ERR_BAD_HANDLE`.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn tbon_client_send(
    c: tbon_client,
    rank: u32,
    local: u32,
    tag: u32,
    data: *const c_void,
    len: usize,
    cb: tbon_send_cb,
    user: *mut c_void,
) -> tbon_rc {
    guard(|| {
        let e = client_entry(c)?;
        // SAFETY: the caller's buffer, valid for this call.
        let payload = unsafe { payload_arg(&e.client, data, len)? };
        let to = ClientName { rank, local };
        submit(&e, to, tag, payload, true, completion(cb, user))
    })
}

/// `tbon_client_send` that never waits: `TBON_ERR_BUSY` (nothing sent, `cb` not called) while
/// `TBON_CLIENT_SENDS_INFLIGHT_MAX` sends are unanswered.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn tbon_client_try_send(
    c: tbon_client,
    rank: u32,
    local: u32,
    tag: u32,
    data: *const c_void,
    len: usize,
    cb: tbon_send_cb,
    user: *mut c_void,
) -> tbon_rc {
    guard(|| {
        let e = client_entry(c)?;
        // SAFETY: the caller's buffer, valid for this call.
        let payload = unsafe { payload_arg(&e.client, data, len)? };
        let to = ClientName { rank, local };
        submit(&e, to, tag, payload, false, completion(cb, user))
    })
}

/// Sends as `tbon_client_send` and waits for the result, at most `timeout_ms`
/// (`TBON_WAIT_FOREVER`: no limit): the code `cb` would get, or `TBON_ERR_TIMED_OUT` (the
/// message may still be delivered), or an error returned at once. Not from a callback
/// (`TBON_ERR_BUSY`).
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn tbon_client_send_wait(
    c: tbon_client,
    rank: u32,
    local: u32,
    tag: u32,
    data: *const c_void,
    len: usize,
    timeout_ms: u32,
) -> tbon_rc {
    guard(|| {
        not_in_callback("tbon_client_send_wait")?;
        let until = deadline(timeout_ms);
        let e = client_entry(c)?;
        // SAFETY: the caller's buffer, valid for this call.
        let payload = unsafe { payload_arg(&e.client, data, len)? };
        let to = ClientName { rank, local };
        let (tx, rx) = channel::<Result<(), ClientError>>();
        submit(&e, to, tag, payload, true, || -> Done {
            let tx = tx.clone();
            Box::new(move |r| {
                let _ = tx.send(r);
            })
        })?;
        drop(tx);
        loop {
            open(&e)?;
            let Some(wait) = slice(until) else {
                return Err(ClientError::TimedOut.into());
            };
            match rx.recv_timeout(wait) {
                Ok(r) => return Ok(r?),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return Err(ClientError::DaemonLost.into()),
            }
        }
    })
}

/// Waits up to `timeout_ms` (`TBON_WAIT_FOREVER`: no limit) for a message from client
/// (`from_rank`, `from_local`) (both `TBON_CLIENT_ANY`: any client) with `tag`
/// (`TBON_TAG_ANY`: any tag), and copies its payload into `buf` (`cap` bytes). `*len` (`len`
/// not NULL) gets the payload's length; `*from_rank`, `*from_local` and `*tag_out` (each may
/// be NULL) the sender and the tag. Messages from one sender come in the order it sent them.
/// Messages a posted receive (`tbon_client_recv_cb`) matches never come here.
///
/// A message longer than `cap` is NOT consumed: `TBON_ERR_TOO_LARGE` with its length, sender
/// and tag stored, nothing copied, and the message set aside for this client: the next
/// receive (this call or `tbon_client_recv_cb`) that matches it gets it before any other. So
/// `buf` NULL with `cap` 0 asks the next message's length; a buffer of `tbon_client_msg_max`
/// bytes takes any message. `buf` may be NULL only when `cap` is 0.
///
/// Errors: `TBON_ERR_TIMED_OUT` (nothing taken), `TBON_ERR_DAEMON_LOST` (the daemon is gone
/// and nothing matching is left, or the client was closed), `TBON_ERR_BUSY`
/// (`TBON_CLIENT_UNMATCHED_MAX` messages set aside and none matches; or from a callback),
/// `TBON_ERR_BAD_PARAM` (`len` NULL, `buf` NULL with `cap` > 0, one wildcard of the two),
/// `TBON_ERR_BAD_HANDLE`.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn tbon_client_recv(
    c: tbon_client,
    from_rank: u32,
    from_local: u32,
    tag: u32,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
    from_rank_out: *mut u32,
    from_local_out: *mut u32,
    tag_out: *mut u32,
    timeout_ms: u32,
) -> tbon_rc {
    guard(|| {
        not_in_callback("tbon_client_recv")?;
        non_null(len, "len")?;
        if cap > 0 {
            non_null(buf, "buf")?;
        }
        let from = from_arg(from_rank, from_local)?;
        let tag = tag_arg(tag);
        let until = deadline(timeout_ms);
        let e = client_entry(c)?;
        let tell = |m: &ClientMessage| {
            // SAFETY: `len` checked non-null above, the others checked here; the caller's
            // out-pointers.
            unsafe {
                put(len, m.payload.len());
                if !from_rank_out.is_null() {
                    put(from_rank_out, m.from.rank);
                }
                if !from_local_out.is_null() {
                    put(from_local_out, m.from.local);
                }
                if !tag_out.is_null() {
                    put(tag_out, m.tag);
                }
            }
        };
        let too_large = |m: &ClientMessage| -> Res {
            tell(m);
            fail(
                tbon_rc::TBON_ERR_TOO_LARGE,
                format!(
                    "a message of {} bytes from {} (tag {}) for a buffer of {cap}: kept for the \
                     next receive that matches it; *len is its length",
                    m.payload.len(),
                    m.from,
                    m.tag
                ),
            )
        };
        let m = loop {
            {
                let mut aside = lock(&e.aside);
                if let Some(pos) = aside.iter().position(|m| matches(m, from, tag)) {
                    if aside[pos].payload.len() > cap {
                        return too_large(&aside[pos]);
                    }
                    if let Some(m) = aside.remove(pos) {
                        break m;
                    }
                }
                if aside.len() >= TBON_CLIENT_UNMATCHED_MAX {
                    return fail(
                        tbon_rc::TBON_ERR_BUSY,
                        "TBON_CLIENT_UNMATCHED_MAX messages are set aside for being longer than \
                         the buffers: receive them with a larger buffer",
                    );
                }
            }
            open(&e)?;
            let Some(wait) = slice(until) else {
                return Err(ClientError::TimedOut.into());
            };
            match e.client.recv(from, tag, Some(wait)) {
                Ok(m) if m.payload.len() > cap => {
                    let r = too_large(&m);
                    lock(&e.aside).push_back(m);
                    return r;
                }
                Ok(m) => break m,
                Err(ClientError::TimedOut) => {}
                Err(err) => return Err(err.into()),
            }
        };
        let n = m.payload.len();
        if n > 0 {
            // SAFETY: `buf` is non-null with `cap >= n` writable bytes (the caller's promise).
            unsafe { std::ptr::copy_nonoverlapping(m.payload.as_ptr(), buf.cast::<u8>(), n) };
        }
        tell(&m);
        Ok(())
    })
}

/// Posts a receive: `cb` (not NULL) gets each message from client (`from_rank`, `from_local`)
/// (both `TBON_CLIENT_ANY`: any) with `tag` (`TBON_TAG_ANY`: any), once if `persistent` is 0,
/// else every one until `tbon_client_cancel`. Messages already held (those set aside by
/// `tbon_client_recv` first) are matched at once, on the calling thread before this returns;
/// later ones on the client's thread. Posted receives are tried in the order posted.
/// `*id` (if `id` is not NULL) gets the receive's id for `tbon_client_cancel`. Errors:
/// `TBON_ERR_BUSY` (`TBON_CLIENT_RECEIVES_MAX` receives posted), `TBON_ERR_BAD_PARAM` (a NULL
/// `cb`, one wildcard of the two), `TBON_ERR_DAEMON_LOST` (the client was closed),
/// `TBON_ERR_BAD_HANDLE`. A receive posted once the daemon is gone stays posted, unmatched.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn tbon_client_recv_cb(
    c: tbon_client,
    from_rank: u32,
    from_local: u32,
    tag: u32,
    persistent: c_int,
    cb: tbon_client_msg_cb,
    user: *mut c_void,
    id: *mut u64,
) -> tbon_rc {
    guard(|| {
        let Some(cb) = cb else {
            return fail(tbon_rc::TBON_ERR_BAD_PARAM, "cb is NULL");
        };
        let from = from_arg(from_rank, from_local)?;
        let tag = tag_arg(tag);
        let persistent = persistent != 0;
        let e = client_entry(c)?;
        open(&e)?;
        let user = UserPtr(user);
        let post = e.next_post.fetch_add(1, Ordering::Relaxed);
        let give_id = || {
            if !id.is_null() {
                // SAFETY: checked for null; the caller's out-pointer.
                unsafe { put(id, post) };
            }
        };
        // The messages set aside first, in order.
        let held: Vec<ClientMessage> = {
            let mut aside = lock(&e.aside);
            let mut taken = Vec::new();
            while let Some(pos) = aside.iter().position(|m| matches(m, from, tag)) {
                taken.extend(aside.remove(pos));
                if !persistent {
                    break;
                }
            }
            taken
        };
        for m in &held {
            deliver(cb, user, m);
        }
        if !persistent && !held.is_empty() {
            give_id();
            return Ok(());
        }
        lock(&e.posts).insert(post, None);
        let posts = Arc::clone(&e.posts);
        let posted = e.client.recv_cb(from, tag, persistent, move |m| {
            if !persistent {
                lock(&posts).remove(&post);
            }
            deliver(cb, user, &m);
        });
        let mut table = lock(&e.posts);
        match posted {
            Ok(rid) => {
                // A one-shot receive that matched meanwhile is gone already.
                if let Some(slot) = table.get_mut(&post) {
                    *slot = Some(rid);
                }
            }
            Err(err) => {
                table.remove(&post);
                return Err(err.into());
            }
        }
        drop(table);
        give_id();
        Ok(())
    })
}

/// Withdraws the receive `id` posted on client `c` (`tbon_client_recv_cb`); `TBON_OK` also if
/// it is gone (a one-shot receive that matched, an unknown id). A callback already running
/// finishes.
#[unsafe(no_mangle)]
pub extern "C" fn tbon_client_cancel(c: tbon_client, id: u64) -> tbon_rc {
    guard(|| {
        let e = client_entry(c)?;
        let rid = lock(&e.posts).remove(&id).flatten();
        if let Some(rid) = rid {
            e.client.cancel(rid);
        }
        Ok(())
    })
}

/// `cb` (not NULL) runs once, on the client's thread, when client (`rank`, `local`) exits
/// (`TBON_CLIENT_EXITED`), when its daemon dies (`TBON_CLIENT_DAEMON_DIED`), or, through the
/// daemon, at once if it is not alive: `TBON_CLIENT_EXITED` if it had exited,
/// `TBON_CLIENT_UNKNOWN` if it never was. Any client may watch any other, of any job.
/// Errors: `TBON_ERR_BUSY` (`TBON_CLIENT_RECEIVES_MAX` names watched),
/// `TBON_ERR_DAEMON_LOST` (this client's daemon is gone, or the client was closed; `cb` is
/// then never called), `TBON_ERR_BAD_PARAM`, `TBON_ERR_BAD_HANDLE`.
#[unsafe(no_mangle)]
pub extern "C" fn tbon_client_watch(
    c: tbon_client,
    rank: u32,
    local: u32,
    cb: tbon_client_watch_cb,
    user: *mut c_void,
) -> tbon_rc {
    guard(|| {
        let Some(cb) = cb else {
            return fail(tbon_rc::TBON_ERR_BAD_PARAM, "cb is NULL");
        };
        let e = client_entry(c)?;
        open(&e)?;
        let user = UserPtr(user);
        e.client
            .watch(ClientName { rank, local }, move |n, why| {
                let _scope = super::CallbackScope::enter();
                // SAFETY: the caller's function, called with the arguments its type promises.
                unsafe { cb(n.rank, n.local, exit_code(why), user.get()) }
            })
            .map_err(Fail::from)
    })
}

/// Whether client `c`'s connection to its daemon ended (the daemon died or stopped, or broke
/// the protocol): `*lost` 1 or 0. If `len` is not NULL, also why, as `tbon_stop_reason` gives
/// its text: `*len` is the buffer's size on entry and the size the text needs (with its NUL;
/// "" while connected) on return; with `buf` NULL that is all, else the text is copied, or
/// `TBON_ERR_TOO_LARGE` if it does not fit (`*lost` is stored all the same). Never blocks.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_client_daemon_lost(
    c: tbon_client,
    lost: *mut c_int,
    buf: *mut c_char,
    len: *mut usize,
) -> tbon_rc {
    guard(|| {
        non_null(lost, "lost")?;
        let why = client_entry(c)?.client.daemon_lost();
        // SAFETY: checked above.
        unsafe { put(lost, c_int::from(why.is_some())) };
        if len.is_null() {
            return Ok(());
        }
        let text = why.unwrap_or_default();
        if buf.is_null() {
            // The size query.
            // SAFETY: non-null, checked above.
            unsafe { put(len, text.len() + 1) };
            return Ok(());
        }
        // SAFETY: `len` non-null; `buf` and `*len` are the caller's promise.
        unsafe { put_text(buf, len, &text, "the reason") }
    })
}

/// `cb` (not NULL) runs once when client `c`'s connection to its daemon ends, with why: on the
/// client's thread (also during `tbon_client_close`), or at once on this thread if it has
/// ended already. Receives and sends then fail `TBON_ERR_DAEMON_LOST`; the client cannot
/// reconnect (close it and connect anew once a daemon serves the socket again).
#[unsafe(no_mangle)]
pub extern "C" fn tbon_client_on_daemon_lost(
    c: tbon_client,
    cb: tbon_client_lost_cb,
    user: *mut c_void,
) -> tbon_rc {
    guard(|| {
        let Some(cb) = cb else {
            return fail(tbon_rc::TBON_ERR_BAD_PARAM, "cb is NULL");
        };
        let e = client_entry(c)?;
        let user = UserPtr(user);
        e.client.on_daemon_lost(move |why| {
            let _scope = super::CallbackScope::enter();
            let text = CString::new(why.replace('\0', " ")).unwrap_or_default();
            // SAFETY: the caller's function; the string lives for the call.
            unsafe { cb(text.as_ptr(), user.get()) }
        });
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    //! What the C layer adds to `tbon::Client`: argument errors as codes, a message longer than
    //! the buffer set aside (never lost) and found by the next receive of either kind, receive
    //! ids and their cancel, blocking calls refused in a callback, a close that ends another
    //! thread's wait, the daemon's loss. (`examples/c/client.c` runs the rest as a C user.)
    use crate::*;
    use std::ffi::CString;
    use std::ptr::{null, null_mut};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    const TAG: u32 = 200;

    /// A message as the receive callback saw it: (rank, local, tag, bytes).
    type Msg = (u32, u32, u32, Vec<u8>);

    /// What the receive callback saw, and what calls made inside it answered.
    #[derive(Default)]
    struct Seen {
        got: Mutex<Vec<Msg>>,
        inside: Mutex<Vec<tbon_rc>>,
        client: Mutex<tbon_client>,
    }

    unsafe extern "C" fn on_msg(
        rank: u32,
        local: u32,
        tag: u32,
        data: *const u8,
        len: usize,
        user: *mut c_void,
    ) {
        // SAFETY: a `Seen` the test keeps alive while callbacks can run.
        let seen = unsafe { &*user.cast::<Seen>() };
        let bytes = if len == 0 {
            Vec::new()
        } else {
            // SAFETY: `len` bytes valid during the call.
            unsafe { std::slice::from_raw_parts(data, len) }.to_vec()
        };
        seen.got.lock().unwrap().push((rank, local, tag, bytes));
        let c = *seen.client.lock().unwrap();
        let (mut buf, mut n) = ([0u8; 8], 0usize);
        // SAFETY: valid pointers for the calls.
        let inside = unsafe {
            [
                tbon_client_recv(
                    c,
                    TBON_CLIENT_ANY,
                    TBON_CLIENT_ANY,
                    TBON_TAG_ANY,
                    buf.as_mut_ptr().cast(),
                    8,
                    &mut n,
                    null_mut(),
                    null_mut(),
                    null_mut(),
                    0,
                ),
                tbon_client_send_wait(c, rank, local, TAG, null(), 0, 10),
            ]
        };
        seen.inside.lock().unwrap().extend(inside);
    }

    fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
        let start = Instant::now();
        while !f() {
            assert!(start.elapsed() < Duration::from_secs(60), "{what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// What `tbon_client_recv` answered: (code, length, sender's rank and local id, tag).
    type Got = (tbon_rc, usize, u32, u32, u32);

    /// `tbon_client_recv` into `buf` (`None`: NULL and 0, the length query).
    fn recv(c: tbon_client, from: (u32, u32), tag: u32, buf: Option<&mut [u8]>, ms: u32) -> Got {
        let (mut n, mut fr, mut fl, mut ft) = (0, 0, 0, 0);
        let (p, cap) = match buf {
            Some(b) => (b.as_mut_ptr().cast(), b.len()),
            None => (null_mut(), 0),
        };
        // SAFETY: valid pointers for the call.
        let rc = unsafe {
            tbon_client_recv(
                c, from.0, from.1, tag, p, cap, &mut n, &mut fr, &mut fl, &mut ft, ms,
            )
        };
        (rc, n, fr, fl, ft)
    }

    const ANY: (u32, u32) = (TBON_CLIENT_ANY, TBON_CLIENT_ANY);

    #[test]
    fn arguments_set_aside_messages_receive_ids_callbacks_close_and_loss() {
        use tbon_rc::*;
        let dir = std::env::temp_dir().join(format!("tbon-ffi-clients-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("job.key");
        std::fs::write(&key, "clients-test-key-0123456789").unwrap();
        let set = |cfg, k: &str, v: &str| {
            let (k, v) = (CString::new(k).unwrap(), CString::new(v).unwrap());
            // SAFETY: valid strings for the call.
            unsafe { tbon_config_set(cfg, k.as_ptr(), v.as_ptr()) }
        };
        let (mut cfg, mut d) = (0, [0u64; 2]);
        let mut uri = [0 as c_char; 512];
        let mut len = uri.len();
        // SAFETY: valid out-pointers and strings.
        unsafe {
            assert_eq!(tbon_config_new(&mut cfg), TBON_OK);
            assert_eq!(set(cfg, "if_include", "127.0.0.1/32"), TBON_OK);
            assert_eq!(set(cfg, "key_file", key.to_str().unwrap()), TBON_OK);
            // No socket yet: no job.
            assert_eq!(tbon_start(cfg, 0, 2, null(), &mut d[0]), TBON_OK);
            let mut hex = [0 as c_char; TBON_CLIENT_KEY_HEX_SIZE];
            let rc = tbon_client_job(d[0], 1, null(), 0, hex.as_mut_ptr());
            assert_eq!(rc, TBON_ERR_NO_SOCKET);
            let (mut path, mut plen) = ([0 as c_char; 128], 128usize);
            let rc = tbon_client_socket_path(d[0], path.as_mut_ptr(), &mut plen);
            assert_eq!(rc, TBON_ERR_NO_SOCKET);
            assert_eq!(tbon_contact_uri(d[0], uri.as_mut_ptr(), &mut len), TBON_OK);
            let sock = dir.join("d1.sock");
            assert_eq!(set(cfg, "client_socket", sock.to_str().unwrap()), TBON_OK);
            assert_eq!(tbon_start(cfg, 1, 2, uri.as_ptr(), &mut d[1]), TBON_OK);
            for &x in &d {
                assert_eq!(tbon_wait_wired(x, 60_000), TBON_OK);
            }
        }
        // The socket's path: a size query, then the path.
        let (mut path, mut plen) = ([0 as c_char; 256], 0usize);
        let mut hex = [0 as c_char; TBON_CLIENT_KEY_HEX_SIZE];
        // SAFETY: valid pointers.
        unsafe {
            let rc = tbon_client_socket_path(d[1], null_mut(), &mut plen);
            assert_eq!(rc, TBON_ERR_TOO_LARGE);
            assert_eq!(plen, dir.join("d1.sock").to_str().unwrap().len() + 1);
            plen = path.len();
            assert_eq!(
                tbon_client_socket_path(d[1], path.as_mut_ptr(), &mut plen),
                TBON_OK
            );
            assert_eq!(
                tbon_client_job(d[1], 1, null(), 3, hex.as_mut_ptr()),
                TBON_ERR_BAD_PARAM
            );
            assert_eq!(
                tbon_client_job(d[1], 1, null(), 0, null_mut()),
                TBON_ERR_BAD_PARAM
            );
            assert_eq!(
                tbon_client_job(d[1], 1, null(), 0, hex.as_mut_ptr()),
                TBON_OK
            );
            let short = CString::new("abc").unwrap();
            let rc = tbon_client_job_with_key(d[1], 2, short.as_ptr(), null(), 0);
            assert_eq!(rc, TBON_ERR_BAD_PARAM);
        }
        // SAFETY: the key was written NUL-terminated.
        let key_hex = unsafe { std::ffi::CStr::from_ptr(hex.as_ptr()) };
        assert_eq!(key_hex.to_bytes().len(), 64);

        // Argument errors, refusals and a socket nobody serves.
        let (mut a, mut b) = (0u64, 0u64);
        let nowhere = CString::new(dir.join("none.sock").to_str().unwrap()).unwrap();
        let not_utf8 = CString::new(vec![b'/', 0xff, b'x']).unwrap();
        let bad_hex = CString::new("zz".repeat(32)).unwrap();
        let mut wrong = key_hex.to_bytes().to_vec();
        wrong[0] = if wrong[0] == b'0' { b'1' } else { b'0' };
        let wrong = CString::new(wrong).unwrap();
        // SAFETY: valid pointers (NULLs where the test says).
        unsafe {
            let p = path.as_ptr();
            let k = key_hex.as_ptr();
            assert_eq!(
                tbon_client_connect(null(), 1, k, &mut a),
                TBON_ERR_BAD_PARAM
            );
            assert_eq!(
                tbon_client_connect(p, 1, null(), &mut a),
                TBON_ERR_BAD_PARAM
            );
            assert_eq!(tbon_client_connect(p, 1, k, null_mut()), TBON_ERR_BAD_PARAM);
            let rc = tbon_client_connect(not_utf8.as_ptr(), 1, k, &mut a);
            assert_eq!(rc, TBON_ERR_BAD_PARAM);
            let rc = tbon_client_connect(p, 1, bad_hex.as_ptr(), &mut a);
            assert_eq!(rc, TBON_ERR_BAD_PARAM);
            let rc = tbon_client_connect(nowhere.as_ptr(), 1, k, &mut a);
            assert_eq!(rc, TBON_ERR_UNREACHABLE);
            assert_eq!(
                tbon_client_connect(p, 1, wrong.as_ptr(), &mut a),
                TBON_ERR_REFUSED
            );
            assert_eq!(tbon_client_connect(p, 9, k, &mut a), TBON_ERR_REFUSED);
            assert_eq!(tbon_client_connect(p, 1, k, &mut a), TBON_OK);
            assert_eq!(tbon_client_connect(p, 1, k, &mut b), TBON_OK);
        }
        let (mut ar, mut al, mut br, mut bl) = (0, 0, 0, 0);
        let mut max = 0usize;
        // SAFETY: valid out-pointers.
        unsafe {
            assert_eq!(tbon_client_name(a, &mut ar, &mut al), TBON_OK);
            assert_eq!(tbon_client_name(b, &mut br, &mut bl), TBON_OK);
            assert_eq!(tbon_client_msg_max(a, &mut max), TBON_OK);
            assert_eq!(
                tbon_client_name(12345, &mut ar, null_mut()),
                TBON_ERR_BAD_HANDLE
            );
        }
        assert_eq!((ar, br), (1, 1));
        assert_ne!(al, bl);

        // A message longer than the buffer is kept: asked its length, then read.
        let msg = b"0123456789";
        let p = msg.as_ptr().cast();
        // SAFETY: valid pointers.
        unsafe {
            let rc = tbon_client_send_wait(a, br, bl, TAG, p, 10, 60_000);
            assert_eq!(rc, TBON_OK);
            let rc = tbon_client_send_wait(a, br, bl, 5, p, 10, 60_000);
            assert_eq!(rc, TBON_ERR_RESERVED_TAG);
            let rc = tbon_client_send_wait(a, br, bl, TAG, p, max + 1, 0);
            assert_eq!(rc, TBON_ERR_TOO_LARGE);
        }
        let (a_name, mut buf) = ((ar, al), [0u8; 16]);
        let one_wildcard = recv(b, (ar, TBON_CLIENT_ANY), TAG, None, 60_000);
        assert_eq!(one_wildcard.0, TBON_ERR_BAD_PARAM);
        let asked = recv(b, ANY, TBON_TAG_ANY, None, 60_000);
        assert_eq!(asked, (TBON_ERR_TOO_LARGE, 10, ar, al, TAG));
        let short = recv(b, a_name, TAG, Some(&mut buf[..4]), 60_000);
        assert_eq!(short, (TBON_ERR_TOO_LARGE, 10, ar, al, TAG));
        let got = recv(b, a_name, TAG, Some(&mut buf), 60_000);
        assert_eq!((got.0, got.1, &buf[..10]), (TBON_OK, 10, &msg[..]));
        let none = recv(b, a_name, TAG, Some(&mut buf), 0);
        assert_eq!(none.0, TBON_ERR_TIMED_OUT);

        // A message set aside goes to the next posted receive, on this thread; a later one to
        // the persistent receive on the client's thread, where blocking calls are refused.
        let seen = Seen::default();
        *seen.client.lock().unwrap() = b;
        let user = std::ptr::from_ref(&seen).cast_mut().cast();
        let mut id = 0u64;
        // SAFETY: valid pointers; `seen` outlives the callbacks (b is closed below).
        unsafe {
            let rc = tbon_client_send_wait(a, br, bl, TAG, p, 10, 60_000);
            assert_eq!(rc, TBON_OK);
            let asked = recv(b, ANY, TBON_TAG_ANY, None, 60_000);
            assert_eq!(asked.0, TBON_ERR_TOO_LARGE);
            let rc = tbon_client_recv_cb(b, ANY.0, ANY.1, TAG, 1, None, user, &mut id);
            assert_eq!(rc, TBON_ERR_BAD_PARAM);
            let rc = tbon_client_recv_cb(b, ANY.0, ANY.1, TAG, 1, Some(on_msg), user, &mut id);
            assert_eq!(rc, TBON_OK);
            assert_eq!(seen.got.lock().unwrap().len(), 1, "the message set aside");
            let rc = tbon_client_send_wait(a, br, bl, TAG, b"x".as_ptr().cast(), 1, 60_000);
            assert_eq!(rc, TBON_OK);
        }
        wait_until("the second message", || seen.got.lock().unwrap().len() == 2);
        assert_eq!(
            *seen.got.lock().unwrap(),
            vec![(ar, al, TAG, msg.to_vec()), (ar, al, TAG, b"x".to_vec())]
        );
        wait_until("calls inside", || seen.inside.lock().unwrap().len() == 4);
        assert!(
            seen.inside
                .lock()
                .unwrap()
                .iter()
                .all(|&rc| rc == TBON_ERR_BUSY)
        );
        // Cancelled: the next message waits for a blocking receive.
        assert_eq!(tbon_client_cancel(b, id), TBON_OK);
        assert_eq!(tbon_client_cancel(b, id), TBON_OK);
        // SAFETY: valid pointers.
        unsafe {
            let rc = tbon_client_send_wait(a, br, bl, TAG + 1, b"y".as_ptr().cast(), 1, 60_000);
            assert_eq!(rc, TBON_OK);
        }
        let got = recv(b, a_name, TBON_TAG_ANY, Some(&mut buf), 60_000);
        assert_eq!(got, (TBON_OK, 1, ar, al, TAG + 1));
        assert_eq!(seen.got.lock().unwrap().len(), 2);

        // A close on another thread ends a receive waiting without a limit.
        let waiting = std::thread::spawn(move || {
            let mut buf = [0u8; 4];
            recv(b, ANY, TBON_TAG_ANY, Some(&mut buf), TBON_WAIT_FOREVER).0
        });
        wait_until("the receive waiting", || {
            registry().clients.get(&b).map(Arc::strong_count) == Some(2)
        });
        assert_eq!(tbon_client_close(b), TBON_OK);
        assert_eq!(waiting.join().unwrap(), TBON_ERR_DAEMON_LOST);
        assert_eq!(tbon_client_close(b), TBON_ERR_BAD_HANDLE);
        assert_eq!(tbon_client_close(0), TBON_OK);
        // SAFETY: valid pointers.
        unsafe {
            let rc = tbon_client_send_wait(a, br, bl, TAG, null(), 0, 60_000);
            assert_eq!(rc, TBON_ERR_CLIENT_GONE);
        }

        // The daemon's loss.
        let mut lost = 7;
        let mut why = [0 as c_char; 256];
        // SAFETY: valid pointers.
        unsafe {
            assert_eq!(
                tbon_client_daemon_lost(a, &mut lost, null_mut(), null_mut()),
                TBON_OK
            );
            assert_eq!(lost, 0);
            assert_eq!(tbon_abort(d[1]), TBON_OK);
            wait_until("the loss", || {
                tbon_client_daemon_lost(a, &mut lost, null_mut(), null_mut()) == TBON_OK
                    && lost == 1
            });
            let mut wlen = why.len();
            let rc = tbon_client_daemon_lost(a, &mut lost, why.as_mut_ptr(), &mut wlen);
            assert_eq!(rc, TBON_OK);
            assert!(wlen > 1);
            let rc = tbon_client_send(a, br, bl, TAG, null(), 0, None, null_mut());
            assert_eq!(rc, TBON_ERR_DAEMON_LOST);
        }
        let after = recv(a, ANY, TBON_TAG_ANY, None, 60_000);
        assert_eq!(after.0, TBON_ERR_DAEMON_LOST);
        assert_eq!(tbon_client_close(a), TBON_OK);
        assert_eq!(tbon_shutdown(d[0]), TBON_OK);
        for &x in &d {
            assert_eq!(tbon_free(x), TBON_OK);
        }
        assert_eq!(tbon_config_free(cfg), TBON_OK);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
