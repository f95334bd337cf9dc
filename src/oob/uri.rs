//! Contact URIs: how a daemon tells others where to reach it.
//!
//! Shape (PRRTE's): `<dvm_id>.<rank>;tcp://ip1,ip2:port[;tcp6://[addr1],[addr2]:port]`.
//! Each `tcp`/`tcp6` section lists addresses sharing one port; a URI may hold any number of
//! sections, in any order. IPv6 addresses are bracketed and may carry a numeric scope id
//! (`[fe80::1%2]`), which link-local addresses need.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::str::FromStr;

use crate::Rank;
use crate::limits::CONTACT_URI_MAX_BYTES;

/// Where to reach one daemon.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ContactUri {
    /// The DVM's identity (may contain dots; must not contain ';' or be empty to round-trip).
    pub dvm_id: String,
    /// The daemon's rank.
    pub rank: Rank,
    /// Addresses to try, in order of preference. IPv6 flow info is not carried.
    pub addrs: Vec<SocketAddr>,
}

/// Why a string is not a contact URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UriError {
    /// What is wrong, naming the offending part.
    pub reason: String,
}

impl fmt::Display for UriError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid contact URI: {}", self.reason)
    }
}

impl std::error::Error for UriError {}

fn err<T>(reason: impl Into<String>) -> Result<T, UriError> {
    Err(UriError {
        reason: reason.into(),
    })
}

/// Show at most a short, printable prefix of untrusted text in error messages.
fn excerpt(s: &str) -> String {
    let mut e: String = s.chars().take(64).collect();
    if e.len() < s.len() {
        e.push('…');
    }
    format!("{e:?}")
}

fn parse_digits<T: FromStr>(s: &str, what: &str) -> Result<T, UriError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return err(format!("{what} {} is not a decimal number", excerpt(s)));
    }
    s.parse()
        .or_else(|_| err(format!("{what} {} is out of range", excerpt(s))))
}

fn parse_v6_host(h: &str) -> Result<(Ipv6Addr, u32), UriError> {
    let Some(inner) = h.strip_prefix('[').and_then(|h| h.strip_suffix(']')) else {
        return err(format!(
            "IPv6 address {} must be in brackets, like [::1]",
            excerpt(h)
        ));
    };
    let (addr, scope) = match inner.split_once('%') {
        Some((a, s)) => (a, parse_digits::<u32>(s, "IPv6 scope id")?),
        None => (inner, 0),
    };
    match addr.parse() {
        Ok(ip) => Ok((ip, scope)),
        Err(_) => err(format!("{} is not an IPv6 address", excerpt(addr))),
    }
}

fn parse_section(section: &str, out: &mut Vec<SocketAddr>) -> Result<(), UriError> {
    let (v6, body) = if let Some(b) = section.strip_prefix("tcp6://") {
        (true, b)
    } else if let Some(b) = section.strip_prefix("tcp://") {
        (false, b)
    } else {
        return err(format!(
            "section {} does not start with tcp:// or tcp6://",
            excerpt(section)
        ));
    };
    let Some((hosts, port)) = body.rsplit_once(':') else {
        return err(format!("section {} has no :port", excerpt(section)));
    };
    let port: u16 = parse_digits(port, "port")?;
    if port == 0 {
        return err("port 0 cannot be connected to");
    }
    if hosts.is_empty() {
        return err(format!("section {} lists no address", excerpt(section)));
    }
    for h in hosts.split(',') {
        if v6 {
            let (ip, scope) = parse_v6_host(h)?;
            out.push(SocketAddr::V6(SocketAddrV6::new(ip, port, 0, scope)));
        } else {
            match h.parse::<Ipv4Addr>() {
                Ok(ip) => out.push(SocketAddr::V4(SocketAddrV4::new(ip, port))),
                Err(_) => return err(format!("{} is not an IPv4 address", excerpt(h))),
            }
        }
    }
    Ok(())
}

impl FromStr for ContactUri {
    type Err = UriError;

    /// Parse a contact URI. Refuses (never panics on) anything malformed: a string longer than
    /// [`CONTACT_URI_MAX_BYTES`], an empty DVM id, a rank that is not a decimal `u32`, a section
    /// that is not `tcp://` or `tcp6://`, a bad address, port 0, or no address at all.
    fn from_str(s: &str) -> Result<Self, UriError> {
        if s.len() > CONTACT_URI_MAX_BYTES {
            return err(format!(
                "{} bytes long, more than the {CONTACT_URI_MAX_BYTES} allowed",
                s.len()
            ));
        }
        let Some((name, sections)) = s.split_once(';') else {
            return err("no ';' after <dvm_id>.<rank>: no addresses");
        };
        // The DVM id may contain dots: the rank follows the last one.
        let Some((dvm_id, rank)) = name.rsplit_once('.') else {
            return err(format!("{} is not <dvm_id>.<rank>", excerpt(name)));
        };
        if dvm_id.is_empty() {
            return err("empty DVM id");
        }
        let rank: Rank = parse_digits(rank, "rank")?;
        let mut addrs = Vec::new();
        for section in sections.split(';') {
            parse_section(section, &mut addrs)?;
        }
        Ok(ContactUri {
            dvm_id: dvm_id.to_string(),
            rank,
            addrs,
        })
    }
}

impl fmt::Display for ContactUri {
    /// Consecutive addresses of the same family and port share one section, so that parsing
    /// the output gives back the same addresses in the same order. A URI without addresses
    /// prints as `<dvm_id>.<rank>`, which does not parse back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.dvm_id, self.rank)?;
        let mut i = 0;
        while let Some(first) = self.addrs.get(i) {
            let same = |a: &SocketAddr| a.is_ipv4() == first.is_ipv4() && a.port() == first.port();
            let rest = self.addrs.get(i..).unwrap_or(&[]);
            let group: Vec<&SocketAddr> = rest.iter().take_while(|a| same(a)).collect();
            f.write_str(if first.is_ipv4() {
                ";tcp://"
            } else {
                ";tcp6://"
            })?;
            for (k, a) in group.iter().enumerate() {
                if k > 0 {
                    f.write_str(",")?;
                }
                match a {
                    SocketAddr::V4(a) => write!(f, "{}", a.ip())?,
                    SocketAddr::V6(a) if a.scope_id() != 0 => {
                        write!(f, "[{}%{}]", a.ip(), a.scope_id())?
                    }
                    SocketAddr::V6(a) => write!(f, "[{}]", a.ip())?,
                }
            }
            write!(f, ":{}", first.port())?;
            i += group.len();
        }
        Ok(())
    }
}

impl ContactUri {
    /// The addresses' IPs without ports, for logging and for matching an accepted connection.
    pub fn ips(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.addrs.iter().map(SocketAddr::ip)
    }
}

#[cfg(test)]
mod tests;
