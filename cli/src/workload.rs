//! The daemon side of `tbon harness`: a deterministic workload a `tbon daemon` runs once wired
//! (hidden `--workload-*` flags), the self-checking payload format, and the results file each
//! daemon writes when it stops.
//!
//! Every payload carries its origin, its per-origin sequence number, its destination, the
//! CLOCK_MONOTONIC time it was sent at (one machine, one clock: comparable across processes)
//! and a checksum over all of it, so the harness can count deliveries, duplicates, reorders,
//! corruption and losses, and measure latency.

use super::group_workload::{Collected, GroupRunner};
use super::stream_workload::{Fetched, Fetcher};
use bytes::Bytes;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tbon::{Handle, Peer, SendError};

/// The tag of plain point-to-point workload messages.
pub const TAG_PLAIN: u32 = 200;
/// The tag of workload broadcasts.
pub const TAG_BCAST: u32 = 201;
/// The tag of workload reliable messages.
pub const TAG_RELIABLE: u32 = 202;
/// The destination returned for a message this daemon does not send (pattern `leaves` on an
/// interior daemon).
pub const DST_NONE: u32 = u32::MAX - 1;
/// In mixed mode, one point-to-point message in this many is sent reliably.
pub const MIXED_RELIABLE_EVERY: u64 = 4;
/// The destination written into a broadcast's payload.
pub const DST_ALL: u32 = u32::MAX;
/// Bytes of the self-describing header at the start of every payload.
pub const HEADER_LEN: usize = 4 + 4 + 8 + 8 + 8;
/// The smallest payload: header plus checksum.
pub const MIN_PAYLOAD: usize = HEADER_LEN + 8;
/// In mixed mode, one message in this many is a broadcast.
pub const MIXED_BCAST_EVERY: u64 = 20;
/// The sequence numbers of a restarted daemon's life `l` start at `l * LIFE_SEQ_STRIDE` (a
/// multiple of the mixed mode's periods, so a life mixes its messages as the first did).
pub const LIFE_SEQ_STRIDE: u64 = 1_000_000_000_000;

/// Nanoseconds on CLOCK_MONOTONIC: the same clock in every process of this machine.
pub fn mono_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(t) => (t.tv_sec() as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(t.tv_nsec() as u64),
        Err(_) => 0,
    }
}

/// Which destinations a daemon's plain sends go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Pattern {
    /// Message i goes to the i-th other rank, round robin: every pair exchanges traffic.
    AllToAll,
    /// Every message goes to the next rank (rank + 1 mod size).
    Ring,
    /// Every message goes to a random other rank (seeded).
    Random,
    /// Three messages in four go to rank 0, the rest to a random other rank.
    Hotspot,
    /// Every message is a broadcast to all daemons.
    Broadcast,
    /// Only the leaves of the initial tree send, each to every other leaf in turn (traffic
    /// that must cross interior daemons); point to point only, no broadcast.
    Leaves,
    /// Messages all-to-all, and every daemon also fetches `--streams` streams of
    /// `--stream-bytes` each from the others, checking every byte (issue "Streams").
    Stream,
    /// Messages all-to-all, and the daemons form random overlapping groups of `--group-size`
    /// whose members run `--group-rounds` group collectives each (allgather, barrier,
    /// broadcast), checking every result (issue "Jobs").
    Group,
}

/// Plain sends, reliable sends, or a mix with broadcasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Unacknowledged point-to-point sends only (plus broadcasts if the pattern is broadcast).
    Plain,
    /// Reliable (RELM) point-to-point sends only (plus broadcasts if the pattern is broadcast):
    /// every message between survivors must arrive, once, in order, faults or not.
    Reliable,
    /// Point-to-point sends with one message in 20 sent as a broadcast instead, and one
    /// point-to-point message in 4 sent reliably.
    Mixed,
}

/// Whether message `seq` of a point-to-point schedule is sent reliably.
pub fn is_reliable(mode: Mode, seq: u64) -> bool {
    match mode {
        Mode::Reliable => true,
        Mode::Mixed => seq % MIXED_RELIABLE_EVERY == 1,
        Mode::Plain => false,
    }
}

/// Whether `r` is a leaf of the failure-free tree.
pub fn is_leaf(radix: u32, size: u32, r: u32) -> bool {
    tbon::routed::Shape::new(radix, size).is_ok_and(|s| s.children(r).next().is_none())
}

/// A payload size or range `MIN..MAX` (inclusive), in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadRange {
    pub min: usize,
    pub max: usize,
}

impl std::str::FromStr for PayloadRange {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parse = |x: &str| {
            x.trim()
                .parse::<usize>()
                .map_err(|e| format!("bad payload size {x:?}: {e}"))
        };
        let (min, max) = match s.split_once("..") {
            Some((a, b)) => (parse(a)?, parse(b.trim_start_matches('='))?),
            None => (parse(s)?, parse(s)?),
        };
        if min > max {
            return Err(format!("payload range {min}..{max} is empty"));
        }
        if min < MIN_PAYLOAD {
            return Err(format!(
                "payloads must be at least {MIN_PAYLOAD} bytes (header and checksum)"
            ));
        }
        Ok(PayloadRange { min, max })
    }
}

impl std::fmt::Display for PayloadRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.min == self.max {
            write!(f, "{}", self.min)
        } else {
            write!(f, "{}..{}", self.min, self.max)
        }
    }
}

/// The hidden daemon flags that turn on the workload (set by `tbon harness`).
#[derive(Debug, Clone, clap::Args)]
pub struct WorkloadArgs {
    /// Run the harness workload once wired, and write results to this file on exit.
    #[arg(long, hide = true)]
    pub workload_out: Option<PathBuf>,
    #[arg(long, hide = true, value_enum, default_value = "all-to-all")]
    pub workload_pattern: Pattern,
    #[arg(long, hide = true, value_enum, default_value = "mixed")]
    pub workload_mode: Mode,
    /// Messages this daemon originates.
    #[arg(long, hide = true, default_value_t = 1000)]
    pub workload_messages: u64,
    /// Messages per second this daemon originates.
    #[arg(long, hide = true, default_value_t = 200.0)]
    pub workload_rate: f64,
    #[arg(long, hide = true, default_value = "64..4096")]
    pub workload_payload: PayloadRange,
    #[arg(long, hide = true, default_value_t = 1)]
    pub workload_seed: u64,
    /// The DVM's radix (pattern `leaves` needs the tree's shape).
    #[arg(long, hide = true, default_value_t = 64)]
    pub workload_radix: u32,
    /// Pattern `stream`: streams this daemon fetches, and the bytes of each.
    #[arg(long, hide = true, default_value_t = 0)]
    pub workload_streams: u64,
    #[arg(long, hide = true, default_value_t = 0)]
    pub workload_stream_bytes: u64,
    /// Pattern `group`: members per group, and collectives each group runs.
    #[arg(long, hide = true, default_value_t = 4)]
    pub workload_group_size: u32,
    #[arg(long, hide = true, default_value_t = 0)]
    pub workload_group_rounds: u64,
    /// Client processes this daemon starts (`client_workload`), the messages each sends, and
    /// the folder where they write their pid and results files.
    #[arg(long, hide = true, default_value_t = 0)]
    pub workload_clients: u32,
    #[arg(long, hide = true, default_value_t = 200)]
    pub workload_client_messages: u64,
    #[arg(long, hide = true)]
    pub workload_client_dir: Option<PathBuf>,
    /// The first sequence number of this daemon's messages: 0, or for a daemon the harness
    /// restarted with `--rejoin`, its life times [`LIFE_SEQ_STRIDE`], so that its messages
    /// are told apart from those of the life that was killed.
    #[arg(long, hide = true, default_value_t = 0)]
    pub workload_seq_base: u64,
    /// Milliseconds between progress lines (the harness lengthens it for large DVMs).
    #[arg(long, hide = true, default_value_t = 250)]
    pub workload_progress_ms: u64,
}

/// splitmix64: a small deterministic generator (no dependency, same sequence everywhere).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// FNV-1a, 64 bits: enough to catch corruption, cheap to compute.
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// Builds a payload of `len` bytes: header, filler derived from (origin, seq), checksum.
pub fn encode(origin: u32, dst: u32, seq: u64, sent_ns: u64, len: usize) -> Bytes {
    let len = len.max(MIN_PAYLOAD);
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&origin.to_le_bytes());
    v.extend_from_slice(&dst.to_le_bytes());
    v.extend_from_slice(&seq.to_le_bytes());
    v.extend_from_slice(&sent_ns.to_le_bytes());
    v.extend_from_slice(&(len as u64).to_le_bytes());
    let mut fill = Rng::new(u64::from(origin) << 40 ^ seq);
    while v.len() < len - 8 {
        v.push(fill.next_u64() as u8);
    }
    let c = checksum(&v);
    v.extend_from_slice(&c.to_le_bytes());
    Bytes::from(v)
}

/// What a received payload says about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded {
    pub origin: u32,
    pub dst: u32,
    pub seq: u64,
    pub sent_ns: u64,
}

/// Decodes and checks a payload; `None` if it is corrupted (bad length or checksum).
pub fn decode(p: &[u8]) -> Option<Decoded> {
    if p.len() < MIN_PAYLOAD {
        return None;
    }
    let (body, sum) = p.split_at(p.len() - 8);
    if checksum(body).to_le_bytes() != sum {
        return None;
    }
    let u32_at = |i: usize| u32::from_le_bytes(p[i..i + 4].try_into().unwrap_or([0; 4]));
    let u64_at = |i: usize| u64::from_le_bytes(p[i..i + 8].try_into().unwrap_or([0; 8]));
    if u64_at(24) != p.len() as u64 {
        return None;
    }
    Some(Decoded {
        origin: u32_at(0),
        dst: u32_at(4),
        seq: u64_at(8),
        sent_ns: u64_at(16),
    })
}

/// The destination of message `seq` from `origin` (`DST_ALL` for a broadcast). The same
/// function is the schedule for every daemon; `rng` is the origin's own seeded generator.
pub fn destination(
    pattern: Pattern,
    mode: Mode,
    origin: u32,
    (radix, size): (u32, u32),
    seq: u64,
    rng: &mut Rng,
) -> u32 {
    if pattern == Pattern::Leaves {
        if !is_leaf(radix, size, origin) {
            return DST_NONE;
        }
        let leaves: Vec<u32> = (0..size)
            .filter(|r| *r != origin && is_leaf(radix, size, *r))
            .collect();
        let n = leaves.len() as u64;
        return match n {
            0 => DST_NONE,
            _ => leaves.get((seq % n) as usize).copied().unwrap_or(DST_NONE),
        };
    }
    if pattern == Pattern::Broadcast
        || (mode == Mode::Mixed && seq % MIXED_BCAST_EVERY == MIXED_BCAST_EVERY - 1)
        || size == 1
    {
        return DST_ALL;
    }
    let other =
        |i: u64| ((u64::from(origin) + 1 + i % u64::from(size - 1)) % u64::from(size)) as u32;
    match pattern {
        Pattern::AllToAll | Pattern::Stream | Pattern::Group => other(seq),
        Pattern::Ring => (origin + 1) % size,
        Pattern::Random => other(rng.below(u64::from(size - 1))),
        Pattern::Hotspot if origin != 0 && rng.below(4) != 0 => 0,
        Pattern::Hotspot => other(rng.below(u64::from(size - 1))),
        Pattern::Broadcast => DST_ALL,
        Pattern::Leaves => DST_NONE,
    }
}

/// What one daemon recorded: its sends, their completion errors, and its receives.
#[derive(Default)]
struct Record {
    /// (seq, dst, sent_ns)
    sent: Vec<(u64, u32, u64)>,
    /// (seq, error): final errors only (a `Busy` is retried, not an error).
    errors: Vec<(u64, String)>,
    /// (seq, submission): every submission of a message, in order; a message's last one is
    /// the one accepted, and sets its place in the per-origin order a receiver must see.
    submits: Vec<(u64, u64)>,
    /// Submissions refused `Busy` and retried.
    busy_retries: u64,
    /// The same refusals by the limit that refused them ([`limit_name`]).
    busy_by: std::collections::BTreeMap<&'static str, u64>,
    /// (tag, origin, seq, sent_ns, recv_ns); for corrupted payloads seq = u64::MAX.
    received: Vec<(u32, u32, u64, u64, u64)>,
}

/// A running workload: the sender thread and the shared record.
pub struct Workload {
    out: PathBuf,
    record: Arc<Mutex<Record>>,
    /// Pattern `stream`: the fetches and their ends.
    streams: Arc<Mutex<Vec<Fetched>>>,
    streams_started: Arc<AtomicU64>,
    streams_ended: Arc<AtomicU64>,
    streams_done: Arc<AtomicBool>,
    /// Pattern `group`: the collectives this daemon took part in, and how they ended.
    groups: Arc<Mutex<Vec<Collected>>>,
    groups_ended: Arc<AtomicU64>,
    groups_done: Arc<AtomicBool>,
    /// Client processes (`--workload-clients`): all exited.
    clients_done: Arc<AtomicBool>,
    received: Arc<AtomicU64>,
    sent: Arc<AtomicU64>,
    completed: Arc<AtomicU64>,
    finished_sending: Arc<AtomicBool>,
    planned: u64,
}

fn lock(r: &Mutex<Record>) -> std::sync::MutexGuard<'_, Record> {
    r.lock().unwrap_or_else(|e| e.into_inner())
}

impl Workload {
    /// Posts the receives now (before wire-up, so nothing is held for long) and returns the
    /// workload; [`Workload::start_sending`] starts the sender once wired.
    pub fn post(args: &WorkloadArgs, h: &Handle) -> Result<Option<Workload>, String> {
        let Some(out) = args.workload_out.clone() else {
            return Ok(None);
        };
        let record = Arc::new(Mutex::new(Record::default()));
        let received = Arc::new(AtomicU64::new(0));
        for tag in [TAG_PLAIN, TAG_BCAST, TAG_RELIABLE] {
            let rec = record.clone();
            let count = received.clone();
            h.recv(Peer::Any, tag, tbon::RecvMode::Persistent, move |m| {
                let now = mono_ns();
                let entry = match decode(&m.payload) {
                    Some(d) if d.origin == m.origin => (tag, d.origin, d.seq, d.sent_ns, now),
                    _ => (tag, m.origin, u64::MAX, 0, now),
                };
                lock(&rec).received.push(entry);
                count.fetch_add(1, Ordering::Relaxed);
            })
            .map_err(|e| e.to_string())?;
        }
        let fetching = args.workload_pattern == Pattern::Stream && args.workload_streams > 0;
        if args.workload_pattern == Pattern::Stream {
            super::stream_workload::serve(h)?;
        }
        Ok(Some(Workload {
            out,
            record,
            streams: Arc::default(),
            streams_started: Arc::default(),
            streams_ended: Arc::default(),
            streams_done: Arc::new(AtomicBool::new(!fetching)),
            groups: Arc::default(),
            groups_ended: Arc::default(),
            groups_done: Arc::new(AtomicBool::new(
                args.workload_pattern != Pattern::Group || args.workload_group_rounds == 0,
            )),
            clients_done: Arc::new(AtomicBool::new(
                args.workload_clients == 0 || args.workload_client_dir.is_none(),
            )),
            received,
            sent: Arc::new(AtomicU64::new(0)),
            completed: Arc::new(AtomicU64::new(0)),
            finished_sending: Arc::new(AtomicBool::new(false)),
            planned: args.workload_messages,
        }))
    }

    /// Starts the sender thread: `messages` sends at `rate` per second, deterministic in
    /// (seed, rank). A send refused `Busy` (back-pressure: a congested next hop, a full
    /// window) is sent again, before any new one, with exponential back-off
    /// ([`RETRY_BACKOFF_MS_MIN`] to [`RETRY_BACKOFF_MS_MAX`]): under overload the schedule
    /// slips and latency grows, but every message is offered until it is accepted.
    pub fn start_sending(&self, args: &WorkloadArgs, h: Handle) {
        let sender = Sender {
            args: args.clone(),
            h,
            rec: self.record.clone(),
            sent: self.sent.clone(),
            completed: self.completed.clone(),
            retry: Arc::new(Mutex::new(std::collections::VecDeque::new())),
            submissions: 0,
        };
        if !self.streams_done.load(Ordering::SeqCst) {
            let rate = args.workload_rate.max(0.001);
            let fetcher = Fetcher {
                h: sender.h.clone(),
                streams: args.workload_streams,
                bytes: args.workload_stream_bytes,
                span: Duration::from_secs_f64(args.workload_messages as f64 / rate),
                seed: args.workload_seed,
                record: self.streams.clone(),
                started: self.streams_started.clone(),
                ended: self.streams_ended.clone(),
                done: self.streams_done.clone(),
            };
            std::thread::spawn(move || fetcher.run());
        }
        if !self.groups_done.load(Ordering::SeqCst) {
            let rate = args.workload_rate.max(0.001);
            let runner = GroupRunner {
                h: sender.h.clone(),
                seed: args.workload_seed,
                group_size: args.workload_group_size,
                rounds: args.workload_group_rounds,
                span: Duration::from_secs_f64(args.workload_messages as f64 / rate),
                record: self.groups.clone(),
                ended: self.groups_ended.clone(),
                done: self.groups_done.clone(),
            };
            std::thread::spawn(move || runner.run());
        }
        if !self.clients_done.load(Ordering::SeqCst)
            && let Some(dir) = args.workload_client_dir.clone()
        {
            let runner = super::client_workload::ClientRunner {
                h: sender.h.clone(),
                rank: sender.h.rank(),
                size: sender.h.size(),
                per_daemon: args.workload_clients,
                messages: args.workload_client_messages,
                rate: args.workload_rate,
                seed: args.workload_seed,
                dir,
                done: self.clients_done.clone(),
            };
            std::thread::spawn(move || runner.run());
        }
        let finished = self.finished_sending.clone();
        std::thread::spawn(move || {
            sender.run();
            finished.store(true, Ordering::SeqCst);
        });
    }

    /// A JSON progress line for the harness, with the daemon's flow-control counters when
    /// given (what a run that lost messages needs to name the cause).
    pub fn progress_line(&self, rank: u32, counters: Option<&tbon::Counters>) -> String {
        let sent = self.sent.load(Ordering::Relaxed);
        let done = self.finished_sending.load(Ordering::SeqCst)
            && self.completed.load(Ordering::Relaxed) >= sent
            && self.streams_done.load(Ordering::SeqCst)
            && self.groups_done.load(Ordering::SeqCst)
            && self.clients_done.load(Ordering::SeqCst);
        serde_json::json!({ "progress": {
            "rank": rank,
            "sent": sent,
            "planned": self.planned,
            "received": self.received.load(Ordering::Relaxed),
            "streams_started": self.streams_started.load(Ordering::Relaxed),
            "streams_ended": self.streams_ended.load(Ordering::Relaxed),
            "group_collectives_ended": self.groups_ended.load(Ordering::Relaxed),
            "done": done,
            "counters": counters.map(|c| serde_json::json!({
                "flow_congested": c.flow_congested,
                "sends_busy_flow": c.sends_busy_flow,
                "dropped_queue_full": c.dropped_queue_full,
                "direct_requests_sent": c.direct.requests_sent,
                "direct_grants": c.direct.grants,
                "direct_denied": c.direct.denied_policy + c.direct.denied_version
                    + c.direct.denied_full + c.direct.denied_other + c.direct.denied_dead
                    + c.direct.denied_timeout,
                "direct_links_opened": c.direct.links_opened,
                "direct_fallbacks": c.direct.fallbacks,
                "direct_links_evicted": c.direct.links_evicted,
                "direct_messages": c.direct.direct_messages,
                "link_resumes": c.link_resumes,
                "link_frames_resent": c.link_frames_resent,
                "link_duplicates_dropped": c.link_duplicates_dropped,
                "link_frames_given_up": c.link_frames_given_up,
                "link_failovers": c.link_failovers,
            })),
        }})
        .to_string()
    }

    /// Writes the results file (atomically). Call after the daemon stopped.
    pub fn write(&self, rank: u32) -> std::io::Result<()> {
        let rec = lock(&self.record);
        let tmp = self.out.with_extension("tmp");
        let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        writeln!(f, "rank {rank}")?;
        for (seq, dst, t) in &rec.sent {
            writeln!(f, "S {seq} {dst} {t}")?;
        }
        for (seq, e) in &rec.errors {
            writeln!(f, "E {seq} {e}")?;
        }
        for (seq, n) in &rec.submits {
            writeln!(f, "O {seq} {n}")?;
        }
        writeln!(f, "B {}", rec.busy_retries)?;
        for (name, n) in &rec.busy_by {
            writeln!(f, "L {name} {n}")?;
        }
        for (tag, origin, seq, t0, t1) in &rec.received {
            writeln!(f, "R {tag} {origin} {seq} {t0} {t1}")?;
        }
        for s in lock_queue(&self.streams).iter() {
            let Fetched {
                index,
                producer,
                expected,
                got,
                outcome,
            } = s;
            writeln!(f, "T {index} {producer} {expected} {got} {outcome}")?;
        }
        for c in lock_queue(&self.groups).iter() {
            let excluded = if c.excluded.is_empty() {
                "-".to_string()
            } else {
                c.excluded
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            };
            writeln!(
                f,
                "G {} {} {} {} {excluded}",
                c.group, c.seq, c.outcome, c.digest
            )?;
        }
        f.flush()?;
        drop(f);
        std::fs::rename(&tmp, &self.out)
    }
}

/// The first back-off after a send refused `Busy`; it doubles while refusals go on. It was
/// 1 ms. At 256 daemons on two cores under overload, about 90 threads were runnable at once
/// and rank 0's loop got 8% of a core. With 4 ms the sender threads wake a quarter as often:
/// the 256-daemon overload run passed 3 of 5 times against 1 of 7 just before. The sample is
/// small (README, "Overload").
pub const RETRY_BACKOFF_MS_MIN: u64 = 4;
/// The longest back-off between retries of refused sends.
pub const RETRY_BACKOFF_MS_MAX: u64 = 64;
/// Messages a daemon's workload has offered whose outcome is not known yet: past this, the
/// schedule waits (a caller's own window, as a real one would keep).
pub const SEND_WINDOW_MAX: u64 = 1_024;

/// A message of the schedule, kept until it is accepted.
#[derive(Clone)]
struct Offer {
    seq: u64,
    dst: u32,
    payload: Bytes,
}

/// The sender thread's state: the schedule, and the messages refused `Busy` to offer again.
struct Sender {
    args: WorkloadArgs,
    h: Handle,
    rec: Arc<Mutex<Record>>,
    sent: Arc<AtomicU64>,
    completed: Arc<AtomicU64>,
    /// Offers refused `Busy` (by their completion), oldest first.
    retry: Arc<Mutex<std::collections::VecDeque<Offer>>>,
    submissions: u64,
}

enum Submitted {
    Accepted,
    Busy,
    ShutDown,
}

impl Sender {
    fn run(mut self) {
        let me = self.h.rank();
        let size = self.h.size();
        let args = self.args.clone();
        let mut rng = Rng::new(args.workload_seed ^ (u64::from(me) << 32) ^ 0x7b0b);
        let span = (args.workload_payload.max - args.workload_payload.min) as u64;
        let start = Instant::now();
        let rate = args.workload_rate.max(0.001);
        let mut backoff_ms = RETRY_BACKOFF_MS_MIN;
        // How many refused messages one pass offers again: halved when refusals continue,
        // doubled when they stop (additive probing would be slower to find room again).
        let mut batch: usize = 1;
        let mut busy_seen = 0;
        let base = args.workload_seq_base;
        let end = base.saturating_add(args.workload_messages);
        let mut seq = base;
        // Waits for completions (window full, or schedule done) grow while none arrives: at
        // 1 ms each, 2,048 daemons waiting through a slow wire-up woke 2 million times a
        // second and starved the machine.
        let mut idle_ms = RETRY_BACKOFF_MS_MIN;
        let mut completed_seen = 0;
        loop {
            let completed_now = self.completed.load(Ordering::Relaxed);
            if completed_now > completed_seen {
                completed_seen = completed_now;
                idle_ms = RETRY_BACKOFF_MS_MIN;
            }
            // Refused messages first, in order, after a back-off that grows while refusals
            // go on (without it the sender and the loop would trade refusals as fast as they
            // can, a storm that takes the CPU the network needs).
            let busy_now = lock(&self.rec).busy_retries;
            let refused_since = busy_now > busy_seen;
            busy_seen = busy_now;
            if refused_since {
                batch = (batch / 2).max(1);
                backoff_ms = (backoff_ms * 2).min(RETRY_BACKOFF_MS_MAX);
            } else {
                batch = batch.saturating_mul(2).min(SEND_WINDOW_MAX as usize);
                backoff_ms = RETRY_BACKOFF_MS_MIN;
            }
            if !lock_queue(&self.retry).is_empty() {
                std::thread::sleep(Duration::from_millis(backoff_ms));
            }
            match self.offer_retries(batch) {
                Submitted::ShutDown => return,
                Submitted::Busy => continue,
                Submitted::Accepted => {}
            }
            let unfinished = self
                .sent
                .load(Ordering::Relaxed)
                .saturating_sub(self.completed.load(Ordering::Relaxed));
            let retrying = !lock_queue(&self.retry).is_empty();
            if seq < end && (unfinished >= SEND_WINDOW_MAX || retrying) {
                // Enough offered and not yet accepted: wait for completions.
                std::thread::sleep(Duration::from_millis(idle_ms));
                idle_ms = (idle_ms * 2).min(RETRY_BACKOFF_MS_MAX);
                continue;
            }
            if seq == end {
                // Schedule done: wait for the last completions (a `Busy` one comes back).
                if self.completed.load(Ordering::Relaxed) >= self.sent.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(idle_ms));
                idle_ms = (idle_ms * 2).min(RETRY_BACKOFF_MS_MAX);
                continue;
            }
            let at = start + Duration::from_secs_f64((seq - base) as f64 / rate);
            if let Some(wait) = at.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let dst = destination(
                args.workload_pattern,
                args.workload_mode,
                me,
                (args.workload_radix, size),
                seq,
                &mut rng,
            );
            let this = seq;
            seq += 1;
            if dst == DST_NONE {
                continue;
            }
            let len = args.workload_payload.min + rng.below(span + 1) as usize;
            let now = mono_ns();
            let offer = Offer {
                seq: this,
                dst,
                payload: encode(me, dst, this, now, len),
            };
            lock(&self.rec).sent.push((this, dst, now));
            self.sent.fetch_add(1, Ordering::Relaxed);
            if let Submitted::ShutDown = self.submit(offer) {
                return;
            }
        }
    }

    /// Offers again up to `batch` of what was refused, oldest first, until one is refused at
    /// once.
    fn offer_retries(&mut self, batch: usize) -> Submitted {
        for _ in 0..batch {
            let Some(offer) = lock_queue(&self.retry).pop_front() else {
                return Submitted::Accepted;
            };
            match self.submit(offer) {
                Submitted::Accepted => {}
                other => return other,
            }
        }
        Submitted::Accepted
    }

    /// Hands one offer to tbon. A refusal at once (the command channel full) puts it back at
    /// the head of the retry queue; a `Busy` completion puts it at the tail.
    fn submit(&mut self, offer: Offer) -> Submitted {
        let n = self.submissions;
        self.submissions += 1;
        lock(&self.rec).submits.push((offer.seq, n));
        let rec = self.rec.clone();
        let done = self.completed.clone();
        let retry = self.retry.clone();
        let again = offer.clone();
        let on_done = move |r: Result<(), SendError>| match r {
            Err(SendError::Busy(limit)) => {
                lock(&rec).refused(limit);
                lock_queue(&retry).push_back(again);
            }
            Err(e) => {
                lock(&rec)
                    .errors
                    .push((again.seq, error_name(&e).to_string()));
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok(()) => {
                done.fetch_add(1, Ordering::Relaxed);
            }
        };
        let (seq, dst) = (offer.seq, offer.dst);
        let r = if dst == DST_ALL {
            self.h
                .broadcast_with(TAG_BCAST, offer.payload.clone(), on_done)
        } else if is_reliable(self.args.workload_mode, seq) {
            self.h
                .send_reliable_with(dst, TAG_RELIABLE, offer.payload.clone(), on_done)
        } else {
            self.h
                .send_with(dst, TAG_PLAIN, offer.payload.clone(), on_done)
        };
        match r {
            Ok(()) => Submitted::Accepted,
            Err(SendError::Busy(limit)) => {
                lock(&self.rec).refused(limit);
                lock_queue(&self.retry).push_front(offer);
                Submitted::Busy
            }
            Err(e) => {
                lock(&self.rec)
                    .errors
                    .push((seq, error_name(&e).to_string()));
                self.completed.fetch_add(1, Ordering::Relaxed);
                if matches!(e, SendError::ShutDown) {
                    Submitted::ShutDown
                } else {
                    Submitted::Accepted
                }
            }
        }
    }
}

impl Record {
    fn refused(&mut self, limit: tbon::error::Limit) {
        self.busy_retries += 1;
        *self.busy_by.entry(limit_name(limit)).or_default() += 1;
    }
}

/// A one-word name of the limit behind a `Busy`, for the results file and the report.
fn limit_name(limit: tbon::error::Limit) -> &'static str {
    use tbon::error::Limit;
    match limit {
        Limit::CommandChannel => "command-channel",
        Limit::NextHopQueue => "next-hop-queue",
        Limit::ClosingDirectLink => "closing-direct-link",
        Limit::ReliableWindow => "reliable-window",
        Limit::BroadcastWindow => "broadcast-window",
        Limit::OutstandingBroadcasts => "outstanding-broadcasts",
        Limit::PrewireQueue => "prewire-queue",
        Limit::LoopThread => "loop-thread",
        _ => "other",
    }
}

fn lock_queue<T>(q: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    q.lock().unwrap_or_else(|e| e.into_inner())
}

fn error_name(e: &SendError) -> &'static str {
    match e {
        SendError::NodeDown(_) => "node-down",
        SendError::Unreachable(_) => "unreachable",
        SendError::Busy(_) => "busy",
        SendError::ShutDown => "shut-down",
        _ => "other",
    }
}

/// One daemon's results, as read back by the harness.
#[derive(Debug, Default)]
pub struct Results {
    pub sent: Vec<(u64, u32, u64)>,
    pub errors: Vec<(u64, String)>,
    /// seq -> its accepted (last) submission number: the order a receiver must see.
    pub order: std::collections::HashMap<u64, u64>,
    /// Submissions refused `Busy` and retried.
    pub busy_retries: u64,
    /// The same refusals by the limit that refused them.
    pub busy_by: std::collections::BTreeMap<String, u64>,
    pub received: Vec<(u32, u32, u64, u64, u64)>,
    /// Pattern `stream`: this daemon's fetches.
    pub streams: Vec<Fetched>,
    /// Pattern `group`: this daemon's group collectives.
    pub groups: Vec<Collected>,
}

/// Reads a results file written by [`Workload::write`].
pub fn read_results(path: &Path) -> Result<Results, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut r = Results::default();
    let bad = |l: &str| format!("{}: bad line {l:?}", path.display());
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split(' ').collect();
        let n = |i: usize| {
            f.get(i)
                .and_then(|x| x.parse::<u64>().ok())
                .ok_or(bad(line))
        };
        match f.first() {
            Some(&"S") => r.sent.push((n(1)?, n(2)? as u32, n(3)?)),
            Some(&"E") => r
                .errors
                .push((n(1)?, f.get(2).unwrap_or(&"other").to_string())),
            Some(&"O") => {
                r.order.insert(n(1)?, n(2)?);
            }
            Some(&"B") => r.busy_retries = n(1)?,
            Some(&"L") => {
                let name = f.get(1).ok_or(bad(line))?.to_string();
                *r.busy_by.entry(name).or_default() += n(2)?;
            }
            Some(&"R") => r
                .received
                .push((n(1)? as u32, n(2)? as u32, n(3)?, n(4)?, n(5)?)),
            Some(&"T") => r.streams.push(Fetched {
                index: n(1)?,
                producer: n(2)? as u32,
                expected: n(3)?,
                got: n(4)?,
                outcome: f.get(5).ok_or(bad(line))?.to_string(),
            }),
            Some(&"G") => r.groups.push(Collected {
                group: n(1)?,
                seq: n(2)?,
                outcome: f.get(3).ok_or(bad(line))?.to_string(),
                digest: n(4)?,
                excluded: match f.get(5) {
                    Some(&"-") | None => Vec::new(),
                    Some(list) => list
                        .split(',')
                        .map(|x| x.parse::<u32>().map_err(|_| bad(line)))
                        .collect::<Result<_, _>>()?,
                },
            }),
            _ => return Err(bad(line)),
        }
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_round_trips_and_detects_corruption() {
        for len in [MIN_PAYLOAD, 64, 4096] {
            let p = encode(3, 7, 42, 123_456, len);
            assert_eq!(p.len(), len);
            let d = decode(&p).unwrap();
            assert_eq!((d.origin, d.dst, d.seq, d.sent_ns), (3, 7, 42, 123_456));
            let mut bad = p.to_vec();
            bad[len / 2] ^= 1;
            assert_eq!(decode(&bad), None);
            assert_eq!(decode(&p[..len - 1]), None);
        }
    }

    #[test]
    fn payload_ranges_parse() {
        assert_eq!(
            "64..4096".parse::<PayloadRange>().unwrap(),
            PayloadRange { min: 64, max: 4096 }
        );
        assert_eq!(
            "100".parse::<PayloadRange>().unwrap(),
            PayloadRange { min: 100, max: 100 }
        );
        assert!("10".parse::<PayloadRange>().is_err());
        assert!("500..100".parse::<PayloadRange>().is_err());
    }

    #[test]
    fn all_to_all_covers_every_other_rank() {
        let mut rng = Rng::new(1);
        let dsts: std::collections::BTreeSet<u32> = (0..7)
            .map(|s| destination(Pattern::AllToAll, Mode::Plain, 2, (64, 8), s, &mut rng))
            .collect();
        assert_eq!(dsts, [0, 1, 3, 4, 5, 6, 7].into_iter().collect());
    }
}
