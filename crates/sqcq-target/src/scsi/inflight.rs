//! Requests waiting for the backstore, indexed by their head descriptor.
//!
//! A head index is unique among a queue's in-flight chains (the driver may
//! only reuse it after the device returned it), so it is the backstore tag
//! and the slot index: no allocation, no lookup. Slot buffers grow to the
//! largest request seen and are then reused, so the request path stops
//! allocating after warm-up.
//!
//! Task management functions wait for "everything in flight when the TMF
//! arrived": [`Inflight::begin_drain`] moves the current requests into an
//! old generation, and the TMF completes when that generation is empty,
//! however many new requests arrive meanwhile.

use std::sync::Arc;

use sqcq_backstore::Backstore;
use sqcq_scsi::ScsiError;

use crate::runtime::chain::Segment;
use crate::runtime::events::IoKind;
use crate::runtime::guest::GuestMem;
use crate::runtime::pins::{MapPin, MapPins};

/// What a slot's backstore operations do, for error reporting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// Data from the medium to the initiator.
    Read,
    /// Data from the initiator (or a pattern) to the medium.
    Write,
    /// Flush, unmap: no data transfer.
    Other,
}

/// The kind of a range operation done in slices (see the request module).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangeOp {
    /// Deallocate (UNMAP; WRITE SAME with zeros and UNMAP).
    Discard,
    /// Write zeros (WRITE SAME with zeros).
    WriteZeroes,
    /// Write the replicated pattern (WRITE SAME with data).
    Pattern {
        /// Force unit access.
        fua: bool,
    },
}

/// One request in flight.
pub struct Slot {
    /// The slot holds a request.
    pub busy: bool,
    /// The request belongs to a generation a TMF waits for.
    pub old: bool,
    /// Keeps the guest memory the iovecs point into mapped.
    pub mem: Option<MapPin>,
    /// The request's device-writable buffers (response, data-in).
    pub writable: Vec<Segment>,
    /// Their bytes in all.
    pub writable_len: u64,
    /// Length of the response structure.
    pub resp_len: u64,
    /// Data buffer bytes in the transfer direction (for the residual).
    pub buffer_len: u64,
    /// Bytes the command transfers when it succeeds.
    pub transfer: u64,
    /// Backstore operations not completed yet.
    pub pending_ops: u32,
    /// What the operations do.
    pub kind: OpKind,
    /// First LBA, for sense INFORMATION on failure.
    pub lba: u64,
    /// The LUN.
    pub lun: u16,
    /// What the request does (for events and per-LUN figures).
    pub io: IoKind,
    /// The first failure among the operations.
    pub error: Option<ScsiError>,
    /// That failure came from the Ceph cluster (counted apart).
    pub ceph_failure: bool,
    /// The backstore's words for that failure (for the `io_error` event).
    pub cause: String,
    /// Host iovecs of the data transfer.
    pub iov: Vec<libc::iovec>,
    /// Replicated WRITE SAME pattern, when the pattern is not zeros.
    pub pattern: Vec<u8>,
    /// The backstore of a range operation's LUN (to find its queue again
    /// when the next slice goes out); `None` for other requests.
    pub backstore: Option<Arc<dyn Backstore>>,
    /// Byte ranges (offset, length) of a range operation not yet
    /// submitted, from `next_range` on.
    pub ranges: Vec<(u64, u64)>,
    /// The first range with bytes left.
    pub next_range: usize,
    /// The ranges' bytes in all (per-LUN figures).
    pub range_bytes: u64,
    /// What the ranges are for.
    pub range_op: RangeOp,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("busy", &self.busy)
            .field("kind", &self.kind)
            .field("pending_ops", &self.pending_ops)
            .field(
                "ranges_left",
                &self.ranges.len().saturating_sub(self.next_range),
            )
            .finish_non_exhaustive()
    }
}

impl Slot {
    /// Whether a range operation has slices left to submit.
    pub fn has_slices_left(&self) -> bool {
        self.ranges[self.next_range.min(self.ranges.len())..]
            .iter()
            .any(|r| r.1 > 0)
    }
}

impl Slot {
    fn new() -> Self {
        Slot {
            busy: false,
            old: false,
            mem: None,
            writable: Vec::new(),
            writable_len: 0,
            resp_len: 0,
            buffer_len: 0,
            transfer: 0,
            pending_ops: 0,
            kind: OpKind::Other,
            lba: 0,
            lun: 0,
            io: IoKind::Read,
            error: None,
            ceph_failure: false,
            cause: String::new(),
            iov: Vec::new(),
            pattern: Vec::new(),
            backstore: None,
            ranges: Vec::new(),
            next_range: 0,
            range_bytes: 0,
            range_op: RangeOp::Discard,
        }
    }
}

/// The in-flight table of one queue.
#[derive(Debug)]
pub struct Inflight {
    slots: Vec<Slot>,
    /// The memory maps the slots' `mem` pins hold.
    pins: MapPins,
    current: u32,
    old: u32,
}

impl Inflight {
    /// A table for a queue of `size` descriptors.
    pub fn new(size: u16) -> Self {
        Inflight {
            slots: (0..size).map(|_| Slot::new()).collect(),
            pins: MapPins::default(),
            current: 0,
            old: 0,
        }
    }

    /// Whether `head` is in flight.
    pub fn is_busy(&self, head: u16) -> bool {
        self.slots.get(usize::from(head)).is_some_and(|s| s.busy)
    }

    /// Claims the slot of `head` (which must be free and in range) for a
    /// request whose buffers are in `mem`, which stays mapped until the
    /// slot is released.
    pub fn claim(&mut self, head: u16, mem: &Arc<GuestMem>) -> Option<&mut Slot> {
        let slot = self.slots.get_mut(usize::from(head))?;
        if slot.busy {
            return None;
        }
        slot.busy = true;
        slot.mem = Some(self.pins.pin(mem));
        slot.old = false;
        slot.pending_ops = 0;
        slot.error = None;
        slot.ceph_failure = false;
        slot.writable.clear();
        slot.writable_len = 0;
        slot.iov.clear();
        slot.ranges.clear();
        slot.next_range = 0;
        slot.range_bytes = 0;
        self.current += 1;
        Some(slot)
    }

    /// The slot of a busy `head`.
    pub fn get_mut(&mut self, head: u16) -> Option<&mut Slot> {
        self.slots.get_mut(usize::from(head)).filter(|s| s.busy)
    }

    /// Frees the slot of `head`; returns whether a drain just completed.
    pub fn release(&mut self, head: u16) -> bool {
        let Some(slot) = self.slots.get_mut(usize::from(head)) else {
            return false;
        };
        if !slot.busy {
            return false;
        }
        slot.busy = false;
        if let Some(pin) = slot.mem.take() {
            self.pins.unpin(pin);
        }
        slot.backstore = None;
        if slot.old {
            self.old -= 1;
            self.old == 0
        } else {
            self.current -= 1;
            false
        }
    }

    /// Lets go of the memory maps no request in flight points into.
    pub fn release_idle_maps(&mut self) {
        self.pins.release_idle();
    }

    /// Requests in flight.
    pub fn len(&self) -> u32 {
        self.current + self.old
    }

    /// Whether nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Marks everything in flight as a generation to wait for; returns
    /// whether that generation is already empty.
    pub fn begin_drain(&mut self) -> bool {
        for s in self.slots.iter_mut().filter(|s| s.busy) {
            s.old = true;
        }
        self.old += self.current;
        self.current = 0;
        self.old == 0
    }

    /// Whether no request of a drained generation is left.
    pub fn drained(&self) -> bool {
        self.old == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem() -> Arc<GuestMem> {
        Arc::new(crate::runtime::guest::test_memory(&[(
            vm_memory::GuestAddress(0),
            0x1000,
        )]))
    }

    #[test]
    fn claim_release_and_duplicates() {
        let mut t = Inflight::new(4);
        let (m, next) = (mem(), mem());
        assert!(t.claim(1, &m).is_some());
        assert!(
            t.claim(1, &m).is_none(),
            "a busy head cannot be claimed twice"
        );
        assert!(t.claim(4, &m).is_none(), "out of range");
        assert_eq!(t.len(), 1);
        assert_eq!(Arc::strong_count(&m), 2, "mapped while in flight");
        t.release(1);
        assert!(t.is_empty());
        assert!(!t.release(1), "a free slot is released once");
        assert!(t.claim(2, &next).is_some());
        assert_eq!(Arc::strong_count(&m), 1, "a replaced map goes once idle");
        assert_eq!(Arc::strong_count(&next), 2);
    }

    #[test]
    fn drain_waits_for_the_old_generation_only() {
        let mut t = Inflight::new(4);
        let m = mem();
        t.claim(0, &m);
        assert!(!t.begin_drain());
        t.claim(1, &m);
        assert!(!t.release(1), "a new request does not end the drain");
        assert!(!t.drained());
        assert!(t.release(0));
        assert!(t.drained());
        assert!(t.begin_drain(), "nothing in flight: drained at once");
    }
}
