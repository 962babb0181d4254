//! The virtio-blk request handler against the driver-side mock (the
//! fixture of `scsi::request_tests`): what it does when its backstore
//! refuses to take requests (`runtime::backstore`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress};

use crate::runtime::backstore::FIRST_RETRY;
use crate::runtime::backstore::tests::{FlakyBackstore, FlakyQueue};
use crate::scsi::request_tests::{Fixture, WRITE, device};
use crate::transport::device_type::VirtioDevice;

/// A blk request queue over a backstore whose first `failures` commits
/// fail with `errno` (the SCSI device of the fixture lends its figures).
fn flaky_blk(failures: u32, errno: i32) -> (Fixture, Arc<Mutex<FlakyQueue>>) {
    let io = Arc::new(Mutex::new(FlakyQueue::failing(failures, errno)));
    let backstore = Arc::new(FlakyBackstore(Arc::clone(&io)));
    let (dev, _) = device();
    let blk = Arc::new(crate::blk::device::BlkDevice::new(backstore, "t".into(), false).unwrap());
    let session = blk.connect(Arc::clone(&dev.info), &dev.params).unwrap();
    let f = Fixture::with_handler(false, &dev, session.request_handler());
    (f, io)
}

/// A virtio-blk write of one sector at sector 3: header, data, status.
fn blk_write(f: &mut Fixture) -> (Vec<(u64, u32, u16)>, u64) {
    let mut header = [0u8; 16];
    header[0] = 1; // VIRTIO_BLK_T_OUT
    header[8] = 3;
    let req = f.buf(&header, 16);
    let out = f.buf(&[7; 512], 512);
    let status = f.buf(&[0xff], 1);
    (
        vec![(req, 16, 0), (out, 512, 0), (status, 1, WRITE)],
        status,
    )
}

fn status_byte(f: &Fixture, at: u64) -> u8 {
    f.mem.read_obj(GuestAddress(at)).unwrap()
}

#[test]
fn a_refused_commit_is_retried_after_a_wait_and_the_request_sent_once() {
    let (mut f, io) = flaky_blk(2, libc::EBUSY);
    let (chain, status) = blk_write(&mut f);
    let avail = f.make_available(&chain);
    let mut refused_at = Instant::now();
    f.queue.process();
    let mut passes = 0;
    while f.used_idx() == avail {
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
    assert_eq!(status_byte(&f, status), 0, "VIRTIO_BLK_S_OK");
    let io = io.lock().unwrap();
    assert_eq!((io.commits, io.sent.len()), (3, 1), "sent once");
    assert!(io.withdrawn.is_empty());
    assert_eq!(f.queue.poll_timeout(), None);
}

#[test]
fn a_commit_refused_for_good_fails_the_request_once_with_ioerr() {
    let (mut f, io) = flaky_blk(u32::MAX, libc::EBADF);
    let (chain, status) = blk_write(&mut f);
    let avail = f.make_available(&chain);
    f.queue.process();
    assert_eq!(f.used_idx(), avail + 1, "completed, not left hanging");
    assert_eq!(status_byte(&f, status), 1, "VIRTIO_BLK_S_IOERR");
    f.queue.pass();
    assert_eq!(f.used_idx(), avail + 1, "completed once");
    assert_eq!(f.queue.poll_timeout(), None);
    let errors = &f.queue.ring().device().metrics.io_errors;
    assert_eq!(
        errors.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "counted"
    );
    let io = io.lock().unwrap();
    assert_eq!((io.commits, io.withdrawn.len(), io.sent.len()), (1, 1, 0));
}
