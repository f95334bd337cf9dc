//! Deterministic tests of RELM on a tiny in-memory tree: FIFO links, a virtual clock, crashes
//! by hand. The seeded, swarm-tested version of this is `src/sim/`.

use super::steady::DataFrame;
use super::*;
use crate::rml::Tag;
use crate::routed::{RoutingState, Scope};
use bytes::Bytes;
use std::collections::BTreeMap;

struct Node {
    routing: RoutingState,
    /// Peers this node reaches over a direct link.
    direct: Vec<Rank>,
    /// Every rank's life as this node knows it (rejoin).
    lives: Vec<u16>,
    relm: Relm,
    got: Vec<(Rank, Tag, Bytes)>,
    done: Vec<(u64, Result<(), SendError>)>,
    alive: bool,
}

/// A node's tree plus its direct links, as the daemon's `node::reliable::Paths` has them.
struct View<'a> {
    routing: &'a RoutingState,
    direct: &'a [Rank],
    lives: &'a [u16],
}

impl Topology for View<'_> {
    fn me(&self) -> Rank {
        self.routing.me()
    }
    fn next_hop(&self, target: Rank) -> Option<Rank> {
        Topology::next_hop(self.routing, target)
    }
    fn is_failed(&self, r: Rank) -> bool {
        self.routing.is_failed(r)
    }
    fn depth(&self) -> u32 {
        self.routing.depth()
    }
    fn parent(&self) -> Option<Rank> {
        self.routing.parent()
    }
    fn children(&self) -> &[Rank] {
        self.routing.children()
    }
    fn direct(&self, target: Rank) -> bool {
        self.direct.contains(&target)
    }
    fn life(&self, r: Rank) -> u16 {
        self.lives.get(r as usize).copied().unwrap_or(0)
    }
}

struct Net {
    nodes: Vec<Node>,
    links: BTreeMap<(Rank, Rank), VecDeque<Transmit>>,
    now: Instant,
    /// Links whose frames vanish (a dying connection).
    lossy: Vec<(Rank, Rank)>,
}

impl Net {
    fn new(radix: u32, size: u32) -> Net {
        let nodes = (0..size)
            .map(|r| Node {
                routing: RoutingState::new(radix, size, r).unwrap(),
                direct: Vec::new(),
                lives: vec![0; size as usize],
                relm: Relm::new(r, size, RelmConfig::default()),
                got: Vec::new(),
                done: Vec::new(),
                alive: true,
            })
            .collect();
        Net {
            nodes,
            links: BTreeMap::new(),
            now: Instant::now(),
            lossy: Vec::new(),
        }
    }

    fn send(&mut self, from: Rank, dst: Rank, seq: u64) -> Result<(), SendError> {
        let n = &mut self.nodes[from as usize];
        let view = View {
            routing: &n.routing,
            direct: &n.direct,
            lives: &n.lives,
        };
        let r = n.relm.send(
            self.now,
            &view,
            dst,
            100,
            Bytes::from(seq.to_be_bytes().to_vec()),
            Some(seq),
        );
        self.pump(from);
        r
    }

    fn pump(&mut self, r: Rank) {
        let n = &mut self.nodes[r as usize];
        while let Some(t) = n.relm.poll_transmit() {
            let to = match &t {
                Transmit::Data { to, .. } | Transmit::Control { to, .. } => *to,
            };
            if self.lossy.contains(&(r, to)) {
                continue;
            }
            self.links.entry((r, to)).or_default().push_back(t);
        }
        while let Some(Event::Completed { token, result }) = n.relm.poll_event() {
            n.done.push((token, result));
        }
    }

    /// Delivers frames until every link is empty.
    fn run(&mut self) {
        for _ in 0..100_000 {
            let Some((&(from, to), _)) = self.links.iter().find(|(_, q)| !q.is_empty()) else {
                return;
            };
            let t = self
                .links
                .get_mut(&(from, to))
                .unwrap()
                .pop_front()
                .unwrap();
            if !self.nodes[to as usize].alive {
                continue;
            }
            self.deliver(from, to, t);
            self.pump(to);
        }
        panic!("the network did not settle");
    }

    /// Hands one frame from `from` to `to`, then moves `to`'s output onto the links.
    fn deliver(&mut self, from: Rank, to: Rank, t: Transmit) {
        let n = &mut self.nodes[to as usize];
        let view = View {
            routing: &n.routing,
            direct: &n.direct,
            lives: &n.lives,
        };
        let got = &mut n.got;
        let mut post = |o: Rank, tag: Tag, p: Bytes| {
            got.push((o, tag, p));
            true
        };
        match t {
            Transmit::Data { frame, .. } => n
                .relm
                .handle_data(self.now, &view, from, frame, &mut post)
                .unwrap(),
            Transmit::Control { control, .. } => n
                .relm
                .handle_control(self.now, &view, from, &control.encode(), &mut post)
                .unwrap(),
        }
        self.pump(to);
    }

    /// Advances the clock by `ms`, firing timers, and settles.
    fn advance(&mut self, ms: u64) {
        let end = self.now + Duration::from_millis(ms);
        for _ in 0..10_000 {
            let next = self
                .nodes
                .iter()
                .filter(|n| n.alive)
                .filter_map(|n| n.relm.poll_timeout())
                .min();
            match next {
                Some(t) if t <= end => {
                    self.now = self.now.max(t);
                    for r in 0..self.nodes.len() {
                        if self.nodes[r].alive {
                            let n = &mut self.nodes[r];
                            let view = View {
                                routing: &n.routing,
                                direct: &n.direct,
                                lives: &n.lives,
                            };
                            n.relm.handle_timeout(self.now, &view);
                            self.pump(r as Rank);
                        }
                    }
                    self.run();
                }
                _ => break,
            }
        }
        self.now = end;
    }

    fn crash(&mut self, dead: Rank, scope: Scope) {
        self.nodes[dead as usize].alive = false;
        self.links.retain(|(f, t), _| *f != dead && *t != dead);
        for r in 0..self.nodes.len() {
            if !self.nodes[r].alive {
                continue;
            }
            let n = &mut self.nodes[r];
            let status = n.routing.fail(&[dead], scope, None).unwrap();
            n.relm.handle_repair(self.now, &n.routing, &status);
            self.pump(r as Rank);
        }
    }

    fn seqs(&self, at: Rank, from: Rank) -> Vec<u64> {
        self.nodes[at as usize]
            .got
            .iter()
            .filter(|(o, _, _)| *o == from)
            .map(|(_, _, p)| u64::from_be_bytes(p[..8].try_into().unwrap()))
            .collect()
    }

    fn all_idle(&self) -> bool {
        self.nodes
            .iter()
            .filter(|n| n.alive)
            .all(|n| n.relm.is_idle())
    }
}

#[test]
fn delivers_in_order_and_releases_everything() {
    let mut net = Net::new(2, 15);
    for s in 0..200 {
        net.send(7, 14, s).unwrap();
        net.send(14, 7, s).unwrap();
    }
    net.run();
    assert_eq!(net.seqs(14, 7), (0..200).collect::<Vec<_>>());
    assert_eq!(net.seqs(7, 14), (0..200).collect::<Vec<_>>());
    assert_eq!(net.nodes[7].done.len(), 200);
    assert!(net.nodes[7].done.iter().all(|(_, r)| r.is_ok()));
    // Hop caches expire; nothing is left anywhere.
    net.advance(2_000);
    assert!(net.all_idle());
    assert_eq!(net.nodes[7].relm.stats().retransmits, 0);
}

#[test]
fn survives_an_interior_crash_with_frames_in_flight() {
    // 0 -> {1, 2}; 1 -> {3, 5}; 3 -> {7, 11}; 5 -> {9, 13}. Rank 1 carries 7 -> 9.
    let mut net = Net::new(2, 15);
    for s in 0..50 {
        net.send(7, 9, s).unwrap();
    }
    // Some frames arrive, then rank 1 dies with the rest in its hands.
    for _ in 0..60 {
        let key = *net.links.keys().find(|k| !net.links[k].is_empty()).unwrap();
        let t = net.links.get_mut(&key).unwrap().pop_front().unwrap();
        net.deliver(key.0, key.1, t);
    }
    net.crash(1, Scope::Local);
    net.run();
    net.crash(1, Scope::Global);
    net.run();
    net.advance(40_000);
    assert_eq!(net.seqs(9, 7), (0..50).collect::<Vec<_>>());
    assert_eq!(net.nodes[7].done.len(), 50);
    net.advance(2_000);
    assert!(net.all_idle());
}

#[test]
fn lost_frames_are_retransmitted_and_copies_discarded() {
    let mut net = Net::new(2, 7);
    net.lossy.push((1, 3));
    for s in 0..10 {
        net.send(3, 4, s).unwrap();
    }
    net.run();
    // 3 -> 1 -> 0 -> 2 -> 4. Acks from 4 back to 3 are lost: 3 retransmits; 4 discards the copies and re-acks.
    assert_eq!(net.seqs(4, 3), (0..10).collect::<Vec<_>>());
    net.lossy.clear();
    net.advance(5_000);
    assert_eq!(net.seqs(4, 3), (0..10).collect::<Vec<_>>());
    assert_eq!(net.nodes[3].done.len(), 10);
    assert!(net.nodes[4].relm.stats().duplicates >= 10);
    net.advance(2_000);
    assert!(net.all_idle());
}

#[test]
fn a_dead_destination_fails_the_completions() {
    let mut net = Net::new(2, 7);
    // 0 -> {1, 2}; 1 -> {3, 5}: 3 -> 5 crosses 1, and 1 -> 5 loses everything.
    net.lossy.push((1, 5));
    for s in 0..5 {
        net.send(3, 5, s).unwrap();
    }
    net.run();
    net.crash(5, Scope::Global);
    net.run();
    assert_eq!(net.nodes[3].done.len(), 5, "{:?}", net.nodes[3].done);
    assert!(
        net.nodes[3]
            .done
            .iter()
            .all(|(_, r)| *r == Err(SendError::NodeDown(5))),
        "{:?}",
        net.nodes[3].done
    );
    assert_eq!(net.send(3, 5, 9), Err(SendError::NodeDown(5)));
    net.advance(2_000);
    assert!(net.all_idle());
}

#[test]
fn updates_from_a_non_neighbour_or_with_a_stale_depth_are_ignored() {
    let mut net = Net::new(2, 7);
    let n = &mut net.nodes[3];
    let mut post = |_: Rank, _: Tag, _: Bytes| true;
    let upd = Control::LinkUpdate {
        depth: 0,
        offers: Vec::new(),
    };
    // 0 -> {1, 2}; 1 -> {3, 5}. Rank 1 is 3's parent at depth 1, so depth 0 is stale.
    n.relm
        .handle_control(net.now, &n.routing, 1, &upd.encode(), &mut post)
        .unwrap();
    let ack = Control::Ack {
        origin: 3,
        dst: 4,
        upto: 0,
        life: 0,
    };
    // Rank 2 is not 3's neighbour on the path from 3 to 4 (3 -> 1 -> 0 -> 2 -> 4).
    n.relm
        .handle_control(net.now, &n.routing, 2, &ack.encode(), &mut post)
        .unwrap();
    assert_eq!(n.relm.stats().ignored, 2);
}

#[test]
fn an_ack_of_a_previous_life_of_the_origin_is_ignored() {
    // 0 -> {1, 2}. Rank 1 was admitted back once: its new life numbers from uid 0 again. An
    // ack of its previous life's chain to 2, still in flight, reaches rank 0 and rank 1 itself
    // (regression seed 31828).
    let mut net = Net::new(2, 3);
    for n in &mut net.nodes {
        n.lives[1] = 1;
    }
    net.lossy.push((0, 2));
    net.send(1, 2, 7).unwrap();
    net.run();
    let stale = Control::Ack {
        origin: 1,
        dst: 2,
        upto: 3,
        life: 0,
    };
    for (at, from) in [(0, 2), (1, 0)] {
        net.deliver(
            from,
            at,
            Transmit::Control {
                to: at,
                control: stale.clone(),
            },
        );
    }
    assert!(
        net.links.values().all(|q| q.is_empty()),
        "the stale ack went on"
    );
    assert_eq!(net.nodes[0].relm.stats().ignored, 1);
    assert_eq!(net.nodes[1].relm.stats().ignored, 1);
    assert!(net.nodes[1].done.is_empty(), "{:?}", net.nodes[1].done);
    // The message itself is still delivered, and its ack, of the new life, completes it.
    net.lossy.clear();
    net.advance(5_000);
    assert_eq!(net.seqs(2, 1), vec![7]);
    assert_eq!(net.nodes[1].done, vec![(7, Ok(()))]);
}

#[test]
fn a_restarted_origins_chain_starts_afresh_where_its_death_was_never_learnt() {
    // 0 -> {1, 2}. Rank 2 posted rank 1's uid 0; rank 1 restarts (a fresh RELM, numbering
    // from 0 again) and is known everywhere under its next life, with no repair in between
    // (the purge at its death would have dropped the watermark). Its new uid 0 is a new
    // message, not a copy of the old one.
    let mut net = Net::new(2, 3);
    net.send(1, 2, 7).unwrap();
    net.run();
    assert_eq!(net.seqs(2, 1), vec![7]);
    net.nodes[1].relm = Relm::new(1, 3, RelmConfig::default());
    net.nodes[1].done.clear();
    for n in &mut net.nodes {
        n.lives[1] = 1;
    }
    net.send(1, 2, 8).unwrap();
    net.run();
    assert_eq!(net.seqs(2, 1), vec![7, 8]);
    assert_eq!(net.nodes[1].done, vec![(8, Ok(()))]);
    assert_eq!(net.nodes[2].relm.stats().duplicates, 0);
}

#[test]
fn the_window_is_bounded() {
    let mut net = Net::new(2, 3);
    net.lossy.push((0, 1));
    let cap = RelmConfig::default().unacked_max as u64;
    for s in 0..cap {
        net.send(1, 2, s).unwrap();
        net.links.clear();
    }
    assert!(matches!(net.send(1, 2, cap), Err(SendError::Busy(_))));
}

#[test]
fn a_replay_from_a_requested_record_keeps_the_tag_and_predecessor() {
    // 0 -> {1, 2}; 1 -> {3, 5}; 2 -> {4, 6}: 3 -> 4 crosses 1, 0, 2. Rank 0 is asked for a
    // message it never saw, gets its data from upstream, and is asked again.
    let mut net = Net::new(2, 7);
    let n = &mut net.nodes[0];
    let mut post = |_: Rank, _: Tag, _: Bytes| true;
    let key = uid::MsgKey { origin: 3, uid: 5 };
    let req = Control::Request { key, dst: 4 };
    n.relm
        .handle_control(net.now, &n.routing, 2, &req.encode(), &mut post)
        .unwrap();
    while n.relm.poll_transmit().is_some() {}
    let d = DataFrame {
        origin: 3,
        dst: 4,
        tag: 123,
        uid: 5,
        prev: 4,
        payload: Bytes::from_static(b"x"),
    };
    n.relm
        .handle_data(net.now, &n.routing, 1, d, &mut post)
        .unwrap();
    while n.relm.poll_transmit().is_some() {}
    n.relm
        .handle_control(net.now, &n.routing, 2, &req.encode(), &mut post)
        .unwrap();
    match n.relm.poll_transmit() {
        Some(Transmit::Data { to, frame }) => assert_eq!((to, frame.tag, frame.prev), (2, 123, 4)),
        other => panic!("expected a replay, got {other:?}"),
    }
}

/// Opens (or with `false` drops) a direct link between `a` and `b` at both ends; a dropped
/// link loses what was on it, and both ends fall back as the node does.
fn set_direct(net: &mut Net, a: Rank, b: Rank, open: bool) {
    for (x, y) in [(a, b), (b, a)] {
        let n = &mut net.nodes[x as usize];
        if open {
            n.direct.push(y);
        } else {
            n.direct.retain(|r| *r != y);
            net.links.remove(&(x, y));
        }
    }
    if !open {
        for (x, y) in [(a, b), (b, a)] {
            let n = &mut net.nodes[x as usize];
            let view = View {
                routing: &n.routing,
                direct: &n.direct,
                lives: &n.lives,
            };
            n.relm.handle_direct_lost(net.now, &view, y);
            net.pump(x);
        }
    }
}

#[test]
fn a_direct_link_carries_the_chain_and_a_lost_one_loses_nothing() {
    // Leaves 7 and 14 are six tree hops apart; with a link, data and acks skip them all.
    let mut net = Net::new(2, 15);
    for s in 0..10 {
        net.send(7, 14, s).unwrap();
    }
    set_direct(&mut net, 7, 14, true);
    for s in 10..20 {
        net.send(7, 14, s).unwrap();
    }
    assert_eq!(net.links.get(&(7, 14)).map(|q| q.len()), Some(10));
    net.run();
    assert_eq!(net.seqs(14, 7), (0..20).collect::<Vec<_>>());
    assert_eq!(net.nodes[7].done.len(), 20);
    assert!(net.nodes[7].done.iter().all(|(_, r)| r.is_ok()));
    // Acks on the link vanish, then the data on it too: the link is lost with both in flight.
    net.lossy.push((14, 7));
    for s in 20..30 {
        net.send(7, 14, s).unwrap();
    }
    net.run();
    net.lossy.clear();
    for s in 30..35 {
        net.send(7, 14, s).unwrap();
    }
    set_direct(&mut net, 7, 14, false);
    net.run();
    // Everything arrived once and in order: 20..30 came twice (link, then tree) and the
    // watermark dropped the copies; 30..35 went only over the tree.
    assert_eq!(net.seqs(14, 7), (0..35).collect::<Vec<_>>());
    assert_eq!(net.nodes[14].relm.stats().duplicates, 10);
    assert_eq!(net.nodes[7].done.len(), 35);
    assert!(net.nodes[7].done.iter().all(|(_, r)| r.is_ok()));
    assert_eq!(net.nodes[7].relm.stats().retransmits, 0);
    net.advance(2_000);
    assert!(net.all_idle());
}

#[test]
fn a_frame_from_the_origin_is_taken_only_at_the_destination() {
    // 7 sends to 14 over a link that only 7 believes in (a grant 14 withdrew): 14 takes it,
    // since it came from its origin. A hop would not take a message from a stranger.
    let mut net = Net::new(2, 15);
    net.nodes[7].direct.push(14);
    net.send(7, 14, 1).unwrap();
    net.run();
    assert_eq!(net.seqs(14, 7), vec![1]);
    assert!(net.nodes[7].done.iter().all(|(_, r)| r.is_ok()));
    let n = &mut net.nodes[3];
    let d = DataFrame {
        origin: 7,
        dst: 14,
        tag: 100,
        uid: 5,
        prev: uid::NONE,
        payload: Bytes::from_static(b"x"),
    };
    let ignored = n.relm.stats().ignored;
    let mut post = |_: Rank, _: Tag, _: Bytes| true;
    // Rank 3 is 7's parent: 14 is no neighbour of it, so data "from" 14 is not its upstream.
    n.relm
        .handle_data(net.now, &n.routing, 14, d, &mut post)
        .unwrap();
    assert_eq!(n.relm.stats().ignored, ignored + 1);
}

/// Takes runs as the node's poster does for a persistent receive, or refuses every run.
struct RunPoster {
    take_runs: bool,
    runs: Vec<crate::rml::batch_frame::ItemRun>,
    one_by_one: Vec<(Rank, Tag, Bytes)>,
}

impl RunPoster {
    fn new(take_runs: bool) -> Self {
        RunPoster {
            take_runs,
            runs: Vec::new(),
            one_by_one: Vec::new(),
        }
    }
}

impl Poster for RunPoster {
    fn post(&mut self, origin: Rank, tag: Tag, payload: Bytes) -> bool {
        self.one_by_one.push((origin, tag, payload));
        true
    }
    fn post_run(&mut self, run: crate::rml::batch_frame::ItemRun) -> bool {
        if self.take_runs {
            self.runs.push(run);
        }
        self.take_runs
    }
}

/// Rank 1's first `n` reliable messages to rank 0 (its parent), packed as batches of `per`.
fn batches_from_1_to_0(net: &mut Net, n: u64, per: usize) -> Vec<batch::Items> {
    for seq in 0..n {
        net.send(1, 0, seq).unwrap();
    }
    let frames: Vec<DataFrame> = net
        .links
        .get_mut(&(1, 0))
        .unwrap()
        .drain(..)
        .map(|t| match t {
            Transmit::Data { frame, .. } => frame,
            other => panic!("not data: {other:?}"),
        })
        .collect();
    frames
        .chunks(per)
        .map(|chunk| {
            let mut p = batch::Packer::with_frame_max(1 << 20);
            let mut packed: Vec<batch::Packed> =
                chunk.iter().filter_map(|f| p.push(0, f.clone())).collect();
            packed.extend(p.finish());
            assert_eq!(packed.len(), 1, "one batch per chunk");
            match packed.pop() {
                Some(batch::Packed::Batch { payload, .. }) => {
                    batch::Items::new(payload, 1, 0, |_| true).unwrap()
                }
                other => panic!("not a batch: {other:?}"),
            }
        })
        .collect()
}

fn seq_of(p: &[u8]) -> u64 {
    u64::from_be_bytes(p[..8].try_into().unwrap())
}

#[test]
fn an_in_order_batch_is_posted_as_one_run_and_anything_else_message_by_message() {
    let mut net = Net::new(2, 2);
    let mut b = batches_from_1_to_0(&mut net, 9, 3).into_iter();
    let (first, second, third) = (b.next().unwrap(), b.next().unwrap(), b.next().unwrap());
    let n = &mut net.nodes[0];
    let view = View {
        routing: &n.routing,
        direct: &n.direct,
        lives: &n.lives,
    };
    let mut poster = RunPoster::new(true);
    let now = net.now;
    // In order at the watermark: one run, one acknowledgement of its last message.
    n.relm
        .handle_batch(now, &view, 1, first.clone(), &mut poster)
        .unwrap();
    assert_eq!(poster.runs.len(), 1);
    let seqs: Vec<u64> = poster.runs[0]
        .messages()
        .map(|m| seq_of(&m.payload))
        .collect();
    assert_eq!(seqs, [0, 1, 2]);
    assert!(poster.one_by_one.is_empty());
    assert_eq!(n.relm.stats().posted, 3);
    match n.relm.poll_transmit() {
        Some(Transmit::Control {
            to: 1,
            control:
                Control::Ack {
                    origin: 1,
                    dst: 0,
                    upto,
                    ..
                },
        }) => assert_eq!(upto, first.shape().last_uid),
        other => panic!("expected the ack, got {other:?}"),
    }
    // The same batch again: copies, discarded message by message and re-acknowledged.
    n.relm
        .handle_batch(now, &view, 1, first, &mut poster)
        .unwrap();
    assert_eq!((poster.runs.len(), n.relm.stats().duplicates), (1, 3));
    // A batch ahead of the watermark waits early, message by message; the one it waits for
    // is then not a run either (something early is held), and releases it.
    n.relm
        .handle_batch(now, &view, 1, third, &mut poster)
        .unwrap();
    assert!(poster.one_by_one.is_empty(), "held early, not posted");
    n.relm
        .handle_batch(now, &view, 1, second, &mut poster)
        .unwrap();
    assert_eq!(poster.runs.len(), 1);
    let seqs: Vec<u64> = poster
        .one_by_one
        .iter()
        .map(|(_, _, p)| seq_of(p))
        .collect();
    assert_eq!(seqs, [3, 4, 5, 6, 7, 8]);
    assert_eq!(n.relm.stats().posted, 9);
    assert!(n.relm.records() == (0, 0, 0));
}

#[test]
fn a_run_the_matching_refuses_is_posted_message_by_message() {
    let mut net = Net::new(2, 2);
    let batch = batches_from_1_to_0(&mut net, 4, 4).pop().unwrap();
    let n = &mut net.nodes[0];
    let view = View {
        routing: &n.routing,
        direct: &n.direct,
        lives: &n.lives,
    };
    let mut poster = RunPoster::new(false);
    n.relm
        .handle_batch(net.now, &view, 1, batch, &mut poster)
        .unwrap();
    let seqs: Vec<u64> = poster
        .one_by_one
        .iter()
        .map(|(_, _, p)| seq_of(p))
        .collect();
    assert_eq!(seqs, [0, 1, 2, 3]);
    assert_eq!(n.relm.stats().posted, 4);
}
