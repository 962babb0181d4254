//! The virtio-scsi device: command requests from descriptor chain to
//! response (the `request` module), the control and event queues (`control`),
//! the LUN table and its changes at run time (`target`, `hotplug`),
//! and the requests in flight to the backstores (`inflight`). The SCSI
//! emulation itself is `sqcq_scsi`, the wire format `sqcq_wire::scsi`.

pub(crate) mod control;
pub mod device;
pub(crate) mod hotplug;
pub(crate) mod inflight;
pub(crate) mod queue;
mod request;
#[cfg(test)]
#[allow(clippy::cast_possible_truncation)]
pub(crate) mod request_tests;
pub(crate) mod target;
