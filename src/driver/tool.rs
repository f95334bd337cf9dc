//! An operator's tool: connects to one daemon with the operator credential, asks for the
//! status of its subtree (rank 0: the whole DVM), and reads the answer. Blocking, with
//! timeouts; it never becomes part of the DVM (`oob::handshake::TOOL_RANK`).

use crate::driver::key::Key;
use crate::limits;
use crate::oob::frame::{Frame, FrameDecoder};
use crate::oob::handshake::{
    Handshake, HandshakeConfig, HandshakeError, HandshakeEvent, JobKey, TOOL_RANK,
};
use crate::oob::header::{Header, Kind};
use crate::oob::uri::ContactUri;
use crate::status::wire::{Msg, Query};
use crate::status::{Report, StatusError, TAG_STATUS};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// How a status is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusOptions {
    /// How long the daemons may take to gather it (cut to `limits::STATUS_BUDGET_MS_MAX`). A
    /// subtree that does not answer within it is reported as `NoAnswer`.
    pub budget_ms: u32,
    /// Every daemon in detail, not only those on the way to a problem.
    pub all: bool,
    /// How long to wait for the connection and each handshake frame.
    pub connect_timeout: Duration,
}

impl Default for StatusOptions {
    fn default() -> Self {
        StatusOptions {
            budget_ms: limits::STATUS_BUDGET_MS_DEFAULT,
            all: false,
            connect_timeout: Duration::from_secs(5),
        }
    }
}

/// Asks the daemon at `contact` for the status of its subtree (give rank 0's contact for the
/// whole DVM), proving `credential`: the operator credential ([`Key::operator`]) of the DVM's
/// job key. `contact` is a daemon's contact URI parsed (`uri.parse::<ContactUri>()`, e.g. of
/// `Handle::contact_uri` or the text of rank 0's `--uri-file`). Blocks for at most
/// `connect_timeout` to connect and complete the handshake, then the budget (at most
/// `limits::STATUS_BUDGET_MS_MAX`) plus `connect_timeout` for the answer.
///
/// Errors: `Invalid` (a zero budget or connect timeout), `Unreachable` (no address answered,
/// or the handshake did not complete in time: a stopped daemon), `Credential` (the daemon
/// does not hold the key the credential derives from), `Refused` (the daemon is not wired up,
/// stopping, busy, or closed the connection during the handshake: its text says whether it
/// refused the tool's `Hello` (a contact naming another DVM or rank, or every tool slot
/// taken) or hung up after the credential was proved (too many tools, or stopping)), `TimedOut` (no answer in time), `ShutDown` (the
/// connection closed before the answer), `Protocol`.
pub fn query(
    contact: &ContactUri,
    credential: &Key,
    options: &StatusOptions,
) -> Result<Report, StatusError> {
    if options.connect_timeout.is_zero() {
        return Err(StatusError::Invalid("a zero connect timeout".into()));
    }
    if options.budget_ms == 0 {
        return Err(StatusError::Invalid("a zero budget".into()));
    }
    // One deadline for the connection and the handshake together.
    let handshake_deadline = Instant::now() + options.connect_timeout;
    let mut last = None;
    let mut stream = None;
    for addr in &contact.addrs {
        let left = handshake_deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            last = Some(format!("{addr}: no time left to connect"));
            break;
        }
        match TcpStream::connect_timeout(addr, left) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = Some(format!("{addr}: {e}")),
        }
    }
    let Some(mut stream) = stream else {
        return Err(StatusError::Unreachable(
            last.unwrap_or_else(|| "the contact has no address".into()),
        ));
    };
    let _ = stream.set_nodelay(true);
    let io = |e: std::io::Error| StatusError::Unreachable(e.to_string());
    stream
        .set_write_timeout(Some(options.connect_timeout))
        .map_err(io)?;
    let cfg = HandshakeConfig {
        me: TOOL_RANK,
        size: contact.rank.saturating_add(1),
        epoch: 0,
        dvm_id: contact.dvm_id.clone(),
        key: JobKey::new(credential.as_bytes().to_vec()),
    };
    let mut hs = Handshake::dial(&cfg, contact.rank, super::nonce::fresh());
    let mut decoder = FrameDecoder::new(limits::HANDSHAKE_MAX_PAYLOAD);
    loop {
        while let Some((h, p)) = hs.poll_transmit() {
            write_frame(&mut stream, &h, &p).map_err(io)?;
        }
        // Which step the daemon hung up at tells the causes apart: a refused `Hello` (another
        // DVM, another rank, every tool slot taken) or a proof beyond the last tool slot.
        let proved = hs.has_sent_proof();
        let frame =
            read_frame(&mut stream, &mut decoder, handshake_deadline).map_err(|e| match e {
                ReadError::Closed if proved => StatusError::Refused(format!(
                    "the daemon closed the connection once the credential was proved: too many \
                     operator tools connected (at most {}; try again), or it is stopping",
                    limits::TOOL_CONNECTIONS_MAX
                )),
                ReadError::Closed => StatusError::Refused(format!(
                    "the daemon refused this tool's Hello: the contact names DVM {:?} and rank \
                     {}, and the daemon at that address is of another DVM or rank (a stale URI \
                     file?), or too many operator tools are connected (try again)",
                    contact.dvm_id, contact.rank
                )),
                ReadError::TimedOut => StatusError::Unreachable(
                    "the daemon did not complete the handshake in time (stopped or overloaded?)"
                        .into(),
                ),
                other => other.into(),
            })?;
        match hs.handle_frame(frame) {
            Ok(Some(HandshakeEvent::Established(_))) => break,
            Ok(_) => {}
            Err(HandshakeError::BadKey) => {
                return Err(StatusError::Credential(
                    "the daemon does not hold the key this credential derives from (a wrong \
                     credential, or the job key given where the operator credential is due)"
                        .into(),
                ));
            }
            Err(e) => return Err(StatusError::Protocol(format!("handshake: {e}"))),
        }
    }
    decoder.set_max_payload(u32::try_from(limits::MSG_MAX_BYTES_DEFAULT).unwrap_or(u32::MAX));
    let budget_ms = options.budget_ms.min(limits::STATUS_BUDGET_MS_MAX);
    let query = Msg::Query(Query {
        id: 1,
        budget_ms,
        all: options.all,
        epoch: 0,
        failed: 0,
        sent_ns: None,
    })
    .encode();
    let header = Header {
        kind: Kind::Msg,
        origin: TOOL_RANK,
        dst: contact.rank,
        tag: TAG_STATUS,
        epoch: 0,
        seq: 0,
        len: query.len() as u32,
        lives: 0,
    };
    write_frame(&mut stream, &header, &query).map_err(io)?;
    let deadline =
        Instant::now() + Duration::from_millis(u64::from(budget_ms)) + options.connect_timeout;
    let frame = read_frame(&mut stream, &mut decoder, deadline).map_err(|e| match e {
        ReadError::Closed => StatusError::ShutDown,
        other => other.into(),
    })?;
    if frame.header.kind != Kind::Msg || frame.header.tag != TAG_STATUS {
        return Err(StatusError::Protocol(format!(
            "a {:?} frame with tag {} instead of a status",
            frame.header.kind, frame.header.tag
        )));
    }
    match Msg::decode(&frame.payload, u32::MAX) {
        Ok(Msg::Report(r)) => Ok(r),
        Ok(Msg::Refused(why)) => Err(StatusError::Refused(why)),
        Ok(_) => Err(StatusError::Protocol(
            "an answer that is not a report".into(),
        )),
        Err(e) => Err(StatusError::Protocol(e.to_string())),
    }
}

fn write_frame(stream: &mut TcpStream, h: &Header, payload: &[u8]) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(crate::oob::header::HEADER_LEN + payload.len());
    buf.extend_from_slice(&h.encode());
    buf.extend_from_slice(payload);
    stream.write_all(&buf)
}

enum ReadError {
    Closed,
    TimedOut,
    Io(std::io::Error),
    Wire(String),
}

impl From<ReadError> for StatusError {
    fn from(e: ReadError) -> StatusError {
        match e {
            ReadError::Closed => StatusError::ShutDown,
            ReadError::TimedOut => StatusError::TimedOut,
            ReadError::Io(e) => StatusError::Unreachable(e.to_string()),
            ReadError::Wire(e) => StatusError::Protocol(e),
        }
    }
}

/// Reads until one whole frame is decoded, or `deadline`.
fn read_frame(
    stream: &mut TcpStream,
    decoder: &mut FrameDecoder,
    deadline: Instant,
) -> Result<Frame, ReadError> {
    loop {
        match decoder.next_frame() {
            Ok(Some(f)) => return Ok(f),
            Ok(None) => {}
            Err(e) => return Err(ReadError::Wire(e.to_string())),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ReadError::TimedOut);
        }
        stream.set_read_timeout(Some(left)).map_err(ReadError::Io)?;
        let space = decoder.read_space();
        match stream.read(space) {
            Ok(0) => return Err(ReadError::Closed),
            Ok(n) => decoder.commit(n),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(ReadError::TimedOut);
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return Err(ReadError::Closed),
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
}
