//! spate-stat: see spate_apps::stat.
use clap::Parser;
use mimalloc::MiMalloc;

#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

fn main() {
    std::process::exit(spate_apps::stat::main(spate_apps::stat::StatArgs::parse()));
}
