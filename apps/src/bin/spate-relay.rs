//! spate-relay: see spate_apps::relay.
use clap::Parser;
use mimalloc::MiMalloc;

#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

fn main() {
    std::process::exit(spate_apps::relay::main(spate_apps::relay::RelayArgs::parse()));
}
