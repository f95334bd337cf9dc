//! `tbon sim` run as a user would: the radix sweep (`--sweep-radix`).
use std::process::Command;

fn tbon(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tbon"))
        .args(args)
        .output()
        .expect("run tbon")
}

fn sweep_json(extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "sim",
        "--sweep-radix",
        "--daemons",
        "200",
        "--radixes",
        "2,8,199",
        "--format",
        "json",
    ];
    args.extend_from_slice(extra);
    let out = tbon(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("sweep JSON")
}

#[test]
fn the_sweep_times_every_radix_and_recommends_one() {
    let s = sweep_json(&[]);
    let rows = s["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "{s}");
    for r in rows {
        for key in [
            "wireup_us",
            "protocol_us",
            "bcast_us",
            "allgather_us",
            "repair_us",
        ] {
            assert!(r[key].as_u64().unwrap() > 0, "{key} in {r}");
        }
        assert!(r["worst_ratio"].as_f64().unwrap() >= 1.0, "{r}");
    }
    let flat = rows.iter().find(|r| r["radix"] == 199).unwrap();
    assert_eq!(flat["depth"], 1);
    let k = s["recommended"].as_u64().unwrap();
    assert!([2, 8, 199].contains(&k), "{s}");
}

#[test]
fn costly_frames_make_the_flat_tree_lose() {
    // Without processor cost only depth counts: the flat tree broadcasts fastest. At 300 µs a
    // frame, rank 0 sending 199 copies one after another is slower than two more hops.
    let cheap = sweep_json(&["--frame-ns", "0"]);
    let costly = sweep_json(&["--frame-ns", "300000"]);
    let bcast = |s: &serde_json::Value, k: u64| {
        s["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["radix"] == k)
            .unwrap()["bcast_us"]
            .as_u64()
            .unwrap()
    };
    assert!(bcast(&cheap, 199) < bcast(&cheap, 8), "{cheap}");
    assert!(bcast(&costly, 199) > bcast(&costly, 8), "{costly}");
    assert_ne!(costly["recommended"], 199, "{costly}");
}

/// From a docs audit: `--bcast-part-bytes` was declared twice (the seeds' and the sweep's), and
/// clap gave the value to the seeds' only, so the sweep always pipelined in 256 KiB parts. A
/// broadcast of 1 MiB stored and forwarded whole must take longer than one in parts.
#[test]
fn the_sweep_takes_bcast_part_bytes() {
    let big = ["--bcast-bytes", "1048576"];
    let whole = sweep_json(&[&big[..], &["--bcast-part-bytes", "0"]].concat());
    let parts = sweep_json(&big);
    let bcast = |s: &serde_json::Value| s["rows"][0]["bcast_us"].as_u64().unwrap();
    assert!(bcast(&whole) > bcast(&parts), "{whole} {parts}");
}

#[test]
fn the_text_table_and_bad_flags() {
    let out = tbon(&[
        "sim",
        "--sweep-radix",
        "--daemons",
        "100",
        "--radixes",
        "4,16",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("recommended radix:"), "{text}");
    assert!(text.contains("<- recommended"), "{text}");

    let out = tbon(&["sim", "--sweep-radix", "--radixes", "1"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("a radix is at least 2"), "{err}");

    // Sweep flags without --sweep-radix are refused, not ignored.
    for flags in [
        &["--latency-us", "5"][..],
        &["--format", "json"],
        &["--radixes", "4"],
    ] {
        let mut args = vec!["sim", "--seeds", "1"];
        args.extend_from_slice(flags);
        let out = tbon(&args);
        assert!(!out.status.success(), "{flags:?} was accepted");
    }
    // And seed flags with it.
    let out = tbon(&["sim", "--sweep-radix", "--radix", "4"]);
    assert!(!out.status.success());
}
