//! Reliable messaging across real `tbon daemon` processes: radix 2, 15 daemons; every leaf
//! sends reliable messages to every other leaf while two interior daemons are killed with
//! SIGKILL. Every message between survivors must be delivered exactly once and in order.
//! Driven through `tbon harness --mode reliable --pattern leaves`, whose JSON report is read
//! back; timeouts are hang guards only.

mod procs;

#[test]
fn leaves_exchange_reliably_while_two_interior_daemons_are_killed() {
    let (report, stdout) = procs::harness_report(
        "relm-procs",
        &[
            "--daemons",
            "15",
            "--radix",
            "2",
            "--pattern",
            "leaves",
            "--mode",
            "reliable",
            "--duration",
            "6",
            "--rate",
            "100",
            "--payload",
            "64..2048",
            "--kill",
            "2",
            "--kill-interior",
            "--timeout",
            "240",
        ],
    );
    let counts = &report["counts"];
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
