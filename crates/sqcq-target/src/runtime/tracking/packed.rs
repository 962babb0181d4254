//! The in-flight record of a packed virtqueue: the layout and protocol of
//! QEMU's `docs/interop/vhost-user.rst` ("Inflight I/O tracking", packed
//! virtqueue), one region per virtqueue, in vring order, each
//!
//! ```text
//! QueueRegionPacked { u64 features; u16 version; u16 desc_num;
//!                     u16 free_head; u16 old_free_head;
//!                     u16 used_idx; u16 old_used_idx;
//!                     u8 used_wrap_counter; u8 old_used_wrap_counter;
//!                     u8 padding[7]; DescStatePacked desc[desc_num]; }
//! DescStatePacked   { u8 inflight; u8 padding; u16 next; u16 last;
//!                     u16 num; u64 counter; u16 id; u16 flags;
//!                     u32 len; u64 addr; }
//! ```
//!
//! Why a packed ring needs more than a split ring's flags: the device
//! writes its used descriptors into the same ring, in order, while it
//! completes requests out of order, so the descriptors of a request still
//! in flight are soon overwritten by the used descriptors of later ones.
//! The record therefore keeps a copy of every ring descriptor of every
//! request in flight, in entries taken from a free list, and the device's
//! used position. A restarted daemon resubmits the copies, and continues
//! taking lists at the used position plus the ring descriptors those
//! copies occupy (every list taken and not used lies between the two, and
//! only those); the vring base a frontend gives after a crash cannot say
//! that (QEMU's is that of the connection's start). The ring between the
//! two may hold used descriptors the dead process marked and never
//! published; the ring clears them before this one publishes
//! (`runtime::packed::PackedRing::reposition`).
//!
//! The protocol, batched as the split record's is
//! (`runtime::tracking`):
//!
//! - taking a list ([`PackedRecord::taken`]): its descriptors are copied
//!   into free entries, the first of them gets the list's length, last
//!   entry and counter, then `inflight = 1`, then `free_head` and
//!   `old_free_head` move past the list, before the request goes to a
//!   backstore;
//! - publishing a batch of used descriptors ([`PackedRecord::publishing`],
//!   then [`PackedRecord::published`]): each completed list is linked
//!   back into the free list and `used_idx`/`used_wrap_counter` take the
//!   new used position, *before* the store that makes the batch visible
//!   (the first used descriptor's flags); after it, the lists' `inflight`
//!   are cleared and the `old_*` fields take the new values, which
//!   commits the batch. The four position fields share an aligned
//!   8-byte word, written with one store, so that no kill leaves an
//!   offset of one lap with the wrap counter of another.
//!
//! A process killed between any two stores leaves a record that
//! [`PackedRecord::recover`] understands: if `used_idx` differs from
//! `old_used_idx` a batch was being published, and the descriptor at
//! `old_used_idx` says whether its publication reached the ring (no
//! longer available on that lap: commit) or not (roll back: those lists
//! are still in flight and their completions are redone).
//!
//! Nothing in the area is trusted (the frontend can write it at any
//! time): while the queue runs, the record is only written, from state
//! kept in this process; when it is read back, at a queue's start, every
//! index is checked, walks are bounded, a list that is not a well-formed
//! chain of entries with a buffer ID below the queue size is dropped, and
//! the free list is rebuilt from what was kept.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU16, AtomicU32, AtomicU64, Ordering, fence};

use super::{ALIGN, InflightArea, VERSION};
use sqcq_protocol::packed::Position;

/// Bytes of the `QueueRegionPacked` header (29, padded to the entries'
/// 8-byte alignment).
const HEADER: usize = 32;
/// Bytes of one `DescStatePacked`.
const DESC_STATE: usize = 32;

const OFF_VERSION: usize = 8;
const OFF_DESC_NUM: usize = 10;
const OFF_FREE_HEAD: usize = 12;
const OFF_OLD_FREE_HEAD: usize = 14;
const OFF_USED_IDX: usize = 16;
const OFF_OLD_USED_IDX: usize = 18;
const OFF_USED_WRAP: usize = 20;
const OFF_OLD_USED_WRAP: usize = 21;
/// The aligned 8 bytes that hold both used positions (`used_idx`,
/// `old_used_idx`, `used_wrap_counter`, `old_used_wrap_counter` and two
/// bytes of padding), written with one store.
const OFF_POSITIONS: usize = OFF_USED_IDX;
const _: () = assert!(
    OFF_POSITIONS.is_multiple_of(8)
        && OFF_OLD_USED_IDX == OFF_POSITIONS + 2
        && OFF_USED_WRAP == OFF_POSITIONS + 4
        && OFF_OLD_USED_WRAP == OFF_POSITIONS + 5
);

const D_INFLIGHT: usize = 0;
const D_NEXT: usize = 2;
const D_LAST: usize = 4;
const D_NUM: usize = 6;
const D_COUNTER: usize = 8;
const D_ID: usize = 16;
const D_FLAGS: usize = 18;
const D_LEN: usize = 20;
const D_ADDR: usize = 24;

/// No entry (the end of the free list; a buffer ID not in flight).
const NONE: u16 = u16::MAX;

/// Bytes of one queue's packed region for queues of `queue_size`
/// entries (DPDK's size for the same layout).
pub fn region_size(queue_size: u16) -> usize {
    (HEADER + DESC_STATE * usize::from(queue_size)).div_ceil(ALIGN) * ALIGN
}

/// One ring descriptor, as taken and as recorded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawDesc {
    /// Buffer address (guest physical).
    pub addr: u64,
    /// Buffer length.
    pub len: u32,
    /// Buffer ID (meaningful in a list's last descriptor).
    pub id: u16,
    /// Flags as the driver wrote them.
    pub flags: u16,
}

impl RawDesc {
    /// The descriptor of its 16 little-endian bytes (a packed ring's
    /// layout: `addr`, `len`, `id`, `flags`).
    pub fn decode(raw: [u8; 16]) -> Self {
        let [
            a0,
            a1,
            a2,
            a3,
            a4,
            a5,
            a6,
            a7,
            l0,
            l1,
            l2,
            l3,
            i0,
            i1,
            f0,
            f1,
        ] = raw;
        RawDesc {
            addr: u64::from_le_bytes([a0, a1, a2, a3, a4, a5, a6, a7]),
            len: u32::from_le_bytes([l0, l1, l2, l3]),
            id: u16::from_le_bytes([i0, i1]),
            flags: u16::from_le_bytes([f0, f1]),
        }
    }
}

/// A list an earlier run had in flight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveredList {
    /// Its buffer ID.
    pub id: u16,
    /// Its ring descriptors, in ring order.
    pub descs: Vec<RawDesc>,
}

/// What [`PackedRecord::recover`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum PackedRecovery {
    /// A new record (version 0): nothing was in flight; the record is now
    /// initialised at the ring's positions.
    Fresh,
    /// A record of an earlier run of the queue.
    Resumed {
        /// Lists in flight, in the order they were taken: resubmit them.
        lists: Vec<RecoveredList>,
        /// Where to take the next list: the used position plus the ring
        /// descriptors of `lists`.
        avail: Position,
        /// Where the next used descriptor goes.
        used: Position,
        /// Records dropped as impossible.
        ignored: usize,
    },
}

/// One packed queue's record, written by the worker serving the queue.
pub struct PackedRecord {
    /// Keeps the area mapped.
    _area: Arc<InflightArea>,
    base: NonNull<u8>,
    ring_size: u16,
    /// Entries of the region (the area's queue size, at least the ring's).
    desc_num: u16,
    counter: u64,
    /// The head of the free list, as this process keeps it (the record's
    /// copy is written, never read back while the queue runs).
    free_head: u16,
    /// Next entry of each free entry, as this process keeps it.
    next: Box<[u16]>,
    /// For each buffer ID in flight, its list's first and last entries.
    lists: Box<[(u16, u16)]>,
    /// Buffer IDs of the lists completed since the last publication.
    batch: Vec<u16>,
    /// Whether each buffer ID is in `batch`.
    completing: Box<[bool]>,
    /// The used position [`Self::publishing`] recorded.
    used: Position,
    /// The used position [`Self::published`] committed.
    committed: Position,
}

// SAFETY: see `InflightArea`; the queue's region moves with the queue to
// its worker and is written only there.
unsafe impl Send for PackedRecord {}

impl std::fmt::Debug for PackedRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedRecord")
            .field("ring_size", &self.ring_size)
            .field("counter", &self.counter)
            .field("free_head", &self.free_head)
            .finish_non_exhaustive()
    }
}

impl PackedRecord {
    /// The record at `base` (a region of `area` for `area.queue_size`
    /// entries) of a packed ring of `ring_size` entries.
    pub(super) fn new(area: Arc<InflightArea>, base: NonNull<u8>, ring_size: u16) -> Self {
        let desc_num = area.queue_size;
        PackedRecord {
            _area: area,
            base,
            ring_size,
            desc_num,
            counter: 0,
            free_head: NONE,
            next: vec![NONE; usize::from(desc_num)].into_boxed_slice(),
            lists: vec![(NONE, NONE); usize::from(ring_size)].into_boxed_slice(),
            batch: Vec::with_capacity(usize::from(ring_size)),
            completing: vec![false; usize::from(ring_size)].into_boxed_slice(),
            used: Position::START,
            committed: Position::START,
        }
    }

    fn at(&self, off: usize) -> *mut u8 {
        self.base.as_ptr().wrapping_add(off)
    }

    fn u8_at(&self, off: usize) -> &AtomicU8 {
        // SAFETY: every offset used is within the queue's region (header
        // fields, or a field of an entry below `desc_num`); the area
        // outlives `self`.
        unsafe { AtomicU8::from_ptr(self.at(off)) }
    }

    fn u16_at(&self, off: usize) -> &AtomicU16 {
        // SAFETY: as in `u8_at`; 2-aligned (even offsets in a 64-aligned
        // region).
        unsafe { AtomicU16::from_ptr(self.at(off).cast()) }
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        // SAFETY: as in `u8_at`; 4-aligned (`len` at 20 of a 32-byte entry
        // after a 32-byte header).
        unsafe { AtomicU32::from_ptr(self.at(off).cast()) }
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        // SAFETY: as in `u8_at`; 8-aligned (`counter` at 8, `addr` at 24
        // of a 32-byte entry after a 32-byte header).
        unsafe { AtomicU64::from_ptr(self.at(off).cast()) }
    }

    fn entry(e: u16) -> usize {
        HEADER + DESC_STATE * usize::from(e)
    }

    fn load16(&self, off: usize) -> u16 {
        u16::from_le(self.u16_at(off).load(Ordering::Relaxed))
    }

    fn store16(&self, off: usize, v: u16) {
        self.u16_at(off).store(v.to_le(), Ordering::Relaxed);
    }

    fn read_desc(&self, e: u16) -> RawDesc {
        let d = Self::entry(e);
        let r = Ordering::Relaxed;
        RawDesc {
            addr: u64::from_le(self.u64_at(d + D_ADDR).load(r)),
            len: u32::from_le(self.u32_at(d + D_LEN).load(r)),
            id: self.load16(d + D_ID),
            flags: self.load16(d + D_FLAGS),
        }
    }

    fn write_desc(&self, e: u16, desc: &RawDesc) {
        let d = Self::entry(e);
        let r = Ordering::Relaxed;
        self.u64_at(d + D_ADDR).store(desc.addr.to_le(), r);
        self.u32_at(d + D_LEN).store(desc.len.to_le(), r);
        self.store16(d + D_ID, desc.id);
        self.store16(d + D_FLAGS, desc.flags);
    }

    fn position(&self, idx_off: usize, wrap_off: usize) -> Option<Position> {
        let off = self.load16(idx_off);
        (off < self.ring_size)
            .then(|| Position::new(off, self.u8_at(wrap_off).load(Ordering::Relaxed) != 0))
    }

    /// Stores the used position (`used`) and the committed one (`old`)
    /// with one 8-byte store. A position's offset and wrap counter are
    /// separate fields, and a process killed between two stores must
    /// never leave a position with one lap's offset and the other's wrap
    /// counter: when a batch crosses the end of the ring, `recover` would
    /// look at the descriptor the torn position names, a lap away from
    /// the batch, and could roll back to it.
    fn store_positions(&self, used: Position, old: Position) {
        let word = u64::from(used.off())
            | u64::from(old.off()) << 16
            | u64::from(used.wrap()) << 32
            | u64::from(old.wrap()) << 40;
        self.u64_at(OFF_POSITIONS)
            .store(word.to_le(), Ordering::Relaxed);
    }

    /// Writes the free list this process keeps (every entry not in a list
    /// in flight, `free` in order) and the used position, as committed.
    fn write_free_list(&mut self, free: &[u16], used: Position) {
        for (i, &e) in free.iter().enumerate() {
            let next = free.get(i + 1).copied().unwrap_or(NONE);
            self.next[usize::from(e)] = next;
            self.store16(Self::entry(e) + D_NEXT, next);
        }
        self.free_head = free.first().copied().unwrap_or(NONE);
        self.store16(OFF_FREE_HEAD, self.free_head);
        self.store16(OFF_OLD_FREE_HEAD, self.free_head);
        self.store_positions(used, used);
        self.used = used;
        self.committed = used;
    }

    /// Reads the record when the queue starts. `used` is the used position
    /// the frontend's vring base gives, for a new record; `available(p)`
    /// says whether the ring descriptor at `p` is still available on
    /// `p`'s lap (that is, whether the device has not written a used
    /// descriptor there).
    pub fn recover(
        &mut self,
        used: Position,
        mut available: impl FnMut(Position) -> bool,
    ) -> PackedRecovery {
        let r = Ordering::Relaxed;
        let all: Vec<u16> = (0..self.desc_num).collect();
        if self.load16(OFF_VERSION) != VERSION {
            self.u64_at(0).store(0, r);
            self.store16(OFF_DESC_NUM, self.desc_num);
            for e in 0..self.desc_num {
                self.u8_at(Self::entry(e) + D_INFLIGHT).store(0, r);
            }
            self.write_free_list(&all, used);
            // The record is whole before the version says it is valid.
            fence(Ordering::Release);
            self.store16(OFF_VERSION, VERSION);
            return PackedRecovery::Fresh;
        }
        // The used position, committed or rolled back.
        let current = self.position(OFF_USED_IDX, OFF_USED_WRAP);
        let old = self.position(OFF_OLD_USED_IDX, OFF_OLD_USED_WRAP);
        let (used, free_head) = match (current, old) {
            // A batch was being published: it reached the ring if the
            // descriptor at its first position is no longer available.
            (Some(c), Some(o)) if c != o && !available(o) => (c, self.load16(OFF_FREE_HEAD)),
            (_, Some(o)) => (o, self.load16(OFF_OLD_FREE_HEAD)),
            // No position inside the ring: nothing can be trusted.
            (_, None) => {
                for e in 0..self.desc_num {
                    self.u8_at(Self::entry(e) + D_INFLIGHT).store(0, r);
                }
                self.write_free_list(&all, used);
                return PackedRecovery::Resumed {
                    lists: Vec::new(),
                    avail: used,
                    used,
                    ignored: 1,
                };
            }
        };
        // Entries on the free list are not in flight, whatever they say.
        let n = usize::from(self.desc_num);
        let mut owned = vec![false; n];
        let mut e = free_head;
        for _ in 0..n {
            let Some(o) = owned.get_mut(usize::from(e)) else {
                break;
            };
            if *o {
                break;
            }
            *o = true;
            e = self.load16(Self::entry(e) + D_NEXT);
        }
        let free_listed = owned;
        let mut owned = vec![false; n];
        let mut found: Vec<(u64, u16, u16, Vec<u16>, RecoveredList)> = Vec::new();
        let mut ignored = 0;
        let mut ids = vec![false; usize::from(self.ring_size)];
        for head in 0..self.desc_num {
            let d = Self::entry(head);
            if self.u8_at(d + D_INFLIGHT).load(r) == 0 || free_listed[usize::from(head)] {
                continue;
            }
            match self.list_at(head, &mut owned) {
                Some((last, entries, list)) if !ids[usize::from(list.id)] => {
                    ids[usize::from(list.id)] = true;
                    let counter = u64::from_le(self.u64_at(d + D_COUNTER).load(r));
                    found.push((counter, head, last, entries, list));
                }
                _ => ignored += 1,
            }
        }
        found.sort_unstable_by_key(|&(counter, head, ..)| (counter, head));
        // At most a ring's worth of descriptors can be in flight.
        let mut room = u32::from(self.ring_size);
        found.retain(|(.., l)| {
            let n = u32::try_from(l.descs.len()).unwrap_or(u32::MAX);
            let fits = n <= room;
            room = room.saturating_sub(n);
            if !fits {
                ignored += 1;
            }
            fits
        });
        // Rebuild: the kept lists' entries are theirs, every other entry
        // is free and not in flight.
        let mut kept = vec![false; n];
        for (.., entries, _) in &found {
            for (i, &e) in entries.iter().enumerate() {
                kept[usize::from(e)] = true;
                // The list's own links, which its return to the free list
                // follows.
                self.next[usize::from(e)] = entries.get(i + 1).copied().unwrap_or(NONE);
            }
        }
        let free: Vec<u16> = all.into_iter().filter(|&e| !kept[usize::from(e)]).collect();
        for &e in &free {
            self.u8_at(Self::entry(e) + D_INFLIGHT).store(0, r);
        }
        self.write_free_list(&free, used);
        self.lists.fill((NONE, NONE));
        let mut taken = 0u16;
        for &(_, head, last, _, ref list) in &found {
            self.lists[usize::from(list.id)] = (head, last);
            taken += u16::try_from(list.descs.len()).unwrap_or(0);
        }
        self.counter = found.last().map_or(0, |&(c, ..)| c.wrapping_add(1));
        PackedRecovery::Resumed {
            avail: used.advance(taken, self.ring_size),
            used,
            lists: found.into_iter().map(|(.., l)| l).collect(),
            ignored,
        }
    }

    /// The list whose first entry is `head`: its last entry, its entries
    /// and its descriptors, if it is a chain of `num` (1..=ring size) entries not
    /// already `owned`, ending at its `last`, whose buffer ID is below the
    /// ring size. Marks its entries owned.
    fn list_at(&self, head: u16, owned: &mut [bool]) -> Option<(u16, Vec<u16>, RecoveredList)> {
        let d = Self::entry(head);
        let num = self.load16(d + D_NUM);
        if num == 0 || num > self.ring_size {
            return None;
        }
        let mut descs = Vec::with_capacity(usize::from(num));
        let mut entries = Vec::with_capacity(usize::from(num));
        let mut e = head;
        let whole = loop {
            // Each entry once: in no other list, and no loop in this one.
            if e >= self.desc_num || owned[usize::from(e)] {
                break false;
            }
            owned[usize::from(e)] = true;
            entries.push(e);
            descs.push(self.read_desc(e));
            if descs.len() == usize::from(num) {
                break true;
            }
            e = self.load16(Self::entry(e) + D_NEXT);
        };
        let id = descs.last().map_or(NONE, |d| d.id);
        if !whole || e != self.load16(d + D_LAST) || id >= self.ring_size {
            for &e in &entries {
                owned[usize::from(e)] = false;
            }
            return None;
        }
        Some((e, entries, RecoveredList { id, descs }))
    }

    /// Records the list of buffer `id` just taken, `descs` its ring
    /// descriptors in order, before its request goes anywhere. False (and
    /// nothing recorded) if `id` is in flight already (the driver made it
    /// available twice: the request in flight answers it) or the free
    /// entries do not hold the list (only a driver breaking the ring's
    /// rules can have more descriptors in flight than the ring holds).
    pub fn taken(&mut self, id: u16, descs: &[RawDesc]) -> bool {
        let Some(slot) = self.lists.get(usize::from(id)) else {
            return false;
        };
        if slot.0 != NONE || descs.is_empty() {
            return false;
        }
        let head = self.free_head;
        let mut e = head;
        let mut last = NONE;
        for d in descs {
            if e == NONE {
                // Nothing was committed: the entries written are still
                // free.
                return false;
            }
            self.write_desc(e, d);
            last = e;
            e = self.next[usize::from(e)];
        }
        let h = Self::entry(head);
        let r = Ordering::Relaxed;
        self.store16(h + D_NUM, u16::try_from(descs.len()).unwrap_or(0));
        self.store16(h + D_LAST, last);
        self.u64_at(h + D_COUNTER).store(self.counter.to_le(), r);
        self.counter = self.counter.wrapping_add(1);
        // The entries before the flag that makes them a list in flight.
        fence(Ordering::Release);
        self.u8_at(h + D_INFLIGHT).store(1, r);
        // In flight before the free list moves past it: a kill in between
        // leaves the list on the free list, which `recover` clears (and
        // the request had not been submitted).
        fence(Ordering::Release);
        self.free_head = e;
        self.store16(OFF_FREE_HEAD, e);
        self.store16(OFF_OLD_FREE_HEAD, e);
        self.lists[usize::from(id)] = (head, last);
        true
    }

    /// Buffer `id` completed; its used descriptor goes out with the next
    /// publication.
    pub fn completed(&mut self, id: u16) {
        let Some(&(head, _)) = self.lists.get(usize::from(id)) else {
            return;
        };
        let completing = &mut self.completing[usize::from(id)];
        if head != NONE && !*completing {
            *completing = true;
            self.batch.push(id);
        }
    }

    /// Before the batch's used descriptors become visible (`used`: the
    /// used position after them): links its lists back into the free
    /// list and records the new used position, uncommitted.
    pub fn publishing(&mut self, used: Position) {
        if self.batch.is_empty() {
            return;
        }
        for &id in &self.batch {
            let (head, last) = self.lists[usize::from(id)];
            self.next[usize::from(last)] = self.free_head;
            self.store16(Self::entry(last) + D_NEXT, self.free_head);
            self.free_head = head;
        }
        self.store16(OFF_FREE_HEAD, self.free_head);
        self.store_positions(used, self.committed);
        self.used = used;
        // All of it before the store that publishes the batch (the
        // caller's, `Release`).
        fence(Ordering::Release);
    }

    /// After the batch's used descriptors became visible: clears its
    /// lists' flags and commits.
    pub fn published(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        // The publishing store before any of these.
        fence(Ordering::Release);
        let r = Ordering::Relaxed;
        for i in 0..self.batch.len() {
            let id = self.batch[i];
            let (head, _) = self.lists[usize::from(id)];
            self.u8_at(Self::entry(head) + D_INFLIGHT).store(0, r);
            self.lists[usize::from(id)] = (NONE, NONE);
            self.completing[usize::from(id)] = false;
        }
        self.batch.clear();
        // Cleared before the commit: a kill in between leaves a batch
        // `recover` commits again (its lists are on the free list).
        fence(Ordering::Release);
        self.store16(OFF_OLD_FREE_HEAD, self.free_head);
        self.store_positions(self.used, self.used);
        self.committed = self.used;
    }

    /// Whether buffer `id` is recorded in flight.
    #[cfg(test)]
    pub fn is_in_flight(&self, id: u16) -> bool {
        self.lists.get(usize::from(id)).is_some_and(|l| l.0 != NONE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn area(num_queues: u16, queue_size: u16) -> Arc<InflightArea> {
        InflightArea::on_heap(num_queues, queue_size, true)
    }

    /// A list of `n` descriptors for buffer `id`, told apart by address.
    fn list(id: u16, n: u16) -> Vec<RawDesc> {
        (0..n)
            .map(|k| RawDesc {
                addr: 0x1000 * u64::from(id) + u64::from(k),
                len: 512 + u32::from(k),
                id,
                flags: if k + 1 < n { 1 } else { 0 },
            })
            .collect()
    }

    fn resumed(r: PackedRecovery) -> (Vec<RecoveredList>, Position, Position, usize) {
        match r {
            PackedRecovery::Resumed {
                lists,
                avail,
                used,
                ignored,
            } => (lists, avail, used, ignored),
            r => panic!("{r:?}"),
        }
    }

    const SIZE: u16 = 8;

    #[test]
    fn sizes_match_dpdk() {
        // ALIGN_UP(32 + 32 * queue_size, 64)
        assert_eq!(region_size(1), 64);
        assert_eq!(region_size(128), 4160);
        assert_eq!(region_size(256), 8256);
    }

    #[test]
    fn lists_in_flight_come_back_with_their_descriptors_in_order() {
        let a = area(2, SIZE);
        let mut q = a.packed_queue(1, SIZE).unwrap();
        assert_eq!(q.recover(Position::START, |_| true), PackedRecovery::Fresh);
        // Lists of 2, 1, 3 descriptors (IDs 5, 0, 3), then 1 (ID 2).
        for (id, n) in [(5, 2), (0, 1), (3, 3), (2, 1)] {
            assert!(q.taken(id, &list(id, n)));
        }
        assert!(
            !q.taken(0, &list(0, 1)),
            "an ID in flight is not taken twice"
        );
        // 0 and 2 complete; 2 used descriptors written.
        q.completed(0);
        q.completed(2);
        let used = Position::START.advance(2, SIZE);
        q.publishing(used);
        q.published();
        assert!(!q.is_in_flight(0) && q.is_in_flight(5));
        // The daemon dies; a new one starts.
        let mut q = a.packed_queue(1, SIZE).unwrap();
        let (lists, avail, at, ignored) = resumed(q.recover(Position::START, |_| true));
        assert_eq!(ignored, 0);
        assert_eq!(at, used);
        assert_eq!(
            lists,
            vec![
                RecoveredList {
                    id: 5,
                    descs: list(5, 2)
                },
                RecoveredList {
                    id: 3,
                    descs: list(3, 3)
                },
            ]
        );
        // Every list taken lies between the used and the next avail
        // position: 2 used + 5 in flight.
        assert_eq!(avail, Position::START.advance(7, SIZE));
        // The rebuilt free list holds the rest: 3 more descriptors fit, a
        // fourth does not (8 entries, 5 in flight).
        assert!(q.taken(1, &list(1, 3)));
        assert!(!q.taken(4, &list(4, 1)));
        // Lists recovered complete as any other.
        q.completed(5);
        q.completed(3);
        q.publishing(used.advance(5, SIZE));
        q.published();
        assert!(q.taken(4, &list(4, 4)));
        let mut q = a.packed_queue(1, SIZE).unwrap();
        let (lists, avail, at, _) = resumed(q.recover(Position::START, |_| true));
        let ids: Vec<u16> = lists.iter().map(|l| l.id).collect();
        assert_eq!(ids, vec![1, 4], "oldest first, across the restart");
        assert_eq!(at, used.advance(5, SIZE));
        assert_eq!(avail, at.advance(7, SIZE));
    }

    /// Four lists taken, two completed and linked for publication; the
    /// daemon dies before `published`. Whether their used descriptors
    /// reached the ring decides.
    fn killed_while_publishing() -> (Arc<InflightArea>, Position) {
        let a = area(1, SIZE);
        let mut q = a.packed_queue(0, SIZE).unwrap();
        q.recover(Position::START, |_| true);
        for id in 0..4 {
            q.taken(id, &list(id, 2));
        }
        q.completed(2);
        q.completed(0);
        let used = Position::START.advance(4, SIZE);
        q.publishing(used);
        (a, used)
    }

    #[test]
    fn a_batch_that_reached_the_ring_is_committed() {
        let (a, used) = killed_while_publishing();
        let mut q = a.packed_queue(0, SIZE).unwrap();
        // The descriptor at the old used position is no longer available.
        let (lists, avail, at, _) = resumed(q.recover(Position::START, |p| p != Position::START));
        assert_eq!(lists.iter().map(|l| l.id).collect::<Vec<_>>(), vec![1, 3]);
        assert_eq!(at, used);
        assert_eq!(avail, used.advance(4, SIZE));
    }

    #[test]
    fn a_batch_that_did_not_reach_the_ring_is_redone() {
        let (a, _) = killed_while_publishing();
        let mut q = a.packed_queue(0, SIZE).unwrap();
        let (lists, avail, at, _) = resumed(q.recover(Position::START, |_| true));
        assert_eq!(
            lists.iter().map(|l| l.id).collect::<Vec<_>>(),
            vec![0, 1, 2, 3]
        );
        assert_eq!(lists[2].descs, list(2, 2));
        assert_eq!(at, Position::START);
        // A whole ring in flight: 8 descriptors from offset 0 of the first
        // lap end at offset 0 of the next.
        assert_eq!(avail, Position::new(0, false));
    }

    #[test]
    fn a_list_recorded_halfway_is_not_in_flight() {
        let a = area(1, SIZE);
        let mut q = a.packed_queue(0, SIZE).unwrap();
        q.recover(Position::START, |_| true);
        q.taken(1, &list(1, 2));
        // A kill after the flag, before the free list moved: the list is
        // at `old_free_head`, on the free list.
        let head = q.free_head;
        q.taken(2, &list(2, 3));
        q.store16(OFF_FREE_HEAD, head);
        q.store16(OFF_OLD_FREE_HEAD, head);
        let mut q = a.packed_queue(0, SIZE).unwrap();
        let (lists, avail, _, ignored) = resumed(q.recover(Position::START, |_| true));
        assert_eq!(lists.iter().map(|l| l.id).collect::<Vec<_>>(), vec![1]);
        assert_eq!(ignored, 0);
        assert_eq!(avail, Position::START.advance(2, SIZE));
    }

    /// A small xorshift: reproducible, no dependency.
    fn rng(mut seed: u64) -> impl FnMut() -> u64 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        }
    }

    #[test]
    fn any_bytes_recover_into_lists_the_ring_can_hold() {
        for seed in 1..300u64 {
            let mut next = rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let a = area(1, SIZE);
            let len = InflightArea::size_for(1, SIZE, true);
            // SAFETY: the area's buffer, `len` bytes, written by nothing
            // else now.
            let bytes = unsafe { std::slice::from_raw_parts_mut(a.ptr.as_ptr(), len) };
            for b in bytes.iter_mut() {
                // Mostly small values, so that indices land in range.
                let v = next();
                *b = if v.is_multiple_of(3) {
                    v.to_le_bytes()[0]
                } else {
                    u8::try_from(v % 9).unwrap()
                };
            }
            bytes[OFF_VERSION..OFF_VERSION + 2].copy_from_slice(&VERSION.to_le_bytes());
            let mut q = a.packed_queue(0, SIZE).unwrap();
            let (lists, avail, used, _) =
                resumed(q.recover(Position::START, |_| next().is_multiple_of(2)));
            let mut ids = std::collections::HashSet::new();
            let mut total = 0u32;
            for l in &lists {
                assert!(l.id < SIZE && ids.insert(l.id), "seed {seed}: {lists:?}");
                assert!(!l.descs.is_empty());
                total += u32::try_from(l.descs.len()).unwrap();
            }
            assert!(total <= u32::from(SIZE), "seed {seed}: {total} descriptors");
            assert_eq!(used.ahead(avail, SIZE), total, "seed {seed}");
            // What is left is a working record: lists go in and come out.
            let free = u16::try_from(u32::from(SIZE) - total).unwrap();
            let id = (0..SIZE).find(|i| !ids.contains(i));
            if let (Some(id), true) = (id, free > 0) {
                assert!(q.taken(id, &list(id, free)), "seed {seed}");
                let mut again = a.packed_queue(0, SIZE).unwrap();
                let (lists2, ..) = resumed(again.recover(used, |_| true));
                assert_eq!(lists2.len(), lists.len() + 1, "seed {seed}");
            }
        }
    }
}
