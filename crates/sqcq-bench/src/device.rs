//! Bringing the device up for a run: connect, share memory, start the
//! queues, identify the LUN; and taking it down cleanly.

use std::time::Duration;

use sqcq_driver::frontend::{CONTROL_QUEUE, EVENT_QUEUE, FIRST_REQUEST_QUEUE};
use sqcq_driver::scsi::data::parse_report_luns;
use sqcq_driver::scsi::{
    Capacity, Cdb, Command, CommandError, ControlQueue, Data, Done, Inquiry, Lun, ScsiQueue, sense,
};
use sqcq_driver::sqcq::{PollGroup, PollGroupBuilder, PollStats, PollThreads, parked_queue};
use sqcq_driver::{
    Buffer, DriverMemory, Frontend, FrontendConfig, Negotiated, NotifyMode, QueueConfig,
    QueueEvents, SplitQueue, Virtqueue,
};
use sqcq_protocol::SpinConfig;
use virtio_bindings::virtio_ring::{
    VIRTIO_RING_F_EVENT_IDX as EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC as INDIRECT_DESC,
};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::error::BenchError;

/// Size of the control and event queues.
const SMALL_QUEUE: u16 = 16;
/// Entries per indirect table: request header, data, response, and one
/// spare.
const INDIRECT_MAX: u16 = 4;
/// Bytes for the set-up commands' data.
const SCRATCH: usize = 4096;
/// Tries of TEST UNIT READY while the LUN reports a unit attention.
const TUR_TRIES: usize = 5;

/// What the run needs of the device.
#[derive(Debug, Clone)]
pub struct DeviceSpec {
    /// Request queues (one per job).
    pub queues: u16,
    /// Descriptors per request queue.
    pub queue_size: u16,
    /// I/Os in flight per queue.
    pub iodepth: u16,
    /// Bytes of data buffer per I/O.
    pub bs: u64,
    /// Notification mode of the request queues.
    pub mode: NotifyMode,
    /// Driver poll threads of the doorbell modes.
    pub poll_threads: PollThreads,
    /// Negotiate EVENT_IDX if offered.
    pub event_idx: bool,
    /// Negotiate indirect descriptors if offered.
    pub indirect: bool,
    /// Bound on every wait.
    pub timeout: Duration,
    /// The LUN.
    pub lun: Lun,
}

/// One job's request queue and its data buffers.
#[derive(Debug)]
pub struct JobQueue {
    /// The queue.
    pub queue: ScsiQueue,
    /// `iodepth` buffers of `bs` bytes.
    pub buffers: Vec<GuestAddress>,
}

/// What the LUN said about itself.
#[derive(Debug, Clone)]
pub struct LunInfo {
    /// Standard INQUIRY data.
    pub inquiry: Option<Inquiry>,
    /// Its capacity.
    pub capacity: Capacity,
    /// LUNs REPORT LUNS listed.
    pub luns: usize,
}

/// A doorbell mode asked of a device that does not offer
/// VIRTIO_F_SQCQ_POLL, run as `notify` instead.
#[derive(Debug, Clone)]
pub struct ModeFallback {
    /// The mode asked for.
    pub requested: NotifyMode,
    /// The mode run.
    pub used: NotifyMode,
    /// Why.
    pub reason: String,
}

/// A device ready to run jobs.
#[derive(Debug)]
pub struct Device {
    frontend: Frontend,
    /// The driver poll threads of the sqcq mode.
    poll: Option<PollGroup>,
    /// The figures of the request queues' driver-side pollers (poll
    /// threads or the jobs' own), in the polling modes.
    stats: Option<PollStats>,
    /// The mode the request queues run.
    pub mode: NotifyMode,
    /// Set when the mode asked for was not available.
    pub fallback: Option<ModeFallback>,
    /// Kept for the run: it holds the memfd the device maps.
    _mem: DriverMemory,
    /// Kept running for task management; not used by the jobs.
    _control: ControlQueue,
    _event: Virtqueue,
    /// The guest memory, for the jobs' data.
    pub guest: GuestMemoryMmap,
    /// One per job.
    pub queues: Vec<JobQueue>,
    /// The LUN.
    pub info: LunInfo,
}

impl Device {
    /// Connects to `socket` and sets everything up.
    pub fn open(socket: &std::path::Path, spec: &DeviceSpec) -> Result<Self, BenchError> {
        let mut frontend = Frontend::connect(&FrontendConfig {
            socket: socket.to_owned(),
            device: sqcq_driver::DeviceType::Scsi,
            event_idx: spec.event_idx,
            indirect: spec.indirect,
            extra_features: spec.mode.required_features(),
            timeout: spec.timeout,
        })?;
        let neg = frontend.negotiated().clone();
        let missing = spec.mode.required_features() & !neg.acked;
        let (mode, fallback) = if missing == 0 {
            (spec.mode, None)
        } else {
            let reason = format!(
                "the device does not offer VIRTIO_F_SQCQ_POLL (feature bit {}; offered {:#x})",
                sqcq_protocol_bit(),
                neg.offered
            );
            let used = NotifyMode::Notify;
            (
                used,
                Some(ModeFallback {
                    requested: spec.mode,
                    used,
                    reason,
                }),
            )
        };
        let available = neg.request_queues();
        if spec.queues > available {
            return Err(BenchError::Usage(format!(
                "the device offers {available} request queue(s); --numjobs {} needs one per job",
                spec.queues
            )));
        }
        let indirect_max = if neg.has(INDIRECT_DESC) {
            INDIRECT_MAX
        } else {
            0
        };
        let per_request = if indirect_max > 0 { 1 } else { 3 };
        if u32::from(spec.iodepth) * per_request > u32::from(spec.queue_size) {
            return Err(BenchError::Usage(format!(
                "--iodepth {} needs {} descriptors; --queue-size is {}",
                spec.iodepth,
                u32::from(spec.iodepth) * per_request,
                spec.queue_size
            )));
        }
        let mut mem = DriverMemory::new(memory_size(spec)?)?;
        let config = |size| QueueConfig::negotiated(size, neg.acked, indirect_max);
        let events = |frontend: &Frontend| -> Result<QueueEvents, BenchError> {
            QueueEvents::new(Some(frontend.hangup_fd()?), spec.timeout).map_err(BenchError::Eventfd)
        };
        // With VIRTIO_F_SQCQ_POLL the control and event queues keep the
        // doorbell protocol without a poller (spec 4.5).
        let small_queue = |mem: &mut DriverMemory, index| -> Result<Virtqueue, BenchError> {
            let events = events(&frontend)?;
            Ok(if mode.doorbells() {
                let ring = SplitQueue::new(mem, config(SMALL_QUEUE))?;
                parked_queue(mem, index, ring, events)?
            } else {
                Virtqueue::new(mem, index, config(SMALL_QUEUE), NotifyMode::Notify, events)?
            })
        };
        let control_vq = small_queue(&mut mem, CONTROL_QUEUE)?;
        let event = small_queue(&mut mem, EVENT_QUEUE)?;
        let mut queues = Vec::new();
        let mut stats = PollStats::default();
        let mut poll = mode
            .doorbells()
            .then(|| PollGroupBuilder::new(spec.poll_threads, SpinConfig::default()));
        for i in 0..spec.queues {
            let index = FIRST_REQUEST_QUEUE + i;
            let mut events = events(&frontend)?;
            let vq = match &mut poll {
                Some(poll) => {
                    let ring = SplitQueue::new(&mut mem, config(spec.queue_size))?;
                    let inline = mode == NotifyMode::SqcqInline;
                    let notifier = poll.attach(&mem, index, &ring, &mut events, inline)?;
                    Virtqueue::with_notifier(index, ring, notifier, events)
                }
                None => Virtqueue::new(&mut mem, index, config(spec.queue_size), mode, events)?,
            };
            if let Some(handle) = vq.stats_handle() {
                stats.extend(handle);
            }
            let config = neg
                .scsi_config()
                .ok_or(BenchError::Protocol("not a virtio-scsi device"))?;
            let queue = ScsiQueue::new(&mut mem, vq, config)?;
            let len =
                usize::try_from(spec.bs).map_err(|_| BenchError::Usage("--bs too large".into()))?;
            let buffers = (0..spec.iodepth)
                .map(|_| mem.alloc(len, 4096))
                .collect::<Result<Vec<_>, _>>()?;
            queues.push(JobQueue { queue, buffers });
        }
        // Running before any request: the set-up commands below complete
        // through it too.
        let poll = poll.map(PollGroupBuilder::start).transpose()?;
        let control = ControlQueue::new(&mut mem, control_vq)?;
        let scratch = mem.alloc(SCRATCH, 4096)?;

        frontend.set_mem_table(&mem)?;
        frontend.start_queue(&mem, control.virtqueue())?;
        frontend.start_queue(&mem, &event)?;
        for q in &queues {
            frontend.start_queue(&mem, q.queue.virtqueue())?;
        }
        frontend.sync()?;
        let guest = mem.guest_memory().clone();
        let first = &mut queues
            .first_mut()
            .ok_or_else(|| BenchError::Usage("--numjobs must be at least 1".into()))?
            .queue;
        let info = identify(first, &guest, scratch, spec.lun)?;
        Ok(Self {
            frontend,
            poll,
            stats: (!stats.is_empty()).then_some(stats),
            mode,
            fallback,
            _mem: mem,
            _control: control,
            _event: event,
            guest,
            queues,
            info,
        })
    }

    /// What was negotiated.
    pub fn negotiated(&self) -> &Negotiated {
        self.frontend.negotiated()
    }

    /// The statistics of the request queues' driver-side pollers (the
    /// poll threads of sqcq, the jobs themselves in poll-queue, ring-poll
    /// and sqcq-inline); `None` in notify.
    pub fn poll_stats(&self) -> Option<PollStats> {
        self.stats.clone()
    }

    /// Takes the vrings back and disconnects, then stops the driver poll
    /// threads (the device no longer touches the doorbells).
    pub fn close(self) -> Result<(), BenchError> {
        let stopped = self.frontend.stop();
        if let Some(poll) = self.poll {
            poll.stop();
        }
        stopped?;
        Ok(())
    }
}

fn memory_size(spec: &DeviceSpec) -> Result<usize, BenchError> {
    const MIB: u64 = 1 << 20;
    let data = spec
        .bs
        .checked_mul(u64::from(spec.iodepth))
        .and_then(|d| d.checked_mul(u64::from(spec.queues)));
    // Rings, indirect tables and headers: well under 1 MiB per queue of up
    // to a few thousand descriptors.
    let queue_bytes = u64::from(spec.queue_size) * (16 * 6 + 400) + MIB;
    let total = data
        .and_then(|d| d.checked_add(queue_bytes * (u64::from(spec.queues) + 2)))
        .and_then(|t| t.checked_add(2 * MIB))
        .map(|t| t.next_multiple_of(2 * MIB))
        .and_then(|t| usize::try_from(t).ok());
    total.ok_or_else(|| BenchError::Usage("--bs x --iodepth x --numjobs is too large".into()))
}

/// Runs one command to completion on an otherwise idle queue.
pub fn run_sync(
    queue: &mut ScsiQueue,
    lun: Lun,
    cdb: Cdb,
    data: Data<'_>,
) -> Result<Result<Done, CommandError>, BenchError> {
    let mut result = None;
    queue.submit(&Command::new(lun, cdb, data), u64::MAX)?;
    queue.publish(|c| result = Some(c.result))?;
    while result.is_none() {
        queue.wait_and_reap(|c| result = Some(c.result))?;
    }
    result.ok_or(BenchError::Protocol("a command vanished"))
}

fn identify(
    queue: &mut ScsiQueue,
    guest: &GuestMemoryMmap,
    scratch: GuestAddress,
    lun: Lun,
) -> Result<LunInfo, BenchError> {
    let read = |len: usize| -> Result<Vec<u8>, BenchError> {
        let mut out = vec![0; len.min(SCRATCH)];
        guest
            .read_slice(&mut out, scratch)
            .map_err(BenchError::Memory)?;
        Ok(out)
    };
    let buf = |len: u32| [Buffer::new(scratch, len)];
    let transferred =
        |done: Done, len: u32| usize::try_from(len.saturating_sub(done.resid)).unwrap_or(0);

    let mut tur = Ok(Done { resid: 0 });
    for _ in 0..TUR_TRIES {
        tur = run_sync(queue, lun, Cdb::test_unit_ready(), Data::None)?;
        match &tur {
            Err(CommandError::Status { sense: Some(s), .. })
                if s.key == sense::UNIT_ATTENTION || s.key == sense::NOT_READY => {}
            _ => break,
        }
    }
    tur.map_err(|e| BenchError::Command {
        what: format!("TEST UNIT READY to LUN {lun}"),
        source: e,
    })?;

    let inquiry = match run_sync(
        queue,
        lun,
        Cdb::inquiry(None, 96),
        Data::FromDevice(&buf(96)),
    )? {
        Ok(done) => Inquiry::parse(&read(transferred(done, 96))?),
        Err(_) => None,
    };

    let cap16 = run_sync(
        queue,
        lun,
        Cdb::read_capacity_16(32),
        Data::FromDevice(&buf(32)),
    )?;
    let capacity = match cap16 {
        Ok(done) => Capacity::parse_16(&read(transferred(done, 32))?),
        Err(_) => None,
    };
    let capacity = match capacity {
        Some(c) => c,
        None => {
            let done = run_sync(
                queue,
                lun,
                Cdb::read_capacity_10(),
                Data::FromDevice(&buf(8)),
            )?
            .map_err(|e| BenchError::Command {
                what: format!("READ CAPACITY to LUN {lun}"),
                source: e,
            })?;
            Capacity::parse_10(&read(transferred(done, 8))?).ok_or(BenchError::Protocol(
                "READ CAPACITY returned no usable capacity",
            ))?
        }
    };
    if capacity.block_size == 0 || !capacity.block_size.is_power_of_two() {
        return Err(BenchError::Protocol(
            "the LUN's block size is not a power of two",
        ));
    }
    let luns = match run_sync(
        queue,
        lun,
        Cdb::report_luns(1024),
        Data::FromDevice(&buf(1024)),
    )? {
        Ok(done) => parse_report_luns(&read(transferred(done, 1024))?).len(),
        Err(_) => 0,
    };
    Ok(LunInfo {
        inquiry,
        capacity,
        luns,
    })
}

fn sqcq_protocol_bit() -> u32 {
    sqcq_protocol::VIRTIO_F_SQCQ_POLL
}

/// Whether EVENT_IDX was negotiated.
pub fn has_event_idx(neg: &Negotiated) -> bool {
    neg.has(EVENT_IDX)
}

/// Whether indirect descriptors were negotiated.
pub fn has_indirect(neg: &Negotiated) -> bool {
    neg.has(INDIRECT_DESC)
}
