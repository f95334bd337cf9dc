use super::*;
use crate::grpcomm::members::GroupId;
use crate::grpcomm::testnet::{Repairs, Rng, Sim};
use crate::grpcomm::xcast::tests::{Fault, inject};
use crate::routed::Scope;

fn op(context: u64, members: &[Rank], seq: u64) -> GroupOp {
    GroupOp {
        group: GroupId::new(context, members.iter().copied()).unwrap(),
        seq,
    }
}

fn routing(radix: u32, size: u32, me: Rank) -> RoutingState {
    RoutingState::new(radix, size, 0)
        .unwrap()
        .as_seen_by(me)
        .unwrap()
}

fn transmits(g: &mut GroupGather, routing: &RoutingState) -> Vec<Transmit<GroupMsg>> {
    std::iter::from_fn(|| g.poll_transmit(routing)).collect()
}

fn events(g: &mut GroupGather) -> Vec<GroupEvent> {
    std::iter::from_fn(|| g.poll_event()).collect()
}

#[test]
fn a_relay_that_is_no_member_waits_only_for_children_with_members() {
    // Radix 2, size 7: 0 -> {1, 2}, 1 -> {3, 5}, 3 -> {...}. Members 3 and 0: rank 1 relays
    // for rank 3 alone, and rank 0 waits for rank 1 only.
    let one_routing = routing(2, 7, 1);
    let mut one = GroupGather::new(&one_routing);
    let o = op(1, &[0, 3], 0);
    assert_eq!(
        one.contribute(o.clone(), Bytes::new()),
        Err(GroupContributeError::NotMember)
    );
    let from3 = GroupMsg::Contribution {
        op: o.clone(),
        digest: 0,
        data: GroupData {
            entries: vec![(3, Bytes::from_static(b"three"))],
            ..GroupData::default()
        },
    };
    one.handle_msg(&one_routing, 3, from3);
    let sent = transmits(&mut one, &one_routing);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].to, 0);

    let zero_routing = routing(2, 7, 0);
    let mut zero = GroupGather::new(&zero_routing);
    zero.contribute(o.clone(), Bytes::from_static(b"zero"))
        .unwrap();
    assert_eq!(transmits(&mut zero, &zero_routing), vec![]);
    zero.handle_msg(&zero_routing, 1, sent[0].msg.clone());
    let down = transmits(&mut zero, &zero_routing);
    // The result goes to rank 1 only: rank 2's subtree holds no member.
    assert_eq!(down.len(), 1);
    assert_eq!(down[0].to, 1);
    let [GroupEvent::Done { result: Ok(r), .. }] = &events(&mut zero)[..] else {
        panic!("rank 0 is a member and has its result");
    };
    assert_eq!(r.get(3), Some(&Bytes::from_static(b"three")));
    assert_eq!(r.get(0), Some(&Bytes::from_static(b"zero")));
    assert_eq!(zero.tracked(), 0);
    assert_eq!(
        zero.contribute(o, Bytes::new()),
        Err(GroupContributeError::Finished)
    );

    // Rank 1 passes it to rank 3 and has no event (no member).
    one.handle_msg(&one_routing, 0, down[0].msg.clone());
    let passed = transmits(&mut one, &one_routing);
    assert_eq!(passed.iter().map(|t| t.to).collect::<Vec<_>>(), vec![3]);
    assert_eq!(events(&mut one), vec![]);
    assert_eq!(one.tracked(), 0);
}

#[test]
fn a_late_contribution_is_answered_from_the_cache_or_told_lost() {
    // Rank 0 alone with its child 1 (radix 2, size 2); group {0, 1}.
    let zero_routing = routing(2, 2, 0);
    let mut zero = GroupGather::new(&zero_routing);
    let mut first = None;
    for seq in 0..(GROUP_RESULTS_CACHED_MAX as u64 + 1) {
        let o = op(5, &[0, 1], seq);
        zero.contribute(o.clone(), Bytes::new()).unwrap();
        let contribution = GroupMsg::Contribution {
            op: o.clone(),
            digest: 0,
            data: GroupData {
                entries: vec![(1, Bytes::from_static(b"1"))],
                ..GroupData::default()
            },
        };
        zero.handle_msg(&zero_routing, 1, contribution.clone());
        assert_eq!(transmits(&mut zero, &zero_routing).len(), 1);
        first.get_or_insert(contribution);
        let last = op(5, &[0, 1], seq);
        // The newest is answered with its result, again.
        zero.handle_msg(
            &zero_routing,
            1,
            GroupMsg::Contribution {
                op: last,
                digest: 0,
                data: GroupData::default(),
            },
        );
        let again = transmits(&mut zero, &zero_routing);
        assert!(
            matches!(&again[..], [Transmit { to: 1, msg: GroupMsg::Result { lost: false, data, .. } }]
                if data.entries.len() == 2)
        );
    }
    // The first was evicted from the cache but is remembered as finished: lost.
    zero.handle_msg(&zero_routing, 1, first.unwrap());
    let lost = transmits(&mut zero, &zero_routing);
    assert!(matches!(
        &lost[..],
        [Transmit {
            to: 1,
            msg: GroupMsg::Result { lost: true, .. }
        }]
    ));
    assert_eq!(zero.stats().answered_lost, 1);

    // A member told "lost" ends its collective with that failure.
    let one_routing = routing(2, 2, 1);
    let mut one = GroupGather::new(&one_routing);
    one.contribute(op(5, &[0, 1], 0), Bytes::new()).unwrap();
    one.handle_msg(&one_routing, 0, lost[0].msg.clone());
    assert_eq!(
        events(&mut one),
        vec![GroupEvent::Done {
            op: op(5, &[0, 1], 0),
            result: Err(GroupFailure::Lost)
        }]
    );
    assert_eq!(one.in_flight(), 0);
}

#[test]
fn bounds_and_misuse_are_errors() {
    let r = routing(2, 4, 1);
    let mut g = GroupGather::new(&r);
    assert_eq!(
        g.contribute(op(0, &[1, 9], 0), Bytes::new()),
        Err(GroupContributeError::RankOutOfRange(9))
    );
    for seq in 0..GROUP_INFLIGHT_MAX as u64 {
        g.contribute(op(0, &[0, 1], seq), Bytes::new()).unwrap();
    }
    assert_eq!(
        g.contribute(op(0, &[0, 1], 9999), Bytes::new()),
        Err(GroupContributeError::TooMany)
    );
    assert_eq!(
        g.contribute(op(0, &[0, 1], 0), Bytes::new()),
        Err(GroupContributeError::AlreadyContributed)
    );
    let big = Bytes::from(vec![0u8; ALLGATHER_MAX_BYTES]);
    assert!(matches!(
        g.contribute(op(1, &[1], 0), big),
        Err(GroupContributeError::TooLarge { .. })
    ));
}

// ----- the simulated network --------------------------------------------------------------

/// Half the gathered bytes' bound and one byte: two such contributions overflow it. One
/// allocation shared by every contribution (frames are encoded, so each hop copies it once).
fn half_the_bound() -> Bytes {
    static BIG: std::sync::OnceLock<Bytes> = std::sync::OnceLock::new();
    BIG.get_or_init(|| Bytes::from(vec![0x5a; crate::limits::ALLGATHER_MAX_BYTES / 2 + 1]))
        .clone()
}

/// A member's contribution; with `big`, odd collectives bring [`half_the_bound`] (they
/// overflow wherever two meet).
fn data(rank: Rank, o: &GroupOp, big: bool) -> Bytes {
    if o.seq.is_multiple_of(2) {
        Bytes::new() // even collectives are barriers
    } else if big {
        half_the_bound()
    } else {
        Bytes::from(format!("{rank}/{}/{}", o.group.context(), o.seq))
    }
}

/// Random overlapping groups, each running a few collectives; every member contributes to
/// each in a random order interleaved with `fault`s.
fn run(seed: u64, fault: Fault, repairs: Repairs, leak: bool, big: bool) -> (Sim, Vec<GroupOp>) {
    let mut rng = Rng::new(seed ^ 0x6_7009);
    let size = 2 + rng.below(30) as u32;
    let radix = 2 + rng.below(3) as u32;
    let mut sim = Sim::new(seed, size, radix, repairs);
    sim.leak = leak;
    let mut ops = Vec::new();
    for context in 0..1 + rng.below(4) as u64 {
        let want = 1 + rng.below(size as usize);
        let members: Vec<Rank> = (0..want)
            .map(|_| rng.below(size as usize) as Rank)
            .collect();
        let group = GroupId::new(context, members).unwrap();
        for seq in 0..1 + rng.below(3) as u64 {
            ops.push(GroupOp {
                group: group.clone(),
                seq,
            });
        }
    }
    let mut plan: Vec<Option<(Rank, usize)>> = ops
        .iter()
        .enumerate()
        .flat_map(|(i, o)| o.group.members().iter().map(move |&m| Some((m, i))))
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
    let mut contributed: Vec<(Rank, usize)> = Vec::new();
    for action in plan {
        for _ in 0..rng.below(8) {
            if !sim.step() {
                break;
            }
        }
        match action {
            None => inject(&mut sim, fault),
            Some((r, i)) if sim.node(r).alive => {
                let node = &mut sim.nodes[r as usize];
                node.group
                    .contribute(ops[i].clone(), data(r, &ops[i], big))
                    .unwrap();
                contributed.push((r, i));
                sim.drain(r);
            }
            Some(_) => {}
        }
    }
    sim.settle();
    check(&sim, seed, &ops, &contributed, big);
    (sim, ops)
}

/// Every living member got one identical result per collective: every living member's bytes,
/// only crashed members excluded (every crashed member that never contributed among them), and
/// nothing of any other group. With `big`, a result may have overflowed: then it carries no
/// bytes, and still excludes exactly as above (crashed members only, every crashed member
/// that never contributed).
fn check(sim: &Sim, seed: u64, ops: &[GroupOp], contributed: &[(Rank, usize)], big: bool) {
    let alive = sim.alive();
    for (i, o) in ops.iter().enumerate() {
        let mut first: Option<&AllgatherResult> = None;
        for &m in o.group.members().iter().filter(|m| alive.contains(m)) {
            let mine: Vec<_> = sim
                .node(m)
                .group_done
                .iter()
                .filter(|(x, _)| x == o)
                .collect();
            let [(_, Ok(result))] = &mine[..] else {
                for r in &alive {
                    eprintln!("rank {r}: {}", sim.node(*r).group.describe(o));
                }
                eprintln!("crashed {:?}", sim.crashed);
                panic!("seed {seed}: member {m} of {o:?} ended with {mine:?}");
            };
            assert!(big || !result.overflowed, "seed {seed}: {o:?} overflowed");
            assert_eq!(result.id, o.seq);
            match first {
                None => first = Some(result),
                Some(f) => assert_eq!(f, result, "seed {seed}: member {m} differs"),
            }
        }
        let Some(result) = first else { continue };
        if result.overflowed {
            assert!(result.contributions.is_empty(), "seed {seed}: {o:?}");
        } else {
            let mut all: Vec<Rank> = result
                .ranks()
                .chain(result.excluded.iter().copied())
                .collect();
            all.sort_unstable();
            assert_eq!(all, o.group.members(), "seed {seed}: {o:?}");
        }
        for (r, bytes) in &result.contributions {
            assert_eq!(bytes, &data(*r, o, big), "seed {seed}");
        }
        for r in &result.excluded {
            assert!(sim.crashed.contains(r), "seed {seed}: living {r} excluded");
        }
        for &r in o.group.members() {
            if sim.crashed.contains(&r) && !contributed.contains(&(r, i)) {
                assert!(
                    result.excluded.contains(&r),
                    "seed {seed}: {r} not excluded"
                );
            }
        }
    }
    for &r in &alive {
        let node = sim.node(r);
        assert_eq!(node.group.tracked(), 0, "seed {seed}: rank {r} keeps state");
        for (o, _) in &node.group_done {
            assert!(
                o.group.contains(r),
                "seed {seed}: rank {r} got another group's"
            );
        }
    }
}

fn batch(name: &str, fault: Fault, repairs: Repairs, leak: bool) {
    crate::grpcomm::testnet::init_log();
    let (mut runs, mut frames, mut late) = (0u64, 0u64, 0u64);
    for seed in crate::grpcomm::testnet::seeds() {
        let (sim, ops) = run(seed, fault, repairs, leak, false);
        runs += 1;
        frames += sim.nodes.iter().map(|n| n.group_frames).sum::<u64>();
        late += sim
            .nodes
            .iter()
            .map(|n| n.group.stats().answered_late)
            .sum::<u64>();
        if fault == Fault::None {
            // Only members and their ancestors hear of a group.
            for n in &sim.nodes {
                let me = n.routing.me();
                let below = |o: &GroupOp| {
                    o.group
                        .members()
                        .iter()
                        .any(|&m| m == me || matches!(n.routing.route(m), Route::Child(_)))
                };
                if !ops.iter().any(below) {
                    assert_eq!(n.group_frames, 0, "seed {seed}: rank {me} heard a group");
                }
            }
        }
    }
    log::info!("group {name}: {runs} runs, {frames} frames, {late} late answers");
}

/// Overflowing collectives under crashes (fewer seeds: each contribution is 8 MiB): members
/// agree on one result, and an overflowed one still names exactly the members that crashed
/// before they entered (it named none: from an outside-in review of jobs from C).
#[test]
fn sim_overflowing_collectives_with_crashes() {
    crate::grpcomm::testnet::init_log();
    let mut overflowed = 0;
    for seed in crate::grpcomm::testnet::seeds().take(40) {
        let (sim, ops) = run(seed, Fault::Random, Repairs::Staggered, true, true);
        overflowed += ops
            .iter()
            .filter(|o| {
                sim.alive().iter().any(|&m| {
                    sim.node(m)
                        .group_done
                        .iter()
                        .any(|(x, r)| x == *o && r.as_ref().is_ok_and(|r| r.overflowed))
                })
            })
            .count();
    }
    assert!(overflowed > 0, "no collective overflowed");
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
    batch("parent+child", Fault::ParentAndChild, Repairs::Atomic, true);
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
    batch(
        "during repair",
        Fault::DuringRepair,
        Repairs::Staggered,
        true,
    );
}

#[test]
fn sim_staggered_random_crashes() {
    batch("staggered", Fault::Random, Repairs::Staggered, true);
}

/// Delivers every message among `cores` (each with its routing) until none is left.
fn exchange(cores: &mut [(&RoutingState, &mut GroupGather)]) {
    for _ in 0..64 {
        let mut sent = Vec::new();
        for (state, core) in cores.iter_mut() {
            let from = state.me();
            sent.extend(transmits(core, state).into_iter().map(|t| (from, t)));
        }
        if sent.is_empty() {
            return;
        }
        for (from, t) in sent {
            if let Some((state, core)) = cores.iter_mut().find(|(s, _)| s.me() == t.to) {
                core.handle_msg(state, from, t.msg);
            }
        }
    }
    panic!("the cores never went quiet");
}

#[test]
fn a_returned_member_is_excused_from_what_was_in_flight_even_as_a_relay() {
    // Radix 2, size 4: 0 -> {1, 2}, 1 -> {3}. Group {0, 1, 3}: rank 1 dies while collective 0
    // is in flight and returns; its new life relays for rank 3 but its application never
    // calls collective 0.
    let mut r0 = routing(2, 4, 0);
    let mut r3 = routing(2, 4, 3);
    assert_eq!(routing(2, 4, 1).children(), &[3]);
    let o = op(4, &[0, 1, 3], 0);
    let mut zero = GroupGather::new(&r0);
    let mut three = GroupGather::new(&r3);
    zero.contribute(o.clone(), Bytes::from_static(b"0"))
        .unwrap();
    for (state, core) in [(&mut r0, &mut zero), (&mut r3, &mut three)] {
        let status = state.fail(&[1], Scope::Global, Some(1)).unwrap();
        core.handle_repair(&status);
        let status = state.restore(&[1], Scope::Global, Some(2)).unwrap();
        core.handle_repair(&status);
    }
    // Rank 3 calls after the return: only rank 0 knows that collective 0 was in flight then,
    // and its `Excuse` must reach rank 1 for rank 1 to send rank 3's entry without its own.
    three
        .contribute(o.clone(), Bytes::from_static(b"3"))
        .unwrap();
    let r1 = routing(2, 4, 1);
    let mut one = GroupGather::rejoined(&r1);
    exchange(&mut [(&r0, &mut zero), (&r1, &mut one), (&r3, &mut three)]);
    let done = events(&mut zero);
    let result = match &done[..] {
        [GroupEvent::Done { result: Ok(r), .. }] => r.clone(),
        other => panic!("rank 0 waited for the returned member: {other:?}"),
    };
    assert_eq!(result.excluded, vec![1]);
    assert_eq!(result.ranks().collect::<Vec<_>>(), vec![0, 3]);
    assert!(zero.stats().excuses_sent >= 1);
    assert!(
        matches!(&events(&mut three)[..], [GroupEvent::Done { result: Ok(r), .. }] if *r == result)
    );
    // Its application calls collective 0 later: the result its daemon relayed.
    one.contribute(o.clone(), Bytes::from_static(b"1")).unwrap();
    assert!(
        matches!(&events(&mut one)[..], [GroupEvent::Done { result: Ok(r), .. }] if *r == result)
    );
    assert_eq!(
        one.contribute(o.clone(), Bytes::new()),
        Err(GroupContributeError::Finished)
    );
    // A collective started after the return waits for the returned member.
    let next = op(4, &[0, 1, 3], 1);
    zero.contribute(next.clone(), Bytes::new()).unwrap();
    three.contribute(next.clone(), Bytes::new()).unwrap();
    exchange(&mut [(&r0, &mut zero), (&r1, &mut one), (&r3, &mut three)]);
    assert!(events(&mut zero).is_empty(), "{}", zero.describe(&next));
    one.contribute(next.clone(), Bytes::new()).unwrap();
    exchange(&mut [(&r0, &mut zero), (&r1, &mut one), (&r3, &mut three)]);
    assert!(
        matches!(&events(&mut zero)[..], [GroupEvent::Done { result: Ok(r), .. }] if r.excluded.is_empty())
    );
    for core in [&zero, &one, &three] {
        assert_eq!(core.tracked(), 0);
    }
}

#[test]
fn an_overflowed_result_still_names_the_members_that_did_not_enter() {
    // Radix 2, size 4: 0 -> {1, 2}, 1 -> {3}. Group {0, 1, 2, 3}; rank 2 died before its call.
    // Ranks 1 and 3 bring 9 MiB each: rank 1 overflows merging them. The result carries no
    // data, but names rank 2 as excluded (it named nobody: a full fence then reported no
    // member lost, from an outside-in review of jobs from C).
    let mut states: Vec<RoutingState> = (0..4).map(|me| routing(2, 4, me)).collect();
    let mut cores: Vec<GroupGather> = states.iter().map(GroupGather::new).collect();
    for (state, core) in states.iter_mut().zip(cores.iter_mut()) {
        if state.me() != 2 {
            let status = state.fail(&[2], Scope::Global, Some(1)).unwrap();
            core.handle_repair(&status);
        }
    }
    let o = op(9, &[0, 1, 2, 3], 0);
    let big = Bytes::from(vec![7u8; 9 << 20]);
    cores[3].contribute(o.clone(), big.clone()).unwrap();
    cores[1].contribute(o.clone(), big).unwrap();
    cores[0]
        .contribute(o.clone(), Bytes::from_static(b"0"))
        .unwrap();
    let (r0, r1, r3) = (states[0].clone(), states[1].clone(), states[3].clone());
    let [zero, one, _, three] = &mut cores[..] else {
        unreachable!()
    };
    exchange(&mut [(&r0, zero), (&r1, one), (&r3, three)]);
    for rank in [0, 1, 3] {
        match &events(&mut cores[rank])[..] {
            [GroupEvent::Done { result: Ok(r), .. }] => {
                assert!(r.overflowed, "rank {rank}");
                assert!(r.contributions.is_empty(), "rank {rank}");
                assert_eq!(r.excluded, vec![2], "rank {rank}");
            }
            other => panic!("rank {rank}: {other:?}"),
        }
    }
}
