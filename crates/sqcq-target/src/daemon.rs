//! The daemon: a worker pool and the devices it serves.

use std::io;
use std::sync::Arc;

use thiserror::Error;
use tracing::info;

use crate::config::DaemonConfig;
use crate::device::DeviceHandle;
use crate::target::{Target, TargetError};
use crate::worker::WorkerPool;

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
}

impl Daemon {
    /// Builds every LUN, starts the workers and one control thread per
    /// device.
    pub fn start(config: &DaemonConfig) -> Result<Self, DaemonError> {
        let mut targets = Vec::with_capacity(config.devices.len());
        for d in &config.devices {
            let seed = d
                .socket_path
                .to_string_lossy()
                .bytes()
                .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
            let target = Target::build(&d.luns, seed).map_err(|source| DaemonError::Target {
                device: d.socket_path.display().to_string(),
                source,
            })?;
            targets.push(target);
        }
        let pool = Arc::new(
            WorkerPool::new(config.workers).map_err(|source| DaemonError::Io {
                what: "the worker pool".into(),
                source,
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
        Ok(Daemon { pool, devices })
    }

    /// The devices, in configuration order.
    pub fn devices(&self) -> &[DeviceHandle] {
        &self.devices
    }

    /// Stops accepting connections, finishes in-flight I/O, stops the
    /// workers.
    pub fn shutdown(self) {
        for d in self.devices {
            d.shutdown();
        }
        self.pool.shutdown();
        info!("daemon stopped");
    }
}
