//! Route lookups and single-failure repairs at n = 100,000, k = 64, with 1% of ranks failed.
use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use tbon::Rank;
use tbon::routed::{RoutingState, Scope};

const SIZE: u32 = 100_000;
const RADIX: u32 = 64;

/// A deterministic xorshift stream, so every run measures the same tree.
fn ranks(seed: u64) -> impl Iterator<Item = Rank> {
    let mut s = seed;
    std::iter::repeat_with(move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % u64::from(SIZE - 1)) as Rank + 1
    })
}

/// Daemon `me` knowing 1% of the ranks failed (never itself); also returns living targets.
fn setup(me: Rank) -> (RoutingState, Vec<Rank>) {
    let failed: Vec<Rank> = ranks(0x9e37_79b9_7f4a_7c15)
        .filter(|&r| r != me)
        .take((SIZE / 100) as usize)
        .collect();
    let mut state = RoutingState::new(RADIX, SIZE, me).expect("valid shape");
    state
        .fail(&failed, Scope::Global, Some(1))
        .expect("valid failures");
    let targets = ranks(7)
        .filter(|&r| !state.is_failed(r))
        .take(1024)
        .collect();
    (state, targets)
}

fn bench_route(c: &mut Criterion) {
    for me in [0, 1_234, 77_777] {
        let (state, targets) = setup(me);
        let mut i = 0;
        c.bench_function(&format!("route/n100k_k64_1pct_failed/me{me}"), |b| {
            b.iter(|| {
                i = (i + 1) % targets.len();
                black_box(state.route(black_box(targets[i])))
            })
        });
    }
}

fn bench_repair(c: &mut Criterion) {
    let (state, _) = setup(1_234);
    let victims: Vec<Rank> = ranks(99)
        .filter(|&r| r != 1_234 && !state.is_failed(r))
        .take(256)
        .collect();
    let mut i = 0;
    c.bench_function("clone_and_fail_one/n100k_k64_1pct_failed", |b| {
        b.iter_batched(
            || {
                i = (i + 1) % victims.len();
                victims[i]
            },
            |victim| {
                let mut next = state.clone();
                black_box(next.fail(&[victim], Scope::Local, None).expect("valid"))
            },
            BatchSize::SmallInput,
        )
    });
    c.bench_function("clone_only/n100k_k64_1pct_failed", |b| {
        b.iter(|| black_box(state.clone()))
    });
}

criterion_group!(benches, bench_route, bench_repair);
criterion_main!(benches);
