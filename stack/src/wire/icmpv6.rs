//! ICMPv6 (RFC 4443) and the neighbour-discovery messages (RFC 4861).

use std::net::Ipv6Addr;

use super::{MacAddr, Result, WireError, checksum, get_u16, get_u32, ip_proto, set_u16, set_u32};

mod field {
    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CHECKSUM: usize = 2;
    pub const IDENT: usize = 4;
    pub const SEQ_NO: usize = 6;
    pub const MTU: usize = 4;
    pub const POINTER: usize = 4;
    pub const NA_FLAGS: usize = 4;
    pub const TARGET: usize = 8;
    pub const RA_HOP_LIMIT: usize = 4;
    pub const RA_FLAGS: usize = 5;
    pub const RA_LIFETIME: usize = 6;
    pub const RA_REACHABLE: usize = 8;
    pub const RA_RETRANS: usize = 12;
}

/// Header length (type, code, checksum and 4 bytes).
pub const HEADER_LEN: usize = 8;
/// Length of an NS or NA without options.
pub const ND_LEN: usize = 24;
/// Length of an RA without options.
pub const RA_LEN: usize = 16;
/// Length of a link-layer address option for Ethernet.
pub const LL_OPTION_LEN: usize = 8;
/// Most prefixes kept from one router advertisement.
pub const MAX_PREFIXES: usize = 4;

/// Message types spate handles.
pub mod msg_type {
    /// Destination unreachable.
    pub const DST_UNREACHABLE: u8 = 1;
    /// Packet too big.
    pub const PACKET_TOO_BIG: u8 = 2;
    /// Time exceeded.
    pub const TIME_EXCEEDED: u8 = 3;
    /// Parameter problem.
    pub const PARAM_PROBLEM: u8 = 4;
    /// Echo request.
    pub const ECHO_REQUEST: u8 = 128;
    /// Echo reply.
    pub const ECHO_REPLY: u8 = 129;
    /// Router solicitation.
    pub const ROUTER_SOLICIT: u8 = 133;
    /// Router advertisement.
    pub const ROUTER_ADVERT: u8 = 134;
    /// Neighbour solicitation.
    pub const NEIGHBOR_SOLICIT: u8 = 135;
    /// Neighbour advertisement.
    pub const NEIGHBOR_ADVERT: u8 = 136;
}

/// Destination-unreachable codes.
pub mod unreachable {
    /// No route.
    pub const NO_ROUTE: u8 = 0;
    /// Address unreachable.
    pub const ADDRESS: u8 = 3;
    /// Port unreachable.
    pub const PORT: u8 = 4;
}

/// Parameter-problem code 1: unrecognised next header.
pub const PARAM_UNRECOGNIZED_NEXT_HEADER: u8 = 1;

mod option {
    pub const SOURCE_LL: u8 = 1;
    pub const TARGET_LL: u8 = 2;
    pub const PREFIX_INFO: u8 = 3;
    pub const MTU: u8 = 5;
}

/// Neighbour advertisement flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NaFlags {
    /// Sender is a router.
    pub router: bool,
    /// Answer to a solicitation.
    pub solicited: bool,
    /// Override an existing cache entry.
    pub override_: bool,
}

/// A prefix-information option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixInfo {
    /// Prefix length.
    pub prefix_len: u8,
    /// On-link flag.
    pub on_link: bool,
    /// Autonomous address-configuration flag.
    pub autonomous: bool,
    /// Valid lifetime in seconds.
    pub valid_lifetime: u32,
    /// Preferred lifetime in seconds.
    pub preferred_lifetime: u32,
    /// The prefix.
    pub prefix: Ipv6Addr,
}

/// What a router advertisement says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouterAdvert {
    /// Current hop limit to use (0: unspecified).
    pub hop_limit: u8,
    /// Managed / other-config flags byte.
    pub flags: u8,
    /// Router lifetime in seconds (0: not a default router).
    pub router_lifetime: u16,
    /// Reachable time in ms (0: unspecified).
    pub reachable_time: u32,
    /// Retransmission timer in ms (0: unspecified).
    pub retrans_time: u32,
    /// The router's link-layer address.
    pub source_ll: Option<MacAddr>,
    /// Link MTU.
    pub mtu: Option<u32>,
    /// The first prefixes announced.
    pub prefixes: [Option<PrefixInfo>; MAX_PREFIXES],
}

/// A view of an ICMPv6 message.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps without checks.
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wraps after [`check_len`](Self::check_len).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks that the 8-byte header fits.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN { Err(WireError::Truncated) } else { Ok(()) }
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Message type.
    pub fn msg_type(&self) -> u8 {
        self.b()[field::TYPE]
    }

    /// Code.
    pub fn code(&self) -> u8 {
        self.b()[field::CODE]
    }

    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        get_u16(self.b(), field::CHECKSUM)
    }

    /// Verifies the checksum with the IPv6 pseudo-header.
    pub fn verify_checksum(&self, src: &Ipv6Addr, dst: &Ipv6Addr) -> bool {
        let b = self.b();
        let acc = checksum::pseudo_header_v6(src, dst, ip_proto::ICMPV6, b.len() as u32) + checksum::sum(b);
        checksum::fold(acc) == 0xffff
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the type.
    pub fn set_msg_type(&mut self, t: u8) {
        self.buffer.as_mut()[field::TYPE] = t;
    }

    /// Computes and writes the checksum over the whole buffer.
    pub fn fill_checksum(&mut self, src: &Ipv6Addr, dst: &Ipv6Addr) {
        set_u16(self.buffer.as_mut(), field::CHECKSUM, 0);
        let b = self.buffer.as_ref();
        let acc = checksum::pseudo_header_v6(src, dst, ip_proto::ICMPV6, b.len() as u32) + checksum::sum(b);
        let c = !checksum::fold(acc);
        set_u16(self.buffer.as_mut(), field::CHECKSUM, c);
    }
}

/// A parsed ICMPv6 message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repr<'a> {
    /// Echo request.
    EchoRequest {
        /// Identifier.
        ident: u16,
        /// Sequence number.
        seq_no: u16,
        /// Data.
        data: &'a [u8],
    },
    /// Echo reply.
    EchoReply {
        /// Identifier.
        ident: u16,
        /// Sequence number.
        seq_no: u16,
        /// Data.
        data: &'a [u8],
    },
    /// Destination unreachable.
    DstUnreachable {
        /// Code (see [`unreachable`](mod@unreachable)).
        code: u8,
        /// As much of the offending packet as fits.
        data: &'a [u8],
    },
    /// Packet too big.
    PacketTooBig {
        /// The MTU of the next hop.
        mtu: u32,
        /// As much of the offending packet as fits.
        data: &'a [u8],
    },
    /// Time exceeded.
    TimeExceeded {
        /// Code.
        code: u8,
        /// The offending packet.
        data: &'a [u8],
    },
    /// Parameter problem.
    ParamProblem {
        /// Code.
        code: u8,
        /// Offset of the problem in the offending packet.
        pointer: u32,
        /// The offending packet.
        data: &'a [u8],
    },
    /// Neighbour solicitation.
    NeighborSolicit {
        /// The address asked about.
        target: Ipv6Addr,
        /// The sender's link-layer address.
        source_ll: Option<MacAddr>,
    },
    /// Neighbour advertisement.
    NeighborAdvert {
        /// Flags.
        flags: NaFlags,
        /// The address advertised.
        target: Ipv6Addr,
        /// Its link-layer address.
        target_ll: Option<MacAddr>,
    },
    /// Router solicitation.
    RouterSolicit {
        /// The sender's link-layer address.
        source_ll: Option<MacAddr>,
    },
    /// Router advertisement.
    RouterAdvert(RouterAdvert),
    /// Another type.
    Other {
        /// Type.
        msg_type: u8,
        /// Code.
        code: u8,
    },
}

/// Walks NDP options: calls `f(type, body)` for each; a zero-length or
/// overlong option is `Malformed` (RFC 4861 4.6).
fn for_each_option(mut opts: &[u8], mut f: impl FnMut(u8, &[u8])) -> Result<()> {
    while !opts.is_empty() {
        if opts.len() < 2 {
            return Err(WireError::Truncated);
        }
        let len = opts[1] as usize * 8;
        if len == 0 {
            return Err(WireError::Malformed);
        }
        let opt = opts.get(..len).ok_or(WireError::Truncated)?;
        f(opt[0], opt);
        opts = &opts[len..];
    }
    Ok(())
}

fn ll_addr(opt: &[u8]) -> Option<MacAddr> {
    (opt.len() >= 8).then(|| MacAddr(opt[2..8].try_into().expect("6 bytes")))
}

fn target(b: &[u8]) -> Ipv6Addr {
    Ipv6Addr::from(<[u8; 16]>::try_from(&b[field::TARGET..field::TARGET + 16]).expect("16 bytes"))
}

impl<'a> Repr<'a> {
    /// Parses a message from `src` to `dst`, verifying the checksum unless
    /// `checksum_verified`.
    pub fn parse(p: &Packet<&'a [u8]>, src: &Ipv6Addr, dst: &Ipv6Addr, checksum_verified: bool) -> Result<Repr<'a>> {
        p.check_len()?;
        if !checksum_verified && !p.verify_checksum(src, dst) {
            return Err(WireError::Checksum);
        }
        let b: &'a [u8] = p.buffer;
        let data = &b[HEADER_LEN..];
        Ok(match (p.msg_type(), p.code()) {
            (msg_type::ECHO_REQUEST, 0) => {
                Repr::EchoRequest { ident: get_u16(b, field::IDENT), seq_no: get_u16(b, field::SEQ_NO), data }
            }
            (msg_type::ECHO_REPLY, 0) => {
                Repr::EchoReply { ident: get_u16(b, field::IDENT), seq_no: get_u16(b, field::SEQ_NO), data }
            }
            (msg_type::DST_UNREACHABLE, code) => Repr::DstUnreachable { code, data },
            (msg_type::PACKET_TOO_BIG, 0) => Repr::PacketTooBig { mtu: get_u32(b, field::MTU), data },
            (msg_type::TIME_EXCEEDED, code) => Repr::TimeExceeded { code, data },
            (msg_type::PARAM_PROBLEM, code) => Repr::ParamProblem { code, pointer: get_u32(b, field::POINTER), data },
            (msg_type::NEIGHBOR_SOLICIT, 0) => {
                if b.len() < ND_LEN {
                    return Err(WireError::Truncated);
                }
                let mut source_ll = None;
                for_each_option(&b[ND_LEN..], |t, o| {
                    if t == option::SOURCE_LL {
                        source_ll = ll_addr(o);
                    }
                })?;
                Repr::NeighborSolicit { target: target(b), source_ll }
            }
            (msg_type::NEIGHBOR_ADVERT, 0) => {
                if b.len() < ND_LEN {
                    return Err(WireError::Truncated);
                }
                let f = b[field::NA_FLAGS];
                let flags = NaFlags { router: f & 0x80 != 0, solicited: f & 0x40 != 0, override_: f & 0x20 != 0 };
                let mut target_ll = None;
                for_each_option(&b[ND_LEN..], |t, o| {
                    if t == option::TARGET_LL {
                        target_ll = ll_addr(o);
                    }
                })?;
                Repr::NeighborAdvert { flags, target: target(b), target_ll }
            }
            (msg_type::ROUTER_SOLICIT, 0) => {
                let mut source_ll = None;
                for_each_option(&b[HEADER_LEN..], |t, o| {
                    if t == option::SOURCE_LL {
                        source_ll = ll_addr(o);
                    }
                })?;
                Repr::RouterSolicit { source_ll }
            }
            (msg_type::ROUTER_ADVERT, 0) => {
                if b.len() < RA_LEN {
                    return Err(WireError::Truncated);
                }
                let mut ra = RouterAdvert {
                    hop_limit: b[field::RA_HOP_LIMIT],
                    flags: b[field::RA_FLAGS],
                    router_lifetime: get_u16(b, field::RA_LIFETIME),
                    reachable_time: get_u32(b, field::RA_REACHABLE),
                    retrans_time: get_u32(b, field::RA_RETRANS),
                    source_ll: None,
                    mtu: None,
                    prefixes: [None; MAX_PREFIXES],
                };
                let mut n = 0;
                let mut bad = false;
                for_each_option(&b[RA_LEN..], |t, o| match t {
                    option::SOURCE_LL => ra.source_ll = ll_addr(o),
                    option::MTU if o.len() >= 8 => ra.mtu = Some(get_u32(o, 4)),
                    option::PREFIX_INFO if o.len() == 32 && n >= MAX_PREFIXES => {}
                    option::PREFIX_INFO if o.len() == 32 => {
                        ra.prefixes[n] = Some(PrefixInfo {
                            prefix_len: o[2],
                            on_link: o[3] & 0x80 != 0,
                            autonomous: o[3] & 0x40 != 0,
                            valid_lifetime: get_u32(o, 4),
                            preferred_lifetime: get_u32(o, 8),
                            prefix: Ipv6Addr::from(<[u8; 16]>::try_from(&o[16..32]).expect("16 bytes")),
                        });
                        n += 1;
                    }
                    option::PREFIX_INFO => bad = true,
                    _ => {}
                })?;
                if bad {
                    return Err(WireError::Malformed);
                }
                Repr::RouterAdvert(ra)
            }
            (msg_type, code) => Repr::Other { msg_type, code },
        })
    }

    /// Bytes `emit` writes.
    pub fn buffer_len(&self) -> usize {
        match self {
            Repr::EchoRequest { data, .. }
            | Repr::EchoReply { data, .. }
            | Repr::DstUnreachable { data, .. }
            | Repr::PacketTooBig { data, .. }
            | Repr::TimeExceeded { data, .. }
            | Repr::ParamProblem { data, .. } => HEADER_LEN + data.len(),
            Repr::NeighborSolicit { source_ll, .. } => ND_LEN + if source_ll.is_some() { LL_OPTION_LEN } else { 0 },
            Repr::NeighborAdvert { target_ll, .. } => ND_LEN + if target_ll.is_some() { LL_OPTION_LEN } else { 0 },
            Repr::RouterSolicit { source_ll } => HEADER_LEN + if source_ll.is_some() { LL_OPTION_LEN } else { 0 },
            Repr::RouterAdvert(_) | Repr::Other { .. } => HEADER_LEN,
        }
    }

    /// Writes the message with its checksum (from `src` to `dst`) into
    /// `buf[..buffer_len()]`. Router advertisements are parsed, not sent:
    /// spate is a host, so `RouterAdvert` emits only a bare header.
    pub fn emit(&self, buf: &mut [u8], src: &Ipv6Addr, dst: &Ipv6Addr) {
        let len = self.buffer_len();
        let buf = &mut buf[..len];
        buf.fill(0);
        let ll_option = |buf: &mut [u8], kind: u8, mac: MacAddr| {
            buf[0] = kind;
            buf[1] = 1;
            buf[2..8].copy_from_slice(&mac.0);
        };
        match *self {
            Repr::EchoRequest { ident, seq_no, data } | Repr::EchoReply { ident, seq_no, data } => {
                buf[field::TYPE] = if matches!(self, Repr::EchoRequest { .. }) {
                    msg_type::ECHO_REQUEST
                } else {
                    msg_type::ECHO_REPLY
                };
                set_u16(buf, field::IDENT, ident);
                set_u16(buf, field::SEQ_NO, seq_no);
                buf[HEADER_LEN..].copy_from_slice(data);
            }
            Repr::DstUnreachable { code, data } => {
                buf[field::TYPE] = msg_type::DST_UNREACHABLE;
                buf[field::CODE] = code;
                buf[HEADER_LEN..].copy_from_slice(data);
            }
            Repr::PacketTooBig { mtu, data } => {
                buf[field::TYPE] = msg_type::PACKET_TOO_BIG;
                set_u32(buf, field::MTU, mtu);
                buf[HEADER_LEN..].copy_from_slice(data);
            }
            Repr::TimeExceeded { code, data } => {
                buf[field::TYPE] = msg_type::TIME_EXCEEDED;
                buf[field::CODE] = code;
                buf[HEADER_LEN..].copy_from_slice(data);
            }
            Repr::ParamProblem { code, pointer, data } => {
                buf[field::TYPE] = msg_type::PARAM_PROBLEM;
                buf[field::CODE] = code;
                set_u32(buf, field::POINTER, pointer);
                buf[HEADER_LEN..].copy_from_slice(data);
            }
            Repr::NeighborSolicit { target, source_ll } => {
                buf[field::TYPE] = msg_type::NEIGHBOR_SOLICIT;
                buf[field::TARGET..field::TARGET + 16].copy_from_slice(&target.octets());
                if let Some(mac) = source_ll {
                    ll_option(&mut buf[ND_LEN..], option::SOURCE_LL, mac);
                }
            }
            Repr::NeighborAdvert { flags, target, target_ll } => {
                buf[field::TYPE] = msg_type::NEIGHBOR_ADVERT;
                buf[field::NA_FLAGS] =
                    (flags.router as u8) << 7 | (flags.solicited as u8) << 6 | (flags.override_ as u8) << 5;
                buf[field::TARGET..field::TARGET + 16].copy_from_slice(&target.octets());
                if let Some(mac) = target_ll {
                    ll_option(&mut buf[ND_LEN..], option::TARGET_LL, mac);
                }
            }
            Repr::RouterSolicit { source_ll } => {
                buf[field::TYPE] = msg_type::ROUTER_SOLICIT;
                if let Some(mac) = source_ll {
                    ll_option(&mut buf[HEADER_LEN..], option::SOURCE_LL, mac);
                }
            }
            Repr::RouterAdvert(_) => buf[field::TYPE] = msg_type::ROUTER_ADVERT,
            Repr::Other { msg_type, code } => {
                buf[field::TYPE] = msg_type;
                buf[field::CODE] = code;
            }
        }
        Packet::new_unchecked(buf).fill_checksum(src, dst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fixtures::*;

    fn icmp(frame: &[u8]) -> (&[u8], Ipv6Addr, Ipv6Addr) {
        let ip = crate::wire::ipv6::Packet::new_checked(&frame[14..]).unwrap();
        (&frame[14 + 40..], ip.src(), ip.dst())
    }

    #[test]
    fn neighbour_solicitation_and_advertisement() {
        let ns = hex(NS);
        let (b, s, d) = icmp(&ns);
        let r = Repr::parse(&Packet::new_checked(b).unwrap(), &s, &d, false).unwrap();
        let me: Ipv6Addr = "fd00::2".parse().unwrap();
        let peer_mac = MacAddr([0x6a, 0x1f, 0x3c, 0x55, 0x10, 0x9e]);
        assert_eq!(r, Repr::NeighborSolicit { target: me, source_ll: Some(peer_mac) });
        let mut out = vec![0u8; r.buffer_len()];
        r.emit(&mut out, &s, &d);
        assert_eq!(out[..], *b);

        let na = hex(NA);
        let (b, s, d) = icmp(&na);
        let r = Repr::parse(&Packet::new_checked(b).unwrap(), &s, &d, false).unwrap();
        let my_mac = MacAddr([0x02, 0x53, 0x50, 0x41, 0x54, 0x45]);
        let flags = NaFlags { router: false, solicited: true, override_: true };
        assert_eq!(r, Repr::NeighborAdvert { flags, target: me, target_ll: Some(my_mac) });
        let mut out = vec![0u8; r.buffer_len()];
        r.emit(&mut out, &s, &d);
        assert_eq!(out[..], *b, "the NA Linux sent, bit for bit");
    }

    #[test]
    fn echo_and_unreachable() {
        let req = hex(ICMP6_ECHO_REQUEST);
        let (b, s, d) = icmp(&req);
        let Repr::EchoRequest { ident, seq_no, data } =
            Repr::parse(&Packet::new_checked(b).unwrap(), &s, &d, false).unwrap()
        else {
            panic!()
        };
        let reply = Repr::EchoReply { ident, seq_no, data };
        let mut out = vec![0u8; reply.buffer_len()];
        reply.emit(&mut out, &d, &s);
        assert_eq!(out[..], hex(ICMP6_ECHO_REPLY)[54..]);

        let un = hex(ICMP6_PORT_UNREACHABLE);
        let (b, s, d) = icmp(&un);
        let r = Repr::parse(&Packet::new_checked(b).unwrap(), &s, &d, false).unwrap();
        assert!(matches!(r, Repr::DstUnreachable { code: unreachable::PORT, data } if data.len() == 52));
    }

    #[test]
    fn router_advertisement() {
        let ra = hex(RA);
        let (b, s, d) = icmp(&ra);
        let Repr::RouterAdvert(ra) = Repr::parse(&Packet::new_checked(b).unwrap(), &s, &d, false).unwrap() else {
            panic!()
        };
        assert_eq!(ra.router_lifetime, 1800);
        assert_eq!(ra.mtu, Some(1500));
        assert_eq!(ra.source_ll, Some(MacAddr([0x6a, 0x1f, 0x3c, 0x55, 0x10, 0x9e])));
        let p = ra.prefixes[0].unwrap();
        assert_eq!((p.prefix, p.prefix_len, p.on_link, p.autonomous), ("fd00::".parse().unwrap(), 64, true, true));
        assert!(ra.prefixes[1].is_none());
    }

    #[test]
    fn malformed_options_and_checksums() {
        let ns = hex(NS);
        let (b, s, d) = icmp(&ns);
        let mut zero_len = b.to_vec();
        zero_len[ND_LEN + 1] = 0;
        let mut p = Packet::new_checked(&mut zero_len[..]).unwrap();
        p.fill_checksum(&s, &d);
        assert_eq!(
            Repr::parse(&Packet::new_checked(&zero_len[..]).unwrap(), &s, &d, false).unwrap_err(),
            WireError::Malformed
        );
        let mut overlong = b.to_vec();
        overlong[ND_LEN + 1] = 2;
        Packet::new_checked(&mut overlong[..]).unwrap().fill_checksum(&s, &d);
        assert_eq!(
            Repr::parse(&Packet::new_checked(&overlong[..]).unwrap(), &s, &d, false).unwrap_err(),
            WireError::Truncated
        );
        let mut bad = b.to_vec();
        bad[10] ^= 1;
        assert_eq!(
            Repr::parse(&Packet::new_checked(&bad[..]).unwrap(), &s, &d, false).unwrap_err(),
            WireError::Checksum
        );
        let short = &b[..20];
        let mut sh = short.to_vec();
        Packet::new_checked(&mut sh[..]).unwrap().fill_checksum(&s, &d);
        assert_eq!(
            Repr::parse(&Packet::new_checked(&sh[..]).unwrap(), &s, &d, false).unwrap_err(),
            WireError::Truncated
        );
    }
}
