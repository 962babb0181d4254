//! The submitter's half of the doorbell modes: publish through `sq.idx`,
//! wait for completions on the queue's mailbox (and, inline, on the used
//! ring itself).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use sqcq_protocol::{
    CqConsumer, Poll, Poller, QueueStats, SleepCheck, SpinPolicy, SqProducer, Wake,
};

use super::bell::{QueueShared, SqBell};
use super::{POLLS_PER_YIELD, now_ns};
use crate::notify::{IdleState, Notifier, NotifyError, NotifyMode, QueueEvents};
use crate::vring::SplitQueue;

/// Polls between two checks of the deadline and the socket.
const POLLS_PER_CHECK: u32 = 256;

/// [`NotifyMode::Sqcq`] and [`NotifyMode::SqcqInline`] for one queue.
#[derive(Debug)]
pub(crate) struct DoorbellNotifier {
    inline: bool,
    /// P1-P6 on the SQ doorbell.
    sq: SqProducer<SqBell>,
    /// The consumer half of the mailbox the poll thread forwards `cq.idx`
    /// through.
    mailbox: Poller<CqConsumer<Arc<QueueShared>>>,
    shared: Arc<QueueShared>,
}

impl DoorbellNotifier {
    pub(crate) fn new(shared: Arc<QueueShared>, spin: SpinPolicy, inline: bool) -> Self {
        Self {
            inline,
            sq: SqProducer::new(SqBell(Arc::clone(&shared))),
            mailbox: Poller::new(CqConsumer::new(Arc::clone(&shared), 0), spin, shared.queue),
            shared,
        }
    }
}

impl Notifier for DoorbellNotifier {
    fn mode(&self) -> NotifyMode {
        if self.inline {
            NotifyMode::SqcqInline
        } else {
            NotifyMode::Sqcq
        }
    }

    fn start(&mut self, ring: &mut SplitQueue) {
        // The device decides on calls from `cq.flags` alone (spec 5.2); the
        // ring flag is kept consistent with a driver that polls.
        ring.disable_interrupts();
    }

    fn publish(
        &mut self,
        ring: &mut SplitQueue,
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
        if self.sq.publish(idx) == Wake::Owed {
            events.kick()?;
            let kicks = &self.shared.kicks.0;
            // Relaxed: only this thread writes the counter.
            kicks.store(
                kicks.load(Ordering::Relaxed).wrapping_add(1),
                Ordering::Relaxed,
            );
        }
        Ok(())
    }

    fn wait(
        &mut self,
        ring: &mut SplitQueue,
        events: &mut QueueEvents,
        deadline: Instant,
    ) -> Result<(), NotifyError> {
        let mut polls = 0u32;
        // The ring is looked at on entry and after every mailbox value;
        // inline, on every poll too.
        let mut look = true;
        loop {
            if (look || self.inline) && ring.has_used() {
                if !look {
                    self.mailbox.found_elsewhere(now_ns());
                }
                return Ok(());
            }
            look = false;
            match self.mailbox.poll(now_ns()) {
                // The poll thread forwarded a `cq.idx`: `used->idx` moved
                // (the mailbox's Acquire made the used ring visible).
                Poll::Work(_) => look = true,
                Poll::Idle => {
                    polls = polls.wrapping_add(1);
                    if polls.is_multiple_of(POLLS_PER_CHECK) {
                        events.check_alive(deadline)?;
                    }
                    if polls.is_multiple_of(POLLS_PER_YIELD) {
                        std::thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                }
                // Consumer::prepare_sleep on the mailbox: NEED_WAKEUP, then
                // fence(SeqCst) (pairs with the poll thread's fence in
                // `CqProducer::publish` between its mailbox index store and
                // its NEED_WAKEUP load), then the re-check.
                Poll::Expired => match self.mailbox.prepare_sleep(now_ns()) {
                    SleepCheck::Work(_) => look = true,
                    SleepCheck::Sleep => {
                        // Completions reaped ahead of the poll thread
                        // need no wakeup: a cheap last look.
                        if ring.has_used() {
                            self.mailbox.cancel_sleep();
                            return Ok(());
                        }
                        let slept = events.sleep_on(&self.shared.wake, deadline);
                        self.mailbox.woke();
                        slept?;
                        look = true;
                    }
                },
            }
        }
    }

    fn calls(&self) -> Option<u64> {
        // Relaxed: a counter for reports.
        Some(self.shared.stats.0.calls.load(Ordering::Relaxed))
    }

    fn poll_stats(&self) -> Option<QueueStats> {
        Some(self.shared.stats())
    }

    fn idle_state(&self) -> Option<IdleState> {
        let thread = self.shared.thread.get();
        Some(IdleState {
            // Acquire: pairs with the poll thread's Release store, so the
            // NEED_WAKEUP it set before is visible to the loads below.
            poll_thread_asleep: thread.is_some_and(|t| t.asleep.load(Ordering::Acquire)),
            cq_need_wakeup: self.shared.cq.need_wakeup(),
            sq_need_wakeup: self.shared.sq.need_wakeup(),
            poll_thread_sleeps: thread.map_or(0, |t| t.sleeps.load(Ordering::Relaxed)),
        })
    }
}
