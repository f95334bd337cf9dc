//! [`StreamWriter`]: the producer's end of one stream, on the service handler's thread. It
//! writes under the consumer's credit: a write waits for room (back-pressure) instead of
//! buffering, so a slow consumer holds a fast producer back.

use super::caddy::Caddy;
use super::handle::{Shared, lock};
use crate::Rank;
use crate::stream::StreamError;
use bytes::{Buf, Bytes};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The `Fail` code a consumer sees when the producer's handler dropped its writer without
/// finishing or failing the stream (a bug or a panic in the handler).
pub const FAIL_ABANDONED: u32 = u32::MAX - 2;
/// Codes at or above this are the runtime's own (no service, no room, abandoned):
/// [`StreamWriter::fail`] refuses them.
pub const FAIL_RESERVED_MIN: u32 = u32::MAX - 15;

/// What the loop thread tells a writer: how far the consumer's credit reaches, and whether
/// the stream is over.
#[derive(Debug, Default)]
pub(crate) struct CreditState {
    pub upto: u64,
    pub over: Option<StreamError>,
}

/// Shared by a [`StreamWriter`] and the loop thread (which updates it on the node's `Room`
/// and `Stopped` events).
#[derive(Debug, Default)]
pub(crate) struct Credit {
    pub state: Mutex<CreditState>,
    pub changed: Condvar,
}

impl Credit {
    /// The consumer granted credit up to `upto` (it only grows).
    pub(crate) fn grant(&self, upto: u64) {
        let mut s = lock(&self.state);
        s.upto = s.upto.max(upto);
        drop(s);
        self.changed.notify_all();
    }

    /// The stream is over for the producer: every write fails `why` from now on.
    pub(crate) fn stop(&self, why: StreamError) {
        let mut s = lock(&self.state);
        if s.over.is_none() {
            s.over = Some(why);
        }
        drop(s);
        self.changed.notify_all();
    }
}

/// The producer's end of one stream, handed to the service's handler (see
/// [`super::Handle::serve`]). Write the bytes the request asks for, from the request's
/// offset on, then [`finish`](StreamWriter::finish) or [`fail`](StreamWriter::fail).
///
/// Errors of every call: [`StreamError::Cancelled`] (the consumer gave the stream up, or
/// moved it to a new stream after its path broke: the handler is then called again for the
/// rest), [`StreamError::ConsumerDied`], [`StreamError::Protocol`] (the consumer broke the
/// protocol), [`StreamError::ShutDown`] (this daemon stopped). Stop producing on any of them.
///
/// Dropping a writer that was neither finished nor failed fails the stream with
/// [`FAIL_ABANDONED`], so a handler that returns early or panics never leaves its consumer
/// waiting.
#[derive(Debug)]
pub struct StreamWriter {
    daemon: Arc<Shared>,
    consumer: Rank,
    id: u64,
    credit: Arc<Credit>,
    /// The offset of the next byte this writer hands over.
    written: u64,
    ended: bool,
    /// Why the stream fails `FAIL_ABANDONED` if this writer is dropped unended.
    abandoned: Option<String>,
}

impl StreamWriter {
    pub(crate) fn new(
        daemon: Arc<Shared>,
        consumer: Rank,
        id: u64,
        offset: u64,
        credit: Arc<Credit>,
    ) -> Self {
        StreamWriter {
            daemon,
            consumer,
            id,
            credit,
            written: offset,
            ended: false,
            abandoned: None,
        }
    }

    /// The consumer's rank.
    pub fn consumer(&self) -> Rank {
        self.consumer
    }

    /// The offset of the next byte to write (the request's offset plus what was written).
    pub fn offset(&self) -> u64 {
        self.written
    }

    /// Bytes that may be written now without waiting (0: the consumer has not granted more
    /// yet), or the error that ended the stream.
    pub fn room(&self) -> Result<u64, StreamError> {
        let s = lock(&self.credit.state);
        if let Some(e) = &s.over {
            return Err(e.clone());
        }
        Ok(s.upto.saturating_sub(self.written))
    }

    /// Waits up to `timeout` (for ever with `None`) until some room is granted; returns it
    /// (0 when the time ran out), or the error that ended the stream. Must not be called on
    /// the daemon's loop thread (from a callback): it returns `Refused` there at once.
    pub fn wait_room(&self, timeout: Option<Duration>) -> Result<u64, StreamError> {
        if self.daemon.on_loop_thread() {
            return Err(refused_on_loop_thread());
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut s = lock(&self.credit.state);
        loop {
            if let Some(e) = &s.over {
                return Err(e.clone());
            }
            let room = s.upto.saturating_sub(self.written);
            if room > 0 {
                return Ok(room);
            }
            s = match deadline {
                None => self
                    .credit
                    .changed
                    .wait(s)
                    .unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(0);
                    }
                    self.credit
                        .changed
                        .wait_timeout(s, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
    }

    /// Writes all of `bytes` (shared, never copied on this side), waiting for credit as
    /// often as it must. Returns once every byte was handed to the daemon, or with the error
    /// that ended the stream (some bytes may have been handed over before it). Must not be
    /// called on the daemon's loop thread: use [`try_write`](StreamWriter::try_write) there.
    pub fn write(&mut self, bytes: impl Into<Bytes>) -> Result<(), StreamError> {
        let mut b = bytes.into();
        while !b.is_empty() {
            self.wait_room(None)?;
            self.try_write(&mut b)?;
        }
        Ok(())
    }

    /// Writes as much of `bytes` as the credit allows now, without waiting, and leaves the
    /// rest in it. Returns the bytes taken (0: wait, e.g. with
    /// [`wait_room`](StreamWriter::wait_room); on the loop thread, in a callback, it is also
    /// 0 or short while the daemon's command channel is full: try again later).
    pub fn try_write(&mut self, bytes: &mut Bytes) -> Result<usize, StreamError> {
        let room = self.room()?;
        let n = (bytes.len() as u64).min(room) as usize;
        if n == 0 {
            return Ok(0);
        }
        // Each chunk is hashed here, on the producer's thread, not on the daemon's loop
        // thread: the loop's turns stay short (a message waiting behind them is not kept
        // waiting by the hashing), and the hashing runs beside the loop's writes.
        let chunk_max = crate::stream::chunk_max(self.daemon.msg_max_bytes);
        let mut taken = 0;
        while taken < n {
            let len = (n - taken).min(chunk_max);
            let chunk = bytes.slice(..len);
            let digest = crate::stream::ChunkDigest::of(self.written, &chunk);
            let command = Caddy::StreamWrite {
                consumer: self.consumer,
                id: self.id,
                bytes: chunk,
                digest: Some(digest),
            };
            match self.daemon.submit(command) {
                Ok(()) => {}
                // The command channel is full (only on the loop thread, which cannot wait
                // for it): what was taken is reported, the rest stays the caller's.
                Err(crate::error::SendError::Busy(_)) => break,
                Err(_) if taken > 0 => break,
                Err(_) => return Err(StreamError::ShutDown),
            }
            bytes.advance(len);
            self.written += len as u64;
            taken += len;
        }
        Ok(taken)
    }

    /// Ends the stream: the consumer reads `Finished` once every byte written has arrived
    /// and checked. `Ok` means the end was handed to the daemon, not that it arrived.
    pub fn finish(mut self) -> Result<(), StreamError> {
        self.end(None)
    }

    /// Fails the stream with an application `code` (below [`FAIL_RESERVED_MIN`]) and a
    /// `reason` (at most `limits::STREAM_REASON_MAX` bytes are sent); the consumer reads
    /// [`StreamError::Producer`] with both. A reserved code is refused `Refused`, and the
    /// stream then fails with [`FAIL_ABANDONED`].
    pub fn fail(mut self, code: u32, reason: &str) -> Result<(), StreamError> {
        if code >= FAIL_RESERVED_MIN {
            self.abandoned = Some(format!(
                "the producer failed the stream with code {code}, reserved for the runtime \
                 ({reason})"
            ));
            return Err(StreamError::Refused(format!(
                "fail code {code} is reserved for the runtime (use one below {FAIL_RESERVED_MIN})"
            )));
        }
        self.end(Some((code, reason.to_string())))
    }

    fn end(&mut self, failure: Option<(u32, String)>) -> Result<(), StreamError> {
        self.ended = true;
        if let Some(e) = &lock(&self.credit.state).over {
            return Err(e.clone());
        }
        self.daemon
            .submit(Caddy::StreamEnd {
                consumer: self.consumer,
                id: self.id,
                failure,
            })
            .map_err(|_| StreamError::ShutDown)
    }
}

impl Drop for StreamWriter {
    fn drop(&mut self) {
        if !self.ended {
            let why = self.abandoned.take().unwrap_or_else(|| {
                "the producer dropped its writer without finishing the stream".to_string()
            });
            let _ = self.end(Some((FAIL_ABANDONED, why)));
        }
    }
}

/// The error of a blocking stream call made on the daemon's loop thread.
pub(crate) fn refused_on_loop_thread() -> StreamError {
    StreamError::Refused(
        "a blocking stream call on the daemon's loop thread (in a callback) would deadlock".into(),
    )
}
