//! RELM on the wire: how a reliable message rides in the frame header, and the control
//! messages (ack, request, link update) with their byte layouts. Big-endian throughout.
//!
//! A reliable message is a frame of kind `RelmData` whose header carries the origin, the
//! destination and the user's tag as any message does, and whose `seq` field packs the
//! message's uid (high 32 bits) and its predecessor's uid in the same (origin, destination)
//! chain (low 32 bits, `uid::NONE` for the first).
//!
//! Control messages are frames of kind `Relm` between two neighbours (header origin = sender,
//! dst = the neighbour, tag 0). Payload:
//!
//! ```text
//! Ack        1 | origin u32 | dst u32 | upto u32 | life u16
//!                                                     cumulative: every uid <= upto of the
//!                                                     chain (origin, dst) is posted at dst;
//!                                                     `life` is the origin's life (rejoin)
//!                                                     whose chain that is
//! Request    2 | origin u32 | dst u32 | uid u32       "replay this message to me"
//! LinkUpdate 3 | depth u32 | count u32 | count x (origin u32 | dst u32 | uid u32 | state u8)
//!                                                     the sender's tree depth, then every
//!                                                     message it holds that is routed over
//!                                                     this link
//! ```

use super::engine::MsgState;
use super::uid::{self, MsgKey};
use crate::Rank;
use crate::limits::RELM_UPDATE_ENTRIES_MAX;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use std::fmt;

const ACK: u8 = 1;
const REQUEST: u8 = 2;
const LINK_UPDATE: u8 = 3;
const ENTRY_LEN: usize = 13;
const ACK_LEN: usize = 15;
const REQUEST_LEN: usize = 13;

/// Packs a reliable message's uid and its predecessor's into the header's `seq`.
pub fn pack_seq(uid: u32, prev: u32) -> u64 {
    ((uid as u64) << 32) | prev as u64
}

/// The (uid, prev) packed by [`pack_seq`].
pub fn unpack_seq(seq: u64) -> (u32, u32) {
    ((seq >> 32) as u32, seq as u32)
}

/// One message as a neighbour describes it in a link update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offer {
    /// The message.
    pub key: MsgKey,
    /// Its destination.
    pub dst: Rank,
    /// The sender's state for it.
    pub state: MsgState,
}

/// A RELM control message between two neighbours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// Every message of the chain (origin, dst) up to `upto` has been posted at dst.
    Ack {
        /// The chain's origin.
        origin: Rank,
        /// The chain's destination.
        dst: Rank,
        /// The highest posted uid.
        upto: u32,
        /// The origin's life (how many times rank 0 admitted it back) that the chain belongs
        /// to: a restarted origin numbers its messages from 0 again, so an acknowledgement of
        /// its previous life's chain, still in flight when it was admitted back, must not
        /// complete the new life's messages (regression seed 31828).
        life: u16,
    },
    /// The sender lacks this message's data and asks for a replay.
    Request {
        /// The message.
        key: MsgKey,
        /// Its destination.
        dst: Rank,
    },
    /// After a repair: the sender's depth and the messages it holds that cross this link.
    LinkUpdate {
        /// The sender's depth in its (repaired) tree.
        depth: u32,
        /// The messages.
        offers: Vec<Offer>,
    },
}

/// A control payload that could not be decoded; the connection that sent it is closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlError {
    /// The payload ended early or had bytes left over.
    Length,
    /// An unknown control type.
    Type(u8),
    /// A rank at or beyond the DVM's size.
    Rank(Rank),
    /// A sentinel where a uid was required.
    Uid(u32),
    /// An unknown message state.
    State(u8),
    /// More entries than `RELM_UPDATE_ENTRIES_MAX`.
    TooMany(u32),
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlError::Length => write!(f, "RELM control message has the wrong length"),
            ControlError::Type(t) => write!(f, "unknown RELM control type {t}"),
            ControlError::Rank(r) => write!(f, "RELM control names rank {r}, beyond the DVM"),
            ControlError::Uid(u) => write!(f, "RELM control carries sentinel uid {u:#x}"),
            ControlError::State(s) => write!(f, "unknown RELM message state {s}"),
            ControlError::TooMany(n) => write!(f, "RELM link update with {n} entries"),
        }
    }
}

impl std::error::Error for ControlError {}

impl Control {
    /// Encodes the control message. A link update longer than `RELM_UPDATE_ENTRIES_MAX` is
    /// cut there (the caller splits it; see `link.rs`).
    pub fn encode(&self) -> Bytes {
        match self {
            Control::Ack {
                origin,
                dst,
                upto,
                life,
            } => {
                let mut b = BytesMut::with_capacity(ACK_LEN);
                b.put_u8(ACK);
                b.put_u32(*origin);
                b.put_u32(*dst);
                b.put_u32(*upto);
                b.put_u16(*life);
                b.freeze()
            }
            Control::Request { key, dst } => {
                let mut b = BytesMut::with_capacity(REQUEST_LEN);
                b.put_u8(REQUEST);
                b.put_u32(key.origin);
                b.put_u32(*dst);
                b.put_u32(key.uid);
                b.freeze()
            }
            Control::LinkUpdate { depth, offers } => {
                let n = offers.len().min(RELM_UPDATE_ENTRIES_MAX);
                let mut b = BytesMut::with_capacity(9 + n * ENTRY_LEN);
                b.put_u8(LINK_UPDATE);
                b.put_u32(*depth);
                b.put_u32(n as u32);
                for o in offers.iter().take(n) {
                    b.put_u32(o.key.origin);
                    b.put_u32(o.dst);
                    b.put_u32(o.key.uid);
                    b.put_u8(o.state as u8);
                }
                b.freeze()
            }
        }
    }

    /// Decodes a control payload from a DVM of `size` daemons. Never panics.
    pub fn decode(size: u32, mut p: &[u8]) -> Result<Control, ControlError> {
        let rank = |r: u32| {
            if r < size {
                Ok(r)
            } else {
                Err(ControlError::Rank(r))
            }
        };
        let valid = |u: u32| {
            if uid::is_valid(u) {
                Ok(u)
            } else {
                Err(ControlError::Uid(u))
            }
        };
        if p.is_empty() {
            return Err(ControlError::Length);
        }
        let t = p.get_u8();
        let c = match t {
            ACK | REQUEST => {
                let len = if t == ACK { ACK_LEN } else { REQUEST_LEN };
                if p.len() != len - 1 {
                    return Err(ControlError::Length);
                }
                let origin = rank(p.get_u32())?;
                let dst = rank(p.get_u32())?;
                let u = valid(p.get_u32())?;
                if t == ACK {
                    Control::Ack {
                        origin,
                        dst,
                        upto: u,
                        life: p.get_u16(),
                    }
                } else {
                    Control::Request {
                        key: MsgKey { origin, uid: u },
                        dst,
                    }
                }
            }
            LINK_UPDATE => {
                if p.len() < 8 {
                    return Err(ControlError::Length);
                }
                let depth = p.get_u32();
                let n = p.get_u32();
                if n as usize > RELM_UPDATE_ENTRIES_MAX {
                    return Err(ControlError::TooMany(n));
                }
                if p.len() != n as usize * ENTRY_LEN {
                    return Err(ControlError::Length);
                }
                let mut offers = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    let origin = rank(p.get_u32())?;
                    let dst = rank(p.get_u32())?;
                    let u = valid(p.get_u32())?;
                    let s = p.get_u8();
                    let state = MsgState::from_wire(s).ok_or(ControlError::State(s))?;
                    offers.push(Offer {
                        key: MsgKey { origin, uid: u },
                        dst,
                        state,
                    });
                }
                Control::LinkUpdate { depth, offers }
            }
            other => return Err(ControlError::Type(other)),
        };
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trips() {
        let cs = [
            Control::Ack {
                origin: 1,
                dst: 2,
                upto: 9,
                life: 3,
            },
            Control::Request {
                key: MsgKey { origin: 3, uid: 4 },
                dst: 0,
            },
            Control::LinkUpdate {
                depth: 2,
                offers: vec![Offer {
                    key: MsgKey { origin: 1, uid: 0 },
                    dst: 6,
                    state: MsgState::Sent,
                }],
            },
        ];
        for c in cs {
            assert_eq!(Control::decode(8, &c.encode()), Ok(c));
        }
        assert_eq!(unpack_seq(pack_seq(7, uid::NONE)), (7, uid::NONE));
    }

    #[test]
    fn refuses_bad_input() {
        assert_eq!(Control::decode(8, &[]), Err(ControlError::Length));
        assert_eq!(Control::decode(8, &[9]), Err(ControlError::Type(9)));
        let ack = Control::Ack {
            origin: 1,
            dst: 9,
            upto: 0,
            life: 0,
        };
        assert_eq!(
            Control::decode(8, &ack.encode()),
            Err(ControlError::Rank(9))
        );
        let req = Control::Request {
            key: MsgKey {
                origin: 1,
                uid: uid::NONE,
            },
            dst: 2,
        };
        assert!(matches!(
            Control::decode(8, &req.encode()),
            Err(ControlError::Uid(_))
        ));
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Control::decode(16, &bytes);
        }

        #[test]
        fn truncations_are_refused(cut in 0usize..30) {
            let c = Control::LinkUpdate {
                depth: 1,
                offers: vec![
                    Offer { key: MsgKey { origin: 1, uid: 2 }, dst: 3, state: MsgState::Sending },
                    Offer { key: MsgKey { origin: 2, uid: 5 }, dst: 4, state: MsgState::Pending },
                ],
            };
            let b = c.encode();
            if cut < b.len() {
                prop_assert!(Control::decode(16, &b[..cut]).is_err());
            }
        }
    }
}
