//! The group half of the harness workload (`tbon harness --pattern group`, issue "Jobs"): the
//! DVM's daemons form random, overlapping groups of `--group-size` (about two per daemon, as
//! jobs sharing nodes do), and every member runs each group's collectives in order, spread over
//! the run: an allgather of bytes that are a function of (seed, group, number, rank), then a
//! barrier, then a broadcast from a member that changes each time, then a fence of the data
//! exchange (full and direct in turn) after which it gets every member's committed endpoint.
//! Each member checks what it got (every contribution's bytes, the broadcast's bytes, every
//! endpoint) and records a digest of the result, so the harness can tell that every surviving
//! member got the same one (`harness/check_groups.rs`).

use super::workload::Rng;
use bytes::Bytes;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tbon::{AllgatherResult, Group, Handle, SendError};

/// A member gives a collective up after this long (a guard against hangs, far above any
/// repair time; the harness reports such an outcome as a failure).
const COLLECTIVE_GUARD: Duration = Duration::from_secs(120);

/// The groups of a run: (context, members ascending), the same at every daemon.
pub fn groups(seed: u64, size: u32, group_size: u32) -> Vec<(u64, Vec<u32>)> {
    let k = group_size.clamp(1, size.max(1));
    let count = (2 * size).div_ceil(k).max(1);
    let mut rng = Rng::new(seed ^ 0x6A0B_0000_0000_0001);
    (0..count)
        .map(|g| {
            let mut members: Vec<u32> = (0..size).collect();
            // A partial Fisher-Yates shuffle: the first k are the members.
            for i in 0..k as usize {
                let j = i + rng.below(u64::from(size) - i as u64) as usize;
                members.swap(i, j);
            }
            members.truncate(k as usize);
            members.sort_unstable();
            (1000 + u64::from(g), members)
        })
        .collect()
}

/// Member `rank`'s contribution to collective `seq` of the group of `context`.
pub fn contribution(seed: u64, context: u64, seq: u64, rank: u32) -> Bytes {
    let mut rng = Rng::new(seed ^ context.rotate_left(20) ^ seq.rotate_left(40) ^ u64::from(rank));
    let len = 16 + rng.below(497) as usize;
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&rank.to_be_bytes());
    v.extend_from_slice(&seq.to_be_bytes());
    while v.len() < len {
        v.push(rng.next_u64() as u8);
    }
    Bytes::from(v)
}

/// The kind of collective number `seq` of a group, and for a broadcast its root.
pub fn kind(seq: u64, members: &[u32]) -> (&'static str, Option<u32>) {
    match seq % 4 {
        0 => ("allgather", None),
        1 => ("barrier", None),
        2 => (
            "broadcast",
            members
                .get((seq / 4) as usize % members.len().max(1))
                .copied(),
        ),
        _ if (seq / 4).is_multiple_of(2) => ("full-fence", None),
        _ => ("direct-fence", None),
    }
}

/// Member `rank`'s endpoint in the data exchange of the group of `context`.
pub fn endpoint(seed: u64, context: u64, rank: u32) -> Bytes {
    Bytes::from(format!(
        "{seed}/{context}: rank {rank} at 10.0.{}.{}",
        rank / 256,
        rank % 256
    ))
}

/// One collective at one member and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collected {
    /// The group's index in [`groups`].
    pub group: u64,
    pub seq: u64,
    /// `ok`, `wrong-bytes`, `root-died` (a broadcast whose root died first), or the error's
    /// name.
    pub outcome: String,
    /// FNV-1a of the result (contributions, excluded ranks; a broadcast's bytes).
    pub digest: u64,
    /// The excluded members.
    pub excluded: Vec<u32>,
}

fn fnv(h: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(h, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// Checks an allgather's or barrier's result; the outcome and the digest.
fn judge(
    seed: u64,
    context: u64,
    seq: u64,
    barrier: bool,
    r: &AllgatherResult,
) -> (&'static str, u64) {
    let mut h = 0xcbf2_9ce4_8422_2325;
    let mut right = !r.overflowed && r.id == seq;
    for (rank, bytes) in &r.contributions {
        h = fnv(h, &rank.to_be_bytes());
        h = fnv(h, bytes);
        let want = if barrier {
            Bytes::new()
        } else {
            contribution(seed, context, seq, *rank)
        };
        right &= *bytes == want;
    }
    for x in &r.excluded {
        h = fnv(h, &x.to_be_bytes());
    }
    (if right { "ok" } else { "wrong-bytes" }, h)
}

fn error_name(e: &SendError) -> String {
    match e {
        SendError::ShutDown => "shut-down".into(),
        SendError::TimedOut => "timed-out".into(),
        SendError::ResultLost => "result-lost".into(),
        SendError::NodeDown(_) => "root-died".into(),
        other => format!("error:{}", other.to_string().replace(' ', "_")),
    }
}

/// The group side of one daemon: a thread per group it belongs to.
pub struct GroupRunner {
    pub h: Handle,
    pub seed: u64,
    pub group_size: u32,
    /// Collectives each group runs.
    pub rounds: u64,
    /// The collectives are spread evenly over this long.
    pub span: Duration,
    pub record: Arc<Mutex<Vec<Collected>>>,
    /// Collectives ended here so far.
    pub ended: Arc<AtomicU64>,
    pub done: Arc<AtomicBool>,
}

impl GroupRunner {
    /// Runs every group this daemon belongs to, each on its own thread; sets `done` when all
    /// have ended.
    pub fn run(self) {
        let (me, size) = (self.h.rank(), self.h.size());
        let mine: Vec<(u64, u64, Vec<u32>)> = groups(self.seed, size, self.group_size)
            .into_iter()
            .enumerate()
            .filter(|(_, (_, m))| m.contains(&me))
            .map(|(i, (c, m))| (i as u64, c, m))
            .collect();
        let start = Instant::now();
        let threads: Vec<_> = mine
            .into_iter()
            .map(|(index, context, members)| {
                let (h, record, ended) = (self.h.clone(), self.record.clone(), self.ended.clone());
                let (seed, rounds, span) = (self.seed, self.rounds, self.span);
                std::thread::spawn(move || {
                    let Ok(group) = Group::new(context, members.iter().copied()) else {
                        return;
                    };
                    // The data exchange: this member's endpoint, committed before any fence.
                    if h.put(&group, "ep", endpoint(seed, context, h.rank()))
                        .is_err()
                        || h.commit(&group).is_err()
                    {
                        return;
                    }
                    for seq in 0..rounds {
                        let at = start + span.mul_f64(seq as f64 / rounds.max(1) as f64);
                        if let Some(wait) = at.checked_duration_since(Instant::now()) {
                            std::thread::sleep(wait);
                        }
                        let c = run_one(&h, &group, seed, index, seq, &members);
                        let stop = c.outcome == "shut-down";
                        record.lock().unwrap_or_else(|e| e.into_inner()).push(c);
                        ended.fetch_add(1, Ordering::Relaxed);
                        if stop {
                            break;
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            let _ = t.join();
        }
        self.done.store(true, Ordering::SeqCst);
    }
}

/// Runs collective `seq` of a group at this member, retrying what is refused `Busy`.
fn run_one(
    h: &Handle,
    group: &Group,
    seed: u64,
    index: u64,
    seq: u64,
    members: &[u32],
) -> Collected {
    let me = h.rank();
    let context = group.context();
    let (what, root) = kind(seq, members);
    let mut c = Collected {
        group: index,
        seq,
        outcome: String::new(),
        digest: 0,
        excluded: Vec::new(),
    };
    let mut backoff_ms = 1;
    if what.ends_with("fence") {
        let mode = if what == "full-fence" {
            tbon::FenceMode::Full
        } else {
            tbon::FenceMode::Direct
        };
        loop {
            match h.fence_wait(group, mode, COLLECTIVE_GUARD) {
                Ok(excluded) => {
                    c.excluded = excluded;
                    break;
                }
                Err(SendError::Busy(_)) => {
                    std::thread::sleep(Duration::from_millis(backoff_ms));
                    backoff_ms = (backoff_ms * 2).min(64);
                }
                Err(e) => {
                    c.outcome = error_name(&e);
                    return c;
                }
            }
        }
        // Every member's endpoint: right, or `NodeDown` for a member that died (listed with
        // the excluded, for the harness to check against its victims).
        c.outcome = "ok".into();
        for &m in members {
            match h.get_wait(group, m, "ep", COLLECTIVE_GUARD) {
                Ok(v) if v == endpoint(seed, context, m) => {}
                Ok(_) => c.outcome = "wrong-bytes".into(),
                // `NotFound`: a member restarted (`--restart`) whose new life has not committed
                // yet. Both are listed with the excluded, which must be victims.
                Err(tbon::GetError::NodeDown(x)) if x == m => {
                    if !c.excluded.contains(&m) {
                        c.excluded.push(m);
                    }
                }
                Err(tbon::GetError::NotFound) => {
                    if !c.excluded.contains(&m) {
                        c.excluded.push(m);
                    }
                }
                Err(e) => c.outcome = format!("get:{}", e.to_string().replace(' ', "_")),
            }
        }
        c.excluded.sort_unstable();
        return c;
    }
    loop {
        let outcome = match (what, root) {
            ("broadcast", Some(root)) => h
                .group_broadcast_wait(
                    group,
                    root,
                    contribution(seed, context, seq, me),
                    COLLECTIVE_GUARD,
                )
                .map(|bytes| {
                    let right = bytes == contribution(seed, context, seq, root);
                    c.digest = fnv(0xcbf2_9ce4_8422_2325, &bytes);
                    if right { "ok" } else { "wrong-bytes" }
                }),
            _ => {
                let barrier = what == "barrier";
                let data = if barrier {
                    Bytes::new()
                } else {
                    contribution(seed, context, seq, me)
                };
                h.group_allgather_wait(group, data, COLLECTIVE_GUARD)
                    .map(|r| {
                        c.excluded = r.excluded.clone();
                        let (o, d) = judge(seed, context, seq, barrier, &r);
                        c.digest = d;
                        o
                    })
            }
        };
        match outcome {
            Ok(o) => c.outcome = o.into(),
            Err(SendError::Busy(_)) => {
                std::thread::sleep(Duration::from_millis(backoff_ms));
                backoff_ms = (backoff_ms * 2).min(64);
                continue;
            }
            Err(e) => c.outcome = error_name(&e),
        }
        return c;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_deterministic_overlapping_and_of_the_asked_size() {
        let a = groups(7, 16, 4);
        assert_eq!(a, groups(7, 16, 4));
        assert_eq!(a.len(), 8);
        for (_, m) in &a {
            assert_eq!(m.len(), 4);
            assert!(m.windows(2).all(|w| w[0] < w[1]) && m.iter().all(|r| *r < 16));
        }
        assert_eq!(groups(1, 3, 10)[0].1, vec![0, 1, 2]);
        assert_ne!(contribution(1, 1000, 0, 1), contribution(1, 1000, 0, 2));
    }
}
