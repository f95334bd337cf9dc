//! Invariant checks: [`bug!`](crate::bug) reports a broken internal rule of the protocol, never
//! a peer's or a caller's error (those get their own error values). In unit tests and in the
//! simulator (which calls [`set_strict`]) a broken invariant panics, so the seed that found it
//! fails and replays; in a running daemon it is logged at error level and counted
//! ([`violations`]), and the daemon carries on: a daemon that crashes on its own bug takes its
//! subtree's traffic down with it.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

static VIOLATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static STRICT: Cell<bool> = const { Cell::new(false) };
}

/// Makes [`bug!`](crate::bug) panic on this thread (the simulator; tests always panic).
pub fn set_strict(strict: bool) {
    STRICT.with(|s| s.set(strict));
}

/// Invariants found broken in this process so far (release builds only count).
pub fn violations() -> u64 {
    VIOLATIONS.load(Ordering::Relaxed)
}

/// Called by [`bug!`](crate::bug); use the macro.
#[doc(hidden)]
#[allow(clippy::panic)] // the one place a broken invariant may stop the program: tests, simulator
pub fn violated(what: std::fmt::Arguments<'_>) {
    VIOLATIONS.fetch_add(1, Ordering::Relaxed);
    if cfg!(test) || STRICT.with(Cell::get) {
        panic!("invariant violated: {what}");
    }
    log::error!("invariant violated (a bug in tbon; please report it): {what}");
}

/// Reports a broken invariant: panics in tests and in the simulator, logs and counts otherwise.
#[macro_export]
#[doc(hidden)]
macro_rules! bug {
    ($($arg:tt)*) => {
        $crate::invariant::violated(format_args!($($arg)*))
    };
}

#[cfg(test)]
mod tests {
    #[test]
    #[should_panic(expected = "invariant violated: two and two make 5")]
    fn panics_in_tests() {
        crate::bug!("two and two make {}", 5);
    }
}
