//! The node's side of status queries (`crate::status`): a query from the parent or from this
//! daemon's driver starts a gather, which asks the children with a smaller budget and answers
//! once they all answered or its deadline passed.

use super::{Node, Output};
use crate::Rank;
use crate::limits::{STATUS_ANSWER_BYTES_MAX, STATUS_BUDGET_MS_MAX, STATUS_LOCAL_MAX};
use crate::oob::header::Kind;
use crate::rml::Message;
use crate::status::gather::{Asker, AskerView, Gather, child_budget_ms};
use crate::status::wire::{Answer, Msg, Query};
use crate::status::{DaemonStatus, LinkStatus, Report, StatusCounters, TAG_STATUS, problem};
use std::time::{Duration, Instant};

/// Why this daemon did not start a status query for its driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatusRefused {
    /// Wire-up is not complete: the tree is not known yet.
    NotWired,
    /// The daemon is stopping.
    Stopping,
    /// `limits::STATUS_LOCAL_MAX` queries of this daemon's tools and callers are in progress.
    Busy,
}

impl std::fmt::Display for StatusRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StatusRefused::NotWired => "the daemon is not wired up yet",
            StatusRefused::Stopping => "the daemon is stopping",
            StatusRefused::Busy => "too many status queries in progress; try again",
        })
    }
}

impl Node {
    /// The driver asks for the status of this daemon's subtree (rank 0: the whole DVM), to be
    /// answered within `budget_ms` (cut to `STATUS_BUDGET_MS_MAX`) by
    /// [`Output::Status`] with `token`. `all`: every daemon in detail.
    pub fn handle_status(
        &mut self,
        now: Instant,
        token: u64,
        budget_ms: u32,
        all: bool,
    ) -> Result<(), StatusRefused> {
        if self.stopping.is_some() {
            return Err(StatusRefused::Stopping);
        }
        if !self.is_wired() {
            return Err(StatusRefused::NotWired);
        }
        if self.status.local() >= STATUS_LOCAL_MAX {
            return Err(StatusRefused::Busy);
        }
        self.begin_gather(now, Asker::Local { token }, budget_ms, all, None);
        Ok(())
    }

    pub(super) fn on_status_message(&mut self, now: Instant, msg: Message) {
        match Msg::decode(&msg.payload, self.size) {
            Ok(Msg::Query(q)) => {
                let asker = Asker::Daemon {
                    rank: msg.origin,
                    id: q.id,
                };
                let view = AskerView {
                    epoch: q.epoch,
                    failed: q.failed,
                };
                self.begin_gather(now, asker, q.budget_ms, q.all, Some(view));
            }
            Ok(Msg::Answer(a)) => {
                let wall = self.wall_at(now);
                if !self.status.handle_answer(now, msg.origin, a, wall) {
                    log::debug!(
                        "rank {}: a late or unasked status answer from {} ignored",
                        self.me,
                        msg.origin
                    );
                }
                self.answer_due(now);
            }
            Ok(Msg::Report(_) | Msg::Refused(_)) => log::warn!(
                "rank {}: a tool's status message from daemon {} ignored",
                self.me,
                msg.origin
            ),
            Err(e) => log::warn!("rank {}: from {}: {e}; dropped", self.me, msg.origin),
        }
    }

    fn begin_gather(
        &mut self,
        now: Instant,
        asker: Asker,
        budget_ms: u32,
        all: bool,
        view: Option<AskerView>,
    ) {
        let budget_ms = budget_ms.min(STATUS_BUDGET_MS_MAX);
        let children = self.routing.children().to_vec();
        log::debug!(
            "rank {}: status query from {asker:?}, budget {budget_ms} ms, asking {children:?}",
            self.me
        );
        let wall = self.wall_at(now);
        let (id, evicted) = self.status.begin(
            now,
            asker,
            Duration::from_millis(u64::from(budget_ms)),
            all,
            view,
            &children,
            wall,
        );
        if let Some(g) = evicted {
            log::debug!("rank {}: status table full; answering the oldest", self.me);
            self.answer_gather(now, g);
        }
        let query = Msg::Query(Query {
            id,
            budget_ms: child_budget_ms(budget_ms),
            all,
            epoch: self.epoch,
            failed: self.failed_count(),
            sent_ns: wall,
        })
        .encode();
        for c in children {
            self.send(c, TAG_STATUS, query.clone(), None);
        }
        self.answer_due(now);
    }

    fn failed_count(&self) -> u32 {
        u32::try_from(self.routing.failed_count()).unwrap_or(u32::MAX)
    }

    /// Answers the gathers that are complete or past their deadline.
    pub(super) fn answer_due(&mut self, now: Instant) {
        for g in self.status.take_due(now) {
            self.answer_gather(now, g);
        }
    }

    /// Children that failed are no longer waited for; children the repair gave this daemon
    /// are asked, with what is left of the budget. A child adopted by this repair is asked
    /// right after its adoption notice, which goes with the collectives' `Sync` later in this
    /// turn: asked before it, the child answers under its old view of the tree, without the
    /// children it gets itself by the same repair (an heir promoted into a dead daemon's slot:
    /// regression seed 64144).
    pub(super) fn status_after_repair(&mut self, now: Instant, dead: &[Rank], adopted: &[Rank]) {
        if self.status.is_empty() {
            return;
        }
        self.status.forget(dead);
        let children = self.routing.children().to_vec();
        let wall = self.wall_at(now);
        for (id, all, left, new) in self.status.adopt(now, &children, wall) {
            let left_ms = u32::try_from(left.as_millis()).unwrap_or(u32::MAX);
            let query = Msg::Query(Query {
                id,
                budget_ms: child_budget_ms(left_ms),
                all,
                epoch: self.epoch,
                failed: self.failed_count(),
                sent_ns: wall,
            })
            .encode();
            for c in new {
                if adopted.contains(&c) {
                    self.status_asks_held.push((c, query.clone()));
                } else {
                    self.send(c, TAG_STATUS, query.clone(), None);
                }
            }
        }
        self.answer_due(now);
    }

    /// Child `c` was just sent its adoption notice: the queries held for it follow.
    pub(super) fn status_ask_after_notice(&mut self, c: Rank) {
        if self.status_asks_held.is_empty() {
            return;
        }
        let (now_due, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.status_asks_held)
            .into_iter()
            .partition(|(r, _)| *r == c);
        self.status_asks_held = rest;
        for (r, q) in now_due {
            self.send(r, TAG_STATUS, q, None);
        }
    }

    /// After the collectives' output of a turn: queries still held (no notice went to their
    /// child this turn, e.g. its `Sync` waits) go now rather than never. At most one per
    /// adopted child and gather in progress, so the list is as bounded as those.
    pub(super) fn status_send_held_asks(&mut self) {
        for (r, q) in std::mem::take(&mut self.status_asks_held) {
            if !self.routing.is_failed(r) {
                self.send(r, TAG_STATUS, q, None);
            }
        }
    }

    /// The daemon stops: its local gathers end with what they have.
    pub(super) fn status_stop(&mut self, now: Instant) {
        for g in self.status.take_all() {
            if matches!(g.asker, Asker::Local { .. }) {
                self.answer_gather(now, g);
            }
        }
    }

    fn answer_gather(&mut self, now: Instant, g: Gather) {
        let held = now.saturating_duration_since(g.arrived);
        let asker = g.asker;
        log::debug!(
            "rank {}: answering status query of {asker:?} after {} us (complete: {})",
            self.me,
            held.as_micros(),
            g.is_complete()
        );
        let max_bytes = STATUS_ANSWER_BYTES_MAX.min(self.msg_max_bytes.saturating_sub(1024));
        let own = self.own_status(now);
        let received_ns = g.received_ns;
        let (parts, truncated) = g.finish(own, max_bytes);
        match asker {
            Asker::Daemon { rank, id } => {
                let answer = Msg::Answer(Answer {
                    id,
                    held_us: u32::try_from(held.as_micros()).unwrap_or(u32::MAX - 1),
                    received_ns,
                    answered_ns: self.wall_at(now),
                    truncated,
                    parts,
                })
                .encode();
                if self.is_neighbour(rank) || self.routing.is_failed(rank) {
                    self.send(rank, TAG_STATUS, answer, None);
                } else {
                    // The asker adopted this daemon and asked before its adoption notice
                    // came (the notice goes with the collectives' `Sync`, after the repair's
                    // queries): by the tree the answer would go to the old parent, which may
                    // be dead. It goes back over the link the query came on (seed 12395).
                    let header = self.header(Kind::Msg, self.me, rank, TAG_STATUS, answer.len());
                    self.transmit(rank, header, answer, None);
                }
            }
            Asker::Local { token } => {
                let failed: Vec<Rank> = self.routing.failed().collect();
                let departed = failed
                    .iter()
                    .copied()
                    .filter(|r| self.departed.contains(r))
                    .collect();
                let absent = failed
                    .iter()
                    .copied()
                    .filter(|r| self.never_joined(*r))
                    .collect();
                let report = Report {
                    from: self.me,
                    size: self.size,
                    radix: self.routing.radix(),
                    epoch: self.epoch,
                    failed,
                    departed,
                    absent,
                    elapsed_us: u64::try_from(held.as_micros()).unwrap_or(u64::MAX),
                    truncated,
                    parts,
                };
                self.out.push_back(Output::Status {
                    token,
                    report: Box::new(report),
                });
            }
        }
    }

    /// This daemon's own entry.
    fn own_status(&self, now: Instant) -> DaemonStatus {
        let c = self.counters();
        let mut problems = 0;
        if self.flow.any_congested() {
            problems |= problem::CONGESTED;
        }
        if self.stopping.is_some() {
            problems |= problem::STOPPING;
        }
        if c.relm_pending > 0 {
            problems |= problem::RELM_BACKLOG;
        }
        let children = self.routing.children().to_vec();
        let links = children
            .iter()
            .copied()
            .chain(self.routing.parent())
            .map(|peer| LinkStatus {
                peer,
                rtt_us: None,
                queued_bytes: self.flow.level(peer) as u64,
                address: self.link_paths.get(&peer).and_then(|p| p.0),
                failovers: self.link_paths.get(&peer).map_or(0, |p| p.1),
            })
            .collect();
        DaemonStatus {
            rank: self.me,
            incarnation: self.incarnation,
            epoch: self.epoch,
            parent: self.routing.parent(),
            children,
            depth: self.routing.depth(),
            uptime_ms: self
                .started
                .map_or(0, |s| now.saturating_duration_since(s).as_millis() as u64),
            failed_known: self.failed_count(),
            problems,
            links,
            counters: StatusCounters {
                sent: c.sent,
                delivered: c.delivered,
                relayed: c.relayed,
                stream_bytes_sent: c.streams.bytes_sent,
                stream_bytes_received: c.streams.bytes_received,
                relm_unacked: c.relm_unacked,
                relm_cached: c.relm_cached,
                relm_pending: c.relm_pending,
                streams_producing: c.streams.producing,
                streams_consuming: c.streams.consuming,
                direct_links: c.direct.links_open,
                protocol_errors: c.protocol_errors,
                repairs: c.repairs,
            },
            clock_offset_ns: None,
            clock_bound_ns: None,
        }
    }

    /// The driver tells the node its wall clock: `wall_ns` (ns since the Unix epoch) at
    /// `now`. Call it at start and at least once a second (the node extrapolates by `now`),
    /// and again right before handing over a status frame, with both read then: a clock
    /// sample's receipt must be timestamped no earlier than the frame arrived. Without it the
    /// node reports no clock offsets.
    pub fn handle_wall_clock(&mut self, now: Instant, wall_ns: i64) {
        self.wall = Some((now, wall_ns));
    }

    /// The wall clock at `now`, from the last reading: a `now` before the reading gives the
    /// reading itself (never earlier than it), a later one adds the monotonic time since.
    fn wall_at(&self, now: Instant) -> Option<i64> {
        let (at, wall) = self.wall?;
        let since = i64::try_from(now.saturating_duration_since(at).as_nanos()).unwrap_or(i64::MAX);
        Some(wall.saturating_add(since))
    }
}
