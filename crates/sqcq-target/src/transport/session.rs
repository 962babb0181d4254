//! One vhost-user connection: the state the control thread owns, and the
//! vring lifecycle.
//!
//! A vring runs when it has a size, addresses, memory and a kick eventfd
//! (SET_VRING_KICK starts it) and is enabled (SET_VRING_ENABLE 1, or all
//! rings at SET_FEATURES when VHOST_USER_F_PROTOCOL_FEATURES was not
//! negotiated). GET_VRING_BASE stops it: its worker finishes what is in
//! flight and reports where the driver should resume. Request queues run on
//! their worker; the device's other queues (virtio-scsi's control and
//! event queues) run on this thread, served by the device's
//! [`DeviceSession`].

use std::sync::Arc;

use crate::runtime::shared_memory::SharedMemory;
use thiserror::Error;
use tracing::{error, info, warn};
use vhost::vhost_user::VhostUserVirtioFeatures;

use crate::runtime::eventfd::PeerEventFd;
use crate::runtime::events::Event;
use crate::runtime::guest::{DirtyLog, GuestMem};
use crate::runtime::metrics::DeviceMetrics;
use crate::runtime::options::RingMode;
use crate::runtime::queue::{DeviceInfo, QueueKey, QueueStart, RingConfig, SubmissionSource};
use crate::runtime::tracking::InflightArea;
use crate::runtime::worker::{QUEUE_STOP_TIMEOUT, WorkerCommand, WorkerGone, WorkerPool};
use crate::transport::backend_channel::BackendChannel;
use crate::transport::device::DeviceShared;
use crate::transport::device_type::{DeviceSession, LocalQueueFds, SessionCtx};
use crate::transport::memory::{GuardedRegion, Mapping};

/// How long after its deadline a worker's answer to a stop may take.
const REPLY_MARGIN: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a stop waits, past its deadline, for the requests it
/// cancelled to complete before it ends the process (`stop_failed`). The
/// kernel completes a cancelled request at once unless it is already
/// running and cannot be interrupted (a regular file's read or write in
/// io-wq): this is how long such an operation may take.
const CANCEL_GRACE: std::time::Duration = QUEUE_STOP_TIMEOUT;

/// How long a queue being moved to another worker waits for its requests
/// in flight (its worker serves nothing else meanwhile); past it the
/// queue stays where it is.
pub const MOVE_DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// A queue moved: `(vq, from worker, to worker)`.
pub type Moved = (u16, usize, usize);

/// What became of one queue to move.
pub type MoveOutcome = Result<Moved, MoveError>;

/// Why a request queue could not start on a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StartFailure {
    /// The worker is gone or being freed: another may take it.
    Worker,
    /// The queue itself (its rings, its eventfds): no worker will.
    Queue,
}

impl MoveError {
    /// The vring it is about.
    pub fn vq(&self) -> u16 {
        match self {
            MoveError::Busy { vq, .. }
            | MoveError::NotThere { vq, .. }
            | MoveError::Stop { vq, .. }
            | MoveError::Start { vq, .. }
            | MoveError::Stopped { vq } => *vq,
        }
    }
}

/// Why a request queue did not move to another worker.
#[derive(Debug, Error)]
pub enum MoveError {
    /// Its requests in flight did not complete in time.
    #[error(
        "vq {vq}: {left} requests still in flight after {MOVE_DRAIN_TIMEOUT:?}: it stays on worker {from}"
    )]
    Busy {
        /// The vring.
        vq: u16,
        /// Where it stays.
        from: usize,
        /// Requests in flight.
        left: usize,
    },
    /// Its worker does not serve it.
    #[error("vq {vq}: worker {worker} does not serve it")]
    NotThere {
        /// The vring.
        vq: u16,
        /// The worker.
        worker: usize,
    },
    /// Its worker did not answer.
    #[error("vq {vq}: worker {worker} did not release it")]
    Stop {
        /// The vring.
        vq: u16,
        /// The worker.
        worker: usize,
        /// Why.
        #[source]
        source: WorkerGone,
    },
    /// It could not start on the other worker, and runs where it was.
    #[error("vq {vq}: it could not start on worker {to}: back on worker {from}")]
    Start {
        /// The vring.
        vq: u16,
        /// Where it runs.
        from: usize,
        /// Where it could not start.
        to: usize,
    },
    /// It could start nowhere (see the log).
    #[error("vq {vq}: stopped for the move and could not start again")]
    Stopped {
        /// The vring.
        vq: u16,
    },
}

/// Where a vring is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Running {
    /// Not running.
    No,
    /// On this worker of the pool.
    Worker(usize),
    /// On the control thread.
    Control,
}

/// What the frontend told us about one vring (its setup messages), and
/// where it runs; the running ring is `runtime::queue::Vring`.
#[derive(Debug)]
pub struct VringSetup {
    /// Queue size (0: not set).
    pub size: u16,
    /// Descriptor table, available ring, used ring (guest physical); of a
    /// packed ring, its descriptor ring, driver area and device area.
    pub addrs: Option<(u64, u64, u64)>,
    /// The vring base (SET_VRING_BASE, or where it stopped): the next
    /// available index, or a packed ring's two positions.
    pub base: u32,
    /// Kick eventfd.
    pub kick: Option<PeerEventFd>,
    /// Call eventfd.
    pub call: Option<PeerEventFd>,
    /// Error eventfd.
    pub err: Option<PeerEventFd>,
    /// SET_VRING_ENABLE state.
    pub enabled: bool,
    /// Where it runs.
    pub running: Running,
}

impl VringSetup {
    fn new() -> Self {
        VringSetup {
            size: 0,
            addrs: None,
            base: 0,
            kick: None,
            call: None,
            err: None,
            enabled: false,
            running: Running::No,
        }
    }
}

/// The state of one connection, owned by the device's control thread.
pub struct Session {
    pub(crate) dev: Arc<DeviceShared>,
    pub(crate) pool: Arc<WorkerPool>,
    /// The device's state for this connection.
    pub(crate) device: Box<dyn DeviceSession>,
    /// Vrings the device serves on this thread (the first ones).
    local: usize,
    /// Vrings a frontend may set up.
    max_vrings: usize,
    pub(crate) owned: bool,
    pub(crate) acked_features: u64,
    pub(crate) acked_protocol: u64,
    pub(crate) mem: SharedMemory,
    pub(crate) mappings: Vec<Mapping>,
    /// The mapped regions of the current memory table.
    pub(crate) regions: Vec<GuardedRegion>,
    /// Regions of replaced tables, unmapped once nothing uses them.
    pub(crate) retired: Vec<GuardedRegion>,
    pub(crate) vrings: Vec<VringSetup>,
    /// The backend channel, once the frontend gave one.
    pub(crate) backend_channel: Option<BackendChannel>,
    /// A duplicate of the descriptor the message being handled carries,
    /// if it is SET_BACKEND_REQ_FD (see [`crate::transport::backend_channel`]).
    pub(crate) peeked_backend_fd: Option<std::os::fd::OwnedFd>,
    /// The in-flight area (GET_INFLIGHT_FD / SET_INFLIGHT_FD), kept across
    /// queue restarts; the frontend keeps it across reconnects.
    pub(crate) inflight: Option<Arc<InflightArea>>,
    /// The frontend's dirty log (SET_LOG_BASE); marked while
    /// VHOST_F_LOG_ALL is negotiated.
    pub(crate) log: Option<Arc<DirtyLog>>,
    /// SET_LOG_FD's eventfd: signalled when a queue stopped while logging
    /// (its last writes are in the log).
    pub(crate) log_fd: Option<PeerEventFd>,
    /// Set by a message the connection cannot survive (the frontend waits
    /// for a reply that a refusal does not send, and going on would
    /// break a promise): the control thread ends the connection.
    pub(crate) fatal: Option<String>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("device", &self.dev.info.name)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// A new connection of `dev`.
    pub fn new(dev: Arc<DeviceShared>, pool: Arc<WorkerPool>) -> std::io::Result<Self> {
        let device = Arc::clone(&dev.device).connect(Arc::clone(&dev.info), &dev.params)?;
        let local = dev.device.local_queues();
        let max_vrings = local + usize::from(dev.device.max_request_queues());
        let vrings = (0..local + usize::from(dev.params.num_queues))
            .map(|_| VringSetup::new())
            .collect();
        Ok(Session {
            device,
            local,
            max_vrings,
            owned: false,
            acked_features: 0,
            acked_protocol: 0,
            mem: SharedMemory::new(GuestMem::default()),
            mappings: Vec::new(),
            regions: Vec::new(),
            retired: Vec::new(),
            vrings,
            backend_channel: None,
            peeked_backend_fd: None,
            inflight: None,
            log: None,
            log_fd: None,
            fatal: None,
            dev,
            pool,
        })
    }

    /// Whether a virtio feature bit was negotiated.
    pub fn has_feature(&self, bit: u32) -> bool {
        self.acked_features & (1u64 << bit) != 0
    }

    /// Whether the rings are packed (VIRTIO_F_RING_PACKED negotiated).
    pub fn packed(&self) -> bool {
        self.has_feature(virtio_bindings::bindings::virtio_config::VIRTIO_F_RING_PACKED)
    }

    /// Virtio features the device offers: VIRTIO_F_SQCQ_POLL unless the
    /// daemon withholds it.
    pub fn offered_features(&self) -> u64 {
        let options = self.pool.options();
        // Both may be offered together: the doorbells of a packed ring
        // are spec section 10, which this device implements.
        let mut ring = 0;
        if options.offer_packed {
            ring |= 1 << virtio_bindings::bindings::virtio_config::VIRTIO_F_RING_PACKED;
        }
        if options.sqcq_offered() {
            ring |= 1 << sqcq_protocol::VIRTIO_F_SQCQ_POLL;
        }
        crate::transport::handler::OFFERED_FEATURES | self.dev.device.features() | ring
    }

    /// Whether the device marks what it writes in the frontend's dirty
    /// log: VHOST_F_LOG_ALL negotiated and a log given.
    pub(crate) fn logging(&self) -> bool {
        self.acked_features & VhostUserVirtioFeatures::LOG_ALL.bits() != 0 && self.log.is_some()
    }

    /// Builds the memory map of the current table again, with the dirty
    /// log if logging is on, without it otherwise, and hands it to the
    /// workers (each takes it at its next pass; requests in flight finish
    /// on the map they started with and are marked at completion through
    /// the current one).
    pub(crate) fn remap(&mut self) -> bool {
        if self.regions.is_empty() {
            return true;
        }
        let log = if self.logging() {
            self.log.clone()
        } else {
            None
        };
        if let Some(why) = log
            .as_deref()
            .and_then(|l| crate::transport::handler::log_too_small(l, &self.mem.memory()))
        {
            // Logging into a log that misses pages would lose them in the
            // migration: the connection ends (see `set_log_base`).
            error!(device = self.dev.info.id, "cannot log: {why}");
            self.fatal = Some(format!("dirty log refused: {why}"));
            return false;
        }
        let map = match crate::transport::memory::memory_map(&mut self.regions, log.as_ref()) {
            Ok(m) => m,
            Err(e) => {
                error!(
                    device = self.dev.info.id,
                    "cannot switch dirty logging: {e}"
                );
                return false;
            }
        };
        if self.mem.replace(map).is_err() {
            return false;
        }
        self.pool.nudge_all();
        // A worker in the middle of a ring operation still writes through
        // the map it loaded before the switch: with logging turned on,
        // without marking. The frontend may read and clear the log as soon
        // as this switch is answered, and copy a page such a write then
        // changes: so the answer waits until every worker serving this
        // device has finished the operation it was in (`Barrier`: its
        // next one loads the new map, the command channel ordering the
        // `replace` above before that load).
        if !workers_caught_up(&self.pool, &self.vrings, &self.dev.info) {
            return false;
        }
        info!(
            device = self.dev.info.id,
            logging = log.is_some(),
            "memory map rebuilt"
        );
        true
    }

    /// SET_LOG_FD: the eventfd to signal when the log has a stopped
    /// queue's last writes; a descriptor that is not an eventfd is
    /// refused (logged) and the previous one kept.
    pub(crate) fn set_log_fd(&mut self, fd: Option<std::os::fd::OwnedFd>) {
        let Some(fd) = fd else {
            self.log_fd = None;
            return;
        };
        match PeerEventFd::adopt(
            std::fs::File::from(fd),
            crate::runtime::eventfd::FdRole::Log,
        ) {
            Ok(e) => self.log_fd = Some(e),
            Err(e) => {
                DeviceMetrics::bump(&self.dev.info.metrics.failed_messages);
                warn!(device = self.dev.info.id, "{e}");
            }
        }
    }

    /// Rebuilds the memory map if it logs and logging is off, or the
    /// other way round; false if it could not.
    pub(crate) fn sync_logging(&mut self) -> bool {
        let logged = crate::runtime::guest::logging(&self.mem.memory());
        logged == self.logging() || self.remap()
    }

    /// Vrings a frontend may set up.
    pub(crate) fn max_vrings(&self) -> usize {
        self.max_vrings
    }

    /// Vrings announced to the frontend (GET_QUEUE_NUM).
    pub(crate) fn queue_num(&self) -> usize {
        self.local + usize::from(self.dev.params.num_queues)
    }

    /// Runs `f` on the device's session with what of this session it may
    /// use.
    pub(crate) fn with_device<R>(
        &mut self,
        f: impl FnOnce(&mut dyn DeviceSession, &SessionCtx<'_>) -> R,
    ) -> R {
        let Session {
            device,
            mem,
            acked_features,
            pool,
            vrings,
            dev,
            backend_channel,
            ..
        } = self;
        let drain = || drain_requests(pool, vrings, &dev.info);
        let config_changed = || config_changed(backend_channel.as_ref(), &dev.info);
        let ctx = SessionCtx {
            mem,
            features: *acked_features,
            drain_requests: &drain,
            config_changed: &config_changed,
        };
        f(device.as_mut(), &ctx)
    }

    /// How request queues of this connection learn of new requests: the
    /// SQ doorbell when bit 42 was negotiated (the driver relies on it),
    /// else as the daemon's `--poll` option says.
    fn submission_source(&self) -> SubmissionSource {
        if self.has_feature(sqcq_protocol::VIRTIO_F_SQCQ_POLL) {
            SubmissionSource::Doorbell
        } else {
            match self.pool.options().ring {
                RingMode::Kick => SubmissionSource::Kick,
                RingMode::Ring | RingMode::Auto => SubmissionSource::RingPoll,
            }
        }
    }

    /// The vring `index`, created on demand up to the limit.
    pub(crate) fn vring(&mut self, index: usize) -> Option<&mut VringSetup> {
        if index >= self.max_vrings {
            return None;
        }
        while self.vrings.len() <= index {
            self.vrings.push(VringSetup::new());
        }
        self.vrings.get_mut(index)
    }

    fn ready(&self, index: usize) -> bool {
        let v = &self.vrings[index];
        v.size > 0
            && v.addrs.is_some()
            && v.kick.is_some()
            && v.enabled
            && !self.mappings.is_empty()
    }

    /// Starts or stops vring `index` to match its state.
    pub(crate) fn update(&mut self, index: usize) {
        if index >= self.vrings.len() {
            return;
        }
        let running = self.vrings[index].running != Running::No;
        let ready = self.ready(index);
        if ready && !running {
            self.start(index);
        } else if !ready && running {
            self.stop(index);
        }
    }

    fn ring_config(&self, index: usize) -> Option<RingConfig> {
        let v = &self.vrings[index];
        let (desc, avail, used) = v.addrs?;
        let [a0, a1, u0, u1] = v.base.to_le_bytes();
        let packed = self.packed();
        Some(RingConfig {
            size: v.size,
            desc,
            avail,
            used,
            next_avail: u16::from_le_bytes([a0, a1]),
            event_idx: self
                .has_feature(virtio_bindings::bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX),
            packed,
            next_used: if packed {
                u16::from_le_bytes([u0, u1])
            } else {
                0
            },
        })
    }

    fn start(&mut self, index: usize) {
        // The destination of a live migration (`--incoming`), or a source
        // whose migration failed, takes its storage back before serving;
        // while another daemon holds it, the queue does not start.
        if let Err(e) = self.dev.device.set_active(true) {
            error!(device = self.dev.info.id, vq = index, "cannot start: {e}");
            return;
        }
        if index < self.local {
            self.start_local(index);
            return;
        }
        let rq = u16::try_from(index - self.local).unwrap_or(u16::MAX);
        if let Some(w) = self.dev.placement.assigned(rq) {
            match self.start_on(index, w) {
                // A queue the guest set up wrong fails on any worker.
                Ok(()) | Err(StartFailure::Queue) => return,
                Err(StartFailure::Worker) => {
                    warn!(
                        device = self.dev.info.id,
                        rq, "worker {w} assigned but gone: round robin"
                    );
                }
            }
        }
        match self.pool.round_robin(rq) {
            Some(w) => {
                let _ = self.start_on(index, w);
            }
            None => error!(device = self.dev.info.id, rq, "cannot start: no worker"),
        }
    }

    fn start_local(&mut self, index: usize) {
        let Some(ring) = self.ring_config(index) else {
            return;
        };
        let v = &self.vrings[index];
        let clone = |fd: &Option<PeerEventFd>| fd.as_ref().and_then(|f| f.try_clone().ok());
        let Some(kick) = clone(&v.kick) else { return };
        let fds = LocalQueueFds {
            kick,
            call: clone(&v.call),
        };
        let vq = u16::try_from(index).unwrap_or(u16::MAX);
        match self.with_device(|d, ctx| d.start_local(ctx, index, &ring, fds)) {
            Ok(()) => self.vrings[index].running = Running::Control,
            Err(e) => error!(device = self.dev.info.id, vq, "cannot start: {e}"),
        }
    }

    /// Starts request vring `index` on `worker`.
    fn start_on(&mut self, index: usize, worker: usize) -> Result<(), StartFailure> {
        let Some(ring) = self.ring_config(index) else {
            return Err(StartFailure::Queue);
        };
        let v = &self.vrings[index];
        let clone = |fd: &Option<PeerEventFd>| fd.as_ref().and_then(|f| f.try_clone().ok());
        let Some(kick) = clone(&v.kick) else {
            return Err(StartFailure::Queue);
        };
        let (call, err) = (clone(&v.call), clone(&v.err));
        let vq = u16::try_from(index).unwrap_or(u16::MAX);
        let rq = u16::try_from(index - self.local).unwrap_or(u16::MAX);
        let source = self.submission_source();
        let start = QueueStart {
            key: QueueKey {
                device: self.dev.info.id,
                vq,
            },
            device: Arc::clone(&self.dev.info),
            mem: self.mem.clone(),
            ring,
            kick,
            call,
            err,
            source,
            spin: self.pool.spin_policy(source),
            max_in_flight: self.pool.options().max_in_flight,
            handler: self.device.request_handler(),
            tracking: self
                .inflight
                .as_ref()
                .and_then(|a| a.record(index, ring.size, ring.packed)),
        };
        let deadline = self.pool.deadline(QUEUE_STOP_TIMEOUT);
        let result = self.pool.call(
            worker,
            |reply| WorkerCommand::Start {
                start: Box::new(start),
                reply,
            },
            deadline,
        );
        match result {
            Ok(Ok(())) => {
                info!("device {} vq {vq} -> worker {worker}", self.dev.info.id);
                self.vrings[index].running = Running::Worker(worker);
                self.dev.placement.set_running(rq, Some(worker));
                Ok(())
            }
            Ok(Err(e)) => {
                error!(device = self.dev.info.id, vq, "cannot start: {e}");
                Err(StartFailure::Queue)
            }
            Err(e) => {
                error!(device = self.dev.info.id, vq, "cannot start: {e}");
                Err(StartFailure::Worker)
            }
        }
    }

    /// Moves every running request queue whose assigned worker is not the
    /// one serving it to that worker (VHOST_ATTACH_VRING_WORKER on a
    /// running queue): once the requests it holds completed and were
    /// published, the queue stops on its worker exactly as at
    /// GET_VRING_BASE, and starts on the other where it stopped. Requests
    /// the driver makes available meanwhile wait in the ring; a kick
    /// meanwhile stays in the kick eventfd, and the SQ doorbell is parked
    /// with NEED_WAKEUP (spec 8.3.2), so none is lost. A queue whose
    /// requests do not complete within [`MOVE_DRAIN_TIMEOUT`] stays where
    /// it is (nothing is abandoned), and so does one that cannot start on
    /// the other worker. Returns `(vq, from, to)` of each queue moved, or
    /// why it did not.
    pub(crate) fn rebalance(&mut self) -> Vec<MoveOutcome> {
        let mut moves = Vec::new();
        for index in self.local..self.vrings.len() {
            let Running::Worker(from) = self.vrings[index].running else {
                continue;
            };
            let rq = u16::try_from(index - self.local).unwrap_or(u16::MAX);
            match self.dev.placement.assigned(rq) {
                Some(to) if to != from && self.pool.exists(to) => {
                    moves.push(self.move_queue(index, from, to));
                }
                _ => {}
            }
        }
        moves
    }

    fn move_queue(&mut self, index: usize, from: usize, to: usize) -> MoveOutcome {
        let vq = u16::try_from(index).unwrap_or(u16::MAX);
        let rq = u16::try_from(index - self.local).unwrap_or(u16::MAX);
        let key = self.key(index);
        let deadline = self.pool.deadline(MOVE_DRAIN_TIMEOUT);
        let release = |reply| WorkerCommand::Release {
            key,
            deadline,
            reply,
        };
        let report = match self.pool.call(from, release, deadline + REPLY_MARGIN) {
            Ok(Some(Ok(report))) => report,
            Ok(Some(Err(left))) => return Err(MoveError::Busy { vq, from, left }),
            // Where it runs is not known: leave it as it is.
            Ok(None) => return Err(MoveError::NotThere { vq, worker: from }),
            Err(source) => {
                return Err(MoveError::Stop {
                    vq,
                    worker: from,
                    source,
                });
            }
        };
        let v = &mut self.vrings[index];
        v.base = report.base;
        v.running = Running::No;
        self.dev.placement.set_running(rq, None);
        if self.start_on(index, to).is_ok() {
            info!(
                device = self.dev.info.id,
                vq, "queue moved from worker {from} to worker {to}"
            );
            return Ok((vq, from, to));
        }
        if self.start_on(index, from).is_ok() {
            return Err(MoveError::Start { vq, from, to });
        }
        error!(
            device = self.dev.info.id,
            vq, "stopped for a move and could not start again"
        );
        Err(MoveError::Stopped { vq })
    }

    /// Stops vring `index` and records where it stopped.
    pub(crate) fn stop(&mut self, index: usize) {
        self.stop_queue(index, true);
    }

    /// Stops vring `index`; `signal_log`: tell the frontend through
    /// SET_LOG_FD's eventfd if logging (not for a move between workers,
    /// which the frontend does not see).
    fn stop_queue(&mut self, index: usize, signal_log: bool) {
        let vq = u16::try_from(index).unwrap_or(u16::MAX);
        let base = match self.vrings[index].running {
            Running::No => return,
            Running::Control => self.device.stop_local(index),
            Running::Worker(w) => {
                let key = self.key(index);
                // The worker waits for requests in flight until the
                // deadline, then cancels what is left and waits for those
                // completions (`ServedQueue::stop`): it answers once
                // nothing can touch the ring or the memory any more.
                let deadline = self.pool.deadline(self.pool.options().stop_timeout);
                let call = |reply| WorkerCommand::Stop {
                    key,
                    deadline,
                    reply,
                };
                match self
                    .pool
                    .call(w, call, deadline + CANCEL_GRACE + REPLY_MARGIN)
                {
                    Ok(Some(report)) => Some(report.base),
                    Ok(None) => None,
                    Err(WorkerGone::TimedOut(_)) => stop_failed(&self.dev.info, vq, w),
                    Err(e @ WorkerGone::Exited(_)) => {
                        // The thread and everything it served are gone.
                        error!(device = self.dev.info.id, vq, "cannot stop: {e}");
                        None
                    }
                }
            }
        };
        let v = &mut self.vrings[index];
        if let Some(base) = base {
            v.base = base;
        }
        if let Running::Worker(_) = v.running
            && let Some(rq) = index.checked_sub(self.local)
        {
            self.dev
                .placement
                .set_running(u16::try_from(rq).unwrap_or(u16::MAX), None);
        }
        v.running = Running::No;
        if signal_log
            && self.logging()
            && let Some(l) = &self.log_fd
        {
            let _ = l.signal();
        }
        // Every queue stopped while the frontend logs: the switch-over of
        // a live migration. Nothing of this device writes its storage any
        // more, so the destination may take it (its first start does).
        if signal_log
            && self.logging()
            && self.vrings.iter().all(|v| matches!(v.running, Running::No))
        {
            match self.dev.device.set_active(false) {
                Ok(()) => info!(
                    device = self.dev.info.id,
                    "device stopped while logging: storage released for the migration's destination"
                ),
                Err(e) => warn!(device = self.dev.info.id, "cannot release the storage: {e}"),
            }
        }
    }

    /// Passes a new call eventfd to wherever the vring runs.
    pub(crate) fn update_call(&mut self, index: usize) {
        let call = self.vrings[index]
            .call
            .as_ref()
            .and_then(|f| f.try_clone().ok());
        match self.vrings[index].running {
            Running::No => {}
            Running::Control => self.device.set_local_call(index, call),
            Running::Worker(w) => {
                let key = self.key(index);
                self.send(w, WorkerCommand::SetCall { key, call }, "call");
            }
        }
    }

    /// Passes a new error eventfd to the worker running the vring (the
    /// device's own queues have no error state to report).
    pub(crate) fn update_err(&mut self, index: usize) {
        if let Running::Worker(w) = self.vrings[index].running {
            let err = self.vrings[index]
                .err
                .as_ref()
                .and_then(|f| f.try_clone().ok());
            let key = self.key(index);
            self.send(w, WorkerCommand::SetErr { key, err }, "error");
        }
    }

    fn key(&self, index: usize) -> QueueKey {
        QueueKey {
            device: self.dev.info.id,
            vq: u16::try_from(index).unwrap_or(u16::MAX),
        }
    }

    fn send(&self, worker: usize, cmd: WorkerCommand, what: &str) {
        if let Err(e) = self.pool.send(worker, cmd) {
            warn!(
                device = self.dev.info.id,
                "cannot update the {what} fd: {e}"
            );
        }
    }

    /// Stops every vring and forgets the rings (RESET_DEVICE, RESET_OWNER,
    /// disconnect). Memory and protocol features are kept, and so are the
    /// error eventfds: QEMU sends SET_VRING_ERR once per connection, not
    /// at each start, and a ring that breaks after a device reset (every
    /// guest boot has one) must still be reported.
    pub(crate) fn reset_rings(&mut self) {
        for i in 0..self.vrings.len() {
            self.stop(i);
        }
        for v in &mut self.vrings {
            let err = v.err.take();
            *v = VringSetup {
                err,
                ..VringSetup::new()
            };
        }
        self.device.reset();
        self.acked_features = 0;
    }

    /// Unmaps the regions of replaced memory tables that nothing uses
    /// any more.
    pub(crate) fn release_retired(&mut self) {
        self.retired.retain(GuardedRegion::in_use);
    }

    /// Ends the connection: stops every queue, tells the device (for SCSI:
    /// the I_T nexus is gone), and unmaps guest memory. Returns the
    /// regions something still uses, for the caller to unmap later: no
    /// request of a stopped queue (a stop waits for every completion),
    /// but a map a worker that exited may have left referenced.
    pub fn teardown(&mut self) -> Vec<GuardedRegion> {
        self.reset_rings();
        self.backend_channel = None;
        // Every queue stopped and posted its final figures.
        self.pool.stats().write();
        self.device.disconnect();
        let _ = self.mem.replace(GuestMem::default());
        self.mappings.clear();
        self.retired.append(&mut self.regions);
        self.release_retired();
        info!(device = self.dev.info.id, "connection closed");
        let info = &self.dev.info;
        info.events
            .publish(Event::FrontendDisconnected { device: info.id });
        std::mem::take(&mut self.retired)
    }
}

/// A worker did not answer a stop: it still serves the queue, waiting
/// for backstore requests that neither complete nor cancel, and may
/// touch the ring, the doorbells and the guest memory when they do.
/// Spec 8.3.2 S5: GET_VRING_BASE must not be answered and the queue must
/// not start again while that may happen, and the memory those requests
/// write into must stay mapped. Waiting on would hang this device's
/// connection (and the frontend, which waits for the answer) for as
/// long as the backstore does; ending the process turns the stop into
/// a crash, which the frontend recovers from by reconnecting to a
/// restarted daemon (resubmitting from the in-flight area where it keeps
/// one), and which no kernel copy can outlive into reused memory.
fn stop_failed(info: &DeviceInfo, vq: u16, worker: usize) -> ! {
    error!(
        device = info.id,
        vq,
        "worker {worker} did not stop the queue: backstore requests neither complete nor \
         cancel; ending the process (vhost-user stop rule S5)"
    );
    std::process::abort()
}

/// Tells the frontend the configuration space changed, on `channel`;
/// whether it was told.
fn config_changed(channel: Option<&BackendChannel>, info: &DeviceInfo) -> bool {
    let Some(c) = channel else {
        DeviceMetrics::bump(&info.metrics.config_changes_lost);
        warn!(
            device = info.id,
            "configuration changed, but the frontend gave no backend channel \
             (VHOST_USER_PROTOCOL_F_BACKEND_REQ) to tell it"
        );
        return false;
    };
    match c.config_changed() {
        Ok(true) => {
            info!(
                device = info.id,
                "frontend told of the configuration change"
            );
            true
        }
        Ok(false) => {
            DeviceMetrics::bump(&info.metrics.config_changes_lost);
            warn!(
                device = info.id,
                "the frontend does not read its backend channel: configuration change not told"
            );
            false
        }
        Err(e) => {
            DeviceMetrics::bump(&info.metrics.config_changes_lost);
            warn!(device = info.id, "backend channel: {e}");
            false
        }
    }
}

/// Waits until every worker serving a queue of the device has finished
/// the ring operation it was in ([`WorkerCommand::Barrier`]); false if
/// one did not answer within [`QUEUE_STOP_TIMEOUT`].
fn workers_caught_up(pool: &WorkerPool, vrings: &[VringSetup], info: &DeviceInfo) -> bool {
    let deadline = pool.deadline(QUEUE_STOP_TIMEOUT);
    serving_workers(vrings).into_iter().all(|w| {
        let call = |reply| WorkerCommand::Barrier { reply };
        pool.call(w, call, deadline)
            .inspect_err(|e| error!(device = info.id, "memory map switch: {e}"))
            .is_ok()
    })
}

/// The workers serving a queue of the device, each once.
fn serving_workers(vrings: &[VringSetup]) -> Vec<usize> {
    let mut workers: Vec<usize> = vrings
        .iter()
        .filter_map(|v| match v.running {
            Running::Worker(w) => Some(w),
            _ => None,
        })
        .collect();
    workers.sort_unstable();
    workers.dedup();
    workers
}

/// Waits until every request of the device in flight now completed, on
/// every worker serving one of its queues, or [`QUEUE_STOP_TIMEOUT`]
/// passed; returns whether they all did.
fn drain_requests(pool: &WorkerPool, vrings: &[VringSetup], info: &DeviceInfo) -> bool {
    let workers = serving_workers(vrings);
    let device = info.id;
    let deadline = pool.deadline(QUEUE_STOP_TIMEOUT);
    let mut drained = true;
    for w in workers {
        let call = |reply| WorkerCommand::Drain { device, reply };
        if let Err(e) = pool.call(w, call, deadline) {
            error!(device = info.id, "drain: {e}");
            drained = false;
        }
    }
    drained
}
