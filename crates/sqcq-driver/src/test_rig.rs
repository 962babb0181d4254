//! What the request layers' unit tests share: a virtqueue in any
//! notification mode, and virtio-queue's device side of it over the same
//! driver memory, played inline by the test.

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use virtio_queue::{Queue, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryMmap};

use crate::DriverMemory;
use crate::notify::{NotifyMode, QueueEvents};
use crate::sqcq::{PollGroup, PollGroupBuilder, PollThreads};
use crate::virtqueue::Virtqueue;
use crate::vring::{QueueConfig, Ring};

/// Vring `index` in `mode` (with its driver poll thread in the doorbell
/// modes), and the device's `Queue` at its addresses, ready.
pub(crate) fn queue_pair(
    mem: &mut DriverMemory,
    index: u16,
    config: QueueConfig,
    mode: NotifyMode,
    hangup: Option<OwnedFd>,
    timeout: Duration,
) -> (Virtqueue, Option<PollGroup>, Queue) {
    let mut events = QueueEvents::new(hangup, timeout).unwrap();
    let (vq, poll) = if mode.doorbells() {
        let mut group =
            PollGroupBuilder::new(PollThreads::PerDevice, sqcq_protocol::SpinConfig::default());
        let ring = Ring::new(mem, config).unwrap();
        let inline = mode == NotifyMode::SqcqInline;
        let notifier = group
            .attach(mem, index, &ring, &mut events, inline)
            .unwrap();
        let vq = Virtqueue::with_notifier(index, ring, notifier, events);
        (vq, Some(group.start().unwrap()))
    } else {
        (
            Virtqueue::new(mem, index, config, mode, events).unwrap(),
            None,
        )
    };
    let [desc, avail, used] = vq.addresses();
    let mut device = Queue::new(config.size).unwrap();
    let split = |gpa: GuestAddress| {
        (
            Some(u32::try_from(gpa.0 & 0xffff_ffff).unwrap()),
            Some(u32::try_from(gpa.0 >> 32).unwrap()),
        )
    };
    let (lo, hi) = split(desc);
    device.set_desc_table_address(lo, hi);
    let (lo, hi) = split(avail);
    device.set_avail_ring_address(lo, hi);
    let (lo, hi) = split(used);
    device.set_used_ring_address(lo, hi);
    device.set_event_idx(config.event_idx);
    device.set_ready(true);
    (vq, poll, device)
}

/// Waits until the driver of the split ring whose avail ring is at
/// `avail` (of `size` entries) has asked, with EVENT_IDX, for an interrupt
/// at used entry `next_used` (its `used_event`): from then on the device
/// owes it a call for that entry. Waiting for the store rather than for a
/// time keeps a test independent of the scheduler.
pub(crate) fn wait_for_used_event(
    mem: &GuestMemoryMmap,
    avail: GuestAddress,
    size: u16,
    next_used: u16,
) {
    let used_event = avail.unchecked_add(4 + 2 * u64::from(size));
    let deadline = Instant::now() + Duration::from_secs(20);
    while u16::from_le(mem.load(used_event, Ordering::Acquire).unwrap()) != next_used {
        assert!(
            Instant::now() < deadline,
            "the driver never armed used_event"
        );
        std::thread::yield_now();
    }
}

/// Asserts the layout of each request's header `(address, length)`, the
/// part of its response the device always writes `(address, length)` and
/// the whole response `(address, length)`: the header starts a cache line,
/// the always-written part lies in that same line (one line for the device
/// to read the request and write its status in), and no two requests'
/// headers and responses share a line (one side's stores for one request
/// never pull a line the other side is reading for another).
pub(crate) type RequestAreas = (
    (GuestAddress, u32),
    (GuestAddress, u32),
    (GuestAddress, u32),
);

/// See [`RequestAreas`].
pub(crate) fn assert_one_line_per_request(requests: &[RequestAreas]) {
    let line = crate::memory::CACHE_LINE as u64;
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for &((hdr, hdr_len), (resp, resp_len), (whole, whole_len)) in requests {
        assert_eq!(
            hdr.0 % line,
            0,
            "header at {:#x} is not line aligned",
            hdr.0
        );
        assert!(
            resp.0 >= hdr.0 + u64::from(hdr_len) && resp.0 + u64::from(resp_len) <= hdr.0 + line,
            "response part {:#x}+{resp_len} is not in the line of its header at {:#x}+{hdr_len}",
            resp.0,
            hdr.0
        );
        assert!(
            whole.0 >= hdr.0 + u64::from(hdr_len),
            "response {:#x} overlaps its header",
            whole.0
        );
        spans.push((
            hdr.0,
            (whole.0 + u64::from(whole_len)).next_multiple_of(line),
        ));
    }
    spans.sort_unstable();
    for w in spans.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "requests {:#x?} and {:#x?} share a line",
            w[0],
            w[1]
        );
    }
}
