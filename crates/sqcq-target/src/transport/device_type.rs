//! What the vhost-user transport needs of a device type: the traits a
//! device implements to be served by [`crate::transport::device`] and
//! `crate::transport::session`.
//!
//! The transport does everything a vhost-user back-end does whatever the
//! device: the socket, negotiation of the generic features (VERSION_1,
//! EVENT_IDX, INDIRECT_DESC, VIRTIO_F_SQCQ_POLL) and protocol features,
//! the memory table, the vring lifecycle, and running request queues on
//! the worker pool. A device type ([`VirtioDevice`]) adds its feature bits
//! and the number of its virtqueues; for each connection its
//! [`DeviceSession`] owns the configuration space, builds the
//! `RequestHandler` of each
//! request queue, and serves on the control thread the queues that are not
//! request queues (the first [`VirtioDevice::local_queues`] vrings:
//! virtio-scsi's control and event queues; none for virtio-blk).

use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;

use crate::runtime::shared_memory::SharedMemory;

// What a device implementation needs of the runtime, re-exported here so
// that the device API is nameable in one place.
pub use crate::runtime::eventfd::PeerEventFd;
pub use crate::runtime::queue::{
    DeviceInfo, MakeHandler, QueueError, QueueKey, RequestHandler, RingConfig, Vring,
};

/// A device type, one value per configured device, shared by its control
/// thread and whoever changes the device at run time.
pub trait VirtioDevice: Send + Sync + std::fmt::Debug {
    /// The device's own virtio feature bits (the transport adds the
    /// generic ones).
    fn features(&self) -> u64;

    /// How many of the first vrings the device serves itself on the
    /// control thread; the ones after them are request queues.
    fn local_queues(&self) -> usize;

    /// The most request queues a frontend may set up.
    fn max_request_queues(&self) -> u16;

    /// A descriptor the control thread watches while no frontend is
    /// connected too: readable when another thread queued something for
    /// the device's session ([`DeviceSession::notified`]).
    fn notifier(&self) -> RawFd;

    /// The notifier fired with no frontend connected: whatever was queued
    /// is dropped.
    fn discard_notifications(&self);

    /// Takes (`true`) or gives up (`false`) what keeps other users off the
    /// device's storage ([`sqcq_backstore::Backstore::set_active`]) for
    /// every disk of the device: given up when a live migration stopped
    /// the device, taken when a queue starts.
    fn set_active(&self, active: bool) -> Result<(), sqcq_backstore::BackstoreError>;

    /// A frontend connected: the device's state for that connection.
    fn connect(
        self: Arc<Self>,
        info: Arc<DeviceInfo>,
        params: &DeviceParams,
    ) -> io::Result<Box<dyn DeviceSession>>;
}

/// The queue parameters of a device, from its configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceParams {
    /// Request queues announced.
    pub num_queues: u16,
    /// Largest vring size.
    pub queue_size: u16,
    /// Request queue to worker map.
    pub queue_map: crate::runtime::options::QueueMap,
    /// IOPS and bandwidth limits at start.
    pub qos: crate::runtime::qos::QosLimits,
}

/// The eventfds of a queue the device serves on the control thread.
#[derive(Debug)]
pub struct LocalQueueFds {
    /// Driver-to-device notifications.
    pub kick: PeerEventFd,
    /// Device-to-driver notifications.
    pub call: Option<PeerEventFd>,
}

/// What of the session a device needs while it serves its local queues.
pub struct SessionCtx<'a> {
    /// Guest memory of the connection.
    pub mem: &'a SharedMemory,
    /// The negotiated virtio features.
    pub features: u64,
    /// Waits until every request of the device in flight now has
    /// completed on the workers (or the stop timeout passed); whether
    /// they all did.
    pub drain_requests: &'a dyn Fn() -> bool,
    /// Tells the frontend that the configuration space changed
    /// (VHOST_USER_BACKEND_CONFIG_CHANGE_MSG on the backend channel; the
    /// frontend then raises the configuration-change interrupt); whether
    /// it could be told.
    pub config_changed: &'a dyn Fn() -> bool,
}

impl std::fmt::Debug for SessionCtx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionCtx")
            .field("features", &self.features)
            .finish_non_exhaustive()
    }
}

impl SessionCtx<'_> {
    /// Whether virtio feature `bit` was negotiated.
    pub fn has_feature(&self, bit: u32) -> bool {
        self.features & (1u64 << bit) != 0
    }
}

/// A device's state for one connection, owned by the control thread.
pub trait DeviceSession: Send {
    /// The configuration space as the driver reads it now.
    fn config_space(&self) -> Vec<u8>;

    /// The driver writes `buf` at `offset` of the configuration space;
    /// false if the device refuses the write.
    fn write_config(&mut self, offset: u32, buf: &[u8]) -> bool;

    /// How a worker builds the request handler of a request queue.
    fn request_handler(&self) -> MakeHandler;

    /// Starts local queue `index` and serves what is already available.
    fn start_local(
        &mut self,
        ctx: &SessionCtx<'_>,
        index: usize,
        ring: &RingConfig,
        fds: LocalQueueFds,
    ) -> Result<(), QueueError>;

    /// Stops local queue `index`; where it stopped.
    fn stop_local(&mut self, index: usize) -> Option<u32>;

    /// A new call eventfd for local queue `index`.
    fn set_local_call(&mut self, index: usize, call: Option<PeerEventFd>);

    /// A device reset: every local queue stops, pending device state is
    /// dropped.
    fn reset(&mut self);

    /// A descriptor the control thread watches; readable when a local
    /// queue was kicked.
    fn epoll_fd(&self) -> RawFd;

    /// Serves the local queues: those kicked, and work left from the
    /// last call.
    fn service(&mut self, ctx: &SessionCtx<'_>);

    /// Whether work is left for the next [`Self::service`] without a kick.
    fn pending(&self) -> bool;

    /// The device's notifier fired ([`VirtioDevice::notifier`]): look at
    /// what was queued.
    fn notified(&mut self, ctx: &SessionCtx<'_>);

    /// The connection ends (after every queue stopped).
    fn disconnect(&mut self);

    /// The frontend handed back the in-flight area of an earlier
    /// connection: this connection continues that one's device (for SCSI,
    /// its I_T nexus: no power-on unit attention).
    fn resumed(&mut self) {}
}
