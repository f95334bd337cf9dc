//! `tbon harness --reset RANK@SECONDS`: every established TCP connection of a living daemon is
//! destroyed by the kernel (`ss -K`, as a NIC, a switch or a reset would end it) while traffic
//! flows. Both ends live on, so it is not a fault: no daemon may be declared dead and no
//! message may be lost, duplicated or reordered (link sessions write again what a broken
//! connection took). Needs `ss` (iproute2) and a kernel with `CONFIG_INET_DIAG_DESTROY`, and
//! the right to destroy the daemons' sockets (root, or the same user with CAP_NET_ADMIN).

use std::process::Command;

/// One planned reset and what became of it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Reset {
    pub rank: u32,
    pub at_s: f64,
    /// Connections destroyed (both ends counted), once done.
    pub destroyed: Option<usize>,
}

/// `RANK@SECONDS` specs, in time order; rank 0 is allowed (its daemon lives on).
pub fn plan(specs: &[String], n: u32) -> Result<Vec<Reset>, String> {
    let mut resets = Vec::new();
    for spec in specs {
        let (r, t) = spec
            .split_once('@')
            .ok_or_else(|| format!("--reset {spec:?}: expected RANK@SECONDS"))?;
        let rank: u32 = r
            .trim()
            .parse()
            .map_err(|e| format!("--reset {spec:?}: {e}"))?;
        let at_s: f64 = t
            .trim()
            .parse()
            .map_err(|e| format!("--reset {spec:?}: {e}"))?;
        if rank >= n {
            return Err(format!(
                "--reset {spec:?}: no rank {rank} among {n} daemons"
            ));
        }
        if at_s.is_nan() || at_s < 0.0 {
            return Err(format!("--reset {spec:?}: a time of at least 0 seconds"));
        }
        resets.push(Reset {
            rank,
            at_s,
            destroyed: None,
        });
    }
    resets.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    Ok(resets)
}

fn ss(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ss")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ss (iproute2 is needed for --reset): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ss {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Destroys every established TCP connection of process `pid`, at both ends; how many sockets
/// ended.
pub fn reset_connections(pid: u32) -> Result<usize, String> {
    // "Recv-Q Send-Q Local:Port Peer:Port users:((...,pid=N,fd=M))", no header.
    let listing = ss(&["-t", "-n", "-p", "-H", "state", "established"])?;
    let marker = format!("pid={pid},");
    let ports: Vec<String> = listing
        .lines()
        .filter(|l| l.contains(&marker))
        .filter_map(|l| l.split_whitespace().nth(2))
        .filter_map(|local| local.rsplit_once(':').map(|(_, p)| p.to_string()))
        .collect();
    if ports.is_empty() {
        return Ok(0);
    }
    let mut filter = vec!["(".to_string()];
    for (i, p) in ports.iter().enumerate() {
        if i > 0 {
            filter.push("or".into());
        }
        filter.extend([
            "sport".into(),
            "=".into(),
            format!(":{p}"),
            "or".into(),
            "dport".into(),
            "=".into(),
            format!(":{p}"),
        ]);
    }
    filter.push(")".into());
    let mut args = vec!["-K", "-t", "-n", "-H", "state", "established"];
    args.extend(filter.iter().map(String::as_str));
    let killed = ss(&args)?;
    let n = killed.lines().filter(|l| !l.trim().is_empty()).count();
    if n == 0 {
        return Err(format!(
            "ss -K destroyed none of the {} connections of pid {pid}: this kernel cannot \
             destroy sockets (CONFIG_INET_DIAG_DESTROY) or ss lacks the right (root)",
            ports.len()
        ));
    }
    Ok(n)
}

/// The report's section: what was reset, as text and JSON.
pub fn render(resets: &[Reset]) -> (String, serde_json::Value) {
    let mut text =
        String::from("\n  resets (connections destroyed while both ends live; not faults):");
    for r in resets {
        match r.destroyed {
            Some(k) => text.push_str(&format!(
                " rank {} at {:.1} s ({k} sockets);",
                r.rank, r.at_s
            )),
            None => text.push_str(&format!(
                " rank {} at {:.1} s (never done);",
                r.rank, r.at_s
            )),
        }
    }
    text.push('\n');
    (text, serde_json::to_value(resets).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_checked() {
        let r = plan(&["2@1.5".into(), "0@0.5".into()], 4).unwrap();
        assert_eq!((r[0].rank, r[1].rank), (0, 2));
        assert!(plan(&["4@1".into()], 4).is_err());
        assert!(plan(&["x@1".into()], 4).is_err());
        assert!(plan(&["1".into()], 4).is_err());
        assert!(plan(&["1@-2".into()], 4).is_err());
    }
}
