//! The driver side of a packed virtqueue (virtio 1.2, section 2.8).
//!
//! [`PackedQueue`] plays the role of Linux's `virtqueue_*_packed`: it
//! writes lists into the descriptor ring, reads the used descriptors the
//! device writes over them, and takes the driver's half of the two event
//! suppression structures. Its interface is [`SplitQueue`](super::SplitQueue)'s,
//! so that the notification modes run either through [`Ring`](super::Ring).
//!
//! As in the split queue, nothing is visible to the device before
//! [`PackedQueue::publish`]: the flags of the first descriptor of the
//! first list added since the last publication are held back and stored
//! last, with `Release`, so a batch appears at once; lists after the first
//! are made available as they are added (the device reads the ring in
//! order and cannot reach them before that first one). Buffer IDs come
//! from a free list in driver-private memory, and a request of 2 to
//! `indirect_max` buffers uses its ID's preallocated indirect table and one
//! descriptor of the ring.
//!
//! ```text
//! 0                 descriptor ring     16 * N
//! driver area       event suppression   4
//! device area (128-aligned)  event suppression   4
//! doorbells (device area + 128, spec section 10.1)   128 reserved
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering, fence};

use sqcq_protocol::packed::Position;
use vm_memory::GuestAddress;

use super::avail::{Checked, check_request};
use super::layout::DESC_SIZE;
use super::shared::SharedWindow;
use super::{
    Buffer, DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_WRITE, DeviceError, NotifyDecision, QueueConfig,
    QueueError, Used,
};
use crate::memory::{DriverMemory, MemoryError};

/// VRING_PACKED_DESC_F_AVAIL.
const AVAIL: u16 = 1 << 7;
/// VRING_PACKED_DESC_F_USED.
const USED: u16 = 1 << 15;
/// Whether a descriptor whose flags are `flags` is used on the lap of
/// `at`: its AVAIL and USED flags both equal that lap's wrap counter.
fn is_used(flags: u16, at: Position) -> bool {
    (flags & AVAIL != 0) == at.wrap() && (flags & USED != 0) == at.wrap()
}

/// A packed ring's used side as a thread other than its owner sees it: a
/// driver poll thread, whose re-check before it sleeps (spec section
/// 10.3) looks at the descriptor where the owner will take its next used
/// one. Reads only; the owner stores its position at every take.
#[derive(Debug)]
pub struct UsedFlags {
    ring: SharedWindow,
    size: u16,
    position: Arc<AtomicU16>,
}

impl UsedFlags {
    /// Whether the descriptor at the owner's next used position is used.
    /// A position read before the owner's latest take names a descriptor
    /// it took (used: a spurious yes) or made available again (not used):
    /// an owner about to sleep looks at its ring itself after its own
    /// fence, which covers the second case.
    pub fn used_pending(&self) -> bool {
        // Acquire: pairs with the owner's Release store in `pop_used`.
        let at = self.position.load(Ordering::Acquire);
        self.used_at(at, Ordering::Acquire)
    }

    /// Whether the descriptor at the encoded position `at` is used (false
    /// for a value that names no position of the ring).
    pub fn used_at(&self, at: u16, order: Ordering) -> bool {
        Position::decode(at, self.size).is_some_and(|at| {
            let flags = self
                .ring
                .u16(PackedQueue::desc_offset(at.off()) + 14)
                .load(order);
            is_used(u16::from_le(flags), at)
        })
    }
}

/// VRING_PACKED_EVENT_FLAG_ENABLE, _DISABLE and _DESC.
const EVENT_ENABLE: u16 = 0;
const EVENT_DISABLE: u16 = 1;
const EVENT_DESC: u16 = 2;
/// Bytes from the device area to the doorbells (spec section 10.1: the
/// device area starts a 128-byte aligned block).
const DOORBELL_OFFSET: usize = 128;
/// Bytes reserved for the doorbells.
const DOORBELL_RESERVE: usize = 128;

/// The largest packed queue (2^15 entries).
pub const MAX_PACKED_SIZE: u16 = 1 << 15;

/// Driver-private state of one buffer ID.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    token: usize,
    /// Total bytes of the device-writable buffers.
    writable: u64,
    /// Descriptors of the ring the request holds.
    descs: u16,
    in_flight: bool,
}

/// The driver side of a packed virtqueue laid out in [`DriverMemory`].
#[derive(Debug)]
pub struct PackedQueue {
    ring: SharedWindow,
    ring_gpa: GuestAddress,
    /// Offsets of the driver and device areas in the window.
    driver_area: usize,
    device_area: usize,
    indirect: Option<SharedWindow>,
    indirect_gpa: GuestAddress,
    size: u16,
    event_idx: bool,
    indirect_max: u16,
    /// Free buffer IDs, oldest freed first out (FIFO, as the split queue's
    /// descriptors): `free_ids[free_head..free_head + num_ids]`, circular.
    free_ids: Box<[u16]>,
    free_head: u16,
    num_ids: u16,
    slots: Box<[Slot]>,
    /// Free descriptors of the ring.
    num_free: u16,
    in_flight: u16,
    /// Next position to write a descriptor to.
    avail: Position,
    /// The position at the last publication.
    published: Position,
    /// The first list added since the last publication: the offset of its
    /// first descriptor and the flags still to be stored there.
    held: Option<(u16, u16)>,
    /// Next position to read a used descriptor from.
    used: Position,
    /// `used`, encoded, for [`UsedFlags`].
    shared_used: Arc<AtomicU16>,
    /// Completions taken, wrapping (for the statistics).
    taken: u16,
    interrupts_disabled: bool,
    broken: Option<DeviceError>,
}

impl PackedQueue {
    /// Lays out a queue in `mem`: one page-aligned block with the
    /// descriptor ring, the two event suppression structures and the
    /// doorbell reserve, and, with indirect descriptors, one table of
    /// `indirect_max` entries per buffer ID.
    pub fn new(mem: &mut DriverMemory, config: QueueConfig) -> Result<Self, QueueError> {
        let QueueConfig {
            size,
            event_idx,
            indirect_max,
            ..
        } = config;
        if size == 0 || size > MAX_PACKED_SIZE {
            return Err(QueueError::InvalidSize { size });
        }
        if indirect_max > size {
            return Err(QueueError::InvalidIndirectMax { indirect_max, size });
        }
        let driver_area = usize::from(size) * DESC_SIZE;
        let device_area = (driver_area + 4).next_multiple_of(128);
        let len = device_area + DOORBELL_OFFSET + DOORBELL_RESERVE;
        let ring_gpa = mem.alloc(len, 4096).map_err(QueueError::Memory)?;
        let ring = SharedWindow::new(mem, ring_gpa, len).map_err(QueueError::Memory)?;
        let (indirect, indirect_gpa) = if indirect_max > 0 {
            let len = (usize::from(size) * DESC_SIZE)
                .checked_mul(usize::from(indirect_max))
                .ok_or(QueueError::Memory(MemoryError::OutOfMemory {
                    len: usize::MAX,
                    align: DESC_SIZE as u64,
                    free: mem.free_bytes(),
                }))?;
            let gpa = mem
                .alloc(len, DESC_SIZE as u64)
                .map_err(QueueError::Memory)?;
            let window = SharedWindow::new(mem, gpa, len).map_err(QueueError::Memory)?;
            (Some(window), gpa)
        } else {
            (None, GuestAddress(0))
        };
        let mut queue = Self {
            ring,
            ring_gpa,
            driver_area,
            device_area,
            indirect,
            indirect_gpa,
            size,
            event_idx,
            indirect_max,
            free_ids: vec![0; usize::from(size)].into_boxed_slice(),
            free_head: 0,
            num_ids: 0,
            slots: vec![Slot::default(); usize::from(size)].into_boxed_slice(),
            num_free: 0,
            in_flight: 0,
            avail: Position::START,
            published: Position::START,
            held: None,
            used: Position::START,
            shared_used: Arc::new(AtomicU16::new(Position::START.encode())),
            taken: 0,
            interrupts_disabled: false,
            broken: None,
        };
        queue.reset();
        Ok(queue)
    }

    /// Queue size (number of descriptors).
    pub fn size(&self) -> u16 {
        self.size
    }

    /// Whether EVENT_IDX is in use.
    pub fn event_idx(&self) -> bool {
        self.event_idx
    }

    /// Entries per indirect table (0: indirect descriptors unused).
    pub fn indirect_max(&self) -> u16 {
        self.indirect_max
    }

    /// Guest-physical address of the descriptor ring.
    pub fn desc_ring(&self) -> GuestAddress {
        self.ring_gpa
    }

    /// Guest-physical address of the driver area (the driver's event
    /// suppression structure).
    pub fn driver_area(&self) -> GuestAddress {
        GuestAddress(self.ring_gpa.0 + self.driver_area as u64)
    }

    /// Guest-physical address of the device area (the device's event
    /// suppression structure).
    pub fn device_area(&self) -> GuestAddress {
        GuestAddress(self.ring_gpa.0 + self.device_area as u64)
    }

    /// Guest-physical address of the bytes reserved for the doorbells
    /// (spec section 10.1).
    pub fn doorbell_area(&self) -> GuestAddress {
        GuestAddress(self.ring_gpa.0 + (self.device_area + DOORBELL_OFFSET) as u64)
    }

    /// The next position the driver will make available.
    pub fn next_avail(&self) -> Position {
        self.avail
    }

    /// The next position the driver will read a used descriptor from.
    pub fn last_used(&self) -> Position {
        self.used
    }

    /// Requests added and not yet completed (published or not).
    pub fn in_flight(&self) -> u16 {
        self.in_flight
    }

    /// Free descriptors.
    pub fn num_free(&self) -> u16 {
        self.num_free
    }

    /// The device error that broke the queue, if any.
    pub fn broken(&self) -> Option<&DeviceError> {
        self.broken.as_ref()
    }

    fn desc_offset(off: u16) -> usize {
        usize::from(off) * DESC_SIZE
    }

    fn flags_at(&self, off: u16, order: Ordering) -> u16 {
        u16::from_le(self.ring.u16(Self::desc_offset(off) + 14).load(order))
    }

    /// Adds a request: device-readable `out` buffers, then device-writable
    /// `in_` buffers, to be reported back with `token`. Not visible to the
    /// device before [`Self::publish`]. Returns its buffer ID.
    pub fn add(&mut self, out: &[Buffer], in_: &[Buffer], token: usize) -> Result<u16, QueueError> {
        let Checked { len, writable } = check_request(self.broken.as_ref(), out, in_, self.size)?;
        let indirect = if len > 1 && len <= self.indirect_max {
            self.indirect.as_ref()
        } else {
            None
        };
        let needed = if indirect.is_some() { 1 } else { len };
        if needed > self.num_free || self.num_ids == 0 {
            return Err(QueueError::NoFreeDescriptors {
                needed,
                free: self.num_free,
            });
        }
        let id = self.free_ids[usize::from(self.free_head)];
        self.free_head = (self.free_head + 1) % self.size;
        self.num_ids -= 1;
        let buffers = out
            .iter()
            .map(|b| (b, 0))
            .chain(in_.iter().map(|b| (b, DESC_F_WRITE)));
        let first = self.avail;
        // The wrap bits of a descriptor made available on the lap `wrap`.
        let marks = |wrap: bool| if wrap { AVAIL } else { USED };
        let first_flags = match indirect {
            Some(tables) => {
                // id < size, so the table lies inside the window.
                let table = usize::from(id) * usize::from(self.indirect_max) * DESC_SIZE;
                for (i, (buf, flags)) in (0..len).zip(buffers) {
                    let offset = table + usize::from(i) * DESC_SIZE;
                    write_desc(tables, offset, buf.addr.0, buf.len, 0, flags);
                }
                let table_gpa = self.indirect_gpa.0 + table as u64;
                let flags = DESC_F_INDIRECT | marks(first.wrap());
                self.write_ring_desc(first.off(), table_gpa, u32::from(len) * 16, id, None);
                self.avail = self.avail.advance(1, self.size);
                flags
            }
            None => {
                let mut first_flags = 0;
                for (i, (buf, flags)) in (0..len).zip(buffers) {
                    let at = self.avail;
                    let mut flags = flags | marks(at.wrap());
                    if i + 1 < len {
                        flags |= DESC_F_NEXT;
                    }
                    if i == 0 {
                        first_flags = flags;
                        self.write_ring_desc(at.off(), buf.addr.0, buf.len, id, None);
                    } else {
                        self.write_ring_desc(at.off(), buf.addr.0, buf.len, id, Some(flags));
                    }
                    self.avail = self.avail.advance(1, self.size);
                }
                first_flags
            }
        };
        if self.held.is_none() {
            self.held = Some((first.off(), first_flags));
        } else {
            // Release: the list's descriptors before its first flags; the
            // device reaches it only after the held first list anyway.
            self.ring
                .u16(Self::desc_offset(first.off()) + 14)
                .store(first_flags.to_le(), Ordering::Release);
        }
        self.num_free -= needed;
        self.in_flight += 1;
        self.slots[usize::from(id)] = Slot {
            token,
            writable,
            descs: needed,
            in_flight: true,
        };
        Ok(id)
    }

    /// Writes the descriptor at `off`: address, length and ID, and its
    /// flags unless they are to be stored later (`None`).
    fn write_ring_desc(&self, off: u16, addr: u64, len: u32, id: u16, flags: Option<u16>) {
        let at = Self::desc_offset(off);
        let desc = self.ring.words(at, 2);
        // Relaxed: the descriptor reaches the device through the Release
        // store of the flags that make its list available.
        desc[0].store(addr.to_le(), Ordering::Relaxed);
        match flags {
            Some(flags) => {
                let rest = u64::from(len) | u64::from(id) << 32 | u64::from(flags) << 48;
                desc[1].store(rest.to_le(), Ordering::Relaxed);
            }
            None => {
                self.ring.u32(at + 8).store(len.to_le(), Ordering::Relaxed);
                self.ring.u16(at + 12).store(id.to_le(), Ordering::Relaxed);
            }
        }
    }

    /// Makes every request added since the last call visible to the device
    /// (the held flags, stored last) and says whether to notify it, as its
    /// event suppression structure asks.
    pub fn publish(&mut self) -> NotifyDecision {
        let old = self.published;
        if !self.publish_flags() {
            return NotifyDecision::Suppressed;
        }
        let new = self.avail;
        // SeqCst: the flags store before the load of the device's event
        // suppression structure; pairs with the device's fence between
        // writing it and re-reading the ring (its `enable_notification`),
        // as Linux `virtqueue_kick_prepare_packed`'s virtio_mb.
        fence(Ordering::SeqCst);
        let event = self.ring.u32(self.device_area).load(Ordering::Relaxed);
        let [o0, o1, f0, f1] = u32::from_le(event).to_le_bytes();
        let kick = match u16::from_le_bytes([f0, f1]) & 3 {
            EVENT_DISABLE => false,
            EVENT_DESC if self.event_idx => {
                // Notify when the position asked for is among those just
                // made available; one outside the ring asks for every one.
                Position::decode(u16::from_le_bytes([o0, o1]), self.size)
                    .is_none_or(|at| old.ahead(at, self.size) < old.ahead(new, self.size))
            }
            _ => true,
        };
        if kick {
            NotifyDecision::Kick
        } else {
            NotifyDecision::Suppressed
        }
    }

    /// Completions taken so far, wrapping.
    pub fn taken(&self) -> u16 {
        self.taken
    }

    /// Makes every request added since the last call visible without
    /// deciding about a notification; returns the next avail position
    /// (what a packed ring's `sq.idx` holds, spec section 10.2), `None`
    /// when nothing was added.
    pub fn publish_position(&mut self) -> Option<Position> {
        self.publish_flags().then_some(self.avail)
    }

    /// Stores the held flags; whether anything was added since the last
    /// publication.
    fn publish_flags(&mut self) -> bool {
        let Some((off, flags)) = self.held.take() else {
            return false;
        };
        // Release: pairs with the device's Acquire load of these flags, so
        // every descriptor of the batch (and the other lists' flags) are
        // visible before the first list is.
        self.ring
            .u16(Self::desc_offset(off) + 14)
            .store(flags.to_le(), Ordering::Release);
        self.published = self.avail;
        true
    }

    /// Whether the descriptor at `at` is used on the lap `at` is on.
    fn used_at(&self, at: Position, order: Ordering) -> bool {
        is_used(self.flags_at(at.off(), order), at)
    }

    /// A view of the descriptor flags for another thread (see
    /// [`UsedFlags`]).
    pub fn used_flags(&self, mem: &DriverMemory) -> Result<UsedFlags, MemoryError> {
        let len = usize::from(self.size) * DESC_SIZE;
        Ok(UsedFlags {
            ring: SharedWindow::new(mem, self.ring_gpa, len)?,
            size: self.size,
            position: Arc::clone(&self.shared_used),
        })
    }

    /// Takes the next completed request off the ring, validating it:
    /// `None` when there is none, an error when the device is broken or
    /// hostile.
    pub fn pop_used(&mut self) -> Option<Result<Used, DeviceError>> {
        if let Some(e) = &self.broken {
            return Some(Err(e.clone()));
        }
        // Acquire: pairs with the device's Release store of these flags,
        // making the descriptor's ID and length visible.
        if !self.used_at(self.used, Ordering::Acquire) {
            return None;
        }
        let at = Self::desc_offset(self.used.off());
        let len = u32::from_le(self.ring.u32(at + 8).load(Ordering::Relaxed));
        let id = u16::from_le(self.ring.u16(at + 12).load(Ordering::Relaxed));
        let Some(slot) = self.slots.get(usize::from(id)).copied() else {
            return Some(Err(self.break_queue(DeviceError::UnknownId {
                id: u32::from(id),
                size: self.size,
            })));
        };
        if !slot.in_flight {
            return Some(Err(self.break_queue(DeviceError::NotInFlight { id })));
        }
        if u64::from(len) > slot.writable {
            return Some(Err(self.break_queue(DeviceError::LengthTooLong {
                id,
                len,
                max: slot.writable,
            })));
        }
        self.used = self.used.advance(slot.descs, self.size);
        // Release: a reader of the position sees this take done.
        self.shared_used
            .store(self.used.encode(), Ordering::Release);
        self.slots[usize::from(id)].in_flight = false;
        let tail = (self.free_head + self.num_ids) % self.size;
        self.free_ids[usize::from(tail)] = id;
        self.num_ids += 1;
        self.num_free += slot.descs;
        self.in_flight -= 1;
        self.taken = self.taken.wrapping_add(1);
        Some(Ok(Used {
            token: slot.token,
            len,
        }))
    }

    /// Whether [`Self::pop_used`] has something to return. A cheap check
    /// for polling loops; it validates nothing.
    pub fn has_used(&self) -> bool {
        // Relaxed: a hint; `pop_used` loads the flags again with Acquire.
        self.broken.is_some() || self.used_at(self.used, Ordering::Relaxed)
    }

    fn break_queue(&mut self, error: DeviceError) -> DeviceError {
        self.broken = Some(error.clone());
        error
    }

    /// Asks the device not to interrupt on completions (a hint).
    pub fn disable_interrupts(&mut self) {
        if self.interrupts_disabled {
            return;
        }
        self.interrupts_disabled = true;
        // Relaxed: suppression is best effort.
        self.ring
            .u16(self.driver_area + 2)
            .store(EVENT_DISABLE.to_le(), Ordering::Relaxed);
    }

    /// Asks the device to interrupt on the next completion; returns
    /// whether one arrived meanwhile (consume it instead of waiting).
    #[must_use]
    pub fn enable_interrupts(&mut self) -> bool {
        self.enable_interrupts_after(1)
    }

    /// Like [`Self::enable_interrupts`], but with EVENT_IDX asks for the
    /// interrupt only once `count` more requests have completed (clamped to
    /// 1..=[`Self::in_flight`]), counted in descriptors from the next used
    /// position: a request of several descriptors brings it sooner, never
    /// later, so the interrupt always comes. Returns whether the used
    /// descriptor it waits for is there already.
    #[must_use]
    pub fn enable_interrupts_after(&mut self, count: u16) -> bool {
        self.interrupts_disabled = false;
        let count = if self.event_idx {
            count.clamp(1, self.in_flight.max(1))
        } else {
            1
        };
        let event = self.used.advance(count - 1, self.size);
        // Relaxed: ordered before the re-check by the fence below.
        if self.event_idx {
            self.ring
                .u16(self.driver_area)
                .store(event.encode().to_le(), Ordering::Relaxed);
            self.ring
                .u16(self.driver_area + 2)
                .store(EVENT_DESC.to_le(), Ordering::Relaxed);
        } else {
            self.ring
                .u16(self.driver_area + 2)
                .store(EVENT_ENABLE.to_le(), Ordering::Relaxed);
        }
        // SeqCst: the store above before the re-check; pairs with the
        // device's fence between making used descriptors visible and
        // reading this structure, so either it interrupts or we see them.
        fence(Ordering::SeqCst);
        self.completed(count)
    }

    /// Whether `count` requests have completed past the next used
    /// position (walking their used descriptors, without taking them).
    fn completed(&self, count: u16) -> bool {
        let mut at = self.used;
        for _ in 0..count {
            if !self.used_at(at, Ordering::Relaxed) {
                return false;
            }
            let id = u16::from_le(
                self.ring
                    .u16(Self::desc_offset(at.off()) + 12)
                    .load(Ordering::Relaxed),
            );
            match self.slots.get(usize::from(id)) {
                Some(slot) if slot.in_flight => at = at.advance(slot.descs, self.size),
                // Something `pop_used` will report.
                _ => return true,
            }
        }
        true
    }

    /// Fails every request in flight, calling `on_failed` with each token,
    /// and returns the queue to its initial state. For when the device
    /// died or was reset: it must no longer be using the ring.
    pub fn fail_in_flight(&mut self, mut on_failed: impl FnMut(usize)) {
        for slot in self.slots.iter().filter(|slot| slot.in_flight) {
            on_failed(slot.token);
        }
        self.reset();
    }

    fn reset(&mut self) {
        for (i, id) in (0..self.size).zip(self.free_ids.iter_mut()) {
            *id = i;
        }
        self.free_head = 0;
        self.num_ids = self.size;
        self.slots.fill(Slot::default());
        self.num_free = self.size;
        self.in_flight = 0;
        self.avail = Position::START;
        self.published = Position::START;
        self.held = None;
        self.used = Position::START;
        self.shared_used
            .store(Position::START.encode(), Ordering::Relaxed);
        self.taken = 0;
        self.interrupts_disabled = false;
        self.broken = None;
        // Relaxed: the device is not using the ring (a precondition), and
        // learns of it again through vhost-user messages, which order
        // these stores. The descriptor ring starts zeroed (2.8.10), the
        // event structures enabled.
        for offset in (0..self.device_area + 8).step_by(8) {
            self.ring.u64(offset).store(0, Ordering::Relaxed);
        }
    }
}

/// Writes one descriptor of an indirect table at byte `offset` of
/// `window`.
fn write_desc(window: &SharedWindow, offset: usize, addr: u64, len: u32, id: u16, flags: u16) {
    let desc = window.words(offset, 2);
    let rest = u64::from(len) | u64::from(id) << 32 | u64::from(flags) << 48;
    // Relaxed: reaches the device through the Release store of the flags
    // that make the list available.
    desc[0].store(addr.to_le(), Ordering::Relaxed);
    desc[1].store(rest.to_le(), Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use vm_memory::Bytes;

    use super::*;

    /// A device of the specification's rules, over the queue's memory:
    /// takes every available list in order, and writes used descriptors.
    struct Device {
        ring: GuestAddress,
        size: u16,
        avail: Position,
        used: Position,
        /// Lists taken: (buffer ID, descriptors).
        taken: Vec<(u16, u16)>,
    }

    impl Device {
        fn new(q: &PackedQueue) -> Self {
            Device {
                ring: q.desc_ring(),
                size: q.size(),
                avail: Position::START,
                used: Position::START,
                taken: Vec::new(),
            }
        }

        fn desc(&self, mem: &DriverMemory, off: u16) -> [u8; 16] {
            let mut d = [0u8; 16];
            mem.guest_memory()
                .read_slice(&mut d, GuestAddress(self.ring.0 + 16 * u64::from(off)))
                .unwrap();
            d
        }

        fn take(&mut self, mem: &DriverMemory) {
            loop {
                let d = self.desc(mem, self.avail.off());
                let flags = u16::from_le_bytes([d[14], d[15]]);
                let w = self.avail.wrap();
                if (flags & AVAIL != 0) != w || (flags & USED != 0) == w {
                    return;
                }
                let mut count = 1;
                let mut last = d;
                while u16::from_le_bytes([last[14], last[15]]) & DESC_F_NEXT != 0 {
                    last = self.desc(mem, self.avail.advance(count, self.size).off());
                    count += 1;
                }
                self.taken
                    .push((u16::from_le_bytes([last[12], last[13]]), count));
                self.avail = self.avail.advance(count, self.size);
            }
        }

        /// Writes a used descriptor for `id` with `len`, `count` long.
        fn write_used(&mut self, mem: &DriverMemory, id: u16, count: u16, len: u32) {
            let at = self.ring.0 + 16 * u64::from(self.used.off());
            let flags: u16 = if self.used.wrap() { AVAIL | USED } else { 0 };
            let g = mem.guest_memory();
            g.write_obj(len.to_le(), GuestAddress(at + 8)).unwrap();
            g.write_obj(id.to_le(), GuestAddress(at + 12)).unwrap();
            g.write_obj(flags.to_le(), GuestAddress(at + 14)).unwrap();
            self.used = self.used.advance(count, self.size);
        }
    }

    fn queue(mem: &mut DriverMemory, size: u16, indirect_max: u16) -> PackedQueue {
        PackedQueue::new(
            mem,
            QueueConfig {
                size,
                event_idx: false,
                indirect_max,
                packed: true,
            },
        )
        .unwrap()
    }

    fn buf(addr: u64, len: u32) -> Buffer {
        Buffer::new(GuestAddress(addr), len)
    }

    /// Lists of 1 to 3 buffers over many laps of a ring of 5, direct and
    /// indirect, completed in reverse order: each token comes back once
    /// with its length, and nothing is visible before `publish`.
    #[test]
    fn requests_go_round_many_laps_and_complete_out_of_order() {
        for indirect_max in [0, 3] {
            let mut mem = DriverMemory::new(1 << 20).unwrap();
            let mut q = queue(&mut mem, 5, indirect_max);
            let mut dev = Device::new(&q);
            let mut token = 0;
            for round in 0..60 {
                let mut added = Vec::new();
                loop {
                    let n = 1 + round % 3;
                    let bufs: Vec<Buffer> = (0..n).map(|i| buf(0x8000 + i * 64, 64)).collect();
                    let (out, in_) = bufs.split_at(bufs.len() - 1);
                    match q.add(out, in_, token) {
                        Ok(id) => added.push((id, token)),
                        Err(QueueError::NoFreeDescriptors { .. }) => break,
                        Err(e) => panic!("{e}"),
                    }
                    token += 1;
                }
                dev.take(&mem);
                assert!(dev.taken.is_empty(), "visible before publish");
                let _ = q.publish();
                dev.take(&mem);
                assert_eq!(dev.taken.len(), added.len(), "round {round}");
                let taken = std::mem::take(&mut dev.taken);
                for &(id, count) in taken.iter().rev() {
                    dev.write_used(&mem, id, count, u32::from(id));
                }
                let mut back = Vec::new();
                while let Some(u) = q.pop_used() {
                    back.push(u.unwrap());
                }
                assert_eq!(back.len(), added.len());
                for u in back {
                    let (id, _) = added.iter().find(|&&(_, t)| t == u.token).unwrap();
                    assert_eq!(u.len, u32::from(*id));
                }
                assert_eq!(q.in_flight(), 0);
                assert_eq!(q.num_free(), 5);
            }
        }
    }

    /// A hostile device: an ID beyond the ring, an ID not in flight, a
    /// length beyond the writable buffers each break the queue with their
    /// error, never index anything.
    #[test]
    fn a_used_descriptor_that_makes_no_sense_breaks_the_queue() {
        for (bad_id, bad_len, want) in [
            (9u16, 0u32, "unknown"),
            (3, 0, "not in flight"),
            (0, 65, "too long"),
        ] {
            let mut mem = DriverMemory::new(1 << 20).unwrap();
            let mut q = queue(&mut mem, 4, 0);
            let mut dev = Device::new(&q);
            let id = q.add(&[], &[buf(0x8000, 64)], 7).unwrap();
            assert_eq!(id, 0);
            let _ = q.publish();
            dev.take(&mem);
            dev.write_used(&mem, bad_id, 1, bad_len);
            let e = q.pop_used().unwrap().unwrap_err();
            match (want, &e) {
                ("unknown", DeviceError::UnknownId { .. })
                | ("not in flight", DeviceError::NotInFlight { .. })
                | ("too long", DeviceError::LengthTooLong { .. }) => {}
                _ => panic!("{want}: {e:?}"),
            }
            assert!(q.broken().is_some());
            assert!(matches!(
                q.add(&[], &[buf(0x8000, 8)], 8),
                Err(QueueError::Broken(_))
            ));
        }
    }

    /// With notifications enabled the device's event suppression decides:
    /// DISABLE suppresses the kick, ENABLE asks for it.
    #[test]
    fn the_devices_event_suppression_decides_the_kick() {
        let mut mem = DriverMemory::new(1 << 20).unwrap();
        let mut q = queue(&mut mem, 4, 0);
        let device = q.device_area();
        for (flags, kick) in [(EVENT_DISABLE, false), (EVENT_ENABLE, true)] {
            mem.guest_memory()
                .write_obj(flags.to_le(), GuestAddress(device.0 + 2))
                .unwrap();
            q.add(&[], &[buf(0x8000, 8)], 1).unwrap();
            assert_eq!(q.publish().needs_kick(), kick);
        }
        assert_eq!(q.publish(), NotifyDecision::Suppressed, "nothing new");
    }
}
