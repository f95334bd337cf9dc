//! Reliable messaging across real `tbon daemon` processes: radix 2, 15 daemons; every leaf
//! sends reliable messages to every other leaf while two interior daemons are killed with
//! SIGKILL. Every message between survivors must be delivered exactly once and in order.
//! Driven through `tbon harness --mode reliable --pattern leaves`, whose JSON report is read
//! back; timeouts are hang guards only.

use std::process::Command;

#[test]
fn leaves_exchange_reliably_while_two_interior_daemons_are_killed() {
    let json = std::env::temp_dir().join(format!("tbon-relm-procs-{}.json", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_tbon"))
        .args(["harness", "--daemons", "15", "--radix", "2"])
        .args(["--pattern", "leaves", "--mode", "reliable"])
        .args(["--duration", "6", "--rate", "100", "--payload", "64..2048"])
        .args([
            "--kill",
            "2",
            "--kill-interior",
            "--quiet",
            "--timeout",
            "240",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run tbon harness");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    let counts = &report["counts"];
    assert_eq!(report["passed"], true, "{stdout}");
    assert!(counts["sent_reliable"].as_u64().unwrap() > 500, "{counts}");
    assert_eq!(counts["sent_plain"], 0, "{counts}");
    assert_eq!(counts["lost_reliable"], 0, "{counts}");
    assert_eq!(counts["reordered_reliable"], 0, "{counts}");
    assert_eq!(counts["duplicated"], 0, "{counts}");
    assert_eq!(counts["corrupted"], 0, "{counts}");
    assert_eq!(counts["misdelivered"], 0, "{counts}");
    let faults = report["faults"].as_array().unwrap();
    assert_eq!(faults.len(), 2, "{stdout}");
    for f in faults {
        let r = f["rank"].as_u64().unwrap();
        assert!((1..=6).contains(&r), "rank {r} is not interior");
    }
}
