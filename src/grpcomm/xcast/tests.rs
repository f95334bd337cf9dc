use super::*;
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
    Op {
        id,
        originator: 0,
        request: id,
        tag: 100,
        payload: Bytes::from(format!("op{id}")),
    }
}

fn drain_transmits(x: &mut Xcast) -> Vec<Transmit<XcastMsg>> {
    std::iter::from_fn(|| x.poll_transmit()).collect()
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
                op: 1,
                originator: 0,
                tag: 100,
                payload: Bytes::from_static(b"hi")
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

#[test]
fn rank_zero_refuses_when_full_and_originators_are_bounded() {
    // Rank 0 with one child that never acks: operations stay in flight.
    let mut zero = core(2, 2, 0);
    for _ in 0..XCAST_INFLIGHT_MAX {
        zero.originate(100, Bytes::new()).unwrap();
    }
    assert_eq!(zero.originate(100, Bytes::new()), Err(XcastError::Busy));
    // A request from rank 1 is answered with Refused.
    drain_transmits(&mut zero);
    zero.handle_msg(
        1,
        XcastMsg::Request(Request {
            originator: 1,
            request: 1,
            tag: 100,
            payload: Bytes::new(),
        }),
    );
    assert_eq!(
        drain_transmits(&mut zero),
        vec![Transmit {
            to: 1,
            msg: XcastMsg::Refused { request: 1 }
        }]
    );
    // A request naming another originator is ignored.
    zero.handle_msg(
        1,
        XcastMsg::Request(Request {
            originator: 0,
            request: 2,
            tag: 100,
            payload: Bytes::new(),
        }),
    );
    assert_eq!(drain_transmits(&mut zero), vec![]);

    let mut one = core(2, 2, 1);
    for _ in 0..XCAST_ORIGINATE_MAX {
        one.originate(100, Bytes::new()).unwrap();
    }
    assert_eq!(
        one.originate(100, Bytes::new()),
        Err(XcastError::TooManyOutstanding)
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
