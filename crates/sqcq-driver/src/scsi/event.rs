//! The virtio-scsi event queue: buffers the device fills with events
//! (hot-plug, parameter changes), re-posted as soon as they are read, as
//! Linux's `virtscsi_kick_event` does.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use sqcq_wire::scsi::{EVENT_INFO_SIZE, EVENT_SIZE};

use super::queue::QueueFailure;
use crate::memory::{DriverMemory, MemoryError};
use crate::notify::NotifyCounters;
use crate::virtqueue::Virtqueue;
use crate::vring::{Buffer, QueueError};

/// Why no event could be read.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    /// The ring refused a buffer.
    #[error("the event ring refused a buffer")]
    Queue(#[source] QueueError),
    /// Reading an event failed.
    #[error("reading an event failed")]
    Memory(#[source] vm_memory::GuestMemoryError),
    /// The queue failed (device error, hangup, timeout).
    #[error("the event queue failed")]
    Failed(#[source] QueueFailure),
    /// The device completed a buffer with less than a whole event.
    #[error("an event of {len} bytes (a whole one is {EVENT_SIZE})")]
    Short {
        /// The length the device reported.
        len: u32,
    },
}

/// The event queue of a virtio-scsi device, with its event buffers.
#[derive(Debug)]
pub struct EventQueue {
    vq: Virtqueue,
    mem: GuestMemoryMmap,
    /// First of the buffers, [`EVENT_SIZE`] bytes apart.
    base: GuestAddress,
    buffers: u16,
    /// Buffers not given to the device.
    idle: Vec<u16>,
}

impl EventQueue {
    /// Wraps `vq`, allocating `buffers` event buffers in `mem`. They reach
    /// the device at [`Self::post`].
    pub fn new(mem: &mut DriverMemory, vq: Virtqueue, buffers: u16) -> Result<Self, MemoryError> {
        let base = mem.alloc(EVENT_SIZE * usize::from(buffers.max(1)), 8)?;
        Ok(Self {
            vq,
            mem: mem.guest_memory().clone(),
            base,
            buffers,
            idle: (0..buffers).rev().collect(),
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

    /// Makes every buffer the device does not hold available to it. Call
    /// once the queue is started; [`Self::next_event`] re-posts the buffers
    /// it reads.
    pub fn post(&mut self) -> Result<(), EventError> {
        if self.idle.is_empty() {
            return Ok(());
        }
        while let Some(buffer) = self.idle.pop() {
            let writable = [Buffer::new(self.addr(buffer), EVENT_INFO_SIZE)];
            if let Err(e) = self.vq.ring_mut().add(&[], &writable, usize::from(buffer)) {
                self.idle.push(buffer);
                return Err(EventError::Queue(e));
            }
        }
        self.vq
            .publish()
            .map_err(|e| EventError::Failed(QueueFailure::Notify(e)))
    }

    /// The next event the device reported, without waiting: `None` when
    /// there is none. The buffer is re-posted.
    pub fn try_next_event(&mut self) -> Result<Option<[u8; EVENT_SIZE]>, EventError> {
        let Some(used) = self.vq.ring_mut().pop_used() else {
            return Ok(None);
        };
        let used = used.map_err(|e| EventError::Failed(QueueFailure::Device(e)))?;
        // The ring validated the token: one of ours.
        let buffer = u16::try_from(used.token).unwrap_or(u16::MAX);
        self.idle.push(buffer);
        if used.len < EVENT_INFO_SIZE {
            return Err(EventError::Short { len: used.len });
        }
        let mut event = [0; EVENT_SIZE];
        self.mem
            .read_slice(&mut event, self.addr(buffer))
            .map_err(EventError::Memory)?;
        self.post()?;
        Ok(Some(event))
    }

    /// Waits, bounded by the queue's timeout, for the next event the
    /// device reports, as it wrote it (decode it with
    /// [`Event::decode`](sqcq_wire::scsi::Event::decode)). The buffer is
    /// re-posted.
    pub fn next_event(&mut self) -> Result<[u8; EVENT_SIZE], EventError> {
        loop {
            if let Some(event) = self.try_next_event()? {
                return Ok(event);
            }
            self.vq
                .wait()
                .map_err(|e| EventError::Failed(QueueFailure::Notify(e)))?;
        }
    }

    fn addr(&self, buffer: u16) -> GuestAddress {
        debug_assert!(buffer < self.buffers);
        // Inside the area allocated in `new`.
        GuestAddress(self.base.0 + u64::from(buffer) * EVENT_SIZE as u64)
    }
}
