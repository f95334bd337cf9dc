//! The messaging core end to end on real loopback sockets: wire-up, routing and relaying,
//! receive matching, size limits and shutdown. No timing assertions: timeouts only guard
//! against hangs.

mod common;

use bytes::Bytes;
use common::{HANG_GUARD, loopback_config, start_dvm, start_dvm_with};
use crossbeam_channel::{Receiver, Sender, unbounded};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tbon::{Peer, RecvError, SendError};

const TAG: u32 = 100;

/// Every daemon sends one tagged message to every other; each arrives once, intact.
fn all_to_all(size: u32, radix: u32) {
    let dvm = start_dvm(size, &loopback_config(radix));
    let (tx, rx) = unbounded();
    for d in &dvm {
        let tx = tx.clone();
        let me = d.rank();
        d.recv(Peer::Any, TAG, tbon::RecvMode::Persistent, move |m| {
            tx.send((me, m)).unwrap();
        })
        .unwrap();
    }
    for d in &dvm {
        for dst in 0..size {
            if dst != d.rank() {
                let body = format!("{} -> {dst}", d.rank());
                d.send(dst, TAG, Bytes::from(body)).unwrap();
            }
        }
    }
    let expected = (size * (size - 1)) as usize;
    let mut seen = HashMap::new();
    for _ in 0..expected {
        let (me, m) = rx.recv_timeout(HANG_GUARD).expect("a message went missing");
        assert_eq!(m.tag, TAG);
        assert_eq!(m.payload, Bytes::from(format!("{} -> {me}", m.origin)));
        *seen.entry((m.origin, me)).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), expected);
    assert!(seen.values().all(|n| *n == 1));
    // Nothing extra arrives (no duplicates): the last of the expected messages was delivered, and
    // a probe sent after it on every path comes in order behind anything still in flight.
    let relayed: u64 = dvm.iter().map(|d| d.counters().unwrap().relayed).sum();
    assert!(relayed > 0, "a tree of {size} at radix {radix} must relay");
    drop(dvm);
    assert!(rx.try_recv().is_err(), "a duplicate arrived");
}

#[test]
fn all_to_all_32_daemons_radix_2() {
    all_to_all(32, 2);
}

#[test]
fn all_to_all_32_daemons_radix_64() {
    all_to_all(32, 64);
}

#[test]
fn fifty_mib_crosses_relays_with_tiny_socket_buffers() {
    // Radix 2, 8 daemons: 7 -> 3 -> 1 -> 0 -> 2 -> 6 has four relays.
    let mut cfg = loopback_config(2);
    cfg.socket_buffer_bytes = 64 * 1024;
    let dvm = start_dvm(8, &cfg);
    let big: Vec<u8> = (0..50 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let big = Bytes::from(big);
    let (tx, rx) = unbounded();
    dvm[6]
        .recv(Peer::Rank(7), TAG, tbon::RecvMode::Once, move |m| {
            tx.send(m).unwrap()
        })
        .unwrap();
    dvm[7].send_wait(6, TAG, big.clone()).unwrap();
    let m = rx
        .recv_timeout(HANG_GUARD)
        .expect("the big message did not arrive");
    assert_eq!(m.origin, 7);
    assert!(m.payload == big, "payload corrupted");
    for r in [3, 1, 0, 2] {
        assert_eq!(
            dvm[r].counters().unwrap().relayed,
            1,
            "rank {r} relays once"
        );
    }
}

#[test]
fn specific_receive_wins_over_wildcard_and_one_shot_retires() {
    let dvm = start_dvm(3, &loopback_config(2));
    let (tx, rx) = unbounded();
    let t1 = tx.clone();
    dvm[0]
        .recv(Peer::Any, TAG, tbon::RecvMode::Persistent, move |m| {
            t1.send(("any", m)).unwrap()
        })
        .unwrap();
    let t2 = tx.clone();
    dvm[0]
        .recv(Peer::Rank(2), TAG, tbon::RecvMode::Once, move |m| {
            t2.send(("two", m)).unwrap()
        })
        .unwrap();
    dvm[2].send_wait(0, TAG, "first").unwrap();
    let (who, m) = rx.recv_timeout(HANG_GUARD).unwrap();
    assert_eq!((who, m.origin, &m.payload[..]), ("two", 2, &b"first"[..]));
    // The one-shot receive is gone: the next one from rank 2 goes to the wildcard.
    dvm[2].send_wait(0, TAG, "second").unwrap();
    let (who, m) = rx.recv_timeout(HANG_GUARD).unwrap();
    assert_eq!((who, &m.payload[..]), ("any", &b"second"[..]));
    // And it may be posted again now that it retired.
    let t3 = tx.clone();
    dvm[0]
        .recv(Peer::Rank(2), TAG, tbon::RecvMode::Once, move |m| {
            t3.send(("two", m)).unwrap()
        })
        .unwrap();
    dvm[1].send_wait(0, TAG, "from one").unwrap();
    let (who, m) = rx.recv_timeout(HANG_GUARD).unwrap();
    assert_eq!((who, m.origin), ("any", 1));
}

#[test]
fn unmatched_messages_wait_for_a_receive() {
    let dvm = start_dvm(2, &loopback_config(64));
    for i in 0..5u8 {
        dvm[1].send_wait(0, TAG + 1, vec![i]).unwrap();
    }
    // A self-send is matched the same way, so once it arrives the five are held too
    // (rank 1 -> rank 0 is one FIFO link).
    dvm[1].send_wait(0, TAG + 2, "marker").unwrap();
    let m = dvm[0]
        .recv_blocking(Peer::Rank(1), TAG + 2, HANG_GUARD)
        .unwrap();
    assert_eq!(&m.payload[..], b"marker");
    // A one-shot takes the first held message...
    let first = dvm[0]
        .recv_blocking(Peer::Any, TAG + 1, HANG_GUARD)
        .unwrap();
    assert_eq!(&first.payload[..], &[0]);
    // ...a persistent receive takes all the rest, in arrival order.
    let (tx, rx) = unbounded();
    dvm[0]
        .recv(
            Peer::Rank(1),
            TAG + 1,
            tbon::RecvMode::Persistent,
            move |m| tx.send(m.payload[0]).unwrap(),
        )
        .unwrap();
    let got: Vec<u8> = (0..4)
        .map(|_| rx.recv_timeout(HANG_GUARD).unwrap())
        .collect();
    assert_eq!(got, vec![1, 2, 3, 4]);
}

#[test]
fn api_misuse_is_an_error_not_a_crash() {
    let mut cfg = loopback_config(64);
    cfg.msg_max_bytes = 1024;
    let dvm = start_dvm(2, &cfg);
    let d = &dvm[0];
    assert_eq!(d.send(1, 5, "x"), Err(SendError::ReservedTag(5)));
    assert_eq!(
        d.send(2, TAG, "x"),
        Err(SendError::RankOutOfRange { rank: 2, size: 2 })
    );
    assert_eq!(
        d.send(1, TAG, vec![0u8; 1025]),
        Err(SendError::TooLarge {
            len: 1025,
            max: 1024
        })
    );
    d.recv(Peer::Any, TAG, tbon::RecvMode::Persistent, |_| {})
        .unwrap();
    assert_eq!(
        d.recv(Peer::Any, TAG, tbon::RecvMode::Once, |_| {}),
        Err(RecvError::Duplicate)
    );
    assert_eq!(
        d.recv(Peer::Any, 1, tbon::RecvMode::Once, |_| {}),
        Err(RecvError::ReservedTag(1))
    );
    assert_eq!(
        d.recv(Peer::Rank(9), TAG, tbon::RecvMode::Once, |_| {}),
        Err(RecvError::RankOutOfRange { rank: 9, size: 2 })
    );
    // Cancel, then the same (peer, tag) may be posted again.
    d.cancel(Peer::Any, TAG);
    d.recv(Peer::Any, TAG, tbon::RecvMode::Persistent, |_| {})
        .unwrap();
}

/// Every blocking call made from a callback (on the loop thread it would wait for) answers
/// at once with an error, or, for the state waits, with the state now; the daemon goes on.
#[test]
fn blocking_calls_from_a_callback_answer_at_once_instead_of_wedging_the_daemon() {
    let dvm = start_dvm(3, &loopback_config(2));
    let (tx, rx) = unbounded();
    let h = dvm[1].handle();
    dvm[1]
        .recv(Peer::Rank(0), TAG, tbon::RecvMode::Once, move |_| {
            let long = Duration::from_secs(3600);
            let started = Instant::now();
            let outcomes = (
                h.send_wait(2, TAG, Bytes::from_static(b"x")),
                h.send_reliable_wait(2, TAG, Bytes::from_static(b"x"), long),
                h.barrier_wait(7, long).map(|_| ()),
                h.recv_blocking(Peer::Rank(2), TAG + 1, long).map(|_| ()),
                h.wait_wired(long),
                h.wait_stopped(long),
                h.counters().map(|_| ()),
            );
            tx.send((outcomes, started.elapsed())).unwrap();
        })
        .unwrap();
    dvm[0].send(1, TAG, Bytes::from_static(b"go")).unwrap();
    let ((send, reliable, barrier, recv, wired, stopped, counters), took) = rx
        .recv_timeout(HANG_GUARD)
        .expect("the callback ran and returned");
    let busy = Err(SendError::Busy(tbon::Limit::LoopThread));
    assert_eq!(send, busy);
    assert_eq!(reliable, busy);
    assert_eq!(barrier, busy);
    assert_eq!(counters, busy);
    assert_eq!(recv, Err(RecvError::InCallback));
    assert!(wired, "wired already: answered without waiting");
    assert_eq!(stopped, None, "running: answered without waiting");
    assert!(took < HANG_GUARD, "{took:?}");
    // The daemon still works: a blocking send from this thread completes.
    dvm[1]
        .send_wait(2, TAG + 2, Bytes::from_static(b"after"))
        .unwrap();
}

/// A program that holds its key (here a generated one) gives it in `Config::key`: no key
/// file, no environment.
#[test]
fn a_dvm_forms_with_a_key_given_in_the_config() {
    let mut cfg = loopback_config(2);
    cfg.key_file = None;
    cfg.key = Some(tbon::Key::generate().unwrap());
    let dvm = start_dvm(3, &cfg);
    let (tx, rx) = unbounded();
    dvm[2]
        .recv(Peer::Rank(0), TAG, tbon::RecvMode::Once, move |m| {
            tx.send(m).unwrap()
        })
        .unwrap();
    dvm[0].send(2, TAG, Bytes::from_static(b"keyed")).unwrap();
    assert_eq!(rx.recv_timeout(HANG_GUARD).unwrap().payload, "keyed");
}

/// Before wire-up, sends to other daemons wait in a bounded queue: one beyond the bound is
/// refused to the caller (`Busy`), never accepted and dropped later.
#[test]
fn sends_beyond_the_pre_wire_up_queue_are_refused_to_the_caller() {
    let mut cfg = loopback_config(2);
    cfg.prewire_queue_max = 3;
    // Rank 1 never starts: rank 0 stays unwired.
    let d = tbon::start(cfg, 0, 2, None).unwrap();
    for i in 0..3u8 {
        d.send(1, TAG, Bytes::from(vec![i])).unwrap();
    }
    let busy = Err(SendError::Busy(tbon::Limit::PrewireQueue));
    assert_eq!(d.send(1, TAG, Bytes::from_static(b"4th")), busy);
    assert_eq!(d.broadcast(TAG, Bytes::from_static(b"b")), busy);
    let mut batch = tbon::Batch::new();
    batch.push(1, TAG, Bytes::from_static(b"x")).unwrap();
    assert_eq!(d.send_batch(&mut batch), busy);
    assert_eq!(batch.len(), 1, "the refused message stays the caller's");
    // A send to itself needs no wire-up.
    let (tx, rx) = unbounded();
    d.recv(Peer::Rank(0), TAG, tbon::RecvMode::Once, move |m| {
        tx.send(m).unwrap()
    })
    .unwrap();
    d.send(0, TAG, Bytes::from_static(b"me")).unwrap();
    assert_eq!(rx.recv_timeout(HANG_GUARD).unwrap().payload, "me");
}

#[test]
fn self_send_goes_through_matching_asynchronously() {
    let dvm = start_dvm(1, &loopback_config(64));
    let d = &dvm[0];
    d.send_wait(0, TAG, "to myself").unwrap();
    let m = d.recv_blocking(Peer::Rank(0), TAG, HANG_GUARD).unwrap();
    assert_eq!((m.origin, &m.payload[..]), (0, &b"to myself"[..]));
}

#[test]
fn cancelled_receive_gets_nothing_and_purge_drops_held() {
    let dvm = start_dvm(2, &loopback_config(64));
    let (tx, rx) = unbounded();
    dvm[0]
        .recv(Peer::Rank(1), TAG, tbon::RecvMode::Persistent, move |m| {
            tx.send(m).unwrap()
        })
        .unwrap();
    dvm[0].cancel(Peer::Rank(1), TAG);
    dvm[1].send_wait(0, TAG, "held").unwrap();
    // A marker on the same link proves "held" arrived before we look.
    dvm[1].send_wait(0, TAG + 1, "marker").unwrap();
    dvm[0]
        .recv_blocking(Peer::Rank(1), TAG + 1, HANG_GUARD)
        .unwrap();
    assert!(rx.try_recv().is_err(), "a cancelled receive was called");
    dvm[0].purge(1);
    let got = dvm[0].recv_blocking(Peer::Rank(1), TAG, std::time::Duration::from_millis(200));
    assert_eq!(
        got.unwrap_err(),
        RecvError::TimedOut,
        "purge must drop held messages"
    );
}

#[test]
fn oversize_at_the_receiver_closes_only_that_connection() {
    // Rank 1 accepts at most 1 KiB; rank 0 (its parent) may send up to 1 MiB.
    let dvm = start_dvm_with(3, |r| {
        let mut c = loopback_config(64);
        c.msg_max_bytes = if r == 1 { 1024 } else { 1 << 20 };
        c
    });
    dvm[0].send_wait(1, TAG, vec![7u8; 4096]).unwrap();
    // Rank 1 keeps serving: a message from rank 2 (relayed by rank 0) arrives. Until rank 0
    // has noticed the closed connection, it may relay onto it and lose the message (a plain
    // send is not acknowledged end to end), so send until one arrives.
    let deadline = std::time::Instant::now() + HANG_GUARD;
    let m = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "rank 1 stopped serving"
        );
        dvm[2].send_wait(1, TAG, "still here").unwrap();
        if let Ok(m) = dvm[1].recv_blocking(Peer::Any, TAG, std::time::Duration::from_millis(500)) {
            break m;
        }
    };
    assert_eq!(&m.payload[..], b"still here");
    assert!(dvm[1].counters().unwrap().protocol_errors >= 1);
}

#[test]
fn broadcast_reaches_every_daemon_once() {
    let dvm = start_dvm(13, &loopback_config(3));
    let (tx, rx) = unbounded();
    for d in &dvm {
        let tx = tx.clone();
        let me = d.rank();
        d.recv(Peer::Any, TAG, tbon::RecvMode::Persistent, move |m| {
            tx.send((me, m)).unwrap()
        })
        .unwrap();
    }
    dvm[5].broadcast(TAG, "hello all").unwrap();
    let mut got: Vec<u32> = (0..13)
        .map(|_| {
            let (me, m) = rx.recv_timeout(HANG_GUARD).unwrap();
            assert_eq!((m.origin, &m.payload[..]), (5, &b"hello all"[..]));
            me
        })
        .collect();
    got.sort();
    assert_eq!(got, (0..13).collect::<Vec<_>>());
}

#[test]
fn sends_after_shutdown_fail_with_shut_down() {
    let dvm = start_dvm(2, &loopback_config(64));
    let h = dvm[1].handle();
    h.shutdown();
    assert_eq!(h.send(0, TAG, "late"), Err(SendError::ShutDown));
    assert!(h.is_stopped());
}

/// A receive on `tag` whose callback holds the loop thread until `release` says so (or the
/// hang guard passes); `entered` hears each time it starts holding. Lets a test queue commands
/// behind a message that the loop is in the middle of delivering.
fn gate(d: &tbon::Daemon, tag: u32) -> (Receiver<()>, Sender<()>) {
    let (entered_tx, entered_rx) = unbounded();
    let (release_tx, release_rx) = unbounded::<()>();
    d.recv(Peer::Any, tag, tbon::RecvMode::Persistent, move |_| {
        entered_tx.send(()).unwrap();
        let _ = release_rx.recv_timeout(HANG_GUARD);
    })
    .unwrap();
    (entered_rx, release_tx)
}

#[test]
fn recv_blocking_returns_a_message_matched_while_it_timed_out() {
    let dvm = start_dvm(1, &loopback_config(64));
    let d = &dvm[0];
    let (entered, release) = gate(d, TAG + 1);
    for round in 0..3u8 {
        // The loop holds in the gate's callback with our message queued behind it, so
        // `recv_blocking` times out (and cancels) while the message is about to be matched
        // by its receive.
        d.send(0, TAG + 1, "gate").unwrap();
        d.send(0, TAG, vec![round]).unwrap();
        entered.recv_timeout(HANG_GUARD).unwrap();
        let releaser = {
            let release = release.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                release.send(()).unwrap();
            })
        };
        let first = d.recv_blocking(Peer::Rank(0), TAG, Duration::from_millis(10));
        releaser.join().unwrap();
        // Either it matched before the cancel (returned now) or after it (then it is held for
        // the next receive); never swallowed.
        let m = match first {
            Ok(m) => m,
            Err(RecvError::TimedOut) => d
                .recv_blocking(Peer::Rank(0), TAG, HANG_GUARD)
                .expect("a message matched around recv_blocking's timeout was lost"),
            Err(e) => panic!("round {round}: {e}"),
        };
        assert_eq!(&m.payload[..], &[round]);
    }
}

#[test]
fn recv_blocking_with_short_timeouts_receives_every_message_once() {
    const N: u32 = 3_000;
    let dvm = start_dvm(2, &loopback_config(64));
    let sender = dvm[1].handle();
    let pacer = std::thread::spawn(move || {
        for i in 0..N {
            sender.send(0, TAG, i.to_le_bytes().to_vec()).unwrap();
            if i % 4 == 0 {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    });
    let mut seen = vec![0u32; N as usize];
    let mut got = 0;
    let deadline = Instant::now() + HANG_GUARD;
    while got < N {
        assert!(
            Instant::now() < deadline,
            "only {got} of {N} messages arrived: some were lost"
        );
        match dvm[0].recv_blocking(Peer::Rank(1), TAG, Duration::from_micros(30)) {
            Ok(m) => {
                let i = u32::from_le_bytes(m.payload[..].try_into().unwrap());
                seen[i as usize] += 1;
                got += 1;
            }
            Err(RecvError::TimedOut) => {}
            Err(e) => panic!("{e}"),
        }
    }
    pacer.join().unwrap();
    assert!(seen.iter().all(|&n| n == 1), "a message arrived twice");
}

#[test]
fn recv_blocking_timing_out_while_the_daemon_stops_returns() {
    let dvm = start_dvm(1, &loopback_config(64));
    let h = dvm[0].handle();
    let (entered, release) = gate(&dvm[0], TAG + 1);
    h.send(0, TAG + 1, "gate").unwrap();
    entered.recv_timeout(HANG_GUARD).unwrap();
    let waiter = {
        let h = h.clone();
        std::thread::spawn(move || h.recv_blocking(Peer::Any, TAG, Duration::from_millis(50)))
    };
    // Most likely the loop, once released, sees the waiter's receive, then the shutdown, then
    // the waiter's cancel (which then meets a stopping loop); any order must end the wait.
    std::thread::sleep(Duration::from_millis(20));
    let stopper = {
        let h = h.clone();
        std::thread::spawn(move || h.shutdown())
    };
    std::thread::sleep(Duration::from_millis(100));
    release.send(()).unwrap();
    let got = waiter.join().unwrap();
    assert!(
        matches!(got, Err(RecvError::TimedOut | RecvError::ShutDown)),
        "{got:?}"
    );
    stopper.join().unwrap();
}

#[test]
fn a_retired_one_shot_does_not_unregister_its_reposted_successor() {
    let dvm = start_dvm(1, &loopback_config(64));
    let d = &dvm[0];
    let (entered, release) = gate(d, TAG + 1);
    d.send(0, TAG, "held").unwrap();
    d.send(0, TAG + 1, "gate").unwrap();
    // Self-sends are matched in order: "held" waits in the unmatched list now.
    entered.recv_timeout(HANG_GUARD).unwrap();
    // While the loop holds, post, cancel and post again. The loop then handles them in order:
    // the first post takes "held" and retires (it matched before the cancel), the cancel finds
    // nothing, the second post stands.
    let (tx, rx) = unbounded();
    let t1 = tx.clone();
    d.recv(Peer::Rank(0), TAG, tbon::RecvMode::Once, move |m| {
        t1.send(("first", m)).unwrap()
    })
    .unwrap();
    d.cancel(Peer::Rank(0), TAG);
    d.recv(Peer::Rank(0), TAG, tbon::RecvMode::Once, move |m| {
        tx.send(("second", m)).unwrap()
    })
    .unwrap();
    release.send(()).unwrap();
    // A round trip: the loop has handled the three commands.
    d.counters().unwrap();
    let (who, m) = rx.recv_timeout(HANG_GUARD).unwrap();
    assert_eq!((who, &m.payload[..]), ("first", &b"held"[..]));
    // The first post's retirement must not have unregistered the second.
    assert_eq!(
        d.recv(Peer::Rank(0), TAG, tbon::RecvMode::Once, |_| {}),
        Err(RecvError::Duplicate),
        "a third post was accepted while the second stands"
    );
    d.send(0, TAG, "next").unwrap();
    let (who, m) = rx.recv_timeout(HANG_GUARD).unwrap();
    assert_eq!((who, &m.payload[..]), ("second", &b"next"[..]));
}

/// `send_batch`: many small messages to several destinations (some relayed) arrive once each,
/// in order per destination, including a self-send; an argument error anywhere sends nothing;
/// a refused tail stays in the batch and goes when offered again.
#[test]
fn a_batch_arrives_in_order_and_a_bad_message_sends_none_of_it() {
    const PER_DST: u64 = 20_000;
    let dvm = start_dvm(6, &loopback_config(2));
    let (tx, rx) = unbounded();
    for d in &dvm {
        let tx = tx.clone();
        let me = d.rank();
        d.recv(Peer::Rank(1), TAG, tbon::RecvMode::Persistent, move |m| {
            tx.send((me, m)).unwrap();
        })
        .unwrap();
    }
    let sender = &dvm[1];
    let mut batch = tbon::Batch::new();
    batch.push(5, TAG, Bytes::from_static(b"x")).unwrap();
    batch.push(6, TAG, Bytes::from_static(b"x")).unwrap();
    assert!(matches!(
        sender.send_batch(&mut batch),
        Err(SendError::RankOutOfRange { rank: 6, .. })
    ));
    assert_eq!(batch.len(), 2, "an argument error sends nothing");
    batch.clear();
    let dsts = [0u32, 1, 2, 3, 5];
    let mut busy = 0u64;
    for i in 0..PER_DST {
        for &dst in &dsts {
            if batch.len() == tbon::limits::SEND_BATCH_MAX {
                while let Err(e) = sender.send_batch(&mut batch) {
                    assert!(matches!(e, SendError::Busy(_)), "{e}");
                    busy += 1;
                    std::thread::sleep(Duration::from_micros(200));
                }
                assert!(batch.is_empty());
            }
            batch
                .push(dst, TAG, Bytes::from(i.to_be_bytes().to_vec()))
                .unwrap();
        }
    }
    while sender.send_batch(&mut batch).is_err() {
        std::thread::sleep(Duration::from_micros(200));
    }
    let mut next: HashMap<u32, u64> = HashMap::new();
    for _ in 0..PER_DST * dsts.len() as u64 {
        let (me, m) = rx
            .recv_timeout(HANG_GUARD)
            .expect("a batched message went missing");
        let n = u64::from_be_bytes(m.payload[..].try_into().unwrap());
        let want = next.entry(me).or_insert(0);
        assert_eq!(n, *want, "rank {me}: out of order");
        *want += 1;
    }
    assert!(next.values().all(|&n| n == PER_DST));
    assert_eq!(sender.counters().unwrap().sent, PER_DST * dsts.len() as u64);
    eprintln!("busy retries: {busy}");
}

/// Runs of small messages to one destination travel as batch frames (one frame for many
/// messages, relayed as one): every message arrives once, in order per destination, with its
/// own tag and bytes, to a `recv` or a `recv_ref` receive, whatever sits between the runs (a message to the sender itself, one too
/// large to pack, another destination). The relays forward fewer frames than messages.
#[test]
fn batched_runs_arrive_whole_and_in_order_through_relays() {
    const ROUNDS: u64 = 60;
    // Radix 2 over 4 daemons: 3's parent is 1, so 3 -> 2 goes 3, 1, 0, 2 (two relays).
    let dvm = start_dvm(4, &loopback_config(2));
    let (tx, rx) = unbounded();
    for d in &dvm {
        let (tx2, me) = (tx.clone(), d.rank());
        d.recv(Peer::Rank(3), TAG, tbon::RecvMode::Persistent, move |m| {
            tx2.send((me, m)).unwrap();
        })
        .unwrap();
        // The other tag's messages are lent to their callback (`recv_ref`), which keeps them.
        let tx2 = tx.clone();
        d.recv_ref(
            Peer::Rank(3),
            TAG + 1,
            tbon::RecvMode::Persistent,
            move |m| {
                tx2.send((me, m.to_message())).unwrap();
            },
        )
        .unwrap();
    }
    // Payload: the message's number in its destination's sequence, padded to `len`.
    let payload = |n: u64, len: usize| {
        let mut v = n.to_be_bytes().to_vec();
        v.resize(len.max(8), (n % 251) as u8);
        Bytes::from(v)
    };
    let mut want: HashMap<u32, Vec<(u32, Bytes)>> = HashMap::new();
    let mut batch = tbon::Batch::new();
    let mut push = |batch: &mut tbon::Batch, dst: u32, tag: u32, len: usize| {
        let seq = want.entry(dst).or_default();
        let p = payload(seq.len() as u64, len);
        seq.push((tag, p.clone()));
        batch.push(dst, tag, p).unwrap();
    };
    let sender = &dvm[3];
    for r in 0..ROUNDS {
        // Runs of one tag within a batch frame reach a receive as one delivery.
        for i in 0..40 {
            push(&mut batch, 2, TAG + (i / 5 % 2), 8 + (i as usize * 7) % 200);
        }
        push(&mut batch, 3, TAG, 16);
        for i in 0..25 {
            let len = if i == 12 { 300 } else { 64 };
            push(&mut batch, 0, TAG + (i % 3 / 2), len);
        }
        if r % 5 == 0 {
            push(&mut batch, 2, TAG, 5000);
        }
        push(&mut batch, 1, TAG + 1, 64);
        while let Err(e) = sender.send_batch(&mut batch) {
            assert!(matches!(e, SendError::Busy(_)), "{e}");
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let total: usize = want.values().map(Vec::len).sum();
    let mut got: HashMap<u32, Vec<(u32, Bytes)>> = HashMap::new();
    for _ in 0..total {
        let (me, m) = rx
            .recv_timeout(HANG_GUARD)
            .expect("a batched message went missing");
        got.entry(me).or_default().push((m.tag, m.payload));
    }
    assert!(
        rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "a message arrived twice"
    );
    for (dst, seq) in &want {
        let g = got.get(dst).expect("messages for a destination");
        assert_eq!(g.len(), seq.len(), "rank {dst}");
        for (i, (w, g)) in seq.iter().zip(g).enumerate() {
            assert_eq!(w, g, "rank {dst}: message {i} out of order or changed");
        }
    }
    assert_eq!(sender.counters().unwrap().sent, total as u64);
    let to_2 = want[&2].len() as u64;
    for relay in [0usize, 1] {
        let relayed = dvm[relay].counters().unwrap().relayed;
        assert!(
            relayed < to_2 / 4,
            "rank {relay} relayed {relayed} frames for {to_2} messages: not batched"
        );
    }
}

/// A batch frame never exceeds the daemons' `msg_max_bytes` (a receiver closes a connection
/// that brings a larger frame): with a small maximum, runs of small messages go in several
/// small batches, and every message arrives with no connection refused.
#[test]
fn batch_frames_stay_within_a_small_message_maximum() {
    const N: u32 = 3_000;
    let cfg = tbon::config::Config {
        msg_max_bytes: 1_024,
        ..loopback_config(2)
    };
    // 3 -> 2 crosses two relays (radix 2 over 4 daemons).
    let dvm = start_dvm(4, &cfg);
    let (tx, rx) = unbounded();
    dvm[2]
        .recv(Peer::Rank(3), TAG, tbon::RecvMode::Persistent, move |m| {
            tx.send(m.payload).unwrap();
        })
        .unwrap();
    let mut batch = tbon::Batch::new();
    for i in 0..N {
        let mut p = i.to_be_bytes().to_vec();
        p.resize(64, 7);
        if batch.push(2, TAG, p.clone()).is_err() {
            while dvm[3].send_batch(&mut batch).is_err() {
                std::thread::sleep(Duration::from_micros(200));
            }
            batch.push(2, TAG, p).unwrap();
        }
    }
    while dvm[3].send_batch(&mut batch).is_err() {
        std::thread::sleep(Duration::from_micros(200));
    }
    for i in 0..N {
        let p = rx.recv_timeout(HANG_GUARD).expect("a message went missing");
        assert_eq!(u32::from_be_bytes(p[..4].try_into().unwrap()), i);
    }
    for d in &dvm {
        assert_eq!(
            d.counters().unwrap().protocol_errors,
            0,
            "rank {}",
            d.rank()
        );
    }
    assert!(dvm[0].counters().unwrap().relayed < u64::from(N) / 4);
}

/// From a callback the command channel does not block: `send_batch` says `Busy` once it is
/// full, and the refused messages are still in the batch (none lost), to be sent later.
#[test]
fn a_batch_refused_from_a_callback_keeps_its_messages() {
    let dvm = start_dvm(2, &loopback_config(2));
    let (tx, rx) = unbounded();
    let h = dvm[1].handle();
    dvm[1]
        .recv(Peer::Rank(0), TAG, tbon::RecvMode::Once, move |_| {
            let mut batch = tbon::Batch::new();
            let mut sent = 0u64;
            let kept = loop {
                batch.push(0, TAG + 1, Bytes::from_static(b"x")).unwrap();
                match h.send_batch(&mut batch) {
                    Ok(()) => sent += 1,
                    Err(e) => break (e, batch.len()),
                }
                if sent > 100_000 {
                    break (SendError::TimedOut, batch.len());
                }
            };
            tx.send((sent, kept)).unwrap();
        })
        .unwrap();
    let (got_tx, got_rx) = unbounded();
    dvm[0]
        .recv(
            Peer::Rank(1),
            TAG + 1,
            tbon::RecvMode::Persistent,
            move |_| {
                got_tx.send(()).unwrap();
            },
        )
        .unwrap();
    dvm[0].send(1, TAG, Bytes::from_static(b"go")).unwrap();
    let (sent, (err, kept)) = rx.recv_timeout(HANG_GUARD).expect("the callback ran");
    assert!(matches!(err, SendError::Busy(_)), "{err}");
    assert_eq!(kept, 1, "the refused message stays in the batch");
    for _ in 0..sent {
        got_rx
            .recv_timeout(HANG_GUARD)
            .expect("a batched message went missing");
    }
}

/// `subscribe`: far more messages than the subscription's queue holds arrive while nobody
/// reads; the receive is paused (the rest wait in the unmatched list) and resumed as the
/// reader catches up, so every message is read once, in order. Dropping the subscription
/// frees its (peer, tag); a blocking read from a callback is refused.
#[test]
fn a_subscription_pauses_at_its_bound_and_loses_nothing() {
    let n = 3 * tbon::limits::SUBSCRIPTION_QUEUE_MAX as u32;
    let dvm = start_dvm(3, &loopback_config(2));
    let inbox = dvm[0].subscribe(Peer::Rank(2), TAG).unwrap();
    assert_eq!(
        dvm[0].subscribe(Peer::Rank(2), TAG).unwrap_err(),
        RecvError::Duplicate
    );
    let mut batch = tbon::Batch::new();
    let mut seq = 0u32;
    while seq < n {
        while seq < n && batch.push(0, TAG, seq.to_le_bytes().to_vec()).is_ok() {
            seq += 1;
        }
        while !batch.is_empty() {
            match dvm[2].send_batch(&mut batch) {
                Ok(()) => {}
                Err(SendError::Busy(_)) => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => panic!("{e}"),
            }
        }
    }
    // Let the queue fill before reading: the receive pauses, the rest wait unmatched.
    let deadline = Instant::now() + HANG_GUARD;
    while inbox.len() < tbon::limits::SUBSCRIPTION_QUEUE_MAX && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        inbox.len() <= 2 * tbon::limits::SUBSCRIPTION_QUEUE_MAX,
        "{}",
        inbox.len()
    );
    for want in 0..n {
        let m = inbox
            .recv_timeout(HANG_GUARD)
            .expect("a message went missing");
        assert_eq!(m.origin, 2);
        assert_eq!(u32::from_le_bytes(m.payload[..4].try_into().unwrap()), want);
    }
    assert!(inbox.try_recv().is_none());
    drop(inbox);
    // The pair is free again, and a later message reaches the new receiver.
    let (tx, rx) = unbounded();
    let again = dvm[0].subscribe(Peer::Rank(2), TAG).unwrap();
    dvm[2].send(0, TAG, "after").unwrap();
    assert_eq!(
        &again.recv_timeout(HANG_GUARD).unwrap().payload[..],
        b"after"
    );
    // From a callback a blocking read is refused; try_recv answers.
    let sub = std::sync::Arc::new(again);
    let in_cb = std::sync::Arc::clone(&sub);
    dvm[0]
        .recv(Peer::Any, TAG + 1, tbon::RecvMode::Once, move |_| {
            let _ = tx.send((in_cb.recv(), in_cb.try_recv().is_none()));
        })
        .unwrap();
    dvm[1].send(0, TAG + 1, "poke").unwrap();
    let (blocking, empty) = rx.recv_timeout(HANG_GUARD).unwrap();
    assert_eq!(blocking.unwrap_err(), RecvError::InCallback);
    assert!(empty);
}

/// A caller that finds the command channel full blocks (back-pressure) while the loop is busy,
/// and is woken once the loop has made room: here the loop is held in a receive callback, the
/// caller sends more than the channel holds, and every message still arrives once, in order.
#[test]
fn a_caller_blocked_on_a_full_command_channel_resumes_and_loses_nothing() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    const HOLD: u32 = TAG + 7;
    const COUNT: u64 = 3 * tbon::limits::COMMAND_QUEUE_MAX as u64;
    let dvm = start_dvm(2, &loopback_config(2));
    let (held_tx, held_rx) = unbounded();
    let sent = Arc::new(AtomicU64::new(0));
    let sent_at_release = Arc::new(AtomicU64::new(u64::MAX));
    {
        let (sent, at_release) = (sent.clone(), sent_at_release.clone());
        // Holds rank 0's loop thread: nothing leaves the command channel meanwhile.
        dvm[0]
            .recv(Peer::Rank(0), HOLD, tbon::RecvMode::Once, move |_| {
                held_tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(300));
                at_release.store(sent.load(Ordering::SeqCst), Ordering::SeqCst);
            })
            .unwrap();
    }
    let (got_tx, got_rx) = unbounded();
    dvm[1]
        .recv(Peer::Rank(0), TAG, tbon::RecvMode::Persistent, move |m| {
            got_tx
                .send(u64::from_be_bytes(m.payload[..8].try_into().unwrap()))
                .unwrap();
        })
        .unwrap();
    dvm[0].send(0, HOLD, Bytes::new()).unwrap();
    held_rx
        .recv_timeout(HANG_GUARD)
        .expect("the hold never ran");
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..COUNT {
                let deadline = Instant::now() + HANG_GUARD;
                loop {
                    match dvm[0].send(1, TAG, Bytes::copy_from_slice(&i.to_be_bytes())) {
                        Ok(()) => break,
                        // Flow control may refuse for a moment; a real caller retries too.
                        Err(SendError::Busy(_)) if Instant::now() < deadline => {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        Err(e) => panic!("send {i}: {e}"),
                    }
                }
                sent.fetch_add(1, Ordering::SeqCst);
            }
        });
    });
    // The caller could not get all of them in while the loop was held: it was blocked.
    let at_release = sent_at_release.load(Ordering::SeqCst);
    assert!(
        at_release < COUNT,
        "{at_release} of {COUNT} sent while the loop was held"
    );
    for i in 0..COUNT {
        let got = got_rx
            .recv_timeout(HANG_GUARD)
            .expect("a message went missing");
        assert_eq!(got, i, "out of order or lost");
    }
}

/// From a receive callback, sends until the command queue refuses (`Busy`: it is full), then
/// runs `then` with the handle; returns how many sends were taken.
fn fill_queue_then(
    d: &tbon::Daemon,
    hold: u32,
    then: impl Fn(&tbon::Handle) + Send + 'static,
) -> u64 {
    let (taken_tx, taken_rx) = unbounded();
    let h = d.handle();
    d.recv(Peer::Rank(0), hold, tbon::RecvMode::Once, move |_| {
        let mut taken = 0u64;
        while h.send(1, TAG, Bytes::from_static(b"fill")).is_ok() {
            taken += 1;
            assert!(taken <= 1 << 20, "the queue never refused");
        }
        then(&h);
        taken_tx.send(taken).unwrap();
    })
    .unwrap();
    d.send(0, hold, Bytes::new()).unwrap();
    taken_rx
        .recv_timeout(HANG_GUARD)
        .expect("the callback never ran")
}

/// A stop asked for from a callback while the command queue is full is not lost: it has no
/// result to report a refusal with (issue "Hardening": found by an outside-in program).
#[test]
fn a_shutdown_from_a_callback_with_the_command_queue_full_stops_the_daemon() {
    let dvm = start_dvm(2, &loopback_config(2));
    let taken = fill_queue_then(&dvm[0], TAG + 8, |h| h.shutdown());
    assert!(taken >= tbon::limits::COMMAND_QUEUE_MAX as u64 / 2);
    assert_eq!(
        dvm[0].wait_stopped(HANG_GUARD),
        Some(tbon::StopReason::Requested),
        "the shutdown was lost"
    );
}

/// A cancel from a callback while the command queue is full takes effect: the cancelled
/// receive gets nothing more, and a receive posted again for the pair gets the next message.
#[test]
fn a_cancel_from_a_callback_with_the_command_queue_full_is_not_lost() {
    const VICTIM: u32 = TAG + 9;
    let dvm = start_dvm(2, &loopback_config(2));
    let (old_tx, old_rx) = unbounded();
    dvm[0]
        .recv(
            Peer::Rank(1),
            VICTIM,
            tbon::RecvMode::Persistent,
            move |_| {
                old_tx.send(()).unwrap();
            },
        )
        .unwrap();
    let (fill_tx, fill_rx) = unbounded();
    dvm[1]
        .recv(Peer::Rank(0), TAG, tbon::RecvMode::Persistent, move |_| {
            fill_tx.send(()).unwrap();
        })
        .unwrap();
    let taken = fill_queue_then(&dvm[0], TAG + 10, |h| h.cancel(Peer::Rank(1), VICTIM));
    // Every send queued before the cancel has arrived: the cancel has been handled.
    for _ in 0..taken {
        fill_rx
            .recv_timeout(HANG_GUARD)
            .expect("a send went missing");
    }
    let (new_tx, new_rx) = unbounded();
    dvm[0]
        .recv(Peer::Rank(1), VICTIM, tbon::RecvMode::Once, move |_| {
            new_tx.send(()).unwrap();
        })
        .unwrap();
    dvm[1].send(0, VICTIM, Bytes::new()).unwrap();
    new_rx
        .recv_timeout(HANG_GUARD)
        .expect("the new receive got nothing");
    assert!(
        old_rx.try_recv().is_err(),
        "the cancelled receive still matched"
    );
}

/// The same with the queue's control reserve full as well (purges fill it): the stop still
/// reaches the loop, through the request it reads every turn.
#[test]
fn a_shutdown_from_a_callback_with_the_control_reserve_full_stops_the_daemon() {
    let dvm = start_dvm(2, &loopback_config(2));
    fill_queue_then(&dvm[0], TAG + 11, |h| {
        for _ in 0..=tbon::limits::COMMAND_CONTROL_RESERVE {
            h.purge(1);
        }
        h.shutdown();
    });
    assert_eq!(
        dvm[0].wait_stopped(HANG_GUARD),
        Some(tbon::StopReason::Requested),
        "the shutdown was lost"
    );
}
