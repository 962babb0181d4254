//! The optional seccomp filter (`--seccomp errno|kill`): once every
//! configured socket listens and thread runs, the daemon limits itself to the
//! system calls it needs to serve devices, built with rust-vmm's
//! `seccompiler` (Firecracker's), applied to all threads at once (TSYNC).
//!
//! The allow-list was taken from `strace -f` of the daemon serving every
//! notification mode, RAM and file LUNs, FUA and flushes, LUN changes on
//! the admin socket, reconnects, a memory fault and SIGTERM (see
//! `docs/target.md`, "Sandbox"), then narrowed where arguments allow:
//! `ioctl` only with the requests the daemon issues, `mmap` and
//! `mprotect` never executable, `socket` for Unix sockets only (devices
//! created at run time; `fchownat` only on a descriptor, for their
//! sockets' owner and group), `clone` for threads only (workers and devices
//! created at run time; `clone3`, whose flags a filter cannot see, is
//! answered ENOSYS so that the C library uses `clone`). Everything else
//! (network sockets, `execve`, `ptrace`, `mount`, new processes, ...)
//! fails with `EPERM` (`errno`) or kills the daemon (`kill`, the
//! strictest, as Firecracker does).
//!
//! What this cannot filter: paths (`openat` is needed for LUN files added
//! at run time; run the daemon as an unprivileged user, see the docs) and
//! `io_uring` operations, which the kernel performs outside seccomp's view
//! (the daemon only queues reads, writes, fsyncs and nothing else).

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use serde::Deserialize;
use thiserror::Error;

use crate::transport::listen::StaleProbe;

/// What the filter does with a system call it does not allow.
#[derive(
    Clone, Copy, Debug, Default, Deserialize, serde::Serialize, PartialEq, Eq, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum SeccompMode {
    /// No filter.
    #[default]
    Off,
    /// The call fails with EPERM.
    Errno,
    /// The daemon is killed (SIGSYS).
    Kill,
}

impl std::fmt::Display for SeccompMode {
    /// As `--seccomp` takes it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SeccompMode::Off => "off",
            SeccompMode::Errno => "errno",
            SeccompMode::Kill => "kill",
        })
    }
}

/// The filter could not be built or applied.
#[derive(Debug, Error)]
pub enum SandboxError {
    /// seccompiler refused the rules.
    #[error("cannot build the seccomp filter")]
    Build(#[source] seccompiler::BackendError),
    /// The kernel refused the filter.
    #[error("cannot apply the seccomp filter")]
    Apply(#[source] seccompiler::Error),
    /// Not an architecture the filter is written for.
    #[error("seccomp filtering is not supported on this architecture")]
    Arch,
}

/// System calls allowed with any arguments.
const ALLOWED: &[libc::c_long] = &[
    // Memory (mmap and mprotect: below, never executable).
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_brk,
    // Threads, time, signals.
    libc::SYS_futex,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_setaffinity,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_gettimeofday,
    libc::SYS_getpid,
    libc::SYS_gettid,
    libc::SYS_tgkill,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_sigaltstack,
    libc::SYS_restart_syscall,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_getrandom,
    libc::SYS_rseq,
    libc::SYS_set_robust_list,
    // Descriptors and files (LUN files, statistics, socket files).
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_preadv2,
    libc::SYS_lseek,
    libc::SYS_close,
    libc::SYS_openat,
    libc::SYS_fcntl,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_fstatfs,
    libc::SYS_readlink,
    libc::SYS_readlinkat,
    // The entries of /proc/self/fd (`process_open_fds` at a scrape).
    libc::SYS_getdents64,
    libc::SYS_ftruncate,
    libc::SYS_fallocate,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_rename,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_unlink,
    libc::SYS_unlinkat,
    // Event loops and eventfds.
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_create1,
    libc::SYS_eventfd2,
    libc::SYS_poll,
    libc::SYS_ppoll,
    // io_uring (backstore queues are opened when a queue starts).
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    // Listening sockets: accept, talk, close. Devices created at run time
    // (the management API) bind new ones: `socket` is allowed for
    // AF_UNIX only (below), so `bind` and `listen` act on Unix sockets.
    // Not `connect`: it would reach any Unix socket the daemon's user may
    // (under the filter, a socket path that exists is not probed for
    // staleness, see `transport::listen`).
    libc::SYS_bind,
    libc::SYS_listen,
    // The mode of such a socket (`--socket-mode`): `transport::listen`
    // changes it through the /proc link of an O_PATH descriptor of the
    // socket file (its owner and group: `fchownat`, below). Like
    // `openat`, the path cannot be filtered; files only the daemon's user
    // may change.
    libc::SYS_fchmodat,
    libc::SYS_getsockname,
    // Workers and device control threads created at run time: clone3 is
    // answered ENOSYS by a second filter (its flags are in memory, out of
    // a filter's reach), so the C library falls back to `clone`, allowed
    // for threads only (below).
    libc::SYS_clone3,
    libc::SYS_accept4,
    libc::SYS_recvmsg,
    libc::SYS_recvfrom,
    libc::SYS_sendmsg,
    libc::SYS_sendto,
    libc::SYS_shutdown,
    libc::SYS_setsockopt,
    libc::SYS_getsockopt,
];

/// `ioctl` requests the daemon issues: socket queue lengths, terminal
/// detection of the logger, block device size and discards, the metrics
/// endpoint's connections made non-blocking.
const IOCTLS: &[libc::Ioctl] = &[
    libc::FIONREAD,
    libc::FIONBIO,
    libc::TIOCOUTQ,
    libc::TCGETS,
    0x1268,      // BLKSSZGET
    0x8008_1272, // BLKGETSIZE64
    0x1277,      // BLKDISCARD
    0x127f,      // BLKZEROOUT
];

fn rule(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompRule, SandboxError> {
    let c = SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, value)
        .map_err(SandboxError::Build)?;
    SeccompRule::new(vec![c]).map_err(SandboxError::Build)
}

/// The daemon's filter, compiled; `None` for [`SeccompMode::Off`].
pub fn filter(mode: SeccompMode) -> Result<Option<BpfProgram>, SandboxError> {
    let mismatch = match mode {
        SeccompMode::Off => return Ok(None),
        SeccompMode::Errno => SeccompAction::Errno(u32::try_from(libc::EPERM).unwrap_or(1)),
        SeccompMode::Kill => SeccompAction::KillProcess,
    };
    let arch = match std::env::consts::ARCH {
        "x86_64" => TargetArch::x86_64,
        "aarch64" => TargetArch::aarch64,
        _ => return Err(SandboxError::Arch),
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        ALLOWED.iter().map(|&nr| (nr, Vec::new())).collect();
    let ioctls = IOCTLS
        .iter()
        .map(|&req| rule(1, SeccompCmpOp::Eq, req))
        .collect::<Result<_, _>>()?;
    rules.insert(libc::SYS_ioctl, ioctls);
    // Never executable memory: PROT_EXEC clear in the protection argument.
    let no_exec = |arg| rule(arg, SeccompCmpOp::MaskedEq(libc::PROT_EXEC as u64), 0);
    rules.insert(libc::SYS_mmap, vec![no_exec(2)?]);
    // Threads started after the filter name themselves; a worker's poll
    // loop tightens its timer slack before its first sleep
    // (`sqcq_protocol::yielder`).
    let set_name = u64::try_from(libc::PR_SET_NAME).unwrap_or(u64::MAX);
    let set_slack = u64::try_from(libc::PR_SET_TIMERSLACK).unwrap_or(u64::MAX);
    rules.insert(
        libc::SYS_prctl,
        vec![
            rule(0, SeccompCmpOp::Eq, set_name)?,
            rule(0, SeccompCmpOp::Eq, set_slack)?,
        ],
    );
    rules.insert(libc::SYS_mprotect, vec![no_exec(2)?]);
    // Unix sockets only.
    let unix = u64::try_from(libc::AF_UNIX).unwrap_or(u64::MAX);
    rules.insert(libc::SYS_socket, vec![rule(0, SeccompCmpOp::Eq, unix)?]);
    // The owner and group of a new socket (`--socket-owner`,
    // `--socket-group`): `fchownat` in the one form `transport::listen`
    // uses, on a descriptor (AT_EMPTY_PATH).
    let empty_path = u64::try_from(libc::AT_EMPTY_PATH).unwrap_or(u64::MAX);
    rules.insert(
        libc::SYS_fchownat,
        vec![rule(4, SeccompCmpOp::Eq, empty_path)?],
    );
    // Threads, never processes: CLONE_THREAD, CLONE_VM and CLONE_SIGHAND
    // set in the flags.
    let thread = u64::try_from(libc::CLONE_THREAD | libc::CLONE_VM | libc::CLONE_SIGHAND)
        .unwrap_or(u64::MAX);
    rules.insert(
        libc::SYS_clone,
        vec![rule(0, SeccompCmpOp::MaskedEq(thread), thread)?],
    );
    let filter = SeccompFilter::new(rules, mismatch, SeccompAction::Allow, arch)
        .map_err(SandboxError::Build)?;
    BpfProgram::try_from(filter)
        .map(Some)
        .map_err(SandboxError::Build)
}

/// The filter that answers `clone3` with ENOSYS (everything else: allowed
/// here, decided by [`filter`]'s), so that new threads are made with
/// `clone`, whose flags a filter can check. The kernel applies the most
/// restrictive answer of all filters: ENOSYS wins over the main filter's
/// allow.
pub fn clone3_filter() -> Result<BpfProgram, SandboxError> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => TargetArch::x86_64,
        "aarch64" => TargetArch::aarch64,
        _ => return Err(SandboxError::Arch),
    };
    let enosys = SeccompAction::Errno(u32::try_from(libc::ENOSYS).unwrap_or(38));
    let rules = BTreeMap::from([(libc::SYS_clone3, Vec::new())]);
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, enosys, arch)
        .map_err(SandboxError::Build)?;
    BpfProgram::try_from(filter).map_err(SandboxError::Build)
}

/// Applies the filters of `mode` to every thread of the process, after
/// forbidding `stale` (socket files found when binding are no longer
/// probed with `connect`, which the filter refuses).
pub fn apply(mode: SeccompMode, stale: &StaleProbe) -> Result<(), SandboxError> {
    match filter(mode)? {
        Some(program) => {
            let clone3 = clone3_filter()?;
            // The poll clock reads /sys once to choose its counter: done
            // here if nothing read it yet, before `openat` is forbidden.
            let _ = sqcq_protocol::clock::source();
            // Before the filter: from its first instant, nothing may try
            // what it forbids.
            stale.forbid();
            seccompiler::apply_filter_all_threads(&clone3).map_err(SandboxError::Apply)?;
            seccompiler::apply_filter_all_threads(&program).map_err(SandboxError::Apply)
        }
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` on a new thread with the daemon's filter (EPERM mode)
    /// applied to that thread only.
    fn filtered<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(move || {
            seccompiler::apply_filter(&clone3_filter().unwrap()).unwrap();
            let program = filter(SeccompMode::Errno).unwrap().unwrap();
            seccompiler::apply_filter(&program).unwrap();
            f()
        })
        .join()
        .unwrap()
    }

    fn errno() -> i32 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    #[test]
    fn forbidden_calls_fail_with_eperm_and_allowed_ones_work() {
        let (socket, exec, exec_mem, eventfd, ioctl) = filtered(|| {
            // SAFETY: plain system calls with valid (or null) arguments.
            let socket = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
            let socket = (socket, errno());
            // SAFETY: as above; execve fails before looking at them.
            let exec =
                unsafe { libc::execve(c"/bin/true".as_ptr(), std::ptr::null(), std::ptr::null()) };
            let exec = (exec, errno());
            // SAFETY: an anonymous mapping at an address of the kernel's
            // choosing; unmapped if it ever succeeds.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    4096,
                    libc::PROT_READ | libc::PROT_EXEC,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            let exec_mem = (p == libc::MAP_FAILED, errno());
            // SAFETY: eventfd takes no pointer.
            let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
            let c: libc::c_char = 0;
            // SAFETY: TIOCSTI reads one char through a valid pointer (and
            // fails on an eventfd anyway).
            let ioctl = unsafe { libc::ioctl(fd, libc::TIOCSTI, &raw const c) };
            let ioctl = (ioctl, errno());
            // SAFETY: closes the descriptor opened above.
            unsafe { libc::close(fd) };
            (socket, exec, exec_mem, fd, ioctl)
        });
        assert_eq!(socket, (-1, libc::EPERM), "socket()");
        assert_eq!(exec, (-1, libc::EPERM), "execve()");
        assert_eq!(exec_mem, (true, libc::EPERM), "executable mmap");
        assert!(eventfd >= 0, "eventfd2 is allowed");
        assert_eq!(ioctl, (-1, libc::EPERM), "an ioctl the daemon never issues");
    }

    /// A worker's poll loop tightens its timer slack before its first
    /// sleep (`sqcq_protocol::yielder`); other `prctl`s stay refused.
    #[test]
    fn prctl_names_a_thread_and_sets_its_timer_slack_and_nothing_else() {
        let (slack, got, dumpable) = filtered(|| {
            // SAFETY: PR_SET_TIMERSLACK and PR_SET_DUMPABLE take values.
            let slack = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000u64, 0, 0, 0) };
            // SAFETY: PR_GET_TIMERSLACK takes no argument.
            let got = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
            let got = (got, errno());
            // SAFETY: as above.
            let dumpable = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1u64, 0, 0, 0) };
            (slack, got, (dumpable, errno()))
        });
        assert_eq!(slack, 0, "PR_SET_TIMERSLACK is allowed");
        assert_eq!(got, (-1, libc::EPERM), "PR_GET_TIMERSLACK is not");
        assert_eq!(dumpable, (-1, libc::EPERM), "PR_SET_DUMPABLE is not");
    }

    /// The metrics endpoint, started before the filter as the daemon does,
    /// serves a scrape on a thread the filter applies to.
    #[test]
    fn the_metrics_endpoint_serves_under_the_filter() {
        use crate::prometheus::{MetricsListen, server};
        use std::io::{Read, Write};
        use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

        let listen = MetricsListen::Tcp("127.0.0.1:0".parse().unwrap());
        let (listener, endpoint) = server::Listener::bind(&listen, &StaleProbe::default()).unwrap();
        let MetricsListen::Tcp(addr) = endpoint else {
            unreachable!()
        };
        let stop = EventFd::new(EFD_NONBLOCK).unwrap();
        let thread_stop = stop.try_clone().unwrap();
        let thread = std::thread::spawn(move || {
            let program = filter(SeccompMode::Errno).unwrap().unwrap();
            seccompiler::apply_filter(&program).unwrap();
            server::serve(&listener, &thread_stop, &|out: &mut String| {
                out.push_str("up 1\n");
            });
        });
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.ends_with("\r\n\r\nup 1\n"), "{answer}");
        stop.write(1).unwrap();
        thread.join().unwrap();
    }

    #[test]
    fn threads_and_unix_sockets_but_no_processes_or_inet_sockets() {
        let (thread, unix, inet, fork) = filtered(|| {
            let thread = std::thread::spawn(|| 7).join().ok();
            // SAFETY: plain system calls; descriptors closed below.
            let unix = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
            // SAFETY: as above.
            let inet = unsafe { libc::socket(libc::AF_INET6, libc::SOCK_STREAM, 0) };
            let inet = (inet, errno());
            // A process: clone without CLONE_THREAD (what fork does).
            // SAFETY: the raw system call fails under the filter; if it
            // ever succeeded the child exits at once.
            let pid = unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0) };
            if pid == 0 {
                // SAFETY: the child ends without running anything.
                unsafe { libc::_exit(0) };
            }
            let fork = (pid, errno());
            if unix >= 0 {
                // SAFETY: closes the socket opened above.
                unsafe { libc::close(unix) };
            }
            (thread, unix, inet, fork)
        });
        assert_eq!(thread, Some(7), "a thread can be started");
        assert!(unix >= 0, "AF_UNIX sockets are allowed");
        assert_eq!(inet, (-1, libc::EPERM), "AF_INET6 sockets are not");
        assert_eq!(fork, (-1, libc::EPERM), "no process");
    }

    #[test]
    fn off_builds_no_filter() {
        assert!(filter(SeccompMode::Off).unwrap().is_none());
        assert!(filter(SeccompMode::Kill).unwrap().is_some());
    }

    /// What `sqcqd` does under the filter as a service: `STOPPING=1` and
    /// `RELOADING=1` (with the time) through the socket made before it,
    /// the pidfile's removal, and a socket with a mode and group (a device
    /// created at run time: `fchownat` and `fchmodat` above).
    #[test]
    fn notifications_the_pidfile_and_socket_ownership_work_under_the_filter() {
        use crate::service::notify::{Notifier, NotifyState};
        use crate::service::pidfile::Pidfile;
        use crate::transport::listen::{ListeningSocket, SocketOwnership};
        use std::os::unix::fs::MetadataExt;
        let dir = std::env::temp_dir().join(format!("sqcq-sandbox-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let address = dir.join("notify");
        let rx = std::os::unix::net::UnixDatagram::bind(&address).unwrap();
        let notifier = Notifier::to(address.as_os_str()).unwrap();
        let pidfile = Pidfile::create(&dir.join("sqcqd.pid")).unwrap();
        let socket = dir.join("dev.sock");
        // SAFETY: getegid has no preconditions.
        let gid = unsafe { libc::getegid() };
        let ownership = SocketOwnership {
            mode: Some(0o660),
            uid: None,
            gid: Some(gid),
        };
        let path = socket.clone();
        let (sent, bound) = filtered(move || {
            let mut states = vec![NotifyState::Stopping, NotifyState::Reloading];
            states.extend(NotifyState::monotonic_usec_now().ok());
            let sent = notifier.notify(&states).map_err(|e| e.to_string());
            drop(pidfile);
            let bound = ListeningSocket::bind(&path, &ownership, &StaleProbe::default())
                .map(|_socket| {
                    let m = std::fs::symlink_metadata(&path).unwrap();
                    (m.mode() & 0o7777, m.gid())
                })
                .map_err(|e| crate::runtime::error_chain(&e));
            (sent, bound)
        });
        sent.unwrap();
        let mut buf = [0u8; 128];
        rx.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let n = rx.recv(&mut buf).unwrap();
        let msg = String::from_utf8_lossy(&buf[..n]);
        assert!(
            msg.starts_with("STOPPING=1\nRELOADING=1\nMONOTONIC_USEC="),
            "{msg}"
        );
        assert!(!dir.join("sqcqd.pid").exists(), "pidfile removed");
        assert_eq!(bound.unwrap(), (0o660, gid));
        assert!(!socket.exists(), "removed when dropped");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
