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
#[derive(
    Clone, Copy, Debug, Default, Deserialize, serde::Serialize, PartialEq, Eq, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum RingMode {
    /// Classic virtio: sleep until the driver kicks (EVENT_IDX and
    /// VRING_USED_F_NO_NOTIFY as the driver and device agree).
    Kick,
    /// `ring-poll`: poll the avail index with notifications disabled
    /// (VRING_USED_F_NO_NOTIFY, or EVENT_IDX's `avail_event` left behind),
    /// re-enable them only before sleeping.
    Ring,
    /// `ring` with the spin window bounded by what a wakeup costs on this
    /// machine (measured at start, `runtime::wakeup`): a busy queue is
    /// polled, one that idles or trickles sleeps after a short window and
    /// is served by kicks.
    #[default]
    Auto,
}

/// The daemon-wide poll options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PollOptions {
    /// Offer VIRTIO_F_SQCQ_POLL (bit 42).
    pub offer_sqcq: bool,
    /// Offer VIRTIO_F_RING_PACKED (beside bit 42 when that is offered:
    /// the doorbells of packed rings are spec section 10).
    pub offer_packed: bool,
    /// How queues without bit 42 are served.
    pub ring: RingMode,
    /// `cpus[w]`: the CPU worker `w` is bound to (workers past the end of
    /// the list are not bound).
    pub cpus: Vec<usize>,
    /// The CPUs where the io-wq threads of `file` LUNs run (what io_uring
    /// cannot complete inline); empty: wherever the scheduler wakes them,
    /// which is next to the submitting worker.
    pub completion_cpus: Vec<usize>,
    /// Period of the statistics log lines and file (`None`: off).
    pub stats_interval: Option<Duration>,
    /// JSON snapshot of every queue's statistics.
    pub stats_file: Option<PathBuf>,
    /// Bounds of the adaptive spin window (`None`: the default, whose
    /// bound for ring-polled queues in [`RingMode::Auto`] follows the
    /// measured wakeup cost).
    pub spin: Option<SpinConfig>,
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
            offer_packed: false,
            ring: RingMode::Auto,
            cpus: Vec::new(),
            completion_cpus: Vec::new(),
            stats_interval: Some(Duration::from_secs(DEFAULT_STATS_INTERVAL)),
            stats_file: None,
            spin: None,
            stop_timeout: QUEUE_STOP_TIMEOUT,
            max_in_flight: None,
        }
    }
}

/// A spin configuration spinning between `min_us` and `max_us`, starting
/// from the default initial window clamped into that range.
pub fn spin_config(min_us: u64, max_us: u64) -> SpinConfig {
    spin_config_ns(min_us.saturating_mul(1000), max_us.saturating_mul(1000))
}

/// [`spin_config`] in nanoseconds.
pub fn spin_config_ns(min_ns: u64, max_ns: u64) -> SpinConfig {
    let d = SpinConfig::default();
    SpinConfig {
        min_ns,
        max_ns,
        initial_ns: d.initial_ns.max(min_ns).min(max_ns),
        factor: d.factor,
        wake_ns: d.wake_ns,
        floor_ns: d.floor_ns,
    }
}

/// Largest CPU number accepted (the size of a `cpu_set_t`).
pub const MAX_CPU: usize = 1023;

impl PollOptions {
    /// Whether the spin windows of polled queues are to follow the
    /// measured wakeup cost: something may be polled (ring polling, or
    /// bit 42 offered) and `--spin-us` does not set the windows.
    pub fn calibrates(&self) -> bool {
        self.spin.is_none() && (self.ring != RingMode::Kick || self.sqcq_offered())
    }

    /// Whether bit 42 is offered.
    pub fn sqcq_offered(&self) -> bool {
        self.offer_sqcq
    }

    /// Checks the options against the number of workers.
    pub fn validate(&self, workers: usize) -> Result<(), String> {
        if let Some(spin) = self.spin {
            SpinPolicy::new(spin).map_err(|e| format!("--spin-us: {e}"))?;
        }
        if self.cpus.len() > workers {
            return Err(format!(
                "--poll-cpus lists {} CPUs for {workers} workers",
                self.cpus.len()
            ));
        }
        if let Some(c) = self.cpus.iter().find(|&&c| c > MAX_CPU) {
            return Err(format!("--poll-cpus: CPU {c} is above {MAX_CPU}"));
        }
        if let Some(c) = self.completion_cpus.iter().find(|&&c| c > MAX_CPU) {
            return Err(format!("--completion-cpus: CPU {c} is above {MAX_CPU}"));
        }
        Ok(())
    }
}

/// An explicit request-queue-to-worker map: `(request queue, worker)`.
/// Request queue 0 is the device's first request virtqueue. Queues not
/// listed go round robin over the running workers when they start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueMap(pub Vec<(u16, usize)>);
