//! Guest memory as the daemon maps it, and the frontend's dirty log.
//!
//! Guest memory is one type for the whole daemon, [`GuestMem`]: vm-memory's
//! mmap backend with a dirty-page bitmap slot per region. Every write of
//! the device into guest memory marks it: the copies and the used ring's
//! stores of a pass (`runtime::batch`) go through vm-memory's accessors
//! while logging is on, which do; the data a backstore writes through host
//! iovecs (zero-copy, out of vm-memory's sight) is marked by
//! `stream::mark_written` when it completes; a doorbell's `cq.idx` by
//! [`mark_doorbell`]. While dirty logging is off the slot is `None` and
//! marking costs a branch.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use vm_memory::bitmap::{Bitmap, WithBitmapSlice};
use vm_memory::{
    GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap,
};

/// The page size of the vhost dirty log: one bit per 4 KiB of guest
/// physical memory, whatever the host's page size (`VHOST_LOG_PAGE`).
pub const LOG_PAGE: u64 = 0x1000;

/// The frontend's dirty log (VHOST_USER_PROTOCOL_F_LOG_SHMFD,
/// SET_LOG_BASE): bit `n % 8` of byte `n / 8` stands for guest page `n`
/// (QEMU reads it as little-endian 64-bit words, which is the same
/// thing). The device sets bits with atomic ORs; the frontend reads and
/// clears them while it migrates. A page beyond the log's end cannot be
/// marked: it is counted and reported ([`LostMark`]). The session
/// refuses a log smaller than guest memory, so none should be.
pub struct DirtyLog {
    ptr: NonNull<u8>,
    len: usize,
    beyond: std::sync::atomic::AtomicU64,
    lost: LostMark,
    _keep: Box<dyn Send + Sync>,
}

/// Told of the guest address of every page written beyond the end of a
/// [`DirtyLog`] (the device counts it and logs it, rate-limited).
pub type LostMark = Box<dyn Fn(u64) + Send + Sync>;

// SAFETY: the log is shared memory accessed only through atomics.
unsafe impl Send for DirtyLog {}
// SAFETY: as above.
unsafe impl Sync for DirtyLog {}

impl std::fmt::Debug for DirtyLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirtyLog")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl DirtyLog {
    /// The log of `len` bytes at `ptr`, which tells `lost` of pages
    /// beyond its end.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes for as
    /// long as `keep` lives.
    pub unsafe fn new(
        ptr: NonNull<u8>,
        len: usize,
        keep: Box<dyn Send + Sync>,
        lost: LostMark,
    ) -> Self {
        DirtyLog {
            ptr,
            len,
            beyond: std::sync::atomic::AtomicU64::new(0),
            lost,
            _keep: keep,
        }
    }

    fn byte(&self, page: u64) -> Option<&AtomicU8> {
        let at = usize::try_from(page / 8).ok().filter(|&b| b < self.len)?;
        // SAFETY: `at` is within the log (checked above), which lives as
        // long as `self`.
        Some(unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().wrapping_add(at)) })
    }

    /// Marks the guest pages of `gpa..gpa + len` as written.
    pub fn mark(&self, gpa: u64, len: u64) {
        if len == 0 {
            return;
        }
        let first = gpa / LOG_PAGE;
        let last = gpa.saturating_add(len - 1) / LOG_PAGE;
        for page in first..=last {
            match self.byte(page) {
                // Relaxed: the frontend reads the log after the device
                // stopped, or again at a later pass; the page write came
                // before in program order (marks follow writes).
                Some(b) => {
                    b.fetch_or(1 << (page % 8), Ordering::Relaxed);
                }
                None => {
                    // Every later page is beyond as well: one report.
                    self.beyond.fetch_add(1, Ordering::Relaxed);
                    (self.lost)(page * LOG_PAGE);
                    return;
                }
            }
        }
    }

    /// Whether guest page of `gpa` is marked.
    pub fn is_marked(&self, gpa: u64) -> bool {
        let page = gpa / LOG_PAGE;
        self.byte(page)
            .is_some_and(|b| b.load(Ordering::Relaxed) & (1 << (page % 8)) != 0)
    }

    /// Clears every mark, as the frontend does when it reads the log (for
    /// tests).
    #[cfg(test)]
    pub fn clear(&self) {
        for at in 0..self.len {
            // SAFETY: within the log.
            unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().wrapping_add(at)) }
                .store(0, Ordering::Relaxed);
        }
    }

    /// Marks that fell beyond the end of the log.
    pub fn beyond(&self) -> u64 {
        self.beyond.load(Ordering::Relaxed)
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
}

/// The bytes of dirty log that cover every page of `mem`, up to its last
/// guest address (one bit per [`LOG_PAGE`], as the frontend sizes it).
pub fn log_bytes_needed(mem: &GuestMem) -> u64 {
    if mem.num_regions() == 0 {
        return 0;
    }
    let pages = mem.last_addr().0 / LOG_PAGE + 1;
    pages.div_ceil(8)
}

/// The dirty bitmap of one region while dirty logging is on: the
/// region's place in the frontend's [`DirtyLog`]. vm-memory's accessors
/// call it for every write they make, so copies and used-ring stores are
/// logged with no code of ours on their path.
#[derive(Clone, Debug)]
pub struct LogBitmap {
    log: Arc<DirtyLog>,
    /// Guest physical address of the region's first byte.
    base: u64,
}

impl LogBitmap {
    /// The bitmap of the region at guest address `base`.
    pub fn new(log: Arc<DirtyLog>, base: GuestAddress) -> Self {
        LogBitmap { log, base: base.0 }
    }
}

impl LogBitmap {
    /// The log it marks.
    pub fn log(&self) -> &DirtyLog {
        &self.log
    }
}

impl<'a> WithBitmapSlice<'a> for LogBitmap {
    type S = vm_memory::bitmap::RefSlice<'a, LogBitmap>;
}

impl Bitmap for LogBitmap {
    fn mark_dirty(&self, offset: usize, len: usize) {
        self.log
            .mark(self.base.wrapping_add(offset as u64), len as u64);
    }

    fn dirty_at(&self, offset: usize) -> bool {
        self.log.is_marked(self.base.wrapping_add(offset as u64))
    }

    fn slice_at(&self, offset: usize) -> <Self as WithBitmapSlice<'_>>::S {
        vm_memory::bitmap::RefSlice::new(self, offset)
    }
}

/// The dirty-page bitmap of one region of guest memory: `None` while dirty
/// logging is off, the region's view of the frontend's log while it is on.
pub type DirtyBitmap = Option<LogBitmap>;

/// Guest memory as the device maps it.
pub type GuestMem = GuestMemoryMmap<DirtyBitmap>;

/// One region of [`GuestMem`].
pub type GuestRegion = GuestRegionMmap<DirtyBitmap>;

/// Whether some region of `mem` logs the pages the device writes.
pub fn logging(mem: &GuestMem) -> bool {
    mem.iter().any(|r| r.bitmap().is_some())
}

/// Marks the doorbell area at `addr` (SQ and CQ doorbell,
/// VIRTIO_F_SQCQ_POLL) as written by the device through its raw mapping;
/// nothing while dirty logging is off.
pub fn mark_doorbell(mem: &GuestMem, addr: GuestAddress) {
    if !logging(mem) {
        return;
    }
    let len = usize::try_from(sqcq_protocol::layout::DOORBELL_AREA_SIZE).unwrap_or(usize::MAX);
    for slice in mem.get_slices(addr, len).flatten() {
        slice.bitmap().mark_dirty(0, slice.len());
    }
}

/// Anonymous guest memory over `ranges`, with dirty logging on if `logged`
/// (for tests and fuzzing: the daemon maps the frontend's files).
#[cfg(any(test, feature = "fuzzing"))]
pub fn memory_over(ranges: &[(GuestAddress, usize)], logged: bool) -> GuestMem {
    let log = logged.then(|| Arc::new(heap_log(1 << 16)));
    let regions = ranges
        .iter()
        .map(|&(addr, size)| {
            let bitmap = log.as_ref().map(|l| LogBitmap::new(Arc::clone(l), addr));
            let map = vm_memory::mmap::MmapRegionBuilder::new_with_bitmap(size, bitmap)
                .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
                .with_mmap_flags(libc::MAP_ANONYMOUS | libc::MAP_PRIVATE | libc::MAP_NORESERVE)
                .build()
                .expect("anonymous mapping");
            GuestRegion::new(map, addr).expect("region")
        })
        .collect();
    GuestMem::from_regions(regions).expect("non-overlapping ranges")
}

/// A dirty log of `len` bytes in memory of its own (for tests; the
/// daemon maps the frontend's).
#[cfg(any(test, feature = "fuzzing"))]
pub fn heap_log(len: usize) -> DirtyLog {
    let buf: &'static mut [u8] = Box::leak(vec![0u8; len].into_boxed_slice());
    let ptr = NonNull::new(buf.as_mut_ptr()).unwrap_or(NonNull::dangling());
    // SAFETY: the leaked buffer lives for ever.
    unsafe { DirtyLog::new(ptr, len, Box::new(()), Box::new(|_| {})) }
}

/// [`memory_over`] without dirty logging.
#[cfg(any(test, feature = "fuzzing"))]
pub fn test_memory(ranges: &[(GuestAddress, usize)]) -> GuestMem {
    memory_over(ranges, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_beyond_the_log_is_reported_not_marked() {
        let mut buf = [0u8; 1];
        let reported = Arc::new(std::sync::Mutex::new(Vec::new()));
        let r = Arc::clone(&reported);
        let ptr = NonNull::new(buf.as_mut_ptr()).unwrap();
        // SAFETY: `buf` outlives the log, which is dropped first.
        let log = unsafe {
            DirtyLog::new(
                ptr,
                1,
                Box::new(()),
                Box::new(move |gpa| r.lock().unwrap().push(gpa)),
            )
        };
        // One byte: pages 0 to 7. A write over pages 7 to 9 marks 7 and
        // reports 8 (the first one beyond), once.
        log.mark(7 * LOG_PAGE, 3 * LOG_PAGE);
        assert!(log.is_marked(7 * LOG_PAGE));
        assert_eq!(*reported.lock().unwrap(), vec![8 * LOG_PAGE]);
        assert_eq!(log.beyond(), 1);
        drop(log);
        assert_eq!(buf[0], 0x80);
    }

    fn dirty(m: &GuestMem, gpa: u64) -> bool {
        let r = m.find_region(GuestAddress(gpa)).unwrap();
        r.bitmap()
            .dirty_at(usize::try_from(gpa - r.start_addr().0).unwrap())
    }

    #[test]
    fn a_doorbell_area_is_marked_only_while_logging() {
        let m = memory_over(&[(GuestAddress(0), 0x10000)], true);
        assert!(logging(&m));
        mark_doorbell(&m, GuestAddress(0x5fc0));
        assert!(
            dirty(&m, 0x5000) && dirty(&m, 0x6000),
            "an area across a page boundary"
        );
        assert!(!dirty(&m, 0x7000) && !dirty(&m, 0x4000));
        let plain = test_memory(&[(GuestAddress(0), 0x10000)]);
        assert!(!logging(&plain));
        mark_doorbell(&plain, GuestAddress(0x5000));
        assert!(!dirty(&plain, 0x5000));
    }
}
