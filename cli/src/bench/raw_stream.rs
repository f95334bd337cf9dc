//! The raw-TCP baseline of the stream round trip (issue "Streams"): how much a saturating bulk
//! transfer between two processes slows a 64 B round trip between the same two processes when
//! nothing but the machine stands in the way. Two processes, blocking threads, no framing
//! beyond a 4-byte length:
//!
//! - `two` connections: the pings have a connection of their own, so no byte of the stream is
//!   ever ahead of a pong; what is left is the processors' contention (this machine's floor);
//! - `one` connection: the pongs are written between the stream's frames on the stream's own
//!   connection (under a lock, as a single-connection transport must), so they wait behind
//!   what the kernel's buffers hold of the stream.
//!
//! The producer (`raw-stream-produce`) listens; the consumer (`raw-stream-consume`) pings 2,000
//! times idle, then asks for `count` bytes and pings until they have all arrived, and prints
//! the JSON report.

use super::RoleArgs;
use super::util::{Res, ctx, quantile_us, wait_file, write_atomically};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const GUARD: Duration = Duration::from_secs(120);
/// The stream's frames: the largest chunk a tbon stream writes (`limits::STREAM_CHUNK_MAX`).
const FRAME: usize = tbon::limits::STREAM_CHUNK_MAX;
const PING: usize = 64;
const IDLE_PINGS: usize = 2_000;
/// A zero-length frame from the consumer asks for the stream (one-connection mode).
const START: u32 = 0;

fn two(a: &RoleArgs) -> bool {
    a.route.as_deref() == Some("two")
}

fn read_frame(s: &mut impl Read, buf: &mut Vec<u8>) -> Res<u32> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).map_err(ctx("read length"))?;
    let len = u32::from_le_bytes(len);
    buf.resize(len as usize, 0);
    s.read_exact(buf).map_err(ctx("read frame"))?;
    Ok(len)
}

fn frame(len: usize) -> Vec<u8> {
    let mut f = (len as u32).to_le_bytes().to_vec();
    f.resize(4 + len, 0x5a);
    f
}

/// Writes `count` bytes of stream frames to `out`, taking the lock for each frame.
fn write_stream(out: &Mutex<TcpStream>, count: u64) -> Res<()> {
    let f = frame(FRAME);
    let mut left = count;
    while left > 0 {
        let n = left.min(FRAME as u64) as usize;
        let mut s = out.lock().map_err(|_| "poisoned")?;
        s.write_all(&(n as u32).to_le_bytes())
            .and_then(|()| s.write_all(f.get(4..4 + n).unwrap_or(&[])))
            .map_err(ctx("write stream"))?;
        left -= n as u64;
    }
    Ok(())
}

/// The producer: echoes every ping; writes the stream when asked (a connection of its own in
/// `two` mode, the pings' connection after a `START` frame in `one` mode).
pub fn produce(a: &RoleArgs) -> Res<()> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(ctx("bind"))?;
    let port = l.local_addr().map_err(ctx("local addr"))?.port();
    write_atomically(&a.dir.join("port.0"), &port.to_string())?;
    let (mut pings, _) = l.accept().map_err(ctx("accept"))?;
    pings.set_nodelay(true).map_err(ctx("nodelay"))?;
    let out = Arc::new(Mutex::new(pings.try_clone().map_err(ctx("clone"))?));
    let mut writer = None;
    if two(a) {
        let count = a.count;
        writer = Some(std::thread::spawn(move || -> Res<()> {
            let (bulk, _) = l.accept().map_err(ctx("accept bulk"))?;
            bulk.set_nodelay(true).map_err(ctx("nodelay"))?;
            write_stream(&Mutex::new(bulk), count)
        }));
    }
    let mut buf = Vec::new();
    let pong = frame(PING);
    // Until the consumer, done, closes the connection.
    while let Ok(len) = read_frame(&mut pings, &mut buf) {
        if len == START {
            let (out, count) = (out.clone(), a.count);
            writer = Some(std::thread::spawn(move || write_stream(&out, count)));
            continue;
        }
        let mut s = out.lock().map_err(|_| "poisoned")?;
        s.write_all(&pong).map_err(ctx("pong"))?;
    }
    if let Some(w) = writer {
        w.join().map_err(|_| "the writer panicked")??;
    }
    Ok(())
}

/// The consumer: idle round trips, then the stream while pinging; prints the report.
pub fn consume(a: &RoleArgs) -> Res<()> {
    let port = wait_file(&a.dir.join("port.0"), GUARD)?;
    let addr = format!("127.0.0.1:{port}");
    let mut pings = TcpStream::connect(&addr).map_err(ctx("connect"))?;
    pings.set_nodelay(true).map_err(ctx("nodelay"))?;
    let ping = frame(PING);
    // Pongs reach the pinger through a channel in both modes, so both measure the same hand-over.
    let (pong_tx, pong_rx) = crossbeam_channel::bounded::<()>(4);
    let round = |pings: &mut TcpStream, n: &dyn Fn(usize) -> bool| -> Res<Vec<Duration>> {
        let mut samples = Vec::new();
        while !n(samples.len()) {
            let t = Instant::now();
            pings.write_all(&ping).map_err(ctx("ping"))?;
            pong_rx.recv_timeout(GUARD).map_err(ctx("pong"))?;
            samples.push(t.elapsed());
        }
        Ok(samples)
    };
    // The pongs' reader: on the pings' connection; in `one` mode it also takes the stream.
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let mut from = pings.try_clone().map_err(ctx("clone"))?;
        let (done, tx, count) = (done.clone(), pong_tx.clone(), a.count);
        // Reads until the consumer shuts the connection at the end: the last ping's pong may
        // come after the stream's last byte.
        std::thread::spawn(move || -> u64 {
            let (mut buf, mut got) = (Vec::with_capacity(FRAME), 0u64);
            while let Ok(len) = read_frame(&mut from, &mut buf) {
                if len as usize == PING {
                    let _ = tx.send(());
                } else {
                    got += u64::from(len);
                    if got >= count {
                        done.store(true, Ordering::SeqCst);
                    }
                }
            }
            got
        })
    };
    let mut idle = round(&mut pings, &|n| n >= IDLE_PINGS)?;
    let t0 = Instant::now();
    let bulk = if two(a) {
        let mut bulk = TcpStream::connect(&addr).map_err(ctx("connect bulk"))?;
        let (done, count) = (done.clone(), a.count);
        Some(std::thread::spawn(move || -> Res<u64> {
            let (mut buf, mut got) = (Vec::with_capacity(FRAME), 0u64);
            while got < count {
                got += u64::from(read_frame(&mut bulk, &mut buf)?);
            }
            done.store(true, Ordering::SeqCst);
            Ok(got)
        }))
    } else {
        pings
            .write_all(&START.to_le_bytes())
            .map_err(ctx("start"))?;
        None
    };
    let mut busy = round(&mut pings, &|_| done.load(Ordering::SeqCst))?;
    let secs = t0.elapsed().as_secs_f64();
    let got = match bulk {
        Some(b) => b.join().map_err(|_| "the bulk reader panicked")??,
        None => 0,
    };
    let _ = pings.shutdown(std::net::Shutdown::Both);
    let got = got.max(reader.join().map_err(|_| "the reader panicked")?);
    if got != a.count {
        return Err(format!("{got} of {} stream bytes arrived", a.count));
    }
    println!(
        "{}",
        serde_json::json!({
            "gib_per_s": got as f64 / f64::from(1u32 << 30) / secs,
            "idle_rtt_p50_us": quantile_us(&mut idle, 0.5),
            "stream_rtt_p50_us": quantile_us(&mut busy, 0.5),
            "stream_rtt_p99_us": quantile_us(&mut busy, 0.99),
            "stream_pings": busy.len(),
        })
    );
    Ok(())
}
