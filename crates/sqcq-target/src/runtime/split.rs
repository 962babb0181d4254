//! The device side of a split virtqueue (virtio 1.2, 2.7): the one
//! implementation that request queues, the SCSI control and event queues
//! and ring polling share.
//!
//! [`RingLayout`] is where the three areas are and what the two sides
//! agreed on (size, EVENT_IDX): reading the avail index, and asking for
//! kicks or not (`used->flags`, or `avail_event` with EVENT_IDX). It is
//! `Copy`, so the ring watch of a polled queue works on the same ring
//! without sharing state with the request path. [`SplitRing`] adds the
//! device's position on the available side and the used ring
//! ([`UsedRing`]: elements written as requests complete, the index
//! published once per batch).
//!
//! Every access goes through the pass's [`Batch`]. virtio-queue, which
//! rust-vmm devices use, is the test oracle: the tests below drive it and
//! this ring over the same memory and compare what each writes and
//! decides, and `chain.rs` does the same for descriptor chains. It is not
//! used at run time because its `Queue` reads guest memory through
//! vm-memory on every access, publishes the used index on every element,
//! and cannot start a chain at a head index read ahead of time.

use std::sync::atomic::{Ordering, fence};

use sqcq_protocol::{
    DoorbellLocation, LayoutError, PackedAddrs, RingAddrs, doorbell_location,
    packed_doorbell_location,
};
use thiserror::Error;
use vm_memory::{GuestAddress, GuestMemoryError};

use crate::runtime::batch::Batch;
use crate::runtime::chain::HeadWalk;
use crate::runtime::used::{UsedError, UsedRing};

/// Ring addresses and state handed over by the control thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingConfig {
    /// Queue size.
    pub size: u16,
    /// Descriptor table (guest physical).
    pub desc: u64,
    /// Available ring (guest physical).
    pub avail: u64,
    /// Used ring (guest physical).
    pub used: u64,
    /// Next available index to process; of a packed ring, the position
    /// of the next descriptor to read (`packed::Position::encode`).
    pub next_avail: u16,
    /// VIRTIO_RING_F_EVENT_IDX negotiated.
    pub event_idx: bool,
    /// VIRTIO_F_RING_PACKED negotiated: `desc` is the descriptor ring,
    /// `avail` the driver area and `used` the device area.
    pub packed: bool,
    /// Of a packed ring, the position of the next used descriptor to
    /// write (encoded); a split ring keeps its used index in the ring.
    pub next_used: u16,
}

impl RingConfig {
    /// The vring base (VHOST_USER_SET_VRING_BASE): the next avail index,
    /// or a packed ring's two positions (`packed::encode_base`).
    pub fn base(&self) -> u32 {
        let used = if self.packed {
            u32::from(self.next_used) << 16
        } else {
            0
        };
        u32::from(self.next_avail) | used
    }

    /// Where the ring's doorbells are (VIRTIO_F_SQCQ_POLL): after the used
    /// ring of a split ring, after the Device Area of a packed one (spec
    /// sections 3.2 and 10.1).
    pub fn doorbell_location(&self) -> Result<DoorbellLocation, LayoutError> {
        if self.packed {
            let areas = PackedAddrs {
                desc: self.desc,
                driver: self.avail,
                device: self.used,
            };
            return packed_doorbell_location(areas, self.size);
        }
        let rings = RingAddrs {
            desc: self.desc,
            avail: self.avail,
            used: self.used,
        };
        doorbell_location(rings, self.size)
    }
}

/// VRING_USED_F_NO_NOTIFY.
const USED_F_NO_NOTIFY: u16 = 1;
/// The largest queue size of a split ring.
const MAX_SIZE: u16 = 32768;

/// What is wrong with a ring.
#[derive(Debug, Error)]
pub enum RingError {
    /// The queue size is not a power of two from 1 to 32768.
    #[error("invalid queue size {0}")]
    Size(u16),
    /// An area is not aligned as the specification requires (descriptor
    /// table 16, avail ring 2, used ring 4).
    #[error("{area} at {addr:#x} is not {align}-byte aligned")]
    Misaligned {
        /// Which area.
        area: &'static str,
        /// Its guest address.
        addr: u64,
        /// The alignment required.
        align: u64,
    },
    /// An area is not inside guest memory.
    #[error("{area} at {addr:#x} ({len} bytes) is outside guest memory")]
    Outside {
        /// Which area.
        area: &'static str,
        /// Its guest address.
        addr: u64,
        /// Its length.
        len: u64,
    },
    /// The avail index is more than a ring ahead of the device.
    #[error("avail index {idx} is more than {size} ahead of {next}")]
    AvailIndex {
        /// The index the driver published.
        idx: u16,
        /// The device's next avail index.
        next: u16,
        /// The queue size.
        size: u16,
    },
    /// A packed ring's descriptor list runs on for a whole ring: every
    /// descriptor from `at` on says NEXT, so no list ends and nothing
    /// tells where the next one starts.
    #[error("descriptor list at {at} does not end within {size} descriptors")]
    Unterminated {
        /// Offset of the list's first descriptor.
        at: u16,
        /// The queue size.
        size: u16,
    },
    /// A packed ring's list names a buffer ID that is not below the
    /// queue size.
    #[error("buffer id {id} out of range for queue size {size}")]
    BufferId {
        /// The ID.
        id: u16,
        /// The queue size.
        size: u16,
    },
    /// A packed ring's vring base names a position outside the ring.
    #[error("vring base {base:#x} names a position outside a ring of {size}")]
    Base {
        /// The base.
        base: u32,
        /// The queue size.
        size: u16,
    },
    /// Guest memory refused an access to the ring.
    #[error("ring access failed")]
    Memory(#[source] GuestMemoryError),
    /// The used ring could not be written.
    #[error(transparent)]
    Used(#[from] UsedError),
}

/// Checks each area of a ring, `(name, address, alignment, length)`:
/// aligned as the specification requires, and inside guest memory.
pub(crate) fn check_areas(
    areas: &[(&'static str, u64, u64, u64)],
    mem: Batch<'_>,
) -> Result<(), RingError> {
    for &(area, addr, align, len) in areas {
        if addr % align != 0 {
            return Err(RingError::Misaligned { area, addr, align });
        }
        let in_memory = usize::try_from(len).is_ok_and(|l| mem.check_range(addr, l));
        if !in_memory {
            return Err(RingError::Outside { area, addr, len });
        }
    }
    Ok(())
}

/// Where a split ring is and what the two sides agreed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingLayout {
    desc: u64,
    avail: u64,
    used: u64,
    size: u16,
    event_idx: bool,
}

impl RingLayout {
    /// The layout of `ring`, checked against the specification's size and
    /// alignment rules and against guest memory.
    pub fn new(ring: &RingConfig, mem: Batch<'_>) -> Result<Self, RingError> {
        let size = ring.size;
        if size == 0 || size > MAX_SIZE || !size.is_power_of_two() {
            return Err(RingError::Size(size));
        }
        let n = u64::from(size);
        // Each area: (name, address, alignment, length).
        let areas = [
            ("descriptor table", ring.desc, 16, 16 * n),
            // flags, idx, ring[size], used_event
            ("avail ring", ring.avail, 2, 6 + 2 * n),
            // flags, idx, ring[size], avail_event
            ("used ring", ring.used, 4, 6 + 8 * n),
        ];
        check_areas(&areas, mem)?;
        Ok(RingLayout {
            desc: ring.desc,
            avail: ring.avail,
            used: ring.used,
            size,
            event_idx: ring.event_idx,
        })
    }

    /// Reads `avail->idx` with `order` (Acquire to use the entries it
    /// announces: pairs with the driver's Release store).
    #[inline]
    pub fn avail_idx(&self, mem: Batch<'_>, order: Ordering) -> Result<u16, RingError> {
        mem.load_u16(self.avail + 2, order)
            .map_err(RingError::Memory)
    }

    /// Reads `used->idx`.
    pub fn used_idx(&self, mem: Batch<'_>, order: Ordering) -> Result<u16, RingError> {
        mem.load_u16(self.used + 2, order)
            .map_err(RingError::Memory)
    }

    /// Asks the driver to kick for what it makes available after
    /// `next_avail` (`enable`) or not: with EVENT_IDX, `avail_event =
    /// next_avail` to enable and nothing to disable (an `avail_event` left
    /// behind asks for one kick at most, which a device that looks at its
    /// ring anyway ignores), else VRING_USED_F_NO_NOTIFY cleared or set.
    fn set_notification(
        &self,
        mem: Batch<'_>,
        enable: bool,
        next_avail: u16,
    ) -> Result<(), RingError> {
        let (at, value) = match (self.event_idx, enable) {
            (true, true) => (self.used + 4 + 8 * u64::from(self.size), next_avail),
            (true, false) => return Ok(()),
            (false, _) => (self.used, if enable { 0 } else { USED_F_NO_NOTIFY }),
        };
        // Relaxed: ordered against the re-read of the avail index by the
        // fence in `enable_notification`.
        mem.store_u16(at, value, Ordering::Relaxed)
            .map_err(RingError::Memory)
    }

    /// Asks the driver to kick again, then says whether it made requests
    /// available after `next_avail` meanwhile (they will not be kicked).
    ///
    /// The store, `fence(SeqCst)`, then the re-read of `avail->idx` pair
    /// with the full barrier the driver executes between publishing
    /// `avail->idx` and reading `used->flags` or `avail_event`
    /// (virtio_ring's `virtqueue_kick_prepare`): one of the two sides
    /// sees the other's store.
    pub fn enable_notification(&self, mem: Batch<'_>, next_avail: u16) -> Result<bool, RingError> {
        self.set_notification(mem, true, next_avail)?;
        fence(Ordering::SeqCst);
        Ok(self.avail_idx(mem, Ordering::Relaxed)? != next_avail)
    }

    /// Asks the driver not to kick (a queue that looks at its ring
    /// anyway: being served, or polled).
    pub fn disable_notification(&self, mem: Batch<'_>, next_avail: u16) -> Result<(), RingError> {
        self.set_notification(mem, false, next_avail)
    }
}

/// Avail entries read ahead of the chains they name (see
/// [`SplitRing::read_heads`]): a whole batch of a depth-32 queue.
pub const HEADS_AHEAD: usize = 32;

/// The device side of one split ring: its layout, the next avail entry to
/// take, and the used ring.
#[derive(Debug)]
pub struct SplitRing {
    layout: RingLayout,
    next_avail: u16,
    used: UsedRing,
}

impl SplitRing {
    /// The ring of `ring`, checked ([`RingLayout::new`]), taking from
    /// `ring.next_avail` on. The used side continues after whatever the
    /// device published last (0 for a new driver): SET_VRING_BASE only
    /// restores the available side.
    pub fn open(ring: &RingConfig, mem: Batch<'_>) -> Result<Self, RingError> {
        let layout = RingLayout::new(ring, mem)?;
        // Where the used ring stands when the queue (re)starts: written
        // last by this device (a previous worker's Release publish) or
        // zeroed by the driver before it enabled the queue; Acquire pairs
        // with either.
        let next_used = layout.used_idx(mem, Ordering::Acquire)?;
        Ok(SplitRing {
            layout,
            next_avail: ring.next_avail,
            used: UsedRing::new(
                GuestAddress(ring.used),
                GuestAddress(ring.avail),
                ring.size,
                ring.event_idx,
                next_used,
            ),
        })
    }

    /// Where the ring is.
    pub fn layout(&self) -> &RingLayout {
        &self.layout
    }

    /// The queue size.
    pub fn size(&self) -> u16 {
        self.layout.size
    }

    /// The next avail entry to take.
    pub fn next_avail(&self) -> u16 {
        self.next_avail
    }

    /// Continues taking at `next` (an in-flight record's position).
    pub fn set_next_avail(&mut self, next: u16) {
        self.next_avail = next;
    }

    /// Reads `avail->idx` with `order`.
    #[inline]
    pub fn avail_idx(&self, mem: Batch<'_>, order: Ordering) -> Result<u16, RingError> {
        self.layout.avail_idx(mem, order)
    }

    /// Checks that the driver's `avail` is at most a ring ahead of the
    /// device.
    pub fn check_avail(&self, avail: u16) -> Result<(), RingError> {
        if avail.wrapping_sub(self.next_avail) > self.layout.size {
            return Err(RingError::AvailIndex {
                idx: avail,
                next: self.next_avail,
                size: self.layout.size,
            });
        }
        Ok(())
    }

    /// Host address of the avail ring's `size` entries, when they lie in
    /// one region: each entry is then a read at a fixed offset
    /// ([`Self::read_heads`]).
    #[inline]
    pub fn entries(&self, mem: Batch<'_>) -> Option<*mut u8> {
        mem.host(self.layout.avail + 4, 2 * usize::from(self.layout.size))
    }

    /// Reads the heads of the avail entries `next_avail..` into `out`
    /// (modulo the ring's size, a power of two), from `entries`
    /// ([`Self::entries`]) or, without it, through `mem`; returns how many
    /// it read, stopping at the first it cannot. Takes nothing: the caller
    /// moves on with [`Self::set_next_avail`] as it takes each.
    #[inline]
    pub fn read_heads(&self, mem: Batch<'_>, entries: Option<*mut u8>, out: &mut [u16]) -> usize {
        let mask = self.layout.size.wrapping_sub(1);
        for (i, head) in (0u16..).zip(out.iter_mut()) {
            let slot = self.next_avail.wrapping_add(i) & mask;
            let bytes = match entries {
                // SAFETY: `entries` is the host address of the ring's
                // `size` two-byte entries inside one mapped region of the
                // batch's map, which the caller borrows, and `slot <
                // size`. Any bytes are a valid `[u8; 2]`; the guest may
                // write them concurrently, so they are copied once and
                // used from the copy.
                Some(p) => unsafe {
                    p.wrapping_add(2 * usize::from(slot))
                        .cast::<[u8; 2]>()
                        .read_unaligned()
                },
                None => match mem.read_bytes::<2>(self.layout.avail + 4 + 2 * u64::from(slot)) {
                    Ok(b) => b,
                    Err(_) => return usize::from(i),
                },
            };
            *head = u16::from_le_bytes(bytes);
        }
        out.len()
    }

    /// The chain at `head` of the descriptor table.
    #[inline]
    pub fn chain<'a>(&self, mem: Batch<'a>, head: u16) -> HeadWalk<'a> {
        HeadWalk::new(mem, GuestAddress(self.layout.desc), self.layout.size, head)
    }

    /// Takes the next available chain, if any (one at a time: for queues
    /// with little traffic; request queues read heads ahead).
    pub fn pop<'a>(&mut self, mem: Batch<'a>) -> Result<Option<HeadWalk<'a>>, RingError> {
        let avail = self.avail_idx(mem, Ordering::Acquire)?;
        self.check_avail(avail)?;
        if avail == self.next_avail {
            return Ok(None);
        }
        let mut head = [0u16];
        if self.read_heads(mem, None, &mut head) == 0 {
            return Err(RingError::Outside {
                area: "avail ring",
                addr: self.layout.avail,
                len: 6 + 2 * u64::from(self.layout.size),
            });
        }
        self.next_avail = self.next_avail.wrapping_add(1);
        Ok(Some(self.chain(mem, head[0])))
    }

    /// Whether chains are available now.
    pub fn has_available(&self, mem: Batch<'_>) -> Result<bool, RingError> {
        Ok(self.avail_idx(mem, Ordering::Acquire)? != self.next_avail)
    }

    /// See [`RingLayout::enable_notification`], from the next avail entry.
    pub fn enable_notification(&self, mem: Batch<'_>) -> Result<bool, RingError> {
        self.layout.enable_notification(mem, self.next_avail)
    }

    /// See [`RingLayout::disable_notification`].
    pub fn disable_notification(&self, mem: Batch<'_>) -> Result<(), RingError> {
        self.layout.disable_notification(mem, self.next_avail)
    }

    /// The used side.
    pub fn used(&mut self) -> &mut UsedRing {
        &mut self.used
    }

    /// The next used index.
    pub fn next_used(&self) -> u16 {
        self.used.next_used()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use virtio_queue::{Queue, QueueOwnedT, QueueT};
    use vm_memory::Bytes;

    use super::*;
    use crate::runtime::batch::Mapped;
    use crate::runtime::guest::{GuestMem, test_memory};

    const DESC: u64 = 0x0;
    const AVAIL: u64 = 0x1000;
    const USED: u64 = 0x2000;

    fn config(size: u16, event_idx: bool) -> RingConfig {
        RingConfig {
            size,
            desc: DESC,
            avail: AVAIL,
            used: USED,
            next_avail: 0,
            event_idx,
            packed: false,
            next_used: 0,
        }
    }

    fn memory() -> Mapped {
        Mapped::new(Arc::new(test_memory(&[(GuestAddress(0), 0x4000)])))
    }

    /// virtio-queue's queue over the same ring.
    fn oracle(cfg: &RingConfig, mem: &GuestMem) -> Queue {
        let mut q = Queue::new(cfg.size).unwrap();
        q.try_set_desc_table_address(GuestAddress(cfg.desc))
            .unwrap();
        q.try_set_avail_ring_address(GuestAddress(cfg.avail))
            .unwrap();
        q.try_set_used_ring_address(GuestAddress(cfg.used)).unwrap();
        q.set_event_idx(cfg.event_idx);
        q.set_next_avail(cfg.next_avail);
        q.set_ready(true);
        assert!(q.is_valid(mem));
        q
    }

    /// The used ring of a queue of `size` at `USED`: flags, index,
    /// elements, `avail_event`.
    fn used_area(m: &Mapped, size: u64) -> Vec<u8> {
        let mut area = vec![0u8; usize::try_from(6 + 8 * size).unwrap()];
        m.map().read_slice(&mut area, GuestAddress(USED)).unwrap();
        area
    }

    /// A small xorshift: reproducible, no dependency.
    fn rng(mut seed: u64) -> impl FnMut(u64) -> u64 {
        move |n| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        }
    }

    #[test]
    fn a_layout_is_refused_where_virtio_queue_refuses_it() {
        let m = memory();
        let mut rand = rng(0x2545_f491_4f6c_dd1d);
        for _ in 0..2000 {
            let size = [0u16, 1, 3, 4, 8, 16, 64, 256, 1024, 32768, 65535]
                [usize::try_from(rand(11)).unwrap()];
            let cfg = RingConfig {
                size,
                desc: rand(0x4400),
                avail: rand(0x4400),
                used: rand(0x4400),
                next_avail: 0,
                event_idx: rand(2) == 0,
                packed: false,
                next_used: 0,
            };
            let ours = RingLayout::new(&cfg, m.batch()).is_ok();
            let theirs = Queue::new(32768).is_ok_and(|mut q| {
                q.try_set_size(size).is_ok()
                    && q.try_set_desc_table_address(GuestAddress(cfg.desc)).is_ok()
                    && q.try_set_avail_ring_address(GuestAddress(cfg.avail))
                        .is_ok()
                    && q.try_set_used_ring_address(GuestAddress(cfg.used)).is_ok()
                    && {
                        q.set_ready(true);
                        q.is_valid(&**m.map())
                    }
            });
            assert_eq!(ours, theirs, "{cfg:?}");
        }
    }

    /// Batches of completions with random `used_event` values: the same
    /// used ring (elements and index) as virtio-queue's `add_used`, and
    /// the same notification decisions as its `needs_notification` once
    /// per batch (with EVENT_IDX; without it virtio-queue ignores
    /// VRING_AVAIL_F_NO_INTERRUPT and always notifies, which is what this
    /// ring does while the flag is clear).
    #[test]
    fn the_used_side_agrees_with_virtio_queue() {
        for event_idx in [true, false] {
            let (ours_mem, theirs_mem) = (memory(), memory());
            let cfg = config(8, event_idx);
            let mut ring = SplitRing::open(&cfg, ours_mem.batch()).unwrap();
            let mut q = oracle(&cfg, theirs_mem.map());
            let mut rand = rng(0x9e37_79b9_7f4a_7c15);
            for _ in 0..500 {
                let used_event = u16::try_from(rand(0x1_0000)).unwrap();
                let at = GuestAddress(AVAIL + 4 + 2 * 8);
                ours_mem.map().write_obj(used_event, at).unwrap();
                theirs_mem.map().write_obj(used_event, at).unwrap();
                for _ in 0..rand(9) {
                    let head = u16::try_from(rand(8)).unwrap();
                    let len = u32::try_from(rand(1 << 20)).unwrap();
                    ring.used().push(ours_mem.batch(), head, len).unwrap();
                    q.add_used(&**theirs_mem.map(), head, len).unwrap();
                }
                let batch = ring.used().pending();
                let ours = ring.used().publish(ours_mem.batch()).unwrap();
                let theirs = q.needs_notification(&**theirs_mem.map()).unwrap();
                if batch > 0 {
                    assert_eq!(ours, theirs, "used_event {used_event}");
                }
                assert_eq!(
                    used_area(&ours_mem, 8)[2..],
                    used_area(&theirs_mem, 8)[2..],
                    "index and elements"
                );
            }
        }
    }

    /// Enabling and disabling kicks writes the same fields as
    /// virtio-queue, and the re-check after enabling agrees.
    #[test]
    fn notifications_agree_with_virtio_queue() {
        for event_idx in [true, false] {
            let (ours_mem, theirs_mem) = (memory(), memory());
            let cfg = config(16, event_idx);
            let mut ring = SplitRing::open(&cfg, ours_mem.batch()).unwrap();
            let mut q = oracle(&cfg, theirs_mem.map());
            let mut rand = rng(0x1234_5678_9abc_def1);
            for _ in 0..500 {
                let next = u16::try_from(rand(0x1_0000)).unwrap();
                let idx = next.wrapping_add(u16::try_from(rand(3)).unwrap());
                for m in [&ours_mem, &theirs_mem] {
                    m.map().write_obj(idx, GuestAddress(AVAIL + 2)).unwrap();
                }
                ring.set_next_avail(next);
                q.set_next_avail(next);
                let (ours, theirs) = if rand(2) == 0 {
                    (
                        ring.enable_notification(ours_mem.batch()).unwrap(),
                        q.enable_notification(&**theirs_mem.map()).unwrap(),
                    )
                } else {
                    ring.disable_notification(ours_mem.batch()).unwrap();
                    q.disable_notification(&**theirs_mem.map()).unwrap();
                    (false, false)
                };
                assert_eq!(ours, theirs);
                assert_eq!(
                    used_area(&ours_mem, 16),
                    used_area(&theirs_mem, 16),
                    "flags and avail_event"
                );
            }
        }
    }

    /// Taking chains one at a time gives the heads virtio-queue's
    /// iterator gives, and refuses an avail index it refuses.
    #[test]
    fn popping_agrees_with_virtio_queue() {
        let m = memory();
        let cfg = config(8, false);
        let mut ring = SplitRing::open(&cfg, m.batch()).unwrap();
        let mut q = oracle(&cfg, m.map());
        let mut rand = rng(0xdead_beef_cafe_f00d);
        let mut idx = 0u16;
        for _ in 0..300 {
            for _ in 0..rand(5) {
                let slot = u64::from(idx % 8);
                let head = u16::try_from(rand(10)).unwrap();
                m.map()
                    .write_obj(head, GuestAddress(AVAIL + 4 + 2 * slot))
                    .unwrap();
                idx = idx.wrapping_add(1);
            }
            m.map().write_obj(idx, GuestAddress(AVAIL + 2)).unwrap();
            let theirs: Vec<u16> = q
                .iter(&**m.map())
                .unwrap()
                .map(|c| c.head_index())
                .collect();
            let mut ours = Vec::new();
            while let Some(c) = ring.pop(m.batch()).unwrap() {
                ours.push(c.head_index());
            }
            assert_eq!(ours, theirs);
        }
        m.map()
            .write_obj(idx.wrapping_add(9), GuestAddress(AVAIL + 2))
            .unwrap();
        assert!(q.iter(&**m.map()).is_err());
        assert!(matches!(
            ring.pop(m.batch()),
            Err(RingError::AvailIndex { .. })
        ));
    }

    #[test]
    fn heads_are_read_across_the_ring_end_by_host_address_or_through_memory() {
        let m = memory();
        for slot in 0..8u16 {
            let at = GuestAddress(AVAIL + 4 + 2 * u64::from(slot));
            m.map().write_obj((100 + slot).to_le(), at).unwrap();
        }
        let mut ring = SplitRing::open(&config(8, false), m.batch()).unwrap();
        let entries = ring.entries(m.batch());
        assert!(entries.is_some());
        for host in [entries, None] {
            let mut out = [0u16; 5];
            // 6, 7, then 0, 1, 2: the index wraps at the ring's size.
            ring.set_next_avail(6);
            assert_eq!(ring.read_heads(m.batch(), host, &mut out), 5);
            assert_eq!(out, [106, 107, 100, 101, 102]);
            ring.set_next_avail(0xfffe);
            assert_eq!(ring.read_heads(m.batch(), host, &mut out[..2]), 2);
            assert_eq!(out[..2], [106, 107], "u16 index wrap");
        }
    }
}
