//! RELM's hot paths on the sans-IO core: an origin's reliable sends up to the acknowledgement
//! that releases them (records made, handed on, released), and a destination posting an
//! in-order batch as one run.
use std::hint::black_box;
use std::time::Instant;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tbon::relm::batch::{Items, Packed, Packer};
use tbon::relm::{Control, Poster, Relm, RelmConfig, Transmit};
use tbon::rml::batch_frame::ItemRun;
use tbon::routed::RoutingState;

/// Messages per iteration: a quarter of the default window.
const RUN: u64 = 1024;

/// Takes every run whole, as the node does for a persistent receive.
struct Runs(u64);

impl Poster for Runs {
    fn post(&mut self, _origin: u32, _tag: u32, _payload: Bytes) -> bool {
        self.0 += 1;
        true
    }
    fn post_run(&mut self, run: ItemRun) -> bool {
        self.0 += u64::from(run.len());
        true
    }
}

fn benches(c: &mut Criterion) {
    let body = Bytes::from_static(&[0x5a; 64]);
    let mut g = c.benchmark_group("relm");
    g.throughput(Throughput::Elements(RUN));

    // Rank 1 sends to rank 0, its parent; rank 0's cumulative ack releases the records.
    let origin_view = RoutingState::new(2, 2, 1).expect("tree");
    let mut origin = Relm::new(1, 2, RelmConfig::default());
    let now = Instant::now();
    g.bench_function(
        "origin: 1024 sends of 64 B, then the ack that releases them",
        |b| {
            b.iter(|| {
                let mut last = 0;
                for _ in 0..RUN {
                    origin
                        .send(now, &origin_view, 0, 100, body.clone(), None)
                        .expect("window");
                }
                while let Some(t) = origin.poll_transmit() {
                    if let Transmit::Data { frame, .. } = t {
                        last = frame.uid;
                    }
                }
                let ack = Control::Ack {
                    origin: 1,
                    dst: 0,
                    upto: last,
                    life: 0,
                }
                .encode();
                let mut post = |_: u32, _: u32, _: Bytes| true;
                origin
                    .handle_control(now, &origin_view, 0, &ack, &mut post)
                    .expect("ack");
                black_box(origin.records())
            })
        },
    );

    // The same chain packed into batches of 64, posted at rank 0 as runs.
    let dst_view = RoutingState::new(2, 2, 0).expect("tree");
    let mut sender = Relm::new(1, 2, RelmConfig::default());
    let mut dst = Relm::new(0, 2, RelmConfig::default());
    g.bench_function(
        "destination: 1024 messages of 64 B in batches of 64, posted as runs",
        |b| {
            b.iter(|| {
                let mut packer = Packer::with_frame_max(1 << 20);
                let mut batches = Vec::new();
                for _ in 0..RUN {
                    sender
                        .send(now, &origin_view, 0, 100, body.clone(), None)
                        .expect("window");
                }
                let mut n = 0;
                while let Some(t) = sender.poll_transmit() {
                    if let Transmit::Data { to, frame } = t {
                        batches.extend(packer.push(to, frame));
                        n += 1;
                        if n % 64 == 0 {
                            batches.extend(packer.finish());
                        }
                    }
                }
                batches.extend(packer.finish());
                let mut runs = Runs(0);
                for p in batches {
                    if let Packed::Batch { payload, .. } = p {
                        let items = Items::new(payload, 1, 0, |_| true).expect("batch");
                        dst.handle_batch(now, &dst_view, 1, items, &mut runs)
                            .expect("taken");
                    }
                }
                // The destination's ack releases the sender's records for the next iteration.
                while let Some(t) = dst.poll_transmit() {
                    if let Transmit::Control { control, .. } = t {
                        let mut post = |_: u32, _: u32, _: Bytes| true;
                        sender
                            .handle_control(now, &origin_view, 0, &control.encode(), &mut post)
                            .expect("ack");
                    }
                }
                black_box(runs.0)
            })
        },
    );
    g.finish();
}

criterion_group!(relm, benches);
criterion_main!(relm);
