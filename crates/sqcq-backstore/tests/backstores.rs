//! Every backstore through its real I/O path: anonymous memory for RAM,
//! io_uring on a real file for the file backstore (on the target
//! directory's file system, so that `O_DIRECT` is exercised where the file
//! system supports it).

mod common;

use std::path::PathBuf;

use common::{Buf, wait_readable};
use sqcq_backstore::{
    Backstore, BackstoreError, BackstoreQueue, FileBackstore, FileOptions, IoOp, NullBackstore,
    RamBackstore,
};

/// Submits one request and waits for its completion.
fn run(q: &mut dyn BackstoreQueue, op: IoOp, iov: &[libc::iovec]) -> Result<u32, BackstoreError> {
    // SAFETY: the iovecs point into `Buf`s that outlive this call, which
    // returns only after the completion was reaped.
    unsafe { q.submit(7, op, iov)? };
    q.commit()?;
    let mut result = None;
    while result.is_none() {
        if q.in_flight() > 0
            && let Some(fd) = q.completion_fd()
        {
            wait_readable(fd, 10);
        }
        q.reap(&mut |tag, r| {
            assert_eq!(tag, 7);
            result = Some(r);
        });
    }
    result.unwrap()
}

fn pattern(buf: &mut [u8], seed: u8) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = seed.wrapping_add(u8::try_from(i % 251).unwrap());
    }
}

fn temp_path(name: &str) -> PathBuf {
    let p =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

/// The checks every data-keeping backstore must pass.
fn round_trip(store: &dyn Backstore) {
    let mut q = store.open_queue(4).unwrap();
    let mut out = Buf::new(16384);
    let mut back = Buf::new(16384);
    pattern(out.bytes(), 3);
    // Two segments, aligned.
    let w = [out.iov(0, 4096), out.iov(4096, 8192)];
    assert_eq!(
        run(
            &mut *q,
            IoOp::Write {
                offset: 8192,
                fua: false
            },
            &w
        )
        .unwrap(),
        12288
    );
    let r = [back.iov(0, 12288)];
    assert_eq!(
        run(&mut *q, IoOp::Read { offset: 8192 }, &r).unwrap(),
        12288
    );
    assert_eq!(&back.bytes()[..12288], &out.bytes()[..12288]);
    // FUA write and flush succeed.
    assert_eq!(
        run(
            &mut *q,
            IoOp::Write {
                offset: 0,
                fua: true
            },
            &[out.iov(0, 4096)]
        )
        .unwrap(),
        4096
    );
    assert_eq!(run(&mut *q, IoOp::Flush, &[]).unwrap(), 0);
    // Unaligned buffer (buffered fallback on the file backstore).
    let odd = [out.iov(1, 512)];
    assert_eq!(
        run(
            &mut *q,
            IoOp::Write {
                offset: 512,
                fua: false
            },
            &odd
        )
        .unwrap(),
        512
    );
    assert_eq!(
        run(&mut *q, IoOp::Read { offset: 512 }, &[back.iov(3, 512)]).unwrap(),
        512
    );
    assert_eq!(&back.bytes()[3..515], &out.bytes()[1..513]);
    // Discard and write-zeroes read back as zeros.
    assert_eq!(
        run(
            &mut *q,
            IoOp::Discard {
                offset: 8192,
                len: 4096
            },
            &[]
        )
        .unwrap(),
        0
    );
    assert_eq!(
        run(
            &mut *q,
            IoOp::WriteZeroes {
                offset: 12288,
                len: 512
            },
            &[]
        )
        .unwrap(),
        0
    );
    assert_eq!(
        run(&mut *q, IoOp::Read { offset: 8192 }, &[back.iov(0, 12288)]).unwrap(),
        12288
    );
    assert!(back.bytes()[..4608].iter().all(|&b| b == 0));
    assert_eq!(&back.bytes()[4608..12288], &out.bytes()[4608..12288]);
}

fn out_of_range(store: &dyn Backstore) {
    let cap = store.geometry().bytes();
    let mut q = store.open_queue(2).unwrap();
    let mut b = Buf::new(4096);
    // SAFETY: `b` outlives the queue's use of it (refused synchronously or reaped in `run`).
    let r = unsafe { q.submit(1, IoOp::Read { offset: cap - 512 }, &[b.iov(0, 1024)]) };
    let r = r.and_then(|()| run_pending(&mut *q));
    assert!(matches!(r, Err(BackstoreError::OutOfRange { .. })), "{r:?}");
    let r = run(
        &mut *q,
        IoOp::Discard {
            offset: u64::MAX - 10,
            len: 100,
        },
        &[],
    );
    assert!(matches!(r, Err(BackstoreError::OutOfRange { .. })), "{r:?}");
    // The last block itself is fine.
    assert_eq!(
        run(&mut *q, IoOp::Read { offset: cap - 512 }, &[b.iov(0, 512)]).unwrap(),
        512
    );
}

/// Completes a request already submitted with tag 1 (immediate backstores).
fn run_pending(q: &mut dyn BackstoreQueue) -> Result<(), BackstoreError> {
    q.commit()?;
    let mut result = None;
    q.reap(&mut |_, r| result = Some(r));
    result
        .expect("immediate backstore completes at once")
        .map(|_| ())
}

#[test]
fn ram_keeps_data() {
    let ram = RamBackstore::new(1 << 20, 512).unwrap();
    round_trip(&ram);
    out_of_range(&ram);
}

#[test]
fn file_keeps_data_through_io_uring() {
    let path = temp_path("file-backstore");
    let mut opts = FileOptions::new(&path);
    opts.size = Some(1 << 20);
    opts.create = true;
    let file = FileBackstore::open(&opts).unwrap();
    assert_eq!(file.geometry().blocks, 2048);
    round_trip(&file);
    out_of_range(&file);
    eprintln!("file backstore used O_DIRECT: {}", file.direct_io());
    std::fs::remove_file(path).unwrap();
}

#[test]
fn file_completion_work_can_be_steered_to_cpus() {
    let path = temp_path("file-steer");
    let mut opts = FileOptions::new(&path);
    opts.size = Some(1 << 20);
    opts.create = true;
    let file = FileBackstore::open(&opts).unwrap();
    let mut q = file.open_queue(8).unwrap();
    assert!(
        q.steer_completions(&[0]).unwrap(),
        "io-wq affinity registered"
    );
    round_trip(&file);
    let null = NullBackstore::new(1 << 20, 512).unwrap();
    let mut q = null.open_queue(8).unwrap();
    assert!(!q.steer_completions(&[0]).unwrap(), "null completes inline");
    std::fs::remove_file(path).unwrap();
}

#[test]
fn null_leaves_read_buffers_alone_unless_asked_to_zero_them() {
    let null = NullBackstore::new(1 << 20, 4096).unwrap();
    assert!(!null.geometry().unmapped_reads_zero);
    let mut q = null.open_queue(2).unwrap();
    let mut b = Buf::new(8192);
    b.bytes().fill(0xaa);
    assert_eq!(
        run(&mut *q, IoOp::Read { offset: 0 }, &[b.iov(0, 8192)]).unwrap(),
        8192
    );
    assert!(b.bytes().iter().all(|&x| x == 0xaa), "untouched");
}

#[test]
fn null_reads_zeros_and_drops_writes() {
    let null = NullBackstore::new(1 << 20, 4096).unwrap().zero_reads(true);
    assert!(null.geometry().unmapped_reads_zero);
    let mut q = null.open_queue(2).unwrap();
    let mut b = Buf::new(8192);
    b.bytes().fill(0xaa);
    assert_eq!(
        run(
            &mut *q,
            IoOp::Write {
                offset: 0,
                fua: true
            },
            &[b.iov(0, 4096)]
        )
        .unwrap(),
        4096
    );
    assert_eq!(
        run(&mut *q, IoOp::Read { offset: 0 }, &[b.iov(0, 8192)]).unwrap(),
        8192
    );
    assert!(b.bytes().iter().all(|&x| x == 0));
    out_of_range(&null);
}

#[test]
fn a_file_that_shrinks_underneath_fails_reads_instead_of_inventing_data() {
    let path = temp_path("shrunk");
    let mut opts = FileOptions::new(&path);
    opts.size = Some(64 * 1024);
    opts.create = true;
    let file = FileBackstore::open(&opts).unwrap();
    let mut q = file.open_queue(2).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(4096)
        .unwrap();
    let mut b = Buf::new(4096);
    let r = run(&mut *q, IoOp::Read { offset: 32768 }, &[b.iov(0, 4096)]);
    assert!(
        matches!(
            r,
            Err(BackstoreError::ShortTransfer {
                expected: 4096,
                done: 0
            })
        ),
        "{r:?}"
    );
    std::fs::remove_file(path).unwrap();
}

#[test]
fn read_only_file_refuses_writes_and_discards() {
    let path = temp_path("ro");
    std::fs::write(&path, vec![1u8; 8192]).unwrap();
    let mut opts = FileOptions::new(&path);
    opts.read_only = true;
    let file = FileBackstore::open(&opts).unwrap();
    assert!(file.geometry().read_only);
    let mut q = file.open_queue(2).unwrap();
    let mut b = Buf::new(4096);
    // SAFETY: refused before anything is queued.
    let w = unsafe {
        q.submit(
            1,
            IoOp::Write {
                offset: 0,
                fua: false,
            },
            &[b.iov(0, 512)],
        )
    };
    assert!(matches!(w, Err(BackstoreError::ReadOnly)));
    // SAFETY: as above.
    let d = unsafe {
        q.submit(
            1,
            IoOp::Discard {
                offset: 0,
                len: 512,
            },
            &[],
        )
    };
    assert!(matches!(d, Err(BackstoreError::ReadOnly)));
    assert_eq!(
        run(&mut *q, IoOp::Read { offset: 0 }, &[b.iov(0, 4096)]).unwrap(),
        4096
    );
    assert!(b.bytes().iter().all(|&x| x == 1));
    std::fs::remove_file(path).unwrap();
}

#[test]
fn queue_depth_is_enforced_without_losing_accepted_requests() {
    for store in [
        Box::new(RamBackstore::new(1 << 20, 512).unwrap()) as Box<dyn Backstore>,
        Box::new(NullBackstore::new(1 << 20, 512).unwrap()),
    ] {
        let mut q = store.open_queue(2).unwrap();
        let mut b = Buf::new(4096);
        for tag in 0..2 {
            // SAFETY: `b` outlives the reap below.
            unsafe {
                q.submit(tag, IoOp::Read { offset: 0 }, &[b.iov(0, 512)])
                    .unwrap()
            };
        }
        // SAFETY: refused synchronously.
        let third = unsafe { q.submit(2, IoOp::Read { offset: 0 }, &[b.iov(0, 512)]) };
        assert!(matches!(third, Err(BackstoreError::QueueFull(_))));
        let mut tags = Vec::new();
        q.reap(&mut |tag, r| {
            assert_eq!(r.unwrap(), 512);
            tags.push(tag);
        });
        assert_eq!(tags, [0, 1]);
        assert_eq!(q.in_flight(), 0);
    }
}

#[test]
fn invalid_geometries_are_refused() {
    assert!(matches!(
        RamBackstore::new(1000, 512),
        Err(BackstoreError::Geometry(_))
    ));
    assert!(matches!(
        NullBackstore::new(4096, 1024),
        Err(BackstoreError::Geometry(_))
    ));
    assert!(matches!(
        RamBackstore::new(0, 4096),
        Err(BackstoreError::Geometry(_))
    ));
    let missing = FileBackstore::open(&FileOptions::new("/nonexistent/dir/disk.img"));
    assert!(matches!(missing, Err(BackstoreError::Missing { .. })));
}

#[test]
fn existing_files_are_never_resized_and_missing_ones_need_create() {
    let path = temp_path("no-resize");
    let _ = std::fs::remove_file(&path);
    let mut opts = FileOptions::new(&path);
    opts.size = Some(1 << 20);
    assert!(FileBackstore::open(&opts).is_err(), "missing, no create");
    assert!(!path.exists(), "nothing created without create");
    opts.create = true;
    opts.size = None;
    assert!(FileBackstore::open(&opts).is_err(), "create needs a size");
    assert!(!path.exists());

    std::fs::write(&path, vec![7u8; 8192]).unwrap();
    opts.size = Some(1 << 20);
    let e = FileBackstore::open(&opts).unwrap_err();
    assert!(
        matches!(
            e,
            BackstoreError::TooSmall {
                available: 8192,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 8192, "not grown");
    opts.size = Some(4096);
    let file = FileBackstore::open(&opts).unwrap();
    assert_eq!(file.geometry().blocks, 8, "the first 4096 bytes only");
    drop(file);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 8192, "not shrunk");
    std::fs::remove_file(path).unwrap();
}

#[test]
fn ram_discards_zero_exactly_their_range() {
    let ram = RamBackstore::new(64 << 10, 512).unwrap();
    let mut q = ram.open_queue(2).unwrap();
    let mut b = Buf::new(64 << 10);
    b.bytes().fill(0x5a);
    let all = b.iov(0, 64 << 10);
    run(
        &mut *q,
        IoOp::Write {
            offset: 0,
            fua: false,
        },
        &[all],
    )
    .unwrap();
    // Unaligned at both ends, several whole pages in between.
    let (start, len) = (512 * 3, 512 * 40);
    run(&mut *q, IoOp::Discard { offset: start, len }, &[]).unwrap();
    b.bytes().fill(0xff);
    let all = b.iov(0, 64 << 10);
    run(&mut *q, IoOp::Read { offset: 0 }, &[all]).unwrap();
    let (start, len) = (
        usize::try_from(start).unwrap(),
        usize::try_from(len).unwrap(),
    );
    let bytes = b.bytes();
    assert!(
        bytes[..start].iter().all(|&x| x == 0x5a),
        "before the range"
    );
    assert!(
        bytes[start..start + len].iter().all(|&x| x == 0),
        "the range"
    );
    assert!(
        bytes[start + len..].iter().all(|&x| x == 0x5a),
        "after the range"
    );
}

#[test]
fn a_withdrawn_file_request_fails_and_is_never_performed() {
    let path = temp_path("withdraw");
    std::fs::write(&path, vec![1u8; 16384]).unwrap();
    let file = FileBackstore::open(&FileOptions::new(&path)).unwrap();
    let mut q = file.open_queue(4).unwrap();
    let mut out = Buf::new(8192);
    out.bytes().fill(0xee);
    // Queued, never sent: as after a commit that kept failing.
    for (tag, offset) in [(3, 0), (4, 4096)] {
        let op = IoOp::Write { offset, fua: false };
        let iov = [out.iov(usize::try_from(offset).unwrap(), 4096)];
        // SAFETY: `out` outlives the queue's use of it: the requests are
        // withdrawn and reaped below.
        unsafe { q.submit(tag, op, &iov) }.unwrap();
    }
    assert_eq!(q.withdraw(), 2);
    let mut failed = Vec::new();
    q.reap(&mut |tag, r| failed.push((tag, r.is_err())));
    assert_eq!(failed, [(3, true), (4, true)], "each failed, once");
    assert_eq!(q.in_flight(), 0);
    assert_eq!(q.withdraw(), 0, "nothing left to withdraw");
    // The next batch goes out alone: the withdrawn writes never happen.
    let mut back = Buf::new(8192);
    assert_eq!(
        run(&mut *q, IoOp::Read { offset: 0 }, &[back.iov(0, 8192)]).unwrap(),
        8192
    );
    assert!(back.bytes().iter().all(|&b| b == 1), "file untouched");
    assert_eq!(std::fs::read(&path).unwrap(), vec![1u8; 16384]);
    std::fs::remove_file(path).unwrap();
}
