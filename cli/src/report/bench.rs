//! The bench report: tbon beside each baseline measured in the same run, as bars with the
//! ratio printed on tbon's, per payload size and route; the targets; the machine's load
//! before and after. Drawn only from the run's JSON (`tbon bench --json`); a part the run
//! skipped (`--only`) is left out.

use super::charts::{self, Bar};
use super::page::{Page, cell, list};
use serde_json::Value;

/// The report of a bench run whose JSON is `run`. Never fails: a chart that cannot be drawn
/// is replaced by the reason.
pub fn bench(run: &Value) -> String {
    let mut p = Page::new("tbon bench report");
    p.heading(1, "tbon bench report");
    p.paragraph(
        "note",
        &format!(
            "Every figure is tbon beside a baseline measured in the same run on the same machine. \
             Load average (1, 5, 15 min) before the run: {}; after it: {}.{}",
            run["load"].as_str().unwrap_or("?"),
            run["load_after"].as_str().unwrap_or("?"),
            if run["quick"].as_bool() == Some(true) {
                " A --quick run: fewer messages, noisier figures."
            } else {
                ""
            }
        ),
    );
    if let Some(targets) = run["targets"].as_array() {
        p.heading(2, "Targets");
        let rows: Vec<Vec<String>> = targets
            .iter()
            .map(|t| {
                let met = t["met"].as_bool().unwrap_or(false);
                vec![
                    (if met { "met" } else { "not met" }).into(),
                    cell(&t["what"]),
                    cell(&t["target"]),
                    cell(&t["measured"]),
                ]
            })
            .collect();
        p.table(
            "targets",
            &["", "what", "target", "measured"],
            &rows,
            |r, c| match (c, rows.get(r).and_then(|x| x.first())) {
                (0, Some(v)) if v == "met" => "pass",
                (0, _) => "fail",
                _ => "",
            },
        );
    }
    rates(&mut p, run);
    reliable(&mut p, run);
    pingpong(&mut p, run);
    direct(&mut p, run);
    stream(&mut p, run);
    scale(&mut p, run);
    p.finish()
}

/// A rate with its unit: "3.76 M/s".
fn per_s(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2} M/s", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1} k/s", v / 1e3)
    } else {
        format!("{v:.0}/s")
    }
}

fn percent(r: f64) -> String {
    format!("{:.0}%", r * 100.0)
}

/// A bar of `value` (if measured) with `note`.
fn bar(value: Option<f64>, note: impl FnOnce(f64) -> String) -> Option<Bar> {
    let value = value?;
    Some(Bar {
        value,
        note: note(value),
    })
}

fn relays(n: u64) -> String {
    match n {
        0 => "neighbours".into(),
        1 => "1 relay".into(),
        n => format!("{n} relays"),
    }
}

fn payload(b: u64) -> String {
    match b {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1024 && b % 1024 == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// Point-to-point rate against raw TCP, one chart per payload size, a group per route.
fn rates(p: &mut Page, run: &Value) {
    let rows = list(&run["rate"]);
    if rows.is_empty() {
        return;
    }
    p.heading(2, "Message rate against raw TCP");
    let mut sizes: Vec<u64> = rows.iter().filter_map(|r| r["payload"].as_u64()).collect();
    sizes.sort_unstable();
    sizes.dedup();
    for size in sizes {
        let these: Vec<&Value> = rows
            .iter()
            .filter(|r| r["payload"].as_u64() == Some(size))
            .collect();
        let groups: Vec<String> = these
            .iter()
            .map(|r| relays(r["relays"].as_u64().unwrap_or(0)))
            .collect();
        let values: Vec<Vec<Option<Bar>>> = these
            .iter()
            .map(|r| {
                let raw = r["raw_msgs_per_s"].as_f64().unwrap_or(0.0).max(1e-9);
                vec![
                    bar(r["tbon_msgs_per_s"].as_f64(), |v| percent(v / raw)),
                    bar(r["tbon_batch_msgs_per_s"].as_f64(), |v| percent(v / raw)),
                    bar(r["raw_msgs_per_s"].as_f64(), per_s),
                ]
            })
            .collect();
        p.figure(
            &format!("rate-{size}"),
            charts::bars(
                &format!("{} messages", payload(size)),
                "messages per second",
                &groups,
                &["tbon", "tbon send_batch", "raw TCP"],
                &values,
            ),
            &format!(
                "{} payloads from one daemon to another, over the tree's neighbours or through \
                 relays; tbon's bars carry their share of raw TCP's rate on the same route.",
                payload(size)
            ),
        );
    }
}

/// Reliable sends against plain ones.
fn reliable(p: &mut Page, run: &Value) {
    let rows = list(&run["reliable_rate"]);
    if rows.is_empty() {
        return;
    }
    p.heading(2, "Reliable (RELM) against plain sends");
    let groups: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{}, {}",
                payload(r["payload"].as_u64().unwrap_or(0)),
                relays(r["relays"].as_u64().unwrap_or(0))
            )
        })
        .collect();
    // Rates of different payloads differ a hundredfold: bars of the share of plain's rate.
    let values: Vec<Vec<Option<Bar>>> = rows
        .iter()
        .map(|r| {
            vec![
                bar(Some(1.0), |_| {
                    per_s(r["plain_msgs_per_s"].as_f64().unwrap_or(0.0))
                }),
                bar(r["ratio"].as_f64(), |v| {
                    format!(
                        "{} ({})",
                        percent(v),
                        per_s(r["reliable_msgs_per_s"].as_f64().unwrap_or(0.0))
                    )
                }),
                // Runs before 2026-11-29 measured reliable sends with completions only.
                bar(r["each_ratio"].as_f64(), |v| {
                    format!(
                        "{} ({})",
                        percent(v),
                        per_s(r["reliable_each_msgs_per_s"].as_f64().unwrap_or(0.0))
                    )
                }),
            ]
        })
        .collect();
    p.figure(
        "reliable",
        charts::bars(
            "reliable sends against plain ones",
            "share of the plain rate",
            &groups,
            &["plain", "reliable", "reliable, a completion each"],
            &values,
        ),
        "Each group: plain sends (send) as 1, reliable sends (send_reliable) as their share of it, \
         and reliable sends with a completion each (send_reliable_with), with the rates.",
    );
}

/// The 64 B round trip against mio.
fn pingpong(p: &mut Page, run: &Value) {
    let row = &run["pingpong"];
    if row.is_null() {
        return;
    }
    p.heading(2, "Round trip against mio");
    let us = |v: &Value, k: &str| v[k].as_f64();
    let mio50 = us(&row["mio"], "p50_us").unwrap_or(1.0).max(1e-9);
    let mio99 = us(&row["mio"], "p99_us").unwrap_or(1.0).max(1e-9);
    let values = vec![
        vec![
            bar(us(&row["tbon"], "p50_us"), |v| {
                format!("{v:.0} µs ({:.2}×)", v / mio50)
            }),
            bar(us(&row["mio"], "p50_us"), |v| format!("{v:.0} µs")),
        ],
        vec![
            bar(us(&row["tbon"], "p99_us"), |v| {
                format!("{v:.0} µs ({:.2}×)", v / mio99)
            }),
            bar(us(&row["mio"], "p99_us"), |v| format!("{v:.0} µs")),
        ],
    ];
    p.figure(
        "pingpong",
        charts::bars(
            "64 B round trip between neighbours",
            "µs",
            &["p50".into(), "p99".into()],
            &["tbon", "mio echo"],
            &values,
        ),
        "Lower is better; tbon's bars carry the multiple of mio's.",
    );
}

/// Direct links against the tree and against neighbours.
fn direct(p: &mut Page, run: &Value) {
    let rows = list(&run["direct_link"]["rate"]);
    if rows.is_empty() {
        return;
    }
    p.heading(2, "Direct links");
    for r in rows {
        let size = r["payload"].as_u64().unwrap_or(0);
        let tree = r["leaves_tree_msgs_per_s"]
            .as_f64()
            .unwrap_or(0.0)
            .max(1e-9);
        let values = vec![vec![
            bar(r["leaves_tree_msgs_per_s"].as_f64(), per_s),
            bar(r["leaves_direct_msgs_per_s"].as_f64(), |v| {
                format!("{:.1}× the tree", v / tree)
            }),
            bar(r["neighbours_msgs_per_s"].as_f64(), per_s),
        ]];
        p.figure(
            &format!("direct-{size}"),
            charts::bars(
                &format!("{} messages between two leaves", payload(size)),
                "messages per second",
                &["leaf to leaf".into()],
                &[
                    "over the tree",
                    "over a direct link",
                    "neighbours (baseline)",
                ],
                &values,
            ),
            "Two leaves of the tree, over the tree and then over a direct link, beside two tree \
             neighbours.",
        );
    }
}

/// Streams against raw TCP, and the round trip beside a stream.
fn stream(p: &mut Page, run: &Value) {
    let s = &run["stream"];
    if s.is_null() {
        return;
    }
    p.heading(2, "Streams");
    let gib = |k: &str| s[k].as_f64();
    let raw = gib("raw_gib_per_s").unwrap_or(1.0).max(1e-9);
    let raw_relay = gib("raw_relay_gib_per_s").unwrap_or(1.0).max(1e-9);
    let share = |basis: f64, of: &'static str| {
        move |v: f64| format!("{v:.2} GiB/s, {} of {of}", percent(v / basis))
    };
    let values = vec![
        vec![
            bar(gib("direct_gib_per_s"), share(raw, "raw")),
            bar(gib("raw_gib_per_s"), |v| format!("{v:.2} GiB/s")),
        ],
        vec![
            bar(gib("relay_gib_per_s"), share(raw_relay, "raw relay")),
            bar(gib("raw_relay_gib_per_s"), |v| format!("{v:.2} GiB/s")),
        ],
        vec![
            bar(s["many"]["gib_per_s"].as_f64(), share(raw, "raw")),
            bar(gib("raw_gib_per_s"), |v| format!("{v:.2} GiB/s")),
        ],
    ];
    p.figure(
        "stream-bandwidth",
        charts::bars(
            "stream bandwidth",
            "GiB/s",
            &[
                "one stream, direct".into(),
                "one stream, 1 relay".into(),
                "64 streams".into(),
            ],
            &["tbon", "raw TCP"],
            &values,
        ),
        "tbon's bars carry their share of raw TCP on the same path: one connection for a \
         direct stream and 64 streams, a raw relay process for the relayed stream (the \
         targets table may state a share of another basis; it names it).",
    );
    let idle = gib("idle_rtt_p50_us").unwrap_or(1.0).max(1e-9);
    let values = vec![vec![
        bar(gib("idle_rtt_p50_us"), |v| format!("{v:.0} µs")),
        bar(gib("stream_rtt_p50_us"), |v| {
            format!("{v:.0} µs ({:.1}×)", v / idle)
        }),
    ]];
    let memory: Vec<Vec<String>> = [
        ("small", "small stream"),
        ("big", "big stream"),
        ("many", "64 streams"),
    ]
    .iter()
    .filter(|(k, _)| !s[*k].is_null())
    .map(|(k, label)| {
        let part = &s[*k];
        vec![
            label.to_string(),
            cell(&part["bytes"]),
            cell(&part["producer_hwm_kib"]),
            cell(&part["consumer_hwm_kib"]),
        ]
    })
    .collect();
    if !memory.is_empty() {
        p.table(
            "stream-memory",
            &[
                "",
                "bytes",
                "producer peak (VmHWM, KiB)",
                "consumer peak (VmHWM, KiB)",
            ],
            &memory,
            |_, _| "",
        );
    }
    p.figure(
        "stream-rtt",
        charts::bars(
            "64 B round trip p50, idle and during a stream",
            "µs",
            &["same two daemons".into()],
            &["idle", "during a stream"],
            &values,
        ),
        "What a stream costs other traffic between the same two daemons.",
    );
}

/// DVM sizes: wire-up, broadcast round trip and memory, as a table.
fn scale(p: &mut Page, run: &Value) {
    let rows = list(&run["scale"]);
    if rows.is_empty() {
        return;
    }
    p.heading(2, "DVM sizes");
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                cell(&r["daemons"]),
                cell(&r["launch_to_all_wired_ms"]),
                cell(&r["bcast_rtt"]["p50_us"]),
                cell(&r["bcast_rtt"]["allgather_p50_us"]),
                cell(&r["idle_rss_kib"]),
                cell(&r["idle_rss_anon_kib"]),
            ]
        })
        .collect();
    p.table(
        "scale",
        &[
            "daemons",
            "launch to all wired (ms)",
            "broadcast p50 (µs)",
            "allgather p50 (µs)",
            "idle RSS (KiB)",
            "idle RssAnon (KiB)",
        ],
        &table,
        |_, _| "",
    );
}

#[cfg(test)]
mod tests {
    /// A real `tbon bench --quick --json` output, every part in it.
    const QUICK: &str = include_str!("testdata/bench-quick.json");

    #[test]
    fn every_part_of_a_bench_run_is_drawn_with_its_bars() {
        let run: serde_json::Value = serde_json::from_str(QUICK).unwrap();
        let page = super::bench(&run);
        let options = roxmltree::ParsingOptions {
            allow_dtd: true,
            ..Default::default()
        };
        let doc = roxmltree::Document::parse_with_options(&page, options).expect("well-formed");
        let figures: Vec<(&str, usize)> = doc
            .descendants()
            .filter(|n| n.has_tag_name("figure"))
            .map(|f| {
                let bars = f
                    .descendants()
                    .filter(|n| n.tag_name().name() == "rect")
                    .filter(|r| r.attribute("fill").is_some_and(|c| c != "#FFFFFF"))
                    .count();
                (f.attribute("id").unwrap_or(""), bars)
            })
            .collect();
        for id in [
            "rate-64",
            "rate-4096",
            "rate-65536",
            "rate-1048576",
            "reliable",
            "pingpong",
            "direct-64",
            "direct-65536",
            "stream-bandwidth",
            "stream-rtt",
        ] {
            let bars = figures.iter().find(|(f, _)| *f == id).map(|x| x.1);
            assert!(
                bars.is_some_and(|b| b >= 2),
                "{id}: {bars:?} in {figures:?}"
            );
        }
        // The ratio is printed on tbon's bars: 64 B through neighbours, 15% of raw.
        assert!(
            page.contains(">15%<") || page.contains("\n15%\n"),
            "ratio text"
        );
        let targets = doc
            .descendants()
            .find(|n| n.attribute("id") == Some("targets"))
            .expect("the targets");
        let rows = targets.children().filter(|n| n.has_tag_name("tr")).count();
        assert_eq!(rows, 1 + run["targets"].as_array().unwrap().len());
        assert!(page.contains(run["load_after"].as_str().unwrap()));
    }
}
