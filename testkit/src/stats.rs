//! Summaries of a benchmark's rounds, written once for every bench.

/// The median of `v` (the upper middle one of an even count); NaN when
/// there are none.
pub fn median(v: &[f64]) -> f64 {
    median_and_spread(v).0
}

/// The median, the least and the most of `v`; NaN each when there are
/// none (a bench asked only for instruction counts runs no rounds).
pub fn median_and_spread(v: &[f64]) -> (f64, f64, f64) {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.as_slice() {
        [] => (f64::NAN, f64::NAN, f64::NAN),
        s => (s[s.len() / 2], s[0], s[s.len() - 1]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_middle_and_the_ends() {
        assert_eq!(median_and_spread(&[3.0, 1.0, 2.0]), (2.0, 1.0, 3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 3.0);
        assert!(median(&[]).is_nan());
    }
}
