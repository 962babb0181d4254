//! File LUNs lock their image as QEMU does: a second writer, `sqcqd` or
//! QEMU, is refused with the name of the process in the way; readers
//! share; `lock=off` opts out; a killed daemon's locks go with it.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::raw_ring::{start_and_read_lba0, write_then_switch_over};
use common::*;

/// A daemon serving `image` through one SCSI device at `socket`.
fn sqcqd(socket: &Path, image: &Path, extra: &str) -> Child {
    sqcqd_with(socket, image, extra, &[])
}

fn sqcqd_with(socket: &Path, image: &Path, extra: &str, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_sqcqd"))
        .args(args)
        .arg("--socket-path")
        .arg(socket)
        .arg("--lun")
        .arg(format!(
            "kind=file,path={},size=1M,create{extra}",
            image.display()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_second_writer_is_refused_with_the_holder_named() {
    let dir = TempDir::new("lock-rw");
    let image = dir.path("disk.raw");
    let first = serving(sqcqd(&dir.path("a.sock"), &image, ""), &dir.path("a.sock"))
        .expect("the first daemon serves");
    let first_pid = first.0.id();

    for extra in ["", ",ro"] {
        let err = refused(
            &serving(
                sqcqd(&dir.path("b.sock"), &image, extra),
                &dir.path("b.sock"),
            )
            .expect_err("a second daemon on a written image"),
        );
        assert!(err.contains("failed to get the"), "{extra}: {err}");
        assert!(
            err.contains(&format!("sqcqd (pid {first_pid})")),
            "{extra}: names the holder: {err}"
        );
    }

    // Opting out serves it anyway.
    let mut shared = serving(
        sqcqd(&dir.path("c.sock"), &image, ",lock=off"),
        &dir.path("c.sock"),
    )
    .expect("lock=off");
    sigterm_exits_zero(&mut shared.0);

    // A daemon killed outright leaves no lock behind.
    let mut first = first;
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    std::fs::remove_file(dir.path("a.sock")).unwrap();
    let mut next = serving(sqcqd(&dir.path("d.sock"), &image, ""), &dir.path("d.sock"))
        .expect("the locks went with the killed daemon");
    sigterm_exits_zero(&mut next.0);
}

#[test]
fn read_only_luns_share_an_image() {
    let dir = TempDir::new("lock-ro");
    let image = dir.path("disk.raw");
    std::fs::write(&image, vec![0u8; 1 << 20]).unwrap();
    let mut a = serving(
        sqcqd(&dir.path("a.sock"), &image, ",ro"),
        &dir.path("a.sock"),
    )
    .expect("a reader");
    let mut b = serving(
        sqcqd(&dir.path("b.sock"), &image, ",ro"),
        &dir.path("b.sock"),
    )
    .expect("a second reader");
    let err = refused(
        &serving(sqcqd(&dir.path("c.sock"), &image, ""), &dir.path("c.sock"))
            .expect_err("a writer beside readers"),
    );
    assert!(err.contains("\"write\" lock"), "{err}");
    sigterm_exits_zero(&mut a.0);
    sigterm_exits_zero(&mut b.0);
}

/// QEMU's own tools see sqcqd's locks, and sqcqd sees theirs.
#[test]
fn qemu_and_sqcqd_keep_off_each_others_images() {
    if Command::new("qemu-io").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("SQCQ_REQUIRE_PEERS").is_none(),
            "qemu-io (qemu-utils) is missing; SQCQ_REQUIRE_PEERS is set"
        );
        eprintln!("qemu-io is missing: skipped");
        return;
    }
    let dir = TempDir::new("lock-qemu");
    let image = dir.path("disk.raw");
    let mut daemon =
        serving(sqcqd(&dir.path("a.sock"), &image, ""), &dir.path("a.sock")).expect("sqcqd serves");
    let out = Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write 0 512"])
        .arg(&image)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() || err.contains("Failed to get"),
        "qemu-io wrote beside sqcqd: {out:?}"
    );
    assert!(err.contains("Failed to get \"write\" lock"), "{err}");
    sigterm_exits_zero(&mut daemon.0);

    // qemu-io holding the image open for writing keeps sqcqd off it.
    let mut qemu_io = Command::new("qemu-io")
        .args(["-f", "raw"])
        .arg(&image)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = qemu_io.stdin.take().unwrap();
    writeln!(stdin, "write 0 512").unwrap();
    let mut lines = BufReader::new(qemu_io.stdout.take().unwrap()).lines();
    assert!(
        lines.any(|l| l.is_ok_and(|l| l.contains("wrote"))),
        "qemu-io wrote"
    );
    let err = refused(
        &serving(sqcqd(&dir.path("b.sock"), &image, ""), &dir.path("b.sock"))
            .expect_err("sqcqd beside a writing qemu-io"),
    );
    assert!(err.contains("qemu-io (pid"), "{err}");
    drop(stdin);
    qemu_io.wait().unwrap();
}

/// Live migration between two daemons on one image: the destination,
/// started with `--incoming`, takes no lock until its frontend starts a
/// queue; the source gives its locks up when its queues stop while the
/// frontend logs (the switch-over); the data written at the source is
/// read at the destination.
#[test]
fn a_live_migration_hands_the_image_over() {
    let dir = TempDir::new("lock-migrate");
    let image = dir.path("disk.raw");
    let (src_sock, dst_sock) = (dir.path("src.sock"), dir.path("dst.sock"));
    let mut src = serving(
        sqcqd_with(&src_sock, &image, "", &["--num-queues", "1"]),
        &src_sock,
    )
    .expect("the source serves");
    let err = refused(
        &serving(sqcqd(&dir.path("x.sock"), &image, ""), &dir.path("x.sock"))
            .expect_err("a destination without --incoming"),
    );
    assert!(err.contains("\"write\" lock"), "{err}");
    let mut dst = serving(
        sqcqd_with(&dst_sock, &image, "", &["--num-queues", "1", "--incoming"]),
        &dst_sock,
    )
    .expect("the destination starts beside the source");

    // The guest writes through the source, then the switch-over.
    let block: Vec<u8> = (0..=255u8).cycle().step_by(3).take(512).collect();
    let fe = write_then_switch_over(&src_sock, &block);

    // The destination's frontend starts the device: it takes the image.
    let (_fe2, _, _, data) = start_and_read_lba0(&dst_sock);
    assert_eq!(data, block, "read at the destination");

    // Now the destination holds it.
    let err = refused(
        &serving(sqcqd(&dir.path("y.sock"), &image, ""), &dir.path("y.sock"))
            .expect_err("a third writer after the hand-over"),
    );
    assert!(
        err.contains(&format!("sqcqd (pid {})", dst.0.id())),
        "the destination holds it: {err}"
    );
    drop(fe);
    sigterm_exits_zero(&mut src.0);
    sigterm_exits_zero(&mut dst.0);
}
