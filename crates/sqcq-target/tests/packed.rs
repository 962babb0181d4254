//! Packed rings (VIRTIO_F_RING_PACKED, `sqcqd --packed`) over a real
//! socket, driven by sqcq-driver's packed queue: what is offered, data
//! through both device types in every mode, bit 42's doorbells included
//! (spec section 10), over several laps of the ring, the doorbells where
//! section 10.1 puts them holding positions, a nonsense `sq.idx`, the SCSI
//! event queue, and a ring stopped and started again at the packed vring
//! base (both positions).

mod common;

use common::blk_driver::BlkDriver;
use common::driver::{Driver, HOTPLUG_AND_CHANGE, Options, lun_at};
use common::*;
use sqcq_driver::NotifyMode;
use sqcq_driver::frontend::{Frontend, FrontendConfig};
use sqcq_driver::scsi::Cdb;
use sqcq_target::config::PollOptions;
use sqcq_target::config::RingMode;
use sqcq_target::scsi::device::EventReport;
use virtio_bindings::virtio_config::VIRTIO_F_RING_PACKED;

const PACKED: u64 = 1 << VIRTIO_F_RING_PACKED;
const SQCQ: u64 = 1 << sqcq_protocol::VIRTIO_F_SQCQ_POLL;

fn packed_daemon(dir: &TempDir, ring: RingMode) -> (sqcq_target::Daemon, std::path::PathBuf) {
    start_with(
        dir,
        1,
        PollOptions {
            offer_packed: true,
            ring,
            ..PollOptions::default()
        },
    )
}

fn offered(socket: &std::path::Path) -> u64 {
    let config = FrontendConfig {
        timeout: WAIT,
        inflight: false,
        ..FrontendConfig::new(socket)
    };
    let frontend: Frontend = common::driver::connect_retrying(&config);
    frontend.negotiated().offered
}

#[test]
fn packed_rings_are_offered_when_asked_beside_bit_42() {
    let dir = TempDir::new("packed-offer");
    let (daemon, socket) = start(&dir, 1);
    let split = offered(&socket);
    assert_eq!(split & PACKED, 0, "not offered by default: {split:#x}");
    assert_ne!(split & SQCQ, 0, "bit 42 is: {split:#x}");
    daemon.shutdown();

    let dir = TempDir::new("packed-offer2");
    let (daemon, socket) = packed_daemon(&dir, RingMode::Auto);
    let packed = offered(&socket);
    assert_ne!(packed & PACKED, 0, "--packed offers it: {packed:#x}");
    assert_ne!(packed & SQCQ, 0, "and bit 42 with it: {packed:#x}");
    daemon.shutdown();
}

/// A block of LBA `lba` and round `round` that no other write repeats.
fn pattern(lba: u32, round: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (lba.wrapping_mul(31) ^ round.wrapping_mul(7)).to_le_bytes()[0] ^ i.to_le_bytes()[0]
        })
        .collect()
}

#[test]
fn scsi_data_goes_round_packed_rings_in_every_mode() {
    for (ring, mode) in [
        (RingMode::Kick, NotifyMode::Notify),
        (RingMode::Auto, NotifyMode::Notify),
        (RingMode::Ring, NotifyMode::RingPoll),
        (RingMode::Auto, NotifyMode::PollQueue),
        (RingMode::Auto, NotifyMode::Sqcq),
        (RingMode::Auto, NotifyMode::SqcqInline),
    ] {
        for indirect in [false, true] {
            let dir = TempDir::new("packed-scsi");
            let (daemon, socket) = packed_daemon(&dir, ring);
            let mut d = Driver::connect_with(
                &socket,
                Options {
                    device_features: HOTPLUG_AND_CHANGE | PACKED,
                    indirect,
                    mode,
                    ..Options::default()
                },
            );
            for rq in &mut d.rqs {
                assert!(rq.queue.virtqueue().ring().is_packed());
                rq.clear_unit_attention(0);
                // 3 to 4 descriptors a request without indirect tables:
                // several laps of a 64-entry ring.
                for round in 0..120u32 {
                    let lba = round * 7 % 64;
                    let data = pattern(lba, round, 512);
                    let w = rq.command(lun_at(0, 0), Cdb::write_10(lba, 1, false), &data, 0);
                    assert!(w.good(), "{ring:?} {mode:?} {indirect}: {w:?}");
                    let r = rq.command(lun_at(0, 0), Cdb::read_10(lba, 1, false), &[], 512);
                    assert!(r.good(), "{r:?}");
                    assert_eq!(r.data, data, "{ring:?} {mode:?} {indirect} round {round}");
                }
            }
            daemon.shutdown();
        }
    }
}

#[test]
fn blk_data_goes_round_packed_rings() {
    for (ring, mode) in [
        (RingMode::Kick, NotifyMode::Notify),
        (RingMode::Ring, NotifyMode::RingPoll),
        (RingMode::Auto, NotifyMode::Sqcq),
        (RingMode::Auto, NotifyMode::SqcqInline),
    ] {
        let dir = TempDir::new("packed-blk");
        let (daemon, socket) = start_blk_with(&dir, ring);
        let mut d = BlkDriver::connect_features(&socket, mode, PACKED);
        let rq = &mut d.rqs[0];
        assert!(rq.queue.virtqueue().ring().is_packed());
        for round in 0..150u32 {
            let sector = u64::from(round * 13 % 256);
            let data = pattern(round, round, 4096);
            rq.write(sector, &data).unwrap();
            let (r, back) = rq.read(sector, 4096);
            r.unwrap();
            assert_eq!(back, data, "{ring:?} {mode:?} round {round}");
        }
        rq.flush().unwrap();
        daemon.shutdown();
    }
}

/// One blk device of 1 MiB of RAM offering packed rings.
fn start_blk_with(dir: &TempDir, ring: RingMode) -> (sqcq_target::Daemon, std::path::PathBuf) {
    use sqcq_target::config::{BackstoreKind, DaemonConfig, DeviceConfig, DeviceType, QueueMap};
    let socket = dir.path("blk.sock");
    let config = DaemonConfig {
        poll: PollOptions {
            offer_packed: true,
            ring,
            ..PollOptions::default()
        },
        workers: 1,
        admin_socket: None,
        seccomp: Default::default(),
        service: Default::default(),
        devices: vec![DeviceConfig {
            device_type: DeviceType::Blk,
            socket_path: socket.clone(),
            luns: vec![lun(BackstoreKind::Ram, 1 << 20)],
            num_queues: 1,
            queue_size: QUEUE_SIZE,
            queue_map: QueueMap::default(),
            qos: Default::default(),
        }],
    };
    config.validate().unwrap();
    (sqcq_target::Daemon::start(&config).unwrap(), socket)
}

#[test]
fn the_event_queue_is_packed_too() {
    let dir = TempDir::new("packed-events");
    let (daemon, socket) = packed_daemon(&dir, RingMode::Auto);
    let mut d = Driver::connect_with(
        &socket,
        Options {
            device_features: HOTPLUG_AND_CHANGE | PACKED,
            ..Options::default()
        },
    );
    for reason in 1..=3 {
        daemon.scsi_device(0).unwrap().report_event(EventReport {
            lun: 1,
            event: 1,
            reason,
        });
        let e = d.events.next_event().unwrap();
        assert_eq!(&e[12..16], &reason.to_le_bytes());
    }
    daemon.shutdown();
}

/// GET_VRING_BASE of a packed ring gives both positions with their wrap
/// counters; a ring started again there serves a request made available
/// while it was stopped, without a kick.
#[test]
fn a_packed_ring_restarts_at_its_base() {
    let dir = TempDir::new("packed-base");
    let (daemon, socket) = packed_daemon(&dir, RingMode::Kick);
    let mut d = Driver::connect_with(
        &socket,
        Options {
            device_features: HOTPLUG_AND_CHANGE | PACKED,
            ..Options::default()
        },
    );
    let rq = &mut d.rqs[0];
    rq.clear_unit_attention(0);
    // Past the first lap, so that both wrap counters have flipped.
    for lba in 0..40 {
        let r = rq.command(lun_at(0, 0), Cdb::read_10(lba, 1, false), &[], 512);
        assert!(r.good(), "{r:?}");
    }
    let done = rq.queue.virtqueue().ring().vring_base();
    assert_eq!(
        done & 0x8000,
        0,
        "the avail wrap counter flipped: {done:#x}"
    );
    let base = d.frontend.stop_queue(2).unwrap();
    assert_eq!(base, done);
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

/// A packed ring's doorbells are where spec section 10.1 puts them (after
/// the Device Area) and hold positions (10.2): once the queue is idle,
/// `cq.idx` names the driver's next used position and `sq.idx` its next
/// avail position, wrap counters included; an `sq.idx` that names no
/// position of the ring breaks that queue (10.4).
#[test]
fn packed_doorbells_hold_positions_and_a_nonsense_one_breaks_the_queue() {
    use vm_memory::Bytes;
    let dir = TempDir::new("packed-bells");
    let (daemon, socket) = packed_daemon(&dir, RingMode::Auto);
    let mut d = Driver::connect_with(
        &socket,
        Options {
            device_features: HOTPLUG_AND_CHANGE | PACKED,
            indirect: true,
            mode: NotifyMode::SqcqInline,
            ..Options::default()
        },
    );
    let rq = &mut d.rqs[0];
    rq.clear_unit_attention(0);
    // One descriptor a request: past the end of the 64-entry ring once.
    for lba in 0..70 {
        let r = rq.command(lun_at(0, 0), Cdb::read_10(lba, 1, false), &[], 512);
        assert!(r.good(), "{r:?}");
    }
    let vq = rq.queue.virtqueue();
    let [a0, a1, u0, u1] = vq.ring().vring_base().to_le_bytes();
    let (avail, used) = (u16::from_le_bytes([a0, a1]), u16::from_le_bytes([u0, u1]));
    assert_eq!(used, vq.ring().last_used());
    assert_eq!(used & 0x8000, 0, "the used wrap counter flipped: {used:#x}");
    wait_until("cq.idx at the next used position", || {
        vq.doorbells().is_some_and(|b| b.cq_idx == used)
    });
    assert_eq!(vq.doorbells().unwrap().sq_idx, avail);

    let area = vq.ring().doorbell_area();
    let kick = vq.events().kick_fd().try_clone().unwrap();
    // Offset 0x7fff of a 64-entry ring.
    d.mem
        .guest_memory()
        .write_obj(0x7fffu16.to_le(), area)
        .unwrap();
    kick.write(1).unwrap();
    wait_until("the queue broken by sq.idx", || {
        counter(&daemon, "broken_rings") == 1
    });
    daemon.shutdown();
}
