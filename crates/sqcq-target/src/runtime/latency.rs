//! The service-time histogram of a request queue: from the pass of its
//! worker that took a request from the ring to the pass that completed it
//! (see `crate::runtime::pass`).
//!
//! The bounds are powers of two microseconds, 1 µs to 2^22 µs (4.19 s),
//! then +Inf: a request's bucket is found with one `leading_zeros`, no
//! search. A request taken and completed in the same pass (what a null or
//! RAM LUN does, and every request answered without the backstore) counts
//! as 0: the histogram resolves the time a request waits for its
//! backstore and for the worker, not the few microseconds of one pass.
//!
//! A worker counts its completions in a `PendingLatency` of the queue
//! and adds them to the queue's shared figures once per published batch.

use serde::Serialize;

/// Buckets: [`FINITE`] with an upper bound, then +Inf.
pub const BUCKETS: usize = FINITE + 1;
/// Buckets with an upper bound: 2^0 to 2^22 µs.
pub const FINITE: usize = 23;

/// The upper bound of bucket `i` in microseconds (`None`: +Inf).
pub fn upper_bound_us(i: usize) -> Option<u64> {
    (i < FINITE).then(|| 1 << i)
}

/// The bucket of a service time of `ns` nanoseconds: the first whose
/// bound is at least `ns`.
pub fn bucket(ns: u64) -> usize {
    // Bucket i holds (2^(i-1), 2^i] µs: i is the bit length of
    // ceil(ns / 1000) - 1, which is floor((ns - 1) / 1000) (one multiply
    // by a constant, no division instruction).
    let i = u64::BITS - (ns.saturating_sub(1) / 1000).leading_zeros();
    usize::try_from(i).map_or(FINITE, |i| i.min(FINITE))
}

/// Completions of a batch not yet added to the queue's figures: counts
/// per bucket, a mask of the buckets touched (the flush reads only
/// those), and the sum of their times.
#[derive(Debug, Default)]
pub(crate) struct PendingLatency {
    counts: [u32; BUCKETS],
    touched: u32,
    sum_ns: u64,
}

impl PendingLatency {
    /// One request served in `ns` nanoseconds.
    pub(crate) fn record(&mut self, ns: u64) {
        let i = bucket(ns);
        self.counts[i] = self.counts[i].wrapping_add(1);
        self.touched |= 1 << i;
        self.sum_ns = self.sum_ns.wrapping_add(ns);
    }

    /// Hands every non-empty bucket `(index, count)` and then the sum of
    /// times to `add`, and starts over.
    pub(crate) fn drain(&mut self, mut add: impl FnMut(usize, u64), sum: impl FnOnce(u64)) {
        while self.touched != 0 {
            let i = self.touched.trailing_zeros() as usize;
            self.touched &= self.touched - 1;
            add(i, u64::from(std::mem::take(&mut self.counts[i])));
        }
        sum(std::mem::take(&mut self.sum_ns));
    }
}

/// A queue's histogram at one moment: requests per bucket (not
/// cumulative) and the sum of their service times.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LatencySnapshot {
    /// Requests per bucket; bucket `i` holds the times in
    /// `(upper_bound_us(i - 1), upper_bound_us(i)]`.
    pub buckets: [u64; BUCKETS],
    /// Sum of the service times, ns.
    pub sum_ns: u64,
}

impl LatencySnapshot {
    /// Requests counted.
    pub fn count(&self) -> u64 {
        self.buckets.iter().fold(0, |a, b| a.wrapping_add(*b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_time_goes_to_the_first_bucket_that_holds_it() {
        for (ns, i) in [
            (0, 0),
            (1, 0),
            (1000, 0),
            (1001, 1),
            (2000, 1),
            (2001, 2),
            (4000, 2),
            (4001, 3),
            (1_000_000, 10),
            (4_194_304_000, 22),
            (4_194_304_001, 23),
            (u64::MAX, 23),
        ] {
            assert_eq!(bucket(ns), i, "{ns} ns");
            let above = upper_bound_us(i).is_none_or(|b| ns <= b * 1000);
            let below = i == 0 || ns > upper_bound_us(i - 1).unwrap() * 1000;
            assert!(above && below, "{ns} ns in bucket {i}");
        }
        assert_eq!(upper_bound_us(FINITE), None);
    }

    #[test]
    fn a_batch_drains_only_what_it_touched() {
        let mut p = PendingLatency::default();
        for ns in [500, 700, 3000, 10_000_000_000] {
            p.record(ns);
        }
        let mut got = Vec::new();
        let mut sum = 0;
        p.drain(|i, n| got.push((i, n)), |s| sum = s);
        assert_eq!(got, [(0, 2), (2, 1), (23, 1)]);
        assert_eq!(sum, 10_000_004_200);
        let mut again = 0;
        p.drain(|_, _| again += 1, |s| assert_eq!(s, 0));
        assert_eq!(again, 0, "drained");
    }
}
