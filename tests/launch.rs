//! Forming a DVM from the library (`tbon::launch`): a whole DVM in one process, rank 0's URI
//! through a file, rank 0's host at a fixed port, and the errors a launcher's mistakes get.
mod common;

use bytes::Bytes;
use common::{HANG_GUARD, loopback_config};
use std::time::Duration;
use tbon::launch::{Placement, Rendezvous, launch, local_dvm};
use tbon::{Peer, StartError};

/// A user tag.
const TAG: u32 = tbon::rml::TAG_USER_MIN + 7;

fn dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("tbon-launch-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Every daemon wired, and a message from the last rank reaches rank 1.
fn check_traffic(dvm: &[tbon::Daemon]) {
    for d in dvm {
        assert!(d.wait_wired(HANG_GUARD), "rank {} not wired", d.rank());
    }
    let (tx, rx) = crossbeam_channel::bounded(1);
    dvm[1]
        .recv(Peer::Any, TAG, tbon::RecvMode::Once, move |m| {
            let _ = tx.send(m.payload);
        })
        .unwrap();
    dvm.last()
        .unwrap()
        .send(1, TAG, Bytes::from_static(b"hello"))
        .unwrap();
    assert_eq!(
        rx.recv_timeout(HANG_GUARD).unwrap(),
        Bytes::from_static(b"hello")
    );
}

#[test]
fn a_local_dvm_for_an_embedders_tests() {
    let dvm = local_dvm(loopback_config(2), 5).expect("a local DVM");
    assert_eq!(dvm.len(), 5);
    assert!(dvm.iter().enumerate().all(|(i, d)| d.rank() == i as u32));
    check_traffic(&dvm);
    dvm[0].shutdown_dvm();
    for d in &dvm {
        assert!(d.wait_stopped(HANG_GUARD).is_some());
    }
    assert!(matches!(
        local_dvm(loopback_config(2), 0),
        Err(StartError::Placement(_))
    ));
}

#[test]
fn rank_0_publishes_its_uri_in_a_file_and_removes_it() {
    let d = dir("file");
    let path = d.join("hnp.uri");
    let how = Rendezvous::File(path.clone());
    let size = 4;
    // The others start first and wait for the file, as under a launcher that starts every
    // task at once.
    let waiters: Vec<_> = (1..size)
        .map(|rank| {
            let how = how.clone();
            std::thread::spawn(move || launch(loopback_config(2), Placement { rank, size }, &how))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let root = launch(loopback_config(2), Placement { rank: 0, size }, &how).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with(root.contact_uri()), "{text}");
    let mut dvm = vec![root];
    for w in waiters {
        dvm.push(
            w.join()
                .unwrap()
                .expect("a rank found rank 0 through the file"),
        );
    }
    check_traffic(&dvm);
    dvm[0].shutdown_dvm();
    drop(dvm);
    assert!(!path.exists(), "rank 0 removes its URI file");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_rank_beyond_the_size_is_refused_before_any_waiting() {
    let d = dir("beyond");
    let how = Rendezvous::File(d.join("hnp.uri"));
    let t = std::time::Instant::now();
    let e = launch(loopback_config(2), Placement { rank: 5, size: 3 }, &how).unwrap_err();
    assert!(matches!(e, StartError::Placement(_)), "{e}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "it waited for the file first"
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// A URI file another user owns may have been planted (a shared directory such as /tmp): it
/// is refused. Needs root to give the file away; elsewhere it says so and checks nothing.
#[test]
fn a_uri_file_owned_by_another_user_is_refused() {
    let d = dir("owner");
    let path = d.join("hnp.uri");
    std::fs::write(&path, "tbon.0;tcp://127.0.0.1:9\n").unwrap();
    if std::os::unix::fs::chown(&path, Some(65534), None).is_err() {
        eprintln!("skipped: not root, cannot give a file to another user");
        return;
    }
    let e = launch(
        loopback_config(2),
        Placement { rank: 1, size: 2 },
        &Rendezvous::File(path),
    )
    .unwrap_err();
    assert!(e.to_string().contains("owned by uid 65534"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_file_that_never_appears_is_an_error_after_the_wireup_timeout() {
    let d = dir("none");
    let mut cfg = loopback_config(2);
    cfg.wireup_timeout_ms = 300;
    let how = Rendezvous::File(d.join("never.uri"));
    let e = launch(cfg, Placement { rank: 1, size: 2 }, &how).unwrap_err();
    assert!(matches!(e, StartError::Hnp(_)), "{e}");
    assert!(
        e.to_string().contains("did not appear within 300 ms"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn without_a_shared_filesystem_rank_0_listens_on_a_known_port() {
    // A port free now (another program could take it before rank 0 does: unlikely here).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let how = Rendezvous::Host {
        host: "127.0.0.1".into(),
        port,
    };
    let size = 3;
    // Every daemon has the same settings (an ephemeral port): the rendezvous puts rank 0 on
    // the known one, the others listen where their settings say and dial it.
    let dvm: Vec<_> = (0..size)
        .map(|rank| launch(loopback_config(2), Placement { rank, size }, &how).unwrap())
        .collect();
    assert!(
        dvm[0].contact_uri().ends_with(&format!(":{port}")),
        "{}",
        dvm[0].contact_uri()
    );
    check_traffic(&dvm);
    dvm[0].shutdown_dvm();

    // Rank 0 starting after the others (as under srun): they wait for its port.
    let late = std::thread::spawn({
        let how = how.clone();
        move || launch(loopback_config(2), Placement { rank: 1, size: 2 }, &how)
    });
    std::thread::sleep(Duration::from_millis(2_500));
    let root = launch(loopback_config(2), Placement { rank: 0, size: 2 }, &how).unwrap();
    let one = late
        .join()
        .unwrap()
        .expect("rank 1 waited for rank 0's port");
    assert!(one.wait_wired(HANG_GUARD));
    root.shutdown_dvm();
    assert!(one.wait_stopped(HANG_GUARD).is_some());

    let e = "host:127.0.0.1:0".parse::<Rendezvous>().unwrap_err();
    assert!(e.to_string().contains("NAME:PORT"), "{e}");
    let nowhere = Rendezvous::Host {
        host: "no-such-host.invalid".into(),
        port,
    };
    let e = launch(loopback_config(2), Placement { rank: 1, size: 2 }, &nowhere).unwrap_err();
    assert!(matches!(e, StartError::Hnp(_)), "{e}");
}

/// From an outside-in review of the C API: a rank beyond the size without a contact URI was
/// refused as "rank 0's contact URI is required"; the rank is what is wrong.
#[test]
fn a_rank_beyond_the_size_is_named_before_the_missing_contact() {
    for hnp in [None, Some("tbon.0;tcp://127.0.0.1:9")] {
        let e = tbon::start(loopback_config(2), 3, 2, hnp).unwrap_err();
        assert!(matches!(e, StartError::Tree(_)), "{e}");
        assert!(
            e.to_string().contains("rank 3 is out of range for size 2"),
            "{e}"
        );
    }
}
