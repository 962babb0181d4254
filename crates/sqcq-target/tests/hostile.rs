//! Hostile descriptor chains and addresses: each gets the virtio-scsi
//! answer the standard names (or comes back with length 0 when no
//! response can be written), is counted, and the daemon keeps serving.

// Test code: lengths and indices are small constants of the test.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

mod common;

use common::raw_ring::*;
use common::*;
use vhost::VhostBackend;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

fn header(g: &mut Guest, lun: [u8; 8], cdb: &[u8]) -> u64 {
    let req = g.alloc(REQ_LEN);
    let mut hdr = vec![0u8; REQ_LEN as usize];
    hdr[0..8].copy_from_slice(&lun);
    hdr[19..19 + cdb.len()].copy_from_slice(cdb);
    g.write(req, &hdr);
    req
}

/// Checks that the queue still serves a good INQUIRY.
fn still_serving(vq: &mut Vq, g: &mut Guest) {
    let (r, data) = command(vq, g, lun_field(0, 0), &inquiry(36), &[], 36);
    assert_eq!((r.response, r.status), (0, 0), "{r:?}");
    assert_eq!(&data[8..12], b"SQCQ");
}

#[test]
fn bad_chains_are_answered_counted_and_survived() {
    let dir = TempDir::new("hostile");
    let (daemon, socket) = start(&dir, 1);
    let mut g = Guest::new();
    let mut qs = vqs();
    let _fe = connect(&socket, &g, &mut qs, true);
    let vq = &mut qs[2];
    clear_unit_attention(vq, &mut g, 0);

    // A loop of device-readable descriptors: nothing to answer into.
    let a = vq.reserve(2);
    let req = header(&mut g, lun_field(0, 0), &inquiry(36));
    vq.write_desc(&g, a, req, REQ_LEN, NEXT, a + 1);
    vq.write_desc(&g, a + 1, req, REQ_LEN, NEXT, a);
    vq.push_head(&g, a);
    vq.kick(&g);
    assert_eq!(vq.wait_used(&g), (a, 0));
    assert_eq!(counter(&daemon, "malformed_chains"), 1);
    still_serving(vq, &mut g);

    // A loop after a response buffer: FAILURE is written.
    let a = vq.reserve(2);
    let resp = g.alloc(RESP_LEN);
    vq.write_desc(&g, a, req, REQ_LEN, NEXT, a + 1);
    vq.write_desc(&g, a + 1, resp, RESP_LEN, WRITE | NEXT, a + 1);
    vq.push_head(&g, a);
    vq.kick(&g);
    assert_eq!(vq.wait_used(&g).0, a);
    assert_eq!(read_resp(&g, resp).response, 9, "VIRTIO_SCSI_S_FAILURE");
    assert_eq!(counter(&daemon, "malformed_chains"), 2);

    // A header outside guest memory.
    let resp = g.alloc(RESP_LEN);
    let head = vq.add(
        &g,
        &[(0xdead_0000_0000, REQ_LEN, false), (resp, RESP_LEN, true)],
    );
    vq.kick(&g);
    assert_eq!(vq.wait_used(&g).0, head);
    assert_eq!(read_resp(&g, resp).response, 9);
    assert_eq!(counter(&daemon, "out_of_memory"), 1);

    // A header shorter than lun + tag + attributes + CDB.
    let resp = g.alloc(RESP_LEN);
    let head = vq.add(&g, &[(req, 10, false), (resp, RESP_LEN, true)]);
    vq.kick(&g);
    assert_eq!(vq.wait_used(&g).0, head);
    assert_eq!(read_resp(&g, resp).response, 9);
    assert_eq!(counter(&daemon, "short_headers"), 1);

    // Device-writable before device-readable.
    let resp = g.alloc(RESP_LEN);
    let head = vq.add(&g, &[(resp, RESP_LEN, true), (req, REQ_LEN, false)]);
    vq.kick(&g);
    assert_eq!(vq.wait_used(&g).0, head);
    assert_eq!(read_resp(&g, resp).response, 9);
    assert_eq!(counter(&daemon, "wrong_order"), 1);

    // A response buffer too small for even the fixed fields.
    let resp = g.alloc(8);
    let head = vq.add(&g, &[(req, REQ_LEN, false), (resp, 8, true)]);
    vq.kick(&g);
    assert_eq!(vq.wait_used(&g), (head, 0));
    // The first loop, which had no writable buffer at all, counts too.
    assert_eq!(counter(&daemon, "short_responses"), 2);

    // A head index past the queue: nothing comes back for it, and the
    // next request is served.
    vq.push_head(&g, QUEUE_SIZE + 3);
    still_serving(vq, &mut g);

    // Unknown target, malformed LUN field.
    let (r, _) = command(vq, &mut g, lun_field(1, 0), &TEST_UNIT_READY, &[], 0);
    assert_eq!(r.response, 3, "VIRTIO_SCSI_S_BAD_TARGET");
    let (r, _) = command(vq, &mut g, [0; 8], &TEST_UNIT_READY, &[], 0);
    assert_eq!(r.response, 3);
    // The first is a bus scan (an event), the second a guest error.
    assert_eq!(counter(&daemon, "other_targets"), 1);
    assert_eq!(counter(&daemon, "bad_lun"), 1);

    // Unknown LUN: INQUIRY answers peripheral qualifier 3, anything else
    // LOGICAL UNIT NOT SUPPORTED.
    let (r, data) = command(vq, &mut g, lun_field(0, 9), &inquiry(36), &[], 36);
    assert_eq!((r.response, r.status), (0, 0));
    assert_eq!(data[0], 0x7f);
    let (r, _) = command(vq, &mut g, lun_field(0, 9), &TEST_UNIT_READY, &[], 0);
    assert_eq!(
        (r.response, r.status, r.sense_key(), r.asc()),
        (0, 2, 5, 0x25),
        "{r:?}"
    );

    // A data-in buffer smaller than the transfer.
    let (r, _) = command(vq, &mut g, lun_field(0, 0), &read10(0, 8), &[], 512);
    assert_eq!(r.response, 1, "VIRTIO_SCSI_S_OVERRUN");
    assert_eq!(counter(&daemon, "overruns"), 1);

    // An unsupported opcode and a CDB with a reserved bit set.
    let (r, _) = command(vq, &mut g, lun_field(0, 0), &[0xff, 0, 0, 0, 0, 0], &[], 0);
    assert_eq!((r.status, r.sense_key(), r.asc()), (2, 5, 0x20), "{r:?}");

    still_serving(vq, &mut g);
    daemon.shutdown();
}

#[test]
fn corrupt_ring_stops_the_queue_and_signals_the_error_fd() {
    let dir = TempDir::new("corrupt");
    let (daemon, socket) = start(&dir, 2);
    let mut g = Guest::new();
    let mut qs = vqs();
    let _fe = connect(&socket, &g, &mut qs, true);
    {
        let vq = &mut qs[2];
        clear_unit_attention(vq, &mut g, 0);
        // The avail index runs more than a queue size ahead.
        vq.next_avail = vq.next_avail.wrapping_add(QUEUE_SIZE + 1);
        vq.kick(&g);
        let deadline = std::time::Instant::now() + WAIT;
        while vq.err.read().is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "error eventfd not signalled"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    assert_eq!(counter(&daemon, "broken_rings"), 1);
    // The other request queue is unaffected.
    let vq = &mut qs[3];
    clear_unit_attention(vq, &mut g, 0);
    still_serving(vq, &mut g);
    daemon.shutdown();
}

#[test]
fn an_error_eventfd_set_while_the_queue_runs_is_the_one_signalled() {
    let dir = TempDir::new("err-fd");
    let (daemon, socket) = start(&dir, 1);
    let mut g = Guest::new();
    let mut qs = vqs();
    let fe = connect(&socket, &g, &mut qs, true);
    clear_unit_attention(&mut qs[2], &mut g, 0);
    // A new error eventfd for a running queue (QEMU may send
    // SET_VRING_ERR at any time): a later break goes to it.
    let new_err = EventFd::new(EFD_NONBLOCK).unwrap();
    fe.set_vring_err(2, &new_err).unwrap();
    let vq = &mut qs[2];
    vq.next_avail = vq.next_avail.wrapping_add(QUEUE_SIZE + 1);
    vq.kick(&g);
    wait_signalled(&new_err, "the new error eventfd");
    assert!(vq.err.read().is_err(), "the replaced one stays quiet");
    // A queue that broke already reports it to an error eventfd given
    // afterwards.
    let vq = &mut qs[3];
    vq.next_avail = vq.next_avail.wrapping_add(QUEUE_SIZE + 1);
    vq.kick(&g);
    wait_signalled(&vq.err, "the first error eventfd");
    let late_err = EventFd::new(EFD_NONBLOCK).unwrap();
    fe.set_vring_err(3, &late_err).unwrap();
    wait_signalled(&late_err, "an error eventfd given after the break");
    daemon.shutdown();
}
