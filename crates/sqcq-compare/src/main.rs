//! `sqcq-compare`: the RFC's tables, measured on the machine at hand.
//!
//! Runs `sqcq-bench` over the matrix device type × target × rw × queue
//! depth × jobs × sqcqd workers × mode (by default SCSI × sqcqd ×
//! randread and randwrite × QD1 and QD32 × 1, 2 and 4 jobs × one worker ×
//! every notification mode), each run starting its own target with a null
//! LUN or disk (or several, `--device-count`), modes and worker counts
//! interleaved within each cell so that they see the same machine.
//! Prints IOPS per mode with the change against `notify`, p50 latency,
//! kicks+calls per I/O and CPU microseconds per I/O of each side; writes
//! every raw result and the summary as JSON, and a bar chart as SVG. With
//! a workers axis (`--workers 1,2`, or the `--scaling` preset) it adds the
//! IOPS per worker count as ratios against the first, and its chart.

mod format;
mod machine;
mod matrix;
mod plot;
mod report;
mod run;
mod scaling;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

/// Command line.
#[derive(Debug, Parser)]
#[command(
    version,
    about = "Runs the RFC's benchmark matrix over every notification mode"
)]
struct Args {
    /// Notification modes, the first one is the baseline: sqcq-bench's
    /// `--mode`, except `notify`, classic virtio on both sides (sqcqd
    /// `--poll kick`), and `auto` and `ring`, the same unmodified driver
    /// against sqcqd's default (`--poll auto`) and `--poll ring`.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "notify,auto,poll-queue,ring-poll,sqcq,sqcq-inline"
    )]
    modes: Vec<String>,
    /// Device types: scsi (vhost-user-scsi), blk (vhost-user-blk).
    #[arg(long, value_delimiter = ',', default_value = "scsi")]
    devices: Vec<String>,
    /// Targets the bench starts: sqcqd (both device types); the public
    /// peers rust-vmm's vhost-device-scsi (SCSI only; one request queue; a
    /// sparse image file instead of a null LUN) and qemu-storage-daemon
    /// (blk only; a null-co node). A target runs the device types it
    /// serves.
    #[arg(long, value_delimiter = ',', default_value = "sqcqd")]
    targets: Vec<String>,
    /// I/O patterns [default: randread,randwrite; --scaling: randread].
    #[arg(long, value_delimiter = ',')]
    rw: Option<Vec<String>>,
    /// Queue depths [default: 1,32; --scaling: 32].
    #[arg(long, value_delimiter = ',')]
    qd: Option<Vec<u32>>,
    /// Job counts, over all devices, each job its own request queue
    /// [default: 1,2,4; --scaling: devices x queues, see there].
    #[arg(long, value_delimiter = ',')]
    jobs: Option<Vec<u32>>,
    /// Devices of each target (sqcqd only), all driven at once; every job
    /// count must be a multiple [default: 1; --scaling: 2].
    #[arg(long)]
    device_count: Option<u32>,
    /// Worker threads of each sqcqd started (its `--workers`), an axis of
    /// the matrix: `--workers 1,2,4` runs every cell with each count,
    /// interleaved, and reports the IOPS per count as ratios against the
    /// first [default: 1; --scaling: 1 to the CPUs this process may use].
    #[arg(long, alias = "target-workers", value_delimiter = ',')]
    workers: Option<Vec<u16>>,
    /// The multi-worker scaling preset: sqcqd workers from 1 to the CPUs
    /// this process may use, 2 devices with CPUs / 2 (rounded up, at
    /// least 2) request queues each, randread at QD32, every mode, median
    /// of 3; any option given as well wins over the preset's.
    #[arg(long)]
    scaling: bool,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 2.0)]
    runtime: f64,
    /// Warm-up seconds per run.
    #[arg(long, default_value_t = 0.5)]
    ramp: f64,
    /// Runs per cell, mode and worker count; the median is reported
    /// [default: 1; --scaling: 3].
    #[arg(long)]
    repeat: Option<u32>,
    /// Longer runs: 10 s measured, 2 s warm-up, 3 repeats.
    #[arg(long)]
    long: bool,
    /// Block size.
    #[arg(long, default_value = "4k")]
    bs: String,
    /// The load generator (default: sqcq-bench next to this program).
    #[arg(long)]
    bench: Option<PathBuf>,
    /// Serve this Ceph RBD image instead of a null disk, on every target
    /// (sqcqd with `--lun kind=rbd`, qemu-storage-daemon with QEMU's rbd
    /// driver, both with librbd's cache off), one run after the other:
    /// `pool=P,image=I[,conf=PATH][,id=USER]`. The image must exist;
    /// write it whole first, so that reads find data (scripts/bench-rbd.sh
    /// does both).
    #[arg(long)]
    rbd: Option<String>,
    /// CPUs for the targets started (`taskset -c` syntax); run this
    /// program under `taskset` too to keep the driver off them.
    #[arg(long)]
    target_cpus: Option<String>,
    /// At most this many I/Os per second per job (the bench's
    /// `--rate_iops`): an application that trickles [default: no limit].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    rate_iops: Option<u32>,
    /// Also measure this process's CPU time per I/O in each run, `NAME=PID`
    /// (repeatable): a Ceph OSD the targets share, say.
    #[arg(long, value_parser = run::Watched::parse)]
    watch: Vec<run::Watched>,
    /// Directory for results.json and iops.svg, and workers.svg with a
    /// workers axis.
    #[arg(long, default_value = "target/compare")]
    out: PathBuf,
}

impl Args {
    /// The plan: the options given, the preset's (`--scaling`, for
    /// `cpus` CPUs) for those not given, the defaults for the rest.
    fn plan(&self, cpus: usize) -> matrix::Plan {
        let list = |v: &[&str]| v.iter().map(|s| (*s).to_string()).collect::<Vec<_>>();
        let cpus = u16::try_from(cpus.max(1)).unwrap_or(u16::MAX);
        let (rw, qd, jobs, device_count, workers, repeat) = if self.scaling {
            let devices = 2;
            let queues = u32::from(cpus).div_ceil(2).max(2);
            (
                list(&["randread"]),
                vec![32],
                vec![devices * queues],
                devices,
                (1..=cpus).collect(),
                3,
            )
        } else {
            (
                list(&["randread", "randwrite"]),
                vec![1, 32],
                vec![1, 2, 4],
                1,
                vec![1],
                1,
            )
        };
        let mut plan = matrix::Plan {
            modes: self.modes.clone(),
            devices: self.devices.clone(),
            targets: self.targets.clone(),
            rw: self.rw.clone().unwrap_or(rw),
            qd: self.qd.clone().unwrap_or(qd),
            jobs: self.jobs.clone().unwrap_or(jobs),
            device_count: self.device_count.unwrap_or(device_count),
            workers: self.workers.clone().unwrap_or(workers),
            bs: self.bs.clone(),
            runtime: Duration::from_secs_f64(self.runtime),
            ramp: Duration::from_secs_f64(self.ramp),
            repeat: self.repeat.unwrap_or(repeat).max(1),
            rbd: self.rbd.clone(),
            target_cpus: self.target_cpus.clone(),
            rate_iops: self.rate_iops,
            watch: self.watch.clone(),
        };
        if self.long {
            plan.runtime = Duration::from_secs(10);
            plan.ramp = Duration::from_secs(2);
            plan.repeat = 3;
        }
        plan
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let plan = args.plan(std::thread::available_parallelism().map_or(1, usize::from));
    if let Err(e) = plan.check() {
        eprintln!("sqcq-compare: {e}");
        return ExitCode::from(2);
    }
    let bench = match args.bench.clone().map_or_else(run::default_bench, Ok) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("sqcq-compare: {e}");
            return ExitCode::from(2);
        }
    };
    let mut machine = machine::Machine::read();
    let results = match matrix::run_all(&bench, &plan) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sqcq-compare: {e}");
            return ExitCode::FAILURE;
        }
    };
    machine.load_average_end = Some(machine::load_average());
    print!("{}", report::render(&plan, &results, &machine));
    if let Err(e) = report::write_outputs(&args.out, &plan, &results, &machine) {
        eprintln!("sqcq-compare: cannot write results: {e}");
        return ExitCode::FAILURE;
    }
    println!(
        "\nresults: {out}/results.json, plot: {out}/iops.svg{}",
        if plan.sweeps_workers() {
            format!(", workers: {}/workers.svg", args.out.display())
        } else {
            String::new()
        },
        out = args.out.display(),
    );
    if results.iter().any(|r| r.failed.is_some()) {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &[&str]) -> Args {
        Args::try_parse_from(std::iter::once("sqcq-compare").chain(line.iter().copied())).unwrap()
    }

    #[test]
    fn defaults_do_not_sweep_workers() {
        let plan = args(&[]).plan(8);
        assert_eq!(plan.workers, [1]);
        assert_eq!((plan.device_count, plan.repeat), (1, 1));
        assert_eq!(plan.jobs, [1, 2, 4]);
        assert_eq!(plan.qd, [1, 32]);
        assert_eq!(plan.rw, ["randread", "randwrite"]);
        assert!(!plan.sweeps_workers());
        // The old spelling of a single count still works.
        assert_eq!(args(&["--target-workers", "2"]).plan(8).workers, [2]);
        assert_eq!(args(&["--workers", "1,2,4"]).plan(8).workers, [1, 2, 4]);
    }

    #[test]
    fn the_scaling_preset_sweeps_workers_up_to_the_cpus() {
        let plan = args(&["--scaling"]).plan(2);
        assert_eq!(plan.workers, [1, 2]);
        assert_eq!((plan.device_count, plan.jobs.as_slice()), (2, &[4][..]));
        assert_eq!(plan.rw, ["randread"]);
        assert_eq!(plan.qd, [32]);
        assert_eq!(plan.modes.len(), 6, "every mode");
        assert_eq!(plan.repeat, 3);
        plan.check().unwrap();
        let cells = plan.cells();
        assert_eq!(cells.len(), 2);
        assert!(cells.iter().all(|c| c.queues == 2 && c.device_count == 2));
        // More CPUs: enough queues for every worker.
        let plan = args(&["--scaling"]).plan(6);
        assert_eq!(plan.workers, [1, 2, 3, 4, 5, 6]);
        assert_eq!(plan.jobs, [6]);
        // What is given wins over the preset.
        let plan = args(&[
            "--scaling",
            "--workers",
            "1,3",
            "--repeat",
            "5",
            "--qd",
            "1",
        ])
        .plan(2);
        assert_eq!((plan.workers.as_slice(), plan.repeat), (&[1, 3][..], 5));
        assert_eq!((plan.qd.as_slice(), plan.device_count), (&[1][..], 2));
    }
}
