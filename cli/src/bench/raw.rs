//! The raw-TCP baseline of `tbon bench`: minimal length-prefixed framing (4-byte length, then
//! the payload), one process per role like the tbon side. Each role finds its peer through
//! `<dir>/port.<i>` files written by the listener. With `--digest` a frame's payload starts
//! with the XXH3 of the rest, which the receiver checks (a tbon stream's end-to-end check).

use super::RoleArgs;
use super::util::{RateMeter, Res, ctx, quantile_us, wait_file, write_atomically};
use std::io::{BufWriter, ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use twox_hash::XxHash3_64;

const GUARD: Duration = Duration::from_secs(120);
const BUF: usize = 256 * 1024;

fn listen(a: &RoleArgs, index: u32) -> Res<TcpListener> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(ctx("bind"))?;
    let port = l.local_addr().map_err(ctx("local addr"))?.port();
    write_atomically(&a.dir.join(format!("port.{index}")), &port.to_string())?;
    Ok(l)
}

fn connect(a: &RoleArgs, index: u32) -> Res<TcpStream> {
    let port = wait_file(&a.dir.join(format!("port.{index}")), GUARD)?;
    let s = TcpStream::connect(format!("127.0.0.1:{port}")).map_err(ctx("connect"))?;
    s.set_nodelay(true).map_err(ctx("nodelay"))?;
    Ok(s)
}

fn accept(l: &TcpListener) -> Res<TcpStream> {
    let (s, _) = l.accept().map_err(ctx("accept"))?;
    s.set_nodelay(true).map_err(ctx("nodelay"))?;
    Ok(s)
}

/// Splits complete frames off `buf[..filled]`, calling `each(payload)`; returns the bytes
/// consumed.
fn frames(buf: &[u8], mut each: impl FnMut(&[u8])) -> usize {
    let mut pos = 0;
    while let Some(raw) = buf.get(pos..pos + 4) {
        let len = u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]) as usize;
        let Some(payload) = buf.get(pos + 4..pos + 4 + len) else {
            break;
        };
        each(payload);
        pos += 4 + len;
    }
    pos
}

/// Whether a `--digest` frame's payload matches the XXH3 it starts with.
fn digest_ok(payload: &[u8]) -> bool {
    match payload.split_first_chunk::<8>() {
        Some((digest, body)) => u64::from_le_bytes(*digest) == XxHash3_64::oneshot(body),
        None => false,
    }
}

/// Reads frames until `count` arrived; prints the same JSON report as the tbon receiver.
pub fn recv(a: &RoleArgs) -> Res<()> {
    let l = listen(a, 0)?;
    let mut s = accept(&l)?;
    let mut meter = RateMeter::new(a.count);
    let mut buf = vec![0u8; BUF.max(2 * (4 + a.payload))];
    let mut filled = 0;
    let mut report = None;
    while report.is_none() {
        let n = s.read(&mut buf[filled..]).map_err(ctx("read"))?;
        if n == 0 {
            return Err("sender closed early".into());
        }
        filled += n;
        let mut corrupt = false;
        let used = frames(&buf[..filled], |payload| {
            corrupt |= a.digest && !digest_ok(payload);
            if report.is_none() {
                report = meter.on_message(payload.len());
            }
        });
        if corrupt {
            return Err("a frame's digest does not match its payload".into());
        }
        buf.copy_within(used..filled, 0);
        filled -= used;
    }
    if let Some(r) = report {
        println!("{r}");
    }
    Ok(())
}

/// Forwards every byte from the upstream connection to the downstream one as it is read (the
/// frames are not re-parsed: a relay at memory-copy speed, the best a relay can do).
pub fn relay(a: &RoleArgs) -> Res<()> {
    let l = listen(a, a.rank)?;
    let mut down = connect(a, a.rank - 1)?;
    let mut up = accept(&l)?;
    let mut buf = vec![0u8; BUF];
    loop {
        match up.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => down.write_all(&buf[..n]).map_err(ctx("relay write"))?,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("relay read: {e}")),
        }
    }
}

/// Streams `count` frames through a 256 KiB `BufWriter` (batched writes; large payloads go
/// straight to the socket).
pub fn send(a: &RoleArgs) -> Res<()> {
    let s = connect(a, a.rank)?;
    let body = vec![0x5au8; a.payload];
    let mut w = BufWriter::with_capacity(BUF, s);
    if a.digest {
        // The digest counts in the payload's length: the same bytes on the wire as without.
        let body = body.get(8..).unwrap_or_default();
        let len = (8 + body.len() as u32).to_le_bytes();
        for _ in 0..a.count {
            w.write_all(&len).map_err(ctx("write"))?;
            w.write_all(&XxHash3_64::oneshot(body).to_le_bytes())
                .map_err(ctx("write"))?;
            w.write_all(body).map_err(ctx("write"))?;
        }
    } else {
        let len = (a.payload as u32).to_le_bytes();
        for _ in 0..a.count {
            w.write_all(&len).map_err(ctx("write"))?;
            w.write_all(&body).map_err(ctx("write"))?;
        }
    }
    w.flush().map_err(ctx("flush"))?;
    // Half-close, then wait for the next hop to close, so no byte is cut off by an early exit.
    let mut s = w.into_inner().map_err(|e| format!("flush: {e}"))?;
    let _ = s.shutdown(std::net::Shutdown::Write);
    let _ = s.read(&mut [0u8; 1]);
    Ok(())
}

/// Echoes every complete frame back from a mio loop, as tbon's loop does from a callback.
pub fn echo(a: &RoleArgs) -> Res<()> {
    let l = listen(a, 0)?;
    let s = accept(&l)?;
    s.set_nonblocking(true).map_err(ctx("nonblocking"))?;
    let mut s = mio::net::TcpStream::from_std(s);
    let mut poll = mio::Poll::new().map_err(ctx("poll"))?;
    poll.registry()
        .register(&mut s, mio::Token(0), mio::Interest::READABLE)
        .map_err(ctx("register"))?;
    let mut events = mio::Events::with_capacity(16);
    let mut buf = vec![0u8; BUF];
    let mut filled = 0;
    loop {
        poll.poll(&mut events, None).map_err(ctx("poll"))?;
        loop {
            match s.read(&mut buf[filled..]) {
                Ok(0) => return Ok(()),
                Ok(n) => filled += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("echo read: {e}")),
            }
            let used = frames(&buf[..filled], |_| {});
            write_all_nb(&mut s, &buf[..used])?;
            buf.copy_within(used..filled, 0);
            filled -= used;
        }
    }
}

/// Small writes on a non-blocking socket: retry until all is taken (only ever a few bytes).
fn write_all_nb(s: &mut mio::net::TcpStream, mut b: &[u8]) -> Res<()> {
    while !b.is_empty() {
        match s.write(b) {
            Ok(n) => b = &b[n..],
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                std::thread::yield_now()
            }
            Err(e) => return Err(format!("write: {e}")),
        }
    }
    Ok(())
}

/// The plain mio ping-pong with tbon's wake-up model: the application thread hands each ping
/// to a mio loop thread over a bounded channel and wakes it with a `Waker` only if the loop
/// announced it is going to sleep; the loop hands each pong back over a channel, and then,
/// as tbon's loop does after a hand-over (`tbon::limits::LINGER_US`), waits a little for the
/// next ping before it sleeps.
pub fn ping(a: &RoleArgs) -> Res<()> {
    let s = connect(a, 0)?;
    s.set_nonblocking(true).map_err(ctx("nonblocking"))?;
    let mut s = mio::net::TcpStream::from_std(s);
    let mut poll = mio::Poll::new().map_err(ctx("poll"))?;
    poll.registry()
        .register(&mut s, mio::Token(0), mio::Interest::READABLE)
        .map_err(ctx("register"))?;
    let waker = Arc::new(mio::Waker::new(poll.registry(), mio::Token(1)).map_err(ctx("waker"))?);
    let asleep = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let (cmd_tx, cmd_rx) = crossbeam_channel::bounded::<Vec<u8>>(1024);
    let (pong_tx, pong_rx) = crossbeam_channel::bounded::<()>(1024);
    let (asleep2, stop2) = (asleep.clone(), stop.clone());
    let looper = std::thread::spawn(move || -> Res<()> {
        let mut events = mio::Events::with_capacity(16);
        let mut buf = vec![0u8; BUF];
        let mut filled = 0;
        let mut handed = false;
        while !stop2.load(Ordering::Relaxed) {
            if std::mem::take(&mut handed) {
                let until = Instant::now() + Duration::from_micros(tbon::limits::LINGER_US);
                while cmd_rx.is_empty() && Instant::now() < until {
                    std::hint::spin_loop();
                }
            }
            while let Ok(frame) = cmd_rx.try_recv() {
                write_all_nb(&mut s, &frame)?;
            }
            asleep2.store(true, Ordering::SeqCst);
            let timeout = if cmd_rx.is_empty() {
                Some(Duration::from_millis(100))
            } else {
                Some(Duration::ZERO)
            };
            let res = poll.poll(&mut events, timeout);
            asleep2.store(false, Ordering::SeqCst);
            res.map_err(ctx("poll"))?;
            loop {
                match s.read(&mut buf[filled..]) {
                    Ok(0) => return Ok(()),
                    Ok(n) => filled += n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(format!("ping read: {e}")),
                }
                let used = frames(&buf[..filled], |_| {
                    let _ = pong_tx.try_send(());
                    handed = true;
                });
                buf.copy_within(used..filled, 0);
                filled -= used;
            }
        }
        Ok(())
    });
    let mut frame = (a.payload as u32).to_le_bytes().to_vec();
    frame.extend(std::iter::repeat_n(0x5au8, a.payload));
    let warm = (a.count / 10).max(100);
    let mut samples = Vec::with_capacity(a.count as usize);
    for i in 0..warm + a.count {
        let t = Instant::now();
        cmd_tx.send(frame.clone()).map_err(ctx("ping"))?;
        if asleep.swap(false, Ordering::SeqCst) {
            waker.wake().map_err(ctx("wake"))?;
        }
        pong_rx.recv_timeout(GUARD).map_err(ctx("pong"))?;
        if i >= warm {
            samples.push(t.elapsed());
        }
    }
    stop.store(true, Ordering::Relaxed);
    let _ = waker.wake();
    let _ = looper.join();
    let p50 = quantile_us(&mut samples, 0.5);
    let p99 = quantile_us(&mut samples, 0.99);
    println!("{}", serde_json::json!({"p50_us": p50, "p99_us": p99}));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_frame_is_checked_against_its_payload() {
        let body = vec![7u8; 1000];
        let mut payload = XxHash3_64::oneshot(&body).to_le_bytes().to_vec();
        payload.extend_from_slice(&body);
        assert!(digest_ok(&payload));
        let mut bad = payload.clone();
        bad[500] ^= 1;
        assert!(!digest_ok(&bad), "a flipped bit");
        assert!(!digest_ok(&payload[..7]), "shorter than a digest");
        let mut wire = (payload.len() as u32).to_le_bytes().to_vec();
        wire.extend_from_slice(&payload);
        let mut seen = Vec::new();
        assert_eq!(frames(&wire, |p| seen.push(p.len())), wire.len());
        assert_eq!(seen, [payload.len()]);
        assert_eq!(frames(&wire[..wire.len() - 1], |_| panic!("partial")), 0);
    }
}
