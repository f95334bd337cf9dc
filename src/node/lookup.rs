//! Contact lookups: a daemon that must dial a rank whose contact it lacks (a new neighbour
//! after a repair, a direct link, a reply to a stranger) asks rank 0, which keeps every
//! contact from wire-up. Sans-IO.
//!
//! Why rank 0 and not the nearest ancestor that knows: the lookups happen when the tree is
//! being repaired, which is when the path up is broken; rank 0 cannot fail, every daemon can
//! always dial it (its contact is the rendezvous), and a lookup is one round trip. One lookup
//! at a time per daemon, at most `CONTACT_LOOKUP_BATCH_MAX` ranks in it, retried after
//! `CONTACT_LOOKUP_TIMEOUT_MS`, given up after `CONTACT_LOOKUP_TRIES_MAX` tries.
//!
//! Request (`TAG_CONTACT_LOOKUP`, to rank 0): `u32 n` and `n` × `u32` ranks.
//! Reply (`TAG_CONTACT_REPLY`, to the asker): the contact entries of `wireup::put_entries`,
//! then `u32 n` and `n` × `u32` ranks rank 0 has no contact for (never reported, or failed).

use super::wireup::{WireupError, put_entries, take_entries, take_ranks};
use super::{Node, Output};
use crate::Rank;
use crate::limits;
use crate::oob::header::Kind;
use crate::oob::uri::ContactUri;
use crate::rml::Message;
use bytes::{BufMut, Bytes, BytesMut};
use std::time::{Duration, Instant};

/// Runtime tag: a contact lookup, sent to rank 0.
pub const TAG_CONTACT_LOOKUP: u32 = 16;
/// Runtime tag: rank 0's reply to a contact lookup.
pub const TAG_CONTACT_REPLY: u32 = 17;

/// Encodes a lookup of `ranks`.
pub fn encode_request(ranks: &[Rank]) -> Bytes {
    let mut b = BytesMut::with_capacity(4 + 4 * ranks.len());
    b.put_u32(ranks.len() as u32);
    for r in ranks {
        b.put_u32(*r);
    }
    b.freeze()
}

/// Decodes a lookup for a DVM of `size` daemons: at most `CONTACT_LOOKUP_BATCH_MAX` distinct
/// ranks, each below `size`.
pub fn decode_request(size: u32, mut payload: &[u8]) -> Result<Vec<Rank>, WireupError> {
    let ranks = take_ranks(&mut payload, size)?;
    if ranks.len() > limits::CONTACT_LOOKUP_BATCH_MAX {
        return Err(WireupError::TooMany {
            n: ranks.len() as u32,
            size,
        });
    }
    if !payload.is_empty() {
        return Err(WireupError::Trailing);
    }
    Ok(ranks)
}

/// Rank 0's answer to a lookup.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LookupReply {
    pub known: Vec<ContactUri>,
    pub unknown: Vec<Rank>,
}

impl LookupReply {
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(8 + 48 * self.known.len() + 4 * self.unknown.len());
        put_entries(&mut b, &self.known);
        b.put_u32(self.unknown.len() as u32);
        for r in &self.unknown {
            b.put_u32(*r);
        }
        b.freeze()
    }

    /// Decodes a reply for a DVM of `size` daemons.
    pub fn decode(size: u32, mut payload: &[u8]) -> Result<LookupReply, WireupError> {
        let known = take_entries(&mut payload, size)?;
        let unknown = take_ranks(&mut payload, size)?;
        if !payload.is_empty() {
            return Err(WireupError::Trailing);
        }
        Ok(LookupReply { known, unknown })
    }
}

impl Node {
    /// The driver must dial `r` and knows no address for it. The answer comes later (or at
    /// once) as [`Output::ContactKnown`] or [`Output::ContactUnknown`]; meanwhile keep what
    /// waits for `r` queued.
    pub fn want_contact(&mut self, now: Instant, r: Rank) {
        if self.contacts.get(r).is_some() {
            self.out.push_back(Output::ContactKnown(r));
            return;
        }
        if r >= self.size || r == self.me || self.me == 0 || self.routing.is_failed(r) {
            // Rank 0 owns every contact there is: what it lacks, nobody has.
            self.out.push_back(Output::ContactUnknown(r));
            return;
        }
        if self.contacts.want(r) {
            self.send_lookup(now);
        }
    }

    fn send_lookup(&mut self, now: Instant) {
        let deadline = now + Duration::from_millis(limits::CONTACT_LOOKUP_TIMEOUT_MS);
        if let Some(ranks) = self.contacts.next_lookup(deadline) {
            self.transmit_lookup(&ranks);
        }
    }

    fn transmit_lookup(&mut self, ranks: &[Rank]) {
        self.counters.contact_lookups += 1;
        log::debug!("rank {}: looking up the contacts of {ranks:?}", self.me);
        let payload = encode_request(ranks);
        // Straight to rank 0, not along the tree: see the module docs.
        let header = self.header(Kind::Msg, self.me, 0, TAG_CONTACT_LOOKUP, payload.len());
        self.transmit(0, header, payload, None);
    }

    /// The lookup in flight went unanswered: asked again, or given up.
    pub(super) fn lookup_timeout(&mut self, now: Instant) {
        let deadline = now + Duration::from_millis(limits::CONTACT_LOOKUP_TIMEOUT_MS);
        match self.contacts.retry(deadline) {
            Ok(ranks) if ranks.is_empty() => {}
            Ok(ranks) => self.transmit_lookup(&ranks),
            Err(ranks) => {
                log::warn!(
                    "rank {}: rank 0 did not answer {} contact lookups for {ranks:?}; \
                     treating them as unreachable",
                    self.me,
                    limits::CONTACT_LOOKUP_TRIES_MAX
                );
                for r in ranks {
                    self.out.push_back(Output::ContactUnknown(r));
                }
                self.send_lookup(now);
            }
        }
    }

    /// Rank 0: a lookup arrived; answered straight to the asker.
    pub(super) fn on_lookup_request(&mut self, msg: Message) {
        let ranks = match decode_request(self.size, &msg.payload) {
            Ok(r) => r,
            Err(e) => {
                log::warn!(
                    "rank 0: malformed contact lookup from rank {} dropped: {e}",
                    msg.origin
                );
                return;
            }
        };
        if msg.origin == 0 || self.routing.is_failed(msg.origin) {
            return;
        }
        let mut reply = LookupReply::default();
        for r in ranks {
            match self.contacts.get(r) {
                Some(u) if !self.routing.is_failed(r) => reply.known.push(u.clone()),
                _ => reply.unknown.push(r),
            }
        }
        let payload = reply.encode();
        let header = self.header(
            Kind::Msg,
            self.me,
            msg.origin,
            TAG_CONTACT_REPLY,
            payload.len(),
        );
        self.transmit(msg.origin, header, payload, None);
    }

    /// Rank 0's reply arrived: the contacts are cached, the driver told, the next lookup sent.
    pub(super) fn on_lookup_reply(&mut self, now: Instant, msg: Message) {
        if msg.origin != 0 {
            log::warn!(
                "rank {}: a contact lookup reply from rank {} (not rank 0) dropped",
                self.me,
                msg.origin
            );
            return;
        }
        let reply = match LookupReply::decode(self.size, &msg.payload) {
            Ok(r) => r,
            Err(e) => {
                log::warn!(
                    "rank {}: malformed contact lookup reply dropped: {e}",
                    self.me
                );
                return;
            }
        };
        let asked = self.contacts.answered();
        for u in reply.known {
            let r = u.rank;
            self.contacts.cache(u);
            self.out.push_back(Output::ContactKnown(r));
        }
        for r in reply.unknown {
            self.contacts.unwant(r);
            self.out.push_back(Output::ContactUnknown(r));
        }
        for r in asked {
            if self.contacts.get(r).is_none() && !self.routing.is_failed(r) {
                // Asked and left out of the reply (a reply to an earlier try): ask again.
                self.contacts.want(r);
            }
        }
        self.send_lookup(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::contacts::test_uri as uri;

    #[test]
    fn messages_round_trip_and_refuse_bad_input() {
        assert_eq!(decode_request(9, &encode_request(&[3, 8])), Ok(vec![3, 8]));
        assert!(decode_request(8, &encode_request(&[3, 8])).is_err());
        let too_many: Vec<Rank> = (0..limits::CONTACT_LOOKUP_BATCH_MAX as u32 + 1).collect();
        assert!(decode_request(100_000, &encode_request(&too_many)).is_err());
        let reply = LookupReply {
            known: vec![uri(4), uri(2)],
            unknown: vec![7],
        };
        let bytes = reply.encode();
        assert_eq!(LookupReply::decode(8, &bytes), Ok(reply));
        for cut in 0..bytes.len() {
            assert!(
                LookupReply::decode(8, &bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
    }
}
