//! Binding the daemon's listeners (one per selected interface address, IPv4 and/or IPv6, all
//! on one port: a static port, a port range, or an ephemeral port) and choosing the addresses
//! it publishes in its contact URI.

use crate::config::{Config, ConfigError};
use crate::error::StartError;
use crate::limits;
use crate::oob::interfaces::{Cidr, select_networks};
use mio::net::TcpListener;
use socket2::{Domain, Protocol, Socket, Type};
use std::net::{IpAddr, SocketAddr};

/// The interface setting to blame when no address is left: the list that was given.
fn interface_setting(cfg: &Config) -> &'static str {
    if !cfg.if_include.is_empty() {
        "if_include"
    } else if !cfg.if_exclude.is_empty() {
        "if_exclude"
    } else {
        "ipv4"
    }
}

/// What [`bind`] made: the listeners, the addresses to publish, and their networks.
pub(crate) struct Bound {
    pub listeners: Vec<TcpListener>,
    pub addrs: Vec<SocketAddr>,
    pub networks: Vec<Cidr>,
}

/// Binds the listeners and returns them with the addresses to publish (the selected interface
/// addresses with the bound port) and their networks (for `oob::interfaces::order_by_reach`). One listener per selected address, all on one port: a
/// daemon listens only where the interface settings (`if_include`, `if_exclude`, `ipv4`,
/// `ipv6`) say, never on the wildcard address, so a connection to any other local address is
/// refused by the kernel.
pub(crate) fn bind(cfg: &Config) -> Result<Bound, StartError> {
    let networks =
        select_networks(&cfg.if_include, &cfg.if_exclude, cfg.ipv4, cfg.ipv6).map_err(|e| {
            ConfigError::Invalid {
                setting: interface_setting(cfg),
                reason: e.to_string(),
            }
        })?;
    let ips: Vec<IpAddr> = networks.iter().map(|n| n.addr).collect();
    if ips.is_empty() {
        return Err(ConfigError::Invalid {
            setting: interface_setting(cfg),
            reason: "no interface address matches the include/exclude lists".into(),
        }
        .into());
    }
    let range = cfg.port_range_bounds()?;
    let candidates: Vec<u16> = match (cfg.port, range) {
        (p, _) if p != 0 => vec![p],
        (_, Some((lo, hi))) => (lo..=hi).take(limits::PORT_RANGE_TRIES_MAX).collect(),
        // An ephemeral port: the kernel picks one for the first address; if another address
        // cannot have the same one, try again with a new pick.
        _ => vec![0; limits::EPHEMERAL_PORT_TRIES_MAX],
    };
    let mut last_err = None;
    for port in candidates {
        match bind_port(port, &ips) {
            Ok((listeners, port)) => {
                let addrs = ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect();
                return Ok(Bound {
                    listeners,
                    addrs,
                    networks,
                });
            }
            Err(e) => last_err = Some(e),
        }
    }
    Err(StartError::Io(last_err.unwrap_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::AddrInUse, "no port available")
    })))
}

/// Binds every address on one port (port 0: the kernel picks one for the first address and
/// the others take the same). All or nothing: on an error the listeners made so far close.
fn bind_port(port: u16, ips: &[IpAddr]) -> std::io::Result<(Vec<TcpListener>, u16)> {
    let mut out = Vec::with_capacity(ips.len());
    let mut port = port;
    for ip in ips {
        let l = listener(SocketAddr::new(*ip, port))?;
        port = l.local_addr()?.port();
        out.push(l);
    }
    Ok((out, port))
}

fn listener(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    // The address in the error: "address already in use" alone does not say which port. The
    // kind stays (a port range tries the next port on `AddrInUse`).
    let at = |e: std::io::Error| std::io::Error::new(e.kind(), format!("listening on {addr}: {e}"));
    socket.bind(&addr.into()).map_err(at)?;
    socket.listen(limits::LISTEN_BACKLOG).map_err(at)?;
    Ok(TcpListener::from_std(socket.into()))
}
