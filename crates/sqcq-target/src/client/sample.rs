//! What `sqcqd top` and `sqcqd rpc stats_get --human` read from a
//! daemon: a [`Sample`], the answers of `daemon_info`, `device_list`,
//! `stats_get` and `worker_list` to one JSON-RPC batch (one connection,
//! one round trip, one moment).
//!
//! The answers are read into types of this module, every field
//! defaulted, not into the daemon's own: a client newer than the daemon
//! it watches (a package upgraded, the daemon not restarted yet) shows
//! what it finds, and a figure the daemon does not give as missing.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use thiserror::Error;

/// One moment of a daemon, as its management API tells it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    /// `daemon_info`.
    pub daemon: DaemonInfo,
    /// `device_list`, by device number.
    pub devices: Vec<Device>,
    /// `stats_get`'s queues: every queue that ever ran, by device and
    /// virtqueue.
    pub queues: Vec<Queue>,
    /// `stats_get`'s error counters, by device number, then name.
    pub errors: BTreeMap<u32, BTreeMap<String, u64>>,
    /// `stats_get`'s event counters, by device number, then name.
    pub events: BTreeMap<u32, BTreeMap<String, u64>>,
    /// `worker_list`, by worker number.
    pub workers: Vec<Worker>,
}

/// `daemon_info`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct DaemonInfo {
    /// The daemon's version.
    pub version: String,
    /// Its process id.
    pub pid: u32,
}

/// A device of `device_list`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Device {
    /// Its number.
    pub id: u32,
    /// `scsi` or `blk`.
    #[serde(rename = "type")]
    pub device_type: String,
    /// Its vhost-user socket.
    pub socket_path: String,
    /// Whether a frontend is connected.
    pub connected: bool,
}

/// A queue of `stats_get`: counters since the daemon started, gauges as
/// they are.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Queue {
    /// Device number.
    pub device: u32,
    /// Virtqueue index.
    pub vq: u16,
    /// `kick`, `ring-poll` or `sqcq`, as it runs or last ran.
    pub mode: String,
    /// The worker serving it, or that last served it.
    pub worker: Option<usize>,
    /// Whether it runs now.
    pub running: bool,
    /// Whether it broke since it last started.
    pub broken: bool,
    /// Requests completed.
    pub completions: u64,
    /// Requests taken from the ring and not completed yet.
    pub in_flight: u64,
    /// Bytes read from the medium.
    pub read_bytes: u64,
    /// Bytes written to the medium.
    pub written_bytes: u64,
    /// The service-time histogram.
    pub latency: Latency,
    /// Batches published (stores of the used index).
    pub publishes: u64,
    /// Calls sent.
    pub calls: u64,
    /// Kicks received.
    pub kicks: u64,
    /// Requests resubmitted after a reconnect.
    pub resubmitted: u64,
    /// Times the queue reached its in-flight limit.
    pub limited: u64,
    /// Times it set THROTTLE in its SQ doorbell.
    pub throttled: u64,
    /// Polls that found nothing new.
    pub spins: u64,
    /// Times its poller slept.
    pub sleeps: u64,
}

impl Queue {
    /// Whether the device polls the queue (spins and sleeps mean
    /// something).
    pub fn polled(&self) -> bool {
        self.mode != "kick"
    }
}

/// A queue's service-time histogram (`crate::runtime::latency`):
/// requests per bucket, bucket `i` bounded by 2^i µs, the last one by
/// nothing.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Latency {
    /// Requests per bucket (not cumulative).
    pub buckets: Vec<u64>,
    /// Sum of the service times, ns.
    pub sum_ns: u64,
}

/// A worker of `worker_list`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Worker {
    /// Its number.
    pub id: usize,
    /// The CPU it is bound to.
    pub cpu: Option<usize>,
    /// Bound, but running off its CPU.
    pub cpu_displaced: bool,
    /// CPU time of its thread so far, ns (absent from daemons before
    /// `sqcqd top`).
    pub cpu_ns: Option<u64>,
    /// `[device, vq]` of every queue it serves.
    pub queues: Vec<(u32, u16)>,
}

/// Why no sample could be taken.
#[derive(Debug, Error)]
pub enum FetchError {
    /// The admin socket could not be reached, or did not answer (the
    /// daemon is not running, or went away).
    #[error("cannot reach the daemon")]
    Unreachable(#[source] std::io::Error),
    /// The daemon answered a call with an error (`stats_get` for a
    /// device that does not exist).
    #[error("{method}: {message}")]
    Refused {
        /// The method called.
        method: &'static str,
        /// The error's message.
        message: String,
    },
    /// An answer is not what this client reads.
    #[error("{method}: an answer this client cannot read")]
    Malformed {
        /// The method called.
        method: &'static str,
        /// What did not fit.
        #[source]
        source: serde_json::Error,
    },
}

/// The methods of a sample, in the order of the batch.
const METHODS: [&str; 4] = ["daemon_info", "device_list", "stats_get", "worker_list"];

impl Sample {
    /// Asks the daemon whose admin socket is `socket`, waiting at most
    /// `timeout`; `device`: only that device's queues and counters.
    pub fn fetch(
        socket: &Path,
        device: Option<u32>,
        timeout: Duration,
    ) -> Result<Sample, FetchError> {
        let mut stats = Map::new();
        if let Some(d) = device {
            stats.insert("device".into(), json!(d));
        }
        let calls: Vec<(&str, Map<String, Value>)> = METHODS
            .iter()
            .map(|&m| {
                (
                    m,
                    if m == "stats_get" {
                        stats.clone()
                    } else {
                        Map::new()
                    },
                )
            })
            .collect();
        let replies =
            crate::rpc::call_batch(socket, &calls, timeout).map_err(FetchError::Unreachable)?;
        let mut results = Vec::with_capacity(METHODS.len());
        for (method, reply) in METHODS.into_iter().zip(replies) {
            results.push(reply.map_err(|e| FetchError::Refused {
                method,
                message: e["message"].as_str().unwrap_or_default().to_owned(),
            })?);
        }
        let [daemon, devices, stats, workers] = <[Value; 4]>::try_from(results).unwrap_or_default();
        let mut sample = Sample::from_answers(daemon, devices, stats, workers)?;
        if let Some(d) = device {
            sample.devices.retain(|x| x.id == d);
        }
        Ok(sample)
    }

    /// The sample the four answers make (`daemon_info`, `device_list`,
    /// `stats_get`, `worker_list`).
    pub fn from_answers(
        daemon: Value,
        devices: Value,
        mut stats: Value,
        workers: Value,
    ) -> Result<Sample, FetchError> {
        let mut take = |key: &str| stats.get_mut(key).map(Value::take).unwrap_or_default();
        let (queues, errors, events) = (take("queues"), take("errors"), take("events"));
        Ok(Sample {
            daemon: read("daemon_info", daemon)?,
            devices: read("device_list", devices)?,
            queues: read("stats_get", queues)?,
            errors: read("stats_get", errors)?,
            events: read("stats_get", events)?,
            workers: read("worker_list", workers)?,
        })
    }

    /// The queues of device `id`.
    pub fn queues_of(&self, id: u32) -> impl Iterator<Item = &Queue> {
        self.queues.iter().filter(move |q| q.device == id)
    }
}

/// `value` as a `T`; `null` (a part missing from the answer) as its
/// default.
fn read<T: DeserializeOwned + Default>(
    method: &'static str,
    value: Value,
) -> Result<T, FetchError> {
    if value.is_null() {
        return Ok(T::default());
    }
    serde_json::from_value(value).map_err(|source| FetchError::Malformed { method, source })
}

/// Answers recorded from a daemon (a SCSI device with two request
/// queues, virtqueues 2 and 3, and a blk device that never ran; two
/// workers), for the tests of the renderers; `completions`, `kicks` and
/// `cpu` scale what they say.
#[cfg(test)]
pub(crate) mod recorded {
    use serde_json::{Value, json};

    use super::Sample;

    /// A queue of `stats_get` with `n` requests completed (read 4 KiB
    /// each, half of them in 8-16 µs and half in 128-256 µs), `kicks`
    /// kicks and as many calls.
    pub(crate) fn queue(vq: u16, mode: &str, worker: usize, n: u64, kicks: u64) -> Value {
        let mut buckets = vec![0u64; 24];
        buckets[4] = n / 2;
        buckets[8] = n - n / 2;
        json!({
            "device": 0, "vq": vq, "mode": mode, "worker": worker,
            "running": true, "broken": false, "completions": n, "in_flight": 3,
            "read_bytes": n * 4096, "written_bytes": 0,
            "latency": { "buckets": buckets, "sum_ns": n / 2 * 12_000 + (n - n / 2) * 200_000 },
            "publishes": n / 4, "calls": kicks, "kicks": kicks,
            "resubmitted": 0, "limited": 0, "throttled": 0,
            "spins": if mode == "kick" { 0 } else { n * 10 },
            "sleeps": if mode == "kick" { 0 } else { kicks },
            "ema_lat_ns": 7000, "interval_ns": 7000,
            "sq_need_wakeup": null, "cq_need_wakeup": null
        })
    }

    /// The daemon after `n2` requests on virtqueue 2 (sqcq) and `n3` on
    /// virtqueue 3 (kick, a kick and a call each), its workers having
    /// used `cpu0` and `cpu1` ns.
    pub(crate) fn sample(n2: u64, n3: u64, cpu0: u64, cpu1: u64) -> Sample {
        Sample::from_answers(
            json!({ "version": "0.1.0", "pid": 4242, "devices": 2, "workers": 2 }),
            json!([
                { "id": 0, "type": "scsi", "socket_path": "/run/sqcq/vm1.sock",
                  "connected": true, "num_queues": 2, "queue_size": 1024, "luns": [],
                  "queues": [ { "rq": 0, "vq": 2, "assigned_worker": 0, "worker": 0 },
                              { "rq": 1, "vq": 3, "assigned_worker": 1, "worker": 1 } ] },
                { "id": 1, "type": "blk", "socket_path": "/run/sqcq/vm2.sock",
                  "connected": false, "num_queues": 1, "queue_size": 256, "luns": [],
                  "queues": [] }
            ]),
            json!({
                "queues": [queue(2, "sqcq", 0, n2, n2 / 100), queue(3, "kick", 1, n3, n3)],
                "errors": { "0": { "io_errors": 3, "bad_lun": 0 }, "1": { "io_errors": 0 } },
                "events": { "0": { "other_targets": 255, "calls_coalesced": 0 }, "1": {} }
            }),
            json!([
                { "id": 0, "cpu": null, "cpu_displaced": false, "cpu_displacements": 0,
                  "cpu_ns": cpu0, "queues": [[0, 2]] },
                { "id": 1, "cpu": 1, "cpu_displaced": false, "cpu_displacements": 0,
                  "cpu_ns": cpu1, "queues": [[0, 3]] }
            ]),
        )
        .unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_and_missing_figures_default() {
        let s = recorded::sample(1000, 500, 7, 9);
        assert_eq!((s.daemon.version.as_str(), s.daemon.pid), ("0.1.0", 4242));
        assert_eq!(s.devices.len(), 2);
        assert_eq!(s.devices[1].device_type, "blk");
        assert_eq!(s.queues_of(0).count(), 2);
        assert_eq!(s.queues[1].kicks, 500);
        assert_eq!(s.errors[&0]["io_errors"], 3);
        assert_eq!(s.workers[1].cpu, Some(1));
        assert_eq!(s.workers[0].queues, [(0, 2)]);
        // A daemon that knows no cpu_ns, and a queue with fewer fields.
        let old = Sample::from_answers(
            json!({ "version": "0.0.9" }),
            json!([]),
            json!({ "queues": [ { "device": 0, "vq": 2, "mode": "kick", "completions": 5 } ] }),
            json!([ { "id": 0, "cpu": null, "queues": [] } ]),
        )
        .unwrap();
        assert_eq!(old.workers[0].cpu_ns, None);
        assert_eq!(old.queues[0].completions, 5);
        assert!(old.errors.is_empty());
        let bad = Sample::from_answers(json!({}), json!({ "not": "a list" }), json!({}), json!([]));
        assert!(
            matches!(
                bad,
                Err(FetchError::Malformed {
                    method: "device_list",
                    ..
                })
            ),
            "{bad:?}"
        );
    }
}
