//! The node's side of clients routed through their daemon (issue "Jobs"; the core is
//! `src/clients/`): admission and frames from the driver, client messages handed to RELM
//! (runtime tag 20, in the user window: a full window holds them here, in order), their
//! results, watches and exit notices as runtime messages over RELM (tag 21, while RELM has
//! room for the runtime's messages), repairs ending what depended on the dead, and
//! `Output::Client` events for the driver.
use super::{Node, Output};
use crate::Rank;
use crate::clients::registry::Carried;
use crate::clients::wire::{TAG_CLIENT_CONTROL, TAG_CLIENT_DATA};
use crate::clients::{ClientName, Clients, JobId};
use crate::error::SendError;
use crate::rml::{Message, Tag};
use bytes::Bytes;
use std::time::Instant;

impl Node {
    /// Opens `job` for clients holding `key` (see `Handle::client_job`). `false` at
    /// `CLIENT_JOBS_MAX` jobs.
    pub fn client_open_job(&mut self, job: JobId, key: [u8; 32], accept_from: Vec<JobId>) -> bool {
        self.clients.open_job(job, key, accept_from)
    }

    /// No new client of `job` is admitted.
    pub fn client_close_job(&mut self, job: JobId) {
        self.clients.close_job(job);
    }

    /// `job` is over here: closed, and the local ids of its clients for the driver to
    /// disconnect (telling the node of each with [`Node::handle_client_gone`]).
    pub fn client_end_job(&mut self, job: JobId) -> Vec<u32> {
        self.clients.end_job(job)
    }

    /// A client connection's `Hello`, with the uid its socket reports: its name, or why it is
    /// refused (the driver logs it, tells the client and closes).
    pub fn handle_client_hello(
        &mut self,
        version: u16,
        job: JobId,
        key: &[u8; 32],
        uid: u32,
    ) -> Result<ClientName, String> {
        if self.stopping.is_some() {
            return Err("the daemon is stopping".into());
        }
        self.clients.admit(version, job, key, uid)
    }

    /// Whether a client connection from `uid` may be admitted at all: the driver refuses
    /// another uid's as soon as it accepts it, so that it holds none of the
    /// `CLIENT_PENDING_MAX` places of connections awaiting admission (a user who may not be
    /// a client could otherwise push real clients' connections out of them).
    pub fn client_uid_allowed(&self, uid: u32) -> bool {
        self.clients.uid_allowed(uid)
    }

    /// The driver refused a connection before its `Hello` was judged (garbage, no `Hello` in
    /// time, too many awaiting admission): counted with the other refusals.
    pub fn handle_client_refused(&mut self) {
        self.clients.count_refused();
    }

    /// Local client `local` sends. `Err`: the client broke the protocol (close it).
    pub fn handle_client_send(
        &mut self,
        local: u32,
        token: u64,
        to: ClientName,
        tag: Tag,
        payload: Bytes,
    ) -> Result<(), String> {
        self.clients.send(local, token, to, tag, payload)?;
        self.drain_client_events();
        Ok(())
    }

    /// Local client `local` watches `name`. `Err`: the client broke the protocol.
    pub fn handle_client_watch(&mut self, local: u32, name: ClientName) -> Result<(), String> {
        let failed = name.rank < self.size && self.routing.is_failed(name.rank);
        self.clients.watch(local, name, failed)?;
        self.drain_client_events();
        Ok(())
    }

    /// Local client `local`'s connection closed.
    pub fn handle_client_gone(&mut self, local: u32) {
        self.clients.gone(local);
        self.drain_client_events();
    }

    /// Bytes queued towards local client `local`'s socket now.
    pub fn handle_client_queue(&mut self, local: u32, bytes: usize) {
        self.clients.set_queued(local, bytes);
    }

    /// Whether the driver may read the next frame of local client `local` (ask before each
    /// frame; a client over its bound is read again after its sends are answered: ask every
    /// turn).
    pub fn client_may_read(&self, local: u32) -> bool {
        self.clients.may_read(local)
    }

    /// The clients' core (read-only: counters, checks).
    pub fn clients(&self) -> &Clients {
        &self.clients
    }

    /// Client messages to RELM (user window), control messages while RELM has room for the
    /// runtime's. Once per pump, before RELM's.
    pub(super) fn pump_clients(&mut self, now: Instant) {
        // Every turn pumps: a daemon with no client work pays one check.
        if self.stopping.is_some() || !self.is_wired() || self.clients.is_idle() {
            self.drain_client_events();
            return;
        }
        let mut clients = std::mem::take(&mut self.clients);
        clients.pump_data(&mut |to: Rank, payload: Bytes| {
            if self.routing.is_failed(to) {
                return Carried::Down;
            }
            match self.send_reliable(now, to, TAG_CLIENT_DATA, payload, None) {
                Ok(()) => Carried::Sent,
                Err(SendError::Busy(_)) => Carried::Busy,
                Err(SendError::NodeDown(_) | SendError::Unreachable(_)) => Carried::Down,
                Err(e) => {
                    // Sizes and ranks were checked when the client sent: not reached.
                    crate::bug!("rank {}: a client message for {to} refused: {e}", self.me);
                    Carried::Down
                }
            }
        });
        while self.relm.has_runtime_room()
            && let Some((to, payload)) = clients.poll_control()
        {
            if !self.routing.is_failed(to) {
                self.runtime_reliable(now, to, TAG_CLIENT_CONTROL, payload);
            }
        }
        self.clients = clients;
        self.drain_client_events();
    }

    /// A client message or control message RELM delivered.
    pub(super) fn on_client_message(&mut self, msg: Message) {
        let res = match msg.tag {
            TAG_CLIENT_DATA => self.clients.handle_data(msg.origin, msg.payload),
            _ => self.clients.handle_control(msg.origin, &msg.payload),
        };
        if let Err(why) = res {
            log::warn!(
                "rank {}: dropped a client message from rank {}: {why}",
                self.me,
                msg.origin
            );
        }
        self.drain_client_events();
    }

    /// Ranks declared dead.
    pub(super) fn clients_failed(&mut self, dead: &[Rank]) {
        self.clients.failed(dead);
        self.drain_client_events();
    }

    /// The daemon stops (the driver closes every client).
    pub(super) fn clients_stop(&mut self) {
        self.clients.stop();
        self.drain_client_events();
    }

    fn drain_client_events(&mut self) {
        while let Some(e) = self.clients.poll_event() {
            self.out.push_back(Output::Client(e));
        }
    }
}
