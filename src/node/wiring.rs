//! The wire-up flow: every other rank reports its contact URI to rank 0, rank 0 floods the
//! contact table down the tree (the messages are in `wireup.rs`).

use super::wireup::{self, TAG_WIREUP_REPORT, TAG_WIREUP_TABLE};
use super::{Node, Output, StopReason, Wire};
use crate::Rank;
use crate::oob::header::Kind;
use crate::rml::Message;
use crate::routed::Scope;
use bytes::Bytes;
use std::time::Instant;

impl Node {
    /// Starts the node: wire-up begins (rank 0 waits for reports until the wire-up timeout;
    /// every other rank reports to rank 0 directly, not along the tree: nobody knows the
    /// tree's addresses yet).
    pub fn start(&mut self, now: Instant) {
        self.started = Some(now);
        let Some(uri) = self.uri.clone().filter(|_| !self.wired_at_start) else {
            // No addresses (the simulator): wired from the start.
            self.wire = Wire::Wired;
            self.wired(now);
            return;
        };
        if self.me == 0 {
            let collector = wireup::WireupCollector::new(self.size, uri);
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
        let table = c.encode();
        self.contacts = c.contacts().to_vec();
        if !missing.is_empty() {
            log::warn!(
                "rank 0: wire-up without {} daemon(s) that never reported: {:?}",
                missing.len(),
                missing
            );
            match self.routing.fail(&missing, Scope::Global, Some(self.epoch)) {
                Ok(status) => self.grpcomm_repair(&status),
                Err(e) => log::error!("rank 0: cannot mark missing ranks failed: {e}"),
            }
            self.confirmed = missing.clone();
        }
        self.wire = Wire::Wired;
        log::info!(
            "rank 0: wire-up complete, {} daemons",
            self.size as usize - missing.len()
        );
        // Down the repaired tree, before anything the held commands send.
        self.flood(0, TAG_WIREUP_TABLE, &table);
        self.wired(now);
    }

    /// The contact table arrived: applied before it is forwarded (it holds the children's
    /// addresses), then flooded on to the children of the repaired tree.
    pub(super) fn apply_table(&mut self, now: Instant, payload: &Bytes) {
        if self.is_wired() || self.stopping.is_some() {
            return;
        }
        let table = match wireup::decode_table(self.size, payload) {
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
        let missing: Vec<Rank> = table
            .iter()
            .enumerate()
            .filter(|(_, c)| c.is_none())
            .map(|(r, _)| r as Rank)
            .collect();
        if missing.contains(&self.me) {
            log::error!(
                "rank {}: the DVM started without this daemon (its report came too late)",
                self.me
            );
            self.begin_stop(now, StopReason::Fatal("left out of wire-up".into()));
            return;
        }
        if !missing.is_empty() {
            match self.routing.fail(&missing, Scope::Global, Some(self.epoch)) {
                Ok(status) => self.grpcomm_repair(&status),
                Err(e) => log::error!("rank {}: bad failed list in contact table: {e}", self.me),
            }
        }
        self.contacts = table;
        self.confirmed = missing;
        self.wire = Wire::Wired;
        self.flood(0, TAG_WIREUP_TABLE, payload);
        log::info!(
            "rank {}: wired up (parent {:?}, {} children)",
            self.me,
            self.routing.parent(),
            self.routing.children().len()
        );
        self.wired(now);
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
