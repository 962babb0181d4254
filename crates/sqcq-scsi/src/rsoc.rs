//! REPORT SUPPORTED OPERATION CODES (SPC-4), built from the same
//! table that CDB parsing checks against.

use crate::error::ScsiError;
use crate::resp::{Response, len16, len32};
use crate::usage::{COMMANDS, Usage, has_service_actions, op};

/// Length of a command timeouts descriptor (SPC-4).
const TIMEOUTS_LEN: usize = 12;

/// Largest response: every command descriptor with a timeouts descriptor.
pub(crate) const MAX_RESPONSE_LEN: usize = 4 + (8 + TIMEOUTS_LEN) * COMMANDS.len();

fn listed(u: &Usage, unmap: bool) -> bool {
    unmap || u.opcode != op::UNMAP
}

fn timeouts(r: &mut Response<'_>) {
    // Timeouts are not specified: zero nominal and recommended values.
    r.be16(0x000a);
    r.zeros(10);
}

/// Writes the response. `unmap` says whether UNMAP is supported by this
/// logical unit.
pub(crate) fn report(
    with_timeouts: bool,
    options: u8,
    opcode: u8,
    service_action: u16,
    unmap: bool,
    r: &mut Response<'_>,
) -> Result<(), ScsiError> {
    if options == 0 {
        r.be32(0); // COMMAND DATA LENGTH, patched below
        for u in COMMANDS.iter().filter(|u| listed(u, unmap)) {
            r.u8(u.opcode);
            r.u8(0);
            r.be16(u.service_action.map_or(0, u16::from));
            r.u8(0);
            r.u8(u8::from(with_timeouts) << 1 | u8::from(u.service_action.is_some()));
            r.be16(len16(u.mask.len()));
            if with_timeouts {
                timeouts(r);
            }
        }
        let n = len32(r.len() - 4);
        r.set(0, &n.to_be_bytes());
        return Ok(());
    }
    let has_sa = has_service_actions(opcode);
    // Option 1: opcode only, which must not have service actions.
    // Option 2: opcode and service action, which it must have.
    // Option 3: service action used only if the opcode has them.
    match (options, has_sa) {
        (1, true) | (2, false) => return Err(ScsiError::cdb_field(2, Some(2))),
        _ => {}
    }
    let sa = if has_sa {
        match u8::try_from(service_action) {
            Ok(sa) if sa <= 0x1f => Some(sa),
            _ => return Err(ScsiError::cdb_field(4, Some(7))),
        }
    } else {
        None
    };
    let found = COMMANDS
        .iter()
        .find(|u| u.opcode == opcode && u.service_action == sa && listed(u, unmap));
    match found {
        Some(u) => {
            r.u8(0);
            r.u8(u8::from(with_timeouts) << 7 | 0x03); // CTDP, SUPPORT 011b
            r.be16(len16(u.mask.len()));
            r.put(u.mask);
            if with_timeouts {
                timeouts(r);
            }
        }
        None => {
            r.u8(0);
            r.u8(0x01); // SUPPORT 001b: not supported
            r.be16(0);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::cdb::Command;
    use crate::error::ScsiError;
    use crate::test_util::{A, execute, execute_data, lu, lu_with};
    use crate::usage::COMMANDS;

    fn rsoc(rctd: bool, options: u8, opcode: u8, sa: u16) -> [u8; 12] {
        let [s0, s1] = sa.to_be_bytes();
        let opt = options | if rctd { 0x80 } else { 0 };
        [0xa3, 0x0c, opt, opcode, s0, s1, 0, 0, 0x10, 0, 0, 0]
    }

    #[test]
    fn all_commands() {
        let d = execute_data(&lu(), A, &rsoc(false, 0, 0, 0));
        let n = COMMANDS.len();
        assert_eq!(d.len(), 4 + 8 * n);
        assert_eq!(&d[..4], &u32::try_from(8 * n).unwrap().to_be_bytes());
        // TEST UNIT READY first, then REQUEST SENSE.
        assert_eq!(
            &d[4..20],
            &[0, 0, 0, 0, 0, 0, 0, 6, 0x03, 0, 0, 0, 0, 0, 0, 6]
        );
        // The READ CAPACITY(16) descriptor has SERVACTV and its action.
        let rc16 = d[4..].chunks(8).find(|c| c[0] == 0x9e).unwrap();
        assert_eq!(rc16, &[0x9e, 0, 0, 0x10, 0, 0x01, 0, 16]);
        // Every descriptor names a command that parses.
        for c in d[4..].chunks(8) {
            let mut cdb = [0u8; 16];
            cdb[0] = c[0];
            cdb[1] = c[3];
            let len = usize::from(u16::from_be_bytes([c[6], c[7]]));
            assert!(
                !matches!(
                    Command::parse(&cdb[..len]),
                    Err(ScsiError::InvalidOpcode { .. })
                ),
                "{c:02x?}"
            );
        }
    }

    #[test]
    fn all_commands_with_timeouts_and_without_unmap() {
        let full = lu_with(|c| c.provisioning = None);
        let d = execute_data(&full, A, &rsoc(true, 0, 0, 0));
        let n = COMMANDS.len() - 1;
        assert_eq!(d.len(), 4 + 20 * n);
        assert!(d[4..].chunks(20).all(|c| c[0] != 0x42 && c[5] & 0x02 != 0));
        assert_eq!(&d[12..16], &[0x00, 0x0a, 0, 0]);
    }

    #[test]
    fn one_command() {
        let d = execute_data(&lu(), A, &rsoc(false, 1, 0x28, 0));
        assert_eq!(
            d,
            [
                0, 0x03, 0, 10, 0x28, 0x1a, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, 0x04
            ]
        );
        let d = execute_data(&lu(), A, &rsoc(true, 2, 0x9e, 0x10));
        assert_eq!(&d[..6], &[0, 0x83, 0, 16, 0x9e, 0x1f]);
        assert_eq!(d.len(), 4 + 16 + 12);
        let d = execute_data(&lu(), A, &rsoc(false, 3, 0x5f, 0x06));
        assert_eq!(&d[..4], &[0, 0x03, 0, 10]);
        let d = execute_data(&lu(), A, &rsoc(false, 3, 0x00, 0x55));
        assert_eq!(&d[..4], &[0, 0x03, 0, 6]);
    }

    #[test]
    fn one_command_not_supported() {
        assert_eq!(
            execute_data(&lu(), A, &rsoc(false, 1, 0xc1, 0)),
            [0, 0x01, 0, 0]
        );
        assert_eq!(
            execute_data(&lu(), A, &rsoc(false, 2, 0x5e, 0x03)),
            [0, 0x01, 0, 0]
        );
        let full = lu_with(|c| c.provisioning = None);
        assert_eq!(
            execute_data(&full, A, &rsoc(false, 1, 0x42, 0)),
            [0, 0x01, 0, 0]
        );
    }

    #[test]
    fn option_and_service_action_mismatch() {
        assert_eq!(
            execute(&lu(), A, &rsoc(false, 1, 0x9e, 0x10)),
            Err(ScsiError::cdb_field(2, Some(2)))
        );
        assert_eq!(
            execute(&lu(), A, &rsoc(false, 2, 0x28, 0)),
            Err(ScsiError::cdb_field(2, Some(2)))
        );
        assert_eq!(
            execute(&lu(), A, &rsoc(false, 2, 0xa3, 0x100)),
            Err(ScsiError::cdb_field(4, Some(7)))
        );
    }
}
