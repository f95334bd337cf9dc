//! The C API once a daemon stopped: every call on its handle answers as `tbon.h` says —
//! `TBON_ERR_SHUT_DOWN` for what needs a running daemon, the queries that need none still
//! answer, stopping again is `TBON_OK` — and after `tbon_free` every call is
//! `TBON_ERR_BAD_HANDLE`. (Issue "Embedding tbon": "after `tbon_shutdown` every call answers as
//! the header says".)

use crate::*;
use std::ffi::{CString, c_char, c_int, c_void};
use std::ptr::{null, null_mut};

unsafe extern "C" fn on_freed(_: *mut c_void, _: *mut c_void) {}
unsafe extern "C" fn on_gathered(
    _: tbon_rc,
    _: u64,
    _: *const tbon_contribution,
    _: usize,
    _: *const u32,
    _: usize,
    _: *mut c_void,
) {
}
unsafe extern "C" fn on_bcast(_: tbon_rc, _: u64, _: *const u8, _: usize, _: *mut c_void) {}
unsafe extern "C" fn on_fenced(_: tbon_rc, _: u64, _: *const u32, _: usize, _: *mut c_void) {}
unsafe extern "C" fn on_got(
    _: tbon_rc,
    _: u32,
    _: *const c_char,
    _: *const u8,
    _: usize,
    _: *mut c_void,
) {
}
unsafe extern "C" fn on_recv(_: u32, _: u32, _: *const u8, _: usize, _: *mut c_void) {}
unsafe extern "C" fn on_fault(_: *const u32, _: usize, _: tbon_scope, _: u64, _: *mut c_void) {}
unsafe extern "C" fn on_repair(_: *const tbon_repair, _: *mut c_void) {}
unsafe extern "C" fn on_stream(_: *const u8, _: usize, _: *const tbon_stream_end, _: *mut c_void) {}
unsafe extern "C" fn on_serve(
    _: tbon_writer,
    _: u32,
    _: *const c_char,
    _: *const u8,
    _: usize,
    _: u64,
    _: *mut c_void,
) {
}

/// Every call on handle `d`, with valid arguments: (name, what it returned).
fn every_call(d: tbon_daemon) -> Vec<(&'static str, tbon_rc)> {
    let data = [1u8; 8];
    let p = data.as_ptr().cast::<c_void>();
    let svc = CString::new("svc").unwrap();
    let msgs = [tbon_outgoing {
        dst: 0,
        tag: 100,
        data: p,
        len: 8,
    }];
    let mut out = Vec::new();
    let mut uri = [0 as c_char; 256];
    let mut len = uri.len();
    let (mut u, mut sent, mut id) = (0u32, 0usize, 0u64);
    let mut counters = tbon_counters::default();
    let (mut status, mut stream) = (0, 0);
    let mut reason = tbon_stop::TBON_STOP_RUNNING;
    let mut rlen = 0usize;
    let mut buf = [0u8; 16];
    let mut blen = buf.len();
    let mut group = 0;
    let key = CString::new("endpoint").unwrap();
    let mut vlen = 0usize;
    let mut hex = [0 as c_char; TBON_CLIENT_KEY_HEX_SIZE];
    let client_key = CString::new("ab".repeat(32)).unwrap();
    let mut path = [0 as c_char; 256];
    let mut plen = path.len();
    // SAFETY: every pointer is valid for its call; the callbacks do nothing.
    unsafe {
        assert_eq!(
            tbon_group_new(1, [0].as_ptr(), 1, &mut group),
            tbon_rc::TBON_OK
        );
        out.push((
            "contact_uri",
            tbon_contact_uri(d, uri.as_mut_ptr(), &mut len),
        ));
        out.push(("rank", tbon_rank(d, &mut u)));
        out.push(("size", tbon_size(d, &mut u)));
        out.push(("wait_wired", tbon_wait_wired(d, 10)));
        out.push(("wait_stopped", tbon_wait_stopped(d, 10)));
        out.push((
            "stop_reason",
            tbon_stop_reason(d, &mut reason, null_mut(), &mut rlen),
        ));
        out.push(("send", tbon_send(d, 0, 100, p, 8, None, null_mut())));
        out.push((
            "send_routed",
            tbon_send_routed(d, 0, 100, p, 8, 0, None, null_mut()),
        ));
        out.push((
            "send_batch",
            tbon_send_batch(d, msgs.as_ptr(), 1, &mut sent),
        ));
        out.push((
            "send_reliable",
            tbon_send_reliable(d, 0, 100, p, 8, None, null_mut()),
        ));
        out.push((
            "send_nocopy",
            tbon_send_nocopy(
                d,
                0,
                100,
                p.cast_mut(),
                8,
                Some(on_freed),
                null_mut(),
                None,
                null_mut(),
            ),
        ));
        out.push(("broadcast", tbon_broadcast(d, 100, p, 8, None, null_mut())));
        out.push((
            "allgather",
            tbon_allgather(d, 1, p, 8, Some(on_gathered), null_mut()),
        ));
        out.push(("barrier", tbon_barrier(d, 2, 10)));
        out.push((
            "group_allgather",
            tbon_group_allgather(d, group, p, 8, Some(on_gathered), null_mut()),
        ));
        out.push(("group_barrier", tbon_group_barrier(d, group, 10)));
        out.push((
            "group_broadcast",
            tbon_group_broadcast(d, group, 0, p, 8, Some(on_bcast), null_mut()),
        ));
        out.push(("put", tbon_put(d, group, key.as_ptr(), p, 8)));
        out.push(("commit", tbon_commit(d, group)));
        out.push((
            "fence",
            tbon_fence(d, group, tbon_fence_mode::TBON_FENCE_FULL as c_int, 10),
        ));
        out.push((
            "fence_cb",
            tbon_fence_cb(
                d,
                group,
                tbon_fence_mode::TBON_FENCE_DIRECT as c_int,
                Some(on_fenced),
                null_mut(),
            ),
        ));
        out.push((
            "get",
            tbon_get(
                d,
                group,
                0,
                key.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut vlen,
                10,
            ),
        ));
        out.push((
            "get_cb",
            tbon_get_cb(d, group, 0, key.as_ptr(), Some(on_got), null_mut()),
        ));
        out.push(("forget_group", tbon_forget_group(d, group)));
        out.push(("recv", tbon_recv(d, 0, 100, 1, Some(on_recv), null_mut())));
        out.push(("cancel", tbon_cancel(d, 0, 100)));
        out.push(("purge", tbon_purge(d, 0)));
        out.push((
            "recv_blocking",
            tbon_recv_blocking(
                d,
                0,
                101,
                10,
                buf.as_mut_ptr().cast(),
                &mut blen,
                null_mut(),
            ),
        ));
        out.push(("on_fault", tbon_on_fault(d, Some(on_fault), null_mut())));
        out.push(("on_repair", tbon_on_repair(d, Some(on_repair), null_mut())));
        out.push(("counters_get", tbon_counters_get(d, &mut counters)));
        out.push(("status_get", tbon_status_get(d, 100, 0, &mut status)));
        out.push((
            "serve",
            tbon_serve(d, svc.as_ptr(), Some(on_serve), null_mut()),
        ));
        out.push((
            "fetch",
            tbon_fetch(d, 0, svc.as_ptr(), null(), 0, null(), &mut stream),
        ));
        out.push((
            "fetch_cb",
            tbon_fetch_cb(
                d,
                0,
                svc.as_ptr(),
                null(),
                0,
                null(),
                Some(on_stream),
                null_mut(),
                &mut id,
            ),
        ));
        out.push(("fetch_cancel", tbon_fetch_cancel(d, 1)));
        out.push((
            "client_job",
            tbon_client_job(d, 1, [2u64].as_ptr(), 1, hex.as_mut_ptr()),
        ));
        out.push((
            "client_job_with_key",
            tbon_client_job_with_key(d, 1, client_key.as_ptr(), null(), 0),
        ));
        out.push((
            "client_socket_path",
            tbon_client_socket_path(d, path.as_mut_ptr(), &mut plen),
        ));
        out.push(("client_job_close", tbon_client_job_close(d, 1)));
        out.push(("shutdown", tbon_shutdown(d)));
        out.push(("shutdown_dvm", tbon_shutdown_dvm(d)));
        out.push(("abort", tbon_abort(d)));
        assert_eq!(tbon_group_free(group), tbon_rc::TBON_OK);
    }
    out
}

#[test]
fn every_call_after_shutdown_and_after_free_answers_as_documented() {
    let key = std::env::temp_dir().join(format!("tbon-ffi-after-{}.key", std::process::id()));
    let socket = std::env::temp_dir().join(format!("tbon-ffi-after-{}.sock", std::process::id()));
    std::fs::write(&key, "after-shutdown-test-key-0123456789").unwrap();
    let mut cfg = 0;
    let set = |cfg, k: &str, v: &str| {
        let (k, v) = (CString::new(k).unwrap(), CString::new(v).unwrap());
        // SAFETY: valid strings for the call.
        unsafe { tbon_config_set(cfg, k.as_ptr(), v.as_ptr()) }
    };
    let mut d = 0;
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(tbon_config_new(&mut cfg), tbon_rc::TBON_OK);
        assert_eq!(set(cfg, "if_include", "127.0.0.1/32"), tbon_rc::TBON_OK);
        assert_eq!(
            set(cfg, "key_file", key.to_str().unwrap()),
            tbon_rc::TBON_OK
        );
        assert_eq!(
            set(cfg, "client_socket", socket.to_str().unwrap()),
            tbon_rc::TBON_OK
        );
        assert_eq!(tbon_start(cfg, 0, 1, null(), &mut d), tbon_rc::TBON_OK);
        assert_eq!(tbon_wait_wired(d, 10_000), tbon_rc::TBON_OK);
        assert_eq!(tbon_shutdown(d), tbon_rc::TBON_OK);
    }
    use tbon_rc::*;
    // What tbon.h promises for a stopped daemon's handle.
    let answers_anyway = [
        "contact_uri",
        "rank",
        "size",
        "wait_stopped",
        "stop_reason",
        "wait_wired", // it was wired before it stopped
        "client_socket_path",
    ];
    let stopping_again = ["shutdown", "shutdown_dvm", "abort"];
    let cleanup = [
        "cancel",
        "purge",
        "fetch_cancel",
        "forget_group",
        "client_job_close",
    ];
    let mut wrong = Vec::new();
    for (name, rc) in every_call(d) {
        let want = if [&answers_anyway[..], &stopping_again, &cleanup]
            .concat()
            .contains(&name)
        {
            TBON_OK
        } else {
            TBON_ERR_SHUT_DOWN
        };
        if rc != want {
            wrong.push(format!("{name}: {rc:?}, header says {want:?}"));
        }
    }
    assert_eq!(tbon_free(d), TBON_OK);
    for (name, rc) in every_call(d) {
        if rc != TBON_ERR_BAD_HANDLE {
            wrong.push(format!("after tbon_free, {name}: {rc:?}"));
        }
    }
    assert_eq!(tbon_free(d), TBON_ERR_BAD_HANDLE);
    assert_eq!(tbon_config_free(cfg), TBON_OK);
    let _ = std::fs::remove_file(&key);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
