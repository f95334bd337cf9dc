//! The radix routing tree against a naive reference written from the definitions.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use proptest::prelude::*;
use tbon::Rank;
use tbon::routed::{Route, RoutingState, Scope, Shape, TreeError, radix, tree_view};

/// The failure-free tree built layer by layer, independently of `tbon::routed::radix`.
struct Reference {
    depth: Vec<u32>,
    parent: Vec<Option<Rank>>,
    children: Vec<Vec<Rank>>,
}

impl Reference {
    fn new(k: u32, n: u32) -> Self {
        let n_us = n as usize;
        let mut depth = vec![0; n_us];
        let mut layer_width = Vec::new();
        let (mut start, mut width, mut d) = (0u64, 1u64, 0u32);
        while start < u64::from(n) {
            for r in start..(start + width).min(u64::from(n)) {
                depth[r as usize] = d;
            }
            layer_width.push(width);
            start += width;
            width *= u64::from(k);
            d += 1;
        }
        let mut children = vec![Vec::new(); n_us];
        let mut parent = vec![None; n_us];
        for r in 0..n {
            let w = layer_width[depth[r as usize] as usize];
            for i in 1..=u64::from(k) {
                let c = u64::from(r) + i * w;
                if c >= u64::from(n) {
                    break;
                }
                children[r as usize].push(c as Rank);
                assert!(parent[c as usize].is_none());
                parent[c as usize] = Some(r);
            }
        }
        Reference {
            depth,
            parent,
            children,
        }
    }

    fn ancestors(&self, r: Rank) -> Vec<Rank> {
        let mut out = Vec::new();
        let mut x = r;
        while let Some(p) = self.parent[x as usize] {
            out.push(p);
            x = p;
        }
        out
    }

    /// Pre-order walk of the subtree of `root`, children highest rank first.
    fn preorder(&self, root: Rank) -> Vec<Rank> {
        let mut out = Vec::new();
        let mut stack = vec![root];
        while let Some(r) = stack.pop() {
            out.push(r);
            // Push ascending so that the highest child is popped first.
            stack.extend(self.children[r as usize].iter().copied());
        }
        out
    }

    /// The repaired tree, straight from the definition: rank -> (parent, children, depth, slot).
    fn repair(
        &self,
        failed: &BTreeSet<Rank>,
    ) -> BTreeMap<Rank, (Option<Rank>, Vec<Rank>, u32, Rank)> {
        let n = self.depth.len();
        let mut occupant: Vec<Option<Rank>> = vec![None; n];
        for s in 0..n as Rank {
            let above: BTreeSet<Rank> = self
                .ancestors(s)
                .iter()
                .filter_map(|&a| occupant[a as usize])
                .collect();
            occupant[s as usize] = self
                .preorder(s)
                .into_iter()
                .find(|r| !failed.contains(r) && !above.contains(r));
            if let (Some(_), Some(p)) = (occupant[s as usize], self.parent[s as usize]) {
                assert!(
                    occupant[p as usize].is_some(),
                    "occupied slot {s} under a hole"
                );
            }
        }
        let mut out = BTreeMap::new();
        for s in 0..n as Rank {
            if let Some(o) = occupant[s as usize] {
                let parent = self.parent[s as usize].map(|p| occupant[p as usize].unwrap());
                let mut kids: Vec<Rank> = self.children[s as usize]
                    .iter()
                    .filter_map(|&c| occupant[c as usize])
                    .collect();
                kids.sort();
                assert!(
                    out.insert(o, (parent, kids, self.depth[s as usize], s))
                        .is_none()
                );
            }
        }
        out
    }
}

fn check_failure_free(k: u32, n: u32, with_subtrees: bool) {
    let reference = Reference::new(k, n);
    let shape = Shape::new(k, n).unwrap();
    let walk = reference.preorder(0);
    assert_eq!(walk.len(), n as usize, "k={k} n={n}: walk lost ranks");
    for (i, &r) in walk.iter().enumerate() {
        assert_eq!(
            shape.next(r),
            walk.get(i + 1).copied(),
            "next k={k} n={n} r={r}"
        );
    }
    for r in 0..n {
        let ctx = format!("k={k} n={n} r={r}");
        assert_eq!(shape.depth(r), reference.depth[r as usize], "{ctx}");
        assert_eq!(radix::depth(k, r), reference.depth[r as usize], "{ctx}");
        assert_eq!(shape.parent(r), reference.parent[r as usize], "{ctx}");
        assert_eq!(radix::parent(k, r), reference.parent[r as usize], "{ctx}");
        assert_eq!(shape.ancestors(r), reference.ancestors(r), "{ctx}");
        let kids: Vec<Rank> = shape.children(r).collect();
        assert_eq!(kids, reference.children[r as usize], "{ctx}");
        assert_eq!(shape.children(r).len(), kids.len(), "{ctx}");
        assert_eq!(shape.highest_child(r), kids.last().copied(), "{ctx}");
        let sub = reference.preorder(r);
        for (i, &x) in sub.iter().enumerate() {
            assert_eq!(
                shape.next_in(r, x),
                sub.get(i + 1).copied(),
                "next_in {ctx} x={x}"
            );
        }
        assert_eq!(shape.child_toward(r, r), None, "{ctx}");
        for (i, &c) in kids.iter().enumerate() {
            for x in reference.preorder(c) {
                assert_eq!(shape.child_toward(r, x), Some((c, i + 1)), "{ctx} x={x}");
            }
        }
        if with_subtrees {
            let members: BTreeSet<Rank> = sub.iter().copied().collect();
            for s in 0..n {
                assert_eq!(shape.in_subtree(r, s), members.contains(&s), "{ctx} s={s}");
            }
        }
    }
    assert!(!shape.in_subtree(0, n));
    assert_eq!(shape.next(n), None);
    assert_eq!(shape.children(n).len(), 0);
}

#[test]
fn failure_free_tree_matches_reference_for_every_size_up_to_300() {
    for k in [2, 3, 4, 8, 64] {
        for n in 1..=300 {
            // Subtree membership is checked pairwise, which is quadratic: every size up to 100,
            // then a spread of larger ones.
            check_failure_free(k, n, n <= 100 || n % 37 == 0 || n == 300);
        }
    }
}

#[test]
fn radix_two_example() {
    let shape = Shape::new(2, 7).unwrap();
    assert_eq!(shape.children(0).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(shape.children(1).collect::<Vec<_>>(), [3, 5]);
    assert_eq!(shape.children(2).collect::<Vec<_>>(), [4, 6]);
    assert_eq!(radix::children(2, 7, 1).collect::<Vec<_>>(), [3, 5]);
    assert!(radix::in_subtree(2, 7, 1, 5));
    assert!(!radix::in_subtree(2, 7, 1, 4));
    assert_eq!(radix::child_toward(2, 7, 0, 6), Some(2));
    assert_eq!(radix::next(2, 7, 4), Some(1));
    assert_eq!(radix::next_in(2, 7, 2, 4), None);
    assert_eq!(radix::next_living(2, 7, 0, |r| r == 2 || r == 6), Some(4));
    assert_eq!(radix::next_living_in(2, 7, 1, 1, |r| r == 5), Some(3));
}

#[test]
fn prrte_orphan_case_keeps_rank_three() {
    let view = tree_view(2, 7, &[1, 5]).unwrap();
    let root = view.iter().find(|n| n.rank == 0).unwrap();
    assert_eq!(root.children, [2, 3]);
    let three = view.iter().find(|n| n.rank == 3).unwrap();
    assert_eq!((three.parent, three.slot, three.depth), (Some(0), 1, 1));
    let mut state = RoutingState::new(2, 7, 3).unwrap();
    let status = state.fail(&[5], Scope::Local, None).unwrap();
    assert!(!status.promoted);
    let status = state.fail(&[1], Scope::Global, Some(1)).unwrap();
    assert!(status.promoted);
    assert_eq!(status.previous_parent, Some(1));
    assert_eq!(status.new_parent, Some(0));
    assert_eq!(state.route(6), Route::Parent(0));
}

#[test]
fn radix_64_size_64_keeps_every_rank() {
    let shape = Shape::new(64, 64).unwrap();
    assert_eq!(shape.children(0).len(), 63);
    let view = tree_view(64, 64, &[]).unwrap();
    assert_eq!(view.len(), 64);
    let state = RoutingState::new(64, 64, 0).unwrap();
    for r in 1..64 {
        assert_eq!(state.route(r), Route::Child(r));
    }
    check_repair(64, 64, &[1, 63]);
}

#[test]
fn sizes_ending_at_a_last_child_slot() {
    for k in [2u32, 3, 4, 5, 8, 64] {
        let mut sizes = BTreeSet::new();
        for r in 0..2000u64 {
            let d = radix::depth(k, r as Rank);
            let n = r + u64::from(k) * u64::from(k).pow(d);
            if n <= 3000 {
                sizes.insert(n as u32);
            }
        }
        for n in sizes {
            check_failure_free(k, n, false);
            assert_eq!(tree_view(k, n, &[]).unwrap().len(), n as usize);
            check_repair(k, n, &[n - 1]);
        }
    }
}

/// tree_view and every daemon's RoutingState agree with the reference repair.
fn check_repair(k: u32, n: u32, failed: &[Rank]) {
    let reference = Reference::new(k, n);
    let dead: BTreeSet<Rank> = failed.iter().copied().collect();
    let expected = reference.repair(&dead);
    let view = tree_view(k, n, failed).unwrap();
    let got: BTreeMap<Rank, (Option<Rank>, Vec<Rank>, u32, Rank)> = view
        .iter()
        .map(|v| (v.rank, (v.parent, v.children.clone(), v.depth, v.slot)))
        .collect();
    assert_eq!(got, expected, "tree_view k={k} n={n} failed={failed:?}");
    let mut state = RoutingState::new(k, n, 0).unwrap();
    state.fail(failed, Scope::Global, Some(1)).unwrap();
    for r in 0..n {
        let mine = state.as_seen_by(r).unwrap();
        match expected.get(&r) {
            Some((parent, kids, depth, slot)) => {
                let ctx = format!("k={k} n={n} failed={failed:?} r={r}");
                assert_eq!(mine.parent(), *parent, "{ctx}");
                assert_eq!(mine.children(), kids.as_slice(), "{ctx}");
                assert_eq!(mine.depth(), *depth, "{ctx}");
                assert_eq!(mine.slot(), *slot, "{ctx}");
                assert_eq!(mine.promoted(), *slot != r, "{ctx}");
                let mut ancestors = Vec::new();
                let mut x = r;
                while let Some(p) = expected[&x].0 {
                    ancestors.push(p);
                    x = p;
                }
                assert_eq!(mine.ancestors(), ancestors.as_slice(), "{ctx}");
            }
            None => assert!(dead.contains(&r)),
        }
    }
}

#[test]
fn every_failed_set_of_small_trees_matches_reference() {
    for k in [2u32, 3, 4] {
        for n in 1..=11u32 {
            for mask in 0u32..(1 << (n - 1)) {
                let failed: Vec<Rank> = (1..n).filter(|r| mask & (1 << (r - 1)) != 0).collect();
                check_repair(k, n, &failed);
            }
        }
    }
}

#[test]
fn larger_failed_sets_match_reference() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for k in [2u32, 3, 4, 8, 64] {
        for n in [20u32, 64, 65, 100, 200, 300] {
            for fraction in [10u64, 3, 2] {
                let failed: Vec<Rank> = (1..n).filter(|_| rand() % fraction == 0).collect();
                check_repair(k, n, &failed);
            }
        }
    }
}

#[test]
fn routes_to_self_failed_and_out_of_range() {
    let mut state = RoutingState::new(4, 50, 5).unwrap();
    assert_eq!(state.route(5), Route::Local);
    assert_eq!(state.route(50), Route::Unreachable);
    assert_eq!(state.route(u32::MAX), Route::Unreachable);
    state.fail(&[9], Scope::Local, None).unwrap();
    assert_eq!(state.route(9), Route::Unreachable);
    assert_eq!(state.failed().collect::<Vec<_>>(), [9]);
    // A daemon told of its own death keeps no routes.
    state.fail(&[5], Scope::Global, Some(2)).unwrap();
    assert_eq!(state.route(5), Route::Unreachable);
    assert_eq!(state.route(0), Route::Unreachable);
    assert!(state.children().is_empty() && state.parent().is_none());
}

#[test]
fn grow_keeps_failures_and_matches_a_fresh_tree() {
    let mut state = RoutingState::new(2, 7, 0).unwrap();
    state.fail(&[1], Scope::Global, Some(1)).unwrap();
    assert_eq!(state.grow(6), Err(TreeError::ShrinkNotAllowed));
    state.grow(7).unwrap();
    state.grow(10).unwrap();
    assert!(state.is_failed(1));
    let mut fresh = RoutingState::new(2, 10, 0).unwrap();
    fresh.fail(&[1], Scope::Global, Some(1)).unwrap();
    assert_eq!(state, fresh);
    // Rank 9 joined under rank 5, which now occupies slot 1: 9 inherits slot 5.
    assert_eq!(state.as_seen_by(9).unwrap().slot(), 5);
}

#[test]
fn no_overflow_near_u32_max() {
    for k in [2u32, 3, 64, 1 << 16, u32::MAX] {
        let n = u32::MAX;
        let me = u32::MAX - 1;
        let mut state = RoutingState::new(k, n, me).unwrap();
        let shape = *state.shape();
        assert_eq!(state.ancestors(), shape.ancestors(me).as_slice());
        assert_eq!(state.route(0), Route::Parent(state.parent().unwrap()));
        assert_eq!(state.route(me), Route::Local);
        assert_eq!(state.route(u32::MAX), Route::Unreachable);
        // Kill my parent (unless it is the root) and a neighbour; I or someone else inherits.
        let mut dead = vec![me - 1];
        if let Some(p) = state.parent().filter(|&p| p != 0) {
            dead.push(p);
        }
        state.fail(&dead, Scope::Global, Some(1)).unwrap();
        assert!(state.parent().is_some());
        for target in [0, 1, me - 2, me] {
            assert_ne!(
                state.route(target),
                Route::Unreachable,
                "k={k} target={target}"
            );
        }
        state.grow(u32::MAX).unwrap();
        assert_eq!(state.grow(u32::MAX - 1), Err(TreeError::ShrinkNotAllowed));
        if k == 2 || k == 3 || k == 64 {
            // The root's view is small enough to build at these radices.
            let root = state.as_seen_by(0).unwrap();
            assert_eq!(root.children().len() as u32, shape.children(0).len() as u32);
            let route = root.route(me);
            assert!(matches!(route, Route::Child(_)), "k={k} {route:?}");
        }
    }
}

/// Follow routes hop by hop, each hop using its own state; returns the path.
fn deliver(
    states: &mut HashMap<Rank, RoutingState>,
    any: &RoutingState,
    from: Rank,
    to: Rank,
    max_hops: usize,
) -> Vec<Rank> {
    let mut path = vec![from];
    let mut at = from;
    loop {
        let state = states
            .entry(at)
            .or_insert_with(|| any.as_seen_by(at).unwrap());
        match state.route(to) {
            Route::Local => return path,
            Route::Parent(next) | Route::Child(next) => {
                assert!(!any.is_failed(next), "hop through failed {next}: {path:?}");
                path.push(next);
                at = next;
            }
            Route::Unreachable => panic!("{to} unreachable from {at}: {path:?}"),
        }
        assert!(
            path.len() <= max_hops + 1,
            "too many hops {from}->{to}: {path:?}"
        );
    }
}

/// A descendant of `r` (or `r` itself when it has no children): up to three steps down, each
/// to a child picked by the bits of `walk`.
fn descendant(shape: &tbon::routed::Shape, r: Rank, mut walk: u64) -> Rank {
    let mut x = r;
    for _ in 0..1 + (walk >> 1) % 3 {
        let children: Vec<Rank> = shape.children(x).collect();
        if children.is_empty() {
            break;
        }
        walk = walk.rotate_left(11) ^ 0x9e37_79b9_7f4a_7c15;
        x = children[(walk % children.len() as u64) as usize];
    }
    x
}

fn failed_set(n: u32) -> impl Strategy<Value = Vec<Rank>> {
    let max = (n / 2) as usize;
    proptest::collection::vec(1..n.max(2), 0..=max).prop_map(move |mut v| {
        v.retain(|&r| r < n);
        v.sort_unstable();
        v.dedup();
        v
    })
}

fn shape_and_failures() -> impl Strategy<Value = (u32, u32, Vec<Rank>)> {
    (
        prop_oneof![Just(2u32), Just(3), Just(4), Just(8), Just(16), Just(64)],
        1u32..5000,
    )
        .prop_flat_map(|(k, n)| (Just(k), Just(n), failed_set(n)))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn repaired_tree_is_connected_and_routable((k, n, failed) in shape_and_failures(), pairs in proptest::collection::vec((any::<u32>(), any::<u32>()), 40)) {
        let view = tree_view(k, n, &failed).unwrap();
        prop_assert_eq!(view.len(), n as usize - failed.len());
        let by_rank: HashMap<Rank, _> = view.iter().map(|v| (v.rank, v)).collect();
        // Every living rank except 0 has one living parent that lists it.
        for v in &view {
            match v.parent {
                None => prop_assert_eq!(v.rank, 0),
                Some(p) => {
                    prop_assert!(by_rank[&p].children.contains(&v.rank));
                    prop_assert_eq!(by_rank[&p].depth + 1, v.depth);
                }
            }
            for c in &v.children {
                prop_assert_eq!(by_rank[c].parent, Some(v.rank));
            }
        }
        // Every living rank is reachable from 0 along child links.
        let mut seen = BTreeSet::new();
        let mut stack = vec![0];
        while let Some(r) = stack.pop() {
            prop_assert!(seen.insert(r));
            stack.extend(by_rank[&r].children.iter().copied());
        }
        prop_assert_eq!(seen.len(), view.len());

        // Every daemon's own state agrees with the whole-tree view.
        let mut state = RoutingState::new(k, n, 0).unwrap();
        state.fail(&failed, Scope::Global, Some(7)).unwrap();
        for v in &view {
            let mine = state.as_seen_by(v.rank).unwrap();
            prop_assert_eq!(mine.parent(), v.parent);
            prop_assert_eq!(mine.children(), v.children.as_slice());
            prop_assert_eq!(mine.depth(), v.depth);
            prop_assert_eq!(mine.slot(), v.slot);
        }

        // Hop-by-hop routing between living ranks.
        let living: Vec<Rank> = view.iter().map(|v| v.rank).collect();
        let max_depth = view.iter().map(|v| v.depth).max().unwrap_or(0) as usize;
        let mut states = HashMap::new();
        for (a, b) in pairs {
            let from = living[a as usize % living.len()];
            let to = living[b as usize % living.len()];
            deliver(&mut states, &state, from, to, 2 * max_depth);
        }
    }

    /// `Descent::child_index` (the per-frame fast path of `route`) agrees with
    /// `Shape::child_toward` for any slot and target, near the top of the rank range too.
    #[test]
    fn descent_agrees_with_child_toward(k in prop_oneof![Just(2u32), Just(3), Just(7), Just(64), Just(1000)], n in prop_oneof![1u32..5000, 1u32..u32::MAX], picks in proptest::collection::vec((any::<u32>(), any::<u64>()), 64)) {
        let shape = tbon::routed::Shape::new(k, n).unwrap();
        for (a, walk) in picks {
            let r = a % n;
            // Half the targets anywhere, half a descendant of `r` (a few random steps down).
            let t = if walk % 2 == 0 { (walk >> 1) as u32 % n } else { descendant(&shape, r, walk) };
            let want = shape.child_toward(r, t).map(|(_, i)| i);
            let got = shape.descent(r).and_then(|d| d.child_index(t));
            prop_assert_eq!(got, want, "k {} n {} r {} t {}", k, n, r, t);
        }
    }

    /// Issue "Rejoin": putting failed ranks back gives exactly the tree that would exist had
    /// they never failed (given the failures that remain), for every daemon; putting all back
    /// gives the failure-free tree.
    #[test]
    fn a_restore_equals_never_having_failed((k, n, failed) in shape_and_failures(), me_pick in any::<u32>(), pick in any::<u64>()) {
        let me = me_pick % n;
        // A subset to restore, chosen bit by bit from `pick`.
        let back: Vec<Rank> = failed
            .iter()
            .enumerate()
            .filter(|(i, _)| pick.rotate_left(*i as u32) & 1 == 1)
            .map(|(_, r)| *r)
            .collect();
        let stays: Vec<Rank> = failed.iter().copied().filter(|r| !back.contains(r)).collect();
        let mut restored = RoutingState::new(k, n, me).unwrap();
        restored.fail(&failed, Scope::Global, None).unwrap();
        let status = restored.restore(&back, Scope::Global, None).unwrap();
        prop_assert_eq!(&status.restored, &back);
        let mut never = RoutingState::new(k, n, me).unwrap();
        never.fail(&stays, Scope::Global, None).unwrap();
        prop_assert_eq!(&restored, &never);
        // Every daemon's view agrees with the whole-tree view of the remaining failures.
        let view = tree_view(k, n, &stays).unwrap();
        for v in view.iter().take(64) {
            let theirs = restored.as_seen_by(v.rank).unwrap();
            prop_assert_eq!(theirs.parent(), v.parent);
            prop_assert_eq!(theirs.children(), v.children.as_slice());
            prop_assert_eq!(theirs.slot(), v.slot);
        }
        restored.restore(&stays, Scope::Global, None).unwrap();
        prop_assert_eq!(&restored, &RoutingState::new(k, n, me).unwrap());
    }

    #[test]
    fn failure_order_does_not_matter((k, n, failed) in shape_and_failures(), me_pick in any::<u32>(), seed in any::<u64>()) {
        let me = me_pick % n;
        let mut all_at_once = RoutingState::new(k, n, me).unwrap();
        all_at_once.fail(&failed, Scope::Global, None).unwrap();
        // Shuffle deterministically from the seed, then apply in small batches.
        let mut order = failed.clone();
        let mut s = seed | 1;
        for i in (1..order.len()).rev() {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            order.swap(i, (s % (i as u64 + 1)) as usize);
        }
        let mut one_by_one = RoutingState::new(k, n, me).unwrap();
        let mut previous_depth = one_by_one.depth();
        for chunk in order.chunks(1 + (s % 3) as usize) {
            let status = one_by_one.fail(chunk, Scope::Local, None).unwrap();
            // Failures only ever move a daemon up.
            prop_assert!(!status.demoted);
            if !one_by_one.is_failed(me) {
                prop_assert!(one_by_one.depth() <= previous_depth);
                prop_assert_eq!(status.promoted, one_by_one.depth() < previous_depth);
                previous_depth = one_by_one.depth();
            }
        }
        prop_assert_eq!(&one_by_one, &all_at_once);
    }
}
