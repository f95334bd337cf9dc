//! The driver's [`Keep`] store: what the send queue handed over as written ([`Written`]),
//! kept as it came: a packing buffer of small frames whole, by reference (no copy, no entry
//! per frame), a larger frame by reference to its payload.
//!
//! A packing buffer is let go once all of its frames are confirmed, and given back to the
//! send queue for reuse ([`Runs::take_spare`]): a steady stream of small frames then packs
//! into buffers that are already there, not into fresh pages.

use std::collections::VecDeque;

use bytes::BytesMut;

use super::keep::Keep;
use crate::limits::LINK_KEPT_SPARES_MAX;
use crate::oob::send_queue::Written;

/// Kept stretches; see the module's doc.
#[derive(Debug, Default)]
pub struct Runs {
    runs: VecDeque<Written>,
    /// Frames of the front stretch already confirmed: a packed stretch is let go whole.
    front_done: usize,
    /// Frames kept (confirmed ones of the front stretch excluded).
    frames: usize,
    /// Let-go packing buffers, for the send queue to pack into again: at most
    /// `limits::LINK_KEPT_SPARES_MAX`, so that the buffers a burst of acknowledgements lets go
    /// are reused instead of freed and allocated again.
    spares: Vec<BytesMut>,
}

impl Runs {
    /// A packing buffer let go, if one is kept: the caller gives it to the send queue.
    pub fn take_spare(&mut self) -> Option<BytesMut> {
        self.spares.pop()
    }

    /// Gives back the let-go packing buffers while nothing is kept (an idle link keeps no
    /// memory). True if memory was released.
    pub fn release_idle(&mut self) -> bool {
        if self.frames > 0 || (self.spares.is_empty() && self.runs.capacity() == 0) {
            return false;
        }
        self.spares = Vec::new();
        self.runs = VecDeque::new();
        true
    }
}

impl Keep for Runs {
    type Frame = Written;

    fn count(frame: &Written) -> usize {
        frame.frames()
    }

    fn keep(&mut self, written: Written, _bytes: usize) {
        self.frames += written.frames();
        self.runs.push_back(written);
    }

    fn release(&mut self, n: usize) -> usize {
        let mut n = n.min(self.frames);
        self.frames -= n;
        let mut freed = 0;
        while n > 0 {
            let Some(front) = self.runs.front() else {
                break;
            };
            let left = front.frames().saturating_sub(self.front_done);
            if n < left {
                self.front_done += n;
                break;
            }
            n -= left;
            self.front_done = 0;
            if let Some(run) = self.runs.pop_front() {
                freed += run.wire_len();
                if let Written::Packed { bytes, .. } = run
                    && self.spares.len() < LINK_KEPT_SPARES_MAX
                    && let Ok(mut buf) = bytes.try_into_mut()
                {
                    buf.clear();
                    self.spares.push(buf);
                }
            }
        }
        freed
    }

    fn drain(&mut self) -> impl Iterator<Item = Written> + '_ {
        let mut skip = std::mem::take(&mut self.front_done);
        self.frames = 0;
        self.runs
            .drain(..)
            .filter_map(move |run| run.skip(std::mem::take(&mut skip)))
    }

    fn clear(&mut self) {
        self.runs.clear();
        self.front_done = 0;
        self.frames = 0;
    }

    fn frames(&self) -> usize {
        self.frames
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oob::header::{HEADER_LEN, Header, Kind};
    use crate::oob::send_queue::{Payload, SendQueue};
    use bytes::Bytes;

    fn frame(seq: u64, len: usize) -> (Header, Payload) {
        let header = Header {
            kind: Kind::Msg,
            origin: 1,
            dst: 2,
            tag: 7,
            epoch: 0,
            seq,
            len: len as u32,
            lives: 0,
        };
        (header, Payload::from(Bytes::from(vec![seq as u8; len])))
    }

    /// Writes `frames` through a send queue in uneven pieces, keeping what it hands over.
    fn write_all(frames: &[(Header, Payload)]) -> Runs {
        let mut q = SendQueue::new(usize::MAX);
        let mut r = Runs::default();
        for (h, p) in frames {
            q.push(h, p.clone()).expect("room");
        }
        let mut step = 1;
        while !q.is_empty() {
            q.advance_with(step.min(q.queued_bytes()), |w| {
                let b = w.wire_len();
                r.keep(w, b);
            });
            step = step * 3 % 7919 + 1;
        }
        r
    }

    #[test]
    fn frames_come_back_as_written_after_a_partial_release() {
        let written: Vec<_> = (0..2000u64)
            .map(|i| {
                frame(
                    i,
                    if i % 97 == 0 {
                        5000
                    } else {
                        (i % 200) as usize
                    },
                )
            })
            .collect();
        let mut r = write_all(&written);
        assert_eq!(r.frames(), 2000);
        let freed = r.release(777);
        assert!(freed > 0, "whole stretches were let go");
        assert_eq!(r.frames(), 1223);
        let again: Vec<_> = r.drain().flat_map(|w| w.into_frames(0)).collect();
        assert_eq!(again.len(), 1223);
        for (got, want) in again.iter().zip(&written[777..]) {
            assert_eq!(got.0, want.0);
            assert_eq!(got.1.to_bytes(), want.1.to_bytes());
        }
        assert_eq!(r.frames(), 0);
        assert_eq!(r.drain().count(), 0);
    }

    #[test]
    fn every_byte_is_released_once_everything_is_confirmed() {
        let written: Vec<_> = (0..3000u64).map(|i| frame(i, 64)).collect();
        let mut r = write_all(&written);
        let mut freed = 0;
        for step in [1, 10, 1000, 1, 988, 1000] {
            freed += r.release(step);
        }
        assert_eq!(freed, 3000 * (HEADER_LEN + 64));
        assert_eq!(r.frames(), 0);
        // A release past what is kept is clamped.
        assert_eq!(r.release(5), 0);
        // A let-go packing buffer goes back to the queue.
        assert!(
            r.take_spare()
                .is_some_and(|b| b.is_empty() && b.capacity() > 0)
        );
    }
}
