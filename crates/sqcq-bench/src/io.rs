//! The request layer a job drives: virtio-scsi READ/WRITE commands or
//! virtio-blk IN/OUT requests. One enum over the driver's two queues, so
//! that the job loop is written once; a `match` per call is all it costs
//! (no allocation, no dynamic dispatch).

use sqcq_driver::blk::{self, BlkQueue, Request, RequestError};
use sqcq_driver::scsi::{Cdb, CdbSize, Command, CommandError, Data, Lun, ScsiQueue, sense};
use sqcq_driver::{Buffer, NotifyCounters, QueueFailure, Virtqueue};

use crate::error::BenchError;
use crate::workload::Dir;

/// A job's request queue, with what its requests need besides the block
/// and the buffer.
#[derive(Debug)]
pub enum IoQueue {
    /// virtio-scsi.
    Scsi {
        /// The queue.
        queue: ScsiQueue,
        /// The LUN.
        lun: Lun,
        /// CDB size of READ/WRITE.
        cdb: CdbSize,
        /// FUA on writes.
        fua: bool,
    },
    /// virtio-blk.
    Blk {
        /// The queue.
        queue: BlkQueue,
        /// 512-byte sectors per logical block.
        sectors_per_block: u64,
    },
}

/// Why an I/O did not complete successfully.
#[derive(Debug, Clone, thiserror::Error)]
pub enum IoError {
    /// A SCSI command's failure.
    #[error("SCSI command failed")]
    Scsi(#[source] CommandError),
    /// A virtio-blk request's failure.
    #[error("virtio-blk request failed")]
    Blk(#[source] RequestError),
}

impl IoError {
    /// Whether a SCSI LUN answered UNIT ATTENTION (a condition it reports
    /// once, such as CAPACITY DATA HAS CHANGED): the command may be sent
    /// again.
    pub fn unit_attention(&self) -> bool {
        matches!(
            self,
            Self::Scsi(CommandError::Status { sense: Some(s), .. }) if s.key == sense::UNIT_ATTENTION
        )
    }
}

/// A completed (or failed) I/O, with the submitter's token.
#[derive(Debug, Clone)]
pub struct IoDone {
    /// The token given to [`IoQueue::submit`].
    pub token: u64,
    /// How it ended.
    pub result: Result<(), IoError>,
}

impl From<sqcq_driver::scsi::Completion> for IoDone {
    fn from(c: sqcq_driver::scsi::Completion) -> Self {
        Self {
            token: c.token,
            result: c.result.map(|_| ()).map_err(IoError::Scsi),
        }
    }
}

impl From<blk::Completion> for IoDone {
    fn from(c: blk::Completion) -> Self {
        Self {
            token: c.token,
            result: c.result.map(|_| ()).map_err(IoError::Blk),
        }
    }
}

impl IoQueue {
    /// Adds a read or write of `blocks` logical blocks at `lba` through
    /// `buf`, reported back with `token`.
    pub fn submit(
        &mut self,
        dir: Dir,
        lba: u64,
        blocks: u32,
        buf: Buffer,
        token: u64,
    ) -> Result<(), BenchError> {
        let data = [buf];
        match self {
            Self::Scsi {
                queue,
                lun,
                cdb,
                fua,
            } => {
                let (cdb, data) = match dir {
                    Dir::Read => (Cdb::read(lba, blocks, false, *cdb), Data::FromDevice(&data)),
                    Dir::Write => (Cdb::write(lba, blocks, *fua, *cdb), Data::ToDevice(&data)),
                };
                let cdb = cdb.map_err(|e| BenchError::Usage(format!("{e}; use --cdb 16")))?;
                queue.submit(&Command::new(*lun, cdb, data), token)?;
            }
            Self::Blk {
                queue,
                sectors_per_block,
            } => {
                let sector = lba
                    .checked_mul(*sectors_per_block)
                    .ok_or(BenchError::Protocol("the sector number overflows"))?;
                let req = match dir {
                    Dir::Read => Request::Read {
                        sector,
                        data: &data,
                    },
                    Dir::Write => Request::Write {
                        sector,
                        data: &data,
                    },
                };
                queue.submit(&req, token)?;
            }
        }
        Ok(())
    }

    /// Publishes the submitted I/Os; on failure every I/O in flight goes
    /// to `on_complete`, failed.
    pub fn publish(&mut self, mut on_complete: impl FnMut(IoDone)) -> Result<(), QueueFailure> {
        match self {
            Self::Scsi { queue, .. } => queue.publish(|c| on_complete(c.into())),
            Self::Blk { queue, .. } => queue.publish(|c| on_complete(c.into())),
        }
    }

    /// Waits for completions and hands them to `on_complete`.
    pub fn wait_and_reap(
        &mut self,
        mut on_complete: impl FnMut(IoDone),
    ) -> Result<usize, QueueFailure> {
        match self {
            Self::Scsi { queue, .. } => queue.wait_and_reap(|c| on_complete(c.into())),
            Self::Blk { queue, .. } => queue.wait_and_reap(|c| on_complete(c.into())),
        }
    }

    /// Fails every I/O in flight.
    pub fn abandon(&mut self) {
        match self {
            Self::Scsi { queue, .. } => queue.abandon(|_| {}),
            Self::Blk { queue, .. } => queue.abandon(|_| {}),
        }
    }

    /// Whether the device asks for no more I/Os for now (THROTTLE); see
    /// `sqcq_driver`'s `throttle`.
    pub fn throttle(&mut self, fresh: bool) -> bool {
        match self {
            Self::Scsi { queue, .. } => queue.throttle(fresh),
            Self::Blk { queue, .. } => queue.throttle(fresh),
        }
    }

    /// I/Os in flight.
    pub fn in_flight(&self) -> u16 {
        match self {
            Self::Scsi { queue, .. } => queue.in_flight(),
            Self::Blk { queue, .. } => queue.in_flight(),
        }
    }

    /// The notification counters so far.
    pub fn counters(&mut self) -> NotifyCounters {
        match self {
            Self::Scsi { queue, .. } => queue.counters(),
            Self::Blk { queue, .. } => queue.counters(),
        }
    }

    /// Tells the queue its submitter stops waiting for a while.
    pub fn park(&mut self) {
        match self {
            Self::Scsi { queue, .. } => queue.park(),
            Self::Blk { queue, .. } => queue.park(),
        }
    }

    /// Keep the requests in flight when the device hangs up (see
    /// `crate::link`).
    pub fn survive_hangup(&mut self, on: bool) {
        match self {
            Self::Scsi { queue, .. } => queue.survive_hangup(on),
            Self::Blk { queue, .. } => queue.survive_hangup(on),
        }
    }

    /// Follows a new connection to the device.
    pub fn reattach(&mut self, hangup: std::os::fd::OwnedFd) {
        match self {
            Self::Scsi { queue, .. } => queue.reattach(hangup),
            Self::Blk { queue, .. } => queue.reattach(hangup),
        }
    }

    /// The virtqueue underneath.
    pub fn virtqueue(&self) -> &Virtqueue {
        match self {
            Self::Scsi { queue, .. } => queue.virtqueue(),
            Self::Blk { queue, .. } => queue.virtqueue(),
        }
    }
}
