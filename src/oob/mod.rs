//! The TCP transport, sans-IO part: wire header, incremental frame decoding, per-peer send
//! queues with vectored writes, the connection handshake, and the rule that picks the one link
//! between two daemons (`arbiter`). Nothing here touches a socket or
//! a clock; the mio driver owns those. The wire format is documented in `docs/wire.md`.

pub mod arbiter;
pub mod bulk_route;
pub mod frame;
pub mod handshake;
pub mod header;
pub mod interfaces;
pub mod send_queue;
pub mod session;
pub mod stall;
pub mod uri;

pub use frame::{Frame, FrameDecoder};
pub use handshake::{
    Handshake, HandshakeConfig, HandshakeError, HandshakeEvent, PeerIdent, keep_dialled_by,
};
pub use header::{HEADER_LEN, Header, Kind, MAGIC, PROTOCOL_VERSION, WireError};
pub use send_queue::{Payload, QueueFull, SendQueue};
