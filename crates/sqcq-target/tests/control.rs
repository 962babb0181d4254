//! The control queue (task management, asynchronous notification), the
//! event queue, and the vhost-user lifecycle messages. The last tests
//! send what sqcq-driver's frontend does not: a request of unknown type,
//! a feature that was not offered, and QEMU's message orderings around a
//! device reset and a late SET_VRING_CALL, through the raw ring helper.

// Test code: lengths and indices are small constants of the test.
#![allow(clippy::cast_possible_truncation)]

mod common;

use common::driver::*;
use common::raw_ring::{self, Guest, Vq, lun_field};
use common::*;
use sqcq_driver::scsi::{AnResp, Cdb, Response, Tmf};
use sqcq_target::scsi::device::EventReport;
use sqcq_wire::scsi::CTRL_AN_QUERY;
use vhost::VhostBackend;

#[test]
fn task_management_and_async_notification() {
    let dir = TempDir::new("tmf");
    let (daemon, socket) = start(&dir, 2);
    let mut d = Driver::connect(&socket);
    let ctrl = &mut d.control;
    let rq = &mut d.rqs[1];
    rq.clear_unit_attention(0);
    let mut tmf = |tmf, lun, tag| ctrl.task_management(tmf, lun, tag).unwrap();

    // LOGICAL UNIT RESET completes and leaves a unit attention behind.
    assert_eq!(tmf(Tmf::LogicalUnitReset, lun_at(0, 0), 0), Response::Ok);
    let r = rq.command(lun_at(0, 0), Cdb::test_unit_ready(), &[], 0);
    assert_eq!(r.sense().map(|s| s.key), Some(6), "{r:?}");
    // ABORT TASK, ABORT TASK SET, I_T NEXUS RESET.
    assert_eq!(tmf(Tmf::AbortTask, lun_at(0, 0), 7), Response::Ok);
    assert_eq!(tmf(Tmf::AbortTaskSet, lun_at(0, 1), 0), Response::Ok);
    assert_eq!(tmf(Tmf::ItNexusReset, lun_at(0, 0), 0), Response::Ok);
    // No such LUN, no such target, unsupported function.
    assert_eq!(tmf(Tmf::AbortTask, lun_at(0, 9), 7), Response::IncorrectLun);
    assert_eq!(
        tmf(Tmf::LogicalUnitReset, lun_at(2, 0), 0),
        Response::BadTarget
    );
    assert_eq!(
        tmf(Tmf::ClearAca, lun_at(0, 0), 0),
        Response::FunctionRejected
    );

    // AN query: no event class supported, response OK.
    assert_eq!(
        ctrl.async_notification(CTRL_AN_QUERY, lun_at(0, 0), 0x7e)
            .unwrap(),
        AnResp {
            event_actual: 0,
            response: Response::Ok
        }
    );

    // Requests still flow.
    rq.clear_unit_attention(0);
    daemon.shutdown();
}

#[test]
fn events_reach_the_event_queue() {
    let dir = TempDir::new("events");
    let (daemon, socket) = start(&dir, 1);
    let mut d = Driver::connect(&socket);
    daemon.scsi_device(0).unwrap().report_event(EventReport {
        lun: 1,
        event: 1,
        reason: 1,
    });
    let e = d.events.next_event().unwrap();
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
fn negotiation_config_space_and_a_ring_restarted_without_a_kick() {
    let dir = TempDir::new("lifecycle");
    let (daemon, socket) = start(&dir, 2);
    let mut d = Driver::connect(&socket);
    let neg = d.frontend.negotiated().clone();
    assert_eq!(neg.vrings, 4, "GET_QUEUE_NUM");
    // The config space.
    assert!(neg.config_read);
    let config = neg.scsi_config().expect("a SCSI device");
    assert_eq!(config.num_queues, 2);
    assert_eq!(config.sense_size, 96);
    assert_eq!(config.cdb_size, 32);

    let rq = &mut d.rqs[0];
    rq.clear_unit_attention(0);
    let done = rq.queue.virtqueue().ring().vring_base();
    // GET_VRING_BASE stops the ring and says where it stopped.
    let base = d.frontend.stop_queue(2).unwrap();
    assert_eq!(base, done);

    // A request made available while the ring is stopped is served once
    // the ring starts again, without any further kick: the kick eventfd is
    // emptied before it is handed over again.
    let token = rq.submit(lun_at(0, 0), Cdb::inquiry(None, 36), &[], 36);
    rq.publish();
    let _ = rq.queue.virtqueue().events().kick_fd().read();
    d.frontend
        .resume_queue(&d.mem, rq.queue.virtqueue(), done)
        .unwrap();
    let r = rq.wait(1).pop().unwrap();
    assert_eq!(r.token, token);
    assert!(r.good(), "{r:?}");
    assert_eq!(&r.data[8..12], b"SQCQ");
    daemon.shutdown();
}

/// Sends one control request through the raw ring and returns the
/// response bytes.
fn raw_control(vq: &mut Vq, g: &mut Guest, req: &[u8], resp_len: u32) -> Vec<u8> {
    let r = g.alloc(req.len() as u32);
    g.write(r, req);
    let out = g.alloc(resp_len);
    let head = vq.add(g, &[(r, req.len() as u32, false), (out, resp_len, true)]);
    vq.kick(g);
    assert_eq!(vq.wait_used(g).0, head);
    g.read(out, resp_len as usize)
}

fn raw_tmf(subtype: u32, lun: [u8; 8], tag: u64) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&subtype.to_le_bytes());
    v.extend_from_slice(&lun);
    v.extend_from_slice(&tag.to_le_bytes());
    v
}

#[test]
fn a_control_request_of_unknown_type_fails() {
    let dir = TempDir::new("bad-control");
    let (daemon, socket) = start(&dir, 1);
    let mut g = Guest::new();
    let mut qs = raw_ring::vqs();
    let _fe = raw_ring::connect(&socket, &g, &mut qs, true);
    // FAILURE, counted.
    assert_eq!(
        raw_control(&mut qs[0], &mut g, &[99, 0, 0, 0, 0, 0, 0, 0], 1),
        [9]
    );
    assert_eq!(counter(&daemon, "bad_control"), 1);
    // The control queue and the request queues still work.
    assert_eq!(
        raw_control(&mut qs[0], &mut g, &raw_tmf(5, lun_field(0, 0), 0), 1),
        [0]
    );
    raw_ring::clear_unit_attention(&mut qs[2], &mut g, 0);
    daemon.shutdown();
}

/// A frontend may set a feature the device did not offer (refused, with
/// REPLY_ACK), and QEMU resets the device and starts the rings again on
/// every boot (as SeaBIOS then Linux drive it) without a second
/// SET_VRING_ERR: message sequences sqcq-driver's frontend does not make.
#[test]
fn a_feature_not_offered_is_refused_and_a_reset_starts_over() {
    let dir = TempDir::new("reset");
    let (daemon, socket) = start(&dir, 2);
    let mut g = Guest::new();
    let mut qs = raw_ring::vqs();
    let mut fe = raw_ring::connect(&socket, &g, &mut qs, true);

    // A feature that was not offered is refused (REPLY_ACK is on).
    assert!(fe.set_features(1 << 40).is_err());

    raw_ring::clear_unit_attention(&mut qs[2], &mut g, 0);
    // RESET_DEVICE forgets the rings; a second start cycle works.
    raw_ring::reset_and_restart(&mut fe, &g, &mut qs);
    let (r, data) = raw_ring::command(
        &mut qs[3],
        &mut g,
        lun_field(0, 0),
        &raw_ring::inquiry(36),
        &[],
        36,
    );
    assert_eq!((r.response, r.status), (0, 0), "{r:?}");
    assert_eq!(&data[8..12], b"SQCQ");
    daemon.shutdown();
}

/// QEMU starts a ring with SET_VRING_KICK and sends SET_VRING_CALL after
/// it, so a request the driver makes available at once can complete while
/// the device has no call eventfd. The notification must not be lost: it
/// goes out when the call eventfd arrives (a request queue served by a
/// worker, and the control queue served by the control thread). A message
/// order sqcq-driver's frontend does not make.
#[test]
fn a_call_due_before_set_vring_call_is_sent_when_the_call_fd_arrives() {
    use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

    let dir = TempDir::new("owed-call");
    let (daemon, socket) = start(&dir, 1);
    let mut g = Guest::new();
    let mut qs = raw_ring::vqs();
    let fe = raw_ring::connect(&socket, &g, &mut qs, false);
    raw_ring::clear_unit_attention(&mut qs[2], &mut g, 0);

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
            let req = raw_tmf(0, lun_field(0, 0), 0);
            let r = g.alloc(req.len() as u32);
            g.write(r, &req);
            let out = g.alloc(16);
            vq.add(&g, &[(r, req.len() as u32, false), (out, 16, true)])
        } else {
            let inquiry = raw_ring::inquiry(36);
            raw_ring::submit(vq, &mut g, lun_field(0, 0), &inquiry, &[], 36).head
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
