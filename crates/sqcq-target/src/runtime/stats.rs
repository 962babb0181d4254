//! Where the figures of [`crate::runtime::metrics`] go: the RFC's log line every
//! interval, a JSON snapshot of every queue for the load generator, and
//! whoever asks (the Prometheus endpoint, admin `stats`).
//!
//! Each worker logs its own queues (the figures of the last interval, in
//! `sqcq_protocol::QueueStats`' format: `vq[N] cq=... ema_lat=...
//! interval=... spins=... sleeps=... wakeups=...`, plus kicks received).
//! The daemon's [`StatsBoard`] knows every device's metrics and rewrites
//! `--stats-file` atomically (a temporary file, then `rename`) at most
//! once per interval, and when a frontend disconnects, after its queues
//! stopped, so the file then holds the figures at the end of the
//! connection. It also knows every running worker's figures.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use serde::Serialize;
use tracing::{info, warn};

use crate::runtime::metrics::{DeviceMetrics, QueueSnapshot, WorkerMetrics, WorkerSnapshot};
use crate::runtime::pass;

#[derive(Serialize)]
struct Snapshot {
    queues: Vec<QueueSnapshot>,
}

struct Board {
    devices: Vec<Weak<DeviceMetrics>>,
    workers: Vec<Weak<WorkerMetrics>>,
    written: Instant,
}

/// Every device's and worker's figures, for the statistics file and
/// whoever asks.
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
                devices: Vec::new(),
                workers: Vec::new(),
                written: Instant::now(),
            }),
        }
    }

    /// The logging and writing period.
    pub fn interval(&self) -> Option<Duration> {
        self.interval
    }

    /// Adds a device's figures (until the device is dropped).
    pub fn register(&self, device: &Arc<DeviceMetrics>) {
        let mut b = self.lock();
        b.devices.retain(|d| d.strong_count() > 0);
        b.devices.push(Arc::downgrade(device));
    }

    /// The figures of worker `id`, which is the calling thread (see
    /// [`WorkerMetrics`]); listed until the worker drops them.
    pub(crate) fn enter_worker(&self, id: usize) -> Arc<WorkerMetrics> {
        let m = Arc::new(WorkerMetrics::on_this_thread(id));
        let mut b = self.lock();
        b.workers.retain(|w| w.strong_count() > 0);
        b.workers.push(Arc::downgrade(&m));
        m
    }

    /// Every running worker's figures, by worker number, with the number
    /// of running queues each serves (of `queues`, a [`Self::snapshot`]).
    pub fn workers(&self, queues: &[QueueSnapshot]) -> Vec<WorkerSnapshot> {
        let workers: Vec<_> = self
            .lock()
            .workers
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        let mut out: Vec<_> = workers
            .iter()
            .map(|w| {
                let id = w.id();
                let served = queues
                    .iter()
                    .filter(|q| q.running && q.worker == Some(id))
                    .count();
                w.snapshot(served)
            })
            .collect();
        out.sort_by_key(|w| w.worker);
        out
    }

    /// Every queue that ever ran, ordered by device and virtqueue.
    pub fn snapshot(&self) -> Vec<QueueSnapshot> {
        let devices: Vec<_> = self
            .lock()
            .devices
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        let mut queues: Vec<_> = devices.iter().flat_map(|d| d.queues()).collect();
        queues.sort_by_key(|q| (q.device, q.vq));
        queues
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
        self.lock().written = Instant::now();
        let snapshot = Snapshot {
            queues: self.snapshot(),
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

/// A worker's statistics clock: when its next log line is due (on the
/// worker's pass clock, [`pass`], which its loop reads once per wake-up:
/// the ticker reads no clock of its own), and the figures of its previous
/// one.
#[derive(Debug, Default)]
pub(crate) struct StatsTicker {
    /// Pass-clock nanoseconds.
    next: Option<u64>,
    last: BTreeMap<(u32, u16), QueueSnapshot>,
}

impl StatsTicker {
    /// Time left until the next tick (`None`: statistics are off), from
    /// the time of the pass that ends.
    pub(crate) fn timeout(&mut self, board: &StatsBoard) -> Option<Duration> {
        let interval = pass::nanos(board.interval()?);
        let now = pass::now();
        let next = *self
            .next
            .get_or_insert_with(|| now.saturating_add(interval));
        Some(Duration::from_nanos(next.saturating_sub(now)))
    }

    /// Whether a tick is due in this pass (then the caller brings its
    /// queues' figures up to date and calls [`Self::tick`]).
    pub(crate) fn due(&self, board: &StatsBoard) -> bool {
        board.interval().is_some() && self.next.is_none_or(|n| n <= pass::now())
    }

    /// Logs the figures of the interval of every queue in `queues` (the
    /// worker's), then writes the file if that is due.
    pub(crate) fn tick(
        &mut self,
        worker: usize,
        board: &StatsBoard,
        queues: impl Iterator<Item = QueueSnapshot>,
    ) {
        let Some(interval) = board.interval() else {
            return;
        };
        self.next = Some(pass::now().saturating_add(pass::nanos(interval)));
        let mut seen = BTreeMap::new();
        for q in queues {
            let key = (q.device, q.vq);
            info!(worker, device = q.device, "{}", q.line(self.last.get(&key)));
            seen.insert(key, q);
        }
        self.last = seen;
        board.write_if_due();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::metrics::QueueMode;

    #[test]
    fn the_file_is_replaced_with_every_live_devices_queues() {
        let dir = std::env::temp_dir().join(format!("sqcq-stats-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stats.json");
        let board = StatsBoard::new(None, Some(path.clone()));
        let a = Arc::new(DeviceMetrics::new(0, 4));
        let b = Arc::new(DeviceMetrics::new(1, 4));
        board.register(&b);
        board.register(&a);
        a.queue(2).unwrap().started(QueueMode::Sqcq);
        a.queue(2).unwrap().batch(5);
        b.queue(3).unwrap().started(QueueMode::Kick);
        board.write();
        a.queue(2).unwrap().batch(2);
        board.write();
        let read = || -> serde_json::Value {
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
        };
        let v = read();
        assert_eq!(v["queues"][0]["completions"], 7);
        assert_eq!(v["queues"][0]["mode"], "sqcq");
        assert_eq!(v["queues"][0]["sq_need_wakeup"], serde_json::Value::Null);
        assert_eq!(
            (
                v["queues"][1]["device"].clone(),
                v["queues"][1]["mode"].clone()
            ),
            (1.into(), "kick".into())
        );
        drop(b);
        board.write();
        assert_eq!(
            read()["queues"].as_array().unwrap().len(),
            1,
            "a dropped device is gone"
        );
        let leftovers = std::fs::read_dir(&dir).unwrap().count();
        assert_eq!(leftovers, 1, "no temporary file left behind");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
