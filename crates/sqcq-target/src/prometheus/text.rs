//! The Prometheus text exposition format, version 0.0.4: what a family's
//! `# HELP` and `# TYPE` lines and its samples look like, with label
//! values and help text escaped as the format says.

use std::fmt::{Display, Write};

/// The content type of the format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A metric type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (reset when the daemon restarts).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Cumulative `_bucket{le=...}` samples, `_sum` and `_count`.
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Label pairs, rendered `a="x",b="y"` with values escaped.
#[derive(Clone, Debug, Default)]
pub struct Labels(String);

impl Labels {
    /// Labels with one more pair.
    pub fn with(&self, name: &str, value: impl Display) -> Labels {
        let mut l = self.clone();
        if !l.0.is_empty() {
            l.0.push(',');
        }
        l.0.push_str(name);
        l.0.push_str("=\"");
        escape_into(&mut l.0, &value.to_string(), true);
        l.0.push('"');
        l
    }
}

/// Appends `s` escaped: backslash and line feed always, double quotes in
/// label values.
fn escape_into(out: &mut String, s: &str, quote: bool) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quote => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

/// Writes the `# HELP` and `# TYPE` lines of family `name`; its samples
/// follow, all of them before the next family's lines.
pub fn family(out: &mut String, name: &str, kind: Kind, help: &str) {
    out.push_str("# HELP ");
    out.push_str(name);
    out.push(' ');
    escape_into(out, help, false);
    out.push_str("\n# TYPE ");
    out.push_str(name);
    out.push(' ');
    out.push_str(kind.as_str());
    out.push('\n');
}

/// Writes one sample: `name{labels} value`.
pub fn sample(out: &mut String, name: &str, labels: &Labels, value: impl Display) {
    out.push_str(name);
    if !labels.0.is_empty() {
        out.push('{');
        out.push_str(&labels.0);
        out.push('}');
    }
    // Writing to a String cannot fail.
    let _ = writeln!(out, " {value}");
}

/// Seconds from nanoseconds, for a sample value.
pub fn seconds(ns: u64) -> f64 {
    // Exact below 2^53 ns (104 days), then within a part in 2^53.
    #[allow(clippy::cast_precision_loss)]
    let ns = ns as f64;
    ns / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_and_samples_in_the_text_format() {
        let mut out = String::new();
        family(
            &mut out,
            "x_total",
            Kind::Counter,
            "Things \\ counted\nhere.",
        );
        let l = Labels::default().with("name", "a\"b\\c\nd").with("vq", 2);
        sample(&mut out, "x_total", &l, 7);
        sample(&mut out, "x_total", &Labels::default(), seconds(1_500));
        assert_eq!(
            out,
            "# HELP x_total Things \\\\ counted\\nhere.\n\
             # TYPE x_total counter\n\
             x_total{name=\"a\\\"b\\\\c\\nd\",vq=\"2\"} 7\n\
             x_total 0.0000015\n"
        );
    }
}
