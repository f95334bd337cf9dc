//! The node's side of direct links: the route of each user message, the control messages over
//! the tree, and what repairs and lost connections mean for the links. The protocol's rules
//! are in `src/direct/`; this file feeds that table and turns its answers into frames.

use super::{Node, Output};
use crate::Rank;
use crate::direct::Asker;
use crate::direct::{DirectMsg, LinkEvent, Route, TAG_DIRECT, Via};
use crate::oob::Payload;
use crate::oob::header::{Header, Kind};
use crate::rml::Message;
use std::time::Instant;

/// A message waiting while the direct link to its destination closes: its header, payload
/// and completion token.
pub(super) type Held = (Header, Payload, Option<u64>);

impl Node {
    /// Sends a user message originated here for `dst` (another daemon) by the route the
    /// direct-link table chooses; the table may ask `dst` for a link on the way. Returns how
    /// many user messages the frame carries (a batch frame's items; else 1), counted once here.
    pub(super) fn send_routed(
        &mut self,
        now: Instant,
        dst: Rank,
        tag: crate::rml::Tag,
        payload: impl Into<Payload>,
        token: Option<u64>,
        route: Option<Route>,
    ) -> u64 {
        let payload = payload.into();
        // A batch frame counts as the messages it carries (its bytes include their 8-byte
        // item headers).
        let messages = if tag == crate::rml::batch_frame::TAG_BATCH {
            crate::rml::batch_frame::count_items(payload.head())
        } else {
            1
        };
        self.send_routed_counted(now, dst, tag, payload, token, route, messages);
        messages
    }

    /// [`Node::send_routed`] of a frame whose sender says how many user messages it carries
    /// (a batch the driver packed): the items are not counted again. Counting them reads
    /// every item's header, which the packing thread wrote on another processor: at 64 bytes
    /// a message that was most of what the loop spent sending a batch.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn send_routed_counted(
        &mut self,
        now: Instant,
        dst: Rank,
        tag: crate::rml::Tag,
        payload: Payload,
        token: Option<u64>,
        route: Option<Route>,
        messages: u64,
    ) {
        let by_tree = self.is_neighbour(dst) || self.routing.is_failed(dst);
        let via = if self.holds_for(dst) {
            // Behind what waits for the link that closed (`direct_held.rs`); no new link is
            // asked for meanwhile, whose marker would overtake them.
            Via::Hold
        } else if by_tree {
            Via::Tree
        } else {
            let (epoch, uri) = (self.epoch, &self.uri);
            self.direct
                .route(now, dst, messages, payload.len(), route, || {
                    (
                        epoch,
                        uri.as_ref().map(|u| u.to_string()).unwrap_or_default(),
                    )
                })
        };
        let header = self.header(Kind::Msg, self.me, dst, tag, payload.len());
        match via {
            Via::Direct => self.transmit(dst, header, payload, token),
            Via::Tree => self.forward(header, payload, token),
            Via::Hold => self.hold(dst, (header, payload, token)),
        }
        // Only the table's route choice makes control messages or link events.
        if !by_tree {
            self.send_direct_control(now);
        }
    }

    /// The table's control messages (over the tree, plain runtime messages: `Switch` and
    /// `Ready` are the tree route's drain markers, so they must take it; `Close` and
    /// `CloseAck` on the link, the last frame written there) and its link events.
    pub(super) fn send_direct_control(&mut self, now: Instant) {
        while let Some((to, m)) = self.direct.poll_control() {
            if self.routing.is_failed(to) {
                continue;
            }
            let on_link = matches!(m, DirectMsg::Close(_) | DirectMsg::CloseAck(_));
            let payload = m.encode();
            let header = self.header(Kind::Msg, self.me, to, TAG_DIRECT, payload.len());
            if on_link && !self.is_neighbour(to) {
                // The link's last frame: written on it whatever its phase.
                self.push_transmit(to, header, payload.into(), None);
            } else {
                self.forward(header, payload.into(), None);
            }
        }
        while let Some(e) = self.direct.poll_event() {
            match e {
                LinkEvent::Release(peer) => self.release_held(peer),
                LinkEvent::Shut(peer) => self.fall_back(now, peer),
            }
        }
    }

    /// A direct-link control message arrived over the tree.
    pub(super) fn on_direct_message(&mut self, now: Instant, msg: Message) {
        let m = match DirectMsg::decode(&msg.payload) {
            Ok(m) => m,
            Err(e) => {
                log::warn!(
                    "rank {}: malformed direct-link message from rank {} dropped: {e}",
                    self.me,
                    msg.origin
                );
                return;
            }
        };
        if let DirectMsg::Request { uri, .. } = &m
            && !uri.is_empty()
            && self.contact(msg.origin).is_none()
            && let Ok(u) = uri.parse::<crate::oob::uri::ContactUri>()
            && u.rank == msg.origin
        {
            // A daemon whose contact this one lacks (not from wire-up) can be dialled without
            // a lookup.
            self.contacts.cache(u);
        }
        let was_direct = self.direct.is_direct(msg.origin);
        let who = Asker {
            from: msg.origin,
            neighbour: self.is_neighbour(msg.origin),
            my_epoch: self.epoch,
            stopping: self.stopping.is_some(),
        };
        let closing = matches!(
            m,
            DirectMsg::Close(_) | DirectMsg::CloseAck(_) | DirectMsg::Shut(_)
        );
        self.direct.handle_message(now, who, m);
        if was_direct && !self.direct.is_direct(msg.origin) && !closing {
            // A link given up by the other end, or granted again (the other end lost its
            // state): what was queued for the link takes the tree, and the connection closes
            // (nothing written on it may be read after tree messages sent later).
            self.fall_back(now, msg.origin);
        }
        self.send_direct_control(now);
    }

    /// After a repair: the dead's links end (a request to one ends denied), and a daemon that
    /// became a tree neighbour is reached over the tree (the same connection).
    pub(super) fn direct_after_repair(&mut self, now: Instant, dead: &[Rank]) {
        for r in dead {
            self.direct.handle_peer_failed(*r);
        }
        for peer in self.direct.peers() {
            if self.is_neighbour(peer) {
                self.direct.handle_became_neighbour(peer);
            }
        }
        self.send_direct_control(now);
    }

    /// The connection with `peer` was lost: if a direct link used it, this daemon's messages
    /// to `peer` take the tree from now on, and what was queued for it goes the same way.
    pub(super) fn direct_link_lost(&mut self, now: Instant, peer: Rank) {
        if self.direct.handle_link_lost(peer) {
            log::info!(
                "rank {}: direct link to rank {peer} lost; its messages take the tree",
                self.me
            );
            self.fall_back(now, peer);
            self.streams_link_lost(now, peer);
        }
        self.send_direct_control(now);
    }

    /// The direct connection with `peer` could not be made: its messages take the tree, and
    /// no new request goes to it for a while (a cached denial).
    pub(super) fn direct_unreachable(&mut self, now: Instant, peer: Rank, attempts: u32) {
        // A peer that left in order or failed is expected to be out of reach: no warning.
        let level = if self.routing.is_failed(peer) || self.departed.contains(&peer) {
            log::Level::Debug
        } else {
            log::Level::Warn
        };
        log::log!(
            level,
            "rank {}: cannot make a direct link with rank {peer} after {attempts} attempts; \
             its messages take the tree",
            self.me
        );
        if self.direct.handle_unreachable(now, peer) {
            self.fall_back(now, peer);
            self.streams_link_lost(now, peer);
        }
        self.send_direct_control(now);
    }

    /// This daemon's messages to `peer` took a direct link and take the tree from now on: the
    /// driver gives the tree what was queued for the link, and RELM resends at once what
    /// the link may have lost.
    pub(super) fn fall_back(&mut self, now: Instant, peer: Rank) {
        self.out.push_back(Output::Fallback { peer });
        let paths =
            super::reliable::Paths::new(&self.routing, &self.direct, (&self.lives, self.my_life));
        self.relm.handle_direct_lost(now, &paths, peer);
    }
}
