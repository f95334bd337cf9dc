//! The data exchange (issue "Jobs") in live in-process DVMs on loopback: two jobs on
//! overlapping daemons, one exchanging by full fence and one by direct fetches; values that
//! were never put; a dead owner; gets answered from the cache.

mod common;

use bytes::Bytes;
use common::{HANG_GUARD, loopback_config, start_dvm};
use tbon::{FenceMode, GetError, Group, Rank};

fn endpoint(job: u64, rank: Rank) -> Bytes {
    Bytes::from(format!(
        "job {job}: rank {rank} listens on 10.0.{rank}.1:{}",
        5000 + job
    ))
}

#[test]
fn two_jobs_exchange_by_full_fence_and_by_direct_fetch() {
    let dvm = start_dvm(9, &loopback_config(2));
    let jobs: [(u64, Vec<Rank>, FenceMode); 2] = [
        (21, vec![1, 3, 4, 8], FenceMode::Full),
        (22, vec![3, 4, 5, 7], FenceMode::Direct),
    ];
    let mut threads = Vec::new();
    for (job, members, mode) in &jobs {
        for &m in members {
            let h = dvm[m as usize].handle();
            let (job, members, mode) = (*job, members.clone(), *mode);
            threads.push(std::thread::spawn(move || {
                let g = Group::new(job, members.iter().copied()).unwrap();
                h.put(&g, "endpoint", endpoint(job, m)).unwrap();
                h.put(&g, "cores", Bytes::from(vec![m as u8; 4])).unwrap();
                h.commit(&g).unwrap();
                assert!(h.fence_wait(&g, mode, HANG_GUARD).unwrap().is_empty());
                for &other in &members {
                    assert_eq!(
                        h.get_wait(&g, other, "endpoint", HANG_GUARD).unwrap(),
                        endpoint(job, other)
                    );
                    assert_eq!(
                        h.get_wait(&g, other, "cores", HANG_GUARD).unwrap(),
                        Bytes::from(vec![other as u8; 4])
                    );
                    assert_eq!(
                        h.get_wait(&g, other, "never-put", HANG_GUARD),
                        Err(GetError::NotFound)
                    );
                }
                let c = h.counters().unwrap();
                (job, m, c.modex_fetches, c.modex_hits)
            }));
        }
    }
    for t in threads {
        let (job, m, fetches, hits) = t.join().unwrap();
        if job == 21 {
            // Full fence: everything was local afterwards (rank 3 and 4 are in both jobs:
            // their fetches are job 22's three owners).
            assert!(fetches <= 3, "rank {m}: {fetches} fetches");
        }
        assert!(hits > 0, "rank {m}");
    }
    // Job 22 fetched each other member's data once, then answered from the cache.
    let c = dvm[5].counters().unwrap();
    assert_eq!(c.modex_fetches, 3, "{c:?}");
}

#[test]
fn a_dead_owner_is_an_error_never_a_hang_and_misuse_is_refused() {
    let dvm = start_dvm(5, &loopback_config(2));
    let g = Group::new(3, [1, 2, 3]).unwrap();
    for r in [1u32, 2, 3] {
        dvm[r as usize]
            .put(&g, "k", Bytes::from_static(b"v"))
            .unwrap();
        dvm[r as usize].commit(&g).unwrap();
    }
    let fences: Vec<_> = [1u32, 2, 3]
        .iter()
        .map(|&r| {
            let (h, g) = (dvm[r as usize].handle(), g.clone());
            std::thread::spawn(move || h.fence_wait(&g, FenceMode::Direct, HANG_GUARD))
        })
        .collect();
    for f in fences {
        assert_eq!(f.join().unwrap(), Ok(vec![]));
    }
    dvm[3].abort();
    // Rank 1 asks the dead rank 3: an error once the death is known, never a hang.
    let got = dvm[1].get_wait(&g, 3, "k", HANG_GUARD);
    assert_eq!(got, Err(GetError::NodeDown(3)));
    assert_eq!(
        dvm[1].get_wait(&g, 2, "k", HANG_GUARD),
        Ok(Bytes::from_static(b"v"))
    );
    // Misuse.
    assert_eq!(
        dvm[1].get_wait(&g, 4, "k", HANG_GUARD),
        Err(GetError::NotMember(4))
    );
    assert!(matches!(
        dvm[1].get_wait(&g, 2, &"k".repeat(300), HANG_GUARD),
        Err(GetError::KeyTooLong(300))
    ));
    assert_eq!(
        dvm[4].put(&g, "k", Bytes::new()),
        Err(tbon::SendError::NotMember(4))
    );
    // A member outside the DVM of 5 is refused at the put, the commit and the get, not only
    // at the fence (from an outside-in review: put and commit took it).
    let wide = Group::new(4, [1, 2, 99]).unwrap();
    let out = Err(tbon::SendError::RankOutOfRange { rank: 99, size: 5 });
    assert_eq!(dvm[1].put(&wide, "k", Bytes::new()), out);
    assert_eq!(dvm[1].commit(&wide), out);
    let out = Err(GetError::RankOutOfRange { rank: 99, size: 5 });
    assert_eq!(dvm[1].get_wait(&wide, 99, "k", HANG_GUARD), out);
    assert_eq!(dvm[1].get_wait(&wide, 2, "k", HANG_GUARD), out);
    assert_eq!(
        dvm[1].get_wait(&g, 7, "k", HANG_GUARD),
        Err(GetError::RankOutOfRange { rank: 7, size: 5 })
    );
    // Forgotten: nothing left here, not even this daemon's own data; another member's is
    // fetched again from it (it has not forgotten the group).
    dvm[1].forget_group(&g).unwrap();
    assert_eq!(
        dvm[1].get_wait(&g, 1, "k", HANG_GUARD),
        Err(GetError::NotFound)
    );
    assert_eq!(
        dvm[1].get_wait(&g, 2, "k", HANG_GUARD),
        Ok(Bytes::from_static(b"v"))
    );
    // After the stop every call fails `ShutDown`, the put too (it only stages, and took
    // data before).
    dvm[2].shutdown();
    assert_eq!(
        dvm[2].put(&g, "k", Bytes::new()),
        Err(tbon::SendError::ShutDown)
    );
    assert_eq!(dvm[2].commit(&g), Err(tbon::SendError::ShutDown));
}

#[test]
fn every_fence_starts_a_new_round_and_only_members_read_the_data() {
    let dvm = start_dvm(4, &loopback_config(2));
    let g = Group::new(101, [1, 2]).unwrap();
    for (round, mode) in [
        ("one", FenceMode::Direct),
        ("two", FenceMode::Direct),
        ("three", FenceMode::Full),
        ("four", FenceMode::Direct),
    ] {
        let threads: Vec<_> = [1u32, 2]
            .iter()
            .map(|&r| {
                let (h, g) = (dvm[r as usize].handle(), g.clone());
                std::thread::spawn(move || {
                    h.put(&g, "ep", format!("{round}-{r}")).unwrap();
                    h.commit(&g).unwrap();
                    h.fence_wait(&g, mode, HANG_GUARD).unwrap();
                    let other = 3 - r;
                    let got = h.get_wait(&g, other, "ep", HANG_GUARD).unwrap();
                    assert_eq!(got, format!("{round}-{other}").as_bytes(), "{mode:?}");
                    // Both have read before either commits the next round.
                    h.group_barrier_wait(&g, HANG_GUARD).unwrap();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
    // A daemon outside the job reads none of its data.
    assert_eq!(
        dvm[0].get_wait(&g, 1, "ep", HANG_GUARD),
        Err(GetError::NotMember(0))
    );
}
