//! spate-echo: UDP echo on spate, its main job.
use clap::Parser;
use mimalloc::MiMalloc;

#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

fn main() {
    std::process::exit(spate_apps::echo::main(spate_apps::echo::EchoArgs::parse()));
}
