//! A request virtqueue as served by its worker: the ring, its eventfds,
//! the backstore queues of every LUN, and the requests in flight.
//!
//! A [`ServedQueue`] is created inside its worker thread from a
//! [`QueueStart`] and owned by that thread alone until it is stopped:
//! nothing on the request path is shared with another worker. Guest memory
//! is read through a `GuestMemoryAtomic` that the control thread swaps on a
//! memory table change; each pass loads the current map once, and every
//! request in flight keeps the map its iovecs point into alive.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqcq_backstore::{Backstore, BackstoreQueue};
use sqcq_protocol::SpinPolicy;
use sqcq_scsi::NexusId;
use thiserror::Error;
use tracing::{error, info};
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};

use crate::guest_warn;
use crate::runtime::chain::ChainBuffers;
use crate::runtime::eventfd::{PeerEventFd, Signal};
use crate::runtime::metrics::DeviceMetrics;
use crate::runtime::used::UsedRing;
use crate::scsi::inflight::Inflight;
use crate::scsi::target::Target;
use crate::transport::device::DeviceShared;

mod poll;

pub use poll::PollError;
pub(crate) use poll::QueuePoll;

/// Identifies a queue in the whole daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QueueKey {
    /// Device number (order of the devices in the configuration).
    pub device: u32,
    /// Virtqueue index (2 and up for request queues).
    pub vq: u16,
}

/// How a queue learns that the driver made requests available.
///
/// The two poll variants run a `sqcq_protocol::Poller` over what
/// they watch (module `poll` below): the worker spins over its polled
/// queues for their adaptive windows ([`crate::runtime::poll`]), then each asks for
/// a notification, and the worker sleeps on the same kick eventfds.
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

/// Ring addresses and state handed over by the control thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingConfig {
    /// Queue size.
    pub size: u16,
    /// Descriptor table (guest physical).
    pub desc: u64,
    /// Available ring (guest physical).
    pub avail: u64,
    /// Used ring (guest physical).
    pub used: u64,
    /// Next available index to process.
    pub next_avail: u16,
    /// VIRTIO_RING_F_EVENT_IDX negotiated.
    pub event_idx: bool,
}

/// Everything a worker needs to start serving a queue.
#[derive(Debug)]
pub struct QueueStart {
    /// Which queue.
    pub key: QueueKey,
    /// The device it belongs to.
    pub device: Arc<DeviceShared>,
    /// The I_T nexus of the connection.
    pub nexus: NexusId,
    /// CDB bytes in a request header.
    pub cdb_size: u32,
    /// Sense bytes in a response.
    pub sense_size: u32,
    /// Guest memory of the connection.
    pub mem: GuestMemoryAtomic<GuestMemoryMmap>,
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
}

/// Why a queue could not start.
#[derive(Debug, Error)]
pub enum QueueError {
    /// The ring addresses or size are invalid for guest memory.
    #[error("invalid ring configuration")]
    Ring(#[source] virtio_queue::Error),
    /// VIRTIO_F_SQCQ_POLL is negotiated and the doorbells cannot be used.
    #[error("unusable doorbells")]
    Doorbells(#[source] PollError),
    /// A backstore queue could not be opened.
    #[error("cannot open a backstore queue for LUN {lun}")]
    Backstore {
        /// The LUN.
        lun: u16,
        /// Why.
        #[source]
        source: sqcq_backstore::BackstoreError,
    },
}

/// Where a stopped queue left off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StopReport {
    /// Next available index to process (the vring base).
    pub next_avail: u16,
    /// Requests completed while the queue ran.
    pub requests: u64,
}

/// One LUN's backstore queue on this worker.
pub(crate) struct LunQueue {
    /// The LUN, and the backstore the queue was opened on (a LUN removed
    /// and added again is a different backstore).
    pub(crate) lun: u16,
    pub(crate) backstore: Arc<dyn Backstore>,
    pub(crate) io: Box<dyn BackstoreQueue>,
    pub(crate) uncommitted: bool,
}

/// A request queue owned by a worker.
pub struct ServedQueue {
    pub(crate) key: QueueKey,
    pub(crate) device: Arc<DeviceShared>,
    pub(crate) nexus: NexusId,
    pub(crate) sense_size: usize,
    mem: GuestMemoryAtomic<GuestMemoryMmap>,
    pub(crate) queue: Queue,
    pub(crate) used: UsedRing,
    kick: PeerEventFd,
    call: Option<PeerEventFd>,
    /// A notification fell due while there was no call eventfd: sent as
    /// soon as one arrives. QEMU starts a ring with SET_VRING_KICK and only
    /// then sends SET_VRING_CALL, so a request the driver makes available
    /// right after DRIVER_OK can complete before the call fd is here.
    call_owed: bool,
    /// Fault injection (`fault break`): the queue breaks when it next
    /// finds a request, before taking it.
    break_armed: bool,
    err: Option<PeerEventFd>,
    source: SubmissionSource,
    /// Poll state (poll sources only; dropped when the queue breaks).
    poll: Option<Box<QueuePoll>>,
    /// This queue's LUN snapshot (see [`crate::scsi::hotplug`]): `luns[i]` is
    /// the backstore queue of `target.luns()[i]`; queues of removed LUNs
    /// with requests in flight follow.
    pub(crate) target: Arc<Target>,
    pub(crate) luns: Vec<LunQueue>,
    pub(crate) inflight: Inflight,
    /// Heads of requests whose next slice goes out on the next pass.
    pub(crate) resume: Vec<u16>,
    pub(crate) chain: ChainBuffers,
    pub(crate) max_segments: usize,
    pub(crate) header: Vec<u8>,
    pub(crate) data_out: Vec<u8>,
    pub(crate) data_in: Vec<u8>,
    broken: bool,
    pub(crate) requests: u64,
}

impl std::fmt::Debug for ServedQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServedQueue")
            .field("key", &self.key)
            .field("in_flight", &self.inflight.len())
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

impl ServedQueue {
    /// Validates the ring and opens a backstore queue per LUN.
    pub fn start(s: QueueStart) -> Result<Self, QueueError> {
        let ring = s.ring;
        let (queue, used) = open_ring(&ring, &s.mem.memory())?;
        // Read here, on the worker: a LUN change handed to the workers
        // before this start is in it, one after comes as SetTarget.
        let target = s.device.target.current();
        let mut luns = Vec::with_capacity(target.luns().len());
        for entry in target.luns() {
            let io = entry
                .backstore
                .open_queue(u32::from(ring.size))
                .map_err(|source| QueueError::Backstore {
                    lun: entry.lun,
                    source,
                })?;
            luns.push(LunQueue {
                lun: entry.lun,
                backstore: Arc::clone(&entry.backstore),
                io,
                uncommitted: false,
            });
        }
        let data_out_len = target
            .luns()
            .iter()
            .map(|e| e.unit.max_data_out_len())
            .max()
            .unwrap_or(0);
        let max_segments = usize::from(ring.size);
        let cdb_size = usize::try_from(s.cdb_size).unwrap_or(usize::MAX);
        let mut q = ServedQueue {
            key: s.key,
            nexus: s.nexus,
            sense_size: usize::try_from(s.sense_size).unwrap_or(usize::MAX),
            mem: s.mem,
            queue,
            used,
            kick: s.kick,
            call: s.call,
            call_owed: false,
            break_armed: false,
            err: s.err,
            source: s.source,
            poll: None,
            target,
            luns,
            inflight: Inflight::new(ring.size),
            resume: Vec::with_capacity(usize::from(ring.size)),
            chain: ChainBuffers::with_capacity(max_segments.min(64)),
            max_segments,
            header: vec![0; sqcq_wire::scsi::CMD_REQ_FIXED + cdb_size],
            data_out: vec![0; data_out_len],
            data_in: vec![0; sqcq_scsi::DATA_IN_LEN],
            broken: false,
            requests: 0,
            device: s.device,
        };
        if let Some(m) = q.metrics() {
            m.started(q.mode());
        }
        q.open_poll(&ring, s.spin);
        Ok(q)
    }

    /// The kick eventfd, for the worker's epoll set.
    pub fn kick_fd(&self) -> RawFd {
        self.kick.as_raw_fd()
    }

    /// `(LUN index, fd)` of every backstore queue that signals completions
    /// through a descriptor.
    pub fn completion_fds(&self) -> impl Iterator<Item = (usize, RawFd)> + '_ {
        self.luns
            .iter()
            .enumerate()
            .filter_map(|(i, l)| l.io.completion_fd().map(|fd| (i, fd)))
    }

    /// How long the worker may sleep before this queue needs a look
    /// without an event; `None`: only when its fds are readable.
    pub fn poll_timeout(&self) -> Option<Duration> {
        if self.has_slices_pending() {
            return Some(Duration::ZERO);
        }
        match self.source {
            SubmissionSource::Kick => None,
            // While spinning, the worker only looks at its fds.
            SubmissionSource::RingPoll | SubmissionSource::Doorbell => {
                self.is_spinning().then_some(Duration::ZERO)
            }
        }
    }

    /// Whether the ring was found corrupt (the queue no longer runs).
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Fault injection (`fault break`): the queue will break when it next
    /// finds a request made available, leaving that request untaken, as
    /// for a doorbell value no correct driver writes. False if it is
    /// broken or armed already.
    pub(crate) fn arm_break(&mut self) -> bool {
        if self.broken || self.break_armed {
            return false;
        }
        self.break_armed = true;
        true
    }

    /// Replaces the call eventfd (SET_VRING_CALL while running), and
    /// sends the notification owed since the queue had none.
    pub fn set_call(&mut self, call: Option<PeerEventFd>) {
        self.call = call;
        if self.call.is_some() && std::mem::take(&mut self.call_owed) {
            self.signal_call();
        }
    }

    /// The kick eventfd fired.
    pub fn on_kick(&mut self) {
        // Never blocks (see `PeerEventFd::drain`). The value only counts
        // kicks; the ring says what to do.
        if let (Some(n), Some(m)) = (self.kick.drain(), self.metrics()) {
            m.kicked(n);
        }
        self.process();
    }

    /// One pass of the worker's loop: the next slice of every long
    /// command that waits for one.
    pub fn pass(&mut self) {
        if self.has_slices_pending() {
            let mem = self.mem.memory().into_inner();
            self.resume_slices(&mem);
        }
    }

    /// The kick descriptor hung up or failed: the driver can no longer
    /// notify this queue, which stops.
    pub fn kick_failed(&mut self) {
        DeviceMetrics::bump(&self.device.metrics.dead_kicks);
        guest_warn!(self.device.limiter, device = %self.device.name, vq = self.key.vq,
            "kick descriptor hung up: queue stopped, device needs reset");
        self.mark_broken();
    }

    /// A backstore queue's completion descriptor fired.
    pub fn on_completion(&mut self, lun: usize) {
        if let Some(fd) = self.luns.get(lun).and_then(|l| l.io.completion_fd()) {
            drain_fd(fd);
        }
        let mem = self.mem.memory().into_inner();
        self.reap(lun, &mem);
        self.publish(&mem);
    }

    /// Processes every available request, then re-enables notifications
    /// and re-checks the ring (so a request made available meanwhile is
    /// not left waiting for a kick that will never come).
    ///
    /// A polled queue only takes what is available: its notifications are
    /// its poller's business.
    pub fn process(&mut self) {
        if self.broken {
            return;
        }
        if self.source != SubmissionSource::Kick {
            self.drain_ring();
            return;
        }
        let mem = self.mem.memory().into_inner();
        loop {
            if let Err(e) = self.queue.disable_notification(&*mem) {
                self.ring_broken(&e);
                return;
            }
            if !self.take_available(&mem) {
                return;
            }
            self.commit();
            for lun in 0..self.luns.len() {
                self.reap(lun, &mem);
            }
            self.publish(&mem);
            match self.queue.enable_notification(&*mem) {
                Ok(true) => continue,
                Ok(false) => return,
                Err(e) => {
                    self.ring_broken(&e);
                    return;
                }
            }
        }
    }

    /// Handles every chain available now (at most a ring's worth); false
    /// if the ring turned out corrupt.
    fn take_available(&mut self, mem: &Arc<GuestMemoryMmap>) -> bool {
        if self.break_armed {
            match self
                .queue
                .avail_idx(&**mem, std::sync::atomic::Ordering::Acquire)
            {
                Ok(idx) if idx.0 == self.queue.next_avail() => return true,
                Ok(_) => {
                    self.break_armed = false;
                    self.break_injected();
                }
                Err(e) => self.ring_broken(&e),
            }
            return false;
        }
        let mut budget = self.queue.size();
        while budget > 0 {
            let chain = match self.queue.iter(&**mem) {
                Ok(mut it) => it.next(),
                Err(e) => {
                    self.ring_broken(&e);
                    return false;
                }
            };
            let Some(chain) = chain else { break };
            self.handle_chain(mem, chain);
            budget -= 1;
        }
        true
    }

    pub(crate) fn commit(&mut self) {
        for l in self.luns.iter_mut().filter(|l| l.uncommitted) {
            l.uncommitted = false;
            if let Err(e) = l.io.commit() {
                // The requests stay queued in the backstore queue and are
                // reaped as failures or on a later commit.
                error!(device = %self.device.name, vq = self.key.vq, "backstore commit failed: {e}");
            }
        }
    }

    /// Counts one published batch in the queue's metrics, whichever way
    /// the queue is notified.
    fn count_batch(&self, batch: u16) {
        if let Some(m) = self.metrics() {
            m.batch(batch);
        }
    }

    /// Publishes completed requests and notifies the driver if it asked.
    pub(crate) fn publish(&mut self, mem: &GuestMemoryMmap) {
        if self.publish_doorbell(mem) {
            return;
        }
        let batch = self.used.pending();
        let result = self.used.publish(mem);
        if batch > 0 {
            self.count_batch(batch);
        }
        match result {
            Ok(true) => self.signal_call(),
            Ok(false) => {}
            Err(e) => {
                error!(device = %self.device.name, vq = self.key.vq, "used ring: {e}");
                self.mark_broken();
            }
        }
    }

    /// Notifies the driver. A saturated call counter means a notification
    /// is pending already (counted, merged); a call descriptor that cannot
    /// be written at all breaks the queue, since the driver would wait for
    /// completions forever.
    fn signal_call(&mut self) {
        let Some(call) = &self.call else {
            self.call_owed = !self.broken;
            return;
        };
        let signal = call.signal();
        if matches!(signal, Signal::Sent | Signal::Coalesced)
            && let Some(m) = self.metrics()
        {
            m.called();
        }
        match signal {
            Signal::Sent => {}
            Signal::Coalesced => DeviceMetrics::bump(&self.device.metrics.calls_coalesced),
            Signal::Failed(e) => {
                guest_warn!(self.device.limiter, device = %self.device.name, vq = self.key.vq,
                    "call eventfd cannot be written ({e}): queue stopped");
                self.call = None;
                self.mark_broken();
            }
            Signal::Stalled => {
                DeviceMetrics::bump(&self.device.metrics.stalled_writes);
                guest_warn!(self.device.limiter, device = %self.device.name, vq = self.key.vq,
                    "call eventfd blocked the worker (made blocking and full by the frontend): \
                     queue stopped");
                self.call = None;
                self.mark_broken();
            }
        }
    }

    fn ring_broken(&mut self, e: &virtio_queue::Error) {
        guest_warn!(self.device.limiter, device = %self.device.name, vq = self.key.vq,
            "ring corrupt ({e}): queue stopped, device needs reset");
        self.mark_broken();
    }

    fn mark_broken(&mut self) {
        if self.broken {
            return;
        }
        self.broken = true;
        DeviceMetrics::bump(&self.device.metrics.broken_rings);
        if let Some(m) = self.metrics() {
            m.broke();
        }
        // Whatever the error descriptor does, the queue is stopped already.
        if let Some(err) = &self.err {
            let _ = err.signal();
        }
    }

    /// Starts waiting for everything in flight now (a task management
    /// function); returns whether nothing is in flight.
    pub fn begin_drain(&mut self) -> bool {
        self.inflight.begin_drain()
    }

    /// Whether the requests a drain waits for have completed.
    pub fn drained(&self) -> bool {
        self.inflight.drained()
    }

    /// Stops the queue: waits for the backstore to finish everything in
    /// flight, completes it to the driver, and says where to resume.
    pub fn stop(mut self, deadline: Instant) -> StopReport {
        let mem = self.mem.memory().into_inner();
        self.commit();
        while !self.inflight.is_empty() && Instant::now() < deadline {
            if self.has_slices_pending() {
                self.resume_slices(&mem);
            }
            for lun in 0..self.luns.len() {
                if self.luns[lun].io.in_flight() == 0 {
                    continue;
                }
                if let Some(fd) = self.luns[lun].io.completion_fd() {
                    wait_readable(fd, 10);
                    drain_fd(fd);
                }
                self.reap(lun, &mem);
            }
        }
        if !self.inflight.is_empty() {
            error!(
                device = %self.device.name,
                vq = self.key.vq,
                "{} requests still in flight at the stop deadline; abandoning them",
                self.inflight.len()
            );
        }
        self.publish(&mem);
        info!(
            device = %self.device.name,
            vq = self.key.vq,
            requests = self.requests,
            "queue stopped"
        );
        self.flush_poll_figures();
        if let Some(m) = self.metrics() {
            m.stopped();
        }
        StopReport {
            next_avail: self.queue.next_avail(),
            requests: self.requests,
        }
    }
}

/// Builds the device side of a split ring from its configuration and
/// checks it against guest memory. The used side continues after whatever
/// the device published last (0 for a new driver): SET_VRING_BASE only
/// restores the available side.
pub(crate) fn open_ring(
    ring: &RingConfig,
    mem: &GuestMemoryMmap,
) -> Result<(Queue, UsedRing), QueueError> {
    let mut queue = Queue::new(ring.size).map_err(QueueError::Ring)?;
    queue.try_set_size(ring.size).map_err(QueueError::Ring)?;
    queue
        .try_set_desc_table_address(GuestAddress(ring.desc))
        .map_err(QueueError::Ring)?;
    queue
        .try_set_avail_ring_address(GuestAddress(ring.avail))
        .map_err(QueueError::Ring)?;
    queue
        .try_set_used_ring_address(GuestAddress(ring.used))
        .map_err(QueueError::Ring)?;
    queue.set_next_avail(ring.next_avail);
    queue.set_event_idx(ring.event_idx);
    queue.set_ready(true);
    if !queue.is_valid(mem) {
        return Err(QueueError::Ring(virtio_queue::Error::InvalidSize));
    }
    // Where the used ring stands when the queue (re)starts: written last
    // by this device (a previous worker's Release publish) or zeroed by
    // the driver before it enabled the queue; Acquire pairs with either.
    let next_used = queue
        .used_idx(mem, std::sync::atomic::Ordering::Acquire)
        .map_err(QueueError::Ring)?
        .0;
    queue.set_next_used(next_used);
    let used = UsedRing::new(
        GuestAddress(ring.used),
        GuestAddress(ring.avail),
        ring.size,
        ring.event_idx,
        next_used,
    );
    Ok((queue, used))
}

/// Reads an eventfd-like descriptor to rearm it; errors (EAGAIN) mean
/// there was nothing to read.
fn drain_fd(fd: RawFd) {
    let mut buf = [0u8; 8];
    // SAFETY: `buf` is valid for writes of 8 bytes; `fd` is a descriptor
    // the backstore queue owns and keeps open while we hold the queue.
    let _ = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
}

/// Waits up to `ms` milliseconds for `fd` to become readable.
fn wait_readable(fd: RawFd, ms: i32) {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let _ = unsafe { libc::poll(&mut pfd, 1, ms) };
}
