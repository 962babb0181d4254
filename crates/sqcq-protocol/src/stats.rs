//! Per-queue statistics, printed by both sides in the RFC's format.

use core::fmt;

/// Counters of one queue's poll loop, as a plain value: the poll thread
/// owns and updates one, and hands out copies to whoever reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Virtqueue index.
    pub queue: u16,
    /// Requests completed (device) or completions seen (driver).
    pub completions: u64,
    /// Moving average of arrival gaps, in nanoseconds (the RFC's `ema_lat`).
    pub ema_ns: u64,
    /// The current spin window, in nanoseconds (the RFC's `interval`);
    /// `u64::MAX` for a poller that never sleeps, printed as `inf`.
    pub interval_ns: u64,
    /// Polls that found nothing new.
    pub spins: u64,
    /// Times the poll thread went to sleep with NEED_WAKEUP set.
    pub sleeps: u64,
    /// Notifications this side owed the other (kicks or calls sent).
    pub wakeups: u64,
}

impl QueueStats {
    /// Counters accumulated since `earlier` (gauges taken from `self`).
    /// A counter below its earlier value started again from zero (the
    /// queue was restarted, or its poller dropped): its value is what
    /// accumulated since.
    pub fn since(&self, earlier: &QueueStats) -> QueueStats {
        QueueStats {
            queue: self.queue,
            completions: counted_since(self.completions, earlier.completions),
            ema_ns: self.ema_ns,
            interval_ns: self.interval_ns,
            spins: counted_since(self.spins, earlier.spins),
            sleeps: counted_since(self.sleeps, earlier.sleeps),
            wakeups: counted_since(self.wakeups, earlier.wakeups),
        }
    }
}

/// What a counter accumulated since it read `earlier`, when it may have
/// started again from zero in between.
pub fn counted_since(now: u64, earlier: u64) -> u64 {
    now.checked_sub(earlier).unwrap_or(now)
}

impl fmt::Display for QueueStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "vq[{}] cq={} ema_lat={}ns interval=",
            self.queue, self.completions, self.ema_ns,
        )?;
        if self.interval_ns == u64::MAX {
            f.write_str("inf")?;
        } else {
            write!(f, "{}ns", self.interval_ns)?;
        }
        write!(
            f,
            " spins={} sleeps={} wakeups={}",
            self.spins, self.sleeps, self.wakeups
        )
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;

    #[test]
    fn display_matches_the_rfc_log_line() {
        let s = QueueStats {
            queue: 2,
            completions: 1000,
            ema_ns: 4200,
            interval_ns: 16800,
            spins: 7,
            sleeps: 3,
            wakeups: 1,
        };
        assert_eq!(
            s.to_string(),
            "vq[2] cq=1000 ema_lat=4200ns interval=16800ns spins=7 sleeps=3 wakeups=1"
        );
    }

    #[test]
    fn a_window_that_never_ends_prints_as_inf() {
        let s = QueueStats {
            interval_ns: u64::MAX,
            ..QueueStats::default()
        };
        assert_eq!(
            s.to_string(),
            "vq[0] cq=0 ema_lat=0ns interval=inf spins=0 sleeps=0 wakeups=0"
        );
    }

    #[test]
    fn since_subtracts_counters_and_keeps_gauges() {
        let a = QueueStats {
            queue: 1,
            completions: 10,
            ema_ns: 5,
            interval_ns: 20,
            spins: 4,
            sleeps: 2,
            wakeups: 1,
        };
        let b = QueueStats {
            queue: 1,
            completions: 25,
            ema_ns: 9,
            interval_ns: 40,
            spins: 10,
            sleeps: 2,
            wakeups: 3,
        };
        let d = b.since(&a);
        assert_eq!(
            d,
            QueueStats {
                queue: 1,
                completions: 15,
                ema_ns: 9,
                interval_ns: 40,
                spins: 6,
                sleeps: 0,
                wakeups: 2
            }
        );
    }

    #[test]
    fn a_counter_that_started_again_counts_from_zero() {
        let before = QueueStats {
            completions: 8000,
            spins: 6_000_000,
            ..QueueStats::default()
        };
        let restarted = QueueStats {
            completions: 582,
            spins: 1_000,
            ..QueueStats::default()
        };
        let d = restarted.since(&before);
        assert_eq!((d.completions, d.spins), (582, 1_000));
        assert_eq!(counted_since(7, 7), 0);
    }
}
