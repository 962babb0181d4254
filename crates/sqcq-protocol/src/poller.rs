//! The poll loop of one consumer, without the loop: spin while the
//! adaptive window lasts, then prepare to sleep.
//!
//! What is watched is a [`Watch`]: a doorbell consumer ([`Consumer`]) for
//! VIRTIO_F_SQCQ_POLL, or, for the standard-virtio comparison, a ring
//! index with the ring's own suppression flags (the device's avail index
//! with VRING_USED_F_NO_NOTIFY, the driver's used index with
//! VRING_AVAIL_F_NO_INTERRUPT). Both run the same spin policy, so a
//! benchmark of the two compares the signalling mechanism and nothing else.
//!
//! The caller owns the thread, the clock and the eventfd; a [`Poller`]
//! owns the decisions and the counters (a [`PollState`]) and the watch, so that the device's poll threads
//! and the driver's poll thread behave alike. One thread may drive several
//! pollers (a worker serving several virtqueues, a per-device driver poll
//! thread): it sleeps only when every poller's window has expired and
//! every one of them answered [`SleepCheck::Sleep`] to
//! [`Poller::prepare_sleep`]; if one found work, it calls
//! [`Poller::cancel_sleep`] on the others and goes on.
//!
//! When the watched index lives in something the caller owns and mutates
//! between polls (a driver's used ring, popped by the submitter), keep a
//! [`PollState`] instead and hand it a watch that borrows the ring for
//! the length of one wait.
//!
//! ```
//! use sqcq_protocol::{Doorbell, Poll, Poller, SleepCheck, SpinPolicy, SqConsumer, SqProducer};
//!
//! let bell = Doorbell::new();
//! let mut poller = Poller::new(SqConsumer::new(&bell, 0), SpinPolicy::default(), 0);
//! assert_eq!(poller.poll(0), Poll::Idle);
//! // 20 µs later the initial window has expired.
//! assert_eq!(poller.poll(20_000), Poll::Expired);
//! assert_eq!(poller.prepare_sleep(20_000), SleepCheck::Sleep);
//! // ... the caller sleeps on the kick eventfd; the driver publishes and kicks ...
//! let _ = SqProducer::new(&bell).publish(1);
//! poller.woke();
//! assert_eq!(poller.poll(90_000), Poll::Work(1));
//! assert_eq!(poller.stats().sleeps, 1);
//! ```

use crate::doorbell::DoorbellCell;
use crate::handshake::{Consumer, Role, SleepCheck};
use crate::spin::SpinPolicy;
use crate::stats::QueueStats;

/// Something a poll thread watches for new work: an index it polls, and a
/// way to ask for a notification before sleeping.
///
/// `prepare_sleep` must re-check for work after asking for the
/// notification, with a full fence in between (the store-then-load
/// handshake), or a wakeup can be lost.
pub trait Watch {
    /// Returns the new index if work arrived since the last call.
    fn poll(&mut self) -> Option<u16>;
    /// Asks the other side for a notification, then re-checks.
    fn prepare_sleep(&mut self) -> SleepCheck;
    /// Tells the other side notifications are no longer needed.
    fn finish_sleep(&mut self);
}

impl<W: Watch + ?Sized> Watch for &mut W {
    fn poll(&mut self) -> Option<u16> {
        (**self).poll()
    }
    fn prepare_sleep(&mut self) -> SleepCheck {
        (**self).prepare_sleep()
    }
    fn finish_sleep(&mut self) {
        (**self).finish_sleep()
    }
}

impl<C: DoorbellCell, R: Role> Watch for Consumer<C, R> {
    fn poll(&mut self) -> Option<u16> {
        Consumer::poll(self)
    }
    fn prepare_sleep(&mut self) -> SleepCheck {
        Consumer::prepare_sleep(self)
    }
    fn finish_sleep(&mut self) {
        Consumer::finish_sleep(self)
    }
}
/// What one look at the doorbell found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Poll {
    /// The index moved: process the ring.
    Work(u16),
    /// Nothing new, and the spin window still runs: look again.
    Idle,
    /// Nothing new, and the spin window is over: call
    /// [`Poller::prepare_sleep`] (or [`PollState::prepare_sleep`]).
    Expired,
}

/// The decisions and counters of one consumer, without what it watches:
/// the adaptive spin window, the idle period and the statistics. Every
/// method that looks at the watch takes it as an argument, so the watch
/// may be a borrow that lives only for one wait (a driver's used ring,
/// which the submitter owns and mutates between waits). [`Poller`] is
/// this plus an owned watch.
///
/// Pass the same watch (or views of the same index) every time: the state
/// assumes one consumer.
#[derive(Clone, Debug)]
pub struct PollState {
    spin: SpinPolicy,
    stats: QueueStats,
    idle_since: Option<u64>,
    /// The consumer slept since the idle period began: the work that ends
    /// it came a wakeup before it was noticed.
    slept: bool,
}

impl PollState {
    /// The state of a consumer of virtqueue `queue`.
    pub fn new(spin: SpinPolicy, queue: u16) -> Self {
        PollState {
            spin,
            stats: QueueStats {
                queue,
                ..QueueStats::default()
            },
            idle_since: None,
            slept: false,
        }
    }

    /// Looks at `watch` once. `now_ns` is any monotonic clock in
    /// nanoseconds.
    pub fn poll<W: Watch + ?Sized>(&mut self, watch: &mut W, now_ns: u64) -> Poll {
        if let Some(idx) = watch.poll() {
            self.arrived(now_ns);
            return Poll::Work(idx);
        }
        self.looked_elsewhere(now_ns)
    }

    /// A pass that looked for work somewhere other than the watch (the
    /// ring itself) and found none: [`Poll::Idle`] within the spin
    /// window, [`Poll::Expired`] after it, as an empty [`Self::poll`]
    /// would say, without reading the doorbell.
    pub fn looked_elsewhere(&mut self, now_ns: u64) -> Poll {
        let since = *self.idle_since.get_or_insert(now_ns);
        self.stats.spins += 1;
        if now_ns.saturating_sub(since) < self.spin.window_ns() {
            Poll::Idle
        } else {
            Poll::Expired
        }
    }

    /// The window expired: asks `watch` for a notification and re-checks
    /// ([`Watch::prepare_sleep`]). On [`SleepCheck::Sleep`] the caller
    /// sleeps on the eventfd and then calls [`woke`](Self::woke); on
    /// [`SleepCheck::Work`] it processes the ring.
    pub fn prepare_sleep<W: Watch + ?Sized>(&mut self, watch: &mut W, now_ns: u64) -> SleepCheck {
        self.spin.record_miss();
        let check = watch.prepare_sleep();
        match check {
            SleepCheck::Work(_) => self.arrived(now_ns),
            SleepCheck::Sleep => self.stats.sleeps += 1,
        }
        check
    }

    /// The caller woke from its eventfd: tells `watch` notifications are
    /// no longer needed. The idle period goes on until the next
    /// [`Poll::Work`], so the gap recorded then includes the sleep.
    pub fn woke<W: Watch + ?Sized>(&mut self, watch: &mut W) {
        watch.finish_sleep();
        self.slept = true;
    }

    /// Another poller of the same thread found work before the thread
    /// slept: withdraws the notification request without counting a sleep.
    pub fn cancel_sleep<W: Watch + ?Sized>(&mut self, watch: &mut W) {
        watch.finish_sleep();
        self.stats.sleeps = self.stats.sleeps.saturating_sub(1);
    }

    /// Work arrived that the caller found some other way than through the
    /// watch (a submitting job that also polls its used ring): records the
    /// arrival gap as [`Poll::Work`] would, so the spin window keeps
    /// learning.
    pub fn found_elsewhere(&mut self, now_ns: u64) {
        self.arrived(now_ns);
    }

    /// Counts requests completed (device) or completions handled (driver).
    pub fn count_completions(&mut self, n: u64) {
        self.stats.completions = self.stats.completions.wrapping_add(n);
    }

    /// Counts a notification sent to the other side (kick or call).
    pub fn count_wakeup(&mut self) {
        self.stats.wakeups = self.stats.wakeups.wrapping_add(1);
    }

    /// Counters and current spin figures.
    pub fn stats(&self) -> QueueStats {
        QueueStats {
            ema_ns: self.spin.ema_ns(),
            interval_ns: self.spin.window_ns(),
            ..self.stats
        }
    }

    fn arrived(&mut self, now_ns: u64) {
        let slept = core::mem::take(&mut self.slept);
        if let Some(since) = self.idle_since.take() {
            let gap = now_ns.saturating_sub(since);
            if slept {
                self.spin.record_woken_gap(gap);
            } else {
                self.spin.record_gap(gap);
            }
        }
    }
}

/// One consumer's poll state together with what it watches: a
/// [`PollState`] that owns its [`Watch`].
pub struct Poller<W> {
    consumer: W,
    state: PollState,
}

impl<W: core::fmt::Debug> core::fmt::Debug for Poller<W> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Poller")
            .field("consumer", &self.consumer)
            .field("stats", &self.state.stats)
            .finish()
    }
}

impl<W: Watch> Poller<W> {
    /// A poller over `consumer` for virtqueue `queue`.
    pub fn new(consumer: W, spin: SpinPolicy, queue: u16) -> Self {
        Poller {
            consumer,
            state: PollState::new(spin, queue),
        }
    }

    /// Looks at the doorbell once. `now_ns` is any monotonic clock in
    /// nanoseconds.
    pub fn poll(&mut self, now_ns: u64) -> Poll {
        self.state.poll(&mut self.consumer, now_ns)
    }

    /// The window expired: sets NEED_WAKEUP and re-checks. On
    /// [`SleepCheck::Sleep`] the caller sleeps on the eventfd and then calls
    /// [`woke`](Self::woke); on [`SleepCheck::Work`] it processes the ring.
    pub fn prepare_sleep(&mut self, now_ns: u64) -> SleepCheck {
        self.state.prepare_sleep(&mut self.consumer, now_ns)
    }

    /// The caller woke from its eventfd: clears NEED_WAKEUP. The idle
    /// period goes on until the next [`Poll::Work`], so the gap recorded
    /// then includes the sleep.
    pub fn woke(&mut self) {
        self.state.woke(&mut self.consumer);
    }

    /// Another poller of the same thread found work before the thread
    /// slept: clears NEED_WAKEUP without counting a sleep.
    pub fn cancel_sleep(&mut self) {
        self.state.cancel_sleep(&mut self.consumer);
    }

    /// Work arrived that the caller found some other way than through the
    /// watch (a submitting job that also polls its used ring): records the
    /// arrival gap as [`Poll::Work`] would, so the spin window keeps
    /// learning.
    pub fn found_elsewhere(&mut self, now_ns: u64) {
        self.state.found_elsewhere(now_ns);
    }

    /// A pass that looked at the ring instead of the doorbell and found
    /// nothing (see [`PollState::looked_elsewhere`]).
    pub fn looked_elsewhere(&mut self, now_ns: u64) -> Poll {
        self.state.looked_elsewhere(now_ns)
    }

    /// Counts requests completed (device) or completions handled (driver).
    pub fn count_completions(&mut self, n: u64) {
        self.state.count_completions(n);
    }

    /// Counts a notification sent to the other side (kick or call).
    pub fn count_wakeup(&mut self) {
        self.state.count_wakeup();
    }

    /// Counters and current spin figures.
    pub fn stats(&self) -> QueueStats {
        self.state.stats()
    }

    /// What is watched.
    pub fn watch(&self) -> &W {
        &self.consumer
    }

    /// What is watched, mutably.
    pub fn watch_mut(&mut self) -> &mut W {
        &mut self.consumer
    }

    /// The decisions and counters, without the watch.
    pub fn state(&self) -> &PollState {
        &self.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CqConsumer, CqProducer, Doorbell, SpinConfig, Wake};

    fn policy(window: u64) -> SpinPolicy {
        SpinPolicy::new(SpinConfig {
            min_ns: 0,
            max_ns: 1_000_000,
            initial_ns: window,
            factor: 1,
            wake_ns: 0,
            floor_ns: 0,
        })
        .unwrap()
    }

    #[test]
    fn spins_for_the_window_then_expires() {
        let bell = Doorbell::new();
        let mut p = Poller::new(CqConsumer::new(&bell, 0), policy(1000), 3);
        assert_eq!(p.poll(5_000), Poll::Idle);
        assert_eq!(p.poll(5_999), Poll::Idle);
        assert_eq!(p.poll(6_000), Poll::Expired);
        assert_eq!(p.stats().spins, 3);
        assert_eq!(p.stats().queue, 3);
    }

    #[test]
    fn work_records_the_gap_since_the_first_empty_poll() {
        let bell = Doorbell::new();
        let mut producer = CqProducer::new(&bell);
        let mut p = Poller::new(CqConsumer::new(&bell, 0), policy(1000), 0);
        assert_eq!(p.poll(10_000), Poll::Idle);
        let _ = producer.publish(1);
        assert_eq!(p.poll(10_800), Poll::Work(1));
        // The EMA starts at initial / factor = 1000 and moves 1/8 of the
        // way to the 800 ns gap: 975.
        let ema = p.stats().ema_ns;
        assert_eq!(ema, 975);
        // Work found without an empty poll first records no gap.
        let _ = producer.publish(2);
        assert_eq!(p.poll(50_000), Poll::Work(2));
        assert_eq!(p.stats().ema_ns, ema);
    }

    #[test]
    fn a_poller_watching_the_ring_reads_the_doorbell_only_to_sleep() {
        let bell = Doorbell::new();
        let mut producer = CqProducer::new(&bell);
        let mut p = Poller::new(CqConsumer::new(&bell, 0), policy(1000), 0);
        // Completions 1..=3 published; the consumer took them from the
        // ring, never reading `cq.idx`: its passes only count the window.
        for i in 1..=3 {
            let _ = producer.publish(i);
        }
        assert_eq!(p.looked_elsewhere(100), Poll::Idle);
        assert_eq!(p.looked_elsewhere(1_099), Poll::Idle);
        assert_eq!(p.looked_elsewhere(1_100), Poll::Expired);
        assert_eq!(p.watch().seen(), 0, "the doorbell was not read");
        // Before the re-check it says what it took: `cq.idx` = 3 is then
        // nothing new, and it may sleep.
        p.watch_mut().acted_on(3);
        assert_eq!(p.prepare_sleep(1_100), SleepCheck::Sleep);
        assert_eq!(producer.publish(4), Wake::Owed, "the flag is set");
        p.woke();
        // A doorbell behind what was taken (the producer has not stored
        // it yet) reads as work: one more window, never a lost wakeup.
        p.watch_mut().acted_on(5);
        assert_eq!(p.prepare_sleep(1_200), SleepCheck::Work(4));
    }

    #[test]
    fn sleep_wake_cycle_sets_and_clears_need_wakeup() {
        let bell = Doorbell::new();
        let mut producer = CqProducer::new(&bell);
        let mut p = Poller::new(CqConsumer::new(&bell, 0), policy(0), 0);
        assert_eq!(p.poll(0), Poll::Expired);
        assert_eq!(p.prepare_sleep(0), SleepCheck::Sleep);
        assert_eq!(producer.publish(1), Wake::Owed);
        p.woke();
        assert_eq!(producer.publish(2), Wake::NotOwed);
        assert_eq!(p.poll(1), Poll::Work(2));
        assert_eq!(p.stats().sleeps, 1);
    }

    #[test]
    fn cancelled_sleep_is_not_counted_and_clears_the_flag() {
        let bell = Doorbell::new();
        let mut producer = CqProducer::new(&bell);
        let mut p = Poller::new(CqConsumer::new(&bell, 0), policy(0), 0);
        assert_eq!(p.prepare_sleep(0), SleepCheck::Sleep);
        p.cancel_sleep();
        assert_eq!(p.stats().sleeps, 0);
        assert_eq!(producer.publish(1), Wake::NotOwed);
    }

    #[test]
    fn work_found_while_preparing_to_sleep_is_returned() {
        let bell = Doorbell::new();
        let mut producer = CqProducer::new(&bell);
        let mut p = Poller::new(CqConsumer::new(&bell, 0), policy(0), 0);
        assert_eq!(p.poll(0), Poll::Expired);
        let _ = producer.publish(9);
        assert_eq!(p.prepare_sleep(10), SleepCheck::Work(9));
        assert_eq!(p.stats().sleeps, 0);
        assert_eq!(producer.publish(10), Wake::NotOwed);
    }

    #[test]
    fn counters_accumulate() {
        let bell = Doorbell::new();
        let mut p = Poller::new(CqConsumer::new(&bell, 0), SpinPolicy::default(), 0);
        p.count_completions(5);
        p.count_completions(2);
        p.count_wakeup();
        assert_eq!((p.stats().completions, p.stats().wakeups), (7, 1));
        assert_eq!(p.stats().interval_ns, SpinPolicy::default().window_ns());
    }

    /// A ring the caller owns, with its own index and an "armed" flag,
    /// watched through a borrow that lives for one wait only.
    #[derive(Default)]
    struct Ring {
        idx: u16,
        consumed: u16,
        armed: bool,
    }

    struct RingView<'a>(&'a mut Ring);

    impl Watch for RingView<'_> {
        fn poll(&mut self) -> Option<u16> {
            (self.0.idx != self.0.consumed).then_some(self.0.idx)
        }
        fn prepare_sleep(&mut self) -> SleepCheck {
            self.0.armed = true;
            match self.poll() {
                Some(idx) => {
                    self.0.armed = false;
                    SleepCheck::Work(idx)
                }
                None => SleepCheck::Sleep,
            }
        }
        fn finish_sleep(&mut self) {
            self.0.armed = false;
        }
    }

    #[test]
    fn poll_state_keeps_its_window_across_borrowed_watches() {
        let mut ring = Ring::default();
        let mut state = PollState::new(policy(1000), 4);
        // First wait: two empty polls, then work 600 ns after the first.
        assert_eq!(state.poll(&mut RingView(&mut ring), 0), Poll::Idle);
        assert_eq!(state.poll(&mut RingView(&mut ring), 300), Poll::Idle);
        ring.idx = 1;
        assert_eq!(state.poll(&mut RingView(&mut ring), 600), Poll::Work(1));
        // The owner consumes the entry between two waits.
        ring.consumed = 1;
        // EMA 1000 moves 1/8 of the way to 600: 950.
        assert_eq!(state.stats().ema_ns, 950);
        assert_eq!((state.stats().spins, state.stats().queue), (2, 4));
        // Second wait, through a fresh borrow: the idle period starts anew.
        assert_eq!(state.poll(&mut RingView(&mut ring), 10_000), Poll::Idle);
        assert_eq!(state.poll(&mut RingView(&mut ring), 20_000), Poll::Expired);
    }

    #[test]
    fn poll_state_sleep_cycle_arms_and_disarms_the_watch() {
        let mut ring = Ring::default();
        let mut state = PollState::new(policy(0), 0);
        assert_eq!(state.poll(&mut RingView(&mut ring), 0), Poll::Expired);
        assert_eq!(
            state.prepare_sleep(&mut RingView(&mut ring), 0),
            SleepCheck::Sleep
        );
        assert!(ring.armed);
        ring.idx = 1;
        state.woke(&mut RingView(&mut ring));
        assert!(!ring.armed);
        assert_eq!(state.poll(&mut RingView(&mut ring), 5), Poll::Work(1));
        assert_eq!(state.stats().sleeps, 1);
        // Work found by the re-check disarms and counts no sleep.
        ring.consumed = 1;
        ring.idx = 2;
        assert_eq!(
            state.prepare_sleep(&mut RingView(&mut ring), 9),
            SleepCheck::Work(2)
        );
        assert!(!ring.armed);
        assert_eq!(state.stats().sleeps, 1);
        // A cancelled sleep disarms and is not counted.
        ring.consumed = 2;
        assert_eq!(
            state.prepare_sleep(&mut RingView(&mut ring), 9),
            SleepCheck::Sleep
        );
        state.cancel_sleep(&mut RingView(&mut ring));
        assert!(!ring.armed);
        assert_eq!(state.stats().sleeps, 1);
    }

    #[test]
    fn poller_is_poll_state_with_an_owned_watch() {
        let bell = Doorbell::new();
        let mut producer = CqProducer::new(&bell);
        let mut poller = Poller::new(CqConsumer::new(&bell, 0), policy(1000), 2);
        let mut consumer = CqConsumer::new(&bell, 0);
        let mut state = PollState::new(policy(1000), 2);
        for (now, publish) in [(0, None), (400, Some(1)), (900, None), (5_000, None)] {
            if let Some(idx) = publish {
                let _ = producer.publish(idx);
            }
            assert_eq!(poller.poll(now), state.poll(&mut consumer, now));
        }
        assert_eq!(poller.stats(), state.stats());
        assert_eq!(poller.state().stats(), state.stats());
    }

    #[test]
    fn found_elsewhere_records_the_gap_only_after_an_empty_poll() {
        let mut ring = Ring::default();
        let mut state = PollState::new(policy(1000), 0);
        state.found_elsewhere(50);
        assert_eq!(state.stats().ema_ns, 1000);
        assert_eq!(state.poll(&mut RingView(&mut ring), 100), Poll::Idle);
        state.found_elsewhere(900);
        // 1000 - (1000 - 800) / 8 = 975.
        assert_eq!(state.stats().ema_ns, 975);
    }
}
