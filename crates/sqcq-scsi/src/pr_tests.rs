use super::*;

const A: NexusId = NexusId(1);
const B: NexusId = NexusId(2);
const C: NexusId = NexusId(3);

fn params(key: u64, sa_key: u64, flags: u8) -> [u8; 24] {
    let mut p = [0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    p[20] = flags;
    p
}

struct Lu {
    pr: Reservations,
    ua: UnitAttentions,
}

impl Lu {
    fn new() -> Self {
        Self {
            pr: Reservations::default(),
            ua: UnitAttentions::default(),
        }
    }

    fn out(
        &mut self,
        n: NexusId,
        action: PrOutAction,
        t: u8,
        key: u64,
        sa: u64,
    ) -> Result<(), ScsiError> {
        self.out_raw(n, action, 0, t, &params(key, sa, 0))
    }

    fn out_raw(
        &mut self,
        n: NexusId,
        action: PrOutAction,
        scope: u8,
        t: u8,
        data: &[u8],
    ) -> Result<(), ScsiError> {
        let req = OutRequest {
            action,
            scope,
            pr_type: t,
            param_len: 24,
            data,
        };
        self.pr.write(n, req, &mut self.ua)
    }

    fn register(&mut self, n: NexusId, key: u64) {
        self.out(n, PrOutAction::Register, 0, 0, key).unwrap();
    }

    fn read(&self, action: PrInAction) -> Vec<u8> {
        let mut buf = [0u8; 256];
        let mut r = Response::new(&mut buf);
        self.pr.read(action, &mut r);
        let n = r.finish(256);
        buf[..n].to_vec()
    }
}

use PrOutAction::*;

#[test]
fn write_exclusive_blocks_writes_of_others_only() {
    let mut lu = Lu::new();
    lu.register(A, 0xa);
    lu.register(B, 0xb);
    lu.out(A, Reserve, 1, 0xa, 0).unwrap();
    assert_eq!(lu.pr.check(A, Access::Write), Ok(()));
    assert_eq!(
        lu.pr.check(B, Access::Write),
        Err(ScsiError::ReservationConflict)
    );
    assert_eq!(lu.pr.check(B, Access::Read), Ok(()));
    assert_eq!(lu.pr.check(C, Access::Read), Ok(()));
    assert_eq!(lu.pr.check(C, Access::Allowed), Ok(()));
}

#[test]
fn exclusive_access_blocks_reads_too() {
    let mut lu = Lu::new();
    lu.register(A, 0xa);
    lu.out(A, Reserve, 3, 0xa, 0).unwrap();
    assert_eq!(
        lu.pr.check(B, Access::Read),
        Err(ScsiError::ReservationConflict)
    );
    assert_eq!(lu.pr.check(A, Access::Read), Ok(()));
}

#[test]
fn registrants_only_types_admit_registrants() {
    for (t, read_by_stranger) in [(5, true), (6, false)] {
        let mut lu = Lu::new();
        lu.register(A, 0xa);
        lu.register(B, 0xb);
        lu.out(A, Reserve, t, 0xa, 0).unwrap();
        assert_eq!(lu.pr.check(B, Access::Write), Ok(()), "type {t}");
        assert_eq!(
            lu.pr.check(C, Access::Write),
            Err(ScsiError::ReservationConflict)
        );
        assert_eq!(
            lu.pr.check(C, Access::Read).is_ok(),
            read_by_stranger,
            "type {t}"
        );
    }
}

#[test]
fn all_registrants_every_registrant_holds() {
    let mut lu = Lu::new();
    lu.register(A, 0xa);
    lu.register(B, 0xb);
    lu.out(A, Reserve, 8, 0xa, 0).unwrap();
    // B is a holder too: reserving the same type is fine, another type not.
    assert_eq!(lu.out(B, Reserve, 8, 0xb, 0), Ok(()));
    assert_eq!(
        lu.out(B, Reserve, 7, 0xb, 0),
        Err(ScsiError::ReservationConflict)
    );
    assert_eq!(lu.pr.check(B, Access::Write), Ok(()));
    assert_eq!(
        lu.pr.check(C, Access::Read),
        Err(ScsiError::ReservationConflict)
    );
    // The reservation lasts until the last registrant goes.
    lu.out(A, Register, 0, 0xa, 0).unwrap();
    assert!(lu.pr.is_reserved());
    lu.out(B, Register, 0, 0xb, 0).unwrap();
    assert!(!lu.pr.is_reserved());
}

#[test]
fn register_key_rules() {
    let mut lu = Lu::new();
    // Unregistered nexus with a nonzero reservation key: conflict.
    assert_eq!(
        lu.out(A, Register, 0, 5, 6),
        Err(ScsiError::ReservationConflict)
    );
    // Unregistered with zero service action key: no-op, generation kept.
    lu.out(A, Register, 0, 0, 0).unwrap();
    assert_eq!(
        &lu.read(PrInAction::ReadKeys)[..8],
        &[0, 0, 0, 0, 0, 0, 0, 0]
    );
    lu.register(A, 0xa);
    // Wrong key to change it: conflict; right key: changed.
    assert_eq!(
        lu.out(A, Register, 0, 0xb, 0xc),
        Err(ScsiError::ReservationConflict)
    );
    lu.out(A, Register, 0, 0xa, 0xc).unwrap();
    // REGISTER AND IGNORE EXISTING KEY ignores the key field.
    lu.out(A, RegisterAndIgnore, 0, 0x999, 0xd).unwrap();
    let keys = lu.read(PrInAction::ReadKeys);
    assert_eq!(keys, [0, 0, 0, 3, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0xd]);
}

#[test]
fn unregistering_the_holder_releases() {
    let mut lu = Lu::new();
    lu.register(A, 0xa);
    lu.register(B, 0xb);
    lu.ua.add_nexus(B);
    lu.ua.take(B);
    lu.out(A, Reserve, 5, 0xa, 0).unwrap();
    lu.out(A, Register, 0, 0xa, 0).unwrap();
    assert!(!lu.pr.is_reserved());
    // Registrants Only: the others are told.
    assert_eq!(lu.ua.take(B), Some(UnitAttention::ReservationsReleased));
}

#[test]
fn release_rules() {
    let mut lu = Lu::new();
    lu.register(A, 0xa);
    lu.register(B, 0xb);
    // Nothing reserved: GOOD.
    assert_eq!(lu.out(A, Release, 1, 0xa, 0), Ok(()));
    lu.out(A, Reserve, 1, 0xa, 0).unwrap();
    // Non-holder: GOOD, nothing happens.
    assert_eq!(lu.out(B, Release, 1, 0xb, 0), Ok(()));
    assert!(lu.pr.is_reserved());
    // Unregistered: conflict. Wrong key: conflict.
    assert_eq!(
        lu.out(C, Release, 1, 0, 0),
        Err(ScsiError::ReservationConflict)
    );
    assert_eq!(
        lu.out(A, Release, 1, 0xb, 0),
        Err(ScsiError::ReservationConflict)
    );
    // Holder naming another type: INVALID RELEASE.
    assert_eq!(
        lu.out(A, Release, 3, 0xa, 0),
        Err(ScsiError::InvalidRelease)
    );
    assert_eq!(lu.out(A, Release, 1, 0xa, 0), Ok(()));
    assert!(!lu.pr.is_reserved());
    assert_eq!(lu.pr.check(B, Access::Write), Ok(()));
}

#[test]
fn release_of_registrants_only_tells_the_others() {
    let mut lu = Lu::new();
    lu.register(A, 0xa);
    lu.register(B, 0xb);
    lu.out(A, Reserve, 6, 0xa, 0).unwrap();
    lu.out(A, Release, 6, 0xa, 0).unwrap();
    assert_eq!(lu.ua.take(B), Some(UnitAttention::ReservationsReleased));
    assert_eq!(lu.ua.take(A), None);
}

#[test]
fn clear_removes_everything() {
    let mut lu = Lu::new();
    lu.register(A, 0xa);
    lu.register(B, 0xb);
    lu.out(B, Reserve, 3, 0xb, 0).unwrap();
    assert_eq!(
        lu.out(C, Clear, 0, 0, 0),
        Err(ScsiError::ReservationConflict)
    );
    lu.out(A, Clear, 0, 0xa, 0).unwrap();
    assert!(!lu.pr.is_reserved());
    assert_eq!(lu.ua.take(B), Some(UnitAttention::ReservationsPreempted));
    assert_eq!(lu.ua.take(A), None);
    assert_eq!(lu.read(PrInAction::ReadKeys)[4..8], [0, 0, 0, 0]);
}

#[test]
fn preempt_the_holder() {
    let mut lu = Lu::new();
    lu.register(A, 0xa);
    lu.register(B, 0xb);
    lu.register(C, 0xc);
    lu.out(A, Reserve, 1, 0xa, 0).unwrap();
    lu.out(B, Preempt, 3, 0xb, 0xa).unwrap();
    assert_eq!(lu.ua.take(A), Some(UnitAttention::RegistrationsPreempted));
    // The type changed: C is told the old reservation went.
    assert_eq!(lu.ua.take(C), Some(UnitAttention::ReservationsReleased));
    assert_eq!(lu.pr.check(B, Access::Read), Ok(()));
    assert_eq!(
        lu.pr.check(A, Access::Read),
        Err(ScsiError::ReservationConflict)
    );
    let rr = lu.read(PrInAction::ReadReservation);
    assert_eq!(&rr[4..8], &[0, 0, 0, 16]);
    assert_eq!(&rr[8..16], &0xbu64.to_be_bytes());
    assert_eq!(rr[21], 0x03);
}

#[test]
fn preempt_registrations_only() {
    let mut lu = Lu::new();
    lu.register(A, 0xa);
    lu.register(B, 0xb);
    // No reservation: a zero key is invalid, an unknown key a conflict.
    assert_eq!(
        lu.out(A, Preempt, 1, 0xa, 0),
        Err(ScsiError::parameter_field(8, Some(7)))
    );
    assert_eq!(
        lu.out(A, Preempt, 1, 0xa, 0x77),
        Err(ScsiError::ReservationConflict)
    );
    lu.out(A, PreemptAndAbort, 1, 0xa, 0xb).unwrap();
    assert_eq!(lu.ua.take(B), Some(UnitAttention::RegistrationsPreempted));
    assert!(!lu.pr.is_reserved());
    assert_eq!(lu.read(PrInAction::ReadKeys)[4..8], [0, 0, 0, 8]);
}

#[test]
fn preempt_all_registrants_with_zero_key() {
    let mut lu = Lu::new();
    lu.register(A, 0xa);
    lu.register(B, 0xb);
    lu.out(A, Reserve, 7, 0xa, 0).unwrap();
    lu.out(B, Preempt, 1, 0xb, 0).unwrap();
    assert_eq!(
        lu.pr.check(A, Access::Write),
        Err(ScsiError::ReservationConflict)
    );
    assert_eq!(lu.ua.take(A), Some(UnitAttention::RegistrationsPreempted));
}

#[test]
fn parameter_list_checks() {
    let mut lu = Lu::new();
    let p = params(0, 1, 0);
    let short = OutRequest {
        action: Register,
        scope: 0,
        pr_type: 0,
        param_len: 23,
        data: &p,
    };
    assert_eq!(
        lu.pr.write(A, short, &mut lu.ua),
        Err(ScsiError::ParameterListLength)
    );
    assert_eq!(
        lu.out_raw(A, Register, 0, 0, &p[..20]),
        Err(ScsiError::ParameterListLength)
    );
    let cases = [(0x01, 0), (0x04, 2), (0x08, 3), (0x10, 4), (0x02, 1)];
    for (flags, bit) in cases {
        assert_eq!(
            lu.out_raw(A, Register, 0, 0, &params(0, 1, flags)),
            Err(ScsiError::parameter_field(20, Some(bit))),
            "flags {flags:#x}"
        );
    }
    lu.register(A, 0xa);
    assert_eq!(
        lu.out_raw(A, Reserve, 1, 1, &params(0xa, 0, 0)),
        Err(ScsiError::cdb_field(2, Some(7)))
    );
    assert_eq!(
        lu.out(A, Reserve, 2, 0xa, 0),
        Err(ScsiError::cdb_field(2, Some(3)))
    );
    // APTPL is ignored outside the register actions.
    assert_eq!(lu.out_raw(A, Reserve, 0, 1, &params(0xa, 0, 0x01)), Ok(()));
}

#[test]
fn generation_counts_register_clear_preempt_not_reserve() {
    let mut lu = Lu::new();
    let generation = |lu: &Lu| lu.read(PrInAction::ReadKeys)[3];
    lu.register(A, 0xa);
    assert_eq!(generation(&lu), 1);
    lu.out(A, Reserve, 1, 0xa, 0).unwrap();
    lu.out(A, Release, 1, 0xa, 0).unwrap();
    assert_eq!(generation(&lu), 1);
    lu.out(A, Clear, 0, 0xa, 0).unwrap();
    assert_eq!(generation(&lu), 2);
}

#[test]
fn registrations_are_bounded() {
    let mut lu = Lu::new();
    for i in 0..MAX_REGISTRANTS as u64 {
        lu.register(NexusId(100 + i), 1 + i);
    }
    assert_eq!(
        lu.out(A, Register, 0, 0, 5),
        Err(ScsiError::InsufficientRegistrationResources)
    );
}

#[test]
fn report_capabilities_bytes() {
    let lu = Lu::new();
    assert_eq!(
        lu.read(PrInAction::ReportCapabilities),
        [0x00, 0x08, 0x00, 0x80, 0xea, 0x01, 0x00, 0x00]
    );
    assert_eq!(
        lu.read(PrInAction::ReadReservation),
        [0, 0, 0, 0, 0, 0, 0, 0]
    );
}

#[test]
fn all_registrants_reservation_reports_key_zero() {
    let mut lu = Lu::new();
    lu.register(A, 0xa);
    lu.out(A, Reserve, 8, 0xa, 0).unwrap();
    let rr = lu.read(PrInAction::ReadReservation);
    assert_eq!(&rr[8..16], &[0; 8]);
    assert_eq!(rr[21], 0x08);
}
