//! Clients from the shell: three `tbon daemon` processes with client sockets open job 7 with
//! one client key (`--client-job`, `--client-key-file`, as a launcher would); a `tbon client
//! recv` on rank 2 gets, in order, what `tbon client send` on rank 0 sends it; sends to a
//! client that exited and to a name never given fail with their reasons; the job key is
//! refused as a client key; bad client flags are refused before the daemon starts.

mod procs;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn tbon() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tbon"))
}

#[test]
fn shell_clients_exchange_through_daemon_processes() {
    let dir = std::env::temp_dir().join(format!("tbon-cli-clients-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let client_key = dir.join("client.key");
    assert!(
        tbon()
            .arg("keygen")
            .arg(&client_key)
            .status()
            .unwrap()
            .success()
    );
    let uri = dir.join("hnp.uri");
    let mut procs = Procs(Vec::new());
    let mut lines = Vec::new();
    for rank in 0..3u32 {
        let mut cmd = tbon();
        cmd.args(["daemon", "--rank", &rank.to_string(), "--size", "3"])
            .arg("--key-file")
            .arg(procs::keygen_file())
            .args(["--if-include", "127.0.0.1/32"])
            .arg(if rank == 0 {
                "--uri-file"
            } else {
                "--hnp-file"
            })
            .arg(&uri)
            .arg("--client-socket")
            .arg(dir.join(format!("d{rank}.sock")))
            .args(["--client-job", "7"])
            .arg("--client-key-file")
            .arg(&client_key)
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        procs.0.push(child);
        lines.push(out.lines());
    }
    // Each daemon says it opened the job (never printing a key that came from a file).
    for (rank, l) in lines.iter_mut().enumerate() {
        let opened = l
            .map_while(Result::ok)
            .find(|l| l.contains("client_job"))
            .expect("a client_job line");
        assert!(opened.contains("\"key\":null"), "{opened}");
        assert!(opened.contains(&format!("\"rank\":{rank}")), "{opened}");
    }
    let client = |rank: u32| {
        let mut c = tbon();
        c.arg("client")
            .arg("--socket")
            .arg(dir.join(format!("d{rank}.sock")))
            .args(["--job", "7"])
            .arg("--key-file")
            .arg(&client_key);
        c
    };
    let mut recv = client(2)
        .args(["recv", "--count", "2", "--timeout-ms", "60000"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(recv.stdout.take().unwrap()).lines();
    let name = out.next().unwrap().unwrap();
    assert!(name.starts_with("2."), "{name}");
    let sent = client(0)
        .args(["send", &name, "321", "hello there", "--count", "2"])
        .output()
        .unwrap();
    assert!(
        sent.status.success(),
        "{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    for _ in 0..2 {
        let line = out.next().unwrap().unwrap();
        assert!(
            line.starts_with("0.") && line.ends_with(" 321 hello there"),
            "{line}"
        );
    }
    assert!(recv.wait().unwrap().success());
    // Sends to a client that exited, and to one never admitted, fail with a reason.
    let gone = client(0)
        .args(["send", &name, "321", "late"])
        .output()
        .unwrap();
    assert!(!gone.status.success());
    assert!(String::from_utf8_lossy(&gone.stderr).contains("has exited"));
    let nobody = client(1)
        .args(["send", "2.99", "321", "x"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&nobody.stderr).contains("no client 2.99"));
    // The job key is not the client key: refused at the door.
    let wrong = tbon()
        .arg("client")
        .arg("--socket")
        .arg(dir.join("d1.sock"))
        .args(["--job", "7"])
        .arg("--key-file")
        .arg(procs::keygen_file())
        .arg("name")
        .output()
        .unwrap();
    assert!(!wrong.status.success());
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert!(err.contains("wrong client key"), "{err}");
    drop(procs);
    std::thread::sleep(Duration::from_millis(50));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Outside-in review: a bad client flag (a malformed client key file, a missing one, a job
/// without a socket) was found only after the daemon had started and joined the DVM, which
/// then recorded it as a fault. Such a daemon now exits 2 before it starts (it never listens,
/// never dials rank 0, whose address here has nobody behind it).
#[test]
fn bad_client_flags_are_refused_before_the_daemon_joins() {
    let dir = std::env::temp_dir().join(format!("tbon-cli-clients-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad_key = dir.join("bad.key");
    std::fs::write(&bad_key, "bad\n").unwrap();
    let socket = dir.join("d1.sock");
    let cases: [(&[&str], &str); 3] = [
        (
            &[
                "--client-socket",
                socket.to_str().unwrap(),
                "--client-job",
                "7",
                "--client-key-file",
                bad_key.to_str().unwrap(),
            ],
            "64 hexadecimal digits",
        ),
        (
            &[
                "--client-socket",
                socket.to_str().unwrap(),
                "--client-job",
                "7",
                "--client-key-file",
                "/nonexistent/key",
            ],
            "/nonexistent/key",
        ),
        (&["--client-job", "7"], "--client-socket"),
    ];
    for (flags, says) in cases {
        let out = tbon()
            .args([
                "daemon",
                "--rank",
                "1",
                "--size",
                "2",
                "--hnp",
                "tbon.0;tcp://127.0.0.1:1",
            ])
            .arg("--key-file")
            .arg(procs::keygen_file())
            .args(["--wireup-timeout-ms", "60000"])
            .args(flags)
            .env("RUST_LOG", "info")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {err}");
        assert!(err.contains(says), "{flags:?}: {err}");
        assert!(
            !err.contains("listening at"),
            "{flags:?}: started first: {err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
