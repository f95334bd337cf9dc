//! Binding the daemon's listeners (IPv4 and/or IPv6; a static port, a port range, or an
//! ephemeral port) and choosing the addresses it publishes in its contact URI.

use crate::config::Config;
use crate::error::StartError;
use crate::limits;
use crate::oob::interfaces::select_addresses;
use mio::net::TcpListener;
use socket2::{Domain, Protocol, Socket, Type};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Binds the listeners and returns them with the addresses to publish (the selected interface
/// addresses with the bound port). Listeners bind the wildcard address of each family; the
/// interface lists decide what is published, as PRRTE does.
pub(crate) fn bind(cfg: &Config) -> Result<(Vec<TcpListener>, Vec<SocketAddr>), StartError> {
    let ips = select_addresses(&cfg.if_include, &cfg.if_exclude, cfg.ipv4, cfg.ipv6)
        .map_err(|e| StartError::Config(e.to_string()))?;
    if ips.is_empty() {
        return Err(StartError::Config(
            "no interface address matches the include/exclude lists".into(),
        ));
    }
    let want_v4 = ips.iter().any(IpAddr::is_ipv4);
    let want_v6 = ips.iter().any(IpAddr::is_ipv6);
    let range = cfg
        .port_range_bounds()
        .map_err(|e| StartError::Config(e.to_string()))?;
    let candidates: Vec<u16> = match (cfg.port, range) {
        (p, _) if p != 0 => vec![p],
        (_, Some((lo, hi))) => (lo..=hi).take(limits::PORT_RANGE_TRIES_MAX).collect(),
        _ => vec![0],
    };
    let mut last_err = None;
    for port in candidates {
        match bind_port(port, want_v4, want_v6) {
            Ok((listeners, port)) => {
                let addrs = ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect();
                return Ok((listeners, addrs));
            }
            Err(e) => last_err = Some(e),
        }
    }
    Err(StartError::Io(last_err.unwrap_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::AddrInUse, "no port available")
    })))
}

/// Binds every wanted family on one port (port 0: the kernel picks one for the first family and
/// the second family takes the same).
fn bind_port(port: u16, v4: bool, v6: bool) -> std::io::Result<(Vec<TcpListener>, u16)> {
    let mut out = Vec::new();
    let mut port = port;
    if v4 {
        let l = listener(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port))?;
        port = l.local_addr()?.port();
        out.push(l);
    }
    if v6 {
        let l = listener(SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port))?;
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
    socket.bind(&addr.into())?;
    socket.listen(limits::LISTEN_BACKLOG)?;
    Ok(TcpListener::from_std(socket.into()))
}
