//! Group collectives from the application's side (issue "Jobs"): [`Group`], a job's daemons
//! with the job's own sequence of collectives, and the `Handle::group_*` calls. The protocol is
//! `grpcomm::group`.
use super::caddy::{AllgatherCompletion, Caddy};
use super::handle::{Handle, lock, wait_result};
use crate::Rank;
use crate::error::{Limit, SendError};
use crate::grpcomm::{AllgatherResult, GroupError, GroupId, GroupOp};
use crate::limits::{ALLGATHER_MAX_BYTES, GROUP_INFLIGHT_MAX};
use bytes::Bytes;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A group of daemons (the daemons one job runs on) for group collectives: allgather, barrier
/// and broadcast among its members only, run by the part of the tree that holds members.
///
/// A group is named by a *context* the embedder chooses (the job's number) and its member
/// ranks. Each member makes its own `Group` with the same context and members; the group then
/// numbers its collectives 0, 1, 2, ... in the order they are called, so members never agree
/// on collective ids. What the caller must do:
/// - every living member calls the group's collectives in the same order (as in MPI), one
///   call per collective, and the same kind (allgather, barrier or broadcast with one root);
/// - never reuse a context for the same members once a group has been used (a job's number is
///   never reused); a second `Group` with the same context and members on one daemon is the
///   same group, and its calls fail with `DuplicateId`;
/// - share one `Group` value (clones share the sequence) between the threads that call it, and
///   order their calls.
///
/// A call refused at once (an `Err` returned by the call itself) takes no number, so offering
/// it again keeps the members in step; once accepted, its outcome goes to `done`. Members that
/// die are excluded, as for [`Handle::allgather`]; any number of groups, overlapping or not,
/// run at once, each isolated from the others.
#[derive(Debug, Clone)]
pub struct Group {
    id: GroupId,
    next: Arc<Mutex<u64>>,
}

impl Group {
    /// The group of `members` (any order; duplicates ignored) under `context`. Fails with
    /// [`GroupError::Empty`] or [`GroupError::TooManyMembers`]. Whether the ranks exist is
    /// checked when the group is used.
    pub fn new(context: u64, members: impl IntoIterator<Item = Rank>) -> Result<Self, GroupError> {
        Ok(Group {
            id: GroupId::new(context, members)?,
            next: Arc::new(Mutex::new(0)),
        })
    }

    /// The context number.
    pub fn context(&self) -> u64 {
        self.id.context()
    }

    /// The members, ascending.
    pub fn members(&self) -> &[Rank] {
        self.id.members()
    }

    /// Whether `rank` is a member.
    pub fn contains(&self, rank: Rank) -> bool {
        self.id.contains(rank)
    }

    /// The number the group's next collective will take (collectives accepted so far).
    pub fn next_seq(&self) -> u64 {
        *lock(&self.next)
    }
}

impl Handle {
    /// Contributes `contribution` to the group's next allgather, without waiting. `done` runs
    /// once on the loop thread with the result: every member's contribution by rank, the
    /// members that died before theirs reached the tree as excluded, and `id` set to the
    /// collective's number in the group; every member gets the same result. If the gathered
    /// bytes exceed `limits::ALLGATHER_MAX_BYTES` (or a frame), the result has `overflowed` set.
    ///
    /// Returned at once, taking no number (`done` is not called): `NotMember` (this daemon),
    /// `RankOutOfRange` (a member not in the DVM), `TooLarge`, `Busy(GroupCollectivesInFlight)`
    /// (`limits::GROUP_INFLIGHT_MAX` called and not ended here: offer it again after one
    /// ends), `Busy(PrewireQueue)`, `Busy(CommandChannel)` from a callback, `ShutDown`. Passed
    /// to `done`: `DuplicateId` (another `Group` value for the same group ran this number
    /// here), `ResultLost` (see [`SendError::ResultLost`]), `ShutDown`.
    pub fn group_allgather(
        &self,
        group: &Group,
        contribution: impl Into<Bytes>,
        done: impl FnOnce(Result<AllgatherResult, SendError>) + Send + 'static,
    ) -> Result<(), SendError> {
        self.group_submit(group, contribution.into(), Box::new(done))
    }

    /// [`Handle::group_allgather`], blocking until the result arrived or `timeout` passed
    /// (`TimedOut`: the contribution stands and the collective goes on). From a callback it
    /// returns `Busy(LoopThread)` at once and contributes nothing.
    pub fn group_allgather_wait(
        &self,
        group: &Group,
        contribution: impl Into<Bytes>,
        timeout: Duration,
    ) -> Result<AllgatherResult, SendError> {
        self.not_on_loop_thread()?;
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.group_allgather(group, contribution, move |r| {
            let _ = tx.send(r);
        })?;
        wait_result(&rx, timeout)
    }

    /// The group's next collective as a barrier: `done` runs once every living member entered
    /// it (the result names the excluded members). Errors as [`Handle::group_allgather`].
    pub fn group_barrier(
        &self,
        group: &Group,
        done: impl FnOnce(Result<AllgatherResult, SendError>) + Send + 'static,
    ) -> Result<(), SendError> {
        self.group_allgather(group, Bytes::new(), done)
    }

    /// [`Handle::group_barrier`], blocking (see [`Handle::group_allgather_wait`]).
    pub fn group_barrier_wait(
        &self,
        group: &Group,
        timeout: Duration,
    ) -> Result<AllgatherResult, SendError> {
        self.group_allgather_wait(group, Bytes::new(), timeout)
    }

    /// The group's next collective as a broadcast from member `root`: every living member
    /// calls it with the same root; the root's `payload` goes to every member (the others'
    /// payloads are not sent), and `done` runs with it. A root that dies before its payload
    /// reached the tree ends the broadcast with `NodeDown(root)` at every member. `root` must be
    /// a member (`NotMember(root)`, returned at once); other errors as
    /// [`Handle::group_allgather`].
    pub fn group_broadcast(
        &self,
        group: &Group,
        root: Rank,
        payload: impl Into<Bytes>,
        done: impl FnOnce(Result<Bytes, SendError>) + Send + 'static,
    ) -> Result<(), SendError> {
        if !group.contains(root) {
            return Err(SendError::NotMember(root));
        }
        let data = if self.rank() == root {
            payload.into()
        } else {
            Bytes::new()
        };
        self.group_allgather(group, data, move |r| {
            done(r.and_then(|result| result.get(root).cloned().ok_or(SendError::NodeDown(root))))
        })
    }

    /// [`Handle::group_broadcast`], blocking until the root's payload arrived or `timeout`
    /// passed (see [`Handle::group_allgather_wait`]).
    pub fn group_broadcast_wait(
        &self,
        group: &Group,
        root: Rank,
        payload: impl Into<Bytes>,
        timeout: Duration,
    ) -> Result<Bytes, SendError> {
        self.not_on_loop_thread()?;
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.group_broadcast(group, root, payload, move |r| {
            let _ = tx.send(r);
        })?;
        match rx.recv_timeout(timeout) {
            Ok(r) => r,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => Err(SendError::TimedOut),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(SendError::ShutDown),
        }
    }

    /// Checks the call, admits it under `GROUP_INFLIGHT_MAX`, and only once the loop has it
    /// gives it the group's next number.
    fn group_submit(
        &self,
        group: &Group,
        data: Bytes,
        done: AllgatherCompletion,
    ) -> Result<(), SendError> {
        let shared = &self.shared;
        let top = group.id.max_rank();
        if top >= shared.size {
            return Err(SendError::RankOutOfRange {
                rank: top,
                size: shared.size,
            });
        }
        if !group.contains(shared.rank) {
            return Err(SendError::NotMember(shared.rank));
        }
        let max = ALLGATHER_MAX_BYTES - 8;
        if data.len() > max {
            return Err(SendError::TooLarge {
                len: data.len(),
                max,
            });
        }
        if shared.group_inflight.fetch_add(1, Ordering::AcqRel) >= GROUP_INFLIGHT_MAX {
            shared.group_inflight.fetch_sub(1, Ordering::AcqRel);
            return Err(SendError::Busy(Limit::GroupCollectivesInFlight));
        }
        if let Err(e) = shared.take_prewire(1) {
            shared.group_inflight.fetch_sub(1, Ordering::AcqRel);
            return Err(e);
        }
        let owner = Arc::clone(shared);
        let done: AllgatherCompletion = Box::new(move |r| {
            owner.group_inflight.fetch_sub(1, Ordering::AcqRel);
            done(r)
        });
        // The number is taken under the group's lock and kept only if the loop took the call.
        let mut next = lock(&group.next);
        let op = GroupOp {
            group: group.id.clone(),
            seq: *next,
        };
        match shared.submit_or_return(Caddy::Group { op, data, done }) {
            Ok(()) => {
                *next += 1;
                Ok(())
            }
            Err((e, _)) => {
                shared.untake_prewire(1);
                shared.group_inflight.fetch_sub(1, Ordering::AcqRel);
                Err(e)
            }
        }
    }
}
