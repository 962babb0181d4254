//! The submitter's half of the doorbell modes: publish through `sq.idx`;
//! wait for completions on the queue's mailbox (`sqcq`, fed by the poll
//! thread) or, inline, on the CQ doorbell itself, as its consumer.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use sqcq_protocol::clock::now_ns;
use sqcq_protocol::{
    CqConsumer, DoorbellCell, Poll, Poller, QueueStats, SleepCheck, SpinPolicy, SqProducer, Wake,
};

use super::bell::{CqBell, GuestBell, QueueShared, SqBell};
use crate::notify::{
    DoorbellState, IdleState, Notifier, NotifyError, NotifyMode, QueueEvents, UsedCount, pace,
};
use crate::poll_stats::PollStats;
use crate::vring::Ring;

/// Tries of [`Notifier::park`] when `cq.idx` moves under it.
const PARK_TRIES: usize = 8;

/// Where the submitter learns of completions.
#[derive(Debug)]
enum Completions {
    /// `sqcq`: the consumer half of the mailbox the poll thread forwards
    /// `cq.idx` through.
    Mailbox(Poller<CqConsumer<Arc<QueueShared>>>),
    /// `sqcq-inline`: the submitter is the consumer of the CQ doorbell in
    /// driver memory (C1-C7), and no poll thread exists.
    Inline {
        cq: Poller<CqConsumer<CqBell>>,
        used: UsedCount,
        park: Park,
    },
}

/// An inline submitter's rest between bursts ([`Notifier::park`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Park {
    /// CQ NEED_WAKEUP is set only while a wait prepares to sleep or
    /// sleeps.
    Awake,
    /// Parked with nothing in flight: CQ NEED_WAKEUP set (after fence 4
    /// and a re-check), the consumer asleep as far as the device can
    /// tell. The next completion is owed a call.
    Parked,
    /// A wait found work while parked. NEED_WAKEUP stays set until the
    /// next wait, so that the device, which stores `cq.idx` after the
    /// used ring the submitter may have seen first, still finds it and
    /// makes the call it owes.
    Woken,
}

/// [`NotifyMode::Sqcq`] and [`NotifyMode::SqcqInline`] for one queue.
#[derive(Debug)]
pub(crate) struct DoorbellNotifier {
    /// P1-P6 on the SQ doorbell.
    sq: SqProducer<SqBell>,
    completions: Completions,
    shared: Arc<QueueShared>,
}

impl DoorbellNotifier {
    /// `sqcq`: completions come through the mailbox from the poll thread.
    pub(crate) fn threaded(shared: Arc<QueueShared>, spin: SpinPolicy) -> Self {
        let mailbox = Poller::new(CqConsumer::new(Arc::clone(&shared), 0), spin, shared.queue);
        Self {
            sq: SqProducer::new(SqBell(Arc::clone(&shared))),
            completions: Completions::Mailbox(mailbox),
            shared,
        }
    }

    /// `sqcq-inline`: the submitter consumes the CQ doorbell itself.
    pub(crate) fn inline(shared: Arc<QueueShared>, spin: SpinPolicy) -> Self {
        let cq = Poller::new(
            CqConsumer::new(CqBell(Arc::clone(&shared)), shared.cq_start),
            spin,
            shared.queue,
        );
        Self {
            sq: SqProducer::new(SqBell(Arc::clone(&shared))),
            completions: Completions::Inline {
                cq,
                used: UsedCount::default(),
                park: Park::Awake,
            },
            shared,
        }
    }
}

impl Notifier for DoorbellNotifier {
    fn mode(&self) -> NotifyMode {
        match self.completions {
            Completions::Mailbox(_) => NotifyMode::Sqcq,
            Completions::Inline { .. } => NotifyMode::SqcqInline,
        }
    }

    fn start(&mut self, ring: &mut Ring, events: &mut QueueEvents) {
        // The device decides on calls from `cq.flags` alone (spec 6.2); the
        // ring flag is kept consistent with a driver that polls.
        ring.disable_interrupts();
        events.report_to(Arc::clone(&self.shared.stats));
        if let Completions::Inline { cq, .. } = &self.completions {
            self.shared.stats.store(&cq.stats());
        }
    }

    fn publish(&mut self, ring: &mut Ring, events: &mut QueueEvents) -> Result<(), NotifyError> {
        publish_sq(&mut self.sq, ring, events)
    }

    fn wait(
        &mut self,
        ring: &mut Ring,
        events: &mut QueueEvents,
        deadline: Instant,
    ) -> Result<(), NotifyError> {
        match &mut self.completions {
            Completions::Mailbox(mailbox) => {
                wait_mailbox(mailbox, &self.shared, ring, events, deadline)
            }
            Completions::Inline { cq, used, park } => {
                let result = wait_inline(cq, park, ring, events, deadline);
                cq.count_completions(used.advance(ring));
                self.shared.stats.store(&cq.stats());
                result
            }
        }
    }

    fn calls(&self) -> Option<u64> {
        match self.completions {
            // The poll thread reads the call eventfd and counts.
            Completions::Mailbox(_) => Some(self.shared.stats.calls()),
            // The queue reads its own call eventfd.
            Completions::Inline { .. } => None,
        }
    }

    fn poll_stats(&self) -> Option<QueueStats> {
        Some(self.shared.stats.snapshot())
    }

    fn stats_handle(&self) -> Option<PollStats> {
        Some(PollStats::new(vec![Arc::clone(&self.shared.stats)]))
    }

    fn park(&mut self, ring: &mut Ring) {
        let Completions::Inline { cq, park, .. } = &mut self.completions else {
            return;
        };
        if *park == Park::Parked || ring.in_flight() > 0 {
            return;
        }
        if *park == Park::Woken {
            cq.woke();
        }
        // C3-C5, as before a sleep: NEED_WAKEUP, fence 4 (pairs with the
        // device's fence 3 between its `cq.idx` store and `cq.flags`
        // load), re-check. With nothing in flight `cq.idx` moves only to
        // catch up with used entries popped already (the device stores it
        // after the used ring): try again then, a few times at most
        // against a device that keeps moving it.
        for _ in 0..PARK_TRIES {
            let now = now_ns();
            // Starts the idle period, so that the next arrival's gap
            // counts it.
            let _ = cq.poll(now);
            if cq.prepare_sleep(now) == SleepCheck::Sleep {
                *park = Park::Parked;
                break;
            }
            *park = Park::Awake;
        }
        self.shared.stats.store(&cq.stats());
    }

    fn throttle(&mut self, fresh: bool) -> bool {
        if fresh {
            self.sq.load_throttle()
        } else {
            self.sq.throttle()
        }
    }

    fn idle_state(&self) -> Option<IdleState> {
        let thread = self.shared.thread.get();
        Some(IdleState {
            poll_thread: thread.is_some(),
            // Acquire: pairs with the poll thread's Release store, so the
            // NEED_WAKEUP it set before is visible to the loads below.
            poll_thread_asleep: thread.is_some_and(|t| t.asleep.load(Ordering::Acquire)),
            cq_need_wakeup: self.shared.cq.need_wakeup(),
            sq_need_wakeup: self.shared.sq.need_wakeup(),
            // Relaxed: a counter for observers.
            poll_thread_sleeps: thread.map_or(0, |t| t.sleeps.load(Ordering::Relaxed)),
        })
    }

    fn doorbells(&self) -> Option<DoorbellState> {
        Some(DoorbellState::read(&self.shared.sq, &self.shared.cq))
    }
}

/// P1-P6 on the SQ doorbell: `avail->idx`, `sq.idx`, a kick if the
/// device's poller asked for one.
fn publish_sq<C: DoorbellCell>(
    sq: &mut SqProducer<C>,
    ring: &mut Ring,
    events: &mut QueueEvents,
) -> Result<(), NotifyError> {
    events.count_publish();
    let Some(idx) = ring.publish_index() else {
        return Ok(());
    };
    // SqProducer::publish: P3, the Release store of `sq.idx`, ordered
    // after the Release store of `avail->idx` just made; then fence 1
    // (pairs with the device poller's fence 2 between its NEED_WAKEUP
    // store and its `sq.idx` re-check); then the `sq.flags` load.
    if sq.publish(idx) == Wake::Owed {
        events.kick()?;
    }
    Ok(())
}

/// `sqcq`: spins on the mailbox, then sleeps on its eventfd; the poll
/// thread forwards every move of `cq.idx`.
fn wait_mailbox(
    mailbox: &mut Poller<CqConsumer<Arc<QueueShared>>>,
    shared: &QueueShared,
    ring: &mut Ring,
    events: &mut QueueEvents,
    deadline: Instant,
) -> Result<(), NotifyError> {
    // Relaxed: a scheduling hint for the poll thread, ordering nothing.
    shared.spinning.store(true, Ordering::Relaxed);
    let result = spin_on_mailbox(mailbox, shared, ring, events, deadline);
    shared.spinning.store(false, Ordering::Relaxed);
    result
}

fn spin_on_mailbox(
    mailbox: &mut Poller<CqConsumer<Arc<QueueShared>>>,
    shared: &QueueShared,
    ring: &mut Ring,
    events: &mut QueueEvents,
    deadline: Instant,
) -> Result<(), NotifyError> {
    let mut polls = 0u32;
    loop {
        // The ring is looked at on every pass, not only after the poll
        // thread forwarded a value: while the submitter spins it takes
        // what the device published without waiting for the poll thread,
        // which on a shared CPU runs only when the submitter yields.
        if ring.has_used() {
            return Ok(());
        }
        match mailbox.poll(now_ns()) {
            // The poll thread forwarded a `cq.idx`: `used->idx` moved (the
            // mailbox's Acquire made the used ring visible).
            Poll::Work(_) => {}
            Poll::Idle => pace(&mut polls, events, deadline)?,
            // Consumer::prepare_sleep on the mailbox: NEED_WAKEUP, then
            // fence(SeqCst) (pairs with the poll thread's fence in
            // `CqProducer::publish` between its mailbox index store and its
            // NEED_WAKEUP load), then the re-check.
            Poll::Expired => match mailbox.prepare_sleep(now_ns()) {
                SleepCheck::Work(_) => {}
                // A last look at the ring after that fence: a packed
                // ring's poll thread may have read this submitter's
                // position before its latest take (see
                // `UsedFlags::used_pending`); what the device published
                // before that look is visible here.
                SleepCheck::Sleep if ring.has_used() => {
                    mailbox.cancel_sleep();
                    return Ok(());
                }
                SleepCheck::Sleep => {
                    shared.spinning.store(false, Ordering::Relaxed);
                    let slept = events.sleep_on(&shared.wake, deadline);
                    shared.spinning.store(true, Ordering::Relaxed);
                    mailbox.woke();
                    slept?;
                }
            },
        }
    }
}

/// `sqcq-inline`: the submitter is the CQ consumer. It spins on its used
/// ring, then sets CQ NEED_WAKEUP, re-checks `cq.idx` and sleeps on the
/// queue's call eventfd, which the device signals only when it sees the
/// flag.
///
/// While it spins it reads `used->idx`, not `cq.idx` (spec 4.3: `cq.idx`
/// is a hint; the device stores it after `used->idx`, so completions show
/// on the ring first). The CQ doorbell's line is then the device's alone
/// between two sleeps: read at every pass, it went back and forth once
/// per completion, and the device's fence 3 after its `cq.idx` store
/// waited for it (docs/benchmarks.md, "Driver: `sqcq-inline` spins on its
/// used ring"). The re-check compares `cq.idx`
/// with the used index consumed so far ([`Consumer::acted_on`]).
///
/// [`Consumer::acted_on`]: sqcq_protocol::Consumer::acted_on
fn wait_inline(
    cq: &mut Poller<CqConsumer<CqBell>>,
    park: &mut Park,
    ring: &mut Ring,
    events: &mut QueueEvents,
    deadline: Instant,
) -> Result<(), NotifyError> {
    if *park == Park::Woken {
        // C7 for the parked sleep: the owed call was made (or is on its
        // way, harmless); no more are wanted.
        cq.woke();
        *park = Park::Awake;
    }
    let mut polls = 0u32;
    loop {
        if ring.has_used() {
            // The arrival ends the idle period (a gap for the spin window
            // if this or an earlier pass found nothing); with `cq.idx`
            // unread, nothing else would.
            cq.found_elsewhere(now_ns());
            if *park == Park::Parked {
                *park = Park::Woken;
            }
            return Ok(());
        }
        match cq.looked_elsewhere(now_ns()) {
            Poll::Idle | Poll::Work(_) => pace(&mut polls, events, deadline)?,
            // Parked: NEED_WAKEUP has been set since `park`, whose re-check
            // after fence 4 saw no new `cq.idx`, and the ring has shown
            // nothing since; a device publishing now sees the flag and
            // calls. The parked sleep was counted then.
            Poll::Expired if *park == Park::Parked => {
                let slept = events.sleep_on_call(deadline);
                // C7: NEED_WAKEUP off, the device stops calling.
                cq.woke();
                *park = Park::Awake;
                slept?;
            }
            // C3-C5 in `Consumer::prepare_sleep`: NEED_WAKEUP, fence 4
            // (pairs with the device's fence 3 between its `cq.idx` store
            // and its `cq.flags` load), re-check of `cq.idx` against the
            // used index consumed: any other value is work, or a `cq.idx`
            // the device has yet to bring up to entries already taken
            // (one more window).
            Poll::Expired => {
                cq.watch_mut().acted_on(ring.last_used());
                match cq.prepare_sleep(now_ns()) {
                    SleepCheck::Work(_) => {}
                    SleepCheck::Sleep => {
                        // Entries on the ring whose `cq.idx` the device has
                        // not stored yet need no call: a cheap last look.
                        if ring.has_used() {
                            cq.cancel_sleep();
                            return Ok(());
                        }
                        let slept = events.sleep_on_call(deadline);
                        // C7: NEED_WAKEUP off, the device stops calling.
                        cq.woke();
                        slept?;
                    }
                }
            }
        }
    }
}

/// A queue nobody polls while VIRTIO_F_SQCQ_POLL is negotiated (the
/// control and event queues; spec 4.5). The submitter is still the SQ
/// producer: `sq.idx` at every publication, a kick when the device asks
/// (its parked SQ always does). The CQ doorbell is parked, so the device
/// calls after every completion whatever the ring flags say, and a wait is
/// the classic one: look at the used ring, sleep on the call eventfd.
#[derive(Debug)]
pub(crate) struct ParkedNotifier {
    sq: SqProducer<Arc<GuestBell>>,
    cq: CqConsumer<Arc<GuestBell>>,
    /// The same two doorbells, for [`Notifier::doorbells`].
    bells: [Arc<GuestBell>; 2],
}

impl ParkedNotifier {
    pub(crate) fn new(sq: GuestBell, cq: GuestBell) -> Self {
        let (sq, cq) = (Arc::new(sq), Arc::new(cq));
        Self {
            sq: SqProducer::new(Arc::clone(&sq)),
            cq: CqConsumer::new(Arc::clone(&cq), 0),
            bells: [sq, cq],
        }
    }
}

impl Notifier for ParkedNotifier {
    fn mode(&self) -> NotifyMode {
        NotifyMode::Notify
    }

    fn start(&mut self, _ring: &mut Ring, _events: &mut QueueEvents) {
        // Before the first buffer is made available (spec 4.5); the
        // doorbells were zeroed just before.
        self.cq.park();
    }

    fn publish(&mut self, ring: &mut Ring, events: &mut QueueEvents) -> Result<(), NotifyError> {
        publish_sq(&mut self.sq, ring, events)
    }

    fn wait(
        &mut self,
        ring: &mut Ring,
        events: &mut QueueEvents,
        deadline: Instant,
    ) -> Result<(), NotifyError> {
        // NEED_WAKEUP has been set since `start`: a completion published
        // after this look is called, and the call eventfd keeps it.
        while !ring.has_used() {
            events.sleep_on_call(deadline)?;
        }
        Ok(())
    }

    fn throttle(&mut self, fresh: bool) -> bool {
        if fresh {
            self.sq.load_throttle()
        } else {
            self.sq.throttle()
        }
    }

    fn doorbells(&self) -> Option<DoorbellState> {
        let [sq, cq] = &self.bells;
        Some(DoorbellState::read(sq, cq))
    }
}
