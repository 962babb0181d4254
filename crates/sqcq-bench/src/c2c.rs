//! `sqcq-c2c`: how long a cache line takes to go from one CPU to another
//! and back, measured now.
//!
//! Every I/O of a polled virtqueue moves cache lines between the driver's
//! CPU and the device's (the avail index, the descriptors, the header,
//! the response, the used ring), so that round trip bounds what any
//! polling pair of programs can do. On the project's 2-vCPU VMs it is
//! not a constant: the host places the two vCPUs on cores that share a
//! cache or not, and moves them every few seconds, and the IOPS of SPDK's
//! own target against its own initiator follow it (docs/benchmarks.md,
//! "Cache-line round trip between the two vCPUs"). A comparison of two
//! programs is only fair
//! between runs that saw the same round trip; `scripts/vs-spdk.sh` runs
//! this before and after each run and compares runs of the same placement
//! only.
//!
//! The measurement: a thread on each CPU, two cache lines (one written by
//! each side); the first writes a sequence number to its line and waits
//! for the second to echo it on the other line, `--round-trips` times.
//! The figure is the median over `--samples` such batches, so that one
//! preemption does not decide it. Run it while nothing else busy-polls
//! those CPUs (a reactor that never yields would make it measure the
//! scheduler instead).

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    name = "sqcq-c2c",
    version,
    about = "Round trip of a cache line between two CPUs (ns), now"
)]
struct Args {
    /// The two CPUs, as "A,B".
    #[arg(long, default_value = "0,1", value_parser = parse_cpus)]
    cpus: (usize, usize),
    /// Round trips per sample.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
    round_trips: u64,
    /// Samples; the median is reported.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    samples: u32,
    /// Print only the median in whole nanoseconds (for scripts).
    #[arg(long)]
    terse: bool,
}

fn parse_cpus(s: &str) -> Result<(usize, usize), String> {
    let (a, b) = s
        .split_once(',')
        .ok_or_else(|| format!("{s:?}: expected two CPUs as A,B"))?;
    let cpu = |t: &str| {
        t.trim()
            .parse::<usize>()
            .map_err(|e| format!("{t:?}: not a CPU number: {e}"))
    };
    let (a, b) = (cpu(a)?, cpu(b)?);
    if a == b {
        return Err(format!("{s:?}: two different CPUs are needed"));
    }
    Ok((a, b))
}

/// A line written by one side only.
#[repr(align(128))]
#[derive(Debug, Default)]
struct Line(AtomicU64);

#[derive(Debug, Default)]
struct Lines {
    ping: Line,
    pong: Line,
}

fn bind(cpu: usize) -> std::io::Result<()> {
    if cpu >= usize::try_from(libc::CPU_SETSIZE).unwrap_or(0) {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: an all-zero cpu_set_t is the empty set; it is plain data.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes inside `set` for a CPU below CPU_SETSIZE
    // (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 is the calling thread; `set` is a valid cpu_set_t of
    // the size passed.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// What one sample found.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sample {
    /// Nanoseconds per round trip.
    ns: f64,
    /// Pings the echoing side saw.
    echoed: u64,
}

/// `round_trips` round trips of a line from the calling thread (on
/// `cpus.0`) to a thread on `cpus.1` and back.
fn sample(cpus: (usize, usize), round_trips: u64) -> std::io::Result<Sample> {
    bind(cpus.0)?;
    let lines = Lines::default();
    let (lines, n) = (&lines, round_trips);
    std::thread::scope(|s| {
        let (bound, on_cpu) = std::sync::mpsc::channel();
        let echo = s.spawn(move || -> u64 {
            let ok = bind(cpus.1);
            let failed = ok.is_err();
            let _ = bound.send(ok);
            if failed {
                return 0;
            }
            let mut seen = 0;
            while seen < n {
                // Acquire/Release only to keep the sides in step: the
                // figure is the line's travel, not any ordering.
                let v = lines.ping.0.load(Ordering::Acquire);
                if v != seen {
                    seen = v;
                    lines.pong.0.store(v, Ordering::Release);
                } else {
                    std::hint::spin_loop();
                }
            }
            seen
        });
        // The echo runs on its CPU, or the sample fails (and nothing
        // waits for an echo that will not come).
        on_cpu
            .recv()
            .map_err(|_| std::io::Error::other("echo thread gone"))??;
        let t0 = Instant::now();
        for i in 1..=n {
            lines.ping.0.store(i, Ordering::Release);
            while lines.pong.0.load(Ordering::Acquire) != i {
                std::hint::spin_loop();
            }
        }
        let ns = t0.elapsed().as_nanos() as f64 / n as f64;
        let echoed = echo
            .join()
            .map_err(|_| std::io::Error::other("echo thread panicked"))?;
        Ok(Sample { ns, echoed })
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut ns = Vec::new();
    for _ in 0..args.samples {
        match sample(args.cpus, args.round_trips) {
            Ok(s) => ns.push(s.ns),
            Err(e) => {
                eprintln!("sqcq-c2c: CPUs {} and {}: {e}", args.cpus.0, args.cpus.1);
                return ExitCode::FAILURE;
            }
        }
    }
    let m = median(ns.clone());
    if args.terse {
        println!("{m:.0}");
    } else {
        let all: Vec<String> = ns.iter().map(|x| format!("{x:.0}")).collect();
        println!(
            "cpu{} <-> cpu{}: {m:.0} ns per round trip (median of {} samples of {}: {})",
            args.cpus.0,
            args.cpus.1,
            args.samples,
            args.round_trips,
            all.join(" ")
        );
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpus_are_two_different_numbers() {
        assert_eq!(parse_cpus("0,1"), Ok((0, 1)));
        assert_eq!(parse_cpus(" 3, 2"), Ok((3, 2)));
        assert!(parse_cpus("1,1").is_err());
        assert!(parse_cpus("1").is_err());
        assert!(parse_cpus("a,1").is_err());
    }

    #[test]
    fn every_ping_is_echoed_once_in_order() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        if cpus < 2 {
            return;
        }
        let s = sample((0, 1), 1000).expect("two CPUs");
        assert_eq!(s.echoed, 1000);
        assert!(s.ns.is_finite() && s.ns > 0.0, "{s:?}");
    }

    #[test]
    fn a_cpu_that_does_not_exist_is_an_error() {
        let past = usize::try_from(libc::CPU_SETSIZE).unwrap();
        assert!(sample((0, past), 1).is_err(), "echo side");
        assert!(sample((past, 0), 1).is_err(), "measuring side");
    }

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
    }
}
