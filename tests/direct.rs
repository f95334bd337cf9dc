//! Direct links between real daemons on loopback (issue "Direct links"): negotiation over the
//! tree, the switch of routes without reordering, denials and their cache, crossed requests,
//! per-send routes. Two leaves at depth 3 of a radix-2 tree of 15 (ranks 7 and 14, five
//! relays apart). No timing assertions: timeouts only guard against hangs.

mod common;

use bytes::Bytes;
use common::{HANG_GUARD, loopback_config, start_dvm_with};
use crossbeam_channel::{Receiver, unbounded};
use std::time::{Duration, Instant};
use tbon::{Daemon, Peer, Route, RouteSetting};

const TAG: u32 = 100;
const A: u32 = 7;
const B: u32 = 14;
const SIZE: u32 = 15;

fn dvm(route: impl Fn(u32) -> RouteSetting) -> Vec<Daemon> {
    start_dvm_with(SIZE, |r| {
        let mut c = loopback_config(2);
        c.route = route(r);
        c
    })
}

/// Every message `to` receives from `from`, as the sequence number each carries.
fn sequence_receiver(dvm: &[Daemon], to: u32, from: u32) -> Receiver<u64> {
    let (tx, rx) = unbounded();
    dvm[to as usize]
        .recv(
            Peer::Rank(from),
            TAG,
            tbon::RecvMode::Persistent,
            move |m| {
                let n = u64::from_be_bytes(m.payload[..8].try_into().unwrap());
                tx.send(n).unwrap();
            },
        )
        .unwrap();
    rx
}

/// Sends `range` from `from` to `to` (each message its number, padded to `len` bytes),
/// offering a refused (`Busy`) one again.
fn send_range(d: &Daemon, to: u32, range: std::ops::Range<u64>, len: usize, route: Option<Route>) {
    for n in range {
        let mut p = vec![0u8; len.max(8)];
        p[..8].copy_from_slice(&n.to_be_bytes());
        let p = Bytes::from(p);
        let deadline = Instant::now() + HANG_GUARD;
        loop {
            let r = match route {
                Some(route) => d.send_routed(to, TAG, p.clone(), route),
                None => d.send(to, TAG, p.clone()),
            };
            match r {
                Ok(()) => break,
                Err(tbon::SendError::Busy(_)) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) => panic!("send {n}: {e}"),
            }
        }
    }
}

fn expect_in_order(rx: &Receiver<u64>, range: std::ops::Range<u64>) {
    for want in range {
        let got = rx.recv_timeout(HANG_GUARD).expect("a message went missing");
        assert_eq!(got, want, "out of order or lost");
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + HANG_GUARD;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The link is open both ways: the grantor has the requester's `Switch`, the last control
/// message between the two that the tree relays (so `relayed` stays still from here on).
fn open_at_both_ends(a: &Daemon, b: &Daemon) -> bool {
    let (ca, cb) = (a.counters().unwrap().direct, b.counters().unwrap().direct);
    ca.links_opened == 1 && cb.links_opened == 1 && ca.links_open == 1 && cb.links_open == 1
}

fn relayed(dvm: &[Daemon]) -> u64 {
    dvm.iter().map(|d| d.counters().unwrap().relayed).sum()
}

#[test]
fn a_burst_through_the_switch_arrives_in_order_and_then_skips_the_relays() {
    let dvm = dvm(|_| RouteSetting::Direct);
    let (a, b) = (&dvm[A as usize], &dvm[B as usize]);
    let at_b = sequence_receiver(&dvm, B, A);
    let at_a = sequence_receiver(&dvm, A, B);
    // The request goes out with the first message; the traffic keeps going over the tree
    // meanwhile and goes on across the switch.
    let mut n = 0;
    while a.counters().unwrap().direct.links_open == 0 {
        assert!(n < 1_000_000, "no link after {n} messages");
        send_range(a, B, n..n + 100, 64, None);
        n += 100;
    }
    send_range(a, B, n..n + 1000, 64, None);
    n += 1000;
    expect_in_order(&at_b, 0..n);
    wait_until("the link to open at both ends", || open_at_both_ends(a, b));
    let ca = a.counters().unwrap().direct;
    assert_eq!(ca.requests_sent, 1, "one request, not one per message");
    assert!(ca.tree_messages > 0 && ca.direct_messages > 0, "{ca:?}");
    assert_eq!(b.counters().unwrap().direct.grants, 1);
    // Both ways on the link now: nothing is relayed any more.
    let before = relayed(&dvm);
    send_range(a, B, n..n + 1000, 64, None);
    send_range(b, A, 0..1000, 64 * 1024, None);
    expect_in_order(&at_b, n..n + 1000);
    expect_in_order(&at_a, 0..1000);
    assert_eq!(relayed(&dvm), before, "a message took the tree");
    assert_eq!(b.counters().unwrap().direct.requests_sent, 0);
}

#[test]
fn a_grantor_set_to_tree_denies_once_and_the_denial_is_cached() {
    let dvm = dvm(|r| {
        if r == B {
            RouteSetting::Tree
        } else {
            RouteSetting::Direct
        }
    });
    let a = &dvm[A as usize];
    let at_b = sequence_receiver(&dvm, B, A);
    send_range(a, B, 0..10, 8, None);
    expect_in_order(&at_b, 0..10);
    wait_until("the denial", || {
        a.counters().unwrap().direct.denied_policy == 1
    });
    send_range(a, B, 10..20, 8, None);
    expect_in_order(&at_b, 10..20);
    let c = a.counters().unwrap().direct;
    assert_eq!(c.requests_sent, 1, "{c:?}");
    assert!(c.denial_cache_hits >= 10, "{c:?}");
    assert_eq!(c.links_open, 0);
    assert_eq!(dvm[B as usize].counters().unwrap().direct.denials_sent, 1);
}

#[test]
fn crossed_requests_end_with_one_link_used_both_ways() {
    let dvm = dvm(|_| RouteSetting::Direct);
    let (a, b) = (&dvm[A as usize], &dvm[B as usize]);
    let at_b = sequence_receiver(&dvm, B, A);
    let at_a = sequence_receiver(&dvm, A, B);
    std::thread::scope(|s| {
        s.spawn(|| send_range(a, B, 0..2000, 64, None));
        s.spawn(|| send_range(b, A, 0..2000, 64, None));
    });
    expect_in_order(&at_b, 0..2000);
    expect_in_order(&at_a, 0..2000);
    wait_until("one link at both ends", || open_at_both_ends(a, b));
    let (ca, cb) = (a.counters().unwrap().direct, b.counters().unwrap().direct);
    assert_eq!(ca.grants + cb.grants, 1, "{ca:?} {cb:?}");
    let before = relayed(&dvm);
    send_range(a, B, 2000..2500, 64, None);
    send_range(b, A, 2000..2500, 64, None);
    expect_in_order(&at_b, 2000..2500);
    expect_in_order(&at_a, 2000..2500);
    assert_eq!(relayed(&dvm), before, "a message took the tree");
}

#[test]
fn a_per_send_route_asks_where_the_setting_would_not() {
    let dvm = dvm(|r| {
        if r == A {
            RouteSetting::Tree
        } else {
            RouteSetting::Auto
        }
    });
    let a = &dvm[A as usize];
    let at_b = sequence_receiver(&dvm, B, A);
    send_range(a, B, 0..5, 8, Some(Route::Tree));
    expect_in_order(&at_b, 0..5);
    assert_eq!(a.counters().unwrap().direct.requests_sent, 0);
    send_range(a, B, 5..10, 8, Some(Route::Direct));
    expect_in_order(&at_b, 5..10);
    let b = &dvm[B as usize];
    wait_until("the link", || open_at_both_ends(a, b));
    // A `Tree` send still takes the open link: it must not overtake the ones before it.
    let before = relayed(&dvm);
    send_range(a, B, 10..20, 8, Some(Route::Tree));
    expect_in_order(&at_b, 10..20);
    assert_eq!(relayed(&dvm), before);
}

#[test]
fn the_death_of_a_direct_peer_ends_its_link_and_a_pending_request() {
    let dvm = dvm(|_| RouteSetting::Direct);
    let a = &dvm[A as usize];
    let at_b = sequence_receiver(&dvm, B, A);
    send_range(a, B, 0..100, 8, None);
    expect_in_order(&at_b, 0..100);
    wait_until("the link", || a.counters().unwrap().direct.links_open == 1);
    dvm[B as usize].abort();
    wait_until("the death of rank B to be known at A", || {
        a.counters().unwrap().failed.contains(&B)
    });
    assert_eq!(a.counters().unwrap().direct.links_open, 0);
    // Another leaf keeps working through the tree and by a new link.
    let at_13 = sequence_receiver(&dvm, 13, A);
    send_range(a, 13, 0..100, 8, None);
    expect_in_order(&at_13, 0..100);
}

#[test]
fn reliable_messages_take_an_open_link_in_order_exactly_once() {
    let dvm = dvm(|_| RouteSetting::Direct);
    let (a, b) = (&dvm[A as usize], &dvm[B as usize]);
    let at_b = sequence_receiver(&dvm, B, A);
    // The first reliable messages ask for the link and take the tree meanwhile.
    let reliable = |d: &Daemon, to: u32, range: std::ops::Range<u64>| {
        for n in range {
            d.send_reliable_wait(to, TAG, n.to_be_bytes().to_vec(), HANG_GUARD)
                .unwrap_or_else(|e| panic!("reliable {n}: {e}"));
        }
    };
    reliable(a, B, 0..50);
    expect_in_order(&at_b, 0..50);
    wait_until("the link to open at both ends", || open_at_both_ends(a, b));
    // On the link now: the origin counts them as direct, and no hop relays any.
    let hops =
        |dvm: &[Daemon]| -> u64 { dvm.iter().map(|d| d.counters().unwrap().relm_relayed).sum() };
    let (before, relayed) = (a.counters().unwrap().direct.direct_messages, hops(&dvm));
    assert!(relayed > 0, "the first ones took the tree");
    reliable(a, B, 50..550);
    expect_in_order(&at_b, 50..550);
    assert_eq!(a.counters().unwrap().direct.direct_messages, before + 500);
    assert_eq!(
        hops(&dvm),
        relayed,
        "a hop relayed a reliable message meant for the link"
    );
    assert!(at_b.try_recv().is_err(), "a duplicate arrived");
    assert_eq!(b.counters().unwrap().relm_duplicates, 0);
}

#[test]
fn a_full_table_evicts_its_idle_link_gracefully_and_nothing_is_reordered() {
    // Rank A has room for one link; a link idle for 50 ms may be evicted.
    let dvm = start_dvm_with(SIZE, |r| {
        let mut c = loopback_config(2);
        c.route = RouteSetting::Direct;
        if r == A {
            c.direct_links_max = 1;
            c.direct_auto_window_ms = 50;
        }
        c
    });
    let (a, b) = (&dvm[A as usize], &dvm[B as usize]);
    const C: u32 = 13;
    let (at_b, at_a, at_c) = (
        sequence_receiver(&dvm, B, A),
        sequence_receiver(&dvm, A, B),
        sequence_receiver(&dvm, C, A),
    );
    send_range(a, B, 0..100, 64, None);
    expect_in_order(&at_b, 0..100);
    wait_until("the link to B at both ends", || open_at_both_ends(a, b));
    std::thread::sleep(Duration::from_millis(100));
    // Asking C for a link evicts the idle one to B; traffic both ways goes on meanwhile.
    send_range(a, C, 0..10, 64, None);
    send_range(a, B, 100..300, 64, None);
    send_range(b, A, 0..300, 64, None);
    expect_in_order(&at_c, 0..10);
    expect_in_order(&at_b, 100..300);
    expect_in_order(&at_a, 0..300);
    wait_until("the link to C, and none to B", || {
        let (ca, cb) = (a.counters().unwrap().direct, b.counters().unwrap().direct);
        ca.links_evicted == 1 && ca.links_open == 1 && cb.links_open == 0
    });
    send_range(a, B, 300..400, 64, None);
    send_range(b, A, 300..400, 64, None);
    expect_in_order(&at_b, 300..400);
    expect_in_order(&at_a, 300..400);
    assert!(
        at_b.try_recv().is_err() && at_a.try_recv().is_err(),
        "a duplicate arrived"
    );
}
