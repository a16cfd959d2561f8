//! The tables the benchmark prints from several runs: the capture's, the
//! perf-guard paths', fragments', lcore scaling and the GRO stage's.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::measure::{
    Run, callgrind, cycles_per_datagram, instructions_of, instructions_per_datagram, lcore_instructions_per_datagram,
    native, no_gro_stage_build,
};

/// Echo of 64-byte datagrams with no capture and with one attached:
/// the lcore's instructions per datagram (callgrind, its thread alone,
/// less the echo's floor) and cycles per datagram natively, the two
/// taking turns.
pub(crate) fn capture_table(json: Option<String>) {
    let n = 10_000;
    let base: Vec<String> = ["--echo", "64", "--flows", "16"].map(String::from).to_vec();
    let with = |extra: &str| -> Vec<String> {
        let mut v = base.clone();
        v.push(extra.into());
        v
    };
    // The lcore's thread alone: the capture's writer is another.
    let floor = lcore_instructions_per_datagram(&with("--inject-only"), n);
    let none = lcore_instructions_per_datagram(&base, n) - floor;
    let attached = lcore_instructions_per_datagram(&with("--capture"), n) - floor;
    let cycles = cycles_per_datagram(&[base.clone(), with("--capture")], 300_000);
    println!("CPU: {}", spate_testkit::cpu_model());
    println!("Echo of 64-byte datagrams (16 flows): a request and its reply captured per datagram, snap length 128");
    println!("| capture | the lcore's own instructions per datagram | cycles per datagram |");
    println!("|---|---|---|");
    println!("| none | {none:.1} | {:.1} |", cycles[0]);
    println!("| attached | {attached:.1} | {:.1} |", cycles[1]);
    println!("| attached less none | {:.1} | {:.1} |", attached - none, cycles[1] - cycles[0]);
    if let Some(path) = json {
        let body = serde_json::json!({
            "bench": "pipeline-capture", "cpu": spate_testkit::cpu_model(), "floor": floor,
            "none": none, "attached": attached, "cycles_none": cycles[0], "cycles_attached": cycles[1],
        });
        std::fs::write(path, body.to_string()).expect("write JSON");
    }
}

/// What `cargo xtask perf-guard` holds to its budget: spate's own
/// instructions per datagram (the path minus its floor), 16 flows of
/// 64-byte datagrams, on small runs. Prints one `perf-guard` line.
pub(crate) fn guard(json: Option<String>) {
    let n = 10_000;
    let args = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = ["--flows", "16"].map(String::from).to_vec();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let floor = instructions_per_datagram(&args(&["--inject-only"]), n);
    let one = instructions_per_datagram(&args(&["--sockets", "1"]), n) - floor;
    let group = instructions_per_datagram(&args(&["--sockets", "64"]), n) - floor;
    // The group where the port gives an RSS hash (a NIC with RSS; net_ring
    // gives none, so the frames above make spate hash in software), on
    // its own floor: the source's stores of the hash are the source's.
    let rss_floor = instructions_per_datagram(&args(&["--inject-only", "--rss-hash"]), n);
    let group_rss = instructions_per_datagram(&args(&["--sockets", "64", "--rss-hash"]), n) - rss_floor;
    // The same group read through its receive queues, as threads read.
    let queued = instructions_per_datagram(&args(&["--sockets", "64", "--queued"]), n) - floor;
    let echo_floor = instructions_per_datagram(&args(&["--echo", "64", "--inject-only"]), n);
    let echo = instructions_per_datagram(&args(&["--echo", "64"]), n) - echo_floor;
    // One datagram per loop iteration: what every iteration costs besides
    // its datagrams, paid by each one when the stream is thin.
    let thin_floor = instructions_per_datagram(&args(&["--echo", "64", "--inject-only", "--burst", "1"]), n);
    let thin = instructions_per_datagram(&args(&["--echo", "64", "--burst", "1"]), n) - thin_floor;
    println!("spate's own instructions per datagram (callgrind, 16 flows, 64 bytes, {n} and {} datagrams):", 2 * n);
    println!("| path | floor | spate's own |");
    println!("|---|---|---|");
    println!("| receive, 1 socket | {floor:.1} | {one:.1} |");
    println!("| receive, 64-member group | {floor:.1} | {group:.1} |");
    println!("| receive, 64-member group, the port's RSS hash | {rss_floor:.1} | {group_rss:.1} |");
    println!("| receive, 64-member group, read through the queues | {floor:.1} | {queued:.1} |");
    println!("| echo (reply in the request's mbuf) | {echo_floor:.1} | {echo:.1} |");
    println!("| echo, one datagram per loop iteration | {thin_floor:.1} | {thin:.1} |");
    println!(
        "perf-guard receive_1_socket={one:.1} receive_64_group={group:.1} receive_64_group_rss={group_rss:.1} \
         receive_64_group_queued={queued:.1} echo={echo:.1} echo_burst_1={thin:.1}"
    );
    if let Some(path) = json {
        let body = serde_json::json!({
            "bench": "pipeline-guard", "floor": floor, "receive_1_socket": one,
            "receive_64_group": group, "receive_64_group_rss_floor": rss_floor, "receive_64_group_rss": group_rss,
            "receive_64_group_queued": queued, "echo_floor": echo_floor, "echo": echo,
            "echo_burst_1_floor": thin_floor, "echo_burst_1": thin,
        });
        std::fs::write(path, body.to_string()).expect("write JSON");
    }
}

/// 2,000-byte datagrams (two fragments each way) against 1,400-byte ones
/// through the echo service, natively.
pub(crate) fn frag_table(json: Option<String>) {
    let runs = native(
        &[
            ["--echo", "1400", "--flows", "16"].map(String::from).to_vec(),
            ["--echo", "2000", "--flows", "16"].map(String::from).to_vec(),
        ],
        300_000,
    );
    let (small, large) = (runs[0], runs[1]);
    let rate = |r: &Run| r.per_second(r.datagrams);
    // `calls` carries the payload bytes echoed in this mode.
    let gbit = |r: &Run| r.per_second(r.calls) * 8.0 / 1e9;
    println!("Echo through spate, one lcore, net_ring wire (native, median of 5 alternating rounds of 300,000):");
    println!("| datagrams | echoed/s | payload Gbit/s each way | frames per datagram each way |");
    println!("|---|---|---|---|");
    println!("| 1,400 bytes | {:.3} M | {:.2} | 1 |", rate(&small) / 1e6, gbit(&small));
    println!("| 2,000 bytes (reassembled, reply fragmented) | {:.3} M | {:.2} | 2 |", rate(&large) / 1e6, gbit(&large));
    println!("| 2,000 / 1,400 | {:.3} | {:.3} | 2 |", rate(&large) / rate(&small), gbit(&large) / gbit(&small));
    if let Some(path) = json {
        let body = serde_json::json!({
            "bench": "pipeline-frag",
            "echo1400_per_s": rate(&small), "echo2000_per_s": rate(&large),
            "echo1400_gbit": gbit(&small), "echo2000_gbit": gbit(&large),
        });
        std::fs::write(path, body.to_string()).expect("write JSON");
    }
}

/// One lcore against two with software RSS, and the model of how it
/// scales. Natively, busy cycles per datagram with the benchmark's own
/// source timed and taken out (a real RX lcore has none), the steering
/// timed around it on the RX lcore; under callgrind, the same parts in
/// instructions, function by function (the threads' totals would count
/// their idle polls, which depend on how valgrind interleaves them). The
/// prediction for 1 to 16 lcores is printed beside the measurements.
pub(crate) fn scale_table(json: Option<String>) {
    let n = 1_000_000;
    let runs = native(
        &[
            ["--flows", "16"].map(String::from).to_vec(),
            ["--flows", "16", "--lcores", "2"].map(String::from).to_vec(),
            ["--flows", "16", "--inject-only"].map(String::from).to_vec(),
        ],
        n,
    );
    let (one, two, floor) = (runs[0], runs[1], runs[2]);
    let hz = one.hz;
    let per = |r: &Run, x: f64| x / r.datagrams;
    let source = per(&one, one.source);
    let c1 = per(&one, one.busy[0] - one.source); // one lcore: rx_burst, the stack, read, free
    let f = per(&floor, floor.cycles - floor.source); // rx_burst + read + free, no stack
    let p = c1 - f; // the stack's own work
    let b0 = per(&two, two.busy[0] - two.source); // the RX lcore at 2
    let s = per(&two, two.steer); // every frame of the stream passes the steering
    let local = 1.0 - two.handed / two.datagrams; // the RX lcore's own share of the stream
    let r = b0 - c1 * local; // what the RX lcore does beyond its own datagrams
    let q = two.busy[1] / two.handed.max(1.0); // a handed datagram on its owner
    println!(
        "Scaling: one lcore against two with software RSS (net_ring wire, 16 flows, 64-byte frames; busy cycles, the benchmark's source timed and taken out; median of 5 alternating rounds of 1,000,000):"
    );
    println!("| measured | cycles |");
    println!("|---|---|");
    println!("| the benchmark's source, per datagram (taken out of every lcore figure) | {source:.1} |");
    println!("| 1 lcore, per datagram (C1) | {c1:.1} |");
    println!("| rx_burst + read + free, no stack (F) | {f:.1} |");
    println!("| the stack's own work, C1 - F (p) | {p:.1} |");
    println!("| 2 lcores: the RX lcore, per datagram of the stream (B0) | {b0:.1} |");
    println!("| the RX lcore's steering per frame, timed around it (s) | {s:.1} |");
    println!(
        "| the RX lcore's part beyond its own {:.0}% of the datagrams, B0 - C1 x {local:.2} (r) | {r:.1} |",
        local * 100.0
    );
    println!("| a handed-over datagram on its owner, its busy cycles / datagrams handed (q) | {q:.1} |");
    println!("| the owner's extra for a handed-over datagram, q - C1 | {:.1} |", q - c1);
    let moved = line_move_cycles(0, 1);
    if let Some(m) = moved {
        println!(
            "| a cache line written on CPU 0 and read on CPU 1 (the lcores' CPUs; ping-pong, a round trip halved, median of 7); q - C1 in such moves | {m:.1}; {:.1} |",
            (q - c1) / m
        );
    }
    println!();
    // An application that spends W cycles on each datagram (on the lcore
    // owning its flow) adds W to every term that processes datagrams.
    const W: f64 = 1000.0;
    println!(
        "Model (busiest lcore: software RSS max(r + (C1 + W)/N, (q + W)/N); hardware RSS (C1 + W)/N, no hand-off; W = 0 \
         as measured, and W = {W} cycles of application work per datagram):"
    );
    println!(
        "| lcores | software RSS Mpps | busiest lcore | hardware RSS Mpps | one lcore = 1.00: sw / hw | W = {W}: sw / hw |"
    );
    println!("|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    let busiest = |nf: f64, w: f64| {
        if nf == 1.0 {
            return (c1 + w, "the one");
        }
        let (rx, other) = (r + (c1 + w) / nf, (q + w) / nf);
        if rx >= other { (rx, "RX lcore") } else { (other, "owners") }
    };
    for lcores in [1usize, 2, 4, 8, 16] {
        let nf = lcores as f64;
        let (sw, who) = busiest(nf, 0.0);
        let (sw_w, _) = busiest(nf, W);
        let hw = c1 / nf;
        println!(
            "| {lcores} | {:.2} | {who} | {:.2} | {:.2} / {:.2} | {:.2} / {:.2} |",
            hz / sw / 1e6,
            hz / hw / 1e6,
            c1 / sw,
            c1 / hw,
            (c1 + W) / sw_w,
            nf
        );
        rows.push(serde_json::json!({
            "lcores": lcores, "sw_mpps": hz / sw / 1e6, "hw_mpps": hz / hw / 1e6, "sw_w1000_speedup": (c1 + W) / sw_w,
        }));
    }
    println!(
        "measured at 2 lcores (wall, the source on the RX lcore): {:.2} Mpps against {:.2} with one",
        two.per_second(two.datagrams) / 1e6,
        one.per_second(one.datagrams) / 1e6
    );
    println!();
    let counted = scale_instructions();
    if let Some(path) = json {
        let mut body = serde_json::json!({
            "bench": "pipeline-scale", "source": source, "c1": c1, "floor": f, "p": p, "b0": b0, "s": s, "r": r,
            "q": q, "line_move": moved, "rows": rows,
        });
        if let Some((steer, handed, local)) = counted {
            body["instructions"] = serde_json::json!({"steer": steer, "handed": handed, "local": local});
        }
        std::fs::write(path, body.to_string()).expect("write JSON");
    }
}

/// TSC cycles for a cache line written on CPU `a` to be read on CPU `b`:
/// the median of seven exchanges (a vCPU descheduled mid-exchange makes
/// one read several times the rest). See [`line_move_once`].
pub(crate) fn line_move_cycles(a: usize, b: usize) -> Option<f64> {
    let moves = (0..7).map(|_| line_move_once(a, b)).collect::<Option<Vec<f64>>>()?;
    Some(spate_testkit::stats::median(&moves))
}

/// One exchange for [`line_move_cycles`]: two threads pinned to `a` and
/// `b` pass a counter back and forth through one line, and a round trip
/// is two moves. The price every line a hand-off touches pays (the
/// frame's mbuf header and data, the ring's slots); None when a thread
/// cannot be pinned or the other stalls.
pub(crate) fn line_move_once(a: usize, b: usize) -> Option<f64> {
    #[repr(align(128))]
    struct Line(AtomicU64);
    const ROUNDS: u64 = 50_000;
    let line = Line(AtomicU64::new(0));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    // Waits for the counter to reach `want`; false past the deadline.
    let wait = |want: u64| {
        let mut spins = 0u64;
        while line.0.load(Ordering::Acquire) != want {
            spins += 1;
            if spins.is_multiple_of(1 << 20) && std::time::Instant::now() > deadline {
                return false;
            }
            std::hint::spin_loop();
        }
        true
    };
    // Each side waits for its turn's value and writes the next; the first
    // side times the whole exchange.
    let side = |cpu: usize, odd: u64| {
        spate_testkit::pin_to_cpu(cpu).ok()?;
        let start = spate::dpdk::lcore::tsc();
        for i in 0..ROUNDS {
            if !wait(2 * i + odd) {
                return None;
            }
            line.0.store(2 * i + odd + 1, Ordering::Release);
        }
        Some(spate::dpdk::lcore::tsc() - start)
    };
    // Both sides on threads of their own: pinning the caller would pin
    // everything the benchmark starts after it.
    let (first, _) = std::thread::scope(|s| {
        let other = s.spawn(|| side(b, 1));
        let first = s.spawn(|| side(a, 0)).join().ok().flatten();
        (first, other.join().ok().flatten())
    });
    Some(first? as f64 / ROUNDS as f64 / 2.0)
}

/// The scale table's parts in instructions: the RX lcore's steering per
/// frame, a handed frame through the owner's pipeline, and a local frame
/// through the same pipeline on the RX lcore. Each is one function's
/// inclusive count under callgrind (`--toggle-collect`), from runs of N
/// and 2N datagrams, idle lcores yielding (`--yield-idle`): valgrind runs
/// one thread at a time, and the source's window keeps the ring to the
/// other lcore from overflowing (without it the frees of the dropped
/// frames counted as steering). A run that dropped anything fails.
pub(crate) fn scale_instructions() -> Option<(f64, f64, f64)> {
    if Command::new("valgrind").arg("--version").output().is_err() {
        println!("(valgrind missing: the instruction counts are left out; apt-get install valgrind)");
        return None;
    }
    let n = 20_000u64;
    let me = std::env::current_exe().expect("own path");
    // (instructions inside `function`, frames handed) of a
    // run; with `from`, only its calls from that function.
    let extra = ["--flows", "16", "--lcores", "2", "--yield-idle"].map(String::from);
    let toggled = |function: &str, from: Option<&str>, datagrams: u64| -> (f64, f64) {
        let out = PathBuf::from(format!("/tmp/spate-callgrind-scale-{}-{datagrams}.out", std::process::id()));
        let toggle = [format!("--toggle-collect=*{function}*")];
        let run = callgrind(&out, &toggle, &me, &extra, datagrams).output().expect("valgrind");
        assert!(run.status.success(), "callgrind run failed: {}", String::from_utf8_lossy(&run.stderr));
        let v: Vec<f64> =
            String::from_utf8_lossy(&run.stdout).split_whitespace().filter_map(|w| w.parse().ok()).collect();
        // With `from`, the callers above each function (`< caller (Nx)`).
        let mut annotate = Command::new("callgrind_annotate");
        annotate.args(["--inclusive=yes", "--threshold=100"]).args(from.map(|_| "--tree=caller")).arg(&out);
        let text = String::from_utf8_lossy(&annotate.output().expect("callgrind_annotate").stdout).into_owned();
        let _ = std::fs::remove_file(&out);
        let count = |line: &str| -> f64 {
            line.split_whitespace().next().map_or(0.0, |c| c.replace(',', "").parse().unwrap_or(0.0))
        };
        let total = match from {
            Some(caller) => {
                let line = text.lines().find(|l| l.contains("  < ") && l.contains(&format!("::{caller} (")));
                count(line.unwrap_or_else(|| panic!("no call of {function} from {caller} in:\n{text}")))
            }
            None => text.lines().find(|l| l.contains("PROGRAM TOTALS")).map_or(0.0, count),
        };
        assert_eq!(v.get(7).copied(), Some(0.0), "frames dropped on the way: {v:?}");
        (total, v.get(6).copied().unwrap_or(0.0))
    };
    let diff = |function: &str, from: Option<&str>| {
        let (a, ha) = toggled(function, from, n);
        let (b, hb) = toggled(function, from, 2 * n);
        (b - a, hb - ha)
    };
    let (steer, _) = diff("steer_burst", None);
    let (handed, frames) = diff("rx_handed_frames", None);
    // The RX lcore's own frames: receive_burst called from its loop (poll_rx is
    // inlined there), in the same run, on the same reuseport group.
    let (local, _) = diff("receive_burst", Some("run"));
    let (steer, handed, local) = (steer / n as f64, handed / frames.max(1.0), local / (n as f64 - frames).max(1.0));
    println!(
        "The same parts in instructions (callgrind, one function's inclusive count, {n} and {} datagrams):",
        2 * n
    );
    println!("| counted | instructions |");
    println!("|---|---|");
    println!("| the RX lcore's steering per frame (steer_burst) | {steer:.1} |");
    println!("| a handed-over frame through its owner's pipeline (rx_handed_frames) | {handed:.1} |");
    println!("| a local frame through the same pipeline, on the RX lcore (receive_burst) | {local:.1} |");
    println!("| the owner's extra instructions for a handed-over frame | {:.1} |", handed - local);
    Some((steer, handed, local))
}

/// The GRO stage's table: its idle cost, a registered tunnel's cost, GRO
/// against plain delivery, GSO against one send per datagram.
pub(crate) fn gro_table(json: Option<String>) {
    let n = 20_000;
    let base: Vec<String> = ["--flows", "16"].map(String::from).to_vec();
    let stage_idle = instructions_per_datagram(&base, n);
    let no_stage = instructions_of(&no_gro_stage_build(), &base, n);
    let mut tunnel_args = base.clone();
    tunnel_args.push("--tunnel".into());
    let tunnel = instructions_per_datagram(&tunnel_args, n);
    // One flow of equal datagrams (trains as long as a burst), taken one
    // datagram per call as Linux's recvmsg gives them.
    let train: Vec<String> = ["--flows", "1", "--one-by-one"].map(String::from).to_vec();
    let mut gro_args = train.clone();
    gro_args.push("--gro".into());
    let send: Vec<String> = ["--send", "1000"].map(String::from).to_vec();
    let mut gso_args = send.clone();
    gso_args.push("--gso".into());
    let runs = native(&[train, gro_args, send, gso_args], 1_000_000);
    let (plain, gro, one, gso) = (runs[0], runs[1], runs[2], runs[3]);
    println!("GRO stage and UDP GRO/GSO (instructions: callgrind, 16 flows; rates: native, median of 5 rounds)");
    println!("| comparison | measured | ratio | target |");
    println!("|---|---|---|---|");
    println!(
        "| no tunnel registered vs built without the stage | {stage_idle:.1} vs {no_stage:.1} instructions/datagram | {:.4} | <= 1.01 |",
        stage_idle / no_stage
    );
    println!(
        "| a tunnel registered (traffic not for it) vs none | {tunnel:.1} vs {stage_idle:.1} instructions/datagram | {:.4} | report (Linux: about 1.11) |",
        tunnel / stage_idle
    );
    println!(
        "| GRO socket vs plain socket, trains of one flow: datagrams/s to the app | {:.2} vs {:.2} M | {:.3} | report |",
        gro.per_second(gro.datagrams) / 1e6,
        plain.per_second(plain.datagrams) / 1e6,
        gro.per_second(gro.datagrams) / plain.per_second(plain.datagrams)
    );
    println!(
        "| GRO socket vs plain socket: receive calls/s | {:.0} vs {:.0} | {:.3} | report (Linux: 769,065 -> 24,877) |",
        gro.per_second(gro.calls),
        plain.per_second(plain.calls),
        gro.per_second(gro.calls) / plain.per_second(plain.calls)
    );
    println!(
        "| GSO send (64 x 1000 B per call) vs one datagram per call: datagrams/s on the wire | {:.2} vs {:.2} M | {:.3} | report |",
        gso.per_second(gso.datagrams) / 1e6,
        one.per_second(one.datagrams) / 1e6,
        gso.per_second(gso.datagrams) / one.per_second(one.datagrams)
    );
    println!(
        "| GSO vs one per call: send calls/s | {:.0} vs {:.0} | {:.4} | report |",
        gso.per_second(gso.calls),
        one.per_second(one.calls),
        gso.per_second(gso.calls) / one.per_second(one.calls)
    );
    if let Some(path) = json {
        let body = serde_json::json!({
            "bench": "pipeline-gro",
            "stage_idle_ir": stage_idle, "no_stage_ir": no_stage, "tunnel_ir": tunnel,
            "plain_dgrams_per_s": plain.per_second(plain.datagrams), "gro_dgrams_per_s": gro.per_second(gro.datagrams),
            "plain_calls_per_s": plain.per_second(plain.calls), "gro_calls_per_s": gro.per_second(gro.calls),
            "one_dgrams_per_s": one.per_second(one.datagrams), "gso_dgrams_per_s": gso.per_second(gso.datagrams),
        });
        std::fs::write(path, body.to_string()).expect("write JSON");
    }
}
