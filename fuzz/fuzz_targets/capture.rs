#![no_main]
//! What a capture reads: a classic BPF program (the first byte's count of
//! 8-byte instructions) run over any frame (the rest) is refused by the
//! checker or runs to a verdict, never a panic nor a read outside the
//! frame; and the same bytes as a capture stream are messages or an
//! error, never a panic.
use libfuzzer_sys::fuzz_target;
use spate_stack::control::Message;
use spate_stack::internals::bpf::{Insn, Program};

fuzz_target!(|data: &[u8]| {
    if let Some((&n, rest)) = data.split_first() {
        let n = (n as usize % 64).min(rest.len() / 8);
        let (code, frame) = rest.split_at(n * 8);
        let insns: Vec<Insn> = code
            .chunks_exact(8)
            .map(|c| Insn {
                code: u16::from_le_bytes([c[0], c[1]]),
                jt: c[2],
                jf: c[3],
                k: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect();
        if let Ok(p) = Program::new(insns) {
            let _ = p.run(frame, frame.len() as u32);
        }
    }
    let mut stream = data;
    while let Ok(Some(_)) = Message::read(&mut stream) {}
});
