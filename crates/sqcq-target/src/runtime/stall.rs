//! The stall guard: a write to a frontend's eventfd that blocks anyway is
//! interrupted after [`STALL_LIMIT`].
//!
//! The daemon makes every eventfd a frontend hands over non-blocking
//! ([`crate::runtime::eventfd`]), but `O_NONBLOCK` belongs to the open file
//! description, which the frontend shares: it can clear the flag again on
//! its own copy and saturate the counter, and Linux offers no per-call
//! non-blocking write for eventfds. Such a write would hold a worker, and
//! every queue of every device on it, for as long as the frontend likes.
//!
//! So threads that write to frontend descriptors (workers and device
//! control threads) register here, and each such write is bracketed by
//! two relaxed stores into the thread's slot (a counter, odd during the
//! write: no clock is read on the I/O path). A watchdog thread looks at
//! the slots every [`WATCH_PERIOD`]; a write it finds under way, with the
//! same count, for [`STALL_LIMIT`] gets the thread a `SIGURG`, whose handler does nothing and is installed without
//! `SA_RESTART`, so the write returns `EINTR`. The writer then knows the
//! frontend stalled it ([`Outcome::Stalled`]) and stops using the
//! descriptor. A signal that arrives just after the write finished
//! interrupts at most an `epoll_wait` or a socket call, which every caller
//! retries. Idle, the watchdog wakes four times a second and touches a
//! few cache lines: no measurable CPU.
//!
//! Written here because no crate does this; the mechanism is the classic
//! one of interrupting a blocked system call with a signal.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// How long a write to a frontend descriptor may block.
pub const STALL_LIMIT: Duration = Duration::from_secs(1);
/// How often the watchdog looks.
pub const WATCH_PERIOD: Duration = Duration::from_millis(250);

/// The signal that interrupts a stalled write.
const STALL_SIGNAL: libc::c_int = libc::SIGURG;

/// One registered thread.
struct Slot {
    /// Guarded calls begun and ended, counted by the thread itself: odd
    /// while one is under way. A value the watchdog sees odd and unchanged
    /// for [`STALL_LIMIT`] is a stalled call (no clock read on the
    /// thread's side).
    seq: AtomicU64,
    /// The watchdog interrupted the current write.
    fired: AtomicBool,
}

/// A registered thread: its pthread id, its slot, and what the watchdog
/// last saw of it (`seq`, and since when).
struct Watched {
    thread: libc::pthread_t,
    slot: &'static Slot,
    seen: u64,
    since: Instant,
}

/// The registered threads. The watchdog holds the lock while it signals,
/// so a thread cannot exit (it unregisters under the lock) while it may
/// be signalled.
struct Table {
    threads: Vec<Option<Watched>>,
    /// Slots of threads that ended, for the next ones.
    free: Vec<&'static Slot>,
}

fn table() -> &'static Mutex<Table> {
    static TABLE: OnceLock<Mutex<Table>> = OnceLock::new();
    TABLE.get_or_init(|| {
        Mutex::new(Table {
            threads: Vec::new(),
            free: Vec::new(),
        })
    })
}

thread_local! {
    static CURRENT: std::cell::Cell<Option<&'static Slot>> = const { std::cell::Cell::new(None) };
}

/// The registration of the current thread; dropping it unregisters.
#[derive(Debug)]
pub struct Registration {
    index: usize,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut t = table().lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(w) = t.threads.get_mut(self.index).and_then(Option::take) {
            // No watchdog look at it from here (it looks under the lock).
            t.free.push(w.slot);
        }
        CURRENT.with(|c| c.set(None));
    }
}

/// Registers the current thread (a worker or control thread) so that its
/// writes to frontend descriptors are guarded.
pub fn register() -> io::Result<Registration> {
    install()?;
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() };
    let mut t = table().lock().unwrap_or_else(PoisonError::into_inner);
    // Slots are leaked, so that one outlives any watchdog look at it, and
    // reused once their thread ended: as many as threads ever ran at once
    // (workers and device control threads come and go at run time).
    let slot: &'static Slot = t.free.pop().unwrap_or_else(|| {
        Box::leak(Box::new(Slot {
            seq: AtomicU64::new(0),
            fired: AtomicBool::new(false),
        }))
    });
    slot.fired.store(false, Ordering::Relaxed);
    let index = match t.threads.iter().position(Option::is_none) {
        Some(i) => i,
        None => {
            t.threads.push(None);
            t.threads.len() - 1
        }
    };
    t.threads[index] = Some(Watched {
        thread: me,
        slot,
        seen: 0,
        since: Instant::now(),
    });
    CURRENT.with(|c| c.set(Some(slot)));
    Ok(Registration { index })
}

/// How a guarded system call ended.
#[derive(Debug)]
pub enum Outcome {
    /// It returned (with its byte count or error).
    Done(io::Result<usize>),
    /// It blocked for [`STALL_LIMIT`] and was interrupted.
    Stalled,
}

/// Writes `buf` to `fd`, interrupted if it blocks for [`STALL_LIMIT`]
/// on a registered thread.
pub fn write(fd: RawFd, buf: &[u8]) -> Outcome {
    // SAFETY: writes `buf.len()` bytes from a live slice.
    guarded(|| unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) })
}

/// Reads into `buf` from `fd`, interrupted like [`write()`].
pub fn read(fd: RawFd, buf: &mut [u8]) -> Outcome {
    // SAFETY: reads at most `buf.len()` bytes into a live slice.
    guarded(|| unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) })
}

/// Runs a system call (returning a byte count or -1) under the guard.
fn guarded(call: impl FnOnce() -> isize) -> Outcome {
    let slot = CURRENT.with(std::cell::Cell::get);
    if let Some(s) = slot {
        s.fired.store(false, Ordering::Relaxed);
        // Relaxed, and a plain load and store: only this thread writes
        // `seq`; the watchdog only needs to see it eventually, a stale
        // view delays a signal by one watch period at most.
        s.seq
            .store(s.seq.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
    let n = call();
    let result = if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n.unsigned_abs())
    };
    if let Some(s) = slot {
        s.seq
            .store(s.seq.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        if matches!(&result, Err(e) if e.kind() == io::ErrorKind::Interrupted)
            && s.fired.load(Ordering::Relaxed)
        {
            return Outcome::Stalled;
        }
    }
    Outcome::Done(result)
}

extern "C" fn on_stall_signal(_: libc::c_int) {}

/// Installs the signal handler and starts the watchdog (once per process,
/// before any seccomp filter).
pub fn install() -> io::Result<()> {
    static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();
    let r = INSTALLED.get_or_init(|| {
        // SAFETY: an all-zero sigaction is valid to fill in.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = on_stall_signal as *const () as usize;
        // No SA_RESTART: the interrupted write returns EINTR.
        sa.sa_flags = 0;
        // SAFETY: `sa_mask` is a valid sigset_t to initialise.
        unsafe { libc::sigemptyset(&raw mut sa.sa_mask) };
        // SAFETY: a fully initialised action with an async-signal-safe
        // (empty) handler.
        if unsafe { libc::sigaction(STALL_SIGNAL, &raw const sa, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        let spawned = std::thread::Builder::new()
            .name("sqcq-stall".into())
            .spawn(watch);
        spawned
            .map(|_| ())
            .map_err(|e| e.raw_os_error().unwrap_or(0))
    });
    (*r).map_err(io::Error::from_raw_os_error)
}

/// The watchdog: signals threads whose write started too long ago.
fn watch() {
    loop {
        std::thread::sleep(WATCH_PERIOD);
        let now = Instant::now();
        let mut t = table().lock().unwrap_or_else(PoisonError::into_inner);
        for w in t.threads.iter_mut().flatten() {
            let seq = w.slot.seq.load(Ordering::Relaxed);
            if seq != w.seen {
                w.seen = seq;
                w.since = now;
                continue;
            }
            if seq % 2 == 1 && now.duration_since(w.since) >= STALL_LIMIT {
                w.slot.fired.store(true, Ordering::Relaxed);
                // SAFETY: the thread is registered, and it unregisters
                // under the lock this loop holds before it can exit.
                unsafe { libc::pthread_kill(w.thread, STALL_SIGNAL) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_blocked_eventfd_write_is_interrupted() {
        let _reg = register().unwrap();
        // A blocking eventfd whose counter is at its maximum.
        // SAFETY: eventfd takes no pointer.
        let fd = unsafe { libc::eventfd(0, 0) };
        assert!(fd >= 0);
        // SAFETY: a new descriptor owned by nobody else.
        let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let max = 0xffff_ffff_ffff_fffe_u64.to_ne_bytes();
        assert!(matches!(
            write(file.as_raw_fd(), &max),
            Outcome::Done(Ok(8))
        ));
        let one = 1u64.to_ne_bytes();
        assert!(matches!(write(file.as_raw_fd(), &one), Outcome::Stalled));
        // A write that does not block is not disturbed.
        let mut v = [0u8; 8];
        // SAFETY: reads 8 bytes into a local buffer.
        assert_eq!(unsafe { libc::read(fd, v.as_mut_ptr().cast(), 8) }, 8);
        assert!(matches!(
            write(file.as_raw_fd(), &one),
            Outcome::Done(Ok(8))
        ));
    }
}
