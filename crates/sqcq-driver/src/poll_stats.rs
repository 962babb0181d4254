//! The driver-side pollers' per-queue figures, in the RFC's terms
//! (`vq[N] cq=... ema_lat=... interval=... spins=... sleeps=...
//! wakeups=...`), shared with whoever reports them.
//!
//! Every polling mode keeps one `StatsCell` per queue: the driver poll
//! thread's (`sqcq`), or the submitter's own poller (`sqcq-inline`,
//! `ring-poll`, and `poll-queue`, whose window never ends and which so
//! reports no sleeps). The poller's thread stores its figures; reporters
//! read them through a [`PollStats`] handle.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sqcq_protocol::QueueStats;

/// A value on a cache line of its own.
#[derive(Debug, Default)]
#[repr(align(64))]
pub(crate) struct Line<T>(pub(crate) T);

/// What the poller's thread stores.
#[derive(Debug, Default)]
struct PollerFigures {
    completions: AtomicU64,
    ema_ns: AtomicU64,
    interval_ns: AtomicU64,
    spins: AtomicU64,
    sleeps: AtomicU64,
    /// Calls the device sent, counted from the call eventfd by whoever
    /// reads it.
    calls: AtomicU64,
}

/// The figures of one queue's driver-side poller. Every field has a
/// single writer; all accesses are Relaxed, as the figures are for
/// reports only and order nothing.
#[derive(Debug)]
pub(crate) struct StatsCell {
    queue: u16,
    /// Written by the thread that runs the poller.
    poller: Line<PollerFigures>,
    /// Kicks the submitter sent, written by the submitter (a line of its
    /// own: with a poll thread, it is another thread).
    kicks: Line<AtomicU64>,
}

impl StatsCell {
    pub(crate) fn new(queue: u16) -> Self {
        Self {
            queue,
            poller: Line::default(),
            kicks: Line::default(),
        }
    }

    /// Stores the poller's figures (not `wakeups`, which are the kicks).
    pub(crate) fn store(&self, s: &QueueStats) {
        let p = &self.poller.0;
        // Relaxed: report figures, single writer.
        p.completions.store(s.completions, Ordering::Relaxed);
        p.ema_ns.store(s.ema_ns, Ordering::Relaxed);
        p.interval_ns.store(s.interval_ns, Ordering::Relaxed);
        p.spins.store(s.spins, Ordering::Relaxed);
        p.sleeps.store(s.sleeps, Ordering::Relaxed);
    }

    /// Stores the total of calls counted so far.
    pub(crate) fn store_calls(&self, calls: u64) {
        // Relaxed: report figure, single writer.
        self.poller.0.calls.store(calls, Ordering::Relaxed);
    }

    /// Stores the total of kicks sent so far.
    pub(crate) fn store_kicks(&self, kicks: u64) {
        // Relaxed: report figure, single writer.
        self.kicks.0.store(kicks, Ordering::Relaxed);
    }

    /// Calls counted so far.
    pub(crate) fn calls(&self) -> u64 {
        // Relaxed: report figure.
        self.poller.0.calls.load(Ordering::Relaxed)
    }

    /// The figures, with the submitter's kicks as wakeups.
    pub(crate) fn snapshot(&self) -> QueueStats {
        let p = &self.poller.0;
        // Relaxed throughout: report figures, no ordering needed.
        QueueStats {
            queue: self.queue,
            completions: p.completions.load(Ordering::Relaxed),
            ema_ns: p.ema_ns.load(Ordering::Relaxed),
            interval_ns: p.interval_ns.load(Ordering::Relaxed),
            spins: p.spins.load(Ordering::Relaxed),
            sleeps: p.sleeps.load(Ordering::Relaxed),
            wakeups: self.kicks.0.load(Ordering::Relaxed),
        }
    }
}

/// The per-queue statistics of a device's driver-side pollers, in the
/// RFC's terms (`wakeups` are the submitters' kicks). A cheap handle: the
/// pollers keep updating what it shows.
#[derive(Debug, Clone, Default)]
pub struct PollStats {
    queues: Vec<Arc<StatsCell>>,
}

impl PollStats {
    pub(crate) fn new(queues: Vec<Arc<StatsCell>>) -> Self {
        Self { queues }
    }

    /// One line per queue.
    pub fn snapshot(&self) -> Vec<QueueStats> {
        self.queues.iter().map(|q| q.snapshot()).collect()
    }

    /// Calls the device sent, per queue.
    pub fn calls(&self) -> Vec<u64> {
        self.queues.iter().map(|q| q.calls()).collect()
    }

    /// Adds the queues of `other` after these.
    pub fn extend(&mut self, other: PollStats) {
        self.queues.extend(other.queues);
    }

    /// Whether no queue is covered.
    pub fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }
}
