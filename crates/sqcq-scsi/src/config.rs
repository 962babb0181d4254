//! What a logical unit is: geometry, identity, limits and provisioning,
//! checked once when the unit is created.

/// Configuration of one logical unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LuConfig {
    /// Logical block size in bytes: 512 or 4096.
    pub block_size: u32,
    /// Capacity in logical blocks (at least 1).
    pub blocks: u64,
    /// Writes fail with DATA PROTECT; MODE SENSE reports WP.
    pub read_only: bool,
    /// INQUIRY product identification, at most 16 printable ASCII bytes.
    pub product: String,
    /// INQUIRY product revision level, at most 4 printable ASCII bytes.
    pub revision: String,
    /// Unit serial number (VPD page 0x80), at most 64 printable ASCII bytes.
    pub serial: String,
    /// NAA IEEE Registered designator (VPD page 0x83): its top nibble must
    /// be 5.
    pub wwn: u64,
    /// Logical blocks per physical block, as a power of two (0-15).
    pub physical_block_exponent: u8,
    /// MAXIMUM TRANSFER LENGTH in blocks (VPD 0xb0); longer READ/WRITE get
    /// INVALID FIELD IN CDB.
    pub max_transfer_blocks: u32,
    /// OPTIMAL TRANSFER LENGTH in blocks (VPD 0xb0), 0 if not reported.
    pub optimal_transfer_blocks: u32,
    /// OPTIMAL TRANSFER LENGTH GRANULARITY in blocks (VPD 0xb0), 0 if not
    /// reported.
    pub optimal_granularity_blocks: u16,
    /// MAXIMUM WRITE SAME LENGTH in blocks (VPD 0xb0).
    pub max_write_same_blocks: u32,
    /// The default (and initial) WCE bit of the caching mode page. With WCE
    /// = 0 every write is decoded with `fua` set.
    pub write_cache: bool,
    /// Thin provisioning, when the backstore can deallocate blocks.
    pub provisioning: Option<Provisioning>,
}

/// Logical block provisioning (SBC-3) as the backstore supports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Provisioning {
    /// MAXIMUM UNMAP LBA COUNT: blocks one UNMAP command may name in total.
    pub max_unmap_blocks: u32,
    /// MAXIMUM UNMAP BLOCK DESCRIPTOR COUNT.
    pub max_unmap_descriptors: u32,
    /// OPTIMAL UNMAP GRANULARITY in blocks (0 if not reported).
    pub unmap_granularity_blocks: u32,
    /// Unmapped blocks read as zeros (LBPRZ).
    pub unmapped_reads_zero: bool,
}

impl Default for Provisioning {
    fn default() -> Self {
        Self {
            max_unmap_blocks: 1 << 22,
            max_unmap_descriptors: 64,
            unmap_granularity_blocks: 0,
            unmapped_reads_zero: true,
        }
    }
}

/// Why a configuration was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The block size is neither 512 nor 4096.
    #[error("logical block size {0} is not 512 or 4096")]
    BlockSize(u32),
    /// The capacity is zero blocks.
    #[error("capacity must be at least one block")]
    ZeroCapacity,
    /// Capacity in bytes does not fit 64 bits.
    #[error("{blocks} blocks of {block_size} bytes overflow a 64-bit byte offset")]
    CapacityOverflow {
        /// Blocks asked for.
        blocks: u64,
        /// Block size.
        block_size: u32,
    },
    /// An identity string is too long or not printable ASCII.
    #[error("{field} must be at most {max} printable ASCII characters")]
    Identity {
        /// Which string.
        field: &'static str,
        /// Its maximum length.
        max: usize,
    },
    /// The WWN is not an NAA type 5 designator.
    #[error("WWN {0:#018x} is not an NAA IEEE Registered (type 5) designator")]
    Wwn(u64),
    /// The physical block exponent exceeds 15.
    #[error("physical block exponent {0} exceeds 15")]
    PhysicalBlockExponent(u8),
    /// A limit that must be nonzero is zero.
    #[error("{0} must be nonzero")]
    ZeroLimit(&'static str),
}

impl LuConfig {
    /// A read-write logical unit with a volatile write cache, 4 MiB
    /// transfers, no provisioning, serial derived from the WWN.
    pub fn new(block_size: u32, blocks: u64, wwn: u64) -> Self {
        let max_transfer_blocks = (4 << 20) / block_size.max(1);
        Self {
            block_size,
            blocks,
            read_only: false,
            product: "sqcq disk".to_owned(),
            revision: "0001".to_owned(),
            serial: format!("{wwn:016x}"),
            wwn,
            physical_block_exponent: 0,
            max_transfer_blocks,
            optimal_transfer_blocks: 0,
            optimal_granularity_blocks: 0,
            max_write_same_blocks: 1 << 22,
            write_cache: true,
            provisioning: None,
        }
    }

    /// Checks every field; [`crate::LogicalUnit::new`] calls it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.block_size != 512 && self.block_size != 4096 {
            return Err(ConfigError::BlockSize(self.block_size));
        }
        check_capacity(self.blocks, self.block_size)?;
        ascii("product", &self.product, 16)?;
        ascii("revision", &self.revision, 4)?;
        ascii("serial", &self.serial, 64)?;
        if self.wwn >> 60 != 5 {
            return Err(ConfigError::Wwn(self.wwn));
        }
        if self.physical_block_exponent > 15 {
            return Err(ConfigError::PhysicalBlockExponent(
                self.physical_block_exponent,
            ));
        }
        if self.max_transfer_blocks == 0 {
            return Err(ConfigError::ZeroLimit("max_transfer_blocks"));
        }
        if self.max_write_same_blocks == 0 {
            return Err(ConfigError::ZeroLimit("max_write_same_blocks"));
        }
        if let Some(p) = self.provisioning {
            if p.max_unmap_blocks == 0 {
                return Err(ConfigError::ZeroLimit("max_unmap_blocks"));
            }
            if p.max_unmap_descriptors == 0 {
                return Err(ConfigError::ZeroLimit("max_unmap_descriptors"));
            }
        }
        Ok(())
    }
}

/// A capacity is valid when nonzero and its byte size fits 64 bits.
pub(crate) fn check_capacity(blocks: u64, block_size: u32) -> Result<(), ConfigError> {
    if blocks == 0 {
        return Err(ConfigError::ZeroCapacity);
    }
    if blocks.checked_mul(u64::from(block_size)).is_none() {
        return Err(ConfigError::CapacityOverflow { blocks, block_size });
    }
    Ok(())
}

fn ascii(field: &'static str, s: &str, max: usize) -> Result<(), ConfigError> {
    if s.len() > max || !s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(ConfigError::Identity { field, max });
    }
    Ok(())
}

/// A string left-aligned and padded with spaces to `N` bytes (SPC-4).
pub(crate) fn padded<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [b' '; N];
    for (o, b) in out.iter_mut().zip(s.bytes()) {
        *o = b;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const WWN: u64 = 0x5000_1234_5678_9abc;

    #[test]
    fn defaults_are_valid() {
        let c = LuConfig::new(512, 1000, WWN);
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.serial, "5000123456789abc");
        assert_eq!(c.max_transfer_blocks, 8192);
        assert_eq!(LuConfig::new(4096, 1, WWN).max_transfer_blocks, 1024);
    }

    #[test]
    fn rejects() {
        let ok = LuConfig::new(512, 1000, WWN);
        type Case = (fn(&mut LuConfig), ConfigError);
        let cases: [Case; 8] = [
            (|c| c.block_size = 1024, ConfigError::BlockSize(1024)),
            (|c| c.blocks = 0, ConfigError::ZeroCapacity),
            (
                |c| c.blocks = u64::MAX / 256,
                ConfigError::CapacityOverflow {
                    blocks: u64::MAX / 256,
                    block_size: 512,
                },
            ),
            (
                |c| c.product = "x".repeat(17),
                ConfigError::Identity {
                    field: "product",
                    max: 16,
                },
            ),
            (
                |c| c.serial = "tab\t".to_owned(),
                ConfigError::Identity {
                    field: "serial",
                    max: 64,
                },
            ),
            (
                |c| c.wwn = 0x6000_0000_0000_0001,
                ConfigError::Wwn(0x6000_0000_0000_0001),
            ),
            (
                |c| c.physical_block_exponent = 16,
                ConfigError::PhysicalBlockExponent(16),
            ),
            (
                |c| {
                    c.provisioning = Some(Provisioning {
                        max_unmap_descriptors: 0,
                        ..Provisioning::default()
                    })
                },
                ConfigError::ZeroLimit("max_unmap_descriptors"),
            ),
        ];
        for (change, err) in cases {
            let mut c = ok.clone();
            change(&mut c);
            assert_eq!(c.validate(), Err(err));
        }
    }

    #[test]
    fn padding() {
        assert_eq!(&padded::<8>("SQCQ"), b"SQCQ    ");
        assert_eq!(&padded::<4>("toolong"), b"tool");
    }
}
