//! Per-device counters of everything the guest did wrong, and of queue
//! failures. Workers of one device share them: they are atomics touched
//! only on error paths, so the request path shares no cache line between
//! workers in the common case.
//!
//! Beside them, [`QueueStats`]: per-virtqueue counts of completions,
//! used-index publishes and calls, one cache line per queue written only by
//! the worker that serves it, once per batch.

use std::sync::atomic::{AtomicU64, Ordering};

/// Error counters of one device (all connections since start).
#[derive(Debug, Default)]
pub struct DeviceCounters {
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
    /// Requests to a target that does not exist.
    pub bad_target: AtomicU64,
    /// Requests to a LUN that does not exist.
    pub bad_lun: AtomicU64,
    /// Data buffers too small for the transfer (OVERRUN).
    pub overruns: AtomicU64,
    /// Heads made available again while still in flight.
    pub duplicate_heads: AtomicU64,
    /// Malformed control queue requests.
    pub bad_control: AtomicU64,
    /// Queues stopped because their ring was corrupt.
    pub broken_rings: AtomicU64,
    /// Backstore I/O errors reported to the guest as sense data.
    pub io_errors: AtomicU64,
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
    /// Per-virtqueue statistics.
    pub queues: QueueStatsTable,
}

/// Statistics of one virtqueue (every connection since start). Only the
/// worker serving the queue writes them, once per published batch.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct QueueStats {
    /// Requests completed (used elements published).
    pub completions: AtomicU64,
    /// Stores of `used->idx`: one per batch.
    pub publishes: AtomicU64,
    /// Writes to the call eventfd.
    pub calls: AtomicU64,
}

impl QueueStats {
    /// Counts one published batch of `completions` used elements and
    /// whether it signalled the call eventfd (Relaxed: statistics).
    pub fn batch(&self, completions: u16, called: bool) {
        self.completions
            .fetch_add(u64::from(completions), Ordering::Relaxed);
        self.publishes.fetch_add(1, Ordering::Relaxed);
        if called {
            self.calls.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `(completions, publishes, calls)`.
    pub fn get(&self) -> (u64, u64, u64) {
        (
            self.completions.load(Ordering::Relaxed),
            self.publishes.load(Ordering::Relaxed),
            self.calls.load(Ordering::Relaxed),
        )
    }
}

/// One [`QueueStats`] per possible virtqueue of a device.
#[derive(Debug)]
pub struct QueueStatsTable(Box<[QueueStats]>);

impl Default for QueueStatsTable {
    fn default() -> Self {
        let n = 2 + usize::from(crate::session::MAX_REQUEST_QUEUES);
        QueueStatsTable((0..n).map(|_| QueueStats::default()).collect())
    }
}

impl QueueStatsTable {
    /// The statistics of virtqueue `vq` (`None` past the largest index).
    pub fn get(&self, vq: u16) -> Option<&QueueStats> {
        self.0.get(usize::from(vq))
    }

    /// `(vq, completions, publishes, calls)` of every queue that did work.
    pub fn active(&self) -> impl Iterator<Item = (u16, u64, u64, u64)> + '_ {
        self.0.iter().enumerate().filter_map(|(i, s)| {
            let (c, p, k) = s.get();
            (p > 0).then(|| (u16::try_from(i).unwrap_or(u16::MAX), c, p, k))
        })
    }
}

impl DeviceCounters {
    /// Adds one to `counter` (Relaxed: a statistic, orders nothing).
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A snapshot as (name, value) pairs, for logs and tests.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            ("malformed_chains", get(&self.malformed_chains)),
            ("out_of_memory", get(&self.out_of_memory)),
            ("wrong_order", get(&self.wrong_order)),
            ("short_headers", get(&self.short_headers)),
            ("short_responses", get(&self.short_responses)),
            ("bad_target", get(&self.bad_target)),
            ("bad_lun", get(&self.bad_lun)),
            ("overruns", get(&self.overruns)),
            ("duplicate_heads", get(&self.duplicate_heads)),
            ("bad_control", get(&self.bad_control)),
            ("broken_rings", get(&self.broken_rings)),
            ("io_errors", get(&self.io_errors)),
            ("calls_coalesced", get(&self.calls_coalesced)),
            ("stalled_writes", get(&self.stalled_writes)),
            ("dead_kicks", get(&self.dead_kicks)),
            ("failed_messages", get(&self.failed_messages)),
            ("dropped_connections", get(&self.dropped_connections)),
            ("memory_faults", get(&self.memory_faults)),
        ]
    }
}
