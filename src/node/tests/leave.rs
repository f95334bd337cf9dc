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
