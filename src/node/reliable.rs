//! The node's side of reliable messaging. The protocol is the sans-IO core in `src/relm/`;
//! this file feeds it (reliable sends, `RelmData` and `Relm` frames) and turns what it asks for
//! into outputs (frames, completions).
//!
//! * A reliable send to another rank goes to `Relm::send` with the driver's token as RELM's
//!   (none when nobody waits for the outcome): RELM's completion is the send's, with no table
//!   of its own here. The runtime's tokens are `RUNTIME_TOKEN_MIN` and above; the driver's are
//!   below. A stopping daemon fails what RELM still holds `ShutDown` (`Relm::waiting_tokens`)
//!   and lets no later completion through. A reliable send to this daemon is a self-send.
//! * A message RELM posts here goes to `Matcher::try_handle_message`, which refuses rather
//!   than evict a held message when the unmatched list is full: RELM then does not acknowledge
//!   it and the origin replays it later. Runtime messages are always taken.
//! * The runtime's own reliable messages (fault reports, broadcast requests and dones) use
//!   `Relm::send_runtime`, which has `RELM_RUNTIME_RESERVE` more room than users get; past it
//!   they wait where they are made (the xcast core, the unreported set), bounded, and go out as
//!   acknowledgements make room.
//! * Rank 0 takes a broadcast request from RELM only if its xcast core can hold it
//!   (`Xcast::hold_room`): otherwise RELM does not acknowledge it and the originator replays it
//!   later. Every other runtime message is always taken.

use super::{Node, Output};
use crate::Rank;
use crate::error::SendError;
use crate::grpcomm::{TAG_XCAST_DONE, TAG_XCAST_REQUEST};
use crate::oob::header::{Header, Kind};
use crate::relm::batch::{Items, Packed, Packer, TAG_BATCH};
use crate::relm::wire::{pack_seq, unpack_seq};
use crate::relm::{DataFrame, Event, Poster, Transmit};
use crate::rml::batch_frame::ItemRun;

use crate::rml::{Dispatch, Matcher, Message, ReceiveId, TAG_USER_MIN, Tag, is_user_tag};
use bytes::Bytes;
use std::time::Instant;

/// RELM tokens at or above this are the runtime's own messages: nobody waits for them.
const RUNTIME_TOKEN_MIN: u64 = 1 << 63;

/// Runtime tags that travel over RELM: fault reports to rank 0 must not be lost with a dying
/// relay (a lost report could leave a death unconfirmed, and survivors with different trees);
/// broadcast requests, and rank 0's dones and refusals, need reliability and per-origin order
/// (the xcast core requires both).
pub const RELIABLE_RUNTIME_TAGS: [Tag; 8] = [
    crate::faults::notice::TAG_FAULT_REPORT,
    crate::faults::leave::TAG_LEAVE,
    TAG_XCAST_REQUEST,
    TAG_XCAST_DONE,
    crate::modex::wire::TAG_MODEX_REQUEST,
    crate::modex::wire::TAG_MODEX_REPLY,
    crate::clients::wire::TAG_CLIENT_DATA,
    crate::clients::wire::TAG_CLIENT_CONTROL,
];

/// RELM's view of this daemon's paths: the repaired tree, and the direct links its own
/// messages take ([`crate::relm::Topology::direct`]).
pub(super) struct Paths<'a> {
    pub routing: &'a crate::routed::RoutingState,
    pub direct: &'a crate::direct::DirectLinks,
    /// The lives of the ranks admitted back (`Node::lives`), and this daemon's own.
    pub lives: &'a crate::fxhash::FxHashMap<Rank, u16>,
    pub my_life: u16,
}

impl<'a> Paths<'a> {
    /// Takes the two fields rather than the node, so that RELM can be borrowed beside it.
    pub fn new(
        routing: &'a crate::routed::RoutingState,
        direct: &'a crate::direct::DirectLinks,
        (lives, my_life): (&'a crate::fxhash::FxHashMap<Rank, u16>, u16),
    ) -> Paths<'a> {
        Paths {
            routing,
            direct,
            lives,
            my_life,
        }
    }
}

impl crate::relm::Topology for Paths<'_> {
    fn me(&self) -> Rank {
        self.routing.me()
    }
    fn next_hop(&self, target: Rank) -> Option<Rank> {
        crate::relm::Topology::next_hop(self.routing, target)
    }
    fn is_failed(&self, r: Rank) -> bool {
        self.routing.is_failed(r)
    }
    fn depth(&self) -> u32 {
        self.routing.depth()
    }
    fn parent(&self) -> Option<Rank> {
        self.routing.parent()
    }
    fn children(&self) -> &[Rank] {
        self.routing.children()
    }
    fn direct(&self, target: Rank) -> bool {
        self.direct.is_direct(target)
    }
    fn life(&self, r: Rank) -> u16 {
        super::life_in((self.routing.me(), self.my_life), self.lives, r)
    }
}

impl Node {
    pub(super) fn next_runtime_token(&mut self) -> u64 {
        let t = self.relm_next_token | RUNTIME_TOKEN_MIN;
        self.relm_next_token = (self.relm_next_token + 1) & !RUNTIME_TOKEN_MIN;
        t
    }

    /// The users' reliable sends RELM still holds, ascending by token (for `begin_stop`).
    pub(super) fn relm_waiting_users(&self) -> Vec<u64> {
        let mut tokens = self.relm.waiting_tokens();
        tokens.retain(|t| *t < RUNTIME_TOKEN_MIN);
        tokens
    }

    /// The users' reliable sends to other daemons this daemon holds: RELM's unacknowledged
    /// ones and those waiting for wire-up. The driver admits new ones against
    /// `relm_unacked_max` with this (`driver/relm_window.rs`), so RELM never refuses one for
    /// its window.
    pub fn reliable_held(&self) -> usize {
        let waiting = if self.prewire.is_empty() {
            0
        } else {
            self.prewire
                .iter()
                .filter(
                    |c| matches!(c, super::Command::SendReliable { dst, .. } if *dst != self.me),
                )
                .count()
        };
        self.relm.user_unacked() + waiting
    }

    /// A reliable send originated here (once wired).
    pub(super) fn send_reliable(
        &mut self,
        now: Instant,
        dst: Rank,
        tag: Tag,
        payload: Bytes,
        token: Option<u64>,
    ) -> Result<(), SendError> {
        if dst == self.me {
            self.send(dst, tag, payload, token);
            return Ok(());
        }
        // The route setting and the auto policy count reliable messages too; RELM takes a
        // link once one is open (its chains keep order and exactly-once across the switch).
        if !self.is_neighbour(dst) && !self.routing.is_failed(dst) {
            let (epoch, uri) = (self.epoch, &self.uri);
            self.direct.route(now, dst, 1, payload.len(), None, || {
                (
                    epoch,
                    uri.as_ref().map(|u| u.to_string()).unwrap_or_default(),
                )
            });
            self.send_direct_control(now);
        }
        // The driver's tokens are small (slab keys); one in the runtime's range would be taken
        // for the runtime's and its completion lost.
        if token.is_some_and(|t| t >= RUNTIME_TOKEN_MIN) {
            crate::bug!("a user's token {token:?} in the runtime's range");
            return Err(SendError::Busy(crate::error::Limit::ReliableWindow));
        }
        let paths = Paths::new(&self.routing, &self.direct, (&self.lives, self.my_life));
        self.relm.send(now, &paths, dst, tag, payload, token)
    }

    /// A `RelmData` frame from neighbour `from` (checked: not from a failed rank, ranks in
    /// range). A stopping daemon ignores RELM input: it sends nothing more, so it must not
    /// post what it could not acknowledge (the origin then hears node-down, truthfully).
    pub(super) fn on_relm_data(
        &mut self,
        now: Instant,
        from: Rank,
        h: Header,
        payload: Bytes,
    ) -> Result<(), String> {
        if self.stopping.is_some() {
            return Ok(());
        }
        if h.tag == TAG_BATCH {
            let items = Items::new(payload, h.origin, h.dst, travels_reliably)
                .map_err(|e| e.to_string())?;
            return self
                .relm_input(now, |relm, paths, post| {
                    relm.handle_batch(now, paths, from, items, post)
                })
                .map_err(|e| format!("reliable batch: {e}"));
        }
        if !travels_reliably(h.tag) {
            return Err(format!("reliable message with reserved tag {}", h.tag));
        }
        let (uid, prev) = unpack_seq(h.seq);
        let d = DataFrame {
            origin: h.origin,
            dst: h.dst,
            tag: h.tag,
            uid,
            prev,
            payload,
        };
        self.relm_input(now, |relm, paths, post| {
            relm.handle_data(now, paths, from, d, post)
        })
        .map_err(|e| format!("reliable message: {e}"))
    }

    /// A `Relm` control frame from neighbour `from`.
    pub(super) fn on_relm_control(
        &mut self,
        now: Instant,
        from: Rank,
        h: Header,
        payload: Bytes,
    ) -> Result<(), String> {
        if self.stopping.is_some() {
            return Ok(());
        }
        if h.origin != from || h.dst != self.me {
            return Err(format!(
                "RELM control frame from {} to {} on the link with rank {from}",
                h.origin, h.dst
            ));
        }
        self.relm_input(now, |relm, paths, post| {
            relm.handle_control(now, paths, from, &payload, post)
        })
        .map_err(|e| format!("RELM control: {e}"))
    }

    /// Feeds RELM one input with receive matching as its `post`; what it posted is delivered
    /// once the call has returned.
    fn relm_input(
        &mut self,
        now: Instant,
        input: impl FnOnce(
            &mut crate::relm::Relm,
            &dyn crate::relm::Topology,
            &mut crate::relm::Post<'_>,
        ) -> Result<(), crate::relm::ControlError>,
    ) -> Result<(), crate::relm::ControlError> {
        let refused = self.relm.stats().refused;
        // Empty if an input is already being delivered (a callback's send): then new ones.
        let (mut ready, mut runtime) = std::mem::take(&mut self.relm_posted);
        let mut poster = NodePoster {
            matcher: &mut self.matcher,
            clients: &self.clients,
            ready: &mut ready,
            runtime: &mut runtime,
            run: None,
            held_back: 0,
            // Rank 0 takes no more broadcast requests than its xcast core can hold (elsewhere
            // a request is stale, and the core ignores it).
            hold_room: match self.me {
                0 => self.xcast.hold_room(),
                _ => (usize::MAX, usize::MAX),
            },
        };
        let paths = Paths::new(&self.routing, &self.direct, (&self.lives, self.my_life));
        let res = input(&mut self.relm, &paths, &mut poster);
        let (held_back, run) = (poster.held_back, poster.run);
        for _ in 0..held_back {
            self.clients.held_back();
        }
        self.posted_by_relm(now, &mut ready, &mut runtime, refused);
        // A run is a whole batch, posted alone: nothing else was posted with it.
        if let Some((receive, run)) = run {
            self.deliver_run(receive, run);
        }
        if ready.capacity() <= crate::limits::RELM_POSTED_KEPT_MAX
            && runtime.capacity() <= crate::limits::RELM_POSTED_KEPT_MAX
        {
            self.relm_posted = (ready, runtime);
        }
        res
    }

    /// Delivers what RELM posted, now that its call has returned, and warns (at the first of
    /// each power of two) when the full unmatched list refused some.
    fn posted_by_relm(
        &mut self,
        now: Instant,
        ready: &mut Vec<Dispatch>,
        runtime: &mut Vec<Message>,
        refused_before: u64,
    ) {
        for d in ready.drain(..) {
            self.dispatch(d);
        }
        for m in runtime.drain(..) {
            self.runtime_message(now, m);
        }
        let refused = self.relm.stats().refused;
        if refused > refused_before && (refused_before + 1..=refused).any(|n| n.is_power_of_two()) {
            log::warn!(
                "rank {}: refused a reliable message (unmatched list or pending bound full; \
                 its origin replays it later); {refused} so far",
                self.me
            );
        }
    }

    /// A runtime message for rank `to` over RELM. The caller has checked
    /// `Relm::has_runtime_room` (`pump_grpcomm`); a refusal is a bug (logged and counted).
    pub(super) fn runtime_reliable(&mut self, now: Instant, to: Rank, tag: Tag, payload: Bytes) {
        if to == self.me {
            self.deliver(
                now,
                Message {
                    origin: to,
                    tag,
                    payload,
                },
            );
            return;
        }
        let token = self.next_runtime_token();
        let paths = Paths::new(&self.routing, &self.direct, (&self.lives, self.my_life));
        match self.relm.send_runtime(now, &paths, to, tag, payload, token) {
            Ok(()) => {}
            Err(SendError::Busy(_)) => {
                crate::bug!(
                    "rank {}: runtime message {tag} for {to} found RELM's window full",
                    self.me
                );
                self.counters.dropped_queue_full += 1;
            }
            Err(e) => {
                // To a dead rank: its requests and broadcasts died with it.
                log::debug!("rank {}: runtime message to {to} not sent: {e}", self.me);
            }
        }
    }

    /// Turns what RELM asked for into outputs: its frames and its completions.
    pub(super) fn pump_relm(&mut self, now: Instant) {
        if self.stopping.is_none() {
            self.flush_reports(now);
        }
        // Consecutive small messages of one chain for one neighbour leave as one batch frame
        // (`relm::batch`); every other frame leaves in RELM's order around them.
        let mut packer = Packer::with_frame_max(self.msg_max_bytes);
        while let Some(t) = self.relm.poll_transmit() {
            if self.stopping.is_some() {
                continue;
            }
            match t {
                Transmit::Data { to, frame } if Packer::packable(&frame) => {
                    if let Some(p) = packer.push(to, frame) {
                        self.transmit_packed(p);
                    }
                }
                Transmit::Data { to, frame } => {
                    if let Some(p) = packer.finish() {
                        self.transmit_packed(p);
                    }
                    self.transmit_packed(Packed::One { to, frame });
                }
                Transmit::Control { to, control } => {
                    if let Some(p) = packer.finish() {
                        self.transmit_packed(p);
                    }
                    let p = control.encode();
                    let h = self.header(Kind::Relm, self.me, to, 0, p.len());
                    self.transmit_relm(to, h, p);
                }
            }
        }
        if let Some(p) = packer.finish() {
            self.transmit_packed(p);
        }
        while let Some(Event::Completed { token, result }) = self.relm.poll_event() {
            // A stopping daemon already failed its users' sends `ShutDown` (`begin_stop`).
            if token < RUNTIME_TOKEN_MIN && self.stopping.is_none() {
                self.out.push_back(Output::SendDone { token, result });
            }
        }
    }
}

impl Node {
    /// Sends a lone reliable message or a batch of one chain's.
    fn transmit_packed(&mut self, p: Packed) {
        let (to, header, payload) = match p {
            Packed::One { to, frame: f } => {
                let mut h = self.header(Kind::RelmData, f.origin, f.dst, f.tag, f.payload.len());
                h.seq = pack_seq(f.uid, f.prev);
                (to, h, f.payload)
            }
            Packed::Batch {
                to,
                origin,
                dst,
                payload,
                items: _,
            } => {
                let h = self.header(Kind::RelmData, origin, dst, TAG_BATCH, payload.len());
                (to, h, payload)
            }
        };
        self.transmit_relm(to, header, payload);
    }

    /// Sends one of RELM's frames to neighbour `to`, unless `to` is gone.
    fn transmit_relm(&mut self, to: Rank, header: Header, payload: Bytes) {
        // Queued in RELM before a repair that failed `to`: RELM replays what matters.
        if to == self.me || to >= self.size || self.routing.is_failed(to) {
            log::debug!("rank {}: RELM frame for rank {to} dropped", self.me);
            return;
        }
        // For a daemon that is neither a tree neighbour nor reached by a direct link (the
        // link fell back since RELM chose it): RELM resent its messages over the tree on
        // the fallback, and a lost control frame is asked for again or retransmitted.
        if !self.is_neighbour(to) && !self.direct.is_direct(to) {
            log::debug!(
                "rank {}: RELM frame for rank {to}, no longer linked, dropped",
                self.me
            );
            return;
        }
        self.transmit(to, header, payload, None);
    }
}

/// Whether a message with `tag` may travel over RELM: a user's, or one of
/// [`RELIABLE_RUNTIME_TAGS`].
fn travels_reliably(tag: Tag) -> bool {
    tag >= TAG_USER_MIN || RELIABLE_RUNTIME_TAGS.contains(&tag)
}

/// RELM's `post`: hands a message to receive matching unless the matcher would have to evict a
/// held message to keep it. The dispatch waits in `ready` (delivered after RELM returns).
/// The node's receive matching as RELM posts to it, for the length of one input.
struct NodePoster<'a> {
    matcher: &'a mut Matcher,
    clients: &'a crate::clients::Clients,
    ready: &'a mut Vec<Dispatch>,
    runtime: &'a mut Vec<Message>,
    /// A whole batch one persistent receive took.
    run: Option<(ReceiveId, ItemRun)>,
    /// Client messages refused for want of room at their local receiver.
    held_back: u64,
    /// What rank 0's xcast core can still hold (count, bytes).
    hold_room: (usize, usize),
}

impl Poster for NodePoster<'_> {
    fn post(&mut self, origin: Rank, tag: Tag, payload: Bytes) -> bool {
        let m = Message {
            origin,
            tag,
            payload,
        };
        // A client message waits at its origin while its receiver's queue is full.
        if m.tag == crate::clients::wire::TAG_CLIENT_DATA
            && let Some(to) = crate::clients::wire::DataHeader::peek_to_local(&m.payload)
            && !self.clients.room(to, m.payload.len())
        {
            self.held_back += 1;
            return false;
        }
        post_to(
            self.matcher,
            self.ready,
            self.runtime,
            &mut self.hold_room,
            m,
        )
    }

    /// Only the users' messages, for a persistent receive, and one run per input with nothing
    /// else posted in it (the run is delivered after what was posted: `relm_input`).
    fn post_run(&mut self, run: ItemRun) -> bool {
        if !is_user_tag(run.tag())
            || self.run.is_some()
            || !self.ready.is_empty()
            || !self.runtime.is_empty()
        {
            return false;
        }
        match self.matcher.match_persistent(run.origin(), run.tag()) {
            Some(receive) => {
                self.run = Some((receive, run));
                true
            }
            None => false,
        }
    }
}

fn post_to(
    matcher: &mut Matcher,
    ready: &mut Vec<Dispatch>,
    runtime: &mut Vec<Message>,
    (count, bytes): &mut (usize, usize),
    m: Message,
) -> bool {
    if m.tag == TAG_XCAST_REQUEST {
        if *count == 0 || *bytes < m.payload.len() {
            return false;
        }
        *count -= 1;
        *bytes -= m.payload.len();
    }
    // Runtime notices are handled by the node itself, never held: always posted.
    if m.tag < TAG_USER_MIN {
        runtime.push(m);
        return true;
    }
    match matcher.try_handle_message(m) {
        Ok(d) => {
            ready.push(d);
            true
        }
        Err(_) => false,
    }
}
