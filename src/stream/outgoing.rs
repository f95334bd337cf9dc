//! The producer's side of one stream: what it may send under the consumer's credit, chunked,
//! each chunk with its digest, then `End` or `Fail`; the consumer's credits and cancel.

use super::StreamError;
use super::digest::{self, ChunkDigest};
use super::wire::StreamMsg;
use crate::Rank;
use crate::direct::Route;
use crate::limits::{STREAM_CHUNK_MAX, STREAM_WINDOW_MAX};
use bytes::Bytes;
use std::collections::VecDeque;

/// The most bytes one `Data` message carries in a DVM whose `msg_max_bytes` is this: a
/// writer that cuts its chunks here has each taken whole by [`Outgoing::write_chunk`].
pub fn chunk_max(msg_max_bytes: usize) -> usize {
    let fits = msg_max_bytes.saturating_sub(super::wire::DATA_HEADER_LEN);
    STREAM_CHUNK_MAX.min(fits).max(1)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Streaming,
    Ended,
    Cancelled,
}

/// One stream this daemon produces (sans-IO): feed it the consumer's messages, take its
/// messages with [`Outgoing::poll_msg`] and send them to [`Outgoing::consumer`] in order.
#[derive(Debug)]
pub struct Outgoing {
    id: u64,
    consumer: Rank,
    /// The next offset to send.
    next: u64,
    /// Bytes below this offset may be sent (the consumer's credit).
    upto: u64,
    /// The wrapping sum of the digests sent.
    digests: u64,
    state: State,
    out: VecDeque<StreamMsg>,
    /// The most bytes one `Data` message carries.
    chunk_max: usize,
    /// The route the consumer asked for (`None`: the daemon's setting).
    route: Option<Route>,
    /// The credit window the consumer opened it with.
    window: u64,
}

impl Outgoing {
    /// The stream `id` that `consumer` opened at `offset` with `window` bytes of credit.
    pub fn new(id: u64, consumer: Rank, offset: u64, window: u32) -> Outgoing {
        let window = u64::from(window).min(STREAM_WINDOW_MAX as u64);
        Outgoing {
            id,
            consumer,
            next: offset,
            upto: offset.saturating_add(window),
            digests: 0,
            state: State::Streaming,
            out: VecDeque::new(),
            chunk_max: STREAM_CHUNK_MAX,
            route: None,
            window,
        }
    }

    /// The credit window the consumer opened it with: at most this many of its bytes are in
    /// flight at a time.
    pub fn window(&self) -> u64 {
        self.window
    }

    /// The route the consumer's `Open` asked for, for this stream's messages.
    pub fn with_route(mut self, route: Option<Route>) -> Self {
        self.route = route;
        self
    }

    /// The route of its messages (`None`: the daemon's `route` setting).
    pub fn route(&self) -> Option<Route> {
        self.route
    }

    /// Cuts chunks at `msg_max_bytes` minus the `Data` header when that is below
    /// `STREAM_CHUNK_MAX` (a DVM configured for small messages: a larger frame would be
    /// refused by the next hop).
    pub fn with_msg_max(mut self, msg_max_bytes: usize) -> Self {
        self.chunk_max = chunk_max(msg_max_bytes);
        self
    }

    /// The stream's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Where its messages go.
    pub fn consumer(&self) -> Rank {
        self.consumer
    }

    /// The offset the consumer's credit reaches: bytes below it may be sent. It only grows,
    /// so a writer on another thread that counts its own bytes can compare without a race.
    pub fn upto(&self) -> u64 {
        self.upto
    }

    /// The offset its data left this daemon up to: what was written, less what still waits
    /// here to be released (a probe's answer, `Position`).
    pub fn sent(&self) -> u64 {
        self.out
            .iter()
            .find_map(|m| match m {
                StreamMsg::Data { offset, .. } => Some(*offset),
                _ => None,
            })
            .unwrap_or(self.next)
    }

    /// Bytes it may send now; 0 means: wait for credit (back-pressure, never a buffer).
    pub fn room(&self) -> u64 {
        match self.state {
            State::Streaming => self.upto.saturating_sub(self.next),
            _ => 0,
        }
    }

    /// Takes as much of `chunk` as the credit allows (in messages of at most
    /// `STREAM_CHUNK_MAX` bytes, see [`Outgoing::with_msg_max`], without copying) and leaves the rest in it. Returns the bytes
    /// taken: 0 means wait for credit. Fails once the stream ended or was cancelled.
    pub fn write(&mut self, chunk: &mut Bytes) -> Result<usize, StreamError> {
        self.check_open()?;
        let take = (chunk.len() as u64).min(self.room()) as usize;
        let mut part = chunk.split_to(take);
        while !part.is_empty() {
            let bytes = part.split_to(part.len().min(self.chunk_max));
            let d = digest::chunk(self.next, &bytes);
            self.digests = self.digests.wrapping_add(d);
            self.out.push_back(StreamMsg::Data {
                offset: self.next,
                digest: d,
                bytes: bytes.clone(),
            });
            self.next += bytes.len() as u64;
        }
        Ok(take)
    }

    /// [`write`](Outgoing::write) for one chunk whose digest the caller made already (see
    /// [`ChunkDigest`]): taken whole with that digest when it fits one `Data` message, starts
    /// at the stream's next offset and is within the credit; otherwise as `write` takes it,
    /// hashed here. A digest made for other bytes than `chunk` is the caller's bug: the
    /// consumer then fails the stream `Corrupt`.
    pub fn write_chunk(
        &mut self,
        chunk: &mut Bytes,
        made: Option<ChunkDigest>,
    ) -> Result<usize, StreamError> {
        self.check_open()?;
        let len = chunk.len();
        match made {
            Some(m)
                if m.offset == self.next && len <= self.chunk_max && len as u64 <= self.room() =>
            {
                let bytes = std::mem::take(chunk);
                self.digests = self.digests.wrapping_add(m.digest);
                self.out.push_back(StreamMsg::Data {
                    offset: self.next,
                    digest: m.digest,
                    bytes,
                });
                self.next += len as u64;
                Ok(len)
            }
            _ => self.write(chunk),
        }
    }

    /// Ends the stream after what was written: the consumer reports it finished.
    pub fn finish(&mut self) -> Result<(), StreamError> {
        self.check_open()?;
        self.state = State::Ended;
        self.out.push_back(StreamMsg::End {
            total: self.next,
            digests: self.digests,
        });
        Ok(())
    }

    /// Fails the stream with an application `code` and `reason`; the consumer reports both.
    pub fn fail(&mut self, code: u32, reason: &str) -> Result<(), StreamError> {
        self.check_open()?;
        self.state = State::Ended;
        self.out.push_back(StreamMsg::Fail {
            code,
            reason: reason.to_string(),
        });
        Ok(())
    }

    fn check_open(&self) -> Result<(), StreamError> {
        match self.state {
            State::Streaming => Ok(()),
            State::Ended => Err(StreamError::Protocol("the stream already ended".into())),
            State::Cancelled => Err(StreamError::Cancelled),
        }
    }

    /// The consumer's credit. An older one is ignored (messages may cross); one beyond any
    /// window it could have granted is a protocol error (the caller closes that connection).
    pub fn handle_credit(&mut self, upto: u64) -> Result<(), StreamError> {
        if upto > self.next.saturating_add(STREAM_WINDOW_MAX as u64) {
            return Err(StreamError::Protocol(format!(
                "stream {}: credit up to {upto}, beyond any window from {}",
                self.id, self.next
            )));
        }
        self.upto = self.upto.max(upto);
        Ok(())
    }

    /// The consumer cancelled: writes fail from now on, nothing more is sent.
    pub fn handle_cancel(&mut self) {
        if self.state == State::Streaming {
            self.state = State::Cancelled;
        }
        self.out.clear();
    }

    /// The next message for the consumer.
    pub fn poll_msg(&mut self) -> Option<StreamMsg> {
        self.out.pop_front()
    }

    /// The next message unless it is data: what may go while the path is congested (data
    /// waits, in order; an end behind it waits with it).
    pub fn poll_control(&mut self) -> Option<StreamMsg> {
        match self.out.front() {
            Some(StreamMsg::Data { .. }) | None => None,
            Some(_) => self.out.pop_front(),
        }
    }

    /// Whether messages wait to be sent.
    pub fn has_pending(&self) -> bool {
        !self.out.is_empty()
    }

    /// Its invariants: nothing written beyond the consumer's credit, and what waits here to be
    /// released within the window (a stream's memory at its producer).
    pub fn check_invariants(&self) -> Result<(), String> {
        let waiting: usize = self
            .out
            .iter()
            .map(|m| match m {
                StreamMsg::Data { bytes, .. } => bytes.len(),
                _ => 0,
            })
            .sum();
        if self.next > self.upto || waiting as u64 > self.window {
            return Err(format!(
                "stream {}: {waiting} bytes waiting, window {}, next {} credit {}",
                self.id, self.window, self.next, self.upto
            ));
        }
        Ok(())
    }

    /// Ended or cancelled, with nothing left to send.
    pub fn is_done(&self) -> bool {
        self.state != State::Streaming && self.out.is_empty()
    }
}
