//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`; not
//! part of the daemon's API).
//!
//! - [`MessageHarness`]: one vhost-user connection handled by the real
//!   [`Session`] through `vhost`'s `BackendReqHandler` over a socket pair,
//!   fed arbitrary messages and descriptors (memfds, eventfds, pipes), with
//!   a worker pool behind it so that queues really start and stop.
//! - [`ChainHarness`]: a request queue ([`ServedQueue`]) over real guest
//!   memory whose descriptor table, available ring and buffers are
//!   arbitrary bytes; the queue processes them as a worker would.

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, OnceLock};

use sqcq_backstore::RamBackstore;
use sqcq_scsi::{LogicalUnit, LuConfig, NexusId};
use vhost::vhost_user::{BackendReqHandler, Error as VhostError};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use crate::blk::device::BlkDevice;
use crate::config::PollOptions;
use crate::config::QueueMap;
use crate::runtime::eventfd::PeerEventFd;
use crate::runtime::guest::GuestMem;
use crate::runtime::metrics::DeviceMetrics;
use crate::runtime::queue::{
    DeviceInfo, QueueKey, QueueStart, RingConfig, ServedQueue, SubmissionSource,
};
use crate::runtime::ratelimit::RateLimiter;
use crate::runtime::worker::WorkerPool;
use crate::scsi::device::ScsiDevice;
use crate::scsi::queue::make_handler;
use crate::scsi::target::{LunEntry, Target};
use crate::transport::device::{DeviceParams, DeviceShared};
use crate::transport::device_type::VirtioDevice;
use crate::transport::session::Session;

const QUEUE_SIZE: u16 = 64;

/// A SCSI device with one 1 MiB RAM LUN of 512-byte blocks, as the
/// transport and the runtime see it, for tests and fuzzing.
pub(crate) fn device(queue_size: u16) -> (Arc<DeviceShared>, Arc<ScsiDevice>) {
    let backstore = Arc::new(RamBackstore::new(1 << 20, 512).expect("RAM backstore"));
    device_over(queue_size, backstore)
}

/// The device of [`device`] over another 1 MiB backstore of 512-byte
/// blocks.
pub(crate) fn device_over(
    queue_size: u16,
    backstore: Arc<dyn sqcq_backstore::Backstore>,
) -> (Arc<DeviceShared>, Arc<ScsiDevice>) {
    let unit = LogicalUnit::new(LuConfig::new(512, 2048, 0x5001_4050_0000_0001)).expect("LU");
    let scsi = Arc::new(
        ScsiDevice::new(Target::from_entries(vec![LunEntry {
            lun: 0,
            unit: Arc::new(unit),
            backstore,
            stats: Arc::default(),
            qos: Arc::default(),
        }]))
        .expect("device"),
    );
    let shared = Arc::new(DeviceShared {
        info: Arc::new(DeviceInfo {
            id: 0,
            name: "fuzz".into(),
            metrics: Arc::new(DeviceMetrics::new(0, 4)),
            // Quiet: fuzzing produces nothing but guest-triggered warnings.
            limiter: RateLimiter::new(0),
            backstore_limiter: RateLimiter::new(0),
            events: Arc::default(),
            qos: Default::default(),
        }),
        params: DeviceParams {
            num_queues: 2,
            queue_size,
            queue_map: QueueMap::default(),
            qos: Default::default(),
        },
        device: Arc::clone(&scsi) as Arc<dyn VirtioDevice>,
        memory_fault: EventFd::new(libc::EFD_NONBLOCK).expect("eventfd"),
        placement: crate::runtime::placement::QueuePlacement::new(2, &QueueMap::default()),
        connected: std::sync::atomic::AtomicBool::new(false),
    });
    (shared, scsi)
}

/// One worker pool for the whole fuzzing process.
fn pool() -> Arc<WorkerPool> {
    static POOL: OnceLock<Arc<WorkerPool>> = OnceLock::new();
    Arc::clone(POOL.get_or_init(|| {
        let options = PollOptions {
            stats_interval: None,
            ..PollOptions::default()
        };
        Arc::new(WorkerPool::new(1, options).expect("worker pool"))
    }))
}

/// Descriptors a fuzz input can attach to a message.
fn attachment(kind: u8) -> Vec<OwnedFd> {
    let memfd = |len: i64| {
        // SAFETY: a valid NUL-terminated name.
        let fd = unsafe { libc::memfd_create(c"fuzz".as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: a new descriptor owned by nobody else, or -1 (skipped).
        (fd >= 0)
            .then(|| unsafe { OwnedFd::from_raw_fd(fd) })
            .inspect(|f| {
                // SAFETY: ftruncate on a descriptor we own.
                unsafe { libc::ftruncate(f.as_raw_fd(), len) };
            })
    };
    let eventfd = || {
        // SAFETY: eventfd takes no pointer.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        // SAFETY: as above.
        (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
    };
    let pipe = || {
        let mut fds = [0; 2];
        // SAFETY: a valid array of two ints.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return None;
        }
        // SAFETY: the write end is ours; closing it leaves the read end
        // hung up.
        drop(unsafe { OwnedFd::from_raw_fd(fds[1]) });
        // SAFETY: the read end is ours.
        Some(unsafe { OwnedFd::from_raw_fd(fds[0]) })
    };
    match kind % 6 {
        1 => memfd(64 << 10).into_iter().collect(),
        2 => eventfd().into_iter().collect(),
        3 => pipe().into_iter().collect(),
        4 => [memfd(64 << 10), memfd(4096)]
            .into_iter()
            .flatten()
            .collect(),
        5 => memfd(0).into_iter().collect(),
        _ => Vec::new(),
    }
}

/// A vhost-user connection fed from fuzz input.
pub struct MessageHarness {
    client: UnixStream,
    handler: BackendReqHandler<Mutex<Session>>,
    session: Arc<Mutex<Session>>,
}

impl std::fmt::Debug for MessageHarness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessageHarness").finish_non_exhaustive()
    }
}

impl MessageHarness {
    /// A fresh connection (a new I_T nexus) to a fresh device.
    pub fn new() -> Self {
        let (client, server) = UnixStream::pair().expect("socket pair");
        client.set_nonblocking(true).expect("non-blocking");
        let session = Session::new(device(QUEUE_SIZE).0, pool()).expect("session");
        let session = Arc::new(Mutex::new(session));
        let handler = BackendReqHandler::from_stream(server, Arc::clone(&session));
        MessageHarness {
            client,
            handler,
            session,
        }
    }

    /// Runs the messages of `data`, each
    /// `[code: u8][flags: u8][attachment: u8][len: u8][body: len]`, until
    /// the input ends or the connection would be dropped; then tears the
    /// connection down as the control thread does.
    pub fn run(mut self, data: &[u8]) {
        let mut rest = data;
        while let [code, flags, fds, len, tail @ ..] = rest {
            let len = usize::from(*len).min(tail.len());
            let (body, next) = tail.split_at(len);
            rest = next;
            // Mostly valid headers (version 1, maybe NEED_REPLY), some raw.
            let flags = if flags & 0x80 != 0 {
                u32::from(*flags) << 1
            } else {
                0x1 | u32::from(flags & 0x8)
            };
            let mut msg = u32::from(*code % 48).to_le_bytes().to_vec();
            msg.extend_from_slice(&flags.to_le_bytes());
            msg.extend_from_slice(&u32::try_from(body.len()).unwrap_or(0).to_le_bytes());
            msg.extend_from_slice(body);
            let files = attachment(*fds);
            let raw: Vec<RawFd> = files.iter().map(AsRawFd::as_raw_fd).collect();
            if self.client.send_with_fds(&[&msg[..]], &raw).is_err() {
                break;
            }
            drop(files);
            let result = self.handler.handle_request();
            self.drain_replies();
            match result {
                Ok(()) => {}
                Err(
                    VhostError::Disconnected
                    | VhostError::PartialMessage
                    | VhostError::SocketBroken(_)
                    | VhostError::SocketError(_)
                    | VhostError::InvalidMessage
                    | VhostError::OversizedMsg,
                ) => break,
                Err(_) => {}
            }
        }
        let mut s = self
            .session
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        drop(s.teardown());
    }

    fn drain_replies(&mut self) {
        let mut buf = [0u8; 4096];
        while matches!(self.client.read(&mut buf), Ok(n) if n > 0) {}
    }
}

impl Default for MessageHarness {
    fn default() -> Self {
        Self::new()
    }
}

/// Guest memory size of [`ChainHarness`].
pub const CHAIN_MEM: u64 = 1 << 20;
const CHAIN_MEM_BYTES: usize = 1 << 20;
const DESC: u64 = 0;
const AVAIL: u64 = 0x1000;
const USED: u64 = 0x2000;
const DATA: u64 = 0x4000;

/// The device type whose request handler a [`ChainHarness`] drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainDevice {
    /// virtio-scsi, one 1 MiB RAM LUN.
    Scsi,
    /// virtio-blk, a 1 MiB RAM disk.
    Blk,
}

/// A request queue over guest memory filled from fuzz input.
#[derive(Debug)]
pub struct ChainHarness {
    mem: GuestMem,
    queue: ServedQueue,
    size: u16,
    /// The avail index published so far.
    avail_idx: u16,
    /// Chains made available and completed so far.
    published: u64,
    completed: u64,
    last_used: u16,
}

impl ChainHarness {
    /// A queue of `2^size_log2` (1..=64) descriptors, with EVENT_IDX as
    /// asked.
    pub fn new(size_log2: u8, event_idx: bool) -> Self {
        Self::with_device(size_log2, event_idx, ChainDevice::Scsi)
    }

    /// As [`Self::new`], for a request queue of device type `kind`.
    pub fn with_device(size_log2: u8, event_idx: bool, kind: ChainDevice) -> Self {
        Self::with_layout(1u16 << (size_log2 % 7), event_idx, kind, false)
    }

    /// A packed ring of `size % 64 + 1` descriptors (any size, powers of
    /// two or not), its descriptor ring at the split table's place, its
    /// driver and device areas at the avail and used rings' (see
    /// [`Self::run_packed`]).
    pub fn packed(size: u8, event_idx: bool, kind: ChainDevice) -> Self {
        Self::with_layout(u16::from(size % 64) + 1, event_idx, kind, true)
    }

    fn with_layout(size: u16, event_idx: bool, kind: ChainDevice, packed: bool) -> Self {
        let mem = crate::runtime::guest::test_memory(&[(GuestAddress(0), CHAIN_MEM_BYTES)]);
        let (dev, scsi) = device(size.max(4));
        let handler = match kind {
            ChainDevice::Scsi => make_handler(scsi, NexusId(1), 32, 96, 0),
            ChainDevice::Blk => {
                let disk = Arc::new(RamBackstore::new(1 << 20, 512).expect("RAM backstore"));
                let blk = Arc::new(BlkDevice::new(disk, "fuzz".into(), false).expect("blk device"));
                blk.connect(Arc::clone(&dev.info), &dev.params)
                    .expect("blk session")
                    .request_handler()
            }
        };
        let ring = RingConfig {
            size,
            desc: DESC,
            avail: AVAIL,
            used: USED,
            event_idx,
            packed,
            // Both start at offset 0 with the wrap counter set.
            next_avail: if packed { 0x8000 } else { 0 },
            next_used: if packed { 0x8000 } else { 0 },
        };
        let queue = ServedQueue::start(QueueStart {
            key: QueueKey { device: 0, vq: 2 },
            device: Arc::clone(&dev.info),
            mem: crate::runtime::shared_memory::SharedMemory::new(mem.clone()),
            ring,
            kick: PeerEventFd::new().expect("eventfd"),
            call: None,
            err: None,
            source: SubmissionSource::Kick,
            spin: sqcq_protocol::SpinPolicy::default(),
            max_in_flight: None,
            handler,
            tracking: None,
        })
        .expect("queue");
        ChainHarness {
            mem,
            queue,
            size,
            avail_idx: 0,
            published: 0,
            completed: 0,
            last_used: 0,
        }
    }

    /// Writes `data` as `[avail count: u8][descriptor table][avail
    /// entries][buffer bytes]`, publishes the avail index and lets the
    /// queue process it; checks that the used ring only ever holds heads
    /// of this queue and never runs ahead of the avail ring. Descriptor
    /// addresses with the top bit clear are folded into guest memory (so
    /// that most chains reach the SCSI layer), the others stay as they are.
    pub fn run(&mut self, data: &[u8]) {
        let Some((&count, rest)) = data.split_first() else {
            return;
        };
        let table_len = 16 * usize::from(self.size);
        let (table, rest) = rest.split_at(table_len.min(rest.len()));
        let mut table = table.to_vec();
        for d in table.chunks_exact_mut(16) {
            let addr = u64::from_le_bytes(d[..8].try_into().unwrap_or_default());
            if addr >> 63 == 0 {
                let folded = DATA + addr % (CHAIN_MEM - DATA);
                d[..8].copy_from_slice(&folded.to_le_bytes());
            }
        }
        let _ = self.mem.write_slice(&table, GuestAddress(DESC));
        let count = u16::from(count) % (2 * self.size + 1);
        let entries = (2 * usize::from(count)).min(rest.len());
        let (avail, buffers) = rest.split_at(entries);
        for (i, e) in avail.chunks_exact(2).enumerate() {
            let idx = self.avail_idx.wrapping_add(u16::try_from(i).unwrap_or(0));
            let slot = AVAIL + 4 + 2 * u64::from(idx % self.size);
            let _ = self.mem.write_slice(e, GuestAddress(slot));
        }
        let room = usize::try_from(CHAIN_MEM - DATA).unwrap_or(0);
        let n = buffers.len().min(room);
        let _ = self.mem.write_slice(&buffers[..n], GuestAddress(DATA));
        let added = u16::try_from(avail.len() / 2).unwrap_or(0);
        self.avail_idx = self.avail_idx.wrapping_add(added);
        self.published += u64::from(added);
        let _ = self
            .mem
            .write_obj(self.avail_idx.to_le(), GuestAddress(AVAIL + 2));
        self.queue.process();
        for _ in 0..4 {
            self.queue.pass();
        }
        let used = u16::from_le(self.mem.read_obj(GuestAddress(USED + 2)).unwrap_or(0));
        let new = used.wrapping_sub(self.last_used);
        self.completed += u64::from(new);
        self.last_used = used;
        assert!(
            self.completed <= self.published,
            "more completions than requests"
        );
        for i in 0..self.size {
            let id: u32 = self
                .mem
                .read_obj(GuestAddress(USED + 4 + 8 * u64::from(i)))
                .unwrap_or(0);
            assert!(id < u32::from(self.size), "used id {id} is not a head");
        }
    }

    /// Requests made available and completed so far (split rings).
    pub fn counts(&self) -> (u64, u64) {
        (self.published, self.completed)
    }

    /// A pass over a packed ring (a harness from [`Self::packed`]):
    /// writes `data` as `[descriptor ring][buffer bytes]`, with addresses
    /// folded as in [`Self::run`] and every flag as the input has it (so
    /// that any descriptor may look available, on either lap, chained or
    /// not), and lets the queue process it. Checks that the device's
    /// next used position never passes its next available one.
    pub fn run_packed(&mut self, data: &[u8]) {
        let ring_len = 16 * usize::from(self.size);
        let (ring, buffers) = data.split_at(ring_len.min(data.len()));
        let mut ring = ring.to_vec();
        for d in ring.chunks_exact_mut(16) {
            let addr = u64::from_le_bytes(d[..8].try_into().unwrap_or_default());
            if addr >> 63 == 0 {
                let folded = DATA + addr % (CHAIN_MEM - DATA);
                d[..8].copy_from_slice(&folded.to_le_bytes());
            }
        }
        let _ = self.mem.write_slice(&ring, GuestAddress(DESC));
        let room = usize::try_from(CHAIN_MEM - DATA).unwrap_or(0);
        let n = buffers.len().min(room);
        let _ = self.mem.write_slice(&buffers[..n], GuestAddress(DATA));
        self.queue.process();
        for _ in 0..4 {
            self.queue.pass();
        }
        // Descriptors the device wrote cannot be told apart from data it
        // wrote into buffers the input laid over the ring, so the check is
        // on the device's own positions: it never writes more used
        // descriptors than it took.
        let base = self.queue.ring().base();
        let (avail, used) = crate::runtime::packed::decode_base(base, self.size)
            .expect("positions inside the ring");
        assert!(
            used.ahead(avail, self.size) <= u32::from(self.size),
            "used {used:?} ahead of avail {avail:?}"
        );
    }
}

/// An in-flight record (`runtime::tracking`) whose area holds arbitrary
/// bytes, as a frontend may hand back: recovered, driven through `ops`
/// (take, complete, publish), recovered again. Panics if what comes back
/// breaks a promise: a head beyond the ring, a head twice, or a resumed
/// available index other than the used index plus the heads.
///
/// Input: `[queue_size_log2][ring_log2][used_idx: u16 le][ops_len: u8]
/// [ops..][area bytes..]`; an op is `[kind: u8][head: u8]`.
pub fn inflight_record(data: &[u8]) {
    use crate::runtime::tracking::{Recovery, queue_region_size};
    let [qs_log2, ring_log2, u0, u1, ops_len, rest @ ..] = data else {
        return;
    };
    let queue_size = 1u16 << (qs_log2 % 9);
    let ring_size = 1u16 << (ring_log2 % 9);
    let mut used = u16::from_le_bytes([*u0, *u1]);
    let (ops, bytes) = rest.split_at(usize::from(*ops_len).min(rest.len()) & !1);
    let len = queue_region_size(queue_size);
    let Some(area) = area_of(bytes, len, queue_size) else {
        return;
    };
    let check = |r: Recovery, used: u16| {
        if let Recovery::Resumed {
            heads, next_avail, ..
        } = r
        {
            let mut seen = std::collections::HashSet::new();
            for &h in &heads {
                assert!(h < ring_size, "head {h} beyond the ring");
                assert!(seen.insert(h), "head {h} twice");
            }
            let n = u16::try_from(heads.len()).expect("at most a ring's worth");
            assert_eq!(next_avail, used.wrapping_add(n));
        }
    };
    let Some(mut q) = area.queue(0, ring_size) else {
        return;
    };
    check(q.recover(used), used);
    let mut batch = 0u16;
    for op in ops.chunks_exact(2) {
        let head = u16::from(op[1]);
        match op[0] % 3 {
            0 => {
                q.taken(head);
            }
            1 => {
                q.completed(head);
                batch = batch.wrapping_add(1);
            }
            _ => {
                used = used.wrapping_add(batch);
                q.published(batch, used);
                batch = 0;
            }
        }
    }
    if let Some(mut again) = area.queue(0, ring_size) {
        check(again.recover(used), used);
    }
}

/// An in-flight area of `len` bytes for one queue of `queue_size`
/// entries holding `bytes` (zeros after them), in memory of its own.
fn area_of(
    bytes: &[u8],
    len: usize,
    queue_size: u16,
) -> Option<Arc<crate::runtime::tracking::InflightArea>> {
    let mut padded = bytes.iter().copied().take(len).collect::<Vec<u8>>();
    padded.resize(len, 0);
    let mut words: Box<[u64]> = padded
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    let ptr = std::ptr::NonNull::new(words.as_mut_ptr().cast::<u8>()).expect("a live allocation");
    // SAFETY: `words` lives (moved into the keeper) as long as the area.
    let area = unsafe {
        crate::runtime::tracking::InflightArea::new(ptr, len, 1, queue_size, Box::new(words))
    };
    area.ok().map(Arc::new)
}

/// [`inflight_record`] for a packed ring's record
/// (`runtime::tracking::packed`): arbitrary bytes in the area, recovered
/// (with an arbitrary answer to "is the descriptor at the old used
/// position still available"), driven through `ops` (take a list,
/// complete, publish), recovered again. Panics if what comes back breaks
/// a promise: a buffer ID beyond the ring or twice, an empty list, more
/// descriptors than the ring holds, or a next available position other
/// than the used one plus the descriptors in flight.
///
/// Input: `[queue_size: u8][ring_size: u8][used: u16 le][flags: u8]
/// [ops_len: u8][ops..][area bytes..]`; an op is `[kind: u8][id: u8]
/// [descriptors: u8]`.
pub fn packed_inflight_record(data: &[u8]) {
    use crate::runtime::packed::Position;
    use crate::runtime::tracking::{InflightArea, PackedRecovery, RawDesc};
    let [qs, rs, u0, u1, flags, ops_len, rest @ ..] = data else {
        return;
    };
    let queue_size = u16::from(*qs % 64) + 1;
    let ring_size = u16::from(*rs % 64) + 1;
    let Some(start) = Position::decode(u16::from_le_bytes([*u0, *u1]), ring_size) else {
        return;
    };
    let (ops, bytes) = rest.split_at((usize::from(*ops_len) * 3).min(rest.len()));
    let len = InflightArea::size_for(1, queue_size, true);
    let Some(area) = area_of(bytes, len, queue_size) else {
        return;
    };
    // Lists in flight, as the record should give them back: ID and
    // length.
    let check = |r: PackedRecovery| -> Option<Position> {
        let PackedRecovery::Resumed {
            lists, avail, used, ..
        } = r
        else {
            return None;
        };
        let mut seen = std::collections::HashSet::new();
        let mut total = 0u32;
        for l in &lists {
            assert!(l.id < ring_size, "ID {} beyond the ring", l.id);
            assert!(seen.insert(l.id), "ID {} twice", l.id);
            assert!(!l.descs.is_empty(), "an empty list");
            total += u32::try_from(l.descs.len()).expect("small");
        }
        assert!(
            total <= u32::from(ring_size),
            "{total} descriptors in flight"
        );
        assert_eq!(
            used.ahead(avail, ring_size),
            total,
            "avail {avail:?} used {used:?}"
        );
        Some(used)
    };
    let Some(mut q) = area.packed_queue(0, ring_size) else {
        return;
    };
    let mut used = check(q.recover(start, |_| flags & 1 != 0)).unwrap_or(start);
    let mut pending = 0u16;
    for op in ops.chunks_exact(3) {
        let id = u16::from(op[1]);
        match op[0] % 3 {
            0 => {
                let n = u16::from(op[2] % 4) + 1;
                let descs: Vec<RawDesc> = (0..n)
                    .map(|k| RawDesc {
                        addr: u64::from(k),
                        len: 1,
                        id,
                        flags: 0,
                    })
                    .collect();
                q.taken(id, &descs);
            }
            1 => {
                q.completed(id);
                pending = pending.saturating_add(u16::from(op[2] % 4) + 1);
            }
            _ => {
                used = used.advance(pending.min(ring_size), ring_size);
                pending = 0;
                q.publishing(used);
                q.published();
            }
        }
    }
    if let Some(mut again) = area.packed_queue(0, ring_size) {
        check(again.recover(used, |_| flags & 2 != 0));
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    #[test]
    fn a_message_sequence_with_memory_and_queues_runs() {
        // SET_OWNER, GET_FEATURES, SET_FEATURES(VERSION_1), SET_MEM_TABLE
        // with a memfd, then garbage: no panic, clean teardown.
        let mut data = vec![3, 8, 0, 0, 1, 8, 0, 0];
        data.extend_from_slice(&[2, 8, 0, 8]);
        data.extend_from_slice(&(1u64 << 32).to_le_bytes());
        let mut table = vec![1, 0, 0, 0, 0, 0, 0, 0];
        for v in [0u64, 64 << 10, 0x7000_0000, 0] {
            table.extend_from_slice(&v.to_le_bytes());
        }
        data.extend_from_slice(&[5, 8, 1, 40]);
        data.extend_from_slice(&table);
        data.extend_from_slice(&[12, 8, 3, 8, 2, 0, 0, 0, 0, 0, 0, 0]);
        data.extend_from_slice(&[0xff; 32]);
        MessageHarness::new().run(&data);
    }

    #[test]
    fn packed_records_from_bytes_keep_their_promises() {
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..2000 {
            let data: Vec<u8> = (0..600)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Small values mostly: indices and lengths in range.
                    if x.is_multiple_of(4) {
                        x as u8
                    } else {
                        (x % 8) as u8
                    }
                })
                .collect();
            packed_inflight_record(&data);
        }
    }

    #[test]
    fn chains_from_bytes_are_processed() {
        let mut h = ChainHarness::new(4, true);
        let mut data = vec![3u8];
        data.extend((0..16u32 * 16).map(|i| (i * 37 % 251) as u8));
        data.extend_from_slice(&[0, 0, 1, 0, 15, 0]);
        data.extend((0..512u32).map(|i| (i % 7) as u8));
        h.run(&data);
        h.run(&[200, 1, 2, 3]);
    }

    #[test]
    fn a_blk_flush_chain_from_bytes_completes_with_ok() {
        let mut h = ChainHarness::with_device(2, false, ChainDevice::Blk);
        // One chain: a 16-byte header at DATA, the status byte after it.
        let desc = |addr: u64, len: u32, flags: u16, next: u16| {
            let mut d = addr.to_le_bytes().to_vec();
            d.extend_from_slice(&len.to_le_bytes());
            d.extend_from_slice(&flags.to_le_bytes());
            d.extend_from_slice(&next.to_le_bytes());
            d
        };
        let mut data = vec![1u8];
        data.extend(desc(0, 16, 1, 1));
        data.extend(desc(16, 1, 2, 0));
        data.extend(vec![0u8; 16 * 2]);
        data.extend_from_slice(&[0, 0]);
        // VIRTIO_BLK_T_FLUSH (4), then a status byte the device overwrites.
        data.extend_from_slice(&4u32.to_le_bytes());
        data.extend_from_slice(&[0; 12]);
        data.push(0xff);
        h.run(&data);
        assert_eq!(h.completed, 1);
        let status: u8 = h.mem.read_obj(GuestAddress(DATA + 16)).unwrap();
        assert_eq!(status, 0, "VIRTIO_BLK_S_OK");
    }
}
