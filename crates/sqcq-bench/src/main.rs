//! `sqcq-bench`: a fio-like load generator over sqcq's userspace
//! virtio-scsi and virtio-blk driver (crate `sqcq-driver`), against any
//! vhost-user SCSI target or vhost-user-blk disk.
//!
//! - [`args`]: the command line, in fio's vocabulary;
//! - [`target`]: a target started here;
//! - [`cpu`]: CPU time accounting, of this process and of the target's
//!   threads;
//! - [`device`]: bringing the device up and down;
//! - [`workload`], [`verify`]: which blocks, which direction, what data;
//! - [`io`]: the request layer a job drives (SCSI or blk);
//! - [`job`]: one job's submission loop on its own thread and queue;
//! - [`stats`], [`report`], [`progress`]: measuring and telling.

mod args;
mod cpu;
mod device;
mod error;
mod io;
mod job;
mod link;
mod progress;
mod report;
mod stats;
mod stats_report;
mod target;
mod verify;
mod workload;

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use serde_json::json;
use sqcq_driver::scsi::Lun;

use crate::args::{Args, OutputFormat, TargetKind};
use crate::cpu::{self_cpu_time, threads_since};
use crate::device::{Device, DeviceSpec, has_event_idx, has_indirect};
use crate::error::{BenchError, chain};
use crate::job::{Abort, Job, JobSpec, Progress};
use crate::report::{Report, TargetCpu};
use crate::target::{Target, TargetOptions, find_binary};
use crate::workload::Workload;
use sqcq_driver::{DeviceType, NotifyMode};

/// LUN size of a target started here when `--size` does not say.
const DEFAULT_LUN_SIZE: u64 = 1 << 30;

fn main() {
    let args = Args::parse();
    match run(&args) {
        Ok((report, ok)) => {
            match args.output_format {
                OutputFormat::Normal => print!("{}", report.normal()),
                OutputFormat::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&report.json()).unwrap_or_default()
                ),
            }
            for (i, job) in report.jobs.iter().enumerate() {
                if let Err(e) = job {
                    eprintln!("sqcq-bench: job {i} failed: {e}");
                }
            }
            std::process::exit(if ok { 0 } else { 1 });
        }
        Err(e) => {
            eprintln!("sqcq-bench: error: {}", chain(&e));
            std::process::exit(e.exit_code());
        }
    }
}

fn usage(msg: impl Into<String>) -> BenchError {
    BenchError::Usage(msg.into())
}

fn check_args(args: &Args) -> Result<(), BenchError> {
    if args.iodepth == 0 || args.numjobs == 0 {
        return Err(usage("--iodepth and --numjobs must be at least 1"));
    }
    if args.bs == 0 {
        return Err(usage("--bs must be positive"));
    }
    if args.time_based && args.runtime.is_zero() {
        return Err(usage("--time_based needs --runtime"));
    }
    let device = DeviceType::from(args.device_type);
    if args.socket.is_none() && !args.target.serves(device) {
        return Err(usage(format!(
            "--target {} does not serve --device-type {}",
            args.target.binary(),
            device.name()
        )));
    }
    if args.fua && device == DeviceType::Blk {
        return Err(usage("--fua: virtio-blk has no FUA"));
    }
    Ok(())
}

/// Starts the target `args` asks for, falling back from a missing sqcqd
/// to the public peer of the device type (vhost-device-scsi,
/// qemu-storage-daemon).
fn start_target(args: &Args, lun_size: u64) -> Result<Target, BenchError> {
    let keep_data = args.verify.is_some();
    let explicit = args.target_bin.as_deref();
    let device = DeviceType::from(args.device_type);
    let options = TargetOptions {
        device,
        queues: args.numjobs,
        workers: args.target_workers,
        ring_poll: args.mode == NotifyMode::RingPoll,
        stats_interval: Some(args.stats_interval),
    };
    if let Some(bin) = find_binary(args.target.binary(), explicit) {
        return Ok(Target::start(
            args.target,
            bin,
            lun_size,
            keep_data,
            options,
        )?);
    }
    if args.target == TargetKind::Sqcqd {
        let peer = TargetKind::peer(device);
        if let Some(bin) = find_binary(peer.binary(), None) {
            eprintln!(
                "sqcq-bench: warning: sqcqd not found; using {} ({}) on a sparse image instead",
                peer.binary(),
                bin.display()
            );
            return Ok(Target::start(peer, bin, lun_size, keep_data, options)?);
        }
    }
    Err(target::TargetError::NotFound {
        name: args.target.binary(),
    }
    .into())
}

fn run(args: &Args) -> Result<(Report, bool), BenchError> {
    check_args(args)?;
    let jobs_n = u64::from(args.numjobs);
    let regions = if args.verify.is_some() { jobs_n } else { 1 };
    let mut target = match &args.socket {
        Some(_) => None,
        None => {
            let size = args.size.unwrap_or(DEFAULT_LUN_SIZE);
            let lun_size = size
                .checked_mul(regions)
                .and_then(|s| s.checked_add(args.offset))
                .ok_or_else(|| usage("--size x --numjobs + --offset overflows"))?;
            Some(start_target(args, lun_size)?)
        }
    };
    let socket = match (&args.socket, &target) {
        (Some(s), _) => s.clone(),
        (None, Some(t)) => t.socket().to_owned(),
        (None, None) => unreachable!("a target was started when no socket was given"),
    };
    let lun = Lun::new(args.scsi_target, args.lun).ok_or_else(|| usage("--lun is above 16383"))?;
    let device_type = DeviceType::from(args.device_type);
    let spec = DeviceSpec {
        device: device_type,
        queues: args.numjobs,
        queue_size: args.queue_size,
        iodepth: args.iodepth,
        bs: args.bs,
        mode: args.mode,
        poll_threads: args.poll_threads.into(),
        event_idx: !args.no_event_idx,
        indirect: !args.no_indirect,
        timeout: args.io_timeout,
        lun,
        cdb: args.cdb.into(),
        fua: args.fua,
        reconnect: args.reconnect,
    };
    for note in target.iter().flat_map(|t| t.notes()) {
        eprintln!("sqcq-bench: warning: {note}");
    }
    let mut device = Device::open(&socket, &spec)?;
    if let Some(f) = &device.fallback {
        eprintln!(
            "sqcq-bench: warning: --mode {} falls back to {}: {}",
            f.requested, f.used, f.reason
        );
    }
    let poll_stats = device.poll_stats();

    let cap = device.info.capacity;
    let block = u64::from(cap.block_size);
    if !args.bs.is_multiple_of(block) || !args.offset.is_multiple_of(block) {
        return Err(usage(format!(
            "--bs and --offset must be multiples of the device's {block}-byte blocks"
        )));
    }
    let capacity = cap
        .bytes()
        .ok_or(BenchError::Protocol("capacity overflows"))?;
    let size = args
        .size
        .unwrap_or_else(|| capacity.saturating_sub(args.offset) / regions);
    if size < args.bs || args.offset + size * regions > capacity {
        return Err(usage(format!(
            "the region ({} job region(s) of {size} bytes at {}) does not fit the LUN's {capacity} bytes, or is smaller than --bs",
            regions, args.offset
        )));
    }
    let units = size / args.bs;
    let blocks = u32::try_from(args.bs / block).map_err(|_| usage("--bs too large"))?;

    let queues = std::mem::take(&mut device.queues);
    let mut jobs = Vec::new();
    for (i, q) in queues.into_iter().enumerate() {
        let region = if args.verify.is_some() { i as u64 } else { 0 };
        let spec = JobSpec {
            id: i,
            first_lba: (args.offset + region * size) / block,
            blocks,
            bs: args.bs,
            workload: Workload::new(
                units,
                args.rw.random(),
                args.rw.read_percent(args.rwmixread),
                0x5eed_0000 + i as u64,
            ),
            verify: args.verify.is_some(),
            size,
            time_based: args.time_based,
            runtime: (!args.runtime.is_zero()).then_some(args.runtime),
            ramp: args.ramp_time,
            bursts: args.bursts.max(1),
            idle_timeout: args.io_timeout,
        };
        jobs.push(Job::new(
            spec,
            q,
            device.guest.clone(),
            Arc::clone(&device.link),
        )?);
    }

    let progress: Vec<Arc<Progress>> = jobs.iter().map(|_| Arc::default()).collect();
    let abort = Arc::new(Abort::default());
    let expected = (!args.runtime.is_zero()).then(|| args.ramp_time + args.runtime);
    let line = progress::Line::new(args.eta, progress.clone(), expected, size * jobs_n);
    let line = line.map(|l| std::thread::spawn(move || l.run()));

    let ramp = if args.verify.is_some() {
        Duration::ZERO
    } else {
        args.ramp_time
    };
    let (cpu0, tcpu0, results) = std::thread::scope(|s| {
        let handle = s.spawn(|| job::run_all(jobs, &progress, &abort));
        if !args.stats_interval.is_zero() {
            let reporter = stats_report::Periodic {
                interval: args.stats_interval,
                driver: poll_stats.clone(),
                target: target.as_ref(),
                jobs: &progress,
            };
            s.spawn(move || reporter.run());
        }
        // The process-wide figures are taken at the end of the ramp, like
        // the jobs' own.
        std::thread::sleep(ramp);
        let cpu0 = self_cpu_time();
        let tcpu0 = target
            .as_ref()
            .map(|t| (t.cpu_time(), t.thread_cpu_times()));
        let results = handle
            .join()
            .unwrap_or_else(|_| vec![Err(BenchError::Panic(0))]);
        (cpu0, tcpu0, results)
    });
    let driver_cpu = self_cpu_time().since(&cpu0);
    let target_cpu = target
        .as_ref()
        .zip(tcpu0)
        .map(|(t, (cpu0, threads0))| TargetCpu {
            pid: t.pid(),
            name: t.kind().binary(),
            cpu: t.cpu_time().since(&cpu0),
            threads: threads_since(&t.thread_cpu_times(), &threads0),
        });
    if let Some(line) = line {
        let _ = line.join();
    }

    let ok = results.iter().all(Result::is_ok);
    let neg = device.negotiated().clone();
    let inq = device.info.inquiry.clone();
    let (vendor, product) = inq.as_ref().map_or((String::new(), String::new()), |i| {
        (i.vendor.clone(), i.product.clone())
    });
    let what = match device_type {
        DeviceType::Scsi => format!(
            "{vendor} {product}, LUN {lun}: {} blocks of {} B ({} LUN(s) reported)",
            cap.blocks, cap.block_size, device.info.luns
        ),
        DeviceType::Blk => format!(
            "virtio-blk disk, serial {:?}: {} blocks of {} B",
            device.info.serial.as_deref().unwrap_or(""),
            cap.blocks,
            cap.block_size
        ),
    };
    let device_line = format!(
        "device: {what}; {} request queue(s), event_idx={}, indirect={}, protocol features {:?}",
        neg.request_queues(),
        has_event_idx(&neg),
        has_indirect(&neg),
        neg.protocol_acked
    );
    let device_json = json!({
        "device_type": device_type.name(),
        "serial": device.info.serial,
        "vendor": vendor,
        "product": product,
        "blocks": cap.blocks,
        "block_size": cap.block_size,
        "features_offered": format!("{:#x}", neg.offered),
        "features_acked": format!("{:#x}", neg.acked),
        "event_idx": has_event_idx(&neg),
        "indirect": has_indirect(&neg),
        "request_queues": neg.request_queues(),
        "target": target.as_ref().map(|t| t.kind().binary()),
    });
    let mode = device.mode;
    let fallback = device.fallback.clone();
    let reconnects = device.link.reconnects();
    if let Err(e) = device.close() {
        // With --reconnect the device may be restarting as the run ends:
        // every I/O completed already, so its results stand.
        if ok && !reconnects {
            return Err(e);
        }
        eprintln!("sqcq-bench: warning: clean stop failed: {}", chain(&e));
    }
    let device_stats = target.as_mut().and_then(|t| {
        t.wait_exit();
        t.device_stats()
    });
    let driver_queues = poll_stats.as_ref().map(|p| (p.snapshot(), p.calls()));
    stats_report::final_lines(driver_queues.as_ref(), device_stats.as_ref());
    let mut sqcq_extra = serde_json::Map::new();
    sqcq_extra.insert("mode_requested".into(), json!(args.mode.name()));
    if let Some(f) = &fallback {
        sqcq_extra.insert(
            "mode_fallback".into(),
            json!({"requested": f.requested.name(), "used": f.used.name(), "reason": f.reason}),
        );
    }
    if mode == NotifyMode::Sqcq {
        sqcq_extra.insert("poll_threads".into(), json!(spec.poll_threads.name()));
    } else if mode == NotifyMode::SqcqInline {
        // Each job is its queue's CQ consumer.
        sqcq_extra.insert("poll_threads".into(), json!("none"));
    }
    if let Some((stats, calls)) = &driver_queues {
        sqcq_extra.insert(
            "driver_queues".into(),
            stats_report::queues_json(stats, calls),
        );
    }
    if let Some(d) = device_stats {
        sqcq_extra.insert("device_stats".into(), d);
    }
    let report = Report {
        name: args.name.clone(),
        device_type: device_type.name(),
        rw: args.rw.name(),
        bs: args.bs,
        iodepth: args.iodepth,
        mode: mode.name(),
        sqcq_extra,
        device: device_line,
        device_json,
        jobs: results
            .into_iter()
            .map(|r| r.map_err(|e| chain(&e)))
            .collect(),
        driver_cpu,
        target: target_cpu,
    };
    Ok((report, ok))
}
