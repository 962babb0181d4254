//! Live migration between two daemons on one Ceph RBD image (the
//! cluster of `scripts/ceph-cluster.sh`; skipped without one, a failure
//! under `SQCQ_REQUIRE_PEERS`): the source holds the image's exclusive
//! lock, a second writer is refused, the destination (`--incoming`)
//! opens the image without it, the source gives it back when its queues
//! stop while the frontend logs, and the destination takes it when its
//! frontend starts a queue; the data written at the source is read at
//! the destination.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::raw_ring::*;
use common::*;

/// The `--lun` of an image of the test cluster, from the environment
/// (`scripts/test.sh` exports it) or `scripts/ceph-cluster.sh env`.
/// Returns the `--lun` and the `rbd` command that removes the image.
fn rbd_lun(image: &str) -> Option<(String, Command)> {
    let mut vars: Vec<(String, String)> = std::env::vars().collect();
    if std::env::var_os("CEPH_CONF").is_none() {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ceph-cluster.sh");
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
    let (Some(conf), Some(pool), Some(id), Some(keyring)) = (
        var("CEPH_CONF"),
        var("SQCQ_CEPH_POOL"),
        var("SQCQ_CEPH_ID"),
        var("SQCQ_CEPH_KEYRING"),
    ) else {
        let why = "no Ceph cluster (scripts/ceph-cluster.sh start)";
        assert!(
            std::env::var_os("SQCQ_REQUIRE_PEERS").is_none(),
            "{why}; SQCQ_REQUIRE_PEERS is set, so nothing may be skipped"
        );
        eprintln!("skipped: {why}");
        return None;
    };
    let rbd = |args: &[&str]| {
        let mut c = Command::new("rbd");
        c.args(["--conf", &conf, "--id", &id, "--keyring", &keyring])
            .args(args);
        c
    };
    let spec = format!("{pool}/{image}");
    let _ = rbd(&["rm", "--no-progress", &spec]).output();
    let out = rbd(&["create", "--size", "4M", &spec]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    Some((
        format!("kind=rbd,pool={pool},image={image},conf={conf},id={id},keyring={keyring}"),
        rbd(&["rm", "--no-progress", &spec]),
    ))
}

fn sqcqd(socket: &Path, lun: &str, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_sqcqd"))
        .args(args)
        .arg("--socket-path")
        .arg(socket)
        .args(["--lun", lun])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_live_migration_hands_the_rbd_lock_over() {
    let image = format!("migrate-{}", std::process::id());
    let Some((lun, mut remove)) = rbd_lun(&image) else {
        return;
    };
    let dir = TempDir::new("rbd-migrate");
    let (src_sock, dst_sock) = (dir.path("src.sock"), dir.path("dst.sock"));
    let mut src = serving(sqcqd(&src_sock, &lun, &["--num-queues", "1"]), &src_sock)
        .expect("the source serves");
    let err = refused(
        &serving(sqcqd(&dir.path("x.sock"), &lun, &[]), &dir.path("x.sock"))
            .expect_err("a destination without --incoming"),
    );
    assert!(err.contains("exclusive lock is held by"), "{err}");
    let mut dst = serving(
        sqcqd(&dst_sock, &lun, &["--num-queues", "1", "--incoming"]),
        &dst_sock,
    )
    .expect("the destination starts beside the source");

    // The guest writes through the source, then the switch-over.
    let block: Vec<u8> = (0..=255u8).cycle().step_by(3).take(512).collect();
    let fe = write_then_switch_over(&src_sock, &block);

    // The destination's frontend starts the device: it takes the lock.
    let (_fe2, mut g2, mut vqs2, data) = start_and_read_lba0(&dst_sock);
    assert_eq!(data, block, "read at the destination");
    let (r, _) = command(
        &mut vqs2[2],
        &mut g2,
        lun_field(0, 0),
        &write10(1, 1),
        &block,
        0,
    );
    assert_eq!(r.status, 0, "the destination writes");

    // Now the destination holds it.
    let err = refused(
        &serving(sqcqd(&dir.path("y.sock"), &lun, &[]), &dir.path("y.sock"))
            .expect_err("a third writer after the hand-over"),
    );
    assert!(err.contains("exclusive lock is held by"), "{err}");
    drop(fe);
    sigterm_exits_zero(&mut src.0);
    sigterm_exits_zero(&mut dst.0);
    let _ = remove.output();
}
