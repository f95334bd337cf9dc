//! Frame encode (send queue: push, io_slices, advance) and decode (FrameDecoder) of 64-byte
//! and 64 KiB payloads, and the bare 40-byte header encode/decode.
use std::hint::black_box;
use std::io::IoSlice;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tbon::oob::{FrameDecoder, HEADER_LEN, Header, Kind, SendQueue};

const BATCH: usize = 1024;

fn header(len: usize) -> Header {
    Header {
        kind: Kind::Msg,
        origin: 1,
        dst: 0,
        tag: 100,
        epoch: 0,
        seq: 7,
        len: len as u32,
        lives: 0,
    }
}

/// One batch of frames as the wire carries them.
fn wire(payload: usize, n: usize) -> Vec<u8> {
    let mut q = SendQueue::new(usize::MAX);
    let body = Bytes::from(vec![0x5a; payload]);
    for _ in 0..n {
        q.push(&header(payload), body.clone()).expect("room");
    }
    let mut out = Vec::new();
    while !q.is_empty() {
        let mut iov = [IoSlice::new(&[]); 64];
        let k = q.io_slices(&mut iov, true);
        let mut w = 0;
        for s in &iov[..k] {
            out.extend_from_slice(s);
            w += s.len();
        }
        q.advance(w);
    }
    out
}

fn benches(c: &mut Criterion) {
    let h = header(64);
    c.bench_function("header encode", |b| b.iter(|| black_box(&h).encode()));
    let raw = h.encode();
    c.bench_function("header decode", |b| {
        b.iter(|| Header::decode(black_box(&raw)))
    });

    for payload in [64usize, 64 * 1024] {
        let n = if payload == 64 { BATCH } else { 16 };
        let mut g = c.benchmark_group(format!("frame {payload} B"));
        g.throughput(Throughput::Elements(n as u64));
        let body = Bytes::from(vec![0x5a; payload]);
        g.bench_function("encode (push + io_slices + advance)", |b| {
            let mut q = SendQueue::new(usize::MAX);
            b.iter(|| {
                for _ in 0..n {
                    q.push(&header(payload), body.clone()).expect("room");
                }
                while !q.is_empty() {
                    let mut iov = [IoSlice::new(&[]); 64];
                    let k = q.io_slices(&mut iov, true);
                    let w: usize = iov[..k].iter().map(|s| s.len()).sum();
                    q.advance(w);
                }
            })
        });
        let bytes = wire(payload, n);
        assert_eq!(bytes.len(), n * (HEADER_LEN + payload));
        g.bench_function("decode (read_space + commit + next_frame)", |b| {
            let mut d = FrameDecoder::new(u32::MAX);
            b.iter(|| {
                let mut off = 0;
                let mut got = 0;
                while off < bytes.len() {
                    let space = d.read_space();
                    let k = space.len().min(bytes.len() - off);
                    space[..k].copy_from_slice(&bytes[off..off + k]);
                    d.commit(k);
                    off += k;
                    while let Ok(Some(f)) = d.next_frame() {
                        black_box(f);
                        got += 1;
                    }
                }
                assert_eq!(got, n);
            })
        });
        g.finish();
    }
}

criterion_group!(frame, benches);
criterion_main!(frame);
