//! Failover: a connection to a living peer that has stalled (`oob::stall`) is closed and the
//! peer dialled at its next address, before the heartbeat timeout could take it for dead; the
//! link session (`oob::session`) then writes again what the stalled connection did not
//! deliver.
//!
//! Timing, with the defaults: a stall is seen `link_stall_ms` (3 s) after frames began to wait
//! in silence, late by at most a watch tick (a quarter of it). The dial of the next address
//! then takes a round trip and a handshake when that network works; a dial that fails tries
//! the next address at once and backs off as any redial does. The heartbeat timeout (10 s)
//! still decides whether the peer lives: the stall time is capped at half of it so that a
//! failover has the other half to complete.

use super::super::conn::ConnState;
use super::super::timers::TimerKind;
use super::EventLoop;
use crate::Rank;
use std::time::{Duration, Instant};

impl EventLoop {
    /// The stall time in force: `link_stall_ms`, at most half the heartbeat timeout; 0 is off.
    pub(super) fn link_stall_ms(&self) -> u64 {
        self.cfg
            .link_stall_ms
            .min(self.cfg.heartbeat_timeout_ms / 2)
    }

    /// How long a dial's TCP connect may take before the peer's next address is tried: half the
    /// stall time in force, at most the handshake timeout (which also covers the connect).
    /// `None` when failover is off, or when the peer has one address (the handshake timeout
    /// then decides: nothing else to try). A network that drops packets silently answers no
    /// connect: without this a dial waited the whole handshake timeout (5 s) on it.
    pub(super) fn connect_timeout_ms(&self, peer: Rank) -> Option<u64> {
        let ms = (self.link_stall_ms() / 2).min(self.cfg.handshake_timeout_ms);
        (ms > 0 && self.peer_addrs(peer).len() > 1).then_some(ms)
    }

    /// A dial's connect timer ran out: if the connect is still in progress, the dial is given
    /// up as unanswered and the peer's next address dialled.
    pub(super) fn connect_timed_out(&mut self, tok: usize, generation: u64) {
        let Some(conn) = self.conns.get(tok) else {
            return;
        };
        if conn.generation != generation || !matches!(conn.state, ConnState::Connecting) {
            return;
        }
        let (addr, dialled) = (conn.addr, conn.dialled);
        if let Some(peer) = dialled {
            log::info!(
                "rank {}: no answer from rank {peer} at {addr} within {} ms; trying its next \
                 address",
                self.me,
                self.connect_timeout_ms(peer).unwrap_or(0)
            );
        }
        self.lost(tok, "connect timed out");
    }

    /// Says at start that `link_stall_ms` was cut to half of `heartbeat_timeout_ms` (an
    /// operator asked for more and would not otherwise know: from an outside-in review).
    pub(super) fn note_link_stall_cap(&self) {
        let asked = self.cfg.link_stall_ms;
        if asked > self.link_stall_ms() {
            log::info!(
                "rank {}: link_stall_ms {asked} is capped at half of heartbeat_timeout_ms: {} ms",
                self.me,
                self.link_stall_ms()
            );
        }
    }

    /// Arms the next watch tick (a quarter of the stall time), unless failover is off.
    pub(super) fn arm_link_watch(&mut self) {
        let stall = self.link_stall_ms();
        if stall > 0 {
            let at = Instant::now() + Duration::from_millis((stall / 4).max(1));
            self.timers.arm(at, TimerKind::LinkWatch);
        }
    }

    /// A watch tick: every established connection with frames waiting in silence for the
    /// stall time fails over.
    pub(super) fn watch_links(&mut self) {
        if self.stopping.is_some() || self.node.stopping().is_some() {
            return;
        }
        let stall = Duration::from_millis(self.link_stall_ms());
        let now = self.now;
        let own_stall = crate::oob::stall::tick_is_late(self.last_link_watch, now, stall);
        self.last_link_watch = Some(now);
        if own_stall {
            log::info!(
                "rank {}: this daemon's loop did not run for over {} ms; no connection is taken \
                 as stalled for that silence",
                self.me,
                stall.as_millis() / 2
            );
        }
        let mut stalled = Vec::new();
        for (tok, conn) in self.conns.iter_mut() {
            let Some(peer) = conn.peer.filter(|_| conn.is_established()) else {
                continue;
            };
            if own_stall {
                conn.watch.handle_own_stall(now);
            }
            if self.paused.contains(&tok) {
                conn.watch.handle_unread(now);
            }
            let waiting = conn
                .session
                .as_ref()
                .is_some_and(|s| s.out.unacked_frames() > 0);
            if conn.watch.poll_stalled(now, waiting, stall) {
                stalled.push((tok, peer));
            }
        }
        for (tok, peer) in stalled {
            self.fail_over(tok, peer, stall);
        }
    }

    /// Closes the stalled connection `tok` to `peer` and dials the peer's next address: the
    /// frames it did not confirm wait in the link session for the new connection.
    fn fail_over(&mut self, tok: usize, peer: Rank, stall: Duration) {
        let Some(conn) = self.conns.get(tok) else {
            return;
        };
        let from = conn.addr;
        let waiting = conn.session.as_ref().map_or(0, |s| s.out.unacked_frames());
        let addrs = self.peer_addrs(peer);
        let link = self.links.entry(peer).or_default();
        link.failovers += 1;
        if let Some(i) = addrs.iter().position(|a| a.ip() == from.ip()) {
            link.addr_index = i + 1;
        } else {
            link.addr_index = link.addr_index.wrapping_add(1);
        }
        let next = addrs
            .get(link.addr_index % addrs.len().max(1))
            .map_or_else(|| "its address".to_string(), ToString::to_string);
        self.node.counters_mut().link_failovers += 1;
        log::info!(
            "rank {}: connection to rank {peer} over {from} stalled ({} ms without a byte back, \
             {waiting} frames unconfirmed); failing over to {next}",
            self.me,
            stall.as_millis()
        );
        self.lost(tok, "stalled");
        // `lost` redials a tree neighbour, or a peer with frames waiting; frames the stalled
        // connection wrote and nobody confirmed wait too.
        self.ensure_dial_for_session(peer);
    }
}
