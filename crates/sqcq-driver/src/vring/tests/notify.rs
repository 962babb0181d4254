//! Notification suppression, decided on each side by a different
//! implementation: the driver's kick decision against the device's
//! `avail_event` / `NO_NOTIFY`, and the device's interrupt decision against
//! the driver's `used_event` / `NO_INTERRUPT`.

use super::*;

fn event_idx(size: u16) -> QueueConfig {
    QueueConfig {
        event_idx: true,
        ..QueueConfig::new(size)
    }
}

#[test]
fn need_event_matches_the_specification() {
    // Crossing: old < event + 1 <= new, in wrapping arithmetic.
    assert!(vring_need_event(0, 1, 0));
    assert!(!vring_need_event(1, 1, 0));
    assert!(vring_need_event(4, 7, 3));
    assert!(!vring_need_event(2, 7, 3));
    assert!(vring_need_event(65535, 2, 65534));
    assert!(vring_need_event(1, 2, 65534));
    assert!(!vring_need_event(2, 2, 65534));
}

#[test]
fn kick_follows_the_device_avail_event() {
    let mut rig = Rig::new(event_idx(16));
    let b = rig.buf(8);
    // Nothing added: nothing to kick for.
    assert_eq!(rig.driver.publish(), NotifyDecision::Suppressed);
    // A fresh device's avail_event is 0: the first request crosses it.
    assert!(!rig.device_enable());
    rig.driver.add(&[b], &[], 0).unwrap();
    assert_eq!(rig.driver.publish(), NotifyDecision::Kick);
    assert!(rig.device_pop().is_some());

    // The device is busy (has not re-armed): no kick.
    rig.driver.add(&[b], &[], 1).unwrap();
    assert_eq!(rig.driver.publish(), NotifyDecision::Suppressed);
    assert!(rig.device_pop().is_some());

    // The device re-arms at its next_avail: the next publish kicks, once
    // for a whole batch.
    assert!(!rig.device_enable());
    for token in 2..5 {
        rig.driver.add(&[b], &[], token).unwrap();
    }
    assert_eq!(rig.driver.publish(), NotifyDecision::Kick);
    rig.driver.add(&[b], &[], 5).unwrap();
    assert_eq!(rig.driver.publish(), NotifyDecision::Suppressed);

    // Published before the device re-armed: the device's re-check sees it,
    // so the suppressed kick is not lost.
    assert!(rig.device_enable());
}

#[test]
fn kick_follows_no_notify_without_event_idx() {
    let mut rig = Rig::new(QueueConfig::new(16));
    let b = rig.buf(8);
    assert_eq!(rig.driver.used_flags(), 0);
    rig.device_disable();
    assert_eq!(rig.driver.used_flags(), USED_F_NO_NOTIFY);
    rig.driver.add(&[b], &[], 0).unwrap();
    assert_eq!(rig.driver.publish(), NotifyDecision::Suppressed);
    assert!(rig.device_enable());
    assert_eq!(rig.driver.used_flags(), 0);
    rig.driver.add(&[b], &[], 1).unwrap();
    assert_eq!(rig.driver.publish(), NotifyDecision::Kick);
}

#[test]
fn device_interrupts_follow_used_event() {
    let mut rig = Rig::new(event_idx(16));
    let b = rig.buf(8);
    for token in 0..6 {
        rig.driver.add(&[b], &[], token).unwrap();
    }
    let _ = rig.driver.publish();
    let heads: Vec<u16> = std::iter::from_fn(|| rig.device_pop().map(|(h, _)| h)).collect();
    assert_eq!(heads.len(), 6);

    assert!(!rig.driver.enable_interrupts());
    rig.device_complete(heads[0], 0);
    assert!(rig.device_needs_call());
    // One-shot: the second completion does not interrupt again.
    rig.device_complete(heads[1], 0);
    assert!(!rig.device_needs_call());

    // Consumed both, re-armed: the next completion interrupts.
    assert!(rig.driver.pop_used().unwrap().is_ok());
    assert!(rig.driver.pop_used().unwrap().is_ok());
    assert!(!rig.driver.enable_interrupts());
    rig.device_complete(heads[2], 0);
    assert!(rig.device_needs_call());

    // Disabled: the device does not interrupt, and the avail flags stay 0
    // as the specification requires with EVENT_IDX.
    rig.driver.disable_interrupts();
    rig.device_complete(heads[3], 0);
    assert!(!rig.device_needs_call());
    assert_eq!(rig.read_u16(rig.driver.avail_ring()), 0);

    // Re-enabling while completions wait tells the driver to poll.
    assert!(rig.driver.enable_interrupts());
    assert!(rig.driver.pop_used().unwrap().is_ok());
    assert!(rig.driver.pop_used().unwrap().is_ok());
    assert_eq!(rig.driver.in_flight(), 2);

    // Delayed: interrupt only after both remaining requests complete.
    assert!(!rig.driver.enable_interrupts_after(100));
    rig.device_complete(heads[4], 0);
    assert!(!rig.device_needs_call());
    rig.device_complete(heads[5], 0);
    assert!(rig.device_needs_call());
}

#[test]
fn no_interrupt_flag_without_event_idx() {
    let mut rig = Rig::new(QueueConfig::new(16));
    let flags = rig.driver.avail_ring();
    assert_eq!(rig.read_u16(flags), 0);
    rig.driver.disable_interrupts();
    assert_eq!(rig.read_u16(flags), AVAIL_F_NO_INTERRUPT);
    assert!(!rig.driver.enable_interrupts());
    assert_eq!(rig.read_u16(flags), 0);

    // A completion that arrived while disabled is reported on re-enable.
    let b = rig.buf(8);
    rig.driver.disable_interrupts();
    rig.driver.add(&[b], &[], 0).unwrap();
    let _ = rig.driver.publish();
    let (head, _) = rig.device_pop().unwrap();
    rig.device_complete(head, 0);
    assert!(rig.driver.enable_interrupts());
    assert_eq!(rig.driver.pop_used(), Some(Ok(Used { token: 0, len: 0 })));
}
