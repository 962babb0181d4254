//! What a scrape shows: the daemon's figures at that moment ([`Scrape`],
//! gathered from the devices and the statistics board) rendered as the
//! `sqcq_*` metric families. `docs/target.md`, "Metrics", lists them.
//!
//! Series are labelled `device` (number) and `name` (socket path), `vq`
//! for a virtqueue, `lun`, `worker`. A queue's counters do not carry its
//! worker: a queue moved to another worker keeps its series (and its
//! `rate()`); `sqcq_queue_info` says which worker serves it. Device totals
//! are sums over the queues (`sum by (device)`), not series of their own.

use std::fmt::Display;
use std::time::Duration;

use crate::manage::{DeviceControl, DeviceKind};
use crate::prometheus::text::{Kind, Labels, family, sample, seconds};
use crate::runtime::latency::upper_bound_us;
use crate::runtime::lun_stats::{KIND_NAMES, KindFigures, LunIo};
use crate::runtime::metrics::{QueueMode, QueueSnapshot, WorkerSnapshot};
use crate::runtime::pass::nanos;
use crate::runtime::worker::WorkerPool;

/// One logical unit (for a blk device: its disk, LUN 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LunFigures {
    /// The LUN.
    pub lun: u16,
    /// Capacity in logical blocks.
    pub blocks: u64,
    /// Logical block size in bytes.
    pub block_size: u32,
    /// Its I/O, by kind of operation.
    pub io: LunIo,
}

/// One device's figures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceFigures {
    /// Device number.
    pub id: u32,
    /// Its name (the socket path).
    pub name: String,
    /// `scsi` or `blk`.
    pub device_type: &'static str,
    /// Its logical units.
    pub luns: Vec<LunFigures>,
    /// Every queue that ever ran.
    pub queues: Vec<QueueSnapshot>,
    /// Error counters by class.
    pub errors: Vec<(&'static str, u64)>,
    /// Counters of normal events by name (`DeviceMetrics::events`).
    pub events: Vec<(&'static str, u64)>,
}

impl DeviceFigures {
    /// The figures of a running device.
    pub fn of(device: &DeviceControl) -> Self {
        let (device_type, luns) = match &device.kind {
            DeviceKind::Scsi(scsi) => {
                let target = scsi.target.current();
                let luns = target
                    .luns()
                    .iter()
                    .map(|e| LunFigures {
                        lun: e.lun,
                        blocks: e.unit.blocks(),
                        block_size: e.unit.block_size(),
                        io: e.stats.snapshot(),
                    })
                    .collect();
                ("scsi", luns)
            }
            DeviceKind::Blk(blk) => {
                let block_size = blk.block_size();
                let blocks = blk.capacity_bytes() / u64::from(block_size.max(1));
                let disk = LunFigures {
                    lun: 0,
                    blocks,
                    block_size,
                    io: blk.stats().snapshot(),
                };
                ("blk", vec![disk])
            }
        };
        let metrics = &device.info.metrics;
        DeviceFigures {
            id: device.info.id,
            name: device.info.name.clone(),
            device_type,
            luns,
            queues: metrics.queues().collect(),
            errors: metrics.errors().to_vec(),
            events: metrics.events().to_vec(),
        }
    }

    fn labels(&self) -> Labels {
        Labels::default()
            .with("device", self.id)
            .with("name", &self.name)
    }
}

/// Everything one scrape shows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scrape {
    /// The devices, by number.
    pub devices: Vec<DeviceFigures>,
    /// The running workers, by number.
    pub workers: Vec<WorkerSnapshot>,
    /// What waking a worker costs, as measured at start (`--poll auto`).
    pub wakeup_cost: Option<Duration>,
}

/// A per-LUN family: name, help, the figure of one kind of operation.
type LunFamily = (&'static str, &'static str, fn(&KindFigures) -> Value);

/// A sample value: counts stay integers.
enum Value {
    Int(u64),
    Float(f64),
}

impl Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Int(v) => v.fmt(f),
            Value::Float(v) => v.fmt(f),
        }
    }
}

/// A family with one sample per queue (`None`: no sample for that one).
struct QueueFamily {
    name: &'static str,
    kind: Kind,
    help: &'static str,
    value: fn(&QueueSnapshot) -> Option<Value>,
}

fn count(v: u64) -> Option<Value> {
    Some(Value::Int(v))
}

fn flag(v: bool) -> Option<Value> {
    Some(Value::Int(u64::from(v)))
}

fn polled_seconds(q: &QueueSnapshot, ns: u64) -> Option<Value> {
    (q.mode != QueueMode::Kick).then(|| Value::Float(seconds(ns)))
}

const QUEUE_FAMILIES: &[QueueFamily] = &[
    QueueFamily {
        name: "sqcq_queue_requests_total",
        kind: Kind::Counter,
        help: "Requests completed (used elements published); IOPS is its rate().",
        value: |q| count(q.completions),
    },
    QueueFamily {
        name: "sqcq_queue_read_bytes_total",
        kind: Kind::Counter,
        help: "Bytes read from the medium by requests that succeeded (SCSI READ, virtio-blk IN).",
        value: |q| count(q.read_bytes),
    },
    QueueFamily {
        name: "sqcq_queue_written_bytes_total",
        kind: Kind::Counter,
        help: "Bytes written to the medium by requests that succeeded (SCSI WRITE, virtio-blk OUT).",
        value: |q| count(q.written_bytes),
    },
    QueueFamily {
        name: "sqcq_queue_in_flight",
        kind: Kind::Gauge,
        help: "Requests taken from the ring and not completed yet.",
        value: |q| count(u64::from(q.in_flight)),
    },
    QueueFamily {
        name: "sqcq_queue_used_publishes_total",
        kind: Kind::Counter,
        help: "Stores of the used index: batches of completions published.",
        value: |q| count(q.publishes),
    },
    QueueFamily {
        name: "sqcq_queue_kicks_total",
        kind: Kind::Counter,
        help: "Kicks received from the driver (eventfd count).",
        value: |q| count(q.kicks),
    },
    QueueFamily {
        name: "sqcq_queue_calls_total",
        kind: Kind::Counter,
        help: "Calls (interrupts) sent to the driver; the RFC's wakeups.",
        value: |q| count(q.calls),
    },
    QueueFamily {
        name: "sqcq_queue_spins_total",
        kind: Kind::Counter,
        help: "Polls of a polled queue that found nothing new.",
        value: |q| count(q.spins),
    },
    QueueFamily {
        name: "sqcq_queue_sleeps_total",
        kind: Kind::Counter,
        help: "Times the device's poller slept with NEED_WAKEUP set (or notifications enabled).",
        value: |q| count(q.sleeps),
    },
    QueueFamily {
        name: "sqcq_queue_resubmitted_total",
        kind: Kind::Counter,
        help: "Requests of an earlier run handed to the device again after a reconnect.",
        value: |q| count(q.resubmitted),
    },
    QueueFamily {
        name: "sqcq_queue_limited_total",
        kind: Kind::Counter,
        help: "Times the queue reached its in-flight limit and left requests on its ring.",
        value: |q| count(q.limited),
    },
    QueueFamily {
        name: "sqcq_queue_throttled_total",
        kind: Kind::Counter,
        help: "Times the queue set THROTTLE in its SQ doorbell (asked the driver to hold requests back).",
        value: |q| count(q.throttled),
    },
    QueueFamily {
        name: "sqcq_queue_running",
        kind: Kind::Gauge,
        help: "1 while the queue is served.",
        value: |q| flag(q.running),
    },
    QueueFamily {
        name: "sqcq_queue_broken",
        kind: Kind::Gauge,
        help: "1 if the queue broke (corrupt ring, nonsense doorbell) since it last started.",
        value: |q| flag(q.broken),
    },
    QueueFamily {
        name: "sqcq_queue_submission_gap_seconds",
        kind: Kind::Gauge,
        help: "Moving average of the gaps between submissions (the RFC's ema_lat), polled queues.",
        value: |q| polled_seconds(q, q.ema_lat_ns),
    },
    QueueFamily {
        name: "sqcq_queue_spin_window_seconds",
        kind: Kind::Gauge,
        help: "How long the device's poller spins before it sleeps (the RFC's interval), polled queues.",
        value: |q| polled_seconds(q, q.interval_ns),
    },
];

const MODES: [QueueMode; 3] = [QueueMode::Kick, QueueMode::RingPoll, QueueMode::Sqcq];

impl Scrape {
    /// The figures of `devices` and of the workers of `pool`, now.
    pub fn collect(devices: &[DeviceControl], pool: &WorkerPool) -> Self {
        let devices: Vec<_> = devices.iter().map(DeviceFigures::of).collect();
        let queues: Vec<_> = devices.iter().flat_map(|d| d.queues.clone()).collect();
        Scrape {
            workers: pool.stats().workers(&queues),
            devices,
            wakeup_cost: pool.wakeup_cost(),
        }
    }

    /// Appends the exposition to `out`.
    pub fn render(&self, out: &mut String) {
        let queues = || {
            self.devices.iter().flat_map(|d| {
                let labels = d.labels();
                d.queues.iter().map(move |q| (labels.with("vq", q.vq), q))
            })
        };
        for f in QUEUE_FAMILIES {
            family(out, f.name, f.kind, f.help);
            for (labels, q) in queues() {
                if let Some(v) = (f.value)(q) {
                    sample(out, f.name, &labels, v);
                }
            }
        }
        latency(out, queues());
        family(
            out,
            "sqcq_queue_mode",
            Kind::Gauge,
            "How the queue learns of requests (1 for its mode): kick, ring-poll, sqcq (doorbells).",
        );
        for (labels, q) in queues() {
            for m in MODES {
                let on = u64::from(q.mode == m);
                sample(out, "sqcq_queue_mode", &labels.with("mode", m), on);
            }
        }
        family(
            out,
            "sqcq_queue_need_wakeup",
            Kind::Gauge,
            "NEED_WAKEUP as last read in the SQ doorbell (device poller asleep) and CQ doorbell (driver poller asleep).",
        );
        for (labels, q) in queues() {
            for (side, v) in [("sq", q.sq_need_wakeup), ("cq", q.cq_need_wakeup)] {
                if let Some(v) = v {
                    let name = "sqcq_queue_need_wakeup";
                    sample(out, name, &labels.with("side", side), u64::from(v));
                }
            }
        }
        family(
            out,
            "sqcq_queue_info",
            Kind::Gauge,
            "1, with the worker serving the queue (or that last served it) as a label.",
        );
        for (labels, q) in queues() {
            if let Some(w) = q.worker {
                sample(out, "sqcq_queue_info", &labels.with("worker", w), 1);
            }
        }
        self.render_devices(out);
        self.render_workers(out);
        if let Some(cost) = self.wakeup_cost {
            const NAME: &str = "sqcq_wakeup_cost_seconds";
            family(
                out,
                NAME,
                Kind::Gauge,
                "What waking a sleeping worker costs here, measured at start: busy polled queues spin at least this, ring-polled ones in --poll auto at most twice this.",
            );
            sample(out, NAME, &Labels::default(), seconds(nanos(cost)));
        }
    }

    fn render_devices(&self, out: &mut String) {
        family(
            out,
            "sqcq_device_info",
            Kind::Gauge,
            "1, with the device type as a label.",
        );
        for d in &self.devices {
            sample(
                out,
                "sqcq_device_info",
                &d.labels().with("type", d.device_type),
                1,
            );
        }
        family(
            out,
            "sqcq_device_errors_total",
            Kind::Counter,
            "Guest and frontend errors and queue failures, by class.",
        );
        for d in &self.devices {
            let labels = d.labels();
            for (class, n) in &d.errors {
                let l = labels.with("class", class);
                sample(out, "sqcq_device_errors_total", &l, n);
            }
        }
        family(
            out,
            "sqcq_device_events_total",
            Kind::Counter,
            "Normal events a device answered, by name: nothing wrong.",
        );
        for d in &self.devices {
            let labels = d.labels();
            for (name, n) in &d.events {
                let l = labels.with("name", name);
                sample(out, "sqcq_device_events_total", &l, n);
            }
        }
        let luns = || {
            self.devices
                .iter()
                .flat_map(|d| d.luns.iter().map(|l| (d.labels().with("lun", l.lun), l)))
        };
        family(
            out,
            "sqcq_lun_capacity_bytes",
            Kind::Gauge,
            "Capacity of the logical unit (a blk device's disk is LUN 0).",
        );
        for (labels, l) in luns() {
            let bytes = l.blocks.saturating_mul(u64::from(l.block_size));
            sample(out, "sqcq_lun_capacity_bytes", &labels, bytes);
        }
        family(
            out,
            "sqcq_lun_block_size_bytes",
            Kind::Gauge,
            "Logical block size of the logical unit.",
        );
        for (labels, l) in luns() {
            sample(out, "sqcq_lun_block_size_bytes", &labels, l.block_size);
        }
        let io: [LunFamily; 4] = [
            (
                "sqcq_lun_ops_total",
                "Operations the logical unit completed (failed ones included), by kind.",
                |f| Value::Int(f.ops),
            ),
            (
                "sqcq_lun_bytes_total",
                "Bytes the logical unit's operations that succeeded covered, by kind.",
                |f| Value::Int(f.bytes),
            ),
            (
                "sqcq_lun_errors_total",
                "Operations of the logical unit the backstore failed, by kind.",
                |f| Value::Int(f.errors),
            ),
            (
                "sqcq_lun_time_seconds_total",
                "Service times of the logical unit's operations added up, by kind \
                 (rate over the rate of sqcq_lun_ops_total: the mean latency).",
                |f| Value::Float(seconds(f.time_ns)),
            ),
        ];
        for (name, help, get) in io {
            family(out, name, Kind::Counter, help);
            for (labels, l) in luns() {
                for ((_, op), f) in KIND_NAMES.iter().zip(&l.io.kinds) {
                    sample(out, name, &labels.with("op", op), get(f));
                }
            }
        }
    }

    fn render_workers(&self, out: &mut String) {
        let label = |w: &WorkerSnapshot| Labels::default().with("worker", w.worker);
        family(
            out,
            "sqcq_worker_queues",
            Kind::Gauge,
            "Request queues the worker serves.",
        );
        for w in &self.workers {
            sample(out, "sqcq_worker_queues", &label(w), w.queues);
        }
        family(
            out,
            "sqcq_worker_wakeups_total",
            Kind::Counter,
            "Times the worker's loop woke from epoll_wait (events, timeouts, poll turns).",
        );
        for w in &self.workers {
            sample(out, "sqcq_worker_wakeups_total", &label(w), w.wakeups);
        }
        type Figure = fn(&WorkerSnapshot) -> u64;
        let yields: [(&str, &str, Figure); 4] = [
            (
                "sqcq_worker_yields_total",
                "sched_yield calls of the worker's poll loop.",
                |w| w.yields,
            ),
            (
                "sqcq_worker_contested_yields_total",
                "Of those, the ones that ran another thread.",
                |w| w.contested_yields,
            ),
            (
                "sqcq_worker_long_yields_total",
                "Of those, the ones that lost the CPU for a time slice (0.5 ms or more): a thread that never yields shares the worker's CPU.",
                |w| w.long_yields,
            ),
            (
                "sqcq_worker_handover_sleeps_total",
                "20 us sleeps of the poll loop after yields that came back at once, beside such a thread.",
                |w| w.handover_sleeps,
            ),
        ];
        for (name, help, value) in yields {
            family(out, name, Kind::Counter, help);
            for w in &self.workers {
                sample(out, name, &label(w), value(w));
            }
        }
        family(
            out,
            "sqcq_worker_cpu_displaced",
            Kind::Gauge,
            "1 while a worker bound to a CPU (--poll-cpus) runs off it: the CPU went offline or left the daemon's cpuset.",
        );
        for w in &self.workers {
            sample(
                out,
                "sqcq_worker_cpu_displaced",
                &label(w),
                u64::from(w.cpu_displaced),
            );
        }
        family(
            out,
            "sqcq_worker_cpu_displacements_total",
            Kind::Counter,
            "Times a worker bound to a CPU was found moved off it.",
        );
        for w in &self.workers {
            sample(
                out,
                "sqcq_worker_cpu_displacements_total",
                &label(w),
                w.cpu_displacements,
            );
        }
        family(
            out,
            "sqcq_worker_cpu_seconds_total",
            Kind::Counter,
            "CPU time of the worker thread (user and system).",
        );
        for w in &self.workers {
            if let Some(ns) = w.cpu_ns {
                sample(out, "sqcq_worker_cpu_seconds_total", &label(w), seconds(ns));
            }
        }
    }
}

/// The service-time histogram of every queue.
fn latency<'a>(out: &mut String, queues: impl Iterator<Item = (Labels, &'a QueueSnapshot)>) {
    const NAME: &str = "sqcq_queue_latency_seconds";
    family(
        out,
        NAME,
        Kind::Histogram,
        "Service time in the daemon, from the worker pass that took a request to the one that completed it.",
    );
    for (labels, q) in queues {
        const BUCKET: &str = "sqcq_queue_latency_seconds_bucket";
        let mut cumulative = 0u64;
        for (i, n) in q.latency.buckets.iter().enumerate() {
            cumulative = cumulative.wrapping_add(*n);
            match upper_bound_us(i) {
                Some(us) => sample(
                    out,
                    BUCKET,
                    &labels.with("le", seconds(us * 1000)),
                    cumulative,
                ),
                None => sample(out, BUCKET, &labels.with("le", "+Inf"), cumulative),
            }
        }
        let total = q.latency.count();
        let sum = seconds(q.latency.sum_ns);
        sample(out, "sqcq_queue_latency_seconds_sum", &labels, sum);
        sample(out, "sqcq_queue_latency_seconds_count", &labels, total);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::latency::LatencySnapshot;

    fn queue(vq: u16, mode: QueueMode) -> QueueSnapshot {
        let mut latency = LatencySnapshot::default();
        latency.buckets[0] = 3;
        latency.buckets[2] = 1;
        latency.sum_ns = 3_500;
        QueueSnapshot {
            device: 1,
            vq,
            mode,
            worker: Some(0),
            running: true,
            broken: false,
            completions: 4,
            in_flight: 2,
            read_bytes: 8192,
            written_bytes: 0,
            latency,
            publishes: 3,
            calls: 3,
            kicks: 1,
            resubmitted: 0,
            limited: 0,
            throttled: 0,
            spins: 9,
            sleeps: 1,
            ema_lat_ns: 1500,
            interval_ns: 20_000,
            sq_need_wakeup: (mode == QueueMode::Sqcq).then_some(true),
            cq_need_wakeup: (mode == QueueMode::Sqcq).then_some(false),
        }
    }

    fn scrape() -> Scrape {
        Scrape {
            devices: vec![DeviceFigures {
                id: 1,
                name: "/run/a \"b\".sock".into(),
                device_type: "scsi",
                luns: vec![LunFigures {
                    lun: 3,
                    blocks: 2048,
                    block_size: 512,
                    io: {
                        let mut io = LunIo::default();
                        io.kinds[1] = KindFigures {
                            ops: 6,
                            bytes: 24576,
                            errors: 1,
                            time_ns: 1_500_000,
                        };
                        io
                    },
                }],
                queues: vec![queue(2, QueueMode::Kick), queue(3, QueueMode::Sqcq)],
                errors: vec![("bad_lun", 5), ("io_errors", 0)],
                events: vec![("other_targets", 510)],
            }],
            workers: vec![WorkerSnapshot {
                worker: 0,
                queues: 2,
                wakeups: 10,
                yields: 7,
                contested_yields: 5,
                long_yields: 3,
                handover_sleeps: 2,
                cpu_displaced: true,
                cpu_displacements: 4,
                cpu_ns: Some(2_500_000_000),
            }],
            wakeup_cost: Some(Duration::from_micros(25)),
        }
    }

    fn lines(out: &str, prefix: &str) -> Vec<String> {
        out.lines()
            .filter(|l| l.starts_with(prefix))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn queues_devices_and_workers_are_rendered() {
        let mut out = String::new();
        scrape().render(&mut out);
        let dev = r#"device="1",name="/run/a \"b\".sock""#;
        for want in [
            format!("sqcq_queue_requests_total{{{dev},vq=\"2\"}} 4"),
            format!("sqcq_queue_read_bytes_total{{{dev},vq=\"3\"}} 8192"),
            format!("sqcq_queue_in_flight{{{dev},vq=\"2\"}} 2"),
            format!("sqcq_queue_mode{{{dev},vq=\"3\",mode=\"sqcq\"}} 1"),
            format!("sqcq_queue_mode{{{dev},vq=\"3\",mode=\"kick\"}} 0"),
            format!("sqcq_queue_need_wakeup{{{dev},vq=\"3\",side=\"sq\"}} 1"),
            format!("sqcq_queue_spin_window_seconds{{{dev},vq=\"3\"}} 0.00002"),
            format!("sqcq_queue_info{{{dev},vq=\"2\",worker=\"0\"}} 1"),
            format!("sqcq_device_info{{{dev},type=\"scsi\"}} 1"),
            format!("sqcq_device_errors_total{{{dev},class=\"bad_lun\"}} 5"),
            format!("sqcq_device_events_total{{{dev},name=\"other_targets\"}} 510"),
            format!("sqcq_lun_capacity_bytes{{{dev},lun=\"3\"}} 1048576"),
            format!("sqcq_lun_ops_total{{{dev},lun=\"3\",op=\"write\"}} 6"),
            format!("sqcq_lun_bytes_total{{{dev},lun=\"3\",op=\"write\"}} 24576"),
            format!("sqcq_lun_errors_total{{{dev},lun=\"3\",op=\"write\"}} 1"),
            format!("sqcq_lun_time_seconds_total{{{dev},lun=\"3\",op=\"write\"}} 0.0015"),
            format!("sqcq_lun_ops_total{{{dev},lun=\"3\",op=\"read\"}} 0"),
            "sqcq_worker_queues{worker=\"0\"} 2".into(),
            "sqcq_wakeup_cost_seconds 0.000025".into(),
            "sqcq_worker_cpu_seconds_total{worker=\"0\"} 2.5".into(),
            "sqcq_worker_yields_total{worker=\"0\"} 7".into(),
            "sqcq_worker_contested_yields_total{worker=\"0\"} 5".into(),
            "sqcq_worker_long_yields_total{worker=\"0\"} 3".into(),
            "sqcq_worker_handover_sleeps_total{worker=\"0\"} 2".into(),
            "sqcq_worker_cpu_displaced{worker=\"0\"} 1".into(),
            "sqcq_worker_cpu_displacements_total{worker=\"0\"} 4".into(),
        ] {
            assert!(out.lines().any(|l| l == want), "{want} missing from\n{out}");
        }
        assert!(
            lines(&out, "sqcq_queue_need_wakeup{").len() == 2,
            "only the doorbell queue has NEED_WAKEUP"
        );
        assert!(
            lines(&out, "sqcq_queue_spin_window_seconds{").len() == 1,
            "only the polled queue has a spin window"
        );
    }

    #[test]
    fn the_histogram_is_cumulative_and_ends_with_its_count() {
        let mut out = String::new();
        scrape().render(&mut out);
        let buckets = lines(&out, "sqcq_queue_latency_seconds_bucket{device=\"1\"");
        let vq2: Vec<_> = buckets.iter().filter(|l| l.contains("vq=\"2\"")).collect();
        assert_eq!(vq2.len(), crate::runtime::latency::BUCKETS);
        assert!(vq2[0].ends_with("le=\"0.000001\"} 3"), "{}", vq2[0]);
        assert!(vq2[1].ends_with("le=\"0.000002\"} 3"), "{}", vq2[1]);
        assert!(vq2[2].ends_with("le=\"0.000004\"} 4"), "{}", vq2[2]);
        assert!(vq2[22].ends_with("le=\"4.194304\"} 4"), "{}", vq2[22]);
        assert!(vq2[23].ends_with("le=\"+Inf\"} 4"), "{}", vq2[23]);
        assert!(out.contains("sqcq_queue_latency_seconds_sum{device=\"1\",name=\"/run/a \\\"b\\\".sock\",vq=\"2\"} 0.0000035\n"));
        assert!(out.contains("sqcq_queue_latency_seconds_count{device=\"1\",name=\"/run/a \\\"b\\\".sock\",vq=\"2\"} 4\n"));
    }

    #[test]
    fn every_family_is_declared_once_before_its_samples() {
        let mut out = String::new();
        scrape().render(&mut out);
        let mut seen = std::collections::HashSet::new();
        let mut current = String::new();
        for l in out.lines() {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                current = rest.split(' ').next().unwrap().to_owned();
                assert!(seen.insert(current.clone()), "{current} declared twice");
            } else if !l.starts_with('#') {
                let name = l.split(['{', ' ']).next().unwrap();
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s).filter(|b| *b == current))
                    .unwrap_or(name);
                assert_eq!(base, current, "{l} outside its family");
            }
        }
        assert!(seen.len() >= 25, "{seen:?}");
    }
}
