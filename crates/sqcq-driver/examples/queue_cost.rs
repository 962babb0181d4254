//! The driver's own cost per request, without a device process or a
//! notification: one thread submits, publishes and reaps SCSI READ (10)
//! commands of 4 KiB on a `ScsiQueue` in poll-queue mode, and plays
//! virtio-queue's device side in between (completing everything with a
//! zeroed response, which is GOOD); then the same with the device on a
//! thread of its own, spinning on the avail ring, while the submitter
//! keeps the queue depth and spins on the used ring. Prints nanoseconds
//! per request at queue depth 1 and 32, the median of 7 runs of 200,000
//! requests each. For comparing two versions of the driver side by side:
//! the figures include virtio-queue's device side.
//!
//! `cargo run --release -p sqcq-driver --example queue_cost`

use std::time::{Duration, Instant};

use sqcq_driver::scsi::{Cdb, Command, Data, Lun, ScsiConfig, ScsiQueue};
use sqcq_driver::{Buffer, DriverMemory, NotifyMode, QueueConfig, QueueEvents, Virtqueue};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const SIZE: u16 = 128;
const REQUESTS: u64 = 200_000;

/// The driver's SCSI queue in `poll-queue` mode and virtio-queue's device
/// side of it, over fresh memory with 32 data pages.
fn setup() -> (
    DriverMemory,
    Queue,
    GuestAddress,
    GuestMemoryMmap,
    ScsiQueue,
) {
    let mut mem = DriverMemory::new(8 << 20).expect("memory");
    let events = QueueEvents::new(None, Duration::from_secs(5)).expect("eventfds");
    let config = QueueConfig {
        size: SIZE,
        event_idx: true,
        indirect_max: 4,
        packed: false,
    };
    let vq = Virtqueue::new(&mut mem, 0, config, NotifyMode::PollQueue, events).expect("queue");
    let [desc, avail, used] = vq.addresses();
    let mut device = Queue::new(SIZE).expect("device queue");
    let half = |gpa: GuestAddress| {
        (
            u32::try_from(gpa.0 & 0xffff_ffff).ok(),
            u32::try_from(gpa.0 >> 32).ok(),
        )
    };
    let (lo, hi) = half(desc);
    device.set_desc_table_address(lo, hi);
    let (lo, hi) = half(avail);
    device.set_avail_ring_address(lo, hi);
    let (lo, hi) = half(used);
    device.set_used_ring_address(lo, hi);
    device.set_event_idx(true);
    device.set_ready(true);
    let data = mem.alloc(4096 * 32, 4096).expect("data");
    let gm = mem.guest_memory().clone();
    let queue = ScsiQueue::new(&mut mem, vq, &ScsiConfig::default()).expect("scsi queue");
    (mem, device, data, gm, queue)
}

fn run(depth: u64) -> Duration {
    let (_mem, mut device, data, gm, mut queue) = setup();
    let lun = Lun::new(0, 0).expect("lun");
    let zeros = [0u8; 128];
    let start = Instant::now();
    let mut done = 0;
    while done < REQUESTS {
        for i in 0..depth {
            let buf = [Buffer::new(GuestAddress(data.0 + 4096 * i), 4096)];
            let lba = u32::try_from(i * 8).unwrap_or(0);
            let cmd = Command::new(lun, Cdb::read_10(lba, 8, false), Data::FromDevice(&buf));
            queue.submit(&cmd, i).expect("submit");
        }
        queue.publish(|_| panic!("failed")).expect("publish");
        while let Some(chain) = device.pop_descriptor_chain(&gm) {
            let head = chain.head_index();
            let mut len = 0;
            for d in chain.filter(|d| d.is_write_only()) {
                if len == 0 {
                    gm.write_slice(&zeros[..108], d.addr()).expect("response");
                }
                len += d.len();
            }
            device.add_used(&gm, head, len).expect("used");
        }
        let mut n = 0;
        while n < depth {
            queue
                .wait_and_reap(|c| {
                    assert!(c.result.is_ok());
                    n += 1;
                })
                .expect("reap");
        }
        done += depth;
    }
    start.elapsed()
}

/// The same with the device on its own thread, spinning on the avail
/// ring: the submitter spins on the used ring as `poll-queue` does.
fn run_threaded(depth: u64) -> Duration {
    let (_mem, mut device, data, gm, mut queue) = setup();
    let lun = Lun::new(0, 0).expect("lun");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dev_stop = stop.clone();
    let dev_gm = gm.clone();
    let dev = std::thread::spawn(move || {
        let zeros = [0u8; 128];
        while !dev_stop.load(std::sync::atomic::Ordering::Relaxed) {
            while let Some(chain) = device.pop_descriptor_chain(&dev_gm) {
                let head = chain.head_index();
                let mut len = 0;
                for d in chain.filter(|d| d.is_write_only()) {
                    if len == 0 {
                        dev_gm
                            .write_slice(&zeros[..108], d.addr())
                            .expect("response");
                    }
                    len += d.len();
                }
                device.add_used(&dev_gm, head, len).expect("used");
            }
            std::hint::spin_loop();
        }
    });
    let start = Instant::now();
    let mut done = 0;
    let mut free: Vec<u64> = (0..depth).collect();
    while done < REQUESTS {
        let mut added = false;
        while let Some(i) = free.pop() {
            let buf = [Buffer::new(GuestAddress(data.0 + 4096 * i), 4096)];
            let lba = u32::try_from(i * 8).unwrap_or(0);
            let cmd = Command::new(lun, Cdb::read_10(lba, 8, false), Data::FromDevice(&buf));
            queue.submit(&cmd, i).expect("submit");
            added = true;
        }
        if added {
            queue.publish(|_| panic!("failed")).expect("publish");
        }
        queue
            .wait_and_reap(|c| {
                assert!(c.result.is_ok());
                free.push(c.token);
                done += 1;
            })
            .expect("reap");
    }
    let elapsed = start.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = dev.join();
    elapsed
}

fn main() {
    for depth in [1, 32] {
        let mut runs: Vec<Duration> = (0..7).map(|_| run(depth)).collect();
        runs.sort();
        let ns = runs[3].as_secs_f64() * 1e9 / REQUESTS as f64;
        println!("QD{depth}: {ns:.0} ns per request (driver and inline device)");
        let mut runs: Vec<Duration> = (0..7).map(|_| run_threaded(depth)).collect();
        runs.sort();
        let ns = runs[3].as_secs_f64() * 1e9 / REQUESTS as f64;
        println!("QD{depth}: {ns:.0} ns per request (device thread, poll-queue)");
    }
}
