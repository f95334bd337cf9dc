//! One TCP connection as the loop sees it: the socket, its incremental frame decoder, its
//! bounded send queue (with the completions of the frames in it), and its handshake state.

use super::caddy::Completion;
use crate::Rank;
use crate::limits;
use crate::oob::frame::FrameDecoder;
use crate::oob::handshake::Handshake;
use crate::oob::header::{Header, Kind};
use crate::oob::send_queue::{Payload, QueueFull, SendQueue};
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
        // RELM's frames carry their uids in `seq`; handshake frames carry zero (`docs/wire.md`,
        // and the handshake refuses anything else).
        if !matches!(
            header.kind,
            Kind::RelmData | Kind::Hello | Kind::HelloAck | Kind::Auth | Kind::Ready
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

    /// Writes as much of the queue as the socket takes, many frames per `writev`, and collects
    /// the completions of the frames fully written. Returns `true` when it stopped at its bound
    /// of writes with the socket still writable: the caller must flush again next turn, as no
    /// writable event will come. `WouldBlock` is not an error (the writable event resumes it).
    pub(crate) fn flush(&mut self, completed: &mut Vec<Option<Completion>>) -> io::Result<bool> {
        for _ in 0..limits::WRITES_PER_FLUSH_MAX {
            if self.queue.is_empty() {
                return Ok(false);
            }
            let mut iov = [IoSlice::new(&[]); limits::IOV_MAX_SLICES];
            let n = self.queue.io_slices(&mut iov);
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
            let frames = self.queue.advance(written);
            for _ in 0..frames {
                completed.push(self.completions.pop_front().flatten());
            }
        }
        Ok(!self.queue.is_empty())
    }

    /// Takes back the frames not yet started, with their completions, so they can be sent on
    /// another connection. The completion of a frame cut off mid-write is returned separately:
    /// that frame is lost with the connection.
    #[allow(clippy::type_complexity)]
    pub(crate) fn take_unsent(
        &mut self,
    ) -> (
        Vec<(Header, Payload, Option<Completion>)>,
        Vec<Option<Completion>>,
    ) {
        let frames = self.queue.drain_unsent();
        let keep = self.completions.len().saturating_sub(frames.len());
        let tail = self.completions.split_off(keep);
        let lost: Vec<_> = self.completions.drain(..).collect();
        let unsent = frames
            .into_iter()
            .zip(tail)
            .map(|((h, p), d)| (h, p, d))
            .collect();
        (unsent, lost)
    }
}
