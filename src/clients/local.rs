//! The local protocol between a client process and its daemon, over the Unix-domain socket:
//! length-prefixed frames (a `u32` little-endian body length, then the body: a kind byte and
//! its fields, little-endian). docs/wire.md lists the layouts. Both ends decode with
//! [`LocalDecoder`], which refuses a frame longer than its bound before reading it.
use super::ClientName;
use crate::rml::Tag;
use bytes::{Buf, BufMut, Bytes, BytesMut};

/// The version a client states in its `Hello`; the daemon refuses another.
pub const CLIENT_PROTOCOL_VERSION: u16 = 1;

/// Bytes of a frame's fields besides a payload (the largest: `Send` and `Deliver`).
pub const LOCAL_OVERHEAD_MAX: usize = 64;

/// A frame from a client to its daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToDaemon {
    /// The first frame: the protocol version, the job and its key.
    Hello {
        version: u16,
        job: u64,
        key: [u8; 32],
    },
    /// A message for client `to`; `token` (chosen by the client, unique among its unanswered
    /// sends) comes back in `SendDone`.
    Send {
        token: u64,
        to: ClientName,
        tag: Tag,
        payload: Bytes,
    },
    /// Tell me once when `name` exits.
    Watch { name: ClientName },
}

/// A frame from a daemon to one of its clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToClient {
    /// Admitted: the client's name, its job, the DVM's size and largest payload.
    Welcome {
        name: ClientName,
        job: u64,
        size: u32,
        msg_max: u32,
    },
    /// Not admitted, and why; the daemon closes the connection.
    Refused { reason: String },
    /// A message from client `from`.
    Deliver {
        from: ClientName,
        tag: Tag,
        payload: Bytes,
    },
    /// The result of the send with `token` (`result_code`, docs/wire.md).
    SendDone { token: u64, code: u8 },
    /// A watched client is gone ([`super::ExitReason`] code).
    Exited { name: ClientName, reason: u8 },
    /// The daemon stops; the connection closes after this.
    Bye { reason: String },
}

const HELLO: u8 = 1;
const SEND: u8 = 2;
const WATCH: u8 = 3;
const WELCOME: u8 = 65;
const REFUSED: u8 = 66;
const DELIVER: u8 = 67;
const SEND_DONE: u8 = 68;
const EXITED: u8 = 69;
const BYE: u8 = 70;

/// Longest reason text in `Refused` and `Bye`.
const REASON_MAX: usize = 1024;

fn put_name(b: &mut BytesMut, n: ClientName) {
    b.put_u32_le(n.rank);
    b.put_u32_le(n.local);
}

fn frame(kind: u8, fields: usize, payload: &[u8], fill: impl FnOnce(&mut BytesMut)) -> Bytes {
    let body = 1 + fields + payload.len();
    let mut b = BytesMut::with_capacity(4 + body);
    b.put_u32_le(body as u32);
    b.put_u8(kind);
    fill(&mut b);
    b.put_slice(payload);
    debug_assert_eq!(b.len(), 4 + body);
    b.freeze()
}

fn reason_bytes(r: &str) -> &[u8] {
    let mut end = r.len().min(REASON_MAX);
    while !r.is_char_boundary(end) {
        end -= 1;
    }
    r.as_bytes().get(..end).unwrap_or_default()
}

impl ToDaemon {
    /// The frame, length prefix included.
    pub fn encode(&self) -> Bytes {
        match self {
            ToDaemon::Hello { version, job, key } => frame(HELLO, 2 + 8 + 32, &[], |b| {
                b.put_u16_le(*version);
                b.put_u64_le(*job);
                b.put_slice(key);
            }),
            ToDaemon::Send {
                token,
                to,
                tag,
                payload,
            } => frame(SEND, 8 + 8 + 4, payload, |b| {
                b.put_u64_le(*token);
                put_name(b, *to);
                b.put_u32_le(*tag);
            }),
            ToDaemon::Watch { name } => frame(WATCH, 8, &[], |b| put_name(b, *name)),
        }
    }

    /// A frame's body (the length prefix taken off by [`LocalDecoder`]).
    pub fn decode(mut body: Bytes) -> Result<ToDaemon, String> {
        let kind = take_u8(&mut body)?;
        let m = match kind {
            HELLO => {
                need(&body, 42)?;
                let version = body.get_u16_le();
                let job = body.get_u64_le();
                let mut key = [0u8; 32];
                body.copy_to_slice(&mut key);
                ToDaemon::Hello { version, job, key }
            }
            SEND => {
                need(&body, 20)?;
                let token = body.get_u64_le();
                let to = get_name(&mut body);
                let tag = body.get_u32_le();
                ToDaemon::Send {
                    token,
                    to,
                    tag,
                    payload: body.split_off(0),
                }
            }
            WATCH => {
                need(&body, 8)?;
                ToDaemon::Watch {
                    name: get_name(&mut body),
                }
            }
            k => return Err(format!("unknown client frame kind {k}")),
        };
        if !body.is_empty() {
            return Err(format!(
                "client frame kind {kind} has {} extra bytes",
                body.len()
            ));
        }
        Ok(m)
    }
}

impl ToClient {
    /// The frame, length prefix included.
    pub fn encode(&self) -> Bytes {
        match self {
            ToClient::Welcome {
                name,
                job,
                size,
                msg_max,
            } => frame(WELCOME, 8 + 8 + 4 + 4, &[], |b| {
                put_name(b, *name);
                b.put_u64_le(*job);
                b.put_u32_le(*size);
                b.put_u32_le(*msg_max);
            }),
            ToClient::Refused { reason } => frame(REFUSED, 0, reason_bytes(reason), |_| {}),
            ToClient::Deliver { from, tag, payload } => frame(DELIVER, 12, payload, |b| {
                put_name(b, *from);
                b.put_u32_le(*tag);
            }),
            ToClient::SendDone { token, code } => frame(SEND_DONE, 9, &[], |b| {
                b.put_u64_le(*token);
                b.put_u8(*code);
            }),
            ToClient::Exited { name, reason } => frame(EXITED, 9, &[], |b| {
                put_name(b, *name);
                b.put_u8(*reason);
            }),
            ToClient::Bye { reason } => frame(BYE, 0, reason_bytes(reason), |_| {}),
        }
    }

    /// A frame's body (the length prefix taken off by [`LocalDecoder`]).
    pub fn decode(mut body: Bytes) -> Result<ToClient, String> {
        let kind = take_u8(&mut body)?;
        let text = |b: Bytes| String::from_utf8_lossy(&b).into_owned();
        let m = match kind {
            WELCOME => {
                need(&body, 24)?;
                let name = get_name(&mut body);
                ToClient::Welcome {
                    name,
                    job: body.get_u64_le(),
                    size: body.get_u32_le(),
                    msg_max: body.get_u32_le(),
                }
            }
            REFUSED => ToClient::Refused {
                reason: text(body.split_off(0)),
            },
            DELIVER => {
                need(&body, 12)?;
                let from = get_name(&mut body);
                let tag = body.get_u32_le();
                ToClient::Deliver {
                    from,
                    tag,
                    payload: body.split_off(0),
                }
            }
            SEND_DONE => {
                need(&body, 9)?;
                ToClient::SendDone {
                    token: body.get_u64_le(),
                    code: body.get_u8(),
                }
            }
            EXITED => {
                need(&body, 9)?;
                ToClient::Exited {
                    name: get_name(&mut body),
                    reason: body.get_u8(),
                }
            }
            BYE => ToClient::Bye {
                reason: text(body.split_off(0)),
            },
            k => return Err(format!("unknown daemon frame kind {k}")),
        };
        if !body.is_empty() {
            return Err(format!(
                "daemon frame kind {kind} has {} extra bytes",
                body.len()
            ));
        }
        Ok(m)
    }
}

fn take_u8(b: &mut Bytes) -> Result<u8, String> {
    need(b, 1)?;
    Ok(b.get_u8())
}

fn need(b: &Bytes, n: usize) -> Result<(), String> {
    if b.len() < n {
        return Err(format!(
            "frame truncated: {} bytes where {n} are needed",
            b.len()
        ));
    }
    Ok(())
}

fn get_name(b: &mut Bytes) -> ClientName {
    ClientName {
        rank: b.get_u32_le(),
        local: b.get_u32_le(),
    }
}

/// Cuts length-prefixed frames out of the bytes read from a socket. A frame whose stated
/// length exceeds the bound is an error at once (the connection is then closed): no more
/// than one bound's worth of bytes is ever buffered.
#[derive(Debug)]
pub struct LocalDecoder {
    buf: BytesMut,
    body_max: usize,
}

impl LocalDecoder {
    /// A decoder refusing bodies longer than `body_max` bytes.
    pub fn new(body_max: usize) -> LocalDecoder {
        LocalDecoder {
            buf: BytesMut::new(),
            body_max,
        }
    }

    /// Reads once from `r` into the buffer; `Ok(0)` at the end of the stream.
    pub fn read_from(&mut self, r: &mut impl std::io::Read) -> std::io::Result<usize> {
        if self.buf.capacity() - self.buf.len() < 16 * 1024 {
            self.buf.reserve(64 * 1024);
        }
        let start = self.buf.len();
        let cap = self.buf.capacity();
        // Zero-filled, then truncated to what was read: the safe way without `unsafe`.
        self.buf.resize(cap, 0);
        let res = r.read(self.buf.get_mut(start..).unwrap_or_default());
        let n = *res.as_ref().unwrap_or(&0);
        self.buf.truncate(start + n);
        res
    }

    /// The next whole frame's body, if one is buffered.
    pub fn next_body(&mut self) -> Result<Option<Bytes>, String> {
        let Some(&[a, b, c, d]) = self.buf.get(..4) else {
            return Ok(None);
        };
        let len = u32::from_le_bytes([a, b, c, d]) as usize;
        if len == 0 || len > self.body_max {
            return Err(format!(
                "frame of {len} bytes (allowed 1..={})",
                self.body_max
            ));
        }
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        self.buf.advance(4);
        Ok(Some(self.buf.split_to(len).freeze()))
    }

    /// Bytes buffered and not yet taken as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }
}
