//! Changes to running devices, for the admin socket: SCSI LUNs added,
//! removed and resized (the mechanics and their order are
//! `scsi::hotplug`'s), a blk disk resized, request queues armed
//! to break (fault injection). The one place that knows every device
//! type, with the daemon.

use std::sync::Arc;

use tracing::{error, info, warn};

use crate::blk::device::BlkDevice;
use crate::runtime::events::Event;
use crate::runtime::lun_stats::LunIo;
use crate::runtime::queue::{DeviceInfo, QueueError};
use crate::runtime::worker::{QUEUE_STOP_TIMEOUT, WorkerCommand, WorkerPool};
use crate::scsi::device::{EventReport, ScsiDevice};
use crate::scsi::hotplug::{HotplugError, REASON_CAPACITY_CHANGED};
use crate::scsi::target::{LunEntry, build_lun, wwn_seed};
use crate::spec::LunSpec;
use sqcq_wire::scsi::{
    EVT_PARAM_CHANGE, EVT_RESET_REMOVED, EVT_RESET_RESCAN, EVT_TRANSPORT_RESET, Lun,
};

/// The concrete device behind a device's `dyn VirtioDevice`.
#[derive(Clone, Debug)]
pub enum DeviceKind {
    /// A SCSI target (its LUN table and event reports).
    Scsi(Arc<ScsiDevice>),
    /// A blk device (its one disk is LUN 0 for the admin socket).
    Blk(Arc<BlkDevice>),
}

/// What a change at run time needs: the device, the workers.
#[derive(Debug)]
pub struct DeviceControl {
    /// The device as the runtime knows it (number, name, figures).
    pub info: Arc<DeviceInfo>,
    /// Which device it is.
    pub kind: DeviceKind,
    /// The worker pool serving it.
    pub pool: Arc<WorkerPool>,
}

impl DeviceControl {
    /// The SCSI device, for LUN changes.
    pub fn scsi(&self) -> Result<&Arc<ScsiDevice>, HotplugError> {
        match &self.kind {
            DeviceKind::Scsi(s) => Ok(s),
            DeviceKind::Blk(_) => Err(HotplugError::NotScsi(self.info.id)),
        }
    }

    /// Adds the LUN `spec` describes (`spec.lun` is required):
    /// [`Self::open_lun`], then [`Self::install_lun`].
    pub fn add_lun(&self, spec: &LunSpec) -> Result<u16, HotplugError> {
        self.install_lun(self.open_lun(spec)?)
    }

    /// Opens the backstore of the LUN `spec` describes (`spec.lun` is
    /// required), which may take long (an RBD image: up to the cluster's
    /// connect time-out), and changes nothing.
    pub fn open_lun(&self, spec: &LunSpec) -> Result<LunEntry, HotplugError> {
        let lun = spec
            .lun
            .filter(|l| *l <= Lun::MAX_LUN)
            .ok_or(HotplugError::BadLun)?;
        let dev = self.scsi()?;
        if dev.target.current().find(lun).is_some() {
            return Err(HotplugError::Exists(lun));
        }
        build_lun(lun, spec, wwn_seed(&self.info.name)).map_err(HotplugError::Build)
    }

    /// Adds a LUN [`Self::open_lun`] opened to the device.
    pub fn install_lun(&self, entry: LunEntry) -> Result<u16, HotplugError> {
        let lun = entry.lun;
        let dev = self.scsi()?;
        let geometry = entry.backstore.geometry();
        dev.target.install_added(entry)?;
        if let Err(e) = self.hand_over() {
            // Some worker could not open a backstore queue: take the LUN
            // back out, everywhere.
            if dev.target.install_removed(lun).is_ok() {
                let _ = self.hand_over();
            }
            return Err(HotplugError::Queue(e));
        }
        info!(device = self.info.id, lun, %geometry, "LUN added");
        self.info.events.publish(Event::LunAdded {
            device: self.info.id,
            lun,
        });
        self.event(lun, EVT_TRANSPORT_RESET, EVT_RESET_RESCAN);
        Ok(lun)
    }

    /// [`HotplugError::NoSuchLun`] unless the device is SCSI and has
    /// `lun` now.
    pub fn check_lun(&self, lun: u16) -> Result<(), HotplugError> {
        if self.scsi()?.target.has(lun) {
            Ok(())
        } else {
            Err(HotplugError::NoSuchLun(lun))
        }
    }

    /// Removes `lun` once the requests in flight to it have completed.
    pub fn remove_lun(&self, lun: u16) -> Result<(), HotplugError> {
        let dev = self.scsi()?;
        dev.target.install_removed(lun)?;
        if let Err(e) = self.hand_over() {
            warn!(device = self.info.id, lun, "removing: {e}");
        }
        self.drain();
        // The same snapshot again: prunes the drained backstore queues.
        let _ = self.hand_over();
        info!(device = self.info.id, lun, "LUN removed");
        self.info.events.publish(Event::LunRemoved {
            device: self.info.id,
            lun,
        });
        self.event(lun, EVT_TRANSPORT_RESET, EVT_RESET_REMOVED);
        Ok(())
    }

    /// Every LUN's I/O figures (a blk device's disk is LUN 0).
    pub fn lun_io(&self) -> Vec<(u16, LunIo)> {
        match &self.kind {
            DeviceKind::Blk(blk) => vec![(0, blk.stats().snapshot())],
            DeviceKind::Scsi(scsi) => (scsi.target.current().luns().iter())
                .map(|e| (e.lun, e.stats.snapshot()))
                .collect(),
        }
    }

    /// Changes the capacity of `lun` to `bytes`.
    pub fn resize_lun(&self, lun: u16, bytes: u64) -> Result<u64, HotplugError> {
        if let DeviceKind::Blk(blk) = &self.kind {
            if lun != 0 {
                return Err(HotplugError::NoSuchLun(lun));
            }
            let block_size = blk.block_size();
            if bytes == 0 || !bytes.is_multiple_of(u64::from(block_size)) {
                return Err(HotplugError::BadSize { bytes, block_size });
            }
            blk.resize(bytes, || self.drain())
                .map_err(HotplugError::Backstore)?;
            info!(device = self.info.id, bytes, "disk resized");
            self.info.events.publish(Event::LunResized {
                device: self.info.id,
                lun,
                bytes,
            });
            return Ok(bytes / u64::from(block_size));
        }
        let dev = self.scsi()?;
        let target = dev.target.current();
        let entry = target
            .find(lun)
            .map(|i| &target.luns()[i])
            .ok_or(HotplugError::NoSuchLun(lun))?;
        let block_size = entry.unit.block_size();
        let bs = u64::from(block_size);
        if bytes == 0 || !bytes.is_multiple_of(bs) {
            return Err(HotplugError::BadSize { bytes, block_size });
        }
        let (old, new) = (entry.unit.blocks(), bytes / bs);
        if new >= old {
            // The storage exists before any command can address it.
            entry
                .backstore
                .resize(bytes)
                .map_err(HotplugError::Backstore)?;
            entry.unit.resize(new).map_err(HotplugError::Capacity)?;
        } else {
            // No new command reaches past the new end, nothing in flight
            // does either, then the storage goes.
            entry.unit.resize(new).map_err(HotplugError::Capacity)?;
            self.drain();
            if let Err(e) = entry.backstore.resize(bytes) {
                let _ = entry.unit.resize(old);
                return Err(HotplugError::Backstore(e));
            }
        }
        info!(device = self.info.id, lun, blocks = new, "LUN resized");
        self.info.events.publish(Event::LunResized {
            device: self.info.id,
            lun,
            bytes,
        });
        self.event(lun, EVT_PARAM_CHANGE, REASON_CAPACITY_CHANGED);
        Ok(new)
    }

    /// Arms request queue `vq` (every running one if `None`) to break at
    /// its next request, as for a nonsense doorbell (fault injection, see
    /// [`crate::admin`]); returns the vring indices armed.
    #[cfg(feature = "fault-injection")]
    pub fn break_queues(&self, vq: Option<u16>) -> Vec<u16> {
        let device = self.info.id;
        let mut broken = Vec::new();
        for w in self.pool.ids() {
            let call = |reply| WorkerCommand::Break { device, vq, reply };
            match self
                .pool
                .call(w, call, self.pool.deadline(QUEUE_STOP_TIMEOUT))
            {
                Ok(mut list) => broken.append(&mut list),
                Err(e) => error!(device, "fault_break: {e}"),
            }
        }
        broken.sort_unstable();
        broken
    }

    /// Every worker's queues of this device take its current LUN
    /// snapshot; the first failure, if any.
    fn hand_over(&self) -> Result<(), QueueError> {
        let device = self.info.id;
        let mut result = Ok(());
        for w in self.pool.ids() {
            let call = |reply| WorkerCommand::Refresh { device, reply };
            match self
                .pool
                .call(w, call, self.pool.deadline(QUEUE_STOP_TIMEOUT))
            {
                Ok(Err(e)) => result = Err(e),
                Ok(Ok(())) => {}
                Err(e) => error!(device, "LUN snapshot: {e}"),
            }
        }
        result
    }

    /// Waits until every request of the device in flight now completed.
    fn drain(&self) {
        self.drain_by(self.pool.deadline(QUEUE_STOP_TIMEOUT));
    }

    /// Waits, until `deadline`, for every request of the device in flight
    /// now to complete, on every worker (each answers between two of its
    /// passes, so a request it takes after answering saw whatever was
    /// stored before the call); false if a worker did not answer in time.
    pub fn drain_by(&self, deadline: std::time::Instant) -> bool {
        let device = self.info.id;
        let mut drained = true;
        for w in self.pool.ids() {
            let call = |reply| WorkerCommand::Drain { device, reply };
            if let Err(e) = self.pool.call(w, call, deadline) {
                warn!(device, "drain: {e}");
                drained = false;
            }
        }
        drained
    }

    fn event(&self, lun: u16, event: u32, reason: u32) {
        if let DeviceKind::Scsi(scsi) = &self.kind {
            scsi.report_event(EventReport { lun, event, reason });
        }
    }
}
