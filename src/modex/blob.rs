//! One daemon's committed data for one group: its keys and values, as one blob (the unit a
//! fence gathers and a direct-mode `get` fetches).
//!
//! Layout: `u32 count`, then `count` × (`u16 key length`, key bytes (UTF-8), `u32 value length`,
//! value bytes); keys strictly ascending, at most [`MODEX_KEY_MAX`] bytes each.
use crate::limits::MODEX_KEY_MAX;
use bytes::{BufMut, Bytes, BytesMut};
use std::collections::BTreeMap;

/// Keys and values, sorted by key.
pub type Entries = BTreeMap<String, Bytes>;

/// Bytes of `entries` as a blob.
pub fn encoded_len(entries: &Entries) -> usize {
    4 + entries
        .iter()
        .map(|(k, v)| 6 + k.len() + v.len())
        .sum::<usize>()
}

/// The blob of `entries`. Keys must be at most [`MODEX_KEY_MAX`] bytes (checked at `put`).
pub fn encode(entries: &Entries) -> Bytes {
    let mut b = BytesMut::with_capacity(encoded_len(entries));
    // At most as many keys as fit in ALLGATHER_MAX_BYTES: far below u32::MAX.
    b.put_u32(u32::try_from(entries.len()).unwrap_or(u32::MAX));
    for (k, v) in entries {
        b.put_u16(u16::try_from(k.len()).unwrap_or(u16::MAX));
        b.put_slice(k.as_bytes());
        b.put_u32(u32::try_from(v.len()).unwrap_or(u32::MAX));
        b.put_slice(v);
    }
    b.freeze()
}

/// The value of `key` in `blob`, a slice of it (no copy); `Ok(None)` if the blob has no such
/// key, or is empty (what a member that committed nothing contributes to a full fence);
/// `Err` with the reason if the blob is malformed (it came from another daemon).
pub fn lookup(blob: &Bytes, key: &str) -> Result<Option<Bytes>, &'static str> {
    if blob.is_empty() {
        return Ok(None);
    }
    let mut at = 0usize;
    let take = |at: &mut usize, n: usize| -> Result<std::ops::Range<usize>, &'static str> {
        let end = at
            .checked_add(n)
            .filter(|e| *e <= blob.len())
            .ok_or("a truncated blob")?;
        let r = *at..end;
        *at = end;
        Ok(r)
    };
    let count = u32::from_be_bytes(
        blob.get(take(&mut at, 4)?)
            .and_then(|s| s.try_into().ok())
            .ok_or("a truncated blob")?,
    );
    let mut last: Option<Bytes> = None;
    for _ in 0..count {
        let klen = u16::from_be_bytes(
            blob.get(take(&mut at, 2)?)
                .and_then(|s| s.try_into().ok())
                .ok_or("a truncated blob")?,
        ) as usize;
        if klen > MODEX_KEY_MAX {
            return Err("a key above MODEX_KEY_MAX");
        }
        let k = blob.slice(take(&mut at, klen)?);
        if last.as_ref().is_some_and(|l| k <= *l) {
            return Err("keys not strictly ascending");
        }
        let vlen = u32::from_be_bytes(
            blob.get(take(&mut at, 4)?)
                .and_then(|s| s.try_into().ok())
                .ok_or("a truncated blob")?,
        ) as usize;
        let v = take(&mut at, vlen)?;
        if k == key.as_bytes() {
            return Ok(Some(blob.slice(v)));
        }
        last = Some(k);
    }
    if at != blob.len() {
        return Err("bytes after the last entry");
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_find_every_key_and_refuse_malformed_blobs() {
        let mut e = Entries::new();
        e.insert("ep".into(), Bytes::from_static(b"10.0.0.1:5000"));
        e.insert("a".into(), Bytes::new());
        e.insert("z".into(), Bytes::from(vec![7u8; 1000]));
        let blob = encode(&e);
        assert_eq!(blob.len(), encoded_len(&e));
        for (k, v) in &e {
            assert_eq!(lookup(&blob, k), Ok(Some(v.clone())));
        }
        assert_eq!(lookup(&blob, "missing"), Ok(None));
        assert_eq!(lookup(&encode(&Entries::new()), "a"), Ok(None));
        // A member that committed nothing fences an empty blob: no keys, not malformed.
        assert_eq!(lookup(&Bytes::new(), "a"), Ok(None));
        for cut in 1..blob.len() {
            // A cut blob never yields a value for a key beyond the cut, and never panics.
            let _ = lookup(&blob.slice(..cut), "z");
            assert!(lookup(&blob.slice(..cut), "missing").is_err());
        }
    }
}
