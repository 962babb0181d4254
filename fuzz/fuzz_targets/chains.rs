//! Device-side descriptor chains over real guest memory: a request queue
//! of the daemon (`ServedQueue`, RAM LUN) whose descriptor table, avail
//! ring and buffers are the input, processed as a worker would, twice (the
//! second pass sees what the first left in flight).
//!
//! Bit 1 of the flags byte picks the device: virtio-scsi (RAM LUN) or
//! virtio-blk (RAM disk).
//!
//! Input: `[size_log2: u8][flags: u8 (bit 0 EVENT_IDX)][first pass..]` where a pass is
//! `[avail count: u8][descriptor table][avail entries][buffer bytes]`; the
//! rest is split in half between the two passes (see `ChainHarness::run`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sqcq_target::fuzzing::{ChainDevice, ChainHarness};

fuzz_target!(|data: &[u8]| {
    let [size_log2, flags, rest @ ..] = data else {
        return;
    };
    let kind = if flags & 2 == 0 {
        ChainDevice::Scsi
    } else {
        ChainDevice::Blk
    };
    let mut h = ChainHarness::with_device(*size_log2, flags & 1 != 0, kind);
    let (first, second) = rest.split_at(rest.len() / 2);
    h.run(first);
    h.run(second);
});
