//! `tbon clock`: every daemon's wall-clock offset from the daemon asked (rank 0 for the whole
//! DVM), with an error bound, measured along the tree by a status query's own timestamps
//! (`tbon::status`: NTP's four timestamps per hop, offsets and bounds added up the path).
use std::fmt::Write as _;
use std::io::Write as _;

use clap::{Args, ValueEnum};
use serde::Serialize;
use tbon::status::Part;

use super::status::{ContactArgs, contact, credential};

/// Arguments of `tbon clock`.
#[derive(Debug, Args)]
pub struct ClockArgs {
    #[command(flatten)]
    pub contact: ContactArgs,
    /// How long the daemons may take to answer.
    #[arg(long, default_value_t = tbon::limits::STATUS_BUDGET_MS_DEFAULT)]
    pub budget_ms: u32,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

/// How `tbon clock` renders the offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// One line per daemon: rank, offset, bound.
    Text,
    /// One JSON object: the gathering rank and every daemon's offset and bound in ns.
    Json,
}

#[derive(Serialize)]
struct Offset {
    rank: u32,
    /// This daemon's wall clock minus the gathering daemon's (ns); the true offset lies
    /// within `offset_ns` ± `bound_ns`.
    offset_ns: i64,
    bound_ns: u64,
}

#[derive(Serialize)]
struct JsonClock {
    from: u32,
    size: u32,
    offsets: Vec<Offset>,
    /// Daemons that answered without an offset (a hop on their path had no sample).
    unmeasured: Vec<u32>,
    /// Ranks with no answer at all (dead, silent, or below a silent daemon).
    missing: Vec<u32>,
}

/// Runs `tbon clock`: exit 0 when every living daemon was measured, 1 when some were not.
pub fn run(args: ClockArgs) -> Result<i32, String> {
    let contact = contact(&args.contact)?;
    let credential = credential(&args.contact)?;
    let options = args.contact.options(args.budget_ms, true)?;
    let report = tbon::status::query(&contact, &credential, &options).map_err(|e| {
        format!(
            "{}: {e}",
            contact
                .addrs
                .first()
                .map_or_else(String::new, |a| a.to_string())
        )
    })?;
    let mut offsets = Vec::new();
    let mut unmeasured = Vec::new();
    for p in &report.parts {
        if let Part::Daemon(d) = p {
            match (d.clock_offset_ns, d.clock_bound_ns) {
                (Some(offset_ns), Some(bound_ns)) => offsets.push(Offset {
                    rank: d.rank,
                    offset_ns,
                    bound_ns,
                }),
                _ => unmeasured.push(d.rank),
            }
        }
    }
    offsets.sort_by_key(|o| o.rank);
    offsets.dedup_by_key(|o| o.rank);
    unmeasured.sort_unstable();
    let seen: Vec<u32> = offsets
        .iter()
        .map(|o| o.rank)
        .chain(unmeasured.iter().copied())
        .collect();
    let missing: Vec<u32> = (0..report.size)
        .filter(|r| !seen.contains(r) && !report.failed.contains(r))
        .collect();
    let complete = unmeasured.is_empty() && missing.is_empty() && !report.truncated;
    let out = match args.format {
        Format::Json => {
            let j = JsonClock {
                from: report.from,
                size: report.size,
                offsets,
                unmeasured,
                missing,
            };
            let mut s = serde_json::to_string(&j).map_err(|e| e.to_string())?;
            s.push('\n');
            s
        }
        Format::Text => {
            let mut s = String::new();
            let worst = offsets
                .iter()
                .map(|o| o.offset_ns.unsigned_abs())
                .max()
                .unwrap_or(0);
            let widest = offsets.iter().map(|o| o.bound_ns).max().unwrap_or(0);
            let _ = writeln!(
                s,
                "clock offsets from rank {} ({} daemons measured; largest offset {}, widest bound ±{})",
                report.from,
                offsets.len(),
                human(worst as i128),
                human(i128::from(widest))
            );
            for o in &offsets {
                let _ = writeln!(
                    s,
                    "{:>6}  {:>14} ± {}",
                    o.rank,
                    human(i128::from(o.offset_ns)),
                    human(i128::from(o.bound_ns))
                );
            }
            if !unmeasured.is_empty() {
                let _ = writeln!(s, "answered without a clock sample: {unmeasured:?}");
            }
            if !missing.is_empty() {
                let _ = writeln!(s, "no answer (see `tbon status`): {missing:?}");
            }
            if report.truncated {
                let _ = writeln!(s, "(some daemons were left out to keep the answer bounded)");
            }
            s
        }
    };
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(out.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            return Err(format!("writing: {e}"));
        }
        _ => {}
    }
    Ok(if complete { 0 } else { 1 })
}

/// A signed duration in ns, in the unit that keeps it readable.
fn human(ns: i128) -> String {
    let a = ns.unsigned_abs();
    if a < 10_000 {
        format!("{ns} ns")
    } else if a < 10_000_000 {
        format!("{:.1} us", ns as f64 / 1e3)
    } else if a < 10_000_000_000 {
        format!("{:.1} ms", ns as f64 / 1e6)
    } else {
        format!("{:.3} s", ns as f64 / 1e9)
    }
}
