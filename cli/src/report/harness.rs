//! The harness report: what was run, when each fault struck and how long detection and
//! repair took, what the traffic did meanwhile, the latency per mode, the tree before and
//! after, and every check. Drawn only from the run's JSON (`tbon harness --json`).

use super::charts::{self, FaultMark, TimelinePoint};
use super::page::{Page, cell, list};
use serde_json::Value;

/// Trees larger than this are not drawn (the picture would be unreadable); a note says so.
const TREE_DRAWN_MAX: u64 = 256;

const MODES: [&str; 3] = ["plain", "reliable", "broadcast"];

/// The report of a harness run whose JSON is `run`. Never fails: a chart that cannot be
/// drawn is replaced by the reason.
pub fn harness(run: &Value) -> String {
    let passed = run["passed"].as_bool().unwrap_or(false);
    let mut p = Page::new("tbon harness report");
    p.heading(1, "tbon harness report");
    p.paragraph(
        if passed { "pass" } else { "fail" },
        if passed { "PASS" } else { "FAIL" },
    );
    if let Some(v) = run["verdict"].as_str() {
        p.paragraph("note", v);
    }

    p.heading(2, "What was run, and what it did");
    let params = [
        ("daemons", "daemons"),
        ("radix", "radix"),
        ("pattern", "pattern"),
        ("mode", "mode"),
        ("payload", "payload (bytes)"),
        ("messages_per_daemon", "messages per daemon"),
        ("rate_per_daemon", "messages per second per daemon"),
        ("seed", "seed"),
        ("wireup_s", "wire-up (s)"),
        ("run_s", "whole run (s)"),
        ("survivors", "survivors"),
        ("throughput_per_s", "deliveries per second"),
        ("offered_per_s", "deliveries per second offered"),
    ];
    let mut rows: Vec<Vec<String>> = params
        .iter()
        .map(|(k, label)| vec![label.to_string(), cell(&run[*k])])
        .collect();
    let latency = &run["latency_ms"];
    rows.push(vec![
        "latency p50 / p99 / max (ms)".into(),
        format!(
            "{} / {} / {}",
            cell(&latency["p50"]),
            cell(&latency["p99"]),
            cell(&latency["max"])
        ),
    ]);
    let window = &run["fault_window_s"];
    if !window.is_null() {
        rows.push(vec![
            "fault window: plain losses allowed (s)".into(),
            match window["to"].as_f64() {
                Some(to) => format!("{} .. {to:.1}", cell(&window["from"])),
                None => format!("{} .. never closed", cell(&window["from"])),
            },
        ]);
    }
    p.table("parameters", &["", "value"], &rows, |_, _| "");
    let collected = run["results_collected"].as_bool().unwrap_or(true);
    if !collected {
        p.paragraph(
            "fail",
            "No delivery results were collected: daemons write them when the DVM stops, and \
             this run was ended by killing its daemons (see the checks below). The faults and \
             checks are shown; the timeline, latency and counts are not.",
        );
    }

    p.heading(2, "Faults");
    let faults = faults(run);
    let rows: Vec<Vec<String>> = list(&run["faults"])
        .iter()
        .map(|f| {
            vec![
                cell(&f["rank"]),
                cell(&f["kind"]),
                cell(&f["at_s"]),
                cell(&f["detected_after_ms"]),
                cell(&f["repaired_everywhere_after_ms"]),
                cell(&f["epoch"]),
                cell(&f["resumed_exit_code"]),
            ]
        })
        .collect();
    if rows.is_empty() {
        p.paragraph("note", "No faults were injected.");
    } else {
        p.table(
            "faults",
            &[
                "rank",
                "fault",
                "at (s)",
                "detected after (ms)",
                "repaired everywhere after (ms)",
                "epoch",
                "exit code once resumed",
            ],
            &rows,
            |_, _| "",
        );
    }
    let rejoins: Vec<Vec<String>> = list(&run["rejoins"])
        .iter()
        .map(|j| {
            [
                "rank",
                "restarted_after_death_ms",
                "admitted_after_ms",
                "known_everywhere_after_ms",
                "wired_after_ms",
                "first_delivery_after_ms",
                "received",
                "delivered_elsewhere",
            ]
            .iter()
            .map(|k| cell(&j[*k]))
            .collect()
        })
        .collect();
    if !rejoins.is_empty() {
        p.heading(3, "Rejoins (times after the restart)");
        p.table(
            "rejoins",
            &[
                "rank",
                "restarted after its death (ms)",
                "admitted (ms)",
                "known to every survivor (ms)",
                "wired (ms)",
                "first delivery (ms)",
                "messages received",
                "its messages delivered",
            ],
            &rejoins,
            |_, _| "",
        );
    }

    if collected {
        delivery_charts(&mut p, run, &faults);
    }

    p.heading(2, "The tree");
    trees(&mut p, run);

    p.heading(2, "Checks");
    let mut rows: Vec<Vec<String>> = list(&run["checks"])
        .iter()
        .map(|c| {
            let ok = c["ok"].as_bool().unwrap_or(false);
            vec![(if ok { "ok" } else { "FAIL" }).into(), cell(&c["check"])]
        })
        .collect();
    for problem in list(&run["problems"]) {
        rows.push(vec!["FAIL".into(), cell(problem)]);
    }
    p.table("checks", &["", "check"], &rows, |r, c| {
        match (c, rows.get(r).and_then(|x| x.first())) {
            (0, Some(v)) if v == "ok" => "pass",
            (0, _) => "fail",
            _ => "",
        }
    });

    if !collected {
        return p.finish();
    }
    p.heading(2, "Counts");
    let counts: Vec<Vec<String>> = run["counts"]
        .as_object()
        .map(|o| {
            o.iter()
                .map(|(k, v)| vec![k.replace('_', " "), cell(v)])
                .collect()
        })
        .unwrap_or_default();
    p.table("counts", &["count", "value"], &counts, |_, _| "");
    p.finish()
}

/// The timeline and the latency histograms (only modes that delivered anything).
fn delivery_charts(p: &mut Page, run: &Value, faults: &[FaultMark]) {
    p.heading(2, "Timeline");
    let bins = list(&run["timeline"]["bins"]);
    let modes: Vec<&str> = MODES
        .into_iter()
        .filter(|m| bins.iter().any(|b| b[*m].as_u64().unwrap_or(0) > 0))
        .collect();
    let bin_s = run["timeline"]["bin_ms"].as_f64().unwrap_or(100.0) / 1e3;
    let points: Vec<TimelinePoint> = bins
        .iter()
        .map(|b| TimelinePoint {
            t_s: b["t_s"].as_f64().unwrap_or(0.0),
            rates: modes
                .iter()
                .map(|m| b[*m].as_f64().unwrap_or(0.0) / bin_s)
                .collect(),
            p50_ms: b["p50_ms"].as_f64(),
            p99_ms: b["p99_ms"].as_f64(),
        })
        .collect();
    p.figure(
        "timeline",
        charts::timeline(&points, &modes, faults),
        "Deliveries per second by mode, and latency p50 / p99 per 100 ms. Each fault: red \
         where it struck, black at its first detection, grey once every survivor had \
         repaired it.",
    );

    p.heading(2, "Latency");
    let h = &run["latency_histogram"];
    let edges: Vec<f64> = list(&h["bucket_from_ms"])
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    for mode in MODES {
        let counts: Vec<u64> = list(&h[mode]).iter().filter_map(Value::as_u64).collect();
        if counts.iter().sum::<u64>() == 0 {
            continue;
        }
        p.figure(
            &format!("latency-{mode}"),
            charts::histogram(
                &format!("{mode} messages: latency"),
                &edges,
                &[(mode, counts)],
            ),
            &format!("How many {mode} messages arrived within each latency (log-spaced buckets)."),
        );
    }
}

/// The faults as the timeline marks them: faults of one kind struck at once (a host cut off
/// takes all its daemons) share one mark, labelled with every rank.
fn faults(run: &Value) -> Vec<FaultMark> {
    let mut marks: Vec<(String, Vec<String>, FaultMark)> = Vec::new();
    for f in list(&run["faults"]) {
        let Some(at_s) = f["at_s"].as_f64() else {
            continue;
        };
        let kind = f["kind"].as_str().unwrap_or("fault").to_string();
        let rank = cell(&f["rank"]);
        let after = |k: &str| f[k].as_f64().map(|ms| at_s + ms / 1e3);
        let (detected_s, repaired_s) = (
            after("detected_after_ms"),
            after("repaired_everywhere_after_ms"),
        );
        if let Some((_, ranks, m)) = marks
            .iter_mut()
            .find(|(k, _, m)| *k == kind && (m.at_s - at_s).abs() < 0.01)
        {
            ranks.push(rank);
            // The mark's detection is the first one, its repair the last one.
            m.detected_s = match (m.detected_s, detected_s) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            m.repaired_s = match (m.repaired_s, repaired_s) {
                (Some(a), Some(b)) => Some(a.max(b)),
                _ => None,
            };
            continue;
        }
        let mark = FaultMark {
            label: String::new(),
            at_s,
            detected_s,
            repaired_s,
        };
        marks.push((kind, vec![rank], mark));
    }
    marks
        .into_iter()
        .map(|(kind, ranks, mut m)| {
            m.label = format!("{kind} {}", ranks.join(", "));
            m
        })
        .collect()
}

/// The tree before the faults and after them, as `tbon tree` computes it.
fn trees(p: &mut Page, run: &Value) {
    let (Some(n), Some(radix)) = (run["daemons"].as_u64(), run["radix"].as_u64()) else {
        return;
    };
    if n > TREE_DRAWN_MAX {
        p.paragraph(
            "note",
            &format!(
                "{n} daemons: more than {TREE_DRAWN_MAX}, too many to draw; `tbon tree --size {n} \
                 --radix {radix} --format dot` gives the graph."
            ),
        );
        return;
    }
    let dead: Vec<u32> = list(&run["dead"])
        .iter()
        .filter_map(|r| r.as_u64().and_then(|r| u32::try_from(r).ok()))
        .collect();
    let (n, radix) = (n as u32, radix as u32);
    let before = tbon::routed::tree_view(radix, n, &[]);
    let after = tbon::routed::tree_view(radix, n, &dead);
    match (before, after) {
        (Ok(before), _) if dead.is_empty() => p.figure(
            "tree-before",
            charts::tree("the tree (no daemon died)", &before, &dead, None),
            "The routing tree as wired; nothing needed repair.",
        ),
        (Ok(before), Ok(after)) => {
            p.figure(
                "tree-before",
                charts::tree("before the faults", &before, &dead, None),
                "The routing tree as wired; the daemons that died are circled red.",
            );
            p.figure(
                "tree-after",
                charts::tree("after the repairs", &after, &dead, Some(&before)),
                &format!(
                    "The repaired tree without the dead ({}); gold: a daemon with a new parent \
                     (promoted or adopted).",
                    dead.iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
        }
        (Err(e), _) | (_, Err(e)) => p.paragraph("fail", &format!("no tree: {e}")),
    }
}
