//! REPORT TARGET PORT GROUPS (SPC-4): one implicit ALUA group holding
//! the one target port, always active/optimized.

use crate::resp::{Response, len32};
use crate::vpd::{RELATIVE_TARGET_PORT, TARGET_PORT_GROUP};

pub(crate) fn report_target_port_groups(extended: bool, r: &mut Response<'_>) {
    r.be32(0); // RETURN DATA LENGTH, patched below
    if extended {
        r.u8(0x10); // FORMAT TYPE 001b
        r.u8(0); // IMPLICIT TRANSITION TIME
        r.zeros(2);
    }
    r.u8(0x80); // PREF, ASYMMETRIC ACCESS STATE 0h: active/optimized
    r.u8(0x01); // AO_SUP only
    r.be16(TARGET_PORT_GROUP);
    r.u8(0);
    r.u8(0x00); // STATUS CODE: no status available
    r.u8(0);
    r.u8(1); // TARGET PORT COUNT
    r.zeros(2);
    r.be16(RELATIVE_TARGET_PORT);
    let n = len32(r.len() - 4);
    r.set(0, &n.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use crate::test_util::{A, execute_data, lu};

    const GROUP: [u8; 12] = [0x80, 0x01, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1];

    #[test]
    fn length_only_header() {
        let d = execute_data(&lu(), A, &[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]);
        let mut expect = vec![0, 0, 0, 12];
        expect.extend_from_slice(&GROUP);
        assert_eq!(d, expect);
    }

    #[test]
    fn extended_header() {
        let d = execute_data(&lu(), A, &[0xa3, 0x2a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]);
        let mut expect = vec![0, 0, 0, 16, 0x10, 0, 0, 0];
        expect.extend_from_slice(&GROUP);
        assert_eq!(d, expect);
    }

    #[test]
    fn truncated() {
        let d = execute_data(&lu(), A, &[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0]);
        assert_eq!(d, [0, 0, 0, 12, 0x80, 0x01]);
    }
}
