//! Figures as the client's tables print them: counts shortened to three
//! significant digits with a decimal prefix (`12.3k`, `1.23M`), service
//! times from the latency histogram, a dash where there is nothing to
//! show. ASCII only, so that a column's width is its length.

use crate::runtime::latency::upper_bound_us;

/// What a column shows when a figure has no value (a ratio over no
/// requests, spins of a queue nothing polls).
pub(crate) const NONE: &str = "-";

/// `x` in at most five characters: whole below 10 000, then three
/// significant digits and k, M, G, T, P.
pub(crate) fn count(x: f64) -> String {
    if !x.is_finite() || x < 0.0 {
        return NONE.into();
    }
    if x < 9_999.5 {
        return format!("{x:.0}");
    }
    let mut v = x;
    for prefix in ["k", "M", "G", "T", "P"] {
        v /= 1000.0;
        // Below 999.5, so that rounding stays within three digits.
        if v < 999.5 || prefix == "P" {
            let decimals = if v < 9.995 {
                2
            } else if v < 99.95 {
                1
            } else {
                0
            };
            return format!("{v:.decimals$}{prefix}");
        }
    }
    unreachable!("the last prefix returns")
}

/// [`count`] of an integer counter.
pub(crate) fn total(n: u64) -> String {
    // Exact below 10 000; above, three digits are shown.
    count(n as f64)
}

/// Bytes, as [`count`] with a `B`: `4.10kB`, `512B`.
pub(crate) fn bytes(n: u64) -> String {
    format!("{}B", total(n))
}

/// `part / whole` with two decimals, or [`NONE`] over nothing.
pub(crate) fn ratio(part: u64, whole: u64) -> String {
    if whole == 0 {
        return NONE.into();
    }
    let r = part as f64 / whole as f64;
    format!("{r:.2}")
}

/// The mean service time in µs of `requests` that took `sum_ns`, or
/// [`NONE`] for none.
pub(crate) fn mean_us(sum_ns: u64, requests: u64) -> String {
    if requests == 0 {
        return NONE.into();
    }
    let us = sum_ns as f64 / requests as f64 / 1000.0;
    if us < 1000.0 {
        format!("{us:.1}")
    } else {
        count(us)
    }
}

/// The bound of the histogram bucket that holds quantile `q` (0.99: the
/// 99th percentile) of `buckets` (requests per bucket, not cumulative),
/// in µs: the service time at most that many requests took. `inf` for
/// the last bucket, [`NONE`] for no request.
pub(crate) fn quantile_us(buckets: &[u64], q: f64) -> String {
    let n = histogram_count(buckets);
    if n == 0 {
        return NONE.into();
    }
    // The rank of the quantile, 1-based: ceil(q * n), for q in [0, 1]
    // a whole number from 0 to n (a q outside is clamped).
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
    let mut seen: u64 = 0;
    for (i, b) in buckets.iter().enumerate() {
        seen = seen.saturating_add(*b);
        if seen >= rank {
            return upper_bound_us(i).map_or_else(|| "inf".into(), total);
        }
    }
    "inf".into()
}

/// The requests a histogram counts (`buckets`: requests per bucket).
pub(crate) fn histogram_count(buckets: &[u64]) -> u64 {
    buckets.iter().fold(0, |a, b| a.saturating_add(*b))
}

/// `line` cut to `width` characters.
pub(crate) fn clip(line: &str, width: usize) -> &str {
    line.char_indices()
        .nth(width)
        .map_or(line, |(at, _)| &line[..at])
}

/// `name value` pairs on lines of at most `width` characters, the first
/// starting with `head`, the others indented as far.
pub(crate) fn pairs(head: &str, items: &[(String, u64)], width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = head.to_owned();
    let mut first = true;
    for (name, value) in items {
        let item = format!("{name} {value}");
        let sep = if first { "" } else { ", " };
        if !first && line.len() + sep.len() + item.len() > width {
            lines.push(format!("{line},"));
            line = " ".repeat(head.len());
        } else {
            line.push_str(sep);
        }
        line.push_str(&item);
        first = false;
    }
    lines.push(line);
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_keep_three_digits_in_five_characters() {
        for (x, s) in [
            (0.0, "0"),
            (0.4, "0"),
            (999.0, "999"),
            (9999.0, "9999"),
            (9999.6, "10.0k"),
            (12_345.0, "12.3k"),
            (123_456.0, "123k"),
            (999_499.0, "999k"),
            (999_500.0, "1.00M"),
            (1_234_567.0, "1.23M"),
            (4.9e9, "4.90G"),
            (f64::NAN, "-"),
        ] {
            assert_eq!(count(x), s, "{x}");
        }
        assert_eq!(bytes(4096), "4096B");
        assert_eq!(bytes(5_000_000_000), "5.00GB");
    }

    #[test]
    fn ratios_and_means_say_when_there_is_nothing() {
        assert_eq!(ratio(3, 200), "0.01");
        assert_eq!(ratio(400, 200), "2.00");
        assert_eq!(ratio(5, 0), "-");
        assert_eq!(mean_us(3_000, 2), "1.5");
        assert_eq!(mean_us(5_000_000_000, 2), "2.50M");
        assert_eq!(mean_us(0, 0), "-");
    }

    #[test]
    fn a_quantile_is_the_bound_of_its_bucket() {
        let mut b = vec![0; 24];
        b[0] = 98;
        b[3] = 1;
        b[10] = 1;
        assert_eq!(quantile_us(&b, 0.5), "1");
        assert_eq!(quantile_us(&b, 0.99), "8");
        assert_eq!(quantile_us(&b, 1.0), "1024");
        b[23] = 100;
        assert_eq!(quantile_us(&b, 0.99), "inf");
        assert_eq!(quantile_us(&[0; 24], 0.99), "-");
    }

    #[test]
    fn pairs_wrap_under_the_head() {
        let items: Vec<(String, u64)> = (0..6).map(|i| (format!("counter_{i}"), 10)).collect();
        let lines = pairs("  errors: ", &items, 40);
        assert_eq!(lines[0], "  errors: counter_0 10, counter_1 10,");
        assert_eq!(lines[1], "          counter_2 10, counter_3 10,");
        assert!(lines.iter().all(|l| l.len() <= 40));
        assert_eq!(clip("abcdef", 3), "abc");
        assert_eq!(clip("ab", 3), "ab");
    }
}
