//! Every bound in tbon lives here, so that a reader can see at a glance how much memory and time
//! the library may use, and what happens when a bound is reached (documented at each constant).

// ----- the event loop (src/driver/) -----------------------------------------------------------

/// Commands that may wait in a daemon's command channel. At the bound, a caller on another
/// thread blocks until the loop catches up (back-pressure); a caller on the loop thread (inside a
/// callback) gets `SendError::Busy` instead of a deadlock.
pub const COMMAND_QUEUE_MAX: usize = 65_536;

/// Commands handled per loop turn before the loop looks at its sockets again, so a flood of API
/// calls cannot starve the network. The rest wait for the next turn (which does not sleep).
pub const COMMANDS_PER_TURN_MAX: usize = 4_096;

/// Readiness events taken from one `poll`; more are returned by the next call.
pub const POLL_EVENTS_MAX: usize = 1_024;

/// Reads from one socket per readiness event; a socket that still has data is revisited next
/// turn, so one busy peer cannot starve the others.
pub const READS_PER_EVENT_MAX: usize = 16;

/// Frames decoded from one read before acting on them; the rest stay buffered for the next
/// read (memory is bounded by the decoder's buffer, which holds at most one read's worth of
/// extra bytes).
pub const FRAMES_PER_READ_MAX: usize = 4_096;

/// `writev` calls per connection per flush; a socket that still takes data is flushed again
/// on its next writable event or turn.
pub const WRITES_PER_FLUSH_MAX: usize = 64;

/// Connections accepted per listener event; the rest are accepted next turn.
pub const ACCEPTS_PER_EVENT_MAX: usize = 64;

/// Open connections (established or handshaking) per daemon. A connection accepted beyond it is
/// closed at once with a log line. A tree neighbour needs one each; the rest is headroom for
/// wire-up (every daemon dials rank 0 once) and for reconnects.
pub const CONNECTIONS_MAX: usize = 16_384;

/// How long a stopping daemon keeps flushing queued frames before it closes its sockets anyway.
pub const SHUTDOWN_LINGER_MS: u64 = 2_000;

/// Ports tried from a configured port range before start-up fails.
pub const PORT_RANGE_TRIES_MAX: usize = 1_024;

/// The listen backlog of each listener.
pub const LISTEN_BACKLOG: i32 = 1_024;
