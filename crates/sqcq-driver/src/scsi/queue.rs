//! A virtio-scsi request queue: commands in, completions out.
//!
//! Every request uses a slot preallocated in driver memory for its request
//! and response headers, so nothing is allocated per I/O. The submitter's
//! token travels with the slot and comes back in its [`Completion`].

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use sqcq_wire::scsi::{
    CMD_REQ_FIXED, CMD_RESP_FIXED, CmdResp, Lun, Response, ScsiConfig, TaskAttr, encode_cmd_req,
};

use super::sense::STATUS_GOOD;
use super::{Cdb, Sense};
use crate::memory::{DriverMemory, MemoryError};
use crate::notify::{NotifyCounters, NotifyError};
use crate::virtqueue::Virtqueue;
use crate::vring::{Buffer, DeviceError, QueueError};

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
    /// Writing the request header failed.
    #[error("writing the request header failed")]
    Memory(#[source] vm_memory::GuestMemoryError),
    /// The queue failed earlier; it takes no more requests.
    #[error("the queue has failed")]
    Failed,
}

/// What ends a queue: the device broke the ring protocol, or could not be
/// notified or waited for. Every request in flight is failed with
/// [`CommandError::QueueFailed`].
#[derive(Debug, thiserror::Error)]
pub enum QueueFailure {
    /// The device broke the ring protocol.
    #[error("the device broke the virtqueue")]
    Device(#[source] DeviceError),
    /// Kicking, waiting or the socket failed, or the wait timed out.
    #[error("notification failed")]
    Notify(#[source] NotifyError),
    /// Reading a response header failed.
    #[error("reading a response header failed")]
    Memory(#[source] vm_memory::GuestMemoryError),
    /// The queue had already failed.
    #[error("the queue has failed")]
    AlreadyFailed,
}

/// A virtio-scsi request queue over a [`Virtqueue`].
#[derive(Debug)]
pub struct ScsiQueue {
    vq: Virtqueue,
    mem: GuestMemoryMmap,
    cdb_size: usize,
    req_len: u32,
    resp_len: u32,
    req_base: GuestAddress,
    resp_base: GuestAddress,
    req_stride: u64,
    resp_stride: u64,
    /// The submitter's token of each slot.
    tokens: Box<[u64]>,
    free: Vec<u16>,
    header: Vec<u8>,
    response: Vec<u8>,
    out: Vec<Buffer>,
    in_: Vec<Buffer>,
    failed: bool,
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
        let req_stride = req_bytes.next_multiple_of(8);
        let resp_stride = resp_bytes.next_multiple_of(8);
        let area = |stride: usize| stride.checked_mul(usize::from(slots)).ok_or_else(too_big);
        let req_base = mem.alloc(area(req_stride)?, 64)?;
        let resp_base = mem.alloc(area(resp_stride)?, 64)?;
        Ok(Self {
            vq,
            mem: mem.guest_memory().clone(),
            cdb_size: req_bytes - CMD_REQ_FIXED,
            req_len,
            resp_len,
            req_base,
            resp_base,
            req_stride: req_stride as u64,
            resp_stride: resp_stride as u64,
            tokens: vec![0; usize::from(slots)].into_boxed_slice(),
            free: (0..slots).rev().collect(),
            header: vec![0; req_bytes],
            response: vec![0; resp_bytes],
            out: Vec::new(),
            in_: Vec::new(),
            failed: false,
        })
    }

    /// The virtqueue underneath (for the frontend's set-up and counters).
    pub fn virtqueue(&self) -> &Virtqueue {
        &self.vq
    }

    /// With nothing in flight, tells the queue its submitter stops
    /// waiting for a while ([`Virtqueue::park`]).
    pub fn park(&mut self) {
        self.vq.park();
    }

    /// Commands submitted and not yet completed.
    pub fn in_flight(&self) -> u16 {
        self.vq.ring().in_flight()
    }

    /// Whether the queue has failed.
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// The notification counters so far.
    pub fn counters(&mut self) -> NotifyCounters {
        self.vq.counters()
    }

    /// Asks the device to call on the next completion (EVENT_IDX: once
    /// the used index passes what this queue has consumed, as Linux's
    /// `virtqueue_enable_cb`) and returns whether completions arrived
    /// meanwhile. For a caller that reaps with [`Self::reap`] and decides
    /// on calls itself; [`Self::wait_and_reap`] leaves interrupt
    /// suppression to the queue's notification mode, which may change it.
    pub fn enable_interrupts(&mut self) -> bool {
        self.vq.ring_mut().enable_interrupts()
    }

    /// Adds a command, reported back with `token` (also its SCSI tag). It
    /// reaches the device at the next [`Self::publish`].
    pub fn submit(&mut self, cmd: &Command<'_>, token: u64) -> Result<(), SubmitError> {
        if self.failed {
            return Err(SubmitError::Failed);
        }
        let slot = self.free.pop().ok_or(SubmitError::Full)?;
        match self.add(cmd, token, slot) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.free.push(slot);
                Err(e)
            }
        }
    }

    fn add(&mut self, cmd: &Command<'_>, token: u64, slot: u16) -> Result<(), SubmitError> {
        encode_cmd_req(
            &mut self.header,
            cmd.lun,
            token,
            cmd.attr,
            cmd.cdb.as_bytes(),
            self.cdb_size,
        );
        let req = self.req_addr(slot);
        self.mem
            .write_slice(&self.header, req)
            .map_err(SubmitError::Memory)?;
        self.out.clear();
        self.in_.clear();
        self.out.push(Buffer::new(req, self.req_len));
        self.in_
            .push(Buffer::new(self.resp_addr(slot), self.resp_len));
        match cmd.data {
            Data::None => {}
            Data::ToDevice(bufs) => self.out.extend_from_slice(bufs),
            Data::FromDevice(bufs) => self.in_.extend_from_slice(bufs),
        }
        match self
            .vq
            .ring_mut()
            .add(&self.out, &self.in_, usize::from(slot))
        {
            Ok(_) => {
                self.tokens[usize::from(slot)] = token;
                Ok(())
            }
            Err(QueueError::NoFreeDescriptors { .. }) => Err(SubmitError::Full),
            Err(e) => Err(SubmitError::Queue(e)),
        }
    }

    /// Makes the submitted commands visible to the device and notifies it
    /// as the queue's mode decides. On failure every command in flight is
    /// failed through `on_complete`.
    pub fn publish(&mut self, on_complete: impl FnMut(Completion)) -> Result<(), QueueFailure> {
        if self.failed {
            return Err(QueueFailure::AlreadyFailed);
        }
        match self.vq.publish() {
            Ok(()) => Ok(()),
            Err(e) => Err(self.fail(QueueFailure::Notify(e), on_complete)),
        }
    }

    /// Hands every completion the device has published to `on_complete`
    /// and returns how many there were, without waiting.
    pub fn reap(&mut self, mut on_complete: impl FnMut(Completion)) -> Result<usize, QueueFailure> {
        if self.failed {
            return Err(QueueFailure::AlreadyFailed);
        }
        let mut n = 0;
        while let Some(used) = self.vq.ring_mut().pop_used() {
            let used = match used {
                Ok(used) => used,
                Err(e) => return Err(self.fail(QueueFailure::Device(e), on_complete)),
            };
            // The ring validated the id; tokens are slot numbers we gave.
            let slot = u16::try_from(used.token).unwrap_or(u16::MAX);
            let result = match self.complete(slot, used.len) {
                Ok(result) => result,
                Err(e) => return Err(self.fail(QueueFailure::Memory(e), on_complete)),
            };
            self.free.push(slot);
            n += 1;
            on_complete(Completion {
                token: self.tokens[usize::from(slot)],
                result,
            });
        }
        Ok(n)
    }

    /// Waits (bounded by the queue's timeout, woken by a socket hangup)
    /// until completions arrive, then reaps them as [`Self::reap`]. Returns
    /// at once when nothing is in flight. On failure every command in
    /// flight is failed through `on_complete` before the error returns.
    pub fn wait_and_reap(
        &mut self,
        mut on_complete: impl FnMut(Completion),
    ) -> Result<usize, QueueFailure> {
        if self.failed {
            return Err(QueueFailure::AlreadyFailed);
        }
        if self.in_flight() == 0 {
            return Ok(0);
        }
        if let Err(e) = self.vq.wait() {
            return Err(self.fail(QueueFailure::Notify(e), &mut on_complete));
        }
        self.reap(on_complete)
    }

    /// Fails every command in flight, for when the caller gives up on the
    /// device (for instance after another queue of it failed).
    pub fn abandon(&mut self, on_complete: impl FnMut(Completion)) {
        if !self.failed {
            let _ = self.fail(QueueFailure::AlreadyFailed, on_complete);
        }
    }

    fn fail(
        &mut self,
        failure: QueueFailure,
        mut on_complete: impl FnMut(Completion),
    ) -> QueueFailure {
        self.failed = true;
        let tokens = &self.tokens;
        let free = &mut self.free;
        self.vq.ring_mut().fail_in_flight(|slot| {
            let slot = u16::try_from(slot).unwrap_or(u16::MAX);
            free.push(slot);
            on_complete(Completion {
                token: tokens[usize::from(slot)],
                result: Err(CommandError::QueueFailed),
            });
        });
        failure
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
        let addr = self.resp_addr(slot);
        self.mem.read_slice(&mut self.response, addr)?;
        let Some(resp) = CmdResp::parse(&self.response) else {
            return Ok(Err(CommandError::ShortResponse { len }));
        };
        if resp.response != Response::Ok {
            return Ok(Err(CommandError::Response(resp.response)));
        }
        if resp.status != STATUS_GOOD {
            let sense_len = usize::try_from(resp.sense_len).unwrap_or(0);
            let sense_end = CMD_RESP_FIXED + sense_len;
            let sense = Sense::parse(&self.response[CMD_RESP_FIXED..sense_end]);
            return Ok(Err(CommandError::Status {
                status: resp.status,
                sense,
            }));
        }
        Ok(Ok(Done { resid: resp.resid }))
    }

    fn req_addr(&self, slot: u16) -> GuestAddress {
        // Inside the area allocated in `new`: slot < size.
        GuestAddress(self.req_base.0 + u64::from(slot) * self.req_stride)
    }

    fn resp_addr(&self, slot: u16) -> GuestAddress {
        GuestAddress(self.resp_base.0 + u64::from(slot) * self.resp_stride)
    }
}
