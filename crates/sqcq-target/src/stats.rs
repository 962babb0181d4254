//! Per-queue statistics: the RFC's log line every interval, and a JSON
//! snapshot of every queue for the load generator.
//!
//! Each worker logs its own queues (the figures of the last interval, in
//! `sqcq_protocol::QueueStats`' format: `vq[N] cq=... ema_lat=...
//! interval=... spins=... sleeps=... wakeups=...`, plus kicks received)
//! and posts their cumulative figures to the daemon's [`StatsBoard`]. The
//! board rewrites `--stats-file` atomically (a temporary file, then
//! `rename`) at most once per interval, and when a frontend disconnects,
//! after its queues stopped, so the file then holds the final figures of
//! the connection.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Serialize;
use sqcq_protocol::QueueStats;
use tracing::{info, warn};

/// One queue's figures since it started (per connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueReport {
    /// Device number.
    pub device: u32,
    /// How it is served: "kick", "ring-poll" or "sqcq".
    pub mode: &'static str,
    /// Poll counters (completions: used elements published; wakeups:
    /// calls sent). Spin figures are zero for a kick queue.
    pub stats: QueueStats,
    /// Kicks received (eventfd counts).
    pub kicks: u64,
    /// Whether the queue was found broken.
    pub broken: bool,
    /// Whether the queue still runs.
    pub running: bool,
    /// With VIRTIO_F_SQCQ_POLL: NEED_WAKEUP in the SQ doorbell (the
    /// device's poller sleeps) and in the CQ doorbell (the driver's
    /// poller sleeps), as they were when the report was made.
    pub need_wakeup: Option<(bool, bool)>,
}

impl QueueReport {
    /// The log line of the figures since `earlier` (same queue).
    pub fn line(&self, earlier: Option<&QueueReport>) -> String {
        let (stats, kicks) = match earlier {
            Some(e) => (
                self.stats.since(&e.stats),
                sqcq_protocol::counted_since(self.kicks, e.kicks),
            ),
            None => (self.stats, self.kicks),
        };
        if self.mode == "kick" {
            format!(
                "vq[{}] cq={} kicks={kicks} calls={}",
                stats.queue, stats.completions, stats.wakeups
            )
        } else {
            format!("{stats} kicks={kicks}")
        }
    }
}

#[derive(Serialize)]
struct Entry {
    device: u32,
    vq: u16,
    mode: &'static str,
    running: bool,
    broken: bool,
    completions: u64,
    ema_lat_ns: u64,
    interval_ns: u64,
    spins: u64,
    sleeps: u64,
    wakeups: u64,
    kicks: u64,
    calls: u64,
    sq_need_wakeup: Option<bool>,
    cq_need_wakeup: Option<bool>,
}

impl From<&QueueReport> for Entry {
    fn from(r: &QueueReport) -> Self {
        Entry {
            device: r.device,
            vq: r.stats.queue,
            mode: r.mode,
            running: r.running,
            broken: r.broken,
            completions: r.stats.completions,
            ema_lat_ns: r.stats.ema_ns,
            interval_ns: r.stats.interval_ns,
            spins: r.stats.spins,
            sleeps: r.stats.sleeps,
            wakeups: r.stats.wakeups,
            kicks: r.kicks,
            calls: r.stats.wakeups,
            sq_need_wakeup: r.need_wakeup.map(|(sq, _)| sq),
            cq_need_wakeup: r.need_wakeup.map(|(_, cq)| cq),
        }
    }
}

#[derive(Serialize)]
struct Snapshot {
    queues: Vec<Entry>,
}

struct Board {
    queues: BTreeMap<(u32, u16), QueueReport>,
    written: Instant,
}

/// The latest figures of every queue of the daemon.
pub struct StatsBoard {
    interval: Option<Duration>,
    file: Option<PathBuf>,
    board: Mutex<Board>,
}

impl std::fmt::Debug for StatsBoard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatsBoard")
            .field("interval", &self.interval)
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

impl StatsBoard {
    /// A board writing `file` (if any) every `interval` (if any).
    pub fn new(interval: Option<Duration>, file: Option<PathBuf>) -> Self {
        StatsBoard {
            interval,
            file,
            board: Mutex::new(Board {
                queues: BTreeMap::new(),
                written: Instant::now(),
            }),
        }
    }

    /// The logging and posting period.
    pub fn interval(&self) -> Option<Duration> {
        self.interval
    }

    /// Records a queue's figures (replacing its earlier ones).
    pub fn post(&self, r: QueueReport) {
        self.lock().queues.insert((r.device, r.stats.queue), r);
    }

    /// Every queue's latest figures, ordered by device and virtqueue.
    pub fn snapshot(&self) -> Vec<QueueReport> {
        self.lock().queues.values().copied().collect()
    }

    /// Rewrites the file if an interval has passed since the last write.
    pub fn write_if_due(&self) {
        let due = self
            .interval
            .is_some_and(|i| self.lock().written.elapsed() >= i);
        if due {
            self.write();
        }
    }

    /// Rewrites the file now (temporary file, then rename).
    pub fn write(&self) {
        let Some(path) = &self.file else { return };
        let snapshot = {
            let mut b = self.lock();
            b.written = Instant::now();
            Snapshot {
                queues: b.queues.values().map(Entry::from).collect(),
            }
        };
        if let Err(e) = write_atomically(path, &snapshot) {
            warn!("cannot write statistics to {}: {e}", path.display());
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Board> {
        // Plain data: a panic while holding the lock leaves it consistent.
        self.board.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn write_atomically(path: &Path, snapshot: &Snapshot) -> std::io::Result<()> {
    // A temporary file of its own per write: workers write the file
    // concurrently, and one must not rename the other's half-written one.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.{n}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp)?;
    serde_json::to_writer_pretty(&mut f, snapshot)?;
    f.write_all(b"\n")?;
    f.sync_data()?;
    std::fs::rename(&tmp, path)
}

/// A worker's statistics clock: when its next log line is due, and the
/// figures of its previous one.
#[derive(Debug, Default)]
pub(crate) struct StatsTicker {
    next: Option<Instant>,
    last: BTreeMap<(u32, u16), QueueReport>,
}

impl StatsTicker {
    /// Time left until the next tick (`None`: statistics are off).
    pub(crate) fn timeout(&mut self, board: &StatsBoard) -> Option<Duration> {
        let interval = board.interval()?;
        let next = *self.next.get_or_insert_with(|| Instant::now() + interval);
        Some(next.saturating_duration_since(Instant::now()))
    }

    /// If due: logs each report's interval figures and posts them.
    pub(crate) fn tick(
        &mut self,
        worker: usize,
        board: &StatsBoard,
        reports: impl Iterator<Item = QueueReport>,
    ) {
        let Some(interval) = board.interval() else {
            return;
        };
        let now = Instant::now();
        if self.next.is_some_and(|n| n > now) {
            return;
        }
        self.next = Some(now + interval);
        let mut seen = BTreeMap::new();
        for r in reports {
            let key = (r.device, r.stats.queue);
            info!(worker, device = r.device, "{}", r.line(self.last.get(&key)));
            board.post(r);
            seen.insert(key, r);
        }
        self.last = seen;
        board.write_if_due();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(completions: u64, kicks: u64) -> QueueReport {
        QueueReport {
            device: 0,
            mode: "sqcq",
            stats: QueueStats {
                queue: 2,
                completions,
                ema_ns: 100,
                interval_ns: 400,
                spins: 10,
                sleeps: 1,
                wakeups: 1,
            },
            kicks,
            broken: false,
            running: true,
            need_wakeup: None,
        }
    }

    #[test]
    fn line_reports_the_interval_in_the_rfc_format() {
        let a = report(10, 1);
        let b = report(25, 3);
        assert_eq!(
            b.line(Some(&a)),
            "vq[2] cq=15 ema_lat=100ns interval=400ns spins=0 sleeps=0 wakeups=0 kicks=2"
        );
        let k = QueueReport { mode: "kick", ..a };
        assert_eq!(k.line(None), "vq[2] cq=10 kicks=1 calls=1");
    }

    #[test]
    fn file_is_replaced_with_valid_json() {
        let dir = std::env::temp_dir().join(format!("sqcq-stats-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stats.json");
        let board = StatsBoard::new(None, Some(path.clone()));
        board.post(report(5, 0));
        board.write();
        board.post(report(7, 0));
        board.write();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(v["queues"][0]["completions"], 7);
        assert_eq!(v["queues"][0]["mode"], "sqcq");
        assert!(!dir.join("stats.json.tmp").exists());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
