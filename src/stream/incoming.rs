//! The consumer's side of one stream: it opens the stream, checks every chunk (in order,
//! within the credit it granted, its digest) before handing it on, grants credit as the
//! application consumes, and ends `Finished` (length and digest sum checked) or with an error
//! that says why. A stream whose path broke resumes from the byte it stands at, under a new id.

use super::StreamError;
use super::digest;
use super::wire::StreamMsg;
use crate::Rank;
use crate::direct::Route;
use crate::limits::STREAM_WINDOW_MAX;
use bytes::Bytes;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Where a stream stands at its consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Chunks are still coming.
    Streaming,
    /// Every byte arrived and checked.
    Finished,
    /// It ended with this error.
    Failed(StreamError),
}

/// One stream this daemon consumes (sans-IO): take its messages with
/// [`Incoming::poll_msg`] and send them to [`Incoming::producer`] in order.
#[derive(Debug)]
pub struct Incoming {
    id: u64,
    producer: Rank,
    service: String,
    request: Bytes,
    window: u64,
    /// The next offset expected.
    received: u64,
    /// Bytes the application has taken (credit follows it).
    consumed: u64,
    /// The credit granted: the producer may send below this offset.
    granted: u64,
    /// The wrapping sum of the digests received since this instance's `Open`.
    digests: u64,
    status: Status,
    out: VecDeque<StreamMsg>,
    idle: Duration,
    /// The route of the stream's messages both ways (`None`: the daemons' settings).
    route: Option<Route>,
    heard: Instant,
    /// A chunk went missing (a gap, data or an end the producer's `Position` or `Unknown`
    /// says was lost): the node should [`Incoming::resume`] it.
    wants_resume: bool,
    /// The resume wanted was found by a probe (not news: the idle clock keeps running
    /// through it).
    silent: bool,
    /// When the stream last probed or resumed (probes are a quarter of the idle time apart).
    asked_at: Instant,
    resumes: u32,
    /// The application's reader checks each chunk's digest as it takes the chunk, on its own
    /// thread ([`Incoming::with_reader_checks`]): not checked here.
    reader_checks: bool,
}

impl Incoming {
    /// Opens stream `id` from `service` at `producer` with `request`, granting `window` bytes
    /// at a time (at most `STREAM_WINDOW_MAX`); it fails `TimedOut` after `idle` without a
    /// message from the producer.
    pub fn open(
        now: Instant,
        id: u64,
        producer: Rank,
        service: &str,
        request: Bytes,
        window: u32,
        idle: Duration,
    ) -> Incoming {
        let window = u64::from(window).clamp(1, STREAM_WINDOW_MAX as u64);
        let mut s = Incoming {
            id,
            producer,
            service: service.to_string(),
            request,
            window,
            received: 0,
            consumed: 0,
            granted: window,
            digests: 0,
            status: Status::Streaming,
            out: VecDeque::new(),
            idle,
            route: None,
            heard: now,
            wants_resume: false,
            silent: false,
            asked_at: now,
            resumes: 0,
            reader_checks: false,
        };
        s.push_open();
        s
    }

    fn push_open(&mut self) {
        self.out.push_back(StreamMsg::Open {
            offset: self.received,
            window: (self.granted - self.received) as u32,
            route: self.route,
            service: self.service.clone(),
            request: self.request.clone(),
        });
    }

    /// Gives the stream a route of its own (`Route::Direct`: ask for a direct link to the
    /// producer; `Route::Tree`: do not), asked of the producer too; before its first message
    /// is taken.
    pub fn with_route(mut self, route: Option<Route>) -> Self {
        self.route = route;
        if let Some(StreamMsg::Open { route: r, .. }) = self.out.front_mut() {
            *r = route;
        }
        self
    }

    /// Leaves each chunk's digest to the application's reader, which checks it as it takes
    /// the chunk (on its own thread: the daemon's loop then does no work per byte of the
    /// stream) and reports a mismatch with [`Incoming::handle_corrupt`]. The order, the
    /// credit and the `End`'s length and digest sum are still checked here.
    pub fn with_reader_checks(mut self, reader_checks: bool) -> Self {
        self.reader_checks = reader_checks;
        self
    }

    /// Whether the application's reader checks the chunks' digests.
    pub fn reader_checks(&self) -> bool {
        self.reader_checks
    }

    /// The application's reader found the chunk at `offset` corrupt: the stream fails
    /// `Corrupt` and the producer is told to stop. Nothing happens once it is over.
    pub fn handle_corrupt(&mut self, offset: u64) {
        if self.status == Status::Streaming {
            self.out.push_back(StreamMsg::Cancel);
            self.fail_with(StreamError::Corrupt { offset });
        }
    }

    /// The route of its messages (`None`: the daemon's `route` setting).
    pub fn route(&self) -> Option<Route> {
        self.route
    }

    /// Its invariants: nothing accepted beyond the credit granted, and no credit granted
    /// beyond a window past what the application took (a stream's memory at its consumer).
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.received > self.granted
            || self.granted > self.consumed.max(self.received) + self.window
        {
            return Err(format!(
                "stream {}: received {}, granted {}, consumed {}, window {}",
                self.id, self.received, self.granted, self.consumed, self.window
            ));
        }
        Ok(())
    }

    /// Its credit window: at most this many of its bytes are in flight or unread at a time.
    pub fn window(&self) -> u64 {
        self.window
    }

    /// Its current id (a resumed stream has a new one).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Where its messages go.
    pub fn producer(&self) -> Rank {
        self.producer
    }

    /// Where it stands.
    pub fn status(&self) -> &Status {
        &self.status
    }

    /// Bytes received and checked so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// A chunk arrived. Returns the new bytes to hand to the application (`None`: nothing
    /// new, e.g. a late copy), or the error that ends the stream: a gap, bytes beyond the
    /// credit granted, a digest that does not match (unless the reader checks it: then hand
    /// the application `offset` and `d` with the bytes). The caller closes nothing for those:
    /// the stream fails, other traffic goes on.
    pub fn handle_data(
        &mut self,
        now: Instant,
        offset: u64,
        d: u64,
        bytes: Bytes,
    ) -> Result<Option<Bytes>, StreamError> {
        if self.status != Status::Streaming {
            return Ok(None);
        }
        self.heard = now;
        let end = offset.saturating_add(bytes.len() as u64);
        if offset > self.received {
            // A chunk before it was lost (a connection dropped on the path): resume.
            self.wants_resume = true;
            self.silent = false;
            return Ok(None);
        }
        let err = if offset != self.received {
            Some(StreamError::Protocol(format!(
                "stream {}: a chunk at {offset}, expected {}",
                self.id, self.received
            )))
        } else if end > self.granted {
            Some(StreamError::Protocol(format!(
                "stream {}: bytes up to {end}, credit granted up to {}",
                self.id, self.granted
            )))
        } else if !self.reader_checks && digest::chunk(offset, &bytes) != d {
            Some(StreamError::Corrupt { offset })
        } else {
            None
        };
        if let Some(e) = err {
            // The producer stops too.
            self.out.push_back(StreamMsg::Cancel);
            return Err(self.fail_with(e));
        }
        self.digests = self.digests.wrapping_add(d);
        self.received = end;
        Ok((!bytes.is_empty()).then_some(bytes))
    }

    /// The application took `n` more bytes: credit follows, in steps of half a window.
    pub fn consumed(&mut self, now: Instant, n: u64) {
        // `n` comes from the application: never trusted to be small.
        self.consumed = self.consumed.saturating_add(n).min(self.received);
        let want = self.consumed + self.window;
        if self.status == Status::Streaming && want >= self.granted + self.window / 2 {
            if self.received >= self.granted {
                // The producer was waiting for us, not we for it: the idle clock starts now.
                self.heard = now;
            }
            self.granted = want;
            self.out.push_back(StreamMsg::Credit { upto: want });
        }
    }

    /// The producer ended the stream: `Finished` if every byte arrived and the digests add up.
    /// An end beyond the bytes that arrived means chunks were lost on the way (a connection
    /// dropped on the path, the end came after on a new one): the stream wants to resume,
    /// like a gap.
    pub fn handle_end(&mut self, now: Instant, total: u64, digests: u64) -> &Status {
        if self.status == Status::Streaming && total > self.received {
            self.heard = now;
            self.wants_resume = true;
            self.silent = false;
            return &self.status;
        }
        if self.status == Status::Streaming {
            self.heard = now;
            self.status = if total != self.received {
                Status::Failed(StreamError::Protocol(format!(
                    "stream {}: ended at {total}, {} bytes arrived",
                    self.id, self.received
                )))
            } else if digests != self.digests {
                Status::Failed(StreamError::Corrupt { offset: total })
            } else {
                Status::Finished
            };
        }
        &self.status
    }

    /// The producer failed the stream.
    pub fn handle_fail(&mut self, code: u32, reason: String) {
        self.fail_with(StreamError::Producer { code, reason });
    }

    /// The application gives the stream up: `Cancel` goes to the producer.
    pub fn cancel(&mut self) {
        if self.status == Status::Streaming {
            self.out.push_back(StreamMsg::Cancel);
            self.status = Status::Failed(StreamError::Cancelled);
        }
    }

    /// The producer died.
    pub fn handle_producer_failed(&mut self) {
        self.fail_with(StreamError::ProducerDied(self.producer));
    }

    /// Whether chunks went missing and the stream should resume (a gap, or a probe's answer
    /// that says data or the end was lost).
    pub fn wants_resume(&self) -> bool {
        self.wants_resume && self.status == Status::Streaming
    }

    /// The path to the producer broke (a relay died, a connection on it dropped) while both
    /// live: the stream goes on from the byte it stands at, as stream `new_id` (frames of the
    /// old id are stale from now on). After `limits::STREAM_RESUMES_MAX` resumes it fails
    /// `TimedOut` instead.
    pub fn resume(&mut self, now: Instant, new_id: u64) {
        if self.status != Status::Streaming {
            return;
        }
        self.wants_resume = false;
        self.resumes += 1;
        let silent = std::mem::take(&mut self.silent);
        if self.resumes > crate::limits::STREAM_RESUMES_MAX {
            self.out.push_back(StreamMsg::Cancel);
            self.status = Status::Failed(StreamError::TimedOut);
            return;
        }
        self.id = new_id;
        self.digests = 0;
        // A resume a probe found is no news: the stream still ends `TimedOut` once its idle
        // time passed without any.
        if !silent {
            self.heard = now;
        }
        self.asked_at = now;
        self.out.clear();
        self.granted = self.consumed.max(self.received) + self.window;
        self.push_open();
    }

    fn fail_with(&mut self, e: StreamError) -> StreamError {
        if self.status == Status::Streaming {
            self.status = Status::Failed(e.clone());
        }
        e
    }

    /// When [`Incoming::handle_timeout`] is due: a quarter of the idle time after the last
    /// news, probe or resume (a probe), then the idle time (the end). No clock runs while
    /// every byte granted has arrived: the producer then waits for the application (a slow
    /// consumer), not the other way round.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.status != Status::Streaming || (self.received >= self.granted && !self.wants_resume)
        {
            return None;
        }
        let end = self.heard + self.idle;
        let quarter = self.heard.max(self.asked_at) + self.idle / 4;
        Some(if self.wants_resume {
            end
        } else {
            quarter.min(end)
        })
    }

    /// Time passed: a stream that heard nothing for a quarter of its idle time probes its
    /// producer (`Probe`: a slow service is not asked again, and the answer shows what was
    /// lost); one that heard nothing for its idle time fails `TimedOut`. Returns whether it
    /// probed.
    pub fn handle_timeout(&mut self, now: Instant) -> bool {
        if self.poll_timeout().is_none() {
            return false;
        }
        if now >= self.heard + self.idle {
            self.out.push_back(StreamMsg::Cancel);
            self.status = Status::Failed(StreamError::TimedOut);
        } else if now >= self.heard.max(self.asked_at) + self.idle / 4 {
            self.asked_at = now;
            self.out.push_back(StreamMsg::Probe);
            return true;
        }
        false
    }

    /// The producer's answer to a probe: its data was sent up to `sent` and it holds credit
    /// up to `upto`. Data sent beyond what arrived was lost (the answer follows the data on
    /// its way): the stream wants to resume. Otherwise the producer is slow, not lost: only a
    /// lost credit is granted again. Neither is news for the idle clock (a service that hangs
    /// still times out).
    pub fn handle_position(&mut self, sent: u64, upto: u64) {
        if self.status != Status::Streaming || self.wants_resume {
            return;
        }
        if sent > self.received {
            self.wants_resume = true;
            self.silent = true;
        } else if upto < self.granted {
            self.out.push_back(StreamMsg::Credit { upto: self.granted });
        }
    }

    /// The producer does not have the stream (its `Open` was lost, or it ended the stream and
    /// its end was lost): the stream wants to resume, without news for the idle clock.
    pub fn handle_unknown(&mut self) {
        if self.status == Status::Streaming && !self.wants_resume {
            self.wants_resume = true;
            self.silent = true;
        }
    }

    /// The next message for the producer.
    pub fn poll_msg(&mut self) -> Option<StreamMsg> {
        self.out.pop_front()
    }
}
