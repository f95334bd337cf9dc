//! Message identity: an origin's 32-bit message counter, its three sentinels, and the
//! wrap-aware order between two uids.
//!
//! As in PRRTE, the counter wraps and its top three values are reserved: `UNKNOWN`, `NONE` (the
//! "previous uid" of the first message of a chain) and `INVALID`. Order is serial-number
//! arithmetic over the `MODULUS` valid values, so it stays right across a wrap as long as fewer
//! than half of them are in flight at once (the origin's bound, `RELM_UNACKED_MAX`, is far
//! smaller).

use crate::Rank;

/// Uid sentinel: not known yet.
pub const UNKNOWN: u32 = u32::MAX - 2;
/// Uid sentinel: no message (the predecessor of a chain's first message).
pub const NONE: u32 = u32::MAX - 1;
/// Uid sentinel: never valid on the wire.
pub const INVALID: u32 = u32::MAX;
/// How many uid values are valid (`0..MODULUS`).
pub const MODULUS: u64 = UNKNOWN as u64;

/// Whether `uid` is a real message uid rather than a sentinel.
pub fn is_valid(uid: u32) -> bool {
    (uid as u64) < MODULUS
}

/// The uid after `uid`, wrapping past the sentinels to 0.
pub fn next(uid: u32) -> u32 {
    if (uid as u64) + 1 >= MODULUS {
        0
    } else {
        uid + 1
    }
}

/// Whether `a` comes strictly before `b` (both valid) in serial-number order.
pub fn before(a: u32, b: u32) -> bool {
    let d = ((b as u64) + MODULUS - (a as u64)) % MODULUS;
    d != 0 && d < MODULUS / 2
}

/// Whether `a` is `b` or comes before it.
pub fn at_or_before(a: u32, b: u32) -> bool {
    a == b || before(a, b)
}

/// A message's identity: its origin and the origin's uid for it, which PRRTE hashes into one
/// 64-bit key (here simply packed). Adding the destination gives the message's signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MsgKey {
    /// The rank that sent the message.
    pub origin: Rank,
    /// The origin's uid for it.
    pub uid: u32,
}

impl MsgKey {
    /// The 64-bit key: origin in the high half, uid in the low half.
    pub fn packed(self) -> u64 {
        ((self.origin as u64) << 32) | self.uid as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_past_the_sentinels() {
        assert_eq!(next(UNKNOWN - 1), 0);
        assert!(before(UNKNOWN - 1, 0));
        assert!(!before(0, UNKNOWN - 1));
        assert!(before(5, 6) && !before(6, 5) && !before(5, 5));
        assert!(at_or_before(5, 5));
        assert!(!is_valid(NONE) && !is_valid(INVALID) && !is_valid(UNKNOWN) && is_valid(0));
        assert_eq!(MsgKey { origin: 2, uid: 7 }.packed(), (2 << 32) | 7);
    }
}
