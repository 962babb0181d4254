//! The driver-side ring against virtio-queue's device side, both running
//! over the same memfd memory: two independent implementations of the
//! split ring checking each other.

mod hostile;
mod notify;
mod threads;

use virtio_bindings::virtio_config::VIRTIO_F_RING_PACKED;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryMmap};

use super::*;

const MEM_SIZE: usize = 8 << 20;

/// A driver queue and a device queue over one driver memory.
pub(super) struct Rig {
    pub(super) mem: DriverMemory,
    pub(super) driver: SplitQueue,
    pub(super) device: Queue,
}

/// What the device saw of one descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Seen {
    addr: u64,
    len: u32,
    writable: bool,
}

impl Rig {
    pub(super) fn new(config: QueueConfig) -> Self {
        let mut mem = DriverMemory::new(MEM_SIZE).unwrap();
        let driver = SplitQueue::new(&mut mem, config).unwrap();
        let device = device_queue(&mem, &driver);
        Self {
            mem,
            driver,
            device,
        }
    }

    pub(super) fn gm(&self) -> &GuestMemoryMmap {
        self.mem.guest_memory()
    }

    pub(super) fn buf(&mut self, len: u32) -> Buffer {
        let addr = self.mem.alloc(usize::try_from(len).unwrap(), 8).unwrap();
        Buffer::new(addr, len)
    }

    /// The device pops one chain: its head and descriptors.
    pub(super) fn device_pop(&mut self) -> Option<(u16, Vec<Seen>)> {
        let chain = self.device.pop_descriptor_chain(self.mem.guest_memory())?;
        let head = chain.head_index();
        let seen = chain
            .map(|d| Seen {
                addr: d.addr().0,
                len: d.len(),
                writable: d.is_write_only(),
            })
            .collect();
        Some((head, seen))
    }

    pub(super) fn device_complete(&mut self, head: u16, len: u32) {
        self.device
            .add_used(self.mem.guest_memory(), head, len)
            .unwrap();
    }

    /// The device's view of whether it must interrupt the driver.
    pub(super) fn device_needs_call(&mut self) -> bool {
        self.device
            .needs_notification(self.mem.guest_memory())
            .unwrap()
    }

    /// The device re-arms kicks; returns whether requests arrived meanwhile.
    pub(super) fn device_enable(&mut self) -> bool {
        self.device
            .enable_notification(self.mem.guest_memory())
            .unwrap()
    }

    pub(super) fn device_disable(&mut self) {
        self.device
            .disable_notification(self.mem.guest_memory())
            .unwrap();
    }

    pub(super) fn read_u16(&self, gpa: GuestAddress) -> u16 {
        u16::from_le(self.gm().read_obj(gpa).unwrap())
    }
}

pub(super) fn device_queue(mem: &DriverMemory, driver: &SplitQueue) -> Queue {
    let split = |gpa: GuestAddress| {
        (
            Some(u32::try_from(gpa.0 & 0xffff_ffff).unwrap()),
            Some(u32::try_from(gpa.0 >> 32).unwrap()),
        )
    };
    let mut device = Queue::new(driver.size()).unwrap();
    let (lo, hi) = split(driver.desc_table());
    device.set_desc_table_address(lo, hi);
    let (lo, hi) = split(driver.avail_ring());
    device.set_avail_ring_address(lo, hi);
    let (lo, hi) = split(driver.used_ring());
    device.set_used_ring_address(lo, hi);
    device.set_event_idx(driver.event_idx());
    device.set_ready(true);
    assert!(device.is_valid(mem.guest_memory()));
    device
}

fn seen(buffers: &[Buffer], writable: bool) -> impl Iterator<Item = Seen> + '_ {
    buffers.iter().map(move |b| Seen {
        addr: b.addr.0,
        len: b.len,
        writable,
    })
}

fn expected(out: &[Buffer], in_: &[Buffer]) -> Vec<Seen> {
    seen(out, false).chain(seen(in_, true)).collect()
}

#[test]
fn flag_values_match_the_specification() {
    use virtio_bindings::virtio_ring as ring;
    assert_eq!(u32::from(DESC_F_NEXT), ring::VRING_DESC_F_NEXT);
    assert_eq!(u32::from(DESC_F_WRITE), ring::VRING_DESC_F_WRITE);
    assert_eq!(u32::from(DESC_F_INDIRECT), ring::VRING_DESC_F_INDIRECT);
    assert_eq!(u32::from(USED_F_NO_NOTIFY), ring::VRING_USED_F_NO_NOTIFY);
    assert_eq!(
        u32::from(AVAIL_F_NO_INTERRUPT),
        ring::VRING_AVAIL_F_NO_INTERRUPT
    );
}

#[test]
fn config_is_validated() {
    let mut mem = DriverMemory::new(MEM_SIZE).unwrap();
    for size in [0, 3, 100, 65535] {
        assert!(matches!(
            SplitQueue::new(&mut mem, QueueConfig::new(size)),
            Err(QueueError::InvalidSize { .. })
        ));
    }
    let config = QueueConfig {
        indirect_max: 9,
        ..QueueConfig::new(8)
    };
    assert!(matches!(
        SplitQueue::new(&mut mem, config),
        Err(QueueError::InvalidIndirectMax { .. })
    ));
    let mut small = DriverMemory::new(512 << 10).unwrap();
    assert!(matches!(
        SplitQueue::new(&mut small, QueueConfig::new(MAX_QUEUE_SIZE)),
        Err(QueueError::Memory(MemoryError::OutOfMemory { .. }))
    ));
    let features = (1 << VIRTIO_RING_F_EVENT_IDX) | (1 << VIRTIO_RING_F_INDIRECT_DESC);
    assert_eq!(
        QueueConfig::negotiated(64, features, 16),
        QueueConfig {
            size: 64,
            event_idx: true,
            indirect_max: 16,
            packed: false,
        }
    );
    assert!(QueueConfig::negotiated(64, 1 << VIRTIO_F_RING_PACKED, 16).packed);
    assert_eq!(QueueConfig::negotiated(64, 0, 16), QueueConfig::new(64));
}

#[test]
fn layout_reserves_the_doorbells_after_the_used_ring() {
    for size in [1, 2, 8, 256, MAX_QUEUE_SIZE] {
        let mut mem = DriverMemory::new(4 << 20).unwrap();
        let config = QueueConfig {
            event_idx: true,
            indirect_max: size.min(4),
            ..QueueConfig::new(size)
        };
        let q = SplitQueue::new(&mut mem, config).unwrap();
        let n = u64::from(size);
        assert_eq!(q.desc_table().0 % 4096, 0);
        assert_eq!(q.avail_ring().0, q.desc_table().0 + 16 * n);
        let avail_end = q.avail_ring().0 + 6 + 2 * n;
        assert!(q.used_ring().0 >= avail_end);
        assert_eq!(q.used_ring().0 % 64, 0);
        let rings = sqcq_protocol::RingAddrs {
            desc: q.desc_table().0,
            avail: q.avail_ring().0,
            used: q.used_ring().0,
        };
        let location = sqcq_protocol::doorbell_location(rings, size).unwrap();
        assert_eq!(q.doorbell_area().0, location.sq);
        // Whatever is allocated next starts after the doorbell reserve.
        let next = mem.alloc(1, 1).unwrap();
        assert!(next.0 >= q.doorbell_area().0 + DOORBELL_RESERVE as u64);
        assert_eq!(q.num_free(), size);
    }
}

#[test]
fn single_request_round_trip() {
    let mut rig = Rig::new(QueueConfig::new(16));
    let header = rig.buf(16);
    let data = rig.buf(512);
    rig.gm()
        .write_slice(b"request header!!", header.addr)
        .unwrap();

    let head = rig.driver.add(&[header], &[data], 7).unwrap();
    assert_eq!(rig.driver.in_flight(), 1);
    assert_eq!(rig.driver.num_free(), 14);
    // Not visible before publish.
    assert!(rig.device_pop().is_none());
    assert_eq!(rig.driver.publish(), NotifyDecision::Kick);

    let (dev_head, descs) = rig.device_pop().unwrap();
    assert_eq!(dev_head, head);
    assert_eq!(descs, expected(&[header], &[data]));
    let mut got = [0u8; 16];
    rig.gm().read_slice(&mut got, header.addr).unwrap();
    assert_eq!(&got, b"request header!!");
    rig.gm().write_slice(&[0xab; 100], data.addr).unwrap();
    rig.device_complete(head, 100);

    assert_eq!(rig.driver.pop_used(), Some(Ok(Used { token: 7, len: 100 })));
    assert_eq!(rig.driver.pop_used(), None);
    assert_eq!(rig.driver.in_flight(), 0);
    assert_eq!(rig.driver.num_free(), 16);
    let mut back = [0u8; 100];
    rig.gm().read_slice(&mut back, data.addr).unwrap();
    assert_eq!(back, [0xab; 100]);
}

#[test]
fn full_queue_and_request_limits() {
    let mut rig = Rig::new(QueueConfig::new(8));
    let a = rig.buf(64);
    let b = rig.buf(64);
    for token in 0..4 {
        rig.driver.add(&[a], &[b], token).unwrap();
    }
    assert_eq!(rig.driver.num_free(), 0);
    assert!(matches!(
        rig.driver.add(&[a], &[], 4),
        Err(QueueError::NoFreeDescriptors { needed: 1, free: 0 })
    ));
    assert!(matches!(
        rig.driver.add(&[], &[], 4),
        Err(QueueError::EmptyChain)
    ));
    assert!(matches!(
        rig.driver.add(&[a; 9], &[], 4),
        Err(QueueError::ChainTooLong { len: 9, max: 8 })
    ));
    let huge = Buffer::new(a.addr, 0x8000_0000);
    assert!(matches!(
        rig.driver.add(&[huge], &[huge], 4),
        Err(QueueError::ChainTooLarge {
            bytes: 0x1_0000_0000
        })
    ));
    assert_eq!(rig.driver.publish(), NotifyDecision::Kick);

    // One completion frees exactly its two descriptors.
    let (head, _) = rig.device_pop().unwrap();
    rig.device_complete(head, 0);
    assert_eq!(rig.driver.pop_used(), Some(Ok(Used { token: 0, len: 0 })));
    assert_eq!(rig.driver.num_free(), 2);
    rig.driver.add(&[a, a], &[], 4).unwrap();
    assert_eq!(rig.driver.num_free(), 0);
    assert_eq!(rig.driver.in_flight(), 4);
}

#[test]
fn index_wrap_around_with_out_of_order_completions() {
    const SIZE: u16 = 4;
    const REQUESTS: usize = 70_000;
    let mut rig = Rig::new(QueueConfig::new(SIZE));
    let bufs: Vec<Buffer> = (1..=4).map(|i| rig.buf(i * 32)).collect();
    let mut shapes = vec![(Vec::new(), Vec::new()); REQUESTS];
    let mut token_of_head = [usize::MAX; SIZE as usize];
    let (mut submitted, mut completed) = (0, 0);
    while completed < REQUESTS {
        // Fill the queue with chains of 1 to 3 buffers.
        while submitted < REQUESTS {
            let n_out = submitted % 2;
            let n_in = 1 + submitted % 3 / 2;
            let out = bufs[..n_out].to_vec();
            let in_ = bufs[2..2 + n_in].to_vec();
            match rig.driver.add(&out, &in_, submitted) {
                Ok(head) => token_of_head[usize::from(head)] = submitted,
                Err(QueueError::NoFreeDescriptors { .. }) => break,
                Err(e) => panic!("{e}"),
            }
            shapes[submitted] = (out, in_);
            submitted += 1;
        }
        let _ = rig.driver.publish();
        let mut heads = Vec::new();
        while let Some((head, descs)) = rig.device_pop() {
            let (out, in_) = &shapes[token_of_head[usize::from(head)]];
            assert_eq!(descs, expected(out, in_));
            heads.push(head);
        }
        // Complete in reverse order, each with its full writable length.
        for &head in heads.iter().rev() {
            let (_, in_) = &shapes[token_of_head[usize::from(head)]];
            rig.device_complete(head, in_.iter().map(|b| b.len).sum());
        }
        for &head in heads.iter().rev() {
            let token = token_of_head[usize::from(head)];
            let len = shapes[token].1.iter().map(|b| b.len).sum();
            assert_eq!(rig.driver.pop_used(), Some(Ok(Used { token, len })));
            completed += 1;
        }
        assert_eq!(rig.driver.pop_used(), None);
        assert_eq!(rig.driver.in_flight(), 0);
        assert_eq!(rig.driver.num_free(), SIZE);
    }
    assert_eq!(rig.device.next_avail(), rig.driver.next_avail());
    assert_eq!(rig.device.next_used(), rig.driver.last_used());
    assert_eq!(usize::from(rig.driver.next_avail()), REQUESTS % 65536);
}

#[test]
fn indirect_descriptors_take_one_ring_slot() {
    let config = QueueConfig {
        indirect_max: 4,
        ..QueueConfig::new(8)
    };
    let mut rig = Rig::new(config);
    let out = [rig.buf(16), rig.buf(32)];
    let in_ = [rig.buf(64)];
    let mut heads = Vec::new();
    for token in 0..8 {
        heads.push(rig.driver.add(&out, &in_, token).unwrap());
    }
    assert_eq!(rig.driver.num_free(), 0);
    assert!(matches!(
        rig.driver.add(&out, &in_, 8),
        Err(QueueError::NoFreeDescriptors { needed: 1, free: 0 })
    ));
    let _ = rig.driver.publish();
    for &expected_head in &heads {
        let (head, descs) = rig.device_pop().unwrap();
        assert_eq!(head, expected_head);
        assert_eq!(descs, expected(&out, &in_));
        let flags = rig.read_u16(
            rig.driver
                .desc_table()
                .unchecked_add(u64::from(head) * 16 + 12),
        );
        assert_eq!(flags, DESC_F_INDIRECT);
        rig.device_complete(head, 64);
    }
    for token in 0..8 {
        assert_eq!(rig.driver.pop_used(), Some(Ok(Used { token, len: 64 })));
    }
    assert_eq!(rig.driver.num_free(), 8);

    // One buffer, or more than `indirect_max`, goes direct.
    let single = rig.driver.add(&in_, &[], 8).unwrap();
    let five = [out[0]; 5];
    let long = rig.driver.add(&five, &[], 9).unwrap();
    assert_eq!(rig.driver.num_free(), 2);
    let _ = rig.driver.publish();
    for (head, bufs) in [(single, &in_[..]), (long, &five[..])] {
        let (dev_head, descs) = rig.device_pop().unwrap();
        assert_eq!(dev_head, head);
        assert_eq!(descs, expected(bufs, &[]));
        let flags = rig.read_u16(
            rig.driver
                .desc_table()
                .unchecked_add(u64::from(head) * 16 + 12),
        );
        assert_eq!(flags & DESC_F_INDIRECT, 0);
    }
}

#[test]
fn a_shared_window_moves_bytes_in_whole_words_padding_with_zeros() {
    let mut mem = DriverMemory::new(1 << 20).unwrap();
    let gpa = mem.alloc(64, 64).unwrap();
    let window = SharedWindow::new(&mem, gpa, 64).unwrap();
    let gm = mem.guest_memory();
    gm.write_slice(&[0xaa; 64], gpa).unwrap();
    let bytes: Vec<u8> = (1..=11).collect();
    window.store_bytes(8, &bytes);
    let mut back = [0u8; 64];
    gm.read_slice(&mut back, gpa).unwrap();
    assert_eq!(back[..8], [0xaa; 8], "before the offset: untouched");
    assert_eq!(back[8..19], bytes[..]);
    assert_eq!(back[19..24], [0; 5], "the last word padded with zeros");
    assert_eq!(back[24..], [0xaa; 40], "past the last word: untouched");
    let mut out = [0u8; 11];
    window.load_bytes(8, &mut out);
    assert_eq!(out[..], bytes[..]);
}

#[test]
fn a_shared_window_loads_bytes_at_any_offset_from_the_words_covering_them() {
    let mut mem = DriverMemory::new(1 << 20).unwrap();
    let gpa = mem.alloc(64, 64).unwrap();
    let window = SharedWindow::new(&mem, gpa, 64).unwrap();
    let all: Vec<u8> = (0..64).collect();
    mem.guest_memory().write_slice(&all, gpa).unwrap();
    for offset in 0..64 {
        for len in 0..=(64 - offset) {
            let mut out = vec![0xff; len];
            window.load_bytes(offset, &mut out);
            assert_eq!(
                out[..],
                all[offset..offset + len],
                "{len} bytes at {offset}"
            );
        }
    }
}

#[test]
fn freed_descriptors_are_taken_again_last() {
    // As SPDK's and DPDK's virtio drivers: a chain the device has just
    // read goes to the end of the free list, so the next request is
    // written into lines the device let go of longest ago, not into the
    // ones it may still be reading for its neighbours.
    let mut rig = Rig::new(QueueConfig::new(8));
    let buf = rig.buf(64);
    let complete_next = |rig: &mut Rig| {
        let (head, _) = rig.device_pop().unwrap();
        rig.device_complete(head, 0);
        assert!(rig.driver.pop_used().unwrap().is_ok());
        head
    };
    assert_eq!(rig.driver.add(&[buf, buf], &[], 1).unwrap(), 0);
    assert_eq!(rig.driver.add(&[buf, buf], &[], 2).unwrap(), 2);
    let _ = rig.driver.publish();
    assert_eq!(complete_next(&mut rig), 0);
    // 4..7 were free before 0 and 1 were freed: they come first.
    let taken: Vec<u16> = (0..4)
        .map(|t| rig.driver.add(&[buf], &[], t).unwrap())
        .collect();
    assert_eq!(taken, [4, 5, 6, 7]);
    assert_eq!(rig.driver.add(&[buf], &[], 9).unwrap(), 0);
    let _ = rig.driver.publish();
    // Complete everything (2, then 4, 5, 6, 7, 0), then take all again:
    // in the order they were freed.
    for _ in 0..6 {
        complete_next(&mut rig);
    }
    let taken: Vec<u16> = (0..8)
        .map(|t| rig.driver.add(&[buf], &[], t).unwrap())
        .collect();
    assert_eq!(taken, [1, 2, 3, 4, 5, 6, 7, 0]);
}

#[test]
#[should_panic(expected = "outside or misaligned")]
fn a_shared_window_refuses_a_word_past_its_end() {
    let mut mem = DriverMemory::new(1 << 20).unwrap();
    let gpa = mem.alloc(64, 64).unwrap();
    let window = SharedWindow::new(&mem, gpa, 64).unwrap();
    // 9 bytes at 56: the second word would start at 64.
    window.store_bytes(56, &[0; 9]);
}
