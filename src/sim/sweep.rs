//! `tbon sim --sweep-radix`: for one DVM size, each radix's wire-up time, broadcast and
//! allgather latency and repair time under a model of latency, bandwidth and processor cost,
//! and the radix to choose (PRRTE's users ask which radix to use and cannot measure it).
//!
//! The broadcast, the allgather, the repair and the wire-up's messages are not formulas: each
//! is a simulated run of the real protocol core (`world/sweep.rs`) whose daemons pay the
//! model's costs (`world/cost.rs`), so what the protocol sends (acknowledgements, syncs, the
//! failure report, rank 0's notice, every daemon's report and contact slice) is what is timed.
//! The simulator carries frames by rank and does not run the connections' handshakes, so
//! wire-up is the simulated protocol plus two formulas for the handshakes:
//!
//! * fan-in: every daemon dials rank 0 before it reports; rank 0 handles three handshake
//!   frames per daemon (Hello, its answer, the proof) beside the simulated report:
//!   `2 L + 3 N c`;
//! * the simulated protocol: every daemon's report to rank 0, then each child's contact slice
//!   from its parent, level by level, until the last daemon is wired;
//! * the tree links: below rank 0's children (already connected to it) each level is a new
//!   connection whose handshake costs a round trip before the slice can go on, and the
//!   parent handles three frames per child: `(depth - 1) (2 L + 3 k c)`.
//!
//! Here `L` is the one-way latency, `c` the per-frame cost, `B` the bandwidth, `k` the radix.
//! The recommendation: the radix whose worst ratio to the best radix, over the four times,
//! is smallest (the radix that is never far from the best at anything); ties go to the
//! smaller worst-then-mean ratio, then the smaller radix.

use super::Violation;
use super::world::{CostModel, World};
use crate::Rank;
use crate::routed::radix;

/// The sizes the sweep accepts (each radix runs four simulated worlds of this size).
pub const SWEEP_DAEMONS_MAX: u32 = 200_000;
/// Radixes per sweep at most.
pub const SWEEP_RADIXES_MAX: usize = 32;
/// Room left in a frame for the headers in front of a broadcast's payload.
const PAYLOAD_ROOM_BYTES: usize = 4096;

/// What to sweep, and the model.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct SweepParams {
    /// Daemons in the DVM.
    pub size: u32,
    /// The radixes to compare (each at least 2).
    pub radixes: Vec<u32>,
    /// One-way link latency, µs (at least 1).
    pub latency_us: u64,
    /// Processor cost per frame received or sent, ns.
    pub frame_ns: u64,
    /// Each daemon's sending bandwidth, MB/s (at least 1).
    pub bandwidth_mbps: u64,
    /// Processors shared by all daemons (0: one per daemon).
    pub cores: u32,
    /// The timed broadcast's payload, bytes.
    pub bcast_bytes: usize,
    /// Rank 0's `bcast_part_bytes`: the payload is pipelined down the tree in parts of this
    /// size (0: stored and forwarded whole at each level).
    pub bcast_part_bytes: usize,
    /// One contact table entry (an address and its length), bytes.
    pub uri_bytes: usize,
}

impl SweepParams {
    /// The radixes a sweep tries by default: powers of two from 2, below `size`.
    pub fn default_radixes(size: u32) -> Vec<u32> {
        let mut v: Vec<u32> = (1..31)
            .map(|p| 1u32 << p)
            .filter(|&k| k < size.max(3))
            .collect();
        if v.is_empty() {
            v.push(2);
        }
        v
    }

    /// Checks the parameters: a clear reason for the first one out of range.
    pub fn validate(&self) -> Result<(), String> {
        if !(2..=SWEEP_DAEMONS_MAX).contains(&self.size) {
            return Err(format!(
                "--daemons must be 2 to {SWEEP_DAEMONS_MAX} for a sweep, not {}",
                self.size
            ));
        }
        if self.radixes.is_empty() || self.radixes.len() > SWEEP_RADIXES_MAX {
            return Err(format!(
                "1 to {SWEEP_RADIXES_MAX} radixes, not {}",
                self.radixes.len()
            ));
        }
        if let Some(k) = self.radixes.iter().find(|&&k| k < 2) {
            return Err(format!("a radix is at least 2, not {k}"));
        }
        let flat = (self.size - 1).max(2);
        if let Some(k) = self.radixes.iter().find(|&&k| k > flat) {
            return Err(format!(
                "radix {k} exceeds {flat}: with {} daemons, radix {flat} is already one level",
                self.size
            ));
        }
        if self.cores > self.size {
            return Err(format!(
                "--cores {} exceeds the {} daemons: more processors than daemons is one each \
                 (--cores 0)",
                self.cores, self.size
            ));
        }
        if self.latency_us == 0 {
            return Err("--latency-us must be at least 1".into());
        }
        if self.bandwidth_mbps == 0 {
            return Err("--bandwidth-mbps must be at least 1".into());
        }
        // A broadcast's frame carries the payload and the collective's own header.
        let max = crate::limits::MSG_MAX_BYTES_DEFAULT as usize - PAYLOAD_ROOM_BYTES;
        if self.bcast_bytes > max {
            return Err(format!(
                "--bcast-bytes must be at most {max} (msg_max_bytes less headers)"
            ));
        }
        // A slice holds at most every contact (rank 0's first child: nearly the whole DVM at
        // radix 2).
        let table = (self.size as usize).saturating_mul(self.uri_bytes);
        if table > max {
            return Err(format!(
                "a contact slice of up to {} x {} bytes exceeds a frame ({max} bytes)",
                self.size, self.uri_bytes
            ));
        }
        Ok(())
    }

    fn model(&self) -> CostModel {
        CostModel {
            frame_ns: self.frame_ns,
            bandwidth_mbps: self.bandwidth_mbps,
            cores: self.cores,
        }
    }
}

/// One radix's times, µs of virtual time.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RadixRow {
    /// The radix these times are for.
    pub radix: u32,
    /// The tree's depth (rank 0 at 0).
    pub depth: u32,
    /// Wire-up: fan-in, the simulated protocol and links together, and the three parts.
    pub wireup_us: u64,
    /// Wire-up: rank 0's fan-in of reports and handshakes (a formula).
    pub fanin_us: u64,
    /// Wire-up: the simulated protocol (every report, every contact slice).
    pub protocol_us: u64,
    /// Wire-up: the link handshakes (a formula).
    pub links_us: u64,
    /// Rank 0's broadcast until the last daemon delivered it.
    pub bcast_us: u64,
    /// Everyone's contribution at 0 until the last daemon has the result.
    pub allgather_us: u64,
    /// The crashed daemon (rank 1, the first child of rank 0), and the time from the first
    /// neighbour's detection until the last survivor's epoch moved.
    pub victim: Rank,
    /// Time from the first detection of `victim` until the last survivor's epoch moved.
    pub repair_us: u64,
    /// The largest of this radix's four times over the best radix's.
    pub worst_ratio: f64,
}

/// A sweep's result.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Sweep {
    /// The model the sweep ran under.
    pub params: SweepParams,
    /// One row per radix, in the order asked.
    pub rows: Vec<RadixRow>,
    /// The radix to choose.
    pub recommended: u32,
}

/// Runs the sweep: four simulated worlds per radix. A protocol rule broken in one of them is
/// an error naming the radix and the checker.
pub fn sweep(p: &SweepParams) -> Result<Sweep, String> {
    p.validate()?;
    let mut radixes = p.radixes.clone();
    radixes.sort_unstable();
    radixes.dedup();
    let mut rows = Vec::with_capacity(radixes.len());
    for &k in &radixes {
        rows.push(
            one_radix(p, k)
                .map_err(|v| format!("radix {k}: the {} checker: {}", v.checker, v.detail))?,
        );
    }
    let recommended = rank_rows(&mut rows);
    Ok(Sweep {
        params: p.clone(),
        rows,
        recommended,
    })
}

fn one_radix(p: &SweepParams, k: u32) -> Result<RadixRow, Violation> {
    let world = || {
        World::for_sweep(p.size, k, p.latency_us, p.model(), p.bcast_part_bytes).map_err(|e| {
            Violation {
                checker: "sweep",
                detail: e,
            }
        })
    };
    let missing = |what: &str| Violation {
        checker: "sweep",
        detail: format!("the simulated {what} never finished"),
    };
    let mut w = world()?;
    w.sweep_broadcast(p.bcast_bytes);
    let bcast_us = w
        .sweep_run()?
        .bcast_last_us
        .ok_or_else(|| missing("broadcast"))?;

    let mut w = world()?;
    w.sweep_allgather();
    let allgather_us = w
        .sweep_run()?
        .gather_last_us
        .ok_or_else(|| missing("allgather"))?;

    let victim = 1;
    let mut w = world()?;
    w.sweep_crash(victim);
    let m = w.sweep_run()?;
    let repair_us = match (m.detect_first_us, m.epoch_last_us) {
        (Some(d), Some(e)) => e.saturating_sub(d),
        _ => return Err(missing("repair")),
    };

    let mut w =
        World::for_sweep_wireup(p.size, k, p.latency_us, p.model(), p.uri_bytes).map_err(|e| {
            Violation {
                checker: "sweep",
                detail: e,
            }
        })?;
    let m = w.sweep_run()?;
    if m.wired != p.size {
        return Err(Violation {
            checker: "sweep",
            detail: format!("{} of {} daemons wired up", m.wired, p.size),
        });
    }
    let protocol_us = m.wired_last_us.ok_or_else(|| missing("wire-up"))?;

    let depth = radix::depth(k, p.size - 1);
    let c_ns = p.frame_ns;
    let n = u64::from(p.size);
    let fanin_us = 2 * p.latency_us + n.saturating_mul(3 * c_ns).div_ceil(1000);
    let links_us = u64::from(depth.saturating_sub(1))
        .saturating_mul(2 * p.latency_us + (3 * u64::from(k) * c_ns).div_ceil(1000));
    Ok(RadixRow {
        radix: k,
        depth,
        wireup_us: fanin_us + protocol_us + links_us,
        fanin_us,
        protocol_us,
        links_us,
        bcast_us,
        allgather_us,
        victim,
        repair_us,
        worst_ratio: 0.0,
    })
}

/// Fills each row's worst ratio and returns the recommended radix.
fn rank_rows(rows: &mut [RadixRow]) -> u32 {
    let times = |r: &RadixRow| [r.wireup_us, r.bcast_us, r.allgather_us, r.repair_us];
    let mut best = [u64::MAX; 4];
    for r in rows.iter() {
        for (b, t) in best.iter_mut().zip(times(r)) {
            *b = (*b).min(t);
        }
    }
    let ratios = |r: &RadixRow| -> Vec<f64> {
        times(r)
            .iter()
            .zip(best)
            .map(|(&t, b)| t as f64 / b.max(1) as f64)
            .collect()
    };
    for r in rows.iter_mut() {
        r.worst_ratio = ratios(r).into_iter().fold(0.0, f64::max);
    }
    let key = |r: &RadixRow| {
        let mean = ratios(r).iter().sum::<f64>() / 4.0;
        (r.worst_ratio, mean, r.radix)
    };
    rows.iter()
        .min_by(|a, b| {
            key(a)
                .partial_cmp(&key(b))
                .unwrap_or(std::cmp::Ordering::Equal)
        })
        .map_or(2, |r| r.radix)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(size: u32, frame_ns: u64) -> SweepParams {
        SweepParams {
            size,
            radixes: vec![2, 4, 16, 63],
            latency_us: 50,
            frame_ns,
            bandwidth_mbps: 1000,
            cores: 0,
            bcast_bytes: 64,
            bcast_part_bytes: crate::limits::XCAST_PART_BYTES_DEFAULT,
            uri_bytes: 40,
        }
    }

    #[test]
    fn without_processor_cost_the_widest_tree_broadcasts_fastest() {
        let s = sweep(&params(64, 0)).unwrap();
        let flat = s.rows.iter().find(|r| r.radix == 63).unwrap();
        assert_eq!(flat.depth, 1);
        assert!(s.rows.iter().all(|r| r.bcast_us >= flat.bcast_us), "{s:#?}");
    }

    #[test]
    fn a_costly_frame_makes_a_flat_tree_lose() {
        // 200 µs a frame: rank 0 sending 63 copies one after another costs 12.6 ms, far more
        // than the extra hops of a radix-4 tree.
        let s = sweep(&params(64, 200_000)).unwrap();
        let flat = s.rows.iter().find(|r| r.radix == 63).unwrap();
        let four = s.rows.iter().find(|r| r.radix == 4).unwrap();
        assert!(four.bcast_us < flat.bcast_us, "{s:#?}");
        assert_ne!(s.recommended, 63);
        // Every time is measured, and the recommended radix is within its own worst ratio.
        for r in &s.rows {
            assert!(r.bcast_us > 0 && r.allgather_us > 0 && r.repair_us > 0 && r.wireup_us > 0);
            assert!(r.worst_ratio >= 1.0);
        }
    }

    #[test]
    fn the_simulated_wire_up_wires_every_daemon_and_rank_0_s_fan_in_shows() {
        let model = CostModel {
            frame_ns: 5_000,
            bandwidth_mbps: 10_000,
            cores: 0,
        };
        let wired = |n: u32| {
            let mut w = World::for_sweep_wireup(n, 4, 20, model, 40).unwrap();
            let m = w.sweep_run().unwrap();
            assert_eq!(m.wired, n, "every daemon of {n} wired");
            m.wired_last_us.unwrap()
        };
        let (small, large) = (wired(300), wired(1200));
        // Rank 0 handles every report, one after another (5 µs each): four times the daemons
        // cost at least three times as long, and the slices add little beside it.
        assert!(large >= 3 * small, "{small} µs, then {large} µs");
        assert!(large < 1200 * 5 * 2, "{large} µs");
    }

    #[test]
    fn bad_parameters_are_refused() {
        let mut p = params(64, 0);
        p.radixes = vec![1];
        assert!(sweep(&p).unwrap_err().contains("radix"));
        p = params(1, 0);
        assert!(sweep(&p).unwrap_err().contains("--daemons"));
        p = params(64, 0);
        p.bandwidth_mbps = 0;
        assert!(sweep(&p).unwrap_err().contains("bandwidth"));
        p = params(64, 0);
        p.cores = u32::MAX;
        assert!(sweep(&p).unwrap_err().contains("--cores"));
        p = params(64, 0);
        p.radixes = vec![64];
        assert!(sweep(&p).unwrap_err().contains("one level"));
        p = params(64, 0);
        p.uri_bytes = 1 << 20;
        assert!(sweep(&p).unwrap_err().contains("contact slice"));
        p = params(64, 0);
        p.bcast_bytes = crate::limits::MSG_MAX_BYTES_DEFAULT as usize;
        assert!(sweep(&p).unwrap_err().contains("--bcast-bytes"));
    }

    #[test]
    fn radixes_are_sorted_once_each() {
        let mut p = params(64, 5_000);
        p.radixes = vec![8, 2, 8];
        let s = sweep(&p).unwrap();
        assert_eq!(
            s.rows.iter().map(|r| r.radix).collect::<Vec<_>>(),
            vec![2, 8]
        );
        assert_eq!(SweepParams::default_radixes(5000).last(), Some(&4096));
        assert_eq!(SweepParams::default_radixes(2), vec![2]);
    }
}
