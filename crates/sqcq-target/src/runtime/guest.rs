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

use thiserror::Error;
use vm_memory::bitmap::{AtomicBitmap, Bitmap};
use vm_memory::{
    Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap,
};

use crate::runtime::chain::Segment;

/// The dirty-page bitmap of one region of guest memory: `None` while dirty
/// logging is off, vm-memory's `AtomicBitmap` while it is on.
pub type DirtyBitmap = Option<AtomicBitmap>;

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

/// Copies `buf.len()` bytes from the stream at `offset` into `buf`.
pub fn read_at(
    mem: &GuestMem,
    segs: &[Segment],
    offset: u64,
    buf: &mut [u8],
) -> Result<(), GuestError> {
    let len = buf.len() as u64;
    for_each_piece(segs, offset, len, |addr, start, n| {
        let dst = &mut buf[start..start + n];
        // A piece within one region (nearly always): one lookup, no
        // iterator over regions.
        if let Some((region, at)) = mem.to_region_addr(addr)
            && let Ok(slice) = region.get_slice(at, n)
        {
            slice.copy_to(dst);
            return Ok(());
        }
        mem.read_slice(dst, addr).map_err(GuestError::Memory)
    })
}

/// Copies `buf` into the stream at `offset`.
pub fn write_at(
    mem: &GuestMem,
    segs: &[Segment],
    offset: u64,
    buf: &[u8],
) -> Result<(), GuestError> {
    let len = buf.len() as u64;
    for_each_piece(segs, offset, len, |addr, start, n| {
        let src = &buf[start..start + n];
        // As in `read_at`; the slice's bitmap marks what it writes.
        if let Some((region, at)) = mem.to_region_addr(addr)
            && let Ok(slice) = region.get_slice(at, n)
        {
            slice.copy_from(src);
            return Ok(());
        }
        mem.write_slice(src, addr).map_err(GuestError::Memory)
    })
}

/// Appends host iovecs covering the stream range `offset..offset + len` to
/// `out` (a guest buffer that spans two memory regions gives two iovecs).
///
/// The iovecs point into the mappings of `mem`; they stay valid as long as
/// `mem` (an `Arc` of it) is alive.
pub fn iovecs(
    mem: &GuestMem,
    segs: &[Segment],
    offset: u64,
    len: u64,
    out: &mut Vec<libc::iovec>,
) -> Result<(), GuestError> {
    for_each_piece(segs, offset, len, |addr, _start, n| {
        // A piece within one region (nearly always): one lookup, one
        // iovec, no slice iterator.
        if let Some((region, at)) = mem.to_region_addr(addr)
            && let Ok(slice) = region.get_slice(at, n)
        {
            out.push(libc::iovec {
                iov_base: slice.ptr_guard_mut().as_ptr().cast(),
                iov_len: slice.len(),
            });
            return Ok(());
        }
        for slice in mem.get_slices(addr, n) {
            let slice = slice.map_err(GuestError::Memory)?;
            out.push(libc::iovec {
                iov_base: slice.ptr_guard_mut().as_ptr().cast(),
                iov_len: slice.len(),
            });
        }
        Ok(())
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
pub fn mark_written(mem: &GuestMem, segs: &[Segment], offset: u64, len: u64) {
    if !logging(mem) {
        return;
    }
    let _ = for_each_piece(segs, offset, len, |addr, _start, n| {
        for slice in mem.get_slices(addr, n).flatten() {
            slice.bitmap().mark_dirty(0, slice.len());
        }
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
    let page = std::num::NonZeroUsize::new(4096).unwrap_or(std::num::NonZeroUsize::MIN);
    let regions = ranges
        .iter()
        .map(|&(addr, size)| {
            let bitmap = logged.then(|| AtomicBitmap::new(size, page));
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

/// [`memory_over`] without dirty logging.
#[cfg(any(test, feature = "fuzzing"))]
pub fn test_memory(ranges: &[(GuestAddress, usize)]) -> GuestMem {
    memory_over(ranges, false)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let m = crate::runtime::guest::test_memory(&[(GuestAddress(0), 0x10000)]);
        let data: Vec<u8> = (0..25).collect();
        write_at(&m, &segs(), 3, &data).unwrap();
        let mut back = [0u8; 25];
        read_at(&m, &segs(), 3, &mut back).unwrap();
        assert_eq!(&back[..], &data[..]);
        let mut first = [0u8; 7];
        m.read_slice(&mut first, GuestAddress(0x1003)).unwrap();
        assert_eq!(first, [0, 1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn short_stream_is_an_error() {
        let m = crate::runtime::guest::test_memory(&[(GuestAddress(0), 0x10000)]);
        let mut buf = [0u8; 31];
        assert!(matches!(
            read_at(&m, &segs(), 0, &mut buf),
            Err(GuestError::Short { .. })
        ));
    }

    #[test]
    fn outside_memory_is_an_error() {
        let m = crate::runtime::guest::test_memory(&[(GuestAddress(0), 0x2000)]);
        let mut buf = [0u8; 15];
        assert!(matches!(
            read_at(&m, &segs(), 0, &mut buf),
            Err(GuestError::Memory(_))
        ));
    }

    #[test]
    fn iovecs_split_at_region_boundaries() {
        let m = crate::runtime::guest::test_memory(&[
            (GuestAddress(0), 0x1000),
            (GuestAddress(0x1000), 0x1000),
        ]);
        let s = [Segment {
            addr: GuestAddress(0xf00),
            len: 0x200,
        }];
        let mut out = Vec::new();
        iovecs(&m, &s, 0, 0x200, &mut out).unwrap();
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
        let m = memory_over(&[(GuestAddress(0), 0x10000)], true);
        assert!(logging(&m));
        // Stream bytes 5..15: the last 5 of the first buffer, the first 5
        // of the third.
        mark_written(&m, &segs(), 5, 10);
        assert!(dirty(&m, 0x1000) && dirty(&m, 0x3000));
        assert!(!dirty(&m, 0x2000) && !dirty(&m, 0x4000) && !dirty(&m, 0));
        mark_doorbell(&m, GuestAddress(0x5fc0));
        assert!(
            dirty(&m, 0x5000) && dirty(&m, 0x6000),
            "an area across a page boundary"
        );
        assert!(!dirty(&m, 0x7000));
    }

    #[test]
    fn without_logging_marking_does_nothing() {
        let m = test_memory(&[(GuestAddress(0), 0x10000)]);
        assert!(!logging(&m));
        mark_written(&m, &segs(), 0, 30);
        mark_doorbell(&m, GuestAddress(0x5000));
        assert!(!dirty(&m, 0x1000));
    }
}
