//! A direct link waiting for its drain marker holds back only the peer's own messages
//! (`node/marker_wait.rs`): the rest of the connection is read, what waited is read in order
//! once the marker comes, and a connection lost meanwhile takes what waited with it.
//! Regression seeds 11549 and 128 found the deadlock this prevents.

use super::*;
use crate::direct::{DirectMsg, Route, TAG_DIRECT};

const P: Rank = 3;
const H: Rank = 6;

/// A DVM of 7 at radix 2 (3 under 1, 6 under 2) where rank 6 granted rank 3 a direct link
/// and waits for its `Switch`: rank 3 never had the grant. Returns the net and the link's id.
fn granted_not_switched() -> (Net, u32) {
    let mut net = Net::new(7, 2, |c| c.direct.setting = crate::RouteSetting::Auto);
    let now = net.now;
    net.node(P)
        .handle_command(
            now,
            Command::Send {
                dst: H,
                tag: TAG,
                payload: Bytes::from_static(b"over the tree"),
                token: None,
                route: Some(Route::Direct),
            },
        )
        .unwrap();
    net.collect(P);
    let mut grant = None;
    for _ in 0..1_000 {
        let Some((from, to, bytes)) = net.links.pop_front() else {
            break;
        };
        let h = Header::decode(bytes.first_chunk::<HEADER_LEN>().unwrap()).unwrap();
        let payload = bytes.slice(HEADER_LEN..);
        if h.tag == TAG_DIRECT
            && h.origin == H
            && let Ok(DirectMsg::Grant { id, .. }) = DirectMsg::decode(&payload)
        {
            // Lost with the tree connection it took.
            grant = Some(id);
            continue;
        }
        let now = net.now;
        net.nodes[to as usize]
            .handle_frame(now, from, h, payload)
            .unwrap();
        net.collect(to);
    }
    let id = grant.expect("rank 6 granted the link");
    assert!(
        !net.nodes[H as usize].direct().may_read(P),
        "the grantor waits for the marker"
    );
    let tree: Vec<_> = net
        .delivered
        .drain(..)
        .map(|(r, m)| (r, m.payload))
        .collect();
    assert_eq!(tree, vec![(H, Bytes::from_static(b"over the tree"))]);
    (net, id)
}

/// A frame from `P` on its connection with `H`.
fn from_p(net: &mut Net, origin: Rank, kind: Kind, tag: Tag, payload: &'static [u8]) {
    let h = Header {
        kind,
        origin,
        dst: H,
        tag,
        epoch: 0,
        seq: 0,
        len: payload.len() as u32,
        lives: Header::lives_of(0, 0),
    };
    let now = net.now;
    net.nodes[H as usize]
        .handle_frame(now, P, h, Bytes::from_static(payload))
        .unwrap();
    net.collect(H);
}

fn delivered(net: &mut Net) -> Vec<&'static str> {
    net.delivered
        .drain(..)
        .map(|(r, m)| {
            assert_eq!(r, H);
            match &m.payload[..] {
                b"from 3, first" => "from 3, first",
                b"from 3, second" => "from 3, second",
                b"from 0 through 3" => "from 0 through 3",
                other => panic!("unexpected payload {other:?}"),
            }
        })
        .collect()
}

#[test]
fn only_the_peers_own_messages_wait_for_its_marker_and_they_are_read_in_order_after_it() {
    let (mut net, id) = granted_not_switched();
    // Rank 3's own messages on the connection wait; a message rank 3 relays (as it would once a
    // repair made it rank 6's parent) is read at once.
    from_p(&mut net, P, Kind::Msg, TAG, b"from 3, first");
    from_p(&mut net, 0, Kind::Msg, TAG, b"from 0 through 3");
    from_p(&mut net, P, Kind::Msg, TAG, b"from 3, second");
    assert_eq!(delivered(&mut net), vec!["from 0 through 3"]);
    let now = net.now;
    assert!(
        net.node(H).may_read(now, P),
        "far from its bound, the connection is still read"
    );
    // The marker comes over the tree, from rank 6's parent.
    let switch = DirectMsg::Switch(id).encode();
    let h = Header {
        kind: Kind::Msg,
        origin: P,
        dst: H,
        tag: TAG_DIRECT,
        epoch: 0,
        seq: 0,
        len: switch.len() as u32,
        lives: Header::lives_of(0, 0),
    };
    net.nodes[H as usize]
        .handle_frame(now, 2, h, switch)
        .unwrap();
    net.collect(H);
    assert!(net.nodes[H as usize].direct().may_read(P));
    assert_eq!(
        delivered(&mut net),
        vec!["from 3, first", "from 3, second"],
        "read once the marker came, in their order"
    );
}

#[test]
fn a_batch_of_the_peers_messages_waits_for_its_marker_too() {
    // A batch frame (`rml::batch_frame`, runtime tag `TAG_BATCH`) carries user messages: read
    // ahead of the marker, it overtook the tree's last messages before the `Switch` (found by
    // `tests/direct.rs`, about one run in twenty).
    let (mut net, id) = granted_not_switched();
    let item = b"from 3, second";
    let mut batch = Vec::new();
    batch.extend_from_slice(&TAG.to_be_bytes());
    batch.extend_from_slice(&(item.len() as u32).to_be_bytes());
    batch.extend_from_slice(item);
    let batch: &'static [u8] = Box::leak(batch.into_boxed_slice());
    from_p(
        &mut net,
        P,
        Kind::Msg,
        crate::rml::batch_frame::TAG_BATCH,
        batch,
    );
    assert_eq!(delivered(&mut net), Vec::<&str>::new(), "it waits");
    // The tree's last message before the marker, then the marker, from rank 6's parent.
    let now = net.now;
    let first = Header {
        kind: Kind::Msg,
        origin: P,
        dst: H,
        tag: TAG,
        epoch: 0,
        seq: 0,
        len: 13,
        lives: Header::lives_of(0, 0),
    };
    net.nodes[H as usize]
        .handle_frame(now, 2, first, Bytes::from_static(b"from 3, first"))
        .unwrap();
    let switch = DirectMsg::Switch(id).encode();
    let h = Header {
        tag: TAG_DIRECT,
        len: switch.len() as u32,
        ..first
    };
    net.nodes[H as usize]
        .handle_frame(now, 2, h, switch)
        .unwrap();
    net.collect(H);
    assert_eq!(
        delivered(&mut net),
        vec!["from 3, first", "from 3, second"],
        "the tree's message first, then the batch the marker held"
    );
}

#[test]
fn a_connection_lost_while_frames_wait_for_the_marker_takes_them_with_it() {
    let (mut net, _) = granted_not_switched();
    from_p(&mut net, P, Kind::Msg, TAG, b"from 3, first");
    let now = net.now;
    net.node(H).handle_link_lost(now, P);
    net.collect(H);
    assert!(delivered(&mut net).is_empty());
    // Nothing waits any more: a later frame of the peer's own waits alone, and the link's
    // own rules (the marker, or giving the grant up) decide when it is read.
    from_p(&mut net, P, Kind::Msg, TAG, b"from 3, second");
    assert!(delivered(&mut net).is_empty());
}
