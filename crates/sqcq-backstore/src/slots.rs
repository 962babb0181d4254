//! Preallocated per-queue bookkeeping, so that no request allocates.

use std::collections::VecDeque;

use crate::{BackstoreError, BackstoreQueue, Completion, IoOp, iov_len};

/// Most data segments (iovecs) one request may carry. Devices advertise a
/// `seg_max` below this ([`crate::MAX_SEGMENTS`]).
pub const MAX_SEGMENTS: usize = 128;

/// Completions of a backstore that finishes requests inside `submit`
/// (null, RAM): kept in submission order until reaped.
///
/// A completion is 16 bytes (tag, length, whether it failed), the errors
/// kept apart in the same order: a `Result<u32, BackstoreError>` is 40
/// bytes, and moving one in and out of the queue per request, built piece
/// by piece on the stack and read back whole, stalled the worker on store
/// forwarding (docs/benchmarks.md, "Backstore: completion records of 16
/// bytes").
#[derive(Debug)]
pub(crate) struct ImmediateCompletions {
    done: VecDeque<Done>,
    errors: VecDeque<BackstoreError>,
    depth: usize,
}

/// One finished request.
#[derive(Clone, Copy, Debug)]
struct Done {
    tag: u64,
    /// Bytes transferred (unless it failed).
    len: u32,
    /// Its error is the next in `errors`.
    failed: bool,
}

impl ImmediateCompletions {
    pub(crate) fn new(depth: u32) -> Self {
        let depth = usize::try_from(depth).unwrap_or(usize::MAX).max(1);
        ImmediateCompletions {
            done: VecDeque::with_capacity(depth),
            errors: VecDeque::with_capacity(depth),
            depth,
        }
    }

    /// Records a finished request; refuses more than `depth` unreaped ones.
    #[inline]
    pub(crate) fn push(
        &mut self,
        tag: u64,
        result: Result<u32, BackstoreError>,
    ) -> Result<(), BackstoreError> {
        if self.done.len() >= self.depth {
            return Err(BackstoreError::QueueFull(
                "more requests than the queue depth",
            ));
        }
        let (len, failed) = match result {
            Ok(len) => (len, false),
            Err(e) => {
                self.errors.push_back(e);
                (0, true)
            }
        };
        self.done.push_back(Done { tag, len, failed });
        Ok(())
    }

    /// Records a request failed without being performed (see
    /// [`BackstoreQueue::withdraw`]): it held a slot until now, so it is
    /// within the queue's depth even when earlier completions fill
    /// `depth`.
    pub(crate) fn push_unbounded(&mut self, tag: u64, e: BackstoreError) {
        self.errors.push_back(e);
        self.done.push_back(Done {
            tag,
            len: 0,
            failed: true,
        });
    }

    pub(crate) fn reap(&mut self, done: Completion<'_>) {
        while let Some(d) = self.done.pop_front() {
            let result = if d.failed {
                // Every failed entry pushed its error, in the same order.
                Err(self
                    .errors
                    .pop_front()
                    .unwrap_or(BackstoreError::Unsupported("completion without its error")))
            } else {
                Ok(d.len)
            };
            done(d.tag, result);
        }
    }

    pub(crate) fn len(&self) -> u32 {
        u32::try_from(self.done.len()).unwrap_or(u32::MAX)
    }
}

/// A backstore whose requests finish inside `submit` (null, RAM): it only
/// says how to perform one operation.
pub(crate) trait Immediate: Send + std::fmt::Debug {
    /// Performs `op` of `len` bytes over `iov` now; returns the bytes
    /// transferred.
    ///
    /// # Safety
    ///
    /// As [`BackstoreQueue::submit`].
    unsafe fn perform(
        &mut self,
        op: IoOp,
        iov: &[libc::iovec],
        len: u32,
    ) -> Result<u32, BackstoreError>;
}

/// The queue of an [`Immediate`] backstore: performs in `submit`, hands
/// the results out in `reap`, in submission order.
#[derive(Debug)]
pub(crate) struct ImmediateQueue<T> {
    store: T,
    done: ImmediateCompletions,
}

impl<T> ImmediateQueue<T> {
    pub(crate) fn new(store: T, depth: u32) -> Self {
        ImmediateQueue {
            store,
            done: ImmediateCompletions::new(depth),
        }
    }
}

impl<T: Immediate> BackstoreQueue for ImmediateQueue<T> {
    unsafe fn submit(
        &mut self,
        tag: u64,
        op: IoOp,
        iov: &[libc::iovec],
    ) -> Result<(), BackstoreError> {
        let Some(len) = iov_len(iov) else {
            // (`ok_or` would build and drop the error on every request.)
            return Err(BackstoreError::QueueFull("request larger than 4 GiB"));
        };
        // SAFETY: our caller upholds `submit`'s contract, which is
        // `perform`'s.
        let result = unsafe { self.store.perform(op, iov, len) };
        self.done.push(tag, result)
    }

    fn commit(&mut self) -> Result<(), BackstoreError> {
        Ok(())
    }

    fn reap(&mut self, done: Completion<'_>) {
        self.done.reap(done);
    }

    fn in_flight(&self) -> u32 {
        self.done.len()
    }

    fn completion_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
}

/// What a request in flight in the kernel needs to be completed: its tag,
/// its expected length, and its iovecs, which must outlive submission.
#[derive(Debug)]
pub(crate) struct Slots {
    tags: Vec<u64>,
    expected: Vec<u32>,
    iovecs: Vec<libc::iovec>,
    busy: Vec<bool>,
    free: Vec<u32>,
}

// SAFETY: the iovecs are plain addresses owned by the caller of
// `BackstoreQueue::submit`, whose contract keeps them valid until reaped;
// `Slots` never dereferences them, the kernel does.
unsafe impl Send for Slots {}

impl Slots {
    pub(crate) fn new(depth: u32) -> Self {
        let n = usize::try_from(depth).unwrap_or(usize::MAX);
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        Slots {
            tags: vec![0; n],
            expected: vec![0; n],
            iovecs: vec![empty; n.saturating_mul(MAX_SEGMENTS)],
            busy: vec![false; n],
            free: (0..depth).rev().collect(),
        }
    }

    /// Takes a slot for `tag`, copying `iov` into it. Returns the slot index
    /// and the address of its iovec copy.
    pub(crate) fn take(
        &mut self,
        tag: u64,
        expected: u32,
        iov: &[libc::iovec],
    ) -> Result<(u32, *const libc::iovec), BackstoreError> {
        if iov.len() > MAX_SEGMENTS {
            return Err(BackstoreError::QueueFull(
                "more segments than one request may carry",
            ));
        }
        let Some(slot) = self.free.pop() else {
            return Err(BackstoreError::QueueFull(
                "more requests than the queue depth",
            ));
        };
        let i = slot as usize;
        self.busy[i] = true;
        self.tags[i] = tag;
        self.expected[i] = expected;
        let start = i * MAX_SEGMENTS;
        self.iovecs[start..start + iov.len()].copy_from_slice(iov);
        Ok((slot, self.iovecs[start..].as_ptr()))
    }

    /// Gives back a slot; returns its tag and expected length, or `None`
    /// for an index that is not in flight (a kernel bug; ignored).
    pub(crate) fn release(&mut self, slot: u64) -> Option<(u64, u32)> {
        let i = usize::try_from(slot)
            .ok()
            .filter(|&i| i < self.tags.len())?;
        if !std::mem::replace(&mut self.busy[i], false) {
            return None;
        }
        self.free.push(u32::try_from(i).ok()?);
        Some((self.tags[i], self.expected[i]))
    }

    pub(crate) fn in_flight(&self) -> u32 {
        u32::try_from(self.tags.len() - self.free.len()).unwrap_or(u32::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_come_back_in_order_with_their_errors() {
        let mut c = ImmediateCompletions::new(4);
        c.push(7, Ok(4096)).unwrap();
        c.push(3, Err(BackstoreError::ReadOnly)).unwrap();
        c.push(9, Ok(0)).unwrap();
        c.push(1, Err(BackstoreError::Geometry("x"))).unwrap();
        assert!(
            matches!(c.push(2, Ok(1)), Err(BackstoreError::QueueFull(_))),
            "more than the depth"
        );
        assert_eq!(c.len(), 4);
        let mut seen = Vec::new();
        c.reap(&mut |tag, r| seen.push((tag, r.map_err(|e| e.to_string()))));
        assert_eq!(
            seen,
            [
                (7, Ok(4096)),
                (3, Err("backstore is read-only".to_string())),
                (9, Ok(0)),
                (1, Err("invalid geometry: x".to_string())),
            ]
        );
        assert_eq!(c.len(), 0);
        c.push(5, Ok(512)).unwrap();
        let mut again = Vec::new();
        c.reap(&mut |tag, r| again.push((tag, r.ok())));
        assert_eq!(again, [(5, Some(512))], "no error left behind");
    }
}
