//! The stream messages and their layout (big-endian): one kind byte, the stream's id (u64,
//! chosen by the consumer, unique among its streams), then the kind's fields.
//!
//! | kind | message | direction | fields |
//! |---|---|---|---|
//! | 1 | `Open` | consumer → producer | offset (u64), window (u32), service (u8 length, UTF-8), request (the rest) |
//! | 2 | `Data` | producer → consumer | offset (u64), digest (u64, `digest::chunk`), bytes (the rest) |
//! | 3 | `Credit` | consumer → producer | the offset up to which the producer may send (u64) |
//! | 4 | `End` | producer → consumer | total length (u64), the sum of the digests it sent (u64) |
//! | 5 | `Fail` | producer → consumer | code (u32), reason (the rest, UTF-8) |
//! | 6 | `Cancel` | consumer → producer | — |
//! | 7 | `Probe` | consumer → producer | — |
//! | 8 | `Position` | producer → consumer | the offset its data was sent up to (u64), the credit it holds (u64) |
//! | 9 | `Unknown` | producer → consumer | — |
//! | 10 | `Stopping` | consumer → producer | — |

use crate::direct::Route;
use crate::limits::{STREAM_CHUNK_MAX, STREAM_REASON_MAX, STREAM_REQUEST_MAX, STREAM_SERVICE_MAX};
use bytes::{BufMut, Bytes, BytesMut};

/// The bytes a `Data` message adds to its chunk: kind, id, offset, digest.
pub const DATA_HEADER_LEN: usize = 1 + 8 + 8 + 8;

/// Whether a message of kind byte `kind` goes from producer to consumer (`Data`, `End`,
/// `Fail`, `Position`, `Unknown`): the bulk lane's messages (`node::lane`), so that a
/// `Position` follows the data sent before it.
pub fn from_producer(kind: u8) -> bool {
    matches!(kind, 2 | 4 | 5 | 8 | 9)
}

/// One stream message (its id apart).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamMsg {
    /// Asks `service` for a stream of `request`'s data from byte `offset` (0, or where a
    /// resumed stream's consumer stands), with `window` bytes of credit to begin with;
    /// `route`, when given, is the route both ends' messages of this stream take (a direct
    /// link asked for or not), instead of their daemons' `route` settings.
    Open {
        offset: u64,
        window: u32,
        route: Option<Route>,
        service: String,
        request: Bytes,
    },
    /// Bytes `offset..offset + bytes.len()` of the stream.
    Data {
        offset: u64,
        digest: u64,
        bytes: Bytes,
    },
    /// The producer may send bytes up to (not including) offset `upto`.
    Credit { upto: u64 },
    /// The stream ended after `total` bytes; `digests` is the wrapping sum of the digests of
    /// the chunks this producer sent (from the `Open`'s offset).
    End { total: u64, digests: u64 },
    /// The producer failed the stream.
    Fail { code: u32, reason: String },
    /// The consumer gives up the stream.
    Cancel,
    /// The consumer heard nothing for a quarter of its idle time: where does the producer
    /// stand? Answered `Position` or `Unknown`; the producer's service is not asked again.
    Probe,
    /// The producer's answer to a `Probe`: its data was sent up to offset `sent` (what is
    /// still queued at the producer not counted), and it holds credit up to `upto`.
    Position { sent: u64, upto: u64 },
    /// The producer's answer to a `Probe` of a stream it does not have (its `Open` was lost,
    /// or it ended the stream and forgot it): the consumer resumes.
    Unknown,
    /// The consumer's daemon stops: the producer's writer fails `ConsumerDied` at once, not
    /// once the stop is found as a death. (A producer that stops fails its streams with the
    /// reserved code `FAIL_STOPPED`, behind the data it sent.)
    Stopping,
}

/// A `Data` message's bytes before its chunk: kind, id, offset, digest.
fn data_head(id: u64, offset: u64, digest: u64) -> [u8; DATA_HEADER_LEN] {
    let mut h = [0u8; DATA_HEADER_LEN];
    let mut w = &mut h[..];
    w.put_u8(2);
    w.put_u64(id);
    w.put_u64(offset);
    w.put_u64(digest);
    h
}

impl StreamMsg {
    /// A `Data` message's offset, digest and bytes; `None` for any other message.
    fn as_data(&self) -> Option<(u64, u64, &Bytes)> {
        match self {
            StreamMsg::Data {
                offset,
                digest,
                bytes,
            } => Some((*offset, *digest, bytes)),
            _ => None,
        }
    }

    /// [`StreamMsg::encode`], into a buffer of `pool` (given back once the frame is written).
    pub fn encode_pooled(&self, id: u64, pool: &std::sync::Arc<super::BufferPool>) -> Bytes {
        let Some((offset, digest, bytes)) = self.as_data() else {
            return self.encode(id);
        };
        let mut b = pool.take(DATA_HEADER_LEN + bytes.len());
        b.extend_from_slice(&data_head(id, offset, digest));
        b.extend_from_slice(bytes);
        pool.freeze(b)
    }

    /// [`StreamMsg::encode`] without copying a `Data` message's bytes: its head (kind, id,
    /// offset, digest), then the chunk itself, written back to back from both buffers. The
    /// chunk stays shared with the writer's buffer until the frame is written (and, on a link
    /// that keeps frames, acknowledged).
    pub fn encode_parts(&self, id: u64) -> crate::oob::Payload {
        let Some((offset, digest, bytes)) = self.as_data() else {
            return self.encode(id).into();
        };
        let head = Bytes::copy_from_slice(&data_head(id, offset, digest));
        crate::oob::Payload::two(head, bytes.clone())
    }

    /// The payload for stream `id`.
    pub fn encode(&self, id: u64) -> Bytes {
        // Sized once: a chunk copied into a growing buffer would be copied again per growth.
        let body = match self {
            StreamMsg::Open {
                service, request, ..
            } => 1 + service.len() + request.len(),
            StreamMsg::Data { bytes, .. } => bytes.len(),
            StreamMsg::Fail { reason, .. } => 2 + reason.len(),
            _ => 0,
        };
        let mut b = BytesMut::with_capacity(DATA_HEADER_LEN + 16 + body);
        let kind = match self {
            StreamMsg::Open { .. } => 1,
            StreamMsg::Data { .. } => 2,
            StreamMsg::Credit { .. } => 3,
            StreamMsg::End { .. } => 4,
            StreamMsg::Fail { .. } => 5,
            StreamMsg::Cancel => 6,
            StreamMsg::Probe => 7,
            StreamMsg::Position { .. } => 8,
            StreamMsg::Unknown => 9,
            StreamMsg::Stopping => 10,
        };
        b.put_u8(kind);
        b.put_u64(id);
        match self {
            StreamMsg::Open {
                offset,
                window,
                route,
                service,
                request,
            } => {
                b.put_u64(*offset);
                b.put_u32(*window);
                b.put_u8(match route {
                    None => 0,
                    Some(Route::Tree) => 1,
                    Some(Route::Direct) => 2,
                });
                let s = service.as_bytes();
                let n = s.len().min(STREAM_SERVICE_MAX);
                b.put_u8(n as u8);
                b.put_slice(s.get(..n).unwrap_or_default());
                b.put_slice(request);
            }
            StreamMsg::Data {
                offset,
                digest,
                bytes,
            } => {
                b.put_u64(*offset);
                b.put_u64(*digest);
                b.put_slice(bytes);
            }
            StreamMsg::Credit { upto } => b.put_u64(*upto),
            StreamMsg::End { total, digests } => {
                b.put_u64(*total);
                b.put_u64(*digests);
            }
            StreamMsg::Fail { code, reason } => {
                b.put_u32(*code);
                let r = reason.as_bytes();
                b.put_slice(r.get(..r.len().min(STREAM_REASON_MAX)).unwrap_or_default());
            }
            StreamMsg::Position { sent, upto } => {
                b.put_u64(*sent);
                b.put_u64(*upto);
            }
            StreamMsg::Cancel | StreamMsg::Probe | StreamMsg::Unknown | StreamMsg::Stopping => {}
        }
        b.freeze()
    }

    /// Decodes a payload into (stream id, message); the error says what is wrong with it.
    /// Bounds are checked here: a request, chunk or reason beyond its limit is an error.
    pub fn decode(p: &Bytes) -> Result<(u64, StreamMsg), String> {
        let (&kind, rest) = p.split_first().ok_or("empty stream message")?;
        let (id, rest) = rest
            .split_first_chunk::<8>()
            .ok_or("stream message without an id")?;
        let id = u64::from_be_bytes(*id);
        let at = p.len() - rest.len();
        let u64_at = |r: &[u8], what: &str| -> Result<u64, String> {
            r.first_chunk::<8>()
                .map(|b| u64::from_be_bytes(*b))
                .ok_or_else(|| format!("stream {id}: no {what}"))
        };
        let exact = |n: usize| {
            if rest.len() == n {
                Ok(())
            } else {
                Err(format!(
                    "stream {id}: kind {kind} with {} bytes, expected {n}",
                    rest.len()
                ))
            }
        };
        let msg = match kind {
            1 => {
                let offset = u64_at(rest, "offset")?;
                let window = rest
                    .get(8..12)
                    .and_then(|b| b.try_into().ok())
                    .map(u32::from_be_bytes)
                    .ok_or_else(|| format!("stream {id}: no window"))?;
                let route = match rest.get(12) {
                    Some(0) => None,
                    Some(1) => Some(Route::Tree),
                    Some(2) => Some(Route::Direct),
                    Some(r) => return Err(format!("stream {id}: route {r}")),
                    None => return Err(format!("stream {id}: no route")),
                };
                let n = *rest
                    .get(13)
                    .ok_or_else(|| format!("stream {id}: no service"))?
                    as usize;
                let service = rest
                    .get(14..14 + n)
                    .ok_or_else(|| format!("stream {id}: service cut short"))?;
                let service = std::str::from_utf8(service)
                    .map_err(|_| format!("stream {id}: service is not UTF-8"))?
                    .to_string();
                let request = p.slice(at + 14 + n..);
                if request.len() > STREAM_REQUEST_MAX {
                    return Err(format!(
                        "stream {id}: a request of {} bytes (at most {STREAM_REQUEST_MAX})",
                        request.len()
                    ));
                }
                StreamMsg::Open {
                    offset,
                    window,
                    route,
                    service,
                    request,
                }
            }
            2 => {
                let offset = u64_at(rest, "offset")?;
                let digest = u64_at(rest.get(8..).unwrap_or_default(), "digest")?;
                let bytes = p.slice(at + 16..);
                if bytes.len() > STREAM_CHUNK_MAX {
                    return Err(format!(
                        "stream {id}: a chunk of {} bytes (at most {STREAM_CHUNK_MAX})",
                        bytes.len()
                    ));
                }
                StreamMsg::Data {
                    offset,
                    digest,
                    bytes,
                }
            }
            3 => {
                exact(8)?;
                StreamMsg::Credit {
                    upto: u64_at(rest, "credit")?,
                }
            }
            4 => {
                exact(16)?;
                StreamMsg::End {
                    total: u64_at(rest, "total")?,
                    digests: u64_at(rest.get(8..).unwrap_or_default(), "digests")?,
                }
            }
            5 => {
                let code = rest
                    .first_chunk::<4>()
                    .map(|b| u32::from_be_bytes(*b))
                    .ok_or_else(|| format!("stream {id}: no code"))?;
                let reason = rest.get(4..).unwrap_or_default();
                if reason.len() > STREAM_REASON_MAX {
                    return Err(format!("stream {id}: a reason of {} bytes", reason.len()));
                }
                StreamMsg::Fail {
                    code,
                    reason: String::from_utf8_lossy(reason).into_owned(),
                }
            }
            6 => {
                exact(0)?;
                StreamMsg::Cancel
            }
            7 => {
                exact(0)?;
                StreamMsg::Probe
            }
            8 => {
                exact(16)?;
                StreamMsg::Position {
                    sent: u64_at(rest, "sent")?,
                    upto: u64_at(rest.get(8..).unwrap_or_default(), "credit")?,
                }
            }
            9 => {
                exact(0)?;
                StreamMsg::Unknown
            }
            10 => {
                exact(0)?;
                StreamMsg::Stopping
            }
            k => return Err(format!("stream {id}: unknown kind {k}")),
        };
        Ok((id, msg))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_round_trips() {
        let all = [
            StreamMsg::Open {
                offset: 7,
                window: 1 << 20,
                route: Some(Route::Direct),
                service: "file".into(),
                request: Bytes::from_static(b"/scratch/ckpt.0"),
            },
            StreamMsg::Data {
                offset: 4096,
                digest: 99,
                bytes: Bytes::from_static(b"chunk"),
            },
            StreamMsg::Credit { upto: 1 << 40 },
            StreamMsg::End {
                total: 12,
                digests: u64::MAX,
            },
            StreamMsg::Fail {
                code: 2,
                reason: "no such file".into(),
            },
            StreamMsg::Cancel,
            StreamMsg::Probe,
            StreamMsg::Position {
                sent: 1 << 33,
                upto: (1 << 33) + 5,
            },
            StreamMsg::Unknown,
            StreamMsg::Stopping,
        ];
        let pool = std::sync::Arc::new(super::super::BufferPool::default());
        for m in all {
            assert_eq!(m.encode_pooled(42, &pool), m.encode(42));
            assert_eq!(m.encode_parts(42).to_bytes(), m.encode(42));
            assert_eq!(StreamMsg::decode(&m.encode(42)), Ok((42, m)));
        }
    }

    #[test]
    fn a_chunk_is_sent_from_the_writers_buffer_not_copied() {
        let chunk = Bytes::from(vec![3u8; 4096]);
        let m = StreamMsg::Data {
            offset: 8,
            digest: 1,
            bytes: chunk.clone(),
        };
        let p = m.encode_parts(5);
        assert_eq!(p.head().len(), DATA_HEADER_LEN);
        assert_eq!(p.body().as_ptr(), chunk.as_ptr(), "the same buffer");
    }

    #[test]
    fn malformed_and_oversized_messages_are_errors() {
        let big_chunk = StreamMsg::Data {
            offset: 0,
            digest: 0,
            bytes: Bytes::from(vec![0; STREAM_CHUNK_MAX + 1]),
        }
        .encode(1);
        let big_request = StreamMsg::Open {
            offset: 0,
            window: 1,
            route: None,
            service: "s".into(),
            request: Bytes::from(vec![0; STREAM_REQUEST_MAX + 1]),
        }
        .encode(1);
        for bad in [
            Bytes::new(),
            Bytes::from_static(&[3, 0, 0]),
            Bytes::from_static(&[11, 0, 0, 0, 0, 0, 0, 0, 1]),
            Bytes::from_static(&[10, 0, 0, 0, 0, 0, 0, 0, 1, 0]),
            Bytes::from_static(&[7, 0, 0, 0, 0, 0, 0, 0, 1, 0]),
            Bytes::from_static(&[8, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]),
            Bytes::from_static(&[9, 0, 0, 0, 0, 0, 0, 0, 1, 0]),
            Bytes::from_static(&[3, 0, 0, 0, 0, 0, 0, 0, 1, 0]),
            Bytes::from_static(&[
                1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 9,
            ]),
            Bytes::from_static(&[6, 0, 0, 0, 0, 0, 0, 0, 1, 0]),
            big_chunk,
            big_request,
        ] {
            assert!(StreamMsg::decode(&bad).is_err(), "{bad:?} decoded");
        }
    }

    #[test]
    fn decode_never_panics_on_truncations() {
        let m = StreamMsg::Open {
            offset: 1,
            window: 2,
            route: Some(Route::Tree),
            service: "svc".into(),
            request: Bytes::from_static(b"req"),
        }
        .encode(5);
        for n in 0..m.len() {
            let _ = StreamMsg::decode(&m.slice(..n));
        }
    }
}
