//! spate-run: see spate_apps::run.

fn main() {
    std::process::exit(spate_apps::run::main(std::env::args().collect()));
}
