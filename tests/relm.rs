//! Reliable messaging (RELM) in live in-process DVMs on loopback: every reliable message between
//! living daemons arrives exactly once and in order per (origin, destination), with interior
//! daemons dying under the traffic too; completions say `Ok` once the destination posted the
//! message and `NodeDown` when it died first; a full unmatched list refuses (and the origin
//! replays later) instead of dropping; misuse is refused at once. Payloads carry (origin,
//! sequence) so the receivers check order themselves. No timing assertions: waits are hang
//! guards.

mod common;

use bytes::Bytes;
use common::wire::Wire;
use common::{HANG_GUARD, key_file, loopback_config, start_dvm, start_dvm_with};
use crossbeam_channel::{Receiver, unbounded};
use std::collections::HashMap;
use std::net::TcpListener;
use std::time::{Duration, Instant};
use tbon::node::wireup::TAG_WIREUP_REPORT;
use tbon::oob::handshake::JobKey;
use tbon::oob::uri::ContactUri;
use tbon::oob::{Frame, Handshake, HandshakeConfig, Header, Kind};
use tbon::relm::batch::{Items, TAG_BATCH};
use tbon::relm::uid::MsgKey;
use tbon::relm::wire::unpack_seq;
use tbon::relm::{Control, DataFrame};
use tbon::routed::tree_view;
use tbon::{Counters, Daemon, Handle, Peer, Rank, SendError};

const TAG: u32 = 300;

fn payload(origin: Rank, seq: u32) -> Bytes {
    let mut b = Vec::with_capacity(8);
    b.extend_from_slice(&origin.to_be_bytes());
    b.extend_from_slice(&seq.to_be_bytes());
    Bytes::from(b)
}

fn decode(p: &[u8]) -> (Rank, u32) {
    assert_eq!(p.len(), 8, "payload length");
    (
        u32::from_be_bytes(p[..4].try_into().unwrap()),
        u32::from_be_bytes(p[4..].try_into().unwrap()),
    )
}

/// (receiver, header origin, payload origin, sequence) for every message posted at a receiver.
type Arrival = (Rank, Rank, Rank, u32);

/// Posts a persistent receive for `TAG` on each daemon; arrivals come out of the channel.
fn listen(dvm: &[&Daemon]) -> Receiver<Arrival> {
    let (tx, rx) = unbounded();
    for d in dvm {
        let tx = tx.clone();
        let me = d.rank();
        d.recv(Peer::Any, TAG, tbon::RecvMode::Persistent, move |m| {
            let (o, s) = decode(&m.payload);
            tx.send((me, m.origin, o, s)).unwrap();
        })
        .unwrap();
    }
    rx
}

/// Takes `n` arrivals and checks that each (receiver, origin) stream is 0, 1, 2, ... with no
/// gap, no duplicate and no reordering. Returns how many arrived per pair.
fn check_in_order(rx: &Receiver<Arrival>, n: usize) -> HashMap<(Rank, Rank), u32> {
    let mut next: HashMap<(Rank, Rank), u32> = HashMap::new();
    for i in 0..n {
        let (me, origin, o, s) = rx
            .recv_timeout(HANG_GUARD)
            .unwrap_or_else(|_| panic!("only {i} of {n} reliable messages arrived: {next:?}"));
        assert_eq!(origin, o, "header origin vs payload origin at rank {me}");
        let want = next.entry((me, origin)).or_insert(0);
        assert_eq!(
            s, *want,
            "rank {me} got sequence {s} from {origin}, expected {want} (duplicate, gap or reorder)"
        );
        *want += 1;
    }
    next
}

fn wait_counters(d: &Daemon, what: &str, cond: impl Fn(&Counters) -> bool) -> Counters {
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        let c = d.counters().unwrap();
        if cond(&c) {
            return c;
        }
        assert!(
            Instant::now() < deadline,
            "gave up waiting at rank {}: {what}; {c:?}",
            d.rank()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Sends `seqs` to each of `dsts` in rounds (sequence-major), reporting each completion as
/// (origin, destination, result).
fn stream(
    h: &Handle,
    dsts: &[Rank],
    seqs: std::ops::Range<u32>,
    done: &crossbeam_channel::Sender<(Rank, Rank, Result<(), SendError>)>,
) {
    let me = h.rank();
    for seq in seqs {
        for &dst in dsts {
            let done = done.clone();
            h.send_reliable_with(dst, TAG, payload(me, seq), move |r| {
                done.send((me, dst, r)).unwrap();
            })
            .unwrap();
        }
    }
}

#[test]
fn all_to_all_arrives_once_and_in_order() {
    const N: u32 = 8;
    const PER: u32 = 200;
    let dvm = start_dvm(N, &loopback_config(2));
    let all: Vec<&Daemon> = dvm.iter().collect();
    let rx = listen(&all);
    let (dtx, drx) = unbounded();
    std::thread::scope(|s| {
        for d in &dvm {
            let h = d.handle();
            let dtx = dtx.clone();
            let dsts: Vec<Rank> = (0..N).filter(|r| *r != h.rank()).collect();
            s.spawn(move || stream(&h, &dsts, 0..PER, &dtx));
        }
    });
    let total = (N * (N - 1) * PER) as usize;
    let got = check_in_order(&rx, total);
    assert_eq!(got.len(), (N * (N - 1)) as usize);
    assert!(got.values().all(|n| *n == PER));
    for i in 0..total {
        let (o, d, r) = drx
            .recv_timeout(HANG_GUARD)
            .unwrap_or_else(|_| panic!("only {i} of {total} completions"));
        assert_eq!(r, Ok(()), "completion of {o} -> {d}");
    }
    assert!(drx.try_recv().is_err(), "a completion ran twice");
    for d in &dvm {
        let c = d.counters().unwrap();
        let per_daemon = u64::from((N - 1) * PER);
        assert_eq!(c.relm_sent, per_daemon, "rank {}", d.rank());
        assert_eq!(c.relm_posted, per_daemon, "rank {}", d.rank());
        assert_eq!(c.relm_unacked, 0, "rank {}", d.rank());
        assert_eq!(c.delivered, per_daemon, "rank {}", d.rank());
    }
    // Exactly once: nothing more is posted (copies are discarded by the watermark).
    assert!(rx.try_recv().is_err());
}

#[test]
fn reliable_streams_survive_two_interior_deaths() {
    const N: u32 = 15;
    const PER: u32 = 300;
    // 0 -> {1, 2}; 1 -> {3, 5}; 2 -> {4, 6}; 3 -> {7, 11}; 5 -> {9, 13}; 4 -> {8, 12};
    // 6 -> {10, 14}. The leaves stream to each other across ranks 1 and 6, which die.
    let dead: [Rank; 2] = [1, 6];
    let view = tree_view(2, N, &[]).unwrap();
    let leaves: Vec<Rank> = view
        .iter()
        .filter(|n| n.children.is_empty())
        .map(|n| n.rank)
        .collect();
    assert_eq!(leaves, (7..15).collect::<Vec<_>>());
    let dvm = start_dvm(N, &loopback_config(2));
    let senders: Vec<&Daemon> = leaves.iter().map(|r| &dvm[*r as usize]).collect();
    let rx = listen(&senders);
    let (dtx, drx) = unbounded();
    let (ready_tx, ready_rx) = unbounded();
    let mut gos = Vec::new();
    std::thread::scope(|s| {
        for d in &senders {
            let h = d.handle();
            let dtx = dtx.clone();
            let ready_tx = ready_tx.clone();
            let (go_tx, go_rx) = unbounded::<()>();
            gos.push(go_tx);
            // Every other leaf, and the two daemons about to die.
            let mut dsts: Vec<Rank> = leaves.iter().copied().filter(|r| *r != h.rank()).collect();
            dsts.extend(dead);
            s.spawn(move || {
                // A third before the deaths; the rest once both daemons are gone (queued
                // towards them until the neighbours notice, then replayed over the repair).
                stream(&h, &dsts, 0..PER / 3, &dtx);
                ready_tx.send(()).unwrap();
                go_rx.recv().unwrap();
                let mut seq = PER / 3;
                while seq < PER {
                    let end = (seq + 20).min(PER);
                    stream(&h, &dsts, seq..end, &dtx);
                    seq = end;
                    std::thread::sleep(Duration::from_millis(5));
                }
            });
        }
        for _ in &senders {
            ready_rx.recv_timeout(HANG_GUARD).unwrap();
        }
        for r in dead {
            dvm[r as usize].abort();
        }
        for go in &gos {
            go.send(()).unwrap();
        }
    });
    let n = leaves.len() as u32;
    let total = (n * (n - 1) * PER) as usize;
    let got = check_in_order(&rx, total);
    assert!(got.values().all(|c| *c == PER), "{got:?}");
    let sends = (n * (n - 1 + dead.len() as u32) * PER) as usize;
    let mut to_dead = (0, 0);
    for i in 0..sends {
        let (o, d, r) = drx
            .recv_timeout(HANG_GUARD)
            .unwrap_or_else(|_| panic!("only {i} of {sends} completions"));
        if dead.contains(&d) {
            match r {
                Ok(()) => to_dead.0 += 1,
                Err(SendError::NodeDown(x)) if x == d => to_dead.1 += 1,
                other => panic!("completion of {o} -> dead {d}: {other:?}"),
            }
        } else {
            assert_eq!(r, Ok(()), "completion of {o} -> {d}");
        }
    }
    assert!(drx.try_recv().is_err(), "a completion ran twice");
    let mut sum = Counters::default();
    for d in &senders {
        let c = d.counters().unwrap();
        assert_eq!(c.relm_unacked, 0, "rank {}", d.rank());
        assert!(!d.is_stopped(), "rank {} stopped", d.rank());
        sum.relm_retransmits += c.relm_retransmits;
        sum.relm_duplicates += c.relm_duplicates;
        sum.relm_link_updates += c.relm_link_updates;
    }
    eprintln!(
        "to the dead: {} ok, {} node-down; at the leaves: {} retransmits, {} duplicates, {} link updates",
        to_dead.0, to_dead.1, sum.relm_retransmits, sum.relm_duplicates, sum.relm_link_updates
    );
    for r in dead {
        assert_eq!(
            senders[0].send_reliable_wait(r, TAG, payload(0, 0), HANG_GUARD),
            Err(SendError::NodeDown(r))
        );
    }
    assert!(rx.try_recv().is_err(), "an extra message arrived");
}

#[test]
fn misuse_is_refused_at_once() {
    let mut cfg = loopback_config(2);
    cfg.msg_max_bytes = 1024;
    let dvm = start_dvm(2, &cfg);
    let d = &dvm[1];
    assert_eq!(d.send_reliable(0, 5, "x"), Err(SendError::ReservedTag(5)));
    assert_eq!(
        d.send_reliable(2, TAG, "x"),
        Err(SendError::RankOutOfRange { rank: 2, size: 2 })
    );
    assert_eq!(
        d.send_reliable(0, TAG, vec![0u8; 1025]),
        Err(SendError::TooLarge {
            len: 1025,
            max: 1024
        })
    );
    // A refused call never runs its completion.
    let (tx, rx) = unbounded();
    assert!(
        d.send_reliable_with(0, 99, "x", move |r| tx.send(r).unwrap())
            .is_err()
    );
    assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
    assert_eq!(
        d.send_reliable_wait(7, TAG, "x", HANG_GUARD),
        Err(SendError::RankOutOfRange { rank: 7, size: 2 })
    );
    // The largest allowed payload goes.
    let rx = listen(&[&dvm[0]]);
    let mut big = payload(1, 0).to_vec();
    big.resize(1024, 0);
    let (btx, brx) = unbounded();
    dvm[0]
        .recv(Peer::Rank(1), TAG + 1, tbon::RecvMode::Once, move |m| {
            btx.send(m.payload.len()).unwrap()
        })
        .unwrap();
    assert_eq!(d.send_reliable_wait(0, TAG + 1, big, HANG_GUARD), Ok(()));
    assert_eq!(brx.recv_timeout(HANG_GUARD), Ok(1024));
    assert!(rx.try_recv().is_err());
    // After a stop, every call says so.
    d.shutdown();
    assert_eq!(d.send_reliable(0, TAG, "x"), Err(SendError::ShutDown));
    assert_eq!(
        d.send_reliable_wait(0, TAG, "x", HANG_GUARD),
        Err(SendError::ShutDown)
    );
}

#[test]
fn a_reliable_send_to_myself_is_posted_locally() {
    let dvm = start_dvm(2, &loopback_config(2));
    let rx = listen(&[&dvm[1]]);
    for seq in 0..3 {
        assert_eq!(
            dvm[1].send_reliable_wait(1, TAG, payload(1, seq), HANG_GUARD),
            Ok(())
        );
    }
    check_in_order(&rx, 3);
    let c = dvm[1].counters().unwrap();
    assert_eq!((c.sent, c.delivered, c.relm_sent), (3, 3, 0));
}

/// Rank 0 holds at most one unmatched message and no receive is posted: the first reliable
/// message from rank 1 is held (and acknowledged), the next ones are refused, not dropped and
/// not acknowledged. Once a receive is posted, the origin's retransmissions bring them in
/// order.
#[test]
fn a_full_unmatched_list_refuses_and_the_origin_replays() {
    let dvm = start_dvm_with(2, |r| {
        let mut c = loopback_config(2);
        if r == 0 {
            c.unmatched_max = 1;
        }
        c.relm_retransmit_ms = 100;
        c
    });
    let (dtx, drx) = unbounded();
    stream(&dvm[1].handle(), &[0], 0..3, &dtx);
    assert_eq!(drx.recv_timeout(HANG_GUARD).unwrap(), (1, 0, Ok(())));
    wait_counters(&dvm[0], "a refused reliable message", |c| {
        c.relm_refused >= 1
    });
    assert!(
        drx.try_recv().is_err(),
        "a refused message was acknowledged"
    );
    let rx = listen(&[&dvm[0]]);
    check_in_order(&rx, 3);
    for _ in 1..3 {
        assert_eq!(drx.recv_timeout(HANG_GUARD).unwrap(), (1, 0, Ok(())));
    }
    let c = dvm[0].counters().unwrap();
    assert_eq!((c.relm_posted, c.dropped_unmatched), (3, 0));
}

/// `send_reliable` without a completion, as fast as it is taken, with a window of 8: a full
/// window is refused `Busy` at the call (and counted), and every message the caller was told
/// was sent arrives once and in order. (RELM used to refuse them after the call returned `Ok`,
/// and those were lost without a word.)
#[test]
fn a_full_reliable_window_is_refused_at_the_call_and_nothing_is_lost() {
    const N: u32 = 5_000;
    let dvm = start_dvm_with(3, |r| {
        let mut c = loopback_config(2);
        if r == 2 {
            c.relm_unacked_max = 8;
        }
        c
    });
    let rx = listen(&[&dvm[1]]);
    let h = dvm[2].handle();
    let mut busy = 0u64;
    for seq in 0..N {
        loop {
            match h.send_reliable(1, TAG, payload(2, seq)) {
                Ok(()) => break,
                Err(SendError::Busy(tbon::Limit::ReliableWindow)) => {
                    busy += 1;
                    std::thread::yield_now();
                }
                Err(e) => panic!("send {seq}: {e}"),
            }
        }
    }
    assert!(busy > 0, "a window of 8 never filled");
    let got = check_in_order(&rx, N as usize);
    assert_eq!(got.get(&(1, 2)), Some(&N));
    let c = wait_counters(&dvm[2], "every message acknowledged", |c| {
        c.relm_unacked == 0
    });
    assert_eq!(c.relm_busy, busy);
    assert_eq!(c.relm_sent, u64::from(N));
    assert!(rx.try_recv().is_err(), "a message arrived twice");
}

#[test]
fn stopping_fails_the_outstanding_reliable_sends() {
    let dvm = start_dvm_with(2, |r| {
        let mut c = loopback_config(2);
        if r == 0 {
            c.unmatched_max = 1;
        }
        c
    });
    let (dtx, drx) = unbounded();
    stream(&dvm[1].handle(), &[0], 0..2, &dtx);
    assert_eq!(drx.recv_timeout(HANG_GUARD).unwrap(), (1, 0, Ok(())));
    wait_counters(&dvm[0], "a refused reliable message", |c| {
        c.relm_refused >= 1
    });
    assert_eq!(dvm[1].counters().unwrap().relm_unacked, 1);
    dvm[1].shutdown();
    assert_eq!(
        drx.recv_timeout(HANG_GUARD).unwrap(),
        (1, 0, Err(SendError::ShutDown))
    );
}

/// Accepts a parent's dial on `listener` as the scripted rank 3: Hello, HelloAck, Auth.
fn accept_parent(listener: &TcpListener, hs_cfg: &HandshakeConfig) -> Wire {
    let (s, _) = listener.accept().unwrap();
    let mut w = Wire::new(s);
    let mut acc = Handshake::accept(hs_cfg, common::nonce());
    w.accept_dial(&mut acc);
    w.start_session(3, 1);
    w
}

/// The next frame of `kind`, skipping heartbeats, the contact table, collective messages,
/// notices and reliable messages (a reconnected link's session writes again what the
/// scripted end never acknowledged).
fn next_of(w: &mut Wire, kind: Kind) -> Frame {
    loop {
        let f = w.recv().expect("the parent hung up");
        if f.header.kind == kind {
            return f;
        }
        assert!(
            matches!(
                f.header.kind,
                Kind::Heartbeat | Kind::Xcast | Kind::Grpcomm | Kind::Msg | Kind::RelmData
            ),
            "unexpected {:?}",
            f.header
        );
    }
}

/// A scripted leaf (rank 3 under rank 1; radix 2, 4 daemons) checks what the real daemons put
/// on the wire: reliable messages relayed to it as `RelmData` with the uid chain in `seq`; after
/// it hangs up, its parent redials it (a probe the peer answers, no death) and sends a link
/// update offering the messages it holds for it; a request is answered with a replay; its
/// acknowledgement travels back to the origin, whose completions then say `Ok`.
#[test]
fn a_link_that_comes_back_gets_a_link_update_and_replays() {
    let _ = env_logger::builder().is_test(true).try_init();
    let mut cfg = loopback_config(2);
    cfg.relm_cache_ms = 3_600_000;
    cfg.relm_retransmit_ms = 3_600_000;
    cfg.heartbeat_timeout_ms = 3_600_000;
    let root = tbon::start(cfg.clone(), 0, 4, None).unwrap();
    let root_addr = root.contact_uri().parse::<ContactUri>().unwrap().addrs[0];
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let hs_cfg = HandshakeConfig {
        me: 3,
        size: 4,
        epoch: 0,
        dvm_id: cfg.dvm_id.clone(),
        key: JobKey::new(std::fs::read(key_file()).unwrap().trim_ascii_end()),
    };
    let mut to_root = Wire::dial(root_addr);
    let mut hs = Handshake::dial(&hs_cfg, 0, common::nonce());
    to_root.join(&mut hs);
    to_root.start_session(3, 0);
    let me = ContactUri {
        dvm_id: cfg.dvm_id.clone(),
        rank: 3,
        addrs: vec![listener.local_addr().unwrap()],
    };
    let report = Header {
        kind: Kind::Msg,
        origin: 3,
        dst: 0,
        tag: TAG_WIREUP_REPORT,
        epoch: 0,
        seq: 0,
        len: 0,
        lives: 0,
    };
    to_root.send(&report, &Bytes::from(me.to_string()));
    let others: Vec<_> = (1..3)
        .map(|r| tbon::start(cfg.clone(), r, 4, Some(root.contact_uri())).unwrap())
        .collect();
    let mut from_parent = accept_parent(&listener, &hs_cfg);
    assert!(root.wait_wired(HANG_GUARD) && others[0].wait_wired(HANG_GUARD));

    // Three reliable messages 0 -> 3, relayed by rank 1.
    let (dtx, drx) = unbounded();
    stream(&root.handle(), &[3], 0..3, &dtx);
    // Each arrives as a lone frame or in a reliable batch (`relm::batch`: the messages RELM
    // hands to one neighbour in one turn), whichever the daemons' timing made.
    let mut uids = Vec::new();
    let mut seq = 0;
    while seq < 3 {
        let f = next_of(&mut from_parent, Kind::RelmData);
        let h = f.header;
        let items: Vec<DataFrame> = if h.tag == TAG_BATCH {
            Items::new(f.payload.clone(), h.origin, h.dst, |t| t == TAG)
                .expect("a valid batch")
                .collect()
        } else {
            let (uid, prev) = unpack_seq(h.seq);
            vec![DataFrame {
                origin: h.origin,
                dst: h.dst,
                tag: h.tag,
                uid,
                prev,
                payload: f.payload.clone(),
            }]
        };
        for d in items {
            assert_eq!((d.origin, d.dst, d.tag), (0, 3, TAG));
            assert_eq!(decode(&d.payload), (0, seq));
            assert_eq!(
                d.prev,
                uids.last().copied().unwrap_or(tbon::relm::uid::NONE)
            );
            uids.push(d.uid);
            seq += 1;
        }
    }
    // Nothing acknowledged: the origin still holds them.
    assert!(drx.try_recv().is_err());
    assert_eq!(root.counters().unwrap().relm_unacked, 3);

    // Hang up; rank 1 probes its lost child, and the link comes back.
    from_parent
        .stream
        .shutdown(std::net::Shutdown::Both)
        .unwrap();
    drop(from_parent);
    let mut from_parent = accept_parent(&listener, &hs_cfg);
    let f = next_of(&mut from_parent, Kind::Relm);
    assert_eq!((f.header.origin, f.header.dst), (1, 3));
    match Control::decode(4, &f.payload).unwrap() {
        Control::LinkUpdate { depth, offers } => {
            assert_eq!(depth, 1, "rank 1's depth");
            let mut keys: Vec<(Rank, Rank, u32)> = offers
                .iter()
                .map(|o| (o.key.origin, o.dst, o.key.uid))
                .collect();
            keys.sort_unstable();
            let want: Vec<_> = uids.iter().map(|u| (0, 3, *u)).collect();
            assert_eq!(keys, want, "the offered messages");
        }
        other => panic!("expected a link update, got {other:?}"),
    }

    // Ask for the second one again: rank 1 replays it from its cache.
    let relm = |control: Control| {
        let p = control.encode();
        let h = Header {
            kind: Kind::Relm,
            origin: 3,
            dst: 1,
            tag: 0,
            epoch: 0,
            seq: 0,
            len: p.len() as u32,
            lives: 0,
        };
        (h, p)
    };
    let (h, p) = relm(Control::Request {
        key: MsgKey {
            origin: 0,
            uid: uids[1],
        },
        dst: 3,
    });
    from_parent.send(&h, &p);
    let f = next_of(&mut from_parent, Kind::RelmData);
    assert_eq!(unpack_seq(f.header.seq), (uids[1], uids[0]));
    assert_eq!(decode(&f.payload), (0, 1));

    // Acknowledge all three: the origin's completions say Ok.
    let (h, p) = relm(Control::Ack {
        origin: 0,
        dst: 3,
        upto: uids[2],
        // Rank 0 was never restarted.
        life: 0,
    });
    from_parent.send(&h, &p);
    for _ in 0..3 {
        assert_eq!(drx.recv_timeout(HANG_GUARD).unwrap(), (0, 3, Ok(())));
    }
    let c = others[0].counters().unwrap();
    assert!(c.relm_link_updates >= 1 && c.relm_replays >= 1, "{c:?}");
    assert_eq!(c.relm_cached, 0, "the ack released rank 1's copies");
    assert_eq!(root.counters().unwrap().relm_unacked, 0);
    drop((to_root, from_parent));
}
