//! A frame of `sqcqd top`: what happened between two [`Sample`]s, as
//! rates. A pure function of the two samples and the time between them,
//! so that the arithmetic is tested on recorded answers.
//!
//! Counters are cumulative since the daemon started; a counter lower
//! than before started again from zero (a device deleted and created
//! again under its number, a worker freed and created again), and what
//! it counted since is taken, as a Prometheus `rate()` does. A queue or
//! worker that was not there before came within the interval: all it
//! counted is of the interval.

use std::time::Duration;

use sqcq_protocol::counted_since;

use super::sample::{Device, Queue, Sample, Worker};
use super::units::{self, NONE, count, mean_us, quantile_us, ratio};

/// What one queue, or the queues of a device, did in the interval.
#[derive(Clone, Debug, Default, PartialEq)]
struct Interval {
    requests: u64,
    bytes: u64,
    /// Requests per latency bucket.
    buckets: Vec<u64>,
    latency_sum_ns: u64,
    /// Kicks and calls.
    notifications: u64,
    spins: u64,
    sleeps: u64,
    /// Whether any of the queues is polled.
    polled: bool,
}

impl Interval {
    /// What `now` counted since `then` (the same queue in the sample
    /// before, if it was there).
    fn of(now: &Queue, then: Option<&Queue>) -> Self {
        let since = |pick: fn(&Queue) -> u64| counted_since(pick(now), then.map_or(0, pick));
        let buckets = now
            .latency
            .buckets
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let before = then.and_then(|t| t.latency.buckets.get(i)).copied();
                counted_since(n, before.unwrap_or(0))
            })
            .collect();
        Interval {
            requests: since(|q| q.completions),
            bytes: since(|q| q.read_bytes).saturating_add(since(|q| q.written_bytes)),
            buckets,
            latency_sum_ns: since(|q| q.latency.sum_ns),
            notifications: since(|q| q.kicks).saturating_add(since(|q| q.calls)),
            spins: since(|q| q.spins),
            sleeps: since(|q| q.sleeps),
            polled: now.polled(),
        }
    }

    fn add(&mut self, other: &Interval) {
        self.requests = self.requests.saturating_add(other.requests);
        self.bytes = self.bytes.saturating_add(other.bytes);
        if self.buckets.len() < other.buckets.len() {
            self.buckets.resize(other.buckets.len(), 0);
        }
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a = a.saturating_add(*b);
        }
        self.latency_sum_ns = self.latency_sum_ns.saturating_add(other.latency_sum_ns);
        self.notifications = self.notifications.saturating_add(other.notifications);
        self.spins = self.spins.saturating_add(other.spins);
        self.sleeps = self.sleeps.saturating_add(other.sleeps);
        self.polled |= other.polled;
    }

    /// The row of the table, after its label and state.
    fn columns(&self, secs: f64) -> String {
        let rate = |n: u64| {
            if secs > 0.0 {
                count(n as f64 / secs)
            } else {
                NONE.into()
            }
        };
        let polled = |n: u64| if self.polled { rate(n) } else { NONE.into() };
        let mb = if secs > 0.0 {
            megabytes(self.bytes as f64 / secs)
        } else {
            NONE.into()
        };
        let served = units::histogram_count(&self.buckets);
        format!(
            "{:>6} {:>7} {:>7} {:>6} {:>8} {:>7} {:>7}",
            rate(self.requests),
            mb,
            mean_us(self.latency_sum_ns, served),
            quantile_us(&self.buckets, 0.99),
            ratio(self.notifications, self.requests),
            polled(self.spins),
            polled(self.sleeps),
        )
    }
}

/// Bytes per second as MB/s (10^6), one decimal below 10 000.
fn megabytes(bytes_per_sec: f64) -> String {
    let mb = bytes_per_sec / 1e6;
    if mb < 9_999.95 {
        format!("{mb:.1}")
    } else {
        count(mb)
    }
}

/// A row of the device table: label, state, then the figures.
fn row(label: &str, state: &str, figures: &str) -> String {
    format!("{label:<13} {state:<9} {figures}")
}

/// The column heads of the device table, aligned as [`row`] and
/// [`Interval::columns`] align the figures.
fn head() -> String {
    row(
        "DEVICE/QUEUE",
        "STATE",
        &format!(
            "{:>6} {:>7} {:>7} {:>6} {:>8} {:>7} {:>7}",
            "IOPS", "MB/s", "AVG-us", "P99-us", "NOTIF/IO", "SPIN/s", "SLEEP/s"
        ),
    )
}

/// The frame of the interval of `elapsed` from `before` to `after`:
/// a header, every device with its queues, every worker.
pub fn frame(before: &Sample, after: &Sample, elapsed: Duration) -> Vec<String> {
    let secs = elapsed.as_secs_f64();
    let mut lines = vec![format!(
        "sqcqd {}, pid {}: {}, {}; the last {secs:.2} s",
        after.daemon.version,
        after.daemon.pid,
        plural(after.devices.len(), "device"),
        plural(after.workers.len(), "worker"),
    )];
    let mut all = Interval::default();
    let mut rows = Vec::new();
    for device in &after.devices {
        let mut sum = Interval::default();
        let mut queue_rows = Vec::new();
        for q in after.queues_of(device.id) {
            let then = before
                .queues
                .iter()
                .find(|b| b.device == q.device && b.vq == q.vq);
            let i = Interval::of(q, then);
            sum.add(&i);
            queue_rows.push(row(&queue_label(q), queue_state(q), &i.columns(secs)));
        }
        all.add(&sum);
        rows.push(row(
            &device_label(device),
            connection(device),
            &sum.columns(secs),
        ));
        rows.extend(queue_rows);
    }
    // Known only if known for every worker.
    let cpu_ns = after.workers.iter().try_fold(0u64, |sum, w| {
        cpu_since(w, before).map(|ns| sum.saturating_add(ns))
    });
    lines.push(summary(&all, cpu_ns, secs));
    lines.push(String::new());
    lines.push(head());
    lines.extend(rows);
    lines.push(String::new());
    lines.push("WORKER  BOUND   CPU%  QUEUES (DEVICE:VQ)".into());
    for w in &after.workers {
        let cpu = match cpu_since(w, before) {
            Some(ns) if secs > 0.0 => format!("{:.1}", ns as f64 / 1e7 / secs),
            _ => NONE.into(),
        };
        lines.push(worker_row(w, &cpu));
    }
    lines
}

/// The line of totals: requests, bytes, notifications per request, the
/// workers' CPU.
fn summary(all: &Interval, cpu_ns: Option<u64>, secs: f64) -> String {
    let per_sec = |n: f64| if secs > 0.0 { n / secs } else { f64::NAN };
    let (iops, bytes) = (per_sec(all.requests as f64), per_sec(all.bytes as f64));
    let mut line = format!(
        "all: {} IOPS, {} MB/s, {} notif/IO",
        count(iops),
        if bytes.is_finite() {
            megabytes(bytes)
        } else {
            NONE.into()
        },
        ratio(all.notifications, all.requests),
    );
    if let Some(ns) = cpu_ns {
        let pct = per_sec(ns as f64) / 1e7;
        if pct.is_finite() {
            line.push_str(&format!("; workers {pct:.1}% CPU"));
        }
        if all.requests > 0 {
            let us = ns as f64 / all.requests as f64 / 1000.0;
            line.push_str(&format!(", {us:.1} us per I/O"));
        }
    }
    line
}

/// The CPU time worker `w` used since `before` (`None`: not known).
fn cpu_since(w: &Worker, before: &Sample) -> Option<u64> {
    let now = w.cpu_ns?;
    let then = before
        .workers
        .iter()
        .find(|b| b.id == w.id)
        .and_then(|b| b.cpu_ns);
    Some(counted_since(now, then.unwrap_or(0)))
}

/// A worker's row: number, CPU it is bound to, `cpu` (its figure), the
/// queues it serves.
pub(crate) fn worker_row(w: &Worker, cpu: &str) -> String {
    let bound = w.cpu.map_or_else(|| NONE.into(), |c| c.to_string());
    let queues: Vec<String> = w.queues.iter().map(|(d, vq)| format!("{d}:{vq}")).collect();
    let mut row = format!("{:>6} {:>6} {:>6}  {}", w.id, bound, cpu, queues.join(" "));
    if w.cpu_displaced {
        row.push_str(" (off its CPU)");
    }
    row.trim_end().to_owned()
}

/// Whether a frontend is connected to `d`.
pub(crate) fn connection(d: &Device) -> &'static str {
    if d.connected {
        "connected"
    } else {
        "listening"
    }
}

/// `0 scsi`.
pub(crate) fn device_label(d: &Device) -> String {
    format!("{} {}", d.id, d.device_type)
}

/// `  vq 2 w0`: the virtqueue and its worker.
fn queue_label(q: &Queue) -> String {
    match q.worker {
        Some(w) => format!("  vq {} w{w}", q.vq),
        None => format!("  vq {}", q.vq),
    }
}

/// The mode a queue runs in, or why it does not run.
pub(crate) fn queue_state(q: &Queue) -> &str {
    if q.broken {
        "broken"
    } else if !q.running {
        "stopped"
    } else {
        &q.mode
    }
}

/// "1 device", "2 devices".
pub(crate) fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

#[cfg(test)]
mod tests {
    use super::super::sample::recorded::sample;
    use super::*;

    fn line<'a>(lines: &'a [String], start: &str) -> &'a str {
        lines
            .iter()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no line {start:?} in\n{}", lines.join("\n")))
    }

    fn fields(line: &str) -> Vec<&str> {
        line.split_whitespace().collect()
    }

    #[test]
    fn rates_are_the_differences_over_the_interval() {
        // In 1 s: 50 000 requests on vq 2 (500 kicks, 500 calls), 2 000
        // on vq 3 (a kick and a call each); worker 0 used 0.25 s of CPU,
        // worker 1 0.5 s.
        let before = sample(100_000, 1_000, 1_000_000_000, 3_000_000_000);
        let after = sample(150_000, 3_000, 1_250_000_000, 3_500_000_000);
        let lines = frame(&before, &after, Duration::from_secs(1));
        let text = lines.join("\n");
        assert!(
            lines[0].starts_with("sqcqd 0.1.0, pid 4242: 2 devices, 2 workers; the last 1.00 s"),
            "{text}"
        );
        // vq 2: 50k IOPS, 50 000 x 4096 B = 204.8 MB/s, half at 12 µs and
        // half at 200 µs: 106 µs on average, the 99th percentile in the
        // 256 µs bucket; 1 000 notifications / 50 000 = 0.02; 10 spins
        // and 0.01 sleeps per request.
        assert_eq!(
            fields(line(&lines, "  vq 2 w0")),
            [
                "vq", "2", "w0", "sqcq", "50.0k", "204.8", "106.0", "256", "0.02", "500k", "500"
            ],
            "{text}"
        );
        // vq 3: kicked, 2 notifications per I/O; nothing polls it.
        assert_eq!(
            fields(line(&lines, "  vq 3 w1")),
            [
                "vq", "3", "w1", "kick", "2000", "8.2", "106.0", "256", "2.00", "-", "-"
            ],
            "{text}"
        );
        // The device: 52 000 IOPS, (1 000 + 4 000) / 52 000 = 0.10.
        assert_eq!(
            fields(line(&lines, "0 scsi")),
            [
                "0",
                "scsi",
                "connected",
                "52.0k",
                "213.0",
                "106.0",
                "256",
                "0.10",
                "500k",
                "500"
            ],
            "{text}"
        );
        assert_eq!(
            fields(line(&lines, "1 blk")),
            ["1", "blk", "listening", "0", "0.0", "-", "-", "-", "-", "-"],
            "a device whose queues never ran: {text}"
        );
        // 0.75 s of CPU in 1 s, over 52 000 requests: 14.4 µs each.
        assert_eq!(
            line(&lines, "all:"),
            "all: 52.0k IOPS, 213.0 MB/s, 0.10 notif/IO; workers 75.0% CPU, 14.4 us per I/O"
        );
        assert_eq!(fields(line(&lines, "     0")), ["0", "-", "25.0", "0:2"]);
        assert_eq!(fields(line(&lines, "     1")), ["1", "1", "50.0", "0:3"]);
        assert!(lines.iter().all(|l| l.len() <= 80), "{text}");
    }

    #[test]
    fn rates_scale_with_the_interval() {
        let before = sample(0, 0, 0, 0);
        let after = sample(10_000, 0, 100_000_000, 0);
        let lines = frame(&before, &after, Duration::from_millis(200));
        // 10 000 requests in 0.2 s; 0.1 s of CPU in 0.2 s.
        assert_eq!(fields(line(&lines, "  vq 2"))[4], "50.0k");
        assert_eq!(fields(line(&lines, "     0"))[2], "50.0");
    }

    #[test]
    fn a_counter_that_started_again_counts_from_zero() {
        // Device 0 deleted and created again: its counters are lower.
        let before = sample(1_000_000, 1_000_000, 9_000_000_000, 9_000_000_000);
        let after = sample(30_000, 0, 100_000_000, 9_000_000_000);
        let lines = frame(&before, &after, Duration::from_secs(1));
        assert_eq!(fields(line(&lines, "  vq 2"))[4], "30.0k");
        assert_eq!(fields(line(&lines, "  vq 3"))[4], "0");
        assert_eq!(fields(line(&lines, "     0"))[2], "10.0");
        // A queue that was not there before: all it counted is new.
        let mut empty = sample(0, 0, 0, 0);
        empty.queues.clear();
        let lines = frame(&empty, &after, Duration::from_secs(1));
        assert_eq!(fields(line(&lines, "  vq 2"))[4], "30.0k");
    }

    #[test]
    fn a_stopped_or_broken_queue_says_so() {
        let mut after = sample(10, 10, 0, 0);
        after.queues[0].running = false;
        after.queues[1].broken = true;
        after.workers[0].cpu_ns = None;
        let lines = frame(&sample(10, 10, 0, 0), &after, Duration::from_secs(1));
        assert_eq!(fields(line(&lines, "  vq 2"))[3], "stopped");
        assert_eq!(fields(line(&lines, "  vq 3"))[3], "broken");
        assert_eq!(fields(line(&lines, "     0"))[2], "-");
        assert!(
            !line(&lines, "all:").contains("CPU"),
            "no total without every worker's CPU time"
        );
    }
}
