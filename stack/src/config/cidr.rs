//! An address with its prefix length ([`Cidr`]), as ports, routes and
//! the control endpoint take them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::Deserialize;

use crate::error::{Error, Result};

/// An address with its prefix length, such as `198.18.0.2/24`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    /// The address.
    pub addr: IpAddr,
    /// The prefix length.
    pub prefix_len: u8,
}

impl Cidr {
    /// Whether the IPv4 address `other` (as a number) lies in this prefix.
    #[inline]
    pub fn contains_v4(&self, other: u32) -> bool {
        match self.addr {
            IpAddr::V4(a) => {
                let mask = if self.prefix_len == 0 { 0 } else { u32::MAX << (32 - self.prefix_len as u32) };
                u32::from(a) & mask == other & mask
            }
            IpAddr::V6(_) => false,
        }
    }

    /// Whether `other` lies in this prefix.
    pub fn contains(&self, other: &IpAddr) -> bool {
        match (self.addr, other) {
            (IpAddr::V4(_), IpAddr::V4(b)) => self.contains_v4(u32::from(*b)),
            (IpAddr::V6(a), IpAddr::V6(b)) => {
                let mask = if self.prefix_len == 0 { 0 } else { u128::MAX << (128 - self.prefix_len as u32) };
                u128::from(a) & mask == u128::from(*b) & mask
            }
            _ => false,
        }
    }

    /// The prefix itself: the address with its host bits cleared.
    pub fn network(&self) -> Cidr {
        let addr = match self.addr {
            IpAddr::V4(a) => {
                let mask = if self.prefix_len == 0 { 0 } else { u32::MAX << (32 - self.prefix_len.min(32) as u32) };
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
            }
            IpAddr::V6(a) => {
                let mask = if self.prefix_len == 0 { 0 } else { u128::MAX << (128 - self.prefix_len.min(128) as u32) };
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
            }
        };
        Cidr { addr, prefix_len: self.prefix_len }
    }

    /// The subnet-directed broadcast address (IPv4 prefixes up to /30).
    pub fn broadcast(&self) -> Option<Ipv4Addr> {
        match self.addr {
            IpAddr::V4(a) if self.prefix_len <= 30 => {
                let host = u32::MAX >> self.prefix_len as u32;
                Some(Ipv4Addr::from(u32::from(a) | host))
            }
            _ => None,
        }
    }
}

impl FromStr for Cidr {
    type Err = Error;

    fn from_str(s: &str) -> Result<Cidr> {
        let bad = || Error::Config(format!("{s:?} is not ADDRESS/PREFIX (like 198.18.0.2/24 or fd00::2/64)"));
        let (a, p) = s.split_once('/').ok_or_else(bad)?;
        let addr: IpAddr = a.parse().map_err(|_| bad())?;
        let prefix_len: u8 = p.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix_len > max {
            return Err(bad());
        }
        if addr.is_unspecified() || addr.is_multicast() {
            return Err(Error::Config(format!("{s}: an interface address must be a unicast address")));
        }
        Ok(Cidr { addr, prefix_len })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Whether an IPv6 address is link-local (fe80::/10).
pub fn is_link_local(a: &Ipv6Addr) -> bool {
    a.segments()[0] & 0xffc0 == 0xfe80
}
