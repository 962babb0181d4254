//! `sqcqd rpc stats_get --human`: one [`Sample`] as a table of totals
//! since the daemon started, in 80 columns. Per device, a table of what
//! its queues served (requests, bytes, service times) and one of how
//! they were told (kicks, calls, batches, polling, backpressure), then
//! the counters that are not zero; then the workers with their CPU time.
//! A pure function of the sample.

use super::rates::{connection, plural, queue_state, worker_row};
use super::sample::{Queue, Sample};
use super::units::{self, NONE, bytes, mean_us, pairs, quantile_us, ratio, total};

/// Longest line.
const WIDTH: usize = 80;

/// The table of `sample`.
pub fn table(sample: &Sample) -> Vec<String> {
    let mut lines = vec![format!(
        "sqcqd {}, pid {}: {}, {}; totals since the daemon started",
        sample.daemon.version,
        sample.daemon.pid,
        plural(sample.devices.len(), "device"),
        plural(sample.workers.len(), "worker"),
    )];
    for d in &sample.devices {
        lines.push(String::new());
        lines.push(format!(
            "device {}: {}, {}, {}",
            d.id,
            d.device_type,
            connection(d),
            d.socket_path
        ));
        let queues: Vec<&Queue> = sample.queues_of(d.id).collect();
        if queues.is_empty() {
            lines.push("  no queue has run yet".into());
        } else {
            served(&queues, &mut lines);
            told(&queues, &mut lines);
        }
        let nonzero = |counters: Option<&std::collections::BTreeMap<String, u64>>| {
            counters
                .into_iter()
                .flatten()
                .filter(|(_, v)| **v > 0)
                .map(|(k, v)| (k.clone(), *v))
                .collect::<Vec<_>>()
        };
        let errors = nonzero(sample.errors.get(&d.id));
        if errors.is_empty() {
            lines.push("  errors: none".into());
        } else {
            lines.extend(pairs("  errors: ", &errors, WIDTH));
        }
        let events = nonzero(sample.events.get(&d.id));
        if !events.is_empty() {
            lines.extend(pairs("  events: ", &events, WIDTH));
        }
        let resubmitted: Vec<(String, u64)> = queues
            .iter()
            .filter(|q| q.resubmitted > 0)
            .map(|q| (format!("vq {}", q.vq), q.resubmitted))
            .collect();
        if !resubmitted.is_empty() {
            lines.extend(pairs(
                "  resubmitted after a reconnect: ",
                &resubmitted,
                WIDTH,
            ));
        }
    }
    lines.push(String::new());
    lines.push("WORKER  BOUND  CPU-s  QUEUES (DEVICE:VQ)".into());
    for w in &sample.workers {
        let cpu = w
            .cpu_ns
            .map_or_else(|| NONE.into(), |ns| format!("{:.2}", ns as f64 / 1e9));
        lines.push(worker_row(w, &cpu));
    }
    lines
}

/// The sum of `queues` (for the `all` rows), as a queue.
fn sum(queues: &[&Queue]) -> Queue {
    let mut all = Queue {
        mode: if queues.iter().any(|q| q.polled()) {
            "polled".into()
        } else {
            "kick".into()
        },
        running: true,
        ..Queue::default()
    };
    for q in queues {
        let add = |a: &mut u64, b: u64| *a = a.saturating_add(b);
        add(&mut all.completions, q.completions);
        add(&mut all.in_flight, q.in_flight);
        add(&mut all.read_bytes, q.read_bytes);
        add(&mut all.written_bytes, q.written_bytes);
        add(&mut all.latency.sum_ns, q.latency.sum_ns);
        if all.latency.buckets.len() < q.latency.buckets.len() {
            all.latency.buckets.resize(q.latency.buckets.len(), 0);
        }
        for (a, b) in all.latency.buckets.iter_mut().zip(&q.latency.buckets) {
            add(a, *b);
        }
        add(&mut all.publishes, q.publishes);
        add(&mut all.calls, q.calls);
        add(&mut all.kicks, q.kicks);
        add(&mut all.limited, q.limited);
        add(&mut all.throttled, q.throttled);
        add(&mut all.spins, q.spins);
        add(&mut all.sleeps, q.sleeps);
    }
    all
}

/// Each queue's row, then the `all` row if there are several.
fn with_sum<'a>(queues: &'a [&'a Queue]) -> Vec<(String, std::borrow::Cow<'a, Queue>)> {
    let mut rows: Vec<_> = queues
        .iter()
        .map(|q| (q.vq.to_string(), std::borrow::Cow::Borrowed(*q)))
        .collect();
    if queues.len() > 1 {
        rows.push(("all".into(), std::borrow::Cow::Owned(sum(queues))));
    }
    rows
}

/// What the queues served.
fn served(queues: &[&Queue], lines: &mut Vec<String>) {
    lines.push(format!(
        "  {:>4}  {:<9} {:>6}  {:>8}  {:>7}  {:>7}  {:>7} {:>6}  {:>9}",
        "VQ", "STATE", "WORKER", "REQUESTS", "READ", "WRITTEN", "AVG-us", "P99-us", "IN-FLIGHT"
    ));
    for (vq, q) in with_sum(queues) {
        let all = vq == "all";
        let served = units::histogram_count(&q.latency.buckets);
        lines.push(format!(
            "  {:>4}  {:<9} {:>6}  {:>8}  {:>7}  {:>7}  {:>7} {:>6}  {:>9}",
            vq,
            if all { "" } else { queue_state(&q) },
            q.worker
                .filter(|_| !all)
                .map_or_else(|| NONE.into(), |w| w.to_string()),
            total(q.completions),
            bytes(q.read_bytes),
            bytes(q.written_bytes),
            mean_us(q.latency.sum_ns, served),
            quantile_us(&q.latency.buckets, 0.99),
            total(q.in_flight),
        ));
    }
}

/// How the queues were told of requests and completions.
fn told(queues: &[&Queue], lines: &mut Vec<String>) {
    lines.push(format!(
        "  {:>4}  {:>7} {:>7} {:>8} {:>7} {:>7} {:>7} {:>7} {:>9}",
        "VQ", "KICKS", "CALLS", "NOTIF/IO", "BATCHES", "SPINS", "SLEEPS", "LIMITED", "THROTTLED"
    ));
    for (vq, q) in with_sum(queues) {
        let polled = |n: u64| {
            if q.polled() { total(n) } else { NONE.into() }
        };
        lines.push(format!(
            "  {:>4}  {:>7} {:>7} {:>8} {:>7} {:>7} {:>7} {:>7} {:>9}",
            vq,
            total(q.kicks),
            total(q.calls),
            ratio(q.kicks.saturating_add(q.calls), q.completions),
            total(q.publishes),
            polled(q.spins),
            polled(q.sleeps),
            total(q.limited),
            total(q.throttled),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::super::sample::recorded::sample;
    use super::*;

    fn fields(lines: &[String], start: &str, nth: usize) -> Vec<String> {
        lines
            .iter()
            .filter(|l| l.starts_with(start))
            .nth(nth)
            .unwrap_or_else(|| panic!("no line {start:?} #{nth} in\n{}", lines.join("\n")))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn totals_of_every_queue_and_device_in_80_columns() {
        let s = sample(150_000, 3_000, 1_250_000_000, 3_500_000_000);
        let lines = table(&s);
        let text = lines.join("\n");
        assert!(lines.iter().all(|l| l.len() <= 80), "{text}");
        assert_eq!(
            lines[0],
            "sqcqd 0.1.0, pid 4242: 2 devices, 2 workers; totals since the daemon started"
        );
        assert!(
            text.contains("device 0: scsi, connected, /run/sqcq/vm1.sock"),
            "{text}"
        );
        // vq 2: 150 000 requests of 4 KiB (614 MB), half at 12 µs and
        // half at 200 µs.
        assert_eq!(
            fields(&lines, "     2", 0),
            ["2", "sqcq", "0", "150k", "614MB", "0B", "106.0", "256", "3"],
            "{text}"
        );
        assert_eq!(
            fields(&lines, "     3", 0),
            [
                "3", "kick", "1", "3000", "12.3MB", "0B", "106.0", "256", "3"
            ],
            "{text}"
        );
        assert_eq!(
            fields(&lines, "   all", 0),
            ["all", "-", "153k", "627MB", "0B", "106.0", "256", "6"],
            "{text}"
        );
        // vq 2: 1 500 kicks and 1 500 calls for 150 000 requests; vq 3 a
        // kick and a call per request, nothing polled; together
        // (3 000 + 6 000) / 153 000 = 0.06.
        assert_eq!(
            fields(&lines, "     2", 1),
            [
                "2", "1500", "1500", "0.02", "37.5k", "1.50M", "1500", "0", "0"
            ],
            "{text}"
        );
        assert_eq!(
            fields(&lines, "     3", 1),
            ["3", "3000", "3000", "2.00", "750", "-", "-", "0", "0"],
            "{text}"
        );
        assert_eq!(
            fields(&lines, "   all", 1),
            [
                "all", "4500", "4500", "0.06", "38.2k", "1.50M", "1500", "0", "0"
            ],
            "{text}"
        );
        assert!(text.contains("  errors: io_errors 3\n"), "{text}");
        assert!(text.contains("  events: other_targets 255\n"), "{text}");
        assert!(
            text.contains("device 1: blk, listening, /run/sqcq/vm2.sock\n  no queue has run yet\n  errors: none"),
            "{text}"
        );
        assert_eq!(fields(&lines, "     0", 0), ["0", "-", "1.25", "0:2"]);
        assert_eq!(fields(&lines, "     1", 0), ["1", "1", "3.50", "0:3"]);
    }
}
