//! The report's charts, drawn with plotters into SVG strings: the harness timeline with its
//! fault marks, a latency histogram, a tree, and the bench's bars. Each returns the `<svg>`
//! element alone (no XML declaration), ready to inline in HTML.

use plotters::coord::Shift;
use plotters::prelude::*;
use tbon::routed::NodeView;

/// Colours, one per series, readable on white.
pub const SERIES: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
];
/// The latency percentiles' dots: colours no series line uses.
const PERCENTILES: [RGBColor; 2] = [RGBColor(23, 190, 207), RGBColor(188, 189, 34)];
/// The fault marks: colours no series uses.
const INJECTED: RGBColor = RGBColor(214, 39, 40);
const DETECTED: RGBColor = RGBColor(0, 0, 0);
const REPAIRED: RGBColor = RGBColor(140, 140, 140);
const ADOPTED: RGBColor = RGBColor(255, 200, 60);

type Result<T> = std::result::Result<T, String>;

fn err<E: std::fmt::Debug>(e: E) -> String {
    format!("drawing a chart: {e:?}")
}

/// Draws into a fresh SVG of `size` with `draw`, and returns the SVG text.
fn svg(
    size: (u32, u32),
    draw: impl FnOnce(&DrawingArea<SVGBackend<'_>, Shift>) -> Result<()>,
) -> Result<String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        draw(&root)?;
        root.present().map_err(err)?;
    }
    // Inline SVG needs no declaration; keep just the element.
    Ok(match out.find("<svg") {
        Some(i) => out.split_off(i),
        None => out,
    })
}

/// A fault as the timeline marks it: when it struck, was first detected and was repaired at
/// every survivor (seconds from time 0; the last two may be unknown).
pub struct FaultMark {
    pub label: String,
    pub at_s: f64,
    pub detected_s: Option<f64>,
    pub repaired_s: Option<f64>,
}

/// One point of the timeline: its time, deliveries per second by series, latency p50 and p99.
pub struct TimelinePoint {
    pub t_s: f64,
    pub rates: Vec<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

/// Deliveries per second by series above, latency percentiles (log scale) below, every fault
/// marked in both: red where it struck (labelled), black at its first detection, grey once
/// repaired everywhere. The legend sits right of the plots, never over the data.
pub fn timeline(points: &[TimelinePoint], series: &[&str], faults: &[FaultMark]) -> Result<String> {
    let end_s = points
        .iter()
        .map(|p| p.t_s)
        .chain(
            faults
                .iter()
                .flat_map(|f| [Some(f.at_s), f.repaired_s])
                .flatten(),
        )
        .fold(0.1f64, f64::max)
        + 0.1;
    let rate_max = points
        .iter()
        .flat_map(|p| p.rates.iter().copied())
        .fold(1.0f64, f64::max)
        * 1.15;
    let lat = |p: &TimelinePoint| [p.p50_ms, p.p99_ms];
    let lat_max = points
        .iter()
        .flat_map(lat)
        .flatten()
        .fold(0.01f64, f64::max)
        * 2.0;
    let lat_min = points
        .iter()
        .flat_map(lat)
        .flatten()
        .fold(lat_max, f64::min)
        .max(0.001)
        / 2.0;
    const LEGEND_PX: u32 = 170;
    svg((960, 560), |root| {
        let (plots, legend) = root.split_horizontally(960 - LEGEND_PX);
        let (top, bottom) = plots.split_vertically(300);
        let mut rate = ChartBuilder::on(&top)
            .caption("deliveries per second", ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..end_s, 0f64..rate_max)
            .map_err(err)?;
        rate.configure_mesh()
            .x_desc("s since every daemon was wired")
            .y_label_formatter(&|v| si(*v))
            .draw()
            .map_err(err)?;
        for (i, _) in series.iter().enumerate() {
            let colour = SERIES[i % SERIES.len()];
            let line = points
                .iter()
                .map(|p| (p.t_s, p.rates.get(i).copied().unwrap_or(0.0)));
            rate.draw_series(LineSeries::new(line, colour.stroke_width(2)))
                .map_err(err)?;
        }
        marks(&mut rate, faults, rate_max, true)?;

        let mut latency = ChartBuilder::on(&bottom)
            .caption("latency per 100 ms (ms, log scale)", ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..end_s, (lat_min..lat_max).log_scale())
            .map_err(err)?;
        latency
            .configure_mesh()
            .x_desc("s since every daemon was wired")
            .y_label_formatter(&|v| si(*v))
            .draw()
            .map_err(err)?;
        for (colour, pick) in [
            (
                PERCENTILES[0],
                (|p: &TimelinePoint| p.p50_ms) as fn(&TimelinePoint) -> Option<f64>,
            ),
            (PERCENTILES[1], |p: &TimelinePoint| p.p99_ms),
        ] {
            let dots = points
                .iter()
                .filter_map(|p| Some((p.t_s, pick(p)?)))
                .map(move |(x, y)| Circle::new((x, y), 2, colour.filled()));
            latency.draw_series(dots).map_err(err)?;
        }
        marks(&mut latency, faults, lat_max, false)?;

        // The legend, beside the plots.
        let mut entries: Vec<(String, RGBColor, bool)> = series
            .iter()
            .enumerate()
            .map(|(i, s)| (s.to_string(), SERIES[i % SERIES.len()], true))
            .collect();
        entries.push(("latency p50".into(), PERCENTILES[0], false));
        entries.push(("latency p99".into(), PERCENTILES[1], false));
        if !faults.is_empty() {
            entries.push(("fault struck".into(), INJECTED, true));
            entries.push(("first detected".into(), DETECTED, true));
            entries.push(("repaired everywhere".into(), REPAIRED, true));
        }
        for (k, (name, colour, line)) in entries.into_iter().enumerate() {
            let y = 40 + 22 * k as i32;
            if line {
                legend
                    .draw(&PathElement::new([(8, y), (30, y)], colour.stroke_width(3)))
                    .map_err(err)?;
            } else {
                legend
                    .draw(&Circle::new((19, y), 4, colour.filled()))
                    .map_err(err)?;
            }
            legend
                .draw(&Text::new(name, (38, y - 7), ("sans-serif", 13)))
                .map_err(err)?;
        }
        Ok(())
    })
}

/// The fault lines of one panel; `labels`: also each fault's label at the top.
fn marks<Y>(
    chart: &mut ChartContext<
        '_,
        SVGBackend<'_>,
        Cartesian2d<plotters::coord::types::RangedCoordf64, Y>,
    >,
    faults: &[FaultMark],
    top: f64,
    labels: bool,
) -> Result<()>
where
    Y: Ranged<ValueType = f64>,
{
    let bottom = chart.y_range().start;
    for (k, f) in faults.iter().enumerate() {
        let line = |x: f64, colour: RGBColor| {
            PathElement::new([(x, bottom), (x, top)], colour.stroke_width(2))
        };
        chart
            .draw_series(std::iter::once(line(f.at_s, INJECTED)))
            .map_err(err)?;
        for (t, colour) in [(f.detected_s, DETECTED), (f.repaired_s, REPAIRED)] {
            if let Some(t) = t {
                chart
                    .draw_series(std::iter::once(line(t, colour)))
                    .map_err(err)?;
            }
        }
        if labels {
            // Staggered, so that labels of faults close in time do not overlap.
            let y = top * (1.0 - 0.07 * (k % 4) as f64);
            chart
                .draw_series(std::iter::once(Text::new(
                    f.label.clone(),
                    (f.at_s, y),
                    ("sans-serif", 13).into_font().color(&INJECTED),
                )))
                .map_err(err)?;
        }
    }
    Ok(())
}

/// A histogram on log-spaced buckets, counts on a log scale too: `from_ms[i]` is bucket i's
/// lower edge, the last bucket as wide (in log terms) as the one before; translucent bars per
/// series (the title names them).
pub fn histogram(title: &str, from_ms: &[f64], series: &[(&str, Vec<u64>)]) -> Result<String> {
    let used: Vec<usize> = (0..from_ms.len())
        .filter(|i| {
            series
                .iter()
                .any(|(_, c)| c.get(*i).copied().unwrap_or(0) > 0)
        })
        .collect();
    let (first, last) = match (used.first(), used.last()) {
        (Some(a), Some(b)) => (*a, *b),
        _ => (0, from_ms.len().saturating_sub(1)),
    };
    // Past the last edge, buckets keep the last ratio (a decade without two edges to tell).
    let ratio = match from_ms {
        [.., a, b] if *a > 0.0 && *b > *a => b / a,
        _ => 10.0,
    };
    let last_edge = from_ms
        .last()
        .copied()
        .unwrap_or(1.0)
        .max(f64::MIN_POSITIVE);
    let edge = |i: usize| -> f64 {
        from_ms.get(i).copied().unwrap_or_else(|| {
            let beyond = i.saturating_sub(from_ms.len()) as i32 + 1;
            last_edge * ratio.powi(beyond)
        })
    };
    let (lo, hi) = (edge(first), edge(last + 1));
    let count_max = series
        .iter()
        .flat_map(|(_, c)| c.iter().copied())
        .max()
        .unwrap_or(1)
        .max(1) as f64
        * 2.0;
    // Counts on a log scale too, so that a tail of a few slow messages shows.
    const FLOOR: f64 = 0.5;
    svg((960, 320), |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(70)
            .build_cartesian_2d((lo..hi).log_scale(), (FLOOR..count_max).log_scale())
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("latency (ms, log scale)")
            .y_desc("deliveries (log scale)")
            .x_label_formatter(&|v| si(*v))
            .y_label_formatter(&|v| si(*v))
            .draw()
            .map_err(err)?;
        for (s, (_, counts)) in series.iter().enumerate() {
            let colour = SERIES[s % SERIES.len()];
            let bars = (first..=last).filter_map(|i| {
                let c = *counts.get(i)? as f64;
                (c > 0.0).then(|| {
                    Rectangle::new(
                        [(edge(i), FLOOR), (edge(i + 1), c)],
                        colour.mix(0.35).filled(),
                    )
                })
            });
            chart.draw_series(bars).map_err(err)?;
        }
        Ok(())
    })
}

/// A routing tree: one circle per rank, laid out by depth (rows) and in order of its leaves
/// (columns), an edge to each child. Without `before`, the `dead` ranks are circled red;
/// with it, a rank whose parent differs from its parent in `before` (adopted in a repair) is
/// drawn gold.
pub fn tree(
    title: &str,
    view: &[NodeView],
    dead: &[u32],
    before: Option<&[NodeView]>,
) -> Result<String> {
    use std::collections::BTreeMap;
    let by_rank: BTreeMap<u32, &NodeView> = view.iter().map(|n| (n.rank, n)).collect();
    // Columns: a depth-first walk from rank 0; a node sits above the middle of its children.
    let mut pos: BTreeMap<u32, (f64, f64)> = BTreeMap::new();
    let mut next_leaf = 0f64;
    fn place(
        r: u32,
        depth: f64,
        by_rank: &BTreeMap<u32, &NodeView>,
        pos: &mut BTreeMap<u32, (f64, f64)>,
        next_leaf: &mut f64,
    ) {
        let Some(n) = by_rank.get(&r) else { return };
        let kids = n.children.clone();
        if kids.is_empty() {
            pos.insert(r, (*next_leaf, depth));
            *next_leaf += 1.0;
            return;
        }
        for k in &kids {
            place(*k, depth + 1.0, by_rank, pos, next_leaf);
        }
        let xs: Vec<f64> = kids
            .iter()
            .filter_map(|k| pos.get(k).map(|p| p.0))
            .collect();
        let x = xs.iter().sum::<f64>() / xs.len().max(1) as f64;
        pos.insert(r, (x, depth));
    }
    place(0, 0.0, &by_rank, &mut pos, &mut next_leaf);
    let parents_before: BTreeMap<u32, Option<u32>> = before
        .unwrap_or_default()
        .iter()
        .map(|n| (n.rank, n.parent))
        .collect();
    let width = (next_leaf.max(1.0) - 1.0).max(1.0);
    let depth = pos.values().map(|p| p.1).fold(0.0, f64::max).max(1.0);
    let cols = next_leaf.max(1.0) as u32;
    let size = (
        (cols * 28).clamp(320, 1400),
        ((depth as u32 + 1) * 60 + 60).min(900),
    );
    svg(size, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, ("sans-serif", 16))
            .margin(20)
            .build_cartesian_2d(-0.5f64..width + 0.5, (depth + 0.5)..-0.5f64)
            .map_err(err)?;
        let pos = &pos;
        let edges = view.iter().flat_map(|n| {
            let from = pos.get(&n.rank).copied();
            n.children
                .iter()
                .filter_map(move |c| Some(PathElement::new([from?, *pos.get(c)?], BLACK.mix(0.6))))
        });
        chart.draw_series(edges).map_err(err)?;
        let nodes = view.iter().filter_map(|n| {
            let p = *pos.get(&n.rank)?;
            let moved =
                before.is_some() && parents_before.get(&n.rank).is_some_and(|b| *b != n.parent);
            let fill = if moved {
                ADOPTED
            } else {
                RGBColor(200, 220, 240)
            };
            Some(
                EmptyElement::at(p)
                    + Circle::new((0, 0), 10, fill.filled())
                    + Circle::new((0, 0), 10, BLACK)
                    + Text::new(n.rank.to_string(), (-6, -6), ("sans-serif", 11)),
            )
        });
        chart.draw_series(nodes).map_err(err)?;
        if before.is_none() {
            let ghosts = dead.iter().filter_map(|r| {
                let p = *pos.get(r)?;
                Some(EmptyElement::at(p) + Circle::new((0, 0), 12, INJECTED.stroke_width(2)))
            });
            chart.draw_series(ghosts).map_err(err)?;
        }
        Ok(())
    })
}

/// One bar of a grouped bar chart: its value and the text printed above it.
pub struct Bar {
    pub value: f64,
    pub note: String,
}

/// Grouped bars: one group per label in `groups`, one bar per series in each (`None`: not
/// measured), each bar's note printed above it.
pub fn bars(
    title: &str,
    unit: &str,
    groups: &[String],
    series: &[&str],
    values: &[Vec<Option<Bar>>],
) -> Result<String> {
    let max = values
        .iter()
        .flatten()
        .flatten()
        .map(|b| b.value)
        .fold(0f64, f64::max)
        .max(1e-9)
        * 1.6;
    let n = groups.len().max(1);
    let per = series.len().max(1) as f64;
    let width = (n as u32 * 60 * series.len().max(1) as u32).clamp(640, 1400);
    svg((width, 380), |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(20)
            .y_label_area_size(80)
            .build_cartesian_2d(0f64..n as f64, 0f64..max)
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_desc(unit)
            .y_label_formatter(&|v| si(*v))
            .draw()
            .map_err(err)?;
        let bar_x = |g: usize, s: usize| g as f64 + 0.08 + 0.84 * s as f64 / per;
        let bar_w = 0.84 / per * 0.9;
        for (s, label) in series.iter().enumerate() {
            let colour = SERIES[s % SERIES.len()];
            let rects = (0..groups.len()).filter_map(|g| {
                let b = values.get(g)?.get(s)?.as_ref()?;
                let x = bar_x(g, s);
                Some(Rectangle::new(
                    [(x, 0.0), (x + bar_w, b.value)],
                    colour.filled(),
                ))
            });
            chart
                .draw_series(rects)
                .map_err(err)?
                .label(*label)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled())
                });
            let notes = (0..groups.len()).filter_map(|g| {
                let b = values.get(g)?.get(s)?.as_ref()?;
                Some(Text::new(
                    b.note.clone(),
                    (bar_x(g, s), b.value + max * 0.07),
                    ("sans-serif", 11).into_font(),
                ))
            });
            chart.draw_series(notes).map_err(err)?;
        }
        let names = groups.iter().enumerate().map(|(g, name)| {
            Text::new(
                name.clone(),
                (g as f64 + 0.08, max * 0.8),
                ("sans-serif", 12).into_font(),
            )
        });
        chart.draw_series(names).map_err(err)?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .draw()
            .map_err(err)?;
        Ok(())
    })
}

/// An axis value with an SI suffix: 2.5M, 40k, 0.25.
fn si(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{}G", trim(v / 1e9))
    } else if a >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if a >= 1e3 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
    }
}

/// A number with at most two decimals and no trailing zeros.
fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() || s == "-" {
        "0".into()
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    /// Drawn from a run's JSON: odd bucket lists (none, one) draw, they do not panic.
    #[test]
    fn a_histogram_of_few_edges_still_draws() {
        for edges in [&[][..], &[1.0][..], &[1.0, 2.0][..]] {
            let counts = vec![3u64; edges.len()];
            assert!(super::histogram("t", edges, &[("plain", counts)]).is_ok());
        }
    }

    #[test]
    fn axis_values_read_short() {
        assert_eq!(super::si(60_000_000.0), "60M");
        assert_eq!(super::si(2_500.0), "2.5k");
        assert_eq!(super::si(0.25), "0.25");
        assert_eq!(super::si(0.0), "0");
        assert_eq!(super::si(140.0), "140");
    }
}
