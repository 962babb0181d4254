//! Poll mode end to end (device side): VIRTIO_F_SQCQ_POLL with
//! the doorbells at `doorbell_location`, `ring-poll` with standard virtio,
//! and what happens to hostile doorbells. Waits are bounded loops on
//! shared memory or counters; nothing asserts a timing.

// Test code: lengths and indices are small constants of the test.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

mod common;

use std::time::{Duration, Instant};

use common::sqcq::*;
use common::*;
use sqcq_protocol::NEED_WAKEUP;
use sqcq_target::config::{PollOptions, RingMode, spin_config};
use sqcq_target::runtime::metrics::{QueueMode, QueueSnapshot};
use vhost::VhostBackend;
use vhost::vhost_user::message::{VhostUserHeaderFlag, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};

/// One command submitted through `sq.idx` (kicking only on NEED_WAKEUP).
fn sq_command(vq: &mut Vq, g: &mut Guest, lun: u16, cdb: &[u8], data_in: u32) -> Resp {
    let p = submit(vq, g, lun_field(0, lun), cdb, &[], data_in);
    vq.publish_sq(g);
    assert_eq!(vq.wait_used(g).0, p.head);
    read_resp(g, p.resp)
}

/// One command published under the standard kick rules; counts kicks.
fn std_command(
    vq: &mut Vq,
    g: &mut Guest,
    lun: u16,
    cdb: &[u8],
    event_idx: bool,
    kicks: &mut u64,
) -> Resp {
    let old = vq.next_avail;
    let p = submit(vq, g, lun_field(0, lun), cdb, &[], 512);
    if vq.publish_standard(g, old, event_idx) {
        *kicks += 1;
    }
    assert_eq!(vq.wait_used(g).0, p.head);
    read_resp(g, p.resp)
}

/// The final figures of request queue `vq`, once the frontend has gone.
fn final_report(d: &sqcq_target::Daemon, vq: u16) -> QueueSnapshot {
    let mut found = None;
    wait_until("the stopped queue's figures", || {
        found = d.stats().into_iter().find(|r| r.vq == vq && !r.running);
        found.is_some()
    });
    found.unwrap()
}

#[test]
fn idle_poll_threads_sleep_with_need_wakeup_and_calls_follow_cq_need_wakeup() {
    let dir = TempDir::new("poll-idle");
    let stats_file = dir.path("stats.json");
    let options = PollOptions {
        stats_file: Some(stats_file.clone()),
        ..PollOptions::default()
    };
    let (daemon, socket) = start_with(&dir, 2, options);
    let mut g = Guest::new();
    let mut qs = vqs();
    let fe = connect_with(&socket, &g, &mut qs, true, SQCQ);
    for i in [2, 3] {
        clear_unit_attention(&mut qs[i], &mut g, 1);
        for lba in 0..8 {
            let r = sq_command(&mut qs[i], &mut g, 1, &read10(lba, 1), 512);
            assert_eq!((r.response, r.status), (0, 0), "{r:?}");
        }
    }

    // Load stopped: every request queue's poller goes to sleep.
    wait_until("NEED_WAKEUP on every SQ doorbell", || {
        qs[2..].iter().all(|q| q.sq_flags(&g) & NEED_WAKEUP != 0)
    });
    for i in [2, 3] {
        let p = submit(&mut qs[i], &mut g, lun_field(0, 1), &read10(0, 1), &[], 512);
        assert!(qs[i].publish_sq(&g), "NEED_WAKEUP is set: the driver kicks");
        assert_eq!(qs[i].wait_used(&g).0, p.head);
        assert_eq!(read_resp(&g, p.resp).status, 0);
    }

    // The driver's CQ poller sleeps: the device owes a call.
    let q = &mut qs[2];
    let mut calls = q.calls();
    q.set_cq_need_wakeup(&g, true);
    let r = sq_command(q, &mut g, 1, &read10(1, 1), 512);
    assert_eq!(r.status, 0);
    let mut owed = 0;
    wait_until("a call for a sleeping CQ poller", || {
        owed += q.calls();
        owed > 0
    });
    calls += owed;
    // The driver polls its CQ doorbell: completions come without calls.
    q.set_cq_need_wakeup(&g, false);
    for lba in 0..20 {
        let r = sq_command(q, &mut g, 1, &read10(lba, 1), 512);
        assert_eq!(r.status, 0);
    }
    assert_eq!(q.calls(), 0, "no call while the CQ poller polls");
    assert_eq!(q.cq_idx(&g), q.used_idx(&g), "cq.idx follows used->idx");
    let completed = q.used_idx(&g);

    drop(fe);
    let r = final_report(&daemon, 2);
    assert_eq!(r.mode, QueueMode::Sqcq);
    assert_eq!(r.completions, u64::from(completed));
    assert_eq!(r.calls, calls, "calls sent = calls received");
    assert!(r.sleeps >= 1, "{r:?}");
    assert!(!r.broken);
    // The file is rewritten when the frontend leaves.
    wait_until("the stats file", || {
        std::fs::read_to_string(&stats_file)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .is_some_and(|v| {
                v["queues"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|q| q["vq"] == 2 && q["running"] == false))
            })
    });
    daemon.shutdown();
}

#[test]
fn nonsense_sq_idx_breaks_that_queue_and_the_others_go_on() {
    let dir = TempDir::new("poll-nonsense");
    let (daemon, socket) = start(&dir, 1);
    let mut g = Guest::new();
    let mut qs = vqs();
    let _fe = connect_with(&socket, &g, &mut qs, true, SQCQ);
    clear_unit_attention(&mut qs[2], &mut g, 0);
    clear_unit_attention(&mut qs[3], &mut g, 0);

    let bad = qs[2].next_avail.wrapping_add(1000);
    qs[2].write_sq_idx(&g, bad);
    qs[2].kick.write(1).unwrap();
    wait_until("the error eventfd of the broken queue", || qs[2].errored());
    assert_eq!(counter(&daemon, "broken_rings"), 1);

    // The same worker goes on serving the other queue.
    let r = sq_command(&mut qs[3], &mut g, 0, &inquiry(36), 36);
    assert_eq!((r.response, r.status), (0, 0), "{r:?}");
    daemon.shutdown();
}

#[test]
fn doorbells_outside_guest_memory_break_the_queue() {
    let dir = TempDir::new("poll-outside");
    let (daemon, socket) = start(&dir, 1);
    let mut g = Guest::new();
    let mut qs = vqs();
    // The used ring ends 10 bytes before the end of memory: it fits, the
    // doorbells after it do not.
    qs[3].used = GUEST_SIZE - 0x210;
    assert_eq!(qs[3].doorbells().sq, GUEST_SIZE);
    let _fe = connect_with(&socket, &g, &mut qs, true, SQCQ);
    wait_until("the error eventfd of the broken queue", || qs[3].errored());
    assert_eq!(counter(&daemon, "broken_rings"), 1);
    clear_unit_attention(&mut qs[2], &mut g, 0);
    let r = sq_command(&mut qs[2], &mut g, 0, &inquiry(36), 36);
    assert_eq!((r.response, r.status), (0, 0), "{r:?}");
    daemon.shutdown();
}

#[test]
fn ring_poll_needs_no_kick_after_the_first() {
    for event_idx in [false, true] {
        let dir = TempDir::new(&format!("ring-poll-{event_idx}"));
        let options = PollOptions {
            ring: RingMode::Ring,
            // A 10 s spin window: the device polls for the whole test, so
            // every kick the rules ask for is counted, none is timing.
            spin: spin_config(10_000_000, 10_000_000),
            ..PollOptions::default()
        };
        let (daemon, socket) = start_with(&dir, 1, options);
        let mut g = Guest::new();
        let mut qs = vqs();
        let fe = connect(&socket, &g, &mut qs, event_idx);
        let q = &mut qs[2];
        let mut kicks = 0;
        if !event_idx {
            assert_eq!(used_flags(&g, q) & USED_F_NO_NOTIFY, USED_F_NO_NOTIFY);
        }
        let r = std_command(q, &mut g, 1, &TEST_UNIT_READY, event_idx, &mut kicks);
        assert_eq!(r.response, 0);
        for lba in 0..50 {
            let r = std_command(q, &mut g, 1, &read10(lba, 1), event_idx, &mut kicks);
            assert_eq!((r.response, r.status), (0, 0), "{r:?}");
        }
        // EVENT_IDX: `avail_event` 0 lies in the first batch's window and
        // is never moved while polling; flags: NO_NOTIFY from the start.
        assert_eq!(kicks, u64::from(event_idx), "event_idx {event_idx}");
        drop(fe);
        let r = final_report(&daemon, 2);
        assert_eq!(r.mode, QueueMode::RingPoll);
        assert_eq!(r.kicks, kicks, "kicks received = kicks sent");
        assert_eq!(r.completions, 51);
        daemon.shutdown();
    }
}

fn offered(socket: &std::path::Path) -> (Frontend, u64) {
    let deadline = Instant::now() + WAIT;
    let mut fe = loop {
        match Frontend::connect(socket, 4) {
            Ok(f) => break f,
            Err(e) => {
                assert!(Instant::now() < deadline, "cannot connect: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    };
    fe.set_owner().unwrap();
    let features = fe.get_features().unwrap();
    fe.get_protocol_features().unwrap();
    fe.set_protocol_features(VhostUserProtocolFeatures::REPLY_ACK)
        .unwrap();
    fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
    (fe, features)
}

#[test]
fn sqcq_is_offered_by_default_and_can_be_withheld() {
    let dir = TempDir::new("poll-offer");
    let (daemon, socket) = start(&dir, 1);
    let (fe, features) = offered(&socket);
    assert_eq!(features & SQCQ, SQCQ, "offered by default");
    drop(fe);
    daemon.shutdown();

    let options = PollOptions {
        offer_sqcq: false,
        ..PollOptions::default()
    };
    let (daemon, socket) = start_with(&dir, 1, options);
    let (fe, features) = offered(&socket);
    assert_eq!(features & SQCQ, 0, "withheld");
    assert!(
        fe.set_features(features | SQCQ).is_err(),
        "a bit not offered is refused"
    );
    fe.set_features(features).unwrap();
    drop(fe);
    daemon.shutdown();
}

#[test]
fn control_queue_doorbells_ask_for_every_kick_and_honour_cq_need_wakeup() {
    let dir = TempDir::new("poll-control");
    let (daemon, socket) = start(&dir, 1);
    let mut g = Guest::new();
    let mut qs = vqs();
    let _fe = connect_with(&socket, &g, &mut qs, true, SQCQ);
    // The control queue is served by kicks: its SQ doorbell says so for
    // good, so a driver that follows the protocol kicks every time.
    let ctrl = &mut qs[0];
    wait_until("NEED_WAKEUP in the control queue's SQ doorbell", || {
        ctrl.sq_flags(&g) & NEED_WAKEUP != 0
    });
    // A driver whose control queue sleeps (CQ NEED_WAKEUP) gets a call
    // for each completion, and cq.idx follows used->idx.
    ctrl.set_cq_need_wakeup(&g, true);
    let _ = ctrl.call.read();
    for round in 1..=3u16 {
        let req = g.alloc(4);
        g.write(req, &0xdead_u32.to_le_bytes());
        let resp = g.alloc(1);
        ctrl.add(&g, &[(req, 4, false), (resp, 1, true)]);
        assert!(ctrl.publish_sq(&g), "NEED_WAKEUP set: the driver kicks");
        ctrl.wait_used(&g);
        assert_eq!(ctrl.cq_idx(&g), round, "cq.idx follows used->idx");
        wait_until("a call for the completion", || ctrl.call.read().is_ok());
    }
    assert!(counter(&daemon, "bad_control") >= 3);
    daemon.shutdown();
}
