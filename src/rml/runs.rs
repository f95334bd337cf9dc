//! Runs of small messages packed into one batch payload: the rule both kinds of batch frame
//! share (plain ones, `rml::batch_frame`; reliable ones, `relm::batch`). Consecutive items with
//! the same key join one run while the encoded run stays within its byte bound and
//! [`BATCH_FRAME_ITEMS_MAX`] items; a run of one is handed back as the item itself, unencoded;
//! items leave in the order they were offered.

use crate::limits::BATCH_FRAME_ITEMS_MAX;
use bytes::{Bytes, BytesMut};

/// A message a batch can carry.
pub trait RunItem {
    /// Items with equal keys may share a run (a destination, a neighbour and chain).
    type Key: PartialEq + Copy;
    /// Bytes an item's encoding puts before its payload.
    const HEADER_LEN: usize;
    /// This item's key.
    fn key(&self) -> Self::Key;
    /// Its payload's length.
    fn payload_len(&self) -> usize;
    /// Appends its encoding (`HEADER_LEN` bytes, then the payload).
    fn put(&self, buf: &mut BytesMut);
}

/// What [`Runs`] hands on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Run<T: RunItem> {
    /// A run of one: the item itself.
    One(T),
    /// Two or more items of `key`, encoded back to back.
    Batch {
        /// The run's key.
        key: T::Key,
        /// The encoded items.
        payload: Bytes,
        /// How many.
        items: u32,
    },
}

/// Builds runs of items, in the order they are offered.
#[derive(Debug)]
pub struct Runs<T> {
    /// The open run's first item, not yet encoded (a run of one is sent as itself).
    first: Option<T>,
    /// The open run's encoded items, once it has two or more.
    buf: BytesMut,
    items: u32,
    /// The largest batch payload.
    bytes_max: usize,
}

impl<T: RunItem> Runs<T> {
    /// No open run; batch payloads of at most `bytes_max` bytes.
    pub fn new(bytes_max: usize) -> Self {
        Runs {
            first: None,
            buf: BytesMut::new(),
            items: 0,
            bytes_max,
        }
    }

    /// Offers the next item; returns the open run if `item` cannot join it (the caller sends
    /// that first). The caller keeps items it does not want packed out: it calls
    /// [`finish`](Self::finish) and sends such an item as itself.
    #[must_use]
    pub fn push(&mut self, item: T) -> Option<Run<T>> {
        let (joins, run_bytes) = match &self.first {
            Some(f) if self.items == 1 => (f.key() == item.key(), T::HEADER_LEN + f.payload_len()),
            Some(f) => (f.key() == item.key(), self.buf.len()),
            None => (false, 0),
        };
        let fits = run_bytes + T::HEADER_LEN + item.payload_len() <= self.bytes_max
            && (self.items as usize) < BATCH_FRAME_ITEMS_MAX;
        if !(joins && fits) {
            let closed = self.finish();
            self.first = Some(item);
            self.items = 1;
            return closed;
        }
        if self.items == 1
            && let Some(f) = &self.first
        {
            self.buf
                .reserve(self.bytes_max.min(16 * (T::HEADER_LEN + f.payload_len())));
            f.put(&mut self.buf);
        }
        item.put(&mut self.buf);
        self.items += 1;
        None
    }

    /// Hands on the open run, if any.
    #[must_use]
    pub fn finish(&mut self) -> Option<Run<T>> {
        let first = self.first.take()?;
        let items = std::mem::take(&mut self.items);
        if items <= 1 {
            return Some(Run::One(first));
        }
        Some(Run::Batch {
            key: first.key(),
            payload: self.buf.split().freeze(),
            items,
        })
    }
}
