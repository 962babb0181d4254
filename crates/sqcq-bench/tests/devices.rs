//! Several devices driven at once: one sqcqd started by the bench with
//! `--devices N`, or a running one given `--socket` once per device. Each
//! job writes and reads back its own region of its own device's RAM LUN
//! (`--verify`): a write that never reached that device leaves a block
//! without its header there, and fails the run. The daemon's per-queue
//! statistics show that every device's queues served I/O.
//!
//! sqcqd is $SQCQ_TARGET_BIN, or target/{debug,release}/sqcqd; the tests
//! are skipped, saying why, when there is none.

mod common;

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use common::BENCH;

/// The device-side figures of every request queue: (device, vq,
/// completions).
fn device_queues(v: &Value) -> Vec<(u64, u64, u64)> {
    v["sqcq"]["device_stats"]["queues"]
        .as_array()
        .expect("device statistics")
        .iter()
        .map(|q| {
            let n = |k: &str| q[k].as_u64().unwrap();
            (n("device"), n("vq"), n("completions"))
        })
        .collect()
}

fn assert_every_job_verified(v: &Value, jobs: usize, what: &str) {
    let all = v["jobs"].as_array().unwrap();
    assert_eq!(all.len(), jobs, "{what}");
    for job in all {
        assert_eq!(job["error"], 0, "{what}: {job}");
        assert_eq!(job["read"]["total_ios"], 256, "{what}");
    }
}

#[test]
fn a_started_sqcqd_serves_several_devices_spread_over_its_workers() {
    let Some(bin) = common::sqcqd() else { return };
    for mode in ["notify", "sqcq-inline"] {
        let (_, v) = common::bench_json(
            &[OsStr::new("--target-bin"), bin.as_os_str()],
            &[
                "--rw",
                "randwrite",
                "--verify",
                "crc32c",
                "--size",
                "1m",
                "--iodepth",
                "4",
                "--devices",
                "2",
                "--numjobs",
                "2",
                "--target-workers",
                "2",
                "--mode",
                mode,
            ],
        );
        assert_eq!(v["sqcq"]["mode"], mode);
        assert_eq!(v["sqcq"]["device"]["devices"], 2);
        assert_every_job_verified(&v, 4, mode);
        // Both devices' two request queues (virtqueues 2 and 3) served I/O.
        let mut served: Vec<(u64, u64)> = device_queues(&v)
            .into_iter()
            .filter(|&(_, vq, done)| vq >= 2 && done > 0)
            .map(|(d, vq, _)| (d, vq))
            .collect();
        served.sort_unstable();
        assert_eq!(served, [(0, 2), (0, 3), (1, 2), (1, 3)], "{mode}");
        let workers = v["sqcq"]["target_cpu"]["threads"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["name"].as_str().unwrap().starts_with("sqcq-worker"))
            .count();
        assert_eq!(workers, 2, "{mode}");
    }
}

/// A running sqcqd with two devices, from a config file.
struct TwoDevices {
    child: std::process::Child,
    dir: PathBuf,
    sockets: [PathBuf; 2],
}

impl TwoDevices {
    fn start(bin: &std::path::Path) -> Self {
        let dir = std::env::temp_dir().join(format!("sqcq-two-devices-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sockets = [dir.join("a.sock"), dir.join("b.sock")];
        let mut config = String::from("workers = 2\n");
        for s in &sockets {
            config += &format!(
                "[[device]]\nsocket-path = {:?}\n[[device.lun]]\nkind = \"ram\"\nsize = \"8M\"\n",
                s.to_str().unwrap()
            );
        }
        let path = dir.join("sqcqd.toml");
        std::fs::write(&path, config).unwrap();
        let child = Command::new(bin)
            .arg("--config")
            .arg(&path)
            .spawn()
            .unwrap();
        let start = Instant::now();
        while !sockets.iter().all(|s| s.exists()) {
            assert!(start.elapsed().as_secs() < 10, "sqcqd did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        Self {
            child,
            dir,
            sockets,
        }
    }
}

impl Drop for TwoDevices {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn one_socket_per_device_of_a_running_target() {
    let Some(bin) = common::sqcqd() else { return };
    let daemon = TwoDevices::start(&bin);
    let (_, v) = common::bench_json(
        &[
            OsStr::new("--socket"),
            daemon.sockets[0].as_os_str(),
            OsStr::new("--socket"),
            daemon.sockets[1].as_os_str(),
        ],
        &[
            "--rw",
            "randwrite",
            "--verify",
            "crc32c",
            "--size",
            "1m",
            "--mode",
            "sqcq",
        ],
    );
    assert_eq!(v["sqcq"]["device"]["devices"], 2);
    assert_every_job_verified(&v, 2, "two sockets");
    // Not started here: no target figures.
    assert!(v["sqcq"]["target_cpu"].is_null());
}

#[test]
fn several_devices_need_a_started_sqcqd() {
    for (args, says) in [
        (
            &["--devices", "2", "--socket", "/nonexistent"][..],
            "give --socket once per device",
        ),
        (
            &["--devices", "2", "--target", "vhost-device-scsi"][..],
            "only sqcqd serves several devices",
        ),
    ] {
        let out = Command::new(BENCH).args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}
