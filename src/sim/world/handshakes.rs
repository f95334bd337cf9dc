//! Connections with their handshake, in runs with strangers (`--faults stranger`): every
//! redial runs the real [`Handshake`] on both ends (real frames and MACs) and the acceptor
//! decides with the real link rule ([`admit`]), as the driver does; a stranger without the key
//! connects claiming a rank, sends a `Hello` (and perhaps a forged `Auth`), and is refused or
//! times out. What this checks, across seeds and under every other fault:
//!
//! - a stranger's connection never proves the key and never changes a link or a dial;
//! - a daemon never closes a connection the other end has admitted (the link rule's promise);
//! - each daemon holds at most one link per peer, and a pair comes up only on one connection
//!   both ends hold as their link;
//! - the world's liveness checks then see the redials through: parked frames go out, nothing
//!   waits for ever.
//!
//! Simplification: frames wait (parked) until both ends hold the link, where the driver lets
//! the acceptor send right behind its `Ready`.

use super::{Ev, World};
use crate::Rank;
use crate::oob::arbiter::{Admission, DialPhase, LinkDialler, admit};
use crate::oob::frame::Frame;
use crate::oob::handshake::{Handshake, HandshakeConfig, HandshakeEvent, JobKey, NONCE_LEN};
use crate::oob::header::{Header, Kind};
use crate::sim::check::Violation;
use bytes::Bytes;
use std::collections::HashMap;

/// A connection still in its handshake is closed after this long (the driver's default).
const HANDSHAKE_TIMEOUT_US: u64 = 5_000_000;

/// One connection and both its ends.
pub(super) struct SimConn {
    dialler: Rank,
    acceptor: Rank,
    stranger: bool,
    d: Handshake,
    a: Handshake,
    d_open: bool,
    a_open: bool,
    /// The pair's connection generation when it was opened: a drop since ends it.
    generation: u64,
    /// The dialler's redial attempt it belongs to.
    attempt: u32,
}

/// One daemon's view of one peer: its link (and who dialled it) and its own dial.
#[derive(Default, Clone, Copy)]
struct HsLink {
    link: Option<(u64, LinkDialler)>,
    dial: Option<u64>,
}

/// The world's handshake state, present only in runs with strangers.
#[derive(Default)]
pub(super) struct Handshakes {
    conns: HashMap<u64, SimConn>,
    links: HashMap<(Rank, Rank), HsLink>,
    next: u64,
    /// Per (connection, towards the acceptor): when its last frame arrives (FIFO).
    last: HashMap<(u64, bool), u64>,
    pub(super) strangers: u64,
    pub(super) refused: u64,
    pub(super) crossed: u64,
}

fn violation(detail: String) -> Violation {
    Violation {
        checker: "links",
        detail,
    }
}

fn config(me: Rank, size: u32, key: &[u8]) -> HandshakeConfig {
    HandshakeConfig {
        me,
        size,
        epoch: 1,
        dvm_id: "sim".into(),
        key: JobKey::new(key.to_vec()),
    }
}

const JOB_KEY: &[u8] = b"the simulated DVM's job key....";
const STRANGER_KEY: &[u8] = b"a stranger's guess at the key..";

fn nonce(id: u64, side: u8) -> [u8; NONCE_LEN] {
    let mut n = [side; NONCE_LEN];
    n[..8].copy_from_slice(&id.to_le_bytes());
    n
}

impl World {
    fn hs_size(&self) -> u32 {
        self.nodes.len() as u32
    }

    /// Opens a connection from `dialler` (or a stranger claiming it) to `acceptor`.
    fn hs_open(
        &mut self,
        dialler: Rank,
        acceptor: Rank,
        stranger: bool,
        attempt: u32,
    ) -> Option<u64> {
        let size = self.hs_size();
        let generation = self.generation(dialler, acceptor);
        let hs = self.hs.as_mut()?;
        hs.next += 1;
        let id = hs.next;
        let key = if stranger { STRANGER_KEY } else { JOB_KEY };
        let d = Handshake::dial(&config(dialler, size, key), acceptor, nonce(id, 1));
        let a = Handshake::accept(&config(acceptor, size, JOB_KEY), nonce(id, 2));
        hs.conns.insert(
            id,
            SimConn {
                dialler,
                acceptor,
                stranger,
                d,
                a,
                d_open: true,
                a_open: true,
                generation,
                attempt,
            },
        );
        self.hs_flush(id);
        let at = self.now_us + HANDSHAKE_TIMEOUT_US;
        self.push(
            at,
            Ev::HsTimeout {
                conn: id,
                node: (!stranger).then_some(dialler),
            },
        );
        Some(id)
    }

    /// Puts what either end of `id` has queued on the wire.
    fn hs_flush(&mut self, id: u64) {
        let mut out: Vec<(bool, Frame)> = Vec::new();
        let Some(c) = self.hs.as_mut().and_then(|h| h.conns.get_mut(&id)) else {
            return;
        };
        while let Some((header, payload)) = c.d.poll_transmit() {
            out.push((true, Frame { header, payload }));
        }
        while let Some((header, payload)) = c.a.poll_transmit() {
            out.push((false, Frame { header, payload }));
        }
        for (to_acceptor, f) in out {
            self.hs_send(id, to_acceptor, Some(f));
        }
    }

    /// One frame (or the end, `None`) along `id`, in order, with the pair's latency.
    fn hs_send(&mut self, id: u64, to_acceptor: bool, frame: Option<Frame>) {
        let Some(c) = self.hs.as_ref().and_then(|h| h.conns.get(&id)) else {
            return;
        };
        let (from, to, stranger) = if to_acceptor {
            (c.dialler, c.acceptor, c.stranger)
        } else {
            (c.acceptor, c.dialler, c.stranger)
        };
        let lat =
            self.scen.latency_us + self.rng.range(0, self.scen.jitter_us) + self.spread(from, to);
        let now = self.now_us;
        let Some(hs) = self.hs.as_mut() else {
            return;
        };
        let last = hs.last.entry((id, to_acceptor)).or_insert(0);
        let at = (now + lat).max(*last);
        *last = at;
        // The stranger's own end is nobody's work and runs on no daemon.
        let node = (to_acceptor || !stranger).then_some(to);
        self.push(
            at,
            Ev::Hs {
                conn: id,
                to_acceptor,
                node,
                frame,
            },
        );
    }

    /// `node` dials `peer` through the handshake (the redial under way stays recorded until
    /// the pair is up or the dial fails).
    pub(super) fn hs_dial(
        &mut self,
        node: Rank,
        peer: Rank,
        attempt: u32,
    ) -> Result<(), Violation> {
        let Some(hs) = self.hs.as_ref() else {
            return Ok(());
        };
        let l = hs.links.get(&(node, peer)).copied().unwrap_or_default();
        if l.dial.is_some() || l.link.is_some() {
            // A dial is under way, or this end already holds the link the peer's dial made.
            return Ok(());
        }
        self.redialing.insert((node, peer));
        log::trace!(
            "{} us: rank {node} dials {peer} (attempt {attempt})",
            self.now_us
        );
        if let Some(id) = self.hs_open(node, peer, false, attempt)
            && let Some(hs) = self.hs.as_mut()
        {
            hs.links.entry((node, peer)).or_default().dial = Some(id);
        }
        Ok(())
    }

    /// A stranger connects to `target` claiming `claims`.
    pub(super) fn hs_stranger(&mut self, target: Rank, claims: Rank, forge: bool) {
        if !self.living(target) {
            return;
        }
        let Some(id) = self.hs_open(claims, target, true, 0) else {
            return;
        };
        if let Some(hs) = self.hs.as_mut() {
            hs.strangers += 1;
        }
        if forge {
            let header = Header {
                kind: Kind::Auth,
                origin: claims,
                dst: target,
                tag: 0,
                epoch: 1,
                seq: 0,
                len: 32,
                lives: 0,
            };
            let payload = Bytes::from(vec![0x42; 32]);
            self.hs_send(id, true, Some(Frame { header, payload }));
        }
    }

    /// `rank` restarted: the new process starts with no handshake state of its own (its old
    /// life's dials and links were the dead process's; a dial it kept "under way" made it
    /// refuse every dial of its parent as a crossing one, for ever: regression seed 28614).
    pub(super) fn hs_restarted(&mut self, rank: Rank) {
        if let Some(hs) = self.hs.as_mut() {
            hs.links.retain(|(x, _), _| *x != rank);
        }
    }

    /// The pair's connection dropped (a link fault, or one closed it on a death): neither end
    /// holds a link any more, and handshakes under way on it are over.
    pub(super) fn hs_pair_dropped(&mut self, a: Rank, b: Rank) {
        let Some(hs) = self.hs.as_mut() else {
            return;
        };
        for k in [(a, b), (b, a)] {
            if let Some(l) = hs.links.get_mut(&k) {
                l.link = None;
            }
        }
    }

    pub(super) fn hs_frame(
        &mut self,
        id: u64,
        to_acceptor: bool,
        frame: Option<Frame>,
    ) -> Result<(), Violation> {
        let Some(c) = self.hs.as_ref().and_then(|h| h.conns.get(&id)) else {
            return Ok(());
        };
        let (dialler, acceptor, stranger) = (c.dialler, c.acceptor, c.stranger);
        let me = if to_acceptor { acceptor } else { dialler };
        let open = if to_acceptor { c.a_open } else { c.d_open };
        if !open || (stranger && !to_acceptor) || !self.living(me) {
            return Ok(());
        }
        let dropped = c.generation != self.generation(dialler, acceptor);
        let Some(f) = frame.filter(|_| !dropped) else {
            return self.hs_end(id, to_acceptor);
        };
        if to_acceptor {
            self.hs_at_acceptor(id, f)
        } else {
            self.hs_at_dialler(id, f)
        }
    }

    fn hs_at_acceptor(&mut self, id: u64, f: Frame) -> Result<(), Violation> {
        let Some(c) = self.hs.as_mut().and_then(|h| h.conns.get_mut(&id)) else {
            return Ok(());
        };
        let (x, peer, stranger) = (c.acceptor, c.dialler, c.stranger);
        match c.a.handle_frame(f) {
            Ok(None) => self.hs_flush(id),
            Ok(Some(HandshakeEvent::HelloReceived(_))) => {
                // Answered, and nothing else: no link state looks at an unproven Hello.
                c.a.try_accept_peer();
                self.hs_flush(id);
            }
            Ok(Some(HandshakeEvent::Authenticated(p))) => {
                if stranger || p.rank != peer {
                    return Err(violation(format!(
                        "rank {x}: a connection proved the key as rank {} (stranger: {stranger})",
                        p.rank
                    )));
                }
                return self.hs_decide(id, x, peer);
            }
            Ok(Some(HandshakeEvent::Established(_))) => {
                return Err(violation(format!(
                    "rank {x}: established without admitting"
                )));
            }
            Err(e) if stranger => {
                let _ = e;
                if let Some(hs) = self.hs.as_mut() {
                    hs.refused += 1;
                }
                self.hs_close(id, x)?;
            }
            Err(e) => {
                return Err(violation(format!(
                    "rank {x}: the handshake with rank {peer} failed: {e}"
                )));
            }
        }
        Ok(())
    }

    /// Acceptor `x` applies the link rule to the proved connection `id` from `peer`.
    fn hs_decide(&mut self, id: u64, x: Rank, peer: Rank) -> Result<(), Violation> {
        let Some(hs) = self.hs.as_mut() else {
            return Ok(());
        };
        let l = hs.links.get(&(x, peer)).copied().unwrap_or_default();
        let dial = match l.dial.and_then(|d| hs.conns.get(&d)) {
            None => None,
            Some(c) if c.d.is_established() => {
                return Err(violation(format!(
                    "rank {x}: an established dial to {peer} that is not its link"
                )));
            }
            Some(c) if c.d.has_sent_proof() => Some(DialPhase::ProofSent),
            Some(_) => Some(DialPhase::Unproven),
        };
        if dial.is_some() {
            hs.crossed += 1;
        }
        let decision = admit(x, peer, l.link.map(|(_, w)| w), dial);
        log::trace!(
            "{} us: rank {x} decides on {peer}'s connection {id} (link {:?}, dial {dial:?}): {decision:?}",
            self.now_us,
            l.link
        );
        match decision {
            Admission::Admit {
                close_dial,
                replace_link,
            } => {
                if replace_link {
                    // The world drops a pair's connection on both ends at once, so a peer
                    // never dials over a link this end still holds.
                    return Err(violation(format!(
                        "rank {x}: rank {peer} dialled over a link both still hold"
                    )));
                }
                if close_dial && let Some(d) = l.dial {
                    self.hs_close(d, x)?;
                }
                let Some(hs) = self.hs.as_mut() else {
                    return Ok(());
                };
                if let Some(c) = hs.conns.get_mut(&id) {
                    c.a.admit();
                }
                let e = hs.links.entry((x, peer)).or_default();
                e.link = Some((id, LinkDialler::There));
                e.dial = None;
                // This end is linked: its own redial (if any) is over.
                self.redialing.remove(&(x, peer));
                self.hs_flush(id);
                self.hs_up(x, peer)
            }
            Admission::Refuse { .. } => self.hs_close(id, x),
        }
    }

    fn hs_at_dialler(&mut self, id: u64, f: Frame) -> Result<(), Violation> {
        let Some(c) = self.hs.as_mut().and_then(|h| h.conns.get_mut(&id)) else {
            return Ok(());
        };
        let (x, peer) = (c.dialler, c.acceptor);
        match c.d.handle_frame(f) {
            Ok(None) => {
                // The acceptor proved the key; the proof goes back.
                self.hs_flush(id);
                Ok(())
            }
            Ok(Some(HandshakeEvent::Established(_))) => {
                let Some(hs) = self.hs.as_mut() else {
                    return Ok(());
                };
                let e = hs.links.entry((x, peer)).or_default();
                if e.link.is_some() || e.dial != Some(id) {
                    return Err(violation(format!(
                        "rank {x}: admitted by {peer} on a connection that is not its dial"
                    )));
                }
                e.dial = None;
                e.link = Some((id, LinkDialler::Here));
                self.redialing.remove(&(x, peer));
                self.hs_up(x, peer)
            }
            other => Err(violation(format!(
                "rank {x}: dialling rank {peer}: {other:?}"
            ))),
        }
    }

    /// Daemon `x` closes its end of `id`: the other end reads the end of it.
    fn hs_close(&mut self, id: u64, x: Rank) -> Result<(), Violation> {
        let Some(hs) = self.hs.as_mut() else {
            return Ok(());
        };
        let Some(c) = hs.conns.get_mut(&id) else {
            return Ok(());
        };
        let to_acceptor = c.dialler == x && !c.stranger;
        let (mine, theirs, theirs_open) = if to_acceptor {
            c.d_open = false;
            (&c.d, &c.a, c.a_open)
        } else {
            c.a_open = false;
            (&c.a, &c.d, c.d_open)
        };
        if mine.is_established() || (theirs_open && theirs.is_established()) {
            return Err(violation(format!(
                "rank {x} closed a connection with rank {} that was admitted",
                if to_acceptor { c.acceptor } else { c.dialler }
            )));
        }
        let peer = if to_acceptor { c.acceptor } else { c.dialler };
        if let Some(l) = hs.links.get_mut(&(x, peer))
            && l.dial == Some(id)
        {
            l.dial = None;
        }
        self.hs_send(id, to_acceptor, None);
        Ok(())
    }

    /// The end of `id` reached one of its ends (closed by the other, or dropped).
    fn hs_end(&mut self, id: u64, at_acceptor: bool) -> Result<(), Violation> {
        let Some(hs) = self.hs.as_mut() else {
            return Ok(());
        };
        let Some(c) = hs.conns.get_mut(&id) else {
            return Ok(());
        };
        let generation_now = c.generation;
        if at_acceptor {
            c.a_open = false;
        } else {
            c.d_open = false;
        }
        let (x, peer, attempt) = if at_acceptor {
            (c.acceptor, c.dialler, c.attempt)
        } else {
            (c.dialler, c.acceptor, c.attempt)
        };
        let stranger = c.stranger;
        let done = !c.a_open && (!c.d_open || stranger);
        let l = hs.links.get(&(x, peer)).copied().unwrap_or_default();
        if done {
            hs.conns.remove(&id);
            hs.last.remove(&(id, true));
            hs.last.remove(&(id, false));
        }
        if stranger {
            return Ok(());
        }
        if l.link.map(|(c, _)| c) == Some(id) && generation_now == self.generation(x, peer) {
            return Err(violation(format!(
                "rank {x}: its link with rank {peer} was closed by the other end"
            )));
        }
        if !at_acceptor && l.dial == Some(id) {
            log::trace!("{} us: rank {x}'s dial {id} to {peer} ended", self.now_us);
            self.hs_dial_failed(x, peer, attempt);
        }
        Ok(())
    }

    /// `x`'s dial to `peer` ended without a link: dial again (backed off) while the pair is
    /// still down and nothing else linked it.
    fn hs_dial_failed(&mut self, x: Rank, peer: Rank, attempt: u32) {
        if let Some(l) = self.hs.as_mut().and_then(|h| h.links.get_mut(&(x, peer))) {
            l.dial = None;
            if l.link.is_some() {
                self.redialing.remove(&(x, peer));
                return;
            }
        }
        if self.conn_lost.contains(&Self::pair(x, peer)) && self.living(x) {
            self.redial(x, peer, attempt.saturating_add(1).max(2));
        } else {
            self.redialing.remove(&(x, peer));
        }
    }

    /// Handshake timeout: an end still in its handshake closes.
    pub(super) fn hs_timeout(&mut self, id: u64) -> Result<(), Violation> {
        let Some(c) = self.hs.as_ref().and_then(|h| h.conns.get(&id)) else {
            return Ok(());
        };
        let established = c.a.is_established() || c.d.is_established();
        let (dialler, acceptor, stranger) = (c.dialler, c.acceptor, c.stranger);
        let (a_open, d_open) = (c.a_open, c.d_open);
        if !stranger && !self.living(dialler) {
            // A dialler that died with its dial: nothing of it waits any more.
            if let Some(l) = self
                .hs
                .as_mut()
                .and_then(|h| h.links.get_mut(&(dialler, acceptor)))
                && l.dial == Some(id)
            {
                l.dial = None;
            }
            self.redialing.remove(&(dialler, acceptor));
        }
        if established {
            return Ok(());
        }
        if a_open && self.living(acceptor) {
            self.hs_close(id, acceptor)?;
        }
        if !stranger && d_open && self.living(dialler) {
            let dial = self
                .hs
                .as_ref()
                .and_then(|h| h.links.get(&(dialler, acceptor)))
                .and_then(|l| l.dial);
            self.hs_close(id, dialler)?;
            if dial == Some(id) {
                let attempt = self
                    .hs
                    .as_ref()
                    .and_then(|h| h.conns.get(&id))
                    .map_or(1, |c| c.attempt);
                self.hs_dial_failed(dialler, acceptor, attempt);
            }
        }
        Ok(())
    }

    /// When both ends hold `id` as their link, the pair is up: as after a redial in runs
    /// without strangers (both link-ups, then what waited, in order).
    fn hs_up(&mut self, a: Rank, b: Rank) -> Result<(), Violation> {
        let Some(hs) = self.hs.as_ref() else {
            return Ok(());
        };
        let la = hs.links.get(&(a, b)).and_then(|l| l.link).map(|(c, _)| c);
        let lb = hs.links.get(&(b, a)).and_then(|l| l.link).map(|(c, _)| c);
        if la.is_none() || la != lb {
            return Ok(());
        }
        if !self.conn_lost.contains(&Self::pair(a, b)) {
            return Err(violation(format!(
                "ranks {a} and {b}: a second connection came up"
            )));
        }
        self.connection_up(a, b)
    }
}
