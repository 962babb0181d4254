//! The benchmark matrix and its execution order.
//!
//! A cell is everything but the mode: device type, target, rw, depth,
//! jobs (spread over `device_count` devices) and sqcqd's worker count.
//! Cells that differ only in the worker count form a group; within a group
//! the worker counts and the modes are interleaved, repeat by repeat, so
//! that slow drifts of the machine hit every point of the workers axis
//! alike; groups that differ only in the target run as one batch, so the
//! targets take turns as well.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use thiserror::Error;

use crate::run::{self, Case, Cell, Figures, RunError, Settings, Watched};

/// What to run.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    /// Notification modes; the first is the baseline.
    pub modes: Vec<String>,
    /// Device types (`scsi`, `blk`).
    pub devices: Vec<String>,
    /// Targets the bench starts.
    pub targets: Vec<String>,
    /// I/O patterns.
    pub rw: Vec<String>,
    /// Queue depths.
    pub qd: Vec<u32>,
    /// Job counts, over all devices.
    pub jobs: Vec<u32>,
    /// Devices per target, driven at once (several: sqcqd only); every
    /// job count is a multiple of it.
    pub device_count: u32,
    /// Worker counts of sqcqd (the workers axis; one value: not swept).
    pub workers: Vec<u16>,
    /// Block size.
    pub bs: String,
    /// Measured time per run.
    pub runtime: Duration,
    /// Warm-up per run.
    pub ramp: Duration,
    /// Runs per cell and mode.
    pub repeat: u32,
    /// An RBD image every target serves instead of a null disk (the
    /// bench's `--target-rbd`), one target after the other.
    pub rbd: Option<String>,
    /// CPUs of the targets started (the bench's `--target-cpus`).
    pub target_cpus: Option<String>,
    /// I/Os per second per job (the bench's `--rate_iops`; `None`: no
    /// limit).
    pub rate_iops: Option<u32>,
    /// Other processes whose CPU time per I/O each run measures.
    pub watch: Vec<Watched>,
}

/// A plan that cannot run.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PlanError {
    /// A list or count is empty or zero.
    #[error("{0} must not be empty or zero")]
    Empty(&'static str),
    /// A job count the devices cannot share.
    #[error("--jobs {jobs} is not a multiple of --device-count {devices}")]
    Uneven {
        /// The job count.
        jobs: u32,
        /// The device count.
        devices: u32,
    },
    /// An RBD image with a target or a device count that cannot serve it.
    #[error("--rbd: only sqcqd and qemu-storage-daemon serve an RBD image, one device each")]
    RbdTarget,
    /// Several devices with a target that serves one.
    #[error("--device-count {devices}: only sqcqd serves several devices, not {target}")]
    OneDeviceTarget {
        /// The device count.
        devices: u32,
        /// The target.
        target: String,
    },
}

impl Plan {
    /// What each of its runs passes to the bench beside the case.
    pub fn settings(&self) -> Settings<'_> {
        Settings {
            bs: &self.bs,
            runtime: self.runtime,
            ramp: self.ramp,
            rbd: self.rbd.as_deref(),
            target_cpus: self.target_cpus.as_deref(),
            rate_iops: self.rate_iops,
            watch: &self.watch,
        }
    }

    /// Whether the workers axis has more than one point.
    pub fn sweeps_workers(&self) -> bool {
        self.workers.len() > 1
    }

    /// Checks what the command line cannot.
    pub fn check(&self) -> Result<(), PlanError> {
        let lists = [
            ("--modes", self.modes.is_empty()),
            ("--devices", self.devices.is_empty()),
            ("--targets", self.targets.is_empty()),
            ("--rw", self.rw.is_empty()),
            ("--qd", self.qd.is_empty() || self.qd.contains(&0)),
            ("--jobs", self.jobs.is_empty() || self.jobs.contains(&0)),
            ("--device-count", self.device_count == 0),
            (
                "--workers",
                self.workers.is_empty() || self.workers.contains(&0),
            ),
        ];
        if let Some((what, _)) = lists.iter().find(|(_, empty)| *empty) {
            return Err(PlanError::Empty(what));
        }
        if let Some(&jobs) = self.jobs.iter().find(|&&j| j % self.device_count != 0) {
            return Err(PlanError::Uneven {
                jobs,
                devices: self.device_count,
            });
        }
        if self.rbd.is_some()
            && (self.device_count > 1
                || self
                    .targets
                    .iter()
                    .any(|t| t != "sqcqd" && t != "qemu-storage-daemon"))
        {
            return Err(PlanError::RbdTarget);
        }
        if let Some(target) = self.targets.iter().find(|t| *t != "sqcqd")
            && self.device_count > 1
        {
            return Err(PlanError::OneDeviceTarget {
                devices: self.device_count,
                target: target.clone(),
            });
        }
        Ok(())
    }

    /// The groups in report order: by device type, then target (each
    /// target with the device types it serves), rw, depth, jobs; each
    /// group holds a cell per worker count (one for the peers, which
    /// have no workers option).
    pub fn groups(&self) -> Vec<Vec<Cell>> {
        let mut groups = Vec::new();
        for device in &self.devices {
            for target in self.targets.iter().filter(|t| serves(t, device)) {
                for rw in &self.rw {
                    for &qd in &self.qd {
                        for &jobs in &self.jobs {
                            let cell = Cell {
                                device: device.clone(),
                                target: target.clone(),
                                rw: rw.clone(),
                                qd,
                                jobs,
                                device_count: self.device_count,
                                queues: jobs / self.device_count.max(1),
                                workers: None,
                            };
                            groups.push(if target == "sqcqd" {
                                self.workers
                                    .iter()
                                    .map(|&w| cell.with_workers(Some(w)))
                                    .collect()
                            } else {
                                vec![cell]
                            });
                        }
                    }
                }
            }
        }
        groups
    }

    /// The groups as they run: those that differ only in the target
    /// merged (in report order of their first), so that the targets, like
    /// the worker counts and the modes, take turns repeat by repeat and
    /// see the same machine and the same cluster.
    pub fn batches(&self) -> Vec<Vec<Cell>> {
        let key = |c: &Cell| Cell {
            target: String::new(),
            workers: None,
            ..c.clone()
        };
        let mut batches: Vec<Vec<Cell>> = Vec::new();
        for group in self.groups() {
            match batches.iter_mut().find(|b| key(&b[0]) == key(&group[0])) {
                Some(batch) => batch.extend(group),
                None => batches.push(group),
            }
        }
        batches
    }

    /// The cells in report order: the groups' cells one after the other.
    pub fn cells(&self) -> Vec<Cell> {
        self.groups().into_iter().flatten().collect()
    }
}

/// Whether `target` serves `device`: the public peers serve one device
/// type each, any other target (sqcqd) both.
pub fn serves(target: &str, device: &str) -> bool {
    match target {
        "vhost-device-scsi" => device == "scsi",
        "qemu-storage-daemon" => device == "blk",
        _ => true,
    }
}

/// The outcome of one case: the median over its repeats, or why it failed.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    /// Which case.
    pub case: Case,
    /// Median figures (by IOPS) over the successful repeats.
    pub median: Option<Figures>,
    /// Every successful repeat's figures, in the order they ran: the
    /// modes of a cell are interleaved, so the n-th repeats of two modes
    /// are a side-by-side draw.
    pub repeats: Vec<Figures>,
    /// The first failure, if no repeat succeeded.
    pub failed: Option<String>,
    /// The raw JSON of the median run.
    pub raw: Option<serde_json::Value>,
}

/// The outcome of `cell` in `mode`.
pub fn find<'a>(results: &'a [Outcome], cell: &Cell, mode: &str) -> Option<&'a Outcome> {
    results
        .iter()
        .find(|o| o.case.cell == *cell && o.case.mode == mode)
}

/// The cases of one group in the order they run: repeat by repeat, each
/// worker count, each mode.
pub fn schedule(group: &[Cell], modes: &[String], repeat: u32) -> Vec<Case> {
    let mut cases = Vec::new();
    for _ in 0..repeat {
        for cell in group {
            for mode in modes {
                cases.push(Case {
                    cell: cell.clone(),
                    mode: mode.clone(),
                });
            }
        }
    }
    cases
}

/// Runs every case, batch by batch ([`Plan::batches`]) in [`schedule`]
/// order, and reports
/// each (cell, mode) in report order.
pub fn run_all(bench: &Path, plan: &Plan) -> Result<Vec<Outcome>, RunError> {
    let groups = plan.batches();
    let total =
        groups.iter().map(Vec::len).sum::<usize>() * plan.modes.len() * plan.repeat as usize;
    let mut done = 0;
    let mut outcomes = Vec::new();
    for group in groups {
        let per_repeat = group.len() * plan.modes.len();
        let mut runs: Vec<Vec<(Figures, serde_json::Value)>> = vec![Vec::new(); per_repeat];
        let mut errors: Vec<Option<String>> = vec![None; per_repeat];
        for (n, case) in schedule(&group, &plan.modes, plan.repeat)
            .iter()
            .enumerate()
        {
            let i = n % per_repeat;
            done += 1;
            eprint!("\r[{done}/{total}] {} {:<12}", case.cell.label(), case.mode);
            match run::run_once(bench, case, &plan.settings()) {
                Ok(r) => runs[i].push(r),
                Err(RunError::Failed { status, stderr }) => {
                    eprintln!("\n  failed: {status}: {stderr}");
                    errors[i].get_or_insert(format!("{status}: {stderr}"));
                }
                Err(e) => return Err(e),
            }
        }
        for (i, case) in schedule(&group, &plan.modes, 1).into_iter().enumerate() {
            let mine = std::mem::take(&mut runs[i]);
            let repeats: Vec<Figures> = mine.iter().map(|(f, _)| f.clone()).collect();
            let mut by_iops: Vec<_> = mine.iter().collect();
            by_iops.sort_by(|a, b| a.0.iops.total_cmp(&b.0.iops));
            let median = by_iops.get(by_iops.len() / 2).map(|&r| r.clone());
            outcomes.push(Outcome {
                case,
                failed: if median.is_none() {
                    errors[i].take()
                } else {
                    None
                },
                median: median.as_ref().map(|m| m.0.clone()),
                raw: median.map(|m| m.1),
                repeats,
            });
        }
    }
    eprintln!();
    Ok(outcomes)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// SCSI on sqcqd, randread QD1 NJ1, one worker, notify: what each test
    /// changes from.
    pub(crate) fn plan() -> Plan {
        Plan {
            modes: vec!["notify".into()],
            devices: vec!["scsi".into()],
            targets: vec!["sqcqd".into()],
            rw: vec!["randread".into()],
            qd: vec![1],
            jobs: vec![1],
            device_count: 1,
            workers: vec![1],
            bs: "4k".into(),
            runtime: Duration::from_secs(1),
            ramp: Duration::ZERO,
            repeat: 1,
            rbd: None,
            target_cpus: None,
            rate_iops: None,
            watch: Vec::new(),
        }
    }

    #[test]
    fn cells_follow_the_rfc_order() {
        let plan = Plan {
            rw: vec!["randread".into(), "randwrite".into()],
            qd: vec![1, 32],
            jobs: vec![1, 4],
            ..plan()
        };
        let cells = plan.cells();
        assert_eq!(cells.len(), 8);
        let key = |c: &Cell| (c.rw.clone(), c.qd, c.jobs);
        assert_eq!(key(&cells[0]), ("randread".into(), 1, 1));
        assert_eq!(key(&cells[3]), ("randread".into(), 32, 4));
        assert_eq!(key(&cells[4]), ("randwrite".into(), 1, 1));
        // Not swept: one cell per group, as before the workers axis.
        assert!(plan.groups().iter().all(|g| g.len() == 1));
        assert!(
            cells
                .iter()
                .all(|c| c.workers == Some(1) && c.queues == c.jobs)
        );
    }

    #[test]
    fn each_target_runs_the_device_types_it_serves() {
        let plan = Plan {
            devices: vec!["scsi".into(), "blk".into()],
            targets: vec![
                "sqcqd".into(),
                "vhost-device-scsi".into(),
                "qemu-storage-daemon".into(),
            ],
            ..plan()
        };
        let cells: Vec<(String, String)> = plan
            .cells()
            .into_iter()
            .map(|c| (c.device, c.target))
            .collect();
        let pair = |d: &str, t: &str| (d.to_string(), t.to_string());
        assert_eq!(
            cells,
            [
                pair("scsi", "sqcqd"),
                pair("scsi", "vhost-device-scsi"),
                pair("blk", "sqcqd"),
                pair("blk", "qemu-storage-daemon"),
            ]
        );
    }

    #[test]
    fn the_workers_axis_expands_sqcqd_cells_only() {
        let plan = Plan {
            targets: vec!["sqcqd".into(), "vhost-device-scsi".into()],
            qd: vec![1, 32],
            workers: vec![1, 2, 4],
            ..plan()
        };
        assert!(plan.sweeps_workers());
        let groups = plan.groups();
        // sqcqd QD1, sqcqd QD32, then the peer's two.
        assert_eq!(groups.len(), 4);
        let workers = |g: &[Cell]| g.iter().map(|c| c.workers).collect::<Vec<_>>();
        assert_eq!(workers(&groups[0]), [Some(1), Some(2), Some(4)]);
        assert_eq!(workers(&groups[1]), [Some(1), Some(2), Some(4)]);
        assert_eq!(groups[1][0].qd, 32);
        assert_eq!(workers(&groups[2]), [None]);
        assert_eq!(groups[2][0].target, "vhost-device-scsi");
        // A group's cells differ in the worker count alone.
        for g in &groups {
            assert!(
                g.iter()
                    .all(|c| c.with_workers(None) == g[0].with_workers(None))
            );
        }
        assert_eq!(plan.cells().len(), 8);
    }

    #[test]
    fn jobs_are_spread_over_the_devices() {
        let plan = Plan {
            jobs: vec![2, 4],
            device_count: 2,
            ..plan()
        };
        plan.check().unwrap();
        let shape: Vec<(u32, u32, u32)> = plan
            .cells()
            .iter()
            .map(|c| (c.jobs, c.device_count, c.queues))
            .collect();
        assert_eq!(shape, [(2, 2, 1), (4, 2, 2)]);
    }

    #[test]
    fn plans_that_cannot_run_are_refused() {
        let uneven = Plan {
            jobs: vec![2, 3],
            device_count: 2,
            ..plan()
        };
        assert_eq!(
            uneven.check(),
            Err(PlanError::Uneven {
                jobs: 3,
                devices: 2
            })
        );
        let peer = Plan {
            targets: vec!["sqcqd".into(), "vhost-device-scsi".into()],
            jobs: vec![2],
            device_count: 2,
            ..plan()
        };
        assert!(matches!(
            peer.check(),
            Err(PlanError::OneDeviceTarget { .. })
        ));
        let no_workers = Plan {
            workers: vec![1, 0],
            ..plan()
        };
        assert_eq!(no_workers.check(), Err(PlanError::Empty("--workers")));
        let rbd = |targets: &[&str], device_count| Plan {
            targets: targets.iter().map(|t| (*t).to_string()).collect(),
            device_count,
            jobs: vec![device_count],
            rbd: Some("pool=p,image=i".into()),
            ..plan()
        };
        assert_eq!(rbd(&["sqcqd", "qemu-storage-daemon"], 1).check(), Ok(()));
        assert_eq!(
            rbd(&["sqcqd", "vhost-device-scsi"], 1).check(),
            Err(PlanError::RbdTarget)
        );
        assert_eq!(rbd(&["sqcqd"], 2).check(), Err(PlanError::RbdTarget));
        assert_eq!(plan().check(), Ok(()));
    }

    #[test]
    fn targets_take_turns_repeat_by_repeat() {
        let plan = Plan {
            devices: vec!["blk".into()],
            targets: vec!["sqcqd".into(), "qemu-storage-daemon".into()],
            qd: vec![1, 32],
            ..plan()
        };
        let batches = plan.batches();
        assert_eq!(batches.len(), 2, "one per depth");
        let order: Vec<(String, u32)> = schedule(&batches[0], &plan.modes, 2)
            .into_iter()
            .map(|c| (c.cell.target, c.cell.qd))
            .collect();
        let run = |t: &str| (t.to_string(), 1);
        assert_eq!(
            order,
            [
                run("sqcqd"),
                run("qemu-storage-daemon"),
                run("sqcqd"),
                run("qemu-storage-daemon")
            ]
        );
        // Every cell runs, once per batch.
        assert_eq!(batches.concat().len(), plan.cells().len());
    }

    #[test]
    fn worker_counts_and_modes_interleave_repeat_by_repeat() {
        let plan = Plan {
            modes: vec!["notify".into(), "sqcq".into()],
            workers: vec![1, 2],
            ..plan()
        };
        let group = &plan.groups()[0];
        let order: Vec<(Option<u16>, String)> = schedule(group, &plan.modes, 2)
            .into_iter()
            .map(|c| (c.cell.workers, c.mode))
            .collect();
        let case = |w: u16, m: &str| (Some(w), m.to_string());
        let round = [
            case(1, "notify"),
            case(1, "sqcq"),
            case(2, "notify"),
            case(2, "sqcq"),
        ];
        assert_eq!(order[..4], round);
        assert_eq!(order[4..], round);
    }
}
