//! Medium access commands (SBC-3): READ, WRITE, VERIFY, SYNCHRONIZE CACHE,
//! WRITE SAME and UNMAP become a [`MediumOp`] that the worker executes
//! against the backstore. Data never pass through here. This path reads
//! atomics only and takes no lock.

use crate::error::ScsiError;
use crate::lun::{Completion, LogicalUnit};
use crate::unmap::{self, UnmapList};

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

/// LBA OUT OF RANGE unless `lba` is within the capacity and `lba + blocks`
/// does not pass its end (without overflow).
pub(crate) fn check_range(lba: u64, blocks: u64, capacity: u64) -> Result<(), ScsiError> {
    match lba.checked_add(blocks) {
        Some(end) if lba < capacity && end <= capacity => Ok(()),
        _ => Err(ScsiError::LbaOutOfRange { lba, blocks }),
    }
}

impl LogicalUnit {
    fn transfer(&self, lba: u64, blocks: u32, length_at: u8) -> Result<(u64, u64), ScsiError> {
        if blocks > self.config.max_transfer_blocks {
            return Err(ScsiError::cdb_field(u16::from(length_at), Some(7)));
        }
        check_range(lba, u64::from(blocks), self.blocks())?;
        let bs = u64::from(self.config.block_size);
        // Cannot overflow: lba < capacity and capacity × block size fits u64.
        Ok((lba.saturating_mul(bs), u64::from(blocks) * bs))
    }

    fn writable(&self) -> Result<(), ScsiError> {
        if self.config.read_only {
            Err(ScsiError::WriteProtected)
        } else {
            Ok(())
        }
    }

    pub(crate) fn read(
        &self,
        lba: u64,
        blocks: u32,
        length_at: u8,
    ) -> Result<Completion<'static>, ScsiError> {
        let (offset, bytes) = self.transfer(lba, blocks, length_at)?;
        if blocks == 0 {
            // SBC-3: a transfer length of zero is not an error.
            return Ok(Completion::Good);
        }
        Ok(Completion::Medium(MediumOp::Read {
            lba,
            blocks,
            offset,
            bytes,
        }))
    }

    pub(crate) fn write(
        &self,
        lba: u64,
        blocks: u32,
        fua: bool,
        length_at: u8,
    ) -> Result<Completion<'static>, ScsiError> {
        self.writable()?;
        let (offset, bytes) = self.transfer(lba, blocks, length_at)?;
        if blocks == 0 {
            return Ok(Completion::Good);
        }
        Ok(Completion::Medium(MediumOp::Write {
            lba,
            blocks,
            offset,
            bytes,
            fua: fua || !self.write_cache_enabled(),
        }))
    }

    /// VERIFY with BYTCHK = 0: the range is checked, nothing is read.
    pub(crate) fn verify(&self, lba: u64, blocks: u32) -> Result<Completion<'static>, ScsiError> {
        if blocks != 0 {
            check_range(lba, u64::from(blocks), self.blocks())?;
        }
        Ok(Completion::Good)
    }

    pub(crate) fn synchronize_cache(
        &self,
        lba: u64,
        blocks: u32,
    ) -> Result<Completion<'static>, ScsiError> {
        let capacity = self.blocks();
        let blocks = match blocks {
            // Zero: from `lba` through the last block (SBC-3).
            0 => capacity.saturating_sub(lba),
            n => u64::from(n),
        };
        check_range(lba, blocks, capacity)?;
        Ok(Completion::Medium(MediumOp::Flush { lba, blocks }))
    }

    pub(crate) fn write_same<'d>(
        &self,
        lba: u64,
        blocks: u32,
        unmap: bool,
        ndob: bool,
        length_at: u8,
        data_out: &'d [u8],
    ) -> Result<Completion<'d>, ScsiError> {
        self.writable()?;
        // WSNZ = 1 in the block limits page: zero blocks is invalid.
        if blocks == 0 || blocks > self.config.max_write_same_blocks {
            return Err(ScsiError::cdb_field(u16::from(length_at), Some(7)));
        }
        check_range(lba, u64::from(blocks), self.blocks())?;
        let bs = u64::from(self.config.block_size);
        let pattern = if ndob {
            None
        } else {
            let want = usize::try_from(self.config.block_size).unwrap_or(usize::MAX);
            Some(data_out.get(..want).ok_or(ScsiError::DataLengthMismatch {
                expected: bs,
                actual: u64::try_from(data_out.len()).unwrap_or(u64::MAX),
            })?)
        };
        Ok(Completion::Medium(MediumOp::WriteSame {
            lba,
            blocks,
            offset: lba.saturating_mul(bs),
            unmap: unmap && self.config.provisioning.is_some(),
            fua: !self.write_cache_enabled(),
            pattern,
        }))
    }

    pub(crate) fn unmap<'d>(
        &self,
        param_len: u16,
        data_out: &'d [u8],
    ) -> Result<Completion<'d>, ScsiError> {
        let Some(limits) = self.config.provisioning else {
            return Err(ScsiError::InvalidOpcode {
                opcode: crate::usage::op::UNMAP,
            });
        };
        self.writable()?;
        let list = unmap::parse(
            param_len,
            data_out,
            self.blocks(),
            self.config.block_size,
            &limits,
        )?;
        Ok(list.map_or(Completion::Good, |l| Completion::Medium(MediumOp::Unmap(l))))
    }
}

#[cfg(test)]
#[path = "medium_tests.rs"]
mod tests;
