//! The run's report: fio's human-readable summary, or fio-like JSON
//! (`jobs[].read.iops`, `.bw` in KiB/s, `.lat_ns.{min,max,mean,stddev,
//! percentile}`, …) with sqcq's own figures under `sqcq` keys.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::cpu::{CpuTime, ThreadCpu};
use crate::stats::{DirStats, JobStats, PERCENTILES, per_io};

/// Everything printed about a run.
#[derive(Debug)]
pub struct Report {
    /// Job name.
    pub name: String,
    /// `--device-type`: `scsi` or `blk`.
    pub device_type: &'static str,
    /// `--rw`.
    pub rw: &'static str,
    /// `--bs`.
    pub bs: u64,
    /// `--iodepth`.
    pub iodepth: u16,
    /// Notification mode run.
    pub mode: &'static str,
    /// Further `sqcq` figures for JSON: the mode asked for and any
    /// fallback, the poll statistics of both sides.
    pub sqcq_extra: serde_json::Map<String, Value>,
    /// One line about the device and what was negotiated.
    pub device: String,
    /// Device facts for JSON.
    pub device_json: Value,
    /// Per job: statistics, or the error that ended it.
    pub jobs: Vec<Result<JobStats, String>>,
    /// CPU of this (driver) process over the measured window.
    pub driver_cpu: CpuTime,
    /// The target's CPU over the window, when started here.
    pub target: Option<TargetCpu>,
}

/// What a target started here spent over the measured window.
#[derive(Debug)]
pub struct TargetCpu {
    /// Its pid.
    pub pid: u32,
    /// Its executable's name.
    pub name: &'static str,
    /// The whole process.
    pub cpu: CpuTime,
    /// Each thread alive at the end of the window.
    pub threads: Vec<ThreadCpu>,
}

impl Report {
    fn total(&self) -> JobStats {
        let mut total = JobStats::default();
        for stats in self.jobs.iter().flatten() {
            total.merge(stats);
        }
        total
    }

    /// fio's normal output.
    pub fn normal(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{}: (g=0): rw={}, bs=(R) {bs}B-{bs}B, (W) {bs}B-{bs}B, ioengine=sqcq-virtio-{}, iodepth={}, mode={}",
            self.name,
            self.rw,
            self.device_type,
            self.iodepth,
            self.mode,
            bs = self.bs
        );
        let _ = writeln!(out, "{}", self.device);
        for (i, job) in self.jobs.iter().enumerate() {
            match job {
                Ok(stats) => self.normal_job(&mut out, i, stats),
                Err(e) => {
                    let _ = writeln!(out, "{}{i}: (groupid=0, jobs=1): err= 1: {e}", self.name);
                }
            }
        }
        let total = self.total();
        let _ = writeln!(out, "\nRun status group 0 (all jobs):");
        for (label, d) in [("READ", &total.read), ("WRITE", &total.write)] {
            if d.ios > 0 {
                let _ = writeln!(
                    out,
                    "   {label:>5}: bw={}, io={} ({}), run={}msec",
                    bw(d.bw(total.runtime)),
                    bytes_iec(d.bytes as f64),
                    bytes_si(d.bytes as f64),
                    d.runtime(total.runtime).as_millis()
                );
            }
        }
        let ios = total.ios();
        let _ = write!(
            out,
            "  CPU per I/O: driver={:.2}us (usr={:.3}s sys={:.3}s)",
            per_io(self.driver_cpu.total() * 1e6, ios),
            self.driver_cpu.user,
            self.driver_cpu.system
        );
        if let Some(TargetCpu { pid, name, cpu, .. }) = &self.target {
            let _ = write!(
                out,
                ", target={:.2}us ({name} pid {pid}: usr={:.3}s sys={:.3}s)",
                per_io(cpu.total() * 1e6, ios),
                cpu.user,
                cpu.system
            );
        }
        let _ = writeln!(
            out,
            "\n  Notifications per I/O: kicks={:.3} calls={:.3}",
            per_io(total.notify.kicks as f64, ios),
            per_io(total.notify.calls as f64, ios)
        );
        out
    }

    fn normal_job(&self, out: &mut String, i: usize, stats: &JobStats) {
        let _ = writeln!(out, "{}{i}: (groupid=0, jobs=1): err= 0", self.name);
        for (label, d) in [("read", &stats.read), ("write", &stats.write)] {
            if d.ios == 0 {
                continue;
            }
            let _ = writeln!(
                out,
                "  {label}: IOPS={}, BW={} ({})({}/{}msec)",
                si(d.iops(stats.runtime)),
                bw(d.bw(stats.runtime)),
                bw_si(d.bw(stats.runtime)),
                bytes_iec(d.bytes as f64),
                d.runtime(stats.runtime).as_millis()
            );
            let _ = writeln!(
                out,
                "    lat (nsec): min={}, max={}, avg={:.2}, stdev={:.2}",
                d.min_ns(),
                d.max,
                d.lat.mean(),
                d.lat.stdev()
            );
            let _ = writeln!(out, "    lat percentiles (nsec):");
            for row in PERCENTILES.chunks(4) {
                let cells: Vec<String> = row
                    .iter()
                    .map(|&p| format!("{p:5.2}th=[{:>6}]", d.lat.value_at_percentile(p)))
                    .collect();
                let _ = writeln!(out, "     | {},", cells.join(", "));
            }
        }
        let runtime = stats.runtime.as_secs_f64().max(f64::MIN_POSITIVE);
        let ios = stats.ios();
        let _ = writeln!(
            out,
            "  cpu          : usr={:.2}%, sys={:.2}%, {:.2}us/IO",
            stats.cpu.user / runtime * 100.0,
            stats.cpu.system / runtime * 100.0,
            per_io(stats.cpu.total() * 1e6, ios)
        );
        let n = &stats.notify;
        let _ = writeln!(
            out,
            "  notify       : mode={}, kicks={}, calls={}, kicks/IO={:.3}, calls/IO={:.3}, sleeps/IO={:.3}",
            self.mode,
            n.kicks,
            n.calls,
            per_io(n.kicks as f64, ios),
            per_io(n.calls as f64, ios),
            per_io(n.sleeps as f64, ios)
        );
    }

    /// fio-like JSON.
    pub fn json(&self) -> Value {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        let jobs: Vec<Value> = self
            .jobs
            .iter()
            .enumerate()
            .map(|(i, job)| self.json_job(i, job))
            .collect();
        let total = self.total();
        let ios = total.ios();
        let mut sqcq = json!({
            "mode": self.mode,
            "device": self.device_json,
            "total_ios": ios,
            "kicks": total.notify.kicks,
            "calls": total.notify.calls,
            "kicks_per_io": per_io(total.notify.kicks as f64, ios),
            "calls_per_io": per_io(total.notify.calls as f64, ios),
            "driver_cpu": cpu_json(&self.driver_cpu, ios),
        });
        if let Some(t) = &self.target {
            let mut target = cpu_json(&t.cpu, ios);
            target["pid"] = json!(t.pid);
            target["name"] = json!(t.name);
            target["threads"] = t
                .threads
                .iter()
                .map(|th| {
                    json!({
                        "tid": th.tid,
                        "name": th.name,
                        "usr_sec": th.cpu.user,
                        "sys_sec": th.cpu.system,
                    })
                })
                .collect();
            sqcq["target_cpu"] = target;
        }
        if let Some(obj) = sqcq.as_object_mut() {
            obj.extend(self.sqcq_extra.clone());
        }
        json!({
            "fio version": concat!("sqcq-bench-", env!("CARGO_PKG_VERSION")),
            "timestamp": now.as_secs(),
            "timestamp_ms": u64::try_from(now.as_millis()).unwrap_or(u64::MAX),
            "global options": {
                "rw": self.rw,
                "bs": self.bs.to_string(),
                "iodepth": self.iodepth.to_string(),
                "numjobs": self.jobs.len().to_string(),
                "mode": self.mode,
            },
            "jobs": jobs,
            "sqcq": sqcq,
        })
    }

    fn json_job(&self, i: usize, job: &Result<JobStats, String>) -> Value {
        let empty = JobStats::default();
        let (stats, error) = match job {
            Ok(s) => (s, None),
            Err(e) => (&empty, Some(e.as_str())),
        };
        let runtime = stats.runtime;
        let secs = runtime.as_secs_f64().max(f64::MIN_POSITIVE);
        let ios = stats.ios();
        let n = &stats.notify;
        json!({
            "jobname": format!("{}{i}", self.name),
            "groupid": 0,
            "error": u8::from(error.is_some()),
            "error_message": error,
            "job_runtime": u64::try_from(runtime.as_millis()).unwrap_or(u64::MAX),
            "read": dir_json(&stats.read, runtime),
            "write": dir_json(&stats.write, runtime),
            "trim": dir_json(&DirStats::default(), runtime),
            "usr_cpu": stats.cpu.user / secs * 100.0,
            "sys_cpu": stats.cpu.system / secs * 100.0,
            "sqcq": {
                "mode": self.mode,
                "kicks": n.kicks,
                "calls": n.calls,
                "publishes": n.publishes,
                "sleeps": n.sleeps,
                "idle_gaps_asleep": stats.idle_gaps,
                "reconnects": stats.reconnects,
                "throttle_holds": stats.throttle_holds,
                "max_in_flight": stats.max_in_flight,
                "kicks_per_io": per_io(n.kicks as f64, ios),
                "calls_per_io": per_io(n.calls as f64, ios),
                "cpu_us_per_io": per_io(stats.cpu.total() * 1e6, ios),
            },
        })
    }
}

fn cpu_json(cpu: &CpuTime, ios: u64) -> Value {
    json!({
        "usr_sec": cpu.user,
        "sys_sec": cpu.system,
        "us_per_io": per_io(cpu.total() * 1e6, ios),
    })
}

fn dir_json(d: &DirStats, runtime: Duration) -> Value {
    let percentiles: serde_json::Map<String, Value> = PERCENTILES
        .iter()
        .map(|&p| (format!("{p:.6}"), json!(d.lat.value_at_percentile(p))))
        .collect();
    let lat = json!({
        "min": d.min_ns(),
        "max": d.max,
        "mean": d.lat.mean(),
        "stddev": d.lat.stdev(),
        "N": d.ios,
        "percentile": percentiles,
    });
    let bw_bytes = d.bw(runtime);
    json!({
        "io_bytes": d.bytes,
        "io_kbytes": d.bytes / 1024,
        "bw_bytes": bw_bytes.round(),
        "bw": (bw_bytes / 1024.0).round(),
        "iops": d.iops(runtime),
        "runtime": u64::try_from(d.runtime(runtime).as_millis()).unwrap_or(u64::MAX),
        "total_ios": d.ios,
        "short_ios": 0,
        "drop_ios": 0,
        "lat_ns": lat,
        "clat_ns": lat,
        "slat_ns": {"min": 0, "max": 0, "mean": 0.0, "stddev": 0.0, "N": 0},
    })
}

/// fio's IOPS figures: 3 significant digits with k/M.
fn si(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

fn bw(bytes_per_sec: f64) -> String {
    format!("{}/s", bytes_iec(bytes_per_sec))
}

fn bw_si(bytes_per_sec: f64) -> String {
    format!("{}/s", bytes_si(bytes_per_sec))
}

fn bytes_iec(v: f64) -> String {
    scaled(v, 1024.0, &["B", "KiB", "MiB", "GiB", "TiB"])
}

fn bytes_si(v: f64) -> String {
    scaled(v, 1000.0, &["B", "kB", "MB", "GB", "TB"])
}

fn scaled(mut v: f64, base: f64, units: &[&str]) -> String {
    let mut unit = units[0];
    for u in &units[1..] {
        if v < base {
            break;
        }
        v /= base;
        unit = u;
    }
    if v >= 100.0 || unit == units[0] {
        format!("{v:.0}{unit}")
    } else {
        format!("{v:.1}{unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-job 4 KiB randread report of `stats`.
    fn randread_report(stats: JobStats, target: Option<TargetCpu>) -> Report {
        Report {
            name: "job".into(),
            device_type: "scsi",
            rw: "randread",
            bs: 4096,
            iodepth: 1,
            mode: "notify",
            sqcq_extra: serde_json::Map::new(),
            device: String::new(),
            device_json: json!({}),
            jobs: vec![Ok(stats)],
            driver_cpu: CpuTime::default(),
            target,
        }
    }

    #[test]
    fn numbers_read_like_fio() {
        assert_eq!(si(25_312.0), "25.3k");
        assert_eq!(si(999.0), "999");
        assert_eq!(si(1_500_000.0), "1.50M");
        assert_eq!(bytes_iec(103_809_024.0), "99.0MiB");
        assert_eq!(bytes_si(1_000_000.0), "1.0MB");
        assert_eq!(bytes_iec(512.0), "512B");
    }

    #[test]
    fn json_has_fio_fields() {
        let mut stats = JobStats::default();
        stats.read.record(4096, Duration::from_micros(20));
        stats.runtime = Duration::from_secs(1);
        stats.notify.kicks = 1;
        let report = randread_report(stats, None);
        let v = report.json();
        let read = &v["jobs"][0]["read"];
        assert_eq!(read["iops"], json!(1.0));
        assert_eq!(read["bw"], json!(4.0));
        assert_eq!(read["lat_ns"]["min"], json!(20_000));
        assert!(read["lat_ns"]["percentile"]["50.000000"].is_u64());
        assert!(read["clat_ns"]["percentile"]["99.900000"].is_u64());
        assert_eq!(v["sqcq"]["kicks_per_io"], json!(1.0));
        assert!(report.normal().contains("read: IOPS=1, BW=4.0KiB/s"));
    }

    #[test]
    fn json_has_the_targets_threads() {
        let mut stats = JobStats::default();
        stats.read.record(4096, Duration::from_micros(20));
        stats.runtime = Duration::from_secs(1);
        let worker = |tid, user| ThreadCpu {
            tid,
            name: format!("sqcq-worker{}", tid - 10),
            cpu: CpuTime { user, system: 0.5 },
        };
        let report = randread_report(
            stats,
            Some(TargetCpu {
                pid: 7,
                name: "sqcqd",
                cpu: CpuTime {
                    user: 0.5,
                    system: 1.5,
                },
                threads: vec![worker(10, 0.25), worker(11, 0.25)],
            }),
        );
        let target = &report.json()["sqcq"]["target_cpu"];
        assert_eq!(target["us_per_io"], json!(2e6));
        assert_eq!(target["threads"][1]["name"], json!("sqcq-worker1"));
        assert_eq!(target["threads"][1]["usr_sec"], json!(0.25));
        assert_eq!(target["threads"][1]["sys_sec"], json!(0.5));
        assert!(report.normal().contains("target=2000000.00us (sqcqd pid 7"));
    }
}
