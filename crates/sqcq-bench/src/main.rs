//! `sqcq-bench`: a fio-like load generator over sqcq's userspace
//! virtio-scsi and virtio-blk driver (crate `sqcq-driver`), against any
//! vhost-user-scsi or vhost-user-blk device.
//!
//! - [`args`]: the command line, in fio's vocabulary;
//! - [`target`]: a target started here, [`sqcqd_config`] when it serves
//!   several devices;
//! - [`cpu`]: CPU time accounting, of this process and of the target's
//!   threads;
//! - [`device`]: bringing the device up and down;
//! - [`workload`], [`verify`]: which blocks, which direction, what data;
//! - [`io`]: the request layer a job drives (SCSI or blk);
//! - [`job`]: one job's submission loop on its own thread and queue;
//! - [`stats`], [`report`], [`progress`]: measuring and telling;
//! - [`manual`]: `sqcq-bench man`, the man page from [`args`].

mod args;
mod cpu;
mod device;
mod error;
mod io;
mod job;
mod link;
mod manual;
mod progress;
mod report;
mod sqcqd_config;
mod stats;
mod stats_report;
mod target;
mod verify;
mod workload;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::{Value, json};
use sqcq_driver::scsi::Lun;

use crate::args::{Args, OutputFormat, RingLayout, TargetKind, ThrottleArg};
use crate::cpu::{self_cpu_time, threads_since};
use crate::device::{Device, DeviceSpec, has_event_idx, has_indirect};
use crate::error::{BenchError, chain};
use crate::job::{Abort, Job, JobSpec, Progress};
use crate::link::Link;
use crate::report::{Report, TargetCpu};
use crate::target::{Disk, Target, TargetOptions, find_binary};
use crate::workload::Workload;
use sqcq_driver::{DeviceType, NotifyMode};

/// LUN size of a target started here when `--size` does not say.
const DEFAULT_LUN_SIZE: u64 = 1 << 30;

fn main() {
    if let Some(code) = manual::run() {
        std::process::exit(code);
    }
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
    let disk_option = match (&args.target_rbd, &args.target_file) {
        (Some(_), _) => Some(("--target-rbd", "an RBD image")),
        (None, Some(_)) => Some(("--target-file", "an existing file")),
        (None, None) => None,
    };
    if let Some((option, what)) = disk_option {
        if !args.socket.is_empty() || args.target == TargetKind::VhostDeviceScsi {
            return Err(usage(format!(
                "{option}: only a sqcqd or qemu-storage-daemon started here serves {what}"
            )));
        }
        if args.devices > 1 {
            return Err(usage(format!("{option}: one device only")));
        }
    }
    if args.devices > 1 && !args.socket.is_empty() {
        return Err(usage(
            "--devices is for a target started here: give --socket once per device instead",
        ));
    }
    if args.devices > 1 && args.target != TargetKind::Sqcqd {
        return Err(usage(format!(
            "--devices {}: only sqcqd serves several devices in one process, not {}",
            args.devices,
            args.target.binary()
        )));
    }
    if args.socket.is_empty() && !args.target.serves(device) {
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
/// qemu-storage-daemon) when one device will do.
fn start_target(args: &Args, lun_size: u64) -> Result<Target, BenchError> {
    let keep_data = args.verify.is_some();
    let explicit = args.target_bin.as_deref();
    let device = DeviceType::from(args.device_type);
    let options = TargetOptions {
        device,
        devices: args.devices,
        queues: args.numjobs,
        workers: args.target_workers,
        poll: match args.target_poll {
            Some(p) => Some(p.name()),
            None if args.mode == NotifyMode::RingPoll => Some("ring"),
            None => None,
        },
        stats_interval: Some(args.stats_interval),
        disk: match (&args.target_rbd, &args.target_file) {
            (Some(rbd), _) => Disk::Rbd(rbd),
            (None, Some(path)) => Disk::File(path),
            (None, None) => Disk::Scratch,
        },
        cpus: args.target_cpus.as_deref(),
        packed: args.ring == RingLayout::Packed,
        extra: &args.target_arg,
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
    if args.target == TargetKind::Sqcqd && args.devices == 1 {
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

/// Where one device's jobs run: the LUN's block size and each job's
/// region of it.
struct Region {
    /// The device's block size in bytes.
    block: u64,
    /// Bytes of each job's region.
    size: u64,
    /// Blocks per I/O.
    blocks: u32,
}

impl Region {
    /// Checks `--bs`, `--offset` and `--size` against `device` (whose
    /// `regions` job regions lie side by side with `--verify`, one shared
    /// region without).
    fn of(args: &Args, device: &Device, regions: u64) -> Result<Self, BenchError> {
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
        let blocks = u32::try_from(args.bs / block).map_err(|_| usage("--bs too large"))?;
        Ok(Self {
            block,
            size,
            blocks,
        })
    }

    /// The job numbered `id` in the run, on the device's request queue
    /// `q`: with `--verify` in the queue's own region.
    fn job(&self, args: &Args, id: usize, q: usize) -> JobSpec {
        let region = if args.verify.is_some() { q as u64 } else { 0 };
        JobSpec {
            id,
            first_lba: (args.offset + region * self.size) / self.block,
            blocks: self.blocks,
            bs: args.bs,
            workload: Workload::new(
                self.size / args.bs,
                args.rw.random(),
                args.rw.read_percent(args.rwmixread),
                (0x5eed_0000 + id as u64) ^ (u64::from(args.randseed) << 32),
            ),
            verify: args.verify.is_some(),
            verify_only: args.verify_only,
            verify_seed: job::verify_seed(id, args.randseed),
            size: self.size,
            time_based: args.time_based,
            runtime: (!args.runtime.is_zero()).then_some(args.runtime),
            ramp: args.ramp_time,
            bursts: args.bursts.max(1),
            batch_submit: match args.iodepth_batch_submit {
                0 => u16::MAX,
                n => n,
            },
            idle_timeout: args.io_timeout,
            honour_throttle: args.throttle == ThrottleArg::Honour,
            rate_interval: (args.rate_iops > 0).then(|| 1_000_000_000 / u64::from(args.rate_iops)),
        }
    }
}

/// One line about the devices and what was negotiated, and the same for
/// JSON; several devices were opened with one spec, so the first stands
/// for all, with their number.
fn describe(
    devices: &[Device],
    device_type: DeviceType,
    lun: Lun,
    target: Option<&'static str>,
) -> (String, Value) {
    let device = &devices[0];
    let cap = device.info.capacity;
    let neg = device.negotiated();
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
    let count = if devices.len() > 1 {
        format!("{} devices, each: ", devices.len())
    } else {
        String::new()
    };
    let line = format!(
        "device: {count}{what}; {} request queue(s), event_idx={}, indirect={}, protocol features {:?}",
        neg.request_queues(),
        has_event_idx(neg),
        has_indirect(neg),
        neg.protocol_acked
    );
    let json = json!({
        "device_type": device_type.name(),
        "devices": devices.len(),
        "serial": device.info.serial,
        "vendor": vendor,
        "product": product,
        "blocks": cap.blocks,
        "block_size": cap.block_size,
        "features_offered": format!("{:#x}", neg.offered),
        "features_acked": format!("{:#x}", neg.acked),
        "event_idx": has_event_idx(neg),
        "indirect": has_indirect(neg),
        "request_queues": neg.request_queues(),
        "target": target,
    });
    (line, json)
}

/// Brings up the device at `socket`; with `--reconnect`, a set-up that
/// fails (no daemon listening yet, or one that went away in the middle of
/// it) starts again until the reconnect timeout, as the later connections
/// do.
fn open_device(socket: &std::path::Path, spec: &DeviceSpec) -> Result<Device, BenchError> {
    let deadline = spec.reconnect.map(|t| Instant::now() + t);
    loop {
        match Device::open(socket, spec) {
            Err(e)
                if !matches!(e, BenchError::Usage(_))
                    && deadline.is_some_and(|d| Instant::now() < d) =>
            {
                eprintln!(
                    "sqcq-bench: warning: {}: set-up failed, connecting again: {}",
                    socket.display(),
                    chain(&e)
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            result => return result,
        }
    }
}

/// `--mem-table-interval`: sends every device its memory table again
/// every `interval` until the jobs are done; says how often on stderr.
fn resend_mem_tables(interval: Duration, links: Vec<Arc<Link>>, progress: &[Arc<Progress>]) {
    let (mut sent, mut failed) = (0u64, 0u64);
    let done = || progress.iter().all(|p| p.done.load(Ordering::Relaxed));
    let mut next = Instant::now() + interval;
    while !done() {
        if Instant::now() < next {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        next += interval;
        for link in &links {
            match link.resend_mem_table() {
                Ok(true) => sent += 1,
                Ok(false) => {}
                Err(e) => {
                    failed += 1;
                    eprintln!("sqcq-bench: SET_MEM_TABLE again: {}", chain(&e));
                }
            }
        }
    }
    eprintln!("sqcq-bench: memory table sent again {sent} times, {failed} failed");
}

fn run(args: &Args) -> Result<(Report, bool), BenchError> {
    check_args(args)?;
    let jobs_n = u64::from(args.numjobs);
    let regions = if args.verify.is_some() { jobs_n } else { 1 };
    let mut target = if args.socket.is_empty() {
        let size = args.size.unwrap_or(DEFAULT_LUN_SIZE);
        let lun_size = size
            .checked_mul(regions)
            .and_then(|s| s.checked_add(args.offset))
            .ok_or_else(|| usage("--size x --numjobs + --offset overflows"))?;
        Some(start_target(args, lun_size)?)
    } else {
        None
    };
    let sockets = match &target {
        Some(t) => t.sockets().to_vec(),
        None => args.socket.clone(),
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
        packed: args.ring == RingLayout::Packed,
        huge_pages: args.hugepages,
        timeout: args.io_timeout,
        lun,
        cdb: args.cdb.into(),
        fua: args.fua,
        reconnect: args.reconnect,
    };
    for note in target.iter().flat_map(|t| t.notes()) {
        eprintln!("sqcq-bench: warning: {note}");
    }
    let mut devices = sockets
        .iter()
        .map(|socket| open_device(socket, &spec))
        .collect::<Result<Vec<_>, _>>()?;
    for (d, device) in devices.iter().enumerate() {
        if let Some(f) = &device.fallback {
            let which = if devices.len() > 1 {
                format!("device {d}: ")
            } else {
                String::new()
            };
            eprintln!(
                "sqcq-bench: warning: {which}--mode {} falls back to {}: {}",
                f.requested, f.used, f.reason
            );
        }
    }
    if devices.iter().any(|d| d.mode != devices[0].mode) {
        return Err(usage(
            "the devices do not all offer what --mode needs: one would run another mode",
        ));
    }
    let poll_stats = devices
        .iter()
        .filter_map(Device::poll_stats)
        .reduce(|mut all, more| {
            all.extend(more);
            all
        });

    let mut jobs = Vec::new();
    let mut total_bytes = 0;
    for device in &mut devices {
        let region = Region::of(args, device, regions)?;
        total_bytes += region.size * jobs_n;
        let queues = std::mem::take(&mut device.queues);
        for (q, queue) in queues.into_iter().enumerate() {
            let id = jobs.len();
            jobs.push(Job::new(
                region.job(args, id, q),
                queue,
                device.guest.clone(),
                Arc::clone(&device.link),
            )?);
        }
    }

    let progress: Vec<Arc<Progress>> = jobs.iter().map(|_| Arc::default()).collect();
    let abort = Arc::new(Abort::default());
    let expected = (!args.runtime.is_zero()).then(|| args.ramp_time + args.runtime);
    let line = progress::Line::new(args.eta, progress.clone(), expected, total_bytes);
    let line = line.map(|l| std::thread::spawn(move || l.run()));

    let ramp = if args.verify.is_some() {
        Duration::ZERO
    } else {
        args.ramp_time
    };
    let (cpu0, tcpu0, results) = std::thread::scope(|s| {
        let handle = s.spawn(|| job::run_all(jobs, &progress, &abort));
        if !args.mem_table_interval.is_zero() {
            let links: Vec<_> = devices.iter().map(|d| Arc::clone(&d.link)).collect();
            s.spawn(|| resend_mem_tables(args.mem_table_interval, links, &progress));
        }
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
    let (device_line, device_json) = describe(
        &devices,
        device_type,
        lun,
        target.as_ref().map(|t| t.kind().binary()),
    );
    let mode = devices[0].mode;
    let fallback = devices[0].fallback.clone();
    let reconnects = devices.iter().any(|d| d.link.reconnects());
    let stopped: Vec<_> = devices.into_iter().map(Device::close).collect();
    if let Some(Err(e)) = stopped.into_iter().find(Result::is_err) {
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
