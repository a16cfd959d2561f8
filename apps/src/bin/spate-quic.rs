//! spate-quic: see spate_apps::quic.
use clap::Parser;
use mimalloc::MiMalloc;

#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

fn main() {
    std::process::exit(spate_apps::quic::main(spate_apps::quic::QuicArgs::parse()));
}
