//! `ring-poll`: the standard-virtio answer to the RFC reviewer's question,
//! as a [`Watch`] so that it shares the poller and the spin policy with
//! the doorbells and a benchmark compares the signalling mechanism alone.
//!
//! The device polls `avail->idx` with notifications disabled
//! (VRING_USED_F_NO_NOTIFY set, or with EVENT_IDX `avail_event` left
//! behind) and re-enables them only before it sleeps. Both steps are
//! virtio-queue's own `disable_notification` and `enable_notification`;
//! the latter stores the flag (or `avail_event`), executes
//! `fence(SeqCst)` and re-reads `avail->idx`, which pairs with the full
//! barrier the driver executes between publishing `avail->idx` and
//! reading `used->flags`/`avail_event` (virtio_ring's `virtqueue_kick_prepare`).
//!
//! The watch drives its own `virtio_queue::Queue` over the same ring
//! addresses, used for nothing but these notification fields and the avail
//! index: the queue that takes requests belongs to the request path, and a
//! [`Watch`] takes no context.

use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};

use sqcq_protocol::{SleepCheck, Watch};
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestAddress;

use crate::runtime::guest::GuestMem;
use crate::runtime::queue::RingConfig;

/// Watches a split ring's avail index.
#[derive(Debug)]
pub struct RingWatch {
    queue: Queue,
    mem: Arc<GuestMem>,
    seen: u16,
    error: Option<virtio_queue::Error>,
}

impl RingWatch {
    /// Watches `ring` in `mem` from its base index and disables
    /// notifications.
    pub fn new(ring: &RingConfig, mem: Arc<GuestMem>) -> Result<Self, virtio_queue::Error> {
        let mut queue = Queue::new(ring.size)?;
        queue.try_set_size(ring.size)?;
        queue.try_set_desc_table_address(GuestAddress(ring.desc))?;
        queue.try_set_avail_ring_address(GuestAddress(ring.avail))?;
        queue.try_set_used_ring_address(GuestAddress(ring.used))?;
        queue.set_event_idx(ring.event_idx);
        queue.set_next_avail(ring.next_avail);
        queue.set_ready(true);
        queue.disable_notification(&*mem)?;
        Ok(RingWatch {
            queue,
            mem,
            seen: ring.next_avail,
            error: None,
        })
    }

    /// Follows a new memory map (the frontend replaced the memory table).
    pub fn set_memory(&mut self, mem: Arc<GuestMem>) {
        self.mem = mem;
    }

    /// The first guest memory error met, if any (the ring then lies
    /// outside memory: the queue is broken).
    pub fn take_error(&mut self) -> Option<virtio_queue::Error> {
        self.error.take()
    }

    fn avail_idx(&mut self, order: Ordering) -> Option<u16> {
        match self.queue.avail_idx(&*self.mem, order) {
            Ok(idx) => Some(idx.0),
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
        self.queue.set_next_avail(self.seen);
        match self.queue.enable_notification(&*self.mem) {
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
        if let Err(e) = self.queue.disable_notification(&*self.mem) {
            self.error.get_or_insert(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::Bytes;

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
    fn ring_outside_memory_is_an_error() {
        let m = memory();
        let mut r = ring(false);
        r.avail = 0x20000;
        r.used = 0x21000;
        assert!(RingWatch::new(&r, m).is_err());
    }
}
