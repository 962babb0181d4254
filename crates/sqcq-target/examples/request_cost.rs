//! The request path's instructions per request, counted without threads
//! or wakeups: the fuzzing harness's request queue
//! (`sqcq_target::fuzzing::ChainHarness`, a RAM disk, one worker's
//! `process` and passes on this thread) fed batches of well-formed 4 KiB
//! reads. Under callgrind the count varies by up to about 10 from run to
//! run (reading the clock, and calibrating it, takes a varying number of
//! instructions under valgrind), so the cost of a
//! change (e.g. "QoS costs nothing when off") is the difference
//! between two builds; `scripts/request-cost.sh` runs it.
//!
//! ```text
//! cargo build --release -p sqcq-target --features fuzzing --example request_cost
//! valgrind --tool=callgrind target/release/examples/request_cost blk|scsi ITERATIONS CHAINS [empty]
//! ```
//!
//! Each iteration lays out the same descriptor table and the buffers of
//! `CHAINS` (1..=21) chains and makes them available as one batch; with
//! `empty` the harness does all the same writing but makes nothing
//! available, so the difference between the two runs, divided by the
//! requests, is what the queue spends per request (its share of a batch
//! of `CHAINS` included).
//! The build has the dev-dependencies' features (`fault-injection`) too:
//! compare builds made the same way.

use sqcq_target::fuzzing::{CHAIN_MEM, ChainDevice, ChainHarness};

/// Guest address the harness copies its buffer bytes to (its `DATA`).
const DATA: u64 = 0x4000;
/// Bytes of guest memory each chain's buffers take.
const STRIDE: u64 = 0x2000;
/// Descriptors per chain (header, status or response, data).
const PER_CHAIN: u16 = 3;
/// The ring's size: the harness's largest, `2^6`.
const SIZE_LOG2: u8 = 6;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: request_cost blk|scsi ITERATIONS CHAINS(1..=21) [empty]";
    let empty = args.get(3).is_some_and(|a| a == "empty");
    let (kind, iterations, chains) = match args.as_slice() {
        [k, i, c] | [k, i, c, _] => (
            match k.as_str() {
                "blk" => ChainDevice::Blk,
                "scsi" => ChainDevice::Scsi,
                _ => exit(usage),
            },
            i.parse::<u32>().unwrap_or_else(|_| exit(usage)),
            c.parse::<u16>().unwrap_or_else(|_| exit(usage)),
        ),
        _ => exit(usage),
    };
    let size = 1u16 << SIZE_LOG2;
    if chains == 0 || chains > size / PER_CHAIN {
        exit(usage);
    }
    let mut input = batch(kind, size, chains);
    let made_available = if empty {
        input[0] = 0;
        0
    } else {
        chains
    };
    let mut harness = ChainHarness::with_device(SIZE_LOG2, false, kind);
    for _ in 0..iterations {
        harness.run(&input);
    }
    // Every request made available completed (and nothing else did).
    let (published, completed) = harness.counts();
    let expected = u64::from(iterations) * u64::from(made_available);
    if (published, completed) != (expected, expected) {
        eprintln!("request_cost: {completed} of {published} requests completed, {expected} made");
        std::process::exit(1);
    }
    println!("{completed} requests");
}

fn exit(usage: &str) -> ! {
    eprintln!("{usage}");
    std::process::exit(2)
}

/// The harness's input for one batch: `[count][descriptor table][avail
/// entries][buffer bytes]`, `chains` reads of 4 KiB at LBA 0 (with count
/// 0 the entries are buffer bytes the harness copies just the same).
fn batch(kind: ChainDevice, size: u16, chains: u16) -> Vec<u8> {
    const READ: u16 = 0;
    const WRITE: u16 = 2;
    const NEXT: u16 = 1;
    let mut table = vec![0u8; 16 * usize::from(size)];
    // Up to the last chain's header: the harness copies all of it, every
    // iteration.
    let mut buffers = vec![0u8; usize::try_from(STRIDE * u64::from(chains - 1) + 64).unwrap_or(0)];
    for k in 0..chains {
        let base = STRIDE * u64::from(k);
        let (header, header_len, status, status_len) = match kind {
            // virtio_blk_outhdr: IN, priority 0, sector 0.
            ChainDevice::Blk => (vec![0u8; 16], 16u32, 0x100u64, 1u32),
            // virtio_scsi_cmd_req (CDB size 32): LUN 0 of target 0, a tag,
            // SIMPLE, READ(10) of 8 blocks at LBA 0.
            ChainDevice::Scsi => {
                let mut h = vec![0u8; 51];
                h[0] = 1;
                h[8..16].copy_from_slice(&u64::from(k + 1).to_le_bytes());
                h[19..29].copy_from_slice(&[0x28, 0, 0, 0, 0, 0, 0, 0, 8, 0]);
                (h, 51, 0x100, 108)
            }
        };
        let at = usize::try_from(base).unwrap_or(0);
        buffers[at..at + header.len()].copy_from_slice(&header);
        let (data_at, data_len) = (0x1000u64, 4096u32);
        // Addresses are given relative to DATA: the harness folds an
        // address `a` to `DATA + a % (CHAIN_MEM - DATA)`.
        let descs = match kind {
            // Header, data, status: the order virtio-blk expects.
            ChainDevice::Blk => [
                (base, header_len, READ),
                (base + data_at, data_len, WRITE),
                (base + status, status_len, WRITE),
            ],
            // Request, response, data-in.
            ChainDevice::Scsi => [
                (base, header_len, READ),
                (base + status, status_len, WRITE),
                (base + data_at, data_len, WRITE),
            ],
        };
        for (j, (addr, len, flags)) in descs.into_iter().enumerate() {
            let i = k * PER_CHAIN + u16::try_from(j).unwrap_or(0);
            let last = j + 1 == descs.len();
            let d = &mut table[16 * usize::from(i)..][..16];
            debug_assert!(addr < CHAIN_MEM - DATA);
            d[..8].copy_from_slice(&addr.to_le_bytes());
            d[8..12].copy_from_slice(&len.to_le_bytes());
            let flags = flags | if last { 0 } else { NEXT };
            d[12..14].copy_from_slice(&flags.to_le_bytes());
            d[14..16].copy_from_slice(&(if last { 0 } else { i + 1 }).to_le_bytes());
        }
    }
    let mut input = vec![u8::try_from(chains).unwrap_or(0)];
    input.extend_from_slice(&table);
    for k in 0..chains {
        input.extend_from_slice(&(k * PER_CHAIN).to_le_bytes());
    }
    input.extend_from_slice(&buffers);
    input
}
