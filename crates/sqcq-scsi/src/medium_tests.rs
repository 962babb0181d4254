use super::*;
use crate::test_util::{A, execute, execute_out, lu, lu_with};

fn read10(lba: u32, blocks: u16) -> [u8; 10] {
    let [a, b, c, d] = lba.to_be_bytes();
    let [e, f] = blocks.to_be_bytes();
    [0x28, 0, a, b, c, d, 0, e, f, 0]
}

fn cdb16(opcode: u8, flags: u8, lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = opcode;
    c[1] = flags;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn medium(r: Result<Completion<'_>, ScsiError>) -> MediumOp<'_> {
    match r {
        Ok(Completion::Medium(m)) => m,
        other => panic!("expected a medium op, got {other:?}"),
    }
}

#[test]
fn read_up_to_the_last_block() {
    let lu = lu();
    assert_eq!(
        medium(execute(&lu, A, &read10(999, 1))),
        MediumOp::Read {
            lba: 999,
            blocks: 1,
            offset: 999 * 512,
            bytes: 512
        }
    );
    assert_eq!(
        execute(&lu, A, &read10(999, 2)),
        Err(ScsiError::LbaOutOfRange {
            lba: 999,
            blocks: 2
        })
    );
    assert_eq!(
        execute(&lu, A, &read10(1000, 1)),
        Err(ScsiError::LbaOutOfRange {
            lba: 1000,
            blocks: 1
        })
    );
    assert_eq!(
        medium(execute(&lu, A, &read10(872, 128))).data_in_len(),
        128 * 512
    );
}

#[test]
fn lba_plus_length_overflow() {
    let lu = lu();
    assert_eq!(
        execute(&lu, A, &cdb16(0x88, 0, u64::MAX, 2)),
        Err(ScsiError::LbaOutOfRange {
            lba: u64::MAX,
            blocks: 2
        })
    );
    assert_eq!(
        execute(&lu, A, &cdb16(0x8a, 0, u64::MAX - 1, 1)),
        Err(ScsiError::LbaOutOfRange {
            lba: u64::MAX - 1,
            blocks: 1
        })
    );
}

#[test]
fn zero_length_transfers() {
    let lu = lu();
    assert_eq!(execute(&lu, A, &read10(5, 0)), Ok(Completion::Good));
    // Still checked against the capacity.
    assert!(execute(&lu, A, &read10(1000, 0)).is_err());
}

#[test]
fn transfer_length_limit() {
    let lu = lu();
    assert_eq!(
        execute(&lu, A, &read10(0, 129)),
        Err(ScsiError::cdb_field(7, Some(7)))
    );
    assert_eq!(
        execute(&lu, A, &cdb16(0x88, 0, 0, 129)),
        Err(ScsiError::cdb_field(10, Some(7)))
    );
    // READ(6) with length 0 means 256 blocks: over the limit of 128.
    assert_eq!(
        execute(&lu, A, &[0x08, 0, 0, 0, 0, 0]),
        Err(ScsiError::cdb_field(4, Some(7)))
    );
    let big = lu_with(|c| c.max_transfer_blocks = 256);
    assert!(matches!(
        medium(execute(&big, A, &[0x08, 0, 0, 0, 0, 0])),
        MediumOp::Read { blocks: 256, .. }
    ));
}

#[test]
fn writes() {
    let lu = lu_with(|c| c.block_size = 4096);
    assert_eq!(
        medium(execute(&lu, A, &cdb16(0x8a, 0x08, 10, 2))),
        MediumOp::Write {
            lba: 10,
            blocks: 2,
            offset: 40960,
            bytes: 8192,
            fua: true
        }
    );
    let w = medium(execute(&lu, A, &[0x0a, 0, 0, 3, 1, 0]));
    assert_eq!(w.data_out_len(), 4096);
    assert!(matches!(
        w,
        MediumOp::Write {
            lba: 3,
            fua: false,
            ..
        }
    ));
    assert!(matches!(
        medium(execute(&lu, A, &[0xaa, 0x02, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0])),
        MediumOp::Write { fua: true, .. }
    ));
}

#[test]
fn read_only_refuses_writes_first() {
    let ro = lu_with(|c| c.read_only = true);
    for cdb in [
        cdb16(0x8a, 0, 5000, 1),
        cdb16(0x93, 0x01, 0, 1),
        [0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0, 0, 0, 0, 0, 0, 0],
    ] {
        assert_eq!(
            execute(&ro, A, &cdb),
            Err(ScsiError::WriteProtected),
            "{cdb:02x?}"
        );
    }
    assert!(execute(&ro, A, &read10(0, 1)).is_ok());
    assert!(execute(&ro, A, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_ok());
}

#[test]
fn verify_checks_the_range_only() {
    let lu = lu();
    assert_eq!(
        execute(&lu, A, &cdb16(0x8f, 0, 990, 10)),
        Ok(Completion::Good)
    );
    assert!(execute(&lu, A, &cdb16(0x8f, 0, 990, 11)).is_err());
    assert_eq!(
        execute(&lu, A, &cdb16(0x8f, 0, 5000, 0)),
        Ok(Completion::Good)
    );
    // Verification length is not bounded by the transfer limit.
    assert_eq!(
        execute(&lu, A, &cdb16(0x8f, 0, 0, 1000)),
        Ok(Completion::Good)
    );
}

#[test]
fn synchronize_cache() {
    let lu = lu();
    assert_eq!(
        medium(execute(&lu, A, &[0x35, 0, 0, 0, 0, 10, 0, 0, 0, 0])),
        MediumOp::Flush {
            lba: 10,
            blocks: 990
        }
    );
    assert_eq!(
        medium(execute(&lu, A, &cdb16(0x91, 0x02, 999, 1))),
        MediumOp::Flush {
            lba: 999,
            blocks: 1
        }
    );
    assert!(execute(&lu, A, &cdb16(0x91, 0, 1000, 0)).is_err());
    assert!(execute(&lu, A, &cdb16(0x91, 0, 999, 2)).is_err());
}

#[test]
fn write_same() {
    let lu = lu();
    let block = [0x5au8; 512];
    let op = medium(execute_out(&lu, A, &cdb16(0x93, 0x08, 8, 16), &block));
    assert_eq!(
        op,
        MediumOp::WriteSame {
            lba: 8,
            blocks: 16,
            offset: 4096,
            unmap: true,
            fua: false,
            pattern: Some(&block[..]),
        }
    );
    let op = medium(execute_out(&lu, A, &cdb16(0x93, 0x01, 0, 1), &[]));
    assert!(matches!(
        op,
        MediumOp::WriteSame {
            pattern: None,
            unmap: false,
            ..
        }
    ));
    // WSNZ: zero blocks is invalid; so is more than the maximum.
    assert_eq!(
        execute_out(&lu, A, &cdb16(0x93, 0, 0, 0), &block),
        Err(ScsiError::cdb_field(10, Some(7)))
    );
    assert_eq!(
        execute_out(&lu, A, &[0x41, 0, 0, 0, 0, 0, 0, 0x01, 0x01, 0], &block),
        Err(ScsiError::cdb_field(7, Some(7)))
    );
    assert_eq!(
        execute_out(&lu, A, &[0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0], &block[..100]),
        Err(ScsiError::DataLengthMismatch {
            expected: 512,
            actual: 100
        })
    );
    assert!(execute_out(&lu, A, &cdb16(0x93, 0, 999, 2), &block).is_err());
    // Without provisioning the UNMAP bit is ignored: the data are written.
    let full = lu_with(|c| c.provisioning = None);
    let op = medium(execute_out(
        &full,
        A,
        &[0x41, 0x08, 0, 0, 0, 0, 0, 0, 1, 0],
        &block,
    ));
    assert!(matches!(op, MediumOp::WriteSame { unmap: false, .. }));
}

#[test]
fn unmap() {
    let lu = lu();
    let mut p = vec![0, 22, 0, 16, 0, 0, 0, 0];
    p.extend_from_slice(&100u64.to_be_bytes());
    p.extend_from_slice(&[0, 0, 0, 50, 0, 0, 0, 0]);
    let cdb = [0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0];
    let MediumOp::Unmap(list) = medium(execute_out(&lu, A, &cdb, &p)) else {
        panic!("not an unmap");
    };
    let ranges: Vec<_> = list.iter().collect();
    assert_eq!(
        ranges,
        [crate::UnmapRange {
            lba: 100,
            blocks: 50,
            offset: 51200,
            bytes: 25600
        }]
    );
    assert_eq!(
        execute_out(&lu, A, &[0x42, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]),
        Ok(Completion::Good)
    );
    let full = lu_with(|c| c.provisioning = None);
    assert_eq!(
        execute_out(&full, A, &cdb, &p),
        Err(ScsiError::InvalidOpcode { opcode: 0x42 })
    );
}

#[test]
fn resize_moves_the_end() {
    let lu = lu();
    assert!(execute(&lu, A, &read10(1500, 1)).is_err());
    lu.resize(2000).unwrap();
    assert!(execute(&lu, A, &read10(1999, 1)).is_ok());
    lu.resize(10).unwrap();
    assert!(execute(&lu, A, &read10(10, 1)).is_err());
    assert_eq!(lu.resize(0), Err(crate::ConfigError::ZeroCapacity));
}
