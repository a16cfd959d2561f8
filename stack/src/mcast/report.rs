//! IGMPv3 (RFC 3376) and MLDv2 (RFC 3810) on the wire: the reports a host
//! sends, as whole IP packets (IPv4 with the Router Alert option, TTL 1,
//! to 224.0.0.22; IPv6 with a hop-by-hop Router Alert, hop limit 1, to
//! ff02::16), and the queries it answers, parsed.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{Mode, SourceFilter};
use crate::wire::MacAddr;
use crate::wire::checksum::{checksum, fold, pseudo_header_v6, sum};
use crate::wire::igmp::{self, msg_type};
use crate::wire::ip_proto;

/// Where IGMPv3 reports go (all IGMPv3-capable routers).
pub const IGMPV3_ROUTERS: Ipv4Addr = Ipv4Addr::new(224, 0, 0, 22);
/// Every host of the link (joined implicitly; queries come there).
pub const ALL_HOSTS: Ipv4Addr = Ipv4Addr::new(224, 0, 0, 1);
/// Where IGMPv2 leaves go (every router of the link).
pub const ALL_ROUTERS: Ipv4Addr = Ipv4Addr::new(224, 0, 0, 2);
/// Where MLDv1 done messages go.
pub const ALL_ROUTERS_V6: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2);
/// Where MLDv2 reports go.
pub const MLDV2_ROUTERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 0x16);

/// The MAC a multicast group's frames go to (RFC 1112: 01:00:5e and the
/// group's low 23 bits; RFC 2464: 33:33 and its low 32 bits).
pub fn group_mac(group: &IpAddr) -> MacAddr {
    match group {
        IpAddr::V4(g) => {
            let o = g.octets();
            MacAddr([0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]])
        }
        IpAddr::V6(g) => {
            let o = g.octets();
            MacAddr([0x33, 0x33, o[12], o[13], o[14], o[15]])
        }
    }
}

/// Whether a host reports its membership of `group`: never of every
/// host's group 224.0.0.1 (RFC 3376 section 5), nor of ff02::1 or a group
/// of node or reserved scope (RFC 3810 section 6).
pub fn reported(group: &IpAddr) -> bool {
    match group {
        IpAddr::V4(g) => *g != ALL_HOSTS,
        IpAddr::V6(g) => *g != Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1) && g.octets()[1] & 0x0f > 1,
    }
}

/// A group record's type: the state (`current`, answering a query) or a
/// change of it (RFC 3376 section 4.2.12; MLDv2 uses the same numbers).
fn record_type(mode: Mode, current: bool) -> u8 {
    match (mode, current) {
        (Mode::Include, true) => 1,
        (Mode::Exclude, true) => 2,
        (Mode::Include, false) => 3,
        (Mode::Exclude, false) => 4,
    }
}

/// An IGMPv3 or MLDv2 report message (`msg_type` 0x22 or 143) of
/// `records`, its checksum field zero: a group record each (RFC 3376
/// 4.2.4, RFC 3810 5.2.4, the same layout but for the addresses' length).
fn report_message(msg_type: u8, records: &[(IpAddr, SourceFilter)], current: bool) -> Vec<u8> {
    let octets = |a: &IpAddr| match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    let mut msg = vec![msg_type, 0, 0, 0, 0, 0];
    msg.extend_from_slice(&(records.len() as u16).to_be_bytes());
    for (group, f) in records {
        msg.extend_from_slice(&[record_type(f.mode, current), 0]);
        msg.extend_from_slice(&(f.sources.len() as u16).to_be_bytes());
        msg.extend_from_slice(&octets(group));
        for s in &f.sources {
            msg.extend_from_slice(&octets(s));
        }
    }
    msg
}

/// An IGMPv3 report of `records` (IPv4 groups and their filters), from
/// `src` (the interface's address, or 0.0.0.0): the whole IPv4 packet.
pub fn igmpv3_report(src: Ipv4Addr, records: &[(IpAddr, SourceFilter)], current: bool) -> Vec<u8> {
    let mut msg = report_message(msg_type::V3_REPORT, records, current);
    igmp::fill_checksum(&mut msg);
    ipv4_packet(src, IGMPV3_ROUTERS, msg)
}

/// An MLDv2 report of `records` (IPv6 groups) from `src` (the
/// interface's link-local address, or :: before it has one): the whole
/// IPv6 packet.
pub fn mldv2_report(src: Ipv6Addr, records: &[(IpAddr, SourceFilter)], current: bool) -> Vec<u8> {
    ipv6_packet(src, MLDV2_ROUTERS, report_message(143, records, current))
}

/// An IGMP message of an older version about `group`, from `src`: an
/// IGMPv1 report (`version` 1), an IGMPv2 report, or with `leave` an
/// IGMPv2 leave (RFC 2236 section 2: 8 bytes, sent to the group, a leave
/// to every router, 224.0.0.2). The whole IPv4 packet.
pub fn igmp_older(src: Ipv4Addr, version: u8, group: Ipv4Addr, leave: bool) -> Vec<u8> {
    let (kind, dst) = match (version, leave) {
        (_, true) => (msg_type::V2_LEAVE, ALL_ROUTERS),
        (1, false) => (msg_type::V1_REPORT, group),
        _ => (msg_type::V2_REPORT, group),
    };
    let mut msg = vec![0; igmp::HEADER_LEN];
    igmp::emit_v2(&mut msg, kind, group);
    ipv4_packet(src, dst, msg)
}

/// An MLDv1 report about `group` from `src`, or with `done` a done
/// message (RFC 2710 section 3: 24 bytes; a report to the group, a done
/// to every router, ff02::2). The whole IPv6 packet.
pub fn mldv1(src: Ipv6Addr, group: Ipv6Addr, done: bool) -> Vec<u8> {
    let (msg_type, dst) = if done { (132, ALL_ROUTERS_V6) } else { (131, group) };
    let mut msg = vec![msg_type, 0, 0, 0, 0, 0, 0, 0];
    msg.extend_from_slice(&group.octets());
    ipv6_packet(src, dst, msg)
}

/// `igmp` (a whole message, its checksum written) in an IPv4 packet from
/// `src` to `dst` with the Router Alert option (RFC 2113) and TTL 1, as
/// RFC 3376 and RFC 2236 ask.
fn ipv4_packet(src: Ipv4Addr, dst: Ipv4Addr, igmp: Vec<u8>) -> Vec<u8> {
    let total = 24 + igmp.len();
    let mut ip = vec![0x46, 0xc0];
    ip.extend_from_slice(&(total as u16).to_be_bytes());
    // No ID needed: DF, never fragmented.
    ip.extend_from_slice(&[0, 0, 0x40, 0, 1, ip_proto::IGMP, 0, 0]);
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    ip.extend_from_slice(&[0x94, 0x04, 0, 0]);
    let c = checksum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    ip.extend_from_slice(&igmp);
    ip
}

/// `mld`, checksummed, in an IPv6 packet from `src` to `dst` with a
/// hop-by-hop Router Alert (RFC 2711) and hop limit 1.
fn ipv6_packet(src: Ipv6Addr, dst: Ipv6Addr, mut mld: Vec<u8>) -> Vec<u8> {
    let c = !fold(sum(&mld) + pseudo_header_v6(&src, &dst, 58, mld.len() as u32));
    mld[2..4].copy_from_slice(&c.to_be_bytes());
    // Hop-by-hop: Router Alert (MLD), then PadN to 8 bytes.
    let hbh = [58, 0, 5, 2, 0, 0, 1, 0];
    let mut ip = vec![0x60, 0, 0, 0];
    ip.extend_from_slice(&((hbh.len() + mld.len()) as u16).to_be_bytes());
    ip.extend_from_slice(&[0, 1]);
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    ip.extend_from_slice(&hbh);
    ip.extend_from_slice(&mld);
    ip
}

/// A query heard: which group it asks about (none: every group), how long
/// the answer may wait, at most, in milliseconds, and the querier's
/// version (IGMP 1, 2 or 3; MLD 1 or 2), which sets the host's
/// compatibility mode (RFC 3376 section 7.2.1, RFC 3810 section 8.2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Query {
    /// The group asked about; `None` for a general query.
    pub group: Option<IpAddr>,
    /// The maximum response delay, in ms.
    pub max_delay_ms: u32,
    /// The querier's version.
    pub version: u8,
}

/// RFC 3376 4.1.1 and RFC 3810 5.1.3: a code below 128 is the value, else
/// a floating-point form (mant | 0x10) << (exp + 3).
fn decode_code(code: u32, mant_bits: u32) -> u32 {
    let limit = 1 << (mant_bits + 3);
    if code < limit {
        return code;
    }
    let exp = (code >> mant_bits) & 0x7;
    let mant = code & ((1 << mant_bits) - 1);
    (mant | (1 << mant_bits)) << (exp + 3)
}

/// An IGMP message (the IPv4 payload): a membership query, checksum
/// checked; anything else `None`.
pub fn igmp_query(msg: &[u8]) -> Option<Query> {
    let p = igmp::Packet::new_checked(msg).ok()?;
    // 8 bytes (IGMPv1/v2) or 12 and more (IGMPv3): others are ignored.
    let v3 = p.len() >= igmp::V3_QUERY_LEN;
    if (p.len() != igmp::HEADER_LEN && !v3) || p.msg_type() != msg_type::QUERY || !p.verify_checksum() {
        return None;
    }
    let group = p.group();
    let group = (!group.is_unspecified()).then_some(IpAddr::V4(group));
    // Max Resp Code in tenths of a second; IGMPv1's is 0 (10 s).
    let code = p.max_resp_code() as u32;
    let (tenths, version) = match (v3, code) {
        (false, 0) => (100, 1),
        (false, _) => (code, 2),
        (true, _) => (decode_code(code, 4), 3),
    };
    Some(Query { group, max_delay_ms: tenths * 100, version })
}

/// An MLD query (the ICMPv6 message, its checksum already checked).
pub fn mld_query(msg: &[u8]) -> Option<Query> {
    // 24 bytes (MLDv1) or 28 and more (MLDv2): others are ignored.
    if msg.len() < 24 || (25..28).contains(&msg.len()) || msg[0] != 130 {
        return None;
    }
    let code = u16::from_be_bytes([msg[4], msg[5]]) as u32;
    let mut g = [0u8; 16];
    g.copy_from_slice(&msg[8..24]);
    let group = Ipv6Addr::from(g);
    let group = (!group.is_unspecified()).then_some(IpAddr::V6(group));
    let version = if msg.len() < 28 { 1 } else { 2 };
    let ms = if version == 1 { code } else { decode_code(code, 12) };
    Some(Query { group, max_delay_ms: ms, version })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_are_well_formed() {
        let f = SourceFilter { mode: Mode::Include, sources: vec!["198.18.0.1".parse().unwrap()] };
        let p = igmpv3_report(Ipv4Addr::new(198, 18, 0, 2), &[("239.1.2.3".parse().unwrap(), f)], false);
        assert_eq!(p.len(), 24 + 8 + 8 + 4);
        assert_eq!(checksum(&p[..24]), 0, "IPv4 header checksum");
        assert_eq!(checksum(&p[24..]), 0, "IGMP checksum");
        assert_eq!((p[8], p[9], &p[16..20]), (1, ip_proto::IGMP, &[224, 0, 0, 22][..]));
        // TO_IN with one source, 239.1.2.3.
        assert_eq!(&p[32..44], &[3, 0, 0, 1, 239, 1, 2, 3, 198, 18, 0, 1]);
        let v6 = mldv2_report(Ipv6Addr::UNSPECIFIED, &[("ff0e::1".parse().unwrap(), SourceFilter::any())], true);
        assert_eq!(v6.len(), 40 + 8 + 8 + 20);
        let mld = &v6[48..];
        let pseudo = pseudo_header_v6(&Ipv6Addr::UNSPECIFIED, &MLDV2_ROUTERS, 58, mld.len() as u32);
        assert_eq!(!fold(sum(mld) + pseudo), 0, "ICMPv6 checksum");
        // IS_EX with no source.
        assert_eq!(&mld[8..12], &[2, 0, 0, 0]);
        assert_eq!(group_mac(&"239.129.2.3".parse().unwrap()).0, [1, 0, 0x5e, 1, 2, 3]);
        assert_eq!(group_mac(&"ff02::1:ff00:2".parse().unwrap()).0, [0x33, 0x33, 0xff, 0, 0, 2]);
    }

    #[test]
    fn older_reports_are_well_formed() {
        let g = Ipv4Addr::new(239, 1, 2, 3);
        let src = Ipv4Addr::new(198, 18, 0, 2);
        let v2 = igmp_older(src, 2, g, false);
        assert_eq!(v2.len(), 24 + 8);
        assert_eq!((checksum(&v2[..24]), checksum(&v2[24..])), (0, 0));
        assert_eq!((v2[8], &v2[16..20], &v2[24..25], &v2[28..32]), (1, &g.octets()[..], &[0x16][..], &g.octets()[..]));
        let leave = igmp_older(src, 2, g, true);
        assert_eq!((&leave[16..20], leave[24]), (&[224, 0, 0, 2][..], 0x17));
        assert_eq!(igmp_older(src, 1, g, false)[24], 0x12);
        let g6: Ipv6Addr = "ff0e::1".parse().unwrap();
        let ll: Ipv6Addr = "fe80::1".parse().unwrap();
        for (done, msg_type, dst) in [(false, 131, g6), (true, 132, ALL_ROUTERS_V6)] {
            let p = mldv1(ll, g6, done);
            assert_eq!(p.len(), 40 + 8 + 24);
            assert_eq!((p[7], p[6], &p[24..40]), (1, 0, &dst.octets()[..]), "hop limit 1, hop-by-hop, to {dst}");
            let mld = &p[48..];
            assert_eq!((mld[0], &mld[8..24]), (msg_type, &g6.octets()[..]));
            assert_eq!(!fold(sum(mld) + pseudo_header_v6(&ll, &dst, 58, 24)), 0, "ICMPv6 checksum");
        }
    }

    #[test]
    fn queries_are_read_in_every_version() {
        let mut v3 = vec![0x11, 100, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let c = checksum(&v3);
        v3[2..4].copy_from_slice(&c.to_be_bytes());
        assert_eq!(igmp_query(&v3), Some(Query { group: None, max_delay_ms: 10_000, version: 3 }));
        let mut v2 = vec![0x11, 20, 0, 0, 239, 1, 2, 3];
        let c = checksum(&v2);
        v2[2..4].copy_from_slice(&c.to_be_bytes());
        let q = igmp_query(&v2).unwrap();
        assert_eq!((q.group, q.max_delay_ms, q.version), (Some("239.1.2.3".parse().unwrap()), 2_000, 2));
        v2[3] ^= 1;
        assert_eq!(igmp_query(&v2), None, "a bad checksum");
        // 0x8f: exp 0, mant 15: (15 | 16) << 3 = 248 tenths.
        assert_eq!(decode_code(0x8f, 4), 248);
        let mut mld = vec![130, 0, 0, 0, 0x27, 0x10, 0, 0];
        mld.extend_from_slice(&[0; 16]);
        assert_eq!(mld_query(&mld), Some(Query { group: None, max_delay_ms: 10_000, version: 1 }));
        mld.push(0);
        assert_eq!(mld_query(&mld), None, "25 bytes: neither version");
        assert!(!reported(&"224.0.0.1".parse().unwrap()) && reported(&"224.0.0.251".parse().unwrap()));
        assert!(!reported(&"ff02::1".parse().unwrap()) && !reported(&"ff01::5".parse().unwrap()));
        assert!(reported(&"ff02::fb".parse().unwrap()) && reported(&"ff0e::1".parse().unwrap()));
    }
}
