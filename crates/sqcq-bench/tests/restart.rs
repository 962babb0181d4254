//! `kill -9` of the daemon under a verified random-write load at QD32:
//! with `--reconnect` the load follows the restarted daemon, which
//! resubmits what it had in flight (in-flight tracking), and finishes
//! with every block read back as written, every request completed once
//! (a second completion fails the run), in every notification mode, for
//! both device types. With FUA writes (virtio-scsi) and with write-back
//! (virtio-blk), a write acknowledged before a kill is on the file after
//! it: the verify pass reads it back through the restarted daemon, from
//! the file, at whatever random point the daemon died.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn daemon(bin: &Path, dir: &Path, device: &str, extra: &[&str]) -> Child {
    let lun = format!(
        "kind=file,path={},size=64M,create",
        dir.join("disk").display()
    );
    let _ = std::fs::remove_file(dir.join("admin.sock"));
    Command::new(bin)
        .args(["--socket-path"])
        .arg(dir.join("vhost.sock"))
        .arg("--admin-socket")
        .arg(dir.join("admin.sock"))
        .args(["--device-type", device, "--lun", &lun])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("sqcqd starts")
}

/// A small deterministic sequence of pauses (no shared RNG crate needed).
fn pauses(seed: u64) -> impl Iterator<Item = Duration> {
    let mut x = seed | 1;
    std::iter::from_fn(move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        Some(Duration::from_millis(60 + x % 300))
    })
}

/// Runs the load against a daemon killed with SIGKILL and restarted
/// `kills` times at pseudo-random moments; returns the report.
fn killed_under_load(
    name: &str,
    device: &str,
    mode: &str,
    daemon_args: &[&str],
    bench_args: &[&str],
    kills: usize,
) -> Value {
    let Some(bin) = sqcqd() else {
        return Value::Null;
    };
    let dir = Scratch::new("restart", name);
    let socket = dir.0.join("vhost.sock");
    let mut d = daemon(&bin, &dir.0, device, daemon_args);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(Instant::now() < deadline, "the daemon listens");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut bench = Command::new(BENCH)
        .arg("--socket")
        .arg(&socket)
        .args(["--device-type", device, "--mode", mode])
        .args([
            "--rw",
            "randwrite",
            "--bs",
            "4k",
            "--iodepth",
            "32",
            "--size",
            "48M",
        ])
        .args([
            "--verify",
            "crc32c",
            "--reconnect",
            "30",
            "--io-timeout",
            "30",
        ])
        .args(["--eta", "never", "--output-format", "json"])
        .args(bench_args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sqcq-bench starts");
    let mut killed = 0u64;
    let admin = dir.0.join("admin.sock");
    for pause in pauses(name.len() as u64 * 7919).take(kills) {
        // Each daemon is killed under load: once it has completed some
        // requests (however long the bench took to connect or
        // reconnect), then after a pseudo-random pause.
        wait_for_completions(&bin, &admin, 32, &mut bench);
        std::thread::sleep(pause);
        if bench.try_wait().unwrap().is_some() {
            break;
        }
        d.kill().unwrap();
        d.wait().unwrap();
        killed += 1;
        d = daemon(&bin, &dir.0, device, daemon_args);
    }
    let out = bench.wait_with_output().unwrap();
    let _ = d.kill();
    let _ = d.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{name}: the load failed after {killed} kills: {stderr}"
    );
    assert!(
        killed > 0,
        "{name}: the load ended before the first kill: make it longer"
    );
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let reconnects: u64 = json["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["sqcq"]["reconnects"].as_u64().unwrap())
        .sum();
    assert!(
        (1..=killed).contains(&reconnects),
        "{name}: {reconnects} reconnects for {killed} kills"
    );
    json
}

#[test]
fn blk_survives_kill_9_in_every_mode() {
    for (mode, daemon_args) in MODES {
        killed_under_load(&format!("blk-{mode}"), "blk", mode, daemon_args, &[], 3);
    }
}

#[test]
fn scsi_fua_writes_survive_kill_9_in_every_mode() {
    for (mode, daemon_args) in MODES {
        killed_under_load(
            &format!("scsi-{mode}"),
            "scsi",
            mode,
            daemon_args,
            &["--fua"],
            3,
        );
    }
}

#[test]
fn without_reconnect_a_kill_fails_the_load() {
    let Some(bin) = sqcqd() else { return };
    let dir = Scratch::new("restart", "no-reconnect");
    let socket = dir.0.join("vhost.sock");
    let mut d = daemon(&bin, &dir.0, "blk", &[]);
    while !socket.exists() {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut bench = Command::new(BENCH)
        .arg("--socket")
        .arg(&socket)
        .args([
            "--device-type",
            "blk",
            "--rw",
            "randwrite",
            "--iodepth",
            "32",
        ])
        .args(["--size", "48M", "--verify", "crc32c", "--eta", "never"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Killed under load, not before the bench connected.
    assert!(
        wait_for_completions(&bin, &dir.0.join("admin.sock"), 32, &mut bench),
        "the load ended before the kill"
    );
    d.kill().unwrap();
    d.wait().unwrap();
    let out = bench.wait_with_output().unwrap();
    assert!(
        !out.status.success(),
        "a hangup without --reconnect fails the run"
    );
}

/// The same on packed rings (`--ring packed`, `sqcqd --packed`): the
/// daemon's in-flight record of a packed ring keeps a copy of every
/// descriptor in flight, since used descriptors overwrite the ring's, and
/// the positions to continue from.
#[test]
fn packed_rings_survive_kill_9_in_every_mode() {
    for (device, fua) in [("blk", &[][..]), ("scsi", &["--fua"][..])] {
        for (mode, daemon_args) in MODES {
            let daemon_args: Vec<&str> = daemon_args.iter().copied().chain(["--packed"]).collect();
            let bench_args: Vec<&str> = fua.iter().copied().chain(["--ring", "packed"]).collect();
            killed_under_load(
                &format!("packed-{device}-{mode}"),
                device,
                mode,
                &daemon_args,
                &bench_args,
                3,
            );
        }
    }
}
