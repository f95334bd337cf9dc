//! One TCP connection as the loop sees it: the socket, its incremental frame decoder, its
//! bounded send queue (with the completions of the frames in it), and its handshake state.

use super::caddy::Completion;
use crate::Rank;
use crate::limits;
use crate::oob::frame::FrameDecoder;
use crate::oob::handshake::Handshake;
use crate::oob::header::{Header, Kind};
use crate::oob::send_queue::{Payload, QueueFull, SendQueue, Written};
use crate::oob::session::{Control, Inbound, Outbound, Runs, SessionError, is_session_kind};
use crate::oob::stall::StallWatch;
use mio::net::TcpStream;
use std::collections::VecDeque;
use std::io::{self, IoSlice, Write};
use std::net::SocketAddr;

pub(crate) enum ConnState {
    /// Our non-blocking connect is in progress.
    Connecting,
    /// Exchanging Hello / HelloAck; no data frames yet.
    Handshaking(Box<Handshake>),
    /// Data frames flow.
    Established,
    /// An operator's tool (`event_loop/tools.rs`): never a link. `since` is when it last
    /// connected or was answered; `asking` while a query of it is in progress.
    Tool {
        since: std::time::Instant,
        asking: bool,
    },
}

/// One neighbour's link session as the driver keeps it (`oob::session`): in the established
/// connection while there is one, in the neighbour's `Link` between connections.
pub(crate) struct LinkSession {
    /// The neighbour's incarnation it is for: another means another life, and a new session.
    pub incarnation: u64,
    pub out: Outbound<Runs>,
    pub inb: Inbound,
}

impl LinkSession {
    /// A new link's session; `first_session` unique among this daemon's links (see
    /// `Outbound::new`).
    pub(crate) fn new(
        incarnation: u64,
        resend_max_bytes: usize,
        first_session: u64,
        keep: bool,
    ) -> Self {
        LinkSession {
            incarnation,
            out: Outbound::new(resend_max_bytes, first_session, keep),
            inb: Inbound::default(),
        }
    }
}

pub(crate) struct Conn {
    pub stream: TcpStream,
    pub addr: SocketAddr,
    pub state: ConnState,
    /// The rank we dialled, for an outgoing connection.
    pub dialled: Option<Rank>,
    /// The peer's rank, once the handshake named it.
    pub peer: Option<Rank>,
    /// An incoming connection accepted for this rank (Hello checked, proof pending).
    pub claimed: Option<Rank>,
    /// Distinguishes this connection from a later one in the same slab slot (stale timers).
    pub generation: u64,
    pub decoder: FrameDecoder,
    pub queue: SendQueue,
    /// One entry per frame in `queue`, in the same order.
    pub completions: VecDeque<Option<Completion>>,
    /// When the socket last accepted bytes, or when the queue last went from empty to
    /// non-empty: a queue that is not empty and has not moved for long means a peer that does
    /// not read.
    pub last_progress: std::time::Instant,
    /// Its refusal was already logged and counted (a handshake refused, timed out or
    /// evicted): closing it must not count it again.
    pub refused: bool,
    /// The link session, while this is the established connection to a daemon.
    pub session: Option<Box<LinkSession>>,
    /// When the peer was last heard on it, and whether its frames wait in silence
    /// (`oob::stall`).
    pub watch: StallWatch,
    /// Bytes read since the last acknowledgement of the peer's session, and whether one is
    /// due (waiting for a frame to ride on, or `LINK_ACK_DELAY_MS`).
    pub read_since_ack: usize,
    pub ack_due: bool,
    /// The peer's `Start` arrived and the session resumed: session frames may be queued.
    session_ready: bool,
    next_seq: u64,
}

impl Conn {
    pub(crate) fn new(
        stream: TcpStream,
        addr: SocketAddr,
        state: ConnState,
        dialled: Option<Rank>,
        generation: u64,
        send_queue_max_bytes: usize,
    ) -> Self {
        Conn {
            stream,
            addr,
            state,
            dialled,
            peer: None,
            claimed: None,
            generation,
            decoder: FrameDecoder::with_read_chunk(
                limits::HANDSHAKE_MAX_PAYLOAD,
                limits::HANDSHAKE_READ_CHUNK_BYTES,
            ),
            queue: SendQueue::new(send_queue_max_bytes),
            completions: VecDeque::new(),
            last_progress: std::time::Instant::now(),
            refused: false,
            session: None,
            watch: StallWatch::new(std::time::Instant::now()),
            read_since_ack: 0,
            ack_due: false,
            session_ready: false,
            next_seq: 0,
        }
    }

    pub(crate) fn is_established(&self) -> bool {
        matches!(self.state, ConnState::Established)
    }

    /// Whether the connection is still connecting or in its handshake (a tool's connection,
    /// admitted, is neither: the handshake timeout no longer applies to it).
    pub(crate) fn in_handshake(&self) -> bool {
        matches!(
            self.state,
            ConnState::Connecting | ConnState::Handshaking(_)
        )
    }

    /// Queues one frame, stamping the link's next sequence number (except on a `RelmData`
    /// frame, whose `seq` carries the message's uids). On `QueueFull` the completion is handed
    /// back so the caller can fail it.
    pub(crate) fn push(
        &mut self,
        mut header: Header,
        payload: impl Into<Payload>,
        done: Option<Completion>,
    ) -> Result<(), (QueueFull, Option<Completion>)> {
        // RELM's frames carry their uids in `seq`, link controls their count; handshake frames
        // carry zero (`docs/wire.md`, and the handshake refuses anything else).
        if !matches!(
            header.kind,
            Kind::RelmData | Kind::Hello | Kind::HelloAck | Kind::Auth | Kind::Ready | Kind::Link
        ) {
            header.seq = self.next_seq;
        }
        if self.queue.is_empty() {
            self.last_progress = std::time::Instant::now();
        }
        match self.queue.push(&header, payload) {
            Ok(()) => {
                self.next_seq += 1;
                self.completions.push_back(done);
                Ok(())
            }
            Err(e) => Err((e, done)),
        }
    }

    /// Opens the link session on this newly established connection: writes its `Start` (what
    /// this side holds of the peer's session). Session frames wait in the link until the
    /// peer's `Start` arrives ([`resume_session`](Self::resume_session)).
    pub(crate) fn open_session(&mut self, mut session: Box<LinkSession>, me: Rank, peer: Rank) {
        let start = session.inb.connection_up();
        self.queue
            .push_unbounded(&start.header(me, peer), bytes::Bytes::new());
        self.completions.push_back(None);
        self.session = Some(session);
        self.session_ready = false;
    }

    /// The peer's `Start`: writes the `Resume`, then the frames written before and not held by
    /// the peer, again (whatever the queue's bound: they were accepted once). Returns how many
    /// were written again and how many unconfirmed frames were given up (the peer holds
    /// another session). Session frames may be queued from now on.
    pub(crate) fn resume_session(
        &mut self,
        peer_session: u64,
        count: u64,
        me: Rank,
        peer: Rank,
    ) -> Result<(usize, usize), SessionError> {
        if self.session_ready {
            return Err(SessionError::OutOfOrder("a second Start on one connection"));
        }
        let Some(session) = self.session.as_mut() else {
            return Err(SessionError::OutOfOrder(
                "a link Start on a connection without a session",
            ));
        };
        let (resume, again, dropped) = session.out.handle_peer_start(peer_session, count)?;
        self.queue
            .push_unbounded(&resume.header(me, peer), bytes::Bytes::new());
        self.completions.push_back(None);
        let mut resent = 0;
        for (header, payload) in again.flat_map(|w| w.into_frames(0)) {
            self.queue.push_unbounded(&header, payload);
            self.completions.push_back(None);
            resent += 1;
        }
        self.session_ready = true;
        Ok((resent, dropped))
    }

    /// Whether the link session holds writes back until the peer's acknowledgements come: the
    /// connection must then be read whatever flow control says, or its queue and the peer's
    /// acknowledgements would wait for each other for ever.
    pub(crate) fn awaits_acks(&self) -> bool {
        self.session.as_ref().is_some_and(|s| s.out.at_bound())
    }

    /// Whether frames may be queued here: not on a daemon's connection whose session waits for
    /// the peer's `Start` (they wait in the link meanwhile).
    pub(crate) fn takes_frames(&self) -> bool {
        self.session.is_none() || self.session_ready
    }

    /// Queues the acknowledgement of what was read of the peer's session, if any, to write at
    /// the next frame boundary. Returns whether there was one.
    pub(crate) fn ack_now(&mut self, me: Rank, peer: Rank) -> bool {
        self.ack_due = false;
        self.read_since_ack = 0;
        match self.session.as_mut().and_then(|s| s.inb.poll_ack()) {
            Some(ack) => {
                self.set_control(ack, me, peer);
                true
            }
            None => false,
        }
    }

    /// Queues `control` to write at the next frame boundary, ahead of unwritten frames.
    pub(crate) fn set_control(&mut self, control: Control, me: Rank, peer: Rank) {
        self.queue.set_control(control.header(me, peer).encode());
    }

    /// Writes as much of the queue as the socket takes, many frames per `writev`, and collects
    /// the completions of the frames fully written. Returns `true` when it stopped at its bound
    /// of writes with the socket still writable: the caller must flush again next turn, as no
    /// writable event will come. `WouldBlock` is not an error (the writable event resumes it).
    pub(crate) fn flush(&mut self, completed: &mut Vec<Option<Completion>>) -> io::Result<bool> {
        for _ in 0..limits::WRITES_PER_FLUSH_MAX {
            if self.queue.is_empty() && !self.queue.has_control() {
                return Ok(false);
            }
            // At the session's bound only control frames go until acknowledgements come (an
            // acknowledgement flushes the connection again).
            let data = !self.session.as_ref().is_some_and(|s| s.out.at_bound());
            let mut iov = [IoSlice::new(&[]); limits::IOV_MAX_SLICES];
            let n = self.queue.io_slices(&mut iov, data);
            if n == 0 {
                return Ok(false);
            }
            let slices = iov.get(..n).unwrap_or(&iov);
            let written = match self.stream.write_vectored(slices) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "wrote 0 bytes")),
                Ok(w) => {
                    self.last_progress = std::time::Instant::now();
                    w
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            let frames = match self.session.as_mut() {
                Some(session) => {
                    let frames = self.queue.advance_with(written, |w| {
                        let len = w.wire_len();
                        session.out.written(w, len);
                    });
                    // A packing buffer the session let go is packed into again.
                    if self.queue.wants_spare()
                        && let Some(buf) = session.out.store_mut().take_spare()
                    {
                        self.queue.offer_spare(buf);
                    }
                    frames
                }
                None => self.queue.advance(written),
            };
            for _ in 0..frames {
                completed.push(self.completions.pop_front().flatten());
            }
        }
        let held = self.session.as_ref().is_some_and(|s| s.out.at_bound());
        Ok((!self.queue.is_empty() && !held) || self.queue.has_control())
    }

    /// Takes back the frames not yet started, with their completions, so they can be sent on
    /// another connection. The completion of a frame cut off mid-write is returned separately:
    /// that frame is lost with the connection, unless the link session keeps it (then it goes
    /// again, whole, on the next connection, and the third value is true: its completion is
    /// the caller's to give `Ok`).
    #[allow(clippy::type_complexity)]
    pub(crate) fn take_unsent(
        &mut self,
    ) -> (
        Vec<(Header, Payload, Option<Completion>)>,
        Vec<Option<Completion>>,
        bool,
    ) {
        let mut kept = false;
        if let Some(session) = self.session.as_mut() {
            // What of the front packing buffer was written, then the frame cut off.
            if let Some(w) = self.queue.written_in_front() {
                let len = w.wire_len();
                session.out.written(w, len);
            }
            if let Some((header, payload, len)) = self.queue.started()
                && is_session_kind(header.kind)
            {
                session.out.written(Written::Frame(header, payload), len);
                kept = true;
            }
        }
        let frames = self.queue.drain_unsent();
        let keep = self.completions.len().saturating_sub(frames.len());
        let tail = self.completions.split_off(keep);
        let lost: Vec<_> = self.completions.drain(..).collect();
        let unsent = frames
            .into_iter()
            .zip(tail)
            .map(|((h, p), d)| (h, p, d))
            .collect();
        (unsent, lost, kept)
    }
}
