//! Client messages between daemons (runtime tags 20 and 21, both over RELM).
use crate::rml::Tag;
use bytes::{Buf, BufMut, Bytes, BytesMut};

/// A client's message, from its daemon (RELM's origin) to the receiver's.
pub const TAG_CLIENT_DATA: Tag = 20;
/// Results, watches and exit notices between daemons.
pub const TAG_CLIENT_CONTROL: Tag = 21;

/// Bytes in front of a client message's payload.
pub const DATA_HEADER_LEN: usize = 28;

/// The header of a client message between daemons.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataHeader {
    /// The sender's local id at the origin daemon.
    pub from_local: u32,
    /// The receiver's local id at the destination daemon.
    pub to_local: u32,
    /// The sender's job.
    pub job: u64,
    /// The sender's token, returned in the result.
    pub token: u64,
    /// The message's tag.
    pub tag: Tag,
}

impl DataHeader {
    /// The message: this header, then `payload` (copied once, behind the header).
    pub fn encode(&self, payload: &[u8]) -> Bytes {
        let mut b = BytesMut::with_capacity(DATA_HEADER_LEN + payload.len());
        b.put_u32_le(self.from_local);
        b.put_u32_le(self.to_local);
        b.put_u64_le(self.job);
        b.put_u64_le(self.token);
        b.put_u32_le(self.tag);
        b.put_slice(payload);
        b.freeze()
    }

    /// The header and the payload (sharing `msg`'s buffer).
    pub fn decode(mut msg: Bytes) -> Result<(DataHeader, Bytes), String> {
        if msg.len() < DATA_HEADER_LEN {
            return Err(format!("client message of {} bytes", msg.len()));
        }
        let h = DataHeader {
            from_local: msg.get_u32_le(),
            to_local: msg.get_u32_le(),
            job: msg.get_u64_le(),
            token: msg.get_u64_le(),
            tag: msg.get_u32_le(),
        };
        Ok((h, msg))
    }

    /// The receiver's local id, read without decoding the rest (RELM's delivery check).
    pub fn peek_to_local(msg: &[u8]) -> Option<u32> {
        match msg.get(4..8) {
            Some(&[a, b, c, d]) => Some(u32::from_le_bytes([a, b, c, d])),
            _ => None,
        }
    }
}

/// One send's result, from the destination daemon back to the origin's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendResult {
    /// The sender's local id.
    pub local: u32,
    /// The sender's token.
    pub token: u64,
    /// `result_code` (docs/wire.md).
    pub code: u8,
}

/// A control message between daemons about clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// Results of sends from the recipient's clients, in the order their messages came.
    Results(Vec<SendResult>),
    /// A client of the origin daemon watches local client `local` of the recipient.
    Watch { local: u32 },
    /// Client `local` of the origin daemon is gone ([`super::ExitReason`] code).
    Exited { local: u32, reason: u8 },
}

const RESULTS: u8 = 1;
const WATCH: u8 = 2;
const EXITED: u8 = 3;
const RESULT_LEN: usize = 13;

impl Control {
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::new();
        match self {
            Control::Results(rs) => {
                b.reserve(5 + rs.len() * RESULT_LEN);
                b.put_u8(RESULTS);
                b.put_u32_le(rs.len() as u32);
                for r in rs {
                    b.put_u32_le(r.local);
                    b.put_u64_le(r.token);
                    b.put_u8(r.code);
                }
            }
            Control::Watch { local } => {
                b.put_u8(WATCH);
                b.put_u32_le(*local);
            }
            Control::Exited { local, reason } => {
                b.put_u8(EXITED);
                b.put_u32_le(*local);
                b.put_u8(*reason);
            }
        }
        b.freeze()
    }

    pub fn decode(mut b: &[u8]) -> Result<Control, String> {
        let short = || "client control message truncated".to_string();
        if b.is_empty() {
            return Err(short());
        }
        let c = match b.get_u8() {
            RESULTS => {
                if b.len() < 4 {
                    return Err(short());
                }
                let n = b.get_u32_le() as usize;
                if n > crate::limits::CLIENT_RESULTS_PER_MESSAGE_MAX || b.len() != n * RESULT_LEN {
                    return Err(format!("client results: {n} entries in {} bytes", b.len()));
                }
                let rs = (0..n)
                    .map(|_| SendResult {
                        local: b.get_u32_le(),
                        token: b.get_u64_le(),
                        code: b.get_u8(),
                    })
                    .collect();
                Control::Results(rs)
            }
            WATCH => {
                if b.len() != 4 {
                    return Err(short());
                }
                Control::Watch {
                    local: b.get_u32_le(),
                }
            }
            EXITED => {
                if b.len() != 5 {
                    return Err(short());
                }
                Control::Exited {
                    local: b.get_u32_le(),
                    reason: b.get_u8(),
                }
            }
            k => return Err(format!("unknown client control kind {k}")),
        };
        Ok(c)
    }
}
