//! The stack flags every spate app takes, and the embedded default: a TAP
//! device with a fixed MAC and addresses from the benchmarking ranges.

use std::net::IpAddr;
use std::path::PathBuf;

use clap::Args;
use spate::config::{Cidr, PortSpec, StackConfig, VXLAN_PORT, VxlanSpec};

/// The MAC of the default TAP device ("SPATE" in ASCII after 02).
pub const DEFAULT_MAC: &str = "02:53:50:41:54:45";
/// The default TAP interface name.
pub const DEFAULT_TAP: &str = "spate0";
/// spate's default IPv4 address.
pub const DEFAULT_IP: &str = "198.18.0.2/24";
/// spate's default IPv6 address.
pub const DEFAULT_IP6: &str = "fd00::2/64";
/// The address the README suggests for the Linux side.
pub const PEER_IP: &str = "198.18.0.1/24";
/// The IPv6 address the README suggests for the Linux side.
pub const PEER_IP6: &str = "fd00::1/64";

/// Devices, addresses, lcores and EAL arguments.
#[derive(Debug, Clone, Args)]
pub struct StackArgs {
    /// A DPDK virtual device to use as a port (repeatable), e.g.
    /// `net_pcap0,iface=veth0,phy_mac=1`. Without --vdev or --pci, spate
    /// creates a TAP device `spate0`.
    #[arg(long = "vdev", value_name = "SPEC")]
    pub vdevs: Vec<String>,
    /// A PCI device to use as a port (repeatable).
    #[arg(long = "pci", value_name = "ADDR")]
    pub pcis: Vec<String>,
    /// An IPv4 address for the first port (repeatable).
    #[arg(long = "ip", value_name = "ADDR/PREFIX")]
    pub ips: Vec<Cidr>,
    /// An IPv6 address for the first port (repeatable).
    #[arg(long = "ip6", value_name = "ADDR/PREFIX")]
    pub ip6s: Vec<Cidr>,
    /// A default gateway (at most one per family).
    #[arg(long = "gateway", value_name = "ADDR")]
    pub gateways: Vec<IpAddr>,
    /// The lcores spate polls on, in EAL -l syntax (`1`, `0-1`), or in EAL
    /// --lcores syntax to give an lcore a set of CPUs (`1@(0-1)`).
    #[arg(long, value_name = "LIST")]
    pub lcores: Option<String>,
    /// How the lcores share the ports' traffic: `auto` (hardware RSS where
    /// the port has it, else software), `hw`, `sw`, `off` or `device` (each
    /// lcore its own queue, the device keeping flows on one).
    #[arg(long, value_name = "MODE")]
    pub rss: Option<spate::config::RssMode>,
    /// A TOML stack configuration; flags given on the command line override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Sleep this many microseconds between polls when idle (0: busy-poll).
    #[arg(long, value_name = "US")]
    pub idle_sleep: Option<u32>,
    /// How the lcores poll: `busy`, or `adaptive` (sleep when idle until a
    /// frame, a hand-off or a timer wakes them).
    #[arg(long, value_name = "MODE")]
    pub poll: Option<spate::config::PollMode>,
    /// With `--poll adaptive`: how long an idle lcore polls before it
    /// sleeps at most, in microseconds (50; 0 sleeps at once); less while
    /// its idle times run longer.
    #[arg(long, value_name = "US")]
    pub poll_idle_us: Option<u32>,
    /// Mbufs in the packet pool.
    #[arg(long, value_name = "N")]
    pub mbufs: Option<u32>,
    /// A VXLAN tunnel: `VNI@ADDR` to the remote endpoint on port 4789, or
    /// `VNI@ADDR:PORT` / `VNI@[ADDR6]:PORT` for another port.
    #[arg(long, value_name = "VNI@ADDR", value_parser = parse_vxlan)]
    pub vxlan: Option<(u32, std::net::SocketAddr)>,
    /// An address of the tunnel's inner interface (repeatable).
    #[arg(long = "inner-ip", value_name = "ADDR/PREFIX", requires = "vxlan")]
    pub inner_ips: Vec<Cidr>,
    /// A static neighbour of the first port, `ADDR=MAC` (never resolved:
    /// for peers that do not answer ARP or ND, such as `testpmd txonly`).
    #[arg(long = "neighbor", value_name = "ADDR=MAC", value_parser = parse_neighbor)]
    pub neighbors: Vec<spate::StaticNeighbor>,
    /// The stack's name: its control endpoint (for spate-stat) is
    /// `/run/spate/NAME.sock` instead of `/run/spate/PID-1.sock`.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Join multicast group GROUP on the tool's receiving sockets, from
    /// any source or only from SOURCE (repeatable: several groups, or
    /// several sources of one).
    #[arg(long = "join", value_name = "GROUP[,SOURCE]", value_parser = parse_join)]
    pub joins: Vec<(std::net::IpAddr, Option<std::net::IpAddr>)>,
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics.
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Every socket keeps a histogram of its datagrams' waits from RX
    /// burst to read (spate-stat and the metrics show it).
    #[arg(long)]
    pub read_delay_histograms: bool,
    /// EAL arguments, passed through unchanged (after `--`).
    #[arg(last = true, value_name = "EAL ARGS")]
    pub eal: Vec<String>,
}

impl StackArgs {
    /// Whether the embedded default (a TAP device) is in use.
    pub fn uses_default_device(&self) -> bool {
        self.vdevs.is_empty() && self.pcis.is_empty() && self.config.is_none()
    }

    /// The configuration these flags describe.
    pub fn to_config(&self) -> spate::Result<StackConfig> {
        let mut cfg = match &self.config {
            Some(path) => StackConfig::from_file(path)?,
            None => StackConfig::default(),
        };
        let devices: Vec<String> = self.vdevs.iter().chain(&self.pcis).cloned().collect();
        if !devices.is_empty() {
            cfg.ports = devices.iter().map(|d| PortSpec::new(d)).collect();
        } else if cfg.ports.is_empty() {
            cfg.ports = vec![PortSpec::new(&format!("net_tap0,iface={DEFAULT_TAP},mac={DEFAULT_MAC}"))];
        }
        let defaults =
            self.ips.is_empty() && self.ip6s.is_empty() && cfg.ports[0].ipv4.is_empty() && cfg.ports[0].ipv6.is_empty();
        if defaults {
            cfg.ports[0].ipv4.push(DEFAULT_IP.parse()?);
            cfg.ports[0].ipv6.push(DEFAULT_IP6.parse()?);
        }
        for c in &self.ips {
            if !c.addr.is_ipv4() {
                return Err(spate::Error::Config(format!("--ip {c} is not an IPv4 address")));
            }
            cfg.ports[0].ipv4.push(*c);
        }
        for c in &self.ip6s {
            if c.addr.is_ipv4() {
                return Err(spate::Error::Config(format!("--ip6 {c} is not an IPv6 address")));
            }
            cfg.ports[0].ipv6.push(*c);
        }
        cfg.ports[0].neighbors.extend(self.neighbors.iter().copied());
        if !self.gateways.is_empty() {
            cfg.gateways = self.gateways.clone();
        }
        if let Some(l) = &self.lcores {
            cfg.lcores = l.clone();
        }
        if let Some(m) = self.rss {
            cfg.rss = m;
        }
        if let Some(s) = self.idle_sleep {
            cfg.idle_sleep_us = s;
        }
        if let Some(p) = self.poll {
            cfg.poll = p;
        }
        if let Some(us) = self.poll_idle_us {
            cfg.poll_idle_us = us;
        }
        if let Some(n) = self.mbufs {
            cfg.mempool_size = n;
        }
        if let Some((vni, remote)) = self.vxlan {
            if self.inner_ips.is_empty() {
                return Err(spate::Error::Config("--vxlan needs an --inner-ip".into()));
            }
            let mut t = VxlanSpec::new(vni, remote.ip());
            t.remote_port = remote.port();
            for c in &self.inner_ips {
                if c.addr.is_ipv4() { t.ipv4.push(*c) } else { t.ipv6.push(*c) }
            }
            cfg.vxlan.push(t);
        }
        if let Some(n) = &self.name {
            cfg.name = Some(n.clone());
        }
        if self.metrics.is_some() {
            cfg.metrics = self.metrics;
        }
        if self.read_delay_histograms {
            cfg.read_delay_histograms = true;
        }
        cfg.eal_args.extend(self.eal.iter().cloned());
        Ok(cfg)
    }
}

/// Sets up logging: `RUST_LOG`, `info` by default.
pub fn init_logging() {
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).try_init();
}

/// `ADDR=MAC`.
fn parse_neighbor(s: &str) -> Result<spate::StaticNeighbor, String> {
    let (ip, mac) = s.split_once('=').ok_or_else(|| format!("{s:?} is not ADDR=MAC"))?;
    let ip = ip.parse().map_err(|_| format!("{ip:?} is not an address"))?;
    let mac = mac.parse().map_err(|_| format!("{mac:?} is not a MAC"))?;
    Ok(spate::StaticNeighbor { ip, mac })
}

/// `VNI@ADDR`, `VNI@ADDR:PORT` or `VNI@[ADDR6]:PORT`.
fn parse_vxlan(s: &str) -> Result<(u32, std::net::SocketAddr), String> {
    let (vni, at) = s.split_once('@').ok_or_else(|| format!("{s:?} is not VNI@ADDR"))?;
    let vni: u32 = vni.parse().map_err(|_| format!("{vni:?} is not a VNI"))?;
    if vni >= 1 << 24 {
        return Err(format!("VNI {vni} does not fit 24 bits"));
    }
    let remote = match at.parse::<std::net::SocketAddr>() {
        Ok(a) => a,
        Err(_) => std::net::SocketAddr::new(at.parse().map_err(|_| format!("{at:?} is not an address"))?, VXLAN_PORT),
    };
    Ok((vni, remote))
}

#[cfg(test)]
mod tests {
    use super::{parse_neighbor, parse_vxlan};

    #[test]
    fn neighbor_specs() {
        let n = parse_neighbor("198.18.0.1=02:00:00:00:00:01").unwrap();
        assert_eq!((n.ip.to_string(), n.mac.to_string()), ("198.18.0.1".into(), "02:00:00:00:00:01".into()));
        assert!(parse_neighbor("fd00::1=02:00:00:00:00:01").is_ok());
        assert!(parse_neighbor("198.18.0.1").is_err());
        assert!(parse_neighbor("x=02:00:00:00:00:01").is_err());
        assert!(parse_neighbor("198.18.0.1=zz").is_err());
    }

    #[test]
    fn vxlan_specs() {
        assert_eq!(parse_vxlan("42@198.18.0.1"), Ok((42, "198.18.0.1:4789".parse().unwrap())));
        assert_eq!(parse_vxlan("7@198.18.0.1:4790"), Ok((7, "198.18.0.1:4790".parse().unwrap())));
        assert_eq!(parse_vxlan("7@[fd00::1]:4790"), Ok((7, "[fd00::1]:4790".parse().unwrap())));
        assert_eq!(parse_vxlan("7@fd00::1"), Ok((7, "[fd00::1]:4789".parse().unwrap())));
        assert!(parse_vxlan("16777216@198.18.0.1").is_err());
        assert!(parse_vxlan("42").is_err());
        assert!(parse_vxlan("x@198.18.0.1").is_err());
    }
}

/// Which running stack a tool reads (spate-stat, spate-dump): by process,
/// by name, or the only one.
#[derive(Debug, Clone, clap::Args)]
pub struct TargetArgs {
    /// The stack of this process.
    #[arg(long, conflicts_with = "name")]
    pub pid: Option<u32>,
    /// The stack of this name (`name` in its configuration).
    #[arg(long)]
    pub name: Option<String>,
    /// Where the stacks' control sockets are.
    #[arg(long, value_name = "DIR", default_value = "/run/spate")]
    pub dir: std::path::PathBuf,
}

impl TargetArgs {
    /// The chosen stack's control endpoint.
    pub fn endpoint(&self) -> std::io::Result<std::path::PathBuf> {
        spate::control::find(&self.dir, self.pid, self.name.as_deref())
    }
}

/// `GROUP[,SOURCE]`: a multicast group and, for a source-specific join,
/// the source (both of one family).
fn parse_join(s: &str) -> Result<(std::net::IpAddr, Option<std::net::IpAddr>), String> {
    let (g, src) = match s.split_once(',') {
        Some((g, src)) => (g, Some(src)),
        None => (s, None),
    };
    let group: std::net::IpAddr = g.trim().parse().map_err(|e| format!("{g}: {e}"))?;
    if !group.is_multicast() {
        return Err(format!("{group} is not a multicast group"));
    }
    let source = match src {
        Some(x) => Some(x.trim().parse::<std::net::IpAddr>().map_err(|e| format!("{x}: {e}"))?),
        None => None,
    };
    if source.is_some_and(|x| x.is_ipv4() != group.is_ipv4()) {
        return Err(format!("{s}: the source and the group are of one family"));
    }
    Ok((group, source))
}

impl StackArgs {
    /// Joins `--join`'s groups on `sock` (on the stack's first interface
    /// of each group's family).
    pub fn join_groups(&self, sock: &spate::UdpSocket) -> std::io::Result<()> {
        use std::net::{IpAddr, Ipv4Addr};
        for (group, source) in &self.joins {
            let any = Ipv4Addr::UNSPECIFIED;
            match (group, source) {
                (IpAddr::V4(g), None) => sock.join_multicast_v4(g, &any)?,
                (IpAddr::V4(g), Some(IpAddr::V4(s))) => sock.join_source_multicast_v4(g, s, &any)?,
                (IpAddr::V6(g), None) => sock.join_multicast_v6(g, 0)?,
                (IpAddr::V6(g), Some(IpAddr::V6(s))) => sock.join_source_multicast_v6(g, s, 0)?,
                _ => unreachable!("checked when parsed"),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod join_tests {
    use super::parse_join;

    #[test]
    fn joins_parse_with_and_without_a_source() {
        assert_eq!(parse_join("239.1.2.3").unwrap(), ("239.1.2.3".parse().unwrap(), None));
        let (g, s) = parse_join("ff0e::1, fd00::1").unwrap();
        assert_eq!((g, s), ("ff0e::1".parse().unwrap(), Some("fd00::1".parse().unwrap())));
        assert!(parse_join("198.18.0.1").unwrap_err().contains("not a multicast group"));
        assert!(parse_join("239.1.2.3,fd00::1").unwrap_err().contains("one family"));
    }
}
