//! Small shared areas a frontend hands over besides guest memory: the
//! in-flight area (VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD) and the dirty log
//! (VHOST_USER_PROTOCOL_F_LOG_SHMFD).
//!
//! The file is checked like a guest memory region (a regular file that
//! covers the range now, at a page-aligned offset) and the mapping is
//! watched by the SIGBUS guard ([`crate::transport::sigbus`]): a frontend
//! that truncates the file later costs its own connection, not the
//! process. The area the daemon creates itself (GET_INFLIGHT_FD) is a
//! memfd sealed against shrinking and growing, as libvhost-user does.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, RawFd};
use std::ptr::NonNull;

use thiserror::Error;

use crate::transport::sigbus::{GuardError, Registration};

/// Why a shared area cannot be used.
#[derive(Debug, Error)]
pub enum SharedMapError {
    /// The numbers do not describe a mappable range.
    #[error("{0}")]
    Invalid(&'static str),
    /// The file is smaller than the range.
    #[error("{len} bytes at offset {offset} of a {file_size}-byte file")]
    PastEof {
        /// Length of the range.
        len: u64,
        /// Offset in the file.
        offset: u64,
        /// File size.
        file_size: u64,
    },
    /// A system call failed.
    #[error("{what}")]
    Os {
        /// Which.
        what: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The SIGBUS guard cannot watch the mapping.
    #[error(transparent)]
    Guard(#[from] GuardError),
}

fn os(what: &'static str) -> impl FnOnce(io::Error) -> SharedMapError {
    move |source| SharedMapError::Os { what, source }
}

/// Checks that `file` is a regular file covering `offset..offset + len`
/// at an offset aligned to its page size (the huge page size on
/// hugetlbfs); returns that page size.
pub fn check_file(file: &File, offset: u64, len: u64) -> Result<u64, SharedMapError> {
    if len == 0 {
        return Err(SharedMapError::Invalid("zero size"));
    }
    let end = offset
        .checked_add(len)
        .ok_or(SharedMapError::Invalid("offset + size overflows"))?;
    let st = crate::runtime::eventfd::fstat(file.as_fd()).map_err(os("cannot inspect the file"))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(SharedMapError::Invalid("not a regular file or memfd"));
    }
    let page = page_size(file, &st).map_err(os("cannot inspect the file system"))?;
    if !offset.is_multiple_of(page) {
        return Err(SharedMapError::Invalid(
            "offset is not a multiple of the page size",
        ));
    }
    let file_size = u64::try_from(st.st_size).unwrap_or(0);
    if end > file_size {
        return Err(SharedMapError::PastEof {
            len,
            offset,
            file_size,
        });
    }
    Ok(page)
}

/// The page size of a mapping of `file`: the huge page size on hugetlbfs.
pub fn page_size(file: &File, st: &libc::stat) -> io::Result<u64> {
    // SAFETY: an all-zero statfs is a valid out buffer.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and out pointer.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &raw mut fs) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if fs.f_type == libc::HUGETLBFS_MAGIC {
        return Ok(u64::try_from(st.st_blksize).unwrap_or(1 << 21));
    }
    // SAFETY: sysconf takes no pointer.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Ok(u64::try_from(page).unwrap_or(4096))
}

/// A shared, writable mapping of part of a file, watched by the SIGBUS
/// guard; unmapped when dropped.
#[derive(Debug)]
pub struct SharedMap {
    // Declared first: dropped (unregistered) before the unmap in `drop`.
    _registration: Registration,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory, accessed only through
// atomics by whoever holds the map; the pointer is never freed before the
// map is dropped.
unsafe impl Send for SharedMap {}
// SAFETY: as above; `&SharedMap` only gives out the address.
unsafe impl Sync for SharedMap {}

impl SharedMap {
    /// Maps `len` bytes of `file` at `offset` (checked by [`check_file`]);
    /// a fault in it is reported on `notify`.
    pub fn map(file: &File, offset: u64, len: u64, notify: RawFd) -> Result<Self, SharedMapError> {
        let page = check_file(file, offset, len)?;
        let size = usize::try_from(len)
            .ok()
            .filter(|&l| isize::try_from(l).is_ok())
            .ok_or(SharedMapError::Invalid("size exceeds the address space"))?;
        let off = libc::off_t::try_from(offset)
            .map_err(|_| SharedMapError::Invalid("offset exceeds off_t"))?;
        // SAFETY: a new mapping at an address the kernel chooses; the
        // descriptor is valid for the call.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                file.as_raw_fd(),
                off,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(os("cannot map the file")(io::Error::last_os_error()));
        }
        let ptr = NonNull::new(addr.cast::<u8>())
            .ok_or(SharedMapError::Invalid("mapped at address 0"))?;
        let page = usize::try_from(page).unwrap_or(usize::MAX);
        let registration =
            match crate::transport::sigbus::register(ptr.as_ptr(), size, page, notify) {
                Ok(r) => r,
                Err(e) => {
                    // SAFETY: the mapping made above, used by nobody.
                    unsafe { libc::munmap(addr, size) };
                    return Err(e.into());
                }
            };
        Ok(SharedMap {
            _registration: registration,
            ptr,
            len: size,
        })
    }

    /// Start of the mapping.
    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Length of the mapping.
    pub fn len(&self) -> usize {
        self.len
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`; nothing uses it any more
        // (its users hold the map).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A new memfd of `len` zero bytes, sealed against growing and shrinking.
pub fn sealed_memfd(name: &std::ffi::CStr, len: u64) -> Result<File, SharedMapError> {
    // SAFETY: a valid NUL-terminated name; no Rust memory is touched.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(os("memfd_create")(io::Error::last_os_error()));
    }
    // SAFETY: a new descriptor owned by nobody else.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(len).map_err(os("cannot size the memfd"))?;
    let seals = libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;
    // SAFETY: F_ADD_SEALS takes an int.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(os("cannot seal the memfd")(io::Error::last_os_error()));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_past_the_end_or_misaligned_is_refused() {
        let f = sealed_memfd(c"t", 8192).unwrap();
        assert!(matches!(
            check_file(&f, 4096, 8192),
            Err(SharedMapError::PastEof { .. })
        ));
        assert!(matches!(
            check_file(&f, 100, 10),
            Err(SharedMapError::Invalid(_))
        ));
        assert!(matches!(
            check_file(&f, u64::MAX, 10),
            Err(SharedMapError::Invalid(_))
        ));
        assert!(matches!(
            check_file(&f, 0, 0),
            Err(SharedMapError::Invalid(_))
        ));
        assert_eq!(check_file(&f, 4096, 4096).unwrap(), 4096);
    }

    #[test]
    fn a_sealed_memfd_cannot_shrink_and_maps_shared() {
        let f = sealed_memfd(c"t", 4096).unwrap();
        assert!(f.set_len(0).is_err(), "sealed against shrinking");
        let notify = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
        let a = SharedMap::map(&f, 0, 4096, notify.as_raw_fd()).unwrap();
        let b = SharedMap::map(&f, 0, 4096, notify.as_raw_fd()).unwrap();
        let (pa, pb) = (
            a.ptr().as_ptr().wrapping_add(10),
            b.ptr().as_ptr().wrapping_add(10),
        );
        // SAFETY: within the live 4096-byte mapping `a`.
        unsafe { pa.write_volatile(7) };
        // SAFETY: within the live 4096-byte mapping `b`.
        assert_eq!(unsafe { pb.read_volatile() }, 7, "one file, two views");
    }
}
