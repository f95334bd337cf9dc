//! The node's side of the data exchange (issue "Jobs"; the core is `src/modex/`): commits and
//! forgets from the driver, fences as group collectives whose full-mode result fills the cache,
//! gets answered as [`Output::GetDone`], fetches and replies over RELM (runtime tags 18 and
//! 19, sent only while RELM has room for the runtime's messages), fetches from the dead failed
//! at every repair, and what still waits failed with `ShutDown` when the daemon stops.
use super::{Node, Output};
use crate::Rank;
use crate::error::{Limit, SendError};
use crate::grpcomm::{AllgatherResult, GroupId};
use crate::modex::GetError;
use crate::rml::Message;
use bytes::Bytes;
use std::time::Instant;

/// How a fence gathers (see `Handle::fence`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FenceMode {
    /// Every member's committed data goes to every member during the fence: later gets are
    /// local.
    Full,
    /// The fence only synchronises; a get fetches the owner's committed data on first use.
    Direct,
}

impl Node {
    /// This daemon's committed data for `group` (the blob `modex::blob` describes), replacing
    /// what it committed before. `Busy(ModexGroups)` at `MODEX_GROUPS_MAX` groups.
    pub fn modex_commit(&mut self, group: GroupId, blob: Bytes) -> Result<(), SendError> {
        if self.modex.commit(group, blob) {
            Ok(())
        } else {
            Err(SendError::Busy(Limit::ModexGroups))
        }
    }

    /// The job of `group` is over here: its committed data and cached blobs are dropped.
    pub fn modex_forget(&mut self, group: &GroupId) {
        self.modex.forget(group);
    }

    /// The value of `key` that `rank` committed for `group`; the answer is
    /// [`Output::GetDone`] with `token` (at the next pump if it is known here).
    pub fn modex_get(&mut self, token: u64, group: &GroupId, rank: Rank, key: &str) {
        if self.stopping.is_some() {
            self.out.push_back(Output::GetDone {
                token,
                result: Err(GetError::ShutDown),
            });
            return;
        }
        let dead = self.routing.is_failed(rank);
        self.modex.get(token, group, rank, key, dead);
        self.drain_modex_answers();
    }

    /// The contribution a fence of `group` makes: the committed blob (full mode) or nothing.
    pub(super) fn fence_data(&self, group: &GroupId, mode: FenceMode) -> Bytes {
        match mode {
            FenceMode::Full => self.modex.committed(group).cloned().unwrap_or_default(),
            FenceMode::Direct => Bytes::new(),
        }
    }

    /// A fence of `group` ended here: a full one's result replaces what was cached of the
    /// group; a direct one drops it (the members may have committed again: later gets fetch).
    pub(super) fn fenced(&mut self, group: &GroupId, mode: FenceMode, result: &AllgatherResult) {
        match mode {
            FenceMode::Full => self.modex.fenced_full(group, result),
            FenceMode::Direct => self.modex.fenced(group),
        }
    }

    /// A data-exchange message RELM delivered.
    pub(super) fn on_modex_message(&mut self, msg: Message) {
        if let Err(why) = self.modex.handle_message(msg.origin, msg.tag, &msg.payload) {
            self.counters.grpcomm_malformed += 1;
            log::warn!(
                "rank {}: dropped a data-exchange message from rank {}: {why}",
                self.me,
                msg.origin
            );
        }
        self.drain_modex_answers();
    }

    /// Ranks declared dead: fetches from them fail.
    pub(super) fn modex_failed(&mut self, dead: &[Rank]) {
        self.modex.handle_failed(dead);
        self.drain_modex_answers();
    }

    /// Sends what the core asks for while RELM has room; answers come out. Once per pump,
    /// before RELM's.
    pub(super) fn pump_modex(&mut self, now: Instant) {
        if self.stopping.is_some() {
            return;
        }
        while self.relm.has_runtime_room()
            && let Some((to, tag, payload)) = self.modex.poll_send()
        {
            self.runtime_reliable(now, to, tag, payload);
        }
        self.drain_modex_answers();
    }

    /// Every get still waiting fails `ShutDown` (the daemon stops).
    pub(super) fn modex_stop(&mut self) {
        for token in self.modex.take_waiting() {
            self.out.push_back(Output::GetDone {
                token,
                result: Err(GetError::ShutDown),
            });
        }
        self.drain_modex_answers();
    }

    fn drain_modex_answers(&mut self) {
        while let Some((token, result)) = self.modex.poll_answer() {
            self.out.push_back(Output::GetDone { token, result });
        }
    }
}
