//! The adaptive spin budget: how long a poll thread spins before it sets
//! NEED_WAKEUP and sleeps.
//!
//! Spinning pays when the next piece of work arrives sooner than a
//! sleep/wake round trip would take; on a busy 2-CPU machine with halted
//! vCPUs that round trip costs tens of microseconds, while an index moves
//! between cores in about a tenth of one. The policy keeps an exponential
//! moving average (weight 1/8, like TCP's SRTT) of the gaps between
//! arrivals and spins for `factor` times that average, clamped to
//! `[min, max]`:
//!
//! - gaps short against `max`: spin `factor × EMA`, so that most arrivals
//!   of a roughly exponential arrival process (98% at factor 4) are caught
//!   spinning;
//! - average gap beyond `max`: arrivals come slower than spinning can pay
//!   for; spin only `min` and sleep;
//! - a window that expires with nothing halves the next one (not below
//!   `min`), so a load that stops costs a few shrinking windows, not a
//!   full one each time;
//! - while spinning pays (the average gap within `max`), the window is
//!   never shorter than `floor`, the wakeup's cost when known: a pause
//!   of the other side shorter than a wakeup (a timer tick, a yield) is
//!   cheaper spun through than slept through, since sleeping costs the
//!   wakeup and spinning at most the pause (the ski-rental bound). At
//!   depth 1 the gaps are about a microsecond and `factor × EMA` alone
//!   is a few: every such pause put the poller to sleep;
//! - work noticed only after a sleep came a wakeup earlier than the
//!   sleeper saw it: with the wakeup's cost known (`wake_ns`), such a gap
//!   counts that much shorter. Without it a load whose gaps sit just
//!   below `max` is, once asleep, seen as gaps of one wakeup more and
//!   never polled again.
//!
//! The policy tunes speed only. Correctness never depends on it: a window
//! of zero still works, it just sleeps more.
//!
//! Defaults: `min` 1 µs, `max` 200 µs (a few wakeup costs on this class of
//! machine), `initial` 20 µs, `factor` 4. There is no clock here: callers
//! pass nanoseconds they measured.

use thiserror::Error;

/// Bounds and start value of the spin window, in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpinConfig {
    /// Shortest window.
    pub min_ns: u64,
    /// Longest window; also the average gap beyond which spinning stops
    /// paying.
    pub max_ns: u64,
    /// Window before any gap was observed.
    pub initial_ns: u64,
    /// Window = `factor` × average gap.
    pub factor: u64,
    /// What a wakeup costs: a gap ended by work noticed after a sleep is
    /// counted this much shorter (0: not known).
    pub wake_ns: u64,
    /// Shortest window while spinning pays (the average gap within
    /// `max_ns`), still within `[min_ns, max_ns]`: what a wakeup costs
    /// (0: none).
    pub floor_ns: u64,
}

impl Default for SpinConfig {
    fn default() -> Self {
        SpinConfig {
            min_ns: 1_000,
            max_ns: 200_000,
            initial_ns: 20_000,
            factor: 4,
            wake_ns: 0,
            floor_ns: 0,
        }
    }
}

/// A spin configuration that contradicts itself.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum SpinConfigError {
    /// `min_ns` is larger than `max_ns`.
    #[error("spin window minimum {min_ns} ns exceeds maximum {max_ns} ns")]
    MinAboveMax {
        /// The minimum given.
        min_ns: u64,
        /// The maximum given.
        max_ns: u64,
    },
    /// `initial_ns` is outside `[min_ns, max_ns]`.
    #[error("initial spin window {0} ns is outside [min, max]")]
    InitialOutOfRange(u64),
    /// `factor` is zero.
    #[error("spin factor must be at least 1")]
    ZeroFactor,
}

/// Gaps longer than this many `max` windows count as this many: one long
/// idle period must not dominate the average for long.
const GAP_CAP_IN_MAX: u64 = 4;

/// The adaptive spin window of one poll thread.
#[derive(Clone, Debug)]
pub struct SpinPolicy {
    config: SpinConfig,
    ema_ns: u64,
    window_ns: u64,
}

impl SpinPolicy {
    /// A policy with a validated configuration.
    pub fn new(config: SpinConfig) -> Result<Self, SpinConfigError> {
        if config.min_ns > config.max_ns {
            return Err(SpinConfigError::MinAboveMax {
                min_ns: config.min_ns,
                max_ns: config.max_ns,
            });
        }
        if !(config.min_ns..=config.max_ns).contains(&config.initial_ns) {
            return Err(SpinConfigError::InitialOutOfRange(config.initial_ns));
        }
        if config.factor == 0 {
            return Err(SpinConfigError::ZeroFactor);
        }
        Ok(Self::from_valid(config))
    }

    fn from_valid(config: SpinConfig) -> Self {
        SpinPolicy {
            config,
            ema_ns: config.initial_ns / config.factor,
            window_ns: config.initial_ns,
        }
    }

    /// Records the gap between the end of the previous work and the arrival
    /// of new work, however it was noticed (spinning or woken).
    pub fn record_gap(&mut self, gap_ns: u64) {
        let cap = self.config.max_ns.saturating_mul(GAP_CAP_IN_MAX);
        let gap = gap_ns.min(cap);
        self.ema_ns = if gap >= self.ema_ns {
            self.ema_ns + (gap - self.ema_ns) / 8
        } else {
            self.ema_ns - (self.ema_ns - gap) / 8
        };
        self.window_ns = if self.ema_ns > self.config.max_ns {
            self.config.min_ns
        } else {
            self.ema_ns
                .saturating_mul(self.config.factor)
                .max(self.config.floor_ns)
                .clamp(self.config.min_ns, self.config.max_ns)
        };
    }

    /// Records a gap ended by work noticed after a sleep: [`record_gap`]
    /// of the gap less the wakeup's cost.
    ///
    /// [`record_gap`]: Self::record_gap
    pub fn record_woken_gap(&mut self, gap_ns: u64) {
        self.record_gap(gap_ns.saturating_sub(self.config.wake_ns));
    }

    /// Records a window that expired with nothing to do.
    pub fn record_miss(&mut self) {
        self.window_ns = (self.window_ns / 2).max(self.config.min_ns);
    }

    /// How long to spin now, in nanoseconds.
    pub fn window_ns(&self) -> u64 {
        self.window_ns
    }

    /// The moving average of observed gaps, in nanoseconds.
    pub fn ema_ns(&self) -> u64 {
        self.ema_ns
    }

    /// The configuration in force.
    pub fn config(&self) -> SpinConfig {
        self.config
    }
}

impl Default for SpinPolicy {
    fn default() -> Self {
        // The default configuration is valid (`default_is_valid...` tests it).
        Self::from_valid(SpinConfig::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_starts_at_initial() {
        let p = SpinPolicy::new(SpinConfig::default()).unwrap();
        assert_eq!(p.window_ns(), 20_000);
        assert_eq!(SpinPolicy::default().window_ns(), p.window_ns());
        assert_eq!(SpinPolicy::default().ema_ns(), p.ema_ns());
    }

    #[test]
    fn contradictory_configs_are_rejected() {
        let c = SpinConfig {
            min_ns: 10,
            max_ns: 5,
            initial_ns: 7,
            factor: 4,
            wake_ns: 0,
            floor_ns: 0,
        };
        assert_eq!(
            SpinPolicy::new(c).unwrap_err(),
            SpinConfigError::MinAboveMax {
                min_ns: 10,
                max_ns: 5
            }
        );
        let c = SpinConfig {
            initial_ns: 1_000_000,
            ..SpinConfig::default()
        };
        assert_eq!(
            SpinPolicy::new(c).unwrap_err(),
            SpinConfigError::InitialOutOfRange(1_000_000)
        );
        let c = SpinConfig {
            factor: 0,
            ..SpinConfig::default()
        };
        assert_eq!(SpinPolicy::new(c).unwrap_err(), SpinConfigError::ZeroFactor);
    }

    #[test]
    fn steady_short_gaps_converge_to_factor_times_gap() {
        let mut p = SpinPolicy::default();
        for _ in 0..200 {
            p.record_gap(3_000);
        }
        assert!((2_900..=3_100).contains(&p.ema_ns()), "ema {}", p.ema_ns());
        assert!(
            (11_600..=12_400).contains(&p.window_ns()),
            "window {}",
            p.window_ns()
        );
    }

    #[test]
    fn long_gaps_stop_spinning_and_short_ones_bring_it_back() {
        let mut p = SpinPolicy::default();
        for _ in 0..100 {
            p.record_gap(10_000_000);
        }
        assert!(
            (799_990..=800_000).contains(&p.ema_ns()),
            "gaps are capped at 4 x max"
        );
        assert_eq!(p.window_ns(), 1_000);
        let mut samples = 0;
        while p.window_ns() == 1_000 {
            p.record_gap(2_000);
            samples += 1;
            assert!(samples < 64, "never recovered");
        }
        assert_eq!(
            p.window_ns(),
            200_000,
            "first window after recovery is clamped to max"
        );
    }

    #[test]
    fn a_woken_gap_counts_without_the_wakeup() {
        let c = SpinConfig {
            max_ns: 50_000,
            wake_ns: 25_000,
            ..SpinConfig::default()
        };
        let (mut woken, mut plain) = (SpinPolicy::new(c).unwrap(), SpinPolicy::new(c).unwrap());
        // Gaps noticed at 60 µs, 25 of them the wakeup: counted whole
        // they stay above the 50 µs bound, without the wakeup (35 µs)
        // they fall within it.
        for _ in 0..100 {
            woken.record_woken_gap(60_000);
            plain.record_gap(60_000);
        }
        assert_eq!(plain.window_ns(), 1_000, "never polls again");
        assert!(
            (34_000..=36_000).contains(&woken.ema_ns()),
            "{}",
            woken.ema_ns()
        );
        assert_eq!(woken.window_ns(), 50_000, "polls within the bound");
        let mut p = SpinPolicy::default();
        p.record_woken_gap(3_000);
        assert_eq!(
            p.ema_ns(),
            SpinPolicy::default().ema_ns() - 250,
            "wake_ns 0"
        );
    }

    #[test]
    fn a_busy_window_is_never_shorter_than_the_floor() {
        let c = SpinConfig {
            floor_ns: 30_000,
            ..SpinConfig::default()
        };
        let (mut floored, mut plain) = (SpinPolicy::new(c).unwrap(), SpinPolicy::default());
        for _ in 0..200 {
            floored.record_gap(1_000);
            plain.record_gap(1_000);
        }
        assert!(
            (3_900..=4_100).contains(&plain.window_ns()),
            "{}",
            plain.window_ns()
        );
        assert_eq!(
            floored.window_ns(),
            30_000,
            "a pause under a wakeup is spun through"
        );
        // Misses still halve it (a load that stops costs little), and the
        // next gap brings it back.
        floored.record_miss();
        assert_eq!(floored.window_ns(), 15_000);
        floored.record_gap(1_000);
        assert_eq!(floored.window_ns(), 30_000);
        // Gaps beyond the bound: no floor, the poller sleeps at once.
        for _ in 0..100 {
            floored.record_gap(10_000_000);
        }
        assert_eq!(floored.window_ns(), 1_000);
        // Within the bound, a long average is not cut by the floor.
        let mut p = SpinPolicy::new(c).unwrap();
        for _ in 0..200 {
            p.record_gap(20_000);
        }
        assert!(p.window_ns() > 70_000, "{}", p.window_ns());
    }

    #[test]
    fn misses_halve_down_to_min() {
        let mut p = SpinPolicy::default();
        p.record_miss();
        assert_eq!(p.window_ns(), 10_000);
        for _ in 0..20 {
            p.record_miss();
        }
        assert_eq!(p.window_ns(), 1_000);
        p.record_gap(5_000);
        assert!(
            p.window_ns() > 1_000,
            "a hit recomputes the window from the average"
        );
    }

    #[test]
    fn extreme_values_saturate() {
        let cfg = SpinConfig {
            min_ns: 0,
            max_ns: u64::MAX,
            initial_ns: 0,
            factor: u64::MAX,
            wake_ns: u64::MAX,
            floor_ns: u64::MAX,
        };
        let mut p = SpinPolicy::new(cfg).unwrap();
        p.record_gap(u64::MAX);
        assert_eq!(p.window_ns(), u64::MAX);
        p.record_gap(0);
        p.record_miss();
        assert!(p.window_ns() <= u64::MAX / 2 + 1);
    }
}
