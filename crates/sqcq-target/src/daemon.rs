//! The daemon: a worker pool and the devices it serves.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tracing::info;

use crate::admin::AdminServer;
use crate::config::DaemonConfig;
use crate::runtime::worker::WorkerPool;
use crate::scsi::device::ScsiDevice;
use crate::scsi::hotplug::DeviceControl;
use crate::scsi::target::{Target, TargetError, wwn_seed};
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

/// A running daemon.
#[derive(Debug)]
pub struct Daemon {
    pool: Arc<WorkerPool>,
    devices: Vec<DeviceHandle>,
    /// The SCSI device behind each of `devices`.
    scsi: Vec<Arc<ScsiDevice>>,
    admin: Option<AdminServer>,
}

impl Daemon {
    /// Builds every LUN, starts the workers and one control thread per
    /// device.
    pub fn start(config: &DaemonConfig) -> Result<Self, DaemonError> {
        let mut targets = Vec::with_capacity(config.devices.len());
        for d in &config.devices {
            let seed = wwn_seed(&d.socket_path.to_string_lossy());
            let target = Target::build(&d.luns, seed).map_err(|source| DaemonError::Target {
                device: d.socket_path.display().to_string(),
                source,
            })?;
            targets.push(target);
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
        let mut scsi = Vec::with_capacity(config.devices.len());
        for (i, (d, target)) in config.devices.iter().zip(targets).enumerate() {
            let id = u32::try_from(i).unwrap_or(u32::MAX);
            for e in target.luns() {
                info!(device = id, lun = e.lun, geometry = ?e.backstore.geometry(), "LUN ready");
            }
            let params = DeviceParams {
                num_queues: d.num_queues,
                queue_size: d.queue_size,
                queue_map: d.queue_map.clone(),
            };
            let spawned = ScsiDevice::new(target).map(Arc::new).and_then(|device| {
                let h = DeviceHandle::spawn(
                    id,
                    &d.socket_path,
                    params,
                    Arc::clone(&device) as Arc<dyn VirtioDevice>,
                    Arc::clone(&pool),
                )?;
                Ok((h, device))
            });
            match spawned {
                Ok((h, device)) => {
                    devices.push(h);
                    scsi.push(device);
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
            scsi,
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
            .zip(&self.scsi)
            .map(|(d, scsi)| DeviceControl {
                info: Arc::clone(&d.shared().info),
                scsi: Arc::clone(scsi),
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
        self.scsi.get(i)
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
