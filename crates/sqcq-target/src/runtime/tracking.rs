//! In-flight tracking (VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD): the record of
//! which requests a queue has taken and not yet completed, kept in memory
//! the frontend holds on to, so that a restarted daemon can resubmit them.
//!
//! The layout is the one QEMU and libvhost-user use for split rings
//! (QEMU's `docs/interop/vhost-user.rst`, "Inflight I/O tracking"): one
//! region per virtqueue, in vring order, each
//!
//! ```text
//! QueueRegionSplit { u64 features; u16 version; u16 desc_num;
//!                    u16 last_batch_head; u16 used_idx;
//!                    DescStateSplit desc[desc_num]; }
//! DescStateSplit   { u8 inflight; u8 padding[5]; u16 next; u64 counter; }
//! ```
//!
//! and the protocol is theirs, batched (spec section 8.3.1, I1 to I3;
//! libvhost-user's recovery clears only the last head of a batch, which is
//! right only for batches of one): a head is recorded (`counter`,
//! then `inflight = 1`) before its request goes to a backstore; each
//! completed head is linked into the batch list (`next`,
//! `last_batch_head`) before the used index that covers it is published;
//! after the publish, the batch's heads are cleared and `used_idx` catches
//! up. A process killed between any two of these stores leaves a record
//! from which [`TrackedQueue::recover`] finds exactly the requests that
//! were taken and not completed: if `used_idx` lags the used ring's index,
//! the last batch was published and only its clearing was lost.
//!
//! Nothing reads the record while this process writes it: the next
//! reader is a later process (or the same one at the queue's next start).
//! The orderings below are therefore not for a concurrent peer but for a
//! process killed between two stores, which leaves exactly the stores made
//! before the kill: each `fence(Release)` keeps the stores after it from
//! becoming visible before the ones before it (compiler and CPU alike), so
//! that every prefix of the sequence is a state `recover` understands.
//!
//! No library implements the device side of this (rust-vmm's
//! `vhost-user-backend` has none), so it is ours. The record lives in
//! shared memory written with plain atomic stores: no lock, no system call
//! and no allocation per request. Nothing in it is trusted: the frontend
//! can write the area at any time, so heads out of range, loops in the
//! batch list and any counter values only lose what they describe.

mod packed;

pub use packed::{PackedRecord, PackedRecovery, RawDesc, RecoveredList};

use std::num::Wrapping;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU16, AtomicU64, Ordering, fence};

/// Bytes of one `DescStateSplit`.
const DESC_STATE: usize = 16;
/// Bytes of the `QueueRegionSplit` header.
const HEADER: usize = 16;
/// Alignment of each queue region (either layout).
const ALIGN: usize = 64;
/// The layout version this implements; 0 marks an area nobody used yet.
pub const VERSION: u16 = 1;

const OFF_VERSION: usize = 8;
const OFF_DESC_NUM: usize = 10;
const OFF_LAST_BATCH_HEAD: usize = 12;
const OFF_USED_IDX: usize = 14;
const DESC_OFF_NEXT: usize = 6;
const DESC_OFF_COUNTER: usize = 8;

/// Bytes of one queue's region for queues of `queue_size` entries:
/// libvhost-user's formula, so that areas are the same size whoever
/// creates them.
pub fn queue_region_size(queue_size: u16) -> usize {
    let raw = DESC_STATE * usize::from(queue_size) + std::mem::size_of::<u16>();
    raw.div_ceil(ALIGN) * ALIGN
}

/// The whole in-flight area of a connection: `num_queues` regions for
/// queues of up to `queue_size` entries.
pub struct InflightArea {
    ptr: NonNull<u8>,
    len: usize,
    num_queues: u16,
    queue_size: u16,
    _keep: Box<dyn Send + Sync>,
}

// SAFETY: the area is shared memory accessed only through atomics; each
// queue region is written by the one worker serving that queue.
unsafe impl Send for InflightArea {}
// SAFETY: as above.
unsafe impl Sync for InflightArea {}

impl std::fmt::Debug for InflightArea {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InflightArea")
            .field("len", &self.len)
            .field("num_queues", &self.num_queues)
            .field("queue_size", &self.queue_size)
            .finish_non_exhaustive()
    }
}

impl InflightArea {
    /// The area of `len` bytes at `ptr`, if it holds `num_queues` regions
    /// of `queue_size` entries.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes, aligned to
    /// 8, for as long as `keep` lives.
    pub unsafe fn new(
        ptr: NonNull<u8>,
        len: usize,
        num_queues: u16,
        queue_size: u16,
        keep: Box<dyn Send + Sync>,
    ) -> Result<Self, &'static str> {
        if num_queues == 0 || queue_size == 0 {
            return Err("no queues, or queues of size 0");
        }
        let need = queue_region_size(queue_size)
            .checked_mul(usize::from(num_queues))
            .ok_or("area size overflows")?;
        if len < need {
            return Err("area smaller than its queues need");
        }
        if ptr.as_ptr().align_offset(8) != 0 {
            return Err("area not aligned");
        }
        Ok(InflightArea {
            ptr,
            len,
            num_queues,
            queue_size,
            _keep: keep,
        })
    }

    /// The record of vring `index` for a ring of `ring_size` entries;
    /// `None` if the area has no region for it or its regions are too
    /// small for the ring.
    pub fn queue(self: &Arc<Self>, index: usize, ring_size: u16) -> Option<TrackedQueue> {
        if index >= usize::from(self.num_queues) || ring_size > self.queue_size {
            return None;
        }
        let offset = index * queue_region_size(self.queue_size);
        // Within the area: `offset` plus a region lies within `len`
        // (checked in `new`).
        let base = NonNull::new(self.ptr.as_ptr().wrapping_add(offset))?;
        Some(TrackedQueue {
            area: Arc::clone(self),
            base,
            ring_size,
            counter: 0,
        })
    }

    /// The record of packed vring `index` for a ring of `ring_size`
    /// entries (`tracking::packed`); `None` if the area has no region for
    /// it (an area sized for split rings only) or its regions are too
    /// small for the ring.
    pub fn packed_queue(self: &Arc<Self>, index: usize, ring_size: u16) -> Option<PackedRecord> {
        if index >= usize::from(self.num_queues) || ring_size > self.queue_size {
            return None;
        }
        let region = packed::region_size(self.queue_size);
        let offset = index * region;
        if offset + region > self.len {
            return None;
        }
        let base = NonNull::new(self.ptr.as_ptr().wrapping_add(offset))?;
        Some(PackedRecord::new(Arc::clone(self), base, ring_size))
    }

    /// Whether some queue region, of either layout, was used by an
    /// earlier run (a frontend handing back the area of a connection that
    /// ended).
    pub fn used_before(&self) -> bool {
        [
            queue_region_size(self.queue_size),
            packed::region_size(self.queue_size),
        ]
        .into_iter()
        .any(|region| {
            (0..usize::from(self.num_queues))
                .map(|q| q * region + OFF_VERSION)
                .take_while(|&at| at + 2 <= self.len)
                .any(|at| {
                    // SAFETY: within the area (`at + 2 <= len`), 2-aligned.
                    let version =
                        unsafe { AtomicU16::from_ptr(self.ptr.as_ptr().wrapping_add(at).cast()) };
                    u16::from_le(version.load(Ordering::Relaxed)) == VERSION
                })
        })
    }

    /// Bytes an area needs for `num_queues` queues of up to `queue_size`
    /// entries, `packed` or split.
    pub fn size_for(num_queues: u16, queue_size: u16, packed: bool) -> usize {
        let region = if packed {
            packed::region_size(queue_size)
        } else {
            queue_region_size(queue_size)
        };
        region * usize::from(num_queues)
    }

    /// An area for `num_queues` queues of `queue_size` entries, `packed`
    /// or split, in a zeroed heap buffer (the daemon maps a memfd).
    #[cfg(test)]
    pub(crate) fn on_heap(num_queues: u16, queue_size: u16, packed: bool) -> Arc<Self> {
        let len = Self::size_for(num_queues, queue_size, packed);
        let mut buf: Box<[u64]> = vec![0u64; len.div_ceil(8)].into_boxed_slice();
        let ptr = NonNull::new(buf.as_mut_ptr().cast::<u8>()).expect("a live allocation");
        // SAFETY: the buffer, 8-aligned and at least `len` bytes, moves
        // into the area as its keeper (a boxed slice's heap block does not
        // move with the box).
        Arc::new(
            unsafe { Self::new(ptr, len, num_queues, queue_size, Box::new(buf)) }
                .expect("an area of the size its queues need"),
        )
    }

    /// Forgets every record (the device was reset: nothing it had taken
    /// is to be resubmitted).
    pub fn clear(&self) {
        let need = Self::size_for(self.num_queues, self.queue_size, true).min(self.len);
        // SAFETY: within the area (checked in `new`); the queues are
        // stopped, so no worker writes it now.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr(), 0, need) };
    }
}

/// One queue's in-flight record, in its ring's layout.
#[derive(Debug)]
pub enum QueueRecord {
    /// A split ring's.
    Split(TrackedQueue),
    /// A packed ring's.
    Packed(PackedRecord),
}

impl InflightArea {
    /// The record of vring `index` for a ring of `ring_size` entries, in
    /// the layout of a `packed` or split ring; `None` if the area has no
    /// region for it.
    pub fn record(
        self: &Arc<Self>,
        index: usize,
        ring_size: u16,
        packed: bool,
    ) -> Option<QueueRecord> {
        if packed {
            self.packed_queue(index, ring_size).map(QueueRecord::Packed)
        } else {
            self.queue(index, ring_size).map(QueueRecord::Split)
        }
    }
}

/// What [`TrackedQueue::recover`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Recovery {
    /// A new record (version 0): nothing was in flight; the record is now
    /// initialised.
    Fresh,
    /// A record of an earlier run of the queue.
    Resumed {
        /// Heads in flight, in the order they were taken: resubmit them.
        heads: Vec<u16>,
        /// Where the available ring is to be continued: the used index
        /// plus the requests in flight.
        next_avail: u16,
        /// Records ignored as impossible (heads beyond the ring).
        ignored: usize,
    },
}

/// One queue's record, written by the worker serving the queue.
pub struct TrackedQueue {
    area: Arc<InflightArea>,
    base: NonNull<u8>,
    ring_size: u16,
    counter: u64,
}

// SAFETY: see `InflightArea`; the queue's region moves with the queue to
// its worker and is written only there.
unsafe impl Send for TrackedQueue {}

impl std::fmt::Debug for TrackedQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrackedQueue")
            .field("ring_size", &self.ring_size)
            .field("counter", &self.counter)
            .finish_non_exhaustive()
    }
}

impl TrackedQueue {
    /// The address `off` bytes into the queue's region.
    fn at(&self, off: usize) -> *mut u8 {
        self.base.as_ptr().wrapping_add(off)
    }

    fn u16_at(&self, off: usize) -> &AtomicU16 {
        // SAFETY: every offset used is within the queue's region (header
        // fields, or a descriptor state below `queue_size`), 2-aligned
        // since the region is 64-aligned; the area outlives `self`.
        unsafe { AtomicU16::from_ptr(self.at(off).cast()) }
    }

    fn desc(&self, head: u16) -> usize {
        HEADER + DESC_STATE * usize::from(head)
    }

    fn inflight(&self, head: u16) -> &AtomicU8 {
        // SAFETY: as in `u16_at`; callers keep `head` below the ring size,
        // which is at most `queue_size`.
        unsafe { AtomicU8::from_ptr(self.at(self.desc(head))) }
    }

    fn next(&self, head: u16) -> &AtomicU16 {
        self.u16_at(self.desc(head) + DESC_OFF_NEXT)
    }

    fn counter_of(&self, head: u16) -> &AtomicU64 {
        // SAFETY: as in `inflight`; 8-aligned (16-byte states after a
        // 16-byte header in a 64-aligned region).
        unsafe { AtomicU64::from_ptr(self.at(self.desc(head) + DESC_OFF_COUNTER).cast()) }
    }

    /// Reads the record when the queue starts, with the used ring's index
    /// `used_idx` as the device finds it. Completes the clearing of a
    /// batch that was published but not cleared, and returns the heads
    /// still in flight, oldest first.
    pub fn recover(&mut self, used_idx: u16) -> Recovery {
        let r = Ordering::Relaxed;
        let desc_num = self.area.queue_size;
        if u16::from_le(self.u16_at(OFF_VERSION).load(r)) != VERSION {
            self.u16_at(OFF_DESC_NUM).store(desc_num.to_le(), r);
            self.u16_at(OFF_USED_IDX).store(used_idx.to_le(), r);
            self.u16_at(OFF_LAST_BATCH_HEAD).store(0, r);
            // The header is whole before the version says it is valid.
            fence(Ordering::Release);
            self.u16_at(OFF_VERSION).store(VERSION.to_le(), r);
            return Recovery::Fresh;
        }
        let recorded = u16::from_le(self.u16_at(OFF_USED_IDX).load(r));
        if recorded != used_idx {
            // The last batch reached the used ring; its records were not
            // all cleared. Walk its list (bounded: a loop or a head out of
            // range ends it).
            let mut left = (Wrapping(used_idx) - Wrapping(recorded)).0.min(desc_num);
            let mut head = u16::from_le(self.u16_at(OFF_LAST_BATCH_HEAD).load(r));
            while left > 0 && head < desc_num {
                self.inflight(head).store(0, r);
                head = u16::from_le(self.next(head).load(r));
                left -= 1;
            }
            // The batch is cleared before `used_idx` says it was.
            fence(Ordering::Release);
            self.u16_at(OFF_USED_IDX).store(used_idx.to_le(), r);
        }
        let mut found: Vec<(u64, u16)> = Vec::new();
        let mut ignored = 0;
        for head in 0..desc_num {
            if self.inflight(head).load(r) == 0 {
                continue;
            }
            if head >= self.ring_size {
                self.inflight(head).store(0, r);
                ignored += 1;
                continue;
            }
            found.push((u64::from_le(self.counter_of(head).load(r)), head));
        }
        found.sort_unstable();
        self.counter = found.last().map_or(0, |&(c, _)| c.wrapping_add(1));
        let in_flight = u16::try_from(found.len()).unwrap_or(u16::MAX);
        Recovery::Resumed {
            heads: found.into_iter().map(|(_, h)| h).collect(),
            next_avail: (Wrapping(used_idx) + Wrapping(in_flight)).0,
            ignored,
        }
    }

    /// Records `head` as taken, before its request goes anywhere; false
    /// (and nothing changed) if it is recorded in flight already: the
    /// driver made a head available twice, and the request in flight
    /// answers it.
    pub fn taken(&mut self, head: u16) -> bool {
        if head >= self.ring_size || self.inflight(head).load(Ordering::Relaxed) != 0 {
            return false;
        }
        self.counter_of(head)
            .store(self.counter.to_le(), Ordering::Relaxed);
        self.counter = self.counter.wrapping_add(1);
        // Release: the counter is in memory before the record says "in
        // flight" (a crash in between leaves no record, and the request
        // was not submitted yet).
        self.inflight(head).store(1, Ordering::Release);
        true
    }

    /// Links a completed `head` into the batch list, before the used index
    /// that covers it is published.
    pub fn completed(&mut self, head: u16) {
        if head >= self.ring_size {
            return;
        }
        let r = Ordering::Relaxed;
        let last = self.u16_at(OFF_LAST_BATCH_HEAD).load(r);
        self.next(head).store(last, r);
        self.u16_at(OFF_LAST_BATCH_HEAD).store(head.to_le(), r);
    }

    /// The used index `used_idx`, covering the last `count` heads linked
    /// by [`Self::completed`], was published: clears their records.
    pub fn published(&mut self, count: u16, used_idx: u16) {
        // The used index store came first (the caller's Release store):
        // no later store may be seen before it.
        fence(Ordering::Release);
        let r = Ordering::Relaxed;
        let mut head = u16::from_le(self.u16_at(OFF_LAST_BATCH_HEAD).load(r));
        let mut left = count.min(self.ring_size);
        while left > 0 && head < self.ring_size {
            self.inflight(head).store(0, r);
            head = u16::from_le(self.next(head).load(r));
            left -= 1;
        }
        // I3: the batch is cleared before `used_idx` says it was; a kill
        // in between leaves `used_idx` behind the used ring, and
        // `recover` finishes the clearing.
        fence(Ordering::Release);
        self.u16_at(OFF_USED_IDX).store(used_idx.to_le(), r);
    }

    /// Whether `head` is recorded in flight.
    #[cfg(test)]
    pub fn is_in_flight(&self, head: u16) -> bool {
        head < self.ring_size && self.inflight(head).load(Ordering::Relaxed) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn area(num_queues: u16, queue_size: u16) -> Arc<InflightArea> {
        InflightArea::on_heap(num_queues, queue_size, false)
    }

    #[test]
    fn sizes_match_libvhost_user() {
        // ALIGN_UP(16 * queue_size + 2, 64)
        assert_eq!(queue_region_size(128), 2112);
        assert_eq!(queue_region_size(256), 4160);
        assert_eq!(queue_region_size(1), 64);
    }

    #[test]
    fn a_fresh_record_is_initialised_and_has_nothing_to_resubmit() {
        let a = area(2, 8);
        let mut q = a.queue(1, 8).unwrap();
        assert_eq!(q.recover(5), Recovery::Fresh);
        let mut again = a.queue(1, 8).unwrap();
        assert_eq!(
            again.recover(5),
            Recovery::Resumed {
                heads: vec![],
                next_avail: 5,
                ignored: 0
            }
        );
        assert!(a.queue(2, 8).is_none(), "no region for vring 2");
        assert!(a.queue(0, 16).is_none(), "ring larger than the regions");
    }

    #[test]
    fn requests_taken_and_not_completed_come_back_in_order() {
        let a = area(1, 8);
        let mut q = a.queue(0, 8).unwrap();
        q.recover(0);
        for head in [3, 1, 6, 2] {
            assert!(q.taken(head));
        }
        assert!(!q.taken(1), "a duplicate head is not recorded twice");
        // Head 1 and 2 complete and are published.
        q.completed(1);
        q.completed(2);
        q.published(2, 2);
        // The daemon dies; a new one starts.
        let mut q = a.queue(0, 8).unwrap();
        assert_eq!(
            q.recover(2),
            Recovery::Resumed {
                heads: vec![3, 6],
                next_avail: 4,
                ignored: 0
            }
        );
        // The counter continues after the oldest records.
        assert!(q.taken(5));
        let mut q = a.queue(0, 8).unwrap();
        match q.recover(2) {
            Recovery::Resumed { heads, .. } => assert_eq!(heads, vec![3, 6, 5]),
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn a_crash_between_the_used_index_and_the_clearing_loses_nothing() {
        // Four heads taken; heads 2 and 0 complete and are linked into
        // the batch list, and the daemon dies before `published`.
        let killed = || {
            let a = area(1, 8);
            let mut q = a.queue(0, 8).unwrap();
            q.recover(0);
            for head in 0..4 {
                q.taken(head);
            }
            q.completed(2);
            q.completed(0);
            a
        };
        // The used index (2) was published.
        let a = killed();
        let mut q = a.queue(0, 8).unwrap();
        assert_eq!(
            q.recover(2),
            Recovery::Resumed {
                heads: vec![1, 3],
                next_avail: 4,
                ignored: 0
            }
        );
        // Dying before the used index was published instead: all four
        // are still in flight (the two completions are redone).
        let a = killed();
        let mut q = a.queue(0, 8).unwrap();
        match q.recover(0) {
            Recovery::Resumed {
                heads, next_avail, ..
            } => {
                assert_eq!(heads, vec![0, 1, 2, 3]);
                assert_eq!(next_avail, 4);
            }
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn a_hostile_record_cannot_loop_or_reach_outside() {
        let a = area(1, 8);
        let mut q = a.queue(0, 4).unwrap();
        q.recover(0);
        // A batch list that loops (0 -> 1 -> 0), heads beyond the ring,
        // a used index far ahead.
        q.next(0).store(1, Ordering::Relaxed);
        q.next(1).store(0, Ordering::Relaxed);
        q.u16_at(OFF_LAST_BATCH_HEAD).store(0, Ordering::Relaxed);
        q.inflight(6).store(1, Ordering::Relaxed);
        q.inflight(3).store(1, Ordering::Relaxed);
        match q.recover(60_000) {
            Recovery::Resumed { heads, ignored, .. } => {
                assert_eq!(heads, vec![3]);
                assert_eq!(ignored, 1);
            }
            r => panic!("{r:?}"),
        }
        assert!(!q.taken(7), "beyond the ring");
    }

    #[test]
    fn clear_forgets_everything() {
        let a = area(1, 8);
        let mut q = a.queue(0, 8).unwrap();
        q.recover(0);
        q.taken(4);
        a.clear();
        let mut q = a.queue(0, 8).unwrap();
        assert_eq!(q.recover(0), Recovery::Fresh);
        assert!(!q.is_in_flight(4));
    }
}
