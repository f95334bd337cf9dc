//! The stream half of the harness workload (`tbon harness --pattern stream`): every daemon
//! serves objects whose bytes are a function of (seed, offset), and fetches `streams` of them
//! from other daemons, one at a time, spread over the run, checking every byte as it arrives.
//! Each fetch is recorded with its producer, its length, the bytes that arrived and its end,
//! for the harness to judge (`harness/check.rs`).

use bytes::Bytes;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tbon::{FetchOptions, Handle, StreamError, StreamWriter};

/// The service every daemon of a stream workload serves.
pub const SERVICE: &str = "harness-object";
/// The producer writes the object in pieces of this size.
const PIECE: usize = 256 * 1024;

/// Byte `i` of object `seed`.
pub fn content(seed: u64, i: u64) -> u8 {
    (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed).to_le_bytes()[(i & 7) as usize]
}

/// One fetch and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    pub index: u64,
    pub producer: u32,
    pub expected: u64,
    /// Bytes that arrived in order and matched the object.
    pub got: u64,
    /// `finished`, `wrong-byte`, or the error's name (see [`outcome_name`]).
    pub outcome: String,
}

/// The one-word name of a stream's end, as the results file and the report spell it.
pub fn outcome_name(e: &StreamError) -> &'static str {
    match e {
        StreamError::NoService(_) => "no-service",
        StreamError::Producer { .. } => "producer-failed",
        StreamError::ProducerDied(_) => "producer-died",
        StreamError::ConsumerDied(_) => "consumer-died",
        StreamError::Cancelled => "cancelled",
        StreamError::TimedOut => "timed-out",
        StreamError::Corrupt { .. } => "corrupt",
        StreamError::Protocol(_) => "protocol",
        StreamError::ShutDown => "shut-down",
        StreamError::Refused(_) => "refused",
        _ => "other",
    }
}

/// Serves [`SERVICE`]: the request is `seed, len` (big-endian u64s); the answer `len` bytes
/// of [`content`]`(seed, _)` from the request's offset.
pub fn serve(h: &Handle) -> Result<(), String> {
    h.serve(SERVICE, |req, mut w: StreamWriter| {
        let word = |i: usize| {
            req.request
                .get(i..i + 8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes)
        };
        let (Some(seed), Some(len)) = (word(0), word(8)) else {
            let _ = w.fail(1, "a request is 16 bytes: seed, length");
            return;
        };
        let mut at = req.offset;
        while at < len {
            let n = (len - at).min(PIECE as u64);
            let piece: Vec<u8> = (at..at + n).map(|i| content(seed, i)).collect();
            if w.write(piece).is_err() {
                return;
            }
            at += n;
        }
        let _ = w.finish();
    })
    .map_err(|e| e.to_string())
}

/// The fetching side: runs on a thread of its own.
pub struct Fetcher {
    pub h: Handle,
    pub streams: u64,
    pub bytes: u64,
    /// The streams are spread evenly over this long.
    pub span: Duration,
    pub seed: u64,
    pub record: Arc<Mutex<Vec<Fetched>>>,
    pub started: Arc<AtomicU64>,
    pub ended: Arc<AtomicU64>,
    pub done: Arc<AtomicBool>,
}

impl Fetcher {
    /// Fetches the streams one after the other; the producer of stream `i` is the `i`-th
    /// other rank after this one.
    pub fn run(self) {
        let (me, size) = (self.h.rank(), self.h.size());
        let start = Instant::now();
        for i in 0..self.streams {
            if size < 2 {
                break;
            }
            let at = start + self.span.mul_f64(i as f64 / self.streams as f64);
            if let Some(wait) = at.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let producer = ((u64::from(me) + 1 + i % u64::from(size - 1)) % u64::from(size)) as u32;
            let seed = self.seed ^ (u64::from(me) << 40) ^ i;
            self.started.fetch_add(1, Ordering::Relaxed);
            let f = self.fetch_one(i, producer, seed);
            let stop = f.outcome == "shut-down";
            self.record
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(f);
            self.ended.fetch_add(1, Ordering::Relaxed);
            if stop {
                break;
            }
        }
        self.done.store(true, Ordering::SeqCst);
    }

    fn fetch_one(&self, index: u64, producer: u32, seed: u64) -> Fetched {
        let mut request = seed.to_be_bytes().to_vec();
        request.extend_from_slice(&self.bytes.to_be_bytes());
        let mut f = Fetched {
            index,
            producer,
            expected: self.bytes,
            got: 0,
            outcome: String::new(),
        };
        let opts = FetchOptions {
            window: 1 << 20,
            ..FetchOptions::default()
        };
        let mut s = match self
            .h
            .fetch_with(producer, SERVICE, Bytes::from(request), opts)
        {
            Ok(s) => s,
            Err(tbon::SendError::NodeDown(_)) => {
                f.outcome = "node-down".into();
                return f;
            }
            Err(tbon::SendError::ShutDown) => {
                f.outcome = "shut-down".into();
                return f;
            }
            Err(e) => {
                f.outcome = format!("refused:{}", e.to_string().replace(' ', "_"));
                return f;
            }
        };
        for chunk in s.by_ref() {
            match chunk {
                Ok(b) => {
                    let wrong = b
                        .iter()
                        .enumerate()
                        .any(|(k, x)| *x != content(seed, f.got + k as u64));
                    if wrong {
                        f.outcome = "wrong-byte".into();
                        return f;
                    }
                    f.got += b.len() as u64;
                }
                Err(e) => {
                    f.outcome = outcome_name(&e).into();
                    return f;
                }
            }
        }
        f.outcome = "finished".into();
        f
    }
}
