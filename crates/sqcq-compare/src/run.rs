//! One run of `sqcq-bench` and the figures taken from its fio-style JSON.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use thiserror::Error;

/// Why a run produced no figures.
#[derive(Debug, Error)]
pub enum RunError {
    /// The load generator could not be found.
    #[error(
        "sqcq-bench not found next to {0}; build it with `cargo build --release -p sqcq-bench` or pass --bench"
    )]
    NoBench(PathBuf),
    /// The load generator could not be started.
    #[error("cannot start {path}")]
    Spawn {
        /// The program.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// It exited non-zero.
    #[error("sqcq-bench failed ({status}): {stderr}")]
    Failed {
        /// Exit status.
        status: std::process::ExitStatus,
        /// The last lines of its standard error.
        stderr: String,
    },
    /// Its output is not the JSON expected.
    #[error("unreadable sqcq-bench output: {0}")]
    Output(String),
}

/// `sqcq-bench` next to this executable.
pub fn default_bench() -> Result<PathBuf, RunError> {
    let me = std::env::current_exe().unwrap_or_default();
    let path = me.with_file_name("sqcq-bench");
    if path.is_file() {
        Ok(path)
    } else {
        Err(RunError::NoBench(me))
    }
}

/// One cell of the matrix: everything but the mode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Cell {
    /// The device type (`scsi` or `blk`).
    pub device: String,
    /// The target `sqcq-bench` starts (`sqcqd`, `vhost-device-scsi`,
    /// `qemu-storage-daemon`).
    pub target: String,
    /// I/O pattern.
    pub rw: String,
    /// Queue depth per job.
    pub qd: u32,
    /// Jobs over all devices, each on its own request queue.
    pub jobs: u32,
    /// Devices of the target, driven at once.
    pub device_count: u32,
    /// Request queues (jobs) per device.
    pub queues: u32,
    /// Worker threads of sqcqd (`None` for the public peers, which have
    /// no such option).
    pub workers: Option<u16>,
}

impl Cell {
    /// The row label, in the RFC's words (the target only when not ours,
    /// the device type only when not SCSI), then the devices (`D2`) when
    /// several and sqcqd's workers (`W2`) when not one.
    pub fn label(&self) -> String {
        let target = if self.target == "sqcqd" {
            String::new()
        } else {
            format!("{} ", self.target)
        };
        let device = if self.device == "scsi" {
            String::new()
        } else {
            format!("{} ", self.device)
        };
        let devices = if self.device_count > 1 {
            format!(" D{}", self.device_count)
        } else {
            String::new()
        };
        let workers = match self.workers {
            Some(w) if w != 1 => format!(" W{w}"),
            _ => String::new(),
        };
        format!(
            "{target}{device}{} QD{} NJ{}{devices}{workers}",
            self.rw, self.qd, self.jobs
        )
    }

    /// The same cell with another worker count.
    pub fn with_workers(&self, workers: Option<u16>) -> Cell {
        Cell {
            workers,
            ..self.clone()
        }
    }
}

/// One cell of the matrix in one mode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Case {
    /// The cell.
    #[serde(flatten)]
    pub cell: Cell,
    /// Notification mode.
    pub mode: String,
}

/// What one run measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Figures {
    /// I/Os per second over all jobs.
    pub iops: f64,
    /// Median completion latency, averaged over jobs, in microseconds.
    pub p50_us: f64,
    /// 99th percentile latency, averaged over jobs, in microseconds.
    pub p99_us: f64,
    /// Kicks per I/O.
    pub kicks_per_io: f64,
    /// Calls per I/O.
    pub calls_per_io: f64,
    /// Driver-side CPU microseconds per I/O.
    pub driver_cpu_us: f64,
    /// Target-side CPU microseconds per I/O.
    pub target_cpu_us: f64,
    /// The mode the bench actually ran (differs after a fallback).
    pub mode_run: String,
    /// sqcqd's worker threads seen running at the end of the run (`None`
    /// when the bench reports no thread list: a peer target).
    pub workers_seen: Option<u32>,
    /// CPU seconds of each of those worker threads over the measured
    /// window.
    pub worker_cpu_s: Vec<f64>,
    /// CPU microseconds per I/O of each watched process (`--watch`, in
    /// its order): its CPU time over the whole bench run (start, warm-up,
    /// measured time, stop) divided by the I/Os of warm-up and measured
    /// time at the measured rate.
    pub watched_cpu_us: Vec<f64>,
}

/// A process whose CPU time each run also measures, such as a Ceph OSD
/// the targets share (`--watch NAME=PID`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Watched {
    /// What the report calls it.
    pub name: String,
    /// Its process id.
    pub pid: u32,
}

impl Watched {
    /// Parses `NAME=PID`.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let (name, pid) = spec
            .split_once('=')
            .ok_or_else(|| format!("{spec:?} is not NAME=PID"))?;
        let pid = pid.parse().map_err(|_| format!("{pid:?} is not a pid"))?;
        Ok(Self {
            name: name.to_string(),
            pid,
        })
    }

    /// Nanoseconds its threads have run so far, from the first field of
    /// each thread's `/proc/PID/task/TID/schedstat` (`None` once it is
    /// gone).
    pub fn cpu_ns(&self) -> Option<u64> {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.pid)).ok()?;
        Some(
            tasks
                .flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
                .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                .sum(),
        )
    }
}

/// What every run of a plan shares: the bench's options beside the case.
#[derive(Clone, Copy, Debug)]
pub struct Settings<'a> {
    /// Block size.
    pub bs: &'a str,
    /// Measured time.
    pub runtime: Duration,
    /// Warm-up.
    pub ramp: Duration,
    /// The RBD image the target serves (the bench's `--target-rbd`).
    pub rbd: Option<&'a str>,
    /// CPUs of the target (the bench's `--target-cpus`).
    pub target_cpus: Option<&'a str>,
    /// I/Os per second per job (the bench's `--rate_iops`).
    pub rate_iops: Option<u32>,
    /// Other processes whose CPU time per I/O the run measures.
    pub watch: &'a [Watched],
}

/// The bench's `--mode` and, for sqcqd, its `--poll` (the bench's
/// `--target-poll`) of a mode of the matrix. Three modes differ from the
/// bench's: `notify` is classic virtio on both sides (sqcqd `--poll
/// kick`), the RFC's baseline; `auto` is the same unmodified driver
/// against sqcqd's default, `--poll auto`, and `ring` against `--poll
/// ring`. The others are the bench's modes, with sqcqd's default poll
/// mode unless the mode names one (`ring-poll`).
pub fn bench_mode(mode: &str) -> (&str, Option<&'static str>) {
    match mode {
        "notify" => ("notify", Some("kick")),
        "auto" => ("notify", Some("auto")),
        "ring" => ("notify", Some("ring")),
        m => (m, None),
    }
}

/// Whether a run of `mode` ran as `mode_run` (the mode the bench
/// reports) only because the device did not offer what `mode` needs.
pub fn fell_back(mode: &str, mode_run: &str) -> bool {
    bench_mode(mode).0 != mode_run
}

/// Runs `sqcq-bench` once and extracts the figures.
pub fn run_once(
    bench: &Path,
    case: &Case,
    plan: &Settings<'_>,
) -> Result<(Figures, Value), RunError> {
    let cell = &case.cell;
    let mut cmd = Command::new(bench);
    if let Some(workers) = cell.workers {
        cmd.args(["--target-workers", &workers.to_string()]);
    }
    if cell.device_count > 1 {
        cmd.args(["--devices", &cell.device_count.to_string()]);
    }
    if let Some(rbd) = plan.rbd {
        cmd.args(["--target-rbd", rbd]);
    }
    if let Some(cpus) = plan.target_cpus {
        cmd.args(["--target-cpus", cpus]);
    }
    if let Some(rate) = plan.rate_iops {
        cmd.args(["--rate_iops", &rate.to_string()]);
    }
    let (mode, poll) = bench_mode(&case.mode);
    if let Some(poll) = poll.filter(|_| cell.target == "sqcqd") {
        cmd.args(["--target-poll", poll]);
    }
    let before: Vec<Option<u64>> = plan.watch.iter().map(Watched::cpu_ns).collect();
    let output = cmd
        .args(["--device-type", &cell.device, "--target", &cell.target])
        .args(["--rw", &cell.rw, "--bs", plan.bs])
        .args(["--mode", mode, "--output-format", "json", "--time_based"])
        .args([
            "--iodepth",
            &cell.qd.to_string(),
            "--numjobs",
            &cell.queues.to_string(),
        ])
        .args(["--runtime", &format!("{}ms", plan.runtime.as_millis())])
        .args(["--ramp_time", &format!("{}ms", plan.ramp.as_millis())])
        .output()
        .map_err(|source| RunError::Spawn {
            path: bench.to_path_buf(),
            source,
        })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        let stderr = tail.into_iter().rev().collect::<Vec<_>>().join(" | ");
        return Err(RunError::Failed {
            status: output.status,
            stderr,
        });
    }
    let json: Value =
        serde_json::from_slice(&output.stdout).map_err(|e| RunError::Output(e.to_string()))?;
    let mut figures = figures(&json).ok_or_else(|| RunError::Output("missing fields".into()))?;
    let ios = figures.iops * (plan.runtime + plan.ramp).as_secs_f64();
    figures.watched_cpu_us = plan
        .watch
        .iter()
        .zip(before)
        .map(|(w, before)| match (before, w.cpu_ns()) {
            (Some(a), Some(b)) if ios > 0.0 => b.saturating_sub(a) as f64 / 1000.0 / ios,
            _ => f64::NAN,
        })
        .collect();
    Ok((figures, json))
}

fn figures(json: &Value) -> Option<Figures> {
    let jobs = json.get("jobs")?.as_array()?;
    let sqcq = json.get("sqcq")?;
    let mut f = Figures::default();
    let (mut p50, mut p99, mut n) = (0.0, 0.0, 0.0);
    for job in jobs {
        for dir in ["read", "write"] {
            let d = &job[dir];
            let iops = d["iops"].as_f64().unwrap_or(0.0);
            if iops > 0.0 {
                f.iops += iops;
                let pct = &d["clat_ns"]["percentile"];
                p50 += pct["50.000000"].as_f64().unwrap_or(0.0) / 1000.0;
                p99 += pct["99.000000"].as_f64().unwrap_or(0.0) / 1000.0;
                n += 1.0;
            }
        }
    }
    if n > 0.0 {
        f.p50_us = p50 / n;
        f.p99_us = p99 / n;
    }
    f.kicks_per_io = sqcq["kicks_per_io"].as_f64()?;
    f.calls_per_io = sqcq["calls_per_io"].as_f64()?;
    f.driver_cpu_us = sqcq["driver_cpu"]["us_per_io"].as_f64().unwrap_or(f64::NAN);
    f.target_cpu_us = sqcq["target_cpu"]["us_per_io"].as_f64().unwrap_or(f64::NAN);
    f.mode_run = sqcq["mode"].as_str().unwrap_or("?").to_string();
    if let Some(threads) = sqcq["target_cpu"]["threads"].as_array() {
        // sqcqd names its workers sqcq-worker0, sqcq-worker1, ...
        let workers: Vec<f64> = threads
            .iter()
            .filter(|t| {
                t["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("sqcq-worker"))
            })
            .map(|t| t["usr_sec"].as_f64().unwrap_or(0.0) + t["sys_sec"].as_f64().unwrap_or(0.0))
            .collect();
        f.workers_seen = u32::try_from(workers.len()).ok();
        f.worker_cpu_s = workers;
    }
    Some(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_sum_jobs_and_average_percentiles() {
        let json = serde_json::json!({
            "jobs": [
                {"read": {"iops": 100.0, "clat_ns": {"percentile": {"50.000000": 2000, "99.000000": 9000}}},
                 "write": {"iops": 0.0}},
                {"read": {"iops": 300.0, "clat_ns": {"percentile": {"50.000000": 4000, "99.000000": 11000}}},
                 "write": {"iops": 0.0}}
            ],
            "sqcq": {"kicks_per_io": 0.5, "calls_per_io": 0.25, "mode": "sqcq",
                     "driver_cpu": {"us_per_io": 1.5},
                     "target_cpu": {"us_per_io": 2.5, "threads": [
                         {"name": "sqcqd", "usr_sec": 0.0, "sys_sec": 0.0},
                         {"name": "sqcq-worker0", "usr_sec": 0.5, "sys_sec": 0.25},
                         {"name": "sqcq-worker1", "usr_sec": 1.0, "sys_sec": 0.5}]}}
        });
        let f = figures(&json).unwrap();
        assert_eq!(f.iops, 400.0);
        assert_eq!(f.p50_us, 3.0);
        assert_eq!(f.p99_us, 10.0);
        assert_eq!((f.kicks_per_io, f.calls_per_io), (0.5, 0.25));
        assert_eq!((f.driver_cpu_us, f.target_cpu_us), (1.5, 2.5));
        assert_eq!(f.mode_run, "sqcq");
        assert_eq!(f.workers_seen, Some(2));
        assert_eq!(f.worker_cpu_s, [0.75, 1.5]);
    }

    #[test]
    fn labels_name_only_a_foreign_target() {
        let mut cell = Cell {
            device: "scsi".into(),
            target: "sqcqd".into(),
            rw: "randread".into(),
            qd: 32,
            jobs: 4,
            device_count: 1,
            queues: 4,
            workers: Some(1),
        };
        assert_eq!(cell.label(), "randread QD32 NJ4");
        let mut two = cell.with_workers(Some(2));
        assert_eq!(two.label(), "randread QD32 NJ4 W2");
        two.device_count = 2;
        two.queues = 2;
        assert_eq!(two.label(), "randread QD32 NJ4 D2 W2");
        cell.workers = None;
        cell.target = "vhost-device-scsi".into();
        assert_eq!(cell.label(), "vhost-device-scsi randread QD32 NJ4");
        cell.device = "blk".into();
        cell.target = "sqcqd".into();
        assert_eq!(cell.label(), "blk randread QD32 NJ4");
        cell.target = "qemu-storage-daemon".into();
        assert_eq!(cell.label(), "qemu-storage-daemon blk randread QD32 NJ4");
    }

    #[test]
    fn notify_is_classic_on_both_sides_and_auto_is_the_default() {
        assert_eq!(bench_mode("notify"), ("notify", Some("kick")));
        assert_eq!(bench_mode("auto"), ("notify", Some("auto")));
        assert_eq!(bench_mode("ring"), ("notify", Some("ring")));
        assert_eq!(bench_mode("ring-poll"), ("ring-poll", None));
        assert!(!fell_back("auto", "notify"), "auto runs a notify driver");
        assert!(fell_back("sqcq", "notify"));
        assert!(!fell_back("sqcq", "sqcq"));
    }

    #[test]
    fn watched_processes_are_named_pids() {
        let me = Watched::parse(&format!("me={}", std::process::id())).unwrap();
        assert_eq!(me.name, "me");
        assert!(me.cpu_ns().is_some_and(|ns| ns > 0));
        assert!(Watched::parse("osd").is_err());
        assert!(Watched::parse("osd=x").is_err());
    }

    #[test]
    fn output_without_notification_counters_is_rejected() {
        let json = serde_json::json!({"jobs": [], "sqcq": {}});
        assert!(figures(&json).is_none());
    }

    #[test]
    fn a_target_without_threads_has_no_workers_seen() {
        let json = serde_json::json!({"jobs": [],
            "sqcq": {"kicks_per_io": 1.0, "calls_per_io": 1.0, "mode": "notify"}});
        let f = figures(&json).unwrap();
        assert_eq!(f.workers_seen, None);
        assert!(f.worker_cpu_s.is_empty());
    }
}
