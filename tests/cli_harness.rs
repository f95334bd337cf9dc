//! `tbon harness` as a user runs it: a short run with one interior daemon killed passes and
//! reports it in JSON. The reliable-mode run with 15 daemons is `tests/relm_processes.rs`.

use std::process::Command;

#[test]
fn short_harness_run_with_a_kill_passes() {
    let json = std::env::temp_dir().join(format!("tbon-harness-test-{}.json", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_tbon"))
        .args([
            "harness",
            "--daemons",
            "7",
            "--radix",
            "2",
            "--duration",
            "3",
        ])
        .args(["--rate", "100", "--kill", "1", "--quiet", "--timeout", "60"])
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run tbon harness");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("PASS"), "{stdout}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["passed"], true);
    assert_eq!(report["counts"]["duplicated"], 0);
    assert_eq!(report["faults"].as_array().unwrap().len(), 1);
    let _ = std::fs::remove_file(&json);
}

#[test]
fn harness_streams_finish_or_fail_as_documented_through_a_kill() {
    let json = std::env::temp_dir().join(format!(
        "tbon-harness-stream-test-{}.json",
        std::process::id()
    ));
    let out = Command::new(env!("CARGO_BIN_EXE_tbon"))
        .args([
            "harness",
            "--daemons",
            "7",
            "--radix",
            "2",
            "--duration",
            "3",
        ])
        .args(["--rate", "50", "--kill", "1", "--quiet", "--timeout", "90"])
        .args([
            "--pattern",
            "stream",
            "--streams",
            "4",
            "--stream-bytes",
            "2M",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run tbon harness");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let s = &report["streams"];
    assert_eq!(s["wrong"], 0, "{s}");
    // Six survivors fetch four streams each.
    assert_eq!(s["fetched"], 24, "{s}");
    let finished = s["finished"].as_u64().unwrap();
    let documented = s["failed_producer_victim"].as_u64().unwrap();
    assert_eq!(finished + documented, 24, "{s}");
    assert!(finished >= 16, "{s}");
    let _ = std::fs::remove_file(&json);
}
