//! Taking back submission queue entries the kernel has not consumed.
//!
//! An io_uring without SQPOLL reads its submission queue only inside
//! `io_uring_enter`, from its head (which the kernel advances) to its tail
//! (which the application stores). When that call fails it consumed
//! nothing, and the entries stay queued: the next successful call would
//! perform them. A queue that gives up on them (a commit that keeps
//! failing, [`crate::BackstoreQueue::withdraw`]) must make sure it never
//! does, since their buffers are handed back to the guest with an error:
//! it stores the tail back down to the head. The `io-uring` crate has no
//! call for this, so [`SqTail`] maps the ring's head and tail itself (a
//! second mapping of the same pages, as liburing's users may make).

use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use io_uring::IoUring;

/// The start of the kernel's `struct io_uring_params` (UAPI,
/// `<linux/io_uring.h>`): ten setup words, then `struct
/// io_sqring_offsets`, whose first two words are the offsets of the
/// submission queue's head and tail in the ring mapping.
#[repr(C)]
struct ParamsHead {
    _setup: [u32; 10],
    sq_head: u32,
    sq_tail: u32,
}

/// `IORING_OFF_SQ_RING`: the mmap offset of the submission queue ring.
const IORING_OFF_SQ_RING: libc::off_t = 0;

/// The head and tail of one ring's submission queue.
#[derive(Debug)]
pub(crate) struct SqTail {
    map: NonNull<libc::c_void>,
    len: usize,
    head: usize,
    tail: usize,
}

// SAFETY: the mapping is owned by this value (unmapped in Drop) and only
// reached through atomics.
unsafe impl Send for SqTail {}

impl SqTail {
    /// Maps the submission queue of `ring`, which must not use SQPOLL (a
    /// kernel thread would consume entries at any time).
    pub(crate) fn new(ring: &IoUring) -> io::Result<Self> {
        if ring.params().is_setup_sqpoll() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: `Parameters` is `repr(transparent)` over the kernel's
        // `io_uring_params` (120 bytes, documented so by the crate), whose
        // first 48 bytes `ParamsHead` describes.
        let p = unsafe {
            std::ptr::from_ref(ring.params())
                .cast::<ParamsHead>()
                .read_unaligned()
        };
        let (head, tail) = (p.sq_head as usize, p.sq_tail as usize);
        let len = head.max(tail) + std::mem::size_of::<u32>();
        // SAFETY: a new shared mapping of the ring's own pages, at an
        // address the kernel picks; the kernel refuses a length beyond
        // the ring.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                ring.as_raw_fd(),
                IORING_OFF_SQ_RING,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let map = NonNull::new(map).ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        Ok(SqTail {
            map,
            len,
            head,
            tail,
        })
    }

    fn word(&self, offset: usize) -> &AtomicU32 {
        // `wrapping_add` needs no unsafe; the offset is within the
        // mapping (below).
        let at = self.map.as_ptr().cast::<u8>().wrapping_add(offset);
        // SAFETY: `offset` is one the kernel gave for a 32-bit word of
        // the ring, within the mapping (`len` covers it) and aligned;
        // the mapping lives as long as `self`.
        unsafe { &*at.cast::<AtomicU32>() }
    }

    /// Entries queued and not consumed by the kernel.
    pub(crate) fn unconsumed(&self) -> u32 {
        // Acquire pairs with the kernel's release store of the head once
        // it consumed entries (`io_commit_sqring`). The tail is ours.
        let head = self.word(self.head).load(Ordering::Acquire);
        self.word(self.tail)
            .load(Ordering::Relaxed)
            .wrapping_sub(head)
    }

    /// Takes back the last `n` entries queued (at most the unconsumed
    /// ones): the kernel will never read them. Only between two
    /// `io_uring_enter` calls of the queue's one owner.
    pub(crate) fn take_back(&self, n: u32) {
        let n = n.min(self.unconsumed());
        let tail = self.word(self.tail);
        // Release as the crate's own tail store (`SubmissionQueue::sync`):
        // the kernel's next acquire load of the tail sees it.
        tail.store(
            tail.load(Ordering::Relaxed).wrapping_sub(n),
            Ordering::Release,
        );
    }
}

impl Drop for SqTail {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no longer referenced.
        unsafe { libc::munmap(self.map.as_ptr(), self.len) };
    }
}
