//! `ring-poll`: the standard-virtio answer to the RFC reviewer's question,
//! as a [`Watch`] so that it shares the poller and the spin policy with
//! the doorbells and a benchmark compares the signalling mechanism alone.
//!
//! The device polls `avail->idx` with notifications disabled
//! (VRING_USED_F_NO_NOTIFY set, or with EVENT_IDX `avail_event` left
//! behind) and re-enables them only before it sleeps, with the split
//! ring's own [`RingLayout::enable_notification`]: the flag (or
//! `avail_event`), `fence(SeqCst)`, and the re-read of `avail->idx`.
//!
//! A packed ring ([`PackedWatch`]) is watched the same way: the flags of
//! the descriptor at the device's next position, with the device event
//! suppression structure set to DISABLE while polling and to ENABLE (or,
//! with EVENT_IDX, to that position) before the re-check.
//!
//! The watch works on a copy of the ring's layout and keeps its own view
//! of the memory map: the ring state that takes requests belongs to the
//! request path, and a [`Watch`] takes no context. A packed ring has no
//! index to compare with, so its request path tells the watch where it
//! stands after each batch ([`PackedWatch::follow`]). Lists the path took
//! without the watch having reported them (a kick woke the worker, which
//! took them first) are reported at the next poll, as a split ring's
//! watch reports an avail index it has not seen yet: the poller learns of
//! every arrival, and its spin window with it.

use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};

use sqcq_protocol::{SleepCheck, Watch};

use crate::runtime::batch::Mapped;
use crate::runtime::guest::GuestMem;
use crate::runtime::packed::{PackedConfig, PackedLayout, Position, decode_base};
use crate::runtime::split::{RingConfig, RingError, RingLayout};

/// Watches a split ring's avail index.
#[derive(Debug)]
pub struct RingWatch {
    layout: RingLayout,
    mem: Mapped,
    seen: u16,
    error: Option<RingError>,
}

impl RingWatch {
    /// Watches `ring` in `mem` from its base index and disables
    /// notifications.
    pub fn new(ring: &RingConfig, mem: Arc<GuestMem>) -> Result<Self, RingError> {
        let mem = Mapped::new(mem);
        let layout = RingLayout::new(ring, mem.batch())?;
        layout.disable_notification(mem.batch(), ring.next_avail)?;
        Ok(RingWatch {
            layout,
            mem,
            seen: ring.next_avail,
            error: None,
        })
    }

    /// Follows a new memory map (the frontend replaced the memory table).
    pub fn set_memory(&mut self, mem: Arc<GuestMem>) {
        self.mem = Mapped::new(mem);
    }

    /// The first guest memory error met, if any (the ring then lies
    /// outside memory: the queue is broken).
    pub fn take_error(&mut self) -> Option<RingError> {
        self.error.take()
    }

    fn avail_idx(&mut self, order: Ordering) -> Option<u16> {
        match self.layout.avail_idx(self.mem.batch(), order) {
            Ok(idx) => Some(idx),
            Err(e) => {
                self.error.get_or_insert(e);
                None
            }
        }
    }
}

impl Watch for RingWatch {
    fn poll(&mut self) -> Option<u16> {
        // Relaxed: nothing new is the common case and needs no barrier.
        let idx = self.avail_idx(Ordering::Relaxed)?;
        if idx == self.seen {
            return None;
        }
        // Pairs with the driver's release store of `avail->idx`: the ring
        // entries and descriptors before it are visible from here on.
        fence(Ordering::Acquire);
        self.seen = idx;
        Some(idx)
    }

    fn prepare_sleep(&mut self) -> SleepCheck {
        // The request path drained the ring up to at least `seen` (the
        // poller only expires after a poll found `avail->idx == seen`):
        // ask to be notified of anything after it. With EVENT_IDX this
        // stores `avail_event = seen`, else clears NO_NOTIFY; then
        // fence(SeqCst) and the re-check.
        match self.layout.enable_notification(self.mem.batch(), self.seen) {
            Ok(false) => SleepCheck::Sleep,
            Ok(true) => {
                self.finish_sleep();
                // Acquire: pairs with the driver's Release store of
                // avail->idx, making the entries it announces visible.
                match self.avail_idx(Ordering::Acquire) {
                    Some(idx) => {
                        self.seen = idx;
                        SleepCheck::Work(idx)
                    }
                    None => SleepCheck::Sleep,
                }
            }
            Err(e) => {
                self.error.get_or_insert(e);
                SleepCheck::Sleep
            }
        }
    }

    fn finish_sleep(&mut self) {
        if let Err(e) = self
            .layout
            .disable_notification(self.mem.batch(), self.seen)
        {
            self.error.get_or_insert(e);
        }
    }
}

/// Watches the descriptor at a packed ring's next position.
#[derive(Debug)]
pub struct PackedWatch {
    layout: PackedLayout,
    mem: Mapped,
    /// The request path's next position.
    at: Position,
    /// The watch reported the list at `at` since the last `follow`.
    reported: bool,
    /// The request path took lists the watch never reported.
    unreported: bool,
    error: Option<RingError>,
}

impl PackedWatch {
    /// Watches the packed ring `ring` in `mem` from its base and disables
    /// notifications.
    pub fn new(ring: &RingConfig, mem: Arc<GuestMem>) -> Result<Self, RingError> {
        let mem = Mapped::new(mem);
        let base = ring.base();
        let (avail, used) = decode_base(base, ring.size).ok_or(RingError::Base {
            base,
            size: ring.size,
        })?;
        let layout = PackedLayout::new(
            &PackedConfig {
                size: ring.size,
                desc: ring.desc,
                driver_event: ring.avail,
                device_event: ring.used,
                avail,
                used,
                event_idx: ring.event_idx,
            },
            mem.batch(),
        )?;
        layout.disable_notification(mem.batch())?;
        Ok(PackedWatch {
            layout,
            mem,
            at: avail,
            reported: false,
            unreported: false,
            error: None,
        })
    }

    /// Follows a new memory map (the frontend replaced the memory table).
    pub fn set_memory(&mut self, mem: Arc<GuestMem>) {
        self.mem = Mapped::new(mem);
    }

    /// The request path took everything before `at`.
    pub fn follow(&mut self, at: Position) {
        if at != self.at && !self.reported {
            self.unreported = true;
        }
        self.at = at;
        self.reported = false;
    }

    /// The first guest memory error met, if any.
    pub fn take_error(&mut self) -> Option<RingError> {
        self.error.take()
    }

    fn available(&mut self, order: Ordering) -> bool {
        match self.layout.available_at(self.mem.batch(), self.at, order) {
            Ok(a) => a,
            Err(e) => {
                self.error.get_or_insert(e);
                false
            }
        }
    }
}

impl Watch for PackedWatch {
    fn poll(&mut self) -> Option<u16> {
        // Acquire: pairs with the driver's barrier before the flags store;
        // the request path reads the list right after.
        if std::mem::take(&mut self.unreported) || self.available(Ordering::Acquire) {
            self.reported = true;
            return Some(self.at.encode());
        }
        None
    }

    fn prepare_sleep(&mut self) -> SleepCheck {
        match self.layout.enable_notification(self.mem.batch(), self.at) {
            Ok(false) => SleepCheck::Sleep,
            Ok(true) => {
                self.finish_sleep();
                SleepCheck::Work(self.at.encode())
            }
            Err(e) => {
                self.error.get_or_insert(e);
                SleepCheck::Sleep
            }
        }
    }

    fn finish_sleep(&mut self) {
        if let Err(e) = self.layout.disable_notification(self.mem.batch()) {
            self.error.get_or_insert(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestAddress};

    const AVAIL: u64 = 0x1000;
    const USED: u64 = 0x2000;

    fn ring(event_idx: bool) -> RingConfig {
        RingConfig {
            size: 8,
            desc: 0,
            avail: AVAIL,
            used: USED,
            next_avail: 0,
            event_idx,
            packed: false,
            next_used: 0,
        }
    }

    fn memory() -> Arc<GuestMem> {
        Arc::new(crate::runtime::guest::test_memory(&[(
            GuestAddress(0),
            0x10000,
        )]))
    }

    fn used_flags(m: &GuestMem) -> u16 {
        m.read_obj(GuestAddress(USED)).unwrap()
    }

    #[test]
    fn no_notify_is_set_while_polling_and_cleared_to_sleep() {
        let m = memory();
        let mut w = RingWatch::new(&ring(false), Arc::clone(&m)).unwrap();
        assert_eq!(used_flags(&m), 1, "VRING_USED_F_NO_NOTIFY while polling");
        assert_eq!(w.poll(), None);
        m.write_obj(3u16, GuestAddress(AVAIL + 2)).unwrap();
        assert_eq!(w.poll(), Some(3));
        assert_eq!(w.prepare_sleep(), SleepCheck::Sleep);
        assert_eq!(used_flags(&m), 0, "notifications on while asleep");
        w.finish_sleep();
        assert_eq!(used_flags(&m), 1);
    }

    #[test]
    fn event_idx_leaves_avail_event_behind_until_sleep() {
        let m = memory();
        let mut w = RingWatch::new(&ring(true), Arc::clone(&m)).unwrap();
        let avail_event = GuestAddress(USED + 4 + 8 * 8);
        m.write_obj(5u16, GuestAddress(AVAIL + 2)).unwrap();
        assert_eq!(w.poll(), Some(5));
        let before: u16 = m.read_obj(avail_event).unwrap();
        assert_eq!(before, 0, "left behind while polling");
        assert_eq!(w.prepare_sleep(), SleepCheck::Sleep);
        let after: u16 = m.read_obj(avail_event).unwrap();
        assert_eq!(after, 5, "the next request after 5 kicks");
    }

    #[test]
    fn work_arriving_before_sleep_is_found() {
        let m = memory();
        let mut w = RingWatch::new(&ring(false), Arc::clone(&m)).unwrap();
        m.write_obj(2u16, GuestAddress(AVAIL + 2)).unwrap();
        assert_eq!(w.prepare_sleep(), SleepCheck::Work(2));
        assert_eq!(used_flags(&m), 1, "back to polling: NO_NOTIFY again");
    }

    #[test]
    fn lists_the_request_path_took_unreported_count_as_an_arrival() {
        let m = memory();
        let start = Position::START.encode();
        let cfg = RingConfig {
            packed: true,
            next_avail: start,
            next_used: start,
            ..ring(false)
        };
        let mut w = PackedWatch::new(&cfg, Arc::clone(&m)).unwrap();
        assert_eq!(w.poll(), None, "nothing available");
        // A kick woke the worker, which took two lists the watch never saw.
        let at = Position::START.advance(2, 8);
        w.follow(at);
        assert_eq!(w.poll(), Some(at.encode()), "reported once");
        assert_eq!(w.poll(), None);
        // A list the watch reported, then took: nothing more to report.
        let flags = GuestAddress(16 * u64::from(at.off()) + 14);
        m.write_obj(0x80u16, flags).unwrap();
        assert_eq!(w.poll(), Some(at.encode()));
        w.follow(at.advance(1, 8));
        assert_eq!(w.poll(), None);
    }

    #[test]
    fn ring_outside_memory_is_an_error() {
        let m = memory();
        let mut r = ring(false);
        r.avail = 0x20000;
        r.used = 0x21000;
        assert!(RingWatch::new(&r, m).is_err());
    }
}
