//! The poll options of the daemon ([`PollOptions`]: how queues are
//! served, the adaptive spin window's bounds, CPU binding and statistics)
//! from the command line (`PollArgs`) or a configuration file's `[poll]`
//! table (`FilePoll`).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqcq_protocol::{SpinConfig, SpinPolicy};

use crate::runtime::options::{PollOptions, RingMode, spin_config};

/// The command-line poll options of `sqcqd` (flattened into its `Cli`).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct PollArgs {
    /// Do not offer VIRTIO_F_SQCQ_POLL (feature bit 42): drivers then use
    /// classic notifications.
    #[arg(long)]
    pub no_sqcq: bool,
    /// Offer packed rings (VIRTIO_F_RING_PACKED), beside bit 42 (whose
    /// doorbells then follow the Device Area: spec section 10); their
    /// in-flight record is the vhost-user packed layout.
    #[arg(long)]
    pub packed: bool,
    /// How request queues without bit 42 are served: kick (classic), ring
    /// (poll the avail ring with notifications disabled), or auto (ring
    /// polling within a spin window bounded by the wakeup cost measured at
    /// start: busy queues are polled, idle or trickling ones kicked)
    /// [default: auto].
    #[arg(long, value_enum, value_name = "MODE")]
    pub poll: Option<RingMode>,
    /// Bind worker N to the Nth CPU of this list, e.g. 0,1.
    #[arg(long, value_delimiter = ',', value_name = "CPUS")]
    pub poll_cpus: Vec<usize>,
    /// Run the io-wq threads of file LUNs (buffered writes, fsync, and
    /// requests io_uring cannot complete inline) on these CPUs, e.g.
    /// housekeeping CPUs away from poll threads and vCPUs [default: where
    /// the scheduler wakes them, next to the worker that submitted].
    #[arg(long, value_delimiter = ',', value_name = "CPUS")]
    pub completion_cpus: Vec<usize>,
    /// Seconds between per-queue statistics (log lines and --stats-file);
    /// 0 turns them off [default: 10].
    #[arg(long, value_name = "SECS")]
    pub stats_interval: Option<u64>,
    /// Keep a JSON snapshot of every queue's statistics in this file
    /// (rewritten atomically every interval and when a frontend leaves).
    #[arg(long, value_name = "PATH")]
    pub stats_file: Option<PathBuf>,
    /// Bounds of the adaptive spin window in microseconds, MIN,MAX
    /// [default: 1,200; for ring-polled queues in --poll auto 1 to twice
    /// the measured wakeup cost].
    #[arg(long, value_name = "MIN,MAX", value_parser = parse_spin_us)]
    pub spin_us: Option<SpinConfig>,
    /// Seconds a queue stop (GET_VRING_BASE, a disconnect) waits for the
    /// requests in flight before it cancels them [default: 30].
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub stop_timeout: Option<u64>,
    /// At most N requests in flight per request queue: further ones stay
    /// on the ring, and with bit 42 the driver is asked to hold them back
    /// (THROTTLE) [default: the queue size].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub max_inflight: Option<u16>,
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
        if self.packed {
            base.offer_packed = true;
        }
        if let Some(m) = self.poll {
            base.ring = m;
        }
        if !self.poll_cpus.is_empty() {
            base.cpus = self.poll_cpus;
        }
        if !self.completion_cpus.is_empty() {
            base.completion_cpus = self.completion_cpus;
        }
        if let Some(s) = self.stats_interval {
            base.stats_interval = interval(s);
        }
        if self.stats_file.is_some() {
            base.stats_file = self.stats_file;
        }
        if self.spin_us.is_some() {
            base.spin = self.spin_us;
        }
        if let Some(s) = self.stop_timeout {
            base.stop_timeout = Duration::from_secs(s);
        }
        if self.max_inflight.is_some() {
            base.max_in_flight = self.max_inflight;
        }
        base
    }
}

fn interval(secs: u64) -> Option<Duration> {
    (secs > 0).then(|| Duration::from_secs(secs))
}

/// The `[poll]` table of a TOML configuration file (written back by
/// `config_save` with every value explicit).
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct FilePoll {
    #[serde(
        default,
        deserialize_with = "crate::spec::de_opt_bool",
        skip_serializing_if = "Option::is_none"
    )]
    sqcq: Option<bool>,
    #[serde(
        default,
        deserialize_with = "crate::spec::de_opt_bool",
        skip_serializing_if = "Option::is_none"
    )]
    packed: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mode: Option<RingMode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    cpus: Vec<usize>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    completion_cpus: Vec<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stats_interval: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stats_file: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    spin_us: Option<[u64; 2]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_timeout: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_inflight: Option<u16>,
}

impl From<&PollOptions> for FilePoll {
    /// The table that reads back as `o` (a stop time-out below a second,
    /// which only tests set, is written as one second).
    fn from(o: &PollOptions) -> Self {
        FilePoll {
            sqcq: Some(o.offer_sqcq),
            packed: Some(o.offer_packed),
            mode: Some(o.ring),
            cpus: o.cpus.clone(),
            completion_cpus: o.completion_cpus.clone(),
            stats_interval: Some(o.stats_interval.map_or(0, |d| d.as_secs())),
            stats_file: o.stats_file.clone(),
            spin_us: o.spin.map(|s| [s.min_ns / 1000, s.max_ns / 1000]),
            stop_timeout: Some(o.stop_timeout.as_secs().max(1)),
            max_inflight: o.max_in_flight,
        }
    }
}

impl From<FilePoll> for PollOptions {
    fn from(f: FilePoll) -> Self {
        let d = PollOptions::default();
        PollOptions {
            offer_sqcq: f.sqcq.unwrap_or(d.offer_sqcq),
            offer_packed: f.packed.unwrap_or(d.offer_packed),
            ring: f.mode.unwrap_or(d.ring),
            cpus: f.cpus,
            completion_cpus: f.completion_cpus,
            stats_interval: f.stats_interval.map_or(d.stats_interval, interval),
            stats_file: f.stats_file,
            spin: f.spin_us.map(|[min, max]| spin_config(min, max)),
            stop_timeout: f
                .stop_timeout
                .filter(|&s| s > 0)
                .map_or(d.stop_timeout, Duration::from_secs),
            max_in_flight: f.max_inflight.filter(|&n| n > 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_overrides_file_options() {
        let file: FilePoll = toml::from_str(
            "sqcq = true\nmode = \"ring\"\ncpus = [1]\ncompletion-cpus = [3]\nstats-interval = 5\nstop-timeout = 7\nmax-inflight = 8\n",
        )
        .unwrap();
        let base = PollOptions::from(file);
        assert_eq!(base.ring, RingMode::Ring);
        assert_eq!(base.stop_timeout, Duration::from_secs(7));
        assert_eq!(base.max_in_flight, Some(8));
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
        assert_eq!(o.max_in_flight, Some(8), "kept from the file");
        assert_eq!(o.completion_cpus, vec![3], "kept from the file");
        assert!(o.validate(1).is_err(), "two CPUs for one worker");
        o.validate(2).unwrap();
    }
}
