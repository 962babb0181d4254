//! virtio-blk on top of the driver-side ring: reads, writes, flushes,
//! the device ID, discard and write zeroes on the request queues of a
//! vhost-user-blk device.
//!
//! - the wire format (request header, status byte, discard and
//!   write-zeroes segments, configuration space) is `sqcq_wire::blk`,
//!   shared with the target; the types a submitter needs are re-exported
//!   here;
//! - [`BlkQueue`]: a request queue with per-slot preallocated headers,
//!   segments and status bytes, completion dispatch by token, and every
//!   broken answer of the device turned into a [`RequestError`];
//! - [`FEATURES`]: the virtio-blk feature bits this driver understands,
//!   for [`FrontendConfig::extra_features`](crate::FrontendConfig::extra_features).
//!
//! The configuration space is read by the frontend
//! ([`Negotiated::blk_config`](crate::Negotiated::blk_config)).

mod queue;
#[cfg(test)]
mod tests;

pub use queue::{BlkQueue, Completion, Done, MAX_SEGMENTS, Request, RequestError, SubmitError};
pub use sqcq_wire::blk::{
    BlkConfig, ID_BYTES, SECTOR_SHIFT, SECTOR_SIZE, Segment, Status, WRITE_ZEROES_FLAG_UNMAP,
};

pub use sqcq_wire::blk::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_CONFIG_WCE, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH,
    VIRTIO_BLK_F_MQ, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_TOPOLOGY,
    VIRTIO_BLK_F_WRITE_ZEROES,
};

/// The virtio-blk feature bits a [`BlkQueue`] user can take advantage of
/// and the frontend may ack: the configuration fields they guard are read
/// by the frontend, CONFIG_WCE lets it choose the cache mode
/// (`Frontend::set_writeback`); SIZE_MAX, GEOMETRY, SECURE_ERASE and ZONED
/// are left out (the first two change nothing for this driver, the last
/// two need requests it does not build).
pub const FEATURES: u64 = (1 << VIRTIO_BLK_F_SEG_MAX)
    | (1 << VIRTIO_BLK_F_RO)
    | (1 << VIRTIO_BLK_F_BLK_SIZE)
    | (1 << VIRTIO_BLK_F_FLUSH)
    | (1 << VIRTIO_BLK_F_CONFIG_WCE)
    | (1 << VIRTIO_BLK_F_TOPOLOGY)
    | (1 << VIRTIO_BLK_F_MQ)
    | (1 << VIRTIO_BLK_F_DISCARD)
    | (1 << VIRTIO_BLK_F_WRITE_ZEROES);
