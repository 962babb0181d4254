//! The benchmark matrix and its execution order.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use crate::run::{self, Case, Cell, Figures, RunError};

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
    /// Job counts.
    pub jobs: Vec<u32>,
    /// Block size.
    pub bs: String,
    /// Worker threads of each sqcqd.
    pub target_workers: u16,
    /// Measured time per run.
    pub runtime: Duration,
    /// Warm-up per run.
    pub ramp: Duration,
    /// Runs per cell and mode.
    pub repeat: u32,
}

impl Plan {
    /// The cells in report order: by device type, then target (each
    /// target with the device types it serves), rw, depth, jobs.
    pub fn cells(&self) -> Vec<Cell> {
        let mut cells = Vec::new();
        for device in &self.devices {
            for target in self.targets.iter().filter(|t| serves(t, device)) {
                for rw in &self.rw {
                    for &qd in &self.qd {
                        for &jobs in &self.jobs {
                            cells.push(Cell {
                                device: device.clone(),
                                target: target.clone(),
                                rw: rw.clone(),
                                qd,
                                jobs,
                            });
                        }
                    }
                }
            }
        }
        cells
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
    /// Every repeat's figures.
    pub repeats: Vec<Figures>,
    /// The first failure, if no repeat succeeded.
    pub failed: Option<String>,
    /// The raw JSON of the median run.
    pub raw: Option<serde_json::Value>,
}

/// Runs every case. Within a cell the modes are interleaved, repeat by
/// repeat, so that slow drifts of the machine hit every mode alike.
pub fn run_all(bench: &Path, plan: &Plan) -> Result<Vec<Outcome>, RunError> {
    let cells = plan.cells();
    let total = cells.len() * plan.modes.len() * plan.repeat as usize;
    let mut done = 0;
    let mut outcomes = Vec::new();
    for cell in cells {
        let mut runs: Vec<Vec<(Figures, serde_json::Value)>> = vec![Vec::new(); plan.modes.len()];
        let mut errors: Vec<Option<String>> = vec![None; plan.modes.len()];
        for _ in 0..plan.repeat {
            for (i, mode) in plan.modes.iter().enumerate() {
                let case = Case {
                    cell: cell.clone(),
                    mode: mode.clone(),
                };
                done += 1;
                eprint!("\r[{done}/{total}] {} {mode:<12}", cell.label());
                match run::run_once(bench, &case, plan) {
                    Ok(r) => runs[i].push(r),
                    Err(RunError::Failed { status, stderr }) => {
                        eprintln!("\n  failed: {status}: {stderr}");
                        errors[i].get_or_insert(format!("{status}: {stderr}"));
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        for (i, mode) in plan.modes.iter().enumerate() {
            let case = Case {
                cell: cell.clone(),
                mode: mode.clone(),
            };
            let mut mine = std::mem::take(&mut runs[i]);
            mine.sort_by(|a, b| a.0.iops.total_cmp(&b.0.iops));
            let repeats: Vec<Figures> = mine.iter().map(|(f, _)| f.clone()).collect();
            let median = mine.get(mine.len() / 2).cloned();
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
mod tests {
    use super::*;

    #[test]
    fn cells_follow_the_rfc_order() {
        let plan = Plan {
            modes: vec!["notify".into()],
            devices: vec!["scsi".into()],
            targets: vec!["sqcqd".into()],
            rw: vec!["randread".into(), "randwrite".into()],
            qd: vec![1, 32],
            jobs: vec![1, 4],
            bs: "4k".into(),
            target_workers: 1,
            runtime: Duration::from_secs(1),
            ramp: Duration::ZERO,
            repeat: 1,
        };
        let cells = plan.cells();
        assert_eq!(cells.len(), 8);
        let key = |c: &Cell| (c.rw.clone(), c.qd, c.jobs);
        assert_eq!(key(&cells[0]), ("randread".into(), 1, 1));
        assert_eq!(key(&cells[3]), ("randread".into(), 32, 4));
        assert_eq!(key(&cells[4]), ("randwrite".into(), 1, 1));
    }

    #[test]
    fn each_target_runs_the_device_types_it_serves() {
        let plan = Plan {
            modes: vec!["notify".into()],
            devices: vec!["scsi".into(), "blk".into()],
            targets: vec![
                "sqcqd".into(),
                "vhost-device-scsi".into(),
                "qemu-storage-daemon".into(),
            ],
            rw: vec!["randread".into()],
            qd: vec![1],
            jobs: vec![1],
            bs: "4k".into(),
            target_workers: 1,
            runtime: Duration::from_secs(1),
            ramp: Duration::ZERO,
            repeat: 1,
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
}
