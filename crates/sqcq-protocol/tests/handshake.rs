//! The handshake's single-threaded behaviour: which call sets or clears
//! which bit, what ends up in memory, and 16-bit wrap-around. The
//! concurrent behaviour is proven in `loom.rs`.

use std::ptr::NonNull;
use std::sync::atomic::Ordering;

use sqcq_protocol::{
    CqConsumer, CqProducer, Doorbell, DoorbellCell, NEED_WAKEUP, RawDoorbell, SleepCheck,
    SqConsumer, SqProducer, THROTTLE, Wake,
};

fn first_bytes(bell: &Doorbell) -> [u8; 4] {
    let idx = bell.idx().load(Ordering::Relaxed).to_ne_bytes();
    let flags = bell.flags().load(Ordering::Relaxed).to_ne_bytes();
    [idx[0], idx[1], flags[0], flags[1]]
}

#[test]
fn layout_matches_the_specification() {
    assert_eq!(size_of::<Doorbell>(), 64);
    assert_eq!(align_of::<Doorbell>(), 64);
    let bell = Doorbell::new();
    let base = &bell as *const Doorbell as usize;
    assert_eq!(
        bell.idx() as *const _ as usize - base,
        sqcq_protocol::doorbell::IDX_OFFSET
    );
    assert_eq!(
        bell.flags() as *const _ as usize - base,
        sqcq_protocol::doorbell::FLAGS_OFFSET
    );
}

#[test]
fn raw_doorbell_reaches_the_same_fields() {
    let bell = Doorbell::new();
    // SAFETY: `bell` is 64-byte aligned, 64 bytes long and outlives `raw`.
    let raw = unsafe { RawDoorbell::new(NonNull::from(&bell).cast()) };
    let mut p = SqProducer::new(&raw);
    let _ = p.publish(0x1234);
    raw.flags().store(NEED_WAKEUP.to_le(), Ordering::Relaxed);
    assert_eq!(u16::from_le(bell.idx().load(Ordering::Relaxed)), 0x1234);
    assert_eq!(p.publish(0x1235), Wake::Owed);
}

#[test]
fn idx_and_flags_are_little_endian_in_memory() {
    let bell = Doorbell::new();
    let mut p = SqProducer::new(&bell);
    let mut c = SqConsumer::new(&bell, 0);
    let _ = p.publish(0x1234);
    assert_eq!(c.poll(), Some(0x1234));
    assert_eq!(c.prepare_sleep(), SleepCheck::Sleep);
    assert_eq!(first_bytes(&bell), [0x34, 0x12, 0x01, 0x00]);
}

#[test]
fn wakeup_owed_only_while_consumer_sleeps() {
    let bell = Doorbell::new();
    let mut p = CqProducer::new(&bell);
    let mut c = CqConsumer::new(&bell, 0);
    assert_eq!(p.publish(1), Wake::NotOwed);
    assert_eq!(c.poll(), Some(1));
    assert_eq!(c.poll(), None);
    assert_eq!(c.prepare_sleep(), SleepCheck::Sleep);
    assert_eq!(p.publish(2), Wake::Owed);
    c.finish_sleep();
    assert_eq!(p.publish(3), Wake::NotOwed);
    assert_eq!(c.poll(), Some(3));
}

#[test]
fn prepare_sleep_sees_earlier_work_and_clears_the_flag() {
    let bell = Doorbell::new();
    let mut p = SqProducer::new(&bell);
    let mut c = SqConsumer::new(&bell, 0);
    assert_eq!(p.publish(5), Wake::NotOwed);
    assert_eq!(c.prepare_sleep(), SleepCheck::Work(5));
    assert_eq!(
        p.publish(6),
        Wake::NotOwed,
        "flag must be cleared after Work"
    );
}

#[test]
fn sixteen_bit_wrap_is_just_a_change() {
    let bell = Doorbell::new();
    let mut p = SqProducer::new(&bell);
    let mut c = SqConsumer::new(&bell, 0xfffe);
    for idx in [0xffff, 0x0000, 0x0001] {
        let _ = p.publish(idx);
        assert_eq!(c.poll(), Some(idx));
    }
    assert_eq!(c.seen(), 1);
}

#[test]
fn roles_resume_from_existing_state() {
    let bell = Doorbell::new();
    let mut p = SqProducer::new(&bell);
    let _ = p.publish(41);
    let mut c = SqConsumer::new(&bell, 0);
    assert_eq!(c.prepare_sleep(), SleepCheck::Work(41));
    assert_eq!(SqProducer::new(&bell).idx(), 41);
    // A consumer starting where the ring is sees nothing new.
    assert_eq!(SqConsumer::new(&bell, 41).poll(), None);
}

#[test]
fn new_consumer_clears_a_stale_need_wakeup() {
    let bell = Doorbell::new();
    let mut c = SqConsumer::new(&bell, 0);
    assert_eq!(c.prepare_sleep(), SleepCheck::Sleep);
    let _c2 = SqConsumer::new(&bell, 0);
    assert_eq!(SqProducer::new(&bell).publish(1), Wake::NotOwed);
}

#[test]
fn reserved_flag_bits_do_not_count_as_need_wakeup() {
    let bell = Doorbell::new();
    bell.flags().store(0xfffe_u16.to_le(), Ordering::Relaxed);
    assert_eq!(SqProducer::new(&bell).publish(1), Wake::NotOwed);
    bell.flags().store(0xffff_u16.to_le(), Ordering::Relaxed);
    assert_eq!(SqProducer::new(&bell).publish(2), Wake::Owed);
}

fn flags(bell: &Doorbell) -> u16 {
    u16::from_le(bell.flags().load(Ordering::Relaxed))
}

#[test]
fn throttle_and_need_wakeup_travel_together_in_sq_flags() {
    let bell = Doorbell::new();
    let mut p = SqProducer::new(&bell);
    let mut c = SqConsumer::new(&bell, 0);
    c.set_throttle(true);
    assert_eq!(flags(&bell), THROTTLE);
    // Sleeping keeps THROTTLE; waking keeps it too (T4).
    assert_eq!(c.prepare_sleep(), SleepCheck::Sleep);
    assert_eq!(flags(&bell), THROTTLE | NEED_WAKEUP);
    assert_eq!(p.publish(1), Wake::Owed);
    assert!(p.throttle());
    c.finish_sleep();
    assert_eq!(flags(&bell), THROTTLE);
    // Clearing THROTTLE while asleep keeps NEED_WAKEUP.
    assert_eq!(c.poll(), Some(1));
    assert_eq!(c.prepare_sleep(), SleepCheck::Sleep);
    c.set_throttle(false);
    assert_eq!(flags(&bell), NEED_WAKEUP);
    assert!(
        p.throttle(),
        "the cached flags are the ones of the last publish"
    );
    assert!(!p.load_throttle());
    assert_eq!(p.publish(2), Wake::Owed);
    assert!(!p.throttle());
}

#[test]
fn a_new_consumer_clears_a_stale_throttle() {
    let bell = Doorbell::new();
    let mut c = SqConsumer::new(&bell, 0);
    c.set_throttle(true);
    assert!(c.throttled());
    let c2 = SqConsumer::new(&bell, 0);
    assert!(!c2.throttled());
    assert_eq!(flags(&bell), 0);
}

#[test]
fn the_consumer_never_reads_back_what_the_producer_wrote_into_flags() {
    let bell = Doorbell::new();
    let mut c = SqConsumer::new(&bell, 0);
    // A hostile driver writes junk into the device's word.
    bell.flags().store(0xfff0u16.to_le(), Ordering::Relaxed);
    c.set_throttle(true);
    assert_eq!(flags(&bell), THROTTLE);
}

#[test]
fn throttle_is_reserved_on_the_cq() {
    let bell = Doorbell::new();
    let mut p = CqProducer::new(&bell);
    let mut c = CqConsumer::new(&bell, 0);
    c.set_throttle(true);
    assert_eq!(flags(&bell), 0);
    bell.flags().store(THROTTLE.to_le(), Ordering::Relaxed);
    let _ = p.publish(1);
    assert!(!p.throttle());
}
