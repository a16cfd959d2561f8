//! The capture's stream over the control endpoint: what a capture asks
//! for, the first answer, and the messages that follow (see
//! `setup::capture` for the serving side).
//!
//! Each message is a tag byte, then little-endian fields: `F` a frame
//! (interface u16, outbound u8, wire length u32, `CLOCK_REALTIME` ns u64,
//! captured length u32, the bytes), `S` the counts so far and `E` the last
//! counts (captured u64, dropped u64).

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

use super::InterfaceInfo;
use crate::capture::MAX_SNAPLEN;
use crate::capture::bpf::Insn;

/// What a capture asks for.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CaptureRequest {
    /// Bytes of each frame kept at most (default and most: 65,535).
    #[serde(default)]
    pub snaplen: Option<u32>,
    /// A classic BPF program over Ethernet frames (libpcap's
    /// `pcap_compile` for `DLT_EN10MB` makes one); none keeps every frame.
    #[serde(default)]
    pub filter: Option<Vec<Insn>>,
    /// Only this interface's frames.
    #[serde(default)]
    pub iface: Option<u16>,
    /// Records each lcore may have waiting for the writer (default 4,096).
    #[serde(default)]
    pub records: Option<usize>,
}

/// The answer to a capture request, before the stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CaptureStart {
    /// Every interface a frame may name.
    pub interfaces: Vec<InterfaceInfo>,
    /// The snap length in force.
    pub snaplen: u32,
}

/// One message of the capture stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A frame.
    Frame {
        /// The interface.
        iface: u16,
        /// Sent (true) or received.
        outbound: bool,
        /// Its length on the wire.
        wire_len: u32,
        /// When the lcore took it, `CLOCK_REALTIME` nanoseconds.
        time_ns: u64,
        /// Its first bytes.
        data: Vec<u8>,
    },
    /// Frames captured and frames dropped so far.
    Counts {
        /// Captured.
        captured: u64,
        /// Dropped for want of a free record.
        dropped: u64,
        /// The last message: the capture has ended.
        last: bool,
    },
}

impl Message {
    /// Reads the next message; `None` at the end of the stream.
    pub fn read(r: &mut impl Read) -> io::Result<Option<Message>> {
        let mut tag = [0u8; 1];
        match r.read_exact(&mut tag) {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            other => other?,
        }
        match tag[0] {
            b'F' => {
                let mut h = [0u8; 19];
                r.read_exact(&mut h)?;
                let len = u32::from_le_bytes([h[15], h[16], h[17], h[18]]);
                if len > MAX_SNAPLEN {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, "capture: a frame longer than 65,535"));
                }
                let mut data = vec![0u8; len as usize];
                r.read_exact(&mut data)?;
                Ok(Some(Message::Frame {
                    iface: u16::from_le_bytes([h[0], h[1]]),
                    outbound: h[2] != 0,
                    wire_len: u32::from_le_bytes([h[3], h[4], h[5], h[6]]),
                    time_ns: u64::from_le_bytes(h[7..15].try_into().unwrap_or_default()),
                    data,
                }))
            }
            t @ (b'S' | b'E') => {
                let mut h = [0u8; 16];
                r.read_exact(&mut h)?;
                Ok(Some(Message::Counts {
                    captured: u64::from_le_bytes(h[..8].try_into().unwrap_or_default()),
                    dropped: u64::from_le_bytes(h[8..].try_into().unwrap_or_default()),
                    last: t == b'E',
                }))
            }
            t => Err(io::Error::new(io::ErrorKind::InvalidData, format!("capture: unknown message {t:#x}"))),
        }
    }

    pub(in crate::setup) fn write_counts(
        w: &mut impl Write,
        (captured, dropped): (u64, u64),
        last: bool,
    ) -> io::Result<()> {
        w.write_all(&[if last { b'E' } else { b'S' }])?;
        w.write_all(&captured.to_le_bytes())?;
        w.write_all(&dropped.to_le_bytes())
    }
}
