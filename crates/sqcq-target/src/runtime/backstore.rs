//! What every request handler does with its backstore queues beyond
//! submitting: sending what it queued ([`Pending::commit`]), without
//! losing it when the backstore refuses, and without waiting for ever
//! when it keeps refusing.
//!
//! A refused commit leaves the requests queued in the backstore (io_uring
//! keeps its submission entries when `io_uring_enter` fails). A transient
//! refusal (`EAGAIN`, `EBUSY`, `EINTR`, `ENOMEM`, `ENOBUFS`: io_uring out
//! of memory or its completion queue full) is retried after
//! [`FIRST_RETRY`], the wait doubling up to [`MAX_RETRY`] while it keeps
//! failing, so that the worker sleeps between attempts instead of
//! spinning on them; a success starts over. Any other error, or transient
//! ones for longer than [`GIVE_UP_AFTER`], withdraws the requests
//! (`BackstoreQueue::withdraw`): each completes with an I/O error (blk:
//! IOERR; SCSI: the sense of a backstore I/O error), through the usual
//! completion path that counts it, and nothing is left hanging.
//!
//! The decision is a pure function of the outcome and the clock, which
//! the caller passes in; the tests drive it with a clock of their own.

use std::time::{Duration, Instant};

use sqcq_backstore::{BackstoreError, BackstoreQueue};

use crate::rate_limited;
use crate::runtime::error_chain;
use crate::runtime::queue::Vring;

/// The wait before the first retry of a refused commit.
pub(crate) const FIRST_RETRY: Duration = Duration::from_millis(1);
/// The longest wait between two retries.
pub(crate) const MAX_RETRY: Duration = Duration::from_millis(100);
/// How long transient refusals are retried before the requests fail.
pub(crate) const GIVE_UP_AFTER: Duration = Duration::from_secs(5);

/// One backstore queue's requests queued and not sent yet, and the
/// retries of a commit it refused.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    queued: bool,
    retry: Option<Retry>,
}

/// A commit refused, to be tried again.
#[derive(Clone, Copy, Debug)]
struct Retry {
    /// The first refusal of this run of them.
    since: Instant,
    /// When to try again.
    at: Instant,
    /// The wait that led to `at`.
    wait: Duration,
}

/// What [`Pending::commit`] did.
#[derive(Debug)]
pub(crate) enum Commit {
    /// Nothing was queued, or what was is sent.
    Sent,
    /// A retry is not due yet: nothing was tried.
    Waiting,
    /// The backstore refused for now: tried again in `wait`.
    Retrying {
        /// Why.
        error: BackstoreError,
        /// The wait before the next attempt.
        wait: Duration,
    },
    /// The backstore refused for good: `withdrawn` requests complete with
    /// an error.
    Failed {
        /// Why.
        error: BackstoreError,
        /// Requests withdrawn.
        withdrawn: u32,
    },
}

/// Whether a refused commit may succeed if tried again.
fn is_transient(e: &BackstoreError) -> bool {
    match e {
        BackstoreError::Io(e) => matches!(
            e.raw_os_error(),
            Some(libc::EAGAIN | libc::EBUSY | libc::EINTR | libc::ENOMEM | libc::ENOBUFS)
        ),
        _ => false,
    }
}

impl Pending {
    /// Requests were queued in the backstore.
    pub(crate) fn queued(&mut self) {
        self.queued = true;
    }

    /// Whether requests are queued and not sent.
    pub(crate) fn is_queued(&self) -> bool {
        self.queued
    }

    /// Whether a refused commit waits to be tried again (without reading
    /// the clock: the request path asks this first).
    pub(crate) fn retrying(&self) -> bool {
        self.retry.is_some()
    }

    /// Whether a retry of a refused commit is due at `now`.
    pub(crate) fn retry_due(&self, now: Instant) -> bool {
        self.retry.is_some_and(|r| now >= r.at)
    }

    /// How long after `now` a refused commit is to be tried again; `None`
    /// when none waits.
    pub(crate) fn retry_in(&self, now: Instant) -> Option<Duration> {
        self.retry.map(|r| r.at.saturating_duration_since(now))
    }

    /// Sends what `io` has queued, unless a retry is not due yet. The
    /// clock is read only when a retry waits or the backstore refuses:
    /// not on the request path.
    pub(crate) fn commit(
        &mut self,
        io: &mut dyn BackstoreQueue,
        clock: impl Fn() -> Instant,
    ) -> Commit {
        if !self.queued {
            return Commit::Sent;
        }
        if self.retry.is_some_and(|r| clock() < r.at) {
            return Commit::Waiting;
        }
        let error = match io.commit() {
            Ok(()) => {
                *self = Pending::default();
                return Commit::Sent;
            }
            Err(e) => e,
        };
        let now = clock();
        let since = self.retry.map_or(now, |r| r.since);
        if is_transient(&error) && now.saturating_duration_since(since) < GIVE_UP_AFTER {
            let wait = self
                .retry
                .map_or(FIRST_RETRY, |r| r.wait.saturating_mul(2).min(MAX_RETRY));
            self.retry = Some(Retry {
                since,
                at: now + wait,
                wait,
            });
            return Commit::Retrying { error, wait };
        }
        let withdrawn = io.withdraw();
        *self = Pending::default();
        Commit::Failed { error, withdrawn }
    }
}

/// [`Pending::commit`] now, logging a refusal through the device's
/// backstore rate limiter (the requests a failure withdraws are counted
/// as they complete, as any backstore failure).
pub(crate) fn commit(pending: &mut Pending, io: &mut dyn BackstoreQueue, ring: &Vring, lun: u16) {
    let d = ring.device();
    let vq = ring.key().vq;
    match pending.commit(io, Instant::now) {
        Commit::Sent | Commit::Waiting => {}
        Commit::Retrying { error, wait } => {
            rate_limited!(
                warn,
                d.backstore_limiter,
                device = d.id,
                vq,
                lun,
                "backstore refused a commit: {}: retrying in {wait:?}",
                error_chain(&error)
            );
        }
        Commit::Failed { error, withdrawn } => {
            rate_limited!(
                error,
                d.backstore_limiter,
                device = d.id,
                vq,
                lun,
                "backstore commit failed: {}: {withdrawn} requests failed",
                error_chain(&error)
            );
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::os::fd::RawFd;
    use std::sync::{Arc, Mutex, MutexGuard};

    use sqcq_backstore::{Backstore, BackstoreError, BackstoreQueue, Completion, Geometry, IoOp};

    use super::*;

    /// A backstore queue whose first `failures` commits fail with
    /// `errno`; it keeps the tags queued, sent and withdrawn, and
    /// completes withdrawn ones (failed) and sent ones (done) in `reap`.
    #[derive(Default)]
    pub(crate) struct FlakyQueue {
        pub(crate) failures: u32,
        pub(crate) errno: i32,
        pub(crate) commits: u32,
        pub(crate) queued: Vec<u64>,
        pub(crate) sent: Vec<u64>,
        pub(crate) withdrawn: Vec<u64>,
        done: Vec<(u64, bool)>,
    }

    impl FlakyQueue {
        pub(crate) fn failing(failures: u32, errno: i32) -> Self {
            FlakyQueue {
                failures,
                errno,
                ..FlakyQueue::default()
            }
        }
    }

    impl BackstoreQueue for FlakyQueue {
        unsafe fn submit(
            &mut self,
            tag: u64,
            _: IoOp,
            _: &[libc::iovec],
        ) -> Result<(), BackstoreError> {
            self.queued.push(tag);
            Ok(())
        }
        fn commit(&mut self) -> Result<(), BackstoreError> {
            self.commits += 1;
            if self.failures > 0 {
                self.failures -= 1;
                return Err(BackstoreError::Io(std::io::Error::from_raw_os_error(
                    self.errno,
                )));
            }
            for tag in self.queued.drain(..) {
                self.sent.push(tag);
                self.done.push((tag, true));
            }
            Ok(())
        }
        fn withdraw(&mut self) -> u32 {
            let n = u32::try_from(self.queued.len()).unwrap();
            for tag in self.queued.drain(..) {
                self.withdrawn.push(tag);
                self.done.push((tag, false));
            }
            n
        }
        fn reap(&mut self, done: Completion<'_>) {
            for (tag, ok) in self.done.drain(..) {
                let result = if ok {
                    Ok(0)
                } else {
                    Err(BackstoreError::Io(std::io::Error::from_raw_os_error(
                        libc::EIO,
                    )))
                };
                done(tag, result);
            }
        }
        fn in_flight(&self) -> u32 {
            u32::try_from(self.queued.len() + self.done.len()).unwrap()
        }
        fn completion_fd(&self) -> Option<RawFd> {
            None
        }
    }

    /// A backstore of 2048 blocks of 512 bytes whose every queue is one
    /// [`FlakyQueue`], which the test keeps to script and inspect.
    pub(crate) struct FlakyBackstore(pub(crate) Arc<Mutex<FlakyQueue>>);

    struct SharedQueue(Arc<Mutex<FlakyQueue>>);

    impl SharedQueue {
        fn get(&self) -> MutexGuard<'_, FlakyQueue> {
            self.0.lock().unwrap()
        }
    }

    impl Backstore for FlakyBackstore {
        fn geometry(&self) -> Geometry {
            Geometry {
                block_size: 512,
                blocks: 2048,
                read_only: false,
                supports_unmap: false,
                unmapped_reads_zero: false,
            }
        }
        fn open_queue(&self, _: u32) -> Result<Box<dyn BackstoreQueue>, BackstoreError> {
            Ok(Box::new(SharedQueue(Arc::clone(&self.0))))
        }
    }

    impl BackstoreQueue for SharedQueue {
        unsafe fn submit(
            &mut self,
            tag: u64,
            op: IoOp,
            iov: &[libc::iovec],
        ) -> Result<(), BackstoreError> {
            // SAFETY: the fake queue never touches the memory.
            unsafe { self.get().submit(tag, op, iov) }
        }
        fn commit(&mut self) -> Result<(), BackstoreError> {
            self.get().commit()
        }
        fn withdraw(&mut self) -> u32 {
            self.get().withdraw()
        }
        fn reap(&mut self, done: Completion<'_>) {
            self.get().reap(done);
        }
        fn in_flight(&self) -> u32 {
            self.get().in_flight()
        }
        fn completion_fd(&self) -> Option<RawFd> {
            None
        }
    }

    fn queue(io: &mut FlakyQueue, pending: &mut Pending, tags: &[u64]) {
        for &tag in tags {
            // SAFETY: the fake queue names no memory.
            unsafe { io.submit(tag, IoOp::Flush, &[]) }.unwrap();
            pending.queued();
        }
    }

    #[test]
    fn transient_refusals_are_retried_after_a_growing_wait_then_sent_once() {
        let mut io = FlakyQueue::failing(3, libc::EAGAIN);
        let mut p = Pending::default();
        queue(&mut io, &mut p, &[1, 2]);
        let t0 = Instant::now();
        let mut waits = Vec::new();
        let mut now = t0;
        loop {
            match p.commit(&mut io, || now) {
                Commit::Retrying { wait, .. } => {
                    assert!(!p.retry_due(now), "not due at once");
                    assert_eq!(p.retry_in(now), Some(wait), "the worker sleeps");
                    assert!(
                        matches!(p.commit(&mut io, || now), Commit::Waiting),
                        "no attempt before it is due"
                    );
                    waits.push(wait);
                    now += wait;
                    assert!(p.retry_due(now));
                }
                Commit::Sent => break,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(waits, [FIRST_RETRY, FIRST_RETRY * 2, FIRST_RETRY * 4]);
        assert_eq!(io.commits, 4, "one attempt per wait");
        assert_eq!(io.sent, [1, 2], "sent once, nothing lost");
        assert!(io.withdrawn.is_empty());
        assert!(!p.is_queued());
        assert_eq!(p.retry_in(now), None, "a success starts over");
        // The next refusal waits the first wait again.
        io.failures = 1;
        queue(&mut io, &mut p, &[3]);
        assert!(matches!(
            p.commit(&mut io, || now),
            Commit::Retrying { wait, .. } if wait == FIRST_RETRY
        ));
    }

    #[test]
    fn the_wait_between_retries_is_capped() {
        let mut io = FlakyQueue::failing(u32::MAX, libc::EBUSY);
        let mut p = Pending::default();
        queue(&mut io, &mut p, &[1]);
        let mut now = Instant::now();
        let mut last = Duration::ZERO;
        for _ in 0..12 {
            let Commit::Retrying { wait, .. } = p.commit(&mut io, || now) else {
                panic!("gave up too early");
            };
            assert!(wait > Duration::ZERO && wait <= MAX_RETRY);
            last = wait;
            now += wait;
        }
        assert_eq!(last, MAX_RETRY);
    }

    #[test]
    fn a_permanent_refusal_fails_each_request_once() {
        let mut io = FlakyQueue::failing(u32::MAX, libc::EINVAL);
        let mut p = Pending::default();
        queue(&mut io, &mut p, &[5, 6, 7]);
        let now = Instant::now();
        assert!(matches!(
            p.commit(&mut io, || now),
            Commit::Failed { withdrawn: 3, .. }
        ));
        assert!(!p.is_queued());
        assert_eq!(p.retry_in(now), None, "nothing to retry");
        let mut seen = Vec::new();
        io.reap(&mut |tag, r| seen.push((tag, r.is_err())));
        assert_eq!(seen, [(5, true), (6, true), (7, true)]);
        assert!(matches!(p.commit(&mut io, || now), Commit::Sent));
        assert_eq!(io.commits, 1, "nothing queued: no call");
    }

    #[test]
    fn transient_refusals_that_persist_fail_the_requests() {
        let mut io = FlakyQueue::failing(u32::MAX, libc::ENOMEM);
        let mut p = Pending::default();
        queue(&mut io, &mut p, &[9]);
        let t0 = Instant::now();
        let mut now = t0;
        let withdrawn = loop {
            match p.commit(&mut io, || now) {
                Commit::Retrying { wait, .. } => now += wait,
                Commit::Failed { withdrawn, .. } => break withdrawn,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(withdrawn, 1);
        assert!(now - t0 >= GIVE_UP_AFTER);
        assert!(now - t0 < GIVE_UP_AFTER + MAX_RETRY * 2, "not much later");
        assert_eq!(io.withdrawn, [9]);
        assert!(io.sent.is_empty());
    }
}
