//! The doorbell modes against an in-process device: virtio-queue's device
//! side serving the ring, polling the SQ doorbell and publishing through
//! the CQ doorbell with the protocol crate's roles, on its own thread with
//! real eventfds. Idle periods are detected by the doorbell flags and the
//! poll thread's own flag, never by sleeping; every wait is bounded, and a
//! lost wakeup shows up as a timeout.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use sqcq_protocol::clock::now_ns;
use sqcq_protocol::{
    CqProducer, Poll, Poller, RingAddrs, SleepCheck, SpinConfig, SpinPolicy, SqConsumer, Wake,
    doorbell_location, guest_doorbells,
};
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use super::*;
use crate::notify::{IdleState, QueueEvents};
use crate::vring::{Buffer, QueueConfig};
use crate::{DriverMemory, Virtqueue};

const BOUND: Duration = Duration::from_secs(20);

/// A short spin window, so that both sides fall asleep quickly.
fn spin() -> SpinConfig {
    SpinConfig {
        min_ns: 1_000,
        max_ns: 50_000,
        initial_ns: 10_000,
        factor: 4,
        wake_ns: 0,
        floor_ns: 0,
    }
}

fn device_queue(mem: &GuestMemoryMmap, vq: &Virtqueue) -> Queue {
    let ring = vq.ring();
    let split = |gpa: vm_memory::GuestAddress| {
        (
            Some(u32::try_from(gpa.0 & 0xffff_ffff).unwrap()),
            Some(u32::try_from(gpa.0 >> 32).unwrap()),
        )
    };
    let mut q = Queue::new(ring.size()).unwrap();
    let (lo, hi) = split(ring.addresses()[0]);
    q.set_desc_table_address(lo, hi);
    let (lo, hi) = split(ring.addresses()[1]);
    q.set_avail_ring_address(lo, hi);
    let (lo, hi) = split(ring.addresses()[2]);
    q.set_used_ring_address(lo, hi);
    q.set_event_idx(ring.event_idx());
    q.set_ready(true);
    assert!(q.is_valid(mem));
    q
}

/// Counters of the in-process device.
#[derive(Default)]
struct DeviceCounters {
    calls: AtomicU64,
    sleeps: AtomicU64,
    completed: AtomicU64,
}

/// The device's poll loop of one queue: SQ consumer, CQ producer.
fn device(
    mut queue: Queue,
    mem: GuestMemoryMmap,
    addrs: RingAddrs,
    kick: EventFd,
    call: EventFd,
    stop: Arc<AtomicBool>,
    counters: Arc<DeviceCounters>,
) {
    let mem = Arc::new(mem);
    let location = doorbell_location(addrs, queue.size()).unwrap();
    let (sq, cq) = guest_doorbells(&mem, location).unwrap();
    let mut poller = Poller::new(SqConsumer::new(&sq, 0), SpinPolicy::new(spin()).unwrap(), 0);
    let mut producer = CqProducer::new(&cq);
    let mut polls = 0u32;
    let mut serve = |queue: &mut Queue| {
        let mut n = 0;
        while let Some(chain) = queue.pop_descriptor_chain(&*mem) {
            let head = chain.head_index();
            queue.add_used(&*mem, head, 0).unwrap();
            n += 1;
        }
        if n > 0 {
            counters.completed.fetch_add(n, Ordering::Relaxed);
            // Fence 3 inside: `cq.idx` store, SeqCst, `cq.flags` load.
            if producer.publish(queue.next_used()) == Wake::Owed {
                counters.calls.fetch_add(1, Ordering::Relaxed);
                call.write(1).unwrap();
            }
        }
    };
    while !stop.load(Ordering::Relaxed) {
        match poller.poll(now_ns()) {
            Poll::Work(_) => serve(&mut queue),
            Poll::Idle => {
                polls = polls.wrapping_add(1);
                if polls.is_multiple_of(16) {
                    thread::yield_now();
                }
            }
            Poll::Expired => match poller.prepare_sleep(now_ns()) {
                SleepCheck::Work(_) => serve(&mut queue),
                SleepCheck::Sleep => {
                    counters.sleeps.fetch_add(1, Ordering::Relaxed);
                    let mut pfd = libc::pollfd {
                        fd: std::os::fd::AsRawFd::as_raw_fd(&kick),
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // Asleep (NEED_WAKEUP set) until a kick or `stop`,
                    // looked at every 50 ms; a lost kick shows up as the
                    // driver's timeout, not here.
                    // SAFETY: one valid pollfd for the duration of the call.
                    while unsafe { libc::poll(&mut pfd, 1, 50) } == 0
                        && !stop.load(Ordering::Relaxed)
                    {}
                    let _ = kick.read();
                    poller.woke();
                    // A kick may announce requests that the doorbell
                    // already showed: look at the ring regardless.
                    serve(&mut queue);
                }
            },
        }
    }
}

/// One queue with its device thread.
struct Rig {
    vq: Virtqueue,
    data: Buffer,
    stop: Arc<AtomicBool>,
    counters: Arc<DeviceCounters>,
    device: Option<thread::JoinHandle<()>>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(d) = self.device.take() {
            d.join().unwrap();
        }
    }
}

fn rigs(n: u16, inline: bool, threads: PollThreads) -> (DriverMemory, Vec<Rig>, PollGroup) {
    rigs_spinning(n, inline, threads, spin())
}

/// [`rigs`] with the driver side's spin window `driver_spin`.
fn rigs_spinning(
    n: u16,
    inline: bool,
    threads: PollThreads,
    driver_spin: SpinConfig,
) -> (DriverMemory, Vec<Rig>, PollGroup) {
    let mut mem = DriverMemory::new(8 << 20).unwrap();
    let mut builder = PollGroupBuilder::new(threads, driver_spin);
    let mut rigs = Vec::new();
    for i in 0..n {
        let ring = crate::Ring::new(&mut mem, QueueConfig::new(16)).unwrap();
        let mut events = QueueEvents::new(None, BOUND).unwrap();
        let notifier = builder
            .attach(&mem, 2 + i, &ring, &mut events, inline)
            .unwrap();
        let vq = Virtqueue::with_notifier(2 + i, ring, notifier, events);
        let gm = mem.guest_memory().clone();
        let queue = device_queue(&gm, &vq);
        let addrs = RingAddrs {
            desc: vq.ring().addresses()[0].0,
            avail: vq.ring().addresses()[1].0,
            used: vq.ring().addresses()[2].0,
        };
        let kick = vq.events().kick_fd().try_clone().unwrap();
        let call = vq.events().call_fd().try_clone().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(DeviceCounters::default());
        let (s, c) = (Arc::clone(&stop), Arc::clone(&counters));
        let device = thread::spawn(move || device(queue, gm, addrs, kick, call, s, c));
        let data = Buffer::new(mem.alloc(64, 8).unwrap(), 64);
        rigs.push(Rig {
            vq,
            data,
            stop,
            counters,
            device: Some(device),
        });
    }
    let group = builder.start().unwrap();
    (mem, rigs, group)
}

/// Submits `n` requests with tokens from `first`, waits for all of them,
/// and checks that each completes exactly once.
fn burst(rig: &mut Rig, first: usize, n: usize) {
    let mut pending: HashSet<usize> = (first..first + n).collect();
    let mut next = first;
    while !pending.is_empty() {
        while next < first + n && rig.vq.ring().num_free() > 0 {
            rig.vq.ring_mut().add(&[], &[rig.data], next).unwrap();
            next += 1;
        }
        rig.vq.publish().unwrap();
        rig.vq.wait().expect("a completion (lost wakeup?)");
        while let Some(used) = rig.vq.ring_mut().pop_used() {
            let token = used.unwrap().token;
            assert!(pending.remove(&token), "token {token} completed twice");
        }
    }
    assert_eq!(rig.vq.ring().in_flight(), 0);
}

/// Waits, bounded, until both sides of the queue are asleep.
fn until_asleep(rig: &Rig) -> IdleState {
    let start = Instant::now();
    loop {
        let state = rig.vq.idle_state().unwrap();
        if state.all_asleep() {
            return state;
        }
        assert!(
            start.elapsed() < BOUND,
            "pollers did not fall asleep: {state:?}"
        );
        thread::yield_now();
    }
}

fn bursts_with_idle_gaps(inline: bool, threads: PollThreads, queues: u16) {
    const BURSTS: usize = 40;
    let (_mem, mut rigs, group) = rigs(queues, inline, threads);
    let shared_thread = queues > 1 && threads == PollThreads::PerDevice;
    thread::scope(|s| {
        for rig in &mut rigs {
            s.spawn(move || {
                for b in 0..BURSTS {
                    burst(rig, b * 100, 1 + b % 37);
                    // Inline, the submitter is the CQ consumer: with
                    // nothing in flight it asks for a call and stops.
                    rig.vq.park();
                    let before = until_asleep(rig);
                    assert_eq!(before.poll_thread, !inline);
                    let kicks = rig.vq.counters().kicks;
                    let calls = rig.counters.calls.load(Ordering::Relaxed);
                    // Calls read from the eventfd: by the poll thread, or
                    // inline by the queue.
                    let read = rig.vq.counters().calls;
                    // The next submission must wake both sides. (A poll
                    // thread shared with another queue may have been woken
                    // by that queue meanwhile, and then needs no call.)
                    burst(rig, b * 100 + 50, 1);
                    assert!(rig.vq.counters().kicks > kicks, "no kick after idle");
                    // The device counts a call right after storing
                    // `cq.idx`, which the submitter may see first: bounded
                    // wait for the count. A poll thread may instead have
                    // been woken, after it was seen asleep, by a call the
                    // device had decided on earlier (for a NEED_WAKEUP a
                    // re-check then withdrew), and caught the new `cq.idx`
                    // spinning: it then read that call.
                    let start = Instant::now();
                    while !shared_thread
                        && rig.counters.calls.load(Ordering::Relaxed) == calls
                        && (inline || rig.vq.counters().calls == read)
                    {
                        assert!(start.elapsed() < BOUND, "no call after idle");
                        thread::yield_now();
                    }
                    if inline {
                        // Parked: the CQ consumer's sleep is counted.
                        assert!(rig.vq.poll_stats().unwrap().sleeps > 0);
                    } else {
                        assert!(before.poll_thread_sleeps > 0);
                    }
                }
            });
        }
    });
    for rig in &mut rigs {
        let total = BURSTS + (0..BURSTS).map(|b| 1 + b % 37).sum::<usize>();
        assert_eq!(rig.counters.completed.load(Ordering::Relaxed), total as u64);
        let stats = rig.vq.poll_stats().unwrap();
        assert!(stats.sleeps > 0);
        assert!(rig.counters.sleeps.load(Ordering::Relaxed) > 0);
    }
    let stats = group.stats().snapshot();
    // Inline queues have no poll thread.
    let threaded = if inline { 0 } else { queues };
    assert_eq!(stats.len(), usize::from(threaded));
    assert_eq!(
        group.threads(),
        match threads {
            _ if inline => 0,
            PollThreads::PerQueue => usize::from(queues),
            PollThreads::PerDevice => 1,
        }
    );
    group.stop();
}

#[test]
fn idle_then_wake_per_device_poll_thread() {
    bursts_with_idle_gaps(false, PollThreads::PerDevice, 1);
}

#[test]
fn idle_then_wake_inline() {
    bursts_with_idle_gaps(true, PollThreads::PerDevice, 1);
}

#[test]
fn inline_queues_run_without_a_poll_thread() {
    bursts_with_idle_gaps(true, PollThreads::PerDevice, 2);
}

#[test]
fn inline_submitter_is_the_cq_consumer() {
    let (_mem, mut rigs, group) = rigs(1, true, PollThreads::PerDevice);
    assert_eq!(group.threads(), 0);
    let rig = &mut rigs[0];
    // Continuous load: the submitter catches completions spinning.
    for round in 0..50 {
        burst(rig, round * 16, 16);
    }
    let stats = rig.vq.poll_stats().unwrap();
    // Counted when a wait returns: the last pops may follow the last wait.
    assert!(stats.completions > 0 && stats.completions <= 800, "{stats}");
    // After the load the consumer does not ask for calls unless parked.
    assert!(!rig.vq.idle_state().unwrap().cq_need_wakeup);
    rig.vq.park();
    assert!(rig.vq.idle_state().unwrap().cq_need_wakeup);
    let calls = rig.vq.counters().calls;
    burst(rig, 10_000, 1);
    // The device saw NEED_WAKEUP and called the queue's own eventfd, which
    // nobody but the queue reads (bounded: the call may trail the
    // completion).
    let start = Instant::now();
    while rig.vq.counters().calls == calls {
        assert!(start.elapsed() < BOUND, "no call after parking");
        thread::yield_now();
    }
    // The flag, left for that call, is gone once the submitter waits again.
    burst(rig, 20_000, 1);
    assert!(!rig.vq.idle_state().unwrap().cq_need_wakeup);
    group.stop();
}

/// In `sqcq` mode the submitter takes what the device published from its
/// ring while it spins, without waiting for the poll thread to forward
/// `cq.idx` (on a shared CPU that thread runs only when the submitter
/// yields). Here the poll thread is gone altogether and the submitter's
/// window is seconds long: every burst completes while it spins, and it
/// never sleeps on its mailbox (which nobody would signal).
#[test]
fn a_spinning_submitter_takes_its_completions_without_the_poll_thread() {
    let long = SpinConfig {
        min_ns: 5_000_000_000,
        max_ns: 5_000_000_000,
        initial_ns: 5_000_000_000,
        factor: 4,
        wake_ns: 0,
        floor_ns: 0,
    };
    let (_mem, mut rigs, group) = rigs_spinning(1, false, PollThreads::PerDevice, long);
    group.stop();
    let rig = &mut rigs[0];
    let sleeps = rig.vq.counters().sleeps;
    for b in 0..8 {
        burst(rig, b * 10, 1 + b % 4);
    }
    assert_eq!(rig.vq.counters().sleeps, sleeps, "the submitter slept");
}

#[test]
fn one_poll_thread_serves_two_queues() {
    bursts_with_idle_gaps(false, PollThreads::PerDevice, 2);
}

#[test]
fn per_queue_poll_threads() {
    bursts_with_idle_gaps(false, PollThreads::PerQueue, 2);
}

#[test]
fn continuous_load_completes_every_request_once() {
    for inline in [false, true] {
        let (_mem, mut rigs, group) = rigs(1, inline, PollThreads::PerDevice);
        let rig = &mut rigs[0];
        for round in 0..200 {
            burst(rig, round * 16, 16);
        }
        assert_eq!(rig.counters.completed.load(Ordering::Relaxed), 3200);
        let stats = rig.vq.poll_stats().unwrap();
        assert!(
            stats.completions > 0 && stats.completions <= 3200,
            "{stats}"
        );
        group.stop();
    }
}

#[test]
fn doorbells_are_zeroed_and_at_the_spec_location() {
    let mut mem = DriverMemory::new(4 << 20).unwrap();
    let ring = crate::Ring::new(&mut mem, QueueConfig::new(64)).unwrap();
    let area = ring.doorbell_area();
    vm_memory::Bytes::write_slice(mem.guest_memory(), &[0xff; 128], area).unwrap();
    let (sq, cq) = bell::queue_doorbells(&mem, &ring).unwrap();
    let mut back = [0xffu8; 128];
    vm_memory::Bytes::read_slice(mem.guest_memory(), &mut back, area).unwrap();
    assert_eq!(back, [0; 128]);
    assert!(!sq.need_wakeup() && !cq.need_wakeup());
    let addrs = RingAddrs {
        desc: ring.addresses()[0].0,
        avail: ring.addresses()[1].0,
        used: ring.addresses()[2].0,
    };
    assert_eq!(doorbell_location(addrs, 64).unwrap().sq, area.0);
}

#[test]
fn packed_doorbells_follow_the_device_area_and_start_at_0x8000() {
    let mut mem = DriverMemory::new(4 << 20).unwrap();
    let config = QueueConfig {
        packed: true,
        ..QueueConfig::new(100)
    };
    let ring = crate::Ring::new(&mut mem, config).unwrap();
    let (sq, cq) = bell::queue_doorbells(&mem, &ring).unwrap();
    let state = crate::notify::DoorbellState::read(&sq, &cq);
    assert_eq!((state.sq_idx, state.cq_idx), (0x8000, 0x8000));
    assert_eq!((state.sq_flags, state.cq_flags), (0, 0));
    let areas = sqcq_protocol::PackedAddrs {
        desc: ring.addresses()[0].0,
        driver: ring.addresses()[1].0,
        device: ring.addresses()[2].0,
    };
    let at = sqcq_protocol::packed_doorbell_location(areas, 100).unwrap();
    assert_eq!(at.sq, ring.doorbell_area().0);
}

#[test]
fn ring_poll_sleeps_after_its_window_and_a_call_wakes_it() {
    for event_idx in [true, false] {
        let mut mem = DriverMemory::new(4 << 20).unwrap();
        let events = QueueEvents::new(None, BOUND).unwrap();
        let config = QueueConfig {
            size: 16,
            event_idx,
            indirect_max: 0,
            packed: false,
        };
        let mut vq =
            Virtqueue::new(&mut mem, 2, config, crate::NotifyMode::RingPoll, events).unwrap();
        let gm = mem.guest_memory().clone();
        let mut queue = device_queue(&gm, &vq);
        let call = vq.events().call_fd().try_clone().unwrap();
        let data = Buffer::new(mem.alloc(64, 8).unwrap(), 64);
        let complete = |queue: &mut Queue| {
            let chain = queue.pop_descriptor_chain(&gm).unwrap();
            queue.add_used(&gm, chain.head_index(), 0).unwrap();
            // virtio-queue's fence between the used->idx store and the
            // used_event / flags load pairs with `enable_interrupts`'.
            let owed = queue.needs_notification(&gm).unwrap();
            if owed {
                call.write(1).unwrap();
            }
            owed
        };
        let stats = vq.stats_handle().unwrap();
        let sleeps = || stats.snapshot()[0].sleeps;
        for round in 0..3 {
            vq.ring_mut().add(&[], &[data], round).unwrap();
            vq.publish().unwrap();
            let slept = sleeps();
            thread::scope(|s| {
                s.spawn(|| {
                    // The driver counts a sleep once its window expired,
                    // it re-enabled interrupts and its re-check found
                    // nothing: from then on a completion is owed a call.
                    // Waiting for that count (not for a time) keeps the
                    // test independent of the scheduler.
                    let deadline = Instant::now() + BOUND;
                    while sleeps() == slept {
                        assert!(Instant::now() < deadline, "the driver never slept");
                        thread::yield_now();
                    }
                    assert!(complete(&mut queue), "event_idx={event_idx}: no call owed");
                });
                vq.wait().expect("woken by the call");
            });
            assert_eq!(vq.ring_mut().pop_used().unwrap().unwrap().token, round);
        }
        let counters = vq.counters();
        assert!(counters.sleeps >= 3 && counters.calls == 3, "{counters:?}");
        let stats = vq.poll_stats().unwrap();
        assert!(stats.sleeps >= 3 && stats.completions == 3, "{stats}");
        if event_idx {
            // While the submitter runs, interrupts are suppressed again
            // (without EVENT_IDX virtio-queue ignores NO_INTERRUPT).
            vq.ring_mut().add(&[], &[data], 9).unwrap();
            vq.publish().unwrap();
            assert!(!complete(&mut queue));
            vq.wait().unwrap();
        }
    }
}

/// A queue nobody polls (spec 4.5) against a device that keeps the
/// protocol strictly: it learns of submissions from `sq.idx` alone, and
/// calls only when `cq.flags` has NEED_WAKEUP. The driver must write
/// `sq.idx` at every publication, kick because the device's SQ is parked,
/// and keep its CQ parked so that every completion is called.
#[test]
fn parked_queue_keeps_the_protocol_without_a_poller() {
    let mut mem = DriverMemory::new(4 << 20).unwrap();
    let ring = crate::Ring::new(&mut mem, QueueConfig::new(16)).unwrap();
    let events = QueueEvents::new(None, BOUND).unwrap();
    let mut vq = parked_queue(&mem, 0, ring, events).unwrap();
    let gm = Arc::new(mem.guest_memory().clone());
    let mut queue = device_queue(&gm, &vq);
    let addrs = RingAddrs {
        desc: vq.ring().addresses()[0].0,
        avail: vq.ring().addresses()[1].0,
        used: vq.ring().addresses()[2].0,
    };
    let (sq, cq) = guest_doorbells(&gm, doorbell_location(addrs, 16).unwrap()).unwrap();
    let mut consumer = SqConsumer::new(&sq, 0);
    consumer.park();
    let mut producer = CqProducer::new(&cq);
    let data = Buffer::new(mem.alloc(64, 8).unwrap(), 64);
    let kick = vq.events().kick_fd().try_clone().unwrap();
    let call = vq.events().call_fd().try_clone().unwrap();

    for round in 0..3u16 {
        vq.ring_mut().add(&[], &[data], usize::from(round)).unwrap();
        vq.publish().unwrap();
        assert!(
            kick.read().is_ok(),
            "round {round}: no kick for a parked SQ"
        );
        assert_eq!(
            consumer.poll(),
            Some(round + 1),
            "round {round}: sq.idx not written"
        );
        let chain = queue.pop_descriptor_chain(&*gm).unwrap();
        queue.add_used(&*gm, chain.head_index(), 0).unwrap();
        assert_eq!(
            producer.publish(queue.next_used()),
            Wake::Owed,
            "round {round}: CQ not parked"
        );
        call.write(1).unwrap();
        vq.wait().unwrap();
        let used = vq.ring_mut().pop_used().unwrap().unwrap();
        assert_eq!(used.token, usize::from(round));
    }
}
