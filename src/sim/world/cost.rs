//! The cost model of `tbon sim --sweep-radix` (off in seeded runs, where inputs cost
//! nothing): a daemon's processor handles one input at a time and pays `frame_ns` for it and
//! again for every frame it sends; its network interface puts those frames on the wire one
//! after another at `bandwidth_mbps`. A frame leaves when its turn on the interface ends and
//! arrives a link latency later. With `cores` set, every daemon shares that many processors
//! (many daemons on one machine, as in the comparison with real runs); with 0, each daemon
//! has its own (one daemon per node).
//!
//! Without such costs a wider tree always wins, since only depth costs time; with them a
//! relay of radix k spends k frame costs on every message it forwards, which is the trade-off
//! the sweep measures.

use crate::Rank;

/// The costs the model charges.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Processor time per frame received or sent, nanoseconds.
    pub frame_ns: u64,
    /// Each daemon's sending bandwidth, megabytes (10^6 bytes) per second; at least 1.
    pub bandwidth_mbps: u64,
    /// Processors shared by every daemon; 0: one per daemon.
    pub cores: u32,
}

impl CostModel {
    /// Nanoseconds the interface takes to send `bytes`.
    fn wire_ns(&self, bytes: usize) -> u64 {
        // MB/s is bytes per microsecond: bytes * 1000 / mbps nanoseconds.
        (bytes as u64).saturating_mul(1000) / self.bandwidth_mbps.max(1)
    }
}

/// The processors' state during a run.
#[derive(Debug)]
pub(super) struct Cpus {
    model: CostModel,
    /// When each processor is free next, nanoseconds of virtual time.
    free_ns: Vec<u64>,
    /// When each daemon is done with its last input (a daemon is one thread: with shared
    /// processors it still handles one input at a time).
    daemon_free_ns: Vec<u64>,
    /// The input being handled: its daemon, its processor, and when its processor's work so
    /// far ends (the next frame it sends leaves then).
    busy: Option<(Rank, usize, u64)>,
}

impl Cpus {
    pub(super) fn new(model: CostModel, size: u32) -> Cpus {
        let n = if model.cores == 0 { size } else { model.cores };
        Cpus {
            model,
            free_ns: vec![0; n.max(1) as usize],
            daemon_free_ns: vec![0; size as usize],
            busy: None,
        }
    }

    /// The processor that would handle `r`'s next input, and when it is free (µs, rounded
    /// up): the input waits until then.
    pub(super) fn free_at_us(&self, r: Rank) -> u64 {
        let (_, ns) = self.pick(r);
        ns.div_ceil(1000)
    }

    fn pick(&self, r: Rank) -> (usize, u64) {
        let own = self.daemon_free_ns.get(r as usize).copied().unwrap_or(0);
        if self.model.cores == 0 {
            let i = r as usize;
            return (i, self.free_ns.get(i).copied().unwrap_or(0).max(own));
        }
        // The processor free first; ties to the lowest index, so runs are deterministic.
        let (i, ns) = self
            .free_ns
            .iter()
            .copied()
            .enumerate()
            .min_by_key(|&(i, ns)| (ns, i))
            .unwrap_or((0, 0));
        (i, ns.max(own))
    }

    /// `r` starts handling an input at `now_us`: its processor pays for the input.
    pub(super) fn begin(&mut self, r: Rank, now_us: u64) {
        let (i, free) = self.pick(r);
        let start = free.max(now_us.saturating_mul(1000));
        self.busy = Some((r, i, start.saturating_add(self.model.frame_ns)));
    }

    /// `from` sends a frame of `bytes` during its input: when it leaves (µs), or `None` if
    /// no input of `from` is being handled (the frame leaves at once).
    pub(super) fn send(&mut self, from: Rank, bytes: usize) -> Option<u64> {
        let (r, _, ns) = self.busy.as_mut()?;
        if *r != from {
            return None;
        }
        *ns = ns
            .saturating_add(self.model.frame_ns)
            .saturating_add(self.model.wire_ns(bytes));
        Some(ns.div_ceil(1000))
    }

    /// The input is handled: its processor is busy until its last frame left.
    pub(super) fn end(&mut self) {
        if let Some((r, i, ns)) = self.busy.take() {
            if let Some(f) = self.free_ns.get_mut(i) {
                *f = ns;
            }
            if let Some(f) = self.daemon_free_ns.get_mut(r as usize) {
                *f = ns;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODEL: CostModel = CostModel {
        frame_ns: 2_000,
        bandwidth_mbps: 1_000,
        cores: 0,
    };

    #[test]
    fn frames_leave_one_after_another() {
        let mut c = Cpus::new(MODEL, 4);
        c.begin(1, 10);
        // 10 µs + 2 µs for the input; each 1000-byte frame: 2 µs of processor, 1 µs of wire.
        assert_eq!(c.send(1, 1000), Some(15));
        assert_eq!(c.send(1, 1000), Some(18));
        assert_eq!(
            c.send(2, 1000),
            None,
            "another daemon's frame is not charged here"
        );
        c.end();
        assert_eq!(c.free_at_us(1), 18);
        assert_eq!(c.free_at_us(2), 0);
    }

    #[test]
    fn shared_cores_serve_everyone() {
        let mut c = Cpus::new(CostModel { cores: 1, ..MODEL }, 4);
        c.begin(1, 0);
        c.end();
        // Daemon 3 waits for the one processor daemon 1 used.
        assert_eq!(c.free_at_us(3), 2);
        c.begin(3, 0);
        assert_eq!(c.send(3, 0), Some(6));
        c.end();
        assert_eq!(c.free_at_us(1), 6);
    }

    #[test]
    fn a_daemon_uses_one_processor_at_a_time() {
        // As many shared processors as daemons behave as one each.
        let mut c = Cpus::new(CostModel { cores: 4, ..MODEL }, 4);
        c.begin(1, 0);
        assert_eq!(c.send(1, 0), Some(4));
        c.end();
        // Three processors are free, but daemon 1 is not until 4 µs.
        assert_eq!(c.free_at_us(1), 4);
        assert_eq!(c.free_at_us(2), 0);
    }
}
