//! `tbon daemon`: run one daemon of a DVM until told to stop.
//!
//! Rank and size come from flags or, for launchers, from their environment; rank 0's contact URI
//! from `--hnp` or a file rank 0 wrote with `--uri-file`.

use bytes::Bytes;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};
use tbon::config::Config;
use tbon::{Peer, StopReason};

/// The tag `--ping-all` uses.
const PING_TAG: u32 = 100;

#[derive(Debug, clap::Args)]
pub struct DaemonArgs {
    /// This daemon's rank. Falls back to TBON_RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMIX_RANK.
    #[arg(long)]
    pub rank: Option<u32>,
    /// The number of daemons in the DVM. Falls back to TBON_SIZE, SLURM_NTASKS,
    /// OMPI_COMM_WORLD_SIZE.
    #[arg(long)]
    pub size: Option<u32>,
    /// Rank 0's contact URI (required on every other rank unless --hnp-file is given).
    #[arg(long, env = "TBON_HNP")]
    pub hnp: Option<String>,
    /// Read rank 0's contact URI from this file, waiting for it to appear (up to the wire-up
    /// timeout).
    #[arg(long)]
    pub hnp_file: Option<PathBuf>,
    /// Rank 0: also write the contact URI to this file (atomically).
    #[arg(long)]
    pub uri_file: Option<PathBuf>,
    /// Self-test: once wired, send one message to every other daemon and print a line when one
    /// has arrived from every other daemon.
    #[arg(long)]
    pub ping_all: bool,
    /// Print one JSON line per repair of this daemon's tree to stdout (`{"fault": {...}}`, with a
    /// CLOCK_MONOTONIC `mono_ns` time stamp), for
    /// scripts and tests; the same is logged at info level in any case.
    #[arg(long)]
    pub print_faults: bool,
    #[command(flatten)]
    pub workload: super::workload::WorkloadArgs,
    #[command(flatten)]
    pub config: Config,
}

fn env_u32(names: &[&str]) -> Option<(String, u32)> {
    names.iter().find_map(|n| {
        std::env::var(n)
            .ok()
            .and_then(|v| v.trim().parse().ok().map(|x| (n.to_string(), x)))
    })
}

fn read_hnp_file(path: &Path, timeout: Duration) -> Result<String, String> {
    let deadline = Instant::now() + timeout;
    loop {
        match std::fs::read_to_string(path) {
            Ok(s) if !s.trim().is_empty() => return Ok(s.trim().to_string()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        }
        if Instant::now() >= deadline {
            return Err(format!("{} did not appear in time", path.display()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// Runs the daemon; returns the process exit code.
pub fn run(args: DaemonArgs) -> Result<i32, String> {
    let rank = match args.rank {
        Some(r) => r,
        None => {
            let (from, r) = env_u32(&[
                "TBON_RANK",
                "SLURM_PROCID",
                "OMPI_COMM_WORLD_RANK",
                "PMIX_RANK",
            ])
            .ok_or("no rank: pass --rank or run under a launcher that sets one")?;
            log::debug!("rank {r} from {from}");
            r
        }
    };
    let size = match args.size {
        Some(s) => s,
        None => {
            env_u32(&["TBON_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"])
                .ok_or("no size: pass --size or run under a launcher that sets one")?
                .1
        }
    };
    let hnp = match (&args.hnp, &args.hnp_file) {
        _ if rank == 0 => None,
        (Some(h), _) => Some(h.clone()),
        (None, Some(p)) => Some(read_hnp_file(
            p,
            Duration::from_millis(args.config.wireup_timeout_ms),
        )?),
        (None, None) => return Err("ranks other than 0 need --hnp or --hnp-file".into()),
    };
    let wireup_timeout = Duration::from_millis(args.config.wireup_timeout_ms);
    let daemon = tbon::start(args.config, rank, size, hnp.as_deref()).map_err(|e| e.to_string())?;
    log::info!(
        "rank {rank} of {size}: listening at {}",
        daemon.contact_uri()
    );
    if rank == 0 {
        println!("TBON_HNP_URI={}", daemon.contact_uri());
        if let Some(p) = &args.uri_file {
            write_atomically(p, daemon.contact_uri())
                .map_err(|e| format!("cannot write {}: {e}", p.display()))?;
        }
    }

    let term = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, term.clone()).map_err(|e| e.to_string())?;
    }

    if args.print_faults {
        daemon
            .on_fault(move |s| {
                let line = serde_json::json!({ "fault": {
                    "rank": rank,
                    "scope": match s.scope { tbon::Scope::Local => "local", tbon::Scope::Global => "global" },
                    "epoch": s.epoch,
                    "mono_ns": super::workload::mono_ns(),
                    "newly_failed": s.newly_failed,
                    "parent": s.new_parent,
                    "children": s.new_children,
                    "promoted": s.promoted,
                }});
                println!("{line}");
            })
            .map_err(|e| e.to_string())?;
    }

    if args.ping_all {
        let h = daemon.handle();
        let others = size.saturating_sub(1);
        let seen = Arc::new(AtomicU32::new(0));
        let counted = seen.clone();
        h.recv(Peer::Any, PING_TAG, true, move |m| {
            let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
            log::debug!("rank {rank}: ping from {} ({n}/{others})", m.origin);
            if n == others {
                println!("rank {rank}: all-to-all ok ({n} of {others})");
            }
        })
        .map_err(|e| e.to_string())?;
        if others == 0 {
            println!("rank {rank}: all-to-all ok (0 of 0)");
        }
        if !daemon.wait_wired(wireup_timeout * 2) {
            return Err("wire-up did not complete".into());
        }
        for dst in (0..size).filter(|d| *d != rank) {
            let msg = Bytes::from(format!("ping from {rank}"));
            if let Err(e) = h.send(dst, PING_TAG, msg) {
                log::warn!("rank {rank}: ping to {dst}: {e}");
            }
        }
    }

    let workload = super::workload::Workload::post(&args.workload, &daemon.handle())?;
    if let Some(w) = &workload {
        if !daemon.wait_wired(wireup_timeout * 2) {
            return Err("wire-up did not complete".into());
        }
        println!(
            "{}",
            serde_json::json!({"wired": {"rank": rank, "mono_ns": super::workload::mono_ns()}})
        );
        w.start_sending(&args.workload, daemon.handle());
    }

    let mut next_progress = Instant::now();
    let reason = loop {
        if let Some(w) = &workload
            && Instant::now() >= next_progress
        {
            println!("{}", w.progress_line(rank));
            next_progress = Instant::now() + Duration::from_millis(250);
        }
        if term.load(Ordering::SeqCst) {
            log::info!("rank {rank}: signal received, stopping");
            if rank == 0 {
                daemon.shutdown_dvm();
            } else {
                daemon.shutdown();
            }
        }
        if let Some(r) = daemon.wait_stopped(Duration::from_millis(100)) {
            break r;
        }
    };
    drop(daemon);
    if let Some(w) = &workload {
        w.write(rank)
            .map_err(|e| format!("cannot write the workload results: {e}"))?;
    }
    match reason {
        StopReason::Requested | StopReason::DvmShutdown => {
            log::info!("rank {rank}: stopped");
            Ok(0)
        }
        StopReason::Fatal(why) => {
            log::error!("rank {rank}: stopped: {why}");
            Ok(1)
        }
    }
}
