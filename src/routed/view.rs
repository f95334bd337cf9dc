//! The whole repaired tree at once.
use super::occupancy::{heir, split_prefix};
use super::{Shape, TreeError, check_failed};
use crate::Rank;

/// One living rank in the repaired tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    /// The living rank.
    pub rank: Rank,
    /// Its parent (lifeline); `None` for rank 0.
    pub parent: Option<Rank>,
    /// Its living children, ascending.
    pub children: Vec<Rank>,
    /// Depth of the slot it occupies.
    pub depth: u32,
    /// The slot it occupies (its own rank unless promoted).
    pub slot: Rank,
}

/// The repaired tree of `size` ranks with radix `radix` after `failed` died: one entry per
/// living rank, ascending by rank.
///
/// Computed from scratch, independently of any [`super::RoutingState`]; costs O(size · depth)
/// time and O(size) memory, so keep `size` to what you mean to display. Duplicates in `failed`
/// are allowed. Fails with [`TreeError::RadixTooSmall`], [`TreeError::EmptyTree`],
/// [`TreeError::RankOutOfRange`] or [`TreeError::RootFailed`].
pub fn tree_view(radix: u32, size: u32, failed: &[Rank]) -> Result<Vec<NodeView>, TreeError> {
    let shape = Shape::new(radix, size)?;
    check_failed(size, failed)?;
    let mut dead = failed.to_vec();
    dead.sort_unstable();
    dead.dedup();

    let living = usize::try_from(size).unwrap_or(usize::MAX) - dead.len();
    let mut nodes: Vec<NodeView> = Vec::with_capacity(living);
    // (slot, index of the parent slot's node, ranks of this slot's subtree used above it)
    let mut pending: Vec<(Rank, Option<usize>, Vec<Rank>)> = vec![(0, None, Vec::new())];
    while let Some((slot, parent, mut used)) = pending.pop() {
        let Some(occupant) = heir(&shape, &dead, slot, used.last().copied()) else {
            continue; // a hole: its whole subtree is used above or dead
        };
        let index = nodes.len();
        let parent_rank = parent.and_then(|p| nodes.get_mut(p)).map(|p| {
            p.children.push(occupant);
            p.rank
        });
        nodes.push(NodeView {
            rank: occupant,
            parent: parent_rank,
            children: Vec::new(),
            depth: shape.depth(slot),
            slot,
        });
        used.push(occupant);
        let mut groups = split_prefix(&shape, slot, &used);
        for child in shape.children(slot) {
            let group = match groups.iter().position(|(c, _)| *c == child) {
                Some(at) => groups.swap_remove(at).1,
                None => Vec::new(),
            };
            pending.push((child, Some(index), group));
        }
    }
    for node in &mut nodes {
        node.children.sort_unstable();
    }
    nodes.sort_unstable_by_key(|n| n.rank);
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orphan_case() {
        let view = tree_view(2, 7, &[1, 5]).unwrap();
        let ranks: Vec<_> = view.iter().map(|n| n.rank).collect();
        assert_eq!(ranks, [0, 2, 3, 4, 6]);
        assert_eq!(view[0].children, [2, 3]);
        assert_eq!(view[2].slot, 1);
        assert_eq!(view[2].parent, Some(0));
        assert_eq!(view[2].depth, 1);
    }

    #[test]
    fn rejects_bad_input() {
        assert_eq!(tree_view(2, 7, &[0]), Err(TreeError::RootFailed));
        assert_eq!(
            tree_view(2, 7, &[7]),
            Err(TreeError::RankOutOfRange { rank: 7, size: 7 })
        );
        assert_eq!(tree_view(0, 7, &[]), Err(TreeError::RadixTooSmall));
    }
}
