//! Guest memory a frontend shares (SET_MEM_TABLE): checked before it is
//! mapped, and guarded while it is.
//!
//! Every region must be a regular file (a memfd, a tmpfs or hugetlbfs
//! file, any file QEMU's `memory-backend-memfd` or `-file` uses) whose
//! size covers `mmap_offset + memory_size` now, at a page-aligned offset
//! (the huge page size on hugetlbfs), without overflow in guest-physical,
//! frontend-virtual or file addresses, and without overlapping another
//! region. A region that fails is refused with the reason, and the whole
//! memory table with it (the previous one stays).
//!
//! What the frontend does with the file later is not under our control: a
//! memfd without `F_SEAL_SHRINK` (QEMU seals its memfds by default), any
//! other file, or a hugetlbfs file whose pages run out can lose pages
//! that are mapped. Each mapping is therefore registered with the SIGBUS
//! guard ([`crate::transport::sigbus`]) together with the device's fault eventfd: a
//! lost page costs that device its connection, not the process. The seal
//! state is logged; the daemon never seals the frontend's file itself.
//!
//! A [`GuardedRegion`] keeps the registration and one reference to the
//! mapping; the mapping is unmapped only when that reference is the last
//! one and the registration is dropped first, so the guard never watches
//! an address range that was unmapped and could be reused.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use thiserror::Error;
use tracing::debug;
use vhost::vhost_user::message::VhostUserMemoryRegion;
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{FileOffset, GuestAddress};

use crate::runtime::guest::{DirtyLog, GuestMem, GuestRegion, LogBitmap};
use crate::transport::shared_map::{SharedMapError, check_file};
use crate::transport::sigbus::{GuardError, Registration};
use vm_memory::GuestMemoryRegion;

/// A guest memory region as the frontend maps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// Frontend virtual address.
    pub user_addr: u64,
    /// Size.
    pub size: u64,
    /// Guest physical address.
    pub gpa: u64,
}

/// Why a memory table was refused.
#[derive(Debug, Error)]
pub enum MemoryError {
    /// A region's numbers are unusable.
    #[error("region {index}: {what}")]
    Invalid {
        /// Position in the table.
        index: usize,
        /// What is wrong.
        what: &'static str,
    },
    /// The file cannot back the region.
    #[error("region {index}")]
    File {
        /// Position in the table.
        index: usize,
        /// Why.
        #[source]
        source: SharedMapError,
    },
    /// mmap failed.
    #[error("region {index}: cannot map it")]
    Map {
        /// Position in the table.
        index: usize,
        /// Why.
        #[source]
        source: vm_memory::mmap::MmapRegionError,
    },
    /// Two regions overlap.
    #[error("regions overlap ({0})")]
    Overlap(&'static str),
    /// The SIGBUS guard cannot watch the mapping.
    #[error(transparent)]
    Guard(#[from] GuardError),
}

/// One mapped region, watched by the SIGBUS guard.
#[derive(Debug)]
pub struct GuardedRegion {
    // Declared first: dropped (unregistered) before the mapping below.
    _registration: Registration,
    region: Arc<GuestRegion>,
    /// Other views of the same mapping (with a dirty log), which do not
    /// own it.
    views: Vec<Arc<GuestRegion>>,
}

impl GuardedRegion {
    /// Whether a memory map still uses the mapping (a worker's request in
    /// flight, the current table), through the region or one of its views:
    /// it must not be unmapped yet.
    pub fn in_use(&self) -> bool {
        Arc::strong_count(&self.region) > 1 || self.views.iter().any(|v| Arc::strong_count(v) > 1)
    }

    /// The region as seen with dirty logging into `log`: the same mapping
    /// and guest address, with a bitmap that marks the log. The view does
    /// not own the mapping; this region keeps it (and keeps it mapped
    /// while the view is in use).
    fn logged_view(
        &mut self,
        index: usize,
        log: &Arc<DirtyLog>,
    ) -> Result<Arc<GuestRegion>, MemoryError> {
        let r = &self.region;
        let invalid = |_| MemoryError::Invalid {
            index,
            what: "cannot view the mapping with a dirty log",
        };
        let len = usize::try_from(r.len()).map_err(|_| MemoryError::Invalid {
            index,
            what: "size exceeds the address space",
        })?;
        let builder = MmapRegionBuilder::new_with_bitmap(
            len,
            Some(LogBitmap::new(Arc::clone(log), r.start_addr())),
        );
        // SAFETY: the pointer is this region's mapping, `len` bytes long,
        // kept mapped by `self` for as long as the view is in use (see
        // `in_use`); the view never unmaps it (not owned).
        let builder = unsafe { builder.with_raw_mmap_pointer(r.as_ptr()) };
        let mmap = builder
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
            .with_mmap_flags(libc::MAP_NORESERVE | libc::MAP_SHARED)
            .build()
            .map_err(invalid)?;
        let view = Arc::new(GuestRegion::new(mmap, r.start_addr()).ok_or(
            MemoryError::Invalid {
                index,
                what: "guest address + size overflows",
            },
        )?);
        self.views.retain(|v| Arc::strong_count(v) > 1);
        self.views.push(Arc::clone(&view));
        Ok(view)
    }
}

/// The memory map over `regions`, with dirty logging into `log` if given
/// (each region's writes marked in it), without otherwise.
pub fn memory_map(
    regions: &mut [GuardedRegion],
    log: Option<&Arc<DirtyLog>>,
) -> Result<GuestMem, MemoryError> {
    let list = regions
        .iter_mut()
        .enumerate()
        .map(|(i, g)| match log {
            Some(l) => g.logged_view(i, l),
            None => Ok(Arc::clone(&g.region)),
        })
        .collect::<Result<Vec<_>, _>>()?;
    GuestMem::from_arc_regions(list).map_err(|_| MemoryError::Overlap("guest physical addresses"))
}

/// A frontend's memory table, mapped.
#[derive(Debug)]
pub struct SharedMemory {
    /// The map the rings and buffers are read through.
    pub map: GuestMem,
    /// How the frontend maps each region (for ring addresses).
    pub mappings: Vec<Mapping>,
    /// The registrations and references that decide when to unmap.
    pub regions: Vec<GuardedRegion>,
}

/// Checks and maps a memory table; faults in it are reported on `notify`.
pub fn map(
    table: &[VhostUserMemoryRegion],
    files: Vec<File>,
    notify: RawFd,
) -> Result<SharedMemory, MemoryError> {
    if table.is_empty() || table.len() != files.len() {
        return Err(MemoryError::Invalid {
            index: table.len(),
            what: "one file per region is needed",
        });
    }
    let mut mappings: Vec<Mapping> = Vec::with_capacity(table.len());
    let mut regions = Vec::with_capacity(table.len());
    for (index, (r, file)) in table.iter().zip(files).enumerate() {
        let m = Mapping {
            user_addr: r.user_addr,
            size: r.memory_size,
            gpa: r.guest_phys_addr,
        };
        if mappings
            .iter()
            .any(|o| overlaps(o.user_addr, o.size, m.user_addr, m.size))
        {
            return Err(MemoryError::Overlap("frontend addresses"));
        }
        if mappings
            .iter()
            .any(|o| overlaps(o.gpa, o.size, m.gpa, m.size))
        {
            return Err(MemoryError::Overlap("guest physical addresses"));
        }
        regions.push(map_region(index, r, file, notify)?);
        mappings.push(m);
    }
    regions.sort_by_key(|g| vm_memory::GuestMemoryRegion::start_addr(&*g.region));
    let map = GuestMem::from_arc_regions(regions.iter().map(|g| Arc::clone(&g.region)).collect())
        .map_err(|_| MemoryError::Overlap("guest physical addresses"))?;
    Ok(SharedMemory {
        map,
        mappings,
        regions,
    })
}

/// Whether `[a, a + alen)` and `[b, b + blen)` intersect (both checked not
/// to overflow before).
fn overlaps(a: u64, alen: u64, b: u64, blen: u64) -> bool {
    a < b.saturating_add(blen) && b < a.saturating_add(alen)
}

fn map_region(
    index: usize,
    r: &VhostUserMemoryRegion,
    file: File,
    notify: RawFd,
) -> Result<GuardedRegion, MemoryError> {
    let invalid = |what| MemoryError::Invalid { index, what };
    let (size, offset) = (r.memory_size, r.mmap_offset);
    r.guest_phys_addr
        .checked_add(size)
        .ok_or(invalid("guest address + size overflows"))?;
    r.user_addr
        .checked_add(size)
        .ok_or(invalid("frontend address + size overflows"))?;
    let page =
        check_file(&file, offset, size).map_err(|source| MemoryError::File { index, source })?;
    let len = usize::try_from(size)
        .ok()
        .filter(|&l| isize::try_from(l).is_ok())
        .ok_or(invalid("size exceeds the address space"))?;
    log_seals(index, &file);
    // Dirty logging starts off (see `runtime::guest`).
    let mmap = MmapRegionBuilder::new_with_bitmap(len, None)
        .with_file_offset(FileOffset::new(file, offset))
        .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
        .with_mmap_flags(libc::MAP_NORESERVE | libc::MAP_SHARED)
        .build()
        .map_err(|source| MemoryError::Map { index, source })?;
    let region = GuestRegion::new(mmap, GuestAddress(r.guest_phys_addr))
        .ok_or(invalid("guest address + size overflows"))?;
    let page = usize::try_from(page).unwrap_or(usize::MAX);
    let registration = crate::transport::sigbus::register(region.as_ptr(), len, page, notify)?;
    Ok(GuardedRegion {
        _registration: registration,
        region: Arc::new(region),
        views: Vec::new(),
    })
}

fn log_seals(index: usize, file: &File) {
    // SAFETY: F_GET_SEALS takes no pointer; it fails on files that are
    // not memfds.
    let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 {
        debug!(region = index, "not a memfd: guarded against truncation");
    } else if seals & libc::F_SEAL_SHRINK != 0 {
        debug!(region = index, "memfd sealed against shrinking");
    } else {
        debug!(
            region = index,
            "memfd not sealed against shrinking: guarded"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    fn memfd(len: u64) -> File {
        // SAFETY: a valid NUL-terminated name.
        let fd = unsafe { libc::memfd_create(c"memory-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a new descriptor owned by nobody else.
        let f = unsafe { File::from_raw_fd(fd) };
        f.set_len(len).unwrap();
        f
    }

    fn region(gpa: u64, size: u64, user: u64, offset: u64) -> VhostUserMemoryRegion {
        VhostUserMemoryRegion::new(gpa, size, user, offset)
    }

    #[test]
    fn a_region_past_the_end_of_its_file_is_refused() {
        let e = map(
            &[region(0, 0x2000, 0x1000_0000, 0)],
            vec![memfd(0x1000)],
            -1,
        )
        .unwrap_err();
        assert!(
            matches!(
                e,
                MemoryError::File {
                    source: SharedMapError::PastEof {
                        file_size: 0x1000,
                        ..
                    },
                    ..
                }
            ),
            "{e}"
        );
        let e = map(
            &[region(0, 0x1000, 0x1000_0000, 0x1000)],
            vec![memfd(0x1000)],
            -1,
        )
        .unwrap_err();
        assert!(
            matches!(
                e,
                MemoryError::File {
                    source: SharedMapError::PastEof { offset: 0x1000, .. },
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn numbers_that_overflow_or_misalign_are_refused() {
        for r in [
            region(0, 0, 0x1000, 0),
            region(u64::MAX - 0x10, 0x1000, 0x1000, 0),
            region(0, 0x1000, u64::MAX - 0x10, 0),
            region(0, 0x1000, 0x1000, u64::MAX - 0x10),
            region(0, 0x1000, 0x1000, 0x10),
        ] {
            let e = map(&[r], vec![memfd(0x4000)], -1).unwrap_err();
            assert!(
                matches!(
                    e,
                    MemoryError::Invalid { .. }
                        | MemoryError::File {
                            source: SharedMapError::Invalid(_),
                            ..
                        }
                ),
                "{e}"
            );
        }
    }

    #[test]
    fn files_that_are_not_regular_are_refused() {
        let dir = File::open("/").unwrap();
        let e = map(&[region(0, 0x1000, 0x1000, 0)], vec![dir], -1).unwrap_err();
        assert!(
            matches!(
                e,
                MemoryError::File {
                    source: SharedMapError::Invalid(_),
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn overlapping_regions_are_refused() {
        let t = [
            region(0, 0x2000, 0x10_0000, 0),
            region(0x1000, 0x2000, 0x20_0000, 0),
        ];
        let e = map(&t, vec![memfd(0x4000), memfd(0x4000)], -1).unwrap_err();
        assert!(matches!(e, MemoryError::Overlap(_)), "{e}");
        let t = [
            region(0, 0x2000, 0x10_0000, 0),
            region(0x4000, 0x2000, 0x10_1000, 0),
        ];
        let e = map(&t, vec![memfd(0x4000), memfd(0x4000)], -1).unwrap_err();
        assert!(matches!(e, MemoryError::Overlap(_)), "{e}");
    }

    #[test]
    fn a_good_table_maps_and_is_released_when_unused() {
        let t = [
            region(0x10_0000, 0x2000, 0x20_0000, 0x1000),
            region(0, 0x1000, 0x30_0000, 0),
        ];
        let m = map(&t, vec![memfd(0x3000), memfd(0x1000)], -1).unwrap();
        assert_eq!(m.regions.len(), 2);
        assert!(
            m.regions.iter().all(GuardedRegion::in_use),
            "the map holds them"
        );
        let SharedMemory { map, regions, .. } = m;
        drop(map);
        assert!(regions.iter().all(|r| !r.in_use()));
    }
}
