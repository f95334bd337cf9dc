//! The C API of streams (issue "Streams"): `tbon_serve` with a writer per stream
//! (`tbon_writer_*`), `tbon_fetch` with a stream read into the caller's buffer
//! (`tbon_stream_*`), and `tbon_fetch_cb` for a callback per chunk. Part of the FFI module:
//! the same rules (guard, registry ids, pointers read only during the call).

use super::{
    Fail, Res, UserPtr, fail, guard, handle, non_null, not_in_callback, put, registry, str_arg,
    tbon_daemon, tbon_rc,
};
use bytes::Bytes;
use std::ffi::{CString, c_char, c_int, c_void};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tbon::driver::{FetchOptions, Handle, Stream, StreamItem, StreamRequest, StreamWriter};
use tbon::limits;
use tbon::stream::StreamError;

/// The writer of one stream a service answers: an id valid from the service callback's
/// start until `tbon_writer_finish`/`tbon_writer_fail` or the callback's return; 0 is never
/// valid.
pub type tbon_writer = u64;

/// A stream this daemon fetches (`tbon_fetch`): an id valid until `tbon_stream_close`; 0 is
/// never valid. Close every stream, also after its daemon stopped or was freed: until then it
/// holds its memory. A stream whose daemon stopped still gives the bytes that had arrived (up
/// to a window), then `TBON_ERR_SHUT_DOWN`, also once the daemon is freed.
pub type tbon_stream = u64;

/// `timeout_ms` of `tbon_writer_write` and `tbon_stream_read`: wait without a limit (a
/// stream still never waits past its idle time, and a writer's consumer cancels or dies).
pub const TBON_WAIT_FOREVER: u32 = 0xFFFF_FFFF;

/// A service: called for every stream a consumer opens, on a thread of its own (it may block
/// as long as it needs: reading a file, waiting for credit). `service` and `request` are valid
/// during the call. Write the answer from byte `offset` on (0 for a new stream; a stream the
/// consumer resumed after its path broke asks again from the byte it stands at) with
/// `tbon_writer_write`, then end it with `tbon_writer_finish` or `tbon_writer_fail` before
/// returning: a stream not ended at the return fails with `TBON_STREAM_FAIL_ABANDONED`.
pub type tbon_serve_cb = Option<
    unsafe extern "C" fn(
        w: tbon_writer,
        consumer: u32,
        service: *const c_char,
        request: *const u8,
        len: usize,
        offset: u64,
        user: *mut c_void,
    ),
>;

/// How a stream ended, for `tbon_fetch_cb`: `rc` is `TBON_OK` when it finished (every byte
/// arrived and checked), otherwise why not (see `tbon_stream_read`). `fail_code` and
/// `reason` are the producer's when `rc` is `TBON_ERR_STREAM_FAILED`; `reason` is never NULL
/// ("" when there is none) and valid during the call.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tbon_stream_end {
    pub rc: tbon_rc,
    pub fail_code: u32,
    pub reason: *const c_char,
}

/// Stream callback (`tbon_fetch_cb`): called on the loop thread for each chunk in order
/// (`end` NULL, `data` valid during the call, `len` > 0), then once with `end` set (`data`
/// NULL, `len` 0). A chunk counts as consumed, and the producer gets credit, when the
/// callback returns. Keep it short; it must not block.
pub type tbon_stream_cb = Option<
    unsafe extern "C" fn(
        data: *const u8,
        len: usize,
        end: *const tbon_stream_end,
        user: *mut c_void,
    ),
>;

/// The producer's `fail` code when a stream fails because its service callback returned
/// without ending it.
pub const TBON_STREAM_FAIL_ABANDONED: u32 = 0xFFFF_FFFD;
/// The producer's `fail` code when it had no room for another stream (1,024 streams, or their
/// windows summed beyond 512 MiB): try again later.
pub const TBON_STREAM_FAIL_NO_ROOM: u32 = 0xFFFF_FFFE;
const _: () = assert!(TBON_STREAM_FAIL_NO_ROOM == tbon::node::FAIL_NO_ROOM);
/// Codes at or above this are the runtime's; `tbon_writer_fail` refuses them.
pub const TBON_STREAM_FAIL_RESERVED_MIN: u32 = 0xFFFF_FFF0;
const _: () = assert!(TBON_STREAM_FAIL_ABANDONED == tbon::driver::FAIL_ABANDONED);
const _: () = assert!(TBON_STREAM_FAIL_RESERVED_MIN == tbon::driver::FAIL_RESERVED_MIN);

/// A writer in the registry: `None` once ended.
pub(super) type WriterEntry = Arc<Mutex<Option<StreamWriter>>>;

/// A fetched stream in the registry.
pub(super) struct StreamEntry {
    handle: Handle,
    /// The stream's id at its daemon (for a cancel that must not wait for a reader).
    id: u64,
    stream: Mutex<Stream>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn stream_rc(e: &StreamError) -> tbon_rc {
    match e {
        StreamError::NoService(_) => tbon_rc::TBON_ERR_NO_SERVICE,
        StreamError::Producer { .. } => tbon_rc::TBON_ERR_STREAM_FAILED,
        StreamError::ProducerDied(_) | StreamError::ConsumerDied(_) => tbon_rc::TBON_ERR_PEER_DIED,
        StreamError::Cancelled => tbon_rc::TBON_ERR_CANCELLED,
        StreamError::Corrupt { .. } | StreamError::Protocol(_) => tbon_rc::TBON_ERR_CORRUPT,
        StreamError::TimedOut => tbon_rc::TBON_ERR_IDLE,
        StreamError::ShutDown => tbon_rc::TBON_ERR_SHUT_DOWN,
        StreamError::Refused(_) => tbon_rc::TBON_ERR_BUSY,
        _ => tbon_rc::TBON_ERR_INTERNAL,
    }
}

impl From<StreamError> for Fail {
    fn from(e: StreamError) -> Self {
        Fail(stream_rc(&e), e.to_string())
    }
}

fn deadline(timeout_ms: u32) -> Option<Instant> {
    (timeout_ms != TBON_WAIT_FOREVER)
        .then(|| Instant::now() + Duration::from_millis(timeout_ms.into()))
}

/// Copies a caller's bytes (`data` may be NULL only when `len` is 0), at most `max`.
unsafe fn bytes_arg(
    data: *const c_void,
    len: usize,
    max: usize,
    what: &str,
) -> Result<Bytes, Fail> {
    if len == 0 {
        return Ok(Bytes::new());
    }
    non_null(data, what)?;
    if len > max {
        return fail(
            tbon_rc::TBON_ERR_TOO_LARGE,
            format!("a {what} of {len} bytes exceeds the maximum of {max} bytes"),
        );
    }
    if len > isize::MAX as usize {
        return fail(
            tbon_rc::TBON_ERR_TOO_LARGE,
            format!("a {what} of {len} bytes is larger than any buffer"),
        );
    }
    // SAFETY: non-null, at most isize::MAX, and the caller promised `len` readable bytes.
    let s = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
    // A copy the allocator cannot give is an error, not an abort of the caller's process.
    let mut copy = Vec::new();
    if copy.try_reserve_exact(len).is_err() {
        return fail(
            tbon_rc::TBON_ERR_TOO_LARGE,
            format!("no memory for a copy of the {len} bytes of {what}"),
        );
    }
    copy.extend_from_slice(s);
    Ok(Bytes::from(copy))
}

/// A service name: NUL-terminated UTF-8 of at most `limits::STREAM_SERVICE_MAX` bytes.
///
/// # Safety
/// `service` is NULL or a NUL-terminated string valid for the call.
unsafe fn service_arg<'a>(service: *const c_char) -> Result<&'a str, Fail> {
    // SAFETY: as promised by the caller.
    let name = unsafe { str_arg(service, "service")? };
    if name.len() > limits::STREAM_SERVICE_MAX {
        return fail(
            tbon_rc::TBON_ERR_TOO_LARGE,
            format!(
                "a service name of {} bytes exceeds the maximum of {} bytes",
                name.len(),
                limits::STREAM_SERVICE_MAX
            ),
        );
    }
    Ok(name)
}

fn writer(w: tbon_writer) -> Result<WriterEntry, Fail> {
    match registry().writers.get(&w) {
        Some(e) => Ok(Arc::clone(e)),
        None => fail(
            tbon_rc::TBON_ERR_BAD_HANDLE,
            format!("no writer {w} (ended, or its service callback returned)"),
        ),
    }
}

fn stream_entry(s: tbon_stream) -> Result<Arc<StreamEntry>, Fail> {
    match registry().streams.get(&s) {
        Some(e) => Ok(Arc::clone(e)),
        None => fail(
            tbon_rc::TBON_ERR_BAD_HANDLE,
            format!("no stream {s} (never fetched, or closed)"),
        ),
    }
}

/// How a stream is fetched (`tbon_fetch`, `tbon_fetch_cb`; NULL there: every default).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tbon_fetch_opts {
    /// Bytes the producer may send ahead of what was read (the credit window; it bounds the
    /// stream's memory here and on every relay). 0: 4 MiB; at most 64 MiB (a larger window is
    /// cut to 64 MiB), at least 64 KiB (a smaller one, which crawls, is raised to 64 KiB).
    pub window: u32,
    /// How long the stream waits for data from the producer while it owes bytes, before it
    /// ends `TBON_ERR_IDLE` (a service must send its first bytes within it; a slower one is
    /// probed each quarter of it, not called again). 0: 60 s.
    pub idle_ms: u32,
    /// `TBON_FETCH_ROUTE_SETTING` (0: the daemons' `route` settings decide, as for a
    /// message), `TBON_FETCH_ROUTE_TREE` (ask for no direct link) or `TBON_FETCH_ROUTE_DIRECT`
    /// (ask the producer for one), for the stream's messages both ways.
    pub route: c_int,
}

/// `tbon_fetch_opts.route`: the daemons' `route` settings decide (0, so that a zeroed
/// `tbon_fetch_opts` means every default).
pub const TBON_FETCH_ROUTE_SETTING: c_int = 0;
/// `tbon_fetch_opts.route`: ask for no direct link because of this stream.
pub const TBON_FETCH_ROUTE_TREE: c_int = 1;
/// `tbon_fetch_opts.route`: ask the producer for a direct link (it must grant it).
pub const TBON_FETCH_ROUTE_DIRECT: c_int = 2;

fn fetch_options(opts: *const tbon_fetch_opts) -> Result<FetchOptions, Fail> {
    let d = FetchOptions::default();
    if opts.is_null() {
        return Ok(d);
    }
    // SAFETY: non-null; the caller promised a readable `tbon_fetch_opts` for the call.
    let o = unsafe { opts.read() };
    let route = match o.route {
        TBON_FETCH_ROUTE_SETTING => None,
        TBON_FETCH_ROUTE_TREE => Some(tbon::Route::Tree),
        TBON_FETCH_ROUTE_DIRECT => Some(tbon::Route::Direct),
        r => {
            return fail(
                tbon_rc::TBON_ERR_BAD_PARAM,
                format!("route {r} is not a route"),
            );
        }
    };
    Ok(FetchOptions {
        window: if o.window == 0 { d.window } else { o.window },
        idle: if o.idle_ms == 0 {
            d.idle
        } else {
            Duration::from_millis(o.idle_ms.into())
        },
        route,
    })
}

// ---------------------------------------------------------------------------------------------
// Producer.

/// Offers `service` (a NUL-terminated name of at most 255 bytes) to consumers: `cb` runs on a
/// thread of its own for every stream opened (see `tbon_serve_cb`), with `user`, which must
/// be usable from those threads and stay alive until the daemon's stop (`tbon_shutdown`,
/// `tbon_shutdown_dvm`, `tbon_abort`, `tbon_free`) has returned: a stop waits for every
/// service callback still running to return (their writers fail `TBON_ERR_SHUT_DOWN`, and a
/// callback must then return). Serving a name again
/// replaces its callback for new streams. Errors: `TBON_ERR_TOO_LARGE` (the name),
/// `TBON_ERR_BUSY` (256 services already), `TBON_ERR_SHUT_DOWN`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_serve(
    d: tbon_daemon,
    service: *const c_char,
    cb: tbon_serve_cb,
    user: *mut c_void,
) -> tbon_rc {
    guard(|| {
        let Some(cb) = cb else {
            return fail(tbon_rc::TBON_ERR_BAD_PARAM, "cb is NULL");
        };
        // SAFETY: the caller's string, valid for the call.
        let name = unsafe { service_arg(service)? };
        let h = handle(d)?;
        let user = UserPtr(user);
        h.serve(name, move |req: StreamRequest, w: StreamWriter| {
            run_service(cb, user, req, w);
        })?;
        Ok(())
    })
}

/// One stream of a C service, on its own thread: the writer is registered for the callback's
/// duration and failed `ABANDONED` (its drop) if the callback did not end it.
fn run_service(
    cb: unsafe extern "C" fn(tbon_writer, u32, *const c_char, *const u8, usize, u64, *mut c_void),
    user: UserPtr,
    req: StreamRequest,
    w: StreamWriter,
) {
    let entry: WriterEntry = Arc::new(Mutex::new(Some(w)));
    let id = {
        let mut reg = registry();
        let id = reg.new_id();
        reg.writers.insert(id, Arc::clone(&entry));
        id
    };
    let service = CString::new(req.service.replace('\0', " ")).unwrap_or_default();
    // A C callback must not unwind into Rust, and a Rust panic must not unwind into C: the
    // callback is the caller's code, called with the arguments its type promises.
    // SAFETY: the strings and bytes live until the call returns.
    unsafe {
        cb(
            id,
            req.consumer,
            service.as_ptr(),
            req.request.as_ptr(),
            req.request.len(),
            req.offset,
            user.get(),
        )
    };
    let mut reg = registry();
    reg.writers.remove(&id);
    reg.release_if_empty();
    drop(reg);
    // Not ended by the callback: the writer's drop fails the stream ABANDONED.
    drop(lock(&entry).take());
}

/// Writes `len` bytes of `data` (copied) on the stream, waiting for the consumer's credit as
/// needed, at most `timeout_ms` in all (`TBON_WAIT_FOREVER`: no limit). `*written` (if not
/// NULL) gets the bytes taken, also on an error. `TBON_ERR_TIMED_OUT`: the time ran out with
/// `*written` < `len`; write the rest later. The stream's end: `TBON_ERR_CANCELLED` (the
/// consumer gave it up, or moved it to a new stream: the service is called again for the
/// rest), `TBON_ERR_PEER_DIED`, `TBON_ERR_CORRUPT`, `TBON_ERR_SHUT_DOWN`: stop producing.
/// `TBON_ERR_TOO_LARGE`: no memory for the copy of `len` bytes (nothing taken; write less at a
/// time, or use `tbon_writer_write_nocopy`). One thread at a time per writer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_writer_write(
    w: tbon_writer,
    data: *const c_void,
    len: usize,
    timeout_ms: u32,
    written: *mut usize,
) -> tbon_rc {
    guard(|| {
        not_in_callback("tbon_writer_write")?;
        let entry = writer(w)?;
        // SAFETY: the caller's buffer, valid for this call.
        let bytes = unsafe { bytes_arg(data, len, usize::MAX, "data")? };
        write_all(&entry, bytes, timeout_ms, written)
    })
}

/// `tbon_writer_write` without the copy: tbon reads `len` bytes at `data` in place (its
/// chunks are sliced from them), and calls `free_cb(data, free_user)` exactly once when it no
/// longer needs them, WHATEVER this call returns (on an argument error, before it returns), on
/// any thread. Until then the buffer must stay valid and unmodified: that may be after this
/// call returns (the last chunks are still on their way). `free_cb` must not be NULL
/// (`TBON_ERR_BAD_PARAM`, and then it is not called). Otherwise as `tbon_writer_write`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_writer_write_nocopy(
    w: tbon_writer,
    data: *mut c_void,
    len: usize,
    free_cb: super::tbon_free_cb,
    free_user: *mut c_void,
    timeout_ms: u32,
    written: *mut usize,
) -> tbon_rc {
    guard(|| {
        let bytes = super::lend(data, len, free_cb, free_user)?;
        not_in_callback("tbon_writer_write_nocopy")?;
        let entry = writer(w)?;
        write_all(&entry, bytes, timeout_ms, written)
    })
}

/// Writes `bytes` on the writer, waiting for credit up to `timeout_ms` in all; `*written`
/// (if not NULL) gets what was taken.
fn write_all(entry: &WriterEntry, mut bytes: Bytes, timeout_ms: u32, written: *mut usize) -> Res {
    let len = bytes.len();
    let mut guard_w = lock(entry);
    let Some(wr) = guard_w.as_mut() else {
        return fail(tbon_rc::TBON_ERR_BAD_HANDLE, "the writer was ended");
    };
    let until = deadline(timeout_ms);
    let mut r: Res = Ok(());
    while !bytes.is_empty() {
        let left = until.map(|d| d.saturating_duration_since(Instant::now()));
        match wr.wait_room(left) {
            Ok(0) => {
                r = fail(
                    tbon_rc::TBON_ERR_TIMED_OUT,
                    "no credit from the consumer in time",
                );
                break;
            }
            Ok(_) => {}
            Err(e) => {
                r = Err(e.into());
                break;
            }
        }
        if let Err(e) = wr.try_write(&mut bytes) {
            r = Err(e.into());
            break;
        }
    }
    if !written.is_null() {
        // SAFETY: checked for null; the caller's out-pointer.
        unsafe { put(written, len - bytes.len()) };
    }
    r
}

/// Bytes the writer may write now without waiting (`*room`; 0: wait for credit), or the
/// stream's end as in `tbon_writer_write`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_writer_room(w: tbon_writer, room: *mut u64) -> tbon_rc {
    guard(|| {
        non_null(room, "room")?;
        let entry = writer(w)?;
        let n = match lock(&entry).as_ref() {
            Some(wr) => wr.room()?,
            None => return fail(tbon_rc::TBON_ERR_BAD_HANDLE, "the writer was ended"),
        };
        // SAFETY: checked for null.
        unsafe { put(room, n) };
        Ok(())
    })
}

/// Takes the writer out of the registry for its end (the handle is invalid afterwards).
fn take_writer(w: tbon_writer) -> Result<StreamWriter, Fail> {
    let entry = writer(w)?;
    registry().writers.remove(&w);
    let taken = lock(&entry).take();
    taken.ok_or_else(|| Fail(tbon_rc::TBON_ERR_BAD_HANDLE, "the writer was ended".into()))
}

/// Ends the stream: the consumer reads its end (`TBON_OK`, 0 bytes) once every byte written
/// has arrived and checked. The writer is invalid afterwards, also on an error (the stream's
/// end, as in `tbon_writer_write`).
#[unsafe(no_mangle)]
pub extern "C" fn tbon_writer_finish(w: tbon_writer) -> tbon_rc {
    guard(|| Ok(take_writer(w)?.finish()?))
}

/// Fails the stream with `code` (below `TBON_STREAM_FAIL_RESERVED_MIN`) and `reason` (may be
/// NULL; at most 1024 bytes are sent): the consumer reads `TBON_ERR_STREAM_FAILED` with both.
/// The writer is invalid afterwards, also on an error: a reserved `code` or a `reason` that is
/// not UTF-8 (`TBON_ERR_BAD_PARAM`) fails the stream as a dropped writer does
/// (`TBON_STREAM_FAIL_ABANDONED`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_writer_fail(
    w: tbon_writer,
    code: u32,
    reason: *const c_char,
) -> tbon_rc {
    guard(|| {
        // Taken first, so that the handle is invalid afterwards whatever else is wrong.
        let writer = take_writer(w)?;
        let reason = if reason.is_null() {
            ""
        } else {
            // SAFETY: the caller's string, valid for the call.
            unsafe { str_arg(reason, "reason")? }
        };
        if code >= TBON_STREAM_FAIL_RESERVED_MIN {
            return fail(
                tbon_rc::TBON_ERR_BAD_PARAM,
                format!("fail code {code} is reserved for the runtime"),
            );
        }
        Ok(writer.fail(code, reason)?)
    })
}

// ---------------------------------------------------------------------------------------------
// Consumer.

/// Checks and copies a fetch's arguments.
unsafe fn fetch_args<'a>(
    service: *const c_char,
    request: *const c_void,
    len: usize,
) -> Result<(&'a str, Bytes), Fail> {
    // SAFETY: the caller's string and buffer, valid for the call.
    let name = unsafe { service_arg(service)? };
    let req = unsafe { bytes_arg(request, len, limits::STREAM_REQUEST_MAX, "request")? };
    Ok((name, req))
}

/// Fetches `request` (`len` bytes, copied; at most 64 KiB) from `service` at `producer` and
/// stores the stream in `*out`; read it with `tbon_stream_read`, then `tbon_stream_close` it.
/// `opts` may be NULL (every default; see `tbon_fetch_opts`). Errors: `TBON_ERR_BAD_PARAM` (a
/// bad route), `TBON_ERR_RANK_OUT_OF_RANGE`, `TBON_ERR_TOO_LARGE`,
/// `TBON_ERR_NODE_DOWN` (the producer is known dead), `TBON_ERR_BUSY` (1024 streams already),
/// `TBON_ERR_SHUT_DOWN`. What happens at the producer is read as the stream's end.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_fetch(
    d: tbon_daemon,
    producer: u32,
    service: *const c_char,
    request: *const c_void,
    len: usize,
    opts: *const tbon_fetch_opts,
    out: *mut tbon_stream,
) -> tbon_rc {
    guard(|| {
        non_null(out, "out")?;
        // SAFETY: the caller's arguments, valid for the call.
        let (name, req) = unsafe { fetch_args(service, request, len)? };
        let h = handle(d)?;
        let stream = h.fetch_with(producer, name, req, fetch_options(opts)?)?;
        let entry = Arc::new(StreamEntry {
            handle: h,
            id: stream.id(),
            stream: Mutex::new(stream),
        });
        let id = {
            let mut reg = registry();
            let id = reg.new_id();
            reg.streams.insert(id, entry);
            id
        };
        // SAFETY: checked for null.
        unsafe { put(out, id) };
        Ok(())
    })
}

/// Reads the stream's next bytes into `buf` (`cap` bytes), waiting at most `timeout_ms`
/// (`TBON_WAIT_FOREVER`: until bytes or the end come, never longer than the stream's idle
/// time). `TBON_OK` with `*got` > 0: bytes, in order. `TBON_OK` with `*got` == 0: the stream
/// FINISHED, every byte arrived and checked. `cap` 0 is `TBON_ERR_BAD_PARAM` (it could not
/// be told from the end). `TBON_ERR_TIMED_OUT`: nothing
/// yet, read again. Otherwise the stream ended with an error (every later read returns it
/// again): `TBON_ERR_NO_SERVICE`, `TBON_ERR_STREAM_FAILED` (the producer's code:
/// `tbon_stream_fail_code`; `tbon_last_error` has a message with the code and the producer's
/// reason), `TBON_ERR_PEER_DIED`,
/// `TBON_ERR_CANCELLED`, `TBON_ERR_CORRUPT`, `TBON_ERR_IDLE` (no news for the idle time),
/// `TBON_ERR_SHUT_DOWN`. Not from a callback (`TBON_ERR_BUSY`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_stream_read(
    s: tbon_stream,
    buf: *mut c_void,
    cap: usize,
    got: *mut usize,
    timeout_ms: u32,
) -> tbon_rc {
    guard(|| {
        not_in_callback("tbon_stream_read")?;
        non_null(got, "got")?;
        // SAFETY: checked for null.
        unsafe { put(got, 0) };
        if cap == 0 {
            // Reading nothing would look like the end (`TBON_OK`, 0 bytes).
            return fail(
                tbon_rc::TBON_ERR_BAD_PARAM,
                "cap is 0: a read needs room for at least one byte (0 bytes read means finished)",
            );
        }
        non_null(buf, "buf")?;
        let entry = stream_entry(s)?;
        let mut st = lock(&entry.stream);
        if let Some(Err(e)) = st.outcome() {
            return Err(e.clone().into());
        }
        // SAFETY: non-null (checked above) with `cap` > 0 writable bytes for the call.
        let out: &mut [u8] = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), cap) };
        let n = match timeout_ms {
            TBON_WAIT_FOREVER => st.read(out)?,
            t => match st.read_timeout(out, Duration::from_millis(t.into()))? {
                Some(n) => n,
                None => return fail(tbon_rc::TBON_ERR_TIMED_OUT, "no bytes yet"),
            },
        };
        // SAFETY: checked for null.
        unsafe { put(got, n) };
        Ok(())
    })
}

/// The producer's code of a stream that ended `TBON_ERR_STREAM_FAILED`, in `*code`;
/// `TBON_ERR_BAD_PARAM` when the stream did not end that way (yet).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_stream_fail_code(s: tbon_stream, code: *mut u32) -> tbon_rc {
    guard(|| {
        non_null(code, "code")?;
        let entry = stream_entry(s)?;
        let st = lock(&entry.stream);
        match st.outcome() {
            Some(Err(StreamError::Producer { code: c, .. })) => {
                // SAFETY: checked for null.
                unsafe { put(code, *c) };
                Ok(())
            }
            _ => fail(
                tbon_rc::TBON_ERR_BAD_PARAM,
                "the stream did not end with a failure of its producer",
            ),
        }
    })
}

/// Closes the stream: cancels it if it has not ended (the producer's writer fails
/// `TBON_ERR_CANCELLED`; a read blocked on another thread returns `TBON_ERR_CANCELLED`) and
/// frees it. The handle is invalid afterwards.
#[unsafe(no_mangle)]
pub extern "C" fn tbon_stream_close(s: tbon_stream) -> tbon_rc {
    guard(|| {
        let entry = {
            let mut reg = registry();
            let e = reg.streams.remove(&s);
            reg.release_if_empty();
            e
        };
        let Some(entry) = entry else {
            return fail(tbon_rc::TBON_ERR_BAD_HANDLE, format!("no stream {s}"));
        };
        // Without the stream's lock: a reader blocked in it wakes up with the cancel, and
        // the stream is dropped with the last reference.
        entry.handle.cancel_stream(entry.id);
        Ok(())
    })
}

/// Fetches like `tbon_fetch`, delivering the stream to `cb` on the loop thread instead (see
/// `tbon_stream_cb`); `*id` (if not NULL) gets the stream's id for `tbon_fetch_cancel`. `cb`
/// runs if and only if this returns `TBON_OK`, and its last call has `end` set.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn tbon_fetch_cb(
    d: tbon_daemon,
    producer: u32,
    service: *const c_char,
    request: *const c_void,
    len: usize,
    opts: *const tbon_fetch_opts,
    cb: tbon_stream_cb,
    user: *mut c_void,
    id: *mut u64,
) -> tbon_rc {
    guard(|| {
        let Some(cb) = cb else {
            return fail(tbon_rc::TBON_ERR_BAD_PARAM, "cb is NULL");
        };
        // SAFETY: the caller's arguments, valid for the call.
        let (name, req) = unsafe { fetch_args(service, request, len)? };
        let h = handle(d)?;
        let user = UserPtr(user);
        let deliver = move |item: StreamItem| {
            let _scope = super::CallbackScope::enter();
            match item {
                // SAFETY: the caller's function; the bytes live for the call.
                StreamItem::Data(b) => unsafe {
                    cb(b.as_ptr(), b.len(), std::ptr::null(), user.get())
                },
                StreamItem::End(r) => {
                    let (rc, code, reason) = match &r {
                        Ok(()) => (tbon_rc::TBON_OK, 0, String::new()),
                        Err(StreamError::Producer { code, reason }) => {
                            (tbon_rc::TBON_ERR_STREAM_FAILED, *code, reason.clone())
                        }
                        Err(e) => (stream_rc(e), 0, e.to_string()),
                    };
                    let reason = CString::new(reason.replace('\0', " ")).unwrap_or_default();
                    let end = tbon_stream_end {
                        rc,
                        fail_code: code,
                        reason: reason.as_ptr(),
                    };
                    // SAFETY: the caller's function; `end` and its string live for the call.
                    unsafe { cb(std::ptr::null(), 0, &end, user.get()) }
                }
            }
        };
        let sid = h.fetch_callback(producer, name, req, fetch_options(opts)?, deliver)?;
        if !id.is_null() {
            // SAFETY: checked for null.
            unsafe { put(id, sid) };
        }
        Ok(())
    })
}

/// Cancels stream `id` of `tbon_fetch_cb`: its callback ends with `TBON_ERR_CANCELLED`
/// (unless it ended first). Nothing happens for an id that ended.
#[unsafe(no_mangle)]
pub extern "C" fn tbon_fetch_cancel(d: tbon_daemon, id: u64) -> tbon_rc {
    guard(|| {
        handle(d)?.cancel_stream(id);
        Ok(())
    })
}
