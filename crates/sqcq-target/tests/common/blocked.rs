//! A file backstore really blocked, with no test hook: a thread writes to
//! the disk file from a page registered with userfaultfd and never
//! served, so that it faults while it holds the file's inode lock. The
//! daemon's direct writes to that file then wait in io_uring's io-wq: as
//! many as io-wq runs at once (4 per CPU) in kernel threads that sleep on
//! the lock, which no cancellation interrupts, and the rest queued behind
//! them, which a cancellation ends at once. For the stop tests (spec
//! 7.3.2 S1, S5) and the backpressure tests.

#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::fs::OpenOptions;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use sqcq_target::Daemon;
use sqcq_target::config::{
    BackstoreKind, DaemonConfig, DeviceConfig, DeviceType, PollOptions, QueueMap,
};
use sqcq_wire::blk::{RequestHeader, RequestType};

use super::raw_ring::{Guest, Vq};
use super::{QUEUE_SIZE, TempDir, WAIT, lun};

/// Size of the disk file [`start`] serves.
pub const DISK: u64 = 8 << 20;

/// A daemon with `poll` and one device of `device_type` with one request
/// queue, on the file `disk` of `dir` (the file [`InodeLock::hold`]
/// blocks); returns it and the device's socket.
pub fn start(
    dir: &TempDir,
    device_type: DeviceType,
    poll: PollOptions,
) -> (Daemon, std::path::PathBuf) {
    let socket = dir.path("dev.sock");
    let mut disk = lun(BackstoreKind::File, DISK);
    disk.path = Some(dir.path("disk"));
    disk.create = true;
    let config = DaemonConfig {
        poll,
        workers: 1,
        admin_socket: None,
        seccomp: Default::default(),
        service: Default::default(),
        devices: vec![DeviceConfig {
            device_type,
            socket_path: socket.clone(),
            luns: vec![disk],
            num_queues: 1,
            queue_size: QUEUE_SIZE,
            queue_map: QueueMap::default(),
            qos: Default::default(),
        }],
    };
    config.validate().unwrap();
    (Daemon::start(&config).unwrap(), socket)
}

/// A write of `data` at `sector`, its data buffer aligned for the file
/// backstore's direct descriptor; made available, not kicked. Returns its
/// head and its status byte's address.
pub fn write(vq: &mut Vq, g: &mut Guest, sector: u64, data: &[u8]) -> (u16, u64) {
    let h = g.alloc(16);
    g.write(
        h,
        &RequestHeader {
            kind: RequestType::Out,
            ioprio: 0,
            sector,
        }
        .encode(),
    );
    let d = g.alloc(data.len() as u32 + 512).next_multiple_of(512);
    g.write(d, data);
    let s = g.alloc(1);
    g.write(s, &[0xff]);
    let head = vq.add(
        g,
        &[(h, 16, false), (d, data.len() as u32, false), (s, 1, true)],
    );
    (head, s)
}

/// Holds the inode lock of `path` until dropped: a thread writes to the
/// file from a userfaultfd page nobody serves. Dropping closes the
/// userfaultfd, which fails that write (EFAULT) and releases the lock.
pub struct InodeLock {
    uffd: Option<OwnedFd>,
    writer: Option<std::thread::JoinHandle<()>>,
    /// The writer thread's id, for [`InodeLock::writer_state`].
    tid: Arc<AtomicI32>,
}

impl InodeLock {
    pub fn hold(path: &std::path::Path) -> InodeLock {
        // Non-blocking: poll(2) on a blocking userfaultfd answers POLLERR
        // at once (fs/userfaultfd.c), which made the wait for the fault
        // below return before the writer held the lock, now and then.
        // SAFETY: userfaultfd(2) with flags only.
        let fd =
            unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
        assert!(fd >= 0, "userfaultfd: {}", std::io::Error::last_os_error());
        // SAFETY: a new descriptor owned by nobody else.
        let uffd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let mut api = [0u64; 3]; // struct uffdio_api: api, features, ioctls
        api[0] = 0xaa; // UFFD_API
        // SAFETY: UFFDIO_API reads and writes a struct uffdio_api.
        let rc = unsafe { libc::ioctl(uffd.as_raw_fd(), 0xc018_aa3f, api.as_mut_ptr()) };
        assert_eq!(rc, 0, "UFFDIO_API: {}", std::io::Error::last_os_error());
        // SAFETY: an anonymous private mapping of one page.
        let page = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(page, libc::MAP_FAILED);
        // struct uffdio_register: range { start, len }, mode, ioctls.
        let mut reg = [page as u64, 4096, 1 /* MISSING */, 0];
        // SAFETY: UFFDIO_REGISTER reads and writes a struct uffdio_register.
        let rc = unsafe { libc::ioctl(uffd.as_raw_fd(), 0xc020_aa00, reg.as_mut_ptr()) };
        assert_eq!(
            rc,
            0,
            "UFFDIO_REGISTER: {}",
            std::io::Error::last_os_error()
        );
        let file = OpenOptions::new().write(true).open(path).unwrap();
        let at = page as usize;
        let tid = Arc::new(AtomicI32::new(0));
        let writer_tid = Arc::clone(&tid);
        let writer = std::thread::spawn(move || {
            // Release, paired with the Acquire in `writer_state`: the id
            // is read from the test's thread (and only read, for a report).
            // SAFETY: gettid(2) has no arguments.
            writer_tid.store(unsafe { libc::gettid() }, Ordering::Release);
            // SAFETY: the page stays mapped (never unmapped); the write
            // faults on it under the inode lock until the userfaultfd
            // closes, then fails.
            let buf = unsafe { std::slice::from_raw_parts(at as *const u8, 4096) };
            let _ = file.write_at(buf, 7 << 20);
        });
        // The fault is reported once the writer is inside, holding the
        // lock: wait for it (bounded).
        let mut pfd = libc::pollfd {
            fd: uffd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, WAIT.as_millis() as i32) };
        assert_eq!(n, 1, "the writer did not fault");
        assert_eq!(pfd.revents, libc::POLLIN, "a fault to read");

        InodeLock {
            uffd: Some(uffd),
            writer: Some(writer),
            tid,
        }
    }

    /// Where the writer thread is in the kernel (its state, wait channel
    /// and kernel stack), for the report of an attempt whose writes were
    /// not blocked: it tells whether the writer was inside the write,
    /// holding the inode lock, at that moment.
    pub fn writer_state(&self) -> String {
        let tid = self.tid.load(Ordering::Acquire);
        let task = format!("/proc/self/task/{tid}");
        let read = |f: &str| {
            std::fs::read_to_string(format!("{task}/{f}")).unwrap_or_else(|e| format!("({f}: {e})"))
        };
        let state = read("stat")
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_owned))
            .unwrap_or_default();
        format!(
            "writer thread {tid}: state {state}, wchan {}, stack:\n{}",
            read("wchan"),
            read("stack")
        )
    }

    pub fn release(&mut self) {
        self.uffd = None;
        if let Some(w) = self.writer.take() {
            w.join().unwrap();
        }
    }
}

impl Drop for InodeLock {
    fn drop(&mut self) {
        self.release();
    }
}

/// One test at a time: each blocks writes for several seconds, and the
/// io-wq threads of the others would compete for the same two CPUs.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub fn in_flight(d: &Daemon) -> u32 {
    let m = &d.device(0).unwrap().info.metrics;
    m.queues().map(|q| q.in_flight).sum()
}

/// Waits until the `n` writes are in flight, bounded; false if one
/// completed meanwhile (see [`blocked`]).
pub fn wait_in_flight(d: &Daemon, n: u16, vq: &Vq, g: &Guest) -> bool {
    let by = std::time::Instant::now() + Duration::from_secs(30);
    while in_flight(d) != u32::from(n) {
        if vq.used_idx(g) != vq.last_used {
            return false;
        }
        assert!(
            std::time::Instant::now() < by,
            "{} of {n} writes in flight",
            in_flight(d)
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

/// Runs `scenario`, which returns false when a write completed while the
/// inode lock was held: a broken premise, not a pass (it printed where
/// the writer was). Once this was retried up to twenty times: the wait
/// for the writer's fault returned at once (poll on a blocking
/// userfaultfd is POLLERR), so under load the daemon's writes now and
/// then got in before the writer held the lock.
pub fn blocked(scenario: impl Fn() -> bool) {
    assert!(
        scenario(),
        "a write completed while the inode lock was held"
    );
}

/// The end of an attempt whose writes were not blocked: says where the
/// writer was (see [`blocked`]).
pub fn lost_lock(lock: &InodeLock) -> bool {
    eprintln!("{}", lock.writer_state());
    false
}
