//! Long commands are done in slices: a WRITE SAME or UNMAP over a large
//! range never holds the worker it runs on, whose other queues go on
//! being served, and it completes with the right status however many
//! backstore operations it takes.

// Test code: lengths and indices are small constants of the test.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

mod common;

use common::driver::*;
use common::*;
use sqcq_driver::scsi::Cdb;
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
            qos: Default::default(),
        }],
        poll: Default::default(),
        admin_socket: None,
        seccomp: Default::default(),
        service: Default::default(),
    };
    config.validate().unwrap();
    (Daemon::start(&config).unwrap(), socket)
}

#[test]
fn a_write_same_of_many_slices_succeeds_and_writes_every_block() {
    let dir = TempDir::new("ws-status");
    let (daemon, socket) = start_big(&dir);
    let mut d = Driver::connect(&socket);
    let rq = &mut d.rqs[0];
    rq.clear_unit_attention(0);
    let lun = lun_at(0, 0);
    let pattern: Vec<u8> = (0..512).map(|i| (i % 199) as u8 | 1).collect();
    // More than 32768 blocks: more backstore operations than the queue
    // has slots, which used to fail with HARDWARE ERROR after writing.
    let blocks = 40_000u32;
    let r = rq.command(lun, Cdb::write_same_16(10, blocks, false), &pattern, 0);
    assert!(r.good(), "WRITE SAME: {r:?}");
    for lba in [10, 10 + u64::from(blocks) / 2, 9 + u64::from(blocks)] {
        let r = rq.command(lun, Cdb::read_16(lba, 1, false), &[], 512);
        assert!(r.good(), "READ {lba}: {r:?}");
        assert_eq!(r.data, pattern, "block {lba}");
    }
    let after = 9 + u64::from(blocks) + 1;
    let r = rq.command(lun, Cdb::read_16(after, 1, false), &[], 512);
    assert!(r.good(), "{r:?}");
    assert!(
        r.data.iter().all(|&b| b == 0),
        "the block after the range is untouched"
    );

    // UNMAP-style WRITE SAME over the same range: zeros again.
    let zeros = vec![0u8; 512];
    let r = rq.command(lun, Cdb::write_same_16(10, blocks, true), &zeros, 0);
    assert!(r.good(), "WRITE SAME UNMAP: {r:?}");
    let r = rq.command(lun, Cdb::read_16(9 + u64::from(blocks), 1, false), &[], 512);
    assert!(r.good(), "{r:?}");
    assert!(r.data.iter().all(|&b| b == 0));
    daemon.shutdown();
}

#[test]
fn a_huge_write_same_does_not_hold_the_worker() {
    let dir = TempDir::new("ws-fair");
    let (daemon, socket) = start_big(&dir);
    let mut d = Driver::connect(&socket);
    let (a, b) = d.two_rqs();
    a.clear_unit_attention(0);
    b.clear_unit_attention(0);
    let pattern = vec![0x5au8; 512];
    let blocks = u32::try_from(BIG / 512).unwrap();
    // Without slicing the worker finishes the WRITE SAME before it looks
    // at the other queue, always; with slicing the other queue's command
    // completes first. A scheduler that stalls this thread for the whole
    // WRITE SAME between the two publishes could make one attempt fail,
    // so the test allows three.
    let mut interleaved = false;
    for _ in 0..3 {
        a.submit(
            lun_at(0, 0),
            Cdb::write_same_16(0, blocks, false),
            &pattern,
            0,
        );
        b.submit(lun_at(0, 0), Cdb::inquiry(None, 36), &[], 36);
        a.publish();
        b.publish();
        let r = b.wait(1).pop().unwrap();
        assert!(r.good(), "INQUIRY: {r:?}");
        let ws_done = a.queue.virtqueue().ring().has_used();
        let r = a.wait(1).pop().unwrap();
        assert!(r.good(), "WRITE SAME: {r:?}");
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
