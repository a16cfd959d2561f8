//! libpcap's filter compiler, called through its C API (the unsafe FFI
//! of spate-dump lives here): `tcpdump`'s expressions compiled for
//! Ethernet frames into the classic BPF spate's lcores run. libpcap comes
//! with DPDK's development package (its pcap driver links it).
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_int, c_uint};

use spate::control::Insn;

#[repr(C)]
struct BpfInsn {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

#[repr(C)]
struct BpfProgram {
    bf_len: c_uint,
    bf_insns: *mut BpfInsn,
}

#[repr(C)]
struct Pcap {
    _opaque: [u8; 0],
}

/// `DLT_EN10MB`.
const DLT_EN10MB: c_int = 1;
/// `PCAP_NETMASK_UNKNOWN`.
const NETMASK_UNKNOWN: u32 = 0xffff_ffff;

#[link(name = "pcap")]
unsafe extern "C" {
    fn pcap_open_dead(linktype: c_int, snaplen: c_int) -> *mut Pcap;
    fn pcap_compile(p: *mut Pcap, fp: *mut BpfProgram, s: *const c_char, optimize: c_int, netmask: u32) -> c_int;
    fn pcap_geterr(p: *mut Pcap) -> *const c_char;
    fn pcap_freecode(fp: *mut BpfProgram);
    fn pcap_close(p: *mut Pcap);
}

/// Compiles `expr` (`udp port 7000 and host 198.18.0.1`) for Ethernet
/// frames cut at `snaplen`.
pub fn compile(expr: &str, snaplen: u32) -> Result<Vec<Insn>, String> {
    let text = CString::new(expr).map_err(|_| "the filter has a NUL byte".to_string())?;
    // SAFETY: a dead handle needs no device; it is closed below.
    let p = unsafe { pcap_open_dead(DLT_EN10MB, snaplen as c_int) };
    if p.is_null() {
        return Err("libpcap: no handle".into());
    }
    let mut prog = BpfProgram { bf_len: 0, bf_insns: std::ptr::null_mut() };
    // SAFETY: p is live, prog is ours, text is NUL-terminated.
    let rc = unsafe { pcap_compile(p, &mut prog, text.as_ptr(), 1, NETMASK_UNKNOWN) };
    let result = if rc != 0 {
        // SAFETY: pcap_geterr returns the handle's NUL-terminated message.
        Err(unsafe { CStr::from_ptr(pcap_geterr(p)) }.to_string_lossy().into_owned())
    } else {
        let out = if prog.bf_insns.is_null() {
            Vec::new()
        } else {
            // SAFETY: on success bf_insns holds bf_len instructions until
            // pcap_freecode.
            let insns = unsafe { std::slice::from_raw_parts(prog.bf_insns, prog.bf_len as usize) };
            insns.iter().map(|i| Insn { code: i.code, jt: i.jt, jf: i.jf, k: i.k }).collect()
        };
        // SAFETY: compiled above, freed once.
        unsafe { pcap_freecode(&mut prog) };
        Ok(out)
    };
    // SAFETY: opened above, closed once.
    unsafe { pcap_close(p) };
    result
}

#[cfg(test)]
mod tests {
    use super::compile;

    #[test]
    fn libpcap_compiles_a_port_and_refuses_nonsense() {
        let p = compile("udp dst port 7000", 65535).unwrap();
        // tcpdump -dd 'udp dst port 7000': sixteen instructions, the
        // port's test among them.
        assert_eq!(p.len(), 16);
        assert!(p.iter().any(|i| i.code == 0x15 && i.k == 7000));
        let e = compile("udp port banana", 65535).unwrap_err();
        assert!(e.contains("banana"), "{e}");
    }
}
