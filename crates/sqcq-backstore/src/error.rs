//! Backstore errors.

use std::io;
use std::path::PathBuf;

use thiserror::Error;

use crate::Conflict;

/// Why a backstore operation failed. The target turns each into SCSI sense
/// (MEDIUM ERROR or HARDWARE ERROR) in one place; none is ever reported to
/// the initiator as success.
#[derive(Debug, Error)]
pub enum BackstoreError {
    /// The backing file or device could not be opened or sized.
    #[error("cannot open backstore {path}")]
    Open {
        /// The path given.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: io::Error,
    },
    /// The backing file does not exist and `create` was not given.
    #[error(
        "{path} does not exist: check the path, or add create (with size=) to make a new \
         sparse file"
    )]
    Missing {
        /// The path given.
        path: PathBuf,
    },
    /// A `ram` LUN larger than the memory the daemon can map.
    #[error(
        "a ram LUN of {bytes} bytes cannot be mapped ({why}; this machine has {memory} bytes \
         of memory, and a ram LUN lives in the daemon's): give a smaller size=, or use kind=file"
    )]
    RamTooLarge {
        /// The size asked for.
        bytes: u64,
        /// The machine's physical memory.
        memory: u64,
        /// What the system said.
        why: io::Error,
    },
    /// Another process uses the image in a way this one excludes (see
    /// [`Conflict`]).
    #[error(
        "{path}: {conflict}: is another sqcqd, QEMU or qemu-storage-daemon using it? \
         (lock=off serves it anyway, for storage something else arbitrates)"
    )]
    Locked {
        /// The path given.
        path: PathBuf,
        /// Who holds what.
        conflict: Conflict,
    },
    /// `size=` asks for more than the existing file or device holds (the
    /// daemon never grows an existing file).
    #[error("{path} holds {available} bytes, fewer than size={size}")]
    TooSmall {
        /// The path given.
        path: PathBuf,
        /// The size asked for.
        size: u64,
        /// What the file or device holds.
        available: u64,
    },
    /// The geometry asked for is impossible (zero size, block size other
    /// than 512 or 4096, a size that is not a whole number of blocks).
    #[error("invalid geometry: {0}")]
    Geometry(&'static str),
    /// A call to Ceph (librados, librbd) failed: connecting to the
    /// cluster, opening the pool or image, reading its size.
    #[error("{what}")]
    Ceph {
        /// What was attempted, naming the image or the user.
        what: String,
        /// What Ceph said (its `-errno`).
        #[source]
        source: io::Error,
    },
    /// The backing file or device could not be resized.
    #[error("cannot resize the backstore to {bytes} bytes")]
    Resize {
        /// The size asked for.
        bytes: u64,
        /// What the system said.
        #[source]
        source: io::Error,
    },
    /// Setting up the per-worker queue (io_uring, eventfd) failed.
    #[error("cannot set up an I/O queue")]
    Setup(#[source] io::Error),
    /// The kernel failed the I/O.
    #[error("I/O error")]
    Io(#[source] io::Error),
    /// The Ceph cluster failed the request (librbd's result): a time-out
    /// (`ETIMEDOUT`, after `rados_osd_op_timeout`), this client
    /// blocklisted (`ESHUTDOWN`), an OSD's `EIO`, and so on. Apart from
    /// [`BackstoreError::Io`] so that the daemon counts it apart.
    #[error("the Ceph cluster failed the request")]
    CephIo(#[source] io::Error),
    /// Fewer bytes were transferred than asked for.
    #[error("short transfer: {done} of {expected} bytes")]
    ShortTransfer {
        /// Bytes asked for.
        expected: u32,
        /// Bytes transferred.
        done: u32,
    },
    /// The request reaches past the end of the backstore.
    #[error("{len} bytes at offset {offset} exceed capacity {capacity}")]
    OutOfRange {
        /// Byte offset.
        offset: u64,
        /// Length in bytes.
        len: u64,
        /// Backstore capacity in bytes.
        capacity: u64,
    },
    /// A write or discard to a read-only backstore.
    #[error("backstore is read-only")]
    ReadOnly,
    /// More requests than the queue was opened for, or more segments than
    /// one request may carry.
    #[error("queue full: {0}")]
    QueueFull(&'static str),
    /// The backstore cannot perform this operation.
    #[error("operation not supported: {0}")]
    Unsupported(&'static str),
}
