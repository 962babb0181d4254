//! CPU hotplug on the host (docs/target.md, "CPU placement"): a worker
//! bound with `--poll-cpus` whose CPU leaves the daemon's cpuset keeps
//! serving, is reported (`worker_list`'s `cpu_displaced`, the worker
//! figures), and returns to its CPU when the CPU comes back.
//!
//! The cpuset is a real cgroup of the v1 cpuset hierarchy holding only
//! the worker's thread, and shrinking it is what the kernel does to a
//! thread whose CPU goes offline: it moves the thread to the CPUs it may
//! still use. Taking a CPU really offline is `scripts/cpu-offline.sh`
//! (it needs a machine that lets it, and all of it for a while).

// Test code: lengths and indices are small constants of the test.
#![allow(clippy::cast_possible_truncation)]

mod common;

use std::path::{Path, PathBuf};

use common::driver::*;
use common::*;
use sqcq_driver::NotifyMode;
use sqcq_driver::scsi::{Cdb, Done};
use sqcq_target::Daemon;
use sqcq_target::config::PollOptions;
use sqcq_target::registry::WorkerStatus;

const CPUSET_ROOT: &str = "/sys/fs/cgroup/cpuset";

/// A child cpuset of the v1 hierarchy; its threads go back to the root
/// cpuset, and it is removed, when it is dropped.
struct Cpuset {
    dir: PathBuf,
}

impl Cpuset {
    fn create(name: &str, cpus: &str) -> Cpuset {
        let root = Path::new(CPUSET_ROOT);
        assert!(
            root.join("cpuset.cpus").exists(),
            "this test needs the cgroup v1 cpuset hierarchy at {CPUSET_ROOT}, and root"
        );
        let dir = root.join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let set = Cpuset { dir };
        let mems = std::fs::read_to_string(root.join("cpuset.mems")).unwrap();
        set.write("cpuset.mems", mems.trim());
        set.set_cpus(cpus);
        set
    }

    fn write(&self, file: &str, value: &str) {
        let path = self.dir.join(file);
        std::fs::write(&path, value)
            .unwrap_or_else(|e| panic!("writing {value:?} to {}: {e}", path.display()));
    }

    fn set_cpus(&self, cpus: &str) {
        self.write("cpuset.cpus", cpus);
    }

    /// Moves thread `tid` (only that thread) into the set.
    fn attach(&self, tid: u32) {
        self.write("tasks", &tid.to_string());
    }
}

impl Drop for Cpuset {
    fn drop(&mut self) {
        let tasks = std::fs::read_to_string(self.dir.join("tasks")).unwrap_or_default();
        for tid in tasks.lines() {
            let _ = std::fs::write(Path::new(CPUSET_ROOT).join("tasks"), tid);
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The thread id of this process's thread named `name`.
fn thread_named(name: &str) -> u32 {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .find(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
        .and_then(|t| t.file_name().to_str()?.parse().ok())
        .unwrap_or_else(|| panic!("no thread named {name}"))
}

/// The CPUs thread `tid` may run on.
fn allowed(tid: u32) -> Vec<usize> {
    allowed_in(&format!("/proc/self/task/{tid}/status"))
}

/// `Cpus_allowed_list` of a `/proc` status file.
fn allowed_in(status: &str) -> Vec<usize> {
    let status = std::fs::read_to_string(status).unwrap();
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim();
    list.split(',')
        .flat_map(|range| {
            let (a, b) = range.split_once('-').unwrap_or((range, range));
            a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap()
        })
        .collect()
}

/// Worker `w`'s `worker_list` entry.
fn worker(d: &Daemon, w: usize) -> WorkerStatus {
    d.registry()
        .workers()
        .into_iter()
        .find(|s| s.id == w)
        .unwrap()
}

/// Worker `w`'s bound CPU, and whether it runs off it.
fn worker_state(d: &Daemon, w: usize) -> (Option<usize>, bool) {
    let s = worker(d, w);
    (s.cpu, s.cpu_displaced)
}

/// Writes `round`'s pattern through request queue 1 (worker 1's) and
/// reads it back.
fn verified_io(rq: &mut Rq, round: u32) {
    for i in 0..4u32 {
        let lba = 8 * (round * 4 + i);
        let pattern: Vec<u8> = (0..4096u32).map(|b| (b ^ lba ^ round) as u8).collect();
        let r = rq.command(lun_at(0, 0), Cdb::write_10(lba, 8, false), &pattern, 0);
        assert!(r.good(), "WRITE at {lba}: {r:?}");
        let r = rq.command(lun_at(0, 0), Cdb::read_10(lba, 8, false), &[], 4096);
        assert_eq!(r.result, Ok(Done { resid: 0 }), "READ at {lba}");
        assert_eq!(
            r.data, pattern,
            "round {round}: data read back at {lba} differs"
        );
    }
}

fn displaced_and_back(mode: NotifyMode) {
    let me = allowed_in("/proc/thread-self/status");
    assert!(me.len() >= 2, "needs two CPUs, has {me:?}");
    let (a, b) = (me[0], me[1]);
    let dir = TempDir::new(&format!("cpu-hotplug-{mode:?}"));
    let poll = PollOptions {
        cpus: vec![a, b],
        ..PollOptions::default()
    };
    let (daemon, socket) = start_with(&dir, 2, poll);
    let mut d = Driver::connect_with(
        &socket,
        Options {
            mode,
            ..Options::default()
        },
    );
    let rq = &mut d.rqs[1];
    rq.clear_unit_attention(0);
    verified_io(rq, 0);

    let tid = thread_named("sqcq-worker1");
    assert_eq!(allowed(tid), [b], "worker 1 is bound to cpu{b}");
    assert_eq!(worker_state(&daemon, 1), (Some(b), false));

    // Worker 1's CPU leaves its cpuset: the kernel moves it to `a`.
    let set = Cpuset::create("sqcq-cpu-hotplug", &format!("{a},{b}"));
    set.attach(tid);
    set.set_cpus(&a.to_string());
    assert_eq!(allowed(tid), [a], "the kernel moved the worker");
    wait_until("worker 1 reported off its CPU", || {
        worker_state(&daemon, 1).1
    });
    assert_eq!(worker(&daemon, 1).cpu_displacements, 1);
    // It serves on where it was moved, and is not bound back while its
    // CPU is not there.
    verified_io(rq, 1);
    assert_eq!(worker_state(&daemon, 1), (Some(b), true));
    assert_eq!(allowed(tid), [a]);

    // The CPU is back: so is the worker, bound to it alone.
    set.set_cpus(&format!("{a},{b}"));
    wait_until("worker 1 back on its CPU", || !worker_state(&daemon, 1).1);
    assert_eq!(allowed(tid), [b], "worker 1 is bound to cpu{b} again");
    assert_eq!(
        worker(&daemon, 1).cpu_displacements,
        1,
        "one move, counted once"
    );
    assert_eq!(
        worker_state(&daemon, 0),
        (Some(a), false),
        "worker 0 untouched"
    );
    verified_io(rq, 2);
    drop(d);
    drop(set);
    daemon.shutdown();
}

/// One test for both modes: each daemon has a thread named
/// `sqcq-worker1`, and the cpuset is found by that name.
#[test]
fn a_worker_whose_cpu_leaves_its_cpuset_serves_on_and_comes_back() {
    for mode in [NotifyMode::Notify, NotifyMode::Sqcq] {
        displaced_and_back(mode);
    }
}
