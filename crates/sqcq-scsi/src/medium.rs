//! Medium access commands (SBC-3): READ, WRITE, VERIFY, SYNCHRONIZE CACHE,
//! WRITE SAME and UNMAP become a [`MediumOp`] that the worker executes
//! against the backstore. Data never pass through here. This path takes
//! no lock: the logical unit reads its capacity (an atomic) for each
//! command and hands it in with its configuration ([`Medium`]).

use crate::capacity::check_range;
use crate::completion::{Completion, MediumOp};
use crate::config::LuConfig;
use crate::error::ScsiError;
use crate::unmap;

/// What a medium command is checked against: the unit's configuration
/// and its capacity when the command arrived.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Medium<'a> {
    pub(crate) config: &'a LuConfig,
    pub(crate) capacity: u64,
}

/// A WRITE SAME command's fields, and whether it must be durable before
/// completing (the write cache is disabled).
#[derive(Clone, Copy, Debug)]
pub(crate) struct WriteSame {
    pub(crate) lba: u64,
    pub(crate) blocks: u32,
    pub(crate) unmap: bool,
    pub(crate) ndob: bool,
    pub(crate) fua: bool,
    pub(crate) length_at: u8,
}

impl Medium<'_> {
    fn transfer(&self, lba: u64, blocks: u32, length_at: u8) -> Result<(u64, u64), ScsiError> {
        if blocks > self.config.max_transfer_blocks {
            return Err(ScsiError::cdb_field(u16::from(length_at), Some(7)));
        }
        check_range(lba, u64::from(blocks), self.capacity)?;
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

    /// WRITE; `fua`: durable before completing (FUA, FUA_NV, or the
    /// write cache is disabled).
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
            fua,
        }))
    }

    /// VERIFY with BYTCHK = 0: the range is checked, nothing is read.
    pub(crate) fn verify(&self, lba: u64, blocks: u32) -> Result<Completion<'static>, ScsiError> {
        if blocks != 0 {
            check_range(lba, u64::from(blocks), self.capacity)?;
        }
        Ok(Completion::Good)
    }

    pub(crate) fn synchronize_cache(
        &self,
        lba: u64,
        blocks: u32,
    ) -> Result<Completion<'static>, ScsiError> {
        let capacity = self.capacity;
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
        req: WriteSame,
        data_out: &'d [u8],
    ) -> Result<Completion<'d>, ScsiError> {
        let WriteSame {
            lba,
            blocks,
            unmap,
            ndob,
            fua,
            length_at,
        } = req;
        self.writable()?;
        // WSNZ = 1 in the block limits page: zero blocks is invalid.
        if blocks == 0 || blocks > self.config.max_write_same_blocks {
            return Err(ScsiError::cdb_field(u16::from(length_at), Some(7)));
        }
        check_range(lba, u64::from(blocks), self.capacity)?;
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
            fua,
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
            self.capacity,
            self.config.block_size,
            &limits,
        )?;
        Ok(list.map_or(Completion::Good, |l| Completion::Medium(MediumOp::Unmap(l))))
    }
}

#[cfg(test)]
#[path = "medium_tests.rs"]
mod tests;
