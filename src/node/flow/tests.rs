use super::*;

fn flow() -> (Flow, Instant) {
    let f = Flow::new(FlowLimits {
        high_bytes: 100,
        low_bytes: 40,
        stuck_ms: 1_000,
        full_bytes: 2_000,
    });
    (f, Instant::now())
}

#[test]
fn a_queue_is_congested_above_high_until_down_to_low() {
    let (mut f, t) = flow();
    f.handle_queued(t, 1, 100);
    assert!(f.may_originate(1), "at the threshold is not above it");
    assert!(!f.any_congested());
    f.handle_queued(t, 1, 101);
    assert!(!f.may_originate(1));
    assert!(f.any_congested());
    f.handle_queued(t, 1, 60);
    assert!(!f.may_originate(1), "hysteresis: still above low");
    f.handle_queued(t, 1, 40);
    assert!(f.may_originate(1));
    assert_eq!(f.episodes(), 1);
}

#[test]
fn a_queue_congested_with_bulk_data_takes_messages_ahead_of_it_but_no_more_bulk() {
    let (mut f, t) = flow();
    // 500 queued, 480 of them stream data in the bulk line: messages go ahead of it.
    f.handle_levels(t, 1, 500, 480);
    assert!(f.any_congested());
    assert!(f.may_originate(1), "20 bytes of messages: at most low");
    assert!(
        !f.may_release(1),
        "no more bulk data towards a congested queue"
    );
    assert!(!f.may_read(t, 2), "reads pause as for any congested queue");
    // Messages pile up ahead of the bulk data: refused once above low, and the gate's
    // generation says the answer changed.
    let g = f.generation();
    f.handle_levels(t, 1, 541, 480);
    assert!(!f.may_originate(1));
    assert_ne!(f.generation(), g);
    let g = f.generation();
    f.handle_levels(t, 1, 520, 480);
    assert!(f.may_originate(1));
    assert_ne!(f.generation(), g);
    // Without a bulk line, a congested queue refuses (the old rule).
    f.handle_queued(t, 2, 500);
    assert!(!f.may_originate(2) && !f.may_release(2));
    // Down to low: neither is held.
    f.handle_levels(t, 1, 40, 40);
    assert!(f.may_originate(1) && f.may_release(1));
}

#[test]
fn reads_pause_for_every_neighbour_but_the_congested_one() {
    let (mut f, t) = flow();
    f.handle_queued(t, 1, 500);
    assert!(f.may_read(t, 1), "the congested neighbour itself is read");
    assert!(!f.may_read(t, 2));
    assert!(!f.may_read(t, 3));
    assert!(f.may_originate(2));
    // Two congested queues: neither neighbour is read (each could feed the other).
    f.handle_queued(t, 2, 500);
    assert!(!f.may_read(t, 1));
    assert!(!f.may_read(t, 2));
    f.forget(2);
    assert!(f.may_read(t, 1));
    f.handle_queued(t, 1, 0);
    assert!(f.may_read(t, 3));
    assert!(!f.is_pausing(t));
}

#[test]
fn a_stuck_queue_stops_pausing_and_a_moving_one_pauses_again() {
    let (mut f, t) = flow();
    f.handle_queued(t, 1, 500);
    assert_eq!(f.poll_timeout(), Some(t + Duration::from_millis(1_000)));
    let later = t + Duration::from_millis(999);
    assert!(!f.may_read(later, 2));
    // A growing queue is not moving.
    f.handle_queued(later, 1, 600);
    let stuck = t + Duration::from_millis(1_000);
    assert!(
        f.may_read(stuck, 2),
        "a stuck neighbour must not stop the others"
    );
    assert!(!f.is_pausing(stuck));
    assert!(
        !f.may_originate(1),
        "but sends towards it are still turned away"
    );
    // It took bytes: it pauses reads again.
    f.handle_queued(stuck, 1, 550);
    assert!(!f.may_read(stuck, 2));
}

#[test]
fn a_queue_towards_a_pausing_neighbour_is_not_stuck() {
    let (mut f, t) = flow();
    f.handle_queued(t, 1, 500);
    // Rank 1 reads nothing from us for longer than stuck_ms, but keeps saying it pauses.
    let mut now = t;
    for _ in 0..5 {
        now += Duration::from_millis(500);
        f.handle_pausing(now, 1);
        assert!(!f.may_read(now, 2), "a paused chain must keep pushing back");
        assert!(f.is_pausing(now));
    }
    // It stops saying so (its own stuck queue stopped counting): stuck a while later.
    let stuck = now + Duration::from_millis(1_000);
    assert!(f.may_read(stuck, 2));
    // Saying so about a queue that is not congested changes nothing.
    f.handle_pausing(stuck, 3);
    assert!(f.may_originate(3));
}

#[test]
fn a_stuck_queue_near_its_bound_pauses_reads_again() {
    let (mut f, t) = flow();
    f.handle_queued(t, 1, 500);
    let stuck = t + Duration::from_millis(1_000);
    assert!(f.may_read(stuck, 2));
    // Reads from the others went on and filled it: above full_bytes it holds back again,
    // stuck or not, until it drains or its neighbour is forgotten (declared dead).
    f.handle_queued(stuck, 1, 2_001);
    assert!(!f.may_read(stuck, 2));
    assert!(f.is_pausing(stuck));
    assert!(f.may_read(stuck, 1), "never the congested neighbour itself");
    f.forget(1);
    assert!(f.may_read(stuck, 2));
}

#[test]
fn full_leaves_room_for_a_maximal_frame_and_one_read() {
    let l = FlowLimits::for_queue(128 << 20, 64 << 20);
    assert!(l.full_bytes < (64 << 20) && l.full_bytes > l.high_bytes);
    // No room at all: a stuck queue never stops pausing.
    let tight = FlowLimits::for_queue(1 << 20, 1 << 20);
    assert_eq!(tight.full_bytes, tight.high_bytes);
    // A small queue congests at a quarter of its bound.
    let small = FlowLimits::for_queue(1 << 20, 64 << 10);
    assert_eq!(small.high_bytes, 256 << 10);
    assert!(small.low_bytes <= small.high_bytes / 4);
    assert!(small.full_bytes > small.high_bytes && small.full_bytes < 1 << 20);
}

#[test]
fn low_is_never_above_high() {
    let mut f = Flow::new(FlowLimits {
        high_bytes: 10,
        low_bytes: 50,
        stuck_ms: 1,
        full_bytes: usize::MAX,
    });
    let t = Instant::now();
    f.handle_queued(t, 1, 11);
    f.handle_queued(t, 1, 10);
    assert!(f.may_originate(1));
}

#[test]
fn a_queue_congested_with_bulk_data_only_lets_links_be_read_but_not_bulk_connections() {
    let (mut f, t) = flow();
    // 500 queued towards 1, 480 of them a stream's data: messages from 2 go ahead of it.
    f.handle_levels(t, 1, 500, 480);
    assert!(f.may_read_link(t, 2));
    assert!(!f.may_read(t, 2), "2's bulk connection pauses");
    // More than low of anything else: links pause too.
    f.handle_levels(t, 1, 541, 480);
    assert!(!f.may_read_link(t, 2));
    f.handle_levels(t, 1, 520, 480);
    assert!(f.may_read_link(t, 2));
    // Near the hard bound, even bulk data alone pauses links (stream data may come over one).
    f.handle_levels(t, 1, 2_001, 1_990);
    assert!(!f.may_read_link(t, 2));
    // A queue congested with messages pauses links as before; another bulk one does not add.
    f.handle_levels(t, 1, 500, 480);
    f.handle_queued(t, 3, 500);
    assert!(!f.may_read_link(t, 2));
    assert!(
        f.may_read_link(t, 3),
        "the other congested queue holds only bulk data"
    );
    assert!(!f.may_read_link(t, 1));
    f.forget(3);
    assert!(f.may_read_link(t, 2) && f.may_read_link(t, 1));
}
