//! Turning a descriptor chain the guest built into checked buffer lists.
//!
//! A chain walk ([`HeadWalk`], with the rules of virtio-queue's chain
//! iterator, which a test holds it to; every queue uses it) already refuses
//! what it cannot follow (loops, chains longer than the queue, descriptor
//! indices out of range, nested indirect tables, descriptor tables outside
//! guest memory), but it reports all of those by ending early. [`parse`] notices
//! the early end (the last descriptor still says NEXT, or there was none)
//! and adds the checks the device needs: every buffer inside guest memory,
//! device-readable buffers before device-writable ones, a bounded number of
//! segments. It never stops at the first problem when the buffers seen so
//! far still allow a response to be written: the caller answers a bad
//! chain whenever it can.

use crate::runtime::batch::Batch;
use thiserror::Error;
use vm_memory::GuestAddress;

/// The descriptors of the chain at `head` of a descriptor table, with
/// the rules of virtio-queue's `DescriptorChain` (which cannot be built
/// from a head index outside that crate): at most `size` descriptors
/// (the table's, or an indirect table's), one level of indirection to a
/// table whose length is a multiple of 16, at most 2^32 bytes in all; the
/// walk ends early where a chain breaks those rules. A test checks both
/// walks agree on arbitrary tables. Every chain is walked this
/// way: from the available ring, and resubmitted after a reconnect.
#[derive(Debug)]
pub struct HeadWalk<'a> {
    mem: Batch<'a>,
    table: GuestAddress,
    /// Host address of the whole current table, when it lies in one
    /// region of guest memory: each descriptor is then one read at a
    /// fixed offset, with no lookup.
    table_host: Option<*const u8>,
    size: u16,
    head: u16,
    next: u16,
    ttl: u16,
    indirect: bool,
    bytes: u32,
}

impl<'a> HeadWalk<'a> {
    /// The chain at `head` of the `size`-entry table at `table`.
    pub fn new(mem: Batch<'a>, table: GuestAddress, size: u16, head: u16) -> Self {
        HeadWalk {
            mem,
            table,
            table_host: table_host(mem, table, size),
            size,
            head,
            next: head,
            ttl: size,
            indirect: false,
            bytes: 0,
        }
    }

    /// The chain's head index.
    pub fn head_index(&self) -> u16 {
        self.head
    }

    /// Descriptor `i` (below `self.size`) of the current table.
    #[inline]
    fn read(&self, i: u16) -> Option<Descriptor> {
        if let Some(p) = self.table_host {
            let at = p.wrapping_add(usize::from(i) * 16);
            // SAFETY: `table_host` found the table's `size` descriptors
            // (16 bytes each) inside one mapped region of the batch's map,
            // which the walk borrows, and `i < size`, so `at` and the 16 bytes
            // after it are mapped. A descriptor has no alignment here and
            // any bytes are valid; the guest may write them concurrently,
            // so they are copied once and used from the copy.
            let raw = unsafe { at.cast::<[u8; 16]>().read_unaligned() };
            return Some(Descriptor::decode(&raw));
        }
        let at = self.table.0.checked_add(u64::from(i) * 16)?;
        let raw = self.mem.read_bytes::<16>(at).ok()?;
        Some(Descriptor::decode(&raw))
    }
}

/// Host address of a whole table of `size` descriptors at `table`, when
/// it lies in one region.
fn table_host(mem: Batch<'_>, table: GuestAddress, size: u16) -> Option<*const u8> {
    mem.host(table.0, usize::from(size) * 16)
        .map(|p| p.cast_const())
}

impl Iterator for HeadWalk<'_> {
    type Item = Descriptor;
    #[inline(always)]
    fn next(&mut self) -> Option<Descriptor> {
        loop {
            if self.ttl == 0 || self.next >= self.size {
                return None;
            }
            let desc = self.read(self.next)?;
            if desc.refers_to_indirect_table() {
                // One level only, a table of whole descriptors.
                if self.indirect || !desc.len().is_multiple_of(16) {
                    return None;
                }
                self.size = u16::try_from(desc.len() / 16).ok()?;
                self.table = desc.addr();
                self.table_host = table_host(self.mem, self.table, self.size);
                self.next = 0;
                self.ttl = self.size;
                self.indirect = true;
                continue;
            }
            self.bytes = self.bytes.checked_add(desc.len())?;
            if desc.has_next() {
                self.next = desc.next();
                self.ttl -= 1;
            } else {
                self.ttl = 0;
            }
            return Some(desc);
        }
    }
}

/// VRING_DESC_F_NEXT.
const DESC_F_NEXT: u16 = 1;
/// VRING_DESC_F_WRITE.
const DESC_F_WRITE: u16 = 2;
/// VRING_DESC_F_INDIRECT.
const DESC_F_INDIRECT: u16 = 4;

/// One split-ring descriptor (virtio 1.2, 2.7.5), as the driver wrote it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Descriptor {
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
}

impl Descriptor {
    /// A descriptor of these fields.
    pub fn new(addr: u64, len: u32, flags: u16, next: u16) -> Self {
        Descriptor {
            addr,
            len,
            flags,
            next,
        }
    }

    /// The buffer's guest address.
    pub fn addr(&self) -> GuestAddress {
        GuestAddress(self.addr)
    }

    /// The buffer's length.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// The flags.
    pub fn flags(&self) -> u16 {
        self.flags
    }

    /// The index of the next descriptor (with NEXT).
    pub fn next(&self) -> u16 {
        self.next
    }

    /// VRING_DESC_F_NEXT: the chain goes on at [`Self::next`].
    pub fn has_next(&self) -> bool {
        self.flags & DESC_F_NEXT != 0
    }

    /// VRING_DESC_F_WRITE: a device-writable buffer.
    pub fn is_write_only(&self) -> bool {
        self.flags & DESC_F_WRITE != 0
    }

    /// VRING_DESC_F_INDIRECT: the buffer is a table of descriptors.
    pub fn refers_to_indirect_table(&self) -> bool {
        self.flags & DESC_F_INDIRECT != 0
    }

    /// The descriptor of its 16 little-endian bytes.
    fn decode(raw: &[u8; 16]) -> Self {
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
            f0,
            f1,
            n0,
            n1,
        ] = *raw;
        Descriptor::new(
            u64::from_le_bytes([a0, a1, a2, a3, a4, a5, a6, a7]),
            u32::from_le_bytes([l0, l1, l2, l3]),
            u16::from_le_bytes([f0, f1]),
            u16::from_le_bytes([n0, n1]),
        )
    }
}

/// virtio-queue's descriptors, for the tests that use its chains as the
/// oracle.
#[cfg(test)]
impl From<virtio_queue::desc::split::Descriptor> for Descriptor {
    fn from(d: virtio_queue::desc::split::Descriptor) -> Self {
        Descriptor::new(d.addr().0, d.len(), d.flags(), d.next())
    }
}

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

/// The checks a chain's descriptors go through, one descriptor at a
/// time, and the first error they found: what [`parse`] and
/// [`HeadWalk::parse`] share.
struct Checks<'m> {
    mem: Batch<'m>,
    max_segments: usize,
    count: usize,
    first_error: Option<ChainError>,
}

impl<'m> Checks<'m> {
    fn new(mem: Batch<'m>, max_segments: usize, out: &mut ChainBuffers) -> Self {
        out.clear();
        Checks {
            mem,
            max_segments,
            count: 0,
            first_error: None,
        }
    }

    fn note(&mut self, e: ChainError) {
        self.first_error.get_or_insert(e);
    }

    /// Adds `desc`'s buffer to `out`; false when the chain has more
    /// segments than allowed (the buffer is not added; stop there).
    #[inline(always)]
    fn add(&mut self, desc: Descriptor, out: &mut ChainBuffers) -> bool {
        self.count += 1;
        if self.count > self.max_segments {
            self.note(ChainError::TooManySegments {
                max: self.max_segments,
            });
            return false;
        }
        let seg = Segment {
            addr: desc.addr(),
            len: desc.len(),
        };
        let in_memory = usize::try_from(seg.len)
            .map(|len| self.mem.check_range(seg.addr.0, len))
            .unwrap_or(false);
        if !in_memory {
            self.note(ChainError::OutOfMemory {
                addr: seg.addr.0,
                len: seg.len,
            });
        }
        if desc.is_write_only() {
            out.writable_len += u64::from(seg.len);
            out.writable.push(seg);
        } else {
            if !out.writable.is_empty() {
                self.note(ChainError::WrongOrder);
            }
            out.readable_len += u64::from(seg.len);
            out.readable.push(seg);
        }
        true
    }

    /// The result once the walk ended: `followed` is false when it
    /// stopped before a descriptor without NEXT (it could not follow the
    /// chain, or the chain had no descriptor at all) within the segment
    /// limit, which makes the chain malformed whatever else was found.
    fn finish(self, followed: bool) -> Result<(), ChainError> {
        if !followed && self.count <= self.max_segments {
            return Err(ChainError::Malformed);
        }
        match self.first_error {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }
}

/// Reads the chain into `out`. On error `out` still holds the segments
/// seen (in-memory or not), so the caller can try to write a response; the
/// first error found is returned.
pub fn parse(
    chain: impl IntoIterator<Item = Descriptor>,
    mem: Batch<'_>,
    max_segments: usize,
    out: &mut ChainBuffers,
) -> Result<(), ChainError> {
    let mut checks = Checks::new(mem, max_segments, out);
    let mut last_had_next = true;
    for desc in chain {
        last_had_next = desc.has_next();
        if !checks.add(desc, out) {
            break;
        }
    }
    checks.finish(!last_had_next)
}

impl HeadWalk<'_> {
    /// [`parse`] of this walk, the walk inlined into the checks' loop:
    /// every split ring's request takes this path. The same result as
    /// `parse(walk)` (a test holds it to that on arbitrary tables) in
    /// fewer instructions (docs/benchmarks.md, "Instructions per request,
    /// in process").
    pub fn parse(self, max_segments: usize, out: &mut ChainBuffers) -> Result<(), ChainError> {
        // A local copy: the compiler keeps its fields in registers, where
        // `self`, passed by reference, would be read and written in memory
        // at each descriptor.
        let walk = HeadWalk { ..self };
        let mut checks = Checks::new(walk.mem, max_segments, out);
        for desc in walk {
            if !checks.add(desc, out) || !desc.has_next() {
                // Past the limit, or followed to its end.
                return checks.finish(true);
            }
        }
        checks.finish(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_queue::desc::RawDescriptor;
    use virtio_queue::desc::split::Descriptor as TheirDescriptor;
    use virtio_queue::mock::MockSplitQueue;
    use virtio_queue::{Queue, QueueOwnedT};

    use crate::runtime::batch::Mapped;
    use std::sync::Arc;
    use vm_memory::Bytes;

    /// VRING_DESC_F_NEXT, VRING_DESC_F_WRITE, VRING_DESC_F_INDIRECT.
    const NEXT: u16 = 1;
    const WRITE: u16 = 2;
    const INDIRECT: u16 = 4;

    fn mem() -> Mapped {
        Mapped::new(Arc::new(crate::runtime::guest::test_memory(&[(
            GuestAddress(0),
            0x10_0000,
        )])))
    }

    fn parse_first(
        m: &Mapped,
        descs: &[Descriptor],
        max: usize,
    ) -> (Result<(), ChainError>, ChainBuffers) {
        let vq = MockSplitQueue::new(&**m.map(), 16);
        let raw: Vec<RawDescriptor> = descs
            .iter()
            .map(|d| {
                RawDescriptor::from(TheirDescriptor::new(
                    d.addr().0,
                    d.len(),
                    d.flags(),
                    d.next(),
                ))
            })
            .collect();
        vq.build_desc_chain(&raw).unwrap();
        let mut q: Queue = vq.create_queue().unwrap();
        let chain = q.iter(&**m.map()).unwrap().next().unwrap();
        let mut out = ChainBuffers::with_capacity(max);
        let r = parse(chain.map(Descriptor::from), m.batch(), max, &mut out);
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
        let mapped = mem();
        let m = &**mapped.map();
        let vq = MockSplitQueue::new(m, 16);
        // Descriptor 0 points to 1, 1 points back to 0.
        let t = vq.desc_table();
        t.store(
            0,
            RawDescriptor::from(TheirDescriptor::new(0x1000, 16, NEXT, 1)),
        )
        .unwrap();
        t.store(
            1,
            RawDescriptor::from(TheirDescriptor::new(0x2000, 16, NEXT, 0)),
        )
        .unwrap();
        vq.avail().ring().ref_at(0).unwrap().store(0);
        vq.avail().idx().store(1);
        let mut q: Queue = vq.create_queue().unwrap();
        let chain = q.iter(m).unwrap().next().unwrap();
        let mut out = ChainBuffers::with_capacity(64);
        assert_eq!(
            parse(chain.map(Descriptor::from), mapped.batch(), 64, &mut out),
            Err(ChainError::Malformed)
        );
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
        let mapped = mem();
        let m = &**mapped.map();
        let vq = MockSplitQueue::new(m, 16);
        // Indirect table of two descriptors at 0x8000.
        let table = 0x8000u64;
        let entries = [
            Descriptor::new(0x1000, 51, NEXT, 1),
            Descriptor::new(0x3000, 108, WRITE, 0),
        ];
        for (i, e) in entries.iter().enumerate() {
            let raw = RawDescriptor::from(TheirDescriptor::new(
                e.addr().0,
                e.len(),
                e.flags(),
                e.next(),
            ));
            m.write_obj(raw, GuestAddress(table + 16 * i as u64))
                .unwrap();
        }
        vq.desc_table()
            .store(
                0,
                RawDescriptor::from(TheirDescriptor::new(table, 32, INDIRECT, 0)),
            )
            .unwrap();
        vq.avail().ring().ref_at(0).unwrap().store(0);
        vq.avail().idx().store(1);
        let mut q: Queue = vq.create_queue().unwrap();
        let chain = q.iter(m).unwrap().next().unwrap();
        let mut out = ChainBuffers::with_capacity(16);
        parse(chain.map(Descriptor::from), mapped.batch(), 16, &mut out).unwrap();
        assert_eq!(out.readable_len, 51);
        assert_eq!(out.writable_len, 108);
    }

    /// The head walk and virtio-queue's chain iterator give the same
    /// descriptors for every head of arbitrary tables (loops, bad next
    /// indices, nested and misaligned indirect tables included), whether
    /// a table lies in one region (read by host address) or across two
    /// (read descriptor by descriptor).
    #[test]
    fn head_walk_agrees_with_virtio_queue() {
        use virtio_queue::QueueT;
        let mapped = mem();
        let m = &**mapped.map();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let (table, avail, used) = (0x0u64, 0x1000u64, 0x2000u64);
        let indirect_tables = [0x3000u64, 0x3100, 0x4000];
        // The same memory split in two regions inside the first
        // indirect table.
        let split = Mapped::new(Arc::new(crate::runtime::guest::test_memory(&[
            (GuestAddress(0), 0x3080),
            (GuestAddress(0x3080), 0x10_0000 - 0x3080),
        ])));
        // How often each outcome of the walk's parse came up.
        let mut results = [0u32; 5];
        for _ in 0..3000 {
            let mut write_table = |at: u64, n: u64| {
                for i in 0..n {
                    let flags = u16::try_from(rand(8)).unwrap();
                    let len = if rand(2) == 0 {
                        u32::try_from(16 * rand(20)).unwrap()
                    } else {
                        u32::try_from(rand(5000)).unwrap()
                    };
                    let addr = if flags & INDIRECT != 0 && rand(4) != 0 {
                        indirect_tables[usize::try_from(rand(3)).unwrap()]
                    } else {
                        rand(0x10_0000)
                    };
                    let next = u16::try_from(rand(20)).unwrap();
                    m.write_obj(
                        RawDescriptor::from(TheirDescriptor::new(addr, len, flags, next)),
                        GuestAddress(at + 16 * i),
                    )
                    .unwrap();
                }
            };
            write_table(table, 16);
            for t in indirect_tables {
                write_table(t, 16);
            }
            let head = u16::try_from(rand(16)).unwrap();
            let mut q = Queue::new(16).unwrap();
            q.try_set_desc_table_address(GuestAddress(table)).unwrap();
            q.try_set_avail_ring_address(GuestAddress(avail)).unwrap();
            q.try_set_used_ring_address(GuestAddress(used)).unwrap();
            q.set_ready(true);
            m.write_obj(1u16, GuestAddress(avail + 2)).unwrap();
            m.write_obj(head, GuestAddress(avail + 4)).unwrap();
            let fields = |d: Descriptor| (d.addr(), d.len(), d.flags(), d.next());
            let theirs: Vec<_> = q
                .iter(m)
                .unwrap()
                .next()
                .unwrap()
                .map(|d| fields(d.into()))
                .collect();
            let walk = HeadWalk::new(mapped.batch(), GuestAddress(table), 16, head);
            assert!(walk.table_host.is_some(), "the table is in one region");
            let ours: Vec<_> = walk.map(fields).collect();
            assert_eq!(ours, theirs, "head {head}");
            // The walk's own parse finds what `parse` of its descriptors
            // does, under any segment limit.
            let max = usize::try_from(rand(6)).unwrap();
            let walk = || HeadWalk::new(mapped.batch(), GuestAddress(table), 16, head);
            let (mut one_loop, mut by_item) = (ChainBuffers::default(), ChainBuffers::default());
            let r = walk().parse(max, &mut one_loop);
            assert_eq!(
                r,
                parse(walk(), mapped.batch(), max, &mut by_item),
                "head {head}, max {max}"
            );
            assert_eq!(one_loop.readable, by_item.readable, "head {head}");
            assert_eq!(one_loop.writable, by_item.writable, "head {head}");
            assert_eq!(
                (one_loop.readable_len, one_loop.writable_len),
                (by_item.readable_len, by_item.writable_len)
            );
            results[match r {
                Ok(()) => 0,
                Err(ChainError::Malformed) => 1,
                Err(ChainError::TooManySegments { .. }) => 2,
                Err(ChainError::WrongOrder) => 3,
                Err(ChainError::OutOfMemory { .. }) => 4,
            }] += 1;
            let mut tables = [0u8; 0x5000];
            m.read_slice(&mut tables, GuestAddress(0)).unwrap();
            split.map().write_slice(&tables, GuestAddress(0)).unwrap();
            let across: Vec<_> = HeadWalk::new(split.batch(), GuestAddress(table), 16, head)
                .map(fields)
                .collect();
            assert_eq!(across, theirs, "head {head}, tables across regions");
        }
        assert!(
            results.iter().all(|&n| n > 0),
            "every outcome of a parse is exercised: {results:?}"
        );
    }
}
