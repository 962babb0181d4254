//! The clock the poll loops of both sides feed to their pollers: a
//! nanosecond count read from the CPU's time-stamp counter where that is
//! safe, from `CLOCK_MONOTONIC` elsewhere.
//!
//! A poll loop reads the time once per pass, so the read is on the
//! request path; through `clock_gettime` it took a share of both sides'
//! CPU time that showed in profiles (docs/benchmarks.md, "Both sides: the
//! TSC clock"). SPDK's pollers and fio
//! (`clocksource=cpu`) read the TSC instead, and so does this clock when
//! the kernel itself does: the TSC is used only if the CPU says it is
//! invariant (CPUID 0x8000_0007 EDX bit 8: constant rate, runs in every
//! C-state) and the kernel chose `tsc` as its clocksource (so it found the
//! counters of all CPUs in step). Its rate is measured once against
//! `CLOCK_MONOTONIC` over [`CALIBRATION`], each end a TSC reading
//! bracketed by two monotonic ones, the narrowest of a few (so that a
//! preemption between the reads does not skew it); after that a read is
//! `rdtsc`, a subtraction and a 64x64-bit multiply. Anything else (another
//! architecture, a hypervisor clock, `SQCQ_CLOCK=monotonic` in the
//! environment) reads `CLOCK_MONOTONIC`, as before.
//!
//! The time is a count since the first call in the process, only ever
//! compared with other readings of this clock: spin windows, idle periods,
//! service times. A TSC rate measured 1e-4 off makes a 100 us window 10 ns
//! longer; nothing here needs better.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long the TSC's rate is measured for, once per process, at the
/// first reading.
pub const CALIBRATION: Duration = Duration::from_millis(5);

/// Which counter the clock reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The TSC, scaled by the rate measured at start.
    Tsc,
    /// `CLOCK_MONOTONIC` through `std::time::Instant`.
    Monotonic,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Source::Tsc => "tsc",
            Source::Monotonic => "monotonic",
        })
    }
}

#[derive(Debug)]
struct Clock {
    origin: Instant,
    tsc: Option<TscScale>,
}

/// `ns = base_ns + ((tsc - base_tsc) * mult) >> 32`.
#[derive(Clone, Copy, Debug)]
struct TscScale {
    base_tsc: u64,
    base_ns: u64,
    mult: u64,
}

impl TscScale {
    #[inline]
    fn ns(&self, tsc: u64) -> u64 {
        let ticks = u128::from(tsc.saturating_sub(self.base_tsc));
        let ns = (ticks * u128::from(self.mult)) >> 32;
        self.base_ns
            .saturating_add(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    /// The scale that maps `ticks` TSC ticks to `ns` nanoseconds, from
    /// `base_tsc` at `base_ns` on; `None` for a rate that makes no sense.
    fn measured(base_tsc: u64, base_ns: u64, ticks: u64, ns: u64) -> Option<TscScale> {
        if ticks == 0 || ns == 0 {
            return None;
        }
        let mult = (u128::from(ns) << 32) / u128::from(ticks);
        // Between 10 MHz and 100 GHz: anything else is not a clock.
        let mult = u64::try_from(mult)
            .ok()
            .filter(|m| (1u64 << 32) / 100 <= *m && *m <= 100u64 << 32)?;
        Some(TscScale {
            base_tsc,
            base_ns,
            mult,
        })
    }
}

#[inline]
fn clock() -> &'static Clock {
    static CLOCK: OnceLock<Clock> = OnceLock::new();
    CLOCK.get_or_init(|| {
        let origin = Instant::now();
        let tsc = (std::env::var_os("SQCQ_CLOCK").is_none_or(|v| v != "monotonic")
            && tsc::usable())
        .then(|| calibrate(origin))
        .flatten();
        Clock { origin, tsc }
    })
}

fn monotonic_ns(origin: Instant) -> u64 {
    u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Tries of [`paired`] at each end of the calibration.
const PAIR_TRIES: usize = 16;

fn calibrate(origin: Instant) -> Option<TscScale> {
    let (t0, c0) = paired(origin)?;
    let window = u64::try_from(CALIBRATION.as_nanos()).unwrap_or(u64::MAX);
    while monotonic_ns(origin).saturating_sub(t0) < window {
        std::hint::spin_loop();
    }
    let (t1, c1) = paired(origin)?;
    TscScale::measured(c1, t1, c1.checked_sub(c0)?, t1.checked_sub(t0)?)
}

/// The two counters read at one moment: a TSC reading between two
/// monotonic ones, the narrowest of [`PAIR_TRIES`], dated at the middle
/// of its bracket. Read one after the other, a preemption between the
/// two reads would date the TSC reading late by as long as it lasted,
/// and skew the rate measured over [`CALIBRATION`] with it
/// (docs/benchmarks.md, "The TSC clock's calibration"); a bracket that a
/// preemption widened is not the narrowest.
fn paired(origin: Instant) -> Option<(u64, u64)> {
    narrowest((0..PAIR_TRIES).map(|_| {
        let before = monotonic_ns(origin);
        let tsc = tsc::read();
        (before, tsc, monotonic_ns(origin))
    }))
}

/// Of `(before, tsc, after)` readings, the TSC reading whose bracket
/// `after - before` is narrowest, with the middle of that bracket; the
/// first of equals. `None` without a reading.
fn narrowest(readings: impl Iterator<Item = (u64, u64, u64)>) -> Option<(u64, u64)> {
    readings
        .map(|(before, tsc, after)| {
            let width = after.saturating_sub(before);
            (width, before.saturating_add(width / 2), tsc)
        })
        .min_by_key(|&(width, ..)| width)
        .map(|(_, ns, tsc)| (ns, tsc))
}

/// Nanoseconds since the first call in the process, never decreasing on
/// one thread.
#[inline]
pub fn now_ns() -> u64 {
    let c = clock();
    match &c.tsc {
        Some(s) => s.ns(tsc::read()),
        None => monotonic_ns(c.origin),
    }
}

/// The counter [`now_ns`] reads (measuring its rate first if this is
/// the first reading). A daemon calls it before it confines itself, so
/// that the checks can still read `/sys`.
pub fn source() -> Source {
    if clock().tsc.is_some() {
        Source::Tsc
    } else {
        Source::Monotonic
    }
}

#[cfg(target_arch = "x86_64")]
mod tsc {
    use std::arch::x86_64::{__cpuid, _rdtsc};

    #[inline]
    pub(super) fn read() -> u64 {
        // SAFETY: RDTSC exists on every x86_64 CPU and has no
        // preconditions; CR4.TSD, which would make it fault in user mode,
        // is not set by Linux unless a process asks (PR_SET_TSC) and
        // `usable` read it once already.
        unsafe { _rdtsc() }
    }

    /// An invariant TSC, and the kernel's clocksource.
    #[allow(
        unused_unsafe,
        reason = "`__cpuid` is a safe function in newer Rust, unsafe in older"
    )]
    pub(super) fn usable() -> bool {
        // SAFETY: CPUID exists on every x86_64 CPU; leaf 0x8000_0000
        // gives the highest extended leaf, checked before 0x8000_0007 is
        // asked.
        let max = unsafe { __cpuid(0x8000_0000) }.eax;
        if max < 0x8000_0007 {
            return false;
        }
        // SAFETY: as above, the leaf exists.
        let invariant = unsafe { __cpuid(0x8000_0007) }.edx & (1 << 8) != 0;
        invariant
            && std::fs::read_to_string(
                "/sys/devices/system/clocksource/clocksource0/current_clocksource",
            )
            .is_ok_and(|s| s.trim() == "tsc")
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod tsc {
    pub(super) fn read() -> u64 {
        0
    }

    pub(super) fn usable() -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scale_converts_ticks_at_the_measured_rate() {
        // 3 GHz: 3e6 ticks in 1 ms.
        let s = TscScale::measured(1_000, 500, 3_000_000, 1_000_000).unwrap();
        assert_eq!(s.ns(1_000), 500);
        let ns = s.ns(1_000 + 3_000_000_000) - 500;
        assert!(ns.abs_diff(1_000_000_000) < 2, "{ns}");
        assert_eq!(s.ns(0), 500, "a reading before the base is the base");
    }

    #[test]
    fn a_reading_is_dated_by_its_narrowest_bracket() {
        // The second was preempted between its reads (a 40 us bracket).
        let readings = [(1_000, 7, 1_200), (5_000, 9, 45_000), (50_000, 11, 50_080)];
        assert_eq!(narrowest(readings.into_iter()), Some((50_040, 11)));
        // The first of equal brackets; none without a reading.
        let ties = [(0, 1, 100), (500, 2, 600)];
        assert_eq!(narrowest(ties.into_iter()), Some((50, 1)));
        assert_eq!(narrowest(std::iter::empty()), None);
    }

    #[test]
    fn nonsense_rates_are_refused() {
        assert!(TscScale::measured(0, 0, 0, 5).is_none());
        assert!(TscScale::measured(0, 0, 5, 0).is_none());
        // 1 tick in 1 s, 1e12 ticks in 1 ns
        assert!(TscScale::measured(0, 0, 1, 1_000_000_000).is_none());
        assert!(TscScale::measured(0, 0, 1_000_000_000_000, 1).is_none());
    }

    #[test]
    fn the_clock_keeps_pace_with_monotonic_time_and_never_goes_back() {
        // Measured (calibrated) before the interval starts.
        let _ = source();
        // Each of our two readings bracketed by two of the monotonic
        // clock's, so that a preemption between them widens the allowed
        // range instead of failing the test.
        let bracket = || {
            let before = Instant::now();
            let t = now_ns();
            (before, t, Instant::now())
        };
        let (start_before, t0, start_after) = bracket();
        let mut last = t0;
        while start_after.elapsed() < Duration::from_millis(30) {
            let t = now_ns();
            assert!(t >= last, "went back: {last} -> {t}");
            last = t;
        }
        let (end_before, t1, end_after) = bracket();
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap();
        let shortest = ns(end_before.duration_since(start_after));
        let longest = ns(end_after.duration_since(start_before));
        let ours = t1 - t0;
        // Within 2% of 30 ms or more, whichever the source (a rate 2% off
        // is not a clock), of an interval between the two brackets.
        assert!(
            ours + shortest / 50 + 100_000 >= shortest && ours <= longest + longest / 50 + 100_000,
            "{:?}: {ours} ns against {shortest}..={longest} ns",
            source()
        );
    }
}
