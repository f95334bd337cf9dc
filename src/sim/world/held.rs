//! Frames a daemon may not read yet, in runs without the capacity model (`Node::may_read_link`:
//! the frames waiting in the node for a direct link's drain marker are at their bound, or
//! flow control pauses the connection). They wait in order per direction, as
//! bytes nobody reads wait in the kernel, and are read as soon as the node allows it (the
//! capacity model, `capacity.rs`, does the same with its windows).

use super::World;
use crate::Rank;
use crate::sim::check::Violation;
use crate::sim::frame::Frame;
use std::collections::VecDeque;

/// Frames held for one direction: (frame, connection generation, counted in its session).
pub(super) type Held = VecDeque<(Frame, u64, bool)>;

impl World {
    /// A frame arrived at `to` from `from`: true if `to` reads it now, false if it waits
    /// (behind earlier held frames of that direction, or because `to` may not read `from`).
    pub(super) fn read_or_hold(
        &mut self,
        from: Rank,
        to: Rank,
        frame: &Frame,
        generation: u64,
        counted: bool,
    ) -> bool {
        let now = self.now();
        let behind = self.held.get(&(from, to)).is_some_and(|q| !q.is_empty());
        let may_read = self
            .nodes
            .get(to as usize)
            .is_some_and(|n| n.node.may_read_link(now, from));
        if may_read && !behind {
            return true;
        }
        self.held
            .entry((from, to))
            .or_default()
            .push_back((frame.clone(), generation, counted));
        self.stats.held_frames += 1;
        false
    }

    /// Reads, at `node`, the held frames it may read now, each direction in order, until none
    /// is readable (a frame read may allow more: the marker itself was read).
    pub(super) fn read_held(&mut self, node: Rank) -> Result<(), Violation> {
        let now = self.now();
        loop {
            let mut from: Vec<Rank> = self
                .held
                .iter()
                .filter(|((_, to), q)| *to == node && !q.is_empty())
                .map(|((f, _), _)| *f)
                .collect();
            if from.is_empty() {
                return Ok(());
            }
            from.sort_unstable();
            let mut read = false;
            for f in from {
                while self
                    .nodes
                    .get(node as usize)
                    .is_some_and(|n| n.node.may_read_link(now, f))
                {
                    let Some((frame, generation, counted)) =
                        self.held.get_mut(&(f, node)).and_then(VecDeque::pop_front)
                    else {
                        break;
                    };
                    read = true;
                    // Gone with its connection, or with its sender.
                    if generation != self.generation(f, node) || !self.living(f) {
                        continue;
                    }
                    if counted && !self.session_read(f, node)? {
                        continue;
                    }
                    if let Some(n) = self.nodes.get_mut(node as usize) {
                        n.handle_frame(now, f, frame);
                    }
                }
            }
            self.held.retain(|_, q| !q.is_empty());
            if !read {
                return Ok(());
            }
        }
    }
}
