//! End to end against the project's own daemon, sqcqd, with its
//! VIRTIO_F_SQCQ_POLL device side: every notification mode, the doorbell
//! modes' idle handshake and bursts separated by idle gaps. Idle is
//! detected by the doorbell flags and the driver poll thread's flag (the
//! bench's `--bursts`), never by sleeping; a lost wakeup ends the run with
//! an I/O timeout, a duplicate completion with "completion for an I/O not
//! in flight".
//!
//! sqcqd is $SQCQ_TARGET_BIN, or target/{debug,release}/sqcqd (build it
//! with `cargo build -p sqcq-target`); the tests are skipped, saying why,
//! when there is none. An sqcqd that does not offer bit 42 fails them.

mod common;

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

use common::BENCH;

fn bench(sqcqd: &Path, args: &[&str]) -> (Output, Value) {
    common::bench_json(&[OsStr::new("--target-bin"), sqcqd.as_os_str()], args)
}

fn ios(job: &Value) -> u64 {
    job["read"]["total_ios"].as_u64().unwrap() + job["write"]["total_ios"].as_u64().unwrap()
}

const MODES: [&str; 5] = ["notify", "poll-queue", "ring-poll", "sqcq", "sqcq-inline"];

#[test]
fn every_mode_runs_against_sqcqd() {
    let Some(bin) = common::sqcqd() else { return };
    for mode in MODES {
        for qd in ["1", "16"] {
            let (_, v) = bench(
                &bin,
                &[
                    "--rw",
                    "randrw",
                    "--size",
                    "2m",
                    "--iodepth",
                    qd,
                    "--mode",
                    mode,
                ],
            );
            assert_eq!(v["sqcq"]["mode"], mode, "{mode}: no fallback from sqcqd");
            assert!(v["sqcq"]["mode_fallback"].is_null());
            assert_eq!(ios(&v["jobs"][0]), 512, "{mode} qd{qd}");
            // Every polling mode reports its driver-side poller.
            let q = &v["sqcq"]["driver_queues"][0];
            assert_eq!(q.is_object(), mode != "notify", "{mode}");
            if mode == "poll-queue" {
                // Busy polling: no window, no sleep.
                assert_eq!(q["sleeps"], 0, "{mode}: {q}");
                assert!(q["interval_ns"].is_null(), "{mode}: {q}");
            }
            if mode != "notify" {
                assert!(q["spins"].as_u64().is_some(), "{mode}: {q}");
            }
            assert!(v["sqcq"]["device_stats"]["queues"].is_array(), "{mode}");
        }
    }
}

#[test]
fn iodepth_batch_submit_sets_how_often_new_ios_are_published() {
    let Some(bin) = common::sqcqd() else { return };
    for mode in MODES {
        let run = |batch: &str| {
            let (_, v) = bench(
                &bin,
                &[
                    "--rw",
                    "randread",
                    "--size",
                    "2m",
                    "--iodepth",
                    "16",
                    "--mode",
                    mode,
                    "--iodepth_batch_submit",
                    batch,
                ],
            );
            let job = &v["jobs"][0];
            assert_eq!(ios(job), 512, "{mode} batch {batch}");
            job["sqcq"]["publishes"].as_u64().unwrap()
        };
        // 1 (fio's default): each I/O is handed over as it is written.
        assert_eq!(run("1"), 512, "{mode}");
        // 0: everything ready at once; the first 16 go with one publish.
        let all = run("0");
        assert!(all <= 512 - 15, "{mode}: {all} publishes");
    }
}

/// Every mode writes `size` over `jobs` jobs (with `extra` arguments) in
/// blocks of `bs` and reads it back verified: 256 of each a job.
fn verify_in_every_mode(bin: &std::path::Path, extra: &[&str], size: &str, bs: &str, jobs: &str) {
    for mode in MODES {
        let mut args = extra.to_vec();
        args.extend([
            "--rw",
            "randwrite",
            "--verify",
            "crc32c",
            "--size",
            size,
            "--bs",
            bs,
            "--iodepth",
            "8",
            "--numjobs",
            jobs,
            "--mode",
            mode,
        ]);
        let (_, v) = bench(bin, &args);
        assert_eq!(v["sqcq"]["mode"], mode);
        for job in v["jobs"].as_array().unwrap() {
            assert_eq!(job["error"], 0, "{mode}");
            assert_eq!(job["write"]["total_ios"], 256, "{mode}");
            assert_eq!(job["read"]["total_ios"], 256, "{mode}");
        }
    }
}

#[test]
fn verify_passes_in_every_mode_with_several_jobs() {
    let Some(bin) = common::sqcqd() else { return };
    verify_in_every_mode(&bin, &[], "2m", "8k", "3");
}

/// `--ring packed` against `sqcqd --packed` (passed by the bench): every
/// mode verifies its data, the doorbell modes over bit 42's packed
/// doorbells (spec section 10), with bursts and idle gaps in between so
/// that both sides sleep and are woken on a packed ring too.
#[test]
fn verify_passes_on_packed_rings_in_every_mode() {
    let Some(bin) = common::sqcqd() else { return };
    verify_in_every_mode(&bin, &["--ring", "packed"], "1m", "4k", "2");
    for mode in ["sqcq", "sqcq-inline"] {
        let (_, v) = bench(
            &bin,
            &[
                "--ring",
                "packed",
                "--size",
                "400k",
                "--iodepth",
                "4",
                "--bursts",
                "10",
                "--mode",
                mode,
            ],
        );
        let job = &v["jobs"][0];
        assert_eq!(job["error"], 0, "{mode}");
        assert_eq!(job["sqcq"]["idle_gaps_asleep"], 9, "{mode}");
        assert_eq!(ios(job), 100, "{mode}");
    }
}

#[test]
fn after_idling_both_sides_sleep_and_the_next_submission_wakes_them() {
    let Some(bin) = common::sqcqd() else { return };
    for mode in ["sqcq", "sqcq-inline"] {
        // Two bursts: between them the job waits (bounded) until the
        // driver's CQ consumer (the poll thread; inline, the job itself,
        // parked) asked for a call with CQ NEED_WAKEUP, and the device's
        // poller for a kick with SQ NEED_WAKEUP.
        let (_, v) = bench(
            &bin,
            &[
                "--size",
                "64k",
                "--iodepth",
                "1",
                "--bursts",
                "2",
                "--mode",
                mode,
            ],
        );
        let job = &v["jobs"][0];
        assert_eq!(job["sqcq"]["idle_gaps_asleep"], 1, "{mode}");
        assert_eq!(ios(job), 16, "{mode}");
        // The first submission after the gap found the device asleep and
        // kicked; the device found the CQ consumer asleep and called.
        assert!(v["sqcq"]["kicks"].as_u64().unwrap() >= 1, "{mode}");
        let q = &v["sqcq"]["driver_queues"][0];
        assert!(q["sleeps"].as_u64().unwrap() >= 1, "{mode}: {q}");
        // The job's own figures end with its last completion, which a
        // spinning submitter can reap before the poll thread has woken to
        // read the call: the poll thread's count, taken after the run,
        // holds every call. Inline, the job reads its call eventfd itself.
        let calls = match mode {
            "sqcq" => q["calls"].as_u64(),
            _ => v["sqcq"]["calls"].as_u64(),
        };
        assert!(calls.unwrap() >= 1, "{mode}: {v}");
    }
}

#[test]
fn bursts_and_idle_gaps_complete_every_request_exactly_once() {
    let Some(bin) = common::sqcqd() else { return };
    for (mode, threads) in [
        ("sqcq", "per-device"),
        ("sqcq", "per-queue"),
        ("sqcq-inline", "per-device"),
    ] {
        let (_, v) = bench(
            &bin,
            &[
                "--rw",
                "randrw",
                "--size",
                "400k",
                "--bs",
                "4k",
                "--iodepth",
                "4",
                "--numjobs",
                "2",
                "--bursts",
                "50",
                "--mode",
                mode,
                "--poll-threads",
                threads,
            ],
        );
        for job in v["jobs"].as_array().unwrap() {
            assert_eq!(job["error"], 0, "{mode} {threads}");
            assert_eq!(ios(job), 100, "{mode} {threads}");
            assert_eq!(job["sqcq"]["idle_gaps_asleep"], 49, "{mode} {threads}");
        }
        assert!(v["sqcq"]["kicks"].as_u64().unwrap() >= 49);
    }
}

#[test]
fn a_daemon_withholding_bit_42_gets_notify() {
    let Some(bin) = common::sqcqd() else { return };
    let help = Command::new(&bin).arg("--help").output().unwrap();
    if !String::from_utf8_lossy(&help.stdout).contains("--no-sqcq") {
        eprintln!("SKIPPED: this sqcqd cannot withhold bit 42");
        return;
    }
    let dir = std::env::temp_dir().join(format!("sqcq-nosqcq-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("sock");
    let mut child = Command::new(&bin)
        .arg("--socket-path")
        .arg(&socket)
        .args(["--lun", "kind=null,size=64m", "--no-sqcq"])
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while !socket.exists() {
        assert!(start.elapsed().as_secs() < 10, "sqcqd did not start");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let out = Command::new(BENCH)
        .arg("--socket")
        .arg(&socket)
        .args([
            "--size",
            "1m",
            "--mode",
            "sqcq",
            "--eta",
            "never",
            "--output-format",
            "json",
        ])
        .output()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("falls back to notify"), "{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["sqcq"]["mode"], "notify");
    assert_eq!(v["sqcq"]["mode_fallback"]["requested"], "sqcq");
}

#[test]
fn verify_passes_with_jobs_spread_over_two_device_workers() {
    let Some(bin) = common::sqcqd() else { return };
    for mode in ["notify", "sqcq"] {
        let (_, v) = bench(
            &bin,
            &[
                "--rw",
                "randwrite",
                "--verify",
                "crc32c",
                "--size",
                "1m",
                "--iodepth",
                "8",
                "--numjobs",
                "3",
                "--target-workers",
                "2",
                "--mode",
                mode,
            ],
        );
        assert_eq!(v["sqcq"]["mode"], mode);
        for job in v["jobs"].as_array().unwrap() {
            assert_eq!(job["error"], 0, "{mode}");
            assert_eq!(job["read"]["total_ios"], 256, "{mode}");
        }
        // The daemon runs the two workers asked for, and the report
        // accounts for each of them.
        let mut workers: Vec<&str> = v["sqcq"]["target_cpu"]["threads"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["name"].as_str())
            .filter(|n| n.starts_with("sqcq-worker"))
            .collect();
        workers.sort_unstable();
        assert_eq!(workers, ["sqcq-worker0", "sqcq-worker1"], "{mode}");
    }
}

#[test]
fn hugepages_back_the_driver_memory_or_are_refused_clearly() {
    let Some(bin) = common::sqcqd() else { return };
    let free: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("HugePages_Free:"))
        .map_or(0, |n| n.trim().parse().unwrap());
    let args = [
        "--rw",
        "randrw",
        "--size",
        "2m",
        "--iodepth",
        "16",
        "--mode",
        "sqcq-inline",
        "--hugepages",
    ];
    let out = Command::new(BENCH)
        .args([OsStr::new("--target-bin"), bin.as_os_str()])
        .args(["--eta", "never", "--output-format", "json"])
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        // It ran on huge pages, so there were some.
        assert!(free > 0, "ran with no huge page free");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(ios(&v["jobs"][0]), 512);
    } else {
        // A few MiB (rings, headers, 16 buffers): 3 pages of 2 MiB. With
        // 8 free, failing is a bug; with fewer, it must say why.
        assert!(free < 8, "{free} huge pages free, yet: {err}");
        assert!(err.contains("huge pages unavailable"), "{err}");
    }
}
