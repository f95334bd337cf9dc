//! `Handle::subscribe`: messages for one (peer, tag) on a queue that a thread of the caller's
//! reads, beside the callback form of [`Handle::recv`].
//!
//! Back-pressure without loss: a persistent receive pushes each match onto a queue. When the
//! queue holds [`limits::SUBSCRIPTION_QUEUE_MAX`] messages the callback asks the loop to pause
//! the receive, which cancels it in the node as soon as the callback returns, so further
//! messages wait in the daemon's unmatched list (bounded by `unmatched_max`), in arrival order;
//! once the reader has taken the queue down to half, the receive is posted again and matches
//! them first. Matches the node had made before the pause (from frames already read in the
//! same drain) still join the queue: it may exceed the bound by one read's worth of messages.

use super::caddy::RecvCallback;
use super::handle::{Handle, lock};
use crate::error::RecvError;
use crate::limits;
use crate::rml::{Message, Peer, Tag};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// What the receive's callback and the reader share.
#[derive(Default)]
struct Queue {
    messages: VecDeque<Message>,
    /// The id of the posted receive feeding the queue, `None` while paused (or closed).
    post: Option<u64>,
    /// The subscription was dropped, or the receive could not be posted again.
    closed: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    arrived: Condvar,
}

/// Messages from one peer (or any) with one tag, read on the caller's thread: a blocking
/// [`recv`](Subscription::recv), [`recv_timeout`](Subscription::recv_timeout),
/// [`try_recv`](Subscription::try_recv) or the iterator ([`iter`](Subscription::iter)), in the
/// order the daemon received them. Made by [`Handle::subscribe`]; dropping it cancels the
/// receive (unread messages go with it; later ones wait for the next post of the same (peer,
/// tag)).
///
/// Bounded: at [`limits::SUBSCRIPTION_QUEUE_MAX`] unread messages the daemon stops matching and
/// holds further ones in its unmatched list (`unmatched_max`, where the oldest is dropped with
/// a warning at the bound: plain messages of other receives held there too), and resumes once
/// the reader has caught up. Reliable messages are never dropped: beyond what the daemon
/// holds, RELM leaves them unacknowledged at their origin, whose reliable window
/// (`relm_unacked_max`, one per daemon, for every destination) fills: the origin's reliable
/// sends to every daemon are refused `Busy(ReliableWindow)` until this reader catches up, and
/// what was refused here arrives after the origin's next retransmission (seconds, backed off).
/// Read a subscription that takes reliable traffic promptly.
pub struct Subscription {
    handle: Handle,
    peer: Peer,
    tag: Tag,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("peer", &self.peer)
            .field("tag", &self.tag)
            .finish()
    }
}

/// How often a waiting reader looks whether the daemon stopped.
const STOP_CHECK: Duration = Duration::from_millis(100);

impl Subscription {
    pub(super) fn new(handle: &Handle, peer: Peer, tag: Tag) -> Result<Subscription, RecvError> {
        let s = Subscription {
            handle: handle.clone(),
            peer,
            tag,
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue::default()),
                arrived: Condvar::new(),
            }),
        };
        s.post()?;
        Ok(s)
    }

    /// Posts the persistent receive that feeds the queue.
    fn post(&self) -> Result<(), RecvError> {
        let shared = Arc::clone(&self.shared);
        let (peer, tag) = (self.peer, self.tag);
        let callback: RecvCallback = Box::new(move |m| {
            let mut q = lock(&shared.queue);
            q.messages.push_back(m);
            if q.messages.len() >= limits::SUBSCRIPTION_QUEUE_MAX && q.post.take().is_some() {
                super::caddy::ask_pause();
            }
            drop(q);
            shared.arrived.notify_all();
        });
        // Not under the queue's lock: posting may wait for room in the command channel, and the
        // loop may meanwhile run the callback, which takes that lock. A match before `post` is
        // recorded only delays the pause to the next match.
        let id = self.handle.post(peer, tag, true, callback)?;
        let mut q = lock(&self.shared.queue);
        if q.closed {
            drop(q);
            let _ = self.handle.cancel_post(peer, tag, id);
        } else {
            q.post = Some(id);
        }
        Ok(())
    }

    /// The next message; waits for it. [`RecvError::ShutDown`] once the daemon stopped and
    /// every message that had arrived was read; [`RecvError::InCallback`] from a callback.
    pub fn recv(&self) -> Result<Message, RecvError> {
        self.wait(None)
    }

    /// [`Subscription::recv`], waiting at most `timeout` ([`RecvError::TimedOut`]).
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Message, RecvError> {
        self.wait(Some(Instant::now() + timeout))
    }

    /// The next message if one is waiting; never blocks (callable from a callback).
    pub fn try_recv(&self) -> Option<Message> {
        let m = lock(&self.shared.queue).messages.pop_front();
        self.resume_if_drained();
        m
    }

    /// The messages as a blocking iterator; it ends when the daemon stops (after the messages
    /// that had arrived).
    pub fn iter(&self) -> impl Iterator<Item = Message> + '_ {
        std::iter::from_fn(move || self.recv().ok())
    }

    /// Messages waiting to be read.
    pub fn len(&self) -> usize {
        lock(&self.shared.queue).messages.len()
    }

    /// Whether no message waits to be read.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn wait(&self, deadline: Option<Instant>) -> Result<Message, RecvError> {
        if self.handle.shared.on_loop_thread() {
            return Err(RecvError::InCallback);
        }
        let mut q = lock(&self.shared.queue);
        loop {
            if let Some(m) = q.messages.pop_front() {
                drop(q);
                self.resume_if_drained();
                return Ok(m);
            }
            if q.closed || self.handle.shared.is_stopped() {
                return Err(RecvError::ShutDown);
            }
            if q.post.is_none() {
                // Paused and drained: post again here too, so that a resume refused while the
                // loop had not yet forgotten the paused receive (a duplicate) is retried.
                drop(q);
                self.resume_if_drained();
                q = lock(&self.shared.queue);
                if !q.messages.is_empty() {
                    continue;
                }
            }
            let mut wait = STOP_CHECK;
            if let Some(d) = deadline {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(RecvError::TimedOut);
                }
                wait = wait.min(left);
            }
            q = self
                .shared
                .arrived
                .wait_timeout(q, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Posts the receive again once a paused queue is down to half its bound.
    fn resume_if_drained(&self) {
        let q = lock(&self.shared.queue);
        let paused = q.post.is_none() && !q.closed;
        if !paused || q.messages.len() > limits::SUBSCRIPTION_QUEUE_MAX / 2 {
            return;
        }
        drop(q);
        if self.post().is_err() {
            // Stopped, or (from a callback) the command channel is full: a later read tries
            // again; a stopped daemon ends the reads with ShutDown.
            log::debug!("subscription to tag {}: not posted again yet", self.tag);
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut q = lock(&self.shared.queue);
        q.closed = true;
        if let Some(post) = q.post.take() {
            let _ = self.handle.cancel_post(self.peer, self.tag, post);
        }
    }
}

impl Handle {
    /// Subscribes to messages from `peer` (or [`Peer::Any`]) with `tag`: a [`Subscription`] to
    /// read them from a thread of your own, in arrival order, instead of a callback on the
    /// loop thread. Messages that arrived before are delivered first. It holds the (peer, tag)
    /// post until dropped, except while paused at its bound: a receive posted meanwhile for
    /// the same (peer, tag) takes the messages instead, and the subscription resumes once that
    /// one is gone.
    ///
    /// # Errors
    /// Those of [`Handle::recv`]: a reserved tag, an out-of-range peer, a receive already posted
    /// for exactly (peer, tag) ([`RecvError::Duplicate`]), or [`RecvError::ShutDown`].
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// let mut cfg = tbon::config::Config::default();
    /// cfg.if_include = vec!["127.0.0.1/32".into()];
    /// cfg.key = Some(tbon::Key::generate()?);
    /// let dvm = tbon::launch::local_dvm(cfg, 2)?;
    /// let inbox = dvm[0].subscribe(tbon::Peer::Any, 100)?;
    /// dvm[1].send(0, 100, "hello")?;
    /// let m = inbox.recv_timeout(Duration::from_secs(30))?;
    /// assert_eq!((m.origin, &m.payload[..]), (1, &b"hello"[..]));
    /// # Ok(())
    /// # }
    /// ```
    pub fn subscribe(&self, peer: Peer, tag: Tag) -> Result<Subscription, RecvError> {
        Subscription::new(self, peer, tag)
    }
}
