//! The wire-up flow: every other rank reports its contact URI to rank 0; rank 0 sends each
//! child its slice of the contact table, and every daemon its children theirs (the messages
//! are in `wireup.rs`).

use super::contacts::ContactsSetting;
use super::wireup::{self, Slice, TAG_WIREUP_REPORT, TAG_WIREUP_TABLE};
use super::{Node, Output, StopReason, Wire};
use crate::Rank;
use crate::oob::header::Kind;
use crate::rml::Message;
use crate::routed::Route;
use crate::routed::Scope;
use bytes::Bytes;
use std::collections::BTreeMap;
use std::time::Instant;

impl Node {
    /// Starts the node: wire-up begins (rank 0 waits for reports until the wire-up timeout;
    /// every other rank reports to rank 0 directly, not along the tree: nobody knows the
    /// tree's addresses yet).
    pub fn start(&mut self, now: Instant) {
        self.started = Some(now);
        let Some(uri) = self.uri.clone().filter(|_| !self.wired_at_start) else {
            // No addresses (the simulator): wired from the start, the ranks beyond the initial
            // size absent as wire-up would leave them.
            self.wire = Wire::Wired;
            if self.me < self.initial_size {
                let absent: Vec<Rank> = (self.initial_size..self.size).collect();
                self.fail_missing(&absent);
            }
            self.wired(now);
            return;
        };
        if self.rejoin {
            self.start_rejoin(now);
            return;
        }
        if self.me == 0 {
            let collector = wireup::WireupCollector::new(self.size, self.initial_size, uri);
            self.wire = Wire::Collecting(collector, now + self.wireup_timeout);
            if self.size == 1 {
                self.finish_wireup(now);
            }
            return;
        }
        self.wire = Wire::Waiting(Some(now + 2 * self.wireup_timeout));
        let report = Bytes::from(uri.to_string());
        let header = self.header(Kind::Msg, self.me, 0, TAG_WIREUP_REPORT, report.len());
        self.transmit(0, header, report, None);
    }

    pub(super) fn on_wireup_report(&mut self, now: Instant, msg: Message) {
        match wireup::decode_report(msg.origin, &msg.payload) {
            Ok(uri) => {
                log::debug!("rank 0: rank {} reported {uri}", msg.origin);
                let done = match &mut self.wire {
                    Wire::Collecting(c, _) => c.record(uri),
                    _ => {
                        log::warn!(
                            "rank 0: late wire-up report from rank {} ignored",
                            msg.origin
                        );
                        false
                    }
                };
                if done {
                    self.finish_wireup(now);
                }
            }
            Err(e) => log::warn!("rank 0: bad report from rank {}: {e}", msg.origin),
        }
    }

    /// Rank 0: every rank reported, or time ran out. Ranks that never reported are failed.
    pub(super) fn finish_wireup(&mut self, now: Instant) {
        let Wire::Collecting(c, _) = &self.wire else {
            return;
        };
        let missing = c.missing();
        let reported: Vec<_> = c.contacts().iter().flatten().cloned().collect();
        for u in reported {
            self.contacts.own(u);
        }
        let absent = missing.iter().filter(|r| **r >= self.initial_size).count();
        if absent > 0 {
            log::info!(
                "rank 0: ranks {} to {} are room to grow: absent until they join",
                self.initial_size,
                self.size - 1
            );
        }
        if missing.len() > absent {
            let lost: Vec<Rank> = missing
                .iter()
                .copied()
                .filter(|r| *r < self.initial_size)
                .collect();
            log::warn!(
                "rank 0: wire-up without {} daemon(s) that never reported: {lost:?}",
                lost.len()
            );
        }
        self.fail_missing(&missing);
        self.wire = Wire::Wired;
        log::info!(
            "rank 0: wire-up complete, {} daemons",
            self.size as usize - missing.len()
        );
        // Down the repaired tree, before anything the held commands send.
        self.send_slices(&missing);
        self.wired(now);
    }

    /// The ranks that never reported at wire-up (or, with room to grow, are absent) are failed
    /// in epoch 0, with no repair to report: the tree every daemon starts from.
    fn fail_missing(&mut self, missing: &[Rank]) {
        if missing.is_empty() {
            return;
        }
        match self.routing.fail(missing, Scope::Global, Some(self.epoch)) {
            Ok(status) => self.grpcomm_repair(&status),
            Err(e) => log::error!("rank {}: cannot fail the missing ranks: {e}", self.me),
        }
        self.confirmed = missing.to_vec();
    }

    /// This daemon's slice of the contact table arrived: applied (the failures it lists, then
    /// its contacts), then each child sent its own slice over the repaired tree.
    pub(super) fn apply_table(&mut self, now: Instant, payload: &Bytes) {
        if self.is_wired() || self.stopping.is_some() {
            // A second copy (from a new parent after a repair): what it lacks is looked up.
            return;
        }
        let slice = match Slice::decode(self.size, payload) {
            Ok(t) => t,
            Err(wireup::WireupError::WrongSize { got, expected }) => {
                // Nothing this daemon could do with the DVM would be right: its ranks and
                // tree differ from everyone else's.
                let why = format!(
                    "the DVM has {got} daemons but this daemon was started with size \
                     {expected}: give every daemon the same size (--size / TBON_SIZE, or the \
                     launcher's task count)"
                );
                log::error!("rank {}: {why}", self.me);
                self.begin_stop(now, StopReason::Fatal(why));
                return;
            }
            Err(e) => {
                let why = format!("unusable contact table from the DVM: {e}");
                log::error!("rank {}: {why}", self.me);
                self.begin_stop(now, StopReason::Fatal(why));
                return;
            }
        };
        let mut missing = slice.missing;
        missing.sort_unstable();
        if missing.contains(&self.me) {
            log::error!(
                "rank {}: the DVM started without this daemon (its report came too late)",
                self.me
            );
            self.begin_stop(now, StopReason::Fatal("left out of wire-up".into()));
            return;
        }
        self.fail_missing(&missing);
        for u in slice.entries {
            self.contacts.own(u);
        }
        self.wire = Wire::Wired;
        self.send_slices(&missing);
        log::info!(
            "rank {}: wired up (parent {}, {} children, {} contacts)",
            self.me,
            crate::routed::ParentName(self.routing.parent()),
            self.routing.children().len(),
            self.contacts.owned_len()
        );
        self.wired(now);
    }

    /// Sends every child its slice: the missing ranks; this daemon's contact and those of its
    /// ancestors; and the contacts of the child's subtree (with `contacts = "full"`, every
    /// contact this daemon owns).
    fn send_slices(&mut self, missing: &[Rank]) {
        let children: Vec<Rank> = self.routing.children().to_vec();
        if children.is_empty() {
            return;
        }
        let mut common: Vec<crate::oob::uri::ContactUri> = self.uri.iter().cloned().collect();
        let mut below: BTreeMap<Rank, Vec<crate::oob::uri::ContactUri>> =
            children.iter().map(|c| (*c, Vec::new())).collect();
        let full = self.contacts_setting == ContactsSetting::Full;
        for u in self.contacts.owned() {
            if u.rank == self.me {
                continue;
            }
            match self.routing.route(u.rank) {
                Route::Child(c) if !full => below.entry(c).or_default().push(u.clone()),
                Route::Unreachable | Route::Local => {}
                _ => common.push(u.clone()),
            }
        }
        for c in children {
            let mut entries = common.clone();
            entries.extend(below.remove(&c).unwrap_or_default());
            let payload = Slice {
                missing: missing.to_vec(),
                entries,
            }
            .encode(self.size);
            let h = self.header(Kind::Xcast, 0, c, TAG_WIREUP_TABLE, payload.len());
            self.transmit(c, h, payload, None);
        }
    }

    /// A rank other than 0 got no contact table within its deadline: rank 0 never finished
    /// wire-up, or this daemon's report never reached it (another DVM, another size).
    pub(super) fn no_table_in_time(&mut self, now: Instant) {
        let why = format!(
            "no contact table from rank 0 within {} ms (twice the wire-up timeout): check that \
             every daemon has the same size and DVM id and that rank 0's contact is current",
            2 * self.wireup_timeout.as_millis()
        );
        log::error!("rank {}: {why}", self.me);
        self.begin_stop(now, StopReason::Fatal(why));
    }

    fn wired(&mut self, now: Instant) {
        self.out.push_back(Output::Wired);
        self.watch_neighbours(now);
        if let Some(m) = &self.monitor {
            self.heartbeat_at = Some(now + m.tick_every());
        }
        self.replay_prewire(now);
    }

    /// Floods a frame down the tree, to every current child (the payload is shared, never
    /// copied). Only for what cannot be a broadcast: the contact table and "rank 0 lost".
    pub(super) fn flood(&mut self, origin: Rank, tag: u32, payload: &Bytes) {
        let children: Vec<Rank> = self.routing.children().to_vec();
        for c in children {
            let h = self.header(Kind::Xcast, origin, c, tag, payload.len());
            self.transmit(c, h, payload.clone(), None);
        }
    }
}
