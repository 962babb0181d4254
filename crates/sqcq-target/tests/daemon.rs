//! The daemon in process, on a real Unix socket, driven by sqcq-driver
//! with memfd guest memory and real eventfds.

// Test code: lengths and indices are small constants of the test.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

mod common;

use common::driver::*;
use common::*;
use sqcq_driver::scsi::{Cdb, Done};

#[test]
fn io_on_two_queues_and_two_workers_survives_reconnect() {
    let dir = TempDir::new("io");
    let (daemon, socket) = start(&dir, 2);
    let pattern: Vec<u8> = (0..8 * 512).map(|i| (i % 251) as u8).collect();

    for round in 0..2 {
        let mut d = Driver::connect_with(
            &socket,
            Options {
                event_idx: round == 0,
                ..Options::default()
            },
        );
        let (rq0, rq1) = d.two_rqs();
        rq0.clear_unit_attention(0);

        let r = rq0.command(lun_at(0, 0), Cdb::inquiry(None, 96), &[], 96);
        assert!(r.good(), "{r:?}");
        assert_eq!(r.data[0], 0x00, "direct-access block device");
        assert_eq!(&r.data[8..12], b"SQCQ", "vendor {:?}", &r.data[8..16]);
        assert_eq!(
            r.resid(),
            96 - (u32::from(r.data[4]) + 5),
            "residual of INQUIRY"
        );

        if round == 0 {
            let r = rq0.command(lun_at(0, 0), Cdb::write_10(8, 8, false), &pattern, 0);
            assert!(r.good(), "WRITE: {r:?}");
        }
        // Read it back through the other queue, served by the other worker
        // (and, in round 1, by a new connection).
        rq1.clear_unit_attention(0);
        let r = rq1.command(lun_at(0, 0), Cdb::read_10(8, 8, false), &[], 4096);
        assert_eq!(r.result, Ok(Done { resid: 0 }), "READ");
        assert_eq!(r.data, pattern, "round {round}: data read back differs");

        // A data-in buffer larger than the transfer leaves a residual.
        let r = rq1.command(lun_at(0, 1), Cdb::read_10(0, 1, false), &[], 1024);
        if r.good() {
            assert_eq!(r.resid(), 512, "{r:?}");
        } else {
            assert_eq!(r.sense().map(|s| s.key), Some(6), "{r:?}");
        }
        drop(d);
    }
    daemon.shutdown();
}

#[test]
fn several_requests_in_flight_complete_in_one_pass() {
    let dir = TempDir::new("batch");
    let (daemon, socket) = start(&dir, 1);
    let mut d = Driver::connect(&socket);
    let rq = &mut d.rqs[0];
    rq.clear_unit_attention(0);
    let mut want: Vec<u64> = (0..16)
        .map(|i| rq.submit(lun_at(0, 0), Cdb::read_10(i, 1, false), &[], 512))
        .collect();
    rq.publish();
    let replies = rq.wait(16);
    let mut got: Vec<u64> = replies.iter().map(|r| r.token).collect();
    got.sort_unstable();
    want.sort_unstable();
    assert_eq!(got, want);
    for r in &replies {
        assert!(r.good(), "{r:?}");
    }
    daemon.shutdown();
}

/// With VIRTIO_RING_F_INDIRECT_DESC each request (header, response,
/// data-in) is one descriptor of the ring pointing at a table: the device
/// follows it.
#[test]
fn indirect_descriptors_are_followed() {
    let dir = TempDir::new("indirect");
    let (daemon, socket) = start(&dir, 1);
    let mut d = Driver::connect_with(
        &socket,
        Options {
            event_idx: false,
            indirect: true,
            ..Options::default()
        },
    );
    let rq = &mut d.rqs[0];
    rq.clear_unit_attention(0);
    let free = rq.queue.virtqueue().ring().num_free();
    rq.submit(lun_at(0, 0), Cdb::inquiry(None, 36), &[], 36);
    assert_eq!(
        rq.queue.virtqueue().ring().num_free(),
        free - 1,
        "three buffers, one descriptor: an indirect table"
    );
    rq.publish();
    let r = rq.wait(1).pop().unwrap();
    assert!(r.good(), "{r:?}");
    assert_eq!(&r.data[8..12], b"SQCQ");
    daemon.shutdown();
}
