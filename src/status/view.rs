//! A report read against the tree: the state of every rank it covers. The tree is a pure
//! function of (radix, size, failed set) (`routed::tree_view`), so a healthy subtree reported
//! as one part is expanded here, and the ranks under a daemon that did not answer are known.

use super::{Part, Report};
use crate::Rank;
use crate::routed::{NodeView, TreeError, tree_view};

/// What a report says of one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
#[non_exhaustive]
pub enum RankState {
    /// It answered, in detail.
    Alive,
    /// It answered as part of a healthy (or elided) subtree.
    Healthy,
    /// The DVM declared it failed.
    Dead,
    /// Its parent asked it and it did not answer within the budget: stuck, stopped
    /// (SIGSTOP), overloaded, or dying before the heartbeats say so (suspected).
    NoAnswer,
    /// Below a daemon that did not answer: not known.
    Unknown,
    /// Alive in the tree, but no answer covers it (a view that changed during the query).
    Unreached,
    /// It left the DVM in order (`Handle::leave`): out of the tree, not a fault.
    Departed,
    /// Room to grow that has not joined yet (a DVM started with `initial_size` below its
    /// size): out of the tree, not a fault.
    Absent,
}

impl RankState {
    /// The state's name as `tbon status` prints it (`alive`, `no-answer`, ...).
    pub fn name(self) -> &'static str {
        match self {
            RankState::Alive => "alive",
            RankState::Healthy => "healthy",
            RankState::Dead => "dead",
            RankState::NoAnswer => "no-answer",
            RankState::Unknown => "unknown",
            RankState::Unreached => "unreached",
            RankState::Departed => "departed",
            RankState::Absent => "absent",
        }
    }
}

/// One rank of the view.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RankView {
    /// The rank.
    pub rank: Rank,
    /// What the report says of it.
    pub state: RankState,
    /// Its place in the repaired tree (`None` for the root and the dead).
    pub parent: Option<Rank>,
    /// Its children in the repaired tree.
    pub children: Vec<Rank>,
    /// Its depth in the repaired tree (rank 0: 0).
    pub depth: u32,
}

/// Every rank a report covers: the gathering daemon's subtree and the failed ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct View {
    /// Ascending by rank.
    pub ranks: Vec<RankView>,
    /// A healthy part's count differed from its subtree in the tree computed here (the
    /// daemons' view of the failed set changed during the query).
    pub views_differ: bool,
}

impl View {
    /// How many ranks are in `state`.
    pub fn count(&self, state: RankState) -> usize {
        self.ranks.iter().filter(|r| r.state == state).count()
    }

    /// The ranks in `state`, ascending.
    pub fn ranks_in(&self, state: RankState) -> Vec<Rank> {
        self.ranks
            .iter()
            .filter(|r| r.state == state)
            .map(|r| r.rank)
            .collect()
    }

    /// Whether every covered rank that is in the tree answered (the dead, the departed and
    /// the absent are not asked).
    pub fn all_answered(&self) -> bool {
        self.ranks.iter().all(|r| {
            matches!(
                r.state,
                RankState::Alive
                    | RankState::Healthy
                    | RankState::Dead
                    | RankState::Departed
                    | RankState::Absent
            )
        })
    }

    /// Whether every covered rank in the tree answered and none is dead: the departed and the
    /// absent are no fault (`tbon status` exits 0).
    pub fn healthy(&self) -> bool {
        self.all_answered() && self.count(RankState::Dead) == 0
    }
}

/// The JSON form of a report and its view (`tbon status --format json`, `tbon_status_json`):
/// the lists of ranks by state, the report itself, and every covered rank's state and place.
#[derive(Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Json<'a> {
    /// Daemons that answered.
    pub answered: usize,
    /// Ranks known dead.
    pub dead: Vec<Rank>,
    /// Ranks that left in order.
    pub departed: Vec<Rank>,
    /// Ranks of the room to grow that have not joined.
    pub absent: Vec<Rank>,
    /// Ranks that did not answer within the budget.
    pub no_answer: Vec<Rank>,
    /// Ranks under a silent daemon: not known.
    pub unknown: Vec<Rank>,
    /// Ranks alive in the tree that no answer covered.
    pub unreached: Vec<Rank>,
    /// Whether the daemons' views of the tree differed (a repair was spreading).
    pub views_differ: bool,
    /// The report itself.
    pub report: &'a Report,
    /// Every covered rank's state and place.
    pub ranks: Vec<JsonRank>,
}

/// One rank in [`Json`].
#[derive(Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct JsonRank {
    /// The rank.
    pub rank: Rank,
    /// Its state's name ([`RankState::name`]).
    pub state: &'static str,
    /// Its parent in the repaired tree.
    pub parent: Option<Rank>,
    /// Its depth in the repaired tree.
    pub depth: u32,
}

impl<'a> Json<'a> {
    /// The JSON form of `report` read as `v`.
    pub fn new(report: &'a Report, v: &View) -> Json<'a> {
        Json {
            answered: v.count(RankState::Alive) + v.count(RankState::Healthy),
            dead: v.ranks_in(RankState::Dead),
            departed: v.ranks_in(RankState::Departed),
            absent: v.ranks_in(RankState::Absent),
            no_answer: v.ranks_in(RankState::NoAnswer),
            unknown: v.ranks_in(RankState::Unknown),
            unreached: v.ranks_in(RankState::Unreached),
            views_differ: v.views_differ,
            report,
            ranks: v
                .ranks
                .iter()
                .map(|r| JsonRank {
                    rank: r.rank,
                    state: r.state.name(),
                    parent: r.parent,
                    depth: r.depth,
                })
                .collect(),
        }
    }
}

/// Reads `report` against the tree of its radix, size and failed set. Errors only for a
/// report whose shape is impossible (a radix below 2, a failed rank 0, ranks beyond the size).
pub fn view(report: &Report) -> Result<View, TreeError> {
    let tree = tree_view(report.radix, report.size, &report.failed)?;
    let size = report.size as usize;
    let mut index: Vec<Option<usize>> = vec![None; size];
    for (i, n) in tree.iter().enumerate() {
        if let Some(slot) = index.get_mut(n.rank as usize) {
            *slot = Some(i);
        }
    }
    let node = |r: Rank| {
        index
            .get(r as usize)
            .copied()
            .flatten()
            .and_then(|i| tree.get(i))
    };
    // The gathering daemon's subtree, pre-order.
    let covered = subtree(&tree, &index, report.from);
    let mut state: Vec<Option<RankState>> = vec![None; size];
    for r in &covered {
        if let Some(s) = state.get_mut(*r as usize) {
            *s = Some(RankState::Unreached);
        }
    }
    for f in &report.failed {
        if let Some(s) = state.get_mut(*f as usize) {
            *s = Some(RankState::Dead);
        }
    }
    for (list, to) in [
        (&report.departed, RankState::Departed),
        (&report.absent, RankState::Absent),
    ] {
        for f in list {
            if let Some(s @ Some(RankState::Dead)) = state.get_mut(*f as usize) {
                *s = Some(to);
            }
        }
    }
    let mut views_differ = false;
    let set = |r: Rank, to: RankState, state: &mut Vec<Option<RankState>>| {
        if let Some(s @ Some(RankState::Unreached)) = state.get_mut(r as usize) {
            *s = Some(to);
            true
        } else {
            false
        }
    };
    for part in &report.parts {
        match part {
            Part::Daemon(d) => {
                set(d.rank, RankState::Alive, &mut state);
            }
            Part::Healthy(super::Healthy { root, daemons, .. })
            | Part::Elided { root, daemons } => {
                let members = subtree(&tree, &index, *root);
                views_differ |= members.len() != *daemons as usize;
                for m in members {
                    set(m, RankState::Healthy, &mut state);
                }
            }
            Part::NoAnswer { rank, .. } => {
                set(*rank, RankState::NoAnswer, &mut state);
                for m in subtree(&tree, &index, *rank).into_iter().skip(1) {
                    set(m, RankState::Unknown, &mut state);
                }
            }
        }
    }
    let ranks = state
        .iter()
        .enumerate()
        .filter_map(|(r, s)| {
            let s = (*s)?;
            let rank = r as Rank;
            let n = node(rank);
            Some(RankView {
                rank,
                state: s,
                parent: n.and_then(|n| n.parent),
                children: n.map(|n| n.children.clone()).unwrap_or_default(),
                depth: n.map_or(0, |n| n.depth),
            })
        })
        .collect();
    Ok(View {
        ranks,
        views_differ,
    })
}

/// `root` and every rank below it in `tree`, pre-order (children ascending).
fn subtree(tree: &[NodeView], index: &[Option<usize>], root: Rank) -> Vec<Rank> {
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(r) = stack.pop() {
        let Some(n) = index
            .get(r as usize)
            .copied()
            .flatten()
            .and_then(|i| tree.get(i))
        else {
            continue;
        };
        out.push(r);
        stack.extend(n.children.iter().rev());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{Healthy, StatusCounters};

    fn healthy(root: Rank, daemons: u32) -> Part {
        Part::Healthy(Healthy {
            root,
            daemons,
            height: 0,
            uptime_ms_min: 0,
            rtt_us_max: None,
            counters: StatusCounters::default(),
        })
    }

    #[test]
    fn summaries_expand_and_silence_hides_a_subtree() {
        // radix 2, size 8, 5 failed: 0 -> 1, 2; 1 -> 3; 3 -> 7; 2 -> 4, 6 (`tbon tree`).
        let tree = tree_view(2, 8, &[5]).unwrap();
        let children_of = |r: Rank| tree.iter().find(|n| n.rank == r).unwrap().children.clone();
        let one = children_of(1);
        let silent = one[0];
        let report = Report {
            from: 0,
            size: 8,
            radix: 2,
            epoch: 1,
            failed: vec![5],
            departed: vec![],
            absent: vec![],
            elapsed_us: 1,
            truncated: false,
            parts: vec![
                Part::Daemon(Box::new(crate::status::DaemonStatus {
                    rank: 0,
                    incarnation: 1,
                    epoch: 1,
                    parent: None,
                    children: children_of(0),
                    depth: 0,
                    uptime_ms: 1,
                    failed_known: 1,
                    problems: crate::status::problem::CHILD_SILENT,
                    links: vec![],
                    counters: StatusCounters::default(),
                    clock_offset_ns: None,
                    clock_bound_ns: None,
                })),
                Part::Daemon(Box::new(crate::status::DaemonStatus {
                    rank: 1,
                    incarnation: 1,
                    epoch: 1,
                    parent: Some(0),
                    children: one.clone(),
                    depth: 1,
                    uptime_ms: 1,
                    failed_known: 1,
                    problems: crate::status::problem::CHILD_SILENT,
                    links: vec![],
                    counters: StatusCounters::default(),
                    clock_offset_ns: None,
                    clock_bound_ns: None,
                })),
                Part::NoAnswer {
                    rank: silent,
                    parent: 1,
                },
                healthy(2, subtree(&tree, &index_of(&tree), 2).len() as u32),
            ],
        };
        let v = view(&report).unwrap();
        assert_eq!(v.ranks.len(), 8);
        assert!(!v.views_differ);
        assert_eq!(v.ranks_in(RankState::Dead), vec![5]);
        assert_eq!(v.ranks_in(RankState::NoAnswer), vec![silent]);
        let below: Vec<Rank> = subtree(&tree, &index_of(&tree), silent)[1..].to_vec();
        let mut unknown = v.ranks_in(RankState::Unknown);
        unknown.sort_unstable();
        let mut want = below.clone();
        want.sort_unstable();
        assert_eq!(unknown, want);
        assert_eq!(v.count(RankState::Unreached), 0);
        assert!(!v.all_answered());
        assert_eq!(
            v.count(RankState::Alive) + v.count(RankState::Healthy),
            8 - 1 - 1 - below.len()
        );
    }

    fn index_of(tree: &[NodeView]) -> Vec<Option<usize>> {
        let mut index = vec![None; 8];
        for (i, n) in tree.iter().enumerate() {
            index[n.rank as usize] = Some(i);
        }
        index
    }
}
