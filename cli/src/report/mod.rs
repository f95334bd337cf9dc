//! `--report FILE.html`: one self-contained HTML page (inline SVG and CSS, nothing fetched)
//! drawn from the same JSON a run writes with `--json`, so the two never disagree.
//!
//! * `charts.rs` — the charts (plotters, SVG).
//! * `page.rs` — the HTML around them: escaping, tables, sections.
//! * `harness.rs` — the harness report.
//! * `bench.rs` — the bench report.

mod bench;
pub mod charts;
mod harness;
mod page;

pub use bench::bench;
pub use harness::harness;

/// Writes `html` to `path`; the error names the file.
pub fn write(path: &std::path::Path, html: &str) -> Result<(), String> {
    std::fs::write(path, html).map_err(|e| format!("{}: {e}", path.display()))
}
