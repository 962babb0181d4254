//! A log rate limiter the guest cannot overwhelm.
//!
//! Everything a guest can trigger at will (bad descriptor chains, bad LUNs,
//! malformed control requests) is logged through a [`RateLimiter`]: at
//! most `burst` messages per one-second window per device, and when a
//! window with suppressed messages ends, one summary line with their count.
//! It is lock-free (three atomics) because workers of one device share it;
//! races between workers only make the count approximate, never block.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

/// Default messages per second per device.
pub const DEFAULT_BURST: u32 = 10;

/// Rate limiter for guest-triggered log messages.
#[derive(Debug)]
pub struct RateLimiter {
    origin: Instant,
    burst: u32,
    window: AtomicU64,
    count: AtomicU32,
    suppressed: AtomicU64,
}

/// What the caller may log now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Permit {
    /// The message may be logged.
    pub allowed: bool,
    /// Messages suppressed in the previous window(s), to report once.
    pub suppressed_before: u64,
}

impl RateLimiter {
    /// A limiter allowing `burst` messages per second.
    pub fn new(burst: u32) -> Self {
        RateLimiter {
            origin: Instant::now(),
            burst,
            window: AtomicU64::new(0),
            count: AtomicU32::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Asks to log one message.
    pub fn check(&self) -> Permit {
        self.check_at(self.origin.elapsed().as_secs())
    }

    fn check_at(&self, now: u64) -> Permit {
        // Relaxed throughout: the counters order nothing else, and a lost
        // race only shifts a message between windows.
        let window = self.window.load(Ordering::Relaxed);
        let mut suppressed_before = 0;
        if now != window
            && self
                .window
                .compare_exchange(window, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.count.store(0, Ordering::Relaxed);
            suppressed_before = self.suppressed.swap(0, Ordering::Relaxed);
        }
        let allowed = self.count.fetch_add(1, Ordering::Relaxed) < self.burst;
        if !allowed {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
        }
        Permit {
            allowed,
            suppressed_before,
        }
    }
}

/// Logs at `level` (`warn`, `error`, ...) through a [`RateLimiter`]:
/// for what a guest can trigger at will, and for failures a worker meets
/// again on every pass (a backstore that refuses a commit).
#[macro_export]
#[doc(hidden)]
macro_rules! rate_limited {
    ($level:ident, $limiter:expr, $($arg:tt)+) => {{
        let permit = $limiter.check();
        if permit.suppressed_before > 0 {
            tracing::$level!("suppressed {} rate-limited messages", permit.suppressed_before);
        }
        if permit.allowed {
            tracing::$level!($($arg)+);
        }
    }};
}

/// Logs a guest-triggered warning through a [`RateLimiter`].
#[macro_export]
#[doc(hidden)]
macro_rules! guest_warn {
    ($limiter:expr, $($arg:tt)+) => {
        $crate::rate_limited!(warn, $limiter, $($arg)+)
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_suppression_then_summary() {
        let l = RateLimiter::new(3);
        let allowed = (0..10).filter(|_| l.check_at(0).allowed).count();
        assert_eq!(allowed, 3);
        let p = l.check_at(1);
        assert!(p.allowed);
        assert_eq!(p.suppressed_before, 7);
        assert_eq!(l.check_at(1).suppressed_before, 0);
    }

    /// Counts the events at `level` that reach it.
    struct Count(std::sync::Arc<AtomicU32>, tracing::Level);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Count {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            if *event.metadata().level() == self.1 {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    #[test]
    fn a_failure_met_on_every_pass_is_logged_a_burst_at_a_time() {
        use tracing_subscriber::layer::SubscriberExt;
        let n = std::sync::Arc::new(AtomicU32::new(0));
        let subscriber =
            tracing_subscriber::registry().with(Count(n.clone(), tracing::Level::ERROR));
        let l = RateLimiter::new(3);
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..100 {
                rate_limited!(error, l, "backstore commit failed");
            }
        });
        // One window (unless the second turns meanwhile): the burst, and
        // at most a summary and a new burst.
        let n = n.load(Ordering::Relaxed);
        assert!((3..=7).contains(&n), "{n} lines");
    }
}
