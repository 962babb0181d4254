//! Device-side packed rings over real guest memory: a request queue of
//! the daemon (`ServedQueue`, RAM LUN or RAM disk) on a packed ring whose
//! descriptors (addresses, lengths, IDs and every flag, so any descriptor
//! may look available on either lap, chained, indirect or not) and
//! buffers are the input, processed as a worker would, twice (the second
//! pass sees what the first left in flight and the used descriptors it
//! wrote, overwritten by the input).
//!
//! Input: `[size: u8 (size % 64 + 1 descriptors)][flags: u8 (bit 0
//! EVENT_IDX, bit 1 virtio-blk)][first pass..]` where a pass is
//! `[descriptor ring][buffer bytes]`; the rest is split in half between
//! the two passes (see `ChainHarness::run_packed`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sqcq_target::fuzzing::{ChainDevice, ChainHarness};

fuzz_target!(|data: &[u8]| {
    let [size, flags, rest @ ..] = data else {
        return;
    };
    let kind = if flags & 2 == 0 {
        ChainDevice::Scsi
    } else {
        ChainDevice::Blk
    };
    let mut h = ChainHarness::packed(*size, flags & 1 != 0, kind);
    let (first, second) = rest.split_at(rest.len() / 2);
    h.run_packed(first);
    h.run_packed(second);
});
