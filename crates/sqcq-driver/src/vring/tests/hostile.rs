//! A hostile or broken device, simulated by writing the used ring directly:
//! every inconsistency is a typed error, never a panic, and breaks the queue
//! until its in-flight requests are failed.

use super::*;

const SIZE: u16 = 8;

/// A rig with two requests in flight (one out-only, one with 64 writable
/// bytes), published and popped by the device.
fn rig_with_two_in_flight() -> (Rig, [u16; 2]) {
    let mut rig = Rig::new(QueueConfig::new(SIZE));
    let out = rig.buf(16);
    let in_ = rig.buf(64);
    let a = rig.driver.add(&[out], &[], 100).unwrap();
    let b = rig.driver.add(&[out], &[in_], 101).unwrap();
    let _ = rig.driver.publish();
    assert!(rig.device_pop().is_some());
    assert!(rig.device_pop().is_some());
    (rig, [a, b])
}

/// Writes used element `slot` and publishes `used_idx`, as a device would.
fn write_used(rig: &Rig, slot: u16, id: u32, len: u32, used_idx: u16) {
    let used = rig.driver.used_ring();
    let elem = used.unchecked_add(4 + 8 * u64::from(slot % SIZE));
    rig.gm().write_obj(id.to_le(), elem).unwrap();
    rig.gm()
        .write_obj(len.to_le(), elem.unchecked_add(4))
        .unwrap();
    rig.gm()
        .store(used_idx.to_le(), used.unchecked_add(2), Ordering::Release)
        .unwrap();
}

/// The error sticks, `add` refuses, and failing the in-flight requests
/// returns their tokens and a working queue.
fn assert_broken(rig: &mut Rig, error: &DeviceError) {
    assert_eq!(rig.driver.broken(), Some(error));
    assert_eq!(rig.driver.pop_used(), Some(Err(error.clone())));
    let b = rig.buf(8);
    assert!(matches!(
        rig.driver.add(&[b], &[], 0),
        Err(QueueError::Broken(e)) if &e == error
    ));
    let mut failed = Vec::new();
    rig.driver.fail_in_flight(|token| failed.push(token));
    failed.sort_unstable();
    assert_eq!(rig.driver.in_flight(), 0);
    assert_eq!(rig.driver.num_free(), SIZE);
    assert!(rig.driver.broken().is_none());
    assert_eq!(rig.driver.pop_used(), None);

    // A reset device works with the reset queue.
    rig.device = device_queue(&rig.mem, &rig.driver);
    rig.driver.add(&[b], &[], 7).unwrap();
    assert_eq!(rig.driver.publish(), NotifyDecision::Kick);
    let (head, _) = rig.device_pop().unwrap();
    rig.device_complete(head, 0);
    assert_eq!(rig.driver.pop_used(), Some(Ok(Used { token: 7, len: 0 })));
    // Tokens of whatever was in flight when the device broke.
    assert!(failed.iter().all(|t| (100..=101).contains(t)));
}

#[test]
fn unknown_id() {
    let (mut rig, _) = rig_with_two_in_flight();
    write_used(&rig, 0, u32::from(SIZE), 0, 1);
    let error = DeviceError::UnknownId {
        id: u32::from(SIZE),
        size: SIZE,
    };
    assert_eq!(rig.driver.pop_used(), Some(Err(error.clone())));
    assert_broken(&mut rig, &error);

    let (mut rig, _) = rig_with_two_in_flight();
    write_used(&rig, 0, 0x1_0000, 0, 1);
    assert!(matches!(
        rig.driver.pop_used(),
        Some(Err(DeviceError::UnknownId { id: 0x1_0000, .. }))
    ));
    assert_eq!(rig.driver.in_flight(), 2);
}

#[test]
fn id_not_in_flight() {
    let (mut rig, [a, b]) = rig_with_two_in_flight();
    // A descriptor that is free (the one after both chains).
    let free = (0..SIZE).find(|&i| i != a && i != b && i != b + 1).unwrap();
    write_used(&rig, 0, u32::from(free), 0, 1);
    let error = DeviceError::NotInFlight { id: free };
    assert_eq!(rig.driver.pop_used(), Some(Err(error.clone())));
    assert_broken(&mut rig, &error);
}

#[test]
fn completed_twice() {
    let (mut rig, [a, _]) = rig_with_two_in_flight();
    write_used(&rig, 0, u32::from(a), 0, 1);
    assert_eq!(rig.driver.pop_used(), Some(Ok(Used { token: 100, len: 0 })));
    write_used(&rig, 1, u32::from(a), 0, 2);
    let error = DeviceError::NotInFlight { id: a };
    assert_eq!(rig.driver.pop_used(), Some(Err(error.clone())));
    let mut failed = Vec::new();
    rig.driver.fail_in_flight(|token| failed.push(token));
    assert_eq!(failed, [101]);
}

#[test]
fn length_past_the_writable_buffers() {
    let (mut rig, [a, b]) = rig_with_two_in_flight();
    // Out-only request: any written length is too long.
    write_used(&rig, 0, u32::from(a), 1, 1);
    let error = DeviceError::LengthTooLong {
        id: a,
        len: 1,
        max: 0,
    };
    assert_eq!(rig.driver.pop_used(), Some(Err(error.clone())));
    assert_broken(&mut rig, &error);

    let (mut rig, [_, b2]) = rig_with_two_in_flight();
    assert_eq!(b, b2);
    write_used(&rig, 0, u32::from(b), 65, 1);
    assert_eq!(
        rig.driver.pop_used(),
        Some(Err(DeviceError::LengthTooLong {
            id: b,
            len: 65,
            max: 64
        }))
    );
}

#[test]
fn used_index_jump() {
    let (mut rig, [a, _]) = rig_with_two_in_flight();
    write_used(&rig, 0, u32::from(a), 0, SIZE + 1);
    let error = DeviceError::UsedIndexJump {
        last_used: 0,
        used_idx: SIZE + 1,
        size: SIZE,
    };
    assert_eq!(rig.driver.pop_used(), Some(Err(error.clone())));
    assert_broken(&mut rig, &error);

    // Backwards is a jump too (by more than the size, modulo 2^16).
    let (mut rig, _) = rig_with_two_in_flight();
    write_used(&rig, 0, 0, 0, u16::MAX);
    assert!(matches!(
        rig.driver.pop_used(),
        Some(Err(DeviceError::UsedIndexJump {
            used_idx: u16::MAX,
            ..
        }))
    ));
    // Exactly the size ahead is legal (a full ring of completions); here
    // the entries are bogus, so the first one is rejected for its id.
    let (mut rig, _) = rig_with_two_in_flight();
    write_used(&rig, 0, u32::from(SIZE), 0, SIZE);
    assert!(matches!(
        rig.driver.pop_used(),
        Some(Err(DeviceError::UnknownId { .. }))
    ));
}
