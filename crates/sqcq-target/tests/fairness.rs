//! Long commands are done in slices: a WRITE SAME or UNMAP over a large
//! range never holds the worker it runs on, whose other queues go on
//! being served, and it completes with the right status however many
//! backstore operations it takes.

// Test code: lengths and indices are small constants of the test.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

mod common;

use common::*;
use sqcq_target::Daemon;
use sqcq_target::config::{BackstoreKind, DaemonConfig, DeviceConfig, QueueMap};

/// 256 MiB of RAM: a WRITE SAME over all of it is 1024 slices.
const BIG: u64 = 256 << 20;

fn start_big(dir: &TempDir) -> (Daemon, std::path::PathBuf) {
    let socket = dir.path("scsi.sock");
    let config = DaemonConfig {
        workers: 1,
        devices: vec![DeviceConfig {
            device_type: sqcq_target::config::DeviceType::Scsi,
            socket_path: socket.clone(),
            luns: vec![lun(BackstoreKind::Ram, BIG)],
            num_queues: 2,
            queue_size: QUEUE_SIZE,
            // Both request queues on the one worker.
            queue_map: QueueMap::default(),
        }],
        poll: Default::default(),
        admin_socket: None,
        seccomp: Default::default(),
    };
    config.validate().unwrap();
    (Daemon::start(&config).unwrap(), socket)
}

/// WRITE SAME(16) of `blocks` blocks at `lba` (data-out: one block).
fn write_same16(lba: u64, blocks: u32, unmap: bool) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x93;
    c[1] = if unmap { 0x08 } else { 0 };
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn read16(lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x88;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

#[test]
fn a_write_same_of_many_slices_succeeds_and_writes_every_block() {
    let dir = TempDir::new("ws-status");
    let (daemon, socket) = start_big(&dir);
    let mut g = Guest::new();
    let mut qs = vqs();
    let _fe = connect(&socket, &g, &mut qs, true);
    let vq = &mut qs[2];
    clear_unit_attention(vq, &mut g, 0);
    let pattern: Vec<u8> = (0..512).map(|i| (i % 199) as u8 | 1).collect();
    // More than 32768 blocks: more backstore operations than the queue
    // has slots, which used to fail with HARDWARE ERROR after writing.
    let blocks = 40_000u32;
    let (r, _) = command(
        vq,
        &mut g,
        lun_field(0, 0),
        &write_same16(10, blocks, false),
        &pattern,
        0,
    );
    assert_eq!((r.response, r.status), (0, 0), "WRITE SAME: {r:?}");
    for lba in [10, 10 + u64::from(blocks) / 2, 9 + u64::from(blocks)] {
        let (r, data) = command(vq, &mut g, lun_field(0, 0), &read16(lba, 1), &[], 512);
        assert_eq!((r.response, r.status), (0, 0), "READ {lba}: {r:?}");
        assert_eq!(data, pattern, "block {lba}");
    }
    let (_, data) = command(
        vq,
        &mut g,
        lun_field(0, 0),
        &read16(9 + u64::from(blocks) + 1, 1),
        &[],
        512,
    );
    assert!(
        data.iter().all(|&b| b == 0),
        "the block after the range is untouched"
    );

    // UNMAP-style WRITE SAME over the same range: zeros again.
    let zeros = vec![0u8; 512];
    let (r, _) = command(
        vq,
        &mut g,
        lun_field(0, 0),
        &write_same16(10, blocks, true),
        &zeros,
        0,
    );
    assert_eq!((r.response, r.status), (0, 0), "WRITE SAME UNMAP: {r:?}");
    let (_, data) = command(
        vq,
        &mut g,
        lun_field(0, 0),
        &read16(9 + u64::from(blocks), 1),
        &[],
        512,
    );
    assert!(data.iter().all(|&b| b == 0));
    daemon.shutdown();
}

#[test]
fn a_huge_write_same_does_not_hold_the_worker() {
    let dir = TempDir::new("ws-fair");
    let (daemon, socket) = start_big(&dir);
    let mut g = Guest::new();
    let mut qs = vqs();
    let _fe = connect(&socket, &g, &mut qs, true);
    let (a, b) = qs.split_at_mut(3);
    let (a, b) = (&mut a[2], &mut b[0]);
    clear_unit_attention(a, &mut g, 0);
    clear_unit_attention(b, &mut g, 0);
    let pattern = vec![0x5au8; 512];
    let blocks = u32::try_from(BIG / 512).unwrap();
    // Without slicing the worker finishes the WRITE SAME before it looks
    // at the other queue, always; with slicing the other queue's command
    // completes first. A scheduler that stalls this thread for the whole
    // WRITE SAME between the two kicks could make one attempt fail, so
    // the test allows three.
    let mut interleaved = false;
    for _ in 0..3 {
        let ws = submit(
            a,
            &mut g,
            lun_field(0, 0),
            &write_same16(0, blocks, false),
            &pattern,
            0,
        );
        let inq = submit(b, &mut g, lun_field(0, 0), &inquiry(36), &[], 36);
        a.kick(&g);
        b.kick(&g);
        assert_eq!(b.wait_used(&g).0, inq.head);
        let ws_done = a.used_idx(&g) != a.last_used;
        assert_eq!(a.wait_used(&g).0, ws.head);
        let r = read_resp(&g, ws.resp);
        assert_eq!((r.response, r.status), (0, 0), "WRITE SAME: {r:?}");
        if !ws_done {
            interleaved = true;
            break;
        }
    }
    assert!(
        interleaved,
        "the other queue waited for the whole WRITE SAME"
    );
    daemon.shutdown();
}
