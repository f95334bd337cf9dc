//! The `group` kind's applications: every member of the scenario's groups calls each of the
//! group's collectives at a random time (an allgather of `data(group, seq, rank)`; every second
//! one a barrier). Checker `group`: every result a member gets is the same as every other
//! member's, holds the right bytes, and names every member either as contributing or excluded;
//! no member gets one twice or another group's; by the end every living member that called a
//! collective has its result, and no daemon keeps group state.

use super::World;
use crate::Rank;
use crate::error::SendError;
use crate::grpcomm::{AllgatherResult, GroupId, GroupOp};
use crate::sim::check::Violation;
use bytes::Bytes;
use std::collections::{HashMap, HashSet};

/// What the group applications know.
#[derive(Debug, Default)]
pub(super) struct GroupApps {
    /// token -> (group, number, member).
    tokens: HashMap<u64, (usize, u64, Rank)>,
    /// (group, number) -> the result as first seen.
    results: HashMap<(usize, u64), AllgatherResult>,
    /// (member, group, number) called, and those that got their result.
    called: HashSet<(Rank, usize, u64)>,
    got: HashSet<(Rank, usize, u64)>,
    /// Results delivered.
    pub delivered: u64,
}

fn v(detail: String) -> Violation {
    Violation {
        checker: "group",
        detail,
    }
}

/// Member `rank`'s contribution to collective `seq` of group `group` (odd ones are barriers).
fn data(group: usize, seq: u64, rank: Rank) -> Bytes {
    if seq % 2 == 1 {
        return Bytes::new();
    }
    Bytes::from(format!("group {group} collective {seq} rank {rank}"))
}

impl World {
    /// The group's collective as the core names it.
    fn group_op(&self, group: usize, seq: u64) -> Option<GroupOp> {
        let (context, members, _) = self.scen.groups.get(group)?;
        let group = GroupId::new(*context, members.iter().copied()).ok()?;
        Some(GroupOp { group, seq })
    }

    /// Member `rank` calls collective `seq` of group `group`.
    pub(super) fn on_group_call(
        &mut self,
        group: usize,
        seq: u64,
        rank: Rank,
    ) -> Result<(), Violation> {
        if !self.living(rank) {
            return Ok(());
        }
        let Some(op) = self.group_op(group, seq) else {
            return Ok(());
        };
        let token = self.next_token;
        self.next_token += 1;
        let now = self.now();
        let Some(n) = self.nodes.get_mut(rank as usize) else {
            return Ok(());
        };
        match n.group_contribute(now, op, data(group, seq, rank), token) {
            Ok(()) => {
                self.groups.tokens.insert(token, (group, seq, rank));
                self.groups.called.insert((rank, group, seq));
            }
            // A daemon declared dead (it stops when it runs next) takes no new work.
            Err(SendError::ShutDown) if self.declared.contains(&rank) => {}
            Err(e) => {
                return Err(v(format!(
                    "rank {rank} could not call collective {seq} of group {group}: {e}"
                )));
            }
        }
        self.after(rank)
    }

    /// Group collectives ended at `r`: check each outcome.
    pub(super) fn group_outcomes(
        &mut self,
        r: Rank,
        done: Vec<(u64, Result<AllgatherResult, SendError>)>,
        stopping: bool,
    ) -> Result<(), Violation> {
        for (token, outcome) in done {
            let Some((group, seq, member)) = self.groups.tokens.remove(&token) else {
                return Err(v(format!("rank {r}: an outcome for unknown token {token}")));
            };
            if member != r {
                return Err(v(format!("rank {r} got member {member}'s outcome")));
            }
            let result = match outcome {
                Ok(result) => result,
                Err(SendError::ShutDown) if stopping => continue,
                Err(e) => {
                    return Err(v(format!(
                        "rank {r}: collective {seq} of group {group} failed: {e}"
                    )));
                }
            };
            self.group_result(r, group, seq, result)?;
        }
        Ok(())
    }

    fn group_result(
        &mut self,
        r: Rank,
        group: usize,
        seq: u64,
        result: AllgatherResult,
    ) -> Result<(), Violation> {
        self.groups.delivered += 1;
        if !self.groups.got.insert((r, group, seq)) {
            return Err(v(format!("rank {r}: collective {seq} of {group} twice")));
        }
        if let Some(first) = self.groups.results.get(&(group, seq)) {
            if *first != result {
                return Err(v(format!(
                    "rank {r}: collective {seq} of group {group} differs from another member's"
                )));
            }
            return Ok(());
        }
        let members = self
            .scen
            .groups
            .get(group)
            .map(|g| g.1.clone())
            .unwrap_or_default();
        if result.overflowed || result.id != seq {
            return Err(v(format!("collective {seq} of {group}: {result:?}")));
        }
        for (m, bytes) in &result.contributions {
            if *bytes != data(group, seq, *m) {
                return Err(v(format!(
                    "collective {seq} of group {group}: member {m}'s bytes are wrong"
                )));
            }
        }
        let mut all: Vec<Rank> = result
            .ranks()
            .chain(result.excluded.iter().copied())
            .collect();
        all.sort_unstable();
        if all != members {
            return Err(v(format!(
                "collective {seq} of group {group}: {all:?} are not the members {members:?}"
            )));
        }
        self.groups.results.insert((group, seq), result);
        Ok(())
    }

    /// After the run: every living member (not declared dead) that called a collective got its
    /// result, no result excludes a living member, and no living daemon keeps group state.
    pub(super) fn final_groups(&self) -> Result<(), Violation> {
        let counted = |r: Rank| self.living(r) && !self.declared.contains(&r);
        let mut called: Vec<_> = self.groups.called.iter().copied().collect();
        called.sort_unstable();
        for (r, group, seq) in called {
            if counted(r) && !self.groups.got.contains(&(r, group, seq)) {
                return Err(v(format!(
                    "rank {r} never got collective {seq} of group {group}"
                )));
            }
        }
        for ((group, seq), result) in &self.groups.results {
            if let Some(x) = result.excluded.iter().find(|x| counted(**x)) {
                return Err(v(format!(
                    "collective {seq} of group {group} excluded living member {x}"
                )));
            }
        }
        if let Some(n) = self
            .nodes
            .iter()
            .find(|n| counted(n.rank) && n.node.group_tracked() > 0)
        {
            return Err(v(format!(
                "rank {} keeps state for {} group collectives",
                n.rank,
                n.node.group_tracked()
            )));
        }
        Ok(())
    }
}
