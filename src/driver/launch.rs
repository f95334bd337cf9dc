//! Forming a DVM from the library: where a daemon's rank and size come from ([`Placement`]:
//! given, or a launcher's environment), how it finds rank 0 ([`Rendezvous`]: a URI, a URI file
//! on a filesystem every daemon sees, or rank 0's host at a fixed port when there is no shared
//! filesystem), [`launch`], which starts a daemon that way, and [`local_dvm`], a whole DVM
//! inside one process for an embedder's own tests.
//!
//! Environment variables read here, and only when the caller asks (`from_env`): `TBON_RANK`,
//! `SLURM_PROCID`, `OMPI_COMM_WORLD_RANK`, `PMIX_RANK` (the rank, first one set wins);
//! `TBON_SIZE`, `SLURM_NTASKS`, `OMPI_COMM_WORLD_SIZE` (the size); `TBON_HNP`, `TBON_HNP_FILE`,
//! `TBON_HNP_HOST` (the rendezvous, in that order). [`launch`] itself reads none.

use super::uri_file::{self, UriFile};
use super::{Daemon, start};
use crate::Rank;
use crate::config::Config;
use crate::error::StartError;
use crate::oob::uri::ContactUri;
use std::net::ToSocketAddrs;
use std::path::PathBuf;
use std::time::Duration;

/// The variables a rank is read from, first set wins (tbon's own, Slurm's, Open MPI's, PMIx's).
pub const RANK_VARS: [&str; 4] = [
    "TBON_RANK",
    "SLURM_PROCID",
    "OMPI_COMM_WORLD_RANK",
    "PMIX_RANK",
];
/// The variables a size is read from, first set wins.
pub const SIZE_VARS: [&str; 3] = ["TBON_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"];

/// A daemon's place in its DVM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Its rank, below `size`.
    pub rank: Rank,
    /// The number of daemons in the DVM.
    pub size: u32,
}

impl Placement {
    /// The rank and size a launcher put in the environment ([`RANK_VARS`], [`SIZE_VARS`]).
    /// Errors ([`StartError::Placement`]) name the variables when none is set or one is not a
    /// number.
    pub fn from_env() -> Result<Placement, StartError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// As [`Placement::from_env`], reading variables through `lookup` (for tests, or an
    /// embedder that keeps its own environment).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Placement, StartError> {
        let read = |names: &[&str], what: &str| -> Result<u32, StartError> {
            for n in names {
                if let Some(v) = lookup(n).filter(|v| !v.trim().is_empty()) {
                    return v
                        .trim()
                        .parse()
                        .map_err(|_| StartError::Placement(format!("{n}={v:?} is not a {what}")));
                }
            }
            Err(StartError::Placement(format!(
                "no {what}: none of {} is set (run under a launcher, or give it)",
                names.join(", ")
            )))
        };
        let rank = read(&RANK_VARS, "rank")?;
        let size = read(&SIZE_VARS, "size")?;
        if rank >= size {
            return Err(StartError::Placement(format!(
                "rank {rank} is not below the size {size}"
            )));
        }
        Ok(Placement { rank, size })
    }
}

/// How the daemons find rank 0: rank 0 publishes its contact, every other rank looks it up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rendezvous {
    /// Rank 0's contact URI, given (what [`crate::Handle::contact_uri`] says on rank 0, moved
    /// by the launcher). Rank 0 ignores it.
    Uri(String),
    /// A file every daemon can read: rank 0 writes its URI there (atomically; the directory
    /// must not be writable by every user unless sticky) and removes it when its [`Daemon`]
    /// is dropped, unless another rank 0 replaced it; every other rank waits for the file up
    /// to the wire-up timeout. A file left by an earlier run names a rank 0 that is gone: such
    /// a daemon stops with [`crate::StopReason::RootLost`]; remove stale files before a launch
    /// (`tbon daemon --hnp-file` waits for a replacement and starts again by itself).
    File(PathBuf),
    /// No shared filesystem: rank 0 listens on `port` (its `port` and `port_range` settings
    /// are replaced), and every other rank dials `host:port` (a name is resolved; every
    /// address it resolves to is tried) and listens where its own settings say.
    Host {
        /// Rank 0's host name or address.
        host: String,
        /// Rank 0's port (not 0).
        port: u16,
    },
}

impl Rendezvous {
    /// The rendezvous the environment names: `TBON_HNP` (a URI), else `TBON_HNP_FILE` (a
    /// path), else `TBON_HNP_HOST` (`NAME:PORT`); `None` if none is set, an error if
    /// `TBON_HNP_HOST` is not `NAME:PORT`.
    pub fn from_env() -> Result<Option<Rendezvous>, StartError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// As [`Rendezvous::from_env`], reading variables through `lookup`.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Rendezvous>, StartError> {
        let get = |n: &str| lookup(n).filter(|v| !v.trim().is_empty());
        if let Some(u) = get("TBON_HNP") {
            return Ok(Some(Rendezvous::Uri(u)));
        }
        if let Some(p) = get("TBON_HNP_FILE") {
            return Ok(Some(Rendezvous::File(p.into())));
        }
        get("TBON_HNP_HOST").map(|h| host_port(&h)).transpose()
    }
}

impl std::str::FromStr for Rendezvous {
    type Err = StartError;

    /// `uri:URI`, `file:PATH` or `host:NAME:PORT` (the C API's form; an IPv6 address in
    /// brackets: `host:[::1]:7000`).
    fn from_str(s: &str) -> Result<Rendezvous, StartError> {
        let bad = || {
            StartError::Hnp(format!(
                "{s:?}: a rendezvous is uri:URI, file:PATH or host:NAME:PORT"
            ))
        };
        let (kind, rest) = s.split_once(':').ok_or_else(bad)?;
        if rest.trim().is_empty() {
            return Err(bad());
        }
        match kind {
            "uri" => Ok(Rendezvous::Uri(rest.to_string())),
            "file" => Ok(Rendezvous::File(rest.into())),
            "host" => host_port(rest),
            _ => Err(bad()),
        }
    }
}

/// `NAME:PORT` as a host rendezvous.
fn host_port(s: &str) -> Result<Rendezvous, StartError> {
    let bad = |why: &str| {
        StartError::Hnp(format!(
            "{s:?}: rank 0's host is NAME:PORT (an IPv6 address in brackets): {why}"
        ))
    };
    let (host, port) = s.trim().rsplit_once(':').ok_or_else(|| bad("no port"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| bad("the port is not a number from 1 to 65535"))?;
    let host = match host.strip_prefix('[') {
        Some(h) => h
            .strip_suffix(']')
            .ok_or_else(|| bad("an unclosed bracket"))?,
        None if host.contains(':') => return Err(bad("an IPv6 address needs brackets")),
        None => host,
    };
    if host.is_empty() {
        return Err(bad("no host"));
    }
    if port == 0 {
        return Err(bad("the port is 0"));
    }
    Ok(Rendezvous::Host {
        host: host.to_string(),
        port,
    })
}

/// Starts the daemon at `at` of a DVM, finding rank 0 through `how`. Returns once the
/// listener is bound (rank 0: and its URI published); wire-up goes on in the background
/// ([`crate::Handle::wait_wired`]).
///
/// How long the others wait for rank 0: with a file, until the file appears (up to the
/// wire-up timeout), then as with a URI; with a host, until rank 0's port accepts connections
/// (up to the wire-up timeout: rank 0 may start after them); with a URI, rank 0 must be
/// listening already, since the first connection to it is retried only as `reconnect_*`
/// allows (about 1.5 s with the defaults) before the daemon stops with
/// [`crate::StopReason::RootLost`]. Unlike `tbon daemon --hnp-file`, `launch` does not watch
/// a stale file for a replacement.
///
/// Errors: [`StartError::Placement`] (a rank not below the size, checked before any waiting),
/// [`StartError::Hnp`] (no file in time, an unreadable or malformed one, or one owned by
/// another user; a host that does not resolve, or whose port did not accept connections in
/// time; a `Host` rendezvous with port 0), [`StartError::Io`] (rank 0 cannot write the file,
/// or listen on the rendezvous port), and every error of [`crate::start`].
pub fn launch(mut config: Config, at: Placement, how: &Rendezvous) -> Result<Daemon, StartError> {
    if let Rendezvous::Host { port: 0, .. } = how {
        return Err(StartError::Hnp(
            "a host rendezvous needs rank 0's port (not 0)".into(),
        ));
    }
    if at.size == 0 || at.rank >= at.size {
        return Err(StartError::Placement(format!(
            "rank {} is not below the size {}",
            at.rank, at.size
        )));
    }
    if at.rank == 0 {
        if let Rendezvous::Host { port, .. } = how {
            config.port = *port;
            config.port_range = None;
        }
        let port = config.port;
        let mut daemon = start(config, 0, at.size, None).map_err(|e| match (e, how) {
            (StartError::Io(e), Rendezvous::Host { .. }) => StartError::Io(std::io::Error::new(
                e.kind(),
                format!("rank 0 cannot listen on the rendezvous port {port}: {e}"),
            )),
            (e, _) => e,
        })?;
        if let Rendezvous::File(path) = how {
            let text = uri_file::uri_file_text(daemon.contact_uri());
            uri_file::write_atomically(path, &text).map_err(|e| {
                let hint = if e.kind() == std::io::ErrorKind::PermissionDenied {
                    " (in a sticky directory such as /tmp a file another user created cannot \
                     be replaced: keep URI files in a directory only the job's user can write)"
                } else {
                    ""
                };
                StartError::Io(std::io::Error::new(
                    e.kind(),
                    format!("cannot write the URI file {}: {e}{hint}", path.display()),
                ))
            })?;
            daemon.published = Some(UriFile {
                path: path.clone(),
                text,
            });
        }
        return Ok(daemon);
    }
    let uri = match how {
        Rendezvous::Uri(u) => u.clone(),
        Rendezvous::File(path) => {
            let timeout = Duration::from_millis(config.wireup_timeout_ms);
            let text = uri_file::read(path, timeout).map_err(StartError::Hnp)?;
            uri_file::uri_of(&text)
                .map(str::to_string)
                .ok_or_else(|| StartError::Hnp(format!("{} holds no URI", path.display())))?
        }
        Rendezvous::Host { host, port } => {
            let addrs: Vec<_> = (host.as_str(), *port)
                .to_socket_addrs()
                .map_err(|e| StartError::Hnp(format!("{host}: {e}")))?
                .collect();
            if addrs.is_empty() {
                return Err(StartError::Hnp(format!("{host} resolves to no address")));
            }
            wait_listening(&addrs, Duration::from_millis(config.wireup_timeout_ms))?;
            ContactUri {
                dvm_id: config.dvm_id.clone(),
                rank: 0,
                addrs,
            }
            .to_string()
        }
    };
    start(config, at.rank, at.size, Some(&uri))
}

/// Waits until one of `addrs` accepts a TCP connection (closed at once, before any byte: rank
/// 0 sees a connection that ends before its handshake), up to `timeout`: with a host
/// rendezvous rank 0 may start after the others.
fn wait_listening(addrs: &[std::net::SocketAddr], timeout: Duration) -> Result<(), StartError> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        for a in addrs {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let attempt = left
                .min(Duration::from_secs(1))
                .max(Duration::from_millis(1));
            if std::net::TcpStream::connect_timeout(a, attempt).is_ok() {
                return Ok(());
            }
        }
        if std::time::Instant::now() >= deadline {
            return Err(StartError::Hnp(format!(
                "rank 0 did not listen at {addrs:?} within {} ms (the wire-up timeout, \
                 `wireup_timeout_ms`)",
                timeout.as_millis()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A whole DVM of `size` daemons in this process, for an embedder's tests: rank 0 first, then
/// the others given its URI, each with `config` (give it a job key, or `insecure`, and an
/// interface that exists, such as `if_include = 127.0.0.1/32`). Waits up to the wire-up
/// timeout for every daemon to be wired. The daemons are in rank order; dropping rank 0's
/// stops it alone, [`crate::Handle::shutdown_dvm`] on rank 0 stops them all. With
/// `client_socket` set, rank r listens for clients at that path followed by `.r` (the
/// daemons share a host; `Handle::client_socket` says which).
/// Errors: every error of [`crate::start`], [`StartError::Placement`] for a size of 0, and
/// [`StartError::NotWired`] for a DVM that did not wire up in time (its daemons are stopped
/// as they are dropped).
pub fn local_dvm(config: Config, size: u32) -> Result<Vec<Daemon>, StartError> {
    if size == 0 {
        return Err(StartError::Placement("a DVM of 0 daemons".into()));
    }
    let timeout = Duration::from_millis(config.wireup_timeout_ms);
    let of_rank = |rank: u32| {
        let mut c = config.clone();
        c.client_socket = c.client_socket.map(|p| format!("{p}.{rank}"));
        c
    };
    let root = start(of_rank(0), 0, size, None)?;
    let uri = root.contact_uri().to_string();
    let mut all = Vec::with_capacity(size as usize);
    all.push(root);
    for rank in 1..size {
        all.push(start(of_rank(rank), rank, size, Some(&uri))?);
    }
    let deadline = std::time::Instant::now() + timeout;
    for d in &all {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if !d.wait_wired(left) {
            return Err(StartError::NotWired {
                rank: d.rank(),
                waited_ms: config.wireup_timeout_ms,
            });
        }
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(kv: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |n| kv.iter().find(|(k, _)| *k == n).map(|(_, v)| v.to_string())
    }

    #[test]
    fn placement_from_launcher_variables() {
        let p = Placement::from_lookup(vars(&[("SLURM_PROCID", "3"), ("SLURM_NTASKS", "8")]));
        assert_eq!(p.unwrap(), Placement { rank: 3, size: 8 });
        // tbon's own variables come first.
        let p = Placement::from_lookup(vars(&[
            ("TBON_RANK", "1"),
            ("SLURM_PROCID", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
        ]));
        assert_eq!(p.unwrap(), Placement { rank: 1, size: 4 });
        let e = Placement::from_lookup(vars(&[("PMIX_RANK", "x")])).unwrap_err();
        assert!(e.to_string().contains("PMIX_RANK"), "{e}");
        let e = Placement::from_lookup(vars(&[("TBON_RANK", "0")])).unwrap_err();
        assert!(e.to_string().contains("TBON_SIZE"), "{e}");
        let e = Placement::from_lookup(vars(&[("TBON_RANK", "4"), ("TBON_SIZE", "4")]));
        assert!(e.is_err());
    }

    #[test]
    fn rendezvous_from_variables_and_strings() {
        let r = Rendezvous::from_lookup(vars(&[("TBON_HNP_FILE", "/x"), ("TBON_HNP_HOST", "h")]));
        assert_eq!(r.unwrap(), Some(Rendezvous::File("/x".into())));
        assert_eq!(
            Rendezvous::from_lookup(vars(&[("TBON_HNP", " ")])).unwrap(),
            None
        );
        let h = Rendezvous::from_lookup(vars(&[("TBON_HNP_HOST", "node1:7000")]));
        let node1 = Rendezvous::Host {
            host: "node1".into(),
            port: 7000,
        };
        assert_eq!(h.unwrap(), Some(node1.clone()));
        assert!(Rendezvous::from_lookup(vars(&[("TBON_HNP_HOST", "node1")])).is_err());
        assert_eq!("host:node1:7000".parse::<Rendezvous>().unwrap(), node1);
        assert_eq!(
            "host:[::1]:7000".parse::<Rendezvous>().unwrap(),
            Rendezvous::Host {
                host: "::1".into(),
                port: 7000
            }
        );
        assert!("host:node1:0".parse::<Rendezvous>().is_err());
        let e = "host:::1:7000".parse::<Rendezvous>().unwrap_err();
        assert!(e.to_string().contains("brackets"), "{e}");
        let e = "host:node1:70000".parse::<Rendezvous>().unwrap_err();
        assert!(e.to_string().contains("1 to 65535"), "{e}");
        assert_eq!(
            "uri:tbon.0;tcp://127.0.0.1:5"
                .parse::<Rendezvous>()
                .unwrap(),
            Rendezvous::Uri("tbon.0;tcp://127.0.0.1:5".into())
        );
        assert!("nfs:/x".parse::<Rendezvous>().is_err());
        assert!("file:".parse::<Rendezvous>().is_err());
    }
}
