//! The lines of the small TOML tables xtask reads itself
//! (`stack/layers.toml`, `perf-budget.toml`): xtask builds without
//! dependencies, so it reads them line by line, comments after `#` cut.

/// One line, comment and surrounding space removed.
#[derive(Debug, PartialEq, Eq)]
pub enum Line<'a> {
    /// Nothing (or only a comment).
    Blank,
    /// `[[name]]`.
    Table(&'a str),
    /// `key = value`, both trimmed.
    Pair(&'a str, &'a str),
    /// Anything else.
    Other(&'a str),
}

/// Reads one line.
pub fn line(raw: &str) -> Line<'_> {
    let l = raw.split('#').next().unwrap_or("").trim();
    if l.is_empty() {
        return Line::Blank;
    }
    if let Some(name) = l.strip_prefix("[[").and_then(|r| r.strip_suffix("]]")) {
        return Line::Table(name.trim());
    }
    match l.split_once('=') {
        Some((k, v)) => Line::Pair(k.trim(), v.trim()),
        None => Line::Other(l),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines() {
        assert_eq!(line("  # a comment"), Line::Blank);
        assert_eq!(line("[[layer]] # top"), Line::Table("layer"));
        assert_eq!(line("name = \"setup\"  # why"), Line::Pair("name", "\"setup\""));
        assert_eq!(line("bogus"), Line::Other("bogus"));
    }
}
