//! `tbon status` against 15 real `tbon daemon` processes: a healthy DVM answers in one
//! summary; a SIGSTOPped interior daemon shows as "no answer" with its subtree unknown while a
//! SIGKILLed leaf shows as silent or dead, and once the heartbeats have found both, as dead
//! with the rest answering; the operator credential from `tbon keygen --operator` works, a
//! wrong one is refused with a clear message; JSON, dot, --all and --watch; `tbon clock` puts
//! every daemon within its bound of rank 0's clock (one host: the true offset is 0); a stopped
//! rank 0 costs the connect timeout and says why, and a watch goes on through failed views.

mod procs;

use procs::keygen_file as key_file;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use tbon::Rank;

const HANG_GUARD: Duration = Duration::from_secs(90);
const SIZE: u32 = 15;

struct Dvm(Vec<Child>);

impl Drop for Dvm {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGCONT);
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn status(uri: &Path, args: &[&str]) -> Output {
    status_like("status", uri, args)
}

/// `tbon <command> --hnp-file <uri> <args>` with no key or contact from the environment.
fn status_like(command: &str, uri: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tbon"))
        .arg(command)
        .arg("--hnp-file")
        .arg(uri)
        .args(args)
        .env_remove("TBON_KEY_FILE")
        .env_remove("TBON_KEY")
        .env_remove("TBON_HNP")
        .output()
        .expect("run tbon status")
}

fn json_status(uri: &Path, key: &Path, extra: &[&str]) -> (Option<i32>, Value) {
    let mut args = vec!["--key-file", key.to_str().unwrap(), "--format", "json"];
    args.extend_from_slice(extra);
    let out = status(uri, &args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), v)
}

fn ranks(v: &Value, field: &str) -> Vec<Rank> {
    v[field]
        .as_array()
        .unwrap_or_else(|| panic!("{field} in {v}"))
        .iter()
        .map(|r| r.as_u64().unwrap() as Rank)
        .collect()
}

fn state_of(v: &Value, rank: Rank) -> String {
    v["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rank"] == rank)
        .map(|r| r["state"].as_str().unwrap().to_string())
        .unwrap_or_else(|| panic!("rank {rank} not in {v}"))
}

fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + HANG_GUARD;
    while !done() {
        assert!(Instant::now() < deadline, "gave up waiting: {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn status_shows_stopped_and_killed_daemons_then_their_repair() {
    let dir = std::env::temp_dir().join(format!("tbon-status-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let uri: PathBuf = dir.join("hnp.uri");
    let _ = std::fs::remove_file(&uri);
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
        .args(["--radix", "2", "--if-include", "127.0.0.1/32"])
        .args([
            "--heartbeat-interval-ms",
            "300",
            "--heartbeat-timeout-ms",
            "3000",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        if rank == 0 {
            cmd.arg("--uri-file").arg(&uri);
        } else {
            cmd.arg("--hnp-file").arg(&uri);
        }
        dvm.0.push(cmd.spawn().expect("spawn tbon daemon"));
    }
    let key = key_file();
    until("every daemon answers", || {
        uri.exists() && {
            let out = status(
                &uri,
                &["--key-file", key.to_str().unwrap(), "--format", "json"],
            );
            out.status.code() == Some(0)
                && serde_json::from_slice::<Value>(&out.stdout).is_ok_and(|v| v["answered"] == SIZE)
        }
    });

    // Healthy: one summary part for the whole DVM; --all: every daemon in detail, each
    // placed where the tree puts it.
    let (code, v) = json_status(&uri, key, &[]);
    assert_eq!(code, Some(0), "{v}");
    let parts = v["report"]["parts"].as_array().unwrap();
    assert_eq!(parts.len(), 1, "{v}");
    assert_eq!(parts[0]["part"], "healthy");
    assert_eq!(parts[0]["daemons"], SIZE);
    let tree = tbon::routed::tree_view(2, SIZE, &[]).unwrap();
    let (_, all) = json_status(&uri, key, &["--all"]);
    let detail = all["report"]["parts"].as_array().unwrap();
    assert_eq!(detail.len(), SIZE as usize, "{all}");
    for p in detail {
        assert_eq!(p["part"], "daemon");
        let n = tree
            .iter()
            .find(|n| u64::from(n.rank) == p["rank"])
            .unwrap();
        assert_eq!(p["parent"].as_u64().map(|x| x as Rank), n.parent, "{p}");
        assert_eq!(p["depth"], n.depth, "{p}");
    }

    // `tbon clock`: every daemon's offset from rank 0, within its bound of the truth, which is
    // 0 on one host.
    let out = status_like(
        "clock",
        &uri,
        &["--key-file", key.to_str().unwrap(), "--format", "json"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let clock: Value = serde_json::from_slice(&out.stdout).unwrap();
    let offsets = clock["offsets"].as_array().unwrap();
    assert_eq!(offsets.len(), SIZE as usize, "{clock}");
    for o in offsets {
        let (offset, bound) = (
            o["offset_ns"].as_i64().unwrap(),
            o["bound_ns"].as_u64().unwrap(),
        );
        assert!(offset.unsigned_abs() <= bound, "one host, one clock: {o}");
        if o["rank"] != 0 {
            assert!(bound > 0, "{o}");
        }
    }

    // The operator credential works; a key of another DVM is refused, clearly.
    let cred = dir.join("operator.cred");
    let other = dir.join("other.key");
    for f in [&cred, &other] {
        let _ = std::fs::remove_file(f);
    }
    let keygen = |args: &[&Path]| {
        let st = Command::new(env!("CARGO_BIN_EXE_tbon"))
            .arg("keygen")
            .args(args)
            .status()
            .unwrap();
        assert!(st.success());
    };
    keygen(&[Path::new("--operator"), key, &cred]);
    keygen(&[&other]);
    let out = status(&uri, &["--credential-file", cred.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains(&format!("answered {SIZE}, dead 0")), "{text}");
    for wrong in [&other, key] {
        let out = status(&uri, &["--credential-file", wrong.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("credential refused"), "{err}");
    }

    // An interior daemon stopped, a leaf killed (not below it).
    let stopped = tree
        .iter()
        .find(|n| n.depth == 1 && !n.children.is_empty())
        .unwrap();
    let below: Vec<Rank> = tree
        .iter()
        .filter(|n| {
            let mut p = n.parent;
            while let Some(q) = p {
                if q == stopped.rank {
                    return true;
                }
                p = tree.iter().find(|m| m.rank == q).unwrap().parent;
            }
            false
        })
        .map(|n| n.rank)
        .collect();
    let killed = tree
        .iter()
        .find(|n| n.children.is_empty() && !below.contains(&n.rank))
        .unwrap()
        .rank;
    let pid = |r: Rank| Pid::from_raw(dvm.0[r as usize].id() as i32);
    kill(pid(stopped.rank), Signal::SIGSTOP).unwrap();
    kill(pid(killed), Signal::SIGKILL).unwrap();
    let (code, v) = json_status(&uri, key, &["--budget-ms", "400"]);
    assert_eq!(code, Some(1), "{v}");
    let s = state_of(&v, stopped.rank);
    assert!(s == "no-answer" || s == "dead", "stopped: {s} in {v}");
    if s == "no-answer" {
        for b in &below {
            assert_eq!(
                state_of(&v, *b),
                "unknown",
                "rank {b} below the stopped one"
            );
        }
    }
    let k = state_of(&v, killed);
    assert!(k == "no-answer" || k == "dead", "killed: {k} in {v}");
    for r in 0..SIZE {
        if r != stopped.rank && r != killed && !below.contains(&r) {
            let st = state_of(&v, r);
            assert!(st == "alive" || st == "healthy", "rank {r}: {st} in {v}");
        }
    }
    let text = String::from_utf8_lossy(
        &status(
            &uri,
            &["--key-file", key.to_str().unwrap(), "--budget-ms", "400"],
        )
        .stdout,
    )
    .into_owned();
    assert!(text.contains(&format!("{}  ", stopped.rank)), "{text}");

    // Once the heartbeats found both: dead, and everyone else answers.
    let mut dead = vec![stopped.rank, killed];
    dead.sort_unstable();
    let mut last = Value::Null;
    until("both declared dead, the rest answering", || {
        let (code, v) = json_status(&uri, key, &[]);
        let done = code == Some(1) && ranks(&v, "dead") == dead && v["answered"] == SIZE - 2;
        last = v;
        done
    });
    assert!(ranks(&last, "no_answer").is_empty(), "{last}");
    let out = status(
        &uri,
        &["--key-file", key.to_str().unwrap(), "--format", "dot"],
    );
    let dot = String::from_utf8_lossy(&out.stdout);
    assert!(dot.starts_with("digraph"), "{dot}");
    assert!(
        dot.contains(&format!("{} [fillcolor=red", stopped.rank)),
        "{dot}"
    );
    let out = status(
        &uri,
        &[
            "--key-file",
            key.to_str().unwrap(),
            "--watch",
            "0.2",
            "--count",
            "2",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches("DVM of 15 daemons").count(), 2, "{text}");
    assert_eq!(out.status.code(), Some(1));

    // A stopped rank 0: the tool gives up after its connect timeout, says why, and a watch
    // goes on through the failed views.
    kill(pid(0), Signal::SIGSTOP).unwrap();
    let key_arg = key.to_str().unwrap();
    let impatient = |more: &[&str]| {
        let mut args = vec!["--key-file", key_arg, "--connect-timeout-ms", "300"];
        args.extend_from_slice(more);
        status(&uri, &args)
    };
    let out = impatient(&["--budget-ms", "100"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("did not complete the handshake in time"),
        "{err}"
    );
    let out = impatient(&["--watch", "0.1", "--count", "2"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(
        err.matches("did not complete the handshake").count(),
        2,
        "{err}"
    );
    kill(pid(0), Signal::SIGCONT).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
