//! What executing a command comes back with ([`Completion`]): GOOD
//! status, response data in the scratch buffer, a [`MediumOp`] for the
//! worker to run against the backstore, or a [`ReportLunsRequest`] for the
//! daemon, which knows the LUNs, to answer.

use crate::unmap::UnmapList;

/// How a command completed successfully.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion<'d> {
    /// GOOD status, no data.
    Good,
    /// GOOD status; the first `len` bytes of the data-in scratch buffer go
    /// to the initiator (already truncated to the allocation length).
    Data {
        /// Bytes of data-in.
        len: usize,
    },
    /// The worker executes this on the backstore; GOOD if it succeeds.
    Medium(MediumOp<'d>),
    /// REPORT LUNS: the daemon, which knows the LUNs, answers with
    /// [`crate::report_luns`].
    ReportLuns(ReportLunsRequest),
}

/// What the worker must do on the backstore. Ranges are checked against
/// the capacity and the limits; byte offsets and lengths cannot overflow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MediumOp<'d> {
    /// Read `bytes` at `offset` into the data-in buffer.
    Read {
        /// First LBA.
        lba: u64,
        /// Blocks to read (at least 1).
        blocks: u32,
        /// Byte offset in the backstore.
        offset: u64,
        /// Expected data-in length.
        bytes: u64,
    },
    /// Write `bytes` from the data-out buffer at `offset`.
    Write {
        /// First LBA.
        lba: u64,
        /// Blocks to write (at least 1).
        blocks: u32,
        /// Byte offset in the backstore.
        offset: u64,
        /// Expected data-out length.
        bytes: u64,
        /// Make the data durable before completing (FUA, FUA_NV, or the
        /// write cache is disabled).
        fua: bool,
    },
    /// Make the range durable (SYNCHRONIZE CACHE).
    Flush {
        /// First LBA.
        lba: u64,
        /// Number of blocks (at least 1; a CDB value of 0 was resolved to
        /// the end of the medium).
        blocks: u64,
    },
    /// Deallocate the ranges.
    Unmap(UnmapList<'d>),
    /// Write `pattern` (one block) to every block of the range, or zeros
    /// when `pattern` is `None` (NDOB); `unmap` allows deallocating
    /// instead when the result reads the same.
    WriteSame {
        /// First LBA.
        lba: u64,
        /// Number of blocks (at least 1).
        blocks: u32,
        /// Byte offset in the backstore.
        offset: u64,
        /// The blocks may be deallocated (only set when the logical unit
        /// is thin provisioned).
        unmap: bool,
        /// Make the data durable before completing (write cache disabled).
        fua: bool,
        /// The block to replicate, exactly one block long.
        pattern: Option<&'d [u8]>,
    },
}

impl MediumOp<'_> {
    /// Bytes the worker transfers to the initiator.
    pub fn data_in_len(&self) -> u64 {
        match *self {
            Self::Read { bytes, .. } => bytes,
            _ => 0,
        }
    }

    /// Bytes the worker takes from the initiator's data-out buffer.
    pub fn data_out_len(&self) -> u64 {
        match *self {
            Self::Write { bytes, .. } => bytes,
            _ => 0,
        }
    }
}

/// A REPORT LUNS command, validated, to be answered with
/// [`report_luns`](crate::report_luns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReportLunsRequest {
    /// SELECT REPORT: 00h and 02h list the logical units, 01h only the
    /// well-known ones (there are none).
    pub select_report: u8,
    /// Allocation length (at least 4).
    pub alloc_len: u32,
}
