//! Incremental frame decoder: socket bytes in, whole frames out.
//!
//! Payload bytes are copied at most once, by the socket read into [`FrameDecoder::read_space`];
//! a frame's payload is then split off the receive buffer as a [`Bytes`] that shares its
//! allocation. Consequence the consumer must know: a payload keeps the read chunk it was read into
//! alive (at most [`READ_CHUNK_BYTES`] for small frames; a large frame gets an allocation of its
//! own). Code that keeps many small payloads for a long time should copy them
//! (`Bytes::copy_from_slice`). An allocation that frames still share when the decoder needs
//! room is kept (a few, bounded by `limits::READ_POOL_MAX` and `READ_POOL_BYTES_MAX`) and read
//! into again once they are gone, rather than fresh memory each time.
//!
//! With a payload pool ([`FrameDecoder::set_payload_pool`]), a large payload
//! (`limits::READ_POOLED_PAYLOAD_MIN_BYTES` to `READ_POOLED_PAYLOAD_MAX_BYTES`) is read into a
//! pooled buffer of its own instead, which keeps its initialised bytes between uses: reading
//! into it needs no zero-fill. What of that payload came with its header is copied over (after
//! a pooled payload, the next read is kept short, `READ_AFTER_POOLED_BYTES`, so that this is
//! little).

use bytes::{Buf, Bytes, BytesMut};
use std::sync::Arc;

use super::header::{HEADER_LEN, Header, WireError};
use crate::buffer_pool::BufferPool;
use crate::limits::{
    READ_AFTER_POOLED_BYTES, READ_CHUNK_BYTES, READ_LARGE_STEP_BYTES, READ_POOL_BYTES_MAX,
    READ_POOL_MAX, READ_POOLED_PAYLOAD_MAX_BYTES, READ_POOLED_PAYLOAD_MIN_BYTES,
    READ_SPARE_MIN_BYTES,
};

/// One complete frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub header: Header,
    pub payload: Bytes,
}

/// Incremental decoder for one connection's byte stream.
///
/// Driver loop: `let buf = dec.read_space(); let n = sock.read(buf)?; dec.commit(n);` then call
/// [`next_frame`](Self::next_frame) until it returns `Ok(None)`. On `Err` the connection must be
/// closed (the decoder stays poisoned and returns the same error again).
#[derive(Debug)]
pub struct FrameDecoder {
    /// `buf[..filled]` is received data; `buf[filled..]` is initialised spare room for reads.
    buf: BytesMut,
    filled: usize,
    max_payload: u32,
    /// Header of the frame at the front of `buf`, once its 40 bytes have arrived.
    pending: Option<Header>,
    poisoned: Option<WireError>,
    /// The ordinary size of one read's region: [`READ_CHUNK_BYTES`], or less for a connection
    /// still in its handshake (`limits::HANDSHAKE_READ_CHUNK_BYTES`).
    chunk: usize,
    /// The size of the allocation `buf` is a view of (0: none).
    region_bytes: usize,
    /// Views of earlier allocations, with their sizes, whose frames may still be alive: once
    /// they are gone, an allocation is read into again instead of a fresh one (at most
    /// `READ_POOL_MAX`).
    pool: Vec<(BytesMut, usize)>,
    /// Where large payloads are read (none: they are read into `buf`).
    payloads: Option<Arc<BufferPool>>,
    /// The pending frame's payload, being read into a pooled buffer.
    pooled: Option<PooledRead>,
    /// The last frame's payload was pooled: the next read is offered a short region.
    after_pooled: bool,
}

/// A payload read into a buffer of the payload pool: `buf[..got]` has arrived of `len`.
#[derive(Debug)]
struct PooledRead {
    buf: Vec<u8>,
    len: usize,
    got: usize,
    pool: Arc<BufferPool>,
}

impl FrameDecoder {
    /// A decoder that refuses frames whose payload exceeds `max_payload` bytes.
    pub fn new(max_payload: u32) -> Self {
        Self::with_read_chunk(max_payload, READ_CHUNK_BYTES)
    }

    /// A decoder whose ordinary read region is `chunk` bytes (at least one header's worth)
    /// instead of [`READ_CHUNK_BYTES`]. The driver gives a connection in its handshake a small
    /// one (`limits::HANDSHAKE_READ_CHUNK_BYTES`), so that a stranger's idle connection costs
    /// little, and raises it with [`set_read_chunk`](Self::set_read_chunk) once established.
    pub fn with_read_chunk(max_payload: u32, chunk: usize) -> Self {
        FrameDecoder {
            buf: BytesMut::new(),
            filled: 0,
            max_payload,
            pending: None,
            poisoned: None,
            chunk: chunk.max(HEADER_LEN),
            region_bytes: 0,
            pool: Vec::new(),
            payloads: None,
            pooled: None,
            after_pooled: false,
        }
    }

    /// Reads large payloads into buffers of `pool` from the next frame on (see the module
    /// doc). The driver sets the daemon's pool on a connection once its handshake is done.
    pub fn set_payload_pool(&mut self, pool: Arc<BufferPool>) {
        self.payloads = Some(pool);
    }

    /// Changes the ordinary read region (at least one header's worth). Spare room already
    /// allocated is kept until the next reallocation.
    pub fn set_read_chunk(&mut self, chunk: usize) {
        self.chunk = chunk.max(HEADER_LEN);
    }

    /// The ordinary read region, in bytes.
    pub fn read_chunk(&self) -> usize {
        self.chunk
    }

    /// Gives back the buffer's memory if it holds no received byte (an idle connection need
    /// not keep a whole read region); the next [`read_space`](Self::read_space) allocates
    /// again. True if memory was released.
    pub fn release_idle(&mut self) -> bool {
        if self.filled > 0 || self.pending.is_some() || self.pooled.is_some() {
            return false;
        }
        let pooled = !self.pool.is_empty();
        self.pool = Vec::new();
        if self.buf.capacity() == 0 {
            return pooled;
        }
        self.buf = BytesMut::new();
        self.region_bytes = 0;
        true
    }

    /// Bytes this decoder holds allocated (received and spare, and the allocations it keeps
    /// for reuse), for memory accounting.
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
            + self.pool.iter().map(|(_, size)| size).sum::<usize>()
            + self.pooled.as_ref().map_or(0, |p| p.buf.capacity())
    }

    /// Moves the received bytes to another allocation of at least `need` bytes, when the
    /// current one cannot grow in place because frames read into it are still alive (a relay's
    /// link session keeps the frames it forwarded until acknowledged): an earlier allocation
    /// whose frames are all gone if there is one, else a fresh one. The current allocation is
    /// kept in the pool in turn.
    fn move_to_new_region(&mut self, need: usize) {
        let filled = self.filled.min(self.buf.len());
        let reused = self
            .pool
            .iter_mut()
            .position(|(p, size)| *size >= need && p.try_reclaim(need));
        let (mut region, size) = match reused {
            Some(i) => self.pool.swap_remove(i),
            None => (BytesMut::with_capacity(need), need),
        };
        region.clear();
        region.extend_from_slice(self.buf.get(..filled).unwrap_or(&[]));
        let old = std::mem::replace(&mut self.buf, region);
        let old_size = std::mem::replace(&mut self.region_bytes, size);
        if old_size == 0 || old_size > READ_POOL_BYTES_MAX {
            return;
        }
        let mut pooled: usize = self.pool.iter().map(|(_, size)| size).sum();
        while !self.pool.is_empty()
            && (self.pool.len() >= READ_POOL_MAX || pooled + old_size > READ_POOL_BYTES_MAX)
        {
            let (_, size) = self.pool.remove(0);
            pooled -= size;
        }
        self.pool.push((old, old_size));
    }

    /// Change the largest payload accepted. Applies to the frame in progress too: if its header
    /// announced more than the new maximum, the next [`next_frame`](Self::next_frame) fails.
    /// The driver uses `limits::HANDSHAKE_MAX_PAYLOAD` until the handshake completes.
    pub fn set_max_payload(&mut self, max: u32) {
        self.max_payload = max;
    }

    /// The largest payload currently accepted.
    pub fn max_payload(&self) -> u32 {
        self.max_payload
    }

    /// A writable, initialised region to read socket bytes into; follow with
    /// [`commit`](Self::commit)`(n)` where `n` is how many bytes were written at its start.
    ///
    /// A fresh region is the read chunk long ([`READ_CHUNK_BYTES`] unless set lower); what is
    /// left of one is offered down to [`READ_SPARE_MIN_BYTES`] (or the chunk, if smaller). When the header of a frame whose remainder is larger
    /// has been decoded, capacity for the whole rest of that frame is reserved at once, so that
    /// a large payload lands in a single allocation, and the region offered is the rest of the
    /// frame up to [`READ_LARGE_STEP_BYTES`]: the zero-fill (safe Rust cannot read into
    /// uninitialised memory) then happens just before the read, while the bytes are still in
    /// cache, instead of one cold pass over the whole payload. Zero-filling happens once per
    /// region, not once per call: unused room is kept for the next call, and while no large
    /// frame is pending a region is read into until less than [`READ_SPARE_MIN_BYTES`] of it is
    /// left (so a read may be offered less than the read chunk). While a payload is read into a
    /// pooled buffer, the region is the rest of that payload; right after one, at most
    /// [`READ_AFTER_POOLED_BYTES`].
    pub fn read_space(&mut self) -> &mut [u8] {
        if self.pooled.is_some() {
            return match &mut self.pooled {
                Some(p) => p.buf.get_mut(p.got..p.len).unwrap_or_default(),
                None => &mut [],
            };
        }
        let mut want = self.chunk;
        let mut reserve = self.chunk;
        let mut enough = self.chunk.min(READ_SPARE_MIN_BYTES);
        if let Some(len) = self.front_payload_len() {
            // Never size by more than the maximum: a hostile header must not make us allocate.
            let frame_end = HEADER_LEN + len.min(self.max_payload) as usize;
            let rest = frame_end.saturating_sub(self.filled);
            if rest > enough {
                // The rest of a frame larger than what is left goes into one allocation.
                enough = rest.min(want.max(READ_LARGE_STEP_BYTES));
            }
            reserve = reserve.max(rest);
            want = want.max(rest.min(READ_LARGE_STEP_BYTES));
        }
        if self.buf.len().saturating_sub(self.filled) < enough {
            // Drop the stale spare room first so `reserve` only moves received bytes.
            self.buf.truncate(self.filled);
            if !self.buf.try_reclaim(reserve) {
                let need = self.filled + reserve;
                if self.region_bytes >= need {
                    // Large enough, so shared: frames read into it are alive.
                    self.move_to_new_region(need);
                } else {
                    self.buf.reserve(reserve);
                    self.region_bytes = self.buf.capacity();
                }
            }
            self.buf.resize(self.filled + want, 0);
        }
        // `filled <= buf.len()` always holds (commit clamps); an empty slice otherwise.
        let filled = self.filled.min(self.buf.len());
        let space = self.buf.split_at_mut(filled).1;
        if self.after_pooled {
            let short = space.len().min(READ_AFTER_POOLED_BYTES);
            return space.split_at_mut(short).0;
        }
        space
    }

    /// Payload length announced by the frame at the front of the buffer, if its header is in,
    /// whether or not `next_frame` has decoded it yet.
    fn front_payload_len(&self) -> Option<u32> {
        if let Some(h) = &self.pending {
            return Some(h.len);
        }
        if self.filled < HEADER_LEN {
            return None;
        }
        let raw: [u8; 4] = self.buf.get(32..36)?.try_into().ok()?;
        Some(u32::from_be_bytes(raw))
    }

    /// Record that the first `n` bytes of the last [`read_space`](Self::read_space) region
    /// were filled. `n` larger than that region is a driver bug: it is clamped and logged.
    /// After an error (poisoned decoder) the bytes are discarded.
    pub fn commit(&mut self, n: usize) {
        if self.poisoned.is_some() {
            return;
        }
        if let Some(p) = &mut self.pooled {
            let room = p.len.saturating_sub(p.got);
            if n > room {
                log::error!("FrameDecoder::commit({n}) exceeds the read space of {room} bytes");
            }
            p.got += n.min(room);
            return;
        }
        let room = self.buf.len().saturating_sub(self.filled);
        if n > room {
            log::error!("FrameDecoder::commit({n}) exceeds the read space of {room} bytes");
        }
        self.filled += n.min(room);
    }

    /// Copy `bytes` in (tests, the simulator). Equivalent to `read_space` + copy + `commit`.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        if self.poisoned.is_some() {
            return;
        }
        if let Some(p) = &mut self.pooled {
            let n = bytes.len().min(p.len.saturating_sub(p.got));
            let (head, rest) = bytes.split_at(n);
            if let Some(to) = p.buf.get_mut(p.got..p.got + n) {
                to.copy_from_slice(head);
            }
            p.got += n;
            bytes = rest;
            if bytes.is_empty() {
                return;
            }
        }
        self.buf.truncate(self.filled);
        self.buf.extend_from_slice(bytes);
        self.filled = self.buf.len();
        // `extend_from_slice` may have moved it: its size is no longer known, so it is not
        // kept for reuse.
        self.region_bytes = 0;
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed.
    ///
    /// Errors (the connection must then be closed; the decoder is poisoned, drops its buffer and
    /// returns the same error on every later call): any [`Header::decode`] error, and
    /// [`WireError::TooLarge`] as soon as a header announces more than the maximum payload,
    /// before that payload arrives.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, WireError> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        match self.try_next() {
            Ok(f) => Ok(f),
            Err(e) => {
                self.poisoned = Some(e.clone());
                self.buf = BytesMut::new();
                self.region_bytes = 0;
                self.pool = Vec::new();
                self.filled = 0;
                self.pending = None;
                self.pooled = None;
                Err(e)
            }
        }
    }

    fn try_next(&mut self) -> Result<Option<Frame>, WireError> {
        let header = match self.pending {
            Some(h) => h,
            None => {
                let Some(raw) = self
                    .buf
                    .get(..HEADER_LEN)
                    .filter(|_| self.filled >= HEADER_LEN)
                else {
                    return Ok(None);
                };
                let raw: &[u8; HEADER_LEN] = match raw.try_into() {
                    Ok(r) => r,
                    Err(_) => return Ok(None),
                };
                let h = Header::decode(raw)?;
                self.pending = Some(h);
                // The short read after a pooled payload was for this header: the rest of
                // its frame is read as its size says.
                self.after_pooled = false;
                h
            }
        };
        if header.len > self.max_payload {
            return Err(WireError::TooLarge {
                len: header.len,
                max: self.max_payload,
            });
        }
        if self.pooled.as_ref().is_some_and(|p| p.got < p.len) {
            return Ok(None);
        }
        if let Some(p) = self.pooled.take() {
            self.pending = None;
            self.after_pooled = true;
            return Ok(Some(Frame {
                header,
                payload: p.pool.freeze_prefix(p.buf, p.len),
            }));
        }
        let len = header.len as usize;
        let frame_len = HEADER_LEN + len;
        if self.filled < frame_len {
            if let Some(pool) = &self.payloads
                && (READ_POOLED_PAYLOAD_MIN_BYTES..=READ_POOLED_PAYLOAD_MAX_BYTES).contains(&len)
            {
                // The rest of this payload goes into a pooled buffer; what came of it with
                // the header moves there too, and the read region is free again.
                let mut buf = pool.take_filled(len);
                let came = self.buf.get(HEADER_LEN..self.filled).unwrap_or(&[]);
                let got = came.len().min(len);
                if let (Some(to), Some(from)) = (buf.get_mut(..got), came.get(..got)) {
                    to.copy_from_slice(from);
                }
                self.buf.advance(self.filled.min(self.buf.len()));
                self.filled = 0;
                self.after_pooled = false;
                self.pooled = Some(PooledRead {
                    buf,
                    len,
                    got,
                    pool: Arc::clone(pool),
                });
            }
            return Ok(None);
        }
        let mut whole = self.buf.split_to(frame_len);
        whole.advance(HEADER_LEN);
        self.filled -= frame_len;
        self.pending = None;
        self.after_pooled = false;
        Ok(Some(Frame {
            header,
            payload: whole.freeze(),
        }))
    }

    /// Bytes received but not yet returned as frames (including a decoded pending header).
    pub fn buffered(&self) -> usize {
        self.filled + self.pooled.as_ref().map_or(0, |p| HEADER_LEN + p.got)
    }

    /// Whether an error has been returned; the connection must be closed.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oob::header::Kind;
    use proptest::prelude::*;

    fn hdr(kind: Kind, seq: u64, len: usize) -> Header {
        Header {
            kind,
            origin: 3,
            dst: 7,
            tag: 42,
            epoch: 9,
            seq,
            len: len as u32,
            lives: 0,
        }
    }

    fn encode(frames: &[Frame]) -> Vec<u8> {
        let mut v = Vec::new();
        for f in frames {
            v.extend_from_slice(&f.header.encode());
            v.extend_from_slice(&f.payload);
        }
        v
    }

    fn sample_frames() -> Vec<Frame> {
        [0usize, 1, 5, 300, 0, 70_000, 2]
            .iter()
            .enumerate()
            .map(|(i, &len)| Frame {
                header: hdr(Kind::Msg, i as u64, len),
                payload: Bytes::from((0..len).map(|b| (b * 7 + i) as u8).collect::<Vec<_>>()),
            })
            .collect()
    }

    fn drain(d: &mut FrameDecoder, out: &mut Vec<Frame>) {
        while let Some(f) = d.next_frame().expect("valid stream") {
            out.push(f);
        }
    }

    /// Feed through read_space/commit in pieces of the given sizes.
    fn via_read_space(bytes: &[u8], piece: usize, max: u32) -> Vec<Frame> {
        let mut d = FrameDecoder::new(max);
        let mut out = Vec::new();
        let mut rest = bytes;
        while !rest.is_empty() {
            let space = d.read_space();
            // What is left of a zero-filled region is offered down to its minimum.
            assert!(space.len() >= READ_SPARE_MIN_BYTES);
            let n = piece.min(rest.len()).min(space.len());
            space[..n].copy_from_slice(&rest[..n]);
            d.commit(n);
            rest = &rest[n..];
            drain(&mut d, &mut out);
        }
        assert_eq!(d.buffered(), 0);
        out
    }

    #[test]
    fn all_at_once() {
        let frames = sample_frames();
        let mut d = FrameDecoder::new(1 << 20);
        d.feed(&encode(&frames));
        let mut out = Vec::new();
        drain(&mut d, &mut out);
        assert_eq!(out, frames);
        assert_eq!(d.buffered(), 0);
    }

    #[test]
    fn one_byte_at_a_time() {
        let frames = sample_frames();
        let bytes = encode(&frames);
        let mut d = FrameDecoder::new(1 << 20);
        let mut out = Vec::new();
        for b in &bytes {
            d.feed(std::slice::from_ref(b));
            drain(&mut d, &mut out);
        }
        assert_eq!(out, frames);
        assert_eq!(via_read_space(&bytes, 1, 1 << 20), frames);
    }

    #[test]
    fn various_read_sizes() {
        let frames = sample_frames();
        let bytes = encode(&frames);
        for piece in [2, 39, 40, 41, 1000, 65_536, usize::MAX] {
            assert_eq!(
                via_read_space(&bytes, piece, 1 << 20),
                frames,
                "piece {piece}"
            );
        }
    }

    #[test]
    fn split_at_every_offset() {
        let frames: Vec<Frame> = sample_frames()
            .into_iter()
            .filter(|f| f.payload.len() < 1000)
            .collect();
        let bytes = encode(&frames);
        for cut in 0..=bytes.len() {
            let mut d = FrameDecoder::new(1 << 20);
            let mut out = Vec::new();
            d.feed(&bytes[..cut]);
            drain(&mut d, &mut out);
            d.feed(&bytes[cut..]);
            drain(&mut d, &mut out);
            assert_eq!(out, frames, "cut at {cut}");
        }
    }

    #[test]
    fn large_payload_single_allocation() {
        const LEN: usize = 50 * 1024 * 1024;
        let h = hdr(Kind::Msg, 1, LEN);
        let mut d = FrameDecoder::new(64 * 1024 * 1024);
        // The first read: a chunk containing the header and the start of the payload.
        let space = d.read_space();
        assert_eq!(space.len(), READ_CHUNK_BYTES);
        space[..HEADER_LEN].copy_from_slice(&h.encode());
        space[HEADER_LEN] = 0xAB;
        d.commit(HEADER_LEN + 1);
        assert_eq!(d.next_frame(), Ok(None));
        // Now the decoder knows the frame size: it offers the remainder in steps, every one in
        // the same allocation (no move).
        let space = d.read_space();
        assert_eq!(space.len(), READ_LARGE_STEP_BYTES);
        let first_ptr = space.as_ptr();
        let mut got = 0;
        let f = loop {
            let space = d.read_space();
            assert_eq!(space.len(), (LEN - 1 - got).min(READ_LARGE_STEP_BYTES));
            assert_eq!(space.as_ptr(), first_ptr.wrapping_add(got));
            let n = space.len();
            if got + n == LEN - 1 {
                space[n - 1] = 0xCD;
            }
            d.commit(n);
            got += n;
            if let Some(f) = d.next_frame().expect("ok") {
                break f;
            }
        };
        assert_eq!(f.header, h);
        assert_eq!(f.payload.len(), LEN);
        assert_eq!(f.payload[0], 0xAB);
        assert_eq!(f.payload[LEN - 1], 0xCD);
        assert_eq!(f.payload.as_ptr(), first_ptr.wrapping_sub(1));
        assert_eq!(d.buffered(), 0);
        // The next read gets a fresh ordinary chunk, not a 50 MiB one.
        assert_eq!(d.read_space().len(), READ_CHUNK_BYTES);
    }

    #[test]
    fn small_reads_fill_one_zeroed_region_before_another() {
        let small = hdr(Kind::Msg, 1, 60);
        let mut frame = small.encode().to_vec();
        frame.extend_from_slice(&[7u8; 60]);
        let mut d = FrameDecoder::new(1 << 20);
        let mut offered = Vec::new();
        let mut reads = 0;
        loop {
            let space = d.read_space();
            offered.push(space.len());
            if space.len() == READ_CHUNK_BYTES && reads > 0 {
                break; // a new region
            }
            // One small frame per read, as a daemon reading sparse messages gets them.
            space[..frame.len()].copy_from_slice(&frame);
            d.commit(frame.len());
            reads += 1;
            assert!(d.next_frame().expect("valid").is_some());
        }
        // Each read went on in the region the last one left, until less than the minimum was
        // left: then a new region was zero-filled.
        let per = (READ_CHUNK_BYTES - READ_SPARE_MIN_BYTES) / frame.len() + 1;
        assert_eq!(reads, per, "{offered:?}");
        assert!(
            offered
                .windows(2)
                .take(reads - 1)
                .all(|w| w[1] == w[0] - frame.len())
        );
        assert!(offered.iter().all(|&n| n >= READ_SPARE_MIN_BYTES));
    }

    fn payload_pool() -> Arc<BufferPool> {
        Arc::new(BufferPool::new(
            crate::limits::READ_PAYLOAD_POOL_BUFFERS_MAX,
            crate::limits::READ_PAYLOAD_POOL_BYTES_MAX,
        ))
    }

    /// Frames of every kind of size for the pooled path: small, just below and at the pooled
    /// minimum, a stream chunk's, and beyond the pooled maximum.
    fn pooled_sample_frames() -> Vec<Frame> {
        let lens = [
            0,
            5,
            READ_POOLED_PAYLOAD_MIN_BYTES - 1,
            READ_POOLED_PAYLOAD_MIN_BYTES,
            300,
            crate::limits::STREAM_CHUNK_MAX + 24,
            crate::limits::STREAM_CHUNK_MAX + 24,
            1,
            READ_POOLED_PAYLOAD_MAX_BYTES + 1,
            70_000,
        ];
        lens.iter()
            .enumerate()
            .map(|(i, &len)| Frame {
                header: hdr(Kind::Msg, i as u64, len),
                payload: Bytes::from((0..len).map(|b| (b * 13 + i) as u8).collect::<Vec<_>>()),
            })
            .collect()
    }

    #[test]
    fn large_payloads_read_into_the_pool_decode_the_same_in_any_pieces() {
        let frames = pooled_sample_frames();
        let bytes = encode(&frames);
        for piece in [1, 39, 40, 41, 4096, 65_536, 300_000, usize::MAX] {
            let pool = payload_pool();
            let mut d = FrameDecoder::new(4 << 20);
            d.set_payload_pool(Arc::clone(&pool));
            let mut out = Vec::new();
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let space = d.read_space();
                assert!(!space.is_empty());
                let n = piece.min(rest.len()).min(space.len());
                space[..n].copy_from_slice(&rest[..n]);
                d.commit(n);
                rest = &rest[n..];
                drain(&mut d, &mut out);
                assert!(d.buffered() <= bytes.len());
            }
            assert_eq!(d.buffered(), 0);
            assert_eq!(out, frames, "piece {piece}");
            // By feed too (the simulator's way), in the same pieces.
            let mut d = FrameDecoder::new(4 << 20);
            d.set_payload_pool(Arc::clone(&pool));
            let mut fed = Vec::new();
            for part in bytes.chunks(piece.min(bytes.len())) {
                d.feed(part);
                drain(&mut d, &mut fed);
            }
            assert_eq!(fed, frames, "feed, piece {piece}");
            drop((out, fed));
            assert!(pool.idle() > 0, "pooled payloads came back");
            assert!(pool.idle_bytes() <= crate::limits::READ_PAYLOAD_POOL_BYTES_MAX);
        }
    }

    #[test]
    fn a_pooled_buffer_is_read_into_again_without_a_zero_fill() {
        let len = crate::limits::STREAM_CHUNK_MAX;
        let frame = |seq: u64, fill: u8| Frame {
            header: hdr(Kind::Msg, seq, len),
            payload: Bytes::from(vec![fill; len]),
        };
        let pool = payload_pool();
        let mut d = FrameDecoder::new(1 << 20);
        d.set_payload_pool(Arc::clone(&pool));
        let read = |d: &mut FrameDecoder, bytes: &[u8], spaces: &mut Vec<Vec<u8>>| {
            let mut out = Vec::new();
            let mut rest = bytes;
            while !rest.is_empty() {
                let space = d.read_space();
                spaces.push(space.get(..8).unwrap_or(space).to_vec());
                let n = rest.len().min(space.len());
                space[..n].copy_from_slice(&rest[..n]);
                d.commit(n);
                rest = &rest[n..];
                drain(d, &mut out);
            }
            out
        };
        let mut spaces = Vec::new();
        let first = read(&mut d, &encode(&[frame(0, 0xAB)]), &mut spaces);
        assert_eq!(first, [frame(0, 0xAB)]);
        let ptr = first[0].payload.as_ptr();
        drop(first);
        assert_eq!(pool.idle(), 1);
        // After a pooled payload the next read is short: only what comes with the next
        // header is copied into the next pooled buffer.
        assert!(d.read_space().len() <= READ_AFTER_POOLED_BYTES);
        spaces.clear();
        let second = read(&mut d, &encode(&[frame(1, 0xCD)]), &mut spaces);
        assert_eq!(second, [frame(1, 0xCD)]);
        assert_eq!(second[0].payload.as_ptr(), ptr, "the same buffer again");
        // The region offered for the rest of the payload still held the first payload's bytes:
        // it was not zero-filled before the read.
        assert!(spaces.iter().any(|s| s == &[0xAB; 8]), "{spaces:?}");
        // A frame too large for the pool right after a pooled one: once its header is in, it
        // is read in large regions again, not in short reads.
        let big = Frame {
            header: hdr(Kind::Msg, 2, READ_POOLED_PAYLOAD_MAX_BYTES + 1),
            payload: Bytes::from(vec![5u8; READ_POOLED_PAYLOAD_MAX_BYTES + 1]),
        };
        let mut d2 = FrameDecoder::new(4 << 20);
        d2.set_payload_pool(Arc::clone(&pool));
        let mut out = Vec::new();
        let mut big_reads = 0;
        for (bytes, is_big) in [
            (encode(&[frame(3, 1)]), false),
            (encode(std::slice::from_ref(&big)), true),
        ] {
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let space = d2.read_space();
                let n = rest.len().min(space.len());
                space[..n].copy_from_slice(&rest[..n]);
                d2.commit(n);
                rest = &rest[n..];
                big_reads += usize::from(is_big);
                drain(&mut d2, &mut out);
            }
        }
        assert_eq!(out.last(), Some(&big));
        assert!(big_reads < 20, "{big_reads} reads for one frame");
    }

    #[test]
    fn read_space_sizes_from_undecoded_header_capped_by_max() {
        let mut d = FrameDecoder::new(1 << 20);
        d.feed(&hdr(Kind::Msg, 0, 200_000).encode());
        // Header in, next_frame not called yet: still sized for the whole frame.
        assert_eq!(d.read_space().len(), 200_000);
        // A hostile header announcing 4 GiB does not make us allocate more than the maximum.
        let mut d = FrameDecoder::new(100_000);
        d.feed(&hdr(Kind::Msg, 0, u32::MAX as usize).encode());
        assert_eq!(d.read_space().len(), 100_000);
        assert!(matches!(d.next_frame(), Err(WireError::TooLarge { .. })));
    }

    #[test]
    fn commit_truncates_unreceived_tail() {
        let h = hdr(Kind::Heartbeat, 0, 0);
        let mut d = FrameDecoder::new(16);
        let space = d.read_space();
        space[..HEADER_LEN].copy_from_slice(&h.encode());
        d.commit(HEADER_LEN);
        assert_eq!(d.buffered(), HEADER_LEN);
        let f = d.next_frame().expect("ok").expect("frame");
        assert_eq!(f.header, h);
        assert!(f.payload.is_empty());
        assert_eq!(d.next_frame(), Ok(None));
        // An oversized commit is clamped, never a panic.
        let room = d.read_space().len();
        d.commit(room + 10);
        assert_eq!(d.buffered(), room);
    }

    #[test]
    fn an_idle_decoder_gives_its_buffer_back_and_reads_again() {
        let frames = sample_frames();
        let bytes = encode(&frames);
        let mut d = FrameDecoder::new(1 << 20);
        let (first, rest) = bytes.split_at(10);
        let space = d.read_space();
        space[..first.len()].copy_from_slice(first);
        d.commit(first.len());
        assert!(!d.release_idle(), "a partial frame must be kept");
        d.feed(rest);
        let mut out = Vec::new();
        drain(&mut d, &mut out);
        assert_eq!(out.len(), frames.len());
        assert!(d.release_idle());
        assert_eq!(d.capacity(), 0);
        assert!(!d.release_idle());
        d.feed(&bytes);
        out.clear();
        drain(&mut d, &mut out);
        assert_eq!(out.len(), frames.len());
    }

    #[test]
    fn memory_stays_bounded_over_many_frames() {
        let frames = sample_frames();
        let bytes = encode(&frames);
        let mut d = FrameDecoder::new(1 << 20);
        for _ in 0..200 {
            let mut out = Vec::new();
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let space = d.read_space();
                let n = 1500.min(rest.len()).min(space.len());
                space[..n].copy_from_slice(&rest[..n]);
                d.commit(n);
                rest = &rest[n..];
                drain(&mut d, &mut out);
            }
            assert_eq!(out.len(), frames.len());
            assert!(d.buf.capacity() <= 4 * READ_CHUNK_BYTES + 70_000);
        }
    }

    /// Reads `frames` large frames through `read_space`/`commit` in reads of at most `step`
    /// bytes, keeping each payload alive while `alive` later ones arrive (as a relay's link
    /// session does until acknowledged). Returns each payload's address and the largest
    /// `capacity()` seen.
    fn read_large(frames: u64, len: usize, alive: usize, step: usize) -> (Vec<usize>, usize) {
        let mut d = FrameDecoder::new(4 << 20);
        let mut kept = std::collections::VecDeque::new();
        let (mut addrs, mut cap) = (Vec::new(), 0);
        for i in 0..frames {
            let mut bytes = hdr(Kind::Msg, i, len).encode().to_vec();
            bytes.extend(std::iter::repeat_n(i as u8, len));
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let space = d.read_space();
                let n = space.len().min(rest.len()).min(step);
                space[..n].copy_from_slice(&rest[..n]);
                d.commit(n);
                rest = &rest[n..];
                cap = cap.max(d.capacity());
                while let Some(f) = d.next_frame().expect("well formed") {
                    assert!(f.payload.iter().all(|&b| b == f.header.seq as u8));
                    addrs.push(f.payload.as_ptr() as usize);
                    kept.push_back(f.payload);
                    if kept.len() > alive {
                        kept.pop_front();
                    }
                }
            }
        }
        (addrs, cap)
    }

    #[test]
    fn large_frames_kept_alive_are_read_into_reused_allocations() {
        let (addrs, cap) = read_large(40, 1 << 20, 3, 300_000);
        let distinct: std::collections::HashSet<_> = addrs.iter().collect();
        // Three alive and one being read: a handful of allocations serve all forty frames.
        assert!(distinct.len() <= 6, "{} allocations", distinct.len());
        assert!(cap <= READ_POOL_BYTES_MAX + (2 << 20), "capacity {cap}");
    }

    #[test]
    fn the_pool_is_bounded_when_every_frame_stays_alive() {
        let (addrs, cap) = read_large(30, 1 << 20, usize::MAX, 1 << 20);
        assert_eq!(addrs.len(), 30);
        assert!(cap <= READ_POOL_BYTES_MAX + (2 << 20), "capacity {cap}");
        let mut d = FrameDecoder::new(1 << 20);
        d.read_space();
        assert!(d.release_idle());
        assert_eq!(d.capacity(), 0);
    }

    #[test]
    fn small_read_chunk_while_handshaking() {
        // A handshake-sized decoder never allocates more than its chunk for a whole
        // handshake frame, and offers the normal chunk once raised.
        let mut d = FrameDecoder::with_read_chunk(512, 1024);
        assert_eq!(d.read_space().len(), 1024);
        assert!(d.capacity() <= 1024);
        let h = hdr(Kind::Hello, 0, 300);
        let mut bytes = h.encode().to_vec();
        bytes.extend_from_slice(&[7; 300]);
        for b in &bytes {
            let space = d.read_space();
            space[0] = *b;
            d.commit(1);
        }
        assert!(d.capacity() <= 2048, "capacity {}", d.capacity());
        let f = d.next_frame().expect("ok").expect("frame");
        assert_eq!(f.payload.len(), 300);
        d.set_read_chunk(READ_CHUNK_BYTES);
        d.set_max_payload(1 << 20);
        assert_eq!(d.read_space().len(), READ_CHUNK_BYTES);
    }

    #[test]
    fn too_large_from_header_alone() {
        let h = hdr(Kind::Msg, 0, 1001);
        let mut d = FrameDecoder::new(1000);
        d.feed(&h.encode());
        assert_eq!(
            d.next_frame(),
            Err(WireError::TooLarge {
                len: 1001,
                max: 1000
            })
        );
        // Exactly the maximum is fine.
        let mut d = FrameDecoder::new(1000);
        let h = hdr(Kind::Msg, 0, 1000);
        d.feed(&h.encode());
        d.feed(&[0; 1000]);
        assert_eq!(
            d.next_frame().expect("ok").expect("frame").payload.len(),
            1000
        );
    }

    #[test]
    fn lowering_max_applies_to_pending_header() {
        let mut d = FrameDecoder::new(1000);
        d.feed(&hdr(Kind::Msg, 0, 600).encode());
        assert_eq!(d.next_frame(), Ok(None));
        d.set_max_payload(500);
        assert!(matches!(d.next_frame(), Err(WireError::TooLarge { .. })));
    }

    #[test]
    fn raising_max_after_handshake() {
        let mut d = FrameDecoder::new(10);
        d.feed(&hdr(Kind::Hello, 0, 4).encode());
        d.feed(&[1, 2, 3, 4]);
        d.feed(&hdr(Kind::Msg, 1, 100).encode());
        d.feed(&[0; 100]);
        assert_eq!(d.next_frame().expect("ok").expect("hello").payload.len(), 4);
        d.set_max_payload(1000);
        assert_eq!(d.next_frame().expect("ok").expect("msg").payload.len(), 100);
    }

    #[test]
    fn poisoned_after_error() {
        let mut d = FrameDecoder::new(1000);
        let mut bad = hdr(Kind::Msg, 0, 0).encode();
        bad[0] = 0;
        d.feed(&bad);
        d.feed(&hdr(Kind::Msg, 0, 0).encode());
        let e = WireError::BadMagic([0, b'B']);
        assert_eq!(d.next_frame(), Err(e.clone()));
        assert_eq!(d.next_frame(), Err(e.clone()));
        assert!(d.is_poisoned());
        d.feed(&hdr(Kind::Msg, 0, 0).encode());
        let room = d.read_space().len();
        d.commit(room);
        assert_eq!(d.next_frame(), Err(e));
        assert_eq!(d.buffered(), 0);
    }

    #[test]
    fn header_errors_surface() {
        for (at, val, want) in [
            (2usize, 20u8, WireError::BadVersion(20)),
            (3, 0, WireError::UnknownKind(0)),
        ] {
            let mut b = hdr(Kind::Msg, 0, 0).encode();
            b[at] = val;
            let mut d = FrameDecoder::new(10);
            d.feed(&b);
            assert_eq!(d.next_frame(), Err(want));
        }
    }

    fn run_bytes(max: u32, chunks: &[Vec<u8>]) {
        let mut d = FrameDecoder::new(max);
        for c in chunks {
            let space = d.read_space();
            let n = c.len().min(space.len());
            space[..n].copy_from_slice(&c[..n]);
            d.commit(n);
            while let Ok(Some(f)) = d.next_frame() {
                assert_eq!(f.payload.len(), f.header.len as usize);
            }
        }
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 0..20),
            max in 0u32..5000,
        ) {
            run_bytes(max, &chunks);
        }

        #[test]
        fn bit_flipped_streams_never_panic(flips in proptest::collection::vec((any::<usize>(), 0u8..8), 1..6), piece in 1usize..500) {
            let frames: Vec<Frame> = sample_frames().into_iter().filter(|f| f.payload.len() < 1000).collect();
            let mut bytes = encode(&frames);
            let n = bytes.len();
            for (at, bit) in flips {
                if let Some(b) = bytes.get_mut(at % n) { *b ^= 1 << bit; }
            }
            let chunks: Vec<Vec<u8>> = bytes.chunks(piece).map(|c| c.to_vec()).collect();
            run_bytes(2000, &chunks);
        }
    }
}
