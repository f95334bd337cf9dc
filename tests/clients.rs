//! Clients routed through their daemon (issue "Jobs") against live in-process DVMs on
//! loopback: clients on different daemons exchange messages in order; job isolation and an
//! embedder's `accept_from`; unknown and gone names; watches; a wrong key, an unknown job and
//! a foreign uid refused; a client that floods meets back-pressure; a daemon's death seen by
//! its clients and by those watching or sending to them.

mod common;

use common::{HANG_GUARD, loopback_config, start_dvm_with};
use std::sync::mpsc;
use std::time::Duration;
use tbon::clients::{ClientCredential, ClientMessage};
use tbon::{Client, ClientError, ClientName, Daemon, ExitReason};

const TAG: u32 = 200;

/// The test's folder (the daemons' sockets), removed at the end.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl std::ops::Deref for TempDir {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

fn dvm(size: u32, name: &str) -> (Vec<Daemon>, TempDir) {
    let dir = std::env::temp_dir().join(format!("tbon-clients-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.clone();
    let dvm = start_dvm_with(size, move |r| {
        let mut c = loopback_config(2);
        c.client_socket = Some(d.join(format!("d{r}.sock")).display().to_string());
        c
    });
    (dvm, TempDir(dir))
}

fn connect(cred: &ClientCredential) -> Client {
    Client::connect(&cred.socket, cred.job, &cred.key).expect("client admitted")
}

#[test]
fn clients_on_different_daemons_exchange_in_order_within_their_job() {
    let (dvm, _dir) = dvm(7, "order");
    let creds: Vec<ClientCredential> = dvm
        .iter()
        .map(|d| d.handle().client_job(1, &[]).unwrap())
        .collect();
    // Two clients on each of ranks 3, 5 and 6 (leaves in different subtrees) and rank 0.
    let ranks = [0usize, 3, 5, 6];
    let clients: Vec<Client> = ranks
        .iter()
        .flat_map(|&r| [connect(&creds[r]), connect(&creds[r])])
        .collect();
    let names: Vec<ClientName> = clients.iter().map(|c| c.name()).collect();
    for (c, &r) in clients.iter().zip(ranks.iter().flat_map(|r| [r, r])) {
        assert_eq!(c.name().rank as usize, r);
    }
    const N: u32 = 300;
    std::thread::scope(|s| {
        for c in &clients {
            let names = &names;
            s.spawn(move || {
                for i in 0..N {
                    for &to in names.iter().filter(|&&n| n != c.name()) {
                        c.send(to, TAG, i.to_le_bytes().to_vec(), |r| r.expect("delivered"))
                            .unwrap();
                    }
                }
                // Every message from each other client, in order.
                let mut next = std::collections::HashMap::new();
                for _ in 0..N * (names.len() as u32 - 1) {
                    let m = c
                        .recv(None, Some(TAG), Some(HANG_GUARD))
                        .expect("a message");
                    let i = u32::from_le_bytes(m.payload[..4].try_into().unwrap());
                    let n = next.entry(m.from).or_insert(0u32);
                    assert_eq!(i, *n, "from {} out of order", m.from);
                    *n += 1;
                }
                assert!(next.values().all(|&n| n == N));
            });
        }
    });
    for c in &clients {
        let deadline = std::time::Instant::now() + HANG_GUARD;
        while c.in_flight() > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(c.in_flight(), 0);
    }
    let delivered: u64 = dvm
        .iter()
        .map(|d| d.handle().counters().unwrap().clients.delivered)
        .sum();
    assert_eq!(delivered, u64::from(N) * 8 * 7);
}

#[test]
fn jobs_are_isolated_unless_the_receiver_accepts_and_names_are_checked() {
    let (dvm, _dir) = dvm(3, "jobs");
    let a1 = connect(&dvm[1].handle().client_job(1, &[]).unwrap());
    let b2 = connect(&dvm[2].handle().client_job(2, &[]).unwrap());
    // Job 3 on rank 2 accepts messages from job 1.
    let c2 = connect(&dvm[2].handle().client_job(3, &[1]).unwrap());
    let to_b = a1.send_wait(b2.name(), TAG, &b"x"[..], Some(HANG_GUARD));
    assert_eq!(to_b, Err(ClientError::NotPermitted(b2.name())));
    a1.send_wait(c2.name(), TAG, &b"hello"[..], Some(HANG_GUARD))
        .unwrap();
    let m = c2.recv(Some(a1.name()), None, Some(HANG_GUARD)).unwrap();
    assert_eq!(&m.payload[..], b"hello");
    // The largest payload a client may send crosses (its header fits the daemons' bound).
    let largest = vec![9u8; a1.msg_max_bytes()];
    a1.send_wait(c2.name(), TAG, largest, Some(HANG_GUARD))
        .unwrap();
    let m = c2.recv(Some(a1.name()), None, Some(HANG_GUARD)).unwrap();
    assert_eq!(m.payload.len(), a1.msg_max_bytes());
    // A receive naming the sender wins over one for any sender, whatever the order posted.
    let (any_tx, any_rx) = mpsc::channel();
    let (named_tx, named_rx) = mpsc::channel();
    let any = c2
        .recv_cb(None, Some(TAG + 1), false, move |m| any_tx.send(m).unwrap())
        .unwrap();
    c2.recv_cb(Some(a1.name()), Some(TAG + 1), false, move |m| {
        named_tx.send(m).unwrap()
    })
    .unwrap();
    a1.send_wait(
        c2.name(),
        TAG + 1,
        &b"to the named one"[..],
        Some(HANG_GUARD),
    )
    .unwrap();
    assert_eq!(named_rx.recv_timeout(HANG_GUARD).unwrap().from, a1.name());
    assert!(any_rx.try_recv().is_err());
    assert!(c2.cancel(any));
    // Not the other way round: job 1 does not accept job 3.
    assert_eq!(
        c2.send_wait(a1.name(), TAG, &b"back"[..], Some(HANG_GUARD)),
        Err(ClientError::NotPermitted(a1.name()))
    );
    // Unknown names: a local id never given, a rank outside the DVM.
    let nobody = ClientName {
        rank: 2,
        local: 999,
    };
    assert_eq!(
        a1.send_wait(nobody, TAG, &b"?"[..], Some(HANG_GUARD)),
        Err(ClientError::UnknownClient(nobody))
    );
    let outside = ClientName { rank: 9, local: 1 };
    assert_eq!(
        a1.send_wait(outside, TAG, &b"?"[..], Some(HANG_GUARD)),
        Err(ClientError::UnknownClient(outside))
    );
    // Argument errors at once.
    assert_eq!(
        a1.send_wait(c2.name(), 5, &b"?"[..], None),
        Err(ClientError::ReservedTag(5))
    );
    let big = vec![0u8; a1.msg_max_bytes() + 1];
    assert!(matches!(
        a1.send_wait(c2.name(), TAG, big, None),
        Err(ClientError::TooLarge { .. })
    ));
    // A client that exited: gone, and its watchers are told.
    let (tx, rx) = mpsc::channel();
    let gone = c2.name();
    a1.watch(gone, move |n, why| tx.send((n, why)).unwrap())
        .unwrap();
    drop(c2);
    assert_eq!(
        rx.recv_timeout(HANG_GUARD).unwrap(),
        (gone, ExitReason::Exited)
    );
    assert_eq!(
        a1.send_wait(gone, TAG, &b"late"[..], Some(HANG_GUARD)),
        Err(ClientError::ClientGone(gone))
    );
    // Watching a name that is not alive answers at once.
    let (tx, rx) = mpsc::channel();
    a1.watch(nobody, move |n, why| tx.send((n, why)).unwrap())
        .unwrap();
    assert_eq!(
        rx.recv_timeout(HANG_GUARD).unwrap(),
        (nobody, ExitReason::Unknown)
    );
    let counters = dvm[2].handle().counters().unwrap().clients;
    assert_eq!(counters.live, 1);
    assert!(counters.rejected >= 3, "{counters:?}");
}

#[test]
fn wrong_credentials_are_refused_and_the_daemon_keeps_serving() {
    let (dvm, dir) = dvm(2, "refused");
    let cred = dvm[1].handle().client_job(7, &[]).unwrap();
    let mut wrong = cred.key;
    wrong[0] ^= 1;
    let e = Client::connect(&cred.socket, 7, &wrong).unwrap_err();
    assert!(
        matches!(&e, ClientError::Refused(r) if r.contains("wrong client key")),
        "{e}"
    );
    let e = Client::connect(&cred.socket, 8, &cred.key).unwrap_err();
    assert!(
        matches!(&e, ClientError::Refused(r) if r.contains("not open")),
        "{e}"
    );
    // Garbage instead of a Hello: closed, counted.
    {
        use std::io::{Read, Write};
        let mut s = std::os::unix::net::UnixStream::connect(&cred.socket).unwrap();
        s.write_all(&[0xff; 64]).unwrap();
        let mut buf = Vec::new();
        s.set_read_timeout(Some(HANG_GUARD)).unwrap();
        let _ = s.read_to_end(&mut buf);
    }
    // A daemon that admits only another uid refuses this process.
    let only_other = {
        let mut c = loopback_config(2);
        c.client_socket = Some(dir.join("other.sock").display().to_string());
        c.client_uids = vec![(nix_uid() + 1).to_string()];
        c.insecure = false;
        c
    };
    let solo = tbon::start(only_other, 0, 1, None).unwrap();
    let cred_solo = solo.handle().client_job(1, &[]).unwrap();
    let e = Client::connect(&cred_solo.socket, 1, &cred_solo.key).unwrap_err();
    assert!(
        matches!(&e, ClientError::Refused(r) if r.contains("uid")),
        "{e}"
    );
    // The right one is still admitted.
    let ok = connect(&cred);
    assert_eq!(ok.name().rank, 1);
    let c = dvm[1].handle().counters().unwrap().clients;
    assert_eq!(c.refused, 3, "wrong key, unknown job, garbage: {c:?}");
    assert!(dvm[1].handle().counters().unwrap().protocol_errors >= 1);
    // A second daemon on the same socket is refused while the first listens there, and the
    // first keeps its socket.
    let mut same = loopback_config(2);
    same.client_socket = Some(cred.socket.display().to_string());
    let Err(e) = tbon::start(same, 0, 1, None) else {
        panic!("a socket in use must be refused");
    };
    assert!(e.to_string().contains("in use"), "{e}");
    assert_eq!(connect(&cred).name().rank, 1);
    // A daemon without a client socket makes no credential.
    let plain = tbon::start(loopback_config(2), 0, 1, None).unwrap();
    assert_eq!(
        plain.handle().client_job(1, &[]).unwrap_err(),
        ClientError::NoSocket
    );
}

fn nix_uid() -> u32 {
    // The uid of this process, as the daemon reads it from the socket.
    std::fs::metadata("/proc/self")
        .map(|m| {
            use std::os::unix::fs::MetadataExt;
            m.uid()
        })
        .unwrap()
}

#[test]
fn a_flooding_client_meets_back_pressure_and_a_slow_reader_loses_nothing() {
    let (dvm, _dir) = dvm(3, "flood");
    let cred1 = dvm[1].handle().client_job(1, &[]).unwrap();
    let cred2 = dvm[2].handle().client_job(1, &[]).unwrap();
    let fast = connect(&cred1);
    let slow = connect(&cred2);
    // try_send refuses Busy once the bound of unanswered sends is reached, while the
    // receiver reads nothing.
    let payload = vec![7u8; 64 * 1024];
    let mut sent = 0u32;
    let mut busy = false;
    for _ in 0..5_000 {
        match fast.try_send(slow.name(), TAG, payload.clone(), |r| r.expect("delivered")) {
            Ok(()) => sent += 1,
            Err(ClientError::Busy) => {
                busy = true;
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(busy, "no back-pressure after {sent} sends");
    assert!(fast.in_flight() <= tbon::limits::CLIENT_SENDS_INFLIGHT_MAX);
    // A waiting send's timeout covers the wait for room (then nothing is sent). Room comes
    // back while the receiver's daemon still queues for it: fill again until it stops.
    let mut timed_out = false;
    for _ in 0..50 {
        while fast
            .try_send(slow.name(), TAG, payload.clone(), |r| r.expect("delivered"))
            .is_ok()
        {
            sent += 1;
        }
        match fast.send_wait(
            slow.name(),
            TAG,
            payload.clone(),
            Some(Duration::from_millis(50)),
        ) {
            Err(ClientError::TimedOut) => {
                timed_out = true;
                break;
            }
            Ok(()) => sent += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(timed_out, "room never ran out");
    // The reader then takes everything, in order and once.
    let (tx, rx) = mpsc::channel::<ClientMessage>();
    slow.recv_cb(Some(fast.name()), Some(TAG), true, move |m| {
        tx.send(m).unwrap();
    })
    .unwrap();
    for got in 0..sent {
        let Ok(m) = rx.recv_timeout(HANG_GUARD) else {
            // Say where the rest stopped: the daemons' counters and links.
            let seen: Vec<String> = dvm
                .iter()
                .map(|d| format!("{:#?}", d.handle().counters()))
                .collect();
            panic!(
                "every message: {got} of {sent} arrived, {} in flight at the sender; {}",
                fast.in_flight(),
                seen.join("\n")
            );
        };
        assert_eq!(m.payload.len(), payload.len());
    }
    // The send that timed out may have gone (if it waited for its result, not for room).
    if let Ok(m) = rx.recv_timeout(Duration::from_millis(500)) {
        assert_eq!(m.payload.len(), payload.len());
    }
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
}

#[test]
fn a_receive_posted_while_the_reader_waits_for_room_gets_the_message_it_waits_with() {
    // The receiver's library holds CLIENT_UNMATCHED_MAX messages and its reader waits with
    // one more for room. A receive posted then must get that one too, in its place: it was
    // once held behind the receive, where nothing would ever take it.
    let (dvm, _dir) = dvm(2, "room");
    let cred = dvm[1].handle().client_job(1, &[]).unwrap();
    let (sender, reader) = (connect(&cred), connect(&cred));
    let total = tbon::limits::CLIENT_UNMATCHED_MAX + 1;
    for i in 0..total {
        let n = u32::try_from(i).unwrap();
        sender
            .send(reader.name(), TAG, n.to_le_bytes().to_vec(), |r| {
                r.expect("queued for the reader")
            })
            .unwrap();
    }
    // Every message is queued for the reader once the daemon delivered them all; the reader
    // then takes the last one from its socket and waits for room with it.
    let deadline = std::time::Instant::now() + HANG_GUARD;
    while dvm[1].handle().counters().unwrap().clients.delivered < total as u64 {
        assert!(std::time::Instant::now() < deadline, "never delivered");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let (tx, rx) = mpsc::channel::<ClientMessage>();
    reader
        .recv_cb(Some(sender.name()), Some(TAG), true, move |m| {
            tx.send(m).unwrap();
        })
        .unwrap();
    for i in 0..total {
        let m = rx
            .recv_timeout(HANG_GUARD)
            .unwrap_or_else(|_| panic!("message {i} of {total} never came"));
        let n = u32::try_from(i).unwrap();
        assert_eq!(&m.payload[..], &n.to_le_bytes()[..], "in order");
    }
}

#[test]
fn a_daemons_death_reaches_its_clients_and_those_that_watch_or_send() {
    let (dvm, _dir) = dvm(5, "death");
    let cred3 = dvm[3].handle().client_job(1, &[]).unwrap();
    let cred4 = dvm[4].handle().client_job(1, &[]).unwrap();
    let victim = connect(&cred3);
    let watcher = connect(&cred4);
    let (tx, rx) = mpsc::channel();
    victim.on_daemon_lost(move |why| tx.send(why.to_string()).unwrap());
    let (wtx, wrx) = mpsc::channel();
    let vname = victim.name();
    watcher
        .watch(vname, move |n, why| wtx.send((n, why)).unwrap())
        .unwrap();
    watcher
        .send_wait(vname, TAG, &b"before"[..], Some(HANG_GUARD))
        .unwrap();
    dvm[3].handle().abort();
    let why = rx
        .recv_timeout(HANG_GUARD)
        .expect("the client learns its daemon died");
    assert!(!why.is_empty());
    assert!(victim.daemon_lost().is_some());
    assert_eq!(
        victim.send_wait(watcher.name(), TAG, &b"x"[..], None),
        Err(ClientError::DaemonLost)
    );
    assert_eq!(
        victim.recv_cb(None, None, true, |_| {}).unwrap_err(),
        ClientError::DaemonLost
    );
    // Once the DVM has repaired around rank 3, the watcher is told and sends fail NodeDown.
    assert_eq!(
        wrx.recv_timeout(HANG_GUARD).unwrap(),
        (vname, ExitReason::DaemonDied)
    );
    assert_eq!(
        watcher.send_wait(vname, TAG, &b"after"[..], Some(HANG_GUARD)),
        Err(ClientError::NodeDown(3))
    );
}

#[test]
fn shutdown_from_another_thread_ends_blocked_calls_and_a_closed_job_keeps_its_clients() {
    let (dvm, _dir) = dvm(2, "shutdown");
    let h = dvm[1].handle();
    assert_eq!(h.client_socket(), Some(_dir.join("d1.sock").as_path()));
    let cred5 = h.client_job(5, &[6]).unwrap();
    let receiver = connect(&cred5);
    let other = connect(&h.client_job(6, &[]).unwrap());
    // Closed: no new client of job 5, but its receiver still accepts job 6.
    h.client_job_close(5).unwrap();
    let e = Client::connect(&cred5.socket, 5, &cred5.key).unwrap_err();
    assert!(
        matches!(&e, ClientError::Refused(r) if r.contains("not open")),
        "{e}"
    );
    other
        .send_wait(receiver.name(), TAG, &b"still"[..], Some(HANG_GUARD))
        .unwrap();
    assert_eq!(
        &receiver.recv(None, None, Some(HANG_GUARD)).unwrap().payload[..],
        b"still"
    );
    // A receive blocked for ever ends when another thread shuts the client down.
    std::thread::scope(|s| {
        let blocked = s.spawn(|| receiver.recv(None, Some(TAG), None));
        std::thread::sleep(Duration::from_millis(100));
        receiver.shutdown();
        assert_eq!(blocked.join().unwrap(), Err(ClientError::DaemonLost));
    });
    assert_eq!(
        receiver.send_wait(other.name(), TAG, &b"x"[..], None),
        Err(ClientError::DaemonLost)
    );
    // Its daemon forgets it: the other's next send says it is gone.
    let name = receiver.name();
    let (tx, rx) = mpsc::channel();
    other
        .watch(name, move |n, why| tx.send((n, why)).unwrap())
        .unwrap();
    assert_eq!(
        rx.recv_timeout(HANG_GUARD).unwrap(),
        (name, ExitReason::Exited)
    );
}

#[test]
fn a_local_dvm_gives_each_daemon_its_own_client_socket() {
    let dir =
        TempDir(std::env::temp_dir().join(format!("tbon-clients-{}-local", std::process::id())));
    std::fs::create_dir_all(&*dir).unwrap();
    let mut cfg = loopback_config(2);
    cfg.client_socket = Some(dir.join("c.sock").display().to_string());
    let dvm = tbon::launch::local_dvm(cfg, 3).unwrap();
    let a = connect(&dvm[0].handle().client_job(1, &[]).unwrap());
    let b = connect(&dvm[2].handle().client_job(1, &[]).unwrap());
    assert_eq!(
        dvm[2].handle().client_socket(),
        Some(dir.join("c.sock.2").as_path())
    );
    assert_eq!((a.name().rank, b.name().rank), (0, 2));
    a.send_wait(b.name(), TAG, &b"hi"[..], Some(HANG_GUARD))
        .unwrap();
    assert_eq!(
        &b.recv(None, None, Some(HANG_GUARD)).unwrap().payload[..],
        b"hi"
    );
}

#[test]
fn ending_a_job_disconnects_its_clients_and_tells_their_watchers() {
    let (dvm, _dir) = dvm(2, "end");
    let h = dvm[1].handle();
    let member = connect(&h.client_job(8, &[]).unwrap());
    let watcher = connect(&h.client_job(9, &[]).unwrap());
    let bystander = connect(&h.client_job(8, &[]).unwrap());
    drop(bystander);
    let (tx, rx) = mpsc::channel();
    let name = member.name();
    watcher
        .watch(name, move |n, why| tx.send((n, why)).unwrap())
        .unwrap();
    let (lost_tx, lost_rx) = mpsc::channel();
    member.on_daemon_lost(move |why| lost_tx.send(why.to_string()).unwrap());
    h.client_job_end(8).unwrap();
    let why = lost_rx.recv_timeout(HANG_GUARD).unwrap();
    assert!(why.contains("job 8 ended"), "{why}");
    assert_eq!(
        rx.recv_timeout(HANG_GUARD).unwrap(),
        (name, ExitReason::Exited)
    );
    assert_eq!(
        watcher.send_wait(name, TAG, &b"x"[..], Some(HANG_GUARD)),
        Err(ClientError::ClientGone(name))
    );
    let c = h.counters().unwrap().clients;
    assert_eq!(c.live, 1, "only the watcher: {c:?}");
}

/// From an outside-in review: connections of a user who may not be a client held places among
/// those awaiting admission until their `Hello` (or the handshake timeout), so a flood of them
/// evicted real clients' connections. A daemon knows the uid when it accepts (`SO_PEERCRED`)
/// and now refuses another user's connection at once: each is closed with the reason without
/// waiting for anything, however many there are.
#[test]
fn another_users_connections_are_refused_as_they_are_accepted() {
    use std::io::Read;
    let dir = std::env::temp_dir().join(format!("tbon-clients-{}-foreign", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let _dir = TempDir(dir.clone());
    let mut c = loopback_config(2);
    c.client_socket = Some(dir.join("d.sock").display().to_string());
    c.client_uids = vec![(nix_uid() + 1).to_string()];
    // Before, a silent connection was closed only after this long.
    c.handshake_timeout_ms = 600_000;
    let d = tbon::start(c, 0, 1, None).unwrap();
    let cred = d.handle().client_job(1, &[]).unwrap();
    let silent: Vec<_> = (0..tbon::limits::CLIENT_PENDING_MAX + 16)
        .map(|_| std::os::unix::net::UnixStream::connect(&cred.socket).unwrap())
        .collect();
    for mut s in silent {
        s.set_read_timeout(Some(HANG_GUARD)).unwrap();
        let mut refusal = Vec::new();
        s.read_to_end(&mut refusal)
            .expect("closed by the daemon, not left waiting");
        assert!(
            String::from_utf8_lossy(&refusal).contains("not among client_uids"),
            "{refusal:?}"
        );
    }
    let c = d.handle().counters().unwrap().clients;
    assert_eq!(c.refused, tbon::limits::CLIENT_PENDING_MAX as u64 + 16);
    // A job's accept_from list has its bound too.
    let max = tbon::limits::CLIENT_ACCEPT_FROM_MAX;
    assert_eq!(
        d.handle().client_job(2, &vec![1; max + 1]).unwrap_err(),
        ClientError::TooLarge { len: max + 1, max }
    );
    assert!(d.handle().client_job(2, &vec![1; max]).is_ok());
}
