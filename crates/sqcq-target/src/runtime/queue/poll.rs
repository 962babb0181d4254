//! A request queue in poll mode: what its poller watches, and the queue's
//! side of the worker's poll loop ([`crate::runtime::poll`]).
//!
//! With VIRTIO_F_SQCQ_POLL the poller watches the SQ doorbell
//! (`SqConsumer` over the guest memory at `doorbell_location`), every
//! doorbell value is checked against the queue's next avail index, and
//! completions are announced through the CQ doorbell: after the used index
//! is published, `CqProducer::publish` says whether the driver's poller
//! sleeps, and only then is the call eventfd signalled, whatever EVENT_IDX
//! and VRING_AVAIL_F_NO_INTERRUPT say (spec section 6). A doorbell area
//! that is not where the spec allows, or a doorbell value no correct
//! driver writes, breaks the queue like a corrupt ring: it stops, the
//! error eventfd is signalled, and the doorbells are not touched again.
//!
//! A packed ring's doorbells (spec section 10) follow its Device Area and
//! hold positions: `sq.idx` moving is a hint ([`PackedSq`]), and the flags
//! of the descriptor at the device's next position decide whether there
//! is work, while polling and in the re-check before a sleep.
//!
//! In `ring-poll` mode the poller watches the avail index
//! ([`RingWatch`]), or a packed ring's next descriptor ([`PackedWatch`]),
//! and completions follow the standard rules.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use sqcq_protocol::packed::Position;
use sqcq_protocol::{
    CqProducer, DoorbellLocation, GuestDoorbell, GuestDoorbellError, LayoutError, NonsenseIndex,
    Poll, Poller, QueueStats, SleepCheck, SpinPolicy, SqConsumer, Wake, Watch, check_index,
    guest_doorbells,
};
use thiserror::Error;
use tracing::error;
use vm_memory::{Bytes, GuestAddress};

use super::{RingConfig, ServedQueue, SubmissionSource, Vring};
use crate::guest_warn;
use crate::runtime::batch::Batch;
use crate::runtime::guest::{self, GuestMem};
use crate::runtime::metrics::QueueMode;
use crate::runtime::ring::Ring;
use crate::runtime::ring_poll::{PackedWatch, RingWatch};
use crate::runtime::split::RingError;

type Cell = GuestDoorbell<GuestMem>;

/// Why a polled queue cannot go on.
#[derive(Debug, Error)]
pub enum PollError {
    /// The doorbell area cannot be where the ring addresses put it.
    #[error("invalid doorbell location")]
    Layout(#[source] LayoutError),
    /// The doorbell area is not inside one region of guest memory.
    #[error("doorbells not in guest memory")]
    Memory(#[source] GuestDoorbellError),
    /// The driver wrote a doorbell index no correct driver writes.
    #[error("nonsense SQ doorbell index")]
    Index(#[source] NonsenseIndex),
    /// The driver wrote a `sq.idx` that names no position of its packed
    /// ring (spec 10.4).
    #[error("SQ doorbell index {value:#06x} names no position in a packed ring of {size}")]
    Position {
        /// The value read.
        value: u16,
        /// The queue size.
        size: u16,
    },
    /// The avail ring could not be read or its flags written.
    #[error("avail ring not accessible")]
    Ring(#[source] RingError),
    /// `fault_break` on the admin socket.
    #[cfg(feature = "fault-injection")]
    #[error("nonsense SQ doorbell index (injected by the admin socket)")]
    Injected,
}

/// What a polled queue watches for submissions.
#[derive(Debug)]
pub(crate) enum SqWatch {
    /// The SQ doorbell (VIRTIO_F_SQCQ_POLL).
    Doorbell(SqConsumer<Cell>),
    /// The avail index (`ring-poll`).
    Ring(RingWatch),
    /// The descriptor at a packed ring's next position (`ring-poll`).
    Packed(PackedWatch),
    /// The SQ doorbell of a packed ring (VIRTIO_F_SQCQ_POLL).
    PackedDoorbell(PackedSq),
}

impl SqWatch {
    /// The SQ doorbell's consumer, when the watch has one.
    fn consumer(&mut self) -> Option<&mut SqConsumer<Cell>> {
        match self {
            SqWatch::Doorbell(c) => Some(c),
            SqWatch::PackedDoorbell(p) => Some(&mut p.sq),
            SqWatch::Ring(_) | SqWatch::Packed(_) => None,
        }
    }
}

/// The SQ doorbell of a packed ring (spec section 10.2): a new `sq.idx`
/// says the driver moved, and the flags of the descriptor at the device's
/// next position decide, in the poll and in the re-check before a sleep
/// (C5). A position repeats every two laps, so no comparison of `sq.idx`
/// could decide that the device may sleep.
#[derive(Debug)]
pub(crate) struct PackedSq {
    sq: SqConsumer<Cell>,
    ring: PackedWatch,
    size: u16,
    /// A `sq.idx` whose offset is not below the queue size.
    bad: Option<u16>,
}

impl Watch for PackedSq {
    fn poll(&mut self) -> Option<u16> {
        // Relaxed load; Acquire fence once it moved (pairs with the
        // driver's Release store of `sq.idx`, after the flags it covers).
        let idx = self.sq.poll()?;
        if Position::decode(idx, self.size).is_none() {
            self.bad.get_or_insert(idx);
            return None;
        }
        self.ring.poll()
    }

    fn prepare_sleep(&mut self) -> SleepCheck {
        let ring = &mut self.ring;
        let mut at = None;
        // NEED_WAKEUP, fence 2 (pairs with the driver's fence 1 between
        // its `sq.idx` store and its `sq.flags` load), then the flags of
        // the descriptor at the device's position.
        if self.sq.prepare_sleep_on(|| {
            at = ring.poll();
            at.is_some()
        }) && let Some(at) = at
        {
            return SleepCheck::Work(at);
        }
        SleepCheck::Sleep
    }

    fn finish_sleep(&mut self) {
        self.sq.finish_sleep();
    }
}

impl Watch for SqWatch {
    fn poll(&mut self) -> Option<u16> {
        match self {
            SqWatch::Doorbell(c) => c.poll(),
            SqWatch::Ring(r) => r.poll(),
            SqWatch::Packed(p) => p.poll(),
            SqWatch::PackedDoorbell(p) => p.poll(),
        }
    }
    fn prepare_sleep(&mut self) -> SleepCheck {
        match self {
            SqWatch::Doorbell(c) => c.prepare_sleep(),
            SqWatch::Ring(r) => r.prepare_sleep(),
            SqWatch::Packed(p) => p.prepare_sleep(),
            SqWatch::PackedDoorbell(p) => p.prepare_sleep(),
        }
    }
    fn finish_sleep(&mut self) {
        match self {
            SqWatch::Doorbell(c) => c.finish_sleep(),
            SqWatch::Ring(r) => r.finish_sleep(),
            SqWatch::Packed(p) => p.finish_sleep(),
            SqWatch::PackedDoorbell(p) => p.finish_sleep(),
        }
    }
}

/// The device's side of the CQ doorbell, and where the doorbells are.
#[derive(Debug)]
struct CqDoorbell {
    producer: CqProducer<Cell>,
    location: DoorbellLocation,
}

/// The poll state of one queue.
#[derive(Debug)]
pub(crate) struct QueuePoll {
    poller: Poller<SqWatch>,
    /// The CQ doorbell (VIRTIO_F_SQCQ_POLL only).
    cq: Option<CqDoorbell>,
    /// The memory map the doorbells (or the ring watch) point into.
    map: Arc<GuestMem>,
    asleep: bool,
    /// The poller's figures as last taken into the queue's metrics.
    flushed: QueueStats,
}

impl QueuePoll {
    /// Marks the doorbell area dirty after the device wrote it (`cq.idx`,
    /// or NEED_WAKEUP in a flags field) through its raw mapping.
    fn log_doorbells(&self) {
        if let Some(cq) = &self.cq {
            guest::mark_doorbell(&self.map, GuestAddress(cq.location.sq));
        }
    }

    /// The poll state of a queue starting at `ring` whose used ring stands
    /// at `next_used`, and whether the driver is owed a call.
    ///
    /// With doorbells this is the start of spec section 8.3.3 (R1, the
    /// ring base, is the caller's): R2, `cq.idx` is brought to the used
    /// index (the previous device may have died between the two stores)
    /// and a driver poller that sleeps is called, since the previous
    /// device may have died before it did; R3, NEED_WAKEUP in `sq.flags` is
    /// cleared and the ring is looked at from the ring base whatever
    /// `sq.idx` says.
    fn open(
        source: SubmissionSource,
        ring: &RingConfig,
        next_used: u16,
        map: Arc<GuestMem>,
        spin: SpinPolicy,
        vq: u16,
    ) -> Result<(Self, bool), PollError> {
        let (watch, cq, owed) = if source == SubmissionSource::Doorbell {
            let location = ring.doorbell_location().map_err(PollError::Layout)?;
            let (sq, cq) = guest_doorbells(&map, location).map_err(PollError::Memory)?;
            // Starts from the ring base: a doorbell written before the
            // queue started reads as new work (spec 8.1); clears a stale
            // NEED_WAKEUP.
            let mut producer = CqProducer::new(cq);
            let owed = producer.publish(next_used) == Wake::Owed;
            let sq = SqConsumer::new(sq, ring.next_avail);
            let watch = if ring.packed {
                SqWatch::PackedDoorbell(PackedSq {
                    sq,
                    ring: PackedWatch::new(ring, Arc::clone(&map)).map_err(PollError::Ring)?,
                    size: ring.size,
                    bad: None,
                })
            } else {
                SqWatch::Doorbell(sq)
            };
            let cq = CqDoorbell { producer, location };
            (watch, Some(cq), owed)
        } else if ring.packed {
            let watch = PackedWatch::new(ring, Arc::clone(&map)).map_err(PollError::Ring)?;
            (SqWatch::Packed(watch), None, false)
        } else {
            let watch = RingWatch::new(ring, Arc::clone(&map)).map_err(PollError::Ring)?;
            (SqWatch::Ring(watch), None, false)
        };
        let p = QueuePoll {
            poller: Poller::new(watch, spin, vq),
            cq,
            map,
            asleep: false,
            flushed: QueueStats::default(),
        };
        p.log_doorbells();
        Ok((p, owed))
    }

    /// Stop, spec section 8.3.2 S3 and S4: nobody polls the SQ doorbell
    /// from now on, so NEED_WAKEUP goes up in `sq.flags` (a driver that
    /// submits while the queue is stopped kicks, and the kick waits in the
    /// eventfd for the next device); logged like every doorbell write.
    fn park(&mut self) {
        if let Some(c) = self.poller.watch_mut().consumer() {
            c.park();
            self.log_doorbells();
        }
    }

    /// Points the watch at `current` if the memory table changed.
    fn refresh(&mut self, current: &Arc<GuestMem>) -> Result<(), PollError> {
        if Arc::ptr_eq(current, &self.map) {
            return Ok(());
        }
        let watch = self.poller.watch_mut();
        match watch {
            SqWatch::Ring(r) => r.set_memory(Arc::clone(current)),
            SqWatch::Packed(p) | SqWatch::PackedDoorbell(PackedSq { ring: p, .. }) => {
                p.set_memory(Arc::clone(current));
            }
            SqWatch::Doorbell(_) => {}
        }
        if let (Some(c), Some(d)) = (watch.consumer(), self.cq.as_mut()) {
            let (sq, cq) = guest_doorbells(current, d.location).map_err(PollError::Memory)?;
            // Continues from the last value seen and the last index
            // published (`CqProducer::new` reads it from the cell).
            let seen = c.seen();
            *c = SqConsumer::new(sq, seen);
            d.producer = CqProducer::new(cq);
        }
        self.map = Arc::clone(current);
        Ok(())
    }

    fn take_error(&mut self) -> Option<PollError> {
        match self.poller.watch_mut() {
            SqWatch::Ring(r) => r.take_error().map(PollError::Ring),
            SqWatch::Packed(p) => p.take_error().map(PollError::Ring),
            SqWatch::PackedDoorbell(p) => match p.bad.take() {
                Some(value) => Some(PollError::Position {
                    value,
                    size: p.size,
                }),
                None => p.ring.take_error().map(PollError::Ring),
            },
            SqWatch::Doorbell(_) => None,
        }
    }
}

impl Vring {
    /// Sets up poll mode if the queue's source asks for it; a doorbell
    /// area that cannot be used breaks the queue.
    pub(crate) fn open_poll(&mut self, ring: &RingConfig, spin: SpinPolicy) {
        if self.source == SubmissionSource::Kick {
            return;
        }
        let map = self.mem.load().into_inner();
        match QueuePoll::open(
            self.source,
            ring,
            self.vq.next_used(),
            map,
            spin,
            self.key.vq,
        ) {
            Ok((p, owed)) => {
                self.poll = Some(Box::new(p));
                if owed {
                    self.signal_call();
                }
            }
            Err(e) => self.poll_broken(&e),
        }
    }

    /// The queue stops: parks the SQ doorbell (see `QueuePoll::park`).
    pub(crate) fn park_poll(&mut self) {
        if !self.broken
            && let Some(p) = self.poll.as_mut()
        {
            p.park();
        }
    }

    /// A packed ring's request path took everything before its next
    /// position: the watch looks there from now on.
    pub(crate) fn follow_packed(&mut self) {
        let Ring::Packed(q) = &self.vq else {
            return;
        };
        if let Some(p) = self.poll.as_mut()
            && let SqWatch::Packed(w) | SqWatch::PackedDoorbell(PackedSq { ring: w, .. }) =
                p.poller.watch_mut()
        {
            w.follow(q.ring().next_avail());
        }
    }

    /// Whether the worker polls this queue (poll mode, not broken).
    pub fn is_polled(&self) -> bool {
        self.poll.is_some() && !self.broken
    }

    /// Whether the queue polls and has not prepared to sleep.
    pub(crate) fn is_spinning(&self) -> bool {
        self.is_polled() && self.poll.as_ref().is_some_and(|p| !p.asleep)
    }

    /// The worker woke up (or goes on polling): clears NEED_WAKEUP after a
    /// sleep and follows a new memory table.
    pub(crate) fn poll_wake(&mut self) {
        let current = self.mem.take();
        let refreshed = match self.poll.as_mut() {
            Some(p) => {
                if p.asleep {
                    p.asleep = false;
                    p.poller.woke();
                    p.log_doorbells();
                }
                p.refresh(current.map())
            }
            None => Ok(()),
        };
        self.mem.restore(current);
        if let Err(e) = refreshed {
            self.poll_broken(&e);
        }
    }

    /// Another queue of the worker found work: do not sleep after all.
    pub(crate) fn poll_cancel_sleep(&mut self) {
        if let Some(p) = self.poll.as_mut()
            && p.asleep
        {
            p.asleep = false;
            p.poller.cancel_sleep();
            p.log_doorbells();
        }
    }

    /// Sets or clears THROTTLE in `sq.flags` (doorbell queues; a queue
    /// without doorbells has no way to say it, and only leaves chains on
    /// its ring at its limit).
    pub(crate) fn set_throttle(&mut self, on: bool) {
        if self.broken {
            return;
        }
        let Some(p) = self.poll.as_mut() else {
            return;
        };
        let Some(c) = p.poller.watch_mut().consumer() else {
            return;
        };
        c.set_throttle(on);
        p.log_doorbells();
        self.backpressure.throttled = on;
        if on && let Some(m) = self.metrics() {
            m.throttled();
        }
    }

    /// Publishes the used index and the CQ doorbell; the driver is called
    /// only if its CQ poller set NEED_WAKEUP. Returns false when the queue
    /// has no CQ doorbell (the standard rules apply).
    pub(crate) fn publish_doorbell(&mut self, mem: Batch<'_>) -> bool {
        if self.broken {
            // A broken queue leaves its doorbells alone.
            return false;
        }
        let Some(cq) = self.poll.as_mut().and_then(|p| p.cq.as_mut()) else {
            return false;
        };
        match self.vq.publish_index(mem) {
            Ok(0) => {}
            // Fence 3 of the protocol is inside `publish`: `cq.idx`
            // store (the used index, or a packed ring's next used
            // position), fence(SeqCst), `cq.flags` load.
            Ok(batch) => {
                let next_used = self.vq.next_used();
                let owed = cq.producer.publish(next_used) == Wake::Owed;
                if let Some(t) = self.tracking.as_mut() {
                    t.published(batch, next_used);
                }
                if let Some(p) = &self.poll {
                    p.log_doorbells();
                }
                if owed {
                    self.signal_call();
                }
                self.count_batch(batch);
            }
            Err(e) => {
                error!(device = self.device.id, vq = self.key.vq, "used ring: {e}");
                self.mark_broken(&format_args!("used ring: {e}"));
            }
        }
        true
    }

    /// How the queue is served, as the statistics name it.
    pub(crate) fn mode(&self) -> QueueMode {
        match self.source {
            SubmissionSource::Kick => QueueMode::Kick,
            SubmissionSource::RingPoll => QueueMode::RingPoll,
            SubmissionSource::Doorbell => QueueMode::Sqcq,
        }
    }

    /// Brings the figures only the poll loop keeps (spins, sleeps, the
    /// spin window, NEED_WAKEUP in the doorbells) into the metrics: at
    /// every statistics tick, when the poller is dropped and when the
    /// queue stops.
    pub(crate) fn flush_poll_figures(&mut self) {
        let need_wakeup = self.need_wakeup();
        let Some(m) = self.device.metrics.queue(self.key.vq) else {
            return;
        };
        if let Some(p) = self.poll.as_mut() {
            m.poll_figures(&p.poller.stats(), &mut p.flushed);
        }
        if let Some((sq, cq)) = need_wakeup {
            m.need_wakeup(sq, cq);
        }
    }

    /// NEED_WAKEUP in the SQ and CQ doorbells, read from guest memory (for
    /// the statistics: both pollers asleep once the queue is idle).
    fn need_wakeup(&self) -> Option<(bool, bool)> {
        let p = self.poll.as_ref()?;
        let location = p.cq.as_ref()?.location;
        let flag = |at: u64| {
            p.map
                .load::<u16>(GuestAddress(at + 2), Ordering::Relaxed)
                .is_ok_and(|f| u16::from_le(f) & sqcq_protocol::NEED_WAKEUP != 0)
        };
        Some((flag(location.sq), flag(location.cq)))
    }

    /// Fault injection, when an armed queue finds a request: breaks it as
    /// a nonsense SQ doorbell index (poll mode with doorbells) or a corrupt
    /// ring would.
    #[cfg(feature = "fault-injection")]
    pub(crate) fn break_injected(&mut self) {
        if self.source == SubmissionSource::Doorbell && self.poll.is_some() {
            self.poll_broken(&PollError::Injected);
        } else {
            self.ring_broken(&"fault injected by the admin socket");
        }
    }

    /// Stops the queue for good (until the driver resets it): the
    /// doorbells are not touched again.
    fn poll_broken(&mut self, e: &PollError) {
        guest_warn!(
            self.device.limiter,
            device = self.device.id,
            vq = self.key.vq,
            "{}: queue stopped, device needs reset",
            crate::runtime::error_chain(e)
        );
        self.flush_poll_figures();
        self.poll = None;
        self.mark_broken(&crate::runtime::error_chain(e));
    }
}

impl ServedQueue {
    /// Whether the worker polls this queue (poll mode, not broken).
    pub fn is_polled(&self) -> bool {
        self.ring.is_polled()
    }

    /// See [`Vring::poll_wake`].
    pub(crate) fn poll_wake(&mut self) {
        self.ring.poll_wake();
    }

    /// See [`Vring::poll_cancel_sleep`].
    pub(crate) fn poll_cancel_sleep(&mut self) {
        self.ring.poll_cancel_sleep();
    }

    /// Brings the poll loop's figures into the metrics (see
    /// [`Vring::flush_poll_figures`]).
    pub(crate) fn flush_poll_figures(&mut self) {
        self.ring.flush_poll_figures();
    }

    /// Looks at the watched index once; processes the ring if it moved,
    /// and reaps backstore completions while requests are in flight.
    pub(crate) fn poll_once(&mut self, now: u64) -> Poll {
        let Some(p) = self.ring.poll.as_mut() else {
            return Poll::Expired;
        };
        let found = p.poller.poll(now);
        if let Some(e) = p.take_error() {
            self.ring.poll_broken(&e);
            return Poll::Expired;
        }
        match found {
            Poll::Work(idx) => self.on_index(idx),
            Poll::Idle | Poll::Expired if self.handler.busy() => self.reap_all(),
            Poll::Idle | Poll::Expired => {}
        }
        found
    }

    /// Asks for a notification and re-checks. Returns whether the queue
    /// may sleep; `false` after it found and processed new work.
    pub(crate) fn poll_prepare_sleep(&mut self, now: u64) -> bool {
        if self.ring.broken {
            return true;
        }
        let Some(p) = self.ring.poll.as_mut() else {
            return true;
        };
        let check = p.poller.prepare_sleep(now);
        p.log_doorbells();
        if let Some(e) = p.take_error() {
            self.ring.poll_broken(&e);
            return true;
        }
        match check {
            SleepCheck::Sleep => {
                p.asleep = true;
                true
            }
            SleepCheck::Work(idx) => {
                self.on_index(idx);
                false
            }
        }
    }

    fn on_index(&mut self, idx: u16) {
        let ring = &mut self.ring;
        if ring.source == SubmissionSource::Doorbell
            && let Some(split) = ring.vq.split()
            && let Err(e) = check_index(idx, split.next_avail(), split.size())
        {
            ring.poll_broken(&PollError::Index(e));
            return;
        }
        self.drain_ring();
    }
}
