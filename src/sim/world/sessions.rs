//! Link sessions in the simulator (`oob::session`, the driver's rule): each direction of a pair
//! of daemons keeps what it wrote until the receiver acknowledges it, and a new connection
//! writes again what the last one did not deliver, so a dropped connection between two living
//! daemons loses nothing. The world calls the same `Outbound` and `Inbound` the driver does:
//! frames are counted as written when they leave (`transmit`), acknowledged once read (one
//! acknowledgement in flight per direction, carrying the latest count, lost with its
//! connection), and `connection_up` runs each side's `Start` and `Resume`. A death or a new life
//! of either end starts the direction over, as the driver's incarnation check does; a direct
//! link that falls back to the tree resets its sender's session (`links.rs`, `fall_back`).

use super::{Ev, World};
use crate::Rank;
use crate::oob::session::{Control, Each, Inbound, Outbound};
use crate::sim::check::Violation;
use crate::sim::frame::Frame;
use crate::sim::swarm::Fault;
use std::collections::HashMap;

/// The sessions of every direction, by (sender, receiver).
#[derive(Default)]
pub(super) struct Sessions {
    dirs: HashMap<(Rank, Rank), Direction>,
    /// Sessions made so far: the next one's number is this plus one, shifted (the driver's
    /// rule: a number never reused towards a peer that may still hold an earlier one).
    made: u64,
    /// Directions with an acknowledgement in flight.
    acking: std::collections::HashSet<(Rank, Rank)>,
    /// Frames written again on a new connection, and copies a receiver dropped.
    pub resent: u64,
    pub duplicates: u64,
    /// Frames given up (a session reset with frames unconfirmed).
    pub given_up: u64,
}

struct Direction {
    /// The sender's and the receiver's lives it is for.
    lives: (u64, u64),
    out: Outbound<Each<Frame>>,
    inb: Inbound,
}

/// Per direction, at most this many bytes unconfirmed (the driver's default bound; the
/// simulator never reaches it: acknowledgements come within a latency).
const RESEND_MAX_BYTES: usize = crate::limits::LINK_RESEND_MAX_BYTES_DEFAULT;

impl World {
    fn lives(&self, from: Rank, to: Rank) -> (u64, u64) {
        let life = |r: Rank| {
            self.nodes
                .get(r as usize)
                .map_or(0, |n| n.node.incarnation())
        };
        (life(from), life(to))
    }

    /// The direction's session for the current lives of both ends (a new one otherwise).
    fn direction(&mut self, from: Rank, to: Rank) -> &mut Direction {
        let lives = self.lives(from, to);
        let s = &mut self.sessions;
        if let Some(old) = s.dirs.get(&(from, to)).filter(|d| d.lives != lives) {
            // Another life at either end: what the old one did not confirm died with it.
            s.given_up += old.out.unacked_frames() as u64;
            s.dirs.remove(&(from, to));
        }
        let made = &mut s.made;
        s.dirs.entry((from, to)).or_insert_with(|| {
            *made += 1;
            let mut out = Outbound::new(RESEND_MAX_BYTES, *made << 32, true);
            let mut inb = Inbound::default();
            // The world's connections exist from the start (and a new life's from its first
            // frame): the session's `Start` and `Resume` as a first connection has them.
            if let Control::Start { session, count } = inb.connection_up()
                && let Ok((Control::Resume { session, first }, _, _)) =
                    out.handle_peer_start(session, count)
            {
                let _ = inb.handle_resume(session, first);
            }
            Direction { lives, out, inb }
        })
    }

    /// `from` writes `frame` to `to` on their connection: kept until acknowledged.
    pub(super) fn session_written(&mut self, from: Rank, to: Rank, frame: &Frame) {
        let len = frame.wire_len();
        self.direction(from, to).out.written(frame.clone(), len);
    }

    /// `to` reads a frame of `from`'s session: true to hand it to the node, false for a copy
    /// of one it already had (written again after a drop). The acknowledgement goes back
    /// after a latency on the same connection.
    pub(super) fn session_read(&mut self, from: Rank, to: Rank) -> Result<bool, Violation> {
        let fresh = match self.direction(from, to).inb.accept() {
            Ok(f) => f,
            Err(e) => {
                return Err(Violation {
                    checker: "link-session",
                    detail: format!("{from}->{to}: {e}"),
                });
            }
        };
        if !fresh {
            log::trace!(
                "{} us: link session {from}->{to}: a copy dropped",
                self.now_us
            );
            self.sessions.duplicates += 1;
            return Ok(false);
        }
        if self.sessions.acking.insert((from, to)) {
            let at = self.now_us + self.scen.latency_us + self.spread(from, to);
            let generation = self.generation(from, to);
            self.push(
                at,
                Ev::LinkAck {
                    from,
                    to,
                    generation,
                },
            );
        }
        Ok(true)
    }

    /// `to`'s acknowledgement of `from`'s session reaches `from` (unless its connection
    /// dropped meanwhile): what it confirms is released.
    pub(super) fn on_link_ack(
        &mut self,
        from: Rank,
        to: Rank,
        generation: u64,
    ) -> Result<(), Violation> {
        self.sessions.acking.remove(&(from, to));
        if generation != self.generation(from, to) || !(self.living(from) && self.living(to)) {
            return Ok(());
        }
        let d = self.direction(from, to);
        if let Some(Control::Ack { session, count }) = d.inb.poll_ack()
            && let Err(e) = d.out.handle_ack(session, count)
        {
            return Err(Violation {
                checker: "link-session",
                detail: format!("{from}->{to}: {e}"),
            });
        }
        Ok(())
    }

    /// A new connection between `a` and `b`: each side's `Start`, the other's `Resume`, and
    /// the frames to write again first, per direction (sender, receiver, frames).
    pub(super) fn sessions_resume(
        &mut self,
        a: Rank,
        b: Rank,
    ) -> Result<Vec<(Rank, Rank, Vec<Frame>)>, Violation> {
        let mut again = Vec::new();
        for (from, to) in [(a, b), (b, a)] {
            self.sessions.acking.remove(&(from, to));
            let d = self.direction(from, to);
            let Control::Start { session, count } = d.inb.connection_up() else {
                continue;
            };
            let bad = |e: crate::oob::session::SessionError| Violation {
                checker: "link-session",
                detail: format!("{from}->{to}: {e}"),
            };
            let (resume, frames, dropped) = d.out.handle_peer_start(session, count).map_err(bad)?;
            let frames: Vec<Frame> = frames.collect();
            if let Control::Resume { session, first } = resume {
                d.inb.handle_resume(session, first).map_err(bad)?;
            }
            self.sessions.given_up += dropped as u64;
            self.sessions.resent += frames.len() as u64;
            log::debug!(
                "{} us: link session {from}->{to}: {} frames written again, {dropped} given up",
                self.now_us,
                frames.len()
            );
            if !frames.is_empty() {
                again.push((from, to, frames));
            }
        }
        Ok(again)
    }

    /// The end-of-run check: in a run whose only faults are dropped (or slow) connections and
    /// strangers, where nobody was declared dead and no direct link fell back (nor gave frames
    /// up), every plain message arrived, each pair's in order: the link sessions lost and
    /// reordered none (README, "Faults": nothing lost, duplicated or reordered).
    pub(super) fn check_sessions(&self) -> Result<(), Violation> {
        let links_only = self.scen.faults.iter().all(|f| {
            matches!(
                f,
                Fault::LinkDown { .. } | Fault::SlowLink { .. } | Fault::Stranger { .. }
            )
        });
        let nobody_dead =
            self.crashed.is_empty() && self.fenced.is_empty() && self.declared.is_empty();
        // A direct link that fell back loses what neither end had read, and hands what waited
        // for it to the tree behind what took the tree meanwhile (README: a lost direct link's
        // undelivered plain messages are lost). Its session may have had nothing to give up.
        let fell_back: u64 = self
            .nodes
            .iter()
            .map(|n| n.node.counters().direct.fallbacks)
            .sum();
        if !links_only || !nobody_dead || self.sessions.given_up > 0 || fell_back > 0 {
            return Ok(());
        }
        if self.check.plain_posted != self.check.plain_sent {
            return Err(Violation {
                checker: "link-sessions",
                detail: format!(
                    "{} of {} plain messages delivered, though only connections dropped ({} \
                     frames written again)",
                    self.check.plain_posted, self.check.plain_sent, self.sessions.resent
                ),
            });
        }
        if let Some(what) = &self.check.plain_reordered {
            return Err(Violation {
                checker: "link-sessions",
                detail: format!(
                    "{what}, though only connections dropped ({} frames written again)",
                    self.sessions.resent
                ),
            });
        }
        Ok(())
    }

    /// `from`'s frames to `to` take another route from now on (a direct link fell back): its
    /// session starts over, giving up what `to` did not confirm, as the driver does.
    pub(super) fn session_reset(&mut self, from: Rank, to: Rank) {
        let dropped = self.direction(from, to).out.reset();
        self.sessions.given_up += dropped as u64;
    }
}
