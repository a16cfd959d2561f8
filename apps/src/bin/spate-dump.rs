//! spate-dump: see spate_apps::dump.
use clap::Parser;
use mimalloc::MiMalloc;

#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

fn main() {
    std::process::exit(spate_apps::dump::main(spate_apps::dump::DumpArgs::parse()));
}
