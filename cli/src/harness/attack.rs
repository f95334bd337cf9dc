//! `tbon harness --attack`: a stranger without the job key attacks the DVM's listening ports
//! from the harness process while the workload runs, on loopback only.
//!
//! - `flood`: `--attack-connections` connections (bounded by [`CONNECTIONS_MAX`]) spread over
//!   the daemons, a quarter each idle (connect, send nothing), partial (half a header),
//!   Hello-only (a valid-looking Hello, never an Auth) and slow (a Hello one byte per second).
//!   A connection the daemon closes is counted as refused and opened again a second later.
//! - `forge`: for every (daemon, claimed rank) pair, a forged Hello claiming that rank, renewed
//!   every 0.3 s on a new connection (faster than the 5 s handshake timeout), never followed by
//!   an Auth.
//!
//! Worker threads with sockets that connect with a timeout and are then polled without
//! blocking; every count and every wait is bounded, and everything stops when the harness says.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tbon::oob::handshake::encode_identity;
use tbon::oob::header::{Header, Kind};

/// The most flood connections the harness opens.
pub const CONNECTIONS_MAX: usize = 20_000;
/// Flood worker threads.
const WORKERS: usize = 8;
/// How often a worker looks at its connections.
const TICK: Duration = Duration::from_millis(100);
/// A closed or refused flood connection is opened again after this.
const REOPEN_AFTER: Duration = Duration::from_secs(1);
/// How often a forged Hello is renewed per (daemon, claimed rank).
const FORGE_EVERY: Duration = Duration::from_millis(300);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Which attacks to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AttackKind {
    Flood,
    Forge,
}

/// One daemon to attack.
#[derive(Debug, Clone)]
pub struct Target {
    pub rank: u32,
    pub addr: SocketAddr,
}

#[derive(Default)]
struct Stats {
    opened: AtomicU64,
    refused: AtomicU64,
    held: AtomicU64,
    peak_held: AtomicU64,
    forged: AtomicU64,
    forge_refused: AtomicU64,
}

impl Stats {
    fn hold(&self) {
        let now = self.held.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak_held.fetch_max(now, Ordering::Relaxed);
    }
    fn release(&self) {
        self.held.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A running attack.
pub struct Attack {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    stats: Arc<Stats>,
    started: Instant,
}

/// What the attack did, for the report.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Outcome {
    pub kinds: Vec<String>,
    /// Flood connections wanted at once.
    pub connections: usize,
    /// Flood connections opened (reopenings included).
    pub opened: u64,
    /// Flood connections refused (connect failed) or closed by a daemon.
    pub refused: u64,
    /// Flood connections open when the attack stopped, and at most at once.
    pub held_at_end: u64,
    pub peak_held: u64,
    /// Forged Hellos sent, and forged connections refused or closed before their renewal.
    pub forged_hellos: u64,
    pub forge_refused: u64,
    pub seconds: f64,
}

/// Where the attacker's connections come from: `sources` addresses 127.0.0.2, .3, ... (0:
/// 127.0.0.1, the daemons' own address).
fn source(sources: u32, i: usize) -> IpAddr {
    if sources == 0 {
        return IpAddr::V4(Ipv4Addr::LOCALHOST);
    }
    let k = (i as u32 % sources).min(250);
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + k as u8))
}

/// Connects from `from` to `to` (loopback only), with a timeout.
fn connect(from: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    if !to.ip().is_loopback() {
        return Err(std::io::Error::other("the attack targets loopback only"));
    }
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(to),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    if from.is_ipv4() == to.is_ipv4() {
        // Best effort: without it the kernel picks 127.0.0.1.
        let _ = sock.bind(&SocketAddr::new(from, 0).into());
    }
    sock.connect_timeout(&to.into(), CONNECT_TIMEOUT)?;
    let s: TcpStream = sock.into();
    s.set_nonblocking(true)?;
    Ok(s)
}

/// A forged Hello: `claim` says it is rank `claim` dialling `dst`.
fn hello(dvm_id: &str, claim: u32, dst: u32, nonce: u64) -> Vec<u8> {
    let mut n = [0u8; 16];
    n[..8].copy_from_slice(&nonce.to_le_bytes());
    n[8..].copy_from_slice(&(!nonce).to_le_bytes());
    let payload = encode_identity(dvm_id, &n);
    let h = Header {
        kind: Kind::Hello,
        origin: claim,
        dst,
        tag: 0,
        epoch: 1,
        seq: 0,
        len: payload.len() as u32,
        lives: 0,
    };
    let mut v = h.encode().to_vec();
    v.extend_from_slice(&payload);
    v
}

/// Whether the daemon closed `s` (reads and discards what it sent, e.g. a HelloAck).
fn closed(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 1024];
    for _ in 0..4 {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return true,
        }
    }
    false
}

#[derive(Clone, Copy)]
enum Style {
    Idle,
    Partial,
    HelloOnly,
    Slow,
}

struct Slot {
    target: SocketAddr,
    rank: u32,
    from: IpAddr,
    style: Style,
    conn: Option<TcpStream>,
    /// Bytes of the slow Hello already written.
    written: usize,
    next: Instant,
}

impl Attack {
    /// Starts the attacks; `sources` as in [`source`].
    pub fn start(
        kinds: &[AttackKind],
        connections: usize,
        sources: u32,
        targets: &[Target],
        dvm_id: &str,
        size: u32,
    ) -> Attack {
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Stats::default());
        let mut threads = Vec::new();
        let connections = connections.min(CONNECTIONS_MAX);
        if kinds.contains(&AttackKind::Flood) && !targets.is_empty() {
            let per = connections.div_ceil(WORKERS);
            for w in 0..WORKERS {
                let slots: Vec<Slot> = (w * per..((w + 1) * per).min(connections))
                    .map(|i| {
                        let t = &targets[i % targets.len()];
                        Slot {
                            target: t.addr,
                            rank: t.rank,
                            from: source(sources, i / targets.len()),
                            style: match i / targets.len() % 4 {
                                0 => Style::Idle,
                                1 => Style::Partial,
                                2 => Style::HelloOnly,
                                _ => Style::Slow,
                            },
                            conn: None,
                            written: 0,
                            next: Instant::now(),
                        }
                    })
                    .collect();
                let (stop, stats, id) = (stop.clone(), stats.clone(), dvm_id.to_string());
                threads.push(std::thread::spawn(move || {
                    flood(slots, &stop, &stats, &id, size)
                }));
            }
        }
        if kinds.contains(&AttackKind::Forge) {
            let (stop, stats, id) = (stop.clone(), stats.clone(), dvm_id.to_string());
            let targets = targets.to_vec();
            let from = source(sources, 1);
            threads.push(std::thread::spawn(move || {
                forge(&targets, from, &stop, &stats, &id, size)
            }));
        }
        Attack {
            stop,
            threads,
            stats,
            started: Instant::now(),
        }
    }

    /// Stops every attacker thread (they close their connections) and says what they did.
    pub fn stop(self, kinds: &[AttackKind], connections: usize) -> Outcome {
        let held_at_end = self.stats.held.load(Ordering::Relaxed);
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            let _ = t.join();
        }
        let s = &self.stats;
        Outcome {
            kinds: kinds.iter().map(super::value_name).collect(),
            connections: if kinds.contains(&AttackKind::Flood) {
                connections.min(CONNECTIONS_MAX)
            } else {
                0
            },
            opened: s.opened.load(Ordering::Relaxed),
            refused: s.refused.load(Ordering::Relaxed),
            held_at_end,
            peak_held: s.peak_held.load(Ordering::Relaxed),
            forged_hellos: s.forged.load(Ordering::Relaxed),
            forge_refused: s.forge_refused.load(Ordering::Relaxed),
            seconds: self.started.elapsed().as_secs_f64(),
        }
    }
}

fn flood(mut slots: Vec<Slot>, stop: &AtomicBool, stats: &Stats, dvm_id: &str, size: u32) {
    let mut nonce = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let tick = Instant::now();
        for slot in slots.iter_mut() {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let now = Instant::now();
            match &mut slot.conn {
                None if now >= slot.next => {
                    stats.opened.fetch_add(1, Ordering::Relaxed);
                    match connect(slot.from, slot.target) {
                        Ok(mut s) => {
                            nonce += 1;
                            let claim = (slot.rank + 1) % size.max(1);
                            let h = hello(dvm_id, claim, slot.rank, nonce);
                            let first: &[u8] = match slot.style {
                                Style::Idle | Style::Slow => &[],
                                Style::Partial => &h[..20],
                                Style::HelloOnly => &h,
                            };
                            if s.write_all(first).is_ok() {
                                stats.hold();
                                slot.conn = Some(s);
                                slot.written = 0;
                                slot.next = now + Duration::from_secs(1);
                            } else {
                                stats.refused.fetch_add(1, Ordering::Relaxed);
                                slot.next = now + REOPEN_AFTER;
                            }
                        }
                        Err(_) => {
                            stats.refused.fetch_add(1, Ordering::Relaxed);
                            slot.next = now + REOPEN_AFTER;
                        }
                    }
                }
                None => {}
                Some(s) => {
                    let mut gone = closed(s);
                    if !gone && matches!(slot.style, Style::Slow) && now >= slot.next {
                        // One byte per second of a Hello.
                        let h = hello(dvm_id, (slot.rank + 1) % size.max(1), slot.rank, 7);
                        if let Some(b) = h.get(slot.written) {
                            match s.write(std::slice::from_ref(b)) {
                                Ok(n) => slot.written += n,
                                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                                Err(_) => gone = true,
                            }
                        }
                        slot.next = now + Duration::from_secs(1);
                    }
                    if gone {
                        slot.conn = None;
                        stats.release();
                        stats.refused.fetch_add(1, Ordering::Relaxed);
                        slot.next = now + REOPEN_AFTER;
                    }
                }
            }
        }
        if let Some(rest) = TICK.checked_sub(tick.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    for slot in slots.iter_mut() {
        if slot.conn.take().is_some() {
            stats.release();
        }
    }
}

fn forge(
    targets: &[Target],
    from: IpAddr,
    stop: &AtomicBool,
    stats: &Stats,
    dvm_id: &str,
    size: u32,
) {
    // One live forged connection per (daemon, claimed rank), replaced every FORGE_EVERY.
    let mut live: Vec<Option<TcpStream>> = Vec::new();
    let pairs: Vec<(SocketAddr, u32, u32)> = targets
        .iter()
        .flat_map(|t| {
            (0..size)
                .filter(move |r| *r != t.rank)
                .map(move |r| (t.addr, t.rank, r))
        })
        .collect();
    live.resize_with(pairs.len(), || None);
    let mut nonce = 1u64 << 32;
    while !stop.load(Ordering::SeqCst) {
        let round = Instant::now();
        for (i, (addr, dst, claim)) in pairs.iter().enumerate() {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            if let Some(old) = live[i].as_mut()
                && closed(old)
            {
                stats.forge_refused.fetch_add(1, Ordering::Relaxed);
            }
            nonce += 1;
            let fresh = connect(from, *addr).and_then(|mut s| {
                s.write_all(&hello(dvm_id, *claim, *dst, nonce))?;
                Ok(s)
            });
            match fresh {
                Ok(s) => {
                    stats.forged.fetch_add(1, Ordering::Relaxed);
                    // The new Hello first, then the old connection goes.
                    live[i] = Some(s);
                }
                Err(_) => {
                    stats.forge_refused.fetch_add(1, Ordering::Relaxed);
                    live[i] = None;
                }
            }
        }
        if let Some(rest) = FORGE_EVERY.checked_sub(round.elapsed()) {
            std::thread::sleep(rest);
        }
    }
}

/// A process's RssAnon in KiB (`/proc/PID/status`), if it is alive.
pub fn rss_anon_kib(pid: u32) -> Option<u64> {
    super::scale::status_kib(pid, "RssAnon:")
}

/// RssAnon of each daemon: before the attack, its peak during it, and after it ended.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Memory {
    pub before_kib: Option<u64>,
    pub peak_kib: Option<u64>,
    pub after_kib: Option<u64>,
}

/// The attack section of the report: text and JSON.
pub fn render(
    outcome: &Outcome,
    memory: &std::collections::BTreeMap<u32, Memory>,
    log_lines: &std::collections::BTreeMap<u32, usize>,
) -> (String, serde_json::Value) {
    use std::fmt::Write as _;
    let mut t = String::new();
    let _ = writeln!(t, "\n  attack ({})", outcome.kinds.join(", "));
    if outcome.connections > 0 {
        let _ = writeln!(
            t,
            "  flood: {} wanted, {} opened, {} refused or closed by a daemon, {} held at the end (peak {})",
            outcome.connections,
            outcome.opened,
            outcome.refused,
            outcome.held_at_end,
            outcome.peak_held
        );
    }
    if outcome.forged_hellos > 0 {
        let _ = writeln!(
            t,
            "  forge: {} forged Hellos, {} refused or closed before renewal",
            outcome.forged_hellos, outcome.forge_refused
        );
    }
    let _ = writeln!(
        t,
        "  {:<6} {:>12} {:>12} {:>12} {:>10}",
        "rank", "RssAnon KiB", "peak", "after", "log lines"
    );
    let show = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    for (r, m) in memory {
        let _ = writeln!(
            t,
            "  {:<6} {:>12} {:>12} {:>12} {:>10}",
            r,
            show(m.before_kib),
            show(m.peak_kib),
            show(m.after_kib),
            log_lines.get(r).copied().unwrap_or(0)
        );
    }
    let json = serde_json::json!({
        "outcome": outcome,
        "rss_anon_kib": memory.iter().map(|(r, m)| serde_json::json!({
            "rank": r, "before": m.before_kib, "peak": m.peak_kib, "after": m.after_kib,
            "log_lines": log_lines.get(r).copied().unwrap_or(0),
        })).collect::<Vec<_>>(),
    });
    (t, json)
}
