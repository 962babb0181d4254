use crate::completion::{Completion, MediumOp};
use crate::error::ScsiError;
use crate::test_util::{A, B, execute, execute_data, execute_out, lu, lu_with};
use crate::ua::UnitAttention;

const SENSE6_ALL: [u8; 6] = [0x1a, 0x00, 0x3f, 0x00, 0xff, 0];

const CACHING_WCE: [u8; 20] = [
    0x08, 0x12, 0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
];
const CONTROL: [u8; 12] = [0x0a, 0x0a, 0, 0x10, 0, 0, 0, 0, 0xff, 0xff, 0, 0];
const IEC: [u8; 12] = [0x1c, 0x0a, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, 0];

#[test]
fn mode_sense_6_all_pages() {
    let d = execute_data(&lu(), A, &SENSE6_ALL);
    let mut expect = vec![4 + 8 + 20 + 12 + 12 - 1, 0x00, 0x10, 0x08];
    expect.extend_from_slice(&[0, 0, 0x03, 0xe8, 0, 0, 0x02, 0x00]);
    expect.extend_from_slice(&CACHING_WCE);
    expect.extend_from_slice(&CONTROL);
    expect.extend_from_slice(&IEC);
    assert_eq!(d, expect);
}

#[test]
fn mode_sense_dbd_and_single_page() {
    let d = execute_data(&lu(), A, &[0x1a, 0x08, 0x0a, 0x00, 0xff, 0]);
    let mut expect = vec![3 + 12, 0x00, 0x10, 0x00];
    expect.extend_from_slice(&CONTROL);
    assert_eq!(d, expect);
}

#[test]
fn mode_sense_10_long_lba_descriptor_and_wp() {
    let ro = lu_with(|c| c.read_only = true);
    let d = execute_data(&ro, A, &[0x5a, 0x10, 0x1c, 0, 0, 0, 0, 0, 0xff, 0]);
    let mut expect = vec![0, 8 + 16 + 12 - 2, 0x00, 0x90, 0x01, 0x00, 0, 16];
    expect.extend_from_slice(&1000u64.to_be_bytes());
    expect.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0x02, 0x00]);
    expect.extend_from_slice(&IEC);
    assert_eq!(d, expect);
}

#[test]
fn mode_sense_10_short_descriptor_without_llbaa() {
    let d = execute_data(&lu(), A, &[0x5a, 0x00, 0x08, 0, 0, 0, 0, 0, 0xff, 0]);
    assert_eq!(&d[..8], &[0, 8 + 8 + 20 - 2, 0, 0x10, 0x00, 0, 0, 8]);
}

#[test]
fn changeable_and_default_values() {
    let d = execute_data(&lu(), A, &[0x1a, 0x08, 0x7f, 0x00, 0xff, 0]);
    assert_eq!(&d[4..8], &[0x08, 0x12, 0x04, 0x00]);
    assert_eq!(&d[24..28], &[0x0a, 0x0a, 0x00, 0x00]);
    let no_cache = lu_with(|c| c.write_cache = false);
    let d = execute_data(&no_cache, A, &[0x1a, 0x08, 0x88, 0x00, 0xff, 0]);
    assert_eq!(&d[4..8], &[0x08, 0x12, 0x00, 0x00]);
}

#[test]
fn mode_sense_rejections() {
    let lu = lu();
    assert_eq!(
        execute(&lu, A, &[0x1a, 0, 0xc8, 0, 0xff, 0]),
        Err(ScsiError::SavingParametersNotSupported)
    );
    assert_eq!(
        execute(&lu, A, &[0x1a, 0, 0x19, 0, 0xff, 0]),
        Err(ScsiError::cdb_field(2, Some(5)))
    );
    assert_eq!(
        execute(&lu, A, &[0x1a, 0, 0x08, 0x01, 0xff, 0]),
        Err(ScsiError::cdb_field(3, Some(7)))
    );
    assert_eq!(
        execute_data(&lu, A, &[0x1a, 0, 0x3f, 0xff, 0xff, 0]).len(),
        56
    );
    assert_eq!(execute_data(&lu, A, &[0x1a, 0, 0x3f, 0x00, 3, 0]).len(), 3);
}

/// A MODE SELECT(6) parameter list: header without block descriptor, then
/// `page`.
fn select6(page: &[u8]) -> Vec<u8> {
    let mut v = vec![0, 0, 0, 0];
    v.extend_from_slice(page);
    v
}

fn select6_cdb(len: usize) -> [u8; 6] {
    [0x15, 0x10, 0, 0, u8::try_from(len).unwrap(), 0]
}

#[test]
fn mode_select_round_trip_changes_wce() {
    let lu = lu();
    lu.add_nexus(A);
    lu.add_nexus(B);
    for n in [A, B] {
        assert!(execute(&lu, n, &[0, 0, 0, 0, 0, 0]).is_err(), "power on UA");
    }
    // Take the current caching page the way sdparm does, clear WCE.
    let d = execute_data(&lu, A, &[0x1a, 0x08, 0x08, 0, 0xff, 0]);
    let mut page = d[4..].to_vec();
    page[2] &= !0x04;
    let params = select6(&page);
    assert_eq!(
        execute_out(&lu, A, &select6_cdb(params.len()), &params),
        Ok(Completion::Good)
    );
    assert!(!lu.write_cache_enabled());
    let d = execute_data(&lu, A, &[0x1a, 0x08, 0x08, 0, 0xff, 0]);
    assert_eq!(d[6], 0x00);
    // With the write cache off every write is forced to FUA.
    assert!(matches!(
        execute(&lu, A, &[0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0]),
        Ok(Completion::Medium(MediumOp::Write { fua: true, .. }))
    ));
    // The other nexus is told; the one that changed it is not.
    assert_eq!(
        execute(&lu, B, &[0, 0, 0, 0, 0, 0]),
        Err(ScsiError::UnitAttention(
            UnitAttention::ModeParametersChanged
        ))
    );
    assert_eq!(execute(&lu, A, &[0, 0, 0, 0, 0, 0]), Ok(Completion::Good));
    // Setting the same value again changes nothing and tells nobody.
    assert_eq!(
        execute_out(&lu, A, &select6_cdb(params.len()), &params),
        Ok(Completion::Good)
    );
    assert_eq!(execute(&lu, B, &[0, 0, 0, 0, 0, 0]), Ok(Completion::Good));
    // LOGICAL UNIT RESET restores the default.
    lu.reset();
    assert!(lu.write_cache_enabled());
}

#[test]
fn mode_select_10_with_block_descriptor() {
    let lu = lu();
    let mut p = vec![0, 0, 0, 0, 0, 0, 0, 8];
    p.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0x02, 0x00]);
    p.extend_from_slice(&CONTROL);
    let cdb = [
        0x55,
        0x10,
        0,
        0,
        0,
        0,
        0,
        0,
        u8::try_from(p.len()).unwrap(),
        0,
    ];
    assert_eq!(execute_out(&lu, A, &cdb, &p), Ok(Completion::Good));
    // A different block size is refused, pointing at the block length.
    p[14] = 0x10;
    assert_eq!(
        execute_out(&lu, A, &cdb, &p),
        Err(ScsiError::parameter_field(13, Some(7)))
    );
    // So is a different block count.
    p[14] = 0x02;
    p[11] = 7;
    assert_eq!(
        execute_out(&lu, A, &cdb, &p),
        Err(ScsiError::parameter_field(8, Some(7)))
    );
}

#[test]
fn mode_select_rejections() {
    let lu = lu();
    let mut rcd = CACHING_WCE;
    rcd[2] |= 0x01; // RCD is not changeable
    let mut bad_len = CONTROL.to_vec();
    bad_len[1] = 0x0b;
    bad_len.push(0);
    let mut control_change = CONTROL;
    control_change[2] = 0x04; // D_SENSE
    let mut spf = CONTROL;
    spf[0] |= 0x40;
    let cases: Vec<(Vec<u8>, Option<usize>, ScsiError)> = vec![
        (select6(&rcd), None, ScsiError::parameter_field(6, Some(0))),
        (
            select6(&bad_len),
            None,
            ScsiError::parameter_field(5, Some(7)),
        ),
        (
            select6(&control_change),
            None,
            ScsiError::parameter_field(6, Some(2)),
        ),
        (select6(&spf), None, ScsiError::parameter_field(4, Some(6))),
        (
            select6(&[0x19, 0x02, 0, 0]),
            None,
            ScsiError::parameter_field(4, Some(5)),
        ),
        (select6(&CONTROL[..7]), None, ScsiError::ParameterListLength),
        (select6(&[0x0a]), None, ScsiError::ParameterListLength),
        (vec![0, 0, 0], None, ScsiError::ParameterListLength),
        (
            vec![0, 0, 0, 4],
            None,
            ScsiError::parameter_field(3, Some(7)),
        ),
        (vec![0, 0, 0, 8, 0, 0], None, ScsiError::ParameterListLength),
        // The CDB promises more than the initiator sent.
        (select6(&CONTROL), Some(40), ScsiError::ParameterListLength),
    ];
    for (params, len, err) in cases {
        let cdb = select6_cdb(len.unwrap_or(params.len()));
        assert_eq!(
            execute_out(&lu, A, &cdb, &params),
            Err(err),
            "{params:02x?}"
        );
    }
    // Nothing changed along the way.
    assert!(lu.write_cache_enabled());
    // A zero parameter list length is not an error.
    assert_eq!(
        execute_out(&lu, A, &select6_cdb(0), &[]),
        Ok(Completion::Good)
    );
}
