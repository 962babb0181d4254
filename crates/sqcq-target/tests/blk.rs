//! The vhost-user-blk device over a real socket. Through sqcq-driver's
//! blk layer: negotiation and the configuration space, the cache mode,
//! reads and writes with their data, flush, GET_ID, write zeroes and
//! discard, a read-only disk, bit 42. Through rust-vmm's vhost frontend
//! and rings laid out by hand (`raw_ring`): every malformed request
//! answered with its status, configuration writes no driver makes, a
//! request of more segments than the ring holds (Linux builds them with
//! indirect tables; sqcq-driver's requests have at most 8), and resizes
//! told on the backend channel (sqcq-driver has none).

#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

mod common;

use common::blk_driver::BlkDriver;
use common::raw::{self, Raw, code};
use common::raw_ring::{Guest, INDIRECT, NEXT, Vq, WRITE, connect_device};
use common::*;
use serde_json::{Value, json};
use sqcq_driver::NotifyMode;
use sqcq_driver::blk::{Done as DriverDone, RequestError};
use sqcq_target::Daemon;
use sqcq_target::config::{BackstoreKind, DaemonConfig, DeviceConfig, DeviceType, QueueMap};
use sqcq_wire::blk::{
    self, BlkConfig, RequestHeader, RequestType, SECTOR_SIZE, Segment, Status,
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_CONFIG_WCE, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_MQ,
    VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_WRITE_ZEROES, WRITE_ZEROES_FLAG_UNMAP,
};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use vhost::vhost_user::VhostUserFrontend;
use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserProtocolFeatures};
use vhost::vhost_user::{FrontendReqHandler, HandlerResult, VhostUserFrontendReqHandler};

const DISK: u64 = 8 << 20;
const SECTORS: u64 = DISK / SECTOR_SIZE;

/// The device's largest virtqueue (`--queue-size`): more than the rings
/// the tests set up (QUEUE_SIZE) hold.
const DEVICE_QUEUE_SIZE: u16 = 256;
/// What the device then advertises: the backstores' limit (128 iovecs)
/// less two, below DEVICE_QUEUE_SIZE - 2.
const SEG_MAX: u32 = 126;

fn start_blk(dir: &TempDir, read_only: bool) -> (Daemon, std::path::PathBuf) {
    start_blk_on(dir, read_only, BackstoreKind::Ram)
}

/// [`start_blk`] on a backstore of `kind` (a file in `dir` for File).
fn start_blk_on(
    dir: &TempDir,
    read_only: bool,
    kind: BackstoreKind,
) -> (Daemon, std::path::PathBuf) {
    let socket = dir.path("blk.sock");
    let mut disk = lun(kind, DISK);
    if kind == BackstoreKind::File {
        disk.path = Some(dir.path("disk"));
        disk.create = true;
    }
    disk.serial = Some("blk-test".into());
    disk.read_only = read_only;
    let config = DaemonConfig {
        poll: sqcq_target::config::PollOptions::default(),
        workers: 1,
        admin_socket: Some(dir.path("admin.sock")),
        seccomp: Default::default(),
        service: Default::default(),
        devices: vec![DeviceConfig {
            device_type: DeviceType::Blk,
            socket_path: socket.clone(),
            luns: vec![disk],
            num_queues: 2,
            queue_size: DEVICE_QUEUE_SIZE,
            queue_map: QueueMap::default(),
            qos: Default::default(),
        }],
    };
    config.validate().unwrap();
    (Daemon::start(&config).unwrap(), socket)
}

/// The features every test asks for.
const BLK_FEATURES: u64 = (1 << VIRTIO_BLK_F_SEG_MAX)
    | (1 << VIRTIO_BLK_F_BLK_SIZE)
    | (1 << VIRTIO_BLK_F_FLUSH)
    | (1 << VIRTIO_BLK_F_MQ)
    | (1 << VIRTIO_BLK_F_WRITE_ZEROES);

/// A request's outcome: the used length and the status byte.
#[derive(Debug, PartialEq, Eq)]
struct Done {
    len: u32,
    status: u8,
}

/// Submits one request (header, data-out, data-in of `data_in` bytes,
/// status byte), waits for it; returns what came back and the data-in.
fn request(
    vq: &mut Vq,
    g: &mut Guest,
    header: &[u8],
    data_out: &[u8],
    data_in: u32,
) -> (Done, Vec<u8>) {
    submit_blk(vq, g, header, data_out, data_in, false)
}

/// The same, published through the SQ doorbell when `doorbell` (bit 42
/// negotiated), else by a kick.
fn submit_blk(
    vq: &mut Vq,
    g: &mut Guest,
    header: &[u8],
    data_out: &[u8],
    data_in: u32,
    doorbell: bool,
) -> (Done, Vec<u8>) {
    let h = g.alloc(header.len() as u32);
    g.write(h, header);
    let mut bufs = vec![(h, header.len() as u32, false)];
    if !data_out.is_empty() {
        let d = g.alloc(data_out.len() as u32);
        g.write(d, data_out);
        bufs.push((d, data_out.len() as u32, false));
    }
    let din = if data_in > 0 {
        let d = g.alloc(data_in);
        bufs.push((d, data_in, true));
        d
    } else {
        0
    };
    let status = g.alloc(1);
    g.write(status, &[0xee]);
    bufs.push((status, 1, true));
    let head = vq.add(g, &bufs);
    if doorbell {
        vq.publish_sq(g);
    } else {
        vq.kick(g);
    }
    let (done, len) = vq.wait_used(g);
    assert_eq!(done, head);
    let data = if data_in > 0 {
        g.read(din, data_in as usize)
    } else {
        Vec::new()
    };
    (
        Done {
            len,
            status: g.read(status, 1)[0],
        },
        data,
    )
}

fn header(kind: RequestType, sector: u64) -> [u8; blk::HEADER_SIZE] {
    RequestHeader {
        kind,
        ioprio: 0,
        sector,
    }
    .encode()
}

fn ok(len: u32) -> Done {
    Done {
        len,
        status: Status::Ok as u8,
    }
}

fn status(s: Status) -> Done {
    Done {
        len: 1,
        status: s as u8,
    }
}

fn blk_vqs() -> Vec<Vq> {
    (0..2).map(Vq::new).collect()
}

/// A blk daemon and a frontend connected with `features` negotiated.
struct Rig {
    dir: TempDir,
    daemon: Daemon,
    g: Guest,
    qs: Vec<Vq>,
    fe: vhost::vhost_user::Frontend,
}

/// The configuration space, read as the driver reads it.
fn config(fe: &mut vhost::vhost_user::Frontend) -> BlkConfig {
    let size = blk::CONFIG_SIZE as u32;
    let (_, raw) = fe
        .get_config(
            0,
            size,
            VhostUserConfigFlags::WRITABLE,
            &vec![0; size as usize],
        )
        .unwrap();
    BlkConfig::decode(&raw).unwrap()
}

#[test]
fn a_config_read_of_the_whole_payload_gets_the_space_and_zeros() {
    // SPDK's virtio-user initiator reads 256 bytes whatever the device.
    let dir = TempDir::new("blk-config-256");
    let (_daemon, socket) = start_blk(&dir, false);
    let g = Guest::new();
    let mut qs = blk_vqs();
    let mut fe = connect_device(&socket, &g, &mut qs, true, 0);
    let (_, raw) = fe
        .get_config(0, 256, VhostUserConfigFlags::WRITABLE, &[0; 256])
        .unwrap();
    assert_eq!(raw.len(), 256);
    assert_eq!(BlkConfig::decode(&raw).unwrap().capacity, SECTORS);
    assert!(raw[blk::CONFIG_SIZE..].iter().all(|&b| b == 0));
}

fn rig(name: &str, read_only: bool, features: u64) -> Rig {
    rig_on(name, read_only, features, BackstoreKind::Ram)
}

fn rig_on(name: &str, read_only: bool, features: u64, kind: BackstoreKind) -> Rig {
    let dir = TempDir::new(name);
    let (daemon, socket) = start_blk_on(&dir, read_only, kind);
    let g = Guest::new();
    let mut qs = blk_vqs();
    let fe = connect_device(&socket, &g, &mut qs, true, features);
    Rig {
        dir,
        daemon,
        g,
        qs,
        fe,
    }
}

#[test]
fn a_blk_device_negotiates_and_shows_its_disk_in_the_config_space() {
    let dir = TempDir::new("blk-config");
    let (daemon, socket) = start_blk(&dir, false);
    let mut d = BlkDriver::connect(&socket, NotifyMode::Notify);
    let neg = d.frontend.negotiated().clone();
    assert_eq!(neg.vrings, 2, "request queues only");
    assert_eq!(d.rqs.len(), 2, "MQ: num_queues");
    assert!(!neg.has(VIRTIO_BLK_F_RO));
    assert_eq!(neg.offered & (1 << 1), 0, "SIZE_MAX is not offered");
    assert!(neg.has(VIRTIO_BLK_F_CONFIG_WCE) && neg.has(VIRTIO_BLK_F_FLUSH));
    let c = d.config();
    assert_eq!(c.capacity, SECTORS);
    assert_eq!((c.blk_size, c.num_queues), (512, 2));
    assert_eq!(c.seg_max, SEG_MAX);
    assert_eq!(
        (c.max_write_zeroes_seg, c.max_write_zeroes_sectors),
        (1, 2048)
    );
    // Write-back until the driver chooses write-through, which the
    // configuration space then shows.
    assert_eq!(c.writeback, 1);
    d.frontend.set_writeback(false).unwrap();
    assert_eq!(d.config().writeback, 0);
    d.frontend.set_writeback(true).unwrap();
    assert_eq!(d.config().writeback, 1);
    daemon.shutdown();
}

#[test]
fn only_the_cache_mode_is_writable_with_0_or_1_and_a_reset_restores_it() {
    let Rig {
        dir: _dir,
        daemon,
        g: _g,
        qs: _qs,
        mut fe,
    } = rig(
        "blk-config-writes",
        false,
        BLK_FEATURES | (1 << VIRTIO_BLK_F_CONFIG_WCE),
    );
    let wce = blk::CONFIG_WCE_OFFSET as u32;
    fe.set_config(wce, VhostUserConfigFlags::WRITABLE, &[0])
        .unwrap();
    assert_eq!(config(&mut fe).writeback, 0);
    for (offset, value) in [(wce, 2), (0, 1), (wce + 1, 0)] {
        assert!(
            fe.set_config(offset, VhostUserConfigFlags::WRITABLE, &[value])
                .is_err(),
            "offset {offset} value {value}"
        );
    }
    assert_eq!(config(&mut fe).writeback, 0);
    assert_eq!(config(&mut fe).capacity, SECTORS);
    fe.reset_device().unwrap();
    assert_eq!(config(&mut fe).writeback, 1);
    daemon.shutdown();
}

#[test]
fn reads_writes_flush_get_id_write_zeroes_and_discard_do_what_they_say() {
    let dir = TempDir::new("blk-io");
    let (daemon, socket) = start_blk(&dir, false);
    let mut d = BlkDriver::connect(&socket, NotifyMode::Notify);
    // Write-back, then write-through (every write a FUA write).
    for writeback in [true, false] {
        d.frontend.set_writeback(writeback).unwrap();
        for (vq, q) in d.rqs.iter_mut().enumerate() {
            let pattern: Vec<u8> = (0..4096u32)
                .map(|i| (i * 7 + vq as u32 + u32::from(writeback)) as u8)
                .collect();
            let sector = 8 + 64 * vq as u64;
            assert_eq!(
                q.write(sector, &pattern),
                Ok(DriverDone { bytes: 0 }),
                "OUT"
            );
            let (r, data) = q.read(sector, 4096);
            assert_eq!(r, Ok(DriverDone { bytes: 4096 }), "IN");
            assert_eq!(data, pattern);
            assert_eq!(q.flush(), Ok(DriverDone { bytes: 0 }), "FLUSH");
            let (r, id) = q.get_id();
            assert_eq!(r, Ok(DriverDone { bytes: 20 }), "GET_ID");
            assert_eq!(&id[..9], b"blk-test\0");
            // Write zeroes (with the unmap flag) over the first half of the
            // pattern, discard over the second: zeros read back (the RAM
            // disk reads zeros where it deallocated).
            let seg = |sector, flags| Segment {
                sector,
                num_sectors: 4,
                flags,
            };
            assert_eq!(
                q.write_zeroes(seg(sector, WRITE_ZEROES_FLAG_UNMAP)),
                Ok(DriverDone { bytes: 0 })
            );
            assert_eq!(q.discard(seg(sector + 4, 0)), Ok(DriverDone { bytes: 0 }));
            let (_, data) = q.read(sector, 4096);
            assert!(data.iter().all(|b| *b == 0), "zeroes read back");
        }
    }
    // The last sector is readable, the one after it is not.
    let q = &mut d.rqs[0];
    assert_eq!(q.read(SECTORS - 1, 512).0, Ok(DriverDone { bytes: 512 }));
    assert_eq!(
        q.read(SECTORS, 512).0,
        Err(RequestError::Status(Status::IoErr))
    );
    daemon.shutdown();
}

#[test]
fn malformed_and_unsupported_requests_get_their_status() {
    let Rig {
        dir: _dir,
        daemon,
        mut g,
        mut qs,
        fe: _fe,
    } = rig("blk-hostile", false, BLK_FEATURES);
    let q = &mut qs[0];
    let io_err = status(Status::IoErr);
    // Past the end, not a whole sector, an overflowing sector number.
    let (d, _) = request(q, &mut g, &header(RequestType::In, SECTORS), &[], 512);
    assert_eq!(d, io_err, "past the end");
    let (d, _) = request(q, &mut g, &header(RequestType::In, SECTORS - 1), &[], 1024);
    assert_eq!(d, io_err, "runs past the end");
    let (d, _) = request(q, &mut g, &header(RequestType::Out, 0), &[0; 100], 0);
    assert_eq!(d, io_err, "not a whole sector");
    let (d, _) = request(q, &mut g, &header(RequestType::In, u64::MAX), &[], 512);
    assert_eq!(d, io_err, "sector overflow");
    // Unknown type, secure erase: unsupported.
    let (d, _) = request(q, &mut g, &header(RequestType::Other(99), 0), &[], 0);
    assert_eq!(d, status(Status::Unsupp));
    let (d, _) = request(q, &mut g, &header(RequestType::SecureErase, 0), &[0; 16], 0);
    assert_eq!(d, status(Status::Unsupp));
    // Write zeroes: reserved flags, two ranges, too long, misaligned
    // (the disk has 512-byte blocks: only the length limit applies).
    let wz = |g: &mut Guest, q: &mut Vq, segs: &[Segment]| {
        let bytes: Vec<u8> = segs.iter().flat_map(|s| s.encode()).collect();
        request(q, g, &header(RequestType::WriteZeroes, 0), &bytes, 0).0
    };
    let seg = |sector, num_sectors, flags| Segment {
        sector,
        num_sectors,
        flags,
    };
    assert_eq!(wz(&mut g, q, &[seg(0, 8, 2)]), status(Status::Unsupp));
    assert_eq!(
        wz(&mut g, q, &[seg(0, 8, 0), seg(8, 8, 0)]),
        status(Status::Unsupp),
        "two ranges"
    );
    assert_eq!(wz(&mut g, q, &[seg(0, 4096, 0)]), io_err, "too long");
    assert_eq!(
        wz(&mut g, q, &[seg(SECTORS - 4, 8, 0)]),
        io_err,
        "past the end"
    );
    // A header cut short, and a chain without a status byte.
    let (d, _) = request(q, &mut g, &[0; 8], &[], 0);
    assert_eq!(d, io_err, "short header");
    let h = g.alloc(16);
    g.write(h, &header(RequestType::Flush, 0));
    let head = q.add(&g, &[(h, 16, false)]);
    q.kick(&g);
    assert_eq!(q.wait_used(&g), (head, 0), "no status byte: length 0");
    // Every refusal was counted, and the queue still works.
    let bad = daemon
        .device(0)
        .unwrap()
        .info
        .metrics
        .bad_requests
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(bad, 10);
    let (d, _) = request(q, &mut g, &header(RequestType::Flush, 0), &[], 0);
    assert_eq!(d, ok(1));
    daemon.shutdown();
}

#[test]
fn discard_and_write_zeroes_of_more_ranges_than_announced_are_unsupported() {
    let Rig {
        dir: _dir,
        daemon,
        mut g,
        mut qs,
        mut fe,
    } = rig("blk-ranges", false, BLK_FEATURES);
    // The device announces one range per request for both; QEMU's
    // back-ends answer more with UNSUPP (a feature the device lacks),
    // and its vhost-user-blk test expects exactly that. Less than one
    // range is malformed: IOERR.
    let c = config(&mut fe);
    assert_eq!((c.max_discard_seg, c.max_write_zeroes_seg), (1, 1));
    let range = |sector: u64| {
        let mut b = sector.to_le_bytes().to_vec();
        b.extend_from_slice(&8u32.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b
    };
    let q = &mut qs[0];
    for kind in [RequestType::Discard, RequestType::WriteZeroes] {
        for n in [2u64, 3] {
            let bytes: Vec<u8> = (0..n).flat_map(|i| range(i * 8)).collect();
            let (d, _) = request(q, &mut g, &header(kind, 0), &bytes, 0);
            assert_eq!(d, status(Status::Unsupp), "{kind:?} of {n} ranges");
        }
        let (d, _) = request(q, &mut g, &header(kind, 0), &range(0)[..8], 0);
        assert_eq!(d, status(Status::IoErr), "{kind:?} of half a range");
        let (d, _) = request(q, &mut g, &header(kind, 0), &range(0), 0);
        assert_eq!(d, ok(1), "{kind:?} of one range");
    }
    daemon.shutdown();
}

#[test]
fn a_new_call_eventfd_is_signalled_at_once() {
    // As libvhost-user's `vu_set_vring_call_exec` does, so that a driver
    // whose calls went to a descriptor it no longer watches (a reconnect)
    // looks at its used ring; QEMU's vhost-user-blk test `idx` waits for
    // this interrupt before its first request.
    let dir = TempDir::new("blk-call");
    let (daemon, socket) = start_blk(&dir, false);
    let mut c = Raw::connect(&socket);
    c.negotiate(raw::BASE_FEATURES);
    for vq in 0..2u8 {
        // A first descriptor, then one replacing it: each is signalled
        // once, when it arrives.
        for round in 0..2 {
            let call = vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK).unwrap();
            assert_eq!(
                c.set(
                    code::SET_VRING_CALL,
                    &raw::vring_fd(vq),
                    &[call.as_raw_fd()]
                ),
                Some(true)
            );
            assert_eq!(
                call.read().ok(),
                Some(1),
                "vring {vq}, call descriptor {round}: not signalled"
            );
        }
    }
    daemon.shutdown();
}

#[test]
fn a_read_only_disk_says_so_and_refuses_writes() {
    let dir = TempDir::new("blk-ro");
    let (daemon, socket) = start_blk(&dir, true);
    let mut d = BlkDriver::connect(&socket, NotifyMode::Notify);
    assert!(d.frontend.negotiated().has(VIRTIO_BLK_F_RO));
    let q = &mut d.rqs[0];
    let refused = Err(RequestError::Status(Status::IoErr));
    assert_eq!(q.write(0, &[1; 512]), refused);
    let seg = Segment {
        sector: 0,
        num_sectors: 1,
        flags: 0,
    };
    assert_eq!(q.write_zeroes(seg), refused);
    assert_eq!(q.discard(seg), refused);
    assert_eq!(
        q.read(0, 512).0,
        Ok(DriverDone { bytes: 512 }),
        "reads still work"
    );
    daemon.shutdown();
}

#[test]
fn with_bit_42_blk_requests_go_through_the_doorbells() {
    let dir = TempDir::new("blk-sqcq");
    let (daemon, socket) = start_blk(&dir, false);
    let mut d = BlkDriver::connect(&socket, NotifyMode::Sqcq);
    let q = &mut d.rqs[1];
    let pattern: Vec<u8> = (0..1024u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(q.write(16, &pattern), Ok(DriverDone { bytes: 0 }));
    let (r, data) = q.read(16, 1024);
    assert_eq!(r, Ok(DriverDone { bytes: 1024 }));
    assert_eq!(data, pattern);
    assert_eq!(q.flush(), Ok(DriverDone { bytes: 0 }));
    let bells = q.queue.virtqueue().doorbells().expect("doorbells");
    assert_eq!(
        (bells.sq_idx, bells.cq_idx),
        (3, 3),
        "cq.idx follows used->idx"
    );
    drop(d);
    let mut mode = None;
    wait_until("the stopped queue's figures", || {
        mode = daemon
            .stats()
            .into_iter()
            .find(|s| s.vq == 1 && !s.running)
            .map(|s| (s.mode, s.completions));
        mode.is_some()
    });
    assert_eq!(
        mode,
        Some((sqcq_target::runtime::metrics::QueueMode::Sqcq, 3)),
        "served by polling the SQ doorbell"
    );
    daemon.shutdown();
}

/// A chain of `segments` 512-byte data buffers in one indirect table
/// (header, data, status), as Linux builds a request of many segments;
/// returns the used length, the status, and where the data went.
fn indirect_request(
    vq: &mut Vq,
    g: &mut Guest,
    kind: RequestType,
    segments: u16,
    data: &[u8],
) -> (u32, u8, Vec<u64>) {
    let writable = kind == RequestType::In;
    let h = g.alloc(16);
    g.write(h, &header(kind, 0));
    let bufs: Vec<u64> = (0..segments)
        .map(|i| {
            let b = g.alloc(512);
            if !writable {
                g.write(b, &data[usize::from(i) * 512..][..512]);
            }
            b
        })
        .collect();
    let status = g.alloc(1);
    g.write(status, &[0xee]);
    let n = u32::from(segments) + 2;
    let table = g.alloc(16 * n);
    let desc = |i: u32, addr: u64, len: u32, flags: u16| {
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        let next = if i + 1 < n { NEXT } else { 0 };
        d[12..14].copy_from_slice(&(flags | next).to_le_bytes());
        d[14..16].copy_from_slice(&((i + 1) as u16).to_le_bytes());
        g.write(table + 16 * u64::from(i), &d);
    };
    desc(0, h, 16, 0);
    for (i, b) in bufs.iter().enumerate() {
        desc(i as u32 + 1, *b, 512, if writable { WRITE } else { 0 });
    }
    desc(n - 1, status, 1, WRITE);
    let head = vq.reserve(1);
    vq.write_desc(g, head, table, 16 * n, INDIRECT, 0);
    vq.push_head(g, head);
    vq.kick(g);
    let (done, len) = vq.wait_used(g);
    assert_eq!(done, head);
    (len, g.read(status, 1)[0], bufs)
}

#[test]
fn requests_of_more_segments_than_the_ring_holds_work_up_to_seg_max() {
    // The file backstore copies iovecs into slots of a fixed size: the
    // configuration space must not promise more.
    for kind in [BackstoreKind::Ram, BackstoreKind::File] {
        segments_up_to_seg_max(kind);
    }
}

fn segments_up_to_seg_max(kind: BackstoreKind) {
    let Rig {
        dir: _dir,
        daemon,
        mut g,
        mut qs,
        mut fe,
    } = rig_on("blk-segments", false, BLK_FEATURES, kind);
    // As many data segments as seg_max allows: more than the 64-entry
    // ring holds.
    let segments = u16::try_from(config(&mut fe).seg_max).unwrap();
    assert!(segments > QUEUE_SIZE && u32::from(segments) <= SEG_MAX);
    let q = &mut qs[0];
    let data: Vec<u8> = (0..usize::from(segments) * 512)
        .map(|i| (i % 253) as u8)
        .collect();
    let (len, status, _) = indirect_request(q, &mut g, RequestType::Out, segments, &data);
    assert_eq!(
        (len, status),
        (1, Status::Ok as u8),
        "a write of {segments} segments"
    );
    let (len, status, bufs) = indirect_request(q, &mut g, RequestType::In, segments, &[]);
    assert_eq!(
        (len, status),
        (u32::from(segments) * 512 + 1, Status::Ok as u8)
    );
    let back: Vec<u8> = bufs.iter().flat_map(|b| g.read(*b, 512)).collect();
    assert_eq!(back, data, "read back across {segments} segments");
    daemon.shutdown();
}

/// The frontend's end of a backend channel, counting the
/// configuration-change messages.
#[derive(Default)]
struct ConfigChanges(AtomicU32);

impl VhostUserFrontendReqHandler for ConfigChanges {
    fn handle_config_change(&self) -> HandlerResult<u64> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(0)
    }
}

/// Hands the device a backend channel (VHOST_USER_PROTOCOL_F_BACKEND_REQ).
fn backend_channel(
    fe: &mut vhost::vhost_user::Frontend,
) -> (FrontendReqHandler<ConfigChanges>, Arc<ConfigChanges>) {
    let changes = Arc::new(ConfigChanges::default());
    let channel = FrontendReqHandler::new(Arc::clone(&changes)).unwrap();
    let proto = fe.get_protocol_features().unwrap();
    assert!(proto.contains(VhostUserProtocolFeatures::BACKEND_REQ));
    fe.set_protocol_features(
        VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::BACKEND_REQ,
    )
    .unwrap();
    fe.set_backend_request_fd(&channel.get_tx_raw_fd()).unwrap();
    (channel, changes)
}

/// Handles the next message on the backend channel (within [`WAIT`]).
fn next_backend_message(channel: &mut FrontendReqHandler<ConfigChanges>) {
    let mut pfd = libc::pollfd {
        fd: channel.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&raw mut pfd, 1, WAIT.as_millis() as i32) };
    assert_eq!(n, 1, "no message on the backend channel");
    channel.handle_request().unwrap();
}

#[test]
fn a_resize_reaches_the_config_space_the_request_checks_and_the_frontend() {
    let Rig {
        dir,
        daemon,
        mut g,
        mut qs,
        mut fe,
    } = rig("blk-resize", false, BLK_FEATURES);
    let (mut channel, changes) = backend_channel(&mut fe);
    let capacity = |fe: &mut vhost::vhost_user::Frontend| config(fe).capacity;
    let q = &mut qs[0];
    // The sector after the end is refused until the disk grows.
    let (d, _) = request(q, &mut g, &header(RequestType::In, SECTORS), &[], 512);
    assert_eq!(d, status(Status::IoErr));
    let admin = dir.path("admin.sock");
    let resize = |size: Value| {
        rpc(
            &admin,
            "lun_resize",
            json!({"device": 0, "lun": 0, "size": size}),
        )
    };
    assert_eq!(resize(json!("16M")), Ok(json!({"blocks": 32768})));
    next_backend_message(&mut channel);
    assert_eq!(changes.0.load(Ordering::Relaxed), 1, "told of the change");
    assert_eq!(capacity(&mut fe), 2 * SECTORS);
    let (d, _) = request(q, &mut g, &header(RequestType::In, SECTORS), &[], 512);
    assert_eq!(d, ok(513), "the new sectors are there");
    // Shrinking back: the sectors past the new end are refused again.
    assert_eq!(resize(json!("8M")), Ok(json!({"blocks": 16384})));
    next_backend_message(&mut channel);
    assert_eq!(changes.0.load(Ordering::Relaxed), 2);
    assert_eq!(capacity(&mut fe), SECTORS);
    let (d, _) = request(q, &mut g, &header(RequestType::In, SECTORS), &[], 512);
    assert_eq!(d, status(Status::IoErr));
    // A size that is not whole blocks, a LUN a blk device does not have.
    let e = resize(json!(1000)).unwrap_err();
    assert_eq!(error_code(&e), -32602, "{e}");
    let e = rpc(
        &admin,
        "lun_resize",
        json!({"device": 0, "lun": 1, "size": "8M"}),
    )
    .unwrap_err();
    assert_eq!(error_code(&e), -32001, "{e}");
    let ram = json!({"device": 0, "lun": 1, "kind": "ram", "size": "8M"});
    let e = rpc(&admin, "lun_add", ram).unwrap_err();
    assert_eq!(
        error_code(&e),
        -32001,
        "no LUN changes on a blk device: {e}"
    );
    assert_eq!(counter(&daemon, "config_changes_lost"), 0);
    daemon.shutdown();
}

#[test]
fn a_resize_a_frontend_cannot_be_told_of_is_counted() {
    let Rig {
        dir, daemon, fe, ..
    } = rig("blk-resize-untold", false, BLK_FEATURES);
    // Connected, without a backend channel.
    let admin = dir.path("admin.sock");
    let resize = json!({"device": 0, "lun": 0, "size": "16M"});
    assert_eq!(
        rpc(&admin, "lun_resize", resize),
        Ok(json!({"blocks": 32768}))
    );
    wait_until("the untold change is counted", || {
        counter(&daemon, "config_changes_lost") == 1
    });
    drop(fe);
    daemon.shutdown();
}
