//! The workers axis: for each group of cells that differ only in sqcqd's
//! worker count, the IOPS of each mode at each count as a ratio against
//! the first count, with what each side spent per I/O and how busy each
//! worker thread was. The multi-worker seed claims that IOPS grow with
//! the workers until the CPUs run out; these are the figures that show
//! whether they do on the machine at hand.

use std::fmt::Write as _;

use serde::Serialize;

use crate::format::thousands;
use crate::matrix::{Outcome, Plan, find};
use crate::run::{self, Cell};

/// One mode at one worker count: the median run's figures.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    /// sqcqd's worker count.
    pub workers: u16,
    /// I/Os per second.
    pub iops: f64,
    /// IOPS divided by this mode's IOPS at the first worker count (`None`
    /// when that one failed).
    pub ratio: Option<f64>,
    /// Driver-side CPU microseconds per I/O.
    pub driver_cpu_us: f64,
    /// Target-side CPU microseconds per I/O.
    pub target_cpu_us: f64,
    /// Kicks plus calls per I/O.
    pub kicks_calls_per_io: f64,
    /// Worker threads seen running in sqcqd.
    pub workers_seen: Option<u32>,
    /// Each worker thread's CPU time as a share of the measured time.
    pub worker_busy: Vec<f64>,
    /// The mode the bench actually ran.
    pub mode_run: String,
}

/// One mode across the workers axis of one group.
#[derive(Clone, Debug, Serialize)]
pub struct Series {
    /// The group's cell, without a worker count.
    #[serde(flatten)]
    pub cell: Cell,
    /// Notification mode.
    pub mode: String,
    /// A point per worker count that has figures (a failed one is
    /// missing here and in `results` says why).
    pub points: Vec<Point>,
}

impl Series {
    /// The point at `workers`, if it ran.
    pub fn at(&self, workers: u16) -> Option<&Point> {
        self.points.iter().find(|p| p.workers == workers)
    }
}

/// Every group with a workers axis (sqcqd's), mode by mode.
pub fn series(plan: &Plan, results: &[Outcome]) -> Vec<Series> {
    let secs = plan.runtime.as_secs_f64().max(f64::MIN_POSITIVE);
    let mut out = Vec::new();
    for group in plan.groups().iter().filter(|g| g.len() > 1) {
        for mode in &plan.modes {
            let figures = |cell: &Cell| find(results, cell, mode).and_then(|o| o.median.as_ref());
            let base = figures(&group[0]).map(|f| f.iops).filter(|b| *b > 0.0);
            let points = group
                .iter()
                .filter_map(|cell| {
                    let f = figures(cell)?;
                    Some(Point {
                        workers: cell.workers?,
                        iops: f.iops,
                        ratio: base.map(|b| f.iops / b),
                        driver_cpu_us: f.driver_cpu_us,
                        target_cpu_us: f.target_cpu_us,
                        kicks_calls_per_io: f.kicks_per_io + f.calls_per_io,
                        workers_seen: f.workers_seen,
                        worker_busy: f.worker_cpu_s.iter().map(|s| s / secs).collect(),
                        mode_run: f.mode_run.clone(),
                    })
                })
                .collect();
            out.push(Series {
                cell: group[0].with_workers(None),
                mode: mode.clone(),
                points,
            });
        }
    }
    out
}

/// One table: a row per mode, a column per worker count.
fn table(plan: &Plan, rows: &[&Series], title: &str, show: &dyn Fn(&Point) -> String) -> String {
    let mut out = format!("\n{title}\n{:<14}", "mode");
    for w in &plan.workers {
        let _ = write!(out, " {:>18}", format!("W{w}"));
    }
    out.push('\n');
    for s in rows {
        let _ = write!(out, "{:<14}", s.mode);
        for &w in &plan.workers {
            let text = match s.at(w) {
                Some(p) => {
                    let fell_back = run::fell_back(&s.mode, &p.mode_run);
                    format!("{}{}", show(p), if fell_back { "*" } else { "" })
                }
                None => "failed".into(),
            };
            let _ = write!(out, " {text:>18}");
        }
        out.push('\n');
    }
    out
}

/// The tables of every group, as text.
pub fn render(plan: &Plan, series: &[Series]) -> String {
    let mut out = String::new();
    let first = plan.workers.first().copied().unwrap_or(1);
    let mut groups: Vec<&Cell> = series.iter().map(|s| &s.cell).collect();
    groups.dedup();
    for cell in groups {
        let rows: Vec<&Series> = series.iter().filter(|s| s.cell == *cell).collect();
        let _ = write!(
            out,
            "\nMulti-worker scaling: {} ({} device(s) x {} queue(s)), sqcqd workers {}\n",
            cell.label(),
            cell.device_count,
            cell.queues,
            plan.workers
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
        out += &table(
            plan,
            &rows,
            &format!("IOPS (ratio against W{first})"),
            &|p| match p.ratio {
                Some(r) => format!("{} {r:.2}x", thousands(p.iops)),
                None => thousands(p.iops),
            },
        );
        out += &table(plan, &rows, "CPU us per I/O: driver / target", &|p| {
            format!("{:.1} / {:.1}", p.driver_cpu_us, p.target_cpu_us)
        });
        out += &table(plan, &rows, "kicks + calls per I/O", &|p| {
            format!("{:.3}", p.kicks_calls_per_io)
        });
        out += &table(
            plan,
            &rows,
            "worker threads busy (% of the measured time, each)",
            &|p| {
                let busy: Vec<String> = p
                    .worker_busy
                    .iter()
                    .map(|b| format!("{:.0}", b * 100.0))
                    .collect();
                if busy.is_empty() {
                    "-".into()
                } else {
                    busy.join("/")
                }
            },
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::{Case, Figures};

    fn outcome(cell: &Cell, mode: &str, iops: Option<f64>) -> Outcome {
        let workers = cell.workers.unwrap_or(1);
        Outcome {
            case: Case {
                cell: cell.clone(),
                mode: mode.into(),
            },
            median: iops.map(|iops| Figures {
                iops,
                kicks_per_io: 0.5,
                calls_per_io: 0.25,
                mode_run: mode.into(),
                workers_seen: Some(u32::from(workers)),
                worker_cpu_s: vec![0.5; usize::from(workers)],
                ..Figures::default()
            }),
            repeats: vec![],
            failed: iops.is_none().then(|| "exit status: 1".into()),
            raw: None,
        }
    }

    fn swept() -> Plan {
        Plan {
            modes: vec!["notify".into(), "sqcq".into()],
            jobs: vec![4],
            device_count: 2,
            workers: vec![1, 2],
            ..crate::matrix::tests::plan()
        }
    }

    fn results(plan: &Plan) -> Vec<Outcome> {
        let group = &plan.groups()[0];
        vec![
            outcome(&group[0], "notify", Some(100_000.0)),
            outcome(&group[0], "sqcq", Some(400_000.0)),
            outcome(&group[1], "notify", Some(180_000.0)),
            outcome(&group[1], "sqcq", None),
        ]
    }

    #[test]
    fn series_hold_ratios_against_the_first_worker_count() {
        let plan = swept();
        let series = series(&plan, &results(&plan));
        assert_eq!(series.len(), 2);
        let notify = &series[0];
        assert_eq!(
            (notify.mode.as_str(), notify.cell.workers),
            ("notify", None)
        );
        assert_eq!((notify.cell.device_count, notify.cell.queues), (2, 2));
        assert_eq!(notify.at(1).unwrap().ratio, Some(1.0));
        let two = notify.at(2).unwrap();
        assert_eq!(two.ratio, Some(1.8));
        assert_eq!(two.kicks_calls_per_io, 0.75);
        assert_eq!(two.workers_seen, Some(2));
        // 0.5 s of CPU in a 1 s run.
        assert_eq!(two.worker_busy, [0.5, 0.5]);
        // The failed point is missing, not zero.
        assert!(series[1].at(2).is_none());
        assert_eq!(series[1].points.len(), 1);
    }

    #[test]
    fn tables_have_a_column_per_worker_count() {
        let plan = swept();
        let text = render(&plan, &series(&plan, &results(&plan)));
        assert!(
            text.contains("Multi-worker scaling: randread QD1 NJ4 D2 (2 device(s) x 2 queue(s)), sqcqd workers 1, 2"),
            "{text}"
        );
        assert!(text.contains("IOPS (ratio against W1)"), "{text}");
        let notify = text
            .lines()
            .find(|l| l.starts_with("notify") && l.contains('x'))
            .unwrap();
        assert!(notify.contains("100,000 1.00x"), "{notify}");
        assert!(notify.contains("180,000 1.80x"), "{notify}");
        let sqcq = text.lines().find(|l| l.starts_with("sqcq ")).unwrap();
        assert!(
            sqcq.contains("400,000 1.00x") && sqcq.ends_with("failed"),
            "{sqcq}"
        );
        assert!(text.contains("50/50"), "{text}");
    }

    #[test]
    fn groups_without_the_axis_have_no_series() {
        let plan = crate::matrix::tests::plan();
        assert!(series(&plan, &[]).is_empty());
    }
}
