//! A window of the shared mapping accessed only through atomics.
//!
//! This is the one place where the driver turns pointers into the memfd
//! mapping into references. Everything in the window is shared with the
//! device (another process, possibly hostile), so every access is atomic:
//! the device may write any byte at any time, and an atomic access to
//! memory another party writes concurrently is defined behaviour (it reads
//! some value, which the caller then validates), where a plain or volatile
//! access would be a data race.

use std::mem::size_of;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};

use vm_memory::{GuestAddress, MmapRegion};

use crate::memory::{DriverMemory, MemoryError};

/// `len` bytes of the shared mapping starting at `base`, kept mapped by the
/// `Arc` (vm-memory unmaps a region only when its last owner drops it, and
/// never moves it).
#[derive(Debug)]
pub(crate) struct SharedWindow {
    _mapping: Arc<MmapRegion>,
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the window only hands out `&Atomic*` references into a mapping it
// keeps alive through an `Arc<MmapRegion>` (itself Send + Sync); atomics may
// be used from any thread, so moving the window to another thread is sound.
unsafe impl Send for SharedWindow {}

// SAFETY: as above; `&self` gives only atomic access to the window, so two
// threads holding `&SharedWindow` at once race on nothing.
unsafe impl Sync for SharedWindow {}

impl SharedWindow {
    /// The window over guest-physical `[gpa, gpa + len)` of `mem`.
    pub(crate) fn new(
        mem: &DriverMemory,
        gpa: GuestAddress,
        len: usize,
    ) -> Result<Self, MemoryError> {
        let (mapping, base) = mem.host_range(gpa, len)?;
        Ok(Self {
            _mapping: mapping,
            base,
            len,
        })
    }

    /// Pointer to a `T` at byte `offset`, checked to lie inside the window
    /// and to be aligned for `A` (the atomic type that will access it).
    fn ptr<T, A>(&self, offset: usize) -> *mut T {
        let ptr = self.base.as_ptr().wrapping_add(offset);
        // Offsets come from the ring layout and from indices the queue has
        // already bounded (masked or validated), never straight from the
        // device: failing here is a bug in this crate, and it must stop
        // before the pointer is dereferenced.
        assert!(
            offset
                .checked_add(size_of::<T>())
                .is_some_and(|end| end <= self.len)
                && ptr.cast::<A>().is_aligned(),
            "shared-memory access at {offset:#x} outside or misaligned in a window of {:#x}",
            self.len
        );
        ptr.cast()
    }

    /// The `u16` at byte `offset`.
    pub(crate) fn u16(&self, offset: usize) -> &AtomicU16 {
        let ptr = self.ptr::<u16, AtomicU16>(offset);
        // SAFETY: `ptr` is inside the window and aligned for AtomicU16
        // (checked by `ptr`); the window's mapping stays mapped, readable and
        // writable for as long as `self` lives, which bounds the returned
        // lifetime. In this process the shared memory is only accessed
        // through these same-sized atomics while the device may be using it
        // (tests that write it through vm-memory do so while the driver is
        // not accessing it), so there are no mixed non-atomic accesses.
        unsafe { AtomicU16::from_ptr(ptr) }
    }

    /// The `u32` at byte `offset`.
    pub(crate) fn u32(&self, offset: usize) -> &AtomicU32 {
        let ptr = self.ptr::<u32, AtomicU32>(offset);
        // SAFETY: as in `u16`, with the bounds and AtomicU32 alignment
        // checked by `ptr`.
        unsafe { AtomicU32::from_ptr(ptr) }
    }

    /// The `u64` at byte `offset`.
    pub(crate) fn u64(&self, offset: usize) -> &AtomicU64 {
        let ptr = self.ptr::<u64, AtomicU64>(offset);
        // SAFETY: as in `u16`, with the bounds and AtomicU64 alignment
        // checked by `ptr`.
        unsafe { AtomicU64::from_ptr(ptr) }
    }

    /// The `n` 64-bit words from byte `offset` (8-aligned), checked
    /// once: a descriptor or a header is several stores, and a check per
    /// store added measurably to writing them (docs/benchmarks.md,
    /// "Driver: the shared window's word stores").
    pub(crate) fn words(&self, offset: usize, n: usize) -> &[AtomicU64] {
        let bytes = n.saturating_mul(size_of::<u64>());
        let ptr = self.base.as_ptr().wrapping_add(offset);
        // As in `ptr`: a bad offset is a bug in this crate.
        assert!(
            offset.checked_add(bytes).is_some_and(|end| end <= self.len)
                && ptr.cast::<AtomicU64>().is_aligned(),
            "shared-memory access of {bytes:#x} at {offset:#x} outside or misaligned in a window of {:#x}",
            self.len
        );
        // SAFETY: `ptr..ptr + 8n` is inside the window and aligned for
        // AtomicU64 (checked above); the mapping stays mapped for as long
        // as `self` lives, which bounds the returned lifetime, and is only
        // accessed through same-sized atomics (see `u16`).
        unsafe { std::slice::from_raw_parts(ptr.cast::<AtomicU64>().cast_const(), n) }
    }

    /// Stores `bytes` at byte `offset` (8-aligned) as relaxed 64-bit
    /// stores, the last one padded with zeros: the window must hold
    /// `bytes.len()` rounded up to 8 from `offset`. For areas the driver
    /// writes and the device reads after a Release store announces them
    /// (request headers).
    pub(crate) fn store_bytes(&self, offset: usize, bytes: &[u8]) {
        let words = self.words(offset, bytes.len().div_ceil(8));
        let mut chunks = bytes.chunks_exact(8);
        for (word, chunk) in words.iter().zip(&mut chunks) {
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk);
            word.store(u64::from_ne_bytes(w), Ordering::Relaxed);
        }
        let rest = chunks.remainder();
        if let Some(last) = words.get(bytes.len() / 8)
            && !rest.is_empty()
        {
            let mut w = [0u8; 8];
            // Byte by byte: a copy of variable length would be a call to
            // memcpy on every request.
            for (to, from) in w.iter_mut().zip(rest) {
                *to = *from;
            }
            last.store(u64::from_ne_bytes(w), Ordering::Relaxed);
        }
    }

    /// Fills `out` from byte `offset` (any alignment) with relaxed loads of
    /// the 64-bit words that cover it: the window must hold those words.
    /// For areas the device writes and the driver reads after an Acquire
    /// load announces them (responses); the bytes are a snapshot the
    /// caller validates.
    pub(crate) fn load_bytes(&self, offset: usize, out: &mut [u8]) {
        let skip = offset % 8;
        let words = self.words(offset - skip, (skip + out.len()).div_ceil(8));
        let mut from = skip;
        let mut rest = &mut out[..];
        for word in words {
            let w = word.load(Ordering::Relaxed).to_ne_bytes();
            let n = (8 - from).min(rest.len());
            let (head, tail) = rest.split_at_mut(n);
            // Byte by byte, as in `store_bytes`: no memcpy call per word.
            for (to, b) in head.iter_mut().zip(&w[from..]) {
                *to = *b;
            }
            rest = tail;
            from = 0;
        }
    }
}
