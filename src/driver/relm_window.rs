//! The reliable window at the call: a reliable send to another daemon is refused `Busy` when it
//! is made if `relm_unacked_max` of this daemon's users' reliable messages are already
//! unacknowledged, so that RELM never has to refuse one the caller was told was sent (a
//! `send_reliable` without a completion would have been lost without a word).
//!
//! The count is split between the two sides. Submitting threads add what they hand to the
//! command channel (`queued`); the loop publishes what the node holds (`held`: RELM's
//! unacknowledged user messages and the reliable sends waiting for wire-up) and only then takes
//! the commands it drained since the last publication out of `queued`. So `queued + held`
//! never counts less than the truth, whatever the interleaving (both sides use sequentially
//! consistent operations, the submitter reading `held` after adding to `queued`): a stale
//! value refuses a little early, never admits too many.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Admission of reliable sends against `relm_unacked_max`, shared by the handles and the loop.
#[derive(Debug)]
pub(crate) struct ReliableWindow {
    /// Reliable sends to other daemons submitted and not yet accounted in `held`.
    queued: AtomicUsize,
    /// What the node held at the loop's last publication.
    held: AtomicUsize,
    max: usize,
    /// Sends refused here (added to the `relm_busy` counter).
    refused: AtomicU64,
}

impl ReliableWindow {
    /// An empty window of `max` messages (`relm_unacked_max`).
    pub(crate) fn new(max: usize) -> Self {
        ReliableWindow {
            queued: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
            max,
            refused: AtomicU64::new(0),
        }
    }

    /// Takes room for one reliable send; false (counted) if the window is full. Undo with
    /// [`ReliableWindow::unadmit`] if the send is not submitted after all.
    pub(crate) fn admit(&self) -> bool {
        let queued = self.queued.fetch_add(1, Ordering::SeqCst);
        let held = self.held.load(Ordering::SeqCst);
        if queued.saturating_add(held) >= self.max {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            self.refused.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Gives back the room of a send that was admitted and then not submitted.
    pub(crate) fn unadmit(&self) {
        self.queued.fetch_sub(1, Ordering::SeqCst);
    }

    /// The loop's publication: the node now holds `held` users' reliable messages, and it took
    /// `taken` reliable sends from the command channel since the last publication (they are
    /// in `held` now, or ended).
    pub(crate) fn publish(&self, held: usize, taken: usize) {
        self.held.store(held, Ordering::SeqCst);
        if taken > 0 {
            self.queued.fetch_sub(taken, Ordering::SeqCst);
        }
    }

    /// Sends refused so far.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_admits_up_to_its_bound_and_reopens_as_the_loop_publishes() {
        let w = ReliableWindow::new(3);
        assert!(w.admit() && w.admit() && w.admit());
        assert!(!w.admit(), "a fourth send while three wait");
        // The loop took two; RELM holds them: still full.
        w.publish(2, 2);
        assert!(!w.admit());
        // One acknowledged.
        w.publish(1, 0);
        assert!(w.admit());
        assert!(!w.admit());
        // A send admitted and then not submitted gives its room back.
        w.publish(0, 0);
        assert!(w.admit());
        w.unadmit();
        assert_eq!(w.refused(), 3);
    }

    /// Submitting threads and a publishing loop racing: the number admitted and not yet
    /// acknowledged never exceeds the bound.
    #[test]
    fn racing_threads_never_exceed_the_bound() {
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;
        let w = Arc::new(ReliableWindow::new(16));
        // Messages admitted and not acknowledged: what the node would hold or get.
        let open = Arc::new(AtomicUsize::new(0));
        let in_channel = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let senders: Vec<_> = (0..3)
            .map(|_| {
                let (w, open, in_channel) = (w.clone(), open.clone(), in_channel.clone());
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        if w.admit() {
                            let now = open.fetch_add(1, Ordering::SeqCst) + 1;
                            assert!(now <= 16, "{now} admitted at once");
                            in_channel.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        let looper = {
            let (w, open, in_channel, stop) =
                (w.clone(), open.clone(), in_channel.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut held = 0usize;
                while !stop.load(Ordering::SeqCst) {
                    let taken = in_channel.swap(0, Ordering::SeqCst);
                    held += taken;
                    // Acknowledge up to half of what is held.
                    let acked = held / 2;
                    held -= acked;
                    open.fetch_sub(acked, Ordering::SeqCst);
                    w.publish(held, taken);
                }
            })
        };
        for s in senders {
            s.join().unwrap();
        }
        stop.store(true, Ordering::SeqCst);
        looper.join().unwrap();
    }
}
