//! What every request queue does whatever its device type: a fixed set of
//! slots, one per descriptor of the ring, each with the submitter's
//! bookkeeping; completions dispatched by slot; and, once the device or
//! the notification path fails, every request in flight failed exactly
//! once. The virtio-scsi and virtio-blk queues put their headers in the
//! slots and interpret what comes back; nothing here is allocated per
//! request.

use std::collections::VecDeque;

use crate::notify::{NotifyCounters, NotifyError};
use crate::virtqueue::Virtqueue;
use crate::vring::{Buffer, DeviceError, QueueError};

/// What ends a queue: the device broke the ring protocol, or could not be
/// notified or waited for. Every request in flight is failed.
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

/// Why no slot was taken or filled.
#[derive(Debug)]
pub(crate) enum SlotError {
    /// Every slot or descriptor is in use.
    Full,
    /// The queue failed earlier.
    Failed,
    /// The ring refused the request.
    Queue(QueueError),
}

/// One completion as the slot layer sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Reaped<T> {
    /// The device used the request of `slot`, reporting `len` bytes
    /// written (validated by the ring against the writable buffers).
    Used {
        /// The slot.
        slot: u16,
        /// The submitter's bookkeeping.
        info: T,
        /// The used length.
        len: u32,
    },
    /// The queue failed with the request in flight.
    Failed {
        /// The submitter's bookkeeping.
        info: T,
    },
}

/// A [`Virtqueue`] whose requests live in slots carrying a `T` each.
#[derive(Debug)]
pub(crate) struct Slots<T> {
    vq: Virtqueue,
    info: Box<[T]>,
    /// Free slots, taken from the front and given back at the end (see
    /// [`Self::take`]).
    free: VecDeque<u16>,
    failed: bool,
    /// A hangup of the device leaves the requests in flight (the frontend
    /// reconnects and the device resubmits them).
    survive_hangup: bool,
}

impl<T: Copy + Default> Slots<T> {
    /// One slot per descriptor of `vq`'s ring.
    pub(crate) fn new(vq: Virtqueue) -> Self {
        let n = vq.ring().size();
        Self {
            vq,
            info: vec![T::default(); usize::from(n)].into_boxed_slice(),
            free: (0..n).collect(),
            failed: false,
            survive_hangup: false,
        }
    }

    /// See `ScsiQueue::survive_hangup`.
    pub(crate) fn survive_hangup(&mut self, on: bool) {
        self.survive_hangup = on;
    }

    /// See `ScsiQueue::reattach`.
    pub(crate) fn reattach(&mut self, hangup: std::os::fd::OwnedFd) {
        self.vq.reattach(hangup);
    }

    pub(crate) fn virtqueue(&self) -> &Virtqueue {
        &self.vq
    }

    /// See [`Virtqueue::throttle`].
    pub(crate) fn throttle(&mut self, fresh: bool) -> bool {
        self.vq.throttle(fresh)
    }

    /// See `ScsiQueue::enable_interrupts`.
    pub(crate) fn enable_interrupts(&mut self) -> bool {
        self.vq.ring_mut().enable_interrupts()
    }

    pub(crate) fn park(&mut self) {
        self.vq.park();
    }

    pub(crate) fn in_flight(&self) -> u16 {
        self.vq.ring().in_flight()
    }

    pub(crate) fn failed(&self) -> bool {
        self.failed
    }

    pub(crate) fn counters(&mut self) -> NotifyCounters {
        self.vq.counters()
    }

    /// Takes a free slot, for the caller to write its headers into before
    /// [`Self::commit`] (writing them cannot fail: the areas are the
    /// queue's own). The slot free longest: a completed slot goes to the
    /// back, so its header block, which the device read last, is written
    /// again last (as the ring's descriptors).
    pub(crate) fn take(&mut self) -> Result<u16, SlotError> {
        if self.failed {
            return Err(SlotError::Failed);
        }
        self.free.pop_front().ok_or(SlotError::Full)
    }

    /// Adds the request of `slot` to the ring; on failure the slot is free
    /// again.
    pub(crate) fn commit(
        &mut self,
        slot: u16,
        info: T,
        out: &[Buffer],
        in_: &[Buffer],
    ) -> Result<(), SlotError> {
        match self.vq.ring_mut().add(out, in_, usize::from(slot)) {
            Ok(_) => {
                self.info[usize::from(slot)] = info;
                Ok(())
            }
            Err(e) => {
                // Never handed to the device: first in line again.
                self.free.push_front(slot);
                Err(match e {
                    QueueError::NoFreeDescriptors { .. } => SlotError::Full,
                    e => SlotError::Queue(e),
                })
            }
        }
    }

    /// Makes the committed requests visible and notifies as the mode
    /// decides; on failure every request in flight goes to `handle` as
    /// [`Reaped::Failed`].
    pub(crate) fn publish(
        &mut self,
        handle: impl FnMut(Reaped<T>) -> Result<(), vm_memory::GuestMemoryError>,
    ) -> Result<(), QueueFailure> {
        if self.failed {
            return Err(QueueFailure::AlreadyFailed);
        }
        match self.vq.publish() {
            Ok(()) => Ok(()),
            Err(e) => Err(self.fail(QueueFailure::Notify(e), handle)),
        }
    }

    /// Hands every used request to `handle`, without waiting. When
    /// `handle` fails to read a response, that request and every other in
    /// flight are failed and the queue with them.
    pub(crate) fn reap(
        &mut self,
        mut handle: impl FnMut(Reaped<T>) -> Result<(), vm_memory::GuestMemoryError>,
    ) -> Result<usize, QueueFailure> {
        if self.failed {
            return Err(QueueFailure::AlreadyFailed);
        }
        let mut n = 0;
        while let Some(used) = self.vq.ring_mut().pop_used() {
            let used = match used {
                Ok(used) => used,
                Err(e) => return Err(self.fail(QueueFailure::Device(e), handle)),
            };
            // The ring validated the id; tokens are slot numbers we gave.
            let slot = u16::try_from(used.token).unwrap_or(u16::MAX);
            let info = self.info[usize::from(slot)];
            self.free.push_back(slot);
            let reaped = Reaped::Used {
                slot,
                info,
                len: used.len,
            };
            if let Err(e) = handle(reaped) {
                let _ = handle(Reaped::Failed { info });
                return Err(self.fail(QueueFailure::Memory(e), handle));
            }
            n += 1;
        }
        Ok(n)
    }

    /// Waits (bounded by the queue's timeout, woken by a socket hangup)
    /// until completions arrive, then reaps them as [`Self::reap`].
    /// Returns at once when nothing is in flight.
    pub(crate) fn wait_and_reap(
        &mut self,
        mut handle: impl FnMut(Reaped<T>) -> Result<(), vm_memory::GuestMemoryError>,
    ) -> Result<usize, QueueFailure> {
        if self.failed {
            return Err(QueueFailure::AlreadyFailed);
        }
        if self.in_flight() == 0 {
            return Ok(0);
        }
        match self.vq.wait() {
            Ok(()) => {}
            Err(NotifyError::Hangup) if self.survive_hangup => {
                return Err(QueueFailure::Notify(NotifyError::Hangup));
            }
            Err(e) => return Err(self.fail(QueueFailure::Notify(e), &mut handle)),
        }
        self.reap(handle)
    }

    /// Fails every request in flight.
    pub(crate) fn abandon(
        &mut self,
        handle: impl FnMut(Reaped<T>) -> Result<(), vm_memory::GuestMemoryError>,
    ) {
        if !self.failed {
            let _ = self.fail(QueueFailure::AlreadyFailed, handle);
        }
    }

    fn fail(
        &mut self,
        failure: QueueFailure,
        mut handle: impl FnMut(Reaped<T>) -> Result<(), vm_memory::GuestMemoryError>,
    ) -> QueueFailure {
        self.failed = true;
        let info = &self.info;
        let free = &mut self.free;
        self.vq.ring_mut().fail_in_flight(|slot| {
            let slot = u16::try_from(slot).unwrap_or(u16::MAX);
            free.push_back(slot);
            let _ = handle(Reaped::Failed {
                info: info[usize::from(slot)],
            });
        });
        failure
    }
}
