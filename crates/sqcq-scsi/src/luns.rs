//! Target-level answers that the daemon gives because it knows which LUNs
//! exist: REPORT LUNS (SPC-4) and every command sent to a LUN with no
//! logical unit.

use crate::cdb::Command;
use crate::completion::{Completion, ReportLunsRequest};
use crate::error::ScsiError;
use crate::resp::{Response, len32};
use crate::sense::{Sense, SenseFormat, SenseKey};

/// Largest LUN that single-level addressing can carry (flat space, 14 bits).
pub const MAX_LUN: u16 = 0x3fff;

/// The 8-byte single-level LUN of SAM-5: peripheral device addressing
/// below 256, flat space addressing up to [`MAX_LUN`].
pub fn encode_lun(lun: u16) -> Option<[u8; 8]> {
    let [hi, lo] = lun.to_be_bytes();
    match lun {
        0..=0xff => Some([0x00, lo, 0, 0, 0, 0, 0, 0]),
        0x100..=MAX_LUN => Some([0x40 | hi, lo, 0, 0, 0, 0, 0, 0]),
        _ => None,
    }
}

/// Writes the REPORT LUNS parameter data for `luns` into `out` and returns
/// how many bytes to transfer (truncated to the allocation length and to
/// `out`). LUNs above [`MAX_LUN`] are left out.
pub fn report_luns(
    req: &ReportLunsRequest,
    luns: impl IntoIterator<Item = u16>,
    out: &mut [u8],
) -> usize {
    let mut r = Response::new(out);
    r.be32(0); // LUN LIST LENGTH, patched below
    r.zeros(4);
    if req.select_report != 0x01 {
        for lun in luns {
            if let Some(l) = encode_lun(lun) {
                r.put(&l);
            }
        }
    }
    let n = len32(r.len() - 8);
    r.set(0, &n.to_be_bytes());
    r.finish(usize::try_from(req.alloc_len).unwrap_or(usize::MAX))
}

/// Executes a command addressed to a LUN with no logical unit (SPC-4):
/// INQUIRY returns peripheral qualifier 011b and device
/// type 1Fh, REQUEST SENSE returns LOGICAL UNIT NOT SUPPORTED as data,
/// REPORT LUNS is answered as for any LUN, and everything else fails with
/// LOGICAL UNIT NOT SUPPORTED.
pub fn execute_absent(cdb: &[u8], data_in: &mut [u8]) -> Result<Completion<'static>, ScsiError> {
    match Command::parse(cdb)? {
        Command::Inquiry {
            evpd: false,
            alloc_len,
            ..
        } => {
            let mut r = Response::new(data_in);
            crate::inquiry::absent(&mut r);
            Ok(Completion::Data {
                len: r.finish(usize::from(alloc_len)),
            })
        }
        Command::RequestSense {
            descriptor,
            alloc_len,
        } => {
            let sense = Sense::new(SenseKey::IllegalRequest, 0x25, 0x00);
            let format = if descriptor {
                SenseFormat::Descriptor
            } else {
                SenseFormat::Fixed
            };
            let n = usize::from(alloc_len).min(data_in.len());
            Ok(Completion::Data {
                len: sense.encode(format, &mut data_in[..n]),
            })
        }
        Command::ReportLuns {
            select_report,
            alloc_len,
        } => Ok(Completion::ReportLuns(ReportLunsRequest {
            select_report,
            alloc_len,
        })),
        _ => Err(ScsiError::LogicalUnitNotSupported),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(select_report: u8, alloc_len: u32) -> ReportLunsRequest {
        ReportLunsRequest {
            select_report,
            alloc_len,
        }
    }

    #[test]
    fn lun_encoding() {
        assert_eq!(encode_lun(0), Some([0; 8]));
        assert_eq!(encode_lun(255), Some([0, 0xff, 0, 0, 0, 0, 0, 0]));
        assert_eq!(encode_lun(256), Some([0x41, 0x00, 0, 0, 0, 0, 0, 0]));
        assert_eq!(encode_lun(0x3fff), Some([0x7f, 0xff, 0, 0, 0, 0, 0, 0]));
        assert_eq!(encode_lun(0x4000), None);
    }

    #[test]
    fn report_luns_list() {
        let mut out = [0u8; 64];
        let n = report_luns(&req(0, 64), [0, 1, 300, 0x4000], &mut out);
        assert_eq!(n, 32);
        assert_eq!(&out[..8], &[0, 0, 0, 24, 0, 0, 0, 0]);
        assert_eq!(&out[8..16], &[0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&out[16..24], &[0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&out[24..32], &[0x41, 0x2c, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn report_luns_truncation_keeps_full_length() {
        let mut out = [0u8; 64];
        let n = report_luns(&req(2, 16), 0..5, &mut out);
        assert_eq!(n, 16);
        assert_eq!(&out[..4], &[0, 0, 0, 40]);
        let mut tiny = [0u8; 6];
        assert_eq!(report_luns(&req(0, 100), 0..5, &mut tiny), 6);
        assert_eq!(tiny, [0, 0, 0, 40, 0, 0]);
    }

    #[test]
    fn well_known_only_is_empty() {
        let mut out = [0xffu8; 16];
        assert_eq!(report_luns(&req(1, 16), 0..5, &mut out), 8);
        assert_eq!(&out[..8], &[0; 8]);
    }

    #[test]
    fn absent_lun_inquiry() {
        let mut buf = [0u8; 96];
        let c = execute_absent(&[0x12, 0, 0, 0, 96, 0], &mut buf).unwrap();
        assert_eq!(c, Completion::Data { len: 36 });
        assert_eq!(&buf[..5], &[0x7f, 0x00, 0x06, 0x12, 31]);
        assert_eq!(&buf[8..16], b"SQCQ    ");
        assert_eq!(
            execute_absent(&[0x12, 1, 0x80, 0, 96, 0], &mut buf),
            Err(ScsiError::LogicalUnitNotSupported)
        );
    }

    #[test]
    fn absent_lun_request_sense_and_others() {
        let mut buf = [0u8; 96];
        let c = execute_absent(&[0x03, 0, 0, 0, 252, 0], &mut buf).unwrap();
        assert_eq!(c, Completion::Data { len: 18 });
        assert_eq!(&buf[..3], &[0x70, 0, 0x05]);
        assert_eq!(&buf[12..14], &[0x25, 0x00]);
        assert_eq!(
            execute_absent(&[0x00, 0, 0, 0, 0, 0], &mut buf),
            Err(ScsiError::LogicalUnitNotSupported)
        );
        let e = ScsiError::LogicalUnitNotSupported
            .status_and_sense()
            .1
            .unwrap();
        assert_eq!((e.key, e.asc), (SenseKey::IllegalRequest, 0x25));
        // Malformed CDBs are still malformed.
        assert_eq!(
            execute_absent(&[0xc5; 16], &mut buf),
            Err(ScsiError::InvalidOpcode { opcode: 0xc5 })
        );
        let c = execute_absent(&[0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], &mut buf).unwrap();
        assert_eq!(c, Completion::ReportLuns(req(0, 256)));
    }
}
