//! The fault-tolerant broadcast across real `tbon daemon` processes: 64 daemons, radix 4; every
//! daemon broadcasts while two interior daemons are killed with SIGKILL. Every broadcast of a
//! survivor must reach every survivor exactly once, each originator's in order, and every
//! survivor must deliver them in the same order; no fault window. Driven through
//! `tbon harness --pattern broadcast`, whose JSON report is read back; timeouts are hang guards
//! only. The rate keeps 64 processes comfortable on two cores and rank 0's window open across
//! the repairs (a refused broadcast would be reported as "not sent", not as a loss).

use std::process::Command;

#[test]
fn broadcasts_reach_every_survivor_while_two_interior_daemons_are_killed() {
    let json = std::env::temp_dir().join(format!("tbon-grpcomm-procs-{}.json", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_tbon"))
        .args(["harness", "--daemons", "64", "--radix", "4"])
        .args(["--pattern", "broadcast", "--kill", "2", "--kill-interior"])
        .args([
            "--duration",
            "6",
            "--rate",
            "2",
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
    let sent = counts["sent_broadcast"].as_u64().unwrap();
    let not_sent = counts["broadcast_not_sent"].as_u64().unwrap();
    assert!(sent - not_sent > 500, "{counts}");
    assert_eq!(counts["lost_broadcast"], 0, "{counts}");
    assert_eq!(counts["duplicated_broadcast"], 0, "{counts}");
    assert_eq!(counts["duplicated"], 0, "{counts}");
    assert_eq!(counts["reordered_broadcast"], 0, "{counts}");
    assert_eq!(counts["broadcast_order_differs"], 0, "{counts}");
    assert_eq!(counts["corrupted"], 0, "{counts}");
    assert_eq!(counts["misdelivered"], 0, "{counts}");
    assert_eq!(counts["sent_plain"], 0, "{counts}");
    assert_eq!(report["survivors"], 62, "{stdout}");
    // Each survivor's copy of every broadcast that went out.
    assert_eq!(
        counts["delivered"].as_u64().unwrap(),
        (sent - not_sent) * 62,
        "{counts}"
    );
    let faults = report["faults"].as_array().unwrap();
    assert_eq!(faults.len(), 2, "{stdout}");
    for f in faults {
        assert!(f["repaired_everywhere_after_ms"].as_f64().is_some(), "{f}");
    }
}
