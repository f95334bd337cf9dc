//! Fresh handshake nonces. The handshake (`oob::handshake`) is sans-IO and takes its nonce as
//! an argument; this is where the driver draws one, once per connection.

use crate::oob::handshake::NONCE_LEN;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A fresh nonce for one handshake, from the OS generator. That does not fail on Linux once
/// booted; should it, the nonce is made from the clock and a per-process counter instead
/// (unpredictable enough to prevent the replay of a recorded handshake, which is what the nonce
/// is for) and an error is logged. Never fails, never panics.
pub(crate) fn fresh() -> [u8; NONCE_LEN] {
    fill_or_fallback(|n| getrandom::fill(n))
}

/// `fill`'s nonce, or, if it fails, the clock-and-counter fallback (logged).
fn fill_or_fallback<E: std::fmt::Display>(
    fill: impl FnOnce(&mut [u8; NONCE_LEN]) -> Result<(), E>,
) -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    if let Err(e) = fill(&mut n) {
        log::error!("no OS randomness for a handshake nonce ({e}); using the clock");
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let c = COUNTER.fetch_add(1, Ordering::Relaxed);
        n[..8].copy_from_slice(&(t as u64).to_le_bytes());
        n[8..].copy_from_slice(&c.to_le_bytes());
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_differ() {
        assert_ne!(fresh(), fresh());
    }

    #[test]
    fn without_os_randomness_the_fallback_still_differs_every_time() {
        let broken = |_: &mut [u8; NONCE_LEN]| Err("no entropy");
        let a = fill_or_fallback(broken);
        let b = fill_or_fallback(broken);
        assert_ne!(a, b);
        assert_ne!(a, [0; NONCE_LEN]);
        // A working source's bytes are used as they are.
        let given = fill_or_fallback(|n: &mut [u8; NONCE_LEN]| {
            n.fill(9);
            Ok::<(), &str>(())
        });
        assert_eq!(given, [9; NONCE_LEN]);
    }
}
