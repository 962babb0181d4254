//! Events on the admin socket, with the real binary: a subscriber is told,
//! in order, of the changes made through the API and a reload, of a
//! frontend's connection and its queues, and of the I/O errors a guest
//! met with the LUN and the block range; a filter holds; two subscribers
//! are served at once; one that does not read loses the oldest
//! notifications, is told how many, and the daemon's memory stays
//! bounded; `sqcqd rpc events` prints them.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::blk_driver::BlkDriver;
use common::driver::{Driver, lun_at};
use common::*;
use serde_json::{Value, json};
use sqcq_driver::NotifyMode;
use sqcq_driver::scsi::Cdb;

const SQCQD: &str = env!("CARGO_BIN_EXE_sqcqd");

/// `sqcqd` with a blk device on `disk` (1 MiB) and the admin socket,
/// reading `config` (a reload reads it again).
fn start(dir: &TempDir, disk: &Path) -> (Running, LogOnPanic, PathBuf) {
    let admin = dir.path("admin.sock");
    let config = dir.path("sqcqd.toml");
    std::fs::write(
        &config,
        format!(
            "admin-socket = {admin:?}\n[[device]]\ntype = \"blk\"\nsocket-path = {:?}\n\
             [[device.lun]]\nkind = \"file\"\npath = {disk:?}\nsize = \"1M\"\n",
            dir.path("blk.sock"),
        ),
    )
    .unwrap();
    let (daemon, log) = sqcqd_from_file(env!("CARGO_BIN_EXE_sqcqd"), dir, &config, &admin);
    (daemon, log, admin)
}

/// Subscribes to the events `only` (every one if empty) and follows
/// them on a thread of its own: each one's parameters arrive on the
/// channel. Subscribed when it returns.
fn follow(admin: &Path, only: &[&str]) -> mpsc::Receiver<Value> {
    let mut conn = UnixStream::connect(admin).unwrap();
    let req = json!({"jsonrpc": "2.0", "method": "events_subscribe", "id": 1,
                     "params": if only.is_empty() { json!({}) } else { json!({"events": only}) }});
    conn.write_all(format!("{req}\n").as_bytes()).unwrap();
    let mut lines = BufReader::new(conn);
    let mut reply = String::new();
    lines.read_line(&mut reply).unwrap();
    let reply: Value = serde_json::from_str(&reply).unwrap();
    assert!(reply["result"]["events"].is_array(), "{reply}");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        while matches!(lines.read_line(&mut line), Ok(n) if n > 0) {
            let mut v: Value = serde_json::from_str(&line).unwrap();
            assert_eq!(v["method"], "event", "{v}");
            if tx.send(v["params"].take()).is_err() {
                break;
            }
            line.clear();
        }
    });
    rx
}

/// The next event, within [`WAIT`].
fn next(rx: &mpsc::Receiver<Value>) -> Value {
    rx.recv_timeout(WAIT).expect("an event within WAIT")
}

/// The event's name and the fields named, for comparing.
fn fields(e: &Value, keys: &[&str]) -> Value {
    let mut out = json!({ "event": e["event"] });
    for k in keys {
        out[*k] = e[*k].clone();
    }
    out
}

#[test]
fn subscribers_are_told_what_happens_in_order() {
    let dir = TempDir::new("events-order");
    let disk = dir.path("disk.img");
    std::fs::write(&disk, vec![0u8; 1 << 20]).unwrap();
    let (_daemon, _log, admin) = start(&dir, &disk);
    let all = follow(&admin, &[]);
    let only_io = follow(&admin, &["io_error"]);
    let seq = |e: &Value| e["seq"].as_u64().unwrap();

    // A SCSI device with LUN 5 on a file, created through the API.
    let scsi_disk = dir.path("scsi.img");
    std::fs::write(&scsi_disk, vec![0u8; 1 << 20]).unwrap();
    let scsi_sock = dir.path("scsi.sock");
    let lun = format!("kind=file,path={},size=1M,lun=5", scsi_disk.display());
    let id = rpc(
        &admin,
        "device_create",
        json!({ "socket-path": scsi_sock, "lun": [lun] }),
    )
    .unwrap()["device"]
        .as_u64()
        .unwrap();
    assert_eq!(id, 1);
    let created = next(&all);
    assert_eq!(
        fields(&created, &["device"]),
        json!({"event": "device_created", "device": 1})
    );
    let first = seq(&created);
    rpc(
        &admin,
        "lun_resize",
        json!({"device": 1, "lun": 5, "size": "2M"}),
    )
    .unwrap();
    assert_eq!(
        fields(&next(&all), &["device", "lun", "bytes"]),
        json!({"event": "lun_resized", "device": 1, "lun": 5, "bytes": 2 << 20})
    );
    rpc(
        &admin,
        "lun_add",
        json!({"device": 1, "lun": 6, "kind": "null", "size": "1M"}),
    )
    .unwrap();
    assert_eq!(
        fields(&next(&all), &["device", "lun"]),
        json!({"event": "lun_added", "device": 1, "lun": 6})
    );
    rpc(&admin, "lun_remove", json!({"device": 1, "lun": 6})).unwrap();
    assert_eq!(
        fields(&next(&all), &["device", "lun"]),
        json!({"event": "lun_removed", "device": 1, "lun": 6})
    );

    // A frontend on the blk device: its queue starts; a read past the
    // end of the file (shrunk behind the daemon's back) fails.
    let mut blk = BlkDriver::connect(&dir.path("blk.sock"), NotifyMode::Notify);
    assert_eq!(
        fields(&next(&all), &["device"]),
        json!({"event": "frontend_connected", "device": 0})
    );
    let started = next(&all);
    assert_eq!(
        fields(&started, &["device", "vq"]),
        json!({"event": "queue_started", "device": 0, "vq": 0})
    );
    assert!(started["mode"].is_string(), "{started}");
    std::fs::File::options()
        .write(true)
        .open(&disk)
        .unwrap()
        .set_len(4096)
        .unwrap();
    assert!(
        blk.rqs[0].read(16, 4096).0.is_err(),
        "a read past the file's end fails"
    );
    let io = next(&all);
    assert_eq!(
        fields(&io, &["device", "lun", "op", "lba", "bytes"]),
        json!({"event": "io_error", "device": 0, "lun": 0, "op": "read", "lba": 16, "bytes": 4096})
    );
    assert!(io["error"].as_str().is_some_and(|e| !e.is_empty()), "{io}");
    assert_eq!(
        next(&only_io),
        io,
        "the filtered subscriber gets the same notification"
    );
    // The per-LUN figures count it as a read that failed.
    let stats = rpc(&admin, "stats_get", json!({"device": 0})).unwrap();
    let read = &stats["luns"]["0"]["0"]["read"];
    assert_eq!(
        (read["ops"].as_u64(), read["errors"].as_u64()),
        (Some(1), Some(1)),
        "{stats}"
    );
    assert_eq!(read["bytes"], 0, "a failed read moved nothing");
    drop(blk);
    assert_eq!(
        fields(&next(&all), &["device", "vq"]),
        json!({"event": "queue_stopped", "device": 0, "vq": 0})
    );
    assert_eq!(
        fields(&next(&all), &["device"]),
        json!({"event": "frontend_disconnected", "device": 0})
    );

    // The SCSI LUN's error names its LUN and its blocks.
    std::fs::File::options()
        .write(true)
        .open(&scsi_disk)
        .unwrap()
        .set_len(0)
        .unwrap();
    let mut scsi = Driver::connect(&scsi_sock);
    scsi.rqs[0].clear_unit_attention(5);
    let r = scsi.rqs[0].command(lun_at(0, 5), Cdb::read_10(100, 8, false), &[], 4096);
    assert!(!r.good(), "{r:?}");
    let io = next(&only_io);
    assert_eq!(
        fields(&io, &["device", "lun", "op", "lba", "bytes"]),
        json!({"event": "io_error", "device": 1, "lun": 5, "op": "read", "lba": 100, "bytes": 4096})
    );
    drop(scsi);
    // The SCSI frontend's connection, in order, up to its end (which
    // comes after the frontend closed its socket, a moment after the
    // drop).
    let mut seen = Vec::new();
    while seen.last().map(String::as_str) != Some("frontend_disconnected") {
        let e = next(&all);
        assert_eq!(e["device"], 1, "{e}");
        seen.push(e["event"].as_str().unwrap().to_owned());
    }
    seen.dedup();
    assert_eq!(
        seen,
        [
            "frontend_connected",
            "queue_started",
            "io_error",
            "queue_stopped",
            "frontend_disconnected"
        ]
    );

    // A reload that changes nothing says so; a delete is told.
    let reload = rpc(&admin, "config_reload", json!({})).unwrap();
    let e = next(&all);
    assert_eq!(e["event"], "reload_done", "{e}");
    assert_eq!(e["changed"], reload["changed"]);
    assert_eq!(e["errors"], reload["errors"]);
    rpc(&admin, "device_delete", json!({"device": 1})).unwrap();
    let deleted = next(&all);
    assert_eq!(
        fields(&deleted, &["device"]),
        json!({"event": "device_deleted", "device": 1})
    );
    assert!(seq(&deleted) > first, "numbered in order");
    // One more read error, after everything above: the filtered
    // subscriber's events up to it are read errors only, in order, so
    // nothing else came through in between (no window to wait out).
    let mut blk = BlkDriver::connect(&dir.path("blk.sock"), NotifyMode::Notify);
    assert!(blk.rqs[0].read(16, 4096).0.is_err());
    loop {
        let e = next(&only_io);
        assert_eq!(e["event"], "io_error", "the filter let {e} through");
        if e["device"] == 0 && seq(&e) > seq(&deleted) {
            break;
        }
    }
    drop(blk);
}

#[test]
fn a_subscriber_that_does_not_read_loses_the_oldest_and_is_told_how_many() {
    let dir = TempDir::new("events-lost");
    let disk = dir.path("disk.img");
    std::fs::write(&disk, vec![0u8; 1 << 20]).unwrap();
    let (_daemon, _log, admin) = start(&dir, &disk);
    let mut deaf = UnixStream::connect(&admin).unwrap();
    deaf.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"events_subscribe\",\"id\":1}\n")
        .unwrap();
    let mut lines = BufReader::new(deaf.try_clone().unwrap());
    let mut reply = String::new();
    lines.read_line(&mut reply).unwrap();
    let reply: Value = serde_json::from_str(&reply).unwrap();
    let queue = reply["result"]["queue"].as_u64().unwrap();
    // Far more events than its socket and its queue hold, in batches of
    // resizes (each one an event).
    let (batches, per_batch) = (40u64, 500u64);
    let mut caller = UnixStream::connect(&admin).unwrap();
    let mut answers = BufReader::new(caller.try_clone().unwrap());
    for _ in 0..batches {
        let batch: Vec<Value> = (0..per_batch)
            .map(|i| {
                let size = 2u64 << 20;
                json!({"jsonrpc": "2.0", "method": "lun_resize", "id": i,
                       "params": {"device": 0, "lun": 0, "size": size}})
            })
            .collect();
        caller
            .write_all(format!("{}\n", Value::Array(batch)).as_bytes())
            .unwrap();
        let mut answer = String::new();
        answers.read_line(&mut answer).unwrap();
        assert!(!answer.contains("\"error\""), "{answer}");
    }
    let total = batches * per_batch;
    // Now read: every event is there or counted as lost.
    deaf.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let (mut got, mut lost, mut last) = (0u64, 0u64, 0u64);
    let mut line = String::new();
    while last < total {
        line.clear();
        lines
            .read_line(&mut line)
            .expect("the notifications up to the last one");
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["method"], "event");
        let p = &v["params"];
        assert_eq!(p["event"], "lun_resized");
        let seq = p["seq"].as_u64().unwrap();
        let l = p["lost"].as_u64().unwrap_or(0);
        assert_eq!(seq, last + l + 1, "exactly the ones said lost are missing");
        (got, lost, last) = (got + 1, lost + l, seq);
    }
    assert_eq!(got + lost, total);
    assert!(
        lost > 0,
        "{total} events did not overflow a queue of {queue}"
    );
    assert!(
        got >= queue,
        "at least the queue's worth is kept: got {got} of {total}"
    );
}

#[test]
fn the_client_prints_events_and_the_api_refuses_bad_subscriptions() {
    let dir = TempDir::new("events-client");
    let disk = dir.path("disk.img");
    std::fs::write(&disk, vec![0u8; 1 << 20]).unwrap();
    let (_daemon, _log, admin) = start(&dir, &disk);

    let e = rpc(
        &admin,
        "events_subscribe",
        json!({"events": ["lun_exploded"]}),
    )
    .unwrap_err();
    assert_eq!(error_code(&e), -32602, "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("lun_resized"),
        "{e}"
    );

    let client = Command::new(SQCQD)
        .args(["rpc", "--admin-socket"])
        .arg(&admin)
        .args(["events", "lun_resized", "--count", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Until the client subscribed, resizes may go unseen: resize (to the
    // same size) until it saw two.
    let mut client = client;
    while client.try_wait().unwrap().is_none() {
        rpc(
            &admin,
            "lun_resize",
            json!({"device": 0, "lun": 0, "size": "1M"}),
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = client.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    for l in &lines {
        assert_eq!(
            (l["event"].as_str(), l["device"].as_u64()),
            (Some("lun_resized"), Some(0))
        );
    }

    let bad = Command::new(SQCQD)
        .args(["rpc", "--admin-socket"])
        .arg(&admin)
        .args(["events", "lun_exploded"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("no event \"lun_exploded\""));
}
