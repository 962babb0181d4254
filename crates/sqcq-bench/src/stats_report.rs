//! The per-queue poll statistics of both sides, in the RFC's log format
//! (`vq[N] cq=... ema_lat=... interval=... spins=... sleeps=...
//! wakeups=...`): on stderr every `--stats-interval` and at the end, and
//! in the JSON report.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqcq_driver::sqcq::PollStats;
use sqcq_protocol::QueueStats;

use crate::job::Progress;
use crate::target::Target;

/// How often the reporter looks whether the jobs are done.
const TICK: Duration = Duration::from_millis(50);

/// The periodic reporter of a run.
#[derive(Debug)]
pub struct Periodic<'a> {
    /// Period.
    pub interval: Duration,
    /// The driver-side pollers' figures (polling modes).
    pub driver: Option<PollStats>,
    /// The target started here, for its statistics file.
    pub target: Option<&'a Target>,
    /// The jobs, to stop when they are done.
    pub jobs: &'a [Arc<Progress>],
}

impl Periodic<'_> {
    /// Prints the figures of the last period every `interval` until every
    /// job is done.
    pub fn run(self) {
        let mut last = self.driver.as_ref().map(PollStats::snapshot);
        let mut next = Instant::now() + self.interval;
        while !self.jobs.iter().all(|j| j.done.load(Ordering::Relaxed)) {
            std::thread::sleep(TICK);
            if Instant::now() < next {
                continue;
            }
            next += self.interval;
            if let (Some(driver), Some(before)) = (&self.driver, &mut last) {
                let now = driver.snapshot();
                for (n, b) in now.iter().zip(before.iter()) {
                    eprintln!("sqcq-bench: driver {}", n.since(b));
                }
                *before = now;
            }
            if let Some(stats) = self.target.and_then(Target::device_stats) {
                device_lines(&stats);
            }
        }
    }
}

/// The totals of the run, on stderr.
pub fn final_lines(driver: Option<&(Vec<QueueStats>, Vec<u64>)>, device: Option<&Value>) {
    if let Some((stats, calls)) = driver {
        for (s, c) in stats.iter().zip(calls) {
            eprintln!("sqcq-bench: driver total {s} calls={c}");
        }
    }
    if let Some(d) = device {
        device_lines(d);
    }
}

/// The device's figures, one line per queue when the file has a list of
/// them (`queues`), otherwise as it is; with the device number when the
/// daemon serves several.
fn device_lines(stats: &Value) {
    match stats.get("queues").and_then(Value::as_array) {
        Some(queues) => {
            let device = |q: &Value| q.get("device").and_then(Value::as_u64).unwrap_or(0);
            let several = queues.iter().any(|q| device(q) > 0);
            for q in queues {
                let field = |k: &str| q.get(k).and_then(Value::as_u64).unwrap_or(0);
                let which = if several {
                    format!(" {}", device(q))
                } else {
                    String::new()
                };
                eprintln!(
                    "sqcq-bench: device{which} vq[{}] cq={} ema_lat={}ns interval={}ns spins={} sleeps={} wakeups={} kicks={} mode={}",
                    field("vq"),
                    field("completions"),
                    field("ema_lat_ns"),
                    field("interval_ns"),
                    field("spins"),
                    field("sleeps"),
                    field("calls"),
                    field("kicks"),
                    q.get("mode").and_then(Value::as_str).unwrap_or("?")
                );
            }
        }
        None => eprintln!("sqcq-bench: device {stats}"),
    }
}

/// The driver's per-queue figures for JSON.
pub fn queues_json(stats: &[QueueStats], calls: &[u64]) -> Value {
    Value::Array(
        stats
            .iter()
            .zip(calls)
            .map(|(s, c)| {
                json!({
                    "queue": s.queue,
                    "cq": s.completions,
                    "ema_lat_ns": s.ema_ns,
                    // null: a poller that never sleeps (poll-queue).
                    "interval_ns": (s.interval_ns != u64::MAX).then_some(s.interval_ns),
                    "spins": s.spins,
                    "sleeps": s.sleeps,
                    "wakeups": s.wakeups,
                    "calls": c,
                    "line": s.to_string(),
                })
            })
            .collect(),
    )
}
