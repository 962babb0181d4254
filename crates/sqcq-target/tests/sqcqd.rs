//! The `sqcqd` binary: command line, serving, and SIGTERM (finish, exit 0).

// Test code: lengths and indices are small constants of the test.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::driver::*;
use common::*;
use sqcq_driver::scsi::Cdb;

#[test]
fn sqcqd_serves_and_exits_zero_on_sigterm() {
    let dir = TempDir::new("bin");
    let socket = dir.path("sqcqd.sock");
    // A stale socket file from an earlier run (nobody listens) is replaced.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let mut child = Command::new(env!("CARGO_BIN_EXE_sqcqd"))
        .arg("--socket-path")
        .arg(&socket)
        .args([
            "--lun",
            "kind=ram,size=4M",
            "--num-queues",
            "2",
            "--workers",
            "2",
        ])
        .args(["--queue-size", "64"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path("sqcqd.log")).unwrap())
        .spawn()
        .unwrap();
    let _log = LogOnPanic(dir.path("sqcqd.log"), child.id());

    let mut d = Driver::connect(&socket);
    let (rq0, rq1) = d.two_rqs();
    rq0.clear_unit_attention(0);
    let r = rq1.inquiry(0);
    assert!(r.good(), "{r:?}");
    assert_eq!(&r.data[8..12], b"SQCQ");

    sigterm_exits_zero(&mut child);
    assert!(!socket.exists(), "the socket is removed on exit");
    drop(d);
}

#[test]
fn sqcqd_rejects_a_bad_lun_spec() {
    let status = Command::new(env!("CARGO_BIN_EXE_sqcqd"))
        .args(["--socket-path", "/nonexistent/x.sock", "--lun", "kind=tape"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success());
}

#[test]
fn sqcqd_serves_ro_true_read_only_and_refuses_a_misspelt_switch() {
    let dir = TempDir::new("bin-ro");
    let socket = dir.path("sqcqd.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_sqcqd"))
        .arg("--socket-path")
        .arg(&socket)
        .args(["--lun", "kind=ram,size=4M,ro=true"])
        .args(["--lun", "kind=ram,size=4M,read-only=yes"])
        .args(["--lun", "kind=ram,size=4M,ro=0", "--num-queues", "2"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path("sqcqd.log")).unwrap())
        .spawn()
        .unwrap();
    let _log = LogOnPanic(dir.path("sqcqd.log"), child.id());
    let mut d = Driver::connect(&socket);
    let (rq, _) = d.two_rqs();
    for (lun, protected) in [(0, true), (1, true), (2, false)] {
        rq.clear_unit_attention(lun);
        let r = rq.command(lun_at(0, lun), Cdb::write_10(0, 1, false), &[0xa5; 512], 0);
        if protected {
            // DATA PROTECT, WRITE PROTECTED.
            assert_eq!(r.key_asc(), Some((7, 0x27)), "LUN {lun}: {r:?}");
        } else {
            assert!(r.good(), "LUN {lun}: {r:?}");
        }
    }
    sigterm_exits_zero(&mut child);
    drop(d);

    let out = Command::new(env!("CARGO_BIN_EXE_sqcqd"))
        .arg("--socket-path")
        .arg(dir.path("other.sock"))
        .args(["--lun", "kind=ram,size=4M,ro=ture"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not a boolean"), "{err}");
}

fn sqcqd_on(socket: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sqcqd"))
        .arg("--socket-path")
        .arg(socket)
        .args(["--lun", "kind=null,size=1M"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn sqcqd_never_replaces_a_file_or_a_live_socket() {
    let dir = TempDir::new("bin-safe");
    // A disk image where the socket should go is left alone.
    let image = dir.path("disk.img");
    std::fs::write(&image, b"precious data").unwrap();
    let out = sqcqd_on(&image);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a socket"), "stderr: {err}");
    assert!(out.stdout.is_empty(), "logs go to stderr, not stdout");
    assert_eq!(std::fs::read(&image).unwrap(), b"precious data");

    // A socket another process listens on is not taken over.
    let live = dir.path("live.sock");
    let listener = std::os::unix::net::UnixListener::bind(&live).unwrap();
    let out = sqcqd_on(&live);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use"), "stderr: {err}");
    assert!(live.exists(), "the live socket is not removed");
    drop(listener);
}

#[test]
fn sqcqd_runs_unprivileged_with_the_filter() {
    let dir = TempDir::new("bin-unprivileged");
    let socket = dir.path("sqcqd.sock");
    let image = dir.path("disk.img");
    // SAFETY: getuid has no preconditions.
    let root = unsafe { libc::getuid() } == 0;
    let mut cmd = if root {
        // As root (CI), drop to nobody the documented way; the daemon must
        // create its socket and its LUN file in a directory nobody owns.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o777)).unwrap();
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--no-new-privs",
        ])
        .arg(env!("CARGO_BIN_EXE_sqcqd"));
        c
    } else {
        Command::new(env!("CARGO_BIN_EXE_sqcqd"))
    };
    let mut child = cmd
        .args(["--seccomp", "kill", "--socket-path"])
        .arg(&socket)
        .arg("--lun")
        .arg(format!("kind=file,path={},size=4M,create", image.display()))
        .args(["--queue-size", "64", "--num-queues", "2"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path("sqcqd.log")).unwrap())
        .spawn()
        .unwrap();
    let _log = LogOnPanic(dir.path("sqcqd.log"), child.id());

    let mut d = Driver::connect(&socket);
    // The filter is applied right after start-up.
    let proc_status = format!("/proc/{}/status", child.id());
    let deadline = Instant::now() + WAIT;
    let status = loop {
        let status = std::fs::read_to_string(&proc_status).unwrap();
        if status.contains("Seccomp:\t2") {
            break status;
        }
        assert!(Instant::now() < deadline, "no seccomp filter: {status}");
        std::thread::sleep(Duration::from_millis(10));
    };
    if root {
        assert!(status.contains("Uid:\t65534"), "{status}");
    }
    let rq = &mut d.rqs[0];
    rq.clear_unit_attention(0);
    let lun = lun_at(0, 0);
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i % 241) as u8).collect();
    let r = rq.command(lun, Cdb::write_10(64, 8, false), &pattern, 0);
    assert!(r.good(), "{r:?}");
    let r = rq.command(lun, Cdb::synchronize_cache_10(0, 0), &[], 0);
    assert!(r.good(), "SYNCHRONIZE CACHE: {r:?}");
    let r = rq.command(lun, Cdb::read_10(64, 8, false), &[], 4096);
    assert!(r.good(), "{r:?}");
    assert_eq!(r.data, pattern);
    sigterm_exits_zero(&mut child);
    assert_eq!(
        std::fs::read(&image).unwrap()[64 * 512..72 * 512],
        pattern[..],
        "the data is in the file"
    );
    drop(d);
}

/// Operator mistakes, each answered with one line that says what to do
/// (issue 32, item 9): `(arguments, exit code, a fragment of stdout or
/// stderr)`.
#[test]
fn operator_mistakes_get_one_line_that_says_what_to_do() {
    let dir = TempDir::new("bin-mistakes");
    let socket = dir.path("m.sock");
    let socket = socket.to_str().unwrap();
    let missing = dir.path("missing.img");
    let missing = format!("kind=file,path={}", missing.display());
    let cases: &[(&[&str], i32, &str)] = &[
        (
            &["version"],
            0,
            concat!("sqcqd ", env!("CARGO_PKG_VERSION")),
        ),
        (&["help"], 0, "sqcqd rpc [--admin-socket PATH] METHOD"),
        (&["--help"], 0, "sqcqd version | help | completions"),
        (
            &["--socket-path", socket, "--lun", &missing],
            1,
            "does not exist: check the path, or add create (with size=)",
        ),
        (
            // Beyond the 128 TiB of a process's address space, whatever
            // the machine's overcommit policy.
            &["--socket-path", socket, "--lun", "kind=ram,size=200T"],
            1,
            "give a smaller size=, or use kind=file",
        ),
        (
            &["--socket-path", socket, "--lun", "kind=ram,size=4M,ro=ture"],
            2,
            "is not a boolean",
        ),
        (
            &[
                "--socket-path",
                socket,
                "--lun",
                "kind=null,size=1M",
                "--save-config",
                "saved.toml",
            ],
            2,
            "give an absolute path",
        ),
        (
            &[
                "--socket-path",
                socket,
                "--device-type",
                "blk",
                "--lun",
                "kind=null,size=1M,iops=100",
            ],
            2,
            "not iops=/bps= on its --lun",
        ),
        (
            &["--socket-path", socket, "--log-level", "loud"],
            2,
            "\"loud\" names no level",
        ),
        // The client checks parameters against the method's schema before
        // it connects.
        (
            &[
                "rpc",
                "--admin-socket",
                "/nonexistent/a.sock",
                "lun_add",
                "device=zero",
                "lun=1",
                "kind=ram",
            ],
            2,
            "device is an integer",
        ),
        (
            &[
                "rpc",
                "--admin-socket",
                "/nonexistent/a.sock",
                "lun_add",
                "device=0",
                "ro=1",
            ],
            2,
            "lun_add has no parameter \"ro\": lun_add takes device, lun, kind",
        ),
        (
            &[
                "rpc",
                "--admin-socket",
                "/nonexistent/a.sock",
                "device_lsit",
            ],
            2,
            "no method \"device_lsit\" (sqcqd rpc help lists them)",
        ),
        (
            &[
                "rpc",
                "--admin-socket",
                "/nonexistent/a.sock",
                "device_list",
            ],
            2,
            "/nonexistent/a.sock: No such file or directory",
        ),
        (
            &["rpc", "help", "config_save"],
            0,
            "path  string   optional",
        ),
        (&["completions", "tcsh"], 2, "bash, zsh, fish"),
        (
            &["top", "--admin-socket", "/nonexistent/a.sock"],
            2,
            "sqcqd top: /nonexistent/a.sock: cannot reach the daemon",
        ),
        (&["top", "--interval", "0"], 2, "at least 0.1 s"),
        (
            &[
                "rpc",
                "--admin-socket",
                "/nonexistent/a.sock",
                "device_list",
                "--human",
            ],
            2,
            "device_list has no table (only stats_get)",
        ),
        (&["rpc", "lun_add", "--help"], 0, "lun_add: Add a LUN"),
    ];
    for (args, code, fragment) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_sqcqd"))
            .args(*args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(*code), "{args:?}: {text}");
        assert!(text.contains(fragment), "{args:?}: {text}");
        assert!(!std::path::Path::new(socket).exists(), "{args:?}");
    }
}

/// `sqcqd top --batch` and `sqcqd rpc stats_get --human` on a daemon
/// that the project's driver keeps busy: the device and its queues are
/// there, with requests counted.
#[test]
fn top_and_the_human_table_show_a_device_at_work() {
    let dir = TempDir::new("bin-top");
    let socket = dir.path("sqcqd.sock");
    let admin = dir.path("admin.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_sqcqd"))
        .arg("--socket-path")
        .arg(&socket)
        .arg("--admin-socket")
        .arg(&admin)
        .args(["--lun", "kind=null,size=64M", "--num-queues", "2"])
        .args(["--queue-size", "64", "--workers", "2"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path("sqcqd.log")).unwrap())
        .spawn()
        .unwrap();
    let _log = LogOnPanic(dir.path("sqcqd.log"), child.id());
    let mut child = Running(child);
    let mut d = Driver::connect(&socket);
    let (rq0, rq1) = d.two_rqs();
    rq0.clear_unit_attention(0);
    let admin_arg = admin.to_str().unwrap();
    // Ends by itself, after its two frames.
    let mut top = Command::new(env!("CARGO_BIN_EXE_sqcqd"))
        .args(["top", "--admin-socket", admin_arg, "--batch"])
        .args(["--iterations", "2", "--interval", "0.2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Reads on both request queues until top has shown its frames.
    let deadline = Instant::now() + WAIT;
    while top.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "sqcqd top did not end");
        for rq in [&mut *rq0, &mut *rq1] {
            let r = rq.command(lun_at(0, 0), Cdb::read_10(0, 8, false), &[], 4096);
            assert!(r.good(), "{r:?}");
        }
    }
    let out = top.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Two frames, each with the device and both its queues, and IOPS (the
    // fourth field) in at least one: a frame is a rate over 0.2 s, which a
    // loaded machine can leave the driver's thread without a turn.
    let devices: Vec<Vec<&str>> = text
        .lines()
        .filter(|l| l.starts_with("0 scsi "))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(devices.len(), 2, "{text}");
    for fields in &devices {
        assert_eq!(fields[2], "connected", "{text}");
    }
    assert!(devices.iter().any(|f| f[3] != "0"), "no IOPS: {text}");
    for vq in ["  vq 2 ", "  vq 3 "] {
        assert_eq!(
            text.lines().filter(|l| l.starts_with(vq)).count(),
            2,
            "{text}"
        );
    }

    let human = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_sqcqd"))
            .args(["rpc", "--admin-socket", admin_arg, "stats_get"])
            .args(args)
            .output()
            .unwrap()
    };
    let out = human(&["--human"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    assert!(
        table.contains(&format!("device 0: scsi, connected, {}", socket.display())),
        "{table}"
    );
    // The queues' rows: VQ, STATE, WORKER, REQUESTS (not 0).
    for vq in ["2", "3"] {
        let row: Vec<&str> = table
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.first() == Some(&vq))
            .unwrap_or_else(|| panic!("no row of vq {vq}: {table}"));
        assert_ne!(row[3], "0", "no requests on vq {vq}: {table}");
    }
    assert!(table.lines().all(|l| l.len() <= 80), "{table}");
    let out = human(&["device=7", "--human"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("stats_get: no device 7"), "{err}");
    drop(d);
    sigterm_exits_zero(&mut child.0);
}

/// `--log-format` and `--log-level`, and the journal's format chosen by
/// itself when stderr is the journal stream (`JOURNAL_STREAM`): every
/// line of a start that fails (a missing image) in the form asked for.
#[test]
fn log_lines_in_the_format_and_at_the_level_asked_for() {
    use std::os::unix::fs::MetadataExt;
    let dir = TempDir::new("bin-log-format");
    let socket = dir.path("l.sock");
    let missing = format!("kind=file,path={}", dir.path("missing.img").display());
    let run = |extra: &[&str], journal_stream: bool| {
        let log = dir.path("stderr.log");
        let file = std::fs::File::create(&log).unwrap();
        let meta = file.metadata().unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sqcqd"));
        cmd.arg("--socket-path")
            .arg(&socket)
            .args(["--lun", &missing])
            .args(extra)
            .env_remove("RUST_LOG")
            .env_remove("JOURNAL_STREAM")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file);
        if journal_stream {
            cmd.env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()));
        }
        let status = cmd.status().unwrap();
        assert_eq!(status.code(), Some(1), "{extra:?}");
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.contains("does not exist"), "{extra:?}: {text}");
        text
    };
    let json = run(&["--log-format", "json"], false);
    let levels: Vec<String> = json
        .lines()
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}"));
            assert!(v["timestamp"].is_string() && v["target"].is_string(), "{l}");
            v["level"].as_str().unwrap().to_owned()
        })
        .collect();
    assert!(levels.contains(&"INFO".to_owned()), "{json}");
    assert_eq!(levels.last().map(String::as_str), Some("ERROR"), "{json}");
    for journal in [run(&["--log-format", "journal"], false), run(&[], true)] {
        assert!(
            journal
                .lines()
                .all(|l| l.starts_with("<6>") || l.starts_with("<3>")),
            "{journal}"
        );
        assert!(
            journal.lines().last().unwrap().starts_with("<3>"),
            "{journal}"
        );
    }
    let text = run(&[], false);
    assert!(text.lines().any(|l| l.contains(" INFO ")), "{text}");
    assert!(!text.starts_with('<'), "not the journal's form: {text}");
    let quiet = run(&["--log-level", "warn"], false);
    assert!(!quiet.contains("INFO"), "{quiet}");
    assert!(quiet.contains("ERROR"), "{quiet}");
}
