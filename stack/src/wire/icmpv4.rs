//! ICMP for IPv4 (RFC 792): echo, destination unreachable, time exceeded.

use super::checksum;
use super::{Result, WireError, get_u16, set_u16};

mod field {
    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CHECKSUM: usize = 2;
    pub const IDENT: usize = 4;
    pub const SEQ_NO: usize = 6;
    pub const MTU: usize = 6;
    pub const DATA: usize = 8;
}

/// Header length (type, code, checksum and the 4-byte rest of header).
pub const HEADER_LEN: usize = 8;

/// Message types spate handles.
pub mod msg_type {
    /// Echo reply.
    pub const ECHO_REPLY: u8 = 0;
    /// Destination unreachable.
    pub const DST_UNREACHABLE: u8 = 3;
    /// Echo request.
    pub const ECHO_REQUEST: u8 = 8;
    /// Time exceeded.
    pub const TIME_EXCEEDED: u8 = 11;
}

/// Destination-unreachable codes.
pub mod unreachable {
    /// Network unreachable.
    pub const NET: u8 = 0;
    /// Host unreachable.
    pub const HOST: u8 = 1;
    /// Protocol unreachable.
    pub const PROTOCOL: u8 = 2;
    /// Port unreachable.
    pub const PORT: u8 = 3;
    /// Fragmentation needed and DF set (carries the next-hop MTU).
    pub const FRAG_NEEDED: u8 = 4;
}

/// A view of an ICMP message.
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

    /// Echo identifier.
    pub fn ident(&self) -> u16 {
        get_u16(self.b(), field::IDENT)
    }

    /// Echo sequence number.
    pub fn seq_no(&self) -> u16 {
        get_u16(self.b(), field::SEQ_NO)
    }

    /// Next-hop MTU of a fragmentation-needed message.
    pub fn next_hop_mtu(&self) -> u16 {
        get_u16(self.b(), field::MTU)
    }

    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        get_u16(self.b(), field::CHECKSUM)
    }

    /// The data after the header.
    pub fn data(&self) -> &[u8] {
        &self.b()[field::DATA..]
    }

    /// Whether the checksum over the whole message is right.
    pub fn verify_checksum(&self) -> bool {
        checksum::fold(checksum::sum(self.b())) == 0xffff
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the type.
    pub fn set_msg_type(&mut self, t: u8) {
        self.buffer.as_mut()[field::TYPE] = t;
    }

    /// Sets the checksum field.
    pub fn set_checksum(&mut self, c: u16) {
        set_u16(self.buffer.as_mut(), field::CHECKSUM, c);
    }

    /// Computes and writes the checksum over the whole buffer.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let c = checksum::checksum(self.buffer.as_ref());
        self.set_checksum(c);
    }
}

/// A parsed ICMP message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repr<'a> {
    /// Echo request.
    EchoRequest {
        /// Identifier.
        ident: u16,
        /// Sequence number.
        seq_no: u16,
        /// Data to echo.
        data: &'a [u8],
    },
    /// Echo reply.
    EchoReply {
        /// Identifier.
        ident: u16,
        /// Sequence number.
        seq_no: u16,
        /// Echoed data.
        data: &'a [u8],
    },
    /// Destination unreachable.
    DstUnreachable {
        /// Code (see [`unreachable`](mod@unreachable)).
        code: u8,
        /// Next-hop MTU (fragmentation needed only).
        mtu: u16,
        /// The offending packet's IP header and leading payload.
        data: &'a [u8],
    },
    /// Time exceeded.
    TimeExceeded {
        /// 0 in transit, 1 reassembly.
        code: u8,
        /// The offending packet's IP header and leading payload.
        data: &'a [u8],
    },
    /// Another type spate does not interpret.
    Other {
        /// Type.
        msg_type: u8,
        /// Code.
        code: u8,
    },
}

impl<'a> Repr<'a> {
    /// Parses a message, verifying the checksum unless `checksum_verified`.
    pub fn parse(p: &Packet<&'a [u8]>, checksum_verified: bool) -> Result<Repr<'a>> {
        p.check_len()?;
        if !checksum_verified && !p.verify_checksum() {
            return Err(WireError::Checksum);
        }
        let data = &p.buffer[HEADER_LEN..];
        Ok(match (p.msg_type(), p.code()) {
            (msg_type::ECHO_REQUEST, 0) => Repr::EchoRequest { ident: p.ident(), seq_no: p.seq_no(), data },
            (msg_type::ECHO_REPLY, 0) => Repr::EchoReply { ident: p.ident(), seq_no: p.seq_no(), data },
            (msg_type::DST_UNREACHABLE, code) => Repr::DstUnreachable { code, mtu: p.next_hop_mtu(), data },
            (msg_type::TIME_EXCEEDED, code) => Repr::TimeExceeded { code, data },
            (msg_type, code) => Repr::Other { msg_type, code },
        })
    }

    /// Bytes `emit` writes.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN
            + match self {
                Repr::EchoRequest { data, .. }
                | Repr::EchoReply { data, .. }
                | Repr::DstUnreachable { data, .. }
                | Repr::TimeExceeded { data, .. } => data.len(),
                Repr::Other { .. } => 0,
            }
    }

    /// Writes the message with its checksum into `buf[..buffer_len()]`.
    pub fn emit(&self, buf: &mut [u8]) {
        let len = self.buffer_len();
        let buf = &mut buf[..len];
        buf[..HEADER_LEN].fill(0);
        let data = match *self {
            Repr::EchoRequest { ident, seq_no, data } | Repr::EchoReply { ident, seq_no, data } => {
                buf[field::TYPE] = if matches!(self, Repr::EchoRequest { .. }) {
                    msg_type::ECHO_REQUEST
                } else {
                    msg_type::ECHO_REPLY
                };
                set_u16(buf, field::IDENT, ident);
                set_u16(buf, field::SEQ_NO, seq_no);
                data
            }
            Repr::DstUnreachable { code, mtu, data } => {
                buf[field::TYPE] = msg_type::DST_UNREACHABLE;
                buf[field::CODE] = code;
                set_u16(buf, field::MTU, mtu);
                data
            }
            Repr::TimeExceeded { code, data } => {
                buf[field::TYPE] = msg_type::TIME_EXCEEDED;
                buf[field::CODE] = code;
                data
            }
            Repr::Other { msg_type, code } => {
                buf[field::TYPE] = msg_type;
                buf[field::CODE] = code;
                &[]
            }
        };
        buf[HEADER_LEN..].copy_from_slice(data);
        Packet::new_unchecked(buf).fill_checksum();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fixtures::{ICMP4_ECHO_REPLY, ICMP4_ECHO_REQUEST, ICMP4_PORT_UNREACHABLE, hex};

    #[test]
    fn echo_request_and_linux_reply() {
        let req = hex(ICMP4_ECHO_REQUEST);
        let p = Packet::new_checked(&req[34..]).unwrap();
        let r = Repr::parse(&p, false).unwrap();
        let Repr::EchoRequest { ident, seq_no, data } = r else { panic!("{r:?}") };
        assert_eq!((ident, seq_no, data), (0x73ad, 1, &[0u8, 1, 2, 3, 4, 5, 6, 7][..]));
        let reply = Repr::EchoReply { ident, seq_no, data };
        let mut out = vec![0u8; reply.buffer_len()];
        reply.emit(&mut out);
        assert_eq!(out[..], hex(ICMP4_ECHO_REPLY)[34..], "same bytes as the kernel's reply");
    }

    #[test]
    fn port_unreachable_carries_the_original() {
        let f = hex(ICMP4_PORT_UNREACHABLE);
        let p = Packet::new_checked(&f[34..]).unwrap();
        match Repr::parse(&p, false).unwrap() {
            Repr::DstUnreachable { code, data, .. } => {
                assert_eq!(code, unreachable::PORT);
                assert_eq!(data.len(), 32, "original IP header + 12 bytes of UDP");
                let r = Repr::DstUnreachable { code, mtu: 0, data };
                let mut out = vec![0u8; r.buffer_len()];
                r.emit(&mut out);
                assert_eq!(out[..], f[34..]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bad_checksum_and_short() {
        let mut req = hex(ICMP4_ECHO_REQUEST);
        req[40] ^= 0xff;
        assert_eq!(Repr::parse(&Packet::new_checked(&req[34..]).unwrap(), false).unwrap_err(), WireError::Checksum);
        assert_eq!(Packet::new_checked(&req[34..41]).unwrap_err(), WireError::Truncated);
    }
}
