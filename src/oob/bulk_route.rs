//! Which connection a neighbour's bulk frames take: the link's bulk line, or the bulk
//! connection beside the link (issue "Streams": a message's round trip during a stream), and
//! when they may move from one to the other without overtaking each other or a marker.
//!
//! A bulk connection carries only the dialler's bulk frames (`node::lane`: a producer's
//! stream messages), so no control frame waits behind the kernel's buffers of stream data.
//! The rules, per neighbour, sans-IO (the driver keeps the lines and asks this what to do):
//! - *Onto the bulk connection.* Bulk frames move only once everything the link wrote of them
//!   is confirmed read (the link session's acknowledgements): the link's bulk line is held
//!   (`Handover`), and when what it fed is confirmed, its waiting frames move in order and
//!   every later one follows them (`Bulk`).
//! - *Markers.* A direct link's `Switch` or `Ready` says "everything before me went this
//!   way". One that comes while bulk frames take the bulk connection waits in the held link
//!   line, with the bulk frames after it, until the bulk connection's frames are confirmed
//!   read: the driver writes a `Sync` on it and the peer answers once it has read up to there
//!   (`Draining`). Then the link line carries on (`Link`), and hands over again once it holds
//!   no marker.
//! - *Loss.* A bulk connection lost gives its unsent frames back to the front of the link's
//!   bulk line (they were queued before anything waiting there); frames written and not read
//!   are lost with it, which a stream sees as a gap and resumes from its byte
//!   (`stream::incoming`).

/// Where a bulk frame goes now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// The link's bulk line.
    Link,
    /// The bulk connection's queue.
    Bulk,
}

/// What the driver must do once the link's fed bulk frames are confirmed read, during a
/// handover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// Move every frame of the link's bulk line to the bulk connection; later bulk frames go
    /// there too.
    All,
    /// Move the frames before the line's first marker to the bulk connection, then write
    /// `Sync(n)` on it; the marker and the rest wait in the held line.
    UntilMarker { sync: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No bulk connection: the link's bulk line carries bulk frames.
    Off,
    /// A bulk connection is up, the link's bulk line still carries bulk frames.
    Link,
    /// The link's bulk line feeds nothing more until what it fed is confirmed read.
    Handover,
    /// Bulk frames go to the bulk connection.
    Bulk,
    /// A marker waits in the held link line for `Sync(n)`'s answer.
    Draining(u64),
}

/// One neighbour's bulk route (see the module's rules).
#[derive(Debug, Clone)]
pub struct BulkRoute {
    state: State,
    /// The last sync number written (answers to older ones are stale).
    syncs: u64,
}

impl Default for BulkRoute {
    fn default() -> Self {
        BulkRoute {
            state: State::Off,
            syncs: 0,
        }
    }
}

impl BulkRoute {
    /// Where a bulk frame goes now.
    pub fn bulk_way(&self) -> Way {
        if self.state == State::Bulk {
            Way::Bulk
        } else {
            Way::Link
        }
    }

    /// Whether the link's bulk line must feed nothing to the link's send queue (its frames
    /// still wait, in order, and control frames still go).
    pub fn holds_link(&self) -> bool {
        matches!(self.state, State::Handover | State::Draining(_))
    }

    /// Whether a bulk connection is up (any state but `Off`).
    pub fn is_up(&self) -> bool {
        self.state != State::Off
    }

    /// Whether the route waits for the link's fed bulk frames to be confirmed read.
    pub fn in_handover(&self) -> bool {
        self.state == State::Handover
    }

    /// A bulk connection was established.
    pub fn handle_bulk_up(&mut self) {
        if self.state == State::Off {
            self.state = State::Link;
        }
    }

    /// The bulk connection is gone: its unsent frames go to the front of the link's bulk
    /// line, which carries bulk frames again, unheld.
    pub fn handle_bulk_down(&mut self) {
        self.state = State::Off;
    }

    /// A marker is to be queued to the link: whether it must wait in the link's bulk line
    /// even if the line is empty (it is then held). From `Bulk`, this starts a drain: the
    /// driver writes `Sync(n)` on the bulk connection (the returned number).
    pub fn handle_marker(&mut self) -> (bool, Option<u64>) {
        match self.state {
            State::Bulk => {
                self.syncs += 1;
                self.state = State::Draining(self.syncs);
                (true, Some(self.syncs))
            }
            State::Draining(_) | State::Handover => (true, None),
            State::Off | State::Link => (false, None),
        }
    }

    /// A bulk frame was queued while the link carries them: hand over if the link's bulk line
    /// holds no marker. Returns whether the route now holds the link line (`Handover`).
    pub fn poll_handover(&mut self, line_has_marker: bool) -> bool {
        if self.state == State::Link && !line_has_marker {
            self.state = State::Handover;
            return true;
        }
        false
    }

    /// During a handover, every bulk frame the link fed is confirmed read: what to move.
    pub fn handle_link_settled(&mut self, line_has_marker: bool) -> Option<Move> {
        if self.state != State::Handover {
            return None;
        }
        if line_has_marker {
            self.syncs += 1;
            self.state = State::Draining(self.syncs);
            Some(Move::UntilMarker { sync: self.syncs })
        } else {
            self.state = State::Bulk;
            Some(Move::All)
        }
    }

    /// The peer read the bulk connection up to `Sync(n)`: returns whether the held link line
    /// may feed again (a stale or unexpected answer changes nothing).
    pub fn handle_synced(&mut self, n: u64) -> bool {
        if self.state == State::Draining(n) {
            self.state = State::Link;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bulk_frames_take_the_bulk_connection_only_after_the_link_settled() {
        let mut r = BulkRoute::default();
        assert_eq!(r.bulk_way(), Way::Link);
        assert!(!r.poll_handover(false), "no bulk connection yet");
        r.handle_bulk_up();
        assert_eq!(r.bulk_way(), Way::Link);
        assert!(!r.holds_link());
        assert!(r.poll_handover(false));
        assert!(r.holds_link() && r.in_handover());
        // Still through the (held) link line until settled.
        assert_eq!(r.bulk_way(), Way::Link);
        assert_eq!(r.handle_link_settled(false), Some(Move::All));
        assert_eq!(r.bulk_way(), Way::Bulk);
        assert!(!r.holds_link());
        assert_eq!(r.handle_link_settled(false), None);
    }

    #[test]
    fn a_marker_waits_for_the_bulk_connection_to_be_read_then_the_link_hands_over_again() {
        let mut r = BulkRoute::default();
        r.handle_bulk_up();
        assert!(r.poll_handover(false));
        assert_eq!(r.handle_link_settled(false), Some(Move::All));
        let (held, sync) = r.handle_marker();
        assert!(held);
        let n = sync.unwrap();
        assert!(r.holds_link());
        // Later bulk frames wait behind the marker in the link line.
        assert_eq!(r.bulk_way(), Way::Link);
        // A second marker meanwhile waits too, without another sync.
        assert_eq!(r.handle_marker(), (true, None));
        assert!(!r.handle_synced(n + 1), "a stale answer changes nothing");
        assert!(r.handle_synced(n));
        assert!(!r.holds_link());
        // The marker was fed; the line hands over again once it holds none.
        assert!(!r.poll_handover(true));
        assert!(r.poll_handover(false));
        assert_eq!(r.handle_link_settled(false), Some(Move::All));
    }

    #[test]
    fn a_marker_in_the_held_line_at_handover_moves_only_what_is_before_it() {
        let mut r = BulkRoute::default();
        r.handle_bulk_up();
        assert!(r.poll_handover(false));
        assert_eq!(r.handle_marker(), (true, None));
        let Some(Move::UntilMarker { sync }) = r.handle_link_settled(true) else {
            panic!("expected a partial move");
        };
        assert!(r.holds_link());
        assert!(r.handle_synced(sync));
        assert_eq!(r.bulk_way(), Way::Link);
    }

    #[test]
    fn a_lost_bulk_connection_gives_the_link_line_back_unheld_in_any_state() {
        for steps in 0..4 {
            let mut r = BulkRoute::default();
            r.handle_bulk_up();
            if steps > 0 {
                r.poll_handover(false);
            }
            if steps > 1 {
                r.handle_link_settled(false);
            }
            if steps > 2 {
                r.handle_marker();
            }
            r.handle_bulk_down();
            assert!(!r.holds_link() && !r.is_up());
            assert_eq!(r.bulk_way(), Way::Link);
            assert_eq!(r.handle_marker(), (false, None));
        }
    }
}
