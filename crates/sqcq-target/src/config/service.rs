//! How the daemon runs as a service: the pidfile, the owner, group and
//! mode of its sockets, and the metrics endpoint, from the command line
//! and from the `[service]` table of the TOML file (the command line
//! wins). User and group names
//! are resolved here, once.

use std::path::PathBuf;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{ConfigError, ServiceConfig};
use crate::prometheus::MetricsListen;
use crate::service::account::{group_id, user_id};
use crate::transport::listen::SocketOwnership;

/// The mode of the admin socket unless configured: whoever can use it
/// can make the daemon open any file the daemon can open.
pub const DEFAULT_ADMIN_SOCKET_MODE: u32 = 0o600;

/// Service options of the command line.
#[derive(Debug, Default, clap::Args)]
pub struct ServiceArgs {
    /// Write the daemon's pid to PATH, locked while it runs (a second
    /// daemon with the same pidfile refuses to start); removed on exit.
    #[arg(long, value_name = "PATH")]
    pub pidfile: Option<PathBuf>,
    /// Mode of the vhost-user sockets, in octal, e.g. 0660 [default: 0777
    /// less the umask].
    #[arg(long, value_name = "MODE", value_parser = parse_mode)]
    pub socket_mode: Option<u32>,
    /// Owner of the vhost-user sockets (needs root).
    #[arg(long, value_name = "USER|UID")]
    pub socket_owner: Option<String>,
    /// Group of the vhost-user sockets (the daemon must be root or a
    /// member of it).
    #[arg(long, value_name = "GROUP|GID")]
    pub socket_group: Option<String>,
    /// Mode of the admin socket, in octal [default: 0600].
    #[arg(long, value_name = "MODE", value_parser = parse_mode)]
    pub admin_socket_mode: Option<u32>,
    /// Owner of the admin socket (needs root).
    #[arg(long, value_name = "USER|UID")]
    pub admin_socket_owner: Option<String>,
    /// Group of the admin socket.
    #[arg(long, value_name = "GROUP|GID")]
    pub admin_socket_group: Option<String>,
    /// Serve Prometheus metrics (GET /metrics) on ADDR: a local IP:PORT
    /// such as 127.0.0.1:9393, or unix:PATH (mode 0600) [default: no
    /// endpoint].
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<MetricsListen>,
    /// Saved state: write the running configuration (devices, LUNs,
    /// workers, queue maps and these options) to PATH, an absolute path,
    /// after every change, atomically; start from it with --config PATH
    /// [default: only when asked, `sqcqd rpc config_save path=...`].
    #[arg(long, value_name = "PATH")]
    pub save_config: Option<PathBuf>,
}

/// The `[service]` table of the TOML file.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct FileService {
    #[serde(skip_serializing_if = "Option::is_none")]
    pidfile: Option<PathBuf>,
    #[serde(
        default,
        deserialize_with = "de_mode",
        serialize_with = "ser_mode",
        skip_serializing_if = "Option::is_none"
    )]
    socket_mode: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    socket_owner: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    socket_group: Option<String>,
    #[serde(
        default,
        deserialize_with = "de_mode",
        serialize_with = "ser_mode",
        skip_serializing_if = "Option::is_none"
    )]
    admin_socket_mode: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    admin_socket_owner: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    admin_socket_group: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    metrics_listen: Option<MetricsListen>,
    #[serde(skip_serializing_if = "Option::is_none")]
    save_config: Option<PathBuf>,
}

impl From<&ServiceConfig> for FileService {
    /// The table that reads back as `c` (owners and groups as numbers:
    /// they were resolved at start).
    fn from(c: &ServiceConfig) -> Self {
        let id = |v: Option<u32>| v.map(|v| v.to_string());
        FileService {
            pidfile: c.pidfile.clone(),
            socket_mode: c.socket_ownership.mode,
            socket_owner: id(c.socket_ownership.uid),
            socket_group: id(c.socket_ownership.gid),
            admin_socket_mode: c.admin_socket_ownership.mode,
            admin_socket_owner: id(c.admin_socket_ownership.uid),
            admin_socket_group: id(c.admin_socket_ownership.gid),
            metrics_listen: c.metrics.clone(),
            save_config: c.save_config.clone(),
        }
    }
}

/// A socket's permission bits in octal, `0660` or `660`: at most `0777`.
pub fn parse_mode(s: &str) -> Result<u32, String> {
    let digits = s.strip_prefix("0o").unwrap_or(s);
    match u32::from_str_radix(digits, 8) {
        Ok(m) if m <= 0o777 && !digits.is_empty() && !digits.starts_with('+') => Ok(m),
        _ => Err(format!(
            "invalid socket mode {s:?}: expected octal permission bits, 0000..0777 (e.g. 0660)"
        )),
    }
}

/// Modes are strings in the file (`socket-mode = "0660"`), as in systemd's
/// `SocketMode=`: a TOML integer would be decimal.
// Serde's `serialize_with` takes a reference.
#[allow(clippy::ref_option)]
fn ser_mode<S: Serializer>(mode: &Option<u32>, s: S) -> Result<S::Ok, S::Error> {
    match mode {
        Some(m) => s.serialize_str(&format!("{m:04o}")),
        None => s.serialize_none(),
    }
}

fn de_mode<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    Option::<String>::deserialize(d)?
        .map(|s| parse_mode(&s).map_err(serde::de::Error::custom))
        .transpose()
}

/// Sets what is given: mode, owner, group (names resolved).
fn ownership(
    mut base: SocketOwnership,
    mode: Option<u32>,
    owner: Option<&str>,
    group: Option<&str>,
) -> Result<SocketOwnership, ConfigError> {
    if mode.is_some() {
        base.mode = mode;
    }
    if let Some(o) = owner {
        base.uid = Some(user_id(o)?);
    }
    if let Some(g) = group {
        base.gid = Some(group_id(g)?);
    }
    Ok(base)
}

impl FileService {
    /// The service configuration the file describes.
    pub(super) fn resolve(self) -> Result<ServiceConfig, ConfigError> {
        let base = ServiceConfig::default();
        Ok(ServiceConfig {
            pidfile: self.pidfile,
            socket_ownership: ownership(
                base.socket_ownership,
                self.socket_mode,
                self.socket_owner.as_deref(),
                self.socket_group.as_deref(),
            )?,
            admin_socket_ownership: ownership(
                base.admin_socket_ownership,
                self.admin_socket_mode,
                self.admin_socket_owner.as_deref(),
                self.admin_socket_group.as_deref(),
            )?,
            metrics: self.metrics_listen,
            save_config: self.save_config,
        })
    }
}

impl ServiceArgs {
    /// `config` with what the command line gives on top.
    pub fn apply(self, mut config: ServiceConfig) -> Result<ServiceConfig, ConfigError> {
        if self.pidfile.is_some() {
            config.pidfile = self.pidfile;
        }
        if self.metrics_listen.is_some() {
            config.metrics = self.metrics_listen;
        }
        if self.save_config.is_some() {
            config.save_config = self.save_config;
        }
        config.socket_ownership = ownership(
            config.socket_ownership,
            self.socket_mode,
            self.socket_owner.as_deref(),
            self.socket_group.as_deref(),
        )?;
        config.admin_socket_ownership = ownership(
            config.admin_socket_ownership,
            self.admin_socket_mode,
            self.admin_socket_owner.as_deref(),
            self.admin_socket_group.as_deref(),
        )?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_toml;

    #[test]
    fn modes_are_octal_permission_bits() {
        assert_eq!(parse_mode("0660"), Ok(0o660));
        assert_eq!(parse_mode("600"), Ok(0o600));
        assert_eq!(parse_mode("0o770"), Ok(0o770));
        for bad in ["", "0o", "0888", "1777", "04755", "rw-rw----", "+660", "-1"] {
            assert!(parse_mode(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_service_table_and_the_command_line() {
        let file = "[service]\npidfile = \"/run/sqcq/sqcqd.pid\"\nsocket-mode = \"0660\"\n\
                    socket-group = \"root\"\nadmin-socket-group = \"0\"\n\
                    [[device]]\nsocket-path = \"/tmp/a.sock\"\n";
        let c = parse_toml(file, 1, 1, 128).unwrap();
        let s = &c.service;
        assert_eq!(
            s.pidfile.as_deref(),
            Some(std::path::Path::new("/run/sqcq/sqcqd.pid"))
        );
        assert_eq!(
            s.socket_ownership,
            SocketOwnership {
                mode: Some(0o660),
                uid: None,
                gid: Some(0)
            }
        );
        assert_eq!(
            s.admin_socket_ownership,
            SocketOwnership {
                mode: Some(DEFAULT_ADMIN_SOCKET_MODE),
                uid: None,
                gid: Some(0)
            }
        );
        let args = ServiceArgs {
            socket_mode: Some(0o600),
            admin_socket_owner: Some("root".into()),
            ..ServiceArgs::default()
        };
        let s = args.apply(c.service).unwrap();
        assert_eq!(
            s.socket_ownership.mode,
            Some(0o600),
            "the command line wins"
        );
        assert_eq!(s.socket_ownership.gid, Some(0), "the file's group stays");
        assert_eq!(s.admin_socket_ownership.uid, Some(0));
        assert!(s.pidfile.is_some());
    }

    #[test]
    fn unknown_names_and_integer_modes_are_config_errors() {
        let toml = |service: &str| {
            parse_toml(
                &format!("[service]\n{service}\n[[device]]\nsocket-path = \"/tmp/a\"\n"),
                1,
                1,
                128,
            )
        };
        let e = toml("socket-group = \"sqcq-no-such-group\"").unwrap_err();
        let e = crate::runtime::error_chain(&e);
        assert!(e.contains("unknown group"), "{e}");
        let e = toml("admin-socket-owner = \"sqcq-no-such-user\"").unwrap_err();
        let e = crate::runtime::error_chain(&e);
        assert!(e.contains("unknown user"), "{e}");
        assert!(toml("socket-mode = 660").is_err(), "a decimal integer");
        assert!(toml("socket-mode = \"0999\"").is_err());
        assert!(toml("color = \"red\"").is_err());
        let e = ServiceArgs {
            socket_owner: Some("sqcq-no-such-user".into()),
            ..ServiceArgs::default()
        }
        .apply(ServiceConfig::default())
        .unwrap_err();
        let e = crate::runtime::error_chain(&e);
        assert!(e.contains("unknown user"), "{e}");
    }
}
