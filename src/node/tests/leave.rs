//! An orderly leave (shrink) on the in-memory network: an interior daemon leaves, every other
//! daemon repairs around it and counts a departure (no failure), the leaving daemon stops with
//! `StopReason::Left` once rank 0 says every living daemon knows, and messages cross its old
//! slot; rank 0 cannot leave.

use super::*;
use crate::error::LeaveError;

#[test]
fn an_interior_daemon_leaves_in_order() {
    let mut net = Net::new(15, 2, |c| c.incarnation = 1);
    let now = net.now;
    assert_eq!(net.node(0).leave(now), Err(LeaveError::Rank0));
    net.node(1).leave(now).unwrap();
    assert_eq!(net.node(1).leave(now), Err(LeaveError::ShutDown));
    // A leaving daemon takes no new commands.
    let refused = net.node(1).handle_command(
        now,
        Command::Send {
            dst: 2,
            tag: TAG,
            payload: Bytes::from_static(b"late"),
            token: None,
            route: None,
        },
    );
    assert_eq!(refused, Err(SendError::ShutDown));
    net.collect(1);
    net.run();
    assert!(
        net.stops
            .iter()
            .any(|(r, why)| *r == 1 && *why == StopReason::Left),
        "stops: {:?}",
        net.stops
    );
    net.alive[1] = false;
    for r in (0..15).filter(|r| *r != 1) {
        let n = &net.nodes[r as usize];
        assert!(n.routing().is_failed(1), "rank {r} still routes through 1");
        assert_eq!(n.epoch(), 1, "rank {r}'s epoch");
        assert_eq!(n.counters().departures, 1, "rank {r}'s departures");
        assert!(
            !net.stops.iter().any(|(s, _)| *s == r),
            "rank {r} stopped: {:?}",
            net.stops
        );
    }
    // Rank 1's children reach each other, and the rest, through its heir.
    let kids = crate::routed::RoutingState::new(2, 15, 1)
        .unwrap()
        .children()
        .to_vec();
    let now = net.now;
    net.node(kids[0])
        .handle_command(
            now,
            Command::SendReliable {
                dst: kids[1],
                tag: TAG,
                payload: Bytes::from_static(b"across"),
                token: Some(1),
            },
        )
        .unwrap();
    net.collect(kids[0]);
    net.run();
    assert!(
        net.delivered
            .iter()
            .any(|(r, m)| *r == kids[1] && m.payload == b"across".as_slice())
    );
}

#[test]
fn rank_0_tells_a_reconnecting_leaver_whether_it_left_or_was_declared_dead() {
    // Rank 1 leaves; once gone, a reconnection is answered "left", not "declared dead" (its
    // own word of the departure may have been lost while it stalled).
    let mut net = Net::new(7, 2, |c| c.incarnation = 1);
    let now = net.now;
    net.node(1).leave(now).unwrap();
    net.collect(1);
    net.run();
    let h = net.node(0).declared_dead_frame(1);
    assert_eq!(h.tag, crate::faults::leave::TAG_LEFT);
    // Rank 2 asks to leave too, but is declared dead (a stall) before its request reaches
    // rank 0: rank 0's answer to its reconnection is "declared dead", and the leaving daemon
    // stops at once as declared dead instead of waiting out `LEAVE_WAIT_MS`.
    net.node(2).leave(now).unwrap();
    let h = {
        let zero = net.node(0);
        let status = zero
            .routing
            .fail(&[2], crate::routed::Scope::Global, Some(9))
            .unwrap();
        assert!(status.newly_failed.contains(&2));
        zero.declared_dead_frame(2)
    };
    assert_eq!(h.tag, crate::faults::notice::TAG_DECLARED_DEAD);
    let now = net.now;
    net.node(2).handle_frame(now, 0, h, Bytes::new()).unwrap();
    assert!(
        matches!(stop_reason(net.node(2)), Some(StopReason::DeclaredDead(_))),
        "rank 2 must stop as declared dead"
    );
}
