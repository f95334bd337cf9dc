//! Streams (issue "Streams": the sans-IO protocol core; `node/streams.rs` carries it between
//! daemons): bulk data from a producer to
//! a consumer that asked for it by service name, in order, under the consumer's credit, with
//! an explicit end. DYAD's data transport layer over Flux has the shape (a request, many raw
//! responses, ENODATA at the end) but no flow control; here a slow consumer holds a fast
//! producer back instead of filling up.
//!
//! * `wire.rs` — the messages (`Open`, `Data`, `Credit`, `End`, `Fail`, `Cancel`).
//! * `digest.rs` — the end-to-end check of every chunk and of the whole stream.
//! * `outgoing.rs` — [`Outgoing`], the producer's side of one stream.
//! * `incoming.rs` — [`Incoming`], the consumer's side of one stream.
//! * The chunks of a stream a daemon fetches from itself are encoded into buffers of a bounded
//!   pool (`crate::buffer_pool`). Between daemons a chunk is not copied: its frame is the
//!   message's head and the writer's buffer (`StreamMsg::encode_parts`).
//!
//! The application API is `Handle::serve`/`Handle::fetch` (`driver/serve.rs`) and its C
//! twin (`capi/src/streams.rs`). A producer's messages wait in each connection's bulk line
//! (`node::lane`): control traffic goes ahead of them. Not yet (the next step): a
//! connection of its own for bulk data (what is already in the kernel's buffers is still
//! ahead of a message).
//!
//! # The protocol
//! The consumer picks a stream id (unique among its streams) and sends `Open` with the
//! service name, the request bytes, the offset it wants to start at and its window: the
//! producer may send bytes below `offset + window`. The producer sends `Data` chunks in
//! order (each at most [`crate::limits::STREAM_CHUNK_MAX`] bytes, with the digest of its offset
//! and bytes) while it has credit, and waits when it has none ([`Outgoing::room`] is 0): the
//! writer is told to wait, nothing is buffered beyond the window. The consumer checks each
//! chunk (at the expected offset, within the credit, digest right) before handing it on, and
//! grants more credit (`Credit`, the offset the producer may send up to) as the application
//! consumes, half a window at a time. The producer ends with `End` (the total length and the
//! sum of its chunks' digests: the consumer reports `Finished` only if both match) or `Fail`
//! (an application code and reason). The consumer may `Cancel` at any time; the producer's
//! writes then fail `Cancelled`.
//!
//! # Faults
//! The death of the producer ends the consumer's stream `ProducerDied` (through the fault
//! handling, within the failure-detection time); the death of the consumer ends the
//! producer's. A daemon that stops (not a crash) tells the other end of each of its streams
//! at once, with its last frames: a producer fails them with the reserved code
//! `FAIL_STOPPED` (`ProducerDied` at the consumer), a consumer sends `Stopping`
//! (`ConsumerDied` at the producer). When chunks may have been lost while both ends live (a relay on the path died,
//! a direct link was lost, a connection on the path dropped: a gap in the offsets, or a
//! probe's answer), the consumer resumes: it opens the stream again under a new id at the byte it stands at
//! ([`Incoming::resume`], at most [`crate::limits::STREAM_RESUMES_MAX`] times), so no byte is
//! lost or delivered twice; late frames of the old id are stale and ignored. The
//! producer's service is asked again with the same request and that offset (it must be able
//! to start there: a file, a buffer). A stream that hears nothing for a quarter of its idle
//! time probes its producer (`Probe`), which answers where it stands (`Position`: data sent
//! beyond what arrived was lost, resume; a credit short of the one granted is granted again;
//! otherwise the service is slow, left alone) or that it does not have the stream (`Unknown`:
//! its open or end was lost, resume). A stream that hears no data for its idle time fails
//! `TimedOut`: probes and their answers are no news.
//!
//! # Bounds
//! Per stream, the bytes in flight: the window, at most [`crate::limits::STREAM_WINDOW_MAX`];
//! chunk, request, service name and reason sizes: `limits::STREAM_*` (a larger one is an
//! error at decoding, and the stream fails).

pub(crate) mod digest;
mod incoming;
mod outgoing;
#[doc(hidden)]
pub mod wire;

#[cfg(test)]
mod tests;

// The protocol's parts, for the node and the simulator: not API.
#[doc(hidden)]
pub use crate::buffer_pool::BufferPool;
#[doc(hidden)]
pub use digest::ChunkDigest;
#[doc(hidden)]
pub use incoming::{Incoming, Status};
#[doc(hidden)]
pub use outgoing::{Outgoing, chunk_max};
#[doc(hidden)]
pub use wire::StreamMsg;

use crate::Rank;

/// Why a stream did not finish.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StreamError {
    /// The producer has no such service.
    NoService(String),
    /// The producer failed the stream with its own code and reason.
    Producer {
        /// The producer's code (its own; below [`crate::FAIL_RESERVED_MIN`]).
        code: u32,
        /// The producer's reason, as text.
        reason: String,
    },
    /// The producer's daemon died, or stopped (its stop tells the consumer at once).
    ProducerDied(Rank),
    /// The consumer's daemon died, or stopped (its stop tells the producer at once).
    ConsumerDied(Rank),
    /// The consumer cancelled it.
    Cancelled,
    /// Nothing arrived for the stream's idle time.
    TimedOut,
    /// A chunk (or the whole stream, at its end) failed its digest check.
    Corrupt {
        /// The stream offset of the chunk that failed.
        offset: u64,
    },
    /// The other end broke the protocol (a gap, bytes beyond the credit, a second end).
    Protocol(String),
    /// This daemon stopped.
    ShutDown,
    /// This daemon refused the call (a full stream table, a dead producer, a blocking call
    /// on its loop thread); the reason says which.
    Refused(String),
}

impl std::fmt::Display for StreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StreamError::NoService(s) => write!(f, "no service {s:?}"),
            StreamError::Producer { code, reason } => {
                write!(f, "the producer failed the stream ({code}: {reason})")
            }
            StreamError::ProducerDied(r) => write!(f, "the producer, rank {r}, died or stopped"),
            StreamError::ConsumerDied(r) => write!(f, "the consumer, rank {r}, died or stopped"),
            StreamError::Cancelled => write!(f, "cancelled by the consumer"),
            StreamError::TimedOut => write!(f, "nothing arrived for the stream's idle time"),
            StreamError::Corrupt { offset } => write!(f, "corrupt data at byte {offset}"),
            StreamError::Protocol(why) => write!(f, "protocol error: {why}"),
            StreamError::ShutDown => write!(f, "this daemon stopped"),
            StreamError::Refused(why) => write!(f, "refused: {why}"),
        }
    }
}

impl std::error::Error for StreamError {}
