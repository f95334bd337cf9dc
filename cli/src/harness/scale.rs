//! Large DVMs on one machine: the open-file limit raised as far as the machine allows, a run
//! refused up front, with the reason, when its daemons cannot fit (descriptors, tasks, memory,
//! ports), rank 0's peak connections and memory watched during the run, and the wire-up split
//! into its phases.

use std::time::{Duration, Instant};

/// Descriptors a daemon uses beside its connections: listeners, epoll, the waker, stdio, its
/// log, the key file and the odd pipe, with room to spare.
const FDS_BASE: u64 = 64;
/// Threads of one `tbon daemon` under the workload (main, the loop, the sender), and one for a
/// stream fetcher.
const THREADS_PER_DAEMON: u64 = 4;
/// Memory one daemon takes, with its kernel side (socket buffers, stacks, page tables): 2,048
/// daemons under light traffic took 2.6 GiB of MemAvailable here (1.3 MiB each); twice that
/// leaves room for heavier traffic.
const BYTES_PER_DAEMON: u64 = 3 << 20;
/// Sockets one daemon's port and connections take from the local port range: its listener,
/// its report to rank 0, its link to its parent, and a few more for redials and direct links.
const PORTS_PER_DAEMON: u64 = 4;

/// What the run needs and what the machine gives.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Fit {
    /// The open-file limit the daemons inherit (after raising the soft limit to the hard one).
    pub nofile: u64,
    /// What rank 0 needs: one connection per daemon (every report is a dial) and the base.
    pub nofile_needed: u64,
    /// Threads the run starts (daemons' and the harness's own readers) and the machine's cap.
    pub tasks_needed: u64,
    pub tasks_max: Option<u64>,
    /// Bytes the daemons are expected to take and what the machine has available.
    pub memory_needed: u64,
    pub memory_available: Option<u64>,
    /// Local ports the daemons are expected to take and the size of the local port range.
    pub ports_needed: u64,
    pub ports_available: Option<u64>,
}

/// Raises this process's soft open-file limit to its hard limit (the daemons it starts inherit
/// it); returns the soft limit in force afterwards.
pub fn raise_nofile() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(_) => soft,
        },
        Ok((soft, _)) => soft,
        Err(_) => 1024,
    }
}

/// Checks that `daemons` daemons (spread over `hosts` network namespaces, 0: loopback alone)
/// fit this machine, after raising the open-file limit. The error says what does not fit and
/// what to do about it.
pub fn check(daemons: u32, hosts: u32) -> Result<Fit, String> {
    let n = u64::from(daemons);
    let nofile = raise_nofile();
    let read_u64 = |p: &str| -> Option<u64> {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
    };
    let tasks_max = [
        read_u64("/proc/sys/kernel/pid_max"),
        read_u64("/proc/sys/kernel/threads-max"),
    ]
    .into_iter()
    .flatten()
    .min();
    let memory_available = std::fs::read_to_string("/proc/meminfo").ok().and_then(|t| {
        let line = t.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    });
    let ports_available = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| {
            let mut it = t.split_whitespace().map(|x| x.parse::<u64>().ok());
            let (lo, hi) = (it.next()??, it.next()??);
            Some(hi.saturating_sub(lo) + 1)
        });
    let fit = Fit {
        nofile,
        nofile_needed: n + FDS_BASE,
        // The daemons' threads, one reader per daemon in the harness, and a margin for the
        // rest of the machine.
        tasks_needed: n * (THREADS_PER_DAEMON + 1) + 256,
        tasks_max,
        memory_needed: n * BYTES_PER_DAEMON,
        memory_available,
        // Namespaces have their own port ranges; loopback shares one.
        ports_needed: n * PORTS_PER_DAEMON / u64::from(hosts.max(1)),
        ports_available,
    };
    let mut problems = Vec::new();
    if fit.nofile < fit.nofile_needed {
        problems.push(format!(
            "open files: rank 0 holds a connection from every daemon and the harness a pipe \
             to each, so {daemons} daemons need an open-file limit of at least {}, and the \
             hard limit here is {} (raise it: `ulimit -Hn`, /etc/security/limits.conf, or \
             LimitNOFILE= in a systemd unit)",
            fit.nofile_needed, fit.nofile
        ));
    }
    if let Some(max) = fit.tasks_max
        && fit.tasks_needed > max
    {
        problems.push(format!(
            "tasks: {daemons} daemons start about {} threads and this kernel allows {max} \
             (kernel.pid_max, kernel.threads-max)",
            fit.tasks_needed
        ));
    }
    if let Some(avail) = fit.memory_available
        && fit.memory_needed > avail
    {
        problems.push(format!(
            "memory: {daemons} daemons need about {} MiB and {} MiB is available",
            fit.memory_needed >> 20,
            avail >> 20
        ));
    }
    if let Some(avail) = fit.ports_available
        && fit.ports_needed > avail
    {
        problems.push(format!(
            "ports: {daemons} daemons take about {} local ports and the local port range \
             (net.ipv4.ip_local_port_range) has {avail}; spread them with --hosts",
            fit.ports_needed
        ));
    }
    if problems.is_empty() {
        Ok(fit)
    } else {
        Err(format!(
            "{daemons} daemons cannot run on this machine:\n  {}",
            problems.join("\n  ")
        ))
    }
}

/// The heartbeat timeout for `daemons` daemons on this machine when the run sets none: the
/// daemons' default (10 s) up to 1,000 daemons per processor; beyond, 10 ms per daemon per
/// processor (4,096 daemons on 2 cores: 20 s). With thousands of threads runnable per
/// processor a daemon's loop can wait seconds for its turn, and the default timeout then
/// declares live daemons dead: 4,096 daemons here failed that way during wire-up (rank 0
/// itself "stalled longer than half the heartbeat timeout"). Kills are still found at once,
/// by the lost connection; only silent daemons take longer to find.
pub fn overcommitted_heartbeat_timeout_ms(daemons: u32) -> Option<u64> {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get() as u64);
    let per_core = u64::from(daemons) / cores.max(1);
    (per_core > 1_000).then_some(per_core * 10)
}

/// Rank 0 watched during the run: its open sockets (sampled) and its memory (the kernel's
/// high-water mark, read at the end).
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct Rank0 {
    /// Most sockets (listeners and connections) seen open at once.
    pub sockets_peak: u64,
    /// Peak resident memory (VmHWM), KiB, including the mapped binary.
    pub vm_hwm_kib: Option<u64>,
    /// Peak anonymous memory seen (RssAnon, sampled), KiB: the daemon's own.
    pub rss_anon_peak_kib: Option<u64>,
    #[serde(skip)]
    next: Option<Instant>,
}

/// How often rank 0 is sampled (a few milliseconds for thousands of descriptors).
const SAMPLE_EVERY: Duration = Duration::from_millis(250);

impl Rank0 {
    /// Samples rank 0 (`pid`) if a sample is due.
    pub fn sample(&mut self, pid: Option<u32>) {
        let now = Instant::now();
        if self.next.is_some_and(|t| now < t) {
            return;
        }
        self.next = Some(now + SAMPLE_EVERY);
        let Some(pid) = pid else {
            return;
        };
        let dir = format!("/proc/{pid}/fd");
        if let Ok(entries) = std::fs::read_dir(&dir) {
            let sockets = entries
                .flatten()
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))
                })
                .count() as u64;
            self.sockets_peak = self.sockets_peak.max(sockets);
        }
        if let Some(kib) = status_kib(pid, "RssAnon:") {
            self.rss_anon_peak_kib = Some(self.rss_anon_peak_kib.unwrap_or(0).max(kib));
        }
        if let Some(kib) = status_kib(pid, "VmHWM:") {
            self.vm_hwm_kib = Some(kib);
        }
    }
}

/// A field of `/proc/PID/status` in KiB (`field` with its colon), if the process is alive.
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The wire-up's phases, seconds from the first spawn: every daemon running (its first line of
/// code), rank 0 holding every report (its own wired time: it sends the first slices then),
/// and the last daemon wired (its slice applied).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Phases {
    pub launched_s: f64,
    pub reported_s: f64,
    pub wired_s: f64,
}

impl Phases {
    /// From the daemons' start and wired times (CLOCK_MONOTONIC ns) and the first spawn.
    pub fn from(
        spawn_ns: u64,
        started: &std::collections::BTreeMap<u32, u64>,
        wired: &std::collections::BTreeMap<u32, u64>,
    ) -> Option<Phases> {
        let s = |ns: u64| ns.saturating_sub(spawn_ns) as f64 / 1e9;
        Some(Phases {
            launched_s: s(*started.values().max()?),
            reported_s: s(*wired.get(&0)?),
            wired_s: s(*wired.values().max()?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_run_fits_and_an_absurd_one_is_refused_with_reasons() {
        let fit = check(4, 0).unwrap();
        assert!(fit.nofile >= fit.nofile_needed);
        let e = check(u32::MAX, 0).unwrap_err();
        assert!(e.contains("cannot run on this machine"), "{e}");
        assert!(e.contains("open files"), "{e}");
        assert!(e.contains("memory"), "{e}");
    }

    #[test]
    fn rank_0_sampling_sees_this_process() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut r = Rank0::default();
        r.sample(Some(std::process::id()));
        assert!(r.sockets_peak >= 1);
        assert!(r.vm_hwm_kib.is_some_and(|k| k > 0));
        drop(listener);
    }

    #[test]
    fn heartbeats_wait_longer_only_when_thousands_share_a_processor() {
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get() as u32);
        assert_eq!(overcommitted_heartbeat_timeout_ms(1_000 * cores), None);
        assert_eq!(
            overcommitted_heartbeat_timeout_ms(4_000 * cores),
            Some(40_000)
        );
    }

    #[test]
    fn phases_come_from_the_latest_times() {
        let started = [(0, 1_000_000_000), (1, 2_000_000_000)]
            .into_iter()
            .collect();
        let wired = [(0, 2_500_000_000), (1, 3_000_000_000)]
            .into_iter()
            .collect();
        let p = Phases::from(500_000_000, &started, &wired).unwrap();
        assert_eq!((p.launched_s, p.reported_s, p.wired_s), (1.5, 2.0, 2.5));
    }
}
