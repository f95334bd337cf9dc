//! The connection handshake, sans-IO and frame-level: the [`FrameDecoder`](super::FrameDecoder)
//! reads bytes incrementally (so one stray byte never stalls the loop), this state machine
//! judges whole frames. Wire layout: `docs/wire.md`.
//!
//! ```text
//! dialler                                   acceptor
//!   Handshake::dial ── Hello(nonce_d) ─────▶ Handshake::accept
//!                                            handle_frame -> HelloReceived(peer)
//!                                            driver: try_accept_peer() (or reject() + close)
//!   handle_frame ◀── HelloAck(nonce_a, ─────
//!     checks mac_a         mac_a)
//!   ─────────────── Auth(mac_d) ───────────▶ handle_frame: checks mac_d
//!                                            -> Authenticated(peer)
//!                                            driver: admit() (or reject() + close)
//!   handle_frame ◀──────── Ready ───────────
//!   -> Established(peer)                     (established once admitted)
//! ```
//!
//! Why four frames: the answer to a `Hello` commits nothing. Before its proof has checked, a
//! connection cannot count for the rank it claims, so the acceptor takes every link decision
//! (a simultaneous connect, a reconnection replacing a link) at the `Auth`, and the dialler
//! sends no data frame until the acceptor has admitted the connection with `Ready`. A stranger
//! who sends `Hello`s claiming a rank therefore costs one HMAC and a short-lived connection,
//! and changes no link (`docs/security.md`); the rule itself is [`super::arbiter`].
//!
//! Authentication: both sides prove they hold the DVM's job key. Each side contributes a fresh
//! random 16-byte nonce, which the caller draws and passes in (this module reads no random
//! source and no clock: the same inputs always give the same frames); `mac_a = HMAC-SHA256(key, "tbon-ack" ‖ identity ‖ dialler ‖ acceptor ‖
//! nonce_d ‖ nonce_a)` and `mac_d = HMAC-SHA256(key, "tbon-dial" ‖ identity ‖ dialler ‖
//! acceptor ‖ nonce_a ‖ nonce_d)`. The two labels keep one side's answer from being reflected
//! as the other's; the fresh nonces keep a recorded handshake from being replayed; MACs are
//! compared in constant time. An empty key (a DVM run unauthenticated) runs the same exchange,
//! so mixing keyed and unkeyed daemons fails like a wrong key does.
//!
//! Driver duties: give every [`Handshake::dial`] and [`Handshake::accept`] a fresh,
//! unpredictable nonce (the driver's is `driver/nonce.rs`): a nonce used twice lets a recorded
//! handshake be replayed. Use `limits::HANDSHAKE_MAX_PAYLOAD` as the decoder's maximum until
//! `Established`, then the configured message maximum; push every [`Handshake::poll_transmit`]
//! frame into the connection's send queue; on any `Err` log its `Display` text and close the
//! connection. A rejected dialler sees the connection closed before any `HelloAck`.

use std::collections::VecDeque;
use std::fmt;

use bytes::{BufMut, Bytes, BytesMut};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::frame::Frame;
use super::header::{Header, Kind, WireError};
use crate::Rank;
use crate::limits::DVM_ID_MAX_BYTES;

/// Length of the nonce at the end of a `Hello`/`HelloAck` identity.
pub const NONCE_LEN: usize = 16;

/// Length of a handshake MAC (HMAC-SHA256).
pub const MAC_LEN: usize = 32;

/// The rank an operator's tool claims in its `Hello` (`tbon status`): no daemon has it. The
/// acceptor proves and checks the handshake's MACs under the operator credential
/// ([`JobKey::operator`]) instead of the job key, and admits the connection as a tool's, never
/// as a link: a tool cannot join the tree, relay or send to any daemon.
pub const TOOL_RANK: Rank = u32::MAX;

/// The label of the operator credential's derivation.
const LABEL_OPERATOR: &[u8] = b"tbon-operator-v1";

/// The DVM's shared secret. Its `Debug` never shows the bytes. An empty key means the DVM runs
/// unauthenticated (anyone who can reach a port and knows the identity can join).
#[derive(Clone, PartialEq, Eq, Default)]
pub struct JobKey(Vec<u8>);

impl JobKey {
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        JobKey(bytes.into())
    }

    /// No key: the DVM runs unauthenticated.
    pub fn none() -> Self {
        JobKey(Vec::new())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The read-only operator credential derived from this key: the 64 lowercase hex
    /// characters of HMAC-SHA256(key, "tbon-operator-v1"), a valid key file's text. A tool
    /// that holds it can ask daemons for their status; it cannot be turned back into the job
    /// key, and no daemon accepts it from a daemon.
    pub fn operator(&self) -> JobKey {
        let mut mac = match Hmac::<Sha256>::new_from_slice(&self.0) {
            Ok(m) => m,
            Err(_) => unreachable_hmac(),
        };
        mac.update(LABEL_OPERATOR);
        let hex: String = mac
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        JobKey(hex.into_bytes())
    }

    /// The key's bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JobKey(<{} bytes>)", self.0.len())
    }
}

/// This daemon's side of every handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandshakeConfig {
    pub me: Rank,
    /// Number of daemons in the DVM; valid ranks are `0..size`.
    pub size: u32,
    /// This daemon's incarnation epoch.
    pub epoch: u64,
    /// The DVM identity both sides must share (UTF-8, at most `DVM_ID_MAX_BYTES` bytes).
    pub dvm_id: String,
    /// The job key both sides must hold.
    pub key: JobKey,
}

impl HandshakeConfig {
    /// Check the configuration before use: an identity longer than `DVM_ID_MAX_BYTES` would be
    /// truncated on the wire (and logged), and `me` must be a rank of the DVM.
    pub fn validate(&self) -> Result<(), HandshakeError> {
        if self.dvm_id.len() > DVM_ID_MAX_BYTES {
            return Err(HandshakeError::Malformed(
                "DVM identity longer than 255 bytes",
            ));
        }
        if self.me >= self.size {
            return Err(HandshakeError::BadRank {
                rank: self.me,
                size: self.size,
            });
        }
        Ok(())
    }
}

/// Who is on the other end of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerIdent {
    pub rank: Rank,
    /// The peer's incarnation epoch, from its handshake header.
    pub epoch: u64,
    /// The connection carries only the dialler's bulk data (a bulk connection,
    /// `docs/wire.md`): never the link.
    pub bulk: bool,
}

/// What the driver must act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeEvent {
    /// Acceptor: a valid `Hello` arrived, from a peer that has proved nothing yet. Answer
    /// with [`Handshake::try_accept_peer`] (or refuse with [`Handshake::reject`] and close);
    /// nothing else may depend on the rank it claims.
    HelloReceived(PeerIdent),
    /// Acceptor: the dialler's proof of the key checked; the connection is now known to come
    /// from `peer`. Decide whether it becomes the link to `peer` ([`super::arbiter::admit`])
    /// and call [`Handshake::admit`] or [`Handshake::reject`] (and close).
    Authenticated(PeerIdent),
    /// Dialler: the acceptor admitted the connection. Raise the decoder's maximum; data
    /// frames may flow.
    Established(PeerIdent),
}

/// Why a handshake failed. Every variant means: log the `Display` text, close the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandshakeError {
    /// The peer belongs to another DVM.
    WrongDvm { expected: String, got: String },
    /// A frame of the wrong kind for this point of the handshake.
    UnexpectedKind(Kind),
    /// The handshake payload does not parse.
    Malformed(&'static str),
    /// The peer claims a rank outside `0..size`, or our own rank.
    BadRank { rank: Rank, size: u32 },
    /// The peer addressed its frame to another rank.
    WrongDestination { dst: Rank, me: Rank },
    /// The dialled address answered as another rank.
    WrongPeer { expected: Rank, got: Rank },
    /// The Auth that should prove the Hello's rank names another rank.
    AuthFromOther { hello: Rank, auth: Rank },
    /// This side rejected the peer (e.g. the losing half of a simultaneous connect).
    Rejected,
    /// The peer's MAC is wrong: it does not hold the DVM's job key (or replays an old
    /// handshake).
    BadKey,
    /// The byte stream was invalid (from the frame decoder).
    Wire(WireError),
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandshakeError::WrongDvm { expected, got } => write!(
                f,
                "handshake refused: peer belongs to DVM {got:?}, this daemon to {expected:?}"
            ),
            HandshakeError::UnexpectedKind(k) => {
                write!(f, "handshake refused: unexpected {k:?} frame")
            }
            HandshakeError::Malformed(why) => {
                write!(f, "handshake refused: malformed payload ({why})")
            }
            HandshakeError::BadRank { rank, size } => write!(
                f,
                "handshake refused: rank {rank} is not a peer rank in a DVM of size {size}"
            ),
            HandshakeError::WrongDestination { dst, me } => write!(
                f,
                "handshake refused: frame addressed to rank {dst}, this daemon is rank {me}"
            ),
            HandshakeError::WrongPeer { expected, got } => write!(
                f,
                "handshake refused: dialled rank {expected} but rank {got} answered"
            ),
            HandshakeError::AuthFromOther { hello, auth } => write!(
                f,
                "handshake refused: the Hello claimed rank {hello} but its Auth names rank {auth}"
            ),
            HandshakeError::Rejected => write!(f, "handshake rejected by this daemon"),
            HandshakeError::BadKey => write!(
                f,
                "handshake refused: peer does not hold the DVM's job key (MAC mismatch)"
            ),
            HandshakeError::Wire(e) => write!(f, "handshake failed: {e}"),
        }
    }
}

impl std::error::Error for HandshakeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HandshakeError::Wire(e) => Some(e),
            _ => None,
        }
    }
}

impl From<WireError> for HandshakeError {
    fn from(e: WireError) -> Self {
        HandshakeError::Wire(e)
    }
}

/// Simultaneous connect: when daemons `a` and `b` have dialled each other, both keep the
/// connection dialled by the returned rank (the higher one) and close the other.
pub fn keep_dialled_by(a: Rank, b: Rank) -> Rank {
    a.max(b)
}

/// Encode a `Hello`/`HelloAck` payload: u16 BE identity length, identity bytes, nonce.
/// An identity over `DVM_ID_MAX_BYTES` is truncated at a character boundary (and logged).
pub fn encode_identity(dvm_id: &str, nonce: &[u8; NONCE_LEN]) -> Bytes {
    let mut id = dvm_id;
    if id.len() > DVM_ID_MAX_BYTES {
        log::error!(
            "DVM identity of {} bytes exceeds {DVM_ID_MAX_BYTES}; truncating",
            id.len()
        );
        let mut cut = DVM_ID_MAX_BYTES;
        while !id.is_char_boundary(cut) {
            cut -= 1;
        }
        id = id.get(..cut).unwrap_or("");
    }
    let mut b = BytesMut::with_capacity(2 + id.len() + NONCE_LEN);
    // id.len() <= 255 here, so the cast is lossless.
    b.put_u16(id.len() as u16);
    b.put_slice(id.as_bytes());
    b.put_slice(nonce);
    b.freeze()
}

/// Parse a `Hello`/`HelloAck` payload into (identity, nonce). The payload must be exactly
/// `2 + identity length + NONCE_LEN` bytes with a UTF-8 identity of at most `DVM_ID_MAX_BYTES`.
pub fn decode_identity(payload: &[u8]) -> Result<(&str, [u8; NONCE_LEN]), HandshakeError> {
    let (len, rest) = payload
        .split_first_chunk::<2>()
        .ok_or(HandshakeError::Malformed(
            "payload shorter than its length field",
        ))?;
    let len = usize::from(u16::from_be_bytes(*len));
    if len > DVM_ID_MAX_BYTES {
        return Err(HandshakeError::Malformed(
            "DVM identity longer than 255 bytes",
        ));
    }
    let id = rest.get(..len).ok_or(HandshakeError::Malformed(
        "payload shorter than its identity",
    ))?;
    let nonce_bytes = rest.get(len..).unwrap_or(&[]);
    let nonce: [u8; NONCE_LEN] = nonce_bytes
        .try_into()
        .map_err(|_| HandshakeError::Malformed("nonce is not exactly 16 bytes"))?;
    let id =
        std::str::from_utf8(id).map_err(|_| HandshakeError::Malformed("DVM identity not UTF-8"))?;
    Ok((id, nonce))
}

#[derive(Debug, Clone)]
enum State {
    /// Dialler: Hello sent, waiting for the HelloAck.
    AwaitAck {
        peer: Rank,
        nonce_d: [u8; NONCE_LEN],
    },
    /// Acceptor: waiting for the Hello; `nonce_a` is this side's nonce.
    AwaitHello {
        nonce_a: [u8; NONCE_LEN],
    },
    /// Acceptor: valid Hello received (the peer, `nonce_d`, `nonce_a`); the driver decides.
    Deciding(PeerIdent, [u8; NONCE_LEN], [u8; NONCE_LEN]),
    /// Acceptor: HelloAck sent; waiting for the dialler's proof.
    AwaitAuth {
        peer: PeerIdent,
        nonce_d: [u8; NONCE_LEN],
        nonce_a: [u8; NONCE_LEN],
    },
    /// Acceptor: the dialler proved it holds the key; the driver decides (admit or reject).
    Admitting(PeerIdent),
    /// Dialler: Auth sent (the acceptor proved the key); waiting for the acceptor's `Ready`.
    AwaitReady(PeerIdent),
    Established(PeerIdent),
    Failed(HandshakeError),
}

/// One connection's handshake. Create with [`dial`](Self::dial) or [`accept`](Self::accept);
/// feed decoded frames to [`handle_frame`](Self::handle_frame) until `Established`; send what
/// [`poll_transmit`](Self::poll_transmit) returns.
#[derive(Debug, Clone)]
pub struct Handshake {
    cfg: HandshakeConfig,
    state: State,
    /// Dialler: this is a bulk connection (its `Hello` and `Auth` say so).
    bulk: bool,
    out: VecDeque<(Header, Bytes)>,
}

/// HMAC-SHA256 over the handshake transcript, under the job key, with a role label.
fn transcript_mac(
    key: &JobKey,
    label: &[u8],
    dvm_id: &str,
    dialler: Rank,
    acceptor: Rank,
    first: &[u8; NONCE_LEN],
    second: &[u8; NONCE_LEN],
) -> Hmac<Sha256> {
    // HMAC takes keys of any length (an empty one included), so this cannot fail.
    let mut mac = match Hmac::<Sha256>::new_from_slice(&key.0) {
        Ok(m) => m,
        Err(_) => unreachable_hmac(),
    };
    mac.update(label);
    mac.update(&[0]);
    mac.update(&(dvm_id.len() as u16).to_be_bytes());
    mac.update(dvm_id.as_bytes());
    mac.update(&dialler.to_be_bytes());
    mac.update(&acceptor.to_be_bytes());
    mac.update(first);
    mac.update(second);
    mac
}

/// `Hmac::new_from_slice` accepts every key length; reaching this is a bug in the hmac crate.
#[cold]
fn unreachable_hmac() -> ! {
    unreachable!("HMAC accepts keys of any length")
}

const LABEL_ACK: &[u8] = b"tbon-ack";
const LABEL_DIAL: &[u8] = b"tbon-dial";
/// The labels of a bulk connection's MACs: the flag in its `Hello` is proved with the key.
const LABEL_BULK_ACK: &[u8] = b"tbon-bulk-ack";
const LABEL_BULK_DIAL: &[u8] = b"tbon-bulk-dial";

/// The tag of a bulk connection's `Hello` and `Auth` (a link's are 0).
pub const TAG_BULK_CONNECTION: u32 = 1;

/// The MAC labels (acceptor's, dialler's) of a link or a bulk connection.
fn labels(bulk: bool) -> (&'static [u8], &'static [u8]) {
    if bulk {
        (LABEL_BULK_ACK, LABEL_BULK_DIAL)
    } else {
        (LABEL_ACK, LABEL_DIAL)
    }
}

impl Handshake {
    /// Dialler side: queues the `Hello` for `peer` (take it with `poll_transmit`). `nonce_d`
    /// must be fresh and unpredictable, drawn anew for every handshake: the `HelloAck` proves
    /// the acceptor holds the key by a MAC over it, so a reused nonce accepts a replayed one.
    pub fn dial(cfg: &HandshakeConfig, peer: Rank, nonce_d: [u8; NONCE_LEN]) -> Self {
        Self::dial_as(cfg, peer, nonce_d, false)
    }

    /// Dialler side of a bulk connection: as [`dial`](Self::dial), but the connection will
    /// carry only this side's bulk data to `peer`, never be the link (`docs/wire.md`). The
    /// acceptor learns it from the `Hello` and both MACs prove it.
    pub fn dial_bulk(cfg: &HandshakeConfig, peer: Rank, nonce_d: [u8; NONCE_LEN]) -> Self {
        Self::dial_as(cfg, peer, nonce_d, true)
    }

    fn dial_as(cfg: &HandshakeConfig, peer: Rank, nonce_d: [u8; NONCE_LEN], bulk: bool) -> Self {
        let mut hs = Handshake {
            cfg: cfg.clone(),
            state: State::AwaitAck { peer, nonce_d },
            bulk,
            out: VecDeque::new(),
        };
        let payload = encode_identity(&hs.cfg.dvm_id, &nonce_d);
        hs.queue(Kind::Hello, peer, payload, bulk);
        hs
    }

    /// Acceptor side: waits for the dialler's `Hello`. `nonce_a` (sent in the `HelloAck`) must
    /// be fresh and unpredictable, drawn anew for every handshake: the dialler's `Auth` is a MAC
    /// over it, so a reused nonce accepts a recorded `Auth` replayed by a stranger.
    pub fn accept(cfg: &HandshakeConfig, nonce_a: [u8; NONCE_LEN]) -> Self {
        Handshake {
            cfg: cfg.clone(),
            state: State::AwaitHello { nonce_a },
            bulk: false,
            out: VecDeque::new(),
        }
    }

    /// The key an acceptor's MACs with `dialler` are under: the operator credential for a
    /// tool, the job key for a daemon. (A dialler uses its own `cfg.key`: a tool's is the
    /// operator credential.)
    fn key_for(&self, dialler: Rank) -> JobKey {
        if dialler == TOOL_RANK {
            self.cfg.key.operator()
        } else {
            self.cfg.key.clone()
        }
    }

    fn queue(&mut self, kind: Kind, dst: Rank, payload: Bytes, bulk: bool) {
        let header = Header {
            kind,
            origin: self.cfg.me,
            dst,
            tag: if bulk { TAG_BULK_CONNECTION } else { 0 },
            epoch: self.cfg.epoch,
            seq: 0,
            // Payload is at most 2 + 255 + 16 + 32 bytes.
            len: payload.len() as u32,
            lives: 0,
        };
        self.out.push_back((header, payload));
    }

    /// The next frame to send, if any. Push it into the connection's `SendQueue`.
    pub fn poll_transmit(&mut self) -> Option<(Header, Bytes)> {
        self.out.pop_front()
    }

    /// Judge one decoded frame from the peer.
    ///
    /// Returns `Ok(Some(event))` to act on, or `Err` (log it, close the connection; the
    /// handshake then returns the same error for every later frame). Once established, data
    /// frames belong to the messaging layer, not here: passing one returns `UnexpectedKind`
    /// without changing state. On the acceptor, frames arriving after `HelloReceived` and before
    /// the decision are a protocol violation (the dialler must wait for the `HelloAck`).
    pub fn handle_frame(&mut self, frame: Frame) -> Result<Option<HandshakeEvent>, HandshakeError> {
        let result = match &self.state {
            State::Failed(e) => return Err(e.clone()),
            State::Established(_) => return Err(HandshakeError::UnexpectedKind(frame.header.kind)),
            State::AwaitAck { peer, nonce_d } => {
                let (peer, nonce_d) = (*peer, *nonce_d);
                self.on_hello_ack(peer, nonce_d, &frame)
            }
            State::AwaitHello { nonce_a } => {
                let nonce_a = *nonce_a;
                self.on_hello(nonce_a, &frame)
            }
            State::Deciding(..) | State::Admitting(_) => {
                Err(HandshakeError::UnexpectedKind(frame.header.kind))
            }
            State::AwaitReady(peer) => {
                let peer = *peer;
                self.on_ready(peer, &frame)
            }
            State::AwaitAuth {
                peer,
                nonce_d,
                nonce_a,
            } => self.on_auth(*peer, *nonce_d, *nonce_a, &frame),
        };
        match result {
            Ok(state) => {
                let event = match state {
                    State::Deciding(p, ..) => Some(HandshakeEvent::HelloReceived(p)),
                    State::Admitting(p) => Some(HandshakeEvent::Authenticated(p)),
                    State::Established(p) => Some(HandshakeEvent::Established(p)),
                    _ => None,
                };
                self.state = state;
                Ok(event)
            }
            Err(e) => {
                log::debug!("{e}");
                self.state = State::Failed(e.clone());
                Err(e)
            }
        }
    }

    fn check_identity(&self, identity: &[u8]) -> Result<[u8; NONCE_LEN], HandshakeError> {
        let (id, nonce) = decode_identity(identity)?;
        if id != self.cfg.dvm_id {
            return Err(HandshakeError::WrongDvm {
                expected: self.cfg.dvm_id.clone(),
                got: id.to_owned(),
            });
        }
        Ok(nonce)
    }

    /// The fields every handshake frame shares: addressed to this daemon, sequence zero, tag
    /// zero (or, in a bulk connection's `Hello` and `Auth`, `TAG_BULK_CONNECTION`:
    /// `docs/wire.md`).
    fn check_header(&self, h: &Header, bulk: bool) -> Result<(), HandshakeError> {
        let tag = if bulk { TAG_BULK_CONNECTION } else { 0 };
        if h.tag != tag || h.seq != 0 {
            return Err(HandshakeError::Malformed(
                "handshake frame with a non-zero tag or sequence",
            ));
        }
        if h.dst != self.cfg.me {
            return Err(HandshakeError::WrongDestination {
                dst: h.dst,
                me: self.cfg.me,
            });
        }
        Ok(())
    }

    fn on_hello(&self, nonce_a: [u8; NONCE_LEN], frame: &Frame) -> Result<State, HandshakeError> {
        let h = &frame.header;
        if h.kind != Kind::Hello {
            return Err(HandshakeError::UnexpectedKind(h.kind));
        }
        let nonce_d = self.check_identity(&frame.payload)?;
        if h.origin != TOOL_RANK && (h.origin >= self.cfg.size || h.origin == self.cfg.me) {
            return Err(HandshakeError::BadRank {
                rank: h.origin,
                size: self.cfg.size,
            });
        }
        let bulk = h.tag == TAG_BULK_CONNECTION && h.origin != TOOL_RANK;
        self.check_header(h, bulk)?;
        Ok(State::Deciding(
            PeerIdent {
                rank: h.origin,
                epoch: h.epoch,
                bulk,
            },
            nonce_d,
            nonce_a,
        ))
    }

    fn on_hello_ack(
        &mut self,
        peer: Rank,
        nonce_d: [u8; NONCE_LEN],
        frame: &Frame,
    ) -> Result<State, HandshakeError> {
        let h = &frame.header;
        if h.kind != Kind::HelloAck {
            return Err(HandshakeError::UnexpectedKind(h.kind));
        }
        let split = frame
            .payload
            .len()
            .checked_sub(MAC_LEN)
            .ok_or(HandshakeError::Malformed("HelloAck shorter than its MAC"))?;
        let (identity, mac_a) = frame.payload.split_at(split);
        let nonce_a = self.check_identity(identity)?;
        if h.origin != peer {
            return Err(HandshakeError::WrongPeer {
                expected: peer,
                got: h.origin,
            });
        }
        self.check_header(h, false)?;
        let me = self.cfg.me;
        let (label_ack, label_dial) = labels(self.bulk);
        transcript_mac(
            &self.cfg.key,
            label_ack,
            &self.cfg.dvm_id,
            me,
            peer,
            &nonce_d,
            &nonce_a,
        )
        .verify_slice(mac_a)
        .map_err(|_| HandshakeError::BadKey)?;
        let mac_d = transcript_mac(
            &self.cfg.key,
            label_dial,
            &self.cfg.dvm_id,
            me,
            peer,
            &nonce_a,
            &nonce_d,
        )
        .finalize()
        .into_bytes();
        self.queue(Kind::Auth, peer, Bytes::copy_from_slice(&mac_d), self.bulk);
        Ok(State::AwaitReady(PeerIdent {
            rank: peer,
            epoch: h.epoch,
            bulk: self.bulk,
        }))
    }

    /// Dialler: the acceptor admitted this connection. Only the acceptor that proved the key
    /// on this connection can send it (no frame is taken from anyone else on it).
    fn on_ready(&self, peer: PeerIdent, frame: &Frame) -> Result<State, HandshakeError> {
        let h = &frame.header;
        if h.kind != Kind::Ready {
            return Err(HandshakeError::UnexpectedKind(h.kind));
        }
        if h.origin != peer.rank {
            return Err(HandshakeError::WrongPeer {
                expected: peer.rank,
                got: h.origin,
            });
        }
        self.check_header(h, false)?;
        if !frame.payload.is_empty() {
            return Err(HandshakeError::Malformed("Ready with a payload"));
        }
        Ok(State::Established(peer))
    }

    fn on_auth(
        &self,
        peer: PeerIdent,
        nonce_d: [u8; NONCE_LEN],
        nonce_a: [u8; NONCE_LEN],
        frame: &Frame,
    ) -> Result<State, HandshakeError> {
        let h = &frame.header;
        if h.kind != Kind::Auth {
            return Err(HandshakeError::UnexpectedKind(h.kind));
        }
        if h.origin != peer.rank {
            return Err(HandshakeError::AuthFromOther {
                hello: peer.rank,
                auth: h.origin,
            });
        }
        self.check_header(h, peer.bulk)?;
        if frame.payload.len() != MAC_LEN {
            return Err(HandshakeError::Malformed("Auth payload is not one MAC"));
        }
        let me = self.cfg.me;
        transcript_mac(
            &self.key_for(peer.rank),
            labels(peer.bulk).1,
            &self.cfg.dvm_id,
            peer.rank,
            me,
            &nonce_a,
            &nonce_d,
        )
        .verify_slice(&frame.payload)
        .map_err(|_| HandshakeError::BadKey)?;
        Ok(State::Admitting(peer))
    }

    /// Acceptor, after `HelloReceived`: queue the `HelloAck` (with this side's nonce and proof
    /// of the key). The handshake completes when the dialler's `Auth` arrives and checks out
    /// (`handle_frame` then returns `Established`). Returns false, changing nothing, when no
    /// `HelloReceived` is pending.
    pub fn try_accept_peer(&mut self) -> bool {
        let State::Deciding(p, nonce_d, nonce_a) = self.state else {
            return false;
        };
        let me = self.cfg.me;
        let mac_a = transcript_mac(
            &self.key_for(p.rank),
            labels(p.bulk).0,
            &self.cfg.dvm_id,
            p.rank,
            me,
            &nonce_d,
            &nonce_a,
        )
        .finalize()
        .into_bytes();
        let mut payload = BytesMut::from(&encode_identity(&self.cfg.dvm_id, &nonce_a)[..]);
        payload.put_slice(&mac_a);
        self.queue(Kind::HelloAck, p.rank, payload.freeze(), false);
        self.state = State::AwaitAuth {
            peer: p,
            nonce_d,
            nonce_a,
        };
        true
    }

    /// Acceptor, after `Authenticated`: make this connection the link to its peer. Queues the
    /// `Ready` that lets the dialler send; the handshake is then established (raise the
    /// decoder's maximum). Returns false, changing nothing, when no `Authenticated` is pending.
    pub fn admit(&mut self) -> bool {
        let State::Admitting(p) = self.state else {
            return false;
        };
        self.queue(Kind::Ready, p.rank, Bytes::new(), false);
        self.state = State::Established(p);
        true
    }

    /// Dialler: whether this side has sent its proof (`Auth`) and waits for `Ready`. From then
    /// on the acceptor may admit the connection at any moment, so a simultaneous connect must
    /// be resolved by the rank rule ([`super::arbiter`]), not by dropping this dial.
    pub fn has_sent_proof(&self) -> bool {
        matches!(self.state, State::AwaitReady(_))
    }

    /// Refuse the peer (e.g. the losing connection of a simultaneous connect). Nothing is sent:
    /// the driver closes the connection. Later frames return `HandshakeError::Rejected`.
    pub fn reject(&mut self) {
        self.out.clear();
        self.state = State::Failed(HandshakeError::Rejected);
    }

    /// Whether the handshake completed; data frames may flow.
    pub fn is_established(&self) -> bool {
        matches!(self.state, State::Established(_))
    }

    /// Whether the handshake failed (or was rejected); the connection must be closed.
    pub fn is_failed(&self) -> bool {
        matches!(self.state, State::Failed(_))
    }

    /// The state's name, for tests that explore states (nonces and keys left out).
    #[cfg(test)]
    pub(crate) fn phase(&self) -> &'static str {
        match self.state {
            State::AwaitAck { .. } => "await-ack",
            State::AwaitHello { .. } => "await-hello",
            State::Deciding(..) => "deciding",
            State::AwaitAuth { .. } => "await-auth",
            State::Admitting(_) => "admitting",
            State::AwaitReady(_) => "await-ready",
            State::Established(_) => "established",
            State::Failed(_) => "failed",
        }
    }

    /// The peer, once known: the dialled rank for a dialler (epoch once established), the
    /// `Hello`'s origin for an acceptor.
    pub fn peer(&self) -> Option<PeerIdent> {
        match &self.state {
            State::Deciding(p, ..)
            | State::AwaitAuth { peer: p, .. }
            | State::Admitting(p)
            | State::AwaitReady(p)
            | State::Established(p) => Some(*p),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::HANDSHAKE_MAX_PAYLOAD;
    use crate::oob::{FrameDecoder, SendQueue};
    use proptest::prelude::*;
    use std::io::IoSlice;

    /// A nonce no other call in this test binary returns (what the driver's nonces are).
    fn fresh() -> [u8; NONCE_LEN] {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut nonce = [0xa5; NONCE_LEN];
        nonce[..8].copy_from_slice(&n.to_le_bytes());
        nonce
    }

    fn cfg(me: Rank) -> HandshakeConfig {
        HandshakeConfig {
            me,
            size: 8,
            epoch: 100 + u64::from(me),
            dvm_id: "prterun-host-1234@0".to_owned(),
            key: JobKey::new(*b"a test key of 32 bytes, exactly!"),
        }
    }

    /// Move every queued frame of `from` through a SendQueue, raw bytes and a FrameDecoder.
    fn transfer(from: &mut Handshake) -> Vec<Frame> {
        let mut q = SendQueue::new(1 << 20);
        while let Some((h, p)) = from.poll_transmit() {
            q.push(&h, p).expect("room");
        }
        let mut wire = Vec::new();
        while !q.is_empty() {
            let mut iov = [IoSlice::new(&[]); 8];
            let n = q.io_slices(&mut iov, true);
            let before = wire.len();
            for s in &iov[..n] {
                wire.extend_from_slice(s);
            }
            q.advance(wire.len() - before);
        }
        let mut dec = FrameDecoder::new(HANDSHAKE_MAX_PAYLOAD);
        let mut frames = Vec::new();
        for b in wire {
            dec.feed(&[b]);
            while let Some(f) = dec.next_frame().expect("valid") {
                frames.push(f);
            }
        }
        frames
    }

    fn one(from: &mut Handshake) -> Frame {
        let mut v = transfer(from);
        assert_eq!(v.len(), 1);
        v.remove(0)
    }

    fn hello_from(me: Rank, to: Rank) -> Frame {
        one(&mut Handshake::dial(&cfg(me), to, fresh()))
    }

    #[test]
    fn a_bulk_connection_says_so_and_both_macs_prove_it() {
        let (mut d, mut a) = (
            Handshake::dial_bulk(&cfg(1), 2, fresh()),
            Handshake::accept(&cfg(2), fresh()),
        );
        let peer = PeerIdent {
            rank: 1,
            epoch: 101,
            bulk: true,
        };
        assert_eq!(
            a.handle_frame(one(&mut d)),
            Ok(Some(HandshakeEvent::HelloReceived(peer)))
        );
        assert!(a.try_accept_peer());
        assert_eq!(d.handle_frame(one(&mut a)), Ok(None));
        assert_eq!(
            a.handle_frame(one(&mut d)),
            Ok(Some(HandshakeEvent::Authenticated(peer)))
        );
        assert!(a.admit());
        let event = d.handle_frame(one(&mut a)).unwrap();
        assert!(matches!(event, Some(HandshakeEvent::Established(p)) if p.bulk && p.rank == 2));
    }

    #[test]
    fn a_link_hello_turned_bulk_on_the_way_fails_the_dialler_s_check() {
        // The flag is not in the MAC's input as a field but in its label: an acceptor that
        // read a link's Hello as a bulk connection's proves the wrong label.
        let mut d = Handshake::dial(&cfg(1), 2, fresh());
        let mut a = Handshake::accept(&cfg(2), fresh());
        let mut hello = one(&mut d);
        hello.header.tag = TAG_BULK_CONNECTION;
        assert!(matches!(
            a.handle_frame(hello),
            Ok(Some(HandshakeEvent::HelloReceived(p))) if p.bulk
        ));
        assert!(a.try_accept_peer());
        assert_eq!(d.handle_frame(one(&mut a)), Err(HandshakeError::BadKey));
        // And a bulk dial whose Auth lost its flag is refused by the acceptor.
        let mut d = Handshake::dial_bulk(&cfg(1), 2, fresh());
        let mut a = Handshake::accept(&cfg(2), fresh());
        a.handle_frame(one(&mut d)).unwrap();
        assert!(a.try_accept_peer());
        d.handle_frame(one(&mut a)).unwrap();
        let mut auth = one(&mut d);
        auth.header.tag = 0;
        assert!(matches!(
            a.handle_frame(auth),
            Err(HandshakeError::Malformed(_))
        ));
    }

    /// Runs a tool's handshake with `key` against daemon 5 (which holds `cfg`'s job key):
    /// the acceptor's and the dialler's outcomes.
    fn tool_handshake(key: JobKey) -> (Result<(), HandshakeError>, Option<HandshakeEvent>) {
        let tool = HandshakeConfig {
            me: TOOL_RANK,
            key,
            ..cfg(0)
        };
        let mut d = Handshake::dial(&tool, 5, fresh());
        let mut a = Handshake::accept(&cfg(5), fresh());
        let peer = PeerIdent {
            rank: TOOL_RANK,
            epoch: 100,
            bulk: false,
        };
        assert_eq!(
            a.handle_frame(one(&mut d)),
            Ok(Some(HandshakeEvent::HelloReceived(peer)))
        );
        assert!(a.try_accept_peer());
        if let Err(e) = d.handle_frame(one(&mut a)) {
            return (Err(e), None);
        }
        match a.handle_frame(one(&mut d)) {
            Ok(Some(HandshakeEvent::Authenticated(p))) => {
                assert_eq!(p, peer);
                assert!(a.admit());
                (Ok(()), d.handle_frame(one(&mut a)).unwrap())
            }
            other => (other.map(|_| ()), None),
        }
    }

    #[test]
    fn a_tool_proves_the_operator_credential_and_nothing_else() {
        let job = cfg(0).key;
        let (acceptor, dialler) = tool_handshake(job.operator());
        assert_eq!(acceptor, Ok(()));
        assert!(
            matches!(dialler, Some(HandshakeEvent::Established(p)) if p.rank == 5),
            "{dialler:?}"
        );
        // The job key itself is not the operator credential: a tool must derive it.
        assert_eq!(tool_handshake(job.clone()).0, Err(HandshakeError::BadKey));
        assert_eq!(
            tool_handshake(JobKey::new(*b"someone else's key, 32 bytes....")).0,
            Err(HandshakeError::BadKey)
        );
        // A daemon that holds only the operator credential cannot join as a daemon.
        let mut d = Handshake::dial(
            &HandshakeConfig {
                key: job.operator(),
                ..cfg(2)
            },
            5,
            fresh(),
        );
        let mut a = Handshake::accept(&cfg(5), fresh());
        a.handle_frame(one(&mut d)).unwrap();
        a.try_accept_peer();
        assert_eq!(d.handle_frame(one(&mut a)), Err(HandshakeError::BadKey));
        assert_ne!(job.operator(), job);
        assert_eq!(
            job.operator(),
            cfg(3).key.operator(),
            "a pure function of the key"
        );
    }

    #[test]
    fn happy_path() {
        let mut d = Handshake::dial(&cfg(2), 5, fresh());
        let mut a = Handshake::accept(&cfg(5), fresh());
        assert!(a.poll_transmit().is_none());
        let hello = one(&mut d);
        assert_eq!(hello.header.kind, Kind::Hello);
        assert_eq!(hello.header.len as usize, hello.payload.len());
        assert!(hello.payload.len() <= HANDSHAKE_MAX_PAYLOAD as usize);
        let p2 = PeerIdent {
            rank: 2,
            epoch: 102,
            bulk: false,
        };
        assert_eq!(
            a.handle_frame(hello),
            Ok(Some(HandshakeEvent::HelloReceived(p2)))
        );
        assert!(!a.is_established());
        assert_eq!(a.peer(), Some(p2));
        assert!(a.try_accept_peer());
        // Not established until the dialler proves it holds the key.
        assert!(!a.is_established());
        let ack = one(&mut a);
        assert_eq!(ack.header.kind, Kind::HelloAck);
        assert_eq!((ack.header.origin, ack.header.dst), (5, 2));
        // Idempotent: no second ack.
        assert!(!a.try_accept_peer());
        assert!(a.poll_transmit().is_none());
        let p5 = PeerIdent {
            rank: 5,
            epoch: 105,
            bulk: false,
        };
        // The acceptor proved the key; the dialler proves it in turn and waits to be admitted.
        assert_eq!(d.handle_frame(ack), Ok(None));
        assert!(!d.is_established() && d.has_sent_proof());
        assert_eq!(d.peer(), Some(p5));
        let auth = one(&mut d);
        assert_eq!(auth.header.kind, Kind::Auth);
        assert_eq!(
            a.handle_frame(auth),
            Ok(Some(HandshakeEvent::Authenticated(p2)))
        );
        // Not established until the driver admits the connection.
        assert!(!a.is_established());
        assert!(a.poll_transmit().is_none());
        assert!(a.admit());
        assert!(a.is_established());
        // Idempotent: no second Ready.
        assert!(!a.admit());
        let ready = one(&mut a);
        assert_eq!(ready.header.kind, Kind::Ready);
        assert_eq!((ready.header.origin, ready.header.dst), (5, 2));
        assert!(ready.payload.is_empty());
        assert_eq!(
            d.handle_frame(ready),
            Ok(Some(HandshakeEvent::Established(p5)))
        );
        assert!(d.is_established() && !d.has_sent_proof());
        // Data frames are not the handshake's business.
        let data = Frame {
            header: Header {
                kind: Kind::Msg,
                ..hello_from(2, 5).header
            },
            payload: Bytes::new(),
        };
        assert_eq!(
            d.handle_frame(data),
            Err(HandshakeError::UnexpectedKind(Kind::Msg))
        );
        assert!(d.is_established());
    }

    /// After its proof the dialler takes only the acceptor's `Ready`: a data frame pipelined
    /// early, a `Ready` from another rank or with a payload is refused.
    #[test]
    fn a_dialler_takes_nothing_but_ready_after_its_proof() {
        let proved = || {
            let mut d = Handshake::dial(&cfg(2), 5, fresh());
            let mut a = Handshake::accept(&cfg(5), fresh());
            a.handle_frame(one(&mut d)).expect("hello");
            assert!(a.try_accept_peer());
            d.handle_frame(one(&mut a)).expect("ack");
            let auth = one(&mut d);
            assert!(matches!(
                a.handle_frame(auth),
                Ok(Some(HandshakeEvent::Authenticated(_)))
            ));
            assert!(a.admit());
            (d, one(&mut a))
        };
        let (mut d, ready) = proved();
        let data = Frame {
            header: Header {
                kind: Kind::Msg,
                ..ready.header
            },
            payload: Bytes::new(),
        };
        assert_eq!(
            d.handle_frame(data),
            Err(HandshakeError::UnexpectedKind(Kind::Msg))
        );
        let (mut d, mut ready) = proved();
        ready.header.origin = 6;
        assert_eq!(
            d.handle_frame(ready),
            Err(HandshakeError::WrongPeer {
                expected: 5,
                got: 6
            })
        );
        let (mut d, mut ready) = proved();
        ready.payload = Bytes::from_static(b"x");
        ready.header.len = 1;
        assert_eq!(
            d.handle_frame(ready),
            Err(HandshakeError::Malformed("Ready with a payload"))
        );
        // An acceptor that has not authenticated anyone admits nothing.
        let mut a = Handshake::accept(&cfg(5), fresh());
        assert!(!a.admit());
        assert!(a.poll_transmit().is_none());
    }

    /// `docs/wire.md`: sequence is zero in every handshake frame, and the tag too except a
    /// bulk connection's flag; a Hello that says otherwise is refused, not answered.
    #[test]
    fn a_hello_with_a_non_zero_tag_or_sequence_is_refused() {
        for (tag, seq) in [(2, 0), (0, 1), (TAG_BULK_CONNECTION, 1)] {
            let mut hello = hello_from(2, 5);
            hello.header.tag = tag;
            hello.header.seq = seq;
            let mut a = Handshake::accept(&cfg(5), fresh());
            assert_eq!(
                a.handle_frame(hello),
                Err(HandshakeError::Malformed(
                    "handshake frame with a non-zero tag or sequence"
                ))
            );
            assert!(
                a.poll_transmit().is_none(),
                "a refused Hello is not answered"
            );
        }
    }

    /// An Auth from another rank than the Hello's is named as that, not as a wrong answer to a
    /// dial.
    #[test]
    fn an_auth_from_another_rank_says_so() {
        let mut d = Handshake::dial(&cfg(2), 5, fresh());
        let mut a = Handshake::accept(&cfg(5), fresh());
        a.handle_frame(one(&mut d)).unwrap();
        assert!(a.try_accept_peer());
        d.handle_frame(one(&mut a)).unwrap();
        let mut auth = one(&mut d);
        auth.header.origin = 3;
        let err = a.handle_frame(auth).unwrap_err();
        assert_eq!(err, HandshakeError::AuthFromOther { hello: 2, auth: 3 });
        assert!(
            err.to_string().contains("the Hello claimed rank 2"),
            "{err}"
        );
    }

    #[test]
    fn identity_payload_layout() {
        let p = encode_identity("ab", &[0; NONCE_LEN]);
        let mut want = vec![0, 2, b'a', b'b'];
        want.extend_from_slice(&[0; NONCE_LEN]);
        assert_eq!(&p[..], &want[..]);
        assert_eq!(decode_identity(&p), Ok(("ab", [0; NONCE_LEN])));
    }

    #[test]
    fn long_identity_is_truncated_and_flagged() {
        let mut c = cfg(1);
        c.dvm_id = "é".repeat(200); // 400 bytes
        assert!(c.validate().is_err());
        let p = encode_identity(&c.dvm_id, &[0; NONCE_LEN]);
        let (id, _) = decode_identity(&p).expect("valid");
        assert_eq!(id.len(), 254);
        assert!(cfg(1).validate().is_ok());
    }

    #[test]
    fn wrong_dvm() {
        let mut a = Handshake::accept(&cfg(5), fresh());
        let mut other = cfg(2);
        other.dvm_id = "someone-else".to_owned();
        let hello = one(&mut Handshake::dial(&other, 5, fresh()));
        let e = a.handle_frame(hello).expect_err("refused");
        assert_eq!(
            e,
            HandshakeError::WrongDvm {
                expected: cfg(5).dvm_id,
                got: "someone-else".to_owned()
            }
        );
        assert!(e.to_string().contains("someone-else"));
        assert!(a.is_failed());
        // Poisoned: the same error again.
        assert_eq!(a.handle_frame(hello_from(2, 5)), Err(e));
    }

    #[test]
    fn acceptor_rejections() {
        let cases: Vec<(Frame, HandshakeError)> = vec![
            (
                hello_from(8, 5),
                HandshakeError::BadRank { rank: 8, size: 8 },
            ),
            (
                hello_from(5, 5),
                HandshakeError::BadRank { rank: 5, size: 8 },
            ),
            (
                hello_from(2, 4),
                HandshakeError::WrongDestination { dst: 4, me: 5 },
            ),
            (
                Frame {
                    header: Header {
                        kind: Kind::HelloAck,
                        ..hello_from(2, 5).header
                    },
                    ..hello_from(2, 5)
                },
                HandshakeError::UnexpectedKind(Kind::HelloAck),
            ),
            (
                Frame {
                    header: Header {
                        kind: Kind::Msg,
                        ..hello_from(2, 5).header
                    },
                    ..hello_from(2, 5)
                },
                HandshakeError::UnexpectedKind(Kind::Msg),
            ),
        ];
        for (frame, want) in cases {
            let mut a = Handshake::accept(&cfg(5), fresh());
            assert_eq!(a.handle_frame(frame), Err(want));
            assert!(a.is_failed());
        }
    }

    #[test]
    fn dialler_rejections() {
        let ack_from = |me: Rank, to: Rank, kind: Kind| {
            let mut a = Handshake::accept(&cfg(me), fresh());
            a.handle_frame(hello_from(to, me)).expect("hello ok");
            assert!(a.try_accept_peer());
            let mut f = one(&mut a);
            f.header.kind = kind;
            f
        };
        let cases = [
            (
                ack_from(6, 2, Kind::HelloAck),
                HandshakeError::WrongPeer {
                    expected: 5,
                    got: 6,
                },
            ),
            (
                ack_from(5, 3, Kind::HelloAck),
                HandshakeError::WrongDestination { dst: 3, me: 2 },
            ),
            (
                ack_from(5, 2, Kind::Hello),
                HandshakeError::UnexpectedKind(Kind::Hello),
            ),
        ];
        for (frame, want) in cases {
            let mut d = Handshake::dial(&cfg(2), 5, fresh());
            assert_eq!(d.handle_frame(frame), Err(want));
            assert!(!d.is_established());
        }
    }

    #[test]
    fn malformed_payloads() {
        let good = hello_from(2, 5);
        let id = cfg(2).dvm_id;
        let with = |payload: Vec<u8>| Frame {
            header: Header {
                len: payload.len() as u32,
                ..good.header
            },
            payload: Bytes::from(payload),
        };
        let mut too_long = vec![1, 0];
        too_long.extend_from_slice(&[b'a'; 256]);
        too_long.extend_from_slice(&[0; NONCE_LEN]);
        let mut bad_utf8 = vec![0, 2, 0xff, 0xfe];
        bad_utf8.extend_from_slice(&[0; NONCE_LEN]);
        let mut trailing = good.payload.to_vec();
        trailing.push(0);
        let truncated = good.payload[..good.payload.len() - 1].to_vec();
        let mut short_id = vec![0, id.len() as u8 + 20];
        short_id.extend_from_slice(id.as_bytes());
        let cases = [
            vec![],
            vec![0],
            vec![0, 0],
            truncated,
            trailing,
            too_long,
            bad_utf8,
            short_id,
            b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        ];
        for payload in cases {
            let mut a = Handshake::accept(&cfg(5), fresh());
            let r = a.handle_frame(with(payload.clone()));
            assert!(
                matches!(r, Err(HandshakeError::Malformed(_))),
                "{payload:?}: {r:?}"
            );
        }
    }

    #[test]
    fn reject_and_misuse() {
        let mut a = Handshake::accept(&cfg(5), fresh());
        assert!(!a.try_accept_peer());
        a.handle_frame(hello_from(2, 5)).expect("ok");
        a.reject();
        assert!(a.is_failed());
        assert!(a.poll_transmit().is_none());
        assert!(!a.try_accept_peer());
        assert_eq!(
            a.handle_frame(hello_from(2, 5)),
            Err(HandshakeError::Rejected)
        );
        // A frame while the driver is still deciding is a protocol violation.
        let mut a = Handshake::accept(&cfg(5), fresh());
        a.handle_frame(hello_from(2, 5)).expect("ok");
        assert!(a.handle_frame(hello_from(2, 5)).is_err());
    }

    #[test]
    fn simultaneous_connect_rule() {
        assert_eq!(keep_dialled_by(3, 7), 7);
        assert_eq!(keep_dialled_by(7, 3), 7);
        assert_eq!(keep_dialled_by(0, 1), 1);
    }

    #[test]
    fn wire_error_converts() {
        let e = HandshakeError::from(WireError::BadVersion(2));
        assert!(e.to_string().contains("version 2"));
    }

    proptest! {
        #[test]
        fn random_frames_never_panic(
            kind in 1u8..=5, origin in any::<u32>(), dst in 0u32..10, epoch in any::<u64>(),
            payload in proptest::collection::vec(any::<u8>(), 0..300),
            flip in any::<(usize, u8)>(),
        ) {
            let kind = Kind::try_from(kind).expect("valid kind");
            let header = Header { kind, origin, dst, tag: 0, epoch, seq: 0, len: payload.len() as u32, lives: 0 };
            let f = Frame { header, payload: Bytes::from(payload) };
            let _ = Handshake::accept(&cfg(5), fresh()).handle_frame(f.clone());
            let _ = Handshake::dial(&cfg(5), 2, fresh()).handle_frame(f);
            // A bit-flipped valid Hello.
            let mut good = hello_from(2, 5).payload.to_vec();
            let n = good.len();
            if let Some(b) = good.get_mut(flip.0 % n) { *b ^= 1 << (flip.1 % 8); }
            let f = Frame { header: Header { len: n as u32, ..hello_from(2, 5).header }, payload: Bytes::from(good) };
            let _ = Handshake::accept(&cfg(5), fresh()).handle_frame(f);
        }
    }

    /// Runs a full handshake between a dialler and an acceptor holding the given keys.
    fn run(
        dial_key: JobKey,
        accept_key: JobKey,
    ) -> (Result<(), HandshakeError>, Result<(), HandshakeError>) {
        let mut dc = cfg(2);
        dc.key = dial_key;
        let mut ac = cfg(5);
        ac.key = accept_key;
        let mut d = Handshake::dial(&dc, 5, fresh());
        let mut a = Handshake::accept(&ac, fresh());
        a.handle_frame(one(&mut d)).expect("hello");
        assert!(a.try_accept_peer());
        let dr = d.handle_frame(one(&mut a)).map(|_| ());
        if dr.is_err() {
            return (dr, Err(HandshakeError::Rejected));
        }
        let ar = a.handle_frame(one(&mut d)).map(|_| ());
        if ar.is_ok() {
            assert!(a.admit());
            assert!(matches!(
                d.handle_frame(one(&mut a)),
                Ok(Some(HandshakeEvent::Established(_)))
            ));
        }
        (dr, ar)
    }

    #[test]
    fn both_sides_must_hold_the_key() {
        let k = JobKey::new(*b"0123456789abcdef");
        assert_eq!(run(k.clone(), k.clone()), (Ok(()), Ok(())));
        // The dialler catches an acceptor without the key from its HelloAck.
        let (dr, _) = run(k.clone(), JobKey::new(*b"fedcba9876543210"));
        assert_eq!(dr, Err(HandshakeError::BadKey));
        // An unauthenticated daemon cannot join a keyed one, nor the other way round.
        assert_eq!(
            run(JobKey::none(), k.clone()).0,
            Err(HandshakeError::BadKey)
        );
        assert_eq!(run(k, JobKey::none()).0, Err(HandshakeError::BadKey));
        // Two unauthenticated daemons run the same exchange.
        assert_eq!(run(JobKey::none(), JobKey::none()), (Ok(()), Ok(())));
    }

    #[test]
    fn a_forged_or_replayed_proof_is_refused() {
        // The acceptor catches a dialler that cannot compute the proof.
        let mut a = Handshake::accept(&cfg(5), fresh());
        let mut d = Handshake::dial(&cfg(2), 5, fresh());
        a.handle_frame(one(&mut d)).expect("hello");
        assert!(a.try_accept_peer());
        let _ack = one(&mut a);
        let forged = Frame {
            header: Header {
                kind: Kind::Auth,
                origin: 2,
                dst: 5,
                tag: 0,
                epoch: 0,
                seq: 0,
                len: MAC_LEN as u32,
                lives: 0,
            },
            payload: Bytes::from(vec![0u8; MAC_LEN]),
        };
        assert_eq!(a.handle_frame(forged), Err(HandshakeError::BadKey));
        // A proof recorded from one handshake does not open another: the acceptor's nonce is
        // fresh every time.
        let mut d1 = Handshake::dial(&cfg(2), 5, fresh());
        let hello = one(&mut d1);
        let mut a1 = Handshake::accept(&cfg(5), fresh());
        a1.handle_frame(hello.clone()).expect("hello");
        assert!(a1.try_accept_peer());
        d1.handle_frame(one(&mut a1)).expect("ack");
        let recorded_auth = one(&mut d1);
        let mut a2 = Handshake::accept(&cfg(5), fresh());
        a2.handle_frame(hello).expect("replayed hello");
        assert!(a2.try_accept_peer());
        let _ = one(&mut a2);
        assert_eq!(
            a2.handle_frame(recorded_auth.clone()),
            Err(HandshakeError::BadKey)
        );
        // Freshness is the caller's duty: an acceptor given a nonce again accepts the replay.
        let nonce_a = [7; NONCE_LEN];
        let mut d1 = Handshake::dial(&cfg(2), 5, fresh());
        let hello = one(&mut d1);
        let mut a1 = Handshake::accept(&cfg(5), nonce_a);
        a1.handle_frame(hello.clone()).expect("hello");
        assert!(a1.try_accept_peer());
        d1.handle_frame(one(&mut a1)).expect("ack");
        let recorded_auth = one(&mut d1);
        let mut reused = Handshake::accept(&cfg(5), nonce_a);
        reused.handle_frame(hello).expect("replayed hello");
        assert!(reused.try_accept_peer());
        let _ = one(&mut reused);
        assert!(matches!(
            reused.handle_frame(recorded_auth),
            Ok(Some(HandshakeEvent::Authenticated(_)))
        ));
    }

    #[test]
    fn the_nonces_are_the_callers_and_the_frames_follow_from_the_inputs() {
        let (nonce_d, nonce_a) = ([1; NONCE_LEN], [2; NONCE_LEN]);
        let exchange = || {
            let mut d = Handshake::dial(&cfg(2), 5, nonce_d);
            let mut a = Handshake::accept(&cfg(5), nonce_a);
            let hello = one(&mut d);
            a.handle_frame(hello.clone()).expect("hello");
            assert!(a.try_accept_peer());
            let ack = one(&mut a);
            d.handle_frame(ack.clone()).expect("ack");
            let auth = one(&mut d);
            a.handle_frame(auth.clone()).expect("auth");
            assert!(a.admit());
            d.handle_frame(one(&mut a)).expect("ready");
            assert!(a.is_established() && d.is_established());
            (hello, ack, auth)
        };
        let (hello, ack, auth) = exchange();
        assert_eq!(exchange(), (hello.clone(), ack.clone(), auth.clone()));
        assert_eq!(
            decode_identity(&hello.payload),
            Ok((cfg(2).dvm_id.as_str(), nonce_d))
        );
        let (identity, mac_a) = ack.payload.split_at(ack.payload.len() - MAC_LEN);
        assert_eq!(decode_identity(identity).expect("identity").1, nonce_a);
        let key = &cfg(5).key;
        let id = &cfg(5).dvm_id;
        let want_a = transcript_mac(key, LABEL_ACK, id, 2, 5, &nonce_d, &nonce_a);
        assert_eq!(mac_a, &want_a.finalize().into_bytes()[..]);
        let want_d = transcript_mac(key, LABEL_DIAL, id, 2, 5, &nonce_a, &nonce_d);
        assert_eq!(&auth.payload[..], &want_d.finalize().into_bytes()[..]);
    }

    #[test]
    fn the_handshake_draws_no_randomness_and_reads_no_clock() {
        // Sans-IO: fresh nonces come from the caller (the driver), so the same inputs always
        // give the same frames.
        let src = include_str!("handshake.rs");
        let code = src.split("#[cfg(test)]").next().unwrap_or(src);
        for io in [
            "getrandom",
            "SystemTime",
            "Instant",
            "std::net",
            "std::thread",
        ] {
            assert!(!code.contains(io), "the handshake uses {io}");
        }
    }

    #[test]
    fn the_key_never_shows_in_debug_output() {
        let c = cfg(1);
        assert!(!format!("{c:?}").contains("test key"));
    }
}
