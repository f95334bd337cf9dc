use super::*;
use proptest::prelude::*;

fn msg(origin: Rank, tag: Tag, body: &'static str) -> Message {
    Message {
        origin,
        tag,
        payload: Bytes::from_static(body.as_bytes()),
    }
}

fn delivered(d: &Dispatch) -> (ReceiveId, bool, &str) {
    match d {
        Dispatch::Deliver { id, retired, msg } => (
            *id,
            *retired,
            std::str::from_utf8(&msg.payload).unwrap_or("?"),
        ),
        other => panic!("expected a delivery, got {other:?}"),
    }
}

#[test]
fn specific_wins_over_wildcard() {
    let mut m = Matcher::new(16);
    let (any, _) = m.post(Peer::Any, 200, true).unwrap();
    let (three, _) = m.post(Peer::Rank(3), 200, true).unwrap();
    assert_eq!(delivered(&m.handle_message(msg(3, 200, "a"))).0, three);
    assert_eq!(delivered(&m.handle_message(msg(4, 200, "b"))).0, any);
    // Other tags match neither.
    assert_eq!(m.handle_message(msg(3, 201, "c")), Dispatch::Held);
}

#[test]
fn one_shot_retires_and_falls_back_to_wildcard() {
    let mut m = Matcher::new(16);
    let (any, _) = m.post(Peer::Any, 200, true).unwrap();
    let (once, _) = m.post(Peer::Rank(3), 200, false).unwrap();
    assert_eq!(
        delivered(&m.handle_message(msg(3, 200, "a"))),
        (once, true, "a")
    );
    assert_eq!(m.posted_len(), 1);
    assert_eq!(
        delivered(&m.handle_message(msg(3, 200, "b"))),
        (any, false, "b")
    );
    // The one-shot is gone: posting it again is allowed.
    assert!(m.post(Peer::Rank(3), 200, false).is_ok());
}

#[test]
fn persistent_stays() {
    let mut m = Matcher::new(16);
    let (id, _) = m.post(Peer::Rank(1), 150, true).unwrap();
    for _ in 0..3 {
        assert_eq!(
            delivered(&m.handle_message(msg(1, 150, "x"))),
            (id, false, "x")
        );
    }
    assert_eq!(m.posted_len(), 1);
}

#[test]
fn unmatched_then_persistent_takes_all_in_order() {
    let mut m = Matcher::new(16);
    for (o, t, b) in [(1, 200, "a"), (2, 200, "b"), (1, 300, "c"), (5, 200, "d")] {
        assert_eq!(m.handle_message(msg(o, t, b)), Dispatch::Held);
    }
    let (id, ds) = m.post(Peer::Any, 200, true).unwrap();
    let got: Vec<_> = ds.iter().map(delivered).collect();
    assert_eq!(
        got,
        vec![(id, false, "a"), (id, false, "b"), (id, false, "d")]
    );
    assert_eq!(m.unmatched_len(), 1);
    assert_eq!(m.posted_len(), 1);
}

#[test]
fn unmatched_then_one_shot_takes_first_only() {
    let mut m = Matcher::new(16);
    m.handle_message(msg(2, 200, "a"));
    m.handle_message(msg(1, 200, "b"));
    m.handle_message(msg(1, 200, "c"));
    let (id, ds) = m.post(Peer::Rank(1), 200, false).unwrap();
    let got: Vec<_> = ds.iter().map(delivered).collect();
    assert_eq!(got, vec![(id, true, "b")]);
    assert_eq!(m.posted_len(), 0, "a satisfied one-shot is not posted");
    assert_eq!(m.unmatched_len(), 2);
    // A one-shot with nothing held stays posted.
    let (id2, ds) = m.post(Peer::Rank(9), 200, false).unwrap();
    assert!(ds.is_empty());
    assert_ne!(id, id2);
    assert_eq!(m.posted_len(), 1);
}

#[test]
fn cancel_is_exact() {
    let mut m = Matcher::new(16);
    let (any, _) = m.post(Peer::Any, 200, true).unwrap();
    let (three, _) = m.post(Peer::Rank(3), 200, true).unwrap();
    assert_eq!(m.cancel(Peer::Rank(4), 200), None);
    assert_eq!(m.cancel(Peer::Rank(3), 201), None);
    assert_eq!(m.cancel(Peer::Rank(3), 200), Some(three));
    assert_eq!(m.cancel(Peer::Rank(3), 200), None);
    assert_eq!(delivered(&m.handle_message(msg(3, 200, "a"))).0, any);
    assert_eq!(m.cancel(Peer::Any, 200), Some(any));
    assert_eq!(m.handle_message(msg(3, 200, "b")), Dispatch::Held);
}

#[test]
fn receive_id_names_the_exact_posted_receive_and_changes_nothing() {
    let mut m = Matcher::new(16);
    let (any, _) = m.post(Peer::Any, 200, true).unwrap();
    let (three, _) = m.post(Peer::Rank(3), 200, false).unwrap();
    assert_eq!(m.receive_id(Peer::Any, 200), Some(any));
    assert_eq!(m.receive_id(Peer::Rank(3), 200), Some(three));
    assert_eq!(m.receive_id(Peer::Rank(4), 200), None);
    assert_eq!(m.posted_len(), 2);
    // A retired one-shot is no longer named.
    assert_eq!(delivered(&m.handle_message(msg(3, 200, "a"))).0, three);
    assert_eq!(m.receive_id(Peer::Rank(3), 200), None);
    assert_eq!(m.cancel(Peer::Any, 200), Some(any));
    assert_eq!(m.receive_id(Peer::Any, 200), None);
}

#[test]
fn duplicate_post_is_refused_without_side_effects() {
    let mut m = Matcher::new(16);
    let (id, _) = m.post(Peer::Rank(3), 200, false).unwrap();
    let err = m.post(Peer::Rank(3), 200, true).unwrap_err();
    assert_eq!(
        err,
        PostError::Duplicate {
            peer: Peer::Rank(3),
            tag: 200
        }
    );
    assert!(err.to_string().contains("already posted"));
    // Different peer or tag is not a duplicate.
    m.post(Peer::Any, 200, true).unwrap();
    m.post(Peer::Rank(3), 201, true).unwrap();
    assert_eq!(delivered(&m.handle_message(msg(3, 200, "a"))).0, id);
}

#[test]
fn purge_drops_receives_and_held_messages_of_one_peer() {
    let mut m = Matcher::new(16);
    let (a, _) = m.post(Peer::Rank(3), 200, true).unwrap();
    let (b, _) = m.post(Peer::Rank(3), 201, false).unwrap();
    let (any, _) = m.post(Peer::Any, 202, true).unwrap();
    m.post(Peer::Rank(4), 200, true).unwrap();
    m.handle_message(msg(3, 300, "x"));
    m.handle_message(msg(4, 300, "y"));
    m.handle_message(msg(3, 301, "z"));
    assert_eq!(m.purge(3), (vec![a, b], 2));
    assert_eq!(m.posted_len(), 2);
    assert_eq!(m.unmatched_len(), 1);
    assert_eq!(delivered(&m.handle_message(msg(3, 202, "w"))).0, any);
    assert_eq!(m.purge(3), (vec![], 0));
    // The surviving held message is still found by a later post.
    let (id, ds) = m.post(Peer::Any, 300, false).unwrap();
    assert_eq!(
        ds.iter().map(delivered).collect::<Vec<_>>(),
        vec![(id, true, "y")]
    );
}

#[test]
fn bound_evicts_oldest() {
    let mut m = Matcher::new(2);
    assert_eq!(m.handle_message(msg(1, 200, "a")), Dispatch::Held);
    assert_eq!(m.handle_message(msg(1, 201, "b")), Dispatch::Held);
    assert_eq!(
        m.handle_message(msg(1, 202, "c")),
        Dispatch::HeldEvicted(msg(1, 200, "a"))
    );
    assert_eq!(m.unmatched_len(), 2);
    // The evicted message is really gone.
    let (_, ds) = m.post(Peer::Any, 200, true).unwrap();
    assert!(ds.is_empty());
    // A bound of zero is clamped to one.
    let mut z = Matcher::new(0);
    assert_eq!(z.unmatched_max(), 1);
    assert_eq!(z.handle_message(msg(1, 200, "a")), Dispatch::Held);
    assert_eq!(
        z.handle_message(msg(1, 200, "b")),
        Dispatch::HeldEvicted(msg(1, 200, "a"))
    );
}

#[test]
fn try_handle_refuses_instead_of_evicting() {
    let mut m = Matcher::new(2);
    assert_eq!(m.try_handle_message(msg(1, 200, "a")), Ok(Dispatch::Held));
    assert_eq!(m.try_handle_message(msg(1, 201, "b")), Ok(Dispatch::Held));
    // Full, and nothing posted for it: handed back, nothing changes.
    assert_eq!(
        m.try_handle_message(msg(2, 202, "c")),
        Err(msg(2, 202, "c"))
    );
    assert_eq!(m.unmatched_len(), 2);
    // A message a receive wants is delivered even with the list full.
    let (any, _) = m.post(Peer::Any, 300, true).unwrap();
    let (three, _) = m.post(Peer::Rank(3), 301, false).unwrap();
    assert_eq!(
        delivered(&m.try_handle_message(msg(4, 300, "d")).unwrap()),
        (any, false, "d")
    );
    assert_eq!(
        delivered(&m.try_handle_message(msg(3, 301, "e")).unwrap()),
        (three, true, "e")
    );
    // The one-shot is gone: the next one for it is refused again.
    assert!(m.try_handle_message(msg(3, 301, "f")).is_err());
    // Both held messages are still there, in order.
    let (id, ds) = m.post(Peer::Rank(1), 200, true).unwrap();
    assert_eq!(
        ds.iter().map(delivered).collect::<Vec<_>>(),
        vec![(id, false, "a")]
    );
    assert_eq!(m.try_handle_message(msg(5, 203, "g")), Ok(Dispatch::Held));
    assert_eq!(m.unmatched_len(), 2);
}

#[test]
fn persistent_post_taking_many_is_linear() {
    // 50,000 held messages, half of them taken by one post: quadratic removal would take
    // seconds, a single pass takes milliseconds.
    let mut m = Matcher::new(100_000);
    for i in 0..50_000u32 {
        m.handle_message(msg(i % 7, 200 + (i % 2), "p"));
    }
    let (_, ds) = m.post(Peer::Any, 200, true).unwrap();
    assert_eq!(ds.len(), 25_000);
    assert_eq!(m.unmatched_len(), 25_000);
}

// ---- proptest against a naive reference model -------------------------------------------------

/// The obvious, slow implementation of the same rules.
#[derive(Default)]
struct Model {
    posted: Vec<(Peer, Tag, ReceiveId, bool)>,
    held: Vec<Message>,
    max: usize,
    next: u64,
}

impl Model {
    fn find(&self, peer: Peer, tag: Tag) -> Option<usize> {
        self.posted
            .iter()
            .position(|&(p, t, _, _)| p == peer && t == tag)
    }

    fn post(
        &mut self,
        peer: Peer,
        tag: Tag,
        persistent: bool,
    ) -> Result<(ReceiveId, Vec<Dispatch>), PostError> {
        if self.find(peer, tag).is_some() {
            return Err(PostError::Duplicate { peer, tag });
        }
        let id = ReceiveId(self.next);
        self.next += 1;
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.held.len() {
            let h = &self.held[i];
            if h.tag == tag && peer.matches(h.origin) {
                let msg = self.held.remove(i);
                out.push(Dispatch::Deliver {
                    id,
                    retired: !persistent,
                    msg,
                });
                if !persistent {
                    return Ok((id, out));
                }
            } else {
                i += 1;
            }
        }
        self.posted.push((peer, tag, id, persistent));
        Ok((id, out))
    }

    fn handle(&mut self, msg: Message) -> Dispatch {
        let hit = self
            .find(Peer::Rank(msg.origin), msg.tag)
            .or_else(|| self.find(Peer::Any, msg.tag));
        if let Some(i) = hit {
            let (_, _, id, persistent) = self.posted[i];
            if !persistent {
                self.posted.remove(i);
            }
            return Dispatch::Deliver {
                id,
                retired: !persistent,
                msg,
            };
        }
        self.held.push(msg);
        if self.held.len() > self.max {
            Dispatch::HeldEvicted(self.held.remove(0))
        } else {
            Dispatch::Held
        }
    }

    fn cancel(&mut self, peer: Peer, tag: Tag) -> Option<ReceiveId> {
        self.find(peer, tag).map(|i| self.posted.remove(i).2)
    }

    fn purge(&mut self, peer: Rank) -> (Vec<ReceiveId>, usize) {
        let mut ids: Vec<_> = self
            .posted
            .iter()
            .filter(|p| p.0 == Peer::Rank(peer))
            .map(|p| p.2)
            .collect();
        ids.sort();
        self.posted.retain(|p| p.0 != Peer::Rank(peer));
        let before = self.held.len();
        self.held.retain(|m| m.origin != peer);
        (ids, before - self.held.len())
    }
}

#[derive(Debug, Clone)]
enum Op {
    Post(Peer, Tag, bool),
    Msg(Rank, Tag, u8),
    Cancel(Peer, Tag),
    Purge(Rank),
}

fn peer() -> impl Strategy<Value = Peer> {
    prop_oneof![Just(Peer::Any), (0u32..4).prop_map(Peer::Rank)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (peer(), 0u32..3, any::<bool>()).prop_map(|(p, t, b)| Op::Post(p, t, b)),
        6 => (0u32..4, 0u32..3, any::<u8>()).prop_map(|(o, t, b)| Op::Msg(o, t, b)),
        2 => (peer(), 0u32..3).prop_map(|(p, t)| Op::Cancel(p, t)),
        1 => (0u32..4).prop_map(Op::Purge),
    ]
}

proptest! {
    #[test]
    fn matches_reference_model(max in 1usize..6, ops in proptest::collection::vec(op(), 0..200)) {
        let mut real = Matcher::new(max);
        let mut model = Model { max, ..Model::default() };
        for op in ops {
            match op {
                Op::Post(p, t, persistent) => {
                    prop_assert_eq!(real.post(p, t, persistent), model.post(p, t, persistent));
                }
                Op::Msg(o, t, b) => {
                    let m = Message { origin: o, tag: t, payload: Bytes::from(vec![b]) };
                    prop_assert_eq!(real.handle_message(m.clone()), model.handle(m));
                }
                Op::Cancel(p, t) => prop_assert_eq!(real.cancel(p, t), model.cancel(p, t)),
                Op::Purge(r) => prop_assert_eq!(real.purge(r), model.purge(r)),
            }
            prop_assert_eq!(real.unmatched_len(), model.held.len());
            prop_assert_eq!(real.posted_len(), model.posted.len());
            let per_tag: usize = real.held_per_tag.values().sum();
            prop_assert_eq!(per_tag, real.unmatched_len());
        }
    }
}

/// The last match is remembered (no lookup for a stream from one origin on one tag), and never
/// answers differently from the posted receives: a receive posted, cancelled or purged after it
/// takes effect at the next message.
#[test]
fn the_remembered_match_follows_every_change_of_the_posted_receives() {
    let mut m = Matcher::new(16);
    let (any, _) = m.post(Peer::Any, 200, true).unwrap();
    assert_eq!(delivered(&m.handle_message(msg(3, 200, "a"))).0, any);
    assert_eq!(delivered(&m.handle_message(msg(3, 200, "b"))).0, any);
    // A specific receive posted now wins from the next message on.
    let (three, _) = m.post(Peer::Rank(3), 200, true).unwrap();
    assert_eq!(delivered(&m.handle_message(msg(3, 200, "c"))).0, three);
    assert_eq!(delivered(&m.handle_message(msg(3, 200, "d"))).0, three);
    // Cancelled: the wildcard again.
    assert_eq!(m.cancel(Peer::Rank(3), 200), Some(three));
    assert_eq!(delivered(&m.handle_message(msg(3, 200, "e"))).0, any);
    // Purging rank 3 leaves the wildcard; cancelling it holds what comes next.
    let (three, _) = m.post(Peer::Rank(3), 200, true).unwrap();
    assert_eq!(delivered(&m.handle_message(msg(3, 200, "f"))).0, three);
    let _ = m.purge(3);
    assert_eq!(delivered(&m.handle_message(msg(3, 200, "g"))).0, any);
    assert_eq!(m.cancel(Peer::Any, 200), Some(any));
    assert_eq!(m.handle_message(msg(3, 200, "h")), Dispatch::Held);
    // Another origin or tag is looked up, not taken from the last match.
    let (five, _) = m.post(Peer::Rank(5), 201, true).unwrap();
    assert_eq!(delivered(&m.handle_message(msg(5, 201, "i"))).0, five);
    assert_eq!(m.handle_message(msg(5, 202, "j")), Dispatch::Held);
    assert_eq!(m.handle_message(msg(6, 201, "k")), Dispatch::Held);
}

#[test]
fn a_persistent_match_is_reported_only_for_a_persistent_receive() {
    let mut m = Matcher::new(4);
    assert_eq!(m.match_persistent(1, 300), None);
    let (once, _) = m.post(Peer::Rank(1), 300, false).unwrap();
    // A one-shot is never the receive of a run: it retires at its first match.
    assert_eq!(m.match_persistent(1, 300), None);
    assert_eq!(
        delivered(&m.handle_message(msg(1, 300, "a"))),
        (once, true, "a")
    );
    let (any, _) = m.post(Peer::Any, 300, true).unwrap();
    assert_eq!(m.match_persistent(1, 300), Some(any));
    assert_eq!(m.match_persistent(2, 300), Some(any));
    // A specific receive wins over the wildcard, also after the cache answered.
    let (specific, _) = m.post(Peer::Rank(2), 300, true).unwrap();
    assert_eq!(m.match_persistent(2, 300), Some(specific));
    assert_eq!(m.match_persistent(1, 300), Some(any));
    m.cancel(Peer::Any, 300);
    assert_eq!(m.match_persistent(1, 300), None);
    assert_eq!(m.handle_message(msg(1, 300, "b")), Dispatch::Held);
}
