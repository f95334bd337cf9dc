//! The stream rows of `tbon bench` (issue "Streams"): one large stream over a direct link and
//! through one relay, many concurrent streams, and the 64 B round trip on the same path while
//! a stream runs, beside raw TCP measured in the same run. Peak resident memory of producer
//! and consumer is reported for two stream sizes, to show it does not grow with the stream.
//!
//! Layout: a radix-2 DVM of 3; ranks 1 and 2 are siblings, one relay (rank 0) apart over the
//! tree, and get a direct link with the route `direct`. Rank 1 produces, rank 2 consumes.

use super::roles::{TAG_DATA, TAG_WARM};
use super::util::{Res, ctx, quantile_us, wait_file, write_atomically};
use super::{Bench, RoleArgs, loadavg, median};
use bytes::Bytes;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tbon::{Daemon, FetchOptions, Peer, StreamWriter};

const GUARD: Duration = Duration::from_secs(300);
const SERVICE: &str = "bench";
/// The producer writes slices of one buffer of this size: no allocation per write.
const PIECE: usize = 1 << 20;
/// Round trips measured before the stream (the idle baseline).
const IDLE_PINGS: usize = 2_000;

/// This process's peak resident memory (VmHWM), KiB.
fn vm_hwm_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The stream role: `sender` serves `count` bytes per stream, `receiver` fetches `payload`
/// streams at once (and pings `sender` before and during them); the receiver prints the
/// JSON report.
pub fn role(a: &RoleArgs) -> Res<()> {
    let d = super::roles::start(a, 2)?;
    let done_rx = super::roles::post_done(&d)?;
    let producer_done = a.dir.join("producer.hwm");
    if a.rank == a.sender {
        serve(&d, a, producer_done.clone())?;
    }
    if !d.wait_wired(GUARD) {
        return Err("not wired".into());
    }
    if a.rank == a.receiver {
        let mut report = consume(&d, a)?;
        let hwm = wait_file(&producer_done, GUARD)?;
        report["producer_hwm_kib"] = json!(hwm.trim().parse::<u64>().ok());
        super::roles::print_line(&report.to_string());
        d.send(0, super::roles::TAG_DONE, Bytes::new())
            .map_err(ctx("done"))?;
    }
    super::roles::finish(&d, done_rx);
    Ok(())
}

/// The producer: echoes pings, and answers every stream with `count` bytes; once `payload`
/// streams are written it records its peak memory in `done`.
fn serve(d: &Daemon, a: &RoleArgs, done: std::path::PathBuf) -> Res<()> {
    let h = d.handle();
    let consumer = a.receiver;
    // An echo refused `Busy` (flow control: the stream fills the queue) is sent again from a
    // thread of its own: a callback must not wait, and a dropped pong would stall the pinger.
    let (retry_tx, retry_rx) = crossbeam_channel::unbounded::<Bytes>();
    let retry_h = d.handle();
    std::thread::spawn(move || {
        for p in retry_rx {
            while let Err(tbon::SendError::Busy(_)) = retry_h.send(consumer, TAG_DATA, p.clone()) {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    });
    d.recv(
        Peer::Rank(consumer),
        TAG_DATA,
        tbon::RecvMode::Persistent,
        move |m| {
            // The pong carries when the ping arrived (the monotonic clock is one per host):
            // the consumer splits the round trip into its two directions.
            let mut pong = m.payload.to_vec();
            if let Some(at) = pong.get_mut(8..16) {
                at.copy_from_slice(&crate::workload::mono_ns().to_le_bytes());
            }
            let pong = Bytes::from(pong);
            if let Err(tbon::SendError::Busy(_)) = h.send(consumer, TAG_DATA, pong.clone()) {
                let _ = retry_tx.send(pong);
            }
        },
    )
    .map_err(ctx("post echo"))?;
    d.recv(Peer::Any, TAG_WARM, tbon::RecvMode::Persistent, |_| {})
        .map_err(ctx("post warm-up receive"))?;
    let buf = Bytes::from(vec![0x5au8; PIECE]);
    let (len, streams) = (a.count, a.payload as u64);
    let written = Arc::new(AtomicU64::new(0));
    d.serve(SERVICE, move |req, mut w: StreamWriter| {
        let mut at = req.offset;
        while at < len {
            let n = (len - at).min(PIECE as u64) as usize;
            if w.write(buf.slice(..n)).is_err() {
                return;
            }
            at += n as u64;
        }
        let _ = w.finish();
        if written.fetch_add(1, Ordering::SeqCst) + 1 == streams {
            let _ = write_atomically(&done, &vm_hwm_kib().unwrap_or(0).to_string());
        }
    })
    .map_err(ctx("serve"))?;
    Ok(())
}

/// Round trips, and the time each ping took to the producer (its way has no stream data) and
/// each pong back (behind the stream's data).
#[derive(Default)]
struct Trips {
    round: Vec<Duration>,
    there: Vec<Duration>,
    back: Vec<Duration>,
    /// Of `back`: from the consumer's loop handing the pong to its callback until the pinging
    /// thread had it (the wake-up of a thread on a busy machine, not the network's part).
    wake: Vec<Duration>,
}

/// Pings the producer and waits for each echo.
fn ping(
    d: &Daemon,
    to: tbon::Rank,
    pongs: &crossbeam_channel::Receiver<Bytes>,
    until: impl Fn(usize) -> bool,
) -> Res<Trips> {
    let mut trips = Trips::default();
    let stamp = |b: &Bytes, at: std::ops::Range<usize>| {
        b.get(at)
            .and_then(|s| <[u8; 8]>::try_from(s).ok())
            .map_or(0, u64::from_le_bytes)
    };
    while !until(trips.round.len()) {
        let t = Instant::now();
        let mut body = vec![0x5au8; 64];
        if let Some(at) = body.get_mut(..8) {
            at.copy_from_slice(&crate::workload::mono_ns().to_le_bytes());
        }
        let body = Bytes::from(body);
        loop {
            match d.send(to, TAG_DATA, body.clone()) {
                Err(tbon::SendError::Busy(_)) => std::thread::sleep(Duration::from_micros(50)),
                r => break r.map_err(ctx("ping"))?,
            }
        }
        let pong = pongs.recv_timeout(GUARD).map_err(ctx("pong"))?;
        let now = crate::workload::mono_ns();
        trips.round.push(t.elapsed());
        let (sent, echoed, handed) = (
            stamp(&pong, 0..8),
            stamp(&pong, 8..16),
            stamp(&pong, 16..24),
        );
        trips
            .there
            .push(Duration::from_nanos(echoed.saturating_sub(sent)));
        trips
            .back
            .push(Duration::from_nanos(now.saturating_sub(echoed)));
        trips
            .wake
            .push(Duration::from_nanos(now.saturating_sub(handed)));
    }
    Ok(trips)
}

/// Fetches one stream with `fetch_callback` (the daemon checks each chunk on its loop, and the
/// callback counts it there); the thread returned waits for its end and gives the bytes.
fn fetch_by_callback(
    d: &Daemon,
    producer: tbon::Rank,
) -> Res<std::thread::JoinHandle<Result<u64, String>>> {
    let (end_tx, end_rx) = crossbeam_channel::bounded::<Result<u64, String>>(1);
    let mut got = 0u64;
    d.handle()
        .fetch_callback(
            producer,
            SERVICE,
            Bytes::new(),
            FetchOptions::default(),
            move |item| match item {
                tbon::StreamItem::Data(b) => got += b.len() as u64,
                tbon::StreamItem::End(r) => {
                    let _ = end_tx.try_send(r.map(|()| got).map_err(|e| e.to_string()));
                }
            },
        )
        .map_err(ctx("fetch"))?;
    Ok(std::thread::spawn(move || {
        end_rx
            .recv_timeout(GUARD)
            .map_err(|e| format!("the stream's end: {e}"))?
    }))
}

/// The consumer: the idle round trip, then `payload` streams of `count` bytes at once (a
/// reader thread each, or a callback each with `callback`) while pinging; reports rates, round
/// trips and memory. With `no_pings`, the streams alone (no round trips are reported).
fn consume(d: &Daemon, a: &RoleArgs) -> Res<Value> {
    let producer = a.sender;
    let (tx, pongs) = crossbeam_channel::bounded(16);
    d.recv(
        Peer::Rank(producer),
        TAG_DATA,
        tbon::RecvMode::Persistent,
        move |m| {
            // When the loop handed the pong over: the rest of the way is the pinging
            // thread's wake-up.
            let mut pong = m.payload.to_vec();
            if let Some(at) = pong.get_mut(16..24) {
                at.copy_from_slice(&crate::workload::mono_ns().to_le_bytes());
            }
            let _ = tx.try_send(Bytes::from(pong));
        },
    )
    .map_err(ctx("post pong"))?;
    super::roles::open_link(d, a, producer)?;
    let mut idle = if a.no_pings {
        Trips::default()
    } else {
        ping(d, producer, &pongs, |n| n >= IDLE_PINGS)?
    };
    let running = Arc::new(AtomicBool::new(true));
    let t0 = Instant::now();
    let mut readers = Vec::new();
    for _ in 0..a.payload {
        if a.callback {
            readers.push(fetch_by_callback(d, producer)?);
            continue;
        }
        let mut s = d
            .fetch_with(producer, SERVICE, Bytes::new(), FetchOptions::default())
            .map_err(ctx("fetch"))?;
        readers.push(std::thread::spawn(move || -> Result<u64, String> {
            let mut got = 0u64;
            for chunk in s.by_ref() {
                got += chunk.map_err(|e| e.to_string())?.len() as u64;
            }
            Ok(got)
        }));
    }
    let watcher = {
        let running = running.clone();
        std::thread::spawn(move || {
            for r in readers {
                let _ = r.join().map_err(|_| "a reader panicked".to_string())?;
            }
            running.store(false, Ordering::SeqCst);
            Ok::<(), String>(())
        })
    };
    let mut busy = if a.no_pings {
        while running.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        Trips::default()
    } else {
        ping(d, producer, &pongs, |_| !running.load(Ordering::SeqCst))?
    };
    watcher
        .join()
        .map_err(|_| "the watcher panicked".to_string())??;
    let secs = t0.elapsed().as_secs_f64();
    let c = d.handle().counters().map_err(ctx("counters"))?;
    let bytes = c.streams.bytes_received;
    if c.streams.finished != a.payload as u64 || bytes != a.count * a.payload as u64 {
        return Err(format!(
            "{} of {} streams finished, {bytes} bytes",
            c.streams.finished, a.payload
        ));
    }
    if a.route.as_deref() == Some("direct") && c.direct.links_open == 0 {
        return Err("the route is direct, and no direct link is open".into());
    }
    Ok(json!({
        "bytes": bytes, "secs": secs,
        "gib_per_s": bytes as f64 / f64::from(1u32 << 30) / secs,
        "idle_rtt_p50_us": quantile_us(&mut idle.round, 0.5),
        "idle_there_p50_us": quantile_us(&mut idle.there, 0.5),
        "idle_back_p50_us": quantile_us(&mut idle.back, 0.5),
        "stream_rtt_p50_us": quantile_us(&mut busy.round, 0.5),
        "stream_rtt_p99_us": quantile_us(&mut busy.round, 0.99),
        "stream_there_p50_us": quantile_us(&mut busy.there, 0.5),
        "stream_back_p50_us": quantile_us(&mut busy.back, 0.5),
        "idle_wake_p50_us": quantile_us(&mut idle.wake, 0.5),
        "stream_wake_p50_us": quantile_us(&mut busy.wake, 0.5),
        "stream_pings": busy.round.len(),
        "consumer_hwm_kib": vm_hwm_kib(),
        "resumes": c.streams.resumes,
    }))
}

/// How a stream run measures: its bandwidth alone, or its round trips too.
#[derive(Clone, Copy, PartialEq)]
enum Measure {
    /// The stream alone, as raw TCP's bandwidth is measured: the bandwidth rows.
    Bandwidth,
    /// 64 B round trips before and beside the stream: the latency rows (the stream's
    /// bandwidth is reported too, less than alone: the pings take the loops' turns).
    RoundTrips,
}

impl Bench {
    fn stream_run(
        &mut self,
        route: &str,
        streams: usize,
        bytes_each: u64,
        measure: Measure,
    ) -> Res<Value> {
        self.stream_run_with(route, streams, bytes_each, false, measure)
    }

    /// [`stream_run`](Self::stream_run), the consumer fetching with `fetch_callback` when
    /// `callback`.
    fn stream_run_with(
        &mut self,
        route: &str,
        streams: usize,
        bytes_each: u64,
        callback: bool,
        measure: Measure,
    ) -> Res<Value> {
        let dir = self.fresh_dir()?;
        let mut kids = Vec::new();
        for rank in 0..3 {
            let a = RoleArgs {
                role: Some("stream".into()),
                rank,
                size: 3,
                sender: 1,
                receiver: 2,
                payload: streams,
                count: bytes_each,
                dir: dir.clone(),
                route: Some(route.to_string()),
                callback,
                no_pings: measure == Measure::Bandwidth,
                ..RoleArgs::default()
            };
            kids.push(self.spawn(&a, rank == 2)?);
        }
        self.collect(kids, 2)
    }

    /// Raw TCP's bandwidth with 1 MiB frames through `relays` relays, GiB/s; with `digest`,
    /// each frame's XXH3 made by the sender and checked by the receiver, as a stream's chunks.
    fn raw_gib(&mut self, relays: u32, bytes: u64, digest: bool) -> Res<f64> {
        let v = self.raw_rate_with(relays, PIECE, bytes / PIECE as u64, digest)?;
        let msgs = v["msgs"].as_f64().unwrap_or(0.0);
        Ok(msgs * PIECE as f64 / f64::from(1u32 << 30) / v["secs"].as_f64().unwrap_or(1.0))
    }

    /// Raw TCP's 64 B round trip while a raw stream of `bytes` runs between the same two
    /// processes, the pings on a connection of their own (`two`) or on the stream's (`one`).
    fn raw_stream_rtt(&mut self, mode: &str, bytes: u64) -> Res<Value> {
        let dir = self.fresh_dir()?;
        let base = RoleArgs {
            count: bytes,
            dir,
            route: Some(mode.to_string()),
            ..RoleArgs::default()
        };
        let kids = vec![
            self.spawn(
                &RoleArgs {
                    role: Some("raw-stream-consume".into()),
                    ..base.clone()
                },
                true,
            )?,
            self.spawn(
                &RoleArgs {
                    role: Some("raw-stream-produce".into()),
                    ..base
                },
                false,
            )?,
        ];
        self.collect(kids, 0)
    }

    /// Issue "Streams": the bench rows, each beside raw TCP in the same run.
    pub(super) fn streams(&mut self) -> Res<Value> {
        let big: u64 = if self.quick { 256 << 20 } else { 1 << 30 };
        let small: u64 = 64 << 20;
        let gib = |v: &Value| v["gib_per_s"].as_f64().unwrap_or(0.0);
        let (mut d, mut r, mut raw0, mut raw1) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut raw_digest = Vec::new();
        let mut direct_runs = Vec::new();
        let mut callback_runs = Vec::new();
        let mut callback_pinged = Vec::new();
        // Bandwidth rows from runs of the stream alone, as raw TCP's; the round trip rows from
        // runs with pings before and beside the stream.
        for _ in 0..self.repeat {
            d.push(gib(&self.stream_run(
                "direct",
                1,
                big,
                Measure::Bandwidth,
            )?));
            direct_runs.push(self.stream_run("direct", 1, big, Measure::RoundTrips)?);
            callback_runs.push(self.stream_run_with("direct", 1, big, true, Measure::Bandwidth)?);
            callback_pinged.push(self.stream_run_with(
                "direct",
                1,
                big,
                true,
                Measure::RoundTrips,
            )?);
            // Through the relay the consumer fetches with `fetch_callback` as in the direct
            // row: the row measures the relay, not a reader's thread.
            r.push(gib(&self.stream_run_with(
                "tree",
                1,
                big,
                true,
                Measure::Bandwidth,
            )?));
            raw0.push(self.raw_gib(0, big, false)?);
            raw1.push(self.raw_gib(1, big, false)?);
            raw_digest.push(self.raw_gib(0, big, true)?);
        }
        // One run with stream data on the link (`bulk_connection = false`), beside the others:
        // what the bulk connection changes, measured in the same run.
        self.bulk_connection = false;
        let without_bulk = self.stream_run("direct", 1, big, Measure::RoundTrips);
        self.bulk_connection = true;
        let without_bulk = without_bulk?;
        let raw_two = self.raw_stream_rtt("two", big)?;
        let raw_one = self.raw_stream_rtt("one", big)?;
        let small_run = self.stream_run("direct", 1, small, Measure::RoundTrips)?;
        let many = self.stream_run(
            "direct",
            64,
            if self.quick { 4 << 20 } else { 16 << 20 },
            Measure::Bandwidth,
        )?;
        // The run with pings and the median rate carries the round trips and memory of the
        // big stream (memory is compared with `small_run`'s, which pings too).
        direct_runs.sort_by(|a, b| gib(a).total_cmp(&gib(b)));
        let mid = direct_runs
            .get(direct_runs.len() / 2)
            .cloned()
            .unwrap_or(Value::Null);
        let (dm, rm, r0, r1) = (median(&d), median(&r), median(&raw0), median(&raw1));
        let cm = median(&callback_runs.iter().map(gib).collect::<Vec<_>>());
        callback_pinged.sort_by(|a, b| gib(a).total_cmp(&gib(b)));
        let callback = callback_pinged
            .get(callback_pinged.len() / 2)
            .cloned()
            .unwrap_or(Value::Null);
        let rd = median(&raw_digest);
        let rtt = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);
        let row = json!({
            "big_bytes": big,
            "direct_gib_per_s": dm, "relay_gib_per_s": rm,
            "raw_gib_per_s": r0, "raw_relay_gib_per_s": r1,
            "direct_vs_raw": dm / r0.max(1e-9),
            "raw_digest_gib_per_s": rd,
            "raw_digest_vs_raw": rd / r0.max(1e-9),
            "direct_vs_raw_digest": dm / rd.max(1e-9),
            "callback": callback,
            "callback_gib_per_s": cm,
            "callback_vs_raw": cm / r0.max(1e-9),
            "relay_vs_raw": rm / r0.max(1e-9),
            "relay_vs_raw_relay": rm / r1.max(1e-9),
            "many": many,
            "many_vs_raw": gib(&many) / r0.max(1e-9),
            "idle_rtt_p50_us": rtt(&mid, "idle_rtt_p50_us"),
            "stream_rtt_p50_us": rtt(&mid, "stream_rtt_p50_us"),
            "stream_rtt_p99_us": rtt(&mid, "stream_rtt_p99_us"),
            "rtt_ratio": rtt(&mid, "stream_rtt_p50_us") / rtt(&mid, "idle_rtt_p50_us").max(1e-9),
            "callback_rtt_ratio": rtt(&callback, "stream_rtt_p50_us")
                / rtt(&callback, "idle_rtt_p50_us").max(1e-9),
            "raw_rtt": {
                "two_connections": raw_two,
                "one_connection": raw_one,
                "two_ratio": rtt(&raw_two, "stream_rtt_p50_us") / rtt(&raw_two, "idle_rtt_p50_us").max(1e-9),
                "one_ratio": rtt(&raw_one, "stream_rtt_p50_us") / rtt(&raw_one, "idle_rtt_p50_us").max(1e-9),
            },
            "big": mid, "small": small_run,
            "without_bulk_connection": without_bulk,
            "direct_pinged_gib_per_s": gib(&mid),
            "callback_pinged_gib_per_s": gib(&callback),
            "runs": {"direct": d, "relay": r, "raw": raw0, "raw_relay": raw1, "raw_digest": raw_digest,
                "callback": callback_runs.iter().map(gib).collect::<Vec<_>>(),
                "direct_pinged": direct_runs.iter().map(gib).collect::<Vec<_>>(),
                "callback_pinged": callback_pinged.iter().map(gib).collect::<Vec<_>>()},
            "load": loadavg(),
        });
        eprintln!("{row}");
        Ok(row)
    }
}
