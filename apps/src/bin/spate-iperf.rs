//! spate-iperf: see spate_apps::iperf.
use clap::Parser;
use mimalloc::MiMalloc;

#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

fn main() {
    std::process::exit(spate_apps::iperf::main(spate_apps::iperf::IperfArgs::parse()));
}
