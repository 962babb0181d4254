//! What the soak (scripts/soak.sh) needs of the load generator, each
//! against the real sqcqd: a SCSI LUN resized under load (the commands
//! that meet the unit attention are sent again, as Linux does), the memory
//! table sent again while the jobs run, a first connection that waits for
//! the daemon with `--reconnect`, and `--verify_only` reading back what an
//! earlier run wrote (and failing on another run's data).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A sqcqd serving a `device` of two request queues on a 64 MiB file,
/// with an admin socket; its log in `dir/sqcqd.log`.
fn daemon(bin: &Path, dir: &Path, device: &str) -> Child {
    let lun = format!(
        "kind=file,path={},size=64M,create",
        dir.join("disk").display()
    );
    Command::new(bin)
        .arg("--socket-path")
        .arg(dir.join("vhost.sock"))
        .arg("--admin-socket")
        .arg(dir.join("admin.sock"))
        .args(["--device-type", device, "--lun", &lun, "--num-queues", "2"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("sqcqd.log")).unwrap())
        .spawn()
        .expect("sqcqd starts")
}

fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(Instant::now() < deadline, "{} appears", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// sqcq-bench on `dir`'s socket: a verified random write of 2 x 16 MiB.
fn bench(dir: &Path, device: &str, extra: &[&str]) -> Command {
    let mut c = Command::new(BENCH);
    c.arg("--socket")
        .arg(dir.join("vhost.sock"))
        .args(["--device-type", device, "--numjobs", "2", "--iodepth", "16"])
        .args(["--rw", "randwrite", "--size", "16M", "--verify", "crc32c"])
        .args([
            "--io-timeout",
            "20",
            "--eta",
            "never",
            "--stats-interval",
            "0",
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn rpc(bin: &Path, dir: &Path, args: &[&str]) -> String {
    let out = Command::new(bin)
        .args(["rpc", "--admin-socket"])
        .arg(dir.join("admin.sock"))
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "rpc {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stop(mut d: Child, dir: &Path, out: &Output) {
    let _ = d.kill();
    let _ = d.wait();
    assert!(
        out.status.success(),
        "sqcq-bench failed: {}\nsqcqd log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(dir.join("sqcqd.log")).unwrap_or_default()
    );
}

fn setup(name: &str, device: &str) -> Option<(PathBuf, Scratch, Child)> {
    let bin = sqcqd()?;
    let dir = Scratch::new("disorder", name);
    let d = daemon(&bin, &dir.0, device);
    wait_for(&dir.0.join("admin.sock"));
    Some((bin, dir, d))
}

#[test]
fn a_scsi_lun_resized_under_load_costs_no_io() {
    let Some((bin, dir, d)) = setup("resize", "scsi") else {
        return;
    };
    let mut run = bench(&dir.0, "scsi", &[]).spawn().unwrap();
    // Two resizes while the load runs (CAPACITY DATA HAS CHANGED each
    // time), each once requests completed since the last, then the run
    // goes on to its end.
    let admin = dir.0.join("admin.sock");
    for size in ["80M", "96M"] {
        let n = completions(&bin, &admin) + 32;
        assert!(
            wait_for_completions(&bin, &admin, n, &mut run),
            "the load ended before the resize to {size}"
        );
        rpc(
            &bin,
            &dir.0,
            &["lun_resize", "device=0", "lun=0", &format!("size={size}")],
        );
    }
    let out = run.wait_with_output().unwrap();
    stop(d, &dir.0, &out);
}

#[test]
fn the_memory_table_is_sent_again_while_the_jobs_run() {
    for device in ["scsi", "blk"] {
        let Some((_, dir, d)) = setup(&format!("memtable-{device}"), device) else {
            return;
        };
        let out = bench(
            &dir.0,
            device,
            &["--mem-table-interval", "20ms", "--mode", "sqcq"],
        )
        .output()
        .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        stop(d, &dir.0, &out);
        let sent = stderr
            .split("memory table sent again ")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|n| n.parse::<u64>().ok());
        assert!(sent.is_some_and(|n| n > 0), "{device}: {stderr}");
        assert!(stderr.contains("times, 0 failed"), "{device}: {stderr}");
    }
}

#[test]
fn reconnect_waits_for_the_first_connection_too() {
    let Some(bin) = sqcqd() else {
        return;
    };
    let dir = Scratch::new("disorder", "first");
    let run = bench(&dir.0, "blk", &["--reconnect", "20"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let d = daemon(&bin, &dir.0, "blk");
    let out = run.wait_with_output().unwrap();
    stop(d, &dir.0, &out);
}

#[test]
fn verify_only_reads_back_an_earlier_run_and_catches_another_seed() {
    let Some((_, dir, d)) = setup("verify-only", "blk") else {
        return;
    };
    let write = bench(&dir.0, "blk", &["--randseed", "7"]).output().unwrap();
    assert!(write.status.success(), "{write:?}");
    let check = |seed: &str| {
        bench(&dir.0, "blk", &["--randseed", seed, "--verify_only"])
            .output()
            .unwrap()
    };
    let same = check("7");
    assert!(same.status.success(), "{same:?}");
    let report = String::from_utf8_lossy(&same.stdout);
    assert!(report.contains("READ:"), "{report}");
    assert!(
        !report.contains("WRITE: bw="),
        "verify_only writes nothing: {report}"
    );
    let other = check("8");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&other.stdout),
        String::from_utf8_lossy(&other.stderr)
    );
    stop(d, &dir.0, &same);
    assert!(!other.status.success(), "another seed's data passed: {all}");
    assert!(all.contains("a write was lost"), "{all}");
}
