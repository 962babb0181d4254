//! Command descriptor blocks (SPC-5, SBC-4) for the commands the driver
//! side sends. Byte-exact builders; the device's parser is the check.

/// The longest CDB built here (READ/WRITE 16, SYNCHRONIZE CACHE 16, READ
/// CAPACITY 16).
pub const MAX_CDB_LEN: usize = 16;

/// SCSI operation codes used here.
pub mod opcode {
    /// TEST UNIT READY.
    pub const TEST_UNIT_READY: u8 = 0x00;
    /// INQUIRY.
    pub const INQUIRY: u8 = 0x12;
    /// READ CAPACITY (10).
    pub const READ_CAPACITY_10: u8 = 0x25;
    /// READ (10).
    pub const READ_10: u8 = 0x28;
    /// WRITE (10).
    pub const WRITE_10: u8 = 0x2a;
    /// SYNCHRONIZE CACHE (10).
    pub const SYNCHRONIZE_CACHE_10: u8 = 0x35;
    /// READ (16).
    pub const READ_16: u8 = 0x88;
    /// WRITE (16).
    pub const WRITE_16: u8 = 0x8a;
    /// SYNCHRONIZE CACHE (16).
    pub const SYNCHRONIZE_CACHE_16: u8 = 0x91;
    /// WRITE SAME (16).
    pub const WRITE_SAME_16: u8 = 0x93;
    /// SERVICE ACTION IN (16), whose action 0x10 is READ CAPACITY (16).
    pub const SERVICE_ACTION_IN_16: u8 = 0x9e;
    /// REPORT LUNS.
    pub const REPORT_LUNS: u8 = 0xa0;
}

/// Service action of READ CAPACITY (16) under SERVICE ACTION IN (16).
const SA_READ_CAPACITY_16: u8 = 0x10;
/// The FUA bit in byte 1 of READ/WRITE 10 and 16.
const FUA: u8 = 1 << 3;
/// The UNMAP bit in byte 1 of WRITE SAME.
const UNMAP: u8 = 1 << 3;

/// A command descriptor block of 6 to 16 bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Cdb {
    bytes: [u8; MAX_CDB_LEN],
    len: u8,
}

impl std::fmt::Debug for Cdb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cdb({:02x?})", self.as_bytes())
    }
}

/// Which CDB size READ and WRITE use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CdbSize {
    /// READ/WRITE 10 when the LBA and length fit, 16 otherwise (what Linux
    /// `sd` does on disks that do not ask for 16).
    #[default]
    Auto,
    /// Always READ/WRITE 10 (fails beyond 2^32 blocks or 65535 blocks per
    /// command).
    Ten,
    /// Always READ/WRITE 16.
    Sixteen,
}

/// A READ or WRITE that does not fit the CDB size asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("LBA {lba:#x} and {blocks} blocks do not fit a 10-byte CDB")]
pub struct CdbRangeError {
    /// The first block.
    pub lba: u64,
    /// The number of blocks.
    pub blocks: u32,
}

impl Cdb {
    fn new<const N: usize>(prefix: [u8; N]) -> Self {
        let mut bytes = [0; MAX_CDB_LEN];
        bytes[..N].copy_from_slice(&prefix);
        // N is 6, 10, 12 or 16.
        let len = u8::try_from(N).unwrap_or(u8::MAX);
        Self { bytes, len }
    }

    /// The CDB's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// The operation code.
    pub fn opcode(&self) -> u8 {
        self.bytes[0]
    }

    /// TEST UNIT READY.
    pub fn test_unit_ready() -> Self {
        Self::new([opcode::TEST_UNIT_READY, 0, 0, 0, 0, 0])
    }

    /// INQUIRY for the standard data (`page` `None`) or a VPD page,
    /// returning at most `alloc_len` bytes.
    pub fn inquiry(page: Option<u8>, alloc_len: u16) -> Self {
        let (evpd, page) = page.map_or((0, 0), |p| (1, p));
        let [hi, lo] = alloc_len.to_be_bytes();
        Self::new([opcode::INQUIRY, evpd, page, hi, lo, 0])
    }

    /// REPORT LUNS (select report 0: all LUNs), at most `alloc_len` bytes.
    pub fn report_luns(alloc_len: u32) -> Self {
        let a = alloc_len.to_be_bytes();
        Self::new([
            opcode::REPORT_LUNS,
            0,
            0,
            0,
            0,
            0,
            a[0],
            a[1],
            a[2],
            a[3],
            0,
            0,
        ])
    }

    /// READ CAPACITY (10): 8 bytes of data.
    pub fn read_capacity_10() -> Self {
        Self::new([opcode::READ_CAPACITY_10, 0, 0, 0, 0, 0, 0, 0, 0, 0])
    }

    /// READ CAPACITY (16), at most `alloc_len` bytes (32 is the full data).
    pub fn read_capacity_16(alloc_len: u32) -> Self {
        let mut cdb = Self::new([opcode::SERVICE_ACTION_IN_16; 16]);
        cdb.bytes[1..].fill(0);
        cdb.bytes[1] = SA_READ_CAPACITY_16;
        cdb.bytes[10..14].copy_from_slice(&alloc_len.to_be_bytes());
        cdb
    }

    /// READ (10).
    pub fn read_10(lba: u32, blocks: u16, fua: bool) -> Self {
        Self::rw_10(opcode::READ_10, lba, blocks, fua)
    }

    /// WRITE (10).
    pub fn write_10(lba: u32, blocks: u16, fua: bool) -> Self {
        Self::rw_10(opcode::WRITE_10, lba, blocks, fua)
    }

    /// READ (16).
    pub fn read_16(lba: u64, blocks: u32, fua: bool) -> Self {
        Self::rw_16(opcode::READ_16, lba, blocks, fua)
    }

    /// WRITE (16).
    pub fn write_16(lba: u64, blocks: u32, fua: bool) -> Self {
        Self::rw_16(opcode::WRITE_16, lba, blocks, fua)
    }

    /// READ of `blocks` blocks at `lba`, in the CDB size asked for.
    pub fn read(lba: u64, blocks: u32, fua: bool, size: CdbSize) -> Result<Self, CdbRangeError> {
        Self::rw(false, lba, blocks, fua, size)
    }

    /// WRITE of `blocks` blocks at `lba`, in the CDB size asked for.
    pub fn write(lba: u64, blocks: u32, fua: bool, size: CdbSize) -> Result<Self, CdbRangeError> {
        Self::rw(true, lba, blocks, fua, size)
    }

    /// SYNCHRONIZE CACHE (10) of `blocks` blocks at `lba` (0 blocks: to
    /// the end of the medium).
    pub fn synchronize_cache_10(lba: u32, blocks: u16) -> Self {
        let l = lba.to_be_bytes();
        let [bh, bl] = blocks.to_be_bytes();
        Self::new([
            opcode::SYNCHRONIZE_CACHE_10,
            0,
            l[0],
            l[1],
            l[2],
            l[3],
            0,
            bh,
            bl,
            0,
        ])
    }

    /// SYNCHRONIZE CACHE (16) of `blocks` blocks at `lba` (0 blocks: to
    /// the end of the medium).
    pub fn synchronize_cache_16(lba: u64, blocks: u32) -> Self {
        let mut cdb = Self::rw_16(opcode::SYNCHRONIZE_CACHE_16, lba, blocks, false);
        cdb.bytes[1] = 0;
        cdb
    }

    /// WRITE SAME (16): one block of data-out written to `blocks` blocks
    /// at `lba`; with `unmap`, the device may deallocate them instead when
    /// the block is zeros.
    pub fn write_same_16(lba: u64, blocks: u32, unmap: bool) -> Self {
        let mut cdb = Self::rw_16(opcode::WRITE_SAME_16, lba, blocks, false);
        cdb.bytes[1] = if unmap { UNMAP } else { 0 };
        cdb
    }

    fn rw(
        write: bool,
        lba: u64,
        blocks: u32,
        fua: bool,
        size: CdbSize,
    ) -> Result<Self, CdbRangeError> {
        let short = u32::try_from(lba).ok().zip(u16::try_from(blocks).ok());
        match (size, short) {
            (CdbSize::Sixteen, _) | (CdbSize::Auto, None) => Ok(if write {
                Self::write_16(lba, blocks, fua)
            } else {
                Self::read_16(lba, blocks, fua)
            }),
            (CdbSize::Ten | CdbSize::Auto, Some((lba, blocks))) => Ok(if write {
                Self::write_10(lba, blocks, fua)
            } else {
                Self::read_10(lba, blocks, fua)
            }),
            (CdbSize::Ten, None) => Err(CdbRangeError { lba, blocks }),
        }
    }

    fn rw_10(op: u8, lba: u32, blocks: u16, fua: bool) -> Self {
        let l = lba.to_be_bytes();
        let [bh, bl] = blocks.to_be_bytes();
        let flags = if fua { FUA } else { 0 };
        Self::new([op, flags, l[0], l[1], l[2], l[3], 0, bh, bl, 0])
    }

    fn rw_16(op: u8, lba: u64, blocks: u32, fua: bool) -> Self {
        let mut bytes = [0; 16];
        bytes[0] = op;
        bytes[1] = if fua { FUA } else { 0 };
        bytes[2..10].copy_from_slice(&lba.to_be_bytes());
        bytes[10..14].copy_from_slice(&blocks.to_be_bytes());
        Self::new(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_write_10_are_byte_exact() {
        assert_eq!(
            Cdb::read_10(0x0102_0304, 0x0506, false).as_bytes(),
            [0x28, 0, 1, 2, 3, 4, 0, 5, 6, 0]
        );
        assert_eq!(
            Cdb::write_10(0xffff_ffff, 1, true).as_bytes(),
            [0x2a, 0x08, 0xff, 0xff, 0xff, 0xff, 0, 0, 1, 0]
        );
    }

    #[test]
    fn read_write_16_are_byte_exact() {
        assert_eq!(
            Cdb::read_16(0x0102_0304_0506_0708, 0x090a_0b0c, true).as_bytes(),
            [0x88, 0x08, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0, 0]
        );
        assert_eq!(
            Cdb::write_16(1, 8, false).as_bytes(),
            [0x8a, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 8, 0, 0]
        );
    }

    #[test]
    fn auto_picks_10_when_it_fits() {
        let auto = |lba, blocks| Cdb::read(lba, blocks, false, CdbSize::Auto).unwrap();
        assert_eq!(auto(0xffff_ffff, 0xffff).opcode(), opcode::READ_10);
        assert_eq!(auto(0x1_0000_0000, 1).opcode(), opcode::READ_16);
        assert_eq!(auto(0, 0x1_0000).opcode(), opcode::READ_16);
        assert_eq!(
            Cdb::write(0, 1, false, CdbSize::Sixteen).unwrap().opcode(),
            opcode::WRITE_16
        );
        assert_eq!(
            Cdb::write(0x1_0000_0000, 1, false, CdbSize::Ten),
            Err(CdbRangeError {
                lba: 0x1_0000_0000,
                blocks: 1
            })
        );
    }

    #[test]
    fn other_commands_are_byte_exact() {
        assert_eq!(Cdb::test_unit_ready().as_bytes(), [0; 6]);
        assert_eq!(Cdb::inquiry(None, 96).as_bytes(), [0x12, 0, 0, 0, 96, 0]);
        assert_eq!(
            Cdb::inquiry(Some(0x83), 0x1234).as_bytes(),
            [0x12, 1, 0x83, 0x12, 0x34, 0]
        );
        assert_eq!(
            Cdb::report_luns(0x0001_0203).as_bytes(),
            [0xa0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 0, 0]
        );
        assert_eq!(
            Cdb::read_capacity_10().as_bytes(),
            [0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            Cdb::read_capacity_16(32).as_bytes(),
            [0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0]
        );
        assert_eq!(
            Cdb::synchronize_cache_10(0x0a0b_0c0d, 0x0102).as_bytes(),
            [0x35, 0, 0x0a, 0x0b, 0x0c, 0x0d, 0, 1, 2, 0]
        );
        assert_eq!(
            Cdb::write_same_16(0x0102_0304_0506_0708, 0x090a_0b0c, true).as_bytes(),
            [0x93, 0x08, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0, 0]
        );
        assert_eq!(Cdb::write_same_16(1, 2, false).as_bytes()[1], 0);
        assert_eq!(
            Cdb::synchronize_cache_16(0x0102_0304_0506_0708, 0).as_bytes(),
            [0x91, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0]
        );
    }
}
