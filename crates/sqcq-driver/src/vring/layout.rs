//! Where the parts of a split virtqueue lie in its shared window.
//!
//! ```text
//! 0                descriptor table   16 * N
//! avail            flags, idx, ring[N], used_event        6 + 2 * N
//! used (64-aligned) flags, idx, ring[N], avail_event       6 + 8 * N
//! doorbells (sqcq_protocol::doorbell_location: 128-aligned)  128 reserved
//! ```
//!
//! The window starts page-aligned, so offsets aligned here are aligned in
//! guest-physical and host-virtual terms alike. The used ring starts on its
//! own cache line so that the driver-written avail ring and the
//! device-written used ring do not share one.

/// Bytes reserved after the used ring for the SQ/CQ doorbells.
pub const DOORBELL_RESERVE: usize = 128;
const DOORBELL_AREA_ALIGN: usize = 128;
const _: () = assert!(DOORBELL_RESERVE as u64 == layout::DOORBELL_AREA_SIZE);
const _: () = assert!(DOORBELL_AREA_ALIGN as u64 == layout::DOORBELL_AREA_ALIGN);

use sqcq_protocol::layout;

use crate::memory::CACHE_LINE;

/// Bytes of one descriptor (in the table and in indirect tables).
pub(crate) const DESC_SIZE: usize = 16;
const RING_HEADER: usize = 4;
const USED_ELEM_SIZE: usize = 8;

/// Byte offsets, from the start of the window, of every shared field of a
/// queue of `size` entries. With `size <= 32768` every offset is below
/// 1 MiB, so none of the arithmetic below can overflow.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RingLayout {
    size: usize,
    avail: usize,
    used: usize,
    doorbells: usize,
}

impl RingLayout {
    pub(crate) fn new(size: u16) -> Self {
        let size = usize::from(size);
        let avail = DESC_SIZE * size;
        let used = (avail + RING_HEADER + 2 * size + 2).next_multiple_of(CACHE_LINE);
        // Where `sqcq_protocol::doorbell_location` puts them; the window is
        // page-aligned, so aligning the offset aligns the address.
        let doorbells =
            (used + RING_HEADER + USED_ELEM_SIZE * size + 2).next_multiple_of(DOORBELL_AREA_ALIGN);
        Self {
            size,
            avail,
            used,
            doorbells,
        }
    }

    /// Bytes of the whole window, doorbell reserve included.
    pub(crate) fn len(&self) -> usize {
        self.doorbells + DOORBELL_RESERVE
    }

    /// Bytes of the rings proper (descriptor table, avail and used rings).
    pub(crate) fn rings_len(&self) -> usize {
        self.doorbells
    }

    /// Descriptor `index` (its `addr`; `len` at +8, `flags` +12, `next` +14).
    pub(crate) fn desc(index: u16) -> usize {
        DESC_SIZE * usize::from(index)
    }

    pub(crate) fn avail(&self) -> usize {
        self.avail
    }

    pub(crate) fn avail_flags(&self) -> usize {
        self.avail
    }

    pub(crate) fn avail_idx(&self) -> usize {
        self.avail + 2
    }

    /// Entry `slot` (already reduced modulo the size) of the avail ring.
    pub(crate) fn avail_entry(&self, slot: u16) -> usize {
        self.avail + RING_HEADER + 2 * usize::from(slot)
    }

    pub(crate) fn used_event(&self) -> usize {
        self.avail + RING_HEADER + 2 * self.size
    }

    pub(crate) fn used(&self) -> usize {
        self.used
    }

    pub(crate) fn used_flags(&self) -> usize {
        self.used
    }

    pub(crate) fn used_idx(&self) -> usize {
        self.used + 2
    }

    /// Element `slot` (already reduced modulo the size) of the used ring
    /// (its `id`; `len` at +4).
    pub(crate) fn used_elem(&self, slot: u16) -> usize {
        self.used + RING_HEADER + USED_ELEM_SIZE * usize::from(slot)
    }

    pub(crate) fn avail_event(&self) -> usize {
        self.used + RING_HEADER + USED_ELEM_SIZE * self.size
    }

    pub(crate) fn doorbells(&self) -> usize {
        self.doorbells
    }
}
