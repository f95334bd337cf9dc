//! The data exchange's messages, carried by RELM (reliable, exactly once) with runtime tags
//! [`TAG_MODEX_REQUEST`] and [`TAG_MODEX_REPLY`].
//!
//! | message | layout |
//! |---|---|
//! | request | `u64 id`, group (`GroupId::encode_into`) |
//! | reply | `u64 id`, `u8 found`, `u32 len`, `len` bytes of blob (0 when not found) |
use crate::grpcomm::GroupId;
use crate::rml::Tag;
use bytes::{BufMut, Bytes, BytesMut};

/// Runtime tag: a direct-mode fetch of a rank's committed data for a group.
pub const TAG_MODEX_REQUEST: Tag = 18;
/// Runtime tag: the answer to a fetch.
pub const TAG_MODEX_REPLY: Tag = 19;

/// "Send me everything you committed for `group`", numbered by the requester.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub id: u64,
    pub group: GroupId,
}

/// The answer: the committed blob, or `None` if the owner committed nothing for the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub id: u64,
    pub blob: Option<Bytes>,
}

impl Request {
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(8 + self.group.encoded_len());
        b.put_u64(self.id);
        self.group.encode_into(&mut b);
        b.freeze()
    }

    /// Decodes a request for a DVM of `size` ranks; the reason if it is malformed.
    pub fn decode(size: u32, p: &[u8]) -> Result<Self, &'static str> {
        let id = p
            .get(..8)
            .and_then(|s| <[u8; 8]>::try_from(s).ok())
            .map(u64::from_be_bytes)
            .ok_or("a truncated request")?;
        let rest = p.get(8..).unwrap_or(&[]);
        let (group, took) = GroupId::decode_prefix(rest, size)?;
        if took != rest.len() {
            return Err("bytes after the request");
        }
        Ok(Request { id, group })
    }
}

impl Reply {
    pub fn encode(&self) -> Bytes {
        let blob = self.blob.clone().unwrap_or_default();
        let mut b = BytesMut::with_capacity(13 + blob.len());
        b.put_u64(self.id);
        b.put_u8(u8::from(self.blob.is_some()));
        // Blobs are bounded by ALLGATHER_MAX_BYTES, far below u32::MAX.
        b.put_u32(u32::try_from(blob.len()).unwrap_or(u32::MAX));
        b.put_slice(&blob);
        b.freeze()
    }

    /// Decodes a reply; the blob is a slice of `p` (no copy).
    pub fn decode(p: &Bytes) -> Result<Self, &'static str> {
        let bytes_at = |r: std::ops::Range<usize>| p.get(r).ok_or("a truncated reply");
        let id = u64::from_be_bytes(
            bytes_at(0..8)?
                .try_into()
                .map_err(|_| "a truncated reply")?,
        );
        let found = match bytes_at(8..9)? {
            [0] => false,
            [1] => true,
            _ => return Err("a bad found flag"),
        };
        let len = u32::from_be_bytes(
            bytes_at(9..13)?
                .try_into()
                .map_err(|_| "a truncated reply")?,
        );
        if p.len() != 13 + len as usize {
            return Err("a reply of the wrong length");
        }
        if !found && len != 0 {
            return Err("data in a not-found reply");
        }
        Ok(Reply {
            id,
            blob: found.then(|| p.slice(13..)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip_and_refuse_garbage() {
        let r = Request {
            id: 7,
            group: GroupId::new(3, [1, 2, 5]).unwrap(),
        };
        assert_eq!(Request::decode(6, &r.encode()), Ok(r.clone()));
        assert!(Request::decode(5, &r.encode()).is_err()); // rank 5 is not in a DVM of 5
        for cut in 0..r.encode().len() {
            assert!(Request::decode(6, &r.encode()[..cut]).is_err());
        }
        for reply in [
            Reply { id: 1, blob: None },
            Reply {
                id: 2,
                blob: Some(Bytes::from_static(b"blob")),
            },
        ] {
            let b = reply.encode();
            assert_eq!(Reply::decode(&b), Ok(reply));
            for cut in 0..b.len() {
                assert!(Reply::decode(&b.slice(..cut)).is_err());
            }
        }
    }
}
