//! What a job measured: per direction I/Os, bytes and a latency histogram
//! (HDR, nanoseconds, 3 significant digits), plus notifications and CPU.

use std::time::Duration;

use hdrhistogram::Histogram;
use sqcq_driver::NotifyCounters;

use crate::cpu::CpuTime;

/// The percentiles fio reports by default.
pub const PERCENTILES: [f64; 17] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95,
    99.99,
];

/// Statistics of one direction.
#[derive(Debug, Clone)]
pub struct DirStats {
    /// Completed I/Os.
    pub ios: u64,
    /// Bytes transferred.
    pub bytes: u64,
    /// Latency, submission to completion, in ns.
    pub lat: Histogram<u64>,
    /// Exact minimum latency (ns).
    pub min: u64,
    /// Exact maximum latency (ns).
    pub max: u64,
    /// The time this direction was active, when not the job's whole
    /// runtime (the passes of a verify job).
    pub active: Option<Duration>,
}

impl Default for DirStats {
    fn default() -> Self {
        Self {
            ios: 0,
            bytes: 0,
            // 1 ns to 1 h: cannot fail with these bounds.
            lat: Histogram::new_with_bounds(1, 3_600_000_000_000, 3)
                .unwrap_or_else(|_| Histogram::new(3).unwrap_or_else(|_| unreachable!())),
            min: u64::MAX,
            max: 0,
            active: None,
        }
    }
}

impl DirStats {
    /// Records one completed I/O.
    pub fn record(&mut self, bytes: u64, latency: Duration) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.ios += 1;
        self.bytes += bytes;
        self.lat.saturating_record(ns);
        self.min = self.min.min(ns);
        self.max = self.max.max(ns);
    }

    /// Adds another job's statistics.
    pub fn merge(&mut self, other: &DirStats) {
        self.ios += other.ios;
        self.bytes += other.bytes;
        // Same bounds on both sides: cannot fail.
        let _ = self.lat.add(&other.lat);
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        self.active = match (self.active, other.active) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }

    /// The time this direction ran: its own, or the job's `runtime`.
    pub fn runtime(&self, runtime: Duration) -> Duration {
        self.active.unwrap_or(runtime)
    }

    /// I/Os per second over [`Self::runtime`].
    pub fn iops(&self, runtime: Duration) -> f64 {
        per_sec(self.ios, self.runtime(runtime))
    }

    /// Bytes per second over [`Self::runtime`].
    pub fn bw(&self, runtime: Duration) -> f64 {
        per_sec(self.bytes, self.runtime(runtime))
    }

    /// The minimum latency, 0 without I/O.
    pub fn min_ns(&self) -> u64 {
        if self.ios == 0 { 0 } else { self.min }
    }
}

fn per_sec(n: u64, runtime: Duration) -> f64 {
    let secs = runtime.as_secs_f64();
    if secs > 0.0 { n as f64 / secs } else { 0.0 }
}

/// Everything one job measured.
#[derive(Debug, Clone, Default)]
pub struct JobStats {
    /// Reads (and verify reads).
    pub read: DirStats,
    /// Writes.
    pub write: DirStats,
    /// Measured time.
    pub runtime: Duration,
    /// Notification counters of the job's queue over the measured time.
    pub notify: NotifyCounters,
    /// CPU time of the job's thread over the measured time.
    pub cpu: CpuTime,
    /// Gaps between bursts after which both sides' poll threads were seen
    /// asleep with NEED_WAKEUP set.
    pub idle_gaps: u64,
    /// Times the job followed the device to a new connection after it
    /// hung up (`--reconnect`).
    pub reconnects: u64,
    /// Times the job held I/Os back because the device set THROTTLE.
    pub throttle_holds: u64,
    /// The most I/Os the job had published and not completed at once.
    pub max_in_flight: u16,
}

impl JobStats {
    /// Completed I/Os in both directions.
    pub fn ios(&self) -> u64 {
        self.read.ios + self.write.ios
    }

    /// Adds another job's statistics (runtime: the longest).
    pub fn merge(&mut self, other: &JobStats) {
        self.read.merge(&other.read);
        self.write.merge(&other.write);
        self.runtime = self.runtime.max(other.runtime);
        self.notify.kicks += other.notify.kicks;
        self.notify.calls += other.notify.calls;
        self.notify.publishes += other.notify.publishes;
        self.notify.sleeps += other.notify.sleeps;
        self.cpu.user += other.cpu.user;
        self.cpu.system += other.cpu.system;
        self.idle_gaps += other.idle_gaps;
        self.reconnects += other.reconnects;
        self.throttle_holds += other.throttle_holds;
        self.max_in_flight = self.max_in_flight.max(other.max_in_flight);
    }
}

/// `n / ios`, 0 without I/O.
pub fn per_io(n: f64, ios: u64) -> f64 {
    if ios == 0 { 0.0 } else { n / ios as f64 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_merges() {
        let mut a = DirStats::default();
        a.record(4096, Duration::from_micros(10));
        a.record(4096, Duration::from_micros(30));
        let mut b = DirStats::default();
        b.record(4096, Duration::from_micros(20));
        a.merge(&b);
        assert_eq!((a.ios, a.bytes), (3, 3 * 4096));
        assert_eq!((a.min_ns(), a.max), (10_000, 30_000));
        let p50 = a.lat.value_at_quantile(0.5);
        assert!((19_900..=20_100).contains(&p50), "{p50}");
        assert!((a.iops(Duration::from_secs(2)) - 1.5).abs() < 1e-9);
        assert_eq!(DirStats::default().min_ns(), 0);
        assert_eq!(per_io(3.0, 0), 0.0);
        assert!((per_io(3.0, 2) - 1.5).abs() < 1e-9);
    }
}
