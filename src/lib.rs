//! tbon: a fault-tolerant tree-based overlay network for the daemons of an HPC resource manager.
//!
//! See the repository's `README.md` for what it is, how to use it from Rust and C, and what
//! it guarantees.
//!
//! This crate is the library alone: no command line, no C symbols. The `tbon` command is the
//! `tbon-cli` package and the C API (`include/tbon.h`, `libtbon.so`) the `tbon-capi` package
//! of the same repository; both use only what this crate makes public. `unsafe` is forbidden
//! here (the C API's pointer handling lives in `tbon-capi`).
//!
//! The API: [`start`] (or [`launch`]) gives a [`Daemon`], whose [`Handle`] sends, receives,
//! broadcasts, gathers, serves and fetches streams, and reports faults; [`config::Config`]
//! holds the settings, [`Key`] the job key; [`status`] asks a live DVM how it is; [`routed`]
//! computes the tree any DVM would have. Every bound is in [`limits`]; every error type in
//! [`error`] is sorted by cause.
//!
//! # Example
//!
//! A DVM of three daemons in one process (normally one per node: see [`launch`]), a message
//! to rank 0 through a callback, a broadcast read from a [`Subscription`], and the shutdown:
//!
//! ```
//! use std::time::Duration;
//! use tbon::{Peer, RecvMode};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut cfg = tbon::config::Config::default(); // reads no environment variable
//! cfg.key = Some(tbon::Key::generate()?); // every daemon of a DVM holds the same key
//! cfg.if_include = vec!["127.0.0.1/32".into()];
//! let dvm = tbon::launch::local_dvm(cfg, 3)?; // rank order; each derefs to a Handle
//!
//! let (tx, rx) = std::sync::mpsc::channel();
//! dvm[0].recv(Peer::Any, 100, RecvMode::Once, move |m| {
//!     let _ = tx.send(m.payload); // runs on rank 0's loop thread: keep it short
//! })?;
//! dvm[2].send(0, 100, "to rank 0")?; // user tags start at 100
//! assert_eq!(&rx.recv_timeout(Duration::from_secs(30))?[..], b"to rank 0");
//!
//! let news = dvm[1].subscribe(Peer::Any, 101)?;
//! dvm[0].broadcast(101, "to everyone")?;
//! assert_eq!(&news.recv_timeout(Duration::from_secs(30))?.payload[..], b"to everyone");
//!
//! dvm[0].shutdown_dvm(); // rank 0 stops them all
//! for d in &dvm {
//!     assert!(d.wait_stopped(Duration::from_secs(30)).is_some_and(|r| r.is_orderly()));
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Features (none on by default): `serde` derives `Serialize` for counters, status reports
//! and the settings' enums; `sim` builds the deterministic fault simulator (`tbon::sim`).
#![forbid(unsafe_code)]
#![warn(missing_docs)]
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

pub mod clients;
pub mod config;
pub mod counters;
pub mod error;
pub mod limits;
pub mod rml;
pub mod routed;
#[cfg(any(test, feature = "sim"))]
pub mod sim;
pub mod status;
pub mod stream;

// The protocol core and the driver's internals: public so that the `tbon` command, the C API,
// the fuzz targets and the benchmarks can reach them, but not the library's API (hidden from
// the docs; they change without notice). What a user needs from them is re-exported below.
mod buffer_pool;
#[doc(hidden)]
pub mod direct;
#[doc(hidden)]
pub mod driver;
#[doc(hidden)]
pub mod faults;
mod fxhash;
#[doc(hidden)]
pub mod grpcomm;
#[doc(hidden)]
pub mod invariant;
#[doc(hidden)]
pub mod modex;
#[doc(hidden)]
pub mod node;
#[doc(hidden)]
pub mod oob;
#[doc(hidden)]
pub mod relm;

/// The payload type of every message and chunk (re-exported from the `bytes` crate, so a user
/// need not depend on it): `Bytes::from(vec)`, `Bytes::from_static(b"..")`,
/// `Bytes::copy_from_slice(&buf)`; any `Into<Bytes>` (a `Vec<u8>`, a `String`, a `&'static str`)
/// is accepted where a payload is taken.
pub use bytes::Bytes;
pub use clients::{
    Client, ClientCredential, ClientError, ClientMessage, ClientName, ClientReceiveId, ExitReason,
    JobId,
};
pub use counters::{Counters, DirectCounters, StreamCounters};
pub use direct::{Route, RouteSetting};
pub use driver::key::{Key, KeyError};
pub use driver::launch;
pub use driver::{
    Batch, Daemon, FAIL_ABANDONED, FAIL_RESERVED_MIN, FetchOptions, Group, Handle, Outgoing,
    ServiceHandler, StopReason, Stream, StreamItem, StreamReader, StreamRequest, StreamWriter,
    Subscription, start,
};
pub use error::{LeaveError, Limit, RecvError, RegisterError, SendError, StartError};
pub use grpcomm::{AllgatherResult, GroupError};
pub use modex::GetError;
pub use node::FenceMode;
pub use node::contacts::ContactsSetting;
pub use node::{FAIL_NO_ROOM, FAIL_NO_SERVICE};
pub use rml::{Message, MessageRef, Peer, RecvMode, Tag};
pub use routed::{RecoveryStatus, Scope};
pub use stream::StreamError;

/// A daemon's rank in the DVM: 0 is the root (the HNP), ranks run `0..size`.
pub type Rank = u32;
