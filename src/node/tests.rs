//! Deterministic tests of one or a few nodes on an in-memory network (FIFO per link, encoded
//! frames, a virtual clock): the fixes of the "one protocol core" issue, each named.

use super::*;
use crate::SendError;
use crate::faults::notice::TAG_FAULT_REPORT;
use crate::oob::header::HEADER_LEN;
use crate::rml::Peer;
use std::collections::VecDeque;

const TAG: Tag = crate::rml::TAG_USER_MIN;

mod held;
mod leave;
mod marker;
mod rejoin;

/// A few wired nodes and the frames between them.
struct Net {
    nodes: Vec<Node>,
    alive: Vec<bool>,
    links: VecDeque<(Rank, Rank, Bytes)>,
    now: Instant,
    delivered: Vec<(Rank, Message)>,
    done: Vec<(Rank, u64, Result<(), SendError>)>,
    /// Every transmit seen: (from, to, header).
    seen: Vec<(Rank, Rank, Header)>,
    /// Allgather results (whether `Ok`) and stops, per rank.
    gathered: Vec<(Rank, bool)>,
    stops: Vec<(Rank, StopReason)>,
    /// Stream events, per rank, in order.
    streams: VecDeque<(Rank, StreamEvent)>,
    /// Contact lookups answered: (asker, rank, known).
    answers: Vec<(Rank, Rank, bool)>,
}

impl Net {
    fn new(size: u32, radix: u32, tweak: impl Fn(&mut NodeConfig)) -> Net {
        let now = Instant::now();
        let nodes = (0..size)
            .map(|r| {
                let mut cfg = NodeConfig {
                    heartbeat: None,
                    wired_at_start: true,
                    ..NodeConfig::new(r, size, radix)
                };
                tweak(&mut cfg);
                let mut n = Node::new(cfg).unwrap();
                n.post(Peer::Any, TAG, true).unwrap();
                n.start(now);
                n
            })
            .collect();
        let mut net = Net {
            nodes,
            alive: vec![true; size as usize],
            links: VecDeque::new(),
            now,
            delivered: Vec::new(),
            done: Vec::new(),
            seen: Vec::new(),
            gathered: Vec::new(),
            stops: Vec::new(),
            streams: VecDeque::new(),
            answers: Vec::new(),
        };
        for r in 0..size {
            net.collect(r);
        }
        net
    }

    fn node(&mut self, r: Rank) -> &mut Node {
        &mut self.nodes[r as usize]
    }

    fn collect(&mut self, r: Rank) {
        let now = self.now;
        let n = &mut self.nodes[r as usize];
        n.pump(now);
        while let Some(o) = n.poll_output() {
            match o {
                Output::Transmit {
                    to,
                    header,
                    payload,
                    ..
                } => {
                    self.seen.push((r, to, header));
                    let mut b = header.encode().to_vec();
                    b.extend_from_slice(&payload.to_bytes());
                    self.links.push_back((r, to, Bytes::from(b)));
                }
                Output::Deliver { msg, .. } => self.delivered.push((r, msg)),
                Output::DeliverRun { run, .. } => {
                    self.delivered.extend(run.messages().map(|m| (r, m)))
                }
                Output::SendDone { token, result } => self.done.push((r, token, result)),
                Output::AllgatherDone { result, .. } => self.gathered.push((r, result.is_ok())),
                Output::Stop(reason) => self.stops.push((r, reason)),
                Output::Stream(e) => self.streams.push_back((r, *e)),
                Output::ContactKnown(c) => self.answers.push((r, c, true)),
                Output::ContactUnknown(c) => self.answers.push((r, c, false)),
                _ => {}
            }
        }
        assert_eq!(n.check_invariants(), Ok(()));
    }

    /// Hands every frame queued now to its destination without letting anyone pump, as one
    /// read of a socket would.
    fn deliver_batch(&mut self) {
        for (from, to, bytes) in std::mem::take(&mut self.links) {
            if !(self.alive[from as usize] && self.alive[to as usize]) {
                continue;
            }
            let h = Header::decode(bytes.first_chunk::<HEADER_LEN>().unwrap()).unwrap();
            let now = self.now;
            self.nodes[to as usize]
                .handle_frame(now, from, h, bytes.slice(HEADER_LEN..))
                .unwrap();
        }
    }

    /// Delivers frames until none are left (frames to or from the dead are lost).
    fn run(&mut self) {
        for _ in 0..100_000 {
            let Some((from, to, bytes)) = self.links.pop_front() else {
                return;
            };
            if !(self.alive[from as usize] && self.alive[to as usize]) {
                continue;
            }
            let h = Header::decode(bytes.first_chunk::<HEADER_LEN>().unwrap()).unwrap();
            let now = self.now;
            self.nodes[to as usize]
                .handle_frame(now, from, h, bytes.slice(HEADER_LEN..))
                .unwrap();
            self.collect(to);
        }
        panic!("the network did not settle");
    }

    /// Time passes by `ms` for every living node.
    fn advance(&mut self, ms: u64) {
        self.now += Duration::from_millis(ms);
        for r in 0..self.nodes.len() as Rank {
            if self.alive[r as usize] {
                let now = self.now;
                self.nodes[r as usize].handle_timeout(now, &NoQueues);
                self.collect(r);
            }
        }
    }
}

/// Defect 7: RELM's timers run on the `now` they are given (the loop once passed the wall
/// clock instead): a reliable message that was never acknowledged is retransmitted when
/// virtual time reaches its deadline, an hour after the real clock's now.
#[test]
fn relm_retransmits_on_the_clock_it_is_given() {
    let mut net = Net::new(2, 2, |_| {});
    net.now += Duration::from_secs(3600);
    let now = net.now;
    net.node(1)
        .handle_command(
            now,
            Command::SendReliable {
                dst: 0,
                tag: TAG,
                payload: Bytes::from_static(b"x"),
                token: Some(7),
            },
        )
        .unwrap();
    net.collect(1);
    // The frame is lost on the way.
    assert_eq!(net.links.len(), 1);
    net.links.clear();
    let retransmit_ms = net.nodes[1].relm().config().retransmit_ms;
    net.advance(retransmit_ms + 1);
    assert_eq!(net.nodes[1].relm().stats().retransmits, 1);
    net.run();
    assert_eq!(net.delivered.len(), 1);
    assert!(matches!(net.done.as_slice(), [(1, 7, Ok(()))]));
}

/// Defect 2: a fault report is never lost to a full RELM window. (Before the first fix the
/// report was refused `Busy` and lost: rank 0 never learnt of rank 3.) Since the runtime's
/// reserve (`RELM_RUNTIME_RESERVE`) it does not even wait for a user who keeps the window full:
/// under overload a report delayed behind user traffic delays the repair.
#[test]
fn a_fault_report_passes_a_window_full_of_user_sends() {
    // Radix 2, 4 daemons: 0 -> {1, 2}, 1 -> {3}.
    let mut net = Net::new(4, 2, |c| c.relm.unacked_max = 1);
    let now = net.now;
    net.node(1)
        .handle_command(
            now,
            Command::SendReliable {
                dst: 2,
                tag: TAG,
                payload: Bytes::from_static(b"fills the window"),
                token: Some(1),
            },
        )
        .unwrap();
    net.collect(1);
    // The user's window is full...
    let full = net.node(1).handle_command(
        now,
        Command::SendReliable {
            dst: 2,
            tag: TAG,
            payload: Bytes::from_static(b"refused"),
            token: Some(2),
        },
    );
    assert!(matches!(full, Err(SendError::Busy(_))), "{full:?}");
    net.collect(1);
    net.alive[3] = false;
    net.node(1).handle_unreachable(now, 3, 5);
    net.collect(1);
    // ...and the report goes out anyway.
    assert_eq!(net.nodes[1].counters().reports_delayed, 0);
    assert!(
        net.seen
            .iter()
            .any(|(_, _, h)| h.kind == Kind::RelmData && h.tag == TAG_FAULT_REPORT),
        "the report did not go out"
    );
    net.run();
    assert!(
        net.nodes[0].is_failed(3),
        "rank 0 never heard of rank 3's death"
    );
    assert_eq!(net.nodes[0].epoch(), 1);
    assert!(
        net.nodes[2].is_failed(3),
        "the confirmation did not reach rank 2"
    );
}

/// Defect 5: the header's epoch is the sender's incarnation. A frame from an older
/// incarnation of its sender than one already seen is dropped and counted; a frame from a
/// sender that has not yet applied the latest fault confirmation is not.
#[test]
fn frames_from_an_older_incarnation_are_dropped() {
    let mut net = Net::new(2, 2, |c| c.incarnation = 10 + u64::from(c.rank));
    let now = net.now;
    // The handshake proved rank 1's incarnation (what the driver reports at link-up).
    net.node(0).handle_link_up(now, 1, 11, false);
    net.node(1)
        .handle_command(
            now,
            Command::Send {
                dst: 0,
                tag: TAG,
                payload: Bytes::from_static(b"new"),
                token: None,
                route: None,
            },
        )
        .unwrap();
    net.collect(1);
    assert_eq!(
        net.seen[0].2.epoch, 11,
        "stamped with the sender's incarnation"
    );
    net.run();
    assert_eq!(net.delivered.len(), 1);
    // The same rank's previous life (incarnation 5) still has a frame in flight.
    let old = Header {
        kind: Kind::Msg,
        origin: 1,
        dst: 0,
        tag: TAG,
        epoch: 5,
        seq: 0,
        len: 3,
        lives: 0,
    };
    net.node(0)
        .handle_frame(now, 1, old, Bytes::from_static(b"old"))
        .unwrap();
    net.collect(0);
    assert_eq!(
        net.delivered.len(),
        1,
        "a frame of an older incarnation was delivered"
    );
    assert_eq!(net.nodes[0].counters().dropped_old_incarnation, 1);
    // The DVM's fault epoch moved on at rank 0; rank 1's frames are still taken.
    net.nodes[0].epoch = 7;
    net.node(1)
        .handle_command(
            now,
            Command::Send {
                dst: 0,
                tag: TAG,
                payload: Bytes::from_static(b"again"),
                token: None,
                route: None,
            },
        )
        .unwrap();
    net.collect(1);
    net.run();
    assert_eq!(net.delivered.len(), 2);
}

/// Defect 6: a frame attributed to a rank that cannot be its sender is refused with a reason
/// (the driver closes that connection), never taken as rank 0's.
#[test]
fn a_frame_from_no_known_rank_is_refused() {
    let mut net = Net::new(2, 2, |_| {});
    let now = net.now;
    let h = Header {
        kind: Kind::Msg,
        origin: 0,
        dst: 0,
        tag: TAG,
        epoch: 1,
        seq: 0,
        len: 0,
        lives: 0,
    };
    let err = net
        .node(0)
        .handle_frame(now, 9, h, Bytes::new())
        .unwrap_err();
    assert!(err.contains("rank 9"), "{err}");
    let err = net
        .node(0)
        .handle_frame(now, 0, h, Bytes::new())
        .unwrap_err();
    assert!(err.contains("rank 0"), "{err}");
    net.collect(0);
    assert!(net.delivered.is_empty());
}

/// Defect 1: an allgather whose result is decided before rank 0's `shutdown_dvm` is delivered
/// everywhere before the shutdown stops the daemons (the result and the shutdown are two
/// broadcast operations in order; the result's completion came after the shutdown's stop).
#[test]
fn a_result_decided_before_a_shutdown_is_delivered() {
    let mut net = Net::new(8, 2, |_| {});
    let now = net.now;
    for r in 0..8 {
        net.node(r)
            .handle_command(
                now,
                Command::Allgather {
                    id: 1,
                    data: Bytes::new(),
                },
            )
            .unwrap();
        net.collect(r);
    }
    // Rank 0 shuts the DVM down as soon as it has the result. Frames arrive in batches, as
    // from one read of a socket: everything queued is handed over, then each node pumps once,
    // so a daemon meets the result's operation and the shutdown's in one pump.
    for _ in 0..1_000 {
        if net.links.is_empty() {
            break;
        }
        net.deliver_batch();
        for r in 0..8u32 {
            net.collect(r);
            if r == 0 && net.gathered.contains(&(0, true)) && net.stops.is_empty() {
                net.node(0).handle_shutdown(now, true);
                net.collect(0);
            }
        }
    }
    let mut results = [None; 8];
    for (r, ok) in &net.gathered {
        results[*r as usize].get_or_insert(*ok);
    }
    let stops: Vec<Rank> = net.stops.iter().map(|(r, _)| *r).collect();
    for r in 0..8 {
        assert_eq!(results[r as usize], Some(true), "rank {r}'s result");
        assert!(stops.contains(&r), "rank {r} did not stop");
    }
}

/// The node is sans-IO: no clock, randomness, thread or socket in its sources (tests apart).
#[test]
fn the_node_reads_no_clock_and_draws_no_randomness() {
    let sources = [
        ("mod.rs", include_str!("mod.rs")),
        ("commands.rs", include_str!("commands.rs")),
        ("frames.rs", include_str!("frames.rs")),
        ("faults.rs", include_str!("faults.rs")),
        ("reliable.rs", include_str!("reliable.rs")),
        ("collectives.rs", include_str!("collectives.rs")),
        ("wiring.rs", include_str!("wiring.rs")),
        ("rejoin.rs", include_str!("rejoin.rs")),
        ("wireup.rs", include_str!("wireup.rs")),
        ("output.rs", include_str!("output.rs")),
    ];
    for (file, text) in sources {
        let code = text.split("#[cfg(test)]").next().unwrap_or(text);
        for banned in [
            "Instant::now",
            "SystemTime",
            "getrandom",
            "std::thread",
            "std::net::Tcp",
            "mio::",
        ] {
            assert!(!code.contains(banned), "node/{file} uses {banned}");
        }
    }
}

/// A rank-1 node of a DVM of `size`, not wired, that has reported to rank 0.
fn unwired_rank_1(size: u32, now: Instant) -> Node {
    let uri = |rank| ContactUri {
        dvm_id: "tbon".into(),
        rank,
        addrs: vec!["127.0.0.1:1".parse().unwrap()],
    };
    let cfg = NodeConfig {
        heartbeat: None,
        uri: Some(uri(1)),
        hnp: Some(uri(0)),
        wireup_timeout: Duration::from_secs(60),
        ..NodeConfig::new(1, size, 2)
    };
    let mut n = Node::new(cfg).unwrap();
    n.start(now);
    n.pump(now);
    while n.poll_output().is_some() {}
    n
}

fn stop_reason(n: &mut Node) -> Option<StopReason> {
    std::iter::from_fn(|| n.poll_output()).find_map(|o| match o {
        Output::Stop(r) => Some(r),
        _ => None,
    })
}

/// Issue "Real launchers", defect 1: a daemon given another size than rank 0's got a contact
/// table it could not use, logged it and ran for ever. It now stops with a fatal error that
/// says what to fix.
#[test]
fn a_contact_table_for_another_size_is_fatal() {
    let now = Instant::now();
    let mut n = unwired_rank_1(2, now);
    // Rank 0 was started with size 3: its table has three entries.
    let table = wireup::Slice::default().encode(3);
    let h = Header {
        kind: Kind::Xcast,
        origin: 0,
        dst: 1,
        tag: wireup::TAG_WIREUP_TABLE,
        epoch: 1,
        seq: 0,
        len: table.len() as u32,
        lives: 0,
    };
    n.handle_frame(now, 0, h, table).unwrap();
    n.pump(now);
    match stop_reason(&mut n) {
        Some(StopReason::Fatal(why)) => {
            assert!(why.contains("same size"), "{why}");
            assert!(why.contains('3') && why.contains('2'), "{why}");
        }
        other => panic!("expected a fatal stop, got {other:?}"),
    }
}

/// Defect 1, the other half: a wait for the table that never ends ends at twice the wire-up
/// timeout (rank 0 may itself collect reports for one timeout).
#[test]
fn no_contact_table_in_time_is_fatal() {
    let now = Instant::now();
    let mut n = unwired_rank_1(2, now);
    assert_eq!(n.poll_timeout(), Some(now + Duration::from_secs(120)));
    struct NoLinks;
    impl LinkProgress for NoLinks {
        fn stuck_since(&self, _: Rank) -> Option<Instant> {
            None
        }
    }
    n.handle_timeout(now + Duration::from_secs(119), &NoLinks);
    n.pump(now + Duration::from_secs(119));
    assert!(stop_reason(&mut n).is_none());
    let late = now + Duration::from_secs(120);
    n.handle_timeout(late, &NoLinks);
    n.pump(late);
    match stop_reason(&mut n) {
        Some(StopReason::Fatal(why)) => assert!(why.contains("no contact table"), "{why}"),
        other => panic!("expected a fatal stop, got {other:?}"),
    }
    assert_eq!(n.poll_timeout(), None);
}

/// Issue "Real launchers", defect 2: rank 0 closes its connections right after queueing the
/// shutdown broadcast, and a daemon may read that close in the same turn as the broadcast,
/// before its pump has delivered it. The loss must not start a probe (logged as "lost
/// connection to rank 0; probing" before "the DVM is shutting down"): the broadcast that came
/// first is acted on first, and the daemon stops for the DVM shutdown.
#[test]
fn a_shutdown_read_just_before_its_senders_close_stops_without_a_probe() {
    let mut net = Net::new(4, 4, |_| {});
    let now = net.now;
    net.node(0).handle_shutdown(now, true);
    net.collect(0);
    // One read: the broadcast is handed over, no pump yet, then the end of stream.
    net.deliver_batch();
    for r in 1..4 {
        assert!(
            !net.node(r).handle_link_lost(now, 0),
            "rank {r} would probe rank 0 during the DVM shutdown"
        );
        net.collect(r);
    }
    for r in 1..4 {
        assert!(
            net.stops
                .iter()
                .any(|(s, why)| *s == r && *why == StopReason::DvmShutdown),
            "rank {r} did not stop for the DVM shutdown: {:?}",
            net.stops
        );
    }
}

// ----- streams (issue "Streams", step 2) --------------------------------------------------

/// Plays both applications of one stream: the producer writes `data` as credit allows, the
/// consumer takes every chunk at once. Returns the bytes consumed, the end, and every offset
/// the producer was asked to start at. `between` runs once, after the first chunk arrived.
fn stream_through(
    net: &mut Net,
    (producer, consumer): (Rank, Rank),
    data: &Bytes,
    mut between: impl FnMut(&mut Net),
) -> (Vec<u8>, Result<(), crate::stream::StreamError>, Vec<u64>) {
    let now = net.now;
    net.node(consumer)
        .handle_stream(
            now,
            StreamCommand::Fetch {
                id: 77,
                producer,
                service: "file".into(),
                request: Bytes::from_static(b"/ckpt/0"),
                window: 64 * 1024,
                idle: Duration::from_secs(30),
                route: None,
                // The consumer checks each chunk itself, as a daemon's `Stream` reader does.
                reader_checks: true,
            },
        )
        .unwrap();
    net.collect(consumer);
    let (mut got, mut opens, mut between_done) = (Vec::new(), Vec::new(), false);
    // The producer's position in `data` per live stream id.
    let mut at: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    for _ in 0..100_000 {
        net.run();
        let Some((r, e)) = net.streams.pop_front() else {
            panic!("the stream stalled after {} bytes", got.len());
        };
        let now = net.now;
        match e {
            StreamEvent::Opened {
                id,
                offset,
                request,
                ..
            } => {
                assert_eq!(&request[..], b"/ckpt/0");
                opens.push(offset);
                at.insert(id, offset as usize);
            }
            StreamEvent::Room {
                consumer: c,
                id,
                upto,
            } => {
                let Some(pos) = at.get_mut(&id) else { continue };
                let n = (upto as usize).saturating_sub(*pos).min(data.len() - *pos);
                // A room reported before the stream stopped (its consumer moved it to a new
                // id meanwhile) finds it gone: the write is refused, as the application's is.
                let w = StreamCommand::Write {
                    consumer: c,
                    id,
                    bytes: data.slice(*pos..*pos + n),
                    digest: None,
                };
                if n > 0 && net.node(r).handle_stream(now, w).is_err() {
                    at.remove(&id);
                    continue;
                }
                *pos += n;
                if *pos == data.len() {
                    net.node(r)
                        .handle_stream(
                            now,
                            StreamCommand::End {
                                consumer: c,
                                id,
                                failure: None,
                            },
                        )
                        .unwrap();
                    at.remove(&id);
                }
                net.collect(r);
            }
            StreamEvent::Stopped { id, .. } => {
                at.remove(&id);
            }
            StreamEvent::Data { id, bytes, check } => {
                assert_eq!((r, id), (consumer, 77));
                let check = check.expect("the reader checks the chunks");
                assert_eq!(check.offset, got.len() as u64);
                assert_eq!(crate::stream::ChunkDigest::of(check.offset, &bytes), check);
                got.extend_from_slice(&bytes);
                net.node(r)
                    .handle_stream(
                        now,
                        StreamCommand::Consumed {
                            id,
                            n: bytes.len() as u64,
                        },
                    )
                    .unwrap();
                net.collect(r);
                if !between_done {
                    between_done = true;
                    between(net);
                }
            }
            StreamEvent::Ended { id, result } => {
                assert_eq!((r, id), (consumer, 77));
                return (got, result, opens);
            }
        }
    }
    panic!("the stream did not end");
}

fn serving(net: &mut Net, producer: Rank) {
    let now = net.now;
    net.node(producer)
        .handle_stream(
            now,
            StreamCommand::Serve {
                service: "file".into(),
            },
        )
        .unwrap();
}

#[test]
fn a_stream_crosses_the_tree_under_its_window_and_finishes() {
    // Leaves 7 and 14 of a radix-2 tree of 15: five relays apart.
    let mut net = Net::new(15, 2, |_| {});
    serving(&mut net, 14);
    let data: Bytes = (0..600_000u32)
        .map(|i| (i % 253) as u8)
        .collect::<Vec<u8>>()
        .into();
    let (got, result, opens) = stream_through(&mut net, (14, 7), &data, |_| {});
    assert_eq!(result, Ok(()));
    assert_eq!(got, data[..]);
    assert_eq!(opens, vec![0]);
}

#[test]
fn a_stream_from_a_service_nobody_offers_ends_no_service() {
    let mut net = Net::new(15, 2, |_| {});
    let data = Bytes::from_static(b"x");
    let (got, result, _) = stream_through(&mut net, (14, 7), &data, |_| {});
    assert!(got.is_empty());
    assert_eq!(
        result,
        Err(crate::stream::StreamError::NoService("file".into()))
    );
}

#[test]
fn a_relay_dies_mid_stream_and_the_stream_resumes_where_the_consumer_stands() {
    let mut net = Net::new(15, 2, |_| {});
    serving(&mut net, 14);
    let data: Bytes = (0..400_000u32)
        .map(|i| (i % 241) as u8)
        .collect::<Vec<u8>>()
        .into();
    // Rank 3 relays 7's traffic (7 -> 3 -> 1 -> 0 -> 2 -> 6 -> 14); it dies with chunks on it.
    let (got, result, opens) = stream_through(&mut net, (14, 7), &data, |net| {
        net.alive[3] = false;
        let now = net.now;
        for n in [1, 7, 11] {
            net.node(n).handle_unreachable(now, 3, 5);
            net.collect(n);
        }
    });
    assert_eq!(result, Ok(()));
    assert_eq!(got, data[..], "no byte lost or repeated");
    assert_eq!(opens.len(), 2, "opened, then resumed: {opens:?}");
    assert!(opens[1] > 0);
}

#[test]
fn a_chunk_the_reader_finds_corrupt_fails_the_stream_and_stops_the_producer() {
    let mut net = Net::new(15, 2, |_| {});
    serving(&mut net, 14);
    let data: Bytes = vec![9u8; 300_000].into();
    let (_, result, _) = stream_through(&mut net, (14, 7), &data, |net| {
        let now = net.now;
        let c = StreamCommand::Corrupt { id: 77, offset: 0 };
        net.node(7).handle_stream(now, c).unwrap();
        net.collect(7);
    });
    assert_eq!(
        result,
        Err(crate::stream::StreamError::Corrupt { offset: 0 })
    );
    // The producer was told: its stream stopped, cancelled.
    net.run();
    assert!(
        net.node(14).counters().streams.producing == 0,
        "the producer still produces"
    );
    assert_eq!(net.node(7).counters().streams.failed, 1);
    // A report for a stream already over is counted, and nothing else happens.
    let now = net.now;
    let late = StreamCommand::Corrupt { id: 77, offset: 5 };
    net.node(7).handle_stream(now, late).unwrap();
    assert_eq!(net.node(7).counters().streams.failed, 2);
}

#[test]
fn the_death_of_the_producer_ends_the_stream_producer_died() {
    let mut net = Net::new(15, 2, |_| {});
    serving(&mut net, 14);
    let data: Bytes = vec![1u8; 300_000].into();
    let (_, result, _) = stream_through(&mut net, (14, 7), &data, |net| {
        net.alive[14] = false;
        let now = net.now;
        net.node(6).handle_unreachable(now, 14, 5);
        net.collect(6);
    });
    assert_eq!(result, Err(crate::stream::StreamError::ProducerDied(14)));
}

#[test]
fn stream_commands_beyond_their_bounds_are_refused() {
    let mut net = Net::new(3, 2, |_| {});
    let now = net.now;
    let long = "s".repeat(crate::limits::STREAM_SERVICE_MAX + 1);
    let serve = StreamCommand::Serve {
        service: long.clone(),
    };
    assert!(matches!(
        net.node(1).handle_stream(now, serve),
        Err(SendError::TooLarge { .. })
    ));
    let fetch_from = |producer: Rank, service: String, request: usize| StreamCommand::Fetch {
        id: 1,
        producer,
        service,
        request: Bytes::from(vec![0; request]),
        window: 1024,
        idle: Duration::from_secs(1),
        route: None,
        reader_checks: false,
    };
    let fetch = |service: String, request: usize| fetch_from(2, service, request);
    for c in [
        fetch(long, 0),
        fetch("s".into(), crate::limits::STREAM_REQUEST_MAX + 1),
    ] {
        assert!(matches!(
            net.node(1).handle_stream(now, c),
            Err(SendError::TooLarge { .. })
        ));
    }
    let out_of_range = fetch_from(9, "s".into(), 0);
    assert!(net.node(1).handle_stream(now, out_of_range).is_err());
    // A huge "consumed" from the application is taken as "everything".
    net.node(1)
        .handle_stream(now, fetch("s".into(), 0))
        .unwrap();
    let all = StreamCommand::Consumed { id: 1, n: u64::MAX };
    net.node(1).handle_stream(now, all).unwrap();
    let again = StreamCommand::Consumed { id: 1, n: u64::MAX };
    net.node(1).handle_stream(now, again).unwrap();
    // The windows of the streams a daemon fetches are bounded in sum: eight of the largest
    // fit in STREAM_WINDOWS_TOTAL_MAX (with the one above), the next is refused `Busy`.
    let big = |id: u64| StreamCommand::Fetch {
        id,
        producer: 2,
        service: "s".into(),
        request: Bytes::new(),
        window: crate::limits::STREAM_WINDOW_MAX as u32,
        idle: Duration::from_secs(1),
        route: None,
        reader_checks: false,
    };
    let fits = crate::limits::STREAM_WINDOWS_TOTAL_MAX / crate::limits::STREAM_WINDOW_MAX as u64;
    for id in 10..10 + fits - 1 {
        net.node(1).handle_stream(now, big(id)).unwrap();
    }
    assert!(matches!(
        net.node(1).handle_stream(now, big(99)),
        Err(SendError::Busy(_))
    ));
}

/// Issue "Streams", found with 64 concurrent streams between real daemons: every writer's
/// chunks went into the queue towards the next hop at once, far past flow control's bounds
/// (frames dropped at the hard bound, resumes, a 15 s stall). Data now leaves only through
/// the budgeted round robin: none towards a congested hop, at most `STREAM_RELEASE_BYTES` per
/// release, a chunk per stream in turn.
#[test]
fn stream_data_waits_for_a_congested_hop_and_leaves_in_a_fair_budgeted_round_robin() {
    use crate::limits::{FLOW_HIGH_BYTES, STREAM_CHUNK_MAX, STREAM_RELEASE_BYTES};
    // 0 -> {1, 2}: rank 1 produces for rank 2 through rank 0.
    let mut net = Net::new(3, 2, |_| {});
    let now = net.now;
    net.node(1)
        .handle_stream(
            now,
            StreamCommand::Serve {
                service: "s".into(),
            },
        )
        .unwrap();
    const STREAMS: u64 = 8;
    for id in 1..=STREAMS {
        let fetch = StreamCommand::Fetch {
            id,
            producer: 1,
            service: "s".into(),
            request: Bytes::new(),
            window: 1 << 20,
            idle: Duration::from_secs(30),
            route: None,
            reader_checks: false,
        };
        net.node(2).handle_stream(now, fetch).unwrap();
    }
    net.collect(2);
    net.run();
    let opened: Vec<(Rank, u64)> = net
        .streams
        .drain(..)
        .filter_map(|(r, e)| match e {
            StreamEvent::Opened { consumer, id, .. } if r == 1 => Some((consumer, id)),
            _ => None,
        })
        .collect();
    assert_eq!(opened.len(), STREAMS as usize);
    // The queue towards rank 0 is congested: writes are taken, no data leaves.
    net.node(1)
        .handle_send_queue(now, 0, FLOW_HIGH_BYTES + 1, 0);
    for (consumer, id) in &opened {
        let w = StreamCommand::Write {
            consumer: *consumer,
            id: *id,
            bytes: Bytes::from(vec![1u8; 1 << 20]),
            digest: None,
        };
        net.node(1).handle_stream(now, w).unwrap();
    }
    net.node(1).pump(now);
    let data_sent = |n: &mut Node| {
        let mut per_stream: std::collections::BTreeMap<u64, usize> = Default::default();
        while let Some(o) = n.poll_output() {
            if let Output::Transmit {
                header, payload, ..
            } = o
                && header.tag == crate::node::TAG_STREAM
            {
                let p = payload.to_bytes();
                if p.first() == Some(&2) {
                    let id = u64::from_be_bytes(p[1..9].try_into().unwrap());
                    *per_stream.entry(id).or_default() += p.len() - 25;
                }
            }
        }
        per_stream
    };
    assert!(
        data_sent(net.node(1)).is_empty(),
        "data left for a congested hop"
    );
    // The queue drained: one release, at most its budget, a chunk per stream in turn.
    net.node(1).handle_send_queue(now, 0, 0, 0);
    let first = data_sent(net.node(1));
    let total: usize = first.values().sum();
    assert!(
        total <= STREAM_RELEASE_BYTES,
        "{total} bytes released at once"
    );
    assert_eq!(
        first.len(),
        STREAM_RELEASE_BYTES / STREAM_CHUNK_MAX,
        "{first:?}"
    );
    assert!(first.values().all(|n| *n == STREAM_CHUNK_MAX), "{first:?}");
    // No more towards that hop before its queue is reported again, however many turns and
    // commands come between (once each released its budget: a busy turn filled the queue to
    // its bound, and the frames dropped there stalled streams until they resumed).
    for _ in 0..4 {
        net.node(1).pump(now);
        net.node(1)
            .handle_stream(
                now,
                StreamCommand::Serve {
                    service: "other".into(),
                },
            )
            .unwrap();
    }
    assert!(
        data_sent(net.node(1)).is_empty(),
        "released again before a report"
    );
    // The next release serves the streams that waited.
    net.node(1).handle_send_queue(now, 0, 0, 0);
    let second = data_sent(net.node(1));
    assert!(
        second.keys().all(|id| !first.contains_key(id)),
        "{first:?} then {second:?}"
    );
}

// ----- wire-up slices and contact lookups (issue "Thousands of daemons") ----------------------

use super::contacts::test_uri;

/// A DVM of `size` daemons that wires up for real (reports, slices), without `absent`.
fn wiring_net(size: u32, radix: u32, setting: contacts::ContactsSetting, absent: &[Rank]) -> Net {
    let mut net = Net::new(size, radix, |cfg| {
        cfg.wired_at_start = false;
        cfg.uri = Some(test_uri(cfg.rank));
        cfg.hnp = Some(test_uri(0));
        cfg.wireup_timeout = Duration::from_secs(60);
        cfg.contacts = setting;
    });
    for r in absent {
        net.alive[*r as usize] = false;
    }
    net.run();
    if !absent.is_empty() {
        // Rank 0 gives up on the absent ones at its wire-up timeout.
        net.advance(60_000);
        net.run();
    }
    net
}

/// Whether `a` is `b` or an ancestor of `b` in the failure-free tree.
fn ancestor_or_self(radix: u32, size: u32, a: Rank, b: Rank) -> bool {
    let tree = RoutingState::new(radix, size, b).unwrap();
    a == b || tree.ancestors().contains(&a)
}

#[test]
fn wire_up_leaves_each_daemon_its_ancestors_and_its_subtree() {
    let (size, radix) = (40, 3);
    let mut net = wiring_net(size, radix, contacts::ContactsSetting::Subtree, &[]);
    let mut entries = 0;
    for r in 1..size {
        let n = net.node(r);
        assert!(n.is_wired(), "rank {r} wired");
        for x in (0..size).filter(|x| *x != r) {
            let expected =
                ancestor_or_self(radix, size, x, r) || ancestor_or_self(radix, size, r, x);
            assert_eq!(
                n.contact(x).is_some(),
                expected,
                "rank {r} knows rank {x}'s contact"
            );
            assert!(n.contact(x).is_none_or(|u| *u == test_uri(x)));
        }
        entries += n.contacts.owned_len();
    }
    // Every rank knows its depth's worth of ancestors and its subtree: N log N in all, far
    // below the N squared of a full table.
    assert!(
        entries < (size * size / 4) as usize,
        "{entries} entries in all"
    );
    let table: usize = net
        .seen
        .iter()
        .filter(|(_, _, h)| h.tag == wireup::TAG_WIREUP_TABLE)
        .count();
    assert_eq!(table, size as usize - 1, "one slice per daemon");
}

#[test]
fn full_contacts_leave_every_daemon_every_contact() {
    let size = 20;
    let mut net = wiring_net(size, 3, contacts::ContactsSetting::Full, &[]);
    for r in 0..size {
        for x in (0..size).filter(|x| *x != r) {
            assert_eq!(net.node(r).contact(x), Some(&test_uri(x)), "{r} knows {x}");
        }
    }
}

#[test]
fn a_missing_contact_is_looked_up_from_rank_0_and_cached() {
    let (size, radix) = (40, 3);
    let mut net = wiring_net(size, radix, contacts::ContactsSetting::Subtree, &[]);
    // Rank 39 (a leaf) and rank 1 are in different subtrees.
    assert!(net.node(39).contact(1).is_none());
    let now = net.now;
    net.node(39).want_contact(now, 1);
    net.node(39).want_contact(now, 2);
    net.node(39).want_contact(now, 99);
    net.collect(39);
    net.run();
    assert!(net.answers.contains(&(39, 1, true)));
    assert!(net.answers.contains(&(39, 2, true)));
    assert!(
        net.answers.contains(&(39, 99, false)),
        "out of range: unknown at once"
    );
    assert_eq!(net.node(39).contact(1), Some(&test_uri(1)));
    let lookups = net
        .seen
        .iter()
        .filter(|(f, _, h)| *f == 39 && h.tag == lookup::TAG_CONTACT_LOOKUP)
        .count();
    assert_eq!(lookups, 2, "one lookup in flight at a time: 1, then 2");
    // Known now: answered at once, no message.
    net.node(39).want_contact(now, 1);
    net.collect(39);
    assert_eq!(
        net.answers.iter().filter(|a| **a == (39, 1, true)).count(),
        2
    );
    assert!(net.links.is_empty());
}

#[test]
fn an_unanswered_lookup_is_retried_then_given_up() {
    let mut net = wiring_net(13, 3, contacts::ContactsSetting::Subtree, &[]);
    net.alive[0] = false;
    let now = net.now;
    net.node(12).want_contact(now, 1);
    net.collect(12);
    for _ in 0..crate::limits::CONTACT_LOOKUP_TRIES_MAX {
        net.run();
        net.advance(crate::limits::CONTACT_LOOKUP_TIMEOUT_MS);
    }
    assert!(net.answers.contains(&(12, 1, false)));
    let tries = net
        .seen
        .iter()
        .filter(|(f, _, h)| *f == 12 && h.tag == lookup::TAG_CONTACT_LOOKUP)
        .count();
    assert_eq!(tries as u32, crate::limits::CONTACT_LOOKUP_TRIES_MAX);
}

#[test]
fn a_daemon_that_never_reports_is_failed_and_its_subtree_still_wires() {
    let (size, radix) = (40, 3);
    // Rank 1 (interior) never starts: rank 0 lists it missing, and its heir takes its slot.
    let mut net = wiring_net(size, radix, contacts::ContactsSetting::Subtree, &[1]);
    for r in (0..size).filter(|r| *r != 1) {
        let n = net.node(r);
        assert!(n.is_wired(), "rank {r} wired");
        assert!(n.is_failed(1), "rank {r} knows rank 1 never came");
        if let Some(p) = n.routing.parent() {
            assert!(n.contact(p).is_some(), "rank {r} knows its parent {p}");
        }
        for c in n.routing.children().to_vec() {
            assert!(n.contact(c).is_some(), "rank {r} knows its child {c}");
        }
    }
}

/// Reliable sends handed over in one turn travel as reliable batch frames (`relm::batch`): the
/// origin and each relay send one frame for the run, every message is posted once and in
/// order, and each send completes. A malformed batch from a neighbour is refused (the driver
/// closes that connection) before RELM sees any of its items.
#[test]
fn reliable_runs_travel_as_batch_frames_and_malformed_ones_are_refused() {
    use crate::relm::DataFrame;
    use crate::relm::batch::{Packed, Packer, TAG_BATCH};
    // Radix 2, 4 daemons: 0 -> {1, 2}, 1 -> {3}; 3 to 2 goes through 1 and 0.
    let mut net = Net::new(4, 2, |_| {});
    let now = net.now;
    for i in 0..40u64 {
        net.node(3)
            .handle_command(
                now,
                Command::SendReliable {
                    dst: 2,
                    tag: TAG,
                    payload: Bytes::from(i.to_be_bytes().to_vec()),
                    token: Some(i),
                },
            )
            .unwrap();
    }
    net.collect(3);
    net.run();
    let at_2: Vec<u64> = net
        .delivered
        .iter()
        .filter(|(r, m)| *r == 2 && m.origin == 3)
        .map(|(_, m)| u64::from_be_bytes(m.payload[..].try_into().unwrap()))
        .collect();
    assert_eq!(at_2, (0..40).collect::<Vec<u64>>());
    let mut done: Vec<u64> = net
        .done
        .iter()
        .filter(|(r, _, res)| *r == 3 && res.is_ok())
        .map(|(_, t, _)| *t)
        .collect();
    done.sort_unstable();
    assert_eq!(done, (0..40).collect::<Vec<u64>>());
    for hop in [3, 1, 0] {
        let data: Vec<Tag> = net
            .seen
            .iter()
            .filter(|(from, _, h)| *from == hop && h.kind == Kind::RelmData)
            .map(|(_, _, h)| h.tag)
            .collect();
        assert_eq!(data, vec![TAG_BATCH], "rank {hop} sent {data:?}");
    }
    // Malformed batches from rank 3 at rank 1: cut short, and with an item's reserved tag (a
    // batch in a batch).
    let mut packer = Packer::with_frame_max(1 << 20);
    let mut packed = Vec::new();
    for (uid, tag) in [(100, TAG), (101, TAG_BATCH)] {
        let frame = DataFrame {
            origin: 3,
            dst: 2,
            tag,
            uid,
            prev: uid - 1,
            payload: Bytes::from_static(b"xy"),
        };
        packed.extend(packer.push(1, frame));
    }
    packed.extend(packer.finish());
    let [Packed::Batch { payload, .. }] = packed.as_slice() else {
        panic!("one batch expected: {packed:?}");
    };
    let reserved = payload.clone();
    let short = payload.slice(..payload.len() - 1);
    let posted = net.nodes[2].relm().stats().posted;
    for (bad, why) in [(short, "runs past the end"), (reserved, "has the tag 28")] {
        let mut h = net.nodes[3].header(Kind::RelmData, 3, 2, TAG_BATCH, bad.len());
        h.lives = 0;
        let e = net.nodes[1].handle_frame(now, 3, h, bad).unwrap_err();
        assert!(e.contains(why), "{e}");
    }
    net.collect(1);
    net.run();
    assert_eq!(net.nodes[2].relm().stats().posted, posted);
}

/// A batch's consecutive items that one persistent receive takes reach the driver as one
/// `DeliverRun`; an item for a one-shot receive, or for none, is matched on its own, and what
/// follows it opens a new run: the same messages, in the same order, as one delivery each.
#[test]
fn a_batch_delivers_runs_to_persistent_receives_and_matches_the_rest_one_by_one() {
    use crate::rml::batch_frame::{Packer, TAG_BATCH, Unit};
    let mut net = Net::new(2, 2, |_| {});
    let now = net.now;
    let once = net.node(0).post(Peer::Rank(1), TAG + 1, false).unwrap();
    let items: [(Tag, &[u8]); 7] = [
        (TAG, b"a"),
        (TAG, b"b"),
        (TAG, b""),
        (TAG + 1, b"once"),
        (TAG + 1, b"held"),
        (TAG, b"c"),
        (TAG, b"d"),
    ];
    let mut units: Vec<Unit> = Vec::new();
    let mut packer = Packer::new();
    for (tag, p) in items {
        packer.push(0, tag, Bytes::from_static(p), true, |u| units.push(u));
    }
    packer.finish(|u| units.push(u));
    assert_eq!(units.len(), 1);
    let h = net.nodes[1].header(Kind::Msg, 1, 0, TAG_BATCH, units[0].payload.len());
    net.node(0)
        .handle_frame(now, 1, h, units[0].payload.clone())
        .unwrap();
    let mut shapes = Vec::new();
    let mut got = Vec::new();
    while let Some(o) = net.node(0).poll_output() {
        match o {
            Output::DeliverRun { run, .. } => {
                shapes.push(format!("run {}", run.len()));
                got.extend(run.messages().map(|m| (m.tag, m.payload)));
                let mut lent = Vec::new();
                run.for_each_ref(|m| lent.push(m.payload().to_vec()));
                assert_eq!(lent.len(), run.len() as usize);
            }
            Output::Deliver {
                receive,
                retired,
                msg,
            } => {
                assert_eq!((receive, retired), (once, true));
                shapes.push("one".to_string());
                got.push((msg.tag, msg.payload));
            }
            _ => {}
        }
    }
    assert_eq!(shapes, ["run 3", "one", "run 2"]);
    let want: Vec<(Tag, Bytes)> = [0, 1, 2, 3, 5, 6]
        .iter()
        .map(|&i| (items[i].0, Bytes::from_static(items[i].1)))
        .collect();
    assert_eq!(got, want);
    // The item nothing matched is held, and goes to the next receive posted for it.
    assert_eq!(net.nodes[0].counters().delivered, 6);
    net.node(0).post(Peer::Any, TAG + 1, true).unwrap();
    match net.node(0).poll_output() {
        Some(Output::Deliver { msg, .. }) => assert_eq!(&msg.payload[..], b"held"),
        o => panic!("expected the held item, got {o:?}"),
    }
    // A batch of one tag for a persistent receive is one run, whole.
    let mut units: Vec<Unit> = Vec::new();
    for p in [&b"x"[..], b"y", b"z"] {
        packer.push(0, TAG + 1, Bytes::from_static(p), true, |u| units.push(u));
    }
    packer.finish(|u| units.push(u));
    let h = net.nodes[1].header(Kind::Msg, 1, 0, TAG_BATCH, units[0].payload.len());
    net.node(0)
        .handle_frame(now, 1, h, units[0].payload.clone())
        .unwrap();
    match net.node(0).poll_output() {
        Some(Output::DeliverRun { run, .. }) => {
            let got: Vec<Bytes> = run.messages().map(|m| m.payload).collect();
            assert_eq!(got, [&b"x"[..], b"y", b"z"]);
        }
        o => panic!("expected one run, got {o:?}"),
    }
    assert!(net.node(0).poll_output().is_none());
}

/// Batch frames (`rml::batch_frame`): a run of small messages crosses two relays as one frame
/// and is delivered as its messages, in order; a malformed batch is dropped whole at its
/// destination (nothing of it delivered), and what follows it is not disturbed.
#[test]
fn a_batch_frame_is_relayed_once_and_delivered_as_its_messages() {
    use crate::rml::batch_frame::{Packer, TAG_BATCH, Unit};
    // Radix 2, 4 daemons: 0 -> {1, 2}, 1 -> {3}; 3 to 2 goes through 1 and 0.
    let mut net = Net::new(4, 2, |_| {});
    let now = net.now;
    let mut units: Vec<Unit> = Vec::new();
    let mut packer = Packer::new();
    for p in [&b"a"[..], b"bb", b"ccc"] {
        packer.push(2, TAG, Bytes::from_static(p), true, |u| units.push(u));
    }
    packer.finish(|u| units.push(u));
    assert_eq!(units.len(), 1);
    let good = units.pop().unwrap();
    assert_eq!((good.tag, good.messages), (TAG_BATCH, 3));
    // An item that claims more bytes than the frame has.
    let mut bad = good.payload.to_vec();
    bad.truncate(bad.len() - 1);
    for (tag, payload) in [
        (TAG_BATCH, good.payload.clone()),
        (TAG_BATCH, Bytes::from(bad)),
        (TAG, Bytes::from_static(b"after")),
    ] {
        net.node(3)
            .handle_command(
                now,
                Command::Send {
                    dst: 2,
                    tag,
                    payload,
                    token: None,
                    route: None,
                },
            )
            .unwrap();
    }
    net.collect(3);
    net.run();
    let at_2: Vec<&[u8]> = net
        .delivered
        .iter()
        .filter(|(r, m)| *r == 2 && m.origin == 3 && m.tag == TAG)
        .map(|(_, m)| &m.payload[..])
        .collect();
    assert_eq!(at_2, vec![&b"a"[..], b"bb", b"ccc", b"after"]);
    // Each relay forwarded three frames (the two batches and the single message).
    assert_eq!(net.nodes[1].counters().relayed, 3);
    assert_eq!(net.nodes[0].counters().relayed, 3);
    assert_eq!(net.nodes[2].counters().delivered, 4);
}
