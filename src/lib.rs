//! tbon: a fault-tolerant tree-based overlay network for the daemons of an HPC resource manager.
//!
//! See `README.md` for what it is and `AGENTS.md` for where things live.
//!
//! `unsafe` is denied everywhere but in [`ffi`], the C API (`include/tbon.h`).
#![deny(unsafe_code)]
// No panic reachable from network bytes or API arguments: the library (outside tests) may not
// unwrap, expect, panic or index unchecked. The one audited exception is `routed::radix`.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod config;
pub mod counters;
pub mod direct;
pub mod driver;
pub mod error;
pub mod faults;
#[allow(unsafe_code)] // the C API: the one module where unsafe is allowed
pub mod ffi;
mod fxhash;
pub mod grpcomm;
pub mod invariant;
pub mod limits;
pub mod node;
pub mod oob;
pub mod relm;
pub mod rml;
pub mod routed;
#[cfg(any(test, feature = "sim"))]
pub mod sim;
pub mod status;
pub mod stream;

pub use counters::{Counters, DirectCounters, StreamCounters};
pub use direct::{Route, RouteSetting};
pub use driver::key::{Key, KeyError};
pub use driver::launch;
pub use driver::{
    Batch, Daemon, FAIL_ABANDONED, FAIL_RESERVED_MIN, FetchOptions, Handle, Outgoing,
    ServiceHandler, StopReason, Stream, StreamItem, StreamReader, StreamRequest, StreamWriter,
    start,
};
pub use error::{RecvError, SendError, StartError};
pub use grpcomm::AllgatherResult;
pub use node::contacts::ContactsSetting;
pub use node::{FAIL_NO_ROOM, FAIL_NO_SERVICE};
pub use rml::{Message, Peer, Tag};
pub use routed::{RecoveryStatus, Scope};
pub use stream::StreamError;

/// A daemon's rank in the DVM: 0 is the root (the HNP), ranks run `0..size`.
pub type Rank = u32;
