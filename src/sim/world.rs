//! The simulated world: a virtual clock, an event queue, FIFO links with seeded latency, and
//! the faults of the scenario. One thread; everything follows from the seed.

use super::check::{self, Checker, Violation};
use super::node::{SimNode, TAG_PLAIN, TAG_RELIABLE};
use super::rng::Rng;
use super::swarm::{Fault, Scenario};
use crate::Rank;
use crate::relm::RelmConfig;
use bytes::Bytes;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::{Duration, Instant};

/// Events processed per seed at most: a run that needs more has livelocked.
pub const EVENTS_MAX: u64 = 20_000_000;
/// Virtual time allowed after the faults stop for everything to settle (the liveness bound).
pub const LIVENESS_US: u64 = 600_000_000;

#[derive(Debug)]
enum Ev {
    Frame {
        from: Rank,
        to: Rank,
        frame: Bytes,
    },
    Timer {
        node: Rank,
    },
    Detect {
        node: Rank,
        dead: Rank,
    },
    Crash {
        rank: Rank,
    },
    Stall {
        rank: Rank,
        until_us: u64,
    },
    Send {
        origin: Rank,
        dst: Rank,
        reliable: bool,
    },
    Broadcast {
        origin: Rank,
    },
    Contribute {
        rank: Rank,
        id: u64,
    },
}

/// Counts from one run.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunStats {
    /// Events processed.
    pub events: u64,
    /// Virtual time at the end, microseconds.
    pub end_us: u64,
    /// Reliable messages accepted and posted.
    pub reliable_sent: u64,
    pub reliable_posted: u64,
    /// Plain messages sent and posted.
    pub plain_sent: u64,
    pub plain_posted: u64,
    /// Ranks crashed.
    pub crashed: u32,
    /// RELM retransmissions and replays, summed over daemons.
    pub retransmits: u64,
    pub replays: u64,
    /// Broadcast operations rank 0 numbered, and deliveries of them.
    pub bcast_ops: u64,
    pub bcast_delivered: u64,
    /// Allgathers completed (per daemon).
    pub gathers: u64,
}

/// The world.
pub struct World {
    radix: u32,
    base: Instant,
    now_us: u64,
    seq: u64,
    rng: Rng,
    scen: Scenario,
    nodes: Vec<SimNode>,
    alive: Vec<bool>,
    crashed: Vec<Rank>,
    stalled_until: Vec<u64>,
    timer_at: Vec<Option<u64>>,
    link_last: HashMap<(Rank, Rank), u64>,
    slow: Vec<(Rank, Rank, u64, u64, u64)>,
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    slab: Vec<Option<Ev>>,
    free: Vec<usize>,
    pair_seq: HashMap<(Rank, Rank), u64>,
    next_token: u64,
    check: Checker,
    stats: RunStats,
}

impl World {
    /// A world for `seed`: `size` daemons of radix `radix`, `messages` reliable messages.
    pub fn new(seed: u64, size: u32, radix: u32, messages: u64) -> Result<World, String> {
        let scen = Scenario::choose(seed, size, radix, messages);
        let cfg = RelmConfig {
            cache_max: scen.cache_max,
            cache_ms: scen.cache_ms,
            ..RelmConfig::default()
        };
        crate::invariant::set_strict(true);
        let base = Instant::now();
        let nodes = (0..size)
            .map(|r| SimNode::new(r, size, radix, cfg, base))
            .collect::<Result<Vec<_>, _>>()?;
        let n = size as usize;
        log::debug!("seed {seed}: {scen:?}");
        let mut w = World {
            radix,
            base,
            now_us: 0,
            seq: 0,
            rng: Rng::new(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 1),
            scen,
            nodes,
            alive: vec![true; n],
            crashed: Vec::new(),
            stalled_until: vec![0; n],
            timer_at: vec![None; n],
            link_last: HashMap::new(),
            slow: Vec::new(),
            queue: BinaryHeap::new(),
            slab: Vec::new(),
            free: Vec::new(),
            pair_seq: HashMap::new(),
            next_token: 0,
            check: Checker::default(),
            stats: RunStats::default(),
        };
        w.plan();
        Ok(w)
    }

    fn plan(&mut self) {
        let size = self.nodes.len() as u64;
        for f in self.scen.faults.clone() {
            match f {
                Fault::Crash { rank, at_us } => self.push(at_us, Ev::Crash { rank }),
                Fault::Stall {
                    rank,
                    at_us,
                    for_us,
                } => self.push(
                    at_us,
                    Ev::Stall {
                        rank,
                        until_us: at_us + for_us,
                    },
                ),
                Fault::SlowLink {
                    a,
                    b,
                    at_us,
                    for_us,
                    factor,
                } => self.slow.push((a, b, at_us, at_us + for_us, factor)),
            }
        }
        // Broadcasts from random daemons, and allgathers every daemon contributes to.
        for _ in 0..self.scen.broadcasts {
            let origin = self.rng.range(0, size - 1) as Rank;
            let at = self.rng.range(0, self.scen.safety_us);
            self.push(at, Ev::Broadcast { origin });
        }
        for id in 1..=self.scen.gathers {
            for rank in 0..size {
                let at = self.rng.range(0, self.scen.safety_us);
                self.push(
                    at,
                    Ev::Contribute {
                        rank: rank as Rank,
                        id,
                    },
                );
            }
        }
        if size < 2 {
            return;
        }
        let traffic = [(self.scen.messages, true), (self.scen.plain, false)];
        for (count, reliable) in traffic {
            for _ in 0..count {
                let origin = self.rng.range(0, size - 1) as Rank;
                let mut dst = self.rng.range(0, size - 2) as Rank;
                if dst >= origin {
                    dst += 1;
                }
                let at = self.rng.range(0, self.scen.safety_us);
                self.push(
                    at,
                    Ev::Send {
                        origin,
                        dst,
                        reliable,
                    },
                );
            }
        }
    }

    fn push(&mut self, at_us: u64, ev: Ev) {
        let idx = match self.free.pop() {
            Some(i) => {
                if let Some(slot) = self.slab.get_mut(i) {
                    *slot = Some(ev);
                }
                i
            }
            None => {
                self.slab.push(Some(ev));
                self.slab.len() - 1
            }
        };
        self.seq += 1;
        self.queue.push(Reverse((at_us, self.seq, idx)));
    }

    fn now(&self) -> Instant {
        self.base + Duration::from_micros(self.now_us)
    }

    fn living(&self, r: Rank) -> bool {
        self.alive.get(r as usize).copied().unwrap_or(false)
    }

    /// Runs the safety phase then the liveness phase; the first broken rule, if any.
    pub fn run(&mut self) -> Result<RunStats, Violation> {
        let deadline = self.scen.safety_us + LIVENESS_US;
        while let Some(Reverse((at, seq, idx))) = self.queue.pop() {
            self.stats.events += 1;
            if self.stats.events > EVENTS_MAX {
                return Err(Violation {
                    checker: "liveness",
                    detail: format!("more than {EVENTS_MAX} events: livelock"),
                });
            }
            if at > deadline {
                return Err(Violation {
                    checker: "liveness",
                    detail: format!(
                        "still busy {} s after the faults stopped",
                        LIVENESS_US / 1_000_000
                    ),
                });
            }
            let Some(ev) = self.slab.get_mut(idx).and_then(Option::take) else {
                continue;
            };
            self.free.push(idx);
            self.now_us = self.now_us.max(at);
            // A stalled daemon handles nothing until it wakes; what waits for it keeps its
            // order (same sequence numbers, later time).
            if let Some(r) = target(&ev)
                && self.stalled_until.get(r as usize).is_some_and(|u| *u > at)
            {
                let until = self.stalled_until.get(r as usize).copied().unwrap_or(at);
                let idx2 = match self.free.pop() {
                    Some(i) => i,
                    None => {
                        self.slab.push(None);
                        self.slab.len() - 1
                    }
                };
                if let Some(slot) = self.slab.get_mut(idx2) {
                    *slot = Some(ev);
                }
                self.queue.push(Reverse((until, seq, idx2)));
                continue;
            }
            self.handle(ev)?;
        }
        self.stats.end_us = self.now_us;
        self.check
            .final_state(&self.nodes, &self.alive, &self.crashed, self.radix)?;
        self.check
            .final_collectives(&self.nodes, &self.alive, self.scen.gathers)?;
        self.stats.bcast_ops = self.check.ops.len() as u64;
        self.stats.bcast_delivered = self.check.bcast_delivered;
        self.stats.gathers = self.check.gathers;
        self.stats.reliable_sent = self.check.sent.values().map(|v| v.len() as u64).sum();
        self.stats.reliable_posted = self.check.reliable_posted;
        self.stats.plain_sent = self.check.plain_sent;
        self.stats.plain_posted = self.check.plain_posted;
        self.stats.crashed = self.crashed.len() as u32;
        for n in &self.nodes {
            self.stats.retransmits += n.relm().stats().retransmits;
            self.stats.replays += n.relm().stats().replays;
        }
        Ok(self.stats)
    }

    fn handle(&mut self, ev: Ev) -> Result<(), Violation> {
        let now = self.now();
        match ev {
            Ev::Frame { from, to, frame } => {
                // A connection to or from a dead daemon is gone, with whatever it carried.
                if !(self.living(from) && self.living(to)) {
                    return Ok(());
                }
                log::trace!("{} us: {from} -> {to}: {frame:?}", self.now_us);
                if let Some(n) = self.nodes.get_mut(to as usize) {
                    n.handle_frame(now, from, frame);
                }
                self.after(to)?;
            }
            Ev::Timer { node } => {
                // Only the latest timer counts; a stall may have delayed it past its instant.
                let armed = self.timer_at.get(node as usize).copied().flatten();
                if armed.is_none_or(|a| a > self.now_us) {
                    return Ok(());
                }
                if let Some(t) = self.timer_at.get_mut(node as usize) {
                    *t = None;
                }
                if self.living(node)
                    && let Some(n) = self.nodes.get_mut(node as usize)
                {
                    n.handle_timeout(now);
                    self.after(node)?;
                }
            }
            Ev::Detect { node, dead } => {
                if self.living(node)
                    && let Some(n) = self.nodes.get_mut(node as usize)
                {
                    log::debug!("{} us: rank {node} detects {dead}", self.now_us);
                    n.detect(now, dead);
                    self.after(node)?;
                }
            }
            Ev::Crash { rank } => {
                if !self.living(rank) {
                    return Ok(());
                }
                if let Some(a) = self.alive.get_mut(rank as usize) {
                    *a = false;
                }
                self.crashed.push(rank);
                self.crashed.sort_unstable();
                // Its tree neighbours see the connection drop and fail to redial.
                let watchers: Vec<Rank> = self
                    .nodes
                    .iter()
                    .filter(|n| self.living(n.rank))
                    .filter(|n| {
                        n.routing().parent() == Some(rank) || n.routing().children().contains(&rank)
                    })
                    .map(|n| n.rank)
                    .collect();
                log::debug!(
                    "{} us: rank {rank} crashes; watchers {watchers:?}",
                    self.now_us
                );
                for w in watchers {
                    self.detect_later(w, rank);
                }
            }
            Ev::Stall { rank, until_us } => {
                if let Some(s) = self.stalled_until.get_mut(rank as usize) {
                    *s = (*s).max(until_us);
                }
            }
            Ev::Broadcast { origin } => {
                if !self.living(origin) {
                    return Ok(());
                }
                let seq = {
                    let s = self.pair_seq.entry((origin, u32::MAX)).or_insert(0);
                    *s += 1;
                    *s
                };
                let pad = self.rng.range(0, 64) as usize;
                let payload = check::payload(origin, u32::MAX, seq, pad);
                let token = self.next_token;
                self.next_token += 1;
                if let Some(n) = self.nodes.get_mut(origin as usize)
                    && n.broadcast(now, payload, token).is_ok()
                {
                    self.check.originated(origin, token);
                }
                self.after(origin)?;
            }
            Ev::Contribute { rank, id } => {
                if !self.living(rank) {
                    return Ok(());
                }
                if let Some(n) = self.nodes.get_mut(rank as usize)
                    && let Err(e) = n.contribute(now, id, check::contribution(rank, id))
                {
                    return Err(Violation {
                        checker: "allgather",
                        detail: format!("rank {rank} could not contribute to {id}: {e}"),
                    });
                }
                self.after(rank)?;
            }
            Ev::Send {
                origin,
                dst,
                reliable,
            } => {
                if !self.living(origin) {
                    return Ok(());
                }
                let seq = {
                    let s = self.pair_seq.entry((origin, dst)).or_insert(0);
                    *s += 1;
                    *s
                };
                let pad = self.rng.range(0, 48) as usize;
                let payload = check::payload(origin, dst, seq, pad);
                let Some(n) = self.nodes.get_mut(origin as usize) else {
                    return Ok(());
                };
                if reliable {
                    let token = self.next_token;
                    self.next_token += 1;
                    if n.send_reliable(now, dst, TAG_RELIABLE, payload, token)
                        .is_ok()
                    {
                        self.check.sent_reliable(token, origin, dst, seq);
                    }
                } else {
                    self.check.plain_sent += 1;
                    n.send_plain(now, dst, TAG_PLAIN, payload);
                }
                self.after(origin)?;
            }
        }
        Ok(())
    }

    fn detect_later(&mut self, node: Rank, dead: Rank) {
        let lat = self.scen.latency_us;
        let at = self.now_us + self.rng.range(lat, self.scen.detect_us_max.max(lat));
        self.push(at, Ev::Detect { node, dead });
    }

    /// After a daemon handled an input: check what it posted and completed, put its frames on
    /// the links, fail its dials to dead neighbours, re-arm its timer.
    fn after(&mut self, r: Rank) -> Result<(), Violation> {
        let crashed = self.crashed.clone();
        let Some(n) = self.nodes.get_mut(r as usize) else {
            return Ok(());
        };
        let delivered = std::mem::take(&mut n.delivered);
        let completions = std::mem::take(&mut n.completions);
        let out = std::mem::take(&mut n.out);
        let gained = std::mem::take(&mut n.new_neighbours);
        let bcasts = std::mem::take(&mut n.bcasts);
        let bcast_done = std::mem::take(&mut n.bcast_done);
        let gathered = std::mem::take(&mut n.gathered);
        let timeout = n.node.poll_timeout();
        if let Some(e) = n.errors.first() {
            return Err(Violation {
                checker: "protocol",
                detail: format!("rank {r}: {e}"),
            });
        }
        for m in &delivered {
            self.check.delivered(r, m)?;
        }
        for (token, result) in &completions {
            self.check.completed(*token, result, &crashed)?;
        }
        for b in &bcasts {
            self.check.bcast_delivered(r, b)?;
        }
        for (request, op) in bcast_done {
            let alive = self.alive.clone();
            self.check.bcast_finished(r, request, op, &alive)?;
        }
        for g in &gathered {
            self.check.gathered(r, g, self.nodes.len() as u32)?;
        }
        for (to, frame) in out {
            self.transmit(r, to, frame);
        }
        for g in gained {
            if !self.living(g) {
                self.detect_later(r, g);
            }
        }
        if let Some(t) = timeout {
            let us = t.saturating_duration_since(self.base).as_micros() as u64;
            let us = us.max(self.now_us);
            let armed = self.timer_at.get(r as usize).copied().flatten();
            if armed.is_none_or(|a| a > us) {
                if let Some(slot) = self.timer_at.get_mut(r as usize) {
                    *slot = Some(us);
                }
                self.push(us, Ev::Timer { node: r });
            }
        }
        Ok(())
    }

    fn transmit(&mut self, from: Rank, to: Rank, frame: Bytes) {
        let lat = self.scen.latency_us + self.rng.range(0, self.scen.jitter_us);
        // Overlapping slow windows do not compound: the slowest one applies.
        let factor = self
            .slow
            .iter()
            .filter(|&&(a, b, start, end, _)| {
                ((a, b) == (from, to) || (b, a) == (from, to))
                    && (start..end).contains(&self.now_us)
            })
            .map(|&(.., factor)| factor)
            .max()
            .unwrap_or(1);
        let lat = lat.saturating_mul(factor);
        // TCP: a link delivers in order.
        let last = self.link_last.entry((from, to)).or_insert(0);
        let at = (self.now_us + lat).max(*last);
        *last = at;
        self.push(at, Ev::Frame { from, to, frame });
    }
}

fn target(ev: &Ev) -> Option<Rank> {
    match ev {
        Ev::Frame { to, .. } => Some(*to),
        Ev::Timer { node } | Ev::Detect { node, .. } => Some(*node),
        Ev::Send { origin, .. } | Ev::Broadcast { origin } => Some(*origin),
        Ev::Contribute { rank, .. } => Some(*rank),
        Ev::Crash { .. } | Ev::Stall { .. } => None,
    }
}
