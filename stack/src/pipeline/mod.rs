//! The datapath of a polling lcore: [`rx`] classifies and validates each
//! received frame and hands it to its protocol, [`tx`] writes headers,
//! resolves neighbours and sends bursts.
//!
//! The order of the receive path is the one in the design brief: burst RX
//! -> classify (Ethernet, ARP, IPv4, IPv6, ICMP, UDP; malformed, truncated,
//! wrong-checksum and not-for-us frames are dropped and counted) -> socket
//! lookup -> the socket's receive queue, or ICMP port unreachable. The GRO
//! stage runs only while a tunnel or a GRO socket exists (one load per
//! burst decides): its lookup finds the socket once and hands it on, to
//! the tunnel's decapsulation ([`vxlan`]), to [`gro`] coalescing, or to
//! the queue as usual.

pub mod gro;
pub mod rx;
pub mod steer;
pub mod tx;
pub mod vxlan;
