//! spate-run: runs an unmodified program with its UDP sockets on spate.
//! `spate-run [stack flags] -- PROGRAM [ARGS...]` checks the flags,
//! puts them in `SPATE_ARGS`, preloads libspate-preload.so (`LD_PRELOAD`)
//! and runs PROGRAM in its own place (`exec`): the stack starts inside
//! the program, on its first UDP socket that spate carries.
//! docs/preload.md says what moves onto spate and what stays the kernel's.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use std::net::IpAddr;

use clap::Parser;
use spate::config::StackConfig;

use crate::cli::StackArgs;

/// Command line of spate-run before its `--`: the stack flags (EAL
/// arguments go in the configuration file's, the `--` being the
/// program's).
#[derive(Debug, Parser)]
#[command(
    name = "spate-run",
    version,
    about = "Runs a program with its UDP sockets on spate (libspate-preload.so)",
    override_usage = "spate-run [STACK FLAGS] -- PROGRAM [ARGS]..."
)]
pub struct RunArgs {
    #[command(flatten)]
    stack: StackArgs,
    /// The preload library (default: $SPATE_PRELOAD, else
    /// ../lib/libspate-preload.so beside this program, else
    /// libspate_preload.so in its folder, as cargo builds it).
    #[arg(long, value_name = "FILE")]
    preload: Option<PathBuf>,
}

/// Runs spate-run: returns only when the program could not be run, with
/// the exit code.
pub fn main(args: Vec<String>) -> i32 {
    let end = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let parsed = match RunArgs::try_parse_from(&args[..end]) {
        Ok(p) => p,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    let program = args.get(end + 1..).unwrap_or_default();
    if program.is_empty() {
        eprintln!("spate-run: no program (spate-run [STACK FLAGS] -- PROGRAM [ARGS]...)");
        return 2;
    }
    let cfg = match parsed.stack.to_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("spate-run: {e}");
            return 2;
        }
    };
    let Some(preload) = parsed.preload.clone().or_else(find_preload) else {
        eprintln!(
            "spate-run: no libspate-preload.so (cargo xtask install puts it in PREFIX/lib; --preload FILE or \
             SPATE_PRELOAD names another)"
        );
        return 2;
    };
    if !preload.is_file() {
        eprintln!("spate-run: {}: no such file", preload.display());
        return 2;
    }
    // The flags as given, without --preload.
    let mut flags = vec![];
    let mut it = args[1..end].iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--preload" => {
                it.next();
            }
            a if a.starts_with("--preload=") => {}
            _ => flags.push(a.clone()),
        }
    }
    let mut ld = preload.display().to_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        ld = format!("{ld}:{}", old.to_string_lossy());
    }
    let err = std::process::Command::new(&program[0])
        .args(&program[1..])
        .env("SPATE_ARGS", join_words(&flags))
        .env("SPATE_ROUTES", routes_text(&cfg))
        .env("LD_PRELOAD", ld)
        .exec();
    eprintln!("spate-run: {}: {err}", program[0]);
    if err.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 }
}

/// The preload library: `SPATE_PRELOAD`, else beside this program.
fn find_preload() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SPATE_PRELOAD") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir.join("../lib/libspate-preload.so"), dir.join("libspate_preload.so")]
        .into_iter()
        .find(|p| Path::new(p).is_file())
}

/// What libspate-preload decides with, as `SPATE_ROUTES` gives it (the
/// preload reads it without loading libspate or DPDK; libspate's
/// `spate_preload_routes` makes it from `SPATE_ARGS` when a program runs
/// with `LD_PRELOAD` alone): a word per fact, `net=ADDR/LEN` for each of
/// spate's addresses, `gateway4` and `gateway6` for its default routes,
/// `lock=NAME` for its devices (one stack per device).
pub fn routes_text(cfg: &StackConfig) -> String {
    let mut words: Vec<String> =
        cfg.ports.iter().flat_map(|p| p.ipv4.iter().chain(&p.ipv6)).map(|c| format!("net={c}")).collect();
    if cfg.gateways.iter().any(IpAddr::is_ipv4) {
        words.push("gateway4".into());
    }
    if cfg.gateways.iter().any(IpAddr::is_ipv6) {
        words.push("gateway6".into());
    }
    // A device's lock name is its DPDK name and, for the virtual devices
    // that take one, the interface it drives: two programs on
    // `net_pcap0,iface=vA` and `net_pcap0,iface=vB` share nothing.
    let lock: String = cfg
        .ports
        .iter()
        .map(|p| {
            let mut parts = p.device.split(',');
            let name = parts.next().unwrap_or_default();
            match parts.find_map(|kv| kv.strip_prefix("iface=")) {
                Some(iface) => format!("{name}.{iface}"),
                None => name.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("+")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "-_.+".contains(c) { c } else { '_' })
        .collect();
    words.push(format!("lock={}", if lock.is_empty() { "default" } else { &lock }));
    words.join(" ")
}

/// `text` split into words as a shell splits them: blanks separate,
/// single quotes keep everything, double quotes keep all but `\"` and
/// `\\`, a backslash outside quotes keeps the next character.
pub fn split_words(text: &str) -> Result<Vec<String>, String> {
    let mut words = vec![];
    let mut word: Option<String> = None;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if let Some(w) = word.take() {
                    words.push(w);
                }
            }
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => w.push(c),
                        None => return Err(format!("SPATE_ARGS: a quote is not closed: {text}")),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\')) => w.push(c),
                            Some(c) => {
                                w.push('\\');
                                w.push(c);
                            }
                            None => return Err(format!("SPATE_ARGS: a quote is not closed: {text}")),
                        },
                        Some(c) => w.push(c),
                        None => return Err(format!("SPATE_ARGS: a quote is not closed: {text}")),
                    }
                }
            }
            '\\' => match chars.next() {
                Some(c) => word.get_or_insert_with(String::new).push(c),
                None => return Err(format!("SPATE_ARGS: it ends in a backslash: {text}")),
            },
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    Ok(words)
}

/// `words` quoted so that [`split_words`] gives them back.
pub fn join_words<S: AsRef<str>>(words: &[S]) -> String {
    words
        .iter()
        .map(|w| {
            let w = w.as_ref();
            match !w.is_empty() && w.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:=,@%+[]".contains(c)) {
                true => w.to_string(),
                false => format!("'{}'", w.replace('\'', r"'\''")),
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_text_names_the_addresses_gateways_and_devices() {
        let args = ["t", "--vdev", "net_pcap0,iface=vA", "--ip", "198.18.0.2/24", "--gateway", "198.18.0.1"];
        let parsed = RunArgs::try_parse_from(args).unwrap();
        let text = routes_text(&parsed.stack.to_config().unwrap());
        // libspate-preload's route.rs reads this very line in its own test.
        assert_eq!(text, "net=198.18.0.2/24 gateway4 lock=net_pcap0.vA");
    }

    #[test]
    fn words_split_as_a_shell_splits_them_and_join_gives_them_back() {
        assert_eq!(split_words("  --ip 10.0.0.2/24 ").unwrap(), ["--ip", "10.0.0.2/24"]);
        assert_eq!(
            split_words(r#"--config '/a b/c' "x\"y" z\ w ''"#).unwrap(),
            ["--config", "/a b/c", "x\"y", "z w", ""]
        );
        assert!(split_words("'open").is_err());
        assert!(split_words("end\\").is_err());
        let words = ["--vdev", "net_tap0,iface=spate0", "it's", "a b", "", "$x"];
        assert_eq!(split_words(&join_words(&words)).unwrap(), words);
    }
}
