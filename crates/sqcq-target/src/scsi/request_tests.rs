//! Request handling against virtio-queue's driver-side mock: chains built
//! in a `GuestMem`, a [`ServedQueue`] processing them, responses
//! checked byte by byte.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqcq_scsi::NexusId;
use virtio_queue::desc::{RawDescriptor, split::Descriptor};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::bitmap::Bitmap;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use crate::runtime::backstore::FIRST_RETRY;
use crate::runtime::backstore::tests::{FlakyBackstore, FlakyQueue};
use crate::runtime::guest::GuestMem;
use crate::runtime::queue::{
    MakeHandler, QueueKey, QueueStart, RingConfig, ServedQueue, SubmissionSource,
};
use crate::scsi::device::ScsiDevice;
use crate::scsi::queue::make_handler;
use crate::transport::device::DeviceShared;

const NEXT: u16 = 1;
pub(crate) const WRITE: u16 = 2;
const REQ: u32 = 51;
const RESP: u32 = 108;
const SIZE: u16 = 16;

pub(crate) struct Fixture {
    pub(crate) mem: GuestMem,
    pub(crate) queue: ServedQueue,
    ring: RingConfig,
    next_desc: u16,
    next_buf: u64,
}

pub(crate) fn device() -> (Arc<DeviceShared>, Arc<ScsiDevice>) {
    crate::fuzzing::device(SIZE)
}

impl Fixture {
    fn new() -> Self {
        Self::with_logging(false)
    }

    /// A fixture whose guest memory logs the pages written while the
    /// queue processes (`logged`).
    fn with_logging(logged: bool) -> Self {
        Self::over(logged, device())
    }

    fn over(logged: bool, (dev, scsi): (Arc<DeviceShared>, Arc<ScsiDevice>)) -> Self {
        // A nexus the unit does not know has no unit attention.
        Self::with_handler(logged, &dev, make_handler(scsi, NexusId(1), 32, 96, 0))
    }

    /// A fixture whose queue `handler` serves, for the device `dev`.
    pub(crate) fn with_handler(logged: bool, dev: &DeviceShared, handler: MakeHandler) -> Self {
        let mem = crate::runtime::guest::memory_over(&[(GuestAddress(0), 0x40_0000)], logged);
        let vq = MockSplitQueue::new(&mem, SIZE);
        let ring = RingConfig {
            size: SIZE,
            desc: vq.desc_table_addr().0,
            avail: vq.avail_addr().0,
            used: vq.used_addr().0,
            next_avail: 0,
            event_idx: false,
            packed: false,
            next_used: 0,
        };
        let queue = ServedQueue::start(QueueStart {
            key: QueueKey { device: 0, vq: 2 },
            device: Arc::clone(&dev.info),
            mem: crate::runtime::shared_memory::SharedMemory::new(mem.clone()),
            ring,
            kick: crate::runtime::eventfd::PeerEventFd::new().unwrap(),
            call: None,
            err: None,
            source: SubmissionSource::Kick,
            spin: sqcq_protocol::SpinPolicy::default(),
            max_in_flight: None,
            handler,
            tracking: None,
        })
        .unwrap();
        Fixture {
            mem,
            queue,
            ring,
            next_desc: 0,
            next_buf: 0x10_0000,
        }
    }

    pub(crate) fn buf(&mut self, data: &[u8], len: u32) -> u64 {
        let at = self.next_buf;
        self.next_buf += u64::from(len).next_multiple_of(0x100);
        let mut v = data.to_vec();
        v.resize(len as usize, 0);
        self.mem.write_slice(&v, GuestAddress(at)).unwrap();
        at
    }

    /// Adds one chain of (addr, len, flags) and processes the queue;
    /// returns the used length. (The mock lays the ring out once, in
    /// `new`: a second `MockSplitQueue` would reset its indices.)
    fn run(&mut self, bufs: &[(u64, u32, u16)]) -> u32 {
        let avail_idx = self.make_available(bufs);
        self.queue.process();
        assert_eq!(self.used_idx(), avail_idx + 1, "the chain completed");
        let elem = self.ring.used + 4 + 8 * u64::from(avail_idx % SIZE);
        self.mem.read_obj(GuestAddress(elem + 4)).unwrap()
    }

    pub(crate) fn used_idx(&self) -> u16 {
        self.mem.read_obj(GuestAddress(self.ring.used + 2)).unwrap()
    }

    /// Adds one chain of (addr, len, flags) to the available ring;
    /// returns the available index before it.
    pub(crate) fn make_available(&mut self, bufs: &[(u64, u32, u16)]) -> u16 {
        let first = self.next_desc;
        for (k, &(addr, len, flags)) in bufs.iter().enumerate() {
            let i = first + k as u16;
            let more = k + 1 < bufs.len();
            let f = flags | if more { NEXT } else { 0 };
            let d =
                RawDescriptor::from(Descriptor::new(addr, len, f, if more { i + 1 } else { 0 }));
            self.mem
                .write_obj(d, GuestAddress(self.ring.desc + 16 * u64::from(i)))
                .unwrap();
        }
        self.next_desc += bufs.len() as u16;
        let avail_idx: u16 = self
            .mem
            .read_obj(GuestAddress(self.ring.avail + 2))
            .unwrap();
        let slot = self.ring.avail + 4 + 2 * u64::from(avail_idx % SIZE);
        self.mem.write_obj(first, GuestAddress(slot)).unwrap();
        self.mem
            .write_obj(avail_idx + 1, GuestAddress(self.ring.avail + 2))
            .unwrap();
        // Only what the device writes from here on is dirty.
        for r in self.mem.iter() {
            // The region's own bitmap (`GuestMemoryRegion::bitmap` gives a
            // slice of it).
            if let Some(b) = std::ops::Deref::deref(r).bitmap() {
                b.log().clear();
            }
        }
        avail_idx
    }

    fn header(&mut self, lun: [u8; 8], cdb: &[u8]) -> u64 {
        let mut h = vec![0u8; REQ as usize];
        h[0..8].copy_from_slice(&lun);
        h[19..19 + cdb.len()].copy_from_slice(cdb);
        self.buf(&h, REQ)
    }

    fn resp(&self, at: u64) -> (u32, u32, u8, u8, Vec<u8>) {
        let mut b = [0u8; RESP as usize];
        self.mem.read_slice(&mut b, GuestAddress(at)).unwrap();
        let sense_len = u32::from_le_bytes(b[0..4].try_into().unwrap());
        let resid = u32::from_le_bytes(b[4..8].try_into().unwrap());
        (
            sense_len,
            resid,
            b[10],
            b[11],
            b[12..12 + sense_len as usize].to_vec(),
        )
    }
}

const LUN0: [u8; 8] = [1, 0, 0x40, 0, 0, 0, 0, 0];

#[test]
fn good_inquiry_with_residual() {
    let mut f = Fixture::new();
    let req = f.header(LUN0, &[0x12, 0, 0, 0, 96, 0]);
    let resp = f.buf(&[], RESP);
    let data = f.buf(&[], 200);
    let len = f.run(&[(req, REQ, 0), (resp, RESP, WRITE), (data, 200, WRITE)]);
    let (sense_len, resid, status, response, _) = f.resp(resp);
    assert_eq!((sense_len, status, response), (0, 0, 0));
    let mut head = [0u8; 12];
    f.mem.read_slice(&mut head, GuestAddress(data)).unwrap();
    assert_eq!(&head[8..12], b"SQCQ");
    // ADDITIONAL LENGTH + 5 bytes were sent, no more than the 96 asked for.
    let sent = (u32::from(head[4]) + 5).min(96);
    assert_eq!(resid, 200 - sent);
    assert_eq!(len, RESP + sent);
}

#[test]
fn header_split_over_descriptors() {
    let mut f = Fixture::new();
    let req = f.header(LUN0, &[0, 0, 0, 0, 0, 0]);
    let resp = f.buf(&[], RESP);
    f.run(&[
        (req, 10, 0),
        (req + 10, REQ - 10, 0),
        (resp, 20, WRITE),
        (resp + 20, RESP - 20, WRITE),
    ]);
    assert_eq!(f.resp(resp).3, 0, "TEST UNIT READY through a split header");
}

#[test]
fn short_header_and_wrong_direction_fail() {
    let mut f = Fixture::new();
    let req = f.header(LUN0, &[0; 6]);
    let resp = f.buf(&[], RESP);
    f.run(&[(req, 18, 0), (resp, RESP, WRITE)]);
    assert_eq!(f.resp(resp).3, 9, "VIRTIO_SCSI_S_FAILURE");
    let resp = f.buf(&[], RESP);
    f.run(&[(resp, RESP, WRITE), (req, REQ, 0)]);
    assert_eq!(f.resp(resp).3, 9);
    let c = &f.queue.ring().device().metrics;
    assert_eq!(
        c.short_headers.load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(c.wrong_order.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[test]
fn read_overrun_and_residual() {
    let mut f = Fixture::new();
    let read10 = [0x28, 0, 0, 0, 0, 0, 0, 0, 2, 0];
    let req = f.header(LUN0, &read10);
    let resp = f.buf(&[], RESP);
    let data = f.buf(&[], 512);
    f.run(&[(req, REQ, 0), (resp, RESP, WRITE), (data, 512, WRITE)]);
    let (_, resid, _, response, _) = f.resp(resp);
    assert_eq!((response, resid), (1, 512), "OVERRUN: 1024 bytes into 512");
    let resp = f.buf(&[], RESP);
    let data = f.buf(&[], 1536);
    let len = f.run(&[(req, REQ, 0), (resp, RESP, WRITE), (data, 1536, WRITE)]);
    let (_, resid, status, response, _) = f.resp(resp);
    assert_eq!((response, status, resid), (0, 0, 512));
    assert_eq!(len, RESP + 1024);
}

#[test]
fn unknown_target_and_lun() {
    let mut f = Fixture::new();
    let req = f.header([1, 1, 0x40, 0, 0, 0, 0, 0], &[0; 6]);
    let resp = f.buf(&[], RESP);
    f.run(&[(req, REQ, 0), (resp, RESP, WRITE)]);
    assert_eq!(f.resp(resp).3, 3, "VIRTIO_SCSI_S_BAD_TARGET");

    let req = f.header([1, 0, 0x40, 5, 0, 0, 0, 0], &[0; 6]);
    let resp = f.buf(&[], RESP);
    f.run(&[(req, REQ, 0), (resp, RESP, WRITE)]);
    let (sense_len, _, status, response, sense) = f.resp(resp);
    assert_eq!((response, status), (0, 2), "CHECK CONDITION");
    assert_eq!(sense_len, 18);
    // Fixed format, ILLEGAL REQUEST, LOGICAL UNIT NOT SUPPORTED (25h/00h).
    assert_eq!(sense[0] & 0x7f, 0x70);
    assert_eq!(sense[2] & 0x0f, 0x05);
    assert_eq!((sense[12], sense[13]), (0x25, 0x00));
}

#[test]
fn write_then_read_through_the_ram_backstore() {
    let mut f = Fixture::new();
    let data: Vec<u8> = (0..512u32).map(|i| (i % 256) as u8).collect();
    let write10 = [0x2a, 0, 0, 0, 0, 3, 0, 0, 1, 0];
    let req = f.header(LUN0, &write10);
    let out = f.buf(&data, 512);
    let resp = f.buf(&[], RESP);
    f.run(&[(req, REQ, 0), (out, 512, 0), (resp, RESP, WRITE)]);
    assert_eq!(f.resp(resp).2, 0);
    let read10 = [0x28, 0, 0, 0, 0, 3, 0, 0, 1, 0];
    let req = f.header(LUN0, &read10);
    let resp = f.buf(&[], RESP);
    let back = f.buf(&[], 512);
    f.run(&[(req, REQ, 0), (resp, RESP, WRITE), (back, 512, WRITE)]);
    let mut got = vec![0u8; 512];
    f.mem.read_slice(&mut got, GuestAddress(back)).unwrap();
    assert_eq!(got, data);
}

#[test]
fn with_dirty_logging_every_page_the_device_writes_is_marked() {
    let mut f = Fixture::with_logging(true);
    let dirty = |f: &Fixture, gpa: u64| {
        let r = f.mem.find_region(GuestAddress(gpa)).unwrap();
        let offset = usize::try_from(gpa - r.start_addr().0).unwrap();
        r.bitmap().dirty_at(offset)
    };
    // Header, response and an untouched page each on a page of their
    // own; the data buffer straddles two pages.
    let read10 = [0x28, 0, 0, 0, 0, 0, 0, 0, 2, 0];
    f.next_buf = 0x10_0000;
    let req = f.header(LUN0, &read10);
    f.next_buf = 0x10_1000;
    let resp = f.buf(&[], RESP);
    f.next_buf = 0x10_2e00;
    let data = f.buf(&[], 1024);
    let untouched = 0x10_5000;
    let len = f.run(&[(req, REQ, 0), (resp, RESP, WRITE), (data, 1024, WRITE)]);
    assert_eq!(len, RESP + 1024, "the read completed");
    // Data the backstore wrote through iovecs, out of vm-memory's sight.
    assert!(dirty(&f, data), "first data page");
    assert!(dirty(&f, data + 1023), "second data page");
    // The response (vm-memory copy) and the used ring (virtio-queue).
    assert!(dirty(&f, resp), "response page");
    assert!(dirty(&f, f.ring.used), "used ring page");
    // What the device only read, and what nobody touched.
    assert!(!dirty(&f, req), "the request header is only read");
    assert!(!dirty(&f, untouched));
}

/// A fixture over a backstore whose first `failures` commits fail with
/// `errno`.
fn flaky(failures: u32, errno: i32) -> (Fixture, Arc<Mutex<FlakyQueue>>) {
    let io = Arc::new(Mutex::new(FlakyQueue::failing(failures, errno)));
    let backstore = Arc::new(FlakyBackstore(Arc::clone(&io)));
    let f = Fixture::over(false, crate::fuzzing::device_over(SIZE, backstore));
    (f, io)
}

const WRITE10: [u8; 10] = [0x2a, 0, 0, 0, 0, 3, 0, 0, 1, 0];

#[test]
fn a_refused_commit_is_retried_after_a_wait_and_the_request_sent_once() {
    let (mut f, io) = flaky(3, libc::EAGAIN);
    let req = f.header(LUN0, &WRITE10);
    let out = f.buf(&[7; 512], 512);
    let resp = f.buf(&[], RESP);
    let avail = f.make_available(&[(req, REQ, 0), (out, 512, 0), (resp, RESP, WRITE)]);
    let mut refused_at = Instant::now();
    f.queue.process();
    let mut passes = 0;
    while f.used_idx() == avail {
        // What the worker would sleep at most before its next pass.
        let wait = f.queue.poll_timeout().expect("a retry is scheduled");
        assert!(
            wait > Duration::ZERO || refused_at.elapsed() >= FIRST_RETRY,
            "the worker sleeps between attempts instead of spinning"
        );
        std::thread::sleep(wait);
        refused_at = Instant::now();
        f.queue.pass();
        passes += 1;
        assert!(passes < 100, "sent in the end");
    }
    assert_eq!(f.resp(resp).2, 0, "GOOD");
    let io = io.lock().unwrap();
    assert_eq!(io.commits, 4, "three refusals, then sent");
    assert_eq!(io.sent.len(), 1, "sent once");
    assert!(io.withdrawn.is_empty(), "nothing failed");
    assert_eq!(f.queue.poll_timeout(), None, "nothing left to retry");
}

#[test]
fn a_commit_refused_for_good_fails_each_request_once_with_a_write_error() {
    let (mut f, io) = flaky(u32::MAX, libc::EINVAL);
    let req = f.header(LUN0, &WRITE10);
    let out = f.buf(&[7; 512], 512);
    let resp = f.buf(&[], RESP);
    let avail = f.make_available(&[(req, REQ, 0), (out, 512, 0), (resp, RESP, WRITE)]);
    f.queue.process();
    assert_eq!(f.used_idx(), avail + 1, "completed, not left hanging");
    let (_, _, status, response, sense) = f.resp(resp);
    assert_eq!((response, status), (0, 2), "CHECK CONDITION");
    // MEDIUM ERROR, WRITE ERROR (0Ch/00h): a backstore write failure.
    assert_eq!((sense[2] & 0x0f, sense[12], sense[13]), (0x03, 0x0c, 0x00));
    f.queue.pass();
    assert_eq!(f.used_idx(), avail + 1, "completed once");
    assert_eq!(f.queue.poll_timeout(), None, "nothing left to retry");
    let errors = &f.queue.ring().device().metrics.io_errors;
    assert_eq!(
        errors.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "counted"
    );
    let io = io.lock().unwrap();
    assert_eq!((io.commits, io.withdrawn.len()), (1, 1));
    assert!(io.sent.is_empty());
}
