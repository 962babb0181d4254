//! Everything that ends a run early, and the exit code it gives.

use sqcq_driver::QueueFailure;
use sqcq_driver::blk;
use sqcq_driver::scsi::{CommandError, SubmitError};
use sqcq_driver::sqcq::DoorbellError;
use sqcq_driver::{FrontendError, MemoryError, QueueError};

use crate::io::IoError;
use crate::target::TargetError;
use crate::verify::Mismatch;

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The options cannot work together or with this device.
    #[error("{0}")]
    Usage(String),
    /// Starting the target failed.
    #[error("starting the target failed")]
    Target(#[from] TargetError),
    /// The vhost-user conversation failed.
    #[error("vhost-user set-up failed")]
    Frontend(#[from] FrontendError),
    /// Driver memory could not be set up.
    #[error("driver memory")]
    DriverMemory(#[from] MemoryError),
    /// A queue could not be set up.
    #[error("queue set-up")]
    Queue(#[from] QueueError),
    /// The doorbells or the driver poll thread could not be set up.
    #[error("doorbell set-up")]
    Doorbell(#[from] DoorbellError),
    /// The poll threads did not fall asleep between two bursts.
    #[error("the poll threads did not fall asleep within {timeout:?} after a burst: {state}")]
    NotIdle {
        /// The bound.
        timeout: std::time::Duration,
        /// What the flags said last.
        state: String,
    },
    /// An eventfd could not be created.
    #[error("creating an eventfd failed")]
    Eventfd(#[source] std::io::Error),
    /// Reading or writing driver memory failed.
    #[error("accessing driver memory failed")]
    Memory(#[source] vm_memory::GuestMemoryError),
    /// Submitting a SCSI command failed.
    #[error("submitting a command failed")]
    Submit(#[from] SubmitError),
    /// Submitting a virtio-blk request failed.
    #[error("submitting a request failed")]
    BlkSubmit(#[from] blk::SubmitError),
    /// The device failed a queue: a protocol violation, a hangup, a
    /// timeout.
    #[error("the device failed")]
    Device(#[from] QueueFailure),
    /// A set-up command failed.
    #[error("{what} failed")]
    Command {
        /// The command.
        what: String,
        /// How.
        #[source]
        source: CommandError,
    },
    /// An I/O of the run failed.
    #[error("{what} failed")]
    Io {
        /// The I/O.
        what: String,
        /// How.
        #[source]
        source: IoError,
    },
    /// A virtio-blk set-up request failed.
    #[error("{what} failed")]
    BlkRequest {
        /// The request.
        what: &'static str,
        /// How.
        #[source]
        source: blk::RequestError,
    },
    /// The device said something that makes no sense.
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    /// A block did not read back as written.
    #[error("{0}")]
    Verify(Mismatch),
    /// A job thread panicked.
    #[error("job {0} panicked")]
    Panic(usize),
}

impl BenchError {
    /// The process exit code: 2 for usage errors, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Usage(_) => 2,
            _ => 1,
        }
    }
}

/// The error and its sources, one per line.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(&format!("\n  caused by: {s}"));
        source = s.source();
    }
    out
}
