//! What the figures were measured on: the machine and its load.

use serde::Serialize;

/// What the figures were measured on, and what else was running.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    /// CPU model.
    pub cpu: String,
    /// The machine's CPUs (this process may be pinned to fewer).
    pub cpus: usize,
    /// Kernel release.
    pub kernel: String,
    /// /proc/loadavg before the first run: what else the machine was
    /// doing.
    pub load_average: String,
    /// /proc/loadavg after the last run (the benchmark's own load
    /// included).
    pub load_average_end: Option<String>,
}

/// /proc/loadavg now (empty if unreadable).
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_string()
}

impl Machine {
    /// Reads /proc (before the runs: the load average is the start's).
    pub fn read() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name")
                    .and_then(|r| r.split(':').nth(1))
            })
            .unwrap_or("unknown")
            .trim()
            .to_string();
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string();
        // /proc/cpuinfo lists every CPU, also those a `taskset` keeps
        // this process off.
        let cpus = cpuinfo
            .lines()
            .filter(|l| l.starts_with("processor"))
            .count()
            .max(1);
        Machine {
            cpu,
            cpus,
            kernel,
            load_average: load_average(),
            load_average_end: None,
        }
    }
}
