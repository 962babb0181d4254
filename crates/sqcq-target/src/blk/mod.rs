//! The virtio-blk device: one disk over a backstore, on the same runtime
//! and transport as the SCSI device. [`device`] is the device type and
//! its configuration space, the `queue` module the request handler of a
//! request queue. The wire format is `sqcq_wire::blk`.

pub mod device;
pub(crate) mod queue;
#[cfg(test)]
mod queue_tests;
