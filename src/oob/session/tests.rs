//! Two peers' sessions over a model connection that breaks: whatever was on it when it broke
//! (written, partly read, not acknowledged), every frame arrives once and in order.

use super::*;
use proptest::prelude::*;
use std::collections::VecDeque;

/// One direction of a pair: the sender's session, the frames on the current connection not
/// yet read, and the receiver's session with what it took.
struct Pair {
    out: Outbound<Each<u64>>,
    inb: Inbound,
    /// On the connection, in order: `Some(frame)` or `None` for the `Start`.
    wire: VecDeque<Option<u64>>,
    /// Frames waiting for a connection (never written).
    waiting: VecDeque<u64>,
    next: u64,
    taken: Vec<u64>,
    up: bool,
    /// The numbers of the Starts on the wire, in order.
    starts: Vec<(u64, u64)>,
}

impl Pair {
    fn new(max_bytes: usize) -> Self {
        let mut p = Pair {
            out: Outbound::new(max_bytes, 1, true),
            inb: Inbound::default(),
            wire: VecDeque::new(),
            waiting: VecDeque::new(),
            next: 0,
            taken: Vec::new(),
            up: false,
            starts: Vec::new(),
        };
        p.connect();
        p
    }

    /// A new connection: the receiver's `Start` reaches the sender, which resumes.
    fn connect(&mut self) {
        self.up = true;
        let Control::Start { session, count } = self.inb.connection_up() else {
            panic!("connection_up gives a Start");
        };
        let (resume, again, _) = self
            .out
            .handle_peer_start(session, count)
            .expect("a Start from a correct receiver");
        let again: Vec<u64> = again.collect();
        let Control::Resume { session, first } = resume else {
            panic!("handle_peer_start gives a Resume");
        };
        // The Resume is the session's first frame on the connection: the test keeps its
        // numbers beside it.
        self.wire.push_back(None);
        self.starts.push((session, first));
        for f in again {
            self.write(f);
        }
        while !self.out.at_bound() {
            let Some(f) = self.waiting.pop_front() else {
                break;
            };
            self.write(f);
        }
    }

    fn write(&mut self, f: u64) {
        self.wire.push_back(Some(f));
        self.out.written(f, 100);
    }

    fn send(&mut self) {
        let f = self.next;
        self.next += 1;
        if self.up && !self.out.at_bound() {
            self.write(f);
        } else {
            self.waiting.push_back(f);
        }
    }

    /// The receiver reads one frame (and may acknowledge).
    fn read(&mut self) {
        let Some(item) = self.wire.pop_front() else {
            return;
        };
        match item {
            None => {
                let (session, first) = self.starts.remove(0);
                self.inb.handle_resume(session, first).expect("one Resume");
            }
            Some(f) => {
                if self.inb.accept().expect("after the Start") {
                    self.taken.push(f);
                }
                // The driver acknowledges each batch it reads; here every fourth frame.
                if self.taken.len().is_multiple_of(4)
                    && let Some(Control::Ack { session, count }) = self.inb.poll_ack()
                {
                    self.out
                        .handle_ack(session, count)
                        .expect("acks what was sent");
                }
            }
        }
    }

    fn ack_timer(&mut self) {
        if let Some(Control::Ack { session, count }) = self.inb.poll_ack() {
            self.out
                .handle_ack(session, count)
                .expect("acks what was sent");
        }
    }

    /// The connection breaks: what was on it is gone.
    fn cut(&mut self) {
        self.wire.clear();
        self.starts.clear();
        self.up = false;
    }
}

#[test]
fn a_break_loses_and_duplicates_nothing() {
    let mut p = Pair::new(1 << 20);
    for _ in 0..10 {
        p.send();
    }
    for _ in 0..4 {
        p.read();
    } // the Resume and three frames read, none acknowledged
    p.cut();
    for _ in 0..3 {
        p.send();
    }
    p.connect();
    while !p.wire.is_empty() {
        p.read();
    }
    assert_eq!(p.taken, (0..13).collect::<Vec<_>>());
}

#[test]
fn acknowledged_frames_are_released_and_not_written_again() {
    let mut p = Pair::new(1 << 20);
    for _ in 0..5 {
        p.send();
    }
    while !p.wire.is_empty() {
        p.read();
    }
    p.ack_timer();
    assert_eq!(p.out.unacked_frames(), 0);
    p.cut();
    p.connect();
    assert_eq!(p.wire.len(), 1, "only the Resume: nothing goes again");
    p.read();
    assert_eq!(p.taken, (0..5).collect::<Vec<_>>());
}

#[test]
fn a_reset_starts_a_new_count_and_gives_up_the_unconfirmed() {
    let mut p = Pair::new(1 << 20);
    for _ in 0..4 {
        p.send();
    }
    p.read(); // the Resume
    p.read(); // frame 0
    p.cut();
    assert_eq!(p.out.reset(), 4);
    p.send(); // frame 4, first of the new session
    p.connect();
    while !p.wire.is_empty() {
        p.read();
    }
    assert_eq!(p.taken, vec![0, 4]);
}

#[test]
fn the_bound_holds_frames_back_until_acknowledged() {
    let mut p = Pair::new(300);
    for _ in 0..5 {
        p.send();
    }
    assert_eq!(p.out.unacked_frames(), 3, "written up to the bound");
    assert!(p.out.at_bound());
    assert_eq!(p.waiting.len(), 2);
    while !p.wire.is_empty() {
        p.read();
    }
    p.ack_timer();
    assert!(!p.out.at_bound());
}

#[test]
fn bad_controls_are_errors() {
    let mut out: Outbound<Each<u64>> = Outbound::new(1000, 1, true);
    out.written(7, 10);
    assert_eq!(
        out.handle_ack(1, 2),
        Err(SessionError::AckBeyondSent { count: 2, sent: 1 })
    );
    assert_eq!(
        out.handle_ack(9, 5),
        Ok(0),
        "another session's ack is stale"
    );
    let mut inb = Inbound::default();
    inb.connection_up();
    assert!(matches!(inb.accept(), Err(SessionError::OutOfOrder(_))));
    assert_eq!(inb.handle_resume(1, 0), Ok(Started::New));
    assert!(matches!(
        inb.handle_resume(1, 0),
        Err(SessionError::OutOfOrder(_))
    ));
    // A Start holding more than was written, or less than it acknowledged.
    let mut out: Outbound<Each<u64>> = Outbound::new(1000, 1, true);
    out.written(1, 10);
    out.written(2, 10);
    assert!(out.handle_peer_start(1, 3).is_err());
    assert_eq!(out.handle_ack(1, 2), Ok(2));
    assert!(matches!(
        out.handle_peer_start(1, 1),
        Err(SessionError::CountBelowAcked { count: 1, acked: 2 })
    ));
    let h = Control::Ack {
        session: 3,
        count: 4,
    }
    .header(1, 2);
    assert_eq!(
        Control::decode(&h, 0),
        Ok(Control::Ack {
            session: 3,
            count: 4
        })
    );
    assert!(Control::decode(&h, 1).is_err());
    assert!(Control::decode(&Header { tag: 9, ..h }, 0).is_err());
    assert!(
        Control::decode(
            &Header {
                kind: Kind::Msg,
                ..h
            },
            0
        )
        .is_err()
    );
}

#[test]
fn a_resume_beyond_the_count_is_a_gap() {
    let mut inb = Inbound::default();
    inb.connection_up();
    inb.handle_resume(1, 0).unwrap();
    assert_eq!(inb.accept(), Ok(true));
    inb.connection_up();
    assert_eq!(inb.handle_resume(1, 5), Ok(Started::Gap { lost: 4 }));
}

/// A receiver that forgot the session (a frame of it broke the protocol) makes the sender give
/// up what it had not seen confirmed, instead of writing the offending frame again.
#[test]
fn a_receiver_that_forgot_the_session_gets_a_new_one() {
    let mut p = Pair::new(1 << 20);
    for _ in 0..3 {
        p.send();
    }
    p.read(); // the Resume
    p.read(); // frame 0; frame 1 "breaks the protocol"
    p.cut();
    p.inb.refuse();
    p.send();
    p.connect();
    while !p.wire.is_empty() {
        p.read();
    }
    assert_eq!(
        p.taken,
        vec![0, 3],
        "frames 1 and 2 given up, frame 3 in a new session"
    );
}

#[derive(Debug, Clone)]
enum Step {
    Send,
    Read,
    Ack,
    Cut,
    Connect,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => Just(Step::Send),
        6 => Just(Step::Read),
        2 => Just(Step::Ack),
        1 => Just(Step::Cut),
        1 => Just(Step::Connect),
    ]
}

proptest! {
    /// Any interleaving of sends, reads, acknowledgements, breaks and reconnections: once the
    /// last connection is drained, the receiver took every frame exactly once, in order, and
    /// the sender never held more than its bound plus one frame.
    #[test]
    fn every_frame_once_in_order(steps in proptest::collection::vec(step(), 1..400), bound in 1usize..2000) {
        let mut p = Pair::new(bound);
        for s in steps {
            match s {
                Step::Send => p.send(),
                Step::Read => p.read(),
                Step::Ack => p.ack_timer(),
                Step::Cut => if p.up { p.cut() },
                Step::Connect => if !p.up { p.connect() },
            }
            prop_assert!(p.out.unacked_bytes() <= bound + 100);
            // Frames waiting for room go as acknowledgements make it.
            while p.up && !p.out.at_bound() {
                let Some(f) = p.waiting.pop_front() else { break };
                p.write(f);
            }
        }
        if !p.up {
            p.connect();
        }
        loop {
            while !p.wire.is_empty() {
                p.read();
            }
            p.ack_timer();
            if p.waiting.is_empty() {
                break;
            }
            while !p.out.at_bound() {
                let Some(f) = p.waiting.pop_front() else { break };
                p.write(f);
            }
        }
        prop_assert_eq!(p.taken, (0..p.next).collect::<Vec<_>>());
    }
}

/// Without keeping, a break gives up what the peer did not get and the next connection starts
/// a new session; what the peer got counts, and nothing arrives twice.
#[test]
fn without_keeping_a_break_loses_only_what_was_on_the_wire() {
    let mut p = Pair::new(1 << 20);
    p.out = Outbound::new(1 << 20, 7, false);
    p.cut();
    p.connect();
    for _ in 0..4 {
        p.send();
    }
    p.read(); // the Resume
    p.read(); // frame 0
    p.read(); // frame 1
    p.ack_timer();
    p.read(); // frame 2, not acknowledged
    p.cut();
    p.send(); // frame 4 waits
    p.connect();
    while !p.wire.is_empty() {
        p.read();
    }
    assert_eq!(p.taken, vec![0, 1, 2, 4], "frame 3 was on the wire");
}
