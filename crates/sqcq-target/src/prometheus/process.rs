//! The standard `process_*` families (the names and meanings every
//! Prometheus client library exports, so that the usual dashboards and
//! alerts work unchanged) and `sqcq_build_info`.
//!
//! Read from `/proc/self` at each scrape: `stat` for CPU time, memory,
//! threads and the start time (with `btime` of `/proc/stat`), `limits` for
//! the descriptor limit, the entries of `fd` for the open descriptors.
//! Our own: a few lines of `/proc` parsing, allowed by the seccomp filter
//! (`getdents64` is on its list for this), against a client library
//! whose process collector would bring `procfs` and its own registry.

use crate::prometheus::text::{Kind, Labels, family, sample};

/// The figures of this process at one moment.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProcessFigures {
    /// User and system CPU time, in seconds.
    pub cpu_seconds: f64,
    /// Resident set size, in bytes.
    pub resident_bytes: u64,
    /// Virtual memory size, in bytes.
    pub virtual_bytes: u64,
    /// Threads.
    pub threads: u64,
    /// Start time, in seconds since the Unix epoch.
    pub start_time_seconds: f64,
    /// Open descriptors (`None`: `/proc/self/fd` unreadable).
    pub open_fds: Option<u64>,
    /// The soft limit of open descriptors (`None`: unlimited or unread).
    pub max_fds: Option<u64>,
}

/// The fields of `/proc/PID/stat` after the command name, from `state`
/// (field 3 of proc(5)) on: the name may hold spaces and parentheses, so
/// the fields start after its last `)`.
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_ascii_whitespace().collect())
}

/// `ProcessFigures` from the text of `/proc/self/stat`, `/proc/stat` and
/// `/proc/self/limits`, with the clock tick and page size given.
fn parse(
    stat: &str,
    system_stat: &str,
    limits: &str,
    ticks_per_second: u64,
    page_size: u64,
) -> Option<ProcessFigures> {
    let f = stat_fields(stat)?;
    // proc(5) field n is f[n - 3].
    let field = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
    let ticks = ticks_per_second.max(1) as f64;
    let btime = system_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse::<u64>()
        .ok()?;
    let max_fds = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_ascii_whitespace().nth(3))
        .and_then(|v| v.parse().ok());
    Some(ProcessFigures {
        cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
        threads: field(20)?,
        start_time_seconds: btime as f64 + field(22)? as f64 / ticks,
        virtual_bytes: field(23)?,
        resident_bytes: field(24)?.saturating_mul(page_size),
        open_fds: None,
        max_fds,
    })
}

impl ProcessFigures {
    /// This process's figures now (`None` where `/proc` is not mounted).
    pub fn collect() -> Option<Self> {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        // SAFETY: sysconf() with a valid name has no preconditions.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        // SAFETY: as above.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let mut figures = parse(
            &read("/proc/self/stat")?,
            &read("/proc/stat")?,
            &read("/proc/self/limits").unwrap_or_default(),
            u64::try_from(ticks).ok()?,
            u64::try_from(page).ok()?,
        )?;
        // The directory's own descriptor is among the entries.
        figures.open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| (d.count() as u64).saturating_sub(1));
        Some(figures)
    }

    /// Appends the `process_*` families.
    pub fn render(&self, out: &mut String) {
        let none = Labels::default();
        let mut one = |name: &str, kind: Kind, help: &str, value: f64| {
            family(out, name, kind, help);
            sample(out, name, &none, value);
        };
        one(
            "process_cpu_seconds_total",
            Kind::Counter,
            "Total user and system CPU time spent in seconds.",
            self.cpu_seconds,
        );
        one(
            "process_resident_memory_bytes",
            Kind::Gauge,
            "Resident memory size in bytes.",
            self.resident_bytes as f64,
        );
        one(
            "process_virtual_memory_bytes",
            Kind::Gauge,
            "Virtual memory size in bytes.",
            self.virtual_bytes as f64,
        );
        one(
            "process_threads",
            Kind::Gauge,
            "Number of OS threads in the process.",
            self.threads as f64,
        );
        one(
            "process_start_time_seconds",
            Kind::Gauge,
            "Start time of the process since unix epoch in seconds.",
            self.start_time_seconds,
        );
        if let Some(n) = self.open_fds {
            one(
                "process_open_fds",
                Kind::Gauge,
                "Number of open file descriptors.",
                n as f64,
            );
        }
        if let Some(n) = self.max_fds {
            one(
                "process_max_fds",
                Kind::Gauge,
                "Maximum number of open file descriptors.",
                n as f64,
            );
        }
    }
}

/// Appends `sqcq_build_info`: 1, with the version and the cargo features
/// built in as labels.
pub fn render_build_info(out: &mut String) {
    const NAME: &str = "sqcq_build_info";
    let features: Vec<&str> = [
        ("rbd", cfg!(feature = "rbd")),
        ("fault-injection", cfg!(feature = "fault-injection")),
    ]
    .iter()
    .filter(|(_, on)| *on)
    .map(|(f, _)| *f)
    .collect();
    family(
        out,
        NAME,
        Kind::Gauge,
        "1, with the version of sqcqd and the features it was built with as labels.",
    );
    let labels = Labels::default()
        .with("version", env!("CARGO_PKG_VERSION"))
        .with("features", features.join(","));
    sample(out, NAME, &labels, 1);
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (sqcqd (x) y) S 1 4242 4242 0 -1 4194560 1234 0 0 0 \
                        250 150 0 0 20 0 7 0 12345 104857600 2560 18446744073709551615 \
                        1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0";

    #[test]
    fn the_stat_line_is_read_by_field_number() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n";
        let f = parse(STAT, "cpu  1 2 3\nbtime 1700000000\n", limits, 100, 4096).unwrap();
        assert_eq!(f.cpu_seconds, 4.0, "(250 + 150) ticks at 100 Hz");
        assert_eq!(f.threads, 7);
        assert_eq!(f.start_time_seconds, 1_700_000_123.45);
        assert_eq!(f.virtual_bytes, 104_857_600);
        assert_eq!(f.resident_bytes, 2560 * 4096);
        assert_eq!(f.max_fds, Some(1024));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        let f = parse(STAT, "btime 1\n", unlimited, 100, 4096).unwrap();
        assert_eq!(f.max_fds, None);
        assert!(parse(STAT, "no btime\n", limits, 100, 4096).is_none());
        assert!(parse("4242 (truncated", "btime 1\n", limits, 100, 4096).is_none());
    }

    #[test]
    fn this_process_is_read() {
        let f = ProcessFigures::collect().expect("/proc is mounted here");
        assert!(f.threads >= 1);
        assert!(f.resident_bytes > 0);
        assert!(f.open_fds.is_some_and(|n| n >= 3), "{f:?}");
        let mut out = String::new();
        f.render(&mut out);
        render_build_info(&mut out);
        assert!(
            out.contains("# TYPE process_cpu_seconds_total counter\n"),
            "{out}"
        );
        assert!(out.contains(concat!(
            "sqcq_build_info{version=\"",
            env!("CARGO_PKG_VERSION"),
            "\""
        )));
    }
}
