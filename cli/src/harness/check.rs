//! The checks of `tbon harness` and its report (text table and JSON).
//!
//! The rule for plain messages (which are not acknowledged end to end; README "Which plain
//! messages can be lost"): only messages between survivors are checked. A message sent inside
//! the *fault window* — from `--loss-grace-ms` before the first injected fault until every
//! survivor had confirmed the last one — may be lost or reordered: such losses are counted and
//! reported, not failed. One sent earlier may be lost too if it may have been in flight at a
//! fault: sent through the daemon that died, and not overtaken by a later message between the
//! same two daemons before it died (`in_flight.rs`; under overload messages stay in flight far
//! longer than the grace). Otherwise (and always, in a run without faults) every message must
//! arrive exactly once and in order. Duplicates, corruption and misdelivery always fail.
//! Messages from or to a faulted daemon are counted separately and never checked.
//!
//! A daemon the harness restarted (`--restart`) counts as a survivor from its rejoin on: its
//! new life's messages (numbered from [`Rejoined::seq_base`]) are checked as a survivor's, and
//! messages to it sent once it was wired again (every living daemon had learnt its new life by
//! then: rank 0 settles an admission only once every living daemon delivered it) are expected
//! like any. Messages to it sent before are not checked, but if they arrive they must arrive
//! once and in order. Its first life is a faulted daemon's. The fault window closes no earlier
//! than the last rejoin.
//!
//! Reliable messages (RELM; `--mode reliable`, and one in four point-to-point messages in
//! `mixed`) have no fault window: every one between survivors must arrive exactly once and in
//! order per (origin, destination), however the faults fell.
//!
//! Broadcasts (the fault-tolerant xcast; `--pattern broadcast`, and one message in 20 in
//! `mixed`) have no fault window either: every broadcast of a survivor that completed must be
//! delivered to every survivor exactly once, each originator's in its order, and every survivor
//! must deliver the survivors' broadcasts in the same order. A broadcast whose completion was
//! an error (rank 0's window was full: `busy`) was not broadcast and is not expected.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write;
use std::time::Duration;

use super::super::workload::{DST_ALL, Results, TAG_BCAST, TAG_PLAIN, TAG_RELIABLE, is_reliable};
use super::{Fault, FaultKind, HarnessArgs, Seen, value_name};

/// A daemon the harness killed and started again, and its new life's times.
pub struct Rejoined {
    /// The first sequence number of its new life's messages.
    pub seq_base: u64,
    /// CLOCK_MONOTONIC ns: killed, started again, wired again (None: never).
    pub killed_ns: u64,
    pub restarted_ns: u64,
    pub wired_ns: Option<u64>,
    /// A rank the DVM grew by (`--grow`): started for the first time, never killed.
    pub grown: bool,
}

pub struct Input<'a> {
    pub args: &'a HarnessArgs,
    /// The DVM's size with room to grow (`--daemons` plus the `--grow` ranks): the size every
    /// daemon runs with, from which the group pattern draws its groups.
    pub capacity: u32,
    pub messages: u64,
    pub faults: &'a [Fault],
    pub seen: &'a Seen,
    /// Daemons never faulted that stopped cleanly.
    pub survivors: &'a BTreeSet<u32>,
    /// Daemons restarted, by rank (their results are their new life's).
    pub rejoined: &'a BTreeMap<u32, Rejoined>,
    pub results: &'a BTreeMap<u32, Results>,
    pub spawn_ns: u64,
    /// What the run needed of the machine and what it had.
    pub fit: &'a super::scale::Fit,
    /// Rank 0's peak sockets and memory.
    pub rank0: super::scale::Rank0,
    pub t0: Option<u64>,
    pub elapsed: Duration,
    /// Problems the run itself found (crashes, hangs, unclean stops).
    pub problems: Vec<String>,
}

pub struct Report {
    pub text: String,
    pub json: serde_json::Value,
    pub verdict: String,
    pub passed: bool,
}

impl Report {
    /// Adds a section: its text just before the verdict line, its JSON under `key`.
    pub fn add_section(&mut self, key: &str, text: &str, json: serde_json::Value) {
        let at = self
            .text
            .rfind(&format!("\n{}", self.verdict))
            .unwrap_or(self.text.len());
        self.text.insert_str(at, text);
        if let Some(obj) = self.json.as_object_mut() {
            obj.insert(key.into(), json);
        }
    }
}

#[derive(Default, serde::Serialize)]
struct Counts {
    sent_plain: u64,
    sent_reliable: u64,
    sent_broadcast: u64,
    lost_reliable: u64,
    reordered_reliable: u64,
    /// Broadcast copies (one per survivor) that never arrived.
    lost_broadcast: u64,
    /// Broadcast copies delivered more than once.
    duplicated_broadcast: u64,
    /// Broadcast copies delivered after a later broadcast of the same originator.
    reordered_broadcast: u64,
    /// Survivors whose sequence of broadcasts differs from the first survivor's.
    broadcast_order_differs: u64,
    /// Broadcasts whose completion was an error (not broadcast, not expected).
    broadcast_not_sent: u64,
    expected: u64,
    delivered: u64,
    lost_in_fault_window: u64,
    /// Plain messages sent before the window, lost, that may have been in flight at a fault
    /// (`in_flight.rs`): allowed and reported, as those in the window.
    lost_in_flight_at_fault: u64,
    lost_outside_fault_window: u64,
    /// Of those, the ones sent before the window opened (the rest were sent after it closed,
    /// or in a run without faults).
    lost_before_fault_window: u64,
    duplicated: u64,
    reordered_in_fault_window: u64,
    reordered_outside_fault_window: u64,
    corrupted: u64,
    misdelivered: u64,
    send_errors: BTreeMap<String, u64>,
    /// Sends refused `Busy` (back-pressure) and offered again by the workload.
    busy_retries: u64,
    /// The same refusals by the limit that refused them.
    busy_by: BTreeMap<String, u64>,
    /// Summed over the daemons' latest progress lines: times a send queue became congested,
    /// sends refused `Busy` by flow control, relayed frames dropped at a full queue (a
    /// plain message lost without a fault is one of these).
    flow_congested: u64,
    sends_busy_flow: u64,
    dropped_queue_full: u64,
    /// Direct links, summed likewise: requests, grants, denials, links opened, fallbacks to
    /// the tree, messages that took a link.
    direct_requests: u64,
    direct_grants: u64,
    direct_denied: u64,
    direct_links_opened: u64,
    direct_fallbacks: u64,
    direct_messages: u64,
    direct_links_evicted: u64,
    /// Link sessions, summed likewise: new connections that wrote frames again, those frames,
    /// copies dropped by receivers, frames given up (a session refused).
    link_resumes: u64,
    link_frames_resent: u64,
    link_duplicates_dropped: u64,
    link_frames_given_up: u64,
    /// Connections closed as stalled and dialled again at another address (failover).
    link_failovers: u64,
    to_faulted: u64,
    from_faulted_delivered: u64,
    /// Sent to a restarted daemon before it was wired again: not expected, yet delivered.
    delivered_before_rejoin: u64,
}

/// A report cell of milliseconds (`-` when the JSON value is missing).
fn ms_cell(v: &serde_json::Value) -> String {
    v.as_f64().map_or("-".to_string(), |v| format!("{v:.0} ms"))
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

pub(super) fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub fn analyse(inp: Input<'_>) -> Report {
    let Input {
        args,
        capacity,
        messages,
        faults,
        seen,
        survivors,
        rejoined,
        results,
        spawn_ns,
        fit,
        rank0,
        t0,
        elapsed,
        mut problems,
    } = inp;
    let n = args.daemons;

    // Per fault: detection (first line naming it anywhere) and repair (the last survivor's
    // global confirmation naming it).
    let mut fault_rows = Vec::new();
    let mut last_settled: Option<u64> = None;
    for f in faults {
        let Some(at) = f.injected_ns else {
            fault_rows.push(serde_json::json!({"rank": f.rank, "injected": false}));
            continue;
        };
        let naming = |global_only: bool| {
            seen.faults
                .iter()
                .filter(move |(r, g, nf, _, _)| {
                    survivors.contains(r) && (*g || !global_only) && nf.contains(&f.rank)
                })
                .map(|(r, _, _, e, t)| (*r, *e, *t))
        };
        let detected = naming(false).map(|x| x.2).min();
        let mut confirmed: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        for (r, e, t) in naming(true) {
            confirmed.entry(r).or_insert((e, t));
        }
        let missing: Vec<u32> = survivors
            .iter()
            .copied()
            .filter(|r| !confirmed.contains_key(r))
            .collect();
        let repaired = if missing.is_empty() {
            confirmed.values().map(|x| x.1).max()
        } else {
            problems.push(format!(
                "fault of rank {}: survivors {missing:?} never confirmed it",
                f.rank
            ));
            None
        };
        if let Some(t) = repaired {
            last_settled = Some(last_settled.map_or(t, |l: u64| l.max(t)));
        }
        let epoch = confirmed.values().map(|x| x.0).max();
        if super::resumable(f) {
            match f.exit_after_resume {
                Some(Some(c)) if c != 0 => {}
                Some(code) => problems.push(format!(
                    "rank {} was stopped or cut off, declared dead and resumed, but then exited with {code:?} (expected a non-zero exit code)",
                    f.rank
                )),
                None if problems.is_empty() => problems.push(format!(
                    "rank {} was stopped or cut off and resumed but did not exit",
                    f.rank
                )),
                None => {}
            }
        }
        fault_rows.push(serde_json::json!({
            "rank": f.rank,
            "kind": match f.kind {
                FaultKind::Kill => "SIGKILL".to_string(),
                FaultKind::Stop => "SIGSTOP".to_string(),
                FaultKind::Cut(h) => format!("cut host {h}:"),
                FaultKind::Restart => "SIGKILL+rejoin".to_string(),
            },
            "at_s": t0.map(|t0| at.saturating_sub(t0) as f64 / 1e9),
            "detected_after_ms": detected.map(|t| ms(t.saturating_sub(at))),
            "repaired_everywhere_after_ms": repaired.map(|t| ms(t.saturating_sub(at))),
            "epoch": epoch,
            "resumed_exit_code": f.exit_after_resume.flatten(),
        }));
    }
    // Rejoins: the window closes no earlier than the last (an un-repair moves children back,
    // as a repair moves them away).
    let mut rejoin_rows = Vec::new();
    for (&r, j) in rejoined {
        let end = j.wired_ns.unwrap_or(u64::MAX);
        last_settled = Some(last_settled.map_or(end, |l: u64| l.max(end)));
        let since = |t: u64| ms(t.saturating_sub(j.restarted_ns));
        // Admitted: rank 0, which admits a returning daemon, reports it restored. (The new
        // life's own first report is no sign of it: a life welcomed into a view with nobody
        // failed reports nothing until the next fault.)
        let admitted = seen
            .restored
            .iter()
            .filter(|(who, ranks, t)| *who == 0 && ranks.contains(&r) && *t >= j.restarted_ns)
            .map(|x| x.2)
            .min();
        let mut learnt: BTreeMap<u32, u64> = BTreeMap::new();
        for (who, ranks, t) in &seen.restored {
            if survivors.contains(who) && ranks.contains(&r) && *t >= j.restarted_ns {
                let e = learnt.entry(*who).or_insert(*t);
                *e = (*e).min(*t);
            }
        }
        let unaware: Vec<u32> = survivors
            .iter()
            .copied()
            .filter(|w| !learnt.contains_key(w))
            .collect();
        if !unaware.is_empty() && j.wired_ns.is_some() {
            problems.push(format!(
                "rejoin of rank {r}: survivors {unaware:?} never learnt it"
            ));
        }
        if j.wired_ns.is_none() {
            problems.push(format!("rejoin of rank {r}: started again but never wired"));
        }
        let first_delivery = results
            .get(&r)
            .and_then(|res| res.received.iter().filter(|m| m.1 != r).map(|m| m.4).min());
        // What its new life carried: messages of live daemons it received, and its own that
        // others received.
        let carried_in = results.get(&r).map_or(0, |res| {
            res.received
                .iter()
                .filter(|m| m.1 != r && m.2 != u64::MAX)
                .count()
        });
        let carried_out: usize = results
            .iter()
            .filter(|(d, _)| **d != r)
            .map(|(_, res)| {
                res.received
                    .iter()
                    .filter(|m| m.1 == r && m.2 != u64::MAX && m.2 >= j.seq_base)
                    .count()
            })
            .sum();
        rejoin_rows.push(serde_json::json!({
            "grown": j.grown,
            "received": carried_in,
            "delivered_elsewhere": carried_out,
            "rank": r,
            "restarted_after_death_ms": (!j.grown).then(|| ms(j.restarted_ns.saturating_sub(j.killed_ns))),
            "admitted_after_ms": admitted.map(since),
            "known_everywhere_after_ms": (unaware.is_empty())
                .then(|| learnt.values().max().map(|t| since(*t)))
                .flatten(),
            "wired_after_ms": j.wired_ns.map(since),
            "first_delivery_after_ms": first_delivery.map(since),
        }));
    }
    let first_fault = faults.iter().filter_map(|f| f.injected_ns).min();
    let grace = args.loss_grace_ms * 1_000_000;
    let window = first_fault.map(|f| (f.saturating_sub(grace), last_settled.unwrap_or(u64::MAX)));
    let in_window = |t: u64| window.is_some_and(|(a, b)| t >= a && t <= b);
    let mut in_flight = super::in_flight::InFlight::new(
        args.radix,
        n,
        faults,
        args.route == tbon::RouteSetting::Tree,
    );

    // A message's place in its origin's accepted order.
    let place_of = |origin: u32, seq: u64| {
        results
            .get(&origin)
            .and_then(|r| r.order.get(&seq))
            .copied()
            .unwrap_or(seq)
    };
    // Expected deliveries: (receiver) -> (tag, origin, seq) -> sent_ns.
    let mut c = Counts::default();
    let mut expected: HashMap<(u32, u32, u32, u64), u64> = HashMap::new();
    // Sent to a restarted daemon before it was wired again: may arrive (once, in order).
    let mut optional: BTreeSet<(u32, u32, u32, u64)> = BTreeSet::new();
    let live: BTreeSet<u32> = survivors.iter().chain(rejoined.keys()).copied().collect();
    let before_rejoin = |d: u32, t: u64| {
        rejoined
            .get(&d)
            .is_some_and(|j| t < j.wired_ns.unwrap_or(u64::MAX))
    };
    let from_live = |origin: u32, seq: u64| {
        survivors.contains(&origin) || rejoined.get(&origin).is_some_and(|j| seq >= j.seq_base)
    };
    // Broadcasts whose completion was an error: not expected, yet not misdelivered if they
    // arrive (a daemon stopping under its broadcast).
    let mut not_sent: BTreeSet<(u32, u64)> = BTreeSet::new();
    let mut first_send = u64::MAX;
    for (&o, res) in results {
        let failed: BTreeSet<u64> = res.errors.iter().map(|(seq, _)| *seq).collect();
        for &(seq, dst, t) in &res.sent {
            first_send = first_send.min(t);
            if dst == DST_ALL {
                c.sent_broadcast += 1;
                if failed.contains(&seq) {
                    c.broadcast_not_sent += 1;
                    not_sent.insert((o, seq));
                    continue;
                }
                for &d in &live {
                    if before_rejoin(d, t) {
                        optional.insert((d, TAG_BCAST, o, seq));
                    } else {
                        expected.insert((d, TAG_BCAST, o, seq), t);
                    }
                }
            } else {
                let tag = if is_reliable(args.mode, seq) {
                    c.sent_reliable += 1;
                    TAG_RELIABLE
                } else {
                    c.sent_plain += 1;
                    TAG_PLAIN
                };
                if before_rejoin(dst, t) {
                    optional.insert((dst, tag, o, seq));
                    c.to_faulted += 1;
                } else if live.contains(&dst) {
                    expected.insert((dst, tag, o, seq), t);
                } else {
                    c.to_faulted += 1;
                }
            }
        }
        for (_, e) in &res.errors {
            *c.send_errors.entry(e.clone()).or_default() += 1;
        }
        c.busy_retries += res.busy_retries;
        for (name, n) in &res.busy_by {
            *c.busy_by.entry(name.clone()).or_default() += n;
        }
    }
    for f in seen.flow.values() {
        c.flow_congested += f[0];
        c.sends_busy_flow += f[1];
        c.dropped_queue_full += f[2];
        c.direct_requests += f[3];
        c.direct_grants += f[4];
        c.direct_denied += f[5];
        c.direct_links_opened += f[6];
        c.direct_fallbacks += f[7];
        c.direct_messages += f[8];
        c.direct_links_evicted += f[9];
        c.link_resumes += f[10];
        c.link_frames_resent += f[11];
        c.link_duplicates_dropped += f[12];
        c.link_frames_given_up += f[13];
        c.link_failovers += f[14];
    }
    c.expected = expected.len() as u64;
    let mut got: HashMap<(u32, u32, u32, u64), u32> = HashMap::new();
    let mut latencies = Vec::new();
    let mut timeline = super::timeline::Timeline::new(t0.unwrap_or(first_send));
    let mut last_recv = 0u64;
    // Each live daemon's broadcasts of live daemons, in delivery order.
    let mut bcast_orders: BTreeMap<u32, Vec<(u32, u64)>> = BTreeMap::new();
    for (&d, res) in results {
        // The order a receiver must see is the order its origin's accepted submissions went
        // in (a message refused `Busy` and sent again comes after those accepted meanwhile).
        let mut max_order: HashMap<(u32, u32), u64> = HashMap::new();
        let mut bcast_order = Vec::new();
        for &(tag, origin, seq, t_sent, t_recv) in &res.received {
            if seq == u64::MAX {
                c.corrupted += 1;
                continue;
            }
            if !from_live(origin, seq) {
                c.from_faulted_delivered += 1;
                continue;
            }
            let key = (d, tag, origin, seq);
            if tag == TAG_BCAST {
                bcast_order.push((origin, seq));
            }
            let wanted = expected.contains_key(&key);
            if !wanted && !optional.contains(&key) {
                if !(tag == TAG_BCAST && not_sent.contains(&(origin, seq))) {
                    c.misdelivered += 1;
                }
                continue;
            }
            let k = got.entry(key).or_default();
            *k += 1;
            if *k > 1 {
                c.duplicated += 1;
                if tag == TAG_BCAST {
                    c.duplicated_broadcast += 1;
                }
                continue;
            }
            if wanted {
                c.delivered += 1;
            } else {
                c.delivered_before_rejoin += 1;
            }
            latencies.push(t_recv.saturating_sub(t_sent));
            timeline.add(tag, t_recv, t_recv.saturating_sub(t_sent));
            last_recv = last_recv.max(t_recv);
            let place = place_of(origin, seq);
            if tag == TAG_PLAIN {
                in_flight.arrived(origin, d, place, t_recv);
            }
            let m = max_order.entry((tag, origin)).or_insert(0);
            if place < *m {
                if tag == TAG_RELIABLE {
                    c.reordered_reliable += 1;
                } else if tag == TAG_BCAST {
                    c.reordered_broadcast += 1;
                } else if in_window(t_sent) {
                    c.reordered_in_fault_window += 1;
                } else {
                    c.reordered_outside_fault_window += 1;
                }
            }
            *m = (*m).max(place);
        }
        if live.contains(&d) {
            bcast_orders.insert(d, bcast_order);
        }
    }
    // A restarted daemon delivers the broadcasts from its admission on: its order must be the
    // survivors' order of those it delivered.
    let reference = survivors.iter().find_map(|d| bcast_orders.get(d));
    if let Some(first) = reference {
        c.broadcast_order_differs = bcast_orders
            .iter()
            .filter(|(d, o)| {
                if rejoined.contains_key(d) {
                    let had: BTreeSet<&(u32, u64)> = o.iter().collect();
                    let filtered: Vec<&(u32, u64)> =
                        first.iter().filter(|b| had.contains(b)).collect();
                    filtered.len() != o.len() || filtered.iter().zip(o.iter()).any(|(a, b)| *a != b)
                } else {
                    *o != first
                }
            })
            .count() as u64;
    }
    let mut lost_examples = Vec::new();
    for (key, &t) in &expected {
        if !got.contains_key(key) {
            if key.1 == TAG_RELIABLE || key.1 == TAG_BCAST {
                let what = if key.1 == TAG_RELIABLE {
                    c.lost_reliable += 1;
                    "reliable"
                } else {
                    c.lost_broadcast += 1;
                    "broadcast"
                };
                if lost_examples.len() < 5 {
                    lost_examples.push(format!("{what} #{} from {} to {}", key.3, key.2, key.0));
                }
            } else if in_window(t) {
                c.lost_in_fault_window += 1;
            } else if window.is_some_and(|(_, b)| t <= b)
                && in_flight.excuses(key.2, key.0, place_of(key.2, key.3), t)
            {
                c.lost_in_flight_at_fault += 1;
            } else {
                c.lost_outside_fault_window += 1;
                if window.is_some_and(|(a, _)| t < a) {
                    c.lost_before_fault_window += 1;
                }
                if lost_examples.len() < 5 {
                    lost_examples.push(format!("plain #{} from {} to {}", key.3, key.2, key.0));
                }
            }
        }
    }
    latencies.sort_unstable();
    let traffic_ns = last_recv.saturating_sub(first_send).max(1);
    let throughput = c.delivered as f64 / (traffic_ns as f64 / 1e9);
    // What the schedule offered: every expected delivery within the schedule's span (each
    // daemon sends `messages` at `rate`). Above what was delivered per second: overload.
    let schedule_s = (messages as f64 / args.rate.max(0.001)).max(1e-3);
    let offered = c.expected as f64 / schedule_s;
    let wireup_s = t0.map(|t| t.saturating_sub(spawn_ns) as f64 / 1e9);
    let phases = super::scale::Phases::from(spawn_ns, &seen.started, &seen.wired);

    let ran = !results.is_empty();
    let mut checks: Vec<(String, bool)> = Vec::new();
    if ran {
        checks.push((
            "every expected message delivered outside the fault window".into(),
            c.lost_outside_fault_window == 0,
        ));
        if c.sent_reliable > 0 {
            checks.push((
                "every reliable message between survivors delivered, faults or not".into(),
                c.lost_reliable == 0,
            ));
            checks.push((
                "reliable messages in order per (origin, destination)".into(),
                c.reordered_reliable == 0,
            ));
        }
        if c.sent_broadcast > 0 {
            checks.push((
                "every broadcast delivered to every survivor, faults or not".into(),
                c.lost_broadcast == 0,
            ));
            checks.push((
                "broadcasts in order per originator".into(),
                c.reordered_broadcast == 0,
            ));
            checks.push((
                "broadcasts in the same order at every survivor".into(),
                c.broadcast_order_differs == 0,
            ));
        }
        checks.push(("no duplicates".into(), c.duplicated == 0));
        checks.push(("no corruption".into(), c.corrupted == 0));
        checks.push(("no misdelivery".into(), c.misdelivered == 0));
        checks.push((
            "in order outside the fault window".into(),
            c.reordered_outside_fault_window == 0,
        ));
    }
    checks.push((
        "every fault repaired at every survivor".into(),
        !problems.iter().any(|p| p.starts_with("fault of")),
    ));
    if !rejoined.is_empty() {
        checks.push((
            "every restarted daemon admitted, wired and learnt by every survivor".into(),
            !problems.iter().any(|p| p.starts_with("rejoin of")),
        ));
    }
    checks.push((
        "no daemon crashed or hung; survivors stopped cleanly".into(),
        problems
            .iter()
            .all(|p| p.starts_with("fault of") || p.starts_with("rejoin of")),
    ));
    let victims: BTreeSet<u32> = faults
        .iter()
        .filter(|f| f.injected_ns.is_some())
        .map(|f| f.rank)
        .collect();
    let streaming = args.pattern == super::super::workload::Pattern::Stream;
    let (sc, stream_examples) = super::check_streams::judge(results, &victims);
    if ran && streaming {
        checks.push((
            "every stream between survivors finished with every byte right; one whose \
             producer died failed as documented"
                .into(),
            sc.wrong == 0 && sc.fetched > 0,
        ));
        if !stream_examples.is_empty() {
            problems.push(format!(
                "streams ended wrongly, e.g. {}",
                stream_examples.join(", ")
            ));
        }
    }
    let grouping = args.pattern == super::super::workload::Pattern::Group;
    let returned: BTreeSet<u32> = rejoined.keys().copied().collect();
    let (gc, group_examples) = super::check_groups::judge(
        results,
        &victims,
        &returned,
        (args.seed, capacity, args.group_size, args.group_rounds),
    );
    if ran && grouping {
        checks.push((
            "every group collective ended at every surviving member with the same result, \
             right bytes, only victims excluded"
                .into(),
            gc.wrong == 0 && gc.ok > 0,
        ));
        if !group_examples.is_empty() {
            problems.push(format!(
                "group collectives ended wrongly, e.g. {}",
                group_examples.join(", ")
            ));
        }
    }
    if !lost_examples.is_empty() {
        problems.push(format!(
            "lost (reliable, broadcast, or plain outside the fault window), e.g. {}",
            lost_examples.join(", ")
        ));
    }
    let passed = ran && problems.is_empty() && checks.iter().all(|(_, ok)| *ok);

    let mode = match (args.mode, args.pattern) {
        // The pattern decides what a message is: say so rather than the mixed mode's shares
        // (from an outside-in walkthrough: the header said "1 in 20 broadcast" for a run of
        // broadcasts only).
        (super::super::workload::Mode::Mixed, super::super::workload::Pattern::Broadcast) => {
            "mixed (the pattern makes every message a broadcast)".to_string()
        }
        // Leaves send to leaves: point to point only (the header claimed broadcasts too).
        (super::super::workload::Mode::Mixed, super::super::workload::Pattern::Leaves) => {
            "mixed (leaves to leaves, point to point only: 1 in 4 reliable)".to_string()
        }
        (super::super::workload::Mode::Mixed, _) => {
            "mixed (1 in 20 broadcast, 1 in 4 point-to-point reliable)".to_string()
        }
        (m, _) => value_name(&m),
    };
    let mut t = String::new();
    let _ = writeln!(
        t,
        "tbon harness: {n} daemons, radix {}, pattern {}, mode {mode}, payload {} B, {messages} messages per daemon at {}/s, seed {}",
        args.radix,
        value_name(&args.pattern),
        args.payload,
        args.rate,
        args.seed
    );
    let _ = writeln!(t);
    let _ = writeln!(
        t,
        "  wire-up of {n} daemons        {}{}",
        wireup_s.map_or("-".into(), |s| format!("{s:.2} s")),
        phases.map_or(String::new(), |p| format!(
            " (all running after {:.2} s, rank 0 had every report after {:.2} s)",
            p.launched_s, p.reported_s
        ))
    );
    let _ = writeln!(
        t,
        "  rank 0                         peak {} sockets, {} MiB resident at most ({} MiB its own); open-file limit {}",
        rank0.sockets_peak,
        rank0
            .vm_hwm_kib
            .map_or("-".into(), |k| format!("{:.1}", k as f64 / 1024.0)),
        rank0
            .rss_anon_peak_kib
            .map_or("-".into(), |k| format!("{:.1}", k as f64 / 1024.0)),
        fit.nofile
    );
    let _ = writeln!(
        t,
        "  run time                       {:.1} s",
        elapsed.as_secs_f64()
    );
    if !faults.is_empty() {
        let _ = writeln!(
            t,
            "\n  fault                                        detected after   repaired everywhere after"
        );
        for row in &fault_rows {
            let f = |k: &str| ms_cell(&row[k]);
            let mut what = format!(
                "{} rank {} at {}",
                row["kind"].as_str().unwrap_or("-"),
                row["rank"],
                row["at_s"]
                    .as_f64()
                    .map_or("-".into(), |v| format!("{v:.1} s"))
            );
            if let Some(code) = row["resumed_exit_code"].as_i64() {
                let _ = write!(what, ", exit {code} after resume");
            }
            let _ = writeln!(
                t,
                "  {what:<44} {:<16} {} (epoch {})",
                f("detected_after_ms"),
                f("repaired_everywhere_after_ms"),
                row["epoch"]
            );
        }
        if let Some((a, b)) = window {
            // The window may open before traffic did (time 0): it is shown from there.
            let rel = |x: u64| t0.map_or(0.0, |t0| ((x as f64 - t0 as f64) / 1e9).max(0.0));
            let _ = writeln!(
                t,
                "  fault window (losses allowed)                {:.1} s .. {}",
                rel(a),
                if b == u64::MAX {
                    "never closed".into()
                } else {
                    format!("{:.1} s", rel(b))
                }
            );
        }
    }
    if !rejoin_rows.is_empty() {
        let _ = writeln!(
            t,
            "\n  rejoin or join (from start)  restarted after death   admitted   known everywhere   wired   first delivery   in / out"
        );
        for row in &rejoin_rows {
            let f = |k: &str| ms_cell(&row[k]);
            let _ = writeln!(
                t,
                "  {:<28} {:<23} {:<10} {:<18} {:<7} {:<16} {} / {}",
                format!("rank {}", row["rank"]),
                if row["grown"] == true {
                    "new rank (--grow)".to_string()
                } else {
                    f("restarted_after_death_ms")
                },
                f("admitted_after_ms"),
                f("known_everywhere_after_ms"),
                f("wired_after_ms"),
                f("first_delivery_after_ms"),
                row["received"],
                row["delivered_elsewhere"]
            );
        }
    }
    if ran {
        let _ = writeln!(
            t,
            "\n  messages among the {} survivors{}",
            survivors.len(),
            if rejoined.is_empty() {
                String::new()
            } else {
                format!(" and {} restarted or new daemons", rejoined.len())
            }
        );
        let row = |t: &mut String, k: &str, v: String| {
            let _ = writeln!(t, "  {k:<30} {v}");
        };
        row(
            &mut t,
            "sent plain / reliable / bcast",
            format!(
                "{} / {} / {}",
                c.sent_plain, c.sent_reliable, c.sent_broadcast
            ),
        );
        row(&mut t, "deliveries expected", c.expected.to_string());
        row(&mut t, "delivered", c.delivered.to_string());
        row(
            &mut t,
            "lost in fault window",
            format!("{} (plain; allowed, reported)", c.lost_in_fault_window),
        );
        if c.lost_in_flight_at_fault > 0 {
            row(
                &mut t,
                "lost in flight at a fault",
                format!(
                    "{} (plain, sent earlier through a daemon that died, not overtaken; allowed)",
                    c.lost_in_flight_at_fault
                ),
            );
        }
        row(
            &mut t,
            "lost outside fault window",
            if c.lost_outside_fault_window == 0 {
                "0".to_string()
            } else {
                format!(
                    "{} ({} sent before it opened)",
                    c.lost_outside_fault_window, c.lost_before_fault_window
                )
            },
        );
        row(
            &mut t,
            "reliable lost / reordered",
            format!("{} / {}", c.lost_reliable, c.reordered_reliable),
        );
        if c.sent_broadcast > 0 {
            row(
                &mut t,
                "bcast lost / reordered / order",
                format!(
                    "{} / {} / {} (not sent: {})",
                    c.lost_broadcast,
                    c.reordered_broadcast,
                    c.broadcast_order_differs,
                    c.broadcast_not_sent
                ),
            );
        }
        row(&mut t, "duplicated", c.duplicated.to_string());
        row(
            &mut t,
            "reordered (in / outside window)",
            format!(
                "{} / {}",
                c.reordered_in_fault_window, c.reordered_outside_fault_window
            ),
        );
        row(
            &mut t,
            "corrupted / misdelivered",
            format!("{} / {}", c.corrupted, c.misdelivered),
        );
        let errs = if c.send_errors.is_empty() {
            "0".to_string()
        } else {
            c.send_errors
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        row(&mut t, "send errors", errs);
        row(&mut t, "sent to faulted daemons", c.to_faulted.to_string());
        if !rejoined.is_empty() {
            row(
                &mut t,
                "to a rejoining one, arrived",
                format!(
                    "{} (sent before it was wired again; not expected, none twice)",
                    c.delivered_before_rejoin
                ),
            );
        }
        row(
            &mut t,
            "delivered from faulted ones",
            c.from_faulted_delivered.to_string(),
        );
        row(
            &mut t,
            "latency p50 / p99 / max",
            format!(
                "{:.2} / {:.2} / {:.1} ms",
                ms(percentile(&latencies, 0.5)),
                ms(percentile(&latencies, 0.99)),
                ms(latencies.last().copied().unwrap_or(0))
            ),
        );
        row(
            &mut t,
            "throughput",
            format!("{throughput:.0} deliveries/s (offered {offered:.0}/s)"),
        );
        row(
            &mut t,
            "busy, offered again",
            if c.busy_by.is_empty() {
                format!("{} (back-pressure)", c.busy_retries)
            } else {
                let by: Vec<String> = c.busy_by.iter().map(|(k, n)| format!("{k} {n}")).collect();
                format!("{} (back-pressure: {})", c.busy_retries, by.join(", "))
            },
        );
        row(
            &mut t,
            "flow control",
            format!(
                "{} congestions, {} sends refused, {} relayed frames dropped at a full queue",
                c.flow_congested, c.sends_busy_flow, c.dropped_queue_full
            ),
        );
        row(
            &mut t,
            "direct links",
            format!(
                "{} requests, {} grants, {} denials, {} opened, {} evicted, {} fell back to the \
                 tree, {} messages on links",
                c.direct_requests,
                c.direct_grants,
                c.direct_denied,
                c.direct_links_opened,
                c.direct_links_evicted,
                c.direct_fallbacks,
                c.direct_messages
            ),
        );
        row(
            &mut t,
            "link sessions",
            format!(
                "{} connections resumed, {} frames written again, {} copies dropped, {} given up, {} failovers",
                c.link_resumes,
                c.link_frames_resent,
                c.link_duplicates_dropped,
                c.link_frames_given_up,
                c.link_failovers
            ),
        );
    }
    if streaming {
        let _ = writeln!(
            t,
            "  {:<30} {} fetched by survivors, {} finished ({:.1} MiB checked byte by byte), {} \
             failed as documented (producer killed), {} wrong",
            "streams",
            sc.fetched,
            sc.finished,
            sc.bytes_checked as f64 / f64::from(1u32 << 20),
            sc.failed_producer_victim,
            sc.wrong
        );
    }
    if grouping {
        let _ = writeln!(
            t,
            "  {:<30} {} groups of {}, {} collectives, {} outcomes at survivors and \
             restarted members: {} ok, {} broadcasts whose root was killed, {} results lost at \
             restarted members, {} dead, restarted or absent members excluded, {} wrong",
            "group collectives",
            gc.groups,
            args.group_size,
            gc.collectives,
            gc.outcomes,
            gc.ok,
            gc.root_died,
            gc.returned_lost,
            gc.excluded_victims,
            gc.wrong
        );
    }
    let _ = writeln!(t, "\n  checks");
    for (what, ok) in &checks {
        let _ = writeln!(t, "  {}  {what}", if *ok { "ok  " } else { "FAIL" });
    }
    for p in &problems {
        let _ = writeln!(t, "  FAIL  {p}");
    }
    let verdict = if passed {
        format!(
            "PASS: {} of {} deliveries, {} lost in fault windows, 0 duplicated, 0 corrupted, {} fault(s) repaired",
            c.delivered,
            c.expected,
            c.lost_in_fault_window,
            faults.len()
        )
    } else {
        let mut v = "FAIL:".to_string();
        for (what, ok) in &checks {
            if !ok {
                let _ = write!(v, " [{what}]");
            }
        }
        for p in &problems {
            let _ = write!(v, " [{p}]");
        }
        v
    };
    let _ = writeln!(t, "\n{verdict}");

    let json = serde_json::json!({
        "passed": passed,
        "daemons": n,
        "radix": args.radix,
        "pattern": value_name(&args.pattern),
        "mode": value_name(&args.mode),
        "payload": args.payload.to_string(),
        "messages_per_daemon": messages,
        "rate_per_daemon": args.rate,
        "seed": args.seed,
        "wireup_s": wireup_s,
        "wireup_phases": phases,
        "rank0": rank0,
        "fit": fit,
        "run_s": elapsed.as_secs_f64(),
        "faults": fault_rows,
        "rejoins": rejoin_rows,
        "counts": c,
        "survivors": survivors.len(),
        "dead": (0..n).filter(|r| !survivors.contains(r)).collect::<Vec<u32>>(),
        "fault_window_s": window.map(|(a, b)| {
            let rel = |x: u64| t0.map_or(0.0, |t0| ((x as f64 - t0 as f64) / 1e9).max(0.0));
            serde_json::json!({"from": rel(a), "to": (b != u64::MAX).then(|| rel(b))})
        }),
        "results_collected": !results.is_empty(),
        "latency_ms": {
            "p50": ms(percentile(&latencies, 0.5)),
            "p99": ms(percentile(&latencies, 0.99)),
            "max": ms(latencies.last().copied().unwrap_or(0)),
        },
        "throughput_per_s": throughput,
        "offered_per_s": offered,
        "checks": checks.iter().map(|(w, ok)| serde_json::json!({"check": w, "ok": ok})).collect::<Vec<_>>(),
        "problems": problems,
        "streams": streaming.then_some(&sc),
        "groups": grouping.then_some(&gc),
        "timeline": timeline.json(),
        "latency_histogram": timeline.histogram_json(),
    });
    Report {
        text: t,
        json,
        verdict,
        passed,
    }
}
