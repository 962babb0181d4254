//! An OSD of the Ceph test cluster killed under sqcqd (`kind=rbd`): the
//! requests that reach it fail with an I/O error once the client's OSD
//! time-out has passed, the daemon keeps answering its management API
//! meanwhile, and once the OSD is back the same daemon serves verified
//! I/O again. In a file of its own: the other RBD tests must not run
//! while the OSD is down.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn cluster(args: &str) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ceph-cluster.sh");
    let out = Command::new(script).arg(args).output().unwrap();
    assert!(out.status.success(), "ceph-cluster.sh {args}: {out:?}");
}

/// A verified write-then-read run; its report and whether it succeeded.
fn bench(socket: &Path, rw: &str) -> (bool, Value) {
    let out = Command::new(BENCH)
        .arg("--socket")
        .arg(socket)
        .args(["--device-type", "blk", "--rw", rw, "--verify", "crc32c"])
        .args(["--size", "2m", "--bs", "16k", "--iodepth", "4"])
        .args([
            "--io-timeout",
            "60",
            "--eta",
            "never",
            "--output-format",
            "json",
        ])
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.success(), v)
}

#[test]
fn a_dead_osd_fails_requests_in_bounded_time_and_io_resumes_when_it_is_back() {
    let Some(ceph) = Ceph::get() else { return };
    let Some(bin) = sqcqd() else { return };
    let dir = Scratch::new("rbd", "osd");
    // The cluster's configuration with a 5 s OSD time-out for this client.
    let conf = std::fs::read_to_string(&ceph.conf).unwrap();
    assert!(conf.contains("rados osd op timeout = 30"), "{conf}");
    let conf = conf.replace("rados osd op timeout = 30", "rados osd op timeout = 5");
    let conf_path = dir.0.join("ceph.conf");
    std::fs::write(&conf_path, conf).unwrap();
    let image = ceph.image("osd-failure", "64M");
    let socket = dir.0.join("vhost.sock");
    let admin = dir.0.join("admin.sock");
    let lun = format!(
        "kind=rbd,pool={},image={},conf={},id={},keyring={}",
        ceph.pool,
        image.name,
        conf_path.display(),
        ceph.id,
        ceph.keyring
    );
    let mut d = Running(
        Command::new(&bin)
            .arg("--socket-path")
            .arg(&socket)
            .arg("--admin-socket")
            .arg(&admin)
            .args(["--device-type", "blk", "--lun", &lun])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.0.join("sqcqd.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !socket.exists() {
        assert!(Instant::now() < deadline, "sqcqd listens");
        std::thread::sleep(Duration::from_millis(10));
    }
    let (ok, v) = bench(&socket, "randwrite");
    assert!(ok, "before the failure: {}", v["jobs"][0]["error_message"]);

    cluster("kill-osd");
    let start = Instant::now();
    let (ok, v) = bench(&socket, "randread");
    // A hang guard, not a timing: the bench's own limit is 60 s.
    assert!(start.elapsed() < Duration::from_secs(120));
    assert!(!ok, "no OSD, yet the reads succeeded");
    assert_ne!(v["jobs"][0]["error"], 0);
    let msg = v["jobs"][0]["error_message"].as_str().unwrap_or("");
    assert!(
        !msg.contains("no completion"),
        "the request failed rather than hung: {msg}"
    );
    // The control thread answers while the OSD is gone, and counts the
    // failed requests.
    let out = Command::new(&bin)
        .arg("rpc")
        .arg("--admin-socket")
        .arg(&admin)
        .arg("stats_get")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stats: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(sum("io_errors", &stats) > 0, "{stats}");
    assert!(d.0.try_wait().unwrap().is_none(), "sqcqd still runs");

    // Back with its data (BlueStore). Requests sent while the client's
    // map still names the dead OSD, or while its placement groups peer,
    // may still time out: the same daemon serves again once the client
    // caught up, without a restart or a command.
    cluster("start");
    let back = Instant::now();
    let (mut ok, mut v) = bench(&socket, "randwrite");
    while !ok && back.elapsed() < Duration::from_secs(90) {
        (ok, v) = bench(&socket, "randwrite");
    }
    assert!(
        ok,
        "after the OSD came back: {}\n{}",
        v["jobs"][0]["error_message"],
        std::fs::read_to_string(dir.0.join("sqcqd.log")).unwrap_or_default()
    );
    // SIGTERM: the daemon closes the image, so that it can be removed
    // at once (a killed one's watch would hold it for 30 s).
    d.stop();
}

/// The sum of every `key` in `v`, at any depth.
fn sum(key: &str, v: &Value) -> u64 {
    match v {
        Value::Object(m) => m
            .iter()
            .map(|(k, x)| {
                if k == key {
                    x.as_u64().unwrap_or(0)
                } else {
                    sum(key, x)
                }
            })
            .sum(),
        Value::Array(a) => a.iter().map(|x| sum(key, x)).sum(),
        _ => 0,
    }
}
