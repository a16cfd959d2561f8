//! The instruction budgets of `cargo xtask perf-guard`: reading the
//! measurement the pipeline benchmark prints and the budgets in
//! `perf-budget.toml`, and judging one against the other.

use crate::toml_lite::{Line, line};

/// How far over its budget a path may go before the guard fails.
pub const TOLERANCE: f64 = 0.03;

/// The `perf-guard key=value ...` line of the benchmark's output.
pub fn parse_measured(text: &str) -> Result<Vec<(String, f64)>, String> {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("perf-guard "))
        .ok_or("the pipeline benchmark printed no perf-guard line")?;
    line.split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').ok_or_else(|| format!("bad perf-guard field {kv:?}"))?;
            let v: f64 = v.parse().map_err(|_| format!("bad perf-guard value {kv:?}"))?;
            Ok((k.to_string(), v))
        })
        .collect()
}

/// `key = number` lines (comments after `#` and blank lines skipped).
pub fn parse_budgets(text: &str) -> Result<Vec<(String, f64)>, String> {
    let mut out = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        match line(raw) {
            Line::Blank => {}
            Line::Pair(k, v) => {
                let v: f64 = v.parse().map_err(|_| format!("perf-budget.toml line {}: not a number", n + 1))?;
                out.push((k.to_string(), v));
            }
            _ => return Err(format!("perf-budget.toml line {}: no =", n + 1)),
        }
    }
    Ok(out)
}

/// What the guard found.
#[derive(Debug, Default)]
pub struct Report {
    /// One line per path.
    pub lines: Vec<String>,
    /// The paths over budget by more than the tolerance.
    pub over: Vec<String>,
}

/// Each measured path against its budget; a path without a budget, or a
/// budget without a measurement, is an error.
pub fn judge(budgets: &[(String, f64)], measured: &[(String, f64)]) -> Result<Report, String> {
    let mut r = Report::default();
    for (k, _) in budgets {
        if !measured.iter().any(|(m, _)| m == k) {
            return Err(format!("perf-budget.toml has {k}, which the benchmark does not measure"));
        }
    }
    for (k, v) in measured {
        let b = budgets
            .iter()
            .find(|(b, _)| b == k)
            .map(|(_, b)| *b)
            .ok_or_else(|| format!("perf-budget.toml has no budget for {k}"))?;
        let ratio = v / b;
        let verdict = if ratio > 1.0 + TOLERANCE {
            r.over.push(format!("{k} {v:.1} > {b:.0}"));
            "OVER"
        } else if ratio < 1.0 - TOLERANCE {
            "under: lower the budget (cargo xtask perf-guard --update)"
        } else {
            "ok"
        };
        r.lines.push(format!(
            "{k}: {v:.1} instructions per datagram, budget {b:.0} ({:+.1}%): {verdict}",
            (ratio - 1.0) * 100.0
        ));
    }
    Ok(r)
}

/// The budget file with each budget set to its measurement (rounded up),
/// its comments kept.
pub fn rewrite(text: &str, measured: &[(String, f64)]) -> Result<String, String> {
    let mut out = String::new();
    let mut seen = 0;
    for raw in text.lines() {
        match line(raw) {
            Line::Pair(k, _) => {
                let v = measured.iter().find(|(m, _)| m == k).ok_or_else(|| format!("nothing measured for {k}"))?.1;
                out.push_str(&format!("{k} = {}\n", v.ceil() as u64));
                seen += 1;
            }
            _ => {
                out.push_str(raw);
                out.push('\n');
            }
        }
    }
    if seen != measured.len() {
        return Err("perf-budget.toml does not list every measured path".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUT: &str = "| table |\nperf-guard receive_1_socket=872.4 receive_64_group=1362.1 echo=900.0\n";

    #[test]
    fn within_tolerance_passes_and_over_fails() {
        let m = parse_measured(OUT).unwrap();
        let b =
            parse_budgets("# budgets\nreceive_1_socket = 840 # tight\nreceive_64_group = 1362\necho = 1000\n").unwrap();
        let r = judge(&b, &m).unwrap();
        assert_eq!(r.over, vec!["receive_1_socket 872.4 > 840".to_string()]);
        assert!(r.lines[2].contains("under"), "{:?}", r.lines);
    }

    #[test]
    fn missing_paths_are_errors() {
        let m = parse_measured(OUT).unwrap();
        assert!(judge(&parse_budgets("receive_1_socket = 900").unwrap(), &m).is_err());
        assert!(
            judge(&parse_budgets("receive_1_socket = 900\nreceive_64_group = 1\necho = 1\nother = 3").unwrap(), &m)
                .is_err()
        );
        assert!(parse_measured("no line").is_err());
    }

    #[test]
    fn rewrite_keeps_comments() {
        let m = parse_measured(OUT).unwrap();
        let t = rewrite("# c\nreceive_1_socket = 1\nreceive_64_group = 1 # x\n\necho = 1\n", &m).unwrap();
        assert_eq!(t, "# c\nreceive_1_socket = 873\nreceive_64_group = 1363\n\necho = 900\n");
    }
}
