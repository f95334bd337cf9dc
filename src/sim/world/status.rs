//! Status queries in the simulator (the `status` kind): operators ask random daemons for the
//! status of their subtree during the run, and rank 0 once more after the run settled. The
//! checks: every query is answered (by a daemon that keeps running), within its budget unless
//! the asked daemon itself stalled; no daemon dead before the query answers it; and the last
//! query, after quiescence, shows every living daemon and nothing else.

use super::{Ev, World};
use crate::Rank;
use crate::sim::check::Violation;
use crate::status::Report;
use crate::status::view::{RankState, view};
use std::collections::HashMap;

/// One query in flight.
#[derive(Debug)]
pub(super) struct Asked {
    asker: Rank,
    at_us: u64,
    budget_ms: u32,
    /// Ranks that had crashed before it was asked: none of them may answer.
    dead_before: Vec<Rank>,
    /// The asked daemon stalled meanwhile: its deadline fired late.
    stalled: bool,
}

/// The world's status queries.
#[derive(Debug, Default)]
pub(super) struct StatusQueries {
    next_token: u64,
    asked: HashMap<u64, Asked>,
    pub answered: u64,
    /// The token of the query after quiescence, and its report once it came.
    last: Option<u64>,
    last_report: Option<Report>,
}

fn violation(detail: String) -> Violation {
    Violation {
        checker: "status",
        detail,
    }
}

/// The largest drift of a simulated clock, in parts per billion (`swarm::clocks`).
const DRIFT_PPB_MAX: i64 = 100_000;

impl World {
    /// Daemon `r`'s wall clock at the current virtual time (ns since the Unix epoch).
    pub(super) fn wall_of(&self, r: Rank) -> i64 {
        let now = self.now();
        self.nodes
            .get(r as usize)
            .and_then(|n| n.wall(now))
            .unwrap_or(0)
    }

    /// Gives every daemon its skewed, drifting clock (the `status` kind).
    pub(super) fn set_clocks(&mut self) {
        // 2026-01-01, so that every clock is well after the epoch.
        const BASE_NS: i64 = 1_767_225_600_000_000_000;
        let base = self.base;
        for (n, &(offset, drift)) in self.nodes.iter_mut().zip(&self.scen.clocks) {
            n.clock = Some((base, BASE_NS + offset, drift));
        }
    }

    /// Every clock offset in `report` lies within its bound of the truth (plus what the clocks
    /// could drift apart while the query ran).
    fn check_offsets(&self, token: u64, report: &Report, took_us: u64) -> Result<(), Violation> {
        let slack =
            2 * DRIFT_PPB_MAX * i64::try_from(took_us).unwrap_or(i64::MAX / 1000) / 1_000_000 + 10;
        for p in &report.parts {
            let crate::status::Part::Daemon(d) = p else {
                continue;
            };
            let (Some(offset), Some(bound)) = (d.clock_offset_ns, d.clock_bound_ns) else {
                continue;
            };
            let truth = self.wall_of(d.rank) - self.wall_of(report.from);
            let error = offset.saturating_sub(truth).unsigned_abs();
            if error > bound.saturating_add(slack.unsigned_abs()) {
                return Err(violation(format!(
                    "query {token}: rank {}'s clock offset from rank {} was reported as {offset} \
                     ns ± {bound}, the truth is {truth} ns (off by {error} ns, slack {slack})",
                    d.rank, report.from
                )));
            }
        }
        Ok(())
    }

    /// Schedules the run's status queries.
    pub(super) fn plan_status(&mut self) {
        for &(asker, budget_ms, all, at_us) in &self.scen.statuses.clone() {
            self.push(
                at_us,
                Ev::Status {
                    asker,
                    budget_ms,
                    all,
                },
            );
        }
    }

    /// An operator asks `asker`.
    pub(super) fn on_status(
        &mut self,
        asker: Rank,
        budget_ms: u32,
        all: bool,
    ) -> Result<Option<u64>, Violation> {
        if !self.living(asker) {
            return Ok(None);
        }
        let now = self.now();
        self.status.next_token += 1;
        let token = self.status.next_token;
        let Some(n) = self.nodes.get_mut(asker as usize) else {
            return Ok(None);
        };
        // Refused (stopping, or too many in progress): nothing to wait for.
        let asked = n.status(now, token, budget_ms, all).is_ok();
        if asked {
            let dead_before = self.crashed.clone();
            self.status.asked.insert(
                token,
                Asked {
                    asker,
                    at_us: self.now_us,
                    budget_ms,
                    dead_before,
                    stalled: false,
                },
            );
        }
        self.after(asker)?;
        Ok(asked.then_some(token))
    }

    /// `rank` stalls: its queries' deadlines fire late.
    pub(super) fn status_stalled(&mut self, rank: Rank) {
        for a in self.status.asked.values_mut() {
            if a.asker == rank {
                a.stalled = true;
            }
        }
    }

    /// The reports daemon `r` produced.
    /// `rank` starts a new life: its old life's queries died with it, and its new life may
    /// answer the others' (it was dead when they were asked, it is not now).
    pub(super) fn status_restarted(&mut self, rank: Rank) {
        self.status.asked.retain(|_, a| a.asker != rank);
        for a in self.status.asked.values_mut() {
            a.dead_before.retain(|r| *r != rank);
        }
    }

    pub(super) fn status_reports(
        &mut self,
        r: Rank,
        reports: Vec<(u64, Report)>,
    ) -> Result<(), Violation> {
        for (token, report) in reports {
            let Some(a) = self.status.asked.remove(&token) else {
                return Err(violation(format!(
                    "rank {r}: a report for unknown query {token}"
                )));
            };
            self.status.answered += 1;
            if a.asker != r || report.from != r {
                return Err(violation(format!(
                    "query {token} asked rank {}, answered by {r} (from {})",
                    a.asker, report.from
                )));
            }
            let took_us = self.now_us - a.at_us;
            if !a.stalled && took_us > u64::from(a.budget_ms) * 1000 {
                return Err(violation(format!(
                    "rank {r}: a status with a budget of {} ms took {took_us} us",
                    a.budget_ms
                )));
            }
            for p in &report.parts {
                if let crate::status::Part::Daemon(d) = p
                    && a.dead_before.contains(&d.rank)
                {
                    return Err(violation(format!(
                        "rank {}, dead before query {token} was asked, answered it",
                        d.rank
                    )));
                }
            }
            self.check_offsets(token, &report, took_us)?;
            // (A daemon moved by a repair may answer two parents: counted in the report's
            // parts twice, once in its view.)
            if self.status.last == Some(token) {
                self.status.last_report = Some(report);
            }
        }
        Ok(())
    }

    /// After quiescence: rank 0's status must show every living daemon and nothing else.
    pub(super) fn final_status(&mut self) -> Result<(), Violation> {
        let size = self.nodes.len() as u32;
        // The longest budget: a link's own latency may be near a second each way (`delay`),
        // and an answer that comes late is rightly "no answer".
        let budget_ms = crate::limits::STATUS_BUDGET_MS_MAX;
        // The report may come at once (a daemon with no children answers in the call).
        self.status.last = Some(self.status.next_token + 1);
        if self.on_status(0, budget_ms, size <= 512)?.is_none() {
            return Ok(());
        }
        let asked_us = self.now_us;
        let until = self.now_us + u64::from(budget_ms) * 1000 + 1_000_000;
        while self.status.last_report.is_none() {
            if self.step_one()? == super::Step::Empty || self.now_us > until {
                return Err(violation(format!(
                    "rank 0's status after quiescence did not come (now {} us)",
                    self.now_us
                )));
            }
        }
        let Some(report) = self.status.last_report.take() else {
            return Ok(());
        };
        let depth = v_depth(&report);
        self.stats.last_status = Some((self.now_us - asked_us, depth, self.scen.latency_us));
        let v = view(&report).map_err(|e| violation(format!("the last report: {e}")))?;
        let answered: Vec<Rank> = v
            .ranks
            .iter()
            .filter(|r| matches!(r.state, RankState::Alive | RankState::Healthy))
            .map(|r| r.rank)
            .collect();
        let expected: Vec<Rank> = (0..size)
            .filter(|r| self.living(*r) && !report.failed.contains(r))
            .collect();
        // A daemon still stalled (the run settles while a long stall goes on, before the
        // heartbeats declare it) rightly does not answer, nor does anything below it.
        let stalled: Vec<Rank> = (0..size)
            .filter(|r| {
                self.stalled_until
                    .get(*r as usize)
                    .is_some_and(|u| *u > asked_us)
            })
            .collect();
        let excused = |r: Rank| {
            let mut at = v.ranks.iter().find(|x| x.rank == r);
            while let Some(x) = at {
                if stalled.contains(&x.rank) {
                    return true;
                }
                at = x.parent.and_then(|p| v.ranks.iter().find(|y| y.rank == p));
            }
            false
        };
        let missing: Vec<Rank> = expected
            .iter()
            .copied()
            .filter(|r| !answered.contains(r) && !excused(*r))
            .collect();
        let extra: Vec<Rank> = answered
            .iter()
            .copied()
            .filter(|r| !expected.contains(r))
            .collect();
        if !missing.is_empty() || !extra.is_empty() || v.views_differ {
            return Err(violation(format!(
                "after quiescence rank 0's status showed {answered:?} answering (views differ: \
                 {}, no answer {:?}, unknown {:?}, unreached {:?}); living and not failed: \
                 {expected:?}, stalled: {stalled:?}",
                v.views_differ,
                v.ranks_in(RankState::NoAnswer),
                v.ranks_in(RankState::Unknown),
                v.ranks_in(RankState::Unreached),
            )));
        }
        Ok(())
    }

    /// Whether a query of a running daemon is in progress (the run is not over while one is;
    /// a daemon that died or was declared dead answers nobody).
    pub(super) fn status_pending(&self) -> bool {
        self.status
            .asked
            .values()
            .any(|a| self.living(a.asker) && !self.declared.contains(&a.asker))
    }

    /// At the end: a query still unanswered while its daemon runs is lost.
    pub(super) fn status_unanswered(&self) -> Result<(), Violation> {
        for (token, a) in &self.status.asked {
            if self.living(a.asker) && !self.declared.contains(&a.asker) {
                return Err(violation(format!(
                    "query {token} to rank {} (at {} us, budget {} ms) was never answered",
                    a.asker, a.at_us, a.budget_ms
                )));
            }
        }
        Ok(())
    }
}

/// The depth of the deepest daemon a report shows in detail, or of the tree it implies.
fn v_depth(report: &Report) -> u32 {
    view(report)
        .map(|v| v.ranks.iter().map(|r| r.depth).max().unwrap_or(0))
        .unwrap_or(0)
}
