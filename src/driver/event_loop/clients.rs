//! The daemon's client connections (issue "Jobs"; the rules are the node's, `node/clients.rs`
//! and `src/clients/`): the Unix-domain listener, admission with the peer's uid from
//! `SO_PEERCRED`, reading frames while the node allows, writing the node's client events,
//! and closing a client whose socket ends or who breaks the protocol.
use super::{EventLoop, Refusal};
use crate::clients::local::{LOCAL_OVERHEAD_MAX, LocalDecoder, ToClient, ToDaemon};
use crate::clients::{ClientEvent, result_code};
use crate::fxhash::{FxHashMap, FxHashSet};
use crate::limits;
use bytes::{Buf, Bytes};
use mio::net::{UnixListener, UnixStream};
use mio::{Interest, Token};
use slab::Slab;
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The client listener's token; client connection `i` is `CLIENT_TOKEN_BASE + 1 + i`.
pub(crate) const CLIENT_TOKEN_BASE: usize = usize::MAX / 2;

/// Binds the client socket of `path`: a stale socket file there (nobody accepts on it) is
/// removed first; a socket another process listens on, or any other file, is an error. The
/// socket is made connectable by everyone (admission is by uid and key).
pub(crate) fn bind(path: &str) -> io::Result<(UnixListener, PathBuf)> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let p = PathBuf::from(path);
    if let Ok(meta) = std::fs::symlink_metadata(&p) {
        if meta.file_type().is_socket() {
            if std::os::unix::net::UnixStream::connect(&p).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("client_socket {path:?} is in use by a running process"),
                ));
            }
            std::fs::remove_file(&p)?;
        } else {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("client_socket {path:?} exists and is not a socket"),
            ));
        }
    }
    let l = UnixListener::bind(&p)?;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777))?;
    Ok((l, p))
}

/// The file's identity (device, inode), to remove at the end only a socket file that is
/// still this daemon's.
fn identity(p: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

pub(super) struct ClientConn {
    stream: UnixStream,
    uid: u32,
    local: Option<u32>,
    accepted: Instant,
    decoder: LocalDecoder,
    out: VecDeque<Bytes>,
    out_bytes: usize,
    /// Refused or told `Bye`: closed once its frames are written.
    closing: bool,
}

#[derive(Default)]
pub(super) struct ClientConns {
    listener: Option<(UnixListener, PathBuf)>,
    /// The socket file's identity when bound (`identity`).
    identity: Option<(u64, u64)>,
    conns: Slab<ClientConn>,
    by_local: FxHashMap<u32, usize>,
    /// Connections not yet admitted, oldest first.
    pending: VecDeque<usize>,
    /// Admitted clients left unread until the node allows (checked every turn).
    paused: FxHashSet<usize>,
    /// Connections to read again next turn (read bound reached).
    again: FxHashSet<usize>,
    dirty: FxHashSet<usize>,
}

impl ClientConns {
    pub(super) fn new(listener: Option<(UnixListener, PathBuf)>) -> ClientConns {
        let identity = listener.as_ref().and_then(|(_, p)| identity(p));
        ClientConns {
            listener,
            identity,
            ..Default::default()
        }
    }

    pub(super) fn has_work(&self) -> bool {
        !self.again.is_empty() || !self.dirty.is_empty()
    }
}

fn token_of(i: usize) -> Token {
    Token(CLIENT_TOKEN_BASE + 1 + i)
}

impl EventLoop {
    pub(super) fn register_client_listener(&mut self) -> io::Result<()> {
        if let Some((l, _)) = self.clients.listener.as_mut() {
            self.poll
                .registry()
                .register(l, Token(CLIENT_TOKEN_BASE), Interest::READABLE)?;
        }
        Ok(())
    }

    /// A readiness event for a client token.
    pub(super) fn on_client_token(&mut self, t: usize, writable: bool) {
        if t == CLIENT_TOKEN_BASE {
            self.accept_clients();
            return;
        }
        let i = t - CLIENT_TOKEN_BASE - 1;
        if writable {
            self.flush_client(i);
        }
        self.read_client(i);
    }

    fn accept_clients(&mut self) {
        for _ in 0..limits::ACCEPTS_PER_EVENT_MAX {
            let Some((l, _)) = self.clients.listener.as_ref() else {
                return;
            };
            let mut stream = match l.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    log::warn!("rank {}: accepting a client failed: {e}", self.me);
                    return;
                }
            };
            let uid = match nix::sys::socket::getsockopt(
                &stream,
                nix::sys::socket::sockopt::PeerCredentials,
            ) {
                Ok(c) => c.uid(),
                Err(e) => {
                    log::warn!("rank {}: a client's credentials: {e}", self.me);
                    continue;
                }
            };
            // Another user's connection is refused at once: it never holds a place among
            // those awaiting admission (found by an outside-in review: a flood of them from a
            // user who may not be a client evicted real clients' connections).
            let foreign = !self.node.client_uid_allowed(uid);
            if !foreign {
                self.expire_pending_clients();
                if self.clients.pending.len() >= limits::CLIENT_PENDING_MAX
                    && let Some(oldest) = self.clients.pending.pop_front()
                {
                    self.node.handle_client_refused();
                    self.refuse_client(
                        oldest,
                        "the oldest of the client connections awaiting admission, closed to \
                         make room for a newer one (CLIENT_PENDING_MAX)",
                    );
                }
            }
            let entry = self.clients.conns.vacant_entry();
            let i = entry.key();
            if let Err(e) = self.poll.registry().register(
                &mut stream,
                token_of(i),
                Interest::READABLE | Interest::WRITABLE,
            ) {
                log::warn!("rank {}: registering a client: {e}", self.me);
                continue;
            }
            entry.insert(ClientConn {
                stream,
                uid,
                local: None,
                accepted: self.now,
                decoder: LocalDecoder::new(self.cfg.msg_max_bytes as usize + LOCAL_OVERHEAD_MAX),
                out: VecDeque::new(),
                out_bytes: 0,
                closing: false,
            });
            if foreign {
                self.node.handle_client_refused();
                self.refuse_client(i, &format!("uid {uid} is not among client_uids"));
                continue;
            }
            self.clients.pending.push_back(i);
            self.clients.again.insert(i);
        }
        // More may wait: edge-triggered, so look again next turn.
        self.clients.again.insert(usize::MAX);
    }

    /// Closes connections that have not said `Hello` within the handshake timeout.
    pub(super) fn expire_pending_clients(&mut self) {
        let limit = Duration::from_millis(self.cfg.handshake_timeout_ms);
        while let Some(&i) = self.clients.pending.front() {
            let old = self
                .clients
                .conns
                .get(i)
                .is_none_or(|c| self.now.saturating_duration_since(c.accepted) > limit);
            if !old {
                break;
            }
            self.clients.pending.pop_front();
            if self.clients.conns.contains(i) {
                self.node.handle_client_refused();
                self.refuse_client(i, "no Hello within handshake_timeout_ms");
            }
        }
    }

    fn refuse_client(&mut self, i: usize, reason: &str) {
        let uid = self.clients.conns.get(i).map_or(0, |c| c.uid);
        self.log_refusal(Refusal::Client, || {
            format!("refused a client connection (uid {uid}): {reason}")
        });
        self.client_frame(
            i,
            ToClient::Refused {
                reason: reason.to_string(),
            },
        );
        if let Some(c) = self.clients.conns.get_mut(i) {
            c.closing = true;
        }
        self.flush_client(i);
    }

    /// Reads and acts on a client's frames while the node allows; at most
    /// `READS_PER_EVENT_MAX` reads.
    fn read_client(&mut self, i: usize) {
        for _ in 0..limits::READS_PER_EVENT_MAX {
            if !self.client_frames(i) {
                return;
            }
            let Some(c) = self.clients.conns.get_mut(i) else {
                return;
            };
            if c.closing {
                return;
            }
            match c.decoder.read_from(&mut c.stream) {
                Ok(0) => {
                    self.close_client(i, None);
                    return;
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.close_client(i, Some(&format!("read: {e}")));
                    return;
                }
            }
        }
        self.clients.again.insert(i);
    }

    /// Acts on the frames buffered for client `i`; `false` when reading must stop (closed or
    /// paused).
    fn client_frames(&mut self, i: usize) -> bool {
        loop {
            let Some(c) = self.clients.conns.get_mut(i) else {
                return false;
            };
            if c.closing {
                return false;
            }
            if let Some(local) = c.local
                && !self.node.client_may_read(local)
            {
                self.clients.paused.insert(i);
                return false;
            }
            let body = match c.decoder.next_body() {
                Ok(Some(b)) => b,
                Ok(None) => return true,
                Err(e) => {
                    self.close_client(i, Some(&e));
                    return false;
                }
            };
            let (local, uid) = (c.local, c.uid);
            let res = ToDaemon::decode(body).and_then(|f| self.client_frame_in(i, local, uid, f));
            self.carry_out();
            if let Err(e) = res {
                self.close_client(i, Some(&e));
                return false;
            }
        }
    }

    fn client_frame_in(
        &mut self,
        i: usize,
        local: Option<u32>,
        uid: u32,
        f: ToDaemon,
    ) -> Result<(), String> {
        match (local, f) {
            (None, ToDaemon::Hello { version, job, key }) => {
                self.clients.pending.retain(|p| *p != i);
                match self.node.handle_client_hello(version, job, &key, uid) {
                    Ok(name) => {
                        if let Some(c) = self.clients.conns.get_mut(i) {
                            c.local = Some(name.local);
                        }
                        self.clients.by_local.insert(name.local, i);
                        log::debug!("rank {}: client {name} (uid {uid}, job {job})", self.me);
                        self.client_frame(
                            i,
                            ToClient::Welcome {
                                name,
                                job,
                                size: self.node.size(),
                                msg_max: self.node.clients().msg_max().min(u32::MAX as usize)
                                    as u32,
                            },
                        );
                    }
                    Err(why) => self.refuse_client(i, &why),
                }
                Ok(())
            }
            (None, _) => Err("a client's first frame must be Hello".into()),
            (Some(_), ToDaemon::Hello { .. }) => Err("a second Hello".into()),
            (
                Some(local),
                ToDaemon::Send {
                    token,
                    to,
                    tag,
                    payload,
                },
            ) => self.node.handle_client_send(local, token, to, tag, payload),
            (Some(local), ToDaemon::Watch { name }) => self.node.handle_client_watch(local, name),
        }
    }

    /// Closes client connection `i` (`why`: a protocol error, logged) and tells the node.
    pub(super) fn close_client(&mut self, i: usize, why: Option<&str>) {
        let Some(mut c) = self.clients.conns.try_remove(i) else {
            return;
        };
        let _ = self.poll.registry().deregister(&mut c.stream);
        self.clients.pending.retain(|p| *p != i);
        self.clients.paused.remove(&i);
        self.clients.again.remove(&i);
        self.clients.dirty.remove(&i);
        if let Some(why) = why {
            self.node.counters_mut().protocol_errors += 1;
            if c.local.is_none() {
                // Never admitted: a refusal as much as a wrong key.
                self.node.handle_client_refused();
            }
            let (local, uid) = (c.local, c.uid);
            self.log_refusal(Refusal::Client, || {
                format!("closed client {local:?} (uid {uid}): {why}")
            });
        }
        if let Some(local) = c.local {
            self.clients.by_local.remove(&local);
            self.node.handle_client_gone(local);
            self.carry_out();
        }
    }

    /// Queues a frame for client connection `i`.
    fn client_frame(&mut self, i: usize, f: ToClient) {
        let Some(c) = self.clients.conns.get_mut(i) else {
            return;
        };
        let b = f.encode();
        c.out_bytes += b.len();
        c.out.push_back(b);
        self.clients.dirty.insert(i);
    }

    /// An event of the node's clients' core.
    pub(super) fn on_client_event(&mut self, e: ClientEvent) {
        let (local, frame) = match e {
            ClientEvent::Deliver {
                client,
                from,
                tag,
                payload,
            } => (client, ToClient::Deliver { from, tag, payload }),
            ClientEvent::SendDone {
                client,
                token,
                result,
            } => (
                client,
                ToClient::SendDone {
                    token,
                    code: result_code(&result),
                },
            ),
            ClientEvent::Exited {
                client,
                name,
                reason,
            } => (
                client,
                ToClient::Exited {
                    name,
                    reason: reason.code(),
                },
            ),
        };
        if let Some(&i) = self.clients.by_local.get(&local) {
            self.client_frame(i, frame);
        }
    }

    /// Writes what is queued for client `i`; the node learns the new queue level.
    fn flush_client(&mut self, i: usize) {
        let Some(c) = self.clients.conns.get_mut(i) else {
            return;
        };
        let mut failed = None;
        for _ in 0..limits::WRITES_PER_FLUSH_MAX {
            if c.out.is_empty() {
                break;
            }
            let slices: Vec<IoSlice<'_>> = c.out.iter().take(64).map(|b| IoSlice::new(b)).collect();
            match crate::driver::nosignal::send_vectored(&c.stream, &slices) {
                Ok(mut n) => {
                    c.out_bytes -= n;
                    while n > 0 {
                        let Some(front) = c.out.front_mut() else {
                            break;
                        };
                        if n >= front.len() {
                            n -= front.len();
                            c.out.pop_front();
                        } else {
                            front.advance(n);
                            n = 0;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    failed = Some(format!("write: {e}"));
                    break;
                }
            }
        }
        let (local, out_bytes, done_closing) =
            (c.local, c.out_bytes, c.closing && c.out.is_empty());
        if let Some(why) = failed {
            // The client went away (EPIPE): not a protocol error.
            log::debug!("rank {}: client connection {i}: {why}", self.me);
            self.close_client(i, None);
            return;
        }
        if done_closing {
            self.close_client(i, None);
            return;
        }
        if let Some(local) = local {
            self.node.handle_client_queue(local, out_bytes);
        }
    }

    /// Once per turn: writes what the turn queued, reads clients whose pause ended or whose
    /// read bound was reached, and expires connections that never said `Hello`.
    pub(super) fn turn_clients(&mut self) {
        if self.clients.listener.is_none() && self.clients.conns.is_empty() {
            return;
        }
        let dirty: Vec<usize> = self.clients.dirty.drain().collect();
        for i in dirty {
            self.flush_client(i);
        }
        let node = &self.node;
        let conns = &self.clients.conns;
        let mut resume = Vec::new();
        self.clients.paused.retain(|&i| {
            let blocked = conns
                .get(i)
                .and_then(|c| c.local)
                .is_some_and(|l| !node.client_may_read(l));
            if !blocked {
                resume.push(i);
            }
            blocked
        });
        let again: Vec<usize> = self.clients.again.drain().chain(resume).collect();
        for i in again {
            if i == usize::MAX {
                self.accept_clients();
            } else {
                self.read_client(i);
            }
        }
        if !self.clients.pending.is_empty() {
            self.expire_pending_clients();
        }
        let dirty: Vec<usize> = self.clients.dirty.drain().collect();
        for i in dirty {
            self.flush_client(i);
        }
    }

    /// Disconnects the clients with these local ids (their job ended): each is told `Bye`
    /// with `reason` (as far as its socket takes it now) and closed; the node forgets it.
    pub(super) fn disconnect_clients(&mut self, locals: &[u32], reason: &str) {
        for local in locals {
            let Some(&i) = self.clients.by_local.get(local) else {
                continue;
            };
            self.client_frame(
                i,
                ToClient::Bye {
                    reason: reason.to_string(),
                },
            );
            if let Some(c) = self.clients.conns.get_mut(i) {
                c.closing = true;
            }
            self.flush_client(i);
            self.close_client(i, None);
        }
    }

    /// The daemon stops: every client is told `Bye` and closed (best effort: a client that
    /// does not read sees its socket close).
    pub(super) fn stop_clients(&mut self, reason: &str) {
        let all: Vec<usize> = self.clients.conns.iter().map(|(i, _)| i).collect();
        for i in all {
            if self.clients.conns.get(i).is_some_and(|c| c.local.is_some()) {
                self.client_frame(
                    i,
                    ToClient::Bye {
                        reason: reason.to_string(),
                    },
                );
            }
            if let Some(c) = self.clients.conns.get_mut(i) {
                c.closing = true;
            }
            self.flush_client(i);
        }
    }

    /// Closes every client connection and removes the socket file.
    pub(super) fn finish_clients(&mut self) {
        let all: Vec<usize> = self.clients.conns.iter().map(|(i, _)| i).collect();
        for i in all {
            if let Some(mut c) = self.clients.conns.try_remove(i) {
                let _ = self.poll.registry().deregister(&mut c.stream);
            }
        }
        if let Some((mut l, p)) = self.clients.listener.take() {
            let _ = self.poll.registry().deregister(&mut l);
            if identity(&p).is_some() && identity(&p) == self.clients.identity {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}
