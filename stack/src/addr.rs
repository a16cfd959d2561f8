//! Address helpers: IPv4-mapped IPv6 addresses to and from IPv4.

use std::net::{IpAddr, SocketAddr};

/// IPv4-mapped IPv6 addresses become IPv4: the table and the wire speak IPv4.
pub fn normalize(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), v6.port()),
            None => a,
        },
        v4 => v4,
    }
}

/// IPv4 addresses shown IPv4-mapped, as an IPv6 socket shows them.
pub fn mapped(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V4(v4) => SocketAddr::new(IpAddr::V6(v4.ip().to_ipv6_mapped()), v4.port()),
        v6 => v6,
    }
}
