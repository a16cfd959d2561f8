#![no_main]
//! Any text as a configuration file: `StackConfig::from_toml` answers with
//! a configuration or an error, never a panic, and so does the validation
//! `Stack::new` runs on what it parsed (its limits, prefixes, neighbours,
//! tunnels), however odd the values.
use libfuzzer_sys::fuzz_target;
use spate_stack::StackConfig;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(cfg) = StackConfig::from_toml(text) {
            let _ = cfg.validate();
        }
    }
});
