//! A target started by the bench: a child process serving one vhost-user
//! socket per device in a private temporary directory, and its CPU time.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use sqcq_driver::DeviceType;

use crate::cpu::{CpuTime, ThreadCpu, proc_cpu_time, thread_cpu_times};
use crate::sqcqd_config::MultiDevice;

use crate::args::{RbdImage, TargetKind};

/// How long a started target gets to create its socket.
const STARTUP: Duration = Duration::from_secs(10);
/// How long a target gets to exit on its own after we disconnect.
const SHUTDOWN: Duration = Duration::from_secs(2);
/// How long a target serving an RBD image gets to close it after SIGTERM.
const RBD_CLOSE: Duration = Duration::from_secs(10);

/// Errors starting a target.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// No executable found.
    #[error(
        "{name} not found (looked next to sqcq-bench, in ../tools/bin and in PATH); pass --target-bin, --socket, or run scripts/install-peers.sh for vhost-device-scsi, scripts/setup.sh for qemu-storage-daemon"
    )]
    NotFound {
        /// The executable's name.
        name: &'static str,
    },
    /// Creating the directory, the image or the log failed.
    #[error("preparing {path} failed")]
    Prepare {
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Spawning failed.
    #[error("starting {bin} failed")]
    Spawn {
        /// The executable.
        bin: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The target exited or did not create its socket in time.
    #[error("{bin} did not come up: {why}; its stderr:\n{log}")]
    NoSocket {
        /// The executable.
        bin: PathBuf,
        /// What happened.
        why: String,
        /// Its stderr.
        log: String,
    },
}

/// A running target process.
#[derive(Debug)]
pub struct Target {
    kind: TargetKind,
    bin: PathBuf,
    child: Child,
    dir: PathBuf,
    sockets: Vec<PathBuf>,
    stats_file: Option<PathBuf>,
    notes: Vec<String>,
    /// Set once [`Target::wait_exit`] has given the target its time.
    waited: bool,
    /// It serves an RBD image: stopped with SIGTERM, so that it closes
    /// the image and gives its exclusive lock back (a killed client keeps
    /// it until the OSD drops its watch, and the next run would wait).
    rbd: bool,
}

/// What a started target serves.
#[derive(Debug, Clone, Copy, Default)]
pub enum Disk<'a> {
    /// A scratch disk of the size asked for: null, or RAM (a sparse image
    /// file for the peers) when the data must read back.
    #[default]
    Scratch,
    /// An existing Ceph RBD image.
    Rbd(&'a RbdImage),
    /// An existing file or block device, all of it, with direct I/O.
    File(&'a Path),
}

/// What the bench asks of a target it starts, beyond the LUN.
#[derive(Debug, Clone, Copy, Default)]
pub struct TargetOptions<'a> {
    /// The device type to serve.
    pub device: DeviceType,
    /// Devices to serve, each on its own socket with its own LUN or disk
    /// (several: sqcqd only).
    pub devices: u16,
    /// Request queues per device (one per job).
    pub queues: u16,
    /// Worker threads of a started `sqcqd`.
    pub workers: u16,
    /// sqcqd's `--poll` (`None`: its default): `ring` is the device side
    /// of the `ring-poll` mode.
    pub poll: Option<&'static str>,
    /// Ask for per-queue statistics (`--stats-file`, `--stats-interval`).
    pub stats_interval: Option<Duration>,
    /// What the disk is (sqcqd and qemu-storage-daemon).
    pub disk: Disk<'a>,
    /// Run the target on these CPUs (`taskset -c` syntax).
    pub cpus: Option<&'a str>,
    /// Offer packed rings (a started `sqcqd`: `--packed`).
    pub packed: bool,
    /// More arguments for a started `sqcqd` (`--target-arg`).
    pub extra: &'a [String],
}

/// Whether `bin --help` mentions `flag`: the options of sqcqd grow with
/// the issues, and an older binary must still run.
fn supports(bin: &Path, flag: &str) -> bool {
    Command::new(bin)
        .arg("--help")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains(flag))
}

/// Finds `name`: `explicit`, next to this executable, in `../tools/bin`
/// beside its directory (where scripts/install-peers.sh puts peers), in
/// PATH.
pub fn find_binary(name: &str, explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(path) = explicit {
        return Some(path.to_owned());
    }
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_owned));
    let mut candidates = Vec::new();
    if let Some(dir) = exe_dir {
        candidates.push(dir.join(name));
        // target/debug/deps/… (tests) and target/debug/… both reach
        // target/tools/bin.
        for up in dir.ancestors().skip(1).take(2) {
            candidates.push(up.join("tools/bin").join(name));
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|dir| dir.join(name)));
    }
    candidates.into_iter().find(|p| p.is_file())
}

impl Target {
    /// Starts `kind` (found at `bin`) with one LUN or disk of `size`
    /// bytes: for sqcqd a null one, or a RAM one when the data must read
    /// back (`keep_data`); for vhost-device-scsi a sparse image file; for
    /// qemu-storage-daemon a null-co node (reads leave their buffers
    /// alone, as sqcqd's null backstore does), or a sparse image file
    /// with `keep_data`.
    /// A sqcqd asked for several devices serves them from one process,
    /// each with such a LUN or disk ([`MultiDevice`]); the peers serve
    /// one.
    pub fn start(
        kind: TargetKind,
        bin: PathBuf,
        size: u64,
        keep_data: bool,
        options: TargetOptions<'_>,
    ) -> Result<Self, TargetError> {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "sqcq-bench-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let prepare = |path: &Path| {
            let path = path.to_owned();
            move |source| TargetError::Prepare { path, source }
        };
        fs::create_dir_all(&dir).map_err(prepare(&dir))?;
        let devices = if kind == TargetKind::Sqcqd {
            options.devices.max(1)
        } else {
            1
        };
        let sockets: Vec<PathBuf> = if devices == 1 {
            vec![dir.join("vhost.sock")]
        } else {
            (0..devices)
                .map(|d| dir.join(format!("vhost{d}.sock")))
                .collect()
        };
        let socket = &sockets[0];
        let log_path = dir.join("target.log");
        let log = File::create(&log_path).map_err(prepare(&log_path))?;
        let mut cmd = match options.cpus {
            // taskset execs the target: the pid stays the target's.
            Some(cpus) => {
                let mut cmd = Command::new("taskset");
                cmd.args(["-c", cpus]).arg(&bin);
                cmd
            }
            None => Command::new(&bin),
        };
        let mut stats_file = None;
        let mut notes = Vec::new();
        match kind {
            TargetKind::Sqcqd => {
                let kind = if keep_data { "ram" } else { "null" };
                if devices == 1 {
                    cmd.arg("--socket-path").arg(socket);
                    if options.device == DeviceType::Blk {
                        cmd.args(["--device-type", "blk"]);
                    }
                    cmd.arg("--lun").arg(match options.disk {
                        Disk::Rbd(rbd) => sqcqd_rbd_lun(rbd),
                        Disk::File(path) => format!("kind=file,path={}", path.display()),
                        Disk::Scratch => format!("kind={kind},size={size}"),
                    });
                    if options.queues > 1 {
                        cmd.arg("--num-queues").arg(options.queues.to_string());
                    }
                } else {
                    let config = MultiDevice {
                        sockets: sockets.clone(),
                        device: options.device,
                        queues: options.queues.max(1),
                        workers: options.workers.max(1),
                        lun_kind: kind,
                        lun_size: size,
                    };
                    let path = dir.join("sqcqd.toml");
                    fs::write(&path, config.toml()).map_err(prepare(&path))?;
                    cmd.arg("--config").arg(&path);
                }
                if options.workers > 1 {
                    cmd.arg("--workers").arg(options.workers.to_string());
                }
                if let Some(poll) = options.poll {
                    if supports(&bin, "--poll") {
                        cmd.args(["--poll", poll]);
                    } else {
                        notes.push(format!(
                            "{} has no --poll option: its queues are kick-driven, not --poll {poll}",
                            bin.display()
                        ));
                    }
                }
                if options.packed {
                    if supports(&bin, "--packed") {
                        cmd.arg("--packed");
                    } else {
                        notes.push(format!("{} has no --packed option", bin.display()));
                    }
                }
                cmd.args(options.extra);
                if let Some(interval) = options.stats_interval {
                    if supports(&bin, "--stats-file") {
                        let path = dir.join("device-stats.json");
                        cmd.arg("--stats-file").arg(&path);
                        if !interval.is_zero() && supports(&bin, "--stats-interval") {
                            // Whole seconds, at least one.
                            let secs = interval.as_secs().max(1);
                            cmd.arg("--stats-interval").arg(secs.to_string());
                        }
                        stats_file = Some(path);
                    } else {
                        notes.push(format!(
                            "{} has no --stats-file option: no device statistics",
                            bin.display()
                        ));
                    }
                }
            }
            TargetKind::VhostDeviceScsi => {
                let image = dir.join("lun0.img");
                let file = File::create(&image).map_err(prepare(&image))?;
                file.set_len(size).map_err(prepare(&image))?;
                cmd.arg("--socket-path").arg(socket).arg(&image);
            }
            TargetKind::QemuStorageDaemon => {
                let node = if let Disk::Rbd(rbd) = options.disk {
                    qsd_rbd_node(rbd)
                } else if let Disk::File(path) = options.disk {
                    qsd_file_node(path)
                } else if keep_data {
                    let image = dir.join("disk0.img");
                    let file = File::create(&image).map_err(prepare(&image))?;
                    file.set_len(size).map_err(prepare(&image))?;
                    // QEMU's option syntax doubles a comma inside a value.
                    let path = image.display().to_string().replace(',', ",,");
                    format!("driver=file,node-name=disk0,filename={path}")
                } else {
                    format!("driver=null-co,node-name=disk0,size={size},read-zeroes=off")
                };
                let socket = socket.display().to_string().replace(',', ",,");
                cmd.arg("--blockdev").arg(node).arg("--export").arg(format!(
                    "type=vhost-user-blk,id=export0,node-name=disk0,addr.type=unix,addr.path={socket},writable=on,num-queues={}",
                    options.queues.max(1)
                ));
            }
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|source| TargetError::Spawn {
                bin: bin.clone(),
                source,
            })?;
        let mut target = Self {
            kind,
            bin,
            child,
            dir,
            sockets,
            stats_file,
            notes,
            waited: false,
            rbd: matches!(options.disk, Disk::Rbd(_)),
        };
        target.wait_for_socket()?;
        Ok(target)
    }

    /// Waits until every socket listens: a socket file exists from the
    /// target's bind(2), but a connect before its listen(2) is refused.
    fn wait_for_socket(&mut self) -> Result<(), TargetError> {
        let start = Instant::now();
        loop {
            if self.sockets.iter().all(|s| listening(s)) {
                return Ok(());
            }
            let why = match self.child.try_wait() {
                Ok(Some(status)) => Some(format!("it exited with {status}")),
                Ok(None) if start.elapsed() > STARTUP => {
                    Some(format!("no socket after {STARTUP:?}"))
                }
                Ok(None) => None,
                Err(e) => Some(format!("waiting for it failed: {e}")),
            };
            if let Some(why) = why {
                return Err(TargetError::NoSocket {
                    bin: self.bin.clone(),
                    why,
                    log: self.log(),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The target's kind.
    pub fn kind(&self) -> TargetKind {
        self.kind
    }

    /// Its vhost-user sockets, one per device.
    pub fn sockets(&self) -> &[PathBuf] {
        &self.sockets
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its stderr so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("target.log")).unwrap_or_default()
    }

    /// What the target could not be asked for (options it lacks).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// The device's per-queue statistics, as its `--stats-file` holds them
    /// now; `None` when it was not asked for or is not there (yet).
    pub fn device_stats(&self) -> Option<serde_json::Value> {
        let text = fs::read_to_string(self.stats_file.as_ref()?).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Waits (up to the shutdown bound) for the target to exit on its own
    /// after the disconnect, so that its last statistics are written.
    /// qemu-storage-daemon serves on: it is not waited for. The wait is
    /// given once: a target still running after it (sqcqd serves until a
    /// signal) is not waited for again when dropped.
    pub fn wait_exit(&mut self) {
        if self.kind == TargetKind::QemuStorageDaemon || self.waited {
            return;
        }
        self.waited = true;
        let start = Instant::now();
        while start.elapsed() < SHUTDOWN {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Its CPU time so far (zero if /proc cannot tell).
    pub fn cpu_time(&self) -> CpuTime {
        proc_cpu_time(self.pid()).unwrap_or_default()
    }

    /// Each of its threads' CPU time so far (sqcqd names its workers
    /// `sqcq-worker0`, `sqcq-worker1`, ...).
    pub fn thread_cpu_times(&self) -> Vec<ThreadCpu> {
        thread_cpu_times(self.pid())
    }
}

impl Target {
    /// Sends SIGTERM and waits (up to [`RBD_CLOSE`]) for the target to
    /// exit, closing its image.
    fn terminate(&mut self) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        let Ok(pid) = libc::pid_t::try_from(self.child.id()) else {
            return;
        };
        // SAFETY: kill(2) on our own child, not yet reaped (try_wait
        // above saw it running), so the pid is still its.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let start = Instant::now();
        while start.elapsed() < RBD_CLOSE {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// sqcqd's `--lun` for `rbd`.
fn sqcqd_rbd_lun(rbd: &RbdImage) -> String {
    let mut lun = format!("kind=rbd,pool={},image={}", rbd.pool, rbd.image);
    if let Some(conf) = &rbd.conf {
        lun += &format!(",conf={conf}");
    }
    if let Some(id) = &rbd.id {
        lun += &format!(",id={id}");
    }
    lun
}

/// qemu-storage-daemon's `--blockdev` for `rbd`: QEMU's `rbd` driver
/// (Debian's qemu-block-extra), with `cache.direct=on`, which turns
/// librbd's cache off (`rbd_cache=false`) as sqcqd always does.
fn qsd_rbd_node(rbd: &RbdImage) -> String {
    // QEMU's option syntax doubles a comma inside a value.
    let q = |v: &str| v.replace(',', ",,");
    let mut node = format!(
        "driver=rbd,node-name=disk0,cache.direct=on,pool={},image={}",
        q(&rbd.pool),
        q(&rbd.image)
    );
    if let Some(conf) = &rbd.conf {
        node += &format!(",conf={}", q(conf));
    }
    if let Some(id) = &rbd.id {
        node += &format!(",user={}", q(id));
    }
    node
}

/// qemu-storage-daemon's `--blockdev` for an existing file or block
/// device: QEMU's `file` driver (`host_device` for a block device)
/// through io_uring with the page cache bypassed
/// (`aio=io_uring,cache.direct=on`), as sqcqd's file backstore reads and
/// writes aligned requests.
fn qsd_file_node(path: &Path) -> String {
    use std::os::unix::fs::FileTypeExt;
    let driver = match fs::metadata(path) {
        Ok(m) if m.file_type().is_block_device() => "host_device",
        _ => "file",
    };
    // QEMU's option syntax doubles a comma inside a value.
    let path = path.display().to_string().replace(',', ",,");
    format!("driver={driver},node-name=disk0,filename={path},aio=io_uring,cache.direct=on")
}

impl Drop for Target {
    /// Lets the target exit on its own after the disconnect (briefly), then
    /// kills it, and removes the temporary directory.
    fn drop(&mut self) {
        self.wait_exit();
        if self.rbd {
            self.terminate();
        }
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Whether a Unix socket bound at `path` listens, from the kernel's table
/// of Unix sockets (`/proc/net/unix`: the flags column has
/// `__SO_ACCEPTCON`, 0x10000, once listen(2) was called; the path is the
/// last column). Where the table cannot be read, the socket file existing
/// has to do.
fn listening(path: &Path) -> bool {
    const SO_ACCEPTCON: u32 = 0x1_0000;
    let Ok(table) = std::fs::read_to_string("/proc/net/unix") else {
        return path.exists();
    };
    let Some(path) = path.to_str() else {
        return path.exists();
    };
    table.lines().skip(1).any(|line| {
        let flags = line
            .split_whitespace()
            .nth(3)
            .and_then(|f| u32::from_str_radix(f, 16).ok());
        flags.is_some_and(|f| f & SO_ACCEPTCON != 0)
            && line
                .strip_suffix(path)
                .is_some_and(|rest| rest.ends_with(' '))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::{UnixDatagram, UnixListener};

    #[test]
    fn qemu_storage_daemon_opens_files_and_block_devices_with_their_drivers() {
        let dir = std::env::temp_dir().join(format!("sqcq-qsd-node-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("a,b.img");
        File::create(&file).unwrap();
        let node = qsd_file_node(&file);
        assert!(node.starts_with("driver=file,"), "{node}");
        assert!(
            node.contains("a,,b.img,aio=io_uring,cache.direct=on"),
            "{node}"
        );
        fs::remove_dir_all(&dir).unwrap();
        // Whatever block device the machine has (none in some containers).
        let block = fs::read_dir("/dev").unwrap().flatten().find(|e| {
            use std::os::unix::fs::FileTypeExt;
            e.file_type().is_ok_and(|t| t.is_block_device())
        });
        if let Some(dev) = block {
            assert!(qsd_file_node(&dev.path()).starts_with("driver=host_device,"));
        }
    }

    #[test]
    fn a_socket_file_counts_only_once_it_listens() {
        let dir = std::env::temp_dir().join(format!("sqcq-listening-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let stream = dir.join("stream.sock");
        let _listener = UnixListener::bind(&stream).unwrap();
        assert!(listening(&stream));
        // Bound, so the file exists, but nothing listens on it.
        let datagram = dir.join("datagram.sock");
        let _bound = UnixDatagram::bind(&datagram).unwrap();
        assert!(datagram.exists());
        assert!(!listening(&datagram));
        assert!(!listening(&dir.join("none.sock")));
        fs::remove_dir_all(&dir).unwrap();
    }
}
