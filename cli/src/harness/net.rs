//! `tbon harness --hosts N [--nics K]`: N emulated hosts on this machine, each a network
//! namespace joined to K bridges (K networks) by one veth pair per network, so daemons on
//! different "hosts" talk over real (virtual) links that can be cut, one network at a time or
//! all at once. Network k is 10.(77+k).0.0/16. Needs root (CAP_NET_ADMIN) and the `ip` command
//! (iproute2). Everything is removed on drop.

use std::process::{Command, Stdio};

/// The host of `rank` among `n` daemons on `hosts` hosts: consecutive ranks share a host, rank 0
/// on host 0.
pub fn host_of(hosts: u32, rank: u32, n: u32) -> u32 {
    (u64::from(rank) * u64::from(hosts.max(1)) / u64::from(n.max(1))) as u32
}

pub struct Hosts {
    id: u32,
    nics: u32,
    bridges_made: u32,
    made: u32,
}

/// At most this many networks per host (`--nics`).
pub const NICS_MAX: u32 = 4;

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
    /// Creates `count` namespaces, `nics` bridges, and per namespace one veth pair per bridge,
    /// with the address 10.(77+k).x.y/16 on network k.
    pub fn create(count: u32, nics: u32) -> Result<Hosts, String> {
        if count > 4000 {
            return Err("--hosts: at most 4000".into());
        }
        if nics == 0 || nics > NICS_MAX {
            return Err(format!("--nics: 1 to {NICS_MAX}"));
        }
        let id = std::process::id() % 10_000;
        let mut h = Hosts {
            id,
            nics,
            bridges_made: 0,
            made: 0,
        };
        for k in 0..nics {
            let br = h.bridge(k);
            ip(&["link", "add", &br, "type", "bridge"])?;
            h.bridges_made = k + 1;
            ip(&["link", "set", &br, "up"])?;
        }
        for i in 0..count {
            let ns = h.namespace(i);
            ip(&["netns", "add", &ns])?;
            h.made = i + 1;
            for k in 0..nics {
                let (outer, inner) = (h.outer(i, k), h.inner(i, k));
                ip(&[
                    "link", "add", &outer, "type", "veth", "peer", "name", &inner,
                ])?;
                ip(&["link", "set", &inner, "netns", &ns])?;
                ip(&["link", "set", &outer, "master", &h.bridge(k), "up"])?;
                ip(&["-n", &ns, "addr", "add", &h.address(i, k), "dev", &inner])?;
                ip(&["-n", &ns, "link", "set", &inner, "up"])?;
            }
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(h)
    }

    fn bridge(&self, k: u32) -> String {
        format!("tb{}br{k}", self.id)
    }
    pub fn namespace(&self, i: u32) -> String {
        format!("tbon{}h{i}", self.id)
    }
    fn outer(&self, i: u32, k: u32) -> String {
        format!("tb{}o{i}n{k}", self.id)
    }
    fn inner(&self, i: u32, k: u32) -> String {
        format!("tb{}i{i}n{k}", self.id)
    }
    fn address(&self, i: u32, k: u32) -> String {
        format!("10.{}.{}.{}/16", 77 + k, i / 250, i % 250 + 1)
    }

    /// The `--if-include` value daemons on these hosts use: every network.
    pub fn subnets(&self) -> String {
        (0..self.nics)
            .map(|k| format!("10.{}.0.0/16", 77 + k))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Takes every network of host `i` down (`up = false`: the host is cut off) or up again.
    pub fn set_link(&self, i: u32, up: bool) -> Result<(), String> {
        for k in 0..self.nics {
            self.set_nic(i, k, up)?;
        }
        Ok(())
    }

    /// Takes network `k` of host `i` down (`up = false`) or up again: the host's end of the
    /// veth pair, so its address stays but nothing crosses that network.
    pub fn set_nic(&self, i: u32, k: u32, up: bool) -> Result<(), String> {
        ip(&[
            "-n",
            &self.namespace(i),
            "link",
            "set",
            &self.inner(i, k),
            if up { "up" } else { "down" },
        ])
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for i in 0..self.made {
            for k in 0..self.nics {
                let _ = ip(&["link", "del", &self.outer(i, k)]);
            }
            let _ = ip(&["netns", "del", &self.namespace(i)]);
        }
        for k in 0..self.bridges_made {
            let _ = ip(&["link", "del", &self.bridge(k)]);
        }
    }
}
