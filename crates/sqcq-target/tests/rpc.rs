//! The management API (JSON-RPC 2.0 on the admin socket): the envelope as
//! the specification defines it, devices created at run time that serve
//! I/O and deleted ones that are gone, and the same changes made three
//! ways (RPC calls, a configuration reload, a daemon started from the new
//! configuration) giving the same daemon.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use common::driver::*;
use common::*;
use serde_json::{Value, json};
use sqcq_driver::scsi::Cdb;
use sqcq_target::Daemon;
use sqcq_target::config::{
    BackstoreKind, DaemonConfig, DeviceConfig, DeviceType, LunSpec, QueueMap,
};

fn config(dir: &TempDir, workers: usize, devices: Vec<DeviceConfig>) -> DaemonConfig {
    DaemonConfig {
        workers,
        devices,
        poll: Default::default(),
        admin_socket: Some(dir.path("admin.sock")),
        seccomp: Default::default(),
        service: Default::default(),
    }
}

fn device(socket: PathBuf, device_type: DeviceType, luns: Vec<LunSpec>) -> DeviceConfig {
    DeviceConfig {
        device_type,
        socket_path: socket,
        luns,
        num_queues: 2,
        queue_size: QUEUE_SIZE,
        queue_map: QueueMap::default(),
        qos: Default::default(),
    }
}

fn at(mut spec: LunSpec, lun: u16) -> LunSpec {
    spec.lun = Some(lun);
    spec
}

/// Sends `lines` on one connection and reads `replies` lines back.
fn exchange(admin: &Path, lines: &str, replies: usize) -> Vec<Value> {
    let mut s = UnixStream::connect(admin).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(lines.as_bytes()).unwrap();
    let mut r = BufReader::new(s);
    (0..replies)
        .map(|_| {
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
        })
        .collect()
}

#[test]
fn the_envelope_is_json_rpc_2() {
    let dir = TempDir::new("rpc-envelope");
    let scsi = device(
        dir.path("scsi.sock"),
        DeviceType::Scsi,
        vec![lun(BackstoreKind::Null, 1 << 30)],
    );
    let daemon = Daemon::start(&config(&dir, 1, vec![scsi])).unwrap();
    let admin = dir.path("admin.sock");
    let replies = exchange(
        &admin,
        concat!(
            "{\"jsonrpc\":\"2.0\",\"method\":\"daemon_info\",\"id\":\"a\"\n",
            "{\"jsonrpc\":\"2.0\",\"method\":\"daemon_info\",\"id\":[1]}\n",
            "{\"method\":\"daemon_info\",\"id\":2}\n",
            "{\"jsonrpc\":\"2.0\",\"method\":\"no_such\",\"id\":3}\n",
            "{\"jsonrpc\":\"2.0\",\"method\":\"device_delete\",\"params\":{\"device\":\"x\"},\"id\":4}\n",
            "{\"jsonrpc\":\"2.0\",\"method\":\"device_list\",\"params\":{\"bogus\":1},\"id\":5}\n",
            "{\"jsonrpc\":\"2.0\",\"method\":\"device_list\",\"params\":[0],\"id\":6}\n",
            "{\"jsonrpc\":\"2.0\",\"method\":\"worker_list\"}\n",
            "[{\"jsonrpc\":\"2.0\",\"method\":\"worker_list\",\"id\":7},",
            "{\"jsonrpc\":\"2.0\",\"method\":\"daemon_info\"},",
            "{\"jsonrpc\":\"2.0\",\"method\":\"device_delete\",\"params\":{\"device\":9},\"id\":8}]\n",
            "[]\n",
            "{\"jsonrpc\":\"2.0\",\"method\":\"daemon_info\",\"id\":9}\n",
        ),
        10,
    );
    assert_eq!(replies[0]["error"]["code"], -32700, "{}", replies[0]);
    assert_eq!(replies[0]["id"], Value::Null);
    assert_eq!(replies[1]["error"]["code"], -32600, "an array id");
    assert_eq!(replies[2]["error"]["code"], -32600, "no jsonrpc member");
    assert_eq!(replies[2]["id"], 2);
    assert_eq!(replies[3]["error"]["code"], -32601);
    assert_eq!(replies[4]["error"]["code"], -32602, "a string device");
    assert_eq!(replies[5]["error"]["code"], -32602, "an unknown parameter");
    assert_eq!(replies[6]["error"]["code"], -32602, "positional params");
    // The notification got no answer: the batch's comes next, without
    // the answer of its notification.
    let batch = replies[7].as_array().expect("a batch answer");
    assert_eq!(batch.len(), 2, "{batch:?}");
    assert_eq!(batch[0]["id"], 7);
    assert_eq!(batch[0]["result"][0]["id"], 0);
    assert_eq!(
        (batch[1]["id"].clone(), error_code(&batch[1]["error"])),
        (json!(8), -32001)
    );
    assert_eq!(replies[8]["error"]["code"], -32600, "an empty batch");
    assert_eq!(replies[9]["id"], 9);
    assert_eq!(replies[9]["result"]["devices"], 1);
    assert_eq!(
        replies[9]["result"]["pid"].as_u64(),
        Some(u64::from(std::process::id()))
    );
    // rpc.discover describes every method with its parameters.
    let doc = rpc(&admin, "rpc.discover", json!({})).unwrap();
    assert_eq!(doc["openrpc"], "1.2.6");
    let attach = doc["methods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "queue_attach_worker")
        .unwrap();
    let names: Vec<&str> = attach["params"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["device", "rq", "worker"]);
    // A line that is not JSON, such as a text command of earlier
    // versions, gets the parse error and changes nothing; the connection
    // goes on.
    let replies = exchange(
        &admin,
        concat!(
            "stats\n",
            "lun add device=0 lun=1 kind=ram,size=1M\n",
            "{\"jsonrpc\":\"2.0\",\"method\":\"device_list\",\"id\":1}\n",
        ),
        3,
    );
    for r in &replies[..2] {
        assert_eq!(r["error"]["code"], -32700, "{r}");
        assert_eq!(r["id"], Value::Null);
    }
    let luns = &replies[2]["result"][0]["luns"];
    assert_eq!(luns.as_array().map(Vec::len), Some(1), "{luns}");
    daemon.shutdown();
}

#[test]
fn devices_created_at_run_time_serve_and_deleted_ones_are_gone() {
    let dir = TempDir::new("rpc-devices");
    let first = device(
        dir.path("first.sock"),
        DeviceType::Scsi,
        vec![lun(BackstoreKind::Null, 1 << 30)],
    );
    let daemon = Daemon::start(&config(&dir, 2, vec![first])).unwrap();
    let admin = dir.path("admin.sock");
    let socket = dir.path("new.sock");
    let created = rpc(
        &admin,
        "device_create",
        json!({
            "socket-path": socket,
            "lun": ["kind=ram,size=8M", {"kind": "null", "size": "1G", "lun": 3}],
            "num-queues": 2,
            "queue-size": QUEUE_SIZE,
            "queue-map": "1:1",
        }),
    )
    .unwrap();
    assert_eq!(created["device"], 1);
    let mut d = Driver::connect(&socket);
    let rq = &mut d.rqs[1];
    let data = vec![0xa5u8; 512];
    rq.clear_unit_attention(0);
    let w = rq.command(lun_at(0, 0), Cdb::write_10(9, 1, false), &data, 0);
    assert!(w.good());
    let r = rq.command(lun_at(0, 0), Cdb::read_10(9, 1, false), &[], 512);
    assert!(r.good());
    assert_eq!(r.data, data, "the new device keeps what was written");
    assert!(rq.inquiry(3).good(), "LUN 3 as created");
    let list = rpc(&admin, "device_list", json!({})).unwrap();
    let new = &list[1];
    assert_eq!(
        (new["id"].clone(), new["type"].clone()),
        (json!(1), json!("scsi"))
    );
    assert_eq!(new["connected"], true);
    let luns: Vec<u64> = new["luns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["lun"].as_u64().unwrap())
        .collect();
    assert_eq!(luns, [0, 3]);
    assert_eq!(new["queues"][1]["assigned_worker"], 1);
    assert_eq!(
        new["queues"][1]["worker"], 1,
        "rq 1 runs where the map says"
    );
    // Conflicts and bad parameters.
    let again = rpc(
        &admin,
        "device_create",
        json!({"socket-path": socket, "lun": ["kind=null,size=1G"]}),
    );
    assert_eq!(error_code(&again.unwrap_err()), -32002, "a socket in use");
    let bad = rpc(
        &admin,
        "device_create",
        json!({"socket-path": dir.path("bad.sock"), "lun": ["kind=null,size=1G"], "num-queues": 0}),
    );
    assert_eq!(error_code(&bad.unwrap_err()), -32602);
    assert!(
        !dir.path("bad.sock").exists(),
        "nothing left of a refused device"
    );
    let blk = rpc(
        &admin,
        "device_create",
        json!({"socket-path": dir.path("blk.sock"), "type": "blk", "lun": []}),
    );
    assert_eq!(
        error_code(&blk.unwrap_err()),
        -32602,
        "a blk device without a disk"
    );
    // A LUN parameter the unit refuses is the caller's mistake, not a
    // failure of the storage.
    let wwn = rpc(
        &admin,
        "lun_add",
        json!({"device": 1, "lun": 9, "kind": "null", "size": "1M", "wwn": "0x1234"}),
    )
    .unwrap_err();
    assert_eq!(error_code(&wwn), -32602, "{wwn}");
    assert!(wwn.to_string().contains("NAA IEEE Registered"), "{wwn}");
    // Deleting a connected device is refused, as is removing its LUN:
    // its VM would lose the disk. With force it disconnects the frontend
    // and removes the socket; the other devices go on.
    let e = rpc(&admin, "device_delete", json!({"device": 1})).unwrap_err();
    assert_eq!(error_code(&e), sqcq_target::rpc::CONFLICT, "{e}");
    assert!(e.to_string().contains("force=true"), "{e}");
    let e = rpc(&admin, "lun_remove", json!({"device": 1, "lun": 0})).unwrap_err();
    assert_eq!(error_code(&e), sqcq_target::rpc::CONFLICT, "{e}");
    assert!(socket.exists(), "still served");
    rpc(&admin, "device_delete", json!({"device": 1, "force": true})).unwrap();
    assert!(!socket.exists(), "the socket is removed");
    let e = rpc(&admin, "device_delete", json!({"device": 1})).unwrap_err();
    assert_eq!(error_code(&e), -32001);
    let list = rpc(&admin, "device_list", json!({})).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1);
    drop(d);
    let mut first = Driver::connect(&dir.path("first.sock"));
    assert!(first.rqs[0].inquiry(0).good());
    drop(first);
    daemon.shutdown();
}

/// A device list with `dir` taken out of the socket paths, and the
/// connection state and running workers (which depend on a frontend)
/// left out: what a configuration describes.
fn described(list: &Value, dir: &Path) -> Value {
    let mut list = list.clone();
    for d in list.as_array_mut().unwrap() {
        let path = d["socket_path"].as_str().unwrap().to_owned();
        let rel = Path::new(&path).strip_prefix(dir).unwrap();
        d["socket_path"] = json!(rel);
        d.as_object_mut().unwrap().remove("connected");
        for q in d["queues"].as_array_mut().unwrap() {
            q.as_object_mut().unwrap().remove("worker");
        }
    }
    list
}

/// Configuration X, and Y: one more worker; on device A LUN 0 resized,
/// LUN 1 removed, LUN 2 added and request queue 1 on worker 1; device B
/// deleted; device C (blk) created.
fn x_and_y(dir: &TempDir) -> (DaemonConfig, DaemonConfig) {
    let (a, b, c) = (dir.path("a.sock"), dir.path("b.sock"), dir.path("c.sock"));
    let x = config(
        dir,
        1,
        vec![
            device(
                a.clone(),
                DeviceType::Scsi,
                vec![
                    lun(BackstoreKind::Ram, 8 << 20),
                    lun(BackstoreKind::Null, 1 << 30),
                ],
            ),
            device(b, DeviceType::Blk, vec![lun(BackstoreKind::Ram, 16 << 20)]),
        ],
    );
    let mut a_y = device(
        a,
        DeviceType::Scsi,
        vec![
            at(lun(BackstoreKind::Ram, 16 << 20), 0),
            at(lun(BackstoreKind::Ram, 4 << 20), 2),
        ],
    );
    a_y.queue_map = QueueMap(vec![(1, 1)]);
    let y = config(
        dir,
        2,
        vec![
            a_y,
            device(c, DeviceType::Blk, vec![lun(BackstoreKind::Null, 1 << 30)]),
        ],
    );
    (x, y)
}

#[test]
fn rpc_reload_and_a_fresh_start_give_the_same_daemon() {
    // By RPC, from X.
    let dir1 = TempDir::new("rpc-same-1");
    let (x, _) = x_and_y(&dir1);
    let d1 = Daemon::start(&x).unwrap();
    let admin = dir1.path("admin.sock");
    let calls = [
        ("worker_create", json!({})),
        ("lun_resize", json!({"device": 0, "lun": 0, "size": "16M"})),
        ("lun_remove", json!({"device": 0, "lun": 1})),
        (
            "lun_add",
            json!({"device": 0, "lun": 2, "kind": "ram", "size": 4 << 20}),
        ),
        (
            "queue_attach_worker",
            json!({"device": 0, "rq": 1, "worker": 1}),
        ),
        ("device_delete", json!({"device": 1})),
        (
            "device_create",
            json!({"socket-path": dir1.path("c.sock"), "type": "blk",
                   "lun": ["kind=null,size=1G"], "num-queues": 2, "queue-size": QUEUE_SIZE}),
        ),
    ];
    for (method, params) in calls {
        rpc(&admin, method, params).unwrap_or_else(|e| panic!("{method}: {e}"));
    }
    let by_rpc = described(&rpc(&admin, "device_list", json!({})).unwrap(), &dir1.0);
    let workers_rpc = rpc(&admin, "daemon_info", json!({})).unwrap()["workers"].clone();
    // By reloading Y, from X.
    let dir2 = TempDir::new("rpc-same-2");
    let (x, y2) = x_and_y(&dir2);
    let d2 = Daemon::start(&x).unwrap();
    let report = d2.reload(&y2);
    assert!(report.errors.is_empty(), "{report:?}");
    assert_eq!(report.changed.len(), 7, "{report:?}");
    let admin2 = dir2.path("admin.sock");
    let by_reload = described(&rpc(&admin2, "device_list", json!({})).unwrap(), &dir2.0);
    // From Y.
    let dir3 = TempDir::new("rpc-same-3");
    let (_, y) = x_and_y(&dir3);
    let d3 = Daemon::start(&y).unwrap();
    let admin3 = dir3.path("admin.sock");
    let fresh = described(&rpc(&admin3, "device_list", json!({})).unwrap(), &dir3.0);
    assert_eq!(by_rpc, fresh, "RPC changes give what the file describes");
    assert_eq!(by_reload, fresh, "a reload gives what the file describes");
    assert_eq!(workers_rpc, 2);
    assert_eq!(
        rpc(&admin2, "daemon_info", json!({})).unwrap()["workers"],
        2
    );
    // LUNs listed out of order keep their numbers and kinds, and a reload
    // of the same description changes nothing.
    let created = rpc(
        &admin2,
        "device_create",
        json!({"socket_path": dir2.path("e.sock"), "num_queues": 1, "queue_size": QUEUE_SIZE,
               "lun": [{"kind": "ram", "size": "8M", "lun": 1},
                       {"kind": "null", "size": "1G", "lun": 0, "block_size": 4096}]}),
    )
    .expect("snake_case keys, as device_list prints them");
    let e = created["device"].as_u64().unwrap();
    let list = rpc(&admin2, "device_list", json!({})).unwrap();
    let dev = list
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["id"].as_u64() == Some(e))
        .unwrap();
    let kinds: Vec<(u64, &str, u64)> = dev["luns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["lun"].as_u64().unwrap(),
                l["kind"].as_str().unwrap(),
                l["block_size"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(kinds, [(0, "null", 4096), (1, "ram", 512)]);
    let mut y_e = y2.clone();
    let mut e_cfg = device(
        dir2.path("e.sock"),
        DeviceType::Scsi,
        vec![
            at(lun(BackstoreKind::Ram, 8 << 20), 1),
            LunSpec {
                block_size: 4096,
                ..at(lun(BackstoreKind::Null, 1 << 30), 0)
            },
        ],
    );
    e_cfg.num_queues = 1;
    y_e.devices.push(e_cfg);
    let report = d2.reload(&y_e);
    assert_eq!(
        (report.changed.len(), report.errors.len()),
        (0, 0),
        "{report:?}"
    );
    // Reloading again changes nothing, and leaves alone a device created
    // through the API that the file does not name.
    rpc(
        &admin2,
        "device_create",
        json!({"socket-path": dir2.path("d.sock"), "lun": ["kind=null,size=1G"]}),
    )
    .unwrap();
    let again = d2.reload(&y_e);
    assert_eq!(
        (again.changed.len(), again.errors.len()),
        (0, 0),
        "{again:?}"
    );
    assert!(dir2.path("d.sock").exists());
    // ...but deletes one the file defined and no longer names.
    let shrunk = d2.reload(&y2);
    assert_eq!(
        shrunk.changed,
        [format!("device {e} deleted")],
        "{shrunk:?}"
    );
    assert!(dir2.path("d.sock").exists(), "the API device stays");
    // The daemon changed by RPC is what the file describes: reloading it
    // changes nothing either.
    let (_, y1) = x_and_y(&dir1);
    let same = d1.reload(&y1);
    assert_eq!((same.changed.len(), same.errors.len()), (0, 0), "{same:?}");
    // What a reload cannot change is reported, and left alone.
    let mut z = y_e.clone();
    z.devices[0].num_queues = 4;
    let refused = d2.reload(&z);
    assert_eq!(refused.errors.len(), 1, "{refused:?}");
    d1.shutdown();
    d2.shutdown();
    d3.shutdown();
}

/// A file LUN whose configuration gives no size, grown by `lun_resize`,
/// keeps its size through a reload of the unchanged file: nothing is
/// changed (before, SIGHUP hot-unplugged and re-added such a SCSI LUN
/// under the guest, and refused a blk device's reload as "the disk
/// changed").
#[test]
fn a_reload_keeps_a_lun_resized_since_when_the_file_gives_no_size() {
    let dir = TempDir::new("rpc-reload-resized");
    let file = |name: &str| {
        let path = dir.path(name);
        std::fs::File::create(&path)
            .unwrap()
            .set_len(8 << 20)
            .unwrap();
        LunSpec {
            path: Some(path),
            ..LunSpec::new(BackstoreKind::File)
        }
    };
    let x = config(
        &dir,
        1,
        vec![
            device(dir.path("a.sock"), DeviceType::Scsi, vec![file("a.img")]),
            device(dir.path("b.sock"), DeviceType::Blk, vec![file("b.img")]),
        ],
    );
    let d = Daemon::start(&x).unwrap();
    let admin = dir.path("admin.sock");
    for device in [0, 1] {
        rpc(
            &admin,
            "lun_resize",
            json!({"device": device, "lun": 0, "size": "16M"}),
        )
        .unwrap();
    }
    let before = rpc(&admin, "device_list", json!({})).unwrap();
    let report = d.reload(&x);
    assert_eq!(
        (report.changed.len(), report.errors.len()),
        (0, 0),
        "{report:?}"
    );
    let after = rpc(&admin, "device_list", json!({})).unwrap();
    assert_eq!(before, after);
    for dev in after.as_array().unwrap() {
        assert_eq!(dev["luns"][0]["blocks"], (16 << 20) / 512, "{dev}");
    }
}
