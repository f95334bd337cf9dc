//! Bulk connections in the capacity model (`capacity.rs`): beside each link, a wire of its own
//! for stream data, routed by the driver's rule (`oob::bulk_route::BulkRoute`), so that its
//! order rules run under the simulator's faults and flow control, not only on real sockets.
//!
//! What the model keeps of the driver (`driver/event_loop/bulk.rs`): a bulk connection comes
//! up at a pair's first bulk frame (its handshake is not modelled); the link's bulk frames
//! already on its wire count as fed, the later ones wait in a held line while the route holds
//! the link; "confirmed read" is the receiver having read them (the link session's
//! acknowledgement is not waited for), and a sync is answered once the receiver has read
//! everything on the bulk wire. A connection's drop forgets the pair's route, its held line and
//! both bulk wires with what they carried, as the model forgets the link's own wire.

use super::capacity::{Wire, frame_lane};
use super::{Ev, World};
use crate::Rank;
use crate::node::lane::Lane;
use crate::oob::bulk_route::{BulkRoute, Move, Way};
use crate::sim::check::Violation;
use crate::sim::frame::Frame;
use std::collections::{HashMap, VecDeque};

/// One direction of a pair's bulk connection, and its route.
#[derive(Debug, Default)]
struct BulkPair {
    route: BulkRoute,
    /// The link's bulk line while the route holds it, in order.
    held: VecDeque<(Frame, bool)>,
    held_bytes: usize,
    /// Bulk frames and markers on the link's wire not yet read by the receiver.
    on_link: usize,
    /// Frames on the bulk wire not yet read.
    on_bulk: usize,
    /// The sync waited for while a marker is held.
    sync: Option<u64>,
    /// The bulk frames and markers routed and not yet read, in the order they were routed:
    /// the receiver must read them in this order, whichever wire each took (the rule the
    /// route exists for; checked by `bulk-order`).
    order: VecDeque<Frame>,
}

/// Every bulk connection of a run.
#[derive(Debug, Default)]
pub(super) struct BulkWires {
    pairs: HashMap<(Rank, Rank), BulkPair>,
    wires: HashMap<(Rank, Rank), Wire>,
    /// When the last frame on each bulk wire arrives (TCP keeps its order).
    last: HashMap<(Rank, Rank), u64>,
    /// Frames moved from a link's held line to its bulk connection, and syncs answered.
    pub moved: u64,
    pub syncs: u64,
    /// The first bulk frame or marker read out of the order it was routed in.
    pub misordered: Option<String>,
}

impl BulkWires {
    /// Forgets both directions of the pair `a`, `b` (its connection dropped).
    pub(super) fn forget(&mut self, a: Rank, b: Rank) {
        for k in [(a, b), (b, a)] {
            self.pairs.remove(&k);
            self.wires.remove(&k);
            self.last.remove(&k);
        }
    }

    /// Bytes waiting towards `to` besides the link's wire queue: the held line's and the bulk
    /// wire's queue.
    pub(super) fn waiting_bytes(&self, from: Rank, to: Rank) -> usize {
        self.pairs.get(&(from, to)).map_or(0, |p| p.held_bytes)
            + self.wires.get(&(from, to)).map_or(0, |w| w.queued_bytes)
    }
}

fn is_marker(frame: &Frame) -> bool {
    frame_lane(frame) == Lane::Marker
}

fn same(a: &Frame, b: &Frame) -> bool {
    a.decode().ok() == b.decode().ok() && a.payload() == b.payload()
}

impl BulkWires {
    /// `to` read `frame` (a bulk frame or a marker) from `from`: it must be the oldest one
    /// routed and not yet read.
    fn note_read(&mut self, from: Rank, to: Rank, frame: &Frame, now_us: u64) {
        let Some(p) = self.pairs.get_mut(&(from, to)) else {
            return;
        };
        match p.order.front() {
            Some(f) if same(f, frame) => {
                p.order.pop_front();
            }
            _ if self.misordered.is_none() => {
                self.misordered = Some(format!(
                    "{now_us} us: {from} -> {to}: read {} before {} earlier ones ({} waiting)",
                    super::describe(frame),
                    p.order
                        .front()
                        .map_or_else(|| "none".to_string(), super::describe),
                    p.order.len()
                ));
            }
            _ => {}
        }
    }
}

impl World {
    /// Routes a frame for the wire `from -> to`: `Some(frame)` for the link's wire (a bulk
    /// frame counted as on it), `None` when it went to the bulk connection or waits in the held
    /// line.
    pub(super) fn bulk_route(
        &mut self,
        from: Rank,
        to: Rank,
        frame: Frame,
        heartbeat: bool,
    ) -> Option<Frame> {
        let ws = self.wires.as_mut()?;
        if !ws.cap.bulk_connection {
            return Some(frame);
        }
        let lane = frame_lane(&frame);
        if lane == Lane::Control {
            return Some(frame);
        }
        let p = ws.bulk.pairs.entry((from, to)).or_default();
        p.order.push_back(frame.clone());
        match lane {
            Lane::Marker => {
                let (hold, sync) = p.route.handle_marker();
                if sync.is_some() {
                    p.sync = sync;
                }
                if !hold && p.held.is_empty() {
                    // Counted as the driver counts it (fed): a handover waits for it too.
                    p.on_link += 1;
                    return Some(frame);
                }
            }
            _ => {
                p.route.handle_bulk_up();
                if p.route.bulk_way() == Way::Bulk {
                    self.bulk_wire_push(from, to, frame, heartbeat);
                    return None;
                }
                let marker = p.held.iter().any(|(f, _)| is_marker(f));
                p.route.poll_handover(marker);
                if !p.route.holds_link() {
                    p.on_link += 1;
                    return Some(frame);
                }
            }
        }
        p.held_bytes += frame.wire_len();
        p.held.push_back((frame, heartbeat));
        self.bulk_progress(from, to);
        self.report_queue(from, to);
        None
    }

    /// A frame of the link's wire `from -> to` was read: a bulk one may settle a handover.
    pub(super) fn link_bulk_read(&mut self, from: Rank, to: Rank, frame: &Frame) {
        let now_us = self.now_us;
        let Some(ws) = self.wires.as_mut() else {
            return;
        };
        let lane = frame_lane(frame);
        if lane != Lane::Control {
            ws.bulk.note_read(from, to, frame, now_us);
        }
        let Some(p) = ws.bulk.pairs.get_mut(&(from, to)) else {
            return;
        };
        if lane != Lane::Control {
            p.on_link = p.on_link.saturating_sub(1);
            self.bulk_progress(from, to);
        }
    }

    /// Moves what the route allows: the held line to the bulk wire once the link's bulk
    /// frames are read (up to a marker, then a sync), the held line back to the link once a
    /// sync is answered.
    fn bulk_progress(&mut self, from: Rank, to: Rank) {
        let Some(ws) = self.wires.as_mut() else {
            return;
        };
        let Some(p) = ws.bulk.pairs.get_mut(&(from, to)) else {
            return;
        };
        let mut to_bulk = Vec::new();
        let mut to_link = Vec::new();
        if p.route.in_handover() && p.on_link == 0 {
            let marker = p.held.iter().any(|(f, _)| is_marker(f));
            match p.route.handle_link_settled(marker) {
                Some(Move::All) => to_bulk.extend(p.held.drain(..)),
                Some(Move::UntilMarker { sync }) => {
                    while p.held.front().is_some_and(|(f, _)| !is_marker(f)) {
                        to_bulk.extend(p.held.pop_front());
                    }
                    p.sync = Some(sync);
                }
                None => {}
            }
        }
        // A sync answered once everything on the bulk wire before it was read (the moved
        // frames above are behind it: they leave first).
        if to_bulk.is_empty()
            && let Some(n) = p.sync
            && p.on_bulk == 0
            && p.route.handle_synced(n)
        {
            p.sync = None;
            ws.bulk.syncs += 1;
            to_link.extend(p.held.drain(..));
        }
        for (f, _) in to_bulk.iter().chain(to_link.iter()) {
            p.held_bytes = p.held_bytes.saturating_sub(f.wire_len());
        }
        // Bulk frames and markers alike.
        p.on_link += to_link.len();
        ws.bulk.moved += to_bulk.len() as u64;
        for (f, hb) in to_bulk {
            self.bulk_wire_push(from, to, f, hb);
        }
        for (f, hb) in to_link {
            self.link_wire_push(from, to, f, hb);
        }
    }

    /// Queues a frame on the bulk wire `from -> to` (dropped at the hard bound, as the link's).
    fn bulk_wire_push(&mut self, from: Rank, to: Rank, frame: Frame, heartbeat: bool) {
        let Some(ws) = self.wires.as_mut() else {
            return;
        };
        let max = ws.cap.queue_max_bytes;
        let w = ws.bulk.wires.entry((from, to)).or_default();
        if !w.queue.is_empty() && w.queued_bytes + frame.wire_len() > max {
            ws.dropped += 1;
            log::debug!(
                "{} us: {from} -> {to}: bulk queue full ({} bytes), frame dropped",
                self.now_us,
                w.queued_bytes
            );
            return;
        }
        w.queued_bytes += frame.wire_len();
        w.queue.push_back((frame, heartbeat));
        if let Some(p) = ws.bulk.pairs.get_mut(&(from, to)) {
            p.on_bulk += 1;
        }
        self.report_queue(from, to);
        self.pump_bulk_wire(from, to);
    }

    /// Puts the bulk wire's next frame on it if it is free and its window has room.
    fn pump_bulk_wire(&mut self, from: Rank, to: Rank) {
        let Some(ws) = self.wires.as_mut() else {
            return;
        };
        let cap = ws.cap;
        if let Some(us) = ws
            .bulk
            .wires
            .get_mut(&(from, to))
            .and_then(|w| w.start_head(&cap))
        {
            self.push(self.now_us + us, Ev::BulkWireDone { from, to });
        }
    }

    /// The bulk wire's head frame left the sender: it travels with the link's latency, in
    /// order with the bulk wire's earlier frames (not the link's).
    pub(super) fn on_bulk_wire_done(&mut self, from: Rank, to: Rank) -> Result<(), Violation> {
        let Some(ws) = self.wires.as_mut() else {
            return Ok(());
        };
        let Some((frame, _)) = ws
            .bulk
            .wires
            .get_mut(&(from, to))
            .and_then(Wire::finish_head)
        else {
            return Ok(());
        };
        let lat =
            self.scen.latency_us + self.rng.range(0, self.scen.jitter_us) + self.spread(from, to);
        let generation = self.generation(from, to);
        let Some(ws) = self.wires.as_mut() else {
            return Ok(());
        };
        let last = ws.bulk.last.entry((from, to)).or_insert(0);
        let at = (self.now_us + lat).max(*last);
        *last = at;
        self.push(
            at,
            Ev::BulkFrame {
                from,
                to,
                frame,
                generation,
            },
        );
        self.report_queue(from, to);
        self.pump_bulk_wire(from, to);
        self.after(from)
    }

    /// A frame arrives over the bulk wire: read now if the receiver's node allows it (then the
    /// node takes it), else left unread until it does.
    pub(super) fn on_bulk_frame(
        &mut self,
        from: Rank,
        to: Rank,
        frame: Frame,
        generation: u64,
    ) -> Result<(), Violation> {
        if !(self.living(from) && self.living(to)) || generation != self.generation(from, to) {
            return Ok(());
        }
        let now = self.now();
        let may_read = self
            .nodes
            .get(to as usize)
            .is_some_and(|n| n.node.may_read(now, from));
        let Some(ws) = self.wires.as_mut() else {
            return Ok(());
        };
        let w = ws.bulk.wires.entry((from, to)).or_default();
        if !(may_read && w.unread.is_empty()) {
            w.unread.push_back((frame, generation, false));
            ws.unread_frames += 1;
            ws.paused.insert((from, to));
            self.arm_recheck(to);
            return Ok(());
        }
        self.bulk_read(from, to, frame);
        self.after(to)
    }

    /// `to` reads one frame of the bulk wire from `from` and hands it to its node.
    fn bulk_read(&mut self, from: Rank, to: Rank, frame: Frame) {
        let now = self.now();
        let now_us = self.now_us;
        if let Some(ws) = self.wires.as_mut() {
            ws.bulk.note_read(from, to, &frame, now_us);
            if let Some(w) = ws.bulk.wires.get_mut(&(from, to)) {
                w.window_used = w.window_used.saturating_sub(frame.wire_len());
            }
            if let Some(p) = ws.bulk.pairs.get_mut(&(from, to)) {
                p.on_bulk = p.on_bulk.saturating_sub(1);
            }
        }
        self.pump_bulk_wire(from, to);
        if let Some(n) = self.nodes.get_mut(to as usize) {
            n.handle_frame(now, from, frame);
        }
        self.bulk_progress(from, to);
    }

    /// Reads, at `to`, what the bulk wire from `from` left unread (its node allows it now).
    pub(super) fn read_bulk_unread(&mut self, from: Rank, to: Rank) {
        let frames: Vec<(Frame, u64, bool)> = match self
            .wires
            .as_mut()
            .and_then(|ws| ws.bulk.wires.get_mut(&(from, to)))
        {
            Some(w) => w.unread.drain(..).collect(),
            None => return,
        };
        for (frame, generation, _) in frames {
            if generation != self.generation(from, to) || !self.living(from) {
                continue;
            }
            self.bulk_read(from, to, frame);
        }
    }

    /// Nothing of a bulk connection between living daemons waits (held, queued, on its wire
    /// or unread): the run may end.
    pub(super) fn bulk_quiet(&self) -> bool {
        let Some(ws) = self.wires.as_ref() else {
            return true;
        };
        let live = |(a, b): &(Rank, Rank)| self.living(*a) && self.living(*b);
        ws.bulk
            .pairs
            .iter()
            .filter(|(k, _)| live(k))
            .all(|(_, p)| p.held.is_empty() && p.on_bulk == 0)
            && ws
                .bulk
                .wires
                .iter()
                .filter(|(k, _)| live(k))
                .all(|(_, w)| w.queue.is_empty() && w.unread.is_empty() && !w.sending)
    }
}
