//! The control queue (task management, asynchronous notification), the
//! event queue, and the vhost-user lifecycle messages.

// Test code: lengths and indices are small constants of the test.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

mod common;

use common::*;
use sqcq_target::scsi::device::EventReport;
use vhost::VhostBackend;
use vhost::vhost_user::VhostUserFrontend;

/// Sends one control request and returns the response bytes.
fn control(vq: &mut Vq, g: &mut Guest, req: &[u8], resp_len: u32) -> Vec<u8> {
    let r = g.alloc(req.len() as u32);
    g.write(r, req);
    let out = g.alloc(resp_len);
    let head = vq.add(g, &[(r, req.len() as u32, false), (out, resp_len, true)]);
    vq.kick(g);
    assert_eq!(vq.wait_used(g).0, head);
    g.read(out, resp_len as usize)
}

fn tmf(subtype: u32, lun: [u8; 8], tag: u64) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&subtype.to_le_bytes());
    v.extend_from_slice(&lun);
    v.extend_from_slice(&tag.to_le_bytes());
    v
}

#[test]
fn task_management_and_async_notification() {
    let dir = TempDir::new("tmf");
    let (daemon, socket) = start(&dir, 2);
    let mut g = Guest::new();
    let mut qs = vqs();
    let _fe = connect(&socket, &g, &mut qs, true);
    let (ctrl, rest) = qs.split_at_mut(1);
    let ctrl = &mut ctrl[0];
    let rq = &mut rest[1];
    clear_unit_attention(rq, &mut g, 0);

    // LOGICAL UNIT RESET completes and leaves a unit attention behind.
    assert_eq!(control(ctrl, &mut g, &tmf(5, lun_field(0, 0), 0), 1), [0]);
    let (r, _) = command(rq, &mut g, lun_field(0, 0), &TEST_UNIT_READY, &[], 0);
    assert_eq!((r.status, r.sense_key()), (2, 6), "{r:?}");
    // ABORT TASK, ABORT TASK SET, I_T NEXUS RESET.
    assert_eq!(control(ctrl, &mut g, &tmf(0, lun_field(0, 0), 7), 1), [0]);
    assert_eq!(control(ctrl, &mut g, &tmf(1, lun_field(0, 1), 0), 1), [0]);
    assert_eq!(control(ctrl, &mut g, &tmf(4, lun_field(0, 0), 0), 1), [0]);
    // No such LUN, no such target, unsupported function.
    assert_eq!(control(ctrl, &mut g, &tmf(0, lun_field(0, 9), 7), 1), [12]);
    assert_eq!(control(ctrl, &mut g, &tmf(5, lun_field(2, 0), 0), 1), [3]);
    assert_eq!(control(ctrl, &mut g, &tmf(2, lun_field(0, 0), 0), 1), [11]);

    // AN query: no event class supported, response OK.
    let mut an = 1u32.to_le_bytes().to_vec();
    an.extend_from_slice(&lun_field(0, 0));
    an.extend_from_slice(&0x7eu32.to_le_bytes());
    assert_eq!(control(ctrl, &mut g, &an, 5), [0, 0, 0, 0, 0]);

    // A request of unknown type: FAILURE.
    assert_eq!(control(ctrl, &mut g, &[99, 0, 0, 0, 0, 0, 0, 0], 1), [9]);

    // Requests still flow.
    clear_unit_attention(rq, &mut g, 0);
    daemon.shutdown();
}

#[test]
fn events_reach_the_event_queue() {
    let dir = TempDir::new("events");
    let (daemon, socket) = start(&dir, 1);
    let mut g = Guest::new();
    let mut qs = vqs();
    let _fe = connect(&socket, &g, &mut qs, true);
    let evq = &mut qs[1];
    let buf = g.alloc(16);
    let head = evq.add(&g, &[(buf, 16, true)]);
    evq.kick(&g);
    daemon.scsi_device(0).unwrap().report_event(EventReport {
        lun: 1,
        event: 1,
        reason: 1,
    });
    assert_eq!(evq.wait_used(&g), (head, 16));
    let e = g.read(buf, 16);
    assert_eq!(&e[0..4], &1u32.to_le_bytes(), "TRANSPORT_RESET");
    assert_eq!(
        &e[4..12],
        &[1, 0, 0, 1, 0, 0, 0, 0],
        "LUN 1 as REPORT LUNS encodes it"
    );
    assert_eq!(&e[12..16], &1u32.to_le_bytes(), "RESCAN");
    daemon.shutdown();
}

#[test]
fn negotiation_lifecycle_and_reset() {
    let dir = TempDir::new("lifecycle");
    let (daemon, socket) = start(&dir, 2);
    let mut g = Guest::new();
    let mut qs = vqs();
    let mut fe = connect(&socket, &g, &mut qs, true);
    assert_eq!(fe.get_queue_num().unwrap(), 4);

    // A feature that was not offered is refused (REPLY_ACK is on).
    assert!(fe.set_features(1 << 40).is_err());

    // The config space.
    let cfg = fe
        .get_config(
            0,
            36,
            vhost::vhost_user::message::VhostUserConfigFlags::WRITABLE,
            &[0; 36],
        )
        .unwrap()
        .1;
    assert_eq!(&cfg[0..4], &2u32.to_le_bytes(), "num_queues");
    assert_eq!(&cfg[20..24], &96u32.to_le_bytes(), "sense_size");
    assert_eq!(&cfg[24..28], &32u32.to_le_bytes(), "cdb_size");

    clear_unit_attention(&mut qs[2], &mut g, 0);
    let done = qs[2].next_avail;
    // GET_VRING_BASE stops the ring and says where it stopped.
    assert_eq!(fe.get_vring_base(2).unwrap(), u32::from(done));

    // A request made available while the ring is stopped is served once
    // the ring starts again, without any further kick.
    let p = submit(&mut qs[2], &mut g, lun_field(0, 0), &inquiry(36), &[], 36);
    qs[2].kick(&g);
    fe.set_vring_base(2, done).unwrap();
    let fresh_kick =
        vmm_sys_util::eventfd::EventFd::new(vmm_sys_util::eventfd::EFD_NONBLOCK).unwrap();
    fe.set_vring_call(2, &qs[2].call).unwrap();
    fe.set_vring_kick(2, &fresh_kick).unwrap();
    assert_eq!(qs[2].wait_used(&g).0, p.head);
    assert_eq!(read_resp(&g, p.resp).status, 0);

    // RESET_DEVICE forgets the rings; a second start cycle works (as
    // SeaBIOS then Linux do on every boot).
    reset_and_restart(&mut fe, &g, &mut qs);
    let (r, data) = command(&mut qs[3], &mut g, lun_field(0, 0), &inquiry(36), &[], 36);
    assert_eq!((r.response, r.status), (0, 0), "{r:?}");
    assert_eq!(&data[8..12], b"SQCQ");
    daemon.shutdown();
}

/// QEMU starts a ring with SET_VRING_KICK and sends SET_VRING_CALL after
/// it, so a request the driver makes available at once can complete while
/// the device has no call eventfd. The notification must not be lost: it
/// goes out when the call eventfd arrives (a request queue served by a
/// worker, and the control queue served by the control thread).
#[test]
fn a_call_due_before_set_vring_call_is_sent_when_the_call_fd_arrives() {
    use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

    let dir = TempDir::new("owed-call");
    let (daemon, socket) = start(&dir, 1);
    let mut g = Guest::new();
    let mut qs = vqs();
    let fe = connect(&socket, &g, &mut qs, false);
    clear_unit_attention(&mut qs[2], &mut g, 0);

    for index in [2usize, 0] {
        let vq = &mut qs[index];
        // Stop the ring (the device forgets its call eventfd) and start it
        // again with a new kick eventfd and no call eventfd.
        assert_eq!(fe.get_vring_base(index).unwrap(), u32::from(vq.next_avail));
        fe.set_vring_base(index, vq.next_avail).unwrap();
        vq.kick = EventFd::new(EFD_NONBLOCK).unwrap();
        fe.set_vring_kick(index, &vq.kick).unwrap();
        let _ = vq.call.read();

        let head = if index == 0 {
            let req = tmf(0, lun_field(0, 0), 0);
            let r = g.alloc(req.len() as u32);
            g.write(r, &req);
            let out = g.alloc(16);
            vq.add(&g, &[(r, req.len() as u32, false), (out, 16, true)])
        } else {
            submit(vq, &mut g, lun_field(0, 0), &inquiry(36), &[], 36).head
        };
        vq.kick(&g);
        assert_eq!(vq.wait_used(&g).0, head, "vq {index}");
        assert!(
            vq.call.read().is_err(),
            "vq {index}: a call without a call eventfd"
        );

        fe.set_vring_call(index, &vq.call).unwrap();
        wait_signalled(
            &vq.call,
            &format!("vq {index}: the call owed since before SET_VRING_CALL"),
        );
    }
    daemon.shutdown();
}
