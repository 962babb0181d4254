//! Listening Unix sockets (a device's vhost-user socket, the admin
//! socket) that never destroy what they do not own.
//!
//! Binding replaces a file at the path only when it is a socket nobody
//! listens on any more (a daemon that was killed leaves one behind). A
//! regular file, a directory or any other non-socket is left alone and
//! reported; a socket some process still accepts on is reported as in use
//! instead of being taken over. On drop the socket file is removed only if
//! the path still names the socket this process created.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use thiserror::Error;
use tracing::info;

/// Why a socket could not be bound.
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
}

/// A bound, listening Unix socket; removes its file on drop.
#[derive(Debug)]
pub struct ListeningSocket {
    listener: UnixListener,
    path: PathBuf,
    /// Device and inode of the socket file, to recognise it on drop.
    file_id: (u64, u64),
}

impl ListeningSocket {
    /// Binds `path`, replacing only a stale socket.
    pub fn bind(path: &Path) -> Result<Self, ListenError> {
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
            Ok(_) if crate::sandbox::active() => {
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
        let listener = UnixListener::bind(path).map_err(|e| match e.kind() {
            // Another daemon bound it between our check and our bind.
            io::ErrorKind::AddrInUse => ListenError::InUse(path.to_owned()),
            _ => io_err(e),
        })?;
        let m = std::fs::symlink_metadata(path).map_err(io_err)?;
        Ok(ListeningSocket {
            listener,
            path: path.to_owned(),
            file_id: (m.dev(), m.ino()),
        })
    }

    /// The listener.
    pub fn listener(&self) -> &UnixListener {
        &self.listener
    }
}

impl Drop for ListeningSocket {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|m| m.file_type().is_socket() && (m.dev(), m.ino()) == self.file_id);
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
        let e = ListeningSocket::bind(&p).unwrap_err();
        assert!(matches!(e, ListenError::NotASocket(_)), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), b"precious");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_live_socket_is_in_use_and_a_stale_one_is_replaced() {
        let d = dir("live");
        let p = d.join("s.sock");
        let first = ListeningSocket::bind(&p).unwrap();
        let e = ListeningSocket::bind(&p).unwrap_err();
        assert!(matches!(e, ListenError::InUse(_)), "{e}");
        drop(first);
        assert!(!p.exists(), "removed on drop");
        // A killed daemon leaves its socket file behind.
        let stale = UnixListener::bind(d.join("other.sock")).unwrap();
        drop(stale);
        let second = ListeningSocket::bind(&d.join("other.sock")).unwrap();
        drop(second);
        assert!(!d.join("other.sock").exists(), "removed on drop");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn drop_leaves_a_file_that_replaced_the_socket() {
        let d = dir("replaced");
        let p = d.join("s.sock");
        let s = ListeningSocket::bind(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, b"someone else's").unwrap();
        drop(s);
        assert_eq!(std::fs::read(&p).unwrap(), b"someone else's");
        std::fs::remove_dir_all(d).unwrap();
    }
}
