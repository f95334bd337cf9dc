//! Streams between real daemons on loopback (issue "Streams"), through the Rust API:
//! `serve` and `fetch` over the tree and over a direct link, every end (finished, no service,
//! the producer's failure, a dropped writer, a cancel, a death), a slow reader holding the
//! producer to its window, and a relay's death in the middle of a stream (it resumes). A
//! radix-2 tree of 15: ranks 7 and 14 are leaves five relays apart. No timing assertions:
//! timeouts only guard against hangs.

mod common;

use common::{HANG_GUARD, loopback_config, start_dvm_with};
use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tbon::{
    Daemon, FAIL_ABANDONED, FetchOptions, RouteSetting, StreamError, StreamItem, StreamRequest,
    StreamWriter,
};

const SIZE: u32 = 15;
const PRODUCER: u32 = 7;
const CONSUMER: u32 = 14;

fn dvm(route: RouteSetting) -> Vec<Daemon> {
    start_dvm_with(SIZE, |_| {
        let mut c = loopback_config(2);
        c.route = route;
        c
    })
}

/// The byte at `i` of object `seed`.
fn content(seed: u64, i: u64) -> u8 {
    (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 7) as u8
}

/// A service whose request is `seed: u64, len: u64` (big-endian) and whose answer is `len`
/// bytes of `content(seed, _)`, written in pieces of `piece` bytes from the request's offset.
fn serve_objects(d: &Daemon, piece: usize, written: Arc<AtomicU64>) {
    d.serve("object", move |req: StreamRequest, mut w: StreamWriter| {
        let seed = u64::from_be_bytes(req.request[..8].try_into().unwrap());
        let len = u64::from_be_bytes(req.request[8..16].try_into().unwrap());
        let mut at = req.offset;
        while at < len {
            let n = (len - at).min(piece as u64);
            let b: Vec<u8> = (at..at + n).map(|i| content(seed, i)).collect();
            if w.write(b).is_err() {
                return;
            }
            at += n;
            written.store(at, Ordering::SeqCst);
        }
        let _ = w.finish();
    })
    .unwrap();
}

fn request(seed: u64, len: u64) -> Vec<u8> {
    let mut r = seed.to_be_bytes().to_vec();
    r.extend_from_slice(&len.to_be_bytes());
    r
}

fn check(seed: u64, from: u64, got: &[u8]) {
    for (k, b) in got.iter().enumerate() {
        let i = from + k as u64;
        assert_eq!(*b, content(seed, i), "byte {i} of object {seed}");
    }
}

#[test]
fn a_consumer_reads_a_file_sized_object_through_the_tree_and_over_a_direct_link() {
    for route in [RouteSetting::Tree, RouteSetting::Direct] {
        let dvm = dvm(route);
        serve_objects(&dvm[PRODUCER as usize], 100_000, Arc::default());
        let len = 24 << 20;
        let mut s = dvm[CONSUMER as usize]
            .fetch(PRODUCER, "object", request(5, len))
            .unwrap();
        let mut got = Vec::new();
        s.reader().read_to_end(&mut got).unwrap();
        assert_eq!(got.len() as u64, len, "{route}");
        check(5, 0, &got);
        assert_eq!(s.outcome(), Some(&Ok(())));
        let c = dvm[CONSUMER as usize].counters().unwrap();
        if route == RouteSetting::Direct {
            assert!(c.direct.links_opened >= 1, "{c:?}");
        }
    }
}

#[test]
fn stream_data_takes_bulk_connections_and_daemons_without_them_relay_it_too() {
    // Odd ranks keep stream data on their links (`bulk_connection = false`), even ranks dial
    // bulk connections: the path 7 -> 3 -> 1 -> 0 -> 2 -> 6 -> 14 mixes both.
    let dvm = start_dvm_with(SIZE, |r| {
        let mut c = loopback_config(2);
        c.bulk_connection = r % 2 == 0;
        c
    });
    serve_objects(&dvm[PRODUCER as usize], 100_000, Arc::default());
    let len = 16 << 20;
    let mut s = dvm[CONSUMER as usize]
        .fetch(PRODUCER, "object", request(9, len))
        .unwrap();
    let mut got = Vec::new();
    s.reader().read_to_end(&mut got).unwrap();
    assert_eq!(got.len() as u64, len);
    check(9, 0, &got);
    assert_eq!(s.outcome(), Some(&Ok(())));
    let bulk = |r: u32| dvm[r as usize].counters().unwrap().bulk_connections;
    for r in [PRODUCER, 3, 1] {
        assert_eq!(bulk(r), 0, "rank {r} has bulk connections switched off");
    }
    for r in [0, 2, 6] {
        assert!(
            bulk(r) >= 1,
            "rank {r} relayed the stream without a bulk connection"
        );
    }
}

#[test]
fn every_end_is_told_apart() {
    let dvm = dvm(RouteSetting::Tree);
    let (p, c) = (&dvm[PRODUCER as usize], &dvm[CONSUMER as usize]);
    p.serve("fails", |_, w: StreamWriter| {
        w.fail(7, "no such file").unwrap();
    })
    .unwrap();
    p.serve("drops", |_, w: StreamWriter| drop(w)).unwrap();
    let mut s = c.fetch(PRODUCER, "nothing", &b"x"[..]).unwrap();
    assert_eq!(
        s.next(),
        Some(Err(StreamError::NoService("nothing".into())))
    );
    assert_eq!(s.next(), None);
    let mut s = c.fetch(PRODUCER, "fails", &b"x"[..]).unwrap();
    assert_eq!(
        s.next(),
        Some(Err(StreamError::Producer {
            code: 7,
            reason: "no such file".into()
        }))
    );
    let mut s = c.fetch(PRODUCER, "drops", &b"x"[..]).unwrap();
    assert!(
        matches!(s.next(), Some(Err(StreamError::Producer { code, .. })) if code == FAIL_ABANDONED)
    );
    // Arguments are checked at once.
    assert!(c.fetch(SIZE, "object", &b""[..]).is_err());
    assert!(c.fetch(PRODUCER, &"s".repeat(256), &b""[..]).is_err());
    assert!(c.fetch(PRODUCER, "object", vec![0u8; 65 * 1024]).is_err());
    assert!(p.serve(&"s".repeat(256), |_, _| {}).is_err());
    // An empty answer finishes at once.
    serve_objects(p, 1000, Arc::default());
    let mut s = c.fetch(PRODUCER, "object", request(1, 0)).unwrap();
    assert_eq!(s.next(), None);
    assert_eq!(s.outcome(), Some(&Ok(())));
    // A daemon fetches from itself (found by an outside-in review: it never got an answer).
    let mut s = p.fetch(PRODUCER, "object", request(2, 3 << 20)).unwrap();
    let mut got = Vec::new();
    s.reader().read_to_end(&mut got).unwrap();
    assert_eq!(got.len(), 3 << 20);
    check(2, 0, &got);
}

#[test]
fn a_slow_reader_holds_the_producer_to_its_window_and_a_cancel_reaches_it() {
    let dvm = dvm(RouteSetting::Tree);
    let written = Arc::new(AtomicU64::new(0));
    let (tx, stopped) = crossbeam_channel::unbounded();
    dvm[PRODUCER as usize]
        .serve("endless", {
            let written = written.clone();
            move |_, mut w: StreamWriter| {
                let piece = bytes::Bytes::from(vec![1u8; 10_000]);
                let e = loop {
                    if let Err(e) = w.write(piece.clone()) {
                        break e;
                    }
                    written.store(w.offset(), Ordering::SeqCst);
                };
                tx.send(e).unwrap();
            }
        })
        .unwrap();
    let window = 256 * 1024;
    let opts = FetchOptions {
        window,
        ..FetchOptions::default()
    };
    let mut s = dvm[CONSUMER as usize]
        .fetch_with(PRODUCER, "endless", &b""[..], opts)
        .unwrap();
    let mut read = 0u64;
    for _ in 0..10 {
        read += s.next().unwrap().unwrap().len() as u64;
    }
    // The reader pauses: the producer stops within the window past what was read, however
    // long the pause (well past a quarter of the idle time: no resume, no timeout).
    std::thread::sleep(Duration::from_millis(500));
    let w = written.load(Ordering::SeqCst);
    assert!(
        w <= read + u64::from(window),
        "{w} written, {read} read, window {window}"
    );
    for _ in 0..30 {
        s.next().unwrap().unwrap();
    }
    s.cancel();
    assert_eq!(
        stopped.recv_timeout(HANG_GUARD).unwrap(),
        StreamError::Cancelled
    );
    // Read into a small buffer: only what was copied out counts as taken, so the producer
    // stays within the window of what was read, exactly (found by an outside-in review).
    written.store(0, Ordering::SeqCst);
    let mut s = dvm[CONSUMER as usize]
        .fetch_with(PRODUCER, "endless", &b""[..], opts)
        .unwrap();
    let mut buf = [0u8; 16 * 1024];
    let mut read = 0u64;
    while read < 300_000 {
        read += s.read(&mut buf).unwrap() as u64;
    }
    std::thread::sleep(Duration::from_millis(500));
    let w = written.load(Ordering::SeqCst);
    assert!(
        w <= read + u64::from(window),
        "{w} written, {read} read into a small buffer, window {window}"
    );
    drop(s);
    assert_eq!(
        stopped.recv_timeout(HANG_GUARD).unwrap(),
        StreamError::Cancelled
    );
}

#[test]
fn a_callback_reader_gets_every_chunk_then_the_end() {
    let dvm = dvm(RouteSetting::Tree);
    serve_objects(&dvm[PRODUCER as usize], 70_000, Arc::default());
    let (tx, rx) = crossbeam_channel::unbounded();
    let len = 3 << 20;
    dvm[CONSUMER as usize]
        .fetch_callback(
            PRODUCER,
            "object",
            request(9, len),
            FetchOptions::default(),
            move |item| tx.send(item).unwrap(),
        )
        .unwrap();
    let mut got = Vec::new();
    loop {
        match rx.recv_timeout(HANG_GUARD).unwrap() {
            StreamItem::Data(b) => got.extend_from_slice(&b),
            StreamItem::End(r) => {
                r.unwrap();
                break;
            }
        }
    }
    assert_eq!(got.len() as u64, len);
    check(9, 0, &got);
}

#[test]
fn deaths_end_the_other_side_and_a_relay_death_resumes_the_stream() {
    let dvm = dvm(RouteSetting::Tree);
    // A relay dies mid-stream (rank 3 is on the path 7 -> 3 -> 1 -> 0 -> 2 -> 6 -> 14): the
    // consumer resumes at the byte it stands at, and every byte arrives once, in order.
    serve_objects(&dvm[PRODUCER as usize], 50_000, Arc::default());
    let len = 16 << 20;
    let opts = FetchOptions {
        window: 512 * 1024,
        idle: Duration::from_secs(20),
        ..FetchOptions::default()
    };
    let mut s = dvm[CONSUMER as usize]
        .fetch_with(PRODUCER, "object", request(3, len), opts)
        .unwrap();
    let mut got = Vec::new();
    let mut killed = false;
    for chunk in s.by_ref() {
        got.extend_from_slice(&chunk.unwrap());
        if !killed && got.len() > 4 << 20 {
            dvm[3].abort();
            killed = true;
        }
    }
    assert_eq!(s.outcome(), Some(&Ok(())));
    assert_eq!(got.len() as u64, len);
    check(3, 0, &got);
    let c = dvm[CONSUMER as usize].counters().unwrap().streams;
    assert!(c.resumes >= 1, "{c:?}");
    assert_eq!((c.finished, c.bytes_received), (1, len));

    // The producer dies: the reader's stream ends `ProducerDied`.
    let (tx, rx) = crossbeam_channel::unbounded();
    dvm[9]
        .serve("slow", move |_, mut w: StreamWriter| {
            let _ = w.write(vec![0u8; 1000]);
            tx.send(()).unwrap();
            // Open until the daemon stops (its writer fails then, and a stop waits for the
            // handler to return).
            let t = Instant::now();
            while w.room().is_ok() && t.elapsed() < HANG_GUARD {
                std::thread::sleep(Duration::from_millis(5));
            }
        })
        .unwrap();
    let mut s = dvm[CONSUMER as usize].fetch(9, "slow", &b""[..]).unwrap();
    rx.recv_timeout(HANG_GUARD).unwrap();
    assert_eq!(s.next().unwrap().unwrap().len(), 1000);
    let t = Instant::now();
    dvm[9].abort();
    assert_eq!(s.next(), Some(Err(StreamError::ProducerDied(9))));
    assert!(t.elapsed() < HANG_GUARD);

    // The consumer dies: the producer's writer fails `ConsumerDied`. (The news of earlier
    // deaths may reach rank 12 meanwhile: its stream then resumes, which the producer's
    // first writer sees as `Cancelled`, and the service is called again for the rest.)
    let (tx, rx) = crossbeam_channel::unbounded();
    dvm[PRODUCER as usize]
        .serve("endless", move |_, mut w: StreamWriter| {
            let e = loop {
                if let Err(e) = w.write(vec![0u8; 10_000]) {
                    break e;
                }
            };
            let _ = tx.send(e);
        })
        .unwrap();
    let mut s = dvm[12].fetch(PRODUCER, "endless", &b""[..]).unwrap();
    s.next().unwrap().unwrap();
    dvm[12].abort();
    loop {
        match rx.recv_timeout(HANG_GUARD).unwrap() {
            StreamError::ConsumerDied(12) => break,
            StreamError::Cancelled => continue,
            e => panic!("the producer's writer failed {e}"),
        }
    }
}

#[test]
fn a_stream_with_its_own_route_asks_for_a_direct_link() {
    // Every daemon keeps the default `tree` setting but the producer, which grants (`auto`).
    let dvm = start_dvm_with(SIZE, |r| {
        let mut c = loopback_config(2);
        c.route = if r == PRODUCER {
            RouteSetting::Auto
        } else {
            RouteSetting::Tree
        };
        c
    });
    serve_objects(&dvm[PRODUCER as usize], 100_000, Arc::default());
    let len = 8 << 20;
    let opts = FetchOptions {
        route: Some(tbon::Route::Direct),
        ..FetchOptions::default()
    };
    let mut s = dvm[CONSUMER as usize]
        .fetch_with(PRODUCER, "object", request(11, len), opts)
        .unwrap();
    let mut got = Vec::new();
    s.reader().read_to_end(&mut got).unwrap();
    assert_eq!(got.len() as u64, len);
    check(11, 0, &got);
    let c = dvm[CONSUMER as usize].counters().unwrap();
    assert!(c.direct.links_opened >= 1, "{:?}", c.direct);
    // A stream that forbids a link asks for none (the link now open still carries it: a
    // message never overtakes an earlier one).
    let before = c.direct.requests_sent;
    let opts = FetchOptions {
        route: Some(tbon::Route::Tree),
        ..FetchOptions::default()
    };
    let mut s = dvm[12]
        .fetch_with(PRODUCER, "object", request(12, 1 << 20), opts)
        .unwrap();
    let mut got = Vec::new();
    s.reader().read_to_end(&mut got).unwrap();
    check(12, 0, &got);
    assert_eq!(dvm[12].counters().unwrap().direct.requests_sent, 0);
    assert_eq!(
        dvm[CONSUMER as usize]
            .counters()
            .unwrap()
            .direct
            .requests_sent,
        before
    );
}

/// No service handler runs once a stop has returned (the C API's safe point to free `user`
/// data): a handler whose write fails `ShutDown` and that takes a while to return is waited
/// for by `shutdown`, and likewise by `abort`.
#[test]
fn a_stop_returns_only_once_the_service_handlers_have_returned() {
    for abort in [false, true] {
        let dvm = start_dvm_with(2, |_| loopback_config(2));
        let returned = Arc::new(AtomicU64::new(0));
        let r = returned.clone();
        dvm[1]
            .serve(
                "slow-end",
                move |_req: StreamRequest, mut w: StreamWriter| {
                    // Writes until refused: the consumer holds its window, so a write waits for
                    // credit until the daemon stops.
                    while w.write(vec![7u8; 64 << 10]).is_ok() {}
                    std::thread::sleep(Duration::from_millis(300));
                    r.store(1, Ordering::SeqCst);
                },
            )
            .unwrap();
        let opts = FetchOptions {
            window: 256 << 10,
            ..FetchOptions::default()
        };
        let mut s = dvm[0].fetch_with(1, "slow-end", &b""[..], opts).unwrap();
        // The first chunk: the handler runs and has filled the window.
        assert!(matches!(s.next(), Some(Ok(_))));
        if abort {
            dvm[1].abort();
        } else {
            dvm[1].shutdown();
        }
        assert_eq!(
            returned.load(Ordering::SeqCst),
            1,
            "the stop returned before the handler (abort: {abort})"
        );
        drop(s);
    }
}

/// Outside-in review (session 45): a service slower to its first bytes than a quarter of the
/// stream's idle time (a file read from slow storage) was called again at each quarter, the
/// stream resumed each time: nine service threads for one stream. The consumer now probes
/// the producer, which answers where it stands: a slow service is called once.
#[test]
fn a_service_slower_than_a_quarter_of_the_idle_time_is_called_once() {
    let dvm = start_dvm_with(3, |_| loopback_config(2));
    let consumer = dvm[1].handle();
    let calls = Arc::new(AtomicU64::new(0));
    dvm[2]
        .serve("slow", {
            let calls = calls.clone();
            move |req: StreamRequest, mut w: StreamWriter| {
                calls.fetch_add(1, Ordering::SeqCst);
                // Slow to the first byte: past two of the consumer's probes (or, without them,
                // until the service is called a second time).
                let guard = Instant::now() + HANG_GUARD;
                while Instant::now() < guard
                    && calls.load(Ordering::SeqCst) < 2
                    && consumer.counters().is_ok_and(|c| c.streams.probes < 2)
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                let rest = (100_000 - req.offset) as usize;
                if w.write(vec![7u8; rest]).is_ok() {
                    let _ = w.finish();
                }
            }
        })
        .unwrap();
    let opts = FetchOptions {
        idle: Duration::from_secs(4),
        ..FetchOptions::default()
    };
    let mut s = dvm[1].fetch_with(2, "slow", &b""[..], opts).unwrap();
    let mut got = Vec::new();
    s.reader().read_to_end(&mut got).unwrap();
    assert_eq!(got, vec![7u8; 100_000]);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the service was called again"
    );
    let c = dvm[1].counters().unwrap().streams;
    assert!(c.probes >= 2, "{c:?}");
    assert_eq!((c.resumes, c.finished), (0, 1), "{c:?}");
}

/// Outside-in review (session 45): an orderly stop at one end of a stream reached the other
/// end only as a death, once the stop was found (1.55 s with the default settings; a blocked
/// writer waited that long). Failure detection is slowed here past the consumer's idle time
/// and the hang guard: only the stopping daemon's own message ends the other side in time.
#[test]
fn an_orderly_stop_at_either_end_ends_the_other_side_at_once() {
    orderly_stops(RouteSetting::Tree);
    // Over direct links too: a link granted and not yet connected when the end stops (the
    // window went by the tree before the grant) took the stop's message to a dial that the
    // stop then closed (outside-in review: half of such stops were found only as deaths).
    orderly_stops(RouteSetting::Direct);
}

fn orderly_stops(route: RouteSetting) {
    let dvm = start_dvm_with(4, |_| {
        let mut c = loopback_config(2);
        c.route = route;
        c.reconnect_base_ms = 300_000;
        c.reconnect_max_ms = 300_000;
        c.heartbeat_timeout_ms = 900_000;
        c
    });
    let (tx, stopped) = crossbeam_channel::unbounded();
    for p in [1, 3] {
        let tx = tx.clone();
        dvm[p]
            .serve("endless", move |_, mut w: StreamWriter| {
                let piece = bytes::Bytes::from(vec![1u8; 10_000]);
                let e = loop {
                    if let Err(e) = w.write(piece.clone()) {
                        break e;
                    }
                };
                let _ = tx.send((p, e));
            })
            .unwrap();
    }
    let opts = FetchOptions {
        window: 256 * 1024,
        idle: Duration::from_secs(30),
        ..FetchOptions::default()
    };
    // The producer (rank 3) stops: the consumer's stream ends `ProducerDied`, not `TimedOut`.
    let mut s = dvm[2].fetch_with(3, "endless", &b""[..], opts).unwrap();
    for _ in 0..5 {
        s.next().unwrap().unwrap();
    }
    dvm[3].handle().shutdown();
    // A writer of a stream that resumed meanwhile (over a direct link, the switch may lose
    // the link) ends `Cancelled` first.
    let last_end = |rank: usize| loop {
        match stopped.recv_timeout(HANG_GUARD).unwrap() {
            (r, StreamError::Cancelled) if r == rank => continue,
            (r, e) if r == rank => break e,
            _ => continue,
        }
    };
    assert_eq!(last_end(3), StreamError::ShutDown);
    for chunk in s.by_ref() {
        if chunk.is_err() {
            break;
        }
    }
    assert_eq!(s.outcome(), Some(&Err(StreamError::ProducerDied(3))));
    // The consumer (rank 2) stops: the producer's writer fails `ConsumerDied` at once.
    let mut s = dvm[2].fetch_with(1, "endless", &b""[..], opts).unwrap();
    for _ in 0..5 {
        s.next().unwrap().unwrap();
    }
    std::thread::spawn({
        let h = dvm[2].handle();
        move || h.shutdown()
    });
    assert_eq!(last_end(1), StreamError::ConsumerDied(2));
    drop(s);
}
