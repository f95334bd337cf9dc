//! Frames that wait for a direct link's drain marker: while a link with a peer waits for the
//! peer's `Switch` or `Ready` over the tree ([`crate::direct::DirectLinks::may_read`]), the
//! peer's own messages to this daemon (the ones the markers order) wait here, in arrival
//! order; every other frame on the connection is read at once.
//!
//! Why not leave the whole connection unread, as version 4 of the protocol first did: two
//! daemons keep one connection, and a repair may make the peer a tree neighbour before this
//! daemon knows it. The peer's tree messages (its adoption notice, the broadcasts it relays,
//! rank 0's confirmations) then come over that same connection, and a daemon that read none
//! of it waited for a marker that no longer comes, and never heard of the repair (regression
//! seeds 11549, and 128 with `--bcast-part-bytes 40`). What waits here is exactly what waited
//! in the socket before: the peer's user messages (alone or in batch frames) and stream
//! messages, its direct-link control and its reliable messages, each from the peer itself to
//! this daemon.
//!
//! The frames are read, in order and before any later frame of that peer, as soon as the
//! link stops waiting (the marker came, the link ended, or a repair made the peer a tree
//! neighbour). A connection lost while they wait takes them with it, as it took the bytes
//! left in its socket before: the link then ends as a lost one does. Bound: at
//! `limits::MARKER_WAIT_FRAMES_MAX` frames or `limits::MARKER_WAIT_BYTES_MAX` bytes the
//! connection is no longer read ([`Node::may_read`]) and TCP holds the peer back.

use super::Node;
use crate::Rank;
use crate::direct::TAG_DIRECT;
use crate::oob::header::{Header, Kind};
use bytes::Bytes;
use std::collections::VecDeque;
use std::time::Instant;

/// One peer's frames waiting for its drain marker, in arrival order, and their payload bytes.
#[derive(Debug, Default)]
pub(super) struct MarkerWait {
    frames: VecDeque<(Header, Bytes)>,
    bytes: usize,
}

impl MarkerWait {
    /// Whether another read may add frames (the bound checks before a read, so one read's
    /// frames may pass it).
    pub(super) fn has_room(&self) -> bool {
        self.frames.len() < crate::limits::MARKER_WAIT_FRAMES_MAX
            && self.bytes < crate::limits::MARKER_WAIT_BYTES_MAX
    }
}

impl Node {
    /// Whether a frame from neighbour `from` is one the drain markers order: a message from
    /// `from` itself to this daemon of a kind a direct link carries.
    fn marker_ordered(&self, from: Rank, h: &Header) -> bool {
        h.origin == from
            && h.dst == self.me
            && match h.kind {
                Kind::Msg => {
                    crate::rml::is_user_tag(h.tag)
                        // A batch of user messages (`rml::batch_frame`): its runtime tag must
                        // not let it past the marker (found by `tests/direct.rs`, a burst
                        // through the switch, about one run in twenty: a batch read on the
                        // link ahead of the tree's last messages before the `Switch`).
                        || h.tag == crate::rml::batch_frame::TAG_BATCH
                        || h.tag == super::streams::TAG_STREAM
                        || h.tag == TAG_DIRECT
                }
                Kind::RelmData | Kind::Relm => true,
                _ => false,
            }
    }

    /// Called for every frame that passed the checks, before it is acted on: true if it was
    /// kept to wait for `from`'s drain marker. Frames kept earlier are read first once the
    /// link no longer waits.
    pub(super) fn keep_for_marker(
        &mut self,
        now: Instant,
        from: Rank,
        h: Header,
        payload: &Bytes,
    ) -> bool {
        if self.direct.may_read(from) {
            // Every frame asks: the common answer needs no lookup.
            if !self.marker_waits.is_empty() && self.marker_waits.contains_key(&from) {
                self.read_after_marker(now, from);
            }
            return false;
        }
        if !self.marker_ordered(from, &h) {
            return false;
        }
        let w = self.marker_waits.entry(from).or_default();
        w.bytes += payload.len();
        w.frames.push_back((h, payload.clone()));
        self.marker_waited += 1;
        true
    }

    /// Reads the frames of every peer whose link no longer waits for a marker (each turn).
    pub(super) fn read_released_markers(&mut self, now: Instant) {
        if self.marker_waits.is_empty() {
            return;
        }
        let mut released: Vec<Rank> = self
            .marker_waits
            .keys()
            .copied()
            .filter(|p| self.direct.may_read(*p))
            .collect();
        released.sort_unstable();
        for peer in released {
            self.read_after_marker(now, peer);
        }
    }

    /// Reads `peer`'s waiting frames in their order. A frame refused now is logged and dropped:
    /// the connection it came on has moved on.
    fn read_after_marker(&mut self, now: Instant, peer: Rank) {
        let Some(w) = self.marker_waits.remove(&peer) else {
            return;
        };
        log::debug!(
            "rank {}: reading {} frame(s) from rank {peer} that waited for its drain marker",
            self.me,
            w.frames.len()
        );
        for (h, payload) in w.frames {
            if let Err(why) = self.handle_frame(now, peer, h, payload) {
                log::warn!(
                    "rank {}: a frame from rank {peer} that waited for its drain marker is \
                     refused: {why}",
                    self.me
                );
            }
        }
    }

    /// The connection with `peer` is gone: frames still waiting for its marker go with it (as
    /// the bytes in its socket did); frames whose wait ended are read first.
    pub(super) fn marker_wait_link_lost(&mut self, now: Instant, peer: Rank) {
        if self.direct.may_read(peer) {
            self.read_after_marker(now, peer);
        } else if let Some(w) = self.marker_waits.remove(&peer) {
            log::info!(
                "rank {}: {} frame(s) from rank {peer} that waited for its drain marker are lost \
                 with the connection",
                self.me,
                w.frames.len()
            );
        }
    }

    /// Frames that waited for a drain marker since the start.
    pub fn marker_waited(&self) -> u64 {
        self.marker_waited
    }

    /// Whether the driver may read more from `peer` as far as marker waits go.
    pub(super) fn marker_wait_has_room(&self, peer: Rank) -> bool {
        self.marker_waits
            .get(&peer)
            .is_none_or(MarkerWait::has_room)
    }

    /// The invariant after each turn: frames wait only for a link that still waits.
    pub(super) fn check_marker_waits(&self) -> Result<(), String> {
        for (peer, w) in &self.marker_waits {
            if w.frames.is_empty() || self.direct.may_read(*peer) {
                return Err(format!(
                    "rank {}: {} frame(s) from rank {peer} wait for a marker the link does not \
                     wait for",
                    self.me,
                    w.frames.len()
                ));
            }
        }
        Ok(())
    }
}
