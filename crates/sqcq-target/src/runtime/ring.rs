//! A virtqueue's ring, split or packed, as the request path sees it: one
//! type for taking chains, completing them and publishing, whichever
//! layout the driver negotiated (VIRTIO_F_RING_PACKED).
//!
//! A request is named by a 16-bit value below the queue size in both
//! layouts: the head index of its chain in a split ring, its buffer ID in
//! a packed ring. The handlers, the duplicate check and the counters use
//! that name alone; what else a packed ring needs to complete a request
//! (how many descriptors its list took) stays here.

use crate::runtime::batch::Batch;
use crate::runtime::chain::{self, ChainBuffers, ChainError, Descriptor, HeadWalk};
use crate::runtime::packed::{self, PackedConfig, PackedRing, PackedWalk};
use crate::runtime::split::{RingConfig, RingError, SplitRing};
use crate::runtime::tracking::{PackedRecord, PackedRecovery, RawDesc, RecoveredList};

/// The descriptors of one chain taken from a ring.
#[derive(Debug)]
pub enum Chain<'a> {
    /// A chain of a split ring, walked from its head index.
    Split(HeadWalk<'a>),
    /// A list of a packed ring, with its buffer ID.
    Packed {
        /// The buffer ID.
        id: u16,
        /// Its descriptors.
        walk: PackedWalk<'a>,
    },
}

impl Chain<'_> {
    /// The name of the request: the head index, or the buffer ID.
    pub fn head_index(&self) -> u16 {
        match self {
            Chain::Split(w) => w.head_index(),
            Chain::Packed { id, .. } => *id,
        }
    }

    /// [`chain::parse`] of the chain's descriptors into `out` (a split
    /// ring's through its walk's own, [`HeadWalk::parse`]).
    #[inline]
    pub fn parse(
        self,
        mem: Batch<'_>,
        max_segments: usize,
        out: &mut ChainBuffers,
    ) -> Result<(), ChainError> {
        match self {
            Chain::Split(w) => w.parse(max_segments, out),
            Chain::Packed { walk, .. } => chain::parse(walk, mem, max_segments, out),
        }
    }
}

impl Iterator for Chain<'_> {
    type Item = Descriptor;

    #[inline]
    fn next(&mut self) -> Option<Descriptor> {
        match self {
            Chain::Split(w) => w.next(),
            Chain::Packed { walk, .. } => walk.next(),
        }
    }
}

/// A packed ring and what completing its requests needs.
#[derive(Debug)]
pub struct PackedQueue {
    ring: PackedRing,
    /// Descriptors each buffer ID's list took, recorded when it was
    /// taken: its used descriptor skips that many.
    counts: Box<[u16]>,
    /// Requests completed and not yet published.
    pending: u16,
    /// The in-flight record (VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD), if
    /// the frontend gave an area.
    record: Option<PackedRecord>,
    /// A list's ring descriptors, copied for the record.
    scratch: Vec<RawDesc>,
}

impl PackedQueue {
    /// The ring.
    pub fn ring(&self) -> &PackedRing {
        &self.ring
    }

    /// Takes the next list, recording its length under its ID, and in the
    /// in-flight record, before its request goes anywhere.
    pub fn pop<'a>(&mut self, mem: Batch<'a>) -> Result<Option<Chain<'a>>, RingError> {
        let Some(p) = self.ring.pop(mem)? else {
            return Ok(None);
        };
        // `pop` refuses an ID at or above the size, the length of `counts`.
        if let Some(c) = self.counts.get_mut(usize::from(p.id)) {
            *c = p.count;
        }
        if let Some(record) = self.record.as_mut() {
            self.scratch.clear();
            let mut at = p.first;
            for _ in 0..p.count {
                self.scratch.push(self.ring.raw_desc(mem, at)?);
                at = if at + 1 == self.ring.size() {
                    0
                } else {
                    at + 1
                };
            }
            // A list whose ID is in flight already is a duplicate the
            // handler answers: not recorded twice.
            record.taken(p.id, &self.scratch);
        }
        Ok(Some(Chain::Packed {
            id: p.id,
            walk: p.walk,
        }))
    }

    /// Keeps an in-flight record from now on, after reading it: the lists
    /// an earlier run had in flight (to resubmit, each of which takes its
    /// length under its ID now) and the positions that run left the ring
    /// at, which this queue continues from. `None`: a new record.
    pub fn adopt_record(
        &mut self,
        mut record: PackedRecord,
        mem: Batch<'_>,
    ) -> Option<(Vec<RecoveredList>, usize)> {
        let ring = &self.ring;
        let found = record.recover(ring.next_used(), |at| ring.still_available(mem, at));
        self.record = Some(record);
        let PackedRecovery::Resumed {
            lists,
            avail,
            used,
            ignored,
        } = found
        else {
            return None;
        };
        if !self.ring.reposition(mem, avail, used) {
            return None;
        }
        for l in &lists {
            if let Some(c) = self.counts.get_mut(usize::from(l.id)) {
                *c = u16::try_from(l.descs.len()).unwrap_or(1);
            }
        }
        Some((lists, ignored))
    }

    /// Links the batch's lists back into the record's free list before
    /// their used descriptors become visible.
    fn publishing(&mut self) {
        if let Some(r) = self.record.as_mut() {
            r.publishing(self.ring.next_used());
        }
    }

    /// Commits the batch in the record once its used descriptors are
    /// visible.
    fn published(&mut self) {
        if let Some(r) = self.record.as_mut() {
            r.published();
        }
    }
}

/// The ring of one virtqueue.
#[derive(Debug)]
pub enum Ring {
    /// A split ring.
    Split(SplitRing),
    /// A packed ring.
    Packed(PackedQueue),
}

impl Ring {
    /// The ring `cfg` describes, checked against the specification and
    /// against guest memory.
    pub fn open(cfg: &RingConfig, mem: Batch<'_>) -> Result<Self, RingError> {
        if !cfg.packed {
            return SplitRing::open(cfg, mem).map(Ring::Split);
        }
        let (avail, used) = packed::decode_base(cfg.base(), cfg.size).ok_or(RingError::Base {
            base: cfg.base(),
            size: cfg.size,
        })?;
        let ring = PackedRing::open(
            &PackedConfig {
                size: cfg.size,
                desc: cfg.desc,
                driver_event: cfg.avail,
                device_event: cfg.used,
                avail,
                used,
                event_idx: cfg.event_idx,
            },
            mem,
        )?;
        Ok(Ring::Packed(PackedQueue {
            ring,
            counts: vec![1; usize::from(cfg.size)].into_boxed_slice(),
            pending: 0,
            record: None,
            scratch: Vec::new(),
        }))
    }

    /// The queue size.
    pub fn size(&self) -> u16 {
        match self {
            Ring::Split(r) => r.size(),
            Ring::Packed(q) => q.ring.size(),
        }
    }

    /// Where a restart resumes: the vring base of VHOST_USER_GET_VRING_BASE
    /// (a split ring's next avail index; a packed ring's two positions,
    /// `packed::encode_base`).
    pub fn base(&self) -> u32 {
        match self {
            Ring::Split(r) => u32::from(r.next_avail()),
            Ring::Packed(q) => packed::encode_base(q.ring.next_avail(), q.ring.next_used()),
        }
    }

    /// The value that names the device's next used entry: the used index
    /// of a split ring, the encoded next used position of a packed one
    /// (what a CQ doorbell holds, spec sections 3.1 and 10.2).
    pub fn next_used(&self) -> u16 {
        match self {
            Ring::Split(r) => r.next_used(),
            Ring::Packed(q) => q.ring.next_used().encode(),
        }
    }

    /// The split ring, for what only a split ring has (its avail index,
    /// read ahead in batches; its in-flight record; doorbells).
    pub fn split(&mut self) -> Option<&mut SplitRing> {
        match self {
            Ring::Split(r) => Some(r),
            Ring::Packed(_) => None,
        }
    }

    /// Takes the next available chain, if any.
    pub fn pop<'a>(&mut self, mem: Batch<'a>) -> Result<Option<Chain<'a>>, RingError> {
        match self {
            Ring::Split(r) => Ok(r.pop(mem)?.map(Chain::Split)),
            Ring::Packed(q) => q.pop(mem),
        }
    }

    /// Whether a chain is available now.
    pub fn has_available(&self, mem: Batch<'_>) -> Result<bool, RingError> {
        match self {
            Ring::Split(r) => r.has_available(mem),
            Ring::Packed(q) => q.ring.has_available(mem),
        }
    }

    /// Puts the completion of request `head` (`len` bytes written) on the
    /// used side, visible at the next [`Self::publish`].
    pub fn push(&mut self, mem: Batch<'_>, head: u16, len: u32) -> Result<(), RingError> {
        match self {
            Ring::Split(r) => Ok(r.used().push(mem, head, len)?),
            Ring::Packed(q) => {
                let count = q.counts.get(usize::from(head)).copied().unwrap_or(1);
                q.ring.push(mem, head, count, len)?;
                q.pending = q.pending.wrapping_add(1);
                if let Some(r) = q.record.as_mut() {
                    r.completed(head);
                }
                Ok(())
            }
        }
    }

    /// Completions pushed and not yet published.
    pub fn pending(&mut self) -> u16 {
        match self {
            Ring::Split(r) => r.used().pending(),
            Ring::Packed(q) => q.pending,
        }
    }

    /// Publishes every completion pushed and says whether the driver asked
    /// to be notified of them.
    pub fn publish(&mut self, mem: Batch<'_>) -> Result<bool, RingError> {
        match self {
            Ring::Split(r) => Ok(r.used().publish(mem)?),
            Ring::Packed(q) => {
                q.pending = 0;
                q.publishing();
                let notify = q.ring.publish(mem)?;
                q.published();
                Ok(notify)
            }
        }
    }

    /// Publishes every completion pushed without deciding on a
    /// notification (with VIRTIO_F_SQCQ_POLL the CQ doorbell decides, spec
    /// section 6.2); returns how many requests it published.
    pub fn publish_index(&mut self, mem: Batch<'_>) -> Result<u16, RingError> {
        match self {
            Ring::Split(r) => Ok(r.used().publish_index(mem)?),
            Ring::Packed(q) => {
                q.publishing();
                q.ring.publish_used(mem)?;
                q.published();
                Ok(std::mem::take(&mut q.pending))
            }
        }
    }

    /// Asks the driver to notify again, then says whether it made a chain
    /// available meanwhile.
    pub fn enable_notification(&self, mem: Batch<'_>) -> Result<bool, RingError> {
        match self {
            Ring::Split(r) => r.enable_notification(mem),
            Ring::Packed(q) => q.ring.enable_notification(mem),
        }
    }

    /// Asks the driver not to notify.
    pub fn disable_notification(&self, mem: Batch<'_>) -> Result<(), RingError> {
        match self {
            Ring::Split(r) => r.disable_notification(mem),
            Ring::Packed(q) => q.ring.disable_notification(mem),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};
    use std::sync::Arc;

    use super::*;
    use crate::runtime::batch::Mapped;
    use crate::runtime::packed::Position;
    use crate::runtime::packed::tests::{DESC, DEVICE_EVENT, DRIVER_EVENT, Driver, memory, rng};
    use crate::runtime::tracking::InflightArea;

    /// A packed queue starting on the ring in `m` with the in-flight record
    /// in `area` (as a frontend that reconnects hands it back, with the
    /// vring base of the connection's start): the queue, and the lists an
    /// earlier run had in flight.
    fn start(m: &Mapped, area: &Arc<InflightArea>, size: u16) -> (Ring, Vec<RecoveredList>) {
        let cfg = RingConfig {
            size,
            desc: DESC,
            avail: DRIVER_EVENT,
            used: DEVICE_EVENT,
            next_avail: Position::START.encode(),
            event_idx: false,
            packed: true,
            next_used: Position::START.encode(),
        };
        let mut ring = Ring::open(&cfg, m.batch()).unwrap();
        let Ring::Packed(q) = &mut ring else {
            unreachable!("a packed ring")
        };
        let record = area.packed_queue(0, size).unwrap();
        let lists = q
            .adopt_record(record, m.batch())
            .map(|(lists, ignored)| {
                assert_eq!(ignored, 0, "the record of a run of this queue");
                lists
            })
            .unwrap_or_default();
        (ring, lists)
    }

    /// A request taken: its buffer ID and its sequence number (from its
    /// first buffer's address).
    fn request(mut chain: Chain<'_>) -> (u16, u32) {
        let id = chain.head_index();
        let first = chain.next().expect("a list has a descriptor");
        (id, u32::try_from(first.addr().0 >> 8).unwrap())
    }

    /// Where a process dies while it completes a batch: after which step.
    #[derive(Clone, Copy, Debug)]
    enum Kill {
        /// Used descriptors written, nothing published or recorded.
        Pushed,
        /// The batch linked back into the record's free list, not
        /// published.
        Recorded,
        /// Published (the first descriptor's flags), not committed.
        Published,
    }

    /// A packed queue with its in-flight record, killed again and again
    /// at each step of publishing a batch of completions and started anew
    /// on the same ring and record, over many laps of lists of 1 to 3
    /// descriptors completed out of order: the driver gets each request
    /// back exactly once (a request's sequence number travels from its
    /// buffer's address to the length the device reports, so a stale
    /// completion of a reused buffer ID shows), and every one comes back.
    #[test]
    fn a_packed_queue_killed_at_every_step_completes_each_request_once() {
        for (size, seed) in [
            (1u16, 1u64),
            (2, 2),
            (3, 3),
            (4, 4),
            (5, 5),
            (7, 6),
            (8, 7),
            (16, 8),
        ] {
            let m = memory();
            let area = InflightArea::on_heap(1, size, true);
            let mut rand = rng(0x2545_f491_4f6c_dd1d ^ seed);
            let (mut ring, _) = start(&m, &area, size);
            let mut driver = Driver::new(size);
            // The sequence number of each buffer ID in flight.
            let mut seq_of: HashMap<u16, u32> = HashMap::new();
            let mut next_seq = 0u32;
            let mut returned = HashSet::new();
            // Requests the device holds: buffer ID, sequence number.
            let mut device: Vec<(u16, u32)> = Vec::new();
            let mut kills = 0;
            let mut reap = |driver: &mut Driver, seq_of: &mut HashMap<u16, u32>| {
                while let Some((id, len)) = driver.get_used(&m) {
                    let seq = seq_of.remove(&id).expect("a buffer ID in flight");
                    assert_eq!(
                        len, seq,
                        "size {size}: ID {id} completed for another request"
                    );
                    assert!(returned.insert(seq), "request {seq} completed twice");
                }
            };
            for round in 0..3000 {
                while driver.room() > 0 && rand(4) != 0 {
                    let n = 1 + u16::try_from(rand(3)).unwrap().min(driver.room() - 1);
                    let bufs: Vec<(u64, u32, u16)> = (0..n)
                        .map(|i| (u64::from(next_seq) << 8 | u64::from(i), 16, 0))
                        .collect();
                    let id = driver.add(&m, &bufs);
                    assert!(seq_of.insert(id, next_seq).is_none());
                    next_seq += 1;
                }
                while rand(3) != 0 {
                    let Some(chain) = ring.pop(m.batch()).unwrap() else {
                        break;
                    };
                    device.push(request(chain));
                }
                let k = usize::try_from(rand(device.len() as u64 + 1)).unwrap();
                for _ in 0..k {
                    let i = usize::try_from(rand(device.len() as u64)).unwrap();
                    let (id, seq) = device.swap_remove(i);
                    ring.push(m.batch(), id, seq).unwrap();
                }
                let kill = match rand(8) {
                    0 => Some(Kill::Pushed),
                    1 => Some(Kill::Recorded),
                    2 => Some(Kill::Published),
                    _ => None,
                };
                let Some(kill) = kill else {
                    ring.publish(m.batch()).unwrap();
                    reap(&mut driver, &mut seq_of);
                    continue;
                };
                let Ring::Packed(q) = &mut ring else {
                    unreachable!("a packed ring")
                };
                if let Kill::Recorded | Kill::Published = kill {
                    q.publishing();
                }
                if let Kill::Published = kill {
                    q.ring.publish_used(m.batch()).unwrap();
                }
                // The process dies; the driver reads what it published.
                reap(&mut driver, &mut seq_of);
                kills += 1;
                let lists;
                (ring, lists) = start(&m, &area, size);
                // It resubmits what the record says was in flight: each a
                // request the driver still waits for.
                device = lists
                    .iter()
                    .map(|l| {
                        let seq = seq_of.get(&l.id).copied().unwrap_or_else(|| {
                            panic!(
                                "size {size} round {round}: resubmitted ID {} not in flight",
                                l.id
                            )
                        });
                        assert_eq!(u32::try_from(l.descs[0].addr >> 8).unwrap(), seq);
                        (l.id, seq)
                    })
                    .collect();
            }
            // The last run completes everything.
            while let Some(chain) = ring.pop(m.batch()).unwrap() {
                device.push(request(chain));
            }
            for (id, seq) in device.drain(..) {
                ring.push(m.batch(), id, seq).unwrap();
            }
            ring.publish(m.batch()).unwrap();
            reap(&mut driver, &mut seq_of);
            let Ring::Packed(q) = &ring else {
                unreachable!("a packed ring")
            };
            assert!(
                seq_of.is_empty(),
                "size {size}: lost {seq_of:?}; the device at {:?} (avail) and {:?} (used), {driver:?}",
                q.ring.next_avail(),
                q.ring.next_used()
            );
            assert_eq!(returned.len(), usize::try_from(next_seq).unwrap());
            assert!(kills > 500, "size {size}: {kills} kills");
        }
    }
}
