//! Event descriptors a frontend hands over (SET_VRING_KICK, _CALL, _ERR),
//! checked and used so that the frontend cannot block the thread using
//! them.
//!
//! A frontend may send any descriptor in any mode. [`PeerEventFd::adopt`]
//! accepts only an eventfd (what QEMU, libvhost-user and rust-vmm's
//! frontend send; a pipe, socket or file is refused with
//! [`FdError::NotEventfd`]) and sets `O_NONBLOCK` on it. Then:
//!
//! - **Reading** (a kick): `preadv2(RWF_NOWAIT)`, which never sleeps
//!   whatever the file status flags say, so a frontend that clears
//!   `O_NONBLOCK` again on its copy (the flag belongs to the open file
//!   description both processes share) and drains the counter under us
//!   cannot block a worker. Kernels without `RWF_NOWAIT` for eventfds (before
//!   5.12) fall back to a plain read of the non-blocking descriptor.
//! - **Writing** (a call or an error notification): a write of 1 to the
//!   non-blocking descriptor. It can only fail with `EAGAIN` when the
//!   counter is within 1 of its maximum, that is when the frontend left a
//!   huge count unread: a notification is then pending already, and ours is
//!   merged into it ([`Signal::Coalesced`]; the frontend sees the used ring
//!   as of our write when it reads the counter). Nothing is retried and
//!   the queue goes on. Any other error is returned ([`Signal::Failed`])
//!   and the caller breaks the queue. Linux has no per-call non-blocking
//!   write for eventfds (`pwritev2(RWF_NOWAIT)` is `EOPNOTSUPP` on them),
//!   so a frontend that clears `O_NONBLOCK` on the shared description and
//!   saturates the counter can make the write block: the write runs under
//!   the stall guard ([`crate::runtime::stall`]), which interrupts it after a
//!   second, and the caller then breaks the queue ([`Signal::Stalled`]).
//!
//! The eventfd's kind is read from `/proc/self/fd`; where `/proc` is not
//! mounted the check falls back to `fstat` (an anonymous inode of mode
//! 0600 with no file type, which only eventfd, signalfd, timerfd and the
//! like are).
//!
//! None of this exists in rust-vmm (`vmm-sys-util`'s `EventFd` trusts its
//! descriptor), so it is written here.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use thiserror::Error;

use crate::runtime::stall;

/// What a descriptor is for, for error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FdRole {
    /// SET_VRING_KICK.
    Kick,
    /// SET_VRING_CALL.
    Call,
    /// SET_VRING_ERR.
    Err,
    /// SET_LOG_FD.
    Log,
}

impl std::fmt::Display for FdRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FdRole::Kick => "kick",
            FdRole::Call => "call",
            FdRole::Err => "error",
            FdRole::Log => "log",
        })
    }
}

/// A descriptor from the frontend that cannot be used.
#[derive(Debug, Error)]
pub enum FdError {
    /// Not an eventfd.
    #[error("the {role} descriptor is not an eventfd but {kind}")]
    NotEventfd {
        /// Its role.
        role: FdRole,
        /// What it is instead.
        kind: String,
    },
    /// Its kind or flags could not be read or set.
    #[error("cannot inspect or set up the {role} descriptor")]
    Setup {
        /// Its role.
        role: FdRole,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// The result of [`PeerEventFd::signal`].
#[derive(Debug)]
pub enum Signal {
    /// The counter was incremented.
    Sent,
    /// The counter is saturated: a notification is pending already and
    /// this one is merged into it.
    Coalesced,
    /// The write failed otherwise: the descriptor is unusable.
    Failed(io::Error),
    /// The write blocked (the frontend cleared `O_NONBLOCK` and filled the
    /// counter) and the stall guard interrupted it.
    Stalled,
}

/// A checked, non-blocking eventfd received from the frontend.
#[derive(Debug)]
pub struct PeerEventFd(OwnedFd);

impl PeerEventFd {
    /// Checks that `file` is an eventfd and makes it non-blocking.
    pub fn adopt(file: File, role: FdRole) -> Result<Self, FdError> {
        let fd = OwnedFd::from(file);
        let setup = |source| FdError::Setup { role, source };
        if let Some(kind) = not_an_eventfd(fd.as_fd()).map_err(setup)? {
            return Err(FdError::NotEventfd { role, kind });
        }
        set_nonblocking(fd.as_fd()).map_err(setup)?;
        Ok(PeerEventFd(fd))
    }

    /// A new non-blocking eventfd of this process (tests, fuzzing,
    /// in-process frontends).
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes no pointer.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor owned by nobody else.
        Ok(PeerEventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Another handle on the same eventfd.
    pub fn try_clone(&self) -> io::Result<Self> {
        self.0.try_clone().map(PeerEventFd)
    }

    /// Reads and resets the counter without ever sleeping; `None` when it
    /// was zero (or the read failed: the next kick or poll pass looks at
    /// the ring anyway).
    pub fn drain(&self) -> Option<u64> {
        let mut value = 0u64;
        let mut iov = libc::iovec {
            iov_base: (&raw mut value).cast(),
            iov_len: std::mem::size_of::<u64>(),
        };
        // SAFETY: one iovec over a u64 owned by this frame; the descriptor
        // is owned by `self`.
        let n = unsafe { libc::preadv2(self.0.as_raw_fd(), &raw mut iov, 1, -1, libc::RWF_NOWAIT) };
        if n == 8 {
            return Some(value);
        }
        if n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EOPNOTSUPP) {
            let mut buf = [0u8; 8];
            if let stall::Outcome::Done(Ok(8)) = stall::read(self.0.as_raw_fd(), &mut buf) {
                return Some(u64::from_ne_bytes(buf));
            }
        }
        None
    }

    /// Adds 1 to the counter, never blocking for long (see the module
    /// docs).
    pub fn signal(&self) -> Signal {
        match stall::write(self.0.as_raw_fd(), &1u64.to_ne_bytes()) {
            stall::Outcome::Done(Ok(_)) => Signal::Sent,
            stall::Outcome::Done(Err(e)) if e.raw_os_error() == Some(libc::EAGAIN) => {
                Signal::Coalesced
            }
            stall::Outcome::Done(Err(e)) => Signal::Failed(e),
            stall::Outcome::Stalled => Signal::Stalled,
        }
    }
}

impl AsRawFd for PeerEventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl AsFd for PeerEventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// `None` if `fd` is an eventfd, else what it is.
fn not_an_eventfd(fd: BorrowedFd<'_>) -> io::Result<Option<String>> {
    let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
    match std::fs::read_link(&link) {
        Ok(target) => {
            let target = target.to_string_lossy().into_owned();
            Ok((target != "anon_inode:[eventfd]").then_some(target))
        }
        // No /proc (a chroot or a sandbox without it): an anonymous inode
        // has no file type bits, which rules out pipes, sockets, files and
        // devices (the kinds that can block or hang up).
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let st = fstat(fd)?;
            let kind = st.st_mode & libc::S_IFMT;
            Ok((kind != 0).then(|| format!("a file of type {kind:#o}")))
        }
        Err(e) => Err(e),
    }
}

pub(crate) fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid out buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a valid out pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &raw mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: F_GETFL on a valid descriptor takes no pointer.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: F_SETFL with an int argument on a valid descriptor.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eventfd(flags: i32) -> File {
        // SAFETY: eventfd takes no pointer.
        let fd = unsafe { libc::eventfd(0, flags) };
        assert!(fd >= 0);
        // SAFETY: a new descriptor owned by nobody else.
        unsafe { File::from_raw_fd(fd) }
    }

    fn pipe() -> (File, File) {
        let mut fds = [0; 2];
        // SAFETY: a valid array of two ints.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: a new descriptor owned by nobody else.
        let r = unsafe { File::from_raw_fd(fds[0]) };
        // SAFETY: as above.
        let w = unsafe { File::from_raw_fd(fds[1]) };
        (r, w)
    }

    fn is_nonblocking(fd: &PeerEventFd) -> bool {
        // SAFETY: F_GETFL takes no pointer.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
        flags & libc::O_NONBLOCK != 0
    }

    #[test]
    fn a_blocking_eventfd_is_made_non_blocking() {
        let fd = PeerEventFd::adopt(eventfd(0), FdRole::Kick).unwrap();
        assert!(is_nonblocking(&fd));
        assert_eq!(fd.drain(), None, "an empty counter reads nothing, at once");
        assert!(matches!(fd.signal(), Signal::Sent));
        assert!(matches!(fd.signal(), Signal::Sent));
        assert_eq!(fd.drain(), Some(2));
    }

    #[test]
    fn pipes_and_files_are_refused() {
        let (r, _w) = pipe();
        let e = PeerEventFd::adopt(r, FdRole::Kick).unwrap_err();
        assert!(matches!(e, FdError::NotEventfd { .. }), "{e}");
        let f = File::open("/proc/self/stat").unwrap();
        assert!(PeerEventFd::adopt(f, FdRole::Call).is_err());
    }

    #[test]
    fn a_saturated_counter_coalesces_instead_of_blocking() {
        let file = eventfd(0);
        let theirs = file.try_clone().unwrap();
        let fd = PeerEventFd::adopt(file, FdRole::Call).unwrap();
        let max = 0xffff_ffff_ffff_fffe_u64;
        // SAFETY: writes 8 bytes from a local u64.
        let n = unsafe { libc::write(theirs.as_raw_fd(), (&raw const max).cast(), 8) };
        assert_eq!(n, 8);
        assert!(matches!(fd.signal(), Signal::Coalesced));
    }

    #[test]
    fn drain_never_blocks_even_if_the_peer_clears_o_nonblock() {
        let file = eventfd(0);
        let theirs = file.try_clone().unwrap();
        let fd = PeerEventFd::adopt(file, FdRole::Kick).unwrap();
        // The frontend clears O_NONBLOCK on the shared file description.
        // SAFETY: F_SETFL with an int argument.
        let rc = unsafe { libc::fcntl(theirs.as_raw_fd(), libc::F_SETFL, 0) };
        assert_eq!(rc, 0);
        assert!(!is_nonblocking(&fd));
        // On kernels with RWF_NOWAIT for eventfds (5.12 and later) this
        // returns at once; on older ones it would block, so only run the
        // read where the kernel can do it.
        let mut v = 0u64;
        let mut iov = libc::iovec {
            iov_base: (&raw mut v).cast(),
            iov_len: 8,
        };
        // SAFETY: one iovec over a local u64.
        let probe = unsafe { libc::preadv2(fd.as_raw_fd(), &raw mut iov, 1, -1, libc::RWF_NOWAIT) };
        if probe < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN) {
            assert_eq!(fd.drain(), None);
        }
    }
}
