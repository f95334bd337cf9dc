//! The harness run as a time series: deliveries and latency percentiles per 100 ms bin, and
//! a latency histogram per mode on log-spaced buckets. It lands in `--json` (`timeline`,
//! `latency_histogram`) and is what `--report` draws.

use super::super::workload::{TAG_BCAST, TAG_RELIABLE};

/// Width of one bin of the timeline.
pub const BIN_MS: u64 = 100;
/// Histogram buckets per decade of latency, from `HISTOGRAM_FROM_MS`.
const BUCKETS_PER_DECADE: u32 = 4;
/// The lower edge of the first histogram bucket (10 µs; anything faster lands in it).
const HISTOGRAM_FROM_MS: f64 = 0.01;
/// Buckets in all: 10 µs to 1,000 s; anything slower lands in the last.
const BUCKETS: usize = 8 * BUCKETS_PER_DECADE as usize;
/// The most bins a run keeps (an hour of 100 ms bins): later deliveries land in the last.
const BINS_MAX: usize = 36_000;

/// One mode's deliveries, by kind of message.
#[derive(Clone, Copy)]
enum Mode {
    Plain = 0,
    Reliable = 1,
    Broadcast = 2,
}

const MODES: [(Mode, &str); 3] = [
    (Mode::Plain, "plain"),
    (Mode::Reliable, "reliable"),
    (Mode::Broadcast, "broadcast"),
];

#[derive(Default, Clone)]
struct Bin {
    delivered: [u64; 3],
    latencies_ns: Vec<u64>,
}

/// Deliveries gathered for the time series; time 0 is `origin_ns` (every daemon wired).
pub struct Timeline {
    origin_ns: u64,
    bins: Vec<Bin>,
    histogram: [[u64; BUCKETS]; 3],
}

impl Timeline {
    pub fn new(origin_ns: u64) -> Timeline {
        Timeline {
            origin_ns,
            bins: Vec::new(),
            histogram: [[0; BUCKETS]; 3],
        }
    }

    /// A message with `tag` delivered at `recv_ns` (CLOCK_MONOTONIC), `latency_ns` after it
    /// was sent.
    pub fn add(&mut self, tag: u32, recv_ns: u64, latency_ns: u64) {
        let mode = match tag {
            TAG_RELIABLE => Mode::Reliable,
            TAG_BCAST => Mode::Broadcast,
            _ => Mode::Plain,
        } as usize;
        let i = (recv_ns.saturating_sub(self.origin_ns) / (BIN_MS * 1_000_000)) as usize;
        let i = i.min(BINS_MAX - 1);
        if self.bins.len() <= i {
            self.bins.resize(i + 1, Bin::default());
        }
        if let Some(b) = self.bins.get_mut(i) {
            b.delivered[mode] += 1;
            b.latencies_ns.push(latency_ns);
        }
        if let Some(h) = self.histogram.get_mut(mode)
            && let Some(slot) = h.get_mut(bucket(latency_ns))
        {
            *slot += 1;
        }
    }

    /// `timeline`: `bin_ms`, then one entry per bin from time 0 (`t_s`, deliveries by mode,
    /// latency p50 and p99 in ms, null in a bin without deliveries).
    pub fn json(&mut self) -> serde_json::Value {
        let bins: Vec<serde_json::Value> = self
            .bins
            .iter_mut()
            .enumerate()
            .map(|(i, b)| {
                b.latencies_ns.sort_unstable();
                let pct = |p: f64| {
                    (!b.latencies_ns.is_empty())
                        .then(|| super::check::percentile(&b.latencies_ns, p) as f64 / 1e6)
                };
                let mut o = serde_json::json!({
                    "t_s": (i as u64 * BIN_MS) as f64 / 1e3,
                    "delivered": b.delivered.iter().sum::<u64>(),
                    "p50_ms": pct(0.5),
                    "p99_ms": pct(0.99),
                });
                for (m, name) in MODES {
                    o[name] = b.delivered[m as usize].into();
                }
                o
            })
            .collect();
        serde_json::json!({ "bin_ms": BIN_MS, "bins": bins })
    }

    /// `latency_histogram`: the buckets' lower edges in ms (log-spaced, four per decade from
    /// 10 µs) and each mode's counts per bucket.
    pub fn histogram_json(&self) -> serde_json::Value {
        let edges: Vec<f64> = (0..BUCKETS).map(edge_ms).collect();
        let mut o = serde_json::json!({ "bucket_from_ms": edges });
        for (m, name) in MODES {
            o[name] = self.histogram[m as usize].to_vec().into();
        }
        o
    }
}

/// The lower edge of bucket `i`, in ms.
fn edge_ms(i: usize) -> f64 {
    HISTOGRAM_FROM_MS * 10f64.powf(i as f64 / f64::from(BUCKETS_PER_DECADE))
}

/// The bucket of a latency.
fn bucket(latency_ns: u64) -> usize {
    let ms = latency_ns as f64 / 1e6;
    if ms <= HISTOGRAM_FROM_MS {
        return 0;
    }
    let i = ((ms / HISTOGRAM_FROM_MS).log10() * f64::from(BUCKETS_PER_DECADE)).floor() as usize;
    i.min(BUCKETS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deliveries_land_in_their_bin_and_bucket() {
        let mut t = Timeline::new(1_000);
        t.add(0, 1_000 + 50_000_000, 2_000_000);
        t.add(TAG_RELIABLE, 1_000 + 250_000_000, 20_000);
        t.add(TAG_BCAST, 1_000 + 250_000_000, 40_000);
        let j = t.json();
        let bins = j["bins"].as_array().unwrap();
        assert_eq!(bins.len(), 3);
        assert_eq!(bins[0]["plain"], 1);
        assert_eq!(bins[1]["delivered"], 0);
        assert!(bins[1]["p50_ms"].is_null());
        assert_eq!(bins[2]["reliable"], 1);
        assert_eq!(bins[2]["broadcast"], 1);
        assert_eq!(bins[2]["t_s"], 0.2);
        let h = t.histogram_json();
        // 2 ms: 2.3 decades above 10 µs, bucket 9 (its edge 1.78 ms).
        assert_eq!(h["plain"][9], 1);
        assert_eq!(bucket(1), 0);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        assert!((edge_ms(4) - 0.1).abs() < 1e-9);
    }
}
