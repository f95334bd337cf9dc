//! Rejoin in live in-process DVMs (loopback): a daemon "crashes" by `Handle::abort` and a new
//! one is started under its rank with `rejoin` set. Checks what the collectives deliver across
//! the return (issue "Rejoin and grow"). Waits poll for a state, with a hang guard only.

mod common;

use bytes::Bytes;
use common::{HANG_GUARD, loopback_config, start_dvm};
use std::time::{Duration, Instant};
use tbon::config::Config;
use tbon::{Daemon, Rank};

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < HANG_GUARD, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn failed_at(d: &Daemon) -> Vec<u32> {
    d.counters().map(|c| c.failed).unwrap_or_default()
}

/// Kills `rank`, waits until every survivor has it failed, and starts it again with `rejoin`.
fn kill_and_restart(dvm: &mut [Daemon], rank: Rank, cfg: &Config) {
    dvm[rank as usize].abort();
    for d in dvm.iter().filter(|d| d.rank() != rank) {
        wait_for("the death known everywhere", || {
            failed_at(d).contains(&rank)
        });
    }
    let uri = dvm[0].contact_uri().to_string();
    let size = dvm.len() as u32;
    let again = tbon::start(
        Config {
            rejoin: true,
            ..cfg.clone()
        },
        rank,
        size,
        Some(&uri),
    )
    .expect("restart");
    assert!(again.wait_wired(HANG_GUARD), "rank {rank} was not admitted");
    dvm[rank as usize] = again;
    for d in dvm.iter() {
        wait_for("the return known everywhere", || {
            !failed_at(d).contains(&rank)
        });
    }
}

#[test]
fn an_allgather_in_flight_across_a_rejoin_completes_without_the_new_life() {
    // Radix 2, 7 daemons: rank 1 is interior (children 3 and 4).
    let cfg = loopback_config(2);
    let mut dvm = start_dvm(7, &cfg);
    let data = |r: Rank, id: u64| Bytes::from(format!("{r}/{id}"));
    // Collective 1 is in flight: every daemon but rank 6 contributes, rank 1 included.
    let (tx, rx) = crossbeam_channel::unbounded();
    for d in dvm.iter().filter(|d| d.rank() != 6) {
        let tx = tx.clone();
        let me = d.rank();
        d.allgather(1, data(me, 1), move |r| tx.send((me, r)).unwrap())
            .unwrap();
    }
    kill_and_restart(&mut dvm, 1, &cfg);
    // Rank 6 contributes after the return: collective 1 does not wait for rank 1's new life,
    // whose application knows nothing of it.
    let tx6 = tx.clone();
    dvm[6]
        .allgather(1, data(6, 1), move |r| tx6.send((6, r)).unwrap())
        .unwrap();
    let mut results = Vec::new();
    while results.len() < 6 {
        let (at, r) = rx.recv_timeout(HANG_GUARD).expect("a result");
        match r {
            Ok(r) => results.push((at, r)),
            // The old life's call ended with it.
            Err(tbon::SendError::ShutDown) if at == 1 => {}
            Err(e) => panic!("rank {at}: collective 1: {e}"),
        }
    }
    for (at, r) in &results {
        assert_ne!(*at, 1, "only the old life of rank 1 contributed");
        // Rank 1's old life contributed, and died: its entry may or may not have got in.
        let ranks: Vec<Rank> = r.ranks().collect();
        for x in [0, 2, 3, 4, 5, 6] {
            assert!(ranks.contains(&x), "rank {at}: {x} missing from {ranks:?}");
        }
        assert_eq!(r, &results[0].1, "every daemon gets the same result");
    }
    // A collective started after the return waits for the new life and includes it.
    for d in dvm.iter().filter(|d| d.rank() != 1) {
        let tx = tx.clone();
        let me = d.rank();
        d.allgather(2, data(me, 2), move |r| tx.send((me, r)).unwrap())
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        rx.try_recv().is_err(),
        "collective 2 finished without rank 1"
    );
    let got = dvm[1].allgather_wait(2, data(1, 2), HANG_GUARD).unwrap();
    assert_eq!(got.ranks().collect::<Vec<_>>(), (0..7).collect::<Vec<_>>());
    assert_eq!(got.get(1), Some(&data(1, 2)));
    for _ in 0..6 {
        let (_, r) = rx.recv_timeout(HANG_GUARD).expect("a result");
        assert_eq!(r.unwrap(), got);
    }
    // The new life contributes to collective 1, finished before its return: it gets the result
    // from a neighbour, not a hang.
    let late = dvm[1].allgather_wait(1, data(1, 1), HANG_GUARD).unwrap();
    assert_eq!(late, results[0].1);
    for d in &dvm {
        d.shutdown();
    }
}

#[test]
fn a_dvm_started_with_room_to_grow_shows_absent_ranks_and_tells_the_joins() {
    // Room for 5, 3 started: ranks 3 and 4 are absent (not dead) until they join.
    let cfg = Config {
        initial_size: 3,
        ..loopback_config(2)
    };
    let size = 5;
    let root = tbon::start(cfg.clone(), 0, size, None).expect("start rank 0");
    let uri = root.contact_uri().to_string();
    let mut dvm = vec![root];
    for r in 1..3 {
        dvm.push(tbon::start(cfg.clone(), r, size, Some(&uri)).expect("start"));
    }
    for d in &dvm {
        assert!(
            d.wait_wired(HANG_GUARD),
            "rank {} did not wire up",
            d.rank()
        );
    }
    let report = dvm[0].status(2000, true).unwrap();
    let view = tbon::status::view::view(&report).unwrap();
    assert_eq!(report.absent, vec![3, 4]);
    assert_eq!(
        view.ranks_in(tbon::status::view::RankState::Absent),
        vec![3, 4]
    );
    assert!(view.healthy(), "absent ranks are no fault: {view:?}");
    // Rank 1's repair handler hears of each join as a restore, never as a failure.
    let (tx, rx) = crossbeam_channel::unbounded();
    dvm[1]
        .on_fault(move |s| {
            if s.scope == tbon::Scope::Global {
                tx.send((s.restored.clone(), s.newly_failed.clone()))
                    .unwrap();
            }
        })
        .unwrap();
    for r in 3..size {
        let d = tbon::start(
            Config {
                rejoin: true,
                ..cfg.clone()
            },
            r,
            size,
            Some(&uri),
        )
        .expect("join");
        assert!(d.wait_wired(HANG_GUARD), "rank {r} did not join");
        dvm.push(d);
    }
    let mut joined = Vec::new();
    while joined.len() < 2 {
        let (restored, failed) = rx.recv_timeout(HANG_GUARD).expect("a repair");
        assert!(
            failed.is_empty(),
            "a join reported as a failure: {failed:?}"
        );
        joined.extend(restored);
    }
    joined.sort_unstable();
    assert_eq!(joined, vec![3, 4]);
    wait_for("every daemon to know both joins", || {
        dvm.iter().all(|d| failed_at(d).is_empty())
    });
    let report = dvm[0].status(2000, true).unwrap();
    assert!(report.absent.is_empty() && report.failed.is_empty());
    // A barrier started after the joins includes the new ranks.
    let waiters: Vec<_> = dvm
        .iter()
        .map(|d| {
            let h = d.handle();
            std::thread::spawn(move || h.barrier_wait(1, HANG_GUARD))
        })
        .collect();
    for w in waiters {
        let r = w.join().unwrap().expect("barrier");
        assert!(r.excluded.is_empty(), "{r:?}");
    }
    for d in &dvm {
        d.shutdown();
    }
}

#[test]
fn a_group_collective_in_flight_across_a_rejoin_completes_and_the_next_waits_for_the_new_life() {
    // Radix 2, 7 daemons: rank 1 is interior (children 3 and 4). Job 9 runs on ranks 1, 3, 4
    // and 6; rank 1 relays for 3 and 4.
    let cfg = loopback_config(2);
    let mut dvm = start_dvm(7, &cfg);
    let members = [1, 3, 4, 6];
    // Each daemon has its own `Group` value (clones share the numbering).
    let job = |_: Rank| tbon::Group::new(9, members).unwrap();
    let mut groups: Vec<Option<tbon::Group>> = (0..7)
        .map(|r| members.contains(&r).then(|| job(r)))
        .collect();
    let data = |r: Rank| Bytes::from(format!("job 9 at {r}"));
    let (tx, rx) = crossbeam_channel::unbounded();
    let call = |dvm: &[Daemon],
                groups: &[Option<tbon::Group>],
                r: Rank,
                tx: &crossbeam_channel::Sender<_>| {
        let tx = tx.clone();
        let g = groups[r as usize].as_ref().unwrap();
        dvm[r as usize]
            .group_allgather(g, data(r), move |res| tx.send((r, res)).unwrap())
            .unwrap();
    };
    // Collective 0 is in flight: ranks 1 and 3 call it, then rank 1 dies and returns.
    call(&dvm, &groups, 1, &tx);
    call(&dvm, &groups, 3, &tx);
    kill_and_restart(&mut dvm, 1, &cfg);
    // Ranks 4 and 6 call after the return: it does not wait for rank 1's new life, whose
    // application knows nothing of it.
    call(&dvm, &groups, 4, &tx);
    call(&dvm, &groups, 6, &tx);
    let mut results = Vec::new();
    while results.len() < 3 {
        let (at, r) = rx.recv_timeout(HANG_GUARD).expect("a result");
        match r {
            Ok(r) => results.push((at, r)),
            // The old life's call ended with it.
            Err(tbon::SendError::ShutDown) if at == 1 => {}
            Err(e) => panic!("rank {at}: job 9's collective 0: {e}"),
        }
    }
    for (at, r) in &results {
        assert_ne!(*at, 1);
        let ranks: Vec<Rank> = r.ranks().collect();
        for x in [3, 4, 6] {
            assert!(ranks.contains(&x), "rank {at}: {x} missing from {ranks:?}");
        }
        assert_eq!(r, &results[0].1, "every member gets the same result");
    }
    // The new life's application joins the job afresh: its first call is collective 0, and
    // it gets the result its daemon relayed.
    groups[1] = Some(job(1));
    call(&dvm, &groups, 1, &tx);
    let (at, r) = rx.recv_timeout(HANG_GUARD).expect("the new life's result");
    assert_eq!(at, 1);
    assert_eq!(r.expect("collective 0 at the new life"), results[0].1);
    // Collective 1, started after the return, waits for the new life and includes it.
    for r in [3, 4, 6] {
        call(&dvm, &groups, r, &tx);
    }
    assert!(
        rx.recv_timeout(Duration::from_millis(500)).is_err(),
        "collective 1 finished without the returned member"
    );
    call(&dvm, &groups, 1, &tx);
    for _ in 0..4 {
        let (at, r) = rx.recv_timeout(HANG_GUARD).expect("collective 1");
        let r = r.unwrap_or_else(|e| panic!("rank {at}: collective 1: {e}"));
        assert_eq!(r.ranks().collect::<Vec<_>>(), vec![1, 3, 4, 6]);
        assert!(r.excluded.is_empty());
    }
    for d in &dvm {
        d.shutdown();
    }
}

/// A second daemon for a living rank, started without `rejoin` or with it before any death, is
/// refused on its own connection: rank 0's link to the living daemon stays, and no plain message
/// flowing over it meanwhile is lost. (Rank 0 used to let the newcomer's connection replace the
/// living daemon's link for a moment; the link session of another incarnation then gave up what
/// was in flight, and the living daemon had to reconnect.)
#[test]
fn a_second_daemon_for_a_living_rank_leaves_its_link_and_its_messages_alone() {
    const TAG: u32 = 4_242;
    let cfg = loopback_config(2);
    let dvm = start_dvm(2, &cfg);
    let got = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let in_order = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (g, o) = (got.clone(), in_order.clone());
    dvm[1]
        .recv(
            tbon::Peer::Rank(0),
            TAG,
            tbon::RecvMode::Persistent,
            move |m| {
                let n = u64::from_le_bytes(m.payload[..8].try_into().unwrap());
                if n != g.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
                    o.store(false, std::sync::atomic::Ordering::SeqCst);
                }
            },
        )
        .unwrap();
    // Rank 0 sends to rank 1 without pause while the second daemons try their luck.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sender = {
        let (h, stop) = (dvm[0].handle(), stop.clone());
        std::thread::spawn(move || {
            let mut sent = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                match h.send(1, TAG, Bytes::from(sent.to_le_bytes().to_vec())) {
                    Ok(()) => sent += 1,
                    Err(tbon::SendError::Busy(_)) => std::thread::sleep(Duration::from_micros(200)),
                    Err(e) => panic!("send {sent}: {e}"),
                }
            }
            sent
        })
    };
    wait_for("the first messages", || {
        got.load(std::sync::atomic::Ordering::SeqCst) > 1_000
    });
    let uri = dvm[0].contact_uri().to_string();
    for rejoin in [false, true] {
        let second = tbon::start(
            Config {
                rejoin,
                ..cfg.clone()
            },
            1,
            2,
            Some(&uri),
        )
        .expect("start the second daemon");
        match second.wait_stopped(HANG_GUARD) {
            Some(tbon::StopReason::Fatal(why)) => {
                assert!(why.contains("alive"), "rejoin {rejoin}: {why}")
            }
            other => panic!("rejoin {rejoin}: the second daemon was not refused: {other:?}"),
        }
    }
    // Some more traffic after the second attempt, then every message counted, in order.
    let after = got.load(std::sync::atomic::Ordering::SeqCst) + 1_000;
    wait_for("messages after the attempts", || {
        got.load(std::sync::atomic::Ordering::SeqCst) > after
    });
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let sent = sender.join().unwrap();
    wait_for("every message sent", || {
        got.load(std::sync::atomic::Ordering::SeqCst) >= sent
    });
    assert_eq!(got.load(std::sync::atomic::Ordering::SeqCst), sent);
    assert!(
        in_order.load(std::sync::atomic::Ordering::SeqCst),
        "out of order or lost"
    );
    let c0 = dvm[0].counters().unwrap();
    assert_eq!(c0.rejoins_refused, 2, "{c0:?}");
    assert!(c0.failed.is_empty(), "{c0:?}");
    let c1 = dvm[1].counters().unwrap();
    assert_eq!(
        (c1.link_resumes, c1.link_frames_given_up),
        (0, 0),
        "rank 1's link was broken: {c1:?}"
    );
}

/// From an outside-in review of restarting from the command line: a daemon hung past the
/// heartbeat timeout was declared dead and a new daemon admitted under its rank; when the hung
/// one woke, its neighbours took its older incarnation's connection for the rank's (the rank
/// lived again), and the two daemons replaced each other's links about 3,700 times a second
/// until the old one was killed by hand. It must learn it was declared dead and stop.
#[test]
fn a_hung_daemon_that_wakes_after_its_replacement_was_admitted_stops() {
    const TAG: u32 = 4_320;
    let cfg = Config {
        heartbeat_interval_ms: 100,
        heartbeat_timeout_ms: 1_000,
        ..loopback_config(2)
    };
    let dvm = start_dvm(3, &cfg);
    dvm[2]
        .recv(tbon::Peer::Any, TAG, tbon::RecvMode::Persistent, |_| {
            std::thread::sleep(Duration::from_millis(4_000))
        })
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    dvm[0].send(2, TAG, Bytes::from_static(b"hang")).unwrap();
    wait_for("rank 2 declared dead", || {
        failed_at(&dvm[0]).contains(&2) && failed_at(&dvm[1]).contains(&2)
    });
    let uri = dvm[0].contact_uri().to_string();
    let again = tbon::start(
        Config {
            rejoin: true,
            ..cfg.clone()
        },
        2,
        3,
        Some(&uri),
    )
    .expect("restart");
    assert!(again.wait_wired(HANG_GUARD), "rank 2 was not admitted");
    match dvm[2].wait_stopped(HANG_GUARD) {
        Some(tbon::StopReason::DeclaredDead(_)) => {}
        other => panic!("the old daemon of rank 2, awake again: {other:?}"),
    }
    // The new daemon keeps its place: what rank 0 and rank 1 send it arrives.
    let (tx, rx) = crossbeam_channel::unbounded();
    again
        .recv(
            tbon::Peer::Any,
            TAG + 1,
            tbon::RecvMode::Persistent,
            move |m| {
                let _ = tx.send(m.origin);
            },
        )
        .unwrap();
    for r in [0, 1] {
        dvm[r]
            .send_reliable(2, TAG + 1, Bytes::from_static(b"hello"))
            .unwrap();
    }
    let mut got = Vec::new();
    while got.len() < 2 {
        got.push(
            rx.recv_timeout(HANG_GUARD)
                .expect("a message to the new rank 2"),
        );
    }
    got.sort_unstable();
    assert_eq!(got, [0, 1]);
    assert!(!again.is_stopped());
    assert!(failed_at(&dvm[0]).is_empty());
}
