//! sqcqd on a Ceph RBD image (`--lun kind=rbd,...`) end to end, against
//! the real single-host cluster of `scripts/ceph-cluster.sh` (started,
//! and its environment exported, by `scripts/test.sh`): `sqcq-bench
//! --verify crc32c` over both device types in every notification mode,
//! so a lost, misplaced or torn write to the cluster fails the run.
//! Skipped, saying why, without a cluster (a failure under
//! `SQCQ_REQUIRE_PEERS`).

mod common;

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// sqcqd serving `image` as its one LUN or disk, once it listens.
fn daemon(bin: &Path, dir: &Path, device: &str, image: &RbdImage, extra: &[&OsStr]) -> Running {
    let socket = dir.join("vhost.sock");
    let _ = std::fs::remove_file(&socket);
    let log = std::fs::File::create(dir.join("sqcqd.log")).unwrap();
    let mut d = Running(
        Command::new(bin)
            .arg("--socket-path")
            .arg(&socket)
            .args(["--device-type", device, "--num-queues", "2"])
            .args(["--lun", &image.lun()])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("sqcqd starts"),
    );
    // A hang guard: connecting to the cluster is bounded by the client's
    // mount time-out (30 s), taking a dead client's lock over by the
    // OSD's watch time-out (30 s).
    let deadline = Instant::now() + Duration::from_secs(90);
    while !socket.exists() {
        if let Some(status) = d.0.try_wait().unwrap() {
            panic!(
                "sqcqd exited with {status}: {}",
                std::fs::read_to_string(dir.join("sqcqd.log")).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "sqcqd listens within 90 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    d
}

/// Two jobs, each writing 4 MiB of its own in 8 KiB I/Os at QD8 (FUA on
/// SCSI), then reading it back and checking every block.
fn verify(socket: &Path, device: &str, mode: &str) -> Value {
    let mut args = vec![
        "--device-type",
        device,
        "--mode",
        mode,
        "--rw",
        "randwrite",
        "--verify",
        "crc32c",
        "--size",
        "4m",
        "--bs",
        "8k",
        "--iodepth",
        "8",
        "--numjobs",
        "2",
    ];
    if device == "scsi" {
        args.push("--fua");
    }
    let (_, v) = bench_json(&["--socket".as_ref(), socket.as_os_str()], &args);
    let jobs = v["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2, "{device} {mode}");
    for (i, job) in jobs.iter().enumerate() {
        assert_eq!(job["error"], 0, "{device} {mode} job {i}");
        assert_eq!(job["write"]["total_ios"], 512, "{device} {mode} job {i}");
        assert_eq!(job["read"]["total_ios"], 512, "{device} {mode} job {i}");
        assert_eq!(job["read"]["io_bytes"], 4 << 20, "{device} {mode} job {i}");
    }
    v
}

#[test]
fn verify_passes_on_an_rbd_image_for_both_device_types_in_every_mode() {
    let Some(ceph) = Ceph::get() else { return };
    let Some(bin) = sqcqd() else { return };
    let dir = Scratch::new("rbd", "verify");
    let image = ceph.image("bench-verify", "64M");
    for device in ["scsi", "blk"] {
        for (mode, extra) in MODES {
            let extra: Vec<&OsStr> = extra.iter().map(OsStr::new).collect();
            let d = daemon(&bin, &dir.0, device, &image, &extra);
            let v = verify(&dir.0.join("vhost.sock"), device, mode);
            assert_eq!(v["sqcq"]["mode"], mode, "{device} {mode}: no fallback");
            // SIGTERM closes the image and so gives its exclusive lock
            // back: the next daemon on the image takes it at once (after
            // a kill -9 it would wait until the OSD drops the dead
            // client's watch).
            d.stop();
        }
    }
}

#[test]
fn a_missing_image_stops_sqcqd_with_one_clear_line() {
    let Some(ceph) = Ceph::get() else { return };
    let Some(bin) = sqcqd() else { return };
    let dir = Scratch::new("rbd", "missing");
    let lun = format!(
        "kind=rbd,pool={},image=no-such-image,conf={},id={},keyring={}",
        ceph.pool, ceph.conf, ceph.id, ceph.keyring
    );
    let start = Instant::now();
    let out = Command::new(&bin)
        .arg("--socket-path")
        .arg(dir.0.join("vhost.sock"))
        .args(["--lun", &lun])
        .output()
        .unwrap();
    // A hang guard, not a timing.
    assert!(start.elapsed() < Duration::from_secs(60));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot open RBD image sqcq/no-such-image")
            || stderr.contains(&format!(
                "cannot open RBD image {}/no-such-image",
                ceph.pool
            )),
        "{stderr}"
    );
}

#[test]
fn monitors_that_do_not_answer_stop_sqcqd_with_one_clear_line_in_bounded_time() {
    let Some(ceph) = Ceph::get() else { return };
    let Some(bin) = sqcqd() else { return };
    let dir = Scratch::new("rbd", "deadmon");
    // A "monitor" that accepts connections (the kernel completes them
    // into the backlog) and never says a word: an address that does not
    // answer, unlike a closed port, which refuses at once.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let conf = dir.0.join("ceph.conf");
    std::fs::write(
        &conf,
        format!(
            "[global]\nmon host = v2:127.0.0.1:{port}\nms bind msgr1 = false\n\
             auth client required = cephx\n[client]\nclient mount timeout = 3\n"
        ),
    )
    .unwrap();
    let lun = format!(
        "kind=rbd,pool={},image=any,conf={},id={},keyring={}",
        ceph.pool,
        conf.display(),
        ceph.id,
        ceph.keyring
    );
    let start = Instant::now();
    let out = Command::new(&bin)
        .arg("--socket-path")
        .arg(dir.0.join("vhost.sock"))
        .args(["--device-type", "blk", "--lun", &lun])
        .output()
        .unwrap();
    // A hang guard, not a timing: the connect gives up after the
    // configuration's 3 s.
    assert!(start.elapsed() < Duration::from_secs(60));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].contains(&format!(
            "cannot connect to the Ceph cluster as client.{}",
            ceph.id
        )),
        "{stderr}"
    );
    drop(silent);
}

/// LUN 0's blocks as `sqcqd rpc device_list` reports them.
fn blocks(bin: &Path, admin: &Path) -> u64 {
    let out = Command::new(bin)
        .arg("rpc")
        .arg("--admin-socket")
        .arg(admin)
        .arg("device_list")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v[0]["luns"][0]["blocks"].as_u64().unwrap()
}

/// Waits until LUN 0 has `want` blocks; a hang guard, not a timing.
fn wait_blocks(bin: &Path, admin: &Path, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = blocks(bin, admin);
        if now == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{now} blocks, not {want}, 30 s after the resize"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_image_resized_in_the_cluster_resizes_the_device() {
    let Some(ceph) = Ceph::get() else { return };
    let Some(bin) = sqcqd() else { return };
    let dir = Scratch::new("rbd", "resize");
    let admin = dir.0.join("admin.sock");
    for device in ["blk", "scsi"] {
        let image = ceph.image(&format!("resize-{device}"), "64M");
        let d = daemon(
            &bin,
            &dir.0,
            device,
            &image,
            &["--admin-socket".as_ref(), admin.as_os_str()],
        );
        assert_eq!(blocks(&bin, &admin), 131_072);
        let out = ceph.rbd(&["resize", "--no-progress", "--size", "128M", &image.spec]);
        assert!(out.status.success(), "{out:?}");
        wait_blocks(&bin, &admin, 262_144);
        // The driver sees the new capacity, and the new range keeps data.
        let (_, v) = bench_json(
            &["--socket".as_ref(), dir.0.join("vhost.sock").as_os_str()],
            &[
                "--device-type",
                device,
                "--rw",
                "randwrite",
                "--verify",
                "crc32c",
                "--offset",
                "120m",
                "--size",
                "8m",
                "--bs",
                "64k",
            ],
        );
        assert_eq!(v["sqcq"]["device"]["blocks"], 262_144, "{device}");
        assert_eq!(v["jobs"][0]["error"], 0, "{device}");
        // Shrunk in the cluster: the LUN follows (sqcqd never shrinks an
        // image itself).
        let out = ceph.rbd(&[
            "resize",
            "--no-progress",
            "--allow-shrink",
            "--size",
            "32M",
            &image.spec,
        ]);
        assert!(out.status.success(), "{out:?}");
        wait_blocks(&bin, &admin, 65_536);
        d.stop();
    }
}

/// sqcqd killed (-9) under a verified random-write load at QD32 and
/// restarted: the restarted daemon takes the image's exclusive lock over
/// from the dead one at once (it finds its dead predecessor in the
/// image's metadata, and breaks the lock, blocklisting the dead client,
/// instead of waiting about 30 s for the OSD to drop its watch),
/// resubmits what the dead one had in flight (in-flight tracking), and
/// every block reads back as written, every request completed once: on
/// virtio-blk, and on virtio-scsi with FUA writes (each a librbd write
/// then flush).
#[test]
fn sqcqd_killed_under_load_on_rbd_restarts_and_takes_the_lock_over() {
    let Some(ceph) = Ceph::get() else { return };
    let Some(bin) = sqcqd() else { return };
    // The cluster's configuration with librbd's cache on and write-back
    // from the first write, dirty data kept for 30 s: what an operator's
    // ceph.conf may say. sqcqd must not use it (a kill would lose what it
    // acknowledged).
    let conf = std::fs::read_to_string(&ceph.conf).unwrap();
    let conf = conf.replace(
        "[client]\n",
        "[client]\nrbd cache = true\nrbd cache policy = writeback\n\
         rbd cache writethrough until flush = false\nrbd cache max dirty age = 30\n",
    );
    for (device, extra) in [("blk", &[][..]), ("scsi", &["--fua"][..])] {
        let dir = Scratch::new("rbd", &format!("kill-{device}"));
        let conf_path = dir.0.join("ceph.conf");
        std::fs::write(&conf_path, &conf).unwrap();
        let mut image = ceph.image(&format!("kill-{device}"), "64M");
        image.ceph.conf = conf_path.display().to_string();
        let socket = dir.0.join("vhost.sock");
        let admin = dir.0.join("admin.sock");
        let d = daemon(
            &bin,
            &dir.0,
            device,
            &image,
            &[OsStr::new("--admin-socket"), admin.as_os_str()],
        );
        let mut bench = Command::new(BENCH)
            .arg("--socket")
            .arg(&socket)
            .args(["--device-type", device, "--rw", "randwrite"])
            .args(["--verify", "crc32c", "--bs", "4k", "--iodepth", "32"])
            .args(["--size", "48M", "--reconnect", "120", "--io-timeout", "120"])
            .args(["--eta", "never", "--output-format", "json"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Mid-load, once the load has really started (on a loaded
        // machine the bench may take longer than any fixed delay to
        // connect, and the kill would then miss it): some writes done,
        // most to come (the load lasts seconds), and before the dirty age
        // of the cache in `conf` would have written anything back.
        assert!(
            wait_for_completions(&bin, &admin, 256, &mut bench),
            "{device}: sqcq-bench ended before the kill"
        );
        let dead_pid = d.0.id();
        d.kill();
        let killed = Instant::now();
        let d = daemon(&bin, &dir.0, device, &image, &[]);
        eprintln!(
            "{device}: the restarted sqcqd listens {:?} after the kill",
            killed.elapsed()
        );
        let log = std::fs::read_to_string(dir.0.join("sqcqd.log")).unwrap();
        assert!(
            log.contains(&format!(
                "took the exclusive lock over from the dead sqcqd pid {dead_pid} "
            )),
            "{device}: the restarted sqcqd broke its dead predecessor's lock: {log}"
        );
        let out = bench.wait_with_output().unwrap();
        d.stop();
        assert!(
            out.status.success(),
            "{device}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let job = &v["jobs"][0];
        assert_eq!(job["error"], 0, "{device}");
        assert_eq!(job["sqcq"]["reconnects"], 1, "{device}: {job}");
        assert_eq!(
            job["read"]["total_ios"], 12288,
            "{device}: every block read back"
        );
    }
}

#[test]
fn rbd_luns_are_refused_under_seccomp() {
    let Some(bin) = sqcqd() else { return };
    let dir = Scratch::new("rbd", "seccomp");
    let out = Command::new(&bin)
        .arg("--socket-path")
        .arg(dir.0.join("vhost.sock"))
        .args(["--seccomp", "errno", "--lun", "kind=rbd,pool=p,image=i"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("RBD LUNs cannot be served under --seccomp"),
        "{stderr}"
    );
}
