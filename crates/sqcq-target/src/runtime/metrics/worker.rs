//! The figures of one worker thread: how often its loop woke, how its
//! poll loop gave the CPU away, and its CPU time (read from the thread's
//! CPU clock when asked, so the loop pays nothing for it).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde::Serialize;
use sqcq_protocol::yielder::Yielder;

use super::add;
use crate::runtime::pass;

/// One worker's figures, made on the worker's own thread
/// (`StatsBoard::enter_worker`) and kept while
/// it runs.
#[derive(Debug)]
pub struct WorkerMetrics {
    id: usize,
    wakeups: AtomicU64,
    /// The poll loop's [`Yielder`] figures, as of its last turn.
    yields: AtomicU64,
    contested_yields: AtomicU64,
    long_yields: AtomicU64,
    handover_sleeps: AtomicU64,
    /// A bound worker runs off its CPU now (`runtime::cpu::CpuWatch`).
    cpu_displaced: AtomicBool,
    /// Times it was found off its CPU.
    cpu_displacements: AtomicU64,
    /// The thread's CPU-time clock (`pthread_getcpuclockid`).
    cpu_clock: Option<libc::clockid_t>,
}

impl WorkerMetrics {
    /// The figures of worker `id`, which is the calling thread: it is
    /// marked as that worker ([`pass::enter_worker`]) and its first pass
    /// begins.
    pub(crate) fn on_this_thread(id: usize) -> Self {
        pass::enter_worker(id);
        pass::begin();
        let mut clock: libc::clockid_t = 0;
        // SAFETY: no argument, no precondition.
        let this = unsafe { libc::pthread_self() };
        // SAFETY: `this` is the calling thread, and `clock` a valid place
        // for the result.
        let rc = unsafe { libc::pthread_getcpuclockid(this, &raw mut clock) };
        WorkerMetrics {
            id,
            wakeups: AtomicU64::new(0),
            yields: AtomicU64::new(0),
            contested_yields: AtomicU64::new(0),
            long_yields: AtomicU64::new(0),
            handover_sleeps: AtomicU64::new(0),
            cpu_displaced: AtomicBool::new(false),
            cpu_displacements: AtomicU64::new(0),
            cpu_clock: (rc == 0).then_some(clock),
        }
    }

    /// The worker's number.
    pub fn id(&self) -> usize {
        self.id
    }

    /// The worker's loop woke (from `epoll_wait`): a new pass begins.
    /// Called by the worker only.
    pub(crate) fn woke(&self) {
        add(&self.wakeups, 1);
        pass::begin();
    }

    /// Takes in the poll loop's yield figures (after a turn of it).
    /// Called by the worker only.
    pub(crate) fn yielded(&self, yielder: &Yielder) {
        let (yields, contested) = yielder.yields();
        let (long, sleeps) = yielder.hogged();
        self.yields.store(yields, Ordering::Relaxed);
        self.contested_yields.store(contested, Ordering::Relaxed);
        self.long_yields.store(long, Ordering::Relaxed);
        self.handover_sleeps.store(sleeps, Ordering::Relaxed);
    }

    /// A check of the worker's CPU found it moved off its CPU (counted
    /// once per move) and `displaced` now, or back on it. Called by the
    /// worker only.
    pub(crate) fn cpu_moved(&self, displaced: bool) {
        let was = self.cpu_displaced.swap(displaced, Ordering::Relaxed);
        if displaced && !was {
            add(&self.cpu_displacements, 1);
        }
    }

    /// A move that the same check undid (the CPU went and came back
    /// between two checks). Called by the worker only.
    pub(crate) fn cpu_moved_and_back(&self) {
        add(&self.cpu_displacements, 1);
    }

    /// The figures as they are; `queues` is how many queues the worker
    /// serves now.
    pub fn snapshot(&self, queues: usize) -> WorkerSnapshot {
        WorkerSnapshot {
            worker: self.id,
            queues,
            wakeups: self.wakeups.load(Ordering::Relaxed),
            yields: self.yields.load(Ordering::Relaxed),
            contested_yields: self.contested_yields.load(Ordering::Relaxed),
            long_yields: self.long_yields.load(Ordering::Relaxed),
            handover_sleeps: self.handover_sleeps.load(Ordering::Relaxed),
            cpu_displaced: self.cpu_displaced.load(Ordering::Relaxed),
            cpu_displacements: self.cpu_displacements.load(Ordering::Relaxed),
            cpu_ns: self.cpu_clock.and_then(cpu_time_ns),
        }
    }
}

/// The time on a thread CPU clock; `None` if the thread is gone.
fn cpu_time_ns(clock: libc::clockid_t) -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; an invalid clock (the
    // thread ended) only makes the call fail.
    if unsafe { libc::clock_gettime(clock, &raw mut ts) } != 0 {
        return None;
    }
    let secs = u64::try_from(ts.tv_sec).ok()?;
    let nanos = u64::try_from(ts.tv_nsec).ok()?;
    secs.checked_mul(1_000_000_000)?.checked_add(nanos)
}

/// One worker's figures at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct WorkerSnapshot {
    /// Worker number.
    pub worker: usize,
    /// Request queues it serves now.
    pub queues: usize,
    /// Times its loop woke from `epoll_wait` (events, a timeout, or a
    /// poll turn that found its queues busy).
    pub wakeups: u64,
    /// `sched_yield`s of its poll loop (`sqcq_protocol::yielder`).
    pub yields: u64,
    /// Of those, the ones that ran another thread.
    pub contested_yields: u64,
    /// Of those, the ones that lost the CPU for a time slice
    /// ([`sqcq_protocol::yielder::HOGGED_NS`] or more): a thread that
    /// never yields shares the worker's CPU.
    pub long_yields: u64,
    /// Sleeps of [`sqcq_protocol::yielder::SLEEP_NS`] its poll loop took
    /// after a yield that came back at once, beside such a thread.
    pub handover_sleeps: u64,
    /// Whether the worker, bound to a CPU (`--poll-cpus`), runs off it
    /// now: the CPU went offline or left the daemon's cpuset.
    pub cpu_displaced: bool,
    /// Times the worker was found moved off its CPU.
    pub cpu_displacements: u64,
    /// CPU time of the thread, ns (`None` if it could not be read).
    pub cpu_ns: Option<u64>,
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn a_worker_counts_its_wakeups_and_its_cpu_time() {
        let m = std::thread::spawn(|| {
            let m = WorkerMetrics::on_this_thread(2);
            assert_eq!(pass::worker(), Some(2));
            m.woke();
            m.woke();
            let mut y = Yielder::new();
            for _ in 0..sqcq_protocol::yielder::MIN_IDLE {
                y.idle();
            }
            m.yielded(&y);
            // Burn CPU until the thread's clock shows 1 ms: counted in
            // CPU time, not in wall time, which a preempted thread spends
            // without running.
            let deadline = Instant::now() + Duration::from_secs(20);
            while m.snapshot(3).cpu_ns.unwrap() < 1_000_000 {
                assert!(Instant::now() < deadline, "the CPU clock does not move");
                std::hint::spin_loop();
            }
            let s = m.snapshot(3);
            assert_eq!((s.worker, s.queues, s.wakeups), (2, 3, 2));
            assert_eq!(s.yields, 1, "the loop's yield is taken in");
            assert_eq!(s.handover_sleeps, 0);
            m
        })
        .join()
        .unwrap();
        // A joined thread's CPU clock goes a moment after the join
        // returns (the kernel releases the task after waking the joiner).
        let deadline = Instant::now() + Duration::from_secs(20);
        while m.snapshot(0).cpu_ns.is_some() {
            assert!(Instant::now() < deadline, "the thread's clock outlives it");
            std::thread::yield_now();
        }
    }
}
