//! One virtio-scsi command request, from descriptor chain to response, in
//! three phases: `parse` reads the header into a [`Command`] value (or a
//! transport response), `execute` runs it on its logical unit (emulated
//! commands complete there; medium commands go to the backstore through
//! `submit_medium`), and `complete_request` answers a medium command once
//! its backstore work is reaped.
//!
//! The order of checks follows what the guest can get wrong: a chain that
//! cannot be followed or has buffers outside memory or in the wrong order
//! (VIRTIO_SCSI_S_FAILURE when a response can still be written, else the
//! chain comes back with length 0); a header shorter than the configured
//! CDB size (FAILURE); an unknown target (BAD_TARGET); an unknown LUN (the
//! SCSI answer for an absent logical unit, from `sqcq_scsi`); data buffers
//! too small for the transfer (OVERRUN). Everything else is SCSI: status
//! and sense data come from `ScsiError::status_and_sense`, and backstore
//! failures become a `ScsiError` in [`medium_error`], the one place that
//! maps them.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::Arc;

use sqcq_backstore::{BackstoreError, IoOp};
use sqcq_scsi::{
    Completion, MAX_DESCRIPTOR_SENSE_LEN, MediumOp, ScsiError, SenseFormat, Status, execute_absent,
    report_luns, takes_parameter_data,
};
use tracing::debug;

use crate::guest_warn;
use crate::runtime::batch::Batch;
use crate::runtime::chain::Segment;
use crate::runtime::events::{Event, IoKind};
use crate::runtime::lun_stats::LunSlot;
use crate::runtime::metrics::DeviceMetrics;
use crate::runtime::pass;
use crate::runtime::queue::{Accepted, Vring};
use crate::runtime::ring::Chain;
use crate::runtime::stage_clock::{self, Stage};
use crate::runtime::stream;
use crate::scsi::inflight::{Inflight, OpKind, RangeOp, Slot};
use crate::scsi::queue::{Held, LunQueue, ScsiQueue};
use sqcq_wire::scsi::{CMD_REQ_FIXED, CMD_RESP_FIXED, CmdReqHeader, CmdResp, Response};

/// Bytes of a non-zero WRITE SAME pattern replicated per backstore write:
/// one slice of such a command.
const PATTERN_BYTES: u64 = 256 << 10;
/// Bytes one slice of a discard or zeroing covers (UNMAP, WRITE SAME with
/// zeros). A backstore that does these in memory (RAM) touches this much
/// per slice; files and devices do them as metadata or in the kernel.
const SLICE_BYTES: u64 = 1 << 20;

/// Writes a command response at the start of `writable`; returns the
/// bytes written, or `None` when not even the fixed part fits or guest
/// memory refuses the write.
pub(crate) fn write_response(
    mem: Batch<'_>,
    writable: &[Segment],
    writable_len: u64,
    sense_size: usize,
    mut resp: CmdResp,
    sense: &[u8],
) -> Option<u64> {
    let fixed = CMD_RESP_FIXED as u64;
    let room = writable_len.checked_sub(fixed)?;
    let n = sense
        .len()
        .min(sense_size)
        .min(usize::try_from(room).unwrap_or(usize::MAX));
    let sense = &sense[..n];
    resp.sense_len = u32::try_from(n).unwrap_or(u32::MAX);
    stream::write_bytes_at(mem, writable, 0, &resp.encode()).ok()?;
    if !sense.is_empty() {
        stream::write_at(mem, writable, fixed, sense).ok()?;
    }
    Some(writable_len.min(fixed + sense_size as u64))
}

/// The one mapping from backstore failures to SCSI errors.
pub(crate) fn medium_error(kind: OpKind, lba: u64, e: &BackstoreError) -> ScsiError {
    match (e, kind) {
        (BackstoreError::ReadOnly, _) => ScsiError::WriteProtected,
        (
            BackstoreError::Io(_)
            | BackstoreError::CephIo(_)
            | BackstoreError::ShortTransfer { .. },
            OpKind::Read,
        ) => ScsiError::UnrecoveredReadError { lba: Some(lba) },
        (
            BackstoreError::Io(_)
            | BackstoreError::CephIo(_)
            | BackstoreError::ShortTransfer { .. },
            OpKind::Write,
        ) => ScsiError::WriteError { lba: Some(lba) },
        _ => ScsiError::InternalTargetFailure,
    }
}

/// Status byte and encoded sense data of a failed command.
pub(crate) fn scsi_failure(e: &ScsiError) -> (u8, [u8; MAX_DESCRIPTOR_SENSE_LEN], usize) {
    let (status, sense) = e.status_and_sense();
    let mut buf = [0u8; MAX_DESCRIPTOR_SENSE_LEN];
    let n = sense.map_or(0, |s| s.encode(SenseFormat::Fixed, &mut buf));
    (status.code(), buf, n)
}

fn saturating_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// A command request taken from the ring and parsed (phase 1): where it
/// goes and the sizes of its buffers. Its CDB stays in the queue's header
/// buffer; a request that gets this far is answered by a logical unit (or
/// the answer for an absent one), never by a transport response.
struct Command {
    head: u16,
    /// Index of the LUN among the target's, `None` if it does not exist.
    lun: Option<usize>,
    /// Request header bytes (fixed part and CDB).
    hdr_len: u64,
    /// Data-out bytes after the header.
    data_out_len: u64,
    /// Data-in bytes after the response.
    data_in_len: u64,
}

impl ScsiQueue {
    /// Handles one chain popped from the available ring: parse, execute
    /// (emulated commands complete at once, medium commands are submitted
    /// to the backstore and complete when reaped).
    pub(crate) fn handle_chain(&mut self, ring: &mut Vring, mem: Batch<'_>, chain: Chain<'_>) {
        let inflight = &self.inflight;
        let head = match ring.accept(chain, mem, self.max_segments, &mut self.chain, |h| {
            inflight.is_busy(h)
        }) {
            Accepted::Request(head) => head,
            Accepted::Duplicate => return,
            Accepted::Bad(head) => {
                self.respond_transport(ring, mem, head, Response::Failure, 0);
                return;
            }
        };
        let mut header = std::mem::take(&mut self.header);
        match self.parse(ring, mem, head, &mut header) {
            Ok(cmd) => {
                stage_clock::mark(Stage::Header);
                self.execute(ring, mem, &cmd, &header[CMD_REQ_FIXED..]);
            }
            Err(response) => self.respond_transport(ring, mem, head, response, 0),
        }
        stage_clock::mark(Stage::Handled);
        self.header = header;
    }

    /// Phase 1: reads the request header of the chain just accepted into
    /// `header` and finds its logical unit; the transport response of a
    /// request that cannot reach one.
    fn parse(
        &self,
        ring: &Vring,
        mem: Batch<'_>,
        head: u16,
        header: &mut [u8],
    ) -> Result<Command, Response> {
        let d = ring.device();
        let hdr_len = header.len() as u64;
        if self.chain.readable_len < hdr_len
            || stream::read_at(mem, &self.chain.readable, 0, header).is_err()
        {
            DeviceMetrics::bump(&d.metrics.short_headers);
            guest_warn!(
                d.limiter,
                device = d.id,
                vq = ring.key().vq,
                "request header shorter than {hdr_len} bytes at head {head}"
            );
            return Err(Response::Failure);
        }
        let mut fixed = [0u8; CMD_REQ_FIXED];
        fixed.copy_from_slice(&header[..CMD_REQ_FIXED]);
        let req = CmdReqHeader::decode(&fixed);
        let lun = match req.lun {
            Some(lun) if lun.target() == 0 => lun.lun(),
            Some(lun) => {
                // A guest scanning its bus: normal, answered, counted as
                // an event and not as an error.
                DeviceMetrics::bump(&d.metrics.other_targets);
                debug!(
                    device = d.id,
                    target = lun.target(),
                    "request for another target"
                );
                return Err(Response::BadTarget);
            }
            None => {
                DeviceMetrics::bump(&d.metrics.bad_lun);
                guest_warn!(
                    d.limiter,
                    device = d.id,
                    "request with a malformed LUN field"
                );
                return Err(Response::BadTarget);
            }
        };
        let lun = self.target.find(lun);
        if lun.is_none() {
            DeviceMetrics::bump(&d.metrics.bad_lun);
        }
        let resp_len = (CMD_RESP_FIXED + self.sense_size) as u64;
        Ok(Command {
            head,
            lun,
            hdr_len,
            data_out_len: self.chain.readable_len - hdr_len,
            data_in_len: self.chain.writable_len.saturating_sub(resp_len),
        })
    }

    /// Phase 2: runs `cmd` (whose CDB is `cdb`) on its logical unit.
    /// Emulated commands complete here; medium commands go to
    /// [`Self::submit_medium`].
    fn execute(&mut self, ring: &mut Vring, mem: Batch<'_>, cmd: &Command, cdb: &[u8]) {
        let resp_len = (CMD_RESP_FIXED + self.sense_size) as u64;
        let mut data_out = std::mem::take(&mut self.data_out);
        let mut data_in = std::mem::take(&mut self.data_in);
        let mut n_out = 0;
        if takes_parameter_data(cdb) {
            n_out = usize::try_from(cmd.data_out_len)
                .unwrap_or(usize::MAX)
                .min(data_out.len());
            if stream::read_at(
                mem,
                &self.chain.readable,
                cmd.hdr_len,
                &mut data_out[..n_out],
            )
            .is_err()
            {
                n_out = 0;
            }
        }
        let target = &self.target;
        let result = match cmd.lun {
            Some(i) => {
                target.luns()[i]
                    .unit
                    .execute(self.nexus, cdb, &data_out[..n_out], &mut data_in)
            }
            None => execute_absent(cdb, &mut data_in),
        };
        stage_clock::mark(Stage::Executed);
        let data_len = match result {
            Ok(Completion::Good) => Some(0),
            Ok(Completion::Data { len }) => Some(len),
            Ok(Completion::ReportLuns(r)) => {
                Some(report_luns(&r, target.lun_numbers(), &mut data_in))
            }
            Ok(Completion::Medium(op)) => {
                self.submit_medium(ring, mem, cmd, op);
                None
            }
            Err(e) => {
                let (status, sense, n) = scsi_failure(&e);
                let resp = CmdResp::completed(
                    status,
                    saturating_u32(cmd.data_in_len.max(cmd.data_out_len)),
                );
                self.respond_now(ring, mem, cmd.head, resp, &sense[..n], 0);
                None
            }
        };
        if let Some(len) = data_len {
            let n = (len as u64).min(cmd.data_in_len);
            let data = &data_in[..usize::try_from(n).unwrap_or(0)];
            let copied = stream::write_at(mem, &self.chain.writable, resp_len, data).is_ok();
            let n = if copied { n } else { 0 };
            let resp = CmdResp::completed(Status::Good.code(), saturating_u32(cmd.data_in_len - n));
            self.respond_now(ring, mem, cmd.head, resp, &[], n);
        }
        self.data_out = data_out;
        self.data_in = data_in;
    }

    /// Answers a request with only a virtio-scsi `response` (the request
    /// never reached a logical unit).
    fn respond_transport(
        &mut self,
        ring: &mut Vring,
        mem: Batch<'_>,
        head: u16,
        response: Response,
        resid: u32,
    ) {
        self.respond_now(ring, mem, head, CmdResp::transport(response, resid), &[], 0);
    }

    /// Writes a response for a request that completes without the
    /// backstore and puts it on the used ring.
    pub(crate) fn respond_now(
        &mut self,
        ring: &mut Vring,
        mem: Batch<'_>,
        head: u16,
        resp: CmdResp,
        sense: &[u8],
        data_in: u64,
    ) {
        let len = write_response(
            mem,
            &self.chain.writable,
            self.chain.writable_len,
            self.sense_size,
            resp,
            sense,
        );
        let len = match len {
            Some(n) => n + data_in,
            None => {
                let d = ring.device();
                DeviceMetrics::bump(&d.metrics.short_responses);
                guest_warn!(
                    d.limiter,
                    device = d.id,
                    vq = ring.key().vq,
                    "no room for a response at head {head}: returned with length 0"
                );
                0
            }
        };
        ring.complete(mem, head, saturating_u32(len));
    }

    /// Phase 2 for a medium command: checks its buffers against the
    /// transfer, takes an in-flight slot and queues the backstore
    /// operations. Phase 3 is [`complete_request`], once they are reaped.
    fn submit_medium(&mut self, ring: &mut Vring, mem: Batch<'_>, cmd: &Command, op: MediumOp<'_>) {
        let Command {
            head,
            lun,
            hdr_len,
            data_out_len,
            data_in_len,
        } = *cmd;
        // A medium command comes from a logical unit that exists.
        let lun_index = lun.unwrap_or(0);
        let resp_len = (CMD_RESP_FIXED + self.sense_size) as u64;
        let (kind, io_kind, lba, needed, have) = match op {
            MediumOp::Read { lba, bytes, .. } => {
                (OpKind::Read, IoKind::Read, lba, bytes, data_in_len)
            }
            MediumOp::Write { lba, bytes, .. } => {
                (OpKind::Write, IoKind::Write, lba, bytes, data_out_len)
            }
            MediumOp::Flush { lba, .. } => (OpKind::Write, IoKind::Flush, lba, 0, 0),
            MediumOp::WriteSame { lba, .. } => (OpKind::Write, IoKind::WriteZeroes, lba, 0, 0),
            MediumOp::Unmap(_) => (OpKind::Other, IoKind::Discard, 0, 0, 0),
        };
        if have < needed {
            let d = ring.device();
            DeviceMetrics::bump(&d.metrics.overruns);
            guest_warn!(
                d.limiter,
                device = d.id,
                vq = ring.key().vq,
                "data buffer of {have} bytes for a {needed}-byte transfer: overrun"
            );
            self.respond_transport(ring, mem, head, Response::Overrun, saturating_u32(have));
            return;
        }
        let Some(slot) = self.inflight.claim(head, mem.map()) else {
            return;
        };
        slot.writable.extend_from_slice(&self.chain.writable);
        slot.writable_len = self.chain.writable_len;
        slot.resp_len = self.chain.writable_len.min(resp_len);
        slot.kind = kind;
        slot.io = io_kind;
        slot.lba = lba;
        slot.buffer_len = have;
        slot.transfer = needed;
        let io = &mut self.luns[lun_index];
        slot.lun = io.lun;
        let tag = u64::from(head);
        match op {
            MediumOp::Read { offset, bytes, .. } | MediumOp::Write { offset, bytes, .. } => {
                let (segs, at) = if kind == OpKind::Read {
                    (&self.chain.writable, resp_len)
                } else {
                    (&self.chain.readable, hdr_len)
                };
                if stream::iovecs(mem, segs, at, bytes, &mut slot.iov).is_err() {
                    slot.error = Some(ScsiError::InternalTargetFailure);
                } else {
                    let io_op = match op {
                        MediumOp::Write { fua, .. } => IoOp::Write { offset, fua },
                        _ => IoOp::Read { offset },
                    };
                    if !(io.qos.on() && hold(&mut self.held, io, head, io_op, bytes)) {
                        submit(io, slot, tag, io_op, true);
                    }
                }
            }
            MediumOp::Flush { .. } => {
                if !(io.qos.on() && hold(&mut self.held, io, head, IoOp::Flush, 0)) {
                    submit(io, slot, tag, IoOp::Flush, false);
                }
            }
            MediumOp::Unmap(list) => {
                // Only commands done in slices keep their backstore (a
                // reference count per request is not free).
                slot.backstore = Some(Arc::clone(&io.backstore));
                slot.ranges.extend(list.iter().map(|r| (r.offset, r.bytes)));
                slot.range_bytes = list.iter().map(|r| r.bytes).sum();
                slot.range_op = RangeOp::Discard;
                // Counted against the LUN's limit, not held (a discard
                // carries no data to pace).
                io.qos.charge(pass::now(), 0);
                submit_slice(io, slot, tag);
            }
            MediumOp::WriteSame {
                offset,
                blocks,
                unmap,
                fua,
                pattern,
                ..
            } => {
                slot.backstore = Some(Arc::clone(&io.backstore));
                // Block size and discard behaviour, which a resize does not
                // change.
                let geometry = io.backstore.geometry();
                let bs = u64::from(geometry.block_size);
                let zeros = pattern.is_none_or(|p| p.iter().all(|b| *b == 0));
                slot.range_op =
                    if zeros && unmap && geometry.supports_unmap && geometry.unmapped_reads_zero {
                        RangeOp::Discard
                    } else if zeros {
                        RangeOp::WriteZeroes
                    } else {
                        RangeOp::Pattern { fua }
                    };
                slot.io = match slot.range_op {
                    RangeOp::Discard => IoKind::Discard,
                    RangeOp::WriteZeroes => IoKind::WriteZeroes,
                    RangeOp::Pattern { .. } => IoKind::Write,
                };
                if let (RangeOp::Pattern { .. }, Some(p)) = (slot.range_op, pattern) {
                    // The pattern replicated over at most PATTERN_BYTES
                    // (whole blocks): each slice writes from it.
                    let copies = (PATTERN_BYTES / bs).clamp(1, u64::from(blocks));
                    slot.pattern.clear();
                    for _ in 0..copies {
                        slot.pattern.extend_from_slice(p);
                    }
                }
                slot.ranges.push((offset, u64::from(blocks) * bs));
                slot.range_bytes = u64::from(blocks) * bs;
                io.qos.charge(pass::now(), 0);
                submit_slice(io, slot, tag);
            }
        }
        if slot.pending_ops == 0 && self.held.back().is_none_or(|h| h.head != head) {
            // Nothing reached the backstore (an empty UNMAP list or a
            // submission failure) and no limit holds it: complete now.
            self.complete_slot(ring, mem, head);
        }
    }

    /// Whether a request its LUN's limit holds may go now.
    pub(crate) fn held_ready(&self, now: u64) -> bool {
        if self.held_flush && !self.held.is_empty() {
            return true;
        }
        self.held.iter().any(|h| {
            (self.luns.iter())
                .find(|l| l.lun == h.lun)
                .is_none_or(|l| l.qos.wait(now).is_none())
        })
    }

    /// Sends the backstore operations of the held requests their LUN's
    /// limit lets go (all of them with `all`, or after a drain began: a
    /// queue that stops, or a task management function, does not wait
    /// for a limit), each LUN's in the order they came; a request whose
    /// LUN went away fails. Allocates nothing.
    pub(crate) fn release_held(&mut self, ring: &mut Vring, mem: Batch<'_>, all: bool) {
        if self.held.is_empty() {
            return;
        }
        let all = all || std::mem::take(&mut self.held_flush);
        let now = pass::now();
        let Self {
            held,
            luns,
            inflight,
            sense_size,
            ..
        } = self;
        // Once a LUN's limit holds one request it holds every later one
        // of that LUN in this pass (nothing is charged back), so each
        // LUN's requests go in order.
        held.retain(|h| {
            let Some(io) = luns.iter_mut().find(|l| l.lun == h.lun) else {
                if let Some(slot) = inflight.get_mut(h.head) {
                    slot.error = Some(ScsiError::LogicalUnitNotSupported);
                }
                complete_request(inflight, ring, mem, *sense_size, h.head, None);
                return false;
            };
            if !all && io.qos.wait(now).is_some() {
                return true;
            }
            io.qos.charge(now, h.bytes);
            if let Some(slot) = inflight.get_mut(h.head) {
                let with_iov = !matches!(h.op, IoOp::Flush);
                submit(io, slot, u64::from(h.head), h.op, with_iov);
                if slot.pending_ops == 0 {
                    complete_request(inflight, ring, mem, *sense_size, h.head, Some(&io.stats));
                }
            }
            false
        });
    }

    /// Reaps the completions of one LUN's backstore queue. A request with
    /// slices left is put on the resume list instead of completing: its
    /// next slice goes out on the worker's next pass, after every other
    /// queue had its turn.
    pub(crate) fn reap(&mut self, ring: &mut Vring, lun: usize, mem: Batch<'_>) {
        let Some(l) = self.luns.get_mut(lun) else {
            return;
        };
        if l.io.in_flight() == 0 {
            return;
        }
        let inflight = &mut self.inflight;
        let resume = &mut self.resume;
        let sense_size = self.sense_size;
        let stats = &l.stats;
        l.io.reap(&mut |tag, result| {
            let Some(head) = u16::try_from(tag).ok() else {
                return;
            };
            let Some(slot) = inflight.get_mut(head) else {
                return;
            };
            if let Err(e) = result {
                fail(slot, &e);
            }
            slot.pending_ops = slot.pending_ops.saturating_sub(1);
            if slot.pending_ops > 0 {
                return;
            }
            if slot.error.is_none() && slot.has_slices_left() {
                resume.push(head);
            } else {
                complete_request(inflight, ring, mem, sense_size, head, Some(stats));
            }
        });
    }

    /// Whether requests wait for their next slice.
    pub(crate) fn has_slices_pending(&self) -> bool {
        !self.resume.is_empty()
    }

    /// Submits the next slice of every request on the resume list (the
    /// runtime then commits, reaps and publishes).
    pub(crate) fn resume_slices(&mut self, ring: &mut Vring, mem: Batch<'_>) {
        let mut heads = std::mem::take(&mut self.resume);
        for &head in &heads {
            let Some(slot) = self.inflight.get_mut(head) else {
                continue;
            };
            let lun = slot
                .backstore
                .as_ref()
                .and_then(|b| self.luns.iter().position(|l| Arc::ptr_eq(&l.backstore, b)));
            match lun {
                Some(i) => submit_slice(&mut self.luns[i], slot, u64::from(head)),
                // The LUN was removed between two slices.
                None => slot.error = Some(ScsiError::LogicalUnitNotSupported),
            }
            if slot.pending_ops == 0 {
                self.complete_slot(ring, mem, head);
            }
        }
        heads.clear();
        // Keeps the allocation; reaps may add to it.
        self.resume = heads;
    }

    fn complete_slot(&mut self, ring: &mut Vring, mem: Batch<'_>, head: u16) {
        let lun = self.inflight.get_mut(head).map(|s| s.lun);
        let stats = (self.luns.iter())
            .find(|l| Some(l.lun) == lun)
            .map(|l| &*l.stats);
        complete_request(&mut self.inflight, ring, mem, self.sense_size, head, stats);
    }
}

/// Writes the response of a request whose backstore work is done and frees
/// its slot.
fn complete_request(
    inflight: &mut Inflight,
    ring: &mut Vring,
    mem: Batch<'_>,
    sense_size: usize,
    head: u16,
    stats: Option<&LunSlot>,
) {
    let Some(slot) = inflight.get_mut(head) else {
        return;
    };
    if let Some(s) = stats {
        let bytes = slot.transfer.max(slot.range_bytes);
        s.record(slot.io, bytes, slot.error.is_none(), ring.service_ns(head));
    }
    if slot.kind == OpKind::Read {
        // What the backstore wrote through the iovecs, whatever its
        // result (a failed read may have written part).
        stream::mark_written(mem, &slot.writable, slot.resp_len, slot.transfer);
    }
    let (resp, sense, data) = match &slot.error {
        None => {
            let data = match slot.kind {
                OpKind::Read => {
                    ring.transferred(slot.transfer, 0);
                    slot.transfer
                }
                OpKind::Write => {
                    ring.transferred(0, slot.transfer);
                    0
                }
                OpKind::Other => 0,
            };
            let residual = saturating_u32(slot.buffer_len - slot.transfer);
            (
                CmdResp::completed(Status::Good.code(), residual),
                None,
                data,
            )
        }
        Some(e) => {
            let d = ring.device();
            d.metrics.count_backstore_failure(slot.ceph_failure);
            if d.events.wanted() {
                d.events.publish(Event::IoError {
                    device: d.id,
                    lun: slot.lun,
                    op: slot.io,
                    lba: slot.lba,
                    bytes: slot.transfer,
                    error: if slot.cause.is_empty() {
                        e.to_string()
                    } else {
                        slot.cause.clone()
                    },
                });
            }
            let (status, sense, n) = scsi_failure(e);
            let resp = CmdResp::completed(status, saturating_u32(slot.buffer_len));
            (resp, Some((sense, n)), 0)
        }
    };
    let sense = sense.as_ref().map_or(&[][..], |(s, n)| &s[..*n]);
    let len = write_response(
        mem,
        &slot.writable,
        slot.writable_len,
        sense_size,
        resp,
        sense,
    )
    .map_or(0, |r| r + data);
    ring.complete(mem, head, saturating_u32(len));
    inflight.release(head);
}

/// Holds the request at `head` (`op` of `bytes` on `io`'s LUN) if its
/// LUN's limit, or an earlier request of that LUN held, says so; charges
/// it otherwise (it goes now). Called only for a LUN with a limit
/// (`io.qos.on()`, checked by the caller: without a limit a request
/// costs that one load, not a call).
fn hold(held: &mut VecDeque<Held>, io: &LunQueue, head: u16, op: IoOp, bytes: u64) -> bool {
    let now = pass::now();
    if io.qos.wait(now).is_some() || held.iter().any(|h| h.lun == io.lun) {
        held.push_back(Held {
            head,
            lun: io.lun,
            op,
            bytes,
        });
        return true;
    }
    io.qos.charge(now, bytes);
    false
}

/// Queues one backstore operation for `slot` (with its iovecs when
/// `with_iov`).
fn submit(io: &mut LunQueue, slot: &mut Slot, tag: u64, op: IoOp, with_iov: bool) {
    let iov: &[libc::iovec] = if with_iov { &slot.iov } else { &[] };
    // SAFETY: the iovecs point into guest memory kept mapped by the pin
    // `slot.mem` (given back when the slot is released), or into
    // `slot.pattern`, both alive and unchanged until
    // the slot's operation is reaped (the slot is released, or resumed,
    // only after that); `slot.iov` is not modified meanwhile.
    match unsafe { io.io.submit(tag, op, iov) } {
        Ok(()) => {
            slot.pending_ops += 1;
            io.pending.queued();
        }
        Err(e) => fail(slot, &e),
    }
}

/// Records a backstore failure of `slot`'s request, unless an earlier
/// one is recorded already (the request reports its first).
fn fail(slot: &mut Slot, e: &BackstoreError) {
    if slot.error.is_none() {
        slot.error = Some(medium_error(slot.kind, slot.lba, e));
        slot.ceph_failure = matches!(e, BackstoreError::CephIo(_));
        slot.cause.clear();
        let _ = write!(slot.cause, "{e}");
    }
}

/// Queues the next slice of a range operation (UNMAP, WRITE SAME): at
/// most [`SLICE_BYTES`] of a discard or zeroing, or one pattern buffer of
/// a pattern write. One slice per request is in flight at a time, so a
/// queue never has more backstore operations than requests.
fn submit_slice(io: &mut LunQueue, slot: &mut Slot, tag: u64) {
    while slot.ranges.get(slot.next_range).is_some_and(|r| r.1 == 0) {
        slot.next_range += 1;
    }
    let Some(&(offset, len)) = slot.ranges.get(slot.next_range) else {
        return;
    };
    let limit = match slot.range_op {
        RangeOp::Pattern { .. } => slot.pattern.len() as u64,
        RangeOp::Discard | RangeOp::WriteZeroes => SLICE_BYTES,
    };
    let take = len.min(limit);
    if take == len {
        slot.next_range += 1;
    } else {
        slot.ranges[slot.next_range] = (offset + take, len - take);
    }
    let op = match slot.range_op {
        RangeOp::Discard => IoOp::Discard { offset, len: take },
        RangeOp::WriteZeroes => IoOp::WriteZeroes { offset, len: take },
        RangeOp::Pattern { fua } => {
            slot.iov.clear();
            slot.iov.push(libc::iovec {
                iov_base: slot.pattern.as_mut_ptr().cast(),
                iov_len: usize::try_from(take).unwrap_or(0),
            });
            IoOp::Write { offset, fua }
        }
    };
    let with_iov = matches!(slot.range_op, RangeOp::Pattern { .. });
    submit(io, slot, tag, op, with_iov);
}
