//! Simultaneous connects end with exactly one connection, decided only by connections that
//! proved the key (`oob::arbiter`), and a stranger's `Hello` claiming a rank changes nothing.
//! A scripted fake daemon, speaking the real wire protocol over blocking sockets, makes each
//! race happen deterministically against a real daemon.

mod common;

use bytes::Bytes;
use common::wire::Wire;
use common::{HANG_GUARD, loopback_config};
use std::net::TcpListener;
use tbon::oob::handshake::JobKey;
use tbon::oob::uri::ContactUri;
use tbon::oob::{Handshake, HandshakeConfig, HandshakeEvent, Header, Kind};

fn cfg(me: u32) -> HandshakeConfig {
    HandshakeConfig {
        me,
        size: 2,
        epoch: 0,
        dvm_id: "tbon".into(),
        key: JobKey::new(std::fs::read(common::key_file()).unwrap().trim_ascii_end()),
    }
}

/// A stranger's configuration: it claims rank `me` but holds another key.
fn stranger(me: u32) -> HandshakeConfig {
    HandshakeConfig {
        key: JobKey::new(*b"not the job key, not at all"),
        ..cfg(me)
    }
}

fn wait_connections(d: &tbon::Daemon, n: u64) {
    let deadline = std::time::Instant::now() + HANG_GUARD;
    while d.counters().unwrap().connections != n {
        assert!(
            std::time::Instant::now() < deadline,
            "connections never reached {n}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

fn uri_addr(uri: &str) -> std::net::SocketAddr {
    let u: ContactUri = uri.parse().unwrap();
    u.addrs[0]
}

/// A real rank 0 and a fake rank 1 that has joined (reported, got the table); the fake's
/// listener is where rank 0 dials it.
fn real_rank_0_with_fake_rank_1(cfg0: tbon::config::Config) -> (tbon::Daemon, Wire, TcpListener) {
    let real = tbon::start(cfg0, 0, 2, None).unwrap();
    let fake_listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let fake_uri = ContactUri {
        dvm_id: "tbon".into(),
        rank: 1,
        addrs: vec![fake_listener.local_addr().unwrap()],
    };
    let mut c1 = Wire::dial(uri_addr(real.contact_uri()));
    c1.join(&mut Handshake::dial(&cfg(1), 0, common::nonce()));
    c1.start_session(1, 0);
    let report = Bytes::from(fake_uri.to_string());
    let h = Header {
        kind: Kind::Msg,
        origin: 1,
        dst: 0,
        tag: tbon::node::wireup::TAG_WIREUP_REPORT,
        epoch: 0,
        seq: 0,
        len: 0,
        lives: 0,
    };
    c1.send(&h, &report);
    let table = c1.recv().unwrap();
    assert_eq!(table.header.kind, Kind::Xcast);
    assert!(real.wait_wired(HANG_GUARD));
    (real, c1, fake_listener)
}

/// Accepts one connection, or fails at the hang guard (a blocked dial never comes).
fn accept_within_guard(listener: &TcpListener) -> std::net::TcpStream {
    listener.set_nonblocking(true).unwrap();
    let deadline = std::time::Instant::now() + HANG_GUARD;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).unwrap();
                return s;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "no dial came: blocked by the stranger's pending handshake"
                );
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
}

/// A real rank 1 of 2 whose rank 0 is the test: returns it with its dial, just accepted.
fn real_rank_1_dialling_fake_rank_0() -> (tbon::Daemon, Wire) {
    let _ = env_logger::builder().is_test(true).try_init();
    let fake_listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let fake_uri = ContactUri {
        dvm_id: "tbon".into(),
        rank: 0,
        addrs: vec![fake_listener.local_addr().unwrap()],
    };
    let real = tbon::start(loopback_config(2), 1, 2, Some(&fake_uri.to_string())).unwrap();
    let (s, _) = fake_listener.accept().unwrap();
    (real, Wire::new(s))
}

/// The next routed message (heartbeats and RELM's link updates are skipped).
fn next_message(c: &mut Wire) -> tbon::oob::Frame {
    std::iter::from_fn(|| c.recv())
        .find(|f| f.header.kind == Kind::Msg)
        .expect("a message")
}

/// Both proofs cross: rank 0's dial has sent its `Auth` when rank 1's dial proves itself.
/// Rank 1 is the higher rank, so rank 0 admits rank 1's dial and closes its own.
#[test]
fn lower_real_rank_keeps_the_connection_the_higher_rank_dialled() {
    let _ = env_logger::builder().is_test(true).try_init();
    let (real, c1, fake_listener) = real_rank_0_with_fake_rank_1(loopback_config(2));
    let real_addr = uri_addr(real.contact_uri());
    // The fake drops its connection. Rank 0 probes its lost child by dialling it; the fake
    // answers that dial and takes rank 0's proof, but does not admit it yet...
    drop(c1);
    let (s, _) = fake_listener.accept().unwrap();
    let mut c2 = Wire::new(s);
    let mut acceptor = Handshake::accept(&cfg(1), common::nonce());
    let hello = c2.recv().unwrap();
    assert_eq!((hello.header.kind, hello.header.origin), (Kind::Hello, 0));
    assert!(matches!(
        acceptor.handle_frame(hello),
        Ok(Some(HandshakeEvent::HelloReceived(_)))
    ));
    assert!(acceptor.try_accept_peer());
    c2.send_all(&mut acceptor);
    let auth = c2.recv().unwrap();
    assert!(matches!(
        acceptor.handle_frame(auth),
        Ok(Some(HandshakeEvent::Authenticated(_)))
    ));
    // ...and dials rank 0 itself: a simultaneous connect with both proofs sent.
    let mut c3 = Wire::dial(real_addr);
    c3.join(&mut Handshake::dial(&cfg(1), 0, common::nonce()));
    c3.start_session(1, 0);

    // The connection rank 1 dialled wins: it carries traffic...
    real.send(1, 100, "which connection?").unwrap();
    let m = next_message(&mut c3);
    assert_eq!(
        (m.header.kind, m.header.origin, &m.payload[..]),
        (Kind::Msg, 0, &b"which connection?"[..])
    );
    // ...and rank 0 closed the one it dialled.
    assert!(c2.recv().is_none(), "the losing connection must be closed");
    wait_connections(&real, 1);
}

/// Both proofs cross, and the real daemon is the higher rank: it refuses the lower rank's
/// dial (after its proof, never before) and keeps its own.
#[test]
fn higher_real_rank_refuses_the_lower_ranks_dial() {
    // Rank 1 dials rank 0 (the fake) to report; the fake answers, takes its proof, and holds
    // the admission while it dials back.
    let (real, mut c1) = real_rank_1_dialling_fake_rank_0();
    let mut acceptor = Handshake::accept(&cfg(0), common::nonce());
    c1.take_proof(&mut acceptor);
    let mut c2 = Wire::dial(uri_addr(real.contact_uri()));
    let mut hs2 = Handshake::dial(&cfg(0), 1, common::nonce());
    c2.send_all(&mut hs2);
    // Every Hello is answered; the decision waits for the proof.
    let ack = c2.recv().expect("HelloAck");
    assert_eq!(hs2.handle_frame(ack), Ok(None));
    c2.send_all(&mut hs2);
    // Rank 1 is the higher rank and its proof is out: it closes ours without `Ready`.
    assert!(c2.recv().is_none(), "the lower rank's dial must be refused");

    // Its own dial, once admitted, carries the wire-up report.
    assert!(acceptor.admit());
    c1.send_all(&mut acceptor);
    c1.start_session(0, 1);
    let report = c1.recv().unwrap();
    assert_eq!(
        (report.header.kind, report.header.origin, report.header.tag),
        (Kind::Msg, 1, tbon::node::wireup::TAG_WIREUP_REPORT)
    );
    wait_connections(&real, 1);
}

/// A dial whose proof is not out yet loses to the peer's proved dial, whatever the ranks:
/// the higher real rank's unanswered dial gives way to the lower rank's.
#[test]
fn an_unproven_dial_gives_way_to_a_proved_one() {
    // Rank 1 dials the fake rank 0, which never answers that dial.
    let (real, mut c1) = real_rank_1_dialling_fake_rank_0();
    assert_eq!(c1.recv().unwrap().header.kind, Kind::Hello);
    // The fake dials rank 1 and proves itself: admitted, and rank 1's own dial is closed.
    let mut c2 = Wire::dial(uri_addr(real.contact_uri()));
    c2.join(&mut Handshake::dial(&cfg(0), 1, common::nonce()));
    c2.start_session(0, 1);
    let report = next_message(&mut c2);
    assert_eq!(
        (report.header.origin, report.header.tag),
        (1, tbon::node::wireup::TAG_WIREUP_REPORT)
    );
    assert!(c1.recv().is_none(), "the unproven dial must be closed");
    wait_connections(&real, 1);
}

/// Issue "Hardening", item 1: a stranger's `Hello` claiming the peer's rank neither blocks a
/// dial (before: no dial while a claimed incoming handshake was pending, up to the handshake
/// timeout) nor cancels one (before: the lower rank closed its own dial at once).
#[test]
fn a_strangers_hello_claiming_the_peer_neither_blocks_nor_cancels_a_dial() {
    let _ = env_logger::builder().is_test(true).try_init();
    // A handshake timeout far beyond the hang guard: a dial blocked until it fires fails here.
    let cfg0 = tbon::config::Config {
        handshake_timeout_ms: 10 * HANG_GUARD.as_millis() as u64,
        ..loopback_config(2)
    };
    let (real, c1, fake_listener) = real_rank_0_with_fake_rank_1(cfg0);
    let real_addr = uri_addr(real.contact_uri());
    // A stranger claims rank 1 and leaves its handshake pending.
    let mut forged = Wire::dial(real_addr);
    forged.send_all(&mut Handshake::dial(&stranger(1), 0, common::nonce()));
    assert_eq!(forged.recv().unwrap().header.kind, Kind::HelloAck);
    // Rank 1 drops its connection; rank 0 probes it by dialling, pending Hello or not.
    drop(c1);
    let s = accept_within_guard(&fake_listener);
    let mut c2 = Wire::new(s);
    let hello = c2.recv().unwrap();
    assert_eq!(hello.header.kind, Kind::Hello);
    // While that dial waits for its answer, another stranger claims rank 1 (the higher rank).
    let mut forged2 = Wire::dial(real_addr);
    forged2.send_all(&mut Handshake::dial(&stranger(1), 0, common::nonce()));
    assert_eq!(forged2.recv().unwrap().header.kind, Kind::HelloAck);
    // The dial survived: the fake answers it, and it becomes the link.
    let mut acceptor = Handshake::accept(&cfg(1), common::nonce());
    assert!(matches!(
        acceptor.handle_frame(hello),
        Ok(Some(HandshakeEvent::HelloReceived(_)))
    ));
    assert!(acceptor.try_accept_peer());
    c2.send_all(&mut acceptor);
    let auth = c2
        .recv()
        .expect("rank 0's proof: its dial was not cancelled");
    assert!(matches!(
        acceptor.handle_frame(auth),
        Ok(Some(HandshakeEvent::Authenticated(_)))
    ));
    assert!(acceptor.admit());
    c2.send_all(&mut acceptor);
    c2.start_session(1, 0);
    real.send(1, 100, "over the dial").unwrap();
    let m = next_message(&mut c2);
    assert_eq!(&m.payload[..], b"over the dial");
    // The strangers' proofs never come; they can only be refused.
    let wrong = Header {
        kind: Kind::Auth,
        origin: 1,
        dst: 0,
        tag: 0,
        epoch: 0,
        seq: 0,
        len: 0,
        lives: 0,
    };
    forged.send(&wrong, &Bytes::from(vec![0u8; 32]));
    assert!(forged.recv().is_none());
    drop(forged2);
    wait_connections(&real, 1);
}
