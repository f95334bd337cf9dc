//! Where an [`Outbound`](super::Outbound) keeps the frames it wrote until they are confirmed:
//! the [`Keep`] store it is generic over, and [`Each`], the store that keeps every frame as it
//! came (the simulator's). The driver's store keeps what its send queue wrote, a packing
//! buffer of small frames as one (`super::runs`).

use std::collections::VecDeque;

/// A store of written, unconfirmed frames, in the order they were written.
///
/// The session decides which frames are confirmed and when everything must be written again;
/// the store only holds them. Its byte count may lag behind its frame count (a store that
/// frees memory in runs reports a run's bytes when the whole run is released), but it must
/// reach 0 when the store is empty.
pub trait Keep {
    /// One frame, as written and as it will be written again.
    type Frame;

    /// How many session frames `frame` is (a store may keep several as one).
    fn count(frame: &Self::Frame) -> usize;

    /// Keeps a written frame of `bytes` wire bytes.
    fn keep(&mut self, frame: Self::Frame, bytes: usize);

    /// The first `n` kept frames (at most [`frames`](Self::frames)) were confirmed: lets them
    /// go. Returns the wire bytes no longer held.
    fn release(&mut self, n: usize) -> usize;

    /// Takes every kept frame, in the order written, leaving the store empty.
    fn drain(&mut self) -> impl Iterator<Item = Self::Frame> + '_;

    /// Lets every kept frame go.
    fn clear(&mut self);

    /// Frames kept.
    fn frames(&self) -> usize;
}

/// Keeps each frame as it came, one entry per frame.
#[derive(Debug)]
pub struct Each<F>(VecDeque<(F, usize)>);

impl<F> Default for Each<F> {
    fn default() -> Self {
        Each(VecDeque::new())
    }
}

impl<F> Keep for Each<F> {
    type Frame = F;

    fn count(_: &F) -> usize {
        1
    }

    fn keep(&mut self, frame: F, bytes: usize) {
        self.0.push_back((frame, bytes));
    }

    fn release(&mut self, n: usize) -> usize {
        let n = n.min(self.0.len());
        self.0.drain(..n).map(|(_, b)| b).sum()
    }

    fn drain(&mut self) -> impl Iterator<Item = F> + '_ {
        self.0.drain(..).map(|(f, _)| f)
    }

    fn clear(&mut self) {
        self.0.clear();
    }

    fn frames(&self) -> usize {
        self.0.len()
    }
}
