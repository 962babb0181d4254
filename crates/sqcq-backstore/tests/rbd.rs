//! The RBD backstore against a real Ceph cluster: the one
//! `scripts/ceph-cluster.sh` starts (`scripts/test.sh` starts it and
//! exports its `CEPH_CONF`; without either, these tests say why and pass,
//! unless `SQCQ_REQUIRE_PEERS` is set). Each test makes its own image with
//! the `rbd` tool and removes it at the end.
#![cfg(feature = "rbd")]

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Buf, wait_readable};
use sqcq_backstore::{Backstore, BackstoreError, BackstoreQueue, IoOp, RbdBackstore, RbdOptions};

/// What a client of the test cluster needs.
#[derive(Clone, Debug)]
struct Cluster {
    conf: PathBuf,
    pool: String,
    id: String,
    keyring: PathBuf,
}

impl Cluster {
    /// The cluster from the environment (`scripts/ceph-cluster.sh env`),
    /// or `None` after saying why.
    fn get() -> Option<Cluster> {
        let mut vars: Vec<(String, String)> = std::env::vars().collect();
        if std::env::var_os("CEPH_CONF").is_none() {
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/ceph-cluster.sh");
            if let Ok(out) = Command::new(script).arg("env").output()
                && out.status.success()
            {
                vars = String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .filter_map(|l| l.split_once('='))
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect();
            }
        }
        let var = |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        match (
            var("CEPH_CONF"),
            var("SQCQ_CEPH_POOL"),
            var("SQCQ_CEPH_ID"),
            var("SQCQ_CEPH_KEYRING"),
        ) {
            (Some(conf), Some(pool), Some(id), Some(keyring)) => Some(Cluster {
                conf: conf.into(),
                pool,
                id,
                keyring: keyring.into(),
            }),
            _ => {
                let why = "no Ceph cluster (scripts/ceph-cluster.sh start, or CEPH_CONF and \
                           SQCQ_CEPH_{POOL,ID,KEYRING})";
                assert!(
                    std::env::var_os("SQCQ_REQUIRE_PEERS").is_none(),
                    "{why}; SQCQ_REQUIRE_PEERS is set, so nothing may be skipped"
                );
                eprintln!("skipped: {why}");
                None
            }
        }
    }

    /// Runs the `rbd` tool as the test user; its standard output.
    fn rbd(&self, args: &[&str]) -> String {
        let out = Command::new("rbd")
            .arg("--conf")
            .arg(&self.conf)
            .args(["--id", &self.id, "--keyring"])
            .arg(&self.keyring)
            .args(args)
            .output()
            .expect("the rbd tool (ceph-common)");
        assert!(
            out.status.success(),
            "rbd {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A fresh image of `size` bytes, removed when dropped.
    fn image(&self, name: &str, size: u64) -> TestImage {
        let name = format!("{name}-{}", std::process::id());
        let spec = format!("{}/{name}", self.pool);
        let _ = Command::new("rbd")
            .arg("--conf")
            .arg(&self.conf)
            .args(["--id", &self.id, "--keyring"])
            .arg(&self.keyring)
            .args(["rm", "--no-progress", &spec])
            .output();
        self.rbd(&["create", "--size", &format!("{size}B"), &spec]);
        TestImage {
            cluster: self.clone(),
            name,
        }
    }

    fn options(&self, image: &str) -> RbdOptions {
        RbdOptions {
            conf: Some(self.conf.clone()),
            id: Some(self.id.clone()),
            keyring: Some(self.keyring.clone()),
            ..RbdOptions::new(self.pool.clone(), image)
        }
    }
}

struct TestImage {
    cluster: Cluster,
    name: String,
}

impl TestImage {
    fn spec(&self) -> String {
        format!("{}/{}", self.cluster.pool, self.name)
    }
}

impl Drop for TestImage {
    fn drop(&mut self) {
        let spec = self.spec();
        let _ = Command::new("rbd")
            .arg("--conf")
            .arg(&self.cluster.conf)
            .args(["--id", &self.cluster.id, "--keyring"])
            .arg(&self.cluster.keyring)
            .args(["snap", "purge", "--no-progress", &spec])
            .output();
        let _ = Command::new("rbd")
            .arg("--conf")
            .arg(&self.cluster.conf)
            .args(["--id", &self.cluster.id, "--keyring"])
            .arg(&self.cluster.keyring)
            .args(["rm", "--no-progress", &spec])
            .output();
    }
}

/// Reaps until `n` completions came, waiting on the completion eventfd
/// only (no other wakeup), and returns them.
fn reap_n(q: &mut dyn BackstoreQueue, n: usize) -> Vec<(u64, Result<u32, BackstoreError>)> {
    let fd = q
        .completion_fd()
        .expect("an RBD queue completes asynchronously");
    let mut got = Vec::new();
    while got.len() < n {
        wait_readable(fd, 60);
        q.reap(&mut |tag, r| got.push((tag, r)));
    }
    got
}

/// Submits one request and waits for its completion.
fn run(q: &mut dyn BackstoreQueue, op: IoOp, iov: &[libc::iovec]) -> Result<u32, BackstoreError> {
    // SAFETY: the iovecs point into `Buf`s that outlive this call, which
    // returns only after the completion was reaped.
    unsafe { q.submit(7, op, iov)? };
    q.commit()?;
    let mut got = reap_n(q, 1);
    let (tag, result) = got.pop().unwrap();
    assert_eq!(tag, 7);
    result
}

fn pattern(buf: &mut [u8], seed: u8) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = seed.wrapping_add(u8::try_from(i % 251).unwrap());
    }
}

#[test]
fn an_image_keeps_data_through_librbd() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    // Not a whole number of blocks: the LUN is the whole blocks.
    let image = cluster.image("keeps-data", (64 << 20) + 512);
    let store = RbdBackstore::open(&RbdOptions {
        block_size: 4096,
        ..cluster.options(&image.name)
    })
    .unwrap();
    let geometry = store.geometry();
    assert_eq!(geometry.bytes(), 64 << 20, "capacity is the image's size");
    assert!(!geometry.read_only);
    let mut q = store.open_queue(8).unwrap();
    let mut out = Buf::new(16384);
    let mut back = Buf::new(16384);
    pattern(out.bytes(), 3);
    let w = [out.iov(0, 4096), out.iov(4096, 8192)];
    let write = IoOp::Write {
        offset: 8192,
        fua: false,
    };
    assert_eq!(run(&mut *q, write, &w).unwrap(), 12288);
    let r = [back.iov(0, 5000), back.iov(5000, 7288)];
    assert_eq!(
        run(&mut *q, IoOp::Read { offset: 8192 }, &r).unwrap(),
        12288
    );
    assert_eq!(&back.bytes()[..12288], &out.bytes()[..12288]);
    // FUA (a write, then a flush) and flush report the write's length
    // and zero.
    let fua = IoOp::Write {
        offset: 0,
        fua: true,
    };
    assert_eq!(run(&mut *q, fua, &[out.iov(0, 4096)]).unwrap(), 4096);
    assert_eq!(run(&mut *q, IoOp::Flush, &[]).unwrap(), 0);
    // Odd buffers and offsets are librbd's business, not ours.
    let odd = IoOp::Write {
        offset: 512,
        fua: false,
    };
    assert_eq!(run(&mut *q, odd, &[out.iov(1, 512)]).unwrap(), 512);
    assert_eq!(
        run(&mut *q, IoOp::Read { offset: 512 }, &[back.iov(3, 512)]).unwrap(),
        512
    );
    assert_eq!(&back.bytes()[3..515], &out.bytes()[1..513]);
    // Write-zeroes reads back as zeros; a discard succeeds.
    let zeroes = IoOp::WriteZeroes {
        offset: 12288,
        len: 512,
    };
    assert_eq!(run(&mut *q, zeroes, &[]).unwrap(), 0);
    let discard = IoOp::Discard {
        offset: 1 << 20,
        len: 4 << 20,
    };
    assert_eq!(run(&mut *q, discard, &[]).unwrap(), 0);
    assert_eq!(
        run(&mut *q, IoOp::Read { offset: 8192 }, &[back.iov(0, 12288)]).unwrap(),
        12288
    );
    assert!(back.bytes()[4096..4608].iter().all(|&b| b == 0));
    assert_eq!(&back.bytes()[..4096], &out.bytes()[..4096]);
    assert_eq!(&back.bytes()[4608..12288], &out.bytes()[4608..12288]);
    // Zero-length requests complete too, through the same descriptor.
    assert_eq!(run(&mut *q, IoOp::Read { offset: 0 }, &[]).unwrap(), 0);
    // Beyond the end: refused at submission.
    let cap = geometry.bytes();
    // SAFETY: refused synchronously, `back` outlives the call.
    let r = unsafe { q.submit(1, IoOp::Read { offset: cap - 512 }, &[back.iov(0, 1024)]) };
    assert!(matches!(r, Err(BackstoreError::OutOfRange { .. })), "{r:?}");
    assert_eq!(
        run(
            &mut *q,
            IoOp::Read { offset: cap - 512 },
            &[back.iov(0, 512)]
        )
        .unwrap(),
        512
    );
    assert_eq!(q.in_flight(), 0);
}

#[test]
fn many_requests_in_flight_complete_each_once_and_the_depth_is_enforced() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let image = cluster.image("in-flight", 16 << 20);
    let store = RbdBackstore::open(&cluster.options(&image.name)).unwrap();
    const DEPTH: usize = 32;
    let mut q = store.open_queue(u32::try_from(DEPTH).unwrap()).unwrap();
    let mut bufs: Vec<Buf> = (0..DEPTH).map(|_| Buf::new(4096)).collect();
    for (i, b) in bufs.iter_mut().enumerate() {
        pattern(b.bytes(), u8::try_from(i).unwrap());
    }
    for round in 0..3u64 {
        for (i, b) in bufs.iter_mut().enumerate() {
            let op = IoOp::Write {
                offset: 4096 * i as u64,
                fua: i % 4 == 0,
            };
            // SAFETY: `bufs` outlives every request (reaped below).
            unsafe { q.submit(round * 100 + i as u64, op, &[b.iov(0, 4096)]) }.unwrap();
        }
        let mut b = Buf::new(512);
        // SAFETY: refused synchronously.
        let full = unsafe { q.submit(999, IoOp::Read { offset: 0 }, &[b.iov(0, 512)]) };
        assert!(
            matches!(full, Err(BackstoreError::QueueFull(_))),
            "{full:?}"
        );
        q.commit().unwrap();
        let mut got = reap_n(&mut *q, DEPTH);
        got.sort_by_key(|(tag, _)| *tag);
        for (i, (tag, r)) in got.into_iter().enumerate() {
            assert_eq!(tag, round * 100 + i as u64);
            assert_eq!(r.unwrap(), 4096);
        }
        assert_eq!(q.in_flight(), 0);
    }
    let mut back = Buf::new(4096 * DEPTH);
    assert_eq!(
        run(
            &mut *q,
            IoOp::Read { offset: 0 },
            &[back.iov(0, 4096 * DEPTH)]
        )
        .unwrap(),
        u32::try_from(4096 * DEPTH).unwrap()
    );
    for (i, b) in bufs.iter_mut().enumerate() {
        assert_eq!(
            &back.bytes()[4096 * i..4096 * (i + 1)],
            b.bytes(),
            "block {i}"
        );
    }
}

#[test]
fn dropping_a_queue_waits_for_librbd_to_finish_with_the_buffers() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    // A fresh image reads as zeros.
    let image = cluster.image("drop", 16 << 20);
    let store = RbdBackstore::open(&cluster.options(&image.name)).unwrap();
    for _ in 0..3 {
        let mut q = store.open_queue(16).unwrap();
        let mut bufs: Vec<Buf> = (0..16).map(|_| Buf::new(65536)).collect();
        for (i, b) in bufs.iter_mut().enumerate() {
            b.bytes().fill(0xaa);
            let op = IoOp::Read {
                offset: 65536 * i as u64,
            };
            // SAFETY: `bufs` is dropped after `q`, whose Drop waits for
            // every request.
            unsafe { q.submit(i as u64, op, &[b.iov(0, 65536)]) }.unwrap();
        }
        drop(q);
        // Every read has landed by the time the queue is gone: after
        // this, the memory may be the guest's again (or freed).
        for (i, b) in bufs.iter_mut().enumerate() {
            assert!(
                b.bytes().iter().all(|&x| x == 0),
                "read {i} still in flight"
            );
        }
    }
}

#[test]
fn a_snapshot_is_served_read_only_with_its_own_data() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let image = cluster.image("snap", 4 << 20);
    let mut out = Buf::new(4096);
    let mut back = Buf::new(4096);
    {
        let store = RbdBackstore::open(&cluster.options(&image.name)).unwrap();
        let mut q = store.open_queue(2).unwrap();
        pattern(out.bytes(), 9);
        let write = IoOp::Write {
            offset: 0,
            fua: true,
        };
        assert_eq!(run(&mut *q, write, &[out.iov(0, 4096)]).unwrap(), 4096);
    }
    cluster.rbd(&[
        "snap",
        "create",
        "--no-progress",
        &format!("{}@s1", image.spec()),
    ]);
    // The image changes after the snapshot.
    let head = RbdBackstore::open(&cluster.options(&image.name)).unwrap();
    let mut hq = head.open_queue(2).unwrap();
    let zeroes = IoOp::WriteZeroes {
        offset: 0,
        len: 4096,
    };
    assert_eq!(run(&mut *hq, zeroes, &[]).unwrap(), 0);
    let snap = RbdBackstore::open(&RbdOptions {
        snap: Some("s1".to_owned()),
        ..cluster.options(&image.name)
    })
    .unwrap();
    assert!(snap.geometry().read_only, "a snapshot LUN is read-only");
    assert!(!snap.geometry().supports_unmap);
    let mut sq = snap.open_queue(2).unwrap();
    assert_eq!(
        run(&mut *sq, IoOp::Read { offset: 0 }, &[back.iov(0, 4096)]).unwrap(),
        4096
    );
    assert_eq!(back.bytes(), out.bytes(), "the snapshot's data");
    let write = IoOp::Write {
        offset: 0,
        fua: false,
    };
    // SAFETY: refused synchronously.
    let r = unsafe { sq.submit(1, write, &[out.iov(0, 4096)]) };
    assert!(matches!(r, Err(BackstoreError::ReadOnly)), "{r:?}");
    // SAFETY: no buffer.
    let r = unsafe {
        sq.submit(
            1,
            IoOp::Discard {
                offset: 0,
                len: 4096,
            },
            &[],
        )
    };
    assert!(matches!(r, Err(BackstoreError::ReadOnly)), "{r:?}");
}

#[test]
fn misconfiguration_is_one_clear_error_not_a_hang() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let image = cluster.image("misconf", 1 << 20);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let bad_keyring = dir.join(format!("bad-keyring-{}", std::process::id()));
    std::fs::write(
        &bad_keyring,
        format!(
            "[client.{}]\n\tkey = AQBn0WdnAAAAABAAxPVCUjq3pVRw7n8JjXv/Tg==\n",
            cluster.id
        ),
    )
    .unwrap();
    // Monitors that do not answer (nothing listens there), with a short
    // connect time-out so that the test does not wait the default 30 s.
    let dead_conf = dir.join(format!("dead-mon-{}.conf", std::process::id()));
    std::fs::write(
        &dead_conf,
        "[global]\nmon host = v2:127.0.0.1:9\nauth client required = cephx\n\
         [client]\nclient mount timeout = 3\n",
    )
    .unwrap();
    let cases: Vec<(RbdOptions, &str)> = vec![
        (
            RbdOptions {
                conf: Some(dead_conf.clone()),
                ..cluster.options(&image.name)
            },
            "cannot connect to the Ceph cluster as client.",
        ),
        (
            RbdOptions {
                pool: "no-such-pool".to_owned(),
                ..cluster.options(&image.name)
            },
            "cannot open pool no-such-pool",
        ),
        (cluster.options("no-such-image"), "cannot open RBD image"),
        (
            RbdOptions {
                snap: Some("no-such-snap".to_owned()),
                ..cluster.options(&image.name)
            },
            "cannot open RBD image",
        ),
        (
            RbdOptions {
                keyring: Some(bad_keyring.clone()),
                ..cluster.options(&image.name)
            },
            "cannot connect to the Ceph cluster as client.",
        ),
        (
            RbdOptions {
                conf: Some(dir.join("no-such-ceph.conf")),
                ..cluster.options(&image.name)
            },
            "cannot read the Ceph configuration",
        ),
    ];
    for (options, want) in cases {
        let start = Instant::now();
        let e = RbdBackstore::open(&options).unwrap_err();
        // A hang guard, not a timing: Ceph's own default would wait 300 s.
        assert!(start.elapsed() < Duration::from_secs(60), "{want}");
        let text = e.to_string();
        assert!(text.contains(want), "{text:?} lacks {want:?}");
        assert!(matches!(e, BackstoreError::Ceph { .. }), "{want}: {e:?}");
    }
    let _ = std::fs::remove_file(bad_keyring);
    let _ = std::fs::remove_file(dead_conf);
}

#[test]
fn a_second_writer_is_refused_and_the_lock_is_handed_over() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let image = cluster.image("fence", 4 << 20);
    let first = RbdBackstore::open(&cluster.options(&image.name)).unwrap();
    let start = Instant::now();
    let e = RbdBackstore::open(&cluster.options(&image.name)).unwrap_err();
    // A hang guard, not a timing.
    assert!(start.elapsed() < Duration::from_secs(60));
    let text = e.to_string();
    assert!(
        text.contains("exclusive lock is held by the client at 127.0.0.1:"),
        "{text}"
    );
    // Readers do not need the lock.
    let reader = RbdBackstore::open(&RbdOptions {
        read_only: true,
        ..cluster.options(&image.name)
    })
    .unwrap();
    let mut b = Buf::new(4096);
    let mut rq = reader.open_queue(1).unwrap();
    assert_eq!(
        run(&mut *rq, IoOp::Read { offset: 0 }, &[b.iov(0, 4096)]).unwrap(),
        4096
    );
    // A migration's destination opens without the lock and takes it
    // once the source has given it back.
    let second = RbdBackstore::open(&RbdOptions {
        defer_lock: true,
        ..cluster.options(&image.name)
    })
    .unwrap();
    assert!(
        second.set_active(true).is_err(),
        "the source still holds it"
    );
    first.set_active(false).unwrap();
    second.set_active(true).unwrap();
    let mut q = second.open_queue(1).unwrap();
    pattern(b.bytes(), 5);
    let write = IoOp::Write {
        offset: 0,
        fua: true,
    };
    assert_eq!(run(&mut *q, write, &[b.iov(0, 4096)]).unwrap(), 4096);
    assert!(
        first.set_active(true).is_err(),
        "now the destination holds it"
    );
    drop(q);
    drop(second);
    // Closing the image gives the lock back.
    first.set_active(true).unwrap();
}

#[test]
fn taking_the_lock_again_while_holding_it_leaves_the_owner_record_alone() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let image = cluster.image("relock", 4 << 20);
    let spec = format!("{}/{}", cluster.pool, image.name);
    let b = RbdBackstore::open(&cluster.options(&image.name)).unwrap();
    let record = cluster.rbd(&["image-meta", "get", &spec, "sqcq.lock-owner"]);
    assert!(
        record.contains(&format!("pid={} ", std::process::id())),
        "{record}"
    );
    // A queue started again (a reconnect) while the lock is held: no
    // lock request and no metadata write, each a round trip to the
    // cluster (the write notifies every watcher of the image).
    cluster.rbd(&["image-meta", "set", &spec, "sqcq.lock-owner", "marker"]);
    b.set_active(true).unwrap();
    assert_eq!(
        cluster
            .rbd(&["image-meta", "get", &spec, "sqcq.lock-owner"])
            .trim(),
        "marker"
    );
}

#[test]
fn an_image_in_a_namespace_is_found_there_only() {
    let Some(cluster) = Cluster::get() else {
        return;
    };
    let ns = format!("ns-{}", std::process::id());
    let spec = format!("{}/{ns}/img", cluster.pool);
    cluster.rbd(&[
        "namespace",
        "create",
        "--pool",
        &cluster.pool,
        "--namespace",
        &ns,
    ]);
    cluster.rbd(&["create", "--size", "4M", &spec]);
    let in_ns = RbdOptions {
        namespace: Some(ns.clone()),
        ..cluster.options("img")
    };
    let result = std::panic::catch_unwind(|| {
        let store = RbdBackstore::open(&in_ns).unwrap();
        assert_eq!(store.geometry().bytes(), 4 << 20);
        let mut q = store.open_queue(1).unwrap();
        let mut b = Buf::new(4096);
        pattern(b.bytes(), 1);
        let write = IoOp::Write {
            offset: 4096,
            fua: false,
        };
        assert_eq!(run(&mut *q, write, &[b.iov(0, 4096)]).unwrap(), 4096);
        let e = RbdBackstore::open(&cluster.options("img")).unwrap_err();
        assert!(
            e.to_string().contains(&format!("{}/img", cluster.pool)),
            "not in the default namespace: {e}"
        );
    });
    cluster.rbd(&["rm", "--no-progress", &spec]);
    cluster.rbd(&[
        "namespace",
        "remove",
        "--pool",
        &cluster.pool,
        "--namespace",
        &ns,
    ]);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}
