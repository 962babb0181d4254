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
//! owns the decisions and the counters, so that the device's poll threads
//! and the driver's poll thread behave alike. One thread may drive several
//! pollers (a worker serving several virtqueues, a per-device driver poll
//! thread): it sleeps only when every poller's window has expired and
//! every one of them answered [`SleepCheck::Sleep`] to
//! [`Poller::prepare_sleep`]; if one found work, it calls
//! [`Poller::cancel_sleep`] on the others and goes on.
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
use crate::spin::SpinPolicy;
use crate::stats::QueueStats;

/// What one look at the doorbell found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Poll {
    /// The index moved: process the ring.
    Work(u16),
    /// Nothing new, and the spin window still runs: look again.
    Idle,
    /// Nothing new, and the spin window is over: call
    /// [`Poller::prepare_sleep`].
    Expired,
}

/// One consumer's poll state: what it watches, the adaptive spin window
/// and the statistics.
pub struct Poller<W> {
    consumer: W,
    spin: SpinPolicy,
    stats: QueueStats,
    idle_since: Option<u64>,
}

impl<W: core::fmt::Debug> core::fmt::Debug for Poller<W> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Poller")
            .field("consumer", &self.consumer)
            .field("stats", &self.stats)
            .finish()
    }
}

impl<W: Watch> Poller<W> {
    /// A poller over `consumer` for virtqueue `queue`.
    pub fn new(consumer: W, spin: SpinPolicy, queue: u16) -> Self {
        let stats = QueueStats {
            queue,
            ..QueueStats::default()
        };
        Poller {
            consumer,
            spin,
            stats,
            idle_since: None,
        }
    }

    /// Looks at the doorbell once. `now_ns` is any monotonic clock in
    /// nanoseconds.
    pub fn poll(&mut self, now_ns: u64) -> Poll {
        if let Some(idx) = self.consumer.poll() {
            self.arrived(now_ns);
            return Poll::Work(idx);
        }
        let since = *self.idle_since.get_or_insert(now_ns);
        self.stats.spins += 1;
        if now_ns.saturating_sub(since) < self.spin.window_ns() {
            Poll::Idle
        } else {
            Poll::Expired
        }
    }

    /// The window expired: sets NEED_WAKEUP and re-checks. On
    /// [`SleepCheck::Sleep`] the caller sleeps on the eventfd and then calls
    /// [`woke`](Self::woke); on [`SleepCheck::Work`] it processes the ring.
    pub fn prepare_sleep(&mut self, now_ns: u64) -> SleepCheck {
        self.spin.record_miss();
        let check = self.consumer.prepare_sleep();
        match check {
            SleepCheck::Work(_) => self.arrived(now_ns),
            SleepCheck::Sleep => self.stats.sleeps += 1,
        }
        check
    }

    /// The caller woke from its eventfd: clears NEED_WAKEUP. The idle
    /// period goes on until the next [`Poll::Work`], so the gap recorded
    /// then includes the sleep.
    pub fn woke(&mut self) {
        self.consumer.finish_sleep();
    }

    /// Another poller of the same thread found work before the thread
    /// slept: clears NEED_WAKEUP without counting a sleep.
    pub fn cancel_sleep(&mut self) {
        self.consumer.finish_sleep();
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

    /// What is watched.
    pub fn watch(&self) -> &W {
        &self.consumer
    }

    /// What is watched, mutably.
    pub fn watch_mut(&mut self) -> &mut W {
        &mut self.consumer
    }

    fn arrived(&mut self, now_ns: u64) {
        if let Some(since) = self.idle_since.take() {
            self.spin.record_gap(now_ns.saturating_sub(since));
        }
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
}
