//! LUNs added, resized and removed through the admin socket while a
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

use common::*;
use sqcq_target::Daemon;
use sqcq_target::admin::request;
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
        }],
        poll: Default::default(),
        admin_socket: Some(admin.clone()),
        seccomp: Default::default(),
    };
    config.validate().unwrap();
    (Daemon::start(&config).unwrap(), socket, admin)
}

/// A command, retried while it reports unit attentions, which are
/// collected as (ASC, ASCQ) in `uas`.
fn command_past_ua(
    vq: &mut Vq,
    g: &mut Guest,
    lun: u16,
    cdb: &[u8],
    out: &[u8],
    din: u32,
    uas: &mut Vec<(u8, u8)>,
) -> (Resp, Vec<u8>) {
    for _ in 0..4 {
        let (r, d) = command(vq, g, lun_field(0, lun), cdb, out, din);
        if r.status != 2 || r.sense_key() != 6 {
            return (r, d);
        }
        uas.push((r.asc(), r.sense[13]));
    }
    panic!("unit attentions without end: {uas:?}");
}

/// Writes and reads back one block of LUN `lun`; returns the unit
/// attentions seen.
fn write_read(vq: &mut Vq, g: &mut Guest, lun: u16, lba: u32, seed: u8) -> Vec<(u8, u8)> {
    let mut uas = Vec::new();
    let block: Vec<u8> = (0..512).map(|i| (i as u8).wrapping_mul(seed)).collect();
    let (r, _) = command_past_ua(vq, g, lun, &write10(lba, 1), &block, 0, &mut uas);
    assert_eq!((r.response, r.status), (0, 0), "WRITE LUN {lun}: {r:?}");
    let (r, data) = command_past_ua(vq, g, lun, &read10(lba, 1), &[], 512, &mut uas);
    assert_eq!((r.response, r.status), (0, 0), "READ LUN {lun}: {r:?}");
    assert_eq!(data, block, "LUN {lun} LBA {lba}");
    uas
}

/// Sends an admin command from another thread while this one keeps I/O
/// going on LUN 0 (until one round after the reply); returns the reply,
/// how many I/O rounds ran and the unit attentions LUN 0 reported.
fn admin_during_io(
    admin: &Path,
    line: &str,
    vq: &mut Vq,
    g: &mut Guest,
) -> (String, u32, Vec<(u8, u8)>) {
    let (path, line) = (admin.to_owned(), line.to_owned());
    let h = thread::spawn(move || request(&path, &line).unwrap());
    let mut n = 0u32;
    let mut uas = Vec::new();
    loop {
        let done = h.is_finished();
        uas.extend(write_read(vq, g, 0, n % 64, (n % 250) as u8 + 1));
        n += 1;
        if done {
            break;
        }
    }
    (h.join().unwrap(), n, uas)
}

/// TEST UNIT READY until no unit attention is left.
fn clear_all_unit_attentions(vq: &mut Vq, g: &mut Guest, lun: u16) {
    let mut uas = Vec::new();
    let (r, _) = command_past_ua(vq, g, lun, &TEST_UNIT_READY, &[], 0, &mut uas);
    assert_eq!((r.response, r.status), (0, 0), "{r:?}");
}

/// Waits for the next event and returns its 16 bytes.
fn next_event(evq: &mut Vq, g: &Guest, bufs: &[u64]) -> [u8; 16] {
    let (head, len) = evq.wait_used(g);
    assert_eq!(len, 16);
    let at = bufs[usize::from(head)];
    g.read(at, 16).try_into().unwrap()
}

fn event(kind: u32, lun: u16, reason: u32) -> [u8; 16] {
    let mut e = [0u8; 16];
    e[0..4].copy_from_slice(&kind.to_le_bytes());
    e[4..12].copy_from_slice(&[1, 0, 0, lun as u8, 0, 0, 0, 0]);
    e[12..16].copy_from_slice(&reason.to_le_bytes());
    e
}

fn report_luns(vq: &mut Vq, g: &mut Guest) -> Vec<u16> {
    let mut cdb = [0u8; 12];
    cdb[0] = 0xa0;
    cdb[6..10].copy_from_slice(&1024u32.to_be_bytes());
    let (r, data) = command(vq, g, lun_field(0, 0), &cdb, &[], 1024);
    assert_eq!((r.response, r.status), (0, 0), "REPORT LUNS: {r:?}");
    let n = u32::from_be_bytes(data[0..4].try_into().unwrap()) as usize / 8;
    (0..n)
        .map(|i| {
            let e = &data[8 + 8 * i..16 + 8 * i];
            u16::from_be_bytes([e[0] & 0x3f, e[1]])
        })
        .collect()
}

/// READ CAPACITY(16): (last LBA, block size).
fn read_capacity16(vq: &mut Vq, g: &mut Guest, lun: u16) -> (u64, u32) {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x9e;
    cdb[1] = 0x10;
    cdb[10..14].copy_from_slice(&32u32.to_be_bytes());
    let (r, data) = command(vq, g, lun_field(0, lun), &cdb, &[], 32);
    assert_eq!((r.response, r.status), (0, 0), "READ CAPACITY(16): {r:?}");
    (
        u64::from_be_bytes(data[0..8].try_into().unwrap()),
        u32::from_be_bytes(data[8..12].try_into().unwrap()),
    )
}

#[test]
fn luns_come_change_and_go_while_another_lun_serves_io() {
    let dir = TempDir::new("hotplug");
    let (daemon, socket, admin) = start_admin(&dir, vec![lun(BackstoreKind::Ram, 8 << 20)]);
    let mut g = Guest::new();
    let mut qs = vqs();
    let _fe = connect(&socket, &g, &mut qs, true);
    let (head, rest) = qs.split_at_mut(2);
    let evq = &mut head[1];
    let (rq0, rq1) = rest.split_at_mut(1);
    let (rq0, rq1) = (&mut rq0[0], &mut rq1[0]);
    clear_unit_attention(rq0, &mut g, 0);
    clear_unit_attention(rq1, &mut g, 0);
    // Event buffers, indexed by head.
    let mut bufs = vec![0u64; usize::from(QUEUE_SIZE)];
    for _ in 0..8 {
        let b = g.alloc(16);
        let h = evq.add(&g, &[(b, 16, true)]);
        bufs[usize::from(h)] = b;
    }
    evq.kick(&g);

    // Add: a RESCAN event, REPORT LUNS shows it, I/O to it works, and LUN
    // 0 (busy meanwhile) reports REPORTED LUNS DATA HAS CHANGED once.
    let (reply, ios, uas) = admin_during_io(
        &admin,
        "lun add device=0 lun=1 kind=ram,size=4M",
        rq0,
        &mut g,
    );
    assert_eq!(reply, "ok device=0 lun=1 added");
    assert!(ios > 1, "LUN 0 served I/O meanwhile");
    assert_eq!(uas, [(0x3f, 0x0e)], "REPORTED LUNS DATA HAS CHANGED, once");
    assert_eq!(
        next_event(evq, &g, &bufs),
        event(1, 1, 1),
        "TRANSPORT_RESET/RESCAN"
    );
    assert_eq!(report_luns(rq1, &mut g), [0, 1]);
    let (r, _) = command(rq1, &mut g, lun_field(0, 1), &TEST_UNIT_READY, &[], 0);
    assert_eq!(
        (r.status, r.sense_key(), r.asc()),
        (2, 6, 0x29),
        "POWER ON: {r:?}"
    );
    write_read(rq1, &mut g, 1, 7, 3);
    assert_eq!(read_capacity16(rq1, &mut g, 1), (8191, 512));

    // Resize: PARAM_CHANGE with ASC/ASCQ 2Ah/09h, CAPACITY DATA HAS
    // CHANGED, then the new capacity, and I/O past the old end works.
    let (reply, _, uas) = admin_during_io(&admin, "lun resize device=0 lun=1 size=8M", rq0, &mut g);
    assert!(uas.is_empty(), "LUN 0 is not concerned: {uas:?}");
    assert_eq!(reply, "ok device=0 lun=1 blocks=16384");
    assert_eq!(
        next_event(evq, &g, &bufs),
        event(3, 1, 0x092a),
        "PARAM_CHANGE"
    );
    let (r, _) = command(rq1, &mut g, lun_field(0, 1), &TEST_UNIT_READY, &[], 0);
    assert_eq!((r.status, r.sense_key(), r.asc()), (2, 6, 0x2a), "{r:?}");
    assert_eq!(r.sense[13], 0x09, "CAPACITY DATA HAS CHANGED");
    assert_eq!(read_capacity16(rq1, &mut g, 1), (16383, 512));
    write_read(rq1, &mut g, 1, 12000, 5);

    // Remove with requests to it in flight: each completes (done, or
    // answered as absent), then REMOVED, then the LUN is absent.
    let pending: Vec<Pending> = (0..8)
        .map(|i| submit(rq1, &mut g, lun_field(0, 1), &read10(i, 1), &[], 512))
        .collect();
    rq1.kick(&g);
    let (reply, _, uas) = admin_during_io(&admin, "lun remove device=0 lun=1", rq0, &mut g);
    assert_eq!(uas, [(0x3f, 0x0e)], "REPORTED LUNS DATA HAS CHANGED again");
    assert_eq!(reply, "ok device=0 lun=1 removed");
    for _ in &pending {
        rq1.wait_used(&g);
    }
    for p in &pending {
        let r = read_resp(&g, p.resp);
        let absent = r.status == 2 && r.sense_key() == 5 && r.asc() == 0x25;
        assert!(r.status == 0 || absent, "{r:?}");
    }
    assert_eq!(
        next_event(evq, &g, &bufs),
        event(1, 1, 2),
        "TRANSPORT_RESET/REMOVED"
    );
    let (r, _) = command(rq1, &mut g, lun_field(0, 1), &TEST_UNIT_READY, &[], 0);
    assert_eq!(
        (r.status, r.sense_key(), r.asc()),
        (2, 5, 0x25),
        "absent: {r:?}"
    );
    let (r, data) = command(rq1, &mut g, lun_field(0, 1), &inquiry(36), &[], 36);
    assert_eq!((r.status, data[0]), (0, 0x7f), "peripheral qualifier 3");
    assert_eq!(report_luns(rq1, &mut g), [0]);
    write_read(rq0, &mut g, 0, 3, 9);

    // Refusals.
    let refused = |line: &str| {
        let reply = request(&admin, line).unwrap();
        assert!(reply.starts_with("error "), "{line}: {reply}");
    };
    refused("lun add device=0 lun=0 kind=ram,size=1M");
    refused("lun remove device=0 lun=1");
    refused("lun resize device=0 lun=0 size=1000");
    refused("lun add device=1 lun=2 kind=ram,size=1M");
    refused("format c:");

    let stats = request(&admin, "stats").unwrap();
    assert!(
        stats.starts_with("ok device=0 lun0=16384x512 vq2="),
        "{stats}"
    );
    assert!(!stats.contains("lun1="), "{stats}");
    daemon.shutdown();
    assert!(!admin.exists(), "the admin socket is removed on exit");
}

#[test]
fn no_event_without_hotplug_and_change() {
    let dir = TempDir::new("hotplug-nofeat");
    let (daemon, socket, admin) = start_admin(&dir, vec![lun(BackstoreKind::Null, 1 << 20)]);
    let mut g = Guest::new();
    let mut qs = vqs();
    let mut fe = connect(&socket, &g, &mut qs, false);
    // Renegotiate without HOTPLUG and CHANGE (VERSION_1 and protocol
    // features only).
    use vhost::VhostBackend;
    use vhost::vhost_user::VhostUserFrontend;
    fe.reset_device().unwrap();
    fe.set_features((1 << 32) | (1 << 30)).unwrap();
    for vq in qs.iter_mut() {
        vq.setup(&mut fe, &g);
    }
    let b = g.alloc(16);
    qs[1].add(&g, &[(b, 16, true)]);
    qs[1].kick(&g);
    assert!(
        request(&admin, "lun add lun=5 kind=null,size=1M")
            .unwrap()
            .starts_with("ok")
    );
    assert!(
        request(&admin, "lun resize lun=5 size=2M")
            .unwrap()
            .starts_with("ok")
    );
    assert!(
        request(&admin, "lun remove lun=5")
            .unwrap()
            .starts_with("ok")
    );
    // Events are delivered by the control thread after the reply; give it
    // time (a late event would only make this test pass wrongly).
    clear_all_unit_attentions(&mut qs[2], &mut g, 0);
    thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(qs[1].used_idx(&g), 0, "no event without the features");
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
    let mut g = Guest::new();
    let mut qs = vqs();
    let _fe = connect(&socket, &g, &mut qs, true);
    let rq = &mut qs[2];
    clear_unit_attention(rq, &mut g, 0);

    let pattern: Vec<u8> = (0..8 * 512).map(|i| (i % 253) as u8).collect();
    let mut fua = write10(16, 8);
    fua[1] = 0x08;
    let (r, _) = command(rq, &mut g, lun_field(0, 0), &fua, &pattern, 0);
    assert_eq!((r.response, r.status), (0, 0), "WRITE(10) FUA: {r:?}");
    let mut write16 = [0u8; 16];
    write16[0] = 0x8a;
    write16[1] = 0x08;
    write16[2..10].copy_from_slice(&100u64.to_be_bytes());
    write16[10..14].copy_from_slice(&8u32.to_be_bytes());
    let (r, _) = command(rq, &mut g, lun_field(0, 0), &write16, &pattern, 0);
    assert_eq!((r.response, r.status), (0, 0), "WRITE(16) FUA: {r:?}");
    let (r, data) = command(rq, &mut g, lun_field(0, 0), &read10(16, 8), &[], 4096);
    assert_eq!((r.response, r.status, r.resid), (0, 0, 0), "{r:?}");
    assert_eq!(data, pattern);
    let sync10 = [0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let (r, _) = command(rq, &mut g, lun_field(0, 0), &sync10, &[], 0);
    assert_eq!(
        (r.response, r.status),
        (0, 0),
        "SYNCHRONIZE CACHE(10): {r:?}"
    );
    let mut sync16 = [0u8; 16];
    sync16[0] = 0x91;
    let (r, _) = command(rq, &mut g, lun_field(0, 0), &sync16, &[], 0);
    assert_eq!(
        (r.response, r.status),
        (0, 0),
        "SYNCHRONIZE CACHE(16): {r:?}"
    );
    // The bytes are in the file.
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(&on_disk[16 * 512..24 * 512], &pattern[..]);
    assert_eq!(&on_disk[100 * 512..108 * 512], &pattern[..]);

    // Grow: the file grows, the LUN reports it after the unit attention,
    // the new blocks take I/O.
    assert_eq!(
        request(&admin, "lun resize lun=0 size=8M").unwrap(),
        "ok device=0 lun=0 blocks=16384"
    );
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 8 << 20);
    let (r, _) = command(rq, &mut g, lun_field(0, 0), &TEST_UNIT_READY, &[], 0);
    assert_eq!((r.status, r.sense_key(), r.asc()), (2, 6, 0x2a), "{r:?}");
    assert_eq!(read_capacity16(rq, &mut g, 0), (16383, 512));
    write_read(rq, &mut g, 0, 16000, 7);
    let reply = request(&admin, "lun resize lun=0 size=4M").unwrap();
    assert!(
        reply.starts_with("error "),
        "a file LUN does not shrink: {reply}"
    );
    daemon.shutdown();
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn sqcqd_admin_client_talks_to_the_binary() {
    use std::process::{Command, Stdio};
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
    let client = |args: &[&str]| {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let out = Command::new(env!("CARGO_BIN_EXE_sqcqd"))
                .arg("admin")
                .arg("--admin-socket")
                .arg(&admin)
                .args(args)
                .output()
                .unwrap();
            // 2: the socket is not there yet.
            if out.status.code() != Some(2) || std::time::Instant::now() > deadline {
                return (
                    out.status.success(),
                    String::from_utf8_lossy(&out.stdout).into_owned(),
                );
            }
            thread::sleep(std::time::Duration::from_millis(10));
        }
    };
    assert_eq!(
        client(&["lun", "add", "lun=1", "kind=ram,size=2M"]),
        (true, "ok device=0 lun=1 added\n".to_owned())
    );
    let (ok, stats) = client(&["stats"]);
    assert!(ok && stats.contains(" lun1=4096x512 "), "{stats}");
    let (ok, reply) = client(&["lun", "remove", "lun=7"]);
    assert!(!ok && reply.starts_with("error no LUN 7"), "{reply}");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&admin).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    // SAFETY: kill() with a valid pid and signal number.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    assert!(child.wait().unwrap().success());
    assert!(!admin.exists());
}

/// `fault break` (fault injection): the queue breaks at its next request,
/// which it does not take: its error eventfd is signalled, the other
/// queue goes on, a second `fault break` finds nothing to arm, and a
/// device reset brings the queue back with the error eventfd of the first
/// start.
#[test]
fn fault_break_stops_a_queue_at_its_next_request_until_the_device_is_reset() {
    let dir = TempDir::new("fault-break");
    let (daemon, socket, admin) = start_admin(&dir, vec![lun(BackstoreKind::Ram, 1 << 20)]);
    let mut g = Guest::new();
    let mut qs = vqs();
    let mut fe = connect(&socket, &g, &mut qs, true);
    for q in [2, 3] {
        clear_unit_attention(&mut qs[q], &mut g, 0);
    }
    let _ = qs[2].err.read();
    let _ = qs[3].err.read();

    let reply = request(&admin, "fault break device=0 vq=2").unwrap();
    assert_eq!(reply, "ok device=0 armed vq=2");
    assert!(
        request(&admin, "fault break device=0 vq=2")
            .unwrap()
            .starts_with("error "),
        "armed already"
    );
    // Armed, the queue breaks at the next request and leaves it untaken.
    submit(&mut qs[2], &mut g, lun_field(0, 0), &inquiry(36), &[], 36);
    qs[2].kick(&g);
    wait_signalled(&qs[2].err, "the broken queue's error eventfd");
    assert!(qs[3].err.read().is_err(), "the other queue is not broken");
    let stats = request(&admin, "stats").unwrap();
    assert!(stats.contains(" broken_rings=1"), "{stats}");
    let (r, _) = command(&mut qs[3], &mut g, lun_field(0, 0), &inquiry(36), &[], 36);
    assert_eq!((r.response, r.status), (0, 0), "{r:?}");
    assert!(
        request(&admin, "fault break device=0 vq=2")
            .unwrap()
            .starts_with("error "),
        "broken already"
    );
    assert!(
        request(&admin, "fault break device=1")
            .unwrap()
            .starts_with("error no device 1")
    );
    assert_eq!(
        qs[2].used_idx(&g),
        qs[2].last_used,
        "the request was not taken"
    );

    // A reset and a new start cycle, as QEMU makes them (no second
    // SET_VRING_ERR), serve the queue again.
    reset_and_restart(&mut fe, &g, &mut qs);
    clear_unit_attention(&mut qs[2], &mut g, 0);
    let (r, _) = command(&mut qs[2], &mut g, lun_field(0, 0), &inquiry(36), &[], 36);
    assert_eq!((r.response, r.status), (0, 0), "{r:?}");
    // Every queue armed; both break at their next request, and the error
    // eventfds of the first start still report it.
    assert_eq!(
        request(&admin, "fault break device=0").unwrap(),
        "ok device=0 armed vq=2,3"
    );
    for q in [2, 3] {
        submit(&mut qs[q], &mut g, lun_field(0, 0), &inquiry(36), &[], 36);
        qs[q].kick(&g);
        wait_signalled(
            &qs[q].err,
            &format!("vq {q}: error eventfd after the reset"),
        );
    }
    daemon.shutdown();
}
