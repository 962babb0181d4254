//! A queue stopped while its backstore holds requests (spec 8.3.2 S1,
//! S5): past the stop deadline the requests are cancelled and waited for,
//! never abandoned with the kernel still copying through guest memory.
//!
//! The backstore is really blocked, with no test hook: see
//! `common::blocked`.

#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

mod common;

use std::os::unix::fs::FileExt;
use std::time::Duration;

use common::blocked::{self, InodeLock, blocked, lost_lock, serial, wait_in_flight, write};
use common::raw_ring::{
    Guest, Vq, clear_unit_attention, connect_device, connect_with, lun_field, read_resp, submit,
    vqs as scsi_vqs, write10,
};
use common::*;
use sqcq_target::Daemon;
use sqcq_target::config::{DeviceType, PollOptions};
use sqcq_wire::blk::Status;

const LEN: u32 = 4096;

/// A daemon with one device of `device_type` on a file of `dir`, with a
/// stop deadline of 300 ms.
fn start(dir: &TempDir, device_type: DeviceType) -> (Daemon, std::path::PathBuf) {
    let poll = PollOptions {
        stop_timeout: Duration::from_millis(300),
        ..PollOptions::default()
    };
    blocked::start(dir, device_type, poll)
}

/// More writes than io-wq runs at once on this machine (4 per CPU).
fn writes() -> u16 {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    u16::try_from(4 * cpus + 4).unwrap().min(QUEUE_SIZE / 3)
}

#[test]
fn a_stop_past_its_deadline_cancels_and_waits_for_the_backstore_then_serves_again() {
    let _serial = serial();
    blocked(blk_attempt);
}

/// One attempt of [`a_stop_past_its_deadline_cancels_and_waits_for_the_backstore_then_serves_again`]; false if the inode lock was lost.
fn blk_attempt() -> bool {
    let dir = TempDir::new("stop-cancel");
    let (daemon, socket) = start(&dir, DeviceType::Blk);
    let mut g = Guest::new();
    let mut vqs = vec![Vq::new(0)];
    let fe = connect_device(&socket, &g, &mut vqs, false, 0);

    let mut lock = InodeLock::hold(&dir.path("disk"));
    let n = writes();
    let mut status = std::collections::HashMap::new();
    for i in 0..n {
        let (head, at) = write(&mut vqs[0], &mut g, 8 * u64::from(i), &[0xa1; LEN as usize]);
        status.insert(head, at);
    }
    vqs[0].kick(&g);
    if !wait_in_flight(&daemon, n, &vqs[0], &g) {
        return lost_lock(&lock);
    }

    // The frontend goes away: the queue stops and past its deadline
    // cancels the writes. The queued ones complete at once, with an error;
    // the running ones wait for the lock, the guest memory they copy from
    // still mapped by the daemon.
    drop(fe);
    let (head, _) = vqs[0].wait_used(&g);
    if g.read(status[&head], 1)[0] == Status::Ok as u8 {
        return lost_lock(&lock);
    }
    assert_eq!(
        g.read(status[&head], 1)[0],
        Status::IoErr as u8,
        "cancelled"
    );
    let cancelled = vqs[0].used_idx(&g);
    assert!(cancelled < n, "the running writes are still waited for");
    for _ in 1..cancelled {
        let (head, _) = vqs[0].wait_used(&g);
        if g.read(status[&head], 1)[0] == Status::Ok as u8 {
            return lost_lock(&lock);
        }
        assert_eq!(g.read(status[&head], 1)[0], Status::IoErr as u8);
    }

    // The backstore lets go: the running writes complete (whatever their
    // result) and are published before the stop ends.
    lock.release();
    for _ in cancelled..n {
        let (head, _) = vqs[0].wait_used(&g);
        assert_ne!(g.read(status[&head], 1)[0], 0xff, "its status was written");
    }

    // The daemon survived and serves a new frontend.
    let mut g2 = Guest::new();
    let mut vqs2 = vec![Vq::new(0)];
    let _fe2 = connect_device(&socket, &g2, &mut vqs2, false, 0);
    let sector = 8 * u64::from(n);
    let (_, at) = write(&mut vqs2[0], &mut g2, sector, &[0xb3; LEN as usize]);
    vqs2[0].kick(&g2);
    vqs2[0].wait_used(&g2);
    assert_eq!(g2.read(at, 1)[0], Status::Ok as u8);
    let mut back = vec![0u8; LEN as usize];
    std::fs::File::open(dir.path("disk"))
        .unwrap()
        .read_exact_at(&mut back, sector * 512)
        .unwrap();
    assert_eq!(back, vec![0xb3; LEN as usize]);
    daemon.shutdown();
    true
}

/// The SCSI request queue of `scsi_vqs`.
const RQ: usize = 2;

/// Pads `g`'s allocations so that the data-out buffer `submit` allocates
/// next (after a 64-byte request header) is 512-byte aligned, for the
/// file backstore's direct descriptor.
fn align_data_out(g: &mut Guest) {
    let at = g.alloc(1);
    let pad = (512 - (at + 64 + 64) % 512) % 512;
    if pad > 0 {
        g.alloc(pad as u32);
    }
}

#[test]
fn a_scsi_queue_stop_past_its_deadline_cancels_and_waits_for_the_backstore() {
    let _serial = serial();
    blocked(scsi_attempt);
}

/// One attempt of [`a_scsi_queue_stop_past_its_deadline_cancels_and_waits_for_the_backstore`]; false if the inode lock was lost.
fn scsi_attempt() -> bool {
    let dir = TempDir::new("stop-cancel-scsi");
    let (daemon, socket) = start(&dir, DeviceType::Scsi);
    let mut g = Guest::new();
    let mut vqs = scsi_vqs();
    let fe = connect_with(&socket, &g, &mut vqs, false, 0);
    clear_unit_attention(&mut vqs[RQ], &mut g, 0);

    let mut lock = InodeLock::hold(&dir.path("disk"));
    let n = writes();
    let mut resp = std::collections::HashMap::new();
    for i in 0..n {
        align_data_out(&mut g);
        let p = submit(
            &mut vqs[RQ],
            &mut g,
            lun_field(0, 0),
            &write10(8 * u32::from(i), 8),
            &[0xc4; LEN as usize],
            0,
        );
        resp.insert(p.head, p.resp);
    }
    vqs[RQ].kick(&g);
    if !wait_in_flight(&daemon, n, &vqs[RQ], &g) {
        return lost_lock(&lock);
    }

    // As for blk: the queued writes are cancelled and fail at once (CHECK
    // CONDITION), the running ones are waited for.
    drop(fe);
    let (head, _) = vqs[RQ].wait_used(&g);
    if read_resp(&g, resp[&head]).status == 0 {
        return lost_lock(&lock);
    }
    assert_eq!(read_resp(&g, resp[&head]).status, 2, "cancelled");
    let cancelled = vqs[RQ].used_idx(&g) - vqs[RQ].last_used + 1;
    assert!(cancelled < n, "the running writes are still waited for");
    for _ in 1..cancelled {
        let (head, _) = vqs[RQ].wait_used(&g);
        if read_resp(&g, resp[&head]).status == 0 {
            return lost_lock(&lock);
        }
        assert_eq!(read_resp(&g, resp[&head]).status, 2);
    }
    lock.release();
    for _ in cancelled..n {
        vqs[RQ].wait_used(&g);
    }

    // The daemon survived and serves a new frontend.
    let mut g2 = Guest::new();
    let mut vqs2 = scsi_vqs();
    let _fe2 = connect_with(&socket, &g2, &mut vqs2, false, 0);
    clear_unit_attention(&mut vqs2[RQ], &mut g2, 0);
    let p = submit(
        &mut vqs2[RQ],
        &mut g2,
        lun_field(0, 0),
        &write10(0, 8),
        &[0xd5; LEN as usize],
        0,
    );
    vqs2[RQ].kick(&g2);
    assert_eq!(vqs2[RQ].wait_used(&g2).0, p.head);
    assert_eq!(read_resp(&g2, p.resp).status, 0);
    daemon.shutdown();
    true
}

/// Spec 8.3.2 S5: a worker that cannot finish a stop (a backstore write
/// that neither completes nor cancels) keeps GET_VRING_BASE unanswered and
/// the memory mapped; the real binary then ends the process (a crash for
/// the frontend) rather than start the vring again under it.
#[test]
fn a_stop_the_backstore_never_lets_finish_ends_the_process_unanswered() {
    let _serial = serial();
    blocked(abort_attempt);
}

/// One attempt of [`a_stop_the_backstore_never_lets_finish_ends_the_process_unanswered`];
/// false if the write succeeded (see [`blocked`]).
fn abort_attempt() -> bool {
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};

    let dir = TempDir::new("stop-abort");
    let socket = dir.path("scsi.sock");
    let stats = dir.path("stats.json");
    let disk = dir.path("disk");
    let mut child = Command::new(env!("CARGO_BIN_EXE_sqcqd"))
        .arg("--socket-path")
        .arg(&socket)
        .arg("--lun")
        .arg(format!("kind=file,path={},size=8M,create", disk.display()))
        .args(["--stop-timeout", "1", "--stats-interval", "1"])
        .arg("--stats-file")
        .arg(&stats)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path("sqcqd.log")).unwrap())
        .spawn()
        .unwrap();
    let _log = LogOnPanic(dir.path("sqcqd.log"), child.id());
    let lost = |mut child: std::process::Child| {
        let _ = child.kill();
        let _ = child.wait();
        false
    };
    wait_until("the socket", || socket.exists() && disk.exists());

    let mut g = Guest::new();
    let mut vqs = scsi_vqs();
    let fe = connect_with(&socket, &g, &mut vqs, false, 0);
    clear_unit_attention(&mut vqs[RQ], &mut g, 0);
    let mut lock = InodeLock::hold(&disk);
    align_data_out(&mut g);
    submit(
        &mut vqs[RQ],
        &mut g,
        lun_field(0, 0),
        &write10(0, 8),
        &[0xe6; LEN as usize],
        0,
    );
    vqs[RQ].kick(&g);
    let in_flight_by = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let s = std::fs::read_to_string(&stats).unwrap_or_default();
        if s.replace([' ', '\n'], "").contains("\"in_flight\":1") {
            break;
        }
        if vqs[RQ].used_idx(&g) != vqs[RQ].last_used {
            lost_lock(&lock);
            return lost(child);
        }
        assert!(
            std::time::Instant::now() < in_flight_by,
            "not in flight: {s}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // GET_VRING_BASE: no answer while the write runs. The worker waits
    // for it past the deadline and past the grace after the cancel
    // (30 s); then the daemon ends the process.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(vhost::VhostBackend::get_vring_base(&fe, RQ).map_err(|e| e.to_string()));
    });
    let log = dir.path("sqcqd.log");
    let ending = std::time::Instant::now() + Duration::from_secs(90);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("ending the process")
    {
        assert!(
            std::time::Instant::now() < ending,
            "the process did not end"
        );
        if let Ok(answer) = rx.try_recv() {
            // Answered: only right if the write completed after all.
            assert!(answer.is_ok(), "{answer:?}");
            assert_ne!(
                vqs[RQ].used_idx(&g),
                vqs[RQ].last_used,
                "answered unfinished"
            );
            return lost(child);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The kernel itself holds the exit until the io-wq write is done
    // (io_uring cancels and waits for a task's requests as it exits),
    // so the memory stays mapped until then: let the write go.
    assert_eq!(vqs[RQ].used_idx(&g), vqs[RQ].last_used, "nothing published");
    lock.release();
    let answer = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the socket did not close");
    assert!(answer.is_err(), "GET_VRING_BASE answered: {answer:?}");
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGABRT), "{status:?}");
    true
}
