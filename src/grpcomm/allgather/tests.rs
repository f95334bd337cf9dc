use super::*;
use crate::grpcomm::testnet::{Repairs, Rng, Sim};
use crate::grpcomm::xcast::tests::{Fault, check as check_xcast, inject};
use crate::routed::Scope;

fn core(radix: u32, size: u32, me: Rank) -> Allgather {
    Allgather::new(
        &RoutingState::new(radix, size, 0)
            .unwrap()
            .as_seen_by(me)
            .unwrap(),
    )
}

fn events(a: &mut Allgather) -> Vec<AllgatherEvent> {
    std::iter::from_fn(|| a.poll_event()).collect()
}

fn transmits(a: &mut Allgather) -> Vec<Transmit<AllgatherMsg>> {
    std::iter::from_fn(|| a.poll_transmit()).collect()
}

fn ready(events: &[AllgatherEvent]) -> Vec<AllgatherResult> {
    events
        .iter()
        .filter_map(|e| match e {
            AllgatherEvent::ResultReady { result } => Some(result.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_lone_rank_zero_gathers_itself() {
    let mut a = core(2, 1, 0);
    a.contribute(5, Bytes::from_static(b"x")).unwrap();
    let results = ready(&events(&mut a));
    assert_eq!(
        results,
        vec![AllgatherResult {
            id: 5,
            overflowed: false,
            contributions: vec![(0, Bytes::from_static(b"x"))],
            excluded: vec![],
        }]
    );
    let result = results.into_iter().next().unwrap();
    a.handle_result_bytes(result.encode()).unwrap();
    assert_eq!(
        events(&mut a),
        vec![AllgatherEvent::AllgatherDone { result }]
    );
    assert_eq!(a.tracked(), 0);
    assert_eq!(a.contribute(5, Bytes::new()), Err(AllgatherError::Finished));
}

#[test]
fn a_subtree_is_sent_once_complete_and_duplicates_are_idempotent() {
    // Radix 2, size 4: 0 -> {1, 2}, 1 -> {3}.
    let mut one = core(2, 4, 1);
    one.contribute(1, Bytes::from_static(b"one")).unwrap();
    assert_eq!(transmits(&mut one), vec![]); // waits for rank 3
    assert_eq!(
        one.contribute(1, Bytes::new()),
        Err(AllgatherError::AlreadyContributed)
    );
    let from3 = Contribution {
        id: 1,
        digest: 0,
        overflowed: false,
        entries: vec![(3, Bytes::from_static(b"three"))],
        excluded: vec![],
        excused: vec![],
        returned: false,
    };
    one.handle_msg(3, AllgatherMsg::Contribution(from3.clone()));
    one.handle_msg(3, AllgatherMsg::Contribution(from3));
    let sent = transmits(&mut one);
    assert_eq!(
        sent,
        vec![Transmit {
            to: 0,
            msg: AllgatherMsg::Contribution(Contribution {
                id: 1,
                digest: 0,
                overflowed: false,
                entries: vec![
                    (1, Bytes::from_static(b"one")),
                    (3, Bytes::from_static(b"three"))
                ],
                excluded: vec![],
                excused: vec![],
                returned: false,
            })
        }]
    );
}

#[test]
fn rank_zero_names_the_ranks_that_failed_before_contributing() {
    // Radix 2, size 4: rank 2 fails before contributing.
    let mut r0 = RoutingState::new(2, 4, 0).unwrap();
    let mut zero = Allgather::new(&r0);
    zero.contribute(9, Bytes::new()).unwrap();
    zero.handle_msg(
        1,
        AllgatherMsg::Contribution(Contribution {
            id: 9,
            digest: 0,
            overflowed: false,
            entries: vec![(1, Bytes::new()), (3, Bytes::new())],
            excluded: vec![],
            excused: vec![],
            returned: false,
        }),
    );
    assert!(ready(&events(&mut zero)).is_empty());
    zero.handle_repair(&r0.fail(&[2], Scope::Global, None).unwrap());
    let results = ready(&events(&mut zero));
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].ranks().collect::<Vec<_>>(), [0, 1, 3]);
    assert_eq!(results[0].excluded, [2]);
}

#[test]
fn a_contribution_under_another_view_is_not_counted_until_resent() {
    let mut r0 = RoutingState::new(2, 4, 0).unwrap();
    let mut zero = Allgather::new(&r0);
    zero.barrier(1).unwrap();
    zero.handle_repair(&r0.fail(&[3], Scope::Local, None).unwrap());
    // Rank 1 has not learnt of rank 3's failure: its digest is still 0.
    let stale = Contribution {
        id: 1,
        digest: 0,
        overflowed: false,
        entries: vec![(1, Bytes::new())],
        excluded: vec![],
        excused: vec![],
        returned: false,
    };
    zero.handle_msg(1, AllgatherMsg::Contribution(stale));
    zero.handle_msg(
        2,
        AllgatherMsg::Contribution(Contribution {
            id: 1,
            digest: zero.view.digest,
            overflowed: false,
            entries: vec![(2, Bytes::new())],
            excluded: vec![],
            excused: vec![],
            returned: false,
        }),
    );
    assert!(ready(&events(&mut zero)).is_empty());
    let digest = zero.view.digest;
    assert_eq!(
        transmits(&mut zero),
        vec![Transmit {
            to: 1,
            msg: AllgatherMsg::Sync { digest }
        }]
    );
    // Rank 1 catches up and answers.
    let mut r1 = RoutingState::new(2, 4, 1).unwrap();
    let mut one = Allgather::new(&r1);
    one.barrier(1).unwrap();
    one.handle_msg(0, AllgatherMsg::Sync { digest });
    assert_eq!(transmits(&mut one), vec![]); // waits for rank 3, and for the view
    one.handle_repair(&r1.fail(&[3], Scope::Global, None).unwrap());
    let sent = transmits(&mut one);
    assert_eq!(sent.len(), 1);
    zero.handle_msg(1, sent[0].msg.clone());
    let results = ready(&events(&mut zero));
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].excluded, [3]);
}

#[test]
fn a_link_that_lost_messages_is_restated() {
    // Radix 2, size 3: 0 -> {1, 2}. Rank 1's contribution is lost on its way.
    let mut zero = core(2, 3, 0);
    let mut one = core(2, 3, 1);
    zero.barrier(4).unwrap();
    zero.handle_msg(
        2,
        AllgatherMsg::Contribution(Contribution {
            id: 4,
            digest: 0,
            overflowed: false,
            entries: vec![(2, Bytes::new())],
            excluded: vec![],
            excused: vec![],
            returned: false,
        }),
    );
    one.barrier(4).unwrap();
    assert_eq!(transmits(&mut one).len(), 1); // lost
    assert_eq!(transmits(&mut one), vec![]);
    one.handle_link_up(0);
    let again = transmits(&mut one);
    assert_eq!(again.len(), 1);
    zero.handle_msg(1, again[0].msg.clone());
    assert_eq!(ready(&events(&mut zero)).len(), 1);

    // A Sync offered under the current view is offered again on link-up; none otherwise.
    let mut r0 = RoutingState::new(2, 4, 0).unwrap();
    let mut zero = Allgather::new(&r0);
    zero.handle_link_up(1);
    assert_eq!(transmits(&mut zero), vec![]);
    zero.barrier(1).unwrap();
    zero.handle_repair(&r0.fail(&[3], Scope::Local, None).unwrap());
    zero.handle_msg(
        1,
        AllgatherMsg::Contribution(Contribution {
            id: 1,
            digest: 0,
            overflowed: false,
            entries: vec![(1, Bytes::new())],
            excluded: vec![],
            excused: vec![],
            returned: false,
        }),
    );
    let digest = zero.view.digest;
    let sync = vec![Transmit {
        to: 1,
        msg: AllgatherMsg::Sync { digest },
    }];
    assert_eq!(transmits(&mut zero), sync);
    zero.handle_link_up(1);
    assert_eq!(transmits(&mut zero), sync);
}

#[test]
fn bounds_are_errors_or_overflow() {
    let mut a = core(2, 3, 0);
    let too_big = Bytes::from(vec![0; ALLGATHER_MAX_BYTES]);
    assert!(matches!(
        a.contribute(1, too_big),
        Err(AllgatherError::TooLarge { .. })
    ));
    for id in 0..ALLGATHER_INFLIGHT_MAX as u64 {
        a.barrier(id).unwrap();
    }
    assert_eq!(a.barrier(1_000), Err(AllgatherError::TooMany));

    // Two halves that do not fit together: the collective overflows.
    let mut zero = core(2, 3, 0);
    let half = Bytes::from(vec![0; ALLGATHER_MAX_BYTES / 2 + 1]);
    zero.contribute(7, half.clone()).unwrap();
    for child in [1, 2] {
        zero.handle_msg(
            child,
            AllgatherMsg::Contribution(Contribution {
                id: 7,
                digest: 0,
                overflowed: child == 2,
                entries: if child == 1 {
                    vec![(1, half.clone())]
                } else {
                    vec![]
                },
                excluded: vec![],
                excused: vec![],
                returned: false,
            }),
        );
    }
    let results = ready(&events(&mut zero));
    assert_eq!(results.len(), 1);
    assert!(results[0].overflowed && results[0].contributions.is_empty());
    assert_eq!(zero.stats().overflowed, 1);
    // Contributions after the result are late, not a new collective.
    zero.handle_result(results[0].clone());
    zero.handle_msg(
        1,
        AllgatherMsg::Contribution(Contribution {
            id: 7,
            digest: 0,
            overflowed: false,
            entries: vec![],
            excluded: vec![],
            excused: vec![],
            returned: false,
        }),
    );
    assert_eq!(zero.stats().late, 1);
    assert_eq!(zero.tracked(), 0);
}

// ----- the simulated network --------------------------------------------------------------

fn data(rank: Rank, id: u64) -> Bytes {
    if id.is_multiple_of(2) {
        Bytes::new() // even ids are barriers
    } else {
        Bytes::from(format!("{rank}/{id}"))
    }
}

fn run(seed: u64, fault: Fault, repairs: Repairs, leak: bool) -> Sim {
    let mut rng = Rng::new(seed ^ 0xa11_6a7e);
    let size = 2 + rng.below(23) as u32;
    let radix = 2 + rng.below(3) as u32;
    let mut sim = Sim::new(seed, size, radix, repairs);
    sim.leak = leak;
    let collectives = 1 + rng.below(4) as u64;
    // Each rank contributes to each collective, in a random order.
    let mut plan: Vec<Option<(Rank, u64)>> = (0..size)
        .flat_map(|r| (1..=collectives).map(move |id| Some((r, id))))
        .collect();
    for i in (1..plan.len()).rev() {
        let j = rng.below(i + 1);
        plan.swap(i, j);
    }
    let crashes = match fault {
        Fault::None => 0,
        Fault::LinkLoss => 1 + rng.below(6),
        _ => 1 + rng.below(2),
    };
    for _ in 0..crashes {
        let at = rng.below(plan.len() + 1);
        plan.insert(at, None);
    }
    let mut contributed: Vec<(Rank, u64)> = Vec::new();
    for action in plan {
        for _ in 0..rng.below(8) {
            if !sim.step() {
                break;
            }
        }
        match action {
            None => inject(&mut sim, fault),
            Some((r, id)) if sim.node(r).alive => {
                let node = &mut sim.nodes[r as usize];
                node.ag.contribute(id, data(r, id)).unwrap();
                contributed.push((r, id));
                sim.drain(r);
            }
            Some(_) => {}
        }
    }
    sim.settle();
    check(&sim, seed, collectives, &contributed);
    check_xcast(&sim, seed);
    sim
}

/// Every survivor got one identical result per collective; it holds every survivor's bytes,
/// names only crashed ranks as excluded, and every rank that crashed before contributing.
fn check(sim: &Sim, seed: u64, collectives: u64, contributed: &[(Rank, u64)]) {
    let alive = sim.alive();
    for id in 1..=collectives {
        let root = sim.node(0);
        let result = root
            .ag_done
            .iter()
            .find(|r| r.id == id)
            .unwrap_or_else(|| panic!("seed {seed}: no result for {id}"));
        assert!(!result.overflowed);
        for &r in &alive {
            let n = sim.node(r);
            let mine: Vec<_> = n.ag_done.iter().filter(|x| x.id == id).collect();
            assert_eq!(mine, vec![result], "seed {seed}: rank {r} result {id}");
            assert_eq!(result.get(r), Some(&data(r, id)), "seed {seed}: rank {r}");
        }
        let mut all: Vec<Rank> = result
            .ranks()
            .chain(result.excluded.iter().copied())
            .collect();
        all.sort_unstable();
        assert_eq!(all, (0..sim.size).collect::<Vec<_>>(), "seed {seed}");
        for (r, bytes) in &result.contributions {
            assert_eq!(bytes, &data(*r, id), "seed {seed}");
        }
        for r in &result.excluded {
            assert!(
                sim.crashed.contains(r),
                "seed {seed}: living rank {r} excluded"
            );
        }
        for &r in &sim.crashed {
            if !contributed.contains(&(r, id)) {
                assert!(
                    result.excluded.contains(&r),
                    "seed {seed}: {r} not excluded"
                );
            }
        }
    }
    for &r in &alive {
        assert_eq!(
            sim.node(r).ag.tracked(),
            0,
            "seed {seed}: rank {r} keeps state"
        );
    }
}

#[derive(Debug, Default)]
struct Totals {
    runs: u64,
    daemons: u64,
    crashed: u64,
    frames: u64,
    contributions_sent: u64,
    other_view: u64,
}

fn batch(name: &str, fault: Fault, repairs: Repairs, leak: bool) {
    crate::grpcomm::testnet::init_log();
    let mut t = Totals::default();
    for seed in crate::grpcomm::testnet::seeds() {
        let sim = run(seed, fault, repairs, leak);
        t.runs += 1;
        t.daemons += u64::from(sim.size);
        t.crashed += sim.crashed.len() as u64;
        t.frames += sim.delivered_frames;
        for n in &sim.nodes {
            t.contributions_sent += n.ag.stats().sent;
            t.other_view += n.ag.stats().other_view;
        }
    }
    log::info!("allgather {name}: {t:?}");
}

#[test]
fn sim_without_faults() {
    batch("no faults", Fault::None, Repairs::Atomic, false);
}

#[test]
fn sim_interior_crashes() {
    batch("interior", Fault::Interior, Repairs::Atomic, false);
}

#[test]
fn sim_parent_and_child_together() {
    batch(
        "parent+child",
        Fault::ParentAndChild,
        Repairs::Atomic,
        false,
    );
}

#[test]
fn sim_link_losses() {
    batch("link losses", Fault::LinkLoss, Repairs::Atomic, true);
    batch(
        "link losses, staggered",
        Fault::LinkLoss,
        Repairs::Staggered,
        true,
    );
}

#[test]
fn sim_crash_during_repair() {
    batch("during repair", Fault::DuringRepair, Repairs::Atomic, true);
}

#[test]
fn sim_staggered_repairs() {
    batch("staggered", Fault::Random, Repairs::Staggered, true);
}

#[test]
fn sim_staggered_crash_during_repair() {
    batch(
        "staggered during repair",
        Fault::DuringRepair,
        Repairs::Staggered,
        true,
    );
}

/// Delivers every transmit of `from` to its destination among `cores` (by rank), until no
/// core has anything left to send.
fn exchange(cores: &mut [(Rank, &mut Allgather)]) {
    for _ in 0..100 {
        let mut moved = false;
        for i in 0..cores.len() {
            let from = cores[i].0;
            let out = transmits(cores[i].1);
            for t in out {
                moved = true;
                if let Some((_, dst)) = cores.iter_mut().find(|(r, _)| *r == t.to) {
                    dst.handle_msg(from, t.msg);
                }
            }
        }
        if !moved {
            return;
        }
    }
    panic!("the cores never went quiet");
}

fn routing(radix: u32, size: u32, me: Rank) -> RoutingState {
    RoutingState::new(radix, size, 0)
        .unwrap()
        .as_seen_by(me)
        .unwrap()
}

#[test]
fn a_returned_rank_is_excused_from_what_was_in_flight() {
    // Ranks 0, 1, 2 (radix 2): rank 1 dies while collective 7 is in flight and returns.
    let mut r0 = routing(2, 3, 0);
    let mut r2 = routing(2, 3, 2);
    let mut a0 = Allgather::new(&r0);
    let mut a2 = Allgather::new(&r2);
    a2.contribute(7, data(2, 7)).unwrap();
    exchange(&mut [(0, &mut a0), (2, &mut a2)]);
    for (state, core) in [(&mut r0, &mut a0), (&mut r2, &mut a2)] {
        let status = state.fail(&[1], Scope::Global, Some(1)).unwrap();
        core.handle_repair(&status);
        let status = state.restore(&[1], Scope::Global, Some(2)).unwrap();
        core.handle_repair(&status);
    }
    // Its new life knows nothing of collective 7, and its application never contributes.
    let mut a1 = Allgather::rejoined(&routing(2, 3, 1));
    a0.contribute(7, data(0, 7)).unwrap();
    exchange(&mut [(0, &mut a0), (1, &mut a1), (2, &mut a2)]);
    let results = ready(&events(&mut a0));
    assert_eq!(results.len(), 1, "rank 0 waited for the returned rank");
    assert_eq!(results[0].excluded, vec![1]);
    assert_eq!(results[0].ranks().collect::<Vec<_>>(), vec![0, 2]);
    assert!(a0.stats().excuses_sent >= 1);
    // A collective started after the return waits for it.
    a0.contribute(8, data(0, 8)).unwrap();
    a2.contribute(8, data(2, 8)).unwrap();
    exchange(&mut [(0, &mut a0), (1, &mut a1), (2, &mut a2)]);
    assert!(ready(&events(&mut a0)).is_empty());
    a1.contribute(8, data(1, 8)).unwrap();
    exchange(&mut [(0, &mut a0), (1, &mut a1), (2, &mut a2)]);
    let results = ready(&events(&mut a0));
    assert_eq!(results.len(), 1);
    assert!(results[0].excluded.is_empty());
}

#[test]
fn a_returned_rank_gets_a_result_it_missed_from_its_parent_or_its_child() {
    // Ranks 0..7 (radix 2): 0 -> 1, 2; 1 -> 3, 4; 3 -> 7. Collective 5 finished everywhere
    // before rank 1 and rank 3 returned; their applications contribute again.
    let result = AllgatherResult {
        id: 5,
        overflowed: false,
        contributions: (0..8).map(|r| (r, data(r, 5))).collect(),
        excluded: vec![],
    };
    let mut a0 = Allgather::new(&routing(2, 8, 0));
    let mut a7 = Allgather::new(&routing(2, 8, 7));
    for core in [&mut a0, &mut a7] {
        core.handle_result(result.clone());
        events(core);
    }
    let mut a3 = Allgather::rejoined(&routing(2, 8, 3));
    // Rank 3 asks its child 7, which answers from its cache.
    a3.contribute(5, data(3, 5)).unwrap();
    exchange(&mut [(3, &mut a3), (7, &mut a7)]);
    let done = events(&mut a3);
    assert!(
        matches!(&done[..], [AllgatherEvent::AllgatherDone { result: r }] if *r == result),
        "{done:?}"
    );
    // Rank 1 (a leaf here: rank 4 never contributed) sends up; rank 0 answers it late.
    let mut leaf = Allgather::rejoined(&routing(2, 2, 1));
    let mut root = Allgather::new(&routing(2, 2, 0));
    root.handle_result(AllgatherResult {
        id: 5,
        overflowed: false,
        contributions: vec![(0, data(0, 5)), (1, data(1, 5))],
        excluded: vec![],
    });
    events(&mut root);
    leaf.contribute(5, data(1, 5)).unwrap();
    exchange(&mut [(0, &mut root), (1, &mut leaf)]);
    assert!(matches!(
        &events(&mut leaf)[..],
        [AllgatherEvent::AllgatherDone { .. }]
    ));
    assert_eq!(root.stats().answered_late, 1);
    // A result no longer cached: the returned daemon's collective is lost, not hung.
    for id in 100..100 + ALLGATHER_RESULTS_CACHED_MAX as u64 {
        root.handle_result(AllgatherResult {
            id,
            ..AllgatherResult::default()
        });
    }
    root.handle_result(AllgatherResult {
        id: 6,
        ..AllgatherResult::default()
    });
    for id in 200..200 + ALLGATHER_RESULTS_CACHED_MAX as u64 {
        root.handle_result(AllgatherResult {
            id,
            ..AllgatherResult::default()
        });
    }
    events(&mut root);
    leaf.contribute(6, data(1, 6)).unwrap();
    exchange(&mut [(0, &mut root), (1, &mut leaf)]);
    assert_eq!(
        events(&mut leaf),
        vec![AllgatherEvent::AllgatherLost { id: 6 }]
    );
    // A daemon in its first life waits for the broadcast instead.
    let mut first = Allgather::new(&routing(2, 2, 1));
    first.contribute(6, data(1, 6)).unwrap();
    exchange(&mut [(0, &mut root), (1, &mut first)]);
    assert!(events(&mut first).is_empty());
}

#[test]
fn a_result_broadcast_in_parts_is_kept_as_those_parts_and_answers_a_returned_rank() {
    // Rank 7 (radix 2, size 8) takes collective 5's result in three parts; rank 3, its
    // returned parent, asks for it and gets it whole.
    let result = AllgatherResult {
        id: 5,
        overflowed: false,
        contributions: (0..8).map(|r| (r, data(r, 5))).collect(),
        excluded: vec![],
    };
    let encoded = result.encode();
    let third = encoded.len() / 3;
    let parts = vec![
        encoded.slice(..third),
        encoded.slice(third..2 * third),
        encoded.slice(2 * third..),
    ];
    let mut a7 = Allgather::new(&routing(2, 8, 7));
    a7.handle_result_parts(Bytes::copy_from_slice(&encoded), parts.clone())
        .unwrap();
    assert!(matches!(
        &events(&mut a7)[..],
        [AllgatherEvent::AllgatherDone { result: r }] if *r == result
    ));
    // Kept: the parts themselves, not the copy that was decoded.
    let (_, kept, _) = &a7.results[0];
    assert_eq!(kept.len(), 3);
    for (kept, part) in kept.iter().zip(&parts) {
        assert_eq!(kept.as_ptr(), part.as_ptr());
    }
    let mut a3 = Allgather::rejoined(&routing(2, 8, 3));
    a3.contribute(5, data(3, 5)).unwrap();
    exchange(&mut [(3, &mut a3), (7, &mut a7)]);
    assert!(matches!(
        &events(&mut a3)[..],
        [AllgatherEvent::AllgatherDone { result: r }] if *r == result
    ));
    assert_eq!(a7.stats().answered_late, 1);
    // A result that does not decode is refused and changes nothing.
    assert!(
        a7.handle_result_parts(encoded.slice(..third), parts)
            .is_err()
    );
    assert_eq!(a7.results.len(), 1);
}
