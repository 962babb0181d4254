//! Backstores: where a logical unit keeps its blocks.
//!
//! A [`Backstore`] is shared by every worker that serves its LU; each
//! worker opens its own [`BackstoreQueue`], so the I/O path shares nothing
//! between workers (no lock, no shared ring). Requests carry iovecs that
//! point straight into guest memory: data is never copied through the
//! device. Submission is batched: [`BackstoreQueue::submit`] only queues,
//! [`BackstoreQueue::commit`] sends the batch with at most one system call,
//! [`BackstoreQueue::reap`] collects completions without blocking.
//!
//! - [`NullBackstore`]: drops writes and leaves read buffers alone (or
//!   zeroes them), like Linux's null_blk;
//!   measures the transport alone.
//! - [`RamBackstore`]: keeps data in anonymous memory.
//! - [`FileBackstore`]: a regular file or block device through io_uring,
//!   `O_DIRECT` when a request's buffers allow it, `RWF_DSYNC` for FUA,
//!   `fdatasync` for flushes, hole punching or `BLKDISCARD` for discards.
//! - [`RbdBackstore`] (cargo feature `rbd`, on by default; needs Debian's
//!   `librbd-dev`): a Ceph RBD image through librbd's asynchronous calls.
//!
//! No library offers this seam for userspace storage targets (SPDK's bdev
//! layer is the closest relative); it is written here. Both of `sqcqd`'s
//! device types, virtio-scsi and virtio-blk, use it.

#![deny(missing_docs)]

mod capacity;
mod error;
mod file;
mod lock;
mod null;
mod ram;
#[cfg(feature = "rbd")]
mod rbd;
mod slots;
mod sq_tail;
#[cfg(test)]
mod test_fork;

use std::os::fd::RawFd;

pub use error::BackstoreError;
pub use file::{FileBackstore, FileOptions};
pub use lock::{Conflict, Holder};
pub use null::NullBackstore;
pub use ram::RamBackstore;
#[cfg(feature = "rbd")]
pub use rbd::{DEFAULT_TIMEOUT_SECS, RbdBackstore, RbdOptions};
pub use slots::MAX_SEGMENTS;

/// Size and capabilities of a backstore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Logical block size in bytes (512 or 4096).
    pub block_size: u32,
    /// Number of logical blocks.
    pub blocks: u64,
    /// Writes are refused.
    pub read_only: bool,
    /// Discard (UNMAP) deallocates blocks.
    pub supports_unmap: bool,
    /// Blocks read as zeros after a discard.
    pub unmapped_reads_zero: bool,
}

impl Geometry {
    /// Capacity in bytes (saturating: geometries are validated on creation).
    pub fn bytes(&self) -> u64 {
        self.blocks.saturating_mul(u64::from(self.block_size))
    }
}

impl std::fmt::Display for Geometry {
    /// `16384 x 512 bytes (8 MiB), read-write, unmap (reads zeros)`: what
    /// a log line says of a disk.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bytes = self.bytes();
        let (size, unit) = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)]
            .iter()
            .find(|(_, shift)| bytes >= 1 << shift)
            .map_or((bytes, "bytes"), |(u, shift)| (bytes >> shift, *u));
        write!(
            f,
            "{} x {} bytes ({size} {unit}), {}",
            self.blocks,
            self.block_size,
            if self.read_only {
                "read-only"
            } else {
                "read-write"
            }
        )?;
        match (self.supports_unmap, self.unmapped_reads_zero) {
            (true, true) => f.write_str(", unmap (reads zeros)"),
            (true, false) => f.write_str(", unmap"),
            (false, _) => Ok(()),
        }
    }
}

/// One I/O operation. Offsets and lengths are in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoOp {
    /// Read into the iovecs from `offset`.
    Read {
        /// Byte offset on the backstore.
        offset: u64,
    },
    /// Write the iovecs at `offset`; with `fua` durable before completion.
    Write {
        /// Byte offset on the backstore.
        offset: u64,
        /// Force unit access: on stable storage when the write completes.
        fua: bool,
    },
    /// Make every completed write durable.
    Flush,
    /// Deallocate `len` bytes at `offset` (UNMAP).
    Discard {
        /// Byte offset on the backstore.
        offset: u64,
        /// Length in bytes.
        len: u64,
    },
    /// Make `len` bytes at `offset` read as zeros (WRITE SAME with zeros).
    WriteZeroes {
        /// Byte offset on the backstore.
        offset: u64,
        /// Length in bytes.
        len: u64,
    },
}

/// A backstore shared by the workers serving one logical unit.
pub trait Backstore: Send + Sync {
    /// Size and capabilities.
    fn geometry(&self) -> Geometry;
    /// Opens a per-worker I/O queue able to hold `depth` requests in flight.
    fn open_queue(&self, depth: u32) -> Result<Box<dyn BackstoreQueue>, BackstoreError>;
    /// Changes the capacity to `bytes` (a whole number of blocks) while
    /// queues are open and running; returns the new geometry. Growing makes
    /// the new range usable before any queue accepts it. Shrinking is only
    /// safe once the initiator can no longer reach the range given up (the
    /// logical unit shrank first and requests in flight were drained).
    fn resize(&self, bytes: u64) -> Result<Geometry, BackstoreError> {
        let _ = bytes;
        Err(BackstoreError::Unsupported("resize"))
    }
    /// Calls `changed` with the storage's new size in bytes (whole
    /// blocks) each time it changes outside the daemon, such as an RBD
    /// image resized in the cluster, from a thread of the backstore's own
    /// that `changed` must not block. Replaces an earlier watcher.
    /// Returns `Ok(false)` for storage nothing else resizes.
    fn watch_size(&self, changed: SizeWatcher) -> Result<bool, BackstoreError> {
        let _ = changed;
        Ok(false)
    }
    /// Takes (`true`) or gives up (`false`) what keeps other users off the
    /// storage while this one serves it (a file's image locks). Given up
    /// when a live migration stops the device at its source, taken again
    /// when a queue starts (at the destination: its first start). Nothing
    /// for storage that no one else can reach.
    fn set_active(&self, active: bool) -> Result<(), BackstoreError> {
        let _ = active;
        Ok(())
    }
}

/// What [`Backstore::watch_size`] calls with the new size in bytes.
pub type SizeWatcher = Box<dyn Fn(u64) + Send + Sync>;

/// The completion callback of [`BackstoreQueue::reap`]: the request's tag
/// and the bytes transferred, or why it failed.
pub type Completion<'a> = &'a mut dyn FnMut(u64, Result<u32, BackstoreError>);

/// One worker's queue to a backstore.
pub trait BackstoreQueue: Send {
    /// Queues a request under `tag`. Reads and writes transfer the iovecs'
    /// total length; other operations ignore them.
    ///
    /// # Safety
    ///
    /// Every iovec must describe memory that is valid for reads (writes) or
    /// writes (reads) for its whole length, and stays so until this queue
    /// has reported the tag's completion through [`reap`](Self::reap) or
    /// has been dropped. Guest memory qualifies while the guest memory map
    /// that holds it is alive.
    unsafe fn submit(
        &mut self,
        tag: u64,
        op: IoOp,
        iov: &[libc::iovec],
    ) -> Result<(), BackstoreError>;

    /// Sends every queued request, in at most one system call. On error
    /// the requests not sent stay queued: a later `commit` sends them, or
    /// [`withdraw`](Self::withdraw) gives up on them.
    fn commit(&mut self) -> Result<(), BackstoreError>;

    /// Gives up on every request queued and not sent (after `commit`
    /// failed and retrying is pointless): each completes through
    /// [`reap`](Self::reap) with an error and is never performed, so its
    /// memory is free once reaped. Requests sent already are not
    /// affected. Returns how many were withdrawn. The default withdraws
    /// nothing, for backstores that send each request in `submit` (their
    /// `commit` cannot fail).
    fn withdraw(&mut self) -> u32 {
        0
    }

    /// Hands every completion available now to `done`, without blocking.
    fn reap(&mut self, done: Completion<'_>);

    /// Requests submitted and not yet reaped.
    fn in_flight(&self) -> u32;

    /// A descriptor that becomes readable when completions are pending, for
    /// the worker's epoll set; `None` when completions are available as soon
    /// as `commit` returns. Reading it (8 bytes) rearms it.
    fn completion_fd(&self) -> Option<RawFd>;

    /// Asks the backstore to end every request in flight early (a queue
    /// stopping past its deadline). Each request still completes through
    /// [`reap`](Self::reap), failed if it was cancelled, done if it
    /// finished first: the memory its iovecs name stays in use until
    /// then, as [`submit`](Self::submit) says, whatever this returns. An
    /// operation already running in a kernel thread (a regular file's
    /// read or write in io-wq) may not be cancellable at all and can only
    /// be waited for. Calling it again is harmless; the default does
    /// nothing (backstores that complete requests inside `commit`).
    fn cancel(&mut self) -> Result<(), BackstoreError> {
        Ok(())
    }

    /// Restricts the kernel threads that do this queue's asynchronous
    /// completion work to `cpus` (io_uring's `IORING_REGISTER_IOWQ_AFF`),
    /// so that it does not compete with poll threads bound elsewhere.
    /// Returns `Ok(false)` when the backstore has no such work (it
    /// completes requests in the caller's thread): nothing to steer.
    fn steer_completions(&mut self, cpus: &[usize]) -> Result<bool, BackstoreError> {
        let _ = cpus;
        Ok(false)
    }
}

/// Checks that `len` bytes at `offset` lie within a backstore of `capacity`
/// bytes.
pub(crate) fn check_range(offset: u64, len: u64, capacity: u64) -> Result<(), BackstoreError> {
    match offset.checked_add(len) {
        Some(end) if end <= capacity => Ok(()),
        _ => Err(BackstoreError::OutOfRange {
            offset,
            len,
            capacity,
        }),
    }
}

/// Total length of an iovec list, or `None` if it does not fit 32 bits.
pub(crate) fn iov_len(iov: &[libc::iovec]) -> Option<u32> {
    iov.iter().try_fold(0u32, |acc, v| {
        acc.checked_add(u32::try_from(v.iov_len).ok()?)
    })
}
