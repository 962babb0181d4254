//! The descriptor set of the control-plane servers (the admin socket and
//! the metrics endpoint): one thread, one `poll(2)` over a stop eventfd,
//! a listener and the connections, each connection with a deadline.

use std::io;
use std::os::fd::RawFd;
use std::time::Instant;

/// The descriptors of one round of `poll`, filled afresh each round.
#[derive(Debug)]
pub(crate) struct PollSet {
    fds: Vec<libc::pollfd>,
}

impl PollSet {
    /// A set for `n` descriptors without reallocating.
    pub(crate) fn with_capacity(n: usize) -> Self {
        PollSet {
            fds: Vec::with_capacity(n),
        }
    }

    /// Empties the set for the next round.
    pub(crate) fn clear(&mut self) {
        self.fds.clear();
    }

    /// Adds `fd`, waited for `events` (`POLLIN`, `POLLOUT`).
    pub(crate) fn push(&mut self, fd: RawFd, events: libc::c_short) {
        self.fds.push(libc::pollfd {
            fd,
            events,
            revents: 0,
        });
    }

    /// What the last [`Self::wait`] found on the `i`-th descriptor pushed.
    pub(crate) fn revents(&self, i: usize) -> libc::c_short {
        self.fds.get(i).map_or(0, |p| p.revents)
    }

    /// Waits until a descriptor is ready or `deadline` passes (`None`:
    /// no limit). `Ok(false)` when a signal interrupted the wait: the
    /// caller looks again.
    pub(crate) fn wait(&mut self, deadline: Option<Instant>) -> io::Result<bool> {
        let timeout = deadline.map_or(-1, |d| {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return 0;
            }
            // Rounded up, so that the deadline has passed on return.
            i32::try_from(left.as_millis().saturating_add(1)).unwrap_or(i32::MAX)
        });
        let nfds = libc::nfds_t::try_from(self.fds.len()).unwrap_or(0);
        // SAFETY: `fds` holds `nfds` valid pollfds for the duration of
        // the call.
        let n = unsafe { libc::poll(self.fds.as_mut_ptr(), nfds, timeout) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(false);
            }
            return Err(e);
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use vmm_sys_util::eventfd::EventFd;

    #[test]
    fn a_ready_descriptor_is_reported_and_a_deadline_ends_the_wait() {
        let ready = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let idle = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        ready.write(1).unwrap();
        let mut set = PollSet::with_capacity(2);
        set.push(std::os::fd::AsRawFd::as_raw_fd(&idle), libc::POLLIN);
        set.push(std::os::fd::AsRawFd::as_raw_fd(&ready), libc::POLLIN);
        assert!(set.wait(None).unwrap());
        assert_eq!(set.revents(0), 0);
        assert_eq!(set.revents(1), libc::POLLIN);
        set.clear();
        set.push(std::os::fd::AsRawFd::as_raw_fd(&idle), libc::POLLIN);
        let deadline = Instant::now() + Duration::from_millis(5);
        assert!(set.wait(Some(deadline)).unwrap());
        assert_eq!(set.revents(0), 0, "nothing became ready");
        assert!(
            Instant::now() >= deadline,
            "the wait lasted until the deadline"
        );
    }
}
