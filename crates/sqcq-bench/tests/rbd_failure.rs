//! The Ceph test cluster failing under sqcqd (`kind=rbd`):
//!
//! - an OSD killed: the requests that reach it fail with an I/O error
//!   once the client's OSD time-out has passed, counted as `ceph_errors`;
//!   the daemon keeps answering its management API meanwhile, and once
//!   the OSD is back the same daemon serves verified I/O again;
//! - the monitor stopped (SIGSTOP: it answers nothing) under load: no
//!   worker and not the control thread waits for it, I/O goes on (or
//!   fails in bounded time), and verified I/O resumes once it is back.
//!
//! In a test binary of their own, one test at a time (`SERIAL`): the
//! other RBD tests must not run while a daemon of the cluster is down
//! (cargo test runs test binaries one after the other; for nextest,
//! `.config/nextest.toml` gives this binary the whole run to itself).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// One cluster-breaking test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn cluster(args: &str) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ceph-cluster.sh");
    let out = Command::new(script).arg(args).output();
    // Repairing the cluster while a failed test unwinds: a second panic
    // would abort and hide the first.
    if !std::thread::panicking() {
        let out = out.unwrap();
        assert!(out.status.success(), "ceph-cluster.sh {args}: {out:?}");
    }
}

/// The cluster's configuration with `timeout` (seconds) for the OSD and
/// monitor operations and the connect of this client, written into `dir`.
fn short_timeouts(ceph: &Ceph, dir: &Path, timeout: u32) -> PathBuf {
    let conf = std::fs::read_to_string(&ceph.conf).unwrap();
    let mut changed = conf.clone();
    for key in [
        "rados osd op timeout",
        "rados mon op timeout",
        "client mount timeout",
    ] {
        let line = format!("{key} = 30");
        assert!(conf.contains(&line), "{conf}");
        changed = changed.replace(&line, &format!("{key} = {timeout}"));
    }
    let path = dir.join("ceph.conf");
    std::fs::write(&path, changed).unwrap();
    path
}

/// sqcqd serving `image` as a blk disk, with an admin socket; waits until
/// it listens.
fn serve(bin: &Path, dir: &Scratch, ceph: &Ceph, conf: &Path, image: &str) -> Running {
    let socket = dir.0.join("vhost.sock");
    let lun = format!(
        "kind=rbd,pool={},image={image},conf={},id={},keyring={}",
        ceph.pool,
        conf.display(),
        ceph.id,
        ceph.keyring
    );
    let d = Running(
        Command::new(bin)
            .arg("--socket-path")
            .arg(&socket)
            .arg("--admin-socket")
            .arg(dir.0.join("admin.sock"))
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
    d
}

/// One cluster-breaking test's set-up: its turn (`SERIAL`), and sqcqd
/// serving a fresh 64 MiB image with 5 s time-outs for this client,
/// checked with one verified run. `None` (the test returns) without a
/// cluster or a daemon binary.
struct Rig {
    // Dropped in this order: the daemon stopped, then its image removed,
    // then the next test's turn.
    d: Running,
    _image: RbdImage,
    bin: PathBuf,
    dir: Scratch,
    socket: PathBuf,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Rig {
    fn new(what: &str) -> Option<Rig> {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let ceph = Ceph::get()?;
        let bin = sqcqd()?;
        let dir = Scratch::new("rbd", what);
        let conf = short_timeouts(&ceph, &dir.0, 5);
        let image = ceph.image(&format!("{what}-failure"), "64M");
        let socket = dir.0.join("vhost.sock");
        let d = serve(&bin, &dir, &ceph, &conf, &image.name);
        let (ok, v) = bench(&socket, "randwrite");
        assert!(ok, "before the failure: {}", v["jobs"][0]["error_message"]);
        Some(Rig {
            d,
            _image: image,
            bin,
            dir,
            socket,
            _serial: serial,
        })
    }
}

/// Verified writes (with `more` options) pass again within 90 s once the
/// cluster is whole: requests sent while the client's map still names
/// what failed may still time out, and the same daemon serves again once
/// it caught up, without a restart or a command.
fn passes_again(socket: &Path, dir: &Scratch, more: &[&str], when: &str) {
    let back = Instant::now();
    let (mut ok, mut v) = bench_with(socket, "randwrite", more);
    while !ok && back.elapsed() < Duration::from_secs(90) {
        (ok, v) = bench_with(socket, "randwrite", more);
    }
    assert!(
        ok,
        "{when}: {}\n{}",
        v["jobs"][0]["error_message"],
        std::fs::read_to_string(dir.0.join("sqcqd.log")).unwrap_or_default()
    );
}

/// `stats_get` through the admin socket, answered within `limit` (a
/// hang guard), else a panic.
fn stats(bin: &Path, dir: &Scratch, limit: Duration) -> Value {
    let mut child = Command::new(bin)
        .arg("rpc")
        .arg("--admin-socket")
        .arg(dir.0.join("admin.sock"))
        .arg("stats_get")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("the control thread did not answer stats_get within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A verified write-then-read run; its report and whether it succeeded.
fn bench(socket: &Path, rw: &str) -> (bool, Value) {
    bench_with(socket, rw, &[])
}

/// [`bench`] with more options.
fn bench_with(socket: &Path, rw: &str, more: &[&str]) -> (bool, Value) {
    let out = Command::new(BENCH)
        .arg("--socket")
        .arg(socket)
        .args(["--device-type", "blk", "--rw", rw, "--verify", "crc32c"])
        .args(more)
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
    let Some(mut rig) = Rig::new("osd") else {
        return;
    };
    let (bin, dir, socket) = (&rig.bin, &rig.dir, &rig.socket);

    let killed = Failure::cause("kill-osd", "start");
    let start = Instant::now();
    let (ok, v) = bench(socket, "randread");
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
    // failed requests as the cluster's, apart from other I/O errors.
    let stats = stats(bin, dir, Duration::from_secs(10));
    assert!(sum("ceph_errors", &stats) > 0, "{stats}");
    assert_eq!(sum("io_errors", &stats), 0, "{stats}");
    assert!(rig.d.0.try_wait().unwrap().is_none(), "sqcqd still runs");

    // Back with its data (BlueStore). Requests sent while the client's
    // map still names the dead OSD, or while its placement groups peer,
    // may still time out: the same daemon serves again once the client
    // caught up, without a restart or a command.
    drop(killed);
    passes_again(socket, dir, &[], "after the OSD came back");
    // SIGTERM: the daemon closes the image, so that it can be removed
    // at once (a killed one's watch would hold it for 30 s).
    rig.d.stop();
}

/// A failure of the cluster, repaired when dropped, also when the test
/// fails: an OSD killed (`kill-osd`, brought back with its data by
/// `start`) or the monitor paused (`pause-mon`, `resume-mon`).
struct Failure {
    repair: &'static str,
}

impl Failure {
    fn cause(what: &'static str, repair: &'static str) -> Self {
        cluster(what);
        Failure { repair }
    }
}

impl Drop for Failure {
    fn drop(&mut self) {
        cluster(self.repair);
    }
}

#[test]
fn a_monitor_that_stops_answering_freezes_nothing_and_io_resumes_when_it_is_back() {
    let Some(mut rig) = Rig::new("mon") else {
        return;
    };
    let (bin, dir, socket) = (&rig.bin, &rig.dir, &rig.socket);

    // Verified writes, one run after the other, while the monitor is
    // stopped for longer than every time-out of the client (5 s).
    let stop = AtomicBool::new(false);
    let runs = std::thread::scope(|s| {
        let load = s.spawn(|| {
            let mut runs = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let start = Instant::now();
                let (ok, v) = bench_with(socket, "randwrite", &["--randseed", "7"]);
                runs.push((ok, start.elapsed(), v));
            }
            runs
        });
        std::thread::sleep(Duration::from_secs(1));
        let paused = Failure::cause("pause-mon", "resume-mon");
        let until = Instant::now() + Duration::from_secs(15);
        while Instant::now() < until {
            // The control thread never waits for the cluster.
            stats(bin, dir, Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(500));
        }
        drop(paused);
        stop.store(true, Ordering::Relaxed);
        load.join().unwrap()
    });
    assert!(!runs.is_empty());
    for (ok, took, v) in &runs {
        // A hang guard, not a timing: the bench's own limit is 60 s.
        assert!(*took < Duration::from_secs(120), "a run took {took:?}");
        let msg = v["jobs"][0]["error_message"].as_str().unwrap_or("");
        assert!(
            *ok || !msg.contains("no completion"),
            "a request failed rather than hung: {msg}"
        );
    }
    assert!(rig.d.0.try_wait().unwrap().is_none(), "sqcqd still runs");

    // The monitor is back: verified writes pass again (retried while
    // the client reconnects), and what the last run wrote reads back.
    passes_again(
        socket,
        dir,
        &["--randseed", "8"],
        "after the monitor came back",
    );
    let (ok, v) = bench_with(socket, "randread", &["--randseed", "8", "--verify_only"]);
    assert!(ok, "read back: {}", v["jobs"][0]["error_message"]);
    let stats = stats(bin, dir, Duration::from_secs(10));
    eprintln!(
        "{} verified runs while the monitor was stopped, {} passed; ceph_errors {}",
        runs.len(),
        runs.iter().filter(|r| r.0).count(),
        sum("ceph_errors", &stats)
    );
    rig.d.stop();
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
