//! The admin socket (`--admin-socket PATH`): LUN changes and statistics
//! while the daemon runs, one text command per line, one line per reply.
//!
//! ```text
//! lun add device=0 lun=1 kind=ram,size=64M,block-size=4096
//! lun remove device=0 lun=1
//! lun resize device=0 lun=0 size=128M
//! stats
//! fault break device=0 vq=2
//! ```
//!
//! A reply starts with `ok` or `error`. `device=` defaults to 0; `lun add`
//! takes every key of a `--lun` spec and needs `lun=`. The socket is
//! created with mode 0600 unless `--admin-socket-mode` says otherwise:
//! whoever can use it can make the daemon open any file it can open.
//! One thread serves it (`admin/server.rs`): up to [`MAX_CONNECTIONS`]
//! clients at once, of which idle ones delay nobody, and one command at
//! a time, so changes are serialised; a command waits until its change
//! reached every worker (and, for a removal, until the LUN's requests in
//! flight completed) before it replies.
//!
//! `fault break` is fault injection, for testing how a driver recovers:
//! the request queue `vq` (every running request queue of the device
//! without `vq=`) breaks when it next finds a request, exactly as when the
//! driver writes a doorbell value no correct driver writes (spec 6.1) or
//! corrupts its ring: it stops without taking that request, its error
//! eventfd is signalled (QEMU then sets DEVICE_NEEDS_RESET, with the
//! project's patch), and it is served again only after the driver resets
//! the device.
//!
//! `sqcqd admin --admin-socket PATH COMMAND...` ([`request`]) is the
//! client.

mod server;

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use thiserror::Error;

use crate::registry::Registry;
use crate::scsi::hotplug::HotplugError;
use crate::spec::{LunSpec, LunSpecError, parse_size};

pub use server::{AdminServer, IDLE_TIMEOUT, MAX_CONNECTIONS, MAX_LINE};

/// How long the client waits for a reply (a removal waits for I/O).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);

/// An admin command that could not be parsed.
#[derive(Debug, Error)]
pub enum CommandError {
    /// Not a command this socket knows.
    #[error("unknown command {0:?} (lun add|remove|resize, stats, fault break)")]
    Unknown(String),
    /// A `key=value` argument is missing or malformed.
    #[error("{0}")]
    Argument(String),
    /// The LUN spec of `lun add` is invalid.
    #[error(transparent)]
    Spec(#[from] LunSpecError),
}

/// One admin command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdminCommand {
    /// Add a LUN.
    LunAdd {
        /// Device number (configuration order).
        device: u32,
        /// The LUN (its `lun` is set); boxed, as the largest variant.
        spec: Box<LunSpec>,
    },
    /// Remove a LUN.
    LunRemove {
        /// Device number.
        device: u32,
        /// The LUN.
        lun: u16,
    },
    /// Change the capacity of a LUN.
    LunResize {
        /// Device number.
        device: u32,
        /// The LUN.
        lun: u16,
        /// New size in bytes.
        bytes: u64,
    },
    /// LUNs, per-queue statistics and error counters of every device.
    Stats,
    /// Arm request queue `vq` of `device` (every running one if `None`) to
    /// break at its next request, as for a nonsense doorbell.
    FaultBreak {
        /// Device number.
        device: u32,
        /// The vring index.
        vq: Option<u16>,
    },
}

fn number<T: FromStr>(key: &str, value: &str) -> Result<T, CommandError> {
    value
        .parse()
        .map_err(|_| CommandError::Argument(format!("bad {key}={value:?}")))
}

impl FromStr for AdminCommand {
    type Err = CommandError;

    fn from_str(line: &str) -> Result<Self, Self::Err> {
        let mut words = line.split_whitespace();
        let verb = (words.next(), words.next());
        let mut device = 0u32;
        let mut lun = None;
        let mut vq = None;
        let mut size = None;
        let mut rest = Vec::new();
        for part in words.flat_map(|w| w.split(',')).filter(|p| !p.is_empty()) {
            match part.split_once('=') {
                Some(("device", v)) => device = number("device", v)?,
                Some(("lun", v)) => lun = Some(number::<u16>("lun", v)?),
                Some(("vq", v)) => vq = Some(number::<u16>("vq", v)?),
                Some(("size", v)) => {
                    size = Some(parse_size(v).map_err(CommandError::Argument)?);
                    rest.push(part);
                }
                _ => rest.push(part),
            }
        }
        let lun_or = || lun.ok_or_else(|| CommandError::Argument("lun= is required".into()));
        match verb {
            (Some("fault"), Some("break")) if rest.is_empty() && lun.is_none() => {
                Ok(AdminCommand::FaultBreak { device, vq })
            }
            _ if vq.is_some() => Err(CommandError::Argument("unexpected vq=".into())),
            (Some("lun"), Some("add")) => {
                let mut spec = LunSpec::from_str(&rest.join(","))?;
                spec.lun = Some(lun_or()?);
                Ok(AdminCommand::LunAdd {
                    device,
                    spec: Box::new(spec),
                })
            }
            (Some("lun"), Some("remove")) if rest.is_empty() => Ok(AdminCommand::LunRemove {
                device,
                lun: lun_or()?,
            }),
            (Some("lun"), Some("resize")) if rest.len() <= 1 => Ok(AdminCommand::LunResize {
                device,
                lun: lun_or()?,
                bytes: size.ok_or_else(|| CommandError::Argument("size= is required".into()))?,
            }),
            (Some("lun"), Some("remove" | "resize")) => Err(CommandError::Argument(format!(
                "unexpected {}",
                rest.join(",")
            ))),
            (Some("stats"), None) => Ok(AdminCommand::Stats),
            _ => Err(CommandError::Unknown(line.trim().to_owned())),
        }
    }
}

/// Runs one legacy text command line; returns the reply line (without
/// newline).
pub fn execute(registry: &Registry, line: &str) -> String {
    let cmd = match line.parse::<AdminCommand>() {
        Ok(c) => c,
        Err(e) => return format!("error {e}"),
    };
    let result = match cmd {
        AdminCommand::LunAdd { device: d, spec } => registry
            .lun_add(d, &spec)
            .map(|lun| format!("ok device={d} lun={lun} added")),
        AdminCommand::LunRemove { device: d, lun } => registry
            .lun_remove(d, lun)
            .map(|()| format!("ok device={d} lun={lun} removed")),
        AdminCommand::LunResize {
            device: d,
            lun,
            bytes,
        } => registry
            .lun_resize(d, lun, bytes)
            .map(|blocks| format!("ok device={d} lun={lun} blocks={blocks}")),
        AdminCommand::Stats => return stats(registry),
        AdminCommand::FaultBreak { device: d, vq } => registry.control(d).and_then(|dev| {
            let armed = dev.break_queues(vq);
            if armed.is_empty() {
                Err(HotplugError::NoQueue.into())
            } else {
                let list: Vec<String> = armed.iter().map(u16::to_string).collect();
                Ok(format!("ok device={d} armed vq={}", list.join(",")))
            }
        }),
    };
    match result {
        Ok(reply) => reply,
        Err(e) => format!("error {}", crate::runtime::error_chain(&e)),
    }
}

/// `ok` then, per device: its LUNs (`lunN=BLOCKSxBLOCK_SIZE`), the figures
/// of every queue that did work (`vqN=COMPLETIONS/PUBLISHES/CALLS`) and
/// its error counters.
fn stats(registry: &Registry) -> String {
    use std::fmt::Write as _;
    let mut s = String::from("ok");
    for id in registry.ids() {
        let Ok(dev) = registry.control(id) else {
            continue;
        };
        let _ = write!(s, " device={}", dev.info.id);
        let luns = dev.scsi().ok().map(|d| d.target.current());
        for e in luns.iter().flat_map(|t| t.luns()) {
            let _ = write!(
                s,
                " lun{}={}x{}",
                e.lun,
                e.unit.blocks(),
                e.unit.block_size()
            );
        }
        for q in dev.info.metrics.queues().filter(|q| q.publishes > 0) {
            let _ = write!(
                s,
                " vq{}={}/{}/{}",
                q.vq, q.completions, q.publishes, q.calls
            );
        }
        for (name, value) in dev.info.metrics.errors() {
            let _ = write!(s, " {name}={value}");
        }
    }
    s
}

/// `sqcqd admin`: the command line of the client.
#[derive(Debug, clap::Parser)]
#[command(
    name = "sqcqd admin",
    about = "Send one command to a running sqcqd's admin socket",
    after_help = "COMMAND: lun add device=D lun=N kind=..,size=..[,block-size=..] | \
                  lun remove device=D lun=N | lun resize device=D lun=N size=S | stats"
)]
pub struct AdminCli {
    /// The daemon's admin socket.
    #[arg(long)]
    pub admin_socket: PathBuf,
    /// The command, e.g. `lun add device=0 lun=1 kind=ram,size=64M`.
    #[arg(required = true, trailing_var_arg = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// The client: sends `line` to the admin socket at `path` and returns the
/// reply line.
pub fn request(path: &Path, line: &str) -> io::Result<String> {
    let mut conn = UnixStream::connect(path)?;
    conn.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    conn.write_all(line.trim().as_bytes())?;
    conn.write_all(b"\n")?;
    conn.shutdown(std::net::Shutdown::Write)?;
    let mut reply = String::new();
    conn.read_to_string(&mut reply)?;
    Ok(reply.lines().next().unwrap_or("").to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BackstoreKind;

    #[test]
    fn commands_parse() {
        let c: AdminCommand = "lun add device=1 lun=3 kind=ram,size=64M,block-size=4096"
            .parse()
            .unwrap();
        let AdminCommand::LunAdd { device, spec } = c else {
            panic!("{c:?}")
        };
        assert_eq!(
            (device, spec.lun, spec.kind),
            (1, Some(3), BackstoreKind::Ram)
        );
        assert_eq!((spec.size, spec.block_size), (Some(64 << 20), 4096));
        assert_eq!(
            "lun remove lun=2".parse::<AdminCommand>().unwrap(),
            AdminCommand::LunRemove { device: 0, lun: 2 }
        );
        assert_eq!(
            "lun resize device=0 lun=0 size=128M"
                .parse::<AdminCommand>()
                .unwrap(),
            AdminCommand::LunResize {
                device: 0,
                lun: 0,
                bytes: 128 << 20
            }
        );
        assert_eq!(
            "stats".parse::<AdminCommand>().unwrap(),
            AdminCommand::Stats
        );
        assert_eq!(
            "fault break device=1 vq=3".parse::<AdminCommand>().unwrap(),
            AdminCommand::FaultBreak {
                device: 1,
                vq: Some(3)
            }
        );
        assert_eq!(
            "fault break".parse::<AdminCommand>().unwrap(),
            AdminCommand::FaultBreak {
                device: 0,
                vq: None
            }
        );
    }

    #[test]
    fn bad_commands_are_refused() {
        for bad in [
            "",
            "lun",
            "lun add kind=ram,size=1M",
            "lun add lun=1 kind=tape",
            "lun remove device=0",
            "lun remove lun=1 size=4M",
            "lun resize lun=1",
            "lun resize lun=1 size=4Q",
            "lun add lun=70000 kind=ram,size=1M",
            "stats now",
            "reboot",
            "fault",
            "fault break lun=1",
            "fault break vq=x",
            "fault break vq=2 now",
            "lun remove lun=1 vq=2",
        ] {
            assert!(bad.parse::<AdminCommand>().is_err(), "{bad:?}");
        }
    }
}
