//! `tbon harness --hosts N --nics K --cut-nic RANK:NIC@SECONDS`: one network of the host of a
//! living daemon goes down while traffic flows (its end of that network's veth pair). The
//! daemons on it still reach everyone over their other networks, so it is not a fault: links
//! over the cut network stall, fail over to another address (`link_stall_ms`), and the link
//! sessions write again what the stalled connections did not deliver. No daemon may be
//! declared dead and no message, plain ones included, may be lost, duplicated or reordered.
//!
//! `RANK:NIC@SECONDS+OUTAGE` brings the network back after `OUTAGE` seconds. Cuts that all
//! come back may take every network of a host down together: an outage shorter than half the
//! heartbeat timeout is no fault either (the daemons dial on until the heartbeats decide, and
//! the links resume when a network returns).

use super::net;
use std::path::Path;
use std::process::{Command, Stdio};

/// A link that failed over, as `tbon status` showed it after the traffic.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FailedOver {
    pub rank: u32,
    pub peer: u32,
    /// The peer's address the link used then.
    pub address: Option<String>,
    pub failovers: u64,
}

/// Asks the DVM, from namespace `ns` (where rank 0 is reachable), for every daemon's links
/// (`tbon status --all --format json`), and returns those that failed over.
pub fn links_failed_over(
    exe: &Path,
    ns: &str,
    uri: &str,
    key_file: &Path,
) -> Result<Vec<FailedOver>, String> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(exe)
        .args(["status", "--hnp", uri, "--all", "--format", "json"])
        .arg("--key-file")
        .arg(key_file)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run tbon status: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "tbon status: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("tbon status printed no JSON: {e}"))?;
    let mut found = Vec::new();
    for part in v["report"]["parts"].as_array().into_iter().flatten() {
        let Some(rank) = part["rank"].as_u64() else {
            continue;
        };
        for l in part["links"].as_array().into_iter().flatten() {
            let failovers = l["failovers"].as_u64().unwrap_or(0);
            if failovers > 0 {
                found.push(FailedOver {
                    rank: rank as u32,
                    peer: l["peer"].as_u64().unwrap_or(0) as u32,
                    address: l["address"].as_str().map(str::to_string),
                    failovers,
                });
            }
        }
    }
    Ok(found)
}

/// One planned network cut and what became of it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NicCut {
    pub rank: u32,
    pub host: u32,
    pub nic: u32,
    pub at_s: f64,
    /// How long the network stays down (`None`: for the rest of the run).
    pub outage_s: Option<f64>,
    pub done: bool,
    /// The network came back (after `outage_s`).
    pub restored: bool,
}

impl NicCut {
    /// When the network comes back, if it does.
    pub fn back_at_s(&self) -> Option<f64> {
        self.outage_s.map(|o| self.at_s + o)
    }
}

/// `RANK:NIC@SECONDS[+OUTAGE]` specs, in time order. Refused: a rank beyond the daemons, a
/// network the hosts do not have, a cut for good that leaves a host no network (that is
/// `--cut`, a host failure), or an outage of every network of a host not shorter than half of
/// `heartbeat_timeout_ms` (a failure too).
pub fn plan(
    specs: &[String],
    n: u32,
    hosts: u32,
    nics: u32,
    heartbeat_timeout_ms: u64,
) -> Result<Vec<NicCut>, String> {
    let mut cuts: Vec<NicCut> = Vec::new();
    for spec in specs {
        let bad = |why: &str| format!("--cut-nic {spec:?}: {why}");
        let (rn, t) = spec
            .split_once('@')
            .ok_or_else(|| bad("expected RANK:NIC@SECONDS[+OUTAGE]"))?;
        let (t, outage) = match t.split_once('+') {
            Some((t, o)) => (t, Some(o)),
            None => (t, None),
        };
        let outage_s: Option<f64> = match outage {
            Some(o) => {
                let o: f64 = o.trim().parse().map_err(|e| bad(&format!("outage: {e}")))?;
                if o.is_nan() || o <= 0.0 {
                    return Err(bad("an outage of more than 0 seconds"));
                }
                Some(o)
            }
            None => None,
        };
        let (r, k) = rn
            .split_once(':')
            .ok_or_else(|| bad("expected RANK:NIC@SECONDS[+OUTAGE]"))?;
        let rank: u32 = r.trim().parse().map_err(|e| bad(&format!("rank: {e}")))?;
        let nic: u32 = k.trim().parse().map_err(|e| bad(&format!("NIC: {e}")))?;
        let at_s: f64 = t.trim().parse().map_err(|e| bad(&format!("time: {e}")))?;
        if rank >= n {
            return Err(bad(&format!("no rank {rank} among {n} daemons")));
        }
        if nic >= nics {
            return Err(bad(&format!("the hosts have networks 0 to {}", nics - 1)));
        }
        if at_s.is_nan() || at_s < 0.0 {
            return Err(bad("a time of at least 0 seconds"));
        }
        let host = net::host_of(hosts, rank, n);
        cuts.push(NicCut {
            rank,
            host,
            nic,
            at_s,
            outage_s,
            done: false,
            restored: false,
        });
        let mut left: Vec<u32> = (0..nics).collect();
        left.retain(|k| !cuts.iter().any(|c| c.host == host && c.nic == *k));
        let for_good = cuts.iter().any(|c| c.host == host && c.outage_s.is_none());
        if left.is_empty() && for_good {
            return Err(bad(
                "that cuts every network of the host for good: a host failure, which is --cut \
                 (give every cut of the host an outage, +SECONDS, for an outage)",
            ));
        }
        if left.is_empty() {
            // Every network of the host down together at some time: the longest such stretch
            // must stay well within the heartbeat timeout.
            let from = cuts
                .iter()
                .filter(|c| c.host == host)
                .map(|c| c.at_s)
                .fold(f64::MIN, f64::max);
            let to = cuts
                .iter()
                .filter(|c| c.host == host)
                .filter_map(NicCut::back_at_s)
                .fold(f64::MAX, f64::min);
            let half_s = heartbeat_timeout_ms as f64 / 2000.0;
            if to - from >= half_s {
                return Err(bad(&format!(
                    "every network of the host would be down for {:.1} s: not shorter than \
                     half the heartbeat timeout ({half_s:.1} s), a host failure",
                    to - from
                )));
            }
        }
    }
    // Two cut hosts with no network left in common cannot reach each other: a partition,
    // which heartbeats rightly take for a failure. Only cuts for good count: an outage ends.
    let left = |h: u32| -> Vec<u32> {
        (0..nics)
            .filter(|k| {
                !cuts
                    .iter()
                    .any(|c| c.host == h && c.nic == *k && c.outage_s.is_none())
            })
            .collect()
    };
    for a in &cuts {
        for b in &cuts {
            let (la, lb) = (left(a.host), left(b.host));
            if a.host < b.host && !la.iter().any(|k| lb.contains(k)) {
                return Err(format!(
                    "--cut-nic: hosts {} and {} (ranks {} and {}) would have no network in \
                     common: a partition, not a network cut",
                    a.host, b.host, a.rank, b.rank
                ));
            }
        }
    }
    cuts.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    Ok(cuts)
}

/// The report's section: which networks went down, and which links failed over (from `tbon
/// status`, or why it could not say), as text and JSON.
pub fn render(
    cuts: &[NicCut],
    links: &Result<Vec<FailedOver>, String>,
) -> (String, serde_json::Value) {
    let mut text = String::from(
        "\n  network cuts (one network of a host down, or every one for a short outage; its daemons live on; not faults):",
    );
    for c in cuts {
        let back = match (c.outage_s, c.restored) {
            (None, _) => String::new(),
            (Some(o), true) => format!(" for {o:.1} s"),
            (Some(o), false) => format!(" for {o:.1} s (never back)"),
        };
        text.push_str(&format!(
            " network {} of host {} (rank {}) at {:.1} s{back}{};",
            c.nic,
            c.host,
            c.rank,
            c.at_s,
            if c.done { "" } else { " (never done)" }
        ));
    }
    match links {
        Ok(l) => {
            text.push_str("\n  links that failed over (tbon status):");
            for f in l {
                text.push_str(&format!(
                    " {} to {} via {} ({}x);",
                    f.rank,
                    f.peer,
                    f.address.as_deref().unwrap_or("-"),
                    f.failovers
                ));
            }
            if l.is_empty() {
                text.push_str(" none");
            }
        }
        Err(e) => text.push_str(&format!("\n  links that failed over: unknown ({e})")),
    }
    text.push('\n');
    let json = serde_json::json!({
        "cuts": cuts,
        "links_failed_over": links.as_ref().ok(),
        "status_error": links.as_ref().err(),
    });
    (text, json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_checked() {
        let plan = |specs: &[String], n, hosts, nics| plan(specs, n, hosts, nics, 10_000);
        let c = plan(&["5:0@2".into(), "2:0@1.5".into()], 8, 4, 2).unwrap();
        assert_eq!((c[0].rank, c[0].nic, c[0].host), (2, 0, 1));
        assert_eq!((c[1].rank, c[1].nic, c[1].host), (5, 0, 2));
        assert!(plan(&["8:0@1".into()], 8, 4, 2).is_err());
        assert!(plan(&["2:2@1".into()], 8, 4, 2).is_err());
        assert!(plan(&["2@1".into()], 8, 4, 2).is_err());
        assert!(plan(&["2:0@-1".into()], 8, 4, 2).is_err());
        // Both networks of host 1 (ranks 2 and 3): a host failure.
        assert!(plan(&["2:0@1".into(), "3:1@2".into()], 8, 4, 2).is_err());
        // Network 0 of host 1 and network 1 of host 2: they share none.
        assert!(plan(&["2:0@1".into(), "5:1@2".into()], 8, 4, 2).is_err());
        assert!(plan(&["2:0@1".into(), "5:0@2".into()], 8, 4, 2).is_ok());
        // One network of a one-network host: the same.
        assert!(plan(&["2:0@1".into()], 8, 4, 1).is_err());
        // Outages: every network of host 1 down together for 3 s is no failure with a 10 s
        // heartbeat timeout, for 5 s it is, and so is one cut for good among them.
        let c = plan(&["2:0@1+3".into(), "3:1@1+3".into()], 8, 4, 2).unwrap();
        assert_eq!(c[0].back_at_s(), Some(4.0));
        assert!(plan(&["2:0@1+5".into(), "3:1@1+5".into()], 8, 4, 2).is_err());
        assert!(plan(&["2:0@1+3".into(), "3:1@1".into()], 8, 4, 2).is_err());
        assert!(plan(&["2:0@1+0".into()], 8, 4, 2).is_err());
        // Outages end: host 1's network 0 and host 2's network 1 down for a while is fine.
        assert!(plan(&["2:0@1+2".into(), "5:1@2+2".into()], 8, 4, 2).is_ok());
    }
}
