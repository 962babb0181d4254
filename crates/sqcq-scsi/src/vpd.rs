//! Vital product data pages (SPC-4, SBC-3): supported pages, unit
//! serial number, device identification, block limits, block device
//! characteristics, logical block provisioning.

use crate::config::{LuConfig, padded};
use crate::error::ScsiError;
use crate::inquiry::VENDOR;
use crate::resp::{Response, len16};

/// Supported pages, in ascending order.
const PAGES: [u8; 6] = [0x00, 0x80, 0x83, 0xb0, 0xb1, 0xb2];

/// Target port group and relative target port of the one port (ALUA).
pub(crate) const TARGET_PORT_GROUP: u16 = 1;
pub(crate) const RELATIVE_TARGET_PORT: u16 = 1;

/// Lower-case hex digits of `v`, without allocating.
fn hex(v: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let nibble = (v >> (60 - 4 * i)) & 0xf;
        *o = b"0123456789abcdef"[usize::try_from(nibble).unwrap_or(0)];
    }
    out
}

/// Writes VPD page `page` of the unit `config` describes: a 4-byte
/// header (device type, page code, page length) and the page.
pub(crate) fn page(config: &LuConfig, page: u8, r: &mut Response<'_>) -> Result<(), ScsiError> {
    if !PAGES.contains(&page) {
        return Err(ScsiError::cdb_field(2, Some(7)));
    }
    r.u8(0x00); // peripheral qualifier 000b, direct access block device
    r.u8(page);
    r.be16(0); // page length, patched below
    let start = r.len();
    match page {
        0x00 => r.put(&PAGES),
        0x80 => r.put(config.serial.as_bytes()),
        0x83 => device_identification(config, r),
        0xb0 => block_limits(config, r),
        0xb1 => {
            r.be16(0x0001); // MEDIUM ROTATION RATE: non-rotating medium
            r.zeros(58);
        }
        _ => logical_block_provisioning(config, r),
    }
    let len = len16(r.len() - start);
    r.set(2, &len.to_be_bytes());
    Ok(())
}

fn device_identification(config: &LuConfig, r: &mut Response<'_>) {
    // NAA IEEE Registered (type 5): binary, LU association, NAA type.
    r.put(&[0x01, 0x03, 0x00, 0x08]);
    r.be64(config.wwn);
    // T10 vendor ID: ASCII, LU association, vendor then serial (or the
    // WWN in hex when there is no serial).
    let wwn_hex = hex(config.wwn);
    let id = if config.serial.is_empty() {
        &wwn_hex[..]
    } else {
        config.serial.as_bytes()
    };
    let len = u8::try_from(8 + id.len()).unwrap_or(u8::MAX);
    r.put(&[0x02, 0x01, 0x00, len]);
    r.put(&padded::<8>(VENDOR));
    r.put(id);
    // Relative target port: binary, target port association, type 4.
    r.put(&[0x01, 0x14, 0x00, 0x04, 0x00, 0x00]);
    r.be16(RELATIVE_TARGET_PORT);
    // Target port group: binary, target port association, type 5.
    r.put(&[0x01, 0x15, 0x00, 0x04, 0x00, 0x00]);
    r.be16(TARGET_PORT_GROUP);
}

fn block_limits(c: &LuConfig, r: &mut Response<'_>) {
    r.u8(0x01); // WSNZ: WRITE SAME of zero blocks is rejected
    r.u8(0x00); // MAXIMUM COMPARE AND WRITE LENGTH: not supported
    r.be16(c.optimal_granularity_blocks);
    r.be32(c.max_transfer_blocks);
    r.be32(c.optimal_transfer_blocks);
    r.be32(0); // MAXIMUM PREFETCH LENGTH
    match c.provisioning {
        Some(p) => {
            r.be32(p.max_unmap_blocks);
            r.be32(p.max_unmap_descriptors);
            r.be32(p.unmap_granularity_blocks);
            // UGAVALID with alignment 0 when a granularity is given.
            r.be32(if p.unmap_granularity_blocks != 0 {
                0x8000_0000
            } else {
                0
            });
        }
        None => r.zeros(16),
    }
    r.be64(u64::from(c.max_write_same_blocks));
    r.zeros(20); // atomic transfer limits: not supported
}

fn logical_block_provisioning(config: &LuConfig, r: &mut Response<'_>) {
    r.u8(0x00); // THRESHOLD EXPONENT
    match config.provisioning {
        Some(p) => {
            // LBPU, LBPWS, LBPWS10, and LBPRZ when unmapped blocks read
            // as zeros.
            r.u8(0xe0 | if p.unmapped_reads_zero { 0x04 } else { 0 });
            r.u8(0x02); // PROVISIONING TYPE: thin
        }
        None => r.zeros(2),
    }
    r.u8(0x00);
}

#[cfg(test)]
mod tests {
    use crate::error::ScsiError;
    use crate::test_util::{A, execute, execute_data, lu, lu_with};

    fn page(lu: &crate::LogicalUnit, p: u8) -> Vec<u8> {
        execute_data(lu, A, &[0x12, 0x01, p, 0x10, 0x00, 0])
    }

    #[test]
    fn supported_pages() {
        assert_eq!(
            page(&lu(), 0x00),
            [0, 0x00, 0, 6, 0x00, 0x80, 0x83, 0xb0, 0xb1, 0xb2]
        );
    }

    #[test]
    fn unit_serial_number() {
        let mut d = vec![0, 0x80, 0, 8];
        d.extend_from_slice(b"SERIAL01");
        assert_eq!(page(&lu(), 0x80), d);
    }

    #[test]
    fn device_identification() {
        let d = page(&lu(), 0x83);
        let mut expect = vec![0, 0x83, 0, 48];
        expect.extend_from_slice(&[0x01, 0x03, 0x00, 0x08]);
        expect.extend_from_slice(&0x5001_4050_0000_0001u64.to_be_bytes());
        expect.extend_from_slice(&[0x02, 0x01, 0x00, 16]);
        expect.extend_from_slice(b"SQCQ    SERIAL01");
        expect.extend_from_slice(&[0x01, 0x14, 0, 4, 0, 0, 0, 1]);
        expect.extend_from_slice(&[0x01, 0x15, 0, 4, 0, 0, 0, 1]);
        assert_eq!(d, expect);
    }

    #[test]
    fn block_limits() {
        let d = page(&lu(), 0xb0);
        assert_eq!(d.len(), 64);
        assert_eq!(&d[..4], &[0, 0xb0, 0, 0x3c]);
        assert_eq!(d[4], 0x01);
        assert_eq!(&d[8..12], &128u32.to_be_bytes());
        assert_eq!(&d[20..24], &1000u32.to_be_bytes());
        assert_eq!(&d[24..28], &4u32.to_be_bytes());
        assert_eq!(&d[28..36], &[0, 0, 0, 8, 0x80, 0, 0, 0]);
        assert_eq!(&d[36..44], &256u64.to_be_bytes());
    }

    #[test]
    fn block_device_characteristics() {
        let d = page(&lu(), 0xb1);
        assert_eq!(d.len(), 64);
        assert_eq!(&d[..6], &[0, 0xb1, 0, 0x3c, 0x00, 0x01]);
    }

    #[test]
    fn logical_block_provisioning() {
        assert_eq!(page(&lu(), 0xb2), [0, 0xb2, 0, 4, 0, 0xe4, 0x02, 0]);
        let full = lu_with(|c| c.provisioning = None);
        assert_eq!(page(&full, 0xb2), [0, 0xb2, 0, 4, 0, 0, 0, 0]);
        let b0 = page(&full, 0xb0);
        assert_eq!(&b0[20..36], &[0; 16]);
    }

    #[test]
    fn t10_vendor_id_falls_back_to_the_wwn() {
        let d = page(&lu_with(|c| c.serial.clear()), 0x83);
        assert_eq!(&d[16..20], &[0x02, 0x01, 0x00, 24]);
        assert_eq!(&d[20..44], b"SQCQ    5001405000000001");
    }

    #[test]
    fn unknown_page_is_invalid_field() {
        assert_eq!(
            execute(&lu(), A, &[0x12, 0x01, 0x89, 0, 255, 0]),
            Err(ScsiError::cdb_field(2, Some(7)))
        );
    }

    #[test]
    fn page_truncated_by_allocation_length() {
        let d = execute_data(&lu(), A, &[0x12, 0x01, 0x83, 0, 10, 0]);
        assert_eq!(&d, &[0, 0x83, 0, 48, 0x01, 0x03, 0x00, 0x08, 0x50, 0x01]);
    }
}
