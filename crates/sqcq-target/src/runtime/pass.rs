//! A worker's pass clock: the monotonic time read once when the worker's
//! loop wakes (after `epoll_wait`) and once per turn of its poll loop,
//! kept in a thread-local and shared by everything that pass does on the
//! thread: the time each request was taken and completed (the latency
//! histogram of [`crate::runtime::metrics`]), the statistics ticker, the
//! pollers' spin windows. No request reads the clock itself.
//!
//! The thread also knows which worker it is, so a queue started on it
//! records its worker in its figures without being told.

use std::cell::Cell;

thread_local! {
    /// The time of the thread's current pass, ns since [`now_ns`]'s origin.
    static PASS_NS: Cell<u64> = const { Cell::new(0) };
    /// The worker this thread is, if it is one.
    static WORKER: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Nanoseconds on a monotonic clock (origin: the first call in the
/// process): the pollers' and the pass clock's time base, the TSC where
/// the kernel trusts it ([`sqcq_protocol::clock`]).
#[inline]
pub fn now_ns() -> u64 {
    sqcq_protocol::clock::now_ns()
}

/// A duration in the pass clock's unit (ns), saturating.
pub(crate) fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Reads the clock: a new pass of this thread begins now. Returns the
/// time.
pub(crate) fn begin() -> u64 {
    let now = now_ns();
    PASS_NS.set(now);
    now
}

/// The time of this thread's current pass (0 before its first).
pub(crate) fn now() -> u64 {
    PASS_NS.get()
}

/// This thread is worker `id` from now on.
pub(crate) fn enter_worker(id: usize) {
    WORKER.set(Some(id));
}

/// The worker this thread is, if it is one.
pub(crate) fn worker() -> Option<usize> {
    WORKER.get()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_keeps_its_time_until_the_next_begins() {
        std::thread::spawn(|| {
            assert_eq!((now(), worker()), (0, None));
            enter_worker(3);
            let t = begin();
            std::thread::sleep(std::time::Duration::from_millis(2));
            assert_eq!(now(), t, "no clock read between passes");
            assert!(begin() >= t + 2_000_000);
            assert_eq!(worker(), Some(3));
        })
        .join()
        .unwrap();
        assert_eq!(worker(), None, "per thread");
    }
}
