//! The virtio-blk device type on the vhost-user transport: one disk (a
//! backstore), its feature bits and configuration space. It has request
//! queues only, so its session has nothing to serve on the control
//! thread.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use sqcq_backstore::{Backstore, BackstoreError};
use sqcq_wire::blk::{
    BlkConfig, CONFIG_WCE_OFFSET, SECTOR_SHIFT, VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_CONFIG_WCE,
    VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_MQ, VIRTIO_BLK_F_RO,
    VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_TOPOLOGY, VIRTIO_BLK_F_WRITE_ZEROES,
};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::blk::queue::BlkQueue;
use crate::runtime::eventfd::PeerEventFd;
use crate::runtime::lun_stats::LunStats;
use crate::runtime::queue::{
    DeviceInfo, MakeHandler, QueueError, QueueKey, RequestHandler, RingConfig,
};
use crate::transport::device_type::{
    DeviceParams, DeviceSession, LocalQueueFds, SessionCtx, VirtioDevice,
};

/// Most request queues a blk device serves.
pub const MAX_REQUEST_QUEUES: u16 = 256;

/// Largest discard or write-zeroes request, in 512-byte sectors: one
/// backstore operation of at most 1 MiB, so that one request never holds
/// a worker its queues share with others for long (as the SCSI device's
/// slices).
pub const MAX_RANGE_SECTORS: u32 = 2048;

/// A virtio-blk device: its disk and identity.
pub struct BlkDevice {
    backstore: Arc<dyn Backstore>,
    serial: String,
    read_only: bool,
    /// Capacity in 512-byte sectors, read by every request queue (a
    /// resize changes it).
    sectors: Arc<AtomicU64>,
    notify: EventFd,
    /// The disk's I/O figures, one slot per request queue.
    stats: Arc<LunStats>,
}

impl std::fmt::Debug for BlkDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlkDevice")
            .field("geometry", &self.backstore.geometry())
            .field("serial", &self.serial)
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

/// What a request queue needs to know of its device.
#[derive(Clone)]
pub(crate) struct Disk {
    pub(crate) backstore: Arc<dyn Backstore>,
    /// Capacity in 512-byte sectors (shared with the device: resizes).
    pub(crate) sectors: Arc<AtomicU64>,
    pub(crate) read_only: bool,
    /// Discard and write zeroes with unmap are offered.
    pub(crate) discard: bool,
    pub(crate) id: [u8; sqcq_wire::blk::ID_BYTES],
    /// The configuration space's `seg_max`.
    pub(crate) seg_max: u32,
    /// The driver's cache mode (`writeback`, VIRTIO_BLK_F_CONFIG_WCE):
    /// false is write-through, every write durable before it completes.
    pub(crate) writeback: Arc<AtomicBool>,
    /// The disk's I/O figures.
    pub(crate) stats: Arc<LunStats>,
}

impl BlkDevice {
    /// A device serving `backstore` as a disk with serial `serial`
    /// (GET_ID), read-only if asked or if the backstore is.
    pub fn new(backstore: Arc<dyn Backstore>, serial: String, read_only: bool) -> io::Result<Self> {
        let read_only = read_only || backstore.geometry().read_only;
        let sectors = Arc::new(AtomicU64::new(backstore.geometry().bytes() >> SECTOR_SHIFT));
        Ok(BlkDevice {
            backstore,
            serial,
            read_only,
            sectors,
            notify: EventFd::new(EFD_NONBLOCK)?,
            stats: Arc::default(),
        })
    }

    /// The disk's I/O figures.
    pub fn stats(&self) -> &Arc<LunStats> {
        &self.stats
    }

    /// The disk's backstore.
    pub fn backstore(&self) -> &Arc<dyn Backstore> {
        &self.backstore
    }

    /// The disk's size and capabilities now.
    pub fn geometry(&self) -> sqcq_backstore::Geometry {
        self.backstore.geometry()
    }

    /// The disk's capacity in bytes (Relaxed: a figure; see
    /// [`Self::resize`] for what orders a change).
    pub fn capacity_bytes(&self) -> u64 {
        self.sectors.load(Ordering::Relaxed) * sqcq_wire::blk::SECTOR_SIZE
    }

    /// The disk's logical block size.
    pub fn block_size(&self) -> u32 {
        self.backstore.geometry().block_size
    }

    /// Changes the capacity to `bytes` (a whole number of blocks): the
    /// configuration space shows it at once, requests are checked against
    /// it, and the control thread tells a connected frontend
    /// (VHOST_USER_BACKEND_CONFIG_CHANGE_MSG on the backend channel: QEMU
    /// reads the configuration again and interrupts the guest, whose
    /// virtio_blk revalidates the capacity).
    /// Growing: the storage exists before a request can address it.
    /// Shrinking: no new request reaches past the new end, `drain` waits
    /// for those in flight, then the storage goes.
    pub fn resize(&self, bytes: u64, drain: impl FnOnce()) -> Result<u64, BackstoreError> {
        let new = bytes >> SECTOR_SHIFT;
        let old = self.sectors.load(Ordering::Relaxed);
        if new >= old {
            self.backstore.resize(bytes)?;
            // Relaxed: it orders nothing. A request that sees the new end
            // before its worker sees the backstore's own new capacity
            // (which the backstore publishes and checks itself) fails
            // there with an I/O error; none reaches unmapped storage.
            self.sectors.store(new, Ordering::Relaxed);
        } else {
            // Relaxed: the drain's round trip through every worker's
            // channel orders this store before any request a worker takes
            // afterwards; the ones taken before are what it waits for.
            self.sectors.store(new, Ordering::Relaxed);
            drain();
            if let Err(e) = self.backstore.resize(bytes) {
                self.sectors.store(old, Ordering::Relaxed);
                return Err(e);
            }
        }
        if new != old {
            // The control thread sends the message (`notified`); a full
            // counter (impossible at one write per resize) only merges
            // notifications.
            let _ = self.notify.write(1);
        }
        Ok(new)
    }

    fn disk(&self) -> Disk {
        let g = self.backstore.geometry();
        Disk {
            backstore: Arc::clone(&self.backstore),
            sectors: Arc::clone(&self.sectors),
            read_only: self.read_only,
            discard: g.supports_unmap,
            id: sqcq_wire::blk::encode_id(&self.serial),
            seg_max: 0,
            writeback: Arc::new(AtomicBool::new(true)),
            stats: Arc::clone(&self.stats),
        }
    }
}

impl VirtioDevice for BlkDevice {
    fn set_active(&self, active: bool) -> Result<(), sqcq_backstore::BackstoreError> {
        self.backstore.set_active(active)
    }

    fn features(&self) -> u64 {
        let mut f = (1 << VIRTIO_BLK_F_SEG_MAX)
            | (1 << VIRTIO_BLK_F_BLK_SIZE)
            | (1 << VIRTIO_BLK_F_TOPOLOGY)
            | (1 << VIRTIO_BLK_F_FLUSH)
            | (1 << VIRTIO_BLK_F_CONFIG_WCE)
            | (1 << VIRTIO_BLK_F_MQ)
            | (1 << VIRTIO_BLK_F_WRITE_ZEROES);
        if self.read_only {
            f |= 1 << VIRTIO_BLK_F_RO;
        }
        if self.backstore.geometry().supports_unmap {
            f |= 1 << VIRTIO_BLK_F_DISCARD;
        }
        f
    }

    fn local_queues(&self) -> usize {
        0
    }

    fn max_request_queues(&self) -> u16 {
        MAX_REQUEST_QUEUES
    }

    fn notifier(&self) -> RawFd {
        self.notify.as_raw_fd()
    }

    fn discard_notifications(&self) {
        let _ = self.notify.read();
    }

    fn connect(
        self: Arc<Self>,
        _info: Arc<DeviceInfo>,
        params: &DeviceParams,
    ) -> io::Result<Box<dyn DeviceSession>> {
        Ok(Box::new(BlkSession {
            idle: EventFd::new(EFD_NONBLOCK)?,
            params: params.clone(),
            writeback: Arc::new(AtomicBool::new(true)),
            dev: self,
        }))
    }
}

/// A virtio-blk device's state for one connection: nothing but what the
/// configuration space shows.
#[derive(Debug)]
struct BlkSession {
    dev: Arc<BlkDevice>,
    params: DeviceParams,
    /// The descriptor the control thread watches for local queues; a blk
    /// device has none, so it never fires.
    idle: EventFd,
    /// The cache mode the driver chose (write-back until it writes
    /// `writeback` 0; a device reset restores it), read by every request
    /// queue of the connection.
    writeback: Arc<AtomicBool>,
}

impl BlkSession {
    fn config(&self) -> BlkConfig {
        let g = self.dev.backstore.geometry();
        let per_block = g.block_size >> SECTOR_SHIFT;
        let discard = g.supports_unmap;
        BlkConfig {
            capacity: self.dev.sectors.load(Ordering::Relaxed),
            seg_max: crate::runtime::queue::advertised_seg_max(self.params.queue_size),
            blk_size: g.block_size,
            min_io_size: 1,
            num_queues: self.params.num_queues,
            max_discard_sectors: if discard { MAX_RANGE_SECTORS } else { 0 },
            max_discard_seg: u32::from(discard),
            discard_sector_alignment: per_block,
            max_write_zeroes_sectors: MAX_RANGE_SECTORS,
            max_write_zeroes_seg: 1,
            write_zeroes_may_unmap: u8::from(discard && g.unmapped_reads_zero),
            // Relaxed: a plain flag; requests racing with a mode change
            // may see either mode, as on any disk.
            writeback: u8::from(self.writeback.load(Ordering::Relaxed)),
            ..BlkConfig::default()
        }
    }
}

impl DeviceSession for BlkSession {
    fn config_space(&self) -> Vec<u8> {
        self.config().encode().to_vec()
    }

    fn write_config(&mut self, offset: u32, buf: &[u8]) -> bool {
        // `writeback` is the one driver-writable field: 0 (write-through)
        // or 1 (write-back).
        match (usize::try_from(offset), buf) {
            (Ok(CONFIG_WCE_OFFSET), &[mode @ (0 | 1)]) => {
                self.writeback.store(mode == 1, Ordering::Relaxed);
                true
            }
            _ => false,
        }
    }

    fn request_handler(&self) -> MakeHandler {
        let disk = Disk {
            seg_max: self.config().seg_max,
            writeback: Arc::clone(&self.writeback),
            ..self.dev.disk()
        };
        Box::new(move |key: QueueKey, ring: &RingConfig| {
            Ok(Box::new(BlkQueue::new(disk, key.vq, ring)?) as Box<dyn RequestHandler>)
        })
    }

    fn start_local(
        &mut self,
        _ctx: &SessionCtx<'_>,
        _index: usize,
        _ring: &RingConfig,
        _fds: LocalQueueFds,
    ) -> Result<(), QueueError> {
        // Unreachable: `local_queues` is 0.
        Err(QueueError::Ring(crate::runtime::split::RingError::Size(0)))
    }

    fn stop_local(&mut self, _index: usize) -> Option<u32> {
        None
    }

    fn set_local_call(&mut self, _index: usize, _call: Option<PeerEventFd>) {}

    fn reset(&mut self) {
        self.writeback.store(true, Ordering::Relaxed);
    }

    fn epoll_fd(&self) -> RawFd {
        self.idle.as_raw_fd()
    }

    fn service(&mut self, _ctx: &SessionCtx<'_>) {}

    fn pending(&self) -> bool {
        false
    }

    fn notified(&mut self, ctx: &SessionCtx<'_>) {
        // The only notification: the capacity changed.
        if self.dev.notify.read().is_ok() {
            (ctx.config_changed)();
        }
    }

    fn disconnect(&mut self) {}
}
