//! Deterministic tests of the data-exchange core: two or three cores, messages passed by hand.
use super::*;
use crate::grpcomm::GroupId;

fn group() -> GroupId {
    GroupId::new(9, [0, 1, 2]).unwrap()
}

fn blob_of(pairs: &[(&str, &[u8])]) -> Bytes {
    let mut e = blob::Entries::new();
    for (k, v) in pairs {
        e.insert((*k).to_string(), Bytes::copy_from_slice(v));
    }
    blob::encode(&e)
}

fn answers(m: &mut Modex) -> Vec<(u64, Result<Bytes, GetError>)> {
    std::iter::from_fn(|| m.poll_answer()).collect()
}

/// Carries every message `from` wants sent to `to` (and back), until both are quiet.
fn exchange(a: &mut Modex, b: &mut Modex) {
    loop {
        let mut moved = false;
        while let Some((to, tag, p)) = a.poll_send() {
            assert_eq!(to, b.me);
            b.handle_message(a.me, tag, &p).unwrap();
            moved = true;
        }
        while let Some((to, tag, p)) = b.poll_send() {
            assert_eq!(to, a.me);
            a.handle_message(b.me, tag, &p).unwrap();
            moved = true;
        }
        if !moved {
            return;
        }
    }
}

#[test]
fn own_data_fenced_data_and_a_direct_fetch_shared_by_concurrent_gets() {
    let mut one = Modex::new(1, 3);
    let mut two = Modex::new(2, 3);
    assert!(one.commit(group(), blob_of(&[("ep", b"one:1")])));
    assert!(two.commit(group(), blob_of(&[("ep", b"two:2"), ("gpu", b"3")])));
    // Its own data, at once.
    one.get(1, &group(), 1, "ep", false);
    assert_eq!(
        answers(&mut one),
        vec![(1, Ok(Bytes::from_static(b"one:1")))]
    );
    // Two gets for rank 2: one fetch.
    one.get(2, &group(), 2, "ep", false);
    one.get(3, &group(), 2, "nope", false);
    assert_eq!(answers(&mut one), vec![]);
    exchange(&mut one, &mut two);
    assert_eq!(
        answers(&mut one),
        vec![
            (2, Ok(Bytes::from_static(b"two:2"))),
            (3, Err(GetError::NotFound))
        ]
    );
    assert_eq!((one.stats().fetches, two.stats().served), (1, 1));
    // Cached now: no message.
    one.get(4, &group(), 2, "gpu", false);
    assert_eq!(one.poll_send(), None);
    assert_eq!(answers(&mut one), vec![(4, Ok(Bytes::from_static(b"3")))]);
    // A full fence's result fills the cache too.
    let mut zero = Modex::new(0, 3);
    zero.fenced_full(
        &group(),
        &AllgatherResult {
            id: 0,
            overflowed: false,
            contributions: vec![(1, blob_of(&[("ep", b"one:1")])), (2, blob_of(&[]))],
            excluded: vec![],
        },
    );
    zero.get(5, &group(), 1, "ep", false);
    zero.get(6, &group(), 2, "ep", false);
    assert_eq!(zero.poll_send(), None);
    assert_eq!(
        answers(&mut zero),
        vec![
            (5, Ok(Bytes::from_static(b"one:1"))),
            (6, Err(GetError::NotFound))
        ]
    );
}

#[test]
fn a_dead_owner_and_misuse_end_a_get_at_once_or_when_the_death_is_known() {
    let mut one = Modex::new(1, 4);
    one.get(1, &group(), 2, "ep", true);
    one.get(2, &group(), 3, "ep", false);
    one.get(3, &group(), 2, &"k".repeat(MODEX_KEY_MAX + 1), false);
    assert_eq!(
        answers(&mut one),
        vec![
            (1, Err(GetError::NodeDown(2))),
            (2, Err(GetError::NotMember(3))),
            (3, Err(GetError::KeyTooLong(MODEX_KEY_MAX + 1))),
        ]
    );
    // The owner dies with the fetch in flight.
    one.get(4, &group(), 2, "ep", false);
    assert!(one.poll_send().is_some());
    one.handle_failed(&[2]);
    assert_eq!(answers(&mut one), vec![(4, Err(GetError::NodeDown(2)))]);
    assert_eq!(one.sizes().1, 0);
    // A reply nobody asked for is refused, changing nothing.
    let stray = wire::Reply { id: 77, blob: None }.encode();
    assert!(one.handle_message(2, TAG_MODEX_REPLY, &stray).is_err());
}

#[test]
fn bounds_fetches_cache_and_groups() {
    let size = MODEX_FETCHES_MAX as u32 + 2;
    let all = GroupId::new(1, 0..size).unwrap();
    let mut zero = Modex::new(0, size);
    for r in 1..=MODEX_FETCHES_MAX as u32 {
        zero.get(u64::from(r), &all, r, "k", false);
    }
    zero.get(999, &all, size - 1, "k", false);
    assert_eq!(answers(&mut zero), vec![(999, Err(GetError::Busy))]);
    assert_eq!(zero.take_waiting().len(), MODEX_FETCHES_MAX);
    // Gets waiting for one owner's data are bounded too.
    for t in 0..MODEX_GETS_WAITING_MAX as u64 {
        zero.get(t, &all, 1, "k", false);
    }
    assert_eq!(zero.sizes().1, 1);
    zero.get(u64::MAX, &all, 1, "k", false);
    assert_eq!(answers(&mut zero), vec![(u64::MAX, Err(GetError::Busy))]);
    zero.handle_failed(&[1]);
    assert_eq!(answers(&mut zero).len(), MODEX_GETS_WAITING_MAX);
    zero.get(7, &all, 2, "k", false);
    assert_eq!(answers(&mut zero), vec![]);

    // The cache keeps the most recently used within its count.
    let mut m = Modex::new(0, 3);
    for i in 0..MODEX_CACHE_MAX as u64 + 10 {
        let g = GroupId::new(i, [0, 1]).unwrap();
        m.cache_put(&g, 1, blob::Indexed::new(Bytes::from_static(b"x")));
    }
    assert_eq!(m.sizes().0, MODEX_CACHE_MAX);
    assert_eq!(m.stats().evicted, 10);

    let mut g = Modex::new(0, 3);
    for i in 0..MODEX_GROUPS_MAX as u64 {
        assert!(g.commit(GroupId::new(i, [0]).unwrap(), Bytes::new()));
    }
    assert!(!g.commit(GroupId::new(u64::MAX, [0]).unwrap(), Bytes::new()));
    g.forget(&GroupId::new(0, [0]).unwrap());
    assert!(g.commit(GroupId::new(u64::MAX, [0]).unwrap(), Bytes::new()));
}
