//! How much CPU `sqcqd` uses once the load stops, in poll mode (the
//! goal: under 1% of a CPU over 10 s of idle).
//!
//! Starts the release `sqcqd` next to this example with a null LUN and two
//! request queues on two workers, negotiates VIRTIO_F_SQCQ_POLL, runs a
//! few seconds of QD1 reads on both queues through `sq.idx`, then reads
//! the daemon's utime + stime from `/proc/PID/stat` before and after an
//! idle period. Extra arguments go to `sqcqd` (e.g. `--poll-cpus 0,1`,
//! `--no-sqcq`, `--poll ring`).
//!
//! ```text
//! cargo build --release -p sqcq-target --bin sqcqd --example idle_cpu
//! target/release/examples/idle_cpu [IDLE_SECS] [-- SQCQD ARGS...]
//! ```

// A measuring program: lengths and indices are small constants.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss
)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::raw_ring::*;
use common::*;
use sqcq_protocol::NEED_WAKEUP;

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    // The command name (field 2) is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat(5) are the 12th and 13th after the name.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn ticks_per_sec() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(t).unwrap_or(100)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let idle: u64 = args
        .next()
        .filter(|a| a != "--")
        .map_or(10, |a| a.parse().expect("IDLE_SECS"));
    let extra: Vec<String> = args.filter(|a| a != "--").collect();
    let exe = std::env::current_exe().unwrap();
    let sqcqd = exe.parent().unwrap().parent().unwrap().join("sqcqd");
    let dir = TempDir::new("idle-cpu");
    let socket = dir.path("sqcqd.sock");
    let mut child = Command::new(&sqcqd)
        .arg("--socket-path")
        .arg(&socket)
        .args(["--lun", "kind=null,size=1G", "--num-queues", "2"])
        .args(["--workers", "2", "--queue-size", "64"])
        .args(&extra)
        // Its log (stdout) goes to our stderr, apart from the figures.
        .stdout(Stdio::from(std::io::stderr()))
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", sqcqd.display()));
    let pid = child.id();

    let mut g = Guest::new();
    let mut qs = vqs();
    let sqcq = !extra.iter().any(|a| a == "--no-sqcq");
    let fe = connect_with(&socket, &g, &mut qs, true, if sqcq { SQCQ } else { 0 });
    for i in [2, 3] {
        clear_unit_attention(&mut qs[i], &mut g, 0);
    }

    let load = Duration::from_secs(3);
    let (t0, c0) = (Instant::now(), cpu_ticks(pid));
    let mut ios = 0u64;
    while t0.elapsed() < load {
        for i in [2, 3] {
            let q = &mut qs[i];
            let p = submit(q, &mut g, lun_field(0, 0), &read10(0, 1), &[], 512);
            if sqcq {
                q.publish_sq(&g);
            } else {
                q.kick(&g);
            }
            // Spin for the completion, as a polling driver would.
            let deadline = Instant::now() + WAIT;
            while q.used_idx(&g) == q.last_used && Instant::now() < deadline {
                std::thread::yield_now();
            }
            assert_eq!(q.wait_used(&g).0, p.head);
            ios += 1;
        }
    }
    let load_secs = t0.elapsed().as_secs_f64();
    let load_cpu = (cpu_ticks(pid) - c0) as f64 / ticks_per_sec() as f64;

    // Idle: give the pollers a moment to reach their sleep, then measure.
    std::thread::sleep(Duration::from_millis(100));
    let asleep = qs[2..].iter().all(|q| q.sq_flags(&g) & NEED_WAKEUP != 0);
    let (t1, c1) = (Instant::now(), cpu_ticks(pid));
    std::thread::sleep(Duration::from_secs(idle));
    let idle_ticks = cpu_ticks(pid) - c1;
    let idle_secs = t1.elapsed().as_secs_f64();
    let idle_cpu = idle_ticks as f64 / ticks_per_sec() as f64;

    println!(
        "sqcqd {} (VIRTIO_F_SQCQ_POLL negotiated: {sqcq}), 2 queues on 2 workers, null LUN",
        extra.join(" ")
    );
    println!(
        "load: {ios} QD1 reads in {load_secs:.1} s, daemon CPU {:.1}% of one CPU",
        100.0 * load_cpu / load_secs
    );
    println!(
        "idle: {idle_ticks} ticks of {} Hz in {idle_secs:.1} s = {:.2}% of one CPU; every SQ doorbell has NEED_WAKEUP: {asleep}",
        ticks_per_sec(),
        100.0 * idle_cpu / idle_secs
    );
    drop(fe);
    // SAFETY: kill() with a valid pid and signal number.
    unsafe { libc::kill(pid.cast_signed(), libc::SIGTERM) };
    let _ = child.wait();
}
