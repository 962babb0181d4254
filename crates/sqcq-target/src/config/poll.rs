//! The poll options of the daemon: how queues are served (bit 42 offered,
//! ring polling), the adaptive spin window's bounds, CPU binding and
//! statistics, from the command line (`PollArgs`) or a configuration
//! file's `[poll]` table (`FilePoll`). What the worker does with them is
//! [`crate::runtime::poll`].

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
}

impl Default for PollOptions {
    fn default() -> Self {
        PollOptions {
            offer_sqcq: true,
            ring: RingMode::Kick,
            cpus: Vec::new(),
            stats_interval: Some(Duration::from_secs(DEFAULT_STATS_INTERVAL)),
            stats_file: None,
            spin: SpinConfig::default(),
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

/// The command-line poll options of `sqcqd` (flattened into its `Cli`).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct PollArgs {
    /// Do not offer VIRTIO_F_SQCQ_POLL (feature bit 42): drivers then use
    /// classic notifications.
    #[arg(long)]
    pub no_sqcq: bool,
    /// How request queues without bit 42 are served: kick (classic) or
    /// ring (poll the avail ring with notifications disabled).
    #[arg(long, value_enum, value_name = "MODE")]
    pub poll: Option<RingMode>,
    /// Bind worker N to the Nth CPU of this list, e.g. 0,1.
    #[arg(long, value_delimiter = ',', value_name = "CPUS")]
    pub poll_cpus: Vec<usize>,
    /// Seconds between per-queue statistics (log lines and --stats-file);
    /// 0 turns them off [default: 10].
    #[arg(long, value_name = "SECS")]
    pub stats_interval: Option<u64>,
    /// Keep a JSON snapshot of every queue's statistics in this file
    /// (rewritten atomically every interval and when a frontend leaves).
    #[arg(long, value_name = "PATH")]
    pub stats_file: Option<PathBuf>,
    /// Bounds of the adaptive spin window in microseconds, MIN,MAX
    /// [default: 1,200].
    #[arg(long, value_name = "MIN,MAX", value_parser = parse_spin_us)]
    pub spin_us: Option<SpinConfig>,
}

/// Parses `MIN,MAX` microseconds into a spin configuration.
pub fn parse_spin_us(s: &str) -> Result<SpinConfig, String> {
    let (min, max) = s
        .split_once(',')
        .ok_or_else(|| format!("{s:?}: expected MIN,MAX"))?;
    let us = |v: &str| {
        v.trim()
            .parse::<u64>()
            .map_err(|_| format!("{v:?}: not a number of microseconds"))
    };
    let c = spin_config(us(min)?, us(max)?);
    SpinPolicy::new(c).map_err(|e| e.to_string())?;
    Ok(c)
}

impl PollArgs {
    /// The options of `base` (defaults or a config file's `[poll]`) with
    /// what the command line gave on top.
    pub fn apply(self, mut base: PollOptions) -> PollOptions {
        if self.no_sqcq {
            base.offer_sqcq = false;
        }
        if let Some(m) = self.poll {
            base.ring = m;
        }
        if !self.poll_cpus.is_empty() {
            base.cpus = self.poll_cpus;
        }
        if let Some(s) = self.stats_interval {
            base.stats_interval = interval(s);
        }
        if self.stats_file.is_some() {
            base.stats_file = self.stats_file;
        }
        if let Some(c) = self.spin_us {
            base.spin = c;
        }
        base
    }
}

fn interval(secs: u64) -> Option<Duration> {
    (secs > 0).then(|| Duration::from_secs(secs))
}

/// The `[poll]` table of a TOML configuration file.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct FilePoll {
    sqcq: Option<bool>,
    mode: Option<RingMode>,
    #[serde(default)]
    cpus: Vec<usize>,
    stats_interval: Option<u64>,
    stats_file: Option<PathBuf>,
    spin_us: Option<[u64; 2]>,
}

impl From<FilePoll> for PollOptions {
    fn from(f: FilePoll) -> Self {
        let d = PollOptions::default();
        PollOptions {
            offer_sqcq: f.sqcq.unwrap_or(d.offer_sqcq),
            ring: f.mode.unwrap_or(d.ring),
            cpus: f.cpus,
            stats_interval: f.stats_interval.map_or(d.stats_interval, interval),
            stats_file: f.stats_file,
            spin: f.spin_us.map_or(d.spin, |[min, max]| spin_config(min, max)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_overrides_file_options() {
        let file: FilePoll =
            toml::from_str("sqcq = true\nmode = \"ring\"\ncpus = [1]\nstats-interval = 5\n")
                .unwrap();
        let base = PollOptions::from(file);
        assert_eq!(base.ring, RingMode::Ring);
        assert_eq!(base.stats_interval, Some(Duration::from_secs(5)));
        let args = PollArgs {
            no_sqcq: true,
            poll_cpus: vec![0, 1],
            stats_interval: Some(0),
            ..PollArgs::default()
        };
        let o = args.apply(base);
        assert!(!o.offer_sqcq);
        assert_eq!(o.cpus, vec![0, 1]);
        assert_eq!(o.stats_interval, None, "0 turns statistics off");
        assert_eq!(o.ring, RingMode::Ring, "kept from the file");
        assert!(o.validate(1).is_err(), "two CPUs for one worker");
        o.validate(2).unwrap();
    }
}
