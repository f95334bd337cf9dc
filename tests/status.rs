//! Status queries against in-process daemons: `Handle::status` and a tool's
//! `tbon::status::query` see the same tree; a daemon other than rank 0 answers for its
//! subtree; an aborted daemon shows as dead once repaired; a tool with the job key instead of
//! the operator credential, or with another DVM's, is refused; a tool that sends anything but
//! a status query is cut off, and the DVM keeps serving.

mod common;

use common::wire::Wire;
use common::{HANG_GUARD, key_file, loopback_config, nonce, start_dvm};
use std::time::{Duration, Instant};
use tbon::oob::handshake::{Handshake, HandshakeConfig, JobKey, TOOL_RANK};
use tbon::oob::header::{Header, Kind};
use tbon::oob::uri::ContactUri;
use tbon::status::view::{RankState, view};
use tbon::status::{Part, StatusError, StatusOptions, TAG_STATUS};
use tbon::{Key, Rank};

fn operator() -> Key {
    Key::from_file(key_file()).unwrap().operator()
}

#[test]
fn caller_and_tool_see_the_tree_and_its_repair() {
    const SIZE: u32 = 13;
    let dvm = start_dvm(SIZE, &loopback_config(3));
    let contact: ContactUri = dvm[0].contact_uri().to_string().parse().unwrap();

    let r = dvm[0].status(2_000, false).unwrap();
    assert_eq!((r.from, r.size, r.radix), (0, SIZE, 3));
    assert!(r.failed.is_empty());
    assert!(
        matches!(&r.parts[..], [Part::Healthy(h)] if h.daemons == SIZE),
        "{r:?}"
    );
    assert_eq!(r.answered(), SIZE);

    let all = tbon::status::query(
        &contact,
        &operator(),
        &StatusOptions {
            all: true,
            ..StatusOptions::default()
        },
    )
    .unwrap();
    assert_eq!(all.parts.len(), SIZE as usize);
    let tree = tbon::routed::tree_view(3, SIZE, &[]).unwrap();
    for p in &all.parts {
        let Part::Daemon(d) = p else { panic!("{p:?}") };
        let n = tree.iter().find(|n| n.rank == d.rank).unwrap();
        assert_eq!(
            (d.parent, &d.children, d.depth),
            (n.parent, &n.children, n.depth)
        );
        for l in d.links.iter().filter(|l| d.children.contains(&l.peer)) {
            assert!(
                l.rtt_us.is_some(),
                "rank {}: a child's round trip: {d:?}",
                d.rank
            );
        }
        // One process, one clock: every offset from rank 0 lies within its bound of 0.
        let (offset, bound) = (d.clock_offset_ns.unwrap(), d.clock_bound_ns.unwrap());
        assert!(
            offset.unsigned_abs() <= bound,
            "rank {}: {offset} ± {bound}",
            d.rank
        );
    }

    // Rank 1 answers for its own subtree.
    let sub = dvm[1].status(2_000, true).unwrap();
    let mut ranks: Vec<Rank> = sub
        .parts
        .iter()
        .map(|p| match p {
            Part::Daemon(d) => d.rank,
            other => panic!("{other:?}"),
        })
        .collect();
    ranks.sort_unstable();
    let v = view(&sub).unwrap();
    assert_eq!(v.ranks.iter().map(|r| r.rank).collect::<Vec<_>>(), ranks);
    assert!(ranks.len() > 1 && ranks.len() < SIZE as usize, "{ranks:?}");

    // An aborted interior daemon: dead once the DVM repaired, everyone else answers.
    dvm[1].abort();
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        let r = dvm[0].status(2_000, false).unwrap();
        if r.failed == [1] {
            let v = view(&r).unwrap();
            assert_eq!(v.ranks_in(RankState::Dead), vec![1]);
            // Until every daemon applied the repair, a parent may not yet count the children
            // it adopts: the view says so.
            if v.all_answered() && !v.views_differ {
                assert_eq!(r.answered(), SIZE - 1);
                break;
            }
        }
        assert!(Instant::now() < deadline, "no repaired status: {r:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn wrong_credentials_and_misbehaving_tools_are_refused() {
    let dvm = start_dvm(
        3,
        &tbon::config::Config {
            handshake_timeout_ms: 300,
            ..loopback_config(2)
        },
    );
    let contact: ContactUri = dvm[0].contact_uri().to_string().parse().unwrap();
    let opts = StatusOptions::default();
    let job = Key::from_file(key_file()).unwrap();
    for wrong in [job.clone(), Key::generate().unwrap().operator()] {
        match tbon::status::query(&contact, &wrong, &opts) {
            Err(StatusError::Credential(why)) => assert!(why.contains("credential"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
    let bad_contact = ContactUri {
        dvm_id: "another-dvm".into(),
        ..contact.clone()
    };
    match tbon::status::query(&bad_contact, &operator(), &opts) {
        Err(StatusError::Refused(why)) => {
            assert!(
                why.contains("another DVM") && why.contains("another-dvm"),
                "{why}"
            )
        }
        other => panic!("{other:?}"),
    }

    // A tool that sends a user message instead of a query is cut off.
    let addr = contact.addrs[0];
    let tool_cfg = HandshakeConfig {
        me: TOOL_RANK,
        size: 3,
        epoch: 0,
        dvm_id: contact.dvm_id.clone(),
        key: JobKey::new(operator().as_bytes().to_vec()),
    };
    let mut w = Wire::dial(addr);
    let mut hs = Handshake::dial(&tool_cfg, 0, nonce());
    w.join(&mut hs);
    let h = Header {
        kind: Kind::Msg,
        origin: TOOL_RANK,
        dst: 1,
        tag: 100,
        epoch: 0,
        seq: 0,
        len: 0,
        lives: 0,
    };
    w.send(&h, &bytes::Bytes::from_static(b"hello rank 1"));
    assert!(w.recv().is_none(), "the daemon closes the connection");
    // A garbled query too.
    let mut w = Wire::dial(addr);
    let mut hs = Handshake::dial(&tool_cfg, 0, nonce());
    w.join(&mut hs);
    w.send(
        &Header {
            tag: TAG_STATUS,
            dst: 0,
            ..h
        },
        &bytes::Bytes::from_static(&[1, 2, 3]),
    );
    assert!(w.recv().is_none());
    // A well-behaved tool on the same connection asks twice.
    let mut w = Wire::dial(addr);
    let mut hs = Handshake::dial(&tool_cfg, 0, nonce());
    w.join(&mut hs);
    let query = tbon::status::wire::Msg::Query(tbon::status::wire::Query {
        id: 7,
        budget_ms: 1_000,
        all: false,
        epoch: 0,
        failed: 0,
        sent_ns: None,
    })
    .encode();
    let ask = |w: &mut Wire| {
        w.send(
            &Header {
                tag: TAG_STATUS,
                dst: 0,
                ..h
            },
            &query,
        )
    };
    for _ in 0..2 {
        ask(&mut w);
        let f = w.recv().expect("a report");
        match tbon::status::wire::Msg::decode(&f.payload, 3).unwrap() {
            tbon::status::wire::Msg::Report(r) => assert_eq!(r.answered(), 3),
            other => panic!("{other:?}"),
        }
    }
    // An admitted tool is no longer in its handshake: its connection outlives the handshake
    // timeout (here 300 ms) and is still answered.
    std::thread::sleep(Duration::from_millis(900));
    ask(&mut w);
    let f = w.recv().expect("a report after the handshake timeout");
    assert!(matches!(
        tbon::status::wire::Msg::decode(&f.payload, 3),
        Ok(tbon::status::wire::Msg::Report(_))
    ));
    assert_eq!(dvm[0].counters().unwrap().handshakes_timed_out, 0);
    // The DVM is unharmed: rank 1 never heard of the tool, and the daemons still answer.
    assert_eq!(dvm[1].counters().unwrap().delivered, 0);
    assert_eq!(dvm[0].status(2_000, false).unwrap().answered(), 3);
}

/// From an outside-in review: a stranger's tool `Hello`s took the tool slots while they
/// handshook, so eight of them, renewed every handshake timeout, kept the operator out of
/// `tbon status`. Tools that have not proved the credential take no slot now; eight admitted
/// tools still do, and a ninth is refused until one leaves.
#[test]
fn strangers_tool_hellos_do_not_lock_the_operator_out() {
    let dvm = start_dvm(2, &loopback_config(2));
    let contact: ContactUri = dvm[0].contact_uri().to_string().parse().unwrap();
    let addr = contact.addrs[0];
    let opts = StatusOptions::default();
    let tool = |key: Key| HandshakeConfig {
        me: TOOL_RANK,
        size: 2,
        epoch: 0,
        dvm_id: contact.dvm_id.clone(),
        key: JobKey::new(key.as_bytes().to_vec()),
    };
    // More tool `Hello`s than there are slots, from a stranger without the credential; each
    // gets its `HelloAck` and says nothing more.
    let mut strangers = Vec::new();
    for _ in 0..tbon::limits::TOOL_CONNECTIONS_MAX + 4 {
        let mut w = Wire::dial(addr);
        let mut hs = Handshake::dial(&tool(Key::generate().unwrap().operator()), 0, nonce());
        w.send_all(&mut hs);
        w.recv().expect("HelloAck");
        strangers.push(w);
    }
    let r = tbon::status::query(&contact, &operator(), &opts).expect("the operator gets in");
    assert_eq!(r.answered(), 2);
    drop(strangers);
    // Admitted tools still have their bound.
    let mut admitted = Vec::new();
    for _ in 0..tbon::limits::TOOL_CONNECTIONS_MAX {
        let mut w = Wire::dial(addr);
        let mut hs = Handshake::dial(&tool(operator()), 0, nonce());
        w.join(&mut hs);
        admitted.push(w);
    }
    match tbon::status::query(&contact, &operator(), &opts) {
        Err(StatusError::Refused(why)) => assert!(why.contains("too many"), "{why}"),
        other => panic!("a ninth tool was not refused: {other:?}"),
    }
    admitted.pop();
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        match tbon::status::query(&contact, &operator(), &opts) {
            Ok(r) => {
                assert_eq!(r.answered(), 2);
                break;
            }
            Err(e) => assert!(Instant::now() < deadline, "no room after one left: {e:?}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
