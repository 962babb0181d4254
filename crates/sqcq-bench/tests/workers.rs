//! Workers created, queues moved between them and workers freed through
//! the management API (`sqcqd rpc`) while a verified random-write load
//! runs on two request queues: every block reads back as written and
//! every request completes once (a lost request would time the load out,
//! a second completion fails it), in every notification mode, for both
//! device types. The multi-worker seed's VHOST_NEW_WORKER,
//! VHOST_ATTACH_VRING_WORKER and VHOST_FREE_WORKER, on a running device.

mod common;

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// `sqcqd rpc` against `admin`: the result, or the error object.
fn rpc(bin: &Path, admin: &Path, method: &str, params: &[&str]) -> Result<Value, Value> {
    let out = Command::new(bin)
        .arg("rpc")
        .arg("--admin-socket")
        .arg(admin)
        .arg(method)
        .args(params)
        .output()
        .expect("sqcqd rpc runs");
    let parse = |b: &[u8]| serde_json::from_slice(b).unwrap_or(Value::Null);
    match out.status.code() {
        Some(0) => Ok(parse(&out.stdout)),
        Some(1) => Err(parse(&out.stderr)),
        _ => panic!("{method}: {}", String::from_utf8_lossy(&out.stderr)),
    }
}

fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(Instant::now() < deadline, "{} appears", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Moves the two request queues of device 0 around three workers (the
/// third created for the run) while the load runs; returns the load's
/// report and how many moves found the queue running.
fn moved_under_load(name: &str, device: &str, mode: &str, daemon_args: &[&str]) -> (Value, u64) {
    let Some(bin) = sqcqd() else {
        return (Value::Null, 0);
    };
    let dir = Scratch::new("workers", name);
    let (socket, admin) = (dir.0.join("vhost.sock"), dir.0.join("admin.sock"));
    let lun = format!(
        "kind=file,path={},size=64M,create",
        dir.0.join("disk").display()
    );
    let _d = Daemon(
        Command::new(&bin)
            .arg("--socket-path")
            .arg(&socket)
            .arg("--admin-socket")
            .arg(&admin)
            .args(["--device-type", device, "--lun", &lun])
            .args(["--num-queues", "2", "--workers", "2"])
            .args(daemon_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("sqcqd starts"),
    );
    wait_for(&socket);
    wait_for(&admin);
    let created = rpc(&bin, &admin, "worker_create", &[]).expect("worker_create");
    let third = created["worker"].as_u64().unwrap();
    assert_eq!(third, 2, "the lowest free number");
    let mut bench = Command::new(BENCH)
        .arg("--socket")
        .arg(&socket)
        .args(["--device-type", device, "--mode", mode])
        .args(["--rw", "randwrite", "--bs", "4k", "--iodepth", "32"])
        .args(["--numjobs", "2", "--size", "24M"])
        .args(["--verify", "crc32c", "--io-timeout", "30"])
        .args(["--eta", "never", "--output-format", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sqcq-bench starts");
    // From the first completions on (however long the bench takes to
    // connect), round after round, each queue goes to the next worker.
    wait_for_completions(&bin, &admin, 32, &mut bench);
    let mut running_moves = 0u64;
    let mut round = 0u64;
    let mut bench = Some(bench);
    while let Some(b) = bench.as_mut() {
        if b.try_wait().unwrap().is_some() {
            break;
        }
        for rq in 0..2u64 {
            let worker = (round + rq) % 3;
            let r = rpc(
                &bin,
                &admin,
                "queue_attach_worker",
                &["device=0", &format!("rq={rq}"), &format!("worker={worker}")],
            )
            .expect("queue_attach_worker");
            if let Some(m) = r["moved"].as_object() {
                assert_eq!(m["to"].as_u64(), Some(worker), "{r}");
                running_moves += 1;
            }
        }
        round += 1;
        std::thread::sleep(Duration::from_millis(40));
        if round > 2000 {
            break;
        }
    }
    let out = bench.take().unwrap().wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{name}: the load failed after {running_moves} moves: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        running_moves >= 4,
        "{name}: only {running_moves} moves found a running queue: make the load longer"
    );
    // The queues are where they were last attached, and a worker with a
    // queue is not freed; once its queues are elsewhere it is.
    // The load disconnected: its queues stop (the control thread tears
    // the connection down a moment after the last completion).
    let deadline = Instant::now() + Duration::from_secs(10);
    let queues = loop {
        let devices = rpc(&bin, &admin, "device_list", &[]).unwrap();
        let queues = devices[0]["queues"].as_array().unwrap().clone();
        if queues.iter().all(|q| q["worker"].is_null()) {
            break queues;
        }
        assert!(Instant::now() < deadline, "the queues stop: {queues:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let on_third: Vec<u64> = queues
        .iter()
        .filter(|q| q["assigned_worker"].as_u64() == Some(third))
        .map(|q| q["rq"].as_u64().unwrap())
        .collect();
    if !on_third.is_empty() {
        let e = rpc(&bin, &admin, "worker_free", &[&format!("worker={third}")])
            .expect_err("a worker with an attached queue is not freed");
        assert_eq!(e["code"], -32002, "{e}");
    }
    for rq in &on_third {
        rpc(
            &bin,
            &admin,
            "queue_attach_worker",
            &["device=0", &format!("rq={rq}"), "worker=0"],
        )
        .unwrap();
    }
    rpc(&bin, &admin, "worker_free", &[&format!("worker={third}")]).expect("worker_free");
    let workers = rpc(&bin, &admin, "worker_list", &[]).unwrap();
    let ids: Vec<u64> = workers
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, vec![0, 1]);
    (
        serde_json::from_slice(&out.stdout).expect("JSON report"),
        running_moves,
    )
}

#[test]
fn blk_queues_move_between_workers_under_load_in_every_mode() {
    for (mode, daemon_args) in MODES {
        moved_under_load(&format!("blk-{mode}"), "blk", mode, daemon_args);
    }
}

#[test]
fn scsi_queues_move_between_workers_under_load_in_every_mode() {
    for (mode, daemon_args) in MODES {
        moved_under_load(&format!("scsi-{mode}"), "scsi", mode, daemon_args);
    }
}

#[test]
fn run_time_changes_work_under_the_strictest_seccomp_filter() {
    // Workers created and queues moved: new threads under the filter.
    moved_under_load("seccomp", "blk", "notify", &["--seccomp", "kill"]);
    // A device created at run time: a new socket and control thread.
    let Some(bin) = sqcqd() else { return };
    let dir = Scratch::new("workers", "seccomp-device");
    let admin = dir.0.join("admin.sock");
    let _d = Daemon(
        Command::new(&bin)
            .arg("--socket-path")
            .arg(dir.0.join("first.sock"))
            .arg("--admin-socket")
            .arg(&admin)
            .args(["--lun", "kind=null,size=1G", "--seccomp", "kill"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("sqcqd starts"),
    );
    wait_for(&admin);
    let socket = dir.0.join("new.sock");
    let lun = format!(
        "lun:=[\"kind=file,path={},size=16M,create\"]",
        dir.0.join("disk").display()
    );
    let created = rpc(
        &bin,
        &admin,
        "device_create",
        &[
            &format!("socket-path={}", socket.display()),
            "type=blk",
            &lun,
        ],
    )
    .expect("device_create under seccomp");
    assert_eq!(created["device"], 1);
    let (_, report) = bench_json(
        &[OsStr::new("--socket"), socket.as_os_str()],
        &["--device-type", "blk", "--rw", "randwrite", "--size", "4M"],
    );
    assert_eq!(report["jobs"][0]["write"]["total_ios"], 1024, "{report}");
    rpc(&bin, &admin, "device_delete", &["device=1"]).expect("device_delete");
    assert!(!socket.exists());
    // The daemon is alive (a forbidden call would have killed it).
    rpc(&bin, &admin, "daemon_info", &[]).expect("still running");
}
