//! `tbon harness` as a user runs it: a short run with one interior daemon killed passes and
//! reports it in JSON and in an HTML report, whose charts are parsed and checked; a run that
//! fails still writes its report. The reliable-mode run with 15 daemons is
//! `cli/tests/relm_processes.rs`.

use std::process::Command;

#[test]
fn short_harness_run_with_a_kill_passes() {
    let json = std::env::temp_dir().join(format!("tbon-harness-test-{}.json", std::process::id()));
    let html = json.with_extension("html");
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
        .arg("--report")
        .arg(&html)
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
    // `tbon clock` against the live DVM after the traffic: the six survivors, each offset
    // within its bound of the one clock they share.
    let clocks = &report["clocks"];
    assert_eq!(clocks["measured"], 6, "{clocks}");
    assert_eq!(clocks["outside_bound"], 0, "{clocks}");
    for o in clocks["offsets"].as_array().unwrap() {
        let (offset, bound) = (
            o["offset_ns"].as_i64().unwrap(),
            o["bound_ns"].as_u64().unwrap(),
        );
        assert!(offset.unsigned_abs() <= bound, "{o}");
    }
    let page = std::fs::read_to_string(&html).expect("the report was written");
    check_report(&page, &report);
    let _ = std::fs::remove_file(&json);
    let _ = std::fs::remove_file(&html);
}

/// A rate of 0 is a bad option, exit 2, said at once (it was taken, and the run hung in its
/// traffic phase until its timeout: from an outside-in review).
#[test]
fn a_rate_of_zero_is_a_bad_option() {
    let out = Command::new(env!("CARGO_BIN_EXE_tbon"))
        .args(["harness", "--rate", "0", "--timeout", "20"])
        .output()
        .expect("run tbon harness");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--rate must be more than 0"), "{err}");
}

/// A run that fails (here: it cannot finish within its `--timeout`) still writes its report,
/// and the report says it failed, why, and what it could not show.
#[test]
fn a_failed_harness_run_still_writes_its_report() {
    let html = std::env::temp_dir().join(format!("tbon-harness-fail-{}.html", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_tbon"))
        .args([
            "harness",
            "--daemons",
            "4",
            "--duration",
            "20",
            "--rate",
            "50",
            "--kill",
            "0",
        ])
        .args(["--quiet", "--timeout", "3"])
        .arg("--report")
        .arg(&html)
        .output()
        .expect("run tbon harness");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let page = std::fs::read_to_string(&html).expect("the report was written");
    let doc = parse(&page).expect("the report is well-formed");
    let fails: Vec<&str> = doc
        .descendants()
        .filter(|n| n.attribute("class") == Some("fail"))
        .filter_map(|n| n.text())
        .collect();
    assert!(fails.contains(&"FAIL"), "{fails:?}");
    assert!(page.contains("did not finish within --timeout 3 s"));
    // A hung run is ended by killing its daemons, which then write no results: said so,
    // rather than drawn as empty charts.
    assert!(page.contains("No delivery results were collected"));
    assert!(figure(&doc, "timeline").is_none());
    assert!(
        figure(&doc, "tree-before").is_some(),
        "the tree is drawn still"
    );
    let _ = std::fs::remove_file(&html);
}

/// The page as XML (its `<!DOCTYPE html>` allowed).
fn parse(page: &str) -> Result<roxmltree::Document<'_>, roxmltree::Error> {
    let options = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    roxmltree::Document::parse_with_options(page, options)
}

/// The `<svg>` of the figure with this id.
fn figure<'a>(doc: &'a roxmltree::Document<'a>, id: &str) -> Option<roxmltree::Node<'a, 'a>> {
    doc.descendants()
        .find(|n| n.has_tag_name("figure") && n.attribute("id") == Some(id))?
        .descendants()
        .find(|n| n.tag_name().name() == "svg")
}

/// The elements named `tag` inside `svg`.
fn named<'a, 'i>(svg: roxmltree::Node<'a, 'i>, tag: &str) -> Vec<roxmltree::Node<'a, 'i>> {
    svg.descendants()
        .filter(|n| n.tag_name().name() == tag)
        .collect()
}

/// Parses the report as XML and checks every chart has data and every fault is marked.
fn check_report(page: &str, run: &serde_json::Value) {
    let doc = parse(page).expect("the report is well-formed XHTML");
    // Timeline: a line of deliveries with a point per bin, latency dots, each fault labelled.
    let timeline = figure(&doc, "timeline").expect("a timeline");
    let bins = run["timeline"]["bins"].as_array().unwrap();
    assert!(bins.len() >= 20, "3 s of 100 ms bins: {}", bins.len());
    let longest = named(timeline, "polyline")
        .iter()
        .filter(|p| p.attribute("fill") == Some("none") && p.attribute("stroke-width") == Some("2"))
        .map(|p| {
            p.attribute("points")
                .unwrap_or("")
                .split_whitespace()
                .count()
        })
        .max()
        .unwrap_or(0);
    assert!(
        longest >= bins.len(),
        "a deliveries line through every bin: {longest}"
    );
    assert!(!named(timeline, "circle").is_empty(), "latency dots");
    let labels: Vec<&str> = named(timeline, "text")
        .iter()
        .filter_map(|t| Some(t.text()?.trim()))
        .collect();
    for f in run["faults"].as_array().unwrap() {
        // Faults of one kind at one time (a host cut off) share a label naming every rank.
        let (kind, rank) = (f["kind"].as_str().unwrap(), f["rank"].to_string());
        let named = |l: &&str| {
            l.strip_prefix(kind)
                .is_some_and(|ranks| ranks.split(", ").any(|r| r.trim() == rank))
        };
        assert!(labels.iter().any(named), "{kind} {rank} not in {labels:?}");
    }
    // The JSON's time series is the one drawn: its deliveries add up.
    let binned: u64 = bins.iter().map(|b| b["delivered"].as_u64().unwrap()).sum();
    assert_eq!(binned, run["counts"]["delivered"].as_u64().unwrap());
    // A histogram per mode that delivered anything, with bars.
    let histogram = &run["latency_histogram"];
    for mode in ["plain", "reliable", "broadcast"] {
        let count: u64 = histogram[mode]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_u64().unwrap())
            .sum();
        if count == 0 {
            continue;
        }
        let svg = figure(&doc, &format!("latency-{mode}")).expect("a histogram");
        let bars = named(svg, "rect")
            .into_iter()
            .filter(|r| r.attribute("opacity") == Some("0.35"))
            .count();
        assert!(bars >= 1, "{mode}: no bars");
    }
    // The trees: every daemon before, every survivor after.
    let daemons = run["daemons"].as_u64().unwrap() as usize;
    let survivors = run["survivors"].as_u64().unwrap() as usize;
    let before = figure(&doc, "tree-before").expect("the tree before");
    assert!(named(before, "circle").len() >= 2 * daemons);
    let after = figure(&doc, "tree-after").expect("the tree after");
    assert_eq!(named(after, "circle").len(), 2 * survivors);
    // The checks table: one row per check and problem, after its header.
    let checks = doc
        .descendants()
        .find(|n| n.has_tag_name("table") && n.attribute("id") == Some("checks"))
        .expect("the checks");
    let rows = checks.children().filter(|n| n.has_tag_name("tr")).count();
    assert_eq!(rows, 1 + run["checks"].as_array().unwrap().len());
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

#[test]
fn harness_group_collectives_complete_at_every_survivor_through_kills() {
    let json = std::env::temp_dir().join(format!(
        "tbon-harness-group-test-{}.json",
        std::process::id()
    ));
    let out = Command::new(env!("CARGO_BIN_EXE_tbon"))
        .args(["harness", "--daemons", "12", "--radix", "2"])
        .args(["--duration", "4", "--rate", "50", "--kill", "2"])
        .args(["--quiet", "--timeout", "120", "--mode", "reliable"])
        .args([
            "--pattern",
            "group",
            "--group-size",
            "4",
            "--group-rounds",
            "9",
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
    let g = &report["groups"];
    assert_eq!(g["wrong"], 0, "{g}");
    // Twelve daemons in groups of four: six groups, nine collectives each.
    assert_eq!(g["groups"], 6, "{g}");
    assert_eq!(g["collectives"], 54, "{g}");
    assert!(g["ok"].as_u64().unwrap() > 100, "{g}");
    let _ = std::fs::remove_file(&json);
}

#[test]
fn harness_clients_exchange_through_their_daemons_through_daemon_and_client_kills() {
    let json = std::env::temp_dir().join(format!(
        "tbon-harness-clients-test-{}.json",
        std::process::id()
    ));
    let out = Command::new(env!("CARGO_BIN_EXE_tbon"))
        .args(["harness", "--daemons", "8", "--radix", "2"])
        .args(["--messages", "300", "--rate", "150", "--kill", "1"])
        .args(["--quiet", "--timeout", "120", "--mode", "reliable"])
        .args(["--clients-per-daemon", "2", "--client-messages", "300"])
        .args(["--client-kill", "2"])
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
    let c = &report["clients"];
    assert_eq!(c["wrong"], 0, "{c}");
    assert_eq!(c["workers"], 16, "{c}");
    assert_eq!(c["killed"], 2, "{c}");
    // The killed daemon (interior) took its two clients with it.
    assert_eq!(c["orphaned"], 2, "{c}");
    // Twelve clients ran to the end: every ordered pair of them judged in full.
    assert_eq!(c["live_pairs"], 12 * 11, "{c}");
    assert!(c["live_messages"].as_u64().unwrap() > 1_500, "{c}");
    assert!(c["exits_seen"].as_u64().unwrap() > 0, "{c}");
    let _ = std::fs::remove_file(&json);
}

/// Runs `tbon harness` with `args` (split at spaces; plus `--quiet`, `--timeout 120` and a JSON
/// report); it must pass. Its JSON report.
fn passing_run(name: &str, args: &str) -> serde_json::Value {
    let json = std::env::temp_dir().join(format!(
        "tbon-harness-{name}-test-{}.json",
        std::process::id()
    ));
    let out = Command::new(env!("CARGO_BIN_EXE_tbon"))
        .arg("harness")
        .args(args.split(' '))
        .args(["--quiet", "--timeout", "120"])
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
    let _ = std::fs::remove_file(&json);
    assert_eq!(report["passed"], true);
    report
}

/// `--restart`: daemons killed while traffic flows are started again with `--rejoin`, are
/// admitted back, learnt by every survivor, and carry traffic both ways; a plain kill at the
/// same time is repaired as usual, and every check (reliable messages and broadcasts between
/// live daemons, counted from each rejoin on) holds.
#[test]
fn harness_restarted_daemons_rejoin_and_carry_traffic() {
    let report = passing_run(
        "restart",
        "--daemons 12 --radix 2 --messages 400 --rate 100 --mode mixed --restart 2 --kill 1 --seed 3",
    );
    assert_eq!(report["faults"].as_array().unwrap().len(), 3);
    let rejoins = report["rejoins"].as_array().unwrap();
    assert_eq!(rejoins.len(), 2, "{rejoins:?}");
    for j in rejoins {
        for k in [
            "admitted_after_ms",
            "known_everywhere_after_ms",
            "wired_after_ms",
        ] {
            assert!(j[k].as_f64().is_some(), "{k}: {j}");
        }
        assert!(j["received"].as_u64().unwrap() > 0, "{j}");
        assert!(j["delivered_elsewhere"].as_u64().unwrap() > 0, "{j}");
    }
    let c = &report["counts"];
    assert_eq!(c["lost_reliable"], 0, "{c}");
    assert_eq!(c["duplicated"], 0, "{c}");
    assert!(c["sent_broadcast"].as_u64().unwrap() > 0, "{c}");
}

/// `--grow`: the DVM starts with room for three more daemons; they join while traffic flows
/// (`--join`), are admitted, learnt by every survivor, and carry reliable traffic both ways.
#[test]
fn harness_grown_daemons_join_and_carry_traffic() {
    let report = passing_run(
        "grow",
        "--daemons 8 --radix 2 --messages 400 --rate 100 --mode reliable --grow 2@1,1@2 --seed 5",
    );
    let joins = report["rejoins"].as_array().unwrap();
    assert_eq!(joins.len(), 3, "{joins:?}");
    for j in joins {
        assert_eq!(j["grown"], true, "{j}");
        assert!(j["wired_after_ms"].as_f64().is_some(), "{j}");
        assert!(j["received"].as_u64().unwrap() > 0, "{j}");
        assert!(j["delivered_elsewhere"].as_u64().unwrap() > 0, "{j}");
    }
    assert_eq!(report["counts"]["lost_reliable"], 0);
}
