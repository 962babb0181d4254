//! The Prometheus endpoint end to end: the daemon serves I/O driven by
//! the project's driver, the endpoint is scraped over TCP and over a Unix
//! socket, and what it answers is parsed by Prometheus' reference parser
//! (`prometheus_client.parser`, Debian's `python3-prometheus-client`,
//! through `prometheus_parse.py`). Without that parser the scrape tests
//! are skipped, or fail under `SQCQ_REQUIRE_PEERS` (the project's test
//! command, whose set-up installs it). Hostile clients need no parser.

// Test code: lengths and indices are small constants of the test.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::driver::*;
use common::*;
use serde_json::Value;
use sqcq_driver::scsi::Cdb;
use sqcq_target::config::{BackstoreKind, DeviceConfig, DeviceType, PollOptions, QueueMap};
use sqcq_target::prometheus::MetricsListen;

/// A Python with `prometheus_client`: `$SQCQ_PYTHON`, Debian's
/// `/usr/bin/python3`, or `python3`. `None` (after saying why) when there
/// is none, a failure under `SQCQ_REQUIRE_PEERS`.
fn python() -> Option<String> {
    let candidates = std::env::var("SQCQ_PYTHON")
        .into_iter()
        .chain(["/usr/bin/python3".to_owned(), "python3".to_owned()]);
    for py in candidates {
        let ok = Command::new(&py)
            .args(["-c", "import prometheus_client.parser"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Some(py);
        }
    }
    let why = "no python3 with prometheus_client (Debian: python3-prometheus-client, \
               which scripts/setup.sh installs)";
    assert!(
        std::env::var_os("SQCQ_REQUIRE_PEERS").is_none(),
        "{why}; SQCQ_REQUIRE_PEERS is set, so nothing may be skipped"
    );
    eprintln!("SKIPPED: {why}");
    None
}

/// The families of an exposition, as the reference parser reads them.
fn parse(python: &str, body: &str) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/prometheus_parse.py");
    let mut child = Command::new(python)
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the parser refused the exposition: {}\n{body}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Sends `request` and reads the whole answer (the server closes).
fn exchange(mut s: impl Read + Write, request: &[u8]) -> String {
    s.write_all(request).unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).unwrap();
    String::from_utf8(answer).unwrap()
}

const GET: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: sqcq\r\n\r\n";

fn tcp(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s
}

fn unix(path: &Path) -> UnixStream {
    let s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s
}

/// The body of a `200` answer with the exposition's content type.
fn body(answer: &str) -> &str {
    let (head, body) = answer.split_once("\r\n\r\n").expect("a whole answer");
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(
        head.contains("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
        "{head}"
    );
    assert!(head.contains("\r\nConnection: close"), "{head}");
    body
}

/// The samples named `sample` of family `family` whose labels include
/// `labels`, as (labels, value).
fn samples(
    f: &Value,
    family: &str,
    sample: &str,
    labels: &[(&str, &str)],
) -> Vec<(BTreeMap<String, String>, f64)> {
    f[family]["samples"]
        .as_array()
        .unwrap_or_else(|| panic!("no family {family}"))
        .iter()
        .filter(|s| s[0] == sample)
        .map(|s| {
            let l: BTreeMap<String, String> = serde_json::from_value(s[1].clone()).unwrap();
            (l, s[2].as_f64().unwrap())
        })
        .filter(|(l, _)| {
            labels
                .iter()
                .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .collect()
}

/// The one sample of `family` with `labels`.
fn value(f: &Value, family: &str, sample: &str, labels: &[(&str, &str)]) -> f64 {
    let s = samples(f, family, sample, labels);
    assert_eq!(s.len(), 1, "{sample}{labels:?}: {s:?}");
    s[0].1
}

fn queue_value(f: &Value, family: &str, vq: u16) -> u64 {
    let vq = vq.to_string();
    value(f, family, &format!("{family}_total"), &[("vq", &vq)]) as u64
}

/// Families every scrape has, with their types (names as the parser
/// gives them: counters without `_total`).
const FAMILIES: &[(&str, &str)] = &[
    ("sqcq_queue_requests", "counter"),
    ("sqcq_queue_read_bytes", "counter"),
    ("sqcq_queue_written_bytes", "counter"),
    ("sqcq_queue_latency_seconds", "histogram"),
    ("sqcq_queue_in_flight", "gauge"),
    ("sqcq_queue_used_publishes", "counter"),
    ("sqcq_queue_kicks", "counter"),
    ("sqcq_queue_calls", "counter"),
    ("sqcq_queue_spins", "counter"),
    ("sqcq_queue_sleeps", "counter"),
    ("sqcq_queue_resubmitted", "counter"),
    ("sqcq_queue_mode", "gauge"),
    ("sqcq_queue_running", "gauge"),
    ("sqcq_queue_broken", "gauge"),
    ("sqcq_queue_need_wakeup", "gauge"),
    ("sqcq_queue_submission_gap_seconds", "gauge"),
    ("sqcq_queue_spin_window_seconds", "gauge"),
    ("sqcq_queue_info", "gauge"),
    ("sqcq_device_info", "gauge"),
    ("sqcq_device_errors", "counter"),
    ("sqcq_lun_capacity_bytes", "gauge"),
    ("sqcq_lun_block_size_bytes", "gauge"),
    ("sqcq_lun_ops", "counter"),
    ("sqcq_lun_bytes", "counter"),
    ("sqcq_lun_errors", "counter"),
    ("sqcq_lun_time_seconds", "counter"),
    ("sqcq_worker_queues", "gauge"),
    ("sqcq_worker_wakeups", "counter"),
    ("sqcq_worker_yields", "counter"),
    ("sqcq_worker_contested_yields", "counter"),
    ("sqcq_worker_long_yields", "counter"),
    ("sqcq_worker_handover_sleeps", "counter"),
    ("sqcq_worker_cpu_displaced", "gauge"),
    ("sqcq_worker_cpu_displacements", "counter"),
    ("sqcq_worker_cpu_seconds", "counter"),
    ("sqcq_build_info", "gauge"),
    ("process_cpu_seconds", "counter"),
    ("process_resident_memory_bytes", "gauge"),
    ("process_virtual_memory_bytes", "gauge"),
    ("process_threads", "gauge"),
    ("process_start_time_seconds", "gauge"),
    ("process_open_fds", "gauge"),
    ("process_max_fds", "gauge"),
];

/// Every family is there with its type and help, and every queue's
/// histogram is cumulative and counts what `sqcq_queue_requests` does.
fn check_shape(f: &Value) {
    for (name, kind) in FAMILIES {
        assert_eq!(f[name]["type"], *kind, "{name}");
        assert!(!f[name]["help"].as_str().unwrap().is_empty(), "{name}");
    }
    for (labels, requests) in samples(f, "sqcq_queue_requests", "sqcq_queue_requests_total", &[]) {
        let vq = [("vq", labels["vq"].as_str())];
        let buckets = samples(
            f,
            "sqcq_queue_latency_seconds",
            "sqcq_queue_latency_seconds_bucket",
            &vq,
        );
        assert_eq!(buckets.len(), 24, "{buckets:?}");
        let mut last = (0.0, 0.0);
        for (l, n) in &buckets {
            let le: f64 = match l["le"].as_str() {
                "+Inf" => f64::INFINITY,
                le => le.parse().unwrap(),
            };
            assert!(le > last.0 && *n >= last.1, "not cumulative: {buckets:?}");
            last = (le, *n);
        }
        let count = value(
            f,
            "sqcq_queue_latency_seconds",
            "sqcq_queue_latency_seconds_count",
            &vq,
        );
        assert_eq!(last, (f64::INFINITY, count), "+Inf is the count");
        assert_eq!(count, requests, "every completed request is timed");
    }
}

/// A daemon with one SCSI device (LUN 0: 8 MiB of RAM, LUN 1: a null
/// LUN of 1 GiB), two request queues on two workers, and the endpoint on
/// `listen`.
fn start_daemon(dir: &TempDir, listen: MetricsListen) -> (sqcq_target::Daemon, PathBuf) {
    let (mut config, socket) = config_with(dir, 2, PollOptions::default());
    config.service.metrics = Some(listen);
    config.validate().unwrap();
    (sqcq_target::Daemon::start(&config).unwrap(), socket)
}

/// `n` commands of 4 KiB on `rq`, `depth` at a time; returns them all
/// good.
fn io(rq: &mut Rq, lun: u16, write: bool, n: u32, depth: u32) {
    let data = vec![0x5a; 4096];
    let mut lba = 0;
    let mut left = n;
    while left > 0 {
        let batch = left.min(depth);
        for _ in 0..batch {
            let (cdb, out, din) = if write {
                (Cdb::write_10(lba, 8, false), &data[..], 0)
            } else {
                (Cdb::read_10(lba, 8, false), &[][..], 4096)
            };
            rq.submit(lun_at(0, lun), cdb, out, din);
            lba += 8;
        }
        rq.publish();
        for r in rq.wait(batch as usize) {
            assert!(r.good(), "{r:?}");
        }
        left -= batch;
    }
}

#[test]
fn a_tcp_scrape_parses_and_counts_every_request() {
    let Some(py) = python() else { return };
    let dir = TempDir::new("metrics-tcp");
    let any_port = MetricsListen::Tcp("127.0.0.1:0".parse().unwrap());
    let (daemon, socket) = start_daemon(&dir, any_port);
    let Some(&MetricsListen::Tcp(addr)) = daemon.metrics_endpoint() else {
        panic!("{:?}", daemon.metrics_endpoint())
    };
    assert_ne!(addr.port(), 0, "the port chosen is told");
    let mut d = Driver::connect(&socket);
    let (rq0, rq1) = d.two_rqs();
    rq0.clear_unit_attention(0);
    rq1.clear_unit_attention(1);
    let before = parse(&py, body(&exchange(tcp(addr), GET)));
    check_shape(&before);

    // vq 2 (worker 0): writes then reads on the RAM LUN, one at a time
    // and 8 at a time; vq 3 (worker 1): reads of the null LUN, 16 at a
    // time.
    io(rq0, 0, true, 20, 1);
    io(rq0, 0, false, 30, 8);
    io(rq1, 1, false, 64, 16);

    let after = parse(&py, body(&exchange(tcp(addr), GET)));
    check_shape(&after);
    let delta = |family, vq| queue_value(&after, family, vq) - queue_value(&before, family, vq);
    assert_eq!(delta("sqcq_queue_requests", 2), 50);
    assert_eq!(delta("sqcq_queue_requests", 3), 64);
    assert_eq!(delta("sqcq_queue_written_bytes", 2), 20 * 4096);
    assert_eq!(delta("sqcq_queue_read_bytes", 2), 30 * 4096);
    assert_eq!(delta("sqcq_queue_read_bytes", 3), 64 * 4096);
    assert_eq!(delta("sqcq_queue_written_bytes", 3), 0);
    // Per LUN, whichever queue served it: LUN 0 wrote 20 and read 30,
    // LUN 1 read 64; nothing else, no error.
    let lun_delta = |family: &str, lun: &str, op: &str| {
        let sample = format!("{family}_total");
        let l = [("device", "0"), ("lun", lun), ("op", op)];
        value(&after, family, &sample, &l) - value(&before, family, &sample, &l)
    };
    for (lun, op, ops) in [
        ("0", "write", 20.0),
        ("0", "read", 30.0),
        ("1", "read", 64.0),
    ] {
        assert_eq!(lun_delta("sqcq_lun_ops", lun, op), ops, "LUN {lun} {op}");
        assert_eq!(
            lun_delta("sqcq_lun_bytes", lun, op),
            ops * 4096.0,
            "LUN {lun} {op}"
        );
        assert_eq!(lun_delta("sqcq_lun_errors", lun, op), 0.0);
        assert!(lun_delta("sqcq_lun_time_seconds", lun, op) >= 0.0);
    }
    for (lun, op) in [
        ("1", "write"),
        ("0", "flush"),
        ("1", "discard"),
        ("0", "write_zeroes"),
    ] {
        assert_eq!(lun_delta("sqcq_lun_ops", lun, op), 0.0, "LUN {lun} {op}");
    }
    for vq in ["2", "3"] {
        let l = [("vq", vq)];
        assert_eq!(
            value(&after, "sqcq_queue_in_flight", "sqcq_queue_in_flight", &l),
            0.0
        );
        assert!(queue_value(&after, "sqcq_queue_kicks", vq.parse().unwrap()) > 0);
        assert!(queue_value(&after, "sqcq_queue_calls", vq.parse().unwrap()) > 0);
        let mode = |m| {
            value(
                &after,
                "sqcq_queue_mode",
                "sqcq_queue_mode",
                &[l[0], ("mode", m)],
            )
        };
        // The default, `--poll auto`, polls the ring of a driver without
        // bit 42.
        assert_eq!(
            (mode("kick"), mode("ring-poll"), mode("sqcq")),
            (0.0, 1.0, 0.0)
        );
        assert_eq!(
            value(&after, "sqcq_queue_running", "sqcq_queue_running", &l),
            1.0
        );
    }
    // The queue map: vq 2 on worker 0, vq 3 on worker 1, one queue each.
    let info = samples(&after, "sqcq_queue_info", "sqcq_queue_info", &[]);
    let served: Vec<_> = info
        .iter()
        .map(|(l, _)| (l["vq"].clone(), l["worker"].clone()))
        .collect();
    assert_eq!(
        served,
        [("2".into(), "0".into()), ("3".into(), "1".into())],
        "{info:?}"
    );
    for w in ["0", "1"] {
        let l = [("worker", w)];
        assert_eq!(
            value(&after, "sqcq_worker_queues", "sqcq_worker_queues", &l),
            1.0
        );
        let cpu = "sqcq_worker_cpu_seconds";
        assert!(value(&after, cpu, "sqcq_worker_cpu_seconds_total", &l) > 0.0);
    }
    let capacity = |lun| {
        let l = [("lun", lun), ("device", "0")];
        value(
            &after,
            "sqcq_lun_capacity_bytes",
            "sqcq_lun_capacity_bytes",
            &l,
        )
    };
    assert_eq!(
        (capacity("0"), capacity("1")),
        (8.0 * 1048576.0, 1073741824.0)
    );
    let socket_name = socket.display().to_string();
    let l = [("name", socket_name.as_str()), ("type", "scsi")];
    assert_eq!(
        value(&after, "sqcq_device_info", "sqcq_device_info", &l),
        1.0
    );
    let l = [("class", "bad_lun")];
    assert_eq!(
        value(&after, "sqcq_device_errors", "sqcq_device_errors_total", &l),
        0.0
    );

    drop(d);
    daemon.shutdown();
    assert!(TcpStream::connect(addr).is_err(), "the endpoint closed");
}

#[test]
fn sqcqd_under_seccomp_serves_a_unix_socket_in_ring_poll_mode() {
    let Some(py) = python() else { return };
    let dir = TempDir::new("metrics-unix");
    let socket = dir.path("scsi.sock");
    let metrics = dir.path("metrics.sock");
    let log = dir.path("sqcqd.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_sqcqd"))
        .arg("--socket-path")
        .arg(&socket)
        .args(["--lun", "kind=null,size=64M", "--num-queues", "1"])
        .args(["--queue-size", "64", "--poll", "ring", "--seccomp", "kill"])
        .arg("--metrics-listen")
        .arg(format!("unix:{}", metrics.display()))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let _kill = KillOnDrop(child.id(), log);
    let mut d = Driver::connect(&socket);
    wait_until("the metrics socket", || metrics.exists());
    let mode = std::fs::metadata(&metrics).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600
    );
    let rq = &mut d.rqs[0];
    rq.clear_unit_attention(0);
    let before = parse(&py, body(&exchange(unix(&metrics), GET)));
    io(rq, 0, false, 40, 4);
    let after = parse(&py, body(&exchange(unix(&metrics), GET)));
    check_shape(&after);
    // Read from /proc under the filter (the daemon lives on: below).
    let fds = value(&after, "process_open_fds", "process_open_fds", &[]);
    assert!(fds >= 5.0, "sockets, eventfds and stdio: {fds}");
    let started = value(
        &after,
        "process_start_time_seconds",
        "process_start_time_seconds",
        &[],
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        started > now - 600.0 && started <= now + 1.0,
        "{started} vs {now}"
    );
    let build = [("version", env!("CARGO_PKG_VERSION"))];
    assert_eq!(
        value(&after, "sqcq_build_info", "sqcq_build_info", &build),
        1.0
    );
    assert_eq!(
        queue_value(&after, "sqcq_queue_requests", 2)
            - queue_value(&before, "sqcq_queue_requests", 2),
        40
    );
    let mode = |m| value(&after, "sqcq_queue_mode", "sqcq_queue_mode", &[("mode", m)]);
    assert_eq!(
        (mode("kick"), mode("ring-poll"), mode("sqcq")),
        (0.0, 1.0, 0.0)
    );
    // Once idle, the poller sleeps and its figures are taken in.
    let mut idle = after;
    wait_until("the poller's sleep in the figures", || {
        idle = parse(&py, body(&exchange(unix(&metrics), GET)));
        queue_value(&idle, "sqcq_queue_sleeps", 2) > 0
    });
    let window = "sqcq_queue_spin_window_seconds";
    assert!(
        value(&idle, window, window, &[("vq", "2")]) > 0.0,
        "a polled queue's window"
    );

    drop(d);
    signal(child.id(), libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(17);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "sqcqd did not exit");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "{status:?} (killed by seccomp?)");
    assert!(!metrics.exists(), "the metrics socket is removed on exit");
}

/// Sends `sig` to process `pid`.
fn signal(pid: u32, sig: i32) {
    let pid = libc::pid_t::try_from(pid).unwrap();
    // SAFETY: kill() takes no pointer.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

/// Prints the daemon's log and kills it if the test fails.
struct KillOnDrop(u32, PathBuf);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "sqcqd log:\n{}",
                std::fs::read_to_string(&self.1).unwrap_or_default()
            );
            signal(self.0, libc::SIGKILL);
        }
    }
}

#[test]
fn hostile_clients_get_400_or_are_closed_and_scrapes_go_on() {
    let dir = TempDir::new("metrics-hostile");
    let path = dir.path("metrics.sock");
    let (daemon, _socket) = start_daemon(&dir, MetricsListen::Unix(path.clone()));
    let status = |answer: &str| answer.lines().next().unwrap_or("").to_owned();

    // One that never sends holds a connection all along.
    let mut silent = unix(&path);
    // Garbage, a bad version, another path, another method.
    for (request, want) in [
        (
            &b"\x00\x01\x02 garbage\r\n\r\n"[..],
            "HTTP/1.1 400 Bad Request",
        ),
        (b"GET /metrics HTTP/7.0\r\n\r\n", "HTTP/1.1 400 Bad Request"),
        (b"GET /secret HTTP/1.1\r\n\r\n", "HTTP/1.1 404 Not Found"),
        (
            b"DELETE /metrics HTTP/1.1\r\n\r\n",
            "HTTP/1.1 405 Method Not Allowed",
        ),
    ] {
        assert_eq!(status(&exchange(unix(&path), request)), want);
        body(&exchange(unix(&path), GET));
    }
    // An endless header: 400 once it is too long, then closed (the rest
    // of what it sends may be refused).
    let mut endless = unix(&path);
    endless
        .write_all(b"GET /metrics HTTP/1.1\r\nX-Endless: ")
        .unwrap();
    let filler = [b'a'; 4096];
    for _ in 0..64 {
        if endless.write_all(&filler).is_err() {
            break;
        }
    }
    let mut answer = Vec::new();
    let _ = endless.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 400 "),
        "{answer}"
    );
    body(&exchange(unix(&path), GET));

    // Silent clients: a scrape is answered beside them; they are closed
    // when their time is up.
    let mut crowd: Vec<_> = (0..10).map(|_| unix(&path)).collect();
    body(&exchange(unix(&path), GET));
    for c in crowd.iter_mut().chain([&mut silent]) {
        let mut b = [0u8; 1];
        assert_eq!(c.read(&mut b).unwrap(), 0, "a silent client is closed");
    }
    daemon.shutdown();
    assert!(!path.exists(), "the socket is removed at shutdown");
}

/// Clients holding connections open, many more than the endpoint serves
/// at once, keep no scrape waiting: a new connection takes the slot of
/// the one that has waited longest for its request. (When the endpoint
/// took 8 and left the rest in the backlog, each 8 held it for 5 s: the
/// scrape here timed out.)
#[test]
fn scrapes_are_answered_beside_hundreds_of_idle_connections() {
    let dir = TempDir::new("metrics-idle");
    let any_port = MetricsListen::Tcp("127.0.0.1:0".parse().unwrap());
    let (daemon, _socket) = start_daemon(&dir, any_port);
    let Some(&MetricsListen::Tcp(addr)) = daemon.metrics_endpoint() else {
        panic!("{:?}", daemon.metrics_endpoint())
    };
    let idle: Vec<TcpStream> = (0..200).map(|_| tcp(addr)).collect();
    body(&exchange(tcp(addr), GET));
    // And with a request begun by each of the next ones, never finished.
    let mut slow: Vec<TcpStream> = (0..100).map(|_| tcp(addr)).collect();
    for s in &mut slow {
        s.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
    }
    body(&exchange(tcp(addr), GET));
    drop((idle, slow));
    daemon.shutdown();
}

/// Devices and workers created at run time, and a queue moved between
/// workers, show in the next scrape; a deleted device is gone. The
/// moved queue keeps its series (no worker label): its request count
/// goes on.
#[test]
fn run_time_devices_workers_and_queue_moves_show_in_the_next_scrape() {
    let dir = TempDir::new("metrics-runtime");
    let path = dir.path("metrics.sock");
    let (daemon, socket) = start_daemon(&dir, MetricsListen::Unix(path.clone()));
    let scrape = || body(&exchange(unix(&path), GET)).to_owned();
    let has = |text: &str, line: &str| text.lines().any(|l| l == line);

    let mut d = Driver::connect(&socket);
    d.rqs[0].clear_unit_attention(0);
    io(&mut d.rqs[0], 0, false, 10, 1);
    let dev0 = format!(r#"device="0",name="{}""#, socket.display());
    let text = scrape();
    assert!(has(
        &text,
        &format!("sqcq_queue_info{{{dev0},vq=\"2\",worker=\"0\"}} 1")
    ));
    assert!(!text.contains("sqcq_worker_queues{worker=\"2\"}"));

    let registry = daemon.registry();
    let w = registry.worker_create(None).unwrap();
    assert_eq!(w, 2);
    let other = dir.path("other.sock");
    let config = DeviceConfig {
        device_type: DeviceType::Blk,
        socket_path: other.clone(),
        luns: vec![lun(BackstoreKind::Ram, 1 << 20)],
        num_queues: 1,
        queue_size: QUEUE_SIZE,
        queue_map: QueueMap::default(),
        qos: Default::default(),
    };
    let id = registry
        .create(config, sqcq_target::registry::Origin::Api)
        .unwrap();
    // vq 2 moves to the new worker while the driver is connected.
    registry.attach(0, 0, Some(w)).unwrap();
    io(&mut d.rqs[0], 0, false, 5, 1);

    let text = scrape();
    let dev1 = format!(r#"device="{id}",name="{}""#, other.display());
    assert!(
        has(&text, &format!("sqcq_device_info{{{dev1},type=\"blk\"}} 1")),
        "{text}"
    );
    assert!(has(
        &text,
        &format!("sqcq_lun_capacity_bytes{{{dev1},lun=\"0\"}} 1048576")
    ));
    assert!(has(&text, "sqcq_worker_queues{worker=\"2\"} 1"), "{text}");
    assert!(has(
        &text,
        &format!("sqcq_queue_info{{{dev0},vq=\"2\",worker=\"2\"}} 1")
    ));
    let requests = format!("sqcq_queue_requests_total{{{dev0},vq=\"2\"}} ");
    let count: Vec<_> = text.lines().filter(|l| l.starts_with(&requests)).collect();
    // TEST UNIT READY (once or twice, for the unit attention), then 15
    // reads.
    let n: u64 = count[0][requests.len()..].parse().unwrap();
    assert!(count.len() == 1 && (16..=17).contains(&n), "{count:?}");

    registry.delete(id, false).unwrap();
    assert!(!scrape().contains(&dev1), "a deleted device is gone");
    drop(d);
    daemon.shutdown();
}
