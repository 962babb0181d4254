//! The virtio-blk request queue against virtio-queue's device side over
//! the same driver memory: every request type byte-exact on the wire, the
//! statuses, a device that answers wrongly (no status, an unknown one, a
//! used length that cannot be right), requests the queue must refuse, and
//! completions in every notification mode.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

use super::*;
use crate::notify::{NotifyError, NotifyMode};
use crate::slots::QueueFailure;
use crate::vring::{DeviceError, QueueConfig};
use crate::{Buffer, DriverMemory};

const SIZE: u16 = 16;
/// Generous: only reached when a test is about to fail.
const TIMEOUT: Duration = Duration::from_secs(5);

struct Rig {
    mem: DriverMemory,
    queue: BlkQueue,
    device: Queue,
    data: GuestAddress,
    _poll: Option<crate::sqcq::PollGroup>,
}

fn rig_with(mode: NotifyMode, hangup: Option<OwnedFd>, timeout: Duration) -> Rig {
    let config = QueueConfig {
        size: SIZE,
        event_idx: true,
        indirect_max: 4,
        packed: false,
    };
    let mut mem = DriverMemory::new(4 << 20).unwrap();
    let (vq, poll, device) =
        crate::test_rig::queue_pair(&mut mem, 0, config, mode, hangup, timeout);
    let queue = BlkQueue::new(&mut mem, vq).unwrap();
    let data = mem.alloc(4096 * 4, 4096).unwrap();
    Rig {
        mem,
        queue,
        device,
        data,
        _poll: poll,
    }
}

fn rig(mode: NotifyMode) -> Rig {
    rig_with(mode, None, TIMEOUT)
}

/// What the device saw of a request.
#[derive(Debug)]
struct Seen {
    head: u16,
    /// Device-readable buffers' bytes, in order.
    readable: Vec<Vec<u8>>,
    /// Where they were: (address, length).
    readable_at: Vec<(GuestAddress, u32)>,
    /// Device-writable buffers: (address, length).
    writable: Vec<(GuestAddress, u32)>,
}

impl Rig {
    fn data(&self, len: u32) -> [Buffer; 1] {
        [Buffer::new(self.data, len)]
    }

    fn submit(&mut self, req: &Request<'_>, token: u64) {
        self.queue.submit(req, token).unwrap();
    }

    fn publish(&mut self) {
        self.queue.publish(|c| panic!("failed: {c:?}")).unwrap();
    }

    fn device_pop(&mut self) -> Option<Seen> {
        let gm = self.mem.guest_memory();
        let chain = self.device.pop_descriptor_chain(gm)?;
        let head = chain.head_index();
        let mut readable = Vec::new();
        let mut readable_at = Vec::new();
        let mut writable = Vec::new();
        for d in chain {
            if d.is_write_only() {
                writable.push((d.addr(), d.len()));
            } else {
                readable_at.push((d.addr(), d.len()));
                let mut bytes = vec![0; usize::try_from(d.len()).unwrap()];
                gm.read_slice(&mut bytes, d.addr()).unwrap();
                readable.push(bytes);
            }
        }
        Some(Seen {
            head,
            readable,
            readable_at,
            writable,
        })
    }

    /// Completes `seen`: fills its data buffers (all writable buffers but
    /// the last) with `fill`, writes `status` (unless `None`) into the last
    /// one and reports `len` bytes (default: everything writable).
    fn device_complete(&mut self, seen: &Seen, status: Option<u8>, fill: u8, len: Option<u32>) {
        let gm = self.mem.guest_memory();
        let (data, status_buf) = seen.writable.split_at(seen.writable.len() - 1);
        for &(addr, n) in data {
            gm.write_slice(&vec![fill; usize::try_from(n).unwrap()], addr)
                .unwrap();
        }
        if let Some(s) = status {
            gm.write_obj(s, status_buf[0].0).unwrap();
        }
        let total = seen.writable.iter().map(|w| w.1).sum();
        self.device
            .add_used(gm, seen.head, len.unwrap_or(total))
            .unwrap();
    }

    fn reap(&mut self) -> Vec<Completion> {
        let mut out = Vec::new();
        self.queue.wait_and_reap(|c| out.push(c)).unwrap();
        out
    }

    /// The device's side of a completion in `mode`: the CQ doorbell in the
    /// doorbell modes, then a call.
    fn device_notify(&self, mode: NotifyMode) {
        if mode.doorbells() {
            let mem = std::sync::Arc::new(self.mem.guest_memory().clone());
            let ring = self.queue.virtqueue().ring();
            let addrs = sqcq_protocol::RingAddrs {
                desc: ring.addresses()[0].0,
                avail: ring.addresses()[1].0,
                used: ring.addresses()[2].0,
            };
            let location = sqcq_protocol::doorbell_location(addrs, SIZE).unwrap();
            let (_, cq) = sqcq_protocol::guest_doorbells(&mem, location).unwrap();
            let used: u16 = u16::from_le(
                mem.read_obj(GuestAddress(ring.addresses()[2].0 + 2))
                    .unwrap(),
            );
            let _ = sqcq_protocol::CqProducer::new(&cq).publish(used);
        }
        self.queue.virtqueue().events().call_fd().write(1).unwrap();
    }
}

/// What the device must see of a request: type, ioprio, sector, the
/// readable buffers after the header, the writable data lengths.
type Expected = (u32, u32, u64, Vec<Vec<u8>>, Vec<u32>);

/// A device answer (status written, used length) and what the queue
/// makes of it.
type Answer = (Option<u8>, Option<u32>, Result<Done, RequestError>);

fn ok(bytes: u32) -> Result<Done, RequestError> {
    Ok(Done { bytes })
}

/// The header the device must see: type, ioprio, sector, little-endian.
fn header(kind: u32, ioprio: u32, sector: u64) -> Vec<u8> {
    let mut h = kind.to_le_bytes().to_vec();
    h.extend_from_slice(&ioprio.to_le_bytes());
    h.extend_from_slice(&sector.to_le_bytes());
    h
}

#[test]
fn every_request_type_reaches_the_device_byte_exact() {
    let mut rig = rig(NotifyMode::Notify);
    let data = rig.data(1024);
    let id = Buffer::new(GuestAddress(rig.data.0 + 8192), 20);
    let unmap = [Segment {
        sector: 0x1122_3344_5566,
        num_sectors: 8,
        flags: WRITE_ZEROES_FLAG_UNMAP,
    }];
    let discard = [
        Segment {
            sector: 16,
            num_sectors: 2,
            flags: 0,
        },
        Segment {
            sector: 64,
            num_sectors: 1,
            flags: 0,
        },
    ];
    rig.queue
        .submit_with_priority(
            &Request::Read {
                sector: 0x0102_0304_0506,
                data: &data,
            },
            7,
            1,
        )
        .unwrap();
    rig.submit(
        &Request::Write {
            sector: 9,
            data: &data,
        },
        2,
    );
    rig.submit(&Request::Flush, 3);
    rig.submit(&Request::GetId(id), 4);
    rig.submit(&Request::Discard(&discard), 5);
    rig.submit(&Request::WriteZeroes(&unmap), 6);
    rig.publish();

    let expect: [Expected; 6] = [
        (0, 7, 0x0102_0304_0506, vec![], vec![1024]),
        (1, 0, 9, vec![vec![0; 1024]], vec![]),
        (4, 0, 0, vec![], vec![]),
        (8, 0, 0, vec![], vec![20]),
        (
            11,
            0,
            0,
            vec![[discard[0].encode(), discard[1].encode()].concat()],
            vec![],
        ),
        (
            13,
            0,
            0,
            vec![vec![
                0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0, 0, 8, 0, 0, 0, 1, 0, 0, 0,
            ]],
            vec![],
        ),
    ];
    let mut seen_all = Vec::new();
    for (i, (kind, prio, sector, out, data_in)) in expect.into_iter().enumerate() {
        let seen = rig.device_pop().unwrap();
        assert_eq!(seen.readable[0], header(kind, prio, sector), "request {i}");
        assert_eq!(&seen.readable[1..], &out[..], "request {i}");
        let lens: Vec<u32> = seen.writable.iter().map(|w| w.1).collect();
        assert_eq!(
            lens,
            [data_in, vec![1]].concat(),
            "request {i}: data, then status"
        );
        let status: u8 = rig
            .mem
            .guest_memory()
            .read_obj(seen.writable.last().unwrap().0)
            .unwrap();
        assert_eq!(status, 0xff, "request {i}: the status starts unwritten");
        seen_all.push(seen);
    }
    assert!(rig.device_pop().is_none());
    for seen in &seen_all {
        rig.device_complete(seen, Some(0), 0x5a, None);
    }
    let mut done = rig.reap();
    done.sort_by_key(|c| c.token);
    let results: Vec<_> = done.iter().map(|c| (c.token, c.result)).collect();
    assert_eq!(
        results,
        [
            (1, ok(1024)),
            (2, ok(0)),
            (3, ok(0)),
            (4, ok(20)),
            (5, ok(0)),
            (6, ok(0))
        ]
    );
    let byte: u8 = rig.mem.guest_memory().read_obj(rig.data).unwrap();
    assert_eq!(byte, 0x5a, "the read's data landed");
    assert_eq!(rig.queue.in_flight(), 0);
}

#[test]
fn statuses_and_broken_answers_are_errors_not_panics() {
    let mut rig = rig(NotifyMode::PollQueue);
    let data = rig.data(512);
    let read = Request::Read {
        sector: 0,
        data: &data,
    };
    let cases: [Answer; 7] = [
        (Some(1), None, Err(RequestError::Status(Status::IoErr))),
        (Some(2), Some(1), Err(RequestError::Status(Status::Unsupp))),
        (Some(3), None, Err(RequestError::UnknownStatus(3))),
        (None, None, Err(RequestError::StatusNotWritten)),
        (
            Some(0),
            Some(0),
            Err(RequestError::UsedTooShort { len: 0, needed: 1 }),
        ),
        (
            Some(0),
            Some(100),
            Err(RequestError::UsedTooShort {
                len: 100,
                needed: 513,
            }),
        ),
        (Some(0), Some(513), ok(512)),
    ];
    for (i, (status, len, expected)) in cases.into_iter().enumerate() {
        rig.submit(&read, i as u64);
        rig.publish();
        let seen = rig.device_pop().unwrap();
        rig.device_complete(&seen, status, 0, len);
        let done = rig.reap();
        assert_eq!(done.len(), 1);
        assert_eq!((done[0].token, done[0].result), (i as u64, expected));
        assert!(!rig.queue.failed(), "a bad answer fails the request only");
    }
    // A write may complete with the status alone.
    let write = Request::Write {
        sector: 0,
        data: &data,
    };
    rig.submit(&write, 99);
    rig.publish();
    let seen = rig.device_pop().unwrap();
    rig.device_complete(&seen, Some(0), 0, Some(1));
    assert_eq!(rig.reap()[0].result, ok(0));
}

#[test]
fn malformed_requests_are_refused_and_leave_the_queue_usable() {
    let mut rig = rig(NotifyMode::Notify);
    let odd = rig.data(100);
    let none: [Buffer; 0] = [];
    for data in [&odd[..], &none[..]] {
        let err = rig
            .queue
            .submit(&Request::Read { sector: 0, data }, 1)
            .unwrap_err();
        assert!(matches!(err, SubmitError::DataLength { .. }), "{err:?}");
    }
    let seg = Segment {
        sector: 0,
        num_sectors: 1,
        flags: 0,
    };
    let many = [seg; MAX_SEGMENTS + 1];
    for segs in [&[][..], &many[..]] {
        let err = rig.queue.submit(&Request::Discard(segs), 1).unwrap_err();
        assert!(
            matches!(err, SubmitError::Segments { count } if count == segs.len()),
            "{err:?}"
        );
    }
    // Nothing leaked: every slot still takes a request.
    for token in 0..u64::from(SIZE) {
        rig.submit(&Request::Flush, token);
    }
    assert!(matches!(
        rig.queue.submit(&Request::Flush, 99),
        Err(SubmitError::Full)
    ));
    rig.publish();
    while let Some(seen) = rig.device_pop() {
        rig.device_complete(&seen, Some(0), 0, None);
    }
    assert_eq!(rig.reap().len(), usize::from(SIZE));
}

#[test]
fn slots_are_reused_without_limit() {
    let mut rig = rig(NotifyMode::PollQueue);
    let data = rig.data(4096);
    for round in 0..(3 * u64::from(SIZE)) {
        for i in 0..4 {
            let sector = round * 8;
            let req = if i % 2 == 0 {
                Request::Read {
                    sector,
                    data: &data,
                }
            } else {
                Request::Write {
                    sector,
                    data: &data,
                }
            };
            rig.submit(&req, round * 10 + i);
        }
        rig.publish();
        while let Some(seen) = rig.device_pop() {
            assert_eq!(
                u64::from_le_bytes(seen.readable[0][8..16].try_into().unwrap()),
                round * 8
            );
            rig.device_complete(&seen, Some(0), 0, None);
        }
        let mut tokens: Vec<u64> = rig.reap().into_iter().map(|c| c.token).collect();
        tokens.sort_unstable();
        assert_eq!(tokens, (0..4).map(|i| round * 10 + i).collect::<Vec<_>>());
    }
}

#[test]
fn requests_complete_in_every_mode() {
    for mode in NotifyMode::ALL {
        let mut rig = rig(mode);
        let data = rig.data(512);
        for token in 0..3 {
            rig.submit(
                &Request::Read {
                    sector: token,
                    data: &data,
                },
                token,
            );
        }
        rig.publish();
        while let Some(seen) = rig.device_pop() {
            rig.device_complete(&seen, Some(0), 1, None);
        }
        rig.device_notify(mode);
        let mut done = Vec::new();
        while done.len() < 3 {
            rig.queue.wait_and_reap(|c| done.push(c)).unwrap();
        }
        done.sort_by_key(|c| c.token);
        let want: Vec<Completion> = (0..3)
            .map(|token| Completion {
                token,
                result: ok(512),
            })
            .collect();
        assert_eq!(done, want, "{mode}");
    }
}

#[test]
fn a_bogus_used_entry_fails_every_request_in_flight() {
    let mut rig = rig(NotifyMode::Notify);
    for token in 10..13 {
        rig.submit(&Request::Flush, token);
    }
    rig.publish();
    let seen = rig.device_pop().unwrap();
    rig.device_complete(&seen, Some(0), 0, None);
    // An entry naming a descriptor past the table.
    let gm = rig.mem.guest_memory();
    let used = rig.queue.virtqueue().ring().addresses()[2];
    gm.write_obj(1000u32.to_le(), GuestAddress(used.0 + 4 + 8))
        .unwrap();
    gm.write_obj(2u16.to_le(), GuestAddress(used.0 + 2))
        .unwrap();
    rig.device_notify(NotifyMode::Notify);
    let mut tokens = Vec::new();
    let err = rig
        .queue
        .wait_and_reap(|c| tokens.push((c.token, c.result)))
        .unwrap_err();
    assert!(
        matches!(
            err,
            QueueFailure::Device(DeviceError::UnknownId { id: 1000, .. })
        ),
        "{err:?}"
    );
    tokens.sort_unstable_by_key(|t| t.0);
    assert_eq!(
        tokens,
        [
            (10, ok(0)),
            (11, Err(RequestError::QueueFailed)),
            (12, Err(RequestError::QueueFailed))
        ]
    );
    assert!(matches!(
        rig.queue.submit(&Request::Flush, 1),
        Err(SubmitError::Failed)
    ));
}

#[test]
fn a_hangup_fails_every_request_in_every_mode() {
    for mode in NotifyMode::ALL {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let mut rig = rig_with(mode, Some(OwnedFd::from(ours)), TIMEOUT);
        rig.submit(&Request::Flush, 5);
        rig.submit(&Request::Flush, 6);
        rig.publish();
        drop(theirs);
        let mut failed = Vec::new();
        let err = rig
            .queue
            .wait_and_reap(|c| {
                assert_eq!(c.result, Err(RequestError::QueueFailed));
                failed.push(c.token);
            })
            .unwrap_err();
        assert!(
            matches!(err, QueueFailure::Notify(NotifyError::Hangup)),
            "{mode}: {err:?}"
        );
        failed.sort_unstable();
        assert_eq!(failed, [5, 6], "{mode}");
    }
}

#[test]
fn every_request_header_shares_its_line_with_its_status_and_no_other() {
    let mut rig = rig(NotifyMode::Notify);
    let data = rig.data(512);
    for token in 0..u64::from(SIZE) {
        rig.submit(
            &Request::Read {
                sector: 0,
                data: &data,
            },
            token,
        );
    }
    rig.publish();
    let seen: Vec<Seen> = std::iter::from_fn(|| rig.device_pop()).collect();
    assert_eq!(seen.len(), usize::from(SIZE));
    let requests: Vec<_> = seen
        .iter()
        .map(|s| {
            let status = *s.writable.last().unwrap();
            (s.readable_at[0], status, status)
        })
        .collect();
    crate::test_rig::assert_one_line_per_request(&requests);
}

/// Stores `flags` in the queue's SQ doorbell, as the device does.
fn device_sq_flags(rig: &Rig, flags: u16) {
    let area = rig.queue.virtqueue().ring().doorbell_area();
    rig.mem
        .guest_memory()
        .write_obj(flags.to_le(), GuestAddress(area.0 + 2))
        .unwrap();
}

#[test]
fn throttle_is_read_at_publication_and_again_when_asked() {
    for mode in NotifyMode::ALL {
        let mut rig = rig(mode);
        let doorbells = mode.doorbells();
        let data = rig.data(512);
        device_sq_flags(&rig, sqcq_protocol::THROTTLE);
        assert_eq!(rig.queue.throttle(true), doorbells, "{mode}: read now");
        device_sq_flags(&rig, 0);
        assert_eq!(
            rig.queue.throttle(false),
            doorbells,
            "{mode}: as last read until read again"
        );
        assert!(!rig.queue.throttle(true), "{mode}");
        // A publication loads `sq.flags` after fence 1: it sees the bit.
        device_sq_flags(&rig, sqcq_protocol::THROTTLE | sqcq_protocol::NEED_WAKEUP);
        rig.submit(
            &Request::Read {
                sector: 0,
                data: &data,
            },
            0,
        );
        rig.publish();
        assert_eq!(
            rig.queue.throttle(false),
            doorbells,
            "{mode}: after publish"
        );
        // The completion that lets it go comes with the clear (T2).
        let seen = rig.device_pop().unwrap();
        device_sq_flags(&rig, 0);
        rig.device_complete(&seen, Some(0), 1, None);
        rig.device_notify(mode);
        let mut done = Vec::new();
        while done.is_empty() {
            rig.queue.wait_and_reap(|c| done.push(c)).unwrap();
        }
        assert!(!rig.queue.throttle(true), "{mode}: read after the reap");
    }
}
