//! The checkers. They see every delivery and completion as it happens (safety) and the final
//! state after the faults stop (liveness), and name the first rule broken.

use super::node::{BcastDelivery, SimNode, TAG_BCAST, TAG_PLAIN, TAG_RELIABLE};
use crate::Rank;
use crate::error::SendError;
use crate::grpcomm::AllgatherResult;
use crate::rml::Message;
use crate::routed::tree_view;
use std::collections::{HashMap, HashSet};

/// A broken rule: which checker, and what it saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The checker's name (stable: scripts and regression seeds refer to it).
    pub checker: &'static str,
    /// What it saw.
    pub detail: String,
}

/// The workload's self-checking payload: origin, destination, sequence, checksum.
pub fn payload(origin: Rank, dst: Rank, seq: u64, pad: usize) -> bytes::Bytes {
    let mut v = Vec::with_capacity(24 + pad);
    v.extend_from_slice(&origin.to_be_bytes());
    v.extend_from_slice(&dst.to_be_bytes());
    v.extend_from_slice(&seq.to_be_bytes());
    v.resize(16 + pad, (seq as u8).wrapping_mul(31));
    let sum = fnv(&v);
    v.extend_from_slice(&sum.to_be_bytes());
    bytes::Bytes::from(v)
}

fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        (h ^ u64::from(*x)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Rank `rank`'s contribution to allgather `id`.
pub fn contribution(rank: Rank, id: u64) -> bytes::Bytes {
    let mut v = rank.to_be_bytes().to_vec();
    v.extend_from_slice(&id.to_be_bytes());
    v.resize(12 + (rank as usize % 7), 0xA5);
    bytes::Bytes::from(v)
}

/// (origin, dst, seq) of a payload made by [`payload`], if it is intact.
pub fn parse(p: &[u8]) -> Option<(Rank, Rank, u64)> {
    let n = p.len().checked_sub(8)?;
    let (body, sum) = p.split_at(n);
    if fnv(body).to_be_bytes() != sum {
        return None;
    }
    let origin = Rank::from_be_bytes(body.get(0..4)?.try_into().ok()?);
    let dst = Rank::from_be_bytes(body.get(4..8)?.try_into().ok()?);
    let seq = u64::from_be_bytes(body.get(8..16)?.try_into().ok()?);
    Some((origin, dst, seq))
}

/// What the checkers know of the workload and what they have seen.
#[derive(Debug, Default)]
pub struct Checker {
    /// (origin, dst) -> reliable sequence numbers accepted by `send_reliable`, in order.
    pub sent: HashMap<(Rank, Rank), Vec<u64>>,
    /// (origin, dst) -> reliable sequence numbers posted at dst, in order.
    pub got: HashMap<(Rank, Rank), Vec<u64>>,
    /// token -> (origin, dst, seq).
    pub tokens: HashMap<u64, (Rank, Rank, u64)>,
    /// Tokens completed.
    pub completed: HashSet<u64>,
    /// Plain messages seen: (origin, dst, seq).
    pub plain_seen: HashSet<(Rank, Rank, u64)>,
    /// Plain messages sent.
    pub plain_sent: u64,
    /// Whether plain messages must arrive in order per (origin, destination): in runs where
    /// nothing reroutes or loses frames (`Scenario::keeps_plain_order`), a direct link opening
    /// beside the tree must not reorder them.
    pub plain_order: bool,
    /// (origin, dst) -> the last plain sequence number posted.
    pub plain_last: HashMap<(Rank, Rank), u64>,
    /// The first plain message posted out of order in a run that does not check order as it
    /// goes: whether it is a violation is known at the end (checker `link-sessions`: a run
    /// whose connections only dropped, with nobody declared dead, keeps plain order too).
    pub plain_reordered: Option<String>,
    /// Reliable deliveries and plain deliveries seen.
    pub reliable_posted: u64,
    /// Plain deliveries seen.
    pub plain_posted: u64,
    /// Broadcast op -> (originator, tag, payload) as first seen.
    pub ops: HashMap<u64, (Rank, crate::rml::Tag, bytes::Bytes)>,
    /// Per daemon: the last op delivered.
    pub last_op: HashMap<Rank, u64>,
    /// Broadcasts delivered as several parts (operations), as first seen.
    pub split_ops: u64,
    /// Broadcast deliveries seen.
    pub bcast_delivered: u64,
    /// (originator, request) accepted by the core, and whether they finished.
    pub requests: HashMap<(Rank, u64), bool>,
    /// Allgather id -> the result as first seen.
    pub results: HashMap<u64, AllgatherResult>,
    /// (rank, id) results delivered (to the rank's current life).
    pub got_result: HashSet<(Rank, u64)>,
    /// (rank, id) allgathers that ended `ResultLost` (at a restarted rank's current life).
    pub lost_result: HashSet<(Rank, u64)>,
    /// Allgather results delivered.
    pub gathers: u64,
    /// Ranks started again (the `rejoin` kind).
    pub restarted: HashSet<Rank>,
    /// (origin, dst) -> the highest reliable sequence number the origin's previous life sent
    /// to `dst`: posted late at a `dst` that had not yet learnt of that life's death, it is
    /// that life's message, not the new one's (still once, and only at the same life of
    /// `dst`).
    pub old_life_upto: HashMap<(Rank, Rank), u64>,
    /// Reliable messages posted before a rank of their pair was started again: their
    /// completions may come after the checkers forgot the pair.
    pub posted_before: HashSet<(Rank, Rank, u64)>,
    /// (origin, dst, seq) reliable messages to a restarted `dst` that ended `NodeDown` before
    /// they were posted, taken out of the pair's expected sequence: a later life never gets
    /// them, but the life they were sent to, declared dead while still running (a stall), may
    /// post them before it stops; then they take their place again (seed 146 of
    /// `all,rejoin,grow`).
    pub ended_down: HashSet<(Rank, Rank, u64)>,
}

impl Checker {
    /// `rank` starts a new life (the `rejoin` kind): the reliable messages of every pair with
    /// it are forgotten (its old life's sends never complete; sends to its old life ended
    /// `NodeDown`), and so is its place in the broadcast stream (it starts after its
    /// admission's operation, set when it is welcomed). A message of the old life posted
    /// after this breaks `in-order`: nothing of a dead incarnation may reach anyone later.
    pub fn forget_rank(&mut self, rank: Rank) {
        self.restarted.insert(rank);
        // Nothing its previous life was sent may reach the new one; what its previous life
        // sent may still be posted elsewhere, late.
        self.old_life_upto.retain(|(_, d), _| *d != rank);
        for ((o, d), sent) in &self.sent {
            if *o == rank
                && let Some(top) = sent.iter().max()
            {
                self.old_life_upto.insert((*o, *d), *top);
            }
        }
        for ((o, d), got) in &self.got {
            if *o == rank || *d == rank {
                self.posted_before.extend(got.iter().map(|s| (*o, *d, *s)));
            }
        }
        self.sent.retain(|(o, d), _| *o != rank && *d != rank);
        self.ended_down.retain(|(o, d, _)| *o != rank && *d != rank);
        self.got.retain(|(o, d), _| *o != rank && *d != rank);
        let completed = &self.completed;
        self.tokens
            .retain(|t, (o, _, _)| *o != rank || completed.contains(t));
        self.last_op.remove(&rank);
        // Its new life contributes to the allgathers again and gets their results afresh.
        self.got_result.retain(|(r, _)| *r != rank);
        self.lost_result.retain(|(r, _)| *r != rank);
        // Its old life's broadcast requests never finish; the new life numbers from 1 again.
        self.requests.retain(|(o, _), _| *o != rank);
    }

    /// A reliable send was accepted.
    pub fn sent_reliable(&mut self, token: u64, origin: Rank, dst: Rank, seq: u64) {
        self.sent.entry((origin, dst)).or_default().push(seq);
        self.tokens.insert(token, (origin, dst, seq));
    }

    /// `at` posted `m` to its application.
    pub fn delivered(&mut self, at: Rank, m: &Message) -> Result<(), Violation> {
        let Some((origin, dst, seq)) = parse(&m.payload) else {
            return Err(v(
                "integrity",
                format!("corrupt payload at {at} from {}", m.origin),
            ));
        };
        if origin != m.origin || dst != at {
            return Err(v(
                "integrity",
                format!(
                    "message {origin}->{dst} #{seq} posted at {at} as from {}",
                    m.origin
                ),
            ));
        }
        if m.tag == TAG_PLAIN {
            self.plain_posted += 1;
            if !self.plain_seen.insert((origin, dst, seq)) {
                return Err(v(
                    "plain-no-duplicate",
                    format!("plain {origin}->{dst} #{seq} posted twice"),
                ));
            }
            let last = self.plain_last.insert((origin, dst), seq);
            if let Some(l) = last.filter(|&l| l > seq) {
                // Only the first reordering of a run is kept (formatted once).
                if self.plain_order || self.plain_reordered.is_none() {
                    let what = format!("plain {origin}->{dst}: posted #{seq} after #{l}");
                    if self.plain_order {
                        return Err(v("plain-in-order", what));
                    }
                    self.plain_reordered = Some(what);
                }
            }
            return Ok(());
        }
        if m.tag != TAG_RELIABLE {
            return Err(v("integrity", format!("unexpected tag {}", m.tag)));
        }
        self.reliable_posted += 1;
        if self
            .old_life_upto
            .get(&(origin, dst))
            .is_some_and(|top| seq <= *top)
        {
            // A previous life's message, posted late (its origin's death not yet known here).
            if !self.posted_before.insert((origin, dst, seq)) {
                return Err(v(
                    "exactly-once",
                    format!("reliable {origin}->{dst} #{seq} (an earlier life's) posted twice"),
                ));
            }
            return Ok(());
        }
        if self.ended_down.remove(&(origin, dst, seq))
            && let Some(s) = self.sent.get_mut(&(origin, dst))
        {
            let at = s.partition_point(|x| *x < seq);
            s.insert(at, seq);
        }
        let got = self.got.entry((origin, dst)).or_default();
        let sent = self.sent.get(&(origin, dst));
        if got.contains(&seq) {
            return Err(v(
                "exactly-once",
                format!("reliable {origin}->{dst} #{seq} posted twice"),
            ));
        }
        let expected = sent.and_then(|s| s.get(got.len())).copied();
        if expected != Some(seq) {
            return Err(v(
                "in-order",
                format!(
                    "reliable {origin}->{dst}: posted #{seq} after {:?}, expected {expected:?} \
                     (sent {:?}, posted {:?})",
                    got.last(),
                    sent.and_then(|s| s.get(s.len().saturating_sub(8)..)),
                    got.get(got.len().saturating_sub(8)..)
                ),
            ));
        }
        got.push(seq);
        Ok(())
    }

    /// A reliable send completed. `crashed`: the ranks dead or declared dead so far.
    pub fn completed(
        &mut self,
        token: u64,
        result: &Result<(), SendError>,
        crashed: &[Rank],
    ) -> Result<(), Violation> {
        let Some(&(origin, dst, seq)) = self.tokens.get(&token) else {
            return Err(v("completion", format!("unknown token {token}")));
        };
        if !self.completed.insert(token) {
            return Err(v(
                "completion",
                format!("{origin}->{dst} #{seq} completed twice"),
            ));
        }
        match result {
            Ok(()) => {
                let posted = self
                    .got
                    .get(&(origin, dst))
                    .is_some_and(|g| g.contains(&seq))
                    || self.posted_before.contains(&(origin, dst, seq));
                if !posted {
                    return Err(v(
                        "completion",
                        format!("{origin}->{dst} #{seq} completed Ok before it was posted"),
                    ));
                }
            }
            Err(SendError::NodeDown(r)) if *r == dst && crashed.contains(&dst) => {
                // Never to be posted to a later life of a restarted `dst` (a fenced daemon
                // may still post it before it stops).
                let posted = self
                    .got
                    .get(&(origin, dst))
                    .is_some_and(|g| g.contains(&seq));
                if !posted
                    && self.restarted.contains(&dst)
                    && let Some(s) = self.sent.get_mut(&(origin, dst))
                {
                    s.retain(|x| *x != seq);
                    self.ended_down.insert((origin, dst, seq));
                }
            }
            // The origin was declared dead and stopped before the send was acknowledged.
            Err(SendError::ShutDown) if crashed.contains(&origin) => {}
            Err(e) => {
                return Err(v(
                    "completion",
                    format!("{origin}->{dst} #{seq} failed: {e}"),
                ));
            }
        }
        Ok(())
    }

    /// A broadcast request was accepted by `origin`'s core.
    pub fn originated(&mut self, origin: Rank, request: u64) {
        self.requests.insert((origin, request), false);
    }

    /// `at` delivered a broadcast.
    pub fn bcast_delivered(&mut self, at: Rank, b: &BcastDelivery) -> Result<(), Violation> {
        let (first, op, originator, tag, payload) = b;
        self.bcast_delivered += 1;
        let last = self.last_op.entry(at).or_insert(0);
        if *first != *last + 1 || op < first {
            return Err(v(
                "xcast-order",
                format!("rank {at} delivered ops {first} to {op} after op {last}"),
            ));
        }
        *last = *op;
        match self.ops.get(op) {
            Some((o, t, p)) if (o, t, p) != (originator, tag, payload) => {
                return Err(v(
                    "xcast-integrity",
                    format!("rank {at}: op {op} differs from what others delivered"),
                ));
            }
            Some(_) => {}
            None => {
                if first < op {
                    self.split_ops += 1;
                }
                self.ops.insert(*op, (*originator, *tag, payload.clone()));
            }
        }
        if *tag == TAG_BCAST {
            match parse(payload) {
                Some((o, _, _)) if o == *originator => {}
                _ => {
                    return Err(v(
                        "xcast-integrity",
                        format!("rank {at}: op {op} payload corrupt or misattributed"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// `at`'s broadcast request finished: `Some(op)` completed, `None` refused.
    pub fn bcast_finished(
        &mut self,
        at: Rank,
        request: u64,
        op: Option<u64>,
        alive: &[bool],
    ) -> Result<(), Violation> {
        match self.requests.get_mut(&(at, request)) {
            Some(done) if !*done => *done = true,
            Some(_) => {
                return Err(v(
                    "xcast-completion",
                    format!("rank {at}: request {request} finished twice"),
                ));
            }
            // Runtime broadcasts (allgather results) are not the workload's.
            None => return Ok(()),
        }
        if let Some(op) = op {
            for (r, a) in alive.iter().enumerate() {
                let r = r as Rank;
                if *a && self.last_op.get(&r).copied().unwrap_or(0) < op {
                    return Err(v(
                        "xcast-completion",
                        format!("rank {at}: op {op} completed before living rank {r} delivered it"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// `at`'s allgather `id` ended `ResultLost`: only a restarted rank's, and only once.
    pub fn gather_lost(&mut self, at: Rank, id: u64) -> Result<(), Violation> {
        if !self.restarted.contains(&at) {
            return Err(v(
                "allgather",
                format!("rank {at}: allgather {id} lost in a first life"),
            ));
        }
        if self.got_result.contains(&(at, id)) || !self.lost_result.insert((at, id)) {
            return Err(v(
                "allgather",
                format!("rank {at}: allgather {id} ended twice"),
            ));
        }
        Ok(())
    }

    /// `at` got an allgather result.
    pub fn gathered(&mut self, at: Rank, g: &AllgatherResult, size: u32) -> Result<(), Violation> {
        self.gathers += 1;
        if self.lost_result.contains(&(at, g.id)) || !self.got_result.insert((at, g.id)) {
            return Err(v(
                "allgather",
                format!("rank {at}: result of {} delivered twice", g.id),
            ));
        }
        if let Some(first) = self.results.get(&g.id) {
            if first != g {
                return Err(v(
                    "allgather",
                    format!("rank {at}: result of {} differs", g.id),
                ));
            }
            return Ok(());
        }
        if g.overflowed {
            return Err(v("allgather", format!("result of {} overflowed", g.id)));
        }
        for (r, bytes) in &g.contributions {
            if *bytes != contribution(*r, g.id) {
                return Err(v(
                    "allgather",
                    format!("result of {}: rank {r}'s bytes are wrong", g.id),
                ));
            }
        }
        let mut all: Vec<Rank> = g.ranks().chain(g.excluded.iter().copied()).collect();
        all.sort_unstable();
        if all != (0..size).collect::<Vec<_>>() {
            return Err(v(
                "allgather",
                format!(
                    "result of {}: contributors and excluded do not cover the DVM",
                    g.id
                ),
            ));
        }
        self.results.insert(g.id, g.clone());
        Ok(())
    }

    /// After the faults stopped: every survivor delivered every op, every survivor's request
    /// finished, every survivor got every allgather result (excluding only dead ranks), and the
    /// cores hold nothing.
    pub fn final_collectives(
        &self,
        nodes: &[SimNode],
        alive: &[bool],
        gathers: u64,
    ) -> Result<(), Violation> {
        let living = |r: Rank| alive.get(r as usize).copied().unwrap_or(false);
        let max_op = self.ops.keys().copied().max().unwrap_or(0);
        for n in nodes.iter().filter(|n| living(n.rank)) {
            let last = self.last_op.get(&n.rank).copied().unwrap_or(0);
            if last != max_op {
                return Err(v(
                    "xcast-liveness",
                    format!("rank {} delivered ops up to {last} of {max_op}", n.rank),
                ));
            }
            if n.xcast().retained() != 0 || n.xcast().outstanding() != 0 {
                return Err(v(
                    "xcast-liveness",
                    format!(
                        "rank {} still retains {} ops, {} requests outstanding",
                        n.rank,
                        n.xcast().retained(),
                        n.xcast().outstanding()
                    ),
                ));
            }
            for id in 1..=gathers {
                if !self.got_result.contains(&(n.rank, id))
                    && !self.lost_result.contains(&(n.rank, id))
                {
                    return Err(v(
                        "allgather",
                        format!("rank {} never got the result of {id}", n.rank),
                    ));
                }
            }
        }
        let mut reqs: Vec<_> = self.requests.iter().collect();
        reqs.sort_unstable_by_key(|(k, _)| **k);
        for ((o, r), done) in reqs {
            if living(*o) && !*done {
                return Err(v(
                    "xcast-completion",
                    format!("rank {o}: broadcast request {r} never finished"),
                ));
            }
        }
        for g in self.results.values() {
            for r in g.ranks() {
                let _ = r;
            }
            for x in &g.excluded {
                // A restarted rank is excused from what was in flight at its return.
                if living(*x) && !self.restarted.contains(x) {
                    return Err(v(
                        "allgather",
                        format!("result of {}: living rank {x} excluded", g.id),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The liveness checks, once the faults stopped and the world went quiet.
    pub fn final_state(
        &self,
        nodes: &[SimNode],
        alive: &[bool],
        crashed: &[Rank],
        radix: u32,
    ) -> Result<(), Violation> {
        let living = |r: Rank| alive.get(r as usize).copied().unwrap_or(false);
        let mut pairs: Vec<_> = self.sent.iter().collect();
        pairs.sort_unstable_by_key(|(k, _)| **k);
        for (&(origin, dst), sent) in pairs {
            if !(living(origin) && living(dst)) {
                continue;
            }
            let got = self.got.get(&(origin, dst)).map_or(0, |g| g.len());
            if got != sent.len() {
                return Err(v(
                    "no-loss",
                    format!(
                        "reliable {origin}->{dst}: {got} of {} posted, both alive",
                        sent.len()
                    ),
                ));
            }
        }
        let mut tokens: Vec<_> = self.tokens.iter().collect();
        tokens.sort_unstable_by_key(|(t, _)| **t);
        for (t, (origin, dst, seq)) in tokens {
            if living(*origin) && !self.completed.contains(t) {
                return Err(v(
                    "completion",
                    format!("{origin}->{dst} #{seq} never completed"),
                ));
            }
        }
        let size = nodes.len() as u32;
        let view = tree_view(radix, size, crashed)
            .map_err(|e| v("same-tree", format!("tree_view: {e}")))?;
        for n in nodes.iter().filter(|n| living(n.rank)) {
            if !n.errors.is_empty() {
                return Err(v(
                    "protocol",
                    format!("rank {}: {}", n.rank, n.errors.join("; ")),
                ));
            }
            if !n.relm().is_idle() {
                return Err(v(
                    "relm-idle",
                    format!(
                        "rank {} still holds RELM state {:?}",
                        n.rank,
                        n.relm().records()
                    ),
                ));
            }
            let failed: Vec<Rank> = n.routing().failed().collect();
            if failed != crashed {
                return Err(v(
                    "same-tree",
                    format!(
                        "rank {} thinks {failed:?} failed; crashed {crashed:?} (broadcasts: next expected {}, rank 0's next {})",
                        n.rank,
                        n.xcast().next_expected(),
                        nodes.first().map_or(0, |z| z.xcast().next_expected())
                    ),
                ));
            }
            let Some(nv) = view.iter().find(|x| x.rank == n.rank) else {
                return Err(v("same-tree", format!("rank {} not in the tree", n.rank)));
            };
            let mut children = n.routing().children().to_vec();
            children.sort_unstable();
            if nv.parent != n.routing().parent() || nv.children != children {
                return Err(v(
                    "same-tree",
                    format!(
                        "rank {}: parent {:?} children {:?}, expected {:?} {:?}",
                        n.rank,
                        n.routing().parent(),
                        children,
                        nv.parent,
                        nv.children
                    ),
                ));
            }
        }
        Ok(())
    }
}

fn v(checker: &'static str, detail: String) -> Violation {
    Violation { checker, detail }
}
