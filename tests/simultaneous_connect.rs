//! Simultaneous connects end with exactly one connection: the one dialled by the higher rank.
//! A scripted fake daemon, speaking the real wire protocol over blocking sockets, makes the race
//! happen deterministically against a real daemon.

mod common;

use bytes::Bytes;
use common::wire::Wire;
use common::{HANG_GUARD, loopback_config};
use std::net::TcpListener;
use tbon::node::wireup::TAG_WIREUP_REPORT;
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

#[test]
fn lower_real_rank_keeps_the_connection_the_higher_rank_dialled() {
    let _ = env_logger::builder().is_test(true).try_init();
    let real = tbon::start(loopback_config(2), 0, 2, None).unwrap();
    let real_addr = uri_addr(real.contact_uri());
    let fake_listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let fake_uri = ContactUri {
        dvm_id: "tbon".into(),
        rank: 1,
        addrs: vec![fake_listener.local_addr().unwrap()],
    };

    // Fake rank 1 joins normally, then drops its connection.
    let mut c1 = Wire::dial(real_addr);
    let mut hs = Handshake::dial(&cfg(1), 0, common::nonce());
    c1.send_all(&mut hs);
    let ack = c1.recv().unwrap();
    assert!(matches!(
        hs.handle_frame(ack),
        Ok(Some(HandshakeEvent::Established(_)))
    ));
    c1.send_all(&mut hs); // the proof of the key
    let report = Bytes::from(fake_uri.to_string());
    let h = Header {
        kind: Kind::Msg,
        origin: 1,
        dst: 0,
        tag: TAG_WIREUP_REPORT,
        epoch: 0,
        seq: 0,
        len: 0,
    };
    c1.send(&h, &report);
    let table = c1.recv().unwrap();
    assert_eq!(table.header.kind, Kind::Xcast);
    assert!(real.wait_wired(HANG_GUARD));
    // The fake drops its connection. Rank 0 probes its lost child by dialling it, while the
    // fake (rank 1) dials rank 0: a simultaneous connect.
    drop(c1);
    let (s, _) = fake_listener.accept().unwrap();
    let mut c2 = Wire::new(s);
    let hello = c2.recv().unwrap();
    assert_eq!((hello.header.kind, hello.header.origin), (Kind::Hello, 0));
    let mut c3 = Wire::dial(real_addr);
    let mut hs3 = Handshake::dial(&cfg(1), 0, common::nonce());
    c3.send_all(&mut hs3);

    // The connection rank 1 dialled wins: it is acknowledged and carries traffic...
    let ack = c3.recv().unwrap();
    assert!(matches!(
        hs3.handle_frame(ack),
        Ok(Some(HandshakeEvent::Established(_)))
    ));
    c3.send_all(&mut hs3);
    real.send(1, 100, "which connection?").unwrap();
    let m = std::iter::from_fn(|| c3.recv())
        .find(|f| f.header.kind != Kind::Heartbeat)
        .unwrap();
    assert_eq!(
        (m.header.kind, m.header.origin, &m.payload[..]),
        (Kind::Msg, 0, &b"which connection?"[..])
    );
    // ...and rank 0 closes the one it dialled.
    assert!(c2.recv().is_none(), "the losing connection must be closed");
    wait_connections(&real, 1);
}

#[test]
fn higher_real_rank_refuses_the_lower_ranks_dial() {
    let _ = env_logger::builder().is_test(true).try_init();
    let fake_listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let fake_uri = ContactUri {
        dvm_id: "tbon".into(),
        rank: 0,
        addrs: vec![fake_listener.local_addr().unwrap()],
    };
    let real = tbon::start(loopback_config(2), 1, 2, Some(&fake_uri.to_string())).unwrap();

    // Rank 1 dials rank 0 (the fake) to report; the fake holds its answer and dials back.
    let (s, _) = fake_listener.accept().unwrap();
    let mut c1 = Wire::new(s);
    let mut acceptor = Handshake::accept(&cfg(0), common::nonce());
    let hello = c1.recv().unwrap();
    assert!(matches!(
        acceptor.handle_frame(hello),
        Ok(Some(HandshakeEvent::HelloReceived(_)))
    ));
    let mut c2 = Wire::dial(uri_addr(real.contact_uri()));
    let mut hs2 = Handshake::dial(&cfg(0), 1, common::nonce());
    c2.send_all(&mut hs2);
    // Rank 1 is the higher rank: it keeps its own dial and closes ours unanswered.
    assert!(c2.recv().is_none(), "the lower rank's dial must be refused");

    // Its own dial completes and carries the wire-up report.
    assert!(acceptor.try_accept_peer());
    c1.send_all(&mut acceptor);
    let auth = c1.recv().unwrap();
    assert!(matches!(
        acceptor.handle_frame(auth),
        Ok(Some(HandshakeEvent::Established(_)))
    ));
    let report = c1.recv().unwrap();
    assert_eq!(
        (report.header.kind, report.header.origin, report.header.tag),
        (Kind::Msg, 1, TAG_WIREUP_REPORT)
    );
    wait_connections(&real, 1);
}
