//! A bounded pool of buffers lent out as `Bytes`: a buffer comes back to its pool when the last
//! `Bytes` that shares it is dropped, on whatever thread that happens, so that a steady flow of
//! large payloads does not allocate (and fault in, and zero-fill) a fresh buffer each time.
//!
//! Two users, each with its own pool and bounds:
//! - the chunks of a stream a daemon fetches from itself are encoded into one (`take`, empty
//!   buffers; `limits::STREAM_POOL_BUFFERS_MAX`);
//! - a connection's frame decoder reads large payloads into one (`take_filled`, buffers that
//!   keep their initialised bytes, so that reading into one again needs no zero-fill: safe
//!   Rust can only read a socket into initialised memory; `limits::READ_PAYLOAD_POOL_*`).
//!
//! At the bound (this many idle buffers, or this many bytes of them): a returned buffer is freed.

use bytes::Bytes;
use std::sync::{Arc, Mutex};

/// The pool; share it as `Arc<BufferPool>`.
#[derive(Debug)]
pub struct BufferPool {
    idle: Mutex<Idle>,
    idle_max: usize,
    idle_bytes_max: usize,
}

#[derive(Debug, Default)]
struct Idle {
    bufs: Vec<Vec<u8>>,
    /// The sum of `bufs`' capacities.
    bytes: usize,
    /// A buffer was taken since the last [`BufferPool::release_unused`].
    taken: bool,
}

/// A pooled buffer lent to a `Bytes` (its first `len` bytes); returns to its pool when dropped.
struct Lent {
    buf: Vec<u8>,
    len: usize,
    pool: Arc<BufferPool>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or(&self.buf)
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buf));
    }
}

impl Default for BufferPool {
    /// The pool of a daemon's stream chunks: at most `STREAM_POOL_BUFFERS_MAX` idle buffers,
    /// each a chunk's frame.
    fn default() -> Self {
        use crate::limits::{STREAM_CHUNK_MAX, STREAM_POOL_BUFFERS_MAX};
        BufferPool::new(
            STREAM_POOL_BUFFERS_MAX,
            STREAM_POOL_BUFFERS_MAX * (STREAM_CHUNK_MAX + 4096),
        )
    }
}

impl BufferPool {
    /// A pool that keeps at most `idle_max` idle buffers and `idle_bytes_max` bytes of them.
    pub fn new(idle_max: usize, idle_bytes_max: usize) -> Self {
        BufferPool {
            idle: Mutex::new(Idle::default()),
            idle_max,
            idle_bytes_max,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Idle> {
        // A panic elsewhere while holding it leaves a list of buffers, still consistent.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Removes the smallest idle buffer (by `size`) that `fits`, keeping the byte count.
    fn remove_best(
        &self,
        fits: impl Fn(&Vec<u8>) -> bool,
        size: impl Fn(&Vec<u8>) -> usize,
    ) -> Option<Vec<u8>> {
        let mut idle = self.lock();
        idle.taken = true;
        let (i, _) = idle
            .bufs
            .iter()
            .enumerate()
            .filter(|(_, b)| fits(b))
            .min_by_key(|(_, b)| size(b))?;
        let buf = idle.bufs.swap_remove(i);
        idle.bytes = idle.bytes.saturating_sub(buf.capacity());
        Some(buf)
    }

    /// An empty buffer with room for at least `cap` bytes: the smallest pooled one big enough,
    /// else a new one.
    pub fn take(&self, cap: usize) -> Vec<u8> {
        match self.remove_best(|b| b.capacity() >= cap, Vec::capacity) {
            Some(mut buf) => {
                buf.clear();
                buf
            }
            None => Vec::with_capacity(cap),
        }
    }

    /// A buffer of at least `len` initialised bytes (their values are whatever was there): the
    /// smallest pooled one that already has them, if it is at most twice `len` (a payload kept
    /// for long must not pin a much larger buffer), else a new one from the allocator's zeroed
    /// memory (fresh pages need no `memset`). Freeze its first `len` bytes with
    /// [`freeze_prefix`](Self::freeze_prefix).
    pub fn take_filled(&self, len: usize) -> Vec<u8> {
        let most = len.saturating_mul(2).max(1);
        self.remove_best(|b| b.len() >= len && b.len() <= most, Vec::len)
            .unwrap_or_else(|| vec![0; len])
    }

    /// `buf` as `Bytes` that give it back to this pool once the last of them is dropped.
    pub fn freeze(self: &Arc<Self>, buf: Vec<u8>) -> Bytes {
        let len = buf.len();
        self.freeze_prefix(buf, len)
    }

    /// The first `len` bytes of `buf` (all of it if shorter) as `Bytes` that give the whole
    /// buffer back to this pool once the last of them is dropped.
    pub fn freeze_prefix(self: &Arc<Self>, buf: Vec<u8>, len: usize) -> Bytes {
        Bytes::from_owner(Lent {
            len: len.min(buf.len()),
            buf,
            pool: Arc::clone(self),
        })
    }

    fn give_back(&self, buf: Vec<u8>) {
        let size = buf.capacity();
        let mut idle = self.lock();
        if size > 0 && idle.bufs.len() < self.idle_max && idle.bytes + size <= self.idle_bytes_max {
            idle.bytes += size;
            idle.bufs.push(buf);
        }
    }

    /// Frees the idle buffers if none was asked for since the last call (the caller calls it
    /// periodically, so that a pool nobody uses any more holds no memory).
    pub fn release_unused(&self) {
        let mut idle = self.lock();
        if !idle.taken {
            idle.bufs = Vec::new();
            idle.bytes = 0;
        }
        idle.taken = false;
    }

    /// Idle buffers held now.
    pub fn idle(&self) -> usize {
        self.lock().bufs.len()
    }

    /// Bytes of idle buffers held now (their capacities).
    pub fn idle_bytes(&self) -> usize {
        self.lock().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_comes_back_when_its_last_bytes_is_dropped_and_the_pool_is_bounded() {
        let max = 16;
        let pool = Arc::new(BufferPool::new(max, usize::MAX));
        let mut b = pool.take(1000);
        b.extend_from_slice(&[7; 1000]);
        let ptr = b.as_ptr();
        let bytes = pool.freeze(b);
        let part = bytes.slice(10..20);
        drop(bytes);
        assert_eq!(pool.idle(), 0, "a slice still shares it");
        assert_eq!(&part[..], &[7; 10]);
        drop(part);
        assert_eq!(pool.idle(), 1);
        let again = pool.take(500);
        assert_eq!(again.as_ptr(), ptr, "the same allocation, reused");
        assert!(again.is_empty());
        let many: Vec<Bytes> = (0..max + 5).map(|_| pool.freeze(pool.take(64))).collect();
        drop(many);
        assert_eq!(pool.idle(), max);
    }

    #[test]
    fn a_filled_buffer_keeps_its_bytes_and_only_a_prefix_is_lent() {
        let pool = Arc::new(BufferPool::new(4, 10_000));
        let mut b = pool.take_filled(3000);
        assert_eq!(b.len(), 3000);
        b[..4].copy_from_slice(b"abcd");
        let ptr = b.as_ptr();
        let bytes = pool.freeze_prefix(b, 4);
        assert_eq!(&bytes[..], b"abcd");
        drop(bytes);
        assert_eq!(pool.idle(), 1);
        assert!(pool.idle_bytes() >= 3000);
        // Given back whole: a request as large gets it without zero-filling it again; one much
        // smaller does not pin it.
        let small = pool.take_filled(1000);
        assert_ne!(small.as_ptr(), ptr, "at most twice the size asked for");
        assert_eq!(pool.idle(), 1, "and the large one stays idle");
        drop(small);
        let b = pool.take_filled(3000);
        assert_eq!(b.as_ptr(), ptr);
        assert_eq!(&b[..4], b"abcd", "its bytes were not zero-filled again");
        drop(pool.freeze_prefix(b, 100));
        // The byte bound: a buffer that would pass it is freed.
        let big = pool.freeze(vec![0; 20_000]);
        drop(big);
        assert_eq!(pool.idle(), 1);
        assert!(pool.idle_bytes() <= 10_000);
        // Asked for since the last call: kept; then unused for a period: freed.
        pool.release_unused();
        assert_eq!(pool.idle(), 1);
        pool.release_unused();
        assert_eq!((pool.idle(), pool.idle_bytes()), (0, 0));
    }
}
