//! A request virtqueue as served by its worker: the ring, its eventfds,
//! how it learns of submissions, and the device's handler of its requests.
//!
//! A [`ServedQueue`] is created inside its worker thread from a
//! [`QueueStart`] and owned by that thread alone until it is stopped:
//! nothing on the request path is shared with another worker. It is two
//! parts: the [`Vring`] (the ring, split or packed, `runtime::ring`, with
//! its batched used side, the kick/call/error eventfds, the poll state of a
//! polled queue), which this module and [`crate::runtime::poll`] run the
//! same way for every device type, and the device's [`RequestHandler`],
//! which turns chains into requests and completes them through the
//! `Vring`. Guest memory is read through a `SharedMemory` that the
//! control thread swaps on a memory table change; each pass takes the
//! current map and its region table from the worker's `MemoryView`
//! (loaded again only after a change) and hands every access of the pass
//! a `Batch` of them (`runtime::batch`), and every request in flight keeps
//! the map its iovecs point into alive (`runtime::pins`).

use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sqcq_protocol::SpinPolicy;
use thiserror::Error;
use tracing::{error, info, warn};

use crate::runtime::shared_memory::{MemoryView, SharedMemory};

use crate::guest_warn;
use crate::runtime::batch::{Batch, Mapped};
use crate::runtime::chain::{ChainBuffers, ChainError};
use crate::runtime::eventfd::{PeerEventFd, Signal};
use crate::runtime::events::{Event, EventBus};
use crate::runtime::gather::Gather;
use crate::runtime::metrics::{DeviceMetrics, QueueMetrics};
use crate::runtime::packed::PackedWalk;
use crate::runtime::pass;
use crate::runtime::qos::Qos;
use crate::runtime::ratelimit::RateLimiter;
use crate::runtime::ring::{Chain, Ring};
pub use crate::runtime::split::RingConfig;
use crate::runtime::split::{HEADS_AHEAD, RingError};
use crate::runtime::stage_clock::{self, Stage};
use crate::runtime::tracking::{QueueRecord, RecoveredList, Recovery, TrackedQueue};

mod counters;
mod limit;
mod notifiers;
mod poll;

use counters::Counters;
use limit::{Backpressure, InFlightLimit};
use notifiers::{Called, Notifiers};

pub use poll::PollError;
pub(crate) use poll::QueuePoll;

/// Identifies a queue in the whole daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QueueKey {
    /// Device number (order of the devices in the configuration).
    pub device: u32,
    /// Virtqueue index.
    pub vq: u16,
}

/// How a queue learns that the driver made requests available.
///
/// The two poll variants run a `sqcq_protocol::Poller` over what
/// they watch (module `poll` below): the worker spins over its polled
/// queues for their adaptive windows ([`crate::runtime::poll`]), then each
/// asks for a notification, and the worker sleeps on the same kick
/// eventfds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubmissionSource {
    /// Classic virtio: the driver kicks the eventfd (subject to EVENT_IDX
    /// and VRING_USED_F_NO_NOTIFY); the worker sleeps in `epoll_wait`.
    Kick,
    /// `ring-poll` (standard virtio): the avail index is polled with
    /// notifications disabled; completions follow the standard rules.
    RingPoll,
    /// VIRTIO_F_SQCQ_POLL: the SQ doorbell is polled, completions are
    /// announced through the CQ doorbell.
    Doorbell,
}

/// The device a queue belongs to, as the runtime knows it: its number, a
/// name for logs, its figures, and the rate limiters of the warnings its
/// guest can trigger and of its backstore's failures. Shared by the device's control thread and every
/// worker serving one of its queues.
#[derive(Debug)]
pub struct DeviceInfo {
    /// Device number.
    pub id: u32,
    /// Name for logs (the socket path).
    pub name: String,
    /// The device's figures (errors, and every queue's).
    pub metrics: Arc<DeviceMetrics>,
    /// Rate limiter of guest-triggered log messages.
    pub limiter: RateLimiter,
    /// Rate limiter of backstore failures met on every pass (a refused
    /// commit), apart from `limiter` so that a guest's flood of bad
    /// requests cannot hide them.
    pub backstore_limiter: RateLimiter,
    /// The daemon's events (queue started, stopped or broken, I/O
    /// errors).
    pub events: Arc<EventBus>,
    /// Its IOPS and bandwidth limits.
    pub qos: Qos,
}

/// What a device does with the requests of one of its request queues.
///
/// The runtime takes chains from the ring (by kick, ring polling or the SQ
/// doorbell) and hands each to [`RequestHandler::handle`]; the handler
/// completes a request through [`Vring::complete`], at once or when its
/// backstore work is done, and the runtime publishes the used ring and
/// notifies the driver once per batch. A handler is built on the worker
/// that owns the queue ([`MakeHandler`]) and never leaves it.
pub trait RequestHandler {
    /// A chain taken from the available ring (its head index is within
    /// the ring).
    fn handle(&mut self, ring: &mut Vring, mem: Batch<'_>, chain: Chain<'_>);

    /// Submits to the backstores what [`Self::handle`] queued (once per
    /// batch).
    fn commit(&mut self, ring: &Vring);

    /// Completes every request whose backstore work has finished.
    fn reap(&mut self, ring: &mut Vring, mem: Batch<'_>);

    /// Completion descriptor `source` (see [`Self::completion_fds`])
    /// fired: rearms it and completes what finished.
    fn completed(&mut self, ring: &mut Vring, mem: Batch<'_>, source: usize);

    /// `(source, fd)` of every descriptor that signals backstore
    /// completions, for the worker's epoll set.
    fn completion_fds(&self) -> Vec<(usize, RawFd)>;

    /// Whether requests are in flight.
    fn busy(&self) -> bool;

    /// Whether work waits for the worker's next pass (the next slice of a
    /// long command, a retry of a refused commit that is due).
    fn has_deferred(&self) -> bool;

    /// How long until a commit the backstore refused is tried again
    /// (`runtime::backstore`): the worker sleeps that long at most, and
    /// its next pass after it tries. `None` when none waits.
    fn commit_retry_in(&self) -> Option<Duration> {
        None
    }

    /// How long until deferred work not due yet becomes due (a request a
    /// LUN's limit holds): the worker sleeps that long at most. `None`
    /// when nothing waits so.
    fn deferred_in(&self) -> Option<Duration> {
        None
    }

    /// Does the work of [`Self::has_deferred`]; the runtime commits, reaps
    /// and publishes afterwards.
    fn run_deferred(&mut self, ring: &mut Vring, mem: Batch<'_>);

    /// Starts waiting for everything in flight now (a task management
    /// function); returns whether nothing is in flight.
    fn begin_drain(&mut self) -> bool;

    /// Whether the requests a drain waits for have completed.
    fn drained(&self) -> bool;

    /// Restricts backstore completion work to `cpus`.
    fn steer_completions(&mut self, ring: &Vring, cpus: &[usize]);

    /// Waits for the requests in flight until `deadline`, completing them
    /// to the driver; returns how many are left (still in flight: their
    /// buffers, pins and backstore queues stay as they are).
    fn finish(&mut self, ring: &mut Vring, mem: Batch<'_>, deadline: Instant) -> usize;

    /// Asks the backstore queues to cancel every request in flight (see
    /// `BackstoreQueue::cancel`); they still complete through `finish`,
    /// with an error status when cancelled.
    fn cancel(&mut self, ring: &Vring);

    /// The device changed in a way its running queues must take (for
    /// SCSI, its LUN table): the handler reads what it needs from its own
    /// device, typed, so that no handler can be given another device's
    /// kind of change. On error nothing changed. A handler whose device
    /// has nothing of the kind (blk) keeps the default.
    fn refresh(&mut self, _ring: &Vring) -> Result<(), QueueError> {
        Ok(())
    }

    /// The memory map changed (a memory table or dirty logging change):
    /// the handler lets go of replaced maps no request points into.
    fn memory_changed(&mut self) {}
}

/// The `seg_max` a device advertises for queues of up to `queue_size`
/// entries: what a chain of the ring holds (less its header and status),
/// and no more than a backstore request carries
/// ([`sqcq_backstore::MAX_SEGMENTS`]), less two for buffers that cross a
/// memory region boundary (each crossing costs an iovec).
pub fn advertised_seg_max(queue_size: u16) -> u32 {
    let backstore = u32::try_from(sqcq_backstore::MAX_SEGMENTS).unwrap_or(u32::MAX) - 2;
    u32::from(queue_size).saturating_sub(2).min(backstore)
}

/// The most segments a request of a queue may have: what the device's
/// configuration space promises (`seg_max` data segments, plus `extra`
/// for headers and status), and never fewer than the ring holds. A driver
/// with indirect descriptors may build chains longer than the ring
/// (Linux does, up to `seg_max`): refusing them would fail I/O the device
/// said it takes.
pub fn segment_limit(ring: &RingConfig, seg_max: u32, extra: u32) -> usize {
    let promised = usize::try_from(seg_max.saturating_add(extra)).unwrap_or(usize::MAX);
    promised.max(usize::from(ring.size))
}

/// Builds a queue's request handler on the worker that will serve it, so
/// that it sees every device change handed to the workers before it.
pub type MakeHandler =
    Box<dyn FnOnce(QueueKey, &RingConfig) -> Result<Box<dyn RequestHandler>, QueueError> + Send>;

/// Everything a worker needs to start serving a queue.
pub struct QueueStart {
    /// Which queue.
    pub key: QueueKey,
    /// The device it belongs to.
    pub device: Arc<DeviceInfo>,
    /// Guest memory of the connection.
    pub mem: SharedMemory,
    /// The ring.
    pub ring: RingConfig,
    /// Driver-to-device notifications.
    pub kick: PeerEventFd,
    /// Device-to-driver notifications.
    pub call: Option<PeerEventFd>,
    /// Error notifications.
    pub err: Option<PeerEventFd>,
    /// How submissions are noticed.
    pub source: SubmissionSource,
    /// The adaptive spin window of a polled queue.
    pub spin: SpinPolicy,
    /// At most this many requests in flight (`None`: the ring's size);
    /// see `runtime::queue::limit`.
    pub max_in_flight: Option<u16>,
    /// The device's handler of the queue's requests.
    pub handler: MakeHandler,
    /// The queue's in-flight record (VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD),
    /// if the frontend gave an area.
    pub tracking: Option<QueueRecord>,
}

impl std::fmt::Debug for QueueStart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueStart")
            .field("key", &self.key)
            .field("ring", &self.ring)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// Why a queue could not start, or could not take a device change.
#[derive(Debug, Error)]
pub enum QueueError {
    /// The ring addresses or size are invalid for guest memory.
    #[error("invalid ring configuration")]
    Ring(#[source] RingError),
    /// VIRTIO_F_SQCQ_POLL is negotiated and the doorbells cannot be used.
    #[error("unusable doorbells")]
    Doorbells(#[source] PollError),
    /// A backstore queue could not be opened.
    #[error("cannot open a backstore queue for LUN {lun}")]
    Backstore {
        /// The LUN (the one unit of a block device: 0).
        lun: u16,
        /// Why.
        #[source]
        source: sqcq_backstore::BackstoreError,
    },
}

/// Where a stopped queue left off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StopReport {
    /// Where to resume: the vring base (`Ring::base`).
    pub base: u32,
    /// Requests taken while the queue ran.
    pub requests: u64,
}

/// The virtqueue part of a served queue, the same for every device type:
/// the ring over the worker's view of guest memory, its notifiers and
/// its counters, how it learns of submissions, and whether it broke.
pub struct Vring {
    key: QueueKey,
    device: Arc<DeviceInfo>,
    mem: MemoryView,
    vq: Ring,
    /// Whether to look again for more requests before taking a few.
    gather: Gather,
    /// The in-flight record, if the frontend keeps one.
    tracking: Option<TrackedQueue>,
    notifiers: Notifiers,
    counters: Counters,
    /// The in-flight limit, and THROTTLE.
    backpressure: Backpressure,
    source: SubmissionSource,
    /// Poll state (poll sources only; dropped when the queue breaks).
    poll: Option<Box<QueuePoll>>,
    broken: bool,
    /// Fault injection (`fault_break`): the queue breaks when it next
    /// finds a request, before taking it.
    #[cfg(feature = "fault-injection")]
    break_armed: bool,
}

impl std::fmt::Debug for Vring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vring")
            .field("key", &self.key)
            .field("source", &self.source)
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

/// A request queue owned by a worker: its ring and its device's handler.
pub struct ServedQueue {
    ring: Vring,
    handler: Box<dyn RequestHandler>,
}

impl std::fmt::Debug for ServedQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServedQueue")
            .field("key", &self.ring.key)
            .field("busy", &self.handler.busy())
            .field("broken", &self.ring.broken)
            .finish_non_exhaustive()
    }
}

impl ServedQueue {
    /// Validates the ring and builds the device's handler; with an
    /// in-flight record of an earlier run, continues where that run's
    /// requests leave the ring and resubmits the ones it had in flight.
    pub fn start(s: QueueStart) -> Result<Self, QueueError> {
        let mut ring = s.ring;
        let mapped = Mapped::new(s.mem.memory().into_inner());
        let mut vq = Ring::open(&ring, mapped.batch()).map_err(QueueError::Ring)?;
        let mem = s.mem.view();
        let mut tracking = None;
        let mut resubmit = Vec::new();
        let mut resubmit_lists = Vec::new();
        match (s.tracking, &mut vq) {
            (Some(QueueRecord::Split(mut t)), Ring::Split(split)) => {
                if let Recovery::Resumed {
                    heads,
                    next_avail,
                    ignored,
                } = t.recover(split.next_used())
                {
                    if next_avail != ring.next_avail || !heads.is_empty() || ignored > 0 {
                        info!(
                            device = s.device.id,
                            vq = s.key.vq,
                            in_flight = heads.len(),
                            ignored,
                            base = ring.next_avail,
                            next_avail,
                            "in-flight record of an earlier run: resubmitting its requests"
                        );
                    }
                    ring.next_avail = next_avail;
                    split.set_next_avail(next_avail);
                    resubmit = heads;
                }
                tracking = Some(t);
            }
            (Some(QueueRecord::Packed(record)), Ring::Packed(q)) => {
                let base = ring.base();
                if let Some((lists, ignored)) = q.adopt_record(record, mapped.batch()) {
                    let (avail, used) = (q.ring().next_avail(), q.ring().next_used());
                    if avail.encode() != ring.next_avail || !lists.is_empty() || ignored > 0 {
                        info!(
                            device = s.device.id,
                            vq = s.key.vq,
                            in_flight = lists.len(),
                            ignored,
                            base,
                            avail = avail.encode(),
                            used = used.encode(),
                            "in-flight record of an earlier run: resubmitting its requests"
                        );
                    }
                    ring.next_avail = avail.encode();
                    ring.next_used = used.encode();
                    resubmit_lists = lists;
                }
            }
            (Some(_), _) => warn!(
                device = s.device.id,
                vq = s.key.vq,
                "in-flight record of the other ring layout: not kept"
            ),
            (None, _) => {}
        }
        let handler = (s.handler)(s.key, &ring)?;
        let mut ring_state = Vring {
            key: s.key,
            device: s.device,
            mem,
            vq,
            gather: Gather::default(),
            tracking,
            notifiers: Notifiers::new(s.kick, s.call, s.err),
            counters: Counters::new(ring.size),
            backpressure: Backpressure::new(InFlightLimit::new(s.max_in_flight, ring.size)),
            source: s.source,
            poll: None,
            broken: false,
            #[cfg(feature = "fault-injection")]
            break_armed: false,
        };
        if let Some(m) = ring_state.metrics() {
            m.started(ring_state.mode());
        }
        ring_state.device.events.publish(Event::QueueStarted {
            device: ring_state.device.id,
            vq: ring_state.key.vq,
            mode: ring_state.mode().as_str(),
        });
        ring_state.open_poll(&ring, s.spin);
        let mut served = ServedQueue {
            ring: ring_state,
            handler,
        };
        served.resubmit(&resubmit);
        served.resubmit_lists(&resubmit_lists);
        Ok(served)
    }

    /// Hands the requests an earlier run had in flight to the handler
    /// again, in the order that run took them; they are still recorded in
    /// flight.
    fn resubmit(&mut self, heads: &[u16]) {
        if heads.is_empty() || self.ring.broken {
            return;
        }
        self.with_pass(|q, mem| {
            q.ring.counters.start_batch();
            for &head in heads {
                // Only split rings keep an in-flight record.
                let Some(split) = q.ring.vq.split() else {
                    break;
                };
                let walk = Chain::Split(split.chain(mem, head));
                q.ring.counters.taken();
                if let Some(m) = q.ring.metrics() {
                    m.resubmitted();
                }
                q.handler.handle(&mut q.ring, mem, walk);
            }
            q.complete_batch(mem);
        });
    }

    /// [`Self::resubmit`] for a packed ring: the lists an earlier run had
    /// in flight, from their recorded descriptors (the ring's may have
    /// been overwritten by used descriptors since).
    fn resubmit_lists(&mut self, lists: &[RecoveredList]) {
        if lists.is_empty() || self.ring.broken {
            return;
        }
        self.with_pass(|q, mem| {
            q.ring.counters.start_batch();
            for list in lists {
                let walk = PackedWalk::recorded(mem, &list.descs);
                q.ring.counters.taken();
                if let Some(m) = q.ring.metrics() {
                    m.resubmitted();
                }
                q.handler
                    .handle(&mut q.ring, mem, Chain::Packed { id: list.id, walk });
            }
            q.complete_batch(mem);
        });
    }

    /// Which queue this is.
    pub fn key(&self) -> QueueKey {
        self.ring.key
    }

    /// The virtqueue part.
    pub fn ring(&self) -> &Vring {
        &self.ring
    }

    /// The kick eventfd, for the worker's epoll set.
    pub fn kick_fd(&self) -> RawFd {
        self.ring.notifiers.kick_fd()
    }

    /// `(source, fd)` of every descriptor that signals backstore
    /// completions.
    pub fn completion_fds(&self) -> Vec<(usize, RawFd)> {
        self.handler.completion_fds()
    }

    /// How long the worker may sleep before this queue needs a look
    /// without an event; `None`: only when its fds are readable.
    pub fn poll_timeout(&self) -> Option<Duration> {
        if self.handler.has_deferred() {
            return Some(Duration::ZERO);
        }
        let ring = match self.ring.source {
            SubmissionSource::Kick => None,
            // While spinning, the worker only looks at its fds.
            SubmissionSource::RingPoll | SubmissionSource::Doorbell => {
                self.ring.is_spinning().then_some(Duration::ZERO)
            }
        };
        // Chains held back by a QoS limit: taken when it lets them.
        let qos = (self.ring.backpressure.left)
            .then(|| self.ring.device.qos.wait(pass::now()))
            .flatten();
        (ring.into_iter())
            .chain(self.handler.commit_retry_in())
            .chain(self.handler.deferred_in())
            .chain(qos)
            .min()
    }

    /// Fault injection (`fault_break`): the queue will break when it next
    /// finds a request made available, leaving that request untaken, as
    /// for a doorbell value no correct driver writes. False if it is
    /// broken or armed already.
    #[cfg(feature = "fault-injection")]
    pub(crate) fn arm_break(&mut self) -> bool {
        if self.ring.broken || self.ring.break_armed {
            return false;
        }
        self.ring.break_armed = true;
        true
    }

    /// Replaces the call eventfd (SET_VRING_CALL while running), and
    /// sends the notification owed since the queue had none.
    pub fn set_call(&mut self, call: Option<PeerEventFd>) {
        if self.ring.notifiers.set_call(call) {
            self.ring.signal_call();
        }
    }

    /// Replaces the error eventfd (SET_VRING_ERR while running); a queue
    /// that broke before it had one reports it now.
    pub fn set_err(&mut self, err: Option<PeerEventFd>) {
        self.ring.notifiers.set_err(err);
        if self.ring.broken {
            self.ring.notifiers.signal_err();
        }
    }

    /// The kick eventfd fired.
    pub fn on_kick(&mut self) {
        // Never blocks (see `PeerEventFd::drain`). The value only counts
        // kicks; the ring says what to do.
        if let (Some(n), Some(m)) = (self.ring.notifiers.drain_kicks(), self.ring.metrics()) {
            m.kicked(n);
        }
        self.process();
    }

    /// One pass of the worker's loop: the work the handler deferred to it.
    pub fn pass(&mut self) {
        if self.handler.has_deferred() {
            self.with_pass(|q, mem| {
                q.handler.run_deferred(&mut q.ring, mem);
                q.complete_batch(mem);
            });
        }
        self.resume_taking();
    }

    /// Whether the queue may take no more requests now: its requests in
    /// flight reached its limit, its backstore refuses work (a commit
    /// waits for a retry), or its device's QoS limit holds it
    /// (`runtime::qos`).
    #[inline]
    fn at_limit(&self) -> bool {
        self.ring
            .backpressure
            .limit
            .reached(self.ring.counters.in_flight())
            || self.handler.commit_retry_in().is_some()
            || self.ring.device.qos.wait(pass::now()).is_some()
    }

    /// The queue left chains on its ring at its limit and is under it
    /// now: it takes them without waiting for a kick or a new doorbell
    /// index, which may never come (T3).
    #[inline]
    fn resume_taking(&mut self) {
        if self.ring.backpressure.left && !self.ring.broken && !self.at_limit() {
            self.ring.backpressure.left = false;
            self.process();
        }
    }

    /// The kick descriptor hung up or failed: the driver can no longer
    /// notify this queue, which stops.
    pub fn kick_failed(&mut self) {
        let d = &self.ring.device;
        DeviceMetrics::bump(&d.metrics.dead_kicks);
        guest_warn!(
            d.limiter,
            device = d.id,
            vq = self.ring.key.vq,
            "kick descriptor hung up: queue stopped, device needs reset"
        );
        self.ring.mark_broken(&"kick descriptor hung up");
    }

    /// Backstore completion descriptor `source` fired.
    pub fn on_completion(&mut self, source: usize) {
        self.with_pass(|q, mem| {
            q.handler.completed(&mut q.ring, mem, source);
            q.ring.publish(mem);
        });
        self.resume_taking();
    }

    /// Processes every available request, then re-enables notifications
    /// and re-checks the ring (so a request made available meanwhile is
    /// not left waiting for a kick that will never come).
    ///
    /// A polled queue only takes what is available: its notifications are
    /// its poller's business.
    pub fn process(&mut self) {
        if self.ring.broken {
            return;
        }
        if self.ring.source != SubmissionSource::Kick {
            self.drain_ring();
            return;
        }
        self.with_pass(|q, mem| {
            loop {
                if let Err(e) = q.ring.vq.disable_notification(mem) {
                    q.ring.ring_broken(&e);
                    return;
                }
                if !q.take_available(mem) {
                    return;
                }
                q.complete_batch(mem);
                if q.ring.backpressure.left {
                    // At the limit with chains left: notifications stay
                    // off (a kick would find the queue as full as now);
                    // `resume_taking` comes back here once it is not.
                    return;
                }
                match q.ring.vq.enable_notification(mem) {
                    Ok(true) => continue,
                    Ok(false) => return,
                    Err(e) => {
                        q.ring.ring_broken(&e);
                        return;
                    }
                }
            }
        });
    }

    /// Takes every available request, then completes what it can.
    pub(crate) fn drain_ring(&mut self) {
        if self.ring.broken {
            return;
        }
        stage_clock::mark(Stage::Pass);
        self.with_pass(|q, mem| {
            if q.take_available(mem) {
                q.complete_batch(mem);
            }
        });
    }

    /// One pass over the queue: runs `f` with the current map and the
    /// table of its regions (the worker's [`MemoryView`]: no load unless
    /// the map changed, and then one new table), which every access of
    /// the pass goes through.
    fn with_pass<R>(&mut self, f: impl FnOnce(&mut Self, Batch<'_>) -> R) -> R {
        let mapped = self.ring.mem.take();
        if self.ring.mem.take_changed() {
            self.handler.memory_changed();
        }
        let r = f(self, mapped.batch());
        self.ring.mem.restore(mapped);
        r
    }

    /// After a batch: submits what the handler queued, completes what
    /// finished, publishes.
    fn complete_batch(&mut self, mem: Batch<'_>) {
        self.handler.commit(&self.ring);
        stage_clock::mark(Stage::Committed);
        self.handler.reap(&mut self.ring, mem);
        stage_clock::mark(Stage::Reaped);
        self.ring.publish(mem);
        stage_clock::mark(Stage::Published);
    }

    /// Completes what finished and publishes (a polled queue with requests
    /// in flight).
    fn reap_all(&mut self) {
        self.with_pass(|q, mem| {
            q.handler.reap(&mut q.ring, mem);
            q.ring.publish(mem);
        });
        self.resume_taking();
    }

    /// Handles every chain available now (at most a ring's worth); false
    /// if the ring turned out corrupt.
    fn take_available(&mut self, mem: Batch<'_>) -> bool {
        let ring = &mut self.ring;
        #[cfg(feature = "fault-injection")]
        if ring.break_armed {
            match ring.vq.has_available(mem) {
                Ok(false) => return true,
                Ok(true) => {
                    ring.break_armed = false;
                    ring.break_injected();
                }
                Err(e) => ring.ring_broken(&e),
            }
            return false;
        }
        ring.counters.start_batch();
        let Some(split) = ring.vq.split() else {
            return self.take_packed(mem);
        };
        // `avail->idx` (Acquire, pairing with the driver's Release store),
        // then the entries up to it, each chain walked by `HeadWalk`.
        let layout = *split.layout();
        let (next_avail, size) = (split.next_avail(), split.size());
        let avail_idx = || layout.avail_idx(mem, Ordering::Acquire);
        let avail = match avail_idx() {
            Ok(idx) => idx,
            Err(e) => {
                ring.ring_broken(&e);
                return false;
            }
        };
        let avail = ring
            .gather
            .extend(next_avail, avail, || avail_idx().ok(), pass::now_ns);
        let Some(split) = ring.vq.split() else {
            return false;
        };
        if let Err(e) = split.check_avail(avail) {
            ring.ring_broken(&e);
            return false;
        }
        let entries = split.entries(mem);
        stage_clock::mark(Stage::Available);
        // A backstore refuses work at a commit, after a batch: once per
        // batch is enough.
        let saturated = self.handler.commit_retry_in().is_some();
        let mut heads = [0u16; HEADS_AHEAD];
        // The split ring, borrowed again at each use since the handler
        // takes the whole `Vring` in between (a split ring, checked above).
        macro_rules! split {
            () => {
                match ring.vq.split() {
                    Some(split) => split,
                    None => return false,
                }
            };
        }
        while split!().next_avail() != avail {
            // The heads of up to HEADS_AHEAD entries first, then their
            // chains: read right after `avail->idx`, the entries are in
            // the line(s) that load brought in. Read one per request,
            // after the previous request's work, an entry often missed
            // under a driver that publishes every request on its own: it
            // had taken the line back to write the next ones
            // (docs/benchmarks.md, "Target: reading a batch's avail
            // entries together").
            let n = usize::from(avail.wrapping_sub(split!().next_avail())).min(HEADS_AHEAD);
            let got = split!().read_heads(mem, entries, &mut heads[..n]);
            stage_clock::mark(Stage::Heads);
            for &head in &heads[..got] {
                if saturated
                    || ring.backpressure.limit.reached(ring.counters.in_flight())
                    || ring.device.qos.wait(pass::now()).is_some()
                {
                    // Full: this chain and the ones after it stay on the
                    // ring (see `runtime::queue::limit`).
                    ring.hold();
                    return true;
                }
                let split = split!();
                split.set_next_avail(split.next_avail().wrapping_add(1));
                if head >= size {
                    let d = &ring.device;
                    DeviceMetrics::bump(&d.metrics.malformed_chains);
                    guest_warn!(
                        d.limiter,
                        device = d.id,
                        vq = ring.key.vq,
                        "head index {head} out of range: chain dropped"
                    );
                    continue;
                }
                ring.counters.taken();
                if let Some(t) = ring.tracking.as_mut() {
                    // Before the request goes anywhere; a head recorded in
                    // flight already is a duplicate the handler ignores.
                    t.taken(head);
                }
                let chain = Chain::Split(split!().chain(mem, head));
                self.handler.handle(ring, mem, chain);
            }
            if got < n {
                // An entry that cannot be read ends the batch.
                break;
            }
        }
        stage_clock::mark(Stage::Taken);
        true
    }

    /// [`Self::take_available`] on a packed ring: list after list while
    /// the descriptor at the next position is available, at most a ring's
    /// worth; false if the ring turned out corrupt.
    fn take_packed(&mut self, mem: Batch<'_>) -> bool {
        let ring = &mut self.ring;
        let saturated = self.handler.commit_retry_in().is_some();
        for _ in 0..ring.vq.size() {
            match ring.vq.has_available(mem) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    ring.ring_broken(&e);
                    return false;
                }
            }
            if saturated
                || ring.backpressure.limit.reached(ring.counters.in_flight())
                || ring.device.qos.wait(pass::now()).is_some()
            {
                // Full: this list and the ones after it stay on the ring.
                ring.hold();
                break;
            }
            let chain = match ring.vq.pop(mem) {
                Ok(Some(chain)) => chain,
                Ok(None) => break,
                Err(e) => {
                    ring.ring_broken(&e);
                    return false;
                }
            };
            ring.counters.taken();
            self.handler.handle(ring, mem, chain);
        }
        ring.follow_packed();
        true
    }

    /// Starts waiting for everything in flight now (a task management
    /// function); returns whether nothing is in flight.
    pub fn begin_drain(&mut self) -> bool {
        self.handler.begin_drain()
    }

    /// Whether the requests a drain waits for have completed.
    pub fn drained(&self) -> bool {
        self.handler.drained()
    }

    /// The device changed (see [`RequestHandler::refresh`]).
    pub fn refresh(&mut self) -> Result<(), QueueError> {
        self.handler.refresh(&self.ring)
    }

    /// Restricts the backstore completion work of this queue to `cpus`
    /// (the ones without a poll thread).
    pub(crate) fn steer_completions(&mut self, cpus: &[usize]) {
        self.handler.steer_completions(&self.ring, cpus);
    }

    /// Waits until `deadline` for the requests in flight, completing them
    /// to the driver without taking new ones; returns how many are left.
    /// The queue goes on as before afterwards (a move that must not
    /// abandon anything drains first, then stops or keeps serving).
    pub fn drain_until(&mut self, deadline: Instant) -> usize {
        self.with_pass(|q, mem| q.handler.finish(&mut q.ring, mem, deadline))
    }

    /// Stops the queue: waits for the backstore to finish everything in
    /// flight, completes it to the driver, and says where to resume.
    ///
    /// Nothing is ever abandoned. The iovecs of a request in flight point
    /// into guest memory that its pin keeps mapped, through an iovec array
    /// of its handler, on the handler's io_uring: dropping this queue
    /// while the kernel may still copy through them (an io-wq thread runs
    /// on after we let go) would let it write into memory unmapped, or
    /// mapped again for something else, meanwhile. So past `deadline` the
    /// queue cancels what is in flight and then waits, without a bound,
    /// until every request has completed (cancelled requests with an
    /// error status, spec 8.3.2 S1: this stop cannot know whether an
    /// in-flight area will reach the next instance, a migration carries
    /// none, so even blk requests are completed rather than left recorded
    /// in flight). Only then is `self` dropped with the pins, the iovecs
    /// and the ring. An operation the kernel cannot cancel (a regular
    /// file's read or write already running in io-wq) is waited for: the
    /// session meanwhile does not answer GET_VRING_BASE (S5) and gives up
    /// on the whole process if the wait outlasts its own bound (see
    /// `Session::stop_queue`).
    pub fn stop(mut self, deadline: Instant) -> StopReport {
        let mapped = self.ring.mem.take();
        let mem = mapped.batch();
        let mut left = self.handler.finish(&mut self.ring, mem, deadline);
        let (device, vq) = (Arc::clone(&self.ring.device), self.ring.key.vq);
        if left > 0 {
            error!(
                device = device.id,
                vq, "{left} requests still in flight at the stop deadline: cancelling them"
            );
        }
        while left > 0 {
            // Again at each round: a SCSI command sliced into several
            // backstore requests submits its next slice when one
            // completes, and that one must be cancelled too.
            self.handler.cancel(&self.ring);
            left = self
                .handler
                .finish(&mut self.ring, mem, Instant::now() + CANCEL_ROUND);
            // What completed goes to the driver now, not once the last
            // request is back: the queue is still ours (nothing was
            // answered yet), and the driver need not wait for the slowest.
            self.ring.publish(mem);
            if left > 0 {
                warn!(
                    device = device.id,
                    vq,
                    "{left} requests not yet completed after their cancellation: waiting for them"
                );
            }
        }
        self.ring.publish(mem);
        self.ring.park_poll();
        let requests = self.ring.counters.requests();
        info!(device = device.id, vq, requests, "queue stopped");
        device.events.publish(Event::QueueStopped {
            device: device.id,
            vq,
            requests,
        });
        self.ring.flush_poll_figures();
        if let Some(m) = self.ring.metrics() {
            m.stopped();
        }
        StopReport {
            base: self.ring.vq.base(),
            requests,
        }
    }
}

/// How long a stop waits for cancelled requests between two cancellations
/// (and two log lines).
const CANCEL_ROUND: Duration = Duration::from_secs(1);

/// A chain a request handler received, once [`Vring::accept`] looked at
/// it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accepted {
    /// Parsed: a request at this head.
    Request(u16),
    /// The head is still in flight (made available twice): ignored, the
    /// request in flight completes it.
    Duplicate,
    /// Unusable (see [`ChainError`]): the handler answers it with its
    /// error response, as far as the buffers found allow.
    Bad(u16),
}

impl Vring {
    /// Parses a chain for a request handler into `out` (at most
    /// `max_segments` buffers), counting and logging (rate-limited) what
    /// a guest can get wrong: a head made available while `in_flight`
    /// says it still is, a chain that cannot be followed, buffers in the
    /// wrong order or outside memory. A request or a bad chain (which the
    /// handler answers) is in flight from now on, taken at the time of
    /// this pass, until [`Self::complete`].
    pub fn accept(
        &mut self,
        chain: Chain<'_>,
        mem: Batch<'_>,
        max_segments: usize,
        out: &mut ChainBuffers,
        in_flight: impl FnOnce(u16) -> bool,
    ) -> Accepted {
        let head = chain.head_index();
        let parsed = chain.parse(mem, max_segments, out);
        let d = &self.device;
        if in_flight(head) {
            DeviceMetrics::bump(&d.metrics.duplicate_heads);
            guest_warn!(
                d.limiter,
                device = d.id,
                vq = self.key.vq,
                "head {head} made available while in flight: ignored"
            );
            return Accepted::Duplicate;
        }
        self.counters.accepted(head);
        if d.qos.on() {
            d.qos
                .charge(pass::now(), out.readable_len + out.writable_len);
        }
        stage_clock::mark(Stage::Chain);
        match parsed {
            Ok(()) => Accepted::Request(head),
            Err(e) => {
                DeviceMetrics::bump(match e {
                    ChainError::Malformed | ChainError::TooManySegments { .. } => {
                        &d.metrics.malformed_chains
                    }
                    ChainError::WrongOrder => &d.metrics.wrong_order,
                    ChainError::OutOfMemory { .. } => &d.metrics.out_of_memory,
                });
                guest_warn!(
                    d.limiter,
                    device = d.id,
                    vq = self.key.vq,
                    "bad descriptor chain at head {head}: {e}"
                );
                Accepted::Bad(head)
            }
        }
    }

    /// Which queue this is.
    pub fn key(&self) -> QueueKey {
        self.key
    }

    /// The queue reached its limit and leaves the chains still available
    /// on its ring; with doorbells, it asks the driver to hold new ones
    /// back. Only while requests it took are in flight (T1): a backstore
    /// that refuses work with nothing in flight is retried, not
    /// signalled.
    fn hold(&mut self) {
        if !self.backpressure.left {
            self.backpressure.left = true;
            if let Some(m) = self.metrics() {
                m.limited();
            }
        }
        if !self.backpressure.throttled && self.counters.in_flight() > 0 {
            self.set_throttle(true);
        }
    }

    /// The device it belongs to.
    pub fn device(&self) -> &DeviceInfo {
        &self.device
    }

    /// The queue size.
    pub fn size(&self) -> u16 {
        self.vq.size()
    }

    /// Where the ring stands: its vring base (`Ring::base`).
    pub fn base(&self) -> u32 {
        self.vq.base()
    }

    /// Puts a completed request on the used ring (published with the
    /// batch), and its service time in the queue's figures. A used ring
    /// that cannot be written is logged.
    pub fn complete(&mut self, mem: Batch<'_>, head: u16, len: u32) {
        self.counters.completed(head);
        match self.vq.push(mem, head, len) {
            Ok(()) => {
                if let Some(t) = self.tracking.as_mut() {
                    t.completed(head);
                }
            }
            Err(e) => {
                guest_warn!(
                    self.device.limiter,
                    device = self.device.id,
                    vq = self.key.vq,
                    "cannot complete head {head}: {e}"
                );
            }
        }
    }

    /// How long the request at `head` (in flight) has been served: from
    /// the pass that took it to this one (the latency histogram's time).
    #[inline]
    pub fn service_ns(&self, head: u16) -> u64 {
        self.counters.service_ns(head)
    }

    /// A request completing now moved `read` bytes from the medium to
    /// the driver and `written` bytes from the driver to the medium (reads
    /// and writes that succeeded).
    pub fn transferred(&mut self, read: u64, written: u64) {
        self.counters.transferred(read, written);
    }

    /// The used index now covers `batch` more requests: their in-flight
    /// records go.
    fn published(&mut self, batch: u16) {
        if let (Some(t), Some(split)) = (self.tracking.as_mut(), self.vq.split()) {
            t.published(batch, split.next_used());
        }
    }

    /// This queue's figures in the device's metrics.
    pub(crate) fn metrics(&self) -> Option<&QueueMetrics> {
        self.device.metrics.queue(self.key.vq)
    }

    /// Counts one published batch in the queue's metrics, with what its
    /// requests add, whichever way the queue is notified.
    fn count_batch(&mut self, batch: u16) {
        self.counters
            .published(self.device.metrics.queue(self.key.vq), batch);
    }

    /// Shows the requests in flight in the queue's metrics if that
    /// changed (once per publish: after every batch taken or reaped).
    fn show_in_flight(&mut self) {
        self.counters
            .show_in_flight(self.device.metrics.queue(self.key.vq));
    }

    /// Publishes completed requests and notifies the driver if it asked.
    pub(crate) fn publish(&mut self, mem: Batch<'_>) {
        self.show_in_flight();
        if self.backpressure.throttled
            && self.backpressure.limit.released(self.counters.in_flight())
        {
            // T2: cleared before the used index store (Release) that
            // publishes the completions which brought the queue down.
            self.set_throttle(false);
        }
        if self.publish_doorbell(mem) {
            return;
        }
        let batch = self.vq.pending();
        let result = self.vq.publish(mem);
        if batch > 0 && result.is_ok() {
            self.published(batch);
        }
        if batch > 0 {
            self.count_batch(batch);
        }
        match result {
            Ok(true) => self.signal_call(),
            Ok(false) => {}
            Err(e) => {
                error!(device = self.device.id, vq = self.key.vq, "used ring: {e}");
                self.mark_broken(&format_args!("used ring: {e}"));
            }
        }
    }

    /// Notifies the driver. A saturated call counter means a notification
    /// is pending already (counted, merged); a call descriptor that cannot
    /// be written at all breaks the queue, since the driver would wait for
    /// completions forever.
    fn signal_call(&mut self) {
        let signal = match self.notifiers.call(!self.broken) {
            Called::Signalled(signal) => signal,
            Called::Owed | Called::Dropped => return,
        };
        if matches!(signal, Signal::Sent | Signal::Coalesced)
            && let Some(m) = self.metrics()
        {
            m.called();
        }
        match signal {
            Signal::Sent => {}
            Signal::Coalesced => DeviceMetrics::bump(&self.device.metrics.calls_coalesced),
            Signal::Failed(e) => {
                guest_warn!(
                    self.device.limiter,
                    device = self.device.id,
                    vq = self.key.vq,
                    "call eventfd cannot be written ({e}): queue stopped"
                );
                self.mark_broken(&format_args!("call eventfd cannot be written ({e})"));
            }
            Signal::Stalled => {
                DeviceMetrics::bump(&self.device.metrics.stalled_writes);
                guest_warn!(
                    self.device.limiter,
                    device = self.device.id,
                    vq = self.key.vq,
                    "call eventfd blocked the worker (made blocking and full by the frontend): \
                     queue stopped"
                );
                self.mark_broken(&"call eventfd blocked the worker");
            }
        }
    }

    fn ring_broken(&mut self, e: &dyn std::fmt::Display) {
        guest_warn!(
            self.device.limiter,
            device = self.device.id,
            vq = self.key.vq,
            "ring corrupt ({e}): queue stopped, device needs reset"
        );
        self.mark_broken(&format_args!("ring corrupt ({e})"));
    }

    /// The queue serves nothing more: counted, told to subscribers of
    /// events, and DEVICE_NEEDS_RESET raised (the first time).
    fn mark_broken(&mut self, reason: &dyn std::fmt::Display) {
        if self.broken {
            return;
        }
        self.broken = true;
        if self.device.events.wanted() {
            self.device.events.publish(Event::QueueBroken {
                device: self.device.id,
                vq: self.key.vq,
                reason: reason.to_string(),
            });
        }
        DeviceMetrics::bump(&self.device.metrics.broken_rings);
        if let Some(m) = self.metrics() {
            m.broke();
        }
        self.notifiers.signal_err();
    }
}

/// Reads a backstore's completion descriptor (eventfd-like) to rearm it;
/// errors (EAGAIN) mean there was nothing to read.
pub(crate) fn drain_fd(fd: RawFd) {
    let mut buf = [0u8; 8];
    // SAFETY: `buf` is valid for writes of 8 bytes; `fd` is a descriptor
    // the backstore queue owns and keeps open while we hold the queue.
    let _ = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
}

/// Waits up to `ms` milliseconds for `fd` to become readable (a stopping
/// queue waiting for its backstore); what comes after is a new pass.
pub(crate) fn wait_readable(fd: RawFd, ms: i32) {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let _ = unsafe { libc::poll(&mut pfd, 1, ms) };
    pass::begin();
}
