//! What can go wrong with a queue: the driver's own mistakes and resource
//! limits ([`QueueError`]), and a device breaking the ring protocol
//! ([`DeviceError`]).

use crate::memory::MemoryError;

/// Errors from setting up a queue or adding a request to it.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The queue size is not a power of two between 1 and 32768.
    #[error("queue size {size} is not a power of two in 1..=32768")]
    InvalidSize {
        /// The requested size.
        size: u16,
    },
    /// The indirect table length exceeds the queue size (the specification
    /// bounds every chain, indirect or not, by the queue size).
    #[error("indirect table length {indirect_max} exceeds the queue size {size}")]
    InvalidIndirectMax {
        /// The requested indirect table length.
        indirect_max: u16,
        /// The queue size.
        size: u16,
    },
    /// Allocating or reaching the rings in driver memory failed.
    #[error("placing the queue in driver memory failed")]
    Memory(#[source] MemoryError),
    /// A request had no buffers.
    #[error("a request needs at least one buffer")]
    EmptyChain,
    /// A request had more buffers than the queue size.
    #[error("a chain of {len} buffers exceeds the queue size {max}")]
    ChainTooLong {
        /// Buffers in the request.
        len: usize,
        /// The queue size.
        max: u16,
    },
    /// The buffers of a request add up to more than 4 GiB - 1, which the
    /// specification forbids.
    #[error("a chain of {bytes} bytes exceeds u32::MAX")]
    ChainTooLarge {
        /// Total bytes of the request's buffers.
        bytes: u64,
    },
    /// Not enough free descriptors: wait for completions.
    #[error("{needed} descriptors needed, {free} free")]
    NoFreeDescriptors {
        /// Descriptors the request needs.
        needed: u16,
        /// Descriptors free.
        free: u16,
    },
    /// A doorbell mode was asked of [`Virtqueue::new`](crate::Virtqueue::new),
    /// which builds standard modes only; doorbell modes need a poll thread
    /// ([`PollGroupBuilder::attach`](crate::sqcq::PollGroupBuilder::attach)).
    #[error("mode {0} needs a driver poll thread")]
    NeedsPollThread(&'static str),
    /// The device broke the queue earlier; see
    /// [`SplitQueue::fail_in_flight`](super::SplitQueue::fail_in_flight).
    #[error("the queue is broken")]
    Broken(#[source] DeviceError),
}

/// A hostile or broken device, detected in the used ring. The queue is
/// broken from then on: [`SplitQueue::pop_used`](super::SplitQueue::pop_used) keeps returning the error
/// and [`SplitQueue::add`](super::SplitQueue::add) refuses new requests, until
/// [`SplitQueue::fail_in_flight`](super::SplitQueue::fail_in_flight).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// `used->idx` moved more than the queue size past the last entry the
    /// driver consumed.
    #[error("used index {used_idx} is more than {size} past the last used {last_used}")]
    UsedIndexJump {
        /// The driver's last consumed used index.
        last_used: u16,
        /// The index the device published.
        used_idx: u16,
        /// The queue size.
        size: u16,
    },
    /// A used element names a descriptor past the end of the table.
    #[error("used element id {id} is out of range for queue size {size}")]
    UnknownId {
        /// The id in the used element.
        id: u32,
        /// The queue size.
        size: u16,
    },
    /// A used element names a descriptor that heads no request in flight
    /// (a completion for something never submitted, or a second one).
    #[error("used element id {id} is not the head of a request in flight")]
    NotInFlight {
        /// The id in the used element.
        id: u16,
    },
    /// A used element claims more bytes written than the request's
    /// device-writable buffers hold.
    #[error("used element id {id} reports {len} bytes written, the buffers hold {max}")]
    LengthTooLong {
        /// The id in the used element.
        id: u16,
        /// The length the device reported.
        len: u32,
        /// Total bytes of the request's device-writable buffers.
        max: u64,
    },
}
