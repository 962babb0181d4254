//! `--device-type blk` end to end: the bench's virtio-blk request layer
//! against sqcqd's vhost-user-blk device in every notification mode (bit
//! 42 included), and against QEMU's qemu-storage-daemon, the public peer,
//! in the classic modes (it does not know bit 42: the doorbell modes fall
//! back to notify). Every run writes a region and reads it back with
//! `--verify crc32c`, so a wrong sector, a lost write or a misread status
//! fails it; the counts say every I/O was done once.
//!
//! sqcqd is $SQCQ_TARGET_BIN or target/{debug,release}/sqcqd (`cargo
//! build -p sqcq-target`); qemu-storage-daemon is $SQCQ_QSD_BIN or in PATH
//! (Debian's qemu-system-common, installed by scripts/setup.sh). Each test
//! is skipped, saying why, when its target is missing (a failure under
//! `SQCQ_REQUIRE_PEERS`, see `common`).

mod common;

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

use common::BENCH;

/// Runs the bench against `target` started from `bin`; returns its output
/// and its JSON report, asserting it succeeded.
fn bench(target: &str, bin: &Path, args: &[&str]) -> (Output, Value) {
    let start = ["--device-type", "blk", "--target", target, "--target-bin"].map(OsStr::new);
    common::bench_json(&[&start[..], &[bin.as_os_str()]].concat(), args)
}

/// A verify run of `jobs` jobs over 2 MiB each in 8 KiB I/Os at QD8;
/// checks every job wrote and read back all of its 256 units.
fn verify(target: &str, bin: &Path, mode: &str, jobs: &str, more: &[&str]) -> (Output, Value) {
    let (out, v) = bench(
        target,
        bin,
        &[
            &[
                "--rw",
                "randwrite",
                "--verify",
                "crc32c",
                "--size",
                "2m",
                "--bs",
                "8k",
                "--iodepth",
                "8",
                "--numjobs",
                jobs,
                "--mode",
                mode,
            ][..],
            more,
        ]
        .concat(),
    );
    let n: usize = jobs.parse().unwrap();
    assert_eq!(v["jobs"].as_array().unwrap().len(), n, "{target} {mode}");
    for (i, job) in v["jobs"].as_array().unwrap().iter().enumerate() {
        assert_eq!(job["error"], 0, "{target} {mode} job {i}");
        assert_eq!(job["write"]["total_ios"], 256, "{target} {mode} job {i}");
        assert_eq!(job["read"]["total_ios"], 256, "{target} {mode} job {i}");
        assert_eq!(job["read"]["io_bytes"], 2 << 20, "{target} {mode} job {i}");
    }
    let device = &v["sqcq"]["device"];
    assert_eq!(device["device_type"], "blk");
    assert_eq!(device["block_size"], 512);
    // The disk holds every job's region: 2 MiB each, in 512-byte blocks.
    assert_eq!(device["blocks"], n as u64 * 4096, "{target} {mode}");
    assert_eq!(device["request_queues"], n as u64, "{target} {mode}");
    (out, v)
}

const MODES: [&str; 5] = ["notify", "poll-queue", "ring-poll", "sqcq", "sqcq-inline"];

#[test]
fn verify_passes_against_sqcqd_in_every_mode() {
    let Some(bin) = common::sqcqd() else { return };
    for mode in MODES {
        let (_, v) = verify("sqcqd", &bin, mode, "2", &[]);
        assert_eq!(v["sqcq"]["mode"], mode, "{mode}: no fallback from sqcqd");
        assert!(v["sqcq"]["mode_fallback"].is_null(), "{mode}");
        assert_eq!(v["sqcq"]["device"]["serial"], "vhost.sock", "GET_ID");
        assert!(v["sqcq"]["device_stats"]["queues"].is_array(), "{mode}");
    }
}

#[test]
fn every_rw_and_depth_runs_against_sqcqd() {
    let Some(bin) = common::sqcqd() else { return };
    let runs = [
        ("read", "1"),
        ("write", "32"),
        ("randread", "32"),
        ("randwrite", "1"),
        ("randrw", "8"),
    ];
    for (rw, qd) in runs {
        let (_, v) = bench(
            "sqcqd",
            &bin,
            &[
                "--rw",
                rw,
                "--size",
                "1m",
                "--iodepth",
                qd,
                "--mode",
                "sqcq",
            ],
        );
        let job = &v["jobs"][0];
        let (reads, writes) = (
            job["read"]["total_ios"].as_u64().unwrap(),
            job["write"]["total_ios"].as_u64().unwrap(),
        );
        assert_eq!(reads + writes, 256, "{rw} qd{qd}: 1 MiB of 4 KiB I/Os");
        assert_eq!(reads == 0, rw.contains("write"), "{rw}: {reads} reads");
    }
}

#[test]
fn verify_passes_against_qemu_storage_daemon() {
    let Some(bin) = common::qsd() else { return };
    for mode in ["notify", "poll-queue", "ring-poll"] {
        let (_, v) = verify("qemu-storage-daemon", &bin, mode, "2", &[]);
        assert_eq!(v["sqcq"]["mode"], mode);
        assert_eq!(v["sqcq"]["device"]["target"], "qemu-storage-daemon");
        assert!(v["sqcq"]["kicks_per_io"].as_f64().unwrap() > 0.0, "{mode}");
    }
    // It does not offer bit 42: the doorbell modes run as notify, saying
    // so, and still verify.
    for mode in ["sqcq", "sqcq-inline"] {
        let (out, v) = verify("qemu-storage-daemon", &bin, mode, "1", &[]);
        assert_eq!(v["sqcq"]["mode"], "notify");
        assert_eq!(v["sqcq"]["mode_requested"], mode);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("--mode {mode} falls back to notify")),
            "{stderr}"
        );
    }
}

/// `--target-file`: both targets serve an existing file, all of it, and
/// what the verify run wrote is in the file afterwards.
#[test]
fn an_existing_file_is_served_by_sqcqd_and_qemu_storage_daemon() {
    let targets = [
        ("sqcqd", common::sqcqd()),
        ("qemu-storage-daemon", common::qsd()),
    ];
    for (target, bin) in targets {
        let Some(bin) = bin else { continue };
        let dir = std::env::temp_dir().join(format!("sqcq-file-{target}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("disk.img");
        // Two jobs' regions of 2 MiB: the file is the whole disk.
        std::fs::File::create(&path)
            .unwrap()
            .set_len(4 << 20)
            .unwrap();
        let file = path.to_str().unwrap();
        let (_, v) = verify(target, &bin, "ring-poll", "2", &["--target-file", file]);
        assert_eq!(v["sqcq"]["device"]["target"], target);
        let data = std::fs::read(&path).unwrap();
        let written = data
            .chunks(512)
            .filter(|b| b.iter().any(|&x| x != 0))
            .count();
        assert_eq!(written, 8192, "{target}: every block of the file written");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn the_wrong_target_for_the_device_type_is_a_usage_error() {
    let out = Command::new(BENCH)
        .args([
            "--device-type",
            "blk",
            "--target",
            "vhost-device-scsi",
            "--eta",
            "never",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not serve --device-type blk"));
    let out = Command::new(BENCH)
        .args(["--device-type", "blk", "--fua", "--eta", "never"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
