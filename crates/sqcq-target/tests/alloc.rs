//! The request path allocates nothing in steady state: a counting global
//! allocator counts the allocations made on the daemon's worker threads
//! (threads named `sqcq-worker*`) while READs and WRITEs run on a RAM LUN.
//! Its own test binary: the allocator is process-wide.

// Test code: lengths and indices are small constants of the test.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use common::driver::*;
use common::*;
use sqcq_driver::scsi::Cdb;
use sqcq_target::Daemon;
use sqcq_target::config::PollOptions;
use sqcq_target::config::{BackstoreKind, DaemonConfig, DeviceConfig, QueueMap};

/// Allocations (alloc, alloc_zeroed, realloc) made on worker threads.
static WORKER_ALLOCS: AtomicU64 = AtomicU64::new(0);
/// Bytes asked for by the last few of them, to name the culprit.
static LAST_SIZES: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];

thread_local! {
    /// Whether this thread is known to be a worker (names are set once,
    /// early; a "no" is not cached in case it was asked before that).
    static IS_WORKER: Cell<bool> = const { Cell::new(false) };
}

fn on_worker() -> bool {
    IS_WORKER
        .try_with(|known| {
            if known.get() {
                return true;
            }
            let mut name = [0u8; 16];
            // SAFETY: PR_GET_NAME writes at most 16 bytes to the buffer.
            unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) };
            let worker = name.starts_with(b"sqcq-worker");
            known.set(worker);
            worker
        })
        .unwrap_or(false)
}

fn count(size: usize) {
    if on_worker() {
        let n = WORKER_ALLOCS.fetch_add(1, Ordering::Relaxed);
        LAST_SIZES[(n % 8) as usize].store(size as u64, Ordering::Relaxed);
    }
}

struct Counting;

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counting touches only atomics and a const thread-local (no allocation).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
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

/// Runs `requests` READs and WRITEs of 1 to 8 blocks in batches of up to
/// 16 in flight; checks each completed well.
fn run_io(rq: &mut Rq, requests: u32) {
    let data: Vec<u8> = (0..8 * 512).map(|i| (i % 251) as u8).collect();
    let mut done = 0;
    while done < requests {
        let batch = (requests - done).min(1 + done % 16);
        for i in 0..batch {
            let n = done + i;
            let blocks = 1 + n % 8;
            let lba = (n * 8) % 16000;
            if n % 2 == 0 {
                let len = blocks as usize * 512;
                let cdb = Cdb::write_10(lba, blocks as u16, false);
                rq.submit(lun_at(0, 0), cdb, &data[..len], 0);
            } else {
                let cdb = Cdb::read_10(lba, blocks as u16, false);
                rq.submit(lun_at(0, 0), cdb, &[], blocks * 512);
            }
        }
        rq.publish();
        for r in rq.wait(batch as usize) {
            assert!(r.good(), "{r:?}");
        }
        done += batch;
    }
}

#[test]
fn steady_state_io_allocates_nothing_on_the_worker() {
    let dir = TempDir::new("alloc");
    let socket = dir.path("scsi.sock");
    let config = DaemonConfig {
        workers: 1,
        devices: vec![DeviceConfig {
            device_type: sqcq_target::config::DeviceType::Scsi,
            socket_path: socket.clone(),
            luns: vec![lun(BackstoreKind::Ram, 8 << 20)],
            num_queues: 1,
            queue_size: QUEUE_SIZE,
            queue_map: QueueMap::default(),
            qos: Default::default(),
        }],
        // Periodic statistics format a log line per interval: not part of
        // the request path, and off here.
        poll: PollOptions {
            stats_interval: None,
            ..PollOptions::default()
        },
        admin_socket: None,
        seccomp: Default::default(),
        service: Default::default(),
    };
    let daemon = Daemon::start(&config).unwrap();
    let mut d = Driver::connect(&socket);
    assert_eq!(d.rqs.len(), 1);
    let rq = &mut d.rqs[0];
    rq.clear_unit_attention(0);

    const WARM_UP: u32 = 512;
    const MEASURED: u32 = 4096;
    run_io(rq, WARM_UP);
    let before = WORKER_ALLOCS.load(Ordering::Relaxed);
    run_io(rq, MEASURED);
    let during = WORKER_ALLOCS.load(Ordering::Relaxed) - before;
    let sizes: Vec<u64> = LAST_SIZES
        .iter()
        .map(|s| s.load(Ordering::Relaxed))
        .collect();
    eprintln!(
        "worker allocations: {before} until the end of {WARM_UP} warm-up requests \
         (queue start included), {during} during {MEASURED} more"
    );
    assert!(before > 0, "the counter sees the worker thread");
    assert_eq!(
        during, 0,
        "the request path allocated; last sizes asked for: {sizes:?}"
    );
    daemon.shutdown();
}
