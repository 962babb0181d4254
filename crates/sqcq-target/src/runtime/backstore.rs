//! What every request handler does with its backstore queues beyond
//! submitting: sending what it queued, without losing it when the
//! backstore refuses (`commit`).

use sqcq_backstore::{BackstoreError, BackstoreQueue};

/// Sends what `io` has queued, if `queued`. The flag is cleared only once
/// the backstore took the requests: after a failed commit they are still
/// queued in `io` (io_uring keeps its submission entries when
/// `io_uring_enter` fails), and the flag left set makes the handler report
/// deferred work, so that the worker's next pass commits again instead of
/// leaving them unsent, a hang for the driver waiting for them.
pub(crate) fn commit(io: &mut dyn BackstoreQueue, queued: &mut bool) -> Result<(), BackstoreError> {
    if *queued {
        io.commit()?;
        *queued = false;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use std::os::fd::RawFd;

    use sqcq_backstore::{BackstoreError, BackstoreQueue, Completion, IoOp};

    /// A backstore queue whose first `failures` commits fail; it counts
    /// the commits that reached it and the ones that succeeded.
    #[derive(Default)]
    pub(crate) struct FlakyQueue {
        pub(crate) failures: u32,
        pub(crate) commits: u32,
        pub(crate) sent: u32,
    }

    impl BackstoreQueue for FlakyQueue {
        unsafe fn submit(
            &mut self,
            _: u64,
            _: IoOp,
            _: &[libc::iovec],
        ) -> Result<(), BackstoreError> {
            Ok(())
        }
        fn commit(&mut self) -> Result<(), BackstoreError> {
            self.commits += 1;
            if self.failures > 0 {
                self.failures -= 1;
                return Err(BackstoreError::Io(std::io::Error::from_raw_os_error(
                    libc::EBUSY,
                )));
            }
            self.sent += 1;
            Ok(())
        }
        fn reap(&mut self, _: Completion<'_>) {}
        fn in_flight(&self) -> u32 {
            0
        }
        fn completion_fd(&self) -> Option<RawFd> {
            None
        }
    }

    #[test]
    fn a_failed_commit_keeps_the_requests_queued_for_the_next_one() {
        let mut io = FlakyQueue {
            failures: 1,
            ..FlakyQueue::default()
        };
        let mut queued = true;
        assert!(super::commit(&mut io, &mut queued).is_err());
        assert!(queued, "still queued after the failure");
        super::commit(&mut io, &mut queued).unwrap();
        assert!(!queued);
        assert_eq!((io.commits, io.sent), (2, 1), "the second commit sent them");
        super::commit(&mut io, &mut queued).unwrap();
        assert_eq!(io.commits, 2, "nothing queued: no system call");
    }
}
