//! `tbon daemon`: run one daemon of a DVM until told to stop.
//!
//! Rank and size come from flags or, for launchers, from their environment; rank 0's contact URI
//! from `--hnp` or a file rank 0 wrote with `--uri-file`.

use bytes::Bytes;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tbon::driver::uri_file;
use tbon::launch::{Placement, Rendezvous, launch};
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
    /// No shared filesystem: rank 0's host and port, NAME:PORT (an IPv6 address in brackets).
    /// Rank 0 listens on PORT (whatever --port says); every other rank waits up to the wire-up
    /// timeout for it to listen, then dials it.
    #[arg(long, env = "TBON_HNP_HOST", conflicts_with_all = ["hnp", "hnp_file", "uri_file"])]
    pub hnp_host: Option<String>,
    /// Self-test: once wired, send one message to every other daemon (and to each daemon that
    /// joins or rejoins later), and print a line when one has arrived from every other rank of
    /// the size.
    #[arg(long)]
    pub ping_all: bool,
    /// Print one JSON line per repair of this daemon's tree to stdout (`{"fault": {...}}`, with a
    /// CLOCK_MONOTONIC `mono_ns` time stamp), for
    /// scripts and tests; the same is logged at info level in any case.
    #[arg(long)]
    pub print_faults: bool,
    /// Open this job for client processes (repeatable; needs --client-socket): with the key
    /// of --client-key-file, or else a fresh one. Prints one JSON line per job
    /// (`{"client_job": {...}}`: rank, job, socket, and the key unless it came from a file).
    #[arg(long, value_name = "JOB")]
    pub client_job: Vec<u64>,
    /// A file holding the client key of every --client-job (64 hexadecimal digits, as
    /// `tbon keygen FILE` writes), so a launcher gives every daemon of a job the same key.
    #[arg(long, value_name = "FILE", requires = "client_job")]
    pub client_key_file: Option<PathBuf>,
    #[command(flatten)]
    pub workload: super::workload::WorkloadArgs,
    #[command(flatten)]
    pub settings: crate::settings::SettingFlags,
}

/// Waits up to `timeout` (or until a signal) for the URI file to hold something else than
/// `used`: a new rank 0 wrote it. Returns its text and URI.
fn wait_replaced(
    path: &Path,
    used: &str,
    timeout: Duration,
    term: &AtomicBool,
) -> Option<(String, String)> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline && !term.load(Ordering::SeqCst) {
        if let Ok(text) = std::fs::read_to_string(path)
            && text != used
            && let Some(uri) = uri_file::uri_of(&text).map(str::to_string)
        {
            return Some((text, uri));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// The environment variable that counts this daemon's starts past a replaced URI file (set on
/// the `exec` below, not meant for users).
const URI_FILE_RETRY_ENV: &str = "TBON_URI_FILE_RETRY";

/// This daemon could not reach the rank 0 its URI file names, and never joined. A file left by
/// an earlier run names a rank 0 that is gone; under a launcher that starts every task at once,
/// this daemon may have read it just before the new rank 0 replaced it. So wait (up to the
/// wire-up timeout) for the file to change, and if it does, start again as a fresh process (the
/// same pid, as launchers expect: `exec`) that reads the new file; if it does not, say that it
/// is stale. Returns the exit code.
fn follow_uri_file(
    rank: u32,
    path: &Path,
    used: &str,
    timeout: Duration,
    term: &AtomicBool,
) -> Result<i32, String> {
    let retries: u32 = std::env::var(URI_FILE_RETRY_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if retries >= tbon::limits::URI_FILE_RETRIES_MAX {
        return Ok(stale_uri_file(
            rank,
            path,
            used,
            "kept naming unreachable ranks 0",
        ));
    }
    log::warn!(
        "rank {rank}: {} names a rank 0 that cannot be reached: the file is stale (written by \
         a rank 0 that is gone) unless a new rank 0 replaces it; waiting up to the wire-up \
         timeout for that",
        path.display()
    );
    match wait_replaced(path, used, timeout, term) {
        Some((_, uri)) => {
            log::info!(
                "rank {rank}: {} was replaced by a new rank 0 (at {uri}); starting again",
                path.display()
            );
            use std::os::unix::process::CommandExt;
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            let err = std::process::Command::new(exe)
                .args(std::env::args_os().skip(1))
                .env(URI_FILE_RETRY_ENV, (retries + 1).to_string())
                .exec();
            Err(format!("cannot start again: {err}"))
        }
        None if term.load(Ordering::SeqCst) => Ok(0),
        None => Ok(stale_uri_file(rank, path, used, "was not replaced in time")),
    }
}

/// Says that the URI file is stale; the exit code (1, as for any rank 0 unreachable at start).
fn stale_uri_file(rank: u32, path: &Path, used: &str, what: &str) -> i32 {
    log::error!(
        "rank {rank}: the URI file {} is stale: it names rank 0 at {}, which cannot be reached, \
         and {what} (written by a rank 0 that is gone, or rank 0 is unreachable from here); \
         remove the file before the launch",
        path.display(),
        uri_file::uri_of(used).unwrap_or("?"),
    );
    1
}

/// How waiting for wire-up ended.
enum Wireup {
    Wired,
    /// SIGTERM or SIGINT came first.
    Signal,
    /// The daemon stopped (the main loop reports why).
    Stopped,
}

/// Waits for wire-up, but not past a SIGTERM/SIGINT or the daemon's stop; an error if the time
/// ran out.
fn wait_wired(
    daemon: &tbon::Daemon,
    term: &AtomicBool,
    timeout: Duration,
) -> Result<Wireup, String> {
    let deadline = Instant::now() + timeout;
    loop {
        if term.load(Ordering::SeqCst) {
            return Ok(Wireup::Signal);
        }
        // A quarter second between looks at the signal flag: thousands of daemons waiting on
        // one machine wake that often each.
        if daemon.wait_wired(Duration::from_millis(250)) {
            return Ok(Wireup::Wired);
        }
        if daemon.wait_stopped(Duration::ZERO).is_some() {
            return Ok(Wireup::Stopped);
        }
        if Instant::now() >= deadline {
            return Err("wire-up did not complete".into());
        }
    }
}

/// A signal arrived before wire-up completed: stop this daemon (rank 0 stops the DVM, which
/// before wire-up is only itself) and exit 0.
fn stop_on_signal(rank: u32, daemon: tbon::Daemon) -> Result<i32, String> {
    log::info!("rank {rank}: signal received during wire-up, stopping");
    if rank == 0 {
        daemon.shutdown_dvm();
    } else {
        daemon.shutdown();
    }
    Ok(0)
}

/// Runs the daemon; returns the process exit code.
pub fn run(args: DaemonArgs) -> Result<i32, String> {
    // When this process began (the harness splits its wire-up time into launch and protocol).
    let started_ns = super::workload::mono_ns();
    // Flags first, then the launcher's environment (`tbon::launch::Placement`).
    let placement = match (args.rank, args.size) {
        (Some(rank), Some(size)) => Placement { rank, size },
        (rank, size) => {
            let lookup = |n: &str| match (n, rank, size) {
                ("TBON_RANK", Some(r), _) => Some(r.to_string()),
                ("TBON_SIZE", _, Some(s)) => Some(s.to_string()),
                _ => std::env::var(n).ok(),
            };
            Placement::from_lookup(lookup).map_err(|e| {
                format!("{e}; pass --rank and --size or run under a launcher that sets them")
            })?
        }
    };
    let (rank, size) = (placement.rank, placement.size);
    let wireup_timeout = Duration::from_millis(args.settings.0.wireup_timeout_ms);
    // The URI file's whole text as read, when the URI came from one (to tell later whether a
    // new rank 0 replaced it).
    let mut hnp_text: Option<String> = None;
    let host = args
        .hnp_host
        .as_deref()
        .map(|h| format!("host:{h}").parse::<Rendezvous>())
        .transpose()
        .map_err(|e| format!("--hnp-host: {e}"))?;
    let rendezvous = match (&args.hnp, &args.hnp_file) {
        _ if host.is_some() => host,
        _ if rank == 0 => args.uri_file.clone().map(Rendezvous::File),
        (Some(h), _) => Some(Rendezvous::Uri(h.clone())),
        (None, Some(p)) => {
            let text = uri_file::read(p, wireup_timeout)?;
            let uri = uri_file::uri_of(&text).map(str::to_string);
            hnp_text = Some(text);
            uri.map(Rendezvous::Uri)
        }
        (None, None) => {
            return Err("ranks other than 0 need --hnp, --hnp-file or --hnp-host".into());
        }
    };
    // Rank 0 as this daemon dials it, for the messages of a failed start.
    let rank0_at = match (&rendezvous, &args.hnp_host) {
        (Some(Rendezvous::Uri(uri)), _) => uri.clone(),
        (_, Some(host)) => host.clone(),
        _ => "?".to_string(),
    };
    // Rank 0 without --uri-file publishes nothing but the line below.
    let how = rendezvous.unwrap_or(Rendezvous::Uri(String::new()));
    let mut config = args.settings.0;
    // The client flags are checked before the daemon takes part in the DVM: found after its
    // wire-up, a typo made the DVM record a fault (outside-in review).
    if !args.client_job.is_empty() && config.client_socket.is_none() {
        return Err(
            "--client-job needs --client-socket PATH (the socket clients connect to)".into(),
        );
    }
    let client_key = match &args.client_key_file {
        Some(f) => Some(
            std::fs::read_to_string(f)
                .map_err(|e| format!("{}: {e}", f.display()))
                .and_then(|t| {
                    tbon::clients::parse_key(&t).map_err(|e| format!("{}: {e}", f.display()))
                })?,
        ),
        None => None,
    };
    let key_source = config
        .key_file
        .as_ref()
        .map_or_else(|| "TBON_KEY".to_string(), |p| format!("the key file {p}"));
    // The job key itself may be in TBON_KEY (never a flag: command lines are public); the
    // library reads it only when asked, and the command asks, as `Config::from_env` does.
    if config.key_file.is_none() && config.key.is_none() {
        config.key = tbon::Key::from_env().map_err(|e| format!("TBON_KEY: {e}"))?;
    }
    let daemon = launch(config, placement, &how).map_err(|e| match e {
        // The library's text speaks of Config; a user of the command needs its flags.
        tbon::StartError::NoKey => "no job key: give --key-file FILE (or TBON_KEY_FILE, or the \
            key itself in TBON_KEY), or --insecure to run unauthenticated; `tbon keygen FILE` \
            makes a key"
            .to_string(),
        e => e.to_string(),
    })?;
    log::info!(
        "rank {rank} of {size}: listening at {}",
        daemon.contact_uri()
    );
    if rank == 0 {
        println!("TBON_HNP_URI={}", daemon.contact_uri());
    }

    let term = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, term.clone()).map_err(|e| e.to_string())?;
    }
    // SIGUSR1: leave the DVM in order (shrink); the daemon exits 0 once every other knows.
    let leave = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGUSR1, leave.clone())
        .map_err(|e| e.to_string())?;

    if !args.client_job.is_empty() {
        let key = client_key;
        for &job in &args.client_job {
            let h = daemon.handle();
            let cred = match key {
                Some(k) => h.client_job_with_key(job, k, &[]),
                None => h.client_job(job, &[]),
            }
            .map_err(|e| format!("--client-job {job}: {e}"))?;
            println!(
                "{}",
                serde_json::json!({"client_job": {
                    "rank": rank,
                    "job": job,
                    "socket": cred.socket,
                    "key": key.is_none().then(|| cred.key_hex()),
                }})
            );
        }
    }

    if args.print_faults {
        let registered = daemon.on_fault(move |s| {
                let line = serde_json::json!({ "fault": {
                    "rank": rank,
                    "scope": match s.scope { tbon::Scope::Local => "local", tbon::Scope::Global => "global" },
                    "epoch": s.epoch,
                    "mono_ns": super::workload::mono_ns(),
                    "newly_failed": s.newly_failed,
                    "parent": s.new_parent,
                    "children": s.new_children,
                    "promoted": s.promoted,
                    "restored": s.restored,
                    "demoted": s.demoted,
                    "departed": s.departed,
                }});
                println!("{line}");
            });
        // A daemon that already stopped (a refused rejoin, say) exits with its own reason
        // below, not with "the daemon is shut down" as a start-up error.
        if let Err(e) = registered
            && !daemon.is_stopped()
        {
            return Err(e.to_string());
        }
    }

    if args.ping_all {
        let h = daemon.handle();
        let others = size.saturating_sub(1);
        // Distinct ranks heard from: a daemon that rejoins pings everyone again.
        let mut heard = vec![false; size as usize];
        let mut n = 0;
        let posted = h.recv(Peer::Any, PING_TAG, tbon::RecvMode::Persistent, move |m| {
            let Some(seen) = heard.get_mut(m.origin as usize).filter(|s| !**s) else {
                return;
            };
            *seen = true;
            n += 1;
            log::debug!("rank {rank}: ping from {} ({n}/{others})", m.origin);
            if n == others {
                println!("rank {rank}: all-to-all ok ({n} of {others})");
            }
        });
        // A daemon that already stopped (a fatal wire-up error, say) exits with its own reason
        // below, not with "the daemon is shut down" as a start-up error.
        if let Err(e) = posted
            && !daemon.is_stopped()
        {
            return Err(e.to_string());
        }
        if others == 0 {
            println!("rank {rank}: all-to-all ok (0 of 0)");
        }
        // A rank absent at wire-up (room to grow) or restarted gets its ping when it joins.
        let joined = h.clone();
        let registered = daemon.on_fault(move |s| {
            for &dst in s.restored.iter().filter(|&&d| d != rank) {
                let msg = Bytes::from(format!("ping from {rank}"));
                if let Err(e) = joined.send(dst, PING_TAG, msg) {
                    log::warn!("rank {rank}: ping to rank {dst}, which joined: {e}");
                }
            }
        });
        if let Err(e) = registered
            && !daemon.is_stopped()
        {
            return Err(e.to_string());
        }
        match wait_wired(&daemon, &term, wireup_timeout * 2)? {
            Wireup::Signal => return stop_on_signal(rank, daemon),
            Wireup::Stopped => {}
            Wireup::Wired => {
                for dst in (0..size).filter(|d| *d != rank) {
                    let msg = Bytes::from(format!("ping from {rank}"));
                    match h.send(dst, PING_TAG, msg) {
                        // Absent (not yet joined) or dead: pinged if it joins.
                        Err(tbon::SendError::NodeDown(_)) => {
                            log::debug!("rank {rank}: ping to rank {dst}: not up");
                        }
                        Err(e) => log::warn!("rank {rank}: ping to {dst}: {e}"),
                        Ok(()) => {}
                    }
                }
            }
        }
    }

    let workload = super::workload::Workload::post(&args.workload, &daemon.handle())?;
    if let Some(w) = &workload {
        match wait_wired(&daemon, &term, wireup_timeout * 2)? {
            Wireup::Signal => return stop_on_signal(rank, daemon),
            Wireup::Stopped => {}
            Wireup::Wired => {
                println!(
                    "{}",
                    serde_json::json!({"wired": {
                        "rank": rank,
                        "mono_ns": super::workload::mono_ns(),
                        "started_ns": started_ns,
                        "uri": daemon.contact_uri(),
                    }})
                );
                w.start_sending(&args.workload, daemon.handle());
            }
        }
    }

    let mut next_progress = Instant::now();
    let reason = loop {
        if let Some(w) = &workload
            && Instant::now() >= next_progress
        {
            let counters = daemon.counters().ok();
            println!("{}", w.progress_line(rank, counters.as_ref()));
            next_progress =
                Instant::now() + Duration::from_millis(args.workload.workload_progress_ms.max(1));
        }
        if leave.swap(false, Ordering::SeqCst) {
            match daemon.handle().leave() {
                Ok(()) => log::info!("rank {rank}: SIGUSR1: leaving the DVM in order"),
                Err(e) => log::warn!("rank {rank}: SIGUSR1: cannot leave: {e}"),
            }
        }
        if term.load(Ordering::SeqCst) {
            log::info!("rank {rank}: signal received, stopping");
            if rank == 0 {
                daemon.shutdown_dvm();
            } else {
                daemon.shutdown();
            }
        }
        if let Some(r) = daemon.wait_stopped(Duration::from_millis(250)) {
            break r;
        }
    };
    drop(daemon);
    if let Some(w) = &workload {
        w.write(rank)
            .map_err(|e| format!("cannot write the workload results: {e}"))?;
    }
    match reason {
        r if r.is_orderly() => {
            log::info!("rank {rank}: stopped");
            Ok(0)
        }
        StopReason::RootLost(why)
            if why == tbon::node::FATAL_RANK_0_UNREACHABLE
                && args.hnp_file.is_some()
                && hnp_text.is_some() =>
        {
            match (&args.hnp_file, &hnp_text) {
                (Some(p), Some(used)) => follow_uri_file(rank, p, used, wireup_timeout, &term),
                _ => Ok(1),
            }
        }
        StopReason::RootLost(why) if why == tbon::node::FATAL_RANK_0_WRONG_KEY => {
            log::error!(
                "rank {rank}: stopped: rank 0 at {} answered, but with another job key than \
                 this daemon's ({key_source}): give every daemon of the DVM the same key (or \
                 the URI file names another DVM's rank 0)",
                rank0_at
            );
            Ok(1)
        }
        other => {
            log::error!("rank {rank}: stopped: {other}");
            Ok(1)
        }
    }
}
