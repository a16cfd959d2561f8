//! spate-sink: a UDP sink on spate.
use clap::Parser;
use mimalloc::MiMalloc;

#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

fn main() {
    std::process::exit(spate_apps::sink::main(spate_apps::sink::SinkArgs::parse()));
}
