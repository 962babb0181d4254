//! The driver's split queue against a hostile device: arbitrary bytes over
//! the used ring (flags, idx, elements), then `pop_used` until it stops.
//!
//! Input: `[size_log2: u8][features: u8][requests: u8][used ring bytes..]`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sqcq_driver::{Buffer, DriverMemory, QueueConfig, SplitQueue};
use vm_memory::{Bytes, GuestAddress};

const MEM_SIZE: usize = 256 << 10;

fuzz_target!(|data: &[u8]| {
    let [size_log2, features, requests, ring @ ..] = data else {
        return;
    };
    let size = 1u16 << (size_log2 % 7); // 1..=64
    let config = QueueConfig {
        size,
        event_idx: features & 1 != 0,
        indirect_max: if features & 2 != 0 { size.min(4) } else { 0 },
        packed: false,
    };
    let mut mem = DriverMemory::new(MEM_SIZE).expect("memfd");
    let mut q = SplitQueue::new(&mut mem, config).expect("queue");
    let buf = mem.alloc(4096, 4096).expect("buffer");
    let half = Buffer::new(buf, 2048);
    let other = Buffer::new(GuestAddress(buf.0 + 2048), 2048);

    // A few requests of varying shape; stop at the first full ring.
    for i in 0..usize::from(*requests % (size.min(16) + 1) as u8) {
        let r = match i % 3 {
            0 => q.add(&[half], &[], i),
            1 => q.add(&[half], &[other], i),
            _ => q.add(&[], &[half, other], i),
        };
        if r.is_err() {
            break;
        }
    }
    let _ = q.publish();

    // The device's half: flags, idx, `size` elements, avail_event.
    let used_len = 4 + 8 * usize::from(size) + 2;
    let n = ring.len().min(used_len);
    mem.guest_memory()
        .write_slice(&ring[..n], q.used_ring())
        .expect("used ring inside memory");

    let mut popped = 0u32;
    let mut errors = 0u32;
    for _ in 0..(4 * u32::from(size) + 8) {
        match q.pop_used() {
            None => break,
            Some(Ok(_)) => popped += 1,
            Some(Err(_)) => {
                errors += 1;
                // Broken is sticky: the next pop must report it again.
                assert!(q.broken().is_some());
                assert!(matches!(q.pop_used(), Some(Err(_))));
                break;
            }
        }
    }
    // A valid device cannot complete more than was in flight.
    assert!(popped <= u32::from(size), "popped {popped} from a ring of {size}");
    let _ = (errors, q.has_used(), q.used_index(), q.in_flight(), q.num_free());
});
