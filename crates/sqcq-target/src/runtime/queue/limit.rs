//! Backpressure: how many requests a queue takes from its ring before it
//! leaves the rest there, and THROTTLE, the doorbell bit that asks the
//! driver to hold new requests back meanwhile (spec section
//! "Backpressure").
//!
//! A queue at its limit (`--max-inflight`, or a backstore that refuses
//! work) stops taking chains: they stay on the ring, untouched, until
//! completions bring the queue under its limit, when it looks at the
//! ring again without waiting for a kick or a new `sq.idx` (T3). With
//! VIRTIO_F_SQCQ_POLL it also sets THROTTLE in `sq.flags` (only while
//! requests it took are outstanding, T1) and clears it once its requests
//! in flight fall to the low mark, before it publishes the completions
//! that brought them there (T2), so the driver that sees those
//! completions sees the clear. Setting at `high` and clearing at `low`
//! keeps a driver that honours it from turning the signal on and off
//! at every completion.

/// The in-flight bounds of one queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InFlightLimit {
    /// At this many requests in flight the queue stops taking and sets
    /// THROTTLE.
    high: u32,
    /// At or below this many it clears THROTTLE.
    low: u32,
}

impl InFlightLimit {
    /// The bounds of a queue of `size` entries with at most `max`
    /// requests in flight (`None`: the ring's size, which a correct
    /// driver never exceeds; clamped to `1..=size`). The low mark is a
    /// quarter (rounded up) under the high one: 1 → 0, 2 → 1, 8 → 6,
    /// 32 → 24.
    pub(crate) fn new(max: Option<u16>, size: u16) -> Self {
        let size = u32::from(size.max(1));
        let high = max.map_or(size, |m| u32::from(m).clamp(1, size));
        InFlightLimit {
            high,
            low: high - high.div_ceil(4),
        }
    }

    /// Whether a queue with `in_flight` requests may take no more.
    #[inline]
    pub(crate) fn reached(&self, in_flight: u32) -> bool {
        in_flight >= self.high
    }

    /// Whether THROTTLE goes with `in_flight` requests left.
    #[inline]
    pub(crate) fn released(&self, in_flight: u32) -> bool {
        in_flight <= self.low
    }
}

/// The backpressure state of one queue.
#[derive(Debug)]
pub(crate) struct Backpressure {
    pub(crate) limit: InFlightLimit,
    /// Chains were left on the ring at the limit: look again when the
    /// queue falls under it (T3).
    pub(crate) left: bool,
    /// THROTTLE is set in `sq.flags`.
    pub(crate) throttled: bool,
}

impl Backpressure {
    pub(crate) fn new(limit: InFlightLimit) -> Self {
        Backpressure {
            limit,
            left: false,
            throttled: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_low_mark_is_a_quarter_under_the_high_one() {
        for (max, high, low) in [(1, 1, 0), (2, 2, 1), (3, 3, 2), (8, 8, 6), (32, 32, 24)] {
            let l = InFlightLimit::new(Some(max), 256);
            assert_eq!((l.high, l.low), (high, low), "max {max}");
            assert!(l.reached(high) && !l.reached(high - 1));
            assert!(l.released(low) && !l.released(low + 1));
        }
    }

    #[test]
    fn the_limit_is_clamped_to_the_ring() {
        assert_eq!(InFlightLimit::new(None, 128).high, 128);
        assert_eq!(InFlightLimit::new(Some(1000), 128).high, 128);
        assert_eq!(InFlightLimit::new(Some(0), 128).high, 1);
        assert_eq!(InFlightLimit::new(None, 0).high, 1);
    }
}
