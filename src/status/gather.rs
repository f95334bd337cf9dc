//! One daemon's status queries in progress: whom it waits for, until when, and the rule that
//! merges its children's answers into its own (summaries for healthy subtrees, detail for
//! problems, a bound on the whole).

use super::wire::{Answer, part_len};
use super::{DaemonStatus, Healthy, Part, problem};
use crate::Rank;
use crate::limits::{STATUS_GATHERS_MAX, STATUS_PARTS_MAX};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Who waits for a gather's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asker {
    /// A daemon (the parent, usually) that sent a `Query` with this id.
    Daemon { rank: Rank, id: u64 },
    /// This daemon's driver (a tool's connection or an API caller), with its token.
    Local { token: u64 },
}

/// What the asker knew, for the [`problem::VIEW_DIFFERS`] check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AskerView {
    pub epoch: u64,
    pub failed: u32,
}

/// One query in progress here.
#[derive(Debug)]
pub struct Gather {
    pub asker: Asker,
    /// The id this daemon's children answer to (this daemon's own numbering).
    pub id: u64,
    pub arrived: Instant,
    pub deadline: Instant,
    pub all: bool,
    pub view: Option<AskerView>,
    /// When the query arrived here, on this daemon's wall clock (ns; for its answer).
    pub received_ns: Option<i64>,
    /// Children asked and not yet answered, with when they were asked (and on the wall
    /// clock: the first timestamp of their clock sample).
    waiting: Vec<(Rank, Instant, Option<i64>)>,
    /// Clock samples of the children that answered: their offset from this daemon and its
    /// bound (ns).
    samples: Vec<(Rank, i64, u64)>,
    /// Every child asked (a child adopted during the gather is asked too, once).
    asked: Vec<Rank>,
    /// Round trips measured to the children that answered (µs).
    rtts: Vec<(Rank, u32)>,
    /// The children's answers, in arrival order.
    answers: Vec<(Rank, Answer)>,
}

/// The budget a daemon gives its children out of its own: seven eighths, less a small margin
/// for its own work and the hop back, so that answers reach each level before its deadline.
pub fn child_budget_ms(budget_ms: u32) -> u32 {
    (budget_ms / 8 * 7).saturating_sub(2)
}

impl Gather {
    /// Whether every child asked has answered.
    pub fn is_complete(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Merges what arrived into this daemon's answer: `own` is this daemon's entry (its
    /// links and problems are completed here). Returns the parts and whether detail was
    /// dropped to stay within `max_bytes` and `STATUS_PARTS_MAX`.
    pub fn finish(self, own: DaemonStatus, max_bytes: usize) -> (Vec<Part>, bool) {
        let mut own = own;
        let silent: Vec<Rank> = self.waiting.iter().map(|(r, ..)| *r).collect();
        own.clock_offset_ns = Some(0);
        own.clock_bound_ns = Some(0);
        if !silent.is_empty() {
            own.problems |= problem::CHILD_SILENT;
        }
        if let Some(v) = self.view
            && (v.epoch != own.epoch || v.failed != own.failed_known)
        {
            own.problems |= problem::VIEW_DIFFERS;
        }
        for link in &mut own.links {
            if let Some((_, rtt)) = self.rtts.iter().find(|(r, _)| *r == link.peer) {
                link.rtt_us = Some(*rtt);
            }
        }
        let children_healthy = self.answers.iter().all(|(_, a)| {
            !a.truncated && a.parts.len() == 1 && matches!(a.parts.first(), Some(Part::Healthy(_)))
        });
        if !self.all && own.problems == 0 && children_healthy {
            return (vec![Part::Healthy(summarise(&own, &self.answers))], false);
        }
        let mut truncated = false;
        let me = Part::Daemon(Box::new(own.clone()));
        let mut bytes = part_len(&me);
        let mut parts = vec![me];
        for rank in silent {
            let p = Part::NoAnswer {
                rank,
                parent: own.rank,
            };
            bytes += part_len(&p);
            parts.push(p);
        }
        for (child, mut answer) in self.answers {
            truncated |= answer.truncated;
            // The child's subtree's offsets are from the child: add the child's own.
            let sample = self.samples.iter().find(|(r, ..)| *r == child);
            for p in &mut answer.parts {
                if let Part::Daemon(d) = p {
                    match (sample, d.clock_offset_ns, d.clock_bound_ns) {
                        (Some(&(_, off, bound)), Some(o), Some(b)) => {
                            d.clock_offset_ns = Some(o.saturating_add(off));
                            d.clock_bound_ns = Some(b.saturating_add(bound));
                        }
                        _ => {
                            d.clock_offset_ns = None;
                            d.clock_bound_ns = None;
                        }
                    }
                }
            }
            let len: usize = answer.parts.iter().map(part_len).sum();
            if parts.len() + answer.parts.len() > STATUS_PARTS_MAX || bytes + len > max_bytes {
                let daemons = answer.parts.iter().map(Part::daemons).sum();
                let p = Part::Elided {
                    root: child,
                    daemons,
                };
                bytes += part_len(&p);
                parts.push(p);
                truncated = true;
                continue;
            }
            bytes += len;
            parts.extend(answer.parts);
        }
        (parts, truncated)
    }
}

/// NTP's rule for one exchange: `t1` the asker sent, `t2` the answerer received, `t3` it
/// answered (its clock), `t4` the asker received (its clock). The answerer's clock minus the
/// asker's is `((t2 - t1) + (t3 - t4)) / 2`, within half the network round trip `(t4 - t1) -
/// (t3 - t2)` (whatever the split of the delay between the two ways, as long as each
/// timestamp was read no earlier, at a receipt, or no later, at a send, than the event).
pub fn clock_sample(t1: i64, t2: i64, t3: i64, t4: i64) -> (i64, u64) {
    let (t1, t2, t3, t4) = (
        i128::from(t1),
        i128::from(t2),
        i128::from(t3),
        i128::from(t4),
    );
    let offset = ((t2 - t1) + (t3 - t4)) / 2;
    let delay = ((t4 - t1) - (t3 - t2)).max(0);
    let bound = (delay + 1) / 2 + 1;
    (
        i64::try_from(offset).unwrap_or(if offset < 0 { i64::MIN + 1 } else { i64::MAX }),
        u64::try_from(bound).unwrap_or(u64::MAX),
    )
}

/// One healthy part for `own` and its children's healthy parts.
fn summarise(own: &DaemonStatus, answers: &[(Rank, Answer)]) -> Healthy {
    let mut h = Healthy {
        root: own.rank,
        daemons: 1,
        height: 0,
        uptime_ms_min: own.uptime_ms,
        rtt_us_max: own.links.iter().filter_map(|l| l.rtt_us).max(),
        counters: own.counters.clone(),
    };
    for (_, a) in answers {
        for p in &a.parts {
            if let Part::Healthy(c) = p {
                h.daemons = h.daemons.saturating_add(c.daemons);
                h.height = h.height.max(c.height.saturating_add(1));
                h.uptime_ms_min = h.uptime_ms_min.min(c.uptime_ms_min);
                h.rtt_us_max = h.rtt_us_max.max(c.rtt_us_max);
                h.counters.add(&c.counters);
            }
        }
    }
    h
}

/// The queries in progress at one daemon, at most `STATUS_GATHERS_MAX`.
#[derive(Debug, Default)]
pub struct Gathers {
    table: VecDeque<Gather>,
    next_id: u64,
}

impl Gathers {
    /// Starts a gather that asks `children` (the caller sends them the `Query` with the id
    /// returned). At the bound, the oldest gather is returned to be answered at once with
    /// what it has (a flood of queries costs answers detail, never memory).
    /// `wall_ns` is this daemon's wall clock now, if it has one (it sends the queries now).
    #[allow(clippy::too_many_arguments)]
    pub fn begin(
        &mut self,
        now: Instant,
        asker: Asker,
        budget: Duration,
        all: bool,
        view: Option<AskerView>,
        children: &[Rank],
        wall_ns: Option<i64>,
    ) -> (u64, Option<Gather>) {
        let evicted = if self.table.len() >= STATUS_GATHERS_MAX {
            self.table.pop_front()
        } else {
            None
        };
        self.next_id += 1;
        let id = self.next_id;
        self.table.push_back(Gather {
            asker,
            id,
            arrived: now,
            deadline: now + budget,
            all,
            view,
            received_ns: wall_ns,
            waiting: children.iter().map(|c| (*c, now, wall_ns)).collect(),
            samples: Vec::new(),
            asked: children.to_vec(),
            rtts: Vec::new(),
            answers: Vec::new(),
        });
        (id, evicted)
    }

    /// Gathers in progress.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Local gathers (a tool's or a caller's) in progress.
    pub fn local(&self) -> usize {
        self.table
            .iter()
            .filter(|g| matches!(g.asker, Asker::Local { .. }))
            .count()
    }

    /// Child `from` answered query `answer.id` (`wall_ns`: this daemon's wall clock now, the
    /// last timestamp of the clock sample); returns false (nothing changes) when no gather
    /// waits for that answer from it: a late answer, or one from a daemon never asked.
    pub fn handle_answer(
        &mut self,
        now: Instant,
        from: Rank,
        answer: Answer,
        wall_ns: Option<i64>,
    ) -> bool {
        let Some(g) = self.table.iter_mut().find(|g| g.id == answer.id) else {
            return false;
        };
        let Some(i) = g.waiting.iter().position(|(r, ..)| *r == from) else {
            return false;
        };
        let (_, asked, sent_ns) = g.waiting.swap_remove(i);
        if let (Some(t1), Some(t2), Some(t3), Some(t4)) =
            (sent_ns, answer.received_ns, answer.answered_ns, wall_ns)
        {
            let (offset, bound) = clock_sample(t1, t2, t3, t4);
            log::trace!(
                "clock sample of {from}: t1 {t1} t2 {t2} t3 {t3} t4 {t4}: {offset} ± {bound}"
            );
            g.samples.push((from, offset, bound));
        }
        let rtt = now
            .saturating_duration_since(asked)
            .saturating_sub(Duration::from_micros(u64::from(answer.held_us)));
        g.rtts
            .push((from, u32::try_from(rtt.as_micros()).unwrap_or(u32::MAX - 1)));
        g.answers.push((from, answer));
        true
    }

    /// `dead` failed: nobody waits for their answers (the report lists them as failed), and
    /// their own queries are not answered.
    pub fn forget(&mut self, dead: &[Rank]) {
        // A dead asker's gathers are dropped: their answers would reach its next life, if it
        // is admitted back, which may ask again under the same id and would take the old
        // answer's timing as its own (a clock offset off by the time between: regression seed
        // 109209).
        self.table
            .retain(|g| !matches!(g.asker, Asker::Daemon { rank, .. } if dead.contains(&rank)));
        for g in &mut self.table {
            g.waiting.retain(|(r, ..)| !dead.contains(r));
        }
    }

    /// This daemon's children are now `children` (a repair gave it new ones): each gather
    /// asks the ones it has not asked yet. Returns, per gather with new children, its id, its
    /// `all` flag, the time left to its deadline, and the children to ask.
    pub fn adopt(
        &mut self,
        now: Instant,
        children: &[Rank],
        wall_ns: Option<i64>,
    ) -> Vec<(u64, bool, Duration, Vec<Rank>)> {
        let mut out = Vec::new();
        for g in &mut self.table {
            let new: Vec<Rank> = children
                .iter()
                .copied()
                .filter(|c| !g.asked.contains(c))
                .collect();
            if new.is_empty() || g.deadline <= now {
                continue;
            }
            for c in &new {
                g.asked.push(*c);
                g.waiting.push((*c, now, wall_ns));
            }
            out.push((g.id, g.all, g.deadline.saturating_duration_since(now), new));
        }
        out
    }

    /// The gathers to answer now: complete, or past their deadline.
    pub fn take_due(&mut self, now: Instant) -> Vec<Gather> {
        let mut due = Vec::new();
        let mut i = 0;
        while i < self.table.len() {
            if self
                .table
                .get(i)
                .is_some_and(|g| g.is_complete() || g.deadline <= now)
            {
                if let Some(g) = self.table.remove(i) {
                    due.push(g);
                }
            } else {
                i += 1;
            }
        }
        due
    }

    /// Every gather, to be answered at once (the daemon stops).
    pub fn take_all(&mut self) -> Vec<Gather> {
        self.table.drain(..).collect()
    }

    /// The earliest deadline.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.table.iter().map(|g| g.deadline).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{LinkStatus, StatusCounters};

    fn own(rank: Rank, children: &[Rank]) -> DaemonStatus {
        DaemonStatus {
            rank,
            incarnation: 1,
            epoch: 0,
            parent: None,
            children: children.to_vec(),
            depth: 0,
            uptime_ms: 100,
            failed_known: 0,
            problems: 0,
            links: children
                .iter()
                .map(|c| LinkStatus {
                    peer: *c,
                    rtt_us: None,
                    queued_bytes: 0,
                    address: None,
                    failovers: 0,
                })
                .collect(),
            counters: StatusCounters {
                sent: 1,
                ..Default::default()
            },
            clock_offset_ns: None,
            clock_bound_ns: None,
        }
    }

    fn healthy(root: Rank, daemons: u32) -> Answer {
        Answer {
            id: 1,
            held_us: 10,
            received_ns: None,
            answered_ns: None,
            truncated: false,
            parts: vec![Part::Healthy(Healthy {
                root,
                daemons,
                height: 1,
                uptime_ms_min: 50,
                rtt_us_max: Some(30),
                counters: StatusCounters {
                    sent: u64::from(daemons),
                    ..Default::default()
                },
            })],
        }
    }

    /// A caller's gather with no clock and no asker's view.
    fn local(
        g: &mut Gathers,
        t0: Instant,
        token: u64,
        budget: Duration,
        all: bool,
        children: &[Rank],
    ) -> (u64, Option<Gather>) {
        g.begin(
            t0,
            Asker::Local { token },
            budget,
            all,
            None,
            children,
            None,
        )
    }

    #[test]
    fn healthy_children_fold_into_one_summary() {
        let t0 = Instant::now();
        let mut g = Gathers::default();
        let (id, none) = local(&mut g, t0, 1, Duration::from_secs(1), false, &[1, 2]);
        assert!(none.is_none());
        let at = t0 + Duration::from_millis(1);
        assert!(g.handle_answer(
            at,
            1,
            Answer {
                id,
                ..healthy(1, 3)
            },
            None
        ));
        assert!(
            !g.handle_answer(
                at,
                1,
                Answer {
                    id,
                    ..healthy(1, 3)
                },
                None
            ),
            "twice"
        );
        assert!(
            !g.handle_answer(
                at,
                5,
                Answer {
                    id,
                    ..healthy(5, 3)
                },
                None
            ),
            "never asked"
        );
        assert!(g.take_due(at).is_empty());
        assert!(g.handle_answer(
            at,
            2,
            Answer {
                id,
                ..healthy(2, 4)
            },
            None
        ));
        let mut due = g.take_due(at);
        let (parts, truncated) = due.pop().unwrap().finish(own(0, &[1, 2]), 1 << 20);
        assert!(!truncated);
        let [Part::Healthy(h)] = &parts[..] else {
            panic!("{parts:?}")
        };
        assert_eq!((h.root, h.daemons, h.height), (0, 8, 2));
        assert_eq!(h.uptime_ms_min, 50);
        assert_eq!(h.counters.sent, 1 + 3 + 4);
        // The round trip less the 10 µs the child held the query.
        assert_eq!(h.rtt_us_max, Some(990));
    }

    #[test]
    fn a_silent_child_is_reported_and_keeps_its_parent_in_detail() {
        let t0 = Instant::now();
        let mut g = Gathers::default();
        let (id, _) = g.begin(
            t0,
            Asker::Daemon { rank: 0, id: 4 },
            Duration::from_millis(100),
            false,
            Some(AskerView {
                epoch: 0,
                failed: 0,
            }),
            &[3, 4],
            None,
        );
        g.handle_answer(
            t0,
            3,
            Answer {
                id,
                ..healthy(3, 1)
            },
            None,
        );
        assert!(g.take_due(t0 + Duration::from_millis(99)).is_empty());
        assert_eq!(g.poll_timeout(), Some(t0 + Duration::from_millis(100)));
        let mut due = g.take_due(t0 + Duration::from_millis(100));
        let (parts, _) = due.pop().unwrap().finish(own(1, &[3, 4]), 1 << 20);
        let [
            Part::Daemon(d),
            Part::NoAnswer { rank: 4, parent: 1 },
            Part::Healthy(h),
        ] = &parts[..]
        else {
            panic!("{parts:?}")
        };
        assert_eq!(d.problems, problem::CHILD_SILENT);
        assert_eq!(d.links[0].rtt_us, Some(0));
        assert_eq!(d.links[1].rtt_us, None);
        assert_eq!(h.root, 3);
    }

    #[test]
    fn a_dead_askers_gathers_are_dropped() {
        let t0 = Instant::now();
        let mut g = Gathers::default();
        for (rank, id) in [(4, 1), (5, 1)] {
            g.begin(
                t0,
                Asker::Daemon { rank, id },
                Duration::from_millis(100),
                false,
                None,
                &[7, 8],
                None,
            );
        }
        g.forget(&[4, 8]);
        assert_eq!(g.len(), 1, "rank 4's query is not answered");
        let due = g.take_due(t0 + Duration::from_millis(100));
        assert!(matches!(due[..], [ref x] if x.asker == Asker::Daemon { rank: 5, id: 1 }));
    }

    #[test]
    fn children_adopted_during_a_gather_are_asked_once_with_the_time_left() {
        let t0 = Instant::now();
        let mut g = Gathers::default();
        let (id, _) = local(&mut g, t0, 1, Duration::from_millis(100), false, &[1, 2]);
        // Child 2 died and its children 5 and 6 came to this daemon.
        g.forget(&[2]);
        let at = t0 + Duration::from_millis(40);
        let asks = g.adopt(at, &[1, 5, 6], None);
        assert_eq!(
            asks,
            vec![(id, false, Duration::from_millis(60), vec![5, 6])]
        );
        assert!(g.adopt(at, &[1, 5, 6], None).is_empty(), "asked once");
        for c in [1, 5, 6] {
            assert!(g.handle_answer(
                at,
                c,
                Answer {
                    id,
                    ..healthy(c, 1)
                },
                None
            ));
        }
        let (parts, _) = g
            .take_due(at)
            .pop()
            .unwrap()
            .finish(own(0, &[1, 5, 6]), 1 << 20);
        assert!(
            matches!(&parts[..], [Part::Healthy(h)] if h.daemons == 4),
            "{parts:?}"
        );
    }

    #[test]
    fn a_clock_sample_bounds_the_offset_whatever_the_split_of_the_delay() {
        // The answerer's clock is 1,000 ns ahead; 300 ns out, 100 ns back, held 50 ns.
        let (t1, t2, t3, t4) = (10_000, 11_300, 11_350, 10_450);
        let (offset, bound) = clock_sample(t1, t2, t3, t4);
        assert_eq!((offset, bound), (1_100, 201));
        assert!((offset - 1_000).unsigned_abs() <= bound);
        // Offsets add up the path: a grandchild's offset from the gatherer.
        let t0 = Instant::now();
        let mut g = Gathers::default();
        let (id, _) = g.begin(
            t0,
            Asker::Local { token: 1 },
            Duration::from_secs(1),
            true,
            None,
            &[1],
            Some(t1),
        );
        let mut child = own(1, &[]);
        child.clock_offset_ns = Some(-7);
        child.clock_bound_ns = Some(3);
        let answer = Answer {
            id,
            held_us: 0,
            received_ns: Some(t2),
            answered_ns: Some(t3),
            truncated: false,
            parts: vec![Part::Daemon(Box::new(child))],
        };
        assert!(g.handle_answer(t0, 1, answer, Some(t4)));
        let (parts, _) = g.take_due(t0).pop().unwrap().finish(own(0, &[1]), 1 << 20);
        let [Part::Daemon(me), Part::Daemon(c)] = &parts[..] else {
            panic!("{parts:?}")
        };
        assert_eq!((me.clock_offset_ns, me.clock_bound_ns), (Some(0), Some(0)));
        assert_eq!(
            (c.clock_offset_ns, c.clock_bound_ns),
            (Some(1_093), Some(204))
        );
    }

    #[test]
    fn detail_beyond_the_bound_is_elided_and_the_table_is_bounded() {
        let t0 = Instant::now();
        let mut g = Gathers::default();
        let (id, _) = local(&mut g, t0, 1, Duration::from_secs(1), true, &[1]);
        let big = Answer {
            id,
            held_us: 0,
            received_ns: None,
            answered_ns: None,
            truncated: false,
            parts: (0..10)
                .map(|r| Part::NoAnswer { rank: r, parent: 1 })
                .collect(),
        };
        g.handle_answer(t0, 1, big, None);
        let (parts, truncated) = g.take_due(t0).pop().unwrap().finish(own(0, &[1]), 60);
        assert!(truncated);
        assert!(matches!(
            parts[..],
            [Part::Daemon(_), Part::Elided { root: 1, .. }]
        ));
        for i in 0..STATUS_GATHERS_MAX {
            let (_, evicted) = local(&mut g, t0, i as u64, Duration::from_secs(1), false, &[1]);
            assert!(evicted.is_none());
        }
        let (_, evicted) = local(&mut g, t0, 99, Duration::from_secs(1), false, &[1]);
        assert_eq!(evicted.unwrap().asker, Asker::Local { token: 0 });
        assert_eq!(g.len(), STATUS_GATHERS_MAX);
    }
}
