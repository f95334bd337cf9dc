//! The client library: what an application process links to talk through its daemon (see
//! [`crate::clients`] for the model). One Unix-domain socket, one reader thread; every call
//! may come from any thread.
use super::nosignal::SocketWriter;
use crate::clients::local::{
    CLIENT_PROTOCOL_VERSION, LOCAL_OVERHEAD_MAX, LocalDecoder, ToClient, ToDaemon,
};
use crate::clients::{
    ClientError, ClientName, ENV_JOB, ENV_KEY, ENV_SOCKET, ExitReason, JobId, parse_key,
    result_from_code,
};
use crate::limits::{
    CLIENT_RECEIVES_MAX, CLIENT_SENDS_INFLIGHT_MAX, CLIENT_UNMATCHED_MAX, CLIENT_WATCHES_MAX,
};
use crate::rml::{TAG_USER_MIN, Tag};
use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

/// How long [`Client::connect`] waits for the daemon's answer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A message one client sent another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientMessage {
    /// The sender.
    pub from: ClientName,
    /// The sender's tag.
    pub tag: Tag,
    /// The payload.
    pub payload: Bytes,
}

/// A posted receive ([`Client::recv_cb`]), for [`Client::cancel`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientReceiveId(u64);

impl ClientReceiveId {
    /// The id as a number (unique per client), for a caller that keeps its own table.
    pub fn value(self) -> u64 {
        self.0
    }
}

type SendDone = Box<dyn FnOnce(Result<(), ClientError>) + Send>;
type RecvCb = Box<dyn FnMut(ClientMessage) + Send>;
type ExitCb = Box<dyn FnOnce(ClientName, ExitReason) + Send>;
type LostCb = Box<dyn FnOnce(&str) + Send>;

struct Pending {
    to: ClientName,
    len: usize,
    tag: Tag,
    done: Option<SendDone>,
}

struct Posted {
    id: u64,
    from: Option<ClientName>,
    tag: Option<Tag>,
    persistent: bool,
    /// `None` only while `recv_cb` hands a persistent receive its held messages.
    cb: Option<RecvCb>,
    /// What arrived for it meanwhile.
    backlog: VecDeque<ClientMessage>,
}

#[derive(Default)]
struct State {
    next_token: u64,
    pending: HashMap<u64, Pending>,
    /// Results of sends someone waits for in `send_wait`.
    results: HashMap<u64, Result<(), ClientError>>,
    posted: Vec<Posted>,
    next_post: u64,
    unmatched: VecDeque<ClientMessage>,
    watches: HashMap<ClientName, Vec<ExitCb>>,
    lost: Option<String>,
    /// `close` or `Drop` began: a reader waiting for room in `unmatched` stops waiting.
    closed: bool,
    lost_cbs: Vec<LostCb>,
}

struct Inner {
    name: ClientName,
    job: JobId,
    size: u32,
    msg_max: usize,
    writer: Mutex<SocketWriter>,
    /// The same socket, to shut it down while a writer holds `writer` (blocked by a daemon
    /// that does not read).
    shutter: UnixStream,
    state: Mutex<State>,
    cv: Condvar,
    reader: OnceLock<ThreadId>,
}

/// A client process's connection to its daemon. Dropping it closes the connection: the
/// daemon removes the client, and the processes watching it are told.
///
/// Callbacks (send completions, posted receives, watches) run on the client's reader thread,
/// one at a time: they must not block on this client (`send_wait`, `recv`); a `send` from a
/// callback returns `Busy` instead of waiting for room.
pub struct Client {
    inner: Arc<Inner>,
    reader: Option<JoinHandle<()>>,
}

/// Whether a send may wait for room among the unanswered sends, and until when.
enum Wait {
    No,
    Until(Option<Instant>),
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Client {
    /// Connects to the daemon's client socket at `socket` as a process of `job` holding its
    /// `key` (what the embedder got from `Handle::client_job`). Fails with
    /// [`ClientError::Refused`] (and the daemon's reason) when the daemon does not admit it,
    /// or [`ClientError::Io`] when there is no daemon there.
    pub fn connect(
        socket: impl AsRef<Path>,
        job: JobId,
        key: &[u8; 32],
    ) -> Result<Client, ClientError> {
        let path = socket.as_ref();
        let io = |what: &str, e: std::io::Error| {
            ClientError::Io(format!("{what} {}: {e}", path.display()))
        };
        let mut stream = UnixStream::connect(path).map_err(|e| io("connect", e))?;
        let hello = ToDaemon::Hello {
            version: CLIENT_PROTOCOL_VERSION,
            job,
            key: *key,
        }
        .encode();
        // A daemon that refuses this process's uid does so as it accepts the connection, and
        // may have closed it before the Hello is written: its reason is still there to read.
        let written = SocketWriter(stream.try_clone().map_err(|e| io("clone", e))?)
            .write_all(&hello)
            .map_err(|e| io("write to", e));
        stream
            .set_read_timeout(Some(CONNECT_TIMEOUT))
            .map_err(|e| io("configure", e))?;
        // Large enough for any frame the daemon sends: its msg_max is not known yet.
        let mut decoder = LocalDecoder::new(u32::MAX as usize);
        let welcome = loop {
            match decoder.next_body() {
                Ok(Some(body)) => break ToClient::decode(body).map_err(ClientError::Io)?,
                Ok(None) => {}
                Err(e) => return Err(ClientError::Io(e)),
            }
            match decoder.read_from(&mut stream) {
                Ok(0) => {
                    written?;
                    return Err(ClientError::Io("the daemon closed the connection".into()));
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io("read from", e)),
            }
        };
        let (name, size, msg_max) = match welcome {
            ToClient::Welcome {
                name,
                job: _,
                size,
                msg_max,
            } => (name, size, msg_max as usize),
            ToClient::Refused { reason } | ToClient::Bye { reason } => {
                return Err(ClientError::Refused(reason));
            }
            other => return Err(ClientError::Io(format!("unexpected first frame {other:?}"))),
        };
        stream
            .set_read_timeout(None)
            .map_err(|e| io("configure", e))?;
        let reader_stream = stream.try_clone().map_err(|e| io("clone", e))?;
        let shutter = stream.try_clone().map_err(|e| io("clone", e))?;
        let inner = Arc::new(Inner {
            name,
            job,
            size,
            msg_max,
            writer: Mutex::new(SocketWriter(stream)),
            shutter,
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            reader: OnceLock::new(),
        });
        let r = inner.clone();
        let reader = std::thread::Builder::new()
            .name(format!("tbon-client-{name}"))
            .spawn(move || {
                let _ = r.reader.set(std::thread::current().id());
                read_loop(&r, reader_stream, decoder, msg_max);
            })
            .map_err(|e| ClientError::Io(format!("reader thread: {e}")))?;
        log::debug!("client {name} connected to {}", path.display());
        Ok(Client {
            inner,
            reader: Some(reader),
        })
    }

    /// Connects with what the environment holds: [`crate::clients::ENV_SOCKET`],
    /// [`crate::clients::ENV_JOB`] and [`crate::clients::ENV_KEY`] (what
    /// `ClientCredential::env` gives the processes an embedder starts).
    pub fn from_env() -> Result<Client, ClientError> {
        let var =
            |n: &str| std::env::var(n).map_err(|_| ClientError::Io(format!("{n} is not set")));
        let socket = var(ENV_SOCKET)?;
        let job = var(ENV_JOB)?
            .trim()
            .parse()
            .map_err(|e| ClientError::Io(format!("{ENV_JOB}: {e}")))?;
        let key =
            parse_key(&var(ENV_KEY)?).map_err(|e| ClientError::Io(format!("{ENV_KEY}: {e}")))?;
        Client::connect(socket, job, &key)
    }

    /// This client's name.
    pub fn name(&self) -> ClientName {
        self.inner.name
    }

    /// The job this client belongs to.
    pub fn job(&self) -> JobId {
        self.inner.job
    }

    /// The DVM's size (client names have ranks below it).
    pub fn size(&self) -> u32 {
        self.inner.size
    }

    /// The largest payload a send takes: the DVM's `msg_max_bytes` less the 28-byte header a
    /// client message carries between daemons.
    pub fn msg_max_bytes(&self) -> usize {
        self.inner.msg_max
    }

    /// Why the connection to the daemon ended, once it has (the daemon died or stopped, or
    /// broke the protocol).
    pub fn daemon_lost(&self) -> Option<String> {
        lock(&self.inner.state).lost.clone()
    }

    /// `f` runs once when the connection to the daemon ends (at once if it has).
    pub fn on_daemon_lost(&self, f: impl FnOnce(&str) + Send + 'static) {
        let mut st = lock(&self.inner.state);
        match st.lost.clone() {
            Some(why) => {
                drop(st);
                f(&why);
            }
            None => st.lost_cbs.push(Box::new(f)),
        }
    }

    /// Sends `payload` to client `to` with `tag` (at least [`TAG_USER_MIN`]); `done` runs
    /// with the result once `to`'s daemon has queued it for `to` (`Ok`), or with why it never
    /// will be. Messages from one client to another arrive in the order sent.
    ///
    /// Waits while [`crate::limits::CLIENT_SENDS_INFLIGHT_MAX`] sends are unanswered (from a
    /// callback: `Busy` instead). Errors at once: `TooLarge`, `ReservedTag`, `DaemonLost`.
    pub fn send(
        &self,
        to: ClientName,
        tag: Tag,
        payload: impl Into<Bytes>,
        done: impl FnOnce(Result<(), ClientError>) + Send + 'static,
    ) -> Result<(), ClientError> {
        self.submit(
            to,
            tag,
            payload.into(),
            Some(Box::new(done)),
            Wait::Until(None),
        )
        .map(|_| ())
    }

    /// [`Client::send`] that never waits: `Busy` while the bound of unanswered sends is
    /// reached.
    pub fn try_send(
        &self,
        to: ClientName,
        tag: Tag,
        payload: impl Into<Bytes>,
        done: impl FnOnce(Result<(), ClientError>) + Send + 'static,
    ) -> Result<(), ClientError> {
        self.submit(to, tag, payload.into(), Some(Box::new(done)), Wait::No)
            .map(|_| ())
    }

    /// Sends and waits for the result (see [`Client::send`]); `TimedOut` after `timeout`,
    /// which covers the wait for room among the unanswered sends too (then nothing was
    /// sent), and the wait for the result (then the message may still be delivered). Not from
    /// a callback.
    pub fn send_wait(
        &self,
        to: ClientName,
        tag: Tag,
        payload: impl Into<Bytes>,
        timeout: Option<Duration>,
    ) -> Result<(), ClientError> {
        if self.on_reader() {
            return Err(ClientError::Busy);
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let token = self.submit(to, tag, payload.into(), None, Wait::Until(deadline))?;
        let mut st = lock(&self.inner.state);
        loop {
            if let Some(r) = st.results.remove(&token) {
                return r;
            }
            if !st.pending.contains_key(&token) {
                return Err(ClientError::DaemonLost);
            }
            st = match wait(&self.inner.cv, st, deadline) {
                Some(st) => st,
                None => {
                    // Nobody waits any more: the result is dropped when it comes.
                    let mut st = lock(&self.inner.state);
                    if let Some(p) = st.pending.get_mut(&token) {
                        p.done = Some(Box::new(|_| {}));
                    }
                    if let Some(r) = st.results.remove(&token) {
                        return r;
                    }
                    return Err(ClientError::TimedOut);
                }
            };
        }
    }

    fn on_reader(&self) -> bool {
        self.inner.reader.get() == Some(&std::thread::current().id())
    }

    fn submit(
        &self,
        to: ClientName,
        tag: Tag,
        payload: Bytes,
        done: Option<SendDone>,
        wait_for_room: Wait,
    ) -> Result<u64, ClientError> {
        if tag < TAG_USER_MIN {
            return Err(ClientError::ReservedTag(tag));
        }
        if payload.len() > self.inner.msg_max {
            return Err(ClientError::TooLarge {
                len: payload.len(),
                max: self.inner.msg_max,
            });
        }
        let deadline = match wait_for_room {
            Wait::Until(d) if !self.on_reader() => Some(d),
            _ => None,
        };
        let mut st = lock(&self.inner.state);
        loop {
            if st.lost.is_some() || st.closed {
                return Err(ClientError::DaemonLost);
            }
            if st.pending.len() < CLIENT_SENDS_INFLIGHT_MAX {
                break;
            }
            let Some(d) = deadline else {
                return Err(ClientError::Busy);
            };
            st = wait(&self.inner.cv, st, d).ok_or(ClientError::TimedOut)?;
        }
        let token = st.next_token;
        st.next_token += 1;
        st.pending.insert(
            token,
            Pending {
                to,
                len: payload.len(),
                tag,
                done,
            },
        );
        drop(st);
        let frame = ToDaemon::Send {
            token,
            to,
            tag,
            payload,
        }
        .encode();
        let mut w = self.inner.writer.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = w.write_all(&frame) {
            drop(w);
            // The reader sees the same end and fails what is pending (this send included).
            log::debug!("client {}: write: {e}", self.inner.name);
            let mut st = lock(&self.inner.state);
            if st.lost.is_some() && st.pending.remove(&token).is_some() {
                return Err(ClientError::DaemonLost);
            }
        }
        Ok(token)
    }

    /// Posts a receive: `cb` gets each message matching `from` (any client if `None`) and
    /// `tag` (any if `None`), once, or every one if `persistent`. Messages already held
    /// unmatched are matched first. When several posted receives match a message, one that
    /// names the sender wins over one for any sender, then the first posted; a message no
    /// posted receive matches waits for `recv` or a later `recv_cb`. `DaemonLost` once the
    /// connection has ended. `Busy` beyond [`crate::limits::CLIENT_RECEIVES_MAX`].
    pub fn recv_cb(
        &self,
        from: Option<ClientName>,
        tag: Option<Tag>,
        persistent: bool,
        cb: impl FnMut(ClientMessage) + Send + 'static,
    ) -> Result<ClientReceiveId, ClientError> {
        let mut cb: RecvCb = Box::new(cb);
        let mut st = lock(&self.inner.state);
        if st.lost.is_some() || st.closed {
            return Err(ClientError::DaemonLost);
        }
        if st.posted.len() >= CLIENT_RECEIVES_MAX {
            return Err(ClientError::Busy);
        }
        let id = st.next_post;
        st.next_post += 1;
        if !persistent {
            // One message: a held one, or the next to arrive.
            if let Some(m) = take_match(&mut st.unmatched, from, tag) {
                drop(st);
                self.inner.cv.notify_all();
                cb(m);
            } else {
                st.posted.push(Posted {
                    id,
                    from,
                    tag,
                    persistent,
                    cb: Some(cb),
                    backlog: VecDeque::new(),
                });
                // A reader waiting for room matches its message again.
                drop(st);
                self.inner.cv.notify_all();
            }
            return Ok(ClientReceiveId(id));
        }
        // Every held match first, in arrival order, on this thread; what arrives meanwhile
        // waits in the post's backlog (the reader does not run a callback that is not set).
        let (mut batch, rest): (VecDeque<ClientMessage>, VecDeque<ClientMessage>) =
            std::mem::take(&mut st.unmatched)
                .into_iter()
                .partition(|m| matches(m, from, tag));
        st.unmatched = rest;
        st.posted.push(Posted {
            id,
            from,
            tag,
            persistent,
            cb: None,
            backlog: VecDeque::new(),
        });
        loop {
            if batch.is_empty() {
                match st.posted.iter_mut().find(|p| p.id == id) {
                    Some(p) if !p.backlog.is_empty() => batch = std::mem::take(&mut p.backlog),
                    Some(p) => {
                        p.cb = Some(cb);
                        break;
                    }
                    // Cancelled meanwhile.
                    None => break,
                }
            }
            drop(st);
            self.inner.cv.notify_all();
            for m in batch.drain(..) {
                cb(m);
            }
            st = lock(&self.inner.state);
        }
        // A reader waiting for room matches its message again.
        drop(st);
        self.inner.cv.notify_all();
        Ok(ClientReceiveId(id))
    }

    /// Waits for a message matching `from` and `tag` (`None`: any), at most `timeout`
    /// (`None`: no limit). Messages a posted receive matches never come here. Not from a
    /// callback.
    pub fn recv(
        &self,
        from: Option<ClientName>,
        tag: Option<Tag>,
        timeout: Option<Duration>,
    ) -> Result<ClientMessage, ClientError> {
        if self.on_reader() {
            return Err(ClientError::Busy);
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut st = lock(&self.inner.state);
        loop {
            if let Some(m) = take_match(&mut st.unmatched, from, tag) {
                drop(st);
                self.inner.cv.notify_all();
                return Ok(m);
            }
            if st.lost.is_some() || st.closed {
                return Err(ClientError::DaemonLost);
            }
            st = wait(&self.inner.cv, st, deadline).ok_or(ClientError::TimedOut)?;
        }
    }

    /// Withdraws a posted receive; `false` if it is gone (a one-shot receive that matched).
    /// A callback already running finishes.
    pub fn cancel(&self, id: ClientReceiveId) -> bool {
        let mut st = lock(&self.inner.state);
        let before = st.posted.len();
        st.posted.retain(|p| p.id != id.0);
        st.posted.len() != before
    }

    /// `cb` runs once when client `name` exits ([`ExitReason::Exited`], also at once if it
    /// had exited already), when its daemon dies (`DaemonDied`), or at once if no client of
    /// that name was ever admitted (`Unknown`). `Busy` beyond [`crate::limits::CLIENT_WATCHES_MAX`] names watched.
    pub fn watch(
        &self,
        name: ClientName,
        cb: impl FnOnce(ClientName, ExitReason) + Send + 'static,
    ) -> Result<(), ClientError> {
        let mut st = lock(&self.inner.state);
        if st.lost.is_some() {
            return Err(ClientError::DaemonLost);
        }
        let first = !st.watches.contains_key(&name);
        if first && st.watches.len() >= CLIENT_WATCHES_MAX {
            return Err(ClientError::Busy);
        }
        st.watches.entry(name).or_default().push(Box::new(cb));
        drop(st);
        if first {
            let frame = ToDaemon::Watch { name }.encode();
            let mut w = self.inner.writer.lock().unwrap_or_else(|p| p.into_inner());
            if w.write_all(&frame).is_err() {
                return Err(ClientError::DaemonLost);
            }
        }
        Ok(())
    }

    /// Sends unanswered now.
    pub fn in_flight(&self) -> usize {
        lock(&self.inner.state).pending.len()
    }

    /// Ends the connection from any thread, without waiting: calls blocked in `send`,
    /// `send_wait` or `recv` return `DaemonLost`, pending sends end `DaemonLost`, and later
    /// calls fail the same way. The value stays usable for `daemon_lost` and is freed by
    /// `close` or `Drop`.
    pub fn shutdown(&self) {
        lock(&self.inner.state).closed = true;
        self.inner.cv.notify_all();
        let _ = self.inner.shutter.shutdown(std::net::Shutdown::Both);
    }

    /// Closes the connection and waits for the reader thread (what `Drop` does). Pending
    /// sends end `DaemonLost`: close does not flush, so a message whose send was accepted but
    /// not yet answered may never be delivered; wait for the sends' results (`send_wait`, or
    /// their callbacks) before closing to be sure.
    pub fn close(mut self) {
        self.shut();
    }

    fn shut(&mut self) {
        self.shutdown();
        if let Some(t) = self.reader.take()
            && std::thread::current().id() != t.thread().id()
        {
            let _ = t.join();
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.shut();
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("name", &self.inner.name)
            .field("job", &self.inner.job)
            .finish()
    }
}

/// Takes the first message of `q` matching `from` and `tag`.
fn take_match(
    q: &mut VecDeque<ClientMessage>,
    from: Option<ClientName>,
    tag: Option<Tag>,
) -> Option<ClientMessage> {
    let pos = q.iter().position(|m| matches(m, from, tag))?;
    q.remove(pos)
}

fn matches(m: &ClientMessage, from: Option<ClientName>, tag: Option<Tag>) -> bool {
    from.is_none_or(|f| f == m.from) && tag.is_none_or(|t| t == m.tag)
}

/// Waits on `cv` until notified or `deadline`; `None` once the deadline has passed.
fn wait<'a>(
    cv: &Condvar,
    st: MutexGuard<'a, State>,
    deadline: Option<Instant>,
) -> Option<MutexGuard<'a, State>> {
    match deadline {
        None => Some(cv.wait(st).unwrap_or_else(|p| p.into_inner())),
        Some(d) => {
            let now = Instant::now();
            if now >= d {
                return None;
            }
            Some(
                cv.wait_timeout(st, d - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0,
            )
        }
    }
}

fn read_loop(inner: &Inner, mut stream: UnixStream, mut decoder: LocalDecoder, msg_max: usize) {
    // From now on the daemon's real bound applies.
    let mut d = LocalDecoder::new(msg_max + LOCAL_OVERHEAD_MAX);
    std::mem::swap(&mut d, &mut decoder);
    // The bytes already buffered while connecting are kept.
    let mut buffered = d;
    let why = loop {
        let body = match buffered.next_body() {
            Ok(Some(b)) => b,
            Ok(None) => match buffered.read_from(&mut stream) {
                Ok(0) => break "the daemon closed the connection".to_string(),
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => break format!("read: {e}"),
            },
            Err(e) => break e,
        };
        match ToClient::decode(body) {
            Ok(ToClient::Bye { reason }) => break format!("the daemon stopped: {reason}"),
            Ok(f) => {
                if let Err(e) = on_frame(inner, f) {
                    break e;
                }
            }
            Err(e) => break e,
        }
    };
    log::debug!("client {}: connection ended: {why}", inner.name);
    let mut st = lock(&inner.state);
    st.lost = Some(why.clone());
    let pending: Vec<(u64, Pending)> = st.pending.drain().collect();
    let lost_cbs = std::mem::take(&mut st.lost_cbs);
    st.watches.clear();
    let mut waiters = Vec::new();
    for (token, p) in pending {
        match p.done {
            Some(done) => waiters.push(done),
            None => {
                st.results.insert(token, Err(ClientError::DaemonLost));
            }
        }
    }
    drop(st);
    inner.cv.notify_all();
    for done in waiters {
        done(Err(ClientError::DaemonLost));
    }
    for cb in lost_cbs {
        cb(&why);
    }
}

fn on_frame(inner: &Inner, f: ToClient) -> Result<(), String> {
    match f {
        ToClient::Deliver { from, tag, payload } => {
            let m = ClientMessage { from, tag, payload };
            let mut st = lock(&inner.state);
            let pos = loop {
                // As the daemons' matching: a receive naming the sender before one for any
                // sender, then the first posted.
                let pos = st
                    .posted
                    .iter()
                    .position(|p| p.from.is_some() && matches(&m, p.from, p.tag))
                    .or_else(|| st.posted.iter().position(|p| matches(&m, p.from, p.tag)));
                if pos.is_some() {
                    break pos;
                }
                // No receive: held, within its bound (the reader waits for room: the daemon
                // then holds what follows, and back-pressure reaches the senders). A receive
                // posted during the wait is matched again: held, the message would wait
                // behind it for ever.
                if st.unmatched.len() < CLIENT_UNMATCHED_MAX || st.closed {
                    break None;
                }
                st = inner.cv.wait(st).unwrap_or_else(|p| p.into_inner());
            };
            let Some(pos) = pos else {
                st.unmatched.push_back(m);
                drop(st);
                inner.cv.notify_all();
                return Ok(());
            };
            let Some(p) = st.posted.get_mut(pos) else {
                return Ok(());
            };
            let (id, persistent) = (p.id, p.persistent);
            let Some(mut cb) = p.cb.take() else {
                // `recv_cb` is still handing it held messages: after those.
                p.backlog.push_back(m);
                return Ok(());
            };
            if !persistent {
                st.posted.remove(pos);
            }
            drop(st);
            cb(m);
            if persistent {
                let mut st = lock(&inner.state);
                if let Some(p) = st.posted.iter_mut().find(|p| p.id == id) {
                    p.cb = Some(cb);
                }
            }
            Ok(())
        }
        ToClient::SendDone { token, code } => {
            let mut st = lock(&inner.state);
            let Some(p) = st.pending.remove(&token) else {
                return Err(format!("a result for send {token}, which is not pending"));
            };
            let result = result_from_code(code, p.to, p.len, inner.msg_max, p.tag)
                .ok_or_else(|| format!("result code {code}"))?;
            match p.done {
                Some(done) => {
                    drop(st);
                    inner.cv.notify_all();
                    done(result);
                }
                None => {
                    st.results.insert(token, result);
                    drop(st);
                    inner.cv.notify_all();
                }
            }
            Ok(())
        }
        ToClient::Exited { name, reason } => {
            let reason =
                ExitReason::from_code(reason).ok_or_else(|| format!("exit reason {reason}"))?;
            let cbs = lock(&inner.state).watches.remove(&name).unwrap_or_default();
            for cb in cbs {
                cb(name, reason);
            }
            Ok(())
        }
        other => Err(format!("unexpected frame {other:?}")),
    }
}
