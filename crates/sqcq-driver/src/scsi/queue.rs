//! A virtio-scsi request queue: commands in, completions out.
//!
//! Every request uses a slot preallocated in driver memory for its request
//! and response headers, so nothing is allocated per I/O. The submitter's
//! token travels with the slot and comes back in its [`Completion`].
//!
//! A slot's block is laid out as Linux's `struct virtio_scsi_cmd` and SPDK's
//! `virtio_scsi_io_ctx`: the request header, then the response right after
//! it (4-aligned), the block starting a cache line of its own. With the
//! default 32-byte CDB the header (51 bytes) and the response's fixed part
//! (12 bytes) share that line, so a request costs the device one line to
//! read the header and write the response's status into, and the driver one
//! line to write the header and read the status from; no two slots share a
//! line. With header and response on lines of their own, the device
//! misses on the write of every response status (docs/benchmarks.md,
//! "Driver: request header and response in one cache line").

use vm_memory::GuestAddress;

use sqcq_wire::scsi::{
    CMD_REQ_FIXED, CMD_RESP_FIXED, CmdResp, Lun, Response, ScsiConfig, TaskAttr, encode_cmd_req,
};

use super::sense::STATUS_GOOD;
use super::{Cdb, Sense};
use crate::memory::{CACHE_LINE, DriverMemory, MemoryError};
use crate::notify::NotifyCounters;
pub use crate::slots::QueueFailure;
use crate::slots::{Reaped, SlotError, Slots};
use crate::virtqueue::Virtqueue;
use crate::vring::shared::SharedWindow;
use crate::vring::{Buffer, QueueError};

/// The data phase of a command.
#[derive(Debug, Clone, Copy)]
pub enum Data<'a> {
    /// No data.
    None,
    /// Data to the device (WRITE): device-readable buffers.
    ToDevice(&'a [Buffer]),
    /// Data from the device (READ): device-writable buffers.
    FromDevice(&'a [Buffer]),
}

/// A SCSI command to submit.
#[derive(Debug, Clone, Copy)]
pub struct Command<'a> {
    /// The logical unit.
    pub lun: Lun,
    /// The CDB.
    pub cdb: Cdb,
    /// The data phase.
    pub data: Data<'a>,
    /// The task attribute.
    pub attr: TaskAttr,
}

impl<'a> Command<'a> {
    /// A SIMPLE command.
    pub fn new(lun: Lun, cdb: Cdb, data: Data<'a>) -> Self {
        Self {
            lun,
            cdb,
            data,
            attr: TaskAttr::Simple,
        }
    }
}

/// A command that completed with GOOD status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Done {
    /// Bytes of the data phase not transferred.
    pub resid: u32,
}

/// Why a command did not complete with GOOD status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// The transport failed the command (virtio-scsi `response` not OK).
    #[error("virtio-scsi response {0:?}")]
    Response(Response),
    /// The target completed it with a status other than GOOD.
    #[error("SCSI status {status:#04x}{}", sense.map(|s| format!(" ({s})")).unwrap_or_default())]
    Status {
        /// The SCSI status.
        status: u8,
        /// The sense data, when there was some in a known format.
        sense: Option<Sense>,
    },
    /// The device reported fewer bytes written than a response header.
    #[error("response of {len} bytes is shorter than its header")]
    ShortResponse {
        /// The length the device reported.
        len: u32,
    },
    /// The queue failed (device error, hangup or timeout) while the
    /// command was in flight: it never completed.
    #[error("the queue failed with the command in flight")]
    QueueFailed,
}

/// A completed (or failed) command, with the submitter's token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The token given to [`ScsiQueue::submit`].
    pub token: u64,
    /// How it ended.
    pub result: Result<Done, CommandError>,
}

/// Why a command could not be submitted.
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
}

/// A virtio-scsi request queue over a [`Virtqueue`].
#[derive(Debug)]
pub struct ScsiQueue {
    /// The slots, each with the submitter's token.
    slots: Slots<u64>,
    cdb_size: usize,
    req_len: u32,
    resp_len: u32,
    /// The slots' command blocks (header, then response).
    blocks: Blocks,
    header: Vec<u8>,
    out: Vec<Buffer>,
    in_: Vec<Buffer>,
}

impl ScsiQueue {
    /// Wraps `vq`, allocating one request and one response header per
    /// descriptor of its ring in `mem`, sized for `config`'s CDB and sense
    /// sizes.
    pub fn new(
        mem: &mut DriverMemory,
        vq: Virtqueue,
        config: &ScsiConfig,
    ) -> Result<Self, MemoryError> {
        let slots = vq.ring().size();
        let free = mem.free_bytes();
        let too_big = || MemoryError::OutOfMemory {
            len: usize::MAX,
            align: 8,
            free,
        };
        // Header lengths in u32 (what a descriptor holds) and usize.
        let lens = |prefix: usize, var: u32| {
            let len = u32::try_from(prefix).ok()?.checked_add(var)?;
            Some((len, usize::try_from(len).ok()?))
        };
        let (req_len, req_bytes) = lens(CMD_REQ_FIXED, config.cdb_size).ok_or_else(too_big)?;
        let (resp_len, resp_bytes) = lens(CMD_RESP_FIXED, config.sense_size).ok_or_else(too_big)?;
        // Each slot's block on lines of its own: the header, then the
        // response at the next 4-byte boundary (its u32 fields aligned).
        let resp_at = req_bytes.next_multiple_of(4);
        let stride = (resp_at + resp_bytes).next_multiple_of(CACHE_LINE);
        let area = stride.checked_mul(usize::from(slots)).ok_or_else(too_big)?;
        let base = mem.alloc(area, CACHE_LINE as u64)?;
        let window = SharedWindow::new(mem, base, area)?;
        Ok(Self {
            slots: Slots::new(vq),
            cdb_size: req_bytes - CMD_REQ_FIXED,
            req_len,
            resp_len,
            blocks: Blocks {
                base,
                stride,
                resp_at,
                window,
                buf: vec![0; resp_bytes],
            },
            header: vec![0; req_bytes],
            out: Vec::new(),
            in_: Vec::new(),
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

    /// Commands submitted and not yet completed.
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

    /// Asks the device to call on the next completion (EVENT_IDX: once
    /// the used index passes what this queue has consumed, as Linux's
    /// `virtqueue_enable_cb`) and returns whether completions arrived
    /// meanwhile. For a caller that reaps with [`Self::reap`] and decides
    /// on calls itself; [`Self::wait_and_reap`] leaves interrupt
    /// suppression to the queue's notification mode, which may change it.
    pub fn enable_interrupts(&mut self) -> bool {
        self.slots.enable_interrupts()
    }

    /// Adds a command, reported back with `token` (also its SCSI tag). It
    /// reaches the device at the next [`Self::publish`].
    pub fn submit(&mut self, cmd: &Command<'_>, token: u64) -> Result<(), SubmitError> {
        let slot = self.slots.take()?;
        encode_cmd_req(
            &mut self.header,
            cmd.lun,
            token,
            cmd.attr,
            cmd.cdb.as_bytes(),
            self.cdb_size,
        );
        let req = self.blocks.store_header(slot, &self.header);
        self.out.clear();
        self.in_.clear();
        self.out.push(Buffer::new(req, self.req_len));
        self.in_
            .push(Buffer::new(self.blocks.response(slot), self.resp_len));
        match cmd.data {
            Data::None => {}
            Data::ToDevice(bufs) => self.out.extend_from_slice(bufs),
            Data::FromDevice(bufs) => self.in_.extend_from_slice(bufs),
        }
        Ok(self.slots.commit(slot, token, &self.out, &self.in_)?)
    }

    /// Makes the submitted commands visible to the device and notifies it
    /// as the queue's mode decides. On failure every command in flight is
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
        self.slots
            .reap(|r| self.blocks.deliver(r, &mut on_complete))
    }

    /// Waits (bounded by the queue's timeout, woken by a socket hangup)
    /// until completions arrive, then reaps them as [`Self::reap`]. Returns
    /// at once when nothing is in flight. On failure every command in
    /// flight is failed through `on_complete` before the error returns.
    pub fn wait_and_reap(
        &mut self,
        mut on_complete: impl FnMut(Completion),
    ) -> Result<usize, QueueFailure> {
        self.slots
            .wait_and_reap(|r| self.blocks.deliver(r, &mut on_complete))
    }

    /// Fails every command in flight, for when the caller gives up on the
    /// device (for instance after another queue of it failed).
    pub fn abandon(&mut self, mut on_complete: impl FnMut(Completion)) {
        self.slots.abandon(|r| {
            on_complete(failed(r));
            Ok(())
        });
    }
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

/// The completion of a command the queue gave up on.
fn failed(r: Reaped<u64>) -> Completion {
    let (Reaped::Used { info, .. } | Reaped::Failed { info }) = r;
    Completion {
        token: info,
        result: Err(CommandError::QueueFailed),
    }
}

/// The command blocks, one per slot (see the module docs), and a buffer
/// to read a response into.
#[derive(Debug)]
struct Blocks {
    base: GuestAddress,
    stride: usize,
    /// Offset of the response in a block.
    resp_at: usize,
    /// The blocks' area: headers written, responses read, through atomics.
    window: SharedWindow,
    buf: Vec<u8>,
}

impl Blocks {
    /// Writes `header` at the start of `slot`'s block; returns its
    /// guest-physical address.
    fn store_header(&self, slot: u16, header: &[u8]) -> GuestAddress {
        // Inside the area allocated in `ScsiQueue::new`: slot < size, and
        // the header rounded up to 8 bytes fits the block. The padding of
        // that last word lands on the first bytes of the response, which
        // the device has not been handed yet.
        let at = usize::from(slot) * self.stride;
        self.window.store_bytes(at, header);
        GuestAddress(self.base.0 + at as u64)
    }

    /// Guest-physical address of `slot`'s response.
    fn response(&self, slot: u16) -> GuestAddress {
        // Inside the area: slot < size.
        GuestAddress(self.base.0 + (usize::from(slot) * self.stride + self.resp_at) as u64)
    }

    /// Turns what the slots reaped into a [`Completion`].
    fn deliver(
        &mut self,
        r: Reaped<u64>,
        on_complete: &mut impl FnMut(Completion),
    ) -> Result<(), vm_memory::GuestMemoryError> {
        match r {
            Reaped::Used { slot, info, len } => {
                let result = self.complete(slot, len)?;
                on_complete(Completion {
                    token: info,
                    result,
                });
            }
            Reaped::Failed { .. } => on_complete(failed(r)),
        }
        Ok(())
    }

    /// Reads and interprets the response of `slot`, of which the device
    /// wrote `len` bytes (validated by the ring against the buffers).
    fn complete(
        &mut self,
        slot: u16,
        len: u32,
    ) -> Result<Result<Done, CommandError>, vm_memory::GuestMemoryError> {
        if usize::try_from(len).is_ok_and(|len| len < CMD_RESP_FIXED) {
            return Ok(Err(CommandError::ShortResponse { len }));
        }
        // The fixed part only (one cache line the device just wrote); the
        // sense bytes only when there is a status to explain. Inside the
        // area: slot < size, and the whole response rounded up to 8 bytes
        // fits the stride (a multiple of 64).
        let at = usize::from(slot) * self.stride + self.resp_at;
        self.window.load_bytes(at, &mut self.buf[..CMD_RESP_FIXED]);
        let Some(resp) = CmdResp::parse(&self.buf) else {
            return Ok(Err(CommandError::ShortResponse { len }));
        };
        if resp.response != Response::Ok {
            return Ok(Err(CommandError::Response(resp.response)));
        }
        if resp.status != STATUS_GOOD {
            let sense_len = usize::try_from(resp.sense_len).unwrap_or(0);
            let sense_end = CMD_RESP_FIXED + sense_len;
            // Again from the start of the response; only the sense bytes
            // of this second read are used.
            self.window.load_bytes(at, &mut self.buf[..sense_end]);
            let sense = Sense::parse(&self.buf[CMD_RESP_FIXED..sense_end]);
            return Ok(Err(CommandError::Status {
                status: resp.status,
                sense,
            }));
        }
        Ok(Ok(Done { resid: resp.resid }))
    }
}
