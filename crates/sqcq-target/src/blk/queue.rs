//! A virtio-blk request queue: its [`RequestHandler`].
//!
//! A request goes through three phases, each its own function: `parse`
//! turns the accepted chain into a [`BlkRequest`] value (or a refusal),
//! `execute` submits it to the backstore (GET_ID completes at once), and
//! its completion writes the status byte and publishes the used element
//! (`respond` for requests answered without the backstore,
//! `reap_completions` for the others).
//!
//! Each request is checked before anything reaches the backstore: a chain
//! that cannot be followed, a header or status buffer missing, a transfer
//! that is not a whole number of sectors or runs past the end of the
//! disk, a write to a read-only disk, a discard or write-zeroes request
//! with more segments than the one the device announces (UNSUPP, as in
//! QEMU's back-ends) or less than one, reserved flags, more than
//! [`MAX_RANGE_SECTORS`] or a range not aligned to the logical block:
//! each gets its status (IOERR, or UNSUPP for what the device does not
//! do), is counted and logged through the rate limiter. Reads and writes
//! go zero-copy to the backstore with iovecs into guest memory; one slot
//! per head, allocated once, keeps what a request in flight needs.

use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqcq_backstore::{BackstoreError, BackstoreQueue, IoOp};
use sqcq_wire::blk::{
    HEADER_SIZE, RequestHeader, RequestType, SECTOR_SIZE, SEGMENT_SIZE, STATUS_SIZE, Segment,
    Status, WRITE_ZEROES_FLAG_UNMAP,
};
use tracing::{debug, warn};

use crate::blk::device::{Disk, MAX_RANGE_SECTORS};
use crate::guest_warn;
use crate::runtime::backstore;
use crate::runtime::batch::Batch;
use crate::runtime::chain::{ChainBuffers, Segment as Buf};
use crate::runtime::events::{Event, IoKind};
use crate::runtime::lun_stats::LunSlot;
use crate::runtime::metrics::DeviceMetrics;
use crate::runtime::pins::{MapPin, MapPins};
use crate::runtime::queue::{
    Accepted, DeviceInfo, QueueError, RequestHandler, RingConfig, Vring, drain_fd, segment_limit,
    wait_readable,
};
use crate::runtime::ring::Chain;
use crate::runtime::stage_clock::{self, Stage};
use crate::runtime::stream;

/// What a request in flight keeps until it completes.
#[derive(Default)]
struct Slot {
    busy: bool,
    /// The memory map its iovecs point into, kept mapped until completion.
    mem: Option<MapPin>,
    iov: Vec<libc::iovec>,
    /// Its device-writable buffers: data-in, then the status byte.
    writable: Vec<Buf>,
    /// Bytes of data-in on success (IN).
    data_in: u32,
    /// Bytes of data-out (OUT).
    data_out: u64,
    /// The operation (for the `io_error` event and per-LUN figures).
    op: Option<IoOp>,
}

/// The virtio-blk request handler of one request queue.
pub(crate) struct BlkQueue {
    disk: Disk,
    io: Box<dyn BackstoreQueue>,
    /// What `io` has queued and not sent.
    pending: backstore::Pending,
    slots: Vec<Slot>,
    /// The memory maps the slots' `mem` pins hold.
    pins: MapPins,
    in_flight: u32,
    chain: ChainBuffers,
    max_segments: usize,
    /// This queue's counts of the disk's I/O.
    stats: Arc<LunSlot>,
}

impl std::fmt::Debug for BlkQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlkQueue")
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

/// A request taken from the ring and checked (phase 1 of three: parse,
/// execute, complete).
#[derive(Debug)]
enum BlkRequest {
    /// A backstore operation; `data_in` bytes come back on success.
    Io { op: IoOp, data_in: u32 },
    /// GET_ID: the serial.
    GetId,
}

/// Why a request is answered without the backstore.
enum Refusal {
    /// IOERR: no room for the header or the status byte.
    NoHeader,
    /// IOERR: malformed or out of range.
    Bad(&'static str),
    /// UNSUPP: a request type or flag the device does not implement.
    Unsupported(&'static str),
}

impl BlkQueue {
    /// A handler for `disk` with a backstore queue as deep as the ring.
    /// The handler of request queue `rq` (its virtqueue index).
    pub(crate) fn new(disk: Disk, rq: u16, ring: &RingConfig) -> Result<Self, QueueError> {
        let io = disk
            .backstore
            .open_queue(u32::from(ring.size))
            .map_err(|source| QueueError::Backstore { lun: 0, source })?;
        // Header, data segments, status.
        let max_segments = segment_limit(ring, disk.seg_max, 2);
        Ok(BlkQueue {
            stats: disk.stats.slot(rq),
            disk,
            io,
            pending: backstore::Pending::default(),
            slots: (0..ring.size).map(|_| Slot::default()).collect(),
            pins: MapPins::default(),
            in_flight: 0,
            chain: ChainBuffers::with_capacity(max_segments.min(64)),
            max_segments,
        })
    }

    /// Writes `status` as the last writable byte of the chain just parsed
    /// and completes the request with `data_in` bytes before it.
    fn respond(
        &mut self,
        ring: &mut Vring,
        mem: Batch<'_>,
        head: u16,
        status: Status,
        data_in: u32,
    ) {
        let len = finish(
            mem,
            &self.chain.writable,
            self.chain.writable_len,
            status,
            data_in,
        );
        ring.complete(mem, head, len);
    }

    fn refuse(&mut self, ring: &mut Vring, mem: Batch<'_>, head: u16, why: Refusal) {
        let d = ring.device();
        let status = match why {
            Refusal::NoHeader => {
                DeviceMetrics::bump(&d.metrics.short_headers);
                guest_warn!(
                    d.limiter,
                    device = d.id,
                    vq = ring.key().vq,
                    "request at head {head} without a header or a status byte"
                );
                Status::IoErr
            }
            Refusal::Bad(what) => {
                DeviceMetrics::bump(&d.metrics.bad_requests);
                guest_warn!(
                    d.limiter,
                    device = d.id,
                    vq = ring.key().vq,
                    "request at head {head}: {what}"
                );
                Status::IoErr
            }
            Refusal::Unsupported(what) => {
                DeviceMetrics::bump(&d.metrics.bad_requests);
                guest_warn!(
                    d.limiter,
                    device = d.id,
                    vq = ring.key().vq,
                    "request at head {head}: {what}: unsupported"
                );
                Status::Unsupp
            }
        };
        self.respond(ring, mem, head, status, 0);
    }

    /// Checks a transfer of `bytes` at `sector`; the byte offset.
    fn range(&self, sector: u64, bytes: u64) -> Result<u64, Refusal> {
        if !bytes.is_multiple_of(SECTOR_SIZE) {
            return Err(Refusal::Bad("transfer not a whole number of sectors"));
        }
        let end = sector
            .checked_add(bytes / SECTOR_SIZE)
            .ok_or(Refusal::Bad("sector out of range"))?;
        // Relaxed: see `BlkDevice::resize`, which orders what matters.
        if end > self.disk.sectors.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Refusal::Bad("beyond the end of the disk"));
        }
        Ok(sector * SECTOR_SIZE)
    }

    /// Phase 1: reads and checks the request of the chain just accepted.
    fn parse(&self, mem: Batch<'_>) -> Result<BlkRequest, Refusal> {
        let c = &self.chain;
        let mut b = [0u8; HEADER_SIZE];
        if c.readable_len < HEADER_SIZE as u64
            || c.writable_len < STATUS_SIZE as u64
            || stream::read_at(mem, &c.readable, 0, &mut b).is_err()
        {
            return Err(Refusal::NoHeader);
        }
        let hdr = RequestHeader::decode(&b);
        let data_out = c.readable_len - HEADER_SIZE as u64;
        let data_in = c.writable_len - STATUS_SIZE as u64;
        match hdr.kind {
            RequestType::In => {
                let offset = self.range(hdr.sector, data_in)?;
                let n = u32::try_from(data_in).map_err(|_| Refusal::Bad("transfer too long"))?;
                Ok(BlkRequest::Io {
                    op: IoOp::Read { offset },
                    data_in: n,
                })
            }
            RequestType::Out => {
                if self.disk.read_only {
                    return Err(Refusal::Bad("write to a read-only disk"));
                }
                let offset = self.range(hdr.sector, data_out)?;
                // Write-through: durable before it completes (the
                // backstore's FUA write).
                let fua = !self
                    .disk
                    .writeback
                    .load(std::sync::atomic::Ordering::Relaxed);
                Ok(BlkRequest::Io {
                    op: IoOp::Write { offset, fua },
                    data_in: 0,
                })
            }
            RequestType::Flush => Ok(BlkRequest::Io {
                op: IoOp::Flush,
                data_in: 0,
            }),
            RequestType::GetId => Ok(BlkRequest::GetId),
            RequestType::Discard if !self.disk.discard => Err(Refusal::Unsupported("discard")),
            RequestType::Discard | RequestType::WriteZeroes => {
                if self.disk.read_only {
                    return Err(Refusal::Bad("write to a read-only disk"));
                }
                // The device announces one range (max_discard_seg,
                // max_write_zeroes_seg): more is a feature it lacks
                // (UNSUPP, as QEMU's back-ends answer), less is malformed.
                if data_out > SEGMENT_SIZE as u64 {
                    return Err(Refusal::Unsupported("more than one range"));
                }
                if data_out != SEGMENT_SIZE as u64 {
                    return Err(Refusal::Bad("less than one range"));
                }
                let mut b = [0u8; SEGMENT_SIZE];
                stream::read_at(mem, &c.readable, HEADER_SIZE as u64, &mut b)
                    .map_err(|_| Refusal::Bad("range unreadable"))?;
                let seg = Segment::decode(&b);
                let discard = hdr.kind == RequestType::Discard;
                let allowed = if discard { 0 } else { WRITE_ZEROES_FLAG_UNMAP };
                if seg.flags & !allowed != 0 {
                    return Err(Refusal::Unsupported("reserved range flags"));
                }
                if seg.num_sectors > MAX_RANGE_SECTORS {
                    return Err(Refusal::Bad("range longer than the device accepts"));
                }
                let per_block = u64::from(self.disk.backstore.geometry().block_size) / SECTOR_SIZE;
                if !seg.sector.is_multiple_of(per_block)
                    || !u64::from(seg.num_sectors).is_multiple_of(per_block)
                {
                    return Err(Refusal::Bad("range not aligned to the logical block"));
                }
                let len = u64::from(seg.num_sectors) * SECTOR_SIZE;
                let offset = self.range(seg.sector, len)?;
                let unmap = discard
                    || (seg.flags & WRITE_ZEROES_FLAG_UNMAP != 0
                        && self.disk.discard
                        && self.disk.backstore.geometry().unmapped_reads_zero);
                let op = if unmap {
                    IoOp::Discard { offset, len }
                } else {
                    IoOp::WriteZeroes { offset, len }
                };
                Ok(BlkRequest::Io { op, data_in: 0 })
            }
            RequestType::SecureErase => Err(Refusal::Unsupported("secure erase")),
            RequestType::Other(_) => Err(Refusal::Unsupported("request type")),
        }
    }

    /// Phase 2: a backstore operation is submitted (phase 3,
    /// [`Self::reap_completions`], completes it); GET_ID completes here.
    fn execute(&mut self, ring: &mut Vring, mem: Batch<'_>, head: u16, req: BlkRequest) {
        match req {
            BlkRequest::Io { op, data_in } => {
                if let Err(e) = self.submit(mem, head, op, data_in) {
                    let d = ring.device();
                    d.metrics
                        .count_backstore_failure(matches!(e, Some(BackstoreError::CephIo(_))));
                    let bytes = self.chain.readable_len.saturating_sub(HEADER_SIZE as u64)
                        + u64::from(data_in);
                    if let Some(e) = e {
                        io_error(d, op, bytes, &e);
                    }
                    let bytes = op_bytes(op, bytes);
                    self.stats
                        .record(IoKind::of(&op), bytes, false, ring.service_ns(head));
                    self.respond(ring, mem, head, Status::IoErr, 0);
                }
            }
            BlkRequest::GetId => {
                // The serial, as much of it as the buffer takes.
                let room = self.chain.writable_len - STATUS_SIZE as u64;
                let n = usize::try_from(room)
                    .unwrap_or(usize::MAX)
                    .min(self.disk.id.len());
                let ok = stream::write_at(mem, &self.chain.writable, 0, &self.disk.id[..n]).is_ok();
                let (status, n) = if ok {
                    (Status::Ok, n)
                } else {
                    (Status::IoErr, 0)
                };
                self.respond(ring, mem, head, status, u32::try_from(n).unwrap_or(0));
            }
        }
    }

    /// Sends a checked request to the backstore; the backstore's error if
    /// it refused, `None` if the guest buffers could not be mapped.
    fn submit(
        &mut self,
        mem: Batch<'_>,
        head: u16,
        op: IoOp,
        data_in: u32,
    ) -> Result<(), Option<BackstoreError>> {
        let slot = &mut self.slots[usize::from(head)];
        slot.iov.clear();
        let c = &self.chain;
        let mapped = match op {
            IoOp::Read { .. } => {
                stream::iovecs(mem, &c.writable, 0, u64::from(data_in), &mut slot.iov)
            }
            IoOp::Write { .. } => stream::iovecs(
                mem,
                &c.readable,
                HEADER_SIZE as u64,
                c.readable_len - HEADER_SIZE as u64,
                &mut slot.iov,
            ),
            _ => Ok(()),
        };
        if mapped.is_err() {
            return Err(None);
        }
        // SAFETY: the iovecs point into guest memory kept mapped by the
        // pin `slot.mem` (taken below, before anything can complete) until the
        // request is reaped; `slot.iov` is not touched while it is in
        // flight (the slot is busy, a duplicate head is refused).
        unsafe { self.io.submit(u64::from(head), op, &slot.iov) }.map_err(Some)?;
        slot.busy = true;
        slot.mem = Some(self.pins.pin(mem.map()));
        slot.writable.clone_from(&c.writable);
        slot.data_in = data_in;
        slot.op = Some(op);
        slot.data_out = match op {
            IoOp::Write { .. } => c.readable_len - HEADER_SIZE as u64,
            _ => 0,
        };
        self.in_flight += 1;
        self.pending.queued();
        Ok(())
    }

    /// Completes what the backstore finished.
    fn reap_completions(&mut self, ring: &mut Vring, mem: Batch<'_>) {
        if self.io.in_flight() == 0 {
            return;
        }
        let slots = &mut self.slots;
        let pins = &mut self.pins;
        let in_flight = &mut self.in_flight;
        let stats = &self.stats;
        self.io.reap(&mut |tag, result| {
            let Some(slot) = usize::try_from(tag).ok().and_then(|i| slots.get_mut(i)) else {
                return;
            };
            if !slot.busy {
                return;
            }
            // What a read wrote through the iovecs, whatever its result.
            stream::mark_written(mem, &slot.writable, 0, u64::from(slot.data_in));
            // `tag` came from a head index: it fits.
            let head = u16::try_from(tag).unwrap_or(u16::MAX);
            if let Some(op) = slot.op {
                let bytes = op_bytes(op, u64::from(slot.data_in) + slot.data_out);
                stats.record(
                    IoKind::of(&op),
                    bytes,
                    result.is_ok(),
                    ring.service_ns(head),
                );
            }
            let (status, data_in) = match result {
                Ok(_) => {
                    ring.transferred(u64::from(slot.data_in), slot.data_out);
                    (Status::Ok, slot.data_in)
                }
                Err(e) => {
                    let d = ring.device();
                    d.metrics
                        .count_backstore_failure(matches!(e, BackstoreError::CephIo(_)));
                    debug!(device = d.id, "backstore: {e}");
                    if let Some(op) = slot.op {
                        io_error(d, op, u64::from(slot.data_in) + slot.data_out, &e);
                    }
                    (Status::IoErr, 0)
                }
            };
            let writable_len = slot.writable.iter().map(|s| u64::from(s.len)).sum();
            let len = finish(mem, &slot.writable, writable_len, status, data_in);
            ring.complete(mem, head, len);
            slot.busy = false;
            if let Some(pin) = slot.mem.take() {
                pins.unpin(pin);
            }
            *in_flight -= 1;
        });
    }
}

/// Tells subscribers of events that the backstore failed `op` (`bytes`
/// long if it moves data).
fn io_error(d: &DeviceInfo, op: IoOp, bytes: u64, e: &BackstoreError) {
    if !d.events.wanted() {
        return;
    }
    let offset = match op {
        IoOp::Read { offset }
        | IoOp::Write { offset, .. }
        | IoOp::Discard { offset, .. }
        | IoOp::WriteZeroes { offset, .. } => offset,
        IoOp::Flush => 0,
    };
    d.events.publish(Event::IoError {
        device: d.id,
        lun: 0,
        op: IoKind::of(&op),
        lba: offset / SECTOR_SIZE,
        bytes: op_bytes(op, bytes),
        error: e.to_string(),
    });
}

/// The bytes `op` covers: `moved` for a read or a write (its data), the
/// range of a discard or write zeroes, 0 for a flush.
fn op_bytes(op: IoOp, moved: u64) -> u64 {
    match op {
        IoOp::Read { .. } | IoOp::Write { .. } => moved,
        IoOp::Discard { len, .. } | IoOp::WriteZeroes { len, .. } => len,
        IoOp::Flush => 0,
    }
}

/// Writes `status` as the last byte of `writable`; the used length
/// (`data_in` plus the status byte), 0 if the status could not be written.
fn finish(
    mem: Batch<'_>,
    writable: &[Buf],
    writable_len: u64,
    status: Status,
    data_in: u32,
) -> u32 {
    let Some(at) = writable_len.checked_sub(STATUS_SIZE as u64) else {
        return 0;
    };
    if stream::write_at(mem, writable, at, &[status as u8]).is_err() {
        return 0;
    }
    data_in.saturating_add(1)
}

impl RequestHandler for BlkQueue {
    fn handle(&mut self, ring: &mut Vring, mem: Batch<'_>, chain: Chain<'_>) {
        let slots = &self.slots;
        let head = match ring.accept(chain, mem, self.max_segments, &mut self.chain, |h| {
            slots[usize::from(h)].busy
        }) {
            Accepted::Request(head) => head,
            Accepted::Duplicate => return,
            Accepted::Bad(head) => {
                // Whatever writable buffers were found: the status goes
                // last.
                self.respond(ring, mem, head, Status::IoErr, 0);
                return;
            }
        };
        match self.parse(mem) {
            Ok(req) => {
                stage_clock::mark(Stage::Header);
                self.execute(ring, mem, head, req);
            }
            Err(why) => self.refuse(ring, mem, head, why),
        }
        stage_clock::mark(Stage::Handled);
    }

    fn commit(&mut self, ring: &Vring) {
        backstore::commit(&mut self.pending, self.io.as_mut(), ring, 0);
    }

    fn reap(&mut self, ring: &mut Vring, mem: Batch<'_>) {
        self.reap_completions(ring, mem);
    }

    fn completed(&mut self, ring: &mut Vring, mem: Batch<'_>, _source: usize) {
        if let Some(fd) = self.io.completion_fd() {
            drain_fd(fd);
        }
        self.reap_completions(ring, mem);
    }

    fn completion_fds(&self) -> Vec<(usize, RawFd)> {
        self.io
            .completion_fd()
            .map(|fd| (0, fd))
            .into_iter()
            .collect()
    }

    fn busy(&self) -> bool {
        self.in_flight > 0
    }

    fn has_deferred(&self) -> bool {
        // The retry of a commit the backstore refused.
        self.pending.retrying() && self.pending.retry_due(Instant::now())
    }

    fn commit_retry_in(&self) -> Option<Duration> {
        if !self.pending.retrying() {
            return None;
        }
        self.pending.retry_in(Instant::now())
    }

    fn run_deferred(&mut self, _ring: &mut Vring, _mem: Batch<'_>) {}

    fn begin_drain(&mut self) -> bool {
        // virtio-blk has no task management: a drain (a device change)
        // waits for everything in flight.
        self.in_flight == 0
    }

    fn drained(&self) -> bool {
        self.in_flight == 0
    }

    fn steer_completions(&mut self, ring: &Vring, cpus: &[usize]) {
        match self.io.steer_completions(cpus) {
            Ok(true) => debug!(
                device = ring.device().id,
                vq = ring.key().vq,
                "backstore completion work on CPUs {cpus:?}"
            ),
            Ok(false) => {}
            Err(e) => warn!(
                device = ring.device().id,
                vq = ring.key().vq,
                "cannot steer backstore completions: {e}"
            ),
        }
    }

    fn finish(&mut self, ring: &mut Vring, mem: Batch<'_>, deadline: Instant) -> usize {
        RequestHandler::commit(self, ring);
        while self.in_flight > 0 && Instant::now() < deadline {
            // Retries a refused commit.
            RequestHandler::commit(self, ring);
            if let Some(fd) = self.io.completion_fd() {
                wait_readable(fd, 10);
                drain_fd(fd);
            }
            self.reap_completions(ring, mem);
        }
        usize::try_from(self.in_flight).unwrap_or(usize::MAX)
    }

    fn cancel(&mut self, ring: &Vring) {
        if let Err(e) = self.io.cancel() {
            warn!(
                device = ring.device().id,
                vq = ring.key().vq,
                "cannot cancel backstore requests: {e}"
            );
        }
    }

    fn memory_changed(&mut self) {
        self.pins.release_idle();
    }
}
