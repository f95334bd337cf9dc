//! Operator tool connections (`tbon status`): a connection whose dialler proved the operator
//! credential (`oob::handshake::TOOL_RANK`) is never a link. It may only send status queries,
//! one at a time; each is answered with a `Report` (or `Refused`) on the same connection.
//! Anything else closes it. At most `limits::TOOL_CONNECTIONS_MAX` admitted at once (one that
//! has not proved the credential yet is a pending handshake like any other); one idle for
//! `limits::TOOL_IDLE_MS` is closed.

use super::EventLoop;
use crate::driver::conn::ConnState;
use crate::driver::log_limit::Refusal;
use crate::limits;
use crate::oob::frame::Frame;
use crate::oob::handshake::TOOL_RANK;
use crate::oob::header::{Header, Kind};
use crate::status::wire::Msg;
use crate::status::{Report, StatusError, TAG_STATUS};
use bytes::Bytes;
use crossbeam_channel::Sender;
use std::time::{Duration, Instant};

/// Who waits for a status the node gathers.
pub(super) enum StatusWaiter {
    /// A tool's connection (slot and generation).
    Tool { tok: usize, generation: u64 },
    /// An API caller.
    Caller(Sender<Result<Report, StatusError>>),
}

impl EventLoop {
    /// Tools admitted now: those that proved the operator credential. A connection that only
    /// claims to be a tool is not counted: anyone can send a tool's `Hello`, and counting
    /// them let a stranger hold every tool slot and lock the operator out (an outside-in
    /// review: eight `Hello`s renewed every handshake timeout did). Those are pending
    /// handshakes, bounded as any stranger's.
    fn tools_open(&self) -> usize {
        self.conns
            .iter()
            .filter(|(_, c)| matches!(c.state, ConnState::Tool { .. }))
            .count()
    }

    /// A tool's `Hello`: answered like a daemon's, unless `TOOL_CONNECTIONS_MAX` tools are
    /// admitted already.
    pub(super) fn on_tool_hello(&mut self, tok: usize) -> bool {
        if self.tools_open() >= limits::TOOL_CONNECTIONS_MAX {
            self.refuse_handshake(
                tok,
                Refusal::TooManyConnections,
                "too many operator tools connected",
            );
            return false;
        }
        true
    }

    /// A tool proved the operator credential: admit it as a tool, unless `TOOL_CONNECTIONS_MAX`
    /// are admitted (several may have passed their `Hello` while there was room).
    pub(super) fn tool_admitted(&mut self, tok: usize) {
        if self.tools_open() >= limits::TOOL_CONNECTIONS_MAX {
            self.refuse_handshake(
                tok,
                Refusal::TooManyConnections,
                "too many operator tools connected",
            );
            return;
        }
        self.admit_conn(tok);
        let Some(conn) = self.conns.get_mut(tok) else {
            return;
        };
        self.pending.remove(conn.generation);
        conn.state = ConnState::Tool {
            since: self.now,
            asking: false,
        };
        conn.decoder.set_max_payload(limits::TOOL_FRAME_MAX);
        log::debug!(
            "rank {}: operator tool connected from {}",
            self.me,
            conn.addr
        );
    }

    /// A frame from a tool: a status query, else the connection is closed.
    pub(super) fn on_tool_frame(&mut self, tok: usize, frame: Frame) {
        let Some(conn) = self.conns.get_mut(tok) else {
            return;
        };
        let ConnState::Tool { asking, .. } = &mut conn.state else {
            return;
        };
        let h = frame.header;
        let query = match (h.kind, h.tag) {
            (Kind::Msg, TAG_STATUS) if !*asking => Msg::decode(&frame.payload, self.node.size()),
            _ => {
                self.tool_closes(tok, "a tool sent something other than one status query");
                return;
            }
        };
        let Ok(Msg::Query(q)) = query else {
            self.tool_closes(tok, "a tool sent a malformed status query");
            return;
        };
        *asking = true;
        let generation = conn.generation;
        let token = self.next_status_token();
        match self.node.handle_status(self.now, token, q.budget_ms, q.all) {
            Ok(()) => {
                self.status_waiters
                    .insert(token, StatusWaiter::Tool { tok, generation });
            }
            Err(why) => self.tool_answer(tok, Msg::Refused(why.to_string())),
        }
        self.carry_out();
    }

    pub(super) fn next_status_token(&mut self) -> u64 {
        self.status_next_token += 1;
        self.status_next_token
    }

    /// A caller asks for a status.
    pub(super) fn status_for_caller(
        &mut self,
        budget_ms: u32,
        all: bool,
        tx: Sender<Result<Report, StatusError>>,
    ) {
        let token = self.next_status_token();
        match self.node.handle_status(self.now, token, budget_ms, all) {
            Ok(()) => {
                self.status_waiters.insert(token, StatusWaiter::Caller(tx));
            }
            Err(why) => {
                let _ = tx.send(Err(StatusError::Refused(why.to_string())));
            }
        }
    }

    /// The node answered the status query `token`.
    pub(super) fn on_status(&mut self, token: u64, report: Report) {
        match self.status_waiters.remove(&token) {
            Some(StatusWaiter::Caller(tx)) => {
                let _ = tx.send(Ok(report));
            }
            Some(StatusWaiter::Tool { tok, generation }) if self.alive(tok, generation) => {
                self.tool_answer(tok, Msg::Report(report));
            }
            _ => {}
        }
    }

    /// Queues an answer on a tool's connection; it may ask again.
    fn tool_answer(&mut self, tok: usize, msg: Msg) {
        let Some(conn) = self.conns.get_mut(tok) else {
            return;
        };
        if let ConnState::Tool { since, asking } = &mut conn.state {
            *since = self.now;
            *asking = false;
        }
        let payload: Bytes = msg.encode();
        let header = Header {
            kind: Kind::Msg,
            origin: self.me,
            dst: TOOL_RANK,
            tag: TAG_STATUS,
            epoch: 0,
            seq: 0,
            len: payload.len() as u32,
            lives: 0,
        };
        if conn.push(header, payload, None).is_err() {
            self.tool_closes(tok, "a tool's answer did not fit its queue");
            return;
        }
        self.mark_dirty(tok);
    }

    fn tool_closes(&mut self, tok: usize, why: &str) {
        if let Some(c) = self.conns.get(tok) {
            log::warn!(
                "rank {}: closing tool connection {}: {why}",
                self.me,
                c.addr
            );
        }
        self.node.counters_mut().protocol_errors += 1;
        self.close(tok, None);
    }

    /// Closes tool connections idle for `TOOL_IDLE_MS` (from housekeeping).
    pub(super) fn close_idle_tools(&mut self, now: Instant) {
        let idle = Duration::from_millis(limits::TOOL_IDLE_MS);
        let stale: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                matches!(c.state, ConnState::Tool { since, asking: false }
                    if now.saturating_duration_since(since) >= idle)
            })
            .map(|(t, _)| t)
            .collect();
        for t in stale {
            log::debug!("rank {}: closing an idle tool connection", self.me);
            self.close(t, None);
        }
    }

    /// The loop stops: callers still waiting hear so (tools see the connection close).
    pub(super) fn fail_status_waiters(&mut self) {
        for (_, w) in self.status_waiters.drain() {
            if let StatusWaiter::Caller(tx) = w {
                let _ = tx.send(Err(StatusError::ShutDown));
            }
        }
    }
}
