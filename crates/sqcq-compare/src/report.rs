//! The RFC-style tables and the output files.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::format::thousands;
use crate::machine::Machine;
use crate::matrix::{Outcome, Plan, find};
use crate::run::{self, Cell, Figures};
use crate::{plot, scaling};

/// One table: a row per cell, a column per mode, `show` formatting each.
fn table(
    plan: &Plan,
    results: &[Outcome],
    title: &str,
    show: &dyn Fn(&Figures, Option<&Figures>) -> String,
) -> String {
    let mut out = format!("\n{title}\n");
    let _ = write!(out, "{:<36}", "Test");
    for m in &plan.modes {
        let _ = write!(out, " {m:>18}");
    }
    out.push('\n');
    for cell in plan.cells() {
        let _ = write!(out, "{:<36}", cell.label());
        let base = find(results, &cell, &plan.modes[0]).and_then(|o| o.median.as_ref());
        for m in &plan.modes {
            let text = match find(results, &cell, m) {
                Some(Outcome {
                    median: Some(f), ..
                }) => {
                    let fell_back = run::fell_back(m, &f.mode_run);
                    format!("{}{}", show(f, base), if fell_back { "*" } else { "" })
                }
                _ => "failed".into(),
            };
            let _ = write!(out, " {text:>18}");
        }
        out.push('\n');
    }
    out
}

/// sqcqd's cell that runs what `peer` runs (its first worker count).
fn sqcqd_twin(plan: &Plan, peer: &Cell) -> Cell {
    Cell {
        target: "sqcqd".into(),
        workers: plan.workers.first().copied(),
        ..peer.clone()
    }
}

/// sqcqd against each peer it ran beside: per peer cell and mode, sqcqd's
/// IOPS over the peer's, and sqcqd's target CPU per I/O over the peer's.
fn against_peers(plan: &Plan, results: &[Outcome]) -> String {
    let peers: Vec<Cell> = plan
        .cells()
        .into_iter()
        .filter(|c| c.target != "sqcqd")
        .collect();
    if peers.is_empty() || !plan.targets.iter().any(|t| t == "sqcqd") {
        return String::new();
    }
    let mut out = "
sqcqd against the peer, same mode: IOPS ratio / target CPU per I/O ratio
"
    .to_string();
    let _ = write!(out, "{:<36}", "Test");
    for m in &plan.modes {
        let _ = write!(out, " {m:>18}");
    }
    out.push('\n');
    for peer in peers {
        let ours = sqcqd_twin(plan, &peer);
        let _ = write!(out, "{:<36}", peer.label());
        for m in &plan.modes {
            let median = |c: &Cell| find(results, c, m).and_then(|o| o.median.as_ref());
            let text = match (median(&ours), median(&peer)) {
                (Some(a), Some(b)) if b.iops > 0.0 && b.target_cpu_us > 0.0 => format!(
                    "{:.2}x / {:.2}x",
                    a.iops / b.iops,
                    a.target_cpu_us / b.target_cpu_us
                ),
                _ => "-".into(),
            };
            let _ = write!(out, " {text:>18}");
        }
        out.push('\n');
    }
    out
}

/// All tables as text.
pub fn render(plan: &Plan, results: &[Outcome], machine: &Machine) -> String {
    let mut out = format!(
        "sqcq-compare: {} CPU(s) {}, kernel {}, load average {}{}\n{} s measured + {} s warm-up per run, median of {} run(s), block size {}, {}\n",
        machine.cpus,
        machine.cpu,
        machine.kernel,
        machine.load_average,
        machine
            .load_average_end
            .as_ref()
            .map_or_else(String::new, |end| format!(
                " at the start, {end} at the end"
            )),
        plan.runtime.as_secs_f64(),
        plan.ramp.as_secs_f64(),
        plan.repeat,
        plan.bs,
        plan.rbd.as_ref().map_or_else(
            || "null LUN or disk".to_string(),
            |rbd| format!("RBD image {rbd}")
        ),
    );
    if let Some(cpus) = &plan.target_cpus {
        let _ = writeln!(out, "targets on CPU(s) {cpus}");
    }
    if let Some(rate) = plan.rate_iops {
        let _ = writeln!(out, "at most {rate} I/Os per second per job");
    }
    out += &table(
        plan,
        results,
        &format!("IOPS (change against {})", plan.modes[0]),
        &|f, base| match base {
            Some(b) if b.iops > 0.0 => format!(
                "{} {:+.0}%",
                thousands(f.iops),
                (f.iops / b.iops - 1.0) * 100.0
            ),
            _ => thousands(f.iops),
        },
    );
    out += &table(plan, results, "p50 latency (us)", &|f, _| {
        format!("{:.1}", f.p50_us)
    });
    out += &table(plan, results, "p99 latency (us)", &|f, _| {
        format!("{:.1}", f.p99_us)
    });
    out += &table(plan, results, "kicks + calls per I/O", &|f, _| {
        format!("{:.3}", f.kicks_per_io + f.calls_per_io)
    });
    out += &table(plan, results, "CPU us per I/O: driver / target", &|f, _| {
        format!("{:.1} / {:.1}", f.driver_cpu_us, f.target_cpu_us)
    });
    for (i, w) in plan.watch.iter().enumerate() {
        out += &table(
            plan,
            results,
            &format!("CPU us per I/O of {} (pid {})", w.name, w.pid),
            &|f, _| {
                f.watched_cpu_us
                    .get(i)
                    .map_or_else(|| "-".into(), |us| format!("{us:.1}"))
            },
        );
    }
    out += &against_peers(plan, results);
    if results.iter().any(|o| {
        o.median
            .as_ref()
            .is_some_and(|f| run::fell_back(&o.case.mode, &f.mode_run))
    }) {
        out += "\n* the device did not offer what the mode needs; the run fell back to notify\n";
    }
    if plan.sweeps_workers() {
        out += &scaling::render(plan, &scaling::series(plan, results));
    }
    out
}

#[derive(Serialize)]
struct Document<'a> {
    machine: &'a Machine,
    plan: &'a Plan,
    results: &'a [Outcome],
    /// The workers axis, when swept.
    #[serde(skip_serializing_if = "Option::is_none")]
    scaling: Option<Vec<scaling::Series>>,
}

/// Writes `results.json` and `iops.svg` into `dir`, and `workers.svg`
/// when the plan sweeps the workers axis.
pub fn write_outputs(
    dir: &Path,
    plan: &Plan,
    results: &[Outcome],
    machine: &Machine,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let series = plan
        .sweeps_workers()
        .then(|| scaling::series(plan, results));
    if let Some(series) = &series {
        std::fs::write(
            dir.join("workers.svg"),
            plot::workers_svg(plan, series, machine),
        )?;
    }
    let doc = Document {
        machine,
        plan,
        results,
        scaling: series,
    };
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_vec_pretty(&doc).map_err(std::io::Error::other)?,
    )?;
    std::fs::write(dir.join("iops.svg"), plot::iops_svg(plan, results, machine))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::{Case, Cell};

    fn outcome(mode: &str, iops: f64) -> Outcome {
        Outcome {
            case: Case {
                cell: Cell {
                    device: "scsi".into(),
                    target: "sqcqd".into(),
                    rw: "randread".into(),
                    qd: 1,
                    jobs: 1,
                    device_count: 1,
                    queues: 1,
                    workers: Some(1),
                },
                mode: mode.into(),
            },
            median: Some(Figures {
                iops,
                mode_run: mode.into(),
                ..Figures::default()
            }),
            repeats: vec![],
            failed: None,
            raw: None,
        }
    }

    #[test]
    fn iops_table_shows_change_against_the_first_mode() {
        let plan = Plan {
            modes: vec!["notify".into(), "sqcq".into()],
            ..crate::matrix::tests::plan()
        };
        let machine = Machine {
            cpu: "x".into(),
            cpus: 2,
            kernel: "k".into(),
            load_average: "0".into(),
            load_average_end: None,
        };
        let text = render(
            &plan,
            &[outcome("notify", 20_000.0), outcome("sqcq", 250_000.0)],
            &machine,
        );
        assert!(text.contains("20,000 +0%"), "{text}");
        assert!(text.contains("250,000 +1150%"), "{text}");
        assert!(!text.contains("Multi-worker scaling"), "not swept: {text}");
        assert!(text.contains("load average 0\n"), "{text}");
        let ended = Machine {
            load_average_end: Some("3.5".into()),
            ..machine
        };
        let text = render(&plan, &[], &ended);
        assert!(
            text.contains("load average 0 at the start, 3.5 at the end\n"),
            "{text}"
        );
    }

    #[test]
    fn sqcqd_is_set_against_each_peer() {
        let plan = Plan {
            devices: vec!["blk".into()],
            targets: vec!["sqcqd".into(), "qemu-storage-daemon".into()],
            ..crate::matrix::tests::plan()
        };
        let at = |target: &str, iops: f64, cpu: f64| {
            let mut o = outcome("notify", iops);
            o.case.cell.device = "blk".into();
            o.case.cell.target = target.into();
            if target != "sqcqd" {
                o.case.cell.workers = None;
            }
            if let Some(f) = o.median.as_mut() {
                f.target_cpu_us = cpu;
            }
            o
        };
        let results = [
            at("sqcqd", 30_000.0, 10.0),
            at("qemu-storage-daemon", 20_000.0, 20.0),
        ];
        let text = against_peers(&plan, &results);
        assert!(
            text.contains("qemu-storage-daemon blk randread QD1 NJ1")
                && text.contains("1.50x / 0.50x"),
            "{text}"
        );
        let alone = Plan {
            targets: vec!["sqcqd".into()],
            ..plan
        };
        assert_eq!(against_peers(&alone, &results), "");
    }
}
