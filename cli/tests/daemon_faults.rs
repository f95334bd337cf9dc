//! Faults with real `tbon daemon` processes: a SIGSTOPped daemon is found by heartbeats and
//! declared dead; after SIGCONT it exits non-zero instead of rejoining; a SIGKILLed interior
//! daemon is found by its lost connections. Survivors keep running and stop cleanly at the end.

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

#[test]
fn stopped_daemon_is_declared_dead_and_exits_on_resume_killed_one_is_repaired() {
    let dir = std::env::temp_dir().join(format!("tbon-faults-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let uri_file = dir.join("hnp.uri");
    let _ = std::fs::remove_file(&uri_file);
    let (tx, rx) = mpsc::channel();
    let mut dvm = Dvm(Vec::new());
    for rank in 0..SIZE {
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
        .env("RUST_LOG", "tbon=info")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
        if rank == 0 {
            cmd.arg("--uri-file").arg(&uri_file);
        } else {
            cmd.arg("--hnp-file").arg(&uri_file);
        }
        let mut child = cmd.spawn().expect("spawn tbon daemon");
        let out = child.stdout.take().unwrap();
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send((rank as usize, line));
            }
        });
        dvm.0.push(Some(child));
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

    // SIGTERM to rank 0 stops the rest of the DVM cleanly.
    dvm.signal(0, Signal::SIGTERM);
    for r in others {
        assert_eq!(dvm.wait_exit(r), Some(0), "rank {r} did not stop cleanly");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
