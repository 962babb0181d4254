//! Readiness and status notifications to the service manager, the
//! protocol of sd_notify(3): newline-separated `KEY=VALUE` lines
//! ([`NotifyState`] from the `sd-notify` crate) in one datagram to the
//! `AF_UNIX` socket named by `NOTIFY_SOCKET`, a path (`/run/systemd/notify`)
//! or, with a leading `@`, a name in the abstract namespace.
//!
//! The `sd-notify` crate's `notify` makes a new socket for every message
//! and connects it by path: a path starting with `@` is not an abstract
//! name to `UnixDatagram::connect`, and the daemon says `STOPPING=1` and
//! `RELOADING=1` under its seccomp filter, which should not have to allow
//! making sockets for that. So the socket is made once, when the daemon
//! starts ([`Notifier::from_env`]), and each message is sent to the
//! address with `sendto`, as libsystemd does (a service manager that
//! re-creates its socket at the same address still gets them).

use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

pub use sd_notify::NotifyState;
use thiserror::Error;

/// The variable naming the service manager's socket.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// How long a notification may wait for room in the service manager's
/// socket before it is given up (a stuck manager must not stall a stop).
const SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a notification could not be sent.
#[derive(Debug, Error)]
pub enum NotifyError {
    /// `NOTIFY_SOCKET` is neither an absolute path nor `@name`.
    #[error("NOTIFY_SOCKET={0:?}: not an absolute path or @abstract name")]
    Address(OsString),
    /// The socket could not be made or the datagram not sent.
    #[error("cannot notify the service manager at {address:?}")]
    Io {
        /// `NOTIFY_SOCKET`.
        address: OsString,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// The service manager's notification socket, if there is one.
#[derive(Debug)]
pub struct Notifier {
    target: Option<Target>,
}

#[derive(Debug)]
struct Target {
    socket: UnixDatagram,
    address: SocketAddr,
    name: OsString,
}

impl Notifier {
    /// The socket `NOTIFY_SOCKET` names; one that sends nothing when the
    /// variable is unset (not started by a service manager that listens).
    /// Does not change the environment (see
    /// [`ServiceEnv::take`](super::ServiceEnv::take)).
    pub fn from_env() -> Result<Self, NotifyError> {
        match std::env::var_os(NOTIFY_SOCKET) {
            Some(name) if !name.is_empty() => Self::to(&name),
            _ => Ok(Self::none()),
        }
    }

    /// A notifier that sends nothing.
    pub fn none() -> Self {
        Notifier { target: None }
    }

    /// A notifier sending to `name`: `/absolute/path` or `@abstract`.
    pub fn to(name: &OsStr) -> Result<Self, NotifyError> {
        let io_err = |source| NotifyError::Io {
            address: name.to_owned(),
            source,
        };
        let bytes = name.as_bytes();
        let address = match bytes.first() {
            Some(b'@') => SocketAddr::from_abstract_name(&bytes[1..]).map_err(io_err)?,
            Some(b'/') => SocketAddr::from_pathname(name).map_err(io_err)?,
            _ => return Err(NotifyError::Address(name.to_owned())),
        };
        let socket = UnixDatagram::unbound().map_err(io_err)?;
        socket
            .set_write_timeout(Some(SEND_TIMEOUT))
            .map_err(io_err)?;
        Ok(Notifier {
            target: Some(Target {
                socket,
                address,
                name: name.to_owned(),
            }),
        })
    }

    /// Whether there is a service manager to notify.
    pub fn enabled(&self) -> bool {
        self.target.is_some()
    }

    /// Sends `states` in one message. Makes no new socket: allowed under
    /// the seccomp filter (`sendto` only).
    pub fn notify(&self, states: &[NotifyState<'_>]) -> Result<(), NotifyError> {
        let Some(t) = &self.target else {
            return Ok(());
        };
        let mut msg = String::new();
        for s in states {
            // One line per state: a newline in a value (a status quoting a
            // configuration error) would start a line of its own, read as
            // another assignment.
            let line = s.to_string().replace(['\n', '\r'], " ");
            // Writing to a String cannot fail.
            let _ = writeln!(msg, "{line}");
        }
        let io_err = |source| NotifyError::Io {
            address: t.name.clone(),
            source,
        };
        let sent = t
            .socket
            .send_to_addr(msg.as_bytes(), &t.address)
            .map_err(io_err)?;
        if sent == msg.len() {
            Ok(())
        } else {
            Err(io_err(io::Error::new(
                io::ErrorKind::WriteZero,
                "notification truncated",
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receive(rx: &UnixDatagram) -> String {
        rx.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 512];
        let n = rx.recv(&mut buf).unwrap();
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    #[test]
    fn sends_to_a_path_and_to_an_abstract_name() {
        let dir = std::env::temp_dir().join(format!("sqcq-notify-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        let n = Notifier::to(path.as_os_str()).unwrap();
        assert!(n.enabled());
        n.notify(&[NotifyState::Ready, NotifyState::Status("serving 1 device")])
            .unwrap();
        assert_eq!(receive(&rx), "READY=1\nSTATUS=serving 1 device\n");

        let name = format!("sqcq-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let rx = UnixDatagram::bind_addr(&addr).unwrap();
        let n = Notifier::to(OsStr::new(&format!("@{name}"))).unwrap();
        n.notify(&[NotifyState::Stopping]).unwrap();
        assert_eq!(receive(&rx), "STOPPING=1\n");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_value_stays_on_its_line() {
        let dir = std::env::temp_dir().join(format!("sqcq-notify-nl-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        let n = Notifier::to(path.as_os_str()).unwrap();
        n.notify(&[NotifyState::Status("reload failed: line 2\nREADY=1\r")])
            .unwrap();
        assert_eq!(receive(&rx), "STATUS=reload failed: line 2 READY=1 \n");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_relative_address_is_refused_and_none_sends_nothing() {
        let e = Notifier::to(OsStr::new("run/notify")).unwrap_err();
        assert!(matches!(e, NotifyError::Address(_)), "{e}");
        assert!(Notifier::to(OsStr::new("vsock:2:1234")).is_err());
        let n = Notifier::none();
        assert!(!n.enabled());
        n.notify(&[NotifyState::Ready]).unwrap();
    }

    #[test]
    fn a_missing_listener_is_an_error() {
        let n = Notifier::to(OsStr::new("/nonexistent/sqcq/notify")).unwrap();
        let e = n.notify(&[NotifyState::Ready]).unwrap_err();
        assert!(matches!(e, NotifyError::Io { .. }), "{e}");
    }
}
