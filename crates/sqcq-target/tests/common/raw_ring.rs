//! A hand-written driver side for hostile-input tests only: memfd guest
//! memory shared through SET_MEM_TABLE, split rings laid out by hand
//! (`Vq`), virtio-scsi requests built byte by byte, the SQ/CQ doorbells
//! poked directly, and rust-vmm's vhost `Frontend`. It writes whatever a
//! test asks for: descriptor loops, addresses outside memory, indices a
//! ring size ahead, doorbell values no driver would write, memory shrunk
//! under a running queue. Tests of correct behaviour use
//! [`super::driver`] instead.

// Test code: lengths and indices are small constants of the tests.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::Path;
use std::sync::atomic::{Ordering, fence};
use std::time::{Duration, Instant};

use sqcq_protocol::{DoorbellLocation, NEED_WAKEUP, RingAddrs, doorbell_location};
use sqcq_wire::scsi::{self, CmdResp, Lun, TaskAttr};
use vhost::vhost_user::message::{
    VhostUserHeaderFlag, VhostUserProtocolFeatures, VhostUserVirtioFeatures,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::{
    Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestRegionMmap,
    MmapRegion,
};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::{QUEUE_SIZE, WAIT};

pub const NEXT: u16 = 1;
pub const WRITE: u16 = 2;
pub const INDIRECT: u16 = 4;

pub const GUEST_SIZE: u64 = 8 << 20;
/// Rings live below this address, buffers above.
pub const DATA_START: u64 = 1 << 20;
/// Default request and response sizes (cdb_size 32, sense_size 96).
pub const REQ_LEN: u32 = scsi::CMD_REQ_DEFAULT_SIZE as u32;
pub const RESP_LEN: u32 = scsi::CMD_RESP_DEFAULT_SIZE as u32;

/// Guest memory: one memfd region at guest physical address 0.
pub struct Guest {
    pub mem: GuestMemoryMmap,
    file: File,
    next_buf: u64,
}

impl Guest {
    pub fn new() -> Self {
        // SAFETY: a valid NUL-terminated name; flags are plain constants.
        let fd = unsafe { libc::memfd_create(c"sqcq-test-guest".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create failed");
        // SAFETY: `fd` is a new descriptor owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(GUEST_SIZE).unwrap();
        let region = MmapRegion::from_file(
            FileOffset::new(file.try_clone().unwrap(), 0),
            usize::try_from(GUEST_SIZE).unwrap(),
        )
        .unwrap();
        let region = GuestRegionMmap::new(region, GuestAddress(0)).unwrap();
        let mem = GuestMemoryMmap::from_regions(vec![region]).unwrap();
        Guest {
            mem,
            file,
            next_buf: DATA_START,
        }
    }

    /// The frontend's own virtual address of guest address `gpa`.
    pub fn va(&self, gpa: u64) -> u64 {
        self.mem.get_host_address(GuestAddress(gpa)).unwrap() as u64
    }

    pub fn region(&self) -> VhostUserMemoryRegionInfo {
        VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: GUEST_SIZE,
            userspace_addr: self.va(0),
            mmap_offset: 0,
            mmap_handle: self.file.as_raw_fd(),
        }
    }

    /// A zeroed buffer of `len` bytes (bump allocation, 64-byte aligned).
    pub fn alloc(&mut self, len: u32) -> u64 {
        let at = self.next_buf;
        self.next_buf = (at + u64::from(len) + 63) & !63;
        if self.next_buf >= GUEST_SIZE {
            self.next_buf = DATA_START;
            return self.alloc(len);
        }
        self.mem
            .write_slice(&vec![0u8; len as usize], GuestAddress(at))
            .unwrap();
        at
    }

    /// Shrinks (or grows) the memfd behind guest memory, as a hostile
    /// frontend would after sharing it. Touching the lost pages afterwards
    /// raises SIGBUS in this process too.
    pub fn truncate(&self, len: u64) {
        self.file.set_len(len).unwrap();
    }

    pub fn write(&self, gpa: u64, data: &[u8]) {
        self.mem.write_slice(data, GuestAddress(gpa)).unwrap();
    }

    pub fn read(&self, gpa: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem.read_slice(&mut v, GuestAddress(gpa)).unwrap();
        v
    }
}

/// The driver side of one split virtqueue.
pub struct Vq {
    pub index: usize,
    pub size: u16,
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
    pub next_avail: u16,
    pub last_used: u16,
    next_desc: u16,
    pub kick: EventFd,
    pub call: EventFd,
    pub err: EventFd,
}

impl Vq {
    pub fn new(index: usize) -> Self {
        let base = index as u64 * 0x4000;
        Vq {
            index,
            size: QUEUE_SIZE,
            desc: base,
            avail: base + 0x1000,
            used: base + 0x2000,
            next_avail: 0,
            last_used: 0,
            next_desc: 0,
            kick: EventFd::new(EFD_NONBLOCK).unwrap(),
            call: EventFd::new(EFD_NONBLOCK).unwrap(),
            err: EventFd::new(EFD_NONBLOCK).unwrap(),
        }
    }

    /// Zeroes the ring and announces it to the device.
    pub fn setup(&mut self, fe: &mut Frontend, g: &Guest) {
        fe.set_vring_err(self.index, &self.err).unwrap();
        self.restart(fe, g);
    }

    /// [`Self::setup`] without SET_VRING_ERR, as QEMU starts a ring again
    /// after a device reset (it sends the error eventfd once per
    /// connection).
    pub fn restart(&mut self, fe: &mut Frontend, g: &Guest) {
        g.write(self.desc, &vec![0u8; 0x3000]);
        self.next_avail = 0;
        self.last_used = 0;
        self.next_desc = 0;
        self.hand_over(fe, g, 0);
    }

    /// SET_VRING_NUM, ADDR, BASE, CALL, KICK and ENABLE.
    fn hand_over(&self, fe: &mut Frontend, g: &Guest, base: u16) {
        fe.set_vring_num(self.index, self.size).unwrap();
        fe.set_vring_addr(
            self.index,
            &VringConfigData {
                queue_max_size: self.size,
                queue_size: self.size,
                flags: 0,
                desc_table_addr: g.va(self.desc),
                used_ring_addr: g.va(self.used),
                avail_ring_addr: g.va(self.avail),
                log_addr: None,
            },
        )
        .unwrap();
        fe.set_vring_base(self.index, base).unwrap();
        fe.set_vring_call(self.index, &self.call).unwrap();
        fe.set_vring_kick(self.index, &self.kick).unwrap();
        fe.set_vring_enable(self.index, true).unwrap();
    }

    /// Hands the ring, as it is, to a device that resumes at `base` (a
    /// new connection after the daemon died, as QEMU reconnects: the base
    /// is the used index).
    pub fn resume(&mut self, fe: &mut Frontend, g: &Guest, base: u16) {
        fe.set_vring_err(self.index, &self.err).unwrap();
        self.hand_over(fe, g, base);
    }

    /// Publishes the available index without a kick.
    pub fn publish(&self, g: &Guest) {
        // Release: descriptors and ring entries before the index.
        fence(Ordering::Release);
        g.mem
            .store(
                self.next_avail.to_le(),
                GuestAddress(self.avail + 2),
                Ordering::Release,
            )
            .unwrap();
    }

    /// Writes descriptor `i`.
    pub fn write_desc(&self, g: &Guest, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        g.write(self.desc + 16 * u64::from(i), &d);
    }

    /// Chains `bufs` (address, length, device-writable) into fresh
    /// descriptors and makes the chain available; returns its head.
    pub fn add(&mut self, g: &Guest, bufs: &[(u64, u32, bool)]) -> u16 {
        let head = self.next_desc;
        for (k, (addr, len, write)) in bufs.iter().enumerate() {
            let i = (head + k as u16) % self.size;
            let last = k + 1 == bufs.len();
            let flags = if *write { WRITE } else { 0 } | if last { 0 } else { NEXT };
            self.write_desc(g, i, *addr, *len, flags, (i + 1) % self.size);
        }
        self.next_desc = (head + bufs.len() as u16) % self.size;
        self.push_head(g, head);
        head
    }

    /// Reserves `n` descriptors for a hand-built chain; returns the first.
    pub fn reserve(&mut self, n: u16) -> u16 {
        let first = self.next_desc;
        self.next_desc = (first + n) % self.size;
        first
    }

    /// Puts `head` in the available ring (not yet published).
    pub fn push_head(&mut self, g: &Guest, head: u16) {
        let slot = self.avail + 4 + 2 * u64::from(self.next_avail % self.size);
        g.write(slot, &head.to_le_bytes());
        self.next_avail = self.next_avail.wrapping_add(1);
    }

    /// Publishes the available index and kicks.
    pub fn kick(&self, g: &Guest) {
        self.publish(g);
        fence(Ordering::SeqCst);
        self.kick.write(1).unwrap();
    }

    pub fn used_idx(&self, g: &Guest) -> u16 {
        u16::from_le(
            g.mem
                .load(GuestAddress(self.used + 2), Ordering::Acquire)
                .unwrap(),
        )
    }

    /// Waits for the next used element: (head, len).
    pub fn wait_used(&mut self, g: &Guest) -> (u16, u32) {
        let deadline = Instant::now() + WAIT;
        while self.used_idx(g) == self.last_used {
            assert!(
                Instant::now() < deadline,
                "vq {}: no completion within {WAIT:?}",
                self.index
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let slot = self.used + 4 + 8 * u64::from(self.last_used % self.size);
        let e = g.read(slot, 8);
        self.last_used = self.last_used.wrapping_add(1);
        let id = u32::from_le_bytes(e[0..4].try_into().unwrap());
        let len = u32::from_le_bytes(e[4..8].try_into().unwrap());
        (u16::try_from(id).unwrap(), len)
    }
}

/// RESET_DEVICE, then a new start cycle of every vring in `vqs`, as QEMU
/// makes it (features again, no second SET_VRING_ERR).
pub fn reset_and_restart(fe: &mut Frontend, g: &Guest, vqs: &mut [Vq]) {
    use vhost::VhostBackend;
    fe.reset_device().unwrap();
    fe.set_features((1 << 32) | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits())
        .unwrap();
    for vq in vqs.iter_mut() {
        vq.restart(fe, g);
    }
}

/// Connects and negotiates: features (with EVENT_IDX when asked),
/// protocol features MQ | CONFIG | REPLY_ACK, memory, and the vrings.
pub fn connect(path: &Path, g: &Guest, vqs: &mut [Vq], event_idx: bool) -> Frontend {
    connect_with(path, g, vqs, event_idx, 0)
}

/// Like [`connect`], also asking for the feature bits in `extra`.
pub fn connect_with(
    path: &Path,
    g: &Guest,
    vqs: &mut [Vq],
    event_idx: bool,
    extra: u64,
) -> Frontend {
    // virtio-scsi's HOTPLUG and CHANGE.
    connect_device(path, g, vqs, event_idx, (1 << 1) | (1 << 2) | extra)
}

/// Connects as `connect_with` does, asking for the generic features
/// (VERSION_1, INDIRECT_DESC, EVENT_IDX if asked, PROTOCOL_FEATURES) and
/// the device's `device` bits.
pub fn connect_device(
    path: &Path,
    g: &Guest,
    vqs: &mut [Vq],
    event_idx: bool,
    device: u64,
) -> Frontend {
    connect_full(
        path,
        g,
        vqs,
        event_idx,
        device,
        VhostUserProtocolFeatures::empty(),
        &mut |_| {},
    )
}

/// Connects as [`connect_device`] does, also acking the protocol features
/// in `proto` and calling `before_rings` once memory is set, before the
/// vrings are (where QEMU sends GET/SET_INFLIGHT_FD).
pub fn connect_full(
    path: &Path,
    g: &Guest,
    vqs: &mut [Vq],
    event_idx: bool,
    device: u64,
    proto: VhostUserProtocolFeatures,
    before_rings: &mut dyn FnMut(&mut Frontend),
) -> Frontend {
    let deadline = Instant::now() + WAIT;
    let mut fe = loop {
        // Room for vrings set up later (`Vq::resume`).
        match Frontend::connect(path, vqs.len().max(8) as u64) {
            Ok(f) => break f,
            Err(e) => {
                assert!(Instant::now() < deadline, "cannot connect: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    };
    fe.set_owner().unwrap();
    let offered = fe.get_features().unwrap();
    // VERSION_1, INDIRECT_DESC, PROTOCOL_FEATURES.
    let mut wanted = (1u64 << 32) | (1 << 28) | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
    if event_idx {
        wanted |= 1 << 29;
    }
    wanted |= device;
    assert_eq!(offered & wanted, wanted, "device must offer {wanted:#x}");
    let want_proto = VhostUserProtocolFeatures::MQ
        | VhostUserProtocolFeatures::CONFIG
        | VhostUserProtocolFeatures::REPLY_ACK
        | VhostUserProtocolFeatures::RESET_DEVICE
        | proto;
    let offered_proto = fe.get_protocol_features().unwrap();
    assert!(offered_proto.contains(want_proto));
    fe.set_protocol_features(want_proto).unwrap();
    // Every set_* waits for the device's REPLY_ACK from now on.
    fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
    fe.set_features(wanted).unwrap();
    fe.set_mem_table(&[g.region()]).unwrap();
    before_rings(&mut fe);
    for vq in vqs.iter_mut() {
        vq.setup(&mut fe, g);
    }
    fe
}

/// A virtio-scsi command response.
#[derive(Debug)]
pub struct Resp {
    pub sense_len: u32,
    pub resid: u32,
    pub status: u8,
    pub response: u8,
    pub sense: Vec<u8>,
}

impl Resp {
    pub fn sense_key(&self) -> u8 {
        self.sense.get(2).map_or(0, |b| b & 0xf)
    }
    pub fn asc(&self) -> u8 {
        self.sense.get(12).copied().unwrap_or(0)
    }
}

/// The LUN field for `target`, `lun`.
pub fn lun_field(target: u8, lun: u16) -> [u8; 8] {
    Lun::new(target, lun).expect("a single-level LUN").encode()
}

/// A submitted command: where its response and data-in go.
pub struct Pending {
    pub head: u16,
    pub resp: u64,
    pub data_in: u64,
}

/// Builds and submits a command (request header, optional data-out,
/// response, optional data-in), without kicking.
pub fn submit(
    vq: &mut Vq,
    g: &mut Guest,
    lun: [u8; 8],
    cdb: &[u8],
    data_out: &[u8],
    data_in_len: u32,
) -> Pending {
    let req = g.alloc(REQ_LEN);
    let mut hdr = vec![0u8; REQ_LEN as usize];
    let cdb_size = REQ_LEN as usize - scsi::CMD_REQ_FIXED;
    match Lun::decode(&lun) {
        Some(l) => {
            scsi::encode_cmd_req(&mut hdr, l, 7, TaskAttr::Simple, cdb, cdb_size);
        }
        // A malformed LUN field, sent as it is.
        None => {
            scsi::encode_cmd_req(
                &mut hdr,
                Lun::new(0, 0).unwrap(),
                7,
                TaskAttr::Simple,
                cdb,
                cdb_size,
            );
            hdr[..8].copy_from_slice(&lun);
        }
    }
    g.write(req, &hdr);
    let mut bufs = vec![(req, REQ_LEN, false)];
    if !data_out.is_empty() {
        let out = g.alloc(data_out.len() as u32);
        g.write(out, data_out);
        bufs.push((out, data_out.len() as u32, false));
    }
    let resp = g.alloc(RESP_LEN);
    bufs.push((resp, RESP_LEN, true));
    let data_in = if data_in_len > 0 {
        let d = g.alloc(data_in_len);
        bufs.push((d, data_in_len, true));
        d
    } else {
        0
    };
    let head = vq.add(g, &bufs);
    Pending {
        head,
        resp,
        data_in,
    }
}

pub fn read_resp(g: &Guest, at: u64) -> Resp {
    let b = g.read(at, RESP_LEN as usize);
    let r = CmdResp::parse(&b).expect("a whole response");
    let sense = &b[scsi::CMD_RESP_FIXED..];
    Resp {
        sense_len: r.sense_len,
        resid: r.resid,
        status: r.status,
        response: r.response.to_byte(),
        sense: sense[..r.sense_len as usize].to_vec(),
    }
}

/// Submits one command, kicks, waits for it; returns the response and the
/// data-in bytes.
pub fn command(
    vq: &mut Vq,
    g: &mut Guest,
    lun: [u8; 8],
    cdb: &[u8],
    data_out: &[u8],
    data_in_len: u32,
) -> (Resp, Vec<u8>) {
    let p = submit(vq, g, lun, cdb, data_out, data_in_len);
    vq.kick(g);
    let (head, _len) = vq.wait_used(g);
    assert_eq!(head, p.head, "completions come back in order here");
    let data = if data_in_len > 0 {
        g.read(p.data_in, data_in_len as usize)
    } else {
        Vec::new()
    };
    (read_resp(g, p.resp), data)
}

pub fn read10(lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = 0x28;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

pub fn write10(lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = read10(lba, blocks);
    c[0] = 0x2a;
    c
}

pub const TEST_UNIT_READY: [u8; 6] = [0; 6];

pub fn inquiry(alloc: u16) -> [u8; 6] {
    let [hi, lo] = alloc.to_be_bytes();
    [0x12, 0, 0, hi, lo, 0]
}

pub fn vqs() -> Vec<Vq> {
    (0..4).map(Vq::new).collect()
}

/// The first command of a new I_T nexus reports the power-on unit
/// attention; clear it.
pub fn clear_unit_attention(vq: &mut Vq, g: &mut Guest, lun: u16) {
    let (r, _) = command(vq, g, lun_field(0, lun), &TEST_UNIT_READY, &[], 0);
    assert_eq!(r.response, 0);
    if r.status == 2 {
        assert_eq!(r.sense_key(), 6, "UNIT ATTENTION expected, got {r:?}");
        let (r, _) = command(vq, g, lun_field(0, lun), &TEST_UNIT_READY, &[], 0);
        assert_eq!((r.response, r.status), (0, 0), "{r:?}");
    }
}

// ---------------------------------------------------------- doorbells
//
// The driver's side of VIRTIO_F_SQCQ_POLL poked by hand: the doorbells at
// `doorbell_location` (zeroed with the rings by `Vq::setup`), publishing
// through `sq.idx`, raw `sq.idx` values.

/// Feature bit of VIRTIO_F_SQCQ_POLL, for `connect_with`.
pub const SQCQ: u64 = 1 << sqcq_protocol::VIRTIO_F_SQCQ_POLL;

fn load(g: &Guest, at: u64) -> u16 {
    u16::from_le(g.mem.load(GuestAddress(at), Ordering::Acquire).unwrap())
}

fn store(g: &Guest, at: u64, v: u16) {
    g.mem
        .store(v.to_le(), GuestAddress(at), Ordering::Release)
        .unwrap();
}

impl Vq {
    /// Where this queue's doorbells are.
    pub fn doorbells(&self) -> DoorbellLocation {
        doorbell_location(
            RingAddrs {
                desc: self.desc,
                avail: self.avail,
                used: self.used,
            },
            self.size,
        )
        .unwrap()
    }

    /// The SQ doorbell's flags (written by the device's poller).
    pub fn sq_flags(&self, g: &Guest) -> u16 {
        load(g, self.doorbells().sq + 2)
    }

    /// The CQ doorbell's index (written by the device).
    pub fn cq_idx(&self, g: &Guest) -> u16 {
        load(g, self.doorbells().cq)
    }

    /// Writes the raw SQ doorbell index (for hostile values).
    pub fn write_sq_idx(&self, g: &Guest, idx: u16) {
        store(g, self.doorbells().sq, idx);
        fence(Ordering::SeqCst);
    }

    /// Publishes the avail index and `sq.idx`, then kicks only if the
    /// device's poller set NEED_WAKEUP (fence 1 between). Returns whether
    /// it kicked.
    pub fn publish_sq(&self, g: &Guest) -> bool {
        fence(Ordering::Release);
        store(g, self.avail + 2, self.next_avail);
        store(g, self.doorbells().sq, self.next_avail);
        fence(Ordering::SeqCst);
        let kick = self.sq_flags(g) & NEED_WAKEUP != 0;
        if kick {
            self.kick.write(1).unwrap();
        }
        kick
    }

    /// Whether the error eventfd fired (the device found the queue broken).
    pub fn errored(&self) -> bool {
        self.err.read().is_ok()
    }
}

/// The source of a live migration over a SCSI device at `socket`: a
/// frontend with LOG_SHMFD writes `block` to LBA 0 of LUN 0, then plays
/// the switch-over (a dirty log, VHOST_F_LOG_ALL, GET_VRING_BASE on every
/// vring). The frontend is returned open, as the source QEMU stays until
/// the destination runs.
pub fn write_then_switch_over(socket: &Path, block: &[u8]) -> Frontend {
    let mut g = Guest::new();
    let mut vqs = vqs();
    let fe = connect_full(
        socket,
        &g,
        &mut vqs,
        false,
        (1 << 1) | (1 << 2),
        VhostUserProtocolFeatures::LOG_SHMFD,
        &mut |_| {},
    );
    clear_unit_attention(&mut vqs[2], &mut g, 0);
    let (r, _) = command(
        &mut vqs[2],
        &mut g,
        lun_field(0, 0),
        &write10(0, 1),
        block,
        0,
    );
    assert_eq!(r.status, 0, "the write at the source");
    // SAFETY: a valid NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c"migration-log".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: a new descriptor owned by nobody else.
    let log = unsafe { File::from_raw_fd(fd) };
    log.set_len(4096).unwrap();
    fe.set_log_base(
        0,
        Some(vhost::VhostUserDirtyLogRegion {
            mmap_size: 4096,
            mmap_offset: 0,
            mmap_handle: log.as_raw_fd(),
        }),
    )
    .unwrap();
    let features = (1u64 << 32)
        | (1 << 28)
        | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
        | (1 << 1)
        | (1 << 2);
    fe.set_features(features | VhostUserVirtioFeatures::LOG_ALL.bits())
        .unwrap();
    for index in 0..vqs.len() {
        fe.get_vring_base(index).unwrap();
    }
    fe
}

/// The destination of a live migration: a frontend starts the SCSI
/// device at `socket` and reads LBA 0 of LUN 0; the frontend, its guest
/// and vrings (to go on) and the data read.
pub fn start_and_read_lba0(socket: &Path) -> (Frontend, Guest, Vec<Vq>, Vec<u8>) {
    let mut g = Guest::new();
    g.write(DATA_START, &[0u8; 4096]);
    let mut vqs = vqs();
    let fe = connect(socket, &g, &mut vqs, false);
    clear_unit_attention(&mut vqs[2], &mut g, 0);
    let (r, data) = command(
        &mut vqs[2],
        &mut g,
        lun_field(0, 0),
        &read10(0, 1),
        &[],
        512,
    );
    assert_eq!(r.status, 0, "the read at the destination");
    (fe, g, vqs, data)
}
