//! Streams from the application's side: [`Handle::serve`] offers a service that answers
//! requests with streams, [`Handle::fetch`] asks a producer for one (issue "Streams").

use super::caddy::{Caddy, Fetch, Reply, StreamSink};
use super::handle::Handle;
use super::stream_reader::{Stream, StreamItem};
use super::stream_writer::StreamWriter;
use crate::Rank;
use crate::direct::Route;
use crate::error::SendError;
use crate::limits;
use crate::node::StreamCommand;
use bytes::Bytes;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// What a consumer asked a service for, as its handler gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRequest {
    /// The consumer's rank.
    pub consumer: Rank,
    /// The service asked.
    pub service: String,
    /// The consumer's request bytes (at most `limits::STREAM_REQUEST_MAX`).
    pub request: Bytes,
    /// The byte of the answer to start at: 0 for a new stream; for a stream the consumer
    /// resumed after its path broke, the byte it stands at. The handler must start there.
    pub offset: u64,
}

/// A service's handler: called on a thread of its own for every stream a consumer opens.
pub type ServiceHandler = dyn Fn(StreamRequest, StreamWriter) + Send + Sync + 'static;

/// How a stream is fetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchOptions {
    /// The bytes the producer may send ahead of what the application took (the credit
    /// window; at most `limits::STREAM_WINDOW_MAX`, a larger one is cut to it, and at least
    /// `limits::STREAM_WINDOW_MIN` (64 KiB), a smaller one is raised to it): this bounds the
    /// stream's memory here and on every relay, and with the round trip its rate. Default
    /// 4 MiB; 0 means the default (as in C's `tbon_fetch_opts`).
    pub window: u32,
    /// How long the stream waits for data from the producer while it owes us bytes before it
    /// fails `TimedOut`, never longer: a service must send its first bytes within it. Each
    /// quarter of it without news probes the producer, which says where it stands: the
    /// stream resumes only if bytes were lost on the way (the service is then called again
    /// from the byte the stream stands at), never for a slow service. A reader that holds
    /// every granted byte runs no clock. Default 60 s; zero means the default (as in C's
    /// `tbon_fetch_opts`).
    pub idle: Duration,
    /// The stream's own route, both ways (the producer follows the consumer's choice):
    /// `Some(Route::Direct)` asks for a direct link to the producer, `Some(Route::Tree)` does
    /// not, whatever the daemons' `route` settings (the producer must still grant a link, see
    /// README "Direct links"). Default `None`: the settings decide, as for a message.
    pub route: Option<Route>,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions {
            window: 4 << 20,
            idle: Duration::from_secs(60),
            route: None,
        }
    }
}

impl FetchOptions {
    /// The options a fetch runs with: zeros are the defaults (a zero window crawled a byte at
    /// a time and a zero idle time failed the stream at once, where C's zeros mean the
    /// defaults: found by an outside-in review), the window cut to `STREAM_WINDOW_MAX` and
    /// raised to `STREAM_WINDOW_MIN`.
    fn in_force(self) -> Self {
        let d = FetchOptions::default();
        FetchOptions {
            window: if self.window == 0 {
                d.window
            } else {
                self.window.clamp(
                    limits::STREAM_WINDOW_MIN as u32,
                    limits::STREAM_WINDOW_MAX as u32,
                )
            },
            idle: if self.idle.is_zero() {
                d.idle
            } else {
                self.idle
            },
            route: self.route,
        }
    }
}

impl Handle {
    /// Offers `service` to consumers: `handler` runs on a thread of its own for each stream
    /// opened (at most `limits::STREAMS_MAX` at a time; beyond that the consumer reads
    /// `Producer` with code `FAIL_NO_ROOM`), with the request and a [`StreamWriter`]. Serving
    /// a name again replaces its handler for new streams. A stop of the daemon (`shutdown`,
    /// `abort`, dropping the [`Daemon`](crate::Daemon)) fails every writer `ShutDown` and
    /// waits for the handlers still running to return, so a handler must return once its
    /// writer fails.
    ///
    /// Errors: a name longer than `limits::STREAM_SERVICE_MAX` bytes (`TooLarge`), a full
    /// service table (`Busy`, `limits::STREAM_SERVICES_MAX`), a stopped daemon. Called from a
    /// callback (on the loop thread), it does not wait for the loop's answer: a refusal is
    /// then only logged.
    pub fn serve(
        &self,
        service: &str,
        handler: impl Fn(StreamRequest, StreamWriter) + Send + Sync + 'static,
    ) -> Result<(), SendError> {
        if service.len() > limits::STREAM_SERVICE_MAX {
            return Err(SendError::TooLarge {
                len: service.len(),
                max: limits::STREAM_SERVICE_MAX,
            });
        }
        let handler: Arc<ServiceHandler> = Arc::new(handler);
        self.ask(|reply| Caddy::Serve {
            service: service.to_string(),
            handler,
            reply,
        })
    }

    /// Fetches `request` from `service` at `producer` as a [`Stream`] with the default
    /// [`FetchOptions`]. See [`Handle::fetch_with`]. The request is anything that becomes
    /// [`Bytes`] without a borrow (a `Vec<u8>`, a `String`, a `&'static [u8]`); copy a borrowed
    /// slice with `Bytes::copy_from_slice`. `producer` may be this daemon itself.
    pub fn fetch(
        &self,
        producer: Rank,
        service: &str,
        request: impl Into<Bytes>,
    ) -> Result<Stream, SendError> {
        self.fetch_with(producer, service, request, FetchOptions::default())
    }

    /// Fetches `request` from `service` at `producer` as a [`Stream`] (read it as a blocking
    /// iterator or with `std::io::Read`). The stream goes over a direct link when one is open
    /// or may be negotiated under the route setting, otherwise through the tree; it resumes
    /// at the byte it stands at when a relay dies or a link is lost.
    ///
    /// Errors: `producer` out of range, a service name or request beyond its bound
    /// (`TooLarge`), and from the loop: the producer known dead (`NodeDown`), a full stream
    /// table (`Busy`, `limits::STREAMS_MAX`), a stopped daemon. Called on the loop thread,
    /// the loop's refusals arrive as the stream's error (`Refused`) instead. What happens at
    /// the producer (no such service, its failure or death) is the stream's error.
    pub fn fetch_with(
        &self,
        producer: Rank,
        service: &str,
        request: impl Into<Bytes>,
        opts: FetchOptions,
    ) -> Result<Stream, SendError> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let sink = StreamSink {
            deliver: Box::new(move |item, check| {
                // The reader may be gone (dropped: its cancel follows): nothing to keep.
                let _ = tx.send((item, check));
            }),
            reader_reports: true,
        };
        let opts = opts.in_force();
        let id = self.open_stream(producer, service, request.into(), opts, sink)?;
        Ok(Stream::new(self.shared.clone(), id, rx, opts.window))
    }

    /// Fetches like [`Handle::fetch_with`] and calls `callback` on the loop thread for each
    /// chunk in order and then once for the end (it must not block). A chunk counts as
    /// consumed, and the producer gets credit for it, when the callback returns. Returns the
    /// stream's id for [`Handle::cancel_stream`].
    pub fn fetch_callback(
        &self,
        producer: Rank,
        service: &str,
        request: impl Into<Bytes>,
        opts: FetchOptions,
        callback: impl FnMut(StreamItem) + Send + 'static,
    ) -> Result<u64, SendError> {
        let mut callback = callback;
        let sink = StreamSink {
            // Checked by the node before it gets here (`reader_reports` is false).
            deliver: Box::new(move |item, _| callback(item)),
            reader_reports: false,
        };
        self.open_stream(producer, service, request.into(), opts, sink)
    }

    /// Cancels stream `id` fetched by this daemon; nothing happens if it already ended.
    pub fn cancel_stream(&self, id: u64) {
        self.shared.submit_or_log(Caddy::StreamCancel { id });
    }

    fn open_stream(
        &self,
        producer: Rank,
        service: &str,
        request: Bytes,
        opts: FetchOptions,
        sink: StreamSink,
    ) -> Result<u64, SendError> {
        if producer >= self.shared.size {
            return Err(SendError::RankOutOfRange {
                rank: producer,
                size: self.shared.size,
            });
        }
        if service.len() > limits::STREAM_SERVICE_MAX {
            return Err(SendError::TooLarge {
                len: service.len(),
                max: limits::STREAM_SERVICE_MAX,
            });
        }
        if request.len() > limits::STREAM_REQUEST_MAX {
            return Err(SendError::TooLarge {
                len: request.len(),
                max: limits::STREAM_REQUEST_MAX,
            });
        }
        let id = self.shared.next_stream.fetch_add(1, Ordering::Relaxed);
        let command = StreamCommand::Fetch {
            id,
            producer,
            service: service.to_string(),
            request,
            window: opts.in_force().window,
            idle: opts.in_force().idle,
            route: opts.route,
            // A `Stream` reader checks each chunk's digest on its own thread.
            reader_checks: sink.reader_reports,
        };
        self.ask(|reply| {
            Caddy::Fetch(Box::new(Fetch {
                command,
                id,
                sink,
                reply,
            }))
        })?;
        Ok(id)
    }

    /// Submits a command that answers on `reply`, and waits for the answer unless on the
    /// loop thread (where waiting would deadlock: the loop answers into the void then).
    pub(super) fn ask(&self, caddy: impl FnOnce(Reply) -> Caddy) -> Result<(), SendError> {
        if self.shared.on_loop_thread() {
            return self.shared.submit(caddy(None));
        }
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.shared.submit(caddy(Some(tx)))?;
        rx.recv().unwrap_or(Err(SendError::ShutDown))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeros_in_fetch_options_are_the_defaults_and_the_window_is_cut() {
        let d = FetchOptions::default();
        let zeros = FetchOptions {
            window: 0,
            idle: Duration::ZERO,
            route: Some(Route::Tree),
        };
        assert_eq!(
            zeros.in_force(),
            FetchOptions {
                route: Some(Route::Tree),
                ..d
            }
        );
        let huge = FetchOptions {
            window: u32::MAX,
            idle: Duration::from_millis(5),
            route: None,
        };
        assert_eq!(huge.in_force().window, limits::STREAM_WINDOW_MAX as u32);
        assert_eq!(huge.in_force().idle, Duration::from_millis(5));
        assert_eq!(d.in_force(), d);
        // A window of a byte crawled (a frame per byte on every daemon of the path).
        let tiny = FetchOptions { window: 1, ..d };
        assert_eq!(tiny.in_force().window, limits::STREAM_WINDOW_MIN as u32);
    }
}
