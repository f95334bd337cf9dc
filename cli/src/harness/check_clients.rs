//! The harness's judgement of client traffic (`--clients-per-daemon`, issue "Jobs"). Between
//! two workers that both ran to the end, every message must have been sent `Ok` and
//! received exactly once, in order, intact, before the sender's `DONE` marker, which must
//! count them all. From a worker that was killed, or whose daemon was, a receiver must have
//! an intact prefix in order (nothing after a gap) and must have been told it is gone by its
//! watch (unless its marker came first). Every worker that was not killed must have written
//! its results without timing out.

use std::collections::BTreeSet;
use std::path::Path;

use tbon::ClientName;

use super::super::client_workload::{WorkerRecord, read_all};

#[derive(Debug, Default, serde::Serialize)]
pub struct ClientCounts {
    pub workers: u64,
    pub killed: u64,
    /// Workers whose daemon was killed (they saw it and left).
    pub orphaned: u64,
    /// Sender-receiver pairs judged in full (both ran to the end), and their messages.
    pub live_pairs: u64,
    pub live_messages: u64,
    /// Pairs with a dead sender, judged as a prefix.
    pub prefix_pairs: u64,
    /// Watches that reported a peer gone.
    pub exits_seen: u64,
    /// Everything wrong (each a failure of the run).
    pub wrong: u64,
}

/// Judges every results file in `dir` for a DVM of `size` daemons with `per_daemon`
/// workers each; `victims` are the daemons killed, `killed` the workers killed.
pub fn judge(
    dir: &Path,
    size: u32,
    per_daemon: u32,
    victims: &BTreeSet<u32>,
    killed: &BTreeSet<ClientName>,
) -> (ClientCounts, Vec<String>) {
    let records = read_all(dir);
    let mut c = ClientCounts::default();
    let mut examples = Vec::new();
    let mut wrong = |c: &mut ClientCounts, what: String| {
        c.wrong += 1;
        if examples.len() < 5 {
            examples.push(what);
        }
    };
    let all: Vec<ClientName> = (0..size)
        .flat_map(|rank| (1..=per_daemon).map(move |local| ClientName { rank, local }))
        .collect();
    c.workers = all.len() as u64;
    c.killed = killed.len() as u64;
    let dead = |n: &ClientName| killed.contains(n) || victims.contains(&n.rank);
    c.orphaned = all
        .iter()
        .filter(|n| !killed.contains(n) && victims.contains(&n.rank))
        .count() as u64;
    let full = |n: &ClientName, r: Option<&WorkerRecord>| {
        !dead(n) && r.is_some_and(|r| r.daemon_lost.is_none() && !r.timed_out)
    };
    for b in &all {
        let rb = records.get(b);
        if !dead(b) {
            match rb {
                None => {
                    wrong(&mut c, format!("worker {b} wrote no results"));
                    continue;
                }
                Some(r) if r.timed_out => wrong(&mut c, format!("worker {b} timed out")),
                Some(r) if r.daemon_lost.is_some() => wrong(
                    &mut c,
                    format!("worker {b} lost its live daemon: {:?}", r.daemon_lost),
                ),
                Some(_) => {}
            }
        }
        if !full(b, rb) {
            continue;
        }
        let Some(rb) = rb else { continue };
        for a in all.iter().filter(|a| *a != b) {
            let Some(from_a) = rb.peers.get(&a.to_string()) else {
                wrong(&mut c, format!("{b} has no record of {a}"));
                continue;
            };
            if from_a.exit.is_some() {
                c.exits_seen += 1;
            }
            if from_a.corrupt > 0 || from_a.out_of_order > 0 {
                wrong(
                    &mut c,
                    format!(
                        "{b} from {a}: {} corrupt, {} out of order",
                        from_a.corrupt, from_a.out_of_order
                    ),
                );
            }
            let ra = records.get(a);
            if full(a, ra) {
                c.live_pairs += 1;
                let to_b = ra.and_then(|r| r.peers.get(&b.to_string()));
                let sent_ok = to_b.map_or(0, |p| p.sent_ok);
                c.live_messages += from_a.received;
                if to_b.is_some_and(|p| !p.send_errors.is_empty()) {
                    wrong(
                        &mut c,
                        format!("{a} to {b}: send errors {:?}", to_b.map(|p| &p.send_errors)),
                    );
                }
                if from_a.done_with != Some(from_a.received) || from_a.received != sent_ok {
                    wrong(
                        &mut c,
                        format!(
                            "{a} to {b}: {sent_ok} sent ok, {} received, marker {:?}",
                            from_a.received, from_a.done_with
                        ),
                    );
                }
            } else {
                c.prefix_pairs += 1;
                if from_a.done_with.is_none() && from_a.exit.is_none() {
                    wrong(&mut c, format!("{b} was never told that {a} is gone"));
                }
            }
        }
    }
    (c, examples)
}
