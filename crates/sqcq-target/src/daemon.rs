//! The daemon: a worker pool and the devices it serves.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tracing::info;

use crate::admin::AdminServer;
use crate::config::DaemonConfig;
use crate::runtime::worker::WorkerPool;
use sqcq_backstore::Backstore;

use crate::blk::device::BlkDevice;
use crate::config::DeviceType;
use crate::manage::{DeviceControl, DeviceKind};
use crate::scsi::device::ScsiDevice;
use crate::scsi::target::{Target, TargetError, wwn_seed};
use crate::spec::OpenError;
use crate::transport::device::{DeviceHandle, DeviceParams};
use crate::transport::device_type::VirtioDevice;

/// How long [`Daemon::shutdown`] gives requests in flight to complete.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Why the daemon could not start.
#[derive(Debug, Error)]
pub enum DaemonError {
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
    /// Threads, sockets or eventfds could not be created.
    #[error("cannot start {what}")]
    Io {
        /// What.
        what: String,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// A device type, and the SCSI or blk device itself (for the admin socket
/// and the embedding program).
type Built = (Arc<dyn VirtioDevice>, DeviceKind);

/// A configured device, built before any thread starts.
enum Kind {
    Scsi(Target),
    Blk(Arc<dyn Backstore>, Option<String>, bool),
}

impl Kind {
    /// The device type (and the SCSI device, for the admin socket).
    fn device(self, id: u32, socket_path: &std::path::Path) -> io::Result<Built> {
        match self {
            Kind::Scsi(target) => {
                for e in target.luns() {
                    info!(device = id, lun = e.lun, geometry = ?e.backstore.geometry(), "LUN ready");
                }
                let scsi = Arc::new(ScsiDevice::new(target)?);
                Ok((
                    Arc::clone(&scsi) as Arc<dyn VirtioDevice>,
                    DeviceKind::Scsi(scsi),
                ))
            }
            Kind::Blk(backstore, serial, read_only) => {
                // `read_only`: the device's (the backstore's geometry says
                // only whether the storage itself is).
                info!(device = id, geometry = ?backstore.geometry(),
                    read_only = read_only || backstore.geometry().read_only, "disk ready");
                // The default serial: the socket's name, as QEMU's
                // vhost-user-blk users expect something stable.
                let serial = serial.unwrap_or_else(|| {
                    socket_path
                        .file_name()
                        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
                });
                let blk = Arc::new(BlkDevice::new(backstore, serial, read_only)?);
                Ok((
                    Arc::clone(&blk) as Arc<dyn VirtioDevice>,
                    DeviceKind::Blk(blk),
                ))
            }
        }
    }
}

/// A running daemon.
#[derive(Debug)]
pub struct Daemon {
    pool: Arc<WorkerPool>,
    devices: Vec<DeviceHandle>,
    /// The device behind each of `devices`.
    kinds: Vec<DeviceKind>,
    admin: Option<AdminServer>,
}

impl Daemon {
    /// Builds every LUN, starts the workers and one control thread per
    /// device.
    pub fn start(config: &DaemonConfig) -> Result<Self, DaemonError> {
        let mut kinds = Vec::with_capacity(config.devices.len());
        for d in &config.devices {
            let device = d.socket_path.display().to_string();
            kinds.push(match d.device_type {
                DeviceType::Scsi => {
                    let seed = wwn_seed(&d.socket_path.to_string_lossy());
                    let target = Target::build(&d.luns, seed)
                        .map_err(|source| DaemonError::Target { device, source })?;
                    Kind::Scsi(target)
                }
                DeviceType::Blk => {
                    // Validated: exactly one spec.
                    let spec = &d.luns[0];
                    let backstore = spec
                        .open_backstore()
                        .map_err(|source| DaemonError::Disk { device, source })?;
                    Kind::Blk(backstore, spec.serial.clone(), spec.read_only)
                }
            });
        }
        let pool = Arc::new(
            WorkerPool::new(config.workers, config.poll.clone()).map_err(|source| {
                DaemonError::Io {
                    what: "the worker pool".into(),
                    source,
                }
            })?,
        );
        info!(workers = config.workers, "worker pool started");
        let mut devices = Vec::with_capacity(config.devices.len());
        let mut built = Vec::with_capacity(config.devices.len());
        for (i, (d, kind)) in config.devices.iter().zip(kinds).enumerate() {
            let id = u32::try_from(i).unwrap_or(u32::MAX);
            let params = DeviceParams {
                num_queues: d.num_queues,
                queue_size: d.queue_size,
                queue_map: d.queue_map.clone(),
            };
            let spawned = kind.device(id, &d.socket_path).and_then(|(device, t)| {
                let h = DeviceHandle::spawn(id, &d.socket_path, params, device, Arc::clone(&pool))?;
                Ok((h, t))
            });
            match spawned {
                Ok((h, t)) => {
                    devices.push(h);
                    built.push(t);
                }
                Err(source) => {
                    drop(devices);
                    pool.shutdown();
                    return Err(DaemonError::Io {
                        what: format!("device {}", d.socket_path.display()),
                        source,
                    });
                }
            }
        }
        let mut daemon = Daemon {
            pool,
            devices,
            kinds: built,
            admin: None,
        };
        if let Some(path) = &config.admin_socket {
            match daemon
                .device_controls()
                .and_then(|controls| AdminServer::spawn(path, controls))
            {
                Ok(admin) => daemon.admin = Some(admin),
                Err(source) => {
                    daemon.shutdown();
                    return Err(DaemonError::Io {
                        what: format!("admin socket {}", path.display()),
                        source,
                    });
                }
            }
        }
        Ok(daemon)
    }

    /// What the admin socket needs to change each device's LUNs.
    fn device_controls(&self) -> std::io::Result<Vec<DeviceControl>> {
        Ok(self
            .devices
            .iter()
            .zip(&self.kinds)
            .map(|(d, kind)| DeviceControl {
                info: Arc::clone(&d.shared().info),
                kind: kind.clone(),
                pool: Arc::clone(&self.pool),
            })
            .collect())
    }

    /// Every queue's latest statistics (what `--stats-file` holds).
    pub fn stats(&self) -> Vec<crate::runtime::metrics::QueueSnapshot> {
        self.pool.stats().snapshot()
    }

    /// The SCSI device of device `i` (configuration order): its LUNs,
    /// its event reports.
    pub fn scsi_device(&self, i: usize) -> Option<&Arc<ScsiDevice>> {
        match self.kinds.get(i)? {
            DeviceKind::Scsi(s) => Some(s),
            DeviceKind::Blk(_) => None,
        }
    }

    /// The devices, in configuration order.
    pub fn devices(&self) -> &[DeviceHandle] {
        &self.devices
    }

    /// Stops accepting connections, finishes in-flight I/O, stops the
    /// workers. Requests the backstore has not completed within
    /// [`SHUTDOWN_GRACE`] are abandoned; whatever frontends do, nothing
    /// here waits on them (see `docs/target.md`, "Hostile frontends").
    pub fn shutdown(self) {
        self.pool.begin_shutdown(SHUTDOWN_GRACE);
        if let Some(admin) = self.admin {
            admin.shutdown();
        }
        for d in self.devices {
            d.shutdown();
        }
        self.pool.shutdown();
        info!("daemon stopped");
    }
}
