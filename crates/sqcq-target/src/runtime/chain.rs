//! Turning a descriptor chain the guest built into checked buffer lists.
//!
//! virtio-queue's chain iterator already refuses what it cannot follow
//! (loops, chains longer than the queue, descriptor indices out of range,
//! nested or misaligned indirect tables, descriptor tables outside guest
//! memory), but it reports all of those by ending early. [`parse`] notices
//! the early end (the last descriptor still says NEXT, or there was none)
//! and adds the checks the device needs: every buffer inside guest memory,
//! device-readable buffers before device-writable ones, a bounded number of
//! segments. It never stops at the first problem when the buffers seen so
//! far still allow a response to be written: the caller answers a bad
//! chain whenever it can.

use std::ops::Deref;

use crate::runtime::guest::GuestMem;
use thiserror::Error;
use virtio_queue::DescriptorChain;
use vm_memory::{GuestAddress, GuestMemory, GuestMemoryBackend};

/// One buffer of a chain, in guest physical addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Guest physical address.
    pub addr: GuestAddress,
    /// Length in bytes.
    pub len: u32,
}

/// What is wrong with a chain. Variants are ordered by how much of the
/// chain can still be used.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum ChainError {
    /// The chain could not be followed to its end: a loop, more
    /// descriptors than the queue holds, a bad next index, a bad indirect
    /// table, or a descriptor table outside guest memory.
    #[error("descriptor chain cannot be followed to its end")]
    Malformed,
    /// More segments than a request may carry.
    #[error("descriptor chain has more than {max} segments")]
    TooManySegments {
        /// The limit.
        max: usize,
    },
    /// A device-readable buffer follows a device-writable one.
    #[error("device-readable descriptor after a device-writable one")]
    WrongOrder,
    /// A buffer lies (partly) outside guest memory.
    #[error("buffer {addr:#x}+{len} is outside guest memory")]
    OutOfMemory {
        /// Guest address of the buffer.
        addr: u64,
        /// Its length.
        len: u32,
    },
}

/// The buffers of one chain, split by direction. Reused from request to
/// request so that parsing allocates nothing in steady state.
#[derive(Debug, Default)]
pub struct ChainBuffers {
    /// Device-readable buffers (request header, data-out), in order.
    pub readable: Vec<Segment>,
    /// Device-writable buffers (response, data-in), in order.
    pub writable: Vec<Segment>,
    /// Total bytes of `readable`.
    pub readable_len: u64,
    /// Total bytes of `writable`.
    pub writable_len: u64,
}

impl ChainBuffers {
    /// Buffers with room for `max_segments` segments in each direction.
    pub fn with_capacity(max_segments: usize) -> Self {
        ChainBuffers {
            readable: Vec::with_capacity(max_segments),
            writable: Vec::with_capacity(max_segments),
            readable_len: 0,
            writable_len: 0,
        }
    }

    fn clear(&mut self) {
        self.readable.clear();
        self.writable.clear();
        self.readable_len = 0;
        self.writable_len = 0;
    }
}

/// Reads the chain into `out`. On error `out` still holds the segments
/// seen (in-memory or not), so the caller can try to write a response; the
/// first error found is returned.
pub fn parse<M>(
    chain: DescriptorChain<M>,
    mem: &GuestMem,
    max_segments: usize,
    out: &mut ChainBuffers,
) -> Result<(), ChainError>
where
    M: Deref,
    M::Target: GuestMemory,
{
    out.clear();
    let mut first_error: Option<ChainError> = None;
    let mut note = |e: ChainError| {
        first_error.get_or_insert(e);
    };
    let mut last_had_next = true;
    let mut count = 0usize;
    for desc in chain {
        last_had_next = desc.has_next();
        count += 1;
        if count > max_segments {
            note(ChainError::TooManySegments { max: max_segments });
            break;
        }
        let seg = Segment {
            addr: desc.addr(),
            len: desc.len(),
        };
        let in_memory = usize::try_from(seg.len)
            .map(|len| len == 0 || GuestMemoryBackend::check_range(mem, seg.addr, len))
            .unwrap_or(false);
        if !in_memory {
            note(ChainError::OutOfMemory {
                addr: seg.addr.0,
                len: seg.len,
            });
        }
        if desc.is_write_only() {
            out.writable_len += u64::from(seg.len);
            out.writable.push(seg);
        } else {
            if !out.writable.is_empty() {
                note(ChainError::WrongOrder);
            }
            out.readable_len += u64::from(seg.len);
            out.readable.push(seg);
        }
    }
    if last_had_next && count <= max_segments {
        // The iterator stopped before a descriptor without NEXT: it could
        // not follow the chain (or the chain had no descriptor at all).
        first_error = Some(ChainError::Malformed);
    }
    match first_error {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_queue::desc::{RawDescriptor, split::Descriptor};
    use virtio_queue::mock::MockSplitQueue;
    use virtio_queue::{Queue, QueueOwnedT};

    /// VRING_DESC_F_NEXT, VRING_DESC_F_WRITE, VRING_DESC_F_INDIRECT.
    const NEXT: u16 = 1;
    const WRITE: u16 = 2;
    const INDIRECT: u16 = 4;

    fn mem() -> GuestMem {
        crate::runtime::guest::test_memory(&[(GuestAddress(0), 0x10_0000)])
    }

    fn parse_first(
        m: &GuestMem,
        descs: &[Descriptor],
        max: usize,
    ) -> (Result<(), ChainError>, ChainBuffers) {
        let vq = MockSplitQueue::new(m, 16);
        let raw: Vec<RawDescriptor> = descs.iter().map(|d| RawDescriptor::from(*d)).collect();
        vq.build_desc_chain(&raw).unwrap();
        let mut q: Queue = vq.create_queue().unwrap();
        let chain = q.iter(m).unwrap().next().unwrap();
        let mut out = ChainBuffers::with_capacity(max);
        let r = parse(chain, m, max, &mut out);
        (r, out)
    }

    #[test]
    fn good_chain_splits_by_direction() {
        let m = mem();
        let d = [
            Descriptor::new(0x1000, 51, NEXT, 1),
            Descriptor::new(0x2000, 512, NEXT, 2),
            Descriptor::new(0x3000, 108, WRITE | NEXT, 3),
            Descriptor::new(0x4000, 4096, WRITE, 0),
        ];
        let (r, out) = parse_first(&m, &d, 16);
        r.unwrap();
        assert_eq!(out.readable.len(), 2);
        assert_eq!(out.writable.len(), 2);
        assert_eq!(out.readable_len, 563);
        assert_eq!(out.writable_len, 4204);
    }

    #[test]
    fn readable_after_writable_is_wrong_order() {
        let m = mem();
        let d = [
            Descriptor::new(0x3000, 108, WRITE | NEXT, 1),
            Descriptor::new(0x1000, 51, 0, 0),
        ];
        let (r, out) = parse_first(&m, &d, 16);
        assert_eq!(r, Err(ChainError::WrongOrder));
        assert_eq!(out.writable.len(), 1);
    }

    #[test]
    fn buffer_outside_memory_is_reported_and_kept() {
        let m = mem();
        let d = [
            Descriptor::new(0x1000, 51, NEXT, 1),
            Descriptor::new(0xffff_0000, 512, WRITE, 0),
        ];
        let (r, out) = parse_first(&m, &d, 16);
        assert_eq!(
            r,
            Err(ChainError::OutOfMemory {
                addr: 0xffff_0000,
                len: 512
            })
        );
        assert_eq!(out.writable.len(), 1);
    }

    #[test]
    fn loop_is_malformed() {
        let m = mem();
        let vq = MockSplitQueue::new(&m, 16);
        // Descriptor 0 points to 1, 1 points back to 0.
        let t = vq.desc_table();
        t.store(0, RawDescriptor::from(Descriptor::new(0x1000, 16, NEXT, 1)))
            .unwrap();
        t.store(1, RawDescriptor::from(Descriptor::new(0x2000, 16, NEXT, 0)))
            .unwrap();
        vq.avail().ring().ref_at(0).unwrap().store(0);
        vq.avail().idx().store(1);
        let mut q: Queue = vq.create_queue().unwrap();
        let chain = q.iter(&m).unwrap().next().unwrap();
        let mut out = ChainBuffers::with_capacity(64);
        assert_eq!(parse(chain, &m, 64, &mut out), Err(ChainError::Malformed));
    }

    #[test]
    fn too_many_segments() {
        let m = mem();
        let d: Vec<_> = (0..6u16)
            .map(|i| {
                Descriptor::new(
                    0x1000 + u64::from(i) * 0x100,
                    16,
                    if i < 5 { NEXT } else { 0 },
                    i + 1,
                )
            })
            .collect();
        let (r, _) = parse_first(&m, &d, 4);
        assert_eq!(r, Err(ChainError::TooManySegments { max: 4 }));
    }

    #[test]
    fn indirect_table_is_followed() {
        let m = mem();
        let vq = MockSplitQueue::new(&m, 16);
        // Indirect table of two descriptors at 0x8000.
        let table = 0x8000u64;
        let entries = [
            Descriptor::new(0x1000, 51, NEXT, 1),
            Descriptor::new(0x3000, 108, WRITE, 0),
        ];
        for (i, e) in entries.iter().enumerate() {
            let raw = RawDescriptor::from(*e);
            vm_memory::Bytes::write_obj(&m, raw, GuestAddress(table + 16 * i as u64)).unwrap();
        }
        vq.desc_table()
            .store(
                0,
                RawDescriptor::from(Descriptor::new(table, 32, INDIRECT, 0)),
            )
            .unwrap();
        vq.avail().ring().ref_at(0).unwrap().store(0);
        vq.avail().idx().store(1);
        let mut q: Queue = vq.create_queue().unwrap();
        let chain = q.iter(&m).unwrap().next().unwrap();
        let mut out = ChainBuffers::with_capacity(16);
        parse(chain, &m, 16, &mut out).unwrap();
        assert_eq!(out.readable_len, 51);
        assert_eq!(out.writable_len, 108);
    }
}
