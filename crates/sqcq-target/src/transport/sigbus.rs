//! The SIGBUS guard: memory a frontend takes away after sharing it costs
//! that frontend's device, never the process.
//!
//! Guest memory is a `MAP_SHARED` mapping of a file the frontend owns. If
//! the frontend shrinks that file (`ftruncate`), punches a hole into a
//! hugetlbfs file when no huge page is left, or otherwise removes what a
//! mapped page stands for, the next access to the page raises SIGBUS
//! (`BUS_ADRERR`), whose default action ends the daemon with every device
//! and VM it serves. [`crate::transport::memory`] refuses regions the file does not
//! cover when they arrive; this guard covers what happens afterwards.
//!
//! Every guest memory mapping is registered here with the eventfd of the
//! device that owns it. On SIGBUS at an address inside a registered
//! mapping, the handler maps one private anonymous page (a huge page for
//! hugetlbfs) over the faulting page with `MAP_FIXED` and writes 1 to the
//! device's eventfd. The faulting access then runs again and reads zeros
//! (or writes into the private page, which nobody else sees); the device's
//! control thread wakes and drops the connection, which unmaps the whole
//! region. The handler uses only `mmap` and `write` (system calls without
//! locks) and atomics: it is async-signal-safe.
//!
//! A SIGBUS outside every registered mapping, or of another kind (a
//! hardware memory error, `BUS_MCEERR_*`), goes to the handler that was
//! installed before (Rust's standard library's, or the default action):
//! the daemon does not hide its own bugs.
//!
//! Registrations live in a fixed table ([`MAX_MAPPINGS`] entries) so the
//! handler needs no allocation and no lock. A [`Registration`] must be
//! dropped before its mapping is unmapped (see
//! [`crate::transport::memory::GuardedRegion`]).

use std::io;
use std::os::fd::RawFd;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, AtomicU8, AtomicU64, AtomicUsize, Ordering};

use thiserror::Error;

/// Guest memory mappings the guard can watch at once (every region of
/// every connected device, plus regions of a replaced memory table still
/// used by requests in flight).
pub const MAX_MAPPINGS: usize = 1024;

const FREE: u8 = 0;
const CLAIMED: u8 = 1;
const LIVE: u8 = 2;

struct Entry {
    state: AtomicU8,
    start: AtomicUsize,
    len: AtomicUsize,
    page: AtomicUsize,
    fd: AtomicI32,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Entry = Entry {
    state: AtomicU8::new(FREE),
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    page: AtomicUsize::new(0),
    fd: AtomicI32::new(-1),
};

static TABLE: [Entry; MAX_MAPPINGS] = [EMPTY; MAX_MAPPINGS];

/// Faults the guard turned into a broken device (all devices, since the
/// process started).
static RECOVERED: AtomicU64 = AtomicU64::new(0);

/// The handler that was installed before ours (address and `sa_flags`).
static PREVIOUS: OnceLock<(usize, i32)> = OnceLock::new();

/// The guard could not take a mapping.
#[derive(Debug, Error)]
pub enum GuardError {
    /// The SIGBUS handler could not be installed.
    #[error("cannot install the SIGBUS handler")]
    Install(#[source] io::Error),
    /// The table is full.
    #[error("more than {MAX_MAPPINGS} guest memory mappings")]
    Full,
}

/// A mapping watched by the guard; dropping it stops watching (do so
/// before unmapping).
#[derive(Debug)]
pub struct Registration(usize);

impl Drop for Registration {
    fn drop(&mut self) {
        // Release: a handler that still sees LIVE sees the fields too; one
        // that sees FREE ignores the entry.
        TABLE[self.0].state.store(FREE, Ordering::Release);
    }
}

/// Watches `len` bytes at `start` (a mapping made of `page`-byte pages);
/// a fault there is reported by writing 1 to `notify` (which must stay
/// open as long as the registration lives).
pub fn register(
    start: *const u8,
    len: usize,
    page: usize,
    notify: RawFd,
) -> Result<Registration, GuardError> {
    install()?;
    for (i, e) in TABLE.iter().enumerate() {
        if e.state
            .compare_exchange(FREE, CLAIMED, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            e.start.store(start as usize, Ordering::Relaxed);
            e.len.store(len, Ordering::Relaxed);
            e.page.store(page.max(1), Ordering::Relaxed);
            e.fd.store(notify, Ordering::Relaxed);
            // Release: pairs with the handler's Acquire load of `state`.
            e.state.store(LIVE, Ordering::Release);
            return Ok(Registration(i));
        }
    }
    Err(GuardError::Full)
}

/// Faults recovered since the process started (the tests' witness).
#[cfg(test)]
pub fn recovered() -> u64 {
    RECOVERED.load(Ordering::Relaxed)
}

fn install() -> Result<(), GuardError> {
    static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();
    let result = INSTALLED.get_or_init(|| {
        // SAFETY: all-zero sigaction structs are valid to fill in.
        let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        new.sa_sigaction = on_sigbus as *const () as usize;
        new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: `sa_mask` is a valid sigset_t to initialise.
        unsafe { libc::sigemptyset(&raw mut new.sa_mask) };
        // Recorded before the handler can run: it reads PREVIOUS.
        // SAFETY: reads the current action into `old` without changing it.
        if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &raw mut old) } != 0 {
            return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        let _ = PREVIOUS.set((old.sa_sigaction, old.sa_flags));
        // SAFETY: `new` is fully initialised; `on_sigbus` is
        // async-signal-safe (module docs).
        if unsafe { libc::sigaction(libc::SIGBUS, &raw const new, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        Ok(())
    });
    (*result).map_err(|e| GuardError::Install(io::Error::from_raw_os_error(e)))
}

/// Maps a private zero page over the faulting page if it belongs to a
/// registered mapping; returns whether it did.
fn recover(addr: usize) -> bool {
    for e in &TABLE {
        // Acquire: pairs with the Release store of LIVE in `register`.
        if e.state.load(Ordering::Acquire) != LIVE {
            continue;
        }
        let start = e.start.load(Ordering::Relaxed);
        let len = e.len.load(Ordering::Relaxed);
        if addr < start || addr - start >= len {
            continue;
        }
        let page = e.page.load(Ordering::Relaxed);
        let base = start + (addr - start) / page * page;
        let size = page.min(start + len - base);
        // SAFETY: replaces pages of a guest mapping this process owns
        // (registered until just before it is unmapped) with private
        // anonymous memory; nothing in the process holds references into
        // guest memory, only raw pointers used with volatile or atomic
        // accesses, which now see zeros.
        let p = unsafe {
            libc::mmap(
                base as *mut libc::c_void,
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return false;
        }
        let one = 1u64;
        // SAFETY: writes 8 bytes from a local to the device's eventfd,
        // open while the entry is LIVE. A full counter is fine: the
        // device is told already.
        let _ = unsafe { libc::write(e.fd.load(Ordering::Relaxed), (&raw const one).cast(), 8) };
        RECOVERED.fetch_add(1, Ordering::Relaxed);
        return true;
    }
    false
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let info_ref = unsafe { &*info };
    // SAFETY: a SIGBUS siginfo carries the faulting address.
    let addr = unsafe { info_ref.si_addr() } as usize;
    let code = info_ref.si_code;
    if code == libc::BUS_ADRERR && recover(addr) {
        return;
    }
    match PREVIOUS.get().copied() {
        Some((handler, flags)) if handler != libc::SIG_DFL && handler != libc::SIG_IGN => {
            if flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the previous SA_SIGINFO handler, called as the
                // kernel would have.
                let f = unsafe {
                    std::mem::transmute::<
                        usize,
                        extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void),
                    >(handler)
                };
                f(sig, info, ctx);
            } else {
                // SAFETY: the previous plain handler.
                let f =
                    unsafe { std::mem::transmute::<usize, extern "C" fn(libc::c_int)>(handler) };
                f(sig);
            }
        }
        _ => {
            // Back to the default action: returning re-executes the access,
            // which now ends the process as it would have without us.
            // SAFETY: an all-zero sigaction is SIG_DFL with no flags.
            let mut dfl: libc::sigaction = unsafe { std::mem::zeroed() };
            dfl.sa_sigaction = libc::SIG_DFL;
            // SAFETY: sigaction is async-signal-safe; `dfl` is valid.
            unsafe { libc::sigaction(libc::SIGBUS, &raw const dfl, std::ptr::null_mut()) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd};

    #[test]
    fn a_truncated_shared_mapping_reads_zeros_and_notifies() {
        // SAFETY: a valid NUL-terminated name.
        let fd = unsafe { libc::memfd_create(c"sigbus-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a new descriptor owned by nobody else.
        let file = unsafe { std::fs::File::from_raw_fd(fd) };
        let page = 4096usize;
        file.set_len(4 * page as u64).unwrap();
        // SAFETY: maps the memfd; unmapped at the end of the test.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let base = p.cast::<u8>();
        // SAFETY: inside the 4-page mapping.
        let last = unsafe { base.add(3 * page) };
        // SAFETY: `last` is a mapped byte of the file.
        unsafe { last.write_volatile(7) };
        let notify = crate::runtime::eventfd::PeerEventFd::new().unwrap();
        let reg = register(base, 4 * page, page, notify.as_raw_fd()).unwrap();
        let before = recovered();
        // The frontend takes the last two pages away.
        file.set_len(2 * page as u64).unwrap();
        // SAFETY: inside the mapping; this access raises SIGBUS, which the
        // guard recovers.
        let v = unsafe { last.read_volatile() };
        assert_eq!(v, 0, "the page reads zeros after the guard replaced it");
        assert!(recovered() > before);
        assert_eq!(notify.drain(), Some(1), "the device was told");
        // SAFETY: still mapped (the first pages are the file's).
        unsafe { base.write_volatile(1) };
        drop(reg);
        // SAFETY: unmaps what this test mapped.
        unsafe { libc::munmap(p, 4 * page) };
    }
}
