//! Faults in a live DVM on loopback: detection, repair, notices and epochs. A daemon "crashes"
//! by `abort()` (sockets closed without notice, as the kernel does for a killed process). After
//! each case: every survivor holds the same tree, equal to the pure routing tree for the same
//! failed set; all-to-all traffic among survivors arrives; a send to a dead rank gets node-down.
//! No timing assertions: waits poll for a state, with a hang guard.

mod common;

use bytes::Bytes;
use common::{HANG_GUARD, loopback_config, start_dvm};
use crossbeam_channel::unbounded;
use std::collections::HashSet;
use std::time::{Duration, Instant};
use tbon::routed::tree_view;
use tbon::{Daemon, Peer, Rank, RecoveryStatus, Scope, SendError, StopReason};

const TAG: u32 = 200;

/// Polls `cond` until it holds; panics with `what` and `state()` at the hang guard.
fn wait_for_or(what: &str, cond: &mut impl FnMut() -> bool, state: impl Fn() -> String) {
    let deadline = Instant::now() + HANG_GUARD;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "gave up waiting: {what}; {}",
            state()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn survivors<'a>(dvm: &'a [Daemon], dead: &[Rank]) -> Vec<&'a Daemon> {
    dvm.iter().filter(|d| !dead.contains(&d.rank())).collect()
}

/// Waits until every survivor knows exactly `dead` failed, at rank 0's epoch, then checks each
/// one's parent and children against the pure tree for that failed set.
fn converged(dvm: &[Daemon], dead: &[Rank], radix: u32) {
    let mut dead = dead.to_vec();
    dead.sort_unstable();
    let alive = survivors(dvm, &dead);
    let state = || {
        alive
            .iter()
            .map(|d| {
                let c = d.counters().unwrap();
                format!(
                    "{}: failed {:?} epoch {} parent {:?}",
                    d.rank(),
                    c.failed,
                    c.epoch,
                    c.parent
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    let mut agreed = || {
        let root = dvm[0].counters().unwrap();
        root.failed == dead
            && alive.iter().all(|d| {
                let c = d.counters().unwrap();
                c.failed == dead && c.epoch == root.epoch
            })
    };
    wait_for_or(
        &format!("every survivor to agree on the failed set {dead:?}"),
        &mut agreed,
        state,
    );
    let size = dvm.len() as u32;
    let view = tree_view(radix, size, &dead).unwrap();
    for d in &alive {
        let c = d.counters().unwrap();
        let node = view.iter().find(|n| n.rank == d.rank()).unwrap();
        assert_eq!(c.parent, node.parent, "parent of rank {}", d.rank());
        assert_eq!(c.children, node.children, "children of rank {}", d.rank());
        assert!(!d.is_stopped(), "survivor {} stopped", d.rank());
    }
}

/// Every survivor sends one message to every other survivor; all arrive, once.
fn all_to_all(dvm: &[Daemon], dead: &[Rank], tag: u32) {
    let alive = survivors(dvm, dead);
    let (tx, rx) = unbounded();
    for d in &alive {
        let tx = tx.clone();
        let me = d.rank();
        d.recv(Peer::Any, tag, tbon::RecvMode::Persistent, move |m| {
            tx.send((m.origin, me)).unwrap()
        })
        .unwrap();
    }
    for d in &alive {
        for e in &alive {
            if d.rank() != e.rank() {
                d.send(e.rank(), tag, Bytes::from_static(b"after the fault"))
                    .unwrap();
            }
        }
    }
    let n = alive.len() * (alive.len() - 1);
    let mut seen = HashSet::new();
    for _ in 0..n {
        let pair = rx
            .recv_timeout(HANG_GUARD)
            .expect("a message between survivors was lost");
        assert!(seen.insert(pair), "duplicate {pair:?}");
    }
}

fn send_to_dead_is_node_down(from: &Daemon, dead: Rank) {
    let (tx, rx) = unbounded();
    from.send_with(dead, TAG, "hello?", move |r| tx.send(r).unwrap())
        .unwrap();
    assert_eq!(
        rx.recv_timeout(HANG_GUARD).unwrap(),
        Err(SendError::NodeDown(dead))
    );
}

fn case(size: u32, radix: u32, kill: &[Rank]) -> Vec<Daemon> {
    let dvm = start_dvm(size, &loopback_config(radix));
    for r in kill {
        dvm[*r as usize].abort();
    }
    converged(&dvm, kill, radix);
    all_to_all(&dvm, kill, TAG);
    send_to_dead_is_node_down(&dvm[0], kill[0]);
    dvm
}

#[test]
fn a_leaf_dies() {
    case(15, 2, &[14]);
}

#[test]
fn an_interior_daemon_dies() {
    let dvm = case(15, 2, &[1]);
    // Rank 1's heir (its highest child, 5) took its slot under rank 0.
    assert_eq!(dvm[0].counters().unwrap().children, vec![2, 5]);
}

/// Contacts beyond a daemon's ancestors and subtree are looked up from rank 0 when a repair
/// makes them neighbours (rank 1's heir adopts its siblings, whose contacts wire-up did not
/// give it); with `contacts = "full"` every daemon has them all and looks nothing up.
#[test]
fn a_repair_looks_up_the_contacts_of_new_neighbours_unless_contacts_are_full() {
    let lookups = |dvm: &[Daemon]| -> u64 {
        survivors(dvm, &[1])
            .iter()
            .map(|d| d.counters().unwrap().contact_lookups)
            .sum()
    };
    let dvm = case(15, 2, &[1]);
    assert!(lookups(&dvm) > 0, "the heir looked up its new children");
    drop(dvm);
    let mut cfg = loopback_config(2);
    cfg.contacts = tbon::ContactsSetting::Full;
    let dvm = start_dvm(15, &cfg);
    dvm[1].abort();
    converged(&dvm, &[1], 2);
    all_to_all(&dvm, &[1], TAG);
    assert_eq!(lookups(&dvm), 0, "a full table needs no lookups");
}

#[test]
fn a_parent_and_its_child_die_together() {
    case(21, 4, &[1, 5]);
}

#[test]
fn two_siblings_die_together() {
    case(21, 4, &[1, 2]);
}

#[test]
fn the_heir_dies_while_the_repair_spreads() {
    // 1's heir is 5; it dies right after 1, before anyone could have settled.
    case(15, 2, &[1, 5]);
}

#[test]
fn three_of_seven_die_at_radix_2() {
    case(7, 2, &[1, 2, 5]);
}

#[test]
fn faults_one_after_another_keep_epochs_and_trees_in_step() {
    let dvm = start_dvm(16, &loopback_config(2));
    let mut dead = Vec::new();
    for r in [3, 1, 12] {
        dvm[r as usize].abort();
        dead.push(r);
        converged(&dvm, &dead, 2);
        all_to_all(&dvm, &dead, TAG + r);
    }
    assert!(dvm[0].counters().unwrap().epoch >= 3);
}

#[test]
fn fault_handlers_run_per_scope_with_the_status() {
    let dvm = start_dvm(7, &loopback_config(2));
    let (tx, rx) = unbounded();
    // Rank 3's parent is 1: it sees the local repair, then rank 0's confirmation.
    dvm[3]
        .on_fault(move |s: &RecoveryStatus| tx.send(s.clone()).unwrap())
        .unwrap();
    dvm[1].abort();
    let mut scopes = Vec::new();
    let deadline = Instant::now() + HANG_GUARD;
    while !scopes.contains(&Scope::Global) {
        let s = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("no global-scope status");
        assert_eq!(s.newly_failed, vec![1]);
        if s.scope == Scope::Global {
            assert_eq!(s.epoch, Some(1));
        }
        scopes.push(s.scope);
    }
    // Local first if at all, and each scope once.
    assert!(scopes == vec![Scope::Global] || scopes == vec![Scope::Local, Scope::Global]);
}

#[test]
fn losing_rank_0_ends_every_daemon() {
    let dvm = start_dvm(15, &loopback_config(2));
    dvm[0].abort();
    for d in &dvm[1..] {
        let r = d.wait_stopped(HANG_GUARD);
        assert!(
            matches!(r, Some(StopReason::RootLost(_))),
            "rank {}: {r:?}",
            d.rank()
        );
    }
}

/// A receive callback that panics stops its daemon, as a crash would for its peers, and its own
/// handle says so with the cause (it reported no stop at all, so a supervisor waiting for one
/// waited for ever: from an outside-in review).
#[test]
fn a_panicking_callback_stops_its_daemon_with_the_cause() {
    let dvm = start_dvm(3, &loopback_config(2));
    dvm[2]
        .recv(Peer::Any, 4_300, tbon::RecvMode::Persistent, |_| {
            panic!("the application's bug")
        })
        .unwrap();
    dvm[0].send(2, 4_300, Bytes::from_static(b"boom")).unwrap();
    match dvm[2].wait_stopped(HANG_GUARD) {
        Some(StopReason::Fatal(why)) => {
            assert!(why.contains("panicked"), "{why}");
            assert!(why.contains("the application's bug"), "{why}");
        }
        other => panic!("the daemon whose callback panicked: {other:?}"),
    }
    assert!(dvm[2].is_stopped());
    assert!(matches!(
        dvm[2].send(0, 4_301, Bytes::new()),
        Err(SendError::ShutDown)
    ));
    // Its peers take it for a crash.
    let start = Instant::now();
    while !dvm[0].counters().unwrap().failed.contains(&2) {
        assert!(start.elapsed() < HANG_GUARD, "rank 2's death not found");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// From an outside-in review of the Rust API: a receive callback that blocks longer than the
/// heartbeat timeout gets its daemon declared dead; the daemon must say so when it runs again
/// (`DeclaredDead`), not blame rank 0 (`RootLost`) after another heartbeat timeout.
#[test]
fn a_daemon_stalled_in_a_callback_past_the_heartbeat_timeout_learns_it_was_declared_dead() {
    let cfg = tbon::config::Config {
        heartbeat_interval_ms: 100,
        heartbeat_timeout_ms: 1_000,
        ..loopback_config(2)
    };
    // At once after wire-up (before the stalled daemon's first heartbeat tick: its monitor
    // then took the stall for its parent's silence), and after a few ticks.
    for wait_ms in [0, 300] {
        let dvm = start_dvm(3, &cfg);
        dvm[2]
            .recv(Peer::Any, 4_310, tbon::RecvMode::Persistent, |_| {
                std::thread::sleep(Duration::from_millis(2_500))
            })
            .unwrap();
        std::thread::sleep(Duration::from_millis(wait_ms));
        dvm[0].send(2, 4_310, Bytes::from_static(b"block")).unwrap();
        let start = Instant::now();
        while !dvm[0].counters().unwrap().failed.contains(&2) {
            assert!(start.elapsed() < HANG_GUARD, "rank 2's stall not found");
            std::thread::sleep(Duration::from_millis(10));
        }
        match dvm[2].wait_stopped(HANG_GUARD) {
            Some(StopReason::DeclaredDead(_)) => {}
            other => panic!("stalled {wait_ms} ms after wire-up: {other:?}"),
        }
    }
}

/// From an outside-in review of restarts from the command line: with a heartbeat timeout of
/// 400 s, a SIGSTOPped daemon was declared dead after 34 s: its link stalled, and the dials of
/// the failover timed out their handshakes (the host takes the connection, the hung daemon
/// never answers) until the reconnect attempts ran out. A hung daemon is the heartbeat
/// timeout's to judge: a daemon hung for less than it is not declared dead.
#[test]
fn a_daemon_hung_for_less_than_the_heartbeat_timeout_is_not_declared_dead_by_dials() {
    const TAG: u32 = 4_330;
    let cfg = tbon::config::Config {
        heartbeat_interval_ms: 200,
        heartbeat_timeout_ms: 20_000,
        link_stall_ms: 1_000,
        handshake_timeout_ms: 300,
        reconnect_base_ms: 50,
        reconnect_max_ms: 200,
        ..loopback_config(2)
    };
    let dvm = start_dvm(3, &cfg);
    let (tx, rx) = unbounded();
    dvm[2]
        .recv(Peer::Any, TAG, tbon::RecvMode::Persistent, move |m| {
            if m.payload.as_ref() == b"hang" {
                std::thread::sleep(Duration::from_millis(6_000));
            }
            let _ = tx.send(m.payload.clone());
        })
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    dvm[0].send(2, TAG, Bytes::from_static(b"hang")).unwrap();
    dvm[0].send(2, TAG, Bytes::from_static(b"after")).unwrap();
    for want in [&b"hang"[..], b"after"] {
        let got = rx.recv_timeout(HANG_GUARD).expect("a message to rank 2");
        assert_eq!(got.as_ref(), want);
    }
    assert!(
        dvm[0].counters().unwrap().failed.is_empty(),
        "rank 2 declared dead"
    );
    assert!(!dvm[2].is_stopped());
}
