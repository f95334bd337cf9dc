//! Link capacity (runs with the `overload` kind): each direction of a connection carries a
//! bounded number of bytes per microsecond, through a sender-side queue (the driver's send
//! queue, whose level the sending node is told, as the driver tells it) and a window of bytes
//! sent but not yet read by the receiver (the kernel's socket buffers). A receiver whose node
//! says not to read a neighbour's link (`Node::may_read_link`, flow control) leaves its frames
//! unread; the window then fills and the sender's queue stops draining, as TCP makes it.
//!
//! What it checks, with the world's checkers: under offered load well above capacity, with
//! heartbeats on and no fault, delivery never stops (every accepted plain message arrives), no relay
//! reaches its hard queue bound (nothing is dropped), and no living daemon is declared dead.

use super::{Ev, World};
use crate::Rank;
use crate::node::lane::Lane;
use crate::sim::check::Violation;
use crate::sim::frame::Frame;
use std::collections::{HashMap, HashSet, VecDeque};

/// Re-checks of a receiver that leaves frames unread, in microseconds (the driver's
/// `limits::FLOW_RECHECK_MS`).
const RECHECK_US: u64 = 100_000;

/// The capacity of every link in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkCapacity {
    /// Bytes a direction of a link carries per microsecond (1 is 1 MB/s).
    pub bytes_per_us: u64,
    /// Bytes sent and not yet read that a direction holds (the socket buffers).
    pub window_bytes: usize,
    /// The send queue's hard bound (`send_queue_max_bytes`): a frame beyond it is dropped.
    pub queue_max_bytes: usize,
    /// Each pair also has a bulk connection (`world/bulk_wire.rs`, the driver's setting
    /// `bulk_connection`): stream data takes a wire of its own under `oob::bulk_route`.
    pub bulk_connection: bool,
}

/// One direction of a connection.
#[derive(Debug, Default)]
pub(super) struct Wire {
    /// Frames waiting to go on the wire (the head is on it while `sending`).
    pub(super) queue: VecDeque<(Frame, bool)>,
    pub(super) queued_bytes: usize,
    /// Bytes of bulk frames in `queue` (`node::lane`), reported with the level.
    pub(super) bulk_bytes: usize,
    pub(super) sending: bool,
    /// Bytes on the wire or arrived and not read.
    pub(super) window_used: usize,
    /// Arrived frames the receiver has not read, with the generation they came on.
    pub(super) unread: VecDeque<(Frame, u64, bool)>,
}

impl Wire {
    /// Puts the head frame on the wire if the wire is free and the window has room (a frame
    /// larger than the whole window still goes once the window is empty): how long it takes
    /// to send, in microseconds.
    pub(super) fn start_head(&mut self, cap: &LinkCapacity) -> Option<u64> {
        let len = self.queue.front()?.0.wire_len();
        if self.sending || (self.window_used > 0 && self.window_used + len > cap.window_bytes) {
            return None;
        }
        self.sending = true;
        Some((len as u64).div_ceil(cap.bytes_per_us.max(1)))
    }

    /// The head frame has left the sender: out of the queue, into the window.
    pub(super) fn finish_head(&mut self) -> Option<(Frame, bool)> {
        self.sending = false;
        let (frame, heartbeat) = self.queue.pop_front()?;
        self.queued_bytes = self.queued_bytes.saturating_sub(frame.wire_len());
        if is_bulk(&frame) {
            self.bulk_bytes = self.bulk_bytes.saturating_sub(frame.wire_len());
        }
        self.window_used += frame.wire_len();
        Some((frame, heartbeat))
    }
}

/// Every wire of a run, and what the checks need.
#[derive(Debug)]
pub(super) struct Wires {
    pub(super) cap: LinkCapacity,
    pub(super) wires: HashMap<(Rank, Rank), Wire>,
    /// The bulk connections' wires and routes, when the run has them.
    pub(super) bulk: super::bulk_wire::BulkWires,
    /// (from, to) with unread frames (on the link's wire or the bulk connection's).
    pub(super) paused: HashSet<(Rank, Rank)>,
    /// Receivers with a re-check scheduled.
    recheck_armed: HashSet<Rank>,
    /// Frames dropped at the hard bound.
    pub dropped: u64,
    /// Times a receiver left a frame unread (flow control at work).
    pub unread_frames: u64,
}

impl Wires {
    pub(super) fn new(cap: LinkCapacity) -> Self {
        Wires {
            cap,
            wires: HashMap::new(),
            bulk: Default::default(),
            paused: HashSet::new(),
            recheck_armed: HashSet::new(),
            dropped: 0,
            unread_frames: 0,
        }
    }

    /// Nothing queued, on a wire, or unread anywhere.
    pub(super) fn is_empty(&self) -> bool {
        self.wires
            .values()
            .all(|w| w.queue.is_empty() && w.unread.is_empty() && !w.sending)
    }

    /// Forgets every wire to or from `r` (it crashed, or a connection of it dropped): what
    /// they carried is lost, as the world's in-flight frames are.
    pub(super) fn forget(&mut self, a: Rank, b: Rank) {
        self.wires.remove(&(a, b));
        self.wires.remove(&(b, a));
        self.paused.remove(&(a, b));
        self.paused.remove(&(b, a));
        self.bulk.forget(a, b);
    }
}

impl World {
    /// Queues a frame on the wire `from -> to` (the connection is up); false if the model is
    /// off and the frame should go the usual way.
    pub(super) fn wire_transmit(
        &mut self,
        from: Rank,
        to: Rank,
        frame: Frame,
        heartbeat: bool,
    ) -> bool {
        if self.wires.is_none() {
            return false;
        }
        let frame = match self.bulk_route(from, to, frame, heartbeat) {
            Some(frame) => frame,
            None => return true,
        };
        self.link_wire_push(from, to, frame, heartbeat);
        true
    }

    /// Queues a frame on the link's wire `from -> to` in its lane (dropped at the hard bound).
    pub(super) fn link_wire_push(&mut self, from: Rank, to: Rank, frame: Frame, heartbeat: bool) {
        let Some(wires) = self.wires.as_mut() else {
            return;
        };
        let max = wires.cap.queue_max_bytes;
        let w = wires.wires.entry((from, to)).or_default();
        if !w.queue.is_empty() && w.queued_bytes + frame.wire_len() > max {
            wires.dropped += 1;
            log::debug!(
                "{} us: {from} -> {to}: queue full ({} bytes), frame dropped: {}",
                self.now_us,
                w.queued_bytes,
                super::describe(&frame)
            );
            return;
        }
        w.queued_bytes += frame.wire_len();
        // The driver's two lines (`node::lane`): a control frame goes ahead of the bulk
        // frames not yet on the wire; a marker stays behind them.
        let first_waiting = usize::from(w.sending);
        let bulk_at = w
            .queue
            .iter()
            .skip(first_waiting)
            .position(|(f, _)| is_bulk(f))
            .map(|i| i + first_waiting);
        match (frame_lane(&frame), bulk_at) {
            (Lane::Control, Some(at)) => w.queue.insert(at, (frame, heartbeat)),
            (Lane::Bulk, _) => {
                w.bulk_bytes += frame.wire_len();
                w.queue.push_back((frame, heartbeat));
            }
            _ => w.queue.push_back((frame, heartbeat)),
        }
        self.report_queue(from, to);
        self.pump_wire(from, to);
    }

    /// Puts the next queued frame on the wire if it is free and the window has room.
    fn pump_wire(&mut self, from: Rank, to: Rank) {
        let Some(wires) = self.wires.as_mut() else {
            return;
        };
        let cap = wires.cap;
        if let Some(us) = wires
            .wires
            .get_mut(&(from, to))
            .and_then(|w| w.start_head(&cap))
        {
            self.push(self.now_us + us, Ev::WireDone { from, to });
        }
    }

    /// The head frame of `from -> to` has left the sender: it travels with the link's
    /// latency; the next one may start.
    pub(super) fn on_wire_done(&mut self, from: Rank, to: Rank) -> Result<(), Violation> {
        let Some(w) = self
            .wires
            .as_mut()
            .and_then(|ws| ws.wires.get_mut(&(from, to)))
        else {
            return Ok(());
        };
        let Some((frame, heartbeat)) = w.finish_head() else {
            return Ok(());
        };
        self.travel(from, to, frame, heartbeat);
        self.report_queue(from, to);
        self.pump_wire(from, to);
        self.after(from)
    }

    /// Tells `from`'s node how full its queue towards `to` is (the bulk connection's and the
    /// held bulk line's bytes counted, all of them bulk, as the driver's `peer_levels`).
    pub(super) fn report_queue(&mut self, from: Rank, to: Rank) {
        let (mut queued, mut bulk) = self
            .wires
            .as_ref()
            .and_then(|ws| ws.wires.get(&(from, to)))
            .map_or((0, 0), |w| (w.queued_bytes, w.bulk_bytes));
        if let Some(ws) = self.wires.as_ref() {
            let extra = ws.bulk.waiting_bytes(from, to);
            queued += extra;
            bulk += extra;
        }
        // Frames waiting for the connection count as queued, as the driver's `pending` does
        // (`report_waiting`; regression seeds 802624 and 805020).
        queued += self
            .parked
            .get(&(from, to))
            .map_or(0, |fs| fs.iter().map(Frame::wire_len).sum::<usize>());
        let now = self.now();
        if let Some(n) = self.nodes.get_mut(from as usize) {
            n.node.handle_send_queue(now, to, queued, bulk);
        }
    }

    /// A frame arrived at `to` over a wire: read now if its node allows it, otherwise left
    /// unread. True if it was read (the caller hands it to the node).
    pub(super) fn wire_arrived(
        &mut self,
        from: Rank,
        to: Rank,
        frame: &Frame,
        generation: u64,
        heartbeat: bool,
    ) -> bool {
        let now = self.now();
        let may_read = self
            .nodes
            .get(to as usize)
            .is_some_and(|n| n.node.may_read_link(now, from));
        let Some(wires) = self.wires.as_mut() else {
            return true;
        };
        let w = wires.wires.entry((from, to)).or_default();
        if may_read && w.unread.is_empty() {
            w.window_used = w.window_used.saturating_sub(frame.wire_len());
            self.pump_wire(from, to);
            self.link_bulk_read(from, to, frame);
            return true;
        }
        w.unread.push_back((frame.clone(), generation, heartbeat));
        wires.unread_frames += 1;
        wires.paused.insert((from, to));
        self.arm_recheck(to);
        false
    }

    pub(super) fn arm_recheck(&mut self, node: Rank) {
        let Some(wires) = self.wires.as_mut() else {
            return;
        };
        if wires.recheck_armed.insert(node) {
            let at = self.now_us + RECHECK_US;
            self.push(at, Ev::Recheck { node });
        }
    }

    /// Reads, at `node`, the frames it left unread from neighbours it may read again.
    pub(super) fn read_unread(&mut self, node: Rank) -> Result<(), Violation> {
        let Some(wires) = self.wires.as_mut() else {
            return Ok(());
        };
        let mut from: Vec<Rank> = wires
            .paused
            .iter()
            .filter(|(_, to)| *to == node)
            .map(|(f, _)| *f)
            .collect();
        from.sort_unstable();
        let now = self.now();
        for f in from {
            let allowed = self
                .nodes
                .get(node as usize)
                .is_some_and(|n| n.node.may_read_link(now, f));
            if !allowed {
                continue;
            }
            let frames: Vec<(Frame, u64, bool)> = match self
                .wires
                .as_mut()
                .and_then(|ws| ws.wires.get_mut(&(f, node)))
            {
                Some(w) => {
                    let v: Vec<_> = w.unread.drain(..).collect();
                    let bytes: usize = v.iter().map(|(b, ..)| b.wire_len()).sum();
                    w.window_used = w.window_used.saturating_sub(bytes);
                    v
                }
                None => Vec::new(),
            };
            if let Some(ws) = self.wires.as_mut() {
                ws.paused.remove(&(f, node));
            }
            for (frame, generation, _) in frames {
                if generation != self.generation(f, node) || !self.living(f) {
                    continue;
                }
                self.link_bulk_read(f, node, &frame);
                // The capacity model's runs have no stale or duplicate copies: every frame is
                // its session's.
                if !self.session_read(f, node)? {
                    continue;
                }
                if let Some(n) = self.nodes.get_mut(node as usize) {
                    n.handle_frame(now, f, frame);
                }
            }
            self.pump_wire(f, node);
            self.read_bulk_unread(f, node);
            self.after(node)?;
        }
        Ok(())
    }

    /// The periodic re-check of a receiver with unread frames (a pause also ends by time,
    /// when a congested queue counts as stuck).
    pub(super) fn on_recheck(&mut self, node: Rank) -> Result<(), Violation> {
        if let Some(ws) = self.wires.as_mut() {
            ws.recheck_armed.remove(&node);
        }
        if !self.living(node) {
            return Ok(());
        }
        self.read_unread(node)?;
        let still = self
            .wires
            .as_ref()
            .is_some_and(|ws| ws.paused.iter().any(|(_, to)| *to == node));
        if still {
            self.arm_recheck(node);
        }
        Ok(())
    }
}

/// The lane of a frame (`node::lane`); an undecodable one counts as control.
pub(super) fn frame_lane(frame: &Frame) -> Lane {
    frame.decode().map_or(Lane::Control, |h| {
        crate::node::lane::lane(&h, frame.payload())
    })
}

fn is_bulk(frame: &Frame) -> bool {
    frame_lane(frame) == Lane::Bulk
}
