//! The daemon's figures, in one place: per device, the count of
//! everything its frontend did wrong and of queue failures; per virtqueue,
//! what it served and how (requests, bytes, service times, notifications,
//! polling); per worker, its wake-ups and CPU time. Admin `stats`, the
//! per-queue log line, `--stats-file` and the Prometheus endpoint
//! ([`crate::prometheus`]) all read these (through [`QueueSnapshot`] and
//! [`WorkerSnapshot`]); nothing else counts.
//!
//! Every counter is cumulative since the daemon started (a queue that is
//! stopped and started again, or served by another worker, goes on
//! counting), like a Prometheus counter. A queue's figures are written by
//! the one worker that serves it, at most once per batch (kicks: per
//! drained kick; requests, bytes and service times: per published batch,
//! from the `BatchFigures` the queue gathers meanwhile; poll-loop
//! figures: at every statistics tick and when the queue stops), in cache
//! lines of their own; error counters are touched only on error paths.
//! All accesses are Relaxed: these are statistics and order nothing. A
//! queue moves between workers only through a stop and a start handed
//! over by channel, which orders the two writers.

use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};

use serde::Serialize;
use sqcq_protocol::{QueueStats, counted_since};

use crate::runtime::latency::{BUCKETS, LatencySnapshot, PendingLatency};
use crate::runtime::pass;

mod worker;

pub use worker::{WorkerMetrics, WorkerSnapshot};

/// How a queue learns of new requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum QueueMode {
    /// Kicks (classic virtio).
    Kick,
    /// The device polls the avail ring (`--poll ring`).
    RingPoll,
    /// The device polls the SQ doorbell (VIRTIO_F_SQCQ_POLL).
    Sqcq,
}

impl QueueMode {
    /// The name used in logs, the statistics file and admin replies.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kick => "kick",
            Self::RingPoll => "ring-poll",
            Self::Sqcq => "sqcq",
        }
    }

    fn code(mode: Option<Self>) -> u8 {
        match mode {
            None => 0,
            Some(Self::Kick) => 1,
            Some(Self::RingPoll) => 2,
            Some(Self::Sqcq) => 3,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::Kick),
            2 => Some(Self::RingPoll),
            3 => Some(Self::Sqcq),
            _ => None,
        }
    }
}

impl std::fmt::Display for QueueMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Bits of [`QueueMetrics::state`].
const RUNNING: u8 = 1;
const BROKEN: u8 = 2;
/// Bits of [`QueueMetrics::need_wakeup`]: whether the flags below were
/// read (a doorbell queue), SQ NEED_WAKEUP, CQ NEED_WAKEUP.
const NW_KNOWN: u8 = 1;
const NW_SQ: u8 = 2;
const NW_CQ: u8 = 4;

/// No worker recorded in [`QueueMetrics::worker`].
const NO_WORKER: u32 = u32::MAX;

/// The figures of one virtqueue of a device.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct QueueMetrics {
    completions: AtomicU64,
    publishes: AtomicU64,
    calls: AtomicU64,
    kicks: AtomicU64,
    resubmitted: AtomicU64,
    limited: AtomicU64,
    throttled: AtomicU64,
    spins: AtomicU64,
    sleeps: AtomicU64,
    ema_ns: AtomicU64,
    interval_ns: AtomicU64,
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
    in_flight: AtomicU32,
    /// The worker serving (or that last served) the queue, or
    /// [`NO_WORKER`].
    worker: AtomicU32,
    mode: AtomicU8,
    state: AtomicU8,
    need_wakeup: AtomicU8,
    /// Requests per service-time bucket (see [`crate::runtime::latency`]).
    latency: [AtomicU64; BUCKETS],
    latency_sum_ns: AtomicU64,
}

/// What the requests of a batch add to their queue's figures, gathered
/// by the worker in plain fields and taken in once per published batch
/// ([`QueueMetrics::took_in`]).
#[derive(Debug, Default)]
pub(crate) struct BatchFigures {
    /// Bytes read from the medium.
    pub(crate) read_bytes: u64,
    /// Bytes written to the medium.
    pub(crate) written_bytes: u64,
    /// Service times of the requests completed.
    pub(crate) latency: PendingLatency,
}

/// Adds `n` to a counter only one thread writes: a load and a store, no
/// locked read-modify-write on the request path.
fn add(counter: &AtomicU64, n: u64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(n),
        Ordering::Relaxed,
    );
}

impl QueueMetrics {
    /// The queue started in `mode`, on the worker this thread is (if it
    /// is one, see `pass::enter_worker`).
    pub fn started(&self, mode: QueueMode) {
        self.mode
            .store(QueueMode::code(Some(mode)), Ordering::Relaxed);
        let worker = pass::worker().and_then(|w| u32::try_from(w).ok());
        self.worker
            .store(worker.unwrap_or(NO_WORKER), Ordering::Relaxed);
        self.in_flight.store(0, Ordering::Relaxed);
        self.state.store(RUNNING, Ordering::Relaxed);
        self.need_wakeup.store(0, Ordering::Relaxed);
    }

    /// The queue stopped (it keeps its figures and whether it broke);
    /// nothing is in flight any more.
    pub fn stopped(&self) {
        self.in_flight.store(0, Ordering::Relaxed);
        self.state.fetch_and(!RUNNING, Ordering::Relaxed);
    }

    /// The queue was found broken (until it is started again).
    pub fn broke(&self) {
        self.state.fetch_or(BROKEN, Ordering::Relaxed);
    }

    /// One published batch of `completions` used elements.
    pub fn batch(&self, completions: u16) {
        add(&self.completions, u64::from(completions));
        add(&self.publishes, 1);
    }

    /// A call sent (written to the call eventfd, or merged into the
    /// notification pending there).
    pub fn called(&self) {
        add(&self.calls, 1);
    }

    /// Takes in what the requests of a batch added (and clears `batch`).
    pub(crate) fn took_in(&self, batch: &mut BatchFigures) {
        add(&self.read_bytes, std::mem::take(&mut batch.read_bytes));
        add(
            &self.written_bytes,
            std::mem::take(&mut batch.written_bytes),
        );
        batch.latency.drain(
            |i, n| add(&self.latency[i], n),
            |ns| add(&self.latency_sum_ns, ns),
        );
    }

    /// Requests taken from the ring and not completed yet.
    pub(crate) fn in_flight(&self, n: u32) {
        self.in_flight.store(n, Ordering::Relaxed);
    }

    /// Kicks received (the eventfd's count).
    pub fn kicked(&self, n: u64) {
        add(&self.kicks, n);
    }

    /// A request an earlier run of the queue had in flight was handed to
    /// the device again (in-flight tracking, after a reconnect).
    pub fn resubmitted(&self) {
        add(&self.resubmitted, 1);
    }

    /// The queue reached its in-flight limit and left requests on its
    /// ring.
    pub fn limited(&self) {
        add(&self.limited, 1);
    }

    /// The queue set THROTTLE in its SQ doorbell.
    pub fn throttled(&self) {
        add(&self.throttled, 1);
    }

    /// Takes in the poll loop's figures: the counters that grew since
    /// `flushed` (what was taken in last time, from the same poller) and
    /// the gauges as they are; `flushed` becomes `now`.
    pub fn poll_figures(&self, now: &QueueStats, flushed: &mut QueueStats) {
        let d = now.since(flushed);
        add(&self.spins, d.spins);
        add(&self.sleeps, d.sleeps);
        self.ema_ns.store(now.ema_ns, Ordering::Relaxed);
        self.interval_ns.store(now.interval_ns, Ordering::Relaxed);
        *flushed = *now;
    }

    /// NEED_WAKEUP in the SQ and CQ doorbells as last read (doorbell
    /// queues only).
    pub fn need_wakeup(&self, sq: bool, cq: bool) {
        let bits = NW_KNOWN | if sq { NW_SQ } else { 0 } | if cq { NW_CQ } else { 0 };
        self.need_wakeup.store(bits, Ordering::Relaxed);
    }

    /// The figures as they are, `None` for a queue that never ran.
    pub fn snapshot(&self, device: u32, vq: u16) -> Option<QueueSnapshot> {
        let mode = QueueMode::from_code(self.mode.load(Ordering::Relaxed))?;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let state = self.state.load(Ordering::Relaxed);
        let nw = self.need_wakeup.load(Ordering::Relaxed);
        let worker = self.worker.load(Ordering::Relaxed);
        let mut latency = LatencySnapshot {
            sum_ns: get(&self.latency_sum_ns),
            ..LatencySnapshot::default()
        };
        for (b, c) in latency.buckets.iter_mut().zip(&self.latency) {
            *b = get(c);
        }
        Some(QueueSnapshot {
            device,
            vq,
            mode,
            worker: (worker != NO_WORKER).then(|| usize::try_from(worker).unwrap_or(usize::MAX)),
            running: state & RUNNING != 0,
            broken: state & BROKEN != 0,
            completions: get(&self.completions),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            read_bytes: get(&self.read_bytes),
            written_bytes: get(&self.written_bytes),
            latency,
            publishes: get(&self.publishes),
            calls: get(&self.calls),
            kicks: get(&self.kicks),
            resubmitted: get(&self.resubmitted),
            limited: get(&self.limited),
            throttled: get(&self.throttled),
            spins: get(&self.spins),
            sleeps: get(&self.sleeps),
            ema_lat_ns: get(&self.ema_ns),
            interval_ns: get(&self.interval_ns),
            sq_need_wakeup: (nw & NW_KNOWN != 0).then_some(nw & NW_SQ != 0),
            cq_need_wakeup: (nw & NW_KNOWN != 0).then_some(nw & NW_CQ != 0),
        })
    }
}

/// One queue's figures at one moment: what `--stats-file` lists, what the
/// log line and the `stats_get` method print.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct QueueSnapshot {
    /// Device number.
    pub device: u32,
    /// Virtqueue index.
    pub vq: u16,
    /// How it is (or was last) served.
    pub mode: QueueMode,
    /// The worker serving it (or that last served it), if it was started
    /// by one.
    pub worker: Option<usize>,
    /// Whether it runs now.
    pub running: bool,
    /// Whether it was found broken since it last started.
    pub broken: bool,
    /// Requests completed (used elements published).
    pub completions: u64,
    /// Requests taken from the ring and not completed yet (as of the
    /// worker's last pass over the queue; 0 once stopped).
    pub in_flight: u32,
    /// Bytes read from the medium by requests that succeeded (SCSI READ,
    /// virtio-blk IN).
    pub read_bytes: u64,
    /// Bytes written to the medium by requests that succeeded (SCSI
    /// WRITE, virtio-blk OUT).
    pub written_bytes: u64,
    /// Service times of the completed requests.
    pub latency: LatencySnapshot,
    /// Stores of `used->idx` (one per batch).
    pub publishes: u64,
    /// Calls sent (notifications the driver asked for).
    pub calls: u64,
    /// Kicks received.
    pub kicks: u64,
    /// Requests of an earlier run handed to the device again after a
    /// reconnect (in-flight tracking).
    pub resubmitted: u64,
    /// Times the queue reached its in-flight limit (`--max-inflight`, or
    /// a backstore refusing work) and left requests on its ring.
    pub limited: u64,
    /// Times it set THROTTLE in its SQ doorbell (doorbell queues).
    pub throttled: u64,
    /// Polls that found nothing new (polled queues).
    pub spins: u64,
    /// Times the queue's poller slept with NEED_WAKEUP set.
    pub sleeps: u64,
    /// Moving average of the gaps between submissions (the RFC's
    /// `ema_lat`), ns.
    pub ema_lat_ns: u64,
    /// The spin window (the RFC's `interval`), ns.
    pub interval_ns: u64,
    /// NEED_WAKEUP in the SQ doorbell (doorbell queues): the device's
    /// poller sleeps.
    pub sq_need_wakeup: Option<bool>,
    /// NEED_WAKEUP in the CQ doorbell: the driver's poller sleeps.
    pub cq_need_wakeup: Option<bool>,
}

impl QueueSnapshot {
    /// The log line of what happened since `earlier` (same queue), or
    /// since the start: the RFC's format plus the kicks received for a
    /// polled queue (`wakeups` are the calls sent), `cq`, `kicks` and
    /// `calls` for a kicked one.
    pub fn line(&self, earlier: Option<&QueueSnapshot>) -> String {
        let since = |now: u64, pick: fn(&QueueSnapshot) -> u64| {
            earlier.map_or(now, |e| counted_since(now, pick(e)))
        };
        let cq = since(self.completions, |s| s.completions);
        let kicks = since(self.kicks, |s| s.kicks);
        let calls = since(self.calls, |s| s.calls);
        if self.mode == QueueMode::Kick {
            return format!("vq[{}] cq={cq} kicks={kicks} calls={calls}", self.vq);
        }
        let stats = QueueStats {
            queue: self.vq,
            completions: cq,
            ema_ns: self.ema_lat_ns,
            interval_ns: self.interval_ns,
            spins: since(self.spins, |s| s.spins),
            sleeps: since(self.sleeps, |s| s.sleeps),
            wakeups: calls,
        };
        format!("{stats} kicks={kicks}")
    }
}

/// The figures of one device (all connections since the daemon started).
#[derive(Debug)]
pub struct DeviceMetrics {
    /// Chains that could not be followed (loop, too long, bad index or
    /// indirect table): returned with length 0.
    pub malformed_chains: AtomicU64,
    /// Chains with a buffer outside guest memory.
    pub out_of_memory: AtomicU64,
    /// Chains with device-readable buffers after device-writable ones.
    pub wrong_order: AtomicU64,
    /// Requests whose header was shorter than the configured size.
    pub short_headers: AtomicU64,
    /// Requests whose response buffer was too small to hold a response.
    pub short_responses: AtomicU64,
    /// Requests to a target other than 0, answered BAD_TARGET: a guest
    /// scanning its bus (Linux asks each target QEMU's configuration
    /// space names), not an error.
    pub other_targets: AtomicU64,
    /// Requests to a LUN that does not exist.
    pub bad_lun: AtomicU64,
    /// Data buffers too small for the transfer (OVERRUN).
    pub overruns: AtomicU64,
    /// Requests refused before reaching the backstore (virtio-blk: out of
    /// range, misaligned, read-only, unsupported).
    pub bad_requests: AtomicU64,
    /// Heads made available again while still in flight.
    pub duplicate_heads: AtomicU64,
    /// Malformed control queue requests.
    pub bad_control: AtomicU64,
    /// Queues stopped because their ring was corrupt.
    pub broken_rings: AtomicU64,
    /// Backstore I/O errors reported to the guest (SCSI sense data, blk
    /// IOERR), but for those of `ceph_errors`.
    pub io_errors: AtomicU64,
    /// Requests the Ceph cluster failed (an RBD LUN or disk: librbd's
    /// time-outs, blocklisting, OSD errors), reported to the guest as
    /// `io_errors` are but counted apart from them.
    pub ceph_errors: AtomicU64,
    /// Calls merged into a notification still pending because the
    /// frontend left the call counter saturated.
    pub calls_coalesced: AtomicU64,
    /// Writes to a frontend eventfd that blocked and were interrupted by
    /// the stall guard: their queue was stopped.
    pub stalled_writes: AtomicU64,
    /// Kick descriptors that hung up or failed: their queue was stopped.
    pub dead_kicks: AtomicU64,
    /// vhost-user messages refused (bad values, unsupported requests).
    pub failed_messages: AtomicU64,
    /// Connections the daemon closed because the frontend misbehaved
    /// (incomplete message, unread replies, repeated failures, lost
    /// memory).
    pub dropped_connections: AtomicU64,
    /// Guest memory pages lost under a mapping (SIGBUS recovered).
    pub memory_faults: AtomicU64,
    /// Configuration changes the frontend could not be told of: no
    /// backend channel, or one it does not read.
    pub config_changes_lost: AtomicU64,
    /// Guest pages written while logging beyond the end of the dirty log,
    /// so never marked (a migration would copy them stale). The log's
    /// size is checked against guest memory: this stays 0 unless that
    /// check has a hole.
    pub log_marks_lost: AtomicU64,
    /// Device number, as in [`QueueSnapshot::device`].
    device: u32,
    queues: Box<[QueueMetrics]>,
}

impl DeviceMetrics {
    /// Zeroed figures for device `device` with virtqueues `0..queues`.
    pub fn new(device: u32, queues: usize) -> Self {
        let zero = AtomicU64::default;
        Self {
            malformed_chains: zero(),
            out_of_memory: zero(),
            wrong_order: zero(),
            short_headers: zero(),
            short_responses: zero(),
            other_targets: zero(),
            bad_lun: zero(),
            overruns: zero(),
            bad_requests: zero(),
            duplicate_heads: zero(),
            bad_control: zero(),
            broken_rings: zero(),
            io_errors: zero(),
            ceph_errors: zero(),
            calls_coalesced: zero(),
            stalled_writes: zero(),
            dead_kicks: zero(),
            failed_messages: zero(),
            dropped_connections: zero(),
            memory_faults: zero(),
            config_changes_lost: zero(),
            log_marks_lost: zero(),
            device,
            queues: (0..queues).map(|_| QueueMetrics::default()).collect(),
        }
    }

    /// Adds one to `counter` (an error counter: any thread).
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request the backstore failed: in `ceph_errors` when the
    /// Ceph cluster failed it, else in `io_errors`.
    pub fn count_backstore_failure(&self, ceph: bool) {
        Self::bump(if ceph {
            &self.ceph_errors
        } else {
            &self.io_errors
        });
    }

    /// The figures of virtqueue `vq` (`None` past the last one).
    pub fn queue(&self, vq: u16) -> Option<&QueueMetrics> {
        self.queues.get(usize::from(vq))
    }

    /// Every queue that ever ran, by virtqueue index.
    pub fn queues(&self) -> impl Iterator<Item = QueueSnapshot> + '_ {
        self.queues
            .iter()
            .enumerate()
            .filter_map(|(i, q)| q.snapshot(self.device, u16::try_from(i).unwrap_or(u16::MAX)))
    }

    /// The error counters as (name, value) pairs.
    pub fn errors(&self) -> [(&'static str, u64); 20] {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        [
            ("malformed_chains", get(&self.malformed_chains)),
            ("out_of_memory", get(&self.out_of_memory)),
            ("wrong_order", get(&self.wrong_order)),
            ("short_headers", get(&self.short_headers)),
            ("short_responses", get(&self.short_responses)),
            ("bad_lun", get(&self.bad_lun)),
            ("overruns", get(&self.overruns)),
            ("bad_requests", get(&self.bad_requests)),
            ("duplicate_heads", get(&self.duplicate_heads)),
            ("bad_control", get(&self.bad_control)),
            ("broken_rings", get(&self.broken_rings)),
            ("io_errors", get(&self.io_errors)),
            ("ceph_errors", get(&self.ceph_errors)),
            ("stalled_writes", get(&self.stalled_writes)),
            ("dead_kicks", get(&self.dead_kicks)),
            ("failed_messages", get(&self.failed_messages)),
            ("dropped_connections", get(&self.dropped_connections)),
            ("memory_faults", get(&self.memory_faults)),
            ("config_changes_lost", get(&self.config_changes_lost)),
            ("log_marks_lost", get(&self.log_marks_lost)),
        ]
    }

    /// The counters of normal events a device answers without anything
    /// being wrong, as (name, value) pairs: calls merged into one already
    /// pending, requests to other targets (a bus scan).
    pub fn events(&self) -> [(&'static str, u64); 2] {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        [
            ("calls_coalesced", get(&self.calls_coalesced)),
            ("other_targets", get(&self.other_targets)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn poll(spins: u64, sleeps: u64) -> QueueStats {
        QueueStats {
            queue: 2,
            completions: 0,
            ema_ns: 100,
            interval_ns: 400,
            spins,
            sleeps,
            wakeups: 0,
        }
    }

    #[test]
    fn a_queue_that_never_ran_has_no_figures() {
        let m = DeviceMetrics::new(3, 4);
        assert_eq!(m.queues().count(), 0);
        assert!(m.queue(4).is_none());
        m.queue(2).unwrap().started(QueueMode::Kick);
        let s: Vec<_> = m.queues().collect();
        assert_eq!((s.len(), s[0].device, s[0].vq), (1, 3, 2));
        assert!(s[0].running && !s[0].broken);
    }

    #[test]
    fn counters_go_on_across_restarts_and_pollers() {
        let m = DeviceMetrics::new(0, 3);
        let q = m.queue(2).unwrap();
        q.started(QueueMode::Sqcq);
        q.batch(5);
        q.called();
        q.batch(3);
        q.kicked(2);
        let mut flushed = QueueStats::default();
        q.poll_figures(&poll(10, 1), &mut flushed);
        q.poll_figures(&poll(15, 2), &mut flushed);
        q.broke();
        q.stopped();
        let s = q.snapshot(0, 2).unwrap();
        assert!(!s.running && s.broken);
        // A new start: a new poller counting from zero, same totals.
        q.started(QueueMode::Sqcq);
        let mut flushed = QueueStats::default();
        q.poll_figures(&poll(4, 0), &mut flushed);
        q.batch(1);
        q.called();
        let s = q.snapshot(0, 2).unwrap();
        assert_eq!((s.completions, s.publishes, s.calls, s.kicks), (9, 3, 2, 2));
        assert_eq!((s.spins, s.sleeps), (19, 2));
        assert!(s.running && !s.broken, "a start clears broken");
        assert_eq!((s.sq_need_wakeup, s.cq_need_wakeup), (None, None));
        q.need_wakeup(true, false);
        let s = q.snapshot(0, 2).unwrap();
        assert_eq!(
            (s.sq_need_wakeup, s.cq_need_wakeup),
            (Some(true), Some(false))
        );
    }

    #[test]
    fn the_log_line_is_the_rfcs_for_the_interval() {
        let m = DeviceMetrics::new(0, 3);
        let q = m.queue(2).unwrap();
        q.started(QueueMode::Sqcq);
        q.batch(10);
        q.called();
        q.kicked(1);
        let mut flushed = QueueStats::default();
        q.poll_figures(&poll(10, 1), &mut flushed);
        let a = q.snapshot(0, 2).unwrap();
        q.batch(15);
        q.kicked(2);
        let b = q.snapshot(0, 2).unwrap();
        assert_eq!(
            b.line(Some(&a)),
            "vq[2] cq=15 ema_lat=100ns interval=400ns spins=0 sleeps=0 wakeups=0 kicks=2"
        );
        let k = QueueSnapshot {
            mode: QueueMode::Kick,
            ..a
        };
        assert_eq!(k.line(None), "vq[2] cq=10 kicks=1 calls=1");
    }

    #[test]
    fn modes_serialize_as_their_names() {
        for m in [QueueMode::Kick, QueueMode::RingPoll, QueueMode::Sqcq] {
            assert_eq!(
                serde_json::to_value(m).unwrap(),
                serde_json::Value::from(m.as_str())
            );
        }
    }
}
