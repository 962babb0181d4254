//! The worker pool: threads that serve request virtqueues.
//!
//! Each worker owns the queues assigned to it (their rings, eventfds,
//! backstore queues and in-flight requests) and waits in one epoll set for
//! their kick eventfds, their backstore completion descriptors and its own
//! wake eventfd. Control threads hand it work through a channel and the
//! wake eventfd: start, stop, a new call eventfd, a drain for a task
//! management function, a release for a move to another worker. A pool
//! serves every device of the daemon; which worker serves which queue is
//! explicit (`--queue-map`, or attached at run time) or round robin, and
//! logged. Workers are created and freed while the daemon runs.
//!
//! The loop also serves polled queues (see `poll`):
//! its `epoll_wait` timeout is the smallest [`ServedQueue::poll_timeout`],
//! so a queue that polls its SQ doorbell keeps the worker awake while it
//! spins and lets it sleep on the kick eventfd afterwards.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sqcq_protocol::yielder::Yielder;
use sqcq_protocol::{SpinConfig, SpinPolicy};
use thiserror::Error;
use tracing::{debug, error, info, warn};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::runtime::cpu::CpuWatch;
use crate::runtime::eventfd::PeerEventFd;
use crate::runtime::metrics::WorkerMetrics;
/// The bound of the pool's calls that stop or move queues, which callers
/// of [`WorkerPool::call`] use too.
pub use crate::runtime::options::QUEUE_STOP_TIMEOUT;
use crate::runtime::options::{PollOptions, RingMode, spin_config_ns};
use crate::runtime::pass;
use crate::runtime::queue::{
    QueueError, QueueKey, QueueStart, ServedQueue, StopReport, SubmissionSource,
};
use crate::runtime::stats::{StatsBoard, StatsTicker};
use crate::runtime::wakeup;

/// epoll token of a worker's wake eventfd.
const WAKE_TOKEN: u64 = u64::MAX;
/// Bits of an epoll token that name the source within a queue (0: kick,
/// 1 + n: completion descriptor of LUN n).
const SOURCE_BITS: u32 = 16;

/// A message to a worker.
#[derive(Debug)]
pub enum WorkerCommand {
    /// Serve a queue (processing its ring once right away).
    Start {
        /// The queue.
        start: Box<QueueStart>,
        /// Whether it started.
        reply: SyncSender<Result<(), QueueError>>,
    },
    /// Stop serving a queue after its in-flight requests completed (past
    /// `deadline` they are cancelled, and their completions waited for:
    /// see `ServedQueue::stop`).
    Stop {
        /// The queue.
        key: QueueKey,
        /// When to stop waiting for requests in flight.
        deadline: Instant,
        /// Where it stopped (`None`: not served here).
        reply: SyncSender<Option<StopReport>>,
    },
    /// Stop serving a queue to hand it to another worker, if its requests
    /// in flight complete by `deadline`; if not, go on serving it and
    /// answer how many are left (a move never abandons a request).
    Release {
        /// The queue.
        key: QueueKey,
        /// How long to wait for requests in flight.
        deadline: Instant,
        /// Where it stopped (`None`: not served here; `Err`: requests
        /// left, still served here).
        reply: SyncSender<Option<Result<StopReport, usize>>>,
    },
    /// Replace a running queue's call eventfd.
    SetCall {
        /// The queue.
        key: QueueKey,
        /// The new eventfd.
        call: Option<PeerEventFd>,
    },
    /// Replace a running queue's error eventfd.
    SetErr {
        /// The queue.
        key: QueueKey,
        /// The new eventfd.
        err: Option<PeerEventFd>,
    },
    /// Answer once every request of `device` in flight now has completed.
    Drain {
        /// The device.
        device: u32,
        /// Signalled when drained.
        reply: SyncSender<()>,
    },
    /// The request handlers of every running queue of `device` take the
    /// device's change (for SCSI, its new LUN snapshot after a LUN was
    /// added or removed; see `RequestHandler::refresh`), between two
    /// passes over their rings.
    Refresh {
        /// The device.
        device: u32,
        /// The first queue that could not take it (that queue keeps its
        /// previous state).
        reply: SyncSender<Result<(), QueueError>>,
    },
    /// Arm the running request queues of `device` (only vring `vq` if
    /// given) to break at their next request, as for a nonsense doorbell:
    /// fault injection.
    #[cfg(feature = "fault-injection")]
    Break {
        /// The device.
        device: u32,
        /// The vring, or every one.
        vq: Option<u16>,
        /// The vrings armed here.
        reply: SyncSender<Vec<u16>>,
    },
    /// Answer at once. The worker handles commands only between two ring
    /// operations, and each operation loads the device's memory map
    /// anew when it changed (`MemoryView::take`): once it answered, it
    /// holds no map older than the one current when this was sent (a
    /// dirty-logging switch waits for that, see `Session::remap`).
    Barrier {
        /// Answered at once.
        reply: SyncSender<()>,
    },
    /// End the thread if it serves no queue; otherwise answer how many
    /// it serves and go on (freeing a worker).
    Retire {
        /// `Ok` when the thread ends.
        reply: SyncSender<Result<(), usize>>,
    },
    /// Stop every queue (waiting for requests in flight until `deadline`)
    /// and end the thread.
    Exit {
        /// When to stop waiting for requests in flight.
        deadline: Instant,
    },
}

/// A command could not be answered.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum WorkerGone {
    /// The worker thread is gone (it panicked or exited).
    #[error("worker {0} is not running")]
    Exited(usize),
    /// It did not answer before the deadline.
    #[error("worker {0} did not answer in time")]
    TimedOut(usize),
}

struct WorkerHandle {
    tx: Sender<WorkerCommand>,
    wake: EventFd,
    /// The CPU it is bound to.
    cpu: Option<usize>,
    /// Being freed: no queue may start on it.
    closing: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl WorkerHandle {
    fn join(&self) {
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(t) = thread
            && t.join().is_err()
        {
            error!("a worker thread panicked");
        }
    }
}

/// Most workers a pool runs at once.
pub const MAX_WORKERS: usize = 256;

/// A worker could not be created or freed.
#[derive(Debug, Error)]
pub enum PoolError {
    /// No worker has this number.
    #[error("no worker {0}")]
    NoWorker(usize),
    /// The worker still serves queues (attach them elsewhere first).
    #[error("worker {worker} still serves {queues} queue(s)")]
    Busy {
        /// The worker.
        worker: usize,
        /// How many queues it serves.
        queues: usize,
    },
    /// The pool keeps at least one worker.
    #[error("worker {0} is the last one")]
    Last(usize),
    /// [`MAX_WORKERS`] run already.
    #[error("{MAX_WORKERS} workers run already")]
    Full,
    /// A CPU this process may not run on.
    #[error("CPU {0} is not one this process may run on")]
    BadCpu(usize),
    /// The worker did not answer.
    #[error(transparent)]
    Gone(#[from] WorkerGone),
    /// The thread or its eventfds could not be created.
    #[error("cannot start a worker")]
    Io(#[from] io::Error),
}

/// A worker as [`WorkerPool::list`] shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerInfo {
    /// Its number.
    pub id: usize,
    /// The CPU it is bound to.
    pub cpu: Option<usize>,
}

/// The pool of worker threads shared by every device of a daemon.
///
/// Workers are numbered; [`WorkerPool::create`] and [`WorkerPool::free`]
/// add and remove them while the daemon runs (the multi-worker seed's
/// VHOST_NEW_WORKER and VHOST_FREE_WORKER). The table is locked only on
/// the control path (starting and stopping queues, run-time changes);
/// the workers themselves never touch it.
pub struct WorkerPool {
    workers: RwLock<Vec<Option<Arc<WorkerHandle>>>>,
    options: PollOptions,
    /// What waking a worker costs here, if measured
    /// ([`PollOptions::calibrates`]).
    wakeup: Option<Duration>,
    stats: Arc<StatsBoard>,
    /// The CPUs for backstore completion work (`--completion-cpus`).
    steer: Option<Vec<usize>>,
    /// Set when the daemon stops: no wait goes past it.
    shutdown_by: OnceLock<Instant>,
}

impl std::fmt::Debug for WorkerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerPool")
            .field("workers", &self.len())
            .finish()
    }
}

/// Measures the wakeup cost (the floor of busy queues' spin windows, and
/// `--poll auto`'s bound) and logs it with the bound; `None` (the
/// default windows) if it cannot be measured.
fn calibrate(options: &PollOptions) -> Option<Duration> {
    match wakeup::measure(options.cpus.first().copied()) {
        Ok(cost) => {
            info!(
                wakeup_us = cost.as_micros(),
                spin_bound_us = wakeup::auto_spin_bound(cost).as_micros(),
                "measured the wakeup cost: busy polled queues spin at least that, ring-polled ones in --poll auto at most the bound"
            );
            Some(cost)
        }
        Err(e) => {
            warn!(error = %e, "cannot measure the wakeup cost: ring-polled queues spin within the default bounds");
            None
        }
    }
}

/// The spin window of a queue that learns of requests from `source`:
/// `--spin-us` if given; else, with a measured `wakeup` cost, a window
/// never shorter than that cost while the queue is busy
/// (`SpinConfig::floor_ns`), within the default bounds, and for a
/// ring-polled queue in `--poll auto` from the default minimum up to
/// [`wakeup::auto_spin_bound`], with gaps that end in a wakeup counted
/// [`wakeup::auto_wake_credit`] shorter (`SpinConfig::wake_ns`); without
/// one, the default.
fn queue_spin_config(
    options: &PollOptions,
    wakeup: Option<Duration>,
    source: SubmissionSource,
) -> SpinConfig {
    if let Some(c) = options.spin {
        return c;
    }
    let Some(w) = wakeup else {
        return SpinConfig::default();
    };
    let floor_ns = pass::nanos(w);
    if source == SubmissionSource::RingPoll && options.ring == RingMode::Auto {
        let bound = pass::nanos(wakeup::auto_spin_bound(w));
        return SpinConfig {
            wake_ns: pass::nanos(wakeup::auto_wake_credit(w)),
            floor_ns,
            ..spin_config_ns(SpinConfig::default().min_ns, bound)
        };
    }
    SpinConfig {
        floor_ns,
        ..SpinConfig::default()
    }
}

impl WorkerPool {
    /// Starts `n` worker threads (numbered from 0), bound to CPUs and
    /// reporting statistics as `options` say. Unless nothing polls or
    /// `--spin-us` sets the windows ([`PollOptions::calibrates`]), first
    /// measures what a wakeup costs, before any worker runs.
    pub fn new(n: usize, options: PollOptions) -> io::Result<Self> {
        // The stall guard's watchdog, before any worker.
        crate::runtime::stall::install()?;
        let wakeup = options.calibrates().then(|| calibrate(&options)).flatten();
        let stats = Arc::new(StatsBoard::new(
            options.stats_interval,
            options.stats_file.clone(),
        ));
        let steer = steering(&options.completion_cpus);
        let pool = WorkerPool {
            workers: RwLock::new(Vec::with_capacity(n)),
            options,
            wakeup,
            stats,
            steer,
            shutdown_by: OnceLock::new(),
        };
        for id in 0..n {
            let cpu = pool.options.cpus.get(id).copied();
            let handle = pool.spawn(id, cpu)?;
            pool.write().push(Some(handle));
        }
        Ok(pool)
    }

    fn spawn(&self, id: usize, cpu: Option<usize>) -> io::Result<Arc<WorkerHandle>> {
        let (board, steer) = (Arc::clone(&self.stats), self.steer.clone());
        let (tx, rx) = mpsc::channel();
        let wake = EventFd::new(EFD_NONBLOCK)?;
        let (epoll, worker_wake) = Worker::epoll(wake.try_clone()?)?;
        let thread = std::thread::Builder::new()
            .name(format!("sqcq-worker{id}"))
            .spawn(move || {
                // Built on its own thread: queues hold raw iovecs and
                // never leave it.
                Worker {
                    id,
                    epoll,
                    wake: worker_wake,
                    rx,
                    queues: Vec::new(),
                    drains: Vec::new(),
                    cpu,
                    steer,
                    board,
                    ticker: StatsTicker::default(),
                }
                .run()
            })?;
        Ok(Arc::new(WorkerHandle {
            tx,
            wake,
            cpu,
            closing: AtomicBool::new(false),
            thread: Mutex::new(Some(thread)),
        }))
    }

    fn read(&self) -> RwLockReadGuard<'_, Vec<Option<Arc<WorkerHandle>>>> {
        // Plain data: a panic while holding the lock leaves it consistent.
        self.workers.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Vec<Option<Arc<WorkerHandle>>>> {
        self.workers.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn handle(&self, w: usize) -> Option<Arc<WorkerHandle>> {
        self.read().get(w).cloned().flatten()
    }

    /// Starts a worker (bound to `cpu` if given) under the lowest free
    /// number, and returns that number.
    /// Without `cpu`, it is bound as a worker of that number is at start
    /// (`--poll-cpus`).
    pub fn create(&self, cpu: Option<usize>) -> Result<usize, PoolError> {
        if let Some(c) = cpu {
            let allowed = crate::runtime::cpu::allowed_cpus()?;
            if !allowed.contains(&c) {
                return Err(PoolError::BadCpu(c));
            }
        }
        let mut workers = self.write();
        let id = workers
            .iter()
            .position(Option::is_none)
            .unwrap_or(workers.len());
        if id >= MAX_WORKERS {
            return Err(PoolError::Full);
        }
        let cpu = cpu.or_else(|| self.options.cpus.get(id).copied());
        let handle = self.spawn(id, cpu)?;
        if id == workers.len() {
            workers.push(Some(handle));
        } else {
            workers[id] = Some(handle);
        }
        match cpu {
            Some(cpu) => info!(worker = id, cpu, "worker created"),
            None => info!(worker = id, "worker created (unbound)"),
        }
        Ok(id)
    }

    /// Ends worker `w` if it serves no queue (VHOST_FREE_WORKER's rule:
    /// a worker with attached queues is not freed). The last worker is
    /// never freed.
    pub fn free(&self, w: usize) -> Result<(), PoolError> {
        let handle = {
            let workers = self.write();
            let h = workers
                .get(w)
                .cloned()
                .flatten()
                .filter(|h| !h.closing.load(Ordering::Relaxed))
                .ok_or(PoolError::NoWorker(w))?;
            let others = workers
                .iter()
                .flatten()
                .filter(|o| !Arc::ptr_eq(o, &h) && !o.closing.load(Ordering::Relaxed))
                .count();
            if others == 0 {
                return Err(PoolError::Last(w));
            }
            // Under the write lock: from here no start is sent to it
            // ([`Self::send`]); one sent before is in its channel ahead
            // of the retirement, which then finds the queue.
            h.closing.store(true, Ordering::Relaxed);
            h
        };
        let deadline = self.deadline(QUEUE_STOP_TIMEOUT);
        match self.call(w, |reply| WorkerCommand::Retire { reply }, deadline) {
            Ok(Ok(())) => {
                handle.join();
                let mut workers = self.write();
                if workers
                    .get(w)
                    .and_then(Option::as_ref)
                    .is_some_and(|h| Arc::ptr_eq(h, &handle))
                {
                    workers[w] = None;
                }
                info!(worker = w, "worker freed");
                Ok(())
            }
            Ok(Err(queues)) => {
                handle.closing.store(false, Ordering::Relaxed);
                Err(PoolError::Busy { worker: w, queues })
            }
            Err(e) => {
                handle.closing.store(false, Ordering::Relaxed);
                Err(e.into())
            }
        }
    }

    /// The running workers, by number.
    pub fn list(&self) -> Vec<WorkerInfo> {
        self.read()
            .iter()
            .enumerate()
            .filter_map(|(id, h)| {
                let h = h.as_ref()?;
                (!h.closing.load(Ordering::Relaxed)).then_some(WorkerInfo { id, cpu: h.cpu })
            })
            .collect()
    }

    /// Whether worker `w` runs (and takes queues).
    pub fn exists(&self, w: usize) -> bool {
        self.handle(w)
            .is_some_and(|h| !h.closing.load(Ordering::Relaxed))
    }

    /// The worker of request queue `rq` when nothing assigns one: round
    /// robin over the running workers in number order.
    pub fn round_robin(&self, rq: u16) -> Option<usize> {
        let live = self.list();
        if live.is_empty() {
            return None;
        }
        Some(live[usize::from(rq) % live.len()].id)
    }

    /// The daemon's poll options.
    pub fn options(&self) -> &PollOptions {
        &self.options
    }

    /// What waking a worker costs on this machine, if it was measured
    /// ([`PollOptions::calibrates`]).
    pub fn wakeup_cost(&self) -> Option<Duration> {
        self.wakeup
    }

    /// The spin bound of ring-polled queues that follows from the
    /// measured wakeup cost, if it was measured.
    pub fn auto_spin_bound(&self) -> Option<Duration> {
        self.wakeup.map(wakeup::auto_spin_bound)
    }

    /// The adaptive spin window of a new queue that learns of requests
    /// from `source` (see [`queue_spin_config`]).
    pub fn spin_policy(&self, source: SubmissionSource) -> SpinPolicy {
        // Checked by `PollOptions::validate`; an unchecked bad one falls
        // back.
        SpinPolicy::new(queue_spin_config(&self.options, self.wakeup, source)).unwrap_or_default()
    }

    /// Every queue's latest statistics.
    pub fn stats(&self) -> &Arc<StatsBoard> {
        &self.stats
    }

    /// Wakes every worker without a command: a polling worker then looks
    /// at the memory map again (after SET_MEM_TABLE) before it sleeps.
    pub fn nudge_all(&self) {
        for h in self.read().iter().flatten() {
            let _ = h.wake.write(1);
        }
    }

    /// Number of running workers.
    pub fn len(&self) -> usize {
        self.list().len()
    }

    /// Whether the pool has no worker.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The numbers of every worker thread, including one being freed
    /// (for commands that concern every queue of a device).
    pub fn ids(&self) -> Vec<usize> {
        self.read()
            .iter()
            .enumerate()
            .filter_map(|(id, h)| h.as_ref().map(|_| id))
            .collect()
    }

    /// Sends a command to worker `w` and wakes it. A worker being freed
    /// takes no new queue: the check and the send happen under the table's
    /// read lock, and [`Self::free`] marks the worker under its write
    /// lock, so a start is either refused here or queued before the
    /// worker's retirement (which then finds the queue and refuses).
    pub fn send(&self, w: usize, cmd: WorkerCommand) -> Result<(), WorkerGone> {
        let workers = self.read();
        let h = workers
            .get(w)
            .and_then(Option::as_ref)
            .ok_or(WorkerGone::Exited(w))?;
        if matches!(cmd, WorkerCommand::Start { .. }) && h.closing.load(Ordering::Relaxed) {
            return Err(WorkerGone::Exited(w));
        }
        h.tx.send(cmd).map_err(|_| WorkerGone::Exited(w))?;
        h.wake.write(1).map_err(|_| WorkerGone::Exited(w))
    }

    /// Sends a command with a reply channel and waits for the reply until
    /// `deadline`.
    pub fn call<T>(
        &self,
        w: usize,
        make: impl FnOnce(SyncSender<T>) -> WorkerCommand,
        deadline: Instant,
    ) -> Result<T, WorkerGone> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.send(w, make(tx))?;
        let wait = deadline.saturating_duration_since(Instant::now());
        rx.recv_timeout(wait).map_err(|e| match e {
            mpsc::RecvTimeoutError::Timeout => WorkerGone::TimedOut(w),
            mpsc::RecvTimeoutError::Disconnected => WorkerGone::Exited(w),
        })
    }

    /// `timeout` from now, but not past the shutdown deadline.
    pub fn deadline(&self, timeout: Duration) -> Instant {
        let d = Instant::now() + timeout;
        self.shutdown_by.get().map_or(d, |&s| d.min(s))
    }

    /// From now on nothing waits past `now + grace` (see
    /// [`crate::Daemon::shutdown`]).
    pub fn begin_shutdown(&self, grace: Duration) {
        let _ = self.shutdown_by.set(Instant::now() + grace);
    }

    /// Stops every worker (each stops its queues first) and joins them.
    pub fn shutdown(&self) {
        let deadline = self.deadline(QUEUE_STOP_TIMEOUT);
        for w in self.ids() {
            let _ = self.send(w, WorkerCommand::Exit { deadline });
        }
        let handles: Vec<_> = self.read().iter().flatten().cloned().collect();
        for h in handles {
            h.join();
        }
    }
}

struct Worker {
    id: usize,
    epoll: Epoll,
    wake: EventFd,
    rx: Receiver<WorkerCommand>,
    queues: Vec<Option<ServedQueue>>,
    drains: Vec<(u32, SyncSender<()>)>,
    /// The CPU this worker is bound to.
    cpu: Option<usize>,
    /// The CPUs for backstore completion work (`--completion-cpus`).
    steer: Option<Vec<usize>>,
    board: Arc<StatsBoard>,
    ticker: StatsTicker,
}

/// The CPUs of `asked` (`--completion-cpus`) the daemon may run on, for
/// backstore completion work; `None` when none were asked for, or none of
/// them is allowed (logged).
///
/// Not steering is the default: io-wq threads then wake next to the
/// worker that punted to them, a context switch on its CPU (the worker
/// yields while another thread wants the CPU). Steered to a CPU that
/// something else keeps busy (the vCPUs, or on this 2-CPU machine the
/// benchmark's initiator), every punted request waits for a cross-CPU
/// wakeup (docs/benchmarks.md, "A real backstore", has the figures).
fn steering(asked: &[usize]) -> Option<Vec<usize>> {
    if asked.is_empty() {
        return None;
    }
    let allowed = match crate::runtime::cpu::allowed_cpus() {
        Ok(a) => a,
        Err(e) => {
            warn!("cannot read the CPU affinity: backstore completion work not steered: {e}");
            return None;
        }
    };
    let cpus: Vec<usize> = asked
        .iter()
        .copied()
        .filter(|c| allowed.contains(c))
        .collect();
    if cpus.is_empty() {
        warn!(
            "--completion-cpus {asked:?}: none of them is among the daemon's CPUs {allowed:?}: backstore completion work is not steered"
        );
        return None;
    }
    info!("backstore completion work steered to CPUs {cpus:?}");
    Some(cpus)
}

/// Milliseconds for `epoll_wait`, rounded up so a deadline is not missed
/// by a fraction of a millisecond (and then spun for).
fn millis_ceil(d: std::time::Duration) -> i32 {
    i32::try_from(d.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
}

fn token(slot: usize, source: usize) -> u64 {
    ((slot as u64) << SOURCE_BITS) | source as u64
}

impl Worker {
    /// The epoll set of a new worker, watching its wake eventfd.
    fn epoll(wake: EventFd) -> io::Result<(Epoll, EventFd)> {
        let epoll = Epoll::new()?;
        epoll.ctl(
            ControlOperation::Add,
            wake.as_raw_fd(),
            EpollEvent::new(EventSet::IN, WAKE_TOKEN),
        )?;
        Ok((epoll, wake))
    }

    fn run(mut self) {
        // Writes to frontend eventfds on this thread are bounded.
        let _stall = match crate::runtime::stall::register() {
            Ok(r) => Some(r),
            Err(e) => {
                error!(worker = self.id, "stall guard: {e}");
                None
            }
        };
        if let Some(cpu) = self.cpu {
            match crate::runtime::cpu::bind_current_thread(cpu) {
                Ok(()) => info!(worker = self.id, "poll thread bound to cpu{cpu}"),
                Err(e) => error!(worker = self.id, "cannot bind to cpu{cpu}: {e}"),
            }
        }
        // This thread's figures, and its pass clock (`pass`).
        let figures = self.board.enter_worker(self.id);
        // Watched even if binding failed: it binds once the CPU is there.
        let mut watch = self.cpu.map(|cpu| CpuWatch::new(cpu, pass::now()));
        let mut events = vec![EpollEvent::default(); 64];
        // When and how the poll loop gives the CPU away (`poll::spin`):
        // the driver feeding a queue may be a reactor that never yields.
        let mut yielder = Yielder::handing_over();
        loop {
            let stats = self.ticker.timeout(&self.board);
            let timeout = self
                .queues
                .iter()
                .flatten()
                .filter_map(ServedQueue::poll_timeout)
                .chain(stats)
                .chain(watch.as_ref().map(|w| w.timeout(pass::now())))
                .min()
                .map_or(-1, millis_ceil);
            let n = match self.epoll.wait(timeout, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    error!(worker = self.id, "epoll_wait failed: {e}");
                    break;
                }
            };
            figures.woke();
            for ev in &events[..n] {
                let t = ev.data();
                if t == WAKE_TOKEN {
                    let _ = self.wake.read();
                    if !self.handle_commands() {
                        return;
                    }
                    continue;
                }
                let slot = usize::try_from(t >> SOURCE_BITS).unwrap_or(usize::MAX);
                let source = usize::try_from(t & ((1 << SOURCE_BITS) - 1)).unwrap_or(0);
                let hangup = ev
                    .event_set()
                    .intersects(EventSet::HANG_UP | EventSet::ERROR);
                if let Some(q) = self.queues.get_mut(slot).and_then(Option::as_mut) {
                    match source {
                        // An eventfd never hangs up; whatever this is, it
                        // would be reported again at once: stop watching it.
                        0 if hangup => {
                            let _ = self.epoll.ctl(
                                ControlOperation::Delete,
                                q.kick_fd(),
                                EpollEvent::default(),
                            );
                            q.kick_failed();
                        }
                        0 => q.on_kick(),
                        n => q.on_completion(n - 1),
                    }
                }
            }
            for q in self.queues.iter_mut().flatten() {
                q.pass();
            }
            self.check_drains();
            crate::runtime::poll::spin(&mut self.queues, &mut yielder);
            figures.yielded(&yielder);
            if self.ticker.due(&self.board) {
                let served = self.queues.iter_mut().flatten();
                let snapshots: Vec<_> = served
                    .filter_map(|q| {
                        q.flush_poll_figures();
                        q.ring().metrics()?.snapshot(q.key().device, q.key().vq)
                    })
                    .collect();
                self.ticker
                    .tick(self.id, &self.board, snapshots.into_iter());
            }
            if let Some(w) = watch.as_mut() {
                self.watch_cpu(w, &figures);
            }
        }
        self.stop_all(Instant::now() + QUEUE_STOP_TIMEOUT);
    }

    /// Checks, once per [`crate::runtime::cpu::WATCH_INTERVAL`], that the
    /// thread still runs on its CPU, binds it back when it can, and
    /// reports what changed.
    fn watch_cpu(&self, watch: &mut CpuWatch, figures: &WorkerMetrics) {
        use crate::runtime::cpu::{CpuChange, allowed_cpus, bind_current_thread};
        let cpu = watch.cpu();
        match watch.check(pass::now(), allowed_cpus, bind_current_thread) {
            None => return,
            Some(CpuChange::Displaced { allowed }) => warn!(
                worker = self.id,
                "poll thread moved off cpu{cpu} by the kernel (the CPU went offline or left \
                 the daemon's cpuset): serving on CPUs {allowed:?} until it is back"
            ),
            Some(CpuChange::Back) => info!(worker = self.id, "poll thread back on cpu{cpu}"),
            Some(CpuChange::Rebound { allowed }) => {
                warn!(
                    worker = self.id,
                    "poll thread had been moved off cpu{cpu} (to CPUs {allowed:?}) and is \
                     bound to it again"
                );
                figures.cpu_moved_and_back();
            }
        }
        figures.cpu_moved(watch.displaced());
    }

    /// Handles every queued command; returns false on Exit.
    fn handle_commands(&mut self) -> bool {
        while let Ok(cmd) = self.rx.try_recv() {
            match cmd {
                WorkerCommand::Start { start, reply } => {
                    let result = self.start(*start);
                    let _ = reply.send(result);
                }
                WorkerCommand::Stop {
                    key,
                    deadline,
                    reply,
                } => {
                    let _ = reply.send(self.stop(key, deadline));
                }
                WorkerCommand::Release {
                    key,
                    deadline,
                    reply,
                } => {
                    let _ = reply.send(self.release(key, deadline));
                }
                WorkerCommand::SetCall { key, call } => {
                    if let Some(q) = self.find(key).and_then(|s| self.queues[s].as_mut()) {
                        q.set_call(call);
                    }
                }
                WorkerCommand::SetErr { key, err } => {
                    if let Some(q) = self.find(key).and_then(|s| self.queues[s].as_mut()) {
                        q.set_err(err);
                    }
                }
                WorkerCommand::Drain { device, reply } => {
                    for q in self.queues.iter_mut().flatten() {
                        if q.key().device == device {
                            q.begin_drain();
                        }
                    }
                    self.drains.push((device, reply));
                    self.check_drains();
                }
                WorkerCommand::Refresh { device, reply } => {
                    let _ = reply.send(self.refresh(device));
                }
                #[cfg(feature = "fault-injection")]
                WorkerCommand::Break { device, vq, reply } => {
                    let broken = self
                        .queues
                        .iter_mut()
                        .flatten()
                        .filter(|q| q.key().device == device && vq.is_none_or(|v| v == q.key().vq))
                        .filter_map(|q| q.arm_break().then_some(q.key().vq))
                        .collect();
                    let _ = reply.send(broken);
                }
                WorkerCommand::Retire { reply } => {
                    let served = self.queues.iter().flatten().count();
                    if served == 0 {
                        let _ = reply.send(Ok(()));
                        return false;
                    }
                    let _ = reply.send(Err(served));
                }
                WorkerCommand::Barrier { reply } => {
                    let _ = reply.send(());
                }
                WorkerCommand::Exit { deadline } => {
                    self.stop_all(deadline);
                    return false;
                }
            }
        }
        true
    }

    fn find(&self, key: QueueKey) -> Option<usize> {
        self.queues
            .iter()
            .position(|q| q.as_ref().is_some_and(|q| q.key() == key))
    }

    fn start(&mut self, start: QueueStart) -> Result<(), QueueError> {
        let key = start.key;
        let mut q = ServedQueue::start(start)?;
        if let Some(cpus) = &self.steer {
            q.steer_completions(cpus);
        }
        let slot = match self.queues.iter().position(Option::is_none) {
            Some(s) => s,
            None => {
                self.queues.push(None);
                self.queues.len() - 1
            }
        };
        self.watch(slot, &q);
        debug!(
            worker = self.id,
            device = key.device,
            vq = key.vq,
            "queue started"
        );
        // A kick that came before the queue started (before its kick fd
        // was set or it was enabled) is not lost: look at the ring now.
        q.process();
        self.queues[slot] = Some(q);
        Ok(())
    }

    fn stop(&mut self, key: QueueKey, deadline: Instant) -> Option<StopReport> {
        let slot = self.find(key)?;
        let q = self.queues[slot].take()?;
        self.unwatch(&q);
        let report = q.stop(deadline);
        self.check_drains();
        Some(report)
    }

    fn release(&mut self, key: QueueKey, deadline: Instant) -> Option<Result<StopReport, usize>> {
        let slot = self.find(key)?;
        let mut q = self.queues[slot].take()?;
        self.unwatch(&q);
        let left = q.drain_until(deadline);
        if left == 0 {
            // Nothing in flight: the stop does not wait.
            let report = q.stop(Instant::now());
            self.check_drains();
            return Some(Ok(report));
        }
        // Kicks and completions that came meanwhile are still pending on
        // their descriptors (level-triggered).
        self.watch(slot, &q);
        self.queues[slot] = Some(q);
        Some(Err(left))
    }

    fn watch(&self, slot: usize, q: &ServedQueue) {
        let mut fds: Vec<(RawFd, u64)> = vec![(q.kick_fd(), token(slot, 0))];
        fds.extend(
            q.completion_fds()
                .into_iter()
                .map(|(i, fd)| (fd, token(slot, i + 1))),
        );
        for (fd, t) in &fds {
            if let Err(e) = self.epoll.ctl(
                ControlOperation::Add,
                *fd,
                EpollEvent::new(EventSet::IN, *t),
            ) {
                error!(
                    worker = self.id,
                    vq = q.key().vq,
                    "cannot watch fd {fd}: {e}"
                );
            }
        }
    }

    /// Every queue of `device` takes the device's change (their
    /// completion descriptors may change, so they are watched anew).
    fn refresh(&mut self, device: u32) -> Result<(), QueueError> {
        let mut result = Ok(());
        for slot in 0..self.queues.len() {
            let Some(mut q) = self.queues[slot].take_if(|q| q.key().device == device) else {
                continue;
            };
            self.unwatch(&q);
            if let Err(e) = q.refresh() {
                error!(worker = self.id, vq = q.key().vq, "device change: {e}");
                result = Err(e);
            }
            self.watch(slot, &q);
            self.queues[slot] = Some(q);
        }
        result
    }

    fn unwatch(&self, q: &ServedQueue) {
        let fds =
            std::iter::once(q.kick_fd()).chain(q.completion_fds().into_iter().map(|(_, fd)| fd));
        for fd in fds {
            let _ = self
                .epoll
                .ctl(ControlOperation::Delete, fd, EpollEvent::default());
        }
    }

    fn stop_all(&mut self, deadline: Instant) {
        for slot in 0..self.queues.len() {
            if let Some(q) = self.queues[slot].take() {
                self.unwatch(&q);
                q.stop(deadline);
            }
        }
        self.check_drains();
    }

    fn check_drains(&mut self) {
        if self.drains.is_empty() {
            return;
        }
        let queues = &self.queues;
        self.drains.retain(|(device, reply)| {
            let done = queues
                .iter()
                .flatten()
                .filter(|q| q.key().device == *device)
                .all(ServedQueue::drained);
            if done {
                let _ = reply.send(());
            }
            !done
        });
    }
}

#[cfg(test)]
mod tests {
    use super::queue_spin_config as spin_config;
    use super::*;
    use crate::runtime::options::{MAX_CPU, spin_config as spin_us};

    #[test]
    fn completion_work_is_steered_only_where_asked_and_allowed() {
        assert_eq!(steering(&[]), None, "not steered by default");
        let allowed = crate::runtime::cpu::allowed_cpus().unwrap();
        let first = allowed[0];
        assert_eq!(steering(&[first, MAX_CPU]), Some(vec![first]));
        assert_eq!(steering(&[MAX_CPU]), None, "no allowed CPU asked for");
    }

    #[test]
    fn the_measured_wakeup_bounds_only_ring_polled_queues() {
        let auto = PollOptions::default();
        assert_eq!(auto.ring, RingMode::Auto, "the default");
        let w = Some(Duration::from_micros(20));
        let ring = spin_config(&auto, w, SubmissionSource::RingPoll);
        assert_eq!(
            (ring.min_ns, ring.max_ns, ring.wake_ns, ring.floor_ns),
            (1_000, 40_000, 10_000, 20_000)
        );
        SpinPolicy::new(ring).unwrap();
        let d = SpinConfig::default();
        let floored = SpinConfig {
            floor_ns: 20_000,
            ..d
        };
        assert_eq!(
            spin_config(&auto, w, SubmissionSource::Doorbell),
            floored,
            "bit 42: the default bounds, the floor"
        );
        assert_eq!(
            spin_config(&auto, None, SubmissionSource::RingPoll),
            d,
            "not measured"
        );
        let ring_mode = PollOptions {
            ring: RingMode::Ring,
            ..PollOptions::default()
        };
        assert_eq!(
            spin_config(&ring_mode, w, SubmissionSource::RingPoll),
            floored,
            "--poll ring: the default bounds, the floor"
        );
        let kick = PollOptions {
            ring: RingMode::Kick,
            ..PollOptions::default()
        };
        assert!(kick.calibrates(), "bit 42 offered: its queues poll");
        let classic = PollOptions {
            offer_sqcq: false,
            ..kick.clone()
        };
        assert!(!classic.calibrates(), "nothing polls");
        assert!(ring_mode.calibrates() && auto.calibrates());
        let explicit = PollOptions {
            spin: Some(spin_us(5, 7)),
            ..PollOptions::default()
        };
        for source in [SubmissionSource::RingPoll, SubmissionSource::Doorbell] {
            assert_eq!(spin_config(&explicit, w, source), spin_us(5, 7));
        }
    }
}
