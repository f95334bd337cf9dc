//! Frames from neighbours and what the driver learns of its links: the checks every frame
//! passes (incarnation, failed senders, rank ranges), the dispatch by kind, runtime messages.

use super::Node;
use super::flow::HEARTBEAT_PAUSING;
use crate::Rank;
use crate::faults::notice::{TAG_ADOPTED, TAG_DECLARED_DEAD, TAG_FAULT_REPORT, TAG_ROOT_LOST};
use crate::grpcomm::{TAG_XCAST_DONE, TAG_XCAST_REQUEST};
use crate::oob::header::{Header, Kind};
use crate::rml::batch_frame::ItemRun;
use crate::rml::{Message, ReceiveId};
use bytes::Bytes;
use std::time::Instant;

impl Node {
    /// A frame from neighbour `from` on an established (authenticated) connection. `Err` is a
    /// protocol violation by that neighbour: the driver closes the connection and logs the
    /// reason; nothing else is lost.
    pub fn handle_frame(
        &mut self,
        now: Instant,
        from: Rank,
        h: Header,
        payload: Bytes,
    ) -> Result<(), String> {
        if from >= self.size || from == self.me {
            return Err(format!("a frame on a link with rank {from}"));
        }
        if self.is_rejoin_request(from, h.kind, h.origin, h.tag) {
            // From a rank this daemon may believe failed: checked there, not dropped here.
            self.on_rejoin_request(now, from, h.epoch, &payload);
            return Ok(());
        }
        if self.is_second_daemon_report(from, &h) {
            self.refuse_second_daemon(from);
            return Ok(());
        }
        if self.is_restored_adopter(from, &h) {
            // A daemon admitted back, which this daemon still believes dead, adopts it: its
            // notice names its restore (see `rejoin.rs`). Not before this daemon's own welcome,
            // which would overwrite the restores the notice told (it waits with the adopter's
            // `Sync` behind it, and is read again once welcomed: regression seed 24616).
            if !self.hold_until_welcome(from, h, &payload) {
                self.on_adopted(now, from, &payload);
            }
            return Ok(());
        }
        // A frame from an older incarnation of its sender than one already seen is left over
        // from before a restart: dropped and counted. Incarnations are learnt from the
        // handshake (`handle_link_up`, first contact) and from restores, never from frames: a
        // frame of a newer incarnation than known comes from a restart the DVM has not
        // confirmed here yet, which must not become the incarnation refused later.
        let known = self
            .incarnations
            .get(&from)
            .copied()
            .unwrap_or(self.incarnation_floor);
        if h.epoch < known {
            self.counters.dropped_old_incarnation += 1;
            log::debug!(
                "rank {}: dropped a frame from incarnation {} of rank {from} (known: {known})",
                self.me,
                h.epoch,
            );
            return Ok(());
        }
        if self.routing.is_failed(from) || self.routing.is_failed(h.origin) {
            self.counters.dropped_stale += 1;
            log::debug!(
                "rank {}: dropped a frame from failed rank {} (link {from})",
                self.me,
                h.origin
            );
            return Ok(());
        }
        let routed = matches!(h.kind, Kind::Msg | Kind::RelmData | Kind::Relm);
        if h.origin >= self.size || (routed && h.dst >= self.size) {
            return Err(format!("frame names a rank beyond {}", self.size));
        }
        if self.is_rejoining() && self.hold_until_welcome(from, h, &payload) {
            return Ok(());
        }
        // Told "declared dead" by a neighbour on the connection this daemon made: meant for
        // it, whatever life the neighbour names (the rank's newer one, when a restart was
        // admitted while this daemon hung: it dropped the notice and dialled again for ever).
        let told_dead = h.kind == Kind::Msg
            && h.tag == TAG_DECLARED_DEAD
            && h.origin == from
            && h.dst == self.me
            && !self.is_rejoining();
        if !told_dead && !self.same_lives(&h) {
            // Sent by or for another incarnation of its origin or destination (rejoin): what
            // was meant for a dead daemon never reaches the one that took its rank, and the
            // reverse. Reliable messages are sent again by their origin once it knows.
            self.counters.dropped_other_life += 1;
            log::debug!(
                "rank {}: dropped a message {} -> {} of lives {} -> {} (known: {} -> {})",
                self.me,
                h.origin,
                h.dst,
                h.origin_life(),
                h.dst_life(),
                self.life_of(h.origin),
                self.life_of(h.dst)
            );
            return Ok(());
        }
        // Asked of every frame: without direct links or marker waits the answer is no.
        if !(self.direct.is_empty() && self.marker_waits.is_empty())
            && self.keep_for_marker(now, from, h, &payload)
        {
            return Ok(());
        }
        match h.kind {
            Kind::Msg if h.dst == self.me => {
                self.deliver(
                    now,
                    Message {
                        origin: h.origin,
                        tag: h.tag,
                        payload,
                    },
                );
                Ok(())
            }
            Kind::Msg => {
                self.counters.relayed += 1;
                self.forward(h, payload.into(), None);
                Ok(())
            }
            Kind::Xcast => self.on_flood(now, from, h, payload),
            Kind::Grpcomm => self.on_grpcomm_frame(from, h, payload),
            Kind::RelmData => self.on_relm_data(now, from, h, payload),
            Kind::Relm => self.on_relm_control(now, from, h, payload),
            Kind::Heartbeat => {
                if h.tag & HEARTBEAT_PAUSING != 0 {
                    // Its silence towards our frames is flow control, not deafness.
                    self.paused_by.insert(from, now);
                    self.flow.handle_pausing(now, from);
                }
                Ok(())
            }
            Kind::Hello | Kind::HelloAck | Kind::Auth | Kind::Ready => {
                Err("handshake frame on an established connection".into())
            }
            // The driver takes its links' sessions; the node never sees one (the simulator's
            // links have no sessions of their own).
            Kind::Link => Err("link control frame handed to the node".into()),
        }
    }

    /// A flood frame: the contact table during wire-up (taken from whoever sends it first
    /// while not wired; authenticating peers is the handshake's job), or "rank 0 lost".
    fn on_flood(
        &mut self,
        now: Instant,
        from: Rank,
        h: Header,
        payload: Bytes,
    ) -> Result<(), String> {
        match h.tag {
            TAG_ROOT_LOST => {
                self.root_lost(now, &format!("told by rank {from}"));
                Ok(())
            }
            // A second copy (e.g. from a new parent after a repair) was already applied.
            super::wireup::TAG_WIREUP_TABLE => {
                self.apply_table(now, &payload);
                Ok(())
            }
            t => Err(format!("flood frame with tag {t}")),
        }
    }

    /// `peer` runs incarnation `incarnation`: learnt at first contact only. Nothing is stored
    /// for an incarnation at the floor: every peer is known to be at least there.
    ///
    /// A later incarnation is learnt only from a restore (rejoin), never from the peer itself:
    /// a newer one that shows up means the peer restarted, and until the DVM confirms its
    /// death and its return, the incarnation that must not rejoin is the one known here
    /// ([`Node::may_link`]); its frames are dropped meanwhile (lives).
    fn learn_incarnation(&mut self, peer: Rank, incarnation: u64) {
        if self.routing.is_failed(peer) || self.incarnations.contains_key(&peer) {
            return;
        }
        if incarnation > self.incarnation_floor || self.incarnation_floor == 0 {
            self.incarnations.insert(peer, incarnation);
        }
    }

    /// A message with a runtime tag (below `TAG_USER_MIN`) arrived here.
    pub(super) fn runtime_message(&mut self, now: Instant, msg: Message) {
        match msg.tag {
            super::wireup::TAG_WIREUP_REPORT if self.me == 0 => self.on_wireup_report(now, msg),
            TAG_FAULT_REPORT if self.me == 0 => self.on_report(now, msg.origin, &msg.payload),
            TAG_ADOPTED => self.on_adopted(now, msg.origin, &msg.payload),
            crate::faults::rejoin::TAG_WELCOME => self.on_welcome(now, &msg),
            crate::faults::rejoin::TAG_REJOIN_REFUSED => self.on_rejoin_refused(now, &msg),
            crate::faults::rejoin::TAG_SETTLED => self.on_settled(now, &msg),
            crate::faults::leave::TAG_LEAVE if self.me == 0 => {
                self.on_leave_request(now, msg.origin)
            }
            crate::faults::leave::TAG_LEFT => self.on_left(now, msg.origin),
            TAG_DECLARED_DEAD if msg.origin == 0 && self.leaving.is_some() => {
                // Rank 0 says "left" to a daemon whose departure it confirmed: this one failed
                // (a stall outlasted the heartbeat timeout) before its request got there.
                let why = "rank 0 declared this daemon dead before its departure was confirmed";
                log::error!("rank {}: {why}; exiting", self.me);
                self.begin_stop(now, super::StopReason::DeclaredDead(why.into()));
            }
            TAG_DECLARED_DEAD => {
                self.declared_dead(now, &format!("rank {} refused this daemon", msg.origin))
            }
            TAG_XCAST_REQUEST | TAG_XCAST_DONE => self.on_grpcomm_reliable(msg),
            crate::rml::batch_frame::TAG_BATCH => self.on_batch(now, msg),
            crate::direct::TAG_DIRECT => self.on_direct_message(now, msg),
            super::streams::TAG_STREAM => self.on_stream_message(now, msg),
            crate::status::TAG_STATUS => self.on_status_message(now, msg),
            crate::modex::wire::TAG_MODEX_REQUEST | crate::modex::wire::TAG_MODEX_REPLY => {
                self.on_modex_message(msg)
            }
            super::lookup::TAG_CONTACT_LOOKUP if self.me == 0 => self.on_lookup_request(msg),
            super::lookup::TAG_CONTACT_REPLY => self.on_lookup_reply(now, msg),
            crate::clients::wire::TAG_CLIENT_DATA | crate::clients::wire::TAG_CLIENT_CONTROL => {
                self.on_client_message(msg)
            }
            t => log::warn!(
                "rank {}: message with unexpected runtime tag {t} from {} dropped",
                self.me,
                msg.origin
            ),
        }
    }

    /// A batch frame for this daemon: its items are delivered in order as the messages they
    /// are, or, if any is malformed, none (`rml::batch_frame`).
    fn on_batch(&mut self, now: Instant, msg: Message) {
        match crate::rml::batch_frame::Items::new(msg.payload) {
            Ok(mut items) => {
                // The common case, a batch of one tag for one persistent receive: one run.
                if let Some(tag) = items.one_tag()
                    && let Some(receive) = self.matcher.match_persistent(msg.origin, tag)
                {
                    self.deliver_run(receive, items.whole_run(msg.origin, tag));
                    return;
                }
                // Consecutive items that one persistent receive takes go to the driver as one
                // run; any other item is matched on its own, as a lone message would be.
                let mut open: Option<(ReceiveId, ItemRun)> = None;
                while let Some((tag, at, start, end)) = items.next_span() {
                    if let Some((_, run)) = &mut open
                        && run.tag() == tag
                    {
                        run.extend_to(end);
                        continue;
                    }
                    if let Some((receive, run)) = open.take() {
                        self.deliver_run(receive, run);
                    }
                    match self.matcher.match_persistent(msg.origin, tag) {
                        Some(receive) => {
                            open = Some((receive, items.run(msg.origin, tag, at, end, 1)));
                        }
                        None => {
                            let payload = items.slice(start, end);
                            self.deliver(
                                now,
                                Message {
                                    origin: msg.origin,
                                    tag,
                                    payload,
                                },
                            );
                        }
                    }
                }
                if let Some((receive, run)) = open {
                    self.deliver_run(receive, run);
                }
            }
            Err(e) => log::warn!(
                "rank {}: batch frame from rank {} dropped: {e}",
                self.me,
                msg.origin
            ),
        }
    }

    /// Bytes arrived from neighbour `peer` (any frame, even a partial one, shows it alive).
    pub fn handle_heard(&mut self, now: Instant, peer: Rank) {
        if let Some(m) = &mut self.monitor {
            m.heard(peer, now);
        }
    }

    /// The transport's link to `peer` now uses the peer's `address` (`None`: no connection),
    /// and has failed over `failovers` times: shown in status reports (`LinkStatus`).
    pub fn handle_link_path(
        &mut self,
        peer: Rank,
        address: Option<std::net::SocketAddr>,
        failovers: u64,
    ) {
        if peer >= self.size {
            return;
        }
        if address.is_none() && failovers == 0 {
            self.link_paths.remove(&peer);
        } else {
            self.link_paths.insert(peer, (address, failovers));
        }
    }

    /// A connection with `peer` was established (handshake done), `incarnation` being the one
    /// it proved. `relink`: it replaces one that was lost, so frames in flight on the old one
    /// may be gone (RELM and the collectives re-state what the peer may have missed).
    pub fn handle_link_up(&mut self, now: Instant, peer: Rank, incarnation: u64, relink: bool) {
        self.learn_incarnation(peer, incarnation);
        // Before wire-up nothing is in flight that a lost link could have carried.
        if !relink || !self.is_wired() || self.routing.is_failed(peer) {
            return;
        }
        if self.is_neighbour(peer) {
            let paths = super::reliable::Paths::new(
                &self.routing,
                &self.direct,
                (&self.lives, self.my_life),
            );
            self.relm.handle_link_up(now, &paths, peer);
            self.handle_link_restate(now, peer);
        }
    }

    /// The established connection with `peer` was lost while both may live. Returns whether the
    /// driver must probe it (redial, bounded, even with nothing to send): a lost tree
    /// neighbour or rank 0 is declared failed only if it cannot be reached again.
    ///
    /// What arrived on the link before it ended is acted on first (the node pumps): the
    /// collectives deliver at the pump, and the driver may read a peer's end of stream in the
    /// same turn as the frames before it. A DVM shutdown broadcast followed by its sender's
    /// close then stops this daemon (no probe, and the driver logs no loss) instead of being
    /// delivered after a "lost connection; probing" alarm (issue "Real launchers", defect 2).
    ///
    /// A lost direct link is no failure: its frames take the tree ([`super::Output::Fallback`]).
    pub fn handle_link_lost(&mut self, now: Instant, peer: Rank) -> bool {
        self.marker_wait_link_lost(now, peer);
        self.flow.forget(peer);
        self.streams_reported(peer);
        if !self.is_neighbour(peer) {
            self.direct_link_lost(now, peer);
        }
        if self.stopping.is_none() {
            self.pump(now);
        }
        // A leaving daemon redials nobody: its neighbours close their connections to it as
        // they repair around it, and rank 0 dials it to say it may stop.
        self.stopping.is_none()
            && !self.departure_known()
            && self.is_wired()
            && (peer == 0 || self.is_neighbour(peer))
            && !self.routing.is_failed(peer)
    }

    /// A connection this daemon dialled to `peer` failed the handshake because `peer` did not
    /// prove the job key. Only rank 0's, before wire-up, is kept: should rank 0 stay
    /// unreachable, the stop names the key as the cause, not the network.
    pub fn handle_key_refused(&mut self, peer: Rank) {
        if peer == 0 && !self.is_wired() {
            self.root_refused_key = true;
        }
    }

    /// Whether the driver, its reconnect attempts to `peer` used up without an answer from
    /// the peer's host (no route, a network down or silent: not a refused connection), keeps
    /// dialling instead of calling [`handle_unreachable`](Self::handle_unreachable): true for a
    /// tree neighbour the heartbeats watch, once wired. Its silence then decides, after
    /// `heartbeat_timeout_ms` as for any neighbour, so that a network outage shorter than that
    /// costs no daemon. (A daemon whose own networks went down used its attempts up in about
    /// 1.5 s and stopped, rank 0 lost, though the outage lasted 6 s: from an outside-in
    /// review.) A refused connection still ends the attempts at once: the host answered and
    /// nothing of the DVM listens there, the daemon is gone.
    pub fn keeps_dialling(&self, peer: Rank) -> bool {
        self.is_wired()
            && self.stopping.is_none()
            && self.monitor.as_ref().is_some_and(|m| m.watches(peer))
    }

    /// `peer` could not be reached within the driver's bounded reconnect policy. Once wired,
    /// that is a failure of a tree neighbour or of rank 0, and only the end of a direct link
    /// for any other daemon (its messages take the tree); before, only rank 0 is dialled and
    /// this daemon cannot join the DVM.
    pub fn handle_unreachable(&mut self, now: Instant, peer: Rank, attempts: u32) {
        if self.is_wired() && !self.is_neighbour(peer) && (peer != 0 || self.direct.is_direct(peer))
        {
            // Dialled for a direct link, which is never a tree edge: no failure. (Rank 0,
            // dialled for wire-up, keeps its rule unless a link to it was being made.)
            self.direct_unreachable(now, peer, attempts);
            self.pump(now);
            return;
        }
        if self.is_wired() {
            let cause = format!("unreachable after {attempts} connection attempts");
            self.declare_failed(now, &[peer], &cause, true);
        } else if peer != 0 && matches!(self.wire, super::Wire::Rejoining(..)) {
            // Waiting for its welcome, a daemon has no tree: only rank 0 matters, and the
            // welcome names the dead (seed 5357: a neighbour's death seen then stopped it).
            log::debug!(
                "rank {}: rank {peer} unreachable while rejoining; ignored",
                self.me
            );
        } else if peer == 0
            && self.root_refused_key
            && matches!(self.wire, super::Wire::Rejoining(..))
            && self.stopping.is_none()
        {
            // Another key will not become this one: asking again until the rejoin's deadline
            // only hid the cause for two minutes (from an outside-in walkthrough).
            log::error!(
                "rank {}: rank 0 answered but does not hold this daemon's job key",
                self.me
            );
            self.begin_stop(
                now,
                super::StopReason::RootLost(super::FATAL_RANK_0_WRONG_KEY.into()),
            );
        } else if matches!(self.wire, super::Wire::Rejoining(..)) {
            // Rank 0 out of reach for a while (a partition, a switch restarting): the request
            // goes again every `REJOIN_RETRY_MS`, which dials again, until the rejoin's
            // deadline says no answer came (seed 2569 of `all,rejoin`).
            log::warn!(
                "rank {}: rank 0 unreachable after {attempts} attempts while rejoining; asking \
                 again until the rejoin's deadline",
                self.me
            );
        } else if self.me != 0 && self.stopping.is_none() {
            log::error!(
                "rank {}: cannot reach rank {peer} after {attempts} attempts",
                self.me
            );
            let cause = if peer == 0 && self.root_refused_key {
                super::FATAL_RANK_0_WRONG_KEY
            } else {
                super::FATAL_RANK_0_UNREACHABLE
            };
            self.begin_stop(now, super::StopReason::RootLost(cause.into()));
        }
    }

    /// The frame that tells rank `peer`, which this daemon knows failed and which just proved
    /// its identity on a new connection, that the DVM declared it dead. Rank 0 tells a rank
    /// whose departure (an orderly leave) every living daemon knows that it left instead: its
    /// own word of that may have been lost while the leaving daemon stalled (seed 402 of
    /// `crash,link,stall,partition,delay,stale,dup,leave`). The payload is empty either way.
    pub fn declared_dead_frame(&mut self, peer: Rank) -> Header {
        if self.me == 0 && self.departed.contains(&peer) {
            log::info!("rank 0: rank {peer}, which left, reconnected; telling it it left");
            return self.header(Kind::Msg, 0, peer, crate::faults::leave::TAG_LEFT, 0);
        }
        self.counters.dropped_stale += 1;
        log::warn!(
            "rank {}: rank {peer}, declared dead, tried to reconnect; telling it to exit",
            self.me
        );
        self.header(Kind::Msg, self.me, peer, TAG_DECLARED_DEAD, 0)
    }

    /// A heartbeat for `peer` to write on the link this daemon has to it, outside the monitor's
    /// schedule: the driver probes a link that `peer` has just dialled around (a write on a
    /// connection the peer closed draws a reset, so a link lost on one side only is found at
    /// once instead of at the next heartbeat or keepalive).
    pub fn probe_frame(&self, peer: Rank) -> Header {
        self.header(Kind::Heartbeat, self.me, peer, 0, 0)
    }
}
