//! Client processes routed through their daemon (issue "Jobs", part 3), sans-IO.
//!
//! An application process does not join the tree. It opens one Unix-domain socket to the
//! daemon of its node (the `client_socket` setting), proves it belongs to a job, and gets a
//! name: ([`ClientName`]) its daemon's rank and a local id that daemon never reuses. It then
//! sends tagged messages to any other client by name; the daemons carry them. This is ORTE's
//! answer to the connection storm: N processes per node cost N local sockets, not N times the
//! job's size in TCP connections.
//!
//! # Admission
//! The embedder opens a job on a daemon (`Handle::client_job`) and gets a [`ClientCredential`]:
//! the socket's path, the job's number and a random 32-byte key, which it hands to the
//! processes it starts (environment variables [`ENV_SOCKET`], [`ENV_JOB`], [`ENV_KEY`]). A
//! connecting process sends the job and key in its first frame; the daemon reads the peer's
//! uid with `SO_PEERCRED` and admits it only if the uid is one the embedder allows (the
//! `client_uids` setting; empty: the daemon's own uid) and the key is the job's (compared in
//! constant time). Everything else is refused with a log line and the connection closed. The
//! key travels in the clear over the local socket: only the kernel sees it.
//!
//! # Messages
//! Between daemons every client message travels by RELM (runtime tag 20): exactly once and
//! in order per pair of clients, through repairs. The destination daemon answers every
//! message with a result (batched per origin daemon, runtime tag 21), so a send completes
//! only when the message is queued for the receiving client, or with the reason it never
//! will be ([`ClientError`]).
//!
//! # Jobs
//! A client belongs to the job it connected under. A message between clients of different
//! jobs is refused [`ClientError::NotPermitted`] by the destination daemon, unless the
//! receiver's job was opened with the sender's job in its `accept_from` list (on the
//! receiver's daemon: each daemon holds the jobs of its own clients).
//!
//! # Bounds
//! A client has at most [`crate::limits::CLIENT_SENDS_INFLIGHT_MAX`] sends unanswered; beyond
//! it the daemon stops reading its socket (the client's own library stops earlier). Bytes
//! queued for a client that does not read are bounded by
//! [`crate::limits::CLIENT_QUEUE_BYTES_MAX`]; beyond it the destination daemon refuses the
//! RELM message and its origin replays it later (so order is kept); this holds back client
//! messages from that origin daemon to this one until the slow client reads.
//!
//! # Exits
//! A client whose socket closes (it exited or crashed) is removed from its daemon with
//! everything it had there. Any client may watch another by name ([`ExitReason`]): it is told
//! once when the other exits, when the other's daemon dies, or at once if the name is
//! unknown. A client learns of its own daemon's death when its socket closes.

#[doc(hidden)]
pub mod local;
#[doc(hidden)]
pub mod registry;
#[doc(hidden)]
pub mod wire;

#[cfg(test)]
mod tests;

pub use crate::driver::client::{Client, ClientMessage, ClientReceiveId};
pub use registry::ClientCounters;
// The daemon's core, for the node and the simulator (not the application's API).
#[doc(hidden)]
pub use registry::{ClientEvent, Clients};

use crate::Rank;
use std::fmt;

/// The environment variable naming the daemon's client socket (see [`ClientCredential`]).
pub const ENV_SOCKET: &str = "TBON_CLIENT_SOCKET";
/// The environment variable holding the job's number.
pub const ENV_JOB: &str = "TBON_CLIENT_JOB";
/// The environment variable holding the job's client key (64 hexadecimal digits).
pub const ENV_KEY: &str = "TBON_CLIENT_KEY";

/// A job's number: the embedder's, chosen freely (the same number as the job's `Group`
/// context is natural).
pub type JobId = u64;

/// A client's name in the DVM: its daemon's rank and an id that daemon gave it (never reused
/// while the daemon runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ClientName {
    /// The rank of the client's daemon.
    pub rank: Rank,
    /// The client's id at that daemon (from 1).
    pub local: u32,
}

impl fmt::Display for ClientName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.rank, self.local)
    }
}

impl std::str::FromStr for ClientName {
    type Err = String;
    /// `RANK.LOCAL`, as [`ClientName`]'s `Display` writes it.
    fn from_str(s: &str) -> Result<Self, String> {
        let (r, l) = s
            .split_once('.')
            .ok_or_else(|| format!("{s:?}: a client name is RANK.LOCAL"))?;
        let rank = r.parse().map_err(|e| format!("{s:?}: rank: {e}"))?;
        let local = l.parse().map_err(|e| format!("{s:?}: local id: {e}"))?;
        Ok(ClientName { rank, local })
    }
}

/// What a job's processes need to connect to their daemon: give it to them (as
/// [`ClientCredential::env`] in their environment, say). Keep the key private.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientCredential {
    /// The daemon's client socket.
    pub socket: std::path::PathBuf,
    /// The job.
    pub job: JobId,
    /// The job's client key.
    pub key: [u8; 32],
}

impl fmt::Debug for ClientCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientCredential")
            .field("socket", &self.socket)
            .field("job", &self.job)
            .field("key", &"<hidden>")
            .finish()
    }
}

impl ClientCredential {
    /// The environment variables a client process reads (`Client::from_env`):
    /// [`ENV_SOCKET`], [`ENV_JOB`] and [`ENV_KEY`], as (name, value) pairs.
    pub fn env(&self) -> [(&'static str, String); 3] {
        [
            (ENV_SOCKET, self.socket.display().to_string()),
            (ENV_JOB, self.job.to_string()),
            (ENV_KEY, hex(&self.key)),
        ]
    }

    /// The key as 64 hexadecimal digits (the form [`ENV_KEY`] holds).
    pub fn key_hex(&self) -> String {
        hex(&self.key)
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A client key from 64 hexadecimal digits.
pub fn parse_key(s: &str) -> Result<[u8; 32], String> {
    let s = s.trim();
    if s.len() != 64 || !s.is_ascii() {
        return Err("a client key is 64 hexadecimal digits".into());
    }
    let mut k = [0u8; 32];
    for (i, b) in k.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
            .map_err(|_| "a client key is 64 hexadecimal digits".to_string())?;
    }
    Ok(k)
}

/// Why a client's send, receive or watch did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientError {
    /// No client of that name was ever admitted by its daemon (or the rank is not in the DVM).
    UnknownClient(ClientName),
    /// The receiver belongs to another job that does not accept messages from the sender's.
    NotPermitted(ClientName),
    /// The receiver has exited; the message was not delivered.
    ClientGone(ClientName),
    /// The receiver's daemon died before answering: the message may or may not have reached
    /// the receiver.
    NodeDown(Rank),
    /// The payload is larger than `Client::msg_max_bytes` (the DVM's `msg_max_bytes` less the
    /// 28-byte header a client message carries between daemons). From `Handle::client_job`:
    /// `accept_from` lists more than `limits::CLIENT_ACCEPT_FROM_MAX` jobs (`len` jobs).
    TooLarge {
        /// The payload's length.
        len: usize,
        /// The largest allowed.
        max: usize,
    },
    /// The tag is reserved (tags below [`crate::rml::TAG_USER_MIN`] are the runtime's).
    ReservedTag(u32),
    /// A bound was reached: [`crate::limits::CLIENT_SENDS_INFLIGHT_MAX`] sends unanswered, or
    /// the client's unmatched messages, watches or receives. Try again later.
    Busy,
    /// A blocking call gave up; nothing was withdrawn (a send may still complete).
    TimedOut,
    /// The receive was cancelled.
    Cancelled,
    /// This client's daemon is gone (it died or stopped), or the client was closed: nothing
    /// more can be sent or received.
    DaemonLost,
    /// The daemon refused the connection (the reason it gave: wrong key, unknown job,
    /// uid not allowed, too many clients).
    Refused(String),
    /// Connecting failed, or the daemon broke the protocol.
    Io(String),
    /// The daemon has no client socket (its `client_socket` setting is unset).
    NoSocket,
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::UnknownClient(n) => write!(f, "no client {n}"),
            ClientError::NotPermitted(n) => {
                write!(
                    f,
                    "client {n} belongs to a job that does not accept this one"
                )
            }
            ClientError::ClientGone(n) => write!(f, "client {n} has exited"),
            ClientError::NodeDown(r) => write!(f, "daemon {r} died"),
            ClientError::TooLarge { len, max } => {
                write!(
                    f,
                    "{len} is above the limit of {max} (a payload's bytes: msg_max_bytes; \
                           a job's accept_from: CLIENT_ACCEPT_FROM_MAX)"
                )
            }
            ClientError::ReservedTag(t) => write!(f, "tag {t} is reserved for the runtime"),
            ClientError::Busy => write!(f, "busy: a client bound is reached; try again later"),
            ClientError::TimedOut => write!(f, "timed out"),
            ClientError::Cancelled => write!(f, "cancelled"),
            ClientError::DaemonLost => write!(f, "the client's daemon is gone"),
            ClientError::Refused(why) => write!(f, "the daemon refused the client: {why}"),
            ClientError::Io(why) => write!(f, "client connection: {why}"),
            ClientError::NoSocket => write!(f, "the daemon has no client_socket"),
        }
    }
}

impl std::error::Error for ClientError {}

/// Why a watched client is reported gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub enum ExitReason {
    /// Its connection to its daemon closed (it exited, crashed or closed the client).
    Exited,
    /// Its daemon died (or stopped).
    DaemonDied,
    /// No client of that name was ever admitted (or the rank is not in the DVM).
    Unknown,
}

impl ExitReason {
    pub(crate) fn code(self) -> u8 {
        match self {
            ExitReason::Exited => 1,
            ExitReason::DaemonDied => 2,
            ExitReason::Unknown => 3,
        }
    }
    pub(crate) fn from_code(c: u8) -> Option<ExitReason> {
        Some(match c {
            1 => ExitReason::Exited,
            2 => ExitReason::DaemonDied,
            3 => ExitReason::Unknown,
            _ => return None,
        })
    }
}

/// A send's result as one byte on the wire (local and between daemons).
pub(crate) fn result_code(r: &Result<(), ClientError>) -> u8 {
    match r {
        Ok(()) => 0,
        Err(ClientError::UnknownClient(_)) => 1,
        Err(ClientError::NotPermitted(_)) => 2,
        Err(ClientError::ClientGone(_)) => 3,
        Err(ClientError::NodeDown(_)) => 4,
        Err(ClientError::DaemonLost) => 5,
        Err(ClientError::TooLarge { .. }) => 6,
        Err(ClientError::ReservedTag(_)) => 7,
        Err(_) => 8,
    }
}

/// The result `code` means for a send to `to` (`None`: not a code).
pub(crate) fn result_from_code(
    code: u8,
    to: ClientName,
    len: usize,
    max: usize,
    tag: u32,
) -> Option<Result<(), ClientError>> {
    Some(match code {
        0 => Ok(()),
        1 => Err(ClientError::UnknownClient(to)),
        2 => Err(ClientError::NotPermitted(to)),
        3 => Err(ClientError::ClientGone(to)),
        4 => Err(ClientError::NodeDown(to.rank)),
        5 => Err(ClientError::DaemonLost),
        6 => Err(ClientError::TooLarge { len, max }),
        7 => Err(ClientError::ReservedTag(tag)),
        8 => Err(ClientError::Busy),
        _ => return None,
    })
}
