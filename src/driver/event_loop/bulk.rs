//! Bulk connections (`oob::bulk_route`): dialling one beside an established link when stream
//! data waits for the peer, routing bulk frames to it, the sync that lets a marker go, and
//! what its loss gives back to the link. The order rules are `BulkRoute`'s; this file keeps
//! the connections and moves the frames.

use super::super::caddy::Completion;
use super::super::conn::{BulkEnd, Conn, ConnState};
use super::{EventLoop, complete};
use crate::Rank;
use crate::error::SendError;
use crate::limits;
use crate::node::lane::{Lane, lane};
use crate::oob::bulk_route::{Move, Way};
use crate::oob::frame::Frame;
use crate::oob::header::{Header, Kind};
use crate::oob::send_queue::Payload;
use crate::oob::session::Control;
use bytes::Bytes;
use std::time::{Duration, Instant};

/// A frame the link itself must take.
pub(super) type ForLink = (Header, Payload, Option<Completion>);

impl EventLoop {
    /// Routes one frame for `peer`, whose link is the established connection `link_tok`:
    /// `Ok(queued)` when it went to the bulk connection (or was refused there), `Err(frame)`
    /// when the link takes it (after any hold or sync the route asked for).
    pub(super) fn route_bulk(
        &mut self,
        peer: Rank,
        link_tok: usize,
        header: Header,
        payload: Payload,
        done: Option<Completion>,
    ) -> Result<bool, ForLink> {
        if !self.cfg.bulk_connection
            || header.kind != Kind::Msg
            || (header.tag != crate::node::TAG_STREAM && header.tag != crate::direct::TAG_DIRECT)
        {
            return Err((header, payload, done));
        }
        let line = lane(&header, payload.head());
        let Some(link) = self.links.get_mut(&peer) else {
            return Err((header, payload, done));
        };
        match line {
            Lane::Control => Err((header, payload, done)),
            Lane::Marker => {
                let (hold, sync) = link.bulk_route.handle_marker();
                if hold && let Some(conn) = self.conns.get_mut(link_tok) {
                    conn.set_bulk_held(true);
                }
                if let Some(n) = sync {
                    self.write_sync(peer, n);
                }
                Err((header, payload, done))
            }
            Lane::Bulk if !link.bulk_route.is_up() => {
                self.ensure_bulk_dial(peer);
                Err((header, payload, done))
            }
            Lane::Bulk => match (link.bulk_route.bulk_way(), link.bulk_out) {
                (Way::Bulk, Some(tok)) => {
                    let Some(conn) = self.conns.get_mut(tok) else {
                        return Err((header, payload, done));
                    };
                    match conn.push_plain(header, payload, done) {
                        Ok(()) => {
                            // Written by the turn's flush only, at most `BULK_FLUSH_BYTES` a
                            // turn: not at once as a link's full coalescing buffer is. Stream
                            // chunks are that large, so flushing each at once wrote up to
                            // `STREAM_RELEASE_BYTES` a turn (300-800 µs on this machine), and
                            // a message on the link waited for all of it.
                            self.mark_dirty(tok);
                            Ok(true)
                        }
                        Err((_, done)) => {
                            self.queue_full(peer, done);
                            Ok(false)
                        }
                    }
                }
                _ => {
                    let marker = self.conns.get(link_tok).is_some_and(Conn::marker_waiting);
                    if link.bulk_route.poll_handover(marker) {
                        if let Some(conn) = self.conns.get_mut(link_tok) {
                            conn.set_bulk_held(true);
                        }
                        // The frame waits in the held line; it moves with the rest.
                        let result = self
                            .conns
                            .get_mut(link_tok)
                            .map(|c| c.push(header, payload, done));
                        let queued = match result {
                            Some(Ok(())) => true,
                            Some(Err((_, done))) => {
                                self.queue_full(peer, done);
                                false
                            }
                            None => false,
                        };
                        self.bulk_settle(peer);
                        return Ok(queued);
                    }
                    Err((header, payload, done))
                }
            },
        }
    }

    /// During a handover: once what the link fed of its bulk line is confirmed read, its
    /// waiting frames move to the bulk connection (up to a marker, which then waits for a
    /// sync).
    pub(super) fn bulk_settle(&mut self, peer: Rank) {
        let Some(link) = self.links.get_mut(&peer) else {
            return;
        };
        let (Some(link_tok), Some(bulk_tok)) = (link.conn, link.bulk_out) else {
            return;
        };
        if !link.bulk_route.in_handover() {
            return;
        }
        let Some(conn) = self.conns.get_mut(link_tok) else {
            return;
        };
        if !conn.bulk_settled() {
            return;
        }
        let Some(step) = link.bulk_route.handle_link_settled(conn.marker_waiting()) else {
            return;
        };
        let frames = conn.take_bulk_until_marker();
        if step == Move::All {
            conn.set_bulk_held(false);
        }
        let moved = frames.len();
        if let Some(bulk) = self.conns.get_mut(bulk_tok) {
            bulk.push_moved(frames);
        }
        log::debug!(
            "rank {}: rank {peer}: bulk frames take the bulk connection ({moved} moved)",
            self.me
        );
        self.mark_dirty(bulk_tok);
        self.mark_dirty(link_tok);
        if let Move::UntilMarker { sync } = step {
            self.write_sync(peer, sync);
        }
    }

    /// Writes `Sync(n)` on our bulk connection to `peer`: the peer answers once it has read
    /// every frame before it.
    fn write_sync(&mut self, peer: Rank, n: u64) {
        let me = self.me;
        let Some(tok) = self.links.get(&peer).and_then(|l| l.bulk_out) else {
            return;
        };
        if let Some(conn) = self.conns.get_mut(tok) {
            let sync = Control::Start {
                session: 0,
                count: n,
            };
            conn.push_moved(vec![(
                sync.header(me, peer),
                Payload::from(Bytes::new()),
                None,
            )]);
            log::debug!(
                "rank {me}: rank {peer}: a marker waits for sync {n} on the bulk connection"
            );
            self.mark_dirty(tok);
        }
    }

    /// Dials a bulk connection to `peer` unless one exists, is under way, or failed lately.
    fn ensure_bulk_dial(&mut self, peer: Rank) {
        let now = self.now;
        let Some(link) = self.links.get(&peer) else {
            return;
        };
        if link.bulk_out.is_some()
            || link.bulk_retry_at.is_some_and(|at| now < at)
            || self.stopping.is_some()
            || !link
                .conn
                .and_then(|t| self.conns.get(t))
                .is_some_and(Conn::is_established)
        {
            return;
        }
        let addrs = self.peer_addrs(peer);
        let Some(addr) = addrs.get(link.addr_index % addrs.len().max(1)).copied() else {
            return;
        };
        let Ok(tok) = self.connect(peer, addr, "bulk connection") else {
            self.bulk_failed(peer);
            return;
        };
        if let Some(conn) = self.conns.get_mut(tok) {
            conn.bulk_end = Some(BulkEnd::Out);
        }
        self.links.entry(peer).or_default().bulk_out = Some(tok);
        log::debug!(
            "rank {}: dialling a bulk connection to rank {peer} at {addr}",
            self.me
        );
    }

    /// A bulk dial failed or a bulk connection was lost: stream data takes the link, and no
    /// bulk connection is dialled for `limits::BULK_REDIAL_MS`.
    pub(super) fn bulk_failed(&mut self, peer: Rank) {
        if let Some(link) = self.links.get_mut(&peer) {
            link.bulk_retry_at =
                Some(Instant::now() + Duration::from_millis(limits::BULK_REDIAL_MS));
        }
    }

    /// Dialler: the peer admitted our bulk connection `tok`. It carries bulk frames once the
    /// link hands over (`BulkRoute`); an incarnation other than the link's closes it.
    pub(super) fn bulk_established(&mut self, tok: usize, peer: Rank, incarnation: u64) {
        let link_life = self
            .links
            .get(&peer)
            .and_then(|l| l.conn)
            .and_then(|t| self.conns.get(t))
            .and_then(|c| c.session.as_ref())
            .map(|s| s.incarnation);
        if link_life != Some(incarnation) {
            log::debug!(
                "rank {}: bulk connection to rank {peer} is for another life of its link; closing",
                self.me
            );
            self.close(tok, None);
            self.bulk_failed(peer);
            return;
        }
        if !self.establish_bulk(tok, peer, BulkEnd::Out) {
            return;
        }
        if let Some(link) = self.links.get_mut(&peer) {
            link.bulk_route.handle_bulk_up();
        }
        self.node.counters_mut().bulk_connections += 1;
        self.mark_dirty(tok);
    }

    /// Bulk connection `tok` with `peer` is established at this `end`: out of the handshake
    /// bounds, data frames of the negotiated size. False if it is gone.
    fn establish_bulk(&mut self, tok: usize, peer: Rank, end: BulkEnd) -> bool {
        let msg_max = self.cfg.msg_max_bytes as u32;
        let Some(conn) = self.conns.get_mut(tok) else {
            return false;
        };
        self.pending.remove(conn.generation);
        conn.state = ConnState::Established;
        conn.peer = Some(peer);
        conn.bulk_end = Some(end);
        conn.decoder.set_max_payload(msg_max);
        conn.watch.handle_heard(self.now);
        log::debug!(
            "rank {}: bulk connection {} rank {peer} ({})",
            self.me,
            if end == BulkEnd::Out { "to" } else { "from" },
            conn.addr
        );
        true
    }

    /// Acceptor: rank `peer` proved itself on bulk connection `tok`. It is admitted to carry
    /// that peer's bulk frames to us (replacing an older one), unless the DVM declared the
    /// peer dead.
    pub(super) fn bulk_admitted(&mut self, tok: usize, peer: Rank, incarnation: u64) {
        if !self.node.may_link(peer, incarnation) {
            log::debug!(
                "rank {}: a bulk connection from rank {peer}, declared dead; closing",
                self.me
            );
            self.close(tok, None);
            return;
        }
        self.admit_conn(tok);
        if !self.establish_bulk(tok, peer, BulkEnd::In) {
            return;
        }
        let old = self.links.entry(peer).or_default().bulk_in.replace(tok);
        if let Some(old) = old.filter(|&o| o != tok) {
            self.close(old, None);
        }
        self.mark_dirty(tok);
    }

    /// A frame on an established bulk connection. On ours, only the answer to a sync; on the
    /// peer's, bulk frames (handed to the node as from the peer) and syncs (answered once
    /// everything before them was read). Anything else closes it.
    pub(super) fn on_bulk_frame(&mut self, tok: usize, end: BulkEnd, from: Rank, frame: Frame) {
        let me = self.me;
        if frame.header.kind == Kind::Link {
            let control = match Control::decode(&frame.header, frame.payload.len()) {
                Ok(c) => c,
                Err(e) => return self.protocol_error(tok, &e.to_string()),
            };
            match (end, control) {
                (BulkEnd::In, Control::Start { session: 0, count }) => {
                    if let Some(conn) = self.conns.get_mut(tok) {
                        conn.set_control(Control::Ack { session: 0, count }, me, from);
                        log::debug!("rank {me}: rank {from}: bulk connection read to sync {count}");
                        self.mark_dirty(tok);
                    }
                }
                (BulkEnd::Out, Control::Ack { session: 0, count }) => {
                    let released = self
                        .links
                        .get_mut(&from)
                        .is_some_and(|l| l.bulk_route.handle_synced(count));
                    log::debug!(
                        "rank {me}: rank {from}: sync {count} answered (released: {released})"
                    );
                    if released
                        && let Some(link_tok) = self.links.get(&from).and_then(|l| l.conn)
                        && let Some(conn) = self.conns.get_mut(link_tok)
                    {
                        conn.set_bulk_held(false);
                        self.mark_dirty(link_tok);
                    }
                }
                _ => self.protocol_error(tok, "an unexpected link control on a bulk connection"),
            }
            return;
        }
        if end == BulkEnd::Out || lane(&frame.header, &frame.payload) != Lane::Bulk {
            return self.protocol_error(tok, "a frame other than stream data on a bulk connection");
        }
        if let Err(why) = self
            .node
            .handle_frame(self.now, from, frame.header, frame.payload)
        {
            self.protocol_error(tok, &why);
        }
    }

    /// A bulk connection `tok` ended. Ours gives its unsent frames back to the front of the
    /// link's bulk line (a frame cut off mid-write, and what was written and not read, are
    /// lost: a stream resumes from its byte), and stream data takes the link.
    pub(super) fn bulk_lost(&mut self, tok: usize, why: &str) {
        let Some(conn) = self.conns.get_mut(tok) else {
            return;
        };
        let peer = conn.peer.or(conn.dialled);
        let out = conn.bulk_end == Some(BulkEnd::Out);
        log::debug!(
            "rank {}: bulk connection {} ({}) lost: {why}",
            self.me,
            conn.addr,
            peer.map_or_else(|| "unknown rank".to_string(), |r| format!("rank {r}"))
        );
        if out && let Some(p) = peer {
            self.give_back_bulk(p, tok);
            self.bulk_failed(p);
        }
        self.close(tok, None);
    }

    /// Moves what our bulk connection `tok` to `peer` did not write to the front of the
    /// link's bulk line (or the link's pending frames when it has no connection), and lets
    /// the link line feed again.
    pub(super) fn give_back_bulk(&mut self, peer: Rank, tok: usize) {
        let Some(conn) = self.conns.get_mut(tok) else {
            return;
        };
        let (unsent, cut, _) = conn.take_unsent();
        for done in cut {
            complete(done, Err(SendError::Unreachable(peer)));
        }
        let Some(link) = self.links.get_mut(&peer) else {
            return;
        };
        link.bulk_route.handle_bulk_down();
        let unsent: Vec<ForLink> = unsent
            .into_iter()
            .filter(|(h, _, _)| h.kind == Kind::Msg)
            .collect();
        match link.conn.and_then(|t| self.conns.get_mut(t)) {
            Some(conn) => {
                conn.prepend_bulk(unsent);
                conn.set_bulk_held(false);
                if let Some(t) = link.conn {
                    self.mark_dirty(t);
                }
            }
            None => {
                for (header, payload, done) in unsent.into_iter().rev() {
                    link.pending_bytes += payload.len() + crate::oob::header::HEADER_LEN;
                    link.pending.push_front(super::links::Pending {
                        header,
                        payload,
                        done,
                    });
                }
                self.report_waiting(peer);
            }
        }
    }

    /// The flow-control levels of the link or bulk connection `tok`: its peer, and the bytes
    /// waiting towards it in all and of bulk data, counting both our link and our bulk
    /// connection to it. `None` for a connection whose levels are not a link's (handshaking, a
    /// tool, the peer's bulk connection to us).
    pub(super) fn peer_levels(&self, tok: usize) -> Option<(Rank, usize, usize)> {
        let conn = self.conns.get(tok)?;
        let peer = conn.peer.filter(|_| conn.is_established())?;
        if conn.bulk_end == Some(BulkEnd::In) {
            return None;
        }
        // Frames waiting for a connection count as queued: see `report_waiting`.
        let (link_tok, bulk_tok, waiting) = self
            .links
            .get(&peer)
            .map_or((None, None, 0), |l| (l.conn, l.bulk_out, l.pending_bytes));
        // Written out rather than as an iterator over both: this runs on every flush, and the
        // iterator form compiled to some 1,400 instructions a call (callgrind, ping-pong).
        let level = |tok: Option<usize>| match tok.and_then(|t| self.conns.get(t)) {
            Some(c) if c.is_established() => {
                let bulk = if c.bulk_end.is_some() {
                    c.queued_bytes()
                } else {
                    c.bulk_bytes()
                };
                (c.queued_bytes(), bulk)
            }
            _ => (0, 0),
        };
        let (lq, lb) = level(link_tok);
        let (bq, bb) = level(bulk_tok);
        Some((peer, lq + bq + waiting, lb + bb))
    }
}
