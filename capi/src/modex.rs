//! The C API of the data exchange (issue "Jobs"; the PMI modex): `tbon_put` stages a job's
//! keys and values on this daemon, `tbon_commit` publishes them, `tbon_fence` (blocking) or
//! `tbon_fence_cb` synchronises the job's daemons (and in full mode brings every member's data
//! to every member), `tbon_get` (blocking, into the caller's buffer) or `tbon_get_cb` reads a
//! member's value, `tbon_forget_group` drops the job's data. Part of the FFI module: the same
//! rules (guard, registry ids, pointers read only during the call). A job is a `tbon_group`
//! (groups.rs), bound like there to the first daemon whose call it accepted.

use super::groups::{group_entry, submit, with_group};
use super::{
    Fail, UserPtr, fail, guard, handle, non_null, not_in_callback, put, send_rc, str_arg,
    tbon_daemon, tbon_group, tbon_rc,
};
use bytes::Bytes;
use std::ffi::{CString, c_char, c_int, c_void};
use std::sync::mpsc::{RecvTimeoutError, sync_channel};
use std::time::Duration;
use tbon::error::SendError;
use tbon::{FenceMode, GetError, Rank};

/// The longest key of the data exchange, in bytes (without the NUL): longer is
/// `TBON_ERR_BAD_PARAM`.
pub const TBON_MODEX_KEY_MAX: usize = 255;
const _: () = assert!(TBON_MODEX_KEY_MAX == tbon::limits::MODEX_KEY_MAX);

/// Groups a daemon keeps data of the exchange for (puts or commits), until
/// `tbon_forget_group`: a put or commit for one more is refused `TBON_ERR_BUSY`.
pub const TBON_MODEX_GROUPS_MAX: usize = 256;
const _: () = assert!(TBON_MODEX_GROUPS_MAX == tbon::limits::MODEX_GROUPS_MAX);

/// Fetches of an owner's data (one per owner and group, shared by the gets waiting for it) a
/// daemon has in flight: a get that needs one more ends `TBON_ERR_BUSY` (ask again later).
pub const TBON_MODEX_FETCHES_MAX: usize = 256;
const _: () = assert!(TBON_MODEX_FETCHES_MAX == tbon::limits::MODEX_FETCHES_MAX);

/// How a fence exchanges the data (`tbon_fence`, `tbon_fence_cb`, which take it as an `int`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum tbon_fence_mode {
    /// Every member's committed data comes to every member during the fence: the gets after
    /// it are answered on this daemon, without a message. For small data and gets of most
    /// members' values (PMI's "collect data").
    TBON_FENCE_FULL = 0,
    /// The fence only synchronises: a get fetches the owner's data (all of its keys at once,
    /// then cached here) on first use. For large data or gets of a few members.
    TBON_FENCE_DIRECT = 1,
}

/// Fence callback (`tbon_fence_cb`): called once, on the loop thread. With `TBON_OK`, every
/// living member entered the fence, and `excluded` lists the `nexcluded` members that died
/// before they entered it, ascending (NULL when there are none; valid during the call only).
/// Otherwise `excluded` is NULL and `nexcluded` 0, and `rc` is as `tbon_group_allgather`'s
/// callback (`TBON_ERR_DUPLICATE`, `TBON_ERR_MISMATCH`: another member entered this number in
/// the other mode or called another collective, `TBON_ERR_RESULT_LOST`, `TBON_ERR_SHUT_DOWN`).
/// `seq` is the fence's number in the group.
pub type tbon_fence_done_cb = Option<
    unsafe extern "C" fn(
        rc: tbon_rc,
        seq: u64,
        excluded: *const u32,
        nexcluded: usize,
        user: *mut c_void,
    ),
>;

/// Get callback (`tbon_get_cb`): called once, on the loop thread, with the `rank` and `key`
/// asked for (`key` NUL-terminated). With `TBON_OK`, `data` holds the value's `len` bytes (NULL
/// when `len` is 0). Otherwise `data` is NULL and `len` 0: `TBON_ERR_NOT_FOUND` (`rank` had
/// committed no such key for the group when its data was taken; see `tbon_get`),
/// `TBON_ERR_NODE_DOWN` (`rank` is dead, or died before its data came), `TBON_ERR_BUSY`
/// (`TBON_MODEX_FETCHES_MAX` fetches in flight here), `TBON_ERR_CORRUPT` (its data came back
/// malformed), `TBON_ERR_SHUT_DOWN`. `key` and `data` are valid during the call only: copy
/// what you keep.
pub type tbon_get_done_cb = Option<
    unsafe extern "C" fn(
        rc: tbon_rc,
        rank: u32,
        key: *const c_char,
        data: *const u8,
        len: usize,
        user: *mut c_void,
    ),
>;

fn get_rc(e: &GetError) -> tbon_rc {
    match e {
        GetError::NotFound => tbon_rc::TBON_ERR_NOT_FOUND,
        GetError::NodeDown(_) => tbon_rc::TBON_ERR_NODE_DOWN,
        GetError::NotMember(_) => tbon_rc::TBON_ERR_NOT_MEMBER,
        GetError::RankOutOfRange { .. } => tbon_rc::TBON_ERR_RANK_OUT_OF_RANGE,
        // Checked here before the call (`key_arg`); an argument error, like a non-UTF-8 key,
        // so that TBON_ERR_TOO_LARGE from tbon_get always means the caller's buffer.
        GetError::KeyTooLong(_) => tbon_rc::TBON_ERR_BAD_PARAM,
        GetError::Busy => tbon_rc::TBON_ERR_BUSY,
        GetError::Corrupt(_) => tbon_rc::TBON_ERR_CORRUPT,
        GetError::ShutDown => tbon_rc::TBON_ERR_SHUT_DOWN,
        GetError::TimedOut => tbon_rc::TBON_ERR_TIMED_OUT,
        // A cause added to the library after this table: a bug here, not the caller's.
        _ => tbon_rc::TBON_ERR_INTERNAL,
    }
}

impl From<GetError> for Fail {
    fn from(e: GetError) -> Self {
        Fail(get_rc(&e), e.to_string())
    }
}

/// Borrows a key for the call: NUL-terminated UTF-8 of at most `TBON_MODEX_KEY_MAX` bytes.
unsafe fn key_arg<'a>(key: *const c_char) -> Result<&'a str, Fail> {
    // SAFETY: the caller's string, valid for the call.
    let key = unsafe { str_arg(key, "key")? };
    if key.len() > TBON_MODEX_KEY_MAX {
        return fail(
            tbon_rc::TBON_ERR_BAD_PARAM,
            format!(
                "a key of {} bytes is above TBON_MODEX_KEY_MAX ({TBON_MODEX_KEY_MAX})",
                key.len()
            ),
        );
    }
    Ok(key)
}

/// Copies a value (`value` may be NULL only when `len` is 0); one larger than a group's data
/// may be is refused before anything is copied (`Handle::put` checks the exact bound).
unsafe fn value_arg(value: *const c_void, len: usize) -> Result<Bytes, Fail> {
    if len == 0 {
        return Ok(Bytes::new());
    }
    non_null(value, "value")?;
    let max = tbon::limits::ALLGATHER_MAX_BYTES - 8;
    if len > max {
        return Err(SendError::TooLarge { len, max }.into());
    }
    // SAFETY: non-null, and the caller promised `len` readable bytes for the call.
    let s = unsafe { std::slice::from_raw_parts(value.cast::<u8>(), len) };
    Ok(Bytes::copy_from_slice(s))
}

/// Only members read a job's data: the daemon's core would answer `NotMember` too, but a C
/// caller gets it at once, as from the other calls on the group.
fn member(h: &tbon::Handle, group: &tbon::Group) -> Result<(), Fail> {
    if group.contains(h.rank()) {
        return Ok(());
    }
    Err(GetError::NotMember(h.rank()).into())
}

fn mode_arg(mode: c_int) -> Result<FenceMode, Fail> {
    if mode == tbon_fence_mode::TBON_FENCE_FULL as c_int {
        Ok(FenceMode::Full)
    } else if mode == tbon_fence_mode::TBON_FENCE_DIRECT as c_int {
        Ok(FenceMode::Direct)
    } else {
        fail(
            tbon_rc::TBON_ERR_BAD_PARAM,
            format!("mode {mode} is not a tbon_fence_mode"),
        )
    }
}

/// Stages `len` bytes at `value` (copied; NULL when `len` is 0) under `key` for group `g` on
/// daemon `d`: this daemon's data for the job (a later put of the same key replaces the
/// value). Nothing leaves the daemon, and no other member can read it, until `tbon_commit`.
///
/// What the caller must do: `d` is a member of `g`; `key` is NUL-terminated UTF-8 of at most
/// `TBON_MODEX_KEY_MAX` bytes. Errors, and then nothing is staged: `TBON_ERR_NOT_MEMBER`,
/// `TBON_ERR_RANK_OUT_OF_RANGE` (a member of `g` is not a rank of the DVM),
/// `TBON_ERR_BAD_PARAM` (`key` NULL, not UTF-8 or too long; `value` NULL with `len` > 0; a
/// group bound to another daemon), `TBON_ERR_TOO_LARGE` (the group's data on this daemon, its
/// keys and values with 6 bytes more per value, would exceed what a full fence can gather of
/// one member: just under 16 MiB),
/// `TBON_ERR_BUSY` (data for `TBON_MODEX_GROUPS_MAX` groups here: `tbon_forget_group` one),
/// `TBON_ERR_SHUT_DOWN`, `TBON_ERR_BAD_HANDLE`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_put(
    d: tbon_daemon,
    g: tbon_group,
    key: *const c_char,
    value: *const c_void,
    len: usize,
) -> tbon_rc {
    guard(|| {
        let h = handle(d)?;
        let entry = group_entry(g)?;
        // SAFETY: the caller's string and buffer, valid for this call.
        let (key, value) = unsafe { (key_arg(key)?, value_arg(value, len)?) };
        // `Handle::put` tells misuse first, then the stop, as the other calls do.
        with_group(d, g, &entry, |group| Ok(h.put(group, key, value)?))
    })
}

/// Commits everything put for group `g` on daemon `d` so far, replacing what it committed
/// before: other members can now get it (a get after a direct fence fetches what is committed
/// when its request arrives), and a full fence gathers it. Commit before entering the fence
/// that the others' gets follow; a member with nothing put commits an empty set (its keys are
/// then `TBON_ERR_NOT_FOUND`). A daemon that already holds this daemon's data for the group (a
/// full fence's, or a fetch's) answers from it until the next fence of the group, which
/// starts a new round: commit again, then fence, and the others see the new data. Errors:
/// `TBON_ERR_NOT_MEMBER`, `TBON_ERR_RANK_OUT_OF_RANGE` (a member of `g` is not a rank of the
/// DVM), `TBON_ERR_BUSY` (`TBON_MODEX_GROUPS_MAX` groups with data here; from
/// a callback also when the command queue is full), `TBON_ERR_SHUT_DOWN`,
/// `TBON_ERR_BAD_HANDLE`, `TBON_ERR_BAD_PARAM` (a group bound to another daemon).
#[unsafe(no_mangle)]
pub extern "C" fn tbon_commit(d: tbon_daemon, g: tbon_group) -> tbon_rc {
    guard(|| {
        let h = handle(d)?;
        let entry = group_entry(g)?;
        with_group(d, g, &entry, |group| Ok(h.commit(group)?))
    })
}

/// The job of group `g` is over on daemon `d`: what it put and committed for the group and what
/// it cached of the other members' data are dropped (gets for the group then find nothing
/// here; other members' fetches from it end `TBON_ERR_NOT_FOUND`). It frees a place of
/// `TBON_MODEX_GROUPS_MAX`. The group handle stays valid (`tbon_group_free` frees it). Cleanup:
/// `TBON_OK` also when `d` is not a member, and once the daemon stopped (nothing is left).
/// Errors: `TBON_ERR_BUSY` from a callback when the command queue is full (call it again);
/// `TBON_ERR_BAD_HANDLE`, `TBON_ERR_BAD_PARAM` (a group bound to another daemon).
#[unsafe(no_mangle)]
pub extern "C" fn tbon_forget_group(d: tbon_daemon, g: tbon_group) -> tbon_rc {
    guard(|| {
        let h = handle(d)?;
        let entry = group_entry(g)?;
        with_group(d, g, &entry, |group| match h.forget_group(group) {
            Err(SendError::ShutDown) => Ok(()),
            r => Ok(r?),
        })
    })
}

/// Enters group `g`'s next collective, a fence of the data exchange in `mode` (a
/// `tbon_fence_mode` value), and waits until every living member has entered it (members that
/// died are not waited for), or `timeout_ms` passed (`TBON_ERR_TIMED_OUT`: this daemon stays
/// entered, the fence goes on and keeps its number). With `TBON_FENCE_FULL` every member's
/// committed data is here once this returns `TBON_OK`, replacing what this daemon held of the
/// group (unless all of it, 13 bytes per member included, exceeded 16 MiB: then the fence
/// carries none, and gets fetch it as after a direct fence); with `TBON_FENCE_DIRECT` what
/// this daemon held of the group is dropped, and gets fetch it again. Every fence thus starts
/// a new round: a get after it sees what the owner had committed when it entered it.
///
/// What the caller must do: commit first (`tbon_commit`); every member fences with the same
/// mode, in the same order as the group's other collectives (a fence takes the group's next
/// number, like `tbon_group_barrier`; members that differ all end it `TBON_ERR_MISMATCH`); no
/// member commits again until every member has read what it needs of this round (another
/// fence tells). Which members were excluded: `tbon_fence_cb`. Errors as `tbon_group_barrier`,
/// and `TBON_ERR_BAD_PARAM` for another `mode`; not from a callback (`TBON_ERR_BUSY`).
#[unsafe(no_mangle)]
pub extern "C" fn tbon_fence(
    d: tbon_daemon,
    g: tbon_group,
    mode: c_int,
    timeout_ms: u32,
) -> tbon_rc {
    guard(|| {
        not_in_callback("tbon_fence")?;
        let mode = mode_arg(mode)?;
        let h = handle(d)?;
        let entry = group_entry(g)?;
        let (tx, rx) = sync_channel::<Result<Vec<Rank>, SendError>>(1);
        submit(d, g, &entry, |group, _| {
            h.fence(group, mode, move |r| {
                let _ = tx.send(r);
            })
        })?;
        match rx.recv_timeout(Duration::from_millis(timeout_ms.into())) {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.into()),
            Err(RecvTimeoutError::Timeout) => Err(SendError::TimedOut.into()),
            Err(RecvTimeoutError::Disconnected) => Err(SendError::ShutDown.into()),
        }
    })
}

/// `tbon_fence` without waiting: `cb` (not NULL) gets the outcome (see `tbon_fence_done_cb`),
/// exactly once if and only if this returns `TBON_OK`. Returned at once, and then the call
/// takes no number: the errors `tbon_group_allgather` returns at once, and
/// `TBON_ERR_BAD_PARAM` for a NULL `cb` or another `mode`. May be called from a callback.
#[unsafe(no_mangle)]
pub extern "C" fn tbon_fence_cb(
    d: tbon_daemon,
    g: tbon_group,
    mode: c_int,
    cb: tbon_fence_done_cb,
    user: *mut c_void,
) -> tbon_rc {
    guard(|| {
        let Some(cb) = cb else {
            return fail(tbon_rc::TBON_ERR_BAD_PARAM, "cb is NULL");
        };
        let mode = mode_arg(mode)?;
        let h = handle(d)?;
        let entry = group_entry(g)?;
        let user = UserPtr(user);
        submit(d, g, &entry, |group, seq| {
            h.fence(group, mode, move |r| fenced(cb, seq, r, user))
        })
    })
}

/// Hands a fence's outcome to the caller's callback (on the loop thread).
fn fenced(
    cb: unsafe extern "C" fn(tbon_rc, u64, *const u32, usize, *mut c_void),
    seq: u64,
    r: Result<Vec<Rank>, SendError>,
    user: UserPtr,
) {
    let _scope = super::CallbackScope::enter();
    match r {
        Ok(excluded) => {
            let p = if excluded.is_empty() {
                std::ptr::null()
            } else {
                excluded.as_ptr()
            };
            // SAFETY: the caller's function; the array lives for the call.
            unsafe { cb(tbon_rc::TBON_OK, seq, p, excluded.len(), user.get()) }
        }
        // SAFETY: the caller's function, with no array.
        Err(e) => unsafe { cb(send_rc(&e), seq, std::ptr::null(), 0, user.get()) },
    }
}

/// Reads the value member `rank` committed under `key` for group `g`, waiting up to
/// `timeout_ms`, and copies it into `buf` (`cap` bytes): from this daemon's cache (a full
/// fence's, or an earlier fetch's), from its own committed data, or fetched from `rank` (all of
/// its data for the group at once, then cached until the group's next fence; least recently
/// used out first). Call it after the fence that followed the owner's commit. Values are
/// bytes, not strings: no NUL is added.
///
/// `*len` (`len` not NULL) gets the value's length with `TBON_OK` and with
/// `TBON_ERR_TOO_LARGE`; it is left alone otherwise. A value longer than `cap` is
/// `TBON_ERR_TOO_LARGE` with nothing copied, as `tbon_contact_uri` answers: `buf` NULL with
/// `cap` 0 asks the length, then a second call with a buffer that large reads the value (from
/// the cache when the first one fetched it). `buf` may be NULL only when `cap` is 0.
///
/// Errors: `TBON_ERR_NOT_FOUND` (`rank` never put `key` for the group, or had not committed
/// it when its data was taken: at a full fence, or when the fetch's request reached it after
/// a direct one), `TBON_ERR_NODE_DOWN` (`rank` is dead, or died before its data came; never a
/// hang), `TBON_ERR_NOT_MEMBER` (this daemon is not a member of the group: only members read a
/// job's data; or `rank` is not), `TBON_ERR_RANK_OUT_OF_RANGE` (`rank`, or a member of the
/// group, is not a rank of the DVM), `TBON_ERR_BAD_PARAM` (`key`
/// NULL, not UTF-8 or longer than `TBON_MODEX_KEY_MAX`; `len` NULL; `buf` NULL with `cap` > 0;
/// a group bound to another daemon), `TBON_ERR_TIMED_OUT` (the fetch goes on and fills the
/// cache), `TBON_ERR_BUSY` (`TBON_MODEX_FETCHES_MAX` fetches in flight here; or from a
/// callback: this call blocks, use `tbon_get_cb`), `TBON_ERR_CORRUPT` (`rank`'s data came back
/// malformed; logged), `TBON_ERR_SHUT_DOWN`, `TBON_ERR_BAD_HANDLE`.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn tbon_get(
    d: tbon_daemon,
    g: tbon_group,
    rank: u32,
    key: *const c_char,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
    timeout_ms: u32,
) -> tbon_rc {
    guard(|| {
        not_in_callback("tbon_get")?;
        non_null(len, "len")?;
        if cap > 0 {
            non_null(buf, "buf")?;
        }
        let h = handle(d)?;
        let entry = group_entry(g)?;
        // SAFETY: the caller's string, valid for this call.
        let key = unsafe { key_arg(key)? };
        let (tx, rx) = sync_channel::<Result<Bytes, GetError>>(1);
        with_group(d, g, &entry, |group| {
            member(&h, group)?;
            Ok(h.get(group, rank, key, move |r| {
                let _ = tx.send(r);
            })?)
        })?;
        let value = match rx.recv_timeout(Duration::from_millis(timeout_ms.into())) {
            Ok(r) => r?,
            Err(RecvTimeoutError::Timeout) => return Err(GetError::TimedOut.into()),
            Err(RecvTimeoutError::Disconnected) => return Err(GetError::ShutDown.into()),
        };
        let n = value.len();
        // SAFETY: checked for null above.
        unsafe { put(len, n) };
        if n > cap {
            return fail(
                tbon_rc::TBON_ERR_TOO_LARGE,
                format!(
                    "the value of {key:?} at rank {rank} has {n} bytes, the buffer {cap}; *len \
                     is its length"
                ),
            );
        }
        if n > 0 {
            // SAFETY: `buf` is non-null with `cap >= n` writable bytes (the caller's promise).
            unsafe { std::ptr::copy_nonoverlapping(value.as_ptr(), buf.cast::<u8>(), n) };
        }
        Ok(())
    })
}

/// `tbon_get` without waiting: `cb` (not NULL) gets the value or why not (see
/// `tbon_get_done_cb`), exactly once if and only if this returns `TBON_OK`, on the loop thread
/// (possibly before this returns). Returned at once:
/// `TBON_ERR_NOT_MEMBER` (as `tbon_get`), `TBON_ERR_BAD_PARAM` (as `tbon_get`, or a NULL `cb`),
/// `TBON_ERR_BUSY` (from a callback: the command queue is full), `TBON_ERR_SHUT_DOWN`,
/// `TBON_ERR_BAD_HANDLE`. May be called from a callback, also for the same group.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_get_cb(
    d: tbon_daemon,
    g: tbon_group,
    rank: u32,
    key: *const c_char,
    cb: tbon_get_done_cb,
    user: *mut c_void,
) -> tbon_rc {
    guard(|| {
        let Some(cb) = cb else {
            return fail(tbon_rc::TBON_ERR_BAD_PARAM, "cb is NULL");
        };
        let h = handle(d)?;
        let entry = group_entry(g)?;
        // SAFETY: the caller's string, valid for this call.
        let key = unsafe { key_arg(key)? };
        // A C string has no interior NUL.
        let ckey = CString::new(key).unwrap_or_default();
        let user = UserPtr(user);
        with_group(d, g, &entry, |group| {
            member(&h, group)?;
            Ok(h.get(group, rank, key, move |r| got(cb, rank, &ckey, r, user))?)
        })
    })
}

/// Hands a get's answer to the caller's callback (on the loop thread).
fn got(
    cb: unsafe extern "C" fn(tbon_rc, u32, *const c_char, *const u8, usize, *mut c_void),
    rank: u32,
    key: &CString,
    r: Result<Bytes, GetError>,
    user: UserPtr,
) {
    let _scope = super::CallbackScope::enter();
    let (rc, value) = match r {
        Ok(v) => (tbon_rc::TBON_OK, v),
        Err(e) => (get_rc(&e), Bytes::new()),
    };
    let data = if value.is_empty() {
        std::ptr::null()
    } else {
        value.as_ptr()
    };
    // SAFETY: the caller's function; the key and the bytes live for the call.
    unsafe { cb(rc, rank, key.as_ptr(), data, value.len(), user.get()) }
}

#[cfg(test)]
mod tests {
    //! What the C layer adds to `Handle::put`/`commit`/`fence`/`get`: the group bound to one
    //! daemon, the blocking calls refused in a callback while the callback forms work there,
    //! the fence's excluded members, the size query, a dead owner's code. (The example
    //! `examples/c/modex.c` runs the rest as a C user.)
    use crate::*;
    use std::ffi::CString;
    use std::ptr::{null, null_mut};
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    fn wait_for<T>(slot: &Mutex<Option<T>>) -> T {
        let start = Instant::now();
        loop {
            if let Some(got) = slot.lock().unwrap().take() {
                return got;
            }
            assert!(start.elapsed() < Duration::from_secs(60), "no callback");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// A fence's outcome: (code, number, excluded).
    type Fenced = (tbon_rc, u64, Vec<u32>);
    /// A get's answer: (code, rank, key, value).
    type Answer = (tbon_rc, u32, String, Vec<u8>);

    /// Rank 1's and rank 2's fences, by rank.
    static FENCED: [Mutex<Option<Fenced>>; 3] =
        [Mutex::new(None), Mutex::new(None), Mutex::new(None)];

    unsafe extern "C" fn on_fenced(
        rc: tbon_rc,
        seq: u64,
        excluded: *const u32,
        n: usize,
        user: *mut c_void,
    ) {
        let list = if n == 0 {
            Vec::new()
        } else {
            // SAFETY: `n` ranks valid during the call.
            unsafe { std::slice::from_raw_parts(excluded, n) }.to_vec()
        };
        *FENCED[user as usize].lock().unwrap() = Some((rc, seq, list));
    }

    /// What the get callback saw and did: its answer, then (first call only) what a blocking
    /// `tbon_get`, a blocking `tbon_fence` and a chained `tbon_get_cb` answered in it.
    struct Probe {
        d: tbon_daemon,
        g: tbon_group,
        answers: Mutex<Vec<Answer>>,
        inside: Mutex<Option<(tbon_rc, tbon_rc, tbon_rc)>>,
    }

    unsafe extern "C" fn on_value(
        rc: tbon_rc,
        rank: u32,
        key: *const c_char,
        data: *const u8,
        len: usize,
        user: *mut c_void,
    ) {
        // SAFETY: a `Probe` the test keeps alive until every callback ran.
        let probe = unsafe { &*user.cast::<Probe>() };
        // SAFETY: valid during the call.
        let key = unsafe { std::ffi::CStr::from_ptr(key) }
            .to_string_lossy()
            .into_owned();
        let value = if len == 0 {
            Vec::new()
        } else {
            // SAFETY: `len` bytes valid during the call.
            unsafe { std::slice::from_raw_parts(data, len) }.to_vec()
        };
        let first = {
            let mut a = probe.answers.lock().unwrap();
            a.push((rc, rank, key, value));
            a.len() == 1
        };
        if first {
            let k = CString::new("k").unwrap();
            let (mut buf, mut n) = ([0u8; 8], 0usize);
            // SAFETY: valid pointers for the calls.
            let inside = unsafe {
                (
                    tbon_get(
                        probe.d,
                        probe.g,
                        2,
                        k.as_ptr(),
                        buf.as_mut_ptr().cast(),
                        8,
                        &mut n,
                        10,
                    ),
                    tbon_fence(probe.d, probe.g, 0, 10),
                    tbon_get_cb(probe.d, probe.g, 2, k.as_ptr(), Some(on_value), user),
                )
            };
            *probe.inside.lock().unwrap() = Some(inside);
        }
    }

    #[test]
    fn binding_callbacks_excluded_members_and_size_queries() {
        use tbon_rc::*;
        let key = std::env::temp_dir().join(format!("tbon-ffi-modex-{}.key", std::process::id()));
        std::fs::write(&key, "modex-test-key-0123456789").unwrap();
        let set = |cfg, k: &str, v: &str| {
            let (k, v) = (CString::new(k).unwrap(), CString::new(v).unwrap());
            // SAFETY: valid strings for the call.
            unsafe { tbon_config_set(cfg, k.as_ptr(), v.as_ptr()) }
        };
        let (mut cfg, mut d) = (0, [0u64; 4]);
        let mut uri = [0 as c_char; 512];
        let mut len = uri.len();
        // SAFETY: valid out-pointers and strings.
        unsafe {
            assert_eq!(tbon_config_new(&mut cfg), TBON_OK);
            assert_eq!(set(cfg, "if_include", "127.0.0.1/32"), TBON_OK);
            assert_eq!(set(cfg, "key_file", key.to_str().unwrap()), TBON_OK);
            assert_eq!(set(cfg, "radix", "2"), TBON_OK);
            assert_eq!(tbon_start(cfg, 0, 4, null(), &mut d[0]), TBON_OK);
            assert_eq!(tbon_contact_uri(d[0], uri.as_mut_ptr(), &mut len), TBON_OK);
            for r in 1..4 {
                assert_eq!(
                    tbon_start(cfg, r, 4, uri.as_ptr(), &mut d[r as usize]),
                    TBON_OK
                );
            }
            for &x in &d {
                assert_eq!(tbon_wait_wired(x, 60_000), TBON_OK);
            }
        }
        // Ranks 1, 2 and 3 are the job; rank 0 relays.
        let members = [1u32, 2, 3];
        let k = CString::new("k").unwrap();
        let mut g = [0u64; 4];
        for r in 1..4 {
            let v = [r as u8; 3];
            // SAFETY: valid pointers.
            unsafe {
                assert_eq!(tbon_group_new(4, members.as_ptr(), 3, &mut g[r]), TBON_OK);
                assert_eq!(
                    tbon_put(d[r], g[r], k.as_ptr(), v.as_ptr().cast(), 3),
                    TBON_OK
                );
            }
            assert_eq!(tbon_commit(d[r], g[r]), TBON_OK);
        }
        // Rank 1's group belongs to rank 1 now: rank 2 needs its own.
        // SAFETY: valid pointers.
        let rc = unsafe { tbon_put(d[2], g[1], k.as_ptr(), null(), 0) };
        assert_eq!(rc, TBON_ERR_BAD_PARAM);
        assert_eq!(tbon_commit(d[2], g[1]), TBON_ERR_BAD_PARAM);

        // Rank 3 dies before the fence: the others' full fence excludes it.
        assert_eq!(tbon_abort(d[3]), TBON_OK);
        for r in [1usize, 2] {
            let rc = tbon_fence_cb(d[r], g[r], 0, Some(on_fenced), r as *mut c_void);
            assert_eq!(rc, TBON_OK);
        }
        for r in [1usize, 2] {
            assert_eq!(wait_for(&FENCED[r]), (TBON_OK, 0, vec![3]), "rank {r}");
        }
        // The next fence in two modes: both end it TBON_ERR_MISMATCH, and it keeps its number.
        for (r, mode) in [(1usize, 0), (2, 1)] {
            let rc = tbon_fence_cb(d[r], g[r], mode, Some(on_fenced), r as *mut c_void);
            assert_eq!(rc, TBON_OK);
        }
        for r in [1usize, 2] {
            assert_eq!(
                wait_for(&FENCED[r]),
                (TBON_ERR_MISMATCH, 1, vec![]),
                "rank {r}"
            );
        }

        // Rank 1 reads rank 2's value: a size query, then the value.
        let (mut buf, mut n) = ([0u8; 8], 0usize);
        // SAFETY: valid pointers.
        unsafe {
            let rc = tbon_get(d[1], g[1], 2, k.as_ptr(), null_mut(), 0, &mut n, 60_000);
            assert_eq!((rc, n), (TBON_ERR_TOO_LARGE, 3));
            let rc = tbon_get(
                d[1],
                g[1],
                2,
                k.as_ptr(),
                buf.as_mut_ptr().cast(),
                8,
                &mut n,
                60_000,
            );
            assert_eq!((rc, n, &buf[..3]), (TBON_OK, 3, &[2u8; 3][..]));
            // The dead member's data never came: an error, never a hang.
            let rc = tbon_get(
                d[1],
                g[1],
                3,
                k.as_ptr(),
                buf.as_mut_ptr().cast(),
                8,
                &mut n,
                60_000,
            );
            assert_eq!(rc, TBON_ERR_NODE_DOWN);
        }

        // In a get's callback: the blocking calls are refused, the callback form works.
        let probe = Probe {
            d: d[1],
            g: g[1],
            answers: Mutex::new(Vec::new()),
            inside: Mutex::new(None),
        };
        let user = std::ptr::from_ref(&probe).cast_mut().cast();
        // SAFETY: valid pointers; the probe outlives the callbacks (waited for below).
        let rc = unsafe { tbon_get_cb(d[1], g[1], 1, k.as_ptr(), Some(on_value), user) };
        assert_eq!(rc, TBON_OK);
        assert_eq!(
            wait_for(&probe.inside),
            (TBON_ERR_BUSY, TBON_ERR_BUSY, TBON_OK)
        );
        let start = Instant::now();
        while probe.answers.lock().unwrap().len() < 2 {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "no chained answer"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(
            *probe.answers.lock().unwrap(),
            vec![
                (TBON_OK, 1, "k".to_string(), vec![1u8; 3]),
                (TBON_OK, 2, "k".to_string(), vec![2u8; 3]),
            ]
        );
        // The refused fence took no number: the next is still 2.
        let mut seq = 0;
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { tbon_group_next_seq(g[1], &mut seq) }, TBON_OK);
        assert_eq!(seq, 2);
        // Rank 0 is not a member: it reads nothing of the job's, refused at once.
        let mut g0 = 0;
        // SAFETY: valid pointers.
        unsafe {
            assert_eq!(tbon_group_new(4, members.as_ptr(), 3, &mut g0), TBON_OK);
            let rc = tbon_get(
                d[0],
                g0,
                2,
                k.as_ptr(),
                buf.as_mut_ptr().cast(),
                8,
                &mut n,
                60_000,
            );
            assert_eq!(rc, TBON_ERR_NOT_MEMBER);
            let rc = tbon_get_cb(d[0], g0, 2, k.as_ptr(), Some(on_value), null_mut());
            assert_eq!(rc, TBON_ERR_NOT_MEMBER);
        }
        assert_eq!(tbon_group_free(g0), TBON_OK);

        assert_eq!(tbon_shutdown_dvm(d[0]), TBON_OK);
        for &x in &d {
            assert_eq!(tbon_wait_stopped(x, 60_000), TBON_OK);
            assert_eq!(tbon_free(x), TBON_OK);
        }
        for &x in &g[1..] {
            assert_eq!(tbon_group_free(x), TBON_OK);
        }
        assert_eq!(tbon_config_free(cfg), TBON_OK);
        let _ = std::fs::remove_file(&key);
    }
}
