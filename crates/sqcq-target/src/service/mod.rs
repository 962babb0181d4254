//! Running under a service manager: readiness and status notifications
//! ([`notify`], sd_notify(3)), listening sockets passed in by the service
//! manager ([`activation`], sd_listen_fds(3)), the pidfile ([`pidfile`])
//! and user and group names ([`account`], for socket ownership).
//!
//! These are building blocks: `sqcqd`'s `main` takes the service
//! manager's environment ([`ServiceEnv::take`]) before any thread starts,
//! hands the passed sockets to [`Daemon::start_with`](crate::Daemon::start_with),
//! and notifies readiness once every socket listens and the seccomp filter
//! is applied. `docs/operations.md` describes the behaviour.

pub mod account;
pub mod activation;
pub mod log;
pub mod notify;
pub mod pidfile;
pub(crate) mod pollset;

use activation::{ActivationError, PassedSockets};
use notify::{Notifier, NotifyError};

/// What the service manager handed over in the environment.
#[derive(Debug)]
pub struct ServiceEnv {
    /// Where readiness and status go (a no-op without `NOTIFY_SOCKET`).
    pub notifier: Result<Notifier, NotifyError>,
    /// The listening sockets passed in (none without `LISTEN_FDS`).
    pub sockets: Result<PassedSockets, ActivationError>,
}

impl ServiceEnv {
    /// Reads `NOTIFY_SOCKET` and `LISTEN_PID`/`LISTEN_FDS`/`LISTEN_FDNAMES`,
    /// opens the notification socket (later notifications need no new
    /// socket, which the seccomp filter forbids) and takes ownership of the
    /// passed descriptors; then removes the variables from the environment
    /// so that no child process inherits them.
    ///
    /// # Safety
    ///
    /// Changes the environment: no other thread may run (or read the
    /// environment) at the same time, as for [`std::env::remove_var`].
    pub unsafe fn take() -> Self {
        let notifier = Notifier::from_env();
        // SAFETY: the caller guarantees that no other thread runs.
        let sockets = unsafe { PassedSockets::from_env() };
        // SAFETY: as above.
        unsafe { std::env::remove_var(notify::NOTIFY_SOCKET) };
        ServiceEnv { notifier, sockets }
    }
}
