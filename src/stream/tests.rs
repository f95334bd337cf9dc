//! Deterministic two-peer tests of the stream core: a producer and a consumer exchanging
//! messages by hand (encoded and decoded, as on a connection), with a slow consumer, a
//! cancel, corrupt and out-of-credit chunks, a resume after a broken path, and timeouts.

use super::*;
use bytes::Bytes;
use std::time::{Duration, Instant};

const IDLE: Duration = Duration::from_secs(5);

/// The data of the tests' service: byte i is (i * 7) mod 251.
fn data(len: usize) -> Bytes {
    (0..len)
        .map(|i| ((i * 7) % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

/// Carries one message through its wire form.
fn wire(m: StreamMsg, id: u64) -> StreamMsg {
    let (got, m) = StreamMsg::decode(&m.encode(id)).expect("decodes");
    assert_eq!(got, id);
    m
}

/// The producer's side for the consumer's `Open`.
fn accept(c: &mut Incoming, at: Rank) -> Outgoing {
    match c.poll_msg().map(|m| wire(m, c.id())) {
        Some(StreamMsg::Open { offset, window, .. }) => Outgoing::new(c.id(), at, offset, window),
        other => panic!("expected an Open, got {other:?}"),
    }
}

/// Moves every message between the two; returns the bytes the consumer got.
fn exchange(now: Instant, p: &mut Outgoing, c: &mut Incoming) -> Vec<u8> {
    let mut got = Vec::new();
    while let Some(m) = p.poll_msg() {
        match wire(m, p.id()) {
            StreamMsg::Data {
                offset,
                digest,
                bytes,
            } => {
                if let Some(b) = c
                    .handle_data(now, offset, digest, bytes)
                    .expect("a good chunk")
                {
                    got.extend_from_slice(&b);
                }
            }
            StreamMsg::End { total, digests } => {
                c.handle_end(now, total, digests);
            }
            StreamMsg::Fail { code, reason } => c.handle_fail(code, reason),
            other => panic!("the producer sent {other:?}"),
        }
    }
    while let Some(m) = c.poll_msg() {
        match wire(m, c.id()) {
            StreamMsg::Credit { upto } => p.handle_credit(upto).expect("a granted credit"),
            StreamMsg::Cancel => p.handle_cancel(),
            other => panic!("the consumer sent {other:?}"),
        }
    }
    got
}

#[test]
fn a_slow_consumer_holds_the_producer_to_its_window() {
    let now = Instant::now();
    let window = 64 * 1024;
    let mut c = Incoming::open(
        now,
        1,
        3,
        "file",
        Bytes::from_static(b"/ckpt"),
        window,
        IDLE,
    );
    let mut p = accept(&mut c, 9);
    let all = data(1 << 20);
    let mut rest = all.clone();
    let (mut got, mut sent, mut consumed) = (Vec::new(), 0u64, 0u64);
    let mut turns = 0;
    while c.status() == &Status::Streaming {
        turns += 1;
        assert!(turns < 10_000, "no progress");
        sent += p.write(&mut rest).unwrap() as u64;
        // Sent and not yet consumed: never more than the window, whatever the stream's size.
        assert!(
            sent - consumed <= u64::from(window),
            "{sent} sent, {consumed} consumed"
        );
        if rest.is_empty() && p.room() > 0 && !p.is_done() {
            p.finish().unwrap();
        }
        got.extend(exchange(now, &mut p, &mut c));
        // The application reads at most a quarter of a window per turn.
        let n = (got.len() as u64 - consumed).min(16 * 1024);
        consumed += n;
        c.consumed(now, n);
        exchange(now, &mut p, &mut c);
    }
    assert_eq!(c.status(), &Status::Finished);
    assert_eq!(got, all[..]);
    assert!(p.is_done());
    // Beyond the first window, the stream moved at the reader's 16 KiB per turn.
    let paced = ((1 << 20) - u64::from(window)) / (16 * 1024);
    assert!(
        turns >= paced,
        "the slow reader paced the stream ({turns} turns)"
    );
}

#[test]
fn a_cancel_reaches_the_producer() {
    let now = Instant::now();
    let mut c = Incoming::open(now, 2, 3, "file", Bytes::new(), 1024, IDLE);
    let mut p = accept(&mut c, 9);
    let mut d = data(4096);
    p.write(&mut d).unwrap();
    exchange(now, &mut p, &mut c);
    c.cancel();
    assert_eq!(c.status(), &Status::Failed(StreamError::Cancelled));
    exchange(now, &mut p, &mut c);
    assert_eq!(p.write(&mut d), Err(StreamError::Cancelled));
    assert!(p.is_done());
}

#[test]
fn a_corrupt_chunk_or_one_beyond_the_credit_fails_the_stream() {
    let now = Instant::now();
    let mut c = Incoming::open(now, 3, 3, "file", Bytes::new(), 1024, IDLE);
    let err = c.handle_data(now, 0, 12345, Bytes::from_static(b"abc"));
    assert_eq!(err, Err(StreamError::Corrupt { offset: 0 }));
    assert!(matches!(
        c.status(),
        Status::Failed(StreamError::Corrupt { .. })
    ));
    let mut c = Incoming::open(now, 4, 3, "file", Bytes::new(), 16, IDLE);
    let big = data(17);
    let d = digest::chunk(0, &big);
    assert!(matches!(
        c.handle_data(now, 0, d, big),
        Err(StreamError::Protocol(_))
    ));
    // The producer is told to stop: Open, then Cancel.
    assert!(matches!(c.poll_msg(), Some(StreamMsg::Open { .. })));
    assert_eq!(c.poll_msg(), Some(StreamMsg::Cancel));
    // A credit no consumer could have granted is the consumer's protocol error.
    let mut p = Outgoing::new(5, 3, 0, 16);
    assert!(p.handle_credit(u64::MAX).is_err());
}

#[test]
fn a_broken_path_resumes_at_the_byte_the_consumer_stands_at() {
    let now = Instant::now();
    let mut c = Incoming::open(now, 20, 3, "file", Bytes::new(), 8192, IDLE);
    let mut p = accept(&mut c, 9);
    let all = data(100_000);
    let mut rest = all.clone();
    p.write(&mut rest).unwrap();
    // The first chunk arrives; the relay dies with the rest.
    let mut got = Vec::new();
    if let Some(StreamMsg::Data {
        offset,
        digest,
        bytes,
    }) = p.poll_msg()
    {
        got.extend_from_slice(&c.handle_data(now, offset, digest, bytes).unwrap().unwrap());
    }
    let stood_at = c.received();
    assert_eq!(stood_at as usize, got.len());
    c.consumed(now, stood_at);
    c.resume(now, 21);
    let mut p2 = accept(&mut c, 9);
    // The old producer's late frames belong to id 20: the driver drops them (no such stream).
    assert_eq!(c.id(), 21);
    let mut rest = all.slice(stood_at as usize..);
    while !rest.is_empty() {
        p2.write(&mut rest).unwrap();
        let new = exchange(now, &mut p2, &mut c);
        c.consumed(now, new.len() as u64);
        got.extend(new);
        exchange(now, &mut p2, &mut c);
    }
    p2.finish().unwrap();
    got.extend(exchange(now, &mut p2, &mut c));
    assert_eq!(c.status(), &Status::Finished);
    assert_eq!(got, all[..], "no byte lost or repeated across the resume");
}

#[test]
fn the_producer_fails_or_dies_or_goes_quiet() {
    let now = Instant::now();
    let mut c = Incoming::open(now, 30, 3, "file", Bytes::new(), 1024, IDLE);
    let mut p = accept(&mut c, 9);
    p.fail(2, "no such file").unwrap();
    exchange(now, &mut p, &mut c);
    assert_eq!(
        c.status(),
        &Status::Failed(StreamError::Producer {
            code: 2,
            reason: "no such file".into()
        })
    );
    let mut c = Incoming::open(now, 31, 3, "file", Bytes::new(), 1024, IDLE);
    c.handle_producer_failed();
    assert_eq!(c.status(), &Status::Failed(StreamError::ProducerDied(3)));
    let mut c = Incoming::open(now, 32, 3, "file", Bytes::new(), 1024, IDLE);
    assert!(matches!(c.poll_msg(), Some(StreamMsg::Open { .. })));
    // A quarter of the idle time without news: the producer is asked where it stands.
    assert_eq!(c.poll_timeout(), Some(now + IDLE / 4));
    assert!(c.handle_timeout(now + IDLE / 4));
    assert_eq!(c.poll_msg().map(|m| wire(m, 32)), Some(StreamMsg::Probe));
    assert!(!c.wants_resume());
    assert_eq!(c.poll_timeout(), Some(now + IDLE / 2));
    c.handle_timeout(now + IDLE);
    assert_eq!(c.status(), &Status::Failed(StreamError::TimedOut));
    assert_eq!(c.poll_timeout(), None);
}

#[test]
fn an_end_that_does_not_add_up_is_not_finished() {
    let now = Instant::now();
    let mut c = Incoming::open(now, 40, 3, "file", Bytes::new(), 1024, IDLE);
    let chunk = data(100);
    let d = digest::chunk(0, &chunk);
    c.handle_data(now, 0, d, chunk.clone()).unwrap();
    // An end short of the bytes that arrived is a lie; one beyond them, lost chunks (a
    // resume: see `an_end_beyond_the_bytes_that_arrived_resumes_like_a_gap`).
    assert!(matches!(
        c.handle_end(now, 50, d),
        Status::Failed(StreamError::Protocol(_))
    ));
    let mut c = Incoming::open(now, 42, 3, "file", Bytes::new(), 1024, IDLE);
    c.handle_data(now, 0, d, chunk).unwrap();
    assert_eq!(c.handle_end(now, 200, d), &Status::Streaming);
    assert!(c.wants_resume());
    let mut c = Incoming::open(now, 41, 3, "file", Bytes::new(), 1024, IDLE);
    let chunk = data(100);
    let d = digest::chunk(0, &chunk);
    c.handle_data(now, 0, d, chunk).unwrap();
    assert!(matches!(
        c.handle_end(now, 100, d ^ 1),
        Status::Failed(StreamError::Corrupt { .. })
    ));
}

#[test]
fn a_gap_asks_for_a_resume_and_resumes_are_bounded() {
    let now = Instant::now();
    let mut c = Incoming::open(now, 50, 3, "file", Bytes::new(), 1024, IDLE);
    let chunk = data(10);
    let d = digest::chunk(20, &chunk);
    assert_eq!(c.handle_data(now, 20, d, chunk), Ok(None));
    assert!(c.wants_resume(), "a chunk before offset 20 was lost");
    for i in 0..crate::limits::STREAM_RESUMES_MAX {
        c.resume(now, 100 + u64::from(i));
        assert_eq!(c.status(), &Status::Streaming);
    }
    c.resume(now, 999);
    assert_eq!(c.status(), &Status::Failed(StreamError::TimedOut));
}

#[test]
fn a_consumer_that_holds_every_granted_byte_runs_no_idle_clock() {
    let now = Instant::now();
    let mut c = Incoming::open(now, 40, 3, "file", Bytes::new(), 1024, IDLE);
    let mut p = accept(&mut c, 9);
    let mut all = data(1024);
    p.write(&mut all).unwrap();
    let got = exchange(now, &mut p, &mut c);
    assert_eq!(got.len(), 1024);
    // The producer waits for the application now: no resume, no timeout, however long.
    assert_eq!(c.poll_timeout(), None);
    c.handle_timeout(now + IDLE * 10);
    assert_eq!(c.status(), &Status::Streaming);
    // The application reads: credit goes out and the clock starts from then.
    let later = now + IDLE * 10;
    c.consumed(later, 1024);
    assert_eq!(c.poll_timeout(), Some(later + IDLE / 4));
}

#[test]
fn silence_probes_a_quarter_apart_and_still_ends_at_the_idle_time() {
    let now = Instant::now();
    let mut c = Incoming::open(now, 50, 3, "slow", Bytes::new(), 1024, IDLE);
    let mut p = accept(&mut c, 9);
    let mut probes = 0;
    let mut t = now;
    // A producer whose service never writes: each probe is answered "nothing sent yet",
    // which is no news: probes at each quarter, no resume, then the end at `IDLE`.
    while c.status() == &Status::Streaming {
        t = c.poll_timeout().expect("a streaming stream has a deadline");
        if c.handle_timeout(t) {
            probes += 1;
        }
        while let Some(m) = c.poll_msg() {
            if wire(m, 50) == StreamMsg::Probe {
                c.handle_position(p.sent(), p.upto());
            }
        }
        assert!(!c.wants_resume(), "a slow service is not asked again");
        assert!(probes <= 4, "a probe storm");
    }
    assert_eq!(c.status(), &Status::Failed(StreamError::TimedOut));
    assert_eq!(t, now + IDLE, "it ends at the idle time, not later");
    assert_eq!(probes, 3);
    assert!(
        p.write(&mut data(1)).is_ok(),
        "the producer was never cancelled before"
    );
}

/// Outside-in review (session 45): a service slower to its first bytes than a quarter of the
/// idle time was called again at each quarter (a resume each), nine service threads for one
/// stream. A probe's answer tells a slow producer from a lost message.
#[test]
fn a_probe_resumes_only_what_was_lost() {
    let now = Instant::now();
    let quarter = now + IDLE / 4;
    // Slow: nothing sent yet. The stream stays, and finishes once the service writes.
    let mut c = Incoming::open(now, 70, 3, "slow", Bytes::new(), 1024, IDLE);
    let mut p = accept(&mut c, 9);
    assert!(c.handle_timeout(quarter));
    assert_eq!(c.poll_msg(), Some(StreamMsg::Probe));
    c.handle_position(p.sent(), p.upto());
    assert!(!c.wants_resume());
    assert_eq!(c.poll_msg(), None, "nothing to grant again");
    let all = data(700);
    p.write(&mut all.clone()).unwrap();
    p.finish().unwrap();
    assert_eq!(exchange(quarter, &mut p, &mut c), all[..]);
    assert_eq!(c.status(), &Status::Finished);

    // Data sent and lost on the way: resume at the byte the consumer stands at.
    let mut c = Incoming::open(now, 71, 3, "file", Bytes::new(), 1024, IDLE);
    let mut p = accept(&mut c, 9);
    p.write(&mut data(300)).unwrap();
    while p.poll_msg().is_some() {}
    assert_eq!(p.sent(), 300);
    assert!(c.handle_timeout(quarter));
    c.handle_position(p.sent(), p.upto());
    assert!(c.wants_resume());
    c.resume(quarter, 72);
    assert!(
        c.poll_timeout().is_some_and(|t| t <= now + IDLE),
        "a probe's find is no news"
    );

    // Data still waiting at the producer (not sent) is not lost.
    let mut c = Incoming::open(now, 73, 3, "file", Bytes::new(), 1024, IDLE);
    let mut p = accept(&mut c, 9);
    p.write(&mut data(300)).unwrap();
    assert_eq!(p.sent(), 0);
    c.handle_position(p.sent(), p.upto());
    assert!(!c.wants_resume());

    // A credit lost on the way: granted again, nothing resumed.
    let mut c = Incoming::open(now, 74, 3, "file", Bytes::new(), 1024, IDLE);
    let mut p = accept(&mut c, 9);
    p.write(&mut data(1024)).unwrap();
    assert_eq!(exchange(now, &mut p, &mut c).len(), 1024);
    c.consumed(now, 1024);
    assert!(
        matches!(c.poll_msg(), Some(StreamMsg::Credit { .. })),
        "lost"
    );
    assert_eq!(p.room(), 0);
    assert!(c.handle_timeout(quarter));
    assert_eq!(c.poll_msg(), Some(StreamMsg::Probe));
    c.handle_position(p.sent(), p.upto());
    assert!(!c.wants_resume());
    match c.poll_msg() {
        Some(StreamMsg::Credit { upto }) => p.handle_credit(upto).unwrap(),
        other => panic!("expected the credit again, got {other:?}"),
    }
    assert_eq!(p.room(), 1024);

    // The producer does not know the stream (its open or its end was lost): resume.
    let mut c = Incoming::open(now, 75, 3, "file", Bytes::new(), 1024, IDLE);
    c.handle_unknown();
    assert!(c.wants_resume());
}

/// Found by the simulator (regression seed 4712): chunks lost with a dropped connection, and
/// the `End` read after on a new one, failed the stream instead of resuming it.
#[test]
fn an_end_beyond_the_bytes_that_arrived_resumes_like_a_gap() {
    let now = Instant::now();
    let mut c = Incoming::open(now, 60, 3, "file", Bytes::new(), 4096, IDLE);
    c.handle_end(now, 1530, 0);
    assert_eq!(c.status(), &Status::Streaming);
    assert!(c.wants_resume());
    c.resume(now, 61);
    assert!(matches!(
        c.poll_msg(),
        Some(StreamMsg::Open { offset: 0, .. })
    ));
}

#[test]
fn chunks_hashed_by_the_writer_are_taken_whole_and_checked_by_the_consumer() {
    let now = Instant::now();
    let mut c = Incoming::open(now, 60, 3, "file", Bytes::new(), 64 * 1024, IDLE);
    let mut p = accept(&mut c, 9);
    let all = data(12_000);
    // As the daemon's writer does: 4,000-byte chunks, each hashed at its offset.
    for at in (0..12_000).step_by(4_000) {
        let mut chunk = all.slice(at..at + 4_000);
        let made = ChunkDigest::of(at as u64, &chunk);
        assert_eq!(p.write_chunk(&mut chunk, Some(made)), Ok(4_000));
        assert!(chunk.is_empty());
    }
    p.finish().unwrap();
    let got = exchange(now, &mut p, &mut c);
    assert_eq!(c.status(), &Status::Finished);
    assert_eq!(got, all[..]);
}

#[test]
fn a_digest_made_for_another_offset_or_size_is_not_used() {
    let now = Instant::now();
    let mut c = Incoming::open(now, 61, 3, "file", Bytes::new(), 1 << 20, IDLE);
    let mut p = accept(&mut c, 9).with_msg_max(1024 + wire::DATA_HEADER_LEN);
    let all = data(3_000);
    // Made at the wrong offset: hashed again here, the stream stays good.
    let mut first = all.slice(..500);
    let stale = ChunkDigest::of(7, &first);
    assert_eq!(p.write_chunk(&mut first, Some(stale)), Ok(500));
    // Larger than a chunk (1 KiB here): cut and hashed here, as `write` does.
    let mut rest = all.slice(500..);
    let whole = ChunkDigest::of(500, &rest);
    assert_eq!(p.write_chunk(&mut rest, Some(whole)), Ok(2_500));
    p.finish().unwrap();
    let got = exchange(now, &mut p, &mut c);
    assert_eq!(c.status(), &Status::Finished);
    assert_eq!(got, all[..]);
}

#[test]
fn a_wrong_digest_from_the_writer_fails_the_stream_corrupt() {
    let now = Instant::now();
    let mut c = Incoming::open(now, 62, 3, "file", Bytes::new(), 1 << 20, IDLE);
    let mut p = accept(&mut c, 9);
    let mut chunk = data(100);
    let wrong = ChunkDigest::of(0, b"other bytes");
    assert_eq!(p.write_chunk(&mut chunk, Some(wrong)), Ok(100));
    let m = p.poll_msg().map(|m| wire(m, p.id()));
    let Some(StreamMsg::Data {
        offset,
        digest,
        bytes,
    }) = m
    else {
        panic!("expected data, got {m:?}");
    };
    assert_eq!(
        c.handle_data(now, offset, digest, bytes),
        Err(StreamError::Corrupt { offset: 0 })
    );
}

#[test]
fn with_reader_checks_the_digest_is_left_to_the_reader_and_its_report_fails_the_stream() {
    let now = Instant::now();
    let mut c =
        Incoming::open(now, 63, 3, "file", Bytes::new(), 1024, IDLE).with_reader_checks(true);
    let _open = c.poll_msg();
    // A digest that does not match passes here: the reader checks it as it takes the bytes.
    let chunk = data(100);
    assert_eq!(c.handle_data(now, 0, 12345, chunk.clone()), Ok(Some(chunk)));
    // Order and credit are still checked here.
    let mut other =
        Incoming::open(now, 64, 3, "file", Bytes::new(), 64, IDLE).with_reader_checks(true);
    assert!(matches!(
        other.handle_data(now, 0, 1, data(100)),
        Err(StreamError::Protocol(_))
    ));
    c.handle_corrupt(0);
    assert_eq!(
        c.status(),
        &Status::Failed(StreamError::Corrupt { offset: 0 })
    );
    assert_eq!(c.poll_msg(), Some(StreamMsg::Cancel));
    // Once over, a second report changes nothing.
    c.handle_corrupt(40);
    assert_eq!(
        c.status(),
        &Status::Failed(StreamError::Corrupt { offset: 0 })
    );
    assert_eq!(c.poll_msg(), None);
}
