//! fio's progress line on stderr: jobs running, rates, ETA.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::args::Eta;
use crate::job::Progress;

/// Runs shorter than this get no progress line.
const MIN_RUN: Duration = Duration::from_secs(2);

/// What the line needs to know.
#[derive(Debug)]
pub struct Line {
    jobs: Vec<Arc<Progress>>,
    /// Expected length of the run (ramp + runtime), when time bounds it.
    expected: Option<Duration>,
    /// Expected bytes, when size bounds it.
    total_bytes: u64,
    terminal: bool,
}

impl Line {
    /// The line for `jobs`, or `None` when it should not be shown.
    pub fn new(
        eta: Eta,
        jobs: Vec<Arc<Progress>>,
        expected: Option<Duration>,
        total_bytes: u64,
    ) -> Option<Self> {
        let terminal = std::io::stderr().is_terminal();
        let show = match eta {
            Eta::Never => false,
            Eta::Always => true,
            Eta::Auto => terminal && expected.is_none_or(|e| e >= MIN_RUN),
        };
        show.then_some(Self {
            jobs,
            expected,
            total_bytes,
            terminal,
        })
    }

    /// Prints the line every half second (every two seconds when stderr
    /// is not a terminal) until every job is done.
    pub fn run(self) {
        let start = Instant::now();
        let period = if self.terminal {
            Duration::from_millis(500)
        } else {
            Duration::from_secs(2)
        };
        let mut last = (0u64, 0u64, start);
        loop {
            std::thread::sleep(Duration::from_millis(50));
            let running = self
                .jobs
                .iter()
                .filter(|j| !j.done.load(Ordering::Relaxed))
                .count();
            if running == 0 {
                break;
            }
            let now = Instant::now();
            if now.duration_since(last.2) < period {
                continue;
            }
            let ios: u64 = self
                .jobs
                .iter()
                .map(|j| j.reads.load(Ordering::Relaxed) + j.writes.load(Ordering::Relaxed))
                .sum();
            let bytes: u64 = self
                .jobs
                .iter()
                .map(|j| j.bytes.load(Ordering::Relaxed))
                .sum();
            let dt = now.duration_since(last.2).as_secs_f64();
            let iops = (ios - last.0) as f64 / dt;
            let bw = (bytes - last.1) as f64 / dt / f64::from(1u32 << 20);
            last = (ios, bytes, now);
            let elapsed = now.duration_since(start);
            let (pct, eta) = match self.expected {
                Some(total) => (
                    elapsed.as_secs_f64() / total.as_secs_f64().max(1e-9),
                    total.saturating_sub(elapsed),
                ),
                None if self.total_bytes > 0 && bytes > 0 => {
                    let frac = bytes as f64 / self.total_bytes as f64;
                    let left = elapsed.as_secs_f64() * (1.0 - frac) / frac;
                    (frac, Duration::from_secs_f64(left.clamp(0.0, 1e9)))
                }
                None => (0.0, Duration::ZERO),
            };
            let secs = eta.as_secs() + u64::from(eta.subsec_nanos() > 0);
            let line = format!(
                "Jobs: {running} (f={running}): [{:.1}%][{bw:.1}MiB/s][{:.1}k IOPS][eta {:02}m:{:02}s]",
                (pct * 100.0).min(100.0),
                iops / 1e3,
                secs / 60,
                secs % 60
            );
            let mut err = std::io::stderr().lock();
            let _ = if self.terminal {
                write!(err, "\r{line}   ")
            } else {
                writeln!(err, "{line}")
            };
            let _ = err.flush();
        }
        if self.terminal {
            let _ = writeln!(std::io::stderr());
        }
    }
}
