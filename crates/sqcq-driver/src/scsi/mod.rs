//! virtio-scsi on top of the driver-side ring: commands and their
//! completions on the request queues, task management on the control
//! queue.
//!
//! - [`cdb`]: byte-exact CDB builders (READ/WRITE 10 and 16 with FUA,
//!   SYNCHRONIZE CACHE, INQUIRY, REPORT LUNS, READ CAPACITY, TEST UNIT
//!   READY);
//! - [`header`]: the virtio-scsi request and response headers, LUN
//!   addressing, task management requests;
//! - [`config`]: the device configuration space;
//! - [`sense`], [`data`]: what comes back (sense data, INQUIRY, READ
//!   CAPACITY, REPORT LUNS), parsed without trusting the device;
//! - [`ScsiQueue`]: a request queue with per-slot preallocated headers and
//!   completion dispatch by token; [`ControlQueue`]: the control queue.

pub mod cdb;
pub mod config;
mod control;
pub mod data;
pub mod header;
mod queue;
pub mod sense;
#[cfg(test)]
mod tests;

pub use cdb::{Cdb, CdbRangeError, CdbSize};
pub use config::{ConfigError, ScsiConfig};
pub use control::{ControlError, ControlQueue};
pub use data::{Capacity, Inquiry};
pub use header::{Lun, Response, TaskAttr, Tmf};
pub use queue::{
    Command, CommandError, Completion, Data, Done, QueueFailure, ScsiQueue, SubmitError,
};
pub use sense::Sense;
