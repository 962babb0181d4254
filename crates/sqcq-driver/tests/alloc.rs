//! The driver's request path allocates nothing in steady state: a counting
//! global allocator counts what the submitting thread allocates while it
//! submits, publishes and reaps virtio-blk and virtio-scsi requests (the
//! device, virtio-queue's, runs between those steps with counting off).
//! Its own test binary: the allocator is process-wide.

// Test code: lengths and indices are small constants of the test.
#![allow(clippy::cast_possible_truncation)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqcq_driver::blk::{BlkQueue, Request};
use sqcq_driver::scsi::{Cdb, Command, Data, Lun, ScsiConfig, ScsiQueue};
use sqcq_driver::{Buffer, DriverMemory, NotifyMode, QueueConfig, QueueEvents, Virtqueue};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Allocations made while counting was on.
static ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn count() {
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

struct Counting;

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counting touches only an atomic and a const thread-local (no allocation).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f` with this thread's allocations counted.
fn counted<R>(f: impl FnOnce() -> R) -> R {
    COUNTING.with(|c| c.set(true));
    let r = f();
    COUNTING.with(|c| c.set(false));
    r
}

const SIZE: u16 = 64;
const DEPTH: u64 = 8;

/// A ring in a fresh memory, its device side, and a data buffer.
fn setup(mode: NotifyMode) -> (DriverMemory, Virtqueue, Queue, GuestAddress) {
    let mut mem = DriverMemory::new(4 << 20).unwrap();
    let events = QueueEvents::new(None, Duration::from_secs(5)).unwrap();
    let config = QueueConfig {
        size: SIZE,
        event_idx: true,
        indirect_max: 4,
        packed: false,
    };
    let vq = Virtqueue::new(&mut mem, 0, config, mode, events).unwrap();
    let [desc, avail, used] = vq.addresses();
    let mut device = Queue::new(SIZE).unwrap();
    let lo_hi = |gpa: GuestAddress| {
        (
            Some(u32::try_from(gpa.0 & 0xffff_ffff).unwrap()),
            Some(u32::try_from(gpa.0 >> 32).unwrap()),
        )
    };
    let (lo, hi) = lo_hi(desc);
    device.set_desc_table_address(lo, hi);
    let (lo, hi) = lo_hi(avail);
    device.set_avail_ring_address(lo, hi);
    let (lo, hi) = lo_hi(used);
    device.set_used_ring_address(lo, hi);
    device.set_event_idx(true);
    device.set_ready(true);
    let data = mem.alloc(4096 * DEPTH as usize, 4096).unwrap();
    (mem, vq, device, data)
}

/// The device completes everything available, zeroing every writable
/// buffer: a zero status byte is virtio-blk's OK, a zeroed response
/// header virtio-scsi's OK with GOOD status.
fn device_completes(
    device: &mut Queue,
    gm: &GuestMemoryMmap,
    call: &vmm_sys_util::eventfd::EventFd,
) {
    while let Some(chain) = device.pop_descriptor_chain(gm) {
        let head = chain.head_index();
        let mut len = 0;
        for d in chain.filter(|d| d.is_write_only()) {
            gm.write_slice(&vec![0u8; d.len() as usize], d.addr())
                .unwrap();
            len += d.len();
        }
        device.add_used(gm, head, len).unwrap();
    }
    call.write(1).unwrap();
}

/// `rounds` rounds of DEPTH requests through `submit`, `publish` and
/// `reap`, counting the driver side's allocations after a warm-up round.
fn steady_state(
    rounds: u64,
    mut submit: impl FnMut(u64),
    mut publish: impl FnMut(),
    mut reap: impl FnMut() -> usize,
    mut device: impl FnMut(),
) -> u64 {
    // Round 0 warms up (the reusable vectors reach their size); the
    // rounds after it are counted.
    for round in 0..=rounds {
        let run = |f: &mut dyn FnMut()| {
            if round == 0 {
                f();
            } else {
                counted(f);
            }
        };
        run(&mut || {
            for i in 0..DEPTH {
                submit(i);
            }
            publish();
        });
        device();
        let mut n = 0;
        while n < DEPTH as usize {
            run(&mut || n += reap());
        }
    }
    ALLOCS.load(Ordering::Relaxed)
}

#[test]
fn blk_and_scsi_requests_allocate_nothing_in_steady_state() {
    for mode in [
        NotifyMode::Notify,
        NotifyMode::PollQueue,
        NotifyMode::RingPoll,
    ] {
        // virtio-blk: reads and writes.
        let (mut mem, vq, mut device, data) = setup(mode);
        let call = vq.events().call_fd().try_clone().unwrap();
        let gm = mem.guest_memory().clone();
        let mut queue = BlkQueue::new(&mut mem, vq).unwrap();
        let queue = std::cell::RefCell::new(&mut queue);
        let bufs: Vec<[Buffer; 1]> = (0..DEPTH)
            .map(|i| [Buffer::new(GuestAddress(data.0 + 4096 * i), 4096)])
            .collect();
        let start = ALLOCS.load(Ordering::Relaxed);
        let end = steady_state(
            200,
            |i| {
                let sector = i * 8;
                let data = &bufs[i as usize];
                let req = if i % 2 == 0 {
                    Request::Read { sector, data }
                } else {
                    Request::Write { sector, data }
                };
                queue.borrow_mut().submit(&req, i).unwrap();
            },
            || queue.borrow_mut().publish(|_| panic!("failed")).unwrap(),
            || {
                queue
                    .borrow_mut()
                    .wait_and_reap(|c| assert!(c.result.is_ok(), "{c:?}"))
                    .unwrap()
            },
            || device_completes(&mut device, &gm, &call),
        );
        assert_eq!(end - start, 0, "blk {mode}: allocations per 1600 I/Os");

        // virtio-scsi: READ and WRITE (10).
        let (mut mem, vq, mut device, data) = setup(mode);
        let call = vq.events().call_fd().try_clone().unwrap();
        let gm = mem.guest_memory().clone();
        let mut queue = ScsiQueue::new(&mut mem, vq, &ScsiConfig::default()).unwrap();
        let queue = std::cell::RefCell::new(&mut queue);
        let lun = Lun::new(0, 0).unwrap();
        let start = ALLOCS.load(Ordering::Relaxed);
        let end = steady_state(
            200,
            |i| {
                let lba = u32::try_from(i * 8).unwrap();
                let buf = [Buffer::new(GuestAddress(data.0 + 4096 * i), 4096)];
                let cmd = if i % 2 == 0 {
                    Command::new(lun, Cdb::read_10(lba, 8, false), Data::FromDevice(&buf))
                } else {
                    Command::new(lun, Cdb::write_10(lba, 8, false), Data::ToDevice(&buf))
                };
                queue.borrow_mut().submit(&cmd, i).unwrap();
            },
            || queue.borrow_mut().publish(|_| panic!("failed")).unwrap(),
            || {
                queue
                    .borrow_mut()
                    .wait_and_reap(|c| assert!(c.result.is_ok(), "{c:?}"))
                    .unwrap()
            },
            || device_completes(&mut device, &gm, &call),
        );
        assert_eq!(end - start, 0, "scsi {mode}: allocations per 1600 I/Os");
    }
}
