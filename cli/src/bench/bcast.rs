//! `tbon bench --only bcast`: a large broadcast's time against the tree's depth, pipelined in
//! parts (`bcast_part_bytes`, the default) and stored and forwarded whole at each level
//! (`bcast_part_bytes = 0`, as PRRTE does), beside the time of one hop of the same payload (a
//! DVM of two). Issue "Performance": a 1 MiB broadcast to 64 daemons at radix 4 against one
//! 1 MiB hop.
//!
//! Every daemon is its own process on this one machine, so the daemons share its cores: the
//! broadcast's copies (one per daemon below rank 0) compete for them, which a cluster with a
//! daemon per node does not have. `tbon sim --sweep-radix --bcast-bytes` gives the same
//! protocol's time under a model with a processor per daemon (docs/radix.md).

use super::roles::{self, TAG_BCAST, print_line};
use super::util::{Res, ctx, quantile_us, wait_file};
use super::{Bench, RoleArgs, loadavg};
use bytes::Bytes;
use serde_json::{Value, json};
use std::io::Write;
use std::time::{Duration, Instant};
use tbon::Peer;

const GUARD: Duration = Duration::from_secs(120);
/// The broadcast's payload.
const PAYLOAD_BYTES: usize = 1 << 20;
/// The radix of the measured trees.
const RADIX: u32 = 4;
/// DVM sizes: the smallest of depth 1, 2 and 3 at radix 4, and the 64.
const SIZES: [u32; 4] = [2, 6, 22, 64];

/// 31's inverse modulo 256.
const INV_31: u8 = 223;

/// The bytes every broadcast's payload is a window of: byte `j` is `31 j` (mod 256).
fn base() -> Vec<u8> {
    (0..PAYLOAD_BYTES + 256)
        .map(|j| (j as u64).wrapping_mul(31) as u8)
        .collect()
}

/// Broadcast `n`'s payload: `base` from `n mod 256` on, so its first byte tells `n mod 256`
/// (times 31) and a receiver checks it all with one comparison (the check must cost far
/// less than the broadcast it follows: 64 daemons share two cores here).
fn payload(base: &[u8], n: u64) -> Bytes {
    let at = (n % 256) as usize;
    Bytes::copy_from_slice(base.get(at..at + PAYLOAD_BYTES).unwrap_or(&[]))
}

/// Whether `p` is a broadcast's payload.
fn is_payload(base: &[u8], p: &[u8]) -> bool {
    let at = usize::from(p.first().copied().unwrap_or(0).wrapping_mul(INV_31));
    p.len() == PAYLOAD_BYTES && base.get(at..at + PAYLOAD_BYTES) == Some(p)
}

/// One daemon of the measurement. Every daemon checks each broadcast's bytes (a wrong one is
/// written to `<dir>/bad-<rank>`), appends its rank to `<dir>/wired` once wired, and waits
/// to be stopped; rank 0 waits for `<dir>/go`, broadcasts once untimed, then times `count`
/// broadcasts one after the other from the call to the completion (every living daemon
/// delivered it), prints the JSON report and stops the DVM.
pub fn role(a: &RoleArgs) -> Res<()> {
    let d = roles::start(a, a.radix.max(2))?;
    let dir = a.dir.clone();
    let rank = a.rank;
    let base = std::sync::Arc::new(base());
    let check = base.clone();
    d.recv(
        Peer::Any,
        TAG_BCAST,
        tbon::RecvMode::Persistent,
        move |m: tbon::Message| {
            if !is_payload(&check, &m.payload) {
                let _ = std::fs::write(dir.join(format!("bad-{rank}")), "bad payload");
            }
        },
    )
    .map_err(ctx("post broadcast receive"))?;
    if !d.wait_wired(GUARD) {
        return Err("not wired".into());
    }
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(a.dir.join("wired"))
        .map_err(ctx("open wired"))?;
    f.write_all(format!("{}\n", a.rank).as_bytes())
        .map_err(ctx("write wired"))?;
    drop(f);
    if a.rank != 0 {
        d.wait_stopped(GUARD);
        return Ok(());
    }
    wait_file(&a.dir.join("go"), GUARD)?;
    let mut times = Vec::new();
    for n in 0..=a.count {
        let p = payload(&base, n);
        let (tx, rx) = crossbeam_channel::bounded(1);
        let t = Instant::now();
        d.broadcast_with(TAG_BCAST, p, move |r| {
            let _ = tx.send(r);
        })
        .map_err(ctx("broadcast"))?;
        rx.recv_timeout(GUARD)
            .map_err(ctx("broadcast completion"))?
            .map_err(ctx("broadcast"))?;
        if n > 0 {
            times.push(t.elapsed());
        }
    }
    print_line(
        &json!({
            "p50_us": quantile_us(&mut times, 0.5),
            "min_us": quantile_us(&mut times, 0.0),
            "p99_us": quantile_us(&mut times, 0.99),
        })
        .to_string(),
    );
    d.shutdown_dvm();
    Ok(())
}

/// The depth of the deepest daemon in a tree of `size` at `radix`.
fn depth(size: u32, radix: u32) -> u32 {
    let (mut depth, mut level, mut placed) = (0u32, 1u64, 1u64);
    while placed < u64::from(size) {
        level = level.saturating_mul(u64::from(radix));
        placed = placed.saturating_add(level);
        depth += 1;
    }
    depth
}

impl Bench {
    /// One DVM of `size` daemons; rank 0's `bcast_part_bytes` is `part_bytes` (`None`: the
    /// default). Returns rank 0's report.
    fn bcast_one(&mut self, size: u32, part_bytes: Option<usize>) -> Res<Value> {
        let dir = self.fresh_dir()?;
        let count = if self.quick { 10 } else { 30 };
        let mut kids = Vec::new();
        for rank in 0..size {
            let a = RoleArgs {
                role: Some("bcast".into()),
                rank,
                size,
                count,
                dir: dir.clone(),
                radix: RADIX,
                bcast_part_bytes: part_bytes,
                ..RoleArgs::default()
            };
            kids.push(self.spawn(&a, rank == 0)?);
        }
        let deadline = Instant::now() + GUARD;
        while std::fs::read_to_string(dir.join("wired"))
            .unwrap_or_default()
            .lines()
            .count()
            < size as usize
        {
            if Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        super::util::write_atomically(&dir.join("go"), "go")?;
        let report = self.collect(kids, 0)?;
        let bad: Vec<String> = std::fs::read_dir(&dir)
            .map_err(ctx("read run dir"))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("bad-"))
            .collect();
        if !bad.is_empty() {
            return Err(format!(
                "broadcast of {size}: wrong payloads delivered ({})",
                bad.join(", ")
            ));
        }
        Ok(report)
    }

    /// The rows: per size, pipelined and whole, and each against the two-daemon DVM's time
    /// (one hop) of the same mode.
    pub(super) fn bcasts(&mut self) -> Res<Value> {
        let mut rows = Vec::new();
        let mut hop: [Option<f64>; 2] = [None, None];
        for size in SIZES {
            let mut row = json!({
                "daemons": size,
                "radix": RADIX,
                "depth": depth(size, RADIX),
                "payload": PAYLOAD_BYTES,
                "load": loadavg(),
            });
            for (i, (key, part)) in [("pipelined", None), ("whole", Some(0))]
                .into_iter()
                .enumerate()
            {
                let r = self.bcast_one(size, part)?;
                let p50 = r["p50_us"].as_f64().unwrap_or(0.0);
                if size == 2 {
                    hop[i] = Some(p50);
                }
                row[format!("{key}_p50_us")] = json!(p50);
                row[format!("{key}_min_us")] = r["min_us"].clone();
                if let Some(h) = hop[i].filter(|h| *h > 0.0) {
                    row[format!("{key}_vs_hop")] = json!(p50 / h);
                }
            }
            eprintln!("{row}");
            rows.push(row);
        }
        Ok(Value::Array(rows))
    }
}

/// The text table.
pub(super) fn print(rows: &[Value]) {
    println!(
        "\n| broadcast of 1 MiB: daemons | depth (radix 4) | pipelined p50 ms | x one hop | whole at each level (PRRTE) p50 ms | x one hop | whole/pipelined |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in rows {
        let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
        println!(
            "| {} | {} | {:.2} | {:.2}x | {:.2} | {:.2}x | {:.2}x |",
            r["daemons"],
            r["depth"],
            f("pipelined_p50_us") / 1e3,
            f("pipelined_vs_hop"),
            f("whole_p50_us") / 1e3,
            f("whole_vs_hop"),
            f("whole_p50_us") / f("pipelined_p50_us").max(1e-9),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::{base, depth, is_payload, payload};

    #[test]
    fn depths_of_the_measured_trees() {
        assert_eq!(
            [2, 5, 6, 21, 22, 64, 85, 86].map(|n| depth(n, 4)),
            [1, 1, 2, 2, 3, 3, 3, 4]
        );
    }

    #[test]
    fn every_payload_is_recognised_and_a_changed_byte_is_not() {
        let base = base();
        for n in [0, 1, 255, 256, 1000] {
            let p = payload(&base, n);
            assert!(is_payload(&base, &p), "{n}");
            let mut bad = p.to_vec();
            bad[777] ^= 1;
            assert!(!is_payload(&base, &bad));
            assert!(!is_payload(&base, &p[1..]));
        }
    }
}
