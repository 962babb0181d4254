use super::*;
use crate::test_util::{A, B, execute, execute_data, execute_out, lu};

const TUR: [u8; 6] = [0, 0, 0, 0, 0, 0];
const INQUIRY: [u8; 6] = [0x12, 0, 0, 0, 36, 0];
const REQUEST_SENSE: [u8; 6] = [0x03, 0, 0, 0, 252, 0];
const REPORT_LUNS: [u8; 12] = [0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
const WRITE10: [u8; 10] = [0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0];
const READ10: [u8; 10] = [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];

fn ua(u: UnitAttention) -> Result<Completion<'static>, ScsiError> {
    Err(ScsiError::UnitAttention(u))
}

#[test]
fn logical_unit_is_sync_and_send() {
    fn check<T: Send + Sync>() {}
    check::<LogicalUnit>();
}

#[test]
fn new_nexus_gets_power_on_once() {
    let lu = lu();
    lu.add_nexus(A);
    assert_eq!(execute(&lu, A, &TUR), ua(UnitAttention::PowerOn));
    assert_eq!(execute(&lu, A, &TUR), Ok(Completion::Good));
}

#[test]
fn inquiry_and_report_luns_do_not_consume_the_unit_attention() {
    let lu = lu();
    lu.add_nexus(A);
    assert!(matches!(
        execute(&lu, A, &INQUIRY),
        Ok(Completion::Data { len: 36 })
    ));
    assert!(matches!(
        execute(&lu, A, &REPORT_LUNS),
        Ok(Completion::ReportLuns(_))
    ));
    // Any other command, even a malformed one, reports it.
    assert_eq!(execute(&lu, A, &[0xc0; 16]), ua(UnitAttention::PowerOn));
    assert_eq!(
        execute(&lu, A, &[0xc0; 16]),
        Err(ScsiError::InvalidOpcode { opcode: 0xc0 })
    );
}

#[test]
fn request_sense_reports_and_clears() {
    let lu = lu();
    lu.add_nexus(A);
    let d = execute_data(&lu, A, &REQUEST_SENSE);
    assert_eq!(d, UnitAttention::PowerOn.sense().fixed());
    assert_eq!(&d[..3], &[0x70, 0, 0x06]);
    assert_eq!(&d[12..14], &[0x29, 0x00]);
    // Nothing left: NO SENSE.
    let d = execute_data(&lu, A, &REQUEST_SENSE);
    assert_eq!(d, Sense::NONE.fixed());
    assert_eq!(execute(&lu, A, &TUR), Ok(Completion::Good));
}

#[test]
fn request_sense_descriptor_format_and_allocation_length() {
    let lu = lu();
    lu.resize(1200).unwrap();
    lu.add_nexus(A);
    lu.resize(1300).unwrap();
    assert_eq!(
        execute_data(&lu, A, &[0x03, 0x01, 0, 0, 252, 0]),
        [0x72, 0x06, 0x29, 0x00, 0, 0, 0, 0]
    );
    assert_eq!(
        execute_data(&lu, A, &[0x03, 0x00, 0, 0, 4, 0]),
        [0x70, 0, 0x06, 0]
    );
    // The capacity change was consumed by the truncated report.
    assert_eq!(execute(&lu, A, &TUR), Ok(Completion::Good));
}

#[test]
fn resize_reset_and_luns_changed_reach_every_nexus() {
    let lu = lu();
    lu.add_nexus(A);
    lu.add_nexus(B);
    for n in [A, B] {
        execute(&lu, n, &TUR).unwrap_err();
    }
    lu.resize(2000).unwrap();
    lu.luns_changed();
    assert_eq!(execute(&lu, A, &TUR), ua(UnitAttention::CapacityChanged));
    assert_eq!(
        execute(&lu, A, &TUR),
        ua(UnitAttention::ReportedLunsChanged)
    );
    assert_eq!(execute(&lu, A, &TUR), Ok(Completion::Good));
    // REPORT LUNS clears REPORTED LUNS DATA HAS CHANGED only.
    execute(&lu, B, &REPORT_LUNS).unwrap();
    assert_eq!(execute(&lu, B, &TUR), ua(UnitAttention::CapacityChanged));
    assert_eq!(execute(&lu, B, &TUR), Ok(Completion::Good));
    lu.reset();
    assert_eq!(
        execute(&lu, A, &READ10),
        ua(UnitAttention::LogicalUnitReset)
    );
    assert_eq!(
        execute(&lu, B, &READ10),
        ua(UnitAttention::LogicalUnitReset)
    );
}

#[test]
fn an_idle_nexus_with_a_condition_does_not_slow_the_others() {
    let lu = lu();
    lu.add_nexus(B);
    // B never runs a command; A's commands skip the lock unless A's bucket
    // collides with B's.
    assert_ne!(ua_bucket(A), ua_bucket(B));
    assert!(lu.ua_maybe_pending(B));
    assert!(!lu.ua_maybe_pending(A));
    assert_eq!(execute(&lu, A, &TUR), Ok(Completion::Good));
    execute(&lu, B, &TUR).unwrap_err();
    assert!(!lu.ua_maybe_pending(B));
}

#[test]
fn nexus_loss_forgets_its_conditions() {
    let lu = lu();
    lu.add_nexus(A);
    lu.nexus_loss(A);
    assert_eq!(execute(&lu, A, &TUR), Ok(Completion::Good));
    // An unknown nexus is not told about unit-wide events.
    lu.resize(1001).unwrap();
    assert_eq!(execute(&lu, A, &TUR), Ok(Completion::Good));
}

fn pr_out(
    lu: &LogicalUnit,
    n: NexusId,
    sa: u8,
    t: u8,
    key: u64,
    sa_key: u64,
) -> Result<Completion<'static>, ScsiError> {
    let mut p = [0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    let cdb = [0x5f, sa, t, 0, 0, 0, 0, 0, 24, 0];
    let mut buf = [0u8; 64];
    lu.execute(n, &cdb, &p, &mut buf).map(|_| Completion::Good)
}

#[test]
fn reservation_scenario_through_execute() {
    let lu = lu();
    pr_out(&lu, A, 0, 0, 0, 0xaa).unwrap();
    pr_out(&lu, B, 0, 0, 0, 0xbb).unwrap();
    // Reserve Write Exclusive from A.
    pr_out(&lu, A, 1, 1, 0xaa, 0).unwrap();
    assert_eq!(
        execute(&lu, B, &WRITE10),
        Err(ScsiError::ReservationConflict)
    );
    assert!(execute(&lu, B, &READ10).is_ok());
    assert!(execute(&lu, A, &WRITE10).is_ok());
    // SYNCHRONIZE CACHE and MODE SELECT are writes; INQUIRY always goes.
    assert_eq!(
        execute(&lu, B, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        Err(ScsiError::ReservationConflict)
    );
    assert!(execute(&lu, B, &INQUIRY).is_ok());
    assert!(execute(&lu, B, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_ok());
    // RESERVATION CONFLICT has no sense data.
    assert_eq!(
        ScsiError::ReservationConflict.status_and_sense(),
        (crate::Status::ReservationConflict, None)
    );
    // REGISTER with the wrong key: conflict.
    assert_eq!(
        pr_out(&lu, B, 0, 0, 0x99, 0x11),
        Err(ScsiError::ReservationConflict)
    );
    // RELEASE by the non-holder: GOOD, nothing changes.
    assert_eq!(pr_out(&lu, B, 2, 1, 0xbb, 0), Ok(Completion::Good));
    assert_eq!(
        execute(&lu, B, &WRITE10),
        Err(ScsiError::ReservationConflict)
    );
    // B preempts A as Exclusive Access: A is told first (unit attentions
    // come before reservation checks), then blocked even from reading.
    pr_out(&lu, B, 4, 3, 0xbb, 0xaa).unwrap();
    assert_eq!(
        execute(&lu, A, &READ10),
        ua(UnitAttention::RegistrationsPreempted)
    );
    assert_eq!(
        execute(&lu, A, &READ10),
        Err(ScsiError::ReservationConflict)
    );
    assert!(execute(&lu, B, &WRITE10).is_ok());
    let keys = execute_data(&lu, A, &[0x5e, 0, 0, 0, 0, 0, 0, 0, 64, 0]);
    assert_eq!(&keys[4..], &[0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0xbb]);
    // CLEAR: everything goes, A may write again.
    pr_out(&lu, B, 3, 0, 0xbb, 0).unwrap();
    assert!(execute(&lu, A, &WRITE10).is_ok());
}

#[test]
fn pr_out_parameter_data_must_be_present() {
    let lu = lu();
    let cdb = [0x5f, 0, 0, 0, 0, 0, 0, 0, 24, 0];
    assert_eq!(
        execute_out(&lu, A, &cdb, &[0; 10]),
        Err(ScsiError::ParameterListLength)
    );
    let cdb = [0x5f, 0, 0, 0, 0, 0, 0, 0, 23, 0];
    assert_eq!(
        execute_out(&lu, A, &cdb, &[0; 24]),
        Err(ScsiError::ParameterListLength)
    );
}

#[test]
fn scratch_smaller_than_response_is_safe() {
    let lu = lu();
    let mut tiny = [0u8; 3];
    assert_eq!(
        lu.execute(A, &[0x12, 1, 0x83, 1, 0, 0], &[], &mut tiny),
        Ok(Completion::Data { len: 3 })
    );
    assert_eq!(tiny, [0, 0x83, 0]);
    let mut none = [0u8; 0];
    assert_eq!(
        lu.execute(A, &REQUEST_SENSE, &[], &mut none),
        Ok(Completion::Data { len: 0 })
    );
}

#[test]
fn misc_commands() {
    let lu = lu();
    assert_eq!(
        execute(&lu, A, &[0x1b, 0x01, 0, 0, 0x01, 0]),
        Ok(Completion::Good)
    );
    assert_eq!(
        execute(&lu, A, &[0x1b, 0, 0, 0, 0x02, 0]),
        Ok(Completion::Good)
    );
    assert_eq!(
        execute(&lu, A, &REPORT_LUNS),
        Ok(Completion::ReportLuns(ReportLunsRequest {
            select_report: 0,
            alloc_len: 256
        }))
    );
    assert_eq!(lu.max_data_out_len(), 512);
    assert!(crate::takes_parameter_data(&[0x42]));
    assert!(crate::takes_parameter_data(&[0x93, 1]));
    assert!(!crate::takes_parameter_data(&[0x2a]));
    assert!(!crate::takes_parameter_data(&[]));
}
