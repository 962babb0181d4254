//! One doorbell: a cache line with a producer-owned `idx` and a
//! consumer-owned `flags` word.
//!
//! ```text
//! struct virtq_doorbell {        /* 64 bytes, 64-byte aligned */
//!     le16 idx;                  /* written by the producer only */
//!     le16 flags;                /* written by the consumer only */
//!                                /* bit 0 NEED_WAKEUP; bit 1 THROTTLE (SQ only) */
//!     u8   reserved[60];         /* zero; ignored by readers */
//! };
//! ```
//!
//! The handshake code reaches the two fields through [`DoorbellCell`], so
//! the same code runs on an in-process [`Doorbell`] (tests, loom), on a raw
//! mapping ([`RawDoorbell`]) and on guest memory
//! (`GuestDoorbell`, feature `guest-memory`).

use core::fmt;
use core::ptr::NonNull;

use crate::sync::AtomicU16;

/// Byte offset of `idx` inside a doorbell.
pub const IDX_OFFSET: usize = 0;
/// Byte offset of `flags` inside a doorbell.
pub const FLAGS_OFFSET: usize = 2;
/// `flags` bit: the consumer is (about to be) asleep and must be notified.
pub const NEED_WAKEUP: u16 = 1 << 0;
/// `sq.flags` bit (`VIRTQ_DOORBELL_F_THROTTLE`): the device has as much
/// work from the virtqueue as it wants now; buffers made available now
/// would wait on the ring (spec section "Backpressure"). Advisory: the
/// device still takes everything made available, later. Reserved in
/// `cq.flags`.
pub const THROTTLE: u16 = 1 << 1;

/// Access to the two shared fields of one doorbell.
///
/// Values are stored little-endian in memory; the handshake converts, so
/// implementations hand out the raw atomics only.
pub trait DoorbellCell {
    /// The producer-owned index.
    fn idx(&self) -> &AtomicU16;
    /// The consumer-owned flags.
    fn flags(&self) -> &AtomicU16;
}

impl<C: DoorbellCell + ?Sized> DoorbellCell for &C {
    fn idx(&self) -> &AtomicU16 {
        (**self).idx()
    }
    fn flags(&self) -> &AtomicU16 {
        (**self).flags()
    }
}

#[cfg(feature = "std")]
impl<C: DoorbellCell + ?Sized> DoorbellCell for std::sync::Arc<C> {
    fn idx(&self) -> &AtomicU16 {
        (**self).idx()
    }
    fn flags(&self) -> &AtomicU16 {
        (**self).flags()
    }
}

/// A doorbell laid out in memory exactly as the specification defines it.
#[repr(C, align(64))]
pub struct Doorbell {
    idx: AtomicU16,
    flags: AtomicU16,
    _reserved: [u8; 60],
}

impl Doorbell {
    /// A zeroed doorbell, the state the driver sets up before enabling a
    /// queue.
    pub fn new() -> Self {
        Doorbell {
            idx: AtomicU16::new(0),
            flags: AtomicU16::new(0),
            _reserved: [0; 60],
        }
    }
}

impl Default for Doorbell {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Doorbell").finish_non_exhaustive()
    }
}

impl DoorbellCell for Doorbell {
    fn idx(&self) -> &AtomicU16 {
        &self.idx
    }
    fn flags(&self) -> &AtomicU16 {
        &self.flags
    }
}

/// A doorbell in memory the caller mapped itself (shared memory of another
/// process, a guest's RAM).
pub struct RawDoorbell {
    base: NonNull<AtomicU16>,
}

impl RawDoorbell {
    /// Wraps the 64 bytes at `base`.
    ///
    /// # Safety
    ///
    /// `base` must be 64-byte aligned and point at 64 bytes that stay
    /// mapped, readable and writable for the life of the returned value and
    /// of everything built from it. The memory may be written concurrently
    /// by another process, but only through atomic 16-bit accesses to the
    /// two fields (any other writer makes the reads racy, not unsound, as
    /// long as it does not unmap the memory).
    pub unsafe fn new(base: NonNull<u8>) -> Self {
        debug_assert_eq!(base.as_ptr() as usize % 64, 0);
        RawDoorbell { base: base.cast() }
    }
}

impl fmt::Debug for RawDoorbell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawDoorbell")
            .field("base", &self.base)
            .finish()
    }
}

// SAFETY: the pointee is only ever accessed through atomics, which are
// `Sync`; the constructor's contract keeps it mapped while `self` lives.
unsafe impl Send for RawDoorbell {}
// SAFETY: as for `Send`: shared access is atomic access.
unsafe impl Sync for RawDoorbell {}

impl DoorbellCell for RawDoorbell {
    fn idx(&self) -> &AtomicU16 {
        // SAFETY: `new`'s contract: `base` is aligned (64 ≥ 2), mapped and
        // valid for 64 bytes while `self` lives; offset 0 holds `idx` and is
        // only accessed atomically.
        unsafe { self.base.as_ref() }
    }
    fn flags(&self) -> &AtomicU16 {
        // SAFETY: `flags` is the second u16 (byte offset 2): inside the 64
        // valid bytes `new`'s contract guarantees, so the offset stays in
        // the same allocation.
        let flags = unsafe { self.base.add(1) };
        // SAFETY: as for `idx`: aligned (2), mapped while `self` lives, and
        // only accessed atomically.
        unsafe { flags.as_ref() }
    }
}
