//! When a spinning poll loop gives its CPU away.
//!
//! A poll loop that finds nothing yields the CPU now and then: on a
//! machine with more runnable threads than CPUs (2 CPUs, a device worker,
//! a driver job and its poll thread) the thread that will write the index
//! it watches may be waiting for this very CPU. When nothing else wants
//! the CPU, though, each `sched_yield` is a system call for nothing (about
//! 0.8 us in a VM on this project's machine, a fifth of a poll thread's
//! time at depth 32), and SPDK's pollers never yield.
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

use crate::clock::now_ns;

/// Idle polls before a yield while yields are found useful.
pub const MIN_IDLE: u32 = 16;

/// Idle polls before a yield at most (after yields that found the CPU
/// free every time).
pub const MAX_IDLE: u32 = 1024;

/// A yield that took this long (ns) ran another thread: a round trip
/// through the scheduler and back, measured at about 3.9 us in a VM on
/// this project's machine against 0.8 us for a yield with nobody waiting.
pub const CONTESTED_NS: u64 = 2_000;

/// The yield decisions of one poll loop (see the module documentation).
#[derive(Clone, Debug)]
pub struct Yielder {
    every: u32,
    idle: u32,
    yields: u64,
    contested: u64,
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
        }
    }

    /// A poll found work: the idle count starts again.
    #[inline]
    pub fn busy(&mut self) {
        self.idle = 0;
    }

    /// A poll found nothing. Yields the CPU if that was the idle poll
    /// due for it, and returns whether it did.
    #[inline]
    pub fn idle(&mut self) -> bool {
        self.idle += 1;
        if self.idle < self.every {
            std::hint::spin_loop();
            return false;
        }
        let t0 = now_ns();
        std::thread::yield_now();
        self.yielded(now_ns().saturating_sub(t0));
        true
    }

    /// Learns from a yield that took `ns`.
    fn yielded(&mut self, ns: u64) {
        self.idle = 0;
        self.yields += 1;
        if ns >= CONTESTED_NS {
            self.contested += 1;
            self.every = MIN_IDLE;
        } else {
            self.every = (self.every * 2).min(MAX_IDLE);
        }
    }

    /// Idle polls before the next yield.
    pub fn interval(&self) -> u32 {
        self.every
    }

    /// Yields so far, and how many of them ran another thread.
    pub fn yields(&self) -> (u64, u64) {
        (self.yields, self.contested)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_cpu_stretches_the_interval_and_a_contested_yield_resets_it() {
        let mut y = Yielder::new();
        let mut seen = vec![y.interval()];
        for _ in 0..10 {
            y.yielded(100);
            seen.push(y.interval());
        }
        assert_eq!(
            seen,
            [16, 32, 64, 128, 256, 512, 1024, 1024, 1024, 1024, 1024]
        );
        y.yielded(CONTESTED_NS);
        assert_eq!(y.interval(), MIN_IDLE);
        assert_eq!(y.yields(), (11, 1));
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
