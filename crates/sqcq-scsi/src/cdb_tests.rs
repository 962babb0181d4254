use super::*;
use crate::sense::FieldPointer;

fn field(e: ScsiError) -> Option<FieldPointer> {
    match e {
        ScsiError::InvalidFieldInCdb { field } => field,
        other => panic!("expected INVALID FIELD IN CDB, got {other:?}"),
    }
}

fn padded(cdb: &[u8]) -> [u8; 32] {
    let mut b = [0u8; 32];
    b[..cdb.len()].copy_from_slice(cdb);
    b
}

#[test]
fn read_6_length_zero_means_256() {
    let c = Command::parse(&[0x08, 0x1f, 0xff, 0xfe, 0x00, 0x00]).unwrap();
    assert_eq!(
        c,
        Command::Read {
            lba: 0x1f_fffe,
            blocks: 256,
            length_at: 4
        }
    );
}

#[test]
fn read_6_reserved_lba_bits_rejected() {
    let e = Command::parse(&[0x08, 0x20, 0, 0, 1, 0]).unwrap_err();
    assert_eq!(field(e), Some(FieldPointer::cdb(1, Some(5))));
}

#[test]
fn write_10_fua_and_dpo() {
    let c = Command::parse(&[0x2a, 0x18, 0, 0, 0x10, 0, 0x05, 0, 8, 0]).unwrap();
    assert_eq!(
        c,
        Command::Write {
            lba: 0x1000,
            blocks: 8,
            fua: true,
            length_at: 7
        }
    );
    let c = Command::parse(&[0x2a, 0x10, 0, 0, 0, 1, 0, 0, 1, 0]).unwrap();
    assert!(matches!(c, Command::Write { fua: false, .. }));
}

#[test]
fn write_16_full_width_fields() {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x8a;
    cdb[1] = 0x08;
    cdb[2..10].copy_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
    cdb[10..14].copy_from_slice(&0xffff_ffffu32.to_be_bytes());
    let c = Command::parse(&cdb).unwrap();
    assert_eq!(
        c,
        Command::Write {
            lba: 0x0102_0304_0506_0708,
            blocks: u32::MAX,
            fua: true,
            length_at: 10
        }
    );
}

#[test]
fn read_12_parses() {
    let c = Command::parse(&[0xa8, 0, 0, 0, 0, 9, 0, 0, 0, 3, 0, 0]).unwrap();
    assert_eq!(
        c,
        Command::Read {
            lba: 9,
            blocks: 3,
            length_at: 6
        }
    );
}

#[test]
fn rdprotect_is_rejected() {
    let e = Command::parse(&[0x28, 0x20, 0, 0, 0, 0, 0, 0, 1, 0]).unwrap_err();
    assert_eq!(field(e), Some(FieldPointer::cdb(1, Some(5))));
}

#[test]
fn padded_cdb_is_accepted_and_tail_ignored() {
    let mut b = padded(&[0x28, 0, 0, 0, 0, 1, 0, 0, 1, 0]);
    b[20] = 0xff;
    assert!(matches!(
        Command::parse(&b),
        Ok(Command::Read {
            lba: 1,
            blocks: 1,
            ..
        })
    ));
}

#[test]
fn short_cdb_is_rejected() {
    assert_eq!(
        Command::parse(&[0x88, 0, 0, 0]),
        Err(ScsiError::CdbTooShort {
            len: 4,
            required: 16
        })
    );
    assert_eq!(
        Command::parse(&[]),
        Err(ScsiError::CdbTooShort {
            len: 0,
            required: 1
        })
    );
}

#[test]
fn naca_is_rejected_at_the_control_byte() {
    let e = Command::parse(&[0x00, 0, 0, 0, 0, 0x04]).unwrap_err();
    assert_eq!(field(e), Some(FieldPointer::cdb(5, Some(2))));
    let e = Command::parse(&padded(&[
        0x88, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0x04,
    ]))
    .unwrap_err();
    assert_eq!(field(e), Some(FieldPointer::cdb(15, Some(2))));
}

#[test]
fn link_bit_is_rejected() {
    let e = Command::parse(&[0x00, 0, 0, 0, 0, 0x01]).unwrap_err();
    assert_eq!(field(e), Some(FieldPointer::cdb(5, Some(0))));
}

#[test]
fn unknown_opcode_and_service_action() {
    assert_eq!(
        Command::parse(&padded(&[0xc0])),
        Err(ScsiError::InvalidOpcode { opcode: 0xc0 })
    );
    // READ(32) style variable length CDB: not supported.
    assert_eq!(
        Command::parse(&padded(&[0x7f])),
        Err(ScsiError::InvalidOpcode { opcode: 0x7f })
    );
    // SERVICE ACTION IN(16) / GET LBA STATUS (0x12) is not supported.
    let e = Command::parse(&padded(&[0x9e, 0x12])).unwrap_err();
    assert_eq!(field(e), Some(FieldPointer::cdb(1, Some(4))));
    // PERSISTENT RESERVE IN / READ FULL STATUS.
    let e = Command::parse(&padded(&[0x5e, 0x03])).unwrap_err();
    assert_eq!(field(e), Some(FieldPointer::cdb(1, Some(4))));
}

#[test]
fn inquiry_page_without_evpd() {
    let e = Command::parse(&[0x12, 0, 0x80, 0, 0xff, 0]).unwrap_err();
    assert_eq!(field(e), Some(FieldPointer::cdb(2, Some(7))));
    assert_eq!(
        Command::parse(&[0x12, 1, 0x83, 0x01, 0x00, 0]),
        Ok(Command::Inquiry {
            evpd: true,
            page: 0x83,
            alloc_len: 256
        })
    );
    // CmdDt (obsolete) is reserved here.
    let e = Command::parse(&[0x12, 2, 0, 0, 36, 0]).unwrap_err();
    assert_eq!(field(e), Some(FieldPointer::cdb(1, Some(1))));
}

#[test]
fn mode_select_requires_pf_and_no_sp() {
    let e = Command::parse(&[0x15, 0x00, 0, 0, 24, 0]).unwrap_err();
    assert_eq!(field(e), Some(FieldPointer::cdb(1, Some(4))));
    let e = Command::parse(&[0x15, 0x11, 0, 0, 24, 0]).unwrap_err();
    assert_eq!(field(e), Some(FieldPointer::cdb(1, Some(0))));
    assert_eq!(
        Command::parse(&[0x55, 0x10, 0, 0, 0, 0, 0, 0x01, 0x02, 0]),
        Ok(Command::ModeSelect {
            long: true,
            param_len: 0x102
        })
    );
}

#[test]
fn mode_sense_fields() {
    assert_eq!(
        Command::parse(&[0x5a, 0x18, 0x48, 0x00, 0, 0, 0, 0x10, 0x00, 0]),
        Ok(Command::ModeSense {
            long: true,
            dbd: true,
            llbaa: true,
            control: PageControl::Changeable,
            page: 0x08,
            subpage: 0,
            alloc_len: 0x1000
        })
    );
    // LLBAA is reserved in MODE SENSE(6).
    let e = Command::parse(&[0x1a, 0x10, 0x3f, 0, 255, 0]).unwrap_err();
    assert_eq!(field(e), Some(FieldPointer::cdb(1, Some(4))));
}

#[test]
fn read_capacity_lba_requires_pmi() {
    let e = Command::parse(&[0x25, 0, 0, 0, 0, 1, 0, 0, 0, 0]).unwrap_err();
    assert_eq!(field(e), Some(FieldPointer::cdb(2, Some(7))));
    assert_eq!(
        Command::parse(&[0x25, 0, 0, 0, 0, 1, 0, 0, 1, 0]),
        Ok(Command::ReadCapacity10)
    );
    let mut c16 = [0u8; 16];
    c16[0] = 0x9e;
    c16[1] = 0x10;
    c16[13] = 32;
    assert_eq!(
        Command::parse(&c16),
        Ok(Command::ReadCapacity16 { alloc_len: 32 })
    );
    c16[9] = 1;
    assert!(Command::parse(&c16).is_err());
}

#[test]
fn write_same_bits() {
    // WRITE SAME(10) with LBDATA (bit 1) or ANCHOR (bit 4): rejected.
    let e = Command::parse(&[0x41, 0x02, 0, 0, 0, 0, 0, 0, 1, 0]).unwrap_err();
    assert_eq!(field(e), Some(FieldPointer::cdb(1, Some(1))));
    let e = Command::parse(&[0x41, 0x10, 0, 0, 0, 0, 0, 0, 1, 0]).unwrap_err();
    assert_eq!(field(e), Some(FieldPointer::cdb(1, Some(4))));
    let mut c = [0u8; 16];
    c[0] = 0x93;
    c[1] = 0x09;
    c[13] = 4;
    assert_eq!(
        Command::parse(&c),
        Ok(Command::WriteSame {
            lba: 0,
            blocks: 4,
            unmap: true,
            ndob: true,
            length_at: 10
        })
    );
}

#[test]
fn unmap_anchor_rejected() {
    let e = Command::parse(&[0x42, 0x01, 0, 0, 0, 0, 0, 0, 24, 0]).unwrap_err();
    assert_eq!(field(e), Some(FieldPointer::cdb(1, Some(0))));
    assert_eq!(
        Command::parse(&[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0]),
        Ok(Command::Unmap { param_len: 24 })
    );
}

#[test]
fn verify_bytchk_rejected() {
    let e = Command::parse(&[0x2f, 0x02, 0, 0, 0, 0, 0, 0, 1, 0]).unwrap_err();
    assert_eq!(field(e), Some(FieldPointer::cdb(1, Some(1))));
}

#[test]
fn report_luns_checks() {
    let mut c = [0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0];
    assert_eq!(
        Command::parse(&c),
        Ok(Command::ReportLuns {
            select_report: 0,
            alloc_len: 16
        })
    );
    c[2] = 3;
    assert_eq!(
        field(Command::parse(&c).unwrap_err()),
        Some(FieldPointer::cdb(2, Some(7)))
    );
    c[2] = 0;
    c[9] = 3;
    assert_eq!(
        field(Command::parse(&c).unwrap_err()),
        Some(FieldPointer::cdb(6, Some(7)))
    );
}

#[test]
fn maintenance_in_forms() {
    let c = [0xa3, 0x2a, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0];
    assert_eq!(
        Command::parse(&c),
        Ok(Command::ReportTargetPortGroups {
            extended: true,
            alloc_len: 1024
        })
    );
    let bad = [0xa3, 0x4a, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0];
    assert_eq!(
        field(Command::parse(&bad).unwrap_err()),
        Some(FieldPointer::cdb(1, Some(7)))
    );
    let rsoc = [0xa3, 0x0c, 0x82, 0x5e, 0, 1, 0, 0, 2, 0, 0, 0];
    assert_eq!(
        Command::parse(&rsoc),
        Ok(Command::ReportSupportedOpcodes {
            timeouts: true,
            options: 2,
            opcode: 0x5e,
            service_action: 1,
            alloc_len: 512
        })
    );
    let bad = [0xa3, 0x0c, 0x04, 0, 0, 0, 0, 0, 2, 0, 0, 0];
    assert_eq!(
        field(Command::parse(&bad).unwrap_err()),
        Some(FieldPointer::cdb(2, Some(2)))
    );
}

#[test]
fn persistent_reserve_out_fields() {
    let c = [0x5f, 0x01, 0x03, 0, 0, 0, 0, 0, 24, 0];
    assert_eq!(
        Command::parse(&c),
        Ok(Command::PersistentReserveOut {
            action: PrOutAction::Reserve,
            scope: 0,
            pr_type: 3,
            param_len: 24
        })
    );
    // REGISTER AND MOVE (7) is not supported.
    let e = Command::parse(&[0x5f, 0x07, 0, 0, 0, 0, 0, 0, 24, 0]).unwrap_err();
    assert_eq!(field(e), Some(FieldPointer::cdb(1, Some(4))));
}

/// The one-AND check of a CDB's bits agrees with the byte-by-byte one for
/// every command, each bit of its CDB set alone and with random others,
/// CDBs padded or exactly as long as the command.
#[test]
fn reject_bits_agree_with_the_byte_check() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let (mut valid, mut invalid) = (0, 0);
    for u in usage::COMMANDS {
        let len = u.mask.len();
        let mut cdbs = Vec::new();
        for bit in 8..8 * len {
            let mut cdb = u.mask.to_vec();
            cdb[1..].fill(0);
            cdb[bit / 8] ^= 1 << (bit % 8);
            cdbs.push(cdb);
        }
        for _ in 0..200 {
            let mut cdb: Vec<u8> = (0..len).map(|_| rand().to_le_bytes()[0]).collect();
            cdb[0] = u.opcode;
            // Mostly within the mask, so that valid CDBs come up too.
            if rand() % 2 == 0 {
                for (b, m) in cdb.iter_mut().zip(u.mask).skip(1) {
                    *b &= m & !usage::CONTROL;
                }
            }
            cdbs.push(cdb);
        }
        for cdb in cdbs {
            let by_byte = check_reserved(&cdb, u.mask).is_ok();
            for c in [cdb.clone(), padded(&cdb).to_vec()] {
                assert_eq!(
                    first_16(&c) & u.reject == 0,
                    by_byte,
                    "{:#04x} {cdb:02x?}",
                    u.opcode
                );
            }
            if by_byte { valid += 1 } else { invalid += 1 }
        }
    }
    assert!(
        valid > 100 && invalid > 100,
        "{valid} valid, {invalid} invalid"
    );
}
