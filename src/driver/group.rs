//! Group collectives from the application's side (issue "Jobs"): [`Group`], a job's daemons
//! with the job's own sequence of collectives, and the `Handle::group_*` calls. The protocol is
//! `grpcomm::group`.
use super::caddy::{AllgatherCompletion, Caddy};
use super::handle::{Handle, Shared, lock, wait_result};
use crate::Rank;
use crate::error::{Limit, SendError};
use crate::grpcomm::{AllgatherResult, GroupError, GroupId, GroupOp};
use crate::limits::{ALLGATHER_MAX_BYTES, GROUP_INFLIGHT_MAX};
use crate::node::{FenceMode, GROUP_CALL_LEN, GroupCall};
use bytes::Bytes;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError, Weak};
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
/// - share one `Group` value (clones share the sequences) between the threads that call it,
///   and order their calls. One value may serve several daemons of one process (an embedder's
///   test, [`crate::launch::local_dvm`]): each daemon numbers its own calls.
///
/// A call refused at once (an `Err` returned by the call itself) takes no number, so offering
/// it again keeps the members in step; once accepted, its outcome goes to `done`. What happens
/// when the rules are broken:
/// - members that call different collectives under one number (another kind, another
///   broadcast root, another fence mode) all end it with [`SendError::Mismatch`]; the group
///   stays usable for the next number;
/// - a `_wait` call that returned `TimedOut` has taken its number and goes on: never call it
///   again for the same collective (that would take the next number and put this member one
///   step ahead of the others), wait for the group to catch up instead;
/// - a second `Group` value for the same group on one daemon has its own numbering: its
///   first call is refused `DuplicateId` (number 0 is taken) and later ones wait for members
///   that will never call them; use clones of one value.
///
/// Members that die are excluded, as for [`Handle::allgather`]; any number of groups,
/// overlapping or not, run at once, each isolated from the others.
#[derive(Debug, Clone)]
pub struct Group {
    id: GroupId,
    /// Each daemon's next number, by daemon (a `Weak` keeps its address from being reused, so
    /// a later daemon never inherits a stopped one's count).
    next: Arc<Mutex<Sequences>>,
}

/// Each daemon's next number in one group.
type Sequences = Vec<(Weak<Shared>, u64)>;

/// Where a daemon's entry in a group's sequences is, made on first use (entries of dropped
/// daemons are removed then).
fn position(seqs: &mut Sequences, shared: &Arc<Shared>) -> usize {
    let mine = |w: &Weak<Shared>| std::ptr::eq(w.as_ptr(), Arc::as_ptr(shared));
    if let Some(at) = seqs.iter().position(|(w, _)| mine(w)) {
        return at;
    }
    seqs.retain(|(w, _)| w.strong_count() > 0);
    seqs.push((Arc::downgrade(shared), 0));
    seqs.len() - 1
}

/// The daemon's next number in a group.
fn next_of(seqs: &mut Sequences, shared: &Arc<Shared>) -> u64 {
    let at = position(seqs, shared);
    seqs.get(at).map_or(0, |(_, n)| *n)
}

/// The daemon's call took its number.
fn advance(seqs: &mut Sequences, shared: &Arc<Shared>) {
    let at = position(seqs, shared);
    if let Some((_, n)) = seqs.get_mut(at) {
        *n += 1;
    }
}

impl Group {
    /// The group of `members` (any order; duplicates ignored) under `context`. Fails with
    /// [`GroupError::Empty`] or [`GroupError::TooManyMembers`]. Whether the ranks exist is
    /// checked when the group is used.
    pub fn new(context: u64, members: impl IntoIterator<Item = Rank>) -> Result<Self, GroupError> {
        Ok(Group {
            id: GroupId::new(context, members)?,
            next: Arc::new(Mutex::new(Vec::new())),
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

    /// The group as the protocol names it.
    pub(crate) fn id(&self) -> &GroupId {
        &self.id
    }

    /// The number the group's next collective will take on the daemon of `handle` (the
    /// collectives it accepted so far). Blocks while another thread's call on this group waits
    /// for room in that daemon's command channel.
    pub fn next_seq(&self, handle: &Handle) -> u64 {
        next_of(&mut lock(&self.next), &handle.shared)
    }

    /// The sequences, locked; from a callback (the loop thread) only if free at once, since a
    /// thread holding them may be waiting for the loop.
    fn sequences(&self, shared: &Shared) -> Result<MutexGuard<'_, Sequences>, SendError> {
        if !shared.on_loop_thread() {
            return Ok(lock(&self.next));
        }
        match self.next.try_lock() {
            Ok(g) => Ok(g),
            Err(TryLockError::Poisoned(e)) => Ok(e.into_inner()),
            Err(TryLockError::WouldBlock) => Err(SendError::Busy(Limit::LoopThread)),
        }
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
    /// ends), `Busy(PrewireQueue)`, from a callback `Busy(CommandChannel)` or
    /// `Busy(LoopThread)` (another thread's call on this group holds its sequence), `ShutDown`. Passed
    /// to `done`: `DuplicateId` (another `Group` value for the same group ran this number
    /// here), `ResultLost` (see [`SendError::ResultLost`]), `ShutDown`.
    pub fn group_allgather(
        &self,
        group: &Group,
        contribution: impl Into<Bytes>,
        done: impl FnOnce(Result<AllgatherResult, SendError>) + Send + 'static,
    ) -> Result<(), SendError> {
        self.group_submit(
            group,
            Ok((contribution.into(), GroupCall::Allgather)),
            Box::new(done),
        )
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
        self.group_submit(
            group,
            Ok((Bytes::new(), GroupCall::Barrier)),
            Box::new(done),
        )
    }

    /// [`Handle::group_barrier`], blocking (see [`Handle::group_allgather_wait`]).
    pub fn group_barrier_wait(
        &self,
        group: &Group,
        timeout: Duration,
    ) -> Result<AllgatherResult, SendError> {
        self.not_on_loop_thread()?;
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.group_barrier(group, move |r| {
            let _ = tx.send(r);
        })?;
        wait_result(&rx, timeout)
    }

    /// The largest payload [`Handle::group_broadcast`] takes for `group`: what fits the
    /// gathered bytes' bound and a frame (`msg_max_bytes`) beside the group's own bookkeeping
    /// (32 bytes per member, 8 per run of consecutive members).
    pub fn group_broadcast_max(&self, group: &Group) -> usize {
        let overhead = 32 * group.members().len() + 8 * group.id.ranges().len() + 64;
        ALLGATHER_MAX_BYTES
            .min(self.shared.msg_max_bytes)
            .saturating_sub(overhead)
    }

    /// The group's next collective as a broadcast from member `root`: every living member
    /// calls it with the same root; the root's `payload` goes to every member (the others'
    /// payloads are not sent), and `done` runs with it. A root that dies before its payload
    /// reached the tree ends the broadcast with `NodeDown(root)` at every member. `root` must be
    /// a member (`NotMember(root)`), and the root's payload at most
    /// [`Handle::group_broadcast_max`] (`TooLarge`), both returned at once; other errors as
    /// [`Handle::group_allgather`].
    pub fn group_broadcast(
        &self,
        group: &Group,
        root: Rank,
        payload: impl Into<Bytes>,
        done: impl FnOnce(Result<Bytes, SendError>) + Send + 'static,
    ) -> Result<(), SendError> {
        let data = self.broadcast_part(group, root, payload)?;
        let max = self.group_broadcast_max(group);
        if data.len() > max {
            return Err(SendError::TooLarge {
                len: data.len(),
                max,
            });
        }
        let done: AllgatherCompletion = Box::new(move |r| {
            done(r.and_then(|result| {
                if result.overflowed {
                    // Only a root that bypassed the bound above could cause it.
                    return Err(SendError::TooLarge { len: 0, max });
                }
                result.get(root).cloned().ok_or(SendError::NodeDown(root))
            }))
        });
        self.group_submit(group, Ok((data, GroupCall::Broadcast(root))), done)
    }

    /// What this daemon brings to a broadcast from `root`: the payload at the root, nothing at
    /// the other members (their payloads are not sent); `NotMember(root)` if `root` is not a
    /// member.
    fn broadcast_part(
        &self,
        group: &Group,
        root: Rank,
        payload: impl Into<Bytes>,
    ) -> Result<Bytes, SendError> {
        if !group.contains(root) {
            return Err(SendError::NotMember(root));
        }
        Ok(if self.rank() == root {
            payload.into()
        } else {
            Bytes::new()
        })
    }

    /// [`Handle::group_broadcast`] for the C API: the root's payload is checked only against
    /// the gathered bytes' bound (as a contribution is), and `done` gets the gathered result,
    /// its `overflowed` set when the payload with the members' bookkeeping passed the bound,
    /// so that every member can report that apart from the root's death. The call is a
    /// broadcast from `root` all the same: members that called something else under its
    /// number end it with `Mismatch`.
    #[doc(hidden)]
    pub fn group_broadcast_gathered(
        &self,
        group: &Group,
        root: Rank,
        payload: impl Into<Bytes>,
        done: impl FnOnce(Result<AllgatherResult, SendError>) + Send + 'static,
    ) -> Result<(), SendError> {
        let data = self.broadcast_part(group, root, payload)?;
        self.group_submit(
            group,
            Ok((data, GroupCall::Broadcast(root))),
            Box::new(done),
        )
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
    /// `what`: the contribution of a collective and what it is, or the mode of a fence.
    /// `RankOutOfRange` if a member of `group` is not in the DVM (group collectives and the
    /// data exchange check it before anything is taken).
    pub(crate) fn members_in_dvm(&self, group: &Group) -> Result<(), SendError> {
        let (top, size) = (group.id.max_rank(), self.shared.size);
        if top >= size {
            return Err(SendError::RankOutOfRange { rank: top, size });
        }
        Ok(())
    }

    pub(crate) fn group_submit(
        &self,
        group: &Group,
        what: Result<(Bytes, GroupCall), FenceMode>,
        done: AllgatherCompletion,
    ) -> Result<(), SendError> {
        let shared = &self.shared;
        self.members_in_dvm(group)?;
        if !group.contains(shared.rank) {
            return Err(SendError::NotMember(shared.rank));
        }
        // The gathered bound less the entry's 8 bytes and the call's tag.
        let max = ALLGATHER_MAX_BYTES - 8 - GROUP_CALL_LEN;
        if let Ok((data, _)) = &what
            && data.len() > max
        {
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
        let mut seqs = match group.sequences(shared) {
            Ok(s) => s,
            Err(e) => {
                shared.untake_prewire(1);
                shared.group_inflight.fetch_sub(1, Ordering::AcqRel);
                return Err(e);
            }
        };
        let op = GroupOp {
            group: group.id.clone(),
            seq: next_of(&mut seqs, shared),
        };
        let caddy = match what {
            Ok((data, call)) => Caddy::Group {
                op,
                data,
                call,
                done,
            },
            Err(mode) => Caddy::Fence { op, mode, done },
        };
        match shared.submit_or_return(caddy) {
            Ok(()) => {
                advance(&mut seqs, shared);
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
