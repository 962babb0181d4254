//! Image locking: two processes must not write one image by accident.
//!
//! A file LUN takes open file description (OFD) locks on its image the way
//! QEMU's `file` and `host_device` drivers do (`block/file-posix.c`), so
//! that `sqcqd`, QEMU, qemu-storage-daemon and qemu-img all see each
//! other. Each permission a user may hold has two lock bytes: byte
//! `100 + p` is read-locked by every user that *holds* permission `p`,
//! byte `200 + p` by every user that *does not share* it. A user takes
//! its bytes first and then asks whether anyone else holds a byte that
//! conflicts (a holder of `p` where it refuses to share `p`, or a refuser
//! of `p` where it holds `p`); two users racing both see each other and
//! both give up, which is safe.
//!
//! A writable LUN holds "consistent read" and "write" and does not share
//! "write"; a read-only LUN holds "consistent read" and does not share
//! "write" either (a guest's read-only disk must not change under it, as
//! QEMU's default `share-rw=off`). So any number of readers may share an
//! image, and a writer excludes everyone else who reads or writes it for
//! a guest, while a plain `qemu-img info` (which neither writes nor
//! refuses writers) still works.
//!
//! OFD locks belong to the open file description, not to the process:
//! they go when the last descriptor of the backstore's file closes (the
//! LUN is removed or the daemon exits, `kill -9` included), and a
//! restarted daemon takes them again at once.

use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Mutex, PoisonError};

/// QEMU's `BLK_PERM_CONSISTENT_READ` (bit 0).
const PERM_CONSISTENT_READ: i64 = 0;
/// QEMU's `BLK_PERM_WRITE` (bit 1).
const PERM_WRITE: i64 = 1;
/// First byte of the "holds permission p" range (QEMU's
/// `RAW_LOCK_PERM_BASE`).
const HOLD_BASE: i64 = 100;
/// First byte of the "does not share permission p" range (QEMU's
/// `RAW_LOCK_SHARED_BASE`).
const REFUSE_BASE: i64 = 200;

/// Another user of the image holds a lock that conflicts with ours.
#[derive(Debug)]
pub struct Conflict {
    /// The permission in dispute, in QEMU's words ("write", "consistent
    /// read").
    pub permission: &'static str,
    /// Processes found holding a conflicting lock on the image (empty
    /// when `/proc` did not tell, e.g. in another PID namespace).
    pub holders: Vec<Holder>,
}

/// A process that holds a lock on the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Its process ID.
    pub pid: u32,
    /// Its command name (`/proc/PID/comm`).
    pub comm: String,
}

impl std::fmt::Display for Conflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "failed to get the \"{}\" lock", self.permission)?;
        if self.holders.is_empty() {
            write!(f, " (another process is using the image)")
        } else {
            let who: Vec<String> = self
                .holders
                .iter()
                .map(|h| format!("{} (pid {})", h.comm, h.pid))
                .collect();
            write!(f, " (held by {})", who.join(", "))
        }
    }
}

/// Why an image could not be locked.
#[derive(Debug)]
pub enum LockError {
    /// Someone else uses the image in a way ours excludes.
    Conflict(Conflict),
    /// The system refused a lock call.
    Io(io::Error),
}

/// The locks of one image, on a descriptor of their own: no I/O ever
/// holds it, so they go the moment the process that held them does (in
/// flight I/O pins the descriptions it uses until it completes).
#[derive(Debug)]
pub(crate) struct ImageLock {
    file: File,
    writable: bool,
    /// Whether the locks are taken now.
    held: Mutex<bool>,
}

impl ImageLock {
    /// Opens the image for its locks, taking none yet.
    pub(crate) fn open(path: &Path, writable: bool) -> io::Result<Self> {
        Ok(ImageLock {
            file: File::open(path)?,
            writable,
            held: Mutex::new(false),
        })
    }

    /// Takes the locks if not held yet. A conflict leaves none taken.
    pub(crate) fn acquire(&self) -> Result<(), LockError> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if *held {
            return Ok(());
        }
        if let Err(e) = lock_image(&self.file, self.writable) {
            // Give back what was taken before the conflict was seen, so
            // that a refused attempt stands in nobody's way.
            let _ = unlock_image(&self.file);
            return Err(e);
        }
        *held = true;
        Ok(())
    }

    /// Gives the locks up (the source of a live migration, once its
    /// device stopped); [`Self::acquire`] takes them again.
    pub(crate) fn release(&self) -> io::Result<()> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if *held {
            unlock_image(&self.file)?;
            *held = false;
        }
        Ok(())
    }
}

/// Takes the locks a LUN of this kind (`writable` or not) needs on
/// `file`, then checks that nobody else holds one ours excludes.
fn lock_image(file: &File, writable: bool) -> Result<(), LockError> {
    let mut held = vec![HOLD_BASE + PERM_CONSISTENT_READ];
    if writable {
        held.push(HOLD_BASE + PERM_WRITE);
    }
    let refused = [REFUSE_BASE + PERM_WRITE];
    for &byte in held.iter().chain(&refused) {
        set_lock(file, libc::F_RDLCK, byte, 1).map_err(LockError::Io)?;
    }
    // Ours are taken: a user that starts now sees them. Now look for the
    // users that started before.
    //
    // Somebody refuses to share a permission we hold?
    for &byte in &held {
        let p = byte - HOLD_BASE;
        if others_hold(file, REFUSE_BASE + p).map_err(LockError::Io)? {
            return Err(conflict(file, p, REFUSE_BASE + p));
        }
    }
    // Somebody holds a permission we refuse to share?
    for &byte in &refused {
        let p = byte - REFUSE_BASE;
        if others_hold(file, HOLD_BASE + p).map_err(LockError::Io)? {
            return Err(conflict(file, p, HOLD_BASE + p));
        }
    }
    Ok(())
}

/// Drops every lock of `file`'s description on QEMU's lock bytes.
fn unlock_image(file: &File) -> io::Result<()> {
    set_lock(
        file,
        libc::F_UNLCK,
        HOLD_BASE,
        2 * (REFUSE_BASE - HOLD_BASE),
    )
}

fn conflict(file: &File, perm: i64, byte: i64) -> LockError {
    let permission = if perm == PERM_WRITE {
        "write"
    } else {
        "consistent read"
    };
    let holders = file
        .metadata()
        .map(|m| lock_holders(Path::new("/proc"), m.dev(), m.ino(), byte))
        .unwrap_or_default();
    LockError::Conflict(Conflict {
        permission,
        holders,
    })
}

fn flock(kind: libc::c_int, byte: i64, len: i64) -> libc::flock {
    // SAFETY: `flock` is plain data; all-zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    #[allow(clippy::cast_possible_truncation)] // F_RDLCK, F_WRLCK, F_UNLCK: 0 to 2
    {
        fl.l_type = kind as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
    }
    fl.l_start = byte;
    fl.l_len = len;
    fl
}

fn set_lock(file: &File, kind: libc::c_int, byte: i64, len: i64) -> io::Result<()> {
    let fl = flock(kind, byte, len);
    // SAFETY: F_OFD_SETLK reads one `struct flock`, which `fl` is, and
    // keeps no pointer to it.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &raw const fl) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether an open file description other than `file`'s holds a lock on
/// `byte` (asked as: would a write lock there conflict?).
fn others_hold(file: &File, byte: i64) -> io::Result<bool> {
    let mut fl = flock(libc::F_WRLCK, byte, 1);
    // SAFETY: F_OFD_GETLK reads and rewrites one `struct flock`, which
    // `fl` is, and keeps no pointer to it.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &raw mut fl) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(i32::from(fl.l_type) != libc::F_UNLCK)
}

/// The processes that hold a lock covering `byte` of the file `dev:ino`,
/// read from `/proc/PID/fdinfo/FD` (OFD locks show no owner in
/// `/proc/locks`; the `lock:` lines of fdinfo name the descriptions that
/// hold them). Best effort: whatever cannot be read is skipped.
fn lock_holders(proc: &Path, dev: u64, ino: u64, byte: i64) -> Vec<Holder> {
    let me = std::process::id();
    let mut holders: Vec<Holder> = Vec::new();
    let Ok(procs) = fs::read_dir(proc) else {
        return holders;
    };
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = fs::read_dir(entry.path().join("fdinfo")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            fs::read_to_string(fd.path())
                .is_ok_and(|info| info.lines().any(|l| lock_line_covers(l, dev, ino, byte)))
        });
        if holds && pid != me && !holders.iter().any(|h| h.pid == pid) {
            let comm = fs::read_to_string(entry.path().join("comm"))
                .map(|c| c.trim_end().to_owned())
                .unwrap_or_default();
            holders.push(Holder { pid, comm });
        }
    }
    holders
}

/// Whether an fdinfo `lock:` line (`lock:\t1: OFDLCK ADVISORY READ -1
/// fe:00:1234 100 101`) is a lock on `dev:ino` covering `byte`.
fn lock_line_covers(line: &str, dev: u64, ino: u64, byte: i64) -> bool {
    let Some(rest) = line.strip_prefix("lock:") else {
        return false;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // 1: KIND ADVISORY TYPE PID MAJ:MIN:INO START END
    let [_, _, _, _, _, file, start, end] = fields[..] else {
        return false;
    };
    let mut parts = file.split(':');
    let (Some(major), Some(minor), Some(inode)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let same_file = u64::from_str_radix(major, 16).ok() == Some(u64::from(libc::major(dev)))
        && u64::from_str_radix(minor, 16).ok() == Some(u64::from(libc::minor(dev)))
        && inode.parse::<u64>().ok() == Some(ino);
    let covers = start.parse::<i64>().is_ok_and(|s| s <= byte)
        && (end == "EOF" || end.parse::<i64>().is_ok_and(|e| e >= byte));
    same_file && covers
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(name: &str) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("sqcq-lock-{name}-{}", std::process::id()));
        fs::write(&path, [0u8; 4096]).unwrap();
        path
    }

    fn lock(path: &Path, writable: bool) -> ImageLock {
        ImageLock::open(path, writable).unwrap()
    }

    #[test]
    fn readers_share_and_a_writer_excludes() {
        let _no_spawn = crate::test_fork::no_spawn();
        let path = image("rw");
        let (r1, r2, w) = (lock(&path, false), lock(&path, false), lock(&path, true));
        r1.acquire().unwrap();
        r2.acquire().expect("two readers share an image");
        match w.acquire() {
            Err(LockError::Conflict(c)) => assert_eq!(c.permission, "write"),
            other => panic!("a writer beside readers: {other:?}"),
        }
        drop((r1, r2));
        w.acquire()
            .expect("the readers' locks went with their files");
        let w2 = lock(&path, true);
        assert!(matches!(w2.acquire(), Err(LockError::Conflict(_))));
        let r = lock(&path, false);
        assert!(matches!(r.acquire(), Err(LockError::Conflict(_))));
        fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_released_image_can_be_taken_and_a_refused_attempt_holds_nothing() {
        let _no_spawn = crate::test_fork::no_spawn();
        let path = image("handover");
        let (source, destination) = (lock(&path, true), lock(&path, true));
        source.acquire().unwrap();
        assert!(destination.acquire().is_err(), "the source holds it");
        // The refused attempt took nothing: the source can release and
        // take again, and a reader is refused only for the source.
        source.release().unwrap();
        source
            .acquire()
            .expect("nothing left behind by the refusal");
        source.release().unwrap();
        destination.acquire().expect("the hand-over");
        assert!(source.acquire().is_err(), "now the destination holds it");
        destination.release().unwrap();
        destination.release().unwrap();
        fs::remove_file(&path).unwrap();
    }

    #[test]
    fn fdinfo_lock_lines_are_matched_by_file_and_byte() {
        let dev = libc::makedev(0xfe, 0);
        let line = "lock:\t1: OFDLCK ADVISORY  READ -1 fe:00:1234 100 101";
        assert!(lock_line_covers(line, dev, 1234, 100));
        assert!(lock_line_covers(line, dev, 1234, 101));
        assert!(!lock_line_covers(line, dev, 1234, 102));
        assert!(!lock_line_covers(line, dev, 1235, 100));
        assert!(!lock_line_covers(line, libc::makedev(8, 1), 1234, 100));
        let to_eof = "lock:\t2: POSIX  ADVISORY  WRITE 77 fe:00:1234 0 EOF";
        assert!(lock_line_covers(to_eof, dev, 1234, 201));
        assert!(!lock_line_covers("pos:\t0", dev, 1234, 100));
        assert!(!lock_line_covers("lock:\tgarbage", dev, 1234, 100));
    }

    #[test]
    fn fdinfo_lists_the_locks_of_a_description() {
        let path = image("fdinfo");
        let holder = lock(&path, true);
        holder.acquire().unwrap();
        let m = holder.file.metadata().unwrap();
        let fdinfo =
            fs::read_to_string(format!("/proc/self/fdinfo/{}", holder.file.as_raw_fd())).unwrap();
        assert!(
            fdinfo
                .lines()
                .any(|l| lock_line_covers(l, m.dev(), m.ino(), HOLD_BASE + PERM_WRITE)),
            "{fdinfo}"
        );
        fs::remove_file(&path).unwrap();
    }
}
