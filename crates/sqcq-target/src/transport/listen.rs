//! Listening Unix sockets (a device's vhost-user socket, the admin
//! socket) that never destroy what they do not own.
//!
//! Binding replaces a file at the path only when it is a socket nobody
//! listens on any more (a daemon that was killed leaves one behind). A
//! regular file, a directory or any other non-socket is left alone and
//! reported; a socket some process still accepts on is reported as in use
//! instead of being taken over. On drop the socket file is removed only if
//! the path still names the socket this process created.
//!
//! Every socket the daemon creates gets its owner, group and mode
//! ([`SocketOwnership`]) between `bind` and `listen`: until `listen` a
//! connection is refused whatever the file's mode, so there is no moment
//! in which the socket accepts a connection with the mode or owner the
//! umask and the daemon's user gave it. A socket passed in by the service
//! manager ([`ListeningSocket::adopt`]) is used as it was made, and its
//! file is left in place when the daemon ends: it is the service
//! manager's.
//!
//! Whether a socket file found at the path may be probed with `connect` is
//! the caller's to say ([`StaleProbe`]): the daemon forbids it before its
//! seccomp filter, which refuses `connect`, is applied.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use thiserror::Error;
use tracing::{info, warn};

/// Connections the kernel queues for a socket before the daemon accepts
/// them (what std's `UnixListener::bind` uses).
const BACKLOG: i32 = 128;

/// Why a socket could not be bound or adopted.
#[derive(Debug, Error)]
pub enum ListenError {
    /// Something that is not a socket is at the path.
    #[error("{0} exists and is not a socket: not replacing it")]
    NotASocket(PathBuf),
    /// A socket is at the path and the seccomp filter forbids finding out
    /// whether a process listens on it.
    #[error("{0} exists and the sandbox forbids checking whether it is stale: remove it first")]
    Exists(PathBuf),
    /// Another process listens on the path.
    #[error("{0} is in use: another process is listening on it")]
    InUse(PathBuf),
    /// A system call failed.
    #[error("cannot bind {path}")]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The owner, group or mode could not be set.
    #[error("cannot set the {what} of {path} to {value}{hint}")]
    Ownership {
        /// The path.
        path: PathBuf,
        /// What was being set: `owner`, `group`, `owner and group`, `mode`.
        what: &'static str,
        /// The value, e.g. `107` or `0660`.
        value: String,
        /// What to do about EPERM.
        hint: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A socket passed in by the service manager cannot serve.
    #[error("the socket passed for {path} is not {wanted}")]
    NotListening {
        /// The path it was passed for.
        path: PathBuf,
        /// What it is not: a listening `AF_UNIX` stream socket.
        wanted: &'static str,
    },
}

/// Owner, group and mode of a socket file the daemon creates; `None`
/// leaves what `bind` gave (the daemon's user and group, `0777` less the
/// umask). Ids are resolved from names when the configuration is read
/// ([`crate::service::account`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SocketOwnership {
    /// Permission bits (at most `0o777`).
    pub mode: Option<u32>,
    /// Owner uid (changing it needs root, or `CAP_CHOWN`).
    pub uid: Option<u32>,
    /// Group gid (a daemon that is not root can only set one of its own
    /// groups).
    pub gid: Option<u32>,
}

impl SocketOwnership {
    /// Sets the owner and group, then the mode, of the socket file at
    /// `path`, which must be the socket `bind` just created (it is not
    /// listening yet). The file is opened `O_PATH | O_NOFOLLOW` and
    /// changed through that descriptor, so a symbolic link put at the path
    /// meanwhile is not followed.
    fn apply(&self, path: &Path) -> Result<(), ListenError> {
        if *self == SocketOwnership::default() {
            return Ok(());
        }
        let err = |what: &'static str, value: String, source: io::Error| {
            let hint = if source.raw_os_error() == Some(libc::EPERM) {
                ": only root can give a socket to another user, and a daemon \
                 that is not root can only set a group it is a member of"
            } else {
                ""
            };
            ListenError::Ownership {
                path: path.to_owned(),
                what,
                value,
                hint,
                source,
            }
        };
        let io_err = |source| ListenError::Io {
            path: path.to_owned(),
            source,
        };
        let cpath = CString::new(path.as_os_str().as_bytes())
            .map_err(|e| io_err(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
        // SAFETY: `cpath` is NUL-terminated; the descriptor returned is
        // owned below.
        let fd = unsafe {
            libc::open(
                cpath.as_ptr(),
                libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io_err(io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        if !file.metadata().map_err(io_err)?.file_type().is_socket() {
            return Err(ListenError::NotASocket(path.to_owned()));
        }
        if self.uid.is_some() || self.gid.is_some() {
            // -1 (as the unsigned id_t) leaves an id unchanged.
            let uid = self.uid.unwrap_or(u32::MAX);
            let gid = self.gid.unwrap_or(u32::MAX);
            // SAFETY: an empty NUL-terminated path with AT_EMPTY_PATH acts
            // on `fd` itself.
            let rc = unsafe { libc::fchownat(fd, c"".as_ptr(), uid, gid, libc::AT_EMPTY_PATH) };
            if rc != 0 {
                let (what, value) = match (self.uid, self.gid) {
                    (Some(u), Some(g)) => ("owner and group", format!("{u}:{g}")),
                    (Some(u), None) => ("owner", u.to_string()),
                    _ => ("group", gid.to_string()),
                };
                return Err(err(what, value, io::Error::last_os_error()));
            }
        }
        if let Some(mode) = self.mode {
            // chmod has no form that acts on an O_PATH descriptor before
            // Linux 6.6 (fchmodat2); its /proc link names the same inode.
            // `fchmodat` itself, the one call the seccomp filter allows
            // for this (`crate::sandbox`).
            let proc = CString::new(format!("/proc/self/fd/{fd}"))
                .map_err(|e| io_err(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
            // SAFETY: `proc` is NUL-terminated; no pointer is kept.
            let rc = unsafe { libc::fchmodat(libc::AT_FDCWD, proc.as_ptr(), mode, 0) };
            if rc != 0 {
                return Err(err(
                    "mode",
                    format!("{mode:04o}"),
                    io::Error::last_os_error(),
                ));
            }
        }
        Ok(())
    }
}

/// Whether [`ListeningSocket::bind`] may `connect` to a socket file it
/// finds at its path, to tell a stale one (replaced) from a live one (in
/// use). Under the daemon's seccomp filter, which refuses `connect`, it
/// may not, and such a file is refused unprobed ([`ListenError::Exists`]).
///
/// One value per daemon, cloned into every [`SocketSource`], all clones
/// seeing [`forbid`](Self::forbid): the filter comes after the configured
/// sockets are bound, and devices created later bind under it.
#[derive(Clone, Debug, Default)]
pub struct StaleProbe {
    forbidden: Arc<AtomicBool>,
}

impl StaleProbe {
    /// From now on no clone probes. Relaxed here and in
    /// [`allowed`](Self::allowed): the flag guards no data; it is set
    /// before the filter is applied and read by threads acting on
    /// management requests, which come over sockets long after, and a
    /// stale `true` would only try a call the filter then refuses.
    pub fn forbid(&self) {
        self.forbidden.store(true, Ordering::Relaxed);
    }

    /// Whether a socket file found at a path may be probed.
    pub fn allowed(&self) -> bool {
        !self.forbidden.load(Ordering::Relaxed)
    }
}

/// Where sockets come from: the one the service manager passed in for a
/// path (kept for as long as the daemon runs, each use a duplicate), else
/// a new one bound with the configured ownership.
#[derive(Debug, Default)]
pub struct SocketSource {
    ownership: SocketOwnership,
    passed: BTreeMap<PathBuf, OwnedFd>,
    probe: StaleProbe,
}

impl SocketSource {
    /// Binds with `ownership`, probing a socket file found at a path only
    /// while `probe` allows it, except the paths of `passed`.
    pub fn new(
        ownership: SocketOwnership,
        passed: BTreeMap<PathBuf, OwnedFd>,
        probe: StaleProbe,
    ) -> Self {
        SocketSource {
            ownership,
            passed,
            probe,
        }
    }

    /// The socket at `path`: the passed one, adopted, or a new one.
    pub fn listen(&self, path: &Path) -> Result<ListeningSocket, ListenError> {
        match self.passed.get(path) {
            Some(fd) => {
                let fd = fd.try_clone().map_err(|source| ListenError::Io {
                    path: path.to_owned(),
                    source,
                })?;
                ListeningSocket::adopt(fd, path)
            }
            None => ListeningSocket::bind(path, &self.ownership, &self.probe),
        }
    }
}

/// A bound, listening Unix socket; removes its file on drop, unless it
/// was passed in by the service manager.
#[derive(Debug)]
pub struct ListeningSocket {
    listener: UnixListener,
    path: PathBuf,
    /// Device and inode of the socket file, to recognise it on drop;
    /// `None` for an adopted socket, whose file is not ours to remove.
    file_id: Option<(u64, u64)>,
}

impl ListeningSocket {
    /// Binds `path`, replacing only a stale socket (none while `probe`
    /// forbids finding out), and gives it the owner, group and mode of
    /// `ownership` before it listens.
    pub fn bind(
        path: &Path,
        ownership: &SocketOwnership,
        probe: &StaleProbe,
    ) -> Result<Self, ListenError> {
        let io_err = |source| ListenError::Io {
            path: path.to_owned(),
            source,
        };
        match std::fs::symlink_metadata(path) {
            Ok(m) if !m.file_type().is_socket() => {
                return Err(ListenError::NotASocket(path.to_owned()));
            }
            // Under the seccomp filter, which forbids `connect`, an
            // existing socket cannot be told stale from live: refused.
            Ok(_) if !probe.allowed() => {
                return Err(ListenError::Exists(path.to_owned()));
            }
            Ok(_) => match UnixStream::connect(path) {
                Ok(_) => return Err(ListenError::InUse(path.to_owned())),
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    std::fs::remove_file(path).map_err(io_err)?;
                    info!("removed stale socket {}", path.display());
                }
                Err(e) => return Err(io_err(e)),
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(e)),
        }
        let socket = bind_only(path).map_err(|e| match e.kind() {
            // Another daemon bound it between our check and our bind.
            io::ErrorKind::AddrInUse => ListenError::InUse(path.to_owned()),
            _ => io_err(e),
        })?;
        let m = std::fs::symlink_metadata(path).map_err(io_err)?;
        // From here the file is ours: dropping `bound` removes it if a
        // later step fails.
        let bound = ListeningSocket {
            listener: UnixListener::from(socket),
            path: path.to_owned(),
            file_id: Some((m.dev(), m.ino())),
        };
        ownership.apply(path)?;
        // SAFETY: listen on a socket descriptor `bound` owns.
        if unsafe { libc::listen(bound.listener.as_raw_fd(), BACKLOG) } != 0 {
            return Err(io_err(io::Error::last_os_error()));
        }
        Ok(bound)
    }

    /// Takes a listening socket the service manager passed in for `path`
    /// (used only to name it): checks that it is a listening `AF_UNIX`
    /// stream socket and sets it close-on-exec. Its owner, group and mode
    /// stay as the service manager made them, and its file is not removed
    /// on drop.
    pub fn adopt(fd: OwnedFd, path: &Path) -> Result<Self, ListenError> {
        let io_err = |source| ListenError::Io {
            path: path.to_owned(),
            source,
        };
        let not = |wanted| ListenError::NotListening {
            path: path.to_owned(),
            wanted,
        };
        let raw = fd.as_raw_fd();
        match sockopt(raw, libc::SO_TYPE) {
            Ok(t) if t == libc::SOCK_STREAM => {}
            Ok(_) => return Err(not("a stream socket")),
            Err(e) if e.raw_os_error() == Some(libc::ENOTSOCK) => return Err(not("a socket")),
            Err(e) => return Err(io_err(e)),
        }
        if sockopt(raw, libc::SO_ACCEPTCONN).map_err(io_err)? != 1 {
            return Err(not("listening"));
        }
        let listener = UnixListener::from(fd);
        let bound = match listener.local_addr() {
            Ok(a) => a.as_pathname().map(Path::to_owned),
            // std's answer for another address family.
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
                return Err(not("an AF_UNIX socket"));
            }
            Err(e) => return Err(io_err(e)),
        };
        // SAFETY: F_GETFD on a descriptor `fd` owns.
        let flags = unsafe { libc::fcntl(raw, libc::F_GETFD) };
        // SAFETY: F_SETFD on the same descriptor.
        if flags < 0 || unsafe { libc::fcntl(raw, libc::F_SETFD, flags | libc::FD_CLOEXEC) } < 0 {
            return Err(io_err(io::Error::last_os_error()));
        }
        if bound.as_deref() != Some(path) {
            warn!(
                "the socket passed for {} is bound at {}",
                path.display(),
                bound
                    .as_deref()
                    .map_or("(no path)".into(), |b| b.display().to_string())
            );
        }
        Ok(ListeningSocket {
            listener,
            path: path.to_owned(),
            file_id: None,
        })
    }

    /// The listener.
    pub fn listener(&self) -> &UnixListener {
        &self.listener
    }

    /// The path the socket was bound or passed in for.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the service manager passed this socket in.
    pub fn adopted(&self) -> bool {
        self.file_id.is_none()
    }
}

/// A new `AF_UNIX` stream socket bound to `path`, not listening.
fn bind_only(path: &Path) -> io::Result<OwnedFd> {
    // SAFETY: an all-zero sockaddr_un is valid; the path is copied in
    // below within its bounds.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::sa_family_t::try_from(libc::AF_UNIX).unwrap_or_default();
    let bytes = path.as_os_str().as_bytes();
    // One byte stays for the terminating NUL.
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a socket path must be 1 to {} bytes without NUL",
                addr.sun_path.len() - 1
            ),
        ));
    }
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = libc::c_char::from_ne_bytes([*src]);
    }
    // SAFETY: socket() takes no pointer.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = std::mem::size_of::<libc::sockaddr_un>();
    // SAFETY: `addr` is an initialised sockaddr_un of `len` bytes.
    let rc = unsafe {
        libc::bind(
            fd,
            (&raw const addr).cast::<libc::sockaddr>(),
            libc::socklen_t::try_from(len).unwrap_or(libc::socklen_t::MAX),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(socket)
}

/// An integer `SOL_SOCKET` option of `fd`.
fn sockopt(fd: RawFd, option: i32) -> io::Result<i32> {
    let mut value: libc::c_int = 0;
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>()).unwrap_or(4);
    // SAFETY: `value` and `len` are valid out pointers of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            (&raw mut value).cast::<libc::c_void>(),
            &raw mut len,
        )
    };
    if rc == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}

impl Drop for ListeningSocket {
    fn drop(&mut self) {
        let Some(id) = self.file_id else {
            return;
        };
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|m| m.file_type().is_socket() && (m.dev(), m.ino()) == id);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sqcq-listen-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_regular_file_is_never_replaced() {
        let d = dir("file");
        let p = d.join("disk.img");
        std::fs::write(&p, b"precious").unwrap();
        let e = ListeningSocket::bind(&p, &SocketOwnership::default(), &StaleProbe::default())
            .unwrap_err();
        assert!(matches!(e, ListenError::NotASocket(_)), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), b"precious");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_live_socket_is_in_use_and_a_stale_one_is_replaced() {
        let d = dir("live");
        let p = d.join("s.sock");
        let first =
            ListeningSocket::bind(&p, &SocketOwnership::default(), &StaleProbe::default()).unwrap();
        let e = ListeningSocket::bind(&p, &SocketOwnership::default(), &StaleProbe::default())
            .unwrap_err();
        assert!(matches!(e, ListenError::InUse(_)), "{e}");
        drop(first);
        assert!(!p.exists(), "removed on drop");
        // A killed daemon leaves its socket file behind.
        let stale = UnixListener::bind(d.join("other.sock")).unwrap();
        drop(stale);
        let second = ListeningSocket::bind(
            &d.join("other.sock"),
            &SocketOwnership::default(),
            &StaleProbe::default(),
        )
        .unwrap();
        drop(second);
        assert!(!d.join("other.sock").exists(), "removed on drop");
        std::fs::remove_dir_all(d).unwrap();
    }

    /// Once the probe is forbidden (the daemon's seccomp filter refuses
    /// `connect`), a socket file at the path is refused without a
    /// `connect`, stale or not, and left in place; what comes through a
    /// [`SocketSource`] made with a clone is refused alike.
    #[test]
    fn a_forbidden_probe_refuses_a_socket_file_and_leaves_it() {
        let d = dir("forbidden");
        let p = d.join("stale.sock");
        drop(UnixListener::bind(&p).unwrap());
        let probe = StaleProbe::default();
        let source = SocketSource::new(SocketOwnership::default(), BTreeMap::new(), probe.clone());
        probe.forbid();
        let e = ListeningSocket::bind(&p, &SocketOwnership::default(), &probe).unwrap_err();
        assert!(matches!(e, ListenError::Exists(_)), "{e}");
        let e = source.listen(&p).unwrap_err();
        assert!(matches!(e, ListenError::Exists(_)), "{e}");
        assert!(
            std::fs::symlink_metadata(&p)
                .unwrap()
                .file_type()
                .is_socket(),
            "the socket file stays"
        );
        let fresh = d.join("fresh.sock");
        drop(source.listen(&fresh).unwrap());
        assert!(!fresh.exists(), "a free path is bound, removed on drop");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn drop_leaves_a_file_that_replaced_the_socket() {
        let d = dir("replaced");
        let p = d.join("s.sock");
        let s =
            ListeningSocket::bind(&p, &SocketOwnership::default(), &StaleProbe::default()).unwrap();
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, b"someone else's").unwrap();
        drop(s);
        assert_eq!(std::fs::read(&p).unwrap(), b"someone else's");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn owner_group_and_mode_are_set_before_it_listens() {
        let d = dir("owner");
        let p = d.join("s.sock");
        // SAFETY: getuid has no preconditions.
        let root = unsafe { libc::getuid() } == 0;
        // SAFETY: getegid has no preconditions.
        let egid = unsafe { libc::getegid() };
        // As root, ids that differ from what bind gives; otherwise the
        // daemon's own group (the only kind it may set).
        let (uid, gid) = if root {
            (Some(65534), 65534)
        } else {
            (None, egid)
        };
        let ownership = SocketOwnership {
            mode: Some(0o640),
            uid,
            gid: Some(gid),
        };
        let s = ListeningSocket::bind(&p, &ownership, &StaleProbe::default()).unwrap();
        let m = std::fs::symlink_metadata(&p).unwrap();
        assert!(m.file_type().is_socket());
        assert_eq!(m.mode() & 0o7777, 0o640);
        assert_eq!(m.gid(), gid);
        if let Some(u) = uid {
            assert_eq!(m.uid(), u);
        }
        assert_eq!(
            sockopt(s.listener().as_raw_fd(), libc::SO_ACCEPTCONN).unwrap(),
            1
        );
        UnixStream::connect(&p).unwrap();
        drop(s);
        assert!(!p.exists(), "removed on drop");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_refused_ownership_is_an_error_and_leaves_no_file() {
        // SAFETY: getuid has no preconditions.
        if unsafe { libc::getuid() } == 0 {
            // Root may give a socket to anyone.
            return;
        }
        let d = dir("refused");
        let p = d.join("s.sock");
        let e = ListeningSocket::bind(
            &p,
            &SocketOwnership {
                uid: Some(0),
                ..SocketOwnership::default()
            },
            &StaleProbe::default(),
        )
        .unwrap_err();
        assert!(matches!(e, ListenError::Ownership { .. }), "{e}");
        assert!(e.to_string().contains("only root"), "{e}");
        assert!(!p.exists(), "the half-made socket is removed");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn adopt_takes_only_a_listening_unix_stream_socket_and_leaves_its_file() {
        let d = dir("adopt");
        let p = d.join("passed.sock");
        let passed = UnixListener::bind(&p).unwrap();
        let s = ListeningSocket::adopt(passed.into(), &p).unwrap();
        assert!(s.adopted());
        // SAFETY: F_GETFD on a descriptor `s` owns.
        let flags = unsafe { libc::fcntl(s.listener().as_raw_fd(), libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        UnixStream::connect(&p).unwrap();
        drop(s);
        assert!(p.exists(), "the service manager's socket file stays");

        let refused = |fd: OwnedFd, wanted: &str| {
            let e = ListeningSocket::adopt(fd, &p).unwrap_err();
            assert!(
                matches!(e, ListenError::NotListening { wanted: w, .. } if w == wanted),
                "{e}"
            );
        };
        let dgram = std::os::unix::net::UnixDatagram::bind(d.join("dgram")).unwrap();
        refused(dgram.into(), "a stream socket");
        refused(bind_only(&d.join("unlistened")).unwrap(), "listening");
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        refused(tcp.into(), "an AF_UNIX socket");
        refused(std::fs::File::open("/dev/null").unwrap().into(), "a socket");
        std::fs::remove_dir_all(d).unwrap();
    }
}
