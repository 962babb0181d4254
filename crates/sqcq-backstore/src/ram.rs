//! The RAM backstore: blocks in anonymous memory of this process.

use std::ptr::NonNull;
use std::sync::Arc;

use crate::slots::ImmediateCompletions;
use crate::{
    Backstore, BackstoreError, BackstoreQueue, Completion, Geometry, IoOp, check_range, iov_len,
};

/// Checks a size and block size and returns the geometry they make.
pub(crate) fn validated_geometry(bytes: u64, block_size: u32) -> Result<Geometry, BackstoreError> {
    if block_size != 512 && block_size != 4096 {
        return Err(BackstoreError::Geometry("block size must be 512 or 4096"));
    }
    if bytes == 0 || !bytes.is_multiple_of(u64::from(block_size)) {
        return Err(BackstoreError::Geometry(
            "size must be a non-zero multiple of the block size",
        ));
    }
    Ok(Geometry {
        block_size,
        blocks: bytes / u64::from(block_size),
        read_only: false,
        supports_unmap: true,
        unmapped_reads_zero: true,
    })
}

/// Anonymous private memory, unmapped on drop. Pages are allocated by the
/// kernel on first write, so a large RAM disk costs what is written.
#[derive(Debug)]
struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; concurrent
// access goes through raw copies whose ranges were bounds-checked.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly what mmap returned; nothing
        // refers to the mapping any more (queues hold an `Arc` of it).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// A backstore that keeps its blocks in memory; contents are lost when the
/// daemon exits.
#[derive(Debug)]
pub struct RamBackstore {
    geometry: Geometry,
    mapping: Arc<Mapping>,
}

impl RamBackstore {
    /// A zeroed RAM backstore of `bytes` bytes in blocks of `block_size`.
    pub fn new(bytes: u64, block_size: u32) -> Result<Self, BackstoreError> {
        let geometry = validated_geometry(bytes, block_size)?;
        let len = usize::try_from(bytes)
            .map_err(|_| BackstoreError::Geometry("size exceeds the address space"))?;
        // SAFETY: an anonymous private mapping at an address of the
        // kernel's choosing affects no existing memory.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(BackstoreError::Setup(std::io::Error::last_os_error()));
        }
        let base = NonNull::new(addr.cast::<u8>())
            .ok_or(BackstoreError::Geometry("mmap returned null"))?;
        Ok(RamBackstore {
            geometry,
            mapping: Arc::new(Mapping { base, len }),
        })
    }
}

impl Backstore for RamBackstore {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn open_queue(&self, depth: u32) -> Result<Box<dyn BackstoreQueue>, BackstoreError> {
        Ok(Box::new(RamQueue {
            mapping: Arc::clone(&self.mapping),
            done: ImmediateCompletions::new(depth),
        }))
    }
}

#[derive(Debug)]
struct RamQueue {
    mapping: Arc<Mapping>,
    done: ImmediateCompletions,
}

impl RamQueue {
    /// The mapping's bytes at `offset`, after `check_range` passed.
    fn at(&self, offset: u64) -> *mut u8 {
        // `offset <= len` was checked against the capacity, which is `len`.
        let offset = usize::try_from(offset).unwrap_or(self.mapping.len);
        self.mapping.base.as_ptr().wrapping_add(offset)
    }

    /// Copies between the store and the iovecs, `to_store` deciding the
    /// direction.
    ///
    /// # Safety
    ///
    /// As `BackstoreQueue::submit`; the range was checked.
    unsafe fn copy(&self, offset: u64, iov: &[libc::iovec], to_store: bool) {
        let mut at = self.at(offset);
        for v in iov {
            let buf = v.iov_base.cast::<u8>();
            let (src, dst) = if to_store {
                (buf.cast_const(), at)
            } else {
                (at.cast_const(), buf)
            };
            // SAFETY: the store range [offset, offset + total) was checked
            // to lie in the mapping; the iovec is valid for its length by
            // `submit`'s contract; guest buffers and the private mapping
            // never overlap. Concurrent overlapping requests from several
            // queues race exactly as they would on a disk: the initiator
            // gets no ordering between them, and bytes are plain data.
            unsafe { std::ptr::copy_nonoverlapping(src, dst, v.iov_len) };
            at = at.wrapping_add(v.iov_len);
        }
    }

    fn zero(&self, offset: u64, len: u64) {
        let len = usize::try_from(len).unwrap_or(0);
        // SAFETY: the range was checked to lie in the mapping.
        unsafe { std::ptr::write_bytes(self.at(offset), 0, len) };
    }
}

impl BackstoreQueue for RamQueue {
    unsafe fn submit(
        &mut self,
        tag: u64,
        op: IoOp,
        iov: &[libc::iovec],
    ) -> Result<(), BackstoreError> {
        let len = iov_len(iov).ok_or(BackstoreError::QueueFull("request larger than 4 GiB"))?;
        let capacity = u64::try_from(self.mapping.len).unwrap_or(u64::MAX);
        let result = match op {
            IoOp::Read { offset } | IoOp::Write { offset, .. } => {
                check_range(offset, u64::from(len), capacity).map(|()| {
                    // SAFETY: range checked; iovecs per our own contract.
                    unsafe { self.copy(offset, iov, matches!(op, IoOp::Write { .. })) };
                    len
                })
            }
            IoOp::Flush => Ok(0),
            IoOp::Discard { offset, len } | IoOp::WriteZeroes { offset, len } => {
                check_range(offset, len, capacity).map(|()| {
                    self.zero(offset, len);
                    0
                })
            }
        };
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
