//! Rejoin (issue "Rejoin and grow") on the in-memory network: a daemon restarted under a dead
//! rank is admitted back by rank 0, every survivor un-repairs to the tree that would exist had
//! it never failed, and messages flow to and from the new incarnation; refusals are clear.

use super::*;
use crate::routed::RoutingState;

fn uri(rank: Rank) -> ContactUri {
    ContactUri {
        dvm_id: "tbon".into(),
        rank,
        addrs: vec![format!("127.0.0.1:{}", 4000 + rank).parse().unwrap()],
    }
}

/// Rank `r` dies: its frames stop, every living neighbour finds it unreachable, and the
/// confirmations spread.
fn kill(net: &mut Net, r: Rank) {
    net.alive[r as usize] = false;
    let now = net.now;
    for n in 0..net.nodes.len() as Rank {
        if net.alive[n as usize] && net.nodes[n as usize].is_neighbour(r) {
            net.node(n).handle_unreachable(now, r, 5);
            net.collect(n);
        }
    }
    net.run();
}

/// A new process for rank `r` (incarnation `incarnation`) asks to rejoin.
fn restart(net: &mut Net, r: Rank, incarnation: u64) {
    let size = net.nodes.len() as u32;
    let radix = net.nodes[0].routing().radix();
    restart_as(net, r, incarnation, size, radix);
}

/// [`restart`], the new process started with `size` and `radix`.
fn restart_as(net: &mut Net, r: Rank, incarnation: u64, size: u32, radix: u32) {
    let cfg = NodeConfig {
        heartbeat: None,
        wired_at_start: false,
        uri: Some(uri(r)),
        hnp: Some(uri(0)),
        incarnation,
        rejoin: true,
        ..NodeConfig::new(r, size, radix)
    };
    let mut n = Node::new(cfg).unwrap();
    n.post(Peer::Any, TAG, true).unwrap();
    n.start(net.now);
    net.nodes[r as usize] = n;
    net.alive[r as usize] = true;
    net.collect(r);
}

fn send(net: &mut Net, from: Rank, to: Rank, reliable: bool, token: u64, text: &'static str) {
    let now = net.now;
    let payload = Bytes::from_static(text.as_bytes());
    let c = if reliable {
        Command::SendReliable {
            dst: to,
            tag: TAG,
            payload,
            token: Some(token),
        }
    } else {
        Command::Send {
            dst: to,
            tag: TAG,
            payload,
            token: Some(token),
            route: None,
        }
    };
    net.node(from).handle_command(now, c).unwrap();
    net.collect(from);
}

fn delivered(net: &Net, at: Rank, from: Rank, text: &str) -> usize {
    net.delivered
        .iter()
        .filter(|(r, m)| *r == at && m.origin == from && m.payload == text.as_bytes())
        .count()
}

/// Every living daemon's tree is the one with `failed` failed, computed afresh.
fn assert_tree(net: &Net, failed: &[Rank]) {
    let n = &net.nodes[0];
    let mut fresh = RoutingState::new(n.routing().radix(), n.size(), 0).unwrap();
    if !failed.is_empty() {
        fresh
            .fail(failed, crate::routed::Scope::Global, None)
            .unwrap();
    }
    for r in 0..net.nodes.len() as Rank {
        if !net.alive[r as usize] {
            continue;
        }
        let want = fresh.as_seen_by(r).unwrap();
        let got = net.nodes[r as usize].routing();
        assert_eq!(got.parent(), want.parent(), "rank {r}'s parent");
        assert_eq!(got.children(), want.children(), "rank {r}'s children");
        assert_eq!(
            got.failed().collect::<Vec<_>>(),
            failed.to_vec(),
            "rank {r}'s failed set"
        );
    }
}

/// An interior daemon dies (its heir takes its slot), restarts, is admitted back, and the tree
/// is again the failure-free one; plain and reliable messages cross it both ways, a broadcast
/// reaches it once, and it never delivers what was broadcast before its return.
#[test]
fn a_restarted_interior_daemon_takes_back_its_slot() {
    // Radix 2, 15 daemons; rank 1 is interior, with two children.
    let kids = RoutingState::new(2, 15, 1).unwrap().children().to_vec();
    let (a, b) = (kids[0], kids[1]);
    let mut net = Net::new(15, 2, |c| c.incarnation = 1);
    kill(&mut net, 1);
    assert_tree(&net, &[1]);
    assert_eq!(net.nodes[0].epoch(), 1);
    // A broadcast while it is dead: the new incarnation must never deliver it.
    let now = net.now;
    net.node(5)
        .handle_command(
            now,
            Command::Broadcast {
                tag: TAG,
                payload: Bytes::from_static(b"before"),
                token: Some(50),
            },
        )
        .unwrap();
    net.collect(5);
    net.run();

    restart(&mut net, 1, 2);
    net.run();
    assert!(net.nodes[1].is_wired(), "rank 1 was never welcomed");
    assert!(
        net.nodes[1].is_settled(),
        "rank 1 was never settled: rank 0 completed {}, rank 1 expects {}, epochs {:?}",
        net.nodes[0].xcast().completed(),
        net.nodes[1].xcast().next_expected(),
        net.nodes.iter().map(|n| n.epoch()).collect::<Vec<_>>()
    );
    assert_tree(&net, &[]);
    assert_eq!(net.nodes[0].epoch(), 2);
    assert_eq!(net.nodes[1].epoch(), 2);
    assert_eq!(net.nodes[0].counters().rejoins, 1);
    assert_eq!(delivered(&net, 1, 5, "before"), 0);

    // Through its slot both ways, and from and to it.
    send(&mut net, a, b, false, 1, "a to b");
    send(&mut net, 9, 2, true, 2, "9 to 2");
    send(&mut net, 1, 14, true, 3, "1 to 14");
    send(&mut net, 14, 1, false, 4, "14 to 1");
    send(&mut net, 8, 1, true, 5, "8 to 1");
    net.run();
    for (at, from, text) in [
        (b, a, "a to b"),
        (2, 9, "9 to 2"),
        (14, 1, "1 to 14"),
        (1, 14, "14 to 1"),
        (1, 8, "8 to 1"),
    ] {
        assert_eq!(delivered(&net, at, from, text), 1, "{text}");
    }
    // The plain message between its children went through rank 1 again.
    assert!(
        net.seen
            .iter()
            .any(|(f, t, h)| *f == 1 && *t == b && h.kind == Kind::Msg && h.origin == a),
        "rank 1 did not relay {a} -> {b}"
    );

    let now = net.now;
    net.node(12)
        .handle_command(
            now,
            Command::Broadcast {
                tag: TAG,
                payload: Bytes::from_static(b"after"),
                token: Some(51),
            },
        )
        .unwrap();
    net.collect(12);
    net.run();
    for r in 0..15 {
        assert_eq!(
            delivered(&net, r, 12, "after"),
            1,
            "rank {r} and the broadcast"
        );
    }
    assert!(
        net.done
            .iter()
            .all(|(_, _, result)| result.is_ok() || result == &Err(SendError::NodeDown(1))),
        "{:?}",
        net.done
    );
}

/// A frame of the dead incarnation that arrives after the new one was admitted is dropped.
#[test]
fn frames_of_the_dead_incarnation_are_dropped_after_a_rejoin() {
    let mut net = Net::new(7, 2, |c| c.incarnation = 1);
    kill(&mut net, 2);
    restart(&mut net, 2, 9);
    net.run();
    assert!(net.nodes[2].is_settled());
    let now = net.now;
    let h = Header {
        kind: Kind::Msg,
        origin: 2,
        dst: 0,
        tag: TAG,
        epoch: 1,
        seq: 0,
        len: 3,
        lives: 0,
    };
    net.node(0)
        .handle_frame(now, 2, h, Bytes::from_static(b"old"))
        .unwrap();
    net.collect(0);
    assert_eq!(delivered(&net, 0, 2, "old"), 0);
    assert_eq!(net.nodes[0].counters().dropped_old_incarnation, 1);
}

/// Refusals: a rank that is alive, or an incarnation that is not newer than the dead one's,
/// is refused with its reason and the daemon stops; nothing changes in the DVM.
#[test]
fn a_rejoin_is_refused_for_a_live_rank_or_an_old_incarnation() {
    let mut net = Net::new(7, 2, |c| c.incarnation = 5);
    // Rank 0 has heard from rank 3's first life (incarnation 5).
    let now = net.now;
    net.node(0).handle_link_up(now, 3, 5, false);
    // Rank 4 is alive: a second daemon claiming it is refused.
    let survivor = std::mem::replace(
        &mut net.nodes[4],
        Node::new(NodeConfig::new(4, 7, 2)).unwrap(),
    );
    restart(&mut net, 4, 6);
    net.run();
    let reason = stop_reason(&mut net.nodes[4]).or_else(|| {
        net.stops
            .iter()
            .find(|(r, _)| *r == 4)
            .map(|(_, s)| s.clone())
    });
    match reason {
        Some(StopReason::Fatal(why)) => assert!(why.contains("alive"), "{why}"),
        other => panic!("rank 4's impostor was not refused: {other:?}"),
    }
    net.nodes[4] = survivor;
    assert_tree(&net, &[]);
    assert_eq!(net.nodes[0].counters().rejoins_refused, 1);

    // Rank 3 dies; a daemon with its old incarnation asks back.
    kill(&mut net, 3);
    restart(&mut net, 3, 5);
    net.run();
    match net
        .stops
        .iter()
        .find(|(r, _)| *r == 3)
        .map(|(_, s)| s.clone())
    {
        Some(StopReason::Fatal(why)) => assert!(why.contains("incarnation"), "{why}"),
        other => panic!("rank 3's old incarnation was not refused: {other:?}"),
    }
    net.alive[3] = false;
    assert_tree(&net, &[3]);
    // The next incarnation is admitted.
    restart(&mut net, 3, 7);
    net.run();
    assert!(net.nodes[3].is_settled());
    assert_tree(&net, &[]);
}

/// From an outside-in review of the command line: a second daemon started for a living rank
/// without `rejoin` (a launcher that started a rank twice) sent its wire-up report to a wired
/// rank 0, which ignored it; it waited twice the wire-up timeout and stopped saying "no contact
/// table". Rank 0 now refuses it as it refuses a rejoin of a living rank, and it stops at once;
/// the report of the rank's own daemon (the incarnation met at wire-up) is not refused.
#[test]
fn a_second_daemon_for_a_living_rank_is_refused_at_once() {
    let mut net = Net::new(7, 2, |c| c.incarnation = 5);
    let now = net.now;
    net.node(0).handle_link_up(now, 4, 5, false);
    let own = Header {
        kind: Kind::Msg,
        origin: 4,
        dst: 0,
        tag: crate::node::wireup::TAG_WIREUP_REPORT,
        epoch: 5,
        seq: 0,
        len: 0,
        lives: 0,
    };
    let report = Bytes::from(uri(4).to_string());
    net.node(0)
        .handle_frame(
            now,
            4,
            Header {
                len: report.len() as u32,
                ..own
            },
            report.clone(),
        )
        .unwrap();
    net.collect(0);
    assert_eq!(
        net.nodes[0].counters().rejoins_refused,
        0,
        "its own report again"
    );
    let survivor = std::mem::replace(
        &mut net.nodes[4],
        Node::new(NodeConfig {
            heartbeat: None,
            wired_at_start: false,
            uri: Some(uri(4)),
            hnp: Some(uri(0)),
            incarnation: 6,
            ..NodeConfig::new(4, 7, 2)
        })
        .unwrap(),
    );
    net.node(4).start(now);
    net.collect(4);
    net.run();
    match net
        .stops
        .iter()
        .find(|(r, _)| *r == 4)
        .map(|(_, s)| s.clone())
    {
        Some(StopReason::Fatal(why)) => {
            assert!(
                why.contains("wire-up report") && why.contains("alive"),
                "{why}"
            )
        }
        other => panic!("the second daemon for rank 4 was not refused: {other:?}"),
    }
    net.nodes[4] = survivor;
    assert_tree(&net, &[]);
    assert_eq!(net.nodes[0].counters().rejoins_refused, 1);
}

/// From an outside-in review: a daemon restarted with another radix or size than the DVM's
/// was admitted, and then routed by a tree no other daemon had. Rank 0 refuses it, saying why;
/// started as the DVM was, it is admitted.
#[test]
fn a_rejoin_with_another_radix_or_size_is_refused() {
    let mut net = Net::new(7, 2, |c| c.incarnation = 1);
    kill(&mut net, 5);
    for (incarnation, size, radix) in [(2, 7, 4), (3, 9, 2)] {
        restart_as(&mut net, 5, incarnation, size, radix);
        net.run();
        match net
            .stops
            .iter()
            .rev()
            .find(|(r, _)| *r == 5)
            .map(|(_, s)| s.clone())
        {
            Some(StopReason::Fatal(why)) => {
                assert!(why.contains("another size or radix"), "{why}")
            }
            other => panic!("size {size}, radix {radix} was not refused: {other:?}"),
        }
        net.alive[5] = false;
        assert_tree(&net, &[5]);
    }
    assert_eq!(net.nodes[0].counters().rejoins_refused, 2);
    restart(&mut net, 5, 4);
    net.run();
    assert!(net.nodes[5].is_settled());
    assert_tree(&net, &[]);
}

/// News of the old incarnation's death that reaches rank 0 after the rejoin (a report sent in
/// an earlier epoch) does not kill the new one.
#[test]
fn a_stale_report_does_not_fail_the_new_incarnation() {
    let mut net = Net::new(7, 2, |c| c.incarnation = 1);
    kill(&mut net, 5);
    restart(&mut net, 5, 2);
    net.run();
    assert_tree(&net, &[]);
    let stale = crate::faults::notice::Report {
        epoch: 1,
        failed: vec![5],
        lives: vec![0],
    }
    .encode();
    let now = net.now;
    net.node(0).on_report(now, 6, &stale);
    net.collect(0);
    net.run();
    assert_tree(&net, &[]);
    // A report from the current epoch is news.
    let fresh = crate::faults::notice::Report {
        epoch: 2,
        failed: vec![5],
        lives: vec![1],
    }
    .encode();
    net.alive[5] = false;
    net.node(0).on_report(now, 6, &fresh);
    net.collect(0);
    net.run();
    assert_tree(&net, &[5]);
}

/// A DVM started with room to grow (`initial_size` 9 of 15): ranks 9 to 14 are absent from
/// the start (failed in epoch 0, as wire-up leaves ranks that never reported); two of them join
/// as a restarted daemon rejoins, the tree becomes the one with only the still-absent ranks
/// failed, and plain and reliable messages flow to and from the new ranks.
#[test]
fn new_ranks_join_a_dvm_started_with_room_to_grow() {
    let mut net = Net::new(15, 2, |c| c.initial_size = 9);
    for r in 9..15 {
        net.alive[r] = false;
    }
    net.run();
    assert_tree(&net, &[9, 10, 11, 12, 13, 14]);
    assert_eq!(net.nodes[0].epoch(), 0);
    restart(&mut net, 12, 2);
    net.run();
    restart(&mut net, 9, 2);
    net.run();
    for r in [9, 12] {
        assert!(net.nodes[r as usize].is_settled(), "rank {r} never settled");
    }
    assert_tree(&net, &[10, 11, 13, 14]);
    assert_eq!(net.nodes[0].epoch(), 2);
    assert_eq!(net.nodes[0].counters().rejoins, 2);
    send(&mut net, 12, 3, true, 1, "12 to 3");
    send(&mut net, 3, 12, true, 2, "3 to 12");
    send(&mut net, 9, 12, false, 3, "9 to 12");
    send(&mut net, 0, 9, false, 4, "0 to 9");
    net.run();
    for (at, from, text) in [
        (3, 12, "12 to 3"),
        (12, 3, "3 to 12"),
        (12, 9, "9 to 12"),
        (9, 0, "0 to 9"),
    ] {
        assert_eq!(delivered(&net, at, from, text), 1, "{text}");
    }
}

/// Seventy daemons join at once: rank 0 admits `REJOIN_IN_PROGRESS_MAX` (64) and answers the
/// others `Busy`. They stopped (a fatal error, to be started again by hand); they ask again
/// now, and every one is admitted.
#[test]
fn daemons_refused_busy_ask_again_and_are_admitted() {
    let mut net = Net::new(80, 4, |c| c.initial_size = 10);
    for r in 10..80 {
        net.alive[r] = false;
    }
    net.run();
    for r in 10..80 {
        restart(&mut net, r, 2);
    }
    net.run();
    assert_eq!(net.nodes[0].counters().rejoins_refused, 6);
    for _ in 0..10 {
        net.advance(crate::limits::REJOIN_RETRY_MS);
        net.run();
    }
    assert_eq!(net.stops, vec![], "a daemon refused busy stopped");
    for r in 10..80 {
        assert!(net.nodes[r].is_settled(), "rank {r} never settled");
    }
    assert_tree(&net, &[]);
    assert_eq!(net.nodes[0].counters().rejoins, 70);
}

/// A daemon that joins after more restores than a welcome lists (`REJOIN_RESTORES_TOLD_MAX`)
/// knows the lives of the earlier joiners: it took them for their first life, and messages
/// between them were dropped both ways (seed 1 of `all` at 600 daemons; regression seed 27).
#[test]
fn a_daemon_that_joins_after_many_knows_the_lives_of_the_first() {
    let told = crate::limits::REJOIN_RESTORES_TOLD_MAX as u32;
    let size = told + 12;
    let mut net = Net::new(size, 32, |c| c.initial_size = 2);
    for r in 2..size {
        net.alive[r as usize] = false;
    }
    net.run();
    for first in (2..size).step_by(32) {
        for r in first..(first + 32).min(size) {
            restart(&mut net, r, 2);
        }
        net.run();
    }
    let last = size - 1;
    assert!(net.nodes[last as usize].is_settled());
    assert_eq!(net.nodes[0].counters().rejoins, u64::from(size - 2));
    send(&mut net, last, 2, true, 1, "last to first");
    send(&mut net, 2, last, true, 2, "first to last");
    send(&mut net, last, 3, false, 3, "last to second");
    net.run();
    assert_eq!(delivered(&net, 2, last, "last to first"), 1);
    assert_eq!(delivered(&net, last, 2, "first to last"), 1);
    assert_eq!(delivered(&net, 3, last, "last to second"), 1);
    assert_eq!(net.nodes[last as usize].counters().dropped_other_life, 0);
}

/// From an outside-in review: a whole allocation started at once, its joiners among the
/// initial daemons, lost every joiner that asked before rank 0 had wired up (refused "not
/// ready", a fatal stop). Such a daemon asks again, and is admitted once wire-up ends.
#[test]
fn a_join_during_wire_up_asks_again_and_is_admitted_after_it() {
    let mut net = Net::new(8, 2, |c| {
        c.wired_at_start = false;
        c.initial_size = 4;
        c.uri = Some(uri(c.rank));
        c.hnp = Some(uri(0));
        c.wireup_timeout = Duration::from_secs(3);
    });
    // Rank 3, an initial daemon, is late: rank 0 is still wiring up when rank 6 asks.
    for r in [3, 4, 5, 6, 7] {
        net.alive[r] = false;
    }
    net.run();
    restart(&mut net, 6, 2);
    net.run();
    assert!(!net.nodes[0].is_wired());
    assert!(net.nodes[0].counters().rejoins_refused >= 1);
    for _ in 0..8 {
        net.advance(crate::limits::REJOIN_RETRY_MS);
        net.run();
    }
    assert!(net.nodes[0].is_wired());
    assert!(net.stops.iter().all(|(r, _)| *r != 6), "{:?}", net.stops);
    assert!(net.nodes[6].is_settled(), "rank 6 never settled");
}
