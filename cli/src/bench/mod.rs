//! `tbon bench`: tbon's message rate, bandwidth, round trip and scale, each beside a raw-TCP
//! (or plain mio) baseline measured in the same run with the same process layout. The
//! orchestrator spawns `current_exe()` as `tbon bench --role <name> ...` for every process.

mod bcast;
pub mod raw;
mod raw_stream;
pub mod roles;
mod streams;
pub mod util;
#[cfg(feature = "zmq")]
mod zeromq;

use serde_json::{Value, json};
use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tbon::Rank;
use tbon::routed::{Route, RoutingState};
use util::{Res, ctx, now_ns, vm_rss_kib};

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// A shorter run (a quarter of the messages, fewer round trips): about 10 s.
    #[arg(long)]
    pub quick: bool,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also write the results as one self-contained HTML page: bar charts of tbon beside each
    /// baseline per payload size and route (the ratio on tbon's bars), the targets, the load.
    #[arg(long, value_name = "FILE.html")]
    pub report: Option<PathBuf>,
    /// Run only these parts (comma-separated): rate, pingpong, scale, direct (two leaves at
    /// depth 3 of a radix-2 tree, over the tree and over a direct link, beside two tree
    /// neighbours), stream (one large stream over a direct link and through one relay, 64
    /// concurrent streams, the round trip during a stream, peak memory; beside raw TCP),
    /// bcast (a 1 MiB broadcast in DVMs of 2, 6, 22 and 64 at radix 4, pipelined in parts and
    /// whole at each level, against one hop).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Rate part: only these payload sizes in bytes (comma-separated; default 64, 4096,
    /// 65536, 1048576).
    #[arg(long, value_delimiter = ',')]
    pub payloads: Vec<usize>,
    /// Rate part: runs of each row, tbon and raw alternating; the median rate of each side is
    /// reported (this machine is shared and noisy: one run of a row varied by a third).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Scale part: these DVM sizes (comma-separated; default 16, 64, 256).
    #[arg(long, value_delimiter = ',')]
    pub scale_sizes: Vec<u32>,
    /// Scale part: each size at each of these radixes (comma-separated; default the daemon's
    /// default radix), for comparing with `tbon sim --sweep-radix` (docs/radix.md).
    #[arg(long, value_delimiter = ',')]
    pub scale_radixes: Vec<u32>,
    #[command(flatten)]
    pub role: RoleArgs,
}

/// Arguments of one bench process (internal; set by the orchestrator).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct RoleArgs {
    #[arg(long, hide = true)]
    pub role: Option<String>,
    #[arg(long, hide = true, default_value_t = 0)]
    pub rank: Rank,
    #[arg(long, hide = true, default_value_t = 1)]
    pub size: u32,
    #[arg(long, hide = true, default_value_t = 0)]
    pub sender: Rank,
    #[arg(long, hide = true, default_value_t = 0)]
    pub receiver: Rank,
    #[arg(long, hide = true, default_value_t = 64)]
    pub payload: usize,
    #[arg(long, hide = true, default_value_t = 1)]
    pub count: u64,
    #[arg(long, hide = true, default_value = ".")]
    pub dir: PathBuf,
    /// Rate test: send with `send_reliable` (RELM) instead of `send`.
    #[arg(long, hide = true)]
    pub reliable: bool,
    /// Rate test with `--reliable`: `send_reliable_with`, a completion per message.
    #[arg(long, hide = true)]
    pub completions: bool,
    /// Rate test: send with `send_batch` (many messages per hand-over to the loop).
    #[arg(long, hide = true)]
    pub batch: bool,
    /// Every daemon's route setting (`tree` when absent).
    #[arg(long, hide = true)]
    pub route: Option<String>,
    /// Scale test: the radix (0: the default).
    #[arg(long, hide = true, default_value_t = 0)]
    pub radix: u32,
    /// Broadcast test: rank 0's `bcast_part_bytes` (absent: the default).
    #[arg(long, hide = true)]
    pub bcast_part_bytes: Option<usize>,
    /// Raw TCP: every frame carries the XXH3 of its payload, computed by the sender and
    /// checked by the receiver (the end-to-end check a tbon stream makes of every chunk).
    #[arg(long, hide = true)]
    pub digest: bool,
    /// Stream test: the consumer fetches with `fetch_callback` (the daemon checks each chunk on
    /// its loop, where its read left it in cache) instead of a `Stream` reader's thread.
    #[arg(long, hide = true)]
    pub callback: bool,
    /// Stream test: the stream's bandwidth alone, as raw TCP's is measured (no round trips
    /// before or beside it).
    #[arg(long, hide = true)]
    pub no_pings: bool,
}

pub fn run(args: BenchArgs) -> Res<i32> {
    if let Some(role) = args.role.role.clone() {
        let a = &args.role;
        match role.as_str() {
            "rate" => roles::rate(a)?,
            "pingpong" => roles::pingpong(a)?,
            "scale" => roles::scale(a)?,
            "bcast" => bcast::role(a)?,
            "stream" => streams::role(a)?,
            "raw-recv" => raw::recv(a)?,
            "raw-relay" => raw::relay(a)?,
            "raw-send" => raw::send(a)?,
            "raw-echo" => raw::echo(a)?,
            "raw-ping" => raw::ping(a)?,
            "raw-stream-produce" => raw_stream::produce(a)?,
            "raw-stream-consume" => raw_stream::consume(a)?,
            #[cfg(feature = "zmq")]
            "zmq-pull" => zeromq::pull(a)?,
            #[cfg(feature = "zmq")]
            "zmq-push" => zeromq::push(a)?,
            other => return Err(format!("unknown role {other}")),
        }
        return Ok(0);
    }
    let mut b = Bench::new(args.quick)?;
    if !args.payloads.is_empty() {
        b.payloads = args.payloads.clone();
    }
    b.repeat = args.repeat.max(1);
    if !args.scale_sizes.is_empty() {
        if let Some(s) = args.scale_sizes.iter().find(|&&s| !(2..=1024).contains(&s)) {
            return Err(format!("--scale-sizes: {s} is not 2 to 1024 daemons"));
        }
        b.scale_sizes = args.scale_sizes.clone();
    }
    if !args.scale_radixes.is_empty() {
        if let Some(k) = args.scale_radixes.iter().find(|&&k| k < 2) {
            return Err(format!("--scale-radixes: a radix is at least 2, not {k}"));
        }
        b.scale_radixes = args.scale_radixes.clone();
    }
    let want = |p: &str| args.only.is_empty() || args.only.iter().any(|o| o == p);
    let mut out = json!({ "quick": args.quick, "load": loadavg() });
    if want("rate") {
        out["rate"] = b.rates()?;
        out["reliable_rate"] = Value::Array(std::mem::take(&mut b.reliable_rows));
        out["link_resend_rate"] = Value::Array(std::mem::take(&mut b.link_rows));
    }
    if want("pingpong") {
        out["pingpong"] = b.pingpong()?;
    }
    if want("direct") {
        out["direct_link"] = b.direct_links()?;
    }
    if want("stream") {
        out["stream"] = b.streams()?;
    }
    if want("scale") {
        out["scale"] = b.scale()?;
    }
    if want("bcast") {
        out["bcast"] = b.bcasts()?;
    }
    out["load_after"] = json!(loadavg());
    out["targets"] = targets(&out);
    print_tables(&out);
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&out).map_err(ctx("json"))?;
        std::fs::write(path, text).map_err(ctx("write json"))?;
    }
    if let Some(path) = &args.report {
        super::report::write(path, &super::report::bench(&out))?;
    }
    let _ = std::fs::remove_dir_all(&b.root);
    Ok(0)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Hops from `s` to `r` minus one: the relays a message crosses.
fn relays(size: u32, radix: u32, s: Rank, r: Rank) -> Option<u32> {
    let mut at = s;
    let mut hops: u32 = 0;
    while at != r && hops <= size {
        let state = RoutingState::new(radix, size, at).ok()?;
        at = match state.route(r) {
            Route::Parent(n) | Route::Child(n) => n,
            _ => return None,
        };
        hops += 1;
    }
    hops.checked_sub(1)
}

/// The smallest radix-2 DVM and a (sender, receiver) pair whose route crosses `want` relays.
fn layout(want: u32) -> Option<(u32, Rank, Rank)> {
    for size in 2..64 {
        for s in (0..size).rev() {
            for r in (0..size).rev() {
                if s != r && relays(size, 2, s, r) == Some(want) {
                    return Some((size, s, r));
                }
            }
        }
    }
    None
}

/// How the rate test's sender sends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `Handle::send`, one call per message.
    Plain,
    /// `Handle::send_batch`.
    Batch,
    /// `Handle::send_reliable`: no completion; the reliable window, refused `Busy` at the
    /// call, is the flow control.
    Reliable,
    /// `Handle::send_reliable_with`: a completion per message.
    ReliableEach,
}

/// Payloads up to this size are also measured with `send_batch`.
const BATCH_PAYLOAD_MAX: usize = 4096;

struct Bench {
    exe: PathBuf,
    root: PathBuf,
    runs: u32,
    quick: bool,
    /// Reliable-versus-plain rate rows, filled by `rates`.
    reliable_rows: Vec<Value>,
    /// Plain sends with link sessions keeping frames (`link_resend`, the default) against
    /// only counting them, filled by `rates`.
    link_rows: Vec<Value>,
    /// The daemons' `link_resend` setting for the runs being made.
    link_resend: bool,
    /// The daemons' `bulk_connection` setting for the runs being made (the stream part makes
    /// one run without, beside the others).
    bulk_connection: bool,
    /// Payload sizes of the rate part.
    payloads: Vec<usize>,
    /// The scale part's sizes and radixes (0: the default radix).
    scale_sizes: Vec<u32>,
    scale_radixes: Vec<u32>,
    /// Runs per rate row (`--repeat`).
    repeat: usize,
}

impl Bench {
    fn new(quick: bool) -> Res<Self> {
        let exe = std::env::current_exe().map_err(ctx("current_exe"))?;
        let root = std::env::temp_dir().join(format!("tbon-bench-{}", std::process::id()));
        std::fs::create_dir_all(&root).map_err(ctx("temp dir"))?;
        Ok(Bench {
            exe,
            root,
            runs: 0,
            quick,
            reliable_rows: Vec::new(),
            link_rows: Vec::new(),
            link_resend: true,
            bulk_connection: true,
            payloads: vec![64, 4096, 65_536, 1 << 20],
            repeat: 3,
            scale_sizes: vec![16, 64, 256],
            scale_radixes: vec![0],
        })
    }

    fn fresh_dir(&mut self) -> Res<PathBuf> {
        self.runs += 1;
        let d = self.root.join(self.runs.to_string());
        std::fs::create_dir_all(&d).map_err(ctx("run dir"))?;
        Ok(d)
    }

    fn spawn(&self, a: &RoleArgs, piped: bool) -> Res<Child> {
        let mut c = Command::new(&self.exe);
        c.arg("bench")
            .arg("--role")
            .arg(a.role.as_deref().unwrap_or(""))
            .args(["--rank", &a.rank.to_string()])
            .args(["--size", &a.size.to_string()])
            .args(["--sender", &a.sender.to_string()])
            .args(["--receiver", &a.receiver.to_string()])
            .args(["--payload", &a.payload.to_string()])
            .args(["--count", &a.count.to_string()])
            .args(a.reliable.then_some("--reliable"))
            .args(a.completions.then_some("--completions"))
            .args(a.batch.then_some("--batch"))
            .args(a.digest.then_some("--digest"))
            .args(a.callback.then_some("--callback"))
            .args(a.no_pings.then_some("--no-pings"))
            .args(a.route.iter().flat_map(|r| ["--route", r.as_str()]))
            .args(["--radix", &a.radix.to_string()])
            .args(
                a.bcast_part_bytes
                    .iter()
                    .flat_map(|p| ["--bcast-part-bytes".to_string(), p.to_string()]),
            )
            .arg("--dir")
            .arg(&a.dir)
            .env("RUST_LOG", "error")
            .env(
                "TBON_LINK_RESEND",
                if self.link_resend { "true" } else { "false" },
            )
            .env(
                "TBON_BULK_CONNECTION",
                if self.bulk_connection {
                    "true"
                } else {
                    "false"
                },
            )
            .stdin(Stdio::null())
            .stdout(if piped { Stdio::piped() } else { Stdio::null() });
        c.spawn().map_err(ctx("spawn bench process"))
    }

    /// Waits for every child (killing them after the guard) and returns the first JSON line
    /// printed by `reporter`.
    fn collect(&self, mut kids: Vec<Child>, reporter: usize) -> Res<Value> {
        let mut text = String::new();
        if let Some(out) = kids.get_mut(reporter).and_then(|k| k.stdout.as_mut()) {
            out.read_to_string(&mut text).map_err(ctx("read report"))?;
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        for k in &mut kids {
            loop {
                match k.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    _ => {
                        let _ = k.kill();
                        let _ = k.wait();
                        break;
                    }
                }
            }
        }
        let line = text
            .lines()
            .next()
            .ok_or("a bench process printed no report")?;
        serde_json::from_str(line).map_err(ctx("parse report"))
    }

    fn count(&self, payload: usize) -> u64 {
        let full: u64 = match payload {
            0..=64 => 2_000_000,
            65..=4096 => 200_000,
            4097..=65_536 => 16_000,
            _ => 1_000,
        };
        if self.quick { full / 4 } else { full }
    }

    fn tbon_rate(&mut self, relays: u32, payload: usize, mode: Mode) -> Res<Value> {
        let (size, sender, receiver) = layout(relays).ok_or("no layout")?;
        self.tbon_rate_between((size, sender, receiver), payload, mode, None)
    }

    /// The rate test from `sender` to `receiver` in a radix-2 DVM of `size`, every daemon
    /// with the route setting `route`.
    fn tbon_rate_between(
        &mut self,
        (size, sender, receiver): (u32, Rank, Rank),
        payload: usize,
        mode: Mode,
        route: Option<&str>,
    ) -> Res<Value> {
        let dir = self.fresh_dir()?;
        let mut kids = Vec::new();
        for rank in 0..size {
            let a = RoleArgs {
                role: Some("rate".into()),
                rank,
                size,
                sender,
                receiver,
                payload,
                count: self.count(payload),
                dir: dir.clone(),
                reliable: matches!(mode, Mode::Reliable | Mode::ReliableEach),
                completions: mode == Mode::ReliableEach,
                batch: mode == Mode::Batch,
                route: route.map(str::to_string),
                radix: 0,
                bcast_part_bytes: None,
                digest: false,
                callback: false,
                no_pings: false,
            };
            kids.push(self.spawn(&a, rank == receiver)?);
        }
        self.collect(kids, receiver as usize)
    }

    fn raw_rate(&mut self, relays: u32, payload: usize) -> Res<Value> {
        self.raw_rate_count(relays, payload, self.count(payload))
    }

    /// Raw TCP: `count` frames of `payload` bytes through `relays` relays.
    fn raw_rate_count(&mut self, relays: u32, payload: usize, count: u64) -> Res<Value> {
        self.raw_rate_with(relays, payload, count, false)
    }

    /// [`raw_rate_count`](Self::raw_rate_count), with each frame's payload hashed by the
    /// sender and checked by the receiver when `digest`.
    fn raw_rate_with(
        &mut self,
        relays: u32,
        payload: usize,
        count: u64,
        digest: bool,
    ) -> Res<Value> {
        let dir = self.fresh_dir()?;
        let base = RoleArgs {
            payload,
            count,
            dir,
            digest,
            ..RoleArgs::default()
        };
        let mut kids = vec![self.spawn(
            &RoleArgs {
                role: Some("raw-recv".into()),
                ..base.clone()
            },
            true,
        )?];
        for i in 1..=relays {
            kids.push(self.spawn(
                &RoleArgs {
                    role: Some("raw-relay".into()),
                    rank: i,
                    ..base.clone()
                },
                false,
            )?);
        }
        kids.push(self.spawn(
            &RoleArgs {
                role: Some("raw-send".into()),
                rank: relays,
                ..base.clone()
            },
            false,
        )?);
        self.collect(kids, 0)
    }

    /// ZeroMQ PUSH/PULL: `count` messages of `payload` bytes between two processes (only when
    /// built with the `zmq` feature; `None` otherwise).
    fn zmq_rate(&mut self, payload: usize) -> Res<Option<Value>> {
        if !cfg!(feature = "zmq") {
            return Ok(None);
        }
        let dir = self.fresh_dir()?;
        let base = RoleArgs {
            payload,
            count: self.count(payload),
            dir,
            ..RoleArgs::default()
        };
        let pull = RoleArgs {
            role: Some("zmq-pull".into()),
            ..base.clone()
        };
        let push = RoleArgs {
            role: Some("zmq-push".into()),
            ..base
        };
        let kids = vec![self.spawn(&pull, true)?, self.spawn(&push, false)?];
        self.collect(kids, 0).map(Some)
    }

    fn rates(&mut self) -> Res<Value> {
        let mut rows = Vec::new();
        for relays in [0, 1, 3] {
            for payload in self.payloads.clone() {
                let rate = |v: &Value| {
                    v["msgs"].as_f64().unwrap_or(0.0) / v["secs"].as_f64().unwrap_or(1.0)
                };
                // Small messages are also sent with `send_batch`, the API for many of them.
                let batching = payload <= BATCH_PAYLOAD_MAX;
                let (mut t, mut b, mut r, mut z) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                for _ in 0..self.repeat {
                    t.push(rate(&self.tbon_rate(relays, payload, Mode::Plain)?));
                    if batching {
                        b.push(rate(&self.tbon_rate(relays, payload, Mode::Batch)?));
                    }
                    r.push(rate(&self.raw_rate(relays, payload)?));
                    // ZeroMQ has no relays of its own: neighbours only.
                    if relays == 0
                        && let Some(v) = self.zmq_rate(payload)?
                    {
                        z.push(rate(&v));
                    }
                }
                let (tm, rm) = (median(&t), median(&r));
                let bm = batching.then(|| median(&b));
                let zm = (!z.is_empty()).then(|| median(&z));
                let gib = |msgs: f64| msgs * payload as f64 / f64::from(1u32 << 30);
                let row = json!({
                    "relays": relays, "payload": payload,
                    "tbon_msgs_per_s": tm, "raw_msgs_per_s": rm,
                    "tbon_gib_per_s": gib(tm), "raw_gib_per_s": gib(rm),
                    "ratio": tm / rm.max(1e-9),
                    "tbon_batch_msgs_per_s": bm,
                    "batch_ratio": bm.map(|b| b / rm.max(1e-9)),
                    "zmq_msgs_per_s": zm,
                    "vs_zmq": zm.map(|z| tm / z.max(1e-9)),
                    "runs": {"tbon": t, "tbon_batch": b, "raw": r, "zmq": z},
                    "load": loadavg(),
                });
                eprintln!("{row}");
                rows.push(row);
            }
        }
        // Reliable sends (RELM) beside plain ones, same layout: the cost of the guarantee. Both
        // without a completion per message (`send` and `send_reliable`), like for like; and
        // reliable sends with one each (`send_reliable_with`), which costs a boxed closure
        // made on the caller's thread and run and freed on the loop's.
        let rate =
            |v: &Value| v["msgs"].as_f64().unwrap_or(0.0) / v["secs"].as_f64().unwrap_or(1.0);
        let mut each = Vec::new();
        for (relays, payload, plain, rel) in self.paired(&[0, 3], &[64, 65_536], |b, r, p| {
            let v = b.tbon_rate(r, p, Mode::Reliable);
            each.push(b.tbon_rate(r, p, Mode::ReliableEach).map(|e| rate(&e)));
            v
        })? {
            let rel_each: Vec<f64> = each
                .drain(..rel.len().min(each.len()))
                .collect::<Res<_>>()?;
            let (pm, rm, em) = (median(&plain), median(&rel), median(&rel_each));
            let row = json!({
                "relays": relays, "payload": payload,
                "plain_msgs_per_s": pm, "reliable_msgs_per_s": rm,
                "ratio": rm / pm.max(1e-9),
                "reliable_each_msgs_per_s": em,
                "each_ratio": em / pm.max(1e-9),
                "runs": {"plain": plain, "reliable": rel, "reliable_each": rel_each},
                "load": loadavg(),
            });
            eprintln!("{row}");
            self.reliable_rows.push(row);
        }
        // Link sessions: what keeping written frames for a resend costs plain sends (the
        // receivers count and acknowledge either way).
        for (relays, payload, kept, counted) in
            self.paired(&[0, 1], &[64, 1 << 20], |b, r, p| {
                b.link_resend = false;
                let v = b.tbon_rate(r, p, Mode::Plain);
                b.link_resend = true;
                v
            })?
        {
            let (km, cm) = (median(&kept), median(&counted));
            let row = json!({
                "relays": relays, "payload": payload,
                "resend_msgs_per_s": km, "no_resend_msgs_per_s": cm,
                "ratio": km / cm.max(1e-9),
                "runs": {"resend": kept, "no_resend": counted},
                "load": loadavg(),
            });
            eprintln!("{row}");
            self.link_rows.push(row);
        }
        Ok(Value::Array(rows))
    }

    /// For each route and payload of the rate part: `--repeat` alternating runs of plain sends
    /// and of `other`, as message rates.
    #[allow(clippy::type_complexity)]
    fn paired(
        &mut self,
        routes: &[u32],
        payloads: &[usize],
        mut other: impl FnMut(&mut Self, u32, usize) -> Res<Value>,
    ) -> Res<Vec<(u32, usize, Vec<f64>, Vec<f64>)>> {
        let rate =
            |v: &Value| v["msgs"].as_f64().unwrap_or(0.0) / v["secs"].as_f64().unwrap_or(1.0);
        let mut out = Vec::new();
        for &relays in routes {
            for &payload in payloads {
                if !self.payloads.contains(&payload) {
                    continue;
                }
                let (mut plain, mut second) = (Vec::new(), Vec::new());
                for _ in 0..self.repeat {
                    plain.push(rate(&self.tbon_rate(relays, payload, Mode::Plain)?));
                    second.push(rate(&other(self, relays, payload)?));
                }
                out.push((relays, payload, plain, second));
            }
        }
        Ok(out)
    }

    /// Alternating tbon / mio runs (the machine is shared and noisy: single runs of either
    /// varied by a fifth within minutes here), `PINGPONG_ROUNDS` of each, 3 with `--quick`.
    /// The ratio reported is the median of each round's tbon p50 over the mio p50 measured
    /// right after it (a paired comparison: the machine's speed drifts between rounds, and
    /// both runs of a round see about the same machine); the runs with the median p50 of each
    /// side are reported beside it, with their own ratio (`p50_ratio_of_medians`).
    fn pingpong(&mut self) -> Res<Value> {
        let rounds = if self.quick { 3 } else { PINGPONG_ROUNDS };
        let mut t_runs = Vec::new();
        let mut r_runs = Vec::new();
        // Link sessions' cost on the round trip: the same tbon run with daemons that only
        // count and acknowledge (`link_resend = false`), alternating with the others.
        let mut counted = Vec::new();
        for _ in 0..rounds {
            let (t, r) = self.pingpong_once()?;
            t_runs.push(t);
            r_runs.push(r);
            self.link_resend = false;
            let c = self.tbon_pingpong((2, 1, 0), None);
            self.link_resend = true;
            counted.push(c?);
        }
        let p50 = |v: &Value| v["p50_us"].as_f64().unwrap_or(0.0);
        let paired: Vec<f64> = t_runs
            .iter()
            .zip(&r_runs)
            .map(|(t, r)| p50(t) / p50(r).max(1e-9))
            .collect();
        let resend_paired: Vec<f64> = t_runs
            .iter()
            .zip(&counted)
            .map(|(t, c)| p50(t) / p50(c).max(1e-9))
            .collect();
        let median_run = |mut v: Vec<Value>| {
            v.sort_by(|a, b| p50(a).total_cmp(&p50(b)));
            v.get(v.len() / 2).cloned().unwrap_or(Value::Null)
        };
        let (t, r, c) = (median_run(t_runs), median_run(r_runs), median_run(counted));
        let row = json!({
            "payload": 64, "tbon": t, "mio": r,
            "p50_ratio": median(&paired),
            "p50_ratios": paired,
            "p50_ratio_of_medians": p50(&t) / p50(&r).max(1e-9),
            "no_resend": c,
            "link_resend_p50_ratio": median(&resend_paired),
            "load": loadavg(),
        });
        eprintln!("{row}");
        Ok(row)
    }

    /// tbon's 64 B round trip from `pinger` to `echoer` in a radix-2 DVM of `size`, every
    /// daemon with the route setting `route`.
    fn tbon_pingpong(
        &mut self,
        (size, pinger, echoer): (u32, Rank, Rank),
        route: Option<&str>,
    ) -> Res<Value> {
        let count = if self.quick { 5_000 } else { 20_000 };
        let dir = self.fresh_dir()?;
        let mut kids = Vec::new();
        for rank in 0..size {
            let a = RoleArgs {
                role: Some("pingpong".into()),
                rank,
                size,
                sender: pinger,
                receiver: echoer,
                payload: 64,
                count,
                dir: dir.clone(),
                route: route.map(str::to_string),
                ..RoleArgs::default()
            };
            kids.push(self.spawn(&a, rank == pinger)?);
        }
        self.collect(kids, pinger as usize)
    }

    fn pingpong_once(&mut self) -> Res<(Value, Value)> {
        let count = if self.quick { 5_000 } else { 20_000 };
        let t = self.tbon_pingpong((2, 1, 0), None)?;
        let dir = self.fresh_dir()?;
        let b = |role: &str| RoleArgs {
            role: Some(role.into()),
            payload: 64,
            count,
            dir: dir.clone(),
            ..RoleArgs::default()
        };
        let kids = vec![
            self.spawn(&b("raw-echo"), false)?,
            self.spawn(&b("raw-ping"), true)?,
        ];
        let r = self.collect(kids, 1)?;
        Ok((t, r))
    }

    /// Issue "Direct links": two leaves at depth 3 of a radix-2 DVM of 15 (ranks 7 and 14,
    /// five relays apart over the tree) over the tree and over a direct link, beside two tree
    /// neighbours (a DVM of 2), in one run: the rate at 64 B and 64 KiB (median of `repeat`
    /// runs each) and the 64 B round trip (median p50 of three runs each).
    fn direct_links(&mut self) -> Res<Value> {
        const LEAVES: (u32, Rank, Rank) = (15, 7, 14);
        let neighbours = layout(0).ok_or("no layout")?;
        let rate =
            |v: &Value| v["msgs"].as_f64().unwrap_or(0.0) / v["secs"].as_f64().unwrap_or(1.0);
        let mut rows = Vec::new();
        for payload in [64usize, 65_536] {
            let (mut n, mut t, mut d) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..self.repeat {
                n.push(rate(&self.tbon_rate_between(
                    neighbours,
                    payload,
                    Mode::Plain,
                    None,
                )?));
                t.push(rate(&self.tbon_rate_between(
                    LEAVES,
                    payload,
                    Mode::Plain,
                    None,
                )?));
                d.push(rate(&self.tbon_rate_between(
                    LEAVES,
                    payload,
                    Mode::Plain,
                    Some("direct"),
                )?));
            }
            let (nm, tm, dm) = (median(&n), median(&t), median(&d));
            let row = json!({
                "payload": payload,
                "neighbours_msgs_per_s": nm, "leaves_tree_msgs_per_s": tm,
                "leaves_direct_msgs_per_s": dm,
                "direct_vs_neighbours": dm / nm.max(1e-9),
                "direct_vs_tree": dm / tm.max(1e-9),
                "runs": {"neighbours": n, "tree": t, "direct": d},
                "load": loadavg(),
            });
            eprintln!("{row}");
            rows.push(row);
        }
        let p50 = |v: &Value| v["p50_us"].as_f64().unwrap_or(0.0);
        let (mut n, mut t, mut d) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..3 {
            n.push(self.tbon_pingpong((2, 1, 0), None)?);
            t.push(self.tbon_pingpong(LEAVES, None)?);
            d.push(self.tbon_pingpong(LEAVES, Some("direct"))?);
        }
        let mid = |mut v: Vec<Value>| {
            v.sort_by(|a, b| p50(a).total_cmp(&p50(b)));
            v.get(v.len() / 2).cloned().unwrap_or(Value::Null)
        };
        let firsts: Vec<f64> = d.iter().filter_map(|v| v["first_us"].as_f64()).collect();
        let (n, t, d) = (mid(n), mid(t), mid(d));
        let round_trip = json!({
            "neighbours": n, "leaves_tree": t, "leaves_direct": d,
            "direct_vs_neighbours": p50(&d) / p50(&n).max(1e-9),
            // The first ping asks for the link: how many tree round trips it took beyond one.
            "first_message_extra_tree_rtts": (median(&firsts) - p50(&t)) / p50(&t).max(1e-9),
            "load": loadavg(),
        });
        eprintln!("{round_trip}");
        Ok(json!({ "rate": rows, "round_trip": round_trip }))
    }

    fn scale_one(&mut self, size: u32, radix: u32) -> Res<Value> {
        let dir = self.fresh_dir()?;
        let rounds = if self.quick { 20 } else { 100 };
        let t0 = now_ns();
        let mut kids = Vec::new();
        for rank in 0..size {
            let a = RoleArgs {
                role: Some("scale".into()),
                rank,
                size,
                count: rounds,
                dir: dir.clone(),
                radix,
                ..RoleArgs::default()
            };
            kids.push(self.spawn(&a, rank == 0)?);
        }
        let report = dir.join("report");
        let deadline = Instant::now() + Duration::from_secs(60);
        let lines: Vec<(u128, u128)> = loop {
            let text = std::fs::read_to_string(&report).unwrap_or_default();
            let lines: Vec<(u128, u128)> = text
                .lines()
                .filter_map(|l| {
                    let mut w = l.split_whitespace().skip(1).map(|x| x.parse().ok());
                    Some((w.next()??, w.next()??))
                })
                .collect();
            if lines.len() == size as usize || Instant::now() > deadline {
                break lines;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let last_start = lines.iter().map(|l| l.0).max().unwrap_or(t0);
        let last_wired = lines.iter().map(|l| l.1).max().unwrap_or(t0);
        let rss = kids.last().and_then(|k| vm_rss_kib(k.id()));
        util::write_atomically(&dir.join("go"), "go")?;
        let b = self.collect(kids, 0)?;
        let radix = if radix == 0 {
            tbon::config::Config::default().radix
        } else {
            radix
        };
        let row = json!({
            "daemons": size,
            "radix": radix,
            "wired": lines.len(),
            "launch_to_all_wired_ms": (last_wired.saturating_sub(t0)) as f64 / 1e6,
            "last_start_to_all_wired_ms": (last_wired.saturating_sub(last_start)) as f64 / 1e6,
            "idle_rss_kib": rss.map(|r| r.0),
            "idle_rss_anon_kib": rss.map(|r| r.1),
            "bcast_rtt": b,
            "load": loadavg(),
        });
        eprintln!("{row}");
        Ok(row)
    }

    fn scale(&mut self) -> Res<Value> {
        let mut rows = Vec::new();
        for size in self.scale_sizes.clone() {
            for radix in self.scale_radixes.clone() {
                rows.push(self.scale_one(size, radix)?);
            }
        }
        Ok(Value::Array(rows))
    }
}

fn print_tables(out: &Value) {
    println!(
        "load average (1/5/15 min): before {}, after {}",
        out["load"], out["load_after"]
    );
    if let Some(rows) = out["targets"].as_array().filter(|r| !r.is_empty()) {
        println!("\n| issue \"Performance\" row | measured | target | met |");
        println!("|---|---|---|---|");
        for r in rows {
            println!(
                "| {} | {} | {} | {} |",
                r["what"].as_str().unwrap_or(""),
                r["measured"].as_str().unwrap_or(""),
                r["target"].as_str().unwrap_or(""),
                if r["met"].as_bool() == Some(true) {
                    "yes"
                } else {
                    "no"
                }
            );
        }
    }
    if let Some(rows) = out["rate"].as_array() {
        println!(
            "\n| route | payload | tbon msg/s | tbon send_batch msg/s | raw msg/s | tbon GiB/s | raw GiB/s | tbon/raw | send_batch/raw |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        for r in rows {
            let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
            let route = match r["relays"].as_u64() {
                Some(0) => "neighbour".to_string(),
                Some(n) => format!("{n} relay{}", if n == 1 { "" } else { "s" }),
                None => "?".into(),
            };
            let batch = r["tbon_batch_msgs_per_s"]
                .as_f64()
                .map_or("-".to_string(), |v| format!("{v:.3e}"));
            let batch_ratio = r["batch_ratio"]
                .as_f64()
                .map_or("-".to_string(), |v| format!("{:.0}%", 100.0 * v));
            println!(
                "| {route} | {} | {:.3e} | {batch} | {:.3e} | {:.2} | {:.2} | {:.0}% | {batch_ratio} |",
                size_name(r["payload"].as_u64().unwrap_or(0)),
                f("tbon_msgs_per_s"),
                f("raw_msgs_per_s"),
                f("tbon_gib_per_s"),
                f("raw_gib_per_s"),
                100.0 * f("ratio"),
            );
        }
    }
    if let Some(rows) = out["rate"].as_array() {
        let zmq: Vec<&Value> = rows
            .iter()
            .filter(|r| r["zmq_msgs_per_s"].is_f64())
            .collect();
        if !zmq.is_empty() {
            println!(
                "\n| neighbours: payload | tbon msg/s (one call each) | ZeroMQ PUSH/PULL msg/s | tbon/ZeroMQ |"
            );
            println!("|---|---|---|---|");
            for r in zmq {
                let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
                println!(
                    "| {} | {:.3e} | {:.3e} | {:.2}x |",
                    size_name(r["payload"].as_u64().unwrap_or(0)),
                    f("tbon_msgs_per_s"),
                    f("zmq_msgs_per_s"),
                    f("vs_zmq"),
                );
            }
        }
    }
    if let Some(rows) = out["reliable_rate"].as_array() {
        println!(
            "\n| route | payload | plain msg/s | reliable msg/s | reliable/plain | reliable with a completion each msg/s | with completions/plain |"
        );
        println!("|---|---|---|---|---|---|---|");
        for r in rows {
            let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
            println!(
                "| {} relays | {} | {:.3e} | {:.3e} | {:.0}% | {:.3e} | {:.0}% |",
                r["relays"],
                size_name(r["payload"].as_u64().unwrap_or(0)),
                f("plain_msgs_per_s"),
                f("reliable_msgs_per_s"),
                100.0 * f("ratio"),
                f("reliable_each_msgs_per_s"),
                100.0 * f("each_ratio"),
            );
        }
    }
    if let Some(rows) = out["link_resend_rate"].as_array().filter(|r| !r.is_empty()) {
        println!(
            "\n| link sessions: route | payload | keeping frames (default) msg/s | counting only (link_resend = false) msg/s | keeping/counting |"
        );
        println!("|---|---|---|---|---|");
        for r in rows {
            let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
            println!(
                "| {} relays | {} | {:.3e} | {:.3e} | {:.0}% |",
                r["relays"],
                size_name(r["payload"].as_u64().unwrap_or(0)),
                f("resend_msgs_per_s"),
                f("no_resend_msgs_per_s"),
                100.0 * f("ratio"),
            );
        }
    }
    if let Some(rows) = out["direct_link"]["rate"].as_array() {
        println!(
            "\n| direct links: payload | tree neighbours msg/s | leaves over the tree msg/s | leaves over a direct link msg/s | link/neighbours | link/tree |"
        );
        println!("|---|---|---|---|---|---|");
        for r in rows {
            let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
            println!(
                "| {} | {:.3e} | {:.3e} | {:.3e} | {:.0}% | {:.0}% |",
                size_name(r["payload"].as_u64().unwrap_or(0)),
                f("neighbours_msgs_per_s"),
                f("leaves_tree_msgs_per_s"),
                f("leaves_direct_msgs_per_s"),
                100.0 * f("direct_vs_neighbours"),
                100.0 * f("direct_vs_tree"),
            );
        }
        let rt = &out["direct_link"]["round_trip"];
        let p = |k: &str, q: &str| rt[k][q].as_f64().unwrap_or(0.0);
        println!(
            "\n| direct links: 64 B round trip | p50 µs | p99 µs |\n|---|---|---|\n| tree neighbours | {:.1} | {:.1} |\n| leaves over the tree | {:.1} | {:.1} |\n| leaves over a direct link | {:.1} | {:.1} |",
            p("neighbours", "p50_us"),
            p("neighbours", "p99_us"),
            p("leaves_tree", "p50_us"),
            p("leaves_tree", "p99_us"),
            p("leaves_direct", "p50_us"),
            p("leaves_direct", "p99_us"),
        );
        println!(
            "first ping to a new direct peer (it asks for the link): {:.0} µs",
            p("leaves_direct", "first_us")
        );
    }
    if let Some(rows) = out["bcast"].as_array() {
        bcast::print(rows);
    }
    let st = &out["stream"];
    if st.is_object() {
        let f = |k: &str| st[k].as_f64().unwrap_or(0.0);
        println!(
            "\n| streams ({}) | GiB/s | raw TCP GiB/s | vs raw |\n|---|---|---|---|",
            size_name(st["big_bytes"].as_u64().unwrap_or(0))
        );
        println!(
            "| one stream over a direct link, read by a `Stream` reader's thread | {:.2} | {:.2} | {:.0}% |",
            f("direct_gib_per_s"),
            f("raw_gib_per_s"),
            100.0 * f("direct_vs_raw")
        );
        println!(
            "| the same with `fetch_callback` (the daemon checks each chunk on its loop) | {:.2} | {:.2} | {:.0}% |",
            f("callback_gib_per_s"),
            f("raw_gib_per_s"),
            100.0 * f("callback_vs_raw")
        );
        println!(
            "| raw TCP with the stream's end-to-end check (XXH3 of every MiB, made and checked) | {:.2} | {:.2} | {:.0}% |",
            f("raw_digest_gib_per_s"),
            f("raw_gib_per_s"),
            100.0 * f("raw_digest_vs_raw")
        );
        println!(
            "| one stream through one relay (`fetch_callback`) | {:.2} | {:.2} (raw relay {:.2}) | {:.0}% |",
            f("relay_gib_per_s"),
            f("raw_gib_per_s"),
            f("raw_relay_gib_per_s"),
            100.0 * f("relay_vs_raw")
        );
        println!(
            "| 64 concurrent streams ({} each), direct link | {:.2} | {:.2} | {:.0}% |",
            size_name(st["many"]["bytes"].as_u64().unwrap_or(0) / 64),
            st["many"]["gib_per_s"].as_f64().unwrap_or(0.0),
            f("raw_gib_per_s"),
            100.0 * f("many_vs_raw")
        );
        println!(
            "The rows above measure each stream alone, as raw TCP's is measured. The round trips \
             below come from runs with 64 B pings before and beside the stream."
        );
        println!(
            "64 B round trip on the link: idle p50 {:.1} µs; during the stream p50 {:.1} µs, p99 {:.1} µs ({:.2}x; the stream {:.2} GiB/s meanwhile)",
            f("idle_rtt_p50_us"),
            f("stream_rtt_p50_us"),
            f("stream_rtt_p99_us"),
            f("rtt_ratio"),
            f("direct_pinged_gib_per_s")
        );
        let raw = |m: &str, k: &str| st["raw_rtt"][m][k].as_f64().unwrap_or(0.0);
        println!(
            "  raw TCP between two processes, a raw stream running: the pings on a connection of \
             their own idle p50 {:.1} µs, during {:.1} µs ({:.2}x, this machine's floor); on the \
             stream's connection idle {:.1} µs, during {:.1} µs ({:.2}x)",
            raw("two_connections", "idle_rtt_p50_us"),
            raw("two_connections", "stream_rtt_p50_us"),
            st["raw_rtt"]["two_ratio"].as_f64().unwrap_or(0.0),
            raw("one_connection", "idle_rtt_p50_us"),
            raw("one_connection", "stream_rtt_p50_us"),
            st["raw_rtt"]["one_ratio"].as_f64().unwrap_or(0.0),
        );
        let cb = |k: &str| st["callback"][k].as_f64().unwrap_or(0.0);
        println!(
            "  with fetch_callback (the loop checks the chunks): round trip idle p50 {:.1} µs, \
             during the stream {:.1} µs ({:.2}x; the stream {:.2} GiB/s meanwhile)",
            cb("idle_rtt_p50_us"),
            cb("stream_rtt_p50_us"),
            cb("stream_rtt_p50_us") / cb("idle_rtt_p50_us").max(1e-9),
            f("callback_pinged_gib_per_s")
        );
        let off = |k: &str| st["without_bulk_connection"][k].as_f64().unwrap_or(0.0);
        println!(
            "  the same stream with bulk_connection = false (stream data on the link, in this run): \
             {:.2} GiB/s; round trip idle p50 {:.1} µs, during the stream {:.1} µs ({:.2}x)",
            off("gib_per_s"),
            off("idle_rtt_p50_us"),
            off("stream_rtt_p50_us"),
            off("stream_rtt_p50_us") / off("idle_rtt_p50_us").max(1e-9)
        );
        let big = |k: &str| st["big"][k].as_f64().unwrap_or(0.0);
        println!(
            "  its two ways (p50; one clock, same host): the ping to the producer (no stream data on \
             that way) idle {:.1} µs, during the stream {:.1} µs; the pong back behind the data \
             idle {:.1} µs, during {:.1} µs, of which the pinging thread's wake-up after the \
             loop handed it the pong idle {:.1} µs, during {:.1} µs",
            big("idle_there_p50_us"),
            big("stream_there_p50_us"),
            big("idle_back_p50_us"),
            big("stream_back_p50_us"),
            big("idle_wake_p50_us"),
            big("stream_wake_p50_us")
        );
        let hwm = |v: &Value, k: &str| v[k].as_u64().unwrap_or(0);
        println!(
            "peak resident memory (VmHWM) producer / consumer: {} stream {} / {} KiB; {} stream {} / {} KiB",
            size_name(st["small"]["bytes"].as_u64().unwrap_or(0)),
            hwm(&st["small"], "producer_hwm_kib"),
            hwm(&st["small"], "consumer_hwm_kib"),
            size_name(st["big"]["bytes"].as_u64().unwrap_or(0)),
            hwm(&st["big"], "producer_hwm_kib"),
            hwm(&st["big"], "consumer_hwm_kib"),
        );
    }
    let pp = &out["pingpong"];
    if pp.is_object() {
        println!("\n| round trip, 64 B | p50 µs | p99 µs |");
        println!("|---|---|---|");
        for (name, k) in [("tbon", "tbon"), ("plain mio, same wake-ups", "mio")] {
            println!(
                "| {name} | {:.1} | {:.1} |",
                pp[k]["p50_us"].as_f64().unwrap_or(0.0),
                pp[k]["p99_us"].as_f64().unwrap_or(0.0)
            );
        }
        let ratios: Vec<String> = pp["p50_ratios"]
            .as_array()
            .map(|v| {
                v.iter()
                    .map(|x| format!("{:.2}", x.as_f64().unwrap_or(0.0)))
                    .collect()
            })
            .unwrap_or_default();
        println!(
            "p50 tbon/mio: {:.2}x (median of each round's ratio; rounds: {}; the median runs \
             above: {:.2}x)",
            pp["p50_ratio"].as_f64().unwrap_or(0.0),
            ratios.join(", "),
            pp["p50_ratio_of_medians"].as_f64().unwrap_or(0.0)
        );
        if let Some(r) = pp["link_resend_p50_ratio"].as_f64() {
            println!(
                "link sessions: p50 keeping frames (default) {:.1} µs, counting only \
                 (link_resend = false) {:.1} µs: {:.2}x (median of each round's ratio)",
                pp["tbon"]["p50_us"].as_f64().unwrap_or(0.0),
                pp["no_resend"]["p50_us"].as_f64().unwrap_or(0.0),
                r
            );
        }
    }
    if let Some(rows) = out["scale"].as_array() {
        println!(
            "\n| daemons | radix | launch → all wired ms | last start → all wired ms | broadcast originate → complete p50 / p99 µs | allgather p50 / p99 µs | `tbon status` (tool) p50 / p99 µs | idle daemon VmRSS / RssAnon KiB |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        for r in rows {
            println!(
                "| {} | {} | {:.0} | {:.0} | {:.0} / {:.0} | {:.0} / {:.0} | {:.0} / {:.0} | {} / {} |",
                r["daemons"],
                r["radix"],
                r["launch_to_all_wired_ms"].as_f64().unwrap_or(0.0),
                r["last_start_to_all_wired_ms"].as_f64().unwrap_or(0.0),
                r["bcast_rtt"]["p50_us"].as_f64().unwrap_or(0.0),
                r["bcast_rtt"]["p99_us"].as_f64().unwrap_or(0.0),
                r["bcast_rtt"]["allgather_p50_us"].as_f64().unwrap_or(0.0),
                r["bcast_rtt"]["allgather_p99_us"].as_f64().unwrap_or(0.0),
                r["bcast_rtt"]["status_p50_us"].as_f64().unwrap_or(0.0),
                r["bcast_rtt"]["status_p99_us"].as_f64().unwrap_or(0.0),
                r["idle_rss_kib"],
                r["idle_rss_anon_kib"]
            );
        }
        // The data exchange (issue "Jobs"), beside the 64 B round trip when it ran.
        let rtt = out["pingpong"]["tbon"]["p50_us"].as_f64();
        println!(
            "\n| daemons | full fence, 1 KiB each, p50 / p99 µs | direct get: first (fetch) p50 µs | cached get p50 µs | first / cached vs 64 B round trip |"
        );
        println!("|---|---|---|---|---|");
        for r in rows {
            let b = &r["bcast_rtt"];
            let (first, cached) = (
                b["get_first_p50_us"].as_f64().unwrap_or(0.0),
                b["get_cached_p50_us"].as_f64().unwrap_or(0.0),
            );
            println!(
                "| {} | {:.0} / {:.0} | {first:.0} | {cached:.1} | {} |",
                r["daemons"],
                b["fence_full_p50_us"].as_f64().unwrap_or(0.0),
                b["fence_full_p99_us"].as_f64().unwrap_or(0.0),
                rtt.map_or("(run the pingpong part)".to_string(), |t| format!(
                    "{:.2}x / {:.2}x",
                    first / t,
                    cached / t
                ))
            );
        }
    }
}

/// The rows of issue "Performance" that this run measured: (what, measured, target, met).
/// A row whose part was not run (`--only`) is left out.
fn targets(out: &Value) -> Value {
    let rate = |relays: u64, payload: u64, key: &str| -> Option<f64> {
        out["rate"].as_array()?.iter().find_map(|r| {
            (r["relays"].as_u64() == Some(relays) && r["payload"].as_u64() == Some(payload))
                .then(|| r[key].as_f64())
                .flatten()
        })
    };
    let mut rows = Vec::new();
    let mut at_least = |what: &str, v: Option<f64>, target: f64| {
        if let Some(v) = v {
            rows.push(
                json!({"what": what, "measured": format!("{:.0}%", 100.0 * v),
                "target": format!("at least {:.0}%", 100.0 * target), "met": v >= target}),
            );
        }
    };
    at_least(
        "64 B neighbour rate (send_batch) vs raw batched TCP",
        rate(0, 64, "batch_ratio"),
        0.40,
    );
    at_least(
        "64 B neighbour rate (one send call each) vs raw batched TCP",
        rate(0, 64, "ratio"),
        0.40,
    );
    at_least(
        "64 B through 1 relay vs neighbours",
        rate(1, 64, "tbon_msgs_per_s")
            .zip(rate(0, 64, "tbon_msgs_per_s"))
            .map(|(a, b)| a / b.max(1e-9)),
        0.70,
    );
    let reliable = out["reliable_rate"].as_array().and_then(|rows| {
        rows.iter().find_map(|r| {
            (r["relays"].as_u64() == Some(0) && r["payload"].as_u64() == Some(64))
                .then(|| r["ratio"].as_f64())
                .flatten()
        })
    });
    at_least("reliable vs plain, 64 B neighbours", reliable, 0.50);
    at_least(
        "1 MiB neighbours vs raw TCP",
        rate(0, 1 << 20, "ratio"),
        0.90,
    );
    if let Some(rows) = out["direct_link"]["rate"].as_array() {
        for r in rows {
            let what = format!(
                "{} direct link between depth-3 leaves vs tree neighbours (issue \"Direct links\")",
                size_name(r["payload"].as_u64().unwrap_or(0))
            );
            at_least(&what, r["direct_vs_neighbours"].as_f64(), 0.90);
        }
    }
    let rtt = &out["direct_link"]["round_trip"];
    if let Some(v) = rtt["direct_vs_neighbours"].as_f64() {
        rows.push(
            json!({"what": "64 B round trip (p50), direct link between leaves vs tree neighbours",
            "measured": format!("{v:.2}x"), "target": "at most 1.10x", "met": v <= 1.10}),
        );
    }
    if let Some(v) = rtt["first_message_extra_tree_rtts"].as_f64() {
        rows.push(json!({"what": "first message to a new direct peer: delay beyond one tree round trip",
            "measured": format!("{v:.2} tree round trips"), "target": "at most 2", "met": v <= 2.0}));
    }
    if let Some(v) = rate(0, 64, "vs_zmq") {
        rows.push(
            json!({"what": "64 B neighbour rate (one send call each) vs ZeroMQ PUSH/PULL",
            "measured": format!("{v:.2}x"), "target": "at least 2x", "met": v >= 2.0}),
        );
    }
    if let Some(v) = out["pingpong"]["p50_ratio"].as_f64() {
        rows.push(json!({"what": "64 B round trip (p50) vs plain mio",
            "measured": format!("{v:.2}x"), "target": "at most 1.10x", "met": v <= 1.10}));
    }
    if let Some(scale) = out["scale"].as_array() {
        let anon: Vec<(u64, u64)> = scale
            .iter()
            .filter_map(|r| Some((r["daemons"].as_u64()?, r["idle_rss_anon_kib"].as_u64()?)))
            .collect();
        if let Some(&(n, kib)) = anon.first() {
            rows.push(json!({"what": format!("idle daemon's own memory (RssAnon, DVM of {n})"),
                "measured": format!("{kib} KiB"), "target": "at most 1024 KiB", "met": kib <= 1024}));
        }
        if let (Some(&(n0, k0)), Some(&(n1, k1))) = (anon.first(), anon.last())
            && n1 > n0
        {
            let per = (k1 as f64 - k0 as f64) * 1024.0 / (n1 - n0) as f64;
            rows.push(
                json!({"what": format!("memory per daemon in the DVM (RssAnon, {n0} to {n1})"),
                "measured": format!("{per:.0} B"), "target": "reported", "met": true}),
            );
        }
        if let Some(r) = scale.last()
            && let Some(us) = r["bcast_rtt"]["status_p99_us"].as_f64()
        {
            rows.push(json!({"what": format!("`tbon status` over {} daemons, p99 (issue \"Operating a live DVM\")", r["daemons"]),
                "measured": format!("{:.1} ms", us / 1000.0), "target": "under 500 ms", "met": us < 500_000.0}));
        }
    }
    let st = &out["stream"];
    if st.is_object() {
        // The two bandwidth rows fetch with `fetch_callback`: the stream's transport, with no
        // thread of the application's between the daemon and the data. A `Stream` reader's
        // thread (one more hand-over per chunk, and its own pass over the bytes) is reported.
        for (what, k, target) in [
            (
                "one stream over a direct link vs raw TCP (issue \"Streams\"; fetch_callback)",
                "callback_vs_raw",
                0.90,
            ),
            (
                "one stream through one relay vs raw TCP (issue \"Streams\"; fetch_callback)",
                "relay_vs_raw",
                0.70,
            ),
        ] {
            if let Some(v) = st[k].as_f64() {
                rows.push(
                    json!({"what": what, "measured": format!("{:.0}%", 100.0 * v),
                    "target": format!("at least {:.0}%", 100.0 * target), "met": v >= target}),
                );
            }
        }
        // What raw TCP itself does here, in the same run, beside the two rows above and below:
        // through a relay process (twice the copies per byte of a direct connection, on the
        // same processors), and its round trip behind a stream on one connection and on two.
        if let Some(v) = st["raw_relay_gib_per_s"]
            .as_f64()
            .zip(st["raw_gib_per_s"].as_f64())
            .map(|(r1, r0)| r1 / r0.max(1e-9))
        {
            rows.push(json!({"what": "raw TCP through one relay process vs raw TCP (twice the copies per byte)",
                "measured": format!("{:.0}%", 100.0 * v), "target": "reported", "met": true}));
        }
        if let Some(v) = st["direct_vs_raw_digest"].as_f64() {
            rows.push(
                json!({"what": "one stream over a direct link read by a `Stream` reader vs raw TCP making and checking the same digest (XXH3 of every MiB)",
                "measured": format!("{:.0}%", 100.0 * v), "target": "reported", "met": true}),
            );
        }
        if let Some(v) = st["direct_vs_raw"].as_f64() {
            rows.push(
                json!({"what": "one stream over a direct link read by a `Stream` reader's thread (which checks each chunk) vs raw TCP",
                "measured": format!("{:.0}%", 100.0 * v), "target": "reported", "met": true}),
            );
        }
        if let Some(v) = st["relay_vs_raw_relay"].as_f64() {
            rows.push(
                json!({"what": "one stream through one relay (fetch_callback) vs raw TCP through one relay process",
                "measured": format!("{:.0}%", 100.0 * v), "target": "reported", "met": true}),
            );
        }
        for (what, k) in [
            (
                "64 B round trip (p50) during a stream vs idle, same link (a `Stream` reader)",
                "rtt_ratio",
            ),
            (
                "the same, the stream fetched with fetch_callback",
                "callback_rtt_ratio",
            ),
        ] {
            if let Some(v) = st[k].as_f64() {
                rows.push(json!({"what": what, "measured": format!("{v:.2}x"),
                    "target": "at most 2x", "met": v <= 2.0}));
            }
        }
        for (what, k) in [
            (
                "raw TCP: 64 B round trip during a raw stream vs idle, pongs on the stream's connection",
                "one_ratio",
            ),
            (
                "raw TCP: the same, pings on a connection of their own",
                "two_ratio",
            ),
        ] {
            if let Some(v) = st["raw_rtt"][k].as_f64() {
                rows.push(json!({"what": what, "measured": format!("{v:.2}x"), "target": "reported", "met": true}));
            }
        }
        let hwm = |k: &str, q: &str| st[k][q].as_f64().unwrap_or(0.0);
        let growth = (hwm("big", "producer_hwm_kib") - hwm("small", "producer_hwm_kib"))
            .max(hwm("big", "consumer_hwm_kib") - hwm("small", "consumer_hwm_kib"));
        rows.push(json!({"what": "peak memory growth from a 64 MiB to a large stream (producer or consumer)",
            "measured": format!("{growth:.0} KiB"), "target": "at most 16 MiB (a few windows)",
            "met": growth <= 16.0 * 1024.0}));
    }
    if let Some(r) = out["bcast"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["daemons"].as_u64() == Some(64)))
    {
        if let Some(v) = r["pipelined_vs_hop"].as_f64() {
            rows.push(json!({"what": "1 MiB broadcast to 64 daemons (radix 4) vs one 1 MiB hop, pipelined (all on this host's cores)",
                "measured": format!("{v:.2}x"), "target": "at most 2x", "met": v <= 2.0}));
        }
        if let Some(v) = r["whole_p50_us"]
            .as_f64()
            .zip(r["pipelined_p50_us"].as_f64())
            .map(|(w, p)| w / p.max(1e-9))
        {
            rows.push(json!({"what": "the same broadcast stored and forwarded whole at each level (PRRTE) vs pipelined",
                "measured": format!("{v:.2}x"), "target": "reported", "met": true}));
        }
    }
    Value::Array(rows)
}

/// The median of a few measurements (the upper one of the middle two for an even count).
/// Rounds of the round-trip part (tbon, mio and tbon counting only, alternating).
const PINGPONG_ROUNDS: usize = 7;

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(0.0)
}

fn size_name(b: u64) -> String {
    match b {
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}
