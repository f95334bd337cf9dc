//! A frame as the simulated links carry it: the 40 header bytes apart from the payload, so
//! that a payload a daemon relays unchanged (a broadcast's body, an allgather's result behind
//! the same op header) is one shared buffer at every hop instead of a copy per hop. A real
//! daemon copies every frame out of its socket; at 100,000 simulated daemons those copies of
//! one allgather result were most of the simulator's memory (issue "Operating a live DVM").

use crate::oob::header::{HEADER_LEN, Header};
use crate::oob::send_queue::Payload;
use bytes::{BufMut, Bytes, BytesMut};
use std::collections::VecDeque;

/// Payloads shorter than this are copied: sharing them saves nothing worth the search.
const SHARE_MIN_BYTES: usize = 1024;
/// How many recent large payloads a daemon remembers for sharing (a relay forwards what it
/// received within the same input, so a few suffice).
const SHARE_RECENT_MAX: usize = 8;

/// One encoded frame: header bytes and payload.
#[derive(Debug, Clone)]
pub struct Frame {
    header: [u8; HEADER_LEN],
    payload: Bytes,
}

impl Frame {
    /// A frame of `header` (encoded here) and `payload`; the caller makes `header.len` match.
    pub fn new(header: &Header, payload: Bytes) -> Self {
        Frame {
            header: header.encode(),
            payload,
        }
    }

    /// A frame of raw header bytes, which may not decode.
    #[cfg(test)]
    pub fn raw(header: [u8; HEADER_LEN], payload: Bytes) -> Self {
        Frame { header, payload }
    }

    /// Bytes on the wire: header and payload.
    pub fn wire_len(&self) -> usize {
        HEADER_LEN + self.payload.len()
    }

    /// The payload, shared (no copy).
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// The header, checked against the payload's length.
    pub fn decode(&self) -> Result<Header, String> {
        let h = Header::decode(&self.header).map_err(|e| e.to_string())?;
        if h.len as usize != self.payload.len() {
            return Err(format!(
                "header says {} payload bytes, the frame has {}",
                h.len,
                self.payload.len()
            ));
        }
        Ok(h)
    }

    /// The same payload behind another header.
    pub fn with_header(&self, h: &Header) -> Frame {
        Frame::new(h, self.payload.clone())
    }
}

/// One daemon's recent large payloads, received or built, which the payloads it sends next
/// may lie inside.
#[derive(Debug, Default)]
pub struct Sharing {
    recent: VecDeque<Bytes>,
}

impl Sharing {
    /// Remembers a payload that arrived, if it is large enough to share.
    pub fn received(&mut self, payload: &Bytes) {
        if payload.len() >= SHARE_MIN_BYTES {
            self.remember(payload.clone());
        }
    }

    /// The node's two-part payload as one buffer: a slice of a remembered buffer that holds
    /// `head` immediately followed by `body` (the body was sliced from it and the head is
    /// unchanged), else a new buffer, remembered when large.
    pub fn payload(&mut self, p: &Payload) -> Bytes {
        let (head, body) = (p.head(), p.body());
        if body.is_empty() {
            return head.clone();
        }
        if head.is_empty() {
            return body.clone();
        }
        if body.len() < SHARE_MIN_BYTES {
            return concat(head, body);
        }
        if let Some(b) = self
            .recent
            .iter()
            .find_map(|buf| enclosing(buf, head, body))
        {
            return b;
        }
        let b = concat(head, body);
        self.remember(b.clone());
        b
    }

    fn remember(&mut self, b: Bytes) {
        if self.recent.len() >= SHARE_RECENT_MAX {
            self.recent.pop_front();
        }
        self.recent.push_back(b);
    }
}

fn concat(head: &[u8], body: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(head.len() + body.len());
    b.put_slice(head);
    b.put_slice(body);
    b.freeze()
}

/// `head` then `body` as a slice of `buf`, if `body` lies inside `buf` right behind bytes
/// equal to `head`. Comparing addresses is sound here: `buf` and `body` are both alive, so a
/// `body` whose range falls inside `buf`'s is a view of that same allocation.
fn enclosing(buf: &Bytes, head: &[u8], body: &Bytes) -> Option<Bytes> {
    let base = buf.as_ptr() as usize;
    let off = (body.as_ptr() as usize).checked_sub(base)?;
    let end = off.checked_add(body.len())?;
    if end > buf.len() {
        return None;
    }
    let start = off.checked_sub(head.len())?;
    (buf.get(start..off)? == head).then(|| buf.slice(start..end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relayed_body_behind_the_same_head_is_shared() {
        let head = Bytes::from_static(b"op-header");
        let body: Bytes = (0..4096u32).map(|i| i as u8).collect();
        let mut first = Sharing::default();
        let sent = first.payload(&Payload::two(head.clone(), body.clone()));
        assert_eq!(&sent[..head.len()], &head[..]);
        assert_eq!(&sent[head.len()..], &body[..]);

        // The next hop decodes the body as a slice of what it received and relays it.
        let mut relay = Sharing::default();
        relay.received(&sent);
        let slice = sent.slice(head.len()..);
        let again = relay.payload(&Payload::two(head.clone(), slice.clone()));
        assert_eq!(again.as_ptr(), sent.as_ptr(), "no copy");
        assert_eq!(again, sent);

        // Another head in front of the same body is a new buffer.
        let other = relay.payload(&Payload::two(Bytes::from_static(b"op-HEADER"), slice));
        assert_ne!(other.as_ptr(), sent.as_ptr());
        assert_eq!(&other[..9], b"op-HEADER");
        assert_eq!(&other[9..], &body[..]);
    }

    #[test]
    fn a_body_outside_any_remembered_buffer_is_copied() {
        let mut s = Sharing::default();
        let big: Bytes = vec![7u8; 2048].into();
        s.received(&big);
        let body: Bytes = vec![7u8; 2048].into();
        let p = s.payload(&Payload::two(Bytes::from_static(b"h"), body));
        assert_eq!(p.len(), 2049);
        assert_ne!(p.as_ptr(), big.as_ptr());
    }

    #[test]
    fn decode_checks_the_length() {
        let h = Header {
            kind: crate::oob::Kind::Msg,
            origin: 1,
            dst: 2,
            tag: 9,
            epoch: 1,
            seq: 0,
            len: 3,
            lives: 0,
        };
        assert_eq!(Frame::new(&h, Bytes::from_static(b"abc")).decode(), Ok(h));
        let short = Frame::new(&h, Bytes::from_static(b"ab")).decode();
        assert!(short.is_err_and(|e| e.contains("header says 3")));
        assert!(Frame::raw([0; HEADER_LEN], Bytes::new()).decode().is_err());
    }
}
