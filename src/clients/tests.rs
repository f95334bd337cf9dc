//! Deterministic tests of the clients' core: two daemons' cores passing their messages by
//! hand, and the local frames' decoder.
use super::local::{LocalDecoder, ToClient, ToDaemon};
use super::registry::{Carried, ClientEvent, Clients};
use super::wire::{TAG_CLIENT_CONTROL, TAG_CLIENT_DATA};
use super::{ClientError, ClientName, ExitReason};
use crate::limits::{CLIENT_QUEUE_BYTES_MAX, CLIENT_SENDS_INFLIGHT_MAX};
use bytes::Bytes;

const UID: u32 = 1000;
const KEY: [u8; 32] = [9; 32];

fn core(me: u32) -> Clients {
    let mut c = Clients::new(me, 4, 1 << 20, vec![UID]);
    assert!(c.open_job(1, KEY, vec![]));
    c
}

/// Moves every message between two cores (ranks 0 and 1) until quiet; RELM's part is done
/// by hand: data and control messages delivered in order.
fn settle(a: &mut Clients, b: &mut Clients) {
    for _ in 0..10 {
        let mut moved = false;
        for (from, to) in [(0usize, 1usize), (1, 0)] {
            let (src, dst) = if from == 0 {
                (&mut *a, &mut *b)
            } else {
                (&mut *b, &mut *a)
            };
            let mut out = Vec::new();
            src.pump_data(&mut |r, p| {
                assert_eq!(r as usize, to);
                out.push((TAG_CLIENT_DATA, p));
                Carried::Sent
            });
            while let Some((r, p)) = src.poll_control() {
                assert_eq!(r as usize, to);
                out.push((TAG_CLIENT_CONTROL, p));
            }
            for (tag, p) in out {
                moved = true;
                if tag == TAG_CLIENT_DATA {
                    dst.handle_data(from as u32, p).unwrap();
                } else {
                    dst.handle_control(from as u32, &p).unwrap();
                }
            }
        }
        if !moved {
            return;
        }
    }
    panic!("the cores did not settle");
}

fn events(c: &mut Clients) -> Vec<ClientEvent> {
    std::iter::from_fn(|| c.poll_event()).collect()
}

#[test]
fn a_message_crosses_and_its_result_comes_back() {
    let (mut a, mut b) = (core(0), core(1));
    let x = a.admit(1, 1, &KEY, UID).unwrap();
    let y = b.admit(1, 1, &KEY, UID).unwrap();
    assert_eq!(
        (x, y),
        (
            ClientName { rank: 0, local: 1 },
            ClientName { rank: 1, local: 1 }
        )
    );
    a.send(x.local, 7, y, 300, Bytes::from_static(b"hi"))
        .unwrap();
    assert!(!a.may_read(x.local) || CLIENT_SENDS_INFLIGHT_MAX > 1);
    settle(&mut a, &mut b);
    assert_eq!(
        events(&mut b),
        vec![ClientEvent::Deliver {
            client: 1,
            from: x,
            tag: 300,
            payload: Bytes::from_static(b"hi")
        }]
    );
    assert_eq!(
        events(&mut a),
        vec![ClientEvent::SendDone {
            client: 1,
            token: 7,
            result: Ok(())
        }]
    );
    a.check_invariants().unwrap();
    b.check_invariants().unwrap();
}

#[test]
fn jobs_keys_uids_and_versions_decide_admission() {
    let mut a = core(0);
    assert!(
        a.admit(1, 1, &[0; 32], UID)
            .unwrap_err()
            .contains("wrong client key")
    );
    assert!(a.admit(1, 2, &KEY, UID).unwrap_err().contains("not open"));
    assert!(a.admit(1, 1, &KEY, UID + 1).unwrap_err().contains("uid"));
    assert!(a.admit(9, 1, &KEY, UID).unwrap_err().contains("version"));
    assert_eq!(a.counters().refused, 4);
    let c = a.admit(1, 1, &KEY, UID).unwrap();
    a.close_job(1);
    assert!(a.admit(1, 1, &KEY, UID).is_err());
    assert!(a.may_read(c.local), "admitted clients stay");
}

#[test]
fn another_job_is_refused_unless_accepted_and_gone_names_are_told_apart() {
    let (mut a, mut b) = (core(0), core(1));
    assert!(b.open_job(2, KEY, vec![]));
    assert!(b.open_job(3, KEY, vec![1]));
    let x = a.admit(1, 1, &KEY, UID).unwrap();
    let in2 = b.admit(1, 2, &KEY, UID).unwrap();
    let in3 = b.admit(1, 3, &KEY, UID).unwrap();
    let never = ClientName { rank: 1, local: 50 };
    for (t, to) in [(1, in2), (2, in3), (3, never)] {
        a.send(x.local, t, to, 300, Bytes::new()).unwrap();
    }
    settle(&mut a, &mut b);
    b.gone(in3.local);
    a.send(x.local, 4, in3, 300, Bytes::new()).unwrap();
    settle(&mut a, &mut b);
    let results: Vec<_> = events(&mut a)
        .into_iter()
        .map(|e| match e {
            ClientEvent::SendDone { token, result, .. } => (token, result),
            e => panic!("{e:?}"),
        })
        .collect();
    assert_eq!(
        results,
        vec![
            (1, Err(ClientError::NotPermitted(in2))),
            (2, Ok(())),
            (3, Err(ClientError::UnknownClient(never))),
            (4, Err(ClientError::ClientGone(in3))),
        ]
    );
}

#[test]
fn watches_end_once_on_exit_on_daemon_death_or_at_once() {
    let (mut a, mut b) = (core(0), core(1));
    let w = a.admit(1, 1, &KEY, UID).unwrap();
    let t = b.admit(1, 1, &KEY, UID).unwrap();
    let t2 = b.admit(1, 1, &KEY, UID).unwrap();
    a.watch(w.local, t, false).unwrap();
    a.watch(w.local, t2, false).unwrap();
    a.watch(w.local, ClientName { rank: 1, local: 77 }, false)
        .unwrap();
    settle(&mut a, &mut b);
    b.gone(t.local);
    settle(&mut a, &mut b);
    let exited = |n, reason| ClientEvent::Exited {
        client: w.local,
        name: n,
        reason,
    };
    assert_eq!(
        events(&mut a),
        vec![
            exited(ClientName { rank: 1, local: 77 }, ExitReason::Unknown),
            exited(t, ExitReason::Exited)
        ]
    );
    a.failed(&[1]);
    assert_eq!(events(&mut a), vec![exited(t2, ExitReason::DaemonDied)]);
    a.check_invariants().unwrap();
}

#[test]
fn a_full_receiver_holds_messages_and_a_daemons_death_ends_sends() {
    let (mut a, mut b) = (core(0), core(1));
    let x = a.admit(1, 1, &KEY, UID).unwrap();
    let local_peer = a.admit(1, 1, &KEY, UID).unwrap();
    let y = b.admit(1, 1, &KEY, UID).unwrap();
    // Local delivery stops at a full queue and keeps the order.
    a.set_queued(local_peer.local, CLIENT_QUEUE_BYTES_MAX);
    a.send(x.local, 1, local_peer, 300, Bytes::from_static(b"1"))
        .unwrap();
    a.send(x.local, 2, y, 300, Bytes::from_static(b"2"))
        .unwrap();
    a.pump_data(&mut |_, _| panic!("nothing passes the held message"));
    assert!(events(&mut a).is_empty());
    assert!(!a.room(local_peer.local, 1));
    a.set_queued(local_peer.local, 0);
    let mut carried = Vec::new();
    a.pump_data(&mut |r, p| {
        carried.push((r, p));
        Carried::Sent
    });
    assert_eq!(carried.len(), 1);
    assert!(matches!(
        events(&mut a)[..],
        [
            ClientEvent::Deliver { .. },
            ClientEvent::SendDone {
                token: 1,
                result: Ok(()),
                ..
            }
        ]
    ));
    // Rank 1 dies before answering: NodeDown.
    a.failed(&[1]);
    assert_eq!(
        events(&mut a),
        vec![ClientEvent::SendDone {
            client: x.local,
            token: 2,
            result: Err(ClientError::NodeDown(1))
        }]
    );
    // A client that exits leaves nothing.
    a.send(
        x.local,
        3,
        ClientName { rank: 2, local: 1 },
        300,
        Bytes::new(),
    )
    .unwrap();
    a.gone(x.local);
    a.check_invariants().unwrap();
    a.pump_data(&mut |_, _| panic!("nothing left to send"));
}

#[test]
fn frames_round_trip_and_oversized_or_garbled_ones_are_refused() {
    let frames = [
        ToDaemon::Hello {
            version: 1,
            job: 5,
            key: KEY,
        },
        ToDaemon::Send {
            token: 3,
            to: ClientName { rank: 2, local: 9 },
            tag: 400,
            payload: Bytes::from_static(b"abc"),
        },
        ToDaemon::Watch {
            name: ClientName { rank: 1, local: 1 },
        },
    ];
    let mut bytes = Vec::new();
    for f in &frames {
        bytes.extend_from_slice(&f.encode());
    }
    let mut d = LocalDecoder::new(1024);
    let mut r = &bytes[..];
    d.read_from(&mut r).unwrap();
    for f in &frames {
        assert_eq!(
            &ToDaemon::decode(d.next_body().unwrap().unwrap()).unwrap(),
            f
        );
    }
    assert_eq!(d.next_body().unwrap(), None);
    let c = ToClient::SendDone { token: 1, code: 0 };
    assert_eq!(ToClient::decode(c.encode().slice(4..)).unwrap(), c);
    let mut d = LocalDecoder::new(16);
    let mut r = &ToDaemon::Hello {
        version: 1,
        job: 5,
        key: KEY,
    }
    .encode()[..];
    d.read_from(&mut r).unwrap();
    assert!(d.next_body().is_err(), "a frame beyond the bound");
    assert!(ToDaemon::decode(Bytes::from_static(&[2, 0, 0])).is_err());
    assert!(ToDaemon::decode(Bytes::from_static(&[99])).is_err());
    assert!(ToClient::decode(Bytes::new()).is_err());
}

#[test]
fn a_closed_job_keeps_accepting_for_its_clients_until_the_last_is_gone() {
    let (mut a, mut b) = (core(0), core(1));
    assert!(b.open_job(3, KEY, vec![1]));
    let x = a.admit(1, 1, &KEY, UID).unwrap();
    let y = b.admit(1, 3, &KEY, UID).unwrap();
    b.close_job(3);
    assert!(b.admit(1, 3, &KEY, UID).is_err(), "closed: no new client");
    a.send(x.local, 1, y, 300, Bytes::new()).unwrap();
    settle(&mut a, &mut b);
    assert!(matches!(
        events(&mut a)[..],
        [ClientEvent::SendDone { result: Ok(()), .. }]
    ));
    // Its last client gone, the job is forgotten: opening it again starts afresh.
    b.gone(y.local);
    assert!(b.open_job(3, [1; 32], vec![]));
    assert!(b.admit(1, 3, &[1; 32], UID).is_ok());
}
