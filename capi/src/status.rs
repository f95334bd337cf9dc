//! The C API of status queries (issue "Operating a live DVM"): `tbon_status_get` asks a daemon
//! of this process, `tbon_status_query` asks a running DVM as an operator's tool; both give a
//! `tbon_status` handle read with `tbon_status_summary`, `tbon_status_rank` and
//! `tbon_status_json`, freed with `tbon_status_free`. Part of the FFI module: the same rules.

use super::{Fail, Res, fail, guard, handle, non_null, not_in_callback, put, registry, str_arg};
use super::{tbon_daemon, tbon_rc};
use std::ffi::c_char;
use tbon::driver::key::Key;
use tbon::status::view::{Json, RankState, View, view};
use tbon::status::{Report, StatusError, StatusOptions};

/// A status gathered from a DVM (0 is never a valid handle). Free it with `tbon_status_free`.
pub type tbon_status = u64;

/// `tbon_status_get`/`tbon_status_query` flag: every daemon in detail (by default a healthy
/// subtree is summarised; the JSON is then shorter, the per-rank states the same).
pub const TBON_STATUS_ALL: u32 = 1;

/// What a status says of one rank (`tbon_status_rank`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum tbon_rank_state {
    /// It answered, in detail.
    TBON_RANK_ALIVE = 0,
    /// It answered, within a healthy subtree summarised in one part.
    TBON_RANK_HEALTHY = 1,
    /// The DVM declared it failed.
    TBON_RANK_DEAD = 2,
    /// Its parent asked it and it did not answer within the budget (stuck, stopped,
    /// overloaded, or dying): suspected.
    TBON_RANK_NO_ANSWER = 3,
    /// Below a daemon that did not answer: not known.
    TBON_RANK_UNKNOWN = 4,
    /// Alive in the tree but covered by no answer (the tree changed during the query).
    TBON_RANK_UNREACHED = 5,
    /// Outside the subtree of the daemon asked (a daemon other than rank 0 answers for its
    /// subtree only).
    TBON_RANK_NOT_COVERED = 6,
    /// It left the DVM in order (`tbon_leave`): not a fault.
    TBON_RANK_DEPARTED = 7,
    /// Room to grow (`initial_size`) that has not joined: not a fault.
    TBON_RANK_ABSENT = 8,
}

/// The counts of a status (`tbon_status_summary`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct tbon_status_counts {
    /// The DVM's size, radix and epoch, and the rank that gathered the status.
    pub size: u32,
    pub radix: u32,
    pub epoch: u64,
    pub from: u32,
    /// Ranks that answered, declared dead, silent, unknown below a silent one, unreached.
    pub answered: u32,
    pub dead: u32,
    pub no_answer: u32,
    pub unknown: u32,
    pub unreached: u32,
    /// Microseconds the gathering daemon took.
    pub elapsed_us: u64,
    /// 1 when detail was dropped to keep the answer bounded.
    pub truncated: u8,
    /// 1 when the daemons' views of the tree differed (a repair under way): ask again.
    pub views_differ: u8,
    /// Ranks that left in order, and ranks of the room to grow not joined (neither is dead).
    pub departed: u32,
    pub absent: u32,
}

pub(super) struct StatusEntry {
    report: Report,
    view: View,
}

fn status_rc(e: &StatusError) -> tbon_rc {
    match e {
        StatusError::Refused(_) | StatusError::InCallback => tbon_rc::TBON_ERR_BUSY,
        StatusError::ShutDown => tbon_rc::TBON_ERR_SHUT_DOWN,
        StatusError::Unreachable(_) => tbon_rc::TBON_ERR_UNREACHABLE,
        StatusError::Credential(_) => tbon_rc::TBON_ERR_CREDENTIAL,
        StatusError::TimedOut => tbon_rc::TBON_ERR_TIMED_OUT,
        StatusError::Invalid(_) => tbon_rc::TBON_ERR_BAD_PARAM,
        _ => tbon_rc::TBON_ERR_INTERNAL,
    }
}

fn flags_arg(flags: u32) -> Result<bool, Fail> {
    if flags & !TBON_STATUS_ALL != 0 {
        return fail(
            tbon_rc::TBON_ERR_BAD_PARAM,
            format!("unknown status flags {flags:#x}"),
        );
    }
    Ok(flags & TBON_STATUS_ALL != 0)
}

fn keep(result: Result<Report, StatusError>, out: *mut tbon_status) -> Res {
    let report = result.or_else(|e| fail(status_rc(&e), e.to_string()))?;
    let view = view(&report).or_else(|e| {
        fail(
            tbon_rc::TBON_ERR_INTERNAL,
            format!("the status does not fit a tree: {e}"),
        )
    })?;
    let mut r = registry();
    let id = r.new_id();
    r.statuses.insert(id, StatusEntry { report, view });
    drop(r);
    // SAFETY: checked for null by the caller.
    unsafe { put(out, id) };
    Ok(())
}

/// Gathers the status of the subtree of daemon `d` of this process (rank 0: the whole DVM)
/// within `budget_ms` (1 to 60,000, a longer one cut to 60,000; 0 is `TBON_ERR_BAD_PARAM`; a subtree silent for longer shows as
/// `TBON_RANK_NO_ANSWER`), and stores a new handle in `*out`. Blocks for about the budget at
/// most; `TBON_ERR_BUSY` from a callback, before wire-up, or with 8 queries of this daemon in
/// progress; `TBON_ERR_SHUT_DOWN` once it stops; `TBON_ERR_BAD_PARAM` for unknown `flags`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_status_get(
    d: tbon_daemon,
    budget_ms: u32,
    flags: u32,
    out: *mut tbon_status,
) -> tbon_rc {
    guard(|| {
        non_null(out, "out")?;
        not_in_callback("tbon_status_get")?;
        let all = flags_arg(flags)?;
        let h = handle(d)?;
        keep(h.status(budget_ms, all), out)
    })
}

/// As an operator's tool: connects to the daemon whose contact URI is `uri` (rank 0's, from
/// its `--uri-file`, for the whole DVM), proves the operator credential in the file
/// `credential_path` (`tbon_operator_credential`, `tbon keygen --operator`), and gathers its
/// subtree's status within `budget_ms` (1 to 60,000); a new handle in `*out`. Never joins the
/// DVM. Blocks for at most 5 s to connect and complete the handshake, then the budget plus
/// 5 s for the answer. `TBON_ERR_CREDENTIAL` when the daemon does not hold the key the
/// credential derives from; `TBON_ERR_UNREACHABLE` (no answer to the connection, or a
/// handshake not completed in time: a stopped daemon); `TBON_ERR_BUSY` (not wired up,
/// stopping, busy, or it closed the connection during the handshake: too many tools, or a
/// URI naming another DVM or rank); `TBON_ERR_TIMED_OUT`, `TBON_ERR_SHUT_DOWN`;
/// `TBON_ERR_CONFIG` for a credential file that cannot be read; `TBON_ERR_BAD_PARAM` for a
/// bad URI, flags or a zero budget.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_status_query(
    uri: *const c_char,
    credential_path: *const c_char,
    budget_ms: u32,
    flags: u32,
    out: *mut tbon_status,
) -> tbon_rc {
    guard(|| {
        non_null(out, "out")?;
        not_in_callback("tbon_status_query")?;
        // SAFETY: the caller's NUL-terminated strings, valid for the call.
        let uri = unsafe { str_arg(uri, "uri") }?;
        let path = unsafe { str_arg(credential_path, "credential_path") }?;
        let all = flags_arg(flags)?;
        let contact = uri
            .parse()
            .or_else(|e| fail(tbon_rc::TBON_ERR_BAD_PARAM, format!("uri: {e}")))?;
        let credential = Key::from_file(path).or_else(|e| {
            fail(
                tbon_rc::TBON_ERR_CONFIG,
                format!("the operator credential file: {e}"),
            )
        })?;
        let options = StatusOptions {
            budget_ms,
            all,
            ..StatusOptions::default()
        };
        keep(tbon::status::query(&contact, &credential, &options), out)
    })
}

/// Writes the operator credential derived from the job key in `key_path` to a new file at
/// `out_path` (mode 0600; never replaces a file), as `tbon keygen --operator` does: give it to
/// operators' tools instead of the job key. `TBON_ERR_CONFIG` if the key cannot be read or the
/// file cannot be created; `TBON_ERR_BAD_PARAM` for a NULL or non-UTF-8 path.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_operator_credential(
    key_path: *const c_char,
    out_path: *const c_char,
) -> tbon_rc {
    guard(|| {
        // SAFETY: the caller's NUL-terminated strings, valid for the call.
        let key_path = unsafe { str_arg(key_path, "key_path") }?;
        let out_path = unsafe { str_arg(out_path, "out_path") }?;
        Key::from_file(key_path)
            .and_then(|k| k.operator().write_new(out_path))
            .or_else(|e| fail(tbon_rc::TBON_ERR_CONFIG, e.to_string()))
    })
}

fn with_status<T>(s: tbon_status, f: impl FnOnce(&StatusEntry) -> T) -> Result<T, Fail> {
    match registry().statuses.get(&s) {
        Some(e) => Ok(f(e)),
        None => fail(
            tbon_rc::TBON_ERR_BAD_HANDLE,
            format!("no status with handle {s} (never made or already freed)"),
        ),
    }
}

/// Stores the counts of status `s` in `*out`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_status_summary(
    s: tbon_status,
    out: *mut tbon_status_counts,
) -> tbon_rc {
    guard(|| {
        non_null(out, "out")?;
        let sum = with_status(s, |e| {
            let n = |st| u32::try_from(e.view.count(st)).unwrap_or(u32::MAX);
            tbon_status_counts {
                size: e.report.size,
                radix: e.report.radix,
                epoch: e.report.epoch,
                from: e.report.from,
                answered: n(RankState::Alive) + n(RankState::Healthy),
                dead: n(RankState::Dead),
                no_answer: n(RankState::NoAnswer),
                unknown: n(RankState::Unknown),
                unreached: n(RankState::Unreached),
                elapsed_us: e.report.elapsed_us,
                truncated: u8::from(e.report.truncated),
                views_differ: u8::from(e.view.views_differ),
                departed: n(RankState::Departed),
                absent: n(RankState::Absent),
            }
        })?;
        // SAFETY: checked above.
        unsafe { put(out, sum) };
        Ok(())
    })
}

/// Stores what status `s` says of `rank` in `*out`; `TBON_ERR_RANK_OUT_OF_RANGE` for a rank
/// beyond the DVM's size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_status_rank(
    s: tbon_status,
    rank: u32,
    out: *mut tbon_rank_state,
) -> tbon_rc {
    guard(|| {
        non_null(out, "out")?;
        let state = with_status(s, |e| {
            if rank >= e.report.size {
                return None;
            }
            let st = e
                .view
                .ranks
                .binary_search_by_key(&rank, |r| r.rank)
                .ok()
                .and_then(|i| e.view.ranks.get(i))
                .map(|r| r.state);
            Some(match st {
                None => tbon_rank_state::TBON_RANK_NOT_COVERED,
                Some(RankState::Alive) => tbon_rank_state::TBON_RANK_ALIVE,
                Some(RankState::Healthy) => tbon_rank_state::TBON_RANK_HEALTHY,
                Some(RankState::Dead) => tbon_rank_state::TBON_RANK_DEAD,
                Some(RankState::NoAnswer) => tbon_rank_state::TBON_RANK_NO_ANSWER,
                Some(RankState::Unknown) => tbon_rank_state::TBON_RANK_UNKNOWN,
                Some(RankState::Unreached) => tbon_rank_state::TBON_RANK_UNREACHED,
                Some(RankState::Departed) => tbon_rank_state::TBON_RANK_DEPARTED,
                Some(RankState::Absent) => tbon_rank_state::TBON_RANK_ABSENT,
                // A state added to the library after this table: the closest C knows.
                Some(_) => tbon_rank_state::TBON_RANK_UNKNOWN,
            })
        })?;
        let Some(state) = state else {
            return fail(
                tbon_rc::TBON_ERR_RANK_OUT_OF_RANGE,
                format!("rank {rank} is beyond the DVM's size"),
            );
        };
        // SAFETY: checked above.
        unsafe { put(out, state) };
        Ok(())
    })
}

/// Stores `rank`'s wall-clock offset from the daemon that gathered status `s` (its clock minus
/// that daemon's, ns) in `*offset_ns`, and the bound within which the true offset lies in
/// `*bound_ns`: measured hop by hop along the tree by the query itself (NTP's four timestamps
/// per hop). Offsets are known for the daemons the status shows in detail: ask with
/// `TBON_STATUS_ALL` to have every daemon's. `TBON_ERR_NODE_DOWN` when the status has no offset
/// for `rank` (not in detail, silent, dead, or a hop without a sample);
/// `TBON_ERR_RANK_OUT_OF_RANGE` beyond the DVM's size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_status_clock(
    s: tbon_status,
    rank: u32,
    offset_ns: *mut i64,
    bound_ns: *mut u64,
) -> tbon_rc {
    guard(|| {
        non_null(offset_ns, "offset_ns")?;
        non_null(bound_ns, "bound_ns")?;
        let found = with_status(s, |e| {
            if rank >= e.report.size {
                return Err(tbon_rc::TBON_ERR_RANK_OUT_OF_RANGE);
            }
            e.report
                .parts
                .iter()
                .find_map(|p| match p {
                    tbon::status::Part::Daemon(d) if d.rank == rank => {
                        d.clock_offset_ns.zip(d.clock_bound_ns)
                    }
                    _ => None,
                })
                .ok_or(tbon_rc::TBON_ERR_NODE_DOWN)
        })?;
        match found {
            Ok((o, b)) => {
                // SAFETY: both checked above.
                unsafe {
                    put(offset_ns, o);
                    put(bound_ns, b);
                }
                Ok(())
            }
            Err(rc) => fail(
                rc,
                format!("no clock offset for rank {rank} in this status"),
            ),
        }
    })
}

/// Copies status `s` as JSON (the shape of `tbon status --format json`, without `took_us`),
/// NUL-terminated, into `buf`: `*len` is the size of `buf` on entry and the size needed on
/// return; if it does not fit (or `buf` is NULL, to ask the size) nothing is copied and
/// `TBON_ERR_TOO_LARGE` is returned. The status does not change between calls.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tbon_status_json(
    s: tbon_status,
    buf: *mut c_char,
    len: *mut usize,
) -> tbon_rc {
    guard(|| {
        non_null(len, "len")?;
        let text = with_status(s, |e| serde_json::to_string(&Json::new(&e.report, &e.view)))?
            .or_else(|e| fail(tbon_rc::TBON_ERR_INTERNAL, e.to_string()))?;
        // SAFETY: `len` checked above; `buf` and `*len` are the caller's promise.
        unsafe { super::put_text(buf, len, &text, "the status") }
    })
}

/// Frees status `s`; `TBON_ERR_BAD_HANDLE` if it is not one (or was freed already).
#[unsafe(no_mangle)]
pub extern "C" fn tbon_status_free(s: tbon_status) -> tbon_rc {
    guard(|| {
        let mut r = registry();
        if r.statuses.remove(&s).is_none() {
            return fail(
                tbon_rc::TBON_ERR_BAD_HANDLE,
                format!("no status with handle {s} (never made or already freed)"),
            );
        }
        r.release_if_empty();
        Ok(())
    })
}
