//! In-flight tracking across a reconnect (VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD)
//! and the doorbells after a restart (spec section 8).
//!
//! These drive the daemon with hand-made rings and hand-made in-flight
//! records: the state a daemon killed at a chosen moment leaves behind,
//! written exactly, so that what the next connection does with it can be
//! checked exactly (which requests are resubmitted, in which order, that
//! none runs twice). The end-to-end restart, with a real `kill -9` under
//! load, is in `sqcq-bench`'s tests.

mod common;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

use common::raw_ring::*;
use common::*;
use sqcq_protocol::NEED_WAKEUP;
use sqcq_target::runtime::metrics::QueueSnapshot;
use vhost::vhost_user::message::{VhostUserInflight, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};

/// Vring index of the first request queue.
const RQ: usize = 2;
/// The same, as the metrics name it.
const RQ_VQ: u16 = 2;
/// libvhost-user's per-queue region size for queues of QUEUE_SIZE.
fn region_size() -> u64 {
    (16 * u64::from(QUEUE_SIZE) + 2).div_ceil(64) * 64
}

/// The in-flight area as the frontend keeps it.
struct Area {
    info: VhostUserInflight,
    file: File,
}

impl Area {
    fn at(&self, vq: usize, off: u64) -> u64 {
        vq as u64 * region_size() + off
    }
    fn u16(&self, vq: usize, off: u64) -> u16 {
        let mut b = [0u8; 2];
        self.file.read_exact_at(&mut b, self.at(vq, off)).unwrap();
        u16::from_le_bytes(b)
    }
    fn version(&self, vq: usize) -> u16 {
        self.u16(vq, 8)
    }
    fn used_idx(&self, vq: usize) -> u16 {
        self.u16(vq, 14)
    }
    fn in_flight(&self, vq: usize, head: u16) -> bool {
        let mut b = [0u8; 1];
        self.file
            .read_exact_at(&mut b, self.at(vq, 16 + 16 * u64::from(head)))
            .unwrap();
        b[0] != 0
    }
    /// Records `head` in flight with `counter`, as the daemon does when
    /// it takes a request.
    fn record(&self, vq: usize, head: u16, counter: u64) {
        let d = self.at(vq, 16 + 16 * u64::from(head));
        self.file
            .write_all_at(&counter.to_le_bytes(), d + 8)
            .unwrap();
        self.file.write_all_at(&[1], d).unwrap();
    }
}

/// Connects with in-flight tracking; `area` is handed back if given
/// (SET_INFLIGHT_FD only, as QEMU reconnects), else created (GET, then
/// SET, as QEMU starts). Sets up the rings in `vqs` from scratch.
fn connect_tracked(
    socket: &std::path::Path,
    g: &Guest,
    vqs: &mut [Vq],
    extra: u64,
    area: Option<&Area>,
) -> (Frontend, Area) {
    connect_tracked_with(socket, g, vqs, extra, area, false)
}

/// [`connect_tracked`], with VIRTIO_RING_F_EVENT_IDX if `event_idx`.
fn connect_tracked_with(
    socket: &std::path::Path,
    g: &Guest,
    vqs: &mut [Vq],
    extra: u64,
    area: Option<&Area>,
    event_idx: bool,
) -> (Frontend, Area) {
    let mut made = None;
    let fe = connect_full(
        socket,
        g,
        vqs,
        event_idx,
        (1 << 1) | (1 << 2) | extra,
        VhostUserProtocolFeatures::INFLIGHT_SHMFD,
        &mut |fe| {
            let (info, file) = match area {
                Some(a) => (a.info, a.file.try_clone().unwrap()),
                None => fe
                    .get_inflight_fd(&VhostUserInflight::new(0, 0, 4, QUEUE_SIZE))
                    .unwrap(),
            };
            fe.set_inflight_fd(&info, file.as_raw_fd()).unwrap();
            made = Some(Area { info, file });
        },
    );
    (fe, made.unwrap())
}

/// Vring `vq`'s figures in the daemon's first device.
fn snapshot(d: &sqcq_target::Daemon, vq: u16) -> Option<QueueSnapshot> {
    d.device(0)
        .unwrap()
        .info
        .metrics
        .queue(vq)
        .and_then(|m| m.snapshot(0, vq))
}

fn queue_running(d: &sqcq_target::Daemon, vq: u16) -> bool {
    snapshot(d, vq).is_some_and(|s| s.running)
}

fn resubmitted(d: &sqcq_target::Daemon, vq: u16) -> u64 {
    snapshot(d, vq).map_or(0, |s| s.resubmitted)
}

#[test]
fn requests_recorded_in_flight_are_resubmitted_in_their_order_and_once() {
    let dir = TempDir::new("restart-resubmit");
    let (daemon, socket) = start(&dir, 1);
    let mut g = Guest::new();
    let mut vqs = vqs();
    let (fe, area) = connect_tracked(&socket, &g, &mut vqs, 0, None);
    assert_eq!(area.info.num_queues, 4);
    assert_eq!(area.info.mmap_size, 4 * region_size());
    let rq = &mut vqs[RQ];
    clear_unit_attention(rq, &mut g, 0);
    let used_before = rq.used_idx(&g);
    assert_eq!(area.version(RQ), 1, "the daemon initialised its record");
    // The record catches up right after the used index it follows.
    wait_until("the record's used index", || {
        area.used_idx(RQ) == used_before
    });

    // The daemon "dies" with three writes of LBA 0 taken: the connection
    // ends, and the record says what a daemon killed then leaves.
    drop(fe);
    wait_until("the queue stopped", || !queue_running(&daemon, RQ_VQ));
    let block = |b: u8| vec![b; 512];
    let writes: Vec<Pending> = [0xaa, 0xbb, 0xcc]
        .into_iter()
        .map(|b| submit(rq, &mut g, lun_field(0, 0), &write10(0, 1), &block(b), 0))
        .collect();
    rq.publish(&g);
    // Taken in the order 0xcc, 0xaa, 0xbb: whatever the heads are, the
    // last write to run must be 0xbb.
    for (p, counter) in writes.iter().zip([11, 12, 10]) {
        area.record(RQ, p.head, counter);
    }

    // A new connection hands the area back; QEMU resumes at the used
    // index.
    let mut fe = connect_tracked(&socket, &g, &mut [], 0, Some(&area)).0;
    vqs[RQ].resume(&mut fe, &g, used_before);
    let rq = &mut vqs[RQ];
    let mut done: Vec<u16> = (0..3).map(|_| rq.wait_used(&g).0).collect();
    done.sort_unstable();
    let mut heads: Vec<u16> = writes.iter().map(|p| p.head).collect();
    heads.sort_unstable();
    assert_eq!(done, heads, "each recorded request completes");
    for p in &writes {
        let r = read_resp(&g, p.resp);
        assert_eq!((r.response, r.status), (0, 0), "no unit attention: {r:?}");
    }
    assert_eq!(resubmitted(&daemon, RQ_VQ), 3);

    // Nothing runs twice: the next request is the next completion, and
    // the available entries of the resubmitted ones are not taken again.
    let (r, data) = command(rq, &mut g, lun_field(0, 0), &read10(0, 1), &[], 512);
    assert_eq!(r.status, 0, "{r:?}");
    assert_eq!(
        data,
        block(0xbb),
        "resubmitted in the order they were taken"
    );
    // And after it, one more: its completion is the next one (`command`
    // checks the head), with nothing else published before it.
    let (r, _) = command(rq, &mut g, lun_field(0, 0), &TEST_UNIT_READY, &[], 0);
    assert_eq!(r.status, 0, "{r:?}");
    assert_eq!(rq.used_idx(&g), used_before.wrapping_add(5));
    wait_until("the record cleared", || {
        writes.iter().all(|p| !area.in_flight(RQ, p.head))
            && area.used_idx(RQ) == used_before.wrapping_add(5)
    });
}

#[test]
fn a_batch_published_but_not_cleared_is_not_resubmitted() {
    batch_published_before_a_kill("restart-batch", false);
}

/// The same state, as a daemon killed after it published the batch and
/// before it called the driver leaves it, with EVENT_IDX: the driver
/// asked for a call at the batch's used element, which no later
/// completion crosses, so the next daemon calls it once (when the
/// frontend hands it the call eventfd, as libvhost-user does); without
/// that call the driver would wait for ever.
#[test]
fn a_batch_published_but_not_signalled_is_signalled_after_a_restart() {
    batch_published_before_a_kill("restart-call", true);
}

/// Two requests taken; the first completed and its used element was
/// published, and the daemon died before it cleared the record (or
/// called the driver): the record's used index lags the ring's by one,
/// the batch list names it. The next daemon redoes only the second; with
/// `event_idx` the driver's used event names the first's element, and
/// the driver is called.
fn batch_published_before_a_kill(name: &str, event_idx: bool) {
    let dir = TempDir::new(name);
    let (daemon, socket) = start(&dir, 1);
    let mut g = Guest::new();
    let mut vqs = vqs();
    let (fe, area) = connect_tracked_with(&socket, &g, &mut vqs, 0, None, event_idx);
    clear_unit_attention(&mut vqs[RQ], &mut g, 0);
    drop(fe);
    wait_until("the queue stopped", || !queue_running(&daemon, RQ_VQ));

    let rq = &mut vqs[RQ];
    let base = rq.used_idx(&g);
    let a = submit(rq, &mut g, lun_field(0, 0), &TEST_UNIT_READY, &[], 0);
    let b = submit(rq, &mut g, lun_field(0, 0), &TEST_UNIT_READY, &[], 0);
    rq.publish(&g);
    if event_idx {
        // The driver's used event: a call when the used index passes
        // base.
        g.write(rq.avail + 4 + 2 * u64::from(rq.size), &base.to_le_bytes());
    }
    area.record(RQ, a.head, 1);
    area.record(RQ, b.head, 2);
    let slot = rq.used + 4 + 8 * u64::from(base % rq.size);
    g.write(slot, &u32::from(a.head).to_le_bytes());
    let last_batch_head = 12;
    area.file
        .write_all_at(&a.head.to_le_bytes(), area.at(RQ, last_batch_head))
        .unwrap();
    g.write(rq.used + 2, &base.wrapping_add(1).to_le_bytes());
    rq.last_used = base.wrapping_add(1);
    while rq.call.read().is_ok() {}

    let mut fe = connect_tracked_with(&socket, &g, &mut [], 0, Some(&area), event_idx).0;
    vqs[RQ].resume(&mut fe, &g, base.wrapping_add(1));
    let rq = &mut vqs[RQ];
    assert_eq!(rq.wait_used(&g).0, b.head, "only the second one comes back");
    if event_idx {
        wait_until("the driver is called", || rq.call.read().is_ok());
    }
    // The next request's completion is the next one (`command` checks
    // the head): the first was not redone.
    let (r, _) = command(rq, &mut g, lun_field(0, 0), &TEST_UNIT_READY, &[], 0);
    assert_eq!(r.status, 0, "{r:?}");
    assert_eq!(rq.used_idx(&g), base.wrapping_add(3));
    assert_eq!(resubmitted(&daemon, RQ_VQ), 1);
    wait_until("the record cleared", || {
        !area.in_flight(RQ, a.head) && !area.in_flight(RQ, b.head)
    });
}

#[test]
fn after_a_restart_a_sleeping_driver_poller_is_called_and_cq_idx_catches_up() {
    let dir = TempDir::new("restart-doorbells");
    let (daemon, socket) = start(&dir, 1);
    let mut g = Guest::new();
    let mut vqs = vqs();
    let bit42 = 1u64 << sqcq_protocol::VIRTIO_F_SQCQ_POLL;
    let (fe, area) = connect_tracked(&socket, &g, &mut vqs, bit42, None);
    let rq = &mut vqs[RQ];
    for _ in 0..2 {
        let p = submit(rq, &mut g, lun_field(0, 0), &TEST_UNIT_READY, &[], 0);
        rq.publish_sq(&g);
        assert_eq!(rq.wait_used(&g).0, p.head);
    }
    let used = rq.used_idx(&g);
    wait_until("cq.idx published", || rq.cq_idx(&g) == used);
    drop(fe);
    wait_until("the queue stopped", || !queue_running(&daemon, RQ_VQ));
    assert_ne!(
        rq.sq_flags(&g) & NEED_WAKEUP,
        0,
        "stopped: NEED_WAKEUP in sq.flags, nobody polls"
    );

    // The state a daemon killed between the used index and the CQ
    // doorbell leaves: cq.idx stale, and the driver's CQ poller asleep.
    let d = rq.doorbells();
    g.write(d.cq, &used.wrapping_sub(1).to_le_bytes());
    g.write(d.cq + 2, &NEED_WAKEUP.to_le_bytes());
    while rq.call.read().is_ok() {}
    let mut fe = connect_tracked(&socket, &g, &mut [], bit42, Some(&area)).0;
    vqs[RQ].resume(&mut fe, &g, used);
    let rq = &mut vqs[RQ];
    wait_signalled(&rq.call, "the call to the sleeping CQ poller");
    assert_eq!(rq.cq_idx(&g), used, "cq.idx caught up with used->idx");
    drop(fe);
    wait_until("the queue stopped", || !queue_running(&daemon, RQ_VQ));

    // A request the driver made available through sq.idx without a kick
    // (it saw the old device polling) is served by the next device, no
    // kick needed.
    let p = submit(rq, &mut g, lun_field(0, 0), &TEST_UNIT_READY, &[], 0);
    rq.publish(&g);
    rq.write_sq_idx(&g, rq.next_avail);
    while rq.kick.read().is_ok() {}
    let mut fe = connect_tracked(&socket, &g, &mut [], bit42, Some(&area)).0;
    vqs[RQ].resume(&mut fe, &g, used);
    assert_eq!(vqs[RQ].wait_used(&g).0, p.head);
    drop(fe);
}
