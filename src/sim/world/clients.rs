//! The `client` kind's applications (`src/clients/`): the scenario's clients are admitted by
//! their daemons at the start; each planned send is made at its time by a client that is
//! still connected, carrying (sender, receiver, number); planned exits close clients.
//! Checker `client`: a receiver gets each sender's messages exactly once and in order; a send
//! ends `Ok` only once its message was delivered, `NodeDown` only for a receiver whose daemon
//! died or was declared dead, `ClientGone` only for a receiver that exited; by the end every
//! send of a client that is still connected to a living daemon has ended, and every message
//! between two such clients was delivered.

use super::World;
use crate::Rank;
use crate::clients::{ClientError, ClientEvent, ClientName};
use crate::sim::check::Violation;
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap, HashSet};

const JOB: u64 = 1;
const KEY: [u8; 32] = [0x5c; 32];

/// What the client applications know.
#[derive(Debug, Default)]
pub(super) struct ClientApps {
    /// Each client's name once admitted.
    names: Vec<Option<ClientName>>,
    /// Clients that exited.
    exited: HashSet<usize>,
    /// Clients whose daemon was restarted (rejoin): they died with its old life, and the new
    /// life knows none of their names.
    lost: HashSet<usize>,
    /// Next number per (sender, receiver), and the next expected at the receiver.
    next: HashMap<(usize, usize), u64>,
    expected: HashMap<(usize, usize), u64>,
    /// Sends without a result: token -> (sender, receiver, number).
    pending: BTreeMap<u64, (usize, usize, u64)>,
    /// Messages delivered: (sender, receiver, number).
    delivered: HashSet<(usize, usize, u64)>,
    /// Messages sent that ended `Ok`, and delivered, for the stats.
    pub ok: u64,
    pub received: u64,
}

fn v(detail: String) -> Violation {
    Violation {
        checker: "client",
        detail,
    }
}

fn payload(from: usize, to: usize, n: u64) -> Bytes {
    let mut b = Vec::with_capacity(24);
    b.extend_from_slice(&(from as u64).to_le_bytes());
    b.extend_from_slice(&(to as u64).to_le_bytes());
    b.extend_from_slice(&n.to_le_bytes());
    Bytes::from(b)
}

fn decode(p: &[u8]) -> Option<(usize, usize, u64)> {
    let word = |i: usize| {
        p.get(i * 8..i * 8 + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    Some((word(0)? as usize, word(1)? as usize, word(2)?))
}

impl World {
    /// The scenario's clients are admitted by their daemons.
    pub(super) fn on_client_start(&mut self) -> Result<(), Violation> {
        self.clients.names = vec![None; self.scen.clients.len()];
        for (i, &rank) in self.scen.clients.clone().iter().enumerate() {
            if !self.living(rank) {
                continue;
            }
            let Some(n) = self.nodes.get_mut(rank as usize) else {
                continue;
            };
            match n.client_admit(JOB, KEY) {
                Ok(name) => {
                    if let Some(slot) = self.clients.names.get_mut(i) {
                        *slot = Some(name);
                    }
                }
                Err(e) => return Err(v(format!("client {i} not admitted by rank {rank}: {e}"))),
            }
        }
        Ok(())
    }

    fn client_connected(&self, i: usize) -> Option<ClientName> {
        let name = self.clients.names.get(i).copied().flatten()?;
        (!self.clients.exited.contains(&i)
            && !self.clients.lost.contains(&i)
            && self.living(name.rank))
        .then_some(name)
    }

    /// `rank` starts a new life: its clients are gone with the old one, and their sends with
    /// them.
    pub(super) fn clients_lost_with(&mut self, rank: Rank) {
        for (i, n) in self.clients.names.iter().enumerate() {
            if n.is_some_and(|n| n.rank == rank) {
                self.clients.lost.insert(i);
            }
        }
        let lost = &self.clients.lost;
        self.clients
            .pending
            .retain(|_, (from, ..)| !lost.contains(from));
    }

    /// The scenario's send number `id` is made.
    pub(super) fn on_client_send(&mut self, id: usize) -> Result<(), Violation> {
        let Some(&(from, to, _)) = self.scen.client_sends.get(id) else {
            return Ok(());
        };
        let (Some(me), Some(dst)) = (
            self.client_connected(from),
            self.clients.names.get(to).copied().flatten(),
        ) else {
            return Ok(());
        };
        let n = self.clients.next.entry((from, to)).or_insert(0);
        let number = *n;
        *n += 1;
        let token = self.next_token;
        self.next_token += 1;
        let now = self.now();
        let Some(node) = self.nodes.get_mut(me.rank as usize) else {
            return Ok(());
        };
        node.client_send(now, me.local, token, dst, payload(from, to, number))
            .map_err(|e| v(format!("client {from} could not send: {e}")))?;
        self.clients.pending.insert(token, (from, to, number));
        self.after(me.rank)
    }

    /// The scenario's client `i` exits.
    pub(super) fn on_client_exit(&mut self, i: usize) -> Result<(), Violation> {
        let Some(me) = self.client_connected(i) else {
            return Ok(());
        };
        self.clients.exited.insert(i);
        // Its sends end with it: nobody waits for their results any more.
        self.clients.pending.retain(|_, (from, ..)| *from != i);
        let now = self.now();
        if let Some(node) = self.nodes.get_mut(me.rank as usize) {
            node.client_gone(now, me.local);
        }
        self.after(me.rank)
    }

    /// Events for daemon `r`'s clients: deliveries checked for order, results against what
    /// happened to the receivers.
    pub(super) fn client_events(
        &mut self,
        r: Rank,
        events: Vec<ClientEvent>,
    ) -> Result<(), Violation> {
        let index = |apps: &ClientApps, local: u32| {
            apps.names
                .iter()
                .position(|n| *n == Some(ClientName { rank: r, local }))
        };
        for e in events {
            match e {
                ClientEvent::Deliver {
                    client,
                    from,
                    payload,
                    ..
                } => {
                    let Some(to) = index(&self.clients, client) else {
                        return Err(v(format!("rank {r} delivered to unknown client {client}")));
                    };
                    let Some((f, t, n)) = decode(&payload) else {
                        return Err(v(format!("client {to} got a garbled message")));
                    };
                    let sender = self.clients.names.get(f).copied().flatten();
                    if t != to || sender != Some(from) {
                        return Err(v(format!(
                            "client {to} got a message of {f} for {t} from {from}"
                        )));
                    }
                    if self.clients.exited.contains(&to) {
                        return Err(v(format!("client {to} got a message after it exited")));
                    }
                    let want = self.clients.expected.entry((f, t)).or_insert(0);
                    if n != *want {
                        return Err(v(format!(
                            "client {t} got number {n} from client {f}, expected {want}"
                        )));
                    }
                    *want += 1;
                    self.clients.delivered.insert((f, t, n));
                    self.clients.received += 1;
                    // The application reads at once.
                    if let Some(node) = self.nodes.get_mut(r as usize) {
                        node.node.handle_client_queue(client, 0);
                    }
                }
                ClientEvent::SendDone { token, result, .. } => {
                    let Some((f, t, n)) = self.clients.pending.remove(&token) else {
                        continue;
                    };
                    let dst = self.clients.names.get(t).copied().flatten();
                    let ok = match &result {
                        Ok(()) => {
                            self.clients.ok += 1;
                            self.clients.delivered.contains(&(f, t, n))
                        }
                        Err(ClientError::NodeDown(d)) => {
                            dst.map(|x| x.rank) == Some(*d)
                                && (!self.living(*d)
                                    || self.declared.contains(d)
                                    || self.clients.lost.contains(&t))
                        }
                        // The receiver's daemon restarted: its new life never knew the name.
                        Err(ClientError::UnknownClient(_)) => self.clients.lost.contains(&t),
                        Err(ClientError::ClientGone(_)) => self.clients.exited.contains(&t),
                        Err(_) => false,
                    };
                    if !ok {
                        return Err(v(format!(
                            "client {f}'s send {n} to client {t} ended {result:?} (receiver \
                             exited: {})",
                            self.clients.exited.contains(&t)
                        )));
                    }
                }
                ClientEvent::Exited { .. } => {}
            }
        }
        Ok(())
    }

    /// After the run: every send of a client still connected to a living daemon (not
    /// declared dead) ended, and every message between two such clients was delivered.
    pub(super) fn final_clients(&self) -> Result<(), Violation> {
        let counted = |i: usize| {
            self.client_connected(i)
                .is_some_and(|n| !self.declared.contains(&n.rank))
        };
        if let Some((token, (f, t, n))) =
            self.clients.pending.iter().find(|(_, (f, ..))| counted(*f))
        {
            return Err(v(format!(
                "client {f}'s send {n} to client {t} (token {token}) never ended"
            )));
        }
        for (&(f, t), &sent) in &self.clients.next {
            if counted(f) && counted(t) {
                let got = self.clients.expected.get(&(f, t)).copied().unwrap_or(0);
                if got != sent {
                    return Err(v(format!(
                        "client {t} got {got} of client {f}'s {sent} messages"
                    )));
                }
            }
        }
        Ok(())
    }
}
