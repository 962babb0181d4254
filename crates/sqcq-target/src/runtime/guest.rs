//! Byte streams over a list of guest buffers: gather, scatter, and host
//! iovecs for zero-copy I/O.
//!
//! A request's device-readable buffers form one stream (header, then
//! data-out) and its device-writable buffers another (response, then
//! data-in); these helpers address them by stream offset, whatever the
//! guest's framing. Every access goes through vm-memory's checked
//! accessors; an address outside guest memory is an error, not a fault.
//!
//! Guest memory is one type for the whole daemon, [`GuestMem`]: vm-memory's
//! mmap backend with a dirty-page bitmap slot per region. Every write of
//! the device into guest memory marks it: the copies here and the used
//! ring's stores go through vm-memory's accessors, which do; the data a
//! backstore writes through [`iovecs`] (zero-copy, out of vm-memory's
//! sight) is marked by [`mark_written`] when it completes; a doorbell's
//! `cq.idx` by [`mark_doorbell`]. While dirty logging is off the slot is
//! `None` and marking costs a branch.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use thiserror::Error;
use vm_memory::bitmap::{Bitmap, WithBitmapSlice};
use vm_memory::{
    GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap,
};

use crate::runtime::batch::Batch;
use crate::runtime::chain::Segment;

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

/// A guest buffer could not be accessed.
#[derive(Debug, Error)]
pub enum GuestError {
    /// The stream is shorter than the access.
    #[error("access of {len} bytes at stream offset {offset} exceeds the buffers")]
    Short {
        /// Stream offset of the access.
        offset: u64,
        /// Its length.
        len: u64,
    },
    /// Guest memory refused the access (address outside guest memory).
    #[error("guest memory access failed")]
    Memory(#[source] vm_memory::GuestMemoryError),
}

/// Calls `f(guest address, range in the caller's buffer)` for each piece
/// of the stream range `offset..offset + len`.
fn for_each_piece(
    segs: &[Segment],
    offset: u64,
    len: u64,
    mut f: impl FnMut(GuestAddress, usize, usize) -> Result<(), GuestError>,
) -> Result<(), GuestError> {
    let short = || GuestError::Short { offset, len };
    let mut skip = offset;
    let mut done = 0u64;
    for seg in segs {
        if done == len {
            return Ok(());
        }
        let seg_len = u64::from(seg.len);
        if skip >= seg_len {
            skip -= seg_len;
            continue;
        }
        let take = (seg_len - skip).min(len - done);
        let addr = seg.addr.0.checked_add(skip).ok_or_else(short)?;
        let start = usize::try_from(done).map_err(|_| short())?;
        let n = usize::try_from(take).map_err(|_| short())?;
        f(GuestAddress(addr), start, n)?;
        done += take;
        skip = 0;
    }
    if done == len { Ok(()) } else { Err(short()) }
}

/// The guest address of stream bytes `offset..offset + len` when they lie
/// in one buffer: a request's header, its response and its data buffer
/// nearly always do, and then an access is one lookup and one copy
/// without [`for_each_piece`]'s walk.
#[inline]
fn one_piece(segs: &[Segment], offset: u64, len: u64) -> Option<u64> {
    let mut skip = offset;
    for seg in segs {
        let seg_len = u64::from(seg.len);
        if skip < seg_len {
            return (len <= seg_len - skip).then(|| seg.addr.0.checked_add(skip))?;
        }
        skip -= seg_len;
    }
    None
}

/// Copies `buf.len()` bytes from the stream at `offset` into `buf`.
pub fn read_at(
    m: Batch<'_>,
    segs: &[Segment],
    offset: u64,
    buf: &mut [u8],
) -> Result<(), GuestError> {
    let len = buf.len() as u64;
    if let Some(gpa) = one_piece(segs, offset, len) {
        return m.read(gpa, buf).map_err(GuestError::Memory);
    }
    for_each_piece(segs, offset, len, |addr, start, n| {
        m.read(addr.0, &mut buf[start..start + n])
            .map_err(GuestError::Memory)
    })
}

/// Copies `buf` into the stream at `offset`.
pub fn write_at(m: Batch<'_>, segs: &[Segment], offset: u64, buf: &[u8]) -> Result<(), GuestError> {
    let len = buf.len() as u64;
    if buf.is_empty() {
        return Ok(());
    }
    if let Some(gpa) = one_piece(segs, offset, len) {
        return m.write(gpa, buf).map_err(GuestError::Memory);
    }
    for_each_piece(segs, offset, len, |addr, start, n| {
        m.write(addr.0, &buf[start..start + n])
            .map_err(GuestError::Memory)
    })
}

/// Copies the `N` bytes of `buf` into the stream at `offset`: as
/// [`write_at`], but one store of `N` bytes when they go to one buffer (a
/// response's fixed part), not a `memcpy` call.
pub fn write_bytes_at<const N: usize>(
    m: Batch<'_>,
    segs: &[Segment],
    offset: u64,
    buf: &[u8; N],
) -> Result<(), GuestError> {
    if let Some(gpa) = one_piece(segs, offset, N as u64) {
        return m.write_bytes(gpa, buf).map_err(GuestError::Memory);
    }
    write_at(m, segs, offset, buf)
}

/// Appends host iovecs covering the stream range `offset..offset + len` to
/// `out` (a guest buffer that spans two memory regions gives two iovecs).
///
/// The iovecs point into the mappings of the batch's map; they stay valid
/// as long as that map (an `Arc` of it, a request's pin) is alive. What
/// the backstore writes through them is marked by [`mark_written`].
pub fn iovecs(
    m: Batch<'_>,
    segs: &[Segment],
    offset: u64,
    len: u64,
    out: &mut Vec<libc::iovec>,
) -> Result<(), GuestError> {
    for_each_piece(segs, offset, len, |addr, _start, n| {
        m.iovecs(addr.0, n, out).map_err(GuestError::Memory)
    })
}

/// Whether some region of `mem` logs the pages the device writes.
pub fn logging(mem: &GuestMem) -> bool {
    mem.iter().any(|r| r.bitmap().is_some())
}

/// Marks the stream range `offset..offset + len` as written by the device
/// (data a backstore wrote through [`iovecs`]); nothing while dirty
/// logging is off. Ranges outside guest memory are skipped: [`iovecs`]
/// refused them before anything was written.
pub fn mark_written(m: Batch<'_>, segs: &[Segment], offset: u64, len: u64) {
    if !m.logged() {
        return;
    }
    let _ = for_each_piece(segs, offset, len, |addr, _start, n| {
        m.mark(addr.0, n);
        Ok(())
    });
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
    use crate::runtime::batch::Mapped;
    use vm_memory::Bytes;

    fn mapped(m: GuestMem) -> Mapped {
        Mapped::new(Arc::new(m))
    }

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

    fn segs() -> Vec<Segment> {
        vec![
            Segment {
                addr: GuestAddress(0x1000),
                len: 10,
            },
            Segment {
                addr: GuestAddress(0x2000),
                len: 0,
            },
            Segment {
                addr: GuestAddress(0x3000),
                len: 20,
            },
        ]
    }

    #[test]
    fn scatter_then_gather_across_segments() {
        let mapped = mapped(test_memory(&[(GuestAddress(0), 0x10000)]));
        let (b, m) = (mapped.batch(), mapped.map());
        let data: Vec<u8> = (0..25).collect();
        write_at(b, &segs(), 3, &data).unwrap();
        let mut back = [0u8; 25];
        read_at(b, &segs(), 3, &mut back).unwrap();
        assert_eq!(&back[..], &data[..]);
        let mut first = [0u8; 7];
        m.read_slice(&mut first, GuestAddress(0x1003)).unwrap();
        assert_eq!(first, [0, 1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn one_piece_is_found_only_inside_one_buffer() {
        let s = segs();
        assert_eq!(one_piece(&s, 0, 10), Some(0x1000));
        assert_eq!(one_piece(&s, 4, 6), Some(0x1004));
        assert_eq!(one_piece(&s, 4, 7), None, "runs into the next buffer");
        assert_eq!(
            one_piece(&s, 10, 5),
            Some(0x3000),
            "the empty one is skipped"
        );
        assert_eq!(one_piece(&s, 29, 1), Some(0x3013));
        assert_eq!(one_piece(&s, 30, 0), None, "past the end");
        let wraps = [Segment {
            addr: GuestAddress(u64::MAX),
            len: 8,
        }];
        assert_eq!(one_piece(&wraps, 2, 1), None);
    }

    #[test]
    fn accesses_in_one_buffer_and_across_buffers_agree() {
        let mapped = mapped(test_memory(&[(GuestAddress(0), 0x10000)]));
        let m = mapped.batch();
        let data: Vec<u8> = (100..125).collect();
        // One piece (the table), then across buffers (vm-memory).
        write_at(m, &segs(), 12, &data[..5]).unwrap();
        write_at(m, &segs(), 0, &data[..12]).unwrap();
        let mut back = [0u8; 17];
        read_at(m, &segs(), 0, &mut back).unwrap();
        assert_eq!(
            back,
            [
                100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 100, 101, 102, 103, 104
            ]
        );
        let mut one = [0u8; 3];
        read_at(m, &segs(), 13, &mut one).unwrap();
        assert_eq!(one, [101, 102, 103]);
        let mut out = Vec::new();
        iovecs(m, &segs(), 10, 20, &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].iov_len, 20);
        let at = out[0].iov_base.cast::<u8>().wrapping_add(3);
        // SAFETY: the iovec points at 20 mapped bytes of `m`, alive here.
        let byte13 = unsafe { *at };
        assert_eq!(byte13, 101, "written by the first write");
        out.clear();
        iovecs(m, &segs(), 3, 0, &mut out).unwrap();
        assert!(out.is_empty(), "nothing to transfer, no iovec");
        assert!(matches!(
            read_at(m, &segs(), 25, &mut [0u8; 6]),
            Err(GuestError::Short { .. })
        ));
        // Fixed-size writes: one store inside a buffer, pieces across two.
        write_bytes_at(m, &segs(), 1, &[7u8; 4]).unwrap();
        write_bytes_at(m, &segs(), 8, &[9u8; 4]).unwrap();
        let mut back = [0u8; 14];
        read_at(m, &segs(), 0, &mut back).unwrap();
        assert_eq!(back, [100, 7, 7, 7, 7, 105, 106, 107, 9, 9, 9, 9, 100, 101]);
        assert!(matches!(
            write_bytes_at(m, &segs(), 28, &[0u8; 4]),
            Err(GuestError::Short { .. })
        ));
    }

    #[test]
    fn short_stream_is_an_error() {
        let mapped = mapped(test_memory(&[(GuestAddress(0), 0x10000)]));
        let m = mapped.batch();
        let mut buf = [0u8; 31];
        assert!(matches!(
            read_at(m, &segs(), 0, &mut buf),
            Err(GuestError::Short { .. })
        ));
    }

    #[test]
    fn outside_memory_is_an_error() {
        let mapped = mapped(test_memory(&[(GuestAddress(0), 0x2000)]));
        let m = mapped.batch();
        let mut buf = [0u8; 15];
        assert!(matches!(
            read_at(m, &segs(), 0, &mut buf),
            Err(GuestError::Memory(_))
        ));
    }

    #[test]
    fn iovecs_split_at_region_boundaries() {
        let mapped = mapped(test_memory(&[
            (GuestAddress(0), 0x1000),
            (GuestAddress(0x1000), 0x1000),
        ]));
        let m = mapped.batch();
        let s = [Segment {
            addr: GuestAddress(0xf00),
            len: 0x200,
        }];
        let mut out = Vec::new();
        iovecs(m, &s, 0, 0x200, &mut out).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].iov_len + out[1].iov_len, 0x200);
    }

    fn dirty(m: &GuestMem, gpa: u64) -> bool {
        let r = m.find_region(GuestAddress(gpa)).unwrap();
        r.bitmap()
            .dirty_at(usize::try_from(gpa - r.start_addr().0).unwrap())
    }

    #[test]
    fn marking_covers_the_pages_of_the_range_and_no_others() {
        let mapped = mapped(memory_over(&[(GuestAddress(0), 0x10000)], true));
        let m = mapped.map();
        assert!(logging(m));
        // Stream bytes 5..15: the last 5 of the first buffer, the first 5
        // of the third.
        mark_written(mapped.batch(), &segs(), 5, 10);
        assert!(dirty(m, 0x1000) && dirty(m, 0x3000));
        assert!(!dirty(m, 0x2000) && !dirty(m, 0x4000) && !dirty(m, 0));
        mark_doorbell(m, GuestAddress(0x5fc0));
        assert!(
            dirty(m, 0x5000) && dirty(m, 0x6000),
            "an area across a page boundary"
        );
        assert!(!dirty(m, 0x7000));
    }

    #[test]
    fn without_logging_marking_does_nothing() {
        let mapped = mapped(test_memory(&[(GuestAddress(0), 0x10000)]));
        let m = mapped.map();
        assert!(!logging(m));
        mark_written(mapped.batch(), &segs(), 0, 30);
        mark_doorbell(m, GuestAddress(0x5000));
        assert!(!dirty(m, 0x1000));
    }
}
