//! The device side of a packed virtqueue (virtio 1.2, 2.8): one ring of
//! descriptors that the driver makes available and the device marks used
//! in place, and two event suppression structures, one per direction.
//!
//! Our own code: virtio-queue (0.18) defines the packed descriptor's
//! layout but no packed queue, and crosvm's and Firecracker's are tied to
//! their memory and queue types. It follows the specification's rules,
//! with the same choices as the split ring (`runtime::split`):
//!
//! - a list is taken whole ([`PackedRing::pop`]): the device finds where
//!   it ends (the first descriptor without NEXT, within a ring) and reads
//!   the buffer ID there, before the driver can reuse any of it, and
//!   skips the descriptors it occupied; the descriptors themselves come
//!   from a walk ([`PackedWalk`]) in the split ring's [`Descriptor`]
//!   form, so that `chain::parse` checks both kinds alike;
//! - used descriptors are written as requests complete, and published
//!   together: every one's flags but the first's at once, the first's
//!   last with a `Release` store, so that the driver, which reads the ring
//!   in order from the first, sees the batch at once (2.8.14, multi-buffer
//!   requests, applied to a batch); the driver is notified at most once
//!   per batch ([`PackedRing::publish`]); a process killed in between
//!   leaves used descriptors that the next one clears before it publishes
//!   ([`PackedRing::reposition`]);
//! - what a hostile driver can write never reaches an index: a list that
//!   does not end within a ring, or names a buffer ID at or above the
//!   queue size, breaks the queue (a [`RingError`], as the split ring's
//!   impossible avail index does, and as QEMU's device does); a list whose
//!   descriptors cannot be followed (an indirect descriptor inside a list,
//!   an indirect table whose length is not a multiple of 16) is consumed
//!   and answered as malformed.
//!
//! A position in the ring is an offset below the queue size and the wrap
//! counter of its lap ([`Position`], `sqcq_protocol::packed`, which the
//! driver side counts with too).

use std::sync::atomic::{Ordering, fence};

pub use sqcq_protocol::packed::{Position, decode_base, encode_base};

use crate::runtime::batch::Batch;
use crate::runtime::chain::Descriptor;
use crate::runtime::split::{RingError, check_areas};
use crate::runtime::tracking::RawDesc;

/// The largest queue size of a packed ring (2.8: up to 2^15 entries).
pub const MAX_SIZE: u16 = 1 << 15;
/// Bytes of one descriptor.
const DESC_SIZE: u64 = 16;
/// Offset of `len` in a descriptor (`addr` le64, `len` le32, `id` le16,
/// `flags` le16).
const LEN_OFFSET: u64 = 8;
/// Offset of `flags` in a descriptor.
const FLAGS_OFFSET: u64 = 14;
/// Offset of `id` in a descriptor.
const ID_OFFSET: u64 = 12;

/// VRING_DESC_F_NEXT.
const NEXT: u16 = 1;
/// VRING_DESC_F_WRITE.
const WRITE: u16 = 2;
/// VRING_DESC_F_INDIRECT.
const INDIRECT: u16 = 4;
/// VRING_PACKED_DESC_F_AVAIL (bit 7).
const AVAIL: u16 = 1 << 7;
/// VRING_PACKED_DESC_F_USED (bit 15).
const USED: u16 = 1 << 15;
/// VRING_PACKED_EVENT_FLAG_ENABLE.
const EVENT_ENABLE: u16 = 0;
/// VRING_PACKED_EVENT_FLAG_DISABLE.
const EVENT_DISABLE: u16 = 1;
/// VRING_PACKED_EVENT_FLAG_DESC.
const EVENT_DESC: u16 = 2;
/// Where a packed ring is and what the two sides agreed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackedConfig {
    /// Queue size (any from 1 to 2^15).
    pub size: u16,
    /// Descriptor ring (guest physical).
    pub desc: u64,
    /// Driver event suppression structure (the driver area).
    pub driver_event: u64,
    /// Device event suppression structure (the device area).
    pub device_event: u64,
    /// Next position to take a list from.
    pub avail: Position,
    /// Next position to write a used descriptor to.
    pub used: Position,
    /// VIRTIO_F_RING_EVENT_IDX negotiated.
    pub event_idx: bool,
}

/// Whether `flags` mark a descriptor available on the driver's lap
/// `wrap`: AVAIL equal to the wrap counter and USED its inverse.
fn available(flags: u16, wrap: bool) -> bool {
    (flags & AVAIL != 0) == wrap && (flags & USED != 0) != wrap
}

/// One list taken from the ring.
#[derive(Debug)]
pub struct Popped<'a> {
    /// The buffer ID, from the list's last descriptor.
    pub id: u16,
    /// The offset of its first descriptor.
    pub first: u16,
    /// Descriptors the list occupies in the ring.
    pub count: u16,
    /// Its buffers.
    pub walk: PackedWalk<'a>,
}

/// Where a packed ring is and what the two sides agreed on: reading a
/// descriptor's flags at a position, and asking for notifications or not
/// (the device event suppression structure). It is `Copy`, so the watch
/// of a polled queue works on the same ring without sharing state with
/// the request path, as `split::RingLayout` does for split rings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackedLayout {
    desc: u64,
    driver_event: u64,
    device_event: u64,
    size: u16,
    event_idx: bool,
}

impl PackedLayout {
    /// The layout of `cfg`, checked against the specification's size and
    /// alignment rules and against guest memory.
    pub fn new(cfg: &PackedConfig, mem: Batch<'_>) -> Result<Self, RingError> {
        let size = cfg.size;
        if size == 0 || size > MAX_SIZE {
            return Err(RingError::Size(size));
        }
        // Each area: (name, address, alignment, length).
        let areas = [
            ("descriptor ring", cfg.desc, 16, DESC_SIZE * u64::from(size)),
            ("driver event suppression", cfg.driver_event, 4, 4),
            ("device event suppression", cfg.device_event, 4, 4),
        ];
        check_areas(&areas, mem)?;
        Ok(PackedLayout {
            desc: cfg.desc,
            driver_event: cfg.driver_event,
            device_event: cfg.device_event,
            size,
            event_idx: cfg.event_idx,
        })
    }

    /// Guest address of the descriptor at `off` (below the size).
    fn slot(&self, off: u16) -> u64 {
        self.desc + DESC_SIZE * u64::from(off)
    }

    fn flags(&self, mem: Batch<'_>, off: u16, order: Ordering) -> Result<u16, RingError> {
        mem.load_u16(self.slot(off) + FLAGS_OFFSET, order)
            .map_err(RingError::Memory)
    }

    /// Whether the driver made a list available at `at`, loading its
    /// flags with `order` (`Acquire` to read the list after).
    pub fn available_at(
        &self,
        mem: Batch<'_>,
        at: Position,
        order: Ordering,
    ) -> Result<bool, RingError> {
        Ok(available(self.flags(mem, at.off(), order)?, at.wrap()))
    }

    /// Asks the driver not to notify (a queue that looks at its ring
    /// anyway: being served, or polled).
    pub fn disable_notification(&self, mem: Batch<'_>) -> Result<(), RingError> {
        mem.store_u16(self.device_event + 2, EVENT_DISABLE, Ordering::Relaxed)
            .map_err(RingError::Memory)
    }

    /// Asks the driver to notify again (with EVENT_IDX, for the list at
    /// `at`), then says whether it made one available there meanwhile (it
    /// will not be notified).
    ///
    /// The stores, `fence(SeqCst)`, then the re-read of the flags pair
    /// with the full barrier the driver executes between making a list
    /// available and reading this structure (2.8.21.1, and virtio_ring's
    /// `virtqueue_kick_prepare_packed`): one of the two sides sees the
    /// other's store.
    pub fn enable_notification(&self, mem: Batch<'_>, at: Position) -> Result<bool, RingError> {
        let flags = if self.event_idx {
            mem.store_u16(self.device_event, at.encode(), Ordering::Relaxed)
                .map_err(RingError::Memory)?;
            EVENT_DESC
        } else {
            EVENT_ENABLE
        };
        mem.store_u16(self.device_event + 2, flags, Ordering::Relaxed)
            .map_err(RingError::Memory)?;
        fence(Ordering::SeqCst);
        self.available_at(mem, at, Ordering::Relaxed)
    }
}

/// The device side of one packed ring: its layout, the next position to
/// take a list from, and the used side.
#[derive(Debug)]
pub struct PackedRing {
    layout: PackedLayout,
    avail: Position,
    used: Position,
    /// The used position at the last [`Self::publish`].
    published: Position,
    /// The first used descriptor written since the last publication:
    /// its offset and the flags still to be stored there.
    held: Option<(u16, u16)>,
}

impl PackedRing {
    /// The ring of `cfg`, checked as [`PackedLayout::new`] checks it, with
    /// its two positions inside the ring.
    pub fn open(cfg: &PackedConfig, mem: Batch<'_>) -> Result<Self, RingError> {
        let layout = PackedLayout::new(cfg, mem)?;
        for p in [cfg.avail, cfg.used] {
            if p.off() >= cfg.size {
                return Err(RingError::Base {
                    base: encode_base(cfg.avail, cfg.used),
                    size: cfg.size,
                });
            }
        }
        Ok(PackedRing {
            layout,
            avail: cfg.avail,
            used: cfg.used,
            published: cfg.used,
            held: None,
        })
    }

    /// Queue size.
    pub fn size(&self) -> u16 {
        self.layout.size
    }

    /// Next position to take a list from.
    pub fn next_avail(&self) -> Position {
        self.avail
    }

    /// Next position a used descriptor goes to.
    pub fn next_used(&self) -> Position {
        self.used
    }

    /// Whether the driver made a list available at the next position.
    /// `Acquire`: what the driver wrote before the flags is visible after.
    pub fn has_available(&self, mem: Batch<'_>) -> Result<bool, RingError> {
        self.layout.available_at(mem, self.avail, Ordering::Acquire)
    }

    /// Takes the list at the next position, if the driver made one
    /// available. A list that does not end within a ring, or whose buffer
    /// ID is not below the queue size, is an error that breaks the queue:
    /// nothing says where the next list starts, or what to answer.
    pub fn pop<'a>(&mut self, mem: Batch<'a>) -> Result<Option<Popped<'a>>, RingError> {
        let at = self.avail;
        // Acquire: pairs with the driver's barrier before it stores the
        // first descriptor's flags, which it stores after the rest of the
        // list (2.8.6), so every descriptor read below is complete.
        let mut flags = self.layout.flags(mem, at.off(), Ordering::Acquire)?;
        if !available(flags, at.wrap()) {
            return Ok(None);
        }
        let mut last = at;
        let mut count: u16 = 1;
        while flags & NEXT != 0 {
            if count == self.layout.size {
                return Err(RingError::Unterminated {
                    at: at.off(),
                    size: self.layout.size,
                });
            }
            last = last.advance(1, self.layout.size);
            count += 1;
            flags = self.layout.flags(mem, last.off(), Ordering::Relaxed)?;
        }
        let id = mem
            .load_u16(self.layout.slot(last.off()) + ID_OFFSET, Ordering::Relaxed)
            .map_err(RingError::Memory)?;
        if id >= self.layout.size {
            return Err(RingError::BufferId {
                id,
                size: self.layout.size,
            });
        }
        self.avail = at.advance(count, self.layout.size);
        Ok(Some(Popped {
            id,
            first: at.off(),
            count,
            walk: PackedWalk {
                mem,
                ring: self.layout.desc,
                copied: &[],
                size: self.layout.size,
                next: at.off(),
                left: count,
                list: count,
                table: None,
                bytes: 0,
            },
        }))
    }

    /// The ring descriptor at offset `off`, as the driver wrote it (for
    /// the in-flight record, `runtime::tracking::packed`).
    pub fn raw_desc(&self, mem: Batch<'_>, off: u16) -> Result<RawDesc, RingError> {
        mem.read_bytes::<16>(self.layout.slot(off))
            .map(RawDesc::decode)
            .map_err(RingError::Memory)
    }

    /// Whether the descriptor at `at` is still available on `at`'s lap
    /// (no used descriptor was written over it); `true` if it cannot be
    /// read.
    pub fn still_available(&self, mem: Batch<'_>, at: Position) -> bool {
        self.layout
            .available_at(mem, at, Ordering::Acquire)
            .unwrap_or(true)
    }

    /// Continues at other positions (an in-flight record's, whose lists
    /// taken and not used lie between `used` and `avail`); `false` if
    /// either is outside the ring.
    ///
    /// Every descriptor from `used` to `avail` is the device's, and an
    /// earlier run may have left used descriptors there that it never
    /// published: a batch's used descriptors after the first get their
    /// flags as they are written, the first's last, so a process killed
    /// in between leaves descriptors that read as used behind one that
    /// does not. Their requests are resubmitted (the record rolled the
    /// batch back), so once this run publishes a used descriptor at
    /// `used` the driver, reading on in order, would find them and
    /// complete those requests before they are redone, and again when
    /// they are. Their AVAIL and USED flags are therefore put back as the
    /// driver wrote them, available on their lap, before anything is
    /// published: the driver reads none of them before the one at `used`,
    /// which was never marked, and this run's first publication
    /// (`Release`) makes the flags visible before its own. Available, not
    /// some third state: the record decides whether a later batch
    /// reached the ring by whether the descriptor at its first position
    /// is still available (`PackedRecord::recover`), and a batch that
    /// starts at one of these descriptors and is killed before its
    /// publication must read as not published.
    pub fn reposition(&mut self, mem: Batch<'_>, avail: Position, used: Position) -> bool {
        let size = self.layout.size;
        if avail.off() >= size || used.off() >= size {
            return false;
        }
        let owned = used.ahead(avail, size).min(u32::from(size));
        let mut at = used;
        for _ in 0..owned {
            let Ok(flags) = self.layout.flags(mem, at.off(), Ordering::Relaxed) else {
                return false;
            };
            let marked = if at.wrap() { AVAIL | USED } else { 0 };
            if flags & (AVAIL | USED) == marked {
                let available = flags & !(AVAIL | USED) | if at.wrap() { AVAIL } else { USED };
                if mem
                    .store_u16(
                        self.layout.slot(at.off()) + FLAGS_OFFSET,
                        available,
                        Ordering::Relaxed,
                    )
                    .is_err()
                {
                    return false;
                }
            }
            at = at.advance(1, size);
        }
        self.avail = avail;
        self.used = used;
        self.published = used;
        self.held = None;
        true
    }

    /// Writes the used descriptor of buffer `id`, which took `count`
    /// descriptors of the ring, with `len` bytes written; it becomes
    /// visible to the driver at the next [`Self::publish_used`].
    pub fn push(&mut self, mem: Batch<'_>, id: u16, count: u16, len: u32) -> Result<(), RingError> {
        if id >= self.layout.size {
            return Err(RingError::BufferId {
                id,
                size: self.layout.size,
            });
        }
        let count = count.clamp(1, self.layout.size);
        let at = self.layout.slot(self.used.off());
        let mut body = [0u8; 6];
        body[..4].copy_from_slice(&len.to_le_bytes());
        body[4..].copy_from_slice(&id.to_le_bytes());
        mem.write_bytes(at + LEN_OFFSET, &body)
            .map_err(RingError::Memory)?;
        // A used descriptor has AVAIL and USED both equal to the device's
        // wrap counter; WRITE says that the device wrote to the buffer.
        let mut flags = if self.used.wrap() { AVAIL | USED } else { 0 };
        if len > 0 {
            flags |= WRITE;
        }
        match self.held {
            None => self.held = Some((self.used.off(), flags)),
            // Release: this descriptor's `len` and `id` before its flags;
            // the driver reads it only after the first's flags anyway.
            Some(_) => mem
                .store_u16(at + FLAGS_OFFSET, flags, Ordering::Release)
                .map_err(RingError::Memory)?,
        }
        self.used = self.used.advance(count, self.layout.size);
        Ok(())
    }

    /// Makes every used descriptor written since the last publication
    /// visible (the first's flags, stored last); returns how many ring
    /// descriptors they cover.
    pub fn publish_used(&mut self, mem: Batch<'_>) -> Result<u32, RingError> {
        let Some((off, flags)) = self.held.take() else {
            return Ok(0);
        };
        // Release: every used descriptor written since, and the requests'
        // data, become visible before the driver sees the first of them;
        // pairs with the driver's read barrier after it reads the flags.
        mem.store_u16(
            self.layout.slot(off) + FLAGS_OFFSET,
            flags,
            Ordering::Release,
        )
        .map_err(RingError::Memory)?;
        let covered = self.published.ahead(self.used, self.layout.size);
        self.published = self.used;
        Ok(covered)
    }

    /// Publishes every used descriptor written and says whether the
    /// driver must be notified: as its event suppression structure asks
    /// (disabled, enabled, or, with EVENT_IDX, for the descriptor at a
    /// position among those just used).
    pub fn publish(&mut self, mem: Batch<'_>) -> Result<bool, RingError> {
        let old = self.published;
        if self.publish_used(mem)? == 0 {
            return Ok(false);
        }
        let new = self.published;
        // SeqCst: the flags stored above before the event structure read
        // below; pairs with the driver's full barrier between writing its
        // event structure and re-reading the ring (2.8.21.3.1), else both
        // sides can miss the other's store and the interrupt is lost.
        fence(Ordering::SeqCst);
        let flags = mem
            .load_u16(self.layout.driver_event + 2, Ordering::Relaxed)
            .map_err(RingError::Memory)?;
        Ok(match flags & 3 {
            EVENT_DISABLE => false,
            EVENT_DESC if self.layout.event_idx => {
                let off_wrap = mem
                    .load_u16(self.layout.driver_event, Ordering::Relaxed)
                    .map_err(RingError::Memory)?;
                // Notify when the position asked for lies among those
                // just used; a position outside the ring asks for every
                // notification.
                Position::decode(off_wrap, self.layout.size).is_none_or(|event| {
                    old.ahead(event, self.layout.size) < old.ahead(new, self.layout.size)
                })
            }
            // ENABLE, DESC without EVENT_IDX, and the reserved value.
            _ => true,
        })
    }

    /// See [`PackedLayout::disable_notification`].
    pub fn disable_notification(&self, mem: Batch<'_>) -> Result<(), RingError> {
        self.layout.disable_notification(mem)
    }

    /// See [`PackedLayout::enable_notification`], at the next position.
    pub fn enable_notification(&self, mem: Batch<'_>) -> Result<bool, RingError> {
        self.layout.enable_notification(mem, self.avail)
    }
}

/// The buffers of one list, in the split ring's [`Descriptor`] form
/// (NEXT on every one but the last, WRITE as the driver set it), with
/// the same limits as the split ring's walk: one level of indirection to
/// a table whose length is a multiple of 16, at most 2^32 bytes in all.
/// It ends early where the list breaks a rule (an indirect descriptor in
/// a list of several, a bad table): `chain::parse` then sees a last
/// descriptor that still says NEXT, or none, and reports it malformed.
#[derive(Debug)]
pub struct PackedWalk<'a> {
    mem: Batch<'a>,
    ring: u64,
    /// The list's ring descriptors as recorded, read instead of the ring
    /// (a list resubmitted from an in-flight record); empty: the ring.
    copied: &'a [RawDesc],
    size: u16,
    /// Offset of the next ring descriptor.
    next: u16,
    /// Ring descriptors not yet read.
    left: u16,
    /// Ring descriptors in the list.
    list: u16,
    /// The indirect table being read: address of its next entry and the
    /// entries left.
    table: Option<(u64, u32)>,
    bytes: u32,
}

impl<'a> PackedWalk<'a> {
    /// The walk of a list from its recorded ring descriptors `descs`
    /// (non-empty, as `tracking::packed` returns them), with the limits
    /// of a list read from the ring.
    pub fn recorded(mem: Batch<'a>, descs: &'a [RawDesc]) -> Self {
        let count = u16::try_from(descs.len()).unwrap_or(u16::MAX);
        PackedWalk {
            mem,
            ring: 0,
            copied: descs,
            size: count.max(1),
            next: 0,
            left: count,
            list: count,
            table: None,
            bytes: 0,
        }
    }

    fn read(&self, gpa: u64) -> Option<(u64, u32, u16)> {
        let d = RawDesc::decode(self.mem.read_bytes::<16>(gpa).ok()?);
        Some((d.addr, d.len, d.flags))
    }

    fn yield_desc(&mut self, addr: u64, len: u32, flags: u16, more: bool) -> Option<Descriptor> {
        self.bytes = self.bytes.checked_add(len)?;
        let flags = (flags & WRITE) | if more { NEXT } else { 0 };
        Some(Descriptor::new(addr, len, flags, 0))
    }
}

impl Iterator for PackedWalk<'_> {
    type Item = Descriptor;

    fn next(&mut self) -> Option<Descriptor> {
        if let Some((at, left)) = self.table {
            if left == 0 {
                return None;
            }
            let (addr, len, flags) = self.read(at)?;
            // In a table only WRITE counts (2.8.8); the entries follow
            // each other to the table's end.
            self.table = Some((at + DESC_SIZE, left - 1));
            return self.yield_desc(addr, len, flags, left > 1);
        }
        if self.left == 0 {
            return None;
        }
        let (addr, len, flags) = if self.copied.is_empty() {
            self.read(self.ring + DESC_SIZE * u64::from(self.next))?
        } else {
            let d = self.copied.get(usize::from(self.next))?;
            (d.addr, d.len, d.flags)
        };
        self.left -= 1;
        self.next = if self.next + 1 == self.size {
            0
        } else {
            self.next + 1
        };
        if flags & INDIRECT != 0 {
            // Alone in its list, and a table of whole descriptors.
            if self.list != 1 || len == 0 || !len.is_multiple_of(16) {
                self.left = 0;
                return None;
            }
            self.table = Some((addr, len / 16));
            return self.next();
        }
        self.yield_desc(addr, len, flags, self.left > 0)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::{HashMap, HashSet};
    use std::sync::Arc;

    use vm_memory::{Bytes, GuestAddress};

    use super::*;
    use crate::runtime::batch::Mapped;
    use crate::runtime::chain::{ChainBuffers, ChainError, Segment, parse};
    use crate::runtime::guest::test_memory;

    pub(crate) const DESC: u64 = 0x0;
    pub(crate) const DRIVER_EVENT: u64 = 0x8000;
    pub(crate) const DEVICE_EVENT: u64 = 0x8004;
    const TABLES: u64 = 0x9000;

    pub(crate) fn memory() -> Mapped {
        Mapped::new(Arc::new(test_memory(&[(GuestAddress(0), 0x10_0000)])))
    }

    fn config(size: u16, event_idx: bool) -> PackedConfig {
        PackedConfig {
            size,
            desc: DESC,
            driver_event: DRIVER_EVENT,
            device_event: DEVICE_EVENT,
            avail: Position::START,
            used: Position::START,
            event_idx,
        }
    }

    /// A small xorshift: reproducible, no dependency.
    pub(crate) fn rng(mut seed: u64) -> impl FnMut(u64) -> u64 {
        move |n| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        }
    }

    /// The driver of the specification's example (2.8.21.1 and 2.8.22):
    /// lists written with the first descriptor's flags last, the buffer
    /// ID in the last descriptor, used descriptors read in order and
    /// skipped by the length of their list.
    #[derive(Debug)]
    pub(crate) struct Driver {
        size: u16,
        avail: Position,
        used: Position,
        free: Vec<u16>,
        /// Descriptors of each buffer ID in flight.
        lists: HashMap<u16, u16>,
    }

    impl Driver {
        pub(crate) fn new(size: u16) -> Self {
            Driver {
                size,
                avail: Position::START,
                used: Position::START,
                free: (0..size).rev().collect(),
                lists: HashMap::new(),
            }
        }

        pub(crate) fn room(&self) -> u16 {
            self.size - self.lists.values().sum::<u16>()
        }

        fn write_desc(m: &Mapped, off: u16, addr: u64, len: u32, id: u16, flags: u16) {
            let mut raw = [0u8; 16];
            raw[..8].copy_from_slice(&addr.to_le_bytes());
            raw[8..12].copy_from_slice(&len.to_le_bytes());
            raw[12..14].copy_from_slice(&id.to_le_bytes());
            raw[14..].copy_from_slice(&flags.to_le_bytes());
            m.map()
                .write_slice(&raw, GuestAddress(DESC + 16 * u64::from(off)))
                .unwrap();
        }

        /// Makes `bufs` (address, length, flags) available as one list;
        /// returns its buffer ID.
        pub(crate) fn add(&mut self, m: &Mapped, bufs: &[(u64, u32, u16)]) -> u16 {
            let n = u16::try_from(bufs.len()).unwrap();
            assert!(n >= 1 && n <= self.room());
            let id = self.free.pop().unwrap();
            let first = self.avail;
            let mut first_flags = 0;
            for (i, &(addr, len, f)) in bufs.iter().enumerate() {
                let mut flags = f;
                if self.avail.wrap() {
                    flags |= AVAIL;
                } else {
                    flags |= USED;
                }
                if i + 1 < bufs.len() {
                    flags |= NEXT;
                }
                // The buffer ID goes in the last descriptor only: the
                // others carry one the device must not take.
                let desc_id = if i + 1 == bufs.len() { id } else { 0xbeef };
                if i == 0 {
                    // The first keeps the flags it had until the whole
                    // list is written.
                    first_flags = flags;
                    let old = self.flags_of(m, self.avail.off());
                    Self::write_desc(m, self.avail.off(), addr, len, desc_id, old);
                } else {
                    Self::write_desc(m, self.avail.off(), addr, len, desc_id, flags);
                }
                self.avail = self.avail.advance(1, self.size);
            }
            m.batch()
                .store_u16(
                    DESC + 16 * u64::from(first.off()) + 14,
                    first_flags,
                    Ordering::Release,
                )
                .unwrap();
            self.lists.insert(id, n);
            id
        }

        fn flags_of(&self, m: &Mapped, off: u16) -> u16 {
            m.batch()
                .load_u16(DESC + 16 * u64::from(off) + 14, Ordering::Relaxed)
                .unwrap()
        }

        /// The next used buffer: its ID and length.
        pub(crate) fn get_used(&mut self, m: &Mapped) -> Option<(u16, u32)> {
            let at = DESC + 16 * u64::from(self.used.off());
            let flags = m.batch().load_u16(at + 14, Ordering::Acquire).unwrap();
            if (flags & USED != 0) != self.used.wrap() || (flags & AVAIL != 0) != self.used.wrap() {
                return None;
            }
            let id: u16 = m.map().read_obj(GuestAddress(at + 12)).unwrap();
            let len: u32 = m.map().read_obj(GuestAddress(at + 8)).unwrap();
            let n = self.lists.remove(&id).expect("used ID in flight");
            self.used = self.used.advance(n, self.size);
            self.free.push(id);
            Some((id, len))
        }
    }

    fn buffers(popped: Popped<'_>, m: &Mapped) -> (Result<(), ChainError>, ChainBuffers) {
        let mut out = ChainBuffers::with_capacity(64);
        let r = parse(popped.walk, m.batch(), 64, &mut out);
        (r, out)
    }

    #[test]
    fn a_ring_is_refused_where_the_specification_refuses_it() {
        let m = memory();
        let ok = |cfg: PackedConfig| PackedRing::open(&cfg, m.batch()).is_ok();
        // Any size from 1 to 2^15, powers of two or not.
        for size in [1, 3, 7, 256, 1000, 32768] {
            let ring = PackedRing::open(&config(size, false), m.batch()).unwrap();
            assert_eq!(ring.size(), size);
        }
        for size in [0, 32769, 65535] {
            assert!(!ok(config(size, false)), "{size}");
        }
        let c = config(8, true);
        assert!(!ok(PackedConfig { desc: 8, ..c }));
        assert!(!ok(PackedConfig {
            driver_event: 2,
            ..c
        }));
        assert!(!ok(PackedConfig {
            device_event: 0x8006,
            ..c
        }));
        // The ring must lie in memory: 16 descriptors at the end do not.
        assert!(!ok(PackedConfig {
            size: 16,
            desc: 0x10_0000 - 0x80,
            ..c
        }));
        assert!(!ok(PackedConfig {
            device_event: 0x10_0000,
            ..c
        }));
        assert!(!ok(PackedConfig {
            avail: Position::new(8, true),
            ..c
        }));
    }

    /// Lists of 1 to 4 descriptors over many laps of rings whose size is
    /// not a power of two, completed in random order in random batches:
    /// the device takes each list whole with the driver's buffers and ID,
    /// and the driver gets every ID back once, with its length.
    #[test]
    fn lists_go_round_many_laps_completed_out_of_order() {
        for size in [1u16, 2, 5, 7, 16] {
            let m = memory();
            let mut ring = PackedRing::open(&config(size, false), m.batch()).unwrap();
            let mut driver = Driver::new(size);
            let mut rand = rng(0x9e37_79b9_7f4a_7c15 ^ u64::from(size));
            let mut expected: HashMap<u16, Vec<Segment>> = HashMap::new();
            let mut in_device: Vec<(u16, u16, u32)> = vec![];
            let mut returned = 0u32;
            for round in 0..400u64 {
                // The driver adds what fits.
                while driver.room() > 0 && rand(3) != 0 {
                    let n = 1 + u16::try_from(rand(4)).unwrap().min(driver.room() - 1);
                    let bufs: Vec<(u64, u32, u16)> = (0..n)
                        .map(|i| {
                            let write = i > 0 && i + 1 == n;
                            (
                                0x2_0000 + round * 0x100 + u64::from(i) * 0x10,
                                u32::from(i) + 1,
                                if write { WRITE } else { 0 },
                            )
                        })
                        .collect();
                    let id = driver.add(&m, &bufs);
                    let segs = bufs
                        .iter()
                        .map(|&(a, l, _)| Segment {
                            addr: GuestAddress(a),
                            len: l,
                        })
                        .collect();
                    assert!(expected.insert(id, segs).is_none());
                }
                // The device takes everything available.
                let mut at = ring.next_avail();
                while let Some(p) = ring.pop(m.batch()).unwrap() {
                    let (id, count) = (p.id, p.count);
                    at = at.advance(count, size);
                    assert_eq!(ring.next_avail(), at);
                    let (r, out) = buffers(p, &m);
                    r.unwrap();
                    let mut all = out.readable.clone();
                    all.extend(&out.writable);
                    assert_eq!(all, expected[&id], "size {size} id {id}");
                    assert_eq!(usize::from(count), all.len());
                    in_device.push((id, count, u32::from(id) * 3));
                }
                assert!(!ring.has_available(m.batch()).unwrap());
                // It completes some, in random order, in one batch.
                let k = usize::try_from(rand(in_device.len() as u64 + 1)).unwrap();
                for _ in 0..k {
                    let i = usize::try_from(rand(in_device.len() as u64)).unwrap();
                    let (id, count, len) = in_device.swap_remove(i);
                    ring.push(m.batch(), id, count, len).unwrap();
                }
                // Nothing is visible before the publication.
                if k > 0 {
                    assert_eq!(driver.get_used(&m), None);
                }
                ring.publish(m.batch()).unwrap();
                let mut got = 0;
                while let Some((id, len)) = driver.get_used(&m) {
                    assert_eq!(len, u32::from(id) * 3);
                    assert!(expected.remove(&id).is_some());
                    got += 1;
                }
                assert_eq!(got, k, "size {size} round {round}");
                returned += u32::try_from(got).unwrap();
            }
            assert!(returned > 100, "size {size}: {returned}");
            assert_eq!(
                ring.next_used().ahead(ring.next_avail(), size),
                u32::from(size - driver.room())
            );
        }
    }

    /// A process killed while it wrote a batch of used descriptors (all
    /// but the first marked used, the first not yet) and the next one,
    /// which resumes at the record's positions and redoes those requests
    /// in another order: the driver gets each ID once, when this run
    /// publishes it, never the dead run's unpublished descriptors, on
    /// every lap and across the wrap.
    #[test]
    fn a_restart_never_publishes_what_a_killed_run_left_unpublished() {
        for size in [3u16, 5, 8] {
            for before in 0..2 * size {
                let m = memory();
                let mut ring = PackedRing::open(&config(size, false), m.batch()).unwrap();
                let mut driver = Driver::new(size);
                // Some lists go round first, so that the kill comes at
                // every offset and lap.
                for _ in 0..before {
                    driver.add(&m, &[(0x2_0000, 1, 0)]);
                    let p = ring.pop(m.batch()).unwrap().unwrap();
                    ring.push(m.batch(), p.id, p.count, 0).unwrap();
                    ring.publish(m.batch()).unwrap();
                    assert!(driver.get_used(&m).is_some());
                }
                // A full ring of one-descriptor lists, all taken.
                let mut taken = vec![];
                while driver.room() > 0 {
                    driver.add(&m, &[(0x3_0000, 8, WRITE)]);
                    let p = ring.pop(m.batch()).unwrap().unwrap();
                    taken.push(p.id);
                }
                // The killed run wrote every used descriptor, published
                // none of them.
                let (avail, used) = (ring.next_avail(), ring.next_used());
                for &id in &taken {
                    ring.push(m.batch(), id, 1, 1).unwrap();
                }
                // The process dies here: the next ring starts anew.
                assert_eq!(driver.get_used(&m), None);
                // The next run redoes them in reverse, one per
                // publication.
                let mut next = PackedRing::open(&config(size, false), m.batch()).unwrap();
                assert!(next.reposition(m.batch(), avail, used));
                for &id in taken.iter().rev() {
                    next.push(m.batch(), id, 1, 2).unwrap();
                    next.publish(m.batch()).unwrap();
                    assert_eq!(
                        driver.get_used(&m),
                        Some((id, 2)),
                        "size {size}, {before} before"
                    );
                    assert_eq!(driver.get_used(&m), None, "size {size}, {before} before");
                }
            }
        }
    }

    #[test]
    fn an_indirect_table_is_read_whole_with_only_its_write_flags() {
        let m = memory();
        let mut ring = PackedRing::open(&config(4, false), m.batch()).unwrap();
        let mut driver = Driver::new(4);
        // Three entries; NEXT, INDIRECT and AVAIL set on them are
        // ignored, so is the table descriptor's WRITE.
        for (i, (addr, len, flags)) in [
            (0x3_0000u64, 51u32, NEXT | INDIRECT),
            (0x3_1000, 512, AVAIL),
            (0x3_2000, 108, WRITE),
        ]
        .into_iter()
        .enumerate()
        {
            let mut raw = [0u8; 16];
            raw[..8].copy_from_slice(&addr.to_le_bytes());
            raw[8..12].copy_from_slice(&len.to_le_bytes());
            raw[12..14].copy_from_slice(&77u16.to_le_bytes());
            raw[14..].copy_from_slice(&flags.to_le_bytes());
            m.map()
                .write_slice(&raw, GuestAddress(TABLES + 16 * i as u64))
                .unwrap();
        }
        let id = driver.add(&m, &[(TABLES, 48, INDIRECT | WRITE)]);
        let p = ring.pop(m.batch()).unwrap().unwrap();
        assert_eq!((p.id, p.count), (id, 1));
        let (r, out) = buffers(p, &m);
        r.unwrap();
        assert_eq!(
            out.readable,
            [
                Segment {
                    addr: GuestAddress(0x3_0000),
                    len: 51
                },
                Segment {
                    addr: GuestAddress(0x3_1000),
                    len: 512
                }
            ]
        );
        assert_eq!(out.writable.len(), 1);
        assert_eq!(out.writable_len, 108);
    }

    #[test]
    fn lists_that_cannot_be_followed_are_consumed_and_reported_malformed() {
        let m = memory();
        let mut ring = PackedRing::open(&config(8, false), m.batch()).unwrap();
        let mut driver = Driver::new(8);
        // An indirect descriptor inside a list of two.
        let a = driver.add(&m, &[(0x4_0000, 16, 0), (TABLES, 32, INDIRECT)]);
        // Tables of no entry, and of a length not a multiple of 16.
        let b = driver.add(&m, &[(TABLES, 0, INDIRECT)]);
        let c = driver.add(&m, &[(TABLES, 40, INDIRECT)]);
        // A good list after them is still found.
        let d = driver.add(&m, &[(0x4_1000, 8, WRITE)]);
        for (id, count) in [(a, 2), (b, 1), (c, 1)] {
            let p = ring.pop(m.batch()).unwrap().unwrap();
            assert_eq!((p.id, p.count), (id, count));
            assert_eq!(buffers(p, &m).0, Err(ChainError::Malformed));
        }
        let p = ring.pop(m.batch()).unwrap().unwrap();
        assert_eq!(p.id, d);
        assert_eq!(buffers(p, &m).0, Ok(()));
        assert!(ring.pop(m.batch()).unwrap().is_none());
    }

    #[test]
    fn a_list_without_end_or_with_a_bad_id_breaks_the_queue() {
        let m = memory();
        let mut ring = PackedRing::open(&config(4, false), m.batch()).unwrap();
        // Four descriptors, all with NEXT and available.
        for off in 0..4 {
            Driver::write_desc(&m, off, 0x5000, 16, 0, NEXT | AVAIL);
        }
        assert!(matches!(
            ring.pop(m.batch()),
            Err(RingError::Unterminated { at: 0, size: 4 })
        ));
        let m = memory();
        let mut ring = PackedRing::open(&config(4, false), m.batch()).unwrap();
        Driver::write_desc(&m, 0, 0x5000, 16, 0, NEXT | AVAIL);
        Driver::write_desc(&m, 1, 0x5000, 16, 4, AVAIL);
        assert!(matches!(
            ring.pop(m.batch()),
            Err(RingError::BufferId { id: 4, size: 4 })
        ));
        assert!(ring.push(m.batch(), 4, 1, 0).is_err());
    }

    #[test]
    fn only_a_descriptor_marked_for_the_current_lap_is_available() {
        let m = memory();
        let mut ring = PackedRing::open(&config(2, false), m.batch()).unwrap();
        // The zeroed ring, a used descriptor of the first lap, and one
        // marked for the second lap: none is available on the first.
        for flags in [0, AVAIL | USED, USED] {
            Driver::write_desc(&m, 0, 0x5000, 16, 0, flags);
            assert!(ring.pop(m.batch()).unwrap().is_none(), "{flags:#x}");
            assert!(!ring.has_available(m.batch()).unwrap());
        }
        Driver::write_desc(&m, 0, 0x5000, 16, 0, AVAIL);
        assert!(ring.has_available(m.batch()).unwrap());
        assert_eq!(ring.pop(m.batch()).unwrap().unwrap().id, 0);
    }

    /// Every notification decision against the rule it implements: with
    /// EVENT_IDX and RING_EVENT_FLAGS_DESC, notify when the position asked
    /// for is one of those the batch used; otherwise as the flags say.
    #[test]
    fn notifications_follow_the_drivers_event_suppression() {
        let size = 6u16;
        let mut rand = rng(0x5151_7272_abcd_0001);
        for event_idx in [false, true] {
            let m = memory();
            let mut ring = PackedRing::open(&config(size, event_idx), m.batch()).unwrap();
            let mut driver = Driver::new(size);
            for _ in 0..600 {
                while driver.room() > 0 {
                    let n = 1 + u16::try_from(rand(3)).unwrap().min(driver.room() - 1);
                    let bufs = vec![(0x6000u64, 4u32, 0u16); usize::from(n)];
                    driver.add(&m, &bufs);
                }
                let mut popped = vec![];
                while let Some(p) = ring.pop(m.batch()).unwrap() {
                    popped.push((p.id, p.count));
                }
                let k = 1 + usize::try_from(rand(popped.len() as u64)).unwrap();
                let old = ring.next_used();
                let mut used = HashSet::new();
                let mut at = old;
                for &(id, count) in &popped[..k] {
                    ring.push(m.batch(), id, count, 0).unwrap();
                    for _ in 0..count {
                        used.insert(at);
                        at = at.advance(1, size);
                    }
                }
                let flags = u16::try_from(rand(4)).unwrap();
                let event =
                    Position::new(u16::try_from(rand(u64::from(size))).unwrap(), rand(2) == 0);
                let mem = m.batch();
                mem.store_u16(DRIVER_EVENT, event.encode(), Ordering::Relaxed)
                    .unwrap();
                mem.store_u16(DRIVER_EVENT + 2, flags, Ordering::Relaxed)
                    .unwrap();
                let want = match flags {
                    1 => false,
                    2 if event_idx => used.contains(&event),
                    _ => true,
                };
                assert_eq!(
                    ring.publish(mem).unwrap(),
                    want,
                    "{flags} {event:?} {used:?}"
                );
                // What was not completed is completed in the next batch,
                // with notifications off.
                mem.store_u16(DRIVER_EVENT + 2, 1, Ordering::Relaxed)
                    .unwrap();
                for &(id, count) in &popped[k..] {
                    ring.push(m.batch(), id, count, 0).unwrap();
                }
                assert!(!ring.publish(mem).unwrap());
                while driver.get_used(&m).is_some() {}
                assert_eq!(driver.room(), size);
            }
        }
    }

    #[test]
    fn enabling_notifications_writes_the_device_area_and_reports_a_race() {
        for event_idx in [false, true] {
            let m = memory();
            let mut ring = PackedRing::open(&config(4, event_idx), m.batch()).unwrap();
            let mut driver = Driver::new(4);
            let read = |at: u64| -> u16 { m.map().read_obj(GuestAddress(at)).unwrap() };
            let id = driver.add(&m, &[(0x7000, 4, 0), (0x7100, 4, WRITE)]);
            assert_eq!(ring.pop(m.batch()).unwrap().unwrap().id, id);
            ring.disable_notification(m.batch()).unwrap();
            assert_eq!(read(DEVICE_EVENT + 2), 1);
            assert!(!ring.enable_notification(m.batch()).unwrap());
            if event_idx {
                // The next list starts at offset 2 of the first lap.
                assert_eq!(read(DEVICE_EVENT + 2), 2);
                assert_eq!(read(DEVICE_EVENT), 0x8002);
            } else {
                assert_eq!(read(DEVICE_EVENT + 2), 0);
            }
            // A list made available before the re-check is reported.
            driver.add(&m, &[(0x7200, 4, 0)]);
            assert!(ring.enable_notification(m.batch()).unwrap());
        }
    }
}
