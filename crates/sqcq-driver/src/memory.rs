//! The frontend's "guest" memory: one sealed memfd, mapped shared, seen as a
//! vm-memory [`GuestMemoryMmap`], with a bump allocator of guest-physical
//! ranges.
//!
//! The memfd is what a vhost-user backend receives in `SET_MEM_TABLE`
//! ([`DriverMemory::as_raw_fd`], [`DriverMemory::file_offset`],
//! [`DriverMemory::host_base`]); the same memory, reached through
//! [`DriverMemory::guest_memory`], is what unit tests run virtio-queue's
//! device-side `Queue` over. The file is sealed against shrinking and
//! growing, so a backend holding the fd cannot truncate it under our
//! mapping (which would turn our next access into SIGBUS).

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::ptr::NonNull;
use std::sync::Arc;

use vm_memory::mmap::{MmapRegionBuilder, MmapRegionError};
use vm_memory::{
    FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionCollectionError, GuestRegionMmap,
    MmapRegion,
};

/// The guest-physical base address is aligned to this, so that the host
/// address of an allocation is aligned like its guest-physical address for
/// every alignment up to a page.
const BASE_ALIGN: u64 = 4096;

/// The cache line the per-request areas are laid out by: a header the
/// driver writes and a response the device writes never share a line with
/// another slot's, so that neither side's stores pull a line the other is
/// reading for a neighbouring request (false sharing across CPUs).
pub(crate) const CACHE_LINE: usize = 64;

/// Errors from creating [`DriverMemory`] or allocating from it.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// The requested size is zero or not a multiple of the page size of the
    /// backing memory (the huge page size with huge pages).
    #[error("memory size {size:#x} is not a non-zero multiple of the page size {page_size:#x}")]
    InvalidSize {
        /// The requested size in bytes.
        size: usize,
        /// The page size the backing memory uses.
        page_size: u64,
    },
    /// The guest-physical base is not 4 KiB aligned.
    #[error("guest-physical base {base:#x} is not 4 KiB aligned")]
    UnalignedBase {
        /// The requested base address.
        base: u64,
    },
    /// The base plus the size overflows the guest-physical address space.
    #[error("guest-physical range at {base:#x} of {size:#x} bytes overflows")]
    AddressOverflow {
        /// The requested base address.
        base: u64,
        /// The requested size in bytes.
        size: usize,
    },
    /// `memfd_create` failed.
    #[error("memfd_create failed")]
    MemfdCreate(#[source] io::Error),
    /// Huge pages were asked for but cannot be had (no hugetlb support, or
    /// not enough huge pages reserved: see `/proc/sys/vm/nr_hugepages`).
    #[error(
        "huge pages unavailable for {size:#x} bytes (reserve some in /proc/sys/vm/nr_hugepages)"
    )]
    HugePagesUnavailable {
        /// The requested size in bytes.
        size: usize,
        /// The failing system call's error.
        #[source]
        source: io::Error,
    },
    /// Setting the memfd's size, reading its metadata or sealing it failed.
    #[error("setting up the memfd failed")]
    Memfd(#[source] io::Error),
    /// Mapping the memfd failed.
    #[error("mapping the memfd failed")]
    Mmap(#[source] MmapRegionError),
    /// vm-memory rejected the region.
    #[error("building the guest memory failed")]
    GuestMemory(#[source] GuestRegionCollectionError),
    /// An allocation asked for an alignment that is not a power of two.
    #[error("alignment {align:#x} is not a power of two")]
    InvalidAlignment {
        /// The requested alignment.
        align: u64,
    },
    /// An allocation asked for zero bytes.
    #[error("zero-length allocation")]
    ZeroLength,
    /// The arena has no room left for an allocation.
    #[error("out of driver memory: {len:#x} bytes aligned to {align:#x}, {free:#x} bytes left")]
    OutOfMemory {
        /// The requested length in bytes.
        len: usize,
        /// The requested alignment.
        align: u64,
        /// Bytes left past the current arena cursor (before alignment).
        free: u64,
    },
    /// A guest-physical range is not inside this memory.
    #[error("guest-physical range at {gpa:#x} of {len:#x} bytes is outside the driver memory")]
    OutOfRange {
        /// The start of the range.
        gpa: u64,
        /// Its length in bytes.
        len: usize,
    },
}

/// How to create [`DriverMemory`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryConfig {
    /// Size in bytes: a multiple of the page size (of the huge page size
    /// with `huge_pages`).
    pub size: usize,
    /// Guest-physical address of the first byte; 4 KiB aligned.
    pub base: GuestAddress,
    /// Back the memory with huge pages (`MFD_HUGETLB`, the default huge
    /// page size). Fails with [`MemoryError::HugePagesUnavailable`] when
    /// the machine has none reserved.
    pub huge_pages: bool,
}

impl MemoryConfig {
    /// `size` bytes of ordinary pages at guest-physical address 0.
    pub fn new(size: usize) -> Self {
        Self {
            size,
            base: GuestAddress(0),
            huge_pages: false,
        }
    }
}

/// The frontend's guest memory: a sealed memfd mapped `MAP_SHARED` as one
/// vm-memory region, plus a bump allocator of aligned guest-physical ranges.
///
/// Allocation only moves forward: rings, doorbells, request headers and
/// data buffers are carved out once, at set-up, and live as long as the
/// memory does.
#[derive(Debug)]
pub struct DriverMemory {
    guest: GuestMemoryMmap,
    mapping: Arc<MmapRegion>,
    file: Arc<File>,
    base: GuestAddress,
    size: usize,
    huge_pages: bool,
    /// Bytes from `base` already handed out.
    cursor: u64,
}

impl DriverMemory {
    /// Creates `size` bytes of ordinary shared memory at guest-physical 0.
    pub fn new(size: usize) -> Result<Self, MemoryError> {
        Self::with_config(&MemoryConfig::new(size))
    }

    /// Creates the memory described by `config`.
    pub fn with_config(config: &MemoryConfig) -> Result<Self, MemoryError> {
        let MemoryConfig {
            size,
            base,
            huge_pages,
        } = *config;
        if base.0 % BASE_ALIGN != 0 {
            return Err(MemoryError::UnalignedBase { base: base.0 });
        }
        let size_u64 =
            u64::try_from(size).map_err(|_| MemoryError::AddressOverflow { base: base.0, size })?;
        if base.0.checked_add(size_u64).is_none() {
            return Err(MemoryError::AddressOverflow { base: base.0, size });
        }
        let huge_err = |source: io::Error| MemoryError::HugePagesUnavailable { size, source };

        let fd = memfd_create(huge_pages).map_err(|e| {
            if huge_pages {
                huge_err(e)
            } else {
                MemoryError::MemfdCreate(e)
            }
        })?;
        let file = File::from(fd);
        // For a hugetlb memfd st_blksize is the huge page size, otherwise
        // the base page size.
        let page_size = file.metadata().map_err(MemoryError::Memfd)?.blksize();
        if size == 0 || page_size == 0 || size_u64 % page_size != 0 {
            return Err(MemoryError::InvalidSize { size, page_size });
        }
        file.set_len(size_u64).map_err(|e| {
            if huge_pages {
                huge_err(e)
            } else {
                MemoryError::Memfd(e)
            }
        })?;
        seal_size(&file).map_err(MemoryError::Memfd)?;

        let file = Arc::new(file);
        let mapping = MmapRegionBuilder::new(size)
            .with_file_offset(FileOffset::from_arc(Arc::clone(&file), 0))
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
            .with_mmap_flags(libc::MAP_SHARED)
            .with_hugetlbfs(huge_pages)
            .build()
            .map_err(|e| match e {
                // Without enough reserved huge pages, mmap fails with ENOMEM.
                MmapRegionError::Mmap(io) if huge_pages => huge_err(io),
                other => MemoryError::Mmap(other),
            })?;
        let mapping = Arc::new(mapping);
        let region = GuestRegionMmap::with_arc(Arc::clone(&mapping), base)
            .ok_or(MemoryError::AddressOverflow { base: base.0, size })?;
        let guest =
            GuestMemoryMmap::from_regions(vec![region]).map_err(MemoryError::GuestMemory)?;
        Ok(Self {
            guest,
            mapping,
            file,
            base,
            size,
            huge_pages,
            cursor: 0,
        })
    }

    /// The memory as vm-memory sees it (one region at [`Self::base`]).
    pub fn guest_memory(&self) -> &GuestMemoryMmap {
        &self.guest
    }

    /// Guest-physical address of the first byte.
    pub fn base(&self) -> GuestAddress {
        self.base
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Whether the memory is backed by huge pages.
    pub fn huge_pages(&self) -> bool {
        self.huge_pages
    }

    /// Offset of [`Self::base`] in the memfd (the `mmap_offset` of
    /// `SET_MEM_TABLE`): always 0.
    pub fn file_offset(&self) -> u64 {
        0
    }

    /// This process's virtual address of [`Self::base`] (the
    /// `userspace_addr` of `SET_MEM_TABLE`).
    pub fn host_base(&self) -> u64 {
        self.mapping.as_ptr() as u64
    }

    /// This process's virtual address of guest-physical `gpa`, which must lie
    /// in the memory. vhost's `Frontend::set_vring_addr` wants these.
    pub fn host_addr(&self, gpa: GuestAddress) -> Result<u64, MemoryError> {
        let offset = self.offset_of(gpa, 1)?;
        // Cannot overflow: the mapping of `size` bytes exists at host_base.
        Ok(self.host_base() + offset)
    }

    /// Bytes not yet handed out by [`Self::alloc`].
    pub fn free_bytes(&self) -> u64 {
        self.size_u64() - self.cursor
    }

    /// Hands out `len` bytes at a guest-physical address aligned to `align`
    /// (a power of two). The bytes are zero unless written since creation:
    /// ranges are never handed out twice.
    pub fn alloc(&mut self, len: usize, align: u64) -> Result<GuestAddress, MemoryError> {
        if !align.is_power_of_two() {
            return Err(MemoryError::InvalidAlignment { align });
        }
        if len == 0 {
            return Err(MemoryError::ZeroLength);
        }
        let free = self.free_bytes();
        let out_of_memory = || MemoryError::OutOfMemory { len, align, free };
        let start = self
            .base
            .0
            .checked_add(self.cursor)
            .and_then(|cur| cur.checked_next_multiple_of(align))
            .ok_or_else(out_of_memory)?;
        let offset = start - self.base.0;
        let end = u64::try_from(len)
            .ok()
            .and_then(|len| offset.checked_add(len))
            .filter(|&end| end <= self.size_u64())
            .ok_or_else(out_of_memory)?;
        self.cursor = end;
        Ok(GuestAddress(start))
    }

    /// The mapping behind `[gpa, gpa + len)` and the host pointer to `gpa`;
    /// holding the `Arc` keeps the pointer valid.
    pub(crate) fn host_range(
        &self,
        gpa: GuestAddress,
        len: usize,
    ) -> Result<(Arc<MmapRegion>, NonNull<u8>), MemoryError> {
        let offset = self.offset_of(gpa, len)?;
        let offset =
            usize::try_from(offset).map_err(|_| MemoryError::OutOfRange { gpa: gpa.0, len })?;
        // `offset + len <= size`, so this stays inside the mapping; the
        // pointer is non-null because the mapping's base is.
        let ptr = NonNull::new(self.mapping.as_ptr().wrapping_add(offset))
            .ok_or(MemoryError::OutOfRange { gpa: gpa.0, len })?;
        Ok((Arc::clone(&self.mapping), ptr))
    }

    /// Offset of `gpa` from the base, when `[gpa, gpa + len)` is inside.
    fn offset_of(&self, gpa: GuestAddress, len: usize) -> Result<u64, MemoryError> {
        let range_err = || MemoryError::OutOfRange { gpa: gpa.0, len };
        let offset = gpa.0.checked_sub(self.base.0).ok_or_else(range_err)?;
        let end = u64::try_from(len)
            .ok()
            .and_then(|len| offset.checked_add(len))
            .ok_or_else(range_err)?;
        if end > self.size_u64() {
            return Err(range_err());
        }
        Ok(offset)
    }

    fn size_u64(&self) -> u64 {
        // `with_config` checked that the size fits in u64.
        u64::try_from(self.size).unwrap_or(u64::MAX)
    }
}

impl AsRawFd for DriverMemory {
    /// The memfd, for `SET_MEM_TABLE`.
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

impl AsFd for DriverMemory {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

fn memfd_create(huge_pages: bool) -> io::Result<OwnedFd> {
    const NAME: &CStr = c"sqcq-driver-memory";
    let mut flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    if huge_pages {
        flags |= libc::MFD_HUGETLB;
    }
    // SAFETY: NAME is a NUL-terminated string that outlives the call, and
    // the flags are valid memfd_create flags; the call touches no Rust memory.
    let fd = unsafe { libc::memfd_create(NAME.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: memfd_create just returned this fd; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Seals the memfd's size: a peer holding the fd can then neither shrink it
/// (SIGBUS for us) nor grow it, nor add or remove seals.
fn seal_size(file: &File) -> io::Result<()> {
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: F_ADD_SEALS takes an int argument and only changes the
    // file's seals; the fd is valid for the duration of the borrow.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestMemoryBackend};

    const MIB: usize = 1 << 20;

    #[test]
    fn alloc_aligns_and_never_overlaps() {
        let mut mem = DriverMemory::new(MIB).unwrap();
        let a = mem.alloc(3, 1).unwrap();
        let b = mem.alloc(16, 16).unwrap();
        let c = mem.alloc(1, 4096).unwrap();
        assert_eq!(a, GuestAddress(0));
        assert_eq!(b, GuestAddress(16));
        assert_eq!(c, GuestAddress(4096));
        assert_eq!(mem.free_bytes(), (MIB - 4097) as u64);
    }

    #[test]
    fn alloc_errors_instead_of_panicking() {
        let mut mem = DriverMemory::new(MIB).unwrap();
        assert!(matches!(
            mem.alloc(1, 3),
            Err(MemoryError::InvalidAlignment { align: 3 })
        ));
        assert!(matches!(mem.alloc(0, 8), Err(MemoryError::ZeroLength)));
        assert!(matches!(
            mem.alloc(MIB + 1, 1),
            Err(MemoryError::OutOfMemory { .. })
        ));
        assert!(matches!(
            mem.alloc(usize::MAX, 1),
            Err(MemoryError::OutOfMemory { .. })
        ));
        // A failed allocation does not move the cursor.
        assert_eq!(mem.alloc(MIB, 1).unwrap(), GuestAddress(0));
        assert!(matches!(
            mem.alloc(1, 1),
            Err(MemoryError::OutOfMemory { free: 0, .. })
        ));
        assert!(matches!(
            mem.alloc(1, 1 << 63),
            Err(MemoryError::OutOfMemory { .. })
        ));
    }

    #[test]
    fn config_is_validated() {
        assert!(matches!(
            DriverMemory::new(0),
            Err(MemoryError::InvalidSize { .. })
        ));
        assert!(matches!(
            DriverMemory::new(4097),
            Err(MemoryError::InvalidSize { .. })
        ));
        let unaligned = MemoryConfig {
            base: GuestAddress(0x800),
            ..MemoryConfig::new(MIB)
        };
        assert!(matches!(
            DriverMemory::with_config(&unaligned),
            Err(MemoryError::UnalignedBase { base: 0x800 })
        ));
        let overflowing = MemoryConfig {
            base: GuestAddress(u64::MAX - 4095),
            ..MemoryConfig::new(MIB)
        };
        assert!(matches!(
            DriverMemory::with_config(&overflowing),
            Err(MemoryError::AddressOverflow { .. })
        ));
    }

    #[test]
    fn host_addresses_follow_the_base() {
        let config = MemoryConfig {
            base: GuestAddress(0x1_0000_0000),
            ..MemoryConfig::new(MIB)
        };
        let mut mem = DriverMemory::with_config(&config).unwrap();
        let gpa = mem.alloc(64, 64).unwrap();
        assert_eq!(gpa, GuestAddress(0x1_0000_0000));
        assert_eq!(mem.host_addr(gpa).unwrap(), mem.host_base());
        assert_eq!(
            mem.host_addr(GuestAddress(0x1_0000_0010)).unwrap(),
            mem.host_base() + 0x10
        );
        assert_eq!(
            mem.guest_memory().get_host_address(gpa).unwrap() as u64,
            mem.host_base()
        );
        assert!(matches!(
            mem.host_addr(GuestAddress(0xffff_ffff)),
            Err(MemoryError::OutOfRange { .. })
        ));
        assert!(matches!(
            mem.host_addr(GuestAddress(0x1_0000_0000 + MIB as u64)),
            Err(MemoryError::OutOfRange { .. })
        ));
    }

    #[test]
    fn the_fd_is_a_sealed_shared_memfd() {
        let mem = DriverMemory::new(MIB).unwrap();
        // SAFETY: F_GET_SEALS only reads the seals of a valid fd.
        let seals = unsafe { libc::fcntl(mem.as_raw_fd(), libc::F_GET_SEALS) };
        assert_eq!(
            seals,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL
        );
        let file = File::from(mem.as_fd().try_clone_to_owned().unwrap());
        assert!(file.set_len(0).is_err(), "a peer must not shrink the file");

        // A second mapping of the fd, as a backend would make, sees our
        // writes: the mapping is MAP_SHARED.
        let peer = MmapRegion::<()>::from_file(FileOffset::new(file, 0), MIB).unwrap();
        let peer = GuestMemoryMmap::from_regions(vec![
            GuestRegionMmap::new(peer, GuestAddress(0)).unwrap(),
        ])
        .unwrap();
        mem.guest_memory()
            .write_obj(0xfeed_u32, GuestAddress(0x1234))
            .unwrap();
        assert_eq!(peer.read_obj::<u32>(GuestAddress(0x1234)).unwrap(), 0xfeed);
    }

    #[test]
    fn huge_pages_work_or_fail_clearly() {
        let config = MemoryConfig {
            huge_pages: true,
            ..MemoryConfig::new(2 * MIB)
        };
        match DriverMemory::with_config(&config) {
            Ok(mem) => assert!(mem.huge_pages()),
            Err(MemoryError::HugePagesUnavailable { .. }) => {}
            Err(MemoryError::InvalidSize { page_size, .. }) => {
                assert!(page_size > 2 * MIB as u64, "huge page size {page_size:#x}");
            }
            Err(other) => panic!("unexpected error: {other}"),
        }
    }
}
