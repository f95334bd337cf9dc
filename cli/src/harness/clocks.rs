//! The harness's clock check: once the traffic has drained, before the shutdown, the harness
//! runs `tbon clock`'s query against rank 0 as an operator would (the operator credential
//! derived from the run's job key, every daemon in detail). Every daemon of a harness run
//! shares this machine's wall clock, so the true offset of each is 0 and must lie within its
//! reported bound: a live check of the clock measurement after the run's kills and stalls, with
//! real sockets and scheduling. Latencies in the report are taken with this machine's one
//! CLOCK_MONOTONIC and need no correction; across machines, a message's latency would be
//! corrected by subtracting (receiver's offset - sender's offset), within the two bounds.

use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;
use tbon::status::{Part, StatusOptions};

/// How long the daemons may take to gather the offsets.
const CLOCK_BUDGET_MS: u32 = 3_000;
/// How long to wait for rank 0's connection and handshake.
const CLOCK_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// What the clock query found.
#[derive(Debug, Default)]
pub struct ClockCheck {
    /// (rank, offset ns, bound ns) of every daemon measured.
    pub measured: Vec<(u32, i64, u64)>,
    /// Daemons that answered without an offset, or not at all.
    pub unmeasured: Vec<u32>,
    /// Why there was no answer at all.
    pub error: Option<String>,
}

/// Runs `tbon clock` (the binary `exe`) in network namespace `ns`, where rank 0 is reachable
/// (`--hosts`: the harness itself is not on the hosts' networks, and every daemon there still
/// shares this machine's clock), and reads its JSON. Without it, a `--hosts` run measured
/// nothing and passed the clock check all the same (from an outside-in review).
pub fn measure_in(
    ns: &str,
    exe: &Path,
    uri: Option<&String>,
    key_file: &Path,
    survivors: usize,
) -> ClockCheck {
    let mut c = ClockCheck::default();
    let Some(uri) = uri else {
        c.error = Some("rank 0 never said where it listens".into());
        return c;
    };
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(exe)
        .args(["clock", "--hnp", uri, "--format", "json"])
        .args(["--budget-ms", &CLOCK_BUDGET_MS.to_string()])
        .args([
            "--connect-timeout-ms",
            &CLOCK_CONNECT_TIMEOUT.as_millis().to_string(),
        ])
        .arg("--key-file")
        .arg(key_file)
        .stdin(std::process::Stdio::null())
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            c.error = Some(format!("cannot run tbon clock: {e}"));
            return c;
        }
    };
    // Exit 1 with its JSON when some daemon was not measured: read either way.
    let v: Value = match serde_json::from_slice(&out.stdout) {
        Ok(v) => v,
        Err(_) => {
            c.error = Some(format!(
                "tbon clock: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
            return c;
        }
    };
    for o in v["offsets"].as_array().into_iter().flatten() {
        if let (Some(r), Some(off), Some(b)) = (
            o["rank"].as_u64(),
            o["offset_ns"].as_i64(),
            o["bound_ns"].as_u64(),
        ) {
            c.measured.push((r as u32, off, b));
        }
    }
    for r in v["unmeasured"].as_array().into_iter().flatten() {
        if let Some(r) = r.as_u64() {
            c.unmeasured.push(r as u32);
        }
    }
    if c.measured.len() + c.unmeasured.len() < survivors {
        c.error = Some(format!(
            "{} of {survivors} living daemons answered",
            c.measured.len() + c.unmeasured.len()
        ));
    }
    c
}

/// Queries rank 0 at `uri` with the operator credential of the key in `key_file`.
pub fn measure(uri: Option<&String>, key_file: &Path, survivors: usize) -> ClockCheck {
    let mut c = ClockCheck::default();
    let contact: tbon::oob::uri::ContactUri = match uri.map(|u| u.parse()) {
        Some(Ok(u)) => u,
        Some(Err(e)) => {
            c.error = Some(format!("rank 0's contact: {e}"));
            return c;
        }
        None => {
            c.error = Some("rank 0 never said where it listens".into());
            return c;
        }
    };
    let credential = match tbon::Key::from_file(key_file) {
        Ok(k) => k.operator(),
        Err(e) => {
            c.error = Some(format!("the job key: {e}"));
            return c;
        }
    };
    let options = StatusOptions {
        budget_ms: CLOCK_BUDGET_MS,
        all: true,
        connect_timeout: CLOCK_CONNECT_TIMEOUT,
    };
    let report = match tbon::status::query(&contact, &credential, &options) {
        Ok(r) => r,
        Err(e) => {
            c.error = Some(e.to_string());
            return c;
        }
    };
    for p in &report.parts {
        if let Part::Daemon(d) = p {
            match (d.clock_offset_ns, d.clock_bound_ns) {
                (Some(o), Some(b)) => c.measured.push((d.rank, o, b)),
                _ => c.unmeasured.push(d.rank),
            }
        }
    }
    if c.measured.len() + c.unmeasured.len() < survivors {
        c.error = Some(format!(
            "{} of {survivors} living daemons answered",
            c.measured.len() + c.unmeasured.len()
        ));
    }
    c
}

impl ClockCheck {
    /// Daemons whose offset is further from 0 (the one clock they share) than their bound.
    pub fn outside_bound(&self) -> Vec<(u32, i64, u64)> {
        self.measured
            .iter()
            .copied()
            .filter(|&(_, o, b)| o.unsigned_abs() > b)
            .collect()
    }

    /// A problem for the verdict: an offset outside its bound is a wrong measurement. (No
    /// answer is not: it is reported, and the run's other checks judge the daemons.)
    pub fn problem(&self) -> Option<String> {
        let bad = self.outside_bound();
        (!bad.is_empty()).then(|| {
            format!(
                "clock offsets outside their bounds on one machine (rank, offset ns, bound ns): \
                 {bad:?}"
            )
        })
    }

    /// The report's text section and JSON.
    pub fn render(&self) -> (String, Value) {
        let max_offset = self.measured.iter().map(|m| m.1.unsigned_abs()).max();
        let max_bound = self.measured.iter().map(|m| m.2).max();
        let us = |ns: Option<u64>| ns.map_or("-".to_string(), |n| format!("{:.1}", n as f64 / 1e3));
        let mut text = format!(
            "\n  clocks (tbon clock after the traffic): {} daemons measured, largest offset {} us, \
             largest bound {} us, {} outside its bound",
            self.measured.len(),
            us(max_offset),
            us(max_bound),
            self.outside_bound().len()
        );
        if !self.unmeasured.is_empty() {
            text.push_str(&format!("; unmeasured {:?}", self.unmeasured));
        }
        if let Some(e) = &self.error {
            text.push_str(&format!("; {e}"));
        }
        text.push('\n');
        let json = json!({
            "measured": self.measured.len(),
            "max_abs_offset_ns": max_offset,
            "max_bound_ns": max_bound,
            "outside_bound": self.outside_bound().len(),
            "unmeasured": self.unmeasured,
            "error": self.error,
            "offsets": self.measured.iter().map(|(r, o, b)| json!({
                "rank": r, "offset_ns": o, "bound_ns": b
            })).collect::<Vec<_>>(),
        });
        (text, json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offset_beyond_its_bound_is_a_problem() {
        let mut c = ClockCheck {
            measured: vec![(1, 40_000, 50_000), (2, -10_000, 60_000)],
            ..ClockCheck::default()
        };
        assert!(c.problem().is_none());
        let (text, json) = c.render();
        assert!(
            text.contains("2 daemons measured, largest offset 40.0 us"),
            "{text}"
        );
        assert_eq!(json["outside_bound"], 0);
        c.measured.push((3, -70_000, 60_000));
        assert!(c.problem().unwrap().contains("(3, -70000, 60000)"));
        assert_eq!(c.render().1["outside_bound"], 1);
    }
}
