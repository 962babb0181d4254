//! The driver side of a virtqueue: split (virtio 1.2, section 2.7) or
//! packed (section 2.8, [`PackedQueue`]), behind one [`Ring`].
//!
//! [`SplitQueue`] plays the role of the guest kernel's `virtio_ring.c`: it
//! owns the descriptor table and the avail ring, reads the used ring, and
//! takes the driver's half of the two notification-suppression handshakes
//! (EVENT_IDX, and the `NO_NOTIFY` / `NO_INTERRUPT` flags). It neither kicks
//! nor waits: [`SplitQueue::publish`] says whether a kick is needed and
//! [`SplitQueue::enable_interrupts`] whether it is safe to wait, and the
//! notification mode of the queue acts on that.
//!
//! Nothing is allocated or locked per request: descriptors come from a free
//! list kept in driver-private memory (never read back from the shared
//! table, which the device could have scribbled on), indirect tables are
//! preallocated per head, and per-head bookkeeping lives in a fixed array.

mod avail;
mod config;
mod error;
mod layout;
mod packed;
pub(crate) mod shared;
#[cfg(test)]
mod tests;
mod used;

use std::sync::atomic::Ordering;

use vm_memory::GuestAddress;

use crate::memory::{DriverMemory, MemoryError};
pub use avail::{NotifyDecision, vring_need_event};
pub use config::{MAX_QUEUE_SIZE, QueueConfig};
pub use error::{DeviceError, QueueError};
pub use layout::DOORBELL_RESERVE;
use layout::{DESC_SIZE, RingLayout};
pub use packed::{MAX_PACKED_SIZE, PackedQueue, UsedFlags};
use shared::SharedWindow;

// Flag values of the virtio specification (checked against virtio-bindings
// in the tests).
const DESC_F_NEXT: u16 = 1;
const DESC_F_WRITE: u16 = 2;
const DESC_F_INDIRECT: u16 = 4;
const USED_F_NO_NOTIFY: u16 = 1;
const AVAIL_F_NO_INTERRUPT: u16 = 1;

/// One buffer of a request: guest-physical address and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buffer {
    /// Guest-physical address of the first byte.
    pub addr: GuestAddress,
    /// Length in bytes.
    pub len: u32,
}

impl Buffer {
    /// The buffer of `len` bytes at `addr`.
    pub fn new(addr: GuestAddress, len: u32) -> Self {
        Self { addr, len }
    }
}

/// A request the device completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Used {
    /// The token given to [`SplitQueue::add`].
    pub token: usize,
    /// Bytes the device reports having written into the device-writable
    /// buffers (validated against their total length).
    pub len: u32,
}

/// Driver-private state of one descriptor that heads a request.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    token: usize,
    /// Total bytes of the device-writable buffers.
    writable: u64,
    /// Last descriptor of the chain (the head itself for an indirect one).
    tail: u16,
    /// Descriptors of the ring the request holds.
    descs: u16,
    in_flight: bool,
}

/// The driver side of a split virtqueue laid out in [`DriverMemory`].
#[derive(Debug)]
pub struct SplitQueue {
    ring: SharedWindow,
    layout: RingLayout,
    ring_gpa: GuestAddress,
    indirect: Option<SharedWindow>,
    indirect_gpa: GuestAddress,
    size: u16,
    event_idx: bool,
    indirect_max: u16,
    /// Free list threaded through driver-private links: `free_next[i]` is
    /// the descriptor after `i`. A request's chain keeps its links while in
    /// flight, so freeing it is one splice, at the tail (`free_chain`).
    free_next: Box<[u16]>,
    free_head: u16,
    /// Last descriptor of the free list (meaningful while it is not empty).
    free_tail: u16,
    num_free: u16,
    slots: Box<[Slot]>,
    in_flight: u16,
    /// Next avail index to fill (the shadow of `avail->idx`).
    avail_idx: u16,
    /// The `avail->idx` last stored in shared memory.
    published_idx: u16,
    /// Next used index to consume.
    last_used: u16,
    /// The `used->idx` last loaded (and validated): entries up to it are
    /// consumed without loading the index again.
    used_seen: u16,
    /// Shadow of the interrupt suppression state.
    interrupts_disabled: bool,
    broken: Option<DeviceError>,
}

impl SplitQueue {
    /// Lays out a queue in `mem`: one page-aligned block with the
    /// descriptor table, the avail and used rings and the doorbell reserve,
    /// and, with indirect descriptors, one table of `indirect_max` entries
    /// per descriptor.
    pub fn new(mem: &mut DriverMemory, config: QueueConfig) -> Result<Self, QueueError> {
        let QueueConfig {
            size,
            event_idx,
            indirect_max,
            ..
        } = config;
        if !size.is_power_of_two() || size > MAX_QUEUE_SIZE {
            return Err(QueueError::InvalidSize { size });
        }
        if indirect_max > size {
            return Err(QueueError::InvalidIndirectMax { indirect_max, size });
        }
        let layout = RingLayout::new(size);
        let ring_gpa = mem.alloc(layout.len(), 4096).map_err(QueueError::Memory)?;
        let ring = SharedWindow::new(mem, ring_gpa, layout.len()).map_err(QueueError::Memory)?;
        let (indirect, indirect_gpa) = if indirect_max > 0 {
            // At most 32768 * 32768 * 16 bytes: fits in 64 bits; checked for
            // 32-bit hosts.
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
            layout,
            ring_gpa,
            indirect,
            indirect_gpa,
            size,
            event_idx,
            indirect_max,
            free_next: vec![0; usize::from(size)].into_boxed_slice(),
            free_head: 0,
            free_tail: 0,
            num_free: 0,
            slots: vec![Slot::default(); usize::from(size)].into_boxed_slice(),
            in_flight: 0,
            avail_idx: 0,
            published_idx: 0,
            last_used: 0,
            used_seen: 0,
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

    /// Guest-physical address of the descriptor table.
    pub fn desc_table(&self) -> GuestAddress {
        self.ring_gpa
    }

    /// Guest-physical address of the avail ring.
    pub fn avail_ring(&self) -> GuestAddress {
        self.gpa_of(self.layout.avail())
    }

    /// Guest-physical address of the used ring.
    pub fn used_ring(&self) -> GuestAddress {
        self.gpa_of(self.layout.used())
    }

    /// Guest-physical address of the [`DOORBELL_RESERVE`] bytes reserved
    /// for the SQ/CQ doorbells, where `sqcq_protocol::doorbell_location` puts them.
    pub fn doorbell_area(&self) -> GuestAddress {
        self.gpa_of(self.layout.doorbells())
    }

    /// The next avail index the driver will publish (the vring base for
    /// `SET_VRING_BASE` after a fresh start is 0).
    pub fn next_avail(&self) -> u16 {
        self.avail_idx
    }

    /// The next used index the driver will consume.
    pub fn last_used(&self) -> u16 {
        self.last_used
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

    fn gpa_of(&self, offset: usize) -> GuestAddress {
        // Offsets lie inside the allocated window, whose end is a valid
        // guest-physical address: no overflow.
        GuestAddress(self.ring_gpa.0 + offset as u64)
    }

    /// Fails every request in flight, calling `on_failed` with each token,
    /// and returns the queue to its initial state (all descriptors free,
    /// indices 0, rings zeroed, interrupts enabled, not broken). For when
    /// the device died or was reset: it must no longer be using the rings.
    pub fn fail_in_flight(&mut self, mut on_failed: impl FnMut(usize)) {
        for slot in self.slots.iter().filter(|slot| slot.in_flight) {
            on_failed(slot.token);
        }
        self.reset();
    }

    fn reset(&mut self) {
        for (i, next) in (1..=self.size).zip(self.free_next.iter_mut()) {
            *next = i;
        }
        self.slots.fill(Slot::default());
        self.free_head = 0;
        self.free_tail = self.size - 1;
        self.num_free = self.size;
        self.in_flight = 0;
        self.avail_idx = 0;
        self.published_idx = 0;
        self.last_used = 0;
        self.used_seen = 0;
        self.interrupts_disabled = false;
        self.broken = None;
        // Relaxed: the device is not using the rings (a precondition), and
        // it learns of them again through vhost-user messages, which order
        // these stores.
        for offset in (0..self.layout.rings_len()).step_by(8) {
            self.ring.u64(offset).store(0, Ordering::Relaxed);
        }
    }
}

/// The driver side of one virtqueue, split or packed
/// (VIRTIO_F_RING_PACKED, [`QueueConfig::packed`]): what the notification
/// modes and the device queues use, the same for both layouts.
#[derive(Debug)]
pub enum Ring {
    /// A split ring.
    Split(SplitQueue),
    /// A packed ring.
    Packed(PackedQueue),
}

/// Forwards a call to the ring of either layout.
macro_rules! either {
    ($ring:expr, $q:ident => $e:expr) => {
        match $ring {
            Ring::Split($q) => $e,
            Ring::Packed($q) => $e,
        }
    };
}

impl Ring {
    /// Lays out a ring of `config`'s layout in `mem`.
    pub fn new(mem: &mut DriverMemory, config: QueueConfig) -> Result<Self, QueueError> {
        if config.packed {
            PackedQueue::new(mem, config).map(Ring::Packed)
        } else {
            SplitQueue::new(mem, config).map(Ring::Split)
        }
    }

    /// The split ring, for what only it has.
    pub fn split(&self) -> Option<&SplitQueue> {
        match self {
            Ring::Split(q) => Some(q),
            Ring::Packed(_) => None,
        }
    }

    /// Whether the ring is packed.
    pub fn is_packed(&self) -> bool {
        matches!(self, Ring::Packed(_))
    }

    /// Queue size (number of descriptors).
    pub fn size(&self) -> u16 {
        either!(self, q => q.size())
    }

    /// Whether EVENT_IDX is in use.
    pub fn event_idx(&self) -> bool {
        either!(self, q => q.event_idx())
    }

    /// Entries per indirect table (0: indirect descriptors unused).
    pub fn indirect_max(&self) -> u16 {
        either!(self, q => q.indirect_max())
    }

    /// Requests added and not yet completed.
    pub fn in_flight(&self) -> u16 {
        either!(self, q => q.in_flight())
    }

    /// Free descriptors.
    pub fn num_free(&self) -> u16 {
        either!(self, q => q.num_free())
    }

    /// The device error that broke the queue, if any.
    pub fn broken(&self) -> Option<&DeviceError> {
        either!(self, q => q.broken())
    }

    /// Guest-physical addresses of the three areas, in the order of
    /// VHOST_USER_SET_VRING_ADDR: descriptor table (ring), available ring
    /// (driver area), used ring (device area).
    pub fn addresses(&self) -> [GuestAddress; 3] {
        match self {
            Ring::Split(q) => [q.desc_table(), q.avail_ring(), q.used_ring()],
            Ring::Packed(q) => [q.desc_ring(), q.driver_area(), q.device_area()],
        }
    }

    /// Guest-physical address of the bytes reserved for the doorbells.
    pub fn doorbell_area(&self) -> GuestAddress {
        either!(self, q => q.doorbell_area())
    }

    /// A packed ring's descriptor flags for another thread (see
    /// [`UsedFlags`]); `None` for a split ring.
    pub fn used_flags(&self, mem: &DriverMemory) -> Option<Result<UsedFlags, MemoryError>> {
        match self {
            Ring::Split(_) => None,
            Ring::Packed(q) => Some(q.used_flags(mem)),
        }
    }

    /// The vring base a device starts this ring at (SET_VRING_BASE): the
    /// next avail index of a split ring; a packed ring's next available
    /// and next used positions (`sqcq_protocol::packed::encode_base`).
    pub fn vring_base(&self) -> u32 {
        match self {
            Ring::Split(q) => u32::from(q.next_avail()),
            Ring::Packed(q) => sqcq_protocol::packed::encode_base(q.next_avail(), q.last_used()),
        }
    }

    /// The vring base a frontend gives a device that replaces one that
    /// died (its in-flight record says the rest): a split ring's used
    /// index, as QEMU does; for a packed ring the used position the
    /// driver reached, as both positions.
    pub fn restart_base(&self) -> u32 {
        match self {
            Ring::Split(q) => u32::from(q.used_index()),
            Ring::Packed(q) => sqcq_protocol::packed::encode_base(q.last_used(), q.last_used()),
        }
    }

    /// Where the driver stands in consuming completions, as a doorbell
    /// names it: the next used index of a split ring, the next used
    /// position of a packed one (spec sections 3.1 and 10.2).
    pub fn last_used(&self) -> u16 {
        match self {
            Ring::Split(q) => q.last_used(),
            Ring::Packed(q) => q.last_used().encode(),
        }
    }

    /// A count of completions for the statistics, wrapping: a split ring's
    /// `used->idx` as the device last stored it; a packed ring has no such
    /// index and counts the completions the driver took.
    pub fn used_index(&self) -> u16 {
        match self {
            Ring::Split(q) => q.used_index(),
            Ring::Packed(q) => q.taken(),
        }
    }

    /// Adds a request (see [`SplitQueue::add`]).
    pub fn add(&mut self, out: &[Buffer], in_: &[Buffer], token: usize) -> Result<u16, QueueError> {
        either!(self, q => q.add(out, in_, token))
    }

    /// Publishes what was added and says whether to notify the device.
    pub fn publish(&mut self) -> NotifyDecision {
        either!(self, q => q.publish())
    }

    /// Publishes what was added without deciding about a notification;
    /// returns what a doorbell's `sq.idx` then holds (the new avail index,
    /// or the next avail position), `None` when nothing was added.
    pub fn publish_index(&mut self) -> Option<u16> {
        match self {
            Ring::Split(q) => q.publish_index(),
            Ring::Packed(q) => q.publish_position().map(|p| p.encode()),
        }
    }

    /// Takes the next completed request, validated.
    pub fn pop_used(&mut self) -> Option<Result<Used, DeviceError>> {
        either!(self, q => q.pop_used())
    }

    /// Whether [`Self::pop_used`] has something to return (a hint).
    pub fn has_used(&self) -> bool {
        either!(self, q => q.has_used())
    }

    /// Asks the device not to interrupt.
    pub fn disable_interrupts(&mut self) {
        either!(self, q => q.disable_interrupts())
    }

    /// Asks the device to interrupt on the next completion; whether one
    /// arrived meanwhile.
    #[must_use]
    pub fn enable_interrupts(&mut self) -> bool {
        either!(self, q => q.enable_interrupts())
    }

    /// Asks the device to interrupt after `count` completions; whether
    /// they arrived meanwhile.
    #[must_use]
    pub fn enable_interrupts_after(&mut self, count: u16) -> bool {
        either!(self, q => q.enable_interrupts_after(count))
    }

    /// Fails every request in flight and resets the ring.
    pub fn fail_in_flight(&mut self, on_failed: impl FnMut(usize)) {
        either!(self, q => q.fail_in_flight(on_failed))
    }
}
