//! The capacity: READ CAPACITY(10) and (16) (SBC-3), and the range check
//! every medium command makes against it.

use crate::config::LuConfig;
use crate::error::ScsiError;
use crate::resp::Response;

/// LBA OUT OF RANGE unless `lba` is within the capacity and `lba + blocks`
/// does not pass its end (without overflow).
pub(crate) fn check_range(lba: u64, blocks: u64, capacity: u64) -> Result<(), ScsiError> {
    match lba.checked_add(blocks) {
        Some(end) if lba < capacity && end <= capacity => Ok(()),
        _ => Err(ScsiError::LbaOutOfRange { lba, blocks }),
    }
}

fn last_lba(capacity: u64) -> u64 {
    // The capacity is at least one block (config::check_capacity).
    capacity.saturating_sub(1)
}

/// READ CAPACITY(10) data of a unit of `capacity` blocks.
pub(crate) fn read_capacity_10(config: &LuConfig, capacity: u64, r: &mut Response<'_>) {
    // A last LBA that does not fit 32 bits reads FFFFFFFFh: the
    // initiator must use READ CAPACITY(16).
    r.be32(u32::try_from(last_lba(capacity)).unwrap_or(u32::MAX));
    r.be32(config.block_size);
}

/// READ CAPACITY(16) data of a unit of `capacity` blocks.
pub(crate) fn read_capacity_16(config: &LuConfig, capacity: u64, r: &mut Response<'_>) {
    r.be64(last_lba(capacity));
    r.be32(config.block_size);
    r.u8(0x00); // no protection information
    r.u8(config.physical_block_exponent & 0x0f);
    let mut b14 = 0;
    if let Some(p) = config.provisioning {
        b14 |= 0x80; // LBPME
        if p.unmapped_reads_zero {
            b14 |= 0x40; // LBPRZ
        }
    }
    r.u8(b14); // lowest aligned LBA is 0
    r.u8(0x00);
    r.zeros(16);
}

#[cfg(test)]
mod tests {
    use crate::test_util::{A, execute_data, lu, lu_with};

    const RC10: [u8; 10] = [0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    const RC16: [u8; 16] = [0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0];

    #[test]
    fn read_capacity_10() {
        assert_eq!(
            execute_data(&lu(), A, &RC10),
            [0, 0, 0x03, 0xe7, 0, 0, 0x02, 0]
        );
    }

    #[test]
    fn read_capacity_10_saturates() {
        let big = lu_with(|c| c.blocks = 1 << 33);
        assert_eq!(
            execute_data(&big, A, &RC10),
            [0xff, 0xff, 0xff, 0xff, 0, 0, 0x02, 0]
        );
        let exact = lu_with(|c| c.blocks = 1 << 32);
        assert_eq!(
            &execute_data(&exact, A, &RC10)[..4],
            &[0xff, 0xff, 0xff, 0xff]
        );
        let fits = lu_with(|c| c.blocks = u64::from(u32::MAX));
        assert_eq!(
            &execute_data(&fits, A, &RC10)[..4],
            &[0xff, 0xff, 0xff, 0xfe]
        );
    }

    #[test]
    fn read_capacity_16() {
        let lu = lu_with(|c| {
            c.blocks = 1 << 33;
            c.block_size = 4096;
            c.physical_block_exponent = 3;
        });
        let d = execute_data(&lu, A, &RC16);
        assert_eq!(d.len(), 32);
        assert_eq!(&d[..8], &((1u64 << 33) - 1).to_be_bytes());
        assert_eq!(&d[8..12], &4096u32.to_be_bytes());
        assert_eq!(&d[12..16], &[0x00, 0x03, 0xc0, 0x00]);
        assert!(d[16..].iter().all(|&b| b == 0));
    }

    #[test]
    fn read_capacity_16_without_provisioning_and_truncated() {
        let lu = lu_with(|c| c.provisioning = None);
        let d = execute_data(&lu, A, &RC16);
        assert_eq!(d[14], 0x00);
        let mut short = RC16;
        short[13] = 12;
        assert_eq!(execute_data(&lu, A, &short).len(), 12);
    }

    #[test]
    fn unmapped_not_zero_clears_lbprz() {
        let lu = lu_with(|c| {
            if let Some(p) = c.provisioning.as_mut() {
                p.unmapped_reads_zero = false;
            }
        });
        assert_eq!(execute_data(&lu, A, &RC16)[14], 0x80);
    }
}
