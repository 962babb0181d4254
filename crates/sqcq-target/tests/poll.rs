//! Poll mode end to end (device side): VIRTIO_F_SQCQ_POLL with
//! the doorbells at `doorbell_location`, `ring-poll` with standard virtio
//! (both driven by sqcq-driver), and what happens to hostile doorbells
//! (the raw ring helper). Waits are bounded loops on shared memory or
//! counters; nothing asserts a timing.

// Test code: lengths and indices are small constants of the test.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

mod common;

use std::time::{Duration, Instant};

use common::driver::*;
use common::raw_ring::*;
use common::*;
use sqcq_driver::NotifyMode;
use sqcq_driver::scsi::{Cdb, ControlQueue, Response, Tmf};
use sqcq_target::config::{PollOptions, RingMode, spin_config};
use sqcq_target::runtime::metrics::{QueueMode, QueueSnapshot};
use vhost::VhostBackend;
use vhost::vhost_user::message::{VhostUserHeaderFlag, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};

/// One command submitted through `sq.idx` by the raw ring helper
/// (kicking only on NEED_WAKEUP).
fn sq_command(vq: &mut Vq, g: &mut Guest, lun: u16, cdb: &[u8], data_in: u32) -> Resp {
    let p = submit(vq, g, lun_field(0, lun), cdb, &[], data_in);
    vq.publish_sq(g);
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

/// The driver runs `sqcq-inline` with a 10 s spin window: it polls its
/// CQ doorbell for the whole test unless it parks, so that every call it
/// counts is one the handshake asked for, none is timing.
#[test]
fn idle_poll_threads_sleep_with_need_wakeup_and_calls_follow_cq_need_wakeup() {
    let dir = TempDir::new("poll-idle");
    let stats_file = dir.path("stats.json");
    let options = PollOptions {
        stats_file: Some(stats_file.clone()),
        ..PollOptions::default()
    };
    let (daemon, socket) = start_with(&dir, 2, options);
    let mut d = Driver::connect_with(
        &socket,
        Options {
            mode: NotifyMode::SqcqInline,
            spin: spin_config(10_000_000, 10_000_000),
            ..Options::default()
        },
    );
    let read = |lba| Cdb::read_10(lba, 1, false);
    for rq in &mut d.rqs {
        rq.clear_unit_attention(1);
        for lba in 0..8 {
            let r = rq.command(lun_at(0, 1), read(lba), &[], 512);
            assert!(r.good(), "{r:?}");
        }
    }

    // Load stopped: every request queue's poller goes to sleep.
    let doorbells = |rq: &Rq| rq.queue.virtqueue().doorbells().unwrap();
    wait_until("NEED_WAKEUP on every SQ doorbell", || {
        d.rqs.iter().all(|rq| doorbells(rq).sq_need_wakeup())
    });
    for rq in &mut d.rqs {
        let kicks = rq.queue.counters().kicks;
        let r = rq.command(lun_at(0, 1), read(0), &[], 512);
        assert!(r.good(), "{r:?}");
        assert_eq!(
            rq.queue.counters().kicks,
            kicks + 1,
            "NEED_WAKEUP is set: the driver kicks"
        );
    }

    // The driver polls its CQ doorbell: completions come without calls.
    let q = &mut d.rqs[0];
    assert!(!doorbells(q).cq_need_wakeup());
    let calls = q.queue.counters().calls;
    for lba in 0..20 {
        let r = q.command(lun_at(0, 1), read(lba), &[], 512);
        assert!(r.good(), "{r:?}");
    }
    assert_eq!(
        q.queue.counters().calls,
        calls,
        "no call while the CQ poller polls"
    );
    wait_until("cq.idx follows used->idx", || {
        doorbells(q).cq_idx == q.queue.virtqueue().ring().used_index()
    });
    // The driver's CQ poller parks (CQ NEED_WAKEUP): the device owes a
    // call for the next completion.
    q.queue.park();
    assert!(doorbells(q).cq_need_wakeup());
    let r = q.command(lun_at(0, 1), read(1), &[], 512);
    assert!(r.good(), "{r:?}");
    wait_until("a call for a sleeping CQ poller", || {
        q.queue.counters().calls > calls
    });
    let calls = q.queue.counters().calls;
    let completed = q.queue.virtqueue().ring().used_index();

    drop(d);
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

/// VRING_USED_F_NO_NOTIFY.
const NO_NOTIFY: u16 = 1;

#[test]
fn ring_poll_needs_no_kick_after_the_first() {
    for event_idx in [false, true] {
        let dir = TempDir::new(&format!("ring-poll-{event_idx}"));
        let options = PollOptions {
            ring: RingMode::Ring,
            // A 10 s spin window: the device polls for the whole test, so
            // every kick the rules ask for is counted, none is timing.
            spin: Some(spin_config(10_000_000, 10_000_000)),
            ..PollOptions::default()
        };
        let (daemon, socket) = start_with(&dir, 1, options);
        let mut d = Driver::connect_with(
            &socket,
            Options {
                event_idx,
                mode: NotifyMode::RingPoll,
                ..Options::default()
            },
        );
        let q = &mut d.rqs[0];
        if !event_idx {
            assert_eq!(
                q.queue.virtqueue().ring().split().unwrap().used_flags() & NO_NOTIFY,
                NO_NOTIFY
            );
        }
        let r = q.command(lun_at(0, 1), Cdb::test_unit_ready(), &[], 0);
        assert_eq!(r.response(), None, "{r:?}");
        for lba in 0..50 {
            let r = q.command(lun_at(0, 1), Cdb::read_10(lba, 1, false), &[], 512);
            assert!(r.good(), "{r:?}");
        }
        // EVENT_IDX: `avail_event` 0 lies in the first batch's window and
        // is never moved while polling; flags: NO_NOTIFY from the start.
        let kicks = q.queue.counters().kicks;
        assert_eq!(kicks, u64::from(event_idx), "event_idx {event_idx}");
        drop(d);
        let r = final_report(&daemon, 2);
        assert_eq!(r.mode, QueueMode::RingPoll);
        assert_eq!(r.kicks, kicks, "kicks received = kicks sent");
        assert_eq!(r.completions, 51);
        daemon.shutdown();
    }
}

/// The default, `--poll auto`: the daemon measured what a wakeup costs,
/// serves a queue without bit 42 by ring polling within a window of at
/// most twice that (never the 200 µs of `--poll ring`), and a queue that
/// trickles (a request every 10 ms, 50 times the largest bound) sleeps
/// before each request and is served by its kick. (Its sleeps may be
/// fewer than the kicks: a request published between its request for a
/// kick and its re-check cancels the sleep, hence half.)
#[test]
fn by_default_a_busy_queue_is_polled_within_the_measured_bound_and_a_trickling_one_kicked() {
    const TRICKLE: u64 = 20;
    let dir = TempDir::new("poll-auto");
    let (daemon, socket) = start(&dir, 1);
    let pool = daemon.registry().pool();
    let cost = pool.wakeup_cost().expect("auto measures the wakeup cost");
    assert!(cost > Duration::ZERO);
    let bound = pool.auto_spin_bound().unwrap();
    assert!(
        bound >= cost.min(Duration::from_micros(100)),
        "{bound:?} {cost:?}"
    );
    let mut d = Driver::connect_with(
        &socket,
        Options {
            mode: NotifyMode::Notify,
            ..Options::default()
        },
    );
    let q = &mut d.rqs[0];
    q.clear_unit_attention(1);
    for lba in 0..200 {
        let r = q.command(lun_at(0, 1), Cdb::read_10(lba, 1, false), &[], 512);
        assert!(r.good(), "{r:?}");
    }
    let kicks = q.queue.counters().kicks;
    for lba in 0..TRICKLE {
        // A gap of 10 ms, and at least until the worker's window ran out
        // and it asked for a kick (`avail_event` at our next index, stored
        // before it re-checks and sleeps): however late the scheduler runs
        // it, the next request must kick.
        std::thread::sleep(Duration::from_millis(10));
        wait_until("the worker asks for a kick", || {
            let ring = q.queue.virtqueue().ring().split().unwrap();
            ring.avail_event() == ring.next_avail()
        });
        let r = q.command(lun_at(0, 1), Cdb::read_10(lba as u32, 1, false), &[], 512);
        assert!(r.good(), "{r:?}");
    }
    let trickle_kicks = q.queue.counters().kicks - kicks;
    assert_eq!(trickle_kicks, TRICKLE, "a kick per trickled request");
    drop(d);
    let r = final_report(&daemon, 2);
    assert_eq!(r.mode, QueueMode::RingPoll, "ring polled");
    assert!(r.sleeps >= TRICKLE / 2, "{r:?}");
    assert!(
        u128::from(r.interval_ns) <= bound.as_nanos(),
        "the window stays within the bound: {r:?}"
    );
    daemon.shutdown();
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
    let mut d = Driver::connect_with(
        &socket,
        Options {
            mode: NotifyMode::Sqcq,
            ..Options::default()
        },
    );
    // The control queue is served by kicks: its SQ doorbell says so for
    // good, so a driver that follows the protocol kicks every time.
    let ctrl = &mut d.control;
    let doorbells = |ctrl: &ControlQueue| ctrl.virtqueue().doorbells().unwrap();
    wait_until("NEED_WAKEUP in the control queue's SQ doorbell", || {
        doorbells(ctrl).sq_need_wakeup()
    });
    // The driver's control queue sleeps for good (CQ NEED_WAKEUP): it gets
    // a call for each completion, and cq.idx follows used->idx.
    assert!(doorbells(ctrl).cq_need_wakeup(), "a parked CQ doorbell");
    for round in 1..=3u16 {
        let before = ctrl.counters();
        let response = ctrl
            .task_management(Tmf::AbortTask, lun_at(0, 0), 7)
            .unwrap();
        assert_eq!(response, Response::Ok);
        assert_eq!(
            ctrl.counters().kicks,
            before.kicks + 1,
            "NEED_WAKEUP set: the driver kicks"
        );
        wait_until("cq.idx follows used->idx", || {
            doorbells(ctrl).cq_idx == round
        });
        wait_until("a call for the completion", || {
            ctrl.counters().calls > before.calls
        });
    }
    daemon.shutdown();
}
