//! The loop's side of the applications' streams: the stream commands of handles go to the
//! node, and the node's stream events go to service handlers (a thread per stream opened),
//! writers (their credit) and fetching readers or callbacks. Every table here is bounded by
//! the node's (`limits::STREAMS_MAX`, `limits::STREAM_SERVICES_MAX`): an entry is made only
//! for what the node accepted.

use super::EventLoop;
use crate::Rank;
use crate::driver::caddy::{Fetch, Reply, StreamSink};
use crate::driver::serve::{ServiceHandler, StreamRequest};
use crate::driver::stream_writer::{Credit, StreamWriter};
use crate::driver::{StreamItem, handle::lock};
use crate::error::SendError;
use crate::fxhash::FxHashMap;
use crate::node::{FAIL_NO_ROOM, StreamCommand, StreamEvent};
use crate::stream::StreamError;
use std::sync::Arc;

/// What the loop keeps for the applications' streams.
#[derive(Default)]
pub(super) struct AppStreams {
    services: FxHashMap<String, Arc<ServiceHandler>>,
    /// The credit of each stream this daemon produces, shared with its writer.
    writers: FxHashMap<(Rank, u64), Arc<Credit>>,
    /// Where each stream this daemon fetches goes.
    sinks: FxHashMap<u64, StreamSink>,
}

fn answer(reply: Reply, r: Result<(), SendError>) {
    match reply {
        Some(tx) => {
            let _ = tx.send(r);
        }
        None => {
            if let Err(e) = r {
                log::warn!("a stream command from a callback was refused: {e}");
            }
        }
    }
}

impl EventLoop {
    pub(super) fn serve(&mut self, service: String, handler: Arc<ServiceHandler>, reply: Reply) {
        let c = StreamCommand::Serve {
            service: service.clone(),
        };
        let r = self.node.handle_stream(self.now, c);
        if r.is_ok() {
            self.streams.services.insert(service, handler);
        }
        answer(reply, r);
    }

    pub(super) fn fetch(&mut self, f: Fetch) {
        let Fetch {
            command: c,
            id,
            mut sink,
            reply,
        } = f;
        // The sink must be in place before the node's first events for the stream.
        let r = self.node.handle_stream(self.now, c);
        match (&r, reply) {
            (Ok(()), reply) => {
                self.streams.sinks.insert(id, sink);
                answer(reply, Ok(()));
            }
            (Err(e), Some(tx)) => {
                let _ = tx.send(Err(e.clone()));
            }
            // From a callback nobody waits for the answer: the stream ends with it.
            (Err(e), None) => (sink.deliver)(
                StreamItem::End(Err(StreamError::Refused(e.to_string()))),
                None,
            ),
        }
    }

    /// A stream command of a writer or a reader (no answer: what it means arrives as events).
    pub(super) fn stream_command(&mut self, c: StreamCommand) {
        let (stream, ends) = match &c {
            StreamCommand::Write { consumer, id, .. } => (Some((*consumer, *id)), false),
            StreamCommand::End { consumer, id, .. } => (Some((*consumer, *id)), true),
            _ => (None, false),
        };
        let r = self.node.handle_stream(self.now, c);
        let Some(key) = stream else { return };
        if let Err(e) = r {
            // The stream ended between the writer's look at its credit and now.
            log::debug!("rank {}: a stream write refused: {e}", self.me);
            if let Some(credit) = self.streams.writers.remove(&key) {
                credit.stop(StreamError::Cancelled);
            }
        } else if ends {
            self.streams.writers.remove(&key);
        }
    }

    /// One of the node's stream events.
    pub(super) fn on_stream_event(&mut self, e: StreamEvent) {
        match e {
            StreamEvent::Opened {
                consumer,
                id,
                service,
                request,
                offset,
            } => self.start_handler(consumer, id, service, request, offset),
            StreamEvent::Room { consumer, id, upto } => {
                if let Some(c) = self.streams.writers.get(&(consumer, id)) {
                    c.grant(upto);
                }
            }
            StreamEvent::Stopped { consumer, id, why } => {
                if let Some(c) = self.streams.writers.remove(&(consumer, id)) {
                    c.stop(why);
                }
            }
            StreamEvent::Data { id, bytes, check } => {
                let n = bytes.len() as u64;
                let Some(sink) = self.streams.sinks.get_mut(&id) else {
                    return;
                };
                (sink.deliver)(StreamItem::Data(bytes), check);
                if !sink.reader_reports {
                    let c = StreamCommand::Consumed { id, n };
                    let _ = self.node.handle_stream(self.now, c);
                }
            }
            StreamEvent::Ended { id, result } => {
                if let Some(mut sink) = self.streams.sinks.remove(&id) {
                    (sink.deliver)(StreamItem::End(result), None);
                }
            }
        }
    }

    /// Runs the service's handler for a stream just opened, on a thread of its own.
    fn start_handler(
        &mut self,
        consumer: Rank,
        id: u64,
        service: String,
        request: bytes::Bytes,
        offset: u64,
    ) {
        let Some(handler) = self.streams.services.get(&service).cloned() else {
            return;
        };
        let credit = Arc::new(Credit::default());
        lock(&credit.state).upto = offset;
        let writer = StreamWriter::new(self.shared.clone(), consumer, id, offset, credit.clone());
        let req = StreamRequest {
            consumer,
            service,
            request,
            offset,
        };
        self.streams.writers.insert((consumer, id), credit);
        let spawned = std::thread::Builder::new()
            .name(format!("tbon-{}-stream", self.me))
            .spawn(move || handler(req, writer));
        let e = match spawned {
            Ok(thread) => {
                // Joined when the daemon stops (`Shared::join_loop`).
                let mut handlers = lock(&self.shared.handlers);
                handlers.retain(|h| !h.is_finished());
                handlers.push(thread);
                return;
            }
            Err(e) => e,
        };
        // The writer went down with the closure (its drop queued an end that will find the
        // stream over): fail it here, saying why.
        log::warn!(
            "rank {}: no thread for a stream of rank {consumer}: {e}",
            self.me
        );
        self.streams.writers.remove(&(consumer, id));
        let c = StreamCommand::End {
            consumer,
            id,
            failure: Some((FAIL_NO_ROOM, format!("no thread for the stream: {e}"))),
        };
        let _ = self.node.handle_stream(self.now, c);
    }

    /// The daemon stops: every writer and reader ends `ShutDown`.
    pub(super) fn stop_streams(&mut self) {
        for (_, c) in self.streams.writers.drain() {
            c.stop(StreamError::ShutDown);
        }
        let mut ids: Vec<u64> = self.streams.sinks.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            if let Some(mut sink) = self.streams.sinks.remove(&id) {
                (sink.deliver)(StreamItem::End(Err(StreamError::ShutDown)), None);
            }
        }
    }
}
