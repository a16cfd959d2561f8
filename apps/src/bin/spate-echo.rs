//! spate-echo: spate's main job.
use mimalloc::MiMalloc;

#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

fn main() -> std::process::ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    match spate_apps::demo::ring_demo(10_000) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("spate-echo: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
