//! The virtio-scsi control queue: task management functions and
//! asynchronous notification requests, one at a time.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use sqcq_wire::scsi::{
    AN_REQ_SIZE, AN_RESP_SIZE, AnResp, Lun, Response, TMF_REQ_SIZE, TMF_RESP_SIZE, Tmf,
    encode_an_req, encode_tmf_req,
};

use super::queue::QueueFailure;
use crate::memory::{DriverMemory, MemoryError};
use crate::notify::NotifyCounters;
use crate::virtqueue::Virtqueue;
use crate::vring::{Buffer, QueueError};

/// [`TMF_RESP_SIZE`] as a descriptor length.
const TMF_RESP_BYTES: u32 = 1;
const _: () = assert!(TMF_RESP_BYTES as usize == TMF_RESP_SIZE);
/// [`AN_RESP_SIZE`] as a descriptor length.
const AN_RESP_BYTES: u32 = 5;
const _: () = assert!(AN_RESP_BYTES as usize == AN_RESP_SIZE);

/// Why a control request got no response.
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
        let req = mem.alloc(TMF_REQ_SIZE.max(AN_REQ_SIZE), 8)?;
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

    /// The notification counters so far.
    pub fn counters(&mut self) -> NotifyCounters {
        self.vq.counters()
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
        let resp = self.request(&encode_tmf_req(tmf, lun, tag), TMF_RESP_BYTES)?;
        Ok(Response::from_byte(resp[0]))
    }

    /// Sends an asynchronous notification query (`kind`
    /// [`CTRL_AN_QUERY`](sqcq_wire::scsi::CTRL_AN_QUERY)) or subscription
    /// ([`CTRL_AN_SUBSCRIBE`](sqcq_wire::scsi::CTRL_AN_SUBSCRIBE)) for the
    /// event classes in `events`, and waits, bounded by the queue's
    /// timeout, for the device's response.
    pub fn async_notification(
        &mut self,
        kind: u32,
        lun: Lun,
        events: u32,
    ) -> Result<AnResp, ControlError> {
        let resp = self.request(&encode_an_req(kind, lun, events), AN_RESP_BYTES)?;
        let mut bytes = [0; AN_RESP_SIZE];
        bytes.copy_from_slice(&resp[..AN_RESP_SIZE]);
        Ok(AnResp::decode(&bytes))
    }

    /// Sends `req` with a response buffer of `resp_len` bytes (at most 8)
    /// and returns the response buffer once the device completed it.
    fn request(&mut self, req: &[u8], resp_len: u32) -> Result<[u8; 8], ControlError> {
        if self.failed {
            return Err(ControlError::Failed(QueueFailure::AlreadyFailed));
        }
        self.mem
            .write_slice(req, self.req)
            .map_err(ControlError::Memory)?;
        self.mem
            .write_obj([0xffu8; 8], self.resp)
            .map_err(ControlError::Memory)?;
        // At most TMF_REQ_SIZE bytes: fits.
        let req_len = u32::try_from(req.len()).unwrap_or(u32::MAX);
        let out = [Buffer::new(self.req, req_len)];
        let in_ = [Buffer::new(self.resp, resp_len)];
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

    fn complete(&mut self) -> Result<[u8; 8], ControlError> {
        let failed = |e| ControlError::Failed(QueueFailure::Notify(e));
        self.vq.publish().map_err(failed)?;
        loop {
            self.vq.wait().map_err(failed)?;
            if let Some(used) = self.vq.ring_mut().pop_used() {
                let used = used.map_err(|e| ControlError::Failed(QueueFailure::Device(e)))?;
                if used.len == 0 {
                    return Err(ControlError::EmptyResponse);
                }
                return self.mem.read_obj(self.resp).map_err(ControlError::Memory);
            }
        }
    }
}
