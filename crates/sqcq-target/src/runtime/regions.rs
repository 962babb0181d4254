//! The request path's guest address translation: a flat table of the
//! memory regions (guest range, host address), installed on the worker's
//! thread for the duration of a batch, that the accessors of
//! [`crate::runtime::guest`] and the chain walk look in before they go
//! through vm-memory.
//!
//! vm-memory answers every access through its region collection: a
//! binary search over `Arc`ed regions, a slice built and checked, and for
//! a plain read an iterator over the regions the access spans. A request
//! makes about ten accesses (the avail entry, each descriptor, the checks
//! that each buffer is in memory, the header, the data iovecs, the
//! response), so that cost showed in the device's profile at depth 32
//! (docs/benchmarks.md, "Target: ring indices and guest accesses through
//! the region table"). Here a lookup scans
//! at most a few regions from the last one hit, and the access is a copy
//! from a host pointer. Anything the table does not answer (a range across
//! two regions, an address outside every region, no table installed, a
//! table of another memory map) falls back to vm-memory, so the results,
//! and what is refused, are the same.
//!
//! Writes take the table only while dirty logging is off: with a log, a
//! write must mark its pages, which vm-memory's accessors do.
//!
//! No library offers this: vm-memory's `GuestMemoryBackend` is the
//! general interface, and this is a cache in front of it for one thread.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Weak};

use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use crate::runtime::guest::GuestMem;

/// One region: guest physical `start..end` at host address `host`.
#[derive(Clone, Copy, Debug)]
struct Region {
    start: u64,
    end: u64,
    host: *mut u8,
}

/// The regions of one memory map, by guest address.
#[derive(Debug)]
pub(crate) struct RegionTable {
    /// The map the table describes: held weakly so that the table keeps
    /// no mapping alive (a replaced map is unmapped once its last strong
    /// user goes, as without the table), while the allocation it points
    /// to cannot be reused for another map, so comparing addresses tells
    /// whether a map is this one.
    of: Weak<GuestMem>,
    /// Whether some region logs the device's writes.
    logged: bool,
    regions: Vec<Region>,
    /// The region of the last lookup, looked at first.
    last: Cell<usize>,
}

// SAFETY: the host pointers are addresses of the mappings of the map the
// table describes; the table dereferences none of them itself. They are
// only used while a strong reference to that map is held (see `install`).
unsafe impl Send for RegionTable {}

impl RegionTable {
    /// The table of `mem`.
    pub(crate) fn new(mem: &Arc<GuestMem>) -> Self {
        let regions = mem
            .iter()
            .map(|r| Region {
                start: r.start_addr().0,
                end: r.start_addr().0.saturating_add(r.len()),
                host: r.as_ptr(),
            })
            .collect();
        RegionTable {
            of: Arc::downgrade(mem),
            logged: crate::runtime::guest::logging(mem),
            regions,
            last: Cell::new(0),
        }
    }

    /// Whether the table describes `mem`.
    pub(crate) fn describes(&self, mem: &Arc<GuestMem>) -> bool {
        std::ptr::eq(self.of.as_ptr(), Arc::as_ptr(mem))
    }

    /// Makes the table the one the accessors of this thread look in until
    /// the guard drops. `mem` must be the map it describes; the borrow
    /// keeps it (and so every mapping the table points into) alive for
    /// as long as the table is installed.
    pub(crate) fn install<'a>(&'a self, mem: &'a Arc<GuestMem>) -> Installed<'a> {
        debug_assert!(self.describes(mem));
        let prev = CURRENT.replace(Some(Current {
            table: self,
            mem: Arc::as_ptr(mem),
        }));
        Installed {
            prev,
            _borrow: PhantomData,
        }
    }

    /// Host address of `gpa..gpa + len` if the whole range lies in one
    /// region.
    #[inline]
    fn host(&self, gpa: u64, len: usize) -> Option<*mut u8> {
        let end = gpa.checked_add(len as u64)?;
        let hit = |r: &Region| r.start <= gpa && end <= r.end;
        let last = self.last.get();
        let (i, r) = match self.regions.get(last).filter(|r| hit(r)) {
            Some(r) => (last, r),
            None => self.regions.iter().enumerate().find(|(_, r)| hit(r))?,
        };
        self.last.set(i);
        // In bounds: gpa - start < end - start = the region's length.
        Some(r.host.wrapping_add(usize::try_from(gpa - r.start).ok()?))
    }
}

/// The table installed on this thread, and the map it was installed
/// with.
#[derive(Clone, Copy)]
struct Current {
    table: *const RegionTable,
    mem: *const GuestMem,
}

thread_local! {
    static CURRENT: Cell<Option<Current>> = const { Cell::new(None) };
}

/// A table installed on this thread ([`RegionTable::install`]); the one
/// before comes back when it drops.
#[derive(Debug)]
pub(crate) struct Installed<'a> {
    prev: Option<Current>,
    _borrow: PhantomData<(&'a RegionTable, &'a Arc<GuestMem>)>,
}

impl Drop for Installed<'_> {
    fn drop(&mut self) {
        CURRENT.set(self.prev);
    }
}

impl std::fmt::Debug for Current {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Current").finish_non_exhaustive()
    }
}

/// The installed table, if it describes `mem`.
#[inline]
fn table_of(mem: &GuestMem) -> Option<&RegionTable> {
    let c = CURRENT.get()?;
    if !std::ptr::eq(c.mem, mem) {
        return None;
    }
    // SAFETY: `c.table` was installed by a live `Installed` guard on this
    // thread (it removes it when it drops), which borrows the table; the
    // reference does not outlive this access's caller, who borrows `mem`,
    // the map the table was installed with.
    Some(unsafe { &*c.table })
}

/// The installed table of one map, found once for the many accesses of a
/// chain (the thread-local look and the map comparison are then paid
/// once, not per access).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lookup<'a>(Option<&'a RegionTable>);

impl<'a> Lookup<'a> {
    /// The table installed for `mem`, if any.
    #[inline]
    pub(crate) fn of(mem: &'a GuestMem) -> Self {
        Lookup(table_of(mem))
    }

    /// Host address of `gpa..gpa + len` for reading, when the table has
    /// the whole range in one region. The address is valid for `len`
    /// bytes for as long as the caller borrows the map.
    #[inline]
    pub(crate) fn host(self, gpa: u64, len: usize) -> Option<*mut u8> {
        self.0?.host(gpa, len)
    }

    /// As [`Self::host`], for writing: only while dirty logging is off.
    #[inline]
    pub(crate) fn host_unlogged(self, gpa: u64, len: usize) -> Option<*mut u8> {
        let t = self.0?;
        if t.logged {
            return None;
        }
        t.host(gpa, len)
    }

    /// Whether the map logs the device's writes, if a table is installed.
    #[inline]
    pub(crate) fn logged(self) -> Option<bool> {
        self.0.map(|t| t.logged)
    }

    /// Loads the little-endian `u16` at `gpa` with `order`, when the table
    /// has it in one region at a 2-aligned host address: a ring index.
    #[inline]
    pub(crate) fn load_u16(self, gpa: u64, order: Ordering) -> Option<u16> {
        let p = self.host(gpa, 2)?.cast::<u16>();
        if !p.is_aligned() {
            return None;
        }
        // SAFETY: `host` found `gpa..gpa + 2` inside one mapped region of
        // the map, which the caller borrows, and the address is aligned
        // for a u16. The driver stores to it concurrently (through its
        // own atomics or plain stores of the whole index): an atomic load
        // reads one of the values it stored.
        let v = unsafe { AtomicU16::from_ptr(p) }.load(order);
        Some(u16::from_le(v))
    }

    /// Stores `v` little-endian at `gpa` with `order`, when the table has
    /// it in one region at a 2-aligned host address and the map logs no
    /// writes (a logged write goes through vm-memory, which marks it);
    /// returns whether it did.
    #[inline]
    pub(crate) fn store_u16(self, gpa: u64, v: u16, order: Ordering) -> bool {
        let Some(p) = self.host_unlogged(gpa, 2).map(|p| p.cast::<u16>()) else {
            return false;
        };
        if !p.is_aligned() {
            return false;
        }
        // SAFETY: as in `load_u16`: mapped, borrowed, aligned; the driver
        // only reads this index.
        unsafe { AtomicU16::from_ptr(p) }.store(v.to_le(), order);
        true
    }

    /// Reads `N` bytes of guest memory at `gpa` through the table.
    #[inline]
    pub(crate) fn read_bytes<const N: usize>(self, gpa: u64) -> Option<[u8; N]> {
        let p = self.host(gpa, N)?;
        // SAFETY: `host` found `gpa..gpa + N` inside one mapped region of
        // the map, which the caller borrows; `[u8; N]` has no alignment
        // and no invalid values. The guest may write concurrently: the
        // bytes are copied once and used from the copy.
        Some(unsafe { p.cast::<[u8; N]>().read_unaligned() })
    }
}

/// Host address of `gpa..gpa + len` for reading, when the installed table
/// of `mem` has the whole range in one region ([`Lookup::host`]).
#[inline]
pub(crate) fn host(mem: &GuestMem, gpa: u64, len: usize) -> Option<*mut u8> {
    Lookup::of(mem).host(gpa, len)
}

/// As [`host`], for writing: only while dirty logging is off.
#[inline]
pub(crate) fn host_unlogged(mem: &GuestMem, gpa: u64, len: usize) -> Option<*mut u8> {
    Lookup::of(mem).host_unlogged(gpa, len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestAddress};

    fn two_regions() -> Arc<GuestMem> {
        Arc::new(crate::runtime::guest::test_memory(&[
            (GuestAddress(0), 0x1000),
            (GuestAddress(0x10_0000), 0x2000),
        ]))
    }

    #[test]
    fn the_table_answers_ranges_inside_one_region_of_its_own_map_only() {
        let mem = two_regions();
        mem.write_obj(0xbeef_u16, GuestAddress(0x10_0ffe)).unwrap();
        let t = RegionTable::new(&mem);
        assert_eq!(
            Lookup::of(&mem).read_bytes::<2>(0x10_0ffe),
            None,
            "not installed"
        );
        {
            let _g = t.install(&mem);
            assert_eq!(
                Lookup::of(&mem).read_bytes::<2>(0x10_0ffe),
                Some(0xbeef_u16.to_le_bytes())
            );
            assert!(host(&mem, 0xff0, 0x10).is_some(), "end of region 0");
            assert!(host(&mem, 0xff0, 0x11).is_none(), "past its end");
            assert!(host(&mem, 0x10_1ff0, 0x20).is_none(), "past region 1");
            assert!(host(&mem, 0x5000, 1).is_none(), "between regions");
            assert!(host(&mem, u64::MAX, 2).is_none(), "wraps");
            let other = two_regions();
            assert!(host(&other, 0, 1).is_none(), "another map");
            assert!(host_unlogged(&mem, 0, 1).is_some());
        }
        assert!(host(&mem, 0, 1).is_none(), "removed with its guard");
    }

    #[test]
    fn a_logged_map_is_read_through_the_table_but_written_through_vm_memory() {
        let mem = Arc::new(crate::runtime::guest::memory_over(
            &[(GuestAddress(0), 0x4000)],
            true,
        ));
        let t = RegionTable::new(&mem);
        let _g = t.install(&mem);
        assert!(host(&mem, 0, 16).is_some());
        assert!(host_unlogged(&mem, 0, 16).is_none());
    }

    #[test]
    fn ring_indices_are_loaded_and_stored_through_the_table_when_aligned_and_unlogged() {
        let mem = two_regions();
        mem.write_obj(0x1234_u16.to_le(), GuestAddress(0x10_0002))
            .unwrap();
        let t = RegionTable::new(&mem);
        let l = Lookup::of(&mem);
        assert_eq!(
            l.load_u16(0x10_0002, Ordering::Acquire),
            None,
            "not installed"
        );
        let _g = t.install(&mem);
        let l = Lookup::of(&mem);
        assert_eq!(l.load_u16(0x10_0002, Ordering::Acquire), Some(0x1234));
        assert_eq!(l.load_u16(0x10_0003, Ordering::Acquire), None, "misaligned");
        assert_eq!(
            l.load_u16(0xfff, Ordering::Acquire),
            None,
            "across a region's end"
        );
        assert!(l.store_u16(0x10_0004, 0xbeef, Ordering::Release));
        assert_eq!(
            mem.read_obj::<u16>(GuestAddress(0x10_0004)).unwrap(),
            0xbeef_u16.to_le()
        );
        assert!(!l.store_u16(0x10_0005, 1, Ordering::Release), "misaligned");
        let logged = Arc::new(crate::runtime::guest::memory_over(
            &[(GuestAddress(0), 0x4000)],
            true,
        ));
        let t = RegionTable::new(&logged);
        let _g = t.install(&logged);
        let l = Lookup::of(&logged);
        assert!(
            !l.store_u16(0x10, 1, Ordering::Release),
            "a logged map marks writes"
        );
        assert_eq!(
            l.load_u16(0x10, Ordering::Acquire),
            Some(0),
            "reads need no mark"
        );
    }

    #[test]
    fn the_table_keeps_no_mapping_alive_and_tells_maps_apart() {
        let mem = two_regions();
        let t = RegionTable::new(&mem);
        assert!(t.describes(&mem));
        assert!(!t.describes(&two_regions()));
        let weak = Arc::downgrade(&mem);
        drop(mem);
        assert!(weak.upgrade().is_none(), "only the table's weak is left");
    }
}
