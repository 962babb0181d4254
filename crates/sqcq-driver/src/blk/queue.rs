//! A virtio-blk request queue: requests in, completions out.
//!
//! Every request uses a slot preallocated in driver memory for its header,
//! its status byte and its discard or write-zeroes segments, so nothing is
//! allocated per I/O. Before a request goes out its status byte is set to
//! a value no device may write ([`STATUS_UNWRITTEN`]), so that a device
//! completing without writing the status is told apart from one writing a
//! wrong status.
//!
//! A slot's block starts a cache line of its own with the header and the
//! status byte right after it, as Linux's `struct virtblk_req` has them:
//! the device reads the header and writes the status in one line, and the
//! driver writes the one and reads the other there. The segments follow
//! at [`SEGMENTS_AT`]; no two slots share a line.

use vm_memory::GuestAddress;

use sqcq_wire::blk::{HEADER_SIZE, RequestHeader, RequestType, SEGMENT_SIZE, Segment, Status};

use crate::memory::{CACHE_LINE, DriverMemory, MemoryError};
use crate::notify::NotifyCounters;
use crate::slots::{QueueFailure, Reaped, SlotError, Slots};
use crate::virtqueue::Virtqueue;
use crate::vring::shared::SharedWindow;
use crate::vring::{Buffer, QueueError};

/// Most segments of one DISCARD or WRITE_ZEROES request (devices offer
/// fewer: sqcqd and qemu-storage-daemon take one).
pub const MAX_SEGMENTS: usize = 8;
/// The status byte as the driver leaves it: not a `VIRTIO_BLK_S_*` value.
const STATUS_UNWRITTEN: u8 = 0xff;
/// Offset of the status byte in a slot's block: right after the header.
const STATUS_AT: usize = HEADER_SIZE;
/// Offset of the segments in a slot's block: after the status byte, on a
/// word of their own (the status is stored as a padded word).
const SEGMENTS_AT: usize = (STATUS_AT + 1).next_multiple_of(16);
/// Bytes of a slot's block: header, status and segments.
const SLOT_BYTES: usize = SEGMENTS_AT + MAX_SEGMENTS * SEGMENT_SIZE;
/// Distance between two slots' blocks: whole cache lines, so that no two
/// requests share one.
const SLOT_STRIDE: usize = SLOT_BYTES.next_multiple_of(CACHE_LINE);
/// [`HEADER_SIZE`] as a descriptor length.
const HEADER_LEN: u32 = 16;
const _: () = assert!(HEADER_LEN as usize == HEADER_SIZE);
/// [`SEGMENT_SIZE`] as a descriptor length.
const SEGMENT_LEN: u32 = 16;
const _: () = assert!(SEGMENT_LEN as usize == SEGMENT_SIZE);

/// A virtio-blk request to submit. Sectors are 512 bytes whatever the
/// device's block size.
#[derive(Debug, Clone, Copy)]
pub enum Request<'a> {
    /// VIRTIO_BLK_T_IN: read from `sector` into the device-writable
    /// `data` (a multiple of 512 bytes).
    Read {
        /// First sector.
        sector: u64,
        /// Where the data goes.
        data: &'a [Buffer],
    },
    /// VIRTIO_BLK_T_OUT: write `data` (a multiple of 512 bytes) at
    /// `sector`.
    Write {
        /// First sector.
        sector: u64,
        /// The data.
        data: &'a [Buffer],
    },
    /// VIRTIO_BLK_T_FLUSH.
    Flush,
    /// VIRTIO_BLK_T_GET_ID: the device's serial into `id` (the
    /// specification's [`ID_BYTES`](super::ID_BYTES)).
    GetId(Buffer),
    /// VIRTIO_BLK_T_DISCARD of up to [`MAX_SEGMENTS`] ranges.
    Discard(&'a [Segment]),
    /// VIRTIO_BLK_T_WRITE_ZEROES of up to [`MAX_SEGMENTS`] ranges, each
    /// with [`WRITE_ZEROES_FLAG_UNMAP`](super::WRITE_ZEROES_FLAG_UNMAP)
    /// or not.
    WriteZeroes(&'a [Segment]),
}

impl Request<'_> {
    fn kind(&self) -> RequestType {
        match self {
            Self::Read { .. } => RequestType::In,
            Self::Write { .. } => RequestType::Out,
            Self::Flush => RequestType::Flush,
            Self::GetId(_) => RequestType::GetId,
            Self::Discard(_) => RequestType::Discard,
            Self::WriteZeroes(_) => RequestType::WriteZeroes,
        }
    }

    fn sector(&self) -> u64 {
        match self {
            Self::Read { sector, .. } | Self::Write { sector, .. } => *sector,
            _ => 0,
        }
    }
}

/// A request that completed with VIRTIO_BLK_S_OK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Done {
    /// Bytes the device reports having written besides the status byte
    /// (the data of a read or GET_ID; 0 otherwise, for a well-behaved
    /// device).
    pub bytes: u32,
}

/// Why a request did not complete with VIRTIO_BLK_S_OK. Everything but
/// [`Self::Status`] and [`Self::QueueFailed`] is a device breaking the
/// specification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The device answered VIRTIO_BLK_S_IOERR or VIRTIO_BLK_S_UNSUPP.
    #[error("virtio-blk status {0:?}")]
    Status(Status),
    /// The device wrote a status byte the specification does not define.
    #[error("unknown virtio-blk status {0:#04x}")]
    UnknownStatus(u8),
    /// The device completed the request without writing its status byte.
    #[error("the device did not write the status byte")]
    StatusNotWritten,
    /// The used length cannot cover what the request needs written: no
    /// byte at all, or a read completed OK with less than its data.
    #[error("used length {len} is shorter than the {needed} bytes the request needs")]
    UsedTooShort {
        /// The length the device reported.
        len: u32,
        /// The bytes the request needs written.
        needed: u32,
    },
    /// The queue failed (device error, hangup or timeout) while the
    /// request was in flight: it never completed.
    #[error("the queue failed with the request in flight")]
    QueueFailed,
}

/// A completed (or failed) request, with the submitter's token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The token given to [`BlkQueue::submit`].
    pub token: u64,
    /// How it ended.
    pub result: Result<Done, RequestError>,
}

/// Why a request could not be submitted.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// Every slot or descriptor is in use: reap completions first.
    #[error("the queue is full")]
    Full,
    /// The ring refused the request.
    #[error("the ring refused the request")]
    Queue(#[source] QueueError),
    /// The queue failed earlier; it takes no more requests.
    #[error("the queue has failed")]
    Failed,
    /// A read or write without data, or of a length that is not a whole
    /// number of sectors.
    #[error("a read or write of {len} bytes is not a positive multiple of 512")]
    DataLength {
        /// The data's total length.
        len: u64,
    },
    /// A discard or write zeroes without segments or with more than
    /// [`MAX_SEGMENTS`].
    #[error("{count} segments; 1 to {MAX_SEGMENTS} fit a request")]
    Segments {
        /// Segments given.
        count: usize,
    },
}

impl From<SlotError> for SubmitError {
    fn from(e: SlotError) -> Self {
        match e {
            SlotError::Full => Self::Full,
            SlotError::Failed => Self::Failed,
            SlotError::Queue(e) => Self::Queue(e),
        }
    }
}

/// What a slot remembers of its request.
#[derive(Debug, Clone, Copy, Default)]
struct Pending {
    token: u64,
    /// Bytes a successful completion must report beyond the status
    /// (a read's data), 0 when the device may write less.
    must_write: u32,
}

/// A virtio-blk request queue over a [`Virtqueue`].
#[derive(Debug)]
pub struct BlkQueue {
    slots: Slots<Pending>,
    /// Per slot: header, status and segments, [`SLOT_STRIDE`] apart.
    base: GuestAddress,
    /// The slots' area, accessed through atomics.
    window: SharedWindow,
    /// A slot's header and status byte as written.
    header: [u8; STATUS_AT + 1],
    /// A slot's segments as written.
    segments: [u8; MAX_SEGMENTS * SEGMENT_SIZE],
    out: Vec<Buffer>,
    in_: Vec<Buffer>,
}

impl BlkQueue {
    /// Wraps `vq`, allocating per descriptor of its ring a header, a
    /// status byte and room for [`MAX_SEGMENTS`] segments, in `mem`.
    pub fn new(mem: &mut DriverMemory, vq: Virtqueue) -> Result<Self, MemoryError> {
        let slots = usize::from(vq.ring().size());
        // At most 32768 slots of 192 bytes: no overflow.
        let area = SLOT_STRIDE * slots;
        let base = mem.alloc(area, CACHE_LINE as u64)?;
        Ok(Self {
            slots: Slots::new(vq),
            window: SharedWindow::new(mem, base, area)?,
            base,
            header: [0; STATUS_AT + 1],
            segments: [0; MAX_SEGMENTS * SEGMENT_SIZE],
            out: Vec::with_capacity(2),
            in_: Vec::with_capacity(2),
        })
    }

    /// Whether a hangup of the device leaves the requests in flight
    /// instead of failing them: the caller reconnects (with in-flight
    /// tracking, [`crate::Frontend::track_inflight`]), hands the queue to
    /// the new connection and calls [`Self::reattach`]; the device
    /// resubmits what it had taken. The wait that saw the hangup returns
    /// `QueueFailure::Notify(NotifyError::Hangup)`.
    pub fn survive_hangup(&mut self, on: bool) {
        self.slots.survive_hangup(on);
    }

    /// Follows the new connection after a hangup (see
    /// [`Self::survive_hangup`]).
    pub fn reattach(&mut self, hangup: std::os::fd::OwnedFd) {
        self.slots.reattach(hangup);
    }

    /// The virtqueue underneath (for the frontend's set-up and counters).
    pub fn virtqueue(&self) -> &Virtqueue {
        self.slots.virtqueue()
    }

    /// With nothing in flight, tells the queue its submitter stops
    /// waiting for a while ([`Virtqueue::park`]).
    pub fn park(&mut self) {
        self.slots.park();
    }

    /// Whether the device asks for no more requests for now (THROTTLE,
    /// doorbell modes): as the last publication read it, or with `fresh`
    /// read again now. A submitter that honours it submits nothing more
    /// while it is set and something is in flight, and asks again
    /// (`fresh`) after each reap ([`Virtqueue::throttle`]).
    pub fn throttle(&mut self, fresh: bool) -> bool {
        self.slots.throttle(fresh)
    }

    /// Requests submitted and not yet completed.
    pub fn in_flight(&self) -> u16 {
        self.slots.in_flight()
    }

    /// Whether the queue has failed.
    pub fn failed(&self) -> bool {
        self.slots.failed()
    }

    /// The notification counters so far.
    pub fn counters(&mut self) -> NotifyCounters {
        self.slots.counters()
    }

    /// Adds `req` with I/O priority 0, reported back with `token`. It
    /// reaches the device at the next [`Self::publish`].
    pub fn submit(&mut self, req: &Request<'_>, token: u64) -> Result<(), SubmitError> {
        self.submit_with_priority(req, 0, token)
    }

    /// Adds `req` with the I/O priority `ioprio` (a hint devices may
    /// ignore), reported back with `token`.
    pub fn submit_with_priority(
        &mut self,
        req: &Request<'_>,
        ioprio: u32,
        token: u64,
    ) -> Result<(), SubmitError> {
        let (segments, must_write) = match req {
            Request::Read { data, .. } | Request::Write { data, .. } => {
                let len = data.iter().map(|b| u64::from(b.len)).sum::<u64>();
                if len == 0 || len % sqcq_wire::blk::SECTOR_SIZE != 0 {
                    return Err(SubmitError::DataLength { len });
                }
                let must = matches!(req, Request::Read { .. });
                // A chain's length fits u32 or the ring refuses it.
                (
                    &[][..],
                    if must {
                        u32::try_from(len).unwrap_or(0)
                    } else {
                        0
                    },
                )
            }
            Request::Discard(s) | Request::WriteZeroes(s) => {
                if s.is_empty() || s.len() > MAX_SEGMENTS {
                    return Err(SubmitError::Segments { count: s.len() });
                }
                (*s, 0)
            }
            Request::Flush | Request::GetId(_) => (&[][..], 0),
        };
        let slot = self.slots.take()?;
        let header = RequestHeader {
            kind: req.kind(),
            ioprio,
            sector: req.sector(),
        };
        self.header[..HEADER_SIZE].copy_from_slice(&header.encode());
        self.header[STATUS_AT] = STATUS_UNWRITTEN;
        // Inside the area allocated in `new`: slot < size, and what is
        // written, rounded up to 8 bytes, fits the slot's block (the
        // status word's padding ends before the segments).
        let at = usize::from(slot) * SLOT_STRIDE;
        let req_addr = GuestAddress(self.base.0 + at as u64);
        self.window.store_bytes(at, &self.header);
        let status = GuestAddress(req_addr.0 + STATUS_AT as u64);
        for (i, s) in segments.iter().enumerate() {
            let at = i * SEGMENT_SIZE;
            self.segments[at..at + SEGMENT_SIZE].copy_from_slice(&s.encode());
        }
        let segments_len = segments.len() * SEGMENT_SIZE;
        if segments_len > 0 {
            self.window
                .store_bytes(at + SEGMENTS_AT, &self.segments[..segments_len]);
        }
        self.out.clear();
        self.in_.clear();
        self.out.push(Buffer::new(req_addr, HEADER_LEN));
        match req {
            Request::Read { data, .. } => self.in_.extend_from_slice(data),
            Request::Write { data, .. } => self.out.extend_from_slice(data),
            Request::GetId(id) => self.in_.push(*id),
            Request::Discard(_) | Request::WriteZeroes(_) => {
                // At most MAX_SEGMENTS segments of 16 bytes.
                let len = u32::try_from(segments.len()).unwrap_or(0) * SEGMENT_LEN;
                self.out.push(Buffer::new(
                    GuestAddress(req_addr.0 + SEGMENTS_AT as u64),
                    len,
                ));
            }
            Request::Flush => {}
        }
        self.in_.push(Buffer::new(status, 1));
        let pending = Pending { token, must_write };
        Ok(self.slots.commit(slot, pending, &self.out, &self.in_)?)
    }

    /// Makes the submitted requests visible to the device and notifies it
    /// as the queue's mode decides. On failure every request in flight is
    /// failed through `on_complete`.
    pub fn publish(&mut self, mut on_complete: impl FnMut(Completion)) -> Result<(), QueueFailure> {
        self.slots.publish(|r| {
            on_complete(failed(r));
            Ok(())
        })
    }

    /// Hands every completion the device has published to `on_complete`
    /// and returns how many there were, without waiting.
    pub fn reap(&mut self, mut on_complete: impl FnMut(Completion)) -> Result<usize, QueueFailure> {
        let window = &self.window;
        self.slots.reap(|r| deliver(r, window, &mut on_complete))
    }

    /// Waits (bounded by the queue's timeout, woken by a socket hangup)
    /// until completions arrive, then reaps them as [`Self::reap`]. Returns
    /// at once when nothing is in flight. On failure every request in
    /// flight is failed through `on_complete` before the error returns.
    pub fn wait_and_reap(
        &mut self,
        mut on_complete: impl FnMut(Completion),
    ) -> Result<usize, QueueFailure> {
        let window = &self.window;
        self.slots
            .wait_and_reap(|r| deliver(r, window, &mut on_complete))
    }

    /// Fails every request in flight, for when the caller gives up on the
    /// device (for instance after another queue of it failed).
    pub fn abandon(&mut self, mut on_complete: impl FnMut(Completion)) {
        self.slots.abandon(|r| {
            on_complete(failed(r));
            Ok(())
        });
    }
}

/// The completion of a request the queue gave up on.
fn failed(r: Reaped<Pending>) -> Completion {
    let (Reaped::Used { info, .. } | Reaped::Failed { info }) = r;
    Completion {
        token: info.token,
        result: Err(RequestError::QueueFailed),
    }
}

/// Turns what the slots reaped into a [`Completion`], reading the status
/// byte of the slot from its block.
fn deliver(
    r: Reaped<Pending>,
    window: &SharedWindow,
    on_complete: &mut impl FnMut(Completion),
) -> Result<(), vm_memory::GuestMemoryError> {
    let Reaped::Used { slot, info, len } = r else {
        on_complete(failed(r));
        return Ok(());
    };
    let mut status = [0u8];
    // Inside the area: slot < size, and the status's word lies in the
    // slot's block.
    window.load_bytes(usize::from(slot) * SLOT_STRIDE + STATUS_AT, &mut status);
    let [status] = status;
    on_complete(Completion {
        token: info.token,
        result: interpret(status, len, info.must_write),
    });
    Ok(())
}

/// What a completion with `status` and used length `len` means for a
/// request that must see `must_write` data bytes written when it
/// succeeds. The used length counts the status byte, so 0 never
/// completes a request.
fn interpret(status: u8, len: u32, must_write: u32) -> Result<Done, RequestError> {
    if len == 0 {
        return Err(RequestError::UsedTooShort { len, needed: 1 });
    }
    match Status::from_byte(status) {
        Some(Status::Ok) => {
            let needed = must_write.saturating_add(1);
            if len < needed {
                return Err(RequestError::UsedTooShort { len, needed });
            }
            Ok(Done { bytes: len - 1 })
        }
        Some(s) => Err(RequestError::Status(s)),
        None if status == STATUS_UNWRITTEN => Err(RequestError::StatusNotWritten),
        None => Err(RequestError::UnknownStatus(status)),
    }
}
