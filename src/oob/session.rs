//! Link sessions: a connection between two live daemons may break (a NIC, a switch, a reset);
//! what was written on it and not yet confirmed is written again on the next connection to the
//! same life of the peer, and the receiver drops what it already has. Result: no frame is lost,
//! duplicated or reordered by a broken connection between two live daemons (issue "Several
//! networks").
//!
//! Each direction of a pair is one session, numbered by its sender. Frames are counted, not
//! stamped: the n-th session frame written after a `Resume { first }` is frame `first + n`, so
//! the header carries no per-frame link number and a frame costs nothing on the wire. A session
//! frame is every frame of an established connection except the handshake's and this module's
//! own control frames (`Kind::Link`).
//!
//! On every new connection each side first writes `Start { session, count }`: "of your
//! session `session` I hold `count` frames" (session 0: none yet; [`REFUSED`]: I refused it). It writes no session frame
//! before the peer's `Start` arrives; then it writes `Resume { session, first }` and its session
//! frames from there.
//!
//! - **Sender** ([`Outbound`]): keeps each written frame until the receiver's cumulative
//!   [`Control::Ack`] (or its `Start`) covers it, at most `max_bytes` of them (past the bound it
//!   writes nothing but control frames until acknowledgements come: back-pressure, like a full
//!   socket). On the peer's `Start` for its session it writes again every frame the peer does
//!   not hold, then what waited.
//! - **Receiver** ([`Inbound`]): counts the session frames after each `Resume`; a frame whose
//!   number it already has is a duplicate and is dropped. The driver acknowledges
//!   ([`Inbound::poll_ack`]) a batch it reads at once once 256 KiB arrived since the last
//!   acknowledgement (`limits::LINK_ACK_PROMPT_BYTES`) or when it holds a large frame
//!   (`LINK_ACK_PROMPT_FRAME_BYTES`: a kept large frame pins the allocation a relay read it
//!   into), riding in the same write as the turn's own frames, so the sender lets go of kept
//!   frames within a round trip; a smaller batch's rides on the next frame to the peer, or goes
//!   alone after `limits::LINK_ACK_DELAY_MS`.
//! - **A new session** starts when the peer's `Start` says [`REFUSED`]: a frame of the session
//!   broke the protocol there, and written again it would break it again. (A `Start` naming
//!   another session means the peer never saw this one's `Resume`: it holds none of its frames,
//!   and the session goes on from what it confirmed.) The sender also resets when the peer came back as another life
//!   (its unconfirmed frames were for the dead one) and when the link was given up (a direct
//!   link falling back to the tree, whose frames take the tree from then on). A reset keeps
//!   nothing, as a death does.
//!
//! The transport stays TCP: within one connection TCP already delivers in order, so the
//! session only has to cover the bytes a broken connection leaves in kernel buffers and on the
//! wire. Nothing here touches a socket; the driver moves frames in and out.

use std::fmt;

use super::header::{Header, Kind};
use crate::Rank;

mod keep;
mod runs;

pub use keep::{Each, Keep};
pub use runs::Runs;

/// `Header::tag` of a `Kind::Link` frame: which control it is.
const TAG_START: u32 = 1;
const TAG_ACK: u32 = 2;
const TAG_RESUME: u32 = 3;

/// The session number a `Start` names when its sender refused the peer's session (a frame of
/// it broke the protocol): the peer starts a new one and gives up what was not confirmed.
pub const REFUSED: u64 = u64::MAX;

/// A link control frame. On the wire: a `Kind::Link` header with no payload; `tag` says which,
/// `epoch` carries the session number and `seq` the count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Sent first on every new connection by each side: of the peer's session `session` (0:
    /// none yet; [`REFUSED`]) it holds the first `count` frames.
    Start { session: u64, count: u64 },
    /// Sent once the peer's `Start` arrived, before any session frame of this connection: the
    /// session frames that follow are `session`'s, numbered from `first`.
    Resume { session: u64, first: u64 },
    /// The receiver has the first `count` frames of `session`.
    Ack { session: u64, count: u64 },
}

impl Control {
    /// The header of this control frame from `from` to its neighbour `to`.
    pub fn header(self, from: Rank, to: Rank) -> Header {
        let (tag, session, seq) = match self {
            Control::Start { session, count } => (TAG_START, session, count),
            Control::Resume { session, first } => (TAG_RESUME, session, first),
            Control::Ack { session, count } => (TAG_ACK, session, count),
        };
        Header {
            kind: Kind::Link,
            origin: from,
            dst: to,
            tag,
            epoch: session,
            seq,
            len: 0,
            lives: 0,
        }
    }

    /// Reads a `Kind::Link` frame. A payload, an unknown tag or another kind is malformed.
    pub fn decode(header: &Header, payload_len: usize) -> Result<Control, SessionError> {
        if header.kind != Kind::Link || payload_len != 0 || header.len != 0 {
            return Err(SessionError::Malformed(
                "a link control frame carries no payload",
            ));
        }
        match header.tag {
            TAG_START => Ok(Control::Start {
                session: header.epoch,
                count: header.seq,
            }),
            TAG_RESUME => Ok(Control::Resume {
                session: header.epoch,
                first: header.seq,
            }),
            TAG_ACK => Ok(Control::Ack {
                session: header.epoch,
                count: header.seq,
            }),
            _ => Err(SessionError::Malformed("unknown link control")),
        }
    }
}

/// Why a peer's link control cannot be taken. Each means a peer that breaks the protocol: the
/// caller logs it and closes that one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionError {
    /// Not a well-formed control frame.
    Malformed(&'static str),
    /// An acknowledgement of frames never written.
    AckBeyondSent { count: u64, sent: u64 },
    /// A `Start` holding fewer frames of the session than it acknowledged before.
    CountBelowAcked { count: u64, acked: u64 },
    /// A session frame before the connection's `Resume`, or a second `Start` or `Resume` on
    /// one connection.
    OutOfOrder(&'static str),
}

impl fmt::Display for SessionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SessionError::Malformed(why) => write!(f, "malformed link control: {why}"),
            SessionError::AckBeyondSent { count, sent } => write!(
                f,
                "link acknowledgement of {count} frames, but only {sent} were written"
            ),
            SessionError::CountBelowAcked { count, acked } => write!(
                f,
                "link Start holds {count} frames of a session it acknowledged {acked} of"
            ),
            SessionError::OutOfOrder(why) => write!(f, "link session out of order: {why}"),
        }
    }
}

impl std::error::Error for SessionError {}

/// Whether frames of this kind are session frames (counted, kept until acknowledged).
pub fn is_session_kind(kind: Kind) -> bool {
    !matches!(
        kind,
        Kind::Hello | Kind::HelloAck | Kind::Auth | Kind::Ready | Kind::Link
    )
}

/// The sending side of one direction of a pair: frames written and not yet acknowledged, kept
/// in `K` (the driver's [`Runs`], the simulator's [`Each`]).
#[derive(Debug)]
pub struct Outbound<K> {
    session: u64,
    /// Frames of this session the receiver confirmed.
    acked: u64,
    unacked: K,
    /// Wire bytes `unacked` holds (as it counts them: see [`Keep`]).
    unacked_bytes: usize,
    max_bytes: usize,
    /// Whether written frames are kept to write again; without, they are only counted
    /// (`unkept`), and a break gives up what the peer did not get.
    keep: bool,
    /// Frames written and not kept, not yet confirmed.
    unkept: u64,
}

impl<K: Keep + Default> Outbound<K> {
    /// A first session; at most `max_bytes` (at least 1) written and unacknowledged before
    /// [`at_bound`](Self::at_bound). `first_session` must differ from every session number
    /// this daemon's life gave the same peer before (a receiver that still holds an earlier
    /// session of this sender would otherwise take the new one for it): the driver hands out
    /// `n << 32` for its n-th link, and a session's resets count up from there. With `keep`
    /// false nothing is kept, only counted: the receiver's side works as ever, but a break
    /// gives up what the peer did not get (the `link_resend` setting).
    pub fn new(max_bytes: usize, first_session: u64, keep: bool) -> Self {
        Outbound {
            session: first_session.clamp(1, REFUSED - 1),
            acked: 0,
            unacked: K::default(),
            unacked_bytes: 0,
            max_bytes: max_bytes.max(1),
            keep,
            unkept: 0,
        }
    }

    /// Session frames of `bytes` wire bytes were written (or started: a frame cut off by a
    /// broken connection counts as written, it goes again whole): `frame` is one frame, or
    /// several for a store that keeps them as one ([`Keep::count`]).
    pub fn written(&mut self, frame: K::Frame, bytes: usize) {
        if !self.keep {
            self.unkept += K::count(&frame) as u64;
            return;
        }
        self.unacked_bytes = self.unacked_bytes.saturating_add(bytes);
        self.unacked.keep(frame, bytes);
    }

    /// Frames of this session written so far.
    pub fn sent(&self) -> u64 {
        self.acked + self.unacked.frames() as u64 + self.unkept
    }

    /// The receiver confirmed the first `count` frames of `session`: they are released. An
    /// acknowledgement of an earlier session is stale and changes nothing. Returns how many
    /// frames were released.
    pub fn handle_ack(&mut self, session: u64, count: u64) -> Result<usize, SessionError> {
        if session != self.session || count <= self.acked {
            return Ok(0);
        }
        let sent = self.sent();
        if count > sent {
            return Err(SessionError::AckBeyondSent { count, sent });
        }
        let release = (count - self.acked) as usize;
        if self.keep {
            let freed = self.unacked.release(release);
            self.unacked_bytes = self.unacked_bytes.saturating_sub(freed);
        } else {
            self.unkept = self.unkept.saturating_sub(release as u64);
        }
        self.acked = count;
        Ok(release)
    }

    /// At (or past) the bound: write no more session frames until acknowledgements release
    /// some. Control frames still go.
    pub fn at_bound(&self) -> bool {
        self.unacked_bytes >= self.max_bytes
    }

    /// The peer's `Start` on a new connection: it holds `count` frames of its `session`. Gives
    /// the `Resume` to write, then the frames to write again, in order (they come back through
    /// [`written`](Self::written) as they are written), and how many unconfirmed frames were
    /// given up: all of them when the peer [`REFUSED`] the session or forgot it (it names
    /// another after confirming frames of this one), none otherwise (a peer naming another
    /// session before confirming any never saw this one's `Resume`).
    #[allow(clippy::type_complexity)]
    pub fn handle_peer_start(
        &mut self,
        session: u64,
        count: u64,
    ) -> Result<(Control, impl Iterator<Item = K::Frame> + '_, usize), SessionError> {
        let mut dropped = 0;
        if session == REFUSED || (session != self.session && self.acked > 0) {
            // Refused, or forgotten: a peer that confirmed frames of this session and now names
            // another dropped its record of this daemon (it took this daemon for dead); it
            // could not tell frames written again from new ones.
            dropped = self.reset();
        } else if session == self.session {
            if count < self.acked {
                return Err(SessionError::CountBelowAcked {
                    count,
                    acked: self.acked,
                });
            }
            self.handle_ack(session, count)?;
            if self.unkept > 0 {
                // Not kept, so not to be written again: a new session, past the loss.
                dropped = self.reset();
            }
        }
        self.unacked_bytes = 0;
        let resume = Control::Resume {
            session: self.session,
            first: self.acked,
        };
        Ok((resume, self.unacked.drain(), dropped))
    }

    /// Ends the session: what was not confirmed is given up (the peer's life ended, or its
    /// frames now take another route). The next connection starts a new session from 0.
    /// Returns how many frames were given up.
    pub fn reset(&mut self) -> usize {
        let dropped = self.unacked.frames() + std::mem::take(&mut self.unkept) as usize;
        self.unacked.clear();
        self.unacked_bytes = 0;
        self.acked = 0;
        self.session = self.session.wrapping_add(1);
        dropped
    }

    /// Written frames not yet confirmed (kept or not).
    pub fn unacked_frames(&self) -> usize {
        self.unacked.frames() + self.unkept as usize
    }

    /// Frames of this session the receiver confirmed (read by its loop).
    pub fn acked(&self) -> u64 {
        self.acked
    }

    /// The wire bytes of the written frames not yet confirmed.
    pub fn unacked_bytes(&self) -> usize {
        self.unacked_bytes
    }

    /// The session number.
    pub fn session(&self) -> u64 {
        self.session
    }

    /// The store of kept frames.
    pub fn store_mut(&mut self) -> &mut K {
        &mut self.unacked
    }
}

/// The receiving side of one direction of a pair: how many frames of the sender's session it
/// has, and what it has acknowledged.
#[derive(Debug, Default)]
pub struct Inbound {
    /// The sender's session, once a `Resume` named it.
    session: Option<u64>,
    /// Frames of the session received.
    count: u64,
    /// The count last acknowledged.
    acked: u64,
    /// Frames still to drop on this connection (the sender writes again from what this side
    /// said it holds, so only a sender that did not trim sends any).
    skip: u64,
    /// Whether this connection's `Resume` arrived (session frames before it break the
    /// protocol).
    started: bool,
    /// The session was refused: the next `Start` says so.
    refused: bool,
}

/// What [`Inbound::handle_resume`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Started {
    /// A new session: counting from its first frame.
    New,
    /// The same session goes on; `duplicates` frames will come again and be dropped.
    Resumed { duplicates: u64 },
    /// The same session, but frames this side never had were given up by the sender (it
    /// cannot happen between two correct peers; counted and logged, never fatal).
    Gap { lost: u64 },
}

impl Inbound {
    /// A new connection: the `Start` to write first (what this side holds of the peer's
    /// session); the peer's `Resume` must come before any session frame.
    pub fn connection_up(&mut self) -> Control {
        self.started = false;
        self.skip = 0;
        // What is counted is about to be said: nothing is left to acknowledge.
        self.acked = self.count;
        let session = if std::mem::take(&mut self.refused) {
            REFUSED
        } else {
            self.session.unwrap_or(0)
        };
        Control::Start {
            session,
            count: self.count,
        }
    }

    /// The peer's `Resume` on this connection.
    pub fn handle_resume(&mut self, session: u64, first: u64) -> Result<Started, SessionError> {
        if self.started {
            return Err(SessionError::OutOfOrder(
                "a second Resume on one connection",
            ));
        }
        self.started = true;
        self.skip = 0;
        if self.session != Some(session) {
            self.session = Some(session);
            self.count = first;
            self.acked = first;
            return Ok(Started::New);
        }
        if first > self.count {
            let lost = first - self.count;
            self.count = first;
            self.acked = self.acked.min(first);
            return Ok(Started::Gap { lost });
        }
        self.skip = self.count - first;
        Ok(Started::Resumed {
            duplicates: self.skip,
        })
    }

    /// A session frame arrived: `Ok(true)` to take it, `Ok(false)` for a duplicate to drop.
    pub fn accept(&mut self) -> Result<bool, SessionError> {
        if !self.started {
            return Err(SessionError::OutOfOrder("a frame before the link's Resume"));
        }
        if self.skip > 0 {
            self.skip -= 1;
            return Ok(false);
        }
        self.count += 1;
        Ok(true)
    }

    /// Whether frames arrived that were not acknowledged yet (the timer's question).
    pub fn unacked(&self) -> bool {
        self.session.is_some() && self.count > self.acked
    }

    /// The acknowledgement to send, if anything arrived since the last one.
    pub fn poll_ack(&mut self) -> Option<Control> {
        let session = self.session?;
        if self.count <= self.acked {
            return None;
        }
        self.acked = self.count;
        Some(Control::Ack {
            session,
            count: self.count,
        })
    }

    /// Forgets the session (the peer's life ended).
    pub fn reset(&mut self) {
        *self = Inbound::default();
    }

    /// Forgets the session because a frame of it broke the protocol: the next `Start` says
    /// [`REFUSED`], and the peer gives up what it had not seen confirmed instead of writing
    /// that frame again.
    pub fn refuse(&mut self) {
        *self = Inbound {
            refused: true,
            ..Inbound::default()
        };
    }
}

#[cfg(test)]
mod tests;
