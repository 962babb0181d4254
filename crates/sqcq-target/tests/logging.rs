//! Dirty logging for live migration (VHOST_F_LOG_ALL with
//! VHOST_USER_PROTOCOL_F_LOG_SHMFD): while the frontend asks for it, every
//! guest page the device writes is marked in the frontend's log, and
//! nothing else is.

mod common;

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;

use common::raw_ring::*;
use common::*;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::{VhostBackend, VhostUserDirtyLogRegion};

const RQ: usize = 2;
/// One log byte per 8 guest pages: 4096 bytes cover 128 MiB.
const LOG_LEN: u64 = 4096;

fn memfd(len: u64) -> File {
    // SAFETY: a valid NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c"log-test".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: a new descriptor owned by nobody else.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(len).unwrap();
    f
}

/// Connects as a SCSI frontend with LOG_SHMFD; the vrings set up.
fn connect_logging(
    socket: &std::path::Path,
    g: &Guest,
    vqs: &mut [Vq],
) -> vhost::vhost_user::Frontend {
    connect_full(
        socket,
        g,
        vqs,
        false,
        (1 << 1) | (1 << 2),
        VhostUserProtocolFeatures::LOG_SHMFD,
        &mut |_| {},
    )
}

/// Submits a READ(10) of LBA 0 and kicks.
fn read_lba0(vq: &mut Vq, g: &mut Guest) -> Pending {
    let p = submit(vq, g, lun_field(0, 0), &read10(0, 1), &[], 512);
    vq.kick(g);
    p
}

/// Whether guest page of `gpa` is marked in `log`.
fn marked(log: &File, gpa: u64) -> bool {
    let page = gpa / 4096;
    let mut b = [0u8; 1];
    log.read_exact_at(&mut b, page / 8).unwrap();
    b[0] & (1 << (page % 8)) != 0
}

fn clear(log: &File) {
    log.write_all_at(&[0u8; 4096], 0).unwrap();
}

/// SET_FEATURES, then a round trip (GET_FEATURES) so that the daemon has
/// applied it before the next request: without REPLY_ACK the message has
/// no answer. QEMU does the same when the change turns logging on or off
/// (`vhost_user_set_features`, `enforce_reply`).
fn set_features_applied(fe: &vhost::vhost_user::Frontend, features: u64) {
    fe.set_features(features).unwrap();
    fe.get_features().unwrap();
}

#[test]
fn while_logging_the_pages_the_device_writes_are_marked_and_only_then() {
    let dir = TempDir::new("logging");
    let (_daemon, socket) = start(&dir, 1);
    let mut g = Guest::new();
    let mut vqs = vqs();
    let features = (1u64 << 32)
        | (1 << 28)
        | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
        | (1 << 1)
        | (1 << 2);
    let fe = connect_logging(&socket, &g, &mut vqs);
    clear_unit_attention(&mut vqs[RQ], &mut g, 0);
    // Data for LBA 0 on the LUN.
    let block: Vec<u8> = (0..=255u8).cycle().step_by(7).take(512).collect();
    let (r, _) = command(
        &mut vqs[RQ],
        &mut g,
        lun_field(0, 0),
        &write10(0, 1),
        &block,
        0,
    );
    assert_eq!(r.status, 0);

    // Migration starts: the log, then VHOST_F_LOG_ALL.
    let log = memfd(LOG_LEN);
    fe.set_log_base(
        0,
        Some(VhostUserDirtyLogRegion {
            mmap_size: LOG_LEN,
            mmap_offset: 0,
            mmap_handle: log.as_raw_fd(),
        }),
    )
    .unwrap();
    set_features_applied(&fe, features | VhostUserVirtioFeatures::LOG_ALL.bits());
    // A read: its data page, its response page and the used ring are
    // written by the device.
    let untouched = GUEST_SIZE - 4096;
    let p = read_lba0(&mut vqs[RQ], &mut g);
    assert_eq!(vqs[RQ].wait_used(&g).0, p.head);
    assert_eq!(g.read(p.data_in, 512), block);
    assert!(marked(&log, p.data_in), "data-in page");
    assert!(marked(&log, p.resp), "response page");
    // Marked right after the used index store the driver saw.
    wait_until("used ring page marked", || marked(&log, vqs[RQ].used));
    assert!(!marked(&log, untouched), "a page nobody wrote");
    assert!(
        !marked(&log, vqs[RQ].desc),
        "the descriptor table is only read"
    );

    // Migration ends: no more marks.
    set_features_applied(&fe, features);
    clear(&log);
    let (r, data) = command(
        &mut vqs[RQ],
        &mut g,
        lun_field(0, 0),
        &read10(0, 1),
        &[],
        512,
    );
    assert_eq!((r.status, data), (0, block));
    assert!(!marked(&log, vqs[RQ].used), "logging is off");

    // Logging again, with a log eventfd (SET_LOG_FD), then the queue
    // stops (GET_VRING_BASE, the source's last step): what it completed
    // by then is in the log, and the eventfd says so.
    let log_fd = vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK).unwrap();
    fe.set_log_fd(log_fd.as_raw_fd()).unwrap();
    set_features_applied(&fe, features | VhostUserVirtioFeatures::LOG_ALL.bits());
    clear(&log);
    let before = vqs[RQ].used_idx(&g);
    let p = read_lba0(&mut vqs[RQ], &mut g);
    // The stop may come before the worker saw the kick (the request then
    // stays on the ring for the next device) or after it took the
    // request: then it answers only once the request is completed,
    // published and logged.
    let base = fe.get_vring_base(RQ).unwrap();
    let used = vqs[RQ].used_idx(&g);
    assert_eq!(base, u32::from(used), "nothing taken is left in flight");
    if used != before {
        assert!(marked(&log, p.data_in) && marked(&log, vqs[RQ].used));
    }
    assert!(log_fd.read().is_ok(), "the log eventfd was signalled");
}

#[test]
fn a_log_that_cannot_be_mapped_ends_the_connection() {
    let dir = TempDir::new("logging-bad");
    let (daemon, socket) = start(&dir, 1);
    let small = memfd(100);
    // Beyond the file, empty, across the file's end, too large, and too
    // small for the guest: 8 bytes cover 256 KiB of its 8 MiB.
    for (size, offset) in [(LOG_LEN, 0), (0, 0), (16, 4095), (1 << 40, 0), (8, 0)] {
        let g = Guest::new();
        let mut vqs = vqs();
        let fe = connect_logging(&socket, &g, &mut vqs);
        let failed = counter(&daemon, "failed_messages");
        // No reply comes: the daemon hangs up instead (the frontend sees
        // the socket close rather than wait for ever).
        let r = fe.set_log_base(
            0,
            Some(VhostUserDirtyLogRegion {
                mmap_size: size,
                mmap_offset: offset,
                mmap_handle: small.as_raw_fd(),
            }),
        );
        assert!(r.is_err(), "log {size}@{offset} refused");
        assert_eq!(counter(&daemon, "failed_messages"), failed + 1);
    }
}

/// The log that covers exactly the test guest's 8 MiB.
const GUEST_LOG: u64 = GUEST_SIZE / 4096 / 8;

fn set_log(fe: &vhost::vhost_user::Frontend, log: &File, size: u64) -> vhost::Result<()> {
    fe.set_log_base(
        0,
        Some(VhostUserDirtyLogRegion {
            mmap_size: size,
            mmap_offset: 0,
            mmap_handle: log.as_raw_fd(),
        }),
    )
}

#[test]
fn memory_grown_past_the_log_is_refused_while_logging_and_when_logging_starts() {
    let dir = TempDir::new("logging-grown");
    let (daemon, socket) = start(&dir, 1);
    let features = (1u64 << 32)
        | (1 << 28)
        | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
        | (1 << 1)
        | (1 << 2);
    let log = memfd(LOG_LEN);
    // The same 8 MiB, moved up by 8 MiB: a log of 256 bytes misses it.
    let moved = |g: &Guest| {
        let mut r = g.region();
        r.guest_phys_addr = GUEST_SIZE;
        r
    };

    // While logging: SET_MEM_TABLE ends the connection.
    let g = Guest::new();
    let mut rings = vqs();
    let fe = connect_logging(&socket, &g, &mut rings);
    set_log(&fe, &log, GUEST_LOG).unwrap();
    fe.set_features(features | VhostUserVirtioFeatures::LOG_ALL.bits())
        .unwrap();
    let failed = counter(&daemon, "failed_messages");
    assert!(
        fe.set_mem_table(&[moved(&g)]).is_err(),
        "memory past the log"
    );
    // The refusal is counted as the connection ends, after the reply.
    wait_until("the connection ended", || {
        counter(&daemon, "failed_messages") == failed + 1
    });
    drop(fe);

    // Logging off, the table grows, then logging starts: SET_FEATURES
    // ends the connection.
    let g = Guest::new();
    let mut rings = vqs();
    let fe = connect_logging(&socket, &g, &mut rings);
    set_log(&fe, &log, GUEST_LOG).unwrap();
    fe.set_mem_table(&[moved(&g)]).unwrap();
    assert!(
        fe.set_features(features | VhostUserVirtioFeatures::LOG_ALL.bits())
            .is_err(),
        "logging into a log that misses memory"
    );
    wait_until("the connection ended", || {
        counter(&daemon, "failed_messages") == failed + 2
    });
}
