//! One worker's queue to an RBD image.
//!
//! `submit` hands each request to librbd's asynchronous calls at once
//! (librbd has no batch to commit). librbd completes it on one of its own
//! threads by calling [`on_complete`], which appends `(slot, result)` to
//! the queue's completion list and writes the queue's eventfd only when
//! the list was empty: a burst of completions costs the worker one wakeup
//! and one lock to take them all in `reap`, with no thread hop or message
//! per request. (QEMU's `block/rbd.c` schedules a bottom half per
//! completion; SPDK's `bdev_rbd` sends a message per completion to the
//! submitting thread.)
//!
//! FUA: should librbd's cache be on (the backstore turns it off, but a
//! pool- or image-level setting applies at open), it may acknowledge a
//! write before the OSDs have it, so a FUA write is followed by a flush
//! of the image, issued from `reap` when the write completes, and
//! reported once the flush completes.
//!
//! Lifetime: each request's completion holds a strong count of the shared
//! part ([`Shared`]), released by the callback as its last act; and the
//! queue's Drop waits until librbd has called back for every request it
//! was given, so the iovecs (in [`Slots`]) and the memory they name stay
//! valid until librbd is done with them.

use std::ffi::{c_int, c_void};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use super::{Image, ffi};
use crate::capacity::Capacity;
use crate::slots::{ImmediateCompletions, Slots};
use crate::{BackstoreError, BackstoreQueue, Completion, IoOp, check_range, iov_len};

/// What the completion of a slot's request means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// A read: complete when librbd read every byte (its result is the
    /// bytes read).
    Read,
    /// A FUA write: a flush follows it.
    FuaWrite,
    /// A write (librbd's result is 0), flush, discard, zeroing, or the
    /// flush of a FUA write: complete when the result is not an error.
    Other,
}

/// The argument librbd hands back to [`on_complete`]: the shared part and
/// the request's slot.
struct SlotArg {
    shared: *const Shared,
    slot: u32,
}

/// The part of a queue librbd's threads reach.
struct Shared {
    finished: Mutex<Finished>,
    /// Signalled on each completion while the queue's Drop waits.
    drained: Condvar,
    /// Readable while completions wait in `finished`.
    eventfd: OwnedFd,
    /// One per slot, at stable addresses for as long as `Shared` lives.
    args: Box<[SlotArg]>,
}

// SAFETY: `args` only holds the address of the `Shared` that owns it (for
// the callback, which may run on any thread) and slot numbers; everything
// else is Send and Sync.
unsafe impl Send for Shared {}
// SAFETY: as above; `finished` is behind a mutex.
unsafe impl Sync for Shared {}

#[derive(Default)]
struct Finished {
    /// `(slot, librbd's result)` in completion order.
    list: Vec<(u32, isize)>,
    /// Requests librbd has called back for, ever.
    count: u64,
    /// The queue's Drop waits on `drained`.
    waiting: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Finished> {
        // A panic never happens while the lock is held (nothing in the
        // critical sections can panic but allocation failure, an abort).
        self.finished.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes the completion descriptor readable.
    fn kick(&self) {
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd; a
        // full counter (EAGAIN) still leaves it readable.
        unsafe { libc::write(self.eventfd.as_raw_fd(), (&1u64 as *const u64).cast(), 8) };
    }
}

/// librbd's completion callback, on one of its threads.
extern "C" fn on_complete(c: ffi::rbd_completion_t, arg: *mut c_void) {
    // SAFETY: `c` is the live completion librbd calls back for.
    let result = unsafe { ffi::rbd_aio_get_return_value(c) };
    // SAFETY: released once, by its only owner, and not used after.
    unsafe { ffi::rbd_aio_release(c) };
    // SAFETY: `arg` is the address of a `SlotArg` in `Shared::args`, and
    // this request holds a strong count of that `Shared` (taken in
    // `RbdQueue::start`), so it is alive until the decrement below.
    let (shared_ptr, slot) = unsafe {
        let arg = &*arg.cast::<SlotArg>();
        (arg.shared, arg.slot)
    };
    // SAFETY: as above.
    let shared = unsafe { &*shared_ptr };
    let mut finished = shared.lock();
    let was_empty = finished.list.is_empty();
    // Never reallocates: the list holds at most one entry per slot and
    // was made with that capacity (`reap` swaps in one of the same).
    finished.list.push((slot, result));
    finished.count += 1;
    let waiting = finished.waiting;
    drop(finished);
    if was_empty {
        // Whoever empties the list next (`reap`, under the lock) takes
        // this entry and any that follow before this write is read, so
        // writing only on empty never loses a wakeup.
        shared.kick();
    }
    if waiting {
        shared.drained.notify_all();
    }
    // SAFETY: gives back the strong count this request took; the last
    // act of the callback, which touches nothing of `Shared` after it.
    unsafe { Arc::decrement_strong_count(shared_ptr) };
}

/// A worker's queue to an RBD image.
pub(super) struct RbdQueue {
    image: Arc<Image>,
    shared: Arc<Shared>,
    slots: Slots,
    /// Per slot: what its completion means, and for reads and writes the
    /// bytes expected.
    phase: Vec<Phase>,
    /// The list swapped with `Shared`'s in `reap`, so that neither
    /// allocates.
    spare: Vec<(u32, isize)>,
    /// Zero-length requests, completed at submission.
    immediate: ImmediateCompletions,
    /// Requests handed to librbd, ever (compared with `Finished::count`).
    started: u64,
    capacity: Capacity,
    read_only: bool,
}

impl std::fmt::Debug for RbdQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RbdQueue")
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

impl RbdQueue {
    pub(super) fn new(
        image: Arc<Image>,
        depth: u32,
        capacity: Capacity,
        read_only: bool,
    ) -> Result<Self, BackstoreError> {
        // SAFETY: eventfd(2) has no memory-safety preconditions.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(BackstoreError::Setup(io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let eventfd = unsafe { OwnedFd::from_raw_fd(fd) };
        let n = usize::try_from(depth).unwrap_or(usize::MAX);
        let shared = Arc::new_cyclic(|weak| Shared {
            finished: Mutex::new(Finished {
                list: Vec::with_capacity(n),
                ..Finished::default()
            }),
            drained: Condvar::new(),
            eventfd,
            args: (0..depth)
                .map(|slot| SlotArg {
                    shared: weak.as_ptr(),
                    slot,
                })
                .collect(),
        });
        Ok(RbdQueue {
            image,
            shared,
            slots: Slots::new(depth),
            phase: vec![Phase::Other; n],
            spare: Vec::with_capacity(n),
            immediate: ImmediateCompletions::new(depth),
            started: 0,
            capacity,
            read_only,
        })
    }

    /// Hands the request of `slot` to librbd through `call`, with a
    /// completion that calls back [`on_complete`]. On error no callback
    /// will come, and the slot is still taken.
    fn start(
        &mut self,
        slot: u32,
        phase: Phase,
        call: impl FnOnce(ffi::rbd_image_t, ffi::rbd_completion_t) -> c_int,
    ) -> Result<(), BackstoreError> {
        let errno =
            |rc: c_int| BackstoreError::CephIo(io::Error::from_raw_os_error(rc.saturating_neg()));
        let Some(arg) = self.shared.args.get(slot as usize) else {
            return Err(BackstoreError::QueueFull("slot beyond the queue depth"));
        };
        let arg = ptr::from_ref(arg).cast_mut().cast::<c_void>();
        let mut c: ffi::rbd_completion_t = ptr::null_mut();
        // SAFETY: `arg` stays valid until the callback (see below); librbd
        // writes the new completion to `c`.
        let rc = unsafe { ffi::rbd_aio_create_completion(arg, on_complete, &mut c) };
        if rc < 0 {
            return Err(errno(rc));
        }
        self.phase[slot as usize] = phase;
        let shared = Arc::as_ptr(&self.shared);
        // SAFETY: `shared` comes from a live Arc; the count taken here is
        // the request's, given back by `on_complete` (or below).
        unsafe { Arc::increment_strong_count(shared) };
        self.started += 1;
        let rc = call(self.image.image, c);
        if rc < 0 {
            // librbd refused the request before taking the completion:
            // no callback will come.
            // SAFETY: `c` is ours and unused.
            unsafe { ffi::rbd_aio_release(c) };
            // SAFETY: the count taken above, which no callback will give
            // back.
            unsafe { Arc::decrement_strong_count(shared) };
            self.started -= 1;
            return Err(errno(rc));
        }
        Ok(())
    }

    /// [`Self::start`] for a slot just taken: given back on error.
    fn start_new(
        &mut self,
        slot: u32,
        phase: Phase,
        call: impl FnOnce(ffi::rbd_image_t, ffi::rbd_completion_t) -> c_int,
    ) -> Result<(), BackstoreError> {
        let result = self.start(slot, phase, call);
        if result.is_err() {
            self.slots.release(u64::from(slot));
        }
        result
    }

    /// Completes `tag` now (a zero-length request), waking the worker
    /// through the completion eventfd like a librbd completion would.
    fn complete_now(&mut self, tag: u64) -> Result<(), BackstoreError> {
        self.immediate.push(tag, Ok(0))?;
        self.shared.kick();
        Ok(())
    }

    /// Starts the flush that completes a FUA write in `slot`.
    fn flush_after_write(&mut self, slot: u32) -> Result<(), BackstoreError> {
        // SAFETY: the image is open; `c` is a fresh completion.
        self.start(slot, Phase::Other, |image, c| unsafe {
            ffi::rbd_aio_flush(image, c)
        })
    }
}

impl BackstoreQueue for RbdQueue {
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
        let writes = !matches!(op, IoOp::Read { .. } | IoOp::Flush);
        if writes && self.read_only {
            return Err(BackstoreError::ReadOnly);
        }
        match op {
            IoOp::Read { offset } | IoOp::Write { offset, .. } => {
                check_range(offset, u64::from(len), self.capacity.get())?;
                if len == 0 {
                    return self.complete_now(tag);
                }
                let (slot, iovecs) = self.slots.take(tag, len, iov)?;
                // At most MAX_SEGMENTS (checked by `take`).
                let n = c_int::try_from(iov.len()).unwrap_or(c_int::MAX);
                let phase = match op {
                    IoOp::Write { fua: true, .. } => Phase::FuaWrite,
                    IoOp::Write { .. } => Phase::Other,
                    _ => Phase::Read,
                };
                let read = phase == Phase::Read;
                // SAFETY: `iovecs` is the slot's copy of `iov`, kept until
                // the slot is released after the completion; the memory it
                // names stays valid until then by our caller's contract.
                self.start_new(slot, phase, |image, c| {
                    if read {
                        // SAFETY: as above, librbd writing into the iovecs.
                        unsafe { ffi::rbd_aio_readv(image, iovecs, n, offset, c) }
                    } else {
                        // SAFETY: as above, librbd reading from them.
                        unsafe { ffi::rbd_aio_writev(image, iovecs, n, offset, c) }
                    }
                })
            }
            IoOp::Flush => {
                let (slot, _) = self.slots.take(tag, 0, &[])?;
                // SAFETY: the image is open; no buffer is involved.
                self.start_new(slot, Phase::Other, |image, c| unsafe {
                    ffi::rbd_aio_flush(image, c)
                })
            }
            IoOp::Discard { offset, len } | IoOp::WriteZeroes { offset, len } => {
                check_range(offset, len, self.capacity.get())?;
                if len == 0 {
                    return self.complete_now(tag);
                }
                let size = usize::try_from(len).map_err(|_| {
                    BackstoreError::QueueFull("range larger than the address space")
                })?;
                let (slot, _) = self.slots.take(tag, 0, &[])?;
                let zero = matches!(op, IoOp::WriteZeroes { .. });
                self.start_new(slot, Phase::Other, |image, c| {
                    if zero {
                        // SAFETY: the image is open; no buffer is involved.
                        unsafe { ffi::rbd_aio_write_zeroes(image, offset, size, c, 0, 0) }
                    } else {
                        // SAFETY: the image is open; no buffer is involved.
                        unsafe { ffi::rbd_aio_discard(image, offset, len, c) }
                    }
                })
            }
        }
    }

    fn commit(&mut self) -> Result<(), BackstoreError> {
        Ok(())
    }

    fn reap(&mut self, done: Completion<'_>) {
        self.immediate.reap(done);
        {
            let mut finished = self.shared.lock();
            if finished.list.is_empty() {
                return;
            }
            std::mem::swap(&mut finished.list, &mut self.spare);
        }
        let mut batch = std::mem::take(&mut self.spare);
        for (slot, result) in batch.drain(..) {
            let phase = self
                .phase
                .get(slot as usize)
                .copied()
                .unwrap_or(Phase::Other);
            let flush_failed = if phase == Phase::FuaWrite && result >= 0 {
                match self.flush_after_write(slot) {
                    // Reported when the flush completes (its phase is
                    // Other; the slot keeps the write's tag and length).
                    Ok(()) => continue,
                    Err(e) => Some(e),
                }
            } else {
                None
            };
            let Some((tag, expected)) = self.slots.release(u64::from(slot)) else {
                continue;
            };
            let outcome = match (flush_failed, phase, u32::try_from(result)) {
                (Some(e), _, _) => Err(e),
                (None, _, Err(_)) => Err(BackstoreError::CephIo(io::Error::from_raw_os_error(
                    i32::try_from(result.saturating_neg()).unwrap_or(libc::EIO),
                ))),
                (None, Phase::Read, Ok(n)) if n != expected => {
                    Err(BackstoreError::ShortTransfer { expected, done: n })
                }
                _ => Ok(expected),
            };
            done(tag, outcome);
        }
        self.spare = batch;
    }

    fn in_flight(&self) -> u32 {
        self.slots.in_flight() + self.immediate.len()
    }

    fn completion_fd(&self) -> Option<RawFd> {
        Some(self.shared.eventfd.as_raw_fd())
    }
}

impl Drop for RbdQueue {
    /// Waits until librbd has called back for every request it was given:
    /// until then it may still write into (or read from) the memory the
    /// requests' iovecs name. Bounded by the client's OSD time-out.
    fn drop(&mut self) {
        let mut finished = self.shared.lock();
        finished.waiting = true;
        while finished.count < self.started {
            finished = self
                .shared
                .drained
                .wait(finished)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}
