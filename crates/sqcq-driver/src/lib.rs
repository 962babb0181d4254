//! The driver side of sqcq: the role the guest kernel plays in the
//! VIRTIO_F_SQCQ_POLL RFC, played by a userspace process.
//!
//! - [`memory`]: the frontend's "guest" memory, a sealed memfd mapped
//!   shared, which a vhost-user backend maps too (`SET_MEM_TABLE`), with a
//!   bump allocator for rings, doorbells, request headers and data buffers.
//! - [`vring`]: the driver side of a split virtqueue over that memory.
//! - [`notify`]: the notification mode of a queue, a strategy chosen once
//!   ([`NotifyMode`], [`Notifier`]), with the kick/call eventfds and their
//!   counters.
//! - [`poll_stats`]: the driver-side pollers' per-queue figures.
//! - [`sqcq`]: VIRTIO_F_SQCQ_POLL: the doorbells, the driver's poll
//!   thread and the submitter's half of the doorbell modes.
//! - [`virtqueue`]: a ring bound to its eventfds and strategy.
//! - [`frontend`]: the vhost-user frontend: negotiation, memory table,
//!   vring set-up, device configuration, clean stop.
//! - [`scsi`]: virtio-scsi commands and task management over those queues.
//! - [`blk`]: virtio-blk requests over those queues.
//!
//! The ring is our own because no crate offers the driver side of one:
//! rust-vmm's `virtio-queue` is the device side (its `mock` module builds
//! chains for tests but does not run a queue), and the RFC's subject is
//! precisely the driver's half of the notification handshakes (the
//! EVENT_IDX kick decision, interrupt suppression, and later the SQ/CQ
//! doorbells and the driver's poll thread), which must live where we can
//! change and measure them. The tests run it against `virtio-queue`'s
//! device side over the same memory: two independent implementations of
//! the split ring checking each other.

#![deny(missing_docs)]

pub mod blk;
pub mod frontend;
pub mod memory;
pub mod notify;
pub mod poll_stats;
pub mod scsi;
mod slots;
pub mod sqcq;
#[cfg(test)]
mod test_rig;
pub mod virtqueue;
pub mod vring;

pub use frontend::{
    DeviceConfig, DeviceType, Frontend, FrontendConfig, FrontendError, InflightRecord, Negotiated,
};
pub use memory::{DriverMemory, MemoryConfig, MemoryError};
pub use notify::{
    DoorbellState, IdleState, Notifier, NotifyCounters, NotifyError, NotifyMode, QueueEvents,
};
pub use slots::QueueFailure;
pub use virtqueue::Virtqueue;
pub use vring::{
    Buffer, DeviceError, NotifyDecision, PackedQueue, QueueConfig, QueueError, Ring, SplitQueue,
    Used,
};
