//! Saved state, with the real binary: a daemon changed through the
//! management API, saved with `config_save`, stopped and started again
//! from the saved file is the same daemon (`device_list` and
//! `worker_list` compared); a reload of the saved file changes nothing;
//! `--save-config` keeps the file up to date after every change, and a
//! file LUN's data is still there after the restart.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::*;
use serde_json::{Value, json};

const SQCQD: &str = env!("CARGO_BIN_EXE_sqcqd");

/// Starts `sqcqd ARGS...` with its stderr in `log` and waits until
/// `admin` answers.
fn start(args: &[&str], admin: &Path, log: &Path) -> (Running, LogOnPanic) {
    let _ = std::fs::remove_file(admin);
    let child: Child = Command::new(SQCQD)
        .args(args)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let guard = LogOnPanic(log.to_owned(), child.id());
    let mut running = Running(child);
    wait_until("the admin socket answers", || {
        assert!(
            running.0.try_wait().unwrap().is_none(),
            "sqcqd exited: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        sqcq_target::rpc::call(admin, "daemon_info", Default::default()).is_ok()
    });
    (running, guard)
}

fn call(admin: &Path, method: &str, params: Value) -> Value {
    rpc(admin, method, params).unwrap_or_else(|e| panic!("{method}: {e}"))
}

/// `device_list` without the connection state (no frontend here either
/// way) and `worker_list` without the per-run CPU figures (time,
/// displacements).
fn state(admin: &Path) -> (Value, Value) {
    let mut workers = call(admin, "worker_list", json!({}));
    for w in workers.as_array_mut().unwrap() {
        let w = w.as_object_mut().unwrap();
        w.remove("cpu_displacements");
        w.remove("cpu_displaced");
        w.remove("cpu_ns");
    }
    (call(admin, "device_list", json!({})), workers)
}

#[test]
fn a_daemon_saved_and_started_from_its_file_is_the_same_daemon() {
    let dir = TempDir::new("saved-state");
    let admin = dir.path("admin.sock");
    let image = dir.path("disk.img");
    let saved = dir.path("saved.toml");
    let image_lun = format!("kind=file,path={},size=4M,create", image.display());
    let (mut d1, _g1) = start(
        &[
            "--socket-path",
            dir.path("a.sock").to_str().unwrap(),
            "--lun",
            "kind=ram,size=8M",
            "--lun",
            &image_lun,
            "--num-queues",
            "2",
            "--queue-size",
            "128",
            "--workers",
            "2",
            "--poll-cpus",
            "0,1",
            "--admin-socket",
            admin.to_str().unwrap(),
            "--stats-interval",
            "0",
            "--poll",
            "ring",
        ],
        &admin,
        &dir.path("first.log"),
    );
    // Changes of every kind through the API.
    call(&admin, "worker_create", json!({ "cpu": 0 }));
    call(
        &admin,
        "lun_resize",
        json!({"device": 0, "lun": 0, "size": "16M"}),
    );
    call(
        &admin,
        "lun_add",
        json!({"device": 0, "lun": 5, "kind": "null", "size": "1G", "block-size": 4096,
               "serial": "00042", "wwn": "0x5001405000000005"}),
    );
    call(
        &admin,
        "queue_attach_worker",
        json!({"device": 0, "rq": 1, "worker": 2}),
    );
    call(
        &admin,
        "device_create",
        json!({"socket-path": dir.path("b.sock"), "type": "blk", "num-queues": 3,
               "lun": ["kind=ram,size=2M,ro"], "queue-map": "2:0"}),
    );
    call(
        &admin,
        "device_create",
        json!({"socket-path": dir.path("c.sock"), "lun": ["kind=null,size=1M"]}),
    );
    call(&admin, "device_delete", json!({"device": 2}));
    let before = state(&admin);
    // A relative path is refused with a reason, not written to `/`.
    let e = rpc(&admin, "config_save", json!({"path": "saved.toml"})).unwrap_err();
    assert_eq!(error_code(&e), sqcq_target::rpc::INVALID_PARAMS, "{e}");
    assert!(e["message"].as_str().unwrap().contains("absolute"), "{e}");
    // Without --save-config the path is required.
    let e = rpc(&admin, "config_save", json!({})).unwrap_err();
    assert_eq!(error_code(&e), sqcq_target::rpc::INVALID_PARAMS, "{e}");
    let r = call(&admin, "config_save", json!({"path": saved}));
    assert_eq!(r["notes"], json!([]), "nothing the file cannot say: {r}");
    sigterm_exits_zero(&mut d1.0);

    let (_d2, _g2) = start(
        &["--config", saved.to_str().unwrap()],
        &admin,
        &dir.path("second.log"),
    );
    let after = state(&admin);
    assert_eq!(after.0, before.0, "device_list");
    assert_eq!(after.1, before.1, "worker_list");
    let report = call(&admin, "config_reload", json!({}));
    assert_eq!(
        report,
        json!({"changed": [], "errors": []}),
        "a reload of the saved file is the same daemon"
    );
    // The file LUN is the same file, not a new one.
    assert_eq!(std::fs::metadata(&image).unwrap().len(), 4 << 20);
}

#[test]
fn save_config_follows_every_change() {
    let dir = TempDir::new("save-config");
    let admin = dir.path("admin.sock");
    let saved = dir.path("state/sqcqd.toml");
    std::fs::create_dir_all(saved.parent().unwrap()).unwrap();
    let (_d, _g) = start(
        &[
            "--socket-path",
            dir.path("a.sock").to_str().unwrap(),
            "--lun",
            "kind=ram,size=1M",
            "--admin-socket",
            admin.to_str().unwrap(),
            "--save-config",
            saved.to_str().unwrap(),
            "--stats-interval",
            "0",
            // Saving is allowed by the filter.
            "--seccomp",
            "kill",
        ],
        &admin,
        &dir.path("sqcqd.log"),
    );
    let luns = |text: &str| {
        sqcq_target::config::parse_toml(text, 1, 1, 1024)
            .unwrap()
            .devices[0]
            .luns
            .iter()
            .map(|l| (l.lun, l.size))
            .collect::<Vec<_>>()
    };
    call(
        &admin,
        "lun_add",
        json!({"device": 0, "lun": 1, "kind": "ram", "size": "2M"}),
    );
    let text = std::fs::read_to_string(&saved).expect("saved after lun_add");
    assert_eq!(
        luns(&text),
        [(Some(0), Some(1 << 20)), (Some(1), Some(2 << 20))]
    );
    call(
        &admin,
        "lun_resize",
        json!({"device": 0, "lun": 1, "size": "3M"}),
    );
    let text = std::fs::read_to_string(&saved).unwrap();
    assert_eq!(
        luns(&text),
        [(Some(0), Some(1 << 20)), (Some(1), Some(3 << 20))]
    );
    // A change refused saves nothing new (the file is as it was).
    assert!(rpc(&admin, "lun_remove", json!({"device": 0, "lun": 9})).is_err());
    assert_eq!(std::fs::read_to_string(&saved).unwrap(), text);
    call(&admin, "lun_remove", json!({"device": 0, "lun": 0}));
    let text = std::fs::read_to_string(&saved).unwrap();
    assert_eq!(luns(&text), [(Some(1), Some(3 << 20))]);
    // config_save without a path writes the --save-config file, and
    // says what the file cannot: a freed worker between two others.
    call(&admin, "worker_create", json!({}));
    call(&admin, "worker_create", json!({}));
    call(&admin, "worker_free", json!({"worker": 1}));
    std::fs::remove_file(&saved).unwrap();
    let r = call(&admin, "config_save", json!({}));
    assert_eq!(r["path"], json!(saved));
    assert_eq!(
        r["notes"],
        json!(["worker 1 was freed: a start from this file runs it again (idle)"])
    );
    let text = std::fs::read_to_string(&saved).unwrap();
    let c = sqcq_target::config::parse_toml(&text, 1, 1, 1024).unwrap();
    assert_eq!(c.workers, 3);
}
