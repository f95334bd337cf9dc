use super::*;
use crate::grpcomm::testnet::{Repairs, Rng, Sim};
use crate::routed::Scope;

fn core(radix: u32, size: u32, me: Rank) -> Xcast {
    Xcast::new(
        &RoutingState::new(radix, size, 0)
            .unwrap()
            .as_seen_by(me)
            .unwrap(),
    )
}

fn op(id: u64) -> Op {
    Op::whole(id, 0, id, 100, Bytes::from(format!("op{id}")))
}

fn drain_transmits(x: &mut Xcast) -> Vec<Transmit<XcastMsg>> {
    std::iter::from_fn(|| x.poll_notice().or_else(|| x.poll_transmit())).collect()
}

fn drain_events(x: &mut Xcast) -> Vec<XcastEvent> {
    std::iter::from_fn(|| x.poll_event()).collect()
}

fn delivered_ids(events: &[XcastEvent]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|e| match e {
            XcastEvent::Deliver { op, .. } => Some(*op),
            _ => None,
        })
        .collect()
}

#[test]
fn a_lone_rank_zero_delivers_and_completes() {
    let mut x = core(2, 1, 0);
    let request = x.originate(100, Bytes::from_static(b"hi")).unwrap();
    assert_eq!(drain_transmits(&mut x), vec![]);
    let events = drain_events(&mut x);
    assert_eq!(
        events,
        vec![
            XcastEvent::Deliver {
                first: 1,
                op: 1,
                originator: 0,
                tag: 100,
                payload: Bytes::from_static(b"hi"),
                parts: vec![],
            },
            XcastEvent::Completed { request, op: 1 }
        ]
    );
    assert_eq!(x.retained(), 0);
}

#[test]
fn forwards_before_delivering_and_acks_cumulatively() {
    // Radix 2, size 4: 0 -> {1, 2}, 1 -> {3}.
    let mut one = core(2, 4, 1);
    one.handle_msg(0, XcastMsg::Op(op(1)));
    one.handle_msg(0, XcastMsg::Op(op(2)));
    let sent = drain_transmits(&mut one);
    assert_eq!(
        sent,
        vec![
            Transmit {
                to: 3,
                msg: XcastMsg::Op(op(1))
            },
            Transmit {
                to: 3,
                msg: XcastMsg::Op(op(2))
            }
        ]
    );
    assert_eq!(delivered_ids(&drain_events(&mut one)), [1, 2]);
    // Its child has acked nothing: no ack yet, both ops kept.
    assert_eq!(drain_transmits(&mut one), vec![]);
    assert_eq!(one.retained(), 2);
    one.handle_msg(3, XcastMsg::Ack { upto: 2, digest: 0 });
    assert_eq!(
        drain_transmits(&mut one),
        vec![Transmit {
            to: 0,
            msg: XcastMsg::Ack { upto: 2, digest: 0 }
        }]
    );
    assert_eq!(one.retained(), 0);
}

fn split_core(me: Rank, part_bytes: usize) -> Xcast {
    let routing = RoutingState::new(2, 4, 0).unwrap().as_seen_by(me).unwrap();
    Xcast::with_limits(
        &routing,
        XcastLimits {
            part_bytes,
            ..XcastLimits::default()
        },
    )
}

fn ops_to(sent: &[Transmit<XcastMsg>], to: Rank) -> Vec<Op> {
    sent.iter()
        .filter(|t| t.to == to)
        .filter_map(|t| match &t.msg {
            XcastMsg::Op(op) => Some(op.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_split_broadcast_is_forwarded_part_by_part_and_delivered_whole() {
    // Radix 2, size 4: 0 -> {1, 2}, 1 -> {3}. Rank 0 splits 10 bytes into parts of 4.
    let mut zero = split_core(0, 4);
    let request = zero
        .originate(100, Bytes::from_static(b"0123456789"))
        .unwrap();
    let sent = drain_transmits(&mut zero);
    let parts = ops_to(&sent, 1);
    assert_eq!(parts, ops_to(&sent, 2));
    let shape: Vec<(u64, u32, u32, &[u8])> = parts
        .iter()
        .map(|o| (o.id, o.part, o.parts, o.payload.as_ref()))
        .collect();
    assert_eq!(
        shape,
        [
            (1, 0, 3, &b"0123"[..]),
            (2, 1, 3, &b"4567"[..]),
            (3, 2, 3, &b"89"[..])
        ]
    );
    assert_eq!(zero.stats().split, 1);
    // A relay forwards each part as it comes and delivers only the whole payload.
    let mut one = split_core(1, 4);
    for (i, part) in parts.iter().enumerate() {
        one.handle_msg(0, XcastMsg::Op(part.clone()));
        assert_eq!(
            ops_to(&drain_transmits(&mut one), 3),
            std::slice::from_ref(part)
        );
        let events = drain_events(&mut one);
        if i + 1 < parts.len() {
            assert_eq!(events, vec![], "part {i} delivered alone");
        } else {
            assert_eq!(
                events,
                vec![XcastEvent::Deliver {
                    first: 1,
                    op: 3,
                    originator: 0,
                    tag: 100,
                    payload: Bytes::from_static(b"0123456789"),
                    parts: parts.iter().map(|o| o.payload.clone()).collect(),
                }]
            );
            // The parts handed over are the received ones (shared), not copies.
            let [XcastEvent::Deliver { parts: kept, .. }] = &events[..] else {
                unreachable!()
            };
            for (kept, part) in kept.iter().zip(&parts) {
                assert_eq!(kept.as_ptr(), part.payload.as_ptr());
            }
        }
    }
    assert_eq!(one.next_expected(), 4);
    // Acks move a whole broadcast; it completes with its last part.
    drain_events(&mut zero);
    zero.handle_msg(1, XcastMsg::Ack { upto: 3, digest: 0 });
    assert_eq!(drain_events(&mut zero), vec![]);
    zero.handle_msg(2, XcastMsg::Ack { upto: 3, digest: 0 });
    assert_eq!(
        drain_events(&mut zero),
        vec![XcastEvent::Completed { request, op: 3 }]
    );
    assert_eq!(zero.retained(), 0);
    // A small payload is not split; part size 0 never splits.
    let mut whole = split_core(0, 0);
    whole.originate(100, Bytes::from(vec![7; 100])).unwrap();
    assert_eq!(ops_to(&drain_transmits(&mut whole), 1).len(), 1);
}

#[test]
fn parts_are_at_most_the_bound_and_broken_parts_are_skipped() {
    // 100 bytes in parts of 1 with at most 64 parts: 50 parts of 2.
    let mut zero = split_core(0, 1);
    zero.originate(100, Bytes::from(vec![1; 100])).unwrap();
    let parts = ops_to(&drain_transmits(&mut zero), 1);
    assert_eq!(parts.len(), 50);
    assert!(parts.iter().all(|p| p.payload.len() == 2 && p.parts == 50));
    // A part without the start of its broadcast (never sent by a correct rank 0) is skipped,
    // and what follows is delivered.
    let mut three = split_core(3, 1);
    let stray = Op {
        id: 1,
        originator: 0,
        request: 1,
        tag: 100,
        part: 1,
        parts: 2,
        payload: Bytes::from_static(b"x"),
    };
    three.handle_msg(1, XcastMsg::Op(stray));
    three.handle_msg(
        1,
        XcastMsg::Op(Op::whole(2, 0, 2, 100, Bytes::from_static(b"y"))),
    );
    assert_eq!(delivered_ids(&drain_events(&mut three)), [2]);
    assert_eq!(three.stats().broken_parts, 1);
}

#[test]
fn ignores_strangers_duplicates_and_holds_gaps() {
    let mut three = core(2, 4, 3);
    three.handle_msg(0, XcastMsg::Op(op(1))); // not its parent
    assert_eq!(three.stats().not_from_parent, 1);
    three.handle_msg(1, XcastMsg::Op(op(2))); // ahead: held
    assert_eq!(drain_events(&mut three), vec![]);
    three.handle_msg(1, XcastMsg::Op(op(2)));
    assert_eq!(three.stats().duplicates, 1);
    three.handle_msg(1, XcastMsg::Op(op(1)));
    assert_eq!(delivered_ids(&drain_events(&mut three)), [1, 2]);
    three.handle_msg(1, XcastMsg::Op(op(1)));
    assert_eq!(three.stats().duplicates, 2);
    assert_eq!(delivered_ids(&drain_events(&mut three)), Vec::<u64>::new());
    // Leaf: nothing is kept once delivered; a Done for an unknown request is ignored.
    assert_eq!(three.retained(), 0);
    three.handle_msg(0, XcastMsg::Done { request: 9, op: 1 });
    assert_eq!(drain_events(&mut three), vec![]);
}

fn op_ids(ts: &[Transmit<XcastMsg>]) -> Vec<u64> {
    ts.iter()
        .filter_map(|t| match &t.msg {
            XcastMsg::Op(op) => Some(op.id),
            _ => None,
        })
        .collect()
}

fn completed_requests(events: &[XcastEvent]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|e| match e {
            XcastEvent::Completed { request, .. } => Some(*request),
            _ => None,
        })
        .collect()
}

fn request(originator: Rank, request: u64) -> XcastMsg {
    XcastMsg::Request(Request {
        originator,
        request,
        tag: 100,
        payload: Bytes::from_static(b"r"),
    })
}

#[test]
fn rank_zero_holds_beyond_the_window_and_refuses_only_when_holding_is_full() {
    // Rank 0 with one child (rank 1) that acks only when told: operations stay in flight.
    let limits = XcastLimits {
        inflight: 2,
        held: 2,
        ..XcastLimits::default()
    };
    let mut zero = Xcast::with_limits(&RoutingState::new(2, 2, 0).unwrap(), limits);
    assert_eq!(zero.originate(100, Bytes::from_static(b"a")), Ok(1));
    assert_eq!(zero.originate(100, Bytes::from_static(b"b")), Ok(2));
    assert_eq!(op_ids(&drain_transmits(&mut zero)), [1, 2]);
    // Beyond the window: held, not numbered, nothing sent.
    assert_eq!(zero.originate(100, Bytes::from_static(b"c")), Ok(3));
    assert_eq!(zero.held(), 1);
    assert_eq!(drain_transmits(&mut zero), vec![]);
    // A request from rank 1 waits behind it, in arrival order.
    assert_eq!(zero.hold_room().0, 1);
    zero.handle_msg(1, request(1, 1));
    assert_eq!(zero.held(), 2);
    assert_eq!(zero.hold_room().0, 0);
    // Holding is full: rank 0's own broadcast is refused locally.
    assert_eq!(
        zero.originate(100, Bytes::from_static(b"d")),
        Err(XcastError::Busy)
    );
    // A request naming another originator is ignored.
    zero.handle_msg(1, request(0, 2));
    assert_eq!(zero.held(), 2);
    // The child acks both: they complete, and the held ones are numbered in order.
    drain_events(&mut zero);
    zero.handle_msg(1, XcastMsg::Ack { upto: 2, digest: 0 });
    assert_eq!(completed_requests(&drain_events(&mut zero)), [1, 2]);
    assert_eq!(zero.held(), 0);
    let ts = drain_transmits(&mut zero);
    assert_eq!(op_ids(&ts), [3, 4]);
    drain_events(&mut zero);
    zero.handle_msg(1, XcastMsg::Ack { upto: 4, digest: 0 });
    assert_eq!(completed_requests(&drain_events(&mut zero)), [3]);
    // Rank 1's request completed too: its notice leaves by `poll_notice`.
    assert_eq!(
        zero.poll_notice(),
        Some(Transmit {
            to: 1,
            msg: XcastMsg::Done { request: 1, op: 4 }
        })
    );
    assert_eq!(zero.poll_notice(), None);
    assert_eq!(zero.stats().refused, 0);

    let mut one = core(2, 2, 1);
    for _ in 0..XCAST_ORIGINATE_MAX {
        one.originate(100, Bytes::new()).unwrap();
    }
    assert_eq!(
        one.originate(100, Bytes::new()),
        Err(XcastError::TooManyOutstanding)
    );
    // Requests are notices, not tree messages.
    assert!(
        one.poll_transmit()
            .is_none_or(|t| !matches!(t.msg, XcastMsg::Request(_)))
    );
    one.handle_msg(0, XcastMsg::Refused { request: 1 });
    assert_eq!(
        drain_events(&mut one),
        vec![XcastEvent::Refused { request: 1 }]
    );
    assert!(one.originate(100, Bytes::new()).is_ok());
    let big = Bytes::from(vec![0; XCAST_INFLIGHT_MAX_BYTES + 1]);
    assert!(matches!(
        one.originate(100, big),
        Err(XcastError::TooLarge { .. })
    ));
}

#[test]
fn an_originator_keeps_to_its_share_of_what_rank_zero_can_hold() {
    // 64 daemons: 4,096 / 64 = 64 each, so all of them at their bound fit in rank 0's queue.
    let share = XCAST_HELD_MAX / 64;
    assert!(share < XCAST_ORIGINATE_MAX);
    let mut five = core(4, 64, 5);
    for _ in 0..share {
        five.originate(100, Bytes::new()).unwrap();
    }
    assert_eq!(
        five.originate(100, Bytes::new()),
        Err(XcastError::TooManyOutstanding)
    );
    // Rank 0 keeps its own held broadcasts to the same share, with room still left for the
    // others' requests.
    let limits = XcastLimits {
        inflight: 1,
        ..XcastLimits::default()
    };
    let mut zero = Xcast::with_limits(&RoutingState::new(4, 64, 0).unwrap(), limits);
    for _ in 0..=share {
        zero.originate(100, Bytes::new()).unwrap();
    }
    assert_eq!(zero.held(), share);
    assert_eq!(zero.originate(100, Bytes::new()), Err(XcastError::Busy));
    assert_eq!(zero.hold_room().0, XCAST_HELD_MAX - share);
    zero.handle_msg(1, request(1, 1));
    assert_eq!(zero.held(), share + 1);
    assert_eq!(super::originate_share(256, 4_096, 2), 256);
    assert_eq!(super::originate_share(256, 4_096, 100_000), 1);
    assert_eq!(super::originate_share(256, 4_096, 0), 256);
}

#[test]
fn a_request_too_large_for_rank_zero_is_refused() {
    let limits = XcastLimits {
        payload: 4,
        ..XcastLimits::default()
    };
    let mut zero = Xcast::with_limits(&RoutingState::new(2, 2, 0).unwrap(), limits);
    zero.handle_msg(
        1,
        XcastMsg::Request(Request {
            originator: 1,
            request: 1,
            tag: 100,
            payload: Bytes::from_static(b"too large"),
        }),
    );
    assert_eq!(
        zero.poll_notice(),
        Some(Transmit {
            to: 1,
            msg: XcastMsg::Refused { request: 1 }
        })
    );
    assert_eq!(zero.stats().refused, 1);
    assert_eq!(zero.held(), 0);
}

#[test]
fn an_urgent_operation_passes_a_full_window() {
    // Rank 0 with one child that acks nothing: the window fills, then holding.
    let limits = XcastLimits {
        inflight: 2,
        held: 1,
        ..XcastLimits::default()
    };
    let mut zero = Xcast::with_limits(&RoutingState::new(2, 2, 0).unwrap(), limits);
    zero.originate(100, Bytes::from_static(b"a")).unwrap();
    zero.originate(100, Bytes::from_static(b"b")).unwrap();
    zero.originate(100, Bytes::from_static(b"c")).unwrap();
    assert_eq!(
        zero.originate(100, Bytes::from_static(b"d")),
        Err(XcastError::Busy)
    );
    let urgent = zero
        .originate_urgent(6, Bytes::from_static(b"confirm"))
        .unwrap();
    // The urgent one is numbered at once, ahead of the held one.
    let ts = drain_transmits(&mut zero);
    assert_eq!(op_ids(&ts), [1, 2, 3]);
    assert_eq!(delivered_ids(&drain_events(&mut zero)), [1, 2, 3]);
    assert_eq!(
        zero.originate(100, Bytes::from_static(b"d")),
        Err(XcastError::Busy)
    );
    // The child's ack completes all three; the held one goes out.
    zero.handle_msg(1, XcastMsg::Ack { upto: 3, digest: 0 });
    assert_eq!(completed_requests(&drain_events(&mut zero)), [1, 2, urgent]);
    assert_eq!(op_ids(&drain_transmits(&mut zero)), [4]);
    zero.originate(100, Bytes::from_static(b"d")).unwrap();
}

#[test]
fn at_the_retained_bound_drops_the_highest_and_fetches_it_again() {
    // A leaf that has missed operation 1 and holds everything after it.
    let mut one = core(2, 2, 1);
    let last = XCAST_RETAINED_MAX as u64 + 10;
    for id in 2..=last {
        one.handle_msg(0, XcastMsg::Op(op(id)));
    }
    assert_eq!(one.retained(), XCAST_RETAINED_MAX);
    assert_eq!(one.stats().dropped_full, 9);
    // Operation 1 evicts the highest held one.
    one.handle_msg(0, XcastMsg::Op(op(1)));
    assert_eq!(one.retained(), XCAST_RETAINED_MAX);
    // No room: no re-request yet (only the Ack of nothing is skipped too).
    assert_eq!(drain_transmits(&mut one), vec![]);
    let delivered = delivered_ids(&drain_events(&mut one));
    assert_eq!(
        delivered,
        (1..=XCAST_RETAINED_MAX as u64).collect::<Vec<_>>()
    );
    let sent = drain_transmits(&mut one);
    assert_eq!(
        sent.first(),
        Some(&Transmit {
            to: 0,
            msg: XcastMsg::Resume {
                from: XCAST_RETAINED_MAX as u64 + 1,
                digest: 0
            }
        })
    );
    // The replay completes the sequence.
    for id in XCAST_RETAINED_MAX as u64 + 1..=last {
        one.handle_msg(0, XcastMsg::Op(op(id)));
    }
    let delivered = delivered_ids(&drain_events(&mut one));
    assert_eq!(delivered.last(), Some(&last));
}

#[test]
fn a_new_child_is_synced_and_replayed() {
    // Radix 2, size 4: 0 -> {1, 2}, 1 -> {3}. Rank 1 dies; rank 3 is its heir under 0.
    let base = RoutingState::new(2, 4, 0).unwrap();
    let mut r0 = base.clone();
    let mut r3 = base.as_seen_by(3).unwrap();
    let mut zero = Xcast::new(&r0);
    let mut three = Xcast::new(&r3);
    zero.originate(100, Bytes::from_static(b"a")).unwrap();
    zero.originate(100, Bytes::from_static(b"b")).unwrap();
    drain_transmits(&mut zero); // to ranks 1 and 2; rank 1 dies with them
    drain_events(&mut zero);
    zero.handle_repair(&r0.fail(&[1], Scope::Global, None).unwrap());
    three.handle_repair(&r3.fail(&[1], Scope::Global, None).unwrap());
    let digest = zero.view.digest;
    let sent = drain_transmits(&mut zero);
    assert!(sent.contains(&Transmit {
        to: 3,
        msg: XcastMsg::Sync { digest }
    }));
    assert!(
        !sent
            .iter()
            .any(|t| t.to == 3 && matches!(t.msg, XcastMsg::Op(_)))
    );
    // An answer under another view does not open the session.
    zero.handle_msg(3, XcastMsg::Resume { from: 1, digest: 0 });
    assert!(drain_transmits(&mut zero).is_empty());
    three.handle_msg(0, XcastMsg::Sync { digest });
    let answer = drain_transmits(&mut three);
    assert_eq!(
        answer,
        vec![Transmit {
            to: 0,
            msg: XcastMsg::Resume { from: 1, digest }
        }]
    );
    zero.handle_msg(3, XcastMsg::Resume { from: 1, digest });
    let replay: Vec<u64> = drain_transmits(&mut zero)
        .into_iter()
        .filter_map(|t| match t.msg {
            XcastMsg::Op(op) if t.to == 3 => Some(op.id),
            _ => None,
        })
        .collect();
    assert_eq!(replay, [1, 2]);
}

#[test]
fn a_link_that_lost_messages_is_restated_from_both_ends() {
    // Radix 2, size 3: 0 -> {1, 2}. Everything rank 0 and rank 1 send each other is lost.
    let mut zero = core(2, 3, 0);
    let mut one = core(2, 3, 1);
    let mut two = core(2, 3, 2);
    for p in [b"a", b"b"] {
        zero.originate(100, Bytes::from_static(p)).unwrap();
    }
    for t in drain_transmits(&mut zero) {
        if t.to == 2 {
            two.handle_msg(0, t.msg);
        }
    }
    assert_eq!(delivered_ids(&drain_events(&mut zero)), [1, 2]);
    assert_eq!(delivered_ids(&drain_events(&mut two)), [1, 2]);
    for t in drain_transmits(&mut two) {
        zero.handle_msg(2, t.msg);
    }
    assert_eq!(zero.completed(), 0, "rank 1 has nothing");
    // Rank 1 learns nothing by itself; link-up at rank 0 restarts its stream, only to rank 1.
    zero.handle_link_up(1);
    let again = drain_transmits(&mut zero);
    assert!(again.iter().all(|t| t.to == 1), "{again:?}");
    assert_eq!(again.len(), 2);
    // Link-up at rank 1 re-states where it stands: a Resume from operation 1.
    one.handle_link_up(0);
    assert_eq!(
        drain_transmits(&mut one),
        vec![Transmit {
            to: 0,
            msg: XcastMsg::Resume { from: 1, digest: 0 }
        }]
    );
    for t in again {
        one.handle_msg(0, t.msg);
    }
    assert_eq!(delivered_ids(&drain_events(&mut one)), [1, 2]);
    for t in drain_transmits(&mut one) {
        zero.handle_msg(1, t.msg);
    }
    drain_transmits(&mut zero);
    let done: Vec<_> = drain_events(&mut zero);
    assert_eq!(zero.completed(), 2, "{done:?}");
    // A lost Ack is sent again on link-up, even without news.
    one.handle_link_up(0);
    let restated = drain_transmits(&mut one);
    assert!(restated.contains(&Transmit {
        to: 0,
        msg: XcastMsg::Ack { upto: 2, digest: 0 }
    }));
}

#[test]
fn a_promoted_parent_treats_its_kept_child_as_new() {
    // Radix 2, size 15: 1 -> {3, 5}, 5 -> {9, 13}. Rank 1 dies: 5 takes slot 1 and 13 takes
    // slot 5, so 13 stays 5's child but now has 9 below it. 13 acked operation 1 while the
    // copy for 9 was still on the wire; 5 must not count 13's old ack for 13's new subtree.
    let mut sim = Sim::new(1, 15, 2, Repairs::Atomic);
    sim.originate(0);
    while sim.deliver_first(|f, t| (f, t) != (5, 9)) {}
    assert_eq!(sim.node(13).delivered.len(), 1);
    assert!(sim.node(9).delivered.is_empty());
    sim.crash(&[1]);
    assert_eq!(sim.node(13).routing.parent(), Some(5));
    assert!(sim.node(13).routing.promoted());
    // Completion is checked against every living daemon as it happens.
    while sim.deliver_first(|_, _| true) {}
    check(&sim, 1);
}

// ----- the simulated network --------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    None,
    /// Crash daemons that have children.
    Interior,
    /// Crash a daemon and one of its children in the same repair.
    ParentAndChild,
    /// Crash a daemon, then the daemon that took over its children while it resynchronises.
    DuringRepair,
    /// Crash random daemons.
    Random,
    /// Lose tree messages between a living daemon and its parent (a broken connection, or
    /// drops at a full queue) and re-state them; one time in four, crash an interior daemon.
    LinkLoss,
}

/// Crash according to `fault`.
pub(crate) fn inject(sim: &mut Sim, fault: Fault) {
    match fault {
        Fault::None => {}
        Fault::Interior | Fault::Random => {
            if let Some(v) = sim.pick_victim(fault == Fault::Interior) {
                sim.crash(&[v]);
            }
        }
        Fault::ParentAndChild => {
            let Some(v) = sim.pick_victim(true) else {
                return;
            };
            let children = sim.node(v).routing.children().to_vec();
            match sim.rng.pick(&children) {
                Some(c) => sim.crash(&[v, c]),
                None => sim.crash(&[v]),
            }
        }
        Fault::LinkLoss => {
            if sim.rng.chance(1, 4) {
                return inject(sim, Fault::Interior);
            }
            let alive: Vec<Rank> = sim.alive().into_iter().filter(|&r| r != 0).collect();
            let Some(c) = sim.rng.pick(&alive) else {
                return;
            };
            let Some(p) = sim.node(c).routing.parent() else {
                return;
            };
            if !sim.node(p).alive {
                return;
            }
            let reconnect = sim.rng.chance(1, 2);
            let (a, b) = if sim.rng.chance(1, 2) { (c, p) } else { (p, c) };
            sim.lose_link(a, b, reconnect);
        }
        Fault::DuringRepair => {
            let Some(v) = sim.pick_victim(true) else {
                return;
            };
            let orphans = sim.node(v).routing.children().to_vec();
            sim.crash(&[v]);
            for _ in 0..sim.rng.below(6) {
                sim.step();
            }
            // The daemon that now holds one of the orphans (or the orphan itself, the heir).
            let Some(c) = sim.rng.pick(&orphans) else {
                return;
            };
            let view = sim.truth().as_seen_by(c).unwrap();
            let w = match view.parent() {
                Some(p) if p != 0 => p,
                _ => c,
            };
            if w != 0 && sim.node(w).alive {
                sim.crash(&[w]);
            }
        }
    }
}

/// Bounds small enough for the workload to hit every one of them (a retained store smaller
/// than rank 0's window: interior daemons drop and fetch again all the time).
const TIGHT: XcastLimits = XcastLimits {
    inflight: 4,
    inflight_bytes: 40,
    payload: 40,
    retained: 2,
    retained_bytes: 48,
    originate: 2,
    refusals: 1_024,
    held: 3,
    held_bytes: 40,
    // Payloads of 5 to 8 bytes: two parts each (no more than `retained`).
    part_bytes: 3,
    parts: 64,
};

/// Default bounds, but every payload (5 to 8 bytes here) split into parts of 2 bytes.
fn split_limits() -> XcastLimits {
    XcastLimits {
        part_bytes: 2,
        ..XcastLimits::default()
    }
}

/// A random broadcast workload with faults; returns the settled network. With
/// `TBON_SIM_DUMP` set, prints every survivor's state before checking it.
pub(crate) fn run_with(
    seed: u64,
    fault: Fault,
    repairs: Repairs,
    leak: bool,
    limits: XcastLimits,
) -> Sim {
    let mut rng = Rng::new(seed ^ 0x005e_ed0f_ca57);
    let size = 2 + rng.below(23) as u32;
    let radix = 2 + rng.below(3) as u32;
    let mut sim = Sim::with_limits(seed, size, radix, repairs, limits);
    sim.leak = leak;
    let ops = 8 + rng.below(25);
    let crashes = match fault {
        Fault::None => 0,
        Fault::LinkLoss => 1 + rng.below(6),
        _ => 1 + rng.below(2),
    };
    let mut plan: Vec<bool> = vec![false; ops]; // false: originate, true: crash
    for _ in 0..crashes {
        let at = rng.below(plan.len() + 1);
        plan.insert(at, true);
    }
    for crash in plan {
        for _ in 0..rng.below(16) {
            if !sim.step() {
                break;
            }
        }
        if crash {
            inject(&mut sim, fault);
        } else if let Some(r) = rng.pick(&sim.alive()) {
            sim.originate(r);
        }
    }
    sim.settle();
    if std::env::var("TBON_SIM_DUMP").is_ok() {
        crate::grpcomm::testnet::init_log();
        for n in &sim.nodes {
            if n.alive {
                let x = &n.xcast;
                log::error!(
                    "rank {} parent {:?} next {} store {:?} children {:?} up {:?} pending {:?} due {:?}",
                    x.me(),
                    x.view.parent,
                    x.next_expected,
                    x.store.keys().collect::<Vec<_>>(),
                    x.children
                        .iter()
                        .map(|c| (c.rank, c.cursor, c.acked, c.last_ack))
                        .collect::<Vec<_>>(),
                    x.up,
                    x.pending_syncs,
                    x.sync_due
                );
            }
        }
        log::error!("crashed {:?}", sim.crashed);
    }
    check(&sim, seed);
    sim
}

/// Every survivor delivered every operation once, in order, with rank 0's content; every
/// request of a survivor completed (or was refused) once, naming its own operation; nothing is
/// retained.
pub(crate) fn check(sim: &Sim, seed: u64) {
    let root = sim.node(0);
    let total = root.delivered.len();
    assert_eq!(
        root.xcast.completed(),
        root.delivered.last().map_or(0, |d| d.0),
        "seed {seed}: rank 0 completed all"
    );
    let mut payloads: Vec<&Bytes> = root.delivered.iter().map(|d| &d.3).collect();
    payloads.sort();
    payloads.dedup();
    assert_eq!(
        payloads.len(),
        total,
        "seed {seed}: a request broadcast twice"
    );
    for r in sim.alive() {
        let n = sim.node(r);
        assert_eq!(
            n.delivered, root.delivered,
            "seed {seed}: rank {r} deliveries"
        );
        assert_eq!(n.xcast.retained(), 0, "seed {seed}: rank {r} retains");
        assert_eq!(
            n.xcast.outstanding(),
            0,
            "seed {seed}: rank {r} outstanding"
        );
        let mut answered: Vec<u64> = n.completed.iter().map(|c| c.0).collect();
        answered.extend(&n.refused);
        answered.sort_unstable();
        let asked: Vec<u64> = n.originated.iter().map(|o| o.0).collect();
        assert_eq!(answered, asked, "seed {seed}: rank {r} completions");
        for &(request, op) in &n.completed {
            let (_, originator, _, payload) = root.delivered.iter().find(|d| d.0 == op).unwrap();
            assert_eq!(*originator, r, "seed {seed}");
            let sent = &n.originated.iter().find(|o| o.0 == request).unwrap().1;
            assert_eq!(payload, sent, "seed {seed}: rank {r} request {request}");
        }
    }
    // Every operation was originated by its originator.
    for (_, originator, _, payload) in &root.delivered {
        let o = sim.node(*originator);
        assert!(
            o.originated.iter().any(|(_, p)| p == payload),
            "seed {seed}"
        );
    }
}

/// Totals over a batch of runs, printed for the record (`--nocapture`).
#[derive(Debug, Default)]
struct Totals {
    runs: u64,
    daemons: u64,
    ops: u64,
    crashed: u64,
    frames: u64,
    resumes: u64,
    dropped_stale: u64,
    refused: u64,
    dropped_full: u64,
}

impl Totals {
    fn add(&mut self, sim: &Sim) {
        self.runs += 1;
        self.daemons += u64::from(sim.size);
        self.ops += sim.node(0).delivered.len() as u64;
        self.crashed += sim.crashed.len() as u64;
        self.frames += sim.delivered_frames;
        for n in &sim.nodes {
            let s = n.xcast.stats();
            self.resumes += s.resumes_sent;
            self.dropped_stale += s.not_from_parent + s.stale + s.acks_other_view;
            self.refused += s.refused;
            self.dropped_full += s.dropped_full;
        }
    }
}

fn batch(name: &str, fault: Fault, repairs: Repairs, leak: bool) {
    batch_with(name, fault, repairs, leak, XcastLimits::default());
}

fn batch_with(name: &str, fault: Fault, repairs: Repairs, leak: bool, limits: XcastLimits) {
    crate::grpcomm::testnet::init_log();
    let mut totals = Totals::default();
    for seed in crate::grpcomm::testnet::seeds() {
        totals.add(&run_with(seed, fault, repairs, leak, limits));
    }
    log::info!("xcast {name}: {totals:?}");
}

#[test]
fn sim_without_faults() {
    batch("no faults", Fault::None, Repairs::Atomic, false);
}

#[test]
fn sim_interior_crashes() {
    batch("interior", Fault::Interior, Repairs::Atomic, false);
}

#[test]
fn sim_parent_and_child_together() {
    batch(
        "parent+child",
        Fault::ParentAndChild,
        Repairs::Atomic,
        false,
    );
}

#[test]
fn sim_crash_during_repair() {
    batch("during repair", Fault::DuringRepair, Repairs::Atomic, true);
}

#[test]
fn sim_staggered_repairs() {
    batch("staggered", Fault::Random, Repairs::Staggered, true);
}

#[test]
fn sim_staggered_crash_during_repair() {
    batch(
        "staggered during repair",
        Fault::DuringRepair,
        Repairs::Staggered,
        true,
    );
}

#[test]
fn sim_link_losses() {
    batch("link losses", Fault::LinkLoss, Repairs::Atomic, true);
    batch(
        "link losses, staggered",
        Fault::LinkLoss,
        Repairs::Staggered,
        true,
    );
    batch_with(
        "link losses, tight bounds",
        Fault::LinkLoss,
        Repairs::Atomic,
        true,
        TIGHT,
    );
}

#[test]
fn sim_split_payloads_with_faults() {
    for (name, fault, repairs) in [
        ("split, no faults", Fault::None, Repairs::Atomic),
        ("split, interior", Fault::Interior, Repairs::Atomic),
        ("split, during repair", Fault::DuringRepair, Repairs::Atomic),
        ("split, staggered", Fault::Random, Repairs::Staggered),
        ("split, link losses", Fault::LinkLoss, Repairs::Atomic),
    ] {
        batch_with(name, fault, repairs, true, split_limits());
    }
}

#[test]
fn sim_at_every_bound_with_faults() {
    batch_with(
        "tight bounds",
        Fault::DuringRepair,
        Repairs::Atomic,
        true,
        TIGHT,
    );
    batch_with(
        "tight bounds, staggered",
        Fault::Random,
        Repairs::Staggered,
        true,
        TIGHT,
    );
}
