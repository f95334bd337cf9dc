//! Messages sent to a daemon while the direct link to it closes wait for the link's end, then
//! enter the tree's queue only while it is not congested, in order and with later sends behind
//! them; the origin gate refuses sends to that daemon once they reach the high-water mark
//! (`node/direct_held.rs`; regression seed 308,097 dropped frames at a queue's hard bound).

use super::*;
use crate::direct::Route;

const P: Rank = 3;
const H: Rank = 6;
/// Another daemon that is no tree neighbour of `P`: asking it for a link evicts `P`'s.
const OTHER: Rank = 5;
const HIGH: usize = 1_000;

fn send(net: &mut Net, dst: Rank, body: &[u8], route: Option<Route>) {
    let now = net.now;
    net.node(P)
        .handle_command(
            now,
            Command::Send {
                dst,
                tag: TAG,
                payload: Bytes::copy_from_slice(body),
                token: None,
                route,
            },
        )
        .unwrap();
    net.collect(P);
}

#[test]
fn held_messages_wait_for_room_towards_the_tree_and_the_gate_stops_new_ones() {
    let mut net = Net::new(7, 2, |c| {
        c.direct.setting = crate::RouteSetting::Direct;
        c.direct.links_max = 1;
        c.direct.auto_window = Duration::from_millis(10);
        c.flow = crate::node::flow::FlowLimits {
            high_bytes: HIGH,
            low_bytes: HIGH / 4,
            stuck_ms: 60_000,
            full_bytes: 1 << 20,
        };
    });
    // A link from P to H, one message over it.
    send(&mut net, H, b"m0", Some(Route::Direct));
    net.run();
    send(&mut net, H, b"m1", None);
    net.run();
    assert!(net.node(P).direct().is_direct(H), "the link opened");
    // Idle past the window, then a link to another daemon evicts it: it closes.
    net.advance(20);
    send(&mut net, OTHER, b"elsewhere", Some(Route::Direct));
    assert!(!net.node(P).direct().is_direct(H), "the link closes");
    // Sent meanwhile: held, and the gate closes once they reach the mark.
    let body = [7u8; 300];
    let mut sent = 2;
    while net.node(P).may_originate_to(H) {
        let mut m = format!("m{sent}").into_bytes();
        m.extend_from_slice(&body);
        send(&mut net, H, &m, None);
        sent += 1;
        assert!(sent < 20, "the gate never closed");
    }
    assert!(sent >= 2 + HIGH / 300, "closed after {} messages", sent - 2);
    assert!(!net.node(P).origin_gate_open());
    // The queue towards the tree's next hop (rank 1) is congested when the link ends.
    let now = net.now;
    net.node(P).handle_send_queue(now, 1, 10 * HIGH, 0);
    net.run();
    assert_eq!(net.node(P).direct().ends(H), None, "the link ended");
    let held_on_tree = |net: &Net| {
        net.seen
            .iter()
            .filter(|(from, to, h)| *from == P && *to == 1 && h.dst == H && h.tag == TAG)
            .count()
    };
    // The first message asked for the link and took the tree.
    assert_eq!(held_on_tree(&net), 1, "released into a congested queue");
    // A send now waits behind them (the gate lets a send without completion through).
    send(&mut net, H, b"last", None);
    assert_eq!(held_on_tree(&net), 1);
    // Room: everything goes, in order.
    let now = net.now;
    net.node(P).handle_send_queue(now, 1, 0, 0);
    net.collect(P);
    assert_eq!(held_on_tree(&net), 1 + sent - 2 + 1);
    assert!(net.node(P).may_originate_to(H) && net.node(P).origin_gate_open());
    net.run();
    let got: Vec<Vec<u8>> = net
        .delivered
        .iter()
        .filter(|(r, m)| *r == H && m.origin == P)
        .map(|(_, m)| m.payload.to_vec())
        .collect();
    assert_eq!(got.len(), sent + 1, "every message arrived");
    for (i, m) in got.iter().enumerate().take(sent) {
        assert!(
            m.starts_with(format!("m{i}").as_bytes()),
            "message {i} out of order"
        );
    }
    assert_eq!(got[sent], b"last");
}
