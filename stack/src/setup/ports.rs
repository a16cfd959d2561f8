//! Port set-up decisions: how many RX and TX queues a port gets for the
//! stack's lcores, whether it hashes flows itself or spate steers them in
//! software, and the stale vhost-user socket a restarted server must
//! remove first.

use crate::config::{RssMode, devarg};
use crate::shared::PortSteering;

/// How a port is set up for the stack's lcores.
#[derive(Debug, Clone, Copy)]
pub(super) struct PortPlan {
    pub mode: RssMode,
    pub rx_queues: u16,
    pub tx_queues: u16,
    pub rss: spate_dpdk::Rss,
    pub steered: PortSteering,
}

impl PortPlan {
    /// One line for the log.
    pub fn describe(&self, workers: usize) -> String {
        match self.mode {
            RssMode::Sw => format!(
                "software RSS: {} RX queue(s), their lcores hand flows to {workers} lcores; {} TX queue(s)",
                self.rx_queues, self.tx_queues
            ),
            RssMode::Hw => format!("RSS by the port over {} RX queues; {} TX queues", self.rx_queues, self.tx_queues),
            RssMode::Device => format!(
                "steered by the device over {} RX queues (fragments meet in software); {} TX queues",
                self.rx_queues, self.tx_queues
            ),
            _ => format!("{} RX / {} TX queue(s), no RSS", self.rx_queues, self.tx_queues),
        }
    }
}

/// Drivers that keep each flow on one of their RX queues without an RSS
/// hash (`net_af_packet`: the kernel's fanout hashes flows over its
/// sockets).
const SPREADS_FLOWS: &[&str] = &["net_af_packet"];

/// Decides `mode` (auto: hw where the port spreads flows over enough RX
/// queues, sw otherwise) for a port and `workers` lcores.
pub(super) fn plan_port(
    mode: RssMode,
    workers: usize,
    info: &spate_dpdk::DeviceInfo,
    device: &str,
) -> crate::error::Result<PortPlan> {
    use crate::error::Error;
    let n = workers as u16;
    let tx_queues = n.min(info.max_tx_queues).max(1);
    let spreads = info.supports_rss() || SPREADS_FLOWS.contains(&info.driver.as_str());
    let enough = info.max_rx_queues >= n;
    let mode = match mode {
        _ if workers == 1 => RssMode::Off,
        RssMode::Auto if spreads && enough => RssMode::Hw,
        RssMode::Auto => RssMode::Sw,
        m => m,
    };
    let rss_of = |on: bool| if on { spate_dpdk::Rss::Required } else { spate_dpdk::Rss::Off };
    match mode {
        // Every RX queue the device has (up to one per lcore) is polled:
        // a device that spreads frames over its queues itself would lose
        // those of a queue nobody polls.
        RssMode::Sw => Ok(PortPlan {
            mode,
            rx_queues: info.max_rx_queues.min(n).max(1),
            tx_queues,
            rss: spate_dpdk::Rss::Off,
            steered: PortSteering::Flows,
        }),
        RssMode::Hw if !spreads => Err(Error::Config(format!(
            "port {device} ({}) hashes no flows (no RSS) and does not spread them itself: use rss = \"sw\"",
            info.driver
        ))),
        RssMode::Hw | RssMode::Off | RssMode::Device if !enough => Err(Error::Config(format!(
            "port {device} ({}) has {} RX queues, fewer than the {workers} lcores: use rss = \"sw\"",
            info.driver, info.max_rx_queues
        ))),
        RssMode::Hw => Ok(PortPlan {
            mode,
            rx_queues: n,
            tx_queues,
            rss: rss_of(info.supports_rss()),
            steered: PortSteering::None,
        }),
        RssMode::Device => {
            Ok(PortPlan { mode, rx_queues: n, tx_queues, rss: spate_dpdk::Rss::Off, steered: PortSteering::Fragments })
        }
        _ => Ok(PortPlan {
            mode: RssMode::Off,
            rx_queues: n,
            tx_queues,
            rss: if workers == 1 { spate_dpdk::Rss::Auto } else { spate_dpdk::Rss::Off },
            steered: PortSteering::None,
        }),
    }
}

/// A `net_virtio_user` port in server mode binds its `path`; a socket file
/// left there by an earlier run that nobody listens on any more would make
/// the bind fail ("Address already in use"): remove it.
pub(super) fn remove_stale_vhost_socket(device: &str) {
    if !device.starts_with("net_virtio_user") {
        return;
    }
    let server = devarg(device, "server") == Some("1");
    let Some(path) = devarg(device, "path") else { return };
    use std::os::unix::fs::FileTypeExt;
    let is_socket = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket());
    if server
        && is_socket
        && let Err(e) = std::os::unix::net::UnixStream::connect(path)
        && e.kind() == std::io::ErrorKind::ConnectionRefused
    {
        log::info!("spate: removing the stale vhost-user socket {path} (nobody listens on it)");
        let _ = std::fs::remove_file(path);
    }
}

/// Whether the kernel hands a port's frames over as they were sent (a
/// packet socket or an XDP socket on an interface: `net_af_packet`,
/// `net_af_xdp`, `net_pcap` with `iface=`, `rx_iface=` or `rx_iface_in=`): a sender on the same host (a
/// veth's peer with TX checksum offload on) may have left a UDP checksum
/// to an offload that never runs.
pub(super) fn hands_over_as_sent(driver: &str, device: &str) -> bool {
    match driver {
        "net_af_packet" | "net_af_xdp" => true,
        "net_pcap" => ["iface", "rx_iface", "rx_iface_in"].iter().any(|k| devarg(device, k).is_some()),
        _ => false,
    }
}

/// The kernel's header in a `net_af_packet` frame before the IP header:
/// `TPACKET_ALIGN(TPACKET2_HDRLEN + 16)` (`tpacket_rcv`'s `netoff`).
const AF_PACKET_NETOFF: usize = 80;

/// The ring's frame size `net_af_packet` takes when `framesz=` does not
/// say (DPDK 22.11's `DFLT_FRAME_SIZE`).
const AF_PACKET_FRAMESZ: usize = 2048;

/// The longest IPv4 packet a `net_af_packet` port delivers whole, for the
/// log. DPDK 22.11 puts the PMD's packet sockets in a fanout group with
/// `PACKET_FANOUT_FLAG_DEFRAG` (no devarg turns it off), so the kernel
/// reassembles IPv4 fragments before the ring, and a datagram longer than
/// the ring's frame less the kernel's header is truncated there (counted
/// in `Rx.Ipv4Truncated`). IPv6 fragments arrive as they are (spate
/// reassembles them). None for other drivers.
pub(super) fn af_packet_ipv4_limit(driver: &str, device: &str) -> Option<usize> {
    if driver != "net_af_packet" {
        return None;
    }
    let framesz = devarg(device, "framesz").and_then(|v| v.parse().ok()).unwrap_or(AF_PACKET_FRAMESZ);
    Some(framesz.saturating_sub(AF_PACKET_NETOFF))
}

#[cfg(test)]
mod tests {
    use super::af_packet_ipv4_limit;

    #[test]
    fn af_packet_limit_follows_the_frame_size() {
        // 2,048-byte frames: 1,968-byte packets, 1,940 bytes of UDP payload
        // (measured over a veth: 1,940 echoed, 1,941 truncated).
        assert_eq!(af_packet_ipv4_limit("net_af_packet", "net_af_packet0,iface=v0"), Some(1968));
        assert_eq!(af_packet_ipv4_limit("net_af_packet", "net_af_packet0,iface=v0,framesz=4096"), Some(4016));
        assert_eq!(af_packet_ipv4_limit("net_pcap", "net_pcap0,iface=v0"), None);
    }

    #[test]
    fn packet_and_xdp_sockets_hand_frames_over_as_sent() {
        use super::hands_over_as_sent;
        assert!(hands_over_as_sent("net_af_packet", "net_af_packet0,iface=v0"));
        assert!(hands_over_as_sent("net_af_xdp", "net_af_xdp0,iface=v0"));
        assert!(hands_over_as_sent("net_pcap", "net_pcap0,iface=v0,phy_mac=1"));
        assert!(hands_over_as_sent("net_pcap", "net_pcap0,rx_iface_in=v0,tx_iface=v0"));
        assert!(!hands_over_as_sent("net_pcap", "net_pcap0,rx_pcap=in.pcap,tx_pcap=out.pcap"));
        assert!(!hands_over_as_sent("net_tap", "net_tap0,iface=spate0"));
    }
}
