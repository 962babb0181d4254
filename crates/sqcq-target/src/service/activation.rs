//! Socket activation: listening sockets the service manager made and
//! passed in (sd_listen_fds(3): descriptors from 3 on, `LISTEN_PID`,
//! `LISTEN_FDS`, `LISTEN_FDNAMES`).
//!
//! The rule: a passed socket's name (the socket unit's
//! `FileDescriptorName=`, `systemd-socket-activate --fdname=`) is the
//! socket path of the device it serves (or of the admin socket), in full
//! (`/run/sqcq/disk0.sock`) or its file name (`disk0.sock`). A file name
//! two of the daemon's sockets share must be given in full. A socket
//! whose name is none of these (systemd names every socket of a unit
//! without `FileDescriptorName=` after the unit, `sqcqd.socket`) goes to
//! the socket path it is bound to, so one socket unit with a
//! `ListenStream=` per device needs no names. A passed socket that
//! matches nothing this way, or a socket path two passed sockets match,
//! is an error: the daemon does not start (a socket the service manager
//! listens on and nobody serves would leave its frontends waiting).
//! Whether a socket is fit to serve (listening, `AF_UNIX`,
//! `SOCK_STREAM`) is checked where it is adopted
//! (`transport::listen`).

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// Why the passed sockets cannot be used.
#[derive(Debug, Error)]
pub enum ActivationError {
    /// `LISTEN_FDS` or `LISTEN_FDNAMES` is malformed, or a descriptor is
    /// not open.
    #[error("invalid socket activation environment (LISTEN_FDS, LISTEN_FDNAMES)")]
    Environment(#[source] io::Error),
    /// A passed socket names none of the daemon's sockets, and is not
    /// bound to one of their paths.
    #[error(
        "passed socket {name:?} (bound to {}) matches no socket path of the \
         configuration: its FileDescriptorName= must be a socket path or its file name, \
         or it must listen on a socket path", bound.as_deref().map_or("no path".into(), |p| p.display().to_string())
    )]
    Unmatched {
        /// The passed socket's name.
        name: String,
        /// The path it is bound to, if any.
        bound: Option<PathBuf>,
    },
    /// A passed socket's name is the file name of several sockets.
    #[error("passed socket {name:?} matches {} socket paths; name it by its full path", paths.len())]
    Ambiguous {
        /// The passed socket's name.
        name: String,
        /// The socket paths it matches.
        paths: Vec<PathBuf>,
    },
    /// Two passed sockets are for the same socket path.
    #[error("two passed sockets for {0}")]
    Twice(PathBuf),
}

/// Listening sockets passed in by the service manager, with their names.
#[derive(Debug, Default)]
pub struct PassedSockets {
    sockets: Vec<(String, OwnedFd)>,
}

impl PassedSockets {
    /// No socket.
    pub fn none() -> Self {
        Self::default()
    }

    /// The sockets `fds` holds, each with its name.
    pub fn from_fds(fds: Vec<(String, OwnedFd)>) -> Self {
        PassedSockets { sockets: fds }
    }

    /// Takes the descriptors the service manager passed to this process
    /// (none if `LISTEN_PID` is another process) and removes `LISTEN_PID`,
    /// `LISTEN_FDS` and `LISTEN_FDNAMES` from the environment. Each
    /// descriptor is set close-on-exec.
    ///
    /// # Safety
    ///
    /// Changes the environment: no other thread may run at the same time.
    /// Nothing else in the process may own descriptors `3..3+LISTEN_FDS`.
    pub unsafe fn from_env() -> Result<Self, ActivationError> {
        // SAFETY: the caller guarantees that no other thread runs.
        let passed = unsafe { sd_notify::listen_fds_with_names_and_unset_env() }
            .map_err(ActivationError::Environment)?;
        let sockets = passed
            .map(|(fd, name)| {
                // SAFETY: `listen_fds` checked that the descriptor is open
                // (F_GETFD) when it set FD_CLOEXEC; the service manager
                // passed it to this process, which the caller guarantees
                // owns it nowhere else.
                (name, unsafe { OwnedFd::from_raw_fd(fd) })
            })
            .collect();
        Ok(PassedSockets { sockets })
    }

    /// Whether no socket was passed.
    pub fn is_empty(&self) -> bool {
        self.sockets.is_empty()
    }

    /// How many sockets were passed.
    pub fn len(&self) -> usize {
        self.sockets.len()
    }

    /// Hands each passed socket to the one of `paths` (every socket the
    /// daemon listens on) it names, or else is bound to: element `i` of
    /// the result is the socket passed for `paths[i]`, if any.
    pub fn assign(self, paths: &[&Path]) -> Result<Vec<Option<OwnedFd>>, ActivationError> {
        let mut out: Vec<Option<OwnedFd>> = paths.iter().map(|_| None).collect();
        for (name, fd) in self.sockets {
            let (bound, fd) = bound_path(fd);
            let i = matching(&name, bound, paths)?;
            if out[i].replace(fd).is_some() {
                return Err(ActivationError::Twice(paths[i].to_owned()));
            }
        }
        Ok(out)
    }
}

/// The path a socket is bound to (`getsockname`), if it is an `AF_UNIX`
/// socket bound to one.
fn bound_path(fd: OwnedFd) -> (Option<PathBuf>, OwnedFd) {
    // Only to ask for its address: std reads it for any socket, and
    // refuses one that is not AF_UNIX.
    let socket = UnixListener::from(fd);
    let bound = socket
        .local_addr()
        .ok()
        .and_then(|a| a.as_pathname().map(Path::to_owned));
    (bound, socket.into())
}

/// The index of the path `name` names (in full, else by file name), else
/// of the path the socket is `bound` to.
fn matching(name: &str, bound: Option<PathBuf>, paths: &[&Path]) -> Result<usize, ActivationError> {
    let by = |same: &dyn Fn(&Path) -> bool| -> Vec<usize> {
        (0..paths.len()).filter(|&i| same(paths[i])).collect()
    };
    let mut found = by(&|p| p.as_os_str() == name);
    if found.is_empty() {
        found = by(&|p| p.file_name().is_some_and(|f| f == name));
    }
    if found.is_empty()
        && let Some(b) = &bound
    {
        found = by(&|p| p == b);
    }
    match found[..] {
        [i] => Ok(i),
        [] => Err(ActivationError::Unmatched {
            name: name.to_owned(),
            bound,
        }),
        _ => Err(ActivationError::Ambiguous {
            name: name.to_owned(),
            paths: found.iter().map(|&i| paths[i].to_owned()).collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fd() -> OwnedFd {
        std::fs::File::open("/dev/null").unwrap().into()
    }

    fn passed(names: &[&str]) -> PassedSockets {
        PassedSockets::from_fds(names.iter().map(|n| ((*n).to_owned(), fd())).collect())
    }

    #[test]
    fn a_socket_no_name_matches_goes_to_the_path_it_is_bound_to() {
        let dir = std::env::temp_dir().join(format!("sqcq-activation-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a.sock"), dir.join("b.sock"));
        let listen = |p: &Path| OwnedFd::from(UnixListener::bind(p).unwrap());
        // What systemd passes for a unit with two ListenStream= and no
        // FileDescriptorName=.
        let sockets = PassedSockets::from_fds(vec![
            ("sqcqd.socket".into(), listen(&b)),
            ("sqcqd.socket".into(), listen(&a)),
        ]);
        let got = sockets.assign(&[&a, &b]).unwrap();
        assert!(got.iter().all(Option::is_some));
        // A name that matches wins over the bound path.
        let sockets = PassedSockets::from_fds(vec![("a.sock".into(), listen(&dir.join("c.sock")))]);
        assert!(sockets.assign(&[&a, &b]).unwrap()[0].is_some());
        let sockets = PassedSockets::from_fds(vec![("x".into(), listen(&dir.join("d.sock")))]);
        let e = sockets.assign(&[&a, &b]).unwrap_err();
        assert!(e.to_string().contains("d.sock"), "{e}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn names_match_a_path_or_its_file_name() {
        let paths = [
            Path::new("/run/sqcq/disk0.sock"),
            Path::new("/run/sqcq/disk1.sock"),
            Path::new("/run/sqcq/sqcqd.admin"),
        ];
        let got = passed(&["disk1.sock", "/run/sqcq/disk0.sock"])
            .assign(&paths)
            .unwrap();
        assert_eq!(
            got.iter().map(Option::is_some).collect::<Vec<_>>(),
            [true, true, false]
        );
        let got = passed(&["sqcqd.admin"]).assign(&paths).unwrap();
        assert!(got[2].is_some());
        assert!(
            passed(&[])
                .assign(&paths)
                .unwrap()
                .iter()
                .all(Option::is_none)
        );
    }

    #[test]
    fn unmatched_ambiguous_and_twice_are_errors() {
        let paths = [Path::new("/a/disk.sock"), Path::new("/b/disk.sock")];
        let e = passed(&["other.sock"]).assign(&paths).unwrap_err();
        assert!(
            matches!(e, ActivationError::Unmatched { ref name, bound: None } if name == "other.sock"),
            "{e}"
        );
        let e = passed(&["disk.sock"]).assign(&paths).unwrap_err();
        assert!(matches!(e, ActivationError::Ambiguous { .. }), "{e}");
        // The full path settles it.
        let got = passed(&["/b/disk.sock"]).assign(&paths).unwrap();
        assert!(got[0].is_none() && got[1].is_some());
        let e = passed(&["/a/disk.sock", "/a/disk.sock"])
            .assign(&paths)
            .unwrap_err();
        assert!(matches!(e, ActivationError::Twice(_)), "{e}");
    }
}
