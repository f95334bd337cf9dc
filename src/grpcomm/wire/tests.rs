use super::*;
use proptest::prelude::*;

fn xcast_samples() -> Vec<XcastMsg> {
    vec![
        XcastMsg::Request(Request {
            originator: 3,
            request: 7,
            tag: 100,
            payload: Bytes::from_static(b"payload"),
        }),
        XcastMsg::Op(Op::whole(1, 2, 9, u32::MAX, Bytes::new())),
        XcastMsg::Op(Op {
            id: 12,
            originator: 2,
            request: 9,
            tag: 5,
            part: 3,
            parts: 4,
            payload: Bytes::from_static(b"part"),
        }),
        XcastMsg::Ack {
            upto: 5,
            digest: u64::MAX,
        },
        XcastMsg::Sync { digest: 1 },
        XcastMsg::Resume { from: 4, digest: 2 },
        XcastMsg::Done { request: 1, op: 2 },
        XcastMsg::Refused { request: 3 },
    ]
}

fn allgather_samples() -> Vec<AllgatherMsg> {
    vec![
        AllgatherMsg::Contribution(Contribution {
            id: 11,
            digest: 12,
            overflowed: false,
            entries: vec![(0, Bytes::from_static(b"a")), (2, Bytes::new())],
            excluded: vec![1, 3],
            excused: vec![5],
            returned: true,
        }),
        AllgatherMsg::Contribution(Contribution {
            id: 0,
            digest: 0,
            overflowed: true,
            entries: vec![],
            excluded: vec![],
            excused: vec![],
            returned: false,
        }),
        AllgatherMsg::Sync { digest: 5 },
        AllgatherMsg::Excuse {
            id: 7,
            ranks: vec![2, 6],
        },
        AllgatherMsg::Outcome {
            id: 4,
            result: Some(result_sample()),
        },
        AllgatherMsg::Outcome {
            id: 9,
            result: None,
        },
    ]
}

fn result_sample() -> AllgatherResult {
    AllgatherResult {
        id: 4,
        overflowed: false,
        contributions: vec![(1, Bytes::from_static(b"xy"))],
        excluded: vec![0, 2],
    }
}

#[test]
fn documented_layouts() {
    let op = XcastMsg::Op(Op::whole(1, 2, 3, 4, Bytes::from_static(b"hi")));
    let (head, payload) = op.encode_parts();
    assert_eq!(
        head.as_ref(),
        [
            2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0, 2
        ]
    );
    assert_eq!(payload, Some(Bytes::from_static(b"hi")));
    let part = XcastMsg::Op(Op {
        id: 9,
        originator: 2,
        request: 3,
        tag: 4,
        part: 1,
        parts: 2,
        payload: Bytes::from_static(b"hi"),
    });
    let (head, _) = part.encode_parts();
    assert_eq!(
        head.as_ref(),
        [
            8, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0, 1,
            0, 0, 0, 2, 0, 0, 0, 2
        ]
    );
    let c = AllgatherMsg::Contribution(Contribution {
        id: 1,
        digest: 2,
        overflowed: false,
        entries: vec![(3, Bytes::from_static(b"z"))],
        excluded: vec![4],
        excused: vec![5],
        returned: false,
    });
    assert_eq!(
        c.encode().as_ref(),
        [
            16, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0,
            1, b'z', 0, 0, 0, 1, 0, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 5
        ]
    );
    let e = AllgatherMsg::Excuse {
        id: 1,
        ranks: vec![3],
    };
    assert_eq!(
        e.encode().as_ref(),
        [19, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 3]
    );
    let lost = AllgatherMsg::Outcome {
        id: 2,
        result: None,
    };
    assert_eq!(lost.encode().as_ref(), [20, 0, 0, 0, 0, 0, 0, 0, 2, 0]);
}

#[test]
fn round_trips_and_every_truncation_is_an_error() {
    for msg in xcast_samples() {
        let bytes = msg.encode();
        assert_eq!(XcastMsg::decode(8, bytes.clone()), Ok(msg.clone()));
        for cut in 0..bytes.len() {
            assert!(
                XcastMsg::decode(8, bytes.slice(..cut)).is_err(),
                "{msg:?} cut {cut}"
            );
        }
        let mut long = bytes.to_vec();
        long.push(0);
        assert!(XcastMsg::decode(8, Bytes::from(long)).is_err());
    }
    for msg in allgather_samples() {
        let bytes = msg.encode();
        assert_eq!(AllgatherMsg::decode(8, bytes.clone()), Ok(msg.clone()));
        for cut in 0..bytes.len() {
            assert!(AllgatherMsg::decode(8, bytes.slice(..cut)).is_err());
        }
    }
    let r = result_sample();
    let bytes = r.encode();
    assert_eq!(AllgatherResult::decode(3, bytes.clone()), Ok(r.clone()));
    for cut in 0..bytes.len() {
        assert!(AllgatherResult::decode(3, bytes.slice(..cut)).is_err());
    }
    assert_eq!(r.get(1), Some(&Bytes::from_static(b"xy")));
    assert_eq!(r.get(0), None);
}

#[test]
fn a_part_out_of_range_is_an_error() {
    let part = |id: u64, part: u32, parts: u32| {
        XcastMsg::Op(Op {
            id,
            originator: 1,
            request: 1,
            tag: 1,
            part,
            parts,
            payload: Bytes::from_static(b"x"),
        })
        .encode()
    };
    assert!(XcastMsg::decode(4, part(5, 1, 2)).is_ok());
    for (bytes, why) in [
        (part(5, 2, 2), "part not below parts"),
        (
            {
                // Kind 8 naming one part (the encoder writes that as kind 2).
                let mut b = part(5, 0, 2).to_vec();
                b[32] = 1;
                Bytes::from(b)
            },
            "parts not 2 to XCAST_PARTS_MAX",
        ),
        (
            part(500, 0, limits::XCAST_PARTS_MAX as u32 + 1),
            "parts not 2 to XCAST_PARTS_MAX",
        ),
        (part(3, 3, 4), "part before operation 1"),
    ] {
        assert_eq!(XcastMsg::decode(4, bytes), Err(WireError::Invalid(why)));
    }
}

#[test]
fn bad_fields_are_errors() {
    // Rank out of range, id 0, unknown kind.
    let req = xcast_samples().remove(0).encode();
    assert_eq!(
        XcastMsg::decode(3, req),
        Err(WireError::BadRank { rank: 3, size: 3 })
    );
    assert_eq!(
        XcastMsg::decode(8, Bytes::from_static(&[7, 0, 0, 0, 0, 0, 0, 0, 0])),
        Err(WireError::Invalid("id 0"))
    );
    assert_eq!(
        XcastMsg::decode(8, Bytes::from_static(&[99])),
        Err(WireError::UnknownKind(99))
    );
    assert_eq!(
        XcastMsg::decode(8, AllgatherMsg::Sync { digest: 0 }.encode()),
        Err(WireError::UnknownKind(17))
    );
    // Entries out of order, a rank both contributing and excluded, an entry with bytes when
    // overflowed (data-less ones name who entered: decoded below), unknown flags, a count
    // larger than the DVM or than the frame.
    let bad = |entries: Vec<(Rank, Bytes)>, excluded: Vec<Rank>, overflowed: bool| {
        AllgatherMsg::Contribution(Contribution {
            id: 1,
            digest: 1,
            overflowed,
            entries,
            excluded,
            excused: vec![],
            returned: false,
        })
        .encode()
    };
    for frame in [
        bad(vec![(2, Bytes::new()), (1, Bytes::new())], vec![], false),
        bad(vec![(1, Bytes::new())], vec![1], false),
        bad(vec![], vec![2, 2], false),
        bad(vec![(1, Bytes::from_static(b"x"))], vec![], true),
    ] {
        assert!(matches!(
            AllgatherMsg::decode(8, frame),
            Err(WireError::Invalid(_))
        ));
    }
    let named = bad(vec![(1, Bytes::new()), (3, Bytes::new())], vec![2], true);
    match AllgatherMsg::decode(8, named) {
        Ok(AllgatherMsg::Contribution(c)) => {
            assert!(c.overflowed);
            assert_eq!(
                c.entries.iter().map(|e| e.0).collect::<Vec<_>>(),
                vec![1, 3]
            );
            assert_eq!(c.excluded, vec![2]);
        }
        other => panic!("an overflowed contribution naming who entered: {other:?}"),
    }
    let mut flags = allgather_samples().remove(0).encode().to_vec();
    flags[17] = 4;
    assert_eq!(
        AllgatherMsg::decode(8, Bytes::from(flags)),
        Err(WireError::Invalid("unknown flags"))
    );
    let mut huge = vec![16];
    huge.extend_from_slice(&[0; 17]);
    huge.extend_from_slice(&u32::MAX.to_be_bytes());
    assert!(matches!(
        AllgatherMsg::decode(u32::MAX, Bytes::from(huge.clone())),
        Err(WireError::Truncated)
    ));
    assert!(matches!(
        AllgatherMsg::decode(8, Bytes::from(huge)),
        Err(WireError::BadRank { .. })
    ));
    // A payload length above the bound is refused before looking for the bytes.
    let mut op = vec![
        2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0,
    ];
    op.extend_from_slice(&u32::MAX.to_be_bytes());
    assert!(matches!(
        XcastMsg::decode(8, Bytes::from(op)),
        Err(WireError::Invalid(_))
    ));
}

proptest! {
    /// Random bytes, and valid messages with a flipped bit or cut short: an error or a
    /// message, never a panic; whatever decodes re-encodes to the same bytes.
    #[test]
    fn hostile_bytes_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..128),
        flip in 0usize..1024,
        cut in 0usize..128,
        size in 1u32..16,
    ) {
        for kind in [bytes.clone(), {
            let mut b = bytes.clone();
            if let Some(first) = b.first_mut() {
                *first %= 20;
            }
            b
        }] {
            let frame = Bytes::from(kind);
            if let Ok(m) = XcastMsg::decode(size, frame.clone()) {
                prop_assert_eq!(m.encode(), frame.clone());
            }
            if let Ok(m) = AllgatherMsg::decode(size, frame.clone()) {
                prop_assert_eq!(m.encode(), frame.clone());
            }
            if let Ok(r) = AllgatherResult::decode(size, frame.clone()) {
                prop_assert_eq!(r.encode(), frame);
            }
        }
        let mut valid: Vec<Bytes> = xcast_samples().iter().map(XcastMsg::encode).collect();
        valid.extend(allgather_samples().iter().map(AllgatherMsg::encode));
        valid.push(result_sample().encode());
        for v in valid {
            let mut b = v.to_vec();
            if let Some(byte) = b.get_mut(flip / 8) {
                *byte ^= 1 << (flip % 8);
            }
            let b = Bytes::from(b);
            let _ = XcastMsg::decode(size, b.clone());
            let _ = AllgatherMsg::decode(size, b.clone());
            let _ = AllgatherResult::decode(size, b);
            let short = v.slice(..cut.min(v.len()));
            let _ = XcastMsg::decode(size, short.clone());
            let _ = AllgatherMsg::decode(size, short.clone());
            let _ = AllgatherResult::decode(size, short);
        }
    }
}

#[test]
fn an_outcome_must_carry_its_own_collective() {
    let mut frame = AllgatherMsg::Outcome {
        id: 4,
        result: Some(result_sample()),
    }
    .encode()
    .to_vec();
    // The id in front says 5, the result inside says 4.
    frame[8] = 5;
    assert_eq!(
        AllgatherMsg::decode(8, Bytes::from(frame)),
        Err(WireError::Invalid("outcome of another collective"))
    );
    let mut flag = AllgatherMsg::Outcome {
        id: 4,
        result: None,
    }
    .encode()
    .to_vec();
    flag[9] = 2;
    assert_eq!(
        AllgatherMsg::decode(8, Bytes::from(flag)),
        Err(WireError::Invalid("unknown outcome flag"))
    );
}
