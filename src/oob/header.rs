//! The fixed 40-byte frame header, in network byte order. Layout: `docs/wire.md`.
//!
//! ```text
//! off len field
//! 0   2   magic  b"TB"
//! 2   1   version (PROTOCOL_VERSION)
//! 3   1   kind   (Kind as u8)
//! 4   4   origin rank (u32)
//! 8   4   dst rank (u32)
//! 12  4   tag (u32)
//! 16  8   epoch (u64)  sender's incarnation epoch
//! 24  8   seq (u64)    per-link sequence number (RelmData: uid << 32 | prev uid)
//! 32  4   len (u32)    payload length in bytes
//! 36  2   origin's life (u16)  how many times rank 0 admitted the origin back (rejoin)
//! 38  2   dst's life (u16)     the destination's, as the sender knows it
//! ```
//!
//! The lives make a daemon's incarnation part of every routed message's identity (issue
//! "Rejoin"): a routed message (`Msg`, `RelmData`) whose origin's or destination's life is not
//! the one the receiver knows was sent by, or for, another incarnation of that rank and is
//! dropped.

use std::fmt;

use crate::Rank;

/// Length in bytes of every frame header.
pub const HEADER_LEN: usize = 40;
/// The first two bytes of every frame.
pub const MAGIC: [u8; 2] = *b"TB";
/// The wire protocol version this code speaks; a header with any other version is refused.
pub const PROTOCOL_VERSION: u8 = 19;

/// What a frame is. The numeric values are the wire encoding and never change meaning.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// First frame of a connection, sent by the dialler (payload: handshake identity).
    Hello = 1,
    /// The acceptor's answer to a `Hello` it accepted (payload: handshake identity).
    HelloAck = 2,
    /// A routed point-to-point message (user tags and reserved runtime tags).
    Msg = 3,
    /// An unacknowledged flood down the tree: the contact table during wire-up, "rank 0 lost".
    /// (Broadcasts are `Grpcomm` operations.)
    Xcast = 4,
    /// A liveness probe on an otherwise idle link.
    Heartbeat = 5,
    /// The dialler's proof that it holds the job key, the handshake's third frame
    /// (payload: a 32-byte HMAC-SHA256).
    Auth = 6,
    /// A reliable message (RELM), relayed hop by hop like `Msg`: origin, dst and tag as in a
    /// `Msg`, and `seq` = `relm::wire::pack_seq(uid, prev)` instead of the per-link number.
    RelmData = 7,
    /// A RELM control frame between two neighbours (origin = sender, dst = the neighbour,
    /// tag 0; payload: `relm::wire::Control::encode`).
    Relm = 8,
    /// A collective's tree message between two neighbours (origin = sender, dst = the
    /// neighbour, tag 0; payload: a `grpcomm::wire` message: xcast `Op`, `Ack`, `Sync`,
    /// `Resume`, allgather `Contribution`, `Sync`).
    Grpcomm = 9,
    /// The handshake's fourth frame: the acceptor admits the dialler's connection as the link
    /// between the two (empty payload). The dialler sends no data frame before it.
    Ready = 10,
    /// A link session's control between two neighbours (`oob::session`: `Start` on every new
    /// connection, cumulative `Ack`), no payload: origin = sender, dst = the neighbour, `tag`
    /// which control, `epoch` the session, `seq` the count. Never routed, never counted.
    Link = 11,
}

impl Kind {
    /// Every kind, in wire order.
    pub const ALL: [Kind; 11] = [
        Kind::Hello,
        Kind::HelloAck,
        Kind::Msg,
        Kind::Xcast,
        Kind::Heartbeat,
        Kind::Auth,
        Kind::RelmData,
        Kind::Relm,
        Kind::Grpcomm,
        Kind::Ready,
        Kind::Link,
    ];
}

impl From<Kind> for u8 {
    fn from(k: Kind) -> u8 {
        k as u8
    }
}

impl TryFrom<u8> for Kind {
    type Error = WireError;
    /// Fails with `WireError::UnknownKind` for a value no `Kind` has.
    fn try_from(v: u8) -> Result<Kind, WireError> {
        match v {
            1 => Ok(Kind::Hello),
            2 => Ok(Kind::HelloAck),
            3 => Ok(Kind::Msg),
            4 => Ok(Kind::Xcast),
            5 => Ok(Kind::Heartbeat),
            6 => Ok(Kind::Auth),
            7 => Ok(Kind::RelmData),
            8 => Ok(Kind::Relm),
            9 => Ok(Kind::Grpcomm),
            10 => Ok(Kind::Ready),
            11 => Ok(Kind::Link),
            other => Err(WireError::UnknownKind(other)),
        }
    }
}

/// A decoded frame header. `len` is the length of the payload that follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    pub kind: Kind,
    pub origin: Rank,
    pub dst: Rank,
    pub tag: u32,
    pub epoch: u64,
    pub seq: u64,
    pub len: u32,
    /// The origin's life (high 16 bits) and the destination's as the sender knows it (low
    /// 16 bits); see [`Header::lives_of`].
    pub lives: u32,
}

/// Why bytes from a peer are not a valid frame. Every variant means the connection is unusable:
/// the caller logs the `Display` text and closes that connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// The frame does not start with `b"TB"`: not a tbon peer, or the stream lost sync.
    BadMagic([u8; 2]),
    /// The peer speaks another protocol version.
    BadVersion(u8),
    /// A kind byte no `Kind` has.
    UnknownKind(u8),
    /// The header announces a payload longer than the receiver accepts.
    TooLarge { len: u32, max: u32 },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::BadMagic(m) => write!(
                f,
                "bad frame magic 0x{:02x}{:02x} (\"{}\"; expected \"TB\"): not a tbon peer, or a stream out of sync",
                m[0],
                m[1],
                m.escape_ascii()
            ),
            WireError::BadVersion(v) => write!(
                f,
                "unsupported protocol version {v} (this daemon speaks version {PROTOCOL_VERSION})"
            ),
            WireError::UnknownKind(k) => write!(f, "unknown frame kind {k}"),
            WireError::TooLarge { len, max } => write!(
                f,
                "frame payload of {len} bytes exceeds the maximum of {max} bytes"
            ),
        }
    }
}

impl std::error::Error for WireError {}

/// The big-endian integer at `at`; the callers' offsets are constants inside the header, and
/// an offset outside it would read as zero rather than panic.
fn be_u32(b: &[u8; HEADER_LEN], at: usize) -> u32 {
    b.get(at..)
        .and_then(|t| t.first_chunk::<4>())
        .map_or(0, |a| u32::from_be_bytes(*a))
}

fn be_u64(b: &[u8; HEADER_LEN], at: usize) -> u64 {
    b.get(at..)
        .and_then(|t| t.first_chunk::<8>())
        .map_or(0, |a| u64::from_be_bytes(*a))
}

impl Header {
    /// The `lives` field of a message from an origin in life `origin` to a destination in life
    /// `dst` (0 for a rank never admitted back).
    pub fn lives_of(origin: u16, dst: u16) -> u32 {
        (u32::from(origin) << 16) | u32::from(dst)
    }

    /// The origin's life this header carries.
    pub fn origin_life(&self) -> u16 {
        (self.lives >> 16) as u16
    }

    /// The destination's life this header carries.
    pub fn dst_life(&self) -> u16 {
        self.lives as u16
    }

    /// The 40 wire bytes of this header.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..2].copy_from_slice(&MAGIC);
        b[2] = PROTOCOL_VERSION;
        b[3] = self.kind as u8;
        b[4..8].copy_from_slice(&self.origin.to_be_bytes());
        b[8..12].copy_from_slice(&self.dst.to_be_bytes());
        b[12..16].copy_from_slice(&self.tag.to_be_bytes());
        b[16..24].copy_from_slice(&self.epoch.to_be_bytes());
        b[24..32].copy_from_slice(&self.seq.to_be_bytes());
        b[32..36].copy_from_slice(&self.len.to_be_bytes());
        b[36..40].copy_from_slice(&self.lives.to_be_bytes());
        b
    }

    /// Parse 40 wire bytes. Checks, in this order: magic, version, kind.
    /// Does not check `len` against any maximum (the frame decoder does).
    pub fn decode(bytes: &[u8; HEADER_LEN]) -> Result<Header, WireError> {
        // All indices below are constants within the fixed-size array.
        let magic = [bytes[0], bytes[1]];
        if magic != MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        if bytes[2] != PROTOCOL_VERSION {
            return Err(WireError::BadVersion(bytes[2]));
        }
        let kind = Kind::try_from(bytes[3])?;
        Ok(Header {
            kind,
            origin: be_u32(bytes, 4),
            dst: be_u32(bytes, 8),
            tag: be_u32(bytes, 12),
            epoch: be_u64(bytes, 16),
            seq: be_u64(bytes, 24),
            len: be_u32(bytes, 32),
            lives: be_u32(bytes, 36),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Header {
        Header {
            kind: Kind::Msg,
            origin: 0x0102_0304,
            dst: 0x0506_0708,
            tag: 0x090a_0b0c,
            epoch: 0x1112_1314_1516_1718,
            seq: 0x2122_2324_2526_2728,
            len: 0x3132_3334,
            lives: 0x4142_4344,
        }
    }

    #[rustfmt::skip]
    const GOLDEN: [u8; HEADER_LEN] = [
        b'T', b'B',                                     // magic
        19,                                             // version
        3,                                              // kind = Msg
        0x01, 0x02, 0x03, 0x04,                         // origin
        0x05, 0x06, 0x07, 0x08,                         // dst
        0x09, 0x0a, 0x0b, 0x0c,                         // tag
        0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, // epoch
        0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28, // seq
        0x31, 0x32, 0x33, 0x34,                         // len
        0x41, 0x42, 0x43, 0x44,                         // lives: origin's, dst's
    ];

    #[test]
    fn encode_golden_bytes() {
        assert_eq!(sample().encode(), GOLDEN);
    }

    #[test]
    fn decode_golden_bytes() {
        assert_eq!(Header::decode(&GOLDEN), Ok(sample()));
    }

    /// The example in `docs/wire.md`.
    #[test]
    fn documented_example() {
        let h = Header {
            kind: Kind::Msg,
            origin: 1,
            dst: 2,
            tag: 3,
            epoch: 4,
            seq: 5,
            len: 6,
            lives: Header::lives_of(1, 2),
        };
        #[rustfmt::skip]
        let want: [u8; HEADER_LEN] = [
            0x54, 0x42, 0x13, 0x03, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3,
            0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 5,
            0, 0, 0, 6, 0, 1, 0, 2,
        ];
        assert_eq!((h.origin_life(), h.dst_life()), (1, 2));
        assert_eq!(h.encode(), want);
        // docs/wire.md shows these bytes: its example must follow the protocol version.
        let hex: Vec<String> = want.iter().map(|b| format!("{b:02x}")).collect();
        let rows = [
            format!(
                "{}  {}  {}  {}",
                hex[..4].join(" "),
                hex[4..8].join(" "),
                hex[8..12].join(" "),
                hex[12..16].join(" ")
            ),
            format!("{}  {}", hex[16..24].join(" "), hex[24..32].join(" ")),
            format!(
                "{}  {}  <6 payload bytes>",
                hex[32..36].join(" "),
                hex[36..40].join(" ")
            ),
        ];
        let doc = include_str!("../../docs/wire.md");
        for row in &rows {
            assert!(
                doc.contains(row.as_str()),
                "docs/wire.md lacks the example's row {row:?}"
            );
        }
    }

    #[test]
    fn roundtrip_every_kind() {
        for kind in Kind::ALL {
            let h = Header { kind, ..sample() };
            assert_eq!(Header::decode(&h.encode()), Ok(h));
            assert_eq!(Kind::try_from(u8::from(kind)), Ok(kind));
        }
    }

    #[test]
    fn kind_mapping() {
        assert_eq!(Kind::try_from(0), Err(WireError::UnknownKind(0)));
        assert_eq!(Kind::try_from(7), Ok(Kind::RelmData));
        assert_eq!(Kind::try_from(8), Ok(Kind::Relm));
        assert_eq!(Kind::try_from(9), Ok(Kind::Grpcomm));
        assert_eq!(Kind::try_from(11), Ok(Kind::Link));
        assert_eq!(Kind::try_from(12), Err(WireError::UnknownKind(12)));
        assert_eq!(Kind::try_from(255), Err(WireError::UnknownKind(255)));
        assert_eq!(u8::from(Kind::Hello), 1);
        assert_eq!(u8::from(Kind::Heartbeat), 5);
    }

    #[test]
    fn bad_magic() {
        let mut b = GOLDEN;
        b[0] = b'X';
        assert_eq!(Header::decode(&b), Err(WireError::BadMagic([b'X', b'B'])));
        // Named as an operator reads it: hex with its prefix, and the bytes as text.
        let text = WireError::BadMagic([b'H', b'T']).to_string();
        assert!(
            text.starts_with("bad frame magic 0x4854 (\"HT\"; expected \"TB\")"),
            "{text}"
        );
    }

    #[test]
    fn bad_version() {
        let mut b = GOLDEN;
        // Version 1 (before authentication), 2 (before the fault-tolerant collectives), 3
        // (before the handshake's `Ready`), 4 (before direct links), 5 (before status queries
        // and tools), 6 (before wire-up slices and contact lookups), 7 (before group
        // collectives), 8 (before clients), 9 (before rejoin), 10 (before link sessions), 11
        // (before broadcasts in parts), 12 (before lives in RELM acks), 13 (before XXH3 stream
        // digests), 14 (before batch frames), 15 (before reliable batch frames), 16 (before the
        // shape in rejoin requests), 17 (before overflowed collectives kept their entries'
        // ranks), 18 (before every living rank's life in the welcome) and any future version
        // are refused.
        for v in [
            1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 20,
        ] {
            b[2] = v;
            assert_eq!(Header::decode(&b), Err(WireError::BadVersion(v)));
        }
    }

    #[test]
    fn unknown_kind() {
        let mut b = GOLDEN;
        b[3] = 0;
        assert_eq!(Header::decode(&b), Err(WireError::UnknownKind(0)));
        b[3] = 99;
        assert_eq!(Header::decode(&b), Err(WireError::UnknownKind(99)));
    }

    #[test]
    fn lives_split_in_halves() {
        let h = Header {
            lives: Header::lives_of(0xffff, 7),
            ..sample()
        };
        assert_eq!((h.origin_life(), h.dst_life()), (0xffff, 7));
        assert_eq!(Header::decode(&h.encode()), Ok(h));
    }

    #[test]
    fn display_is_informative() {
        let e = WireError::TooLarge { len: 10, max: 5 };
        assert!(e.to_string().contains("10"));
        assert!(e.to_string().contains('5'));
        assert!(WireError::BadVersion(9).to_string().contains('9'));
    }
}
