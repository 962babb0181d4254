//! Backpressure (spec section "Backpressure"): a queue at its in-flight
//! limit (`--max-inflight`) leaves the rest on its ring, and takes it once
//! its requests complete without waiting for a kick or a new doorbell
//! index (T3), in every mode. With VIRTIO_F_SQCQ_POLL it also sets
//! THROTTLE in `sq.flags` while the requests it took are outstanding
//! (T1), and clears it before it publishes the completions that let it
//! go (T2). The backstore is really blocked (`common::blocked`).

#![allow(clippy::cast_possible_truncation)]

mod common;

use common::blocked::{self, InodeLock, blocked, in_flight, lost_lock, serial, write};
use common::raw_ring::{SQCQ, Vq, connect_device};
use common::*;
use sqcq_protocol::THROTTLE;
use sqcq_target::Daemon;
use sqcq_target::config::{DeviceType, PollOptions, RingMode};
use sqcq_wire::blk::Status;

const LEN: usize = 4096;
/// The in-flight limit of the queue under test.
const MAX: u16 = 2;
/// Writes made available at once: three times the limit.
const WRITES: u16 = 6;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Classic kicks.
    Kick,
    /// The daemon polls the avail index (`--poll ring`).
    RingPoll,
    /// VIRTIO_F_SQCQ_POLL: the daemon polls `sq.idx`.
    Doorbell,
}

/// A daemon with one blk device on a file of `dir`, at most [`MAX`]
/// requests in flight per queue.
fn start(dir: &TempDir, mode: Mode) -> (Daemon, std::path::PathBuf) {
    let poll = PollOptions {
        ring: if mode == Mode::RingPoll {
            RingMode::Ring
        } else {
            RingMode::Kick
        },
        max_in_flight: Some(MAX),
        ..PollOptions::default()
    };
    blocked::start(dir, DeviceType::Blk, poll)
}

fn queue_counter(
    d: &Daemon,
    what: fn(&sqcq_target::runtime::metrics::QueueSnapshot) -> u64,
) -> u64 {
    let m = &d.device(0).unwrap().info.metrics;
    m.queues().map(|q| what(&q)).sum()
}

/// One attempt: false if a write completed while the inode lock was held
/// (the premise broke, see `common::blocked`).
fn attempt(mode: Mode) -> bool {
    let dir = TempDir::new("backpressure");
    let (daemon, socket) = start(&dir, mode);
    let mut g = common::raw_ring::Guest::new();
    let mut vqs = vec![Vq::new(0)];
    let features = if mode == Mode::Doorbell { SQCQ } else { 0 };
    let _fe = connect_device(&socket, &g, &mut vqs, false, features);
    let vq = &mut vqs[0];

    let mut lock = InodeLock::hold(&dir.path("disk"));
    let mut status = std::collections::HashMap::new();
    for i in 0..WRITES {
        let (head, at) = write(vq, &mut g, 8 * u64::from(i), &[0x5a; LEN]);
        status.insert(head, at);
    }
    match mode {
        // Kicks only if the device's poller sleeps.
        Mode::Doorbell => {
            vq.publish_sq(&g);
        }
        Mode::Kick | Mode::RingPoll => vq.kick(&g),
    }

    // The queue takes MAX writes, which block, and leaves the rest on
    // the ring.
    wait_until("the queue at its limit", || {
        in_flight(&daemon) >= u32::from(MAX) || vq.used_idx(&g) != vq.last_used
    });
    if vq.used_idx(&g) != vq.last_used {
        return lost_lock(&lock);
    }
    let limited = |d: &Daemon| queue_counter(d, |q| q.limited);
    wait_until("the limit counted", || limited(&daemon) > 0);
    if mode == Mode::Doorbell {
        // The worker counts the limit, then sets THROTTLE and counts that.
        wait_until("THROTTLE counted", || {
            queue_counter(&daemon, |q| q.throttled) > 0
        });
    }
    // Given time to take more (a queue without a limit takes all six in
    // the pass that found them), it has not.
    std::thread::sleep(std::time::Duration::from_millis(100));
    if vq.used_idx(&g) != vq.last_used {
        return lost_lock(&lock);
    }
    assert_eq!(
        in_flight(&daemon),
        u32::from(MAX),
        "{mode:?}: at most the limit in flight"
    );
    let throttled = queue_counter(&daemon, |q| q.throttled);
    if mode == Mode::Doorbell {
        assert_ne!(
            vq.sq_flags(&g) & THROTTLE,
            0,
            "THROTTLE set while at the limit"
        );
        assert_eq!(throttled, 1);
    } else {
        assert_eq!(throttled, 0, "{mode:?}: no doorbell to signal on");
    }

    // The backstore lets go: every write completes, the ones left on the
    // ring taken as the first complete, with no kick and no new sq.idx.
    lock.release();
    for _ in 0..WRITES {
        let (head, _) = vq.wait_used(&g);
        assert_eq!(
            g.read(status[&head], 1)[0],
            Status::Ok as u8,
            "{mode:?}: write at head {head}"
        );
    }
    if mode == Mode::Doorbell {
        // T2: the clear came before the used index that showed the last
        // completion (read above with Acquire).
        assert_eq!(
            vq.sq_flags(&g) & THROTTLE,
            0,
            "THROTTLE cleared by the last completion"
        );
    }
    assert_eq!(in_flight(&daemon), 0);
    true
}

#[test]
fn a_kicked_queue_at_its_limit_leaves_the_rest_on_the_ring_and_takes_it_later() {
    let _serial = serial();
    blocked(|| attempt(Mode::Kick));
}

#[test]
fn a_ring_polled_queue_at_its_limit_leaves_the_rest_on_the_ring_and_takes_it_later() {
    let _serial = serial();
    blocked(|| attempt(Mode::RingPoll));
}

#[test]
fn a_doorbell_queue_at_its_limit_sets_throttle_and_clears_it_before_the_last_completion() {
    let _serial = serial();
    blocked(|| attempt(Mode::Doorbell));
}
