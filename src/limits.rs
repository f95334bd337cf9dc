//! Every bound in tbon lives here, so that a reader can see at a glance how much memory and time
//! the library may use, and what happens when a bound is reached (documented at each constant).

/// Default bound on the unmatched list: messages that arrived before any receive was posted for
/// them (PRRTE's list is unbounded). At the bound the oldest held message is dropped to make room
/// and handed back to the driver, which counts it and logs a warning. Setting: `unmatched_max`.
pub const UNMATCHED_MAX_DEFAULT: usize = 65_536;

/// Default largest message payload, in bytes (PRRTE: 100 MB). A larger send is refused at the
/// sender with an error; a larger frame arriving closes that connection with a logged reason.
/// Setting: `msg_max_bytes`.
pub const MSG_MAX_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;

/// Hard ceiling on `msg_max_bytes`: the wire's payload length field is 32 bits. A configuration
/// above it is refused by `Config::validate`.
pub const MSG_MAX_BYTES_CEILING: u64 = u32::MAX as u64;

/// Default bound on the bytes queued for one peer's connection and not yet written (PRRTE's send
/// queues are unbounded). At the bound a send is refused with a back-pressure error; nothing
/// queued is dropped. Must be at least `msg_max_bytes` so that one maximal message fits.
/// Setting: `send_queue_max_bytes`.
pub const SEND_QUEUE_MAX_BYTES_DEFAULT: usize = 128 * 1024 * 1024;

/// Default bound on messages sent before wire-up completes (the tree's connections are not up
/// yet). At the bound further sends are refused with a back-pressure error.
/// Setting: `prewire_queue_max`.
pub const PREWIRE_QUEUE_MAX_DEFAULT: usize = 4096;

/// Default time a connection may spend in the handshake, in milliseconds. At the bound the
/// connection is closed with a logged reason (a stray or stalled peer cannot hold a slot).
/// Setting: `handshake_timeout_ms`.
pub const HANDSHAKE_TIMEOUT_MS_DEFAULT: u64 = 5_000;

/// Default time for a daemon to report in during wire-up, in milliseconds. A daemon that has not
/// reported within it is marked failed and the tree is repaired around it.
/// Setting: `wireup_timeout_ms`.
pub const WIREUP_TIMEOUT_MS_DEFAULT: u64 = 60_000;

/// Default number of reconnect attempts to a peer after its connection is lost (PRRTE: 2 per
/// address). When they are used up the peer is treated as failed and its queued sends fail.
/// Setting: `reconnect_retries`.
pub const RECONNECT_RETRIES_DEFAULT: u32 = 5;

/// Longest contact URI accepted by `ContactUri::from_str`, in bytes. A longer string is refused
/// with an error before it is looked at (a URI comes from the network or the environment).
pub const CONTACT_URI_MAX_BYTES: usize = 4096;
