//! The data exchange from the application's side (issue "Jobs"): `Handle::put`, `commit`,
//! `fence`, `get` and `forget_group`. The protocol is `modex` (the core) and `node/modex.rs`.
use super::caddy::{AllgatherCompletion, Caddy};
use super::group::Group;
use super::handle::{Handle, lock};
use crate::Rank;
use crate::error::{Limit, SendError};
use crate::limits::{ALLGATHER_MAX_BYTES, MODEX_GROUPS_MAX, MODEX_KEY_MAX};
use crate::modex::GetError;
use crate::node::FenceMode;
use bytes::Bytes;
use std::time::Duration;

impl Handle {
    /// Stages `value` under `key` for `group` (this daemon's data for the job; a later put of
    /// the same key replaces it). Nothing leaves the daemon until [`Handle::commit`].
    ///
    /// Errors, nothing staged: `RankOutOfRange` (a member not in the DVM), `NotMember` (this
    /// daemon), `ShutDown` (the daemon stopped), `TooLarge` (a key above
    /// `limits::MODEX_KEY_MAX` bytes, or the group's data above what a fence can gather,
    /// `ALLGATHER_MAX_BYTES` less 13), `Busy(ModexGroups)` (`limits::MODEX_GROUPS_MAX` groups
    /// with data here: [`Handle::forget_group`] one).
    pub fn put(&self, group: &Group, key: &str, value: impl Into<Bytes>) -> Result<(), SendError> {
        let shared = &self.shared;
        // Misuse is told first, as by every call; then the stop.
        self.members_in_dvm(group)?;
        if !group.contains(shared.rank) {
            return Err(SendError::NotMember(shared.rank));
        }
        if shared.is_stopped() {
            return Err(SendError::ShutDown);
        }
        if key.len() > MODEX_KEY_MAX {
            return Err(SendError::TooLarge {
                len: key.len(),
                max: MODEX_KEY_MAX,
            });
        }
        let value = value.into();
        let mut staged = lock(&shared.modex_staged);
        if !staged.contains_key(group.id()) && staged.len() >= MODEX_GROUPS_MAX {
            return Err(SendError::Busy(Limit::ModexGroups));
        }
        let entries = staged.entry(group.id().clone()).or_default();
        let after = entries.len_with(key, value.len());
        // What a full fence can gather of one member (the entry's 8 bytes and the call's tag).
        let max = ALLGATHER_MAX_BYTES - 8 - crate::node::GROUP_CALL_LEN;
        if after > max {
            if entries.is_empty() {
                staged.remove(group.id());
            }
            return Err(SendError::TooLarge { len: after, max });
        }
        entries.insert(key.to_string(), value);
        Ok(())
    }

    /// Commits everything put for `group` so far: other members can now get it (a
    /// direct-mode `get` fetches what is committed when its request arrives), and a full
    /// fence gathers it. Commit before entering the fence. Errors: `RankOutOfRange` (a member
    /// not in the DVM), `NotMember`, `ShutDown`, `Busy(ModexGroups)` (as for `put`),
    /// `Busy(CommandChannel)` from a callback.
    pub fn commit(&self, group: &Group) -> Result<(), SendError> {
        let shared = &self.shared;
        self.members_in_dvm(group)?;
        if !group.contains(shared.rank) {
            return Err(SendError::NotMember(shared.rank));
        }
        let blob = {
            let mut staged = lock(&shared.modex_staged);
            if !staged.contains_key(group.id()) && staged.len() >= MODEX_GROUPS_MAX {
                return Err(SendError::Busy(Limit::ModexGroups));
            }
            staged.entry(group.id().clone()).or_default().encode()
        };
        shared.submit(Caddy::ModexCommit {
            group: group.id().clone(),
            blob,
        })
    }

    /// The job of `group` is over on this daemon: its puts, its committed data and what it
    /// cached of the others' are dropped, and its slot of `limits::MODEX_GROUPS_MAX` is free.
    /// A get for this daemon's data then finds nothing (`NotFound`, here and at the other
    /// members that fetch it); a get here for another member's data fetches it again from that
    /// member, which answers until it forgets the group too. The group's collective numbers
    /// are not reset: a new [`Group`] value for the same context starts again at 0 and is
    /// refused `DuplicateId` (end a job's groups with a fresh context instead). A daemon that
    /// is not a member has nothing to forget: `Ok`. Errors: `ShutDown`, `Busy(CommandChannel)`
    /// from a callback.
    pub fn forget_group(&self, group: &Group) -> Result<(), SendError> {
        lock(&self.shared.modex_staged).remove(group.id());
        self.shared.submit(Caddy::ModexForget {
            group: group.id().clone(),
        })
    }

    /// The group's next collective as a fence of the data exchange: `done` runs with the
    /// members excluded (dead before they entered it) once every living member entered it. In
    /// [`FenceMode::Full`] every member's committed data comes to every member during the fence
    /// (later gets are answered here); in [`FenceMode::Direct`] the fence only synchronises and
    /// a get fetches the owner's data on first use. A full fence whose members' data together
    /// pass what an allgather gathers (`limits::ALLGATHER_MAX_BYTES`; each `put` keeps one
    /// member's data under it, not the sum) still ends `Ok` and synchronises, but gathers
    /// nothing: it acts as a direct one, and later gets fetch (`modex_fetches` counts them). Like every group collective it takes the
    /// group's next number (every member fences in the same order as its other collectives);
    /// errors as [`Handle::group_allgather`].
    pub fn fence(
        &self,
        group: &Group,
        mode: FenceMode,
        done: impl FnOnce(Result<Vec<Rank>, SendError>) + Send + 'static,
    ) -> Result<(), SendError> {
        let done: AllgatherCompletion = Box::new(move |r| done(r.map(|res| res.excluded)));
        self.group_submit(group, Err(mode), done)
    }

    /// [`Handle::fence`], blocking until it ended or `timeout` passed (`TimedOut`: the fence
    /// goes on). From a callback: `Busy(LoopThread)` at once.
    pub fn fence_wait(
        &self,
        group: &Group,
        mode: FenceMode,
        timeout: Duration,
    ) -> Result<Vec<Rank>, SendError> {
        self.not_on_loop_thread()?;
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.fence(group, mode, move |r| {
            let _ = tx.send(r);
        })?;
        match rx.recv_timeout(timeout) {
            Ok(r) => r,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => Err(SendError::TimedOut),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(SendError::ShutDown),
        }
    }

    /// The value member `rank` committed under `key` for `group`, to `done` on the loop thread:
    /// from this daemon's cache (a full fence's, or an earlier fetch's), from its own committed
    /// data, or fetched from `rank` (all of its data for the group at once, then cached:
    /// `limits::MODEX_CACHE_MAX` blobs, least recently used out first). Call it after the
    /// fence that followed the owner's commit.
    ///
    /// Answers: the value (a slice of the blob: no copy), [`GetError::NotFound`] (never put, or
    /// not committed), [`GetError::NodeDown`] (the owner is dead or dies before answering;
    /// never a hang), [`GetError::NotMember`], [`GetError::RankOutOfRange`] (`rank`, or a
    /// member of the group, not in the DVM), [`GetError::KeyTooLong`] (where `put` says
    /// `TooLarge` of the same key), [`GetError::Busy`]
    /// (`limits::MODEX_FETCHES_MAX` fetches in flight), [`GetError::ShutDown`].
    pub fn get(
        &self,
        group: &Group,
        rank: Rank,
        key: &str,
        done: impl FnOnce(Result<Bytes, GetError>) + Send + 'static,
    ) -> Result<(), GetError> {
        if key.len() > MODEX_KEY_MAX {
            return Err(GetError::KeyTooLong(key.len()));
        }
        let size = self.shared.size;
        if rank >= size {
            return Err(GetError::RankOutOfRange { rank, size });
        }
        if let Err(SendError::RankOutOfRange { rank, size }) = self.members_in_dvm(group) {
            return Err(GetError::RankOutOfRange { rank, size });
        }
        if !group.contains(rank) {
            return Err(GetError::NotMember(rank));
        }
        self.shared
            .submit(Caddy::Get {
                group: group.id().clone(),
                rank,
                key: key.to_string(),
                done: Box::new(done),
            })
            .map_err(|e| match e {
                SendError::Busy(_) => GetError::Busy,
                _ => GetError::ShutDown,
            })
    }

    /// [`Handle::get`], blocking until answered or `timeout` passed (`TimedOut`). From a
    /// callback it answers `Busy` at once.
    pub fn get_wait(
        &self,
        group: &Group,
        rank: Rank,
        key: &str,
        timeout: Duration,
    ) -> Result<Bytes, GetError> {
        if self.not_on_loop_thread().is_err() {
            return Err(GetError::Busy);
        }
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.get(group, rank, key, move |r| {
            let _ = tx.send(r);
        })?;
        match rx.recv_timeout(timeout) {
            Ok(r) => r,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => Err(GetError::TimedOut),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(GetError::ShutDown),
        }
    }
}
