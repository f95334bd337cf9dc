//! A peer that stops reading. A scripted daemon (rank 3, a leaf under rank 1) joins with the
//! real key, completes its handshakes, then never reads again, while it keeps sending
//! heartbeats (so silence detection never fires). Its parent's queue towards it stays within
//! `send_queue_max_bytes`: the parent's own sends get `Busy` (back-pressure); frames relayed
//! towards it fill that queue to near its bound and then the parent stops reading the
//! neighbour they come from (flow control: nothing is dropped for a peer that may only be
//! slow); traffic that does not pass through the parent keeps flowing; the queue that stopped
//! moving gets the peer declared failed, after which traffic through the parent flows again
//! and sends to the peer are `NodeDown`.

mod common;

use bytes::Bytes;
use common::wire::Wire;
use common::{HANG_GUARD, key_file, loopback_config};
use crossbeam_channel::unbounded;
use std::net::TcpListener;
use std::time::{Duration, Instant};
use tbon::node::wireup::TAG_WIREUP_REPORT;
use tbon::oob::handshake::JobKey;
use tbon::oob::uri::ContactUri;
use tbon::oob::{Handshake, HandshakeConfig, Header, Kind};
use tbon::{Peer, SendError};

const TAG: u32 = 100;
const QUEUE_MAX: usize = 1 << 20;

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + HANG_GUARD;
    while !cond() {
        assert!(Instant::now() < deadline, "gave up waiting: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_peer_that_stops_reading_is_contained_then_declared_failed() {
    let _ = env_logger::builder().is_test(true).try_init();
    let mut cfg = loopback_config(2);
    cfg.msg_max_bytes = 64 * 1024;
    cfg.send_queue_max_bytes = QUEUE_MAX;
    cfg.socket_buffer_bytes = 64 * 1024;
    cfg.heartbeat_interval_ms = 200;
    // Long enough that the flood below happens before the deaf peer is declared failed.
    cfg.heartbeat_timeout_ms = 5_000;
    // Radix 2, 4 daemons: 0 -> {1, 2}, 1 -> {3}. Rank 3 is the scripted peer.
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

    // Join: report to rank 0 like a daemon would.
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

    // Rank 1 dials its child to forward the contact table: accept it properly, then go deaf.
    let (s, _) = listener.accept().unwrap();
    let mut from_parent = Wire::new(s);
    let mut acc = Handshake::accept(&hs_cfg, common::nonce());
    from_parent.accept_dial(&mut acc);
    from_parent.start_session(3, 1);
    assert!(root.wait_wired(HANG_GUARD));
    let (one, two) = (&others[0], &others[1]);
    assert!(one.wait_wired(HANG_GUARD) && two.wait_wired(HANG_GUARD));
    // From here on the scripted peer reads nothing (its sockets stay open), but it keeps
    // telling its parent it is alive.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let beating = {
        let stop = stop.clone();
        let mut s = from_parent.stream.try_clone().unwrap();
        std::thread::spawn(move || {
            let hb = Header {
                kind: Kind::Heartbeat,
                origin: 3,
                dst: 1,
                tag: 0,
                epoch: 0,
                seq: 0,
                len: 0,
                lives: 0,
            }
            .encode();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                use std::io::Write;
                if s.write_all(&hb).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };

    // Rank 1 floods its deaf child: the bounded queue pushes back with Busy.
    let (tx, rx) = unbounded();
    let chunk = Bytes::from(vec![7u8; 64 * 1024]);
    // 200 x 64 KiB = 12.5 MiB, far past the 1 MiB queue plus kernel buffers. Send them all,
    // then collect: the ones that fit complete (Ok once written, or NodeDown once the peer is
    // declared failed); the rest are refused with Busy.
    // A send may also be refused `Busy` when submitted: the origin gate had already seen the
    // queue congested (flow control), and then no completion comes.
    let n = 200;
    let (mut busy, mut accepted) = (false, 0);
    for _ in 0..n {
        let tx = tx.clone();
        match one.send_with(3, TAG, chunk.clone(), move |r| tx.send(r).unwrap()) {
            Ok(()) => accepted += 1,
            Err(SendError::Busy(_)) => busy = true,
            Err(e) => panic!("unexpected refusal {e}"),
        }
    }
    // Rank 0's frames for rank 3 reach rank 1 and wait in its queue towards 3; once that is
    // nearly full, rank 1 leaves rank 0's frames unread. None is dropped.
    for _ in 0..64 {
        match root.send(3, TAG, chunk.clone()) {
            Ok(()) | Err(SendError::Busy(_)) => {}
            Err(e) => panic!("unexpected refusal {e}"),
        }
    }
    wait_for("rank 1's queue towards the deaf peer to congest", || {
        let c = one.counters().unwrap();
        assert!(
            c.failed.is_empty(),
            "declared failed before the flood was seen"
        );
        c.flow_congested > 0
    });

    let mut ok_bytes = 0usize;
    for _ in 0..accepted {
        match rx
            .recv_timeout(HANG_GUARD)
            .expect("a completion never came")
        {
            Ok(()) => ok_bytes += chunk.len(),
            Err(SendError::Busy(_)) => busy = true,
            Err(SendError::NodeDown(3)) => {}
            Err(e) => panic!("unexpected send error {e}"),
        }
    }
    assert!(busy, "the queue towards a deaf peer never pushed back");
    // What was accepted is the queue's bound plus what the kernel buffers, not 4,096 chunks.
    assert!(
        ok_bytes <= QUEUE_MAX + 16 * 1024 * 1024,
        "{ok_bytes} bytes accepted"
    );

    // Traffic that does not pass through rank 1 keeps flowing.
    for (a, b) in [(&root, two), (two, &root)] {
        a.send(b.rank(), TAG + 1, "unaffected").unwrap();
        let m = b
            .recv_blocking(Peer::Rank(a.rank()), TAG + 1, HANG_GUARD)
            .expect("traffic not involving the deaf peer stopped");
        assert_eq!(&m.payload[..], b"unaffected");
    }

    // It never went silent, but its queue stopped moving: declared failed everywhere; then
    // sends to it are node-down.
    wait_for("the deaf peer to be declared failed", || {
        [&root, one, two]
            .iter()
            .all(|d| d.counters().unwrap().failed == [3])
    });
    // Then traffic through rank 1 flows again, both ways, and nothing was ever dropped at a
    // full queue.
    for (a, b) in [(&root, one), (one, two), (two, one), (one, &root)] {
        let body = Bytes::from_static(b"after");
        let deadline = Instant::now() + HANG_GUARD;
        // `Busy` while rank 1's congestion drains.
        while let Err(e) = a.send(b.rank(), TAG + 2, body.clone()) {
            assert!(matches!(e, SendError::Busy(_)), "unexpected refusal {e}");
            assert!(Instant::now() < deadline, "still busy");
            std::thread::sleep(Duration::from_millis(10));
        }
        let m = b
            .recv_blocking(Peer::Rank(a.rank()), TAG + 2, HANG_GUARD)
            .expect("traffic through rank 1 did not resume");
        assert_eq!(&m.payload[..], b"after");
    }
    for d in [&root, one, two] {
        assert_eq!(d.counters().unwrap().dropped_queue_full, 0);
    }
    let (tx, rx) = unbounded();
    two.send_with(3, TAG, "anyone there?", move |r| tx.send(r).unwrap())
        .unwrap();
    assert_eq!(
        rx.recv_timeout(HANG_GUARD).unwrap(),
        Err(SendError::NodeDown(3))
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    beating.join().unwrap();
    drop((to_root, from_parent));
}
