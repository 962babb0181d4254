//! Two threads, one "driver" and one "device", pass requests one at a time
//! (queue depth 1) through a pair of doorbells, first with a notification
//! per request on real eventfds (classic virtio), then with the
//! VIRTIO_F_SQCQ_POLL handshake (adaptive spin, NEED_WAKEUP, an eventfd
//! only when the other side sleeps). Rounds alternate so that both modes
//! see the same machine; medians and the ratio are printed.
//!
//! This measures the notification cost alone, with no ring and no I/O:
//! `cargo run --release -p sqcq-protocol --example pingpong [-- OPS ROUNDS]`.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use sqcq_protocol::{
    Consumer, Doorbell, DoorbellCell, Producer, QueueStats, SleepCheck, SpinPolicy, Wake,
    handshake::Role,
};

/// A blocking eventfd, as vhost-user uses for kicks and calls.
struct EventFd(File);

impl EventFd {
    fn new() -> EventFd {
        // SAFETY: eventfd(2) has no memory-safety preconditions.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        assert!(fd >= 0, "eventfd: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        EventFd(unsafe { File::from_raw_fd(fd) })
    }

    fn signal(&self) {
        (&self.0)
            .write_all(&1u64.to_ne_bytes())
            .expect("eventfd write");
    }

    fn wait(&self) {
        let mut buf = [0u8; 8];
        (&self.0).read_exact(&mut buf).expect("eventfd read");
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Notify,
    Doorbell,
}

/// Waits for the doorbell to move, spinning for the adaptive window first.
fn wait_for<R: Role>(
    consumer: &mut Consumer<&Doorbell, R>,
    eventfd: &EventFd,
    spin: &mut SpinPolicy,
    stats: &mut QueueStats,
) -> u16 {
    let start = Instant::now();
    let mut window = Duration::from_nanos(spin.window_ns());
    loop {
        if let Some(idx) = consumer.poll() {
            spin.record_gap(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX));
            return idx;
        }
        stats.spins += 1;
        if start.elapsed() < window {
            std::hint::spin_loop();
            continue;
        }
        spin.record_miss();
        match consumer.prepare_sleep() {
            SleepCheck::Work(idx) => return idx,
            SleepCheck::Sleep => {
                stats.sleeps += 1;
                eventfd.wait();
                consumer.finish_sleep();
                window = Duration::from_nanos(spin.window_ns());
            }
        }
    }
}

struct Outcome {
    ops_per_sec: f64,
    notifications_per_op: f64,
    driver: QueueStats,
    device: QueueStats,
}

fn run(mode: Mode, ops: u16) -> Outcome {
    let (sq, cq) = (Doorbell::new(), Doorbell::new());
    let (kick, call) = (EventFd::new(), EventFd::new());
    let start = Instant::now();
    let (driver, device) = thread::scope(|s| {
        let device = s.spawn(|| {
            let mut stats = QueueStats::default();
            let mut spin = SpinPolicy::default();
            let mut sq_consumer = Consumer::<_, sqcq_protocol::handshake::Sq>::new(&sq, 0);
            let mut cq_producer = Producer::<_, sqcq_protocol::handshake::Cq>::new(&cq);
            let mut done = 0;
            while done != ops {
                done = match mode {
                    Mode::Notify => {
                        kick.wait();
                        u16::from_le(sq.idx().load(Ordering::Acquire))
                    }
                    Mode::Doorbell => wait_for(&mut sq_consumer, &kick, &mut spin, &mut stats),
                };
                stats.completions = u64::from(done);
                if mode == Mode::Notify || cq_producer.publish(done) == Wake::Owed {
                    if mode == Mode::Notify {
                        cq.idx().store(done.to_le(), Ordering::Release);
                    }
                    stats.wakeups += 1;
                    call.signal();
                }
            }
            stats.ema_ns = spin.ema_ns();
            stats.interval_ns = spin.window_ns();
            stats
        });
        let mut stats = QueueStats {
            queue: 0,
            ..QueueStats::default()
        };
        let mut spin = SpinPolicy::default();
        let mut sq_producer = Producer::<_, sqcq_protocol::handshake::Sq>::new(&sq);
        let mut cq_consumer = Consumer::<_, sqcq_protocol::handshake::Cq>::new(&cq, 0);
        for idx in 1..=ops {
            if mode == Mode::Notify {
                sq.idx().store(idx.to_le(), Ordering::Release);
                stats.wakeups += 1;
                kick.signal();
                while u16::from_le(cq.idx().load(Ordering::Acquire)) != idx {
                    call.wait();
                }
            } else {
                if sq_producer.publish(idx) == Wake::Owed {
                    stats.wakeups += 1;
                    kick.signal();
                }
                while wait_for(&mut cq_consumer, &call, &mut spin, &mut stats) != idx {}
            }
            stats.completions += 1;
        }
        stats.ema_ns = spin.ema_ns();
        stats.interval_ns = spin.window_ns();
        (stats, device.join().expect("device thread"))
    });
    let secs = start.elapsed().as_secs_f64();
    let notifications = driver.wakeups + device.wakeups;
    Outcome {
        ops_per_sec: f64::from(ops) / secs,
        notifications_per_op: notifications as f64 / f64::from(ops),
        driver,
        device,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let ops: u16 = args
        .next()
        .map_or(60_000, |a| a.parse().expect("OPS: 1..=65535"));
    let rounds: usize = args
        .next()
        .map_or(5, |a| a.parse().expect("ROUNDS: a count"));
    println!(
        "queue depth 1, {ops} requests per round, {rounds} rounds per mode, modes alternating"
    );
    let (mut notify, mut doorbell) = (Vec::new(), Vec::new());
    let mut last = None;
    for _ in 0..rounds {
        notify.push(run(Mode::Notify, ops));
        let d = run(Mode::Doorbell, ops);
        doorbell.push(d.ops_per_sec);
        last = Some(d);
    }
    let n = median(notify.iter().map(|o| o.ops_per_sec).collect());
    let d = median(doorbell);
    let nn = median(notify.iter().map(|o| o.notifications_per_op).collect());
    println!(
        "notify   (eventfd kick + call per request): {n:>12.0} req/s, {nn:.3} notifications/req"
    );
    if let Some(last) = last {
        println!(
            "doorbell (SQ/CQ + NEED_WAKEUP):            {d:>12.0} req/s, {:.3} notifications/req",
            last.notifications_per_op
        );
        println!("doorbell / notify: {:.2}x (medians)", d / n);
        println!("last doorbell round, driver: {}", last.driver);
        println!("last doorbell round, device: {}", last.device);
    }
}
