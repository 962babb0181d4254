//! The Prometheus endpoint (`--metrics-listen ADDR`, off by default): the
//! daemon's figures ([`crate::runtime::metrics`]) in the Prometheus text
//! format, version 0.0.4, served over HTTP on a TCP address or a Unix
//! socket.
//!
//! - [`exposition`]: what a scrape shows, the `sqcq_*` families, built
//!   from a [`Scrape`] taken at scrape time (so devices and workers added
//!   or removed while the daemon runs come and go with it);
//! - `text`: the format itself;
//! - [`server`]: the HTTP endpoint, one thread.
//!
//! Why no metrics library: the figures are the daemon's own atomics,
//! written by the workers without a lock and read at scrape time.
//! `prometheus` (tikv) would have them copied into its own metric objects
//! or rebuilt as protobuf `MetricFamily` values by a custom collector, for
//! a text encoder that is a few dozen lines here; `prometheus-client`
//! encodes OpenMetrics, not the 0.0.4 text format asked for. The format
//! (`# HELP`, `# TYPE`, escaped labels, cumulative buckets) is small and
//! is checked in the tests by Prometheus' own Python parser.
//!
//! Why no HTTP server library: `tiny_http` starts threads as connections
//! come (the seccomp filter forbids new threads once the daemon runs),
//! `hyper` needs an async runtime. The endpoint answers one request per
//! connection with one thread and `poll`; parsing the request, the part a
//! hostile client aims at, is `httparse`'s (hyper's parser), with the
//! length, header count and time bounded here.
//!
//! The address should be a local one (`127.0.0.1:9393`, `[::1]:9393`) or
//! a Unix socket (`unix:/run/sqcqd/metrics.sock`, created with mode 0600):
//! the endpoint has no authentication, and the figures name every socket
//! path. Another address works, with a warning in the log.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use serde::Deserialize;
use thiserror::Error;

pub mod exposition;
mod process;
pub mod server;
mod text;

pub use exposition::{DeviceFigures, LunFigures, Scrape};
pub use process::{ProcessFigures, render_build_info};
pub use server::{MetricsServer, Render};
pub use text::CONTENT_TYPE;

/// Where the endpoint listens: `IP:PORT` or `unix:PATH`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(try_from = "String", into = "String")]
pub enum MetricsListen {
    /// A TCP address (port 0: any free port).
    Tcp(SocketAddr),
    /// A Unix socket path.
    Unix(PathBuf),
}

/// A `--metrics-listen` value that is neither form.
#[derive(Debug, Error, PartialEq, Eq)]
#[error(
    "invalid metrics address {0:?}: expected IP:PORT (127.0.0.1:9393, [::1]:9393) or unix:PATH"
)]
pub struct BadMetricsListen(String);

impl FromStr for MetricsListen {
    type Err = BadMetricsListen;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.strip_prefix("unix:") {
            Some(path) if !path.is_empty() => Ok(MetricsListen::Unix(PathBuf::from(path))),
            Some(_) => Err(BadMetricsListen(s.to_owned())),
            None => s
                .parse()
                .map(MetricsListen::Tcp)
                .map_err(|_| BadMetricsListen(s.to_owned())),
        }
    }
}

impl TryFrom<String> for MetricsListen {
    type Error = BadMetricsListen;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<MetricsListen> for String {
    fn from(m: MetricsListen) -> String {
        m.to_string()
    }
}

impl fmt::Display for MetricsListen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetricsListen::Tcp(a) => a.fmt(f),
            MetricsListen::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

impl MetricsListen {
    /// The URL to scrape (for a Unix socket: the socket, then the path).
    pub fn url(&self) -> String {
        match self {
            MetricsListen::Tcp(a) => format!("http://{a}/metrics"),
            MetricsListen::Unix(p) => format!("unix:{} /metrics", p.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse() {
        assert_eq!(
            "127.0.0.1:9393".parse(),
            Ok(MetricsListen::Tcp("127.0.0.1:9393".parse().unwrap()))
        );
        assert_eq!(
            "[::1]:0".parse(),
            Ok(MetricsListen::Tcp("[::1]:0".parse().unwrap()))
        );
        assert_eq!(
            "unix:/run/m.sock".parse(),
            Ok(MetricsListen::Unix("/run/m.sock".into()))
        );
        for bad in [
            "",
            "unix:",
            "localhost:9393",
            "9393",
            "127.0.0.1",
            "http://x/",
        ] {
            assert!(bad.parse::<MetricsListen>().is_err(), "{bad:?}");
        }
        let a: MetricsListen = "unix:/a b".parse().unwrap();
        assert_eq!(a.to_string(), "unix:/a b");
    }
}
