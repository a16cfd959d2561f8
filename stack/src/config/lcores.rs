//! Lcore lists in EAL `-l` syntax.

use crate::error::{Error, Result};

/// Parses EAL `-l` syntax (`0`, `0-2`, `0,2,4-5`) into sorted lcore ids.
pub fn parse_lcores(list: &str) -> Result<Vec<u32>> {
    parse_list(list, 128)
}

/// Parses `0`, `0-2`, `0,2,4-5` into sorted ids below `max`.
fn parse_list(list: &str, max: u32) -> Result<Vec<u32>> {
    let bad = || Error::Config(format!("lcore list {list:?} is not like 0, 0-1 or 0,2-3"));
    let mut out = Vec::new();
    for part in list.split(',') {
        let part = part.trim();
        if let Some((a, b)) = part.split_once('-') {
            let (a, b): (u32, u32) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
            if a > b || b >= max {
                return Err(bad());
            }
            out.extend(a..=b);
        } else {
            let v: u32 = part.parse().map_err(|_| bad())?;
            if v >= max {
                return Err(bad());
            }
            out.push(v);
        }
    }
    out.sort_unstable();
    out.dedup();
    if out.is_empty() {
        return Err(bad());
    }
    Ok(out)
}

/// The lcore ids of a stack's `lcores`: EAL `-l` syntax, or EAL
/// `--lcores` syntax where lcores take CPU sets (`1@(0-1)`, `1@0`,
/// `(1-2)@(0-3)`; a group of lcores shares the set). Each lcore once.
pub fn lcore_ids(spec: &str) -> Result<Vec<u32>> {
    if !spec.contains(['@', '(']) {
        return parse_lcores(spec);
    }
    let bad = |why: &str| Error::Config(format!("lcores {spec:?}: {why} (like 1, 0-1, 1@(0-1) or (1-2)@(0-3))"));
    // Elements split at the commas outside parentheses.
    let mut elements = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in spec.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                elements.push(&spec[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(bad("unbalanced or nested parentheses"));
        }
    }
    if depth != 0 {
        return Err(bad("unbalanced parentheses"));
    }
    elements.push(&spec[start..]);
    // Lcore ids below 128 (RTE_MAX_LCORE), CPUs below 1024 (CPU_SETSIZE).
    let group = |g: &str, max: u32| -> Result<Vec<u32>> {
        let g = g.trim();
        match g.strip_prefix('(').and_then(|g| g.strip_suffix(')')) {
            Some(inner) => parse_list(inner, max),
            None if g.contains(',') => Err(bad("a list needs parentheses")),
            None => parse_list(g, max),
        }
    };
    let mut out = Vec::new();
    for e in elements {
        let (ids, cpus) = match e.split_once('@') {
            Some((ids, cpus)) => (ids, Some(cpus)),
            None => (e, None),
        };
        let ids = group(ids, 128).map_err(|_| bad(&format!("{ids:?} is not an lcore or a group of them")))?;
        if let Some(cpus) = cpus {
            group(cpus, 1024).map_err(|_| bad(&format!("{cpus:?} is not a CPU or a set of them")))?;
        }
        for id in ids {
            if out.contains(&id) {
                return Err(bad(&format!("lcore {id} is given twice")));
            }
            out.push(id);
        }
    }
    out.sort_unstable();
    Ok(out)
}
