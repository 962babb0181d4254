//! The one table of supported commands: for each operation code (and
//! service action) the CDB length and the CDB usage data of REPORT
//! SUPPORTED OPERATION CODES (SPC-4), a mask of the bits the device server
//! evaluates.
//!
//! The same masks serve two ends, so they cannot drift apart: CDB parsing
//! rejects any bit outside the mask with INVALID FIELD IN CDB (that is how
//! reserved bits are checked), and REPORT SUPPORTED OPERATION CODES reports
//! them.

/// Operation codes.
pub(crate) mod op {
    pub(crate) const TEST_UNIT_READY: u8 = 0x00;
    pub(crate) const REQUEST_SENSE: u8 = 0x03;
    pub(crate) const READ_6: u8 = 0x08;
    pub(crate) const WRITE_6: u8 = 0x0a;
    pub(crate) const INQUIRY: u8 = 0x12;
    pub(crate) const MODE_SELECT_6: u8 = 0x15;
    pub(crate) const MODE_SENSE_6: u8 = 0x1a;
    pub(crate) const START_STOP_UNIT: u8 = 0x1b;
    pub(crate) const READ_CAPACITY_10: u8 = 0x25;
    pub(crate) const READ_10: u8 = 0x28;
    pub(crate) const WRITE_10: u8 = 0x2a;
    pub(crate) const VERIFY_10: u8 = 0x2f;
    pub(crate) const SYNCHRONIZE_CACHE_10: u8 = 0x35;
    pub(crate) const WRITE_SAME_10: u8 = 0x41;
    pub(crate) const UNMAP: u8 = 0x42;
    pub(crate) const MODE_SELECT_10: u8 = 0x55;
    pub(crate) const MODE_SENSE_10: u8 = 0x5a;
    pub(crate) const PERSISTENT_RESERVE_IN: u8 = 0x5e;
    pub(crate) const PERSISTENT_RESERVE_OUT: u8 = 0x5f;
    pub(crate) const READ_16: u8 = 0x88;
    pub(crate) const WRITE_16: u8 = 0x8a;
    pub(crate) const VERIFY_16: u8 = 0x8f;
    pub(crate) const SYNCHRONIZE_CACHE_16: u8 = 0x91;
    pub(crate) const WRITE_SAME_16: u8 = 0x93;
    pub(crate) const SERVICE_ACTION_IN_16: u8 = 0x9e;
    pub(crate) const REPORT_LUNS: u8 = 0xa0;
    pub(crate) const MAINTENANCE_IN: u8 = 0xa3;
    pub(crate) const READ_12: u8 = 0xa8;
    pub(crate) const WRITE_12: u8 = 0xaa;

    /// SERVICE ACTION IN(16) service action READ CAPACITY(16).
    pub(crate) const SA_READ_CAPACITY_16: u8 = 0x10;
    /// MAINTENANCE IN service action REPORT TARGET PORT GROUPS.
    pub(crate) const SA_REPORT_TARGET_PORT_GROUPS: u8 = 0x0a;
    /// MAINTENANCE IN service action REPORT SUPPORTED OPERATION CODES.
    pub(crate) const SA_REPORT_SUPPORTED_OPCODES: u8 = 0x0c;
}

/// Control byte: NACA is evaluated (and refused), LINK and the vendor bits
/// are not.
pub(crate) const CONTROL: u8 = 0x04;

/// One supported command.
#[derive(Debug)]
pub(crate) struct Usage {
    pub(crate) opcode: u8,
    /// Service action in byte 1 bits 4:0, for opcodes that have them.
    pub(crate) service_action: Option<u8>,
    /// CDB usage data; its length is the CDB length. Byte 0 is the opcode.
    pub(crate) mask: &'static [u8],
    /// The bits a CDB of this command may not set, byte `i` of the CDB at
    /// bits `8 * i..8 * i + 8` (little-endian): those outside `mask` after
    /// the opcode, and NACA in the control byte. One AND of the CDB's
    /// first 16 bytes with it tells a valid CDB (see [`reject`]).
    pub(crate) reject: u128,
}

/// The `reject` bits of a command of usage data `mask` (at most 16 bytes).
const fn reject(mask: &[u8]) -> u128 {
    assert!(!mask.is_empty() && mask.len() <= 16);
    let mut bits = 0u128;
    let mut i = 1;
    while i < mask.len() {
        bits |= ((!mask[i]) as u128) << (8 * i);
        i += 1;
    }
    // NACA = 1 asks for ACA, which this target does not support.
    bits | ((CONTROL as u128) << (8 * (mask.len() - 1)))
}

const C: u8 = CONTROL;
const FF: u8 = 0xff;

const TUR: [u8; 6] = [op::TEST_UNIT_READY, 0, 0, 0, 0, C];
const REQUEST_SENSE: [u8; 6] = [op::REQUEST_SENSE, 0x01, 0, 0, FF, C];
const RW6: [u8; 6] = [0, 0x1f, FF, FF, FF, C];
const INQUIRY: [u8; 6] = [op::INQUIRY, 0x01, FF, FF, FF, C];
const MODE_SELECT_6: [u8; 6] = [op::MODE_SELECT_6, 0x11, 0, 0, FF, C];
const MODE_SENSE_6: [u8; 6] = [op::MODE_SENSE_6, 0x08, FF, FF, FF, C];
const START_STOP: [u8; 6] = [op::START_STOP_UNIT, 0x01, 0, 0x0f, 0xf7, C];
const READ_CAPACITY_10: [u8; 10] = [op::READ_CAPACITY_10, 0, FF, FF, FF, FF, 0, 0, 0x01, C];
/// READ/WRITE(10): DPO, FUA, FUA_NV; no protection information.
const RW10: [u8; 10] = [0, 0x1a, FF, FF, FF, FF, 0x1f, FF, FF, C];
/// VERIFY(10): DPO only (BYTCHK and VRPROTECT must be zero).
const VERIFY_10: [u8; 10] = [op::VERIFY_10, 0x10, FF, FF, FF, FF, 0x1f, FF, FF, C];
const SYNC_10: [u8; 10] = [
    op::SYNCHRONIZE_CACHE_10,
    0x02,
    FF,
    FF,
    FF,
    FF,
    0x1f,
    FF,
    FF,
    C,
];
/// WRITE SAME(10): UNMAP only (ANCHOR, PBDATA, LBDATA unsupported).
const WRITE_SAME_10: [u8; 10] = [op::WRITE_SAME_10, 0x08, FF, FF, FF, FF, 0x1f, FF, FF, C];
/// UNMAP: ANCHOR unsupported.
const UNMAP: [u8; 10] = [op::UNMAP, 0, 0, 0, 0, 0, 0x1f, FF, FF, C];
const MODE_SELECT_10: [u8; 10] = [op::MODE_SELECT_10, 0x11, 0, 0, 0, 0, 0, FF, FF, C];
const MODE_SENSE_10: [u8; 10] = [op::MODE_SENSE_10, 0x18, FF, FF, 0, 0, 0, FF, FF, C];
const PR_IN: [u8; 10] = [op::PERSISTENT_RESERVE_IN, 0x1f, 0, 0, 0, 0, 0, FF, FF, C];
const PR_OUT: [u8; 10] = [
    op::PERSISTENT_RESERVE_OUT,
    0x1f,
    FF,
    0,
    0,
    FF,
    FF,
    FF,
    FF,
    C,
];
const RW12: [u8; 12] = [0, 0x1a, FF, FF, FF, FF, FF, FF, FF, FF, 0x1f, C];
const RW16: [u8; 16] = [
    0, 0x1a, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, FF, 0x1f, C,
];
const VERIFY_16: [u8; 16] = [
    op::VERIFY_16,
    0x10,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    0x1f,
    C,
];
const SYNC_16: [u8; 16] = [
    op::SYNCHRONIZE_CACHE_16,
    0x02,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    0x1f,
    C,
];
/// WRITE SAME(16): UNMAP and NDOB.
const WRITE_SAME_16: [u8; 16] = [
    op::WRITE_SAME_16,
    0x09,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    0x1f,
    C,
];
const READ_CAPACITY_16: [u8; 16] = [
    op::SERVICE_ACTION_IN_16,
    0x1f,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    0x01,
    C,
];
const REPORT_LUNS: [u8; 12] = [op::REPORT_LUNS, 0, FF, 0, 0, 0, FF, FF, FF, FF, 0, C];
/// REPORT TARGET PORT GROUPS: PARAMETER DATA FORMAT in bits 7:5.
const RTPG: [u8; 12] = [op::MAINTENANCE_IN, 0xff, 0, 0, 0, 0, FF, FF, FF, FF, 0, C];
/// REPORT SUPPORTED OPERATION CODES: RCTD and REPORTING OPTIONS.
const RSOC: [u8; 12] = [
    op::MAINTENANCE_IN,
    0x1f,
    0x87,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    FF,
    0,
    C,
];

const fn with_opcode<const N: usize>(mut mask: [u8; N], opcode: u8) -> [u8; N] {
    mask[0] = opcode;
    mask
}

const READ_6: [u8; 6] = with_opcode(RW6, op::READ_6);
const WRITE_6: [u8; 6] = with_opcode(RW6, op::WRITE_6);
const READ_10: [u8; 10] = with_opcode(RW10, op::READ_10);
const WRITE_10: [u8; 10] = with_opcode(RW10, op::WRITE_10);
const READ_12: [u8; 12] = with_opcode(RW12, op::READ_12);
const WRITE_12: [u8; 12] = with_opcode(RW12, op::WRITE_12);
const READ_16: [u8; 16] = with_opcode(RW16, op::READ_16);
const WRITE_16: [u8; 16] = with_opcode(RW16, op::WRITE_16);

const fn plain(opcode: u8, mask: &'static [u8]) -> Usage {
    Usage {
        opcode,
        service_action: None,
        mask,
        reject: reject(mask),
    }
}

const fn with_sa(opcode: u8, sa: u8, mask: &'static [u8]) -> Usage {
    Usage {
        opcode,
        service_action: Some(sa),
        mask,
        reject: reject(mask),
    }
}

/// Every supported command, in opcode and service action order (the order
/// REPORT SUPPORTED OPERATION CODES lists them).
pub(crate) static COMMANDS: &[Usage] = TABLE;

/// Per operation code, 1 + the index of its first entry in [`COMMANDS`]
/// (0: not supported), so that [`lookup`] finds a command without a
/// search.
#[expect(
    clippy::cast_possible_truncation,
    reason = "asserted below: the table has fewer than 255 entries"
)]
static BY_OPCODE: [u8; 256] = {
    assert!(TABLE.len() < 255);
    let mut by = [0u8; 256];
    let mut i = TABLE.len();
    // Backwards, so that the first entry of an opcode is the one left.
    while i > 0 {
        i -= 1;
        by[TABLE[i].opcode as usize] = (i + 1) as u8;
    }
    by
};

const TABLE: &[Usage] = &[
    plain(op::TEST_UNIT_READY, &TUR),
    plain(op::REQUEST_SENSE, &REQUEST_SENSE),
    plain(op::READ_6, &READ_6),
    plain(op::WRITE_6, &WRITE_6),
    plain(op::INQUIRY, &INQUIRY),
    plain(op::MODE_SELECT_6, &MODE_SELECT_6),
    plain(op::MODE_SENSE_6, &MODE_SENSE_6),
    plain(op::START_STOP_UNIT, &START_STOP),
    plain(op::READ_CAPACITY_10, &READ_CAPACITY_10),
    plain(op::READ_10, &READ_10),
    plain(op::WRITE_10, &WRITE_10),
    plain(op::VERIFY_10, &VERIFY_10),
    plain(op::SYNCHRONIZE_CACHE_10, &SYNC_10),
    plain(op::WRITE_SAME_10, &WRITE_SAME_10),
    plain(op::UNMAP, &UNMAP),
    plain(op::MODE_SELECT_10, &MODE_SELECT_10),
    plain(op::MODE_SENSE_10, &MODE_SENSE_10),
    with_sa(op::PERSISTENT_RESERVE_IN, 0x00, &PR_IN),
    with_sa(op::PERSISTENT_RESERVE_IN, 0x01, &PR_IN),
    with_sa(op::PERSISTENT_RESERVE_IN, 0x02, &PR_IN),
    with_sa(op::PERSISTENT_RESERVE_OUT, 0x00, &PR_OUT),
    with_sa(op::PERSISTENT_RESERVE_OUT, 0x01, &PR_OUT),
    with_sa(op::PERSISTENT_RESERVE_OUT, 0x02, &PR_OUT),
    with_sa(op::PERSISTENT_RESERVE_OUT, 0x03, &PR_OUT),
    with_sa(op::PERSISTENT_RESERVE_OUT, 0x04, &PR_OUT),
    with_sa(op::PERSISTENT_RESERVE_OUT, 0x05, &PR_OUT),
    with_sa(op::PERSISTENT_RESERVE_OUT, 0x06, &PR_OUT),
    plain(op::READ_16, &READ_16),
    plain(op::WRITE_16, &WRITE_16),
    plain(op::VERIFY_16, &VERIFY_16),
    plain(op::SYNCHRONIZE_CACHE_16, &SYNC_16),
    plain(op::WRITE_SAME_16, &WRITE_SAME_16),
    with_sa(
        op::SERVICE_ACTION_IN_16,
        op::SA_READ_CAPACITY_16,
        &READ_CAPACITY_16,
    ),
    plain(op::REPORT_LUNS, &REPORT_LUNS),
    with_sa(op::MAINTENANCE_IN, op::SA_REPORT_TARGET_PORT_GROUPS, &RTPG),
    with_sa(op::MAINTENANCE_IN, op::SA_REPORT_SUPPORTED_OPCODES, &RSOC),
    plain(op::READ_12, &READ_12),
    plain(op::WRITE_12, &WRITE_12),
];

/// Operation codes whose byte 1 bits 4:0 carry a service action.
pub(crate) const fn has_service_actions(opcode: u8) -> bool {
    matches!(
        opcode,
        op::PERSISTENT_RESERVE_IN
            | op::PERSISTENT_RESERVE_OUT
            | op::SERVICE_ACTION_IN_16
            | op::MAINTENANCE_IN
    )
}

/// What the table says about an opcode and service action.
#[derive(Debug)]
pub(crate) enum Lookup {
    Supported(&'static Usage),
    UnsupportedOpcode,
    UnsupportedServiceAction,
}

/// Looks a command up; `service_action` is ignored for opcodes without
/// service actions. This runs for every command: one index by opcode,
/// then, for the few opcodes with service actions, a scan of that
/// opcode's entries.
pub(crate) fn lookup(opcode: u8, service_action: u8) -> Lookup {
    let Some(first) = usize::from(BY_OPCODE[usize::from(opcode)]).checked_sub(1) else {
        return Lookup::UnsupportedOpcode;
    };
    let mut entries = COMMANDS
        .get(first..)
        .unwrap_or_default()
        .iter()
        .take_while(|u| u.opcode == opcode);
    if !has_service_actions(opcode) {
        return entries
            .next()
            .map_or(Lookup::UnsupportedOpcode, Lookup::Supported);
    }
    entries
        .find(|u| u.service_action == Some(service_action))
        .map_or(Lookup::UnsupportedServiceAction, Lookup::Supported)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_consistent() {
        let mut prev = None;
        for u in COMMANDS {
            let len = u.mask.len();
            assert_eq!(u.mask[0], u.opcode, "{u:?}");
            assert_eq!(u.mask[len - 1], CONTROL, "{u:?}");
            // Group code fixes the CDB length (SPC-4).
            let expect = match u.opcode >> 5 {
                0 => 6,
                1 | 2 => 10,
                4 => 16,
                5 => 12,
                _ => unreachable!("no vendor or variable-length opcodes"),
            };
            assert_eq!(len, expect, "{u:?}");
            assert_eq!(u.service_action.is_some(), has_service_actions(u.opcode));
            if let Some(sa) = u.service_action {
                assert_eq!(u.mask[1] & 0x1f, 0x1f, "service action bits evaluated");
                assert!(sa <= 0x1f);
            }
            let key = (u.opcode, u.service_action);
            assert!(prev < Some(key), "sorted and unique: {u:?}");
            prev = Some(key);
        }
    }

    #[test]
    fn lookup_finds_every_entry_and_nothing_else() {
        for u in COMMANDS {
            let sa = u.service_action.unwrap_or(0x1f);
            assert!(
                matches!(lookup(u.opcode, sa), Lookup::Supported(f) if std::ptr::eq(f, u)),
                "{u:?}"
            );
        }
        for opcode in 0..=u8::MAX {
            if !COMMANDS.iter().any(|u| u.opcode == opcode) {
                assert!(
                    matches!(lookup(opcode, 0), Lookup::UnsupportedOpcode),
                    "{opcode:#x}"
                );
            }
        }
    }

    #[test]
    fn lookup_distinguishes_opcode_and_service_action() {
        assert!(
            matches!(lookup(op::READ_10, 0x1f), Lookup::Supported(u) if u.opcode == op::READ_10)
        );
        assert!(matches!(lookup(0xff, 0), Lookup::UnsupportedOpcode));
        assert!(matches!(
            lookup(op::MAINTENANCE_IN, 0x05),
            Lookup::UnsupportedServiceAction
        ));
        assert!(matches!(
            lookup(op::SERVICE_ACTION_IN_16, op::SA_READ_CAPACITY_16),
            Lookup::Supported(_)
        ));
        assert!(matches!(
            lookup(op::PERSISTENT_RESERVE_OUT, 0x07),
            Lookup::UnsupportedServiceAction
        ));
    }
}
