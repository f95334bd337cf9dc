//! `tbon harness`: start a DVM of `tbon daemon` processes on this machine, drive a workload
//! through it, inject faults (SIGKILL, SIGSTOP), collect what every daemon sent and received,
//! check it, print a report, and stop every daemon.
//!
//! The daemons run the workload themselves (hidden `--workload-*` flags, see
//! [`super::workload`]); the harness only starts, watches, signals and judges them.

mod attack;
mod check;
mod check_clients;
mod check_groups;
mod check_streams;
mod clocks;
mod in_flight;
mod net;
mod nic_cut;
mod reset;
mod scale;
mod timeline;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::os::unix::process::CommandExt;

use super::workload::{Mode, Pattern, PayloadRange, Rng, mono_ns};

#[derive(Debug, clap::Args)]
pub struct HarnessArgs {
    /// Number of daemons (rank 0 included).
    #[arg(long, default_value_t = 16)]
    pub daemons: u32,
    /// Radix of the routing tree.
    #[arg(long, default_value_t = 4)]
    pub radix: u32,
    /// Messages each daemon originates (default: rate × duration).
    #[arg(long, conflicts_with = "duration")]
    pub messages: Option<u64>,
    /// Seconds of traffic (each daemon sends at --rate for this long).
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Messages per second each daemon originates.
    #[arg(long, default_value_t = 200.0)]
    pub rate: f64,
    /// Payload bytes, or an inclusive range MIN..MAX drawn uniformly (at least 40).
    #[arg(long, default_value = "64..4096")]
    pub payload: PayloadRange,
    /// Who sends to whom (`stream`: all-to-all messages, and every daemon fetches --streams
    /// streams of --stream-bytes from the others).
    #[arg(long, value_enum, default_value = "all-to-all")]
    pub pattern: Pattern,
    /// Pattern `stream`: streams each daemon fetches, spread over the run, one at a time.
    #[arg(long, default_value_t = 8)]
    pub streams: u64,
    /// Pattern `stream`: bytes of each stream (a number, or with a K, M or G suffix).
    #[arg(long, default_value = "4M", value_parser = parse_size)]
    pub stream_bytes: u64,
    /// Pattern `group`: members of each group (the daemons form about two groups per daemon,
    /// chosen at random and overlapping, as jobs sharing nodes).
    #[arg(long, default_value_t = 4)]
    pub group_size: u32,
    /// Pattern `group`: collectives each group runs, spread over the run (allgather, barrier,
    /// broadcast in turn).
    #[arg(long, default_value_t = 12)]
    pub group_rounds: u64,
    /// plain: unacknowledged point-to-point sends; reliable: RELM sends (every message between
    /// survivors must arrive exactly once and in order, faults or not); mixed: one message in 20
    /// is a broadcast and one point-to-point message in 4 is reliable.
    #[arg(long, value_enum, default_value = "mixed")]
    pub mode: Mode,
    /// Kill this many daemons with SIGKILL while traffic flows (interior ones unless
    /// --kill-any), at times spread over the run. Ignored if --kill-at is given. Default: 2,
    /// or 0 with --restart, --restart-at or --grow.
    #[arg(long)]
    pub kill: Option<usize>,
    /// Kill these ranks at these times: RANK@SECONDS (since traffic started), comma separated.
    /// RANK is one of the daemons started at the beginning, 1 to --daemons less 1 (not rank 0,
    /// not a rank --grow adds), each at most once.
    #[arg(long, value_delimiter = ',')]
    pub kill_at: Vec<String>,
    /// Kill this many daemons with SIGKILL while traffic flows (chosen as --kill chooses, never
    /// a --kill victim) and start each again with `--rejoin` once every survivor confirmed its
    /// death (issue "Rejoin"): it must be admitted back into its slot, every survivor must
    /// learn it, and it must carry the rest of the traffic. Every message between live
    /// daemons sent after it rejoined is checked as between survivors. Ignored if
    /// --restart-at is given.
    #[arg(long, default_value_t = 0)]
    pub restart: usize,
    /// Restart these ranks (SIGKILL at these times, then `--rejoin`): RANK@SECONDS (since
    /// traffic started), comma separated; RANK as for --kill-at.
    #[arg(long, value_delimiter = ',')]
    pub restart_at: Vec<String>,
    /// Grow the DVM while traffic flows (issue "Rejoin and grow"): K@SECONDS starts K new
    /// daemons, the next ranks after the last, that many seconds after traffic started, with
    /// `--join`; comma separated. The DVM is started with room for them (every daemon gets
    /// `--size` the daemons plus every K, and `--initial-size` the daemons). Each new daemon
    /// must be admitted, learnt by every survivor and carry the rest of the traffic, checked
    /// as a restarted daemon is.
    #[arg(long, value_delimiter = ',')]
    pub grow: Vec<String>,
    /// Pick the --kill victims among interior daemons (those with children): the default.
    #[arg(long, conflicts_with = "kill_any")]
    pub kill_interior: bool,
    /// Pick the --kill victims among every rank but 0 (leaves too).
    #[arg(long)]
    pub kill_any: bool,
    /// SIGSTOP these ranks at these times: RANK@SECONDS, comma separated. Heartbeats find them;
    /// once every survivor confirmed the death the harness sends SIGCONT and expects the daemon
    /// to exit non-zero.
    #[arg(long, value_delimiter = ',')]
    pub stop: Vec<String>,
    /// Emulate this many hosts (network namespaces joined by veth pairs to a bridge; needs root
    /// and iproute2); consecutive ranks share a host. 0: every daemon on 127.0.0.1.
    #[arg(long, default_value_t = 0)]
    pub hosts: u32,
    /// Cut the link of the host of these ranks at these times: RANK@SECONDS, comma separated
    /// (needs --hosts). Every daemon on that host is cut off; heartbeats find them. Once every
    /// survivor confirmed them dead the link comes back, and they must exit non-zero.
    #[arg(long, value_delimiter = ',', requires = "hosts")]
    pub cut: Vec<String>,
    /// Networks per emulated host (needs --hosts): network k is 10.(77+k).0.0/16 on a bridge
    /// of its own, and every daemon listens on all of them. --cut takes all of a host's down.
    #[arg(long, default_value_t = 1, requires = "hosts")]
    pub nics: u32,
    /// Take one network of the host of these ranks down at these times: RANK:NIC@SECONDS,
    /// comma separated (needs --hosts and --nics 2 or more). Not a fault: the daemons on that
    /// host live on over their other networks, so their links fail over (`link_stall_ms`); no
    /// daemon may be declared dead and no message, plain ones included, may be lost,
    /// duplicated or reordered. RANK:NIC@SECONDS+OUTAGE brings it back after OUTAGE seconds:
    /// then every network of a host may be down together (an outage), for less than half the
    /// heartbeat timeout, and that is no fault either.
    #[arg(long, value_delimiter = ',', requires = "hosts")]
    pub cut_nic: Vec<String>,
    /// Destroy every TCP connection of these living daemons at these times (`ss -K`):
    /// RANK@SECONDS, comma separated; loopback only. Not a fault: both ends live, so no daemon
    /// may be declared dead and no message, plain ones included, may be lost, duplicated or
    /// reordered (link sessions). Needs root and a kernel that can destroy sockets.
    #[arg(long, value_delimiter = ',', conflicts_with = "hosts")]
    pub reset: Vec<String>,
    /// Passed to the daemons (default 300 with --stop or --cut, else the daemon default).
    #[arg(long)]
    pub heartbeat_interval_ms: Option<u64>,
    /// Passed to the daemons (default 3000 with --stop or --cut; else the daemon default, or
    /// 10 ms per daemon per processor past 1,000 daemons per processor).
    #[arg(long)]
    pub heartbeat_timeout_ms: Option<u64>,
    /// Seed of the workload and of the choice of victims.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Plain messages sent up to this long before a fault may be lost (they may have been in
    /// flight through the dying daemon).
    #[arg(long, default_value_t = 2000)]
    pub loss_grace_ms: u64,
    /// Every daemon's `route` setting (direct links beside the tree): tree, direct or auto.
    #[arg(long, default_value_t = tbon::RouteSetting::Tree)]
    pub route: tbon::RouteSetting,
    /// Give up (and fail) if the run has not finished after this many seconds.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also write the report as one self-contained HTML file (inline SVG charts: the
    /// timeline with every fault, latency histograms, the tree before and after, the checks).
    /// Written whether the run passes or fails.
    #[arg(long, value_name = "FILE.html")]
    pub report: Option<PathBuf>,
    /// No progress display and no table; only the final verdict line (and errors).
    #[arg(long)]
    pub quiet: bool,
    /// Keep the run's folder (each daemon's log `rank-R.log` and results) instead of removing
    /// it at the end; its path is printed.
    #[arg(long)]
    pub keep: bool,
    /// Attack the DVM from the harness process (loopback only) while traffic flows, as a
    /// stranger without the job key: flood (many idle, partial, Hello-only and slow
    /// connections), forge (forged Hellos claiming every rank, renewed every 0.3 s). Comma
    /// separated. The report gains each daemon's RssAnon before, at its peak during, and
    /// after the attack.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub attack: Vec<attack::AttackKind>,
    /// Flood connections held at once, spread over the daemons (at most 20,000).
    #[arg(long, default_value_t = 2000)]
    pub attack_connections: usize,
    /// Source addresses of the attack: 127.0.0.2 and up, this many (0: 127.0.0.1, the
    /// daemons' own address).
    #[arg(long, default_value_t = 1)]
    pub attack_sources: u32,
    /// Client processes each daemon starts (issue "Jobs"): they connect to their daemon's
    /// Unix socket with the job's credential and exchange numbered messages with every other
    /// client, through the daemons, while daemons and clients are killed. Every message
    /// between two clients that both ran to the end must arrive once, in order, intact.
    #[arg(long, default_value_t = 0)]
    pub clients_per_daemon: u32,
    /// Messages each client sends (round-robin to the others, at --rate per second).
    #[arg(long, default_value_t = 200)]
    pub client_messages: u64,
    /// Client processes the harness kills with SIGKILL while traffic flows (spread over the
    /// run; never on a daemon that is killed too).
    #[arg(long, default_value_t = 1)]
    pub client_kill: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    Kill,
    Stop,
    /// The link of this host was cut (every daemon on it is a victim).
    Cut(u32),
    /// SIGKILL, then the daemon is started again with `--rejoin`.
    Restart,
}

/// One planned fault and what became of it.
#[derive(Debug, Clone)]
pub struct Fault {
    pub rank: u32,
    pub at_s: f64,
    pub kind: FaultKind,
    /// CLOCK_MONOTONIC ns when the signal was sent.
    pub injected_ns: Option<u64>,
    /// For a stopped daemon: when SIGCONT was sent, and its exit code afterwards.
    pub resumed: bool,
    pub exit_after_resume: Option<Option<i32>>,
    /// For a restart: CLOCK_MONOTONIC ns when the new daemon was started.
    pub restarted_ns: Option<u64>,
}

fn parse_at(spec: &str) -> Result<(u32, f64), String> {
    let (r, t) = spec
        .split_once('@')
        .ok_or_else(|| format!("{spec:?}: expected RANK@SECONDS"))?;
    let r = r.trim().parse().map_err(|e| format!("{spec:?}: {e}"))?;
    let t = t.trim().parse().map_err(|e| format!("{spec:?}: {e}"))?;
    Ok((r, t))
}

/// The faults to inject, in time order.
fn plan(args: &HarnessArgs, traffic_s: f64) -> Result<Vec<Fault>, String> {
    let n = args.daemons;
    let fault = |rank, at_s, kind| Fault {
        rank,
        at_s,
        kind,
        injected_ns: None,
        resumed: false,
        exit_after_resume: None,
        restarted_ns: None,
    };
    let mut faults = Vec::new();
    for s in &args.cut {
        let (r, t) = parse_at(s)?;
        let host = net::host_of(args.hosts, r, n);
        if host == net::host_of(args.hosts, 0, n) {
            return Err(format!(
                "--cut {s}: rank {r} shares a host with rank 0, and losing rank 0 ends the DVM"
            ));
        }
        for victim in (0..n).filter(|v| net::host_of(args.hosts, *v, n) == host) {
            faults.push(fault(victim, t, FaultKind::Cut(host)));
        }
    }
    for s in &args.stop {
        let (r, t) = parse_at(s)?;
        faults.push(fault(r, t, FaultKind::Stop));
    }
    let restarting = args.restart > 0 || !args.restart_at.is_empty() || !args.grow.is_empty();
    let kills = args.kill.unwrap_or(if restarting { 0 } else { 2 });
    let mut rng = Rng::new(args.seed ^ 0xfa17);
    if !args.kill_at.is_empty() {
        for s in &args.kill_at {
            let (r, t) = parse_at(s)?;
            faults.push(fault(r, t, FaultKind::Kill));
        }
    } else {
        // Spread over 25%..60% of the traffic: the repairs happen while traffic flows.
        for (r, frac) in choose_victims(args, &faults, kills, 0.25, &mut rng)? {
            faults.push(fault(r, traffic_s * frac, FaultKind::Kill));
        }
    }
    if !args.restart_at.is_empty() {
        for s in &args.restart_at {
            let (r, t) = parse_at(s)?;
            faults.push(fault(r, t, FaultKind::Restart));
        }
    } else {
        // Over 20%..55%: a restarted daemon has traffic left to carry.
        for (r, frac) in choose_victims(args, &faults, args.restart, 0.2, &mut rng)? {
            faults.push(fault(r, traffic_s * frac, FaultKind::Restart));
        }
    }
    let mut seen = BTreeSet::new();
    for f in &faults {
        if f.rank == 0 || f.rank >= n {
            return Err(format!(
                "cannot inject a fault into rank {} (ranks 1 to {} only, the daemons started at the \
                 beginning: losing rank 0 ends the DVM, and ranks --grow adds are not faulted)",
                f.rank,
                n.saturating_sub(1)
            ));
        }
        if !seen.insert(f.rank) {
            return Err(format!("rank {} is faulted twice", f.rank));
        }
    }
    faults.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    Ok(faults)
}

/// `count` victims for --kill or --restart, none already faulted, interior daemons unless
/// --kill-any, with the fraction of the traffic at which each is hit (from `from`, spread over
/// 35% of the traffic).
fn choose_victims(
    args: &HarnessArgs,
    faults: &[Fault],
    count: usize,
    from: f64,
    rng: &mut Rng,
) -> Result<Vec<(u32, f64)>, String> {
    if count == 0 {
        return Ok(Vec::new());
    }
    let n = args.daemons;
    let shape = tbon::routed::radix::Shape::new(args.radix, n).map_err(|e| e.to_string())?;
    let taken: BTreeSet<u32> = faults.iter().map(|f| f.rank).collect();
    let mut pool: Vec<u32> = (1..n)
        .filter(|r| !taken.contains(r))
        .filter(|r| args.kill_any || shape.children(*r).next().is_some())
        .collect();
    if pool.len() < count {
        return Err(format!(
            "{count} daemons to kill or restart, but only {} {} daemons to choose from (try more \
             --daemons, a smaller --radix or --kill-any)",
            pool.len(),
            if args.kill_any {
                "non-root"
            } else {
                "interior"
            }
        ));
    }
    Ok((0..count)
        .map(|i| {
            let r = pool.swap_remove(rng.below(pool.len() as u64) as usize);
            let frac = if count == 1 {
                from + 0.05
            } else {
                from + 0.35 * i as f64 / (count - 1) as f64
            };
            (r, frac)
        })
        .collect())
}

/// The daemon processes; every one still running is SIGKILLed and reaped on drop (also on
/// error paths and after Ctrl-C), so no daemon outlives the harness.
/// Makes the run's folder: `TMPDIR` if set, else `/dev/shm` when it is a writable
/// directory (a memory file system), else the system's temporary folder. Creating a file on
/// ext4 in a folder with many recently deleted files took 18% of all CPU time of a 1,024-daemon
/// run (the kernel's search for a free inode), on a machine where 2 cores start the daemons.
fn make_run_dir(name: &str) -> Result<PathBuf, String> {
    let shm = PathBuf::from("/dev/shm");
    if std::env::var_os("TMPDIR").is_none() && shm.is_dir() {
        let dir = shm.join(name);
        if std::fs::create_dir_all(&dir).is_ok() {
            return Ok(dir);
        }
    }
    let dir = std::env::temp_dir().join(name);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

/// Runs `spawn_one` for every rank from `SPAWN_THREADS` threads; the results in rank order.
fn spawn_all(
    n: u32,
    spawn_one: &(dyn Fn(u32) -> Result<Child, String> + Sync),
) -> Vec<Result<Child, String>> {
    const SPAWN_THREADS: u32 = 4;
    let next = std::sync::atomic::AtomicU32::new(0);
    let mut out: Vec<(u32, Result<Child, String>)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..SPAWN_THREADS.min(n.max(1)))
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let rank = next.fetch_add(1, Ordering::Relaxed);
                        if rank >= n {
                            return mine;
                        }
                        mine.push((rank, spawn_one(rank)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_default())
            .collect()
    });
    let mut by_rank: Vec<Option<Result<Child, String>>> = (0..n).map(|_| None).collect();
    for (r, c) in out.drain(..) {
        by_rank[r as usize] = Some(c);
    }
    by_rank
        .into_iter()
        .map(|c| c.unwrap_or_else(|| Err("a spawning thread panicked".into())))
        .collect()
}

/// The daemons' processes, by rank (None once reaped), and their ranks by pid.
struct Procs(Vec<Option<Child>>, HashMap<i32, u32>);

/// Sends every line `child` prints to `tx`, tagged with its rank, from a thread of its own.
fn read_lines(child: &mut Child, rank: u32, tx: &mpsc::Sender<(u32, String)>) {
    if let Some(out) = child.stdout.take() {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send((rank, line)).is_err() {
                    break;
                }
            }
        });
    }
}

impl Procs {
    /// Puts a restarted daemon in the place of `rank`'s killed one, which is reaped first.
    fn replace(&mut self, rank: u32, child: Child) {
        if let Some(mut old) = self.0[rank as usize].take() {
            self.1.remove(&(old.id() as i32));
            let _ = old.kill();
            let _ = old.wait();
        }
        self.1.insert(child.id() as i32, rank);
        self.0[rank as usize] = Some(child);
    }
    fn signal(&self, rank: u32, sig: Signal) {
        if let Some(c) = &self.0[rank as usize] {
            let _ = kill(Pid::from_raw(c.id() as i32), sig);
        }
    }
    /// Reaps `rank` if it exited; returns its exit code (None inside: killed by a signal,
    /// whose number goes to `signals`).
    fn try_exit(&mut self, rank: u32, signals: &mut BTreeMap<u32, i32>) -> Option<Option<i32>> {
        use std::os::unix::process::ExitStatusExt;
        let c = self.0[rank as usize].as_mut()?;
        match c.try_wait() {
            Ok(Some(st)) => {
                self.0[rank as usize] = None;
                if let Some(sig) = st.signal() {
                    signals.insert(rank, sig);
                }
                Some(st.code())
            }
            _ => None,
        }
    }
    /// Reaps every daemon that exited since the last call: (rank, exit code). Asks the kernel
    /// which child exited (without reaping it) instead of polling every rank: a poll of 4,096
    /// daemons every 20 ms was 7% of a 1,024-daemon run's CPU time.
    fn exited(&mut self, signals: &mut BTreeMap<u32, i32>) -> Vec<(u32, Option<i32>)> {
        use nix::sys::wait::{Id, WaitPidFlag, waitid};
        let mut out = Vec::new();
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        // At most one pass per child: every iteration reaps one.
        for _ in 0..self.0.len() {
            let Some(pid) = waitid(Id::All, flags).ok().and_then(|st| st.pid()) else {
                break;
            };
            // A child that is not a daemon (an `ip` command) is waited for by its own code.
            let Some(&rank) = self.1.get(&pid.as_raw()) else {
                break;
            };
            match self.try_exit(rank, signals) {
                Some(code) => {
                    self.1.remove(&pid.as_raw());
                    out.push((rank, code));
                }
                None => break,
            }
        }
        out
    }
    fn pid(&self, rank: u32) -> Option<u32> {
        self.0.get(rank as usize)?.as_ref().map(Child::id)
    }
    fn alive(&self) -> usize {
        self.0.iter().filter(|c| c.is_some()).count()
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for c in self.0.iter_mut().flatten() {
            let _ = c.kill();
        }
        for c in self.0.iter_mut().flatten() {
            let _ = c.wait();
        }
    }
}

/// What the harness learned from the daemons' stdout.
#[derive(Default)]
pub struct Seen {
    /// rank -> CLOCK_MONOTONIC ns it was wired.
    pub wired: BTreeMap<u32, u64>,
    /// rank -> CLOCK_MONOTONIC ns its process began (from its wired line).
    pub started: BTreeMap<u32, u64>,
    /// rank -> its contact URI (from its wired line).
    pub uris: BTreeMap<u32, String>,
    /// rank -> (sent, received, done) from its latest progress line.
    pub progress: BTreeMap<u32, (u64, u64, bool)>,
    /// rank -> its flow-control counters from its latest progress line: congestion episodes,
    /// sends refused `Busy` by flow control, relayed frames dropped at a full queue.
    /// Per rank, from its latest progress line: flow control (congestions, sends refused,
    /// frames dropped), then direct links (requests, grants, denials, links opened,
    /// fallbacks, messages on links, links evicted), then link sessions (resumptions, frames
    /// written again, duplicates dropped, frames given up).
    pub flow: BTreeMap<u32, [u64; 15]>,
    /// (rank, scope is global, newly failed, epoch, mono_ns) of every fault line.
    pub faults: Vec<(u32, bool, Vec<u32>, u64, u64)>,
    /// rank -> CLOCK_MONOTONIC ns its restarted daemon, or the daemon of a rank the DVM grew
    /// by, was wired (admitted and settled).
    pub rewired: BTreeMap<u32, u64>,
    /// The daemons started with the DVM (ranks from here on are growth).
    pub initial: u32,
    /// (rank, ranks restored, mono_ns) of every fault line that restored ranks (a rejoin
    /// learnt), the restarted daemon's own first line included.
    pub restored: Vec<(u32, Vec<u32>, u64)>,
}

impl Seen {
    fn take(&mut self, rank: u32, line: &str) {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            return;
        };
        if let Some(w) = v.get("wired") {
            let at = w["mono_ns"].as_u64().unwrap_or_else(mono_ns);
            if self.wired.contains_key(&rank) || rank >= self.initial {
                // A restarted daemon (its first life's wire-up stays the run's), or a rank
                // the DVM grew by.
                self.rewired.insert(rank, at);
                return;
            }
            self.wired.insert(rank, at);
            if let Some(u) = w["uri"].as_str() {
                self.uris.insert(rank, u.to_string());
            }
            if let Some(t) = w["started_ns"].as_u64() {
                self.started.insert(rank, t);
            }
        } else if let Some(p) = v.get("progress") {
            self.progress.insert(
                rank,
                (
                    p["sent"].as_u64().unwrap_or(0),
                    p["received"].as_u64().unwrap_or(0),
                    p["done"].as_bool().unwrap_or(false),
                ),
            );
            let c = &p["counters"];
            if c.is_object() {
                let n = |k: &str| c[k].as_u64().unwrap_or(0);
                self.flow.insert(
                    rank,
                    [
                        n("flow_congested"),
                        n("sends_busy_flow"),
                        n("dropped_queue_full"),
                        n("direct_requests_sent"),
                        n("direct_grants"),
                        n("direct_denied"),
                        n("direct_links_opened"),
                        n("direct_fallbacks"),
                        n("direct_messages"),
                        n("direct_links_evicted"),
                        n("link_resumes"),
                        n("link_frames_resent"),
                        n("link_duplicates_dropped"),
                        n("link_frames_given_up"),
                        n("link_failovers"),
                    ],
                );
            }
        } else if let Some(f) = v.get("fault") {
            let ranks = |k: &str| -> Vec<u32> {
                f[k].as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|x| x.as_u64())
                            .map(|x| x as u32)
                            .collect()
                    })
                    .unwrap_or_default()
            };
            let at = f["mono_ns"].as_u64().unwrap_or_else(mono_ns);
            let restored = ranks("restored");
            if !restored.is_empty() {
                self.restored.push((rank, restored, at));
            }
            self.faults.push((
                rank,
                f["scope"] == "global",
                ranks("newly_failed"),
                f["epoch"].as_u64().unwrap_or(0),
                at,
            ));
        }
    }

    /// Whether every rank in `who` has a global confirmation naming `victim`.
    fn confirmed_by(&self, victim: u32, who: &BTreeSet<u32>) -> bool {
        who.iter().all(|r| {
            self.faults
                .iter()
                .any(|(fr, g, nf, _, _)| fr == r && *g && nf.contains(&victim))
        })
    }

    fn received(&self) -> u64 {
        self.progress.values().map(|p| p.1).sum()
    }
    fn sent(&self) -> u64 {
        self.progress.values().map(|p| p.0).sum()
    }
}

/// Milliseconds between a daemon's progress lines: 250, longer past 1,000 daemons so that the
/// DVM sends the harness at most about 4,000 lines a second. Each line is a round trip to the
/// daemon's loop for its counters and a JSON parse here; at 250 ms, 2,048 daemons kept about
/// 1,600 threads runnable on this 2-core machine and doubled the time the contact slices took to
/// go down the tree.
fn progress_ms(daemons: u32) -> u64 {
    (u64::from(daemons) / 4).max(250)
}

/// Runs the harness; returns the exit code (0: every check held).
pub fn run(args: HarnessArgs) -> Result<i32, String> {
    let n = args.daemons;
    if n < 2 {
        return Err("--daemons must be at least 2".into());
    }
    if args.radix < 1 {
        return Err("--radix must be at least 1".into());
    }
    // A rate of 0 scheduled nothing to time the kills by, and the run hung in its traffic
    // phase (from an outside-in review).
    if !(args.rate.is_finite() && args.rate > 0.0) {
        return Err("--rate must be more than 0 messages a second".into());
    }
    let messages = args
        .messages
        .unwrap_or((args.duration * args.rate).round().max(1.0) as u64);
    let traffic_s = messages as f64 / args.rate;
    let mut faults = plan(&args, traffic_s)?;
    let mut resets = reset::plan(&args.reset, n)?;
    // Growth: (rank, seconds since traffic started, when it was started).
    let mut grows: Vec<(u32, f64, Option<u64>)> = Vec::new();
    for spec in &args.grow {
        let (k, at) = spec
            .split_once('@')
            .ok_or_else(|| format!("--grow {spec:?}: expected K@SECONDS"))?;
        let k: u32 = k
            .trim()
            .parse()
            .map_err(|e| format!("--grow {spec:?}: {e}"))?;
        let at: f64 = at
            .trim()
            .parse()
            .map_err(|e| format!("--grow {spec:?}: {e}"))?;
        for _ in 0..k {
            grows.push((n + grows.len() as u32, at, None));
        }
    }
    let capacity = n + grows.len() as u32;
    if !grows.is_empty() && args.hosts > 0 {
        return Err("--grow runs on loopback only; it cannot be combined with --hosts".into());
    }
    let has_stop = faults
        .iter()
        .any(|f| matches!(f.kind, FaultKind::Stop | FaultKind::Cut(_)));
    let restarts = faults.iter().any(|f| f.kind == FaultKind::Restart);
    if (restarts || !grows.is_empty())
        && (args.pattern == Pattern::Stream || args.clients_per_daemon > 0)
    {
        return Err(
            "--restart, --restart-at and --grow check messages, broadcasts and group \
             collectives; they cannot be combined with --pattern stream or with \
             --clients-per-daemon yet"
                .into(),
        );
    }
    let hb_interval = args.heartbeat_interval_ms.or(has_stop.then_some(300));
    let hb_timeout = args
        .heartbeat_timeout_ms
        .or(has_stop.then_some(3000))
        .or_else(|| scale::overcommitted_heartbeat_timeout_ms(n));
    // Overcommitted, a starved loop writes and reads late: `link_stall_ms` stretched with the
    // heartbeat timeout (half of it, its cap), or links fail over with no network fault (34
    // failovers in a run of 4,096 daemons on 2 processors, from an outside-in review).
    let link_stall = scale::overcommitted_heartbeat_timeout_ms(n)
        .and(hb_timeout)
        .map(|t| t / 2);
    let mut nic_cuts = nic_cut::plan(
        &args.cut_nic,
        n,
        args.hosts,
        args.nics,
        hb_timeout.unwrap_or(tbon::config::Config::default().heartbeat_timeout_ms),
    )?;

    let interrupted = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, interrupted.clone()).map_err(|e| e.to_string())?;
    }

    if !args.attack.is_empty() && args.hosts > 0 {
        return Err("--attack runs on loopback only; it cannot be combined with --hosts".into());
    }
    let hosts = match args.hosts {
        0 => None,
        h if h > n => return Err("--hosts cannot exceed --daemons".into()),
        h => Some(net::Hosts::create(h, args.nics)?),
    };
    // Before anything is started: the open-file limit raised, and a run that cannot fit
    // refused with the reason.
    let fit = scale::check(n, args.hosts)?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the tbon binary: {e}"))?;
    let dir = make_run_dir(&format!("tbon-harness-{}", std::process::id()))?;
    let _cleanup = RemoveDir(dir.clone(), args.keep);
    let uri_file = dir.join("hnp.uri");
    // The harness is the launcher here, so it makes the DVM's job key (mode 0600, in the run's
    // private folder, which is removed at the end).
    let key_file = dir.join("job.key");
    let _ = std::fs::remove_file(&key_file);
    tbon::driver::key::generate(&key_file)
        .map_err(|e| format!("cannot make the job key {}: {e}", key_file.display()))?;
    // A restarted daemon's life 1 has files of its own.
    let life_file = |r: u32, life: u64, ext: &str| match life {
        0 => dir.join(format!("rank-{r}.{ext}")),
        l => dir.join(format!("rank-{r}.life{l}.{ext}")),
    };
    let result_file = |r: u32| life_file(r, 0, "res");

    let bar = if args.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        let b = indicatif::ProgressBar::new_spinner();
        b.enable_steady_tick(Duration::from_millis(120));
        b
    };
    let started = Instant::now();
    let spawn_ns = mono_ns();
    let (tx, rx) = mpsc::channel::<(u32, String)>();
    // Started from several threads: each spawn waits for its child's exec, and one thread
    // alone took 1.6 ms per daemon (3.3 s for 2,048) on this 2-core machine.
    // `rejoin`: start the daemon (again) under `rank` with `--rejoin` (`--join` for a rank the
    // DVM grows by), in its `life` (1 once restarted, 0 for a new rank), to send this many
    // messages numbered from its life's base.
    let spawn_life = |rank: u32, rejoin: Option<(u64, u64)>| -> Result<Child, String> {
        let life = rejoin.map_or(0, |(l, _)| l);
        let (mut cmd, subnet) = match &hosts {
            Some(h) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec"])
                    .arg(h.namespace(net::host_of(args.hosts, rank, n)))
                    .arg(&exe);
                (c, h.subnets())
            }
            None => (Command::new(&exe), "127.0.0.1/32".to_string()),
        };
        cmd.arg("daemon")
            .arg("--key-file")
            .arg(&key_file)
            .args(["--rank", &rank.to_string(), "--size", &capacity.to_string()])
            .args(["--initial-size", &n.to_string()])
            .args(["--radix", &args.radix.to_string()])
            .args(["--route", &args.route.to_string()])
            .args(["--if-include", &subnet, "--print-faults"])
            .arg("--workload-out")
            .arg(life_file(rank, life, "res"))
            .args([
                "--workload-pattern",
                &value_name(&args.pattern),
                "--workload-mode",
                &value_name(&args.mode),
            ])
            .args([
                "--workload-messages",
                &rejoin.map_or(messages, |(_, m)| m).to_string(),
            ])
            .args(["--workload-rate", &args.rate.to_string()])
            .args(["--workload-payload", &args.payload.to_string()])
            .args(["--workload-seed", &args.seed.to_string()])
            .args(["--workload-radix", &args.radix.to_string()])
            .args(["--workload-progress-ms", &progress_ms(n).to_string()]);
        if args.pattern == Pattern::Stream {
            cmd.args(["--workload-streams", &args.streams.to_string()])
                .args(["--workload-stream-bytes", &args.stream_bytes.to_string()]);
        }
        if args.clients_per_daemon > 0 {
            cmd.arg("--client-socket")
                .arg(dir.join(format!("d{rank}.sock")))
                .args(["--workload-clients", &args.clients_per_daemon.to_string()])
                .args([
                    "--workload-client-messages",
                    &args.client_messages.to_string(),
                ])
                .arg("--workload-client-dir")
                .arg(&dir);
        }
        if args.pattern == Pattern::Group {
            cmd.args(["--workload-group-size", &args.group_size.to_string()])
                .args(["--workload-group-rounds", &args.group_rounds.to_string()]);
        }
        if let Some(ms) = hb_interval {
            cmd.args(["--heartbeat-interval-ms", &ms.to_string()]);
        }
        if let Some(ms) = hb_timeout {
            cmd.args(["--heartbeat-timeout-ms", &ms.to_string()]);
        }
        if let Some(ms) = link_stall {
            cmd.args(["--link-stall-ms", &ms.to_string()]);
        }
        if rank == 0 {
            cmd.arg("--uri-file").arg(&uri_file);
        } else {
            cmd.arg("--hnp-file").arg(&uri_file);
        }
        if rejoin.is_some() {
            cmd.arg("--rejoin").args([
                "--workload-seq-base",
                &(life * super::workload::LIFE_SEQ_STRIDE).to_string(),
            ]);
        }
        let log_path = life_file(rank, life, "log");
        let log =
            std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
        // `TBON_HARNESS_LOG` (a `RUST_LOG` filter) makes the daemons' logs more verbose.
        let filter = std::env::var("TBON_HARNESS_LOG").unwrap_or_else(|_| "tbon=warn".into());
        cmd.env("RUST_LOG", filter)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            // Own process group: a Ctrl-C in the terminal reaches only the harness, which then
            // kills every daemon itself.
            .process_group(0);
        cmd.spawn()
            .map_err(|e| format!("cannot start {} (rank {rank}): {e}", exe.display()))
    };
    let children = spawn_all(n, &|rank| spawn_life(rank, None));
    let mut procs = Procs(Vec::with_capacity(capacity as usize), HashMap::new());
    let mut spawn_error = None;
    for (rank, child) in (0..n).zip(children) {
        match child {
            Ok(mut child) => {
                read_lines(&mut child, rank, &tx);
                procs.1.insert(child.id() as i32, rank);
                procs.0.push(Some(child));
            }
            Err(e) => {
                procs.0.push(None);
                spawn_error.get_or_insert(e);
            }
        }
    }
    if let Some(e) = spawn_error {
        // `procs` kills every daemon that did start when it is dropped.
        return Err(e);
    }
    // The slots of the ranks the DVM grows by.
    for _ in n..capacity {
        procs.0.push(None);
    }
    // Kept for the daemons restarted, or added, later.
    let restart_tx = tx;

    let deadline = started + Duration::from_secs(args.timeout);
    let mut seen = Seen {
        initial: n,
        ..Seen::default()
    };
    let mut problems: Vec<String> = Vec::new();
    // Ranks the harness killed or stopped, and ranks that exited on their own.
    let mut victims: BTreeSet<u32> = BTreeSet::new();
    let mut crashed: BTreeMap<u32, Option<i32>> = BTreeMap::new();
    let mut t0: Option<u64> = None;
    let mut phase = "wire-up";
    let mut drain_since: Option<(Instant, u64)> = None;
    let mut clock_check: Option<clocks::ClockCheck> = None;
    let mut failed_over: Result<Vec<nic_cut::FailedOver>, String> =
        Err("not asked (the run ended before its drain)".into());
    let mut shutdown_sent = false;
    let mut exits: BTreeMap<u32, Option<i32>> = BTreeMap::new();
    let mut signals: BTreeMap<u32, i32> = BTreeMap::new();
    // The attack: running, then stopped (when), then its outcome; memory per rank.
    let mut attacker: Option<attack::Attack> = None;
    let mut attack_stopped: Option<Instant> = None;
    let mut attack_outcome: Option<attack::Outcome> = None;
    let mut memory: BTreeMap<u32, attack::Memory> = BTreeMap::new();
    let mut next_sample = Instant::now();
    let mut next_exit_check = Instant::now();
    let mut rank0 = scale::Rank0::default();
    // Client kills: when (seconds into the traffic), and the clients killed.
    let mut client_kills: Vec<f64> = (0..args.client_kill)
        .filter(|_| args.clients_per_daemon > 0)
        .map(|i| traffic_s * (0.3 + 0.3 * i as f64 / args.client_kill.max(2) as f64))
        .collect();
    let mut killed_clients: BTreeSet<tbon::ClientName> = BTreeSet::new();
    let mut client_rng = Rng::new(args.seed ^ 0xc11e);

    loop {
        if interrupted.load(Ordering::SeqCst) {
            bar.finish_and_clear();
            drop(procs);
            eprintln!("tbon harness: interrupted; every daemon was killed");
            return Ok(130);
        }
        if Instant::now() >= deadline {
            problems.push(format!(
                "hang: the run did not finish within --timeout {} s (phase: {phase})",
                args.timeout
            ));
            break;
        }
        if let Ok((rank, line)) = rx.recv_timeout(Duration::from_millis(20)) {
            seen.take(rank, &line);
        }
        while let Ok((rank, line)) = rx.try_recv() {
            seen.take(rank, &line);
        }
        rank0.sample(procs.pid(0));
        // Exits: expected for resumed stopped daemons and after the shutdown; else a crash.
        // At most every 50 ms: each look makes the kernel walk every child.
        let exits_due = Instant::now() >= next_exit_check;
        if exits_due {
            next_exit_check = Instant::now() + Duration::from_millis(50);
        }
        let exited = if exits_due {
            procs.exited(&mut signals)
        } else {
            Vec::new()
        };
        for (rank, code) in exited {
            let fault = faults.iter_mut().find(|f| f.rank == rank);
            match fault {
                Some(f) if f.kind == FaultKind::Kill => {}
                // The killed life of a daemon to restart (its new life is judged as any).
                Some(f) if f.kind == FaultKind::Restart && f.restarted_ns.is_none() => {}
                Some(f) if f.kind != FaultKind::Restart && f.injected_ns.is_some() => {
                    f.exit_after_resume = Some(code)
                }
                _ if shutdown_sent => {
                    exits.insert(rank, code);
                }
                _ => {
                    crashed.insert(rank, code);
                }
            }
        }
        if !crashed.is_empty() && !shutdown_sent {
            for (r, code) in &crashed {
                problems.push(format!(
                    "rank {r} exited on its own during {phase} ({}); its log: {}",
                    describe_exit(*code, signals.get(r)),
                    tail(&life_file(*r, life_now(&faults, *r), "log"))
                ));
            }
            break;
        }
        let survivors: BTreeSet<u32> = (0..n).filter(|r| !victims.contains(r)).collect();
        match t0 {
            None => {
                if seen.wired.len() == n as usize {
                    t0 = seen.wired.values().copied().max();
                    phase = "traffic";
                    if !args.attack.is_empty() {
                        for r in 0..n {
                            let m = memory.entry(r).or_default();
                            m.before_kib = procs.pid(r).and_then(attack::rss_anon_kib);
                        }
                        let (targets, dvm_id) = attack_targets(&seen)?;
                        attacker = Some(attack::Attack::start(
                            &args.attack,
                            args.attack_connections,
                            args.attack_sources,
                            &targets,
                            &dvm_id,
                            n,
                        ));
                    }
                }
            }
            Some(t0) => {
                let since = mono_ns().saturating_sub(t0) as f64 / 1e9;
                for i in 0..faults.len() {
                    let f = &faults[i];
                    if f.injected_ns.is_none() && since >= f.at_s {
                        match f.kind {
                            FaultKind::Kill | FaultKind::Restart => {
                                procs.signal(f.rank, Signal::SIGKILL)
                            }
                            FaultKind::Stop => procs.signal(f.rank, Signal::SIGSTOP),
                            FaultKind::Cut(host) => {
                                let already = faults
                                    .iter()
                                    .any(|g| g.kind == f.kind && g.injected_ns.is_some());
                                if let (Some(h), false) = (&hosts, already) {
                                    h.set_link(host, false)?;
                                }
                            }
                        }
                        victims.insert(f.rank);
                        faults[i].injected_ns = Some(mono_ns());
                    }
                    let f = &faults[i];
                    if f.kind == FaultKind::Restart
                        && f.injected_ns.is_some()
                        && f.restarted_ns.is_none()
                        && seen.confirmed_by(f.rank, &survivors)
                    {
                        // Started again once every survivor confirmed the death: the rank is
                        // then failed at rank 0, which is what admits it. It sends what is
                        // left of the schedule, at least a tenth of it.
                        let left = messages
                            .saturating_sub((since * args.rate) as u64)
                            .max(messages / 10)
                            .max(1);
                        // Taken before the start: the new daemon may be admitted, and every
                        // survivor told, before `spawn` returns here.
                        let at = mono_ns();
                        let mut child = spawn_life(f.rank, Some((1, left)))?;
                        read_lines(&mut child, f.rank, &restart_tx);
                        procs.replace(f.rank, child);
                        seen.progress.remove(&f.rank);
                        faults[i].restarted_ns = Some(at);
                        continue;
                    }
                    if matches!(f.kind, FaultKind::Kill | FaultKind::Restart)
                        || f.injected_ns.is_none()
                        || f.resumed
                    {
                        continue;
                    }
                    // Resume (SIGCONT, or the link back up) once every survivor confirmed the
                    // death of every daemon this fault took.
                    let together: Vec<u32> = faults
                        .iter()
                        .filter(|g| g.kind == f.kind && g.at_s == f.at_s)
                        .map(|g| g.rank)
                        .collect();
                    if together
                        .iter()
                        .all(|r| victims.contains(r) && seen.confirmed_by(*r, &survivors))
                    {
                        match f.kind {
                            FaultKind::Cut(host) => {
                                if let Some(h) = &hosts {
                                    h.set_link(host, true)?;
                                }
                                for g in faults.iter_mut().filter(|g| together.contains(&g.rank)) {
                                    g.resumed = true;
                                }
                            }
                            _ => {
                                procs.signal(f.rank, Signal::SIGCONT);
                                faults[i].resumed = true;
                            }
                        }
                    }
                }
                for g in grows.iter_mut() {
                    if g.2.is_none() && since >= g.1 {
                        let left = messages
                            .saturating_sub((since * args.rate) as u64)
                            .max(messages / 10)
                            .max(1);
                        let at = mono_ns();
                        let mut child = spawn_life(g.0, Some((0, left)))?;
                        read_lines(&mut child, g.0, &restart_tx);
                        procs.replace(g.0, child);
                        g.2 = Some(at);
                    }
                }
                for c in nic_cuts.iter_mut() {
                    if !c.done && since >= c.at_s {
                        c.done = true;
                        if let Some(h) = &hosts {
                            h.set_nic(c.host, c.nic, false)?;
                        }
                    }
                    if c.done && !c.restored && c.back_at_s().is_some_and(|b| since >= b) {
                        c.restored = true;
                        if let Some(h) = &hosts {
                            h.set_nic(c.host, c.nic, true)?;
                        }
                    }
                }
                for r in resets.iter_mut() {
                    if r.destroyed.is_none() && since >= r.at_s {
                        let done = procs
                            .pid(r.rank)
                            .ok_or_else(|| format!("--reset: rank {} is not running", r.rank))
                            .and_then(reset::reset_connections);
                        match done {
                            Ok(k) => r.destroyed = Some(k),
                            Err(e) => {
                                problems.push(format!("--reset of rank {}: {e}", r.rank));
                                r.destroyed = Some(0);
                            }
                        }
                    }
                }
                if client_kills.first().is_some_and(|at| since >= *at) {
                    client_kills.remove(0);
                    match kill_a_client(
                        &dir,
                        n,
                        args.clients_per_daemon,
                        &victims,
                        &faults,
                        &killed_clients,
                        &mut client_rng,
                    ) {
                        Some(name) => {
                            killed_clients.insert(name);
                        }
                        None => problems.push("no client was alive to kill".into()),
                    }
                }
                let all_injected = faults.iter().all(|f| f.injected_ns.is_some())
                    && grows
                        .iter()
                        .all(|g| g.2.is_some() && seen.rewired.contains_key(&g.0));
                let all_settled = faults.iter().all(|f| {
                    seen.confirmed_by(f.rank, &survivors)
                        && match f.kind {
                            FaultKind::Kill => true,
                            FaultKind::Restart => {
                                f.restarted_ns.is_some() && seen.rewired.contains_key(&f.rank)
                            }
                            _ => f.exit_after_resume.is_some(),
                        }
                });
                // Survivors, and restarted daemons in their new life.
                let sending_done = survivors
                    .iter()
                    .chain(
                        faults
                            .iter()
                            .filter(|f| f.restarted_ns.is_some())
                            .map(|f| &f.rank),
                    )
                    .chain(grows.iter().filter(|g| g.2.is_some()).map(|g| &g.0))
                    .all(|r| seen.progress.get(r).is_some_and(|p| p.2));
                if attacker.is_some() && Instant::now() >= next_sample {
                    next_sample = Instant::now() + Duration::from_millis(250);
                    for r in 0..n {
                        if let Some(kib) = procs.pid(r).and_then(attack::rss_anon_kib) {
                            let m = memory.entry(r).or_default();
                            m.peak_kib = Some(m.peak_kib.unwrap_or(0).max(kib));
                        }
                    }
                }
                // The attack lasts through the traffic and the faults; then the DVM runs on
                // for ATTACK_AFTER_S so the memory it gives back can be measured.
                let mut attack_settled = true;
                if all_injected && all_settled && sending_done {
                    if let Some(a) = attacker.take() {
                        attack_outcome = Some(a.stop(&args.attack, args.attack_connections));
                        attack_stopped = Some(Instant::now());
                    }
                    if let Some(at) = attack_stopped {
                        if at.elapsed() < Duration::from_secs_f64(ATTACK_AFTER_S) {
                            attack_settled = false;
                        } else if memory.values().all(|m| m.after_kib.is_none()) {
                            for r in 0..n {
                                if let Some(kib) = procs.pid(r).and_then(attack::rss_anon_kib) {
                                    memory.entry(r).or_default().after_kib = Some(kib);
                                }
                            }
                        }
                    }
                }
                if !shutdown_sent && all_injected && all_settled && sending_done && attack_settled {
                    phase = "drain";
                    // Wait until deliveries stop growing for a second (bounded by --timeout).
                    let got = seen.received();
                    match drain_since {
                        Some((at, before)) if before == got => {
                            if at.elapsed() >= Duration::from_secs(1) {
                                phase = "shutdown";
                                clock_check = Some(match &hosts {
                                    Some(h) => clocks::measure_in(
                                        &h.namespace(net::host_of(args.hosts, 0, n)),
                                        &exe,
                                        seen.uris.get(&0),
                                        &key_file,
                                        procs.alive(),
                                    ),
                                    None => {
                                        clocks::measure(seen.uris.get(&0), &key_file, procs.alive())
                                    }
                                });
                                if let (Some(h), false) = (&hosts, nic_cuts.is_empty()) {
                                    failed_over = match seen.uris.get(&0) {
                                        Some(uri) => nic_cut::links_failed_over(
                                            &exe,
                                            &h.namespace(net::host_of(args.hosts, 0, n)),
                                            uri,
                                            &key_file,
                                        ),
                                        None => Err("rank 0 never said where it listens".into()),
                                    };
                                }
                                procs.signal(0, Signal::SIGTERM);
                                shutdown_sent = true;
                            }
                        }
                        _ => drain_since = Some((Instant::now(), got)),
                    }
                }
                if shutdown_sent && procs.alive() == 0 {
                    break;
                }
            }
        }
        bar.set_message(format!(
            "{phase}: wired {}/{n} · sent {} · delivered {} · alive {}/{n} · faults {}/{}",
            seen.wired.len(),
            seen.sent(),
            seen.received(),
            procs.alive(),
            faults.iter().filter(|f| f.injected_ns.is_some()).count(),
            faults.len()
        ));
    }
    bar.finish_and_clear();
    let ended = Instant::now();
    drop(procs); // kills whatever is left (only on a failed run)
    if let Some(a) = attacker.take() {
        attack_outcome = Some(a.stop(&args.attack, args.attack_connections));
    }

    let survivors: BTreeSet<u32> = (0..n)
        .filter(|r| !victims.contains(r) && !crashed.contains_key(r))
        .collect();
    // Restarted daemons whose new life did not crash: they must stop cleanly too, and their
    // new life's results are judged with the survivors' (check::Rejoined says how).
    let mut rejoined: BTreeMap<u32, check::Rejoined> = BTreeMap::new();
    for f in &faults {
        if let (Some(killed_ns), Some(restarted_ns)) = (f.injected_ns, f.restarted_ns)
            && !crashed.contains_key(&f.rank)
        {
            rejoined.insert(
                f.rank,
                check::Rejoined {
                    seq_base: super::workload::LIFE_SEQ_STRIDE,
                    killed_ns,
                    restarted_ns,
                    wired_ns: seen.rewired.get(&f.rank).copied(),
                    grown: false,
                },
            );
        }
    }
    for &(rank, _, spawned) in &grows {
        if let Some(at) = spawned
            && !crashed.contains_key(&rank)
        {
            rejoined.insert(
                rank,
                check::Rejoined {
                    seq_base: 0,
                    killed_ns: at,
                    restarted_ns: at,
                    wired_ns: seen.rewired.get(&rank).copied(),
                    grown: true,
                },
            );
        }
    }
    for r in survivors.iter().chain(rejoined.keys()) {
        match exits.get(r) {
            Some(Some(0)) => {}
            Some(code) => problems.push(format!(
                "rank {r} did not stop cleanly after the DVM shutdown ({}); its log: {}",
                describe_exit(*code, signals.get(r)),
                tail(&life_file(*r, life_now(&faults, *r), "log"))
            )),
            None if shutdown_sent => problems.push(format!("rank {r} did not exit")),
            None => {}
        }
    }
    let client_judgement = (args.clients_per_daemon > 0)
        .then(|| check_clients::judge(&dir, n, args.clients_per_daemon, &victims, &killed_clients));
    kill_leftover_clients(&dir, n, args.clients_per_daemon);
    if let Some((cc, examples)) = &client_judgement {
        if !examples.is_empty() {
            problems.push(format!(
                "client traffic went wrong, e.g. {}",
                examples.join("; ")
            ));
        }
        if cc.live_pairs == 0 {
            problems.push("no pair of clients ran to the end".into());
        }
    }
    let mut results = BTreeMap::new();
    if problems.is_empty() {
        for r in &survivors {
            results.insert(*r, super::workload::read_results(&result_file(*r))?);
        }
        for (r, j) in &rejoined {
            let life = u64::from(!j.grown);
            results.insert(
                *r,
                super::workload::read_results(&life_file(*r, life, "res"))?,
            );
        }
    }
    if let Some(p) = clock_check.as_ref().and_then(clocks::ClockCheck::problem) {
        problems.push(p);
    }
    let input = check::Input {
        args: &args,
        capacity,
        messages,
        faults: &faults,
        seen: &seen,
        survivors: &survivors,
        rejoined: &rejoined,
        results: &results,
        spawn_ns,
        fit: &fit,
        rank0,
        t0,
        elapsed: ended - started,
        problems,
    };
    let mut report = check::analyse(input);
    if let Some(outcome) = &attack_outcome {
        // Lines each daemon logged (its stderr): what the attack cost in logging.
        let log_lines: BTreeMap<u32, usize> = (0..n)
            .map(|r| {
                let text = std::fs::read_to_string(life_file(r, 0, "log")).unwrap_or_default();
                (r, text.lines().count())
            })
            .collect();
        let (text, json) = attack::render(outcome, &memory, &log_lines);
        report.add_section("attack", &text, json);
    }
    if let Some(c) = &clock_check {
        let (text, json) = c.render();
        report.add_section("clocks", &text, json);
    }
    if !resets.is_empty() {
        let (text, json) = reset::render(&resets);
        report.add_section("resets", &text, json);
    }
    if !nic_cuts.is_empty() {
        let (text, json) = nic_cut::render(&nic_cuts, &failed_over);
        report.add_section("network_cuts", &text, json);
    }
    if let Some((cc, _)) = &client_judgement {
        let text = format!(
            "\n  clients: {} workers ({} per daemon), {} killed, {} orphaned by killed daemons; \
             {} live pairs carried {} messages, all once and in order; {} pairs from the dead \
             judged as prefixes; {} exits seen by watches; {} wrong\n",
            cc.workers,
            args.clients_per_daemon,
            cc.killed,
            cc.orphaned,
            cc.live_pairs,
            cc.live_messages,
            cc.prefix_pairs,
            cc.exits_seen,
            cc.wrong
        );
        let json = serde_json::to_value(cc).unwrap_or_default();
        report.add_section("clients", &text, json);
    }
    if let Some(obj) = report.json.as_object_mut() {
        obj.insert("verdict".into(), report.verdict.clone().into());
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report.json).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(path) = &args.report {
        super::report::write(path, &super::report::harness(&report.json))?;
    }
    if args.quiet {
        println!("{}", report.verdict);
    } else {
        print!("{}", report.text);
    }
    Ok(if report.passed { 0 } else { 1 })
}

/// SIGKILLs one client process (its pid file written, its daemon neither killed nor about
/// to be, not killed before), chosen with `rng`; its name.
fn kill_a_client(
    dir: &std::path::Path,
    n: u32,
    per_daemon: u32,
    victims: &BTreeSet<u32>,
    faults: &[Fault],
    killed: &BTreeSet<tbon::ClientName>,
    rng: &mut Rng,
) -> Option<tbon::ClientName> {
    let candidates: Vec<(tbon::ClientName, i32)> = (0..n)
        .filter(|r| !victims.contains(r) && !faults.iter().any(|f| f.rank == *r))
        .flat_map(|rank| (1..=per_daemon).map(move |local| tbon::ClientName { rank, local }))
        .filter(|c| !killed.contains(c))
        .filter_map(|c| {
            let pid = std::fs::read_to_string(super::client_workload::pid_file(dir, c)).ok()?;
            Some((c, pid.trim().parse().ok()?))
        })
        .collect();
    if candidates.is_empty() {
        return None;
    }
    let (name, pid) = candidates[rng.below(candidates.len() as u64) as usize];
    kill(Pid::from_raw(pid), Signal::SIGKILL).ok()?;
    // Its pid may be reused once its daemon reaps it: never signalled again.
    let _ = std::fs::remove_file(super::client_workload::pid_file(dir, name));
    Some(name)
}

/// Every client process still running at the end (a failed run) is killed.
fn kill_leftover_clients(dir: &std::path::Path, n: u32, per_daemon: u32) {
    for rank in 0..n {
        for local in 1..=per_daemon {
            let f = super::client_workload::pid_file(dir, tbon::ClientName { rank, local });
            if let Some(pid) = std::fs::read_to_string(f)
                .ok()
                .and_then(|p| p.trim().parse().ok())
            {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
}

/// Seconds the DVM runs on after the attack stops, before it is shut down (the "after"
/// memory sample is taken then).
const ATTACK_AFTER_S: f64 = 3.0;

/// Every daemon's listening address, from the contact URIs in their wired lines.
fn attack_targets(seen: &Seen) -> Result<(Vec<attack::Target>, String), String> {
    let mut out = Vec::new();
    let mut dvm_id = String::from("tbon");
    for (rank, uri) in &seen.uris {
        let u: tbon::oob::uri::ContactUri = uri
            .parse()
            .map_err(|e| format!("rank {rank}'s contact URI: {e}"))?;
        dvm_id = u.dvm_id.clone();
        if let Some(addr) = u.addrs.first() {
            out.push(attack::Target {
                rank: *rank,
                addr: *addr,
            });
        }
    }
    Ok((out, dvm_id))
}

/// Whether the victims of `f` must exit non-zero once resumed (stopped or cut off ones).
pub fn resumable(f: &Fault) -> bool {
    matches!(f.kind, FaultKind::Stop | FaultKind::Cut(_))
}

/// The life of `rank`'s daemon now: 1 once the harness restarted it, else 0.
fn life_now(faults: &[Fault], rank: u32) -> u64 {
    u64::from(
        faults
            .iter()
            .any(|f| f.rank == rank && f.restarted_ns.is_some()),
    )
}

/// A size in bytes: a number, or one with a K, M or G suffix (binary: 4M is 4 MiB).
fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, shift) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 4096, 64K, 4M, 1G)"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// The command-line spelling of a clap value.
pub fn value_name<T: clap::ValueEnum>(v: &T) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_string())
        .unwrap_or_default()
}

fn describe_exit(code: Option<i32>, signal: Option<&i32>) -> String {
    match (code, signal) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => match Signal::try_from(*s) {
            Ok(sig) => format!("killed by {sig}"),
            Err(_) => format!("killed by signal {s}"),
        },
        (None, None) => "killed by a signal".into(),
    }
}

/// The last lines of a daemon's log, for the report.
fn tail(path: &std::path::Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(3);
    if lines.is_empty() {
        "(empty)".into()
    } else {
        lines[start..].join(" | ")
    }
}

/// Removes the run's folder at the end, or with `--keep` says where it is.
struct RemoveDir(PathBuf, bool);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        if self.1 {
            eprintln!("tbon harness: kept the run's folder {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
