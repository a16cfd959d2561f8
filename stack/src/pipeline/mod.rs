//! The datapath of a polling lcore: [`rx`] classifies and validates each
//! received frame and hands it to its protocol, [`tx`] writes headers,
//! resolves neighbours and sends bursts.
//!
//! The order of the receive path is the one in the design brief: burst RX
//! -> classify (Ethernet, ARP, IPv4, IPv6, ICMP, UDP; malformed, truncated,
//! wrong-checksum and not-for-us frames are dropped and counted) -> socket
//! lookup -> the socket's receive queue, or ICMP port unreachable. The GRO
//! stage and fragment reassembly slot in between classification and lookup.

pub mod rx;
pub mod tx;
