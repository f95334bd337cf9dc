//! tbon: a fault-tolerant tree-based overlay network for the daemons of an HPC resource manager.
//!
//! See `README.md` for what it is and `AGENTS.md` for where things live.
#![forbid(unsafe_code)]

pub mod limits;
pub mod routed;

/// A daemon's rank in the DVM: 0 is the root (the HNP), ranks run `0..size`.
pub type Rank = u32;
