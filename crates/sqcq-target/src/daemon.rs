//! The daemon: a worker pool and the devices it serves.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tracing::info;

use crate::admin::AdminServer;
use crate::config::DaemonConfig;
use crate::runtime::worker::WorkerPool;

use crate::prometheus::{MetricsListen, MetricsServer, ProcessFigures, Scrape, render_build_info};
use crate::registry::{Origin, Registry, RegistryError, ReloadReport, StartError};
use crate::rpc::{ConfigSource, Context};
use crate::sandbox::{SandboxError, SeccompMode};
use crate::scsi::device::ScsiDevice;
use crate::service::activation::{ActivationError, PassedSockets};
use crate::transport::device::DeviceShared;
use crate::transport::listen::{ListenError, SocketSource, StaleProbe};

/// How long [`Daemon::shutdown`] gives requests in flight to complete.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Why the daemon could not start.
#[derive(Debug, Error)]
pub enum DaemonError {
    /// A device of the configuration could not be built or started.
    #[error(transparent)]
    Start(#[from] StartError),
    /// A device could not be created.
    #[error("device {device}")]
    Device {
        /// The socket path of the device.
        device: String,
        /// What failed.
        #[source]
        source: Box<RegistryError>,
    },
    /// The sockets passed in by the service manager do not fit the
    /// configuration.
    #[error("socket activation")]
    Activation(#[from] ActivationError),
    /// A socket could not be bound (or a passed one used).
    #[error("cannot listen")]
    Listen(#[from] ListenError),
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
    registry: Arc<Registry>,
    /// What the management API acts on.
    ctx: Arc<Context>,
    admin: Option<AdminServer>,
    metrics: Option<MetricsServer>,
    /// Whether the daemon's sockets may probe a socket file they find:
    /// shared by every one of them, forbidden by [`Daemon::apply_sandbox`].
    stale: StaleProbe,
}

impl Daemon {
    /// Starts the workers, then every device (each opens its LUNs and
    /// starts its control thread), then the admin socket.
    pub fn start(config: &DaemonConfig) -> Result<Self, DaemonError> {
        Self::start_with(config, PassedSockets::none())
    }

    /// Like [`start`](Self::start), serving the sockets the service
    /// manager passed in where [`crate::service::activation`] says (for
    /// as long as the daemon runs: a device deleted and created again
    /// serves its passed socket again) and binding the others with the
    /// configured ownership.
    pub fn start_with(config: &DaemonConfig, passed: PassedSockets) -> Result<Self, DaemonError> {
        let mut paths: Vec<&Path> = config
            .devices
            .iter()
            .map(|d| d.socket_path.as_path())
            .collect();
        paths.extend(config.admin_socket.as_deref());
        let mut passed: BTreeMap<_, _> = paths
            .iter()
            .map(|p| p.to_path_buf())
            .zip(passed.assign(&paths)?)
            .filter_map(|(p, fd)| Some((p, fd?)))
            .collect();
        let admin_passed = config.admin_socket.as_ref().and_then(|p| passed.remove(p));
        let pool = Arc::new(
            WorkerPool::new(config.workers, config.poll.clone()).map_err(|source| {
                DaemonError::Io {
                    what: "the worker pool".into(),
                    source,
                }
            })?,
        );
        info!(workers = config.workers, "worker pool started");
        let stale = StaleProbe::default();
        let sockets = SocketSource::new(config.service.socket_ownership, passed, stale.clone());
        let registry = Arc::new(Registry::new(Arc::clone(&pool)).with_sockets(sockets));
        registry.set_settings(config);
        registry
            .follow_storage_sizes()
            .map_err(|source| DaemonError::Io {
                what: "the storage size thread".into(),
                source,
            })?;
        let ctx = Arc::new(Context::new(Arc::clone(&registry)));
        let mut daemon = Daemon {
            pool,
            registry,
            ctx,
            admin: None,
            metrics: None,
            stale,
        };
        for d in &config.devices {
            if let Err(e) = daemon.registry.create(d.clone(), Origin::Config) {
                daemon.shutdown();
                return Err(match e {
                    RegistryError::Start(e) => DaemonError::Start(e),
                    e => DaemonError::Device {
                        device: d.socket_path.display().to_string(),
                        source: Box::new(e),
                    },
                });
            }
        }
        if let Some(path) = &config.admin_socket {
            let admin = SocketSource::new(
                config.service.admin_socket_ownership,
                admin_passed
                    .map(|fd| (path.clone(), fd))
                    .into_iter()
                    .collect(),
                daemon.stale.clone(),
            );
            let socket = match admin.listen(path) {
                Ok(s) => s,
                Err(e) => {
                    daemon.shutdown();
                    return Err(e.into());
                }
            };
            match AdminServer::spawn(socket, Arc::clone(&daemon.ctx)) {
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
        if let Some(listen) = &config.service.metrics {
            match daemon.spawn_metrics(listen) {
                Ok(m) => daemon.metrics = Some(m),
                Err(source) => {
                    daemon.shutdown();
                    return Err(DaemonError::Io {
                        what: format!("metrics endpoint {listen}"),
                        source,
                    });
                }
            }
        }
        Ok(daemon)
    }

    /// Devices, in number order.
    pub fn device_count(&self) -> usize {
        self.registry.ids().len()
    }

    /// Worker threads.
    pub fn workers(&self) -> usize {
        self.pool.len()
    }

    /// The Prometheus endpoint, rendering the devices and workers there
    /// are at each scrape.
    fn spawn_metrics(&self, listen: &MetricsListen) -> io::Result<MetricsServer> {
        let registry = Arc::clone(&self.registry);
        let render = move |out: &mut String| {
            let devices: Vec<_> = (registry.ids().into_iter())
                .filter_map(|id| registry.control(id).ok())
                .collect();
            Scrape::collect(&devices, registry.pool()).render(out);
            if let Some(p) = ProcessFigures::collect() {
                p.render(out);
            }
            render_build_info(out);
        };
        MetricsServer::spawn(listen, Arc::new(render), &self.stale)
    }

    /// Where the Prometheus endpoint listens, if there is one (with the
    /// port chosen when port 0 was asked).
    pub fn metrics_endpoint(&self) -> Option<&MetricsListen> {
        self.metrics.as_ref().map(MetricsServer::endpoint)
    }

    /// Applies the seccomp filter of `mode` to every thread (nothing for
    /// [`SeccompMode::Off`]); from then on the daemon's sockets refuse a
    /// socket file they find at their path instead of probing it with
    /// `connect`, which the filter forbids.
    pub fn apply_sandbox(&self, mode: SeccompMode) -> Result<(), SandboxError> {
        crate::sandbox::apply(mode, &self.stale)
    }

    /// The devices and workers, for changes at run time.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Every queue's latest statistics (what `--stats-file` holds).
    pub fn stats(&self) -> Vec<crate::runtime::metrics::QueueSnapshot> {
        self.pool.stats().snapshot()
    }

    /// The SCSI device of device `id`: its LUNs, its event reports.
    pub fn scsi_device(&self, id: u32) -> Option<Arc<ScsiDevice>> {
        self.registry.scsi(id)
    }

    /// What device `id` shares with its workers (number, name, figures).
    pub fn device(&self, id: u32) -> Option<Arc<DeviceShared>> {
        self.registry.shared(id)
    }

    /// Makes the running daemon what `config` describes, as far as that
    /// can change at run time (see [`Registry::reload`]).
    pub fn reload(&self, config: &DaemonConfig) -> ReloadReport {
        self.registry.reload(config)
    }

    /// Where a reload (SIGHUP, the `config_reload` method) reads the
    /// configuration from.
    pub fn set_config_source(&self, source: ConfigSource) {
        *self
            .ctx
            .source
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(source);
    }

    /// What the `config_reload` method tells of each reload it runs
    /// (SIGHUP's are the caller's to tell).
    pub fn set_reload_hook(&self, hook: crate::rpc::ReloadHook) {
        *self
            .ctx
            .reload_hook
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(hook);
    }

    /// Reads the configuration again from where
    /// [`Self::set_config_source`] says, and applies it.
    pub fn reload_source(&self) -> Result<ReloadReport, crate::rpc::RpcError> {
        self.ctx.reload()
    }

    /// Stops accepting connections, finishes in-flight I/O, stops the
    /// workers. Requests the backstore has not completed within
    /// [`SHUTDOWN_GRACE`] are cancelled and their completions waited for
    /// (a backstore that neither completes nor cancels them ends the
    /// process, see `Session::stop_queue`); whatever frontends do, nothing
    /// here waits on them (see `docs/target.md`, "Hostile frontends").
    pub fn shutdown(self) {
        self.pool.begin_shutdown(SHUTDOWN_GRACE);
        if let Some(admin) = self.admin {
            admin.shutdown();
        }
        if let Some(metrics) = self.metrics {
            metrics.shutdown();
        }
        self.registry.shutdown();
        self.pool.shutdown();
        info!("daemon stopped");
    }
}
