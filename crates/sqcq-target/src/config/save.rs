//! Saved state (`config_save`, `--save-config`): a [`DaemonConfig`]
//! written back as the TOML file it reads from, so that a fresh start
//! (`sqcqd --config FILE`) or a reload turns the file back into the same
//! daemon. The tables are the ones [`super::parse_toml`] reads, serialized
//! from the same structs, so the two cannot drift apart; a test reads
//! every saved field back.
//!
//! The file is written as SPDK's `save_config` and libvirt write theirs:
//! to a temporary file beside it, flushed, then renamed over it, so that a
//! crash leaves the old file or the new one, never half of one.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use thiserror::Error;

use super::{DaemonConfig, FileConfig, FileDevice, FilePoll, FileService, QueueMap};

/// The configuration could not be saved.
#[derive(Debug, Error)]
pub enum SaveError {
    /// The path is relative: the daemon's working directory (`/` under
    /// systemd) is not the client's.
    #[error("{0}: the path must be absolute (the daemon's working directory is not yours)")]
    Relative(PathBuf),
    /// The configuration has no TOML form (a bug: every field has one).
    #[error("cannot write the configuration as TOML")]
    Toml(#[from] toml::ser::Error),
    /// Writing, flushing or renaming failed.
    #[error("cannot write {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl From<&DaemonConfig> for FileConfig {
    fn from(c: &DaemonConfig) -> Self {
        FileConfig {
            workers: Some(c.workers),
            admin_socket: c.admin_socket.clone(),
            seccomp: c.seccomp,
            poll: FilePoll::from(&c.poll),
            service: FileService::from(&c.service),
            device: c
                .devices
                .iter()
                .map(|d| FileDevice {
                    device_type: d.device_type,
                    socket_path: d.socket_path.clone(),
                    num_queues: Some(d.num_queues),
                    queue_size: Some(d.queue_size),
                    queue_map: (!d.queue_map.0.is_empty()).then(|| d.queue_map.to_string()),
                    lun: d.luns.clone(),
                    qos: d.qos,
                })
                .collect(),
        }
    }
}

impl std::fmt::Display for QueueMap {
    /// `QUEUE:WORKER[,QUEUE:WORKER...]`, as `--queue-map` takes it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (q, w)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{q}:{w}")?;
        }
        Ok(())
    }
}

/// `config` as the text of a configuration file.
pub fn to_toml(config: &DaemonConfig) -> Result<String, SaveError> {
    let body = toml::to_string(&FileConfig::from(config))?;
    Ok(format!(
        "# The running configuration of sqcqd {}, written by config_save:\n\
         # start from it with `sqcqd --config FILE` (a daemon started from\n\
         # FILE applies it again on SIGHUP; docs/operations.md, \"Saved state\").\n\n{body}",
        env!("CARGO_PKG_VERSION")
    ))
}

/// Writes `config` to `path` (absolute) atomically, readable by its owner
/// only (it names keyrings and sockets).
pub fn save_file(path: &Path, config: &DaemonConfig) -> Result<(), SaveError> {
    if !path.is_absolute() {
        return Err(SaveError::Relative(path.to_owned()));
    }
    let text = to_toml(config)?;
    let write = |source| SaveError::Write {
        path: path.to_owned(),
        source,
    };
    let dir = path.parent().unwrap_or(Path::new("/"));
    let name = path
        .file_name()
        .map_or_else(|| "sqcqd.toml".into(), |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        // The rename itself survives a crash once the directory is
        // flushed.
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(write)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::{
        BackstoreKind, DeviceConfig, DeviceType, LunSpec, PollOptions, RingMode, ServiceConfig,
        parse_toml, spin_config,
    };
    use crate::prometheus::MetricsListen;
    use crate::runtime::qos::QosLimits;
    use crate::sandbox::SeccompMode;
    use crate::transport::listen::SocketOwnership;

    /// A configuration with every field away from its default.
    fn everything() -> DaemonConfig {
        let mut file = LunSpec::new(BackstoreKind::File);
        file.lun = Some(3);
        file.path = Some("/var/lib/sqcq/disk0.img".into());
        file.size = Some(3 << 30);
        file.create = true;
        file.block_size = 4096;
        file.read_only = true;
        file.serial = Some("12345".into());
        file.wwn = Some(0xf001_4050_0000_0001);
        file.lock = false;
        let mut null = LunSpec::new(BackstoreKind::Null);
        null.lun = Some(0);
        null.size = Some(1 << 40);
        null.zero = true;
        let mut rbd = LunSpec::new(BackstoreKind::Rbd);
        rbd.pool = Some("rbd".into());
        rbd.image = Some("vm1".into());
        rbd.namespace = Some("ns".into());
        rbd.snap = Some("s1".into());
        rbd.conf = Some("/etc/ceph/ceph.conf".into());
        rbd.id = Some("sqcq".into());
        rbd.keyring = Some("/etc/ceph/k".into());
        DaemonConfig {
            workers: 3,
            devices: vec![
                DeviceConfig {
                    device_type: DeviceType::Scsi,
                    socket_path: "/run/sqcq/vm1.sock".into(),
                    luns: vec![null, file],
                    num_queues: 2,
                    queue_size: 256,
                    queue_map: "0:2,1:0".parse().unwrap(),
                    qos: QosLimits {
                        iops: Some(5000),
                        bps: Some(100 << 20),
                        burst_ms: Some(20),
                    },
                },
                DeviceConfig {
                    device_type: DeviceType::Blk,
                    socket_path: "/run/sqcq/vm2.sock".into(),
                    luns: vec![rbd],
                    num_queues: 1,
                    queue_size: 1024,
                    queue_map: QueueMap::default(),
                    qos: Default::default(),
                },
            ],
            poll: PollOptions {
                offer_sqcq: false,
                offer_packed: true,
                ring: RingMode::Ring,
                cpus: vec![1, 0],
                completion_cpus: vec![1],
                stats_interval: None,
                stats_file: Some("/run/sqcq/stats.json".into()),
                spin: Some(spin_config(2, 300)),
                stop_timeout: Duration::from_secs(7),
                max_in_flight: Some(64),
            },
            admin_socket: Some("/run/sqcq/sqcqd.sock".into()),
            seccomp: SeccompMode::Kill,
            service: ServiceConfig {
                pidfile: Some("/run/sqcq/sqcqd.pid".into()),
                socket_ownership: SocketOwnership {
                    mode: Some(0o660),
                    uid: Some(0),
                    gid: Some(0),
                },
                admin_socket_ownership: SocketOwnership {
                    mode: Some(0o600),
                    uid: None,
                    gid: Some(0),
                },
                metrics: Some(MetricsListen::Unix("/run/sqcq/metrics.sock".into())),
                save_config: Some("/var/lib/sqcq/sqcqd.toml".into()),
            },
        }
    }

    #[test]
    fn a_saved_configuration_reads_back_the_same() {
        let c = everything();
        c.validate().unwrap();
        let text = to_toml(&c).unwrap();
        // The defaults passed to the parser differ from every saved
        // value: whatever reads back came from the file.
        let back = parse_toml(&text, 1, 1, 128).unwrap();
        assert_eq!(back, c, "{text}");
        assert!(text.contains("wwn = \"0xf001405000000001\""), "{text}");
        assert!(text.contains("socket-mode = \"0660\""), "{text}");
    }

    #[test]
    fn defaults_read_back_as_defaults() {
        let mut c = everything();
        c.poll = PollOptions::default();
        c.service = ServiceConfig::default();
        c.devices[0].luns = vec![LunSpec::new(BackstoreKind::Ram)];
        c.devices[0].luns[0].size = Some(1 << 20);
        let text = to_toml(&c).unwrap();
        assert_eq!(parse_toml(&text, 1, 1, 128).unwrap(), c, "{text}");
        assert!(!text.contains("lock ="), "the default is left out: {text}");
    }

    #[test]
    fn the_file_is_replaced_whole_and_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("sqcq-save-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("saved.toml");
        std::fs::write(&path, "old").unwrap();
        save_file(&path, &everything()).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(parse_toml(&text, 1, 1, 128).unwrap(), everything());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "no temporary file left"
        );
        assert!(matches!(
            save_file(Path::new("saved.toml"), &everything()),
            Err(SaveError::Relative(_))
        ));
        let missing = dir.join("no/such/dir/saved.toml");
        let e = save_file(&missing, &everything()).unwrap_err();
        assert!(matches!(e, SaveError::Write { .. }), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
