//! The direct-link control messages: plain runtime messages with tag [`TAG_DIRECT`]. Most go
//! over the tree (never over the link they negotiate: `Grant` and `Switch` are the drain
//! markers of the tree route); `Close` and `CloseAck`, which end a link, go on the link itself,
//! as the last frame each end writes on it. Layout (big-endian): one kind byte, then the
//! kind's fields.
//!
//! | kind | message | fields |
//! |---|---|---|
//! | 1 | `Request` | version (u8), the requester's DVM epoch (u64), its contact URI (u16 length, UTF-8), the request's number (u32, the requester's) |
//! | 2 | `Grant` | the link's id (u32, the grantor's, never 0), the number of the request it answers (u32) |
//! | 3 | `Deny` | reason (u8, [`DenyReason`]) |
//! | 4 | `Switch` | link id |
//! | 5 | `Withdraw` | link id (0: whatever grant answers my request) |
//! | 6 | `Close` (on the link) | link id |
//! | 7 | `CloseAck` (on the link) | link id |
//! | 8 | `Shut` | link id |
//! | 9 | `Ready` | link id |
//! | 10 | `AskShut` | link id |
//!
//! The link id tells one link between two daemons from the next: a `Close` written on the
//! connection for a link that ended, read once a new link uses the same connection, names the
//! old id and is ignored. The request's number tells one request from the next: a `Grant`
//! that answers a request the requester gave up (it timed out) is withdrawn, even when a new
//! request to the same daemon waits.
//!
//! Version 4 (this one) made the grantor wait for `Switch` before it writes on the link, with
//! `Ready` as its drain marker; in version 3 the grantor wrote right after `Grant`, so a
//! requester that had given up the request read those frames ahead of older tree messages.
//! A version-3 request (no number) still decodes, and is denied `Version`.
use crate::rml::Tag;

/// The runtime tag of every direct-link control message.
pub const TAG_DIRECT: Tag = 13;

/// The version of the direct-link negotiation; a request with another one is denied.
pub const DIRECT_VERSION: u8 = 4;

/// Longest contact URI a request may carry.
const URI_MAX_BYTES: usize = 1024;

/// Why a request was denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DenyReason {
    /// The grantor's `route` setting is `tree`.
    Policy = 1,
    /// The requester speaks another negotiation version.
    Version = 2,
    /// The grantor has no room under its `direct_links_max`.
    Full = 3,
    /// The two daemons disagree on the DVM epoch (a repair is under way): ask again later.
    Epoch = 4,
    /// The two are tree neighbours: the tree already links them directly.
    Neighbour = 5,
    /// Both asked at once and the other's request won: not a refusal (never cached).
    Crossed = 6,
    /// The grantor is stopping.
    Stopping = 7,
    /// Only at the requester: the peer died or is known dead.
    PeerDead = 8,
    /// Only at the requester: no answer within `direct_request_ms`.
    Timeout = 9,
    /// Only locally, never sent: the direct connection could not be made within the
    /// reconnect attempts (the peer may well live: the tree decides that).
    Unreachable = 10,
}

impl DenyReason {
    fn from_wire(v: u8) -> Option<DenyReason> {
        use DenyReason::*;
        [
            Policy, Version, Full, Epoch, Neighbour, Crossed, Stopping, PeerDead, Timeout,
        ]
        .into_iter()
        .find(|r| *r as u8 == v)
    }

    /// A short name (counters, logs).
    pub fn name(self) -> &'static str {
        match self {
            DenyReason::Policy => "policy",
            DenyReason::Version => "version",
            DenyReason::Full => "full",
            DenyReason::Epoch => "epoch",
            DenyReason::Neighbour => "neighbour",
            DenyReason::Crossed => "crossed",
            DenyReason::Stopping => "stopping",
            DenyReason::PeerDead => "peer dead",
            DenyReason::Timeout => "timeout",
            DenyReason::Unreachable => "unreachable",
        }
    }
}

/// One control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirectMsg {
    /// Asks the destination for a direct link.
    Request {
        version: u8,
        epoch: u64,
        /// The requester's contact URI, as text ("" if it has none to give).
        uri: String,
        /// The request's number (the requester's count; 0 from a version-3 requester).
        ask: u32,
    },
    /// The request numbered `ask` is granted as link `id`. The grantor's messages still take
    /// the tree: it waits for `Switch`.
    Grant { id: u32, ask: u32 },
    /// The request is denied.
    Deny(DenyReason),
    /// The requester's answer to a grant: its messages now take the link (its drain marker).
    Switch(u32),
    /// The grantor's answer to `Switch`: its messages now take the link (its drain marker).
    Ready(u32),
    /// This end gave the link up (a request that timed out, a grant never switched to, a
    /// connection it could not make): the other end stops using it too.
    Withdraw(u32),
    /// On the link, the last frame its sender writes there: it evicts the link, and its
    /// messages to the other end wait until the other has read everything it sent on it.
    Close(u32),
    /// On the link, the answer to `Close` and the last frame its sender writes there: it has
    /// read everything the evicting end sent on the link; its own messages wait for `Shut`.
    CloseAck(u32),
    /// Over the tree, from the evicting end once it read `CloseAck`: it has read everything
    /// the other end sent on the link, whose messages may take the tree now.
    Shut(u32),
    /// Over the tree, from the end that answered `Close`, when `Shut` is late (it may have
    /// been lost): the evicting end answers `Shut` again once it has read `CloseAck`.
    AskShut(u32),
}

impl DirectMsg {
    /// The payload.
    pub fn encode(&self) -> bytes::Bytes {
        let mut b = Vec::with_capacity(16);
        match self {
            DirectMsg::Request {
                version,
                epoch,
                uri,
                ask,
            } => {
                b.push(1);
                b.push(*version);
                b.extend_from_slice(&epoch.to_be_bytes());
                let uri = uri.as_bytes();
                let n = uri.len().min(URI_MAX_BYTES);
                b.extend_from_slice(&(n as u16).to_be_bytes());
                b.extend_from_slice(uri.get(..n).unwrap_or_default());
                b.extend_from_slice(&ask.to_be_bytes());
            }
            DirectMsg::Grant { id, ask } => {
                b.push(2);
                b.extend_from_slice(&id.to_be_bytes());
                b.extend_from_slice(&ask.to_be_bytes());
            }
            DirectMsg::Deny(r) => {
                b.push(3);
                b.push(*r as u8);
            }
            DirectMsg::Switch(l) | DirectMsg::Withdraw(l) | DirectMsg::Close(l) => {
                b.push(match self {
                    DirectMsg::Switch(_) => 4,
                    DirectMsg::Withdraw(_) => 5,
                    _ => 6,
                });
                b.extend_from_slice(&l.to_be_bytes());
            }
            DirectMsg::CloseAck(l)
            | DirectMsg::Shut(l)
            | DirectMsg::Ready(l)
            | DirectMsg::AskShut(l) => {
                b.push(match self {
                    DirectMsg::CloseAck(_) => 7,
                    DirectMsg::Shut(_) => 8,
                    DirectMsg::Ready(_) => 9,
                    _ => 10,
                });
                b.extend_from_slice(&l.to_be_bytes());
            }
        }
        b.into()
    }

    /// Decodes a payload; the error says what is wrong with it.
    pub fn decode(p: &[u8]) -> Result<DirectMsg, String> {
        let (&kind, rest) = p.split_first().ok_or("empty direct-link message")?;
        let exact = |n: usize| {
            if rest.len() == n {
                Ok(())
            } else {
                Err(format!(
                    "direct-link message kind {kind}: {} bytes, expected {n}",
                    rest.len()
                ))
            }
        };
        let link = || {
            exact(4)?;
            rest.first_chunk::<4>()
                .map(|b| u32::from_be_bytes(*b))
                .ok_or_else(|| "no link id".to_string())
        };
        match kind {
            1 => {
                let (&version, rest) = rest.split_first().ok_or("request without a version")?;
                let (epoch, rest) = rest
                    .split_first_chunk::<8>()
                    .ok_or("request without an epoch")?;
                let (len, rest) = rest
                    .split_first_chunk::<2>()
                    .ok_or("request without a URI length")?;
                let len = u16::from_be_bytes(*len) as usize;
                // Version 3 ended with the URI; version 4 adds the request's number.
                let (uri, ask) = match rest.split_at_checked(len) {
                    Some((uri, [])) if len <= URI_MAX_BYTES => (uri, 0),
                    Some((uri, ask)) if len <= URI_MAX_BYTES && ask.len() == 4 => (
                        uri,
                        ask.first_chunk::<4>().map_or(0, |b| u32::from_be_bytes(*b)),
                    ),
                    _ => {
                        return Err(format!(
                            "request URI of {len} bytes in {} bytes",
                            rest.len()
                        ));
                    }
                };
                let uri = std::str::from_utf8(uri)
                    .map_err(|_| "request URI is not UTF-8")?
                    .to_string();
                Ok(DirectMsg::Request {
                    version,
                    epoch: u64::from_be_bytes(*epoch),
                    uri,
                    ask,
                })
            }
            2 => {
                exact(8)?;
                let (id, ask) = rest
                    .split_first_chunk::<4>()
                    .and_then(|(id, ask)| Some((*id, *ask.first_chunk::<4>()?)))
                    .ok_or("a grant without its ids")?;
                Ok(DirectMsg::Grant {
                    id: u32::from_be_bytes(id),
                    ask: u32::from_be_bytes(ask),
                })
            }
            3 => {
                exact(1)?;
                let r = rest.first().copied().unwrap_or(0);
                DenyReason::from_wire(r)
                    .map(DirectMsg::Deny)
                    .ok_or_else(|| format!("unknown denial reason {r}"))
            }
            4 => link().map(DirectMsg::Switch),
            5 => link().map(DirectMsg::Withdraw),
            6 => link().map(DirectMsg::Close),
            7 => link().map(DirectMsg::CloseAck),
            8 => link().map(DirectMsg::Shut),
            9 => link().map(DirectMsg::Ready),
            10 => link().map(DirectMsg::AskShut),
            k => Err(format!("unknown direct-link message kind {k}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_round_trips() {
        let all = [
            DirectMsg::Request {
                version: DIRECT_VERSION,
                epoch: 7,
                uri: "tbon.3;tcp://127.0.0.1:4000".into(),
                ask: 3,
            },
            DirectMsg::Request {
                version: 9,
                epoch: 0,
                uri: String::new(),
                ask: u32::MAX,
            },
            DirectMsg::Grant { id: 7, ask: 2 },
            DirectMsg::Ready(7),
            DirectMsg::AskShut(7),
            DirectMsg::Deny(DenyReason::Full),
            DirectMsg::Deny(DenyReason::Crossed),
            DirectMsg::Switch(7),
            DirectMsg::Withdraw(0),
            DirectMsg::Close(u32::MAX),
            DirectMsg::CloseAck(1),
            DirectMsg::Shut(2),
        ];
        for m in all {
            assert_eq!(DirectMsg::decode(&m.encode()), Ok(m));
        }
    }

    #[test]
    fn a_version_3_request_decodes_for_its_denial() {
        let mut p = vec![1, 3];
        p.extend_from_slice(&5u64.to_be_bytes());
        p.extend_from_slice(&[0, 1, b'u']);
        assert_eq!(
            DirectMsg::decode(&p),
            Ok(DirectMsg::Request {
                version: 3,
                epoch: 5,
                uri: "u".into(),
                ask: 0
            })
        );
    }

    #[test]
    fn malformed_messages_are_errors() {
        for bad in [
            &[][..],
            &[0],
            &[2, 0],
            &[2, 0, 0, 0, 1],
            &[9, 0, 0],
            &[1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, b'a', 0, 0],
            &[3],
            &[3, 0],
            &[3, 200],
            &[1, 1, 0, 0],
            &[1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, b'a'],
            &[1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff],
            &[99],
        ] {
            assert!(DirectMsg::decode(bad).is_err(), "{bad:?}");
        }
    }
}
