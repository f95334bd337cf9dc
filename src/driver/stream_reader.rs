//! [`Stream`]: the consumer's end of one stream fetched with [`super::Handle::fetch`], read
//! as a blocking iterator of chunks or through `std::io::Read`. Taking a chunk is what grants
//! the producer more credit, so a reader that stops reading stops the producer, and memory
//! stays within the stream's window.

use super::caddy::Caddy;
use super::handle::Shared;
use crate::stream::{ChunkDigest, StreamError};
use bytes::{Buf, Bytes};
use crossbeam_channel::{Receiver, RecvTimeoutError, TryRecvError};
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the loop thread hands a fetching application, in order: chunks, then one end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamItem {
    /// The next bytes of the stream, in order, checked against their digest.
    Data(Bytes),
    /// The stream ended: `Ok` is `Finished` (every byte arrived, the length and the
    /// stream's digest match), otherwise why not. Nothing follows it.
    End(Result<(), StreamError>),
}

/// The consumer's end of one stream (see [`super::Handle::fetch`]).
///
/// As an iterator it yields the chunks in order (`Ok`), then ends (`None`) once the stream
/// finished, or yields one `Err` that says why it did not and ends after it; it never hangs
/// for longer than the stream's idle time ([`FetchOptions::idle`](super::FetchOptions)).
/// [`Stream::read`] fills the caller's buffer instead and reads 0 at `Finished`;
/// [`Stream::reader`] is the same as `std::io::Read`. [`Stream::outcome`] tells the end
/// apart afterwards.
///
/// ```no_run
/// # fn f(h: &tbon::Handle) -> Result<(), Box<dyn std::error::Error>> {
/// let mut s = h.fetch(3, "ckpt", &b"/ckpt/rank7"[..])?;
/// let mut file = std::fs::File::create("/tmp/rank7.ckpt")?;
/// std::io::copy(&mut s.reader(), &mut file)?; // Ok once the stream finished
/// # Ok(()) }
/// ```
///
/// Dropping a stream that has not ended cancels it: the producer's writer fails `Cancelled`.
#[derive(Debug)]
pub struct Stream {
    daemon: Arc<Shared>,
    id: u64,
    /// Each item with the digest to check its chunk against (made by the producer).
    rx: Receiver<(StreamItem, Option<ChunkDigest>)>,
    /// What `read` has not copied out of the current chunk yet.
    rest: Bytes,
    /// Bytes taken by the application and not yet reported to the loop (reported every
    /// `report_every` bytes, and always before waiting).
    unreported: u64,
    report_every: u64,
    outcome: Option<Result<(), StreamError>>,
}

impl Stream {
    pub(crate) fn new(
        daemon: Arc<Shared>,
        id: u64,
        rx: Receiver<(StreamItem, Option<ChunkDigest>)>,
        window: u32,
    ) -> Self {
        Stream {
            daemon,
            id,
            rx,
            rest: Bytes::new(),
            unreported: 0,
            // Credit moves in half windows: a quarter keeps the producer busy without a
            // command per chunk.
            report_every: (u64::from(window) / 4).max(1),
            outcome: None,
        }
    }

    /// This stream's id at this daemon (for [`super::Handle::cancel_stream`]).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// How the stream ended, once it has: `Ok(())` finished, or the error.
    pub fn outcome(&self) -> Option<&Result<(), StreamError>> {
        self.outcome.as_ref()
    }

    /// Gives the stream up: the producer's writer fails `Cancelled`. Chunks already here are
    /// dropped.
    pub fn cancel(mut self) {
        self.cancel_now();
    }

    fn cancel_now(&mut self) {
        if self.outcome.is_none() {
            self.outcome = Some(Err(StreamError::Cancelled));
            let _ = self.daemon.submit(Caddy::StreamCancel { id: self.id });
        }
    }

    /// Tells the loop the application took `unreported` bytes: credit follows.
    fn report(&mut self) {
        if self.unreported > 0 && self.outcome.is_none() {
            let n = std::mem::take(&mut self.unreported);
            // On the loop thread a full channel refuses the command: keep the count for the
            // next report rather than lose the credit.
            if self
                .daemon
                .submit(Caddy::StreamConsumed { id: self.id, n })
                .is_err()
            {
                self.unreported = n;
            }
        }
    }

    /// The application took `n` more bytes: credit follows (reported in batches).
    fn took(&mut self, n: usize) {
        self.unreported += n as u64;
        if self.unreported >= self.report_every {
            self.report();
        }
    }

    fn next_item(&mut self) -> Option<Result<Bytes, StreamError>> {
        // Without a deadline the wait cannot time out.
        self.next_by(None).unwrap_or(None)
    }

    /// The next chunk or end, waiting until `deadline` (for ever with `None`); `Err(())`
    /// when the deadline passed first.
    #[allow(clippy::result_unit_err)]
    fn next_by(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<Option<Result<Bytes, StreamError>>, ()> {
        if !self.rest.is_empty() {
            return Ok(Some(Ok(std::mem::take(&mut self.rest))));
        }
        if self.outcome.is_some() {
            return Ok(None);
        }
        let item = match self.rx.try_recv() {
            Ok(i) => Ok(i),
            Err(TryRecvError::Empty) => {
                self.report();
                if self.daemon.on_loop_thread() {
                    let e = super::stream_writer::refused_on_loop_thread();
                    return Ok(Some(Err(e)));
                }
                match deadline {
                    None => self.rx.recv().map_err(|_| ()),
                    Some(d) => match self.rx.recv_deadline(d) {
                        Ok(i) => Ok(i),
                        Err(RecvTimeoutError::Timeout) => return Err(()),
                        Err(RecvTimeoutError::Disconnected) => Err(()),
                    },
                }
            }
            Err(TryRecvError::Disconnected) => Err(()),
        };
        Ok(match item {
            Ok((StreamItem::Data(b), check)) => match checked(&b, check) {
                Ok(()) => Some(Ok(b)),
                Err(e) => {
                    // The stream fails here and now; the daemon tells its producer to stop.
                    self.outcome = Some(Err(e.clone()));
                    if let StreamError::Corrupt { offset } = e {
                        let _ = self.daemon.submit(Caddy::StreamCorrupt {
                            id: self.id,
                            offset,
                        });
                    }
                    Some(Err(e))
                }
            },
            Ok((StreamItem::End(Ok(())), _)) => {
                self.outcome = Some(Ok(()));
                None
            }
            Ok((StreamItem::End(Err(e)), _)) => {
                self.outcome = Some(Err(e.clone()));
                Some(Err(e))
            }
            Err(()) => {
                self.outcome = Some(Err(StreamError::ShutDown));
                Some(Err(StreamError::ShutDown))
            }
        })
    }
}

/// Checks a chunk against the digest the producer made for it (`None`: checked already). The
/// reader's thread does this, not the daemon's loop: the loop then does no work per byte of a
/// stream it consumes besides reading it, and the hashing runs beside it.
fn checked(bytes: &[u8], check: Option<ChunkDigest>) -> Result<(), StreamError> {
    match check {
        Some(c) if ChunkDigest::of(c.offset, bytes) != c => {
            Err(StreamError::Corrupt { offset: c.offset })
        }
        _ => Ok(()),
    }
}

impl Iterator for Stream {
    type Item = Result<Bytes, StreamError>;

    fn next(&mut self) -> Option<Self::Item> {
        let item = self.next_item();
        if let Some(Ok(b)) = &item {
            self.took(b.len());
        }
        item
    }
}

impl Stream {
    /// Reads the next bytes into `buf` (waiting for them): the count, 0 once the stream
    /// finished (or for an empty `buf`), or the error that ended it.
    pub fn read(&mut self, buf: &mut [u8]) -> Result<usize, StreamError> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.rest.is_empty() {
            match self.next_item() {
                None => return Ok(0),
                Some(Ok(b)) => self.rest = b,
                Some(Err(e)) => return Err(e),
            }
        }
        let n = self.rest.len().min(buf.len());
        if let (Some(to), Some(from)) = (buf.get_mut(..n), self.rest.get(..n)) {
            to.copy_from_slice(from);
        }
        self.rest.advance(n);
        // Only what was copied out counts as taken: a reader with a small buffer holds the
        // producer to the window exactly.
        self.took(n);
        Ok(n)
    }

    /// Like [`Stream::read`], waiting at most `timeout` for bytes: `Ok(None)` when it
    /// passed first (the stream goes on; read again).
    pub fn read_timeout(
        &mut self,
        buf: &mut [u8],
        timeout: Duration,
    ) -> Result<Option<usize>, StreamError> {
        if buf.is_empty() {
            return Ok(Some(0));
        }
        if self.rest.is_empty() {
            match self.next_by(Some(Instant::now() + timeout)) {
                Err(()) => return Ok(None),
                Ok(None) => return Ok(Some(0)),
                Ok(Some(Ok(b))) => self.rest = b,
                Ok(Some(Err(e))) => return Err(e),
            }
        }
        self.read(buf).map(Some)
    }

    /// The stream as a `std::io::Read` (for `io::copy` into a file, `read_to_end`): an
    /// error is an `io::Error` of kind `Other` wrapping the [`StreamError`].
    pub fn reader(&mut self) -> StreamReader<'_> {
        StreamReader(self)
    }
}

/// A [`Stream`] as `std::io::Read` ([`Stream::reader`]); reads 0 once it finished.
#[derive(Debug)]
pub struct StreamReader<'a>(&'a mut Stream);

impl io::Read for StreamReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf).map_err(io::Error::other)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.cancel_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_checks_each_chunk_against_the_producers_digest() {
        let bytes = b"stream bytes at offset 40";
        let good = ChunkDigest::of(40, bytes);
        assert_eq!(checked(bytes, Some(good)), Ok(()));
        assert_eq!(
            checked(bytes, None),
            Ok(()),
            "checked by the daemon already"
        );
        let moved = ChunkDigest { offset: 41, ..good };
        assert_eq!(
            checked(bytes, Some(moved)),
            Err(StreamError::Corrupt { offset: 41 })
        );
        assert_eq!(
            checked(b"stream bytes at offset 4!", Some(good)),
            Err(StreamError::Corrupt { offset: 40 })
        );
    }
}
