//! Group collectives (issue "Jobs") in live in-process DVMs on loopback: two jobs on
//! overlapping sets of daemons run allgathers, barriers and broadcasts at once; only members
//! and their ancestors take part; a dying member and a dying relay are tolerated; misuse and
//! the in-flight bound are errors that take no number.

mod common;

use bytes::Bytes;
use common::{HANG_GUARD, loopback_config, start_dvm};
use crossbeam_channel::unbounded;
use std::time::{Duration, Instant};
use tbon::routed::{Route, RoutingState};
use tbon::{Group, Rank, SendError};

fn data(job: u64, rank: Rank, seq: u64) -> Bytes {
    Bytes::from(format!("job {job} rank {rank} collective {seq}"))
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < HANG_GUARD, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether `me`'s subtree (or `me`) holds a member of `members`, in the failure-free tree.
fn holds_member(radix: u32, size: u32, me: Rank, members: &[Rank]) -> bool {
    let routing = RoutingState::new(radix, size, me).unwrap();
    members
        .iter()
        .any(|&m| matches!(routing.route(m), Route::Local | Route::Child(_)))
}

#[test]
fn two_jobs_on_overlapping_daemons_run_their_collectives_at_once() {
    let dvm = start_dvm(15, &loopback_config(2));
    let jobs: [(u64, Vec<Rank>); 2] = [(7, vec![3, 4, 7, 8, 9, 10]), (8, vec![4, 5, 9, 11, 12])];
    let mut threads = Vec::new();
    for (job, members) in &jobs {
        for &m in members {
            let h = dvm[m as usize].handle();
            let (job, members) = (*job, members.clone());
            threads.push(std::thread::spawn(move || {
                let group = Group::new(job, members.clone()).unwrap();
                let mut out = Vec::new();
                for round in 0..3u64 {
                    let seq = 3 * round;
                    let all = h
                        .group_allgather_wait(&group, data(job, m, seq), HANG_GUARD)
                        .unwrap();
                    assert_eq!(all.id, seq);
                    let barrier = h.group_barrier_wait(&group, HANG_GUARD).unwrap();
                    assert_eq!(barrier.id, seq + 1);
                    let root = members[round as usize % members.len()];
                    let bcast = h
                        .group_broadcast_wait(&group, root, data(job, m, seq + 2), HANG_GUARD)
                        .unwrap();
                    assert_eq!(bcast, data(job, root, seq + 2));
                    out.push(all);
                }
                assert_eq!(group.next_seq(&h), 9);
                (job, m, out)
            }));
        }
    }
    let mut by_job: std::collections::BTreeMap<u64, Vec<_>> = Default::default();
    for t in threads {
        let (job, m, results) = t.join().unwrap();
        by_job.entry(job).or_default().push((m, results));
    }
    for (job, members) in &jobs {
        let results = &by_job[job];
        assert_eq!(results.len(), members.len());
        for (m, mine) in results {
            assert_eq!(mine, &results[0].1, "member {m} of job {job}");
            for r in mine {
                assert!(r.excluded.is_empty() && !r.overflowed);
                let ranks: Vec<Rank> = r.ranks().collect();
                assert_eq!(&ranks, members);
                for &x in members {
                    assert_eq!(r.get(x), Some(&data(*job, x, r.id)));
                }
            }
        }
    }
    // Only the part of the tree that holds members did work.
    let all: Vec<Rank> = jobs.iter().flat_map(|(_, m)| m.clone()).collect();
    for d in &dvm {
        let c = d.counters().unwrap();
        let involved = holds_member(2, 15, d.rank(), &all);
        if !involved {
            assert_eq!(
                c.group_received + c.group_sent,
                0,
                "rank {} holds no member below it and took part",
                d.rank()
            );
        }
        assert_eq!(c.group_tracked, 0, "rank {} keeps state", d.rank());
    }
    // Rank 0 relays for both jobs without being a member.
    assert!(dvm[0].counters().unwrap().group_received > 0);
}

#[test]
fn a_dead_member_is_excluded_and_a_dead_relay_repaired_around() {
    // 15 daemons, radix 2: 0 -> {1, 2}, 1 -> {3, 5}, 3 -> {7, 11}, 5 -> {9, 13}. Rank 9 never
    // contributes and dies; rank 1 (no member, the relay of every member but rank 2) dies once
    // rank 3's subtree reached it (rank 5's waits for rank 9).
    let dvm = start_dvm(15, &loopback_config(2));
    let members: Vec<Rank> = vec![2, 3, 5, 7, 9, 11, 13];
    let relay = 1;
    assert!(!members.contains(&relay));
    let (tx, rx) = unbounded();
    for &m in members.iter().filter(|&&m| m != 9) {
        let tx = tx.clone();
        let group = Group::new(1, members.clone()).unwrap();
        dvm[m as usize]
            .group_allgather(&group, data(1, m, 0), move |r| tx.send((m, r)).unwrap())
            .unwrap();
    }
    wait_until("rank 3's subtree reached the relay", || {
        dvm[relay as usize].counters().unwrap().group_received >= 1
    });
    dvm[9].abort();
    dvm[relay as usize].abort();
    let mut results = Vec::new();
    while results.len() < members.len() - 1 {
        let (m, r) = rx.recv_timeout(HANG_GUARD).expect("a result");
        results.push(r.unwrap_or_else(|e| panic!("member {m}: {e}")));
    }
    for r in &results {
        assert_eq!(r, &results[0]);
        assert_eq!(r.excluded, vec![9]);
        for &m in members.iter().filter(|&&m| m != 9) {
            assert_eq!(r.get(m), Some(&data(1, m, 0)));
        }
    }
}

#[test]
fn misuse_and_the_in_flight_bound_are_errors_that_take_no_number() {
    let dvm = start_dvm(4, &loopback_config(2));
    let h = dvm[1].handle();
    let not_mine = Group::new(0, [0, 2]).unwrap();
    assert_eq!(
        h.group_barrier(&not_mine, |_| {}),
        Err(SendError::NotMember(1))
    );
    let too_big = Group::new(0, [1, 4]).unwrap();
    assert_eq!(
        h.group_barrier(&too_big, |_| {}),
        Err(SendError::RankOutOfRange { rank: 4, size: 4 })
    );
    let pair = Group::new(0, [1, 2]).unwrap();
    assert_eq!(
        h.group_broadcast(&pair, 3, Bytes::new(), |_| {}),
        Err(SendError::NotMember(3))
    );
    assert!(matches!(
        h.group_allgather(&pair, vec![0u8; 17 << 20], |_| {}),
        Err(SendError::TooLarge { .. })
    ));
    assert_eq!(pair.next_seq(&h), 0);
    assert!(matches!(
        tbon::Group::new(0, []),
        Err(tbon::GroupError::Empty)
    ));

    // Rank 2 never joins: rank 1's calls stay in flight up to the bound.
    let (tx, rx) = unbounded();
    for _ in 0..tbon::limits::GROUP_INFLIGHT_MAX {
        let tx = tx.clone();
        h.group_barrier(&pair, move |r| tx.send(r).unwrap())
            .unwrap();
    }
    assert_eq!(
        h.group_barrier(&pair, |_| {}),
        Err(SendError::Busy(tbon::Limit::GroupCollectivesInFlight))
    );
    assert_eq!(pair.next_seq(&h), tbon::limits::GROUP_INFLIGHT_MAX as u64);
    // Rank 2 catches up on the first: rank 1 gets room for one more.
    let pair2 = Group::new(0, [1, 2]).unwrap();
    dvm[2]
        .group_barrier_wait(&pair2, HANG_GUARD)
        .expect("rank 2's first barrier");
    assert!(rx.recv_timeout(HANG_GUARD).unwrap().is_ok());
    wait_until("room for one more", || {
        h.group_barrier(&pair, |_| {}).is_ok()
    });
    // The rest fail as the daemon stops, never hang.
    dvm[1].abort();
    let mut shut = 0;
    while let Ok(r) = rx.recv_timeout(Duration::from_secs(5)) {
        assert_eq!(r, Err(SendError::ShutDown));
        shut += 1;
    }
    assert_eq!(shut, tbon::limits::GROUP_INFLIGHT_MAX - 1);
}

#[test]
fn one_group_value_serves_several_daemons_of_a_process_each_with_its_numbers() {
    let dvm = start_dvm(3, &loopback_config(2));
    let group = Group::new(5, [0, 1, 2]).unwrap();
    let threads: Vec<_> = dvm
        .iter()
        .map(|d| {
            let (h, group) = (d.handle(), group.clone());
            std::thread::spawn(move || {
                for seq in 0..3 {
                    let r = h.group_barrier_wait(&group, HANG_GUARD).unwrap();
                    assert_eq!(r.id, seq);
                }
                assert_eq!(group.next_seq(&h), 3);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // A broadcast payload above the bound is refused at the root, taking no number.
    let h = dvm[1].handle();
    let max = h.group_broadcast_max(&group);
    assert!(max > 1 << 20, "{max}");
    assert!(matches!(
        h.group_broadcast(&group, 1, vec![0u8; max + 1], |_| {}),
        Err(SendError::TooLarge { .. })
    ));
    assert_eq!(group.next_seq(&h), 3);
}

/// One member's part of a collective, for the mismatch test.
type Call = fn(&tbon::Handle, &Group) -> Result<(), SendError>;

#[test]
fn members_that_call_different_collectives_all_learn_it() {
    let dvm = start_dvm(3, &loopback_config(2));
    let g = Group::new(77, [1, 2]).unwrap();
    let run = |r: Rank, f: Call| {
        let (h, g) = (dvm[r as usize].handle(), g.clone());
        std::thread::spawn(move || f(&h, &g))
    };
    // An allgather against a barrier; a broadcast from 1 against one from 2; a full fence
    // against a direct one: every member ends each with Mismatch, and the group stays usable.
    let pairs: [(Call, Call); 3] = [
        (
            |h, g| h.group_allgather_wait(g, "x", HANG_GUARD).map(|_| ()),
            |h, g| h.group_barrier_wait(g, HANG_GUARD).map(|_| ()),
        ),
        (
            |h, g| h.group_broadcast_wait(g, 1, "one", HANG_GUARD).map(|_| ()),
            |h, g| h.group_broadcast_wait(g, 2, "two", HANG_GUARD).map(|_| ()),
        ),
        (
            |h, g| {
                h.fence_wait(g, tbon::FenceMode::Full, HANG_GUARD)
                    .map(|_| ())
            },
            |h, g| {
                h.fence_wait(g, tbon::FenceMode::Direct, HANG_GUARD)
                    .map(|_| ())
            },
        ),
    ];
    for (one, two) in pairs {
        let (a, b) = (run(1, one), run(2, two));
        assert_eq!(a.join().unwrap(), Err(SendError::Mismatch));
        assert_eq!(b.join().unwrap(), Err(SendError::Mismatch));
    }
    let (a, b) = (
        run(1, |h, g| h.group_barrier_wait(g, HANG_GUARD).map(|_| ())),
        run(2, |h, g| h.group_barrier_wait(g, HANG_GUARD).map(|_| ())),
    );
    assert_eq!((a.join().unwrap(), b.join().unwrap()), (Ok(()), Ok(())));
}

#[test]
fn an_overflowed_collective_still_names_the_dead_member() {
    // 15 daemons, radix 2 (see above): members 2, 7, 9 and 11; rank 9 dies before the
    // collective. Ranks 7 and 11 bring 9 MiB each: their relay, rank 3 (no member), overflows
    // merging them and sends up who entered without their bytes (decoded by rank 1, then rank
    // 0). Every member gets a result with no data that excludes rank 9 (it excluded nobody:
    // from an outside-in review of jobs from C).
    let dvm = start_dvm(15, &loopback_config(2));
    let members: Vec<Rank> = vec![2, 7, 9, 11];
    dvm[9].abort();
    for d in dvm.iter().filter(|d| d.rank() != 9) {
        wait_until("rank 9's death known", || {
            d.counters().is_ok_and(|c| c.failed.contains(&9))
        });
    }
    let big = Bytes::from(vec![7u8; 9 << 20]);
    let (tx, rx) = unbounded();
    for m in [2, 7, 11] {
        let tx = tx.clone();
        let group = Group::new(1, members.clone()).unwrap();
        dvm[m as usize]
            .group_allgather(&group, big.clone(), move |r| tx.send((m, r)).unwrap())
            .unwrap();
    }
    for _ in 0..3 {
        let (m, r) = rx.recv_timeout(HANG_GUARD).expect("a result");
        let r = r.unwrap_or_else(|e| panic!("member {m}: {e}"));
        assert!(r.overflowed, "member {m}");
        assert!(r.contributions.is_empty(), "member {m}");
        assert_eq!(r.excluded, vec![9], "member {m}");
    }
    assert!(dvm[3].counters().unwrap().protocol_errors == 0);
}
