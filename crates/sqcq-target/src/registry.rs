//! The devices and workers of a running daemon, and every change to them:
//! what the management API ([`crate::rpc`]) and a configuration reload
//! (SIGHUP) both go through, so that a change made one way or the other
//! gives the same daemon.
//!
//! Changes are serialised (one at a time, whoever asks); reading the
//! device list never waits for a change that drains I/O.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak, mpsc};

use serde::Serialize;
use thiserror::Error;
use tracing::{error, info, warn};

use crate::blk::device::BlkDevice;
use crate::config::{
    BackstoreKind, ConfigError, DaemonConfig, DeviceConfig, DeviceType, LunSpec, SaveError,
};
use crate::manage::{DeviceControl, DeviceKind};
use crate::runtime::events::{Event, EventBus};
use crate::runtime::metrics::QueueSnapshot;
use crate::runtime::qos::QosLimits;
use crate::runtime::worker::{PoolError, WorkerGone, WorkerPool};
use crate::scsi::device::ScsiDevice;
use crate::scsi::hotplug::HotplugError;
use crate::scsi::target::{LunEntry, Target, TargetError, spec_limits, wwn_seed};
use crate::spec::OpenError;
use crate::transport::device::{DeviceHandle, DeviceParams, DeviceShared, ManageError};
use crate::transport::device_type::VirtioDevice;
use crate::transport::session::MoveError;

/// Most devices a daemon serves (each has a thread, a socket, eventfds).
pub const MAX_DEVICES: usize = 1024;
use crate::transport::listen::{ListenError, SocketSource};

/// A change that could not be made.
#[derive(Debug, Error)]
pub enum RegistryError {
    /// No device has this number.
    #[error("no device {0}")]
    NoDevice(u32),
    /// The device has no such request queue.
    #[error("device {device} has no request queue {rq}")]
    NoQueue {
        /// The device.
        device: u32,
        /// The request queue.
        rq: u16,
    },
    /// The worker is assigned to, or runs, a queue of a device.
    #[error("worker {worker} serves device {device}: attach its queues elsewhere first")]
    WorkerInUse {
        /// The worker.
        worker: usize,
        /// The device.
        device: u32,
    },
    /// A frontend is connected to the device: deleting it, or removing
    /// a LUN, takes a disk from a running VM (`force` overrides).
    #[error(
        "device {device} is in use: a frontend is connected, whose VM would lose {what}; \
         stop the VM or detach the disk first, or pass force=true"
    )]
    InUse {
        /// The device.
        device: u32,
        /// What the VM would lose.
        what: String,
    },
    /// [`MAX_DEVICES`] exist already.
    #[error("{MAX_DEVICES} devices exist already")]
    Full,
    /// Another device listens on this socket path.
    #[error("{0}: socket path in use by device {1}")]
    SocketInUse(PathBuf, u32),
    /// The device's configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The device could not be built or started.
    #[error(transparent)]
    Start(#[from] StartError),
    /// A LUN change failed.
    #[error(transparent)]
    Lun(#[from] HotplugError),
    /// A worker could not be created or freed.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// A worker did not answer.
    #[error(transparent)]
    Gone(#[from] WorkerGone),
    /// A device's control thread did not answer.
    #[error(transparent)]
    Control(#[from] ManageError),
    /// A queue could not move (it runs where it ran).
    #[error(transparent)]
    Move(MoveError),
    /// The daemon is shutting down: no change is made any more (a device
    /// whose backstores were opening is not created).
    #[error("the daemon is shutting down")]
    ShuttingDown,
    /// An RBD LUN in a daemon under `--seccomp`: librados opens network
    /// sockets to the cluster at any time, which the filter refuses.
    #[error(
        "RBD LUNs cannot be served under --seccomp (librados connects to the cluster's daemons at any time, which the filter refuses)"
    )]
    SandboxedRbd,
}

/// Why a device could not be built or started.
#[derive(Debug, Error)]
pub enum StartError {
    /// A LUN could not be set up.
    #[error("device {device}")]
    Target {
        /// The socket path of the device.
        device: String,
        /// What failed.
        #[source]
        source: TargetError,
    },
    /// The disk of a blk device could not be opened.
    #[error("device {device}: disk")]
    Disk {
        /// The socket path of the device.
        device: String,
        /// What failed.
        #[source]
        source: OpenError,
    },
    /// Its socket could not be bound (or a passed one used).
    #[error("cannot listen")]
    Listen(#[from] ListenError),
    /// Its threads or eventfds could not be created.
    #[error("cannot start {what}")]
    Io {
        /// What.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// A device type, and the SCSI or blk device itself.
type Built = (Arc<dyn VirtioDevice>, DeviceKind);

/// Builds the device `config` describes (opens its LUNs or its disk).
fn build(id: u32, config: &DeviceConfig) -> Result<Built, StartError> {
    let device = config.socket_path.display().to_string();
    let io = |source| StartError::Io {
        what: format!("device {device}"),
        source,
    };
    match config.device_type {
        DeviceType::Scsi => {
            let seed = wwn_seed(&config.socket_path.to_string_lossy());
            let target =
                Target::build(&config.luns, seed).map_err(|source| StartError::Target {
                    device: device.clone(),
                    source,
                })?;
            for e in target.luns() {
                info!(device = id, lun = e.lun, geometry = %e.backstore.geometry(), "LUN ready");
            }
            let scsi = Arc::new(ScsiDevice::new(target).map_err(io)?);
            Ok((
                Arc::clone(&scsi) as Arc<dyn VirtioDevice>,
                DeviceKind::Scsi(scsi),
            ))
        }
        DeviceType::Blk => {
            // Validated: exactly one spec.
            let spec = &config.luns[0];
            let backstore = spec.open_backstore().map_err(|source| StartError::Disk {
                device: device.clone(),
                source,
            })?;
            // `read_only`: the device's (the backstore's geometry says
            // only whether the storage itself is).
            info!(device = id, geometry = %backstore.geometry(),
                read_only = spec.read_only || backstore.geometry().read_only, "disk ready");
            // The default serial: the socket's name, as QEMU's
            // vhost-user-blk users expect something stable.
            let serial = spec.serial.clone().unwrap_or_else(|| {
                config
                    .socket_path
                    .file_name()
                    .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
            });
            let blk = Arc::new(BlkDevice::new(backstore, serial, spec.read_only).map_err(io)?);
            Ok((
                Arc::clone(&blk) as Arc<dyn VirtioDevice>,
                DeviceKind::Blk(blk),
            ))
        }
    }
}

/// Where a device was defined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The configuration (at start or at a reload): a reload that no
    /// longer finds it deletes it.
    Config,
    /// The management API: a reload leaves it alone unless the file
    /// names its socket.
    Api,
}

struct Entry {
    handle: DeviceHandle,
    kind: DeviceKind,
    origin: Origin,
    /// The configuration the device has now: the one it was created with,
    /// with every LUN change and queue attachment since.
    config: DeviceConfig,
}

/// A device as the management API lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceStatus {
    /// Its number.
    pub id: u32,
    /// `scsi` or `blk`.
    #[serde(rename = "type")]
    pub device_type: &'static str,
    /// Its vhost-user socket.
    pub socket_path: PathBuf,
    /// Whether a frontend is connected.
    pub connected: bool,
    /// Request queues announced.
    pub num_queues: u16,
    /// Largest vring size.
    pub queue_size: u16,
    /// Its IOPS and bandwidth limits (absent: none).
    #[serde(skip_serializing_if = "QosLimits::is_off")]
    pub qos: QosLimits,
    /// It takes no new request (`device_quiesce`).
    pub quiesced: bool,
    /// Its LUNs (a blk device: its disk, LUN 0).
    pub luns: Vec<LunStatus>,
    /// Its request queues.
    pub queues: Vec<QueueStatus>,
}

/// A LUN (or a blk device's disk).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LunStatus {
    /// Its number.
    pub lun: u16,
    /// Backstore kind.
    pub kind: &'static str,
    /// Backing file, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// Logical blocks.
    pub blocks: u64,
    /// Logical block size.
    pub block_size: u32,
    /// Whether writes are refused.
    pub read_only: bool,
    /// Its own IOPS and bandwidth limits (SCSI; absent: none).
    #[serde(skip_serializing_if = "QosLimits::is_off")]
    pub qos: QosLimits,
}

/// A request queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueueStatus {
    /// Request queue number (0: the device's first request virtqueue).
    pub rq: u16,
    /// Its virtqueue index.
    pub vq: u16,
    /// The worker assigned to it (`null`: round robin when it starts).
    pub assigned_worker: Option<usize>,
    /// The worker serving it now (`null`: not running).
    pub worker: Option<usize>,
}

/// A worker as the management API lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WorkerStatus {
    /// Its number.
    pub id: usize,
    /// The CPU it is bound to.
    pub cpu: Option<usize>,
    /// Bound to `cpu` but running off it: the CPU went offline or left
    /// the daemon's cpuset (it comes back when the CPU does).
    pub cpu_displaced: bool,
    /// Times it was found moved off `cpu`.
    pub cpu_displacements: u64,
    /// CPU time of the thread so far, ns (`null` if it could not be
    /// read): `sqcqd top` shows its rate.
    pub cpu_ns: Option<u64>,
    /// `[device, vq]` of every queue it serves now.
    pub queues: Vec<(u32, u16)>,
}

fn kind_name(kind: BackstoreKind) -> &'static str {
    match kind {
        BackstoreKind::Null => "null",
        BackstoreKind::Ram => "ram",
        BackstoreKind::File => "file",
        BackstoreKind::Rbd => "rbd",
    }
}

/// The devices and workers of a daemon.
pub struct Registry {
    pool: Arc<WorkerPool>,
    /// What the daemon was started with, outside its devices and workers:
    /// what a reload cannot change.
    settings: Mutex<Option<DaemonConfig>>,
    /// Where device sockets come from.
    sockets: SocketSource,
    devices: Mutex<BTreeMap<u32, Entry>>,
    /// Devices whose backstores are opening (`create`): their numbers and
    /// socket paths, which no other device may take meanwhile. Taken
    /// inside `devices`' lock, never the other way round.
    creating: Mutex<BTreeMap<u32, PathBuf>>,
    /// `(device, lun)` of the LUNs whose backstores are opening
    /// (`lun_add`), likewise.
    adding: Mutex<BTreeMap<(u32, u16), ()>>,
    /// Set by [`Registry::shutdown`] under the lock of changes: no change
    /// begins after it (a device whose backstores opened across it is
    /// not created).
    closed: AtomicBool,
    /// Held for the whole of every change, so changes never interleave,
    /// but for the opening of backstores by `create` and `lun_add`, which
    /// may take as long as a Ceph cluster's connect time-out: other
    /// changes go on meanwhile.
    changes: Mutex<()>,
    /// Where backstores report a size changed in the storage (an RBD
    /// image resized in the cluster): `(device, lun, bytes)`, applied by
    /// the thread [`Registry::follow_storage_sizes`] starts.
    resizes: Mutex<Option<mpsc::Sender<(u32, u16, u64)>>>,
    /// What subscribers of events are told.
    events: Arc<EventBus>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("devices", &self.lock().len())
            .finish_non_exhaustive()
    }
}

/// What a configuration reload did, and what it could not do.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReloadReport {
    /// The changes made, one line each.
    pub changed: Vec<String>,
    /// The changes that failed or need a restart, one line each.
    pub errors: Vec<String>,
}

/// `limits` for a log line.
fn qos_text(limits: &QosLimits) -> String {
    if limits.is_off() {
        return "no limit".into();
    }
    let mut parts = Vec::new();
    if let Some(n) = limits.iops {
        parts.push(format!("{n} IOPS"));
    }
    if let Some(n) = limits.bps {
        parts.push(format!("{n} bytes/s"));
    }
    let burst = limits
        .burst_ms
        .unwrap_or(crate::runtime::qos::DEFAULT_BURST_MS);
    parts.push(format!("burst {burst} ms"));
    parts.join(", ")
}

fn plain<T>(r: Result<T, PoisonError<T>>) -> T {
    r.unwrap_or_else(PoisonError::into_inner)
}

impl Registry {
    /// An empty registry over `pool`.
    pub fn new(pool: Arc<WorkerPool>) -> Self {
        Registry {
            pool,
            settings: Mutex::new(None),
            sockets: SocketSource::default(),
            devices: Mutex::new(BTreeMap::new()),
            creating: Mutex::new(BTreeMap::new()),
            adding: Mutex::new(BTreeMap::new()),
            closed: AtomicBool::new(false),
            changes: Mutex::new(()),
            resizes: Mutex::new(None),
            events: Arc::default(),
        }
    }

    /// The daemon's events, for the admin socket's subscribers.
    pub fn events(&self) -> &Arc<EventBus> {
        &self.events
    }

    /// Starts the thread that makes LUN capacities follow their storage
    /// when it is resized outside the daemon (`rbd resize`): the guest
    /// sees it as a `lun_resize` (blk: a configuration change; SCSI:
    /// CAPACITY DATA HAS CHANGED). LUNs created from now on are watched.
    pub fn follow_storage_sizes(self: &Arc<Self>) -> std::io::Result<()> {
        let (tx, rx) = mpsc::channel::<(u32, u16, u64)>();
        let registry: Weak<Registry> = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("sqcq-resize".into())
            .spawn(move || {
                for (id, lun, bytes) in rx {
                    let Some(registry) = registry.upgrade() else {
                        break;
                    };
                    let _change = registry.change();
                    let result = registry
                        .control(id)
                        .and_then(|c| Ok(c.resize_lun(lun, bytes)?));
                    match result {
                        Ok(blocks) => {
                            info!(device = id, lun, blocks, "capacity follows the storage");
                        }
                        Err(e) => warn!(device = id, lun, bytes, "storage resized: {e}"),
                    }
                }
            })?;
        *plain(self.resizes.lock()) = Some(tx);
        Ok(())
    }

    /// Refuses RBD LUNs when the daemon runs (or will run) under a
    /// seccomp filter.
    fn check_sandbox(&self, luns: &[LunSpec]) -> Result<(), RegistryError> {
        let sandboxed = plain(self.settings.lock())
            .as_ref()
            .is_some_and(|s| s.seccomp != crate::sandbox::SeccompMode::Off);
        if sandboxed && luns.iter().any(|l| l.kind == BackstoreKind::Rbd) {
            return Err(RegistryError::SandboxedRbd);
        }
        Ok(())
    }

    /// Asks the backstores of device `id` (only LUN `only`, if given) to
    /// report sizes changed in the storage.
    fn watch_sizes(&self, id: u32, kind: &DeviceKind, only: Option<u16>) {
        let Some(tx) = plain(self.resizes.lock()).clone() else {
            return;
        };
        let luns: Vec<(u16, Arc<dyn sqcq_backstore::Backstore>)> = match kind {
            DeviceKind::Blk(blk) => vec![(0, Arc::clone(blk.backstore()))],
            DeviceKind::Scsi(scsi) => scsi
                .target
                .current()
                .luns()
                .iter()
                .map(|e| (e.lun, Arc::clone(&e.backstore)))
                .collect(),
        };
        for (lun, backstore) in luns
            .into_iter()
            .filter(|(l, _)| only.is_none_or(|o| o == *l))
        {
            let tx = tx.clone();
            let watcher = Box::new(move |bytes| {
                // The thread is gone only when the daemon is.
                let _ = tx.send((id, lun, bytes));
            });
            if let Err(e) = backstore.watch_size(watcher) {
                warn!(device = id, lun, "cannot follow the storage's size: {e}");
            }
        }
    }

    /// Records what the daemon was started with (a reload reports any
    /// change to what is outside its devices and workers).
    pub fn set_settings(&self, config: &DaemonConfig) {
        *plain(self.settings.lock()) = Some(fixed(config));
    }

    /// The daemon as a configuration that a fresh start (or a reload)
    /// turns back into it: the options it started with, its workers and
    /// their CPUs, every device as it is now. Also what the file cannot
    /// say, one line each (a start numbers devices and workers from 0 up,
    /// so gaps left by deletions close).
    pub fn running_config(&self) -> (DaemonConfig, Vec<String>) {
        let mut notes = Vec::new();
        let mut config = plain(self.settings.lock()).clone().unwrap_or_default();
        let workers = self.pool.list();
        config.workers = workers.last().map_or(1, |w| w.id + 1);
        for gap in (0..config.workers).filter(|i| !workers.iter().any(|w| w.id == *i)) {
            notes.push(format!(
                "worker {gap} was freed: a start from this file runs it again (idle)"
            ));
        }
        // `cpus[w]` binds worker `w`: the bound workers from 0 up.
        let cpu_of = |i: usize| workers.iter().find(|w| w.id == i).and_then(|w| w.cpu);
        config.poll.cpus = (0..config.workers).map_while(cpu_of).collect();
        for w in workers.iter().filter(|w| w.id >= config.poll.cpus.len()) {
            if let Some(cpu) = w.cpu {
                notes.push(format!(
                    "worker {} is bound to CPU {cpu} but worker {} is not: a start from this                      file leaves it unbound (worker_create cpu={cpu} binds it again)",
                    w.id,
                    config.poll.cpus.len()
                ));
            }
        }
        let devices = self.lock();
        for (expected, id) in devices.keys().enumerate() {
            if u32::try_from(expected).ok() != Some(*id) {
                notes.push(format!(
                    "device {id} is numbered {expected} by a start from this file"
                ));
            }
        }
        config.devices = devices
            .values()
            .map(|e| {
                let mut d = e.config.clone();
                for lun in &mut d.luns {
                    lun.defer_lock = false;
                }
                d
            })
            .collect();
        (config, notes)
    }

    /// Writes the running configuration to `path` (see
    /// [`Self::running_config`]) between changes; returns what the file
    /// cannot say.
    pub fn save(&self, path: &std::path::Path) -> Result<Vec<String>, SaveError> {
        let _change = self.change();
        self.save_locked(path)
    }

    fn save_locked(&self, path: &std::path::Path) -> Result<Vec<String>, SaveError> {
        let (config, notes) = self.running_config();
        crate::config::save_file(path, &config)?;
        info!(path = %path.display(), devices = config.devices.len(), "configuration saved");
        Ok(notes)
    }

    /// The file `--save-config` names, if any.
    pub fn autosave_path(&self) -> Option<PathBuf> {
        plain(self.settings.lock())
            .as_ref()
            .and_then(|s| s.service.save_config.clone())
    }

    /// `result`, after saving the configuration to the `--save-config`
    /// file if the change it reports was made (called within the change,
    /// so that saves follow the order of changes). A save that fails is
    /// logged: the change itself was made.
    fn saved<T>(&self, result: Result<T, RegistryError>) -> Result<T, RegistryError> {
        if result.is_ok()
            && let Some(path) = self.autosave_path()
            && let Err(e) = self.save_locked(&path)
        {
            error!(
                "--save-config: the change was made, but not saved: {}",
                crate::runtime::error_chain(&e)
            );
        }
        result
    }

    /// The registry, its devices' sockets coming from `sockets` (passed
    /// in by the service manager, or bound with the configured
    /// ownership).
    pub fn with_sockets(mut self, sockets: SocketSource) -> Self {
        self.sockets = sockets;
        self
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u32, Entry>> {
        // Plain data: a panic while holding the lock leaves it consistent.
        plain(self.devices.lock())
    }

    fn change(&self) -> MutexGuard<'_, ()> {
        plain(self.changes.lock())
    }

    /// The lock of changes, for a change asked for (through the API or a
    /// reload): refused once the daemon is shutting down, so that none
    /// runs beside or after [`Self::shutdown`].
    fn begin_change(&self) -> Result<MutexGuard<'_, ()>, RegistryError> {
        let change = self.change();
        // Relaxed: stored under this lock too (`shutdown`).
        if self.closed.load(Ordering::Relaxed) {
            return Err(RegistryError::ShuttingDown);
        }
        Ok(change)
    }

    /// The worker pool.
    pub fn pool(&self) -> &Arc<WorkerPool> {
        &self.pool
    }

    /// Creates the device `config` describes under the lowest free
    /// number, and starts listening on its socket. Its backstores open
    /// outside the lock of changes: other changes, and reads, go on
    /// meanwhile; its number and socket path are reserved until then.
    pub fn create(&self, config: DeviceConfig, origin: Origin) -> Result<u32, RegistryError> {
        let (reserved, config) = {
            let _change = self.begin_change()?;
            self.reserve(config)?
        };
        let built = build(reserved.key, &config)?;
        let _change = self.begin_change()?;
        self.saved(self.finish_create(&reserved, built, config, origin))
    }

    /// [`Self::create`] within a change (a reload): the backstores open
    /// under its lock.
    fn create_locked(&self, config: DeviceConfig, origin: Origin) -> Result<u32, RegistryError> {
        let (reserved, config) = self.reserve(config)?;
        let built = build(reserved.key, &config)?;
        self.finish_create(&reserved, built, config, origin)
    }

    /// Checks `config` and reserves the lowest free number and its socket
    /// path for it.
    fn reserve(
        &self,
        config: DeviceConfig,
    ) -> Result<(DeviceReserved<'_>, DeviceConfig), RegistryError> {
        config.validate(|w| self.pool.exists(w))?;
        self.check_sandbox(&config.luns)?;
        let devices = self.lock();
        let mut creating = plain(self.creating.lock());
        if devices.len() + creating.len() >= MAX_DEVICES {
            return Err(RegistryError::Full);
        }
        let path = &config.socket_path;
        if let Some(other) = (devices.iter())
            .find(|(_, e)| e.config.socket_path == *path)
            .map(|(id, _)| *id)
            .or_else(|| creating.iter().find(|(_, p)| *p == path).map(|(id, _)| *id))
        {
            return Err(RegistryError::SocketInUse(config.socket_path, other));
        }
        let id = (0..=u32::MAX)
            .find(|i| !devices.contains_key(i) && !creating.contains_key(i))
            .unwrap_or(u32::MAX);
        creating.insert(id, config.socket_path.clone());
        let reserved = Reserved {
            table: &self.creating,
            key: id,
        };
        Ok((reserved, config))
    }

    /// Starts the device `build` made for `reserved` and enters it in
    /// the table (within a change).
    fn finish_create(
        &self,
        reserved: &DeviceReserved<'_>,
        (device, kind): Built,
        mut config: DeviceConfig,
        origin: Origin,
    ) -> Result<u32, RegistryError> {
        let id = reserved.key;
        // A worker its queue map names may have been freed meanwhile.
        config.validate(|w| self.pool.exists(w))?;
        if config.luns.is_empty() && config.device_type == DeviceType::Scsi {
            warn!(device = id, socket = %config.socket_path.display(),
                "no LUN: the guest sees an empty SCSI target until lun_add adds one \
                 (--lun kind=...,size=... at start)");
        }
        // The LUN numbers the target gave (a spec without `lun` is
        // numbered by its position, as `Target::build` does): what a
        // reload compares.
        if config.device_type == DeviceType::Scsi {
            for (i, spec) in config.luns.iter_mut().enumerate() {
                spec.lun = spec.lun.or(u16::try_from(i).ok());
            }
        }
        let params = DeviceParams {
            num_queues: config.num_queues,
            queue_size: config.queue_size,
            queue_map: config.queue_map.clone(),
            qos: config.qos,
        };
        let socket = self
            .sockets
            .listen(&config.socket_path)
            .map_err(StartError::from)?;
        let handle = DeviceHandle::spawn(
            id,
            socket,
            params,
            device,
            Arc::clone(&self.pool),
            Arc::clone(&self.events),
        )
        .map_err(|source| StartError::Io {
            what: format!("device {}", config.socket_path.display()),
            source,
        })?;
        self.events.publish(Event::DeviceCreated { device: id });
        self.watch_sizes(id, &kind, None);
        let entry = Entry {
            handle,
            kind,
            origin,
            config,
        };
        self.lock().insert(id, entry);
        Ok(id)
    }

    /// Deletes device `id`: stops accepting, ends the connection after the
    /// requests in flight completed (as at shutdown), removes the socket.
    pub fn delete(&self, id: u32, force: bool) -> Result<(), RegistryError> {
        let _change = self.begin_change()?;
        if !force {
            self.refuse_in_use(id, || "its disk".to_owned())?;
        }
        self.saved(self.delete_locked(id))
    }

    /// [`RegistryError::InUse`] if a frontend is connected to device `id`
    /// (a change made with `force` skips this; a reload, whose file is
    /// the operator's explicit word, too).
    fn refuse_in_use(&self, id: u32, what: impl FnOnce() -> String) -> Result<(), RegistryError> {
        let devices = self.lock();
        let e = devices.get(&id).ok_or(RegistryError::NoDevice(id))?;
        // Relaxed: a snapshot; a frontend that connects right after this
        // look is one that connected after the change.
        if e.handle
            .shared()
            .connected
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return Err(RegistryError::InUse {
                device: id,
                what: what(),
            });
        }
        Ok(())
    }

    fn delete_locked(&self, id: u32) -> Result<(), RegistryError> {
        let entry = self.lock().remove(&id).ok_or(RegistryError::NoDevice(id))?;
        entry.handle.shutdown();
        info!(device = id, "device deleted");
        self.events.publish(Event::DeviceDeleted { device: id });
        Ok(())
    }

    /// What a LUN change or a fault injection on device `id` needs.
    pub fn control(&self, id: u32) -> Result<DeviceControl, RegistryError> {
        let devices = self.lock();
        let e = devices.get(&id).ok_or(RegistryError::NoDevice(id))?;
        Ok(DeviceControl {
            info: Arc::clone(&e.handle.shared().info),
            kind: e.kind.clone(),
            pool: Arc::clone(&self.pool),
        })
    }

    /// What the runtime shares with device `id`'s control thread.
    pub fn shared(&self, id: u32) -> Option<Arc<DeviceShared>> {
        self.lock().get(&id).map(|e| Arc::clone(e.handle.shared()))
    }

    /// The SCSI device of device `id`.
    pub fn scsi(&self, id: u32) -> Option<Arc<ScsiDevice>> {
        match &self.lock().get(&id)?.kind {
            DeviceKind::Scsi(s) => Some(Arc::clone(s)),
            DeviceKind::Blk(_) => None,
        }
    }

    /// The numbers of every device.
    pub fn ids(&self) -> Vec<u32> {
        self.lock().keys().copied().collect()
    }

    fn update_config(&self, id: u32, f: impl FnOnce(&mut DeviceConfig)) {
        if let Some(e) = self.lock().get_mut(&id) {
            f(&mut e.config);
        }
    }

    /// Adds a LUN to SCSI device `id` (`spec.lun` is required). Its
    /// backstore opens outside the lock of changes, as in
    /// [`Self::create`]; the LUN number is reserved until then.
    pub fn lun_add(&self, id: u32, spec: &LunSpec) -> Result<u16, RegistryError> {
        let (_reserved, control) = {
            let _change = self.begin_change()?;
            self.reserve_lun(id, spec)?
        };
        let entry = control.open_lun(spec)?;
        let _change = self.begin_change()?;
        self.saved(self.finish_lun_add(id, spec, &control, entry))
    }

    fn lun_add_locked(&self, id: u32, spec: &LunSpec) -> Result<u16, RegistryError> {
        let (_reserved, control) = self.reserve_lun(id, spec)?;
        let entry = control.open_lun(spec)?;
        self.finish_lun_add(id, spec, &control, entry)
    }

    /// Reserves `spec.lun` of device `id` while its backstore opens.
    fn reserve_lun(
        &self,
        id: u32,
        spec: &LunSpec,
    ) -> Result<(LunReserved<'_>, DeviceControl), RegistryError> {
        self.check_sandbox(std::slice::from_ref(spec))?;
        let control = self.control(id)?;
        control.scsi()?;
        let lun = spec.lun.ok_or(HotplugError::BadLun)?;
        if plain(self.adding.lock()).insert((id, lun), ()).is_some() {
            return Err(HotplugError::Exists(lun).into());
        }
        let reserved = Reserved {
            table: &self.adding,
            key: (id, lun),
        };
        Ok((reserved, control))
    }

    /// Adds the LUN opened for device `id` as `opened` knew it (within a
    /// change).
    fn finish_lun_add(
        &self,
        id: u32,
        spec: &LunSpec,
        opened: &DeviceControl,
        entry: LunEntry,
    ) -> Result<u16, RegistryError> {
        // The device may have been deleted while the backstore opened,
        // and its number taken again.
        let control = self.control(id)?;
        if !Arc::ptr_eq(&control.info, &opened.info) {
            return Err(RegistryError::NoDevice(id));
        }
        let lun = control.install_lun(entry)?;
        self.watch_sizes(id, &control.kind, Some(lun));
        self.update_config(id, |c| {
            let mut spec = spec.clone();
            spec.lun = Some(lun);
            c.luns.push(spec);
        });
        Ok(lun)
    }

    /// Removes `lun` of SCSI device `id` once its requests in flight
    /// completed.
    pub fn lun_remove(&self, id: u32, lun: u16, force: bool) -> Result<(), RegistryError> {
        let _change = self.begin_change()?;
        if !force {
            // A LUN that is not there is that error first, whoever is
            // connected.
            self.control(id)?.check_lun(lun)?;
            self.refuse_in_use(id, || format!("LUN {lun}"))?;
        }
        self.saved(self.lun_remove_locked(id, lun))
    }

    fn lun_remove_locked(&self, id: u32, lun: u16) -> Result<(), RegistryError> {
        self.control(id)?.remove_lun(lun)?;
        self.update_config(id, |c| c.luns.retain(|s| s.lun != Some(lun)));
        Ok(())
    }

    /// Changes the capacity of `lun` of device `id` (a blk device's disk
    /// is LUN 0) to `bytes`; returns the new number of blocks.
    pub fn lun_resize(&self, id: u32, lun: u16, bytes: u64) -> Result<u64, RegistryError> {
        let _change = self.begin_change()?;
        self.saved(self.lun_resize_locked(id, lun, bytes))
    }

    fn lun_resize_locked(&self, id: u32, lun: u16, bytes: u64) -> Result<u64, RegistryError> {
        let blocks = self.control(id)?.resize_lun(lun, bytes)?;
        let blk = self
            .lock()
            .get(&id)
            .is_some_and(|e| e.config.device_type == DeviceType::Blk);
        self.update_config(id, |c| {
            for s in &mut c.luns {
                if blk || s.lun == Some(lun) {
                    s.size = Some(bytes);
                }
            }
        });
        Ok(blocks)
    }

    /// Assigns request queue `rq` of device `id` to `worker` (`None`:
    /// round robin), and moves it there at once if it runs elsewhere,
    /// without losing a request (see `Session::rebalance`). Returns
    /// `(vq, from, to)` of the queue if it moved.
    pub fn attach(
        &self,
        id: u32,
        rq: u16,
        worker: Option<usize>,
    ) -> Result<Option<(u16, usize, usize)>, RegistryError> {
        let _change = self.begin_change()?;
        self.saved(self.attach_locked(id, rq, worker))
    }

    fn attach_locked(
        &self,
        id: u32,
        rq: u16,
        worker: Option<usize>,
    ) -> Result<Option<(u16, usize, usize)>, RegistryError> {
        if let Some(w) = worker.filter(|&w| !self.pool.exists(w)) {
            return Err(PoolError::NoWorker(w).into());
        }
        let (shared, link) = {
            let devices = self.lock();
            let e = devices.get(&id).ok_or(RegistryError::NoDevice(id))?;
            (Arc::clone(e.handle.shared()), e.handle.manage())
        };
        if rq >= shared.params.num_queues {
            return Err(RegistryError::NoQueue { device: id, rq });
        }
        let before = shared.placement.assigned(rq);
        shared.placement.assign(rq, worker);
        let vq = u16::try_from(shared.device.local_queues())
            .unwrap_or(u16::MAX)
            .saturating_add(rq);
        // Not under the device table's lock: a move waits for I/O.
        let outcome = link
            .rebalance()
            .map_err(RegistryError::from)
            .and_then(|moves| {
                match moves.into_iter().find(|m| match m {
                    Ok((v, ..)) => *v == vq,
                    Err(e) => e.vq() == vq,
                }) {
                    None => Ok(None),
                    Some(Ok(m)) => Ok(Some(m)),
                    Some(Err(e)) => Err(RegistryError::Move(e)),
                }
            });
        match outcome {
            Ok(moved) => {
                self.update_config(id, |c| c.queue_map = shared.placement.map());
                Ok(moved)
            }
            Err(e) => {
                // The queue runs where it ran: so does the assignment.
                shared.placement.assign(rq, before);
                Err(e)
            }
        }
    }

    /// Starts a worker (VHOST_NEW_WORKER); returns its number.
    pub fn worker_create(&self, cpu: Option<usize>) -> Result<usize, RegistryError> {
        let _change = self.begin_change()?;
        self.saved(self.pool.create(cpu).map_err(RegistryError::from))
    }

    /// Ends worker `w` (VHOST_FREE_WORKER): refused while a queue is
    /// assigned to it or runs on it.
    pub fn worker_free(&self, w: usize) -> Result<(), RegistryError> {
        let _change = self.begin_change()?;
        self.saved(self.worker_free_locked(w))
    }

    fn worker_free_locked(&self, w: usize) -> Result<(), RegistryError> {
        if let Some((id, _)) = self
            .lock()
            .iter()
            .find(|(_, e)| e.handle.shared().placement.uses(w))
        {
            return Err(RegistryError::WorkerInUse {
                worker: w,
                device: *id,
            });
        }
        Ok(self.pool.free(w)?)
    }

    /// Every device, by number.
    pub fn list(&self) -> Vec<DeviceStatus> {
        self.lock().iter().map(|(&id, e)| status(id, e)).collect()
    }

    /// Every worker, by number, with the queues it serves.
    pub fn workers(&self) -> Vec<WorkerStatus> {
        let devices = self.list();
        let figures = self.pool.stats().workers(&[]);
        self.pool
            .list()
            .into_iter()
            .map(|w| {
                let f = figures.iter().find(|f| f.worker == w.id);
                WorkerStatus {
                    id: w.id,
                    cpu: w.cpu,
                    cpu_displaced: f.is_some_and(|f| f.cpu_displaced),
                    cpu_displacements: f.map_or(0, |f| f.cpu_displacements),
                    cpu_ns: f.and_then(|f| f.cpu_ns),
                    queues: devices
                        .iter()
                        .flat_map(|d| {
                            d.queues
                                .iter()
                                .filter(|q| q.worker == Some(w.id))
                                .map(|q| (d.id, q.vq))
                        })
                        .collect(),
                }
            })
            .collect()
    }

    /// Every queue's figures (devices deleted are gone).
    pub fn stats(&self) -> Vec<QueueSnapshot> {
        self.pool.stats().snapshot()
    }

    /// The configuration every device has now, and where it was defined.
    pub fn configs(&self) -> Vec<(DeviceConfig, Origin)> {
        self.lock()
            .values()
            .map(|e| (e.config.clone(), e.origin))
            .collect()
    }

    /// Makes the daemon what `new` describes, as far as it can change
    /// while running: workers added (or freed if unused) to reach
    /// `new.workers`; devices matched by socket path: created, deleted
    /// (those the configuration defined: a device created through the
    /// management API stays unless the file names its socket), their
    /// LUNs added, removed or resized (a LUN whose spec changed
    /// otherwise is removed and added again) and their queues attached as
    /// the queue map says. A device whose type, queue count or queue size
    /// changed is left as it is (delete it and create it again), and so
    /// is everything outside the devices and the worker count: each is
    /// reported as an error.
    pub fn reload(&self, new: &DaemonConfig) -> ReloadReport {
        let mut report = ReloadReport::default();
        let _change = match self.begin_change() {
            Ok(c) => c,
            Err(e) => {
                report.errors.push(e.to_string());
                return report;
            }
        };
        let started = plain(self.settings.lock()).clone();
        let mut asked = fixed(new);
        // A saved configuration lists the CPUs of the workers as they
        // run (worker_create cpu=N included): the same daemon.
        if let Some(s) = &started {
            let (running, _) = self.running_config();
            if asked.poll.cpus == running.poll.cpus {
                asked.poll.cpus.clone_from(&s.poll.cpus);
            }
        }
        if started.is_some_and(|s| s != asked) {
            let s = "poll, seccomp, admin socket or service options changed: restart the daemon to apply".to_owned();
            warn!("reload: {s}");
            report.errors.push(s);
        }
        let mut note = |r: Result<String, String>| match r {
            Ok(s) => {
                info!("reload: {s}");
                report.changed.push(s);
            }
            Err(s) => {
                warn!("reload: {s}");
                report.errors.push(s);
            }
        };
        // Workers first: the devices' queue maps may name new ones.
        while self.pool.len() < new.workers {
            let created = self.pool.create(None);
            let failed = created.is_err();
            note(
                created
                    .map(|w| format!("worker {w} created"))
                    .map_err(|e| format!("worker_create: {}", crate::runtime::error_chain(&e))),
            );
            if failed {
                break;
            }
        }
        let current = self.configs();
        let ids = self.ids();
        // Deleted devices.
        for (id, (old, origin)) in ids.iter().zip(&current) {
            if *origin == Origin::Config
                && !new.devices.iter().any(|d| d.socket_path == old.socket_path)
            {
                note(
                    self.delete_locked(*id)
                        .map(|()| format!("device {id} deleted"))
                        .map_err(|e| err(*id, &e)),
                );
            }
        }
        for d in &new.devices {
            match ids
                .iter()
                .zip(&current)
                .find(|(_, (o, _))| o.socket_path == d.socket_path)
            {
                None => note(
                    self.create_locked(d.clone(), Origin::Config)
                        .map(|id| format!("device {id} created ({})", d.socket_path.display()))
                        .map_err(|e| {
                            format!(
                                "{}: {}",
                                d.socket_path.display(),
                                crate::runtime::error_chain(&e)
                            )
                        }),
                ),
                Some((&id, (old, _))) => {
                    if let Some(e) = self.lock().get_mut(&id) {
                        e.origin = Origin::Config;
                    }
                    self.reload_device(id, old, d, &mut note);
                }
            }
        }
        // Fewer workers: free the highest-numbered idle ones.
        let mut spare: Vec<usize> = self.pool.list().iter().map(|w| w.id).collect();
        while self.pool.len() > new.workers {
            let Some(w) = spare.pop() else { break };
            match self.worker_free_locked(w) {
                Ok(()) => note(Ok(format!("worker {w} freed"))),
                Err(
                    RegistryError::WorkerInUse { .. } | RegistryError::Pool(PoolError::Busy { .. }),
                ) => {}
                Err(e) => note(Err(format!(
                    "worker_free {w}: {}",
                    crate::runtime::error_chain(&e)
                ))),
            }
        }
        if self.pool.len() > new.workers {
            note(Err(format!(
                "{} workers remain (asked for {}): the others serve queues",
                self.pool.len(),
                new.workers
            )));
        }
        if !report.changed.is_empty() {
            let _ = self.saved(Ok(()));
        }
        self.events.publish(Event::ReloadDone {
            changed: report.changed.clone(),
            errors: report.errors.clone(),
        });
        report
    }

    /// The LUN and queue-map changes of one device.
    fn reload_device(
        &self,
        id: u32,
        old: &DeviceConfig,
        new: &DeviceConfig,
        note: &mut impl FnMut(Result<String, String>),
    ) {
        if (old.device_type, old.num_queues, old.queue_size)
            != (new.device_type, new.num_queues, new.queue_size)
        {
            note(Err(format!(
                "device {id}: type, num-queues or queue-size changed: delete and create the device to apply"
            )));
            return;
        }
        let mut new_luns = new.luns.clone();
        if new.device_type == DeviceType::Scsi {
            // Positions number the LUNs without `lun=`, as at start.
            for (i, s) in new_luns.iter_mut().enumerate() {
                s.lun = s.lun.or(u16::try_from(i).ok());
            }
        } else if let Some(s) = new_luns.first_mut() {
            s.lun = Some(0);
        }
        let old_luns: Vec<LunSpec> = old
            .luns
            .iter()
            .map(|s| {
                let mut s = s.clone();
                if new.device_type == DeviceType::Blk {
                    s.lun = Some(0);
                }
                s
            })
            .collect();
        // The same disk: what differs (size, limits) changes in place.
        let same_disk = |a: &LunSpec, b: &LunSpec| {
            let strip = |s: &LunSpec| LunSpec {
                size: None,
                iops: None,
                bps: None,
                burst_ms: None,
                ..s.clone()
            };
            strip(a) == strip(b)
        };
        for o in &old_luns {
            let lun = o.lun.unwrap_or(0);
            match new_luns.iter().find(|n| n.lun == o.lun) {
                Some(n) if n == o => {}
                Some(n) if same_disk(n, o) => {
                    // A file that does not fix a size (a file, device or
                    // RBD image has its own) leaves the LUN its size, as
                    // a restart would find it.
                    if let Some(bytes) = n.size.filter(|_| n.size != o.size) {
                        note(
                            self.lun_resize_locked(id, lun, bytes)
                                .map(|b| format!("device {id} lun {lun} resized to {b} blocks"))
                                .map_err(|e| err(id, &e)),
                        );
                    }
                    if spec_limits(n) != spec_limits(o) {
                        note(
                            self.set_lun_qos_locked(id, lun, spec_limits(n))
                                .map(|l| format!("device {id} lun {lun} qos {}", qos_text(&l)))
                                .map_err(|e| err(id, &e)),
                        );
                    }
                }
                Some(_) if new.device_type == DeviceType::Blk => note(Err(format!(
                    "device {id}: the disk changed: delete and create the device to apply"
                ))),
                Some(n) => {
                    note(
                        self.lun_remove_locked(id, lun)
                            .map(|()| format!("device {id} lun {lun} removed"))
                            .map_err(|e| err(id, &e)),
                    );
                    note(
                        self.lun_add_locked(id, n)
                            .map(|l| format!("device {id} lun {l} added"))
                            .map_err(|e| err(id, &e)),
                    );
                }
                None => note(
                    self.lun_remove_locked(id, lun)
                        .map(|()| format!("device {id} lun {lun} removed"))
                        .map_err(|e| err(id, &e)),
                ),
            }
        }
        for n in new_luns
            .iter()
            .filter(|n| !old_luns.iter().any(|o| o.lun == n.lun))
        {
            note(
                self.lun_add_locked(id, n)
                    .map(|l| format!("device {id} lun {l} added"))
                    .map_err(|e| err(id, &e)),
            );
        }
        if old.queue_map != new.queue_map {
            for rq in 0..new.num_queues {
                let want = new
                    .queue_map
                    .0
                    .iter()
                    .find(|(q, _)| *q == rq)
                    .map(|(_, w)| *w);
                let had = old
                    .queue_map
                    .0
                    .iter()
                    .find(|(q, _)| *q == rq)
                    .map(|(_, w)| *w);
                if want != had {
                    note(
                        self.attach_locked(id, rq, want)
                            .map(|_| match want {
                                Some(w) => format!("device {id} queue {rq} attached to worker {w}"),
                                None => format!("device {id} queue {rq} back to round robin"),
                            })
                            .map_err(|e| err(id, &e)),
                    );
                }
            }
        }
        if old.qos != new.qos {
            note(
                self.set_qos_locked(id, new.qos)
                    .map(|l| format!("device {id} qos {}", qos_text(&l)))
                    .map_err(|e| err(id, &e)),
            );
        }
    }

    /// Limits device `id`'s IOPS and bandwidth from now on, or only its
    /// SCSI LUN `lun`'s (a blk device's disk, LUN 0, is its device); no
    /// limit: none. Returns the limits in force.
    pub fn set_qos(
        &self,
        id: u32,
        lun: Option<u16>,
        limits: QosLimits,
    ) -> Result<QosLimits, RegistryError> {
        let _change = self.begin_change()?;
        self.shared(id).ok_or(RegistryError::NoDevice(id))?;
        match lun {
            Some(lun) if self.scsi(id).is_some() => {
                self.saved(self.set_lun_qos_locked(id, lun, limits))
            }
            // A blk device's disk is LUN 0, and its limits its device's.
            Some(lun) if lun != 0 => Err(HotplugError::NoSuchLun(lun).into()),
            _ => self.saved(self.set_qos_locked(id, limits)),
        }
    }

    /// Limits SCSI LUN `lun` of device `id` (its own limits, within its
    /// device's).
    fn set_lun_qos_locked(
        &self,
        id: u32,
        lun: u16,
        limits: QosLimits,
    ) -> Result<QosLimits, RegistryError> {
        let scsi = self.scsi(id).ok_or(HotplugError::NotScsi(id))?;
        let target = scsi.target.current();
        let entry = (target.luns().iter())
            .find(|e| e.lun == lun)
            .ok_or(HotplugError::NoSuchLun(lun))?;
        entry.qos.set(limits);
        let limits = entry.qos.limits();
        self.update_config(id, |c| {
            for s in c.luns.iter_mut().filter(|s| s.lun == Some(lun)) {
                (s.iops, s.bps, s.burst_ms) = (limits.iops, limits.bps, limits.burst_ms);
            }
        });
        info!(device = id, lun, "qos: {}", qos_text(&limits));
        Ok(limits)
    }

    fn set_qos_locked(&self, id: u32, limits: QosLimits) -> Result<QosLimits, RegistryError> {
        let shared = self.shared(id).ok_or(RegistryError::NoDevice(id))?;
        shared.info.qos.set(limits);
        let limits = shared.info.qos.limits();
        self.update_config(id, |c| c.qos = limits);
        info!(device = id, "qos: {}", qos_text(&limits));
        Ok(limits)
    }

    /// Quiesces device `id`: its queues take no new request (they wait on
    /// the rings) and this waits, up to `timeout`, for the ones in flight
    /// to complete. Returns the requests still in flight (0: drained);
    /// the device stays quiesced either way, until [`Self::resume`].
    pub fn quiesce(&self, id: u32, timeout: std::time::Duration) -> Result<u32, RegistryError> {
        let control = self.control(id)?;
        control.info.qos.set_quiesced(true);
        info!(device = id, "quiesced: no new request is taken");
        // The workers' drain, not a look at the figures: a worker answers
        // between two passes, so a request taken after its answer saw the
        // flag (the command channel orders the store before it), and one
        // taken before is among those it waited for.
        if control.drain_by(std::time::Instant::now() + timeout) {
            return Ok(0);
        }
        // Not in time: the figures say how many are left (shown once per
        // published batch).
        let left = (control.info.metrics.queues())
            .map(|q| q.in_flight)
            .sum::<u32>();
        Ok(left.max(1))
    }

    /// Lets device `id`'s queues take requests again after
    /// [`Self::quiesce`]; returns whether it was quiesced.
    pub fn resume(&self, id: u32) -> Result<bool, RegistryError> {
        let shared = self.shared(id).ok_or(RegistryError::NoDevice(id))?;
        let was = shared.info.qos.quiesced();
        shared.info.qos.set_quiesced(false);
        if was {
            info!(device = id, "resumed");
        }
        Ok(was)
    }

    /// Stops every device (each after its requests in flight), once the
    /// change running, if any, is done; no change is made afterwards (a
    /// device or LUN whose backstores are opening meanwhile is not
    /// created).
    pub fn shutdown(&self) {
        let _change = self.change();
        // Relaxed: read under the lock of changes (`begin_change`).
        self.closed.store(true, Ordering::Relaxed);
        let devices = std::mem::take(&mut *self.lock());
        for (_, e) in devices {
            e.handle.shutdown();
        }
    }
}

/// A device number or a LUN reserved while its backstores open: free
/// again when dropped (created, or failed).
struct Reserved<'a, K: Ord, V> {
    table: &'a Mutex<BTreeMap<K, V>>,
    key: K,
}

/// A device number (and its socket path) reserved by `create`.
type DeviceReserved<'a> = Reserved<'a, u32, PathBuf>;
/// `(device, lun)` reserved by `lun_add`.
type LunReserved<'a> = Reserved<'a, (u32, u16), ()>;

impl<K: Ord, V> Drop for Reserved<'_, K, V> {
    fn drop(&mut self) {
        plain(self.table.lock()).remove(&self.key);
    }
}

/// `config` without its devices and worker count: what a reload cannot
/// change.
fn fixed(config: &DaemonConfig) -> DaemonConfig {
    DaemonConfig {
        workers: 0,
        devices: Vec::new(),
        ..config.clone()
    }
}

fn err(id: u32, e: &RegistryError) -> String {
    format!("device {id}: {}", crate::runtime::error_chain(e))
}

fn status(id: u32, e: &Entry) -> DeviceStatus {
    let shared = e.handle.shared();
    let local = u16::try_from(shared.device.local_queues()).unwrap_or(u16::MAX);
    let spec = |lun: u16| {
        e.config
            .luns
            .iter()
            .find(|s| s.lun == Some(lun) || e.config.device_type == DeviceType::Blk)
    };
    let luns = match &e.kind {
        DeviceKind::Scsi(scsi) => scsi
            .target
            .current()
            .luns()
            .iter()
            .map(|l| {
                let s = spec(l.lun);
                LunStatus {
                    lun: l.lun,
                    kind: s.map_or("?", |s| kind_name(s.kind)),
                    path: s.and_then(|s| s.path.clone()),
                    blocks: l.unit.blocks(),
                    block_size: l.unit.block_size(),
                    read_only: l.backstore.geometry().read_only || s.is_some_and(|s| s.read_only),
                    qos: l.qos.limits(),
                }
            })
            .collect(),
        DeviceKind::Blk(blk) => {
            let g = blk.geometry();
            let s = spec(0);
            vec![LunStatus {
                lun: 0,
                kind: s.map_or("?", |s| kind_name(s.kind)),
                path: s.and_then(|s| s.path.clone()),
                blocks: g.blocks,
                block_size: g.block_size,
                read_only: g.read_only || s.is_some_and(|s| s.read_only),
                // A blk device's limits are its device's.
                qos: QosLimits::default(),
            }]
        }
    };
    DeviceStatus {
        id,
        device_type: match e.config.device_type {
            DeviceType::Scsi => "scsi",
            DeviceType::Blk => "blk",
        },
        socket_path: e.config.socket_path.clone(),
        connected: shared.connected.load(std::sync::atomic::Ordering::Relaxed),
        num_queues: e.config.num_queues,
        queue_size: e.config.queue_size,
        qos: e.config.qos,
        quiesced: e.handle.shared().info.qos.quiesced(),
        luns,
        queues: (0..e.config.num_queues)
            .map(|rq| QueueStatus {
                rq,
                vq: local.saturating_add(rq),
                assigned_worker: shared.placement.assigned(rq),
                worker: shared.placement.running(rq),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{PollOptions, QueueMap};

    fn registry(name: &str) -> (Registry, Arc<WorkerPool>, PathBuf, DeviceConfig) {
        let options = PollOptions {
            stats_interval: None,
            ..PollOptions::default()
        };
        let pool = Arc::new(WorkerPool::new(1, options).unwrap());
        let registry = Registry::new(Arc::clone(&pool));
        let dir = std::env::temp_dir().join(format!("sqcq-registry-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = DeviceConfig {
            device_type: DeviceType::Blk,
            socket_path: dir.join("blk.sock"),
            luns: vec![LunSpec {
                size: Some(1 << 20),
                ..LunSpec::new(BackstoreKind::Ram)
            }],
            num_queues: 1,
            queue_size: 64,
            queue_map: QueueMap::default(),
            qos: Default::default(),
        };
        (registry, pool, dir, config)
    }

    #[test]
    fn a_reload_while_a_device_opens_leaves_it_to_its_create() {
        let (registry, pool, dir, config) = registry("reload");
        let (reserved, api) = {
            let _change = registry.begin_change().unwrap();
            registry.reserve(config.clone()).unwrap()
        };
        let built = build(reserved.key, &api).unwrap();
        // The file names the same socket: the reload neither creates it
        // twice nor waits for the open.
        let file = DaemonConfig {
            workers: 1,
            devices: vec![config],
            poll: PollOptions::default(),
            admin_socket: None,
            seccomp: crate::sandbox::SeccompMode::Off,
            service: crate::config::ServiceConfig::default(),
        };
        let report = registry.reload(&file);
        assert!(
            report
                .errors
                .iter()
                .any(|e| e.contains("in use by device 0")),
            "{report:?}"
        );
        assert!(registry.ids().is_empty());
        // The create ends as usual, and the next reload adopts the device.
        let id = {
            let _change = registry.begin_change().unwrap();
            registry
                .finish_create(&reserved, built, api, Origin::Api)
                .unwrap()
        };
        drop(reserved);
        assert_eq!((id, registry.ids()), (0, vec![0]));
        let report = registry.reload(&file);
        assert!(report.errors.is_empty(), "{report:?}");
        assert_eq!(registry.configs()[0].1, Origin::Config);
        registry.shutdown();
        pool.shutdown();
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_device_whose_backstores_open_across_a_shutdown_is_not_left_behind() {
        let (registry, pool, dir, config) = registry("shutdown");
        let socket = config.socket_path.clone();
        // What `create` does, with the shutdown while the backstore opens.
        let (reserved, config) = {
            let _change = registry.begin_change().unwrap();
            registry.reserve(config).unwrap()
        };
        assert!(
            matches!(
                registry.reserve(config.clone()),
                Err(RegistryError::SocketInUse(_, 0))
            ),
            "the socket path is reserved"
        );
        let built = build(reserved.key, &config).unwrap();
        registry.shutdown();
        assert!(
            matches!(registry.begin_change(), Err(RegistryError::ShuttingDown)),
            "the device is not started"
        );
        drop((built, reserved));
        assert!(registry.ids().is_empty(), "no device left behind");
        assert!(!socket.exists(), "nor its socket");
        assert!(plain(registry.creating.lock()).is_empty());
        assert!(matches!(
            registry.create(config, Origin::Api),
            Err(RegistryError::ShuttingDown)
        ));
        assert!(matches!(
            registry.worker_create(None),
            Err(RegistryError::ShuttingDown)
        ));
        pool.shutdown();
        let _ = std::fs::remove_dir_all(dir);
    }
}
