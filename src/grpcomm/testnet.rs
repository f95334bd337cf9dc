//! A tiny deterministic network of daemons for the collectives' tests.
//!
//! Every daemon has a `RoutingState` and the three cores (xcast, allgather, group). Frames are encoded with the real wire
//! format and decoded on arrival; each directed link is FIFO; which link delivers next is chosen
//! by a seeded xorshift. A crash removes a daemon and the frames addressed to it (and, unless
//! `leak` is set, the frames it had in flight); every survivor then calls `fail` and hands the
//! status to its cores, all at once (`Repairs::Atomic`) or each at a random later step
//! (`Repairs::Staggered`, as when daemons learn of a failure at different times).
use super::wire::{AllgatherMsg, AllgatherResult, GroupMsg, XcastMsg};
use super::{
    Allgather, AllgatherEvent, GroupEvent, GroupFailure, GroupGather, GroupOp, Xcast, XcastEvent,
    XcastLimits,
};
use crate::Rank;
use crate::routed::{RoutingState, Scope};
use bytes::Bytes;
use std::collections::VecDeque;

/// The xcast tag the tests use to carry allgather results.
pub const TAG_RESULT: u32 = 7;

/// Route `log` to the test output (`RUST_LOG=info cargo test --lib grpcomm -- --nocapture`
/// shows each batch's totals).
pub fn init_log() {
    let _ = env_logger::builder().is_test(true).try_init();
}

/// The seeds each simulated batch runs: 300, or `TBON_SIM_SEEDS` (a count, or `start..end`)
/// to search further or replay one failure.
pub fn seeds() -> std::ops::Range<u64> {
    match std::env::var("TBON_SIM_SEEDS") {
        Ok(v) => match v.split_once("..") {
            Some((a, b)) => a.parse().unwrap()..b.parse().unwrap(),
            None => 0..v.parse().unwrap(),
        },
        Err(_) => 0..300,
    }
}

/// xorshift64* seeded through splitmix64.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// True with probability `num / den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.next() % den < num
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> Option<T> {
        if items.is_empty() {
            None
        } else {
            Some(items[self.below(items.len())])
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repairs {
    Atomic,
    Staggered,
}

#[derive(Debug, Clone)]
pub enum Frame {
    X(Bytes),
    A(Bytes),
    G(Bytes),
}

pub struct Node {
    pub routing: RoutingState,
    pub xcast: Xcast,
    pub ag: Allgather,
    pub alive: bool,
    /// (op, originator, tag, payload) in delivery order.
    pub delivered: Vec<(u64, Rank, u32, Bytes)>,
    /// (request, op).
    pub completed: Vec<(u64, u64)>,
    pub refused: Vec<u64>,
    /// (request, payload) of every successful `originate`.
    pub originated: Vec<(u64, Bytes)>,
    pub ag_done: Vec<AllgatherResult>,
    pub group: GroupGather,
    /// Group collectives ended here, in order.
    pub group_done: Vec<(GroupOp, Result<AllgatherResult, GroupFailure>)>,
    /// Group frames received.
    pub group_frames: u64,
    /// Failures this daemon has not learnt yet (staggered repairs).
    pub pending_repairs: VecDeque<Vec<Rank>>,
}

pub struct Sim {
    pub rng: Rng,
    pub size: u32,
    pub radix: u32,
    pub nodes: Vec<Node>,
    pub inflight: Vec<(Rank, Rank, Frame)>,
    pub repairs: Repairs,
    /// Keep a random prefix of each link out of a crashed daemon instead of dropping it all.
    pub leak: bool,
    pub delivered_frames: u64,
    pub crashed: Vec<Rank>,
    /// Results rank 0 could not broadcast yet (xcast busy).
    pub results_to_send: VecDeque<Bytes>,
}

impl Sim {
    pub fn new(seed: u64, size: u32, radix: u32, repairs: Repairs) -> Self {
        Sim::with_limits(seed, size, radix, repairs, XcastLimits::default())
    }

    pub fn with_limits(
        seed: u64,
        size: u32,
        radix: u32,
        repairs: Repairs,
        limits: XcastLimits,
    ) -> Self {
        let base = RoutingState::new(radix, size, 0).unwrap();
        let nodes = (0..size)
            .map(|r| {
                let routing = base.as_seen_by(r).unwrap();
                Node {
                    xcast: Xcast::with_limits(&routing, limits),
                    ag: Allgather::new(&routing),
                    group: GroupGather::new(&routing),
                    group_done: Vec::new(),
                    group_frames: 0,
                    routing,
                    alive: true,
                    delivered: Vec::new(),
                    completed: Vec::new(),
                    refused: Vec::new(),
                    originated: Vec::new(),
                    ag_done: Vec::new(),
                    pending_repairs: VecDeque::new(),
                }
            })
            .collect();
        Sim {
            rng: Rng::new(seed),
            size,
            radix,
            nodes,
            inflight: Vec::new(),
            repairs,
            leak: false,
            delivered_frames: 0,
            crashed: Vec::new(),
            results_to_send: VecDeque::new(),
        }
    }

    pub fn node(&self, r: Rank) -> &Node {
        &self.nodes[r as usize]
    }

    pub fn alive(&self) -> Vec<Rank> {
        (0..self.size).filter(|&r| self.node(r).alive).collect()
    }

    /// Originate a broadcast at `r`, payload "r:request".
    pub fn originate(&mut self, r: Rank) {
        let node = &mut self.nodes[r as usize];
        let request = node.xcast.outstanding() as u64; // only to vary the payload
        let payload = Bytes::from(format!("{r}:{}:{request}", node.originated.len()));
        if let Ok(id) = node.xcast.originate(100, payload.clone()) {
            node.originated.push((id, payload));
        }
        self.drain(r);
    }

    /// One delivery or one staggered repair; `false` when there is nothing left to do.
    pub fn step(&mut self) -> bool {
        let pending: Vec<Rank> = if self.repairs == Repairs::Staggered {
            (0..self.size)
                .filter(|&r| !self.node(r).pending_repairs.is_empty())
                .collect()
        } else {
            Vec::new()
        };
        let deliver = !self.inflight.is_empty() && (pending.is_empty() || self.rng.chance(7, 8));
        if deliver {
            let i = self.rng.below(self.inflight.len());
            let (from, to, _) = self.inflight[i];
            let j = self
                .inflight
                .iter()
                .position(|(f, t, _)| *f == from && *t == to)
                .unwrap();
            let (from, to, frame) = self.inflight.remove(j);
            self.deliver(from, to, frame);
            true
        } else if let Some(r) = self.rng.pick(&pending) {
            let victims = self.nodes[r as usize].pending_repairs.pop_front().unwrap();
            self.repair(r, &victims);
            true
        } else {
            false
        }
    }

    /// Deliver the oldest frame whose link satisfies `pred`; `false` if there is none.
    pub fn deliver_first(&mut self, pred: impl Fn(Rank, Rank) -> bool) -> bool {
        match self.inflight.iter().position(|(f, t, _)| pred(*f, *t)) {
            Some(j) => {
                let (from, to, frame) = self.inflight.remove(j);
                self.deliver(from, to, frame);
                true
            }
            None => false,
        }
    }

    /// The tree as it is once every crash so far is known.
    pub fn truth(&self) -> RoutingState {
        let mut t = RoutingState::new(self.radix, self.size, 0).unwrap();
        t.fail(&self.crashed, Scope::Global, None).unwrap();
        t
    }

    fn deliver(&mut self, from: Rank, to: Rank, frame: Frame) {
        if !self.node(to).alive {
            return;
        }
        self.delivered_frames += 1;
        let size = self.size;
        let node = &mut self.nodes[to as usize];
        match frame {
            Frame::X(bytes) => {
                let msg = XcastMsg::decode(size, bytes).expect("xcast frame decodes");
                node.xcast.handle_msg(from, msg);
            }
            Frame::A(bytes) => {
                let msg = AllgatherMsg::decode(size, bytes).expect("allgather frame decodes");
                node.ag.handle_msg(from, msg);
            }
            Frame::G(bytes) => {
                let msg = GroupMsg::decode(size, bytes).expect("group frame decodes");
                node.group_frames += 1;
                node.group.handle_msg(&node.routing, from, msg);
            }
        }
        self.drain(to);
    }

    /// Crash `victims` together.
    pub fn crash(&mut self, victims: &[Rank]) {
        for &v in victims {
            assert_ne!(v, 0);
            self.nodes[v as usize].alive = false;
            self.crashed.push(v);
        }
        let leak = self.leak;
        let mut kept: Vec<(Rank, Rank, Frame)> = Vec::new();
        let mut cut: Vec<(Rank, Rank)> = Vec::new();
        for (f, t, frame) in std::mem::take(&mut self.inflight) {
            if victims.contains(&t) {
                continue;
            }
            if victims.contains(&f) {
                // Keep a random prefix of each link out of a victim (frames already on the
                // wire when it died), or nothing.
                if !leak || cut.contains(&(f, t)) || self.rng.chance(1, 3) {
                    if !cut.contains(&(f, t)) {
                        cut.push((f, t));
                    }
                    continue;
                }
            }
            kept.push((f, t, frame));
        }
        self.inflight = kept;
        for r in self.alive() {
            match self.repairs {
                Repairs::Atomic => self.repair(r, victims),
                Repairs::Staggered => self.nodes[r as usize]
                    .pending_repairs
                    .push_back(victims.to_vec()),
            }
        }
    }

    /// Tree messages lost between living `a` and `b` although both live. With `reconnect`: a
    /// random prefix of what is in flight each way (written to a connection that broke; the
    /// rest was still queued and goes on the new one), then both ends re-state. Without: a
    /// random subset of the tree messages from `a` to `b` (dropped at a full queue), then `a`
    /// re-states. Requests, dones and refusals travel reliably in the driver: never lost.
    pub fn lose_link(&mut self, a: Rank, b: Rank, reconnect: bool) {
        let reliable =
            |f: &Frame| matches!(f, Frame::X(bytes) if matches!(bytes.first(), Some(1 | 6 | 7)));
        let mut keep = Vec::with_capacity(self.inflight.len());
        let mut prefix = [
            self.rng.below(self.inflight.len() + 1),
            self.rng.below(self.inflight.len() + 1),
        ];
        for (f, t, frame) in std::mem::take(&mut self.inflight) {
            let dir = if (f, t) == (a, b) {
                Some(0)
            } else if (f, t) == (b, a) {
                Some(1)
            } else {
                None
            };
            let lost = match dir {
                Some(_) if reliable(&frame) => false,
                Some(d) if reconnect => {
                    let left = &mut prefix[d];
                    let lost = *left > 0;
                    *left = left.saturating_sub(1);
                    lost
                }
                Some(0) => self.rng.chance(1, 2),
                _ => false,
            };
            if !lost {
                keep.push((f, t, frame));
            }
        }
        self.inflight = keep;
        self.link_up(a, b);
        if reconnect {
            self.link_up(b, a);
        }
    }

    fn link_up(&mut self, me: Rank, peer: Rank) {
        let node = &mut self.nodes[me as usize];
        node.xcast.handle_link_up(peer);
        node.ag.handle_link_up(peer);
        node.group.handle_link_up(peer);
        self.drain(me);
    }

    fn repair(&mut self, r: Rank, victims: &[Rank]) {
        let node = &mut self.nodes[r as usize];
        let status = node.routing.fail(victims, Scope::Global, None).unwrap();
        node.xcast.handle_repair(&status);
        node.ag.handle_repair(&status);
        node.group.handle_repair(&status);
        self.drain(r);
    }

    /// Drain both cores of `r` (transmits, then events, until neither has anything).
    pub fn drain(&mut self, r: Rank) {
        let mut completions: Vec<u64> = Vec::new();
        loop {
            let node = &mut self.nodes[r as usize];
            let mut progress = false;
            // Notices first, as they came before `poll_notice` was split off (the driver sends
            // them over RELM, a channel of their own).
            while let Some(t) = node
                .xcast
                .poll_notice()
                .or_else(|| node.xcast.poll_transmit())
            {
                progress = true;
                if let XcastMsg::Done { op, .. } = t.msg {
                    completions.push(op);
                }
                // Header and shared payload, as the driver sends them.
                let (head, payload) = t.msg.encode_parts();
                let mut frame = head.to_vec();
                if let Some(p) = payload {
                    frame.extend_from_slice(&p);
                }
                self.inflight.push((r, t.to, Frame::X(Bytes::from(frame))));
            }
            while let Some(t) = node.ag.poll_transmit() {
                progress = true;
                self.inflight.push((r, t.to, Frame::A(t.msg.encode())));
            }
            while let Some(t) = node.group.poll_transmit(&node.routing) {
                progress = true;
                self.inflight.push((r, t.to, Frame::G(t.msg.encode())));
            }
            while let Some(GroupEvent::Done { op, result }) = node.group.poll_event() {
                progress = true;
                node.group_done.push((op, result));
            }
            while let Some(e) = node.xcast.poll_event() {
                progress = true;
                match e {
                    XcastEvent::Deliver {
                        first,
                        op,
                        originator,
                        tag,
                        payload,
                        parts: _,
                    } => {
                        assert_eq!(
                            first,
                            node.delivered.last().map_or(0, |d| d.0) + 1,
                            "rank {r} delivers in order, once"
                        );
                        node.delivered.push((op, originator, tag, payload.clone()));
                        if tag == TAG_RESULT {
                            node.ag
                                .handle_result_bytes(payload)
                                .expect("result decodes");
                        }
                    }
                    XcastEvent::Completed { request, op } => {
                        if r == 0 {
                            completions.push(op);
                        }
                        node.completed.push((request, op));
                    }
                    XcastEvent::Refused { request } => node.refused.push(request),
                }
            }
            while let Some(e) = node.ag.poll_event() {
                progress = true;
                match e {
                    AllgatherEvent::ResultReady { result } => {
                        assert_eq!(r, 0);
                        self.results_to_send.push_back(result.encode());
                    }
                    AllgatherEvent::AllgatherDone { result } => node.ag_done.push(result),
                    AllgatherEvent::AllgatherLost { id } => {
                        panic!("rank {r}: allgather {id} lost in a first life")
                    }
                }
            }
            if r == 0 && !self.results_to_send.is_empty() {
                let before = self.results_to_send.len();
                self.retry_results();
                progress |= self.results_to_send.len() != before;
            }
            if !progress {
                break;
            }
        }
        // Completion means every daemon alive has delivered the operation.
        for op in completions {
            for n in self.nodes.iter().filter(|n| n.alive) {
                assert!(
                    n.delivered.last().map_or(0, |d| d.0) >= op,
                    "op {op} completed before rank {} delivered it",
                    n.routing.me()
                );
            }
        }
    }

    /// Rank 0 broadcasts the results it could not broadcast before (xcast was busy).
    fn retry_results(&mut self) {
        while let Some(bytes) = self.results_to_send.pop_front() {
            match self.nodes[0].xcast.originate(TAG_RESULT, bytes.clone()) {
                Ok(request) => self.nodes[0].originated.push((request, bytes)),
                Err(_) => {
                    self.results_to_send.push_front(bytes);
                    break;
                }
            }
        }
    }

    /// Run until nothing is in flight and every repair is applied.
    pub fn settle(&mut self) {
        let mut guard = 0u64;
        while self.step() {
            guard += 1;
            assert!(guard < 10_000_000, "the network does not settle");
        }
        assert!(
            self.results_to_send.is_empty(),
            "rank 0 cannot broadcast a result while the network is idle"
        );
    }

    /// A victim for a crash: a living rank other than 0, preferring one with children
    /// (`interior`).
    pub fn pick_victim(&mut self, interior: bool) -> Option<Rank> {
        let alive: Vec<Rank> = self.alive().into_iter().filter(|&r| r != 0).collect();
        if interior {
            let inner: Vec<Rank> = alive
                .iter()
                .copied()
                .filter(|&r| !self.node(r).routing.children().is_empty())
                .collect();
            if let Some(v) = self.rng.pick(&inner) {
                return Some(v);
            }
        }
        self.rng.pick(&alive)
    }
}
