//! Strangers and hostile input against a live, authenticated DVM: a daemon with the wrong key,
//! garbage bytes, a header announcing a huge payload, a wrong protocol version, a forged proof,
//! a peer that sends one byte and stops, many connections opened and abandoned, and a bulk
//! connection carrying something other than stream data. Each is closed with a logged reason
//! and counted; the DVM keeps serving its own traffic.

mod common;

use common::{HANG_GUARD, loopback_config, start_dvm};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use tbon::oob::handshake::JobKey;
use tbon::oob::uri::ContactUri;
use tbon::oob::{Handshake, HandshakeConfig, Header, Kind};
use tbon::{Peer, StopReason};

fn addr_of(d: &tbon::Daemon) -> std::net::SocketAddr {
    let u: ContactUri = d.contact_uri().parse().unwrap();
    u.addrs[0]
}

/// Connects, writes `bytes`, and waits until the daemon closes the connection.
fn expect_closed(addr: std::net::SocketAddr, bytes: &[u8]) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(HANG_GUARD)).unwrap();
    let _ = s.write_all(bytes);
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
            Err(e) => panic!("the daemon did not close a hostile connection: {e}"),
        }
    }
}

fn still_serving(dvm: &[tbon::Daemon], tag: u32) {
    for d in dvm {
        for e in dvm {
            if d.rank() != e.rank() {
                d.send(e.rank(), tag, "ok").unwrap();
            }
        }
    }
    for d in dvm {
        for _ in 1..dvm.len() {
            d.recv_blocking(Peer::Any, tag, HANG_GUARD)
                .expect("legitimate traffic stopped");
        }
    }
}

/// A stranger claiming rank `claims` in a DVM of `size`: a real Hello (right identity, wrong
/// key) and, without waiting for the HelloAck, a forged Auth; returns once the daemon closed.
fn hello_and_forged_auth(addr: std::net::SocketAddr, claims: u32, size: u32) {
    let stranger = HandshakeConfig {
        me: claims,
        size,
        epoch: 0,
        dvm_id: "tbon".into(),
        key: JobKey::new(*b"guessed-key-0123456789"),
    };
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(HANG_GUARD)).unwrap();
    let mut hs = Handshake::dial(&stranger, 0, common::nonce());
    while let Some((h, p)) = hs.poll_transmit() {
        s.write_all(&h.encode()).unwrap();
        s.write_all(&p).unwrap();
    }
    let auth = Header {
        kind: Kind::Auth,
        origin: claims,
        dst: 0,
        tag: 0,
        epoch: 0,
        seq: 0,
        len: 32,
        lives: 0,
    };
    s.write_all(&auth.encode()).unwrap();
    s.write_all(&[0u8; 32]).unwrap();
    let mut buf = [0u8; 4096];
    while !matches!(s.read(&mut buf), Ok(0) | Err(_)) {}
}

#[test]
fn a_daemon_with_the_wrong_key_cannot_join() {
    let _ = env_logger::builder().is_test(true).try_init();
    let root = tbon::start(loopback_config(2), 0, 2, None).unwrap();
    let dir = std::env::temp_dir().join(format!("tbon-wrongkey-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let wrong = dir.join("other.key");
    std::fs::write(&wrong, "not-the-dvm-key-at-all").unwrap();
    let mut cfg = loopback_config(2);
    cfg.key_file = Some(wrong.display().to_string());
    cfg.reconnect_base_ms = 10;
    let intruder = tbon::start(cfg, 1, 2, Some(root.contact_uri())).unwrap();
    assert_eq!(
        intruder.wait_stopped(HANG_GUARD),
        Some(StopReason::RootLost(
            tbon::node::FATAL_RANK_0_WRONG_KEY.into()
        )),
        "the stop names the key, not the network"
    );
    // A restarted (or joining) daemon with the wrong key says so too, after its dials: it
    // used to ask again until its rejoin's deadline (twice the wire-up timeout).
    let mut rejoining = loopback_config(2);
    rejoining.key_file = Some(wrong.display().to_string());
    rejoining.reconnect_base_ms = 10;
    rejoining.rejoin = true;
    rejoining.wireup_timeout_ms = 60_000;
    let started = Instant::now();
    let again = tbon::start(rejoining, 1, 2, Some(root.contact_uri())).unwrap();
    assert_eq!(
        again.wait_stopped(HANG_GUARD),
        Some(StopReason::RootLost(
            tbon::node::FATAL_RANK_0_WRONG_KEY.into()
        ))
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    assert!(!root.wait_wired(Duration::from_millis(10)));
    // Rank 0 saw each attempt hang up before the proof, and counted it.
    assert!(root.counters().unwrap().protocol_errors >= 1);
    assert!(!root.is_stopped());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn no_key_and_not_insecure_refuses_to_start() {
    let mut cfg = loopback_config(2);
    cfg.key_file = None;
    // The test process has no TBON_KEY in its environment.
    if std::env::var_os("TBON_KEY").is_none() {
        let err = tbon::start(cfg.clone(), 0, 1, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no job key"), "{err}");
        cfg.insecure = true;
        let d = tbon::start(cfg, 0, 1, None).expect("insecure start");
        assert!(d.wait_wired(HANG_GUARD));
    }
}

#[test]
fn hostile_connections_are_closed_and_the_dvm_keeps_serving() {
    let mut cfg = loopback_config(2);
    cfg.handshake_timeout_ms = 300;
    let dvm = start_dvm(4, &cfg);
    let addr = addr_of(&dvm[0]);
    let before = dvm[0].counters().unwrap().protocol_errors;

    // Garbage.
    expect_closed(addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    // A valid-looking Hello announcing a 4 GiB payload.
    let huge = Header {
        kind: Kind::Hello,
        origin: 1,
        dst: 0,
        tag: 0,
        epoch: 0,
        seq: 0,
        len: u32::MAX,
        lives: 0,
    };
    expect_closed(addr, &huge.encode());
    // A wrong protocol version.
    let mut v = huge;
    v.len = 0;
    let mut bytes = v.encode();
    bytes[2] = 99;
    expect_closed(addr, &bytes);
    // A real Hello with the right identity but no key, and a forged proof sent without waiting
    // for the HelloAck: refused at the proof.
    hello_and_forged_auth(addr, 3, 4);

    // One byte, then silence: the handshake timeout closes it.
    expect_closed(addr, b"T");
    // Many connections opened and abandoned.
    let abandoned: Vec<TcpStream> = (0..1_000)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();

    let deadline = Instant::now() + HANG_GUARD;
    while dvm[0].counters().unwrap().protocol_errors < before + 5 {
        assert!(
            Instant::now() < deadline,
            "hostile connections were not counted"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    still_serving(&dvm, 300);
    // The abandoned connections are closed by the handshake timeout, not kept forever.
    let deadline = Instant::now() + HANG_GUARD;
    while dvm[0].counters().unwrap().connections > 3 {
        assert!(Instant::now() < deadline, "abandoned connections were kept");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(abandoned);
    still_serving(&dvm, 301);
}

#[test]
fn a_daemon_listens_only_on_the_selected_address() {
    // `loopback_config` selects 127.0.0.1/32; on Linux all of 127.0.0.0/8 is local, so a
    // listener on the wildcard address would answer at 127.0.0.2 too.
    let dvm = start_dvm(2, &loopback_config(2));
    let addr = addr_of(&dvm[0]);
    assert_eq!(addr.ip(), std::net::Ipv4Addr::LOCALHOST);
    let other =
        std::net::SocketAddr::new(std::net::Ipv4Addr::new(127, 0, 0, 2).into(), addr.port());
    let err = TcpStream::connect_timeout(&other, HANG_GUARD)
        .expect_err("a connection to an address the interface settings exclude was accepted");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
    // The selected address still works.
    expect_closed(addr, b"garbage, refused at the header");
}

#[test]
fn a_mac_mismatch_is_counted_once() {
    let dvm = start_dvm(2, &loopback_config(2));
    let addr = addr_of(&dvm[0]);
    let before = dvm[0].counters().unwrap();
    hello_and_forged_auth(addr, 1, 2);
    let deadline = Instant::now() + HANG_GUARD;
    let after = loop {
        let c = dvm[0].counters().unwrap();
        if c.handshakes_refused > before.handshakes_refused {
            break c;
        }
        assert!(Instant::now() < deadline, "the forged Auth was not counted");
        std::thread::sleep(Duration::from_millis(10));
    };
    // Give a second count (the old double count on close) the chance to show.
    std::thread::sleep(Duration::from_millis(200));
    let after2 = dvm[0].counters().unwrap();
    assert_eq!(after2.handshakes_refused, after.handshakes_refused);
    assert_eq!(after2.handshakes_refused - before.handshakes_refused, 1);
    assert_eq!(after2.protocol_errors - before.protocol_errors, 1);
    assert_eq!(after2.handshakes_abandoned, before.handshakes_abandoned);
}

#[test]
fn pending_handshakes_are_bounded_per_source_oldest_evicted() {
    let dvm = start_dvm(2, &loopback_config(2));
    let addr = addr_of(&dvm[0]);
    let n = tbon::limits::PENDING_HANDSHAKES_PER_SOURCE_MAX * 3;
    let mut flood: Vec<TcpStream> = (0..n).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let want = (n - tbon::limits::PENDING_HANDSHAKES_PER_SOURCE_MAX) as u64;
    let deadline = Instant::now() + HANG_GUARD;
    while dvm[0].counters().unwrap().handshakes_evicted < want {
        assert!(
            Instant::now() < deadline,
            "no eviction at the per-source bound"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let c = dvm[0].counters().unwrap();
    // The oldest ones were closed; the newest are still held; the DVM's own link is intact.
    assert!(c.connections <= tbon::limits::PENDING_HANDSHAKES_PER_SOURCE_MAX as u64 + 1);
    let oldest = &mut flood[0];
    oldest.set_read_timeout(Some(HANG_GUARD)).unwrap();
    let mut buf = [0u8; 16];
    assert!(
        matches!(oldest.read(&mut buf), Ok(0) | Err(_)),
        "the oldest was kept"
    );
    let newest = flood.last_mut().unwrap();
    newest
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    assert!(
        matches!(newest.read(&mut buf), Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut),
        "the newest was closed"
    );
    drop(flood);
    still_serving(&dvm, 302);
}

/// Writes every frame `hs` has queued on `s`.
fn write_handshake(s: &mut TcpStream, hs: &mut Handshake) {
    while let Some((h, p)) = hs.poll_transmit() {
        s.write_all(&h.encode()).unwrap();
        s.write_all(&p).unwrap();
    }
}

/// Reads the next frame from `s`, or `None` once the daemon closed the connection.
fn next_frame(s: &mut TcpStream, dec: &mut tbon::oob::FrameDecoder) -> Option<tbon::oob::Frame> {
    loop {
        if let Some(f) = dec.next_frame().unwrap() {
            return Some(f);
        }
        match s.read(dec.read_space()) {
            Ok(0) | Err(_) => return None,
            Ok(n) => dec.commit(n),
        }
    }
}

#[test]
fn a_bulk_connection_answers_syncs_and_closes_on_anything_but_stream_data() {
    let dvm = start_dvm(3, &loopback_config(2));
    let before = dvm[1].counters().unwrap().protocol_errors;
    // An insider (it holds the key) opens a bulk connection to rank 1 as rank 2.
    let key = std::fs::read_to_string(common::key_file()).unwrap();
    let me = HandshakeConfig {
        me: 2,
        size: 3,
        epoch: 1,
        dvm_id: "tbon".into(),
        key: JobKey::new(key.trim_end().as_bytes()),
    };
    let mut s = TcpStream::connect(addr_of(&dvm[1])).unwrap();
    s.set_read_timeout(Some(HANG_GUARD)).unwrap();
    let mut dec = tbon::oob::FrameDecoder::new(1 << 20);
    let mut hs = Handshake::dial_bulk(&me, 1, common::nonce());
    write_handshake(&mut s, &mut hs);
    let ack = next_frame(&mut s, &mut dec).expect("HelloAck");
    hs.handle_frame(ack).unwrap();
    write_handshake(&mut s, &mut hs);
    let ready = next_frame(&mut s, &mut dec).expect("Ready");
    let event = hs.handle_frame(ready).unwrap();
    assert!(
        matches!(event, Some(tbon::oob::HandshakeEvent::Established(p)) if p.bulk),
        "{event:?}"
    );
    // A sync is answered with its number.
    let sync = Header {
        kind: Kind::Link,
        origin: 2,
        dst: 1,
        tag: 1,
        epoch: 0,
        seq: 7,
        len: 0,
        lives: 0,
    };
    s.write_all(&sync.encode()).unwrap();
    let answer = next_frame(&mut s, &mut dec).expect("the sync's answer");
    assert_eq!(
        (
            answer.header.kind,
            answer.header.tag,
            answer.header.epoch,
            answer.header.seq
        ),
        (Kind::Link, 2, 0, 7)
    );
    // A message that is not stream data closes the connection, and nothing else.
    let msg = Header {
        kind: Kind::Msg,
        origin: 2,
        dst: 1,
        tag: 100,
        epoch: 1,
        seq: 0,
        len: 2,
        lives: 0,
    };
    s.write_all(&msg.encode()).unwrap();
    s.write_all(b"hi").unwrap();
    assert!(
        next_frame(&mut s, &mut dec).is_none(),
        "the connection stayed open"
    );
    assert_eq!(dvm[1].counters().unwrap().protocol_errors, before + 1);
    still_serving(&dvm, 302);
}
