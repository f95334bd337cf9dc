//! The world's side of `tbon sim --sweep-radix` (`sim/sweep.rs` runs it): worlds without
//! faults or traffic of their own, under the cost model (`cost.rs`), each given one thing to
//! time (a broadcast, an allgather, a crash), and the virtual times the sweep reads.

use super::cost::{CostModel, Cpus};
use super::{Ev, World};
use crate::Rank;
use crate::sim::check::Violation;
use crate::sim::swarm::Scenario;

/// The sweep's state in a world.
#[derive(Debug)]
pub(super) struct SweepState {
    pub(super) cpus: Cpus,
    pub(super) marks: Marks,
    /// The broadcast's padding (its payload is a 24-byte checked prefix plus this).
    pub(super) bcast_pad: usize,
    /// Per daemon, the sequence number of the one input waiting in the event queue for its
    /// processor, and (in arrival order) the inputs waiting behind it: (sequence, slab index).
    pub(super) head: std::collections::HashMap<Rank, u64>,
    pub(super) waiting: std::collections::HashMap<Rank, std::collections::VecDeque<(u64, usize)>>,
}

/// Virtual times (µs) of what a sweep world saw: the last broadcast delivery, the last
/// allgather result, the last daemon whose epoch moved (a repair reached it), and the first
/// detection of a crash.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Marks {
    pub bcast_last_us: Option<u64>,
    pub gather_last_us: Option<u64>,
    pub epoch_last_us: Option<u64>,
    pub detect_first_us: Option<u64>,
    /// The last daemon wired, and how many were (a world that models wire-up).
    pub wired_last_us: Option<u64>,
    pub wired: u32,
}

impl Marks {
    pub(super) fn saw(&mut self, now_us: u64, bcast: bool, gathered: bool, epoch: bool) {
        let late = |m: &mut Option<u64>| *m = Some(m.map_or(now_us, |t| t.max(now_us)));
        if bcast {
            late(&mut self.bcast_last_us);
        }
        if gathered {
            late(&mut self.gather_last_us);
        }
        if epoch {
            late(&mut self.epoch_last_us);
        }
    }

    pub(super) fn wired(&mut self, now_us: u64) {
        self.wired += 1;
        self.wired_last_us = Some(self.wired_last_us.map_or(now_us, |t| t.max(now_us)));
    }

    pub(super) fn detected(&mut self, now_us: u64) {
        self.detect_first_us = Some(self.detect_first_us.map_or(now_us, |t| t.min(now_us)));
    }
}

/// The payload of the sweep's broadcast before padding (`check::payload`'s fixed part).
const BCAST_FIXED_BYTES: usize = 24;

impl World {
    /// A world of `size` daemons of radix `radix` for one sweep measurement: links of
    /// `latency_us` one way, a crash noticed by each neighbour one latency after it, and
    /// `model`'s costs, and rank 0 splitting broadcasts into parts of `bcast_part_bytes`.
    pub fn for_sweep(
        size: u32,
        radix: u32,
        latency_us: u64,
        model: CostModel,
        bcast_part_bytes: usize,
    ) -> Result<World, String> {
        Self::sweep_world(size, radix, latency_us, model, (None, bcast_part_bytes))
    }

    /// [`World::for_sweep`] whose daemons start unwired, with contacts of about `uri_bytes`:
    /// the run is the real wire-up (every daemon reports to rank 0, the contact slices go
    /// down the tree), timed by `Marks::wired_last_us`.
    pub fn for_sweep_wireup(
        size: u32,
        radix: u32,
        latency_us: u64,
        model: CostModel,
        uri_bytes: usize,
    ) -> Result<World, String> {
        Self::sweep_world(
            size,
            radix,
            latency_us,
            model,
            (Some(uri_bytes), crate::limits::XCAST_PART_BYTES_DEFAULT),
        )
    }

    fn sweep_world(
        size: u32,
        radix: u32,
        latency_us: u64,
        model: CostModel,
        (wireup, bcast_part_bytes): (Option<usize>, usize),
    ) -> Result<World, String> {
        let scen = Scenario {
            bcast_part_bytes,
            ..Scenario::quiet(latency_us, latency_us)
        };
        let mut w = World::build(0, size, radix, scen, wireup)?;
        if wireup.is_some() {
            // Every daemon's first turn at time 0 sends its report (what `start` queued).
            for r in 0..size {
                if let Some(t) = w.timer_at.get_mut(r as usize) {
                    *t = Some(0);
                }
                w.push(0, Ev::Timer { node: r });
            }
        }
        w.sweep = Some(SweepState {
            cpus: Cpus::new(model, size),
            marks: Marks::default(),
            bcast_pad: 0,
            head: Default::default(),
            waiting: Default::default(),
        });
        Ok(w)
    }

    /// Rank 0 broadcasts a payload of `bytes` (at least the checked prefix) at time 0.
    pub fn sweep_broadcast(&mut self, bytes: usize) {
        if let Some(s) = self.sweep.as_mut() {
            s.bcast_pad = bytes.saturating_sub(BCAST_FIXED_BYTES);
        }
        self.push(0, Ev::Broadcast { origin: 0 });
    }

    /// Every daemon contributes to allgather 1 at time 0.
    pub fn sweep_allgather(&mut self) {
        for rank in 0..self.nodes.len() as Rank {
            self.push(0, Ev::Contribute { rank, id: 1 });
        }
        self.scen.gathers = 1;
    }

    /// `victim` crashes at time 0.
    pub fn sweep_crash(&mut self, victim: Rank) {
        self.push(0, Ev::Crash { rank: victim });
        self.scen.faults.push(crate::sim::swarm::Fault::Crash {
            rank: victim,
            at_us: 0,
        });
    }

    /// Runs the world to the end, with every checker, and returns what it saw.
    pub fn sweep_run(&mut self) -> Result<Marks, Violation> {
        self.run()?;
        Ok(self.sweep.as_ref().map(|s| s.marks).unwrap_or_default())
    }
}
