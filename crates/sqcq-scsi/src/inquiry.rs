//! Standard INQUIRY data (SPC-4), for a logical unit and for a LUN
//! that does not exist.

use crate::config::{LuConfig, padded};
use crate::resp::Response;

/// Vendor identification of every logical unit.
pub const VENDOR: &str = "SQCQ";

/// Length of the standard INQUIRY data returned (through the version
/// descriptors).
const STANDARD_LEN: u8 = 74;

/// Version descriptors: SAM-5, SPC-4, SBC-3 (no version claimed).
const VERSION_DESCRIPTORS: [u16; 3] = [0x00a0, 0x0460, 0x04c0];

/// Standard INQUIRY data of the unit `config` describes.
pub(crate) fn standard(config: &LuConfig, r: &mut Response<'_>) {
    r.u8(0x00); // peripheral qualifier 000b, direct access block device
    r.u8(0x00); // not removable
    r.u8(0x06); // VERSION: SPC-4
    r.u8(0x12); // HISUP, RESPONSE DATA FORMAT 2
    r.u8(STANDARD_LEN - 5); // ADDITIONAL LENGTH
    r.u8(0x10); // TPGS 01b: implicit ALUA
    r.u8(0x00);
    r.u8(0x02); // CMDQUE
    r.put(&padded::<8>(VENDOR));
    r.put(&padded::<16>(&config.product));
    r.put(&padded::<4>(&config.revision));
    r.zeros(20); // vendor specific
    r.zeros(2); // clocking, QAS, IUS; reserved
    for v in VERSION_DESCRIPTORS {
        r.be16(v);
    }
    r.zeros(16 - 2 * VERSION_DESCRIPTORS.len());
}

/// Standard INQUIRY data for a LUN with no logical unit: peripheral
/// qualifier 011b, device type 1Fh (SPC-4).
pub(crate) fn absent(r: &mut Response<'_>) {
    r.u8(0x7f);
    r.u8(0x00);
    r.u8(0x06);
    r.u8(0x12);
    r.u8(31);
    r.zeros(3);
    r.put(&padded::<8>(VENDOR));
    r.put(&padded::<16>(""));
    r.put(&padded::<4>(""));
}

#[cfg(test)]
mod tests {
    use crate::test_util::{A, execute_data, lu};

    #[test]
    fn standard_data() {
        let lu = lu();
        let d = execute_data(&lu, A, &[0x12, 0, 0, 0, 255, 0]);
        assert_eq!(d.len(), 74);
        assert_eq!(&d[..8], &[0x00, 0x00, 0x06, 0x12, 69, 0x10, 0x00, 0x02]);
        assert_eq!(&d[8..16], b"SQCQ    ");
        assert_eq!(&d[16..32], b"test disk       ");
        assert_eq!(&d[32..36], b"1.0 ");
        assert_eq!(&d[58..64], &[0x00, 0xa0, 0x04, 0x60, 0x04, 0xc0]);
    }

    #[test]
    fn allocation_length_truncates() {
        let lu = lu();
        assert_eq!(execute_data(&lu, A, &[0x12, 0, 0, 0, 36, 0]).len(), 36);
        assert_eq!(execute_data(&lu, A, &[0x12, 0, 0, 0, 5, 0]).len(), 5);
        assert_eq!(execute_data(&lu, A, &[0x12, 0, 0, 0, 0, 0]).len(), 0);
        assert_eq!(execute_data(&lu, A, &[0x12, 0, 0, 0x10, 0, 0]).len(), 74);
    }
}
