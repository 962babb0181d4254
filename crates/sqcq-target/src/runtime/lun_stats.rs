//! Per-LUN I/O figures: operations, bytes, errors and service time by
//! kind of operation (read, write, flush, discard, write zeroes), what
//! SPDK's `bdev_get_iostat` and QEMU's `query-blockstats` give per disk.
//!
//! Each request queue counts into a slot of its own ([`LunSlot`], one
//! cache line apart from the others), written only by the worker that
//! runs the queue: a count is a relaxed load and store, no atomic
//! read-modify-write and no line shared between workers on the request
//! path. Readers (`stats_get`, the metrics endpoint) add the slots up.
//! A queue that moves to another worker keeps its slot; the hand-over
//! between the two workers orders their writes.
//!
//! The service time is the one the queue's latency histogram measures
//! (from the pass that took the request to the pass that completed it,
//! [`crate::runtime::latency`]): `time_ns / ops` is the mean latency.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use serde::Serialize;

use crate::runtime::events::IoKind;

/// Kinds of operation counted ([`IoKind`]'s variants).
pub const KINDS: usize = 5;

/// Request queues a LUN counts apart (request queue indices above share
/// the last slot's lines, which stays correct but for concurrent
/// counts: no device has that many).
pub const SLOTS: usize = 256;

/// [`IoKind`]s in their slot order, with their names.
pub const KIND_NAMES: [(IoKind, &str); KINDS] = [
    (IoKind::Read, "read"),
    (IoKind::Write, "write"),
    (IoKind::Flush, "flush"),
    (IoKind::Discard, "discard"),
    (IoKind::WriteZeroes, "write_zeroes"),
];

fn index(kind: IoKind) -> usize {
    match kind {
        IoKind::Read => 0,
        IoKind::Write => 1,
        IoKind::Flush => 2,
        IoKind::Discard => 3,
        IoKind::WriteZeroes => 4,
    }
}

/// One request queue's counts for one LUN.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct LunSlot {
    ops: [AtomicU64; KINDS],
    bytes: [AtomicU64; KINDS],
    errors: [AtomicU64; KINDS],
    time_ns: [AtomicU64; KINDS],
}

/// Adds `n` to a counter only one thread writes.
#[inline]
fn add(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

impl LunSlot {
    /// A request of `kind` completed after `ns`: `bytes` moved if it
    /// succeeded, else an error. Only the worker running the slot's queue
    /// calls this.
    #[inline]
    pub fn record(&self, kind: IoKind, bytes: u64, ok: bool, ns: u64) {
        let k = index(kind);
        add(&self.ops[k], 1);
        if ok {
            add(&self.bytes[k], bytes);
        } else {
            add(&self.errors[k], 1);
        }
        add(&self.time_ns[k], ns);
    }
}

/// The counts of one LUN, one slot per request queue.
#[derive(Debug)]
pub struct LunStats {
    slots: Box<[OnceLock<Arc<LunSlot>>]>,
}

impl Default for LunStats {
    fn default() -> Self {
        LunStats {
            slots: (0..SLOTS).map(|_| OnceLock::new()).collect(),
        }
    }
}

impl LunStats {
    /// The slot of request queue `rq` (made on first use).
    pub fn slot(&self, rq: u16) -> Arc<LunSlot> {
        let i = usize::from(rq).min(SLOTS - 1);
        Arc::clone(self.slots[i].get_or_init(Arc::default))
    }

    /// The sum of every slot.
    pub fn snapshot(&self) -> LunIo {
        let mut io = LunIo::default();
        for slot in self.slots.iter().filter_map(OnceLock::get) {
            for (k, f) in io.kinds.iter_mut().enumerate() {
                let get = |c: &[AtomicU64; KINDS]| c[k].load(Ordering::Relaxed);
                f.ops += get(&slot.ops);
                f.bytes += get(&slot.bytes);
                f.errors += get(&slot.errors);
                f.time_ns += get(&slot.time_ns);
            }
        }
        io
    }
}

/// One kind of operation's figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KindFigures {
    /// Operations completed (failed ones included).
    pub ops: u64,
    /// Bytes moved by the ones that succeeded (a discard or write zeroes:
    /// the range's length; a flush: 0).
    pub bytes: u64,
    /// Operations the backstore failed.
    pub errors: u64,
    /// Their service times added up (ns).
    pub time_ns: u64,
}

/// A LUN's figures, by kind of operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LunIo {
    /// In [`KIND_NAMES`]' order.
    pub kinds: [KindFigures; KINDS],
}

impl LunIo {
    /// The figures of `kind`.
    pub fn of(&self, kind: IoKind) -> &KindFigures {
        &self.kinds[index(kind)]
    }
}

impl Serialize for LunIo {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(KINDS))?;
        for ((_, name), f) in KIND_NAMES.iter().zip(&self.kinds) {
            m.serialize_entry(name, f)?;
        }
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_add_up_by_kind() {
        let stats = LunStats::default();
        let (a, b) = (stats.slot(0), stats.slot(3));
        a.record(IoKind::Read, 4096, true, 1000);
        b.record(IoKind::Read, 8192, true, 3000);
        b.record(IoKind::Read, 512, false, 500);
        a.record(IoKind::Flush, 0, true, 10);
        stats.slot(0).record(IoKind::Discard, 1 << 20, true, 7);
        let io = stats.snapshot();
        assert_eq!(
            *io.of(IoKind::Read),
            KindFigures {
                ops: 3,
                bytes: 12288,
                errors: 1,
                time_ns: 4500
            }
        );
        assert_eq!(io.of(IoKind::Flush).ops, 1);
        assert_eq!(io.of(IoKind::Discard).bytes, 1 << 20);
        assert_eq!(*io.of(IoKind::Write), KindFigures::default());
        let json = serde_json::to_value(io).unwrap();
        assert_eq!(json["read"]["bytes"], 12288);
        assert_eq!(json["write_zeroes"]["ops"], 0);
        assert_eq!(
            KIND_NAMES
                .iter()
                .map(|(k, _)| index(*k))
                .collect::<Vec<_>>(),
            [0, 1, 2, 3, 4]
        );
    }

    #[test]
    fn the_same_queue_gets_the_same_slot() {
        let stats = LunStats::default();
        assert!(Arc::ptr_eq(&stats.slot(7), &stats.slot(7)));
        assert!(!Arc::ptr_eq(&stats.slot(7), &stats.slot(8)));
        assert!(
            Arc::ptr_eq(&stats.slot(999), &stats.slot(u16::MAX)),
            "past the last: shared"
        );
    }
}
