//! Classic BPF, the filter language of `tcpdump` and `SO_ATTACH_FILTER`:
//! a program (libpcap compiles an expression such as `udp port 7000` to
//! one, for Ethernet frames) runs over a frame and says how many of its
//! bytes to keep, 0 for none. Programs are checked once when attached, as
//! Linux's `bpf_check_classic` does (known instructions, jumps forward and
//! inside the program, scratch memory in range, no division by a constant
//! zero, a return at the end), so running one is bounded by its length and
//! never reads outside the frame: a load past the end rejects the frame, as
//! in the kernel's interpreter.

use std::fmt;

/// One instruction, as `struct sock_filter` (and `tcpdump -ddd`) give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Insn {
    /// Class, size, mode or operation, source.
    pub code: u16,
    /// Where a conditional jump goes when true (instructions skipped).
    pub jt: u8,
    /// Where it goes when false.
    pub jf: u8,
    /// The constant.
    pub k: u32,
}

/// A program that passed the checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program(Box<[Insn]>);

/// Why a program was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// The instruction at fault.
    pub at: usize,
    /// What is wrong with it.
    pub why: &'static str,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BPF instruction {}: {}", self.at, self.why)
    }
}

impl std::error::Error for Invalid {}

/// Instructions a program may have at most (Linux's `BPF_MAXINSNS`).
pub const MAX_INSNS: usize = 4096;
/// Scratch memory words (`BPF_MEMWORDS`).
const MEMWORDS: u32 = 16;

// Instruction classes.
const LD: u16 = 0x00;
const LDX: u16 = 0x01;
const ST: u16 = 0x02;
const STX: u16 = 0x03;
const ALU: u16 = 0x04;
const JMP: u16 = 0x05;
const RET: u16 = 0x06;
const MISC: u16 = 0x07;
// Load sizes.
const W: u16 = 0x00;
const H: u16 = 0x08;
const B: u16 = 0x10;
// Load modes.
const IMM: u16 = 0x00;
const ABS: u16 = 0x20;
const IND: u16 = 0x40;
const MEM: u16 = 0x60;
const LEN: u16 = 0x80;
const MSH: u16 = 0xa0;
// ALU operations and jump tests.
const ADD: u16 = 0x00;
const SUB: u16 = 0x10;
const MUL: u16 = 0x20;
const DIV: u16 = 0x30;
const OR: u16 = 0x40;
const AND: u16 = 0x50;
const LSH: u16 = 0x60;
const RSH: u16 = 0x70;
const NEG: u16 = 0x80;
const MOD: u16 = 0x90;
const XOR: u16 = 0xa0;
const JA: u16 = 0x00;
const JEQ: u16 = 0x10;
const JGT: u16 = 0x20;
const JGE: u16 = 0x30;
const JSET: u16 = 0x40;
// Operand sources.
const K: u16 = 0x00;
const X: u16 = 0x08;
const A: u16 = 0x10;
// MISC operations.
const TAX: u16 = 0x00;
const TXA: u16 = 0x80;

/// The instructions Linux's classic BPF takes (`bpf_check_classic`'s
/// table), and no others.
const VALID: &[u16] = &[
    // Loads into A and X.
    LD | W | ABS,
    LD | H | ABS,
    LD | B | ABS,
    LD | W | LEN,
    LD | W | IND,
    LD | H | IND,
    LD | B | IND,
    LD | IMM,
    LD | MEM,
    LDX | W | IMM,
    LDX | W | MEM,
    LDX | W | LEN,
    LDX | B | MSH,
    // Stores.
    ST,
    STX,
    // Arithmetic, with a constant or X.
    ALU | ADD | K,
    ALU | ADD | X,
    ALU | SUB | K,
    ALU | SUB | X,
    ALU | MUL | K,
    ALU | MUL | X,
    ALU | DIV | K,
    ALU | DIV | X,
    ALU | MOD | K,
    ALU | MOD | X,
    ALU | AND | K,
    ALU | AND | X,
    ALU | OR | K,
    ALU | OR | X,
    ALU | XOR | K,
    ALU | XOR | X,
    ALU | LSH | K,
    ALU | LSH | X,
    ALU | RSH | K,
    ALU | RSH | X,
    ALU | NEG,
    // Jumps.
    JMP | JA,
    JMP | JEQ | K,
    JMP | JEQ | X,
    JMP | JGT | K,
    JMP | JGT | X,
    JMP | JGE | K,
    JMP | JGE | X,
    JMP | JSET | K,
    JMP | JSET | X,
    // Returns and register moves.
    RET | K,
    RET | A,
    MISC | TAX,
    MISC | TXA,
];

impl Program {
    /// Checks `insns`.
    pub fn new(insns: Vec<Insn>) -> Result<Program, Invalid> {
        let n = insns.len();
        if n == 0 || n > MAX_INSNS {
            return Err(Invalid { at: 0, why: "a program has 1 to 4,096 instructions" });
        }
        for (at, i) in insns.iter().enumerate() {
            let bad = |why| Err(Invalid { at, why });
            if !VALID.contains(&i.code) {
                return bad("unknown instruction");
            }
            let (class, op) = (i.code & 0x07, i.code & 0xf0);
            let uses_mem = matches!(class, ST | STX) || (matches!(class, LD | LDX) && i.code & 0xe0 == MEM);
            if uses_mem && i.k >= MEMWORDS {
                return bad("scratch memory index out of range");
            }
            if class == ALU && i.code & 0x08 == K {
                if matches!(op, DIV | MOD) && i.k == 0 {
                    return bad("division by a constant zero");
                }
                if matches!(op, LSH | RSH) && i.k >= 32 {
                    return bad("shift by 32 or more");
                }
            }
            if class == JMP {
                let left = n - at - 1;
                let out = if op == JA { i.k as usize >= left } else { i.jt as usize >= left || i.jf as usize >= left };
                if out {
                    return bad("jump out of the program");
                }
            }
        }
        if insns[n - 1].code & 0x07 != RET {
            return Err(Invalid { at: n - 1, why: "the program does not end with a return" });
        }
        Ok(Program(insns.into_boxed_slice()))
    }

    /// Runs the program over `frame`, of which the wire carried
    /// `wire_len` bytes: how many bytes to keep (0: reject). Loads past
    /// `frame`'s end reject it.
    pub fn run(&self, frame: &[u8], wire_len: u32) -> u32 {
        let (mut a, mut x) = (0u32, 0u32);
        let mut mem = [0u32; MEMWORDS as usize];
        let load = |at: u32, size: u16| -> Option<u32> {
            let at = at as usize;
            match size {
                W => frame.get(at..at.checked_add(4)?).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]])),
                H => frame.get(at..at.checked_add(2)?).map(|b| u16::from_be_bytes([b[0], b[1]]) as u32),
                _ => frame.get(at).map(|b| *b as u32),
            }
        };
        let mut pc = 0;
        // Every jump goes forward: at most one pass over the program.
        while let Some(i) = self.0.get(pc) {
            pc += 1;
            let class = i.code & 0x07;
            match class {
                LD | LDX => {
                    let (size, mode) = (i.code & 0x18, i.code & 0xe0);
                    let v = match mode {
                        IMM => i.k,
                        LEN => wire_len,
                        MEM => mem[i.k as usize],
                        ABS => match load(i.k, size) {
                            Some(v) => v,
                            None => return 0,
                        },
                        IND => match x.checked_add(i.k).and_then(|at| load(at, size)) {
                            Some(v) => v,
                            None => return 0,
                        },
                        _ => match load(i.k, B) {
                            Some(v) => (v & 0x0f) << 2,
                            None => return 0,
                        },
                    };
                    if class == LD { a = v } else { x = v }
                }
                ST => mem[i.k as usize] = a,
                STX => mem[i.k as usize] = x,
                ALU => {
                    let v = if i.code & 0x08 == X { x } else { i.k };
                    a = match i.code & 0xf0 {
                        ADD => a.wrapping_add(v),
                        SUB => a.wrapping_sub(v),
                        MUL => a.wrapping_mul(v),
                        DIV => match a.checked_div(v) {
                            Some(q) => q,
                            None => return 0,
                        },
                        MOD => match a.checked_rem(v) {
                            Some(r) => r,
                            None => return 0,
                        },
                        OR => a | v,
                        AND => a & v,
                        XOR => a ^ v,
                        LSH => a.checked_shl(v).unwrap_or(0),
                        RSH => a.checked_shr(v).unwrap_or(0),
                        _ => a.wrapping_neg(),
                    };
                }
                JMP => {
                    let v = if i.code & 0x08 == X { x } else { i.k };
                    let taken = match i.code & 0xf0 {
                        JA => {
                            pc += i.k as usize;
                            continue;
                        }
                        JEQ => a == v,
                        JGT => a > v,
                        JGE => a >= v,
                        _ => a & v != 0,
                    };
                    pc += if taken { i.jt } else { i.jf } as usize;
                }
                RET => {
                    return if i.code & 0x18 == A { a } else { i.k };
                }
                _ => {
                    if i.code & 0xf8 == TXA {
                        a = x
                    } else {
                        x = a
                    }
                }
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn i(code: u16, jt: u8, jf: u8, k: u32) -> Insn {
        Insn { code, jt, jf, k }
    }

    /// `tcpdump -dd 'udp dst port 7000'` on Ethernet (libpcap 1.10).
    fn udp_dst_port_7000() -> Vec<Insn> {
        vec![
            i(0x28, 0, 0, 0x0000000c),
            i(0x15, 0, 4, 0x000086dd),
            i(0x30, 0, 0, 0x00000014),
            i(0x15, 0, 11, 0x00000011),
            i(0x28, 0, 0, 0x00000038),
            i(0x15, 8, 9, 0x00001b58),
            i(0x15, 0, 8, 0x00000800),
            i(0x30, 0, 0, 0x00000017),
            i(0x15, 0, 6, 0x00000011),
            i(0x28, 0, 0, 0x00000014),
            i(0x45, 4, 0, 0x00001fff),
            i(0xb1, 0, 0, 0x0000000e),
            i(0x48, 0, 0, 0x00000010),
            i(0x15, 0, 1, 0x00001b58),
            i(0x06, 0, 0, 0x00040000),
            i(0x06, 0, 0, 0x00000000),
        ]
    }

    /// An IPv4 UDP frame to `dport`, with `frag` in the fragment field.
    fn frame4(dport: u16, frag: u16) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 8 + 4];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14] = 0x45;
        f[20..22].copy_from_slice(&frag.to_be_bytes());
        f[23] = 17;
        f[36..38].copy_from_slice(&dport.to_be_bytes());
        f
    }

    fn frame6(dport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 40 + 8];
        f[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
        f[14] = 0x60;
        f[20] = 17;
        f[56..58].copy_from_slice(&dport.to_be_bytes());
        f
    }

    #[test]
    fn libpcaps_program_for_a_port_picks_its_frames() {
        let p = Program::new(udp_dst_port_7000()).unwrap();
        assert_eq!(p.run(&frame4(7000, 0), 46), 0x40000);
        assert_eq!(p.run(&frame4(7001, 0), 46), 0);
        // A later fragment has no UDP header: not matched.
        assert_eq!(p.run(&frame4(7000, 0x0010), 46), 0);
        assert_eq!(p.run(&frame6(7000), 62), 0x40000);
        assert_eq!(p.run(&frame6(53), 62), 0);
        // Cut short before the port: rejected, never read past the end.
        assert_eq!(p.run(&frame4(7000, 0)[..30], 46), 0);
        assert_eq!(p.run(&[], 0), 0);
    }

    #[test]
    fn returns_say_how_much_to_keep() {
        let p = Program::new(vec![i(LD | W | LEN, 0, 0, 0), i(ALU | SUB | K, 0, 0, 4), i(RET | A, 0, 0, 0)]).unwrap();
        assert_eq!(p.run(&[0; 10], 100), 96);
        let p = Program::new(vec![i(LDX | W | IMM, 0, 0, 7), i(MISC | TXA, 0, 0, 0), i(RET | A, 0, 0, 0)]).unwrap();
        assert_eq!(p.run(&[], 0), 7);
        // Scratch memory and the MSH load (an IPv4 header's length).
        let p = Program::new(vec![
            i(LDX | B | MSH, 0, 0, 0),
            i(STX, 0, 0, 3),
            i(LD | W | MEM, 0, 0, 3),
            i(RET | A, 0, 0, 0),
        ])
        .unwrap();
        assert_eq!(p.run(&[0x45], 1), 20);
        // Division by a register holding zero rejects the frame.
        let p = Program::new(vec![i(LD | W | IMM, 0, 0, 8), i(ALU | DIV | X, 0, 0, 0), i(RET | K, 0, 0, 1)]).unwrap();
        assert_eq!(p.run(&[], 0), 0);
    }

    #[test]
    fn bad_programs_are_refused() {
        let ret = i(RET | K, 0, 0, 1);
        let refused = |p: Vec<Insn>| Program::new(p).unwrap_err();
        assert_eq!(refused(vec![]).at, 0);
        assert_eq!(refused(vec![ret; MAX_INSNS + 1]).at, 0);
        assert_eq!(refused(vec![i(LD | W | ABS, 0, 0, 0)]).why, "the program does not end with a return");
        assert_eq!(refused(vec![i(JMP | JEQ | K, 1, 0, 0), ret]).why, "jump out of the program");
        assert_eq!(refused(vec![i(JMP | JA, 0, 0, 1), ret]).why, "jump out of the program");
        assert_eq!(refused(vec![i(ST, 0, 0, 16), ret]).why, "scratch memory index out of range");
        assert_eq!(refused(vec![i(ALU | DIV | K, 0, 0, 0), ret]).why, "division by a constant zero");
        assert_eq!(refused(vec![i(0xffff, 0, 0, 0), ret]).why, "unknown instruction");
        assert_eq!(refused(vec![i(LDX | H | ABS, 0, 0, 0), ret]).at, 0);
        assert_eq!(refused(vec![i(ALU | LSH | K, 0, 0, 32), ret]).why, "shift by 32 or more");
        assert_eq!(refused(vec![i(RET | X, 0, 0, 0)]).why, "unknown instruction");
        assert_eq!(refused(vec![i(ALU | NEG | X, 0, 0, 0), ret]).why, "unknown instruction");
        assert_eq!(refused(vec![i(0x100 | LD | IMM, 0, 0, 0), ret]).why, "unknown instruction");
        // A jump to the last instruction is fine.
        assert!(Program::new(vec![i(JMP | JA, 0, 0, 0), ret]).is_ok());
    }
}
