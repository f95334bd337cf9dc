//! Pure rank arithmetic of PRRTE's radix tree, with no failures.
//!
//! Layer `d` has width `W_d = k^d` and holds the ranks `[O_d, O_d + W_d)` with
//! `O_d = (k^d - 1)/(k - 1)`. The children of `r` at depth `d` are `r + i*W_d` for `i = 1..=k`
//! while below `n` (strided, not adjacent), and the subtree of `r` is every `s >= r`, `s < n`,
//! with `s ≡ r (mod W_d)`. The "next" walk is a pre-order walk that visits children highest rank
//! first.
//!
//! All arithmetic is done in `u64` with checked operations, so every rank up to `u32::MAX` and
//! every radix up to `u32::MAX` is handled without overflow or panic.
//!
//! Use [`Shape`] when making many calls on one tree (it keeps the layer table); the free functions
//! are conveniences that build a `Shape` per call and treat a radix below 2 as 2, as PRRTE does.
use super::TreeError;
use crate::Rank;

/// Layers needed to number every `u32` rank at the smallest radix (2): `O_32 = 2^32 - 1`.
const MAX_LAYERS: usize = 33;

/// The layer table of a failure-free radix tree of `size` ranks.
///
/// Every method accepts any `Rank`; ranks at or above `size` have no children, belong to no
/// subtree and are never visited by a walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    radix: u32,
    size: u32,
    /// Number of layers needed to hold every `u32` rank.
    layers: usize,
    /// `offsets[d]` is the first rank of layer `d`; `offsets[layers]` is beyond `u32::MAX`.
    offsets: [u64; MAX_LAYERS + 1],
    /// `widths[d] = radix^d`, exact for every `d < layers`.
    widths: [u64; MAX_LAYERS],
}

/// Routing down from one slot ([`Shape::descent`]): the slot's layer width and the next
/// layer's first rank and width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descent {
    slot: u64,
    size: u64,
    width: u64,
    next_offset: u64,
    next_width: u64,
}

impl Descent {
    /// The 1-based index among the slot's children of the child whose subtree holds `target`:
    /// the same as [`Shape::child_toward`]`(slot, target)`'s index, without searching the layers.
    pub fn child_index(&self, target: Rank) -> Option<usize> {
        let t = u64::from(target);
        // In the slot's subtree, and not the slot itself: then `t` lies deeper.
        if t <= self.slot || t >= self.size || !(t - self.slot).is_multiple_of(self.width) {
            return None;
        }
        let from_next = t.checked_sub(self.next_offset)?;
        let child = from_next % self.next_width + self.next_offset;
        usize::try_from(child.checked_sub(self.slot)? / self.width).ok()
    }
}

// Indexing here is over `offsets`/`widths`, fixed arrays of `MAX_LAYERS (+1)` entries: `build`
// stops at `MAX_LAYERS` layers (33 is enough for u32 ranks at radix 2), and `depth_index`
// returns at most `layers - 1`. No index comes from outside without going through them.
#[allow(clippy::indexing_slicing)]
impl Shape {
    /// The tree of `size` ranks with radix `radix`.
    ///
    /// Fails with [`TreeError::RadixTooSmall`] if `radix < 2` and [`TreeError::EmptyTree`] if
    /// `size == 0`.
    pub fn new(radix: u32, size: u32) -> Result<Self, TreeError> {
        if radix < 2 {
            return Err(TreeError::RadixTooSmall);
        }
        if size == 0 {
            return Err(TreeError::EmptyTree);
        }
        Ok(Self::build(radix, size))
    }

    /// Like [`Shape::new`] but clamps the radix to 2 and accepts an empty tree.
    fn lenient(radix: u32, size: u32) -> Self {
        Self::build(radix.max(2), size)
    }

    fn build(radix: u32, size: u32) -> Self {
        let k = u64::from(radix);
        let mut offsets = [u64::MAX; MAX_LAYERS + 1];
        let mut widths = [u64::MAX; MAX_LAYERS];
        let (mut offset, mut width) = (0u64, 1u64);
        let mut layers = 0;
        while layers < MAX_LAYERS && offset <= u64::from(Rank::MAX) {
            offsets[layers] = offset;
            widths[layers] = width;
            // Exact while offset <= u32::MAX: then k^d <= (2^32 - 1)(k - 1) + 1 < 2^64.
            offset = offset.saturating_add(width);
            width = width.saturating_mul(k);
            layers += 1;
        }
        offsets[layers] = offset;
        Shape {
            radix,
            size,
            layers,
            offsets,
            widths,
        }
    }

    /// The radix `k`.
    pub fn radix(&self) -> u32 {
        self.radix
    }

    /// The number of ranks `n`.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Depth (layer) of rank `r`; the root is at depth 0.
    pub fn depth(&self, r: Rank) -> u32 {
        let r = u64::from(r);
        let d = self.offsets[1..=self.layers].partition_point(|&o| o <= r);
        // d < MAX_LAYERS, so the conversion cannot fail.
        u32::try_from(d).unwrap_or(u32::MAX)
    }

    fn depth_index(&self, r: Rank) -> usize {
        let r = u64::from(r);
        self.offsets[1..=self.layers].partition_point(|&o| o <= r)
    }

    /// The ancestor of `r` at depth `j` (`r` itself when `j` is its depth); `None` if `j` is
    /// deeper than `r`.
    pub fn ancestor_at(&self, r: Rank, j: u32) -> Option<Rank> {
        let j = usize::try_from(j).ok()?;
        if j > self.depth_index(r) {
            return None;
        }
        let (o, w) = (self.offsets[j], self.widths[j]);
        let a = (u64::from(r) - o) % w + o;
        Rank::try_from(a).ok()
    }

    /// The parent of `r`; `None` for the root.
    pub fn parent(&self, r: Rank) -> Option<Rank> {
        let d = self.depth(r);
        self.ancestor_at(r, d.checked_sub(1)?)
    }

    /// Every ancestor of `r`, parent first and the root (0) last; empty for the root.
    pub fn ancestors(&self, r: Rank) -> Vec<Rank> {
        let d = self.depth(r);
        (0..d)
            .rev()
            .filter_map(|j| self.ancestor_at(r, j))
            .collect()
    }

    /// The children of `r`, ascending; empty if `r >= size`.
    pub fn children(&self, r: Rank) -> Children {
        let w = self.widths[self.depth_index(r)];
        let count = if r < self.size {
            let room = u64::from(self.size - 1 - r) / w;
            room.min(u64::from(self.radix))
        } else {
            0
        };
        Children {
            next: u64::from(r).saturating_add(w),
            step: w,
            remaining: count,
        }
    }

    /// The highest-ranked child of `r`, the first one the walk visits.
    pub fn highest_child(&self, r: Rank) -> Option<Rank> {
        self.children(r).next_back()
    }

    /// Whether `r` lies in the subtree of `root` (including `root` itself); false if either is
    /// out of range.
    pub fn in_subtree(&self, root: Rank, r: Rank) -> bool {
        if r >= self.size || root >= self.size || r < root {
            return false;
        }
        let w = self.widths[self.depth_index(root)];
        (u64::from(r) - u64::from(root)) % w == 0
    }

    /// The child slot of `r` whose subtree holds `target`, and its 1-based index `i` among the
    /// children (`child = r + i*W_d`); `None` if `target` is `r` or outside `r`'s subtree.
    pub fn child_toward(&self, r: Rank, target: Rank) -> Option<(Rank, usize)> {
        if target == r || !self.in_subtree(r, target) {
            return None;
        }
        let d = self.depth(r);
        let child = self.ancestor_at(target, d.checked_add(1)?)?;
        let w = self.widths[self.depth_index(r)];
        let i = (u64::from(child) - u64::from(r)) / w;
        Some((child, usize::try_from(i).ok()?))
    }

    /// What [`Shape::child_toward`] needs about slot `r`, computed once: routing a frame
    /// down from a fixed slot then costs no search of the layers. `None` when `r` is outside
    /// the tree or in the last layer that can exist (nothing lies below it).
    pub fn descent(&self, r: Rank) -> Option<Descent> {
        if r >= self.size {
            return None;
        }
        let d = self.depth_index(r);
        let next = d.checked_add(1).filter(|&n| n < self.layers)?;
        Some(Descent {
            slot: u64::from(r),
            size: u64::from(self.size),
            width: self.widths[d],
            next_offset: self.offsets[next],
            next_width: self.widths[next],
        })
    }

    /// The rank after `r` in the pre-order walk of the whole tree (children highest rank
    /// first); `None` at the end of the walk or if `r >= size`.
    pub fn next(&self, r: Rank) -> Option<Rank> {
        self.next_in(0, r)
    }

    /// Like [`Shape::next`] but the walk stays inside the subtree of `root`; `None` at its end
    /// or if `r` is not in that subtree.
    pub fn next_in(&self, root: Rank, r: Rank) -> Option<Rank> {
        if !self.in_subtree(root, r) {
            return None;
        }
        if let Some(child) = self.highest_child(r) {
            return Some(child);
        }
        // A leaf: climb until some ancestor has a lower sibling left to visit.
        let mut x = r;
        while x != root {
            let p = self.parent(x)?;
            let w = self.widths[self.depth_index(p)];
            let sibling = u64::from(x).checked_sub(w)?;
            if sibling > u64::from(p) {
                return Rank::try_from(sibling).ok();
            }
            x = p;
        }
        None
    }

    /// The next rank after `r` in the whole-tree walk for which `is_failed` is false.
    ///
    /// A failed rank's descendants are still visited, so the cost grows with the number of
    /// failed ranks skipped.
    pub fn next_living(&self, r: Rank, is_failed: impl FnMut(Rank) -> bool) -> Option<Rank> {
        self.next_living_in(0, r, is_failed)
    }

    /// The next living rank after `r` in the walk rooted at `root`.
    pub fn next_living_in(
        &self,
        root: Rank,
        r: Rank,
        mut is_failed: impl FnMut(Rank) -> bool,
    ) -> Option<Rank> {
        let mut x = r;
        loop {
            x = self.next_in(root, x)?;
            if !is_failed(x) {
                return Some(x);
            }
        }
    }
}

/// The children of one rank, ascending (double-ended: `next_back` gives the highest).
#[derive(Debug, Clone)]
pub struct Children {
    next: u64,
    step: u64,
    remaining: u64,
}

impl Iterator for Children {
    type Item = Rank;

    fn next(&mut self) -> Option<Rank> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let r = self.next;
        self.next = self.next.saturating_add(self.step);
        Rank::try_from(r).ok()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = usize::try_from(self.remaining).unwrap_or(usize::MAX);
        (n, Some(n))
    }
}

impl DoubleEndedIterator for Children {
    fn next_back(&mut self) -> Option<Rank> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        // remaining * step <= size - 1 - parent, so this cannot overflow.
        let r = self
            .next
            .checked_add(self.remaining.checked_mul(self.step)?)?;
        Rank::try_from(r).ok()
    }
}

impl ExactSizeIterator for Children {}

/// Depth of `r` in a radix-`k` tree (radix below 2 is treated as 2).
pub fn depth(k: u32, r: Rank) -> u32 {
    Shape::lenient(k, 0).depth(r)
}

/// Parent of `r` in a radix-`k` tree; `None` for the root.
pub fn parent(k: u32, r: Rank) -> Option<Rank> {
    Shape::lenient(k, 0).parent(r)
}

/// Ancestors of `r`, parent first, root last.
pub fn ancestors(k: u32, r: Rank) -> Vec<Rank> {
    Shape::lenient(k, 0).ancestors(r)
}

/// Children of `r` in a radix-`k` tree of `n` ranks, ascending.
pub fn children(k: u32, n: u32, r: Rank) -> Children {
    Shape::lenient(k, n).children(r)
}

/// Whether `r` lies in the subtree of `root` in a radix-`k` tree of `n` ranks.
pub fn in_subtree(k: u32, n: u32, root: Rank, r: Rank) -> bool {
    Shape::lenient(k, n).in_subtree(root, r)
}

/// The child slot of `r` whose subtree holds `target` (see [`Shape::child_toward`]).
pub fn child_toward(k: u32, n: u32, r: Rank, target: Rank) -> Option<Rank> {
    Shape::lenient(k, n).child_toward(r, target).map(|(c, _)| c)
}

/// The next rank in the whole-tree pre-order walk (see [`Shape::next`]).
pub fn next(k: u32, n: u32, r: Rank) -> Option<Rank> {
    Shape::lenient(k, n).next(r)
}

/// The next rank in the walk rooted at `root` (see [`Shape::next_in`]).
pub fn next_in(k: u32, n: u32, root: Rank, r: Rank) -> Option<Rank> {
    Shape::lenient(k, n).next_in(root, r)
}

/// The next living rank in the whole-tree walk (see [`Shape::next_living`]).
pub fn next_living(k: u32, n: u32, r: Rank, is_failed: impl FnMut(Rank) -> bool) -> Option<Rank> {
    Shape::lenient(k, n).next_living(r, is_failed)
}

/// The next living rank in the walk rooted at `root` (see [`Shape::next_living_in`]).
pub fn next_living_in(
    k: u32,
    n: u32,
    root: Rank,
    r: Rank,
    is_failed: impl FnMut(Rank) -> bool,
) -> Option<Rank> {
    Shape::lenient(k, n).next_living_in(root, r, is_failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn radix_two_example() {
        let s = Shape::new(2, 7).unwrap();
        assert_eq!(s.children(0).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(s.children(1).collect::<Vec<_>>(), [3, 5]);
        assert_eq!(s.children(2).collect::<Vec<_>>(), [4, 6]);
        assert_eq!(s.parent(5), Some(1));
        assert_eq!(s.parent(4), Some(2));
        assert_eq!(s.ancestors(6), [2, 0]);
        let mut walk = vec![0];
        while let Some(r) = s.next(*walk.last().unwrap()) {
            walk.push(r);
        }
        assert_eq!(walk, [0, 2, 6, 4, 1, 5, 3]);
        assert_eq!(s.next_in(1, 1), Some(5));
        assert_eq!(s.next_in(1, 3), None);
        assert_eq!(s.child_toward(0, 5), Some((1, 1)));
        assert_eq!(s.child_toward(0, 6), Some((2, 2)));
    }

    #[test]
    fn rejects_bad_shapes() {
        assert_eq!(Shape::new(1, 5), Err(TreeError::RadixTooSmall));
        assert_eq!(Shape::new(2, 0), Err(TreeError::EmptyTree));
    }

    #[test]
    fn limits_do_not_overflow() {
        for k in [2, 3, 64, 1 << 16, u32::MAX - 1, u32::MAX] {
            let s = Shape::new(k, u32::MAX).unwrap();
            for r in [
                0,
                1,
                2,
                k / 2,
                k - 1,
                k,
                u32::MAX - 2,
                u32::MAX - 1,
                u32::MAX,
            ] {
                let d = s.depth(r);
                let anc = s.ancestors(r);
                assert_eq!(anc.len(), d as usize);
                if let Some(p) = s.parent(r) {
                    // r == u32::MAX is beyond size, so it is no one's child.
                    let slot = s.child_toward(p, r).map(|(c, _)| c);
                    assert_eq!(slot == Some(r), r != u32::MAX, "k={k} r={r}");
                }
                let kids: Vec<_> = s.children(r).take(3).collect();
                for c in kids {
                    assert_eq!(s.parent(c), Some(r));
                }
                let _ = s.next(r);
                let _ = s.highest_child(r);
                let _ = s.child_toward(0, r);
            }
        }
        assert_eq!(depth(2, u32::MAX), 32);
        assert_eq!(depth(u32::MAX, u32::MAX), 1);
        assert_eq!(parent(u32::MAX, u32::MAX - 1), Some(0));
        assert_eq!(
            children(u32::MAX, u32::MAX, 0).len(),
            (u32::MAX - 1) as usize
        );
        assert_eq!(
            children(u32::MAX, u32::MAX, 0).next_back(),
            Some(u32::MAX - 1)
        );
    }
}
