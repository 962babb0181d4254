//! Bringing the device up for a run: connect, share memory, start the
//! queues, identify the LUN (virtio-scsi) or the disk (virtio-blk); and
//! taking it down cleanly.

use std::sync::Arc;
use std::time::Duration;

use sqcq_driver::blk::{self, BlkConfig, BlkQueue, ID_BYTES, Request, SECTOR_SIZE};
use sqcq_driver::frontend::{CONTROL_QUEUE, EVENT_QUEUE};
use sqcq_driver::scsi::data::parse_report_luns;
use sqcq_driver::scsi::{
    Capacity, Cdb, CdbSize, Command, CommandError, ControlQueue, Data, Done, Inquiry, Lun,
    ScsiQueue, sense,
};
use sqcq_driver::sqcq::{PollGroup, PollGroupBuilder, PollStats, PollThreads, parked_queue};
use sqcq_driver::{
    Buffer, DeviceType, DriverMemory, Frontend, FrontendConfig, MemoryConfig, Negotiated,
    NotifyMode, QueueConfig, QueueEvents, Ring, Virtqueue,
};
use sqcq_protocol::SpinConfig;
use virtio_bindings::virtio_config::VIRTIO_F_RING_PACKED;
use virtio_bindings::virtio_ring::{
    VIRTIO_RING_F_EVENT_IDX as EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC as INDIRECT_DESC,
};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::error::BenchError;
use crate::io::IoQueue;
use crate::link::Link;

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
    /// virtio-scsi or virtio-blk.
    pub device: DeviceType,
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
    /// Packed rings (VIRTIO_F_RING_PACKED), which the device must offer.
    pub packed: bool,
    /// Back the driver memory with huge pages.
    pub huge_pages: bool,
    /// Bound on every wait.
    pub timeout: Duration,
    /// The LUN (virtio-scsi).
    pub lun: Lun,
    /// CDB size of READ/WRITE (virtio-scsi).
    pub cdb: CdbSize,
    /// FUA on writes (virtio-scsi).
    pub fua: bool,
    /// Follow the device across restarts, retrying a connection this long
    /// (see [`crate::link`]).
    pub reconnect: Option<Duration>,
}

/// One job's request queue and its data buffers.
#[derive(Debug)]
pub struct JobQueue {
    /// The queue.
    pub queue: IoQueue,
    /// `iodepth` buffers of `bs` bytes.
    pub buffers: Vec<GuestAddress>,
}

/// What the LUN or disk said about itself.
#[derive(Debug, Clone)]
pub struct LunInfo {
    /// Standard INQUIRY data (virtio-scsi).
    pub inquiry: Option<Inquiry>,
    /// Its capacity.
    pub capacity: Capacity,
    /// LUNs REPORT LUNS listed (virtio-scsi).
    pub luns: usize,
    /// The GET_ID answer (virtio-blk), when the device gave one.
    pub serial: Option<String>,
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
    /// The connection, shared with the jobs.
    pub link: Arc<Link>,
    /// The driver poll threads of the sqcq mode.
    poll: Option<PollGroup>,
    /// The figures of the request queues' driver-side pollers (poll
    /// threads or the jobs' own), in the polling modes.
    stats: Option<PollStats>,
    /// The mode the request queues run.
    pub mode: NotifyMode,
    /// Set when the mode asked for was not available.
    pub fallback: Option<ModeFallback>,
    /// virtio-scsi's control queue, kept running for task management,
    /// and its event queue; not used by the jobs.
    _control: Option<(ControlQueue, Virtqueue)>,
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
        let frontend_config = FrontendConfig {
            socket: socket.to_owned(),
            device: spec.device,
            event_idx: spec.event_idx,
            indirect: spec.indirect,
            extra_features: spec.mode.required_features()
                | if spec.packed {
                    1 << VIRTIO_F_RING_PACKED
                } else {
                    0
                }
                | match spec.device {
                    DeviceType::Scsi => 0,
                    DeviceType::Blk => blk::FEATURES,
                },
            timeout: spec.timeout,
            inflight: spec.reconnect.is_some(),
        };
        let mut frontend = Frontend::connect(&frontend_config)?;
        let neg = frontend.negotiated().clone();
        if spec.packed && neg.acked & (1 << VIRTIO_F_RING_PACKED) == 0 {
            return Err(BenchError::Usage(format!(
                "--ring packed: the device does not offer VIRTIO_F_RING_PACKED (offered {:#x}; \
                 sqcqd offers it with --packed)",
                neg.offered
            )));
        }
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
        let mut mem = DriverMemory::with_config(&MemoryConfig {
            huge_pages: spec.huge_pages,
            ..MemoryConfig::new(memory_size(spec)?)
        })?;
        let config = |size| QueueConfig::negotiated(size, neg.acked, indirect_max);
        let events = |frontend: &Frontend| -> Result<QueueEvents, BenchError> {
            QueueEvents::new(Some(frontend.hangup_fd()?), spec.timeout).map_err(BenchError::Eventfd)
        };
        // With VIRTIO_F_SQCQ_POLL the control and event queues keep the
        // doorbell protocol without a poller (spec 4.5).
        let small_queue = |mem: &mut DriverMemory, index| -> Result<Virtqueue, BenchError> {
            let events = events(&frontend)?;
            Ok(if mode.doorbells() {
                let ring = Ring::new(mem, config(SMALL_QUEUE))?;
                parked_queue(mem, index, ring, events)?
            } else {
                Virtqueue::new(mem, index, config(SMALL_QUEUE), NotifyMode::Notify, events)?
            })
        };
        let control_vqs = match spec.device {
            DeviceType::Scsi => Some((
                small_queue(&mut mem, CONTROL_QUEUE)?,
                small_queue(&mut mem, EVENT_QUEUE)?,
            )),
            DeviceType::Blk => None,
        };
        let mut queues = Vec::new();
        let mut stats = PollStats::default();
        let mut poll = mode
            .doorbells()
            .then(|| PollGroupBuilder::new(spec.poll_threads, SpinConfig::default()));
        for i in 0..spec.queues {
            let index = spec.device.first_request_queue() + i;
            let mut events = events(&frontend)?;
            let vq = match &mut poll {
                Some(poll) => {
                    let ring = Ring::new(&mut mem, config(spec.queue_size))?;
                    let inline = mode == NotifyMode::SqcqInline;
                    let notifier = poll.attach(&mem, index, &ring, &mut events, inline)?;
                    Virtqueue::with_notifier(index, ring, notifier, events)
                }
                None => Virtqueue::new(&mut mem, index, config(spec.queue_size), mode, events)?,
            };
            if let Some(handle) = vq.stats_handle() {
                stats.extend(handle);
            }
            let queue = match (&neg.config, spec.device) {
                (sqcq_driver::DeviceConfig::Blk(config), DeviceType::Blk) => IoQueue::Blk {
                    queue: BlkQueue::new(&mut mem, vq)?,
                    sectors_per_block: u64::from(block_size(&neg, config)?) / SECTOR_SIZE,
                },
                (sqcq_driver::DeviceConfig::Scsi(config), DeviceType::Scsi) => IoQueue::Scsi {
                    queue: ScsiQueue::new(&mut mem, vq, config)?,
                    lun: spec.lun,
                    cdb: spec.cdb,
                    fua: spec.fua,
                },
                _ => {
                    return Err(BenchError::Protocol(
                        "the configuration is another device's",
                    ));
                }
            };
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
        let control = control_vqs
            .map(|(control, event)| -> Result<_, BenchError> {
                Ok((ControlQueue::new(&mut mem, control)?, event))
            })
            .transpose()?;
        let scratch = mem.alloc(SCRATCH, 4096)?;

        frontend.set_mem_table(&mem)?;
        let record = match spec.reconnect {
            Some(timeout) => {
                let vrings = u16::try_from(neg.vrings).unwrap_or(u16::MAX);
                let record = frontend.track_inflight(vrings, spec.queue_size)?;
                for q in &mut queues {
                    q.queue.survive_hangup(true);
                }
                Some((frontend_config, timeout, record))
            }
            None => None,
        };
        if let Some((control, event)) = &control {
            frontend.start_queue(&mem, control.virtqueue())?;
            frontend.start_queue(&mem, event)?;
        }
        for q in &queues {
            frontend.start_queue(&mem, q.queue.virtqueue())?;
        }
        frontend.sync()?;
        let guest = mem.guest_memory().clone();
        let first = &mut queues
            .first_mut()
            .ok_or_else(|| BenchError::Usage("--numjobs must be at least 1".into()))?
            .queue;
        let info = match first {
            IoQueue::Scsi { queue, .. } => identify(queue, &guest, scratch, spec.lun)?,
            IoQueue::Blk { queue, .. } => {
                let config = neg.blk_config().ok_or(BenchError::Protocol(
                    "the configuration is another device's",
                ))?;
                identify_blk(queue, &guest, scratch, &neg, config)?
            }
        };
        Ok(Self {
            link: Arc::new(Link::new(frontend, mem, record)),
            poll,
            stats: (!stats.is_empty()).then_some(stats),
            mode,
            fallback,
            _control: control,
            guest,
            queues,
            info,
        })
    }

    /// What was negotiated.
    pub fn negotiated(&self) -> &Negotiated {
        self.link.negotiated()
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
        let stopped = self.link.close();
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
        serial: None,
    })
}

/// The logical block size of a virtio-blk disk: `blk_size` with
/// VIRTIO_BLK_F_BLK_SIZE, else 512; a power of two of at least 512.
fn block_size(neg: &Negotiated, config: &BlkConfig) -> Result<u32, BenchError> {
    let size = if neg.has(blk::VIRTIO_BLK_F_BLK_SIZE) {
        config.blk_size
    } else {
        512
    };
    if size < 512 || !size.is_power_of_two() {
        return Err(BenchError::Protocol(
            "the disk's block size is not a power of two of at least 512",
        ));
    }
    Ok(size)
}

/// The capacity of a virtio-blk disk from its configuration space, and
/// its serial from GET_ID (which devices need not support).
fn identify_blk(
    queue: &mut BlkQueue,
    guest: &GuestMemoryMmap,
    scratch: GuestAddress,
    neg: &Negotiated,
    config: &BlkConfig,
) -> Result<LunInfo, BenchError> {
    let block_size = block_size(neg, config)?;
    let bytes = config
        .capacity
        .checked_mul(SECTOR_SIZE)
        .ok_or(BenchError::Protocol("the disk's capacity overflows"))?;
    let capacity = Capacity {
        blocks: bytes / u64::from(block_size),
        block_size,
    };
    let mut result = None;
    let id = Buffer::new(scratch, u32::try_from(ID_BYTES).unwrap_or(20));
    queue.submit(&Request::GetId(id), u64::MAX)?;
    queue.publish(|c| result = Some(c.result))?;
    while result.is_none() {
        queue.wait_and_reap(|c| result = Some(c.result))?;
    }
    let serial = match result {
        Some(Ok(_)) => {
            let mut raw = [0u8; ID_BYTES];
            guest
                .read_slice(&mut raw, scratch)
                .map_err(BenchError::Memory)?;
            let end = raw.iter().position(|&b| b == 0).unwrap_or(ID_BYTES);
            Some(String::from_utf8_lossy(&raw[..end]).into_owned())
        }
        Some(Err(blk::RequestError::Status(_))) => None,
        Some(Err(e)) => {
            return Err(BenchError::BlkRequest {
                what: "GET_ID",
                source: e,
            });
        }
        None => return Err(BenchError::Protocol("a request vanished")),
    };
    Ok(LunInfo {
        inquiry: None,
        capacity,
        luns: 1,
        serial,
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
