//! The daemon in process, on a real Unix socket, driven by rust-vmm's
//! vhost `Frontend` with memfd guest memory and real eventfds.

// Test code: lengths and indices are small constants of the test.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

mod common;

use common::*;

#[test]
fn io_on_two_queues_and_two_workers_survives_reconnect() {
    let dir = TempDir::new("io");
    let (daemon, socket) = start(&dir, 2);
    let mut g = Guest::new();
    let pattern: Vec<u8> = (0..8 * 512).map(|i| (i % 251) as u8).collect();

    for round in 0..2 {
        let mut qs = vqs();
        let fe = connect(&socket, &g, &mut qs, round == 0);
        let (rq0, rest) = qs.split_at_mut(3);
        let rq0 = &mut rq0[2];
        let rq1 = &mut rest[0];
        clear_unit_attention(rq0, &mut g, 0);

        let (r, data) = command(rq0, &mut g, lun_field(0, 0), &inquiry(96), &[], 96);
        assert_eq!((r.response, r.status), (0, 0), "{r:?}");
        assert_eq!(data[0], 0x00, "direct-access block device");
        assert_eq!(&data[8..12], b"SQCQ", "vendor {:?}", &data[8..16]);
        assert_eq!(
            r.resid,
            96 - (u32::from(data[4]) + 5),
            "residual of INQUIRY"
        );

        if round == 0 {
            let (r, _) = command(rq0, &mut g, lun_field(0, 0), &write10(8, 8), &pattern, 0);
            assert_eq!((r.response, r.status), (0, 0), "WRITE: {r:?}");
        }
        // Read it back through the other queue, served by the other worker
        // (and, in round 1, by a new connection).
        clear_unit_attention(rq1, &mut g, 0);
        let (r, data) = command(rq1, &mut g, lun_field(0, 0), &read10(8, 8), &[], 4096);
        assert_eq!((r.response, r.status, r.resid), (0, 0, 0), "READ: {r:?}");
        assert_eq!(data, pattern, "round {round}: data read back differs");

        // A data-in buffer larger than the transfer leaves a residual.
        let (r, _) = command(rq1, &mut g, lun_field(0, 1), &read10(0, 1), &[], 1024);
        if r.status == 2 {
            assert_eq!(r.sense_key(), 6);
        } else {
            assert_eq!((r.response, r.status, r.resid), (0, 0, 512), "{r:?}");
        }
        drop(fe);
    }
    daemon.shutdown();
}

#[test]
fn several_requests_in_flight_complete_in_one_pass() {
    let dir = TempDir::new("batch");
    let (daemon, socket) = start(&dir, 1);
    let mut g = Guest::new();
    let mut qs = vqs();
    let _fe = connect(&socket, &g, &mut qs, true);
    let rq = &mut qs[2];
    clear_unit_attention(rq, &mut g, 0);
    let pending: Vec<Pending> = (0..16)
        .map(|i| submit(rq, &mut g, lun_field(0, 0), &read10(i, 1), &[], 512))
        .collect();
    rq.kick(&g);
    let mut heads: Vec<u16> = (0..16).map(|_| rq.wait_used(&g).0).collect();
    heads.sort_unstable();
    let mut want: Vec<u16> = pending.iter().map(|p| p.head).collect();
    want.sort_unstable();
    assert_eq!(heads, want);
    for p in &pending {
        let r = read_resp(&g, p.resp);
        assert_eq!((r.response, r.status), (0, 0), "{r:?}");
    }
    daemon.shutdown();
}
