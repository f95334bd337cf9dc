//! The end-to-end check of stream bytes: every chunk carries a digest of its offset and bytes,
//! computed by the producer and checked by the consumer before the bytes are delivered, so a
//! relay or a link cannot corrupt, shift or splice data unnoticed; the `End` carries the sum
//! of the digests the producer sent, so a chunk lost or repeated without a gap in the offsets
//! is caught too. FNV-1a (64-bit): it detects accidents, not an adversary (the connections are
//! authenticated with the job key).

const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// The digest of the chunk `bytes` at stream offset `offset`.
pub fn chunk(offset: u64, bytes: &[u8]) -> u64 {
    let mut h = OFFSET_BASIS;
    for b in offset.to_be_bytes().iter().chain(bytes) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(PRIME);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offset_and_every_byte_count() {
        assert_ne!(chunk(0, b"abc"), chunk(1, b"abc"));
        assert_ne!(chunk(0, b"abc"), chunk(0, b"abd"));
        assert_eq!(chunk(5, b"xyz"), chunk(5, b"xyz"));
    }
}
