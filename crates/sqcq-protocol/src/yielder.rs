//! When a spinning poll loop gives its CPU away.
//!
//! A poll loop that finds nothing yields the CPU now and then: on a
//! machine with more runnable threads than CPUs (2 CPUs, a device worker,
//! a driver job and its poll thread) the thread that will write the index
//! it watches may be waiting for this very CPU. When nothing else wants
//! the CPU, though, each `sched_yield` is a system call for nothing, a
//! share of a poll thread's time at depth 32 that shows in profiles
//! (docs/benchmarks.md, "Both sides: yields"), and SPDK's pollers never
//! yield.
//!
//! [`Yielder`] learns which case it is in from the yields themselves. A
//! yield that comes back after [`CONTESTED_NS`] or more gave the CPU to
//! another thread: the next comes after [`MIN_IDLE`] idle polls again. A
//! yield that comes back sooner found nobody waiting: the next waits for
//! twice as many idle polls, up to [`MAX_IDLE`]. A poll that finds work
//! starts the count again, so a loop whose work keeps flowing does not
//! yield at all. The scheduler still preempts a spinner for a thread it
//! wakes, so the long interval only delays threads that were already
//! runnable, and only until the next yield finds them.
//!
//! ## A thread that never yields, on the same CPU
//!
//! A yield that comes back at once does not prove that nobody waits: the
//! fair scheduler (EEVDF, Linux 6.6 on) gives the CPU straight back to a
//! yielder it owes time, with another thread runnable beside it. Beside a
//! thread that never yields (an SPDK or DPDK reactor pinned to the CPU of
//! the worker serving its queue), the two settled into a pattern that
//! starved the reactor: it ran briefly, each time the poller's owed time
//! ran out, between long runs of the poller's yields. `bdevperf` against
//! `sqcqd --poll ring`, 2 queues on 2 CPUs, collapsed by two orders of
//! magnitude in some runs and stayed there; holding the interval at
//! [`MIN_IDLE`] did not get it out (docs/benchmarks.md, "A reactor on the
//! worker's CPU").
//!
//! Such a thread shows itself when a yield does reach it: it keeps the
//! CPU for a time slice ([`HOGGED_NS`] or more), and does so again and
//! again, many times a second. Threads that yield can do it too, now and
//! then, since under EEVDF their own yields come back at once while they
//! are owed time: a few times in a run of `sqcq-bench --mode sqcq` at
//! QD1, whose job, poll thread and our worker share 2 CPUs. A loop built
//! [`Yielder::handing_over`] (a device worker's, which serves drivers it
//! does not know) therefore waits for a run of [`HOG_RUN`] such yields,
//! each within [`HOG_GAP_NS`] of the one before; while the run lasts (the
//! last within that gap), a yield that comes back at once is followed by
//! a sleep of [`SLEEP_NS`]: the only hand-over the scheduler cannot
//! refuse, and whose wake-up preempts that thread when it ends. That
//! ends the collapse; sleeping after a single chance long yield instead
//! cost that `sqcq-bench` run most of its rate, hence the run. A poller
//! alone on its CPU never sees such a yield and never sleeps.
//!
//! The driver's loops never sleep: they share their CPU with each other
//! and with the worker, all of which yield.
//!
//! A thread's sleeps are as late as its timer slack allows (50 us by
//! default); a [`Yielder`] sets its thread's to [`TIMER_SLACK_NS`] before
//! its first sleep.

use crate::clock::now_ns;

/// Idle polls before a yield while yields are found useful.
pub const MIN_IDLE: u32 = 16;

/// Idle polls before a yield at most (after yields that found the CPU
/// free every time).
pub const MAX_IDLE: u32 = 1024;

/// A yield that took this long (ns) ran another thread: between a yield
/// with nobody waiting and a round trip through the scheduler and back
/// (both measured in docs/benchmarks.md, "Both sides: yields").
pub const CONTESTED_NS: u64 = 2_000;

/// A yield that took this long (ns) ran a thread that kept the CPU for
/// a time slice (which lasts longer than this), not one that yields back.
pub const HOGGED_NS: u64 = 500_000;

/// Yields of [`HOGGED_NS`] or more in a run, each within this long (ns)
/// of the one before, say that a thread that never yields shares the CPU
/// (beside a reactor several come within this gap).
pub const HOG_GAP_NS: u64 = 50_000_000;

/// Yields of [`HOGGED_NS`] or more in a run before a free yield is
/// followed by a sleep.
pub const HOG_RUN: u32 = 4;

/// How long a hand-over by sleep lasts (ns): long enough for the thread
/// that keeps the CPU to take a batch of completions and submit more,
/// short beside the slice it would otherwise keep (shorter and longer
/// sleeps: docs/benchmarks.md, "A reactor on the worker's CPU").
pub const SLEEP_NS: u64 = 20_000;

/// The timer slack (ns) a [`Yielder`] gives its thread before it first
/// sleeps, so that a sleep of [`SLEEP_NS`] is not stretched by the
/// default slack.
pub const TIMER_SLACK_NS: u64 = 1_000;

/// The yield decisions of one poll loop (see the module documentation).
#[derive(Clone, Debug)]
pub struct Yielder {
    every: u32,
    idle: u32,
    yields: u64,
    contested: u64,
    hogged: u64,
    sleeps: u64,
    /// Whether this loop may hand over by sleeping.
    may_sleep: bool,
    /// Yields of [`HOGGED_NS`] or more in the current run (each within
    /// [`HOG_GAP_NS`] of the one before), and until when (ns, [`now_ns`])
    /// the run lasts.
    hogs: u32,
    hold_until: u64,
    /// Whether this thread's timer slack is set.
    slack_set: bool,
}

impl Default for Yielder {
    fn default() -> Self {
        Self::new()
    }
}

impl Yielder {
    /// A loop that yields after [`MIN_IDLE`] idle polls until it learns
    /// otherwise.
    pub const fn new() -> Self {
        Yielder {
            every: MIN_IDLE,
            idle: 0,
            yields: 0,
            contested: 0,
            hogged: 0,
            sleeps: 0,
            may_sleep: false,
            hogs: 0,
            hold_until: 0,
            slack_set: false,
        }
    }

    /// A loop that also hands the CPU over by sleeping beside a thread
    /// that never yields (see the module documentation): a device
    /// worker's.
    pub const fn handing_over() -> Self {
        let mut y = Self::new();
        y.may_sleep = true;
        y
    }

    /// A poll found work: the idle count starts again.
    #[inline]
    pub fn busy(&mut self) {
        self.idle = 0;
    }

    /// A poll found nothing. Yields the CPU (and sleeps, see the module
    /// documentation) if that was the idle poll due for it, and returns
    /// whether it did.
    #[inline]
    pub fn idle(&mut self) -> bool {
        self.idle += 1;
        if self.idle < self.every {
            std::hint::spin_loop();
            return false;
        }
        let t0 = now_ns();
        std::thread::yield_now();
        let t1 = now_ns();
        if self.yielded(t1, t1.saturating_sub(t0)) {
            self.sleep();
        }
        true
    }

    /// Learns from a yield that ended at `now` and took `ns`; returns
    /// whether the CPU must be handed over by a sleep.
    fn yielded(&mut self, now: u64, ns: u64) -> bool {
        self.idle = 0;
        self.yields += 1;
        if ns >= HOGGED_NS {
            self.hogged += 1;
            self.hogs = if now < self.hold_until {
                self.hogs + 1
            } else {
                1
            };
            self.hold_until = now.saturating_add(HOG_GAP_NS);
        }
        if ns >= CONTESTED_NS {
            self.contested += 1;
            self.every = MIN_IDLE;
            false
        } else if self.may_sleep && self.hogs >= HOG_RUN && now < self.hold_until {
            // A thread that keeps the CPU was seen, and this yield did
            // not run it.
            self.sleeps += 1;
            true
        } else {
            self.every = (self.every * 2).min(MAX_IDLE);
            false
        }
    }

    #[cold]
    fn sleep(&mut self) {
        if !self.slack_set {
            self.slack_set = true;
            // SAFETY: PR_SET_TIMERSLACK takes a value and touches no
            // memory. A failure (a seccomp filter) leaves the default
            // slack: sleeps are longer, nothing else changes.
            unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, TIMER_SLACK_NS, 0, 0, 0) };
        }
        std::thread::sleep(std::time::Duration::from_nanos(SLEEP_NS));
    }

    /// Idle polls before the next yield.
    pub fn interval(&self) -> u32 {
        self.every
    }

    /// Yields so far, and how many of them ran another thread.
    pub fn yields(&self) -> (u64, u64) {
        (self.yields, self.contested)
    }

    /// Yields so far that ran a thread for a whole time slice, and the
    /// sleeps that followed free yields after them.
    pub fn hogged(&self) -> (u64, u64) {
        (self.hogged, self.sleeps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_cpu_stretches_the_interval_and_a_contested_yield_resets_it() {
        let mut y = Yielder::new();
        let mut seen = vec![y.interval()];
        for t in 0..10 {
            assert!(!y.yielded(t * 1000, 100), "no sleep without a hog");
            seen.push(y.interval());
        }
        assert_eq!(
            seen,
            [16, 32, 64, 128, 256, 512, 1024, 1024, 1024, 1024, 1024]
        );
        assert!(!y.yielded(20_000, CONTESTED_NS));
        assert_eq!(y.interval(), MIN_IDLE);
        assert_eq!(y.yields(), (11, 1));
        assert_eq!(y.hogged(), (0, 0));
    }

    #[test]
    fn after_a_run_of_yields_that_lost_a_slice_free_yields_sleep_while_it_lasts() {
        let mut y = Yielder::handing_over();
        let mut t = 1_000_000_000;
        for i in 0..HOG_RUN {
            assert!(!y.yielded(t, HOGGED_NS), "a long yield itself ran it");
            assert_eq!(y.yielded(t + 1000, 100), i + 1 == HOG_RUN, "{i}");
            t += HOG_GAP_NS - 1;
        }
        t -= HOG_GAP_NS - 1;
        assert_eq!(y.interval(), MIN_IDLE, "a sleep does not stretch it");
        for i in 2..=3 {
            assert!(y.yielded(t + i * 1000, 100), "free yields sleep");
        }
        assert!(!y.yielded(t + 5000, CONTESTED_NS), "a contested one ran it");
        assert!(y.yielded(t + HOG_GAP_NS - 1, 100), "while the run lasts");
        assert!(!y.yielded(t + HOG_GAP_NS, 100), "then it is over");
        assert_eq!(y.interval(), 2 * MIN_IDLE, "and free yields stretch again");
        assert_eq!(y.hogged(), (u64::from(HOG_RUN), 4));
        assert_eq!(
            y.yields(),
            (2 * u64::from(HOG_RUN) + 5, u64::from(HOG_RUN) + 1)
        );
    }

    #[test]
    fn long_yields_too_few_too_far_apart_or_in_a_driver_loop_never_sleep() {
        let mut apart = Yielder::handing_over();
        let mut few = Yielder::handing_over();
        let mut driver = Yielder::new();
        for i in 0..u64::from(HOG_RUN) {
            let t = i * HOG_GAP_NS;
            assert!(!apart.yielded(t, HOGGED_NS));
            assert!(!apart.yielded(t + 1000, 100), "{HOG_GAP_NS} ns apart");
            let t = i * 1000;
            assert!(!driver.yielded(t, HOGGED_NS));
            assert!(!driver.yielded(t + 1, 100), "a driver loop");
            if i + 1 < u64::from(HOG_RUN) {
                assert!(!few.yielded(t, HOGGED_NS));
                assert!(!few.yielded(t + 1, 100), "{i} in a run");
            }
        }
        assert_eq!(apart.hogged().1 + driver.hogged().1 + few.hogged().1, 0);
    }

    #[test]
    fn work_restarts_the_count_and_idle_polls_yield_when_due() {
        let mut y = Yielder::new();
        for _ in 0..MIN_IDLE - 1 {
            assert!(!y.idle());
        }
        y.busy();
        for _ in 0..MIN_IDLE - 1 {
            assert!(!y.idle(), "the count started again");
        }
        assert!(y.idle(), "the 16th idle poll in a row yields");
        assert_eq!(y.yields().0, 1);
    }
}
