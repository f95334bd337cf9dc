//! Every bound in tbon lives here, so that a reader can see at a glance how much memory and time
//! the library may use, and what happens when a bound is reached (documented at each constant).

/// Default bound on the unmatched list: messages that arrived before any receive was posted for
/// them (PRRTE's list is unbounded). At the bound the oldest held message is dropped to make room
/// and handed back to the driver, which counts it and logs a warning. Setting: `unmatched_max`.
pub const UNMATCHED_MAX_DEFAULT: usize = 65_536;
