//! Choosing the local addresses a daemon listens on and advertises in its contact URI.
//!
//! Entries of the include/exclude lists are interface names (`eth0`, `lo`), CIDRs
//! (`10.0.0.0/8`, `fe80::/10`) or bare addresses (a /32 or /128). The matching is pure
//! ([`select_from`]); [`select_addresses`] feeds it the host's interfaces via `getifaddrs`.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use nix::net::if_::InterfaceFlags;

/// Why no address list could be produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InterfaceError {
    /// Both an include and an exclude list were given (they are exclusive, as in PRRTE).
    BothLists,
    /// An entry is neither an interface name nor a CIDR/address.
    BadEntry { entry: String, reason: String },
    /// Listing the host's interfaces failed.
    Os(nix::errno::Errno),
    /// Nothing is left after applying the lists and address families. `why` says which filter.
    NoAddress { why: String },
}

impl fmt::Display for InterfaceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InterfaceError::BothLists => {
                f.write_str("if_include and if_exclude are exclusive: give only one")
            }
            InterfaceError::BadEntry { entry, reason } => {
                write!(f, "interface entry {entry:?}: {reason}")
            }
            InterfaceError::Os(e) => write!(f, "cannot list network interfaces: {e}"),
            InterfaceError::NoAddress { why } => write!(f, "no usable local address: {why}"),
        }
    }
}

impl std::error::Error for InterfaceError {}

/// An IP network: an address and a prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Cidr {
    /// Whether `ip` lies in this network. Addresses of the other family never match (an
    /// IPv4-mapped IPv6 address is IPv6 here).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = String;

    /// `addr/prefix`, or a bare address (all bits significant). Host bits set in `addr` are
    /// allowed and ignored, as most tools do.
    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{addr:?} is not an IPv4 or IPv6 address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => match p.parse::<u8>() {
                Ok(n) if p.bytes().all(|b| b.is_ascii_digit()) && n <= max => n,
                _ => return Err(format!("prefix {p:?} is not a number 0..={max}")),
            },
        };
        Ok(Cidr { addr, prefix })
    }
}

/// One entry of an include or exclude list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IfSpec {
    /// An interface name, matched exactly.
    Name(String),
    /// A network (or a single address).
    Net(Cidr),
}

impl IfSpec {
    /// Parse one list entry: a CIDR if it contains '/', an address if it parses as one,
    /// otherwise an interface name (1 to 15 bytes, Linux's limit, no whitespace).
    pub fn parse(entry: &str) -> Result<IfSpec, InterfaceError> {
        let bad = |reason: String| InterfaceError::BadEntry {
            entry: entry.to_string(),
            reason,
        };
        let e = entry.trim();
        if e.contains('/') {
            return e.parse().map(IfSpec::Net).map_err(bad);
        }
        if let Ok(c) = e.parse::<Cidr>() {
            return Ok(IfSpec::Net(c));
        }
        if e.is_empty() || e.len() > 15 || e.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(bad(
                "not a CIDR, an address or an interface name (1 to 15 bytes, no whitespace)".into(),
            ));
        }
        Ok(IfSpec::Name(e.to_string()))
    }

    /// Whether this entry selects address `ip` of interface `name`.
    pub fn matches(&self, name: &str, ip: IpAddr) -> bool {
        match self {
            IfSpec::Name(n) => n == name,
            IfSpec::Net(c) => c.contains(ip),
        }
    }
}

/// One address of one local interface (the input of [`select_from`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfAddr {
    pub name: String,
    pub ip: IpAddr,
    /// The length of its network's prefix (from the netmask; all bits when none is given).
    pub prefix: u8,
    pub loopback: bool,
}

fn is_v6_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V6(v6) => v6.segments()[0] & 0xffc0 == 0xfe80,
        IpAddr::V4(_) => false,
    }
}

/// Pick addresses from `addrs` (in their order, without duplicates).
///
/// - Only families enabled by `ipv4`/`ipv6`.
/// - `include` non-empty: exactly the addresses an entry matches (loopback and IPv6
///   link-local included only this way).
/// - Otherwise: all addresses no `exclude` entry matches, minus IPv6 link-local ones (they need
///   a scope id to be reached); loopback only if nothing else is left, so daemons sharing one
///   host with no network still find each other on 127.0.0.1.
///
/// Errors: both lists given, a malformed entry, or nothing left.
pub fn select_from(
    addrs: &[IfAddr],
    include: &[String],
    exclude: &[String],
    ipv4: bool,
    ipv6: bool,
) -> Result<Vec<IpAddr>, InterfaceError> {
    if !include.is_empty() && !exclude.is_empty() {
        return Err(InterfaceError::BothLists);
    }
    let include: Vec<IfSpec> = include
        .iter()
        .map(|e| IfSpec::parse(e))
        .collect::<Result<_, _>>()?;
    let exclude: Vec<IfSpec> = exclude
        .iter()
        .map(|e| IfSpec::parse(e))
        .collect::<Result<_, _>>()?;
    let family_ok = |ip: &IpAddr| if ip.is_ipv4() { ipv4 } else { ipv6 };

    let candidates = addrs.iter().filter(|a| family_ok(&a.ip));
    let chosen: Vec<&IfAddr> = if !include.is_empty() {
        candidates
            .filter(|a| include.iter().any(|s| s.matches(&a.name, a.ip)))
            .collect()
    } else {
        let kept: Vec<&IfAddr> = candidates
            .filter(|a| !exclude.iter().any(|s| s.matches(&a.name, a.ip)))
            .filter(|a| !is_v6_link_local(a.ip))
            .collect();
        if kept.iter().any(|a| !a.loopback) {
            kept.into_iter().filter(|a| !a.loopback).collect()
        } else {
            kept
        }
    };

    let mut out: Vec<IpAddr> = Vec::new();
    for a in chosen {
        if !out.contains(&a.ip) {
            out.push(a.ip);
        }
    }
    if out.is_empty() {
        let fams = match (ipv4, ipv6) {
            (true, true) => "IPv4 or IPv6",
            (true, false) => "IPv4",
            (false, true) => "IPv6",
            (false, false) => "no family (ipv4 and ipv6 both off)",
        };
        let filter = if !include.is_empty() {
            "matching if_include"
        } else if !exclude.is_empty() {
            "left after if_exclude"
        } else {
            "on any interface that is up"
        };
        return Err(InterfaceError::NoAddress {
            why: format!("no {fams} address {filter}"),
        });
    }
    Ok(out)
}

/// The addresses of the host's interfaces that are up, as [`IfAddr`]s.
pub fn local_interfaces() -> Result<Vec<IfAddr>, InterfaceError> {
    let mut out = Vec::new();
    for ifa in nix::ifaddrs::getifaddrs().map_err(InterfaceError::Os)? {
        if !ifa.flags.contains(InterfaceFlags::IFF_UP) {
            continue;
        }
        let Some(addr) = ifa.address else { continue };
        let ip = if let Some(v4) = addr.as_sockaddr_in() {
            IpAddr::V4(v4.ip())
        } else if let Some(v6) = addr.as_sockaddr_in6() {
            IpAddr::V6(v6.ip())
        } else {
            continue; // link-layer and other families
        };
        let loopback = ifa.flags.contains(InterfaceFlags::IFF_LOOPBACK) || ip.is_loopback();
        let prefix = ifa
            .netmask
            .and_then(|m| {
                m.as_sockaddr_in()
                    .map(|v4| u32::from(v4.ip()).leading_ones() as u8)
                    .or_else(|| {
                        m.as_sockaddr_in6()
                            .map(|v6| u128::from(v6.ip()).leading_ones() as u8)
                    })
            })
            .unwrap_or(if ip.is_ipv4() { 32 } else { 128 });
        out.push(IfAddr {
            name: ifa.interface_name,
            ip,
            prefix,
            loopback,
        });
    }
    Ok(out)
}

/// The local addresses to listen on and advertise, by the rules of [`select_from`] applied to
/// the host's interfaces that are up. The caller passes the `if_include`, `if_exclude`, `ipv4`
/// and `ipv6` settings.
pub fn select_addresses(
    include: &[String],
    exclude: &[String],
    ipv4: bool,
    ipv6: bool,
) -> Result<Vec<IpAddr>, InterfaceError> {
    Ok(select_networks(include, exclude, ipv4, ipv6)?
        .into_iter()
        .map(|c| c.addr)
        .collect())
}

/// [`select_addresses`] with each address's network (its interface's netmask), in the same
/// order: what [`order_by_reach`] compares a peer's addresses with.
pub fn select_networks(
    include: &[String],
    exclude: &[String],
    ipv4: bool,
    ipv6: bool,
) -> Result<Vec<Cidr>, InterfaceError> {
    let addrs = local_interfaces()?;
    let chosen = select_from(&addrs, include, exclude, ipv4, ipv6)?;
    log::debug!("interfaces: {addrs:?}; selected {chosen:?}");
    Ok(networks_of(&addrs, &chosen))
}

/// The network of each address in `chosen`, as its interface in `addrs` gives it (an address
/// not found there is a network of its own: all bits significant).
pub fn networks_of(addrs: &[IfAddr], chosen: &[IpAddr]) -> Vec<Cidr> {
    chosen
        .iter()
        .map(|ip| {
            let prefix = addrs
                .iter()
                .find(|a| a.ip == *ip)
                .map_or(if ip.is_ipv4() { 32 } else { 128 }, |a| a.prefix);
            Cidr { addr: *ip, prefix }
        })
        .collect()
}

/// `addrs` with those in one of `nets` moved to the front (`first`) or to the back, each part
/// in its order: the `bulk_networks` setting's preference (bulk links dial those networks
/// first, control links last).
pub fn prefer(addrs: &[SocketAddr], nets: &[Cidr], first: bool) -> Vec<SocketAddr> {
    let inside = |a: &&SocketAddr| nets.iter().any(|n| n.contains(a.ip())) == first;
    let mut out: Vec<SocketAddr> = addrs.iter().filter(inside).copied().collect();
    out.extend(addrs.iter().filter(|a| !inside(a)));
    out
}

/// A peer's addresses in the order to try them (ORTE's rule): first those on a network this
/// daemon has an address on (reached without a router), then the others (routed), each group
/// in the peer's order. The first is the address a link uses; the others are its alternates.
pub fn order_by_reach(peer: &[SocketAddr], local: &[Cidr]) -> Vec<SocketAddr> {
    let direct = |a: &SocketAddr| local.iter().any(|n| n.contains(a.ip()));
    let mut out: Vec<SocketAddr> = peer.iter().filter(|a| direct(a)).copied().collect();
    out.extend(peer.iter().filter(|a| !direct(a)));
    out
}

#[cfg(test)]
mod tests;
