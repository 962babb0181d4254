//! virtio-scsi on top of the driver-side ring: commands and their
//! completions on the request queues, task management and asynchronous
//! notification on the control queue, events on the event queue.
//!
//! - [`cdb`]: byte-exact CDB builders (READ/WRITE 10 and 16 with FUA,
//!   WRITE SAME 16, SYNCHRONIZE CACHE, INQUIRY, REPORT LUNS, READ
//!   CAPACITY, TEST UNIT READY);
//! - the virtio-scsi wire format (headers, LUN addressing, task
//!   management, configuration space) is `sqcq_wire::scsi`, shared with
//!   the target; its types are re-exported here;
//! - [`sense`], [`data`]: what comes back (sense data, INQUIRY, READ
//!   CAPACITY, REPORT LUNS), parsed without trusting the device;
//! - [`ScsiQueue`]: a request queue with per-slot preallocated headers and
//!   completion dispatch by token; [`ControlQueue`]: the control queue;
//!   [`EventQueue`]: the event queue.

pub mod cdb;
mod control;
pub mod data;
mod event;
mod queue;
pub mod sense;
#[cfg(test)]
mod tests;

pub use cdb::{Cdb, CdbRangeError, CdbSize};
pub use control::{ControlError, ControlQueue};
pub use data::{Capacity, Inquiry};
pub use event::{EventError, EventQueue};
pub use queue::{
    Command, CommandError, Completion, Data, Done, QueueFailure, ScsiQueue, SubmitError,
};
pub use sense::Sense;
pub use sqcq_wire::scsi::{AnResp, ConfigError, Lun, Response, ScsiConfig, TaskAttr, Tmf};
