//! Strangers attacking a DVM of real `tbon daemon` processes while traffic flows, through
//! `tbon harness --attack`: forged Hellos claiming every rank (renewed faster than the handshake
//! timeout) while two interior daemons are killed, and a flood of 2,000 idle, partial,
//! Hello-only and slow connections. The harness's own checks must hold (every fault repaired,
//! no live daemon declared dead, nothing lost outside the fault windows, clean stops); the
//! memory figures it reports are measurements, not asserted. Timeouts are hang guards only.

mod procs;

#[test]
fn forged_hellos_for_every_rank_do_not_stop_repairs() {
    let (report, stdout) = procs::harness_report(
        "hostile-forge",
        &[
            "--daemons",
            "8",
            "--radix",
            "2",
            "--attack",
            "forge",
            "--kill",
            "2",
            "--kill-interior",
            "--duration",
            "6",
            "--timeout",
            "120",
        ],
    );
    assert_eq!(report["passed"], true, "{stdout}");
    assert_eq!(report["survivors"], 6, "{stdout}");
    let outcome = &report["attack"]["outcome"];
    assert!(outcome["forged_hellos"].as_u64().unwrap() > 0, "{stdout}");
}

#[test]
fn a_flood_of_2000_connections_is_survived() {
    let (report, stdout) = procs::harness_report(
        "hostile-flood",
        &[
            "--daemons",
            "8",
            "--radix",
            "2",
            "--attack",
            "flood",
            "--attack-connections",
            "2000",
            "--kill",
            "1",
            "--duration",
            "6",
            "--timeout",
            "120",
        ],
    );
    assert_eq!(report["passed"], true, "{stdout}");
    let outcome = &report["attack"]["outcome"];
    assert!(outcome["opened"].as_u64().unwrap() >= 2000, "{stdout}");
    assert_eq!(
        report["attack"]["rss_anon_kib"].as_array().unwrap().len(),
        8,
        "{stdout}"
    );
}
