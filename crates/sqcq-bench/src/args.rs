//! The command line, in fio's vocabulary.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use sqcq_driver::scsi::CdbSize;
use sqcq_driver::sqcq::PollThreads;
use sqcq_driver::{DeviceType, NotifyMode};

/// A fio-like load generator over sqcq's userspace virtio-scsi and
/// virtio-blk driver.
///
/// Without `--socket` it starts a target itself (sqcqd with a null LUN or
/// disk, or a RAM one with `--verify`; for SCSI vhost-device-scsi on a
/// sparse image when sqcqd is not found or with `--target
/// vhost-device-scsi`; for blk qemu-storage-daemon on a null-co node, or a
/// sparse image with `--verify`, when sqcqd is not found or with `--target
/// qemu-storage-daemon`), so it runs with no set-up.
#[derive(Debug, Clone, Parser)]
#[command(name = "sqcq-bench", version)]
pub struct Args {
    /// I/O pattern.
    #[arg(long, value_enum, default_value = "randread")]
    pub rw: Rw,
    /// The device type: a vhost-user SCSI target or a vhost-user-blk disk.
    #[arg(long = "device-type", value_enum, default_value = "scsi")]
    pub device_type: DeviceTypeArg,
    /// Percentage of reads for randrw.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub rwmixread: u8,
    /// Block size of each I/O (fio suffixes: 4k, 1m; powers of 1024).
    #[arg(long, default_value = "4k", value_parser = parse_size)]
    pub bs: u64,
    /// I/Os in flight per job.
    #[arg(long, default_value_t = 1)]
    pub iodepth: u16,
    /// Make new I/Os visible to the device (publish the ring's index, or
    /// ring the SQ doorbell) every this many, as fio's
    /// `iodepth_batch_submit`: 1 (the default) hands each over as soon as
    /// it is written, so the device can start on it while the job writes
    /// the next; 0 publishes all that are ready at once.
    #[arg(
        long = "iodepth_batch_submit",
        alias = "iodepth_batch",
        default_value_t = 1
    )]
    pub iodepth_batch_submit: u16,
    /// At most this many I/Os per second per job (fio's `rate_iops`; 0:
    /// no limit): an application that trickles. I/Os are due at even
    /// intervals; the job sleeps until the next is due when none is in
    /// flight, and one due while every slot waits is issued at the next
    /// completion, never in a catch-up burst.
    #[arg(long = "rate_iops", alias = "rate-iops", default_value_t = 0)]
    pub rate_iops: u32,
    /// Jobs per device, each with its own request queue and thread.
    #[arg(long, default_value_t = 1)]
    pub numjobs: u16,
    /// Devices of a target started here (sqcqd only), each on its own
    /// socket with its own LUN or disk and `--numjobs` request queues, all
    /// driven at once by `--numjobs` jobs each. The daemon's request
    /// queues are spread evenly over its `--target-workers`: queue q of
    /// device d on worker (d x numjobs + q) mod workers.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub devices: u16,
    /// Stop after this long (seconds, or with a suffix: 500ms, 10s, 1m);
    /// 0 means no limit.
    #[arg(long, default_value = "0", value_parser = parse_time)]
    pub runtime: Duration,
    /// Run for the whole runtime, going over the region again as needed,
    /// instead of stopping once `--size` bytes are done.
    #[arg(long = "time_based")]
    pub time_based: bool,
    /// Run this long before measuring.
    #[arg(long = "ramp_time", default_value = "0", value_parser = parse_time)]
    pub ramp_time: Duration,
    /// Bytes of the region each job covers (default: the LUN from
    /// `--offset` to its end; 1 GiB for a target started here).
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Byte offset of the region.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub offset: u64,
    /// Write, then read back and check every block. With several jobs each
    /// job covers its own `--size` bytes after the previous job's.
    #[arg(long, value_enum)]
    pub verify: Option<Verify>,
    /// With `--verify`: do not write, only read every unit of the region
    /// back and check it, as fio's `verify_only`: the data of an earlier
    /// run with the same `--offset`, `--size`, `--numjobs` and
    /// `--randseed`, still on the disk.
    #[arg(long = "verify_only", requires = "verify")]
    pub verify_only: bool,
    /// Seed of the run, as fio's `randseed`: the random offsets and the
    /// verify data depend on it, and a verify check fails on a block
    /// another seed wrote (stale data: a lost write).
    #[arg(long, default_value_t = 0)]
    pub randseed: u32,
    /// Send the device the memory table again (SET_MEM_TABLE, same
    /// memory) this often while the jobs run, as a frontend does when its
    /// guest's memory changes; 0: only at the start.
    #[arg(long = "mem-table-interval", default_value = "0", value_parser = parse_time)]
    pub mem_table_interval: Duration,
    /// Set FUA on writes (SCSI; virtio-blk has no FUA).
    #[arg(long)]
    pub fua: bool,
    /// Notification mode of the request queues: notify, poll-queue,
    /// ring-poll, sqcq, sqcq-inline. The doorbell modes (sqcq, sqcq-inline)
    /// fall back to notify, with a warning, when the device does not offer
    /// VIRTIO_F_SQCQ_POLL.
    #[arg(long, default_value = "notify", value_parser = parse_mode)]
    pub mode: NotifyMode,
    /// Driver poll threads of the sqcq mode: one per device, or one per
    /// request queue (sqcq-inline has none: each job is its queue's CQ
    /// consumer).
    #[arg(long = "poll-threads", value_enum, default_value = "per-device")]
    pub poll_threads: PollThreadsArg,
    /// Print the per-queue poll statistics (the RFC's `vq[N] cq=...`
    /// lines) on stderr this often during the run (0: only at the end).
    #[arg(long = "stats-interval", default_value = "10", value_parser = parse_time)]
    pub stats_interval: Duration,
    /// Split the run into this many bursts; between two bursts each job
    /// drains its queue and, in the doorbell modes, waits (bounded by
    /// --io-timeout) until both sides' poll threads are asleep with
    /// NEED_WAKEUP set, as the doorbell flags show.
    #[arg(long, default_value_t = 1)]
    pub bursts: u32,
    /// The vhost-user socket of a running target; repeat for several
    /// devices, driven at once by `--numjobs` jobs each.
    #[arg(long)]
    pub socket: Vec<PathBuf>,
    /// The target to start when no `--socket` is given.
    #[arg(long, value_enum, default_value = "sqcqd")]
    pub target: TargetKind,
    /// The target's executable (default: next to this one, then in
    /// ../tools/bin, then in PATH).
    #[arg(long = "target-bin")]
    pub target_bin: Option<PathBuf>,
    /// Worker threads of a `sqcqd` started here (`--workers`; request
    /// queues are spread over them round robin).
    #[arg(long = "target-workers", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub target_workers: u16,
    /// Serve an existing Ceph RBD image instead of a null (or RAM) disk,
    /// on a target started here (sqcqd, qemu-storage-daemon):
    /// `pool=P,image=I[,conf=PATH][,id=USER]` (conf: `$CEPH_CONF` when
    /// not given; the user's keyring comes from the configuration). sqcqd
    /// serves it with `--lun kind=rbd,...`, qemu-storage-daemon with its
    /// `rbd` block driver, both with librbd's cache off.
    #[arg(long = "target-rbd", value_parser = RbdImage::parse)]
    pub target_rbd: Option<RbdImage>,
    /// Serve an existing file or block device (all of it) instead of a
    /// null (or RAM) disk, on a target started here (sqcqd,
    /// qemu-storage-daemon): sqcqd with `--lun kind=file,path=PATH`
    /// (io_uring, `O_DIRECT`), qemu-storage-daemon with its `file` driver,
    /// `aio=io_uring,cache.direct=on`.
    #[arg(long = "target-file", conflicts_with = "target_rbd")]
    pub target_file: Option<PathBuf>,
    /// CPUs for a target started here (`taskset -c` syntax: `0`, `0-1`),
    /// so that it and this process can be pinned apart.
    #[arg(long = "target-cpus")]
    pub target_cpus: Option<String>,
    /// How a `sqcqd` started here serves queues without
    /// VIRTIO_F_SQCQ_POLL (its `--poll`): kick, ring, or auto [default:
    /// ring in `--mode ring-poll`, sqcqd's own default otherwise].
    #[arg(long = "target-poll", value_enum)]
    pub target_poll: Option<TargetPoll>,
    /// One more argument for a `sqcqd` started here (repeat for several):
    /// `--target-arg=--spin-us --target-arg=1,50`.
    #[arg(long = "target-arg", allow_hyphen_values = true)]
    pub target_arg: Vec<String>,
    /// SCSI target id and LUN to drive.
    #[arg(long, default_value_t = 0)]
    pub lun: u16,
    /// SCSI target id.
    #[arg(long = "scsi-target", default_value_t = 0)]
    pub scsi_target: u8,
    /// CDB size of READ/WRITE.
    #[arg(long, value_enum, default_value = "auto")]
    pub cdb: CdbChoice,
    /// Descriptors per request queue.
    #[arg(long = "queue-size", default_value_t = 128)]
    pub queue_size: u16,
    /// Do not negotiate VIRTIO_RING_F_EVENT_IDX.
    #[arg(long = "no-event-idx")]
    pub no_event_idx: bool,
    /// Do not negotiate indirect descriptors.
    #[arg(long = "no-indirect")]
    pub no_indirect: bool,
    /// The virtqueue layout: split, or packed (VIRTIO_F_RING_PACKED, which
    /// the device must offer: `sqcqd --packed`, passed to a started
    /// sqcqd). Every mode runs on either.
    #[arg(long, value_enum, default_value = "split")]
    pub ring: RingLayout,
    /// Back the driver's memory (rings, headers, data buffers) with huge
    /// pages (a hugetlb memfd): fewer TLB misses on both sides, since the
    /// device maps the same pages. Needs huge pages reserved in
    /// /proc/sys/vm/nr_hugepages.
    #[arg(long)]
    pub hugepages: bool,
    /// Bound on every wait for the device, in seconds.
    #[arg(long = "io-timeout", default_value = "30", value_parser = parse_time)]
    pub io_timeout: Duration,
    /// What a job does when the device sets THROTTLE in its SQ doorbell
    /// (doorbell modes; spec section "Backpressure"): honour (hold new
    /// I/Os back while some are in flight, as a driver should) or ignore
    /// (publish them anyway; they wait on the ring).
    #[arg(long, value_enum, default_value = "honour")]
    pub throttle: ThrottleArg,
    /// Survive restarts of the device: negotiate in-flight tracking, and
    /// when the device hangs up, connect again (retrying for this many
    /// seconds) and go on with the I/Os in flight, which the restarted
    /// device resubmits. The first connection is retried as long when no
    /// device listens yet or the set-up fails half-way.
    #[arg(long = "reconnect", value_parser = parse_time)]
    pub reconnect: Option<Duration>,
    /// Output format.
    #[arg(long = "output-format", value_enum, default_value = "normal")]
    pub output_format: OutputFormat,
    /// Progress line on stderr: auto (when stderr is a terminal), always,
    /// never.
    #[arg(long, value_enum, default_value = "auto")]
    pub eta: Eta,
    /// Job name in the report.
    #[arg(long, default_value = "job")]
    pub name: String,
}

/// `--rw`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Rw {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random reads.
    Randread,
    /// Random writes.
    Randwrite,
    /// Random mixed reads and writes (`--rwmixread`).
    Randrw,
}

impl Rw {
    /// Whether offsets are random.
    pub fn random(self) -> bool {
        matches!(self, Self::Randread | Self::Randwrite | Self::Randrw)
    }

    /// The share of reads in percent.
    pub fn read_percent(self, rwmixread: u8) -> u8 {
        match self {
            Self::Read | Self::Randread => 100,
            Self::Write | Self::Randwrite => 0,
            Self::Randrw => rwmixread,
        }
    }

    /// fio's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Randread => "randread",
            Self::Randwrite => "randwrite",
            Self::Randrw => "randrw",
        }
    }
}

/// `--target-poll`: sqcqd's `--poll`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TargetPoll {
    /// Classic virtio: the device sleeps until the driver kicks.
    Kick,
    /// The device polls the avail ring with notifications off.
    Ring,
    /// Kicks while a queue trickles, ring polling while it is busy.
    Auto,
}

impl TargetPoll {
    /// The value of sqcqd's `--poll`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Kick => "kick",
            Self::Ring => "ring",
            Self::Auto => "auto",
        }
    }
}

/// `--device-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeviceTypeArg {
    /// virtio-scsi (vhost-user-scsi).
    Scsi,
    /// virtio-blk (vhost-user-blk).
    Blk,
}

impl From<DeviceTypeArg> for DeviceType {
    fn from(d: DeviceTypeArg) -> Self {
        match d {
            DeviceTypeArg::Scsi => Self::Scsi,
            DeviceTypeArg::Blk => Self::Blk,
        }
    }
}

/// `--poll-threads`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PollThreadsArg {
    /// One driver poll thread per device.
    PerDevice,
    /// One driver poll thread per request queue.
    PerQueue,
}

impl From<PollThreadsArg> for PollThreads {
    fn from(p: PollThreadsArg) -> Self {
        match p {
            PollThreadsArg::PerDevice => Self::PerDevice,
            PollThreadsArg::PerQueue => Self::PerQueue,
        }
    }
}

/// `--verify`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Verify {
    /// A header per block with its LBA and a CRC-32C of the block.
    Crc32c,
}

/// `--target-rbd`: an RBD image a started target serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdImage {
    /// The pool.
    pub pool: String,
    /// The image.
    pub image: String,
    /// The Ceph configuration file.
    pub conf: Option<String>,
    /// The cephx user, without `client.`.
    pub id: Option<String>,
}

impl RbdImage {
    /// Parses `pool=P,image=I[,conf=PATH][,id=USER]`.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let (mut pool, mut image, mut conf, mut id) = (None, None, None, None);
        for pair in spec.split(',') {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("{pair:?} is not key=value"))?;
            if value.is_empty() {
                return Err(format!("{key}= is empty"));
            }
            let slot = match key {
                "pool" => &mut pool,
                "image" => &mut image,
                "conf" => &mut conf,
                "id" => &mut id,
                _ => return Err(format!("unknown key {key:?} (pool, image, conf, id)")),
            };
            *slot = Some(value.to_string());
        }
        Ok(Self {
            pool: pool.ok_or("pool= is required")?,
            image: image.ok_or("image= is required")?,
            conf: conf.or_else(|| std::env::var("CEPH_CONF").ok()),
            id,
        })
    }
}

/// `--target`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TargetKind {
    /// The project's daemon, with a null (or RAM, for verify) LUN or disk.
    Sqcqd,
    /// rust-vmm's vhost-device-scsi on a sparse image file (SCSI).
    VhostDeviceScsi,
    /// QEMU's qemu-storage-daemon exporting a vhost-user-blk disk: a
    /// null-co node, or a sparse image file for verify (blk).
    QemuStorageDaemon,
}

impl TargetKind {
    /// The executable's name.
    pub fn binary(self) -> &'static str {
        match self {
            Self::Sqcqd => "sqcqd",
            Self::VhostDeviceScsi => "vhost-device-scsi",
            Self::QemuStorageDaemon => "qemu-storage-daemon",
        }
    }

    /// Whether it serves `device`.
    pub fn serves(self, device: DeviceType) -> bool {
        match self {
            Self::Sqcqd => true,
            Self::VhostDeviceScsi => device == DeviceType::Scsi,
            Self::QemuStorageDaemon => device == DeviceType::Blk,
        }
    }

    /// The public peer serving `device`, what a missing sqcqd falls back
    /// to.
    pub fn peer(device: DeviceType) -> Self {
        match device {
            DeviceType::Scsi => Self::VhostDeviceScsi,
            DeviceType::Blk => Self::QemuStorageDaemon,
        }
    }
}

/// `--cdb`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CdbChoice {
    /// 10 bytes when the LBA and length fit, 16 otherwise.
    Auto,
    /// READ/WRITE 10.
    #[value(name = "10")]
    Ten,
    /// READ/WRITE 16.
    #[value(name = "16")]
    Sixteen,
}

impl From<CdbChoice> for CdbSize {
    fn from(c: CdbChoice) -> Self {
        match c {
            CdbChoice::Auto => Self::Auto,
            CdbChoice::Ten => Self::Ten,
            CdbChoice::Sixteen => Self::Sixteen,
        }
    }
}

/// `--output-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// fio's human-readable summary.
    Normal,
    /// fio-like JSON.
    Json,
}

/// `--eta`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Eta {
    /// When stderr is a terminal.
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

fn parse_mode(s: &str) -> Result<NotifyMode, String> {
    s.parse()
}

/// fio sizes: a number with an optional k/m/g/t suffix (powers of 1024,
/// an optional trailing `b`/`ib`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let lower = s.trim().to_ascii_lowercase();
    let trimmed = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (digits, shift) = match trimmed.chars().last() {
        Some('k') => (&trimmed[..trimmed.len() - 1], 10),
        Some('m') => (&trimmed[..trimmed.len() - 1], 20),
        Some('g') => (&trimmed[..trimmed.len() - 1], 30),
        Some('t') => (&trimmed[..trimmed.len() - 1], 40),
        _ => (trimmed, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 4k, 1m, 2g)"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// fio times: seconds, or a number with us/ms/s/m/h.
pub fn parse_time(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a time (e.g. 10, 500ms, 1m)"))?;
    Ok(match unit {
        "" | "s" => Duration::from_secs(n),
        "us" => Duration::from_micros(n),
        "ms" => Duration::from_millis(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => return Err(format!("{s:?}: unknown time unit {unit:?}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_times_read_like_fio() {
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("512"), Ok(512));
        assert!(parse_size("x").is_err());
        assert!(parse_size("99999999999t").is_err());
        assert_eq!(parse_time("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_time("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_time("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_time("3 days").is_err());
    }

    #[test]
    fn the_command_line_parses() {
        let a = Args::try_parse_from([
            "sqcq-bench",
            "--rw",
            "randrw",
            "--rwmixread",
            "70",
            "--bs",
            "8k",
            "--mode",
            "poll-queue",
            "--ramp_time",
            "1",
            "--cdb",
            "16",
        ])
        .unwrap();
        assert_eq!(a.rw, Rw::Randrw);
        assert_eq!(a.rw.read_percent(a.rwmixread), 70);
        assert_eq!(a.bs, 8192);
        assert_eq!(a.mode, NotifyMode::PollQueue);
        assert_eq!(a.cdb, CdbChoice::Sixteen);
        for mode in ["notify", "poll-queue", "ring-poll", "sqcq", "sqcq-inline"] {
            let a = Args::try_parse_from(["sqcq-bench", "--mode", mode]).unwrap();
            assert_eq!(a.mode.name(), mode);
        }
        assert!(Args::try_parse_from(["sqcq-bench", "--mode", "sqcq-poll"]).is_err());
        let a = Args::try_parse_from([
            "sqcq-bench",
            "--device-type",
            "blk",
            "--target",
            "qemu-storage-daemon",
        ])
        .unwrap();
        assert_eq!(DeviceType::from(a.device_type), DeviceType::Blk);
        assert!(a.target.serves(DeviceType::Blk) && !a.target.serves(DeviceType::Scsi));
        assert_eq!(
            TargetKind::peer(DeviceType::Scsi),
            TargetKind::VhostDeviceScsi
        );
        let a = Args::try_parse_from(["sqcq-bench"]).unwrap();
        assert_eq!(DeviceType::from(a.device_type), DeviceType::Scsi);
        let a = Args::try_parse_from(["sqcq-bench", "--poll-threads", "per-queue"]).unwrap();
        assert_eq!(PollThreads::from(a.poll_threads), PollThreads::PerQueue);
        let a = Args::try_parse_from(["sqcq-bench", "--socket", "/a", "--socket", "/b"]).unwrap();
        assert_eq!(a.socket, [PathBuf::from("/a"), PathBuf::from("/b")]);
        assert_eq!(a.devices, 1);
        let a = Args::try_parse_from(["sqcq-bench", "--devices", "3"]).unwrap();
        assert_eq!((a.devices, a.socket.len()), (3, 0));
        assert!(Args::try_parse_from(["sqcq-bench", "--devices", "0"]).is_err());
    }

    #[test]
    fn target_poll_rate_and_extra_arguments_parse() {
        let a = Args::try_parse_from([
            "sqcq-bench",
            "--target-poll",
            "auto",
            "--rate_iops",
            "5000",
            "--target-arg=--spin-us",
            "--target-arg",
            "1,50",
        ])
        .unwrap();
        assert_eq!(a.target_poll.map(TargetPoll::name), Some("auto"));
        assert_eq!(a.rate_iops, 5000);
        assert_eq!(a.target_arg, ["--spin-us", "1,50"]);
        let a = Args::try_parse_from(["sqcq-bench", "--rate-iops", "7"]).unwrap();
        assert_eq!((a.rate_iops, a.target_poll), (7, None));
        assert!(Args::try_parse_from(["sqcq-bench", "--target-poll", "spin"]).is_err());
    }

    #[test]
    fn rbd_images_are_parsed() {
        let a = Args::try_parse_from([
            "sqcq-bench",
            "--target-rbd",
            "pool=p,image=i,conf=/c,id=u",
            "--target-cpus",
            "0",
        ])
        .unwrap();
        let rbd = a.target_rbd.unwrap();
        assert_eq!((rbd.pool.as_str(), rbd.image.as_str()), ("p", "i"));
        assert_eq!(
            (rbd.conf.as_deref(), rbd.id.as_deref()),
            (Some("/c"), Some("u"))
        );
        assert_eq!(a.target_cpus.as_deref(), Some("0"));
        for bad in [
            "pool=p",
            "image=i",
            "pool=p,image=i,size=1",
            "pool=,image=i",
            "pool",
        ] {
            assert!(RbdImage::parse(bad).is_err(), "{bad}");
        }
    }
}

/// `--throttle`: whether jobs honour the device's THROTTLE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ThrottleArg {
    /// Hold new I/Os back while THROTTLE is set and some are in flight.
    Honour,
    /// Publish regardless.
    Ignore,
}

/// `--ring`: the virtqueue layout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum RingLayout {
    /// Split rings (virtio 1.2, 2.7).
    #[default]
    Split,
    /// Packed rings (virtio 1.2, 2.8).
    Packed,
}
