//! A bounded pool of the buffers stream chunks are encoded into, so that a steady stream does
//! not allocate (and fault in fresh pages for) a chunk-sized buffer per chunk: a buffer comes
//! back to the pool when the last `Bytes` that shares it is dropped (after its frame was
//! written), on whatever thread that happens. At most `limits::STREAM_POOL_BUFFERS_MAX` idle
//! buffers are kept; beyond that a returned buffer is freed.

use bytes::Bytes;
use std::sync::{Arc, Mutex};

/// The pool; cheap to share (`Arc`).
#[derive(Debug, Default)]
pub struct BufferPool {
    free: Mutex<Vec<Vec<u8>>>,
}

/// A pooled buffer lent to a `Bytes`; returns to its pool when dropped.
struct Lent {
    buf: Vec<u8>,
    pool: Arc<BufferPool>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        self.pool.give_back(buf);
    }
}

impl BufferPool {
    /// An empty buffer with room for at least `cap` bytes: a pooled one when one is big
    /// enough, else a new one.
    pub fn take(&self, cap: usize) -> Vec<u8> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        match free.iter().position(|b| b.capacity() >= cap) {
            Some(i) => free.swap_remove(i),
            None => Vec::with_capacity(cap),
        }
    }

    /// `buf` as `Bytes` that give it back to this pool once the last of them is dropped.
    pub fn freeze(self: &Arc<Self>, buf: Vec<u8>) -> Bytes {
        Bytes::from_owner(Lent {
            buf,
            pool: Arc::clone(self),
        })
    }

    fn give_back(&self, buf: Vec<u8>) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < crate::limits::STREAM_POOL_BUFFERS_MAX && buf.capacity() > 0 {
            free.push(buf);
        }
    }

    /// Idle buffers held now.
    pub fn idle(&self) -> usize {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_comes_back_when_its_last_bytes_is_dropped_and_the_pool_is_bounded() {
        let pool = Arc::new(BufferPool::default());
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
        let many: Vec<Bytes> = (0..crate::limits::STREAM_POOL_BUFFERS_MAX + 5)
            .map(|_| pool.freeze(pool.take(64)))
            .collect();
        drop(many);
        assert_eq!(pool.idle(), crate::limits::STREAM_POOL_BUFFERS_MAX);
    }
}
