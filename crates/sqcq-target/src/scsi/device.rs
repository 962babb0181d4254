//! The virtio-scsi device type on the vhost-user transport: its feature
//! bits and virtqueues ([`ScsiDevice`]), and what it keeps per connection
//! ([`ScsiSession`]: the I_T nexus, the driver-writable CDB and sense
//! sizes, the control and event queues).

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use sqcq_scsi::NexusId;
use sqcq_wire::scsi::{
    CONFIG_CDB_SIZE_OFFSET, CONFIG_SENSE_SIZE_OFFSET, DEFAULT_CDB_SIZE, DEFAULT_SENSE_SIZE,
    EVENT_INFO_SIZE, Lun, MAX_CDB_SIZE, MAX_SENSE_SIZE, ScsiConfig, VIRTIO_SCSI_F_CHANGE,
    VIRTIO_SCSI_F_HOTPLUG,
};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::runtime::eventfd::PeerEventFd;
use crate::runtime::queue::{DeviceInfo, MakeHandler, QueueError, RingConfig};
use crate::scsi::control::ControlPlane;
use crate::scsi::hotplug::LunTable;
use crate::scsi::queue::make_handler;
use crate::scsi::target::Target;
use crate::transport::device_type::{
    DeviceParams, DeviceSession, LocalQueueFds, SessionCtx, VirtioDevice,
};

/// Most request queues a device serves (QEMU creates 2 + its own
/// `num_queues` vrings whatever GET_QUEUE_NUM says, so more than
/// `--num-queues` are accepted, up to this).
pub const MAX_REQUEST_QUEUES: u16 = 254;

/// Events kept for the control thread between two looks; more are
/// dropped and the driver learns it from VIRTIO_SCSI_T_EVENTS_MISSED.
const MAX_QUEUED_REPORTS: usize = 1024;

static NEXT_NEXUS: AtomicU64 = AtomicU64::new(1);

/// A fresh I_T nexus identifier (one per connection, daemon-wide).
pub fn new_nexus() -> NexusId {
    // Relaxed: only uniqueness matters.
    NexusId(NEXT_NEXUS.fetch_add(1, Ordering::Relaxed))
}

/// An event to report to the driver (virtio-scsi event queue).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventReport {
    /// The LUN concerned.
    pub lun: u16,
    /// `VIRTIO_SCSI_T_TRANSPORT_RESET` or `VIRTIO_SCSI_T_PARAM_CHANGE`.
    pub event: u32,
    /// Reason code.
    pub reason: u32,
}

/// A virtio-scsi device: its logical units and the events waiting for
/// its control thread.
#[derive(Debug)]
pub struct ScsiDevice {
    /// The logical units (the current snapshot; workers hold their own).
    pub target: LunTable,
    reports: Mutex<VecDeque<EventReport>>,
    notify: EventFd,
}

impl ScsiDevice {
    /// A device serving `target`.
    pub fn new(target: Target) -> io::Result<Self> {
        Ok(ScsiDevice {
            target: LunTable::new(target),
            reports: Mutex::new(VecDeque::new()),
            notify: EventFd::new(EFD_NONBLOCK)?,
        })
    }

    /// Reports an event to the connected driver, if any (from any
    /// thread; the device's control thread delivers it).
    pub fn report_event(&self, event: EventReport) {
        {
            let mut q = self.reports.lock().unwrap_or_else(PoisonError::into_inner);
            if q.len() >= MAX_QUEUED_REPORTS {
                q.pop_front();
            }
            q.push_back(event);
        }
        let _ = self.notify.write(1);
    }

    fn take_reports(&self) -> VecDeque<EventReport> {
        let _ = self.notify.read();
        std::mem::take(&mut *self.reports.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl VirtioDevice for ScsiDevice {
    fn set_active(&self, active: bool) -> Result<(), sqcq_backstore::BackstoreError> {
        self.target
            .current()
            .luns()
            .iter()
            .try_for_each(|l| l.backstore.set_active(active))
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_SCSI_F_HOTPLUG) | (1 << VIRTIO_SCSI_F_CHANGE)
    }

    fn local_queues(&self) -> usize {
        2
    }

    fn max_request_queues(&self) -> u16 {
        MAX_REQUEST_QUEUES
    }

    fn notifier(&self) -> RawFd {
        self.notify.as_raw_fd()
    }

    fn discard_notifications(&self) {
        // No driver connected: events are dropped.
        drop(self.take_reports());
    }

    fn connect(
        self: Arc<Self>,
        info: Arc<DeviceInfo>,
        params: &DeviceParams,
    ) -> io::Result<Box<dyn DeviceSession>> {
        let control = ControlPlane::new()?;
        let nexus = new_nexus();
        self.target.connect(nexus);
        Ok(Box::new(ScsiSession {
            dev: self,
            info,
            params: params.clone(),
            nexus,
            cdb_size: DEFAULT_CDB_SIZE,
            sense_size: DEFAULT_SENSE_SIZE,
            control,
        }))
    }
}

/// A virtio-scsi device's state for one connection (one I_T nexus).
pub struct ScsiSession {
    pub(crate) dev: Arc<ScsiDevice>,
    pub(crate) info: Arc<DeviceInfo>,
    params: DeviceParams,
    pub(crate) nexus: NexusId,
    cdb_size: u32,
    sense_size: u32,
    pub(crate) control: ControlPlane,
}

impl std::fmt::Debug for ScsiSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScsiSession")
            .field("nexus", &self.nexus)
            .finish_non_exhaustive()
    }
}

impl ScsiSession {
    /// The configuration space as the driver sees it now.
    pub fn config(&self) -> ScsiConfig {
        let p = &self.params;
        ScsiConfig {
            num_queues: u32::from(p.num_queues),
            seg_max: crate::runtime::queue::advertised_seg_max(p.queue_size),
            max_sectors: 0xffff,
            cmd_per_lun: u32::from(p.queue_size),
            event_info_size: EVENT_INFO_SIZE,
            sense_size: self.sense_size,
            cdb_size: self.cdb_size,
            max_channel: 0,
            max_target: 0,
            // Hot-added LUNs up to the single-level limit stay reachable.
            max_lun: u32::from(Lun::MAX_LUN),
        }
    }
}

impl DeviceSession for ScsiSession {
    fn config_space(&self) -> Vec<u8> {
        self.config().encode().to_vec()
    }

    fn write_config(&mut self, offset: u32, buf: &[u8]) -> bool {
        // Only sense_size and cdb_size are driver-writable (virtio 5.6.4).
        let Ok(word) = <[u8; 4]>::try_from(buf) else {
            return false;
        };
        let value = u32::from_le_bytes(word);
        match usize::try_from(offset).unwrap_or(usize::MAX) {
            CONFIG_SENSE_SIZE_OFFSET if value <= MAX_SENSE_SIZE => self.sense_size = value,
            CONFIG_CDB_SIZE_OFFSET if (6..=MAX_CDB_SIZE).contains(&value) => self.cdb_size = value,
            _ => return false,
        }
        true
    }

    fn request_handler(&self) -> MakeHandler {
        make_handler(
            Arc::clone(&self.dev),
            self.nexus,
            self.cdb_size,
            self.sense_size,
            self.config().seg_max,
        )
    }

    fn start_local(
        &mut self,
        ctx: &SessionCtx<'_>,
        index: usize,
        ring: &RingConfig,
        fds: LocalQueueFds,
    ) -> Result<(), QueueError> {
        self.start_control_queue(ctx, index, ring, fds)
    }

    fn stop_local(&mut self, index: usize) -> Option<u32> {
        self.control.stop(index)
    }

    fn set_local_call(&mut self, index: usize, call: Option<PeerEventFd>) {
        self.control.set_call(index, call);
    }

    fn reset(&mut self) {
        self.control.reset();
    }

    fn epoll_fd(&self) -> RawFd {
        self.control.epoll_fd()
    }

    fn service(&mut self, ctx: &SessionCtx<'_>) {
        self.service_control_queues(ctx);
    }

    fn pending(&self) -> bool {
        self.control.more
    }

    fn notified(&mut self, ctx: &SessionCtx<'_>) {
        for e in self.dev.take_reports() {
            self.report_event(ctx, e.lun, e.event, e.reason);
        }
    }

    fn disconnect(&mut self) {
        self.dev.target.disconnect(self.nexus);
    }

    fn resumed(&mut self) {
        self.dev.target.continue_nexus(self.nexus);
    }
}
