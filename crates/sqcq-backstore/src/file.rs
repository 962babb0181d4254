//! The file backstore: a regular file or a block device through io_uring.
//!
//! Reads and writes go to an `O_DIRECT` descriptor when the request's
//! offset, buffers and lengths are aligned to the device's logical block
//! size, and to a buffered descriptor otherwise (guest buffers usually are
//! aligned; the fallback keeps odd ones correct). FUA writes carry
//! `RWF_DSYNC`; flushes are `IORING_OP_FSYNC` with `DATASYNC`. Discards and
//! zeroing are `fallocate` on files (punch hole, zero range) and the
//! `BLKDISCARD`/`BLKZEROOUT` ioctls on block devices; those ioctls are
//! rare and synchronous, and complete through the same reap path.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::Arc;

use io_uring::{IoUring, opcode, squeue, types};

use crate::capacity::Capacity;
use crate::lock::{ImageLock, LockError};
use crate::slots::{ImmediateCompletions, Slots};
use crate::sq_tail::SqTail;
use crate::{
    Backstore, BackstoreError, BackstoreQueue, Completion, Geometry, IoOp, check_range, iov_len,
};

// Block device ioctls from <linux/fs.h>.
const BLKSSZGET: libc::Ioctl = 0x1268;
const BLKGETSIZE64: libc::Ioctl = 0x8008_1272;
const BLKDISCARD: libc::Ioctl = 0x1277;
const BLKZEROOUT: libc::Ioctl = 0x127f;

/// How to open a file backstore.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileOptions {
    /// A regular file or a block device.
    pub path: PathBuf,
    /// Bytes to expose: at most the file's or device's size (the LUN is
    /// then its first `size` bytes); the size of a file `create` makes.
    /// `None` exposes the whole file or device. An existing file is never
    /// grown or shrunk.
    pub size: Option<u64>,
    /// Create the regular file (of `size` bytes) if it does not exist.
    /// Without it a missing file is an error.
    pub create: bool,
    /// Logical block size exposed to the initiator (512 or 4096).
    pub block_size: u32,
    /// Open read-only and refuse writes.
    pub read_only: bool,
    /// Use `O_DIRECT` when requests allow (on by default).
    pub direct: bool,
    /// Lock the image as QEMU does (on by default; see the `lock`
    /// module): off only for storage that a cluster file system or the
    /// guests themselves arbitrate.
    pub lock: bool,
    /// Take the locks at the first [`Backstore::set_active`] rather than
    /// at open: the destination of a live migration, whose source holds
    /// them until its device stops.
    pub defer_lock: bool,
}

impl FileOptions {
    /// Options for `path` with 512-byte blocks, read-write, direct I/O.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        FileOptions {
            path: path.into(),
            size: None,
            create: false,
            block_size: 512,
            read_only: false,
            direct: true,
            lock: true,
            defer_lock: false,
        }
    }
}

/// Opens the file, or with `create` makes it if it is missing (then
/// `size` is needed). Returns whether it was created.
fn open_or_create(open: &OpenOptions, options: &FileOptions) -> io::Result<(File, bool)> {
    if !options.create || options.read_only {
        return Ok((open.open(&options.path)?, false));
    }
    if options.size.is_none() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "create needs size= for a missing file",
        ));
    }
    match open.clone().create_new(true).open(&options.path) {
        Ok(f) => Ok((f, true)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            Ok((open.open(&options.path)?, false))
        }
        Err(e) => Err(e),
    }
}

/// A backstore on a regular file or block device.
#[derive(Debug)]
pub struct FileBackstore {
    /// The geometry at open; `blocks` follows `capacity`.
    geometry: Geometry,
    capacity: Capacity,
    buffered: Arc<File>,
    direct: Option<(Arc<File>, u64)>,
    block_device: bool,
    /// The image's locks, unless `lock` was off.
    lock: Option<ImageLock>,
    /// The path given, for messages.
    path: PathBuf,
}

impl FileBackstore {
    /// Opens the backing file or device (creating a missing regular file
    /// only with `create`).
    pub fn open(options: &FileOptions) -> Result<Self, BackstoreError> {
        let open_err = |source| BackstoreError::Open {
            path: options.path.clone(),
            source,
        };
        if options.block_size != 512 && options.block_size != 4096 {
            return Err(BackstoreError::Geometry("block size must be 512 or 4096"));
        }
        let mut open = OpenOptions::new();
        open.read(true).write(!options.read_only);
        let (buffered, created) = open_or_create(&open, options).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound && !options.create {
                BackstoreError::Missing {
                    path: options.path.clone(),
                }
            } else {
                open_err(e)
            }
        })?;
        let lock = if options.lock {
            let lock = ImageLock::open(&options.path, !options.read_only).map_err(open_err)?;
            if !options.defer_lock {
                lock.acquire().map_err(|e| lock_error(&options.path, e))?;
            }
            Some(lock)
        } else {
            None
        };
        let block_device = buffered
            .metadata()
            .map_err(open_err)?
            .file_type()
            .is_block_device();
        let current = if block_device {
            ioctl_u64(&buffered, BLKGETSIZE64).map_err(open_err)?
        } else {
            buffered.metadata().map_err(open_err)?.len()
        };
        let bytes = match options.size {
            Some(size) if created => {
                if let Err(e) = buffered.set_len(size) {
                    let _ = std::fs::remove_file(&options.path);
                    return Err(open_err(e));
                }
                size
            }
            Some(size) if size > current => {
                return Err(BackstoreError::TooSmall {
                    path: options.path.clone(),
                    size,
                    available: current,
                });
            }
            Some(size) => size,
            None => current,
        };
        let blocks = bytes / u64::from(options.block_size);
        if blocks == 0 {
            return Err(BackstoreError::Geometry(
                "backing file is smaller than one block",
            ));
        }
        let direct_align = if block_device {
            ioctl_u64(&buffered, BLKSSZGET).unwrap_or(512).max(512)
        } else {
            u64::from(options.block_size)
        };
        // tmpfs and some others refuse O_DIRECT: buffered I/O only, then.
        let direct = options
            .direct
            .then(|| open.custom_flags(libc::O_DIRECT).open(&options.path).ok())
            .flatten()
            .map(|f| (Arc::new(f), direct_align));
        Ok(FileBackstore {
            geometry: Geometry {
                block_size: options.block_size,
                blocks,
                read_only: options.read_only,
                supports_unmap: !options.read_only,
                unmapped_reads_zero: !block_device,
            },
            capacity: Capacity::new(blocks * u64::from(options.block_size)),
            buffered: Arc::new(buffered),
            direct,
            block_device,
            lock,
            path: options.path.clone(),
        })
    }

    /// Whether `O_DIRECT` is in use for aligned requests.
    pub fn direct_io(&self) -> bool {
        self.direct.is_some()
    }
}

fn lock_error(path: &std::path::Path, e: LockError) -> BackstoreError {
    match e {
        LockError::Conflict(conflict) => BackstoreError::Locked {
            path: path.to_owned(),
            conflict,
        },
        LockError::Io(source) => BackstoreError::Open {
            path: path.to_owned(),
            source,
        },
    }
}

fn ioctl_u64(file: &File, request: libc::Ioctl) -> io::Result<u64> {
    let mut value: u64 = 0;
    // SAFETY: both ioctls write at most 8 bytes (BLKSSZGET an int, which
    // fits in the low bytes on little-endian; big-endian reads it from the
    // zeroed u64 via the int cast below) to the pointer we pass.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), request, &mut value as *mut u64) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    if request == BLKSSZGET {
        value &= u64::from(u32::MAX);
    }
    Ok(value)
}

impl Backstore for FileBackstore {
    fn set_active(&self, active: bool) -> Result<(), BackstoreError> {
        let Some(lock) = &self.lock else {
            return Ok(());
        };
        if active {
            lock.acquire().map_err(|e| lock_error(&self.path, e))
        } else {
            lock.release().map_err(|source| BackstoreError::Open {
                path: self.path.clone(),
                source,
            })
        }
    }

    fn geometry(&self) -> Geometry {
        Geometry {
            blocks: self.capacity.get() / u64::from(self.geometry.block_size),
            ..self.geometry
        }
    }

    /// A regular file grows (`set_len`) before the new capacity is
    /// published; a block device takes any size up to its own (grow the
    /// device first). Shrinking is refused: it would destroy the data
    /// beyond the new end of a file the administrator may still want.
    fn resize(&self, bytes: u64) -> Result<Geometry, BackstoreError> {
        crate::ram::validated_geometry(bytes, self.geometry.block_size)?;
        if bytes < self.capacity.get() {
            return Err(BackstoreError::Unsupported("shrinking a file LUN"));
        }
        let resize_err = |source| BackstoreError::Resize { bytes, source };
        if self.block_device {
            let size = ioctl_u64(&self.buffered, BLKGETSIZE64).map_err(resize_err)?;
            if bytes > size {
                return Err(BackstoreError::Geometry(
                    "larger than the block device (grow the device first)",
                ));
            }
        } else {
            let current = self.buffered.metadata().map_err(resize_err)?.len();
            if bytes > current {
                if self.geometry.read_only {
                    return Err(BackstoreError::ReadOnly);
                }
                self.buffered.set_len(bytes).map_err(resize_err)?;
            }
        }
        self.capacity.set(bytes);
        Ok(self.geometry())
    }

    fn open_queue(&self, depth: u32) -> Result<Box<dyn BackstoreQueue>, BackstoreError> {
        let depth = depth.clamp(1, 4096);
        let ring = IoUring::new(depth.next_power_of_two().max(8)).map_err(BackstoreError::Setup)?;
        // SAFETY: eventfd(2) has no memory-safety preconditions.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(BackstoreError::Setup(io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let eventfd = unsafe { OwnedFd::from_raw_fd(fd) };
        ring.submitter()
            .register_eventfd(eventfd.as_raw_fd())
            .map_err(BackstoreError::Setup)?;
        let sq = SqTail::new(&ring).map_err(BackstoreError::Setup)?;
        Ok(Box::new(FileQueue {
            queued: Vec::with_capacity(ring.params().sq_entries() as usize),
            ring,
            sq,
            refused: libc::EIO,
            eventfd,
            slots: Slots::new(depth),
            immediate: ImmediateCompletions::new(depth),
            capacity: self.capacity.clone(),
            read_only: self.geometry.read_only,
            buffered: Arc::clone(&self.buffered),
            direct: self.direct.clone(),
            block_device: self.block_device,
        }))
    }
}

/// The `user_data` of a cancel request: beyond every slot (at most 4096),
/// so that `Slots::release` finds nothing and `reap` skips its completion.
const CANCEL_TAG: u64 = u64::MAX;

struct FileQueue {
    ring: IoUring,
    /// The ring's submission queue head and tail, to take back entries.
    sq: SqTail,
    /// The `user_data` of the entries queued in the ring and not yet
    /// consumed by the kernel, oldest first.
    queued: Vec<u64>,
    /// The error number of the last failed `io_uring_enter`: what the
    /// requests [`BackstoreQueue::withdraw`] takes back fail with.
    refused: i32,
    eventfd: OwnedFd,
    slots: Slots,
    immediate: ImmediateCompletions,
    capacity: Capacity,
    read_only: bool,
    buffered: Arc<File>,
    direct: Option<(Arc<File>, u64)>,
    block_device: bool,
}

impl std::fmt::Debug for FileQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileQueue")
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

impl FileQueue {
    /// The descriptor for a read or write: direct when everything is aligned.
    fn data_fd(&self, offset: u64, iov: &[libc::iovec]) -> RawFd {
        if let Some((file, align)) = &self.direct {
            let align = *align;
            let aligned = |v: &libc::iovec| {
                (v.iov_base as u64).is_multiple_of(align)
                    && (v.iov_len as u64).is_multiple_of(align)
            };
            if offset.is_multiple_of(align) && iov.iter().all(aligned) {
                return file.as_raw_fd();
            }
        }
        self.buffered.as_raw_fd()
    }

    /// Runs a rare synchronous ioctl and queues its completion, waking the
    /// worker through the completion eventfd like a ring completion would.
    fn complete_now(
        &mut self,
        tag: u64,
        request: libc::Ioctl,
        offset: u64,
        len: u64,
    ) -> Result<(), BackstoreError> {
        let range = [offset, len];
        // SAFETY: BLKDISCARD and BLKZEROOUT read two u64 from the pointer.
        let rc = unsafe { libc::ioctl(self.buffered.as_raw_fd(), request, range.as_ptr()) };
        let result = if rc < 0 {
            Err(BackstoreError::Io(io::Error::last_os_error()))
        } else {
            Ok(0)
        };
        self.immediate.push(tag, result)?;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd.
        unsafe { libc::write(self.eventfd.as_raw_fd(), (&1u64 as *const u64).cast(), 8) };
        Ok(())
    }

    /// Queues `entry` in the ring, sending what is queued first when the
    /// ring is full.
    fn push(&mut self, entry: &squeue::Entry) -> Result<(), BackstoreError> {
        if self.ring.submission().is_full()
            && let Err(e) = self.send()
            && self.ring.submission().is_full()
        {
            return Err(e);
        }
        // SAFETY: the entry's buffers (iovec copy in `slots`, and the memory
        // the iovecs name, by `submit`'s contract) stay valid until its
        // completion is reaped: the slot is released only in `reap` (or in
        // `withdraw`, which makes sure the kernel never reads the entry).
        unsafe { self.ring.submission().push(entry) }
            .map_err(|_| BackstoreError::QueueFull("submission queue full after submit"))?;
        self.queued.push(entry.get_user_data());
        Ok(())
    }

    /// One `io_uring_enter` for what is queued. The kernel may take fewer
    /// entries than queued (it could not allocate for the rest, or one
    /// failed to start and ended the batch with its completion); the rest
    /// stay queued and this reports `EAGAIN`, so that the caller sends
    /// them again rather than leaving them for a next batch that may never
    /// come.
    fn send(&mut self) -> Result<(), BackstoreError> {
        match self.ring.submit() {
            Ok(n) => {
                self.queued.drain(..n.min(self.queued.len()));
                if self.queued.is_empty() {
                    Ok(())
                } else {
                    self.refused = libc::EAGAIN;
                    Err(BackstoreError::Io(io::Error::from_raw_os_error(
                        libc::EAGAIN,
                    )))
                }
            }
            Err(e) => {
                self.refused = e.raw_os_error().unwrap_or(libc::EIO);
                Err(BackstoreError::Io(e))
            }
        }
    }
}

impl BackstoreQueue for FileQueue {
    unsafe fn submit(
        &mut self,
        tag: u64,
        op: IoOp,
        iov: &[libc::iovec],
    ) -> Result<(), BackstoreError> {
        let Some(len) = iov_len(iov) else {
            // (`ok_or` would build and drop the error on every request.)
            return Err(BackstoreError::QueueFull("request larger than 4 GiB"));
        };
        let writes = !matches!(op, IoOp::Read { .. } | IoOp::Flush);
        if writes && self.read_only {
            return Err(BackstoreError::ReadOnly);
        }
        let buffered = types::Fd(self.buffered.as_raw_fd());
        let entry = match op {
            IoOp::Read { offset } | IoOp::Write { offset, .. } => {
                check_range(offset, u64::from(len), self.capacity.get())?;
                let fd = types::Fd(self.data_fd(offset, iov));
                let (slot, iovecs) = self.slots.take(tag, len, iov)?;
                let n = u32::try_from(iov.len()).unwrap_or(u32::MAX);
                match op {
                    IoOp::Write { fua, .. } => opcode::Writev::new(fd, iovecs, n)
                        .offset(offset)
                        .rw_flags(if fua { libc::RWF_DSYNC } else { 0 })
                        .build(),
                    _ => opcode::Readv::new(fd, iovecs, n).offset(offset).build(),
                }
                .user_data(u64::from(slot))
            }
            IoOp::Flush => {
                let (slot, _) = self.slots.take(tag, 0, &[])?;
                opcode::Fsync::new(buffered)
                    .flags(types::FsyncFlags::DATASYNC)
                    .build()
                    .user_data(u64::from(slot))
            }
            IoOp::Discard { offset, len } | IoOp::WriteZeroes { offset, len } => {
                check_range(offset, len, self.capacity.get())?;
                let zero = matches!(op, IoOp::WriteZeroes { .. });
                if self.block_device {
                    return self.complete_now(
                        tag,
                        if zero { BLKZEROOUT } else { BLKDISCARD },
                        offset,
                        len,
                    );
                }
                let mode = libc::FALLOC_FL_KEEP_SIZE
                    | if zero {
                        libc::FALLOC_FL_ZERO_RANGE
                    } else {
                        libc::FALLOC_FL_PUNCH_HOLE
                    };
                let (slot, _) = self.slots.take(tag, 0, &[])?;
                opcode::Fallocate::new(buffered, len)
                    .offset(offset)
                    .mode(mode)
                    .build()
                    .user_data(u64::from(slot))
            }
        };
        let slot = entry.get_user_data();
        self.push(&entry).inspect_err(|_| {
            self.slots.release(slot);
        })
    }

    fn commit(&mut self) -> Result<(), BackstoreError> {
        if self.queued.is_empty() {
            return Ok(());
        }
        self.send()
    }

    /// Stores the ring's tail back over the entries the kernel has not
    /// consumed ([`SqTail`]), so that it never performs them, and
    /// completes their requests with the error `io_uring_enter` last gave.
    fn withdraw(&mut self) -> u32 {
        let left = self
            .sq
            .unconsumed()
            .min(self.queued.len().try_into().unwrap_or(u32::MAX));
        self.sq.take_back(left);
        let from = self.queued.len() - left as usize;
        let mut n = 0;
        for user_data in self.queued.drain(from..) {
            // A cancel request names no slot: nothing to complete.
            if let Some((tag, _)) = self.slots.release(user_data) {
                let e = io::Error::from_raw_os_error(self.refused);
                self.immediate.push_unbounded(tag, BackstoreError::Io(e));
                n += 1;
            }
        }
        // Those before were consumed: they complete through the ring.
        self.queued.clear();
        if n > 0 {
            // SAFETY: writes 8 bytes from a live u64 to our own eventfd.
            unsafe { libc::write(self.eventfd.as_raw_fd(), (&1u64 as *const u64).cast(), 8) };
        }
        n
    }

    fn reap(&mut self, done: Completion<'_>) {
        self.immediate.reap(done);
        let slots = &mut self.slots;
        for cqe in self.ring.completion() {
            let Some((tag, expected)) = slots.release(cqe.user_data()) else {
                continue;
            };
            let result = match u32::try_from(cqe.result()) {
                Err(_) => Err(BackstoreError::Io(io::Error::from_raw_os_error(
                    cqe.result().saturating_neg(),
                ))),
                Ok(n) if n != expected => Err(BackstoreError::ShortTransfer { expected, done: n }),
                Ok(n) => Ok(n),
            };
            done(tag, result);
        }
    }

    /// One `IORING_OP_ASYNC_CANCEL` with `IORING_ASYNC_CANCEL_ANY` (every
    /// request of the ring, Linux 5.19 on; an older kernel fails the
    /// cancel request with EINVAL and the requests are waited for as they
    /// are). Cancelled requests complete with ECANCELED (or EINTR, from
    /// io-wq) through `reap`; the cancel's own completion carries
    /// [`CANCEL_TAG`], which names no slot and is skipped there.
    fn cancel(&mut self) -> Result<(), BackstoreError> {
        if self.slots.in_flight() == 0 {
            return Ok(());
        }
        let entry = opcode::AsyncCancel2::new(types::CancelBuilder::any())
            .build()
            .user_data(CANCEL_TAG);
        // A cancel request names no buffer; it goes out at once.
        self.push(&entry)?;
        self.commit()
    }

    fn in_flight(&self) -> u32 {
        self.slots.in_flight() + self.immediate.len()
    }

    fn completion_fd(&self) -> Option<RawFd> {
        Some(self.eventfd.as_raw_fd())
    }

    fn steer_completions(&mut self, cpus: &[usize]) -> Result<bool, BackstoreError> {
        // SAFETY: an all-zero cpu_set_t is the empty set (what CPU_ZERO
        // writes); it is plain data.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let capacity = 8 * std::mem::size_of::<libc::cpu_set_t>();
        for &cpu in cpus.iter().filter(|&&c| c < capacity) {
            // SAFETY: `cpu` is below the set's capacity in bits, checked
            // above, so CPU_SET writes inside `set`.
            unsafe { libc::CPU_SET(cpu, &mut set) };
        }
        if cpus.iter().all(|&c| c >= capacity) {
            return Err(BackstoreError::Setup(io::Error::from_raw_os_error(
                libc::EINVAL,
            )));
        }
        // io-wq workers (buffered I/O, fsync, fallocate punted out of line)
        // run only on these CPUs from now on; direct I/O that completes
        // from the interrupt path is not affected.
        self.ring
            .submitter()
            .register_iowq_aff(&set)
            .map_err(BackstoreError::Setup)?;
        Ok(true)
    }
}
