//! The doorbells of one queue in driver memory, and the state the poll
//! thread and the submitter of that queue share.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};

use sqcq_protocol::{Doorbell, DoorbellCell, NEED_WAKEUP, RawDoorbell};
use vm_memory::{GuestAddress, MmapRegion};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::memory::{DriverMemory, MemoryError};
use crate::poll_stats::StatsCell;
use crate::vring::{DOORBELL_RESERVE, Ring, UsedFlags};

/// Byte offset of the CQ doorbell from the SQ doorbell.
const CQ_OFFSET: usize = 64;

/// Why a queue's doorbells could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum DoorbellError {
    /// The doorbell area is not in driver memory.
    #[error("the doorbell area is outside driver memory")]
    Memory(#[source] MemoryError),
    /// The doorbell area is not 128-byte aligned (a ring laid out without
    /// the doorbell reserve).
    #[error("the doorbell area at {0:#x} is not 128-byte aligned")]
    Misaligned(u64),
    /// An eventfd or the poll thread could not be created.
    #[error("setting up the driver poll thread failed")]
    Thread(#[source] std::io::Error),
}

/// One doorbell in driver memory; keeps the mapping alive.
#[derive(Debug)]
pub struct GuestBell {
    _mapping: Arc<MmapRegion>,
    raw: RawDoorbell,
}

impl DoorbellCell for GuestBell {
    fn idx(&self) -> &AtomicU16 {
        self.raw.idx()
    }
    fn flags(&self) -> &AtomicU16 {
        self.raw.flags()
    }
}

impl GuestBell {
    /// Whether the consumer of this doorbell has NEED_WAKEUP set.
    pub fn need_wakeup(&self) -> bool {
        // Relaxed: an observation for tests and reports, ordered by nothing.
        u16::from_le(self.raw.flags().load(Ordering::Relaxed)) & NEED_WAKEUP != 0
    }
}

/// The SQ and CQ doorbells of `ring`, at [`Ring::doorbell_area`],
/// zeroed (spec 3.3: before the queue is enabled; call this before
/// `start_queue`); a packed ring's with `sq.idx` and `cq.idx` at the
/// starting position 0x8000 (spec 10.3).
pub fn queue_doorbells(
    mem: &DriverMemory,
    ring: &Ring,
) -> Result<(GuestBell, GuestBell), DoorbellError> {
    let gpa: GuestAddress = ring.doorbell_area();
    if !gpa.0.is_multiple_of(128) {
        return Err(DoorbellError::Misaligned(gpa.0));
    }
    let (mapping, base) = mem
        .host_range(gpa, DOORBELL_RESERVE)
        .map_err(DoorbellError::Memory)?;
    if base.as_ptr().align_offset(128) != 0 {
        return Err(DoorbellError::Misaligned(gpa.0));
    }
    for i in 0..DOORBELL_RESERVE / 8 {
        let ptr = base.as_ptr().wrapping_add(8 * i).cast::<u64>();
        // SAFETY: `host_range` proved the 128 bytes at `base` are inside the
        // mapping, which the `Arc` keeps alive; `base` is 128-aligned, so
        // `base + 8 i` (i < 16) is in bounds and aligned for AtomicU64. The
        // device does not use the area yet; nothing else in this process
        // accesses it non-atomically.
        let word = unsafe { AtomicU64::from_ptr(ptr) };
        // Relaxed: the device is not using the queue yet; the vhost-user
        // messages that enable it order these stores before its first look.
        word.store(0, Ordering::Relaxed);
    }
    // SAFETY: the first 64 of the 128 mapped bytes, 64-aligned; the mapping
    // outlives the cell (its `Arc` is stored beside it); the device accesses
    // the fields only with 16-bit atomics, and the other bytes are never
    // touched again by this process.
    let sq = unsafe { RawDoorbell::new(base) };
    // SAFETY: `base + 64` stays inside the 128 checked bytes.
    let cq_base: NonNull<u8> = unsafe { base.add(CQ_OFFSET) };
    // SAFETY: as for `sq`: the second 64 bytes, 64-aligned.
    let cq = unsafe { RawDoorbell::new(cq_base) };
    if ring.is_packed() {
        let start = sqcq_protocol::packed::Position::START.encode().to_le();
        // Relaxed: before the queue is enabled, as the zeroing above.
        sq.idx().store(start, Ordering::Relaxed);
        cq.idx().store(start, Ordering::Relaxed);
    }
    Ok((
        GuestBell {
            _mapping: Arc::clone(&mapping),
            raw: sq,
        },
        GuestBell {
            _mapping: mapping,
            raw: cq,
        },
    ))
}

/// State of one poll thread that the queues it serves can observe.
#[derive(Debug)]
pub(crate) struct ThreadState {
    /// Set (Release) after every queue's NEED_WAKEUP is set, right before
    /// `epoll_wait`; cleared on waking.
    pub(crate) asleep: AtomicBool,
    /// Times the thread went to sleep.
    pub(crate) sleeps: AtomicU64,
    /// Asks the thread to exit; signalled with `stop_fd`.
    pub(crate) stop: AtomicBool,
    pub(crate) stop_fd: EventFd,
}

impl ThreadState {
    pub(crate) fn new() -> std::io::Result<Self> {
        Ok(Self {
            asleep: AtomicBool::new(false),
            sleeps: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            stop_fd: EventFd::new(EFD_NONBLOCK)?,
        })
    }
}

/// Everything about one queue that its poll thread and its submitter
/// share. As a [`DoorbellCell`] it is the queue's mailbox: the poll
/// thread produces (forwards `cq.idx`), the submitter consumes. An inline
/// queue (`sqcq-inline`) has no poll thread and leaves the mailbox unused.
#[derive(Debug)]
pub(crate) struct QueueShared {
    pub(crate) queue: u16,
    pub(crate) size: u16,
    /// The mailbox's own cache line: `idx` written by the poll thread,
    /// `flags` by the submitter, as on a real doorbell.
    mailbox: Doorbell,
    /// Signalled by the poll thread when the mailbox owes the submitter a
    /// wakeup.
    pub(crate) wake: EventFd,
    /// The figures of the queue's CQ poller (the poll thread, or inline
    /// the submitter) and the submitter's kicks.
    pub(crate) stats: Arc<StatsCell>,
    pub(crate) sq: GuestBell,
    pub(crate) cq: GuestBell,
    /// The poll thread serving the queue (set once it is assigned).
    pub(crate) thread: std::sync::OnceLock<Arc<ThreadState>>,
    /// The submitter spins in a wait, looking at its used ring itself:
    /// a poll thread sharing its CPU gives the CPU back at once.
    pub(crate) spinning: std::sync::atomic::AtomicBool,
    /// The value `cq.idx` starts from: the ring's used index or position
    /// when the doorbells were set up.
    pub(crate) cq_start: u16,
    /// A packed ring's used side, for the poll thread's re-check before it
    /// sleeps (spec 10.3): `cq.idx` holds a position, which repeats every
    /// two laps, so only the flags of the descriptor at the submitter's
    /// next used position can say that nothing is left to take.
    pub(crate) packed: Option<UsedFlags>,
}

impl DoorbellCell for QueueShared {
    fn idx(&self) -> &AtomicU16 {
        self.mailbox.idx()
    }
    fn flags(&self) -> &AtomicU16 {
        self.mailbox.flags()
    }
}

impl QueueShared {
    pub(crate) fn new(
        queue: u16,
        size: u16,
        sq: GuestBell,
        cq: GuestBell,
        cq_start: u16,
        packed: Option<UsedFlags>,
    ) -> std::io::Result<Self> {
        Ok(Self {
            queue,
            size,
            mailbox: Doorbell::new(),
            wake: EventFd::new(EFD_NONBLOCK)?,
            stats: Arc::new(StatsCell::new(queue)),
            sq,
            cq,
            thread: std::sync::OnceLock::new(),
            spinning: std::sync::atomic::AtomicBool::new(false),
            cq_start,
            packed,
        })
    }
}

/// The SQ doorbell of a queue, reached through its shared state (which
/// keeps the mapping).
#[derive(Debug)]
pub(crate) struct SqBell(pub(crate) Arc<QueueShared>);

/// The CQ doorbell of a queue, reached through its shared state.
#[derive(Debug)]
pub(crate) struct CqBell(pub(crate) Arc<QueueShared>);

impl DoorbellCell for SqBell {
    fn idx(&self) -> &AtomicU16 {
        self.0.sq.idx()
    }
    fn flags(&self) -> &AtomicU16 {
        self.0.sq.flags()
    }
}

impl DoorbellCell for CqBell {
    fn idx(&self) -> &AtomicU16 {
        self.0.cq.idx()
    }
    fn flags(&self) -> &AtomicU16 {
        self.0.cq.flags()
    }
}
