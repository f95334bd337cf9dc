//! A scripted peer: one end of a tbon connection driven by a test over a blocking socket,
//! speaking the real wire protocol through the library's sans-IO codec and handshake.

use super::HANG_GUARD;
use bytes::Bytes;
use std::io::{Read, Write};
use std::net::TcpStream;
use tbon::oob::session::Control;
use tbon::oob::{Frame, FrameDecoder, Handshake, HandshakeEvent, Header, Kind};

/// One end of a connection driven by the test.
pub struct Wire {
    pub stream: TcpStream,
    decoder: FrameDecoder,
}

impl Wire {
    pub fn new(stream: TcpStream) -> Self {
        stream.set_read_timeout(Some(HANG_GUARD)).unwrap();
        Wire {
            stream,
            decoder: FrameDecoder::new(1 << 20),
        }
    }

    pub fn dial(addr: std::net::SocketAddr) -> Self {
        Wire::new(TcpStream::connect(addr).unwrap())
    }

    pub fn send(&mut self, h: &Header, payload: &Bytes) {
        let mut h = *h;
        h.len = payload.len() as u32;
        self.stream.write_all(&h.encode()).unwrap();
        self.stream.write_all(payload).unwrap();
    }

    pub fn send_all(&mut self, hs: &mut Handshake) {
        while let Some((h, p)) = hs.poll_transmit() {
            self.send(&h, &p);
        }
    }

    /// Dialler side of the whole handshake (Hello, HelloAck, Auth, Ready): returns once the
    /// peer has admitted the connection.
    pub fn join(&mut self, hs: &mut Handshake) {
        self.send_all(hs);
        let ack = self.recv().expect("HelloAck");
        assert_eq!(hs.handle_frame(ack), Ok(None), "HelloAck");
        self.send_all(hs); // the proof of the key
        let ready = self.recv().expect("Ready");
        assert!(matches!(
            hs.handle_frame(ready),
            Ok(Some(HandshakeEvent::Established(_)))
        ));
    }

    /// Acceptor side up to the dialler's proof (Hello, HelloAck, Auth): returns once `acc`
    /// has authenticated the dialler; admitting it (`Ready`) is the caller's decision.
    pub fn take_proof(&mut self, acc: &mut Handshake) {
        let hello = self.recv().expect("Hello");
        assert!(matches!(
            acc.handle_frame(hello),
            Ok(Some(HandshakeEvent::HelloReceived(_)))
        ));
        assert!(acc.try_accept_peer());
        self.send_all(acc);
        let auth = self.recv().expect("Auth");
        assert!(matches!(
            acc.handle_frame(auth),
            Ok(Some(HandshakeEvent::Authenticated(_)))
        ));
    }

    /// Acceptor side of the whole handshake: takes the proof and admits the connection.
    pub fn accept_dial(&mut self, acc: &mut Handshake) {
        self.take_proof(acc);
        assert!(acc.admit());
        self.send_all(acc);
    }

    /// Starts this end's link session (`tbon::oob::session`) as a daemon's end of a new
    /// connection does: a `Start` (it holds nothing of the daemon's session, so the daemon
    /// begins a session from 0 and writes its frames once it reads this), then a `Resume` of
    /// a new session of its own (each connection a new one: a scripted end keeps nothing to
    /// write again), before any other frame.
    pub fn start_session(&mut self, me: u32, peer: u32) {
        static SESSIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let start = Control::Start {
            session: 0,
            count: 0,
        };
        self.send(&start.header(me, peer), &Bytes::new());
        let resume = Control::Resume {
            session: SESSIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            first: 0,
        };
        self.send(&resume.header(me, peer), &Bytes::new());
    }

    /// The next frame, or `None` once the peer closed the connection. The daemon's link
    /// session controls (its `Start`, its acknowledgements) are read and skipped.
    pub fn recv(&mut self) -> Option<Frame> {
        loop {
            if let Some(f) = self.decoder.next_frame().unwrap() {
                if f.header.kind == Kind::Link {
                    continue;
                }
                return Some(f);
            }
            let space = self.decoder.read_space();
            let n = self.stream.read(space).expect("read (hang guard hit?)");
            if n == 0 {
                return None;
            }
            self.decoder.commit(n);
        }
    }
}
