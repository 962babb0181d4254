//! One virtqueue as the frontend runs it: the driver-side ring, its
//! eventfds and its notification strategy, bound together once at set-up.

use std::os::fd::OwnedFd;
use std::time::Instant;

use vm_memory::GuestAddress;

use crate::memory::DriverMemory;
use sqcq_protocol::QueueStats;

use crate::notify::{
    DoorbellState, IdleState, Notifier, NotifyCounters, NotifyError, NotifyMode, QueueEvents,
};
use crate::poll_stats::PollStats;
use crate::vring::{QueueConfig, QueueError, Ring};

/// A [`Ring`] with its kick and call eventfds and the [`Notifier`]
/// of its notification mode.
#[derive(Debug)]
pub struct Virtqueue {
    index: u16,
    ring: Ring,
    notifier: Box<dyn Notifier>,
    events: QueueEvents,
}

impl Virtqueue {
    /// Lays out the ring of vring `index` in `mem` and binds it to
    /// `events` and the strategy of `mode`, a standard mode (the doorbell
    /// modes need a poll thread:
    /// [`PollGroupBuilder::attach`](crate::sqcq::PollGroupBuilder::attach)
    /// and [`Self::with_notifier`]).
    pub fn new(
        mem: &mut DriverMemory,
        index: u16,
        config: QueueConfig,
        mode: NotifyMode,
        events: QueueEvents,
    ) -> Result<Self, QueueError> {
        let notifier = mode
            .notifier(index)
            .ok_or(QueueError::NeedsPollThread(mode.name()))?;
        let ring = Ring::new(mem, config)?;
        Ok(Self::with_notifier(index, ring, notifier, events))
    }

    /// Binds an existing ring to a strategy of one's own (tests, and modes
    /// that live outside this crate).
    pub fn with_notifier(
        index: u16,
        mut ring: Ring,
        mut notifier: Box<dyn Notifier>,
        mut events: QueueEvents,
    ) -> Self {
        notifier.start(&mut ring, &mut events);
        Self {
            index,
            ring,
            notifier,
            events,
        }
    }

    /// The vring index (0 control, 1 event, 2.. requests for virtio-scsi).
    pub fn index(&self) -> u16 {
        self.index
    }

    /// The notification mode.
    pub fn mode(&self) -> NotifyMode {
        self.notifier.mode()
    }

    /// The ring.
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// The ring, to add requests and pop completions.
    pub fn ring_mut(&mut self) -> &mut Ring {
        &mut self.ring
    }

    /// The eventfds.
    pub fn events(&self) -> &QueueEvents {
        &self.events
    }

    /// Follows a new connection to the device: its socket's hangup ends
    /// the waits from now on.
    pub fn reattach(&mut self, hangup: OwnedFd) {
        self.events.set_hangup(Some(hangup));
    }

    /// Guest-physical addresses of the descriptor table, avail and used
    /// rings (of a packed ring: its descriptor ring, driver and device
    /// areas).
    pub fn addresses(&self) -> [GuestAddress; 3] {
        self.ring.addresses()
    }

    /// Publishes the requests added since the last publish and notifies the
    /// device as the mode decides.
    pub fn publish(&mut self) -> Result<(), NotifyError> {
        self.notifier.publish(&mut self.ring, &mut self.events)
    }

    /// Waits, bounded by the queue's timeout, until the ring has used
    /// entries (or is broken).
    pub fn wait(&mut self) -> Result<(), NotifyError> {
        let deadline = Instant::now() + self.events.timeout();
        self.notifier
            .wait(&mut self.ring, &mut self.events, deadline)
    }

    /// The notification counters so far.
    pub fn counters(&mut self) -> NotifyCounters {
        let mut counters = self.events.counters();
        if let Some(calls) = self.notifier.calls() {
            counters.calls = calls;
        }
        counters
    }

    /// The statistics of this queue's driver-side poller (the poll thread
    /// of `sqcq`, the submitter's own in the other polling modes).
    pub fn poll_stats(&self) -> Option<QueueStats> {
        self.notifier.poll_stats()
    }

    /// A handle on [`Self::poll_stats`] for another thread (a reporter),
    /// valid while the queue runs and after.
    pub fn stats_handle(&self) -> Option<PollStats> {
        self.notifier.stats_handle()
    }

    /// Tells the queue its submitter has nothing in flight and stops
    /// waiting for a while (between bursts). In `sqcq-inline`, where the
    /// submitter is the queue's CQ consumer, it asks the device for a call
    /// (CQ NEED_WAKEUP), so that the next completion wakes it; the next
    /// [`Self::wait`] withdraws the request once it finds work. A no-op in
    /// the other modes.
    pub fn park(&mut self) {
        self.notifier.park(&mut self.ring);
    }

    /// Whether the device asks for no more requests for now (see
    /// [`Notifier::throttle`]).
    pub fn throttle(&mut self, fresh: bool) -> bool {
        self.notifier.throttle(fresh)
    }

    /// Whether both sides' pollers are asleep, in the doorbell modes.
    pub fn idle_state(&self) -> Option<IdleState> {
        self.notifier.idle_state()
    }

    /// What the queue's SQ and CQ doorbells hold (`None` without
    /// doorbells): an observation for tests and reports.
    pub fn doorbells(&self) -> Option<DoorbellState> {
        self.notifier.doorbells()
    }
}
