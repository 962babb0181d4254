//! The vhost-user frontend: the process that plays the VMM for a
//! vhost-user device, built on rust-vmm's `vhost` codec.
//!
//! [`Frontend::connect`] negotiates (acking only bits the device offered),
//! reads the configuration space of the device type
//! ([`DeviceType`]: virtio-scsi or virtio-blk); [`Frontend::set_mem_table`] shares
//! the [`DriverMemory`] memfd; [`Frontend::start_queue`] hands a
//! [`Virtqueue`] to the device; [`Frontend::stop`] takes every started
//! vring back (`GET_VRING_BASE`) and disconnects.
//!
//! Facts about the `vhost` crate this relies on: `get_features` must come
//! before `get_protocol_features`; `set_vring_addr` takes this process's
//! virtual addresses, not guest-physical ones; `set_*` messages are
//! acknowledged only when REPLY_ACK was negotiated (we then ask for it on
//! every message); protocol bits the crate does not know are dropped. The
//! socket has read and write timeouts, so no reply is waited for forever.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserHeaderFlag, VhostUserInflight};
use vhost::vhost_user::{
    Frontend as VhostFrontend, VhostUserFrontend, VhostUserProtocolFeatures,
    VhostUserVirtioFeatures,
};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use vm_memory::GuestMemoryBackend;

use crate::memory::{DriverMemory, MemoryError};
use crate::virtqueue::Virtqueue;
use sqcq_wire::blk::{self, BlkConfig, VIRTIO_BLK_F_MQ};
use sqcq_wire::scsi::{self, ConfigError, ScsiConfig};

/// Vring index of the virtio-scsi control queue.
pub const CONTROL_QUEUE: u16 = 0;
/// Vring index of the virtio-scsi event queue.
pub const EVENT_QUEUE: u16 = 1;
/// Vring index of the first virtio-scsi request queue.
pub const FIRST_REQUEST_QUEUE: u16 = 2;

/// The virtio device type a frontend drives: where its request queues
/// start and what its configuration space holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DeviceType {
    /// virtio-scsi: control, event, then request queues.
    #[default]
    Scsi,
    /// virtio-blk: request queues only.
    Blk,
}

impl DeviceType {
    /// Vring index of the first request queue.
    pub fn first_request_queue(self) -> u16 {
        match self {
            Self::Scsi => FIRST_REQUEST_QUEUE,
            Self::Blk => 0,
        }
    }

    /// The name on command lines and in reports (`scsi`, `blk`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Scsi => "scsi",
            Self::Blk => "blk",
        }
    }
}

/// A device's configuration space as read at connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceConfig {
    /// virtio-scsi's (the defaults when the device does not offer
    /// VHOST_USER_PROTOCOL_F_CONFIG).
    Scsi(ScsiConfig),
    /// virtio-blk's.
    Blk(BlkConfig),
}

/// What the frontend asks of the device.
#[derive(Debug, Clone)]
pub struct FrontendConfig {
    /// The device's vhost-user socket.
    pub socket: PathBuf,
    /// The device type expected behind it.
    pub device: DeviceType,
    /// Ask for VIRTIO_RING_F_EVENT_IDX.
    pub event_idx: bool,
    /// Ask for VIRTIO_RING_F_INDIRECT_DESC.
    pub indirect: bool,
    /// Further virtio feature bits to ask for (device-type bits, or a
    /// notification mode's, see
    /// [`NotifyMode::required_features`](crate::NotifyMode::required_features)).
    pub extra_features: u64,
    /// Bound on every vhost-user reply.
    pub timeout: Duration,
    /// Ask for in-flight tracking (VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD),
    /// to survive a restart of the device ([`Frontend::track_inflight`]).
    pub inflight: bool,
}

impl FrontendConfig {
    /// A virtio-scsi device; EVENT_IDX and indirect descriptors when
    /// offered, 10 s per reply.
    pub fn new(socket: impl AsRef<Path>) -> Self {
        Self {
            socket: socket.as_ref().to_owned(),
            device: DeviceType::Scsi,
            event_idx: true,
            indirect: true,
            extra_features: 0,
            timeout: Duration::from_secs(10),
            inflight: false,
        }
    }
}

/// The in-flight area of a device (VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD):
/// the device records there the requests it has taken and not completed;
/// the frontend keeps it and hands it to the next connection after the
/// device died, which resubmits them. The frontend never reads it.
pub struct InflightRecord {
    info: VhostUserInflight,
    file: File,
}

impl std::fmt::Debug for InflightRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InflightRecord")
            .field("mmap_size", &self.info.mmap_size)
            .field("num_queues", &self.info.num_queues)
            .field("queue_size", &self.info.queue_size)
            .finish_non_exhaustive()
    }
}

/// Errors of the vhost-user conversation.
#[derive(Debug, thiserror::Error)]
pub enum FrontendError {
    /// Connecting to the socket failed.
    #[error("connecting to {path} failed")]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Setting up the socket (timeouts, duplicating it) failed.
    #[error("setting up the vhost-user socket failed")]
    Socket(#[source] io::Error),
    /// Reading a queue's call eventfd failed.
    #[error("reading the call eventfd failed")]
    CallFd(#[source] io::Error),
    /// A vhost-user request failed or got a bad reply.
    #[error("vhost-user {request} failed")]
    Request {
        /// The request.
        request: &'static str,
        /// The vhost crate's error.
        #[source]
        source: vhost::Error,
    },
    /// The device lacks a feature the driver cannot do without.
    #[error("the device does not offer {0}")]
    MissingFeature(&'static str),
    /// The device's configuration space is unusable.
    #[error("bad virtio-scsi configuration")]
    Config(#[source] ConfigError),
    /// The virtio-blk configuration space is shorter than its capacity
    /// field.
    #[error("the virtio-blk configuration space of {len} bytes has no capacity")]
    BlkConfig {
        /// Bytes the device returned.
        len: usize,
    },
    /// A ring address is not in the shared memory.
    #[error("a ring is outside the shared memory")]
    Memory(#[source] MemoryError),
    /// A vring index past what the device offers.
    #[error("vring {index} does not exist (the device has {count})")]
    NoSuchQueue {
        /// The vring index asked for.
        index: u16,
        /// Vrings the device has.
        count: u64,
    },
}

/// The outcome of negotiation.
#[derive(Debug, Clone)]
pub struct Negotiated {
    /// Virtio features the device offered.
    pub offered: u64,
    /// Virtio features acked (a subset of `offered`).
    pub acked: u64,
    /// Protocol features the device offered (those the crate knows).
    pub protocol_offered: VhostUserProtocolFeatures,
    /// Protocol features acked.
    pub protocol_acked: VhostUserProtocolFeatures,
    /// Vrings the device has (GET_QUEUE_NUM with MQ, otherwise the
    /// minimum of the device type: three for virtio-scsi, one for
    /// virtio-blk).
    pub vrings: u64,
    /// The device type.
    pub device: DeviceType,
    /// The device configuration (virtio-scsi defaults without the CONFIG
    /// feature; virtio-blk requires it).
    pub config: DeviceConfig,
    /// Whether `config` was read from the device.
    pub config_read: bool,
}

impl Negotiated {
    /// Whether virtio feature `bit` was acked.
    pub fn has(&self, bit: u32) -> bool {
        bit < 64 && self.acked & (1 << bit) != 0
    }

    /// Request queues usable: the configuration's `num_queues` (for
    /// virtio-blk only with VIRTIO_BLK_F_MQ, else one), bounded by the
    /// vrings the device has. A virtio-scsi device whose configuration
    /// cannot be read (no VHOST_USER_PROTOCOL_F_CONFIG, as SPDK's vhost
    /// target) has the vrings it reports: QEMU's vhost-user-scsi takes
    /// `num_queues` from its own property then, not from the device.
    pub fn request_queues(&self) -> u16 {
        let first = self.device.first_request_queue();
        let by_vrings = self.vrings.saturating_sub(u64::from(first));
        let configured = match &self.config {
            DeviceConfig::Scsi(c) if self.config_read => c.num_queues,
            DeviceConfig::Scsi(_) => u32::MAX,
            DeviceConfig::Blk(c) if self.has(VIRTIO_BLK_F_MQ) => u32::from(c.num_queues),
            DeviceConfig::Blk(_) => 1,
        };
        let n = u64::from(configured).min(by_vrings);
        u16::try_from(n).unwrap_or(u16::MAX)
    }

    /// The virtio-scsi configuration, for a virtio-scsi device.
    pub fn scsi_config(&self) -> Option<&ScsiConfig> {
        match &self.config {
            DeviceConfig::Scsi(c) => Some(c),
            DeviceConfig::Blk(_) => None,
        }
    }

    /// The virtio-blk configuration, for a virtio-blk device.
    pub fn blk_config(&self) -> Option<&BlkConfig> {
        match &self.config {
            DeviceConfig::Blk(c) => Some(c),
            DeviceConfig::Scsi(_) => None,
        }
    }
}

/// A connected vhost-user frontend.
pub struct Frontend {
    inner: VhostFrontend,
    socket: UnixStream,
    negotiated: Negotiated,
    started: Vec<u16>,
}

impl std::fmt::Debug for Frontend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frontend")
            .field("socket", &self.socket)
            .field("negotiated", &self.negotiated)
            .field("started", &self.started)
            .finish_non_exhaustive()
    }
}

/// GET_CONFIG of the first `len` bytes of the configuration space (the
/// vhost crate checks the reply has exactly that size).
fn read_config(inner: &mut VhostFrontend, len: usize) -> Result<Vec<u8>, FrontendError> {
    let size = u32::try_from(len).unwrap_or(u32::MAX);
    let (_, payload) = inner
        .get_config(0, size, VhostUserConfigFlags::empty(), &vec![0; len])
        .map_err(request("GET_CONFIG"))?;
    Ok(payload)
}

fn request(name: &'static str) -> impl FnOnce(vhost::Error) -> FrontendError {
    move |source| FrontendError::Request {
        request: name,
        source,
    }
}

impl Frontend {
    /// Connects to `config.socket` and negotiates: SET_OWNER, features
    /// (ours that the device offers; VIRTIO_F_VERSION_1 required),
    /// protocol features (MQ, CONFIG, REPLY_ACK when offered), the number
    /// of vrings, the configuration space of `config.device` (virtio-blk
    /// needs VHOST_USER_PROTOCOL_F_CONFIG: its capacity is there).
    pub fn connect(config: &FrontendConfig) -> Result<Self, FrontendError> {
        let socket =
            UnixStream::connect(&config.socket).map_err(|source| FrontendError::Connect {
                path: config.socket.clone(),
                source,
            })?;
        socket
            .set_read_timeout(Some(config.timeout))
            .and_then(|()| socket.set_write_timeout(Some(config.timeout)))
            .map_err(FrontendError::Socket)?;
        let stream = socket.try_clone().map_err(FrontendError::Socket)?;
        let mut inner =
            VhostFrontend::from_stream(stream, vhost::vhost_user::message::VHOST_USER_MAX_VRINGS);

        inner.set_owner().map_err(request("SET_OWNER"))?;
        let offered = inner.get_features().map_err(request("GET_FEATURES"))?;
        if offered & (1 << VIRTIO_F_VERSION_1) == 0 {
            return Err(FrontendError::MissingFeature("VIRTIO_F_VERSION_1"));
        }
        let mut wanted = (1 << VIRTIO_F_VERSION_1)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            | config.extra_features;
        if config.event_idx {
            wanted |= 1 << VIRTIO_RING_F_EVENT_IDX;
        }
        if config.indirect {
            wanted |= 1 << VIRTIO_RING_F_INDIRECT_DESC;
        }
        let acked = wanted & offered;

        let mut protocol_offered = VhostUserProtocolFeatures::empty();
        let mut protocol_acked = VhostUserProtocolFeatures::empty();
        if acked & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0 {
            protocol_offered = inner
                .get_protocol_features()
                .map_err(request("GET_PROTOCOL_FEATURES"))?;
            let mut wanted = VhostUserProtocolFeatures::MQ
                | VhostUserProtocolFeatures::CONFIG
                | VhostUserProtocolFeatures::REPLY_ACK;
            if config.inflight {
                wanted |= VhostUserProtocolFeatures::INFLIGHT_SHMFD;
            }
            protocol_acked = protocol_offered & wanted;
            inner
                .set_protocol_features(protocol_acked)
                .map_err(request("SET_PROTOCOL_FEATURES"))?;
            if protocol_acked.contains(VhostUserProtocolFeatures::REPLY_ACK) {
                inner.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
            }
        }
        inner.set_features(acked).map_err(request("SET_FEATURES"))?;

        let vrings = if protocol_acked.contains(VhostUserProtocolFeatures::MQ) {
            inner.get_queue_num().map_err(request("GET_QUEUE_NUM"))?
        } else {
            u64::from(config.device.first_request_queue()) + 1
        };
        let config_read = protocol_acked.contains(VhostUserProtocolFeatures::CONFIG);
        let device_config = match (config.device, config_read) {
            (DeviceType::Scsi, true) => DeviceConfig::Scsi(
                ScsiConfig::parse(&read_config(&mut inner, scsi::CONFIG_SIZE)?)
                    .map_err(FrontendError::Config)?,
            ),
            (DeviceType::Scsi, false) => DeviceConfig::Scsi(ScsiConfig::default()),
            (DeviceType::Blk, true) => {
                // The fields of the features we may negotiate; a longer
                // read fails on devices built on older headers.
                let raw = read_config(&mut inner, blk::CONFIG_SIZE_BASE)?;
                DeviceConfig::Blk(
                    BlkConfig::decode(&raw).ok_or(FrontendError::BlkConfig { len: raw.len() })?,
                )
            }
            (DeviceType::Blk, false) => {
                return Err(FrontendError::MissingFeature(
                    "VHOST_USER_PROTOCOL_F_CONFIG (the virtio-blk capacity is in the configuration space)",
                ));
            }
        };
        Ok(Self {
            inner,
            socket,
            negotiated: Negotiated {
                offered,
                acked,
                protocol_offered,
                protocol_acked,
                vrings,
                device: config.device,
                config: device_config,
                config_read,
            },
            started: Vec::new(),
        })
    }

    /// What was negotiated.
    pub fn negotiated(&self) -> &Negotiated {
        &self.negotiated
    }

    /// A duplicate of the socket, for a queue's wait to notice the device
    /// hanging up ([`QueueEvents::new`](crate::QueueEvents::new)).
    pub fn hangup_fd(&self) -> Result<OwnedFd, FrontendError> {
        let dup = self.socket.try_clone().map_err(FrontendError::Socket)?;
        Ok(OwnedFd::from(dup))
    }

    /// Sets up in-flight tracking for `queues` vrings of up to
    /// `queue_size` entries, as QEMU does at a device's first start:
    /// GET_INFLIGHT_FD (the device creates the area), then SET_INFLIGHT_FD.
    /// Call before starting the queues; keep the record for
    /// [`Self::resume_inflight`].
    pub fn track_inflight(
        &mut self,
        queues: u16,
        queue_size: u16,
    ) -> Result<InflightRecord, FrontendError> {
        if !self
            .negotiated
            .protocol_acked
            .contains(VhostUserProtocolFeatures::INFLIGHT_SHMFD)
        {
            return Err(FrontendError::MissingFeature(
                "VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD",
            ));
        }
        let (info, file) = self
            .inner
            .get_inflight_fd(&VhostUserInflight::new(0, 0, queues, queue_size))
            .map_err(request("GET_INFLIGHT_FD"))?;
        let record = InflightRecord { info, file };
        self.resume_inflight(&record)?;
        Ok(record)
    }

    /// SET_INFLIGHT_FD with the area of an earlier connection: the device
    /// resubmits what it records in flight when each queue starts.
    pub fn resume_inflight(&mut self, record: &InflightRecord) -> Result<(), FrontendError> {
        self.inner
            .set_inflight_fd(&record.info, record.file.as_raw_fd())
            .map_err(request("SET_INFLIGHT_FD"))
    }

    /// SET_MEM_TABLE: shares `mem`'s memfd with the device.
    pub fn set_mem_table(&self, mem: &DriverMemory) -> Result<(), FrontendError> {
        let regions = mem
            .guest_memory()
            .iter()
            .map(VhostUserMemoryRegionInfo::from_guest_region)
            .collect::<Result<Vec<_>, _>>()
            .map_err(request("SET_MEM_TABLE"))?;
        self.inner
            .set_mem_table(&regions)
            .map_err(request("SET_MEM_TABLE"))?;
        Ok(())
    }

    /// Hands `vq` to the device: SET_VRING_NUM, BASE, ADDR, CALL, KICK,
    /// and ENABLE when protocol features were negotiated. `mem` must be the
    /// memory given to [`Self::set_mem_table`], holding the ring.
    pub fn start_queue(&mut self, mem: &DriverMemory, vq: &Virtqueue) -> Result<(), FrontendError> {
        self.hand_over(mem, vq, vq.ring().vring_base())
    }

    /// Hands `vq` back to the device after [`Self::stop_queue`], as
    /// [`Self::start_queue`] does but with the device resuming at `base`,
    /// the value `stop_queue` returned: requests made available while the
    /// vring was stopped are served, no kick needed.
    pub fn resume_queue(
        &mut self,
        mem: &DriverMemory,
        vq: &Virtqueue,
        base: u32,
    ) -> Result<(), FrontendError> {
        self.hand_over(mem, vq, base)
    }

    fn hand_over(
        &mut self,
        mem: &DriverMemory,
        vq: &Virtqueue,
        base: u32,
    ) -> Result<(), FrontendError> {
        let index = vq.index();
        if u64::from(index) >= self.negotiated.vrings {
            return Err(FrontendError::NoSuchQueue {
                index,
                count: self.negotiated.vrings,
            });
        }
        let i = usize::from(index);
        let ring = vq.ring();
        let [desc, avail, used] = vq.addresses();
        let host = |gpa| mem.host_addr(gpa).map_err(FrontendError::Memory);
        let addr = VringConfigData {
            queue_max_size: ring.size(),
            queue_size: ring.size(),
            flags: 0,
            desc_table_addr: host(desc)?,
            used_ring_addr: host(used)?,
            avail_ring_addr: host(avail)?,
            log_addr: None,
        };
        let events = vq.events();
        self.inner
            .set_vring_num(i, ring.size())
            .map_err(request("SET_VRING_NUM"))?;
        match u16::try_from(base) {
            Ok(base) => self
                .inner
                .set_vring_base(i, base)
                .map_err(request("SET_VRING_BASE"))?,
            Err(_) => self.set_vring_base_u32(index, base)?,
        }
        self.inner
            .set_vring_addr(i, &addr)
            .map_err(request("SET_VRING_ADDR"))?;
        self.inner
            .set_vring_call(i, events.call_fd())
            .map_err(request("SET_VRING_CALL"))?;
        // Back-ends signal a new call eventfd at once (libvhost-user's
        // `vu_set_vring_call_exec`, sqcqd): once the message is processed,
        // that call is taken off so that the call counters count
        // completions only. Nothing is lost: every wait for completions
        // looks at the used ring before it sleeps.
        self.sync()?;
        match events.call_fd().read() {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(FrontendError::CallFd(e)),
        }
        self.inner
            .set_vring_kick(i, events.kick_fd())
            .map_err(request("SET_VRING_KICK"))?;
        if self.protocol_features() {
            self.inner
                .set_vring_enable(i, true)
                .map_err(request("SET_VRING_ENABLE"))?;
        }
        self.started.push(index);
        Ok(())
    }

    /// Sets a virtio-blk device's cache mode (VIRTIO_BLK_F_CONFIG_WCE):
    /// SET_CONFIG of `writeback` (write-back, or write-through: every
    /// write durable before it completes), then the configuration space
    /// read again into [`Self::negotiated`].
    pub fn set_writeback(&mut self, writeback: bool) -> Result<(), FrontendError> {
        if self.negotiated.device != DeviceType::Blk
            || !self.negotiated.has(blk::VIRTIO_BLK_F_CONFIG_WCE)
        {
            return Err(FrontendError::MissingFeature("VIRTIO_BLK_F_CONFIG_WCE"));
        }
        let offset = u32::try_from(blk::CONFIG_WCE_OFFSET).unwrap_or(u32::MAX);
        self.inner
            .set_config(
                offset,
                VhostUserConfigFlags::WRITABLE,
                &[u8::from(writeback)],
            )
            .map_err(request("SET_CONFIG"))?;
        self.reread_config()
    }

    /// Reads a virtio-blk device's configuration space again (after a
    /// configuration change: a resize) into [`Self::negotiated`].
    pub fn reread_config(&mut self) -> Result<(), FrontendError> {
        if self.negotiated.device == DeviceType::Blk {
            let raw = read_config(&mut self.inner, blk::CONFIG_SIZE_BASE)?;
            self.negotiated.config = DeviceConfig::Blk(
                BlkConfig::decode(&raw).ok_or(FrontendError::BlkConfig { len: raw.len() })?,
            );
        }
        Ok(())
    }

    /// Waits until the device has processed every message sent so far.
    /// With REPLY_ACK every `set_*` was acknowledged already; without it,
    /// a request with a reply (GET_FEATURES) serves as the barrier, since
    /// a backend handles its messages in order. Call it after starting the
    /// queues: a backend may drop a kick that reaches its worker before
    /// the SET_VRING_ENABLE it has not processed yet (vhost-user-backend
    /// 0.10 does).
    pub fn sync(&self) -> Result<(), FrontendError> {
        if !self
            .negotiated
            .protocol_acked
            .contains(VhostUserProtocolFeatures::REPLY_ACK)
        {
            self.inner.get_features().map_err(request("GET_FEATURES"))?;
        }
        Ok(())
    }

    /// SET_VRING_BASE with all 32 bits: a packed ring's base holds its
    /// next available position in bits 0-15 and its next used position in
    /// bits 16-31 (the vhost-user specification; QEMU sends it so), which
    /// the `vhost` crate's `set_vring_base` cannot carry (it takes a
    /// `u16`). The message goes on the connection's socket like the
    /// crate's own requests, which are synchronous, so the two never
    /// interleave; with REPLY_ACK it asks for the acknowledgement and
    /// reads it.
    fn set_vring_base_u32(&self, index: u16, base: u32) -> Result<(), FrontendError> {
        use std::io::{Read, Write};
        use vhost::vhost_user::message::FrontendReq;

        let code = u32::from(FrontendReq::SET_VRING_BASE);
        let ack = self
            .negotiated
            .protocol_acked
            .contains(VhostUserProtocolFeatures::REPLY_ACK);
        // Header (request, flags: version 1 and NEED_REPLY, body size),
        // then the body, a `VhostUserVringState` (index, num); all
        // little-endian u32.
        let mut flags = 0x1;
        if ack {
            flags |= VhostUserHeaderFlag::NEED_REPLY.bits();
        }
        let mut msg = [0u8; 20];
        for (i, v) in [code, flags, 8, u32::from(index), base]
            .into_iter()
            .enumerate()
        {
            msg[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
        }
        (&self.socket)
            .write_all(&msg)
            .map_err(FrontendError::Socket)?;
        if !ack {
            return Ok(());
        }
        // The reply: a header with REPLY set and an 8-byte body, 0 for
        // success.
        let mut reply = [0u8; 20];
        (&self.socket)
            .read_exact(&mut reply)
            .map_err(FrontendError::Socket)?;
        let word = |i: usize| {
            u32::from_le_bytes([
                reply[4 * i],
                reply[4 * i + 1],
                reply[4 * i + 2],
                reply[4 * i + 3],
            ])
        };
        let is_reply = word(1) & VhostUserHeaderFlag::REPLY.bits() != 0;
        if word(0) != code || !is_reply || word(2) != 8 || word(3) != 0 || word(4) != 0 {
            return Err(FrontendError::Request {
                request: "SET_VRING_BASE",
                source: vhost::Error::VhostUserProtocol(
                    vhost::vhost_user::Error::BackendInternalError,
                ),
            });
        }
        Ok(())
    }

    /// Stops vring `index`: disables it (with protocol features) and
    /// fetches its base with GET_VRING_BASE, after which the device no
    /// longer touches it. Returns the base (the next avail index the device
    /// would have read).
    pub fn stop_queue(&mut self, index: u16) -> Result<u32, FrontendError> {
        let i = usize::from(index);
        self.started.retain(|&s| s != index);
        if self.protocol_features() {
            self.inner
                .set_vring_enable(i, false)
                .map_err(request("SET_VRING_ENABLE"))?;
        }
        self.inner
            .get_vring_base(i)
            .map_err(request("GET_VRING_BASE"))
    }

    /// Stops every started vring, then disconnects. Returns each vring's
    /// base.
    pub fn stop(mut self) -> Result<Vec<(u16, u32)>, FrontendError> {
        let started = std::mem::take(&mut self.started);
        let mut bases = Vec::with_capacity(started.len());
        for index in started {
            bases.push((index, self.stop_queue(index)?));
        }
        Ok(bases)
    }

    fn protocol_features(&self) -> bool {
        self.negotiated.acked & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scsi(vrings: u64, config: Option<u32>) -> Negotiated {
        Negotiated {
            offered: 0,
            acked: 0,
            protocol_offered: VhostUserProtocolFeatures::empty(),
            protocol_acked: VhostUserProtocolFeatures::empty(),
            vrings,
            device: DeviceType::Scsi,
            config: DeviceConfig::Scsi(ScsiConfig {
                num_queues: config.unwrap_or(1),
                ..ScsiConfig::default()
            }),
            config_read: config.is_some(),
        }
    }

    #[test]
    fn scsi_request_queues_come_from_the_config_or_else_the_vrings() {
        assert_eq!(scsi(10, Some(4)).request_queues(), 4, "as configured");
        assert_eq!(scsi(4, Some(4)).request_queues(), 2, "bounded by vrings");
        assert_eq!(scsi(10, None).request_queues(), 8, "no config: vrings - 2");
        assert_eq!(scsi(3, None).request_queues(), 1, "no MQ: three vrings");
    }
}
