//! `doorbell_location` and `check_index` on arbitrary input; every `Ok`
//! must satisfy the invariants documented in sqcq-protocol's layout module.
//!
//! Input: `[desc: u64][avail: u64][used: u64][queue_size: u16][value: u16][position: u16]`, little-endian.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sqcq_protocol::{RingAddrs, check_index, doorbell_location};

// The documented layout (sqcq-protocol's layout module; the constants are
// not re-exported): sq = align_up(used + 6 + 8 * size, 128), cq = sq + 64.
const DOORBELL_SIZE: u64 = 64;
const DOORBELL_AREA_ALIGN: u64 = 128;
const DOORBELL_AREA_SIZE: u64 = 2 * DOORBELL_SIZE;

fn u64_at(d: &[u8], i: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[i..i + 8]);
    u64::from_le_bytes(b)
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 30 {
        return;
    }
    let ring = RingAddrs {
        desc: u64_at(data, 0),
        avail: u64_at(data, 8),
        used: u64_at(data, 16),
    };
    let queue_size = u16::from_le_bytes([data[24], data[25]]);
    let value = u16::from_le_bytes([data[26], data[27]]);
    let position = u16::from_le_bytes([data[28], data[29]]);

    if let Ok(loc) = doorbell_location(ring, queue_size) {
        let q = u128::from(queue_size);
        let (sq, cq) = (u128::from(loc.sq), u128::from(loc.cq));
        assert!(queue_size.is_power_of_two() && queue_size <= 32768);
        assert_eq!(sq % u128::from(DOORBELL_AREA_ALIGN), 0, "{loc:?}");
        assert_eq!(cq, sq + u128::from(DOORBELL_SIZE), "{loc:?}");
        assert_eq!(u128::from(loc.end()), sq + u128::from(DOORBELL_AREA_SIZE));
        // After the used ring, its trailing avail_event included.
        let used_end = u128::from(ring.used) + 6 + 8 * q;
        assert!(sq >= used_end, "{ring:?} {loc:?}");
        assert!(sq - used_end < u128::from(DOORBELL_AREA_ALIGN));
        // No overlap with the descriptor table or the avail ring.
        let end = sq + u128::from(DOORBELL_AREA_SIZE);
        assert!(end <= u128::from(u64::MAX), "{loc:?} overflows");
        for (start, len) in [(ring.desc, 16 * q), (ring.avail, 6 + 2 * q)] {
            let start = u128::from(start);
            assert!(end <= start || sq >= start + len, "{ring:?} {queue_size} {loc:?}");
        }
        assert_eq!(ring.desc % 16, 0);
        assert_eq!(ring.avail % 2, 0);
        assert_eq!(ring.used % 4, 0);
    }

    match check_index(value, position, queue_size) {
        Ok(d) => {
            assert!(d.unsigned_abs() <= u32::from(queue_size));
            assert_eq!(position.wrapping_add_signed(d as i16), value);
        }
        Err(e) => assert!(e.distance.unsigned_abs() > u32::from(queue_size)),
    }
});
