//! The cost of waking a sleeping worker, measured once at start, and the
//! spin windows that follow from it.
//!
//! A ring-polled queue pays for a request either with the time its worker
//! spun until the request came, or, if the worker slept, with a wakeup:
//! an eventfd signal, the scheduler, and on a virtual machine an IPI and
//! the vCPU leaving halt. Spinning pays while the gaps between requests
//! are shorter than that. The wakeup's cost differs by an order of
//! magnitude between machines (bare metal against a small cloud VM whose
//! vCPUs halt) and between CPU models, so one fixed spin bound is
//! either too short for one machine or wasteful on another. The daemon
//! measures it instead (no library does this; crosvm, QEMU and SPDK take
//! a fixed poll time from the operator).
//!
//! How: a thread blocks reading an eventfd; another, on a different CPU
//! where the affinity allows one, reads the clock and writes the eventfd;
//! the woken thread reads the clock again. A pause before each sample
//! lets the sleeper's CPU go idle, as a worker's does between two
//! requests of a trickling queue. The cost is the median sample of a
//! round, the smallest of [`ROUNDS`] rounds: on a virtual machine a
//! round can fall in a moment when the host runs something else, and
//! its wakeups then cost many times the usual (docs/benchmarks.md and
//! docs/target.md give the figures measured).
//!
//! The bound: with an unmodified guest the load that matters most is a
//! synchronous one (QD1: the guest waits, asleep, for each completion),
//! where the gap between a completion and the next request is one wakeup
//! of the guest's thread plus its own work. The window must reach past
//! that gap for polling to catch the next request, so `--poll auto`
//! spins up to [`AUTO_SPIN_FACTOR`] wakeups, within
//! [[`AUTO_SPIN_MIN_BOUND`], [`AUTO_SPIN_MAX_BOUND`]]. Beyond it a
//! request costs a wakeup whether the worker spun or not, and the
//! adaptive window (`sqcq_protocol::SpinPolicy`) stops spinning: the
//! queue is then served by kicks.
//!
//! Getting back: a worker that slept notices a request a wakeup after it
//! came, so a gap that ends in a wakeup looks a wakeup longer than it
//! was. Counted whole, a synchronous guest's gaps (one wakeup) look like
//! two once its worker slept, which is the bound: such a queue could stay
//! on kicks for good. Counted without the whole wakeup, a trickle just
//! inside the bound would be polled, at up to twice a wakeup's CPU per
//! request. Half a wakeup is taken off ([`auto_wake_credit`]): a queue
//! starts polling when its gaps fall under one and a half wakeups and
//! stops when they pass two, a hysteresis that keeps the synchronous
//! guest polled and a trickle of one request per 1.5 to 2 wakeups on
//! kicks.
//!
//! The floor (every polled queue, ring-polled or with bit 42): while a
//! queue is busy its window is never shorter than one wakeup (`SpinConfig::floor_ns`). A
//! pause of the driver shorter than a wakeup costs less spun through
//! than slept through; at depth 1, without the floor, the window is 4
//! times a gap of about a microsecond and every timer tick of the driver
//! cost a kick and a wakeup (docs/target.md gives the figures).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use vmm_sys_util::eventfd::{EFD_SEMAPHORE, EventFd};

use crate::runtime::cpu::{allowed_cpus, bind_current_thread};
use crate::runtime::options::MAX_CPU;
use crate::runtime::pass::now_ns;

/// Samples of a round; its figure is their median.
const SAMPLES: usize = 31;

/// Rounds; the cost is the smallest of their medians.
const ROUNDS: usize = 3;

/// Pause before each sample: long enough for the sleeper's CPU to leave
/// any idle polling (a Linux guest's haltpoll polls up to 200 µs) and
/// halt.
const PAUSE: Duration = Duration::from_micros(500);

/// How long the waker waits for one wakeup before it counts the sample
/// as this long.
const SAMPLE_LIMIT: Duration = Duration::from_millis(100);

/// The spin bound of `--poll auto` in wakeups.
pub const AUTO_SPIN_FACTOR: u32 = 2;

/// The spin bound of `--poll auto` is at least this (a machine whose
/// wakeups cost almost nothing still gets a window that catches a
/// request made right after a completion).
pub const AUTO_SPIN_MIN_BOUND: Duration = Duration::from_micros(10);

/// The spin bound of `--poll auto` is at most this (the default bound of
/// `--poll ring`).
pub const AUTO_SPIN_MAX_BOUND: Duration = Duration::from_micros(200);

/// `--poll auto` takes 1/`AUTO_WAKE_CREDIT` of a wakeup off a gap that
/// ended in one (`SpinConfig::wake_ns`).
pub const AUTO_WAKE_CREDIT: u32 = 2;

/// What `--poll auto` takes off a gap that ended in a wakeup costing
/// `wakeup`.
pub fn auto_wake_credit(wakeup: Duration) -> Duration {
    wakeup / AUTO_WAKE_CREDIT
}

/// The spin bound of `--poll auto` on a machine whose wakeups cost
/// `wakeup`.
pub fn auto_spin_bound(wakeup: Duration) -> Duration {
    wakeup
        .saturating_mul(AUTO_SPIN_FACTOR)
        .clamp(AUTO_SPIN_MIN_BOUND, AUTO_SPIN_MAX_BOUND)
}

/// Measures the cost of waking a thread blocked on an eventfd from
/// another CPU (about 50 ms in all; see the module's documentation). The
/// sleeper runs on `sleeper_cpu` if the daemon may use it (the first
/// worker's CPU), else on the first allowed CPU; the waker, like a
/// guest's vCPU, on another CPU: one the daemon may use, else any other
/// the cpuset allows (a daemon confined with `taskset` to one CPU is
/// still kicked from others). With no other CPU both share one, and the
/// figure is a context switch.
pub fn measure(sleeper_cpu: Option<usize>) -> io::Result<Duration> {
    let allowed = allowed_cpus()?;
    let sleeper = sleeper_cpu
        .filter(|c| allowed.contains(c))
        .or_else(|| allowed.first().copied());
    // SAFETY: sysconf reads a system setting; no memory is passed.
    let configured = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    let configured = usize::try_from(configured).unwrap_or(0).min(MAX_CPU + 1);
    let others: Vec<usize> = (allowed.iter().copied())
        .chain((0..configured).filter(|c| !allowed.contains(c)))
        .filter(|&c| Some(c) != sleeper)
        .collect();
    // One read per write, whatever the interleaving: the sleeper reads
    // exactly as many times as the waker writes, and never blocks for
    // good.
    let efd = EventFd::new(EFD_SEMAPHORE)?;
    let woke = AtomicU64::new(0);
    let samples = std::thread::scope(|s| -> io::Result<Vec<u64>> {
        let sleeping = std::thread::Builder::new()
            .name("sqcq-wakecal".into())
            .spawn_scoped(s, || -> io::Result<()> {
                if let Some(c) = sleeper.filter(|_| !others.is_empty()) {
                    bind_current_thread(c)?;
                }
                for _ in 0..ROUNDS * SAMPLES {
                    efd.read()?;
                    // The stamp is the only data passed, nothing else is
                    // published with it (Relaxed would do); Release pairs
                    // with the waker's Acquire load of it.
                    woke.store(now_ns(), Ordering::Release);
                }
                Ok(())
            })?;
        let waking = std::thread::Builder::new()
            .name("sqcq-wakecal".into())
            .spawn_scoped(s, || wake(&efd, &woke, &others))?;
        let samples = waking.join().map_err(|_| panicked())?;
        sleeping.join().map_err(|_| panicked())??;
        samples
    })?;
    let cost = (samples.chunks(SAMPLES).map(median))
        .min()
        .unwrap_or_default();
    Ok(Duration::from_nanos(cost))
}

/// The median of `round`.
fn median(round: &[u64]) -> u64 {
    let mut r = round.to_vec();
    r.sort_unstable();
    r.get(r.len() / 2).copied().unwrap_or_default()
}

/// The waker's side of [`measure`]: binds to the first of `cpus` it may
/// use, then writes the eventfd for every sample of every round and
/// times each wakeup.
fn wake(efd: &EventFd, woke: &AtomicU64, cpus: &[usize]) -> io::Result<Vec<u64>> {
    let apart = cpus.iter().any(|&c| bind_current_thread(c).is_ok());
    let limit = crate::runtime::pass::nanos(SAMPLE_LIMIT);
    let mut samples = Vec::with_capacity(ROUNDS * SAMPLES);
    for _ in 0..ROUNDS * SAMPLES {
        std::thread::sleep(PAUSE);
        let start = now_ns();
        efd.write(1)?;
        let sample = loop {
            // A stamp from before `start` is the previous sample's (or a
            // late wakeup of one that reached its limit): not this one.
            let t = woke.load(Ordering::Acquire);
            if t > start {
                break t - start;
            }
            if now_ns().saturating_sub(start) > limit {
                // The sleeper still reads this write later (a semaphore
                // eventfd), before it reads the next.
                break limit;
            }
            if apart {
                std::hint::spin_loop();
            } else {
                // Maybe on the sleeper's CPU: let it run.
                std::thread::yield_now();
            }
        };
        samples.push(sample);
    }
    Ok(samples)
}

fn panicked() -> io::Error {
    io::Error::other("a wakeup calibration thread panicked")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_is_twice_the_wakeup_within_limits() {
        let us = Duration::from_micros;
        assert_eq!(auto_spin_bound(us(25)), us(50));
        assert_eq!(auto_spin_bound(us(1)), AUTO_SPIN_MIN_BOUND);
        assert_eq!(auto_spin_bound(us(150)), AUTO_SPIN_MAX_BOUND);
        assert_eq!(auto_spin_bound(Duration::MAX), AUTO_SPIN_MAX_BOUND);
    }

    #[test]
    fn a_round_is_its_median() {
        assert_eq!(median(&[5, 1, 900, 3, 4]), 4);
        assert_eq!(median(&[]), 0);
    }

    #[test]
    fn measures_a_wakeup() {
        let cost = measure(None).unwrap();
        assert!(cost > Duration::ZERO, "a wakeup takes time");
        assert!(cost < SAMPLE_LIMIT, "the median sample is a real wakeup");
    }
}
