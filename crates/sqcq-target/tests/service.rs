//! `sqcqd` as a service manager runs it, with the real binary: readiness
//! and stop notifications on a notification socket the test binds (a path
//! and an abstract name), sockets passed in by `systemd-socket-activate`,
//! the pidfile, socket ownership, SIGHUP, and the unit's hardening as far
//! as a machine without a running systemd allows (`setpriv`, a read-only
//! root in a mount namespace).

mod common;

use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{SocketAddr, UnixDatagram, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::driver::*;
use common::*;
use sqcq_driver::scsi::Cdb;

const SQCQD: &str = env!("CARGO_BIN_EXE_sqcqd");
const ACTIVATE: &str = "/usr/bin/systemd-socket-activate";
/// The ids of `nobody` and `nogroup` on Debian.
const NOBODY: u32 = 65534;

/// The test's end of `NOTIFY_SOCKET`: every message received, in order.
struct NotifySocket {
    socket: UnixDatagram,
    /// The value of `NOTIFY_SOCKET`.
    address: String,
    messages: Vec<String>,
}

impl NotifySocket {
    fn path(path: &Path) -> Self {
        let socket = UnixDatagram::bind(path).unwrap();
        Self::with(socket, path.display().to_string())
    }

    fn abstract_name(name: &str) -> Self {
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        Self::with(UnixDatagram::bind_addr(&addr).unwrap(), format!("@{name}"))
    }

    fn with(socket: UnixDatagram, address: String) -> Self {
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        NotifySocket {
            socket,
            address,
            messages: Vec::new(),
        }
    }

    /// Receives what has arrived; waits at most 50 ms for more.
    fn receive(&mut self) {
        let mut buf = [0u8; 4096];
        while let Ok(n) = self.socket.recv(&mut buf) {
            self.messages
                .push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }

    /// Waits (bounded) for a message with the line `line`; returns it.
    fn wait_for(&mut self, line: &str) -> String {
        self.wait_for_line(|l| l == line)
    }

    /// Waits (bounded) for a message with a line that `is` accepts.
    fn wait_for_line(&mut self, is: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(m) = self.messages.iter().find(|m| m.lines().any(&is)) {
                return m.clone();
            }
            assert!(
                Instant::now() < deadline,
                "not within {WAIT:?}; received {:?}",
                self.messages
            );
            self.receive();
        }
    }
}

/// Starts `cmd` with its stderr in `log`; the guard kills it and prints
/// the log if the test fails.
fn spawn(cmd: &mut Command, log: &Path) -> (Child, LogOnPanic) {
    let child = cmd
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let guard = LogOnPanic(log.to_owned(), child.id());
    (child, guard)
}

/// Runs `cmd` to its end, bounded (killed, and the test failed, after
/// [`WAIT`]); returns its exit status and stderr.
fn run(cmd: &mut Command, log: &Path) -> (ExitStatus, String) {
    let (mut child, _guard) = spawn(cmd, log);
    let status = exit_status(&mut child);
    (status, std::fs::read_to_string(log).unwrap())
}

/// Waits (bounded) for `child` to exit.
fn exit_status(child: &mut Child) -> ExitStatus {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < deadline, "still running after {WAIT:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `systemd-socket-activate` listening on `socket`, passing it as `fdname`
/// to `program`, with `NOTIFY_SOCKET` (it passes no other variable).
fn activate(socket: &Path, fdname: &str, notify: &NotifySocket, program: &str) -> Command {
    activate_with(&[], socket, fdname, notify, program)
}

/// [`activate`] with more options of `systemd-socket-activate`.
fn activate_with(
    options: &[&str],
    socket: &Path,
    fdname: &str,
    notify: &NotifySocket,
    program: &str,
) -> Command {
    let mut c = Command::new(ACTIVATE);
    c.args(options)
        .arg("--listen")
        .arg(socket)
        .arg(format!("--fdname={fdname}"))
        .arg(format!("--setenv=NOTIFY_SOCKET={}", notify.address))
        .arg(program);
    c
}

/// Connects to `socket` once it listens: `systemd-socket-activate` starts
/// the daemon on the first connection.
fn trigger(socket: &Path) {
    wait_until("the activation socket listens", || {
        UnixStream::connect(socket).is_ok()
    });
}

fn proc_status(child: &Child) -> String {
    std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap()
}

fn log_count(log: &Path, text: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .matches(text)
        .count()
}

fn file_id(path: &Path) -> (u64, u64) {
    let m = std::fs::symlink_metadata(path).unwrap();
    (m.dev(), m.ino())
}

/// A SCSI INQUIRY through `socket`: the whole vhost-user negotiation
/// (GET_FEATURES first) and one request.
fn inquiry_through(socket: &Path) -> Driver {
    let mut d = Driver::connect(socket);
    let rq = &mut d.rqs[0];
    rq.clear_unit_attention(0);
    let r = rq.inquiry(0);
    assert!(r.good(), "{r:?}");
    assert_eq!(&r.data[8..12], b"SQCQ");
    d
}

fn root() -> bool {
    // SAFETY: getuid has no preconditions.
    unsafe { libc::getuid() == 0 }
}

#[test]
fn an_activated_socket_is_served_after_ready_and_left_in_place() {
    let dir = TempDir::new("svc-activate");
    let socket = dir.path("vhost.sock");
    let mut notify = NotifySocket::abstract_name(&format!("sqcq-test-{}", std::process::id()));
    let mut cmd = activate(&socket, "vhost.sock", &notify, SQCQD);
    cmd.args(["--seccomp", "kill", "--socket-path"])
        .arg(&socket)
        .args(["--lun", "kind=ram,size=4M", "--queue-size", "64"]);
    let log = dir.path("sqcqd.log");
    let (mut child, _guard) = spawn(&mut cmd, &log);
    trigger(&socket);
    let made_by_the_manager = file_id(&socket);

    let ready = notify.wait_for("READY=1");
    assert!(
        ready
            .lines()
            .any(|l| l == "STATUS=serving 1 device, 1 worker"),
        "{ready:?}"
    );
    // READY comes after the seccomp filter, the last step of starting.
    let status = proc_status(&child);
    assert!(status.contains("Seccomp:\t2"), "{status}");
    assert!(
        notify.messages.iter().all(|m| !m.contains("STOPPING")),
        "{:?}",
        notify.messages
    );
    let d = inquiry_through(&socket);
    assert_eq!(log_count(&log, "(passed by the service manager)"), 1);

    sigterm_exits_zero(&mut child);
    notify.wait_for("STOPPING=1");
    assert_eq!(
        file_id(&socket),
        made_by_the_manager,
        "the passed socket is neither re-bound nor removed"
    );
    drop(d);
}

/// One socket unit with a `ListenStream=` per device and no
/// `FileDescriptorName=`: each socket goes to the device whose path it
/// listens on.
#[test]
fn unnamed_passed_sockets_go_to_the_paths_they_listen_on() {
    let dir = TempDir::new("svc-unnamed");
    let notify = NotifySocket::path(&dir.path("notify"));
    let (a, b) = (dir.path("a.sock"), dir.path("b.sock"));
    let mut cmd = Command::new(ACTIVATE);
    cmd.arg("--listen")
        .arg(&b)
        .arg("--listen")
        .arg(&a)
        .arg(format!("--setenv=NOTIFY_SOCKET={}", notify.address))
        .arg(SQCQD)
        .args([
            "--queue-size",
            "64",
            "--lun",
            "kind=ram,size=1M",
            "--socket-path",
        ])
        .arg(&a);
    let config = dir.path("sqcqd.toml");
    let device = format!(
        "[[device]]\nsocket-path = \"{}\"\n[[device.lun]]\nkind = \"null\"\nsize = \"1M\"\n",
        b.display()
    );
    std::fs::write(&config, device).unwrap();
    cmd.arg("--config").arg(&config);
    let log = dir.path("sqcqd.log");
    let (mut child, _guard) = spawn(&mut cmd, &log);
    trigger(&a);
    let (ia, ib) = (file_id(&a), file_id(&b));
    let da = inquiry_through(&a);
    let db = inquiry_through(&b);
    assert_eq!(log_count(&log, "(passed by the service manager)"), 2);
    sigterm_exits_zero(&mut child);
    assert_eq!((file_id(&a), file_id(&b)), (ia, ib), "both left in place");
    drop((da, db));
}

#[test]
fn a_passed_socket_that_matches_no_device_or_cannot_serve_stops_the_start() {
    let dir = TempDir::new("svc-refuse");
    let mut notify = NotifySocket::path(&dir.path("notify"));
    let socket = dir.path("vhost.sock");

    // Neither its name nor the path it listens on is the device's.
    let elsewhere = dir.path("elsewhere.sock");
    let mut cmd = activate(&elsewhere, "other.sock", &notify, SQCQD);
    cmd.arg("--socket-path")
        .arg(&socket)
        .args(["--lun", "kind=null,size=1M"]);
    let log = dir.path("unmatched.log");
    let (mut child, _guard) = spawn(&mut cmd, &log);
    trigger(&elsewhere);
    assert!(!exit_status(&mut child).success());
    let err = std::fs::read_to_string(&log).unwrap();
    let expected = format!(
        "passed socket \"other.sock\" (bound to {}) matches no socket path",
        elsewhere.display()
    );
    assert!(err.contains(&expected), "{err}");
    assert!(!socket.exists(), "nothing bound");
    notify.wait_for_line(|l| {
        l.starts_with("STATUS=failed to start: socket activation: passed socket \"other.sock\"")
    });

    // A datagram socket passed for the device.
    let dgram = dir.path("dgram.sock");
    let mut cmd = activate_with(&["--datagram"], &dgram, "dgram.sock", &notify, SQCQD);
    cmd.arg("--socket-path")
        .arg(&dgram)
        .args(["--lun", "kind=null,size=1M"]);
    let log = dir.path("dgram.log");
    let (mut child, _guard) = spawn(&mut cmd, &log);
    wait_until("the datagram socket exists", || dgram.exists());
    let client = UnixDatagram::unbound().unwrap();
    wait_until("a datagram starts the daemon", || {
        client.send_to(b"x", &dgram).is_ok()
    });
    assert!(!exit_status(&mut child).success());
    let err = std::fs::read_to_string(&log).unwrap();
    assert!(err.contains("is not a stream socket"), "{err}");
}

#[test]
fn the_pidfile_is_locked_while_the_daemon_runs_and_removed_after() {
    let dir = TempDir::new("svc-pidfile");
    let mut notify = NotifySocket::path(&dir.path("notify"));
    let pidfile = dir.path("sqcqd.pid");
    let admin = dir.path("sqcqd.admin");
    let first_socket = dir.path("a.sock");
    let mut cmd = Command::new(SQCQD);
    cmd.env("NOTIFY_SOCKET", &notify.address)
        .arg("--socket-path")
        .arg(&first_socket)
        .args(["--lun", "kind=null,size=1M", "--pidfile"])
        .arg(&pidfile)
        .arg("--admin-socket")
        .arg(&admin);
    let (mut first, _guard) = spawn(&mut cmd, &dir.path("first.log"));
    notify.wait_for("READY=1");
    assert_eq!(
        std::fs::read_to_string(&pidfile).unwrap(),
        format!("{}\n", first.id())
    );
    assert!(pidfile_fd_is_cloexec(first.id(), &pidfile));
    let m = std::fs::metadata(&admin).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o600, "the admin socket's default mode");

    let second_socket = dir.path("b.sock");
    let (status, err) = run(
        Command::new(SQCQD)
            .arg("--socket-path")
            .arg(&second_socket)
            .args(["--lun", "kind=null,size=1M", "--pidfile"])
            .arg(&pidfile),
        &dir.path("second.log"),
    );
    assert!(!status.success());
    let expected = format!(
        "pidfile {} is locked: another sqcqd (pid {}) runs with it",
        pidfile.display(),
        first.id()
    );
    assert!(err.contains(&expected), "{err}");
    assert!(!second_socket.exists(), "refused before binding anything");
    assert_eq!(
        std::fs::read_to_string(&pidfile).unwrap(),
        format!("{}\n", first.id()),
        "the refused daemon leaves the pidfile alone"
    );

    sigterm_exits_zero(&mut first);
    notify.wait_for("STOPPING=1");
    assert!(!pidfile.exists(), "removed at a clean exit");
    assert!(!first_socket.exists(), "a bound socket is removed");
    assert!(!admin.exists());
}

/// Whether the descriptor `pid` holds on `path` has O_CLOEXEC.
fn pidfile_fd_is_cloexec(pid: u32, path: &Path) -> bool {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap();
    for fd in fds.map(|e| e.unwrap().path()) {
        if std::fs::read_link(&fd).is_ok_and(|t| t == path) {
            let n = fd.file_name().unwrap().to_string_lossy().into_owned();
            let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{n}")).unwrap();
            let flags = info
                .lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .unwrap()
                .trim();
            let flags = u32::from_str_radix(flags, 8).unwrap();
            return flags & 0o2_000_000 != 0;
        }
    }
    panic!("{pid} holds no descriptor on {}", path.display());
}

/// A group the daemon may give its sockets, by name or number, and its
/// id: as root a name the daemon resolves that differs from what bind
/// gives; otherwise the test's own group, the only kind it may set.
fn settable_group() -> (String, u32) {
    if root() {
        ("nogroup".to_owned(), NOBODY)
    } else {
        // SAFETY: getegid has no preconditions.
        let g = unsafe { libc::getegid() };
        (g.to_string(), g)
    }
}

#[test]
fn sockets_get_the_configured_mode_owner_and_group_whatever_the_umask() {
    let dir = TempDir::new("svc-owner");
    let mut notify = NotifySocket::path(&dir.path("notify"));
    let socket = dir.path("vhost.sock");
    let admin = dir.path("sqcqd.admin");
    let (group, gid) = settable_group();
    let mut cmd = Command::new(SQCQD);
    cmd.env("NOTIFY_SOCKET", &notify.address)
        .arg("--socket-path")
        .arg(&socket)
        .args(["--lun", "kind=null,size=1M"])
        .args(["--socket-mode", "0660", "--socket-group", &group])
        .arg("--admin-socket")
        .arg(&admin)
        .args([
            "--admin-socket-mode",
            "0640",
            "--admin-socket-group",
            &group,
        ]);
    if root() {
        cmd.args(["--socket-owner", "nobody"]);
    }
    let umask = || {
        // SAFETY: umask has no preconditions.
        unsafe { libc::umask(0o077) };
        Ok(())
    };
    // SAFETY: the closure only calls umask, which is async-signal-safe.
    unsafe { cmd.pre_exec(umask) };
    let (mut child, _guard) = spawn(&mut cmd, &dir.path("sqcqd.log"));
    notify.wait_for("READY=1");
    let m = std::fs::symlink_metadata(&socket).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o660);
    assert_eq!(m.gid(), gid);
    if root() {
        assert_eq!(m.uid(), NOBODY);
    }
    let m = std::fs::symlink_metadata(&admin).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o640);
    assert_eq!(m.gid(), gid);
    let d = inquiry_through(&socket);
    sigterm_exits_zero(&mut child);
    drop(d);
}

/// A device created through the management API while the seccomp filter
/// (kill) is on gets its socket's mode and group like the others, and the
/// daemon lives on.
#[test]
fn a_socket_made_at_run_time_under_the_filter_gets_the_ownership() {
    let dir = TempDir::new("svc-runtime");
    let mut notify = NotifySocket::path(&dir.path("notify"));
    let admin = dir.path("sqcqd.admin");
    let (group, gid) = settable_group();
    let mut cmd = Command::new(SQCQD);
    cmd.env("NOTIFY_SOCKET", &notify.address)
        .args(["--seccomp", "kill", "--socket-path"])
        .arg(dir.path("first.sock"))
        .args(["--lun", "kind=null,size=1M"])
        .args(["--socket-mode", "0660", "--socket-group", &group])
        .arg("--admin-socket")
        .arg(&admin);
    let (mut child, _guard) = spawn(&mut cmd, &dir.path("sqcqd.log"));
    notify.wait_for("READY=1");

    let socket = dir.path("later.sock");
    let (status, err) = run(
        Command::new(SQCQD)
            .args(["rpc", "--admin-socket"])
            .arg(&admin)
            .arg("device_create")
            .arg(format!("socket-path={}", socket.display()))
            .arg("lun:=[\"kind=null,size=1M\"]"),
        &dir.path("rpc.log"),
    );
    assert!(status.success(), "{err}");
    let m = std::fs::symlink_metadata(&socket).unwrap();
    assert_eq!((m.mode() & 0o7777, m.gid()), (0o660, gid));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the filter let it live"
    );
    let d = inquiry_through(&socket);
    sigterm_exits_zero(&mut child);
    drop(d);
}

/// Under the seccomp filter (kill), which forbids `connect`, a socket file
/// at the path of a device created through the management API is refused
/// without being probed, stale or not, and left in place; the daemon lives
/// on. Before the filter (at start-up) a stale one is replaced.
#[test]
fn under_the_filter_a_socket_file_at_a_new_devices_path_is_refused_unprobed() {
    let dir = TempDir::new("svc-stale");
    let mut notify = NotifySocket::path(&dir.path("notify"));
    let admin = dir.path("sqcqd.admin");
    let first = dir.path("first.sock");
    drop(std::os::unix::net::UnixListener::bind(&first).unwrap());
    let mut cmd = Command::new(SQCQD);
    cmd.env("NOTIFY_SOCKET", &notify.address)
        .args(["--seccomp", "kill", "--socket-path"])
        .arg(&first)
        .args(["--lun", "kind=null,size=1M"])
        .arg("--admin-socket")
        .arg(&admin);
    let (mut child, _guard) = spawn(&mut cmd, &dir.path("sqcqd.log"));
    notify.wait_for("READY=1");

    let later = dir.path("later.sock");
    drop(std::os::unix::net::UnixListener::bind(&later).unwrap());
    let (status, err) = run(
        Command::new(SQCQD)
            .args(["rpc", "--admin-socket"])
            .arg(&admin)
            .arg("device_create")
            .arg(format!("socket-path={}", later.display()))
            .arg("lun:=[\"kind=null,size=1M\"]"),
        &dir.path("rpc.log"),
    );
    assert!(!status.success(), "{err}");
    assert!(
        err.contains("the sandbox forbids checking whether it is stale"),
        "{err}"
    );
    let m = std::fs::symlink_metadata(&later).unwrap();
    assert!(m.file_type().is_socket(), "the socket file stays");
    assert!(
        child.try_wait().unwrap().is_none(),
        "the filter let it live"
    );
    let d = inquiry_through(&first);
    sigterm_exits_zero(&mut child);
    drop(d);
}

#[test]
fn unknown_users_groups_and_modes_are_configuration_errors() {
    let dir = TempDir::new("svc-unknown");
    for (option, value, expected) in [
        ("--socket-group", "sqcq-no-such-group", "unknown group"),
        ("--socket-owner", "sqcq-no-such-user", "unknown user"),
        (
            "--admin-socket-group",
            "sqcq-no-such-group",
            "unknown group",
        ),
        ("--socket-mode", "0999", "invalid socket mode"),
    ] {
        let (status, err) = run(
            Command::new(SQCQD)
                .arg("--socket-path")
                .arg(dir.path("x.sock"))
                .args(["--lun", "kind=null,size=1M", option, value]),
            &dir.path("sqcqd.log"),
        );
        assert_eq!(status.code(), Some(2), "{option} {value}: {err}");
        assert!(err.contains(expected), "{option} {value}: {err}");
    }
}

#[test]
fn an_unprivileged_daemon_cannot_give_its_socket_away() {
    let dir = TempDir::new("svc-eperm");
    let socket = dir.path("vhost.sock");
    let (mut cmd, option, what) = if root() {
        std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o777)).unwrap();
        let mut c = Command::new("/usr/bin/setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", SQCQD]);
        (c, "--socket-group", "cannot set the group of")
    } else {
        (
            Command::new(SQCQD),
            "--socket-owner",
            "cannot set the owner of",
        )
    };
    cmd.arg("--socket-path")
        .arg(&socket)
        .args(["--lun", "kind=null,size=1M", option, "root"]);
    let (status, err) = run(&mut cmd, &dir.path("sqcqd.log"));
    assert!(!status.success());
    let expected = format!(
        "{what} {} to 0: only root can give a socket",
        socket.display()
    );
    assert!(err.contains(&expected), "{err}");
    assert!(!socket.exists(), "the half-made socket is removed");
}

#[test]
fn sighup_does_not_stop_the_daemon() {
    let dir = TempDir::new("svc-sighup");
    let mut notify = NotifySocket::path(&dir.path("notify"));
    let socket = dir.path("vhost.sock");
    let log = dir.path("sqcqd.log");
    let mut cmd = Command::new(SQCQD);
    cmd.env("NOTIFY_SOCKET", &notify.address)
        .arg("--socket-path")
        .arg(&socket)
        .args(["--lun", "kind=ram,size=1M", "--queue-size", "64"]);
    let (mut child, _guard) = spawn(&mut cmd, &log);
    notify.wait_for("READY=1");
    for n in 1..=2 {
        // SAFETY: kill() with a child's pid and a signal number.
        assert_eq!(unsafe { libc::kill(pid(child.id()), libc::SIGHUP) }, 0);
        wait_until("SIGHUP handled", || log_count(&log, "SIGHUP: reload") == n);
    }
    assert!(child.try_wait().unwrap().is_none(), "still running");
    // Each reload is framed for systemd: RELOADING=1, then READY=1 again.
    wait_until("two reloads told", || {
        notify.receive();
        let count = |line: &str| {
            notify
                .messages
                .iter()
                .filter(|m| m.lines().any(|l| l == line))
                .count()
        };
        count("RELOADING=1") == 2 && count("READY=1") == 3
    });
    let d = inquiry_through(&socket);
    notify.receive();
    assert!(
        notify.messages.iter().all(|m| !m.contains("STOPPING")),
        "{:?}",
        notify.messages
    );
    sigterm_exits_zero(&mut child);
    drop(d);
}

/// Whether this process can make a mount namespace (root, and a
/// container that allows it).
fn can_unshare_mounts() -> bool {
    Command::new("/usr/bin/unshare")
        .args(["--mount", "--propagation", "private", "true"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// What `contrib/systemd/sqcqd.service` asks of systemd, done by hand:
/// the socket unit's socket passed in (root made it), `User=`/`Group=`
/// (nobody), `NoNewPrivileges=`, an empty `CapabilityBoundingSet=`, and
/// `ProtectSystem=strict` with `ReadWritePaths=` the sockets' directory (a
/// read-only root with one writable bind mount), plus `--seccomp kill`.
#[test]
fn the_daemon_serves_under_the_units_hardening() {
    if !root() {
        eprintln!("skipped: needs root to change user and bounding set");
        return;
    }
    let dir = TempDir::new("svc-hardened");
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    // /run/sqcq as contrib/systemd/sqcqd.tmpfiles makes it: the
    // service's user's (mode 0750 here: the frontend is root).
    let run = dir.path("run");
    std::fs::create_dir(&run).unwrap();
    std::os::unix::fs::chown(&run, Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o750)).unwrap();
    let socket = dir.path("vhost.sock");
    let pidfile = run.join("sqcqd.pid");
    let admin = run.join("sqcqd.admin");
    let mut notify = NotifySocket::path(&dir.path("notify"));
    // As /run/systemd/notify: anyone may send.
    std::fs::set_permissions(dir.path("notify"), std::fs::Permissions::from_mode(0o666)).unwrap();

    let read_only_root = can_unshare_mounts();
    let daemon = [
        "/usr/bin/setpriv",
        "--no-new-privs",
        "--bounding-set=-all",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        SQCQD,
        "--seccomp",
        "kill",
        "--socket-path",
        &socket.display().to_string(),
        "--lun",
        "kind=ram,size=4M",
        "--queue-size",
        "64",
        "--pidfile",
        &pidfile.display().to_string(),
        "--admin-socket",
        &admin.display().to_string(),
    ]
    .join(" ");
    let mut cmd = if read_only_root {
        let mut c = activate(&socket, "vhost.sock", &notify, "/usr/bin/unshare");
        let script = format!(
            "mount --bind {run} {run} && mount -o bind,remount,ro / && exec {daemon}",
            run = run.display()
        );
        c.args([
            "--mount",
            "--propagation",
            "private",
            "/bin/sh",
            "-c",
            &script,
        ]);
        c
    } else {
        eprintln!("no mount namespace here: the root stays writable");
        let mut c = activate(&socket, "vhost.sock", &notify, "/bin/sh");
        c.args(["-c", &format!("exec {daemon}")]);
        c
    };
    let (mut child, _guard) = spawn(&mut cmd, &dir.path("sqcqd.log"));
    trigger(&socket);
    notify.wait_for("READY=1");

    let status = proc_status(&child);
    for line in [
        "Uid:\t65534\t65534\t65534\t65534",
        "Gid:\t65534\t65534\t65534\t65534",
        "NoNewPrivs:\t1",
        "CapEff:\t0000000000000000",
        "CapBnd:\t0000000000000000",
        "Seccomp:\t2",
    ] {
        assert!(status.contains(line), "{line:?} not in {status}");
    }
    let groups = status.lines().find(|l| l.starts_with("Groups:")).unwrap();
    assert_eq!(groups.trim_end(), "Groups:", "no supplementary group");
    if read_only_root {
        let mounts = std::fs::read_to_string(format!("/proc/{}/mountinfo", child.id())).unwrap();
        let root_options = mounts
            .lines()
            .map(|l| l.split(' ').collect::<Vec<_>>())
            .find(|f| f[4] == "/")
            .map(|f| f[5].to_owned())
            .unwrap();
        assert!(root_options.starts_with("ro"), "{root_options}");
    }
    assert_eq!(
        std::fs::read_to_string(&pidfile).unwrap(),
        format!("{}\n", child.id())
    );
    let m = std::fs::symlink_metadata(&admin).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o7777), (NOBODY, 0o600));

    let mut d = Driver::connect(&socket);
    let rq = &mut d.rqs[0];
    rq.clear_unit_attention(0);
    let lun = lun_at(0, 0);
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    let r = rq.command(lun, Cdb::write_10(16, 8, false), &pattern, 0);
    assert!(r.good(), "{r:?}");
    let r = rq.command(lun, Cdb::read_10(16, 8, false), &[], 4096);
    assert!(r.good(), "{r:?}");
    assert_eq!(r.data, pattern);

    sigterm_exits_zero(&mut child);
    notify.wait_for("STOPPING=1");
    assert!(
        !pidfile.exists() && !admin.exists(),
        "removed by the daemon"
    );
    assert!(socket.exists(), "the service manager's socket stays");
    drop(d);
}

/// The example configuration in `contrib/` is valid (with a group that
/// exists here in place of libvirt's), and serves its metrics on a Unix
/// socket in /run/sqcq: the unit allows no other address family
/// (`RestrictAddressFamilies=AF_UNIX`) and writes nowhere else.
#[test]
fn the_contrib_example_configuration_is_valid() {
    let example = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../contrib/sqcqd.toml");
    let text = std::fs::read_to_string(&example).unwrap();
    let here = text.replace("\"libvirt-qemu\"", "\"root\"");
    assert_ne!(here, text, "the example names libvirt's group");
    let config = sqcq_target::config::parse_toml(&here, 1, 1, 1024).unwrap();
    config.validate().unwrap();
    assert_eq!(config.devices.len(), 2);
    assert_eq!(config.service.socket_ownership.mode, Some(0o660));
    assert_eq!(
        config.service.metrics,
        Some(sqcq_target::prometheus::MetricsListen::Unix(
            "/run/sqcq/metrics.sock".into()
        ))
    );
    let unit = std::fs::read_to_string(example.with_file_name("systemd/sqcqd.service")).unwrap();
    assert!(unit.contains("\nRestrictAddressFamilies=AF_UNIX\n"));
    assert!(unit.contains("\nReadWritePaths=/run/sqcq\n"));
}

/// SIGHUP makes the daemon what its (changed) configuration file says:
/// a LUN added, a worker added and a queue attached to it, a device
/// added; what the management API lists afterwards is what a daemon
/// started from the new file lists.
#[test]
fn sighup_applies_the_changed_configuration_file() {
    let dir = TempDir::new("svc-reload");
    let mut notify = NotifySocket::path(&dir.path("notify"));
    let admin = dir.path("admin.sock");
    let file = dir.path("sqcqd.toml");
    let (a, b) = (dir.path("a.sock"), dir.path("b.sock"));
    let before = format!(
        "workers = 1\nadmin-socket = {admin:?}\n\n\
         [[device]]\nsocket-path = {a:?}\nnum-queues = 2\nqueue-size = 64\n\
         [[device.lun]]\nkind = \"ram\"\nsize = \"1M\"\n"
    );
    let after = format!(
        "{}queue-map = \"1:1\"\n\
         [[device.lun]]\nkind = \"ram\"\nsize = \"1M\"\n\
         [[device.lun]]\nkind = \"null\"\nsize = \"1G\"\n\n\
         [[device]]\ntype = \"blk\"\nsocket-path = {b:?}\nqueue-size = 64\n\
         [[device.lun]]\nkind = \"null\"\nsize = \"1G\"\n",
        before
            .replace("workers = 1", "workers = 2")
            .split("[[device.lun]]")
            .next()
            .unwrap()
    );
    std::fs::write(&file, &before).unwrap();
    let log = dir.path("sqcqd.log");
    let mut cmd = Command::new(SQCQD);
    cmd.env("NOTIFY_SOCKET", &notify.address)
        .arg("--config")
        .arg(&file);
    let (mut child, _guard) = spawn(&mut cmd, &log);
    notify.wait_for("READY=1");
    std::fs::write(&file, &after).unwrap();
    // SAFETY: kill() with a child's pid and a signal number.
    assert_eq!(unsafe { libc::kill(pid(child.id()), libc::SIGHUP) }, 0);
    wait_until("the reload applied", || {
        notify.receive();
        notify
            .messages
            .iter()
            .filter(|m| m.lines().any(|l| l == "READY=1"))
            .count()
            == 2
    });
    let list = |admin: &Path| {
        let v = sqcq_target::rpc::call(admin, "device_list", Default::default())
            .unwrap()
            .unwrap();
        // What a configuration describes: not the socket directory.
        let mut v = v.to_string();
        v = v.replace(&dir.0.display().to_string(), "DIR");
        v
    };
    let reloaded = list(&admin);
    assert!(b.exists(), "the new device listens");
    sigterm_exits_zero(&mut child);
    // The same file, from the start.
    let mut fresh = Command::new(SQCQD);
    fresh.arg("--config").arg(&file);
    let mut notify2 = NotifySocket::path(&dir.path("notify2"));
    fresh.env("NOTIFY_SOCKET", &notify2.address);
    let (mut child2, _guard2) = spawn(&mut fresh, &dir.path("fresh.log"));
    notify2.wait_for("READY=1");
    assert_eq!(
        reloaded,
        list(&admin),
        "SIGHUP gives what a fresh start gives"
    );
    assert!(reloaded.contains("\"assigned_worker\":1"), "{reloaded}");
    sigterm_exits_zero(&mut child2);
}

/// A reload that fails, because the file does not parse or asks for a
/// change that needs a restart, still ends with READY=1 (the daemon
/// serves on) but the status says that it failed and why; the same
/// reload through `sqcqd rpc ... config_reload` is told the same way,
/// and the client exits 1 and prints the errors. A good reload, either
/// way, then says "serving" again.
#[test]
fn a_failed_reload_says_so_in_the_status_and_the_rpc_exit_code() {
    let dir = TempDir::new("svc-reload-fail");
    let mut notify = NotifySocket::path(&dir.path("notify"));
    let admin = dir.path("admin.sock");
    let file = dir.path("sqcqd.toml");
    let a = dir.path("a.sock");
    let good = format!(
        "workers = 1\nadmin-socket = {admin:?}\n\n\
         [[device]]\nsocket-path = {a:?}\nqueue-size = 64\n\
         [[device.lun]]\nkind = \"ram\"\nsize = \"1M\"\n"
    );
    std::fs::write(&file, &good).unwrap();
    let log = dir.path("sqcqd.log");
    let mut cmd = Command::new(SQCQD);
    cmd.env("NOTIFY_SOCKET", &notify.address)
        .arg("--config")
        .arg(&file);
    let (mut child, _guard) = spawn(&mut cmd, &log);
    notify.wait_for("READY=1");
    // The status sent with the `n`th READY=1.
    let mut status_at_ready = |n: usize| {
        wait_until("READY=1 again", || {
            notify.receive();
            notify
                .messages
                .iter()
                .filter(|m| m.lines().any(|l| l == "READY=1"))
                .count()
                >= n
        });
        let ready = notify
            .messages
            .iter()
            .filter(|m| m.lines().any(|l| l == "READY=1"))
            .nth(n - 1)
            .unwrap();
        let status = ready.lines().find_map(|l| l.strip_prefix("STATUS="));
        status.expect("a status with READY=1").to_owned()
    };
    let sighup = || {
        // SAFETY: kill() with a child's pid and a signal number.
        assert_eq!(unsafe { libc::kill(pid(child.id()), libc::SIGHUP) }, 0);
    };
    assert_eq!(status_at_ready(1), "serving 1 device, 1 worker");

    std::fs::write(&file, "workers = [\n").unwrap();
    sighup();
    let status = status_at_ready(2);
    assert!(
        status.starts_with("reload failed: invalid config file"),
        "{status}"
    );
    assert!(status.ends_with("; serving 1 device, 1 worker"), "{status}");

    std::fs::write(&file, format!("seccomp = \"errno\"\n{good}")).unwrap();
    sighup();
    let status = status_at_ready(3);
    assert!(status.starts_with("reload failed: "), "{status}");
    assert!(status.contains("restart the daemon to apply"), "{status}");

    let out = Command::new(SQCQD)
        .args(["rpc", "--admin-socket"])
        .arg(&admin)
        .arg("config_reload")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("restart the daemon to apply"), "{stderr}");
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        result["errors"].as_array().map(Vec::len),
        Some(1),
        "{result}"
    );
    let status = status_at_ready(4);
    assert!(status.contains("restart the daemon to apply"), "{status}");

    std::fs::write(&file, &good).unwrap();
    let out = Command::new(SQCQD)
        .args(["rpc", "--admin-socket"])
        .arg(&admin)
        .arg("config_reload")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(status_at_ready(5), "serving 1 device, 1 worker");
    sighup();
    assert_eq!(status_at_ready(6), "serving 1 device, 1 worker");
    let reloading = notify
        .messages
        .iter()
        .filter(|m| m.lines().any(|l| l == "RELOADING=1"))
        .count();
    assert_eq!(reloading, 5, "each reload is framed: {:?}", notify.messages);
    sigterm_exits_zero(&mut child);
}
