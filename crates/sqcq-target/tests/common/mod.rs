//! What the daemon tests share: a daemon started in process, temporary
//! directories, bounded waits, and three ways to talk to the daemon:
//!
//! - [`driver`]: sqcq-driver, the project's own userspace virtio-scsi
//!   driver (the one sqcq-bench runs). Every test of correct behaviour
//!   drives the target through it; [`blk_driver`] is its virtio-blk
//!   layer (`sqcq-bench --device-type blk`), for the blk device.
//! - [`raw_ring`]: split rings laid out by hand and requests built byte by
//!   byte, for hostile-input tests only: descriptor loops, bad addresses,
//!   corrupt indices, doorbell values no driver would write.
//! - [`raw`]: raw vhost-user messages, for hostile-frontend tests only.
//!
//! and [`rpc`] for the management API on the admin socket.
//!
//! Every wait has a deadline so that a bug fails the test instead of
//! hanging it.

#![allow(dead_code)]

pub mod blk_driver;
pub mod blocked;
pub mod driver;
pub mod raw;
pub mod raw_ring;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use sqcq_target::Daemon;
use sqcq_target::config::{
    BackstoreKind, DaemonConfig, DeviceConfig, LunSpec, PollOptions, QueueMap,
};
use vmm_sys_util::eventfd::EventFd;

/// Descriptors per virtqueue (the daemon's `--queue-size`).
pub const QUEUE_SIZE: u16 = 64;

/// The bound on every wait.
pub const WAIT: Duration = Duration::from_secs(10);

/// A unique temporary directory, removed on drop unless the test failed:
/// then it stays, and the daemon logs in it (`*.log`) are printed into the
/// test's output, so that a failure always leaves its logs.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("sqcq-target-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self, f: &str) -> PathBuf {
        self.0.join(f)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            keep_logs(&self.0);
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Prints the logs of a failed test's directory `dir`, which stays.
fn keep_logs(dir: &std::path::Path) {
    eprintln!("the test failed: {} kept", dir.display());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for path in entries.flatten().map(|e| e.path()) {
        if path.extension().is_some_and(|e| e == "log") {
            eprintln!(
                "---- {}:\n{}",
                path.display(),
                std::fs::read_to_string(&path).unwrap_or_default()
            );
        }
    }
}

/// Polls `done` until it holds; fails the test after [`WAIT`].
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "not within {WAIT:?}: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits, bounded, until `fd` (non-blocking) has been signalled.
pub fn wait_signalled(fd: &EventFd, what: &str) {
    wait_until(&format!("{what} signalled"), || fd.read().is_ok());
}

/// Error or event counter `name` of the daemon's first device.
pub fn counter(d: &Daemon, name: &str) -> u64 {
    let device = d.device(0).unwrap();
    let m = &device.info.metrics;
    m.errors()
        .into_iter()
        .chain(m.events())
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no counter {name}"))
        .1
}

pub fn lun(kind: BackstoreKind, size: u64) -> LunSpec {
    LunSpec {
        size: Some(size),
        ..LunSpec::new(kind)
    }
}

/// A daemon with one SCSI device of two request queues: LUN 0 is 8 MiB of
/// RAM, LUN 1 a null LUN of 1 GiB.
pub fn start(dir: &TempDir, workers: usize) -> (Daemon, PathBuf) {
    start_with(dir, workers, PollOptions::default())
}

/// Like [`start`], with poll options (`--no-sqcq`, `--poll ring`, ...).
pub fn start_with(dir: &TempDir, workers: usize, poll: PollOptions) -> (Daemon, PathBuf) {
    let (config, socket) = config_with(dir, workers, poll);
    config.validate().unwrap();
    (Daemon::start(&config).unwrap(), socket)
}

/// The configuration [`start_with`] starts, and its device's socket.
pub fn config_with(dir: &TempDir, workers: usize, poll: PollOptions) -> (DaemonConfig, PathBuf) {
    let socket = dir.path("scsi.sock");
    let config = DaemonConfig {
        poll,
        workers,
        admin_socket: None,
        seccomp: Default::default(),
        service: Default::default(),
        devices: vec![DeviceConfig {
            device_type: sqcq_target::config::DeviceType::Scsi,
            socket_path: socket.clone(),
            luns: vec![
                lun(BackstoreKind::Ram, 8 << 20),
                lun(BackstoreKind::Null, 1 << 30),
            ],
            num_queues: 2,
            queue_size: QUEUE_SIZE,
            queue_map: if workers > 1 {
                QueueMap(vec![(0, 0), (1, 1)])
            } else {
                QueueMap::default()
            },
            qos: Default::default(),
        }],
    };
    (config, socket)
}

/// Sends SIGTERM and checks that the daemon exits 0 within the documented
/// bound (15 s, plus slack).
pub fn sigterm_exits_zero(child: &mut std::process::Child) {
    // SAFETY: kill() with a valid pid and signal number.
    let rc = unsafe { libc::kill(pid(child.id()), libc::SIGTERM) };
    assert_eq!(rc, 0);
    let deadline = Instant::now() + Duration::from_secs(17);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("sqcqd did not exit after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "exit status {status:?}");
}

/// Prints the daemon's log and kills it if the test fails.
pub struct LogOnPanic(pub std::path::PathBuf, pub u32);

impl Drop for LogOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "sqcqd log:\n{}",
                std::fs::read_to_string(&self.0).unwrap_or_default()
            );
            // SAFETY: kill() with a pid and a signal number.
            unsafe { libc::kill(pid(self.1), libc::SIGKILL) };
        }
    }
}

/// A spawned `sqcqd` that is killed if the test ends (or panics) without
/// stopping it.
#[derive(Debug)]
pub struct Running(pub std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Waits (up to 60 s) for a spawned daemon to listen on `socket` or to
/// exit: `Ok` while it serves, `Err` with its output once it ended (it
/// refused to start).
pub fn serving(
    mut child: std::process::Child,
    socket: &std::path::Path,
) -> Result<Running, std::process::Output> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if child.try_wait().unwrap().is_some() {
            return Err(child.wait_with_output().unwrap());
        }
        if socket.exists() {
            return Ok(Running(child));
        }
        assert!(Instant::now() < deadline, "sqcqd neither served nor exited");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `SQCQD --config CONFIG --seccomp kill` (the binary: the test's
/// `env!("CARGO_BIN_EXE_sqcqd")`, which the examples sharing this module
/// do not have; stderr in `sqcqd.log` of `dir`), once its admin socket
/// `admin` answers.
pub fn sqcqd_from_file(
    sqcqd: &str,
    dir: &TempDir,
    config: &std::path::Path,
    admin: &std::path::Path,
) -> (Running, LogOnPanic) {
    let log = dir.path("sqcqd.log");
    let child = std::process::Command::new(sqcqd)
        .arg("--config")
        .arg(config)
        .args(["--seccomp", "kill"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let guard = LogOnPanic(log, child.id());
    let running = Running(child);
    wait_until("the admin socket answers", || {
        sqcq_target::rpc::call(admin, "daemon_info", Default::default()).is_ok()
    });
    (running, guard)
}

/// The error output of a daemon that refused to start (which it checks).
pub fn refused(out: &std::process::Output) -> String {
    assert!(!out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Calls `method` of the management API on the admin socket `admin`
/// (`params`: an object, or `json!({})`); the result or the error object.
pub fn rpc(admin: &Path, method: &str, params: Value) -> Result<Value, Value> {
    let params = params.as_object().cloned().unwrap_or_default();
    sqcq_target::rpc::call(admin, method, params).expect("the admin socket answers")
}

/// The code of a JSON-RPC error object.
pub fn error_code(e: &Value) -> i64 {
    e["code"].as_i64().unwrap()
}

/// A child's pid as `kill` takes it.
pub fn pid(id: u32) -> libc::pid_t {
    libc::pid_t::try_from(id).expect("a pid fits pid_t")
}
