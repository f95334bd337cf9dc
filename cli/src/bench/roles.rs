//! The tbon side of `tbon bench`: one process per daemon, started by the orchestrator as
//! `tbon bench --role <name> ...`. Every daemon is a real `tbon::start` in its own process; the
//! application threads use the public `Handle`.

use super::RoleArgs;
use super::util::{RateMeter, Res, ctx, now_ns, quantile_us, wait_file, write_atomically};
use bytes::Bytes;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tbon::config::Config;
use tbon::{Batch, Daemon, Peer, Rank, RouteSetting, SendError};

/// Data tag of the benchmarks.
pub const TAG_DATA: u32 = 100;
/// "The measurement is over", to rank 0, which then shuts the DVM down.
pub const TAG_DONE: u32 = 101;
/// The broadcasts of the scale test.
pub const TAG_BCAST: u32 = 102;
/// Rate test: the receiver's acknowledgements to the sender (the count received so far).
pub const TAG_ACK: u32 = 104;
/// Messages that open a direct link before a measurement (ignored by the receiver).
pub const TAG_WARM: u32 = 105;

const GUARD: Duration = Duration::from_secs(120);
/// Reliable sends in flight in the rate test: half of the default `relm_unacked_max`.
const RELIABLE_WINDOW: u64 = 2_048;
/// Messages per `send_batch` call in the batched rate test.
const BATCH_LEN: u64 = 256;

/// The DVM's job key lives beside its URI; rank 0 makes it before publishing the URI.
/// `TBON_LINK_RESEND` (set by the orchestrator for the link-session rows) is honoured.
fn config(radix: u32, key_file: &std::path::Path, route: RouteSetting) -> Config {
    let link_resend = std::env::var("TBON_LINK_RESEND").map_or(true, |v| v != "false");
    Config {
        link_resend,
        radix,
        route,
        if_include: vec!["127.0.0.1/32".to_string()],
        key_file: Some(key_file.display().to_string()),
        ..Config::default()
    }
}

/// Starts this process's daemon: rank 0 publishes its URI in `<dir>/hnp`, the others read it.
/// Every daemon has the route setting `--route` (default `tree`).
pub(super) fn start(a: &RoleArgs, radix: u32) -> Res<Daemon> {
    let hnp_path = a.dir.join("hnp");
    let key_path = a.dir.join("job.key");
    let route: RouteSetting = a.route.as_deref().unwrap_or("tree").parse()?;
    let mut cfg = config(radix, &key_path, route);
    if let Some(p) = a.bcast_part_bytes {
        cfg.bcast_part_bytes = p;
    }
    if a.rank == 0 {
        let _ = std::fs::remove_file(&key_path);
        tbon::driver::key::generate(&key_path).map_err(ctx("make the job key"))?;
        let d = tbon::start(cfg, 0, a.size, None).map_err(ctx("start rank 0"))?;
        write_atomically(&hnp_path, d.contact_uri())?;
        Ok(d)
    } else {
        let uri = wait_file(&hnp_path, GUARD)?;
        tbon::start(cfg, a.rank, a.size, Some(&uri)).map_err(ctx("start daemon"))
    }
}

/// With the route `direct`: sends `TAG_WARM` messages to `dst` until this daemon's direct link
/// to it is open, so that the measurement that follows runs on the link (the first messages
/// take the tree while the link is negotiated). Nothing to do with the route `tree`.
pub(super) fn open_link(d: &Daemon, a: &RoleArgs, dst: Rank) -> Res<()> {
    if a.route.as_deref() != Some("direct") {
        return Ok(());
    }
    let deadline = Instant::now() + GUARD;
    loop {
        let c = d.handle().counters().map_err(ctx("counters"))?;
        if c.direct.links_open >= 1 && c.direct.links_opened >= 1 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err("no direct link opened".into());
        }
        let _ = d.send(dst, TAG_WARM, Bytes::new());
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub(super) fn print_line(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Rank 0 waits for the end of the measurement, then stops the DVM; others wait to be stopped.
pub(super) fn finish(d: &Daemon, done_rx: Option<crossbeam_channel::Receiver<()>>) {
    if let Some(rx) = done_rx {
        let _ = rx.recv_timeout(GUARD);
        d.shutdown_dvm();
    } else {
        d.wait_stopped(GUARD);
    }
}

/// Posts, on rank 0, the receive for the end-of-measurement message.
pub(super) fn post_done(d: &Daemon) -> Res<Option<crossbeam_channel::Receiver<()>>> {
    if d.rank() != 0 {
        return Ok(None);
    }
    let (tx, rx) = crossbeam_channel::bounded(1);
    d.recv(Peer::Any, TAG_DONE, tbon::RecvMode::Once, move |_| {
        let _ = tx.try_send(());
    })
    .map_err(ctx("post done receive"))?;
    Ok(Some(rx))
}

/// The rate test: `sender` streams `count` messages of `payload` bytes to `receiver`; every
/// other rank only relays. The receiver prints the JSON report.
pub fn rate(a: &RoleArgs) -> Res<()> {
    let d = start(a, 2)?;
    let done_rx = post_done(&d)?;
    let report_rx = if a.rank == a.receiver {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let mut meter = RateMeter::new(a.count);
        let (h, sender, every) = (d.handle(), a.sender, ack_every(a.payload));
        // The next count to acknowledge: a comparison per message, not a division (a 64-bit
        // division per message was a tenth of the receiving daemon's time at 64 B).
        let mut ack_at = every;
        d.recv_ref(
            Peer::Rank(a.sender),
            TAG_DATA,
            tbon::RecvMode::Persistent,
            move |m| {
                if let Some(r) = meter.on_message(m.payload().len()) {
                    let _ = tx.try_send(r);
                }
                if meter.got >= ack_at {
                    ack_at += every;
                    let _ = h.send(sender, TAG_ACK, meter.got.to_be_bytes().to_vec());
                }
            },
        )
        .map_err(ctx("post data receive"))?;
        d.recv(Peer::Any, TAG_WARM, tbon::RecvMode::Persistent, |_| {})
            .map_err(ctx("post warm-up receive"))?;
        Some(rx)
    } else {
        None
    };
    if !d.wait_wired(GUARD) {
        return Err("not wired".into());
    }
    if a.rank == a.sender {
        open_link(&d, a, a.receiver)?;
        if a.batch {
            stream_batched(&d, a.receiver, a.payload, a.count)?;
        } else {
            match (a.reliable, a.completions) {
                (true, true) => stream_reliable(&d, a.receiver, a.payload, a.count)?,
                (true, false) => stream_reliable_unwatched(&d, a.receiver, a.payload, a.count)?,
                (false, _) => stream(&d, a.receiver, a.payload, a.count)?,
            }
        }
    }
    if let Some(rx) = report_rx {
        let r = rx
            .recv_timeout(GUARD)
            .map_err(ctx("waiting for the messages"))?;
        print_line(&r);
        d.send(0, TAG_DONE, Bytes::new()).map_err(ctx("done"))?;
    }
    finish(&d, done_rx);
    Ok(())
}

/// Messages per window: 16 MiB in flight end to end (at least 4, at most 65,536 messages).
fn window(payload: usize) -> u64 {
    ((16u64 << 20) / payload.max(64) as u64).clamp(4, 65_536)
}

/// The receiver acknowledges every this many messages.
fn ack_every(payload: usize) -> u64 {
    (window(payload) / 4).clamp(1, 1024)
}

/// Keeps the pipe full without unbounded memory anywhere on the route: the receiver sends an
/// acknowledgement (tag `TAG_ACK`, the count received) every `ack_every` messages, and the
/// sender never runs more than `window` messages ahead of the last one. A window on first-hop
/// completions is not enough: a relay has no back-pressure towards the sender, and when it
/// forwards more slowly than it receives, its bounded send queue fills and it drops frames.
fn stream(d: &Daemon, dst: Rank, payload: usize, count: u64) -> Res<()> {
    let body = static_body(payload);
    let window = window(payload);
    let completed = post_ack_counter(d, dst)?;
    for i in 0..count {
        let mut w = Waiter::default();
        while i.saturating_sub(completed.load(Ordering::Acquire)) >= window {
            w.wait();
        }
        // `Busy`: the queue towards the next hop is congested (flow control).
        let mut w = Waiter::default();
        while let Err(e) = d.send(dst, TAG_DATA, Bytes::from_static(body)) {
            if !matches!(e, SendError::Busy(_)) {
                return Err(format!("send: {e}"));
            }
            w.wait();
        }
    }
    Ok(())
}

/// [`stream`] with `send_reliable` and no completion, as [`stream`] sends with `send`: the
/// reliable window (`relm_unacked_max`), refused `Busy` at the call, is the end-to-end flow
/// control, so no acknowledgements of the bench's own are needed.
fn stream_reliable_unwatched(d: &Daemon, dst: Rank, payload: usize, count: u64) -> Res<()> {
    let body = static_body(payload);
    for _ in 0..count {
        let mut w = Waiter::default();
        loop {
            match d.send_reliable(dst, TAG_DATA, Bytes::from_static(body)) {
                Ok(()) => break,
                Err(SendError::Busy(_)) => w.wait(),
                Err(e) => return Err(format!("send_reliable: {e}")),
            }
        }
    }
    Ok(())
}

/// [`stream`] with reliable sends and a completion each (`send_reliable_with`). Fewer than `RELIABLE_WINDOW` are unacknowledged at a time (a
/// send beyond `relm_unacked_max` would complete with `Busy`): the completions are the
/// end-to-end flow control. A send whose completion says `Busy` (flow control found the next
/// hop congested when the loop took it) was not sent: it is offered again.
fn stream_reliable(d: &Daemon, dst: Rank, payload: usize, count: u64) -> Res<()> {
    /// What the completions tell the sender (one `Arc` clone per send, not one per field).
    struct Progress {
        acked: AtomicU64,
        refused: AtomicU64,
        failed: std::sync::Mutex<Option<String>>,
        sender: std::thread::Thread,
    }
    let body = static_body(payload);
    let p = Arc::new(Progress {
        acked: AtomicU64::new(0),
        refused: AtomicU64::new(0),
        failed: std::sync::Mutex::new(None),
        sender: std::thread::current(),
    });
    let mut issued = 0u64;
    let mut w = Waiter::default();
    loop {
        if let Some(e) = p.failed.lock().map_err(|_| "poisoned")?.take() {
            return Err(format!("send_reliable completion: {e}"));
        }
        let ok = p.acked.load(Ordering::Acquire);
        let lost = p.refused.load(Ordering::Acquire);
        if ok >= count {
            if lost > 0 {
                log::info!("{lost} reliable sends completed Busy and were offered again");
            }
            return Ok(());
        }
        let live = issued - lost;
        if live >= count || live - ok >= RELIABLE_WINDOW {
            w.wait();
            continue;
        }
        w = Waiter::default();
        let p2 = p.clone();
        let sent = d.send_reliable_with(dst, TAG_DATA, Bytes::from_static(body), move |r| {
            match r {
                Ok(()) => {
                    if p2.acked.fetch_add(1, Ordering::Release).is_multiple_of(64) {
                        p2.sender.unpark();
                    }
                    return;
                }
                Err(SendError::Busy(_)) => {
                    p2.refused.fetch_add(1, Ordering::Release);
                }
                Err(e) => {
                    if let Ok(mut f) = p2.failed.lock() {
                        *f = Some(e.to_string());
                    }
                }
            }
            p2.sender.unpark();
        });
        match sent {
            Ok(()) => issued += 1,
            Err(SendError::Busy(_)) => w.wait(),
            Err(e) => return Err(format!("send_reliable: {e}")),
        }
    }
}

/// How the sender waits for room: a few spins, then parked until an acknowledgement unparks
/// it (or a short timeout, for flow control's `Busy`, which nothing signals). Yielding in a
/// loop instead took a third of the CPU of a 2-core machine from the daemons' loop threads.
#[derive(Default)]
struct Waiter {
    spins: u32,
}

impl Waiter {
    fn wait(&mut self) {
        self.spins += 1;
        if self.spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::park_timeout(Duration::from_micros(200));
        }
    }
}

/// The payload every message of a rate test carries, as static bytes: each message wraps it
/// in its own `Bytes::from_static`, which costs the sender nothing. A heap `Bytes` cloned per
/// message instead puts one reference count under the application's clone and the loop's
/// drop of every message, a cache line the two threads pass back and forth (about 30% of the
/// sender's time at 64 B, measured), and even a static one cloned goes through `Bytes`'s
/// vtable (a tenth of the batched sender's time): that is the bench's doing, not the
/// daemon's. Raw TCP's sender writes from one buffer too.
fn static_body(payload: usize) -> &'static [u8] {
    // One body per process, for the process's life.
    Box::leak(vec![0x5au8; payload].into_boxed_slice())
}

/// Posts the receive for the receiver's acknowledgements (the count it received so far); each
/// one unparks this thread.
fn post_ack_counter(d: &Daemon, dst: Rank) -> Res<Arc<AtomicU64>> {
    let completed = Arc::new(AtomicU64::new(0));
    let c = completed.clone();
    let me = std::thread::current();
    d.recv(
        Peer::Rank(dst),
        TAG_ACK,
        tbon::RecvMode::Persistent,
        move |m| {
            if let Ok(b) = <[u8; 8]>::try_from(&m.payload[..]) {
                c.fetch_max(u64::from_be_bytes(b), Ordering::Release);
                me.unpark();
            }
        },
    )
    .map_err(ctx("post ack receive"))?;
    Ok(completed)
}

/// [`stream`] with `send_batch`: the same window, filled a batch at a time.
fn stream_batched(d: &Daemon, dst: Rank, payload: usize, count: u64) -> Res<()> {
    let body = static_body(payload);
    let window = window(payload);
    let completed = post_ack_counter(d, dst)?;
    let mut batch = Batch::new();
    let mut sent = 0u64;
    let mut w = Waiter::default();
    while sent < count {
        let room = (window + completed.load(Ordering::Acquire))
            .saturating_sub(sent)
            .min(count - sent)
            .min(BATCH_LEN);
        if room == 0 {
            w.wait();
            continue;
        }
        w = Waiter::default();
        for _ in 0..room {
            batch
                .push(dst, TAG_DATA, Bytes::from_static(body))
                .map_err(|e| format!("batch: {e}"))?;
        }
        sent += room;
        // `Busy`: the queue towards the next hop is congested; the rest stays in the batch.
        let mut busy = Waiter::default();
        while let Err(e) = d.send_batch(&mut batch) {
            if !matches!(e, SendError::Busy(_)) {
                return Err(format!("send_batch: {e}"));
            }
            busy.wait();
        }
    }
    Ok(())
}

/// Ping-pong between rank 1 (an application thread) and rank 0 (echoes from its callback).
pub fn pingpong(a: &RoleArgs) -> Res<()> {
    let d = start(a, 2)?;
    let done_rx = post_done(&d)?;
    let (pinger, echoer) = (a.sender, a.receiver);
    if a.rank == echoer {
        let h = d.handle();
        d.recv(
            Peer::Rank(pinger),
            TAG_DATA,
            tbon::RecvMode::Persistent,
            move |m| {
                let _ = h.send(pinger, TAG_DATA, m.payload);
            },
        )
        .map_err(ctx("post echo"))?;
    }
    if a.rank != pinger {
        finish(&d, done_rx);
        return Ok(());
    }
    let (tx, rx) = crossbeam_channel::bounded(16);
    d.recv(
        Peer::Rank(echoer),
        TAG_DATA,
        tbon::RecvMode::Persistent,
        move |_| {
            let _ = tx.try_send(());
        },
    )
    .map_err(ctx("post pong"))?;
    if !d.wait_wired(GUARD) {
        return Err("not wired".into());
    }
    let body = Bytes::from(vec![0x5au8; a.payload]);
    let warm = (a.count / 10).max(100);
    let mut samples = Vec::with_capacity(a.count as usize);
    // With the route `direct`, the first ping asks for the link and takes the tree: its round
    // trip is the delay the negotiation adds to the first message.
    let mut first_us = None;
    for i in 0..warm + a.count {
        let t = Instant::now();
        d.send(echoer, TAG_DATA, body.clone())
            .map_err(ctx("ping"))?;
        rx.recv_timeout(GUARD).map_err(ctx("pong"))?;
        first_us.get_or_insert(t.elapsed().as_secs_f64() * 1e6);
        if i >= warm {
            samples.push(t.elapsed());
        }
    }
    let links = d.handle().counters().map_err(ctx("counters"))?.direct;
    if a.route.as_deref() == Some("direct") && links.links_open == 0 {
        return Err("the route is direct, and no direct link opened".into());
    }
    let p50 = quantile_us(&mut samples, 0.5);
    let p99 = quantile_us(&mut samples, 0.99);
    print_line(
        &serde_json::json!({"p50_us": p50, "p99_us": p99, "first_us": first_us,
            "direct_messages": links.direct_messages})
        .to_string(),
    );
    d.send(0, TAG_DONE, Bytes::new()).map_err(ctx("done"))?;
    finish(&d, done_rx);
    Ok(())
}

/// Scale: every daemon appends `rank start_ns wired_ns` to `<dir>/report`. Then rank 0 waits
/// for `<dir>/go` and times `count` broadcasts from origination to completion (every living
/// daemon has it: the fault-tolerant xcast), while every daemon takes part in `count` allgathers
/// of 8 bytes each (rank 0 times each from its contribution to the result), then times `count`
/// status queries as an operator's tool does them (`tbon status`: a connection with the
/// operator credential, the query gathered in the tree, the report). Rank 0 prints the JSON
/// report and shuts the DVM down.
pub fn scale(a: &RoleArgs) -> Res<()> {
    let started = now_ns();
    let radix = if a.radix == 0 {
        Config::default().radix
    } else {
        a.radix
    };
    let d = start(a, radix)?;
    d.recv(Peer::Any, TAG_BCAST, tbon::RecvMode::Persistent, |_| {})
        .map_err(ctx("post broadcast receive"))?;
    if !d.wait_wired(GUARD) {
        return Err("not wired".into());
    }
    let wired = now_ns();
    let line = format!("{} {started} {wired}\n", a.rank);
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(a.dir.join("report"))
        .map_err(ctx("open report"))?;
    f.write_all(line.as_bytes()).map_err(ctx("write report"))?;
    drop(f);
    let contribution = Bytes::from(u64::from(a.rank).to_be_bytes().to_vec());
    // The data exchange (issue "Jobs"): every daemon commits 1 KiB for a job on all of them.
    let job = tbon::Group::new(1, 0..a.size).map_err(ctx("group"))?;
    d.put(&job, "data", vec![a.rank as u8; 1024])
        .map_err(ctx("put"))?;
    d.commit(&job).map_err(ctx("commit"))?;
    if a.rank != 0 {
        // In lockstep with rank 0: round i starts when rank 0 contributes to it.
        for id in 1..=a.count {
            d.allgather_wait(id, contribution.clone(), GUARD)
                .map_err(ctx("allgather"))?;
        }
        for _ in 0..a.count {
            d.fence_wait(&job, tbon::FenceMode::Full, GUARD)
                .map_err(ctx("full fence"))?;
        }
        d.fence_wait(&job, tbon::FenceMode::Direct, GUARD)
            .map_err(ctx("direct fence"))?;
        d.wait_stopped(GUARD);
        return Ok(());
    }
    wait_file(&a.dir.join("go"), GUARD)?;
    let mut bcast = Vec::new();
    for _ in 0..a.count {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let t = Instant::now();
        d.broadcast_with(TAG_BCAST, Bytes::from_static(&[0u8; 64]), move |r| {
            let _ = tx.send(r);
        })
        .map_err(ctx("broadcast"))?;
        rx.recv_timeout(GUARD)
            .map_err(ctx("broadcast completion"))?
            .map_err(ctx("broadcast"))?;
        bcast.push(t.elapsed());
    }
    let mut gather = Vec::new();
    for id in 1..=a.count {
        let t = Instant::now();
        let r = d
            .allgather_wait(id, contribution.clone(), GUARD)
            .map_err(ctx("allgather"))?;
        gather.push(t.elapsed());
        if r.contributions.len() != a.size as usize {
            return Err(format!(
                "allgather {id}: {} contributions of {}",
                r.contributions.len(),
                a.size
            ));
        }
    }
    let mut fence = Vec::new();
    for _ in 0..a.count {
        let t = Instant::now();
        d.fence_wait(&job, tbon::FenceMode::Full, GUARD)
            .map_err(ctx("full fence"))?;
        fence.push(t.elapsed());
    }
    // Direct mode: the first get of a rank fetches its data, later ones hit the cache. The
    // full fences cached everything: forget it, commit again, fence directly.
    d.forget_group(&job).map_err(ctx("forget"))?;
    d.put(&job, "data", vec![0u8; 1024]).map_err(ctx("put"))?;
    d.commit(&job).map_err(ctx("commit"))?;
    d.fence_wait(&job, tbon::FenceMode::Direct, GUARD)
        .map_err(ctx("direct fence"))?;
    let (mut first, mut cached) = (Vec::new(), Vec::new());
    for i in 0..a.count.min(u64::from(a.size) - 1) {
        let owner = a.size - 1 - i as u32;
        let t = Instant::now();
        let v = d
            .get_wait(&job, owner, "data", GUARD)
            .map_err(ctx("first get"))?;
        first.push(t.elapsed());
        if v.len() != 1024 || v.iter().any(|b| *b != owner as u8) {
            return Err(format!("get of rank {owner}: wrong data"));
        }
        let t = Instant::now();
        d.get_wait(&job, owner, "data", GUARD)
            .map_err(ctx("cached get"))?;
        cached.push(t.elapsed());
    }
    let contact: tbon::oob::uri::ContactUri =
        d.contact_uri().parse().map_err(ctx("own contact URI"))?;
    let credential = tbon::Key::from_file(a.dir.join("job.key"))
        .map_err(ctx("job key"))?
        .operator();
    let mut status = Vec::new();
    for _ in 0..a.count {
        let t = Instant::now();
        let r = tbon::status::query(
            &contact,
            &credential,
            &tbon::status::StatusOptions::default(),
        )
        .map_err(ctx("status"))?;
        status.push(t.elapsed());
        if r.answered() != a.size {
            return Err(format!("status: {} answered of {}", r.answered(), a.size));
        }
    }
    print_line(
        &serde_json::json!({
            "p50_us": quantile_us(&mut bcast, 0.5),
            "p99_us": quantile_us(&mut bcast, 0.99),
            "allgather_p50_us": quantile_us(&mut gather, 0.5),
            "allgather_p99_us": quantile_us(&mut gather, 0.99),
            "status_p50_us": quantile_us(&mut status, 0.5),
            "status_p99_us": quantile_us(&mut status, 0.99),
            "fence_full_p50_us": quantile_us(&mut fence, 0.5),
            "fence_full_p99_us": quantile_us(&mut fence, 0.99),
            "get_first_p50_us": quantile_us(&mut first, 0.5),
            "get_cached_p50_us": quantile_us(&mut cached, 0.5),
        })
        .to_string(),
    );
    d.shutdown_dvm();
    Ok(())
}
