//! The `stream` kind's applications: every daemon offers the service `node::SERVICE`, whose
//! stream of length `len` for request (id, len) has byte i = `content(id, i)`; consumers fetch
//! the scenario's streams and check every byte as it arrives. Checker `stream`: every byte in
//! order and right, a stream ends `Finished` with all its bytes, or `ProducerDied` only when
//! the producer is gone; by the end every stream of a living consumer has ended.

use super::World;
use crate::Rank;
use crate::node::{StreamCommand, StreamEvent};
use crate::sim::check::Violation;
use crate::sim::node::SERVICE;
use crate::stream::{ChunkDigest, StreamError};
use bytes::Bytes;
use std::collections::HashMap;
use std::time::Duration;

/// A consumer gives a stream up after this long without news: longer than any partition or
/// stall of a run, so only a stream nobody serves any more times out.
const IDLE: Duration = Duration::from_secs(120);

/// Byte `i` of stream `id`.
fn content(id: u64, i: u64) -> u8 {
    (id.wrapping_mul(131).wrapping_add(i.wrapping_mul(7)) % 251) as u8
}

/// What the stream applications know.
#[derive(Debug, Default)]
pub(super) struct StreamApps {
    /// Producer side: (producer, consumer, wire id) -> (stream id, length, next offset).
    producing: HashMap<(Rank, Rank, u64), (u64, u64, u64)>,
    /// Consumer side: stream id -> (consumer, producer, length, bytes checked).
    consuming: HashMap<u64, (Rank, Rank, u64, u64)>,
    /// Streams finished, and ended otherwise (allowed).
    pub finished: u64,
    pub failed: u64,
}

impl StreamApps {
    /// Streams still open at a living consumer (the liveness check waits for none).
    pub(super) fn open_at(&self, living: impl Fn(Rank) -> bool) -> usize {
        self.consuming.values().filter(|(c, ..)| living(*c)).count()
    }
}

fn v(detail: String) -> Violation {
    Violation {
        checker: "stream",
        detail,
    }
}

impl World {
    /// `rank` started again: its old life's streams, as consumer and as producer, are gone
    /// with it (a producer's consumers see it die; the new life knows none of them).
    pub(super) fn streams_restarted(&mut self, rank: Rank) {
        self.streams.consuming.retain(|_, (c, ..)| *c != rank);
        self.streams.producing.retain(|(p, ..), _| *p != rank);
    }

    /// The scenario's fetch number `id` starts at its consumer.
    pub(super) fn on_fetch(&mut self, id: u64) -> Result<(), Violation> {
        let Some(&(consumer, producer, len, window, _)) = self.scen.streams.get(id as usize) else {
            return Ok(());
        };
        if !self.living(consumer) {
            return Ok(());
        }
        let mut request = id.to_be_bytes().to_vec();
        request.extend_from_slice(&len.to_be_bytes());
        let now = self.now();
        let c = StreamCommand::Fetch {
            id,
            producer,
            service: SERVICE.into(),
            request: Bytes::from(request),
            window,
            idle: IDLE,
            // Every third stream asks for a direct link of its own, every third forbids one
            // (a function of the id: the seed's draws stay as they were).
            route: match id % 3 {
                1 => Some(crate::Route::Direct),
                2 => Some(crate::Route::Tree),
                _ => None,
            },
            // Every other stream's chunks are checked by the application (as a daemon's
            // `Stream` reader does), the others by the core.
            reader_checks: !id.is_multiple_of(2),
        };
        if let Some(n) = self.nodes.get_mut(consumer as usize)
            && n.stream(now, c).is_ok()
        {
            self.streams
                .consuming
                .insert(id, (consumer, producer, len, 0));
        }
        self.after(consumer)
    }

    /// Plays both applications for the stream events daemon `r` produced. Whether it issued
    /// commands (then `r`'s outputs need collecting again).
    pub(super) fn stream_events(
        &mut self,
        r: Rank,
        events: Vec<StreamEvent>,
    ) -> Result<bool, Violation> {
        let now = self.now();
        let mut acted = false;
        for e in events {
            match e {
                StreamEvent::Opened {
                    consumer,
                    id,
                    request,
                    offset,
                    ..
                } => {
                    let (sid, len) = match (request.get(..8), request.get(8..16)) {
                        (Some(a), Some(b)) => (
                            u64::from_be_bytes(a.try_into().unwrap_or_default()),
                            u64::from_be_bytes(b.try_into().unwrap_or_default()),
                        ),
                        _ => {
                            return Err(v(format!(
                                "rank {r}: a request of {} bytes",
                                request.len()
                            )));
                        }
                    };
                    self.streams
                        .producing
                        .insert((r, consumer, id), (sid, len, offset));
                }
                StreamEvent::Room { consumer, id, upto } => {
                    let Some(&(sid, len, pos)) = self.streams.producing.get(&(r, consumer, id))
                    else {
                        continue;
                    };
                    let n = upto.saturating_sub(pos).min(len - pos);
                    let bytes: Bytes = (pos..pos + n)
                        .map(|i| content(sid, i))
                        .collect::<Vec<u8>>()
                        .into();
                    let mut cmds = Vec::new();
                    if n > 0 && sid.is_multiple_of(2) {
                        // As the daemon's writer does: chunks hashed before they reach the
                        // stream (here of 4 KiB, so that a room holds several).
                        let mut at = pos;
                        let mut rest = bytes;
                        while !rest.is_empty() {
                            let piece = rest.split_to(rest.len().min(4096));
                            let digest = Some(ChunkDigest::of(at, &piece));
                            at += piece.len() as u64;
                            cmds.push(StreamCommand::Write {
                                consumer,
                                id,
                                bytes: piece,
                                digest,
                            });
                        }
                    } else if n > 0 {
                        cmds.push(StreamCommand::Write {
                            consumer,
                            id,
                            bytes,
                            digest: None,
                        });
                    }
                    if pos + n == len {
                        cmds.push(StreamCommand::End {
                            consumer,
                            id,
                            failure: None,
                        });
                        self.streams.producing.remove(&(r, consumer, id));
                    } else if let Some(p) = self.streams.producing.get_mut(&(r, consumer, id)) {
                        p.2 = pos + n;
                    }
                    for c in cmds {
                        acted = true;
                        if let Some(node) = self.nodes.get_mut(r as usize)
                            && node.stream(now, c).is_err()
                        {
                            // Stopped meanwhile (its consumer moved it to a new id).
                            self.streams.producing.remove(&(r, consumer, id));
                            break;
                        }
                    }
                }
                StreamEvent::Stopped { consumer, id, .. } => {
                    self.streams.producing.remove(&(r, consumer, id));
                }
                StreamEvent::Data { id, bytes, check } => {
                    let Some(s) = self.streams.consuming.get_mut(&id) else {
                        return Err(v(format!("rank {r}: data for unknown stream {id}")));
                    };
                    // The reader's check: the digest belongs to these bytes at this offset.
                    if id.is_multiple_of(2) == check.is_some()
                        || check.is_some_and(|c| {
                            c.offset != s.3 || ChunkDigest::of(c.offset, &bytes) != c
                        })
                    {
                        return Err(v(format!(
                            "stream {id} at rank {r}: the reader's check {check:?} does not fit \
                             the bytes at {}",
                            s.3
                        )));
                    }
                    for (k, b) in bytes.iter().enumerate() {
                        let i = s.3 + k as u64;
                        if *b != content(id, i) || i >= s.2 {
                            return Err(v(format!("stream {id} at rank {r}: wrong byte at {i}")));
                        }
                    }
                    s.3 += bytes.len() as u64;
                    acted = true;
                    let c = StreamCommand::Consumed {
                        id,
                        n: bytes.len() as u64,
                    };
                    if let Some(node) = self.nodes.get_mut(r as usize) {
                        let _ = node.stream(now, c);
                    }
                }
                StreamEvent::Ended { id, result } => {
                    let Some((_, producer, len, got)) = self.streams.consuming.remove(&id) else {
                        return Err(v(format!("rank {r}: end of unknown stream {id}")));
                    };
                    let mut gone = self.gone();
                    // A producer that returned died in an earlier life.
                    if self.restarts.life(producer) > 0 {
                        gone.push(producer);
                    }
                    match result {
                        Ok(()) if got == len => self.streams.finished += 1,
                        Ok(()) => {
                            return Err(v(format!(
                                "stream {id}: finished after {got} of {len} bytes"
                            )));
                        }
                        Err(StreamError::ProducerDied(p)) if p == producer && gone.contains(&p) => {
                            self.streams.failed += 1;
                        }
                        // Silent for its idle time, or its path broken more than
                        // `STREAM_RESUMES_MAX` times: the producer is gone, or a partition cut
                        // the consumer off from it within that time (the consumer may not be
                        // declared yet; the last resume may come as the partition heals and
                        // the links are dialled again: seed 204929 with 1,000 messages).
                        Err(StreamError::TimedOut)
                            if gone.contains(&producer) || self.partitioned_within(r, producer) =>
                        {
                            self.streams.failed += 1
                        }
                        Err(e) => return Err(v(format!("stream {id} ({producer} -> {r}): {e}"))),
                    }
                }
            }
        }
        Ok(acted)
    }

    /// Whether a partition cut `a` off from `b` at some time in the last idle time (`IDLE`).
    fn partitioned_within(&self, a: Rank, b: Rank) -> bool {
        let since = self.now_us.saturating_sub(IDLE.as_micros() as u64);
        self.scen.faults.iter().any(|f| match f {
            super::Fault::Partition {
                group,
                at_us,
                for_us,
            } => {
                *at_us <= self.now_us
                    && at_us + for_us >= since
                    && group.contains(&a) != group.contains(&b)
            }
            _ => false,
        })
    }
}
