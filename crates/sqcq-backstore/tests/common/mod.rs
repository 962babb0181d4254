//! What the backstore tests share: guest-page-aligned buffers and the
//! wait on a queue's completion eventfd.

#![allow(dead_code)]

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::os::fd::RawFd;

/// A 4096-aligned buffer, as guest pages are.
pub struct Buf {
    ptr: *mut u8,
    layout: Layout,
}

impl Buf {
    pub fn new(len: usize) -> Buf {
        let layout = Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Buf { ptr, layout }
    }
    pub fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is valid for `layout.size()` bytes, owned by `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
    pub fn iov(&mut self, start: usize, len: usize) -> libc::iovec {
        assert!(start + len <= self.layout.size());
        libc::iovec {
            iov_base: self.ptr.wrapping_add(start).cast(),
            iov_len: len,
        }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr, self.layout) };
    }
}

/// Waits up to `secs` for the completion eventfd `fd`, then reads it
/// (which rearms it).
pub fn wait_readable(fd: RawFd, secs: i32) {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, secs * 1000) };
    assert_eq!(n, 1, "no completion within {secs} s");
    let mut count = 0u64;
    // SAFETY: reads 8 bytes into a live u64.
    unsafe { libc::read(fd, (&mut count as *mut u64).cast(), 8) };
}
