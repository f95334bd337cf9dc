//! Every bound in tbon lives here, so that a reader can see at a glance how much memory and time
//! the library may use, and what happens when a bound is reached (documented at each constant).

// ----- the event loop (src/driver/) -----------------------------------------------------------

/// Commands that may wait in a daemon's command queue (`driver::command_queue`) for the loop to
/// take them. At the bound, a caller on another thread blocks until the loop takes what waits
/// (back-pressure); a caller on the loop thread (inside a callback) gets `SendError::Busy`
/// instead of a deadlock. The loop takes everything waiting at once and holds at most this many
/// taken and not yet handled, so at most twice this many commands (88 bytes each) exist. The
/// queue's memory grows with use, so an idle daemon holds none of it; the crossbeam channel
/// before it touched every slot up front (65,536 slots made an idle daemon 9 MiB resident).
/// A caller with many small messages uses `Handle::send_batch` (up to `SEND_BATCH_MAX`
/// messages in one command) rather than a deep queue.
pub const COMMAND_QUEUE_MAX: usize = 2_048;

/// How long a caller that found the command queue full waits at most for the loop to say it
/// has taken what waited (`driver::command_queue::CommandQueue::push_waiting`) before it looks
/// for itself: a guard against a missed wake-up, not the expected wait.
pub const COMMAND_ROOM_WAIT_MS: u64 = 1;

/// Rounds of commands issued by callbacks (a reply to what they got) that the loop runs in the
/// turn that called them, before its flush, instead of in the next turn (one more `poll`).
/// Only after a drain that emptied the queue; each round takes at most `COMMANDS_PER_TURN_MAX`.
/// Bounded so that callbacks that keep issuing commands cannot hold a turn.
pub const CALLBACK_ROUNDS_PER_TURN_MAX: usize = 2;

/// Commands beyond `COMMAND_QUEUE_MAX` that callbacks may still queue when they cannot be told
/// of a refusal (`cancel`, `purge`, `cancel_stream`, `shutdown`, `shutdown_dvm`, `abort`: calls
/// without a result), so that a full queue does not drop them. At this bound as well, a stop
/// or an abort is still taken (a flag the loop reads every turn); a cancel or purge is then
/// dropped with an error in the log (a callback that issues this many in one turn).
pub const COMMAND_CONTROL_RESERVE: usize = 1_024;

/// How long the loop waits for a command before sleeping, right after it handed the
/// application a message or a completion (`driver::linger`): long enough for an application
/// thread that answers at once to push its answer (a few microseconds here), short enough that
/// a linger that catches nothing costs little. Bounded in use by `LINGER_CREDIT_MAX`; none
/// while the daemon produces or consumes a stream (the stream's threads need the processor).
pub const LINGER_US: u64 = 20;

/// Lingers in a row that may catch nothing before the loop stops lingering, until a linger
/// would have paid again (`driver::linger`).
pub const LINGER_CREDIT_MAX: u32 = 8;

/// Messages a `Batch` holds (`Handle::send_batch`). At the bound, `Batch::push` returns `Busy`:
/// the caller sends the batch and pushes again. A batch counts as this many commands against
/// `COMMANDS_PER_TURN_MAX` and is taken whole, so a turn takes at most that many messages, or
/// one batch if it is larger.
pub const SEND_BATCH_MAX: usize = 1_024;

/// Commands handled per loop turn before the loop looks at its sockets again, so a flood of API
/// calls cannot starve the network. The rest wait for the next turn (which does not sleep).
/// Small, with `READS_PER_EVENT_MAX`, so that a turn is short: timers (heartbeats, the failover
/// watch, RELM) run only between turns, and on a host with far more daemons than processors a
/// turn's processor time is stretched many times over in wall time. 4,096 commands and 16
/// reads per event made turns of up to 8.9 s at 256 daemons on 2 processors under 4x
/// overload, and daemons were declared dead; 512 and 2: at most 1.9 s, and 3 of 3 runs passed.
pub const COMMANDS_PER_TURN_MAX: usize = 512;
/// While draining commands, the loop reports its queue levels to flow control (and publishes
/// the origin gate) after every this many: a long drain of sends overshoots a queue's
/// high-water mark by at most this many messages.
pub const COMMANDS_PER_QUEUE_REPORT: usize = 256;
/// Payload bytes of sends that may wait in a daemon's command channel (or a quarter of
/// `send_queue_max_bytes`, if less); a send beyond is refused `Busy` at once (one larger send
/// still passes alone). It bounds what reaches a send queue after flow control closed the
/// origin gate (`driver/gate.rs`), so that a burst cannot carry a queue past its hard bound.
pub const COMMAND_QUEUE_MAX_BYTES: usize = 16 * 1024 * 1024;

/// Readiness events taken from one `poll`; more are returned by the next call.
pub const POLL_EVENTS_MAX: usize = 1_024;

/// Reads (of up to `READ_CHUNK_BYTES` each) from one socket per readiness event; a socket that
/// still has data is revisited next turn, so one busy peer cannot starve the others, and a
/// turn stays short (see `COMMANDS_PER_TURN_MAX`).
pub const READS_PER_EVENT_MAX: usize = 2;

/// Frames decoded from one read before acting on them; the rest stay buffered for the next
/// read (memory is bounded by the decoder's buffer, which holds at most one read's worth of
/// extra bytes).
pub const FRAMES_PER_READ_MAX: usize = 4_096;

/// Batches of buffered frames acted on per readiness event (each batch up to
/// `FRAMES_PER_READ_MAX` frames, one frame while handshaking); a connection with more is
/// revisited next turn.
pub const FRAME_BATCHES_PER_EVENT_MAX: usize = 64;

/// `writev` calls per connection per flush; a socket that still takes data is flushed again
/// on its next writable event or turn.
pub const WRITES_PER_FLUSH_MAX: usize = 64;

/// Bulk frames (a stream's data, `node::lane`) wait in a line of their own at each connection
/// and are handed to its send queue only while it holds less than this: a control frame then
/// waits behind at most about this much bulk data, plus the frame being written (a chunk is
/// up to `STREAM_CHUNK_MAX`). The bulk line is bounded by `send_queue_max_bytes` as the send
/// queue is: beyond it a bulk frame is refused as any frame is (back-pressure to its sender;
/// streams release data only towards a hop that is not congested, so they rarely meet it).
pub const BULK_FEED_BYTES: usize = 64 * 1024;
/// Control frames cannot starve the bulk line: once this many bytes were written on a
/// connection without a bulk frame being handed to its send queue, one is handed over
/// whatever the queue holds (bulk keeps at least about a fifth of a saturated link).
pub const BULK_SHARE_BYTES: usize = 1024 * 1024;
/// Bulk bytes a connection to a daemon has written and its peer has not yet confirmed reading
/// (the link session's acknowledgements): past this, bulk frames wait in the bulk line, while
/// control frames still go. On one TCP connection a control frame waits behind every byte the
/// kernel's buffers hold ahead of it (several MiB once autotuned), however it was queued here;
/// this keeps that at about this much, plus a chunk. Measured with `tbon bench --only stream`
/// (one stream, 64 B round trips beside it): unbounded, the round trip during the stream was
/// 6.6 to 13x the idle one; at 512 KiB, 2.1 to 3.8x, at about the same bandwidth (through one
/// relay, higher: the relay's queues stay short). Less starves the stream between
/// acknowledgements, which come at least every `LINK_ACK_PROMPT_BYTES` read.
pub const BULK_PIPE_BYTES: usize = 512 * 1024;

/// A bulk connection that could not be dialled, or was lost, is not dialled again to the same
/// peer for this long (stream data takes the link meanwhile).
pub const BULK_REDIAL_MS: u64 = 1_000;

/// Bytes written on a bulk connection per loop turn (its one flush a turn: stream frames
/// queued to it are not flushed at once). A large socket buffer would otherwise take several
/// MiB in one turn, and a message waiting to be read or written on the link would wait for
/// that copy. At the bound: the connection is flushed again next turn. Measured (one 4 GiB
/// stream over a direct link, three runs each): at 128 KiB the 64 B round trip beside it fell
/// to 91-199 µs from 410-590 µs, but the stream to 1.8-2.5 GiB/s from 3.0-3.6; again once
/// readers checked the chunks (`tbon bench --only stream`, two runs): 1.77x and 2.54x the idle
/// round trip, but 54% and 66% of raw TCP's bandwidth. Again once loops with streams stopped
/// lingering (`driver::linger`; the stream roles of `tbon bench`, one 4 GiB stream over a
/// direct link with 64 B round trips beside it, builds alternating, five or six runs each): at
/// 256 KiB 2.0-2.4 GiB/s and a round trip of 128-645 µs during the stream; at 128 KiB 2.1-2.6
/// GiB/s, 52-144 µs; at 64 KiB 2.0-2.5 GiB/s, 42-55 µs (1.1-1.6x the idle one), for about 5%
/// more processor time per byte. The stream's bandwidth stays within the noise, and a message
/// beside it keeps its latency: the rule for control traffic.
pub const BULK_FLUSH_BYTES: usize = 64 * 1024;

/// Bytes written on a bulk connection per loop turn while no message has been read or written
/// for `BULK_QUIET_AFTER_MS` (`node::lane::keeps_bulk_writes_small`: heartbeats, link
/// acknowledgements and the streams' own frames do not count). Nothing then waits for a long
/// write, and the stream moves in a few large writes instead of many 64 KiB ones (each a turn
/// of the loop, an `epoll_wait` and a wake-up of the reading daemon). Measured (one 2 GiB
/// stream over a direct link, nothing else on the DVM, the stream roles of `tbon bench` by
/// hand, three runs each): 3.6-4.4 GiB/s against 3.0-3.4 at `BULK_FLUSH_BYTES`, raw TCP
/// 5.0-5.2; the producer's `writev` calls from 17,000 to 2,400 a GiB. In practice a write is
/// also bounded by what the link session lets be unacknowledged (`BULK_PIPE_BYTES`).
/// Reached: the connection is flushed again next turn.
pub const BULK_FLUSH_QUIET_BYTES: usize = 1024 * 1024;

/// How long after the last message read or written a daemon keeps writing stream data in
/// `BULK_FLUSH_BYTES` pieces (milliseconds). A message that comes after a quiet spell may wait
/// for one write of up to `BULK_FLUSH_QUIET_BYTES` (a few hundred microseconds on loopback);
/// those after it, within this time, do not. Messages at least this often (100 a second) keep
/// the short writes for good. Short, because a stream started just after a message (a fetch
/// after a request, or a direct link just opened) starts in the short writes.
pub const BULK_QUIET_AFTER_MS: u64 = 10;
const _: () = assert!(BULK_PIPE_BYTES > LINK_ACK_PROMPT_BYTES);

/// Connections accepted per listener event; the rest are accepted next turn.
pub const ACCEPTS_PER_EVENT_MAX: usize = 64;

/// After `accept` fails with anything but "would block" (out of file descriptors, out of
/// memory), the listener is tried again after this long. Meanwhile connections wait in the
/// kernel's backlog (`LISTEN_BACKLOG`): nothing is dropped here, and the failure is logged at
/// the refusal log's bounded rate.
pub const ACCEPT_RETRY_MS: u64 = 100;

/// Open connections (established or handshaking) per daemon. A connection accepted beyond it is
/// closed at once with a log line. A tree neighbour needs one each; the rest is headroom for
/// wire-up (every daemon dials rank 0 once) and for reconnects.
pub const CONNECTIONS_MAX: usize = 16_384;

/// Connections accepted and still in their handshake (not yet proved to hold the job key) per
/// source IP address. At the bound, a new connection from that address is taken and the
/// OLDEST pending handshake from that address is closed, logged (rate-limited) and counted
/// (`handshakes_evicted`). A daemon's own peers finish their handshakes in a round trip, so a
/// flood from one address evicts its own connections, not theirs. Established connections
/// never count and are never evicted.
pub const PENDING_HANDSHAKES_PER_SOURCE_MAX: usize = 64;

/// Connections accepted and still in their handshake, from all sources together. At the
/// bound, a new connection is taken and the OLDEST pending handshake of all is closed, logged
/// (rate-limited) and counted (`handshakes_evicted`). With the per-connection cost below
/// (`HANDSHAKE_READ_CHUNK_BYTES` plus the connection's bookkeeping, about 2 KiB in all), this
/// holds a flood to about 2 MiB per daemon, whatever its size.
pub const PENDING_HANDSHAKES_MAX: usize = 1_024;

/// Pending handshakes above which a listener accepts one connection per `ACCEPT_PACE_MS`
/// instead of every connection waiting. Accepting faster than the handshakes finish only
/// evicts: at wire-up 2,047 daemons on one machine dial rank 0 at once, and rank 0 used to
/// accept a thousand in one turn and evict all but 64 of them (the per-source bound), which
/// then retried and were evicted again. Paced, the others wait in the kernel's backlog and
/// are taken as room frees. At least one connection is still taken per pace, so a stranger
/// holding pending handshakes cannot stop a listener: what it holds is evicted as before.
/// This is not a rate limit: one is also taken at each new readiness event of the listener,
/// so a flood whose connections keep raising events is accepted faster (an outside-in review
/// counted 35,759 evictions in 10 s at rank 0), each evicting the oldest pending handshake.
pub const ACCEPT_PACE_PENDING: usize = 32;

/// The pace of accepting above `ACCEPT_PACE_PENDING` pending handshakes (milliseconds).
pub const ACCEPT_PACE_MS: u64 = 1;

/// The read region of a connection still in its handshake (bytes). A handshake frame is a
/// 40-byte header and at most `HANDSHAKE_MAX_PAYLOAD` bytes, so one region holds it; the
/// region grows to `READ_CHUNK_BYTES` once the connection is established. Reached: a longer
/// handshake frame is refused by `HANDSHAKE_MAX_PAYLOAD`; bytes pipelined behind the last
/// handshake frame are read by the next reads.
pub const HANDSHAKE_READ_CHUNK_BYTES: usize = 1_024;

/// When the connection table (a slab indexed by poll token) has fewer than a quarter of its
/// capacity in use and more than this many slots, its unused tail is given back
/// (`Slab::shrink_to_fit`), so a flood that ended does not keep its high-water mark.
pub const CONN_TABLE_SHRINK_MIN: usize = 256;

/// Refusal log lines (WARN) per reason per `REFUSAL_LOG_INTERVAL_MS`. Beyond it the lines
/// are not written, but counted (`log_lines_suppressed`), and one summary line per reason
/// ("N more refused for REASON in the last T s") is written when the interval ends.
pub const REFUSAL_LOG_LINES_PER_INTERVAL: u32 = 5;

/// The interval of `REFUSAL_LOG_LINES_PER_INTERVAL` (milliseconds).
pub const REFUSAL_LOG_INTERVAL_MS: u64 = 10_000;

/// How long a stopping daemon keeps flushing queued frames before it closes its sockets anyway
/// (rank 0 shutting the DVM down also waits that long at most for its peers to close first).
pub const SHUTDOWN_LINGER_MS: u64 = 2_000;

/// Ports tried from a configured port range before start-up fails.
pub const PORT_RANGE_TRIES_MAX: usize = 1_024;

/// Ephemeral ports tried (each picked by the kernel for the first selected address) when a
/// daemon listens on several addresses and another address cannot have the port picked. At the
/// bound start-up fails with the last bind error.
pub const EPHEMERAL_PORT_TRIES_MAX: usize = 16;

/// The listen backlog of each listener.
pub const LISTEN_BACKLOG: i32 = 1_024;
// ---------------------------------------------------------------------------------------------
// oob: the TCP transport (see `docs/wire.md`)
// ---------------------------------------------------------------------------------------------

/// Largest payload (bytes) the frame decoder accepts before the handshake has completed.
///
/// A `HelloAck` payload is at most `2 + DVM_ID_MAX_BYTES + 16 + 32` = 305 bytes, so a
/// stranger cannot make a daemon buffer more than this before it has proved it belongs to the
/// DVM. At the bound: `WireError::TooLarge`, the connection is closed.
pub const HANDSHAKE_MAX_PAYLOAD: u32 = 512;

/// Longest DVM identity string (UTF-8 bytes) carried in the handshake.
///
/// At the bound: a longer identity in a received `Hello`/`HelloAck` is a malformed handshake
/// (connection closed); a longer configured identity is truncated at a character boundary by
/// the sender's handshake code, which logs an error (configuration must validate it earlier).
pub const DVM_ID_MAX_BYTES: usize = 255;

/// Smallest writable region (bytes) the frame decoder offers for one socket read.
///
/// Not a limit on frame size: when a header announcing a larger payload has been seen, the
/// decoder reserves room for the whole rest of that frame so it is read into one allocation.
/// Memory: each connection keeps at most one such region of uncommitted space.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;

/// While no large frame is being received, the decoder reads into what is left of its last
/// zero-filled region as long as at least this much is left; only then does it zero-fill a new
/// `READ_CHUNK_BYTES`. Before, every read zero-filled a whole region however few bytes came: a
/// daemon reading small messages a few at a time (acknowledgements, round trips) spent about
/// 65 instructions per 64 B message sent on that `memset` (callgrind, the rate test's sender).
pub const READ_SPARE_MIN_BYTES: usize = 16 * 1024;

/// Largest region zero-filled and offered to one read while a large frame is being received
/// (its whole capacity is reserved at once). Keeps the zero-fill cache-hot.
/// Reached: the rest of the frame is read by further reads into the same allocation.
pub const READ_LARGE_STEP_BYTES: usize = 256 * 1024;

/// Payloads of at least this many bytes (and at most `READ_POOLED_PAYLOAD_MAX_BYTES`) whose
/// frame has not fully arrived are read into a buffer of the daemon's payload pool
/// (`buffer_pool`), not into the connection's read region: a pooled buffer keeps its
/// initialised bytes, so reading into it again needs no zero-fill (safe Rust reads a socket
/// only into initialised memory; the zero-fill was 7% of a stream consumer's time).
pub const READ_POOLED_PAYLOAD_MIN_BYTES: usize = 64 * 1024;

/// The largest payload read into a pooled buffer; a larger one is read as before, into an
/// allocation of its own zero-filled step by step (`READ_LARGE_STEP_BYTES`).
pub const READ_POOLED_PAYLOAD_MAX_BYTES: usize = 2 * 1024 * 1024;

/// Idle buffers a daemon's payload pool keeps for the next large payloads (at most
/// `READ_PAYLOAD_POOL_BYTES_MAX` in all). At the bound a returned buffer is freed. A pool no
/// read took from for a second frees its idle buffers (an idle daemon keeps none).
pub const READ_PAYLOAD_POOL_BUFFERS_MAX: usize = 32;

/// The bytes of idle buffers a daemon's payload pool keeps (see
/// `READ_PAYLOAD_POOL_BUFFERS_MAX`): a stream's window of chunks.
pub const READ_PAYLOAD_POOL_BYTES_MAX: usize = 8 * 1024 * 1024;

/// After a payload read into a pooled buffer, the next read is offered at most this many
/// bytes of the read region: if the next frame is large too, only what came of its payload
/// with its header is copied into its pooled buffer, not a whole region's worth.
pub const READ_AFTER_POOLED_BYTES: usize = 4 * 1024;

/// Read allocations a connection's decoder keeps to read into again once every frame read
/// into them is gone (`oob::frame`). A payload shares the allocation it was read into, and a
/// relay's link session keeps the frames it forwarded until acknowledged: without these the
/// decoder would take fresh memory (faulted in and zeroed by the kernel) for every large frame.
///
/// At the bound (this many, or `READ_POOL_BYTES_MAX` in all): the oldest is let go (freed
/// once its frames are). An idle connection keeps none (given back once a second).
pub const READ_POOL_MAX: usize = 8;

/// The bytes of read allocations a connection's decoder keeps for reuse, in all (see
/// `READ_POOL_MAX`). A larger allocation is never kept.
pub const READ_POOL_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Most `IoSlice`s the driver passes to one `writev` (Linux `IOV_MAX` is 1024).
///
/// At the bound: the rest of the send queue is written by the next `writev`; nothing is lost.
pub const IOV_MAX_SLICES: usize = 64;

/// Largest payload (bytes) the send queue copies, together with its header, into a shared
/// contiguous buffer instead of referencing it, so that many tiny frames need few `IoSlice`s.
///
/// At the bound: larger payloads are never copied; they are written straight from the caller's
/// `Bytes` (one `IoSlice` for the header, one for the payload).
pub const SEND_COALESCE_MAX_PAYLOAD: usize = 256;

/// Largest payload (bytes) `send_batch` packs into a batch frame (`rml::batch_frame`): the
/// payloads the send queue copies anyway (`SEND_COALESCE_MAX_PAYLOAD`), so packing adds no copy.
///
/// At the bound: a larger message keeps a frame of its own (it is not copied).
pub const BATCH_ITEM_MAX_BYTES: usize = SEND_COALESCE_MAX_PAYLOAD;

/// Largest payload (bytes) of one batch frame: a receiver delivers a frame's items in one go, so
/// this bounds that step like any frame's size does.
///
/// At the bound: the run goes on in the next batch frame, in order.
pub const BATCH_FRAME_BYTES_MAX: usize = 32 * 1024;

/// Idle buffers a daemon keeps for the batch frames `send_batch` packs (`BufferPool`), and
/// their bytes (`BATCH_POOL_BYTES_MAX`). A frame's buffer comes back when the link session
/// lets it go (acknowledged); a fresh allocation of this size each time had the allocator
/// trimming and faulting its heap in again (about a tenth of a 64 B sender's time). At the
/// bound a returned buffer is freed; a pool nothing took from for a second frees its idle
/// buffers (an idle daemon keeps none).
pub const BATCH_POOL_BUFFERS_MAX: usize = 64;

/// The bytes of idle buffers the batch frame pool keeps (see `BATCH_POOL_BUFFERS_MAX`).
pub const BATCH_POOL_BYTES_MAX: usize = BATCH_POOL_BUFFERS_MAX * BATCH_FRAME_BYTES_MAX;

/// Most messages in one batch frame (with empty payloads, bytes alone would allow 4,096).
///
/// At the bound: the run goes on in the next batch frame, in order; a receiver refuses a batch
/// with more items as malformed.
pub const BATCH_FRAME_ITEMS_MAX: usize = 1_024;

/// Size (bytes) at which the send queue stops appending small frames to one shared buffer and
/// starts a new one, so a buffer can be freed as soon as it has been written.
///
/// At the bound: a new buffer is started; nothing else changes.
pub const SEND_COALESCE_BUFFER_BYTES: usize = 64 * 1024;

// ----- rml and configuration defaults ---------------------------------------------------------

/// Default bound on the unmatched list: messages that arrived before any receive was posted for
/// them (PRRTE's list is unbounded). At the bound the oldest held message is dropped to make room
/// and handed back to the driver, which counts it and logs a warning. Setting: `unmatched_max`.
pub const UNMATCHED_MAX_DEFAULT: usize = 65_536;

/// Unread messages a [`crate::Subscription`] queues before its receive is cancelled; further
/// messages wait in the unmatched list (`unmatched_max`) until the reader has taken the queue
/// down to half, then the receive is posted again. The queue may exceed this by the matches of
/// one read (matches made before the pause).
pub const SUBSCRIPTION_QUEUE_MAX: usize = 4_096;

/// Default largest message payload, in bytes (PRRTE: 100 MB). A larger send is refused at the
/// sender with an error; a larger frame arriving closes that connection with a logged reason.
/// Setting: `msg_max_bytes`.
pub const MSG_MAX_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;

/// Hard ceiling on `msg_max_bytes`: the wire's payload length field is 32 bits. A configuration
/// above it is refused by `Config::validate`.
pub const MSG_MAX_BYTES_CEILING: u64 = u32::MAX as u64;

/// Link sessions (`oob::session`): the least `link_resend_max_bytes` accepted. A receiver
/// acknowledges every read batch (at most `FRAMES_PER_READ_MAX` frames, `READ_CHUNK_BYTES`
/// at a time), so a sender needs room for about a socket's worth in flight.
pub const LINK_RESEND_MIN_BYTES: usize = 1024 * 1024;

/// Default `link_stall_ms`: frames waiting this long for confirmation with nothing heard back
/// make a connection stalled, and the link fails over to the peer's next address
/// (`oob::stall`). Well above a round trip and a loaded turn; a third of the default heartbeat
/// timeout, so a failover completes long before a living peer could be taken for dead.
pub const LINK_STALL_MS_DEFAULT: u64 = 3_000;

/// Link sessions: a connection that has read at least this many bytes since its last
/// acknowledgement acknowledges at the end of the read batch, at once, so the sender lets go of
/// what it kept within a round trip. Less, and the acknowledgement rides on the next frame
/// written to that peer (a reply, usually), or goes alone after `LINK_ACK_DELAY_MS`: a lone
/// acknowledgement would wake the peer for nothing, measured at 1.4x plain mio's 64 B round
/// trip. Every acknowledgement costs both ends a write and a wake-up: at 64 KiB, 64 B frames
/// through a relay ran 14% below a build without link sessions, at 256 KiB about 6%.
pub const LINK_ACK_PROMPT_BYTES: usize = 256 * 1024;

/// Link sessions: a read batch holding a frame of at least this many payload bytes is
/// acknowledged at once, whatever `LINK_ACK_PROMPT_BYTES` says. The sender keeps a large frame
/// by reference, and at a relay that pins the allocation the frame was read into: the sooner
/// it is let go, the sooner the relay's decoder reads into it again (1 MiB frames through a
/// relay: 25% below counting only when acknowledged every 256 KiB, 9% at every frame).
pub const LINK_ACK_PROMPT_FRAME_BYTES: usize = 64 * 1024;

/// Link sessions: the longest an acknowledgement of a small read waits for a frame to ride on
/// (see `LINK_ACK_PROMPT_BYTES`).
pub const LINK_ACK_DELAY_MS: u64 = 5;

/// Default bound on the bytes a daemon keeps per neighbour, written and not yet acknowledged,
/// to write again after a broken connection (`oob::session::Outbound`). At the bound it writes
/// no more to that neighbour (control frames excepted) until acknowledgements come: the
/// frames stay queued, the queue's level rises and flow control pushes back on the senders;
/// nothing is dropped. Acknowledgements come with every batch the neighbour reads, so the
/// bound is only met by a neighbour that does not read. Setting: `link_resend_max_bytes`.
pub const LINK_RESEND_MAX_BYTES_DEFAULT: usize = 32 * 1024 * 1024;

/// Link sessions: packing buffers of small frames (`oob::send_queue`, at most
/// `SEND_COALESCE_BUFFER_BYTES` each, about 64 KiB) that acknowledgements let go and a link
/// keeps to pack into again (`oob::session::Runs`). A steady stream lets several go at once;
/// keeping them saves freeing and faulting in fresh pages for the next ones.
///
/// At the bound: a buffer let go is freed. An idle link keeps none (given back once a second).
pub const LINK_KEPT_SPARES_MAX: usize = 16;

/// Link sessions: small frames written and not yet acknowledged are copied, encoded, into runs
/// of at most this many bytes (`oob::session::Runs`); a run is let go, and its buffer reused,
/// once every frame in it is acknowledged.
///
/// At the bound: a new run is started. Between the runs a session holds and the one spare it
/// keeps, the memory stays under `link_resend_max_bytes` plus two runs.
pub const LINK_KEPT_RUN_BYTES: usize = 64 * 1024;

/// Default bound on the bytes queued for one peer's connection and not yet written (PRRTE's send
/// queues are unbounded). At the bound a send is refused with a back-pressure error; nothing
/// queued is dropped. Must be at least `msg_max_bytes` so that one maximal message fits.
/// Setting: `send_queue_max_bytes`.
pub const SEND_QUEUE_MAX_BYTES_DEFAULT: usize = 128 * 1024 * 1024;

/// Bytes queued towards a neighbour above which its queue is congested (`node::flow`): this
/// daemon stops reading the other neighbours' frames, and refuses its callers' sends towards
/// it `Busy`, until the queue is down to [`FLOW_LOW_BYTES`]. Far below
/// `send_queue_max_bytes`, where relayed frames are dropped: under overload, queues stay near
/// this size (latency grows by about this much per hop) and nothing is dropped.
pub const FLOW_HIGH_BYTES: usize = 1024 * 1024;

/// Bytes a congested queue must drain to before reads resume (see [`FLOW_HIGH_BYTES`]).
pub const FLOW_LOW_BYTES: usize = 256 * 1024;

/// A congested queue that took no bytes for this long stops pausing reads (its neighbour has
/// stopped reading: hung or dying; the heartbeats deal with it), so that one stuck neighbour
/// cannot stop a daemon from reading all the others.
pub const FLOW_STUCK_MS: u64 = 2_000;

/// How often, at most, a driver with connections left unread by flow control looks again
/// whether it may read them, when no write made room in between.
pub const FLOW_RECHECK_MS: u64 = 100;

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

/// Contacts a daemon keeps from lookups (beside those it owns from wire-up: its ancestors' and
/// its subtree's, and rank 0's). At the bound the oldest looked-up contact is forgotten; an
/// open connection to that rank is not affected, and a later dial looks it up again.
pub const CONTACT_CACHE_MAX: usize = 4_096;

/// Daemons rank 0 admits back at once (issue "Rejoin"): admitted and not yet settled (their
/// admission's broadcast not yet delivered everywhere). A request beyond it is refused `Busy`
/// and the daemon asks again (every [`REJOIN_RETRY_MS`] until its deadline); it bounds rank 0's
/// table of admissions in progress.
pub const REJOIN_IN_PROGRESS_MAX: usize = 64;

/// Restores a daemon passes on (the latest first) in each adoption notice, and rank 0 in each
/// welcome (issue "Rejoin"): how a child that still believes a rank dead learns, from its new
/// parent, that it was admitted back, before the confirmation (which only that parent can
/// forward) reaches it. A child that missed more restores than this learns the older ones
/// from the confirmations.
pub const REJOIN_RESTORES_TOLD_MAX: usize = 256;

/// A rejoining daemon sends its request to rank 0 again this often until it is answered (an
/// answer can be lost with a connection rank 0 closed, e.g. when it found the previous
/// incarnation dead just then); rank 0 answers a repeated request as the first. Bounded by the
/// rejoin's deadline (twice `wireup_timeout_ms`).
pub const REJOIN_RETRY_MS: u64 = 1_000;

/// A daemon leaving in order (`Handle::leave`) first waits this long at most for its own
/// reliable messages and broadcast requests to be acknowledged, then asks rank 0 regardless
/// (what is still unacknowledged then completes `NodeDown` at the others, as for a death).
pub const LEAVE_DRAIN_MS: u64 = 5_000;

/// A leaving daemon that has not been told within this long (from its call) that every living
/// daemon knows of its departure stops anyway: as a departure if rank 0's confirmation reached
/// it, else with a fatal reason (the others then find it gone as a failure).
pub const LEAVE_WAIT_MS: u64 = 30_000;

/// Frames a rejoining daemon keeps, unread, from daemons other than rank 0 while it waits for
/// its welcome (its new parent's `Sync` can overtake rank 0's answer); read once it is
/// welcomed (the lives check then drops what was meant for its previous incarnation). Beyond
/// it the newest are dropped (counted `dropped_stale`): reliable traffic is sent again, and a
/// neighbour offers `Sync` again at its next repair.
pub const REJOIN_HELD_FRAMES_MAX: usize = 1_024;

/// Ranks asked for in one contact lookup (one message to rank 0). More wanted ranks wait for
/// the next lookup, sent when the reply to this one arrives.
pub const CONTACT_LOOKUP_BATCH_MAX: usize = 256;

/// How long a daemon waits for rank 0's answer to a contact lookup before it asks again
/// (milliseconds).
pub const CONTACT_LOOKUP_TIMEOUT_MS: u64 = 5_000;

/// Times a contact lookup is sent before its ranks are given up as unreachable (every frame
/// waiting for them fails with `Unreachable`, and they are reported failed like a peer that
/// refuses every dial).
pub const CONTACT_LOOKUP_TRIES_MAX: u32 = 3;

/// Default number of reconnect attempts to a peer after its connection is lost (PRRTE: 2 per
/// address). When they are used up the peer is treated as failed and its queued sends fail.
/// Setting: `reconnect_retries`.
pub const RECONNECT_RETRIES_DEFAULT: u32 = 5;

/// Longest contact URI accepted by `ContactUri::from_str`, in bytes. A longer string is refused
/// with an error before it is looked at (a URI comes from the network or the environment).
pub const CONTACT_URI_MAX_BYTES: usize = 4096;

/// Smallest non-zero `socket_buffer_bytes`. Below about one MSS (65,483 bytes on loopback) Linux
/// withholds receive-window updates, and the sender falls back to zero-window probes with
/// exponential backoff: a 50 MiB message then takes minutes. `Config::validate` refuses less.
pub const SOCKET_BUFFER_MIN_BYTES: usize = 64 * 1024;

/// Shortest job key accepted (bytes). A shorter key is refused at start-up: it could be guessed.
pub const JOB_KEY_MIN_BYTES: usize = 16;

/// Longest job key accepted (bytes); a longer file is refused at start-up rather than read into
/// memory whole.
pub const JOB_KEY_MAX_BYTES: usize = 4096;

// ----- reliable messaging (src/relm/) -----------------------------------------------------------

/// Default `relm_cache_ms`: how long an intermediate hop keeps a reliable message's data for
/// replay (PRRTE's default). Past it the copy is evicted; a replay then comes from further
/// upstream, at worst from the origin, which keeps every message until acknowledged.
pub const RELM_CACHE_MS_DEFAULT: u64 = 500;

/// Default `relm_cache_max`: how many messages a hop caches (PRRTE's default); at the bound
/// the oldest copy is evicted, as above.
pub const RELM_CACHE_MAX_DEFAULT: usize = 30;

/// Default `relm_retransmit_ms`: the origin's first retransmission of an unacknowledged
/// message; doubled per retransmission up to `2^RELM_RETRANSMIT_BACKOFF_MAX` times this.
pub const RELM_RETRANSMIT_MS_DEFAULT: u64 = 2_000;

/// The retransmission timeout doubles at most this many times (2 s grows to 16 s).
pub const RELM_RETRANSMIT_BACKOFF_MAX: u32 = 3;

/// Retransmissions of one message before its origin gives up and fails the completion with
/// `Unreachable` (about 8 minutes at the defaults: a living destination is acknowledged long
/// before, a dead one is declared failed by heartbeats long before).
pub const RELM_RETRANSMITS_MAX: u32 = 32;

/// Default `relm_gate_ms`: how long a daemon waits for its changed neighbours' link updates
/// after a repair before sending its own to all of them anyway.
pub const RELM_GATE_MS_DEFAULT: u64 = 500;

/// Default `relm_unacked_max`: reliable messages an origin holds unacknowledged. At the bound
/// `send_reliable` fails at once with `Busy` (back-pressure to the caller).
pub const RELM_UNACKED_MAX_DEFAULT: usize = 4_096;

/// Default `relm_pending_max`: early messages a destination holds while their predecessor is
/// missing. At the bound a further early message is dropped unacknowledged; its origin
/// replays it later.
pub const RELM_PENDING_MAX_DEFAULT: usize = 4_096;

/// Entries per link-update frame (13 bytes each); a longer update is sent as several frames.
/// A received update announcing more is refused as malformed.
pub const RELM_UPDATE_ENTRIES_MAX: usize = 4_096;

/// Upper bound on the RELM times (`relm_cache_ms`, `relm_retransmit_ms`, `relm_gate_ms`): one
/// hour. `Config::validate` refuses more (deadlines far beyond it would overflow).
pub const RELM_MS_CEILING: u64 = 3_600_000;

/// Upper bound on the RELM counts (`relm_cache_max`, `relm_unacked_max`,
/// `relm_pending_max`): 2^20. `Config::validate` refuses more; it also keeps the messages in
/// flight per origin far below half the uid space, which wrap-aware ordering needs.
pub const RELM_COUNT_CEILING: usize = 1 << 20;

// ----- collectives (src/grpcomm/) ------------------------------------------------------------

/// Broadcast operations rank 0 keeps in flight: assigned an operation id and not yet completed
/// (acknowledged by the whole living tree), counting completion notices (`Done`) not yet handed
/// to the driver. At the bound rank 0 numbers no more: requests (its own included) wait in
/// arrival order, held up to [`XCAST_HELD_MAX`], and are numbered as completions make room.
pub const XCAST_INFLIGHT_MAX: usize = 256;

/// Broadcast requests rank 0 holds beyond its window ([`XCAST_INFLIGHT_MAX`]), waiting to be
/// numbered. Under overload this is where broadcasts wait instead of being refused: the
/// originators' own bound ([`XCAST_ORIGINATE_MAX`]) then turns their callers away locally.
/// At the bound rank 0's driver stops taking requests from RELM (the originator replays them
/// after its retransmission timeout) and rank 0's own broadcasts are refused `Busy`.
pub const XCAST_HELD_MAX: usize = 4_096;

/// Payload bytes rank 0 holds beyond its window (see [`XCAST_HELD_MAX`]; the same behaviour
/// at the bound). At least the largest payload, so that one always fits.
pub const XCAST_HELD_MAX_BYTES: usize = 64 * 1024 * 1024;

/// Payload bytes rank 0 keeps in flight (same accounting as [`XCAST_INFLIGHT_MAX`]), and so the
/// largest broadcast payload. A larger payload is refused at once (`XcastError::TooLarge` at the
/// originator, `Refused` from rank 0); a payload that does not fit beside those in flight waits,
/// like one that finds the window full.
pub const XCAST_INFLIGHT_MAX_BYTES: usize = 64 * 1024 * 1024;

/// Operations one daemon retains: those it has not delivered yet (held ahead of a gap, or
/// waiting for the application to poll them) and those delivered but not yet acknowledged by
/// every current child (kept for replay after a repair). At the bound an arriving operation
/// that is higher than every retained one is dropped, otherwise the highest retained one is
/// dropped to make room (consumers go in operation order, so the lowest ids are the useful
/// ones); the daemon re-requests what it dropped from its parent (`Resume`) once there is room.
/// Larger than [`XCAST_INFLIGHT_MAX`], so the bound is only reached after a repair or when the
/// application stops polling.
pub const XCAST_RETAINED_MAX: usize = 4 * XCAST_INFLIGHT_MAX;

/// Payload bytes one daemon retains (see [`XCAST_RETAINED_MAX`]; the same behaviour at the
/// bound). At least [`XCAST_INFLIGHT_MAX_BYTES`], so the largest payload always fits.
pub const XCAST_RETAINED_MAX_BYTES: usize = 4 * XCAST_INFLIGHT_MAX_BYTES;

/// Broadcast requests a daemon other than rank 0 may have outstanding (sent to rank 0, neither
/// completed nor refused yet), and no more than its share of what rank 0 holds
/// ([`XCAST_HELD_MAX`] over the DVM's size, at least 1: 64 each in a DVM of 64, `originate_share`
/// in `grpcomm/xcast.rs`), so that rank 0 never has to refuse a request for room. At the bound
/// `Xcast::originate` returns `XcastError::TooManyOutstanding` (`Busy` to the caller); the caller
/// waits for a completion.
pub const XCAST_ORIGINATE_MAX: usize = 256;

/// Default part size of a broadcast payload, in bytes (setting `bcast_part_bytes`). Rank 0
/// numbers a larger payload as consecutive operations of about this size (at most
/// [`XCAST_PARTS_MAX`] of them: a larger payload gets larger parts), so every daemon forwards
/// each part to its children as it arrives, while the next part is still on its way to it:
/// the broadcast is pipelined down the tree instead of stored and forwarded whole at each
/// level. Daemons deliver the payload whole, once its last part is here. 0: never split.
pub const XCAST_PART_BYTES_DEFAULT: usize = 256 * 1024;

/// Parts one broadcast is split into at most (see [`XCAST_PART_BYTES_DEFAULT`]). The window
/// ([`XCAST_INFLIGHT_MAX`]) and each daemon's retained store ([`XCAST_RETAINED_MAX`]) count
/// parts; a core lowers this to its retained bound so that every part of one broadcast can be
/// held at once (it delivers only whole payloads). A received operation naming more parts is
/// refused as malformed.
pub const XCAST_PARTS_MAX: usize = 64;

/// Refusals (requests whose payload is too large for rank 0) rank 0 has queued for the driver
/// and not yet handed out. At the bound a further refusal is dropped, logged and counted
/// (`XcastStats::refusals_dropped`); the originator's request then stays outstanding. Only
/// reachable with daemons of different configurations, when the driver stops draining
/// `poll_notice`.
pub const XCAST_REFUSALS_MAX: usize = 4_096;

/// Allgathers (and barriers) a daemon may have contributed to and not yet seen the result of.
/// At the bound `Allgather::contribute` returns `AllgatherError::TooMany`.
pub const ALLGATHER_INFLIGHT_MAX: usize = 64;

/// Allgathers a daemon keeps state for, including those its children contributed to before it
/// did itself. At the bound a contribution for a new collective is dropped, logged and counted
/// (`AllgatherStats::dropped_untracked`): that collective cannot complete. Twice
/// [`ALLGATHER_INFLIGHT_MAX`], which is enough while every daemon runs the same collectives in
/// the same order, each with at most that many in flight.
pub const ALLGATHER_TRACKED_MAX: usize = 2 * ALLGATHER_INFLIGHT_MAX;

/// Bytes one allgather may gather at one daemon: contribution bytes plus 8 per contributing
/// rank and 4 per excluded rank (what the result costs on the wire). A local contribution that
/// alone exceeds it is refused (`AllgatherError::TooLarge`). When merged contributions exceed
/// it, the collective overflows: its data are dropped, the overflow travels up to rank 0, and
/// every daemon gets a result with `overflowed` set and no contributions.
pub const ALLGATHER_MAX_BYTES: usize = 16 * 1024 * 1024;

/// Finished allgather ids a daemon remembers, so that a contribution arriving after the result
/// (re-sent to a new parent after a repair) does not start a new collective. The oldest is
/// forgotten first; a contribution for a forgotten id would open state that never completes
/// and counts against [`ALLGATHER_TRACKED_MAX`]. Ids must never be reused.
pub const ALLGATHER_FINISHED_MEMORY: usize = 4 * ALLGATHER_TRACKED_MAX;

/// Allgather results a daemon keeps to answer a contribution that arrives after it finished
/// the collective (a returned daemon whose new life contributes after the result's broadcast,
/// which it never receives; or a child re-sending to a new parent). The oldest is dropped first;
/// a late contribution that finds none is answered "lost": a daemon in its first life ignores
/// that (the broadcast brings it the result), a returned one ends its contribution with
/// `SendError::ResultLost` instead of hanging.
pub const ALLGATHER_RESULTS_CACHED_MAX: usize = 16;

/// Bytes of the cached allgather results ([`ALLGATHER_RESULTS_CACHED_MAX`]) together; a result
/// larger than this alone is not cached.
pub const ALLGATHER_RESULTS_CACHED_BYTES: usize = 32 * 1024 * 1024;

/// Allgather messages a daemon has queued beyond its contributions and `Sync`s (excuses passed
/// down, answers to late contributions) and the driver has not yet taken. The driver drains
/// them after every input, so the bound is only reached if it stops draining; then the oldest
/// is dropped and logged (`AllgatherStats::answers_dropped`): an excuse is offered again at the
/// next repair or reconnection, a late contribution is answered when it is re-sent.
pub const ALLGATHER_QUEUED_MAX: usize = 1_024;

/// Members of one group ([`crate::Group`]): above any DVM size, so a job may span every
/// daemon; a larger set is refused when the group is made (`GroupError::TooManyMembers`).
pub const GROUP_MEMBERS_MAX: usize = 1 << 20;

/// Group collectives a daemon may have contributed to and not yet seen the outcome of. At the
/// bound a new one is refused `Busy` (`Limit::GroupCollectivesInFlight`) when it is called,
/// before it takes its number in the group's sequence, so the caller offers it again later.
pub const GROUP_INFLIGHT_MAX: usize = 256;

/// Group collectives a daemon keeps state for beyond its own ([`GROUP_INFLIGHT_MAX`]): those it
/// relays for members below it (or that a child opened before this member's own call). At the
/// bound a contribution for one more is dropped, logged and counted
/// (`GroupStats::dropped_untracked`): that collective cannot complete. Four times
/// [`GROUP_INFLIGHT_MAX`]: a relay serves the members of several jobs at once.
pub const GROUP_TRACKED_MAX: usize = 4 * GROUP_INFLIGHT_MAX;

/// Finished group collectives a daemon remembers (a 128-bit digest and a sequence number
/// each), so that a contribution arriving after the outcome is answered rather than opening
/// new state. The oldest is forgotten first.
pub const GROUP_FINISHED_MEMORY: usize = 4 * GROUP_TRACKED_MAX;

/// Results of group collectives a daemon keeps to answer late contributions (a member whose
/// relay died before passing the result down re-sends its contribution, and the first daemon
/// on the way up that still has the result answers it). The oldest is dropped first; a late
/// contribution that finds none is answered "lost" and the member's collective fails with
/// `SendError::ResultLost` instead of hanging.
pub const GROUP_RESULTS_CACHED_MAX: usize = 64;

/// Bytes of the cached results ([`GROUP_RESULTS_CACHED_MAX`]) together; a result larger than
/// this alone is not cached.
pub const GROUP_RESULTS_CACHED_BYTES: usize = 32 * 1024 * 1024;

/// Groups (jobs) a daemon keeps committed data for (`Handle::commit`), until
/// `Handle::forget_group`. At the bound a commit for one more is refused
/// `Busy(Limit::ModexGroups)`; nothing committed is ever evicted.
pub const MODEX_GROUPS_MAX: usize = 256;

/// Bytes of a data-exchange key (`Handle::put`, `Handle::get`): longer is an error.
pub const MODEX_KEY_MAX: usize = 255;

/// Blobs (one rank's committed data for one group) a daemon caches from fences and fetches.
/// Least recently used out first; a later `get` fetches an evicted one again.
pub const MODEX_CACHE_MAX: usize = 4_096;

/// Bytes of the cached blobs together ([`MODEX_CACHE_MAX`]; the same eviction). A blob larger
/// than this alone is not cached: every `get` of it fetches it.
pub const MODEX_CACHE_BYTES: usize = 64 * 1024 * 1024;

/// Gets waiting for fetches on one daemon, all fetches together (many gets may wait for one
/// owner's data). At the bound a `get` that would wait is answered `GetError::Busy`.
pub const MODEX_GETS_WAITING_MAX: usize = 4_096;

/// Direct-mode fetches (one per owner and group, shared by the gets waiting for it) a daemon
/// has in flight. At the bound a `get` that needs one more is answered `GetError::Busy`. An
/// owner also keeps at most this many unanswered requests per requester.
pub const MODEX_FETCHES_MAX: usize = 256;

/// `Sync` offers a daemon remembers from ranks that are not (yet) its parent in its view of the
/// tree: a neighbour that learnt of a failure first offers the handshake before this daemon
/// knows it is the new parent; the offer is answered once it is. A few per repair at most. At
/// the bound the oldest offer is forgotten (and logged); that neighbour then waits for its next
/// repair to offer again.
pub const GRPCOMM_PENDING_SYNCS_MAX: usize = 16;

/// Allgather results rank 0 has to broadcast waiting for room in its window
/// ([`XCAST_INFLIGHT_MAX`]): the driver retries them, in order, on every loop turn, and refuses
/// rank 0's user broadcasts (`Busy`) while any waits. (Fault confirmations and the shutdown
/// never wait: they pass the window, one per confirmation of new deaths.) At most one result
/// per tracked allgather can wait, so the bound is not reached; if it were, the result would be
/// dropped, logged and counted (`dropped_queue_full`).
pub const GRPCOMM_DEFERRED_MAX: usize = ALLGATHER_TRACKED_MAX;

/// Unacknowledged reliable messages of the runtime (fault reports, broadcast requests and
/// completion notices, client messages) a daemon may have beyond `relm_unacked_max`: the
/// runtime's own window is `relm_unacked_max` plus this, beside the users' (`relm_unacked_max`
/// of theirs), so they never queue behind a user who keeps the users' window full. At this bound too they wait where they are made (the xcast core's queues, which count
/// against rank 0's window; the unreported fault set) and go out as acknowledgements make room.
pub const RELM_RUNTIME_RESERVE: usize = 1_024;

/// The lists one RELM input's posted messages are collected in are kept for the next input
/// (no allocation per reliable message received) while at most this long; a longer one (a
/// chain's held messages released at once) is let go.
pub const RELM_POSTED_KEPT_MAX: usize = 256;

/// Rounds of a node's collectives pump at most per call: each round moves something, and the
/// cores produce nothing without input, so reaching this is a bug (reported, not looped on).
pub const PUMP_ROUNDS_MAX: usize = 1_000_000;

/// `tbon daemon --hnp-file`: how many times a daemon that could not reach the rank 0 named in
/// the URI file starts again (`exec`, the same pid) to read the file's new contents (a fresh
/// rank 0 replaced a stale file after this daemon had read it). Past the bound, or if the file did not change, the
/// daemon exits 1 saying that the file is stale.
pub const URI_FILE_RETRIES_MAX: u32 = 3;

// ----- direct links (src/direct/) -------------------------------------------------------------

/// Default `direct_links_max`: direct links (asked for, granted or open) a daemon keeps at once.
/// At the bound a daemon asks for no new link (the message takes the tree, counted in
/// `direct.no_room`) and denies requests (`Full`).
pub const DIRECT_LINKS_MAX_DEFAULT: usize = 64;
/// Upper bound of `direct_links_max` (each link is a connection with its send queue).
pub const DIRECT_LINKS_MAX_MAX: usize = 4_096;
/// Denials a daemon remembers (no new request to those daemons until each expires); at the
/// bound the one expiring first is forgotten.
pub const DIRECT_DENIALS_MAX: usize = 1_024;

/// Messages (and bytes) to one daemon that wait while the direct link to it closes (about one
/// link round trip plus one tree hop; only links idle for `direct_auto_window_ms` are evicted,
/// so few wait), then until the queue towards the tree's next hop is not congested. The origin
/// gate refuses new sends to that daemon once they reach the flow-control high-water mark
/// (`node/direct_held.rs`), so these bounds are met only by sends it admitted a moment before.
/// Beyond either, a send with a completion fails `Busy` and one without is dropped, counted in
/// `dropped_queue_full` and logged, as at a relay's hard queue bound.
pub const DIRECT_HELD_MAX: usize = 65_536;
/// See [`DIRECT_HELD_MAX`].
pub const DIRECT_HELD_BYTES_MAX: usize = 64 << 20;
/// A turn of a daemon's loop (from waking in `poll` to the next `poll`) longer than this is
/// logged at info level (target `tbon::driver::event_loop::turns`): under overload it tells a
/// long turn from a loop that was not scheduled, which the failover watch sees the same way.
pub const TURN_LOG_MS: u64 = 200;
/// Frames from one daemon that wait for its drain marker while a direct link with it opens
/// (its own messages to this daemon; `node/marker_wait.rs`). At this bound, or at
/// [`MARKER_WAIT_BYTES_MAX`], the connection is no longer read and TCP holds the sender back,
/// as every read of it was before frames waited in the node; one read's frames may pass it.
pub const MARKER_WAIT_FRAMES_MAX: usize = 4_096;
/// See [`MARKER_WAIT_FRAMES_MAX`].
pub const MARKER_WAIT_BYTES_MAX: usize = 4 << 20;
/// Default `direct_auto_messages`: the `auto` policy asks once a destination took more
/// messages than this within `direct_auto_window_ms`.
pub const DIRECT_AUTO_MESSAGES_DEFAULT: u64 = 256;
/// Default `direct_auto_bytes`: ... or more payload bytes than this.
pub const DIRECT_AUTO_BYTES_DEFAULT: u64 = 1024 * 1024;
/// Default `direct_auto_window_ms`.
pub const DIRECT_AUTO_WINDOW_MS_DEFAULT: u64 = 1_000;
/// Default `direct_denial_ms`: how long a denial is remembered.
pub const DIRECT_DENIAL_MS_DEFAULT: u64 = 30_000;
/// Default `direct_request_ms`: how long a request (or a grant) waits for its answer before
/// it ends (`Timeout`); the messages meanwhile take the tree, so nothing waits with it.
pub const DIRECT_REQUEST_MS_DEFAULT: u64 = 5_000;
/// How many times a link asks again for a drain marker it waits for, one `direct_request_ms`
/// apart: a grantor sends its `Grant` again (the requester answers `Switch` again, or
/// `Withdraw`), a requester its `Switch` (the grantor answers `Ready` again), the end that
/// answered a `Close` sends `AskShut` (answered `Shut` again). A closing link waits as long
/// for `CloseAck`, which rides the link itself and is not asked for again. Copies are
/// ignored, so a marker lost with a tree connection is recovered, and a slow tree only costs
/// a few small messages. At the bound (two minutes at the default `direct_request_ms`) the
/// link is given up and its connection closed: what the other end wrote there and this end
/// has not read is lost, as on a lost link, and nothing is ever read out of order.
pub const DIRECT_MARKER_POKES_MAX: u32 = 24;

/// Stream chunks: the most payload bytes one `Data` message carries (a larger write is cut
/// into chunks of this size without copying). A relay holds a chunk whole before it forwards
/// it, and a consumer hands chunks whole to its application. 1 MiB, from 256 KiB: a consumer
/// then reads, hands over and checks a quarter as many frames (one 2 GiB stream over a direct
/// link, alone, five runs each, builds alternating: the consumer's processor time from 0.26 to
/// 0.18 s a GiB with a `Stream` reader, 3.2 to 3.6 GiB/s; with `fetch_callback` 5.4 to 6.0
/// GiB/s, raw TCP about 5.1). With the default window (4 MiB) four chunks are in flight.
pub const STREAM_CHUNK_MAX: usize = 1024 * 1024;
/// The credit windows of the streams a daemon fetches, summed, and likewise of the streams it
/// produces: what its streams can hold in memory at once, whatever their number. A fetch
/// beyond it is refused `Busy`; an `Open` beyond it is answered `FAIL_NO_ROOM`.
pub const STREAM_WINDOWS_TOTAL_MAX: u64 = 512 << 20;
/// Stream data a daemon releases towards its next hops per call of its release (after each
/// stream command, queue report, driver turn and timeout): bulk data adds at most this much to
/// a queue between two reports of its level, and waits while the next hop is congested.
pub const STREAM_RELEASE_BYTES: usize = 1 << 20;
/// Rounds of messages between a daemon's own producer and consumer (a stream fetched from
/// itself) handled per pump; the rest waits for the next turn.
pub const STREAM_LOCAL_ROUNDS_MAX: usize = 8;
/// Idle chunk buffers a daemon keeps for the next chunks it encodes (`stream::BufferPool`):
/// at most this many times `STREAM_CHUNK_MAX` of memory stays allocated after a stream.
pub const STREAM_POOL_BUFFERS_MAX: usize = 4;
/// Stream credit: the most bytes a consumer lets a producer have in flight (sent and not yet
/// consumed) on one stream; a larger window asked for is cut to this. What a stream holds at
/// the producer, at the consumer and on the path together stays under it, whatever the
/// stream's length and however slow the consumer.
pub const STREAM_WINDOW_MAX: usize = 64 << 20;

/// The least window a fetch runs with (`FetchOptions::window`, C's `tbon_fetch_opts.window`):
/// a smaller one asked for is raised to it. A window of one byte moved 6.6 KB/s, every daemon
/// on the path busy with a frame per byte (an outside-in review); 64 KiB moved 117 MiB/s.
pub const STREAM_WINDOW_MIN: usize = 64 << 10;
/// A stream request's bytes (the name of the data asked for); a larger `Open` is refused.
pub const STREAM_REQUEST_MAX: usize = 64 * 1024;
/// A stream service name's bytes.
pub const STREAM_SERVICE_MAX: usize = 255;
/// A stream failure's reason, in bytes (cut to this when sent).
pub const STREAM_REASON_MAX: usize = 1024;
/// Streams a daemon produces at once, and streams it consumes at once (each table): an `Open`
/// beyond is refused (the consumer hears "no room"), a fetch beyond fails `Busy`.
pub const STREAMS_MAX: usize = 1_024;

/// A stopping daemon waits for its service handlers still running to return (so that none
/// runs once the stop has returned: the C API's safe point to free `user` data). Past this
/// long it logs that it is still waiting, once per handler; the wait itself has no bound: the
/// loop has failed every writer `ShutDown`, and what holds the handler then is its own work.
pub const HANDLER_WAIT_LOG_MS: u64 = 1_000;
/// Services a daemon offers.
pub const STREAM_SERVICES_MAX: usize = 256;
/// Resumes of one stream (after a repair, a lost link, a gap or a quarter of its idle time
/// without news) before it fails `TimedOut`.
pub const STREAM_RESUMES_MAX: u32 = 16;

/// Status queries (`status`): the gathers one daemon keeps at once. A query from a parent
/// beyond it has the oldest gather answered at once with what it has (less detail, no more
/// memory); a local one (a tool's or a caller's) beyond `STATUS_LOCAL_MAX` is refused.
pub const STATUS_GATHERS_MAX: usize = 64;
/// Status queries of this daemon's own tools and callers in progress at once; more are
/// refused (the tool hears "busy", a caller gets `Busy`).
pub const STATUS_LOCAL_MAX: usize = 8;
/// Parts in one status answer (a healthy subtree is one part; with `all`, each daemon is one):
/// beyond it a child's parts are replaced by one elided part and the report says truncated.
pub const STATUS_PARTS_MAX: usize = 16_384;
/// Bytes of one status answer (and less than the message maximum): the same rule as
/// `STATUS_PARTS_MAX`.
pub const STATUS_ANSWER_BYTES_MAX: usize = 4 << 20;
/// Children and links a daemon's status entry may list (a decoder refuses more).
pub const STATUS_LINKS_MAX: usize = 65_536;
/// A status refusal's reason, in bytes.
pub const STATUS_REASON_MAX: usize = 1_024;
/// The time budget a status query may ask for (a longer one is cut to it), and the default.
pub const STATUS_BUDGET_MS_MAX: u32 = 60_000;
/// The budget a status query gets when it asks for none.
pub const STATUS_BUDGET_MS_DEFAULT: u32 = 2_000;
/// Operator tool connections a daemon holds at once (authenticated with the operator
/// credential); a tool's `Hello` beyond it is refused at once, and so is a tool that proves
/// the credential when the others took the last one. Tools still in their handshake are not
/// counted (a stranger's `Hello` must not take a slot): the pending-handshake bounds hold them.
pub const TOOL_CONNECTIONS_MAX: usize = 8;
/// A tool connection with no query in progress for this long is closed.
pub const TOOL_IDLE_MS: u64 = 60_000;
/// The largest DVM a tool takes a report of: the view of a report allocates an entry per
/// rank, so a report claiming more (a broken or hostile daemon) is refused as malformed
/// rather than exhausting the tool's memory.
pub const STATUS_REPORT_SIZE_MAX: u32 = 1 << 22;
/// The largest frame a tool may send (a query is 34 bytes).
pub const TOOL_FRAME_MAX: u32 = 256;

// ----- clients routed through their daemon (src/clients/, issue "Jobs") ------------------------

/// Clients connected to one daemon at once. A client beyond it is refused (`Refused`, with a
/// log line).
pub const CLIENTS_MAX: usize = 4_096;
/// Jobs open for clients on one daemon (`Handle::client_job`); beyond it the call fails
/// `Busy`. `Handle::client_job_close` frees one.
pub const CLIENT_JOBS_MAX: usize = 1_024;

/// The jobs one job's `accept_from` may list (`Handle::client_job`; C: `n_accept`): a longer
/// list is refused (`ClientError::TooLarge`, C `TBON_ERR_TOO_LARGE`) before it is copied.
pub const CLIENT_ACCEPT_FROM_MAX: usize = 1_024;
/// Connections to the client socket that have not yet been admitted; at the bound the oldest
/// is closed. Each also closes after `handshake_timeout_ms`.
pub const CLIENT_PENDING_MAX: usize = 64;
/// Sends of one client not yet answered (waiting at its daemon or in flight). At the bound
/// the client's library refuses `Busy` (`try_send`) or waits (`send`), and the daemon reads no
/// more of its frames until one is answered.
pub const CLIENT_SENDS_INFLIGHT_MAX: usize = 256;
/// Bytes a daemon queues towards one client that does not read (soft: one message more than
/// fits is taken when the queue is empty). Beyond it, RELM refuses further messages for the
/// client and their origins replay them later (order kept; see `clients` for the cost).
pub const CLIENT_QUEUE_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Control messages about clients (results, watches, exit notices) a daemon holds for other
/// daemons while RELM has no room; at the bound it refuses client messages (replayed later)
/// until they drain, so the results of what it took are never dropped.
pub const CLIENT_CONTROL_QUEUE_MAX: usize = 4_096;
/// Results in one control message between daemons (a longer batch is cut).
pub const CLIENT_RESULTS_PER_MESSAGE_MAX: usize = 4_096;
/// Client sends handed to RELM per pump of a daemon (the rest at the next turn).
pub const CLIENT_SENDS_PER_PUMP_MAX: usize = 4_096;
/// Clients one client watches at once; the library refuses `Busy` beyond it.
pub const CLIENT_WATCHES_MAX: usize = 4_096;
/// Messages a client's library holds for receives not posted yet. At the bound it stops
/// reading its socket until the application receives (back-pressure reaches the senders
/// through `CLIENT_QUEUE_BYTES_MAX`), never drops.
pub const CLIENT_UNMATCHED_MAX: usize = 4_096;
/// Receives a client may have posted at once; beyond it `recv_cb` fails `Busy`.
pub const CLIENT_RECEIVES_MAX: usize = 4_096;
