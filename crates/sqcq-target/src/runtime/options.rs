//! The runtime's options: how request queues are served (bit 42
//! offered, ring polling for the others), the adaptive spin window's
//! bounds, CPU binding, statistics, and which worker serves which request
//! queue. `crate::config` fills them from the command line or a file.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use sqcq_protocol::{SpinConfig, SpinPolicy};

/// Default seconds between per-queue statistics lines.
pub const DEFAULT_STATS_INTERVAL: u64 = 10;

/// How a request queue without VIRTIO_F_SQCQ_POLL is served.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum RingMode {
    /// Classic virtio: sleep until the driver kicks (EVENT_IDX and
    /// VRING_USED_F_NO_NOTIFY as the driver and device agree).
    #[default]
    Kick,
    /// `ring-poll`: poll the avail index with notifications disabled
    /// (VRING_USED_F_NO_NOTIFY, or EVENT_IDX's `avail_event` left behind),
    /// re-enable them only before sleeping.
    Ring,
}

/// The daemon-wide poll options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PollOptions {
    /// Offer VIRTIO_F_SQCQ_POLL (bit 42).
    pub offer_sqcq: bool,
    /// How queues without bit 42 are served.
    pub ring: RingMode,
    /// `cpus[w]`: the CPU worker `w` is bound to (workers past the end of
    /// the list are not bound).
    pub cpus: Vec<usize>,
    /// Period of the statistics log lines and file (`None`: off).
    pub stats_interval: Option<Duration>,
    /// JSON snapshot of every queue's statistics.
    pub stats_file: Option<PathBuf>,
    /// Bounds of the adaptive spin window.
    pub spin: SpinConfig,
    /// How long a queue stop (GET_VRING_BASE, a disconnect) waits for
    /// the requests in flight before it cancels them
    /// ([`QUEUE_STOP_TIMEOUT`] by default; tests shorten it).
    pub stop_timeout: Duration,
    /// At most this many requests in flight per request queue (`None`:
    /// the queue size); see `runtime::queue::limit`.
    pub max_in_flight: Option<u16>,
}

/// How long stopping a queue waits for its requests in flight before it
/// cancels them (the SCSI command timeout of Linux guests); the default
/// of [`PollOptions::stop_timeout`], and the bound of the worker pool's
/// own calls (retiring a worker, moving a queue).
pub const QUEUE_STOP_TIMEOUT: Duration = Duration::from_secs(30);

impl Default for PollOptions {
    fn default() -> Self {
        PollOptions {
            offer_sqcq: true,
            ring: RingMode::Kick,
            cpus: Vec::new(),
            stats_interval: Some(Duration::from_secs(DEFAULT_STATS_INTERVAL)),
            stats_file: None,
            spin: SpinConfig::default(),
            stop_timeout: QUEUE_STOP_TIMEOUT,
            max_in_flight: None,
        }
    }
}

/// A spin configuration spinning between `min_us` and `max_us`, starting
/// from the default initial window clamped into that range.
pub fn spin_config(min_us: u64, max_us: u64) -> SpinConfig {
    let d = SpinConfig::default();
    let (min_ns, max_ns) = (min_us.saturating_mul(1000), max_us.saturating_mul(1000));
    SpinConfig {
        min_ns,
        max_ns,
        initial_ns: d.initial_ns.max(min_ns).min(max_ns),
        factor: d.factor,
    }
}

/// Largest CPU number accepted (the size of a `cpu_set_t`).
pub const MAX_CPU: usize = 1023;

impl PollOptions {
    /// The spin policy of a new polled queue.
    pub fn spin_policy(&self) -> SpinPolicy {
        // Checked by `validate`; an unchecked bad one falls back.
        SpinPolicy::new(self.spin).unwrap_or_default()
    }

    /// Checks the options against the number of workers.
    pub fn validate(&self, workers: usize) -> Result<(), String> {
        SpinPolicy::new(self.spin).map_err(|e| format!("--spin-us: {e}"))?;
        if self.cpus.len() > workers {
            return Err(format!(
                "--poll-cpus lists {} CPUs for {workers} workers",
                self.cpus.len()
            ));
        }
        if let Some(c) = self.cpus.iter().find(|&&c| c > MAX_CPU) {
            return Err(format!("--poll-cpus: CPU {c} is above {MAX_CPU}"));
        }
        Ok(())
    }
}

/// An explicit request-queue-to-worker map: `(request queue, worker)`.
/// Request queue 0 is the device's first request virtqueue. Queues not
/// listed go round robin over the running workers when they start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueMap(pub Vec<(u16, usize)>);
