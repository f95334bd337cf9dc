//! One TCP connection as the loop sees it: the socket, its incremental frame decoder, its
//! bounded send queue (with the completions of the frames in it) and the bulk line behind it
//! (`node::lane`), and its handshake state.

use super::caddy::Completion;
use crate::Rank;
use crate::limits;
use crate::node::lane::{Lane, lane};
use crate::oob::frame::FrameDecoder;
use crate::oob::handshake::Handshake;
use crate::oob::header::{Header, Kind};
use crate::oob::send_queue::{Payload, QueueFull, SendQueue, Written};
use crate::oob::session::{Control, Inbound, Outbound, Runs, SessionError, is_session_kind};
use crate::oob::stall::StallWatch;
use mio::net::TcpStream;
use std::collections::VecDeque;
use std::io::{self, IoSlice};
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

/// Which end of a bulk connection (`oob::bulk_route`) a connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BulkEnd {
    /// We dialled it and write our bulk frames on it; we read only the peer's sync answers.
    Out,
    /// The peer dialled it and writes its bulk frames on it; we write only sync answers.
    In,
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
    /// The bulk line (`node::lane`): frames handed to `queue` while it holds less than
    /// `limits::BULK_FEED_BYTES`, their link sequence numbers stamped then.
    bulk: VecDeque<(Header, Payload, Option<Completion>)>,
    /// Wire bytes in `bulk`.
    bulk_bytes: usize,
    /// Bulk frames handed to `queue` and not yet written: (their number among the frames
    /// queued on this connection, wire bytes), and those bytes in all. Flow control counts them
    /// as bulk (`Flow::handle_levels`).
    fed: VecDeque<(u64, usize)>,
    fed_bytes: usize,
    /// Bulk frames written and not yet confirmed read by the peer: (the link session's count
    /// of frames written once it was, wire bytes), and those bytes in all. At
    /// `limits::BULK_PIPE_BYTES` no more bulk is handed to `queue` until acknowledgements come
    /// ([`on_acked`](Self::on_acked)). Only on a connection with a link session (a daemon's).
    pipe: VecDeque<(u64, usize)>,
    pipe_bytes: usize,
    /// Frames of `queue` written (or taken back) since the connection began.
    frames_done: u64,
    /// Bytes written since a bulk frame was last handed to `queue`: past
    /// `limits::BULK_SHARE_BYTES` one goes whatever `queue` holds, so a steady flow of
    /// control frames cannot starve a stream.
    written_since_feed: usize,
    /// When the socket last accepted bytes, or when the queue last went from empty to
    /// non-empty: a queue that is not empty and has not moved for long means a peer that does
    /// not read.
    pub last_progress: std::time::Instant,
    /// Its refusal was already logged and counted (a handshake refused, timed out or
    /// evicted): closing it must not count it again.
    pub refused: bool,
    /// Its handshake timed out: the peer's host took the connection but no daemon answered on
    /// it (a hung or stopped daemon), which the heartbeats judge (`DialFailure::NoAnswer`).
    pub unanswered: bool,
    /// The link session, while this is the established connection to a daemon.
    pub session: Option<Box<LinkSession>>,
    /// When the peer was last heard on it, and whether its frames wait in silence
    /// (`oob::stall`).
    pub watch: StallWatch,
    /// Bytes read since the last acknowledgement of the peer's session, and whether one is
    /// due (waiting for a frame to ride on, or `LINK_ACK_DELAY_MS`).
    pub read_since_ack: usize,
    pub ack_due: bool,
    /// The daemon stops and wrote all it had here: our side is shut down for writing (the
    /// peer reads our frames, then the end), and what the peer still sends is read and
    /// dropped until it closes too. Closing with its bytes unread would reset the connection,
    /// and a reset throws away what the peer had not read yet: the stop's own last frames.
    pub half_closed: bool,
    /// The peer's `Start` arrived and the session resumed: session frames may be queued.
    session_ready: bool,
    next_seq: u64,
    /// A bulk connection's end, or `None` (a link, a tool, a handshake not yet decided).
    pub bulk_end: Option<BulkEnd>,
    /// The bulk line feeds nothing to the send queue (`BulkRoute::holds_link`).
    bulk_held: bool,
    /// Markers waiting in the bulk line.
    markers_in_line: usize,
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
            bulk: VecDeque::new(),
            bulk_bytes: 0,
            fed: VecDeque::new(),
            fed_bytes: 0,
            pipe: VecDeque::new(),
            pipe_bytes: 0,
            frames_done: 0,
            written_since_feed: 0,
            last_progress: std::time::Instant::now(),
            refused: false,
            unanswered: false,
            session: None,
            watch: StallWatch::new(std::time::Instant::now()),
            read_since_ack: 0,
            ack_due: false,
            half_closed: false,
            session_ready: false,
            next_seq: 0,
            bulk_end: None,
            bulk_held: false,
            markers_in_line: 0,
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

    /// Queues one frame in its lane (`node::lane`): a control frame in the send queue, ahead
    /// of the bulk line; a bulk frame (or a marker that finds bulk frames waiting, or the line
    /// held for a bulk connection) at the end of the bulk line. A marker queued straight in the
    /// send queue counts with the fed bulk frames (`bulk_settled`). Each line is bounded by the
    /// send queue's bound. On `QueueFull` the completion is handed back so the caller can fail
    /// it.
    pub(crate) fn push(
        &mut self,
        header: Header,
        payload: impl Into<Payload>,
        done: Option<Completion>,
    ) -> Result<(), (QueueFull, Option<Completion>)> {
        let payload = payload.into();
        let line = lane(&header, payload.head());
        let bulk = match line {
            Lane::Control => false,
            Lane::Bulk => true,
            Lane::Marker => !self.bulk.is_empty() || self.bulk_held,
        };
        if !bulk {
            let len = crate::oob::HEADER_LEN + payload.len();
            let at = self.frames_done + self.completions.len() as u64;
            self.push_now(header, payload, done)?;
            if line == Lane::Marker {
                // Counted with the fed bulk frames: a handover to the bulk connection
                // (`bulk_settled`) waits until the peer has read it too, or the bulk frames
                // after it could overtake it there (simulator seed 284).
                self.fed.push_back((at, len));
                self.fed_bytes += len;
            }
            return Ok(());
        }
        let len = crate::oob::HEADER_LEN + payload.len();
        let max = self.queue.max_bytes();
        if !self.bulk.is_empty() && self.bulk_bytes + len > max {
            let full = QueueFull {
                queued: self.bulk_bytes,
                frame: len,
                max,
            };
            return Err((full, done));
        }
        if self.is_drained() {
            self.last_progress = std::time::Instant::now();
        }
        self.bulk_bytes += len;
        if line == Lane::Marker {
            self.markers_in_line += 1;
        }
        self.bulk.push_back((header, payload, done));
        self.feed_bulk();
        Ok(())
    }

    /// Queues one frame in the send queue whatever its lane: what a bulk connection carries
    /// (its frames are all bulk, in one line). On `QueueFull` the completion is handed back.
    pub(crate) fn push_plain(
        &mut self,
        header: Header,
        payload: impl Into<Payload>,
        done: Option<Completion>,
    ) -> Result<(), (QueueFull, Option<Completion>)> {
        self.push_now(header, payload.into(), done)
    }

    /// Queues frames that were accepted once elsewhere (a link's bulk line, a lost bulk
    /// connection's queue), whatever the bound, in the send queue, in order.
    pub(crate) fn push_moved(&mut self, frames: Vec<(Header, Payload, Option<Completion>)>) {
        for (mut header, payload, done) in frames {
            if self.is_drained() {
                self.last_progress = std::time::Instant::now();
            }
            // A link control (a bulk connection's sync) carries its count in `seq`.
            if header.kind != Kind::Link {
                header.seq = self.next_seq;
                self.next_seq += 1;
            }
            self.queue.push_unbounded(&header, payload);
            self.completions.push_back(done);
        }
    }

    /// Holds the bulk line (it feeds nothing to the send queue) or lets it feed again.
    pub(crate) fn set_bulk_held(&mut self, held: bool) {
        self.bulk_held = held;
        if !held {
            self.feed_bulk();
        }
    }

    /// Whether every bulk frame handed to the send queue was written and confirmed read by
    /// the peer (nothing fed, nothing in the pipe): what waits in the bulk line may then take
    /// another connection without overtaking anything.
    pub(crate) fn bulk_settled(&self) -> bool {
        self.fed.is_empty() && self.pipe.is_empty()
    }

    /// Whether a marker waits in the bulk line.
    pub(crate) fn marker_waiting(&self) -> bool {
        self.markers_in_line > 0
    }

    /// Takes the bulk line's frames before its first marker (all of them if none), in order.
    pub(crate) fn take_bulk_until_marker(&mut self) -> Vec<(Header, Payload, Option<Completion>)> {
        let mut taken = Vec::new();
        while let Some((header, payload, _)) = self.bulk.front() {
            if lane(header, payload.head()) == Lane::Marker {
                break;
            }
            let Some(frame) = self.bulk.pop_front() else {
                break;
            };
            self.bulk_bytes = self
                .bulk_bytes
                .saturating_sub(crate::oob::HEADER_LEN + frame.1.len());
            taken.push(frame);
        }
        taken
    }

    /// Puts frames back at the front of the bulk line, in order (a lost bulk connection's
    /// unsent frames: they were queued before anything waiting here).
    pub(crate) fn prepend_bulk(&mut self, frames: Vec<(Header, Payload, Option<Completion>)>) {
        for frame in frames.into_iter().rev() {
            self.bulk_bytes += crate::oob::HEADER_LEN + frame.1.len();
            if lane(&frame.0, frame.1.head()) == Lane::Marker {
                self.markers_in_line += 1;
            }
            if self.is_drained() {
                self.last_progress = std::time::Instant::now();
            }
            self.bulk.push_front(frame);
        }
        self.feed_bulk();
    }

    /// Queues one frame in the send queue, stamping the link's next sequence number (except
    /// on a `RelmData` frame, whose `seq` carries the message's uids).
    fn push_now(
        &mut self,
        mut header: Header,
        payload: Payload,
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
        if self.is_drained() {
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

    /// Whether the bulk frames written and not yet confirmed reach `BULK_PIPE_BYTES`.
    fn pipe_full(&self) -> bool {
        self.pipe_bytes >= limits::BULK_PIPE_BYTES
    }

    /// The peer confirmed frames of our link session: the bulk frames among them leave the
    /// pipe. Returns whether bulk frames waited for that room (the caller flushes again).
    pub(crate) fn on_acked(&mut self) -> bool {
        let Some((acked, sent)) = self.session.as_ref().map(|s| (s.out.acked(), s.out.sent()))
        else {
            return false;
        };
        let was_full = self.pipe_full();
        if self.pipe.back().is_some_and(|&(at, _)| at > sent) {
            // The session started again from 0 (it is reset only while no connection holds
            // it): nothing of the old count can be confirmed.
            self.pipe.clear();
            self.pipe_bytes = 0;
        }
        while let Some(&(at, len)) = self.pipe.front()
            && at <= acked
        {
            self.pipe.pop_front();
            self.pipe_bytes = self.pipe_bytes.saturating_sub(len);
        }
        was_full && !self.pipe_full() && !self.bulk.is_empty()
    }

    /// Hands bulk frames to the send queue while it holds less than `BULK_FEED_BYTES`, and
    /// one whatever it holds once `BULK_SHARE_BYTES` were written without one; none while
    /// the pipe is full.
    fn feed_bulk(&mut self) {
        while !self.bulk_held
            && !self.pipe_full()
            && (self.queue.queued_bytes() < limits::BULK_FEED_BYTES
                || self.written_since_feed >= limits::BULK_SHARE_BYTES)
        {
            let Some((header, payload, done)) = self.bulk.pop_front() else {
                return;
            };
            self.written_since_feed = 0;
            self.bulk_bytes = self
                .bulk_bytes
                .saturating_sub(crate::oob::HEADER_LEN + payload.len());
            if self.markers_in_line > 0 && lane(&header, payload.head()) == Lane::Marker {
                self.markers_in_line -= 1;
            }
            let len = crate::oob::HEADER_LEN + payload.len();
            self.fed
                .push_back((self.frames_done + self.completions.len() as u64, len));
            self.fed_bytes += len;
            // Accepted once against the bound: the queue takes it whatever its level.
            let mut header = header;
            header.seq = self.next_seq;
            self.next_seq += 1;
            self.queue.push_unbounded(&header, payload);
            self.completions.push_back(done);
        }
    }

    /// Bytes waiting to be written: the send queue's and the bulk line's (what flow control
    /// reads).
    pub(crate) fn queued_bytes(&self) -> usize {
        self.queue.queued_bytes() + self.bulk_bytes
    }

    /// Bulk bytes waiting to be written: the bulk line's and those handed to the send queue.
    pub(crate) fn bulk_bytes(&self) -> usize {
        self.bulk_bytes + self.fed_bytes
    }

    /// Gives back the send queue's idle buffers and an empty bulk line's allocation.
    pub(crate) fn release_idle(&mut self) {
        self.queue.release_idle();
        if self.bulk.is_empty() {
            self.bulk = VecDeque::new();
        }
    }

    /// Whether nothing waits to be written, in either line.
    pub(crate) fn is_drained(&self) -> bool {
        self.queue.is_empty() && self.bulk.is_empty()
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

    /// Whether this is a bulk connection a peer dialled to us (stream data in): flow control
    /// pauses it where it lets a link be read (`Node::may_read_link`).
    pub(crate) fn is_bulk_in(&self) -> bool {
        self.bulk_end == Some(BulkEnd::In)
    }

    /// Whether the link session holds writes back until the peer's acknowledgements come, or
    /// bulk frames wait for room in the pipe: the connection must then be read whatever flow
    /// control says, or its queue and the peer's acknowledgements would wait for each other.
    pub(crate) fn awaits_acks(&self) -> bool {
        // A bulk connection we dialled carries only the peer's sync answers towards us.
        self.bulk_end == Some(BulkEnd::Out)
            || self.session.as_ref().is_some_and(|s| s.out.at_bound())
            || (self.pipe_full() && !self.bulk.is_empty())
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
    /// A bulk connection writes at most `bulk_bytes` (`limits::BULK_FLUSH_BYTES` while
    /// messages flow, `limits::BULK_FLUSH_QUIET_BYTES` otherwise); others are not bounded.
    pub(crate) fn flush(
        &mut self,
        completed: &mut Vec<Option<Completion>>,
        bulk_bytes: usize,
    ) -> io::Result<bool> {
        // A bulk connection writes a bounded amount per turn: the loop turns again soon, and
        // a message waiting on another connection is read or written in between.
        let mut budget = if self.bulk_end == Some(BulkEnd::Out) {
            bulk_bytes
        } else {
            usize::MAX
        };
        for _ in 0..limits::WRITES_PER_FLUSH_MAX {
            self.feed_bulk();
            if self.queue.is_empty() && !self.queue.has_control() {
                return Ok(false);
            }
            // At the session's bound only control frames go until acknowledgements come (an
            // acknowledgement flushes the connection again).
            let data = !self.session.as_ref().is_some_and(|s| s.out.at_bound());
            let mut iov = [IoSlice::new(&[]); limits::IOV_MAX_SLICES];
            if budget == 0 {
                return Ok(true);
            }
            let n = self.queue.io_slices_within(&mut iov, data, budget);
            if n == 0 {
                return Ok(false);
            }
            let slices = iov.get(..n).unwrap_or(&iov);
            let written = match super::nosignal::send_vectored(&self.stream, slices) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "wrote 0 bytes")),
                Ok(w) => {
                    self.last_progress = std::time::Instant::now();
                    self.written_since_feed = self.written_since_feed.saturating_add(w);
                    budget = budget.saturating_sub(w);
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
            // Only real completions: a plain send's `None` would cost a push per frame.
            for _ in 0..frames {
                if let Some(done) = self.completions.pop_front().flatten() {
                    completed.push(Some(done));
                }
            }
            self.frames_done += frames as u64;
            while let Some(&(at, len)) = self.fed.front()
                && at < self.frames_done
            {
                self.fed.pop_front();
                self.fed_bytes = self.fed_bytes.saturating_sub(len);
                // Counted against the pipe until the session's acknowledgement covers every
                // frame written so far (at most the rest of this write past it: a little late).
                if let Some(session) = self.session.as_ref() {
                    self.pipe.push_back((session.out.sent(), len));
                    self.pipe_bytes += len;
                }
            }
        }
        // Bulk frames held for room in the pipe wait for an acknowledgement (which flushes the
        // connection again), not for the next turn.
        let held = self.session.as_ref().is_some_and(|s| s.out.at_bound())
            || (self.queue.is_empty() && (self.pipe_full() || self.bulk_held));
        Ok((!self.is_drained() && !held) || self.queue.has_control())
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
        let bulk = std::mem::take(&mut self.bulk);
        self.bulk_bytes = 0;
        self.markers_in_line = 0;
        self.fed.clear();
        self.fed_bytes = 0;
        self.frames_done += (lost.len() + tail.len()) as u64;
        let unsent = frames
            .into_iter()
            .zip(tail)
            .map(|((h, p), d)| (h, p, d))
            .chain(bulk)
            .collect();
        (unsent, lost, kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::wire::StreamMsg;
    use bytes::Bytes;
    use std::io::Read;

    /// A connection on a loopback socket and the peer's end (blocking, to read what it wrote).
    fn pair() -> (Conn, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let out = std::net::TcpStream::connect(addr).unwrap();
        let (peer, _) = l.accept().unwrap();
        out.set_nonblocking(true).unwrap();
        let conn = Conn::new(
            TcpStream::from_std(out),
            addr,
            ConnState::Established,
            Some(2),
            0,
            64 << 20,
        );
        (conn, peer)
    }

    fn header(tag: u32, len: usize) -> Header {
        Header {
            kind: Kind::Msg,
            origin: 1,
            dst: 2,
            tag,
            epoch: 0,
            seq: 0,
            len: len as u32,
            lives: 0,
        }
    }

    fn push(c: &mut Conn, tag: u32, payload: Bytes) {
        let h = header(tag, payload.len());
        assert!(c.push(h, payload, None).is_ok());
    }

    /// A chunk of a stream: `Data` at `offset` with `len` bytes.
    fn chunk(offset: u64, len: usize) -> Bytes {
        StreamMsg::Data {
            offset,
            digest: 0,
            bytes: Bytes::from(vec![7u8; len]),
        }
        .encode(1)
    }

    /// Flushes everything and reads it back at the peer: (tag, payload) in wire order, and
    /// the link sequence numbers.
    fn written(c: &mut Conn, peer: &mut std::net::TcpStream) -> Vec<(u32, Bytes, u64)> {
        let mut dec = FrameDecoder::new(1 << 24);
        let mut got = Vec::new();
        let mut done = Vec::new();
        peer.set_read_timeout(Some(std::time::Duration::from_millis(200)))
            .unwrap();
        loop {
            let _ = c.flush(&mut done, limits::BULK_FLUSH_BYTES).unwrap();
            let buf = dec.read_space();
            match peer.read(buf) {
                Ok(0) => break,
                Ok(n) => dec.commit(n),
                Err(_) if c.is_drained() => break,
                Err(_) => continue,
            }
            while let Some(f) = dec.next_frame().unwrap() {
                got.push((f.header.tag, f.payload, f.header.seq));
            }
        }
        got
    }

    #[test]
    fn messages_overtake_waiting_stream_chunks_and_markers_keep_their_place() {
        let (mut c, mut peer) = pair();
        let (stream, direct) = (crate::node::TAG_STREAM, crate::direct::TAG_DIRECT);
        let chunk_len = limits::STREAM_CHUNK_MAX;
        // The first chunk goes to the send queue at once; the next two wait in the bulk line.
        for i in 0..3 {
            push(&mut c, stream, chunk(i * chunk_len as u64, chunk_len));
        }
        assert!(c.bulk_bytes() > 2 * chunk_len);
        push(&mut c, 100, Bytes::from_static(b"message 1"));
        // A drain marker stays behind the chunks that wait; a credit does not.
        push(&mut c, direct, Bytes::from_static(b"\x05marker"));
        push(&mut c, stream, StreamMsg::Credit { upto: 9 }.encode(4));
        push(&mut c, 100, Bytes::from_static(b"message 2"));
        let queued = c.queued_bytes();
        let got = written(&mut c, &mut peer);
        let order: Vec<(u32, usize)> = got.iter().map(|(t, p, _)| (*t, p.len())).collect();
        let data = chunk(0, chunk_len).len();
        assert_eq!(
            order,
            vec![
                (stream, data),
                (100, 9),
                (stream, 17),
                (100, 9),
                (stream, data),
                (stream, data),
                (direct, 7)
            ]
        );
        // Link sequence numbers follow the wire's order: stamped when a frame enters the
        // send queue.
        let seqs: Vec<u64> = got.iter().map(|g| g.2).collect();
        assert_eq!(seqs, (0..7).collect::<Vec<u64>>());
        assert!(queued > 0 && c.queued_bytes() == 0 && c.bulk_bytes() == 0);
    }

    #[test]
    fn a_lost_connection_gives_back_every_waiting_frame_once_control_first() {
        let (mut c, _peer) = pair();
        let stream = crate::node::TAG_STREAM;
        for i in 0..3 {
            push(&mut c, stream, chunk(i, 1000));
        }
        push(&mut c, 100, Bytes::from_static(b"m"));
        // Nothing written: the first chunk and the message in the send queue, two chunks in
        // the bulk line (the first fed because the queue was below the feed mark, then the
        // next too: 1 KiB chunks).
        let (unsent, lost, kept) = c.take_unsent();
        assert!(lost.is_empty() && !kept);
        assert_eq!(unsent.len(), 4);
        let tags: Vec<u32> = unsent.iter().map(|u| u.0.tag).collect();
        assert_eq!(tags.iter().filter(|&&t| t == stream).count(), 3);
        assert_eq!(c.queued_bytes(), 0);
        assert_eq!(c.bulk_bytes(), 0);
        assert!(c.is_drained());
    }

    #[test]
    fn control_traffic_cannot_starve_the_bulk_line() {
        let (mut c, mut peer) = pair();
        // Small socket buffers: each flush writes little, and the send queue never drains.
        socket2::SockRef::from(&c.stream)
            .set_send_buffer_size(64 * 1024)
            .unwrap();
        socket2::SockRef::from(&peer)
            .set_recv_buffer_size(64 * 1024)
            .unwrap();
        peer.set_read_timeout(Some(std::time::Duration::from_millis(200)))
            .unwrap();
        let stream = crate::node::TAG_STREAM;
        let message = Bytes::from(vec![1u8; 16 * 1024]);
        push(&mut c, 100, message.clone());
        push(&mut c, 100, message.clone());
        push(&mut c, 100, message.clone());
        push(&mut c, 100, message.clone());
        push(&mut c, stream, chunk(0, 1000));
        assert_eq!(c.bulk.len(), 1, "the queue is above the feed mark");
        // A steady flow of messages keeps the queue above the feed mark (flow control keeps
        // it near FLOW_HIGH_BYTES under load); the chunk still goes, after about
        // BULK_SHARE_BYTES of them and the queue's backlog.
        let (mut dec, mut done, mut buf) = (FrameDecoder::new(1 << 24), Vec::new(), [0u8; 65536]);
        let mut messages_before = 0usize;
        let mut seen = false;
        for _ in 0..400 {
            while c.queue.queued_bytes() < 512 * 1024 {
                push(&mut c, 100, message.clone());
            }
            let _ = c.flush(&mut done, limits::BULK_FLUSH_BYTES).unwrap();
            if let Ok(n) = peer.read(&mut buf) {
                dec.feed(&buf[..n]);
            }
            while let Some(f) = dec.next_frame().unwrap() {
                seen |= f.header.tag == stream;
                messages_before += usize::from(!seen);
            }
            if seen {
                break;
            }
        }
        let bound = (limits::BULK_SHARE_BYTES + 1024 * 1024) / message.len();
        assert!(seen, "the chunk waited behind {messages_before} messages");
        assert!(messages_before <= bound, "{messages_before} > {bound}");
    }

    /// Flushes and reads until the peer has nothing more to read: the tags of the messages.
    fn drain_once(
        c: &mut Conn,
        peer: &mut std::net::TcpStream,
        dec: &mut FrameDecoder,
    ) -> Vec<u32> {
        peer.set_read_timeout(Some(std::time::Duration::from_millis(100)))
            .unwrap();
        let (mut done, mut tags) = (Vec::new(), Vec::new());
        loop {
            let _ = c.flush(&mut done, limits::BULK_FLUSH_BYTES).unwrap();
            match peer.read(dec.read_space()) {
                Ok(n) if n > 0 => dec.commit(n),
                _ => return tags,
            }
            while let Some(f) = dec.next_frame().unwrap() {
                if f.header.kind == Kind::Msg {
                    tags.push(f.header.tag);
                }
            }
        }
    }

    #[test]
    fn a_marker_queued_on_the_link_holds_a_handover_until_it_is_confirmed() {
        let (mut c, mut peer) = pair();
        c.open_session(Box::new(LinkSession::new(1, 64 << 20, 1 << 32, true)), 1, 2);
        assert!(c.resume_session(7, 0, 1, 2).is_ok());
        assert!(c.bulk_settled());
        // Nothing waits in the bulk line: the marker goes straight to the send queue, and
        // counts as fed (simulator seed 284: bulk frames moved to the bulk connection overtook
        // one).
        push(
            &mut c,
            crate::direct::TAG_DIRECT,
            Bytes::from_static(b"\x05marker"),
        );
        assert!(!c.bulk_settled(), "a queued marker was not counted");
        let mut dec = FrameDecoder::new(1 << 24);
        assert_eq!(
            drain_once(&mut c, &mut peer, &mut dec),
            vec![crate::direct::TAG_DIRECT]
        );
        assert!(!c.bulk_settled(), "written is not confirmed");
        let session = c.session.as_mut().unwrap();
        let (id, sent) = (session.out.session(), session.out.sent());
        assert!(session.out.handle_ack(id, sent).unwrap() > 0);
        c.on_acked();
        assert!(c.bulk_settled());
    }

    #[test]
    fn bulk_frames_wait_for_room_in_the_pipe_and_control_frames_do_not() {
        let (mut c, mut peer) = pair();
        c.open_session(Box::new(LinkSession::new(1, 64 << 20, 1 << 32, true)), 1, 2);
        assert!(c.resume_session(7, 0, 1, 2).is_ok());
        let stream = crate::node::TAG_STREAM;
        let chunk_len = limits::STREAM_CHUNK_MAX;
        let wire = crate::oob::HEADER_LEN + chunk(0, chunk_len).len();
        let chunks = 4 * limits::BULK_PIPE_BYTES / chunk_len;
        for i in 0..chunks {
            push(&mut c, stream, chunk((i * chunk_len) as u64, chunk_len));
        }
        let mut dec = FrameDecoder::new(1 << 24);
        // Without acknowledgements: about the pipe's worth, and the line holds the rest.
        let first = drain_once(&mut c, &mut peer, &mut dec);
        let most = (limits::BULK_PIPE_BYTES + limits::BULK_FEED_BYTES) / wire + 1;
        assert!(first.len() >= limits::BULK_PIPE_BYTES / wire, "{first:?}");
        assert!(first.len() <= most, "{} chunks > {most}", first.len());
        assert!(c.pipe_full() && !c.bulk.is_empty());
        // A message does not wait for room in the pipe.
        push(&mut c, 100, Bytes::from_static(b"message"));
        assert_eq!(drain_once(&mut c, &mut peer, &mut dec), vec![100]);
        // Acknowledgements make room; every chunk arrives.
        let mut got = first.len();
        for _ in 0..chunks {
            let session = c.session.as_mut().unwrap();
            let (id, sent) = (session.out.session(), session.out.sent());
            assert!(session.out.handle_ack(id, sent).unwrap() > 0);
            assert!(c.on_acked() || c.bulk.is_empty());
            let more = drain_once(&mut c, &mut peer, &mut dec);
            assert!(more.iter().all(|&t| t == stream));
            got += more.len();
            if got == chunks {
                break;
            }
        }
        assert_eq!(got, chunks);
        assert!(c.is_drained());
    }

    #[test]
    fn a_bulk_connection_keeps_to_the_bytes_it_is_given_a_turn() {
        let (mut c, _peer) = pair();
        c.bulk_end = Some(BulkEnd::Out);
        let chunk_len = limits::STREAM_CHUNK_MAX;
        for i in 0..4 {
            push(
                &mut c,
                crate::node::TAG_STREAM,
                chunk((i * chunk_len) as u64, chunk_len),
            );
        }
        let mut done = Vec::new();
        let before = c.queued_bytes();
        assert!(c.flush(&mut done, limits::BULK_FLUSH_BYTES).unwrap());
        let short = before - c.queued_bytes();
        assert!(short > 0 && short <= limits::BULK_FLUSH_BYTES, "{short}");
        let before = c.queued_bytes();
        let _ = c.flush(&mut done, limits::BULK_FLUSH_QUIET_BYTES).unwrap();
        let long = before - c.queued_bytes();
        assert!(long > limits::BULK_FLUSH_BYTES, "{long}");
        assert!(long <= limits::BULK_FLUSH_QUIET_BYTES, "{long}");
    }
}
