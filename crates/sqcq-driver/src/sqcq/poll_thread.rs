//! The driver's poll thread: watches the CQ doorbells of its queues, hands
//! every move of `cq.idx` to the queue's submitter through its mailbox, and
//! sleeps when every queue has been quiet for its spin window.
//!
//! One thread per device is the default (spec section 12.2): it costs one
//! spinning CPU per device, which matters on a 2-CPU machine.
//! [`PollThreads::PerQueue`] gives each queue its own thread instead.
//!
//! Before sleeping the thread runs, for each queue, C3-C5 of the
//! handshake (`Poller::prepare_sleep`: NEED_WAKEUP, fence 4, re-check). It
//! sleeps only if every queue answered `Sleep`; if one found work, the
//! others' flags are cleared again (`cancel_sleep`) and polling goes on.
//! It then waits in `epoll_wait` on all the call eventfds, which the device
//! signals only when it sees NEED_WAKEUP after its fence 3.
//!
//! A packed ring's `cq.idx` holds a position (spec section 10), which
//! repeats every two laps: the re-check of such a queue ([`CqWatch`])
//! loads the flags of the descriptor at the submitter's next used
//! position instead, and what the thread forwards to the mailbox is a
//! count of its forwards, which changes at each one whatever `cq.idx`
//! held.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;

use sqcq_protocol::packed::Position;
use sqcq_protocol::{
    CqConsumer, CqProducer, Poll, Poller, SleepCheck, SpinConfig, SpinPolicy, Wake, Watch,
};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::bell::{CqBell, DoorbellError, QueueShared, ThreadState, queue_doorbells};
use super::notifier::DoorbellNotifier;
use crate::memory::DriverMemory;
use crate::notify::{Notifier, QueueEvents};
use crate::poll_stats::PollStats;
use crate::vring::Ring;
use sqcq_protocol::clock::now_ns;
use sqcq_protocol::yielder::Yielder;

/// Polls between two stores of the statistics while spinning.
const POLLS_PER_STATS: u32 = 1024;
/// epoll data of the stop eventfd.
const STOP: u64 = u64::MAX;
/// How long the poll thread steps aside while every submitter it serves
/// spins on its own ring: a submitter that then sleeps waits at most this
/// long for the thread to look at `cq.idx` again.
const STEP_ASIDE: std::time::Duration = std::time::Duration::from_micros(50);

/// How many driver poll threads serve the doorbell queues of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PollThreads {
    /// One thread for every queue of the device (the default).
    #[default]
    PerDevice,
    /// One thread per queue.
    PerQueue,
}

impl PollThreads {
    /// The name used on command lines and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::PerDevice => "per-device",
            Self::PerQueue => "per-queue",
        }
    }
}

/// Collects the doorbell queues of a device, then starts their poll
/// threads.
#[derive(Debug)]
pub struct PollGroupBuilder {
    threads: PollThreads,
    spin: SpinConfig,
    queues: Vec<(Arc<QueueShared>, EventFd)>,
}

impl PollGroupBuilder {
    /// A group with `threads` poll threads spinning by `spin`.
    pub fn new(threads: PollThreads, spin: SpinConfig) -> Self {
        Self {
            threads,
            spin,
            queues: Vec::new(),
        }
    }

    /// Sets up the doorbells of vring `index` (zeroed; call before the
    /// queue is started) and returns the submitter's strategy for it.
    /// `inline` (`sqcq-inline`): the submitter is the queue's CQ consumer
    /// and no poll thread serves the queue; otherwise (`sqcq`) the group's
    /// poll thread does.
    pub fn attach(
        &mut self,
        mem: &DriverMemory,
        index: u16,
        ring: &Ring,
        events: &mut QueueEvents,
        inline: bool,
    ) -> Result<Box<dyn Notifier>, DoorbellError> {
        let (sq, cq) = queue_doorbells(mem, ring)?;
        let packed = ring
            .used_flags(mem)
            .transpose()
            .map_err(DoorbellError::Memory)?;
        let shared = QueueShared::new(index, ring.size(), sq, cq, ring.last_used(), packed)
            .map_err(DoorbellError::Thread)?;
        let shared = Arc::new(shared);
        let spin = SpinPolicy::new(self.spin).unwrap_or_default();
        if inline {
            // The submitter sleeps on the queue's own call eventfd.
            return Ok(Box::new(DoorbellNotifier::inline(shared, spin)));
        }
        let call = events.share_call().map_err(DoorbellError::Thread)?;
        self.queues.push((Arc::clone(&shared), call));
        Ok(Box::new(DoorbellNotifier::threaded(shared, spin)))
    }

    /// Starts the poll threads. Each one runs until the group is stopped
    /// or dropped.
    pub fn start(self) -> Result<PollGroup, DoorbellError> {
        let spin = SpinPolicy::new(self.spin).unwrap_or_default();
        let groups: Vec<Vec<(Arc<QueueShared>, EventFd)>> = match self.threads {
            PollThreads::PerDevice => vec![self.queues],
            PollThreads::PerQueue => self.queues.into_iter().map(|q| vec![q]).collect(),
        };
        let mut threads = Vec::new();
        let mut queues = Vec::new();
        for group in groups.into_iter().filter(|g| !g.is_empty()) {
            let state = Arc::new(ThreadState::new().map_err(DoorbellError::Thread)?);
            let mut watched = Vec::new();
            for (shared, call) in group {
                // Set once per queue: each queue is in exactly one group.
                let _ = shared.thread.set(Arc::clone(&state));
                queues.push(Arc::clone(&shared.stats));
                watched.push(Watched::new(shared, call, spin.clone()));
            }
            let name = format!("sqcq-poll-{}", watched[0].shared.queue);
            let thread = PollThread::new(watched, Arc::clone(&state))?;
            let handle = std::thread::Builder::new()
                .name(name)
                .spawn(move || thread.run())
                .map_err(DoorbellError::Thread)?;
            threads.push((state, handle));
        }
        Ok(PollGroup {
            threads,
            stats: PollStats::new(queues),
        })
    }
}

/// The running poll threads of a device. Dropping it stops them.
#[derive(Debug)]
pub struct PollGroup {
    threads: Vec<(Arc<ThreadState>, JoinHandle<()>)>,
    stats: PollStats,
}

impl PollGroup {
    /// A handle on the per-queue statistics of the queues its threads
    /// serve (not the inline ones), for a reporting thread.
    pub fn stats(&self) -> PollStats {
        self.stats.clone()
    }

    /// Poll threads running (none when every queue is inline).
    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    /// Stops the threads and waits for them. Call after the device stopped
    /// the queues (GET_VRING_BASE), or at least after the last request.
    pub fn stop(mut self) {
        self.stop_threads();
    }

    fn stop_threads(&mut self) {
        for (state, _) in &self.threads {
            // Release: the thread's Acquire load of `stop` then sees
            // everything before; the eventfd ends a sleep.
            state.stop.store(true, Ordering::Release);
            let _ = state.stop_fd.write(1);
        }
        for (_, handle) in self.threads.drain(..) {
            let _ = handle.join();
        }
    }
}

impl Drop for PollGroup {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

/// What a poll thread watches on one queue: `cq.idx` (C1-C7 of the
/// handshake); for a packed ring, the re-check before a sleep (C5) loads
/// the flags of the descriptor at the submitter's next used position
/// instead (spec 10.3).
struct CqWatch {
    cq: CqConsumer<CqBell>,
    shared: Arc<QueueShared>,
}

impl Watch for CqWatch {
    fn poll(&mut self) -> Option<u16> {
        self.cq.poll()
    }

    fn prepare_sleep(&mut self) -> SleepCheck {
        let Some(packed) = &self.shared.packed else {
            return self.cq.prepare_sleep();
        };
        // NEED_WAKEUP, fence 4 (pairs with the device's fence 3 between
        // its `cq.idx` store and its `cq.flags` load), then the flags.
        if self.cq.prepare_sleep_on(|| packed.used_pending()) {
            SleepCheck::Work(self.cq.seen())
        } else {
            SleepCheck::Sleep
        }
    }

    fn finish_sleep(&mut self) {
        self.cq.finish_sleep();
    }
}

/// One queue as its poll thread sees it.
struct Watched {
    shared: Arc<QueueShared>,
    poller: Poller<CqWatch>,
    /// The producer half of the mailbox to the submitter.
    mailbox: CqProducer<Arc<QueueShared>>,
    call: EventFd,
    /// Calls counted from `call` so far.
    calls: u64,
    last: u16,
    /// Forwards so far: the value the mailbox holds.
    forwards: u16,
    asked: bool,
}

impl Watched {
    fn new(shared: Arc<QueueShared>, call: EventFd, spin: SpinPolicy) -> Self {
        let cq = CqConsumer::new(CqBell(Arc::clone(&shared)), shared.cq_start);
        let watch = CqWatch {
            cq,
            shared: Arc::clone(&shared),
        };
        Self {
            poller: Poller::new(watch, spin, shared.queue),
            mailbox: CqProducer::new(Arc::clone(&shared)),
            last: shared.cq_start,
            shared,
            call,
            calls: 0,
            forwards: 0,
            asked: false,
        }
    }

    /// How many completions a move of `cq.idx` from `last` to `idx`
    /// stands for, for the statistics: a hint, never used to index
    /// anything, bounded by the queue size as a sane device's jump is.
    fn jump(&self, idx: u16) -> u16 {
        let size = self.shared.size;
        if self.shared.packed.is_none() {
            return idx.wrapping_sub(self.last).min(size);
        }
        match (
            Position::decode(self.last, size),
            Position::decode(idx, size),
        ) {
            (Some(from), Some(to)) => {
                u16::try_from(from.ahead(to, size)).map_or(size, |n| n.min(size))
            }
            _ => 0,
        }
    }

    /// `cq.idx` moved to `idx`: tell the submitter.
    fn forward(&mut self, idx: u16) {
        let jump = self.jump(idx);
        self.last = idx;
        self.poller.count_completions(u64::from(jump));
        // The submitter validates what it takes off the ring itself: the
        // mailbox only has to change at every forward.
        self.forwards = self.forwards.wrapping_add(1);
        // CqProducer::publish: Release store of the mailbox index, then
        // fence(SeqCst) (pairs with the submitter's fence in its
        // `prepare_sleep` on the mailbox), then the NEED_WAKEUP load.
        if self.mailbox.publish(self.forwards) == Wake::Owed {
            // A failed write leaves the submitter to its bounded wait.
            let _ = self.shared.wake.write(1);
        }
    }

    fn store_stats(&self) {
        self.shared.stats.store(&self.poller.stats());
    }

    fn drain_call(&mut self) {
        if let Ok(n) = self.call.read() {
            self.calls = self.calls.wrapping_add(n);
            self.shared.stats.store_calls(self.calls);
        }
    }
}

struct PollThread {
    watched: Vec<Watched>,
    state: Arc<ThreadState>,
    epoll: Epoll,
    events: Vec<EpollEvent>,
}

impl PollThread {
    fn new(watched: Vec<Watched>, state: Arc<ThreadState>) -> Result<Self, DoorbellError> {
        let epoll = Epoll::new().map_err(DoorbellError::Thread)?;
        let add = |fd, data| {
            epoll
                .ctl(
                    ControlOperation::Add,
                    fd,
                    EpollEvent::new(EventSet::IN, data),
                )
                .map_err(DoorbellError::Thread)
        };
        use std::os::fd::AsRawFd;
        add(state.stop_fd.as_raw_fd(), STOP)?;
        for (i, w) in watched.iter().enumerate() {
            add(w.call.as_raw_fd(), i as u64)?;
        }
        let events = vec![EpollEvent::default(); watched.len() + 1];
        Ok(Self {
            watched,
            state,
            epoll,
            events,
        })
    }

    fn run(mut self) {
        let mut polls = 0u32;
        let mut yielder = Yielder::new();
        // Acquire: pairs with the Release store in `PollGroup::stop`.
        while !self.state.stop.load(Ordering::Acquire) {
            let now = now_ns();
            let mut spinning = false;
            let mut found = false;
            for w in &mut self.watched {
                match w.poller.poll(now) {
                    Poll::Work(idx) => {
                        w.forward(idx);
                        spinning = true;
                        found = true;
                    }
                    Poll::Idle => spinning = true,
                    Poll::Expired => {}
                }
            }
            if spinning {
                polls = polls.wrapping_add(1);
                if polls.is_multiple_of(POLLS_PER_STATS) {
                    self.watched.iter().for_each(Watched::store_stats);
                }
                if found {
                    yielder.busy();
                } else {
                    yielder.idle();
                }
                // Every submitter spins and takes its completions itself:
                // nothing to forward meanwhile, so this thread steps aside
                // for a moment, off any CPU it may share with them
                // (Relaxed: a hint).
                if self
                    .watched
                    .iter()
                    .all(|w| w.shared.spinning.load(Ordering::Relaxed))
                {
                    std::thread::sleep(STEP_ASIDE);
                }
                continue;
            }
            if self.prepare_sleep(now) {
                self.sleep();
            }
        }
        // Calls this thread never slept on (it found the work first) stay
        // unread in their eventfds: counted now, so that the figures taken
        // after the run hold every call the device made.
        for w in &mut self.watched {
            w.drain_call();
            w.store_stats();
        }
    }

    /// Every window expired: asks each queue's device for a call. Returns
    /// whether the thread may sleep (no queue found work meanwhile).
    fn prepare_sleep(&mut self, now: u64) -> bool {
        let mut found = false;
        for w in &mut self.watched {
            // Poller::prepare_sleep: NEED_WAKEUP, fence 4 (pairs with the
            // device's fence 3 between its `cq.idx` store and `cq.flags`
            // load), re-check of `cq.idx`.
            match w.poller.prepare_sleep(now) {
                SleepCheck::Sleep => w.asked = true,
                SleepCheck::Work(idx) => {
                    w.asked = false;
                    w.forward(idx);
                    found = true;
                }
            }
        }
        if found {
            for w in self.watched.iter_mut().filter(|w| w.asked) {
                w.poller.cancel_sleep();
                w.asked = false;
            }
        }
        !found
    }

    fn sleep(&mut self) {
        self.watched.iter().for_each(Watched::store_stats);
        // Relaxed: a counter for observers.
        self.state.sleeps.fetch_add(1, Ordering::Relaxed);
        // Release: an observer that sees `asleep` (Acquire) also sees the
        // NEED_WAKEUP stores made above.
        self.state.asleep.store(true, Ordering::Release);
        let ready = loop {
            match self.epoll.wait(-1, &mut self.events) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // Nothing sensible to do but poll again.
                Err(_) => break 0,
            }
        };
        self.state.asleep.store(false, Ordering::Relaxed);
        for ev in &self.events[..ready] {
            if let Some(w) = usize::try_from(ev.data())
                .ok()
                .and_then(|i| self.watched.get_mut(i))
            {
                w.drain_call();
            }
        }
        for w in &mut self.watched {
            w.poller.woke();
            w.asked = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vring::QueueConfig;
    use sqcq_protocol::DoorbellCell;
    use vm_memory::Bytes;

    /// The poll thread of a packed ring decides whether it may sleep by
    /// the descriptor at the submitter's position, not by `cq.idx`: a
    /// `cq.idx` it has acted on (as after the device moved two laps)
    /// does not let it sleep over a used descriptor, and a `cq.idx` that
    /// moved does not keep it awake once nothing is used there.
    #[test]
    fn a_packed_ring_is_rechecked_by_its_descriptor_flags() {
        let mut mem = DriverMemory::new(4 << 20).unwrap();
        let config = QueueConfig {
            packed: true,
            ..QueueConfig::new(4)
        };
        let ring = Ring::new(&mut mem, config).unwrap();
        let (sq, cq) = queue_doorbells(&mem, &ring).unwrap();
        let start = ring.last_used();
        let flags = ring.used_flags(&mem).unwrap().unwrap();
        let shared = QueueShared::new(2, 4, sq, cq, start, Some(flags));
        let shared = Arc::new(shared.unwrap());
        let mut watch = CqWatch {
            cq: CqConsumer::new(CqBell(Arc::clone(&shared)), start),
            shared: Arc::clone(&shared),
        };
        assert_eq!(watch.prepare_sleep(), SleepCheck::Sleep);
        assert!(shared.cq.need_wakeup());
        watch.finish_sleep();

        // The descriptor at offset 0 used on the first lap (AVAIL and USED
        // both set), `cq.idx` unchanged.
        let desc0 = vm_memory::GuestAddress(ring.addresses()[0].0 + 14);
        mem.guest_memory()
            .write_obj(0x8080u16.to_le(), desc0)
            .unwrap();
        assert_eq!(watch.prepare_sleep(), SleepCheck::Work(start));
        assert!(!shared.cq.need_wakeup(), "cleared again with work");

        // Made available again on the next lap instead: not used, and a
        // `cq.idx` that moved does not change that.
        mem.guest_memory()
            .write_obj(0x0000u16.to_le(), desc0)
            .unwrap();
        shared.cq.idx().store(0x0001u16.to_le(), Ordering::Relaxed);
        assert_eq!(watch.poll(), Some(1), "a hint: forwarded");
        assert_eq!(watch.prepare_sleep(), SleepCheck::Sleep);
    }
}
