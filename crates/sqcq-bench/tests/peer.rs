//! End to end against rust-vmm's vhost-device-scsi (installed by
//! `scripts/install-peers.sh` into target/tools): the whole stack, from
//! the command line through the vhost-user frontend to a real device
//! process. Skipped, saying why, when the peer is not installed (a failure
//! under `SQCQ_REQUIRE_PEERS`, which the test command sets); never installs
//! it (that is the script's job).

mod common;

use std::fs::{self, File};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use common::BENCH;

fn bench(peer: &Path, args: &[&str]) -> Output {
    let out = Command::new(BENCH)
        .args(["--target", "vhost-device-scsi", "--target-bin"])
        .arg(peer)
        .args(["--io-timeout", "10", "--eta", "never"])
        .args(args)
        .output()
        .expect("sqcq-bench runs");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    out
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).expect("JSON output")
}

#[test]
fn verify_passes_against_the_peer() {
    let Some(peer) = common::vhost_device_scsi() else {
        return;
    };
    let out = bench(
        &peer,
        &[
            "--rw",
            "randwrite",
            "--verify",
            "crc32c",
            "--size",
            "4m",
            "--bs",
            "8k",
            "--iodepth",
            "4",
            "--output-format",
            "json",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let v = json(&out);
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0);
    assert_eq!(job["write"]["total_ios"], 512);
    assert_eq!(job["read"]["total_ios"], 512);
    assert_eq!(job["write"]["io_bytes"], 4 << 20);
    assert!(
        job["read"]["lat_ns"]["percentile"]["99.000000"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert_eq!(v["sqcq"]["device"]["block_size"], 512);
}

#[test]
fn every_mode_runs_against_the_peer() {
    let Some(peer) = common::vhost_device_scsi() else {
        return;
    };
    for mode in ["notify", "poll-queue", "ring-poll"] {
        for qd in ["1", "8"] {
            let out = bench(
                &peer,
                &[
                    "--rw",
                    "randrw",
                    "--size",
                    "2m",
                    "--iodepth",
                    qd,
                    "--mode",
                    mode,
                    "--output-format",
                    "json",
                ],
            );
            assert!(out.status.success(), "{mode} qd{qd}: {out:?}");
            let v = json(&out);
            let job = &v["jobs"][0];
            let ios = job["read"]["total_ios"].as_u64().unwrap()
                + job["write"]["total_ios"].as_u64().unwrap();
            assert_eq!(ios, 512, "{mode} qd{qd}: 2 MiB of 4 KiB I/Os");
            assert!(job["read"]["iops"].as_f64().unwrap() > 0.0);
            assert!(v["sqcq"]["kicks_per_io"].as_f64().unwrap() > 0.0);
        }
    }
}

#[test]
fn doorbell_modes_fall_back_to_notify_on_the_peer() {
    let Some(peer) = common::vhost_device_scsi() else {
        return;
    };
    for mode in ["sqcq", "sqcq-inline"] {
        let out = bench(
            &peer,
            &["--size", "1m", "--mode", mode, "--output-format", "json"],
        );
        assert!(out.status.success(), "{mode}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("--mode {mode} falls back to notify"))
                && stderr.contains("VIRTIO_F_SQCQ_POLL"),
            "{stderr}"
        );
        let v = json(&out);
        assert_eq!(v["sqcq"]["mode"], "notify");
        assert_eq!(v["sqcq"]["mode_requested"], mode);
        assert_eq!(v["sqcq"]["mode_fallback"]["used"], "notify");
        assert!(
            v["sqcq"]["mode_fallback"]["reason"]
                .as_str()
                .unwrap()
                .contains("bit 42")
        );
        assert_eq!(v["jobs"][0]["read"]["total_ios"], 256);
    }
}

#[test]
fn the_normal_output_reads_like_fio() {
    let Some(peer) = common::vhost_device_scsi() else {
        return;
    };
    let out = bench(&peer, &["--rw", "read", "--size", "1m", "--cdb", "16"]);
    // vhost-device-scsi 0.1.0 has no READ (16): the command fails with a
    // CHECK CONDITION, the run says so and exits non-zero.
    assert!(!out.status.success());
    let out = bench(&peer, &["--rw", "read", "--size", "1m"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "read: IOPS=",
        "lat (nsec): min=",
        "50.00th=[",
        "kicks/IO=",
        "CPU per I/O: driver=",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
}

#[test]
fn more_jobs_than_queues_is_a_usage_error() {
    let Some(peer) = common::vhost_device_scsi() else {
        return;
    };
    let out = bench(&peer, &["--numjobs", "2", "--size", "1m"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("1 request queue"));
}

struct Peer {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
}

impl Peer {
    fn start(bin: &Path, name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("sqcq-peer-test-{}-{name}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let image = dir.join("lun.img");
        File::create(&image).unwrap().set_len(64 << 20).unwrap();
        let socket = dir.join("sock");
        let child = Command::new(bin)
            .arg("--socket-path")
            .arg(&socket)
            .arg(&image)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while !socket.exists() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "peer did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Self { child, dir, socket }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn a_device_dying_mid_run_fails_the_run_quickly() {
    let Some(bin) = common::vhost_device_scsi() else {
        return;
    };
    for mode in ["notify", "poll-queue"] {
        let mut peer = Peer::start(&bin, mode);
        let mut bench = Command::new(BENCH)
            .arg("--socket")
            .arg(&peer.socket)
            .args([
                "--runtime",
                "60",
                "--time_based",
                "--iodepth",
                "4",
                "--rw",
                "randwrite",
                "--mode",
                mode,
            ])
            .args(["--io-timeout", "20", "--eta", "never"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Mid-run: once the peer has written to its (sparse) image,
        // however long the bench took to connect.
        let image = peer.dir.join("lun.img");
        let start = Instant::now();
        while fs::metadata(&image).unwrap().blocks() == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{mode}: no write reached the peer"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        peer.child.kill().unwrap();
        let start = Instant::now();
        let status = loop {
            if let Some(status) = bench.try_wait().unwrap() {
                break status;
            }
            // Well under the 20 s I/O timeout: the hangup woke the wait.
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{mode}: sqcq-bench still running after the device died"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let stderr = std::io::read_to_string(bench.stderr.take().unwrap()).unwrap();
        eprintln!("{mode}: {stderr}");
        assert_eq!(status.code(), Some(1), "{mode}");
        assert!(
            stderr.contains("closed the vhost-user socket"),
            "{mode}: {stderr}"
        );
    }
}
