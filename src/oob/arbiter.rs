//! Which connection becomes the link between two daemons, decided only on authenticated facts.
//!
//! A daemon keeps at most one link per peer. Two connections can compete for it: the peer's
//! dial (an incoming connection) and this daemon's own dial, when both dial at once, or a new
//! dial from a peer that lost the old link. Every decision is taken by the acceptor at the
//! moment the dialler's proof of the job key (`Auth`) has checked
//! ([`HandshakeEvent::Authenticated`](super::HandshakeEvent::Authenticated)), and the dialler
//! sends nothing before the acceptor's `Ready`. So a `Hello` that has proved nothing (a
//! stranger claiming a rank) never cancels a dial, never blocks one, never replaces a link and
//! never feeds a probing decision: it only costs its answer.
//!
//! The rule ([`admit`]), for an incoming connection from `peer` that just proved itself:
//!
//! | this daemon has | decision |
//! |---|---|
//! | nothing | admit |
//! | its own dial, proof not yet sent | admit, close the dial (the peer never saw its proof) |
//! | its own dial, proof sent, and the peer is the higher rank | admit, close the dial |
//! | its own dial, proof sent, and it is the higher rank | refuse (the peer admits that dial) |
//! | a link it dialled, heard recently, and it is the higher rank | refuse (the leftover of a simultaneous connect), and probe the link |
//! | any other link | admit, replace the link (the peer dialled again: it lost the link) |
//!
//! Both sides apply the same rule to the same facts, so they agree: when two proofs cross,
//! each acceptor keeps the connection dialled by the higher rank ([`keep_dialled_by`]); when
//! one side had not sent its proof yet, the other's dial wins and no proof on the losing
//! connection is ever read. A connection one side has admitted is never closed by the other
//! (checked exhaustively by the tests below, with a stranger's connections in the mix).

use super::handshake::keep_dialled_by;
use crate::Rank;

/// Who dialled the link a daemon already has to the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkDialler {
    /// This daemon dialled it.
    Here,
    /// This daemon dialled it, and has heard nothing on it for half the stall time
    /// (`oob::stall`): the peer dialling again has given it up (a failover), so it is no
    /// leftover of a simultaneous connect, which was heard during its handshake a moment ago.
    HereQuiet,
    /// The peer dialled it (this daemon admitted it).
    There,
}

/// How far this daemon's own outstanding dial to the peer has got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DialPhase {
    /// Connecting, or `Hello` sent and no valid `HelloAck` yet: the peer has seen no proof.
    Unproven,
    /// `Auth` sent: the peer may admit this dial at any moment.
    ProofSent,
}

/// What to do with an incoming connection whose proof just checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Make it the link (send `Ready`). `close_dial`: close this daemon's own dial to the peer.
    /// `replace_link`: the peer dialled again, so the old link is gone on its side: close it
    /// and move its unsent frames to the new one.
    Admit {
        close_dial: bool,
        replace_link: bool,
    },
    /// Close it: the connection this daemon dialled is (or will be) the link. `probe_link`:
    /// a link exists; write to it at once (a heartbeat), so that if the peer really lost it,
    /// this side finds out now and admits the peer's next dial.
    Refuse { probe_link: bool },
}

/// The rule in the module's table. `link` is the link this daemon already has to `peer` (if
/// any), `dial` its own outstanding dial to `peer` (if any).
pub fn admit(
    me: Rank,
    peer: Rank,
    link: Option<LinkDialler>,
    dial: Option<DialPhase>,
) -> Admission {
    let i_win = keep_dialled_by(me, peer) == me;
    match (link, dial) {
        (Some(LinkDialler::Here), _) if i_win => Admission::Refuse { probe_link: true },
        (Some(_), dial) => Admission::Admit {
            close_dial: dial.is_some(),
            replace_link: true,
        },
        (None, Some(DialPhase::ProofSent)) if i_win => Admission::Refuse { probe_link: false },
        (None, dial) => Admission::Admit {
            close_dial: dial.is_some(),
            replace_link: false,
        },
    }
}

#[cfg(test)]
mod tests;
