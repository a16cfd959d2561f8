//! spate-flood: see spate_apps::flood.
use clap::Parser;
use mimalloc::MiMalloc;

#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

fn main() {
    std::process::exit(spate_apps::flood::main(spate_apps::flood::FloodArgs::parse()));
}
