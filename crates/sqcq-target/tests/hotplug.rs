//! LUNs added, resized and removed through the management API while a
//! frontend is connected and another LUN serves I/O: the events on the
//! event queue, the unit attentions, REPORT LUNS, READ CAPACITY and I/O.

// Test code: lengths and indices are small constants of the test.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod common;

use std::path::{Path, PathBuf};
use std::thread;

use common::driver::*;
use common::raw_ring::{self, Guest, lun_field};
use common::*;
use serde_json::{Value, json};
use sqcq_driver::scsi::Cdb;
use sqcq_target::Daemon;
use sqcq_target::config::{BackstoreKind, DaemonConfig, DeviceConfig, LunSpec, QueueMap};

fn start_admin(dir: &TempDir, luns: Vec<LunSpec>) -> (Daemon, PathBuf, PathBuf) {
    let socket = dir.path("scsi.sock");
    let admin = dir.path("admin.sock");
    let config = DaemonConfig {
        workers: 2,
        devices: vec![DeviceConfig {
            device_type: sqcq_target::config::DeviceType::Scsi,
            socket_path: socket.clone(),
            luns,
            num_queues: 2,
            queue_size: QUEUE_SIZE,
            queue_map: QueueMap(vec![(0, 0), (1, 1)]),
            qos: Default::default(),
        }],
        poll: Default::default(),
        admin_socket: Some(admin.clone()),
        seccomp: Default::default(),
        service: Default::default(),
    };
    config.validate().unwrap();
    (Daemon::start(&config).unwrap(), socket, admin)
}

/// A command, retried while it reports unit attentions, which are
/// collected as (ASC, ASCQ) in `uas`.
fn command_past_ua(
    rq: &mut Rq,
    lun: u16,
    cdb: Cdb,
    out: &[u8],
    din: u32,
    uas: &mut Vec<(u8, u8)>,
) -> Reply {
    for _ in 0..4 {
        let r = rq.command(lun_at(0, lun), cdb, out, din);
        match r.sense() {
            Some(s) if s.key == 6 => uas.push((s.asc, s.ascq)),
            _ => return r,
        }
    }
    panic!("unit attentions without end: {uas:?}");
}

/// Writes and reads back one block of LUN `lun`; returns the unit
/// attentions seen.
fn write_read(rq: &mut Rq, lun: u16, lba: u32, seed: u8) -> Vec<(u8, u8)> {
    let mut uas = Vec::new();
    let block: Vec<u8> = (0..512).map(|i| (i as u8).wrapping_mul(seed)).collect();
    let write = Cdb::write_10(lba, 1, false);
    let r = command_past_ua(rq, lun, write, &block, 0, &mut uas);
    assert!(r.good(), "WRITE LUN {lun}: {r:?}");
    let r = command_past_ua(rq, lun, Cdb::read_10(lba, 1, false), &[], 512, &mut uas);
    assert!(r.good(), "READ LUN {lun}: {r:?}");
    assert_eq!(r.data, block, "LUN {lun} LBA {lba}");
    uas
}

/// Calls `method` from another thread while this one keeps I/O going on
/// LUN 0 (until one round after the answer); returns the answer, how
/// many I/O rounds ran and the unit attentions LUN 0 reported.
fn rpc_during_io(
    admin: &Path,
    method: &'static str,
    params: Value,
    rq: &mut Rq,
) -> (Result<Value, Value>, u32, Vec<(u8, u8)>) {
    let path = admin.to_owned();
    // The call goes once the first round is done, so that I/O is under
    // way before it however the threads are scheduled.
    let (go, started) = std::sync::mpsc::channel();
    let h = thread::spawn(move || {
        started.recv().unwrap();
        rpc(&path, method, params)
    });
    let mut n = 0u32;
    let mut uas = Vec::new();
    loop {
        let done = h.is_finished();
        uas.extend(write_read(rq, 0, n % 64, (n % 250) as u8 + 1));
        n += 1;
        if n == 1 {
            go.send(()).unwrap();
        }
        if done {
            break;
        }
    }
    (h.join().unwrap(), n, uas)
}

/// TEST UNIT READY until no unit attention is left.
fn clear_all_unit_attentions(rq: &mut Rq, lun: u16) {
    let mut uas = Vec::new();
    let r = command_past_ua(rq, lun, Cdb::test_unit_ready(), &[], 0, &mut uas);
    assert!(r.good(), "{r:?}");
}

fn event(kind: u32, lun: u16, reason: u32) -> [u8; 16] {
    let mut e = [0u8; 16];
    e[0..4].copy_from_slice(&kind.to_le_bytes());
    e[4..12].copy_from_slice(&[1, 0, 0, lun as u8, 0, 0, 0, 0]);
    e[12..16].copy_from_slice(&reason.to_le_bytes());
    e
}

fn report_luns(rq: &mut Rq) -> Vec<u16> {
    let r = rq.command(lun_at(0, 0), Cdb::report_luns(1024), &[], 1024);
    assert!(r.good(), "REPORT LUNS: {r:?}");
    let data = r.data;
    let n = u32::from_be_bytes(data[0..4].try_into().unwrap()) as usize / 8;
    (0..n)
        .map(|i| {
            let e = &data[8 + 8 * i..16 + 8 * i];
            u16::from_be_bytes([e[0] & 0x3f, e[1]])
        })
        .collect()
}

/// READ CAPACITY(16): (last LBA, block size).
fn read_capacity16(rq: &mut Rq, lun: u16) -> (u64, u32) {
    let r = rq.command(lun_at(0, lun), Cdb::read_capacity_16(32), &[], 32);
    assert!(r.good(), "READ CAPACITY(16): {r:?}");
    (
        u64::from_be_bytes(r.data[0..8].try_into().unwrap()),
        u32::from_be_bytes(r.data[8..12].try_into().unwrap()),
    )
}

/// A unit attention's (key, ASC, ASCQ).
fn ua(r: &Reply) -> Option<(u8, u8, u8)> {
    r.sense().map(|s| (s.key, s.asc, s.ascq))
}

#[test]
fn luns_come_change_and_go_while_another_lun_serves_io() {
    let dir = TempDir::new("hotplug");
    let (daemon, socket, admin) = start_admin(&dir, vec![lun(BackstoreKind::Ram, 8 << 20)]);
    let mut d = Driver::connect(&socket);
    let Driver { events, rqs, .. } = &mut d;
    let [rq0, rq1] = &mut rqs[..] else {
        panic!("two request queues");
    };
    rq0.clear_unit_attention(0);
    rq1.clear_unit_attention(0);

    // Add: a RESCAN event, REPORT LUNS shows it, I/O to it works, and LUN
    // 0 (busy meanwhile) reports REPORTED LUNS DATA HAS CHANGED once.
    let add = json!({"device": 0, "lun": 1, "kind": "ram", "size": "4M"});
    let (reply, ios, uas) = rpc_during_io(&admin, "lun_add", add, rq0);
    assert_eq!(reply, Ok(json!({"lun": 1})));
    assert!(ios > 1, "LUN 0 served I/O meanwhile");
    assert_eq!(uas, [(0x3f, 0x0e)], "REPORTED LUNS DATA HAS CHANGED, once");
    assert_eq!(
        events.next_event().unwrap(),
        event(1, 1, 1),
        "TRANSPORT_RESET/RESCAN"
    );
    assert_eq!(report_luns(rq1), [0, 1]);
    let r = rq1.command(lun_at(0, 1), Cdb::test_unit_ready(), &[], 0);
    assert_eq!(r.key_asc(), Some((6, 0x29)), "POWER ON: {r:?}");
    write_read(rq1, 1, 7, 3);
    assert_eq!(read_capacity16(rq1, 1), (8191, 512));

    // Resize: PARAM_CHANGE with ASC/ASCQ 2Ah/09h, CAPACITY DATA HAS
    // CHANGED, then the new capacity, and I/O past the old end works.
    let resize = json!({"device": 0, "lun": 1, "size": "8M"});
    let (reply, _, uas) = rpc_during_io(&admin, "lun_resize", resize, rq0);
    assert!(uas.is_empty(), "LUN 0 is not concerned: {uas:?}");
    assert_eq!(reply, Ok(json!({"blocks": 16384})));
    assert_eq!(
        events.next_event().unwrap(),
        event(3, 1, 0x092a),
        "PARAM_CHANGE"
    );
    let r = rq1.command(lun_at(0, 1), Cdb::test_unit_ready(), &[], 0);
    assert_eq!(ua(&r), Some((6, 0x2a, 0x09)), "CAPACITY DATA HAS CHANGED");
    assert_eq!(read_capacity16(rq1, 1), (16383, 512));
    write_read(rq1, 1, 12000, 5);

    // Remove with requests to it in flight: each completes (done, or
    // answered as absent), then REMOVED, then the LUN is absent.
    for i in 0..8 {
        rq1.submit(lun_at(0, 1), Cdb::read_10(i, 1, false), &[], 512);
    }
    rq1.publish();
    let remove = json!({"device": 0, "lun": 1, "force": true});
    let (reply, _, uas) = rpc_during_io(&admin, "lun_remove", remove, rq0);
    assert_eq!(uas, [(0x3f, 0x0e)], "REPORTED LUNS DATA HAS CHANGED again");
    assert_eq!(reply, Ok(Value::Null));
    for r in rq1.wait(8) {
        assert!(r.good() || r.key_asc() == Some((5, 0x25)), "{r:?}");
    }
    assert_eq!(
        events.next_event().unwrap(),
        event(1, 1, 2),
        "TRANSPORT_RESET/REMOVED"
    );
    let r = rq1.command(lun_at(0, 1), Cdb::test_unit_ready(), &[], 0);
    assert_eq!(r.key_asc(), Some((5, 0x25)), "absent: {r:?}");
    let r = rq1.inquiry(1);
    assert!(r.good(), "{r:?}");
    assert_eq!(r.data[0], 0x7f, "peripheral qualifier 3");
    assert_eq!(report_luns(rq1), [0]);
    write_read(rq0, 0, 3, 9);

    // Refusals, with their codes: the LUN exists, no such LUN, a size
    // that is not whole blocks, no such device, no such method.
    let refused = |method: &str, params: Value, expected: i64| {
        let e = rpc(&admin, method, params.clone()).unwrap_err();
        assert_eq!(error_code(&e), expected, "{method} {params}: {e}");
    };
    let ram = json!({"device": 0, "lun": 0, "kind": "ram", "size": "1M"});
    refused("lun_add", ram, -32002);
    refused("lun_remove", json!({"device": 0, "lun": 1}), -32001);
    let odd = json!({"device": 0, "lun": 0, "size": 1000});
    refused("lun_resize", odd, -32602);
    let ram = json!({"device": 1, "lun": 2, "kind": "ram", "size": "1M"});
    refused("lun_add", ram, -32001);
    refused("format", json!({"drive": "c:"}), -32601);

    // LUN 0 as it was, LUN 1 gone, and the I/O to LUN 0 counted.
    let list = rpc(&admin, "device_list", json!({})).unwrap();
    let luns: Vec<_> = list[0]["luns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["lun"].clone(),
                l["blocks"].clone(),
                l["block_size"].clone(),
            )
        })
        .collect();
    assert_eq!(luns, [(json!(0), json!(16384), json!(512))], "{list}");
    let stats = rpc(&admin, "stats_get", json!({"device": 0})).unwrap();
    let vq2 = stats["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["vq"] == 2)
        .unwrap_or_else(|| panic!("no vq 2: {stats}"));
    assert!(vq2["completions"].as_u64() > Some(0), "{vq2}");
    daemon.shutdown();
    assert!(!admin.exists(), "the admin socket is removed on exit");
}

#[test]
fn no_event_without_hotplug_and_change() {
    let dir = TempDir::new("hotplug-nofeat");
    let (daemon, socket, admin) = start_admin(&dir, vec![lun(BackstoreKind::Null, 1 << 20)]);
    // VERSION_1 and protocol features only; the event queue has buffers.
    let mut d = Driver::connect_with(
        &socket,
        Options {
            event_idx: false,
            device_features: 0,
            ..Options::default()
        },
    );
    assert_eq!(d.frontend.negotiated().acked & HOTPLUG_AND_CHANGE, 0);
    let add = json!({"device": 0, "lun": 5, "kind": "null", "size": "1M"});
    assert_eq!(rpc(&admin, "lun_add", add), Ok(json!({"lun": 5})));
    let resize = json!({"device": 0, "lun": 5, "size": "2M"});
    assert_eq!(
        rpc(&admin, "lun_resize", resize),
        Ok(json!({"blocks": 4096}))
    );
    let remove = json!({"device": 0, "lun": 5, "force": true});
    assert_eq!(rpc(&admin, "lun_remove", remove), Ok(Value::Null));
    // Events are delivered by the control thread after the reply; give it
    // time (a late event would only make this test pass wrongly).
    clear_all_unit_attentions(&mut d.rqs[0], 0);
    thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(
        d.events.try_next_event().unwrap(),
        None,
        "no event without the features"
    );
    daemon.shutdown();
}

#[test]
fn a_file_lun_writes_reads_flushes_and_grows() {
    let dir = TempDir::new("hotplug-file");
    let path = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("sqcqd-file-{}.img", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let spec = LunSpec {
        path: Some(path.clone()),
        create: true,
        ..lun(BackstoreKind::File, 4 << 20)
    };
    let (daemon, socket, admin) = start_admin(&dir, vec![spec]);
    let mut d = Driver::connect(&socket);
    let rq = &mut d.rqs[0];
    rq.clear_unit_attention(0);
    let lun0 = lun_at(0, 0);

    let pattern: Vec<u8> = (0..8 * 512).map(|i| (i % 253) as u8).collect();
    let r = rq.command(lun0, Cdb::write_10(16, 8, true), &pattern, 0);
    assert!(r.good(), "WRITE(10) FUA: {r:?}");
    let r = rq.command(lun0, Cdb::write_16(100, 8, true), &pattern, 0);
    assert!(r.good(), "WRITE(16) FUA: {r:?}");
    let r = rq.command(lun0, Cdb::read_10(16, 8, false), &[], 4096);
    assert_eq!(r.resid(), 0, "{r:?}");
    assert_eq!(r.data, pattern);
    let r = rq.command(lun0, Cdb::synchronize_cache_10(0, 0), &[], 0);
    assert!(r.good(), "SYNCHRONIZE CACHE(10): {r:?}");
    let r = rq.command(lun0, Cdb::synchronize_cache_16(0, 0), &[], 0);
    assert!(r.good(), "SYNCHRONIZE CACHE(16): {r:?}");
    // The bytes are in the file.
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(&on_disk[16 * 512..24 * 512], &pattern[..]);
    assert_eq!(&on_disk[100 * 512..108 * 512], &pattern[..]);

    // Grow: the file grows, the LUN reports it after the unit attention,
    // the new blocks take I/O.
    let grow = json!({"device": 0, "lun": 0, "size": "8M"});
    assert_eq!(
        rpc(&admin, "lun_resize", grow),
        Ok(json!({"blocks": 16384}))
    );
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 8 << 20);
    let r = rq.command(lun0, Cdb::test_unit_ready(), &[], 0);
    assert_eq!(r.key_asc(), Some((6, 0x2a)), "{r:?}");
    assert_eq!(read_capacity16(rq, 0), (16383, 512));
    write_read(rq, 0, 16000, 7);
    let shrink = json!({"device": 0, "lun": 0, "size": "4M"});
    let e = rpc(&admin, "lun_resize", shrink).unwrap_err();
    assert_eq!(error_code(&e), -32000, "a file LUN does not shrink: {e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("shrinking a file LUN")
    );
    daemon.shutdown();
    std::fs::remove_file(&path).unwrap();
}

/// `sqcqd rpc`, the client built into the binary, against the binary;
/// `sqcqd admin`, the client of the text commands removed, says what
/// replaces it and fails.
#[test]
fn sqcqd_rpc_client_talks_to_the_binary() {
    use std::process::{Command, Output, Stdio};
    let dir = TempDir::new("hotplug-bin");
    let (socket, admin) = (dir.path("scsi.sock"), dir.path("admin.sock"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_sqcqd"))
        .arg("--socket-path")
        .arg(&socket)
        .arg("--admin-socket")
        .arg(&admin)
        .args(["--lun", "kind=null,size=1M", "--queue-size", "64"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let client = |args: &[&str]| -> Output {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let out = Command::new(env!("CARGO_BIN_EXE_sqcqd"))
                .arg("rpc")
                .arg("--admin-socket")
                .arg(&admin)
                .args(args)
                .output()
                .unwrap();
            // 2: the socket is not there yet.
            if out.status.code() != Some(2) || std::time::Instant::now() > deadline {
                return out;
            }
            thread::sleep(std::time::Duration::from_millis(10));
        }
    };
    let json = |bytes: &[u8]| -> Value {
        serde_json::from_slice(bytes).unwrap_or_else(|e| panic!("{e}: {bytes:?}"))
    };
    let out = client(&["lun_add", "device=0", "lun=1", "kind=ram", "size=2M"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(json(&out.stdout), json!({"lun": 1}));
    let out = client(&["device_list"]);
    assert!(out.status.success(), "{out:?}");
    let list = json(&out.stdout);
    assert_eq!(list[0]["luns"][1]["lun"], 1, "{list}");
    assert_eq!(list[0]["luns"][1]["blocks"], 4096, "{list}");
    let out = client(&["lun_remove", "device=0", "lun=7"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    assert_eq!(
        json(&out.stderr),
        json!({"code": -32001, "message": "no LUN 7"})
    );
    // The removed client points to this one, whatever it is asked.
    let out = Command::new(env!("CARGO_BIN_EXE_sqcqd"))
        .args(["admin", "--admin-socket"])
        .arg(&admin)
        .arg("stats")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.starts_with("sqcqd admin was removed: use sqcqd rpc ")
            && said.contains("rpc.discover"),
        "{said}"
    );
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&admin).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    // SAFETY: kill() with a valid pid and signal number.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    assert!(child.wait().unwrap().success());
    assert!(!admin.exists());
}

/// `fault_break` (fault injection): the queue breaks at its next request,
/// which it does not take: its error eventfd is signalled, the other
/// queue goes on, a second `fault_break` finds nothing to arm, and a
/// device reset brings the queue back with the error eventfd of the first
/// start. It stays on the raw ring helper: the restart is QEMU's message
/// sequence (no second SET_VRING_ERR), which sqcq-driver's frontend does
/// not make, and the driver does not hand the device error eventfds.
#[test]
fn fault_break_stops_a_queue_at_its_next_request_until_the_device_is_reset() {
    let dir = TempDir::new("fault-break");
    let (daemon, socket, admin) = start_admin(&dir, vec![lun(BackstoreKind::Ram, 1 << 20)]);
    let mut g = Guest::new();
    let mut qs = raw_ring::vqs();
    let mut fe = raw_ring::connect(&socket, &g, &mut qs, true);
    for q in [2, 3] {
        raw_ring::clear_unit_attention(&mut qs[q], &mut g, 0);
    }
    let _ = qs[2].err.read();
    let _ = qs[3].err.read();

    let vq2 = json!({"device": 0, "vq": 2});
    assert_eq!(
        rpc(&admin, "fault_break", vq2.clone()),
        Ok(json!({"armed": [2]}))
    );
    let e = rpc(&admin, "fault_break", vq2.clone()).unwrap_err();
    assert_eq!(error_code(&e), -32001, "armed already: {e}");
    // Armed, the queue breaks at the next request and leaves it untaken.
    raw_ring::submit(
        &mut qs[2],
        &mut g,
        lun_field(0, 0),
        &raw_ring::inquiry(36),
        &[],
        36,
    );
    qs[2].kick(&g);
    wait_signalled(&qs[2].err, "the broken queue's error eventfd");
    assert!(qs[3].err.read().is_err(), "the other queue is not broken");
    let stats = rpc(&admin, "stats_get", json!({})).unwrap();
    assert_eq!(stats["errors"]["0"]["broken_rings"], 1, "{stats}");
    let (r, _) = raw_ring::command(
        &mut qs[3],
        &mut g,
        lun_field(0, 0),
        &raw_ring::inquiry(36),
        &[],
        36,
    );
    assert_eq!((r.response, r.status), (0, 0), "{r:?}");
    let e = rpc(&admin, "fault_break", vq2).unwrap_err();
    assert_eq!(error_code(&e), -32001, "broken already: {e}");
    let e = rpc(&admin, "fault_break", json!({"device": 1})).unwrap_err();
    assert_eq!(
        (error_code(&e), e["message"].as_str()),
        (-32001, Some("no device 1")),
        "{e}"
    );
    assert_eq!(
        qs[2].used_idx(&g),
        qs[2].last_used,
        "the request was not taken"
    );

    // A reset and a new start cycle, as QEMU makes them (no second
    // SET_VRING_ERR), serve the queue again.
    raw_ring::reset_and_restart(&mut fe, &g, &mut qs);
    raw_ring::clear_unit_attention(&mut qs[2], &mut g, 0);
    let (r, _) = raw_ring::command(
        &mut qs[2],
        &mut g,
        lun_field(0, 0),
        &raw_ring::inquiry(36),
        &[],
        36,
    );
    assert_eq!((r.response, r.status), (0, 0), "{r:?}");
    // Every queue armed; both break at their next request, and the error
    // eventfds of the first start still report it.
    assert_eq!(
        rpc(&admin, "fault_break", json!({"device": 0})),
        Ok(json!({"armed": [2, 3]}))
    );
    for q in [2, 3] {
        raw_ring::submit(
            &mut qs[q],
            &mut g,
            lun_field(0, 0),
            &raw_ring::inquiry(36),
            &[],
            36,
        );
        qs[q].kick(&g);
        wait_signalled(
            &qs[q].err,
            &format!("vq {q}: error eventfd after the reset"),
        );
    }
    daemon.shutdown();
}
