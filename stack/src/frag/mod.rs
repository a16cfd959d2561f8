//! IP fragmentation: sending datagrams larger than the path MTU
//! ([`fragment`]), learning the path MTU ([`pmtu`]), and bounded
//! reassembly on receive ([`reassembly`]).

pub mod fragment;
pub mod pmtu;
pub mod reassembly;
