//! How a queue tells the device about new requests and learns about
//! completions: the notification mode, a strategy chosen once per queue.
//!
//! [`Ring`] decides *whether* a kick is needed (EVENT_IDX
//! `avail_event`, `VRING_USED_F_NO_NOTIFY`) and whether it is safe to wait
//! for a call; a [`Notifier`] decides *what to do* about it: kick the
//! eventfd, sleep on the call eventfd, or poll the used ring. The hot path
//! calls [`Notifier::publish`] and [`Notifier::wait`] and never looks at the
//! mode again.
//!
//! | [`NotifyMode`] | submission | completion |
//! |---|---|---|
//! | `Notify` | kick when the ring says so | sleep on the call eventfd, interrupts enabled only while waiting |
//! | `PollQueue` | kick when the ring says so | the submitter polls the used ring, `NO_INTERRUPT` set, and never sleeps |
//! | `RingPoll` | kick only when the ring says so: a device polling the avail ring sets `NO_NOTIFY` (or stops moving `avail_event`) | the submitter polls the used ring, `NO_INTERRUPT` set, for the adaptive window of the doorbell modes; then re-enables interrupts, re-checks and sleeps on the call eventfd |
//! | `Sqcq` | `sq.idx` doorbell, kick only on SQ NEED_WAKEUP | the driver's poll thread watches the CQ doorbell and signals the submitter |
//! | `SqcqInline` | as `Sqcq` | the submitter is the CQ consumer: it polls `cq.idx` and its used ring for the adaptive window, then sets CQ NEED_WAKEUP, re-checks and sleeps on the call eventfd |
//!
//! `RingPoll`, `Sqcq` and `SqcqInline` run the same spin-then-sleep
//! policy (`sqcq_protocol::PollState`), so that the benchmark compares the
//! signalling mechanism alone: ring flags and EVENT_IDX against the
//! doorbells. Every polling mode reports its poller's figures
//! ([`Notifier::stats_handle`]).
//!
//! The doorbell modes of VIRTIO_F_SQCQ_POLL need their doorbells set up
//! (and `sqcq` a driver poll thread), so their strategies come from [`crate::sqcq::PollGroupBuilder::attach`],
//! not from [`NotifyMode::notifier`]; [`NotifyMode::required_features`]
//! names the feature bit they need.

use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use std::sync::atomic::Ordering::Relaxed;

use sqcq_protocol::{
    DoorbellCell, NEED_WAKEUP, Poll, PollState, QueueStats, SleepCheck, SpinPolicy, Watch,
};

use crate::poll_stats::{PollStats, StatsCell};
use crate::vring::Ring;
use sqcq_protocol::clock::now_ns;
use sqcq_protocol::yielder::Yielder;

/// Polls of the used ring between two checks of the deadline and the
/// socket (and, in `poll-queue`, a `yield_now`, so that a device sharing
/// our CPU runs).
pub(crate) const POLLS_PER_CHECK: u32 = 256;

/// The notification mode of a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NotifyMode {
    /// Classic virtio: kick per batch (EVENT_IDX decides), sleep on the
    /// call eventfd (an interrupt in a VM).
    Notify,
    /// Kick per batch; the submitter polls the used ring with interrupts
    /// suppressed (io_uring's hipri polling).
    PollQueue,
    /// Standard virtio only: the device polls the avail ring (and says so
    /// with `NO_NOTIFY`/`avail_event`, which suppresses our kicks), the
    /// driver polls the used ring with interrupts suppressed.
    RingPoll,
    /// VIRTIO_F_SQCQ_POLL: `sq.idx` instead of kicks, `cq.idx` instead of
    /// calls, watched by the driver's poll thread.
    Sqcq,
    /// VIRTIO_F_SQCQ_POLL with the submitter as the CQ consumer (the
    /// RFC's "poll-sqcq"): no driver poll thread.
    SqcqInline,
}

impl NotifyMode {
    /// Every mode, in the order of the product's comparison table.
    pub const ALL: [NotifyMode; 5] = [
        Self::Notify,
        Self::PollQueue,
        Self::RingPoll,
        Self::Sqcq,
        Self::SqcqInline,
    ];

    /// The name used on command lines and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Notify => "notify",
            Self::PollQueue => "poll-queue",
            Self::RingPoll => "ring-poll",
            Self::Sqcq => "sqcq",
            Self::SqcqInline => "sqcq-inline",
        }
    }

    /// Virtio feature bits the mode needs the device to offer (none for
    /// the standard modes; VIRTIO_F_SQCQ_POLL for the doorbell modes).
    pub fn required_features(self) -> u64 {
        if self.doorbells() {
            1 << sqcq_protocol::VIRTIO_F_SQCQ_POLL
        } else {
            0
        }
    }

    /// Whether the mode uses the SQ/CQ doorbells.
    pub fn doorbells(self) -> bool {
        matches!(self, Self::Sqcq | Self::SqcqInline)
    }

    /// The strategy implementing a standard mode, for vring `queue`;
    /// `None` for the doorbell modes, whose strategies need the doorbells
    /// ([`crate::sqcq::PollGroupBuilder::attach`]).
    pub fn notifier(self, queue: u16) -> Option<Box<dyn Notifier>> {
        match self {
            Self::Notify => Some(Box::new(Interrupts)),
            Self::PollQueue => Some(Box::new(BusyPoll::new(queue))),
            Self::RingPoll => Some(Box::new(AdaptiveRingPoll::new(
                queue,
                SpinPolicy::default(),
            ))),
            Self::Sqcq | Self::SqcqInline => None,
        }
    }
}

impl fmt::Display for NotifyMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for NotifyMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|mode| mode.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Self::ALL.iter().map(|m| m.name()).collect();
                format!("unknown mode {s:?} (expected one of {})", names.join(", "))
            })
    }
}

/// Why a queue could not notify or be notified.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// Writing the kick eventfd failed.
    #[error("kicking the device failed")]
    Kick(#[source] io::Error),
    /// Reading the call eventfd failed.
    #[error("reading the call eventfd failed")]
    Call(#[source] io::Error),
    /// `poll(2)` on the call eventfd and the socket failed.
    #[error("waiting for the device failed")]
    Poll(#[source] io::Error),
    /// The vhost-user socket was closed by the device.
    #[error("the device closed the vhost-user socket")]
    Hangup,
    /// No completion arrived within the queue's timeout.
    #[error("no completion from the device within {0:?}")]
    Timeout(Duration),
    /// Reading the eventfd the driver's poll thread wakes the submitter
    /// with failed.
    #[error("reading the poll thread's wakeup eventfd failed")]
    Wakeup(#[source] io::Error),
}

/// Notification counters of one queue, counted on the driver side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NotifyCounters {
    /// Kick eventfd writes (a VM exit each, in a VM).
    pub kicks: u64,
    /// Device writes to the call eventfd (interrupts, in a VM), from the
    /// eventfd counter: coalesced writes all count.
    pub calls: u64,
    /// Publishes of the avail index.
    pub publishes: u64,
    /// Times the submitter slept on the call eventfd.
    pub sleeps: u64,
}

impl std::ops::Sub for NotifyCounters {
    type Output = Self;

    fn sub(self, rhs: Self) -> Self {
        Self {
            kicks: self.kicks.wrapping_sub(rhs.kicks),
            calls: self.calls.wrapping_sub(rhs.calls),
            publishes: self.publishes.wrapping_sub(rhs.publishes),
            sleeps: self.sleeps.wrapping_sub(rhs.sleeps),
        }
    }
}

/// The eventfds of one queue, the socket whose hangup ends every wait, the
/// bound on every wait, and the counters.
#[derive(Debug)]
pub struct QueueEvents {
    kick: EventFd,
    call: EventFd,
    hangup: Option<OwnedFd>,
    timeout: Duration,
    counters: NotifyCounters,
    /// The driver's poll thread reads the call eventfd (doorbell modes):
    /// reading it here could steal the wakeup it sleeps for.
    calls_elsewhere: bool,
    /// Where the queue's poller reports: kicks and calls are copied there
    /// as they are counted.
    report: Option<Arc<StatsCell>>,
    /// When the submitter's spinning waits give the CPU away ([`pace`]).
    yielder: Yielder,
}

impl QueueEvents {
    /// Fresh non-blocking kick and call eventfds. `hangup` (the vhost-user
    /// socket, or a duplicate of it) ends every wait when the peer closes
    /// it; `timeout` bounds every wait for a completion.
    pub fn new(hangup: Option<OwnedFd>, timeout: Duration) -> io::Result<Self> {
        Ok(Self {
            kick: EventFd::new(EFD_NONBLOCK)?,
            call: EventFd::new(EFD_NONBLOCK)?,
            hangup,
            timeout,
            counters: NotifyCounters::default(),
            calls_elsewhere: false,
            yielder: Yielder::new(),
            report: None,
        })
    }

    /// Replaces the socket whose hangup ends every wait (a new connection
    /// after the device restarted).
    pub fn set_hangup(&mut self, hangup: Option<OwnedFd>) {
        self.hangup = hangup;
    }

    /// The kick eventfd (for `SET_VRING_KICK`).
    pub fn kick_fd(&self) -> &EventFd {
        &self.kick
    }

    /// The call eventfd (for `SET_VRING_CALL`).
    pub fn call_fd(&self) -> &EventFd {
        &self.call
    }

    /// The bound on one wait for completions.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The counters, after counting calls the device made that nobody
    /// waited for (polling modes never read the call eventfd otherwise).
    pub fn counters(&mut self) -> NotifyCounters {
        // A failed read leaves the count as it is; the error, if lasting,
        // surfaces in the next wait.
        let _ = self.drain_calls();
        self.counters
    }

    /// Hands the call eventfd to a poll thread: returns a duplicate of it,
    /// and from now on this queue never reads it (the poll thread counts
    /// the calls).
    pub(crate) fn share_call(&mut self) -> io::Result<EventFd> {
        let dup = self.call.try_clone()?;
        self.calls_elsewhere = true;
        Ok(dup)
    }

    /// From now on copies the kicks, and the calls unless a poll thread
    /// counts them, into `cell`.
    pub(crate) fn report_to(&mut self, cell: Arc<StatsCell>) {
        cell.store_kicks(self.counters.kicks);
        if !self.calls_elsewhere {
            cell.store_calls(self.counters.calls);
        }
        self.report = Some(cell);
    }

    /// Counts a publish of the avail index.
    pub(crate) fn count_publish(&mut self) {
        self.counters.publishes += 1;
    }

    /// Sleeps until `fd` is signalled (and consumes the signal), the socket
    /// hangs up or `deadline` passes.
    pub(crate) fn sleep_on(&mut self, fd: &EventFd, deadline: Instant) -> Result<(), NotifyError> {
        self.counters.sleeps += 1;
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(NotifyError::Timeout(self.timeout));
        }
        let ready = self.poll_fds(Some(fd.as_raw_fd()), remaining)?;
        if ready.hangup {
            return Err(NotifyError::Hangup);
        }
        if ready.call {
            match fd.read() {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(NotifyError::Wakeup(e)),
            }
        }
        Ok(())
    }

    /// Notifies the device.
    pub fn kick(&mut self) -> Result<(), NotifyError> {
        self.kick.write(1).map_err(NotifyError::Kick)?;
        self.counters.kicks += 1;
        if let Some(cell) = &self.report {
            cell.store_kicks(self.counters.kicks);
        }
        Ok(())
    }

    /// Counts (and clears) the calls the eventfd accumulated.
    fn drain_calls(&mut self) -> Result<(), NotifyError> {
        if self.calls_elsewhere {
            return Ok(());
        }
        match self.call.read() {
            Ok(n) => {
                self.counters.calls = self.counters.calls.wrapping_add(n);
                if let Some(cell) = &self.report {
                    cell.store_calls(self.counters.calls);
                }
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(NotifyError::Call(e)),
        }
    }

    /// Sleeps until the device calls, the socket hangs up or `deadline`
    /// passes.
    pub(crate) fn sleep_on_call(&mut self, deadline: Instant) -> Result<(), NotifyError> {
        self.counters.sleeps += 1;
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(NotifyError::Timeout(self.timeout));
        }
        let ready = self.poll_fds(Some(self.call.as_raw_fd()), remaining)?;
        if ready.hangup {
            return Err(NotifyError::Hangup);
        }
        if ready.call {
            self.drain_calls()?;
        }
        Ok(())
    }

    /// Between polls of the used ring: fails on hangup or after `deadline`.
    pub(crate) fn check_alive(&mut self, deadline: Instant) -> Result<(), NotifyError> {
        if Instant::now() >= deadline {
            return Err(NotifyError::Timeout(self.timeout));
        }
        if self.hangup.is_some() && self.poll_fds(None, Duration::ZERO)?.hangup {
            return Err(NotifyError::Hangup);
        }
        Ok(())
    }

    /// Polls the socket for hangup and `fd` (the call eventfd, or the poll
    /// thread's wakeup eventfd) for a signal.
    fn poll_fds(&self, fd: Option<RawFd>, timeout: Duration) -> Result<Ready, NotifyError> {
        // Only hangup events are asked of the socket (POLLHUP and POLLERR
        // are always reported): it may carry replies to vhost-user requests
        // that are none of our business.
        let socket = self.hangup.as_ref().map_or(-1, AsRawFd::as_raw_fd);
        let mut fds = [
            libc::pollfd {
                fd: socket,
                events: libc::POLLRDHUP,
                revents: 0,
            },
            libc::pollfd {
                fd: fd.unwrap_or(-1),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // Round up, so that a sub-millisecond remainder still sleeps.
        let ms = timeout.as_micros().div_ceil(1000);
        let ms = libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX);
        loop {
            // SAFETY: `fds` is a valid array of two pollfds that lives across
            // the call; negative fds are ignored by poll(2).
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
            if rc >= 0 {
                break;
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(NotifyError::Poll(err));
            }
        }
        let hup = libc::POLLHUP | libc::POLLERR | libc::POLLRDHUP | libc::POLLNVAL;
        Ok(Ready {
            hangup: fds[0].revents & hup != 0,
            call: fds[1].revents & libc::POLLIN != 0,
        })
    }
}

struct Ready {
    hangup: bool,
    call: bool,
}

/// The notification strategy of one queue. Chosen once, at set-up
/// ([`NotifyMode::notifier`]); the queue calls it on every publish and
/// every wait.
pub trait Notifier: Send + fmt::Debug {
    /// The mode this strategy implements.
    fn mode(&self) -> NotifyMode;

    /// Prepares the ring before the first request (interrupt suppression
    /// for the polling modes) and the events' reporting.
    fn start(&mut self, ring: &mut Ring, events: &mut QueueEvents);

    /// Makes the requests added to `ring` visible to the device and
    /// notifies it if needed: by default the standard rule, a kick when
    /// the ring's EVENT_IDX or NO_NOTIFY decision asks for one.
    fn publish(&mut self, ring: &mut Ring, events: &mut QueueEvents) -> Result<(), NotifyError> {
        events.count_publish();
        if ring.publish().needs_kick() {
            events.kick()?;
        }
        Ok(())
    }

    /// Returns once `ring` has used entries to pop (or is broken), or fails
    /// at `deadline` or when the device hangs up. Never blocks unbounded.
    fn wait(
        &mut self,
        ring: &mut Ring,
        events: &mut QueueEvents,
        deadline: Instant,
    ) -> Result<(), NotifyError>;

    /// Calls counted by whoever reads the call eventfd, when that is not
    /// the queue itself (a driver poll thread).
    fn calls(&self) -> Option<u64> {
        None
    }

    /// The statistics of the queue's driver-side poller (the poll thread,
    /// or the submitter's own), in the RFC's terms, when the mode polls.
    fn poll_stats(&self) -> Option<QueueStats> {
        self.stats_handle()
            .and_then(|s| s.snapshot().into_iter().next())
    }

    /// A handle on the figures of [`Self::poll_stats`] that another thread
    /// can read while the queue runs.
    fn stats_handle(&self) -> Option<PollStats> {
        None
    }

    /// The submitter has nothing in flight and stops waiting for a while.
    /// A mode whose submitter is its own CQ consumer asks the device for a
    /// call now, as a poll thread does before it sleeps, so that the
    /// doorbells show the idle state and the next completion wakes it.
    fn park(&mut self, _ring: &mut Ring) {}

    /// Whether the device asks for no more requests for now (THROTTLE in
    /// `sq.flags`, doorbell modes; spec section "Backpressure"): as read
    /// by the last publication, or with `fresh` read again now, which a
    /// driver holding requests back does after it consumed used buffers
    /// (D2). Always false without doorbells.
    fn throttle(&mut self, _fresh: bool) -> bool {
        false
    }

    /// Whether both sides' pollers of this queue are asleep, when the mode
    /// has doorbells.
    fn idle_state(&self) -> Option<IdleState> {
        None
    }

    /// What the queue's SQ and CQ doorbells hold, when it has doorbells
    /// (the doorbell modes, and parked queues).
    fn doorbells(&self) -> Option<DoorbellState> {
        None
    }
}

/// The two doorbells of one queue as last stored by either side, read from
/// shared memory: an observation for tests and reports, ordered by nothing
/// and never used to decide anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DoorbellState {
    /// `sq.idx`: the avail index the driver last published there.
    pub sq_idx: u16,
    /// `sq.flags`: NEED_WAKEUP when the device's poller asked for a kick.
    pub sq_flags: u16,
    /// `cq.idx`: the used index the device last published there.
    pub cq_idx: u16,
    /// `cq.flags`: NEED_WAKEUP when the driver asked for a call.
    pub cq_flags: u16,
}

impl DoorbellState {
    /// Reads both doorbells.
    pub(crate) fn read(sq: &impl DoorbellCell, cq: &impl DoorbellCell) -> Self {
        // Relaxed throughout: an observation, ordered by nothing; the
        // handshakes make their own loads with their own fences.
        let load = |field: &std::sync::atomic::AtomicU16| u16::from_le(field.load(Relaxed));
        Self {
            sq_idx: load(sq.idx()),
            sq_flags: load(sq.flags()),
            cq_idx: load(cq.idx()),
            cq_flags: load(cq.flags()),
        }
    }

    /// Whether the device's poller asked for a kick (SQ NEED_WAKEUP).
    pub fn sq_need_wakeup(&self) -> bool {
        self.sq_flags & NEED_WAKEUP != 0
    }

    /// Whether the driver asked for a call (CQ NEED_WAKEUP).
    pub fn cq_need_wakeup(&self) -> bool {
        self.cq_flags & NEED_WAKEUP != 0
    }
}

/// What the doorbells of one queue say about the two pollers: read from
/// shared memory and the poll thread's own flag, for tests and the
/// bench's idle checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IdleState {
    /// A driver poll thread watches the queue's CQ doorbell (`sqcq`); in
    /// `sqcq-inline` the submitter does, and there is none.
    pub poll_thread: bool,
    /// The driver poll thread watching this queue is blocked in (or about
    /// to enter) its wait on the call eventfds.
    pub poll_thread_asleep: bool,
    /// NEED_WAKEUP is set in `cq.flags`: the driver (its poll thread, or
    /// inline the parked submitter) asked for a call.
    pub cq_need_wakeup: bool,
    /// NEED_WAKEUP is set in `sq.flags`: the device's poller asked for a
    /// kick.
    pub sq_need_wakeup: bool,
    /// Times the poll thread went to sleep so far.
    pub poll_thread_sleeps: u64,
}

impl IdleState {
    /// Both sides asleep, each having asked the other for a wakeup (and
    /// the poll thread, if there is one, blocked).
    pub fn all_asleep(&self) -> bool {
        (!self.poll_thread || self.poll_thread_asleep) && self.cq_need_wakeup && self.sq_need_wakeup
    }
}

/// [`NotifyMode::Notify`]: interrupts are enabled only while the submitter
/// waits, the way Linux's virtio drivers enable callbacks only when their
/// queue has nothing left to process.
#[derive(Debug)]
struct Interrupts;

impl Notifier for Interrupts {
    fn mode(&self) -> NotifyMode {
        NotifyMode::Notify
    }

    fn start(&mut self, _ring: &mut Ring, _events: &mut QueueEvents) {}

    fn wait(
        &mut self,
        ring: &mut Ring,
        events: &mut QueueEvents,
        deadline: Instant,
    ) -> Result<(), NotifyError> {
        // Re-arm, and sleep only when the re-check after the SeqCst fence in
        // `enable_interrupts` saw nothing new: a completion published
        // before the device could see the re-arm is found here instead of
        // being waited for.
        while !ring.has_used() && !ring.enable_interrupts() {
            events.sleep_on_call(deadline)?;
        }
        // While the caller processes completions and submits, the device
        // need not interrupt.
        ring.disable_interrupts();
        Ok(())
    }
}

/// The used ring as a [`Watch`], for the length of one wait: the
/// submitter owns the ring and pops it between waits.
pub(crate) struct UsedRing<'a>(pub(crate) &'a mut Ring);

impl Watch for UsedRing<'_> {
    fn poll(&mut self) -> Option<u16> {
        // `has_used` loads used->idx Relaxed: a hint; `pop_used` does the
        // Acquire fence that pairs with the device's Release store of it.
        self.0.has_used().then(|| self.0.used_index())
    }

    fn prepare_sleep(&mut self) -> SleepCheck {
        // `enable_interrupts` clears NO_INTERRUPT (or moves used_event to
        // the next entry), then fence(SeqCst), then re-loads used->idx: the
        // fence pairs with the device's between its used->idx store and its
        // flags / used_event load, so either it calls or we see the entry.
        if self.0.enable_interrupts() {
            // Polling again: no call wanted.
            self.0.disable_interrupts();
            SleepCheck::Work(self.0.used_index())
        } else {
            SleepCheck::Sleep
        }
    }

    fn finish_sleep(&mut self) {
        self.0.disable_interrupts();
    }
}

/// Counts the completions the device published, for the statistics:
/// how far `used->idx` moved since the last count (bounded by the ring
/// size, as a sane device's jump is; `pop_used` validates it).
#[derive(Debug, Default)]
pub(crate) struct UsedCount {
    last: u16,
}

impl UsedCount {
    pub(crate) fn advance(&mut self, ring: &Ring) -> u64 {
        let idx = ring.used_index();
        let n = idx.wrapping_sub(self.last).min(ring.size());
        self.last = idx;
        u64::from(n)
    }
}

/// One empty poll of a spinning wait that may sleep (`polls` counts this
/// wait's empty polls): checks the deadline and the socket every
/// [`POLLS_PER_CHECK`] polls, and yields the CPU when the queue's
/// [`Yielder`] says (the thread that will write the index may be waiting
/// for this CPU). A wait that needs no empty poll found its work at
/// once: the first empty poll of a wait tells the yielder that the
/// previous wait found work. The doorbell modes pace their spins alike.
pub(crate) fn pace(
    polls: &mut u32,
    events: &mut QueueEvents,
    deadline: Instant,
) -> Result<(), NotifyError> {
    *polls = polls.wrapping_add(1);
    if *polls == 1 {
        events.yielder.busy();
    }
    if polls.is_multiple_of(POLLS_PER_CHECK) {
        events.check_alive(deadline)?;
    }
    events.yielder.idle();
    Ok(())
}

/// [`NotifyMode::PollQueue`]: interrupts suppressed for good, the
/// submitter polls the used ring and never sleeps (io_uring's hipri
/// polling). It reports its spins and an endless window (`interval=inf`,
/// `sleeps=0`).
#[derive(Debug)]
struct BusyPoll {
    stats: Arc<StatsCell>,
    spins: u64,
    completions: u64,
    used: UsedCount,
}

impl BusyPoll {
    fn new(queue: u16) -> Self {
        Self {
            stats: Arc::new(StatsCell::new(queue)),
            spins: 0,
            completions: 0,
            used: UsedCount::default(),
        }
    }
}

impl Notifier for BusyPoll {
    fn mode(&self) -> NotifyMode {
        NotifyMode::PollQueue
    }

    fn start(&mut self, ring: &mut Ring, events: &mut QueueEvents) {
        ring.disable_interrupts();
        events.report_to(Arc::clone(&self.stats));
        self.stats.store(&QueueStats {
            interval_ns: u64::MAX,
            ..QueueStats::default()
        });
    }

    fn wait(
        &mut self,
        ring: &mut Ring,
        events: &mut QueueEvents,
        deadline: Instant,
    ) -> Result<(), NotifyError> {
        let mut polls = 0u32;
        while !ring.has_used() {
            polls = polls.wrapping_add(1);
            if polls.is_multiple_of(POLLS_PER_CHECK) {
                events.check_alive(deadline)?;
                std::thread::yield_now();
            }
            std::hint::spin_loop();
        }
        self.spins = self.spins.wrapping_add(u64::from(polls));
        self.completions = self.completions.wrapping_add(self.used.advance(ring));
        self.stats.store(&QueueStats {
            completions: self.completions,
            interval_ns: u64::MAX,
            spins: self.spins,
            ..QueueStats::default()
        });
        Ok(())
    }

    fn stats_handle(&self) -> Option<PollStats> {
        Some(PollStats::new(vec![Arc::clone(&self.stats)]))
    }
}

/// [`NotifyMode::RingPoll`]: the submitter polls the used ring with
/// interrupts suppressed for the adaptive window of the doorbell modes'
/// pollers, then re-enables interrupts (the ring's flags or EVENT_IDX),
/// re-checks, and sleeps on the call eventfd: the standard-virtio
/// counterpart of a CQ consumer.
#[derive(Debug)]
struct AdaptiveRingPoll {
    state: PollState,
    stats: Arc<StatsCell>,
    used: UsedCount,
}

impl AdaptiveRingPoll {
    fn new(queue: u16, spin: SpinPolicy) -> Self {
        Self {
            state: PollState::new(spin, queue),
            stats: Arc::new(StatsCell::new(queue)),
            used: UsedCount::default(),
        }
    }
}

impl Notifier for AdaptiveRingPoll {
    fn mode(&self) -> NotifyMode {
        NotifyMode::RingPoll
    }

    fn start(&mut self, ring: &mut Ring, events: &mut QueueEvents) {
        ring.disable_interrupts();
        events.report_to(Arc::clone(&self.stats));
        self.stats.store(&self.state.stats());
    }

    fn wait(
        &mut self,
        ring: &mut Ring,
        events: &mut QueueEvents,
        deadline: Instant,
    ) -> Result<(), NotifyError> {
        let mut polls = 0u32;
        let result = loop {
            let mut used = UsedRing(ring);
            match self.state.poll(&mut used, now_ns()) {
                Poll::Work(_) => break Ok(()),
                Poll::Idle => {
                    if let Err(e) = pace(&mut polls, events, deadline) {
                        break Err(e);
                    }
                }
                Poll::Expired => match self.state.prepare_sleep(&mut used, now_ns()) {
                    SleepCheck::Work(_) => break Ok(()),
                    SleepCheck::Sleep => {
                        self.stats.store(&self.state.stats());
                        let slept = events.sleep_on_call(deadline);
                        // Interrupts off again before anything else.
                        self.state.woke(&mut used);
                        if let Err(e) = slept {
                            break Err(e);
                        }
                    }
                },
            }
        };
        self.state.count_completions(self.used.advance(ring));
        self.stats.store(&self.state.stats());
        result
    }

    fn stats_handle(&self) -> Option<PollStats> {
        Some(PollStats::new(vec![Arc::clone(&self.stats)]))
    }
}
