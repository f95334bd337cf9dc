//! Receive matching: an arriving message against posted receives (specific rank, wildcard),
//! and the unmatched path (held, then evicted at the bound).
use std::hint::black_box;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use tbon::rml::{Matcher, Message, Peer};

fn msg(origin: u32, tag: u32) -> Message {
    Message {
        origin,
        tag,
        payload: Bytes::from_static(b"0123456789abcdef"),
    }
}

fn benches(c: &mut Criterion) {
    let mut m = Matcher::new(1024);
    // A realistic table: 64 specific receives and a few wildcards.
    for r in 0..64 {
        m.post(Peer::Rank(r), 100, true).expect("post");
    }
    m.post(Peer::Any, 200, true).expect("post");
    c.bench_function("match: posted for the origin", |b| {
        b.iter(|| m.handle_message(black_box(msg(17, 100))))
    });
    c.bench_function("match: wildcard", |b| {
        b.iter(|| m.handle_message(black_box(msg(17, 200))))
    });
    c.bench_function("match: nothing posted (held, oldest evicted)", |b| {
        b.iter(|| m.handle_message(black_box(msg(17, 300))))
    });
}

criterion_group!(matcher, benches);
criterion_main!(matcher);
