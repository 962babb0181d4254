//! The RAM backstore: blocks in anonymous memory of this process.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};

use crate::capacity::Capacity;
use crate::slots::{Immediate, ImmediateQueue};
use crate::{Backstore, BackstoreError, BackstoreQueue, Geometry, IoOp, check_range};

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

/// Address space reserved for a RAM backstore to grow into: at least this
/// much (inaccessible and uncharged until a resize makes it writable).
const RESERVE: u64 = 64 << 30;

/// Anonymous private memory, unmapped on drop. `len` bytes of address
/// space are reserved; the first `accessible` are readable and writable.
/// Pages are allocated by the kernel on first write, so a large RAM disk
/// costs what is written.
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

fn reserve(len: usize) -> Option<NonNull<u8>> {
    // SAFETY: an anonymous private mapping at an address of the kernel's
    // choosing affects no existing memory. PROT_NONE: not yet usable, and
    // not charged against the commit limit.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return None;
    }
    NonNull::new(addr.cast::<u8>())
}

/// A backstore that keeps its blocks in memory; contents are lost when the
/// daemon exits. It can grow up to the address space reserved when it was
/// created (at least 64 GiB, else its initial size).
#[derive(Debug)]
pub struct RamBackstore {
    /// The geometry at creation; `blocks` follows `capacity`.
    geometry: Geometry,
    mapping: Arc<Mapping>,
    capacity: Capacity,
    /// Bytes made accessible so far (only grows); serialises resizes.
    accessible: Mutex<usize>,
}

impl RamBackstore {
    /// A zeroed RAM backstore of `bytes` bytes in blocks of `block_size`.
    pub fn new(bytes: u64, block_size: u32) -> Result<Self, BackstoreError> {
        let geometry = validated_geometry(bytes, block_size)?;
        let len = usize::try_from(bytes)
            .map_err(|_| BackstoreError::Geometry("size exceeds the address space"))?;
        let room = usize::try_from(bytes.max(RESERVE)).unwrap_or(len);
        // A smaller reservation when the address space is limited
        // (ulimit -v): the LUN then cannot grow.
        let too_large = |why| BackstoreError::RamTooLarge {
            bytes,
            memory: physical_memory(),
            why,
        };
        let (base, room) = match reserve(room) {
            Some(b) => (b, room),
            None => (
                reserve(len).ok_or_else(|| too_large(std::io::Error::last_os_error()))?,
                len,
            ),
        };
        let mapping = Arc::new(Mapping { base, len: room });
        make_accessible(&mapping, 0, len).map_err(|e| match e {
            BackstoreError::Setup(why) if why.raw_os_error() == Some(libc::ENOMEM) => {
                too_large(why)
            }
            e => e,
        })?;
        Ok(RamBackstore {
            geometry,
            mapping,
            capacity: Capacity::new(bytes),
            accessible: Mutex::new(len),
        })
    }
}

/// Makes `[from, to)` of the mapping readable and writable.
fn make_accessible(m: &Mapping, from: usize, to: usize) -> Result<(), BackstoreError> {
    if to <= from {
        return Ok(());
    }
    // mprotect needs a page-aligned start; the page holding `from` is
    // already accessible, so rounding down changes nothing there.
    let page = page_size();
    let start = from / page * page;
    // SAFETY: `[start, to)` lies within the reservation (`to <= len`,
    // checked by the callers); changing protection from none to
    // read-write exposes fresh zero pages, nothing else refers to them.
    let rc = unsafe {
        libc::mprotect(
            m.base.as_ptr().wrapping_add(start).cast(),
            to - start,
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    if rc != 0 {
        return Err(BackstoreError::Setup(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// The machine's physical memory in bytes (0 if unknown), for messages.
fn physical_memory() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
    u64::try_from(pages).unwrap_or(0) * page_size() as u64
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).unwrap_or(4096).max(1)
}

impl Backstore for RamBackstore {
    fn geometry(&self) -> Geometry {
        Geometry {
            blocks: self.capacity.get() / u64::from(self.geometry.block_size),
            ..self.geometry
        }
    }

    fn open_queue(&self, depth: u32) -> Result<Box<dyn BackstoreQueue>, BackstoreError> {
        let store = RamQueue {
            mapping: Arc::clone(&self.mapping),
            capacity: self.capacity.clone(),
        };
        Ok(Box::new(ImmediateQueue::new(store, depth)))
    }

    /// Grows within the reservation, or shrinks: the bytes given up are
    /// zeroed (and their pages returned to the kernel) so that growing
    /// again shows zeros, but stay mapped, so that a late request racing
    /// the shrink cannot fault.
    fn resize(&self, bytes: u64) -> Result<Geometry, BackstoreError> {
        validated_geometry(bytes, self.geometry.block_size)?;
        let new = usize::try_from(bytes)
            .ok()
            .filter(|n| *n <= self.mapping.len)
            .ok_or(BackstoreError::Unsupported(
                "growing a RAM LUN past the address space reserved for it",
            ))?;
        let mut accessible = self
            .accessible
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let old = usize::try_from(self.capacity.get()).unwrap_or(0);
        if new > *accessible {
            make_accessible(&self.mapping, *accessible, new)?;
            *accessible = new;
        }
        if new < old {
            self.capacity.set(bytes);
            let page = page_size();
            let first_page = new.div_ceil(page) * page;
            let partial_end = first_page.min(old);
            // SAFETY: `[new, partial_end)` lies in the accessible part of
            // the mapping; no request can reach it any more (see the trait).
            unsafe {
                std::ptr::write_bytes(
                    self.mapping.base.as_ptr().wrapping_add(new),
                    0,
                    partial_end - new,
                )
            };
            if first_page < old {
                // SAFETY: whole pages of our own private anonymous
                // mapping; MADV_DONTNEED makes them read as zeros.
                unsafe {
                    libc::madvise(
                        self.mapping.base.as_ptr().wrapping_add(first_page).cast(),
                        old - first_page,
                        libc::MADV_DONTNEED,
                    )
                };
            }
        } else {
            self.capacity.set(bytes);
        }
        Ok(self.geometry())
    }
}

#[derive(Debug)]
struct RamQueue {
    mapping: Arc<Mapping>,
    capacity: Capacity,
}

impl RamQueue {
    /// The mapping's bytes at `offset`, after `check_range` passed.
    fn at(&self, offset: u64) -> *mut u8 {
        // `offset <= capacity <= len` was checked.
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

    /// Zeroes a checked range: whole pages are given back to the kernel
    /// (`MADV_DONTNEED`, after which they read as zeros and cost no
    /// memory), the partial pages at either end are cleared.
    fn zero(&self, offset: u64, len: u64) {
        const PAGE: usize = 4096;
        let len = usize::try_from(len).unwrap_or(0);
        let start = self.at(offset);
        let head = start.align_offset(PAGE).min(len);
        let pages = (len - head) / PAGE * PAGE;
        // SAFETY: the range was checked to lie in the mapping.
        unsafe { std::ptr::write_bytes(start, 0, head) };
        if pages > 0 {
            // SAFETY: whole pages inside the checked range of our own
            // private anonymous mapping; they read as zeros afterwards.
            unsafe { libc::madvise(start.wrapping_add(head).cast(), pages, libc::MADV_DONTNEED) };
        }
        let tail = len - head - pages;
        // SAFETY: the rest of the checked range.
        unsafe { std::ptr::write_bytes(start.wrapping_add(head + pages), 0, tail) };
    }
}

impl Immediate for RamQueue {
    unsafe fn perform(
        &mut self,
        op: IoOp,
        iov: &[libc::iovec],
        len: u32,
    ) -> Result<u32, BackstoreError> {
        let capacity = self.capacity.get();
        match op {
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
        }
    }
}
