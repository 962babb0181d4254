//! The admin socket serves several clients at once, with the real
//! binary: clients that hold a connection open without a command, send a
//! byte now and then, or do not read their replies delay no other
//! client's call, however many they are; past the connection limit the
//! one idle longest is closed; changes stay serialised and answered; a
//! backstore slow to open holds no other call.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;

const SQCQD: &str = env!("CARGO_BIN_EXE_sqcqd");

/// Requests the client that does not read its replies sends: their
/// replies fill its socket many times over, their bytes fit in it.
const DEAF: usize = 2000;

/// `sqcqd` with one SCSI device and the admin socket, under its seccomp
/// filter, its stderr in `log`; returns once the socket answers.
fn start(dir: &TempDir) -> (Child, LogOnPanic, std::path::PathBuf) {
    let admin = dir.path("admin.sock");
    let log = dir.path("sqcqd.log");
    let child = Command::new(SQCQD)
        .arg("--socket-path")
        .arg(dir.path("scsi.sock"))
        .arg("--admin-socket")
        .arg(&admin)
        .args(["--lun", "kind=ram,size=1M", "--queue-size", "64"])
        // What the server does is allowed by the filter.
        .args(["--seccomp", "kill"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let guard = LogOnPanic(log, child.id());
    wait_until("the admin socket answers", || {
        sqcq_target::rpc::call(&admin, "daemon_info", Default::default()).is_ok()
    });
    (child, guard, admin)
}

/// Runs the client `sqcqd ARGS...`; fails the test if it has not ended
/// within [`WAIT`] (a call that waits for other clients would: an idle
/// one held the socket for 30 s).
fn client(args: &[&str], admin: &Path) -> Output {
    let mut child = Command::new(SQCQD)
        .arg(args[0])
        .arg("--admin-socket")
        .arg(admin)
        .args(&args[1..])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + WAIT;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("sqcqd {args:?} not answered within {WAIT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

fn stdout(out: &Output) -> String {
    assert!(out.status.success(), "{out:?}");
    stdout_of(out)
}

fn stdout_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Calls, a change among them, each on its own connection, all
/// answered.
fn calls_are_answered(admin: &Path, lun: u16) {
    let list = stdout(&client(&["rpc", "device_list"], admin));
    assert!(list.contains("\"socket_path\""), "{list}");
    let stats = stdout(&client(&["rpc", "stats_get"], admin));
    assert!(stats.contains("\"queues\""), "{stats}");
    let added = stdout(&client(
        &[
            "rpc",
            "lun_add",
            "device=0",
            &format!("lun={lun}"),
            "kind=ram",
            "size=1M",
        ],
        admin,
    ));
    assert!(added.contains(&format!("\"lun\": {lun}")), "{added}");
    let list: serde_json::Value =
        serde_json::from_str(&stdout(&client(&["rpc", "device_list"], admin))).unwrap();
    assert!(
        list[0]["luns"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["lun"] == lun),
        "the change is made: {list}"
    );
}

/// A request line for `method` (no parameters) with id `id`.
fn request(method: &str, id: usize) -> String {
    format!("{{\"jsonrpc\":\"2.0\",\"method\":\"{method}\",\"id\":{id}}}\n")
}

fn connect(admin: &Path) -> UnixStream {
    let s = UnixStream::connect(admin).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s
}

/// Sends `line` on `s` and reads one reply.
fn ask(s: &mut UnixStream, line: &str) -> serde_json::Value {
    s.write_all(line.as_bytes()).unwrap();
    let mut reply = String::new();
    BufReader::new(s).read_line(&mut reply).unwrap();
    serde_json::from_str(&reply).unwrap_or_else(|e| panic!("{reply:?}: {e}"))
}

#[test]
fn an_idle_client_and_a_trickling_one_delay_no_other_call() {
    let dir = TempDir::new("admin-idle");
    let (mut child, _guard, admin) = start(&dir);
    // Connected, silent.
    let mut idle = connect(&admin);
    // A command that never ends: a byte a second.
    let trickling = Arc::new(AtomicBool::new(true));
    let trickle = {
        let mut s = connect(&admin);
        let go = Arc::clone(&trickling);
        std::thread::spawn(move || {
            s.write_all(b"{\"jsonrpc\": \"2.0\", ").unwrap();
            while go.load(Ordering::Relaxed) {
                if s.write_all(b" ").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    // One that sends requests and does not read the replies (more than
    // the socket holds).
    let mut deaf = connect(&admin);
    let requests: String = (0..DEAF).map(|id| request("daemon_info", id)).collect();
    deaf.write_all(requests.as_bytes()).unwrap();

    calls_are_answered(&admin, 1);
    std::thread::sleep(Duration::from_secs(2));
    calls_are_answered(&admin, 2);

    // The idle client is served in turn when it speaks.
    let reply = ask(&mut idle, &request("stats_get", 1));
    assert!(reply["result"]["queues"].is_array(), "{reply}");
    // The deaf one gets its replies once it reads, in order.
    let mut r = BufReader::new(&mut deaf);
    for id in 0..DEAF {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let reply: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(reply["id"], id, "{line}");
        assert_eq!(reply["result"]["devices"], 1, "{line}");
    }
    trickling.store(false, Ordering::Relaxed);
    trickle.join().unwrap();
    sigterm_exits_zero(&mut child);
}

#[test]
fn many_idle_clients_delay_no_call_and_the_longest_idle_makes_room() {
    let dir = TempDir::new("admin-many");
    let (mut child, _guard, admin) = start(&dir);
    let mut first: Vec<UnixStream> = (0..50).map(|_| connect(&admin)).collect();
    calls_are_answered(&admin, 1);
    // Past the limit (64): each new connection closes the one idle
    // longest, the first ones here.
    let rest: Vec<UnixStream> = (0..60).map(|_| connect(&admin)).collect();
    calls_are_answered(&admin, 2);
    let mut b = [0u8; 1];
    assert_eq!(
        first[0].read(&mut b).unwrap(),
        0,
        "the idle longest is closed"
    );
    // The newest idle connections still work.
    let mut last = rest.into_iter().last().unwrap();
    let reply = ask(&mut last, &request("daemon_info", 1));
    assert_eq!(reply["result"]["devices"], 1, "{reply}");
    first.clear();
    let log = std::fs::read_to_string(dir.path("sqcqd.log")).unwrap();
    assert!(log.contains("closing the one idle longest"), "{log}");
    sigterm_exits_zero(&mut child);
}

/// A backstore whose open takes long, for real: an RBD LUN whose
/// monitor accepts the connection (the kernel completes it into the
/// listener's backlog) and never says a word, with a connect time-out
/// longer than the test. While a `device_create` and a `lun_add` wait for
/// it, reads, conflicting calls (the same socket path, the same LUN) and
/// other changes are answered; a shutdown meanwhile does not wait for
/// them and leaves no device behind.
#[cfg(feature = "rbd")]
#[test]
fn a_slow_backstore_open_holds_no_other_call_and_no_shutdown() {
    let dir = TempDir::new("admin-slow-open");
    let monitor = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    monitor.set_nonblocking(true).unwrap();
    let port = monitor.local_addr().unwrap().port();
    let conf = dir.path("ceph.conf");
    std::fs::write(
        &conf,
        format!(
            "[global]\nmon host = v2:127.0.0.1:{port}\nms bind msgr1 = false\n\
             auth client required = none\n[client]\nclient mount timeout = 120\n"
        ),
    )
    .unwrap();
    let admin = dir.path("admin.sock");
    let log = dir.path("sqcqd.log");
    // No seccomp: it refuses RBD LUNs.
    let mut child = Command::new(SQCQD)
        .arg("--socket-path")
        .arg(dir.path("scsi.sock"))
        .arg("--admin-socket")
        .arg(&admin)
        .args(["--lun", "kind=ram,size=1M", "--queue-size", "64"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let _guard = LogOnPanic(log, child.id());
    wait_until("the admin socket answers", || {
        sqcq_target::rpc::call(&admin, "daemon_info", Default::default()).is_ok()
    });
    let rbd_sock = dir.path("rbd.sock");
    let slow = {
        let params = serde_json::json!({
            "socket-path": rbd_sock,
            "type": "blk",
            "lun": [{"kind": "rbd", "pool": "any", "image": "any", "conf": conf}],
        });
        let (admin, params) = (admin.clone(), params.as_object().cloned().unwrap());
        std::thread::spawn(move || sqcq_target::rpc::call(&admin, "device_create", params))
    };
    let slow_lun = {
        let params = serde_json::json!({
            "device": 0, "lun": 1, "kind": "rbd", "pool": "any", "image": "any", "conf": conf,
        });
        let (admin, params) = (admin.clone(), params.as_object().cloned().unwrap());
        std::thread::spawn(move || sqcq_target::rpc::call(&admin, "lun_add", params))
    };
    // librados is inside its connect, for each: the opens are under way.
    let mut held = Vec::new();
    wait_until("librados connects to the monitor twice", || {
        held.extend(monitor.accept().ok());
        held.len() >= 2
    });

    // Each answered within the client's bound, not after the open.
    let list = stdout(&client(&["rpc", "device_list"], &admin));
    assert!(
        list.contains("scsi.sock") && !list.contains("rbd.sock"),
        "{list}"
    );
    let stats = stdout(&client(&["rpc", "stats_get"], &admin));
    assert!(stats.contains("\"queues\""), "{stats}");
    // The socket path is taken while its device is being created.
    let path = format!("socket-path={}", rbd_sock.display());
    let same = client(
        &["rpc", "device_create", &path, "lun:=[\"kind=ram,size=1M\"]"],
        &admin,
    );
    let said = format!(
        "{}{}",
        stdout_of(&same),
        String::from_utf8_lossy(&same.stderr)
    );
    assert!(
        !same.status.success() && said.contains("in use by device 1"),
        "{said}"
    );
    // Another device is created meanwhile, under the next number.
    let other = dir.path("other.sock");
    let path = format!("socket-path={}", other.display());
    let created = stdout(&client(
        &["rpc", "device_create", &path, "lun:=[\"kind=ram,size=1M\"]"],
        &admin,
    ));
    assert!(created.contains("\"device\": 2"), "{created}");
    // So is LUN 1 of device 0 while its backstore opens.
    let same = client(
        &["rpc", "lun_add", "device=0", "lun=1", "kind=ram", "size=1M"],
        &admin,
    );
    let said = format!(
        "{}{}",
        stdout_of(&same),
        String::from_utf8_lossy(&same.stderr)
    );
    assert!(!same.status.success() && said.contains("exists"), "{said}");
    let added = stdout(&client(
        &["rpc", "lun_add", "device=0", "lun=2", "kind=ram", "size=1M"],
        &admin,
    ));
    assert!(added.contains("\"lun\": 2"), "{added}");
    assert!(!slow.is_finished(), "the slow opens are still under way");
    assert!(!slow_lun.is_finished());

    // A shutdown meanwhile ends the daemon in its bound and leaves
    // nothing of the device being created.
    sigterm_exits_zero(&mut child);
    assert!(!rbd_sock.exists(), "no half-created device");
    assert!(!other.exists(), "the other device was stopped");
    let reply = slow.join().unwrap();
    assert!(
        !matches!(reply, Ok(Ok(_))),
        "the slow create did not succeed: {reply:?}"
    );
    let reply = slow_lun.join().unwrap();
    assert!(!matches!(reply, Ok(Ok(_))), "{reply:?}");
    drop(held);
}
