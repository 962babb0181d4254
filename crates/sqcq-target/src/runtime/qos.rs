//! Quality of service: an IOPS and a bandwidth limit per device, what
//! SPDK's `bdev_set_qos_limit` and QEMU's throttle groups give, so that
//! one VM cannot take a shared worker (or a shared backstore) from the
//! others.
//!
//! Each limit is a GCRA (generic cell rate algorithm, the virtual
//! scheduling form of a token bucket): a "theoretical arrival time" that
//! every request moves on by its cost (1 / IOPS, or its bytes / bandwidth)
//! and that may run ahead of the clock by at most the burst allowance. A
//! queue takes the next request from its ring only while both times are
//! within the allowance; otherwise the request stays on the ring (as at
//! the in-flight limit, `runtime::queue::limit`), the worker sleeps until
//! the limit lets it through, and the driver sees no error, only time.
//! One atomic word per limit is shared by every queue of the device,
//! whichever workers run them: a charge is one `fetch_update` on it, made
//! only when a limit is set. Without a limit a queue reads one flag.
//!
//! Every atomic here is Relaxed: none publishes other memory, each word is
//! read on its own, and a queue that sees a limit (or `quiesced`) one pass
//! late takes one request more or fewer. What must be ordered, a
//! quiesce against the requests it waits for, is ordered by the workers'
//! drain command (`Registry::quiesce`), not by these words.
//!
//! A request's bytes are those of its buffers (the data, and the few
//! bytes of header and status around it): known once the chain is
//! walked, charged then, so a large request may take the limit over by
//! its own size, which the next ones wait for.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The burst allowance when none is given: 100 ms of the limit.
pub const DEFAULT_BURST_MS: u64 = 100;

/// A device's limits, as the configuration file, `device_create` and
/// `device_set_qos` give them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct QosLimits {
    /// Requests per second (none: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops: Option<u64>,
    /// Bytes per second (none: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bps: Option<u64>,
    /// How far ahead of the limit a burst may go, in milliseconds of it
    /// (default [`DEFAULT_BURST_MS`]).
    #[serde(default, alias = "burst_ms", skip_serializing_if = "Option::is_none")]
    pub burst_ms: Option<u64>,
}

impl QosLimits {
    /// No limit is set.
    pub fn is_off(&self) -> bool {
        self.iops.is_none_or(|n| n == 0) && self.bps.is_none_or(|n| n == 0)
    }

    /// A limit of 0 is no limit; a burst without a limit is dropped.
    pub fn normalized(self) -> Self {
        let iops = self.iops.filter(|n| *n > 0);
        let bps = self.bps.filter(|n| *n > 0);
        let burst_ms = self.burst_ms.filter(|_| iops.is_some() || bps.is_some());
        QosLimits {
            iops,
            bps,
            burst_ms,
        }
    }

    fn burst_ns(&self) -> u64 {
        self.burst_ms
            .unwrap_or(DEFAULT_BURST_MS)
            .saturating_mul(1_000_000)
    }
}

/// One limit's clock.
#[derive(Debug, Default)]
struct Gcra {
    /// Nanoseconds of the pass clock one unit costs, times 2^16 (a byte
    /// at 10 GB/s costs 0.1 ns); 0: no limit.
    cost_q16: AtomicU64,
    /// The theoretical arrival time of the next request (pass clock ns).
    tat: AtomicU64,
}

impl Gcra {
    fn set(&self, per_second: Option<u64>) {
        let cost = per_second.map_or(0, |n| {
            u64::try_from((1_000_000_000u128 << 16) / u128::from(n.max(1))).unwrap_or(u64::MAX)
        });
        self.cost_q16.store(cost, Ordering::Relaxed);
    }

    /// How long from `now` until a request may go (0: now).
    fn wait(&self, now: u64, burst: u64) -> u64 {
        if self.cost_q16.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        self.tat
            .load(Ordering::Relaxed)
            .saturating_sub(now.saturating_add(burst))
    }

    /// `units` went at `now`.
    fn charge(&self, now: u64, units: u64) {
        let cost = self.cost_q16.load(Ordering::Relaxed);
        if cost == 0 {
            return;
        }
        let ns = u64::try_from((u128::from(cost) * u128::from(units)) >> 16).unwrap_or(u64::MAX);
        let _ = self
            .tat
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tat| {
                Some(tat.max(now).saturating_add(ns))
            });
    }
}

/// How often a queue held by a quiesced device looks again (a resume
/// reaches it within this).
pub const QUIESCED_RECHECK: Duration = Duration::from_millis(5);

/// A device's limits at run time, shared by its queues.
#[derive(Debug, Default)]
pub struct Qos {
    /// A limit is set, or the device is quiesced: the only thing a queue
    /// reads without either.
    on: AtomicBool,
    /// Quiesced (`device_quiesce`): no request is taken at all.
    quiesced: AtomicBool,
    burst_ns: AtomicU64,
    ops: Gcra,
    bytes: Gcra,
    /// The limits as given (what `device_list` shows).
    limits: Mutex<QosLimits>,
}

impl Qos {
    /// Limits `limits` from now on (a request already taken keeps its
    /// place).
    pub fn set(&self, limits: QosLimits) {
        let limits = limits.normalized();
        self.ops.set(limits.iops);
        self.bytes.set(limits.bps);
        self.burst_ns.store(limits.burst_ns(), Ordering::Relaxed);
        let mut held = self.limits.lock().unwrap_or_else(PoisonError::into_inner);
        *held = limits;
        self.on.store(
            !limits.is_off() || self.quiesced.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
    }

    /// Takes no request from now on (`true`: requests taken already go
    /// on to complete), or takes them again.
    pub fn set_quiesced(&self, quiesced: bool) {
        // Under the lock of the limits, as `set`: `on` stays their sum.
        let limits = self.limits.lock().unwrap_or_else(PoisonError::into_inner);
        self.quiesced.store(quiesced, Ordering::Relaxed);
        self.on
            .store(quiesced || !limits.is_off(), Ordering::Relaxed);
    }

    /// Whether the device is quiesced.
    pub fn quiesced(&self) -> bool {
        self.quiesced.load(Ordering::Relaxed)
    }

    /// The limits in force.
    pub fn limits(&self) -> QosLimits {
        *self.limits.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a limit is set.
    #[inline]
    pub fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// How long from `now` (pass clock ns) until the next request may be
    /// taken; `None`: now.
    #[inline]
    pub fn wait(&self, now: u64) -> Option<Duration> {
        if !self.on() {
            return None;
        }
        if self.quiesced() {
            return Some(QUIESCED_RECHECK);
        }
        let burst = self.burst_ns.load(Ordering::Relaxed);
        let ns = self.ops.wait(now, burst).max(self.bytes.wait(now, burst));
        (ns > 0).then(|| Duration::from_nanos(ns))
    }

    /// A request of `bytes` was taken at `now`.
    #[inline]
    pub fn charge(&self, now: u64, bytes: u64) {
        if self.on() {
            self.ops.charge(now, 1);
            self.bytes.charge(now, bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Requests taken over `ms` of a simulated clock when a queue takes
    /// one whenever the limit lets it, each of `bytes`.
    fn taken(qos: &Qos, start: u64, ms: u64, bytes: u64) -> u64 {
        let (mut now, end, mut n) = (start, start + ms * MS, 0);
        while now < end {
            match qos.wait(now) {
                None => {
                    qos.charge(now, bytes);
                    n += 1;
                }
                Some(d) => now += u64::try_from(d.as_nanos()).unwrap(),
            }
        }
        n
    }

    #[test]
    fn an_iops_limit_holds_after_its_burst() {
        let qos = Qos::default();
        qos.set(QosLimits {
            iops: Some(1000),
            bps: None,
            burst_ms: Some(10),
        });
        let start = 5_000 * MS;
        // 10 ms of burst (10 requests) at once, then 1 per ms.
        assert_eq!(taken(&qos, start, 1, 4096), 11);
        let n = taken(&qos, start + MS, 1000, 4096);
        assert!((999..=1001).contains(&n), "{n} in a second at 1000 IOPS");
    }

    #[test]
    fn a_bandwidth_limit_counts_bytes() {
        let qos = Qos::default();
        qos.set(QosLimits {
            iops: None,
            bps: Some(100 << 20),
            burst_ms: Some(1),
        });
        // 100 MiB/s in 64 KiB requests: 1600 a second.
        let n = taken(&qos, 1_000 * MS, 1000, 64 << 10);
        assert!((1599..=1603).contains(&n), "{n}");
        // The tighter of two limits holds.
        qos.set(QosLimits {
            iops: Some(500),
            bps: Some(100 << 20),
            burst_ms: Some(1),
        });
        let n = taken(&qos, 10_000 * MS, 1000, 64 << 10);
        assert!((499..=502).contains(&n), "{n}");
    }

    #[test]
    fn off_is_off_and_zero_is_no_limit() {
        let qos = Qos::default();
        assert!(!qos.on());
        assert_eq!(qos.wait(0), None);
        qos.set(QosLimits {
            iops: Some(0),
            bps: None,
            burst_ms: Some(5),
        });
        assert!(!qos.on());
        assert_eq!(qos.limits(), QosLimits::default());
        for _ in 0..100_000 {
            qos.charge(0, 1 << 20);
        }
        assert_eq!(qos.wait(0), None);
    }

    #[test]
    fn a_quiesced_device_takes_nothing_until_resumed() {
        let qos = Qos::default();
        qos.set_quiesced(true);
        assert_eq!(qos.wait(0), Some(QUIESCED_RECHECK));
        // A limit set meanwhile does not resume it.
        qos.set(QosLimits {
            iops: Some(10),
            bps: None,
            burst_ms: None,
        });
        assert_eq!(qos.wait(0), Some(QUIESCED_RECHECK));
        qos.set_quiesced(false);
        assert_eq!(qos.wait(0), None, "the limit lets the first one go");
        qos.set(QosLimits::default());
        assert!(!qos.on());
    }

    #[test]
    fn limits_read_from_toml_and_json() {
        let l: QosLimits = toml::from_str("iops = 5000\nburst-ms = 20").unwrap();
        assert_eq!((l.iops, l.bps, l.burst_ms), (Some(5000), None, Some(20)));
        let l: QosLimits = serde_json::from_str(r#"{"bps": 1048576, "burst_ms": 3}"#).unwrap();
        assert_eq!((l.bps, l.burst_ms), (Some(1 << 20), Some(3)));
        assert!(toml::from_str::<QosLimits>("iopz = 1").is_err());
    }
}
