//! What a queue counts per request: requests taken, requests in flight,
//! when each was taken, and what the completed ones add to the queue's
//! figures, kept in plain fields and added to the shared metrics once
//! per published batch.

use crate::runtime::metrics::{BatchFigures, QueueMetrics};
use crate::runtime::pass;

/// The per-request figures of one queue.
#[derive(Debug)]
pub(crate) struct Counters {
    /// Requests taken since the queue started.
    requests: u64,
    /// When each head in flight was taken (the pass clock, [`pass`]), by
    /// head index.
    taken_at: Box<[u64]>,
    /// The pass time of the chains being taken now (read from the pass
    /// clock once per batch, not per chain).
    taking_at: u64,
    /// Requests accepted and not completed, and the figure last shown in
    /// the queue's metrics.
    in_flight: u32,
    in_flight_shown: u32,
    /// What the requests completed since the last published batch add to
    /// the queue's figures.
    figures: BatchFigures,
}

impl Counters {
    /// The counters of a queue of `size` entries.
    pub(crate) fn new(size: u16) -> Self {
        Counters {
            requests: 0,
            taken_at: vec![0; usize::from(size)].into_boxed_slice(),
            taking_at: 0,
            in_flight: 0,
            in_flight_shown: 0,
            figures: BatchFigures::default(),
        }
    }

    /// A batch of chains is being taken now.
    #[inline]
    pub(crate) fn start_batch(&mut self) {
        self.taking_at = pass::now();
    }

    /// A chain was taken from the ring.
    #[inline]
    pub(crate) fn taken(&mut self) {
        self.requests += 1;
    }

    /// Requests accepted and not completed.
    #[inline]
    pub(crate) fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Requests taken since the queue started.
    pub(crate) fn requests(&self) -> u64 {
        self.requests
    }

    /// The request at `head` is in flight from now on, taken in this
    /// batch.
    #[inline]
    pub(crate) fn accepted(&mut self, head: u16) {
        if let Some(t) = self.taken_at.get_mut(usize::from(head)) {
            *t = self.taking_at;
        }
        self.in_flight = self.in_flight.wrapping_add(1);
    }

    /// The request at `head` completed: its service time goes in the
    /// batch's figures.
    #[inline]
    pub(crate) fn completed(&mut self, head: u16) {
        let ns = self.service_ns(head);
        self.figures.latency.record(ns);
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// How long the request at `head` has been in flight (pass clock).
    #[inline]
    pub(crate) fn service_ns(&self, head: u16) -> u64 {
        let now = pass::now();
        let taken = self.taken_at.get(usize::from(head)).copied();
        now.saturating_sub(taken.unwrap_or(now))
    }

    /// A request completing now moved `read` bytes from the medium and
    /// `written` bytes to it.
    #[inline]
    pub(crate) fn transferred(&mut self, read: u64, written: u64) {
        self.figures.read_bytes = self.figures.read_bytes.wrapping_add(read);
        self.figures.written_bytes = self.figures.written_bytes.wrapping_add(written);
    }

    /// Shows the requests in flight in `metrics` if that changed.
    #[inline]
    pub(crate) fn show_in_flight(&mut self, metrics: Option<&QueueMetrics>) {
        if self.in_flight != self.in_flight_shown {
            self.in_flight_shown = self.in_flight;
            if let Some(m) = metrics {
                m.in_flight(self.in_flight);
            }
        }
    }

    /// Counts one published batch of `batch` requests in `metrics`, with
    /// what its requests add.
    pub(crate) fn published(&mut self, metrics: Option<&QueueMetrics>, batch: u16) {
        if let Some(m) = metrics {
            m.batch(batch);
            m.took_in(&mut self.figures);
        }
    }
}
