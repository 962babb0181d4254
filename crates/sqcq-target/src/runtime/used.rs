//! The device's side of the used ring, batched: elements are written as
//! requests complete, the index is published once per batch, and the
//! driver is notified at most once per batch.
//!
//! Part of the split ring (`runtime::split`). virtio-queue's
//! `Queue::add_used`, which `split.rs`'s tests use as the oracle,
//! publishes the index on every call; a
//! worker that completes 32 requests in one pass would store the shared
//! index 32 times and, without EVENT_IDX, could not tell whether one call
//! covers them all. [`UsedRing`] keeps the private `next_used`, writes
//! elements with plain stores and publishes them with one `Release` store
//! of `used->idx` (crosvm's batched publish in `split_queue.rs`).

use std::num::Wrapping;
use std::sync::atomic::{Ordering, fence};

use crate::runtime::batch::Batch;
use thiserror::Error;
use vm_memory::GuestAddress;

/// Offset of `ring[]` in the used ring (after `flags` and `idx`).
const USED_RING_HEADER: u64 = 4;
/// Size of one used element (`id` le32, `len` le32).
const USED_ELEM_SIZE: u64 = 8;
/// Offset of `ring[]` in the available ring.
const AVAIL_RING_HEADER: u64 = 4;
/// VRING_AVAIL_F_NO_INTERRUPT.
const AVAIL_F_NO_INTERRUPT: u16 = 1;

/// The used ring could not be written.
#[derive(Debug, Error)]
pub enum UsedError {
    /// The head index is not a descriptor of this queue.
    #[error("head index {head} out of range for queue size {size}")]
    BadHead {
        /// The index.
        head: u16,
        /// The queue size.
        size: u16,
    },
    /// A ring address plus an offset overflows.
    #[error("used ring address overflows")]
    Overflow,
    /// The ring lies outside guest memory.
    #[error("used ring access failed")]
    Memory(#[source] vm_memory::GuestMemoryError),
}

/// The used ring of one queue, owned by the worker serving it.
#[derive(Debug)]
pub struct UsedRing {
    used: GuestAddress,
    avail: GuestAddress,
    size: u16,
    event_idx: bool,
    next_used: Wrapping<u16>,
    published: Wrapping<u16>,
}

impl UsedRing {
    /// A used ring at `used` for a queue of `size` whose avail ring is at
    /// `avail`, continuing from `next_used`.
    pub fn new(
        used: GuestAddress,
        avail: GuestAddress,
        size: u16,
        event_idx: bool,
        next_used: u16,
    ) -> Self {
        debug_assert!(size.is_power_of_two(), "a split ring's size");
        UsedRing {
            used,
            avail,
            size,
            event_idx,
            next_used: Wrapping(next_used),
            published: Wrapping(next_used),
        }
    }

    /// Index the next element goes to.
    pub fn next_used(&self) -> u16 {
        self.next_used.0
    }

    /// Elements written and not yet published.
    pub fn pending(&self) -> u16 {
        (self.next_used - self.published).0
    }

    /// Writes one element; it becomes visible to the driver at the next
    /// [`publish`](Self::publish).
    pub fn push(&mut self, mem: Batch<'_>, head: u16, len: u32) -> Result<(), UsedError> {
        if head >= self.size {
            return Err(UsedError::BadHead {
                head,
                size: self.size,
            });
        }
        // A split ring's size is a power of two (checked when the ring is
        // set up), so this is the index modulo the size without a
        // division; any size would still give a slot below it.
        let slot = u64::from(self.next_used.0 & (self.size - 1));
        let at = offset(self.used, USED_RING_HEADER + slot * USED_ELEM_SIZE)?;
        let elem = (u64::from(len) << 32 | u64::from(head)).to_le_bytes();
        // The driver reads the element only after the Release store of
        // `used->idx` in `publish_index`.
        mem.write_bytes(at.0, &elem).map_err(UsedError::Memory)?;
        self.next_used += Wrapping(1);
        Ok(())
    }

    /// Publishes every pushed element (one `used->idx` store) without
    /// deciding about a notification; returns how many were published.
    /// With VIRTIO_F_SQCQ_POLL the CQ doorbell decides instead.
    pub fn publish_index(&mut self, mem: Batch<'_>) -> Result<u16, UsedError> {
        let count = (self.next_used - self.published).0;
        if count == 0 {
            return Ok(0);
        }
        // Release: the element writes above become visible before the new
        // index; pairs with the driver's Acquire load of `used->idx` (its
        // virtio_rmb() after reading the index).
        let at = offset(self.used, 2)?;
        mem.store_u16(at.0, self.next_used.0, Ordering::Release)
            .map_err(UsedError::Memory)?;
        self.published = self.next_used;
        Ok(count)
    }

    /// Publishes every pushed element and says whether the driver must be
    /// notified (EVENT_IDX `used_event`, or VRING_AVAIL_F_NO_INTERRUPT
    /// without it).
    pub fn publish(&mut self, mem: Batch<'_>) -> Result<bool, UsedError> {
        let old = self.published;
        if self.publish_index(mem)? == 0 {
            return Ok(false);
        }
        let new = self.published;
        // SeqCst: the index store above must be ordered before the load of
        // `used_event` (or the avail flags) below. Pairs with the driver's
        // full barrier between writing `used_event` and re-reading
        // `used->idx` (virtqueue_enable_cb_delayed): without it both sides
        // can read stale values and the interrupt is lost.
        fence(Ordering::SeqCst);
        if self.event_idx {
            let at = offset(self.avail, AVAIL_RING_HEADER + 2 * u64::from(self.size))?;
            let used_event = mem
                .load_u16(at.0, Ordering::Relaxed)
                .map_err(UsedError::Memory)?;
            let event = Wrapping(used_event);
            // vring_need_event(): notify when `used_event` lies in
            // [old, new).
            Ok(new - event - Wrapping(1) < new - old)
        } else {
            let flags = mem
                .load_u16(self.avail.0, Ordering::Relaxed)
                .map_err(UsedError::Memory)?;
            Ok(flags & AVAIL_F_NO_INTERRUPT == 0)
        }
    }
}

fn offset(base: GuestAddress, off: u64) -> Result<GuestAddress, UsedError> {
    base.0
        .checked_add(off)
        .map(GuestAddress)
        .ok_or(UsedError::Overflow)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::batch::Mapped;
    use crate::runtime::guest::GuestMem;
    use std::sync::Arc;
    use vm_memory::Bytes;

    const AVAIL: u64 = 0x1000;
    const USED: u64 = 0x2000;

    fn setup(event_idx: bool) -> (Mapped, UsedRing) {
        let m = Mapped::new(Arc::new(crate::runtime::guest::test_memory(&[(
            GuestAddress(0),
            0x10000,
        )])));
        let r = UsedRing::new(GuestAddress(USED), GuestAddress(AVAIL), 4, event_idx, 0);
        (m, r)
    }

    fn used_idx(m: &Mapped) -> u16 {
        m.map().read_obj(GuestAddress(USED + 2)).unwrap()
    }

    #[test]
    fn one_publish_per_batch() {
        let (m, mut r) = setup(false);
        r.push(m.batch(), 1, 10).unwrap();
        r.push(m.batch(), 2, 20).unwrap();
        assert_eq!(used_idx(&m), 0, "nothing visible before publish");
        assert!(r.publish(m.batch()).unwrap());
        assert_eq!(used_idx(&m), 2);
        assert_eq!(element(m.map(), 1), (2, 20));
        assert!(
            !r.publish(m.batch()).unwrap(),
            "an empty batch notifies nobody"
        );
    }

    #[test]
    fn no_interrupt_flag_is_honoured() {
        let (m, mut r) = setup(false);
        m.map()
            .write_obj(AVAIL_F_NO_INTERRUPT, GuestAddress(AVAIL))
            .unwrap();
        r.push(m.batch(), 0, 0).unwrap();
        assert!(!r.publish(m.batch()).unwrap());
    }

    #[test]
    fn event_idx_notifies_when_used_event_is_crossed() {
        let (m, mut r) = setup(true);
        let used_event = GuestAddress(AVAIL + 4 + 2 * 4);
        m.map().write_obj(1u16, used_event).unwrap();
        r.push(m.batch(), 0, 0).unwrap();
        assert!(
            !r.publish(m.batch()).unwrap(),
            "idx 1 does not pass used_event 1"
        );
        r.push(m.batch(), 1, 0).unwrap();
        r.push(m.batch(), 2, 0).unwrap();
        assert!(r.publish(m.batch()).unwrap(), "idx 3 passed used_event 1");
    }

    fn element(m: &GuestMem, slot: u64) -> (u32, u32) {
        let at = USED + 4 + 8 * slot;
        (
            m.read_obj(GuestAddress(at)).unwrap(),
            m.read_obj(GuestAddress(at + 4)).unwrap(),
        )
    }

    #[test]
    fn elements_go_to_the_slot_of_the_used_index_modulo_the_size() {
        let (m, _) = setup(false);
        let mut r = UsedRing::new(GuestAddress(USED), GuestAddress(AVAIL), 4, false, 3);
        r.push(m.batch(), 2, 0x1234_5678).unwrap();
        r.push(m.batch(), 1, 7).unwrap();
        assert_eq!(element(m.map(), 3), (2, 0x1234_5678));
        assert_eq!(element(m.map(), 0), (1, 7), "slot 4 wraps to 0");
    }

    #[test]
    fn a_logged_map_marks_the_elements_page() {
        use vm_memory::bitmap::Bitmap;
        use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
        let m = Arc::new(crate::runtime::guest::memory_over(
            &[(GuestAddress(0), 0x10000)],
            true,
        ));
        let dirty = |gpa: u64| {
            let r = m.find_region(GuestAddress(gpa)).unwrap();
            r.bitmap()
                .dirty_at(usize::try_from(gpa - r.start_addr().0).unwrap())
        };
        let mut r = UsedRing::new(GuestAddress(USED), GuestAddress(AVAIL), 4, false, 0);
        let mapped = Mapped::new(Arc::clone(&m));
        assert!(!dirty(USED));
        r.push(mapped.batch(), 0, 9).unwrap();
        assert_eq!(element(&m, 0), (0, 9));
        assert!(
            dirty(USED),
            "the write went through vm-memory, which marks it"
        );
    }

    #[test]
    fn bad_head_is_refused() {
        let (m, mut r) = setup(false);
        assert!(matches!(
            r.push(m.batch(), 4, 0),
            Err(UsedError::BadHead { .. })
        ));
        assert_eq!(r.pending(), 0);
    }
}
