//! One daemon's committed data for one group: its keys and values, as one blob (the unit a
//! fence gathers and a direct-mode `get` fetches).
//!
//! Layout: `u32 count`, then `count` × (`u16 key length`, key bytes (UTF-8), `u32 value length`,
//! value bytes); keys strictly ascending, at most [`MODEX_KEY_MAX`] bytes each.
use crate::limits::MODEX_KEY_MAX;
use bytes::{BufMut, Bytes, BytesMut};
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

/// Keys and values, sorted by key.
pub type Entries = BTreeMap<String, Bytes>;

/// Bytes of `entries` as a blob.
pub fn encoded_len(entries: &Entries) -> usize {
    4 + entries
        .iter()
        .map(|(k, v)| 6 + k.len() + v.len())
        .sum::<usize>()
}

/// A daemon's puts for one group, with the length their blob will have kept as keys come: a
/// put costs a map insert, not a walk of every key put before (which made many puts
/// quadratic: 135 µs a put at 20,000 keys in an outside-in review).
#[derive(Debug, Default)]
pub struct Staged {
    entries: Entries,
    /// The entries' bytes in the blob (its length less the count's 4).
    entry_bytes: usize,
}

impl Staged {
    /// The blob's length once `key` holds a value of `value_len` bytes.
    pub fn len_with(&self, key: &str, value_len: usize) -> usize {
        let old = self.entries.get(key).map_or(0, |v| 6 + key.len() + v.len());
        4 + self.entry_bytes - old + 6 + key.len() + value_len
    }

    /// `key` holds `value` (a later put of the same key replaces it).
    pub fn insert(&mut self, key: String, value: Bytes) {
        self.entry_bytes = self.len_with(&key, value.len()) - 4;
        self.entries.insert(key, value);
    }

    /// Whether nothing was put.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The blob of what was put.
    pub fn encode(&self) -> Bytes {
        encode(&self.entries)
    }
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

/// A blob with the start of each of its entries, checked once: a lookup is then a binary
/// search, not a walk (a member's data may hold thousands of keys, one per endpoint, and a
/// job's wire-up gets each of them: a walk per get made that quadratic; outside-in review,
/// 20,000 keys a member: 0.3 ms a get). The index costs 4 bytes a key, at most two thirds of
/// the blob (an entry is at least 6 bytes).
#[derive(Debug, Clone)]
pub struct Indexed {
    blob: Bytes,
    /// Each entry's offset, or why the blob is malformed (it came from another daemon).
    starts: Result<Arc<[u32]>, &'static str>,
}

impl Indexed {
    /// Indexes `blob` (a blob that does not parse answers every lookup with the reason).
    pub fn new(blob: Bytes) -> Indexed {
        let starts = index(&blob).map(Arc::from);
        Indexed { blob, starts }
    }

    /// The blob itself.
    pub fn blob(&self) -> &Bytes {
        &self.blob
    }

    /// Bytes it holds: the blob and its index.
    pub fn bytes(&self) -> usize {
        self.blob.len() + self.starts.as_ref().map_or(0, |s| s.len() * 4)
    }

    /// The value of `key`, a slice of the blob (no copy); `Ok(None)` if the blob has no such
    /// key, or is empty (what a member that committed nothing contributes to a full fence);
    /// `Err` with the reason if the blob is malformed.
    pub fn lookup(&self, key: &str) -> Result<Option<Bytes>, &'static str> {
        let starts = self.starts.as_ref().map_err(|why| *why)?;
        let (mut lo, mut hi) = (0, starts.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let (k, v) = entry_at(&self.blob, starts.get(mid).copied().unwrap_or_default())
                .ok_or("a truncated blob")?;
            match self.blob.get(k).unwrap_or_default().cmp(key.as_bytes()) {
                std::cmp::Ordering::Equal => return Ok(Some(self.blob.slice(v))),
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
            }
        }
        Ok(None)
    }
}

/// The key's and the value's ranges of the entry at `start` (`None` past the blob's end).
fn entry_at(blob: &Bytes, start: u32) -> Option<(Range<usize>, Range<usize>)> {
    let at = start as usize;
    let klen = u16::from_be_bytes(blob.get(at..at + 2)?.try_into().ok()?) as usize;
    let k = at + 2..at + 2 + klen;
    let vlen = u32::from_be_bytes(blob.get(k.end..k.end + 4)?.try_into().ok()?) as usize;
    let v = k.end + 4..k.end + 4 + vlen;
    (v.end <= blob.len()).then_some((k, v))
}

/// The start of each entry of `blob`, checked: lengths within the blob, keys at most
/// [`MODEX_KEY_MAX`] bytes and strictly ascending, nothing after the last entry. An empty
/// blob has no entries.
fn index(blob: &Bytes) -> Result<Vec<u32>, &'static str> {
    if blob.is_empty() {
        return Ok(Vec::new());
    }
    if u32::try_from(blob.len()).is_err() {
        return Err("a blob above 4 GiB");
    }
    let mut at = 0usize;
    let take = |at: &mut usize, n: usize| -> Result<Range<usize>, &'static str> {
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
    // Each entry takes at least 6 bytes: a count beyond that is a lie, not an allocation.
    let mut starts = Vec::with_capacity((count as usize).min(blob.len() / 6));
    let mut last: Option<Range<usize>> = None;
    for _ in 0..count {
        starts.push(at as u32);
        let klen = u16::from_be_bytes(
            blob.get(take(&mut at, 2)?)
                .and_then(|s| s.try_into().ok())
                .ok_or("a truncated blob")?,
        ) as usize;
        if klen > MODEX_KEY_MAX {
            return Err("a key above MODEX_KEY_MAX");
        }
        let k = take(&mut at, klen)?;
        if last
            .as_ref()
            .is_some_and(|l| blob.get(k.clone()) <= blob.get(l.clone()))
        {
            return Err("keys not strictly ascending");
        }
        let vlen = u32::from_be_bytes(
            blob.get(take(&mut at, 4)?)
                .and_then(|s| s.try_into().ok())
                .ok_or("a truncated blob")?,
        ) as usize;
        take(&mut at, vlen)?;
        last = Some(k);
    }
    if at != blob.len() {
        return Err("bytes after the last entry");
    }
    Ok(starts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(blob: &Bytes, key: &str) -> Result<Option<Bytes>, &'static str> {
        Indexed::new(blob.clone()).lookup(key)
    }

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

    #[test]
    fn staged_puts_keep_the_blobs_length() {
        let mut st = Staged::default();
        assert_eq!(st.encode().len(), 4);
        for (k, v) in [("a", 3), ("bb", 0), ("a", 10), ("c", 7)] {
            let want = st.len_with(k, v);
            st.insert(k.to_string(), Bytes::from(vec![1u8; v]));
            assert_eq!(st.encode().len(), want, "after {k}={v}");
        }
        assert!(!st.is_empty());
    }

    #[test]
    fn many_keys_are_found_by_search_and_a_blob_out_of_order_is_refused() {
        let mut e = Entries::new();
        for i in 0..5_000u32 {
            e.insert(
                format!("ep.{:05}", i * 2),
                Bytes::from(i.to_be_bytes().to_vec()),
            );
        }
        let x = Indexed::new(encode(&e));
        assert_eq!(x.bytes(), x.blob().len() + 5_000 * 4);
        for i in 0..5_000u32 {
            let v = x.lookup(&format!("ep.{:05}", i * 2)).unwrap();
            assert_eq!(v, Some(Bytes::from(i.to_be_bytes().to_vec())));
            assert_eq!(x.lookup(&format!("ep.{:05}", i * 2 + 1)), Ok(None));
        }
        assert_eq!(x.lookup(""), Ok(None));
        assert_eq!(x.lookup("zz"), Ok(None));
        // Two entries, "b" before "a": every lookup says why, the present key included.
        let mut bad = BytesMut::new();
        bad.put_u32(2);
        for k in ["b", "a"] {
            bad.put_u16(1);
            bad.put_slice(k.as_bytes());
            bad.put_u32(0);
        }
        let bad = Indexed::new(bad.freeze());
        assert_eq!(bad.lookup("a"), Err("keys not strictly ascending"));
        // A count far beyond what the bytes hold allocates nothing and is refused.
        let lie = Indexed::new(Bytes::from_static(&[255, 255, 255, 255, 0, 0]));
        assert!(lie.lookup("a").is_err());
    }
}
