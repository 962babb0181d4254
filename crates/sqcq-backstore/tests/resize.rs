//! `Backstore::resize` while a queue is open: the queue sees the new
//! capacity at once, RAM keeps its data and reads zeros where it regrew, a
//! file grows on disk and refuses to shrink.

use std::os::fd::RawFd;

use sqcq_backstore::{
    Backstore, BackstoreError, BackstoreQueue, FileBackstore, FileOptions, IoOp, NullBackstore,
    RamBackstore,
};

fn wait(fd: Option<RawFd>) {
    let Some(fd) = fd else { return };
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    assert_eq!(unsafe { libc::poll(&mut pfd, 1, 10_000) }, 1);
    let mut n = 0u64;
    // SAFETY: reads 8 bytes into a live u64.
    unsafe { libc::read(fd, (&raw mut n).cast(), 8) };
}

/// One read or write of `buf` at `offset`, waited for.
fn io(q: &mut dyn BackstoreQueue, op: IoOp, buf: &mut [u8]) -> Result<u32, BackstoreError> {
    let iov = [libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    }];
    // SAFETY: `buf` outlives the request, which is reaped below.
    unsafe { q.submit(1, op, &iov) }?;
    q.commit()?;
    let mut result = None;
    while result.is_none() {
        wait(q.completion_fd());
        q.reap(&mut |_, r| result = Some(r));
    }
    result.unwrap()
}

#[test]
fn ram_grows_keeps_data_and_shrinks_to_zeros() {
    let ram = RamBackstore::new(1 << 20, 512).unwrap();
    let mut q = ram.open_queue(4).unwrap();
    let mut block = vec![0xa5u8; 512];
    io(
        &mut *q,
        IoOp::Write {
            offset: 0,
            fua: false,
        },
        &mut block,
    )
    .unwrap();
    let past = IoOp::Write {
        offset: 1 << 20,
        fua: false,
    };
    assert!(io(&mut *q, past, &mut block).is_err(), "past the end");
    assert_eq!(ram.resize(4 << 20).unwrap().blocks, 8192);
    io(&mut *q, past, &mut block).unwrap();
    let mut back = vec![0u8; 512];
    io(&mut *q, IoOp::Read { offset: 0 }, &mut back).unwrap();
    assert_eq!(back, block, "data survives growth");
    // Shrink below the written block, then grow again: it reads as zeros.
    assert_eq!(ram.resize(512 * 1024).unwrap().blocks, 1024);
    assert!(io(&mut *q, IoOp::Read { offset: 1 << 20 }, &mut back).is_err());
    ram.resize(4 << 20).unwrap();
    io(&mut *q, IoOp::Read { offset: 1 << 20 }, &mut back).unwrap();
    assert!(back.iter().all(|b| *b == 0));
    assert!(ram.resize(1000).is_err(), "not a whole number of blocks");
    assert!(matches!(
        ram.resize(1 << 50),
        Err(BackstoreError::Unsupported(_))
    ));
}

#[test]
fn null_resizes() {
    let null = NullBackstore::new(1 << 20, 4096).unwrap();
    let mut q = null.open_queue(4).unwrap();
    let mut block = vec![0u8; 4096];
    assert!(io(&mut *q, IoOp::Read { offset: 1 << 20 }, &mut block).is_err());
    assert_eq!(null.resize(2 << 20).unwrap().blocks, 512);
    io(&mut *q, IoOp::Read { offset: 1 << 20 }, &mut block).unwrap();
}

#[test]
fn file_grows_on_disk_and_refuses_to_shrink() {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("resize-{}.img", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let file = FileBackstore::open(&FileOptions {
        size: Some(1 << 20),
        create: true,
        ..FileOptions::new(&path)
    })
    .unwrap();
    let mut q = file.open_queue(4).unwrap();
    let mut block = vec![0x5au8; 4096];
    let past = IoOp::Write {
        offset: 1 << 20,
        fua: false,
    };
    assert!(io(&mut *q, past, &mut block).is_err());
    assert_eq!(file.resize(2 << 20).unwrap().blocks, 4096);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 << 20);
    io(&mut *q, past, &mut block).unwrap();
    let mut back = vec![0u8; 4096];
    io(&mut *q, IoOp::Read { offset: 1 << 20 }, &mut back).unwrap();
    assert_eq!(back, block);
    assert!(matches!(
        file.resize(1 << 20),
        Err(BackstoreError::Unsupported(_))
    ));
    drop(q);
    drop(file);
    std::fs::remove_file(&path).unwrap();
}
