//! The driver: the only code that touches sockets, the clock and threads. It runs one
//! `mio::Poll` loop per daemon (`event_loop`) that drives the sans-IO cores (`routed`, `oob`,
//! `rml`), and gives other threads a [`Handle`].
//!
//! Start a daemon with [`start`]: rank 0 first (it needs no contact), then every other rank with
//! rank 0's contact URI ([`Handle::contact_uri`] on rank 0). Several daemons may run in one
//! process, each on its own loop thread.

mod batch;
mod caddy;
pub(crate) mod client;
mod client_jobs;
mod command_queue;
mod conn;
mod event_loop;
mod gate;
mod group;
mod handle;
pub mod key;
pub mod launch;
mod linger;
mod listen;
mod log_limit;
mod modex;
mod nonce;
mod nosignal;
mod pending;
mod quiet;
mod relm_window;
mod serve;
mod stream_reader;
mod stream_writer;
mod subscription;
mod timers;
pub mod tool;
pub mod uri_file;

pub use batch::{Batch, Outgoing};
pub use caddy::{AllgatherCompletion, Completion, RecvCallback};
pub use group::Group;
pub use handle::{Daemon, Handle, StopReason};
pub use serve::{FetchOptions, ServiceHandler, StreamRequest};
pub use stream_reader::{Stream, StreamItem, StreamReader};
pub use stream_writer::{FAIL_ABANDONED, FAIL_RESERVED_MIN, StreamWriter};
pub use subscription::Subscription;

use crate::Rank;
use crate::config::Config;
use crate::error::StartError;
use crate::limits;
use crate::node::{Node, NodeConfig};
use crate::oob::handshake::HandshakeConfig;
use crate::oob::uri::ContactUri;
use handle::{Lifecycle, Shared};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// Starts daemon `rank` of a DVM of `size` daemons and returns once its listener is bound.
/// `hnp` is rank 0's contact URI, required for every rank but 0 (ignored there). Wire-up then
/// proceeds in the background: see [`Handle::wait_wired`].
///
/// Reads no environment variable (see [`crate::config::Config::from_env`]).
///
/// # Errors
/// [`StartError::Config`] (an invalid setting, or interface settings that leave no
/// address), [`StartError::Key`] (an unreadable or badly sized key file),
/// [`StartError::NoKey`] (no key and not `insecure`), [`StartError::Tree`] (rank, size or
/// radix), [`StartError::Hnp`] (a missing or malformed `hnp`), [`StartError::Io`] (no port to
/// listen on).
pub fn start(
    config: Config,
    rank: Rank,
    size: u32,
    hnp: Option<&str>,
) -> Result<Daemon, StartError> {
    config.validate()?;
    // Checked before anything is bound or written: a launcher's URI file stays as it was.
    if rank >= size {
        // Before the contact URI, whose absence it would be taken for (outside-in review).
        return Err(StartError::Tree(crate::routed::TreeError::RankOutOfRange {
            rank,
            size,
        }));
    }
    if config.initial_size > size {
        return Err(crate::config::ConfigError::invalid(
            "initial_size",
            format!("{} is above the size {size}", config.initial_size),
        )
        .into());
    }
    if config.rejoin && rank == 0 {
        return Err(crate::config::ConfigError::invalid(
            "rejoin",
            "rank 0 cannot rejoin: a DVM ends with its rank 0 (start a new DVM)",
        )
        .into());
    }
    let hnp = if rank == 0 {
        None
    } else {
        let s = hnp.ok_or_else(|| StartError::Hnp("rank 0's contact URI is required".into()))?;
        let uri: ContactUri = s
            .trim()
            .parse()
            .map_err(|e| StartError::Hnp(format!("{s:?}: {e}")))?;
        if uri.rank != 0 {
            return Err(StartError::Hnp(format!("{s:?} is not rank 0's URI")));
        }
        if uri.dvm_id != config.dvm_id {
            return Err(StartError::Hnp(format!(
                "{s:?} belongs to DVM {:?}, not {:?}",
                uri.dvm_id, config.dvm_id
            )));
        }
        Some(uri)
    };
    let key = key::load(&config, rank)?;
    let listen::Bound {
        listeners,
        addrs,
        networks,
    } = listen::bind(&config)?;
    let client_listener = match config.client_socket.as_deref() {
        Some(p) => Some(event_loop::clients::bind(p)?),
        None => None,
    };
    let uri = ContactUri {
        dvm_id: config.dvm_id.clone(),
        rank,
        addrs,
    };
    let poll = mio::Poll::new()?;
    let waker = mio::Waker::new(poll.registry(), event_loop::WAKER_TOKEN)?;
    let (commands, taker) = command_queue::CommandQueue::new(limits::COMMAND_QUEUE_MAX);
    let shared = Arc::new(Shared {
        commands,
        waker,
        asleep: AtomicBool::new(false),
        wakeups: AtomicU64::new(0),
        rank,
        size,
        msg_max_bytes: config.msg_max_bytes as usize,
        uri: uri.to_string(),
        posted: Mutex::new(HashMap::new()),
        next_post: AtomicU64::new(0),
        next_stream: AtomicU64::new(1),
        lifecycle: Mutex::new(Lifecycle::default()),
        lifecycle_cv: Condvar::new(),
        stopped: AtomicBool::new(false),
        stop_request: std::sync::atomic::AtomicU8::new(0),
        join: Mutex::new(None),
        handlers: Mutex::new(Vec::new()),
        gate: gate::OriginGate::new(
            size,
            limits::COMMAND_QUEUE_MAX_BYTES.min(config.send_queue_max_bytes / 4),
        ),
        relm_window: relm_window::ReliableWindow::new(config.relm_unacked_max),
        batch_pool: Arc::new(crate::buffer_pool::BufferPool::new(
            limits::BATCH_POOL_BUFFERS_MAX,
            limits::BATCH_POOL_BYTES_MAX,
        )),
        wired: AtomicBool::new(false),
        prewire_taken: AtomicUsize::new(0),
        prewire_max: config.prewire_queue_max,
        group_inflight: AtomicUsize::new(0),
        modex_staged: Mutex::new(std::collections::HashMap::new()),
        client_socket: config.client_socket.as_ref().map(std::path::PathBuf::from),
    });
    let incarnation = incarnation();
    let node = Node::new(NodeConfig {
        incarnation,
        uri: Some(uri.clone()),
        hnp,
        ..NodeConfig::from_config(&config, rank, size)
    })
    .map_err(StartError::Tree)?;
    let hs_cfg = HandshakeConfig {
        me: rank,
        size,
        epoch: incarnation,
        dvm_id: config.dvm_id.clone(),
        key,
    };
    let ev = event_loop::EventLoop::new(
        poll,
        shared.clone(),
        taker,
        config,
        node,
        listeners,
        networks,
        hs_cfg,
        client_listener,
    );
    let on_thread = shared.clone();
    let thread = std::thread::Builder::new()
        .name(format!("tbon-{rank}"))
        .spawn(move || {
            // Set before the loop runs any callback, so calls from callbacks never block on
            // the loop itself.
            on_thread.mark_loop_thread();
            let shared = std::sync::Arc::downgrade(&on_thread);
            drop(on_thread);
            // A panic (a receive callback's, say) unwinds the loop: its sockets close and its
            // peers see a crash. Its own handles must see a stop too, with the cause: they
            // reported none, and a supervisor waiting for one waited for ever (from an
            // outside-in review).
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ev.run()));
            if let (Err(panic), Some(shared)) = (ran, shared.upgrade()) {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".to_string());
                log::error!("rank {rank}: the loop thread panicked ({what}); the daemon stopped");
                shared.set_stopped(StopReason::Fatal(format!(
                    "the loop thread panicked (a callback?): {what}"
                )));
            }
        })?;
    *handle::lock(&shared.join) = Some(thread);
    log::debug!("rank {rank}: started, contact {}", shared.uri);
    Ok(Daemon::new(Handle { shared }))
}

/// This start's incarnation (boot epoch): milliseconds since the Unix epoch, so a daemon
/// restarted with the same rank has a larger one (the node drops frames from an older one).
/// At least 1: 0 is what a clock before 1970 would give.
fn incarnation() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .max(1)
}
