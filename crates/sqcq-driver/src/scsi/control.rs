//! The virtio-scsi control queue: task management functions, one at a
//! time.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use sqcq_wire::scsi::{Lun, Response, TMF_REQ_SIZE, TMF_RESP_SIZE, Tmf, encode_tmf_req};

use super::queue::QueueFailure;
use crate::memory::{DriverMemory, MemoryError};
use crate::virtqueue::Virtqueue;
use crate::vring::{Buffer, QueueError};

/// [`TMF_REQ_SIZE`] as a descriptor length.
const TMF_REQ_BYTES: u32 = 24;
const _: () = assert!(TMF_REQ_BYTES as usize == TMF_REQ_SIZE);
/// [`TMF_RESP_SIZE`] as a descriptor length.
const TMF_RESP_BYTES: u32 = 1;
const _: () = assert!(TMF_RESP_BYTES as usize == TMF_RESP_SIZE);

/// Why a task management function got no response.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The ring refused the request.
    #[error("the control ring refused the request")]
    Queue(#[source] QueueError),
    /// Reading or writing the request or response failed.
    #[error("accessing the control request failed")]
    Memory(#[source] vm_memory::GuestMemoryError),
    /// The queue failed (device error, hangup, timeout).
    #[error("the control queue failed")]
    Failed(#[source] QueueFailure),
    /// The device completed the request with a response of no bytes.
    #[error("empty task management response")]
    EmptyResponse,
}

/// The control queue of a virtio-scsi device.
#[derive(Debug)]
pub struct ControlQueue {
    vq: Virtqueue,
    mem: GuestMemoryMmap,
    req: GuestAddress,
    resp: GuestAddress,
    failed: bool,
}

impl ControlQueue {
    /// Wraps `vq`, allocating one request and response in `mem`.
    pub fn new(mem: &mut DriverMemory, vq: Virtqueue) -> Result<Self, MemoryError> {
        let req = mem.alloc(TMF_REQ_SIZE, 8)?;
        let resp = mem.alloc(8, 8)?;
        Ok(Self {
            vq,
            mem: mem.guest_memory().clone(),
            req,
            resp,
            failed: false,
        })
    }

    /// The virtqueue underneath.
    pub fn virtqueue(&self) -> &Virtqueue {
        &self.vq
    }

    /// Sends `tmf` for `lun` (and the command `tag`, for ABORT TASK and
    /// QUERY TASK) and waits, bounded by the queue's timeout, for the
    /// device's response.
    pub fn task_management(
        &mut self,
        tmf: Tmf,
        lun: Lun,
        tag: u64,
    ) -> Result<Response, ControlError> {
        if self.failed {
            return Err(ControlError::Failed(QueueFailure::AlreadyFailed));
        }
        let req = encode_tmf_req(tmf, lun, tag);
        self.mem
            .write_slice(&req, self.req)
            .map_err(ControlError::Memory)?;
        self.mem
            .write_obj(0xffu8, self.resp)
            .map_err(ControlError::Memory)?;
        let out = [Buffer::new(self.req, TMF_REQ_BYTES)];
        let in_ = [Buffer::new(self.resp, TMF_RESP_BYTES)];
        self.vq
            .ring_mut()
            .add(&out, &in_, 0)
            .map_err(ControlError::Queue)?;
        let result = self.complete();
        if matches!(result, Err(ControlError::Failed(_))) {
            self.failed = true;
            self.vq.ring_mut().fail_in_flight(|_| {});
        }
        result
    }

    fn complete(&mut self) -> Result<Response, ControlError> {
        let failed = |e| ControlError::Failed(QueueFailure::Notify(e));
        self.vq.publish().map_err(failed)?;
        loop {
            self.vq.wait().map_err(failed)?;
            if let Some(used) = self.vq.ring_mut().pop_used() {
                let used = used.map_err(|e| ControlError::Failed(QueueFailure::Device(e)))?;
                if used.len == 0 {
                    return Err(ControlError::EmptyResponse);
                }
                let byte: u8 = self.mem.read_obj(self.resp).map_err(ControlError::Memory)?;
                return Ok(Response::from_byte(byte));
            }
        }
    }
}
