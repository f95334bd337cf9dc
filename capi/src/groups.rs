//! The C API of group collectives (issue "Jobs"): `tbon_group_new` makes a group (the daemons
//! of one job under the job's context number), `tbon_group_allgather`, `tbon_group_barrier`
//! and `tbon_group_broadcast` run its collectives in order, `tbon_group_free` frees it. Part of
//! the FFI module: the same rules (guard, registry ids, pointers read only during the call).
//!
//! A `tbon::Group` numbers its collectives itself; this module takes each call's number under
//! the group's lock, so that the callback can name it, and binds a group to the first daemon
//! that used it (a group shared by two daemons of one process would number their calls apart).

use super::{
    Fail, UserPtr, contribution_arg, fail, gathered, guard, handle, non_null, not_in_callback, put,
    registry, send_rc, tbon_allgather_cb, tbon_daemon, tbon_rc,
};
use bytes::Bytes;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{RecvTimeoutError, sync_channel};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::Duration;
use tbon::error::SendError;
use tbon::{AllgatherResult, Group, GroupError};

/// A group of daemons for group collectives (the daemons one job runs on): an id from
/// `tbon_group_new`, valid until `tbon_group_free`; 0 is never valid.
pub type tbon_group = u64;

/// The most members a group may have (`tbon_group_new`: `TBON_ERR_TOO_LARGE` beyond).
pub const TBON_GROUP_MEMBERS_MAX: usize = 1 << 20;
const _: () = assert!(TBON_GROUP_MEMBERS_MAX == tbon::limits::GROUP_MEMBERS_MAX);

/// Group collectives one daemon may have called and not yet seen end, all its groups
/// together: one more is refused `TBON_ERR_BUSY` (it takes no number; call it again once one
/// of them ended).
pub const TBON_GROUP_INFLIGHT_MAX: usize = 256;
const _: () = assert!(TBON_GROUP_INFLIGHT_MAX == tbon::limits::GROUP_INFLIGHT_MAX);

/// Group broadcast callback (`tbon_group_broadcast`): called once, on the loop thread. With
/// `TBON_OK`, `data` holds the root's `len` bytes (NULL when `len` is 0), valid only during the
/// call: copy what you keep. Otherwise `data` is NULL and `len` 0: `TBON_ERR_NODE_DOWN` (the
/// root died before its bytes reached the tree), `TBON_ERR_TOO_LARGE` (the root's bytes and 8
/// bytes per member exceeded the 16 MiB gathered-bytes bound, or `msg_max_bytes`),
/// `TBON_ERR_DUPLICATE`, `TBON_ERR_MISMATCH`, `TBON_ERR_RESULT_LOST`, `TBON_ERR_SHUT_DOWN` (see
/// `tbon_group_allgather`). `seq` is the collective's number in the group.
pub type tbon_group_broadcast_cb = Option<
    unsafe extern "C" fn(rc: tbon_rc, seq: u64, data: *const u8, len: usize, user: *mut c_void),
>;

/// A group in the registry: the Rust group, the daemon it is bound to (the first one whose
/// call it accepted), and the lock a call that takes the group's next number holds.
pub(super) type GroupEntry = Arc<Bound>;

pub(super) struct Bound {
    /// Never changes (its clones share its numbering).
    group: Group,
    /// The daemon, 0 until a call was accepted (0 is never a daemon's id). Read and set without
    /// the lock by the calls that take no number (the data exchange's, the fence excepted), so
    /// that a callback they trigger may call on the group at once.
    daemon: AtomicU64,
    numbering: Mutex<()>,
}

/// The group's numbering lock. A call that takes a number holds it while the daemon's loop
/// takes the call, which from a thread other than the loop's waits for room in the loop's
/// command queue; so in a callback (on the loop thread, the one that makes that room) it is
/// only tried, and a group another thread's call holds is `TBON_ERR_BUSY` instead of a
/// deadlock.
fn lock(e: &GroupEntry) -> Result<MutexGuard<'_, ()>, Fail> {
    if !super::IN_CALLBACK.with(|f| f.get()) {
        return Ok(e.numbering.lock().unwrap_or_else(|p| p.into_inner()));
    }
    match e.numbering.try_lock() {
        Ok(b) => Ok(b),
        Err(TryLockError::Poisoned(p)) => Ok(p.into_inner()),
        Err(TryLockError::WouldBlock) => fail(
            tbon_rc::TBON_ERR_BUSY,
            "another thread's call on this group is in progress; offer this one again later",
        ),
    }
}

impl From<GroupError> for Fail {
    fn from(e: GroupError) -> Self {
        let rc = match e {
            GroupError::Empty => tbon_rc::TBON_ERR_BAD_PARAM,
            GroupError::TooManyMembers { .. } => tbon_rc::TBON_ERR_TOO_LARGE,
            _ => tbon_rc::TBON_ERR_INTERNAL,
        };
        Fail(rc, e.to_string())
    }
}

pub(super) fn group_entry(g: tbon_group) -> Result<GroupEntry, Fail> {
    match registry().groups.get(&g) {
        Some(e) => Ok(Arc::clone(e)),
        None => fail(
            tbon_rc::TBON_ERR_BAD_HANDLE,
            format!("no group with handle {g} (never made or already freed)"),
        ),
    }
}

/// `TBON_ERR_BAD_PARAM` if group `g` is bound to a daemon other than `d`.
fn check_owner(bound: &Bound, d: tbon_daemon, g: tbon_group) -> Result<(), Fail> {
    let owner = bound.daemon.load(Ordering::Acquire);
    if owner != 0 && owner != d {
        return fail(
            tbon_rc::TBON_ERR_BAD_PARAM,
            format!(
                "group {g} belongs to daemon {owner}: every daemon needs a tbon_group of its own \
                 (tbon_group_new with the same context and members)"
            ),
        );
    }
    Ok(())
}

/// Makes the call `call(group, number)` on daemon `d` under the group's lock, `number` being
/// the one the call takes if it is accepted; binds the group to `d` once a call is accepted.
pub(super) fn submit(
    d: tbon_daemon,
    g: tbon_group,
    entry: &GroupEntry,
    call: impl FnOnce(&Group, u64) -> Result<(), SendError>,
) -> Result<(), Fail> {
    let _numbering = lock(entry)?;
    check_owner(entry, d, g)?;
    let seq = entry.group.next_seq(&handle(d)?);
    call(&entry.group, seq)?;
    bind(entry, d);
    Ok(())
}

/// Binds the group to `d` unless it is bound already.
fn bind(entry: &Bound, d: tbon_daemon) {
    let _ = entry
        .daemon
        .compare_exchange(0, d, Ordering::AcqRel, Ordering::Acquire);
}

/// Makes a call that takes no number (the data exchange's puts, commits, gets and forgets) on
/// daemon `d`, without the numbering lock (such a call is not ordered with the group's
/// collectives, and the callback of a get answered at once may call on the group before this
/// returns); binds the group to `d` once a call is accepted, as `submit`.
pub(super) fn with_group<T>(
    d: tbon_daemon,
    g: tbon_group,
    entry: &GroupEntry,
    call: impl FnOnce(&Group) -> Result<T, Fail>,
) -> Result<T, Fail> {
    check_owner(entry, d, g)?;
    let r = call(&entry.group)?;
    bind(entry, d);
    Ok(r)
}

/// Makes a group of the `nmembers` ranks at `members` (any order; duplicates count once) under
/// `context`, and stores its handle in `*out`. A group is what one job's collectives run
/// among: only its members take part (and the daemons of the tree between them and rank 0),
/// and any number of groups, overlapping or not, run at once.
///
/// What the caller must do: every member's daemon makes its own group with the same
/// `context` and members (a group belongs to the daemon that first uses it: one group per
/// daemon, also for several daemons in one process, else `TBON_ERR_BAD_PARAM`); every living
/// member calls the group's collectives in the same order, the same kind each time
/// (allgather, barrier, or broadcast with the same root), since a group numbers its
/// collectives 0, 1, 2, ... in the order they are called; calls from several threads are
/// ordered by the caller; a context is never used again for the same members once a group
/// was used (a job's number is never reused). Whether the ranks exist is checked when the
/// group is used (`TBON_ERR_RANK_OUT_OF_RANGE`). Errors: `TBON_ERR_BAD_PARAM` (no members,
/// `members` NULL with `nmembers` > 0, `out` NULL), `TBON_ERR_TOO_LARGE` (more than
/// `TBON_GROUP_MEMBERS_MAX` members). The members are copied.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_group_new(
    context: u64,
    members: *const u32,
    nmembers: usize,
    out: *mut tbon_group,
) -> tbon_rc {
    guard(|| {
        non_null(out, "out")?;
        // Before the slice is made: a length beyond the bound must not be read.
        let max = tbon::limits::GROUP_MEMBERS_MAX;
        if nmembers > max {
            return fail(
                tbon_rc::TBON_ERR_TOO_LARGE,
                format!("a group of {nmembers} members; at most {max}"),
            );
        }
        let ranks: &[u32] = if nmembers == 0 {
            &[]
        } else {
            non_null(members, "members")?;
            // SAFETY: non-null, and the caller promised `nmembers` readable ranks for the call.
            unsafe { std::slice::from_raw_parts(members, nmembers) }
        };
        let group = Group::new(context, ranks.iter().copied())?;
        let entry = Arc::new(Bound {
            group,
            daemon: AtomicU64::new(0),
            numbering: Mutex::new(()),
        });
        let mut r = registry();
        let id = r.new_id();
        r.groups.insert(id, entry);
        drop(r);
        // SAFETY: checked above.
        unsafe { put(out, id) };
        Ok(())
    })
}

/// Frees group `g`; 0 does nothing (`TBON_OK`). Collectives already called go on, and their
/// callbacks still run. `TBON_ERR_BAD_HANDLE` if `g` is not a group (or was freed already).
#[unsafe(no_mangle)]
pub extern "C" fn tbon_group_free(g: tbon_group) -> tbon_rc {
    guard(|| {
        if g == 0 {
            return Ok(());
        }
        let mut r = registry();
        if r.groups.remove(&g).is_none() {
            return fail(
                tbon_rc::TBON_ERR_BAD_HANDLE,
                format!("no group with handle {g} (never made or already freed)"),
            );
        }
        r.release_if_empty();
        Ok(())
    })
}

/// Stores in `*out` the number the group's next collective will take: how many of its
/// collectives this daemon called and had accepted (a call refused at once takes none).
/// `TBON_ERR_BUSY` from a callback while another thread's call on this group is in progress.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_group_next_seq(g: tbon_group, out: *mut u64) -> tbon_rc {
    guard(|| {
        non_null(out, "out")?;
        let entry = group_entry(g)?;
        let _numbering = lock(&entry)?;
        // A group no daemon used yet has taken no number.
        let seq = match entry.daemon.load(Ordering::Acquire) {
            0 => 0,
            d => entry.group.next_seq(&handle(d)?),
        };
        // SAFETY: checked above.
        unsafe { put(out, seq) };
        Ok(())
    })
}

/// Contributes `len` bytes at `data` (copied; `data` may be NULL when `len` is 0) to group
/// `g`'s next collective, an allgather, without waiting. `cb` (not NULL) gets the result as
/// `tbon_allgather_cb` describes, the same at every member: every member's bytes ordered by
/// rank (members only), the members that died before theirs reached the tree as excluded,
/// and `id` set to the collective's number in the group. It is called exactly once if and
/// only if this returns `TBON_OK`; then with `TBON_OK`, or `TBON_ERR_TOO_LARGE` (the gathered
/// bytes exceeded 16 MiB, 8 bytes per member included, or `msg_max_bytes`),
/// `TBON_ERR_DUPLICATE` (another group of the same context and members ran this number on
/// this daemon), `TBON_ERR_MISMATCH` (the members called different collectives under this
/// number), `TBON_ERR_RESULT_LOST` (see `tbon_rc`; the other members may have it),
/// `TBON_ERR_SHUT_DOWN` (the daemon stopped first).
///
/// Returned at once, and then the call takes no number (call it again later to stay in step
/// with the other members): `TBON_ERR_NOT_MEMBER` (this daemon is not a member),
/// `TBON_ERR_RANK_OUT_OF_RANGE` (a member is not a rank of the DVM), `TBON_ERR_TOO_LARGE`
/// (above 16 MiB less 13 bytes), `TBON_ERR_BUSY` (`TBON_GROUP_INFLIGHT_MAX` group collectives
/// in flight on this daemon, or the queue before wire-up is full; from a callback also when
/// the command queue is, or when another thread's call on this group is in progress), `TBON_ERR_SHUT_DOWN`, `TBON_ERR_BAD_HANDLE`, `TBON_ERR_BAD_PARAM` (a NULL
/// `cb` or `data`, or a group bound to another daemon). A barrier that does not wait is this
/// call with `len` 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_group_allgather(
    d: tbon_daemon,
    g: tbon_group,
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
        let entry = group_entry(g)?;
        // SAFETY: the caller's buffer, valid for this call.
        let payload = unsafe { contribution_arg(data, len)? };
        let user = UserPtr(user);
        submit(d, g, &entry, |group, seq| {
            h.group_allgather(group, payload, move |r| gathered(cb, seq, r, user))
        })
    })
}

/// Enters group `g`'s next collective, a barrier, and waits until every living member has
/// entered it (members that died are not waited for), or `timeout_ms` passed
/// (`TBON_ERR_TIMED_OUT`: this daemon stays entered, the barrier goes on and keeps its
/// number). Errors as `tbon_group_allgather` (returned here, whether at once or at the end);
/// not from a callback (`TBON_ERR_BUSY`). To enter without waiting, call
/// `tbon_group_allgather` with `len` 0.
#[unsafe(no_mangle)]
pub extern "C" fn tbon_group_barrier(d: tbon_daemon, g: tbon_group, timeout_ms: u32) -> tbon_rc {
    guard(|| {
        not_in_callback("tbon_group_barrier")?;
        let h = handle(d)?;
        let entry = group_entry(g)?;
        let (tx, rx) = sync_channel::<Result<AllgatherResult, SendError>>(1);
        submit(d, g, &entry, |group, _| {
            h.group_barrier(group, move |r| {
                let _ = tx.send(r);
            })
        })?;
        match rx.recv_timeout(Duration::from_millis(timeout_ms.into())) {
            Ok(Ok(res)) if res.overflowed => fail(
                tbon_rc::TBON_ERR_TOO_LARGE,
                "the barrier's result (8 bytes per member) exceeded the gathered-bytes bound or \
                 msg_max_bytes",
            ),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.into()),
            Err(RecvTimeoutError::Timeout) => Err(SendError::TimedOut.into()),
            Err(RecvTimeoutError::Disconnected) => Err(SendError::ShutDown.into()),
        }
    })
}

/// Group `g`'s next collective as a broadcast from member `root`, without waiting: every
/// living member calls it with the same `root`; the root's `len` bytes at `data` (copied; NULL
/// when `len` is 0) go to every member, and `cb` (not NULL) gets them (see
/// `tbon_group_broadcast_cb`), at the root too. At the other members `data` and `len` are not
/// read (pass NULL and 0). `cb` is called exactly once if and only if this returns `TBON_OK`.
/// Returned at once: `TBON_ERR_NOT_MEMBER` also when `root` is not a member; otherwise as
/// `tbon_group_allgather`.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn tbon_group_broadcast(
    d: tbon_daemon,
    g: tbon_group,
    root: u32,
    data: *const c_void,
    len: usize,
    cb: tbon_group_broadcast_cb,
    user: *mut c_void,
) -> tbon_rc {
    guard(|| {
        let Some(cb) = cb else {
            return fail(tbon_rc::TBON_ERR_BAD_PARAM, "cb is NULL");
        };
        let h = handle(d)?;
        let entry = group_entry(g)?;
        if !entry.group.contains(root) {
            return Err(SendError::NotMember(root).into());
        }
        let payload = if h.rank() == root {
            // SAFETY: the caller's buffer, valid for this call.
            unsafe { contribution_arg(data, len)? }
        } else {
            Bytes::new()
        };
        let user = UserPtr(user);
        // Not `Handle::group_broadcast`, which refuses at once a payload that would overflow
        // with the members' bookkeeping: C reports that to every member, in the callback. A
        // broadcast all the same (not an allgather): members that called something else
        // under its number, or another root, end it with TBON_ERR_MISMATCH.
        submit(d, g, &entry, |group, seq| {
            h.group_broadcast_gathered(group, root, payload, move |r| {
                broadcast_done(cb, seq, root, r, user)
            })
        })
    })
}

/// Hands a group broadcast's outcome to the caller's callback (on the loop thread).
fn broadcast_done(
    cb: unsafe extern "C" fn(tbon_rc, u64, *const u8, usize, *mut c_void),
    seq: u64,
    root: u32,
    r: Result<AllgatherResult, SendError>,
    user: UserPtr,
) {
    let _scope = super::CallbackScope::enter();
    let (rc, bytes) = match r {
        Ok(res) if res.overflowed => (tbon_rc::TBON_ERR_TOO_LARGE, None),
        Ok(res) => match res.get(root) {
            Some(b) => (tbon_rc::TBON_OK, Some(b.clone())),
            None => (tbon_rc::TBON_ERR_NODE_DOWN, None),
        },
        Err(e) => (send_rc(&e), None),
    };
    let (data, len) = match &bytes {
        Some(b) if !b.is_empty() => (b.as_ptr(), b.len()),
        _ => (std::ptr::null(), 0),
    };
    // SAFETY: the caller's function; the bytes live for the call.
    unsafe { cb(rc, seq, data, len, user.get()) }
}

#[cfg(test)]
mod tests {
    //! What the C layer adds to `Handle::group_*`: the number in the callbacks, the group bound
    //! to one daemon, an overflowed broadcast told apart from a dead root, a timed-out barrier
    //! that keeps its number. (The example `examples/c/group.c` runs the rest as a C user.)
    use crate::*;
    use std::ffi::CString;
    use std::ptr::{null, null_mut};
    use std::time::{Duration, Instant};

    /// One callback's outcome: (code, the collective's number, bytes or parts).
    #[derive(Default)]
    struct Slot(Mutex<Option<(tbon_rc, u64, usize)>>);

    impl Slot {
        fn user(&self) -> *mut c_void {
            std::ptr::from_ref(self).cast_mut().cast()
        }

        fn wait(&self) -> (tbon_rc, u64, usize) {
            let start = Instant::now();
            loop {
                if let Some(got) = *self.0.lock().unwrap() {
                    return got;
                }
                assert!(start.elapsed() < Duration::from_secs(60), "no callback");
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }

    unsafe extern "C" fn on_gathered(
        rc: tbon_rc,
        id: u64,
        _: *const tbon_contribution,
        count: usize,
        _: *const u32,
        _: usize,
        user: *mut c_void,
    ) {
        // SAFETY: a `Slot` the test keeps alive until every callback ran.
        let slot = unsafe { &*user.cast::<Slot>() };
        *slot.0.lock().unwrap() = Some((rc, id, count));
    }

    unsafe extern "C" fn on_bcast(
        rc: tbon_rc,
        seq: u64,
        _: *const u8,
        len: usize,
        user: *mut c_void,
    ) {
        // SAFETY: as above.
        let slot = unsafe { &*user.cast::<Slot>() };
        *slot.0.lock().unwrap() = Some((rc, seq, len));
    }

    #[test]
    fn numbers_binding_overflow_and_a_timed_out_barrier() {
        use tbon_rc::*;
        let key = std::env::temp_dir().join(format!("tbon-ffi-groups-{}.key", std::process::id()));
        std::fs::write(&key, "groups-test-key-0123456789").unwrap();
        let set = |cfg, k: &str, v: &str| {
            let (k, v) = (CString::new(k).unwrap(), CString::new(v).unwrap());
            // SAFETY: valid strings for the call.
            unsafe { tbon_config_set(cfg, k.as_ptr(), v.as_ptr()) }
        };
        let (mut cfg, mut d) = (0, [0u64; 3]);
        let mut uri = [0 as c_char; 512];
        let mut len = uri.len();
        // SAFETY: valid out-pointers and strings.
        unsafe {
            assert_eq!(tbon_config_new(&mut cfg), TBON_OK);
            assert_eq!(set(cfg, "if_include", "127.0.0.1/32"), TBON_OK);
            assert_eq!(set(cfg, "key_file", key.to_str().unwrap()), TBON_OK);
            assert_eq!(set(cfg, "radix", "2"), TBON_OK);
            assert_eq!(tbon_start(cfg, 0, 3, null(), &mut d[0]), TBON_OK);
            assert_eq!(tbon_contact_uri(d[0], uri.as_mut_ptr(), &mut len), TBON_OK);
            for r in [1, 2] {
                assert_eq!(
                    tbon_start(cfg, r, 3, uri.as_ptr(), &mut d[r as usize]),
                    TBON_OK
                );
            }
            for &x in &d {
                assert_eq!(tbon_wait_wired(x, 60_000), TBON_OK);
            }
        }
        // Ranks 1 and 2 are the group; rank 0 relays.
        let members = [2u32, 1];
        let mut g = [0u64; 3];
        for r in [1, 2] {
            // SAFETY: valid pointers.
            let rc = unsafe { tbon_group_new(5, members.as_ptr(), 2, &mut g[r]) };
            assert_eq!(rc, TBON_OK);
        }
        let gathered = [Slot::default(), Slot::default(), Slot::default()];
        let data = b"abc";
        // SAFETY: valid pointers; the slots outlive the callbacks (waited for below).
        unsafe {
            let p = data.as_ptr().cast();
            assert_eq!(
                tbon_group_allgather(d[1], g[1], p, 3, Some(on_gathered), gathered[1].user()),
                TBON_OK
            );
            // Rank 1's group now belongs to rank 1: rank 2 needs its own.
            assert_eq!(
                tbon_group_allgather(d[2], g[1], p, 3, Some(on_gathered), null_mut()),
                TBON_ERR_BAD_PARAM
            );
            assert_eq!(
                tbon_group_allgather(d[2], g[2], p, 3, Some(on_gathered), gathered[2].user()),
                TBON_OK
            );
        }
        for r in [1, 2] {
            assert_eq!(gathered[r].wait(), (TBON_OK, 0, 2), "rank {r}'s allgather");
        }

        // A broadcast of the largest contribution: with 8 bytes per member (and each member's
        // call tag) it overflows the gathered-bytes bound, which is TBON_ERR_TOO_LARGE (not
        // the root's death).
        let big = vec![7u8; tbon::limits::ALLGATHER_MAX_BYTES - 8 - tbon::node::GROUP_CALL_LEN];
        let told = [Slot::default(), Slot::default(), Slot::default()];
        for r in [1, 2] {
            // SAFETY: valid pointers; the slots outlive the callbacks.
            let rc = unsafe {
                tbon_group_broadcast(
                    d[r],
                    g[r],
                    1,
                    big.as_ptr().cast(),
                    big.len(),
                    Some(on_bcast),
                    told[r].user(),
                )
            };
            assert_eq!(rc, TBON_OK);
        }
        for r in [1, 2] {
            assert_eq!(
                told[r].wait(),
                (TBON_ERR_TOO_LARGE, 1, 0),
                "rank {r}'s broadcast"
            );
        }

        // Another group value for the same group on rank 1 runs number 0 again: a duplicate.
        let (mut again, dup) = (0, Slot::default());
        // SAFETY: valid pointers; the slot outlives the callback.
        unsafe {
            assert_eq!(tbon_group_new(5, members.as_ptr(), 2, &mut again), TBON_OK);
            let rc = tbon_group_allgather(d[1], again, null(), 0, Some(on_gathered), dup.user());
            assert_eq!(rc, TBON_OK);
        }
        assert_eq!(dup.wait(), (TBON_ERR_DUPLICATE, 0, 0));
        assert_eq!(tbon_group_free(again), TBON_OK);

        // A barrier that times out keeps its number, and completes once rank 2 enters it.
        assert_eq!(tbon_group_barrier(d[1], g[1], 50), TBON_ERR_TIMED_OUT);
        let mut seq = 0;
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { tbon_group_next_seq(g[1], &mut seq) }, TBON_OK);
        assert_eq!(seq, 3);
        assert_eq!(tbon_group_barrier(d[2], g[2], 60_000), TBON_OK);

        // Members that call different collectives under one number all end it with
        // TBON_ERR_MISMATCH: an allgather against a broadcast, then broadcasts from two roots
        // (the C broadcast ran as an allgather and both passed, from an outside-in review);
        // the same broadcast at both is delivered.
        let calls: [(Option<u32>, Option<u32>, tbon_rc); 3] = [
            (None, Some(1), TBON_ERR_MISMATCH),
            (Some(1), Some(2), TBON_ERR_MISMATCH),
            (Some(2), Some(2), TBON_OK),
        ];
        for (round, (at1, at2, want)) in calls.into_iter().enumerate() {
            let got = [Slot::default(), Slot::default(), Slot::default()];
            for (r, root) in [(1usize, at1), (2, at2)] {
                let p = b"xy".as_ptr().cast();
                // SAFETY: valid pointers; the slots outlive the callbacks.
                let rc = unsafe {
                    match root {
                        None => {
                            tbon_group_allgather(d[r], g[r], p, 2, Some(on_gathered), got[r].user())
                        }
                        Some(root) => tbon_group_broadcast(
                            d[r],
                            g[r],
                            root,
                            p,
                            2,
                            Some(on_bcast),
                            got[r].user(),
                        ),
                    }
                };
                assert_eq!(rc, TBON_OK);
            }
            for r in [1, 2] {
                let (rc, seq, _) = got[r].wait();
                assert_eq!(
                    (rc, seq),
                    (want, 3 + round as u64),
                    "rank {r}, round {round}"
                );
            }
            if want == TBON_OK {
                assert_eq!(got[1].wait().2, 2, "the root's two bytes");
            }
        }

        assert_eq!(tbon_shutdown_dvm(d[0]), TBON_OK);
        for &x in &d {
            assert_eq!(tbon_wait_stopped(x, 60_000), TBON_OK);
            assert_eq!(tbon_free(x), TBON_OK);
        }
        for &x in &g[1..] {
            assert_eq!(tbon_group_free(x), TBON_OK);
        }
        assert_eq!(tbon_group_free(g[1]), TBON_ERR_BAD_HANDLE);
        assert_eq!(tbon_config_free(cfg), TBON_OK);
        let _ = std::fs::remove_file(&key);
    }
}
