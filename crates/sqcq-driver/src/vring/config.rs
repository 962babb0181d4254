//! The shape of a queue: size and negotiated ring features.

use virtio_bindings::virtio_config::VIRTIO_F_RING_PACKED;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};

/// The largest queue size a split virtqueue may have.
pub const MAX_QUEUE_SIZE: u16 = 32768;

/// How to lay out a [`SplitQueue`](super::SplitQueue): its size and the ring features
/// negotiated with the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueConfig {
    /// Number of descriptors: a power of two up to [`MAX_QUEUE_SIZE`]
    /// (a packed ring: any size up to it).
    pub size: u16,
    /// VIRTIO_RING_F_EVENT_IDX was negotiated.
    pub event_idx: bool,
    /// Entries of each preallocated indirect table; 0 when
    /// VIRTIO_RING_F_INDIRECT_DESC was not negotiated. Requests of 2 to
    /// `indirect_max` buffers then take one descriptor of the ring.
    pub indirect_max: u16,
    /// VIRTIO_F_RING_PACKED was negotiated: the ring is packed.
    pub packed: bool,
}

impl QueueConfig {
    /// A queue of `size` descriptors without EVENT_IDX or indirect tables.
    pub fn new(size: u16) -> Self {
        Self {
            size,
            event_idx: false,
            indirect_max: 0,
            packed: false,
        }
    }

    /// A queue of `size` descriptors using the ring features in the
    /// negotiated `features`; `indirect_max` applies when
    /// VIRTIO_RING_F_INDIRECT_DESC is among them.
    pub fn negotiated(size: u16, features: u64, indirect_max: u16) -> Self {
        let has = |bit: u32| features & (1 << bit) != 0;
        Self {
            size,
            event_idx: has(VIRTIO_RING_F_EVENT_IDX),
            indirect_max: if has(VIRTIO_RING_F_INDIRECT_DESC) {
                indirect_max
            } else {
                0
            },
            packed: has(VIRTIO_F_RING_PACKED),
        }
    }
}
