//! The layer check of spate-stack: every `crate::` path in `stack/src`
//! names a module of the same layer or of one below it (as
//! `stack/layers.toml` orders them), the modules of an `apart` layer do
//! not import each other, and no modules import each other in a circle.
//!
//! It reads paths, not types: a `crate::` path in code or in a `use`
//! (grouped `use crate::{a, b::{c}}` too), with comments and string
//! literals skipped. A path to an item of the crate root (`crate::Stack`)
//! or a glob of it (`crate::*`) is refused: the root re-exports from every
//! layer, so a module must name the module it means. So is
//! `super::super::`, which could climb out of a module unseen: a path
//! that leaves a module starts with `crate::`.
//!
//! Files are checked too: every `crate::`, `super::` and `self::` path is
//! followed to the file that defines the module it ends in (`super::gro::
//! Flow` from `engine/rx.rs` is `engine/gro.rs`, `super::Worker` is
//! `engine/mod.rs`), and no files may import each other in a circle. A
//! `super::` inside an inline module (`mod tests { use super::*; }`)
//! stays in its file. A module's root naming its own files by a bare
//! path (`gro::Train` in `engine/mod.rs`) is not read: a root declares its
//! files and holds what they add to, so a child's `super::Worker` and its
//! root's `gro::Train` are how a module of several files is made, not a
//! circle. `self::` paths are read, bare paths are not.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::toml_lite::Line;

/// One layer of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    pub name: String,
    pub modules: Vec<String>,
    /// Its modules may not import each other.
    pub apart: bool,
}

/// Reads the layer table: `[[layer]]` sections with `name = "..."`,
/// `modules = ["...", ...]` (on one line) and an optional `apart = true`,
/// top layer first.
pub fn parse_table(text: &str) -> Result<Vec<Layer>, String> {
    let mut layers: Vec<Layer> = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let (key, value) = match crate::toml_lite::line(raw) {
            Line::Blank => continue,
            Line::Table("layer") => {
                layers.push(Layer { name: String::new(), modules: Vec::new(), apart: false });
                continue;
            }
            Line::Table(other) => return Err(format!("line {}: unknown table [[{other}]]", n + 1)),
            Line::Other(l) => return Err(format!("line {}: expected key = value, found {l:?}", n + 1)),
            Line::Pair(k, v) => (k, v),
        };
        let Some(layer) = layers.last_mut() else {
            return Err(format!("line {}: {key:?} before the first [[layer]]", n + 1));
        };
        match key {
            "name" => layer.name = value.trim_matches('"').to_string(),
            "apart" => layer.apart = value == "true",
            "modules" => {
                let inner = value
                    .strip_prefix('[')
                    .and_then(|v| v.strip_suffix(']'))
                    .ok_or_else(|| format!("line {}: modules must be a list on one line", n + 1))?;
                layer.modules = inner
                    .split(',')
                    .map(|m| m.trim().trim_matches('"').to_string())
                    .filter(|m| !m.is_empty())
                    .collect();
            }
            other => return Err(format!("line {}: unknown key {other:?}", n + 1)),
        }
    }
    let mut seen = BTreeSet::new();
    for l in &layers {
        if l.modules.is_empty() {
            return Err(format!("layer {:?} lists no modules", l.name));
        }
        for m in &l.modules {
            if !seen.insert(m.clone()) {
                return Err(format!("module {m} is in two layers"));
            }
        }
    }
    if layers.is_empty() {
        return Err("no [[layer]] in the table".into());
    }
    Ok(layers)
}

/// The source with comments and the contents of string and character
/// literals blanked (newlines kept, so line numbers stay).
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let blank = |c: u8| if c == b'\n' { b'\n' } else { b' ' };
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    out.push(b' ');
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let mut depth = 0;
                while i < b.len() {
                    if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                        depth += 1;
                        out.extend([b' ', b' ']);
                        i += 2;
                    } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                        depth -= 1;
                        out.extend([b' ', b' ']);
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        out.push(blank(b[i]));
                        i += 1;
                    }
                }
            }
            b'r' if matches!(b.get(i + 1), Some(b'"') | Some(b'#')) && !ident_byte(out.last().copied()) => {
                // A raw string: r"..." or r#"..."#.
                let mut j = i + 1;
                let mut hashes = 0;
                while b.get(j) == Some(&b'#') {
                    hashes += 1;
                    j += 1;
                }
                if b.get(j) != Some(&b'"') {
                    out.push(b[i]);
                    i += 1;
                    continue;
                }
                out.extend(std::iter::repeat_n(b' ', j + 1 - i));
                i = j + 1;
                while i < b.len() {
                    if b[i] == b'"' && b[i + 1..].iter().take(hashes).filter(|&&c| c == b'#').count() == hashes {
                        out.extend(std::iter::repeat_n(b' ', hashes + 1));
                        i += hashes + 1;
                        break;
                    }
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
            b'"' => {
                out.push(b' ');
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' && i + 1 < b.len() {
                        out.push(b' ');
                        i += 1;
                    }
                    out.push(blank(b[i]));
                    i += 1;
                }
                out.push(b' ');
                i += 1;
            }
            b'\'' => {
                // A character literal ('a', '\n', '\''), or a lifetime.
                let lit = match (b.get(i + 1), b.get(i + 2), b.get(i + 3)) {
                    (Some(b'\\'), _, _) => b[i + 2..].iter().position(|&c| c == b'\'').map(|p| p + 3),
                    (Some(_), Some(b'\''), _) => Some(3),
                    _ => None,
                };
                match lit {
                    Some(len) => {
                        out.extend(std::iter::repeat_n(b' ', len.min(b.len() - i)));
                        i += len;
                    }
                    None => {
                        out.push(b'\'');
                        i += 1;
                    }
                }
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn ident_byte(c: Option<u8>) -> bool {
    c.is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// The first path segment of every `crate::` path in `code` (stripped),
/// with its line: `crate::a::b` gives `a`; `crate::{a::b, c}` gives `a`
/// and `c`; a glob of the root (`crate::*`, `crate::{*, a}`) gives `*`.
fn crate_paths(code: &str) -> Vec<(usize, String)> {
    let b = code.as_bytes();
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(p) = code[from..].find("crate::") {
        let at = from + p;
        from = at + "crate::".len();
        if ident_byte(at.checked_sub(1).map(|i| b[i])) {
            continue; // `spate_crate::`, not ours
        }
        let line = code[..at].matches('\n').count() + 1;
        for first in use_tree(&code[from..]).into_iter().filter_map(|path| path.into_iter().next()) {
            if !found.contains(&(line, first.clone())) {
                found.push((line, first));
            }
        }
    }
    found
}

/// The top-level module a file of `stack/src` belongs to (`None` for the
/// crate root, `lib.rs`).
fn module_of(relative: &str) -> Option<String> {
    let first = relative.split('/').next()?;
    if relative == "lib.rs" {
        return None;
    }
    Some(first.strip_suffix(".rs").unwrap_or(first).to_string())
}

/// Checks sources (path relative to `stack/src` -> text) against the
/// table; returns every violation, one line each.
pub fn check(layers: &[Layer], files: &BTreeMap<String, String>) -> Vec<String> {
    let mut problems = Vec::new();
    let rank: BTreeMap<&str, usize> =
        layers.iter().enumerate().flat_map(|(i, l)| l.modules.iter().map(move |m| (m.as_str(), i))).collect();
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut modules = BTreeSet::new();
    for (path, src) in files {
        let Some(from) = module_of(path) else { continue };
        modules.insert(from.clone());
        let Some(&from_rank) = rank.get(from.as_str()) else {
            problems.push(format!("{path}: module {from} is in no layer of the table"));
            continue;
        };
        let code = strip(src);
        for (n, l) in code.lines().enumerate() {
            if l.contains("super::super") {
                problems.push(format!("{path}:{}: super::super:: climbs out of a module: name it with crate::", n + 1));
            }
        }
        for (line, to) in crate_paths(&code) {
            let at = format!("{path}:{line}");
            if to == from || to == "self" {
                continue;
            }
            if to == "*" {
                problems.push(format!("{at}: a glob of the crate root (crate::*): name the modules"));
                continue;
            }
            let Some(&to_rank) = rank.get(to.as_str()) else {
                problems.push(format!(
                    "{at}: crate::{to} is no module of the table (an item of the crate root?): name its module"
                ));
                continue;
            };
            if to_rank < from_rank {
                problems.push(format!(
                    "{at}: {from} ({}) imports {to} ({}), a layer above it",
                    layers[from_rank].name, layers[to_rank].name
                ));
            } else if to_rank == from_rank && layers[from_rank].apart {
                problems.push(format!(
                    "{at}: {from} imports {to}: the modules of layer {:?} never import each other",
                    layers[from_rank].name
                ));
            }
            edges.entry(from.clone()).or_default().entry(to).or_insert(at);
        }
    }
    for l in layers {
        for m in &l.modules {
            if !modules.contains(m) {
                problems.push(format!("the table lists {m} (layer {:?}), which stack/src does not have", l.name));
            }
        }
    }
    problems.extend(circles(&edges));
    problems.extend(circles(&file_edges(files)));
    problems
}

/// A file's module path: `engine/rx.rs` is `[engine, rx]`, `engine/mod.rs`
/// is `[engine]`, `lib.rs` is `[]`.
fn module_path(relative: &str) -> Vec<String> {
    let mut parts: Vec<String> = relative.split('/').map(str::to_string).collect();
    let last = parts.pop().unwrap_or_default();
    if last != "mod.rs" && last != "lib.rs" {
        parts.push(last.strip_suffix(".rs").unwrap_or(&last).to_string());
    }
    parts
}

/// The file defining module `path`, if `files` has one.
fn file_of(files: &BTreeMap<String, String>, path: &[String]) -> Option<String> {
    if path.is_empty() {
        return files.contains_key("lib.rs").then(|| "lib.rs".to_string());
    }
    let base = path.join("/");
    [format!("{base}.rs"), format!("{base}/mod.rs")].into_iter().find(|f| files.contains_key(f))
}

/// Every path of a use tree starting at `rest` (just after its first
/// `::`): `a::b` gives `[a, b]`, `{a::b, c}` gives `[a, b]` and `[c]`,
/// `a::*` gives `[a, *]`; `self` adds nothing (`{self, b}` gives `[]` and
/// `[b]`).
fn use_tree(rest: &str) -> Vec<Vec<String>> {
    fn parse(s: &[char], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let mut path = prefix.to_vec();
        loop {
            while *i < s.len() && s[*i].is_whitespace() {
                *i += 1;
            }
            if s.get(*i) == Some(&'{') {
                *i += 1;
                loop {
                    parse(s, i, &path, out);
                    while *i < s.len() && s[*i].is_whitespace() {
                        *i += 1;
                    }
                    match s.get(*i) {
                        Some(',') => *i += 1,
                        Some('}') => {
                            *i += 1;
                            return;
                        }
                        _ => return,
                    }
                    while *i < s.len() && s[*i].is_whitespace() {
                        *i += 1;
                    }
                    if s.get(*i) == Some(&'}') {
                        *i += 1;
                        return;
                    }
                }
            }
            if s.get(*i) == Some(&'*') {
                // A glob: `*` as its last segment.
                *i += 1;
                path.push("*".to_string());
                out.push(path);
                return;
            }
            let word: String = s[*i..].iter().take_while(|c| c.is_alphanumeric() || **c == '_').collect();
            *i += word.chars().count();
            if !word.is_empty() && word != "self" {
                path.push(word);
            }
            if s.get(*i) == Some(&':') && s.get(*i + 1) == Some(&':') {
                *i += 2;
                continue;
            }
            out.push(path);
            return;
        }
    }
    let chars: Vec<char> = rest.chars().take(2_000).collect();
    let mut out = Vec::new();
    parse(&chars, &mut 0, &[], &mut out);
    out
}

/// Where each file's `crate::`, `super::` and `self::` paths lead, file
/// to file (a file's paths to itself left out), with where each is.
fn file_edges(files: &BTreeMap<String, String>) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (path, src) in files {
        let here = module_path(path);
        let code = strip(src);
        let b = code.as_bytes();
        // Inline modules open here: the brace depth each one's body is at.
        let (mut depth, mut inline): (usize, Vec<usize>) = (0, Vec::new());
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'{' => {
                    depth += 1;
                    i += 1;
                    continue;
                }
                b'}' => {
                    if inline.last() == Some(&depth) {
                        inline.pop();
                    }
                    depth = depth.saturating_sub(1);
                    i += 1;
                    continue;
                }
                _ => {}
            }
            let boundary = !ident_byte(i.checked_sub(1).map(|j| b[j])) && (i == 0 || b[i - 1] != b':');
            if boundary && b[i..].starts_with(b"mod ") {
                let rest = code[i + 4..].trim_start();
                let name_len: usize =
                    rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').map(char::len_utf8).sum();
                if rest[name_len..].trim_start().starts_with('{') {
                    inline.push(depth + 1);
                }
            }
            let prefix =
                ["crate::", "super::", "self::"].into_iter().find(|p| boundary && b[i..].starts_with(p.as_bytes()));
            // A visibility (`pub(in crate::setup)`) names a module, imports nothing.
            let visibility = prefix.is_some() && code[..i].trim_end().ends_with("(in");
            let Some(prefix) = prefix.filter(|_| !visibility) else {
                i += 1;
                continue;
            };
            let line = code[..i].matches('\n').count() + 1;
            let mut base: Vec<String> = match prefix {
                "crate::" => Vec::new(),
                _ => here.clone(),
            };
            let mut rest = &code[i + prefix.len()..];
            if prefix == "super::" {
                // Climbing out of inline modules first, then out of files.
                let mut ups: usize = 1;
                while let Some(r) = rest.strip_prefix("super::") {
                    ups += 1;
                    rest = r;
                }
                let out_of_file = ups.saturating_sub(inline.len());
                if out_of_file == 0 {
                    i += prefix.len();
                    continue;
                }
                base.truncate(base.len().saturating_sub(out_of_file));
            }
            for tail in use_tree(rest) {
                let mut full = base.clone();
                let mut target = file_of(files, &full);
                for seg in tail {
                    full.push(seg);
                    match file_of(files, &full) {
                        Some(f) => target = Some(f),
                        None => break,
                    }
                }
                if let Some(t) = target.filter(|t| t != path) {
                    edges.entry(path.clone()).or_default().entry(t).or_insert_with(|| format!("{path}:{line}"));
                }
            }
            i += prefix.len();
        }
    }
    edges
}

/// Every circle among the modules, once each (as the path from its least
/// module round to it again, with where each step imports the next).
fn circles(edges: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<String> {
    let mut found = BTreeSet::new();
    // A depth-first walk from each module; a circle is reported from its
    // least module only, so each appears once.
    for start in edges.keys() {
        let mut stack: Vec<(String, Vec<String>)> = vec![(start.clone(), vec![start.clone()])];
        let mut steps = 0;
        while let Some((node, path)) = stack.pop() {
            steps += 1;
            if steps > 100_000 {
                break; // the module graph is small; this bounds the walk
            }
            for next in edges.get(&node).map(|e| e.keys().cloned().collect::<Vec<_>>()).unwrap_or_default() {
                if next == *start {
                    let mut ring = path.clone();
                    ring.push(next.clone());
                    let where_ = ring
                        .windows(2)
                        .map(|w| format!("{} -> {} ({})", w[0], w[1], edges[&w[0]][&w[1]]))
                        .collect::<Vec<_>>()
                        .join(", ");
                    found.insert(format!("circle: {} [{where_}]", ring.join(" -> ")));
                } else if next > *start && !path.contains(&next) {
                    let mut p = path.clone();
                    p.push(next.clone());
                    stack.push((next, p));
                }
            }
        }
    }
    found.into_iter().collect()
}

/// Every `.rs` file below `src`, by path relative to it.
pub fn read_tree(src: &Path) -> Result<BTreeMap<String, String>, String> {
    let mut files = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(src).map_err(|e| e.to_string())?.to_string_lossy().replace('\\', "/");
                let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
                files.insert(rel, text);
            }
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Vec<Layer> {
        parse_table(
            "[[layer]]\nname = \"top\"\nmodules = [\"setup\"]\n\
             [[layer]]\nname = \"io\"\napart = true\nmodules = [\"engine\", \"socket\"]\n\
             [[layer]]\nname = \"leaves\" # the bottom\nmodules = [\"wire\", \"stats\"]\n",
        )
        .unwrap()
    }

    fn tree(files: &[(&str, &str)]) -> BTreeMap<String, String> {
        let mut t: BTreeMap<String, String> =
            ["setup/mod.rs", "engine/mod.rs", "socket.rs", "wire/mod.rs", "stats.rs", "lib.rs"]
                .iter()
                .map(|p| (p.to_string(), String::new()))
                .collect();
        for (p, s) in files {
            t.insert(p.to_string(), s.to_string());
        }
        t
    }

    #[test]
    fn downward_imports_pass() {
        let t = tree(&[
            ("setup/mod.rs", "use crate::engine::Worker;\nuse crate::{socket::UdpSocket, wire};"),
            ("engine/rx.rs", "use crate::wire::{ipv4, udp};\nfn f() { crate::stats::Counter::A; }"),
            ("wire/mod.rs", "use crate::stats::Counter;"),
            ("lib.rs", "pub use crate::setup::Stack;"),
        ]);
        assert_eq!(check(&table(), &t), Vec::<String>::new());
    }

    #[test]
    fn an_upward_import_fails() {
        let t = tree(&[("wire/ipv4.rs", "fn f() {}\nuse crate::engine::Worker;")]);
        let p = check(&table(), &t);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].starts_with("wire/ipv4.rs:2: wire (leaves) imports engine (io), a layer above"), "{p:?}");
    }

    #[test]
    fn a_grouped_upward_import_fails() {
        let t = tree(&[("stats.rs", "use crate::{\n    wire::MacAddr,\n    setup::{self, Stack},\n};")]);
        let p = check(&table(), &t);
        assert!(p.iter().any(|l| l.contains("stats (leaves) imports setup (top)")), "{p:?}");
    }

    #[test]
    fn apart_modules_may_not_meet() {
        let t = tree(&[("socket.rs", "use crate::engine::LOCAL;")]);
        let p = check(&table(), &t);
        assert!(p.iter().any(|l| l.contains("never import each other")), "{p:?}");
    }

    #[test]
    fn a_circle_fails() {
        let t = tree(&[("wire/mod.rs", "use crate::stats::X;"), ("stats.rs", "use crate::wire::Y;")]);
        let p = check(&table(), &t);
        // The modules' circle, and the files' it is made of.
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].starts_with("circle: stats -> wire -> stats"), "{p:?}");
        assert!(p[1].starts_with("circle: stats.rs -> wire/mod.rs -> stats.rs"), "{p:?}");
    }

    #[test]
    fn comments_strings_and_other_crates_do_not_count() {
        let t = tree(&[(
            "wire/mod.rs",
            "// use crate::setup::X;\n/* crate::engine */\nconst S: &str = \"crate::setup\";\n\
             const R: &str = r#\"crate::engine\"#;\nuse spate_crate::setup;\nconst C: char = '\"';\nfn f<'a>() {}",
        )]);
        assert_eq!(check(&table(), &t), Vec::<String>::new());
    }

    #[test]
    fn root_items_and_unknown_modules_fail() {
        let t = tree(&[("engine/mod.rs", "use crate::Stack;"), ("extra.rs", "")]);
        let p = check(&table(), &t);
        assert!(p.iter().any(|l| l.contains("crate::Stack is no module of the table")), "{p:?}");
        assert!(p.iter().any(|l| l.contains("module extra is in no layer")), "{p:?}");
    }

    #[test]
    fn globs_of_the_root_and_super_super_fail() {
        let t = tree(&[
            ("wire/mod.rs", "use crate::*;"),
            ("stats.rs", "use crate::{*, wire};"),
            ("engine/rx.rs", "mod t {\n    use super::super::super::setup;\n}"),
        ]);
        let p = check(&table(), &t);
        assert_eq!(p.iter().filter(|l| l.contains("a glob of the crate root")).count(), 2, "{p:?}");
        assert!(p.iter().any(|l| l.starts_with("engine/rx.rs:2: super::super::")), "{p:?}");
    }

    #[test]
    fn a_file_circle_through_super_fails() {
        let t = tree(&[
            ("engine/mod.rs", "mod gro;\nmod rx;\npub struct Worker;"),
            ("engine/gro.rs", "use super::rx::UdpInFrame;\nuse super::Worker;"),
            ("engine/rx.rs", "use super::{Worker, gro::Flow};\n#[cfg(test)]\nmod tests {\n    use super::*;\n}"),
        ]);
        let p = check(&table(), &t);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].starts_with("circle: engine/gro.rs -> engine/rx.rs -> engine/gro.rs"), "{p:?}");
    }

    #[test]
    fn globs_in_groups_visibilities_and_odd_names() {
        let t = tree(&[
            ("engine/mod.rs", "mod gro;\nmod rx;\nmod aé { }\npub(in crate::engine) fn f() {}"),
            ("engine/rx.rs", "use super::{gro::*, Worker};"),
            ("engine/gro.rs", "pub(in crate::engine) struct Flow;"),
        ]);
        let e = file_edges(&t);
        assert_eq!(e["engine/rx.rs"].keys().collect::<Vec<_>>(), ["engine/gro.rs", "engine/mod.rs"]);
        assert!(!e.contains_key("engine/gro.rs"), "a visibility is no import: {e:?}");
    }

    #[test]
    fn file_paths_resolve_to_the_defining_file() {
        let t = tree(&[
            ("engine/mod.rs", "mod rx;\nuse self::rx::X;\nfn f() { crate::wire::ipv4::Packet::new(); }"),
            ("engine/rx.rs", "use super::Worker;\nmod inner {\n    use super::super::Worker;\n}"),
            ("wire/ipv4.rs", ""),
        ]);
        let e = file_edges(&t);
        assert_eq!(e["engine/mod.rs"].keys().collect::<Vec<_>>(), ["engine/rx.rs", "wire/ipv4.rs"]);
        assert_eq!(e["engine/rx.rs"].keys().collect::<Vec<_>>(), ["engine/mod.rs"]);
        // engine/mod.rs and engine/rx.rs import each other through self:: and super::.
        assert!(check(&table(), &t).iter().any(|l| l.starts_with("circle: engine/mod.rs -> engine/rx.rs")));
    }

    #[test]
    fn a_listed_module_must_exist() {
        let mut t = tree(&[]);
        t.remove("stats.rs");
        let p = check(&table(), &t);
        assert!(p.iter().any(|l| l.contains("lists stats")), "{p:?}");
    }

    #[test]
    fn the_table_is_checked() {
        assert!(parse_table("name = \"x\"").is_err());
        assert!(
            parse_table("[[layer]]\nname = \"a\"\nmodules = [\"x\"]\n[[layer]]\nname = \"b\"\nmodules = [\"x\"]")
                .is_err()
        );
        assert!(parse_table("[[layer]]\nname = \"a\"\nmodules = []").is_err());
    }
}
