//! Multicast on a socket, as Linux's socket options: joining and leaving
//! groups (`IP_ADD_MEMBERSHIP`, `IPV6_JOIN_GROUP`), source-specific ones
//! (`IP_ADD_SOURCE_MEMBERSHIP`, `MCAST_JOIN_SOURCE_GROUP`), blocking
//! sources of an any-source membership (`IP_BLOCK_SOURCE`), and what the
//! socket's own datagrams to a group do (`IP_MULTICAST_TTL`,
//! `IPV6_MULTICAST_HOPS`, `IP_MULTICAST_IF`, `IP_MULTICAST_LOOP`). A
//! socket's memberships end when it closes; the interface leaves a group
//! when its last member does, reported with IGMPv3 or MLDv2.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{UdpSocket, errno};
use crate::lookup::Family;
use crate::mcast::Change;

impl UdpSocket {
    /// Joins IPv4 group `group` on the interface with address `interface`
    /// (0.0.0.0: the first interface with an IPv4 address), any source
    /// (`IP_ADD_MEMBERSHIP`). `EINVAL` for an address that is no group,
    /// `ENODEV` for no such interface, `EADDRINUSE` when already joined,
    /// `ENOBUFS` past 20 groups (Linux's `igmp_max_memberships`).
    pub fn join_multicast_v4(&self, group: &Ipv4Addr, interface: &Ipv4Addr) -> io::Result<()> {
        self.change_v4(group, interface, Change::Join)
    }

    /// Leaves it (`IP_DROP_MEMBERSHIP`; `EADDRNOTAVAIL` if not joined).
    pub fn leave_multicast_v4(&self, group: &Ipv4Addr, interface: &Ipv4Addr) -> io::Result<()> {
        self.change_v4(group, interface, Change::Leave)
    }

    /// Receives `group` from `source` too (`IP_ADD_SOURCE_MEMBERSHIP`: an
    /// INCLUDE membership, joined with its first source; `EINVAL` on an
    /// any-source one; `ENOBUFS` past 10 sources, `igmp_max_msf`).
    pub fn join_source_multicast_v4(
        &self,
        group: &Ipv4Addr,
        source: &Ipv4Addr,
        interface: &Ipv4Addr,
    ) -> io::Result<()> {
        self.change_v4(group, interface, Change::JoinSource(IpAddr::V4(*source)))
    }

    /// No longer from `source` (`IP_DROP_SOURCE_MEMBERSHIP`; the last
    /// source leaves the group).
    pub fn leave_source_multicast_v4(
        &self,
        group: &Ipv4Addr,
        source: &Ipv4Addr,
        interface: &Ipv4Addr,
    ) -> io::Result<()> {
        self.change_v4(group, interface, Change::LeaveSource(IpAddr::V4(*source)))
    }

    /// Drops `group`'s datagrams from `source` on an any-source membership
    /// (`IP_BLOCK_SOURCE`: EXCLUDE; `EINVAL` on a source-specific one).
    pub fn block_source_v4(&self, group: &Ipv4Addr, source: &Ipv4Addr, interface: &Ipv4Addr) -> io::Result<()> {
        self.change_v4(group, interface, Change::Block(IpAddr::V4(*source)))
    }

    /// Takes them again (`IP_UNBLOCK_SOURCE`).
    pub fn unblock_source_v4(&self, group: &Ipv4Addr, source: &Ipv4Addr, interface: &Ipv4Addr) -> io::Result<()> {
        self.change_v4(group, interface, Change::Unblock(IpAddr::V4(*source)))
    }

    /// Joins IPv6 group `group` on interface `interface` (spate's index
    /// plus one, as Linux's ifindex is never 0; 0: the first interface
    /// with IPv6), any source (`IPV6_JOIN_GROUP`). Errors as
    /// [`join_multicast_v4`](Self::join_multicast_v4); an IPv4 socket has
    /// no IPv6 memberships (`ENOPROTOOPT`).
    pub fn join_multicast_v6(&self, group: &Ipv6Addr, interface: u32) -> io::Result<()> {
        self.change_v6(group, interface, Change::Join)
    }

    /// Leaves it (`IPV6_LEAVE_GROUP`).
    pub fn leave_multicast_v6(&self, group: &Ipv6Addr, interface: u32) -> io::Result<()> {
        self.change_v6(group, interface, Change::Leave)
    }

    /// Source-specific IPv6 membership (`MCAST_JOIN_SOURCE_GROUP`; 64
    /// sources at most, `mld_max_msf`).
    pub fn join_source_multicast_v6(&self, group: &Ipv6Addr, source: &Ipv6Addr, interface: u32) -> io::Result<()> {
        self.change_v6(group, interface, Change::JoinSource(IpAddr::V6(*source)))
    }

    /// `MCAST_LEAVE_SOURCE_GROUP`.
    pub fn leave_source_multicast_v6(&self, group: &Ipv6Addr, source: &Ipv6Addr, interface: u32) -> io::Result<()> {
        self.change_v6(group, interface, Change::LeaveSource(IpAddr::V6(*source)))
    }

    /// `MCAST_BLOCK_SOURCE`.
    pub fn block_source_v6(&self, group: &Ipv6Addr, source: &Ipv6Addr, interface: u32) -> io::Result<()> {
        self.change_v6(group, interface, Change::Block(IpAddr::V6(*source)))
    }

    /// `MCAST_UNBLOCK_SOURCE`.
    pub fn unblock_source_v6(&self, group: &Ipv6Addr, source: &Ipv6Addr, interface: u32) -> io::Result<()> {
        self.change_v6(group, interface, Change::Unblock(IpAddr::V6(*source)))
    }

    /// Whether datagrams to groups this socket did not join reach it when
    /// another socket joined them on the interface (`IP_MULTICAST_ALL`
    /// and `IPV6_MULTICAST_ALL`; on by default, as in Linux).
    pub fn set_multicast_all(&self, on: bool) -> io::Result<()> {
        self.core.mcast_all.store(on, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// See [`set_multicast_all`](Self::set_multicast_all).
    pub fn multicast_all(&self) -> io::Result<bool> {
        Ok(self.core.mcast_all.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The TTL of this socket's IPv4 datagrams to groups
    /// (`IP_MULTICAST_TTL`): 0 to 255, 1 by default (the link only).
    pub fn set_multicast_ttl_v4(&self, ttl: u32) -> io::Result<()> {
        if ttl > 255 {
            return Err(errno(libc::EINVAL, "a TTL is 0 to 255"));
        }
        self.lock_state().ip.mcast_ttl = ttl as u8;
        Ok(())
    }

    /// See [`set_multicast_ttl_v4`](Self::set_multicast_ttl_v4).
    pub fn multicast_ttl_v4(&self) -> io::Result<u32> {
        Ok(self.state().ip.mcast_ttl as u32)
    }

    /// The hop limit of its IPv6 datagrams to groups
    /// (`IPV6_MULTICAST_HOPS`): 0 to 255, 1 by default.
    pub fn set_multicast_hops_v6(&self, hops: u32) -> io::Result<()> {
        self.v6_only_option()?;
        if hops > 255 {
            return Err(errno(libc::EINVAL, "a hop limit is 0 to 255"));
        }
        self.lock_state().ip.mcast_hops = hops as u8;
        Ok(())
    }

    /// See [`set_multicast_hops_v6`](Self::set_multicast_hops_v6).
    pub fn multicast_hops_v6(&self) -> io::Result<u32> {
        self.v6_only_option()?;
        Ok(self.state().ip.mcast_hops as u32)
    }

    /// Whether its IPv4 datagrams to a group reach this host's own members
    /// of it too (`IP_MULTICAST_LOOP`; on by default, as in Linux).
    pub fn set_multicast_loop_v4(&self, on: bool) -> io::Result<()> {
        self.lock_state().ip.mcast_loop_v4 = on;
        Ok(())
    }

    /// See [`set_multicast_loop_v4`](Self::set_multicast_loop_v4).
    pub fn multicast_loop_v4(&self) -> io::Result<bool> {
        Ok(self.state().ip.mcast_loop_v4)
    }

    /// The same for its IPv6 datagrams (`IPV6_MULTICAST_LOOP`).
    pub fn set_multicast_loop_v6(&self, on: bool) -> io::Result<()> {
        self.v6_only_option()?;
        self.lock_state().ip.mcast_loop_v6 = on;
        Ok(())
    }

    /// See [`set_multicast_loop_v6`](Self::set_multicast_loop_v6).
    pub fn multicast_loop_v6(&self) -> io::Result<bool> {
        self.v6_only_option()?;
        Ok(self.state().ip.mcast_loop_v6)
    }

    /// The interface its datagrams to groups leave by (`IP_MULTICAST_IF`,
    /// `IPV6_MULTICAST_IF`): spate's interface index, or `None` for the
    /// route's (the group's route, else the first interface of the
    /// family). `ENODEV` for no such interface.
    pub fn set_multicast_if(&self, iface: Option<u16>) -> io::Result<()> {
        if iface.is_some_and(|i| i as usize >= self.shared().links.len()) {
            return Err(errno(libc::ENODEV, "no such interface"));
        }
        let mut st = self.lock_state();
        st.ip.mcast_if = iface;
        // The cached route may leave by another interface.
        st.last_route = None;
        Ok(())
    }

    /// See [`set_multicast_if`](Self::set_multicast_if).
    pub fn multicast_if(&self) -> io::Result<Option<u16>> {
        Ok(self.state().ip.mcast_if)
    }

    fn change_v4(&self, group: &Ipv4Addr, interface: &Ipv4Addr, change: Change) -> io::Result<()> {
        if !group.is_multicast() {
            return Err(errno(libc::EINVAL, "not a multicast group"));
        }
        let net = self.shared().net();
        let iface = match interface.is_unspecified() {
            true => net.ifaces.iter().find(|i| !i.ipv4.is_empty()),
            false => net.ifaces.iter().find(|i| i.has_ipv4(*interface)),
        };
        let Some(iface) = iface else { return Err(errno(libc::ENODEV, "no interface with that IPv4 address")) };
        self.stack.change_membership(self.core.id, iface.index, IpAddr::V4(*group), change)
    }

    fn change_v6(&self, group: &Ipv6Addr, interface: u32, change: Change) -> io::Result<()> {
        self.v6_only_option()?;
        if !group.is_multicast() {
            return Err(errno(libc::EINVAL, "not a multicast group"));
        }
        let net = self.shared().net();
        let iface = match interface {
            0 => net.ifaces.iter().find(|i| !i.ipv6.is_empty()),
            n => net.ifaces.get(n as usize - 1),
        };
        let Some(iface) = iface else { return Err(errno(libc::ENODEV, "no such interface")) };
        self.stack.change_membership(self.core.id, iface.index, IpAddr::V6(*group), change)
    }

    fn v6_only_option(&self) -> io::Result<()> {
        match self.family {
            Family::V6 => Ok(()),
            Family::V4 => Err(errno(libc::ENOPROTOOPT, "an IPv6 option on an IPv4 socket")),
        }
    }
}
