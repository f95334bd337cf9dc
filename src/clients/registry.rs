//! [`Clients`]: one daemon's clients, their jobs, their sends in flight and their watches
//! (sans-IO; the node drives it, `node/clients.rs`). See the module above for the rules.
use super::wire::{Control, DataHeader, SendResult};
use super::{ClientError, ClientName, ExitReason, JobId, result_code, result_from_code};
use crate::Rank;
use crate::fxhash::FxHashMap;
use crate::limits::{
    CLIENT_CONTROL_QUEUE_MAX, CLIENT_JOBS_MAX, CLIENT_QUEUE_BYTES_MAX,
    CLIENT_RESULTS_PER_MESSAGE_MAX, CLIENT_SENDS_INFLIGHT_MAX, CLIENT_SENDS_PER_PUMP_MAX,
    CLIENT_WATCHES_MAX, CLIENTS_MAX,
};
use crate::rml::{TAG_USER_MIN, Tag};
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// What the clients' core tells its driver (through the node's `Output::Client`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientEvent {
    /// Hand a message to local client `client`.
    Deliver {
        client: u32,
        from: ClientName,
        tag: Tag,
        payload: Bytes,
    },
    /// The send `token` of local client `client` ended.
    SendDone {
        client: u32,
        token: u64,
        result: Result<(), ClientError>,
    },
    /// A client that local client `client` watches is gone.
    Exited {
        client: u32,
        name: ClientName,
        reason: ExitReason,
    },
}

/// How a daemon-to-daemon send of a client message went (the node's answer to
/// [`Clients::pump_data`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carried {
    /// RELM took it.
    Sent,
    /// RELM's window is full: try again at a later pump.
    Busy,
    /// The destination daemon is dead.
    Down,
}

struct Job {
    key: [u8; 32],
    accept_from: Vec<JobId>,
    /// Closed: admits no new client, kept while clients of the job remain (its
    /// `accept_from` still decides what reaches them).
    open: bool,
}

struct Local {
    job: JobId,
    /// Sends not yet answered (waiting here or in flight).
    unanswered: usize,
    /// Bytes queued towards the client's socket (delivered since the driver's last report,
    /// plus what it reported).
    queued: usize,
    /// Sends not yet handed to RELM, in order.
    waiting: VecDeque<Waiting>,
    /// Names this client watches.
    watching: usize,
    /// Other daemons whose clients watch this one.
    watchers: BTreeSet<Rank>,
}

struct Waiting {
    token: u64,
    to: ClientName,
    tag: Tag,
    payload: Bytes,
}

#[derive(Clone, Copy)]
struct InFlight {
    to: ClientName,
    len: usize,
    tag: Tag,
}

/// Counters of a daemon's clients (in `Counters`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ClientCounters {
    /// Clients connected now.
    pub live: u64,
    /// Clients admitted since the start.
    pub admitted: u64,
    /// Connections refused (wrong key, unknown job, uid, version, bound).
    pub refused: u64,
    /// Client messages this daemon's clients sent (answered or not).
    pub sent: u64,
    /// Client messages handed to this daemon's clients.
    pub delivered: u64,
    /// Client messages answered with an error here (unknown, gone, not permitted).
    pub rejected: u64,
    /// Client messages RELM refused here because their receiver's queue was full (replayed).
    pub held_back: u64,
}

/// One daemon's clients.
#[derive(Default)]
pub struct Clients {
    me: Rank,
    size: u32,
    msg_max: usize,
    uids: Vec<u32>,
    jobs: FxHashMap<JobId, Job>,
    locals: BTreeMap<u32, Local>,
    next_local: u32,
    inflight: FxHashMap<(u32, u64), InFlight>,
    /// Clients with waiting sends, in the order they get a turn.
    turns: VecDeque<u32>,
    /// Names watched by local clients, with those clients.
    watching: BTreeMap<ClientName, BTreeSet<u32>>,
    /// Results for other daemons, batched per daemon until the next pump.
    results: BTreeMap<Rank, Vec<SendResult>>,
    control: VecDeque<(Rank, Bytes)>,
    events: VecDeque<ClientEvent>,
    counters: ClientCounters,
}

impl Clients {
    /// The clients of daemon `me` of `size` in a DVM whose largest message is `msg_max_bytes`;
    /// a client connecting with a uid not in `uids` is refused.
    pub fn new(me: Rank, size: u32, msg_max_bytes: usize, uids: Vec<u32>) -> Clients {
        Clients {
            me,
            size,
            // A client message travels behind its header in one daemon message.
            msg_max: msg_max_bytes.saturating_sub(super::wire::DATA_HEADER_LEN),
            uids,
            jobs: FxHashMap::default(),
            locals: BTreeMap::new(),
            next_local: 1,
            inflight: FxHashMap::default(),
            turns: VecDeque::new(),
            watching: BTreeMap::new(),
            results: BTreeMap::new(),
            control: VecDeque::new(),
            events: VecDeque::new(),
            counters: ClientCounters::default(),
        }
    }

    /// Opens `job` for clients holding `key`; messages from clients of the jobs in
    /// `accept_from` reach its clients too. Opening it again replaces key and list (clients
    /// already admitted stay). `Err` at `CLIENT_JOBS_MAX` jobs.
    pub fn open_job(&mut self, job: JobId, key: [u8; 32], accept_from: Vec<JobId>) -> bool {
        if !self.jobs.contains_key(&job) && self.jobs.len() >= CLIENT_JOBS_MAX {
            return false;
        }
        self.jobs.insert(
            job,
            Job {
                key,
                accept_from,
                open: true,
            },
        );
        true
    }

    /// No new client of `job` is admitted; those connected stay until they exit, under the
    /// job's `accept_from` (the job counts against `CLIENT_JOBS_MAX` until the last is gone).
    pub fn close_job(&mut self, job: JobId) {
        if let Some(j) = self.jobs.get_mut(&job) {
            j.open = false;
        }
        self.forget_closed(job);
    }

    /// The job is over here: closed, and the local ids of its connected clients, which the
    /// driver disconnects (each then goes as by `gone`).
    pub fn end_job(&mut self, job: JobId) -> Vec<u32> {
        if let Some(j) = self.jobs.get_mut(&job) {
            j.open = false;
        }
        let locals: Vec<u32> = self
            .locals
            .iter()
            .filter(|(_, l)| l.job == job)
            .map(|(id, _)| *id)
            .collect();
        self.forget_closed(job);
        locals
    }

    /// Drops closed job `job` once none of its clients remains.
    fn forget_closed(&mut self, job: JobId) {
        let closed = self.jobs.get(&job).is_some_and(|j| !j.open);
        if closed && !self.locals.values().any(|l| l.job == job) {
            self.jobs.remove(&job);
        }
    }

    /// A connection's `Hello`: admitted (its name) or refused (why, for the log and the
    /// client).
    /// Whether a connection from `uid` may become a client at all (`client_uids`). Known when
    /// the connection is accepted (`SO_PEERCRED`), before its `Hello`.
    pub fn uid_allowed(&self, uid: u32) -> bool {
        self.uids.contains(&uid)
    }

    pub fn admit(
        &mut self,
        version: u16,
        job: JobId,
        key: &[u8; 32],
        uid: u32,
    ) -> Result<ClientName, String> {
        let res = self.admit_inner(version, job, key, uid);
        match res {
            Ok(_) => self.counters.admitted += 1,
            Err(_) => self.counters.refused += 1,
        }
        res
    }

    fn admit_inner(
        &mut self,
        version: u16,
        job: JobId,
        key: &[u8; 32],
        uid: u32,
    ) -> Result<ClientName, String> {
        if version != super::local::CLIENT_PROTOCOL_VERSION {
            return Err(format!(
                "client protocol version {version} (this daemon speaks {})",
                super::local::CLIENT_PROTOCOL_VERSION
            ));
        }
        if !self.uid_allowed(uid) {
            return Err(format!("uid {uid} is not among client_uids"));
        }
        let Some(j) = self.jobs.get(&job).filter(|j| j.open) else {
            return Err(format!("job {job} is not open on this daemon"));
        };
        if !constant_time_eq(&j.key, key) {
            return Err(format!("wrong client key for job {job}"));
        }
        if self.locals.len() >= CLIENTS_MAX || self.next_local == u32::MAX {
            return Err(format!(
                "this daemon has {} clients (the bound)",
                self.locals.len()
            ));
        }
        let local = self.next_local;
        self.next_local += 1;
        self.locals.insert(
            local,
            Local {
                job,
                unanswered: 0,
                queued: 0,
                waiting: VecDeque::new(),
                watching: 0,
                watchers: BTreeSet::new(),
            },
        );
        Ok(ClientName {
            rank: self.me,
            local,
        })
    }

    /// Counts a connection refused before admission was judged (see
    /// `Node::handle_client_refused`).
    pub fn count_refused(&mut self) {
        self.counters.refused += 1;
    }

    /// Whether the driver may read more frames from local client `local`: it has fewer than
    /// `CLIENT_SENDS_INFLIGHT_MAX` sends unanswered.
    pub fn may_read(&self, local: u32) -> bool {
        self.locals
            .get(&local)
            .is_some_and(|l| l.unanswered < CLIENT_SENDS_INFLIGHT_MAX)
    }

    /// Local client `local` sends `payload` to `to`. Argument errors are answered at once (an
    /// event); `Err` is a protocol violation (a token already unanswered, more sends than
    /// the bound): close the client.
    pub fn send(
        &mut self,
        local: u32,
        token: u64,
        to: ClientName,
        tag: Tag,
        payload: Bytes,
    ) -> Result<(), String> {
        let Some(l) = self.locals.get_mut(&local) else {
            return Err(format!("no client {local}"));
        };
        if self.inflight.contains_key(&(local, token)) {
            return Err(format!("token {token} reused while its send is unanswered"));
        }
        // The driver reads no frame while `may_read` says no: only a broken driver gets here.
        if l.unanswered >= CLIENT_SENDS_INFLIGHT_MAX {
            return Err(format!(
                "more than {CLIENT_SENDS_INFLIGHT_MAX} sends unanswered"
            ));
        }
        self.counters.sent += 1;
        let refusal = if tag < TAG_USER_MIN {
            Some(Err(ClientError::ReservedTag(tag)))
        } else if payload.len() > self.msg_max {
            Some(Err(ClientError::TooLarge {
                len: payload.len(),
                max: self.msg_max,
            }))
        } else if to.rank >= self.size || to.local == 0 {
            Some(Err(ClientError::UnknownClient(to)))
        } else {
            None
        };
        if let Some(result) = refusal {
            self.events.push_back(ClientEvent::SendDone {
                client: local,
                token,
                result,
            });
            return Ok(());
        }
        self.inflight.insert(
            (local, token),
            InFlight {
                to,
                len: payload.len(),
                tag,
            },
        );
        l.unanswered += 1;
        if l.waiting.is_empty() {
            self.turns.push_back(local);
        }
        l.waiting.push_back(Waiting {
            token,
            to,
            tag,
            payload,
        });
        Ok(())
    }

    /// Hands waiting sends over: to a local receiver here, to other daemons through `carry`
    /// (RELM). Clients take turns; one stops at its first send that cannot go (order per
    /// sender is kept). At most `CLIENT_SENDS_PER_PUMP_MAX` per call.
    pub fn pump_data(&mut self, carry: &mut dyn FnMut(Rank, Bytes) -> Carried) {
        let mut budget = CLIENT_SENDS_PER_PUMP_MAX;
        let mut turns = self.turns.len();
        while turns > 0 && budget > 0 {
            turns -= 1;
            let Some(local) = self.turns.pop_front() else {
                break;
            };
            while let Some(l) = self.locals.get(&local) {
                let Some(w) = l.waiting.front() else {
                    break;
                };
                if budget == 0 {
                    break;
                }
                let (to, token, tag, len) = (w.to, w.token, w.tag, w.payload.len());
                let h = DataHeader {
                    from_local: local,
                    to_local: to.local,
                    job: l.job,
                    token,
                    tag,
                };
                let outcome = if to.rank != self.me {
                    carry(to.rank, h.encode(&w.payload))
                } else if self.room(to.local, len) {
                    let payload = self.take_front(local);
                    let code = self.deliver(self.me, h, payload);
                    self.answer(local, token, code);
                    budget -= 1;
                    continue;
                } else {
                    Carried::Busy
                };
                match outcome {
                    Carried::Busy => break,
                    Carried::Sent => {
                        budget -= 1;
                        self.take_front(local);
                    }
                    Carried::Down => {
                        self.take_front(local);
                        self.answer(local, token, result_code(&Err(ClientError::NodeDown(0))));
                    }
                }
            }
            if self
                .locals
                .get(&local)
                .is_some_and(|l| !l.waiting.is_empty())
            {
                self.turns.push_back(local);
            }
        }
        self.flush_results();
    }

    fn take_front(&mut self, local: u32) -> Bytes {
        self.locals
            .get_mut(&local)
            .and_then(|l| l.waiting.pop_front())
            .map(|w| w.payload)
            .unwrap_or_default()
    }

    /// Whether a client message of `len` bytes for local client `to_local` may be taken now
    /// (RELM refuses it otherwise, and its origin replays it later): the client's queue is
    /// under `CLIENT_QUEUE_BYTES_MAX` (or empty), and the control queue has room for the
    /// answer. A message for a client that is not here is always taken (and answered).
    pub fn room(&self, to_local: u32, len: usize) -> bool {
        if self.control.len() >= CLIENT_CONTROL_QUEUE_MAX {
            return false;
        }
        match self.locals.get(&to_local) {
            Some(l) => l.queued == 0 || l.queued + len <= CLIENT_QUEUE_BYTES_MAX,
            None => true,
        }
    }

    /// The largest payload a client may send (the DVM's `msg_max_bytes` less the header a
    /// client message carries between daemons).
    pub fn msg_max(&self) -> usize {
        self.msg_max
    }

    /// Counts a message RELM refused because of [`Clients::room`].
    pub fn held_back(&mut self) {
        self.counters.held_back += 1;
    }

    /// A client message from daemon `origin` (RELM delivered it).
    pub fn handle_data(&mut self, origin: Rank, msg: Bytes) -> Result<(), String> {
        let (h, payload) = DataHeader::decode(msg)?;
        let code = self.deliver(origin, h, payload);
        if origin == self.me {
            self.answer(h.from_local, h.token, code);
        } else {
            let r = self.results.entry(origin).or_default();
            r.push(SendResult {
                local: h.from_local,
                token: h.token,
                code,
            });
            if r.len() >= CLIENT_RESULTS_PER_MESSAGE_MAX {
                let r = std::mem::take(r);
                self.control
                    .push_back((origin, Control::Results(r).encode()));
            }
        }
        Ok(())
    }

    fn deliver(&mut self, origin: Rank, h: DataHeader, payload: Bytes) -> u8 {
        let to = ClientName {
            rank: self.me,
            local: h.to_local,
        };
        let result = match self.locals.get_mut(&h.to_local) {
            None if h.to_local != 0 && h.to_local < self.next_local => {
                Err(ClientError::ClientGone(to))
            }
            None => Err(ClientError::UnknownClient(to)),
            Some(_) if h.tag < TAG_USER_MIN => Err(ClientError::ReservedTag(h.tag)),
            Some(l) => {
                let allowed = l.job == h.job
                    || self
                        .jobs
                        .get(&l.job)
                        .is_some_and(|j| j.accept_from.contains(&h.job));
                if allowed {
                    l.queued += payload.len();
                    self.counters.delivered += 1;
                    self.events.push_back(ClientEvent::Deliver {
                        client: h.to_local,
                        from: ClientName {
                            rank: origin,
                            local: h.from_local,
                        },
                        tag: h.tag,
                        payload,
                    });
                    Ok(())
                } else {
                    Err(ClientError::NotPermitted(to))
                }
            }
        };
        if result.is_err() {
            self.counters.rejected += 1;
        }
        result_code(&result)
    }

    /// Ends local client `local`'s send `token` with `code`.
    fn answer(&mut self, local: u32, token: u64, code: u8) {
        let Some(f) = self.inflight.remove(&(local, token)) else {
            return;
        };
        if let Some(l) = self.locals.get_mut(&local) {
            l.unanswered -= 1;
        }
        let result = result_from_code(code, f.to, f.len, self.msg_max, f.tag)
            .unwrap_or(Err(ClientError::Io(format!("result code {code}"))));
        self.events.push_back(ClientEvent::SendDone {
            client: local,
            token,
            result,
        });
    }

    fn flush_results(&mut self) {
        debug_assert!(
            self.results
                .values()
                .all(|r| r.len() <= CLIENT_RESULTS_PER_MESSAGE_MAX)
        );
        for (origin, r) in std::mem::take(&mut self.results) {
            if !r.is_empty() {
                self.control
                    .push_back((origin, Control::Results(r).encode()));
            }
        }
    }

    /// A control message from daemon `origin`.
    pub fn handle_control(&mut self, origin: Rank, payload: &[u8]) -> Result<(), String> {
        match Control::decode(payload)? {
            Control::Results(rs) => {
                for r in rs {
                    match self.inflight.get(&(r.local, r.token)) {
                        Some(f) if f.to.rank == origin => self.answer(r.local, r.token, r.code),
                        // The sender exited meanwhile.
                        _ => {}
                    }
                }
            }
            Control::Watch { local } => match self.locals.get_mut(&local) {
                Some(l) => {
                    l.watchers.insert(origin);
                }
                None => {
                    let reason = self.never_was(local).code();
                    self.control
                        .push_back((origin, Control::Exited { local, reason }.encode()));
                }
            },
            Control::Exited { local, reason } => {
                let reason =
                    ExitReason::from_code(reason).ok_or_else(|| format!("exit reason {reason}"))?;
                self.gone_elsewhere(
                    ClientName {
                        rank: origin,
                        local,
                    },
                    reason,
                );
            }
        }
        Ok(())
    }

    /// Tells local watchers of `name` that it is gone.
    fn gone_elsewhere(&mut self, name: ClientName, reason: ExitReason) {
        for client in self.watching.remove(&name).unwrap_or_default() {
            if let Some(l) = self.locals.get_mut(&client) {
                l.watching -= 1;
            }
            self.events.push_back(ClientEvent::Exited {
                client,
                name,
                reason,
            });
        }
    }

    /// Local client `local` watches `name`. `Err`: beyond `CLIENT_WATCHES_MAX` (the client's
    /// library keeps the bound: a protocol violation).
    pub fn watch(&mut self, local: u32, name: ClientName, failed: bool) -> Result<(), String> {
        let Some(l) = self.locals.get_mut(&local) else {
            return Err(format!("no client {local}"));
        };
        let set = self.watching.entry(name).or_default();
        if set.contains(&local) {
            return Ok(());
        }
        if l.watching >= CLIENT_WATCHES_MAX {
            return Err(format!("more than {CLIENT_WATCHES_MAX} watches"));
        }
        l.watching += 1;
        let first = set.is_empty();
        set.insert(local);
        if name.rank >= self.size || name.local == 0 {
            self.gone_elsewhere(name, ExitReason::Unknown);
        } else if failed {
            self.gone_elsewhere(name, ExitReason::DaemonDied);
        } else if name.rank == self.me {
            if !self.locals.contains_key(&name.local) {
                let reason = self.never_was(name.local);
                self.gone_elsewhere(name, reason);
            }
        } else if first {
            self.control
                .push_back((name.rank, Control::Watch { local: name.local }.encode()));
        }
        Ok(())
    }

    /// Why local id `local` names no live client here: it exited, or it was never given.
    fn never_was(&self, local: u32) -> ExitReason {
        if local != 0 && local < self.next_local {
            ExitReason::Exited
        } else {
            ExitReason::Unknown
        }
    }

    /// Local client `local`'s connection closed: it is removed with everything it had here,
    /// and its watchers are told.
    pub fn gone(&mut self, local: u32) {
        let Some(l) = self.locals.remove(&local) else {
            return;
        };
        self.forget_closed(l.job);
        self.inflight.retain(|(c, _), _| *c != local);
        self.turns.retain(|c| *c != local);
        let reason = ExitReason::Exited.code();
        for r in l.watchers {
            self.control
                .push_back((r, Control::Exited { local, reason }.encode()));
        }
        self.gone_elsewhere(
            ClientName {
                rank: self.me,
                local,
            },
            ExitReason::Exited,
        );
        if l.watching > 0 {
            self.watching.retain(|_, set| {
                set.remove(&local);
                !set.is_empty()
            });
        }
    }

    /// The driver's count of bytes queued towards local client `local`'s socket.
    pub fn set_queued(&mut self, local: u32, bytes: usize) {
        if let Some(l) = self.locals.get_mut(&local) {
            l.queued = bytes;
        }
    }

    /// Daemons declared dead: sends to their clients end `NodeDown`, watches of their clients
    /// end `DaemonDied`, and nothing more goes to them.
    pub fn failed(&mut self, dead: &[Rank]) {
        let ended: Vec<(u32, u64)> = self
            .inflight
            .iter()
            .filter(|(_, f)| dead.contains(&f.to.rank))
            .map(|(k, _)| *k)
            .collect();
        for (local, token) in ended {
            // Waiting ones are answered when `pump_data` finds their daemon down.
            let waiting = self
                .locals
                .get(&local)
                .is_some_and(|l| l.waiting.iter().any(|w| w.token == token));
            if !waiting {
                self.answer(local, token, result_code(&Err(ClientError::NodeDown(0))));
            }
        }
        let names: Vec<ClientName> = self
            .watching
            .keys()
            .filter(|n| dead.contains(&n.rank))
            .copied()
            .collect();
        for n in names {
            self.gone_elsewhere(n, ExitReason::DaemonDied);
        }
        for l in self.locals.values_mut() {
            l.watchers.retain(|r| !dead.contains(r));
        }
        for r in dead {
            self.results.remove(r);
        }
        self.control.retain(|(to, _)| !dead.contains(to));
    }

    /// The next control message for another daemon.
    pub fn poll_control(&mut self) -> Option<(Rank, Bytes)> {
        self.control.pop_front()
    }

    /// The next event for the driver.
    pub fn poll_event(&mut self) -> Option<ClientEvent> {
        self.events.pop_front()
    }

    /// The daemon stops: everything is dropped (the driver closes every client's socket,
    /// which ends what its library waits for).
    pub fn stop(&mut self) {
        self.locals.clear();
        self.inflight.clear();
        self.turns.clear();
        self.watching.clear();
        self.results.clear();
        self.control.clear();
    }

    pub fn counters(&self) -> ClientCounters {
        ClientCounters {
            live: self.locals.len() as u64,
            ..self.counters
        }
    }

    /// Whether a pump has nothing to do here: no send waits, no control message is queued.
    pub fn is_idle(&self) -> bool {
        self.turns.is_empty() && self.control.is_empty() && self.results.is_empty()
    }

    /// The client's job, if it is connected here.
    pub fn job_of(&self, local: u32) -> Option<JobId> {
        self.locals.get(&local).map(|l| l.job)
    }

    /// Checks the core's bookkeeping (the simulator and tests call it).
    pub fn check_invariants(&self) -> Result<(), String> {
        for (local, l) in &self.locals {
            let n = self.inflight.keys().filter(|(c, _)| c == local).count();
            if n != l.unanswered {
                return Err(format!(
                    "client {local}: {} unanswered counted, {n} in the table",
                    l.unanswered
                ));
            }
            if !l.waiting.is_empty() && !self.turns.contains(local) {
                return Err(format!("client {local} has waiting sends and no turn"));
            }
        }
        if self
            .inflight
            .keys()
            .any(|(c, _)| !self.locals.contains_key(c))
        {
            return Err("a send in flight from a client that is gone".into());
        }
        Ok(())
    }
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
