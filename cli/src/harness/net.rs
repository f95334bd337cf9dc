//! `tbon harness --hosts N`: N emulated hosts on this machine, each a network namespace joined to
//! one bridge by a veth pair, so daemons on different "hosts" talk over real (virtual) links that
//! can be cut. Needs root (CAP_NET_ADMIN) and the `ip` command (iproute2). Everything is removed
//! on drop.

use std::process::{Command, Stdio};

/// The host of `rank` among `n` daemons on `hosts` hosts: consecutive ranks share a host, rank 0
/// on host 0.
pub fn host_of(hosts: u32, rank: u32, n: u32) -> u32 {
    (u64::from(rank) * u64::from(hosts.max(1)) / u64::from(n.max(1))) as u32
}

pub struct Hosts {
    id: u32,
    made_bridge: bool,
    made: u32,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run ip (iproute2 is needed for --hosts): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {} (--hosts needs root and network namespaces)",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Hosts {
    /// Creates `count` namespaces, a bridge, and a veth pair per namespace with the address
    /// 10.77.x.y/16.
    pub fn create(count: u32) -> Result<Hosts, String> {
        if count > 4000 {
            return Err("--hosts: at most 4000".into());
        }
        let id = std::process::id() % 10_000;
        let mut h = Hosts {
            id,
            made_bridge: false,
            made: 0,
        };
        let br = h.bridge();
        ip(&["link", "add", &br, "type", "bridge"])?;
        h.made_bridge = true;
        ip(&["link", "set", &br, "up"])?;
        for i in 0..count {
            let ns = h.namespace(i);
            ip(&["netns", "add", &ns])?;
            h.made = i + 1;
            let (outer, inner) = (h.outer(i), h.inner(i));
            ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ])?;
            ip(&["link", "set", &inner, "netns", &ns])?;
            ip(&["link", "set", &outer, "master", &br, "up"])?;
            ip(&["-n", &ns, "addr", "add", &h.address(i), "dev", &inner])?;
            ip(&["-n", &ns, "link", "set", &inner, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(h)
    }

    fn bridge(&self) -> String {
        format!("tb{}br", self.id)
    }
    pub fn namespace(&self, i: u32) -> String {
        format!("tbon{}h{i}", self.id)
    }
    fn outer(&self, i: u32) -> String {
        format!("tb{}o{i}", self.id)
    }
    fn inner(&self, i: u32) -> String {
        format!("tb{}i{i}", self.id)
    }
    fn address(&self, i: u32) -> String {
        format!("10.77.{}.{}/16", i / 250, i % 250 + 1)
    }

    /// The `--if-include` value daemons on these hosts use.
    pub const SUBNET: &'static str = "10.77.0.0/16";

    /// Takes host `i`'s link down (`up = false`) or up again.
    pub fn set_link(&self, i: u32, up: bool) -> Result<(), String> {
        ip(&[
            "-n",
            &self.namespace(i),
            "link",
            "set",
            &self.inner(i),
            if up { "up" } else { "down" },
        ])
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for i in 0..self.made {
            let _ = ip(&["link", "del", &self.outer(i)]);
            let _ = ip(&["netns", "del", &self.namespace(i)]);
        }
        if self.made_bridge {
            let _ = ip(&["link", "del", &self.bridge()]);
        }
    }
}
