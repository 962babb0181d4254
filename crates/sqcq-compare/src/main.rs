//! `sqcq-compare`: the RFC's tables, measured on the machine at hand.
//!
//! Runs `sqcq-bench` over the matrix device type × target × rw × queue
//! depth × jobs × mode (by default SCSI × sqcqd × randread and randwrite ×
//! QD1 and QD32 × 1, 2 and 4 jobs × every notification mode), each run
//! starting its own target with a null LUN or disk,
//! modes interleaved within each cell so that they see the same machine.
//! Prints IOPS per mode with the change against `notify`, p50 latency,
//! kicks+calls per I/O and CPU microseconds per I/O of each side; writes
//! every raw result and the summary as JSON, and a bar chart as SVG.

mod matrix;
mod plot;
mod report;
mod run;

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
    /// Notification modes, the first one is the baseline.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "notify,poll-queue,ring-poll,sqcq,sqcq-inline"
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
    /// I/O patterns.
    #[arg(long, value_delimiter = ',', default_value = "randread,randwrite")]
    rw: Vec<String>,
    /// Queue depths.
    #[arg(long, value_delimiter = ',', default_value = "1,32")]
    qd: Vec<u32>,
    /// Job counts (each job its own request queue).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    jobs: Vec<u32>,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 2.0)]
    runtime: f64,
    /// Warm-up seconds per run.
    #[arg(long, default_value_t = 0.5)]
    ramp: f64,
    /// Runs per cell and mode; the median is reported.
    #[arg(long, default_value_t = 1)]
    repeat: u32,
    /// Longer runs: 10 s measured, 2 s warm-up, 3 repeats.
    #[arg(long)]
    long: bool,
    /// Worker threads of each sqcqd started (its `--workers`).
    #[arg(long, default_value_t = 1)]
    target_workers: u16,
    /// Block size.
    #[arg(long, default_value = "4k")]
    bs: String,
    /// The load generator (default: sqcq-bench next to this program).
    #[arg(long)]
    bench: Option<PathBuf>,
    /// Directory for results.json and iops.svg (default target/compare).
    #[arg(long, default_value = "target/compare")]
    out: PathBuf,
}

fn main() -> ExitCode {
    let mut args = Args::parse();
    if args.long {
        args.runtime = 10.0;
        args.ramp = 2.0;
        args.repeat = 3;
    }
    let bench = match args.bench.clone().map_or_else(run::default_bench, Ok) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("sqcq-compare: {e}");
            return ExitCode::from(2);
        }
    };
    let plan = matrix::Plan {
        modes: args.modes.clone(),
        devices: args.devices.clone(),
        targets: args.targets.clone(),
        rw: args.rw.clone(),
        qd: args.qd.clone(),
        jobs: args.jobs.clone(),
        bs: args.bs.clone(),
        target_workers: args.target_workers,
        runtime: Duration::from_secs_f64(args.runtime),
        ramp: Duration::from_secs_f64(args.ramp),
        repeat: args.repeat.max(1),
    };
    let results = match matrix::run_all(&bench, &plan) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sqcq-compare: {e}");
            return ExitCode::FAILURE;
        }
    };
    let machine = report::Machine::read();
    print!("{}", report::render(&plan, &results, &machine));
    if let Err(e) = report::write_outputs(&args.out, &plan, &results, &machine) {
        eprintln!("sqcq-compare: cannot write results: {e}");
        return ExitCode::FAILURE;
    }
    println!(
        "\nresults: {}/results.json, plot: {}/iops.svg",
        args.out.display(),
        args.out.display()
    );
    if results.iter().any(|r| r.failed.is_some()) {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
