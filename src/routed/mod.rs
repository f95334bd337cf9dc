//! The radix routing tree: PRRTE's numbering, plus a repair that is a pure function of
//! `(radix, size, failed set)`.
//!
//! - [`radix`]: rank arithmetic of the failure-free tree (layers, parent, children, subtree,
//!   the pre-order "next" walk that visits children highest rank first).
//! - [`RoutingState`]: one daemon's view: its failed set, the slot it occupies, its lifeline
//!   (parent), children and ancestors, and the next hop towards any rank.
//! - [`tree_view`]: the whole repaired tree at once, for the CLI and for tests.
//!
//! # Repair
//! Think in *slots*, the positions of the failure-free tree. The occupant of slot `s` is the
//! first living rank in the pre-order walk of the original subtree of `s` that does not already
//! occupy an ancestor slot of `s`; if there is none, `s` is a hole and so is every slot below
//! it. Rank 0 always occupies slot 0 and can never fail. A living rank occupying a slot other
//! than its own has been *promoted* (it is the heir of that slot). Every living rank occupies
//! exactly one slot, and the parent slot of an occupied slot is always occupied, so the repaired
//! tree is connected. Because the tree depends only on the failed set, every daemon that knows
//! the same failures computes the same tree, in whatever order it learned them.
//!
//! This differs from PRRTE's incremental repair, which can orphan a rank (radix 2, size 7,
//! failed {1, 5}: PRRTE loses rank 3; here rank 3 takes slot 1).
use std::fmt;

mod occupancy;
pub mod radix;
mod state;
mod view;

pub use radix::{Descent, Shape};
pub use state::{RecoveryStatus, Route, RoutingState, Scope};
pub use view::{NodeView, tree_view};

use crate::Rank;

/// A lifeline for logs: `rank 3`, or `none (the root)` for rank 0's.
pub(crate) struct ParentName(pub Option<Rank>);

impl fmt::Display for ParentName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(r) => write!(f, "rank {r}"),
            None => f.write_str("none (the root)"),
        }
    }
}

/// Why a tree could not be built or changed. Nothing is modified when one is returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TreeError {
    /// The radix was below 2.
    RadixTooSmall,
    /// The size was 0: a tree needs at least rank 0.
    EmptyTree,
    /// A rank was not below the size of the tree.
    RankOutOfRange {
        /// The offending rank.
        rank: Rank,
        /// The size of the tree.
        size: u32,
    },
    /// Rank 0 was reported failed. Rank 0 is never replaced: the caller must treat this as the
    /// end of the whole DVM.
    RootFailed,
    /// A grow asked for fewer ranks than the tree has.
    ShrinkNotAllowed,
}

impl fmt::Display for TreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TreeError::RadixTooSmall => write!(f, "radix must be at least 2"),
            TreeError::EmptyTree => write!(f, "size must be at least 1"),
            TreeError::RankOutOfRange { rank, size } => {
                write!(f, "rank {rank} is out of range for size {size}")
            }
            TreeError::RootFailed => write!(f, "rank 0 (the root) failed; the DVM cannot survive"),
            TreeError::ShrinkNotAllowed => write!(f, "the tree cannot shrink"),
        }
    }
}

impl std::error::Error for TreeError {}

/// Check a failed set against a tree of `size` ranks: every rank below `size` and none is 0.
fn check_failed(size: u32, failed: &[Rank]) -> Result<(), TreeError> {
    for &rank in failed {
        if rank >= size {
            return Err(TreeError::RankOutOfRange { rank, size });
        }
        if rank == 0 {
            return Err(TreeError::RootFailed);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::ParentName;

    #[test]
    fn a_parent_is_named_as_a_rank_or_as_none() {
        assert_eq!(ParentName(Some(3)).to_string(), "rank 3");
        assert_eq!(ParentName(None).to_string(), "none (the root)");
    }
}
