//! The end-to-end check of stream bytes: every chunk carries a digest of its offset and bytes,
//! computed by the producer and checked by the consumer before the bytes are delivered, so a
//! relay or a link cannot corrupt, shift or splice data unnoticed; the `End` carries the sum
//! of the digests the producer sent, so a chunk lost or repeated without a gap in the offsets
//! is caught too.
//!
//! The chunk digest is XXH3 (64-bit) of the chunk's bytes seeded with its offset: it detects
//! accidents, not an adversary (the connections are authenticated with the job key). A stream
//! pays it at both ends for every byte, so its speed bounds a stream's: XXH3 ran at twice
//! XXH64's speed here (256 KiB chunks), which had taken a fifth of the producer's and of the
//! consumer's processor time in a stream over a direct link (`perf`). Its code is picked at
//! run time (AVX2 where the processor has it: 17-23 GB/s on this machine against 11.5 with
//! the SSE2 code a build for x86-64 gets otherwise). The producer's writer makes each chunk's
//! digest on its own thread ([`ChunkDigest`]), not the daemon's loop. XXH64 stays for small
//! inputs that must not change on the wire (the group members' identity digest).

const P1: u64 = 0x9E37_79B1_85EB_CA87;
const P2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const P3: u64 = 0x1656_67B1_9E37_79F9;
const P4: u64 = 0x85EB_CA77_C2B2_AE63;
const P5: u64 = 0x27D4_EB2F_1656_67C5;

fn word(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(b.get(..8).unwrap_or(&[0; 8]));
    u64::from_le_bytes(w)
}

fn half(b: &[u8]) -> u64 {
    let mut w = [0u8; 4];
    w.copy_from_slice(b.get(..4).unwrap_or(&[0; 4]));
    u64::from(u32::from_le_bytes(w))
}

fn round(acc: u64, input: u64) -> u64 {
    acc.wrapping_add(input.wrapping_mul(P2))
        .rotate_left(31)
        .wrapping_mul(P1)
}

fn merge(acc: u64, lane: u64) -> u64 {
    (acc ^ round(0, lane)).wrapping_mul(P1).wrapping_add(P4)
}

/// XXH64 of `bytes` with `seed`.
pub fn xxh64(bytes: &[u8], seed: u64) -> u64 {
    let len = bytes.len() as u64;
    let mut stripes = bytes.chunks_exact(32);
    let mut h = if bytes.len() >= 32 {
        let mut v = [
            seed.wrapping_add(P1).wrapping_add(P2),
            seed.wrapping_add(P2),
            seed,
            seed.wrapping_sub(P1),
        ];
        for s in stripes.by_ref() {
            for (i, lane) in v.iter_mut().enumerate() {
                *lane = round(*lane, word(s.get(i * 8..).unwrap_or_default()));
            }
        }
        let mut h = v[0]
            .rotate_left(1)
            .wrapping_add(v[1].rotate_left(7))
            .wrapping_add(v[2].rotate_left(12))
            .wrapping_add(v[3].rotate_left(18));
        for lane in v {
            h = merge(h, lane);
        }
        h
    } else {
        seed.wrapping_add(P5)
    };
    h = h.wrapping_add(len);
    let mut rest = stripes.remainder();
    while rest.len() >= 8 {
        h ^= round(0, word(rest));
        h = h.rotate_left(27).wrapping_mul(P1).wrapping_add(P4);
        rest = rest.get(8..).unwrap_or_default();
    }
    if rest.len() >= 4 {
        h ^= half(rest).wrapping_mul(P1);
        h = h.rotate_left(23).wrapping_mul(P2).wrapping_add(P3);
        rest = rest.get(4..).unwrap_or_default();
    }
    for b in rest {
        h ^= u64::from(*b).wrapping_mul(P5);
        h = h.rotate_left(11).wrapping_mul(P1);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(P2);
    h ^= h >> 29;
    h = h.wrapping_mul(P3);
    h ^ (h >> 32)
}

/// The digest of the chunk `bytes` at stream offset `offset`.
pub fn chunk(offset: u64, bytes: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot_with_seed(offset, bytes)
}

/// A chunk's digest made before the chunk reaches the stream (by the producer's writer, on
/// its own thread, so that the daemon's loop does not hash every byte it sends): valid for
/// the chunk's bytes at `offset` only. [`super::Outgoing::write_chunk`] uses it when the
/// chunk is whole and at the stream's next offset, and hashes again otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkDigest {
    /// The stream offset of the chunk's first byte.
    pub offset: u64,
    /// The XXH3 digest of the chunk's bytes (the stream's seed; `stream::digest`).
    pub digest: u64,
}

impl ChunkDigest {
    /// The digest of `bytes` at `offset`.
    pub fn of(offset: u64, bytes: &[u8]) -> ChunkDigest {
        ChunkDigest {
            offset,
            digest: chunk(offset, bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offset_and_every_byte_count() {
        assert_ne!(chunk(0, b"abc"), chunk(1, b"abc"));
        assert_ne!(chunk(0, b"abc"), chunk(0, b"abd"));
        assert_eq!(chunk(5, b"xyz"), chunk(5, b"xyz"));
        let mut long = vec![7u8; 100];
        let d = chunk(0, &long);
        long[63] = 8;
        assert_ne!(chunk(0, &long), d);
    }

    #[test]
    fn a_chunk_digest_is_xxh3() {
        // The reference implementation's values (its sanity check: the empty input and "a").
        assert_eq!(chunk(0, b""), 0x2D06_8005_38D3_94C2);
        assert_eq!(chunk(0, b"a"), 0xE6C6_32B6_1E96_4E1F);
        assert_ne!(chunk(1, b""), chunk(0, b""));
        // Seeded, and long enough for the vector loop (whose code is picked at run time):
        // the values the previous XXH3 crate gave, so the wire is unchanged.
        let long: Vec<u8> = (0..256 * 1024u32).map(|i| (i * 7) as u8).collect();
        assert_eq!(chunk(12345, &long), 0xDEE6_DAA2_1A36_473C);
        assert_eq!(chunk(7, &long[..1000]), 0xA5DD_53FE_B866_1936);
    }

    #[test]
    fn it_is_xxh64() {
        // The reference implementation's published values.
        assert_eq!(xxh64(b"", 0), 0xEF46_DB37_51D8_E999);
        assert_eq!(xxh64(b"a", 0), 0xD24E_C4F1_A98C_6E5B);
        assert_eq!(xxh64(b"abc", 0), 0x44BC_2CF5_AD77_0999);
        // 39 bytes: a 32-byte stripe, then a 4-byte and three 1-byte tails.
        let s = b"Nobody inspects the spammish repetition";
        assert_eq!(xxh64(s, 0), 0xFBCE_A83C_8A37_8BF1);
    }
}
