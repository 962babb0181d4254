//! CDB parsing: an operation code and its fields become a typed
//! [`Command`], after the length, service action, reserved bits and control
//! byte are checked against the table in `usage`.

use crate::error::ScsiError;
use crate::pr::{PrInAction, PrOutAction};
use crate::sense::top_bit;
use crate::usage::{self, Lookup, op};

/// MODE SENSE page control (SPC-4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageControl {
    /// Current values.
    Current,
    /// Changeable-bits mask.
    Changeable,
    /// Default values.
    Default,
    /// Saved values (not supported).
    Saved,
}

/// A decoded command with every field this target uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// TEST UNIT READY.
    TestUnitReady,
    /// REQUEST SENSE.
    RequestSense {
        /// DESC: descriptor-format sense data.
        descriptor: bool,
        /// Allocation length.
        alloc_len: u8,
    },
    /// INQUIRY.
    Inquiry {
        /// EVPD: a vital product data page is asked for.
        evpd: bool,
        /// Page code.
        page: u8,
        /// Allocation length.
        alloc_len: u16,
    },
    /// MODE SENSE(6) and (10).
    ModeSense {
        /// True for MODE SENSE(10).
        long: bool,
        /// DBD: leave block descriptors out.
        dbd: bool,
        /// LLBAA: long LBA block descriptor allowed (10 only).
        llbaa: bool,
        /// Page control.
        control: PageControl,
        /// Page code.
        page: u8,
        /// Subpage code.
        subpage: u8,
        /// Allocation length.
        alloc_len: u16,
    },
    /// MODE SELECT(6) and (10), with PF = 1 and SP = 0 (anything else is
    /// rejected while parsing).
    ModeSelect {
        /// True for MODE SELECT(10).
        long: bool,
        /// Parameter list length.
        param_len: u16,
    },
    /// START STOP UNIT.
    StartStopUnit {
        /// START.
        start: bool,
    },
    /// READ CAPACITY(10).
    ReadCapacity10,
    /// READ CAPACITY(16).
    ReadCapacity16 {
        /// Allocation length.
        alloc_len: u32,
    },
    /// READ(6/10/12/16).
    Read {
        /// First LBA.
        lba: u64,
        /// Transfer length in blocks.
        blocks: u32,
        /// Which field holds the transfer length (for the field pointer).
        length_at: u8,
    },
    /// WRITE(6/10/12/16).
    Write {
        /// First LBA.
        lba: u64,
        /// Transfer length in blocks.
        blocks: u32,
        /// FUA or FUA_NV.
        fua: bool,
        /// Which field holds the transfer length (for the field pointer).
        length_at: u8,
    },
    /// VERIFY(10/16) with BYTCHK = 0.
    Verify {
        /// First LBA.
        lba: u64,
        /// Verification length in blocks.
        blocks: u32,
    },
    /// SYNCHRONIZE CACHE(10/16).
    SynchronizeCache {
        /// First LBA.
        lba: u64,
        /// Number of blocks; 0 means through the last block.
        blocks: u32,
    },
    /// WRITE SAME(10/16).
    WriteSame {
        /// First LBA.
        lba: u64,
        /// Number of blocks.
        blocks: u32,
        /// UNMAP: the blocks may be deallocated.
        unmap: bool,
        /// NDOB: no data-out buffer, the block is zeros (16 only).
        ndob: bool,
        /// Which field holds the number of blocks (for the field pointer).
        length_at: u8,
    },
    /// UNMAP.
    Unmap {
        /// Parameter list length.
        param_len: u16,
    },
    /// PERSISTENT RESERVE IN.
    PersistentReserveIn {
        /// Service action.
        action: PrInAction,
        /// Allocation length.
        alloc_len: u16,
    },
    /// PERSISTENT RESERVE OUT.
    PersistentReserveOut {
        /// Service action.
        action: PrOutAction,
        /// SCOPE (byte 2 bits 7:4).
        scope: u8,
        /// TYPE (byte 2 bits 3:0).
        pr_type: u8,
        /// Parameter list length.
        param_len: u32,
    },
    /// REPORT LUNS (answered by the daemon, which knows the LUNs).
    ReportLuns {
        /// SELECT REPORT: 0, 1 or 2.
        select_report: u8,
        /// Allocation length.
        alloc_len: u32,
    },
    /// REPORT SUPPORTED OPERATION CODES.
    ReportSupportedOpcodes {
        /// RCTD: add command timeouts descriptors.
        timeouts: bool,
        /// REPORTING OPTIONS (0-3).
        options: u8,
        /// REQUESTED OPERATION CODE.
        opcode: u8,
        /// REQUESTED SERVICE ACTION.
        service_action: u16,
        /// Allocation length.
        alloc_len: u32,
    },
    /// REPORT TARGET PORT GROUPS.
    ReportTargetPortGroups {
        /// PARAMETER DATA FORMAT 001b: extended header.
        extended: bool,
        /// Allocation length.
        alloc_len: u32,
    },
}

/// Big-endian field access over a CDB whose length was checked; a byte
/// outside it reads as zero, so no input can panic.
#[derive(Clone, Copy, Debug)]
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn b(&self, i: usize) -> u8 {
        self.0.get(i).copied().unwrap_or(0)
    }

    fn bit(&self, i: usize, mask: u8) -> bool {
        self.b(i) & mask != 0
    }

    fn be<const N: usize>(&self, at: usize) -> [u8; N] {
        let mut out = [0u8; N];
        if let Some(src) = self.0.get(at..at + N) {
            out.copy_from_slice(src);
        }
        out
    }

    fn be16(&self, at: usize) -> u16 {
        u16::from_be_bytes(self.be(at))
    }

    fn be32(&self, at: usize) -> u32 {
        u32::from_be_bytes(self.be(at))
    }

    fn be64(&self, at: usize) -> u64 {
        u64::from_be_bytes(self.be(at))
    }
}

/// Byte offsets are small; saturate rather than cast.
pub(crate) fn at(i: usize) -> u16 {
    u16::try_from(i).unwrap_or(u16::MAX)
}

/// The first 16 bytes of a CDB, little-endian, zeros past its end: the
/// operand of a [`crate::usage::Usage`]'s `reject` bits.
fn first_16(cdb: &[u8]) -> u128 {
    let mut bytes = [0u8; 16];
    match cdb.first_chunk::<16>() {
        Some(b) => bytes = *b,
        None => bytes[..cdb.len()].copy_from_slice(cdb),
    }
    u128::from_le_bytes(bytes)
}

/// The error for the first bit of `cdb` outside its usage data `mask`, or
/// for NACA; Ok if there is none.
fn check_reserved(cdb: &[u8], mask: &[u8]) -> Result<(), ScsiError> {
    // Every command checks all its bytes: one pass without branches, and
    // the search for the offending byte only when there is one.
    let stray = cdb
        .iter()
        .zip(mask)
        .skip(1)
        .fold(0u8, |acc, (&b, &m)| acc | (b & !m));
    if stray != 0 {
        for (i, (&b, &m)) in cdb.iter().zip(mask).enumerate().skip(1) {
            let bad = b & !m;
            if bad != 0 {
                return Err(ScsiError::cdb_field(at(i), Some(top_bit(bad))));
            }
        }
    }
    // NACA = 1 asks for ACA, which this target does not support.
    let last = mask.len().saturating_sub(1);
    if cdb.get(last).is_some_and(|c| c & 0x04 != 0) {
        return Err(ScsiError::cdb_field(at(last), Some(2)));
    }
    Ok(())
}

impl Command {
    /// Parses a CDB. `cdb` may be longer than the command (virtio-scsi
    /// always carries a fixed-size CDB field); bytes past the length that
    /// the operation code implies are ignored.
    pub fn parse(cdb: &[u8]) -> Result<Self, ScsiError> {
        let opcode = *cdb.first().ok_or(ScsiError::CdbTooShort {
            len: 0,
            required: 1,
        })?;
        let sa = cdb.get(1).copied().unwrap_or(0) & 0x1f;
        let usage = match usage::lookup(opcode, sa) {
            Lookup::Supported(u) => u,
            Lookup::UnsupportedOpcode => return Err(ScsiError::InvalidOpcode { opcode }),
            Lookup::UnsupportedServiceAction => return Err(ScsiError::cdb_field(1, Some(4))),
        };
        let required = usage.mask.len();
        let first = first_16(cdb);
        let cdb = cdb.get(..required).ok_or(ScsiError::CdbTooShort {
            len: cdb.len(),
            required,
        })?;
        if first & usage.reject != 0 {
            // Some bit is wrong: which one, byte by byte.
            check_reserved(cdb, usage.mask)?;
        }
        decode(opcode, sa, Fields(cdb))
    }
}

fn decode(opcode: u8, sa: u8, f: Fields<'_>) -> Result<Command, ScsiError> {
    use Command as C;
    Ok(match opcode {
        op::TEST_UNIT_READY => C::TestUnitReady,
        op::REQUEST_SENSE => C::RequestSense {
            descriptor: f.bit(1, 0x01),
            alloc_len: f.b(4),
        },
        op::READ_6 | op::WRITE_6 => {
            let lba = u64::from(f.b(1) & 0x1f) << 16 | u64::from(f.be16(2));
            // A transfer length of 0 means 256 blocks (SBC-3).
            let blocks = match f.b(4) {
                0 => 256,
                n => u32::from(n),
            };
            rw(opcode == op::WRITE_6, lba, blocks, false, 4)
        }
        op::INQUIRY => {
            let evpd = f.bit(1, 0x01);
            if !evpd && f.b(2) != 0 {
                return Err(ScsiError::cdb_field(2, Some(7)));
            }
            C::Inquiry {
                evpd,
                page: f.b(2),
                alloc_len: f.be16(3),
            }
        }
        op::MODE_SELECT_6 | op::MODE_SELECT_10 => {
            if !f.bit(1, 0x10) {
                // PF = 0: vendor-specific page format, not supported.
                return Err(ScsiError::cdb_field(1, Some(4)));
            }
            if f.bit(1, 0x01) {
                // SP = 1: no saved pages.
                return Err(ScsiError::cdb_field(1, Some(0)));
            }
            let long = opcode == op::MODE_SELECT_10;
            C::ModeSelect {
                long,
                param_len: if long { f.be16(7) } else { u16::from(f.b(4)) },
            }
        }
        op::MODE_SENSE_6 | op::MODE_SENSE_10 => {
            let long = opcode == op::MODE_SENSE_10;
            C::ModeSense {
                long,
                dbd: f.bit(1, 0x08),
                llbaa: f.bit(1, 0x10),
                control: match f.b(2) >> 6 {
                    0 => PageControl::Current,
                    1 => PageControl::Changeable,
                    2 => PageControl::Default,
                    _ => PageControl::Saved,
                },
                page: f.b(2) & 0x3f,
                subpage: f.b(3),
                alloc_len: if long { f.be16(7) } else { u16::from(f.b(4)) },
            }
        }
        op::START_STOP_UNIT => C::StartStopUnit {
            start: f.bit(4, 0x01),
        },
        op::READ_CAPACITY_10 => {
            // PMI = 0 requires LBA = 0 (SBC-3).
            if !f.bit(8, 0x01) && f.be32(2) != 0 {
                return Err(ScsiError::cdb_field(2, Some(7)));
            }
            C::ReadCapacity10
        }
        op::READ_10 | op::WRITE_10 => rw(
            opcode == op::WRITE_10,
            u64::from(f.be32(2)),
            u32::from(f.be16(7)),
            f.b(1) & 0x0a != 0,
            7,
        ),
        op::READ_12 | op::WRITE_12 => rw(
            opcode == op::WRITE_12,
            u64::from(f.be32(2)),
            f.be32(6),
            f.b(1) & 0x0a != 0,
            6,
        ),
        op::READ_16 | op::WRITE_16 => rw(
            opcode == op::WRITE_16,
            f.be64(2),
            f.be32(10),
            f.b(1) & 0x0a != 0,
            10,
        ),
        op::VERIFY_10 => C::Verify {
            lba: u64::from(f.be32(2)),
            blocks: u32::from(f.be16(7)),
        },
        op::VERIFY_16 => C::Verify {
            lba: f.be64(2),
            blocks: f.be32(10),
        },
        op::SYNCHRONIZE_CACHE_10 => C::SynchronizeCache {
            lba: u64::from(f.be32(2)),
            blocks: u32::from(f.be16(7)),
        },
        op::SYNCHRONIZE_CACHE_16 => C::SynchronizeCache {
            lba: f.be64(2),
            blocks: f.be32(10),
        },
        op::WRITE_SAME_10 => C::WriteSame {
            lba: u64::from(f.be32(2)),
            blocks: u32::from(f.be16(7)),
            unmap: f.bit(1, 0x08),
            ndob: false,
            length_at: 7,
        },
        op::WRITE_SAME_16 => C::WriteSame {
            lba: f.be64(2),
            blocks: f.be32(10),
            unmap: f.bit(1, 0x08),
            ndob: f.bit(1, 0x01),
            length_at: 10,
        },
        op::UNMAP => C::Unmap {
            param_len: f.be16(7),
        },
        op::PERSISTENT_RESERVE_IN => C::PersistentReserveIn {
            action: PrInAction::from_code(sa).ok_or(ScsiError::cdb_field(1, Some(4)))?,
            alloc_len: f.be16(7),
        },
        op::PERSISTENT_RESERVE_OUT => C::PersistentReserveOut {
            action: PrOutAction::from_code(sa).ok_or(ScsiError::cdb_field(1, Some(4)))?,
            scope: f.b(2) >> 4,
            pr_type: f.b(2) & 0x0f,
            param_len: f.be32(5),
        },
        op::SERVICE_ACTION_IN_16 => {
            if !f.bit(14, 0x01) && f.be64(2) != 0 {
                return Err(ScsiError::cdb_field(2, Some(7)));
            }
            C::ReadCapacity16 {
                alloc_len: f.be32(10),
            }
        }
        op::REPORT_LUNS => {
            let select_report = f.b(2);
            if select_report > 2 {
                return Err(ScsiError::cdb_field(2, Some(7)));
            }
            let alloc_len = f.be32(6);
            // SPC-4: an allocation length under 4 is an error.
            if alloc_len < 4 {
                return Err(ScsiError::cdb_field(6, Some(7)));
            }
            C::ReportLuns {
                select_report,
                alloc_len,
            }
        }
        op::MAINTENANCE_IN if sa == op::SA_REPORT_TARGET_PORT_GROUPS => {
            let extended = match f.b(1) >> 5 {
                0 => false,
                1 => true,
                _ => return Err(ScsiError::cdb_field(1, Some(7))),
            };
            C::ReportTargetPortGroups {
                extended,
                alloc_len: f.be32(6),
            }
        }
        op::MAINTENANCE_IN => {
            let options = f.b(2) & 0x07;
            if options > 3 {
                return Err(ScsiError::cdb_field(2, Some(2)));
            }
            C::ReportSupportedOpcodes {
                timeouts: f.bit(2, 0x80),
                options,
                opcode: f.b(3),
                service_action: f.be16(4),
                alloc_len: f.be32(6),
            }
        }
        _ => return Err(ScsiError::InvalidOpcode { opcode }),
    })
}

fn rw(write: bool, lba: u64, blocks: u32, fua: bool, length_at: u8) -> Command {
    if write {
        Command::Write {
            lba,
            blocks,
            fua,
            length_at,
        }
    } else {
        Command::Read {
            lba,
            blocks,
            length_at,
        }
    }
}

#[cfg(test)]
#[path = "cdb_tests.rs"]
mod tests;
