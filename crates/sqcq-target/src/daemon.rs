//! The daemon: a worker pool and the devices it serves.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tracing::info;

use crate::admin::AdminServer;
use crate::config::DaemonConfig;
use crate::runtime::worker::WorkerPool;
use crate::scsi::hotplug::DeviceControl;
use crate::scsi::target::{Target, TargetError, wwn_seed};
use crate::transport::device::DeviceHandle;

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
        for (i, (d, target)) in config.devices.iter().zip(targets).enumerate() {
            let id = u32::try_from(i).unwrap_or(u32::MAX);
            match DeviceHandle::spawn(id, d, target, Arc::clone(&pool)) {
                Ok(h) => devices.push(h),
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
        self.devices
            .iter()
            .map(|d| {
                Ok(DeviceControl {
                    shared: Arc::clone(d.shared()),
                    events: d.event_sender()?,
                    pool: Arc::clone(&self.pool),
                })
            })
            .collect()
    }

    /// Every queue's latest statistics (what `--stats-file` holds).
    pub fn stats(&self) -> Vec<crate::runtime::metrics::QueueSnapshot> {
        self.pool.stats().snapshot()
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
