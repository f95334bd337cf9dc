//! A small multiplicative hasher (the rustc "Fx" hash) for maps into which only this daemon
//! inserts: the loop's links (ranks of its own neighbours, bounded by the DVM size), receive ids
//! it numbered, slab tokens, and the matcher's posted receives (posted by the local
//! application; a peer can only look keys up, which cannot build a collision flood). SipHash's
//! flood resistance buys nothing there and cost a third of the receive path (callgrind).
//!
//! RELM's tables (records by (origin, uid), chains, acknowledgements due, link state) and the
//! heartbeat monitor's last-heard times also use it: their keys come from frames of
//! authenticated daemons only (a connection carries nothing else before its handshake proved
//! the job key), and a daemon holding the key is trusted by the threat model; SipHash there
//! cost a tenth of a reliable sender's loop (`perf`, 64 B reliable stream). Maps keyed by what
//! an unauthenticated peer sends (pending handshakes by source address) and the matcher's
//! held-per-tag counts keep the standard hasher.

use std::hash::{BuildHasherDefault, Hasher};

#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher(u64);

const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    fn add(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(K);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            for (d, s) in b.iter_mut().zip(chunk) {
                *d = *s;
            }
            self.add(u64::from_le_bytes(b));
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.add(u64::from(v));
    }
    fn write_u64(&mut self, v: u64) {
        self.add(v);
    }
    fn write_usize(&mut self, v: usize) {
        self.add(v as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

pub(crate) type FxBuild = BuildHasherDefault<FxHasher>;
pub(crate) type FxHashMap<K, V> = std::collections::HashMap<K, V, FxBuild>;
pub(crate) type FxHashSet<K> = std::collections::HashSet<K, FxBuild>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_small_keys_hash_apart() {
        let mut m: FxHashMap<u32, u32> = FxHashMap::default();
        for r in 0..10_000 {
            m.insert(r, r * 2);
        }
        assert!((0..10_000).all(|r| m.get(&r) == Some(&(r * 2))));
    }
}
