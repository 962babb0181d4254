//! Guest memory as the request path reads and writes it: a map together
//! with a flat table of its regions ([`Mapped`]), and the per-pass value
//! every ring and guest access goes through ([`Batch`]).
//!
//! vm-memory answers every access through its region collection: a
//! binary search over `Arc`ed regions, a slice built and checked, and for
//! a plain read an iterator over the regions the access spans. A request
//! makes about ten accesses (the avail entry, each descriptor, the checks
//! that each buffer is in memory, the header, the data iovecs, the
//! response), so that cost showed in the device's profile at depth 32
//! (docs/benchmarks.md). Here a lookup scans at most a few regions from
//! the last one hit, and the access is a copy from a host pointer.
//! Anything the table does not answer (a range across two regions, an
//! address outside every region) goes to vm-memory, inside [`Batch`]
//! and nowhere else, so the results, and what is refused, are the same.
//!
//! Writes take the table only while dirty logging is off: with a log, a
//! write must mark its pages, which vm-memory's accessors do.
//!
//! Nothing here can dangle: a [`Mapped`] owns the map its table points
//! into, and a [`Batch`] borrows both, so the compiler refuses any access
//! through a table whose map may be gone.
//!
//! No library offers this: vm-memory's `GuestMemoryBackend` is the
//! general interface, and this is a cache in front of it for one thread.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};

use vm_memory::bitmap::Bitmap;
use vm_memory::{
    Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryError, GuestMemoryRegion, VolatileSlice,
};

use crate::runtime::guest::GuestMem;

/// One region: guest physical `start..end` at host address `host`.
#[derive(Clone, Copy, Debug)]
struct Region {
    start: u64,
    end: u64,
    host: *mut u8,
}

impl Region {
    /// A region that holds no range, not even an empty one (its end is
    /// before its start).
    const NONE: Region = Region {
        start: 1,
        end: 0,
        host: std::ptr::null_mut(),
    };
}

/// A memory map and the table of its regions, by guest address.
#[derive(Debug)]
pub struct Mapped {
    map: Arc<GuestMem>,
    /// Whether some region logs the device's writes.
    logged: bool,
    /// Host addresses into the mappings of `map`, which this value keeps
    /// alive.
    regions: Box<[Region]>,
    /// A copy of the region of the last lookup, looked at first (one
    /// that holds no address before the first lookup).
    last: Cell<Region>,
}

// SAFETY: the host pointers are addresses of the mappings of `map`, which
// the value owns; moving it to another thread moves the map with them.
unsafe impl Send for Mapped {}

impl Mapped {
    /// The table of `map`.
    pub fn new(map: Arc<GuestMem>) -> Self {
        let regions = map
            .iter()
            .map(|r| Region {
                start: r.start_addr().0,
                end: r.start_addr().0.saturating_add(r.len()),
                host: r.as_ptr(),
            })
            .collect();
        Mapped {
            logged: crate::runtime::guest::logging(&map),
            map,
            regions,
            last: Cell::new(Region::NONE),
        }
    }

    /// The map.
    pub fn map(&self) -> &Arc<GuestMem> {
        &self.map
    }

    /// The access to the map for one pass.
    #[inline]
    pub fn batch(&self) -> Batch<'_> {
        Batch(self)
    }

    /// Host address of `gpa..gpa + len` if the whole range lies in one
    /// region; valid for `len` bytes for as long as `self` lives.
    #[inline]
    fn host(&self, gpa: u64, len: usize) -> Option<*mut u8> {
        let end = gpa.checked_add(len as u64)?;
        let hit = |r: &Region| r.start <= gpa && end <= r.end;
        let mut r = self.last.get();
        if !hit(&r) {
            r = *self.regions.iter().find(|r| hit(r))?;
            self.last.set(r);
        }
        // In bounds: gpa - start < end - start = the region's length.
        Some(r.host.wrapping_add(usize::try_from(gpa - r.start).ok()?))
    }
}

/// Guest memory for one pass over a queue: every ring and guest access of
/// the request path goes through it, the common case through the region
/// table, the rest through vm-memory. Cheap to copy; it cannot outlive
/// the [`Mapped`] it borrows.
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a>(&'a Mapped);

impl<'a> Batch<'a> {
    /// The map, for what keeps it alive past the pass (a request's pin)
    /// or works on it directly (the doorbells).
    #[inline]
    pub fn map(self) -> &'a Arc<GuestMem> {
        &self.0.map
    }

    /// Whether the map logs the device's writes.
    #[inline]
    pub fn logged(self) -> bool {
        self.0.logged
    }

    /// Host address of `gpa..gpa + len` for reading, when the whole range
    /// lies in one region. Valid for `len` bytes for `'a`.
    #[inline]
    pub fn host(self, gpa: u64, len: usize) -> Option<*mut u8> {
        self.0.host(gpa, len)
    }

    /// As [`Self::host`], for writing: only while dirty logging is off.
    #[inline]
    fn host_unlogged(self, gpa: u64, len: usize) -> Option<*mut u8> {
        if self.0.logged {
            return None;
        }
        self.0.host(gpa, len)
    }

    /// Whether `gpa..gpa + len` lies in guest memory.
    #[inline]
    pub fn check_range(self, gpa: u64, len: usize) -> bool {
        len == 0
            || self.host(gpa, len).is_some()
            || GuestMemoryBackend::check_range(&**self.map(), GuestAddress(gpa), len)
    }

    /// Copies `buf.len()` bytes at `gpa` into `buf`.
    #[inline]
    pub fn read(self, gpa: u64, buf: &mut [u8]) -> Result<(), GuestMemoryError> {
        if let Some(p) = self.host(gpa, buf.len()) {
            // SAFETY: `host` found the range inside one mapped region of
            // the map, which `self` borrows; `buf` is ours and cannot
            // overlap guest memory, which the daemon only maps.
            unsafe { std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), buf.len()) };
            return Ok(());
        }
        self.map().read_slice(buf, GuestAddress(gpa))
    }

    /// Reads the `N` bytes at `gpa`.
    #[inline]
    pub fn read_bytes<const N: usize>(self, gpa: u64) -> Result<[u8; N], GuestMemoryError> {
        if let Some(p) = self.host(gpa, N) {
            // SAFETY: as in `read`; `[u8; N]` has no alignment and no
            // invalid values. The guest may write concurrently: the bytes
            // are copied once and used from the copy.
            return Ok(unsafe { p.cast::<[u8; N]>().read_unaligned() });
        }
        let mut out = [0u8; N];
        self.map().read_slice(&mut out, GuestAddress(gpa))?;
        Ok(out)
    }

    /// Copies `buf` to `gpa`, marking the pages written while dirty
    /// logging is on.
    #[inline]
    pub fn write(self, gpa: u64, buf: &[u8]) -> Result<(), GuestMemoryError> {
        if let Some(p) = self.host_unlogged(gpa, buf.len()) {
            // SAFETY: as in `read`, for writing; no log wants it marked.
            unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), p, buf.len()) };
            return Ok(());
        }
        // vm-memory's slices mark what they write.
        self.map().write_slice(buf, GuestAddress(gpa))
    }

    /// Writes the `N` bytes of `buf` at `gpa`: one store, not a `memcpy`
    /// call, when they lie in one region (a response's fixed part).
    #[inline]
    pub fn write_bytes<const N: usize>(
        self,
        gpa: u64,
        buf: &[u8; N],
    ) -> Result<(), GuestMemoryError> {
        if let Some(p) = self.host_unlogged(gpa, N) {
            // SAFETY: as in `write`; `[u8; N]` has no alignment.
            unsafe { p.cast::<[u8; N]>().write_unaligned(*buf) };
            return Ok(());
        }
        self.map().write_slice(buf, GuestAddress(gpa))
    }

    /// Loads the little-endian `u16` at `gpa` with `order`: a ring index
    /// the driver stores concurrently.
    #[inline]
    pub fn load_u16(self, gpa: u64, order: Ordering) -> Result<u16, GuestMemoryError> {
        if let Some(p) = self.host(gpa, 2).map(|p| p.cast::<u16>())
            && p.is_aligned()
        {
            // SAFETY: `host` found `gpa..gpa + 2` inside one mapped region
            // of the map, which `self` borrows, and the address is aligned
            // for a u16. The driver stores to it concurrently (through its
            // own atomics or plain stores of the whole index): an atomic
            // load reads one of the values it stored.
            let v = unsafe { AtomicU16::from_ptr(p) }.load(order);
            return Ok(u16::from_le(v));
        }
        self.map()
            .load::<u16>(GuestAddress(gpa), order)
            .map(u16::from_le)
    }

    /// Stores `v` little-endian at `gpa` with `order` (a ring index or
    /// flag the driver reads), marking it while dirty logging is on.
    #[inline]
    pub fn store_u16(self, gpa: u64, v: u16, order: Ordering) -> Result<(), GuestMemoryError> {
        if let Some(p) = self.host_unlogged(gpa, 2).map(|p| p.cast::<u16>())
            && p.is_aligned()
        {
            // SAFETY: as in `load_u16`: mapped, borrowed, aligned; the
            // driver only reads this field.
            unsafe { AtomicU16::from_ptr(p) }.store(v.to_le(), order);
            return Ok(());
        }
        self.map().store(v.to_le(), GuestAddress(gpa), order)
    }

    /// Appends host iovecs covering `gpa..gpa + len` to `out` (a range
    /// across two regions gives two). They point into the map's mappings:
    /// valid while the map is alive, which a request's pin sees to.
    pub fn iovecs(
        self,
        gpa: u64,
        len: usize,
        out: &mut Vec<libc::iovec>,
    ) -> Result<(), GuestMemoryError> {
        if let Some(p) = self.host(gpa, len) {
            out.push(libc::iovec {
                iov_base: p.cast(),
                iov_len: len,
            });
            return Ok(());
        }
        for slice in self.map().get_slices(GuestAddress(gpa), len) {
            let slice: VolatileSlice<'_, _> = slice?;
            out.push(libc::iovec {
                iov_base: slice.ptr_guard_mut().as_ptr().cast(),
                iov_len: slice.len(),
            });
        }
        Ok(())
    }

    /// Marks `gpa..gpa + len` as written by the device through a host
    /// address (a backstore's zero-copy transfer, a doorbell); nothing
    /// while dirty logging is off, nothing for what lies outside memory.
    pub fn mark(self, gpa: u64, len: usize) {
        if !self.0.logged {
            return;
        }
        for slice in self.map().get_slices(GuestAddress(gpa), len).flatten() {
            slice.bitmap().mark_dirty(0, slice.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_regions() -> Arc<GuestMem> {
        Arc::new(crate::runtime::guest::test_memory(&[
            (GuestAddress(0), 0x1000),
            (GuestAddress(0x10_0000), 0x2000),
        ]))
    }

    #[test]
    fn the_table_answers_ranges_inside_one_region_and_vm_memory_the_rest() {
        let mem = two_regions();
        mem.write_obj(0xbeef_u16, GuestAddress(0x10_0ffe)).unwrap();
        let mapped = Mapped::new(mem);
        let b = mapped.batch();
        assert_eq!(
            b.read_bytes::<2>(0x10_0ffe).unwrap(),
            0xbeef_u16.to_le_bytes()
        );
        assert!(b.host(0xff0, 0x10).is_some(), "end of region 0");
        assert!(b.host(0xff0, 0x11).is_none(), "past its end");
        assert!(b.host(0x10_1ff0, 0x20).is_none(), "past region 1");
        assert!(b.host(0x5000, 1).is_none(), "between regions");
        assert!(b.host(u64::MAX, 2).is_none(), "wraps");
        assert!(b.check_range(0xff0, 0x10) && !b.check_range(0xff0, 0x11));
        assert!(b.read_bytes::<2>(0x5000).is_err(), "outside memory");
        let mut buf = [0u8; 4];
        assert!(b.read(0xffe, &mut buf).is_err(), "runs out of memory");
    }

    #[test]
    fn a_logged_map_is_read_through_the_table_and_written_with_marks() {
        let mem = Arc::new(crate::runtime::guest::memory_over(
            &[(GuestAddress(0), 0x4000)],
            true,
        ));
        let mapped = Mapped::new(Arc::clone(&mem));
        let b = mapped.batch();
        assert!(b.logged());
        assert!(b.host(0, 16).is_some());
        assert!(b.host_unlogged(0, 16).is_none());
        b.write(0x2010, &[1, 2, 3]).unwrap();
        b.store_u16(0x3000, 7, Ordering::Release).unwrap();
        let dirty = |gpa: u64| {
            let r = mem.find_region(GuestAddress(gpa)).unwrap();
            r.bitmap().dirty_at(usize::try_from(gpa).unwrap())
        };
        assert!(dirty(0x2000) && dirty(0x3000) && !dirty(0x1000));
        b.mark(0x1ff0, 0x20);
        assert!(dirty(0x1000), "a host write marked on request");
    }

    #[test]
    fn ring_indices_are_loaded_and_stored_whatever_the_path() {
        let mem = two_regions();
        mem.write_obj(0x1234_u16.to_le(), GuestAddress(0x10_0002))
            .unwrap();
        let mapped = Mapped::new(Arc::clone(&mem));
        let b = mapped.batch();
        assert_eq!(b.load_u16(0x10_0002, Ordering::Acquire).unwrap(), 0x1234);
        b.store_u16(0x10_0004, 0xbeef, Ordering::Release).unwrap();
        assert_eq!(
            mem.read_obj::<u16>(GuestAddress(0x10_0004)).unwrap(),
            0xbeef_u16.to_le()
        );
        // A misaligned index goes to vm-memory, which refuses an atomic
        // access there (a ring's indices are aligned when it starts).
        assert!(b.store_u16(0x10_0007, 1, Ordering::Release).is_err());
        assert!(b.load_u16(0x10_0007, Ordering::Acquire).is_err());
        assert!(
            b.load_u16(0xfff, Ordering::Acquire).is_err(),
            "across a region's end"
        );
        assert!(b.store_u16(0x5000, 1, Ordering::Release).is_err());
    }

    #[test]
    fn iovecs_split_at_region_boundaries() {
        let mem = Arc::new(crate::runtime::guest::test_memory(&[
            (GuestAddress(0), 0x1000),
            (GuestAddress(0x1000), 0x1000),
        ]));
        let mapped = Mapped::new(mem);
        let mut out = Vec::new();
        mapped.batch().iovecs(0xf00, 0x200, &mut out).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].iov_len + out[1].iov_len, 0x200);
        out.clear();
        mapped.batch().iovecs(0x100, 0x20, &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert!(mapped.batch().iovecs(0x1f00, 0x200, &mut out).is_err());
    }
}
