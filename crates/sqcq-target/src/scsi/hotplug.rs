//! LUNs added, removed and resized while a frontend runs I/O (virtio
//! 5.6.6.3: hot plug and parameter change events).
//!
//! # The LUN table
//!
//! A device's LUNs are an immutable [`Target`] snapshot. The control plane
//! (admin socket, control thread, a queue starting) reads the current one
//! from [`LunTable`], under a mutex that also serialises changes with
//! connections coming and going. The request path never touches it: every
//! request queue's [`ScsiQueue`] holds its own snapshot, aligned with its
//! own backstore queues, and takes the current one when its worker gets a
//! `WorkerCommand::Refresh` for the device, between two passes over the
//! ring. A worker
//! opens the backstore queues of new LUNs itself; the queues of a removed
//! LUN stay (unreachable by new requests) until their I/O has completed and
//! the next snapshot prunes them.
//!
//! # Each change
//!
//! - **add:** build the LU and its backstore, publish the snapshot (the new
//!   LU learns every live I_T nexus: POWER ON unit attention; the others
//!   get REPORTED LUNS DATA HAS CHANGED), hand it to every worker, then
//!   report TRANSPORT_RESET / RESCAN.
//! - **remove:** publish and hand over the snapshot without the LUN (new
//!   requests to it get the absent-LUN answer), wait for every request of
//!   the device in flight at that moment to complete (drain), prune the
//!   LUN's backstore queues, then report TRANSPORT_RESET / REMOVED.
//! - **resize:** grow the backstore then the LU (CAPACITY DATA HAS
//!   CHANGED), or shrink the LU, drain, then the backstore; then report
//!   PARAM_CHANGE with ASC/ASCQ 2Ah/09h.
//!
//! Events go through the device's control thread, which drops them unless
//! the driver negotiated HOTPLUG (transport resets) or CHANGE (parameter
//! changes).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use sqcq_backstore::{BackstoreError, BackstoreQueue};
use sqcq_scsi::{ConfigError, NexusId};
use thiserror::Error;

use crate::runtime::queue::{QueueError, Vring};
use crate::scsi::queue::{LunQueue, ScsiQueue};
use crate::scsi::target::{LunEntry, Target, TargetError};

/// PARAM_CHANGE reason for CAPACITY DATA HAS CHANGED: the ASC in bits 0-7,
/// the ASCQ in bits 8-15 (virtio 5.6.6.3.3).
pub const REASON_CAPACITY_CHANGED: u32 = 0x2a | (0x09 << 8);

/// Why a LUN change was refused or failed.
#[derive(Debug, Error)]
pub enum HotplugError {
    /// The LUN number is missing or above 16383.
    #[error("a LUN number 0..=16383 is required")]
    BadLun,
    /// `lun_add` for a LUN that exists.
    #[error("LUN {0} exists")]
    Exists(u16),
    /// `lun_remove` or `lun_resize` for a LUN that does not exist.
    #[error("no LUN {0}")]
    NoSuchLun(u16),
    /// The LUN could not be built.
    #[error("cannot build the LUN")]
    Build(#[source] TargetError),
    /// A worker could not open a backstore queue for the new LUN (the add
    /// was rolled back).
    #[error("a worker cannot serve the new LUN")]
    Queue(#[source] QueueError),
    /// The size is not a whole, non-zero number of blocks.
    #[error("size {bytes} is not a non-zero multiple of the block size {block_size}")]
    BadSize {
        /// The size asked for.
        bytes: u64,
        /// The LUN's block size.
        block_size: u32,
    },
    /// The backstore refused the new size.
    #[error("the backstore cannot take the new size")]
    Backstore(#[source] BackstoreError),
    /// The logical unit refused the new capacity.
    #[error("the logical unit refused the new capacity")]
    Capacity(#[source] ConfigError),
    /// LUN changes on a device that is not a SCSI target.
    #[error("device {0} has no LUNs (it is not a SCSI device)")]
    NotScsi(u32),
    /// `fault_break` found no running request queue to arm.
    #[cfg(feature = "fault-injection")]
    #[error("no running request queue matches (or it is armed or broken already)")]
    NoQueue,
}

/// A device's current LUN snapshot and the I_T nexuses connected to it.
#[derive(Debug)]
pub struct LunTable {
    state: Mutex<TableState>,
}

#[derive(Debug)]
struct TableState {
    current: Arc<Target>,
    nexuses: Vec<NexusId>,
}

impl LunTable {
    /// A table starting with `target`.
    pub fn new(target: Target) -> Self {
        LunTable {
            state: Mutex::new(TableState {
                current: Arc::new(target),
                nexuses: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, TableState> {
        // Nothing panics while holding the lock; recover anyway.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current snapshot (control plane only: takes the lock).
    pub fn current(&self) -> Arc<Target> {
        Arc::clone(&self.lock().current)
    }

    /// A new I_T nexus: every current LU learns it.
    pub fn connect(&self, nexus: NexusId) {
        let mut s = self.lock();
        for e in s.current.luns() {
            e.unit.add_nexus(nexus);
        }
        s.nexuses.push(nexus);
    }

    /// `nexus` continues the nexus of an earlier run: no power-on unit
    /// attention on any current LU.
    pub fn continue_nexus(&self, nexus: NexusId) {
        let s = self.lock();
        for e in s.current.luns() {
            e.unit.continue_nexus(nexus);
        }
    }

    /// The I_T nexus is gone.
    pub fn disconnect(&self, nexus: NexusId) {
        let mut s = self.lock();
        for e in s.current.luns() {
            e.unit.nexus_loss(nexus);
        }
        s.nexuses.retain(|n| *n != nexus);
    }

    /// Publishes the snapshot with `entry` added.
    pub(crate) fn install_added(&self, entry: LunEntry) -> Result<(), HotplugError> {
        let mut s = self.lock();
        if s.current.find(entry.lun).is_some() {
            return Err(HotplugError::Exists(entry.lun));
        }
        for e in s.current.luns() {
            e.unit.luns_changed();
        }
        for n in &s.nexuses {
            entry.unit.add_nexus(*n);
        }
        s.current = Arc::new(s.current.next(Some(entry), None));
        Ok(())
    }

    /// Publishes the snapshot without `lun`.
    /// Whether the target has `lun` now.
    pub(crate) fn has(&self, lun: u16) -> bool {
        self.lock().current.find(lun).is_some()
    }

    pub(crate) fn install_removed(&self, lun: u16) -> Result<(), HotplugError> {
        let mut s = self.lock();
        if s.current.find(lun).is_none() {
            return Err(HotplugError::NoSuchLun(lun));
        }
        s.current = Arc::new(s.current.next(None, Some(lun)));
        for e in s.current.luns() {
            e.unit.luns_changed();
        }
        Ok(())
    }
}

impl ScsiQueue {
    /// Switches to `target` (ignored if older than the snapshot in use):
    /// keeps the backstore queues of LUNs still there, opens queues for new
    /// LUNs, keeps those of removed LUNs after the others while they have
    /// requests in flight, drops them once idle. On error nothing changes.
    pub(crate) fn set_target(
        &mut self,
        ring: &Vring,
        target: &Arc<Target>,
    ) -> Result<(), QueueError> {
        if target.generation() < self.target.generation() {
            return Ok(());
        }
        let depth = u32::from(ring.size());
        let same =
            |l: &LunQueue, e: &LunEntry| l.lun == e.lun && Arc::ptr_eq(&l.backstore, &e.backstore);
        let mut opened: Vec<Option<Box<dyn BackstoreQueue>>> = Vec::new();
        for e in target.luns() {
            if self.luns.iter().any(|l| same(l, e)) {
                opened.push(None);
            } else {
                let io = e
                    .backstore
                    .open_queue(depth)
                    .map_err(|source| QueueError::Backstore { lun: e.lun, source })?;
                opened.push(Some(io));
            }
        }
        let mut old = std::mem::take(&mut self.luns);
        for (e, io) in target.luns().iter().zip(opened) {
            let queue = match io {
                Some(io) => LunQueue {
                    lun: e.lun,
                    backstore: Arc::clone(&e.backstore),
                    io,
                    pending: crate::runtime::backstore::Pending::default(),
                    // Virtqueues 0 and 1 are the control and event queues.
                    stats: e.stats.slot(ring.key().vq.saturating_sub(2)),
                    qos: Arc::clone(&e.qos),
                },
                None => {
                    let i = old.iter().position(|l| same(l, e)).unwrap_or(0);
                    old.swap_remove(i)
                }
            };
            self.luns.push(queue);
        }
        // Removed LUNs: still reaped (every loop covers all of `luns`)
        // until their requests completed.
        self.luns.extend(
            old.into_iter()
                .filter(|l| l.pending.is_queued() || l.io.in_flight() > 0),
        );
        let need = target
            .luns()
            .iter()
            .map(|e| e.unit.max_data_out_len())
            .max()
            .unwrap_or(0);
        if self.data_out.len() < need {
            self.data_out.resize(need, 0);
        }
        self.target = Arc::clone(target);
        Ok(())
    }
}
