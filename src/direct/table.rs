//! [`DirectLinks`]: one daemon's direct links (their states), the denial cache, the `auto`
//! policy's traffic windows and the counters. Sans-IO: `now` comes in, control messages to
//! send over the tree come out of [`DirectLinks::poll_control`].

use super::wire::{DIRECT_VERSION, DenyReason, DirectMsg};
use super::{Route, RouteSetting};
use crate::Rank;
use crate::counters::DirectCounters;
use crate::fxhash::FxHashMap;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The direct-link settings (from `Config`).
#[derive(Debug, Clone, Copy)]
pub struct DirectConfig {
    pub setting: RouteSetting,
    /// Links in any state (asked for, granted, open) at once.
    pub links_max: usize,
    /// `auto`: ask once a destination took more than this many messages within the window.
    pub auto_messages: u64,
    /// `auto`: ... or more than this many payload bytes.
    pub auto_bytes: u64,
    pub auto_window: Duration,
    /// How long a denial is remembered (no new request to that daemon meanwhile).
    pub denial_ttl: Duration,
    /// How long a request (or a grant) waits for its answer.
    pub request_timeout: Duration,
}

impl DirectConfig {
    /// The settings of `c`.
    pub fn from_config(c: &crate::config::Config) -> DirectConfig {
        DirectConfig {
            setting: c.route,
            links_max: c.direct_links_max,
            auto_messages: c.direct_auto_messages,
            auto_bytes: c.direct_auto_bytes,
            auto_window: Duration::from_millis(c.direct_auto_window_ms),
            denial_ttl: Duration::from_millis(c.direct_denial_ms),
            request_timeout: Duration::from_millis(c.direct_request_ms),
        }
    }
}

/// Which way a message goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Tree,
    Direct,
    /// The link to the destination is closing: the message waits (in order) until
    /// [`LinkEvent::Release`], then takes the tree.
    Hold,
}

/// How the connection of a link that ends is to be treated ([`DirectLinks::ends`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Closing: what goes to the peer waits for [`LinkEvent::Release`], then takes the tree.
    Closing,
    /// Fenced: what goes to the peer takes the tree at once.
    Fenced,
}

/// What the node must do for a link besides sending control messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkEvent {
    /// The messages held for this daemon while its link closed take the tree now, in order.
    Release(Rank),
    /// This end is done with the connection to this daemon (nothing more is written or read
    /// on it): close it, giving the tree anything not yet written.
    Shut(Rank),
}

/// A link's state (PVM's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Asked, waiting for the answer; messages take the tree. The link's `id` is the
    /// request's number until the grant names the link.
    ConnWait,
    /// Granted, waiting for the requester's `Switch`; this daemon's messages still take the
    /// tree, and the link is not read yet.
    GrantWait,
    /// A grant whose `Switch` did not come within `direct_request_ms`: no longer counted
    /// against `direct_links_max`, sent again at each `direct_request_ms` (up to
    /// [`DIRECT_MARKER_POKES_MAX`] times), still waiting for the requester's answer, `Switch`
    /// or `Withdraw`, which it sends to every copy. A late `Switch` opens the link (or,
    /// without room, opens and at once closes it gracefully), so nothing the requester wrote
    /// there is lost or read early.
    ///
    /// [`DIRECT_MARKER_POKES_MAX`]: crate::limits::DIRECT_MARKER_POKES_MAX
    Expired,
    /// The requester switched: its messages take the link; it does not read the link until
    /// the grantor's `Ready`.
    Switched,
    /// Both ways on the link.
    Open,
    /// Evicting: `Close` was the last frame written on the link; messages wait until the
    /// other end's `CloseAck` (it has read everything this end wrote there).
    Closing,
    /// The other end evicts: `CloseAck` was the last frame written on the link; messages wait
    /// for its `Shut` over the tree (it has read everything this end wrote there).
    Draining,
    /// Given up by this end after a marker never came (an expired grant's `Switch`, a
    /// switch's `Ready`) while the other end may still write on the link: the node closes the
    /// connection (what it held is lost, as on a lost link), messages take the tree, and the
    /// link is never read until the connection is gone or `direct_request_ms` passes. Without
    /// this, a frame the other end wrote on the link could be read ahead of its older tree
    /// messages.
    Fenced,
}

impl Phase {
    /// Counted against `direct_links_max` (a closing link is on its way out).
    fn active(self) -> bool {
        matches!(
            self,
            Phase::ConnWait | Phase::GrantWait | Phase::Switched | Phase::Open
        )
    }
    /// This daemon's messages take the link.
    fn writes(self) -> bool {
        matches!(self, Phase::Switched | Phase::Open)
    }
    fn closing(self) -> bool {
        matches!(self, Phase::Closing | Phase::Draining)
    }
    /// The link must not be read yet (or any more).
    fn unread(self) -> bool {
        matches!(
            self,
            Phase::ConnWait | Phase::GrantWait | Phase::Expired | Phase::Switched | Phase::Fenced
        )
    }
    /// Whether a new request from the other end must wait (denied `Epoch`): this end still
    /// settles an earlier link with it.
    fn settling(self) -> bool {
        matches!(
            self,
            Phase::Expired | Phase::Closing | Phase::Draining | Phase::Fenced
        )
    }
}

#[derive(Debug, Clone, Copy)]
struct Link {
    phase: Phase,
    /// When the phase began (the deadline of a wait runs from it).
    since: Instant,
    /// The last message this daemon sent on it (eviction picks the least recently used).
    used: Instant,
    /// Its id (the grantor's, in `Grant`; the request's number while asked for): messages
    /// about another id are about an earlier link between the same two daemons.
    id: u32,
    /// The number of the request it answers (at the grantor: its `Grant` may be sent again).
    ask: u32,
    /// How many times this end asked again for the marker it waits for.
    pokes: u32,
}

impl Link {
    fn new(phase: Phase, now: Instant, id: u32, ask: u32) -> Link {
        Link {
            phase,
            since: now,
            used: now,
            id,
            ask,
            pokes: 0,
        }
    }
}

/// What the table needs to know of the node when a request arrives.
#[derive(Debug, Clone, Copy)]
pub struct Asker {
    pub from: Rank,
    /// `from` is this daemon's tree neighbour.
    pub neighbour: bool,
    pub my_epoch: u64,
    pub stopping: bool,
}

/// A traffic window of the `auto` policy.
#[derive(Debug, Clone, Copy)]
struct Window {
    start: Instant,
    messages: u64,
    bytes: u64,
}

/// One daemon's direct links. See the module documentation of [`crate::direct`].
#[derive(Debug)]
pub struct DirectLinks {
    me: Rank,
    cfg: DirectConfig,
    links: FxHashMap<Rank, Link>,
    /// Peer -> (reason, until when), at most `DIRECT_DENIALS_MAX`.
    denials: FxHashMap<Rank, (DenyReason, Instant)>,
    traffic: FxHashMap<Rank, Window>,
    control: VecDeque<(Rank, DirectMsg)>,
    events: VecDeque<LinkEvent>,
    stats: DirectCounters,
    /// Bumped whenever a link may have changed state ([`DirectLinks::generation`]).
    generation: u64,
    /// The id of the last link this daemon granted.
    last_id: u32,
    /// The number of the last request this daemon sent.
    last_ask: u32,
}

impl DirectLinks {
    pub fn new(me: Rank, cfg: DirectConfig) -> DirectLinks {
        DirectLinks {
            me,
            cfg,
            links: FxHashMap::default(),
            denials: FxHashMap::default(),
            traffic: FxHashMap::default(),
            control: VecDeque::new(),
            events: VecDeque::new(),
            stats: DirectCounters::default(),
            generation: 0,
            last_id: 0,
            last_ask: 0,
        }
    }

    /// Changes whenever an answer of [`DirectLinks::is_direct`] or
    /// [`DirectLinks::may_read`] may have changed.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The counters, with the links open now.
    pub fn counters(&self) -> DirectCounters {
        let mut c = self.stats.clone();
        c.links_open = self.links.values().filter(|l| l.phase.writes()).count() as u64;
        c
    }

    /// The route of a frame of `messages` user messages (more than one: a batch frame) with
    /// `len` payload bytes in all, originated here for `dst` (not this daemon, not a tree
    /// neighbour), and whether to ask for a link: counts them, and queues a request when the
    /// policy says so. `requester` gives this daemon's epoch and URI for it.
    pub fn route(
        &mut self,
        now: Instant,
        dst: Rank,
        messages: u64,
        len: usize,
        route: Option<Route>,
        requester: impl FnOnce() -> (u64, String),
    ) -> Via {
        let phase = self.links.get(&dst).map(|l| l.phase);
        if phase.is_some_and(Phase::writes) {
            self.stats.direct_messages += messages;
            self.stats.direct_bytes += len as u64;
            if let Some(l) = self.links.get_mut(&dst) {
                l.used = now;
            }
            return Via::Direct;
        }
        self.stats.tree_messages += messages;
        self.stats.tree_bytes += len as u64;
        if phase.is_some_and(Phase::closing) {
            return Via::Hold;
        }
        if phase.is_some() {
            return Via::Tree;
        }
        let ask = match route {
            Some(Route::Tree) => false,
            Some(Route::Direct) => true,
            None => match self.cfg.setting {
                RouteSetting::Tree => false,
                RouteSetting::Direct => true,
                RouteSetting::Auto => self.busy_destination(now, dst, messages, len),
            },
        };
        if ask {
            self.generation += 1;
            self.ask(now, dst, messages, requester);
        }
        Via::Tree
    }

    /// `auto`: counts a message in `dst`'s window; whether the window is past a threshold.
    fn busy_destination(&mut self, now: Instant, dst: Rank, messages: u64, len: usize) -> bool {
        let w = self.traffic.entry(dst).or_insert(Window {
            start: now,
            messages: 0,
            bytes: 0,
        });
        if now.saturating_duration_since(w.start) > self.cfg.auto_window {
            *w = Window {
                start: now,
                messages: 0,
                bytes: 0,
            };
        }
        w.messages += messages;
        w.bytes += len as u64;
        w.messages > self.cfg.auto_messages || w.bytes > self.cfg.auto_bytes
    }

    fn ask(
        &mut self,
        now: Instant,
        dst: Rank,
        messages: u64,
        requester: impl FnOnce() -> (u64, String),
    ) {
        if let Some(&(_, until)) = self.denials.get(&dst) {
            if now < until {
                self.stats.denial_cache_hits += messages;
                return;
            }
            self.denials.remove(&dst);
        }
        let full = self.active() >= self.cfg.links_max && !self.evict(now);
        // Closing links count too, up to as many again (they end within `direct_request_ms`).
        if full || self.links.len() >= 2 * self.cfg.links_max {
            // No room here: the message simply takes the tree.
            self.stats.no_room += 1;
            return;
        }
        let (epoch, uri) = requester();
        self.last_ask = self.last_ask.wrapping_add(1).max(1);
        let ask = self.last_ask;
        self.links
            .insert(dst, Link::new(Phase::ConnWait, now, ask, ask));
        self.traffic.remove(&dst);
        self.stats.requests_sent += 1;
        log::debug!("rank {}: asking rank {dst} for a direct link", self.me);
        self.control.push_back((
            dst,
            DirectMsg::Request {
                version: DIRECT_VERSION,
                epoch,
                uri,
                ask,
            },
        ));
    }

    /// Links counted against `direct_links_max`.
    fn active(&self) -> usize {
        self.links.values().filter(|l| l.phase.active()).count()
    }

    /// Starts closing the least recently used open link that carried nothing from this end
    /// for `direct_auto_window_ms` (ties: the lower rank); whether there was one. Its last
    /// frame on the link is `Close`.
    fn evict(&mut self, now: Instant) -> bool {
        let idle = self.cfg.auto_window;
        let Some(peer) = self
            .links
            .iter()
            .filter(|(_, l)| {
                l.phase == Phase::Open && now.saturating_duration_since(l.used) >= idle
            })
            .min_by_key(|(r, l)| (l.used, **r))
            .map(|(r, _)| *r)
        else {
            return false;
        };
        // A closing link is bounded by the active ones it came from: at most as many again.
        if self.links.len() >= 2 * self.cfg.links_max {
            return false;
        }
        self.generation += 1;
        if let Some(l) = self.links.get_mut(&peer) {
            l.phase = Phase::Closing;
            l.since = now;
        }
        self.stats.links_evicted += 1;
        let id = self.links.get(&peer).map_or(0, |l| l.id);
        log::debug!(
            "rank {}: evicting the idle direct link {id} to rank {peer}",
            self.me
        );
        self.control.push_back((peer, DirectMsg::Close(id)));
        true
    }

    /// A link in any state ends: what waits for it takes the tree.
    fn end(&mut self, peer: Rank) -> Option<Phase> {
        let l = self.links.remove(&peer)?;
        if l.phase.closing() {
            self.events.push_back(LinkEvent::Release(peer));
        }
        Some(l.phase)
    }

    /// The next thing the node must do for a link: release held messages, shut a connection.
    pub fn poll_event(&mut self) -> Option<LinkEvent> {
        self.events.pop_front()
    }

    /// A control message from `who.from`: over the tree, or (`Close`, `CloseAck`) on the
    /// link, where each is the last frame its sender writes.
    pub fn handle_message(&mut self, now: Instant, who: Asker, msg: DirectMsg) {
        self.generation += 1;
        let from = who.from;
        let phase = self.links.get(&from).map(|l| l.phase);
        log::trace!("rank {}: {msg:?} from {from} in {phase:?}", self.me);
        match msg {
            DirectMsg::Request {
                version,
                epoch,
                ask,
                ..
            } => {
                self.stats.requests_received += 1;
                let deny = if who.stopping {
                    Some(DenyReason::Stopping)
                } else if self.cfg.setting == RouteSetting::Tree {
                    Some(DenyReason::Policy)
                } else if version != DIRECT_VERSION {
                    Some(DenyReason::Version)
                } else if who.neighbour {
                    Some(DenyReason::Neighbour)
                } else if epoch != who.my_epoch {
                    Some(DenyReason::Epoch)
                } else if phase == Some(Phase::ConnWait) && from > self.me {
                    // Both asked: the lower rank's request wins, and this is the lower rank.
                    Some(DenyReason::Crossed)
                } else if phase.is_none()
                    && ((self.active() >= self.cfg.links_max && !self.evict(now))
                        || self.links.len() >= 2 * self.cfg.links_max)
                {
                    Some(DenyReason::Full)
                } else if phase.is_some_and(Phase::settling) {
                    // Asked again before the close finished: ask once it has (this end may
                    // hold messages that must take the tree before a new link's).
                    Some(DenyReason::Epoch)
                } else {
                    None
                };
                match deny {
                    Some(r) => {
                        if r != DenyReason::Crossed {
                            self.stats.denials_sent += 1;
                        }
                        log::debug!(
                            "rank {}: denied rank {from} a direct link ({})",
                            self.me,
                            r.name()
                        );
                        self.control.push_back((from, DirectMsg::Deny(r)));
                    }
                    None => {
                        // A new grant, or one again for a requester that lost its state (its
                        // link was lost, or its request crossed ours and won). A link this end
                        // wrote on is given up first (the node closes its connection, see
                        // `on_direct_message`): its messages take the tree until `Switch`.
                        self.stats.grants += 1;
                        self.last_id = self.last_id.wrapping_add(1).max(1);
                        let id = self.last_id;
                        self.links
                            .insert(from, Link::new(Phase::GrantWait, now, id, ask));
                        log::debug!("rank {}: granted rank {from} direct link {id}", self.me);
                        self.control.push_back((from, DirectMsg::Grant { id, ask }));
                    }
                }
            }
            DirectMsg::Grant { id, ask } => match self.links.get(&from) {
                Some(l) if l.phase == Phase::ConnWait && l.id == ask => {
                    self.links
                        .insert(from, Link::new(Phase::Switched, now, id, ask));
                    self.control.push_back((from, DirectMsg::Switch(id)));
                }
                // The grantor asks again for its `Switch` (it may have been lost).
                Some(l) if matches!(l.phase, Phase::Switched | Phase::Open) && l.id == id => {
                    self.control.push_back((from, DirectMsg::Switch(id)));
                }
                // Given up here already (and `Withdraw` sent).
                Some(l) if l.phase == Phase::Fenced => {}
                // Nobody waits for it here any more (the request timed out, and maybe another
                // was sent since): the grantor forgets it. It wrote nothing on the link.
                _ => self.control.push_back((from, DirectMsg::Withdraw(id))),
            },
            DirectMsg::Deny(r) => {
                if phase == Some(Phase::ConnWait) && r != DenyReason::Crossed {
                    self.links.remove(&from);
                    self.denied(now, from, r);
                }
            }
            DirectMsg::Switch(id) => {
                let late = phase == Some(Phase::Expired);
                let room = self.active() < self.cfg.links_max;
                if let Some(l) = self.links.get_mut(&from)
                    && matches!(l.phase, Phase::GrantWait | Phase::Expired)
                    && l.id == id
                {
                    // Every tree message of the requester's before the link was read: read
                    // the link, and write there after `Ready`, this end's drain marker.
                    l.phase = Phase::Open;
                    l.since = now;
                    l.used = now;
                    self.stats.links_opened += 1;
                    self.control.push_back((from, DirectMsg::Ready(id)));
                    if late && !room {
                        // No room for it any more: closed as an eviction is, losing nothing.
                        l.phase = Phase::Closing;
                        self.stats.links_evicted += 1;
                        self.control.push_back((from, DirectMsg::Close(id)));
                    }
                } else {
                    self.unknown_marker(from, id, true);
                }
            }
            DirectMsg::Ready(id) => {
                if let Some(l) = self.links.get_mut(&from)
                    && l.phase == Phase::Switched
                    && l.id == id
                {
                    l.phase = Phase::Open;
                    l.since = now;
                    self.stats.links_opened += 1;
                } else {
                    self.unknown_marker(from, id, false);
                }
            }
            // The peer gave the link up (a late grant, a grant it never switched to, a
            // connection it could not make): this end stops using it too. If this end wrote
            // or read there, the node closes the connection (what is unread there is lost, as
            // on a lost link): nothing written on it before may be read after tree messages
            // sent after.
            DirectMsg::Withdraw(id) => {
                let ours = self.links.get(&from).is_some_and(|l| {
                    l.id == id || (id == 0 && matches!(l.phase, Phase::GrantWait | Phase::Expired))
                });
                // A fenced link stays fenced until its connection is gone.
                if ours && !matches!(phase, Some(Phase::ConnWait | Phase::Fenced)) {
                    log::debug!(
                        "rank {}: rank {from} gave up direct link {id} ({phase:?} here)",
                        self.me
                    );
                    self.end(from);
                    self.stats.fallbacks += 1;
                }
            }
            // The other end evicts: everything it wrote on the link has been read.
            DirectMsg::Close(id) if self.links.get(&from).is_some_and(|l| l.id == id) => {
                match phase {
                    Some(Phase::Open) => {
                        if let Some(l) = self.links.get_mut(&from) {
                            l.phase = Phase::Draining;
                            l.since = now;
                        }
                        self.control.push_back((from, DirectMsg::CloseAck(id)));
                    }
                    // Both evict at once: each answers the other's `Close` and waits for the
                    // answer to its own.
                    Some(Phase::Closing) => self.control.push_back((from, DirectMsg::CloseAck(id))),
                    _ => {}
                }
            }
            // The other end read everything this one wrote on the link: this end's messages
            // may take the tree, and it is done with the connection.
            DirectMsg::CloseAck(id) if self.links.get(&from).is_some_and(|l| l.id == id) => {
                if phase == Some(Phase::Closing) {
                    self.end(from);
                    self.events.push_back(LinkEvent::Shut(from));
                    self.control.push_back((from, DirectMsg::Shut(id)));
                }
            }
            DirectMsg::Shut(id) if self.links.get(&from).is_some_and(|l| l.id == id) => {
                if phase == Some(Phase::Draining) {
                    self.end(from);
                }
            }
            // Still closing: `CloseAck` was not read yet, and `Shut` follows when it is.
            DirectMsg::AskShut(id)
                if self
                    .links
                    .get(&from)
                    .is_some_and(|l| l.id == id && l.phase == Phase::Closing) => {}
            // Done with that link: `Shut` again (the first may have been lost).
            DirectMsg::AskShut(id) => self.control.push_back((from, DirectMsg::Shut(id))),
            // About an earlier link between the two: stale.
            DirectMsg::Close(_) | DirectMsg::CloseAck(_) | DirectMsg::Shut(_) => {
                log::debug!(
                    "rank {}: a stale direct-link message from rank {from}",
                    self.me
                );
            }
        }
    }

    /// A `Switch` or `Ready` for a link this end does not wait on: a copy sent again for a
    /// link that opened (a `Switch` copy is answered with `Ready` again, which may have been
    /// lost), or one this end lost the state of (e.g. with its connection): then the other
    /// end, which writes on it now, is told to give it up, unless this end already did.
    fn unknown_marker(&mut self, from: Rank, id: u32, switch: bool) {
        let phase = self
            .links
            .get(&from)
            .filter(|l| l.id == id)
            .map(|l| l.phase);
        if switch && matches!(phase, Some(Phase::Open | Phase::Closing | Phase::Draining)) {
            self.control.push_back((from, DirectMsg::Ready(id)));
            return;
        }
        let known = phase.is_some()
            || self
                .links
                .get(&from)
                .is_some_and(|l| l.phase == Phase::Fenced);
        if !known {
            log::debug!(
                "rank {}: a marker for direct link {id} from rank {from}, not waited for",
                self.me
            );
            self.control.push_back((from, DirectMsg::Withdraw(id)));
        }
    }

    /// Records a denial for `peer` (counted by reason, cached for `denial_ttl`).
    fn denied(&mut self, now: Instant, peer: Rank, r: DenyReason) {
        self.stats.count_denial(r);
        log::debug!(
            "rank {}: rank {peer} denied a direct link ({})",
            self.me,
            r.name()
        );
        if self.denials.len() >= crate::limits::DIRECT_DENIALS_MAX
            && !self.denials.contains_key(&peer)
            && let Some(oldest) = self
                .denials
                .iter()
                .min_by_key(|(r, (_, until))| (*until, **r))
                .map(|(r, _)| *r)
        {
            self.denials.remove(&oldest);
        }
        self.denials.insert(peer, (r, now + self.cfg.denial_ttl));
    }

    /// How long a link waits in `phase` before [`DirectLinks::handle_timeout`] moves it on.
    fn wait(&self, phase: Phase) -> Option<Duration> {
        let t = self.cfg.request_timeout;
        match phase {
            Phase::Open => None,
            // `CloseAck` rides the link itself: only the connection's loss (handled as such)
            // or a peer that stops reading delays it.
            Phase::Closing => Some(t.saturating_mul(crate::limits::DIRECT_MARKER_POKES_MAX)),
            // The others ask again for their marker at each wait's end.
            Phase::ConnWait
            | Phase::GrantWait
            | Phase::Expired
            | Phase::Switched
            | Phase::Draining
            | Phase::Fenced => Some(t),
        }
    }

    /// Waits that ended: a request unanswered is denied (`Timeout`); a grant unanswered is no
    /// longer counted (`Expired`) and, much later, given up and fenced; a switch whose `Ready`
    /// never came likewise; a fenced link is done; a close that heard nothing releases what
    /// waits. Returns the peers whose connection the node must close (through
    /// `Output::Fallback`, which gives the tree whatever was queued for it).
    pub fn handle_timeout(&mut self, now: Instant) -> Vec<Rank> {
        self.generation += 1;
        let mut expired: Vec<(Rank, Link)> = self
            .links
            .iter()
            .filter(|(_, l)| {
                self.wait(l.phase)
                    .is_some_and(|w| now.saturating_duration_since(l.since) >= w)
            })
            .map(|(r, l)| (*r, *l))
            .collect();
        expired.sort_unstable_by_key(|(r, _)| *r);
        let mut close = Vec::new();
        for (peer, link) in expired {
            let Link {
                phase, id, pokes, ..
            } = link;
            let poke = pokes < crate::limits::DIRECT_MARKER_POKES_MAX;
            if poke
                && matches!(
                    phase,
                    Phase::GrantWait | Phase::Expired | Phase::Switched | Phase::Draining
                )
            {
                // The marker is late, or was lost with a tree connection: asked for again
                // (the answer to a copy is a copy; each end ignores a second one).
                if let Some(l) = self.links.get_mut(&peer) {
                    if l.phase == Phase::GrantWait {
                        // No longer counted against `direct_links_max`.
                        l.phase = Phase::Expired;
                    }
                    l.since = now;
                    l.pokes += 1;
                }
                let again = match phase {
                    Phase::Switched => DirectMsg::Switch(id),
                    Phase::Draining => DirectMsg::AskShut(id),
                    _ => DirectMsg::Grant { id, ask: link.ask },
                };
                self.control.push_back((peer, again));
                continue;
            }
            log::debug!(
                "rank {}: direct link {id} with rank {peer}: no answer in {phase:?}",
                self.me
            );
            match phase {
                Phase::ConnWait => {
                    // Whatever grant answers the request (id 0: not known here). The grantor
                    // writes nothing on the link before `Switch`, so nothing is fenced.
                    self.end(peer);
                    self.denied(now, peer, DenyReason::Timeout);
                    self.control.push_back((peer, DirectMsg::Withdraw(0)));
                }
                Phase::GrantWait | Phase::Expired | Phase::Switched => {
                    // Asked for too often (the tree keeps losing it, or is overloaded beyond
                    // reason): the other end is told, and whatever it wrote on the link is
                    // never read here.
                    self.stats.fallbacks += 1;
                    if phase == Phase::Switched {
                        self.denied(now, peer, DenyReason::Timeout);
                    }
                    if let Some(l) = self.links.get_mut(&peer) {
                        l.phase = Phase::Fenced;
                        l.since = now;
                    }
                    self.control.push_back((peer, DirectMsg::Withdraw(id)));
                    close.push(peer);
                }
                Phase::Fenced => {
                    self.end(peer);
                    close.push(peer);
                }
                Phase::Closing | Phase::Draining => {
                    // The other end went quiet while the link closed: what waits takes the
                    // tree.
                    self.end(peer);
                    self.control.push_back((peer, DirectMsg::Withdraw(id)));
                    close.push(peer);
                }
                Phase::Open => {}
            }
        }
        close
    }

    /// When [`DirectLinks::handle_timeout`] is next due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        // Asked once per loop turn: an empty table (the common case) is not scanned.
        if self.links.is_empty() {
            return None;
        }
        self.links
            .values()
            .filter_map(|l| Some(l.since + self.wait(l.phase)?))
            .min()
    }

    /// The next control message to send over the tree, with its destination.
    pub fn poll_control(&mut self) -> Option<(Rank, DirectMsg)> {
        self.control.pop_front()
    }

    /// Whether this daemon's messages to `dst` take a direct link.
    pub fn is_direct(&self, dst: Rank) -> bool {
        self.links.get(&dst).is_some_and(|l| l.phase.writes())
    }

    /// Whether `peer`'s own messages to this daemon may be read: not while a drain marker from
    /// it is awaited (its direct messages must wait for its tree messages before the switch),
    /// nor once the link is fenced. The node keeps them meanwhile (`node/marker_wait.rs`) and
    /// reads the rest of the connection.
    pub fn may_read(&self, peer: Rank) -> bool {
        // Every read of every connection asks: the common answer needs no lookup.
        self.links.is_empty() || !self.links.get(&peer).is_some_and(|l| l.phase.unread())
    }

    /// Whether no link is asked for, granted, open or closing.
    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    /// Whether the connection to `peer` must carry nothing more from this end: its link
    /// closes (`Close` or `CloseAck` was the last frame this end wrote there) or was fenced
    /// (the node closes the connection). Frames the node would write straight to `peer`
    /// (not by the tree) then take the tree instead, held behind the link's close as messages
    /// are ([`Via::Hold`]); written on the connection, they would be lost with it (simulator
    /// seed 66614: rank 0's `Settled` to a daemon it had just evicted).
    pub fn ends(&self, peer: Rank) -> Option<Ending> {
        // Asked for every message a daemon sends or relays: the common answer needs no lookup.
        if self.links.is_empty() {
            return None;
        }
        match self.links.get(&peer)?.phase {
            Phase::Closing | Phase::Draining => Some(Ending::Closing),
            Phase::Fenced => Some(Ending::Fenced),
            _ => None,
        }
    }

    /// Daemons whose link is closing (`Close` sent or read, `Shut` not yet), ascending.
    pub fn closing_peers(&self) -> Vec<Rank> {
        let mut v: Vec<Rank> = self
            .links
            .iter()
            .filter(|(_, l)| l.phase.closing())
            .map(|(r, _)| *r)
            .collect();
        v.sort_unstable();
        v
    }

    /// Daemons with a link in any state (ascending).
    pub fn peers(&self) -> Vec<Rank> {
        let mut v: Vec<Rank> = self.links.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// `peer` failed: its link (in any state) is gone; a request to it ends denied.
    pub fn handle_peer_failed(&mut self, peer: Rank) {
        self.generation += 1;
        self.traffic.remove(&peer);
        self.denials.remove(&peer);
        if self.end(peer) == Some(Phase::ConnWait) {
            self.stats.count_denial(DenyReason::PeerDead);
        }
    }

    /// `peer` became a tree neighbour (a repair): the tree links the two directly now, over
    /// the one connection two daemons keep, so the direct link's state is dropped.
    pub fn handle_became_neighbour(&mut self, peer: Rank) {
        self.generation += 1;
        self.end(peer);
        self.traffic.remove(&peer);
    }

    /// The connection with `peer` was lost: whether a direct link used it (then this daemon's
    /// messages to `peer` take the tree from now on, and what was queued for it must too). A
    /// request still waiting stays: its answer comes over the tree.
    pub fn handle_link_lost(&mut self, peer: Rank) -> bool {
        self.generation += 1;
        match self.links.get(&peer).map(|l| l.phase) {
            Some(Phase::Switched | Phase::Open | Phase::Closing) => {
                self.end(peer);
                self.stats.fallbacks += 1;
                true
            }
            // What it held is gone with it: the fence is done.
            Some(Phase::Fenced) => {
                self.end(peer);
                false
            }
            // A grant waiting for its `Switch` does not use the connection yet (one lost now
            // is an earlier link's; the requester learns of its own loss); the evicting end closes the connection once it has read
            // `CloseAck`, and this end waits for its `Shut` over the tree.
            _ => false,
        }
    }

    /// The connection with `peer` could not be made within the driver's reconnect attempts.
    /// That is no failure of `peer` (a direct link is never a tree edge; the tree's links and
    /// heartbeats decide failures): a link that used it ends as a lost one does, and no request
    /// goes to `peer` for `direct_denial_ms` (a cached `Unreachable`), so that an unreachable
    /// address is not dialled at every message. Returns whether messages took the link.
    pub fn handle_unreachable(&mut self, now: Instant, peer: Rank) -> bool {
        let id = self.links.get(&peer).map_or(0, |l| l.id);
        let fell_back = self.handle_link_lost(peer);
        if fell_back {
            // The peer may reach this daemon's end and go on using the link: tell it.
            self.control.push_back((peer, DirectMsg::Withdraw(id)));
        }
        self.denied(now, peer, DenyReason::Unreachable);
        fell_back
    }

    /// Checks the table's bounds.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.active() > self.cfg.links_max || self.links.len() > 2 * self.cfg.links_max {
            return Err(format!(
                "{} direct links ({} active), direct_links_max {}",
                self.links.len(),
                self.active(),
                self.cfg.links_max
            ));
        }
        if self.denials.len() > crate::limits::DIRECT_DENIALS_MAX {
            return Err(format!("{} denials cached", self.denials.len()));
        }
        if self.links.contains_key(&self.me) {
            return Err("a direct link to itself".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(setting: RouteSetting, links_max: usize) -> DirectConfig {
        DirectConfig {
            setting,
            links_max,
            auto_messages: 3,
            auto_bytes: 1000,
            auto_window: Duration::from_millis(100),
            denial_ttl: Duration::from_secs(1),
            request_timeout: Duration::from_secs(5),
        }
    }

    fn asker(from: Rank) -> Asker {
        Asker {
            from,
            neighbour: false,
            my_epoch: 0,
            stopping: false,
        }
    }

    fn me() -> (u64, String) {
        (0, String::new())
    }

    /// Carries every control message between `a` and `b` until neither has any.
    fn exchange(now: Instant, a: &mut DirectLinks, b: &mut DirectLinks) {
        for _ in 0..16 {
            let mut moved = false;
            while let Some((to, m)) = a.poll_control() {
                assert_eq!(to, b.me);
                b.handle_message(now, asker(a.me), m);
                moved = true;
            }
            while let Some((to, m)) = b.poll_control() {
                assert_eq!(to, a.me);
                a.handle_message(now, asker(b.me), m);
                moved = true;
            }
            if !moved {
                return;
            }
        }
        panic!("the exchange does not settle");
    }

    #[test]
    fn a_grant_opens_both_ends_and_reading_waits_for_the_markers() {
        let t = Instant::now();
        let mut a = DirectLinks::new(7, cfg(RouteSetting::Direct, 4));
        let mut b = DirectLinks::new(14, cfg(RouteSetting::Auto, 4));
        assert_eq!(a.route(t, 14, 1, 8, None, me), Via::Tree);
        assert!(!a.may_read(14), "ConnWait: nothing is read on the link");
        let (to, req) = a.poll_control().unwrap();
        assert_eq!(to, 14);
        b.handle_message(t, asker(7), req);
        assert!(
            !b.is_direct(7) && !b.may_read(7),
            "GrantWait: sends over the tree, reads wait for Switch"
        );
        assert_eq!(b.route(t, 7, 1, 8, None, me), Via::Tree);
        let (_, grant) = b.poll_control().unwrap();
        assert_eq!(grant, DirectMsg::Grant { id: 1, ask: 1 });
        a.handle_message(t, asker(14), grant);
        assert!(
            a.is_direct(14) && !a.may_read(14),
            "Switched: sends direct, reads wait for Ready"
        );
        assert_eq!(a.route(t, 14, 1, 8, None, me), Via::Direct);
        let (_, switch) = a.poll_control().unwrap();
        assert_eq!(switch, DirectMsg::Switch(1));
        b.handle_message(t, asker(7), switch);
        assert!(b.may_read(7) && b.is_direct(7));
        assert_eq!(b.route(t, 7, 1, 8, None, me), Via::Direct);
        let (_, ready) = b.poll_control().unwrap();
        assert_eq!(ready, DirectMsg::Ready(1));
        a.handle_message(t, asker(14), ready);
        assert!(a.may_read(14));
        assert_eq!(a.counters().links_open, 1);
        assert_eq!(b.counters().links_open, 1);
        assert_eq!(a.counters().requests_sent, 1);
    }

    #[test]
    fn an_unreachable_peer_falls_back_and_is_not_asked_again_soon() {
        let t = Instant::now();
        let mut a = DirectLinks::new(1, cfg(RouteSetting::Direct, 4));
        let mut b = DirectLinks::new(2, cfg(RouteSetting::Direct, 4));
        a.route(t, 2, 1, 8, None, me);
        exchange(t, &mut a, &mut b);
        assert!(a.is_direct(2) && b.is_direct(1));
        assert!(
            b.handle_unreachable(t, 1),
            "the grantor's messages took the link"
        );
        assert!(!b.is_direct(1));
        assert_eq!(b.poll_control(), Some((1, DirectMsg::Withdraw(1))));
        a.handle_message(t, asker(2), DirectMsg::Withdraw(1));
        assert!(!a.is_direct(2), "the other end gives the link up too");
        assert_eq!(b.counters().fallbacks, 1);
        assert_eq!(b.counters().denied_timeout, 1);
        b.route(t, 1, 1, 8, None, me);
        assert_eq!(b.counters().denial_cache_hits, 1, "no request while cached");
        assert!(b.poll_control().is_none());
        assert!(
            !a.handle_unreachable(t, 3),
            "no link to 3: nothing fell back"
        );
        b.check_invariants().unwrap();
        a.check_invariants().unwrap();
    }

    /// Opens a link from `a` to `b` (both tables) at `t`.
    fn open(t: Instant, a: &mut DirectLinks, b: &mut DirectLinks) {
        a.route(t, b.me, 1, 8, Some(Route::Direct), me);
        exchange(t, a, b);
        assert!(a.is_direct(b.me) && b.is_direct(a.me));
    }

    #[test]
    fn a_full_table_evicts_its_least_recently_used_idle_link_gracefully() {
        let t = Instant::now();
        let mut a = DirectLinks::new(1, cfg(RouteSetting::Direct, 2));
        let mut b = DirectLinks::new(2, cfg(RouteSetting::Direct, 4));
        let mut c = DirectLinks::new(3, cfg(RouteSetting::Direct, 4));
        let mut d = DirectLinks::new(4, cfg(RouteSetting::Direct, 4));
        open(t, &mut a, &mut b);
        open(t, &mut a, &mut c);
        // Both idle past the window; 3 was used more recently than 2.
        let t1 = t + Duration::from_millis(50);
        assert_eq!(a.route(t1, 3, 1, 8, None, me), Via::Direct);
        let t2 = t + Duration::from_millis(500);
        a.route(t2, 4, 1, 8, None, me);
        // 2 is evicted: `Close` is its last frame on the link, then the request to 4.
        assert_eq!(a.poll_control(), Some((2, DirectMsg::Close(1))));
        let request = a.poll_control();
        assert!(matches!(request, Some((4, DirectMsg::Request { .. }))));
        assert_eq!(a.counters().links_evicted, 1);
        assert_eq!(
            a.route(t2, 2, 1, 8, None, me),
            Via::Hold,
            "held while it closes"
        );
        assert!(
            a.may_read(2),
            "the evicting end reads the link up to CloseAck"
        );
        // The other end reads `Close`: its messages to 1 wait now, `CloseAck` goes last.
        // A Close about another (earlier) link is stale.
        b.handle_message(t2, asker(1), DirectMsg::Close(9));
        assert!(b.is_direct(1) && b.poll_control().is_none());
        b.handle_message(t2, asker(1), DirectMsg::Close(1));
        assert_eq!(b.route(t2, 1, 1, 8, None, me), Via::Hold);
        assert_eq!(b.poll_control(), Some((1, DirectMsg::CloseAck(1))));
        assert!(!b.handle_link_lost(1), "the connection's end is expected");
        a.handle_message(t2, asker(2), DirectMsg::CloseAck(1));
        assert_eq!(a.poll_event(), Some(LinkEvent::Release(2)));
        assert_eq!(a.poll_event(), Some(LinkEvent::Shut(2)));
        assert_eq!(a.poll_control(), Some((2, DirectMsg::Shut(1))));
        b.handle_message(t2, asker(1), DirectMsg::Shut(1));
        assert_eq!(b.poll_event(), Some(LinkEvent::Release(1)));
        assert_eq!(a.route(t2, 2, 1, 8, Some(Route::Tree), me), Via::Tree);
        assert_eq!(b.route(t2, 1, 1, 8, Some(Route::Tree), me), Via::Tree);
        // The new link opens in the room made.
        if let Some((_, m)) = request {
            d.handle_message(t2, asker(1), m);
        }
        exchange(t2, &mut a, &mut d);
        assert!(a.is_direct(4));
        for x in [&a, &b, &c, &d] {
            x.check_invariants().unwrap();
        }
    }

    #[test]
    fn a_busy_link_is_not_evicted_and_crossing_closes_finish() {
        let t = Instant::now();
        let mut a = DirectLinks::new(1, cfg(RouteSetting::Direct, 1));
        let mut b = DirectLinks::new(2, cfg(RouteSetting::Direct, 1));
        open(t, &mut a, &mut b);
        // Used within the window: no room, nothing evicted.
        a.route(t + Duration::from_millis(10), 3, 1, 8, None, me);
        assert_eq!(a.counters().no_room, 1);
        assert_eq!(a.counters().links_evicted, 0);
        // Both evict each other at once: each answers the other's Close and waits for its own.
        let t2 = t + Duration::from_secs(1);
        a.route(t2, 3, 1, 8, None, me);
        b.route(t2, 5, 1, 8, None, me);
        assert_eq!(a.poll_control(), Some((2, DirectMsg::Close(1))));
        assert_eq!(b.poll_control(), Some((1, DirectMsg::Close(1))));
        a.poll_control();
        b.poll_control();
        a.handle_message(t2, asker(2), DirectMsg::Close(1));
        b.handle_message(t2, asker(1), DirectMsg::Close(1));
        assert_eq!(a.poll_control(), Some((2, DirectMsg::CloseAck(1))));
        assert_eq!(b.poll_control(), Some((1, DirectMsg::CloseAck(1))));
        a.handle_message(t2, asker(2), DirectMsg::CloseAck(1));
        b.handle_message(t2, asker(1), DirectMsg::CloseAck(1));
        assert_eq!(a.poll_event(), Some(LinkEvent::Release(2)));
        assert_eq!(b.poll_event(), Some(LinkEvent::Release(1)));
        assert!(!a.peers().contains(&2) && !b.peers().contains(&1));
    }

    /// Rank 1 evicts its open link with rank 2 (room for one link each) to ask rank 3: the
    /// two tables, and when (after `Close`, and the request to 3, left rank 1).
    fn evicting() -> (DirectLinks, DirectLinks, Instant) {
        let t = Instant::now();
        let mut a = DirectLinks::new(1, cfg(RouteSetting::Direct, 1));
        let mut b = DirectLinks::new(2, cfg(RouteSetting::Direct, 1));
        open(t, &mut a, &mut b);
        let t2 = t + Duration::from_secs(1);
        a.route(t2, 3, 1, 8, None, me);
        assert_eq!(a.poll_control(), Some((2, DirectMsg::Close(1))));
        (a, b, t2)
    }

    #[test]
    fn a_close_that_hears_nothing_releases_after_the_marker_waits() {
        let (mut a, _, t2) = evicting();
        assert!(a.handle_timeout(t2 + Duration::from_secs(5)).is_empty());
        let later = t2 + Duration::from_secs(5 * u64::from(crate::limits::DIRECT_MARKER_POKES_MAX));
        assert_eq!(a.handle_timeout(later), vec![2]);
        assert_eq!(a.poll_event(), Some(LinkEvent::Release(2)));
    }

    /// `Shut` lost on the tree: the end that answered `Close` asks for it again, and the
    /// evicting end answers once it is done with the link (not while it still closes).
    #[test]
    fn a_lost_shut_is_asked_for_again() {
        let (mut a, mut b, t2) = evicting();
        a.poll_control();
        b.handle_message(t2, asker(1), DirectMsg::Close(1));
        assert_eq!(b.poll_control(), Some((1, DirectMsg::CloseAck(1))));
        let t3 = t2 + Duration::from_secs(5);
        assert!(b.handle_timeout(t3).is_empty());
        assert_eq!(b.poll_control(), Some((1, DirectMsg::AskShut(1))));
        a.handle_message(t3, asker(2), DirectMsg::AskShut(1));
        assert!(
            a.poll_control().is_none(),
            "CloseAck not read yet: Shut follows it"
        );
        a.handle_message(t3, asker(2), DirectMsg::CloseAck(1));
        assert_eq!(
            a.poll_control(),
            Some((2, DirectMsg::Shut(1))),
            "lost on the way"
        );
        let t4 = t3 + Duration::from_secs(5);
        assert!(b.handle_timeout(t4).is_empty());
        assert_eq!(b.poll_control(), Some((1, DirectMsg::AskShut(1))));
        a.handle_message(t4, asker(2), DirectMsg::AskShut(1));
        let (_, shut) = a.poll_control().unwrap();
        b.handle_message(t4, asker(1), shut);
        assert_eq!(b.poll_event(), Some(LinkEvent::Release(1)));
        assert!(b.peers().is_empty());
    }

    #[test]
    fn a_denial_is_cached_until_it_expires() {
        let t = Instant::now();
        let mut a = DirectLinks::new(1, cfg(RouteSetting::Direct, 4));
        let mut b = DirectLinks::new(2, cfg(RouteSetting::Tree, 4));
        a.route(t, 2, 1, 8, None, me);
        exchange(t, &mut a, &mut b);
        assert_eq!(a.counters().denied_policy, 1);
        assert_eq!(b.counters().denials_sent, 1);
        a.route(t, 2, 1, 8, None, me);
        assert_eq!(a.counters().denial_cache_hits, 1);
        assert!(a.poll_control().is_none());
        a.route(t + Duration::from_secs(2), 2, 1, 8, None, me);
        assert_eq!(
            a.counters().requests_sent,
            2,
            "asked again after the denial expired"
        );
    }

    #[test]
    fn crossed_requests_leave_one_grant() {
        let t = Instant::now();
        let mut a = DirectLinks::new(3, cfg(RouteSetting::Direct, 4));
        let mut b = DirectLinks::new(9, cfg(RouteSetting::Direct, 4));
        a.route(t, 9, 1, 8, None, me);
        b.route(t, 3, 1, 8, None, me);
        exchange(t, &mut a, &mut b);
        assert!(a.is_direct(9) && b.is_direct(3) && a.may_read(9) && b.may_read(3));
        assert_eq!(a.counters().grants + b.counters().grants, 1);
        assert_eq!(
            b.counters().grants,
            1,
            "the higher rank grants the lower's request"
        );
        let denied = |c: DirectCounters| c.denied_other + c.denials_sent;
        assert_eq!(denied(a.counters()) + denied(b.counters()), 0);
    }

    #[test]
    fn no_room_means_no_request_and_a_full_grantor_denies() {
        let t = Instant::now();
        let mut a = DirectLinks::new(1, cfg(RouteSetting::Direct, 1));
        a.route(t, 2, 1, 8, None, me);
        a.route(t, 3, 1, 8, None, me);
        assert_eq!(a.counters().requests_sent, 1);
        assert_eq!(a.counters().no_room, 1);
        a.handle_message(t, asker(4), a_request());
        assert_eq!(
            a.control.back().map(|(_, m)| m.clone()),
            Some(DirectMsg::Deny(DenyReason::Full))
        );
        a.check_invariants().unwrap();
    }

    fn a_request() -> DirectMsg {
        DirectMsg::Request {
            version: DIRECT_VERSION,
            epoch: 0,
            uri: String::new(),
            ask: 1,
        }
    }

    #[test]
    fn version_epoch_and_neighbours_are_denied() {
        let t = Instant::now();
        let mut b = DirectLinks::new(2, cfg(RouteSetting::Auto, 4));
        let deny = |b: &mut DirectLinks| b.poll_control().map(|(_, m)| m);
        b.handle_message(
            t,
            asker(1),
            DirectMsg::Request {
                version: 9,
                epoch: 0,
                uri: String::new(),
                ask: 1,
            },
        );
        assert_eq!(deny(&mut b), Some(DirectMsg::Deny(DenyReason::Version)));
        b.handle_message(
            t,
            Asker {
                my_epoch: 3,
                ..asker(1)
            },
            a_request(),
        );
        assert_eq!(deny(&mut b), Some(DirectMsg::Deny(DenyReason::Epoch)));
        b.handle_message(
            t,
            Asker {
                neighbour: true,
                ..asker(1)
            },
            a_request(),
        );
        assert_eq!(deny(&mut b), Some(DirectMsg::Deny(DenyReason::Neighbour)));
        assert!(b.peers().is_empty());
    }

    #[test]
    fn an_unanswered_request_times_out_and_a_dead_peer_ends_one() {
        let t = Instant::now();
        let mut a = DirectLinks::new(1, cfg(RouteSetting::Direct, 4));
        a.route(t, 2, 1, 8, None, me);
        a.route(t, 3, 1, 8, None, me);
        a.handle_peer_failed(3);
        assert_eq!(a.counters().denied_dead, 1);
        let due = a.poll_timeout().unwrap();
        assert_eq!(due, t + Duration::from_secs(5));
        assert!(a.handle_timeout(due).is_empty());
        assert_eq!(a.counters().denied_timeout, 1);
        assert!(a.peers().is_empty() && a.poll_timeout().is_none());
        // The late grant is withdrawn.
        a.poll_control();
        a.poll_control();
        a.poll_control();
        a.handle_message(due, asker(2), DirectMsg::Grant { id: 5, ask: 1 });
        assert_eq!(a.poll_control(), Some((2, DirectMsg::Withdraw(5))));
        assert!(!a.is_direct(2));
    }

    /// Regression seeds 358 and 17532: a grant arriving after its request timed out. The
    /// grantor wrote nothing on the link before `Switch`, so the requester, which no longer
    /// waits for any marker, has nothing there to read early; the withdrawn grant is simply
    /// forgotten.
    #[test]
    fn a_late_grant_is_withdrawn_and_the_grantor_never_wrote() {
        let t = Instant::now();
        let mut a = DirectLinks::new(6, cfg(RouteSetting::Direct, 4));
        let mut b = DirectLinks::new(0, cfg(RouteSetting::Direct, 4));
        a.route(t, 0, 1, 8, None, me);
        let (_, request) = a.poll_control().unwrap();
        let late = t + Duration::from_secs(5);
        assert!(a.handle_timeout(late).is_empty());
        assert_eq!(a.poll_control(), Some((0, DirectMsg::Withdraw(0))));
        // The request arrives only now, then the requester's Withdraw(0).
        b.handle_message(late, asker(6), request);
        assert_eq!(
            b.route(late, 6, 1, 8, None, me),
            Via::Tree,
            "no writes before Switch"
        );
        let (_, grant) = b.poll_control().unwrap();
        b.handle_message(late, asker(6), DirectMsg::Withdraw(0));
        assert!(b.peers().is_empty());
        a.handle_message(late, asker(0), grant);
        assert_eq!(a.poll_control(), Some((0, DirectMsg::Withdraw(1))));
        b.handle_message(late, asker(6), DirectMsg::Withdraw(1));
        assert!(a.peers().is_empty() && b.peers().is_empty());
    }

    /// A `Switch` lost on the tree: the grant's copy brings another, the `Switch` copy
    /// another `Ready`, and copies of markers for an open link change nothing.
    #[test]
    fn a_lost_marker_is_asked_for_again_and_copies_are_harmless() {
        let t = Instant::now();
        let mut a = DirectLinks::new(1, cfg(RouteSetting::Direct, 4));
        let mut b = DirectLinks::new(2, cfg(RouteSetting::Direct, 4));
        a.route(t, 2, 1, 8, None, me);
        let (_, request) = a.poll_control().unwrap();
        b.handle_message(t, asker(1), request);
        let (_, grant) = b.poll_control().unwrap();
        a.handle_message(t, asker(2), grant);
        let lost = a.poll_control();
        assert_eq!(lost, Some((2, DirectMsg::Switch(1))));
        let later = t + Duration::from_secs(5);
        assert!(b.handle_timeout(later).is_empty());
        exchange(later, &mut a, &mut b);
        assert!(a.may_read(2) && b.may_read(1) && a.is_direct(2) && b.is_direct(1));
        // A late copy of everything: nothing changes, nothing is withdrawn.
        b.handle_message(later, asker(1), DirectMsg::Switch(1));
        exchange(later, &mut a, &mut b);
        a.handle_message(later, asker(2), DirectMsg::Grant { id: 1, ask: 1 });
        exchange(later, &mut a, &mut b);
        assert!(a.may_read(2) && b.may_read(1) && a.is_direct(2) && b.is_direct(1));
        assert_eq!(a.counters().fallbacks + b.counters().fallbacks, 0);
    }

    #[test]
    fn a_grant_for_an_earlier_request_is_not_taken_for_the_current_one() {
        let t = Instant::now();
        let mut a = DirectLinks::new(1, cfg(RouteSetting::Direct, 4));
        a.route(t, 2, 1, 8, None, me);
        let expired = t + Duration::from_secs(5);
        a.handle_timeout(expired);
        let asked_again = expired + Duration::from_secs(2);
        a.route(asked_again, 2, 1, 8, None, me);
        while a.poll_control().is_some() {}
        a.handle_message(asked_again, asker(2), DirectMsg::Grant { id: 4, ask: 1 });
        assert_eq!(a.poll_control(), Some((2, DirectMsg::Withdraw(4))));
        assert!(!a.is_direct(2), "still waiting for the answer to request 2");
        a.handle_message(asked_again, asker(2), DirectMsg::Grant { id: 5, ask: 2 });
        assert!(a.is_direct(2));
        assert_eq!(a.poll_control(), Some((2, DirectMsg::Switch(5))));
    }

    /// A `Switch` later than the grant's wait (an overloaded tree): the grant stops counting
    /// against `direct_links_max` but still waits for the answer, so the link opens and
    /// nothing the requester wrote on it is lost; without room left, it opens and at once
    /// closes gracefully.
    #[test]
    fn a_late_switch_opens_an_expired_grant_or_closes_it_gracefully() {
        let t = Instant::now();
        let mut a = DirectLinks::new(1, cfg(RouteSetting::Direct, 1));
        let mut b = DirectLinks::new(2, cfg(RouteSetting::Direct, 1));
        for (room, expect) in [(true, Via::Direct), (false, Via::Hold)] {
            a.route(t, 2, 1, 8, None, me);
            let (_, request) = a.poll_control().unwrap();
            b.handle_message(t, asker(1), request);
            let (_, grant) = b.poll_control().unwrap();
            a.handle_message(t, asker(2), grant);
            let (_, switch) = a.poll_control().unwrap();
            let expired = t + Duration::from_secs(5);
            assert!(b.handle_timeout(expired).is_empty(), "nothing to close yet");
            assert!(
                matches!(b.poll_control(), Some((1, DirectMsg::Grant { .. }))),
                "the grant is sent again: its Switch may have been lost"
            );
            assert!(!b.may_read(1) && !b.is_direct(1));
            assert_eq!(b.route(expired, 1, 1, 8, None, me), Via::Tree);
            if !room {
                // Another link takes the room the expired grant no longer holds.
                b.handle_message(expired, asker(3), a_request());
                assert!(matches!(
                    b.poll_control(),
                    Some((3, DirectMsg::Grant { .. }))
                ));
            }
            b.handle_message(expired, asker(1), switch);
            assert!(b.may_read(1), "the marker came: the link is read");
            assert_eq!(b.route(expired, 1, 1, 8, None, me), expect);
            let (_, ready) = b.poll_control().unwrap();
            assert!(matches!(ready, DirectMsg::Ready(_)));
            a.handle_message(expired, asker(2), ready);
            assert!(a.may_read(2));
            if !room {
                assert!(matches!(b.poll_control(), Some((1, DirectMsg::Close(_)))));
            }
            b.check_invariants().unwrap();
            // Ends both (a lost connection) before the next round.
            a.handle_link_lost(2);
            b.handle_link_lost(1);
            b.handle_peer_failed(3);
            while b.poll_event().is_some() {}
            while b.poll_control().is_some() {}
        }
    }

    /// A grant whose requester never answers at all: the grantor sends it again at each
    /// request time, and after `DIRECT_MARKER_POKES_MAX` copies gives it up, tells the
    /// requester, has the connection closed, and reads nothing there until the fence ends.
    #[test]
    fn a_grant_never_answered_is_fenced_at_last() {
        let t = Instant::now();
        let mut c = DirectLinks::new(3, cfg(RouteSetting::Direct, 4));
        c.handle_message(t, asker(1), a_request());
        c.poll_control();
        let mut at = t;
        for _ in 0..crate::limits::DIRECT_MARKER_POKES_MAX {
            at += Duration::from_secs(5);
            assert_eq!(c.poll_timeout(), Some(at));
            assert!(c.handle_timeout(at).is_empty());
            assert_eq!(
                c.poll_control(),
                Some((1, DirectMsg::Grant { id: 1, ask: 1 }))
            );
        }
        let late = at + Duration::from_secs(5);
        assert_eq!(c.handle_timeout(late), vec![1], "the node closes it");
        assert_eq!(c.poll_control(), Some((1, DirectMsg::Withdraw(1))));
        assert!(!c.may_read(1));
        c.handle_message(late, asker(1), DirectMsg::Switch(1));
        assert!(!c.may_read(1), "a Switch after the fence opens nothing");
        c.handle_message(late, asker(1), a_request());
        assert_eq!(
            c.poll_control(),
            Some((1, DirectMsg::Deny(DenyReason::Epoch))),
            "no new grant while fenced"
        );
        assert!(!c.handle_link_lost(1));
        assert!(
            c.may_read(1) && c.peers().is_empty(),
            "gone with its connection"
        );
        c.check_invariants().unwrap();
    }

    #[test]
    fn an_unanswered_switch_is_fenced_and_denied_for_a_while() {
        let t = Instant::now();
        let mut a = DirectLinks::new(1, cfg(RouteSetting::Direct, 4));
        a.route(t, 2, 1, 8, None, me);
        a.poll_control();
        a.handle_message(t, asker(2), DirectMsg::Grant { id: 3, ask: 1 });
        assert_eq!(a.poll_control(), Some((2, DirectMsg::Switch(3))));
        let mut at = t;
        for _ in 0..crate::limits::DIRECT_MARKER_POKES_MAX {
            at += Duration::from_secs(5);
            assert!(a.handle_timeout(at).is_empty(), "Ready is late");
            assert_eq!(
                a.poll_control(),
                Some((2, DirectMsg::Switch(3))),
                "asked again"
            );
        }
        let expired = at + Duration::from_secs(5);
        assert_eq!(a.handle_timeout(expired), vec![2]);
        assert_eq!(a.poll_control(), Some((2, DirectMsg::Withdraw(3))));
        assert!(!a.may_read(2) && !a.is_direct(2));
        assert_eq!(a.counters().denied_timeout, 1);
        a.handle_message(expired, asker(2), DirectMsg::Ready(3));
        assert!(!a.may_read(2), "a late Ready does not open a fenced link");
        assert_eq!(a.route(expired, 2, 1, 8, None, me), Via::Tree);
        assert!(a.poll_control().is_none(), "the denial is cached");
    }

    #[test]
    fn auto_asks_past_a_threshold_within_the_window() {
        let t = Instant::now();
        let mut a = DirectLinks::new(1, cfg(RouteSetting::Auto, 4));
        for i in 0..3 {
            a.route(t + Duration::from_millis(i * 60), 2, 1, 8, None, me);
        }
        assert_eq!(a.counters().requests_sent, 0, "the window restarted");
        for _ in 0..4 {
            a.route(t + Duration::from_millis(200), 2, 1, 8, None, me);
        }
        assert_eq!(a.counters().requests_sent, 1);
        a.route(t, 3, 1, 2000, None, me);
        assert_eq!(a.counters().requests_sent, 2, "bytes past the threshold");
    }

    #[test]
    fn a_lost_link_falls_back_and_a_new_neighbour_drops_its_state() {
        let t = Instant::now();
        let mut a = DirectLinks::new(1, cfg(RouteSetting::Direct, 4));
        let mut b = DirectLinks::new(2, cfg(RouteSetting::Direct, 4));
        a.route(t, 2, 1, 8, None, me);
        exchange(t, &mut a, &mut b);
        assert!(a.handle_link_lost(2));
        assert!(!a.is_direct(2));
        assert_eq!(a.counters().fallbacks, 1);
        assert!(!a.handle_link_lost(2));
        b.handle_became_neighbour(1);
        assert!(!b.is_direct(1) && b.may_read(1));
    }
}
