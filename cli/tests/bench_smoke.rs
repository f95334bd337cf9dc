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
