//! Faults with real `tbon daemon` processes: a SIGSTOPped daemon is found by heartbeats and
//! declared dead; after SIGCONT it exits non-zero instead of rejoining; a SIGKILLed interior
//! daemon is found by its lost connections. Both are then started again with `--rejoin` at
//! once and take back their places (issue "Rejoin"); a live rank's impostor and rank 0 are
//! refused; `--ping-all` completes at the rejoined daemons too. Then SIGUSR1 makes the rejoined interior daemon leave in order: it exits 0 and
//! every other daemon reports it departed, not failed. Everyone stops cleanly at the end.

mod procs;

use procs::keygen_file as key_file;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const HANG_GUARD: Duration = Duration::from_secs(90);
const SIZE: u32 = 7;

struct Dvm(Vec<Option<Child>>);

impl Drop for Dvm {
    fn drop(&mut self) {
        for c in self.0.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Dvm {
    fn signal(&self, rank: usize, sig: Signal) {
        let c = self.0[rank].as_ref().unwrap();
        kill(Pid::from_raw(c.id() as i32), sig).unwrap();
    }

    /// Waits for `rank` to exit; returns its exit code.
    fn wait_exit(&mut self, rank: usize) -> Option<i32> {
        let deadline = Instant::now() + HANG_GUARD;
        let c = self.0[rank].as_mut().unwrap();
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                self.0[rank] = None;
                return st.code();
            }
            assert!(Instant::now() < deadline, "rank {rank} did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn running(&mut self, rank: usize) -> bool {
        self.0[rank]
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }
}

/// Lines from every daemon's stdout, tagged with its rank.
struct Lines(mpsc::Receiver<(usize, String)>);

impl Lines {
    /// Reads until `done` holds for the lines seen so far.
    fn until(
        &self,
        what: &str,
        seen: &mut Vec<(usize, String)>,
        done: impl Fn(&[(usize, String)]) -> bool,
    ) {
        let deadline = Instant::now() + HANG_GUARD;
        while !done(seen) {
            let left = deadline.saturating_duration_since(Instant::now());
            let l = self
                .0
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("gave up waiting: {what}"));
            seen.push(l);
        }
    }
}

/// Whether `rank` printed a global-scope fault line whose epoch is `epoch`.
fn confirmed(seen: &[(usize, String)], rank: usize, epoch: u64) -> bool {
    seen.iter().any(|(r, l)| {
        *r == rank
            && l.contains("\"scope\":\"global\"")
            && l.contains(&format!("\"epoch\":{epoch}"))
    })
}

/// Starts `tbon daemon` for `rank` (rank 0 writes `uri_file`, the others read it) with `extra`
/// flags; its stdout lines go to `tx`, tagged with its rank.
fn spawn(
    rank: u32,
    uri_file: &std::path::Path,
    extra: &[&str],
    tx: &mpsc::Sender<(usize, String)>,
) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tbon"));
    cmd.args([
        "daemon",
        "--rank",
        &rank.to_string(),
        "--size",
        &SIZE.to_string(),
    ])
    .arg("--key-file")
    .arg(key_file())
    .args([
        "--radix",
        "2",
        "--if-include",
        "127.0.0.1/32",
        "--ping-all",
        "--print-faults",
    ])
    .args([
        "--heartbeat-interval-ms",
        "300",
        "--heartbeat-timeout-ms",
        "3000",
    ])
    .args(extra)
    .env("RUST_LOG", "tbon=info")
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    if rank == 0 && !extra.contains(&"--rejoin") {
        cmd.arg("--uri-file").arg(uri_file);
    } else {
        cmd.arg("--hnp-file").arg(uri_file);
    }
    let mut child = cmd.spawn().expect("spawn tbon daemon");
    let out = child.stdout.take().unwrap();
    let out_tx = tx.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = out_tx.send((rank as usize, line));
        }
    });
    // Stderr is drained (a full pipe would stall the daemon) and kept for the refusals.
    let err = child.stderr.take().unwrap();
    let tx = tx.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send((rank as usize, format!("stderr: {line}")));
        }
    });
    child
}

/// Runs `tbon status` against the DVM; its text. It must exit `code` (0: healthy, a departed
/// rank included; 1: a rank down).
fn status_with(uri_file: &std::path::Path, code: i32) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tbon"))
        .args(["status", "--all", "--hnp-file"])
        .arg(uri_file)
        .arg("--key-file")
        .arg(key_file())
        .output()
        .expect("run tbon status");
    assert_eq!(out.status.code(), Some(code), "tbon status: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn status(uri_file: &std::path::Path) -> String {
    status_with(uri_file, 0)
}

#[test]
fn stopped_daemon_is_declared_dead_and_exits_on_resume_killed_one_is_repaired_both_rejoin() {
    let dir = std::env::temp_dir().join(format!("tbon-faults-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let uri_file = dir.join("hnp.uri");
    let _ = std::fs::remove_file(&uri_file);
    let (tx, rx) = mpsc::channel();
    let mut dvm = Dvm(Vec::new());
    for rank in 0..SIZE {
        dvm.0.push(Some(spawn(rank, &uri_file, &[], &tx)));
    }
    let lines = Lines(rx);
    let mut seen = Vec::new();
    lines.until("wire-up and all-to-all", &mut seen, |s| {
        s.iter()
            .filter(|(_, l)| l.contains("all-to-all ok"))
            .count()
            == SIZE as usize
    });

    // Rank 2 (interior: children 4 and 6) is stopped: only heartbeats can find it.
    dvm.signal(2, Signal::SIGSTOP);
    let others = [0, 1, 3, 4, 5, 6];
    lines.until("every survivor to confirm rank 2 dead", &mut seen, |s| {
        others.iter().all(|r| confirmed(s, *r, 1))
    });
    assert!(
        seen.iter()
            .any(|(r, l)| *r == 0 && l.contains("\"newly_failed\":[2]"))
    );
    // Resumed, it learns it was declared dead and exits non-zero without rejoining.
    dvm.signal(2, Signal::SIGCONT);
    let code = dvm.wait_exit(2);
    assert_ne!(code, Some(0), "a daemon declared dead must not exit 0");

    // Rank 1 (interior: children 3 and 5) is killed outright.
    dvm.signal(1, Signal::SIGKILL);
    dvm.wait_exit(1);
    let others = [0, 3, 4, 5, 6];
    lines.until("every survivor to confirm rank 1 dead", &mut seen, |s| {
        others.iter().all(|r| confirmed(s, *r, 2))
    });
    for r in others {
        assert!(dvm.running(r), "survivor {r} crashed");
    }

    // Both are started again with --rejoin, at once: rank 0 admits each under its new
    // incarnation in an epoch of its own (3 and 4), and every survivor puts it back.
    let admitted_from = seen.len();
    dvm.0[1] = Some(spawn(1, &uri_file, &["--rejoin"], &tx));
    dvm.0[2] = Some(spawn(2, &uri_file, &["--rejoin"], &tx));
    lines.until("every survivor to restore ranks 1 and 2", &mut seen, |s| {
        others
            .iter()
            .all(|r| confirmed(s, *r, 3) && confirmed(s, *r, 4))
    });
    for rank in [1, 2] {
        lines.until("the rejoined daemon to settle", &mut seen, |s| {
            s.iter()
                .any(|(r, l)| *r == rank && l.contains("rejoined; every living daemon knows"))
        });
    }
    // `--ping-all`: the survivors ping each daemon that rejoins, so each hears from all six
    // others (found by an outside-in review: a joined daemon never finished its self-test).
    for rank in [1, 2] {
        lines.until("the rejoined daemon's all-to-all", &mut seen, |s| {
            s[admitted_from..]
                .iter()
                .any(|(r, l)| *r == rank && l.contains("all-to-all ok (6 of 6)"))
        });
    }
    // A dial that crossed the rejoined daemon's own is no stranger's (it warned at every join).
    let strangers: Vec<_> = seen[admitted_from..]
        .iter()
        .filter(|(_, l)| l.contains("before its proof of the job key"))
        .collect();
    assert!(strangers.is_empty(), "{strangers:?}");
    let restored: Vec<&String> = seen[admitted_from..]
        .iter()
        .filter(|(r, l)| *r == 0 && l.contains("\"restored\":["))
        .map(|(_, l)| l)
        .collect();
    assert!(
        restored.iter().any(|l| l.contains("\"restored\":[1]"))
            && restored.iter().any(|l| l.contains("\"restored\":[2]")),
        "rank 0's fault lines: {restored:?}"
    );
    // The tree is whole again: every daemon answers from its own slot, the two restarted ones
    // under their new incarnations, in epoch 4.
    let view = status(&uri_file);
    assert!(view.contains("answered 7, dead 0"), "{view}");
    assert!(view.contains("epoch 4"), "{view}");

    // A second daemon for a live rank is refused and exits 1 saying why; rank 0 rejoining is a
    // flag error (exit 2) before it binds or touches the DVM's URI file.
    for (rank, why, exit) in [(3, "alive", 1), (0, "rank 0 cannot rejoin", 2)] {
        let mut impostor = spawn(rank, &uri_file, &["--rejoin"], &tx);
        let deadline = Instant::now() + HANG_GUARD;
        let code = loop {
            if let Some(st) = impostor.try_wait().unwrap() {
                break st.code();
            }
            assert!(
                Instant::now() < deadline,
                "rank {rank}'s impostor did not exit"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(code, Some(exit), "rank {rank}'s impostor");
        lines.until("the refusal's reason", &mut seen, |s| {
            s.iter()
                .any(|(r, l)| *r == rank as usize && l.starts_with("stderr:") && l.contains(why))
        });
    }
    let view = status(&uri_file);
    assert!(view.contains("answered 7, dead 0"), "{view}");

    // SIGUSR1 makes rank 1 (interior, and rejoined above) leave in order: it exits 0, and
    // every other daemon repairs around it in epoch 5, reporting it departed, never failed.
    let left_from = seen.len();
    dvm.signal(1, Signal::SIGUSR1);
    assert_eq!(dvm.wait_exit(1), Some(0), "the leaving daemon's exit");
    let others = [0, 2, 3, 4, 5, 6];
    lines.until(
        "every daemon to confirm rank 1's departure",
        &mut seen,
        |s| others.iter().all(|r| confirmed(s, *r, 5)),
    );
    for (r, l) in &seen[left_from..] {
        if l.contains("\"fault\"") {
            assert!(!l.contains("\"newly_failed\":[1]"), "rank {r}: {l}");
        }
    }
    assert!(
        others.iter().all(|o| seen[left_from..]
            .iter()
            .any(|(r, l)| r == o && l.contains("\"departed\":[1]"))),
        "departures seen: {:?}",
        &seen[left_from..]
    );
    // A departure is no fault: shown as departed, and the DVM healthy.
    let view = status_with(&uri_file, 0);
    assert!(view.contains("answered 6, dead 0"), "{view}");
    assert!(view.contains("departed 1"), "{view}");

    // SIGTERM to rank 0 stops the rest of the DVM cleanly, the rejoined daemon too.
    dvm.signal(0, Signal::SIGTERM);
    for r in (2..SIZE as usize).chain([0]) {
        assert_eq!(dvm.wait_exit(r), Some(0), "rank {r} did not stop cleanly");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
