//! The pidfile (`--pidfile PATH`): the daemon's pid and a newline, in a
//! file locked (`flock`, exclusive) for as long as the daemon runs, so that
//! a second daemon given the same pidfile refuses to start. Removed when
//! dropped (a clean exit); a daemon that was killed leaves the file
//! behind unlocked, and the next one takes it over.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use thiserror::Error;

/// Times the file is opened again when its holder removed it between
/// our open and our lock.
const ATTEMPTS: u32 = 8;

/// Why the pidfile could not be taken.
#[derive(Debug, Error)]
pub enum PidfileError {
    /// Another process holds the lock.
    #[error("pidfile {path} is locked: another sqcqd ({}) runs with it", holder(*.pid))]
    Locked {
        /// The pidfile.
        path: PathBuf,
        /// The pid it holds, if readable.
        pid: Option<u32>,
    },
    /// A system call failed.
    #[error("pidfile {path}: cannot {what}")]
    Io {
        /// The pidfile.
        path: PathBuf,
        /// What failed.
        what: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
}

fn holder(pid: Option<u32>) -> String {
    pid.map_or_else(|| "pid unknown".into(), |p| format!("pid {p}"))
}

/// A locked pidfile holding this process's pid.
#[derive(Debug)]
pub struct Pidfile {
    file: File,
    path: PathBuf,
}

impl Pidfile {
    /// Creates (or takes over an unlocked) `path`, locks it and writes
    /// this process's pid. The file is opened close-on-exec, without
    /// following a symbolic link, mode 0644.
    pub fn create(path: &Path) -> Result<Self, PidfileError> {
        let io_err = |what| {
            move |source| PidfileError::Io {
                path: path.to_owned(),
                what,
                source,
            }
        };
        for _ in 0..ATTEMPTS {
            // std opens with O_CLOEXEC. No O_TRUNC: the file may be a
            // running daemon's.
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o644)
                .custom_flags(libc::O_NOFOLLOW)
                .open(path)
                .map_err(io_err("open it"))?;
            // SAFETY: flock on a descriptor `file` owns.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::WouldBlock {
                    let mut text = String::new();
                    let pid = file
                        .read_to_string(&mut text)
                        .ok()
                        .and_then(|_| text.trim().parse().ok());
                    return Err(PidfileError::Locked {
                        path: path.to_owned(),
                        pid,
                    });
                }
                return Err(io_err("lock it")(e));
            }
            // The holder may have removed the file after our open: then we
            // locked a file nobody can find; open the path again.
            if !names(path, &file) {
                continue;
            }
            file.set_len(0).map_err(io_err("truncate it"))?;
            file.rewind().map_err(io_err("write it"))?;
            writeln!(file, "{}", std::process::id()).map_err(io_err("write it"))?;
            return Ok(Pidfile {
                file,
                path: path.to_owned(),
            });
        }
        Err(io_err("lock it")(io::Error::other(
            "removed and re-created too often while locking",
        )))
    }

    /// The pidfile's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Whether `path` still names the file `file` is open on.
fn names(path: &Path, file: &File) -> bool {
    match (std::fs::symlink_metadata(path), file.metadata()) {
        (Ok(p), Ok(f)) => (p.dev(), p.ino()) == (f.dev(), f.ino()),
        _ => false,
    }
}

impl Drop for Pidfile {
    /// Removes the file while still holding the lock (a daemon starting
    /// now either fails on the lock or creates a new file), unless the
    /// path now names another file.
    fn drop(&mut self) {
        if names(&self.path, &self.file) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sqcq-pidfile-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn holds_the_pid_locks_and_is_removed_on_drop() {
        let d = dir("lock");
        let p = d.join("sqcqd.pid");
        let first = Pidfile::create(&p).unwrap();
        let pid = std::process::id();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), format!("{pid}\n"));
        // flock locks belong to the open file description: a second open
        // in the same process conflicts as another process's would.
        let e = Pidfile::create(&p).unwrap_err();
        assert!(
            matches!(e, PidfileError::Locked { pid: Some(x), .. } if x == pid),
            "{e}"
        );
        assert!(e.to_string().contains(&format!("pid {pid}")), "{e}");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), format!("{pid}\n"));
        drop(first);
        assert!(!p.exists(), "removed on drop");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_stale_file_is_taken_over_and_a_symlink_refused() {
        let d = dir("stale");
        let p = d.join("sqcqd.pid");
        std::fs::write(&p, "999999999\nleftover text\n").unwrap();
        let f = Pidfile::create(&p).unwrap();
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            format!("{}\n", std::process::id())
        );
        drop(f);
        let target = d.join("elsewhere");
        std::os::unix::fs::symlink(&target, &p).unwrap();
        assert!(Pidfile::create(&p).is_err());
        assert!(!target.exists(), "nothing created through the link");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn drop_leaves_a_file_that_replaced_it() {
        let d = dir("replaced");
        let p = d.join("sqcqd.pid");
        let f = Pidfile::create(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, "1\n").unwrap();
        drop(f);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "1\n");
        std::fs::remove_dir_all(d).unwrap();
    }
}
