//! `tbon bench` roles start, talk and report: a quick ping-pong run (tbon and the plain mio
//! baseline, several processes). Checks that the table is printed and that the HTML report
//! draws the round trips as bars with tbon's multiple of mio's; never timing.
use std::process::Command;

#[test]
fn bench_pingpong_prints_its_table() {
    let html = std::env::temp_dir().join(format!("tbon-bench-smoke-{}.html", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_tbon"))
        .args(["bench", "--quick", "--only", "pingpong", "--report"])
        .arg(&html)
        .output()
        .expect("run tbon bench");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "tbon bench failed: {text}");
    assert!(text.contains("| tbon |"), "{text}");
    assert!(text.contains("| plain mio, same wake-ups |"), "{text}");
    let page = std::fs::read_to_string(&html).expect("the report was written");
    let options = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let doc = roxmltree::Document::parse_with_options(&page, options).expect("well-formed");
    let chart = doc
        .descendants()
        .find(|n| n.has_tag_name("figure") && n.attribute("id") == Some("pingpong"))
        .expect("the round-trip chart");
    let bars = chart
        .descendants()
        .filter(|n| n.tag_name().name() == "rect")
        .filter(|r| r.attribute("fill").is_some_and(|c| c != "#FFFFFF"))
        .count();
    assert!(
        bars >= 4,
        "p50 and p99 of tbon and mio, and the legend: {bars}"
    );
    let texts: Vec<&str> = chart.descendants().filter_map(|n| n.text()).collect();
    assert!(
        texts.iter().any(|t| t.contains("×)")),
        "tbon's multiple of mio: {texts:?}"
    );
    let _ = std::fs::remove_file(&html);
}

/// The raw-TCP baseline of the stream round trip (`raw-stream-produce`/`raw-stream-consume`)
/// runs to its end in both modes and reports: the pings on a connection of their own, and on
/// the stream's (where the last pong can come after the stream's last byte).
#[test]
fn the_raw_stream_round_trip_baseline_ends_in_both_modes() {
    for mode in ["two", "one"] {
        let dir = std::env::temp_dir().join(format!(
            "tbon-bench-raw-stream-{}-{mode}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("run dir");
        let role = |name: &str| {
            let mut c = Command::new(env!("CARGO_BIN_EXE_tbon"));
            c.args([
                "bench", "--role", name, "--count", "16777216", "--route", mode,
            ])
            .arg("--dir")
            .arg(&dir);
            c
        };
        let mut producer = role("raw-stream-produce")
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start the producer");
        let out = role("raw-stream-consume")
            .output()
            .expect("run the consumer");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{mode}: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            producer.wait().expect("the producer ends").success(),
            "{mode}"
        );
        let v: serde_json::Value = serde_json::from_str(text.lines().next().unwrap_or(""))
            .unwrap_or_else(|e| panic!("{mode}: {e}: {text}"));
        assert!(v["gib_per_s"].as_f64().unwrap_or(0.0) > 0.0, "{mode}: {v}");
        assert!(
            v["idle_rtt_p50_us"].as_f64().unwrap_or(0.0) > 0.0,
            "{mode}: {v}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The raw-TCP bandwidth baseline with the stream's end-to-end check (`--digest`: the sender
/// makes each frame's XXH3, the receiver checks it) runs to its end and reports.
#[test]
fn the_raw_baseline_with_digests_ends_and_reports() {
    let dir = std::env::temp_dir().join(format!("tbon-bench-raw-digest-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("run dir");
    let role = |name: &str| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_tbon"));
        c.args([
            "bench",
            "--role",
            name,
            "--payload",
            "1048576",
            "--count",
            "64",
            "--digest",
        ])
        .arg("--dir")
        .arg(&dir);
        c
    };
    let recv = role("raw-recv")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the receiver");
    let send = role("raw-send").output().expect("run the sender");
    assert!(
        send.status.success(),
        "{}",
        String::from_utf8_lossy(&send.stderr)
    );
    let out = recv.wait_with_output().expect("the receiver ends");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(text.lines().next().unwrap_or(""))
        .unwrap_or_else(|e| panic!("{e}: {text}"));
    // The meter starts its clock at the first message: it counts the 63 after it.
    assert!(v["msgs"].as_f64().unwrap_or(0.0) >= 63.0, "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The stream role (three daemons: a producer, a relay, a consumer) runs in both of the
/// bench's measures: alone (`--no-pings`, the bandwidth rows, nothing but the stream) and with
/// 64 B pings before and beside it (the round trip rows); by a reader and by a callback.
#[test]
fn the_stream_role_reports_alone_and_with_pings() {
    for (extra, pings) in [
        (&["--no-pings"][..], false),
        (&["--no-pings", "--callback"][..], false),
        (&[][..], true),
    ] {
        let dir = std::env::temp_dir().join(format!(
            "tbon-bench-stream-{}-{}",
            std::process::id(),
            extra.join("")
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let kids: Vec<_> = (0..3)
            .map(|rank| {
                Command::new(env!("CARGO_BIN_EXE_tbon"))
                    .args(["bench", "--role", "stream", "--size", "3"])
                    .args([
                        "--rank",
                        &rank.to_string(),
                        "--sender",
                        "1",
                        "--receiver",
                        "2",
                    ])
                    .args(["--payload", "1", "--count", &(8u64 << 20).to_string()])
                    .args(["--route", "direct", "--radix", "2"])
                    .args(extra)
                    .arg("--dir")
                    .arg(&dir)
                    .env("RUST_LOG", "error")
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .expect("spawn a stream role")
            })
            .collect();
        let outs: Vec<_> = kids
            .into_iter()
            .map(|k| k.wait_with_output().expect("a stream role ends"))
            .collect();
        for o in &outs {
            assert!(o.status.success(), "{extra:?}: {o:?}");
        }
        let text = String::from_utf8_lossy(&outs[2].stdout);
        let line = text.lines().last().expect("the consumer's report");
        let v: serde_json::Value = serde_json::from_str(line).expect("JSON");
        assert_eq!(v["bytes"].as_u64(), Some(8 << 20), "{extra:?}: {v}");
        assert!(v["gib_per_s"].as_f64().is_some_and(|g| g > 0.0), "{v}");
        let pinged = v["stream_pings"].as_u64().unwrap_or(0) > 0
            || v["idle_rtt_p50_us"].as_f64().unwrap_or(0.0) > 0.0;
        assert_eq!(pinged, pings, "{extra:?}: {v}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
