//! The fault-tolerant broadcast across real `tbon daemon` processes: 64 daemons, radix 4; every
//! daemon broadcasts while two interior daemons are killed with SIGKILL. Every broadcast of a
//! survivor must reach every survivor exactly once, each originator's in order, and every
//! survivor must deliver them in the same order; no fault window. Driven through
//! `tbon harness --pattern broadcast`, whose JSON report is read back; timeouts are hang guards
//! only. The rate keeps 64 processes comfortable on two cores and rank 0's window open across
//! the repairs (a refused broadcast would be reported as "not sent", not as a loss). A second
//! run splits every broadcast into parts (pipelined) through the same kills.

mod procs;

#[test]
fn broadcasts_reach_every_survivor_while_two_interior_daemons_are_killed() {
    let (report, stdout) = procs::harness_report(
        "grpcomm-procs",
        &[
            "--daemons",
            "64",
            "--radix",
            "4",
            "--pattern",
            "broadcast",
            "--kill",
            "2",
            "--kill-interior",
            "--duration",
            "6",
            "--rate",
            "2",
            "--timeout",
            "240",
        ],
    );
    let counts = &report["counts"];
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

/// Pipelined broadcasts through kills: rank 0 splits every payload (6 to 40 KB) into parts of
/// 4 KiB (`TBON_BCAST_PART_BYTES`), every daemon forwards parts as they arrive, and two
/// interior daemons are killed mid-stream. Every survivor still delivers every payload whole,
/// once, intact (the harness checks each payload's checksum), in one order.
#[test]
fn split_broadcasts_reach_every_survivor_whole_while_two_interior_daemons_are_killed() {
    let (report, stdout) = procs::harness_report_env(
        "grpcomm-split",
        &[
            "--daemons",
            "16",
            "--radix",
            "2",
            "--pattern",
            "broadcast",
            "--payload",
            "6000..40000",
            "--kill",
            "2",
            "--kill-interior",
            "--duration",
            "5",
            "--rate",
            "4",
            "--timeout",
            "240",
        ],
        &[("TBON_BCAST_PART_BYTES", "4096")],
    );
    let counts = &report["counts"];
    let sent = counts["sent_broadcast"].as_u64().unwrap();
    let not_sent = counts["broadcast_not_sent"].as_u64().unwrap();
    assert!(sent - not_sent > 100, "{counts}");
    for k in [
        "lost_broadcast",
        "duplicated_broadcast",
        "duplicated",
        "reordered_broadcast",
        "broadcast_order_differs",
        "corrupted",
        "misdelivered",
    ] {
        assert_eq!(counts[k], 0, "{k}: {counts}");
    }
    assert_eq!(report["survivors"], 14, "{stdout}");
    assert_eq!(
        counts["delivered"].as_u64().unwrap(),
        (sent - not_sent) * 14,
        "{counts}"
    );
}
