//! Configuration: the command line (in the style of vhost-device-*) and
//! the same fields in a TOML file with several `[[device]]` sections.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use clap::Parser;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::prometheus::MetricsListen;
use crate::runtime::qos::QosLimits;
use crate::sandbox::SeccompMode;
pub use crate::spec::{BackstoreKind, LunSpec, LunSpecError, parse_size};

mod poll;
mod save;
mod service;

pub use crate::runtime::options::{
    DEFAULT_STATS_INTERVAL, MAX_CPU, PollOptions, QueueMap, RingMode, spin_config,
};
pub use poll::{FilePoll, PollArgs, parse_spin_us};
pub use save::{SaveError, save_file, to_toml};
pub use service::{DEFAULT_ADMIN_SOCKET_MODE, FileService, ServiceArgs, parse_mode};

use crate::service::account::AccountError;
use crate::transport::listen::SocketOwnership;

/// Default request queues per device.
pub const DEFAULT_NUM_QUEUES: u16 = 1;
/// Default (and largest accepted) virtqueue size.
pub const DEFAULT_QUEUE_SIZE: u16 = 1024;

/// A configuration that cannot be used.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// A `--lun` value could not be parsed.
    #[error(transparent)]
    Lun(#[from] LunSpecError),
    /// A `--queue-map` value could not be parsed.
    #[error("invalid queue map {0:?}: expected QUEUE:WORKER[,QUEUE:WORKER...]")]
    QueueMap(String),
    /// The config file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The config file is not valid TOML for this schema.
    #[error("invalid config file {path}")]
    Toml {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: toml::de::Error,
    },
    /// The configuration is inconsistent.
    #[error("{0}")]
    Invalid(String),
    /// A socket's owner or group names no user or group.
    #[error("socket ownership")]
    Account(#[from] AccountError),
}

impl FromStr for QueueMap {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ConfigError::QueueMap(s.to_owned());
        s.split(',')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (q, w) = p.split_once(':').ok_or_else(err)?;
                Ok((
                    q.trim().parse().map_err(|_| err())?,
                    w.trim().parse().map_err(|_| err())?,
                ))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(QueueMap)
    }
}

/// One vhost-user SCSI device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceConfig {
    /// What the device is.
    pub device_type: DeviceType,
    /// The vhost-user socket the device listens on.
    pub socket_path: PathBuf,
    /// Its logical units (SCSI), or its one disk (blk).
    pub luns: Vec<LunSpec>,
    /// Request queues announced in the config space.
    pub num_queues: u16,
    /// Largest virtqueue size accepted.
    pub queue_size: u16,
    /// Request queue to worker map.
    pub queue_map: QueueMap,
    /// IOPS and bandwidth limits (`[device.qos]`, `device_set_qos`).
    pub qos: QosLimits,
}

impl DeviceConfig {
    /// Checks what the parsers cannot; `worker_exists` says whether a
    /// worker of the queue map runs (or will).
    pub fn validate(&self, worker_exists: impl Fn(usize) -> bool) -> Result<(), ConfigError> {
        let bad = |s: String| Err(ConfigError::Invalid(s));
        let name = self.socket_path.display();
        let max_queues = match self.device_type {
            DeviceType::Scsi => crate::scsi::device::MAX_REQUEST_QUEUES,
            DeviceType::Blk => crate::blk::device::MAX_REQUEST_QUEUES,
        };
        if self.num_queues == 0 || self.num_queues > max_queues {
            return bad(format!("{name}: num-queues must be 1..={max_queues}"));
        }
        if self.device_type == DeviceType::Blk
            && self
                .luns
                .iter()
                .any(|l| l.iops.is_some() || l.bps.is_some() || l.burst_ms.is_some())
        {
            return bad(format!(
                "{name}: a blk device's limits are the device's: qos = {{ iops = .., bps = .. }} \
                 in its [[device]] (or device_set_qos), not iops=/bps= on its --lun"
            ));
        }
        if self.device_type == DeviceType::Blk && self.luns.len() != 1 {
            return bad(format!(
                "{name}: a blk device needs exactly one --lun (its disk), not {}",
                self.luns.len()
            ));
        }
        if !self.queue_size.is_power_of_two() || self.queue_size < 4 {
            return bad(format!("{name}: queue-size must be a power of two >= 4"));
        }
        if let Some((q, w)) = self.queue_map.0.iter().find(|(_, w)| !worker_exists(*w)) {
            return bad(format!(
                "{name}: queue {q} mapped to worker {w}, which does not exist"
            ));
        }
        let map = &self.queue_map.0;
        if let Some((_, (q, _))) = map
            .iter()
            .enumerate()
            .find(|(i, (q, _))| map[..*i].iter().any(|(o, _)| o == q))
        {
            return bad(format!("{name}: queue map names request queue {q} twice"));
        }
        if let Some((q, _)) = self.queue_map.0.iter().find(|(q, _)| *q >= self.num_queues) {
            return bad(format!(
                "{name}: queue map names request queue {q}, the device has {}",
                self.num_queues
            ));
        }
        Ok(())
    }
}

/// The device types `sqcqd` serves.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum DeviceType {
    /// vhost-user-scsi: a SCSI target with any number of LUNs.
    #[default]
    Scsi,
    /// vhost-user-blk: one disk, the device's one `--lun` (its `lun=` and
    /// `wwn=` are ignored; `serial=` is the GET_ID answer).
    Blk,
}

/// The whole daemon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonConfig {
    /// Worker threads shared by all devices.
    pub workers: usize,
    /// The devices.
    pub devices: Vec<DeviceConfig>,
    /// Poll mode, CPU placement and statistics.
    pub poll: PollOptions,
    /// The admin socket (the management API; see [`crate::admin`]).
    pub admin_socket: Option<PathBuf>,
    /// The seccomp filter applied once the daemon runs
    /// ([`crate::sandbox`]).
    pub seccomp: SeccompMode,
    /// How the daemon runs as a service: pidfile, socket ownership,
    /// metrics.
    pub service: ServiceConfig,
}

impl Default for DaemonConfig {
    /// One worker, no device, every option at its default.
    fn default() -> Self {
        DaemonConfig {
            workers: 1,
            devices: Vec::new(),
            poll: PollOptions::default(),
            admin_socket: None,
            seccomp: SeccompMode::default(),
            service: ServiceConfig::default(),
        }
    }
}

/// How the daemon runs as a service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceConfig {
    /// The pidfile, locked while the daemon runs.
    pub pidfile: Option<PathBuf>,
    /// Owner, group and mode of the vhost-user sockets the daemon binds.
    pub socket_ownership: SocketOwnership,
    /// Owner, group and mode of the admin socket (by default mode
    /// [`DEFAULT_ADMIN_SOCKET_MODE`]).
    pub admin_socket_ownership: SocketOwnership,
    /// Where the Prometheus endpoint listens (`None`: no endpoint; see
    /// [`crate::prometheus`]).
    pub metrics: Option<MetricsListen>,
    /// Saved state: after every change (management API, reload) the
    /// running configuration is written to this file ([`save_file`]).
    pub save_config: Option<PathBuf>,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            pidfile: None,
            socket_ownership: SocketOwnership::default(),
            admin_socket_ownership: SocketOwnership {
                mode: Some(DEFAULT_ADMIN_SOCKET_MODE),
                ..SocketOwnership::default()
            },
            metrics: None,
            save_config: None,
        }
    }
}

/// Command line of `sqcqd`.
#[derive(Debug, Parser)]
#[command(
    name = "sqcqd",
    version,
    about = "vhost-user-scsi and vhost-user-blk device daemon",
    override_usage = "sqcqd [OPTIONS]\n       \
                      sqcqd rpc [--admin-socket PATH] METHOD [key=value]... [--human]\n       \
                      sqcqd top [--admin-socket PATH] [--interval SECS] [--iterations N] [--batch]\n       \
                      sqcqd version | help | completions bash|zsh|fish | man [rpc|top]",
    after_help = "Run-time changes: sqcqd rpc [--admin-socket PATH] METHOD [key=value]... \
                  (sqcqd rpc help: the methods). A live view: sqcqd top."
)]
pub struct Cli {
    /// vhost-user Unix socket to listen on (one device).
    #[arg(long)]
    pub socket_path: Option<PathBuf>,
    /// What the device of --socket-path is: scsi (any number of --lun) or
    /// blk (exactly one --lun, the disk).
    #[arg(long, value_enum, default_value_t = DeviceType::Scsi)]
    pub device_type: DeviceType,
    /// A logical unit: kind=null|ram|file,size=..,path=..,create,block-size=512|4096,ro,serial=..,wwn=0x..,lun=N (repeat for more LUNs; `create` makes a missing file of `size`).
    #[arg(long = "lun", value_name = "SPEC")]
    pub luns: Vec<LunSpec>,
    /// Request queues of the device.
    #[arg(long, default_value_t = DEFAULT_NUM_QUEUES)]
    pub num_queues: u16,
    /// Largest virtqueue size accepted.
    #[arg(long, default_value_t = DEFAULT_QUEUE_SIZE)]
    pub queue_size: u16,
    /// Worker threads.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Request queue to worker map, e.g. 0:0,1:1 (default round robin).
    #[arg(long)]
    pub queue_map: Option<QueueMap>,
    /// Admin socket: the management API (JSON-RPC) for run-time changes
    /// and statistics (`sqcqd rpc --admin-socket PATH METHOD ...` talks to
    /// it).
    #[arg(long)]
    pub admin_socket: Option<PathBuf>,
    /// TOML config file with `[[device]]` sections (the other options then
    /// only set defaults: --workers if the file has none).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Seccomp filter once running: off, errno (forbidden calls fail with
    /// EPERM) or kill (forbidden calls kill the daemon) [default: off].
    #[arg(long, value_enum, value_name = "MODE")]
    pub seccomp: Option<SeccompMode>,
    /// The destination of a live migration: file LUNs take their image
    /// locks when the frontend first starts a queue (after the source's
    /// device stopped and released them), not at start.
    #[arg(long)]
    pub incoming: bool,
    /// Poll mode, CPU placement and statistics.
    #[command(flatten)]
    pub poll: PollArgs,
    /// Pidfile and socket ownership.
    #[command(flatten)]
    pub service: ServiceArgs,
    /// Log level: error, warn, info, debug, trace, or a filter such as
    /// info,sqcq_target::admin=debug [default: $RUST_LOG, else info].
    #[arg(long, value_name = "LEVEL", value_parser = crate::service::log::parse_level)]
    pub log_level: Option<String>,
    /// Log lines on stderr: text, json (one object per line) or journal
    /// (syslog priorities for journald, no time stamps) [default: journal
    /// when stderr is the journal, else text].
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub log_format: Option<crate::service::log::LogFormat>,
}

// Serialized by `config_save` (module `save`): the tables come last, as
// TOML wants them after the plain keys.
#[derive(Deserialize, Serialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct FileConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    workers: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    admin_socket: Option<PathBuf>,
    #[serde(default)]
    seccomp: SeccompMode,
    #[serde(default)]
    poll: FilePoll,
    #[serde(default)]
    service: FileService,
    #[serde(default)]
    device: Vec<FileDevice>,
}

#[derive(Deserialize, Serialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
// The snake_case aliases: the spelling of `device_list`'s output, so that
// what the management API prints can be fed back to it.
struct FileDevice {
    #[serde(default, rename = "type")]
    device_type: DeviceType,
    #[serde(alias = "socket_path")]
    socket_path: PathBuf,
    #[serde(alias = "num_queues", skip_serializing_if = "Option::is_none")]
    num_queues: Option<u16>,
    #[serde(alias = "queue_size", skip_serializing_if = "Option::is_none")]
    queue_size: Option<u16>,
    #[serde(alias = "queue_map", skip_serializing_if = "Option::is_none")]
    queue_map: Option<String>,
    #[serde(default)]
    lun: Vec<LunSpec>,
    #[serde(default, skip_serializing_if = "QosLimits::is_off")]
    qos: QosLimits,
}

impl Cli {
    /// Turns the command line (and the config file it names) into a
    /// checked configuration.
    pub fn into_config(self) -> Result<DaemonConfig, ConfigError> {
        let mut config = match &self.config {
            Some(path) => load_file(path, &self)?,
            None => DaemonConfig {
                workers: self.workers,
                ..DaemonConfig::default()
            },
        };
        if self.admin_socket.is_some() {
            config.admin_socket = self.admin_socket;
        }
        if let Some(mode) = self.seccomp {
            config.seccomp = mode;
        }
        config.poll = self.poll.apply(config.poll);
        config.service = self.service.apply(config.service)?;
        if let Some(socket_path) = self.socket_path {
            config.devices.push(DeviceConfig {
                device_type: self.device_type,
                socket_path,
                luns: self.luns,
                num_queues: self.num_queues,
                queue_size: self.queue_size,
                queue_map: self.queue_map.unwrap_or_default(),
                qos: QosLimits::default(),
            });
        } else if !self.luns.is_empty() {
            return Err(ConfigError::Invalid("--lun needs --socket-path".into()));
        }
        if self.incoming {
            for lun in config.devices.iter_mut().flat_map(|d| &mut d.luns) {
                lun.defer_lock = true;
            }
        }
        config.validate()?;
        Ok(config)
    }
}

/// A device from a JSON object with the keys of a `[[device]]` table of
/// the configuration file (the management API's `device_create`); a LUN
/// may also be a `--lun` string. Defaults as on the command line.
pub fn device_from_json(mut value: serde_json::Value) -> Result<DeviceConfig, ConfigError> {
    let invalid = |e: serde_json::Error| ConfigError::Invalid(e.to_string());
    let luns = match value.as_object_mut().and_then(|o| o.remove("lun")) {
        None => Vec::new(),
        Some(serde_json::Value::Array(items)) => items
            .into_iter()
            .map(|item| match item {
                serde_json::Value::String(s) => Ok(LunSpec::from_str(&s)?),
                v => serde_json::from_value(v).map_err(invalid),
            })
            .collect::<Result<_, ConfigError>>()?,
        Some(_) => return Err(ConfigError::Invalid("lun must be an array".into())),
    };
    let d: FileDevice = serde_json::from_value(value).map_err(invalid)?;
    Ok(DeviceConfig {
        device_type: d.device_type,
        socket_path: d.socket_path,
        luns,
        num_queues: d.num_queues.unwrap_or(DEFAULT_NUM_QUEUES),
        queue_size: d.queue_size.unwrap_or(DEFAULT_QUEUE_SIZE),
        queue_map: d.queue_map.as_deref().unwrap_or("").parse()?,
        qos: d.qos.normalized(),
    })
}

fn load_file(path: &Path, cli: &Cli) -> Result<DaemonConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_toml(&text, cli.workers, cli.num_queues, cli.queue_size).map_err(|e| match e {
        ConfigError::Toml { source, .. } => ConfigError::Toml {
            path: path.to_owned(),
            source,
        },
        e => e,
    })
}

/// Parses a TOML configuration; the other arguments are defaults for
/// fields the file leaves out.
pub fn parse_toml(
    text: &str,
    workers: usize,
    num_queues: u16,
    queue_size: u16,
) -> Result<DaemonConfig, ConfigError> {
    let file: FileConfig = toml::from_str(text).map_err(|source| ConfigError::Toml {
        path: PathBuf::new(),
        source,
    })?;
    let devices = file
        .device
        .into_iter()
        .map(|d| {
            Ok(DeviceConfig {
                device_type: d.device_type,
                socket_path: d.socket_path,
                luns: d.lun,
                num_queues: d.num_queues.unwrap_or(num_queues),
                queue_size: d.queue_size.unwrap_or(queue_size),
                queue_map: d.queue_map.as_deref().unwrap_or("").parse()?,
                qos: d.qos.normalized(),
            })
        })
        .collect::<Result<_, ConfigError>>()?;
    Ok(DaemonConfig {
        workers: file.workers.unwrap_or(workers),
        devices,
        poll: file.poll.into(),
        admin_socket: file.admin_socket,
        seccomp: file.seccomp,
        service: file.service.resolve()?,
    })
}

impl DaemonConfig {
    /// Checks what the parsers cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |s: String| Err(ConfigError::Invalid(s));
        if self.workers == 0 || self.workers > 256 {
            return bad(format!("--workers {} must be 1..=256", self.workers));
        }
        self.poll
            .validate(self.workers)
            .map_err(ConfigError::Invalid)?;
        if self.devices.is_empty() {
            return bad("no device: give --socket-path or a --config with [[device]]".into());
        }
        if let Some(p) = self
            .service
            .save_config
            .as_ref()
            .filter(|p| !p.is_absolute())
        {
            return bad(format!(
                "--save-config {}: give an absolute path (the file is written after every \
                 change, whatever the working directory)",
                p.display()
            ));
        }
        for d in &self.devices {
            d.validate(|w| w < self.workers)?;
            if self
                .devices
                .iter()
                .filter(|o| o.socket_path == d.socket_path)
                .count()
                > 1
            {
                return bad(format!(
                    "{}: socket path used twice",
                    d.socket_path.display()
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lun_spec_parses_every_key() {
        let s: LunSpec =
            "kind=ram,size=64M,block-size=4096,ro,serial=abc,wwn=0x5001405000000001,lun=3"
                .parse()
                .unwrap();
        assert_eq!(s.kind, BackstoreKind::Ram);
        assert_eq!(s.size, Some(64 << 20));
        assert_eq!(s.block_size, 4096);
        assert!(s.read_only);
        assert_eq!(s.serial.as_deref(), Some("abc"));
        assert_eq!(s.wwn, Some(0x5001_4050_0000_0001));
        assert_eq!(s.lun, Some(3));
        assert!("size=1G".parse::<LunSpec>().is_err(), "kind is required");
        assert!("kind=ram,block-size=1000".parse::<LunSpec>().is_err());
        assert!("kind=ram,color=red".parse::<LunSpec>().is_err());
    }

    #[test]
    fn queue_maps_parse_and_are_checked() {
        let m: QueueMap = "0:1,1:0".parse().unwrap();
        assert_eq!(m.0, vec![(0, 1), (1, 0)]);
        assert!("0-1".parse::<QueueMap>().is_err());
        let mut d = parse_toml(
            "[[device]]\nsocket-path = \"/tmp/a.sock\"\nnum-queues = 2\n\
             [[device.lun]]\nkind = \"null\"\nsize = \"1G\"\n",
            2,
            1,
            64,
        )
        .unwrap()
        .devices
        .remove(0);
        d.queue_map = "0:1,1:0".parse().unwrap();
        assert!(d.validate(|w| w < 2).is_ok());
        assert!(d.validate(|w| w < 1).is_err(), "worker 1 does not exist");
        d.queue_map = "0:1,0:0".parse().unwrap();
        assert!(d.validate(|w| w < 2).is_err(), "queue 0 twice");
        d.queue_map = "2:0".parse().unwrap();
        assert!(d.validate(|w| w < 2).is_err(), "the device has 2 queues");
    }

    #[test]
    fn toml_with_two_devices() {
        let c = parse_toml(
            r#"
            workers = 2
            [[device]]
            socket-path = "/tmp/a.sock"
            num-queues = 2
            queue-map = "0:0,1:1"
            [[device.lun]]
            kind = "ram"
            size = "16M"
            [[device]]
            socket-path = "/tmp/b.sock"
            [[device.lun]]
            kind = "null"
            size = 1073741824
            block-size = 4096
            wwn = "0x5001405000000002"
            "#,
            1,
            1,
            128,
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.workers, 2);
        assert_eq!(c.devices.len(), 2);
        assert_eq!(c.devices[0].num_queues, 2);
        assert_eq!(c.devices[1].num_queues, 1);
        assert_eq!(c.devices[1].queue_size, 128);
        assert_eq!(c.devices[1].luns[0].block_size, 4096);
        assert_eq!(c.devices[0].queue_map.0, vec![(0, 0), (1, 1)]);
    }

    #[test]
    fn the_metrics_endpoint_from_the_file_or_the_command_line() {
        let file = "[service]\nmetrics-listen = \"unix:/run/m.sock\"\n\
                    [[device]]\nsocket-path = \"/tmp/x\"\n";
        let c = parse_toml(file, 1, 1, 128).unwrap();
        assert_eq!(
            c.service.metrics,
            Some(MetricsListen::Unix("/run/m.sock".into()))
        );
        assert!(parse_toml("[service]\nmetrics-listen = \"9393\"\n", 1, 1, 128).is_err());
        let cli = Cli::parse_from([
            "sqcqd",
            "--socket-path",
            "/tmp/s",
            "--metrics-listen",
            "127.0.0.1:0",
        ]);
        let c = cli.into_config().unwrap();
        assert_eq!(
            c.service.metrics,
            Some(MetricsListen::Tcp("127.0.0.1:0".parse().unwrap()))
        );
        let off = Cli::parse_from(["sqcqd", "--socket-path", "/tmp/s"]);
        assert_eq!(
            off.into_config().unwrap().service.metrics,
            None,
            "off by default"
        );
    }

    #[test]
    fn validation_rejects_bad_maps() {
        let mut c = parse_toml(
            "workers = 1\n[[device]]\nsocket-path = \"/tmp/x\"\nqueue-map = \"0:1\"\n",
            1,
            1,
            128,
        )
        .unwrap();
        assert!(c.validate().is_err());
        c.devices[0].queue_map = QueueMap::default();
        c.validate().unwrap();
    }
}
