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
use std::time::Instant;

use sqcq_protocol::handshake::{Cq, Sq};
use sqcq_protocol::{
    Consumer, Doorbell, DoorbellCell, Poll, Poller, Producer, QueueStats, SleepCheck, SpinPolicy,
    Wake, Watch,
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

/// Nanoseconds since the first call: the pollers' clock.
fn now_ns() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    u64::try_from(START.get_or_init(Instant::now).elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Waits for the doorbell to move: spin for the adaptive window, then set
/// NEED_WAKEUP, re-check, and sleep on the eventfd.
///
/// While spinning it yields the CPU every few polls: on a machine with
/// more runnable threads than CPUs, the thread that will write the doorbell
/// may be waiting for this very CPU.
fn wait_for<W: Watch>(poller: &mut Poller<W>, eventfd: &EventFd) -> u16 {
    let mut polls = 0u32;
    loop {
        match poller.poll(now_ns()) {
            Poll::Work(idx) => return idx,
            Poll::Idle => {
                polls = polls.wrapping_add(1);
                if polls.is_multiple_of(16) {
                    thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
            Poll::Expired => match poller.prepare_sleep(now_ns()) {
                SleepCheck::Work(idx) => return idx,
                SleepCheck::Sleep => {
                    eventfd.wait();
                    poller.woke();
                }
            },
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
            let mut poller = Poller::new(Consumer::<_, Sq>::new(&sq, 0), SpinPolicy::default(), 0);
            let mut cq_producer = Producer::<_, Cq>::new(&cq);
            let mut done = 0;
            while done != ops {
                let previous = done;
                done = match mode {
                    Mode::Notify => {
                        kick.wait();
                        u16::from_le(sq.idx().load(Ordering::Acquire))
                    }
                    Mode::Doorbell => wait_for(&mut poller, &kick),
                };
                poller.count_completions(u64::from(done.wrapping_sub(previous)));
                let wake = match mode {
                    Mode::Notify => {
                        cq.idx().store(done.to_le(), Ordering::Release);
                        Wake::Owed
                    }
                    Mode::Doorbell => cq_producer.publish(done),
                };
                if wake == Wake::Owed {
                    poller.count_wakeup();
                    call.signal();
                }
            }
            poller.stats()
        });
        let mut poller = Poller::new(Consumer::<_, Cq>::new(&cq, 0), SpinPolicy::default(), 0);
        let mut sq_producer = Producer::<_, Sq>::new(&sq);
        for idx in 1..=ops {
            let wake = match mode {
                Mode::Notify => {
                    sq.idx().store(idx.to_le(), Ordering::Release);
                    Wake::Owed
                }
                Mode::Doorbell => sq_producer.publish(idx),
            };
            if wake == Wake::Owed {
                poller.count_wakeup();
                kick.signal();
            }
            match mode {
                Mode::Notify => {
                    while u16::from_le(cq.idx().load(Ordering::Acquire)) != idx {
                        call.wait();
                    }
                }
                Mode::Doorbell => while wait_for(&mut poller, &call) != idx {},
            }
            poller.count_completions(1);
        }
        (poller.stats(), device.join().expect("device thread"))
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
