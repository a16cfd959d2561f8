//! The receive pipeline in one thread, counted in instructions.
//!
//! Everything runs on the calling thread: the stack polls one end of an
//! in-memory wire pair (net_ring) on the EAL main lcore, and its
//! run-to-completion callback plays both the traffic source (it writes
//! 64-byte UDP frames into the other end) and the sink (it takes the
//! datagrams from a socket and reads every payload byte). Run under
//! `valgrind --tool=callgrind` twice, with N and 2N datagrams, the
//! difference of the instruction totals divided by N is the cost of one
//! datagram, repeatable to the instruction on a shared machine.
//!
//! ```text
//! cargo bench --bench pipeline -- [--callgrind] [--datagrams N] [--flows F] [--sockets S] [--burst B] [--lcores L] [--yield-idle] [--queued] [--rss-hash] [--json PATH]
//! cargo bench --bench pipeline -- --gro-table | --frag-table | --scale-table | --capture-table | --guard
//! ```
//! `--capture` attaches a capture (as `spate-dump` does) before the run;
//! `--capture-table` prints the echo's cost with none and with one.
//! `--guard` prints spate's own instructions per datagram on the paths
//! `cargo xtask perf-guard` holds to their budgets (receive with one
//! socket and with a 64-member group, the group with frames that carry an
//! RSS hash, the group read through its receive queues, echo, and echo with
//! one datagram per loop iteration, `--burst 1`), each less its floor;
//! `--rss-hash` puts a per-flow RSS hash in the source's mbufs, as a NIC
//! with RSS would (net_ring gives none, so spate otherwise hashes the
//! flow itself to pick a group's member); with
//! `--echo`, `--inject-only` sends every frame straight back unread.
//! `--inject-only` measures the source and a bare rx_burst + free loop
//! without the stack, the floor the stack's cost is read against.
//! `--echo LEN` makes the callback an echo service for LEN-byte datagrams
//! (over 1,472 bytes the source sends each as IPv4 fragments, and spate
//! reassembles them and fragments the reply); `--frag-table` prints
//! 2,000-byte echo against 1,400-byte echo.

mod args;
mod measure;
mod paths;
mod source;
mod tables;

use crate::args::parse;
use crate::measure::{cycles_per_datagram, instructions_per_datagram};
use crate::paths::run_once;
use crate::tables::{capture_table, frag_table, gro_table, guard, scale_table};

fn main() {
    let (a, under_callgrind, json) = parse();
    if std::env::args().any(|a| a == "--gro-table") {
        gro_table(json);
        return;
    }
    if std::env::args().any(|a| a == "--frag-table") {
        frag_table(json);
        return;
    }
    if std::env::args().any(|a| a == "--scale-table") {
        scale_table(json);
        return;
    }
    if std::env::args().any(|a| a == "--capture-table") {
        capture_table(json);
        return;
    }
    if std::env::args().any(|a| a == "--guard") {
        guard(json);
        return;
    }
    if !under_callgrind {
        run_once(&a);
        return;
    }
    let n = 20_000;
    let mut extra = vec!["--flows".to_string(), a.flows.to_string(), "--sockets".into(), a.sockets.to_string()];
    let stack = instructions_per_datagram(&extra, n);
    extra[3] = "64".into();
    let group = instructions_per_datagram(&extra, n);
    let group_args = extra.clone();
    extra.push("--inject-only".into());
    let floor = instructions_per_datagram(&extra, n);
    let mut single_args = group_args.clone();
    single_args[3] = a.sockets.to_string();
    let cycles = cycles_per_datagram(&[single_args, group_args, extra], 1_000_000);
    println!("instructions per datagram (callgrind, {} flows):", a.flows);
    println!("| path | instructions |");
    println!("|---|---|");
    println!("| source + rx_burst + read + free (no stack) | {floor:.1} |");
    println!("| source + spate: RX -> 1 socket -> recv -> read | {stack:.1} |");
    println!("| source + spate: RX -> 64-member reuseport group -> recv -> read | {group:.1} |");
    println!("| spate's own cost, 1 socket | {:.1} |", stack - floor);
    println!("| spate's own cost, 64-member group | {:.1} |", group - floor);
    println!("| 64-member group / 1 socket (whole path; target <= 1.05) | {:.3} |", group / stack);
    println!();
    println!("cycles per datagram (native, median of 5 alternating rounds of 1,000,000):");
    println!("| path | cycles |");
    println!("|---|---|");
    println!("| source + rx_burst + read + free (no stack) | {:.1} |", cycles[2]);
    println!("| source + spate, 1 socket | {:.1} |", cycles[0]);
    println!("| source + spate, 64-member group | {:.1} |", cycles[1]);
    println!("| 64-member group / 1 socket (whole path; target <= 1.05) | {:.3} |", cycles[1] / cycles[0]);
    println!("| spate's own cost, group / 1 socket | {:.3} |", (cycles[1] - cycles[2]) / (cycles[0] - cycles[2]));
    if let Some(path) = json {
        let body = format!(
            "{{\"bench\":\"pipeline\",\"flows\":{},\"floor_ir\":{floor:.1},\"stack_ir\":{stack:.1},\"group64_ir\":{group:.1},\"floor_cycles\":{:.1},\"stack_cycles\":{:.1},\"group64_cycles\":{:.1}}}\n",
            a.flows, cycles[2], cycles[0], cycles[1]
        );
        std::fs::write(path, body).expect("write JSON");
    }
}
