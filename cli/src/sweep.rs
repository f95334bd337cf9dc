//! `tbon sim --sweep-radix`: each radix's wire-up, broadcast, allgather and repair times for
//! one DVM size under a latency, bandwidth and processor-cost model (`tbon::sim::sweep`), as
//! a table or JSON, and the radix it recommends.
use clap::Args;
use tbon::sim::sweep::{Sweep, SweepParams, sweep};

/// The sweep's flags (part of `tbon sim`).
#[derive(Debug, Args)]
pub struct SweepArgs {
    /// Compare radixes for one DVM size (--daemons, default 1024) instead of running seeds:
    /// wire-up, broadcast, allgather and repair times per radix under the model below, and the
    /// radix recommended (docs/radix.md).
    #[arg(long, conflicts_with_all = ["seed", "seeds", "first", "fail_fast", "radix", "faults", "messages"])]
    pub sweep_radix: bool,
    /// Sweep: the radixes to compare (comma-separated; default powers of two below the size).
    #[arg(long, value_delimiter = ',')]
    pub radixes: Vec<u32>,
    /// Sweep: one-way link latency in microseconds [default: 20].
    #[arg(long)]
    pub latency_us: Option<u64>,
    /// Sweep: processor time per frame received or sent, in nanoseconds [default: 5000].
    #[arg(long)]
    pub frame_ns: Option<u64>,
    /// Sweep: each daemon's sending bandwidth in MB/s [default: 10000].
    #[arg(long)]
    pub bandwidth_mbps: Option<u64>,
    /// Sweep: processors all daemons share (0: one per daemon, as on a cluster; this
    /// machine's count to model a test on one host) [default: 0].
    #[arg(long)]
    pub cores: Option<u32>,
    /// Sweep: the timed broadcast's payload in bytes [default: 64].
    #[arg(long)]
    pub bcast_bytes: Option<usize>,
    /// Sweep: bytes per contact-table entry (wire-up's table is daemons x this) [default: 40].
    #[arg(long)]
    pub uri_bytes: Option<usize>,
    /// Sweep: text (a table) or json [default: text].
    #[arg(long, value_parser = ["text", "json"])]
    pub format: Option<String>,
}

/// The default DVM size of a sweep.
const SWEEP_DAEMONS_DEFAULT: u32 = 1024;

/// Runs the sweep; exit code 0, or an error (bad flags, or a protocol rule broken in one of
/// the simulated runs).
/// `bcast_part_bytes` is `tbon sim`'s own flag (one flag for both uses: clap gives a value to
/// only one of two fields of the same name, and the sweep's never got it).
pub fn run(
    args: &SweepArgs,
    daemons: Option<u32>,
    bcast_part_bytes: Option<usize>,
) -> Result<i32, String> {
    let size = daemons.unwrap_or(SWEEP_DAEMONS_DEFAULT);
    let radixes = if args.radixes.is_empty() {
        SweepParams::default_radixes(size)
    } else {
        args.radixes.clone()
    };
    let p = SweepParams {
        size,
        radixes,
        latency_us: args.latency_us.unwrap_or(20),
        frame_ns: args.frame_ns.unwrap_or(5_000),
        bandwidth_mbps: args.bandwidth_mbps.unwrap_or(10_000),
        cores: args.cores.unwrap_or(0),
        bcast_bytes: args.bcast_bytes.unwrap_or(64),
        bcast_part_bytes: bcast_part_bytes.unwrap_or(tbon::limits::XCAST_PART_BYTES_DEFAULT),
        uri_bytes: args.uri_bytes.unwrap_or(40),
    };
    let s = sweep(&p)?;
    if args.format.as_deref() == Some("json") {
        let text = serde_json::to_string_pretty(&s).map_err(|e| e.to_string())?;
        println!("{text}");
    } else {
        print_table(&s);
    }
    Ok(0)
}

fn ms(us: u64) -> String {
    format!("{:.3}", us as f64 / 1000.0)
}

fn print_table(s: &Sweep) {
    let p = &s.params;
    let cores = match p.cores {
        0 => "one processor per daemon".to_string(),
        1 => "1 processor shared".to_string(),
        c => format!("{c} processors shared"),
    };
    println!(
        "radix sweep: {} daemons; latency {} us, {} ns a frame, {} MB/s, {cores}; \
         broadcast of {} B ({}), contacts of {} B (times in ms of virtual time)",
        p.size,
        p.latency_us,
        p.frame_ns,
        p.bandwidth_mbps,
        p.bcast_bytes,
        match p.bcast_part_bytes {
            0 => "whole at each level".to_string(),
            n => format!("in parts of {n} B"),
        },
        p.uri_bytes
    );
    println!(
        "{:>6} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "radix", "depth", "wire-up", "(sim.)", "broadcast", "allgather", "repair", "worst"
    );
    for r in &s.rows {
        let mark = if r.radix == s.recommended {
            "  <- recommended"
        } else {
            ""
        };
        println!(
            "{:>6} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9.2}x{mark}",
            r.radix,
            r.depth,
            ms(r.wireup_us),
            ms(r.protocol_us),
            ms(r.bcast_us),
            ms(r.allgather_us),
            ms(r.repair_us),
            r.worst_ratio
        );
    }
    println!(
        "recommended radix: {} (the smallest worst ratio to the best radix over the four times)",
        s.recommended
    );
}

/// The sweep's flags given without `--sweep-radix`: an error, not flags silently ignored.
/// (Checked here: clap counts the `--sweep-radix` flag's default as present for `requires`.)
pub fn check_unused(args: &SweepArgs) -> Result<(), String> {
    let given = !args.radixes.is_empty()
        || args.latency_us.is_some()
        || args.frame_ns.is_some()
        || args.bandwidth_mbps.is_some()
        || args.cores.is_some()
        || args.bcast_bytes.is_some()
        || args.uri_bytes.is_some()
        || args.format.is_some();
    if !args.sweep_radix && given {
        return Err(
            "--radixes, --latency-us, --frame-ns, --bandwidth-mbps, --cores, \
             --bcast-bytes, --uri-bytes and --format belong to \
             --sweep-radix"
                .into(),
        );
    }
    Ok(())
}
