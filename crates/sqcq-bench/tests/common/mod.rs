//! Where the end-to-end tests find their targets. A target that is not
//! there skips the tests that need it, saying why, unless
//! `SQCQ_REQUIRE_PEERS` is set (the project's test command sets it, after
//! installing every peer): then a missing target fails the test.

#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};

use serde_json::Value;

pub const BENCH: &str = env!("CARGO_BIN_EXE_sqcq-bench");

/// Runs sqcq-bench with `target` (what to start, and from where) then
/// `args`, a 20 s I/O timeout and JSON output; returns its output and its
/// report, asserting it succeeded.
pub fn bench_json(target: &[&OsStr], args: &[&str]) -> (Output, Value) {
    let out = Command::new(BENCH)
        .args(target)
        .args([
            "--io-timeout",
            "20",
            "--eta",
            "never",
            "--output-format",
            "json",
        ])
        .args(args)
        .output()
        .expect("sqcq-bench runs");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{target:?} {args:?}: {out:?}");
    let json = serde_json::from_slice(&out.stdout).expect("JSON output");
    (out, json)
}

/// `why` a target is missing: a skip, or a failure under
/// `SQCQ_REQUIRE_PEERS`.
fn missing(why: &str) -> Option<PathBuf> {
    assert!(
        std::env::var_os("SQCQ_REQUIRE_PEERS").is_none(),
        "{why}; SQCQ_REQUIRE_PEERS is set, so nothing may be skipped"
    );
    eprintln!("SKIPPED: {why}");
    None
}

/// This workspace's `sqcqd`: $SQCQ_TARGET_BIN, or target/{debug,release}.
pub fn sqcqd() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SQCQ_TARGET_BIN") {
        return Some(PathBuf::from(path));
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
    ["debug", "release"]
        .iter()
        .map(|p| root.join(p).join("sqcqd"))
        .find(|p| p.is_file())
        .or_else(|| missing("no sqcqd in target/ (cargo build -p sqcq-target)"))
}

/// QEMU's qemu-storage-daemon, the vhost-user-blk peer: $SQCQ_QSD_BIN, or
/// in PATH (scripts/setup.sh installs it).
pub fn qsd() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SQCQ_QSD_BIN") {
        return Some(PathBuf::from(path));
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("qemu-storage-daemon"))
                .find(|p| p.is_file())
        })
        .or_else(|| missing("qemu-storage-daemon not in PATH (scripts/setup.sh installs it)"))
}

/// rust-vmm's vhost-device-scsi, the vhost-user-scsi peer:
/// $SQCQ_PEER_BIN, or target/tools/bin (scripts/install-peers.sh).
pub fn vhost_device_scsi() -> Option<PathBuf> {
    let path = std::env::var_os("SQCQ_PEER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tools/bin/vhost-device-scsi")
        });
    if path.is_file() {
        Some(path)
    } else {
        missing(&format!(
            "vhost-device-scsi not found at {} (run scripts/install-peers.sh)",
            path.display()
        ))
    }
}

/// A temporary directory of its own, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// `<tmp>/sqcq-<what>-<name>-<pid>`, empty.
    pub fn new(what: &str, name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("sqcq-{what}-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Every notification mode, with the `sqcqd` options it needs.
pub const MODES: [(&str, &[&str]); 4] = [
    ("notify", &[]),
    ("ring-poll", &["--poll", "ring"]),
    ("sqcq", &[]),
    ("sqcq-inline", &[]),
];

/// A client's view of the Ceph test cluster (`scripts/ceph-cluster.sh
/// env`): from the environment (`scripts/test.sh` exports it) or from the
/// script when a cluster runs; `None` (a skip, or a failure under
/// `SQCQ_REQUIRE_PEERS`) when there is none.
#[derive(Clone, Debug)]
pub struct Ceph {
    pub conf: String,
    pub pool: String,
    pub id: String,
    pub keyring: String,
}

impl Ceph {
    pub fn get() -> Option<Ceph> {
        let mut vars: Vec<(String, String)> = std::env::vars().collect();
        if std::env::var_os("CEPH_CONF").is_none() {
            let script =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ceph-cluster.sh");
            if let Ok(out) = Command::new(script).arg("env").output()
                && out.status.success()
            {
                vars = String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .filter_map(|l| l.split_once('='))
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect();
            }
        }
        let var = |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        match (
            var("CEPH_CONF"),
            var("SQCQ_CEPH_POOL"),
            var("SQCQ_CEPH_ID"),
            var("SQCQ_CEPH_KEYRING"),
        ) {
            (Some(conf), Some(pool), Some(id), Some(keyring)) => Some(Ceph {
                conf,
                pool,
                id,
                keyring,
            }),
            _ => {
                missing("no Ceph cluster (scripts/ceph-cluster.sh start)");
                None
            }
        }
    }

    /// Runs the `rbd` tool as the test user; its output, unchecked.
    pub fn rbd(&self, args: &[&str]) -> Output {
        Command::new("rbd")
            .args([
                "--conf",
                &self.conf,
                "--id",
                &self.id,
                "--keyring",
                &self.keyring,
            ])
            .args(args)
            .output()
            .expect("the rbd tool (ceph-common)")
    }

    /// A fresh image `<name>-<pid>` of `size` (rbd's units: 64M), removed
    /// (with its snapshots) when dropped.
    pub fn image(&self, name: &str, size: &str) -> RbdImage {
        let name = format!("{name}-{}", std::process::id());
        let image = RbdImage {
            ceph: self.clone(),
            spec: format!("{}/{name}", self.pool),
            name,
        };
        image.remove();
        let out = self.rbd(&["create", "--size", size, &image.spec]);
        assert!(out.status.success(), "rbd create: {out:?}");
        image
    }
}

/// An image of the test cluster.
pub struct RbdImage {
    pub ceph: Ceph,
    pub name: String,
    /// `pool/name`.
    pub spec: String,
}

impl RbdImage {
    /// The `--lun` of sqcqd for this image.
    pub fn lun(&self) -> String {
        format!(
            "kind=rbd,pool={},image={},conf={},id={},keyring={}",
            self.ceph.pool, self.name, self.ceph.conf, self.ceph.id, self.ceph.keyring
        )
    }

    /// Removes the image with its snapshots, if there is one. A client
    /// that went away without closing it (killed, or its watch lost to
    /// a restarted OSD) leaves a watch that the OSD drops only after
    /// 30 s, and `rbd rm` refuses an image with watchers: tried again
    /// for up to 45 s. Any other failure is printed, not a panic (a
    /// second panic would hide the test's own).
    fn remove(&self) {
        let _ = self
            .ceph
            .rbd(&["snap", "purge", "--no-progress", &self.spec]);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(45);
        loop {
            let out = self.ceph.rbd(&["rm", "--no-progress", &self.spec]);
            let err = String::from_utf8_lossy(&out.stderr);
            if out.status.success() || err.contains("No such file") {
                return;
            }
            if !err.contains("watchers") || std::time::Instant::now() > deadline {
                eprintln!("rbd rm {}: {}", self.spec, err.trim());
                return;
            }
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
    }
}

impl Drop for RbdImage {
    fn drop(&mut self) {
        self.remove();
    }
}

/// A daemon the test started: killed if the test ends (or panics)
/// without stopping it, so that no daemon outlives its test.
pub struct Running(pub std::process::Child);

impl Running {
    /// Stops it as a service manager does (SIGTERM) and checks that it
    /// exited cleanly.
    pub fn stop(mut self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let status = self.0.wait().unwrap();
        assert!(status.success(), "sqcqd stopped cleanly: {status}");
    }

    /// Kills it (SIGKILL) and reaps it.
    pub fn kill(mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Requests the daemon of admin socket `admin` has completed, on every
/// queue (0 while it cannot answer).
pub fn completions(bin: &Path, admin: &Path) -> u64 {
    let Ok(out) = Command::new(bin)
        .args(["rpc", "--admin-socket"])
        .arg(admin)
        .arg("stats_get")
        .output()
    else {
        return 0;
    };
    let Ok(v) = serde_json::from_slice::<Value>(&out.stdout) else {
        return 0;
    };
    v["queues"].as_array().map_or(0, |qs| {
        qs.iter().filter_map(|q| q["completions"].as_u64()).sum()
    })
}

/// Waits until the daemon of admin socket `admin` has completed at least
/// `n` requests (the load has really started, however long the bench
/// took to connect): `true`, or `false` if `bench` ended first. Fails
/// after 60 s.
pub fn wait_for_completions(bin: &Path, admin: &Path, n: u64, bench: &mut Child) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while completions(bin, admin) < n {
        if bench.try_wait().unwrap().is_some() {
            return false;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the load starts within 60 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    true
}
